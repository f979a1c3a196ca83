//! Cache-line-aligned byte buffers: the arena, each input and each parameter live in one, so
//! every f32 view the kernels get starts on a 64-byte boundary.

/// One cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// A zero-initialised, 64-byte-aligned byte buffer of fixed length.
pub struct AlignedBuf {
    lines: Vec<Line>,
    len: usize,
}

impl AlignedBuf {
    /// A buffer of no bytes, which allocates nothing: what a lent parameter leaves behind.
    pub const fn empty() -> Self {
        Self {
            lines: Vec::new(),
            len: 0,
        }
    }

    /// `len` zero bytes, or `None` when the memory cannot be had (a corrupt size, say),
    /// instead of aborting.
    pub fn zeroed(len: usize) -> Option<Self> {
        let count = len.div_ceil(64);
        let mut lines = Vec::new();
        lines.try_reserve_exact(count).ok()?;
        lines.resize(count, Line([0; 64]));
        Some(Self { lines, len })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `Line` is `repr(C)` over `[u8; 64]`, so the lines are `64 * lines.len() >= len`
        // initialised, contiguous bytes borrowed immutably with `self`.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<u8>(), self.len) }
    }

    /// The bytes, mutably.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, borrowed exclusively with `self`.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<u8>(), self.len) }
    }

    /// The first `n` elements as f32 (`4 * n <= len`).
    pub fn f32s_mut(&mut self, n: usize) -> &mut [f32] {
        assert!(4 * n <= self.len, "f32 view past the end of the buffer");
        // SAFETY: 64-byte alignment satisfies f32's; `4 * n` bytes are in bounds (checked) and
        // initialised; every bit pattern is a valid f32; borrowed exclusively with `self`.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<f32>(), n) }
    }

    /// The first `n` elements as i64 (`8 * n <= len`).
    pub fn i64s_mut(&mut self, n: usize) -> &mut [i64] {
        assert!(8 * n <= self.len, "i64 view past the end of the buffer");
        // SAFETY: as in `f32s_mut`, for i64.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<i64>(), n) }
    }

    /// Base pointer, for the executor's disjoint per-step views.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.lines.as_mut_ptr().cast::<u8>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_zeroed_and_sized() {
        let mut b = AlignedBuf::zeroed(100).unwrap();
        assert_eq!(b.len(), 100);
        assert!(b.bytes().iter().all(|&x| x == 0));
        assert_eq!(b.as_mut_ptr() as usize % 64, 0);
        b.f32s_mut(25).fill(1.5);
        assert_eq!(b.bytes()[..4], 1.5f32.to_le_bytes());
        assert_eq!(AlignedBuf::zeroed(0).unwrap().len(), 0);
        assert!(AlignedBuf::zeroed(usize::MAX).is_none());
    }
}
