//! Static memory planning: every intermediate tensor of a scheduled graph gets a fixed offset in
//! one arena.
//!
//! A request says how many bytes a buffer needs and during which schedule steps
//! (`first..=last`) it must hold its value. The planner places every buffer at a 64-byte-aligned
//! offset such that two buffers live at a common step never share a byte. It tries several
//! placement strategies (orderings after MindSpore SOMAS, XLA's heap simulator and TFLite's
//! greedy-by-size and greedy-by-breadth, each with a best-fit or first-fit rule), keeps the
//! smallest arena, and reports it against the lower bound no plan for this schedule can beat: the
//! largest total of aligned bytes live at one step. Ties go to the strategy listed first in
//! [`Strategy::ALL`], and trials stop at a plan that meets the bound, so the same requests always
//! give the same plan, whatever the thread count.

mod blocks;
mod occupancy;
mod place;
mod verify;

#[cfg(test)]
mod tests;

use rayon::prelude::*;
use serde::Serialize;
use std::fmt;

pub use place::{Fit, Order, Strategy};

/// Every offset in a plan is a multiple of this many bytes, and every size is rounded up to it for
/// placement, so any tensor's data starts on a cache line and a SIMD-friendly boundary.
pub const ALIGNMENT: u64 = 64;

/// One buffer the arena must hold: `bytes` of storage, live during schedule steps
/// `first..=last` (a buffer alive for the whole step range is "lifelong").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct BufferReq {
    /// Size in bytes; zero is allowed and such a buffer occupies nothing.
    pub bytes: u64,
    /// First schedule step at which the buffer holds its value.
    pub first: usize,
    /// Last schedule step at which the buffer holds its value (inclusive).
    pub last: usize,
}

/// The outcome of planning: where each buffer lives, how big the arena is and how that compares
/// with the best any plan could do for this schedule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ArenaPlan {
    /// Offset of buffer `i` (same order as the requests); 0 for zero-size buffers.
    pub offsets: Vec<u64>,
    /// Bytes the arena needs: the highest aligned end of any buffer.
    pub arena_bytes: u64,
    /// Largest total of aligned bytes live at one step; no plan can use less.
    pub lower_bound_bytes: u64,
    /// Name of the strategy whose placement this is.
    pub strategy: &'static str,
    /// Every strategy tried, in the fixed trial order, with the arena size it reached. Trials stop
    /// at the first strategy that reaches the lower bound.
    pub strategies_tried: Vec<(&'static str, u64)>,
}

impl ArenaPlan {
    /// Arena size over the lower bound (1.0 is optimal); 1.0 when nothing needs memory.
    pub fn ratio(&self) -> f64 {
        if self.lower_bound_bytes == 0 {
            1.0
        } else {
            self.arena_bytes as f64 / self.lower_bound_bytes as f64
        }
    }

    /// Checks this plan against the requests it was made for: one offset per buffer, every
    /// offset aligned, every buffer inside the arena, and no two buffers live at a common step
    /// overlapping in memory. Lets an executor refuse a plan that does not fit its graph.
    pub fn verify(&self, reqs: &[BufferReq]) -> Result<(), ArenaError> {
        verify::verify(reqs, &self.offsets, self.arena_bytes)
    }
}

/// Why a set of requests cannot be planned, or why a plan does not fit its requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArenaError {
    /// A request ends before it starts.
    InvertedLifetime {
        /// Index of the request.
        index: usize,
        /// Its `first` step.
        first: usize,
        /// Its `last` step.
        last: usize,
    },
    /// The aligned sizes of all requests together do not fit in 64 bits.
    TooLarge,
    /// [`plan_arena_with`] was given no strategy to try.
    NoStrategy,
    /// A plan has a different number of offsets than there are requests.
    LengthMismatch {
        /// Number of offsets in the plan.
        offsets: usize,
        /// Number of requests.
        requests: usize,
    },
    /// A buffer's offset is not a multiple of [`ALIGNMENT`].
    Misaligned {
        /// Index of the buffer.
        index: usize,
        /// Its offset.
        offset: u64,
    },
    /// A buffer ends past the arena.
    OutsideArena {
        /// Index of the buffer.
        index: usize,
        /// Where its aligned storage ends.
        end: u64,
        /// The arena size.
        arena_bytes: u64,
    },
    /// Two buffers live at a common step share memory.
    Overlap {
        /// Index of one buffer.
        a: usize,
        /// Index of the other.
        b: usize,
    },
}

