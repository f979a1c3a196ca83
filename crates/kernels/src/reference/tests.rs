//! The reference kernels against values worked out by hand (or from the defining formulas in
//! closed form): the ground truth must itself be right.

use super::*;
use crate::activation::Activation;
use crate::conv::Conv2dAttrs;
use crate::elementwise::op::{BinaryOp, CastTarget, UnaryOp};
use crate::pool::{Pool2dAttrs, PoolKind};
use crate::reduce::ReduceOp;
use crate::tensor::{Tensor, TensorRef};

fn t<'a>(data: &'a [f32], shape: &'a [usize]) -> TensorRef<'a> {
    TensorRef::new("test", data, shape).unwrap()
}

fn close(got: &Tensor, shape: &[usize], want: &[f32]) {
    assert_eq!(got.shape, shape);
    assert_eq!(got.data.len(), want.len());
    for (i, (g, w)) in got.data.iter().zip(want).enumerate() {
        let ok = (g - w).abs() <= 1e-6 * (1.0 + w.abs()) || (g.is_nan() && w.is_nan()) || g == w;
        assert!(ok, "element {i}: {g} vs {w}");
    }
}

#[test]
fn scalar_ops_hit_known_values() {
    let cases = [
        (UnaryOp::Gelu, 1.0, 0.841_344_7),
        (UnaryOp::GeluTanh, 1.0, 0.841_192),
        (UnaryOp::Silu, 1.0, 0.731_058_6),
        (UnaryOp::Erf, 0.5, 0.520_499_9),
        (UnaryOp::Sigmoid, 0.0, 0.5),
        (UnaryOp::Rsqrt, 4.0, 0.5),
        (UnaryOp::Relu, -3.0, 0.0),
        (UnaryOp::Tanh, 0.5, 0.462_117_16),
    ];
    for (op, x, want) in cases {
        let got = unary_scalar(op, x);
        assert!(
            (got - want).abs() < 1e-6,
            "{op:?}({x}) = {got}, want {want}"
        );
    }
    close(
        &cast(t(&[-1.5], &[1]), CastTarget::I64).unwrap(),
        &[1],
        &[-1.0],
    );
    let c = constant(0.25);
    close(&c, &[], &[0.25]);
    close(
        &cast(t(&[1.0 + 1e-4], &[1]), CastTarget::F16).unwrap(),
        &[1],
        &[1.0],
    );
    close(
        &dropout(t(&[1.0, 2.0], &[2]), 0.5, None, None).unwrap(),
        &[2],
        &[1.0, 2.0],
    );
    assert!(dropout(t(&[1.0], &[1]), 1.5, None, None).is_err());
}

#[test]
fn training_dropout_keeps_1_minus_p_and_rescales() {
    let n = 100_000;
    let ones = vec![1.0f32; n];
    let shape = [n];
    let x = t(&ones, &shape);
    let p = 0.3;
    let y = dropout(x, p, Some((7, 2)), None).unwrap();
    let kept = y.data.iter().filter(|&&v| v != 0.0).count();
    // Binomial(n, 0.7): standard deviation ≈ 145; 5 of them.
    assert!((kept as f64 - 0.7 * n as f64).abs() < 725.0, "kept {kept}");
    let scale = (1.0 / (1.0 - p)) as f32;
    assert!(y.data.iter().all(|&v| v == 0.0 || v == scale));
    // The same seed and salt give the same mask; another salt or seed another one.
    assert_eq!(dropout(x, p, Some((7, 2)), None).unwrap().data, y.data);
    assert_ne!(dropout(x, p, Some((7, 3)), None).unwrap().data, y.data);
    assert_ne!(dropout(x, p, Some((8, 2)), None).unwrap().data, y.data);
}

#[test]
fn a_block_of_a_split_tensor_draws_the_whole_tensors_mask() {
    // x [2, 4, 3] split along dim 1 into 2 blocks [2, 2, 3]: each block's result is its
    // block of the whole's.
    let whole: Vec<f32> = (0..24).map(|i| i as f32 + 1.0).collect();
    let shape = [2, 4, 3];
    let want = dropout(t(&whole, &shape), 0.5, Some((3, 1)), None).unwrap();
    for index in 0..2 {
        let part: Vec<f32> = (0..2)
            .flat_map(|o| whole[o * 12 + index * 6..o * 12 + index * 6 + 6].to_vec())
            .collect();
        let block = MaskBlock {
            dim: 1,
            blocks: 2,
            index,
        };
        let got = dropout(t(&part, &[2, 2, 3]), 0.5, Some((3, 1)), Some(block)).unwrap();
        let mine: Vec<f32> = (0..2)
            .flat_map(|o| want.data[o * 12 + index * 6..o * 12 + index * 6 + 6].to_vec())
            .collect();
        assert_eq!(got.data, mine);
    }
    assert!(want.data.contains(&0.0) && want.data.iter().any(|&v| v > 1.0));
}

