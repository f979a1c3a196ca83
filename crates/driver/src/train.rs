//! The training step as one compiled module: the train's model with its labels and loss,
//! the backward graph of the loss for every trainable parameter, the global gradient norm (and
//! `clip_grad_norm`'s scaling), and the optimizer's update — all in one graph, run through the
//! normal passes and planned in one arena.
//!
//! The module's interface, by name (docs/mir-format.md, "Training modules"):
//! - inputs: the model's inputs and the train's labels; the scalars [`LR`] (this update's
//!   learning rate, after the schedule) and, for Adam, [`STEP_SIZE`] (`lr / (1 − β1^t)`) and
//!   [`BC2_SQRT`] (`√(1 − β2^t)`), which the training loop computes in f64 each update; and one
//!   input per optimizer state, named `PATH.momentum_buffer` (SGD with momentum) or
//!   `PATH.exp_avg` and `PATH.exp_avg_sq` (Adam), as `torch.optim` names them;
//! - outputs: [`LOSS`], [`GRAD_NORM`] (the global 2-norm before clipping), with
//!   [`TrainOptions::expose_grads`] `grad.PATH` (the raw gradient), then the new value of every
//!   state input under the input's name and of every trained parameter under its path. The
//!   loop writes those back ([`write_backs`]) before the next step; weight decay, momentum and
//!   bias correction follow `torch.optim.SGD` (dampening 0), `Adam` and `AdamW` exactly.
//!
//! Gradient accumulation (`grad_accum` > 1) and loss scaling are not compiled yet: a train that
//! asks for them is refused with a coded error rather than trained differently.

use std::time::Instant;

use mslc_check::decls::Train;
use mslc_check::policy::{Optimizer, OptimizerKind};
use mslc_check::Checked;
use mslc_core::diag::{Code, Diagnostic};
use mslc_core::ops::{Attrs, DType, Op, TensorType};
use mslc_core::program::Model;
use mslc_ir::{Graph, NodeKind, ValueRef};

use crate::compile::{lower_verified, optimize_graph, CompileError, CompileOptions, Compiled};
use crate::recompute::{plan_training, MemoryRequest, RecomputeReport};
use crate::select::{compile_options, root_error, Selection};

/// Output: the loss of the step.
pub const LOSS: &str = "loss";
/// Output: the global 2-norm of the gradients, before clipping.
pub const GRAD_NORM: &str = "grad_norm";
/// Input: the learning rate of this update.
pub const LR: &str = "train.lr";
/// Input (Adam): `lr / (1 − β1^t)` for update `t` (from 1).
pub const STEP_SIZE: &str = "train.step_size";
/// Input (Adam): `√(1 − β2^t)` for update `t` (from 1).
pub const BC2_SQRT: &str = "train.bias_correction2_sqrt";
/// Prefix of the outputs holding raw gradients ([`TrainOptions::expose_grads`]).
pub const GRAD_PREFIX: &str = "grad.";

/// How to build a training module beyond the forward's options.
#[derive(Clone, Copy, Debug, Default)]
pub struct TrainOptions {
    /// Also output each parameter's raw gradient as `grad.PATH` (for `--dump-grads`).
    pub expose_grads: bool,
    /// The train's memory policy ([`MemoryRequest::of_train`]): what to recompute, and the
    /// budget the step must fit.
    pub memory: Option<MemoryRequest>,
}

/// One trained parameter and its optimizer states.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainedParam {
    /// The parameter's path.
    pub path: String,
    /// Its weight decay (0 when a `no_decay` pattern matches it).
    pub weight_decay: f64,
    /// Its state inputs' names, in the order of [`state_names`].
    pub states: Vec<String>,
}

/// A compiled training step and what the loop needs to drive it.
#[derive(Debug)]
pub struct CompiledTrain {
    /// The compiled module.
    pub compiled: Compiled,
    /// The optimizer.
    pub optimizer: Optimizer,
    /// Trained parameters, by path.
    pub params: Vec<TrainedParam>,
    /// What is recomputed, and the step's memory.
    pub recompute: RecomputeReport,
}

/// The optimizer-state names of parameter `path` (`torch.optim`'s state keys).
pub fn state_names(optimizer: &Optimizer, path: &str) -> Vec<String> {
    let keys: &[&str] = match optimizer.kind {
        OptimizerKind::Sgd if optimizer.momentum > 0.0 => &["momentum_buffer"],
        OptimizerKind::Sgd => &[],
        OptimizerKind::Adam | OptimizerKind::AdamW => &["exp_avg", "exp_avg_sq"],
    };
    keys.iter().map(|k| format!("{path}.{k}")).collect()
}

