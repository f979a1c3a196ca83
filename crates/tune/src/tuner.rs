//! Tuning a module: its signatures looked up in the knowledge base first; the unknown ones
//! checked and timed with their default kernel, then searched one by one, each given a share
//! of the remaining budget in proportion to its share of the module's time (default time ×
//! steps), largest first. Each result goes into the knowledge base, saved after every
//! signature, so an interrupted run keeps everything measured so far.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use mslc_kernels::binding::KernelParam;

use crate::case::Case;
use crate::kb::{KbError, KnowledgeBase, Record};
use crate::measure::{Candidate, CandidateRunner, CONFIRM};
use crate::reference::reference_output;
use crate::search::{Rejected, Search};
use crate::space::Space;

/// How to tune.
#[derive(Clone, Debug)]
pub struct Options {
    /// Wall-clock budget for the whole module.
    pub budget: Duration,
    /// Worker threads the kernels run with (and the knowledge base is keyed by).
    pub threads: usize,
    /// The device fingerprint results are keyed by.
    pub device: String,
}

/// Where a signature's result comes from.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// Measured in this run.
    Measured,
    /// Known from the knowledge base; nothing measured.
    KnowledgeBase,
    /// Measured in this run, but stopped before the search ended: saved, and searched again
    /// by the next run.
    Interrupted,
    /// Not tuned; the reason.
    Skipped(String),
}

/// One signature's result.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    /// The op signature.
    pub signature: String,
    /// The kernel family.
    pub kernel: String,
    /// Steps of the module with this signature.
    pub steps: usize,
    /// The winning parameters (the defaults when nothing beat them).
    pub params: BTreeMap<String, KernelParam>,
    /// Microseconds per call with the defaults (0 when not measured).
    pub default_us: f64,
    /// Microseconds per call with the winner.
    pub tuned_us: f64,
    /// Candidates measured for it (in the run that measured it).
    pub candidates: usize,
    /// Candidates the correctness guard or a failure discarded.
    pub rejected: Vec<Rejected>,
    /// Where the result comes from.
    pub source: Source,
}

impl Outcome {
    /// Default time over tuned time (1 when either is unknown).
    pub fn speedup(&self) -> f64 {
        if self.default_us > 0.0 && self.tuned_us > 0.0 {
            self.default_us / self.tuned_us
        } else {
            1.0
        }
    }
}

/// A progress report, sent after each measurement step.
#[derive(Clone, Debug)]
pub struct Progress<'a> {
    /// Signatures finished.
    pub done: usize,
    /// Signatures in all.
    pub total: usize,
    /// The signature being tuned.
    pub current: &'a str,
    /// The best speed-up found so far over any signature.
    pub best_speedup: f64,
    /// Budget left.
    pub left: Duration,
}

/// Receives progress (the command line shows it as a bar).
pub trait Observer: Send {
    /// Called as the tuning advances.
    fn progress(&mut self, p: &Progress<'_>);
}

/// The whole run's result.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Per signature, in the module's order.
    pub outcomes: Vec<Outcome>,
    /// Whether the run was stopped before its budget (Ctrl-C).
    pub interrupted: bool,
    /// Seconds the run took.
    pub seconds: f64,
}

/// Tunes `cases` with `runner` and the budget and threads of `options`, reusing and filling
/// `kb` (saved to `db` after every signature, when given). `stop` ends the run early, keeping
/// what was measured.
pub fn tune(
    cases: &[Case],
    kb: &mut KnowledgeBase,
    db: Option<&Path>,
    options: &Options,
    runner: &dyn CandidateRunner,
    stop: &AtomicBool,
    observer: &mut dyn Observer,
) -> Result<Report, KbError> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(options.threads.max(1))
        .build()
        .map_err(|e| KbError::Unwritable(format!("cannot start the worker threads: {e}")))?;
    pool.install(|| Tuning::new(cases, options, runner, stop, observer).run(kb, db))
}

/// A signature waiting for its search: its reference output and default time.
struct Pending {
    index: usize,
    reference: Vec<f32>,
    default_s: f64,
}

/// The state of one run.
struct Tuning<'a> {
    cases: &'a [Case],
    options: &'a Options,
    runner: &'a dyn CandidateRunner,
    stop: &'a AtomicBool,
    observer: &'a mut dyn Observer,
    start: Instant,
    outcomes: Vec<Option<Outcome>>,
    best_speedup: f64,
}

