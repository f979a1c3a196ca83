//! Graph-level tuning (AOE's subgraph tuning): for every distinct fused subgraph of a module —
//! an elementwise chain (`fused_elementwise`), a matmul with its bias and activation epilogue
//! (`fused_matmul`), a norm with its affine (`rms_norm_scale`, `layer_norm_affine`) — whether
//! it runs faster fused — one step — or unfused — each op of the pattern a step of its own on
//! its native kernel. Each variant
//! is built as a small module of its own (scheduled and memory-planned as `mslc build` would)
//! and run by the executor on this machine, staging and rounding to f16/bf16 included; its
//! result must match the reference kernel before its time counts, and unfused wins only when
//! it is faster in a fresh re-measurement of both. Decisions go into the knowledge base, keyed
//! by the fused op's signature and the device fingerprint; `mslc build` hands them to the
//! fusion pass.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use mslc_artifact::Module;
use mslc_core::ops::family::fused::{Activation, FusedMatmulOperands};
use mslc_core::ops::family::program::{ElementwiseProgram, Operand};
use mslc_core::ops::{resolve_attrs, Attrs, Op, TensorType};
use mslc_core::program::Init;
use mslc_exec::{ExecOptions, Executor};
use mslc_io::npy::NpyArray;
use mslc_ir::passes::{Fuse, Pass, PassContext};
use mslc_ir::{Graph, ValueRef};
use mslc_kernels::binding::choose_kernel;
use mslc_kernels::step::prepare::{cast_target, prepare};
use mslc_kernels::TensorRef;
use mslc_plan::kernels::{signature, SUBGRAPH_OPS};
use mslc_plan::memory::plan_memory;
use mslc_plan::schedule::schedule;
use mslc_plan::target::Target;

use crate::case::Rng;
use crate::kb::{KbError, KnowledgeBase, SubgraphRecord};
use crate::measure::{check_output, repeat, CONFIRM};
use crate::reference::reference_output;
use crate::tuner::{Observer, Options, Progress, Source};

/// A fused subgraph of a module: the fused op, the ops it stands for and its operand types.
#[derive(Clone, Debug)]
pub struct Subgraph {
    /// The fused op's signature, as the kernel table writes it.
    pub signature: String,
    /// The steps of the module with this signature.
    pub steps: Vec<usize>,
    op: Op,
    attrs: Attrs,
    inputs: Vec<TensorType>,
    /// Per operand, whether the module's executor packs it ahead (a weight:
    /// [`Module::packed_ahead`]): the variants take it as a parameter, packed once as in the
    /// module, not as an input each GEMM packs per call.
    weights: Vec<bool>,
    output: TensorType,
    parts: Vec<Part>,
}

/// One op of an unfused subgraph: its operands are the fused op's inputs or earlier parts'
/// results.
#[derive(Clone, Debug)]
struct Part {
    op: Op,
    attrs: Attrs,
    args: Vec<Operand>,
}

impl Part {
    fn new(op: Op, attrs: Attrs, args: &[Operand]) -> Part {
        Part {
            op,
            attrs,
            args: args.to_vec(),
        }
    }
}

