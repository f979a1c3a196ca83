//! Independent check of a plan: alignment, bounds and, with a sweep over the steps, that buffers
//! live at a common step never share memory.

use super::{aligned_size, ArenaError, BufferReq, ALIGNMENT};
use std::collections::BTreeMap;

/// Checks `offsets` (one per request) inside an arena of `arena_bytes`; see
/// [`super::ArenaPlan::verify`].
pub(super) fn verify(
    reqs: &[BufferReq],
    offsets: &[u64],
    arena_bytes: u64,
) -> Result<(), ArenaError> {
    if offsets.len() != reqs.len() {
        return Err(ArenaError::LengthMismatch {
            offsets: offsets.len(),
            requests: reqs.len(),
        });
    }
    // (step, is_end, index): starts sort before ends at the same step, so buffers ending and
    // starting at one step are checked against each other.
    let mut events: Vec<(usize, bool, usize)> = Vec::with_capacity(2 * reqs.len());
    let mut ends = vec![0u64; reqs.len()];
    for (index, (req, &offset)) in reqs.iter().zip(offsets).enumerate() {
        if req.first > req.last {
            return Err(ArenaError::InvertedLifetime {
                index,
                first: req.first,
                last: req.last,
            });
        }
        if offset % ALIGNMENT != 0 {
            return Err(ArenaError::Misaligned { index, offset });
        }
        let size = aligned_size(req.bytes).ok_or(ArenaError::TooLarge)?;
        if size == 0 {
            continue;
        }
        let end = offset.checked_add(size).ok_or(ArenaError::TooLarge)?;
        if end > arena_bytes {
            return Err(ArenaError::OutsideArena {
                index,
                end,
                arena_bytes,
            });
        }
        ends[index] = end;
        events.push((req.first, false, index));
        events.push((req.last, true, index));
    }
    events.sort_unstable();

    // Live buffers by offset; they never overlap each other, so a new buffer only needs checking
    // against its neighbours below and above.
    let mut live: BTreeMap<u64, (u64, usize)> = BTreeMap::new();
    for (_, is_end, index) in events {
        let offset = offsets[index];
        if is_end {
            live.remove(&offset);
            continue;
        }
        let end = ends[index];
        if let Some((_, &(below_end, below))) = live.range(..=offset).next_back() {
            if below_end > offset {
                return Err(ArenaError::Overlap { a: below, b: index });
            }
        }
        if let Some((&above_offset, &(_, above))) = live.range(offset..).next() {
            if above_offset < end {
                return Err(ArenaError::Overlap { a: above, b: index });
            }
        }
        live.insert(offset, (end, index));
    }
    Ok(())
}
