//! Reusable, cache-line-aligned scratch buffers, so hot kernels do not allocate (and fault in
//! fresh pages) on every call.

use std::cell::RefCell;

/// 64 bytes: one cache line of f32.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; 16]);

/// Buffers larger than this many f32 are freed after use instead of kept.
const KEEP_LIMIT: usize = 8 << 20;
/// At most this many idle buffers are kept per thread.
const KEEP_COUNT: usize = 4;

thread_local! {
    static IDLE: RefCell<Vec<Vec<Line>>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with an aligned scratch slice of exactly `len` f32 whose contents are unspecified
/// (the caller writes before reading). Re-entrant: nested calls get distinct buffers.
pub fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    let lines_needed = len.div_ceil(16);
    let mut lines = IDLE
        .with(|idle| idle.borrow_mut().pop())
        .unwrap_or_default();
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
}