/// The ops a fused step of `op` with `attrs` stands for, in order (the fusion pass's
/// patterns, read backwards); `None` for an op that is not a fused subgraph.
fn parts(op: Op, attrs: &Attrs) -> Option<Vec<Part>> {
    use Operand::{Input, Step};
    let eps = || {
        let mut a = Attrs::new();
        a.insert("eps", attrs.get("eps").cloned()?);
        Some(a)
    };
    let parts = match op {
        Op::FusedElementwise => {
            let program = ElementwiseProgram::parse(&attrs.str("program").ok()?).ok()?;
            program
                .steps
                .iter()
                .map(|s| Part::new(s.op, s.attrs(), &s.args))
                .collect()
        }
        Op::FusedMatmul => {
            let a = resolve_attrs(op, attrs).ok()?;
            let flags = Attrs::new()
                .with("transpose_a", a.bool("transpose_a").ok()?)
                .with("transpose_b", a.bool("transpose_b").ok()?);
            let mut parts = vec![Part::new(Op::Matmul, flags, &[Input(0), Input(1)])];
            let operands = FusedMatmulOperands::of(&a);
            if let Some(bias) = operands.bias_index() {
                parts.push(Part::new(Op::Add, Attrs::new(), &[Step(0), Input(bias)]));
            }
            if let Some(act) = Activation::of(&a).ok()?.op() {
                let last = Step(parts.len() - 1);
                parts.push(Part::new(act, Attrs::new(), &[last]));
            }
            if let Some(multiplier) = operands.multiplier_index() {
                let last = Step(parts.len() - 1);
                parts.push(Part::new(Op::Mul, Attrs::new(), &[last, Input(multiplier)]));
            }
            parts
        }
        Op::RmsNormScale => vec![
            Part::new(Op::RmsNorm, eps()?, &[Input(0)]),
            Part::new(Op::Mul, Attrs::new(), &[Step(0), Input(1)]),
        ],
        Op::LayerNormAffine => vec![
            Part::new(Op::LayerNorm, eps()?, &[Input(0)]),
            Part::new(Op::Mul, Attrs::new(), &[Step(0), Input(1)]),
            Part::new(Op::Add, Attrs::new(), &[Step(1), Input(2)]),
        ],
        _ => return None,
    };
    Some(parts)
}

/// How a subgraph runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Variant {
    /// One fused step.
    Fused,
    /// One step per op it stands for.
    Unfused,
}

impl Subgraph {
    /// Every distinct fused subgraph signature of `module`, in first-use order.
    pub fn of_module(module: &Module) -> Vec<Subgraph> {
        let mut found: Vec<Subgraph> = Vec::new();
        let packed_ahead = module.packed_ahead();
        for (i, step) in module.steps.iter().enumerate() {
            if !SUBGRAPH_OPS.contains(&step.op) {
                continue;
            }
            let sig = signature(module, i);
            if let Some(s) = found.iter_mut().find(|s| s.signature == sig) {
                s.steps.push(i);
                continue;
            }
            let ty = |v: &u32| module.values[*v as usize].ty.clone();
            let (Some(parts), Some(output)) =
                (parts(step.op, &step.attrs), step.outputs.first().map(ty))
            else {
                continue;
            };
            found.push(Subgraph {
                signature: sig,
                steps: vec![i],
                op: step.op,
                attrs: step.attrs.clone(),
                inputs: step.inputs.iter().map(ty).collect(),
                weights: step
                    .inputs
                    .iter()
                    .map(|&v| packed_ahead[v as usize])
                    .collect(),
                output,
                parts,
            });
        }
        found
    }

    /// The graph of one variant: the subgraph's operands `x0`, `x1`, … (as parameters where
    /// the module packs them ahead, else as inputs), its op(s) (unfused: as the fusion pass
    /// leaves them under an unfused decision), and its result as output `y`.
    pub fn graph(&self, variant: Variant) -> Result<Graph, String> {
        let mut g = Graph::new("subgraph");
        let xs: Vec<ValueRef> = self
            .inputs
            .iter()
            .zip(&self.weights)
            .enumerate()
            .map(|(i, (t, &weight))| {
                let name = operand_name(i);
                match weight {
                    true => g.add_param(&name, t.clone(), Init::Zeros, false),
                    false => g.add_input(&name, t.clone()),
                }
            })
            .collect();
        let added = |r: Result<Vec<ValueRef>, mslc_core::ops::OpError>| {
            r.map_err(|e| e.message)?
                .first()
                .copied()
                .ok_or_else(|| "the op has no result".to_string())
        };
        let out = match variant {
            Variant::Fused => added(g.add_op(self.op, self.attrs.clone(), &xs, ""))?,
            Variant::Unfused => {
                let mut results: Vec<ValueRef> = Vec::new();
                for step in &self.parts {
                    let args = step
                        .args
                        .iter()
                        .map(|a| match *a {
                            Operand::Input(n) => xs.get(n).copied(),
                            Operand::Step(n) => results.get(n).copied(),
                        })
                        .collect::<Option<Vec<_>>>()
                        .ok_or_else(|| "an op reads an operand the subgraph lacks".to_string())?;
                    results.push(added(g.add_op(step.op, step.attrs.clone(), &args, ""))?);
                }
                *results
                    .last()
                    .ok_or_else(|| "the subgraph is empty".to_string())?
            }
        };
        g.set_output("y", out);
        if variant == Variant::Unfused {
            // As a build with this decision compiles it: the pattern left unfused, what is
            // left of it fused by the other rules (a matmul's bias add and activation become
            // one elementwise step).
            let cx = PassContext {
                unfused: BTreeSet::from([self.signature.clone()]),
                ..PassContext::default()
            };
            Fuse.run(&mut g, &cx).map_err(|e| e.to_string())?;
        }
        Ok(g)
    }

