//! The gradient rules of the neural-net ops (norms, batch_norm — also in training mode, through
//! its batch statistics — embedding, rope, attention, conv2d, pools, live dropout) against central finite differences in f64, over random shapes (proptest);
//! their backward ops are evaluated by `nn64`. Plus the tie rule of max pooling and the
//! input-free ops (`rope_table`, `causal_mask`) inside differentiated graphs.

use proptest::prelude::*;

use super::fd::{check_graph, check_op, gradients, Arg, Rng};
use super::tensor64::T64;
use mslc_core::ops::{Attrs, DType, Op};
use mslc_driver::train_mode::batch_norm_train;
use mslc_ir::{Graph, ValueRef};

const RTOL: f64 = 1e-5;

/// Runs [`check_op`], failing the proptest case with its message.
fn check(op: Op, attrs: &Attrs, args: &[Arg], seed: u64) -> Result<(), TestCaseError> {
    check_op(op, attrs, args, seed, RTOL).map_err(|e| TestCaseError::fail(format!("{op}: {e}")))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn last_dim_norms(
        lead in proptest::collection::vec(1usize..=3, 0..=2),
        d in 1usize..=6,
        offset in -2.0f64..2.0,
        seed in any::<u64>(),
    ) {
        let mut shape = lead;
        shape.push(d);
        let mut rng = Rng(seed);
        let x = rng.tensor(&shape, offset - 1.5, offset + 1.5);
        let eps = Attrs::new().with("eps", 1e-3);
        check(Op::RmsNorm, &eps, &[Arg::f64(x.clone())], seed)?;
        check(Op::LayerNorm, &eps, &[Arg::f64(x)], seed)?;
    }

    /// The fused affine forms (made by the fusion pass), parameters of `[D]` or `[1, D]`.
    #[test]
    fn fused_affine_norms(
        rows in 1usize..=3, d in 1usize..=5, keep_rank in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let mut rng = Rng(seed);
        let x = rng.tensor(&[rows, d], -1.5, 1.5);
        let p: Vec<usize> = if keep_rank { vec![1, d] } else { vec![d] };
        let eps = Attrs::new().with("eps", 1e-3);
        let g = rng.tensor(&p, 0.5, 1.5);
        let args = [Arg::f64(x.clone()), Arg::f64(g.clone())];
        check(Op::RmsNormScale, &eps, &args, seed)?;
        let args = [Arg::f64(x), Arg::f64(g), Arg::f64(rng.tensor(&p, -1.0, 1.0))];
        check(Op::LayerNormAffine, &eps, &args, seed)?;
    }

    #[test]
    fn batch_norm_wrt_x_mean_and_var(
        n in 1usize..=3, c in 1usize..=3,
        spatial in proptest::collection::vec(1usize..=3, 0..=2),
        seed in any::<u64>(),
    ) {
        let mut shape = vec![n, c];
        shape.extend(spatial);
        let mut rng = Rng(seed);
        let args = [
            Arg::f64(rng.tensor(&shape, -2.0, 2.0)),
            Arg::f64(rng.tensor(&[c], -1.0, 1.0)),
            Arg::f64(rng.tensor(&[c], 0.2, 2.0)),
        ];
        check(Op::BatchNorm, &Attrs::new().with("eps", 1e-5), &args, seed)?;
    }

    /// Training-mode BatchNorm as a training step builds it (`train_mode::batch_norm_train`):
    /// the gradient with respect to `x` flows through the batch mean and biased variance too.
    #[test]
    fn training_batch_norm_through_batch_statistics(
        n in 1usize..=3, c in 1usize..=3,
        spatial in proptest::collection::vec(1usize..=3, 0..=2),
        seed in any::<u64>(),
    ) {
        let mut shape = vec![n, c];
        shape.extend(spatial);
        prop_assume!(shape.iter().product::<usize>() > c);
        let mut rng = Rng(seed);
        let x = rng.tensor(&shape, -2.0, 2.0);
        let build = |g: &mut Graph, xs: &[ValueRef]| {
            let attrs = Attrs::new().with("eps", 1e-3);
            let (y, mean, var) = batch_norm_train(g, xs[0], attrs, "model.bn").unwrap();
            vec![y, mean, var]
        };
        check_graph(&build, &[Arg::f64(x)], seed, RTOL).map_err(TestCaseError::fail)?;
    }

    /// Live dropout (a seed input): the gradient is the forward's mask, scaled.
    #[test]
    fn training_dropout_reuses_its_mask(
        shape in proptest::collection::vec(1usize..=6, 1..=3),
        p in 0.0f64..0.9,
        salt in 0i64..4,
        seed in any::<u64>(),
    ) {
        let mut rng = Rng(seed);
        let x = rng.tensor(&shape, -2.0, 2.0);
        let seed_value = T64::scalar((seed % 1000) as f64);
        let attrs = Attrs::new().with("p", p).with("salt", salt);
        check(Op::Dropout, &attrs, &[Arg::f64(x), Arg::i64(seed_value)], seed)?;
    }

    /// Few vocab rows, many ids: the table gradient accumulates over repeated ids.
    #[test]
    fn embedding_with_repeated_ids(
        v in 1usize..=4, h in 1usize..=3,
        ids_shape in proptest::collection::vec(1usize..=4, 1..=2),
        seed in any::<u64>(),
    ) {
        let mut rng = Rng(seed);
        let args = [Arg::i64(rng.ints(&ids_shape, v)), Arg::f64(rng.tensor(&[v, h], -1.0, 1.0))];
        check(Op::Embedding, &Attrs::new(), &args, seed)?;
    }

    #[test]
    fn rope_and_rope_cached(
        b in 1usize..=2, s in 1usize..=4, heads in 1usize..=2, half in 1usize..=3,
        theta in 2.0f64..10000.0,
        seed in any::<u64>(),
    ) {
        let mut rng = Rng(seed);
        let x = rng.tensor(&[b, s, heads, 2 * half], -1.0, 1.0);
        check(Op::Rope, &Attrs::new().with("theta", theta), &[Arg::f64(x.clone())], seed)?;
        // What the fusion pass makes of it: the table is an input-free op and gets no gradient.
        let build = |g: &mut Graph, xs: &[ValueRef]| {
            let attrs = Attrs::new()
                .with("theta", theta)
                .with("positions", s as i64)
                .with("dim", 2 * half as i64);
            let table = g.add_op(Op::RopeTable, attrs, &[], "model.rope").unwrap()[0];
            g.add_op(Op::RopeCached, Attrs::new(), &[xs[0], table], "model.rope").unwrap()
        };
        check_graph(&build, &[Arg::f64(x)], seed, RTOL).map_err(TestCaseError::fail)?;
    }

    /// GQA (Hkv divides Hq), causal or not, S ≠ T, default or given scale.
    #[test]
    fn attention_gqa(
        b in 1usize..=2, s in 1usize..=4, t in 1usize..=4,
        hkv in 1usize..=2, group in 1usize..=2, d in 1usize..=3,
        causal in any::<bool>(), scaled in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let mut rng = Rng(seed);
        let hq = hkv * group;
        let args = [
            Arg::f64(rng.tensor(&[b, s, hq, d], -1.5, 1.5)),
            Arg::f64(rng.tensor(&[b, t, hkv, d], -1.5, 1.5)),
            Arg::f64(rng.tensor(&[b, t, hkv, d], -1.5, 1.5)),
        ];
        let mut attrs = Attrs::new().with("causal", causal);
        if scaled {
            attrs.insert("scale", 0.7);
        }
        check(Op::Attention, &attrs, &args, seed)?;
    }

    #[test]
    fn conv2d_stride_padding_dilation_groups(
        n in 1usize..=2, cg in 1usize..=2, og in 1usize..=2, groups in 1usize..=2,
        h in 2usize..=5, w in 2usize..=5, kh in 1usize..=3, kw in 1usize..=3,
        stride in (1usize..=2, 1usize..=2), padding in (0usize..=1, 0usize..=1),
        dilation in (1usize..=2, 1usize..=2),
        seed in any::<u64>(),
    ) {
        let fits = |len: usize, k: usize, p: usize, dl: usize| len + 2 * p > dl * (k - 1);
        prop_assume!(fits(h, kh, padding.0, dilation.0) && fits(w, kw, padding.1, dilation.1));
        let mut rng = Rng(seed);
        let args = [
            Arg::f64(rng.tensor(&[n, cg * groups, h, w], -1.0, 1.0)),
            Arg::f64(rng.tensor(&[og * groups, cg, kh, kw], -1.0, 1.0)),
        ];
        let pair = |p: (usize, usize)| vec![p.0 as i64, p.1 as i64];
        let attrs = Attrs::new()
            .with("stride", pair(stride))
            .with("padding", pair(padding))
            .with("dilation", pair(dilation))
            .with("groups", groups as i64);
        check(Op::Conv2d, &attrs, &args, seed)?;
    }

    /// Distinct values (a permutation of a grid), so no window has tied maxima where the
    /// finite difference would straddle the kink.
    #[test]
    fn pools(
        n in 1usize..=2, c in 1usize..=2, h in 1usize..=5, w in 1usize..=5,
        kh in 1usize..=3, kw in 1usize..=3, sh in 1usize..=2, sw in 1usize..=2,
        ph in 0usize..=1, pw in 0usize..=1, oh in 1usize..=3, ow in 1usize..=3,
        seed in any::<u64>(),
    ) {
        let mut rng = Rng(seed);
        let count = n * c * h * w;
        let mut values: Vec<f64> = (0..count).map(|i| i as f64 / count as f64 - 0.5).collect();
        for i in (1..count).rev() {
            values.swap(i, (rng.unit() * (i + 1) as f64) as usize);
        }
        let x = T64::new(&[n, c, h, w], values);
        let (ph, pw) = (ph.min(kh / 2), pw.min(kw / 2));
        if h + 2 * ph >= kh && w + 2 * pw >= kw {
            let attrs = Attrs::new()
                .with("kernel", vec![kh as i64, kw as i64])
                .with("stride", vec![sh as i64, sw as i64])
                .with("padding", vec![ph as i64, pw as i64]);
            check(Op::MaxPool2d, &attrs, &[Arg::f64(x.clone())], seed)?;
            check(Op::AvgPool2d, &attrs, &[Arg::f64(x.clone())], seed)?;
        }
        let attrs = Attrs::new().with("output", vec![oh as i64, ow as i64]);
        check(Op::AdaptiveAvgPool2d, &attrs, &[Arg::f64(x)], seed)?;
    }
}

