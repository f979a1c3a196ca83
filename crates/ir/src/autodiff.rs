//! Reverse-mode automatic differentiation: [`backward`] adds to a graph the ops computing the
//! gradient of a scalar loss with respect to chosen values, by calling each op's gradient
//! rule (the registry's `grad` slot) in reverse topological order.
//!
//! The backward ops read forward values as ordinary graph values, so the planner sees every
//! activation the backward keeps alive. Each backward node's origin is its forward node's
//! origin followed by [`GRAD_MARK`] (`model.layers.3.mlp.down_proj#grad`), which the IR dumps
//! show and diagnostics use to say "backward of ...".

use std::collections::{HashMap, HashSet};
use std::fmt;

use mslc_core::diag::Code;
use mslc_core::ops::{Attrs, Emitter, GradCall, Handle, Op, OpError, TensorType};

use super::graph::{Graph, NodeId, NodeKind, ValueRef};

/// The suffix of a backward node's origin: the forward node's origin, then this mark.
pub const GRAD_MARK: &str = "#grad";

/// Why the gradient cannot be built.
#[derive(Clone, Debug, PartialEq)]
pub enum AutodiffError {
    /// The loss is not a single float value.
    LossNotScalar {
        /// The loss's type.
        ty: TensorType,
    },
    /// An op between a `wrt` value and the loss has no gradient rule.
    NoRule {
        /// The op.
        op: Op,
        /// Its node's instance path (empty at top level).
        origin: String,
    },
    /// A `wrt` value is not an input of anything the loss depends on.
    Unreachable {
        /// The value, described (`param "fc.w"`).
        wrt: String,
    },
    /// A `wrt` value reaches the loss only through ops that pass no gradient back to it (an
    /// integer cast, `sign`), or is not a float itself.
    NotDifferentiable {
        /// The value, described.
        wrt: String,
        /// The op that stops the gradient, when one does (none: the value is not a float).
        op: Option<Op>,
        /// That op's instance path.
        origin: String,
    },
    /// A gradient rule failed to build its ops (a bug in the rule, reported with the op).
    Rule {
        /// The op.
        op: Op,
        /// Its node's instance path.
        origin: String,
        /// What went wrong.
        message: String,
    },
}

/// ` (in model.mlp)` or nothing for a top-level node.
fn at(origin: &str) -> String {
    if origin.is_empty() {
        String::new()
    } else {
        format!(" (in {origin})")
    }
}

impl fmt::Display for AutodiffError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AutodiffError::LossNotScalar { ty } => {
                write!(f, "the loss must be a float scalar, but it is {ty}")
            }
            AutodiffError::NoRule { op, origin } => {
                write!(f, "`{op}`{} has no gradient rule", at(origin))
            }
            AutodiffError::Unreachable { wrt } => {
                write!(f, "{wrt} does not reach the loss")
            }
            AutodiffError::NotDifferentiable {
                wrt,
                op: Some(op),
                origin,
            } => write!(
                f,
                "{wrt} reaches the loss only through `{op}`{}, which passes no gradient back",
                at(origin)
            ),
            AutodiffError::NotDifferentiable { wrt, op: None, .. } => {
                write!(f, "{wrt} is not a float value, so it has no gradient")
            }
            AutodiffError::Rule {
                op,
                origin,
                message,
            } => write!(
                f,
                "the gradient rule of `{op}`{} failed: {message}",
                at(origin)
            ),
        }
    }
}

impl std::error::Error for AutodiffError {}

impl AutodiffError {
    /// The diagnostic code the driver reports the error with (a failing rule is a bug in
    /// mslc: E0608).
    pub fn code(&self) -> Code {
        match self {
            AutodiffError::NoRule { .. } => Code::E0800,
            AutodiffError::Unreachable { .. } => Code::E0801,
            AutodiffError::NotDifferentiable { .. } => Code::E0802,
            AutodiffError::LossNotScalar { .. } => Code::E0803,
            AutodiffError::Rule { .. } => Code::E0608,
        }
    }
}

/// The handle a gradient rule sees for `v`: node index and output index packed in one word.
pub fn handle(v: ValueRef) -> Handle {
    Handle(((v.node.index()) << 32) | v.index as usize)
}

/// The value behind a handle made by [`handle`].
pub fn value(h: Handle) -> ValueRef {
    ValueRef {
        node: NodeId::new(h.0 >> 32),
        index: (h.0 & 0xffff_ffff) as u32,
    }
}