    /// Seeded operand values, each already a value of its operand's dtype (the executor
    /// stores them unchanged, so the reference sees what the variants read); `None` when an
    /// operand is not a float.
    fn operands(&self) -> Option<Vec<Vec<f32>>> {
        let mut rng = Rng::new(
            self.signature
                .bytes()
                .fold(0x6A7E, |h, b| h.rotate_left(5) ^ u64::from(b)),
        );
        self.inputs
            .iter()
            .map(|t| {
                t.dtype.is_float().then(|| {
                    let round = cast_target(t.dtype);
                    (0..numel(t)).map(|_| round.apply(rng.uniform())).collect()
                })
            })
            .collect()
    }
}

/// Elements of `t`.
fn numel(t: &TensorType) -> usize {
    t.shape.iter().map(|&d| d.max(0) as usize).product()
}

/// Runs a prepared variant; tests wrap [`ExecRunner`] to plant a wrong variant.
pub trait VariantRunner: Sync {
    /// Runs `exec` (the variant's module, inputs set) once.
    fn run(&self, variant: Variant, exec: &mut Executor) -> Result<(), String>;
    /// The result `y` of the last run, as f32.
    fn output(&self, variant: Variant, exec: &Executor) -> Result<Vec<f32>, String>;
}

/// The executor, as `mslc run` runs a module.
pub struct ExecRunner;

impl VariantRunner for ExecRunner {
    fn run(&self, _: Variant, exec: &mut Executor) -> Result<(), String> {
        exec.run().map_err(|e| e.message)
    }

    fn output(&self, _: Variant, exec: &Executor) -> Result<Vec<f32>, String> {
        exec.output_f32("y")
            .map(|(_, values)| values)
            .ok_or_else(|| "the variant has no output `y`".to_string())
    }
}

/// One subgraph's result.
#[derive(Clone, Debug, Serialize)]
pub struct GraphOutcome {
    /// The fused op's signature.
    pub signature: String,
    /// Steps of the module with it.
    pub steps: usize,
    /// Ops it stands for (steps it becomes when unfused).
    pub ops: usize,
    /// The decision: fused (true) or unfused.
    pub fused: bool,
    /// Microseconds per call fused (0 when not measured).
    pub fused_us: f64,
    /// Microseconds per call unfused (0 when not measured or rejected).
    pub unfused_us: f64,
    /// Why the unfused variant may not win, when the guard or a failure discarded it.
    pub rejected: Option<String>,
    /// Where the result comes from.
    pub source: Source,
}

impl GraphOutcome {
    /// The chosen variant's speed-up over the fused default (1 when unmeasured).
    pub fn speedup(&self) -> f64 {
        let chosen = if self.fused {
            self.fused_us
        } else {
            self.unfused_us
        };
        if chosen > 0.0 && self.fused_us > 0.0 {
            self.fused_us / chosen
        } else {
            1.0
        }
    }
}

/// The host target the variants' small modules are scheduled for (only its name and
/// fingerprint matter to the schedule).
pub(crate) fn host() -> Target {
    Target {
        name: "cpu".to_string(),
        peak_f32: 1.0,
        peak_f16: 1.0,
        peak_bf16: 1.0,
        memory_bytes: u64::MAX,
        bandwidth: 1.0,
        interconnect: 1.0,
        network: 1.0,
        devices_per_node: 1,
        compute_efficiency: 1.0,
    }
}

