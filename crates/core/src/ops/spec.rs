//! The shape of one registry entry ([`OpSpec`]) and the context its rules receive ([`OpCtx`]).

use super::attrs::{AttrSpec, Attrs};
use super::dtype::DType;
use super::error::OpError;
use super::registry::Op;
use super::shape::fmt_dims;
use super::tensor_type::TensorType;

/// How many inputs an op takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arity {
    /// Exactly this many.
    Exact(usize),
    /// From `min` to `max` inclusive (an optional trailing input).
    Between(usize, usize),
    /// At least this many (variadic).
    AtLeast(usize),
}

impl Arity {
    /// Whether `n` inputs are acceptable.
    pub fn accepts(self, n: usize) -> bool {
        match self {
            Arity::Exact(k) => n == k,
            Arity::Between(lo, hi) => (lo..=hi).contains(&n),
            Arity::AtLeast(k) => n >= k,
        }
    }

    /// "2 inputs", "2 or 3 inputs", "at least 1 input".
    pub fn describe(self) -> String {
        let plural = |k: usize| if k == 1 { "input" } else { "inputs" };
        match self {
            Arity::Exact(k) => format!("{k} {}", plural(k)),
            Arity::Between(lo, hi) if hi == lo + 1 => format!("{lo} or {hi} inputs"),
            Arity::Between(lo, hi) => format!("{lo} to {hi} inputs"),
            Arity::AtLeast(k) => format!("at least {k} {}", plural(k)),
        }
    }
}

/// Work and memory traffic of one op application, for the cost model and the roofline report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cost {
    pub flops: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
}

impl Cost {
    /// `flops` of work that reads every input once and writes every output once.
    pub fn streaming(flops: u64, inputs: &[TensorType], outputs: &[TensorType]) -> Cost {
        let sum = |ts: &[TensorType]| ts.iter().fold(0u64, |n, t| n.saturating_add(t.bytes()));
        Cost {
            flops,
            bytes_read: sum(inputs),
            bytes_written: sum(outputs),
        }
    }
}

/// How an op's cost is computed.
#[derive(Clone, Copy)]
pub enum CostRule {
    /// This many flops per output element; reads the inputs and writes the outputs once.
    PerOutput(u64),
    /// This many flops per element of input 0; reads the inputs and writes the outputs once.
    PerInput(u64),
    /// Reinterprets its input's buffer: no flops and no memory traffic.
    View,
    /// An op-specific formula (matmul, attention, convolution, ...).
    Custom(fn(&OpCtx, &[TensorType]) -> Cost),
}

/// Where an op may run under mixed precision (docs/semantics.md: MindSpore's O1 white list and the
/// "auto" level's keep-f32 list).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PrecisionClass {
    /// On the O1 white list: cast to the low-precision compute dtype even at O1.
    LowPrecisionFriendly,
    /// Numerically sensitive: keep in f32 at every level but O3.
    KeepF32,
    /// Runs in whatever dtype its inputs arrive in.
    FollowInput,
}

/// An opaque handle to a value in a graph being rewritten, so that rules in this module can
/// emit ops without depending on the IR; the [`Emitter`] maps handles to its own values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Handle(pub usize);

/// What gradient rules build with: the IR implements it to add ops to a graph.
pub trait Emitter {
    /// The type of a value.
    fn ty(&self, value: Handle) -> Result<TensorType, OpError>;
    /// Adds `op` applied to `inputs`, returning its outputs.
    fn emit(&mut self, op: Op, attrs: Attrs, inputs: &[Handle]) -> Result<Vec<Handle>, OpError>;
}

/// One op application seen by a gradient rule: its (resolved) attributes, its input and output
/// values and the cotangent of each output (`None` where an output does not reach the loss).
pub struct GradCall<'a> {
    pub attrs: &'a Attrs,
    pub inputs: &'a [Handle],
    pub outputs: &'a [Handle],
    pub cotangents: &'a [Option<Handle>],
}

/// Emits the vector-Jacobian product of an op: one cotangent per input (`None` for inputs
/// that get no gradient, such as integer ids).
pub type GradRule = fn(&mut dyn Emitter, &GradCall) -> Result<Vec<Option<Handle>>, OpError>;