/// The [`Emitter`] over a graph: rules add ops to `graph`, each with origin `origin`, and
/// every node it adds is remembered (so [`backward`] can drop the ones nothing uses).
pub struct GraphEmitter<'g> {
    /// The graph being extended.
    pub graph: &'g mut Graph,
    /// The origin given to every node emitted.
    pub origin: String,
    /// The nodes emitted so far, in order.
    pub emitted: Vec<NodeId>,
}

impl<'g> GraphEmitter<'g> {
    /// An emitter adding nodes with origin `origin` to `graph`.
    pub fn new(graph: &'g mut Graph, origin: impl Into<String>) -> GraphEmitter<'g> {
        GraphEmitter {
            graph,
            origin: origin.into(),
            emitted: Vec::new(),
        }
    }
}

impl Emitter for GraphEmitter<'_> {
    fn ty(&self, h: Handle) -> Result<TensorType, OpError> {
        let v = value(h);
        if !self.graph.contains(v.node) || v.index as usize >= self.graph.node(v.node).outputs.len()
        {
            return Err(OpError::new(format!("unknown value handle {}", h.0)));
        }
        Ok(self.graph.ty(v).clone())
    }

    fn emit(&mut self, op: Op, attrs: Attrs, inputs: &[Handle]) -> Result<Vec<Handle>, OpError> {
        for &h in inputs {
            self.ty(h)?;
        }
        let inputs: Vec<ValueRef> = inputs.iter().map(|&h| value(h)).collect();
        let out = self.graph.add_op(op, attrs, &inputs, &self.origin)?;
        if let Some(v) = out.first() {
            self.emitted.push(v.node);
        }
        Ok(out.into_iter().map(handle).collect())
    }
}

/// How `v` is named in an error: `param "fc.w"`, `input "x"`, or the op producing it.
fn describe(g: &Graph, v: ValueRef) -> String {
    let node = g.node(v.node);
    match &node.kind {
        NodeKind::Input { name } => format!("input {name:?}"),
        NodeKind::Param { path, .. } => format!("parameter {path:?}"),
        NodeKind::Op { op, .. } => format!("the result of `{op}`{}", at(&node.origin)),
    }
}

/// The nodes `from` reaches by following edges backwards (`up`) or forwards, `from` included.
fn reach(g: &Graph, from: impl IntoIterator<Item = NodeId>, up: bool) -> HashSet<NodeId> {
    let mut seen: HashSet<NodeId> = HashSet::new();
    let mut stack: Vec<NodeId> = from.into_iter().collect();
    while let Some(n) = stack.pop() {
        if !seen.insert(n) {
            continue;
        }
        if up {
            stack.extend(g.inputs(n).iter().map(|v| v.node));
        } else {
            stack.extend(g.consumers(n));
        }
    }
    seen
}

