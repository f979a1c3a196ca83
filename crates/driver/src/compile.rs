//! The build pipeline after checking: lower a model to the graph IR, optimize it, schedule it,
//! plan its memory and estimate its cost. Each stage is timed for the report.

use std::collections::BTreeSet;
use std::time::Instant;

use serde::Serialize;

use mslc_artifact::validate::check_tensor_sizes;
use mslc_artifact::Module;
use mslc_check::{Checked, Model};
use mslc_core::diag::{Code, Diagnostic};
use mslc_ir::passes::{default_pipeline, AmpConfig, PassContext, PipelineReport};
use mslc_ir::Graph;
use mslc_plan::cost::{estimate, CostEstimate};
use mslc_plan::memory::{plan_memory, MemoryPlan};
use mslc_plan::schedule::{guard_updates, schedule};
use mslc_plan::target::Target;

use crate::select::root_error;

/// How to compile.
#[derive(Clone, Debug)]
pub struct CompileOptions {
    /// The target to plan for.
    pub target: Target,
    /// Run the IR verifier after lowering and after every pass.
    pub verify: bool,
    /// Let the fusion pass rewrite.
    pub fuse: bool,
    /// Mixed precision to apply, from the model's precision policy.
    pub amp: Option<AmpConfig>,
    /// Signatures of fused subgraphs the fusion pass leaves unfused (tuning
    /// decisions from the kernel table or the knowledge base).
    pub unfused: BTreeSet<String>,
    /// Where a training step computes its updated parameters, optimizer states and gradient
    /// sums.
    pub updates: UpdatePlacement,
}

/// Where a training step computes the next values of its inputs and parameters (its updated
/// parameters, optimizer states, gradient sums and running statistics).
#[derive(Clone, Debug, Default, PartialEq)]
pub enum UpdatePlacement {
    /// Each in a buffer of its own (`Storage::Next`), which the caller may keep or drop.
    #[default]
    Beside,
    /// Over the values they replace where they can (`Storage::Overwrite`, as `torch.optim`
    /// updates in place): for a loop that keeps every run's next values.
    InPlace,
    /// In place, behind a guard ([`mslc_artifact::Guard`]): a run whose output `flag` is not 0
    /// ends before the steps that compute the outputs `updates` names (a step the loss scaling
    /// skips), which the schedule computes after every other output.
    InPlaceUnless {
        /// The output that skips the update (the overflow check).
        flag: String,
        /// The outputs the update computes (updated parameters and optimizer states).
        updates: BTreeSet<String>,
    },
}

impl CompileOptions {
    /// What the IR passes see of these options.
    pub fn pass_context(&self) -> PassContext {
        PassContext {
            verify: self.verify,
            fuse: self.fuse,
            training: false,
            amp: self.amp.clone(),
            unfused: self.unfused.clone(),
        }
    }
}

/// Milliseconds spent per stage.
#[derive(Clone, Debug, Default, Serialize)]
pub struct StageTimes {
    /// Lowering to the IR.
    pub lower_ms: f64,
    /// Optimization passes.
    pub passes_ms: f64,
    /// Scheduling and kernel choice.
    pub schedule_ms: f64,
    /// Memory planning.
    pub memory_ms: f64,
}

/// Everything a build produces in memory.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// The optimized graph.
    pub graph: Graph,
    /// The scheduled, memory-planned module.
    pub module: Module,
    /// The memory plan.
    pub memory: MemoryPlan,
    /// The cost estimate on the target.
    pub cost: CostEstimate,
    /// Op count after lowering, before the passes.
    pub ops_before: usize,
    /// What the passes did.
    pub passes: PipelineReport,
    /// Stage timings.
    pub times: StageTimes,
}

/// The [`CompileError::stage`] of a tensor too large to plan (more elements than
/// [`mslc_artifact::validate::MAX_TENSOR_ELEMENTS`]): a problem of the input, not a bug.
pub const STAGE_SIZE: &str = "size";

/// Why compilation failed after a clean check: a compiler bug, an impossible plan, or a tensor
/// too large ([`STAGE_SIZE`]).
#[derive(Clone, Debug, PartialEq)]
pub struct CompileError {
    /// The stage that failed.
    pub stage: &'static str,
    /// What went wrong.
    pub message: String,
}

