//! Reusable, cache-line-aligned scratch buffers, so hot kernels do not allocate (and fault in
//! fresh pages) on every call.

use std::cell::RefCell;

/// 64 bytes: one cache line of f32.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; 16]);

/// Buffers larger than this many f32 are freed after use instead of kept.
pub const KEEP_LIMIT: usize = 8 << 20;
/// At most this many idle buffers are kept per thread.
const KEEP_COUNT: usize = 4;

thread_local! {
    static IDLE: RefCell<Vec<Vec<Line>>> = const { RefCell::new(Vec::new()) };
    static LARGEST: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The largest scratch (in f32) asked of this thread so far: what the reserve a module plans
/// per thread ([`crate::step::needs::scratch_floats`]) must cover, so no kernel allocates while
/// it runs (an executor reads it on each of its pool threads).
pub fn largest_request() -> usize {
    LARGEST.with(std::cell::Cell::get)
}

/// Runs `f` with an aligned scratch slice of exactly `len` f32 whose contents are unspecified
/// (the caller writes before reading). Re-entrant: nested calls get distinct buffers.
pub fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    LARGEST.with(|l| l.set(l.get().max(len)));
    let lines_needed = len.div_ceil(16);
    // A request larger than the pool keeps gets a buffer of its own, freed after it, and
    // leaves the kept buffers as they are (the memory plan counts it beside them).
    let mut lines = match lines_needed * 16 > KEEP_LIMIT {
        true => Vec::new(),
        false => IDLE
            .with(|idle| idle.borrow_mut().pop())
            .unwrap_or_default(),
    };
    if lines.len() < lines_needed {
        lines.resize(lines_needed, Line([0.0; 16]));
    }
    // SAFETY: `Line` is `repr(C)` over `[f32; 16]` with no padding, so `lines` is a valid,
    // initialised, exclusively borrowed run of `lines.len() * 16 >= len` f32 values.
    let slice = unsafe { std::slice::from_raw_parts_mut(lines.as_mut_ptr().cast::<f32>(), len) };
    let out = f(slice);
    if lines.len() * 16 <= KEEP_LIMIT {
        IDLE.with(|idle| {
            let mut idle = idle.borrow_mut();
            if idle.len() < KEEP_COUNT {
                idle.push(lines);
            }
        });
    }
    out
}

/// Makes sure this thread keeps `count` idle buffers of at least `len` f32 (at most
/// [`KEEP_LIMIT`] each, and at most the number of buffers a thread keeps), so later
/// [`with_scratch`] calls that fit do not allocate. Allocates fallibly: `false` when the
/// memory cannot be had, instead of aborting.
pub fn try_warm(len: usize, count: usize) -> bool {
    let lines_needed = len.min(KEEP_LIMIT).div_ceil(16);
    IDLE.with(|idle| {
        let mut idle = idle.borrow_mut();
        while idle.len() < count.min(KEEP_COUNT) {
            idle.push(Vec::new());
        }
        for lines in idle.iter_mut().take(count) {
            let more = lines_needed.saturating_sub(lines.len());
            if lines.try_reserve_exact(more).is_err() {
                return false;
            }
            lines.resize(lines.len().max(lines_needed), Line([0.0; 16]));
        }
        true
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_is_aligned_sized_and_reentrant() {
        with_scratch(37, |a| {
            assert_eq!(a.len(), 37);
            assert_eq!(a.as_ptr() as usize % 64, 0);
            a.fill(1.0);
            with_scratch(5, |b| {
                b.fill(2.0);
                assert_eq!(b.len(), 5);
            });
            assert!(a.iter().all(|&x| x == 1.0));
        });
    }

    #[test]
    fn warming_keeps_buffers_of_the_size_asked() {
        assert!(try_warm(1000, 3));
        IDLE.with(|idle| {
            let idle = idle.borrow();
            assert_eq!(idle.len(), 3);
            assert!(idle.iter().all(|b| b.len() * 16 >= 1000));
        });
    }

    /// A request above what the pool keeps neither takes a kept buffer (which it would grow
    /// and then free) nor is kept: the kept buffers are there, as warmed, after it.
    #[test]
    fn a_request_larger_than_kept_buffers_leaves_them_as_they_are() {
        assert!(try_warm(KEEP_LIMIT, 3));
        let kept = || {
            IDLE.with(|idle| {
                idle.borrow()
                    .iter()
                    .map(|b| b.as_ptr() as usize)
                    .collect::<Vec<_>>()
            })
        };
        let before = kept();
        assert_eq!(before.len(), 3);
        with_scratch(KEEP_LIMIT + 1, |big| {
            assert_eq!(big.len(), KEEP_LIMIT + 1);
            assert_eq!(kept(), before);
        });
        assert_eq!(kept(), before);
        assert!(largest_request() > KEEP_LIMIT);
    }
}
