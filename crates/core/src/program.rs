//! What the checker hands to later stages: every model fully elaborated into a flat list of
//! typed op nodes (blocks inlined, loops unrolled, shapes concrete), with its parameters named
//! by path, plus the declarations that were checked against it.

use serde::Serialize;

use crate::diag::FileId;
use crate::ops::{Attrs, DType, Op, TensorType};
use crate::span::Span;

/// Index of a tensor value in [`Model::values`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ValueId(pub u32);

/// How a parameter's initial values are drawn.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Init {
    /// All zeros.
    Zeros,
    /// All ones.
    Ones,
    /// One value everywhere.
    Constant { value: f64 },
    /// Normal distribution.
    Normal { mean: f64, std: f64 },
    /// Uniform distribution on `[low, high)`.
    Uniform { low: f64, high: f64 },
}

/// A source location in some file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Loc {
    /// The file.
    pub file: FileId,
    /// The bytes.
    pub span: Span,
}

/// A model input.
#[derive(Clone, Debug)]
pub struct Input {
    /// Input name.
    pub name: String,
    /// Its value.
    pub value: ValueId,
    /// Per position of its shape, the model dim written there (`tokens: i32[B, S]` gives
    /// `[Some("B"), Some("S")]`); `None` where the size is a literal or an expression. What
    /// lets a caller set dims from an input array's shape without re-checking per dim.
    pub dims: Vec<Option<String>>,
    /// Where it is declared.
    pub loc: Loc,
}

/// A parameter (trainable) or buffer (not trainable) of a model.
#[derive(Clone, Debug)]
pub struct Param {
    /// Dotted path, e.g. `model.layers.0.self_attn.q_proj.weight`.
    pub path: String,
    /// Its value.
    pub value: ValueId,
    /// How to initialise it.
    pub init: Init,
    /// `param` (true) or `buffer` (false).
    pub trainable: bool,
    /// Where it is declared.
    pub loc: Loc,
}

/// Per-node annotations written with `@…`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Annotations {
    /// `@shard(...)`: per input, per dim, the mesh axis or `None` for replicated.
    pub shard: Option<Vec<Vec<Option<String>>>>,
    /// `@recompute`.
    pub recompute: bool,
    /// `@f32` / `@f16` / `@bf16`: compute this op in that dtype.
    pub keep_dtype: Option<DType>,
}

/// One op application.
#[derive(Clone, Debug)]
pub struct Node {
    /// The op.
    pub op: Op,
    /// Its attributes, complete.
    pub attrs: Attrs,
    /// Operands.
    pub inputs: Vec<ValueId>,
    /// Results.
    pub outputs: Vec<ValueId>,
    /// Instance path of the block it came from (`model.layers.0.mlp`); empty at model level.
    pub origin: String,
    /// Where it was written.
    pub loc: Loc,
    /// `@` annotations.
    pub annotations: Annotations,
}

/// A named model output.
#[derive(Clone, Debug)]
pub struct Output {
    /// Output name.
    pub name: String,
    /// Its value.
    pub value: ValueId,
    /// Where it is declared.
    pub loc: Loc,
}

/// A fully elaborated model.
#[derive(Clone, Debug)]
pub struct Model {
    /// Model name.
    pub name: String,
    /// Where it is declared.
    pub loc: Loc,
    /// Constants after overrides, in declaration order.
    pub consts: Vec<(String, String)>,
    /// Dims after overrides, in declaration order.
    pub dims: Vec<(String, i64)>,
    /// Type of every value.
    pub values: Vec<TensorType>,
    /// Inputs in declaration order.
    pub inputs: Vec<Input>,
    /// Parameters and buffers in creation order.
    pub params: Vec<Param>,
    /// Op nodes in evaluation order (a valid topological order).
    pub nodes: Vec<Node>,
    /// Outputs in declaration order.
    pub outputs: Vec<Output>,
}

impl Model {
    /// The type of a value.
    pub fn ty(&self, v: ValueId) -> &TensorType {
        &self.values[v.0 as usize]
    }

    /// The batch dim: the dim named first in the first input's shape (`B` of `tokens:
    /// i32[B, S]`), which a train's micro-batches and data-parallel replicas split; `None`
    /// when the model has no input or that size is not a named dim.
    pub fn batch_dim(&self) -> Option<&str> {
        self.inputs.first()?.dims.first()?.as_deref()
    }

    /// Number of trainable parameter elements (saturating at `u128::MAX`).
    pub fn param_count(&self) -> u128 {
        self.count(|p| p.trainable, TensorType::wide_numel)
    }

    /// Number of buffer elements (saturating at `u128::MAX`).
    pub fn buffer_count(&self) -> u128 {
        self.count(|p| !p.trainable, TensorType::wide_numel)
    }

    /// Bytes of all parameters and buffers (saturating at `u128::MAX`).
    pub fn param_bytes(&self) -> u128 {
        self.count(|_| true, TensorType::wide_bytes)
    }

    fn count(&self, which: impl Fn(&Param) -> bool, size: impl Fn(&TensorType) -> u128) -> u128 {
        self.params
            .iter()
            .filter(|p| which(p))
            .fold(0u128, |n, p| n.saturating_add(size(self.ty(p.value))))
    }

    /// Adds a value of type `ty`.
    pub fn new_value(&mut self, ty: TensorType) -> ValueId {
        self.values.push(ty);
        ValueId(self.values.len() as u32 - 1)
    }
}
