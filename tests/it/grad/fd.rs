//! The finite-difference harness: builds a small graph around an op (or any subgraph), takes
//! `loss = Σ_k sum(y_k * w_k)` with fixed random weights `w_k` (so every output element gets a
//! distinct cotangent), calls `backward` for every float input, evaluates the gradient graph in
//! float64 and compares each element with a central finite difference of the loss.

use std::collections::HashMap;

use super::eval64::eval_graph;
use super::tensor64::T64;
use mslc_core::ops::{Attrs, DType, Op, TensorType};
use mslc_ir::{backward, Graph, ValueRef};

/// One input of a case: its IR type and its value (integer inputs hold whole numbers and get
/// no gradient).
#[derive(Clone, Debug)]
pub struct Arg {
    pub ty: TensorType,
    pub value: T64,
}

impl Arg {
    /// A float64 input.
    pub fn f64(value: T64) -> Arg {
        let shape = value.shape.iter().map(|&d| d as i64).collect::<Vec<_>>();
        Arg {
            ty: TensorType::new(DType::F64, shape),
            value,
        }
    }

    /// An i64 input (labels, ids).
    pub fn i64(value: T64) -> Arg {
        let shape = value.shape.iter().map(|&d| d as i64).collect::<Vec<_>>();
        Arg {
            ty: TensorType::new(DType::I64, shape),
            value,
        }
    }
}

/// A deterministic generator of test values (SplitMix64).
pub struct Rng(pub u64);

impl Rng {
    /// The next value in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A tensor of `shape` uniform in `[lo, hi)`.
    pub fn tensor(&mut self, shape: &[usize], lo: f64, hi: f64) -> T64 {
        let n = shape.iter().product();
        T64::new(
            shape,
            (0..n).map(|_| lo + (hi - lo) * self.unit()).collect(),
        )
    }

    /// A tensor of `shape` uniform in `[lo, hi)` with every element at least `gap` away from
    /// each of `kinks` (where the op is not differentiable).
    pub fn tensor_away(
        &mut self,
        shape: &[usize],
        lo: f64,
        hi: f64,
        kinks: &[f64],
        gap: f64,
    ) -> T64 {
        let mut t = self.tensor(shape, lo, hi);
        for v in &mut t.data {
            while kinks.iter().any(|k| (*v - k).abs() < gap) {
                *v = lo + (hi - lo) * self.unit();
            }
        }
        t
    }

    /// Whole numbers in `0..n` (labels, ids).
    pub fn ints(&mut self, shape: &[usize], n: usize) -> T64 {
        let count = shape.iter().product();
        T64::new(
            shape,
            (0..count)
                .map(|_| (self.unit() * n as f64).floor())
                .collect(),
        )
    }
}

/// A graph builder: given the inputs' values in the graph, adds the ops under test and returns
/// the outputs the loss weighs.
pub type Build<'a> = &'a dyn Fn(&mut Graph, &[ValueRef]) -> Vec<ValueRef>;

/// The graph of a test: inputs `x0..`, the ops of `build`, weights `w0..` (one per output) and
/// `loss`; with the float inputs it differentiates.
pub struct Setup {
    pub graph: Graph,
    pub loss: ValueRef,
    pub inputs: Vec<ValueRef>,
    pub feeds: HashMap<String, T64>,
}

/// Builds the forward graph and its feeds; `seed` draws the loss weights.
pub fn setup(build: Build, args: &[Arg], seed: u64) -> Setup {
    let mut g = Graph::new("grad_test");
    let mut feeds = HashMap::new();
    let inputs: Vec<ValueRef> = args
        .iter()
        .enumerate()
        .map(|(i, a)| {
            feeds.insert(format!("x{i}"), a.value.clone());
            g.add_input(&format!("x{i}"), a.ty.clone())
        })
        .collect();
    let outs = build(&mut g, &inputs);
    let mut rng = Rng(seed ^ 0x5eed);
    let mut loss = None;
    for (k, y) in outs.into_iter().enumerate() {
        let ty = g.ty(y).clone();
        let shape: Vec<usize> = ty.shape.iter().map(|&d| d as usize).collect();
        feeds.insert(format!("w{k}"), rng.tensor(&shape, -1.0, 1.0));
        let w = g.add_input(&format!("w{k}"), ty);
        let p = g.add_op(Op::Mul, Attrs::new(), &[y, w], "").unwrap()[0];
        let s = g.add_op(Op::Sum, Attrs::new(), &[p], "").unwrap()[0];
        loss = Some(match loss {
            None => s,
            Some(l) => g.add_op(Op::Add, Attrs::new(), &[l, s], "").unwrap()[0],
        });
    }
    Setup {
        graph: g,
        loss: loss.expect("the build returns at least one output"),
        inputs,
        feeds,
    }
}

/// The gradients `backward` builds for the float inputs, evaluated in f64 (`None` for the
/// integer inputs).
pub fn gradients(build: Build, args: &[Arg], seed: u64) -> Result<Vec<Option<T64>>, String> {
    let mut s = setup(build, args, seed);
    let wrt: Vec<ValueRef> = s
        .inputs
        .iter()
        .zip(args)
        .filter(|(_, a)| a.ty.dtype.is_float())
        .map(|(v, _)| *v)
        .collect();
    let grads = backward(&mut s.graph, s.loss, &wrt).map_err(|e| e.to_string())?;
    mslc_ir::verify(&s.graph).map_err(|e| format!("backward graph: {e}"))?;
    let vals = eval_graph(&s.graph, &s.feeds)?;
    let mut it = grads.into_iter();
    Ok(args
        .iter()
        .map(|a| {
            a.ty.dtype
                .is_float()
                .then(|| vals[&it.next().unwrap()].clone())
        })
        .collect())
}

/// Compares every gradient element with a central difference of the loss (step `1e-6`,
/// scaled by the element's magnitude): `|g - fd| <= 1e-6 + rtol·|fd|`.
pub fn check_graph(build: Build, args: &[Arg], seed: u64, rtol: f64) -> Result<(), String> {
    let grads = gradients(build, args, seed)?;
    let s = setup(build, args, seed);
    let loss_at = |feeds: &HashMap<String, T64>| -> Result<f64, String> {
        Ok(eval_graph(&s.graph, feeds)?[&s.loss].data[0])
    };
    for (i, g) in grads.iter().enumerate() {
        let Some(g) = g else { continue };
        for j in 0..g.data.len() {
            let mut feeds = s.feeds.clone();
            let x = feeds[&format!("x{i}")].data[j];
            let h = 1e-6 * x.abs().max(1.0);
            feeds.get_mut(&format!("x{i}")).unwrap().data[j] = x + h;
            let up = loss_at(&feeds)?;
            feeds.get_mut(&format!("x{i}")).unwrap().data[j] = x - h;
            let down = loss_at(&feeds)?;
            let fd = (up - down) / (2.0 * h);
            let got = g.data[j];
            let close = (got - fd).abs() <= 1e-6 + rtol * fd.abs();
            if !close {
                return Err(format!(
                    "input {i} element {j}: gradient {got}, finite difference {fd}"
                ));
            }
        }
    }
    Ok(())
}

/// [`check_graph`] for one application of `op` with `attrs` to the inputs.
pub fn check_op(op: Op, attrs: &Attrs, args: &[Arg], seed: u64, rtol: f64) -> Result<(), String> {
    let build = |g: &mut Graph, xs: &[ValueRef]| {
        g.add_op(op, attrs.clone(), xs, "model.layer")
            .unwrap_or_else(|e| panic!("{op}: {e}"))
    };
    check_graph(&build, args, seed, rtol)
}