/// Adds the reverse-mode gradient of scalar `loss` w.r.t. each of `wrt` to `g` and returns one
/// gradient value per `wrt` entry (same type as it).
pub fn backward(
    g: &mut Graph,
    loss: ValueRef,
    wrt: &[ValueRef],
) -> Result<Vec<ValueRef>, AutodiffError> {
    let loss_ty = g.ty(loss).clone();
    if !loss_ty.dtype.is_float() || loss_ty.numel() != 1 {
        return Err(AutodiffError::LossNotScalar { ty: loss_ty });
    }
    for &w in wrt {
        if !g.ty(w).dtype.is_float() {
            return Err(AutodiffError::NotDifferentiable {
                wrt: describe(g, w),
                op: None,
                origin: String::new(),
            });
        }
    }
    let order = g.topo_order().ok_or_else(|| AutodiffError::Rule {
        op: Op::Constant,
        origin: String::new(),
        message: "the graph has a cycle".to_string(),
    })?;
    let ancestors = reach(g, [loss.node], true);
    let descendants = reach(g, wrt.iter().map(|w| w.node), false);
    let relevant: HashSet<NodeId> = ancestors.intersection(&descendants).copied().collect();

    let mut emitted = Vec::new();
    let mut cot: HashMap<ValueRef, ValueRef> = HashMap::new();
    // Where a rule returned no gradient for an input that leads back to a `wrt` value.
    let mut stopped: Vec<(ValueRef, Op, String)> = Vec::new();
    {
        let mut em = GraphEmitter::new(g, "");
        let seed = em
            .scalar_seed(&loss_ty)
            .map_err(|e| rule_error(Op::Constant, "", e))?;
        cot.insert(loss, seed);
        for &id in order.iter().rev() {
            if !relevant.contains(&id) {
                continue;
            }
            let node = em.graph.node(id);
            let NodeKind::Op { op, attrs } = &node.kind else {
                continue;
            };
            let (op, attrs, origin) = (*op, attrs.clone(), node.origin.clone());
            let outputs: Vec<ValueRef> = (0..node.outputs.len() as u32)
                .map(|index| ValueRef { node: id, index })
                .collect();
            let cotangents: Vec<Option<Handle>> = outputs
                .iter()
                .map(|v| cot.get(v).map(|&c| handle(c)))
                .collect();
            if cotangents.iter().all(Option::is_none) {
                continue;
            }
            let rule = op.grad_rule().map_err(|_| AutodiffError::NoRule {
                op,
                origin: origin.clone(),
            })?;
            let inputs = em.graph.inputs(id);
            let handles: Vec<Handle> = inputs.iter().map(|&v| handle(v)).collect();
            let out_handles: Vec<Handle> = outputs.iter().map(|&v| handle(v)).collect();
            em.origin = format!("{origin}{GRAD_MARK}");
            let call = GradCall {
                attrs: &attrs,
                inputs: &handles,
                outputs: &out_handles,
                cotangents: &cotangents,
            };
            let grads = rule(&mut em, &call).map_err(|e| rule_error(op, &origin, e))?;
            if grads.len() != inputs.len() {
                return Err(rule_error(
                    op,
                    &origin,
                    OpError::new(format!(
                        "{} gradients for {} inputs",
                        grads.len(),
                        inputs.len()
                    )),
                ));
            }
            for (x, grad) in inputs.into_iter().zip(grads) {
                if !relevant.contains(&x.node) {
                    continue;
                }
                let Some(grad) = grad else {
                    stopped.push((x, op, origin.clone()));
                    continue;
                };
                let grad = value(grad);
                let (want, got) = (em.graph.ty(x), em.graph.ty(grad));
                if want != got {
                    let message = format!("the gradient of input {want} has type {got}");
                    return Err(rule_error(op, &origin, OpError::new(message)));
                }
                let total = match cot.get(&x) {
                    None => grad,
                    Some(&prev) => (&mut em as &mut dyn Emitter)
                        .add(handle(prev), handle(grad))
                        .map(value)
                        .map_err(|e| rule_error(op, &origin, e))?,
                };
                cot.insert(x, total);
            }
        }
        emitted.append(&mut em.emitted);
    }

    let mut result = Vec::with_capacity(wrt.len());
    for &w in wrt {
        match cot.get(&w) {
            Some(&c) => result.push(c),
            None if !ancestors.contains(&w.node) => {
                return Err(AutodiffError::Unreachable {
                    wrt: describe(g, w),
                })
            }
            None => {
                let below = reach(g, [w.node], false);
                let (_, op, origin) = stopped
                    .iter()
                    .rev()
                    .find(|(x, _, _)| below.contains(&x.node))
                    .cloned()
                    .unwrap_or((w, Op::Constant, String::new()));
                return Err(AutodiffError::NotDifferentiable {
                    wrt: describe(g, w),
                    op: Some(op),
                    origin,
                });
            }
        }
    }
    prune(g, emitted, &result);
    Ok(result)
}

/// Removes the nodes a rule emitted that nothing uses (partial results for inputs that do not
/// lead to a `wrt` value), newest first so chains of them go too.
fn prune(g: &mut Graph, emitted: Vec<NodeId>, keep: &[ValueRef]) {
    let keep: HashSet<NodeId> = keep.iter().map(|v| v.node).collect();
    for id in emitted.into_iter().rev() {
        if keep.contains(&id) || !g.contains(id) {
            continue;
        }
        let outputs = g.node(id).outputs.len() as u32;
        let used = (0..outputs).any(|index| {
            let v = ValueRef { node: id, index };
            !g.users(v).is_empty() || g.is_output(v)
        });
        if !used {
            g.remove_node(id);
        }
    }
}

fn rule_error(op: Op, origin: &str, e: OpError) -> AutodiffError {
    AutodiffError::Rule {
        op,
        origin: origin.to_string(),
        message: e.message,
    }
}

impl GraphEmitter<'_> {
    /// The seed cotangent: 1 of the loss's dtype and shape.
    fn scalar_seed(&mut self, ty: &TensorType) -> Result<ValueRef, OpError> {
        let em: &mut dyn Emitter = self;
        let one = em.scalar(1.0, ty.dtype)?;
        em.broadcast_to(one, &ty.shape).map(value)
    }
}
