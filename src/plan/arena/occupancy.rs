//! Which bytes are taken, over which steps: answers "what memory is used by placed buffers live
//! at some step of this lifetime?" without visiting those buffers one by one.
//!
//! Steps are renumbered to the distinct `first`/`last` values (a monotone renumbering keeps every
//! overlap). A segment tree over the steps stores each placed buffer's byte range in the
//! O(log steps) canonical nodes tiling its lifetime (`cover`) and, merged into the union of
//! everything below, in every node whose subtree holds one of those (`within`). A buffer placed
//! earlier overlaps a lifetime exactly when one of its canonical nodes lies inside one of the
//! lifetime's canonical nodes (seen in that node's `within`) or is an ancestor of one (then it
//! covers a path node of the first or last step, seen in that node's `cover`). Because the
//! stored sets are unions of byte ranges, and a good plan packs buffers side by side, a query
//! reads a few blocks per node however many buffers are live.

use super::blocks::Blocks;
use super::place::Item;

/// The schedule's steps renumbered to `0..count`, and every item's lifetime in that numbering.
pub(super) struct Timeline {
    /// Leaves of the segment tree: a power of two, at least the number of distinct steps.
    leaves: usize,
    /// `(first, last)` of every item, renumbered.
    spans: Vec<(usize, usize)>,
}

impl Timeline {
    /// Renumbers the steps of `items`.
    pub(super) fn new(items: &[Item]) -> Self {
        let mut steps: Vec<usize> = items.iter().flat_map(|i| [i.first, i.last]).collect();
        steps.sort_unstable();
        steps.dedup();
        let rank = |step: usize| steps.partition_point(|&s| s < step);
        let spans = items
            .iter()
            .map(|i| (rank(i.first), rank(i.last)))
            .collect();
        Timeline {
            leaves: steps.len().max(1).next_power_of_two(),
            spans,
        }
    }

    /// For every item, the live bytes at the busiest step of its lifetime and that step (the
    /// earliest on a tie).
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

    /// Calls `visit` with the tree nodes that exactly tile item `item`'s lifetime (at most two
    /// per level), then returns the leaves of its first and last step.
    fn canonical_nodes(&self, item: usize, mut visit: impl FnMut(usize)) -> (usize, usize) {
        let (lo, hi) = self.spans[item];
        let (mut l, mut r) = (lo + self.leaves, hi + self.leaves + 1);
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
        (lo + self.leaves, hi + self.leaves)
    }
}

/// Calls `visit` once for every node on the paths from leaves `a` and `b` to the root.
fn for_each_path_node(mut a: usize, mut b: usize, mut visit: impl FnMut(usize)) {
    while a != b {
        visit(a);
        visit(b);
        a >>= 1;
        b >>= 1;
    }
    while a >= 1 {
        visit(a);
        a >>= 1;
    }
}

/// The memory taken by the buffers placed so far, by step.
pub(super) struct Occupancy<'t> {
    timeline: &'t Timeline,
    /// Per node: byte ranges of buffers that have this node among their canonical nodes.
    cover: Vec<Blocks>,
    /// Per node: byte ranges of buffers live at some step of the node's range, including at least
    /// every buffer with a canonical node in this node's subtree.
    within: Vec<Blocks>,
}

impl<'t> Occupancy<'t> {
    /// Empty memory over `timeline`.
    pub(super) fn new(timeline: &'t Timeline) -> Self {
        let nodes = 2 * timeline.leaves;
        Occupancy {
            timeline,
            cover: vec![Blocks::default(); nodes],
            within: vec![Blocks::default(); nodes],
        }
    }

    /// Appends to `out` byte ranges whose union is the memory of every placed buffer live at some
    /// step of item `item`'s lifetime (ranges may overlap; none is empty).
    pub(super) fn taken_during(&self, item: usize, out: &mut Vec<(u64, u64)>) {
        let (first, last) = self.timeline.canonical_nodes(item, |node| {
            out.extend_from_slice(self.within[node].as_slice());
        });
        for_each_path_node(first, last, |node| {
            out.extend_from_slice(self.cover[node].as_slice());
        });
    }

    /// Records item `item` as occupying `[start, end)` during its lifetime.
    pub(super) fn insert(&mut self, item: usize, start: u64, end: u64) {
        let (cover, within) = (&mut self.cover, &mut self.within);
        let (first, last) = self.timeline.canonical_nodes(item, |node| {
            cover[node].insert(start, end);
            within[node].insert(start, end);
        });
        // Every ancestor of a canonical node lies on one of these paths, and every path node
        // holds the first or the last step, so the buffer is live in its range.
        for_each_path_node(first, last, |node| within[node].insert(start, end));
    }
}
