//! The search over one signature's parameter space (Ansor/MetaSchedule-style, not a grid):
//! evolutionary mutation of the best candidates measured so far, proposals ranked by a cost
//! model refitted after every measurement, a share of random exploration, and a stop when the
//! time is up or the best has not moved for a while. Every candidate runs through the
//! correctness guard before its time counts.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use serde::Serialize;

use mslc_kernels::binding::KernelParam;

use crate::case::{Case, Rng};
use crate::measure::{Candidate, CandidateRunner};
use crate::model::CostModel;
use crate::space::{Point, Space};

/// A candidate that may not win, and why.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Rejected {
    /// Its parameters.
    pub params: BTreeMap<String, KernelParam>,
    /// Why: a wrong result (differs from the reference kernel) or a failure to run.
    pub reason: String,
}

/// What the search found.
#[derive(Clone, Debug)]
pub struct Found {
    /// The best point measured (the default when nothing beat it).
    pub best: Point,
    /// Its seconds per call.
    pub best_s: f64,
    /// Candidates measured (the default included).
    pub candidates: usize,
    /// Candidates the guard discarded.
    pub rejected: Vec<Rejected>,
}

/// Mutated proposals drawn per round, of which the model's favourite is measured.
const PROPOSALS: usize = 48;
/// Rounds without a 1 % improvement after which the search stops early.
const PATIENCE: usize = 24;
/// Every this many rounds a random proposal is measured instead (exploration).
const EXPLORE_EVERY: usize = 4;

/// One signature's search state.
pub struct Search<'a> {
    case: &'a Case,
    space: &'a Space,
    reference: &'a [f32],
    runner: &'a dyn CandidateRunner,
    out: Vec<f32>,
    tried: HashSet<Point>,
    measured: Vec<(Point, f64)>,
    rejected: Vec<Rejected>,
    rng: Rng,
}

impl<'a> Search<'a> {
    /// A search of `space` for `case`, whose candidates must match `reference`.
    pub fn new(
        case: &'a Case,
        space: &'a Space,
        reference: &'a [f32],
        runner: &'a dyn CandidateRunner,
        seed: u64,
    ) -> Search<'a> {
        Search {
            case,
            space,
            reference,
            runner,
            out: vec![0.0; case.output_len()],
            tried: HashSet::new(),
            measured: Vec::new(),
            rejected: Vec::new(),
            rng: Rng::new(seed),
        }
    }

    /// Measures `point` after checking its output; its seconds per call, or `None` when it
    /// cannot run or is wrong (then it is recorded as rejected).
    pub fn evaluate(&mut self, point: &Point) -> Option<f64> {
        self.tried.insert(point.clone());
        let choice = self.space.choice(point);
        let result = Candidate::new(self.case, choice.clone()).and_then(|candidate| {
            candidate.checked_time(self.runner, self.reference, &mut self.out)
        });
        match result {
            Ok(t) => {
                self.measured.push((point.clone(), t));
                Some(t)
            }
            Err(reason) => {
                self.rejected.push(Rejected {
                    params: choice.params,
                    reason,
                });
                None
            }
        }
    }

    /// Searches until `deadline` or `stop`, starting from the measured default (`default_s`).
    pub fn run(mut self, default_s: f64, deadline: Instant, stop: &AtomicBool) -> Found {
        let default = self.space.default_point();
        self.tried.insert(default.clone());
        self.measured.push((default, default_s));
        let mut best_s = default_s;
        let mut since_better = 0;
        let mut round = 0;
        while Instant::now() < deadline
            && !stop.load(Ordering::Relaxed)
            && (self.tried.len() as f64) < self.space.size()
            && since_better < PATIENCE
        {
            round += 1;
            let proposals = self.propose();
            let Some(point) = self.pick(proposals, round % EXPLORE_EVERY == 0) else {
                break;
            };
            match self.evaluate(&point) {
                Some(t) if t < best_s * 0.99 => {
                    best_s = t;
                    since_better = 0;
                }
                _ => since_better += 1,
            }
        }
        let (best, best_s) = self
            .measured
            .iter()
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .cloned()
            .unwrap_or((self.space.default_point(), default_s));
        Found {
            best,
            best_s,
            candidates: self.measured.len(),
            rejected: self.rejected,
        }
    }

    /// Untried points: mutations of the best few measured points (one or two axes moved to a
    /// neighbouring value or anywhere), with some fresh random points among them.
    fn propose(&mut self) -> Vec<Point> {
        let mut parents: Vec<&(Point, f64)> = self.measured.iter().collect();
        parents.sort_by(|a, b| a.1.total_cmp(&b.1));
        parents.truncate(4);
        let parents: Vec<Point> = parents.into_iter().map(|(p, _)| p.clone()).collect();
        let axes = self.space.axes.len();
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        for _ in 0..PROPOSALS * 4 {
            if out.len() == PROPOSALS || axes == 0 {
                break;
            }
            let mut p = if parents.is_empty() || self.rng.below(8) == 0 {
                self.space
                    .axes
                    .iter()
                    .map(|a| self.rng.below(a.values.len()))
                    .collect()
            } else {
                parents[self.rng.below(parents.len())].clone()
            };
            for _ in 0..1 + self.rng.below(2) {
                let a = self.rng.below(axes);
                let n = self.space.axes[a].values.len();
                p[a] = if self.rng.below(10) < 6 {
                    let step = if self.rng.below(2) == 0 { 1 } else { n - 1 };
                    (p[a] + step) % n
                } else {
                    self.rng.below(n)
                };
            }
            if !self.tried.contains(&p) && seen.insert(p.clone()) {
                out.push(p);
            }
        }
        out
    }

    /// The proposal to measure: the cost model's favourite, or a random one when exploring
    /// (or while too few points are measured to fit the model).
    fn pick(&mut self, proposals: Vec<Point>, explore: bool) -> Option<Point> {
        if proposals.is_empty() {
            return None;
        }
        if explore || self.measured.len() < 4 {
            let i = self.rng.below(proposals.len());
            return proposals.into_iter().nth(i);
        }
        let samples: Vec<(Vec<f64>, f64)> = self
            .measured
            .iter()
            .map(|(p, t)| (self.space.features(p), *t))
            .collect();
        let model = CostModel::fit(&samples);
        proposals.into_iter().min_by(|a, b| {
            let (pa, pb) = (
                model.predict(&self.space.features(a)),
                model.predict(&self.space.features(b)),
            );
            pa.total_cmp(&pb)
        })
    }
}