impl<'a> Tuning<'a> {
    fn new(
        cases: &'a [Case],
        options: &'a Options,
        runner: &'a dyn CandidateRunner,
        stop: &'a AtomicBool,
        observer: &'a mut dyn Observer,
    ) -> Tuning<'a> {
        Tuning {
            cases,
            options,
            runner,
            stop,
            observer,
            start: Instant::now(),
            outcomes: vec![None; cases.len()],
            best_speedup: 1.0,
        }
    }

    fn left(&self) -> Duration {
        self.options.budget.saturating_sub(self.start.elapsed())
    }

    fn report(&mut self, current: &str) {
        let p = Progress {
            done: self.outcomes.iter().filter(|o| o.is_some()).count(),
            total: self.cases.len(),
            current,
            best_speedup: self.best_speedup,
            left: self.left(),
        };
        self.observer.progress(&p);
    }

    fn run(mut self, kb: &mut KnowledgeBase, db: Option<&Path>) -> Result<Report, KbError> {
        let mut pending = Vec::new();
        for (index, case) in self.cases.iter().enumerate() {
            self.report(&case.signature);
            let known = kb.get(&self.options.device, self.options.threads, &case.signature);
            if let Some(r) = known.filter(|r| r.complete) {
                self.outcomes[index] = Some(Outcome {
                    params: r.params.clone(),
                    default_us: r.default_us,
                    tuned_us: r.tuned_us,
                    candidates: r.candidates,
                    ..self.outcome(case, Source::KnowledgeBase)
                });
                continue;
            }
            if self.stop.load(Ordering::Relaxed) || self.left().is_zero() {
                continue;
            }
            match self.baseline(case) {
                Ok((reference, default_s)) => pending.push(Pending {
                    index,
                    reference,
                    default_s,
                }),
                Err(reason) => {
                    self.outcomes[index] = Some(self.outcome(case, Source::Skipped(reason)))
                }
            }
        }
        // Largest share of the module's time first.
        let weight = |p: &Pending| p.default_s * self.cases[p.index].steps.len() as f64;
        pending.sort_by(|a, b| weight(b).total_cmp(&weight(a)));
        let mut remaining: f64 = pending.iter().map(weight).sum();
        for p in &pending {
            if self.stop.load(Ordering::Relaxed) {
                break;
            }
            let share = if remaining > 0.0 {
                weight(p) / remaining
            } else {
                1.0
            };
            remaining -= weight(p);
            let deadline = Instant::now() + self.left().mul_f64(share.clamp(0.0, 1.0));
            let mut outcome = self.search(p, deadline);
            let complete = !self.stop.load(Ordering::Relaxed);
            if !complete {
                outcome.source = Source::Interrupted;
            }
            kb.insert(Record {
                device: self.options.device.clone(),
                threads: self.options.threads,
                signature: outcome.signature.clone(),
                kernel: outcome.kernel.clone(),
                params: outcome.params.clone(),
                default_us: outcome.default_us,
                tuned_us: outcome.tuned_us,
                candidates: outcome.candidates,
                complete,
            });
            if let Some(db) = db {
                kb.save(db)?;
            }
            self.best_speedup = self.best_speedup.max(outcome.speedup());
            self.outcomes[p.index] = Some(outcome);
        }
        let interrupted = self.stop.load(Ordering::Relaxed);
        let outcomes = self
            .cases
            .iter()
            .zip(std::mem::take(&mut self.outcomes))
            .map(|(case, o)| {
                o.unwrap_or_else(|| {
                    let why = if interrupted {
                        "interrupted before it was tuned"
                    } else {
                        "the budget ran out before it was tuned"
                    };
                    self.outcome(case, Source::Skipped(why.to_string()))
                })
            })
            .collect();
        Ok(Report {
            outcomes,
            interrupted,
            seconds: self.start.elapsed().as_secs_f64(),
        })
    }

    /// An outcome for `case` with the default parameters and no times.
    fn outcome(&self, case: &Case, source: Source) -> Outcome {
        let choice = case.default_choice();
        Outcome {
            signature: case.signature.clone(),
            kernel: choice.name,
            steps: case.steps.len(),
            params: choice.params,
            default_us: 0.0,
            tuned_us: 0.0,
            candidates: 0,
            rejected: Vec::new(),
            source,
        }
    }

    /// The reference output of `case` and its default kernel's time, after checking the
    /// default against the reference; why it cannot be tuned otherwise.
    fn baseline(&self, case: &Case) -> Result<(Vec<f32>, f64), String> {
        let default = Candidate::new(case, case.default_choice())?;
        let views = case.views();
        let reference =
            reference_output(default.kernel(), case.op, &case.attrs, &views, case.ints())
                .ok_or_else(|| "no reference kernel to check candidates against".to_string())?
                .map_err(|e| format!("the reference kernel fails: {e}"))?;
        let mut out = vec![0.0; case.output_len()];
        let t = default
            .checked_time(self.runner, &reference, &mut out)
            .map_err(|e| format!("the default kernel: {e}"))?;
        Ok((reference, t))
    }

    /// Searches one signature until `deadline`, then confirms the winner against the default
    /// with fresh measurements of both.
    fn search(&mut self, p: &Pending, deadline: Instant) -> Outcome {
        let case = &self.cases[p.index];
        self.report(&case.signature);
        let space = Space::of(case.op);
        let seed = p.index as u64 ^ 0x7475_6e65;
        let search = Search::new(case, &space, &p.reference, self.runner, seed);
        let found = search.run(p.default_s, deadline, self.stop);
        let default = space.default_point();
        let mut default_s = p.default_s;
        let mut best = default.clone();
        let mut best_s = p.default_s;
        if found.best != default {
            let again = |point: &Vec<usize>| {
                let candidate = Candidate::new(case, space.choice(point)).ok()?;
                let mut out = vec![0.0; case.output_len()];
                let a = candidate.time(self.runner, &mut out).ok()?;
                let b = candidate.time(self.runner, &mut out).ok()?;
                Some(a.min(b))
            };
            if let (Some(d), Some(b)) = (again(&default), again(&found.best)) {
                default_s = d;
                if b < d * CONFIRM {
                    best = found.best.clone();
                    best_s = b;
                } else {
                    best_s = d;
                }
            }
        }
        Outcome {
            params: space.choice(&best).params,
            default_us: default_s * 1e6,
            tuned_us: best_s * 1e6,
            candidates: found.candidates,
            rejected: found.rejected,
            ..self.outcome(case, Source::Measured)
        }
    }
}