/// The name of a variant's operand `i` ([`Subgraph::graph`]), as a parameter or an input.
fn operand_name(i: usize) -> String {
    format!("x{i}")
}

/// A variant ready to run: its executor with the operands set.
fn prepare_variant(
    sub: &Subgraph,
    variant: Variant,
    operands: &[Vec<f32>],
    threads: usize,
) -> Result<Executor, String> {
    let graph = sub.graph(variant)?;
    let mut module = schedule(&graph, &host()).ok_or("the subgraph has a cycle")?;
    plan_memory(&mut module, false).map_err(|e| e.to_string())?;
    let options = ExecOptions {
        threads,
        memory_limit: None,
    };
    let mut exec = Executor::new(module, &options).map_err(|e| e.message)?;
    let names: Vec<String> = (0..operands.len()).map(operand_name).collect();
    // The weights are the variant's parameters, the other operands its inputs.
    exec.init_params_with(|path, _, _, values| {
        let i =
            (names.iter().position(|n| n == path)).ok_or_else(|| format!("no operand `{path}`"))?;
        values.copy_from_slice(&operands[i]);
        Ok::<(), String>(())
    })?;
    for (i, (data, t)) in operands.iter().zip(&sub.inputs).enumerate() {
        if sub.weights[i] {
            continue;
        }
        let shape = t.shape.iter().map(|&d| d.max(0) as usize).collect();
        let array = NpyArray::from_f32(shape, data).map_err(|e| e.to_string())?;
        exec.set_input(&names[i], &array).map_err(|e| e.message)?;
    }
    Ok(exec)
}

/// The reference result of `sub` on `operands`: the reference kernel of its fused op.
fn reference(sub: &Subgraph, operands: &[Vec<f32>]) -> Result<Vec<f32>, String> {
    let op = sub.op;
    let kernel = prepare(op, &sub.attrs, &choose_kernel(op), &sub.inputs, &sub.output)?;
    let shapes: Vec<Vec<usize>> = sub
        .inputs
        .iter()
        .map(|t| t.shape.iter().map(|&d| d.max(0) as usize).collect())
        .collect();
    let views: Vec<TensorRef<'_>> = operands
        .iter()
        .zip(&shapes)
        .map(|(data, shape)| TensorRef { data, shape })
        .collect();
    reference_output(&kernel, op, &sub.attrs, &views, &[]).ok_or("no reference kernel")?
}

/// A variant's seconds per run after checking its result against `want`, which it may miss
/// by the `rounding` of the dtype it is held in ([`check_output`]).
fn checked_time(
    runner: &dyn VariantRunner,
    variant: Variant,
    exec: &mut Executor,
    (want, rounding): (&[f32], f64),
) -> Result<f64, String> {
    runner
        .run(variant, exec)
        .map_err(|e| format!("fails to run: {e}"))?;
    check_output(&runner.output(variant, exec)?, want, rounding)
        .map_err(|e| format!("wrong result: {e}"))?;
    repeat(|| runner.run(variant, exec))
}

