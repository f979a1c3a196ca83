//! Every gradient rule of the core math ops against central finite differences in f64, over
//! random shapes (proptest), plus the kinks and ties where PyTorch picks a value.

use proptest::prelude::*;

use super::fd::{check_graph, check_op, gradients, Arg, Rng};
use super::tensor64::T64;
use mslc_core::ops::{Attrs, BinaryOp, DType, Op, UnaryOp};
use mslc_ir::{Graph, ValueRef};

const RTOL: f64 = 1e-5;

/// A shape of rank `0..=max_rank` with dims `1..=3`.
fn shape(max_rank: usize) -> impl Strategy<Value = Vec<usize>> {
    proptest::collection::vec(1usize..=3, 0..=max_rank)
}

/// Two shapes that broadcast: `b` is `a` with some dims set to 1 and some leading dims
/// dropped, then maybe swapped.
fn broadcast_pair() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    (shape(3), any::<u8>(), 0usize..3, any::<bool>()).prop_map(|(a, ones, drop, swap)| {
        let mut b: Vec<usize> = a
            .iter()
            .enumerate()
            .map(|(i, &d)| if ones >> i & 1 == 1 { 1 } else { d })
            .collect();
        b.drain(..drop.min(b.len()));
        if swap {
            (b, a)
        } else {
            (a, b)
        }
    })
}