impl CompileError {
    /// The error as a diagnostic on the root file of `checked`: after a clean check, a failure
    /// here is a bug in mslc.
    pub fn diagnostic(&self, checked: &Checked) -> Box<Diagnostic> {
        if self.stage == STAGE_SIZE {
            return root_error(
                checked,
                Code::E0606,
                format!("cannot build: {}", self.message),
                "check the dims and --set/--dim overrides that size it".to_string(),
            );
        }
        root_error(
            checked,
            Code::E0608,
            format!("internal compiler error in {self}"),
            "this is a bug in mslc; please report it with the file".to_string(),
        )
    }
}

impl std::fmt::Display for CompileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.stage, self.message)
    }
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

/// Compiles a checked model.
pub fn compile(model: &Model, options: &CompileOptions) -> Result<Compiled, CompileError> {
    let t = Instant::now();
    let graph = lower_verified(model, options)?;
    let lower_ms = ms(t);
    let mut compiled = compile_graph(graph, options)?;
    compiled.times.lower_ms = lower_ms;
    Ok(compiled)
}

/// Lowers a checked model to the graph IR, verified when `options` ask.
pub fn lower_verified(model: &Model, options: &CompileOptions) -> Result<Graph, CompileError> {
    let graph = mslc_ir::lower(model).map_err(|e| CompileError {
        stage: "lower",
        message: e.message,
    })?;
    if options.verify {
        mslc_ir::verify(&graph).map_err(|e| CompileError {
            stage: "lower",
            message: e.0,
        })?;
    }
    Ok(graph)
}

/// Compiles an explicit graph IR (one built or extended in memory, such as a forward graph
/// with its backward from `mslc_ir::backward`): the passes, the schedule and the memory plan
/// of [`compile`] after lowering.
pub fn compile_graph(mut graph: Graph, options: &CompileOptions) -> Result<Compiled, CompileError> {
    let (passes, ops_before, passes_ms) = optimize_graph(&mut graph, options)?;
    let mut compiled = plan_graph(graph, options, passes)?;
    compiled.ops_before = ops_before;
    compiled.times.passes_ms = passes_ms;
    Ok(compiled)
}

/// The passes of [`compile_graph`] alone: what they did, the op count before them, and the
/// milliseconds they took.
pub fn optimize_graph(
    graph: &mut Graph,
    options: &CompileOptions,
) -> Result<(PipelineReport, usize, f64), CompileError> {
    let ops_before = graph.op_count();
    let t = Instant::now();
    let cx = options.pass_context();
    let passes = default_pipeline(&cx)
        .run(graph, &cx)
        .map_err(|e| CompileError {
            stage: "passes",
            message: e.to_string(),
        })?;
    Ok((passes, ops_before, ms(t)))
}

/// The schedule, memory plan and cost estimate of an optimized graph (the rest of
/// [`compile_graph`]); `ops_before` and the passes' time are left for the caller to fill in.
pub fn plan_graph(
    mut graph: Graph,
    options: &CompileOptions,
    passes: PipelineReport,
) -> Result<Compiled, CompileError> {
    let mut times = StageTimes::default();
    let t = Instant::now();
    if let UpdatePlacement::InPlaceUnless { updates, .. } = &options.updates {
        // Every other output first, so the schedule computes the update last.
        graph
            .outputs
            .sort_by_key(|(name, _)| updates.contains(name));
    }
    let mut module = schedule(&graph, &options.target).ok_or_else(|| CompileError {
        stage: "schedule",
        message: "the graph has a cycle".to_string(),
    })?;
    if let UpdatePlacement::InPlaceUnless { flag, updates } = &options.updates {
        let guard = guard_updates(&module, flag, |name| updates.contains(name));
        module.guard = Some(guard.map_err(|message| CompileError {
            stage: "schedule",
            message,
        })?);
    }
    check_tensor_sizes(&module).map_err(|message| CompileError {
        stage: STAGE_SIZE,
        message,
    })?;
    times.schedule_ms = ms(t);
    let t = Instant::now();
    let in_place = options.updates != UpdatePlacement::Beside;
    let memory = plan_memory(&mut module, in_place).map_err(|e| CompileError {
        stage: "memory",
        message: e.to_string(),
    })?;
    times.memory_ms = ms(t);
    let cost = estimate(&module, &options.target);
    Ok(Compiled {
        graph,
        module,
        memory,
        cost,
        ops_before: 0,
        passes,
        times,
    })
}
