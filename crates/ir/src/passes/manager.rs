//! The pass manager: runs a pipeline of passes and fixpoint groups over a graph, timing each
//! run, verifying the IR after it when asked, and gathering a report.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Instant;

use serde::Serialize;

use super::{Pass, PassContext, PassError, PassStats};
use crate::Graph;

/// One step of a pipeline.
enum Stage {
    /// Run a pass once.
    Once(Box<dyn Pass>),
    /// Run the passes in order, again and again, until a whole round changes nothing or
    /// `cap` rounds have run.
    Fixpoint {
        passes: Vec<Box<dyn Pass>>,
        cap: usize,
    },
}

/// An ordered pipeline of passes.
#[derive(Default)]
pub struct PassManager {
    stages: Vec<Stage>,
}

/// One run of one pass: its name, wall time and number of rewrites.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PassTiming {
    /// The pass.
    pub name: String,
    /// Wall time of the run (verification excluded), in microseconds.
    pub micros: u64,
    /// Rewrites it made.
    pub rewrites: usize,
}

/// What a pipeline did to a graph: op counts before and after, every pass run in order, and
/// the rewrites of the whole pipeline by label (fusions under `fuse.*`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PipelineReport {
    /// Op nodes before the pipeline.
    pub ops_before: usize,
    /// Op nodes after it.
    pub ops_after: usize,
    /// Each pass run, in order (a fixpoint group contributes one entry per pass per round).
    pub passes: Vec<PassTiming>,
    /// Total rewrites per label.
    pub rewrites_by_label: BTreeMap<String, usize>,
}

impl PipelineReport {
    /// Adds the runs of an `earlier` pipeline over the same graph in front of these, as if one
    /// pipeline had made both.
    pub fn prepend(&mut self, earlier: PipelineReport) {
        self.ops_before = earlier.ops_before;
        let mut passes = earlier.passes;
        passes.append(&mut self.passes);
        self.passes = passes;
        for (label, n) in earlier.rewrites_by_label {
            *self.rewrites_by_label.entry(label).or_default() += n;
        }
    }

    /// Total wall time of the passes, in microseconds.
    pub fn total_micros(&self) -> u64 {
        self.passes.iter().map(|p| p.micros).sum()
    }
}

impl fmt::Display for PipelineReport {
    /// A short human-readable summary: op counts, passes, rewrites by label.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "ops: {} -> {} in {} us",
            self.ops_before,
            self.ops_after,
            self.total_micros()
        )?;
        for p in &self.passes {
            writeln!(
                f,
                "  {:<14} {:>8} us  {:>6} rewrites",
                p.name, p.micros, p.rewrites
            )?;
        }
        for (label, n) in &self.rewrites_by_label {
            writeln!(f, "  {label:<32} {n:>6}")?;
        }
        Ok(())
    }
}

impl PassManager {
    /// An empty pipeline.
    pub fn new() -> PassManager {
        PassManager::default()
    }

    /// Appends a pass run once.
    pub fn then(mut self, pass: Box<dyn Pass>) -> PassManager {
        self.stages.push(Stage::Once(pass));
        self
    }

    /// Appends a group run round after round until no pass in a round changes anything, at
    /// most `cap` rounds (at least one).
    pub fn fixpoint(mut self, passes: Vec<Box<dyn Pass>>, cap: usize) -> PassManager {
        self.stages.push(Stage::Fixpoint {
            passes,
            cap: cap.max(1),
        });
        self
    }

    /// The names of the stages, a fixpoint group as `(a, b)*`: how `mslc` shows the pipeline.
    pub fn describe(&self) -> String {
        let names: Vec<String> = self
            .stages
            .iter()
            .map(|s| match s {
                Stage::Once(p) => p.name().to_string(),
                Stage::Fixpoint { passes, .. } => {
                    let inner: Vec<&str> = passes.iter().map(|p| p.name()).collect();
                    format!("({})*", inner.join(", "))
                }
            })
            .collect();
        names.join(" -> ")
    }

    /// Runs the pipeline over `g`. Stops at the first failing pass (or the first pass after
    /// which the IR no longer verifies, when `cx.verify`); the error names it.
    pub fn run(&self, g: &mut Graph, cx: &PassContext) -> Result<PipelineReport, PassError> {
        let mut report = PipelineReport {
            ops_before: g.op_count(),
            ..PipelineReport::default()
        };
        for stage in &self.stages {
            match stage {
                Stage::Once(pass) => {
                    run_one(pass.as_ref(), g, cx, &mut report)?;
                }
                Stage::Fixpoint { passes, cap } => {
                    for _ in 0..*cap {
                        let mut changed = false;
                        for pass in passes {
                            changed |= !run_one(pass.as_ref(), g, cx, &mut report)?.is_empty();
                        }
                        if !changed {
                            break;
                        }
                    }
                }
            }
        }
        report.ops_after = g.op_count();
        Ok(report)
    }
}

/// Runs one pass, records it in `report` and verifies the result when `cx.verify`.
fn run_one(
    pass: &dyn Pass,
    g: &mut Graph,
    cx: &PassContext,
    report: &mut PipelineReport,
) -> Result<PassStats, PassError> {
    let start = Instant::now();
    let stats = pass.run(g, cx).map_err(|mut e| {
        if e.pass.is_empty() {
            e.pass = pass.name().to_string();
        }
        e
    })?;
    let micros = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
    if cx.verify {
        crate::verify(g).map_err(|e| {
            PassError::new(
                pass.name(),
                format!("the IR does not verify after this pass: {e}"),
            )
        })?;
    }
    report.passes.push(PassTiming {
        name: pass.name().to_string(),
        micros,
        rewrites: stats.total(),
    });
    for (label, n) in &stats.rewrites {
        *report.rewrites_by_label.entry(label.clone()).or_default() += n;
    }
    Ok(stats)
}