#[test]
fn binary_broadcasts() {
    let r = binary(
        BinaryOp::Sub,
        t(&[10.0, 20.0], &[2, 1]),
        t(&[1.0, 2.0, 3.0], &[3]),
    )
    .unwrap();
    close(&r, &[2, 3], &[9.0, 8.0, 7.0, 19.0, 18.0, 17.0]);
    assert!(binary(
        BinaryOp::Add,
        t(&[1.0, 2.0], &[2]),
        t(&[1.0, 2.0, 3.0], &[3])
    )
    .is_err());
    let p = binary(BinaryOp::Pow, t(&[2.0], &[]), t(&[3.0, 0.5], &[2])).unwrap();
    close(&p, &[2], &[8.0, std::f32::consts::SQRT_2]);
}

#[test]
fn matmul_by_hand() {
    let a = [1.0, 2.0, 3.0, 4.0];
    let b = [5.0, 6.0, 7.0, 8.0];
    close(
        &matmul(t(&a, &[2, 2]), t(&b, &[2, 2]), false, false).unwrap(),
        &[2, 2],
        &[19.0, 22.0, 43.0, 50.0],
    );
    close(
        &matmul(t(&a, &[2, 2]), t(&b, &[2, 2]), true, false).unwrap(),
        &[2, 2],
        &[26.0, 30.0, 38.0, 44.0],
    );
    close(
        &matmul(t(&a, &[2, 2]), t(&b, &[2, 2]), false, true).unwrap(),
        &[2, 2],
        &[17.0, 23.0, 39.0, 53.0],
    );
    // Batch broadcast: [2, 1, 2] @ [2, 1] -> [2, 1, 1].
    close(
        &matmul(t(&a, &[2, 1, 2]), t(&[1.0, 1.0], &[2, 1]), false, false).unwrap(),
        &[2, 1, 1],
        &[3.0, 7.0],
    );
    let fused = fused_matmul(
        t(&a, &[2, 2]),
        t(&b, &[2, 2]),
        Some(t(&[-20.0, -100.0], &[2])),
        false,
        false,
        Activation::new(UnaryOp::Relu).unwrap(),
    )
    .unwrap();
    close(&fused, &[2, 2], &[0.0, 0.0, 23.0, 0.0]);
}

#[test]
fn layout_ops_by_hand() {
    let x = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0];
    close(
        &transpose(t(&x, &[2, 3]), &[1, 0]).unwrap(),
        &[3, 2],
        &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0],
    );
    close(&reshape(t(&x, &[2, 3]), &[3, 2]).unwrap(), &[3, 2], &x);
    assert!(reshape(t(&x, &[2, 3]), &[4]).is_err());
    close(
        &broadcast_to(t(&[1.0, 2.0], &[2, 1]), &[2, 2]).unwrap(),
        &[2, 2],
        &[1.0, 1.0, 2.0, 2.0],
    );
    assert!(broadcast_to(t(&[1.0, 2.0], &[2]), &[3]).is_err());
    assert!(broadcast_to(t(&x, &[2, 3]), &[3]).is_err());
    let c = concat(&[t(&x[..4], &[2, 2]), t(&x[4..], &[2, 1])], 1).unwrap();
    close(&c, &[2, 3], &[0.0, 1.0, 4.0, 2.0, 3.0, 5.0]);
    assert!(concat(&[t(&x[..4], &[2, 2]), t(&x[4..], &[1, 2])], 1).is_err());
    close(
        &slice(t(&x, &[2, 3]), -1, 1, -1).unwrap(),
        &[2, 1],
        &[1.0, 4.0],
    );
    assert!(slice(t(&x, &[2, 3]), 1, 2, 1).is_err());
    assert!(slice(t(&x, &[2, 3]), 1, 0, 4).is_err());
    close(
        &select(t(&x, &[2, 3]), 0, -1).unwrap(),
        &[3],
        &[3.0, 4.0, 5.0],
    );
    assert!(select(t(&x, &[2, 3]), 0, 2).is_err());
}

