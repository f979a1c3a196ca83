//! How values of each dtype are stored: the executor computes in f32 and converts at load and
//! store, so f16/bf16 values keep their storage size and f64/int/bool values their type.

use half::{bf16, f16};
use rayon::prelude::*;

use mslc_core::ops::{DType, TensorType};
use mslc_kernels::convert;

/// Reinterprets the little-endian bytes of a stored f32 value in place (the arena, inputs and
/// parameters are 64-byte aligned, so this never copies). f16/bf16 convert with the kernels'
/// vectorised routines.
pub fn f32_view(bytes: &[u8]) -> Option<&[f32]> {
    // SAFETY: every bit pattern is a valid f32; `align_to` only yields an aligned middle part.
    let (head, mid, tail) = unsafe { bytes.align_to::<f32>() };
    (head.is_empty() && tail.is_empty()).then_some(mid)
}

/// `bytes` as f32s, mutably, when they are aligned and a whole number of them.
fn f32_view_mut(bytes: &mut [u8]) -> Option<&mut [f32]> {
    // SAFETY: every bit pattern is a valid f32; `align_to_mut` only yields an aligned middle.
    let (head, mid, tail) = unsafe { bytes.align_to_mut::<f32>() };
    (head.is_empty() && tail.is_empty()).then_some(mid)
}

/// Sets `bytes`, a stored value of type `ty`, to the f32 values `draw` writes into a slice of
/// its element count, and returns what `draw` returns: straight into the buffer where it holds
/// f32 (a seeded parameter or input has no copy of its values beside the buffers: GPT-2's
/// embedding, 154 MB; ResNet-50's images at B=32, 19 MB), else through one vector of them,
/// converted (also when `draw` reports a failure: its caller then holds the value unready).
pub(crate) fn draw_into<R>(
    ty: &TensorType,
    bytes: &mut [u8],
    draw: impl FnOnce(&mut [f32]) -> R,
) -> R {
    let n = ty.checked_numel().unwrap_or(0) as usize;
    if ty.dtype == DType::F32 && bytes.len() == 4 * n {
        if let Some(values) = f32_view_mut(bytes) {
            return draw(values);
        }
    }
    let mut values = vec![0f32; n];
    let drawn = draw(&mut values);
    store_f32(ty.dtype, &values, bytes);
    drawn
}

/// As [`load_f32`] for a `[V, H]` table (`shape`) of which only the rows `ids` names are read
/// (an embedding's): those rows are decoded into their places in `dst`, the others left as
/// they are; ids outside the table are skipped (the kernel reports them). The whole table
/// where the ids are as many as its rows.
pub fn load_rows_f32(dtype: DType, src: &[u8], shape: &[usize], ids: &[i64], dst: &mut [f32]) {
    let (&[rows, width], Ok(size)) = (shape, usize::try_from(dtype.size_bytes())) else {
        return load_f32(dtype, src, dst);
    };
    if ids.len() >= rows {
        return load_f32(dtype, src, dst);
    }
    for &id in ids {
        let Some(row) = usize::try_from(id).ok().filter(|&r| r < rows) else {
            continue;
        };
        let (at, len) = (row * width, width);
        if let (Some(from), Some(to)) = (
            src.get(at * size..(at + len) * size),
            dst.get_mut(at..at + len),
        ) {
            load_f32(dtype, from, to);
        }
    }
}

/// Values converted per parallel task by [`load_f32`] and [`store_f32`]; fewer than two
/// tasks' worth are converted on the calling thread. A step's operands and results in f16 are
/// converted while the pool's other threads wait for its kernel: tiny_llama's (S = 128)
/// conversions were 7.5 % of its forward, all on one thread.
const CONVERT_TASK: usize = 1 << 13;

/// Whether the caller runs in a pool of several threads (an executor's), where work on large
/// buffers is split: outside one (as when weights are read before an executor exists) no
/// pool is started for it.
pub(crate) fn in_a_pool_of_several_threads() -> bool {
    rayon::current_thread_index().is_some() && rayon::current_num_threads() > 1
}

