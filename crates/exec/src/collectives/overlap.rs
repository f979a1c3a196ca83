//! Overlapping all-reduces with compute: during a run, a rank's all-reduces go to a queue that
//! the executor's communication thread works through, in program order, while the steps after
//! them go on; a step that reads or writes a value still being reduced waits for it first, and
//! the run waits for all of them before it ends. So a data-parallel step's gradient
//! all-reduces run while the backward computes the next gradients (PyTorch DDP's and
//! MindSpore's overlap, one gradient at a time instead of in buckets), and the time a rank
//! would spend waiting for a slower peer is spent computing.
//!
//! The thread lives as long as its executor ([`CommThread`]): a run starts none and joins
//! none. A step's thread that must wait for an all-reduce the communication thread has not
//! started (every core busy with the steps' own threads, so it has not been scheduled yet) runs
//! it itself, as a blocking collective would: waiting never costs more than not overlapping.
//!
//! Every other collective (gathers and scatters whose result the next step needs) runs on the
//! step's thread as before, after the pending all-reduces, so the backend sees one collective
//! at a time, in the same order on every rank.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mslc_kernels::step::CollectiveStep;

use super::step::group_axis;
use super::{Collectives, Mesh};
use crate::error::{ExecError, ExecResult};

/// When a step's all-reduce ran, from the start of the run.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReducedSpan {
    /// The step of the program.
    pub step: usize,
    /// When it started, from the start of the run.
    pub start: Duration,
    /// How long it took.
    pub duration: Duration,
    /// Whether the communication thread ran it, beside the steps (else the step's thread did,
    /// waiting for it before the communication thread had started it).
    pub overlapped: bool,
}

/// An all-reduce issued to the queue: `len` values at `data`, summed in place over the group
/// of mesh axis `axis` through `comm`.
struct Job {
    step: usize,
    comm: *mut (dyn Collectives + 'static),
    axis: usize,
    data: *mut f32,
    len: usize,
    run_start: Instant,
}

// SAFETY: a job's collectives and values belong to the run that issued it, which touches
// neither until the job is finished (it waits for it before it reads or writes the values,
// before it uses the collectives itself, and before it ends); whichever thread takes the job
// from the queue is then the only one to use the pointers, and jobs run one at a time.
unsafe impl Send for Job {}

/// The queue and what has been done, shared by the steps' thread and the communication thread.
#[derive(Default)]
struct Queue {
    /// The issued jobs no thread has taken yet, in program order.
    jobs: VecDeque<Job>,
    /// Whether a thread is running a job (one at a time, so they run in order).
    running: bool,
    /// The executor is gone: the communication thread stops.
    closed: bool,
    /// How many jobs are finished, over the thread's life.
    count: u64,
    /// The first failure of the current run's jobs; the jobs after it are skipped.
    error: Option<ExecError>,
    /// When each finished job of the current run ran.
    spans: Vec<ReducedSpan>,
}

/// The queue with its signal: a job issued, taken or finished, or the queue closed.
type Shared = (Mutex<Queue>, Condvar);

/// A lock that a panicking holder poisoned is still the values it guarded.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Takes the next job from `queue` when no other is running, marking it running; with whether
/// an earlier job of the run failed (it is then skipped).
fn take(queue: &mut Queue) -> Option<(Job, bool)> {
    if queue.running {
        return None;
    }
    let job = queue.jobs.pop_front()?;
    queue.running = true;
    Some((job, queue.error.is_some()))
}

/// Runs `job` (taken by [`take`]) without holding the queue's lock, then records it and
/// signals; `overlapped` when the communication thread runs it.
fn run_job(shared: &Shared, (job, failed): (Job, bool), overlapped: bool) -> MutexGuard<'_, Queue> {
    let start = Instant::now();
    let result = match failed {
        true => Ok(()),
        // SAFETY: see `Job`: this thread alone uses the run's collectives and these values
        // until the job is recorded finished below.
        false => unsafe {
            let data = std::slice::from_raw_parts_mut(job.data, job.len);
            (*job.comm).all_reduce(job.axis, data)
        },
    };
    let span = ReducedSpan {
        step: job.step,
        start: start - job.run_start,
        duration: start.elapsed(),
        overlapped,
    };
    let (state, signal) = shared;
    let mut queue = lock(state);
    queue.running = false;
    queue.count += 1;
    match result {
        Ok(()) if !failed => queue.spans.push(span),
        Ok(()) => {}
        Err(e) => {
            queue.error.get_or_insert(e);
        }
    }
    signal.notify_all();
    queue
}

