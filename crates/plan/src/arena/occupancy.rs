//! Which bytes are taken, over which steps: answers "what memory is used by placed buffers live
//! at some step of this lifetime?" without visiting those buffers one by one.
//!
//! Steps are renumbered to the distinct start steps (a buffer's last step becomes the last start
//! step not after it), which keeps every overlap. A placed buffer `j` overlaps a lifetime
//! `[lo, hi]` exactly when it is live at `lo` or starts in `(lo, hi]`. Two segment trees over the
//! steps answer the two halves:
//! - `live`: each buffer's byte range is stored in the O(log steps) canonical nodes tiling its
//!   lifetime, so the nodes on the path from leaf `lo` to the root hold exactly the buffers live
//!   at `lo`;
//! - `born`: each buffer's byte range is stored in every node on the path from its start leaf to
//!   the root, so the canonical nodes tiling `(lo, hi]` hold exactly the buffers starting there.
//!
//! Each node keeps the union of its byte ranges as merged blocks; since a good plan packs buffers
//! side by side, a query reads a few blocks per node however many buffers are live.

use super::blocks::Blocks;
use super::place::Item;

/// The schedule's start steps renumbered to `0..count`, and every item's lifetime in that
/// numbering.
pub(super) struct Timeline {
    /// Leaves of the segment tree: a power of two, at least the number of distinct start
    /// steps.
    leaves: usize,
    /// `(first, last)` of every item, renumbered.
    spans: Vec<(usize, usize)>,
}

impl Timeline {
    /// Renumbers the steps of `items`.
    pub(super) fn new(items: &[Item]) -> Self {
        let mut starts: Vec<usize> = items.iter().map(|i| i.first).collect();
        starts.sort_unstable();
        starts.dedup();
        // Number of start steps at or before `step`; at least 1 for any step of a lifetime.
        let upto = |step: usize| starts.partition_point(|&s| s <= step);
        let spans = items
            .iter()
            .map(|i| (upto(i.first) - 1, upto(i.last) - 1))
            .collect();
        Timeline {
            leaves: starts.len().max(1).next_power_of_two(),
            spans,
        }
    }

    /// For every item, the live bytes at the busiest step of its lifetime and that step (the
    /// earliest on a tie, renumbered). Live bytes only grow at start steps, so the busiest step of
    /// any lifetime is a start step and the renumbering loses nothing.
    pub(super) fn busiest_steps(&self, items: &[Item]) -> Vec<(u64, usize)> {
        // Differences then running sums; entries may wrap, the sums (at most the total of all
        // sizes, which fits) come out exact.
        let mut live = vec![0u64; self.leaves + 1];
        for (item, &(lo, hi)) in items.iter().zip(&self.spans) {
            live[lo] = live[lo].wrapping_add(item.size);
            live[hi + 1] = live[hi + 1].wrapping_sub(item.size);
        }
        let mut running = 0u64;
        for bytes in live.iter_mut() {
            running = running.wrapping_add(*bytes);
            *bytes = running;
        }
        // Sparse table: best[k][t] is the busiest step in `t..t + 2^k`.
        let better = |a: usize, b: usize| if live[b] > live[a] { b } else { a };
        let mut best: Vec<Vec<usize>> = vec![(0..self.leaves).collect()];
        let mut width = 1;
        while 2 * width <= self.leaves {
            let prev = &best[best.len() - 1];
            let next = (0..=self.leaves - 2 * width)
                .map(|t| better(prev[t], prev[t + width]))
                .collect();
            best.push(next);
            width *= 2;
        }
        self.spans
            .iter()
            .map(|&(lo, hi)| {
                let k = (hi - lo + 1).ilog2() as usize;
                let step = better(best[k][lo], best[k][hi + 1 - (1 << k)]);
                (live[step], step)
            })
            .collect()
    }
}

/// Calls `visit` with the tree nodes whose leaf ranges exactly tile `lo..=hi` (at most two per
/// level).
fn for_each_canonical_node(leaves: usize, lo: usize, hi: usize, mut visit: impl FnMut(usize)) {
    let (mut l, mut r) = (lo + leaves, hi + leaves + 1);
    while l < r {
        if l & 1 == 1 {
            visit(l);
            l += 1;
        }
        if r & 1 == 1 {
            r -= 1;
            visit(r);
        }
        l >>= 1;
        r >>= 1;
    }
}

/// Calls `visit` with every node on the path from leaf `step` to the root.
fn for_each_path_node(leaves: usize, step: usize, mut visit: impl FnMut(usize)) {
    let mut node = step + leaves;
    while node >= 1 {
        visit(node);
        node >>= 1;
    }
}

/// The memory taken by the buffers placed so far, by step.
pub(super) struct Occupancy<'t> {
    timeline: &'t Timeline,
    /// Per node: byte ranges of buffers having this node among the canonical nodes of their
    /// lifetime.
    live: Vec<Blocks>,
    /// Per node: byte ranges of buffers whose start step lies in the node's range.
    born: Vec<Blocks>,
}

impl<'t> Occupancy<'t> {
    /// Empty memory over `timeline`.
    pub(super) fn new(timeline: &'t Timeline) -> Self {
        let nodes = 2 * timeline.leaves;
        Occupancy {
            timeline,
            live: vec![Blocks::default(); nodes],
            born: vec![Blocks::default(); nodes],
        }
    }

    /// Appends to `out` byte ranges whose union is the memory of every placed buffer live at some
    /// step of item `item`'s lifetime (ranges may overlap; none is empty).
    pub(super) fn taken_during(&self, item: usize, out: &mut Vec<(u64, u64)>) {
        let (lo, hi) = self.timeline.spans[item];
        let leaves = self.timeline.leaves;
        for_each_path_node(leaves, lo, |node| {
            out.extend_from_slice(self.live[node].as_slice());
        });
        if lo < hi {
            for_each_canonical_node(leaves, lo + 1, hi, |node| {
                out.extend_from_slice(self.born[node].as_slice());
            });
        }
    }

    /// Records item `item` as occupying `[start, end)` during its lifetime.
    pub(super) fn insert(&mut self, item: usize, start: u64, end: u64) {
        let (lo, hi) = self.timeline.spans[item];
        let leaves = self.timeline.leaves;
        for_each_canonical_node(leaves, lo, hi, |node| self.live[node].insert(start, end));
        for_each_path_node(leaves, lo, |node| self.born[node].insert(start, end));
    }
}
