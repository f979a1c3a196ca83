//! Optional rayon parallelism: the same loop body runs in parallel or on the calling thread.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// Pool threads whose busy time [`busy_nanos`] keeps (the executor starts at most 256).
pub const MAX_RECORDED_WORKERS: usize = 256;

/// Whether parallel tasks add their time to [`BUSY_NANOS`]; off unless a profile is wanted.
static RECORD_BUSY: AtomicBool = AtomicBool::new(false);

/// Nanoseconds each pool thread (by rayon index) has spent in parallel tasks while recording.
static BUSY_NANOS: [AtomicU64; MAX_RECORDED_WORKERS] =
    [const { AtomicU64::new(0) }; MAX_RECORDED_WORKERS];

/// Starts or stops recording how long each pool thread works in parallel tasks, for the
/// profiler's one-track-per-thread view. The counters are process-wide and keyed by the rayon
/// thread index, so two pools profiling at once would add into the same counters.
pub fn record_busy(on: bool) {
    RECORD_BUSY.store(on, Ordering::Relaxed);
}

/// Nanoseconds pool thread `worker` has spent in parallel tasks while recording was on.
pub fn busy_nanos(worker: usize) -> u64 {
    BUSY_NANOS
        .get(worker)
        .map_or(0, |n| n.load(Ordering::Relaxed))
}

/// Runs one parallel task, adding its time to this pool thread's counter when recording.
fn task<R>(f: impl FnOnce() -> R) -> R {
    if !RECORD_BUSY.load(Ordering::Relaxed) {
        return f();
    }
    let start = Instant::now();
    let r = f();
    if let Some(n) = rayon::current_thread_index().and_then(|i| BUSY_NANOS.get(i)) {
        let nanos = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        n.fetch_add(nanos, Ordering::Relaxed);
    }
    r
}

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
        (0..n).into_par_iter().for_each(|i| task(|| f(i)));
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
            .for_each(|(i, c)| task(|| f(i, c)));
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
