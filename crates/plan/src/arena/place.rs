//! Placement strategies: an order in which to place buffers and a rule choosing, for each, a gap
//! between the already-placed buffers that are live at the same time.

use super::occupancy::{Occupancy, Timeline};
use super::{aligned_size, ArenaError, BufferReq};
use std::cmp::Reverse;

/// A buffer that needs memory, as the placement strategies see it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Item {
    /// Index of the request this item stands for.
    pub(super) index: usize,
    /// Aligned size in bytes, never zero.
    pub(super) size: u64,
    /// First live step.
    pub(super) first: usize,
    /// Last live step (inclusive).
    pub(super) last: usize,
}

impl Item {
    /// Length of the lifetime (steps live minus one).
    fn lifetime(&self) -> usize {
        self.last - self.first
    }
}

/// Validates the requests and turns every nonzero one into an [`Item`]. Also guarantees that the
/// aligned sizes add up to at most `u64::MAX`; since a greedy placement never puts a buffer's end
/// above the total of the sizes placed so far, no offset arithmetic can overflow afterwards.
pub(super) fn items(reqs: &[BufferReq]) -> Result<Vec<Item>, ArenaError> {
    let mut total = 0u64;
    let mut items = Vec::with_capacity(reqs.len());
    for (index, req) in reqs.iter().enumerate() {
        if req.first > req.last {
            return Err(ArenaError::InvertedLifetime {
                index,
                first: req.first,
                last: req.last,
            });
        }
        let size = aligned_size(req.bytes).ok_or(ArenaError::TooLarge)?;
        total = total.checked_add(size).ok_or(ArenaError::TooLarge)?;
        if size > 0 {
            items.push(Item {
                index,
                size,
                first: req.first,
                last: req.last,
            });
        }
    }
    Ok(items)
}

/// The order in which a strategy places buffers. Every order breaks its ties by the size-descending
/// order and then by request index, so placements are deterministic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Order {
    /// Largest first, longer-lived first among equals (XLA, TFLite, SOMAS).
    SizeDesc,
    /// Longest-lived first, larger first among equals (XLA).
    LifetimeDesc,
    /// Buffers live over the whole schedule first, then largest first (TFLite greedy-by-size).
    LifelongFirst,
    /// Steps by live bytes, busiest first; at each, the buffers live there not yet placed,
    /// largest first (TFLite greedy-by-breadth, with a step's live bytes as its breadth).
    BusiestStepFirst,
}

/// How a strategy chooses among the gaps that can hold a buffer; when none can, the buffer goes
/// on top of everything live at the same time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fit {
    /// The smallest gap that holds the buffer (the lowest such gap on a tie).
    Best,
    /// The lowest gap that holds the buffer.
    First,
}

/// One placement strategy: an order and a fit rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Strategy {
    /// The order in which buffers are placed.
    pub order: Order,
    /// How each buffer's gap is chosen.
    pub fit: Fit,
}

impl Strategy {
    /// The strategies [`super::plan_arena`] tries, in the fixed order that breaks ties. Busiest-step
    /// first with first fit is left out: on the test schedules it never beat the others.
    pub const ALL: [Strategy; 7] = [
        Strategy::new(Order::SizeDesc, Fit::Best),
        Strategy::new(Order::SizeDesc, Fit::First),
        Strategy::new(Order::LifelongFirst, Fit::Best),
        Strategy::new(Order::LifelongFirst, Fit::First),
        Strategy::new(Order::LifetimeDesc, Fit::Best),
        Strategy::new(Order::LifetimeDesc, Fit::First),
        Strategy::new(Order::BusiestStepFirst, Fit::Best),
    ];

    /// The strategy placing in `order` with `fit`.
    pub const fn new(order: Order, fit: Fit) -> Self {
        Strategy { order, fit }
    }