/// The layout of one tensor across a device mesh: per dim, the mesh axis it is split along
/// (the IR's `shard` annotation holds one per input).
pub type DimLayout = Vec<Option<String>>;

/// Propagates layouts through an op: from the layouts of its inputs to those of its outputs,
/// or an error when the inputs' layouts cannot meet without a redistribution.
pub type ShardRule = fn(&OpCtx, &[DimLayout]) -> Result<Vec<DimLayout>, OpError>;

/// Everything the stages need to know about one op (or one family of ops sharing rules).
pub struct OpSpec {
    /// Argument names, used in error messages and by named-argument calls; a variadic op
    /// names its one repeated argument.
    pub inputs: &'static [&'static str],
    /// How many inputs it takes.
    pub arity: Arity,
    /// The attributes it accepts, with kinds and defaults.
    pub attrs: &'static [AttrSpec],
    /// Output types from input types and resolved attributes (shape and dtype rule).
    pub infer: fn(&OpCtx) -> Result<Vec<TensorType>, OpError>,
    /// Work and traffic.
    pub cost: CostRule,
    /// Mixed-precision class.
    pub precision: PrecisionClass,
    /// Computes each output element from the same-index elements of its (broadcast) inputs,
    /// so the fusion pass may chain it into a `fused_elementwise` program.
    pub elementwise: bool,
    /// Output 0 may be written into the buffer of an input of the same dtype and element
    /// count (see [`OpSpec::reusable_inputs`]).
    pub in_place: bool,
    /// The gradient rule, where one is defined.
    pub grad: Option<GradRule>,
    /// The sharding propagation rule, where one is defined.
    pub shard: Option<ShardRule>,
}

impl OpSpec {
    /// Flops per output element of an elementwise op (what a fused program adds up);
    /// `None` for ops that are not elementwise.
    pub fn flops_per_element(&self) -> Option<u64> {
        match (self.elementwise, self.cost) {
            (true, CostRule::PerOutput(k)) => Some(k),
            _ => None,
        }
    }

    /// Output 0 is input 0's bytes under another shape (`reshape`): it may share input 0's
    /// buffer even while input 0 stays alive, since neither is written through the other.
    pub fn is_view(&self) -> bool {
        matches!(self.cost, CostRule::View)
    }

    /// The inputs whose buffer output 0 may overwrite: same dtype and element count as the
    /// output, for ops marked `in_place`.
    pub fn reusable_inputs(&self, inputs: &[TensorType], output: &TensorType) -> Vec<usize> {
        if !self.in_place {
            return Vec::new();
        }
        inputs
            .iter()
            .enumerate()
            .filter(|(_, t)| t.dtype == output.dtype && t.numel() == output.numel())
            .map(|(i, _)| i)
            .collect()
    }
}

/// One op application as a rule sees it: the op, its resolved attributes (defaults filled in)
/// and its input types, already checked for arity and well-formed shapes.
pub struct OpCtx<'a> {
    pub op: Op,
    pub attrs: &'a Attrs,
    pub inputs: &'a [TensorType],
}

