//! Optional rayon parallelism: the same loop body runs in parallel or on the calling thread.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

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

/// How long a thread kept warm by [`with_threads_awake`] looks for work that does not come
/// before it goes back to rayon's sleep.
const AWAKE_IDLE: Duration = Duration::from_millis(1);

thread_local! {
    /// Whether this thread is running [`with_threads_awake`]'s body or one of its pollers: a
    /// poller this thread would start (a job it pops while waiting) returns at once instead
    /// of spinning on top of work it must finish first.
    static AWAKE: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` on the calling thread while the other threads of its rayon pool look for work
/// instead of falling asleep between `f`'s parallel loops, so that each loop finds them awake.
///
/// A sequence of parallel kernels (a forward pass) hands its threads a few tens of
/// microseconds of work at a time, with single-threaded steps between; a rayon thread that
/// finds no work sleeps, and waking it takes about as long as a small product (a 128-token
/// tiny_llama forward on 2 threads: the second thread joined products 60-90 µs late). Here
/// each other thread runs a poller (a [`rayon::join`] job: nothing is allocated) that executes
/// whatever work appears ([`rayon::yield_now`]) until `f` returns, or until it has found none
/// for [`AWAKE_IDLE`]. Results are unchanged: the same tasks run, only sooner. Outside a pool,
/// on a pool of one thread, or of more threads than the machine has cores (where a poller
/// would take a core from a thread with work), `f` just runs.
pub fn with_threads_awake<R>(f: impl FnOnce() -> R) -> R {
    let threads = rayon::current_num_threads();
    let alone = threads < 2 || rayon::current_thread_index().is_none() || AWAKE.get();
    if alone || threads > cores() {
        return f();
    }
    let others = threads - 1;
    let done = AtomicBool::new(false);
    let body = AssertSend(|| {
        // Set while `f` runs; cleared, and the pollers let go, even if it panics.
        let _awake = Awake::new(Some(&done));
        AssertSend(f())
    });
    // SAFETY (of `AssertSend`): `rayon::join` runs its first closure on the calling thread, so
    // `f` and its result never cross threads.
    let (r, ()) = rayon::join(move || body.call(), || pollers(others, &done));
    r.0
}

/// The cores this process may run on (CPU affinity and cgroup quota included), asked once: the
/// answer reads cgroup files, which allocates, and a run must not.
pub fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// `f` (or a value) marked `Send` for [`with_threads_awake`], where it never leaves its thread.
struct AssertSend<T>(T);
// SAFETY: only built by `with_threads_awake`, for a closure and result that stay on the
// thread that made them (see there).
unsafe impl<T> Send for AssertSend<T> {}

impl<R, F: FnOnce() -> R> AssertSend<F> {
    /// Calls the closure (a method, so that closures capture the whole wrapper).
    fn call(self) -> R {
        (self.0)()
    }
}

/// Starts `n` (at least 1) pollers: one here, the rest as jobs for other threads to take.
fn pollers(n: usize, done: &AtomicBool) {
    if n > 1 {
        rayon::join(|| poll(done), || pollers(n - 1, done));
    } else {
        poll(done);
    }
}

/// Marks this thread [`AWAKE`] while it lives; on drop, clears the mark and sets `done`.
struct Awake<'a>(Option<&'a AtomicBool>);

impl<'a> Awake<'a> {
    fn new(done: Option<&'a AtomicBool>) -> Self {
        AWAKE.set(true);
        Self(done)
    }
}

impl Drop for Awake<'_> {
    fn drop(&mut self) {
        if let Some(done) = self.0 {
            done.store(true, Ordering::Release);
        }
        AWAKE.set(false);
    }
}

/// A short busy pause between two checks of a spinning wait (64 spin-loop hints, a few hundred
/// cycles), so that the check does not hammer the cache line another thread is about to write.
pub fn pause() {
    for _ in 0..64 {
        std::hint::spin_loop();
    }
}

/// Executes pool work as it appears until `done`, or until none has come for [`AWAKE_IDLE`].
fn poll(done: &AtomicBool) {
    if AWAKE.get() {
        return;
    }
    let _awake = Awake::new(None);
    let mut idle_since = None;
    while !done.load(Ordering::Acquire) {
        match rayon::yield_now() {
            Some(rayon::Yield::Executed) => idle_since = None,
            Some(rayon::Yield::Idle) => {
                let since = *idle_since.get_or_insert_with(Instant::now);
                if since.elapsed() > AWAKE_IDLE {
                    break;
                }
                pause();
            }
            None => break,
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::in_pool;

    /// The parallel loops of a body run with the threads kept awake give what they give
    /// without, nested calls and loops inside loops included, and every call returns (its
    /// pollers let go when the body ends).
    #[test]
    fn loops_with_threads_awake_give_the_same_results_and_return() {
        let body = || {
            let mut out = vec![0u64; 4096];
            for_each_chunk_mut(true, &mut out, 64, |i, chunk| {
                for (j, x) in chunk.iter_mut().enumerate() {
                    *x = (i * 64 + j) as u64 * 3;
                }
                // A loop inside a task: its thread may wait on work a poller holds.
                for_each_index(true, 4, |_| std::hint::black_box(()));
            });
            out
        };
        let want = body();
        for threads in [1, 2, 3] {
            let got = in_pool(threads, || {
                (0..20)
                    .map(|_| with_threads_awake(|| with_threads_awake(body)))
                    .collect::<Vec<_>>()
            });
            assert!(got.iter().all(|g| *g == want), "{threads} threads");
        }
    }

    /// A body that panics lets its pollers go and leaves the pool usable.
    #[test]
    fn a_panicking_body_releases_the_threads() {
        in_pool(2, || {
            let caught = std::panic::catch_unwind(|| with_threads_awake(|| panic!("body")));
            assert!(caught.is_err());
            assert!(!AWAKE.get());
            assert_eq!(with_threads_awake(|| 7), 7);
        });
    }
}