#[test]
fn reductions_and_softmax_by_hand() {
    let x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    close(
        &reduce(t(&x, &[2, 3]), ReduceOp::Sum, &[0], false).unwrap(),
        &[3],
        &[5.0, 7.0, 9.0],
    );
    close(
        &reduce(t(&x, &[2, 3]), ReduceOp::Mean, &[-1], true).unwrap(),
        &[2, 1],
        &[2.0, 5.0],
    );
    close(
        &reduce(t(&x, &[2, 3]), ReduceOp::Max, &[0, 1], false).unwrap(),
        &[],
        &[6.0],
    );
    close(
        &reduce(t(&x, &[2, 3]), ReduceOp::Sum, &[], false).unwrap(),
        &[2, 3],
        &x,
    );
    let e = [
        1.0f64,
        2.0f64.exp() / 1.0f64.exp(),
        3.0f64.exp() / 1.0f64.exp(),
    ];
    let total: f64 = e.iter().sum();
    let sm: Vec<f32> = e.iter().map(|v| (v / total) as f32).collect();
    close(&softmax(t(&x[..3], &[3]), 0).unwrap(), &[3], &sm);
    let lsm: Vec<f32> = sm.iter().map(|v| v.ln()).collect();
    close(&log_softmax(t(&x[..3], &[3]), -1).unwrap(), &[3], &lsm);
    // Along axis 0 of [2, 3]: each column is softmax([a, a + 3]).
    let s0 = softmax(t(&x, &[2, 3]), 0).unwrap();
    let lo = (1.0 / (1.0 + 3.0f64.exp())) as f32;
    close(&s0, &[2, 3], &[lo, lo, lo, 1.0 - lo, 1.0 - lo, 1.0 - lo]);
}

#[test]
fn norms_by_hand() {
    let x = [1.0, 2.0, 3.0, 4.0];
    let rms = (7.5f64 + 1e-5).sqrt();
    let want: Vec<f32> = x.iter().map(|v| (*v as f64 / rms) as f32).collect();
    close(&rms_norm(t(&x, &[1, 4]), 1e-5).unwrap(), &[1, 4], &want);
    let scaled: Vec<f32> = want.iter().map(|v| v * 2.0).collect();
    close(
        &rms_norm_scale(t(&x, &[1, 4]), t(&[2.0; 4], &[4]), 1e-5).unwrap(),
        &[1, 4],
        &scaled,
    );
    let sd = (1.25f64 + 1e-5).sqrt();
    let ln: Vec<f32> = x.iter().map(|v| ((*v as f64 - 2.5) / sd) as f32).collect();
    close(&layer_norm(t(&x, &[4]), 1e-5).unwrap(), &[4], &ln);
    let aff: Vec<f32> = ln.iter().map(|v| v * 3.0 + 1.0).collect();
    let la = layer_norm_affine(t(&x, &[4]), t(&[3.0; 4], &[4]), t(&[1.0], &[1]), 1e-5).unwrap();
    close(&la, &[4], &aff);
    assert!(rms_norm_scale(t(&x, &[1, 4]), t(&[2.0; 2], &[2]), 1e-5).is_err());
    // batch_norm over [N=1, C=2, 2]: channel c uses mean[c], var[c].
    let bn = batch_norm(
        t(&x, &[1, 2, 2]),
        t(&[1.0, 3.0], &[2]),
        t(&[4.0, 1.0], &[2]),
        0.0,
    )
    .unwrap();
    close(&bn, &[1, 2, 2], &[0.0, 0.5, 0.0, 1.0]);
    assert!(batch_norm(
        t(&x, &[1, 2, 2]),
        t(&[1.0], &[1]),
        t(&[4.0, 1.0], &[2]),
        0.0
    )
    .is_err());
}