/// Runs `convert` over matching chunks of `src` (elements of `size` bytes) and `dst`, in
/// parallel where there are enough of them and [`in_a_pool_of_several_threads`].
fn convert_chunks<T: Sync, U: Send>(
    src: &[T],
    size: usize,
    dst: &mut [U],
    per_value: usize,
    convert: impl Fn(&[T], &mut [U]) + Sync,
) {
    let values = dst.len() / per_value.max(1);
    if values < 2 * CONVERT_TASK || !in_a_pool_of_several_threads() {
        return convert(src, dst);
    }
    dst.par_chunks_mut(CONVERT_TASK * per_value)
        .zip(src.par_chunks(CONVERT_TASK * size))
        .for_each(|(d, s)| convert(s, d));
}

/// Decodes `src` (elements of `dtype`) into `dst` as f32; `dst.len()` elements are read.
pub fn load_f32(dtype: DType, src: &[u8], dst: &mut [f32]) {
    let size = dtype.size_bytes() as usize;
    convert_chunks(src, size, dst, 1, |s, d| load_f32_serial(dtype, s, d));
}

/// [`load_f32`] on the calling thread.
fn load_f32_serial(dtype: DType, src: &[u8], dst: &mut [f32]) {
    match dtype {
        DType::F32 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        DType::F16 => match half_view::<f16>(src) {
            Some(h) if convert::f16_to_f32(h, dst).is_ok() => {}
            _ => {
                for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                    *d = f16::from_le_bytes([c[0], c[1]]).to_f32();
                }
            }
        },
        DType::BF16 => match half_view::<bf16>(src) {
            Some(h) if convert::bf16_to_f32(h, dst).is_ok() => {}
            _ => {
                for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                    *d = bf16::from_le_bytes([c[0], c[1]]).to_f32();
                }
            }
        },
        DType::F64 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(8)) {
                *d = f64::from_le_bytes(eight(c)) as f32;
            }
        }
        DType::I64 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(8)) {
                *d = i64::from_le_bytes(eight(c)) as f32;
            }
        }
        DType::I32 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32;
            }
        }
        DType::Bool => {
            for (d, &b) in dst.iter_mut().zip(src) {
                *d = if b != 0 { 1.0 } else { 0.0 };
            }
        }
    }
}

/// Converts `src` (elements of `from`) into `dst` (elements of `to`, as many) in one pass
/// ([`convert::one_pass`]): a byte copy for the same dtype, [`load_f32`] into f32,
/// [`store_f32`] from f32. `false` (and nothing written) for any other pair, which needs f32
/// between, or for f32 bytes that are not aligned as f32.
pub fn convert_bytes(from: DType, src: &[u8], to: DType, dst: &mut [u8]) -> bool {
    if !convert::one_pass(from, to) {
        return false;
    }
    if from == to {
        let n = src.len().min(dst.len());
        dst[..n].copy_from_slice(&src[..n]);
        return true;
    }
    match to {
        DType::F32 => f32_view_mut(dst).map(|dst| load_f32(from, src, dst)),
        _ => f32_view(src).map(|src| store_f32(to, src, dst)),
    }
    .is_some()
}

/// Decodes integer (or bool) elements of `dtype` into `dst` exactly; float elements are
/// truncated toward zero.
pub fn load_i64(dtype: DType, src: &[u8], dst: &mut [i64]) {
    match dtype {
        DType::I64 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(8)) {
                *d = i64::from_le_bytes(eight(c));
            }
        }
        DType::I32 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]]));
            }
        }
        DType::Bool => {
            for (d, &b) in dst.iter_mut().zip(src) {
                *d = i64::from(b != 0);
            }
        }
        DType::F64 | DType::F32 | DType::F16 | DType::BF16 => {
            let size = dtype.size_bytes() as usize;
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(size)) {
                let mut one = [0f32];
                load_f32(dtype, c, &mut one);
                *d = one[0] as i64;
            }
        }
    }
}

/// Encodes `src` as elements of `dtype` into `dst` (round to nearest for narrower floats,
/// truncation toward zero with saturation for ints, non-zero → true for bool).
pub fn store_f32(dtype: DType, src: &[f32], dst: &mut [u8]) {
    let size = dtype.size_bytes() as usize;
    convert_chunks(src, 1, dst, size, |s, d| store_f32_serial(dtype, s, d));
}