impl OpCtx<'_> {
    /// Input `i` (the registry checked arity, so rules index within it).
    pub fn input(&self, i: usize) -> &TensorType {
        &self.inputs[i]
    }

    /// The name of argument `i` ("a", "xs[2]").
    pub fn arg_name(&self, i: usize) -> String {
        let names = self.op.spec().inputs;
        match self.op.spec().arity {
            Arity::AtLeast(_) if i + 1 >= names.len() => {
                format!("{}[{}]", names.last().copied().unwrap_or("x"), i)
            }
            _ => names.get(i).copied().unwrap_or("x").to_string(),
        }
    }

    /// Argument `i` described for a message: "a is f32[4, 8]".
    pub fn describe(&self, i: usize) -> String {
        let t = self.input(i);
        format!("{} is {}{}", self.arg_name(i), t.dtype, fmt_dims(&t.shape))
    }

    /// The dtype of input `i`, which must be a float.
    pub fn float_input(&self, i: usize) -> Result<DType, OpError> {
        let d = self.input(i).dtype;
        if d.is_float() {
            Ok(d)
        } else {
            Err(OpError::at(
                i,
                format!("expects a float tensor, but {}", self.describe(i)),
            )
            .with_help(format!(
                "cast it first, e.g. cast({}, dtype: f32)",
                self.arg_name(i)
            )))
        }
    }

    /// The dtype of input `i`, which must be an integer.
    pub fn int_input(&self, i: usize) -> Result<DType, OpError> {
        let d = self.input(i).dtype;
        if d.is_int() {
            Ok(d)
        } else {
            Err(OpError::at(
                i,
                format!("expects an integer tensor, but {}", self.describe(i)),
            ))
        }
    }

    /// The dtype of input `i`, which must not be `bool`.
    pub fn numeric_input(&self, i: usize) -> Result<DType, OpError> {
        let d = self.input(i).dtype;
        if d == DType::Bool {
            Err(OpError::at(
                i,
                format!("expects a numeric tensor, but {}", self.describe(i)),
            ))
        } else {
            Ok(d)
        }
    }

    /// Checks that input `i` has rank `rank`; `layout` names its dims for the message.
    pub fn expect_rank(&self, i: usize, rank: usize, layout: &str) -> Result<(), OpError> {
        if self.input(i).rank() == rank {
            Ok(())
        } else {
            Err(OpError::at(
                i,
                format!(
                    "expects {} of rank {rank} ({layout}), but {}",
                    self.arg_name(i),
                    self.describe(i)
                ),
            ))
        }
    }

    /// Checks that input `i` has at least rank `rank`; `layout` names its dims.
    pub fn expect_min_rank(&self, i: usize, rank: usize, layout: &str) -> Result<(), OpError> {
        if self.input(i).rank() >= rank {
            Ok(())
        } else {
            Err(OpError::at(
                i,
                format!(
                    "expects {} of rank at least {rank} ({layout}), but {}",
                    self.arg_name(i),
                    self.describe(i)
                ),
            ))
        }
    }

    /// Checks that inputs `i` and `j` have the same dtype.
    pub fn same_dtype(&self, i: usize, j: usize) -> Result<DType, OpError> {
        let (a, b) = (self.input(i).dtype, self.input(j).dtype);
        if a == b {
            Ok(a)
        } else {
            Err(OpError::at(
                j,
                format!(
                    "dtypes differ: {} has {a}, {} has {b}",
                    self.arg_name(i),
                    self.arg_name(j)
                ),
            )
            .with_help(format!("cast {} to {a}", self.arg_name(j))))
        }
    }

    /// Normalises attribute `name` (an axis) against the rank of input `i`.
    pub fn axis(&self, name: &str, i: usize) -> Result<usize, OpError> {
        let axis = self.attrs.int(name)?;
        super::shape::normalize_axis(axis, self.input(i).rank())
            .map_err(|m| OpError::new(format!("{name}: {m}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arity_descriptions() {
        assert_eq!(Arity::Exact(1).describe(), "1 input");
        assert_eq!(Arity::Exact(2).describe(), "2 inputs");
        assert_eq!(Arity::Between(2, 3).describe(), "2 or 3 inputs");
        assert_eq!(Arity::Between(1, 4).describe(), "1 to 4 inputs");
        assert_eq!(Arity::AtLeast(1).describe(), "at least 1 input");
        assert!(Arity::Between(2, 3).accepts(3) && !Arity::Between(2, 3).accepts(4));
        assert!(Arity::AtLeast(1).accepts(9) && !Arity::AtLeast(1).accepts(0));
    }

    #[test]
    fn reusable_inputs_need_same_dtype_and_size() {
        let spec = Op::Add.spec();
        let a = TensorType::new(DType::F32, [2, 3]);
        let b = TensorType::new(DType::F32, [3]);
        let c = TensorType::new(DType::F16, [2, 3]);
        assert_eq!(spec.reusable_inputs(&[a.clone(), b.clone()], &a), vec![0]);
        assert_eq!(spec.reusable_inputs(&[c, a.clone()], &a), vec![1]);
        assert!(Op::Matmul
            .spec()
            .reusable_inputs(std::slice::from_ref(&a), &a)
            .is_empty());
    }
}