/// Whether byte ranges `a` and `b` (addresses or offsets) share a byte.
pub(crate) fn share_bytes(a: &Range<usize>, b: &Range<usize>) -> bool {
    a.start < b.end && b.start < a.end
}

/// An executor's communication thread, started at its first run that overlaps an all-reduce
/// and stopped when the executor goes.
pub(crate) struct CommThread {
    shared: Arc<Shared>,
    handle: Option<JoinHandle<()>>,
}

impl CommThread {
    /// Starts the thread, waiting for jobs.
    pub(crate) fn start() -> CommThread {
        let shared = Arc::new((Mutex::new(Queue::default()), Condvar::new()));
        let theirs = Arc::clone(&shared);
        let handle = std::thread::Builder::new()
            .name("mslc-comm".to_string())
            .spawn(move || {
                let (state, signal) = &*theirs;
                let mut queue = lock(state);
                loop {
                    if let Some(job) = take(&mut queue) {
                        drop(queue);
                        queue = run_job(&theirs, job, true);
                    } else if queue.closed {
                        return;
                    } else {
                        queue = signal.wait(queue).unwrap_or_else(|p| p.into_inner());
                    }
                }
            })
            .ok();
        CommThread { shared, handle }
    }

    /// Whether the thread is there to take jobs (it could be started).
    pub(crate) fn is_running(&self) -> bool {
        self.handle.is_some()
    }
}