/// The values a training step writes back: (state input or parameter path, output name) —
/// the same name on both sides.
pub fn write_backs(params: &[TrainedParam]) -> impl Iterator<Item = &str> {
    params
        .iter()
        .flat_map(|p| p.states.iter().map(String::as_str).chain([p.path.as_str()]))
}

/// Why a train cannot be compiled: a problem of the train (coded diagnostic) or a compiler
/// failure after a clean check.
#[derive(Debug)]
pub enum TrainError {
    /// The train cannot be trained as written.
    Train(Box<Diagnostic>),
    /// A stage failed.
    Compile(CompileError),
}

impl From<CompileError> for TrainError {
    fn from(e: CompileError) -> Self {
        TrainError::Compile(e)
    }
}

/// The train to run: the one called `entry`, else the file's only `train` declaration.
pub fn choose_train<'a>(
    checked: &'a Checked,
    entry: Option<&str>,
) -> Result<&'a Train, Box<Diagnostic>> {
    let trains = &checked.decls.trains;
    let names: Vec<&str> = trains.iter().map(|t| t.spec.name.name.as_str()).collect();
    let found = match (entry, trains.as_slice()) {
        (Some(e), _) => trains.iter().find(|t| t.spec.name.name == e),
        (None, [only]) => Some(only),
        (None, _) => None,
    };
    found.ok_or_else(|| {
        let (message, help) = match (entry, names.is_empty()) {
            (_, true) => (
                "this file declares no `train`".to_string(),
                "declare one with `train Name for Model { … }`".to_string(),
            ),
            (Some(e), false) => (
                format!("--entry {e}: no train `{e}` in this file"),
                format!("trains here: {}", names.join(", ")),
            ),
            (None, false) => (
                "this file declares several trains".to_string(),
                format!("choose one with --entry: {}", names.join(", ")),
            ),
        };
        root_error(checked, Code::E0611, message, help)
    })
}

/// How to compile the training step of `model` (the train's model, labels and loss included):
/// the target and fusion as for any model ([`compile_options`]), in f32 — mixed-precision
/// training is not built yet, so a `--precision` other than `f32` is refused (E0609).
pub fn train_compile_options(
    checked: &Checked,
    model: &Model,
    selection: Selection,
) -> Result<CompileOptions, Box<Diagnostic>> {
    if let Some(p) = selection.precision.filter(|&p| p != "f32") {
        return Err(root_error(
            checked,
            Code::E0609,
            format!("--precision {p}: a training step compiles in f32 for now"),
            "mixed-precision training is not built yet; leave out --precision".to_string(),
        ));
    }
    let f32_only = Selection {
        precision: Some("f32"),
        ..selection
    };
    compile_options(checked, model, f32_only)
}

/// Compiles `train`'s training step.
pub fn compile_train(
    train: &Train,
    options: &CompileOptions,
    train_options: TrainOptions,
) -> Result<CompiledTrain, TrainError> {
    let spec = &train.spec;
    let refuse = |code: Code, message: String, help: &str| {
        TrainError::Train(Box::new(
            Diagnostic::error(code, spec.file, spec.name.span, message)
                .with_label("this train")
                .with_help(help),
        ))
    };
    let (Some(model), Some(optimizer)) = (train.graph.as_ref(), spec.optimizer) else {
        return Err(refuse(
            Code::E0608,
            format!(
                "train `{}` has no checked loss or optimizer",
                spec.name.name
            ),
            "fix the errors `mslc check` reports first",
        ));
    };
    if spec.grad_accum > 1 {
        return Err(refuse(
            Code::E0521,
            format!(
                "train `{}` accumulates {} micro-steps, which mslc cannot compile yet",
                spec.name.name, spec.grad_accum
            ),
            "use `grad_accum = 1` and a batch of the accumulated size",
        ));
    }
    let t = Instant::now();
    let mut graph = lower_verified(model, options)?;
    let loss = graph
        .outputs
        .iter()
        .find(|(name, _)| name == LOSS)
        .map(|(_, v)| *v)
        .ok_or_else(|| CompileError {
            stage: "lower",
            message: "the training graph has no `loss` output".to_string(),
        })?;
    graph.outputs.clear();
    let mut params: Vec<(String, ValueRef)> = graph
        .node_ids()
        .into_iter()
        .filter_map(|id| match &graph.node(id).kind {
            NodeKind::Param {
                path,
                trainable: true,
                ..
            } => Some((path.clone(), ValueRef { node: id, index: 0 })),
            _ => None,
        })
        .collect();
    params.sort();
    if params.is_empty() {
        return Err(refuse(
            Code::E0520,
            format!("train `{}` has no trainable parameter", spec.name.name),
            "declare the weights with `param` (a `buffer` is not trained)",
        ));
    }
    let wrt: Vec<ValueRef> = params.iter().map(|(_, v)| *v).collect();
    let grads = mslc_ir::autodiff::backward(&mut graph, loss, &wrt).map_err(|e| {
        refuse(
            Code::E0521,
            format!("cannot differentiate train `{}`: {e}", spec.name.name),
            "every trainable parameter needs a differentiable path to the loss",
        )
    })?;
    let mut b = Builder { g: &mut graph };
    let built = b.update(spec, &optimizer, &params, &grads, train_options, loss);
    let trained = built.map_err(|message| CompileError {
        stage: "train",
        message,
    })?;
    // Lowering, the backward and the update count as the lowering stage.
    let lower_ms = t.elapsed().as_secs_f64() * 1e3;
    let (passes, ops_before, passes_ms) = optimize_graph(&mut graph, options)?;
    let is_state = |name: &str| trained.iter().any(|p| p.states.iter().any(|s| s == name));
    let (mut compiled, recompute) = plan_training(
        &graph,
        options,
        &passes,
        LOSS,
        &is_state,
        train_options.memory,
    )?;
    compiled.ops_before = ops_before;
    compiled.times.lower_ms = lower_ms;
    compiled.times.passes_ms = passes_ms;
    Ok(CompiledTrain {
        compiled,
        optimizer,
        params: trained,
        recompute,
    })
}