#[test]
fn transformer_ops_by_hand() {
    let table = [0.0, 1.0, 10.0, 11.0, 20.0, 21.0];
    let e = embedding(&[2, 0], &[2], t(&table, &[3, 2])).unwrap();
    close(&e, &[2, 2], &[20.0, 21.0, 0.0, 1.0]);
    // rope, D = 2: position 0 is the identity, position 1 rotates by 1 radian.
    let x = [1.0, 0.0, 1.0, 0.0];
    let r = rope(t(&x, &[1, 2, 1, 2]), 10_000.0).unwrap();
    close(&r, &[1, 2, 1, 2], &[1.0, 0.0, 1.0f32.cos(), 1.0f32.sin()]);
    // One visible key: the output is its value.
    let q = [1.0, 2.0];
    let a = attention(
        t(&q, &[1, 1, 1, 2]),
        t(&[3.0, 4.0], &[1, 1, 1, 2]),
        t(&[5.0, 6.0], &[1, 1, 1, 2]),
        true,
        None,
    )
    .unwrap();
    close(&a, &[1, 1, 1, 2], &[5.0, 6.0]);
    // Causal S = 2, T = 2, equal scores: query 0 sees v0, query 1 averages v0 and v1.
    let z = [0.0; 2];
    let v = [2.0, 4.0];
    let c = attention(
        t(&z, &[1, 2, 1, 1]),
        t(&z, &[1, 2, 1, 1]),
        t(&v, &[1, 2, 1, 1]),
        true,
        None,
    )
    .unwrap();
    close(&c, &[1, 2, 1, 1], &[2.0, 3.0]);
    // Causal with S = 2 > T = 1: the first query sees nothing (zeros), the second sees key 0.
    let c = attention(
        t(&z, &[1, 2, 1, 1]),
        t(&z[..1], &[1, 1, 1, 1]),
        t(&v[..1], &[1, 1, 1, 1]),
        true,
        None,
    )
    .unwrap();
    close(&c, &[1, 2, 1, 1], &[0.0, 2.0]);
    // GQA: two query heads share one kv head.
    let g = attention(
        t(&[0.0, 0.0], &[1, 1, 2, 1]),
        t(&[1.0], &[1, 1, 1, 1]),
        t(&[7.0], &[1, 1, 1, 1]),
        false,
        Some(0.5),
    )
    .unwrap();
    close(&g, &[1, 1, 2, 1], &[7.0, 7.0]);
    let m = causal_mask(2);
    assert_eq!(m.data, vec![0.0, f32::NEG_INFINITY, 0.0, 0.0]);
}

#[test]
fn conv_and_pool_by_hand() {
    let x: Vec<f32> = (1..=9).map(|v| v as f32).collect();
    // 3×3 box filter with padding 1: centre output sums everything.
    let ones = [1.0; 9];
    let a = Conv2dAttrs {
        padding: [1, 1],
        ..Conv2dAttrs::default()
    };
    let c = conv2d(t(&x, &[1, 1, 3, 3]), t(&ones, &[1, 1, 3, 3]), &a).unwrap();
    close(
        &c,
        &[1, 1, 3, 3],
        &[12.0, 21.0, 16.0, 27.0, 45.0, 33.0, 24.0, 39.0, 28.0],
    );
    // Stride 2, dilation 2: one output reading the corners.
    let a = Conv2dAttrs {
        stride: [2, 2],
        dilation: [2, 2],
        ..Conv2dAttrs::default()
    };
    let c = conv2d(
        t(&x, &[1, 1, 3, 3]),
        t(&[1.0, 1.0, 1.0, 1.0], &[1, 1, 2, 2]),
        &a,
    )
    .unwrap();
    close(&c, &[1, 1, 1, 1], &[1.0 + 3.0 + 7.0 + 9.0]);
    let p = Pool2dAttrs {
        kernel: [2, 2],
        stride: [1, 1],
        padding: [0, 0],
    };
    close(
        &pool2d(t(&x, &[1, 1, 3, 3]), PoolKind::Max, &p).unwrap(),
        &[1, 1, 2, 2],
        &[5.0, 6.0, 8.0, 9.0],
    );
    // Average counts padding: corner window with padding 1 holds only x[0].
    let p = Pool2dAttrs {
        kernel: [2, 2],
        stride: [2, 2],
        padding: [1, 1],
    };
    let avg = pool2d(t(&x, &[1, 1, 3, 3]), PoolKind::Avg, &p).unwrap();
    close(&avg, &[1, 1, 2, 2], &[0.25, 1.25, 2.75, 7.0]);
    let ad = adaptive_avg_pool2d(t(&x, &[1, 1, 3, 3]), [2, 1]).unwrap();
    // Rows [0, 2) and [1, 3), all columns.
    close(&ad, &[1, 1, 2, 1], &[3.5, 6.5]);
}