/// Tied maxima: the whole cotangent goes to the first maximum of the window, as PyTorch.
#[test]
fn max_pool_ties_go_to_the_first_maximum() {
    let x = T64::new(&[1, 1, 2, 2], vec![1.0, 3.0, 3.0, 2.0]);
    let attrs = Attrs::new().with("kernel", vec![2i64, 2]);
    let build = |g: &mut Graph, xs: &[ValueRef]| {
        g.add_op(Op::MaxPool2d, attrs.clone(), xs, "model.pool")
            .unwrap()
    };
    let grads = gradients(&build, &[Arg::f64(x)], 7).unwrap();
    let g = grads[0].as_ref().unwrap();
    assert_eq!(g.data[0], 0.0);
    assert_ne!(g.data[1], 0.0);
    assert_eq!((g.data[2], g.data[3]), (0.0, 0.0));
}

/// A causal mask added to scores before a softmax: the input-free mask gets no gradient and
/// the masked positions get zero.
#[test]
fn causal_mask_inside_a_differentiated_graph() {
    let mut rng = Rng(3);
    let x = rng.tensor(&[4, 4], -1.0, 1.0);
    let build = |g: &mut Graph, xs: &[ValueRef]| {
        let attrs = Attrs::new().with("size", 4i64).with("dtype", DType::F64);
        let mask = g.add_op(Op::CausalMask, attrs, &[], "model.mask").unwrap()[0];
        let y = g.add_op(Op::Add, Attrs::new(), &[xs[0], mask], "").unwrap()[0];
        g.add_op(Op::Softmax, Attrs::new(), &[y], "").unwrap()
    };
    check_graph(&build, &[Arg::f64(x.clone())], 3, RTOL).unwrap();
    let g = gradients(&build, &[Arg::f64(x)], 3).unwrap()[0]
        .clone()
        .unwrap();
    assert_eq!(g.data[1], 0.0, "above the diagonal");
}