impl fmt::Display for ArenaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArenaError::InvertedLifetime { index, first, last } => write!(
                f,
                "buffer {index} has lifetime {first}..={last}, which ends before it starts"
            ),
            ArenaError::TooLarge => {
                write!(f, "the buffers together need more than 2^64 bytes")
            }
            ArenaError::NoStrategy => write!(f, "no placement strategy was given"),
            ArenaError::LengthMismatch { offsets, requests } => write!(
                f,
                "the plan has {offsets} offsets but there are {requests} buffers"
            ),
            ArenaError::Misaligned { index, offset } => write!(
                f,
                "buffer {index} is at offset {offset}, not a multiple of {ALIGNMENT}"
            ),
            ArenaError::OutsideArena {
                index,
                end,
                arena_bytes,
            } => write!(
                f,
                "buffer {index} ends at byte {end}, past the {arena_bytes}-byte arena"
            ),
            ArenaError::Overlap { a, b } => write!(
                f,
                "buffers {a} and {b} are live at the same step and overlap in memory"
            ),
        }
    }
}

impl std::error::Error for ArenaError {}

/// `bytes` rounded up to [`ALIGNMENT`], or `None` if that overflows.
pub fn aligned_size(bytes: u64) -> Option<u64> {
    bytes
        .checked_add(ALIGNMENT - 1)
        .map(|b| b & !(ALIGNMENT - 1))
}

/// Plans with every strategy in [`Strategy::ALL`] and keeps the smallest arena.
pub fn plan_arena(reqs: &[BufferReq]) -> Result<ArenaPlan, ArenaError> {
    plan_arena_with(reqs, &Strategy::ALL)
}

/// Plans with the given strategies, in order, and keeps the smallest arena (the earliest
/// strategy on a tie), stopping early at a plan as small as the lower bound.
pub fn plan_arena_with(
    reqs: &[BufferReq],
    strategies: &[Strategy],
) -> Result<ArenaPlan, ArenaError> {
    if strategies.is_empty() {
        return Err(ArenaError::NoStrategy);
    }
    let items = place::items(reqs)?;
    let lower_bound_bytes = lower_bound_of(&items);
    let timeline = occupancy::Timeline::new(&items);
    // The distinct placements to make: a strategy whose fit and order coincide with an earlier
    // one's (lifelong-first without lifelong buffers is size-desc) shares its placement.
    let by_size = place::size_order(&items);
    let mut runs: Vec<(Fit, Vec<usize>)> = Vec::new();
    let run_of: Vec<usize> = strategies
        .iter()
        .map(|s| {
            let order = place::placement_order(&items, &by_size, &timeline, s.order);
            match runs
                .iter()
                .position(|(fit, o)| *fit == s.fit && *o == order)
            {
                Some(run) => run,
                None => {
                    runs.push((s.fit, order));
                    runs.len() - 1
                }
            }
        })
        .collect();
    let place_run = |(fit, order): &(Fit, Vec<usize>)| place::place(&items, &timeline, order, *fit);
    // The first placement often reaches the lower bound, and then nothing can beat it; otherwise
    // the others run in parallel.
    let mut placed = vec![place_run(&runs[0])];
    if placed[0].1 > lower_bound_bytes {
        placed.par_extend(runs[1..].par_iter().map(place_run));
    }
    // Report as if the strategies ran one by one, stopping at one that reaches the lower bound.
    let mut best: Option<(Strategy, usize)> = None;
    let mut strategies_tried = Vec::with_capacity(strategies.len());
    for (&strategy, &run) in strategies.iter().zip(&run_of) {
        let arena = placed[run].1;
        strategies_tried.push((strategy.name(), arena));
        if best.is_none_or(|(_, b)| arena < placed[b].1) {
            best = Some((strategy, run));
        }
        if arena == lower_bound_bytes {
            break;
        }
    }
    let (strategy, run) = best.ok_or(ArenaError::NoStrategy)?;
    let (placed, arena_bytes) = placed.swap_remove(run);
    let mut offsets = vec![0; reqs.len()];
    for (item, offset) in items.iter().zip(placed) {
        offsets[item.index] = offset;
    }
    Ok(ArenaPlan {
        offsets,
        arena_bytes,
        lower_bound_bytes,
        strategy: strategy.name(),
        strategies_tried,
    })
}

/// The largest total of aligned bytes live at one step: no placement can use a smaller arena.
pub fn lower_bound(reqs: &[BufferReq]) -> Result<u64, ArenaError> {
    Ok(lower_bound_of(&place::items(reqs)?))
}

/// Sweeps the steps in order, adding a buffer where it starts and removing it after its last
/// step; at a step where some buffers start and others end, all of them are live together.
fn lower_bound_of(items: &[place::Item]) -> u64 {
    let mut events: Vec<(usize, bool, u64)> = Vec::with_capacity(items.len() * 2);
    for item in items {
        events.push((item.first, false, item.size));
        events.push((item.last, true, item.size));
    }
    // `false` (a start) sorts before `true` (an end) at the same step.
    events.sort_unstable();
    let (mut live, mut peak) = (0u64, 0u64);
    for (_, is_end, size) in events {
        if is_end {
            live -= size;
        } else {
            // Cannot overflow: `place::items` checked that all sizes together fit in a u64.
            live += size;
            peak = peak.max(live);
        }
    }
    peak
}