impl Drop for CommThread {
    fn drop(&mut self) {
        let (state, signal) = &*self.shared;
        lock(state).closed = true;
        signal.notify_all();
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

/// One run's side of the overlap: it issues the run's all-reduces to the communication thread
/// and waits for them.
pub(crate) struct Overlap<'r> {
    shared: &'r Shared,
    /// The run's collectives, lent to the jobs; used here only when none is pending.
    comm: *mut (dyn Collectives + 'static),
    /// The collectives' mesh, read without touching them while jobs run.
    mesh: Mesh,
    run_start: Instant,
    /// The thread's finished-job count when the run began.
    base: u64,
    /// Jobs the run issued so far.
    issued: u64,
    /// The unfinished jobs: their number in the run and the address range of their values.
    pending: Vec<(u64, Range<usize>)>,
    _run: std::marker::PhantomData<&'r mut (dyn Collectives + 'static)>,
}

impl<'r> Overlap<'r> {
    /// Begins a run that started at `run_start` on `thread`, with the collectives `comm`.
    pub(crate) fn start(
        thread: &'r CommThread,
        comm: &'r mut (dyn Collectives + 'static),
        run_start: Instant,
    ) -> Overlap<'r> {
        let shared = &*thread.shared;
        let base = {
            let mut queue = lock(&shared.0);
            queue.error = None;
            queue.spans.clear();
            queue.count
        };
        Overlap {
            shared,
            mesh: comm.mesh().clone(),
            comm,
            run_start,
            base,
            issued: 0,
            pending: Vec::new(),
            _run: std::marker::PhantomData,
        }
    }

    /// Issues `collective` (step `step` of the program, an all-reduce) of `data`; the step's
    /// thread must leave `data` alone until it has waited for it.
    pub(crate) fn issue(
        &mut self,
        step: usize,
        collective: &CollectiveStep,
        data: &mut [f32],
    ) -> ExecResult<()> {
        let axis = group_axis(collective, &self.mesh)?;
        let range = data.as_ptr() as usize..data.as_ptr() as usize + std::mem::size_of_val(data);
        let job = Job {
            step,
            comm: self.comm,
            axis,
            data: data.as_mut_ptr(),
            len: data.len(),
            run_start: self.run_start,
        };
        let (state, signal) = self.shared;
        lock(state).jobs.push_back(job);
        signal.notify_all();
        self.pending.push((self.issued, range));
        self.issued += 1;
        Ok(())
    }

    /// Whether an all-reduce the run issued may still be running (a step must then check what
    /// it touches, [`Overlap::wait_touching`]).
    pub(crate) fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Waits for every pending all-reduce whose values overlap one of `ranges` (addresses),
    /// and for those issued before it.
    pub(crate) fn wait_touching(&mut self, ranges: &[Range<usize>]) -> ExecResult<()> {
        let touching = self
            .pending
            .iter()
            .filter(|(_, r)| ranges.iter().any(|o| share_bytes(o, r)))
            .map(|&(id, _)| id)
            .max();
        match touching {
            Some(id) => self.wait_until(id + 1),
            None => Ok(()),
        }
    }

    /// Waits for every pending all-reduce.
    pub(crate) fn wait_all(&mut self) -> ExecResult<()> {
        self.wait_until(self.issued)
    }

    /// Waits for the pending all-reduces, then lends the collectives to a collective that runs
    /// on the step's thread.
    pub(crate) fn collectives(&mut self) -> ExecResult<&mut (dyn Collectives + 'static)> {
        self.wait_all()?;
        // SAFETY: no job of this run is pending, so no other thread uses them; the borrow of
        // `self` keeps the run from issuing one meanwhile.
        Ok(unsafe { &mut *self.comm })
    }

    /// Waits until `count` of the run's jobs are finished, running those the communication
    /// thread has not taken yet itself; the first failure among them, if any.
    fn wait_until(&mut self, count: u64) -> ExecResult<()> {
        let (state, signal) = self.shared;
        let mut queue = lock(state);
        // After a failure, every job the run issued: the later ones are skipped, and none may
        // be left for the thread to take once the run is over.
        let target = |queue: &Queue| match queue.error {
            None => self.base + count,
            Some(_) => self.base + self.issued,
        };
        while queue.count < target(&queue) {
            if let Some(job) = take(&mut queue) {
                drop(queue);
                queue = run_job(self.shared, job, false);
            } else {
                queue = signal.wait(queue).unwrap_or_else(|p| p.into_inner());
            }
        }
        if let Some(e) = &queue.error {
            return Err(e.clone());
        }
        self.pending.retain(|&(id, _)| id >= count);
        Ok(())
    }

    /// Ends the run's overlap: waits for every all-reduce it issued; when each ran, and the
    /// first failure.
    pub(crate) fn finish(mut self) -> (Vec<ReducedSpan>, ExecResult<()>) {
        let waited = self.wait_all();
        (std::mem::take(&mut lock(&self.shared.0).spans), waited)
    }
}