#[test]
fn losses_by_hand() {
    let plain = CrossEntropyAttrs::default();
    let ce = cross_entropy(t(&[0.0; 6], &[2, 3]), &[0, 2], &[2], &plain).unwrap();
    close(&ce, &[], &[3.0f32.ln()]);
    assert!(cross_entropy(t(&[0.0; 6], &[2, 3]), &[0, 3], &[2], &plain).is_err());
    // Ignored rows leave the loss and the mean; all ignored is NaN (PyTorch).
    let x = [1.0, 0.0, 0.0, 5.0, -3.0, 2.0];
    let ce = cross_entropy(t(&x, &[2, 3]), &[0, -100], &[2], &plain).unwrap();
    let lse = (1f32.exp() + 2.0).ln();
    close(&ce, &[], &[lse - 1.0]);
    let ce = cross_entropy(t(&x, &[2, 3]), &[-100, -100], &[2], &plain).unwrap();
    assert!(ce.data[0].is_nan());
    let ignore_one = CrossEntropyAttrs {
        ignore_index: 1,
        label_smoothing: 0.1,
    };
    // (1 - ε)(lse - x[0]) + ε (lse - mean(x)).
    let ce = cross_entropy(t(&x, &[2, 3]), &[0, 1], &[2], &ignore_one).unwrap();
    close(&ce, &[], &[0.9 * (lse - 1.0) + 0.1 * (lse - 1.0 / 3.0)]);
    let g = cross_entropy_grad(t(&[0.0; 6], &[2, 3]), &[0, -100], &[2], 2.0, &plain).unwrap();
    let third = 1.0 / 3.0;
    close(
        &g,
        &[2, 3],
        &[2.0 * (third - 1.0), 2.0 * third, 2.0 * third, 0.0, 0.0, 0.0],
    );
    let g = cross_entropy_grad(t(&[0.0; 3], &[1, 3]), &[2], &[1], 1.0, &ignore_one).unwrap();
    let s = 0.1 / 3.0;
    close(&g, &[1, 3], &[third - s, third - s, third - 0.9 - s]);
    let mse = mse_loss(t(&[1.0, 2.0], &[2]), t(&[0.0], &[1])).unwrap();
    close(&mse, &[], &[2.5]);
}

/// Adam's first step moves each element by the learning rate against its gradient's sign
/// (`m̂ / √v̂ = ±1`): AdamW after its decay `p − lr·wd·p` (1 → 0.999 → 0.899), Adam with the
/// decay folded into the gradient (g = 0.5 + 0.01 → 1 − 0.1); a second element with a
/// negative gradient moves up. A gradient twice as large with a gradient scale of ½ is the same
/// gradient.
#[test]
fn adam_update_by_hand() {
    let (lr, beta1, beta2) = (0.1f32, 0.9, 0.999);
    let step = [lr, lr / (1.0 - beta1 as f32), (1.0 - beta2 as f32).sqrt()];
    let scalars = [step[0], step[1], step[2], 1.0];
    let (p, g, zeros) = ([1.0, 2.0], [0.5, -0.25], [0.0, 0.0]);
    let shape = [2];
    let attrs = |decoupled| AdamAttrs {
        beta1,
        beta2,
        eps: 1e-8,
        weight_decay: 0.01,
        decoupled,
    };
    for (decoupled, want_p, want_g) in [
        (true, [0.899, 2.098], [0.5, -0.25]),
        (false, [0.9, 2.1], [0.51, -0.23]),
    ] {
        let state = [
            t(&p, &shape),
            t(&g, &shape),
            t(&zeros, &shape),
            t(&zeros, &shape),
        ];
        let doubled = g.map(|x| 2.0 * x);
        let mut halved = state;
        halved[1] = t(&doubled, &shape);
        let scaled = [step[0], step[1], step[2], 0.5];
        for (state, scalars) in [(state, scalars), (halved, scaled)] {
            let got = adam_update(state, scalars, &attrs(decoupled)).unwrap();
            close(&got[0], &shape, &want_p);
            close(&got[1], &shape, &want_g.map(|g| 0.1 * g));
            close(&got[2], &shape, &want_g.map(|g| 0.001 * g * g));
        }
    }
    let short = [
        t(&p, &shape),
        t(&g, &shape),
        t(&zeros[..1], &[1]),
        t(&zeros, &shape),
    ];
    assert!(adam_update(short, scalars, &attrs(true)).is_err());
}
