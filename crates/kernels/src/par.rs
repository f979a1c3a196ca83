//! Optional rayon parallelism: the same loop body runs in parallel or on the calling thread.

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// How the row-wise kernels (softmax, norms, rope, embedding, reductions, transpose, pooling,
/// losses) split work across threads. Results never depend on it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RowParams {
    /// Elements of work per parallel task: whole rows are grouped until they reach this.
    pub task_elems: usize,
    /// Inputs with fewer elements run on the calling thread.
    pub min_parallel_elems: usize,
}

impl Default for RowParams {
    fn default() -> Self {
        Self {
            task_elems: 1 << 14,
            min_parallel_elems: 1 << 15,
        }
    }
}

/// Runs `f(first_row, rows)` over groups of whole rows of `out` (rows `row_len` long), in
/// parallel when `params` and the size `work` (elements touched) allow.
pub fn for_each_row_group(
    params: &RowParams,
    work: usize,
    out: &mut [f32],
    row_len: usize,
    f: impl Fn(usize, &mut [f32]) + Sync + Send,
) {
    if row_len == 0 || out.is_empty() {
        return;
    }
    let rows = rows_per_task(row_len, params.task_elems);
    let parallel = work >= params.min_parallel_elems;
    for_each_chunk_mut(parallel, out, rows * row_len, |i, chunk| f(i * rows, chunk));
}

/// Runs `f(i)` for `i in 0..n`, spread over rayon's pool when `parallel` is set.
pub fn for_each_index(parallel: bool, n: usize, f: impl Fn(usize) + Sync + Send) {
    if parallel && n > 1 {
        (0..n).into_par_iter().for_each(f);
    } else {
        (0..n).for_each(f);
    }
}

/// Runs `f(i, chunk)` over `data.chunks_mut(chunk)`, in parallel when `parallel` is set.
/// `chunk` must be non-zero.
pub fn for_each_chunk_mut<T: Send>(
    parallel: bool,
    data: &mut [T],
    chunk: usize,
    f: impl Fn(usize, &mut [T]) + Sync + Send,
) {
    if parallel && data.len() > chunk {
        data.par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, c)| f(i, c));
    } else {
        data.chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, c)| f(i, c));
    }
}

/// Rows of `row_len` elements to hand each parallel task so that it does at least `min_work`
/// element-operations; keeps rayon's per-task cost small next to the work.
fn rows_per_task(row_len: usize, min_work: usize) -> usize {
    min_work.div_ceil(row_len.max(1)).max(1)
}

/// A raw pointer that may cross threads. Used only where parallel tasks write provably disjoint
/// parts of one output that slices cannot express (2-D tiles); every use states why it is sound.
#[derive(Clone, Copy)]
pub(crate) struct SyncPtr(pub(crate) *mut f32);

impl SyncPtr {
    /// The pointer (a method, so that closures capture the whole `Sync` wrapper).
    pub(crate) fn get(self) -> *mut f32 {
        self.0
    }
}

// SAFETY: the pointer is only dereferenced by tasks writing disjoint elements, as argued at
// each use site; the pointee outlives the parallel region that shares it.
unsafe impl Send for SyncPtr {}
// SAFETY: as above.
unsafe impl Sync for SyncPtr {}