/// Adds the norm, clipping and optimizer ops to a graph.
struct Builder<'g> {
    g: &'g mut Graph,
}

type Built<T> = Result<T, String>;

impl Builder<'_> {
    fn op(&mut self, op: Op, attrs: Attrs, inputs: &[ValueRef]) -> Built<ValueRef> {
        let outs = self
            .g
            .add_op(op, attrs, inputs, "train")
            .map_err(|e| format!("{op}: {}", e.message))?;
        Ok(outs[0])
    }

    fn bin(&mut self, op: Op, a: ValueRef, b: ValueRef) -> Built<ValueRef> {
        self.op(op, Attrs::new(), &[a, b])
    }

    fn scalar(&mut self, x: f64) -> Built<ValueRef> {
        let attrs = Attrs::new().with("value", x).with("dtype", DType::F32);
        self.op(Op::Constant, attrs, &[])
    }

    /// `x * k` for a compile-time `k`.
    fn scale(&mut self, x: ValueRef, k: f64) -> Built<ValueRef> {
        let k = self.scalar(k)?;
        self.bin(Op::Mul, x, k)
    }

    /// `a * x + b * y` for compile-time `a`, `b`.
    fn lerp(&mut self, a: f64, x: ValueRef, b: f64, y: ValueRef) -> Built<ValueRef> {
        let (ax, by) = (self.scale(x, a)?, self.scale(y, b)?);
        self.bin(Op::Add, ax, by)
    }

    fn update(
        &mut self,
        spec: &mslc_check::policy::TrainSpec,
        opt: &Optimizer,
        params: &[(String, ValueRef)],
        grads: &[ValueRef],
        options: TrainOptions,
        loss: ValueRef,
    ) -> Built<Vec<TrainedParam>> {
        self.g.set_output(LOSS, loss);
        let scalar = TensorType::new(DType::F32, vec![]);
        // Global 2-norm: √(Σ Σ g²), as clip_grad_norm_ computes it, summed in the order the
        // backward produces the gradients (the reverse of the parameters' first use): the
        // schedule computes values as their consumers need them, so each layer's weight
        // gradients then run right after its backward instead of after the whole backward,
        // with every layer's activation gradients (and recomputed activations) kept until then.
        let mut order: Vec<usize> = (0..grads.len()).collect();
        order.sort_by_key(|&i| {
            let first_use = self
                .g
                .consumers(params[i].1.node)
                .first()
                .map(|n| n.index());
            std::cmp::Reverse(first_use)
        });
        let mut total: Option<ValueRef> = None;
        for g in order.iter().map(|&i| grads[i]) {
            let sq = self.bin(Op::Mul, g, g)?;
            let s = self.op(Op::Sum, Attrs::new(), &[sq])?;
            total = Some(match total {
                Some(t) => self.bin(Op::Add, t, s)?,
                None => s,
            });
        }
        let total = total.ok_or("no gradients")?;
        let norm = self.op(Op::Sqrt, Attrs::new(), &[total])?;
        self.g.set_output(GRAD_NORM, norm);
        if options.expose_grads {
            for ((path, _), &g) in params.iter().zip(grads) {
                self.g.set_output(&format!("{GRAD_PREFIX}{path}"), g);
            }
        }
        // clip_grad_norm_: scale by min(max_norm / (norm + 1e-6), 1).
        let coef = match spec.clip_grad_norm {
            Some(max_norm) => {
                let eps = self.scalar(1e-6)?;
                let denom = self.bin(Op::Add, norm, eps)?;
                let max = self.scalar(max_norm)?;
                let ratio = self.bin(Op::Div, max, denom)?;
                let one = self.scalar(1.0)?;
                Some(self.bin(Op::Minimum, ratio, one)?)
            }
            None => None,
        };
        let lr = self.g.add_input(LR, scalar.clone());
        let adam = match opt.kind {
            OptimizerKind::Sgd => None,
            OptimizerKind::Adam | OptimizerKind::AdamW => Some((
                self.g.add_input(STEP_SIZE, scalar.clone()),
                self.g.add_input(BC2_SQRT, scalar.clone()),
            )),
        };
        let mut trained = Vec::new();
        for ((path, p), &g) in params.iter().zip(grads) {
            let g = match coef {
                Some(c) => self.bin(Op::Mul, g, c)?,
                None => g,
            };
            let excluded = spec.no_decay.iter().any(|(pat, _)| pat.matches(path));
            let wd = if excluded { 0.0 } else { opt.weight_decay };
            let states = state_names(opt, path);
            let ty = self.g.ty(*p).clone();
            let state_in: Vec<ValueRef> = states
                .iter()
                .map(|s| self.g.add_input(s, ty.clone()))
                .collect();
            let (new_p, new_states) = match adam {
                None => self.sgd(opt, *p, g, wd, lr, &state_in)?,
                Some((step_size, bc2)) => {
                    self.adam(opt, *p, g, wd, lr, step_size, bc2, &state_in)?
                }
            };
            for (name, v) in states.iter().zip(new_states) {
                self.g.set_output(name, v);
            }
            self.g.set_output(path, new_p);
            trained.push(TrainedParam {
                path: path.clone(),
                weight_decay: wd,
                states,
            });
        }
        Ok(trained)
    }

    /// `torch.optim.SGD` (dampening 0): returns the new parameter and momentum buffer.
    fn sgd(
        &mut self,
        opt: &Optimizer,
        p: ValueRef,
        g: ValueRef,
        wd: f64,
        lr: ValueRef,
        state: &[ValueRef],
    ) -> Built<(ValueRef, Vec<ValueRef>)> {
        let g = if wd > 0.0 {
            self.lerp(1.0, g, wd, p)?
        } else {
            g
        };
        let (d, states) = match state {
            [buf] => {
                let new_buf = self.lerp(opt.momentum, *buf, 1.0, g)?;
                let d = if opt.nesterov {
                    self.lerp(1.0, g, opt.momentum, new_buf)?
                } else {
                    new_buf
                };
                (d, vec![new_buf])
            }
            _ => (g, Vec::new()),
        };
        let step = self.bin(Op::Mul, d, lr)?;
        Ok((self.bin(Op::Sub, p, step)?, states))
    }

    /// `torch.optim.Adam` (L2 decay in the gradient) or `AdamW` (decoupled decay): returns the
    /// new parameter and first and second moments.
    #[allow(clippy::too_many_arguments)]
    fn adam(
        &mut self,
        opt: &Optimizer,
        p: ValueRef,
        g: ValueRef,
        wd: f64,
        lr: ValueRef,
        step_size: ValueRef,
        bc2_sqrt: ValueRef,
        state: &[ValueRef],
    ) -> Built<(ValueRef, Vec<ValueRef>)> {
        let [m, v] = state else {
            return Err("Adam needs two moments".to_string());
        };
        let decoupled = opt.kind == OptimizerKind::AdamW;
        let g = if wd > 0.0 && !decoupled {
            self.lerp(1.0, g, wd, p)?
        } else {
            g
        };
        let p = if wd > 0.0 && decoupled {
            // p ← p − lr·wd·p
            let lr_wd = self.scale(lr, wd)?;
            let decay = self.bin(Op::Mul, p, lr_wd)?;
            self.bin(Op::Sub, p, decay)?
        } else {
            p
        };
        let (b1, b2) = opt.betas;
        let new_m = self.lerp(b1, *m, 1.0 - b1, g)?;
        let g2 = self.bin(Op::Mul, g, g)?;
        let new_v = self.lerp(b2, *v, 1.0 - b2, g2)?;
        let root = self.op(Op::Sqrt, Attrs::new(), &[new_v])?;
        let unbiased = self.bin(Op::Div, root, bc2_sqrt)?;
        let eps = self.scalar(opt.eps)?;
        let denom = self.bin(Op::Add, unbiased, eps)?;
        let ratio = self.bin(Op::Div, new_m, denom)?;
        let step = self.bin(Op::Mul, ratio, step_size)?;
        Ok((self.bin(Op::Sub, p, step)?, vec![new_m, new_v]))
    }
}