    /// A stable name for reports and plan files, e.g. `size-desc/best-fit`.
    pub fn name(self) -> &'static str {
        match (self.order, self.fit) {
            (Order::SizeDesc, Fit::Best) => "size-desc/best-fit",
            (Order::LifetimeDesc, Fit::Best) => "lifetime-desc/best-fit",
            (Order::LifelongFirst, Fit::Best) => "lifelong-first/best-fit",
            (Order::SizeDesc, Fit::First) => "size-desc/first-fit",
            (Order::LifetimeDesc, Fit::First) => "lifetime-desc/first-fit",
            (Order::LifelongFirst, Fit::First) => "lifelong-first/first-fit",
            (Order::BusiestStepFirst, Fit::Best) => "busiest-step-first/best-fit",
            (Order::BusiestStepFirst, Fit::First) => "busiest-step-first/first-fit",
        }
    }
}

/// Places `items` one by one in `order` (item indices) with `fit`; returns each item's offset
/// (same order as `items`) and the arena size.
pub(super) fn place(
    items: &[Item],
    timeline: &Timeline,
    order: &[usize],
    fit: Fit,
) -> (Vec<u64>, u64) {
    let mut occupancy = Occupancy::new(timeline);
    let mut offsets = vec![0u64; items.len()];
    let mut taken: Vec<(u64, u64)> = Vec::new();
    let mut arena = 0u64;
    for &i in order {
        taken.clear();
        occupancy.taken_during(i, &mut taken);
        let offset = choose_offset(&mut taken, items[i].size, fit);
        let end = offset + items[i].size;
        occupancy.insert(i, offset, end);
        offsets[i] = offset;
        arena = arena.max(end);
    }
    (offsets, arena)
}

/// Item indices largest first, longer-lived first among equals, then by request index: the
/// size-descending order, and the tie-break every other order ends with.
pub(super) fn size_order(items: &[Item]) -> Vec<usize> {
    let mut ids: Vec<usize> = (0..items.len()).collect();
    // A stable sort from request order: the request index breaks the remaining ties.
    ids.sort_by_key(|&i| (Reverse(items[i].size), Reverse(items[i].lifetime())));
    ids
}

/// Item indices in the order `order` places them, given the [`size_order`] of the items. Since
/// every order falls back on the size order, two orders that agree on their own criterion give
/// the same sequence, and a repeated placement can be recognised and skipped.
pub(super) fn placement_order(
    items: &[Item],
    by_size: &[usize],
    timeline: &Timeline,
    order: Order,
) -> Vec<usize> {
    let mut ids = by_size.to_vec();
    // Stable sorts: ties keep the size order.
    match order {
        Order::SizeDesc => {}
        Order::LifetimeDesc => ids.sort_by_key(|&i| Reverse(items[i].lifetime())),
        Order::LifelongFirst => {
            let start = items.iter().map(|i| i.first).min().unwrap_or(0);
            let end = items.iter().map(|i| i.last).max().unwrap_or(0);
            ids.sort_by_key(|&i| Reverse(items[i].first == start && items[i].last == end));
        }
        Order::BusiestStepFirst => {
            let busiest = timeline.busiest_steps(items);
            ids.sort_by_key(|&i| (Reverse(busiest[i].0), busiest[i].1));
        }
    }
    ids
}

/// Chooses where a buffer of `size` bytes goes, given byte ranges whose union is the memory of
/// the placed buffers live at the same time (in any order, possibly overlapping; sorted here).
/// Offsets stay aligned because every offset and size is a multiple of the alignment.
pub(super) fn choose_offset(occupied: &mut [(u64, u64)], size: u64, fit: Fit) -> u64 {
    occupied.sort_unstable_by_key(|&(start, _)| start);
    let mut top = 0u64;
    let mut best: Option<(u64, u64)> = None; // (gap, offset)
    for &(offset, end) in occupied.iter() {
        if offset > top {
            let gap = offset - top;
            if gap >= size {
                match fit {
                    Fit::First => return top,
                    Fit::Best if gap == size => return top,
                    Fit::Best => {
                        if best.is_none_or(|(g, _)| gap < g) {
                            best = Some((gap, top));
                        }
                    }
                }
            }
        }
        top = top.max(end);
    }
    best.map_or(top, |(_, offset)| offset)
}
