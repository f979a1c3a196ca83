//! Overlapping all-reduces with compute: during a run, a rank's all-reduces go to a
//! communication thread of their own, in program order, while the steps after them go on; a
//! step that reads or writes a value still being reduced waits for it first, and the run waits
//! for all of them before it ends. So a data-parallel step's gradient all-reduces run while
//! the backward computes the next gradients (PyTorch DDP's and MindSpore's bucketed overlap,
//! one gradient at a time), and the time a rank would spend waiting for a slower peer is spent
//! computing.
//!
//! Every other collective (gathers and scatters whose result the next step needs) runs on the
//! step's thread as before, after the pending all-reduces, so the backend sees one collective
//! at a time, in the same order on every rank.

use std::ops::Range;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::Scope;
use std::time::{Duration, Instant};

use mslc_kernels::step::CollectiveStep;

use super::step::group_axis;
use super::{Collectives, Mesh};
use crate::error::{ExecError, ExecResult};

/// The collectives of a rank, shared by the step's thread and the communication thread; one
/// of them uses it at a time.
pub(crate) type SharedCollectives<'c> = Mutex<&'c mut (dyn Collectives + 'static)>;

/// When a step's all-reduce ran on the communication thread, from the start of the run.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReducedSpan {
    /// The step of the program.
    pub step: usize,
    /// When it started, from the start of the run.
    pub start: Duration,
    /// How long it took.
    pub duration: Duration,
}

/// An all-reduce handed to the communication thread: `len` values at `data`, summed in place
/// over the group of mesh axis `axis`.
struct Job {
    step: usize,
    axis: usize,
    data: *mut f32,
    len: usize,
}

// SAFETY: the values at `data` are the run's, which nothing else reads or writes until the
// step's thread has waited for this job ([`Overlap::wait_touching`]); the pointer crosses to
// the communication thread and is used there alone meanwhile.
unsafe impl Send for Job {}

/// What the communication thread has done, shared with the step's thread.
#[derive(Default)]
struct Done {
    /// How many jobs are finished (they finish in the order they were issued).
    count: u64,
    /// The first job's failure; the jobs after it are skipped.
    error: Option<ExecError>,
    /// When each finished job ran.
    spans: Vec<ReducedSpan>,
}

/// The step's thread's side of the overlap during one run.
pub(crate) struct Overlap<'c> {
    jobs: Option<Sender<Job>>,
    done: Arc<(Mutex<Done>, Condvar)>,
    comm: &'c SharedCollectives<'c>,
    /// The mesh of the collectives, read without taking them from the communication thread.
    mesh: Mesh,
    /// Jobs issued so far.
    issued: u64,
    /// The unfinished jobs: their number and the address range of their values.
    pending: Vec<(u64, Range<usize>)>,
}

/// A lock that a panicking holder poisoned is still the values it guarded.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl<'c> Overlap<'c> {
    /// Starts the communication thread of a run that started at `run_start`, in `scope`.
    pub(crate) fn start<'scope>(
        scope: &'scope Scope<'scope, '_>,
        comm: &'c SharedCollectives<'c>,
        run_start: Instant,
    ) -> Overlap<'c>
    where
        'c: 'scope,
    {
        let mesh = lock(comm).mesh().clone();
        let (jobs, queue) = channel::<Job>();
        let done = Arc::new((Mutex::new(Done::default()), Condvar::new()));
        let shared = Arc::clone(&done);
        scope.spawn(move || {
            for job in queue {
                let failed = lock(&shared.0).error.is_some();
                let start = Instant::now();
                let result = match failed {
                    true => Ok(()),
                    false => {
                        // SAFETY: see `Job`: the step's thread leaves these values alone
                        // until it has waited for this job.
                        let data = unsafe { std::slice::from_raw_parts_mut(job.data, job.len) };
                        lock(comm).all_reduce(job.axis, data)
                    }
                };
                let span = ReducedSpan {
                    step: job.step,
                    start: start - run_start,
                    duration: start.elapsed(),
                };
                let (state, finished) = &*shared;
                let mut state = lock(state);
                state.count += 1;
                match result {
                    Ok(()) if !failed => state.spans.push(span),
                    Ok(()) => {}
                    Err(e) => {
                        state.error.get_or_insert(e);
                    }
                }
                finished.notify_all();
            }
        });
        Overlap {
            jobs: Some(jobs),
            done,
            comm,
            mesh,
            issued: 0,
            pending: Vec::new(),
        }
    }

    /// Hands `collective` (step `step` of the program, an all-reduce) of `data` to the
    /// communication thread; the step's thread must leave `data` alone until it has waited for
    /// it.
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
            axis,
            data: data.as_mut_ptr(),
            len: data.len(),
        };
        let sent = self
            .jobs
            .as_ref()
            .is_some_and(|jobs| jobs.send(job).is_ok());
        if !sent {
            return Err(super::collective_error(
                "the communication thread stopped before the run ended",
            ));
        }
        self.pending.push((self.issued, range));
        self.issued += 1;
        Ok(())
    }

    /// Waits for every pending all-reduce whose values overlap one of `ranges` (addresses),
    /// and for those issued before it.
    pub(crate) fn wait_touching(&mut self, ranges: &[Range<usize>]) -> ExecResult<()> {
        let touching = self
            .pending
            .iter()
            .filter(|(_, r)| ranges.iter().any(|o| o.start < r.end && r.start < o.end))
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
    pub(crate) fn collectives(
        &mut self,
    ) -> ExecResult<MutexGuard<'c, &'c mut (dyn Collectives + 'static)>> {
        self.wait_all()?;
        Ok(lock(self.comm))
    }

    /// Waits until `count` jobs are finished; the first failure among them, if any.
    fn wait_until(&mut self, count: u64) -> ExecResult<()> {
        let (state, finished) = &*self.done;
        let mut state = lock(state);
        while state.count < count && state.error.is_none() {
            state = finished.wait(state).unwrap_or_else(|p| p.into_inner());
        }
        if let Some(e) = &state.error {
            return Err(e.clone());
        }
        self.pending.retain(|&(id, _)| id >= count);
        Ok(())
    }

    /// Ends the run's overlap: waits for every all-reduce and stops the thread; when each ran,
    /// and the first failure.
    pub(crate) fn finish(mut self) -> (Vec<ReducedSpan>, ExecResult<()>) {
        let waited = self.wait_all();
        self.jobs = None;
        let spans = std::mem::take(&mut lock(&self.done.0).spans);
        (spans, waited)
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
                        let comm: &mut (dyn Collectives + 'static) = &mut r;
                        let shared = Mutex::new(comm);
                        std::thread::scope(|inner| {
                            let mut overlap = Overlap::start(inner, &shared, Instant::now());
                            let out = body(me, &mut overlap);
                            let (spans, waited) = overlap.finish();
                            (out, spans, waited)
                        })
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
            drop(overlap.collectives().unwrap());
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
                        let comm: &mut (dyn Collectives + 'static) = &mut r;
                        let shared = Mutex::new(comm);
                        std::thread::scope(|inner| {
                            let mut overlap = Overlap::start(inner, &shared, Instant::now());
                            let mut data = vec![1.0f32; 4];
                            overlap.issue(0, &all_reduce(), &mut data).unwrap();
                            let waited = overlap.wait_all();
                            let (_, finished) = overlap.finish();
                            assert!(finished.is_err());
                            waited.err()
                        })
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let err = outcomes[0].as_ref().expect("rank 0's wait failed");
        assert!(err.message.contains("rank 1 left"), "{}", err.message);
    }
}