/// The input values a unary op is tested on: away from its kinks and inside its domain.
fn unary_input(op: UnaryOp, rng: &mut Rng, shape: &[usize]) -> T64 {
    match op {
        UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Reciprocal => {
            rng.tensor(shape, 0.3, 3.0)
        }
        UnaryOp::Softplus => rng.tensor_away(shape, -4.0, 24.0, &[20.0], 1e-3),
        _ => rng.tensor_away(shape, -3.0, 3.0, &[0.0], 1e-3),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn binary_ops_broadcast((sa, sb) in broadcast_pair(), seed in any::<u64>()) {
        let mut rng = Rng(seed);
        for &b in BinaryOp::ALL {
            let (a, bv) = match b {
                BinaryOp::Pow => (rng.tensor(&sa, 0.5, 2.0), rng.tensor(&sb, -1.5, 1.5)),
                BinaryOp::Div => (rng.tensor(&sa, -2.0, 2.0), rng.tensor_away(&sb, -2.0, 2.0, &[0.0], 0.3)),
                _ => (rng.tensor(&sa, -2.0, 2.0), rng.tensor(&sb, -2.0, 2.0)),
            };
            let args = [Arg::f64(a), Arg::f64(bv)];
            check_op(b.op(), &Attrs::new(), &args, seed, RTOL)
                .map_err(|e| TestCaseError::fail(format!("{:?}: {e}", b)))?;
        }
    }

    #[test]
    fn unary_ops(s in shape(3), seed in any::<u64>()) {
        let mut rng = Rng(seed);
        for &u in UnaryOp::ALL {
            if u == UnaryOp::Sign {
                continue;
            }
            let args = [Arg::f64(unary_input(u, &mut rng, &s))];
            check_op(u.op(), &Attrs::new(), &args, seed, RTOL)
                .map_err(|e| TestCaseError::fail(format!("{:?}: {e}", u)))?;
        }
    }

    #[test]
    fn matmul_every_transpose_and_batch(
        (m, k, n) in (1usize..4, 1usize..4, 1usize..4),
        batch in proptest::collection::vec(1usize..3, 0..3),
        (ones, a_rank2, b_rank2) in (any::<u8>(), any::<bool>(), any::<bool>()),
        seed in any::<u64>(),
    ) {
        let mut rng = Rng(seed);
        // Each operand's batch dims: the shared batch, maybe with 1s, or none at all.
        let bdims = |shift: u32, rank2: bool| -> Vec<usize> {
            if rank2 {
                return Vec::new();
            }
            batch.iter().enumerate().map(|(i, &d)| if ones >> (i as u32 + shift) & 1 == 1 { 1 } else { d }).collect()
        };
        let (ba, bb) = (bdims(0, a_rank2), bdims(3, b_rank2));
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let mut sa = ba.clone();
            sa.extend(if ta { [k, m] } else { [m, k] });
            let mut sb = bb.clone();
            sb.extend(if tb { [n, k] } else { [k, n] });
            let attrs = Attrs::new().with("transpose_a", ta).with("transpose_b", tb);
            let args = [Arg::f64(rng.tensor(&sa, -1.0, 1.0)), Arg::f64(rng.tensor(&sb, -1.0, 1.0))];
            check_op(Op::Matmul, &attrs, &args, seed, RTOL)
                .map_err(|e| TestCaseError::fail(format!("ta {ta} tb {tb} {sa:?} {sb:?}: {e}")))?;
        }
    }

    #[test]
    fn reductions_over_every_axis_mix(
        s in proptest::collection::vec(1usize..4, 1..4),
        pick in any::<u8>(),
        (all, keepdim) in (any::<bool>(), any::<bool>()),
        seed in any::<u64>(),
    ) {
        let mut rng = Rng(seed);
        let axes: Vec<i64> = (0..s.len() as i64).filter(|i| pick >> i & 1 == 1).collect();
        let mut attrs = Attrs::new().with("keepdim", keepdim);
        if !all {
            // Negative spellings too.
            let spelled: Vec<i64> = axes.iter().map(|&a| if pick & 0x80 != 0 { a - s.len() as i64 } else { a }).collect();
            attrs.insert("axes", spelled);
        }
        for op in [Op::Sum, Op::Mean, Op::Max] {
            let args = [Arg::f64(rng.tensor(&s, -2.0, 2.0))];
            check_op(op, &attrs, &args, seed, RTOL)
                .map_err(|e| TestCaseError::fail(format!("{op} {attrs:?}: {e}")))?;
        }
    }

    #[test]
    fn softmax_and_losses(s in proptest::collection::vec(1usize..4, 1..4), axis in 0usize..3, seed in any::<u64>()) {
        let mut rng = Rng(seed);
        let axis = (axis % s.len()) as i64 - s.len() as i64 * (seed % 2) as i64;
        for op in [Op::Softmax, Op::LogSoftmax] {
            let args = [Arg::f64(rng.tensor(&s, -2.0, 2.0))];
            check_op(op, &Attrs::new().with("axis", axis), &args, seed, RTOL)
                .map_err(|e| TestCaseError::fail(format!("{op}: {e}")))?;
        }
        let args = [Arg::f64(rng.tensor(&s, -2.0, 2.0)), Arg::f64(rng.tensor(&s, -2.0, 2.0))];
        check_op(Op::MseLoss, &Attrs::new(), &args, seed, RTOL).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn cross_entropy_with_ignored_positions_and_smoothing(
        lead in proptest::collection::vec(1usize..4, 1..3),
        v in 1usize..6,
        smoothing in prop_oneof![Just(0.0), Just(0.1), Just(1.0)],
        seed in any::<u64>(),
    ) {
        let mut rng = Rng(seed);
        let mut shape = lead.clone();
        shape.push(v);
        let mut labels = rng.ints(&lead, v);
        // Ignore about a quarter of the positions (with the default index or another).
        let ignore = if seed % 2 == 0 { -100 } else { v as i64 };
        for l in labels.data.iter_mut() {
            if rng.unit() < 0.25 {
                *l = ignore as f64;
            }
        }
        let attrs = Attrs::new().with("ignore_index", ignore).with("label_smoothing", smoothing);
        let args = [Arg::f64(rng.tensor(&shape, -2.0, 2.0)), Arg::i64(labels.clone())];
        let all_ignored = labels.data.iter().all(|&l| l == ignore as f64);
        if all_ignored {
            // PyTorch: the mean over no position is NaN, and the gradient is zero.
            let g = gradients(&|g: &mut Graph, xs: &[ValueRef]| g.add_op(Op::CrossEntropy, attrs.clone(), xs, "").unwrap(), &args, seed)
                .map_err(TestCaseError::fail)?;
            prop_assert!(g[0].as_ref().unwrap().data.iter().all(|&v| v == 0.0));
        } else {
            check_op(Op::CrossEntropy, &attrs, &args, seed, RTOL).map_err(TestCaseError::fail)?;
        }
    }

    #[test]
    fn layout_ops(s in proptest::collection::vec(1usize..4, 1..4), seed in any::<u64>()) {
        let mut rng = Rng(seed);
        let rank = s.len();
        let x = || Arg::f64(Rng(seed).tensor(&s, -2.0, 2.0));
        let mut perm: Vec<i64> = (0..rank as i64).collect();
        perm.rotate_left(seed as usize % rank);
        check_op(Op::Transpose, &Attrs::new().with("perm", perm), &[x()], seed, RTOL).map_err(TestCaseError::fail)?;
        let flat = vec![-1i64];
        check_op(Op::Reshape, &Attrs::new().with("shape", flat), &[x()], seed, RTOL).map_err(TestCaseError::fail)?;
        let mut big: Vec<i64> = vec![2];
        big.extend(s.iter().map(|&d| d as i64));
        check_op(Op::BroadcastTo, &Attrs::new().with("shape", big), &[Arg::f64(rng.tensor(&[1], -1.0, 1.0))], seed, RTOL)
            .map_err(TestCaseError::fail)?;
        let axis = seed as usize % rank;
        let dim = s[axis] as i64;
        for (start, end) in [(0, dim), (dim / 2, dim), (0, (dim + 1) / 2), (1.min(dim), dim)] {
            let a = Attrs::new().with("axis", axis as i64).with("start", start).with("end", end);
            check_op(Op::Slice, &a, &[x()], seed, RTOL).map_err(TestCaseError::fail)?;
        }
        let a = Attrs::new().with("axis", axis as i64).with("index", dim - 1);
        check_op(Op::Select, &a, &[x()], seed, RTOL).map_err(TestCaseError::fail)?;
        let mut other = s.clone();
        other[axis] = 1 + (seed as usize >> 8) % 3;
        let args = [x(), Arg::f64(rng.tensor(&other, -1.0, 1.0)), x()];
        check_op(Op::Concat, &Attrs::new().with("axis", axis as i64), &args, seed, RTOL)
            .map_err(TestCaseError::fail)?;
    }

    #[test]
    fn max_ties_share_the_gradient_evenly(rows in 1usize..4, cols in 2usize..5, seed in any::<u64>()) {
        // Every row holds its maximum at least twice; torch.amax splits dy evenly among them.
        let mut rng = Rng(seed);
        let mut x = rng.ints(&[rows, cols], 3);
        for r in 0..rows {
            x.data[r * cols] = 2.0;
            x.data[r * cols + cols - 1] = 2.0;
        }
        let attrs = Attrs::new().with("axes", vec![1i64]);
        let build = |g: &mut Graph, xs: &[ValueRef]| g.add_op(Op::Max, attrs.clone(), xs, "").unwrap();
        let args = [Arg::f64(x.clone())];
        let grad = gradients(&build, &args, seed).map_err(TestCaseError::fail)?.remove(0).unwrap();
        let w = super::fd::setup(&build, &args, seed).feeds["w0"].clone();
        for r in 0..rows {
            let row = &x.data[r * cols..(r + 1) * cols];
            let ties = row.iter().filter(|&&v| v == 2.0).count() as f64;
            for (c, &v) in row.iter().enumerate() {
                let want = if v == 2.0 { w.data[r] / ties } else { 0.0 };
                prop_assert!((grad.data[r * cols + c] - want).abs() < 1e-12, "{r},{c}");
            }
        }
    }
}

#[test]
fn kinks_follow_pytorch() {
    // relu'(0) = 0, abs'(0) = sign(0) = 0, maximum/minimum split a tie evenly.
    let x = Arg::f64(T64::new(&[3], vec![-1.0, 0.0, 2.0]));
    let ones = |g: &mut Graph, xs: &[ValueRef], op| g.add_op(op, Attrs::new(), xs, "").unwrap();
    for (op, want) in [(Op::Relu, [0.0, 0.0, 1.0]), (Op::Abs, [-1.0, 0.0, 1.0])] {
        let build = |g: &mut Graph, xs: &[ValueRef]| ones(g, xs, op);
        let args = [x.clone()];
        let w = super::fd::setup(&build, &args, 7).feeds["w0"].clone();
        let g = gradients(&build, &args, 7).unwrap().remove(0).unwrap();
        for (i, k) in want.iter().enumerate() {
            assert_eq!(g.data[i], k * w.data[i], "{op} at {i}");
        }
    }
    let a = Arg::f64(T64::new(&[3], vec![1.0, 2.0, 3.0]));
    let b = Arg::f64(T64::new(&[3], vec![2.0, 2.0, 2.0]));
    for (op, wa) in [
        (Op::Maximum, [0.0, 0.5, 1.0]),
        (Op::Minimum, [1.0, 0.5, 0.0]),
    ] {
        let build = |g: &mut Graph, xs: &[ValueRef]| ones(g, xs, op);
        let args = [a.clone(), b.clone()];
        let w = super::fd::setup(&build, &args, 3).feeds["w0"].clone();
        let g = gradients(&build, &args, 3).unwrap();
        for (i, share) in wa.iter().enumerate() {
            assert_eq!(
                g[0].as_ref().unwrap().data[i],
                share * w.data[i],
                "{op} a {i}"
            );
            assert_eq!(
                g[1].as_ref().unwrap().data[i],
                (1.0 - share) * w.data[i],
                "{op} b {i}"
            );
        }
    }
}

#[test]
fn casts_pass_float_gradients_and_stop_at_integers() {
    let build = |g: &mut Graph, xs: &[ValueRef]| {
        let c = g
            .add_op(Op::Cast, Attrs::new().with("dtype", DType::F32), xs, "")
            .unwrap();
        let back = g
            .add_op(Op::Cast, Attrs::new().with("dtype", DType::F64), &c, "")
            .unwrap();
        g.add_op(Op::Mul, Attrs::new(), &[back[0], xs[0]], "")
            .unwrap()
    };
    let args = [Arg::f64(Rng(1).tensor(&[2, 3], -1.0, 1.0))];
    check_graph(&build, &args, 1, RTOL).unwrap();
}

#[test]
fn a_small_mlp_matches_finite_differences() {
    // x @ w1 + b1 -> gelu -> @ w2ᵀ -> log_softmax -> mean, with a value used twice.
    let build = |g: &mut Graph, xs: &[ValueRef]| {
        let h = g
            .add_op(Op::Matmul, Attrs::new(), &[xs[0], xs[1]], "mlp.up")
            .unwrap()[0];
        let h = g
            .add_op(Op::Add, Attrs::new(), &[h, xs[2]], "mlp.up")
            .unwrap()[0];
        let a = g.add_op(Op::Gelu, Attrs::new(), &[h], "mlp").unwrap()[0];
        let a = g.add_op(Op::Mul, Attrs::new(), &[a, h], "mlp").unwrap()[0];
        let t = Attrs::new().with("transpose_b", true);
        let o = g.add_op(Op::Matmul, t, &[a, xs[3]], "mlp.down").unwrap()[0];
        let l = g
            .add_op(Op::LogSoftmax, Attrs::new(), &[o], "head")
            .unwrap()[0];
        g.add_op(
            Op::Mean,
            Attrs::new().with("axes", vec![0i64]),
            &[l],
            "head",
        )
        .unwrap()
    };
    let mut rng = Rng(11);
    let args = [
        Arg::f64(rng.tensor(&[2, 3, 4], -1.0, 1.0)),
        Arg::f64(rng.tensor(&[4, 5], -1.0, 1.0)),
        Arg::f64(rng.tensor(&[5], -1.0, 1.0)),
        Arg::f64(rng.tensor(&[6, 5], -1.0, 1.0)),
    ];
    check_graph(&build, &args, 11, RTOL).unwrap();
}