impl Drop for Overlap<'_> {
    /// A run that ends without [`Overlap::finish`] (a panic) still waits for its jobs, whose
    /// values and collectives it is about to give back.
    fn drop(&mut self) {
        let _ = self.wait_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collectives::threads::world;
    use mslc_core::ops::Op;

    fn all_reduce() -> CollectiveStep {
        CollectiveStep {
            op: Op::AllReduce,
            axis: "dp".to_string(),
            ranks: 2,
            dim: 0,
        }
    }

    /// Runs `body` on each rank of a 2-rank `dp` world with an [`Overlap`] over its
    /// collectives, returning what it returns and the spans [`Overlap::finish`] gave.
    fn on_two<T: Send>(
        body: impl Fn(usize, &mut Overlap<'_>) -> T + Sync,
    ) -> Vec<(T, Vec<ReducedSpan>, ExecResult<()>)> {
        let ranks = world(Mesh::line("dp", 2).unwrap());
        std::thread::scope(|s| {
            let handles: Vec<_> = ranks
                .into_iter()
                .map(|mut r| {
                    let body = &body;
                    s.spawn(move || {
                        let me = r.rank();
                        let thread = CommThread::start();
                        let mut overlap = Overlap::start(&thread, &mut r, Instant::now());
                        let out = body(me, &mut overlap);
                        let (spans, waited) = overlap.finish();
                        (out, spans, waited)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn issued_all_reduces_sum_in_order_while_the_caller_goes_on() {
        let results = on_two(|rank, overlap| {
            // Two buffers issued back to back (one large enough for the in-place sum); the
            // caller waits only for what touches the first before it reads it.
            let mut a = vec![rank as f32 + 1.0; 8];
            let mut b: Vec<f32> = (0..1 << 15).map(|i| (i * (rank + 1)) as f32).collect();
            overlap.issue(3, &all_reduce(), &mut a).unwrap();
            overlap.issue(7, &all_reduce(), &mut b).unwrap();
            let first = a.as_ptr() as usize..a.as_ptr() as usize + 4;
            overlap.wait_touching(&[first]).unwrap();
            let a_sum = a.clone();
            overlap.wait_all().unwrap();
            (a_sum, b[1000], b[(1 << 15) - 1])
        });
        for ((a, b_1000, b_last), spans, waited) in results {
            waited.unwrap();
            assert_eq!(a, vec![3.0; 8]);
            assert_eq!(b_1000, 3000.0);
            assert_eq!(b_last, 3.0 * ((1 << 15) - 1) as f32);
            let steps: Vec<usize> = spans.iter().map(|s| s.step).collect();
            assert_eq!(steps, [3, 7]);
        }
    }

    #[test]
    fn a_wait_for_values_no_all_reduce_touches_returns_at_once() {
        // Rank 1 issues its part only after rank 0 has waited for values of its own, so rank 0
        // finds its all-reduce still pending there.
        let issued = std::sync::Barrier::new(2);
        let results = on_two(|rank, overlap| {
            let mut pending = vec![1.0f32; 4];
            let elsewhere = [0.0f32; 4];
            let other = elsewhere.as_ptr() as usize..elsewhere.as_ptr() as usize + 16;
            let mut still_pending = 0;
            if rank == 1 {
                issued.wait();
            }
            overlap.issue(0, &all_reduce(), &mut pending).unwrap();
            if rank == 0 {
                overlap.wait_touching(&[other]).unwrap();
                still_pending = overlap.pending.len();
                issued.wait();
            }
            overlap.collectives().unwrap();
            (pending, still_pending)
        });
        assert_eq!(results[0].0 .1, 1);
        for ((pending, _), _, waited) in results {
            waited.unwrap();
            assert_eq!(pending, vec![2.0; 4]);
        }
    }

    #[test]
    fn a_wrong_group_size_is_refused_before_anything_is_handed_over() {
        let results = on_two(|_, overlap| {
            let mut data = vec![1.0f32; 4];
            let wrong = CollectiveStep {
                ranks: 4,
                ..all_reduce()
            };
            overlap.issue(0, &wrong, &mut data).unwrap_err().message
        });
        for (message, spans, waited) in results {
            assert!(message.contains("compiled for 4 ranks"), "{message}");
            assert!(spans.is_empty());
            waited.unwrap();
        }
    }

    #[test]
    fn a_peer_that_leaves_fails_the_wait_instead_of_hanging() {
        let ranks = world(Mesh::line("dp", 2).unwrap());
        let outcomes: Vec<Option<ExecError>> = std::thread::scope(|s| {
            let handles: Vec<_> = ranks
                .into_iter()
                .map(|mut r| {
                    s.spawn(move || {
                        if r.rank() == 1 {
                            // Leaves without joining: its rank is dropped with its thread.
                            return None;
                        }
                        let thread = CommThread::start();
                        let mut overlap = Overlap::start(&thread, &mut r, Instant::now());
                        let mut data = vec![1.0f32; 4];
                        overlap.issue(0, &all_reduce(), &mut data).unwrap();
                        let waited = overlap.wait_all();
                        let (_, finished) = overlap.finish();
                        assert!(finished.is_err());
                        waited.err()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let err = outcomes[0].as_ref().expect("rank 0's wait failed");
        assert!(err.message.contains("rank 1 left"), "{}", err.message);
    }
}