/// Measures both variants of `sub` and decides; `Err` when the subgraph cannot be tuned.
fn decide(
    sub: &Subgraph,
    runner: &dyn VariantRunner,
    threads: usize,
) -> Result<GraphOutcome, String> {
    let operands = sub
        .operands()
        .ok_or("an operand is not a float (nothing to gain from unfusing it)")?;
    let want = reference(sub, &operands).map_err(|e| format!("the reference fails: {e}"))?;
    let want = (want.as_slice(), sub.output.dtype.unit_roundoff());
    let mut fused = prepare_variant(sub, Variant::Fused, &operands, threads)?;
    let fused_s = checked_time(runner, Variant::Fused, &mut fused, want)
        .map_err(|e| format!("the fused op {e}"))?;
    let mut outcome = GraphOutcome {
        signature: sub.signature.clone(),
        steps: sub.steps.len(),
        ops: sub.parts.len(),
        fused: true,
        fused_us: fused_s * 1e6,
        unfused_us: 0.0,
        rejected: None,
        source: Source::Measured,
    };
    let unfused = prepare_variant(sub, Variant::Unfused, &operands, threads).and_then(|mut u| {
        let t = checked_time(runner, Variant::Unfused, &mut u, want)?;
        Ok((u, t))
    });
    let (mut unfused, unfused_s) = match unfused {
        Ok(u) => u,
        Err(reason) => {
            outcome.rejected = Some(reason);
            return Ok(outcome);
        }
    };
    // Confirm with fresh measurements of both, alternated, the best of two each.
    let (mut f, mut u) = (fused_s, unfused_s);
    if unfused_s < fused_s {
        for _ in 0..2 {
            f = f.min(repeat(|| runner.run(Variant::Fused, &mut fused))?);
            u = u.min(repeat(|| runner.run(Variant::Unfused, &mut unfused))?);
        }
    }
    outcome.fused_us = f * 1e6;
    outcome.unfused_us = u * 1e6;
    outcome.fused = u >= f * CONFIRM;
    Ok(outcome)
}

/// Decides every subgraph of `subgraphs`, reusing and filling `kb` (saved to `db` after each
/// one, when given), within `options.budget`; `stop` ends the run early, keeping what was
/// decided.
pub fn tune_subgraphs(
    subgraphs: &[Subgraph],
    kb: &mut KnowledgeBase,
    db: Option<&Path>,
    options: &Options,
    runner: &dyn VariantRunner,
    stop: &AtomicBool,
    observer: &mut dyn Observer,
) -> Result<Vec<GraphOutcome>, KbError> {
    let start = Instant::now();
    let left = || options.budget.saturating_sub(start.elapsed());
    let mut outcomes = Vec::with_capacity(subgraphs.len());
    for (done, sub) in subgraphs.iter().enumerate() {
        observer.progress(&Progress {
            done,
            total: subgraphs.len(),
            current: &sub.signature,
            best_speedup: best(&outcomes),
            left: left(),
        });
        let unmeasured = |source: Source| GraphOutcome {
            signature: sub.signature.clone(),
            steps: sub.steps.len(),
            ops: sub.parts.len(),
            fused: true,
            fused_us: 0.0,
            unfused_us: 0.0,
            rejected: None,
            source,
        };
        if let Some(r) = kb.subgraph(&options.device, options.threads, &sub.signature) {
            outcomes.push(GraphOutcome {
                fused: r.fused,
                fused_us: r.fused_us,
                unfused_us: r.unfused_us,
                ..unmeasured(Source::KnowledgeBase)
            });
            continue;
        }
        if stop.load(Ordering::Relaxed) || left() == Duration::ZERO {
            let why = if stop.load(Ordering::Relaxed) {
                "interrupted before it was tuned"
            } else {
                "the budget ran out before it was tuned"
            };
            outcomes.push(unmeasured(Source::Skipped(why.to_string())));
            continue;
        }
        let outcome = match decide(sub, runner, options.threads) {
            Ok(o) => o,
            Err(why) => {
                outcomes.push(unmeasured(Source::Skipped(why)));
                continue;
            }
        };
        kb.insert_subgraph(SubgraphRecord {
            device: options.device.clone(),
            threads: options.threads,
            signature: outcome.signature.clone(),
            fused: outcome.fused,
            fused_us: outcome.fused_us,
            unfused_us: outcome.unfused_us,
        });
        if let Some(db) = db {
            kb.save(db)?;
        }
        outcomes.push(outcome);
    }
    Ok(outcomes)
}

/// The best speed-up among `outcomes`.
fn best(outcomes: &[GraphOutcome]) -> f64 {
    outcomes
        .iter()
        .map(GraphOutcome::speedup)
        .fold(1.0, f64::max)
}

/// The unfused decisions among `outcomes`, by signature, with the unfused time in
/// microseconds.
pub fn unfused(outcomes: &[GraphOutcome]) -> BTreeMap<String, f64> {
    outcomes
        .iter()
        .filter(|o| !o.fused)
        .map(|o| (o.signature.clone(), o.unfused_us))
        .collect()
}