/// [`store_f32`] on the calling thread.
fn store_f32_serial(dtype: DType, src: &[f32], dst: &mut [u8]) {
    match dtype {
        DType::F32 => {
            for (c, v) in dst.chunks_exact_mut(4).zip(src) {
                c.copy_from_slice(&v.to_le_bytes());
            }
        }
        DType::F16 => {
            let done =
                half_view_mut::<f16>(dst).is_some_and(|h| convert::f32_to_f16(src, h).is_ok());
            if !done {
                for (c, &v) in dst.chunks_exact_mut(2).zip(src) {
                    c.copy_from_slice(&f16::from_f32(v).to_le_bytes());
                }
            }
        }
        DType::BF16 => {
            let done =
                half_view_mut::<bf16>(dst).is_some_and(|h| convert::f32_to_bf16(src, h).is_ok());
            if !done {
                for (c, &v) in dst.chunks_exact_mut(2).zip(src) {
                    c.copy_from_slice(&bf16::from_f32(v).to_le_bytes());
                }
            }
        }
        DType::F64 => {
            for (c, &v) in dst.chunks_exact_mut(8).zip(src) {
                c.copy_from_slice(&f64::from(v).to_le_bytes());
            }
        }
        DType::I64 => {
            for (c, &v) in dst.chunks_exact_mut(8).zip(src) {
                c.copy_from_slice(&(v as i64).to_le_bytes());
            }
        }
        DType::I32 => {
            for (c, &v) in dst.chunks_exact_mut(4).zip(src) {
                c.copy_from_slice(&(v as i32).to_le_bytes());
            }
        }
        DType::Bool => {
            for (c, &v) in dst.iter_mut().zip(src) {
                *c = u8::from(v != 0.0);
            }
        }
    }
}

fn eight(c: &[u8]) -> [u8; 8] {
    [c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]
}

/// Little-endian targets store half floats exactly as `half` lays them out in memory.
fn half_view<T: sealed::Half>(bytes: &[u8]) -> Option<&[T]> {
    if !cfg!(target_endian = "little") {
        return None;
    }
    // SAFETY: `f16` and `bf16` are `repr(transparent)` over `u16`: any bit pattern is valid;
    // `align_to` only yields an aligned middle part.
    let (head, mid, tail) = unsafe { bytes.align_to::<T>() };
    (head.is_empty() && tail.is_empty()).then_some(mid)
}

fn half_view_mut<T: sealed::Half>(bytes: &mut [u8]) -> Option<&mut [T]> {
    if !cfg!(target_endian = "little") {
        return None;
    }
    // SAFETY: as in `half_view`; the bytes are borrowed exclusively.
    let (head, mid, tail) = unsafe { bytes.align_to_mut::<T>() };
    (head.is_empty() && tail.is_empty()).then_some(mid)
}

/// The two 16-bit float types, which may be viewed over raw bytes.
mod sealed {
    /// A 16-bit float type valid for every bit pattern.
    pub trait Half: Copy {}
    impl Half for half::f16 {}
    impl Half for half::bf16 {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_conversions_split_over_threads_give_the_serial_bits() {
        // Not a whole number of tasks, so that the last chunk is short.
        let n = 5 * CONVERT_TASK / 2 + 3;
        let values: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 7e4).collect();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        for dtype in [DType::F16, DType::BF16, DType::F32, DType::I32] {
            let size = dtype.size_bytes() as usize;
            let (mut serial, mut parallel) = (vec![0u8; n * size], vec![1u8; n * size]);
            store_f32_serial(dtype, &values, &mut serial);
            pool.install(|| store_f32(dtype, &values, &mut parallel));
            assert_eq!(serial, parallel, "{dtype}");
            let (mut back, mut back_parallel) = (vec![0f32; n], vec![1f32; n]);
            load_f32_serial(dtype, &serial, &mut back);
            pool.install(|| load_f32(dtype, &serial, &mut back_parallel));
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&back), bits(&back_parallel), "{dtype}");
        }
    }

    #[test]
    fn conversions_outside_a_pool_run_on_the_calling_thread() {
        // Reading weights happens outside the executor's pool: no pool is started for it.
        let (src, mut dst) = (
            vec![0u8; 4 * CONVERT_TASK * 4],
            vec![0f32; 4 * CONVERT_TASK],
        );
        let calls = std::sync::atomic::AtomicUsize::new(0);
        convert_chunks(&src, 4, &mut dst, 1, |s, d| {
            assert_eq!(rayon::current_thread_index(), None);
            calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            load_f32_serial(DType::F32, s, d);
        });
        assert_eq!(calls.into_inner(), 1);
        // Inside a pool of two, the same call splits into tasks.
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let calls = std::sync::atomic::AtomicUsize::new(0);
        pool.install(|| {
            convert_chunks(&src, 4, &mut dst, 1, |s, d| {
                calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                load_f32_serial(DType::F32, s, d);
            })
        });
        assert_eq!(calls.into_inner(), 4);
    }

    #[test]
    fn a_conversion_in_one_pass_is_the_one_through_f32() {
        let values = [0.5f32, -3.0, 65504.0, 1e5, 1.0009765];
        let mut f32_bytes = vec![0u8; values.len() * 4];
        store_f32(DType::F32, &values, &mut f32_bytes);
        // Through f32, as a copy step through staging converts.
        let through = |from: DType, src: &[u8], to: DType| {
            let mut wide = vec![0f32; values.len()];
            load_f32(from, src, &mut wide);
            let mut out = vec![0u8; values.len() * to.size_bytes() as usize];
            store_f32(to, &wide, &mut out);
            out
        };
        for (from, to) in [
            (DType::F32, DType::F16),
            (DType::F32, DType::BF16),
            (DType::F32, DType::I32),
            (DType::F16, DType::F32),
            (DType::BF16, DType::F32),
            (DType::F16, DType::F16),
        ] {
            let src = through(DType::F32, &f32_bytes, from);
            let mut dst = vec![0u8; values.len() * to.size_bytes() as usize];
            assert!(convert_bytes(from, &src, to, &mut dst), "{from} -> {to}");
            assert_eq!(dst, through(from, &src, to), "{from} -> {to}");
        }
        // Neither side f32: not one pass.
        let src = through(DType::F32, &f32_bytes, DType::F16);
        let mut dst = vec![7u8; values.len() * 2];
        assert!(!convert_bytes(DType::F16, &src, DType::BF16, &mut dst));
        assert!(dst.iter().all(|&b| b == 7));
    }

    #[test]
    fn every_dtype_round_trips_representable_values() {
        let values = [0.0f32, 1.0, -2.0, 3.0, 100.0];
        for &dtype in DType::ALL {
            let vals: Vec<f32> = if dtype == DType::Bool {
                vec![0.0, 1.0, 1.0, 0.0, 1.0]
            } else {
                values.to_vec()
            };
            let mut bytes = vec![0u8; vals.len() * dtype.size_bytes() as usize];
            store_f32(dtype, &vals, &mut bytes);
            let mut back = vec![0f32; vals.len()];
            load_f32(dtype, &bytes, &mut back);
            assert_eq!(back, vals, "{dtype}");
            let mut ints = vec![0i64; vals.len()];
            load_i64(dtype, &bytes, &mut ints);
            let want: Vec<i64> = vals.iter().map(|&v| v as i64).collect();
            assert_eq!(ints, want, "{dtype}");
        }
    }

    #[test]
    fn narrow_floats_round_to_nearest() {
        let mut bytes = [0u8; 2];
        store_f32(DType::BF16, &[1.0 + 1.0 / 512.0], &mut bytes);
        let mut back = [0f32];
        load_f32(DType::BF16, &bytes, &mut back);
        assert_eq!(back[0], 1.0);
        assert_eq!(f32_view(&[0u8; 8]).map(<[f32]>::len), Some(2));
    }

    /// An embedding's f16 table of 4 rows × 3: the rows the ids name are decoded into their
    /// places, the others untouched; ids outside the table are skipped; as many ids as rows
    /// decode the whole table.
    #[test]
    fn only_the_rows_an_embedding_reads_are_decoded() {
        let table: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let mut bytes = vec![0u8; 12 * 2];
        store_f32(DType::F16, &table, &mut bytes);
        let mut out = vec![-1.0f32; 12];
        load_rows_f32(DType::F16, &bytes, &[4, 3], &[2, -1, 7], &mut out);
        let want = [
            -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, 6.0, 7.0, 8.0, -1.0, -1.0, -1.0,
        ];
        assert_eq!(out, want);
        load_rows_f32(DType::F16, &bytes, &[4, 3], &[0, 0, 0, 0], &mut out);
        assert_eq!(out, table);
    }
}
