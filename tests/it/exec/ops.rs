//! Every op of the registry through the executor (one-step modules, default kernel choices)
//! against the naive reference kernels. Tolerance: |got − want| ≤ 1e-5 + 1e-4·|want| (fast
//! kernels sum in another order and use vectorised exp/tanh/erf).

use mslc_core::ops::{Attrs, DType, Op, TensorType};
use mslc_kernels::conv::Conv2dAttrs;
use mslc_kernels::elementwise::{BinaryOp, CastTarget, UnaryOp};
use mslc_kernels::pool::{Pool2dAttrs, PoolKind};
use mslc_kernels::reduce::ReduceOp;
use mslc_kernels::{reference as r, Activation, Tensor, TensorRef};

use super::common::{array, assert_close, one_step, run_one, Rng};

const ATOL: f32 = 1e-5;
const RTOL: f32 = 1e-4;

/// One case: input dtypes, shapes and values, attributes, and the reference result.
struct Case {
    op: Op,
    attrs: Attrs,
    inputs: Vec<(DType, Vec<usize>, Vec<f32>)>,
}

impl Case {
    fn new(op: Op, attrs: Attrs) -> Case {
        Case {
            op,
            attrs,
            inputs: Vec::new(),
        }
    }

    fn input(mut self, dtype: DType, shape: &[usize], values: Vec<f32>) -> Case {
        self.inputs.push((dtype, shape.to_vec(), values));
        self
    }

    fn x(&self, i: usize) -> TensorRef<'_> {
        let (_, shape, values) = &self.inputs[i];
        TensorRef {
            data: values,
            shape,
        }
    }

    fn ids(&self, i: usize) -> Vec<i64> {
        self.inputs[i].2.iter().map(|&v| v as i64).collect()
    }

    /// Runs the case on 1 and 2 threads, checks both against `want` and each other.
    fn check(self, want: Tensor) {
        let types: Vec<TensorType> = self
            .inputs
            .iter()
            .map(|(d, s, _)| TensorType::new(*d, s.iter().map(|&x| x as i64).collect::<Vec<_>>()))
            .collect();
        let arrays: Vec<_> = self
            .inputs
            .iter()
            .map(|(d, s, v)| array(*d, s, v))
            .collect();
        CHECKED.with(|c| c.borrow_mut().insert(self.op));
        let module = one_step(self.op, self.attrs.clone(), &types);
        let one = run_one(module.clone(), &arrays, 1);
        let two = run_one(module, &arrays, 2);
        assert_close(self.op.name(), &one, &want.data, ATOL, RTOL);
        assert_eq!(
            one.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            two.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            "{}: 1 and 2 threads differ",
            self.op
        );
    }
}

/// The outputs of a multi-output op one after another, as `Case::check` compares them.
fn concatenated(parts: &[&Tensor]) -> Tensor {
    let data: Vec<f32> = parts.iter().flat_map(|t| t.data.iter().copied()).collect();
    Tensor::new("outputs", vec![data.len()], data).unwrap()
}

fn rand(seed: u64, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    Rng(seed).vec(n, lo, hi)
}

#[test]
fn elementwise_binary_ops_broadcast() {
    for (i, &bop) in BinaryOp::ALL.iter().enumerate() {
        let op = bop.op();
        for b_shape in [&[3, 1][..], &[2, 3, 4][..]] {
            let case = Case::new(op, Attrs::new())
                .input(DType::F32, &[2, 3, 4], rand(i as u64, 24, 0.5, 2.0))
                .input(
                    DType::F32,
                    b_shape,
                    rand(100 + i as u64, b_shape.iter().product(), 0.5, 2.0),
                );
            let want = r::binary(bop, case.x(0), case.x(1)).unwrap();
            case.check(want);
        }
    }
}

#[test]
fn elementwise_unary_ops() {
    for (i, &uop) in UnaryOp::ALL.iter().enumerate() {
        let op = uop.op();
        let positive = matches!(op, Op::Log | Op::Sqrt | Op::Rsqrt | Op::Reciprocal);
        let lo = if positive { 0.1 } else { -3.0 };
        let case =
            Case::new(op, Attrs::new()).input(DType::F32, &[3, 5], rand(i as u64, 15, lo, 3.0));
        let want = r::unary(uop, case.x(0)).unwrap();
        case.check(want);
    }
}

#[test]
fn constant_cast_dropout_reshape() {
    let attrs = Attrs::new().with("value", 2.5).with("dtype", DType::F32);
    Case::new(Op::Constant, attrs).check(r::constant(2.5));
    let case = Case::new(Op::Cast, Attrs::new().with("dtype", DType::F16)).input(
        DType::F32,
        &[4, 3],
        rand(1, 12, -70000.0, 70000.0),
    );
    let want = r::cast(case.x(0), CastTarget::F16).unwrap();
    case.check(want);
    let case = Case::new(Op::Cast, Attrs::new().with("dtype", DType::F32)).input(
        DType::F16,
        &[4],
        vec![1.5, -2.0, 0.25, 3.0],
    );
    let want = Tensor::new("t", vec![4], vec![1.5, -2.0, 0.25, 3.0]).unwrap();
    case.check(want);
    let case = Case::new(Op::Dropout, Attrs::new().with("p", 0.5)).input(
        DType::F32,
        &[5],
        rand(2, 5, -1.0, 1.0),
    );
    let want = r::dropout(case.x(0), 0.5, None, None).unwrap();
    case.check(want);
    // Training mode: a seed input and the op's salt pick the mask.
    let attrs = Attrs::new().with("p", 0.25).with("salt", 3i64);
    let case = Case::new(Op::Dropout, attrs)
        .input(DType::F32, &[4, 8], rand(4, 32, -1.0, 1.0))
        .input(DType::I64, &[], vec![12345.0]);
    let want = r::dropout(case.x(0), 0.25, Some((12345, 3)), None).unwrap();
    assert!(want.data.contains(&0.0), "some elements dropped");
    case.check(want);
    let case = Case::new(Op::Reshape, Attrs::new().with("shape", vec![3i64, 4])).input(
        DType::F32,
        &[2, 6],
        rand(3, 12, -1.0, 1.0),
    );
    let want = r::reshape(case.x(0), &[3, 4]).unwrap();
    case.check(want);
}

#[test]
fn matmul_and_fused_matmul() {
    for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
        let a_shape: &[usize] = if ta { &[2, 4, 3] } else { &[2, 3, 4] };
        let b_shape: &[usize] = if tb { &[5, 4] } else { &[4, 5] };
        let attrs = Attrs::new().with("transpose_a", ta).with("transpose_b", tb);
        let case = Case::new(Op::Matmul, attrs)
            .input(DType::F32, a_shape, rand(1, 24, -1.0, 1.0))
            .input(DType::F32, b_shape, rand(2, 20, -1.0, 1.0));
        let want = r::matmul(case.x(0), case.x(1), ta, tb).unwrap();
        case.check(want);
    }
    let attrs = Attrs::new()
        .with("transpose_b", true)
        .with("has_bias", true)
        .with("activation", "gelu");
    let case = Case::new(Op::FusedMatmul, attrs)
        .input(DType::F32, &[7, 9], rand(3, 63, -1.0, 1.0))
        .input(DType::F32, &[5, 9], rand(4, 45, -1.0, 1.0))
        .input(DType::F32, &[5], rand(5, 5, -1.0, 1.0));
    let want = r::fused_matmul(
        case.x(0),
        case.x(1),
        Some(case.x(2)),
        false,
        true,
        Activation::of_op(Op::Gelu).unwrap(),
    )
    .unwrap();
    case.check(want);
}

#[test]
fn layout_ops() {
    let case = Case::new(Op::Transpose, Attrs::new().with("perm", vec![2i64, 0, 1])).input(
        DType::F32,
        &[2, 3, 4],
        rand(1, 24, -1.0, 1.0),
    );
    let want = r::transpose(case.x(0), &[2, 0, 1]).unwrap();
    case.check(want);
    let case = Case::new(
        Op::BroadcastTo,
        Attrs::new().with("shape", vec![2i64, 3, 4]),
    )
    .input(DType::F32, &[3, 1], rand(2, 3, -1.0, 1.0));
    let want = r::broadcast_to(case.x(0), &[2, 3, 4]).unwrap();
    case.check(want);
    let case = Case::new(Op::Concat, Attrs::new().with("axis", 1i64))
        .input(DType::F32, &[2, 3], rand(3, 6, -1.0, 1.0))
        .input(DType::F32, &[2, 2], rand(4, 4, -1.0, 1.0));
    let want = r::concat(&[case.x(0), case.x(1)], 1).unwrap();
    case.check(want);
    let attrs = Attrs::new()
        .with("axis", 1i64)
        .with("start", 1i64)
        .with("end", 4i64);
    let case = Case::new(Op::Slice, attrs).input(DType::F32, &[4, 5], rand(5, 20, -1.0, 1.0));
    let want = r::slice(case.x(0), 1, 1, 4).unwrap();
    case.check(want);
    let attrs = Attrs::new().with("axis", 0i64).with("index", 2i64);
    let case = Case::new(Op::Select, attrs).input(DType::F32, &[3, 4], rand(6, 12, -1.0, 1.0));
    let want = r::select(case.x(0), 0, 2).unwrap();
    case.check(want);
}

#[test]
fn reductions_and_softmax() {
    for (op, rop) in [
        (Op::Sum, ReduceOp::Sum),
        (Op::Mean, ReduceOp::Mean),
        (Op::Max, ReduceOp::Max),
    ] {
        for (axes, keepdim) in [(vec![1i64], false), (vec![0, 2], true)] {
            let attrs = Attrs::new()
                .with("axes", axes.clone())
                .with("keepdim", keepdim);
            let case = Case::new(op, attrs).input(DType::F32, &[2, 3, 4], rand(1, 24, -1.0, 1.0));
            let want = r::reduce(case.x(0), rop, &axes, keepdim).unwrap();
            case.check(want);
        }
        let case = Case::new(op, Attrs::new()).input(DType::F32, &[2, 3], rand(2, 6, -1.0, 1.0));
        let want = r::reduce(case.x(0), rop, &[0, 1], false).unwrap();
        case.check(want);
    }
    let case =
        Case::new(Op::SquareSum, Attrs::new()).input(DType::F32, &[3, 5], rand(5, 15, -2.0, 2.0));
    let want = r::square_sum(case.x(0)).unwrap();
    case.check(want);
    // And with the overflow check: 0 for finite values, NaN with an infinite one among them.
    for bad in [None, Some(f32::INFINITY)] {
        let mut x = rand(6, 15, -2.0, 2.0);
        if let Some(bad) = bad {
            x[7] = bad;
        }
        let case = Case::new(Op::SquareSumFinite, Attrs::new()).input(DType::F32, &[3, 5], x);
        let want = r::square_sum_finite(case.x(0)).unwrap();
        assert_eq!(want[1].data[0].is_nan(), bad.is_some());
        case.check(concatenated(&want.iter().collect::<Vec<_>>()));
    }
    for axis in [-1i64, 0] {
        let case = Case::new(Op::Softmax, Attrs::new().with("axis", axis)).input(
            DType::F32,
            &[3, 7],
            rand(3, 21, -4.0, 4.0),
        );
        let want = r::softmax(case.x(0), axis).unwrap();
        case.check(want);
        let case = Case::new(Op::LogSoftmax, Attrs::new().with("axis", axis)).input(
            DType::F32,
            &[3, 7],
            rand(4, 21, -4.0, 4.0),
        );
        let want = r::log_softmax(case.x(0), axis).unwrap();
        case.check(want);
    }
}

#[test]
fn norms() {
    let eps = Attrs::new().with("eps", 1e-5);
    let case =
        Case::new(Op::RmsNorm, eps.clone()).input(DType::F32, &[3, 8], rand(1, 24, -2.0, 2.0));
    let want = r::rms_norm(case.x(0), 1e-5).unwrap();
    case.check(want);
    let case =
        Case::new(Op::LayerNorm, eps.clone()).input(DType::F32, &[3, 8], rand(2, 24, -2.0, 2.0));
    let want = r::layer_norm(case.x(0), 1e-5).unwrap();
    case.check(want);
    let case = Case::new(Op::RmsNormScale, eps.clone())
        .input(DType::F32, &[3, 8], rand(3, 24, -2.0, 2.0))
        .input(DType::F32, &[8], rand(4, 8, 0.5, 1.5));
    let want = r::rms_norm_scale(case.x(0), case.x(1), 1e-5).unwrap();
    case.check(want);
    let case = Case::new(Op::LayerNormAffine, eps.clone())
        .input(DType::F32, &[3, 8], rand(5, 24, -2.0, 2.0))
        .input(DType::F32, &[8], rand(6, 8, 0.5, 1.5))
        .input(DType::F32, &[8], rand(7, 8, -0.5, 0.5));
    let want = r::layer_norm_affine(case.x(0), case.x(1), case.x(2), 1e-5).unwrap();
    case.check(want);
    let case = Case::new(Op::BatchNorm, eps)
        .input(DType::F32, &[2, 3, 4], rand(8, 24, -2.0, 2.0))
        .input(DType::F32, &[3], rand(9, 3, -0.5, 0.5))
        .input(DType::F32, &[3], rand(10, 3, 0.5, 2.0));
    let want = r::batch_norm(case.x(0), case.x(1), case.x(2), 1e-5).unwrap();
    case.check(want);
}

#[test]
fn transformer_ops() {
    let ids: Vec<f32> = vec![0.0, 4.0, 2.0, 2.0, 1.0, 3.0];
    for dtype in [DType::I32, DType::I64] {
        let case = Case::new(Op::Embedding, Attrs::new())
            .input(dtype, &[2, 3], ids.clone())
            .input(DType::F32, &[5, 4], rand(1, 20, -1.0, 1.0));
        let want = r::embedding(&case.ids(0), &[2, 3], case.x(1)).unwrap();
        case.check(want);
    }
    let case = Case::new(Op::Rope, Attrs::new().with("theta", 10000.0)).input(
        DType::F32,
        &[1, 5, 2, 8],
        rand(2, 80, -1.0, 1.0),
    );
    let want = r::rope(case.x(0), 10000.0).unwrap();
    case.check(want);
    // What the fusion pass splits a rope into: its cos/sin table as a value of its own, and
    // the rotation reading it.
    let (positions, half) = (5usize, 4usize);
    let mut table = vec![0f32; 2 * positions * half];
    for p in 0..positions {
        for i in 0..half {
            let angle = p as f64 * 10000f64.powf(-(i as f64) / half as f64);
            table[p * half + i] = angle.cos() as f32;
            table[(positions + p) * half + i] = angle.sin() as f32;
        }
    }
    let attrs = Attrs::new()
        .with("theta", 10000.0)
        .with("positions", positions as i64)
        .with("dim", 2 * half as i64);
    let want = Tensor::new("rope_table", vec![2, positions, half], table.clone()).unwrap();
    Case::new(Op::RopeTable, attrs).check(want);
    let case = Case::new(Op::RopeCached, Attrs::new())
        .input(DType::F32, &[1, 5, 2, 8], rand(2, 80, -1.0, 1.0))
        .input(DType::F32, &[2, positions, half], table);
    let want = r::rope(case.x(0), 10000.0).unwrap();
    case.check(want);
    for causal in [false, true] {
        let case = Case::new(Op::Attention, Attrs::new().with("causal", causal))
            .input(DType::F32, &[2, 6, 4, 8], rand(3, 384, -1.0, 1.0))
            .input(DType::F32, &[2, 6, 2, 8], rand(4, 192, -1.0, 1.0))
            .input(DType::F32, &[2, 6, 2, 8], rand(5, 192, -1.0, 1.0));
        let want = r::attention(case.x(0), case.x(1), case.x(2), causal, None).unwrap();
        case.check(want);
    }
    let attrs = Attrs::new().with("size", 4i64).with("dtype", DType::F32);
    Case::new(Op::CausalMask, attrs).check(r::causal_mask(4));
}

/// A conv2d of x [2, 4, H, W] by a weight [6, 4, 3, 3] that is a parameter, packed ahead by
/// the executor, both of `dtype` (values drawn from `seed` and rounded to it), stride
/// `stride`, padding 1: an executor on `threads` threads with the weight loaded and x set,
/// and the reference's output.
fn packed_conv(
    hw: [usize; 2],
    stride: usize,
    dtype: DType,
    seed: u64,
    threads: usize,
) -> (mslc_exec::Executor, Vec<f32>) {
    use mslc_artifact::Storage;
    use mslc_io::safetensors::StDType;
    let attrs = Attrs::new()
        .with("stride", vec![stride as i64; 2])
        .with("padding", vec![1i64, 1]);
    let (xs, ws) = ([2, 4, hw[0], hw[1]], [6, 4, 3, 3]);
    let stored = |v: Vec<f32>| -> Vec<f32> {
        match dtype {
            DType::F16 => v
                .into_iter()
                .map(|x| half::f16::from_f32(x).to_f32())
                .collect(),
            _ => v,
        }
    };
    let x = stored(rand(seed, 2 * 4 * hw[0] * hw[1], -1.0, 1.0));
    let w = stored(rand(seed + 1, 216, -1.0, 1.0));
    let types = [xs, ws].map(|s| TensorType::new(dtype, s.map(|d| d as i64).to_vec()));
    let mut module = one_step(Op::Conv2d, attrs, &types);
    module.values[1].storage = Storage::Param {
        path: "w".into(),
        init: mslc_core::program::Init::Ones,
        trainable: true,
    };
    let needs = mslc_artifact::runtime::RuntimeNeeds::of(&module).unwrap();
    assert!(
        needs.steps[0].packed_b.is_some(),
        "the weight is packed ahead"
    );
    let conv = Conv2dAttrs {
        stride: [stride; 2],
        padding: [1, 1],
        ..Conv2dAttrs::default()
    };
    let (xt, wt) = (
        TensorRef::new("x", &x, &xs).unwrap(),
        TensorRef::new("w", &w, &ws).unwrap(),
    );
    let want = r::conv2d(xt, wt, &conv).unwrap();
    let mut exec = super::common::executor(module, threads);
    let (bytes, st): (Vec<u8>, _) = match dtype {
        DType::F16 => (
            w.iter()
                .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
                .collect(),
            StDType::F16,
        ),
        _ => (
            w.iter().flat_map(|v| v.to_le_bytes()).collect(),
            StDType::F32,
        ),
    };
    let weight = mslc_io::safetensors::TensorRef {
        name: "w",
        dtype: st,
        shape: &ws,
        data: &bytes,
    };
    exec.load_weights([weight]).unwrap();
    exec.set_input("x0", &array(dtype, &xs, &x)).unwrap();
    (exec, want.data)
}

/// A conv2d weight that is a parameter is packed once ahead by the executor, in the layout
/// its step multiplies it in: on the right of the patches for few output positions (2×2), on
/// their left for many (5×6) — the reference's values either way, on 1 and 2 threads.
#[test]
fn conv_weights_packed_ahead_match_the_reference_in_either_layout() {
    for (hw, stride) in [([3, 3], 2), ([5, 6], 1)] {
        for threads in [1, 2] {
            let (mut exec, want) = packed_conv(hw, stride, DType::F32, 5, threads);
            exec.run().unwrap();
            let got = exec.output_f32("y").unwrap().1;
            assert_close("conv2d, weight packed ahead", &got, &want, ATOL, RTOL);
        }
    }
}

/// A conv2d weight stored in f16 that is packed ahead is converted and packed by the first
/// run alone: the later runs read the packed copy and not the weight (it was converted to f32
/// on every run, only to be thrown away: 1.6–1.8 ms of each 3×3 conv of resnet50's last stage
/// at 64×64), with the first run's bits, in either layout, within f16's rounding of the
/// reference.
#[test]
fn an_f16_weight_packed_ahead_gives_every_run_the_same_bits() {
    for (hw, stride) in [([3, 3], 2), ([5, 6], 1)] {
        let (mut exec, want) = packed_conv(hw, stride, DType::F16, 7, 2);
        let runs: Vec<Vec<u32>> = (0..3)
            .map(|_| {
                exec.run().unwrap();
                let got = exec.output_f32("y").unwrap().1;
                assert_close("f16 conv2d, weight packed ahead", &got, &want, 1e-2, 1e-2);
                got.iter().map(|v| v.to_bits()).collect()
            })
            .collect();
        assert_eq!(runs[0], runs[1], "{hw:?}");
        assert_eq!(runs[0], runs[2], "{hw:?}");
    }
}

#[test]
fn vision_ops() {
    let attrs = Attrs::new()
        .with("stride", vec![2i64, 1])
        .with("padding", vec![1i64, 1])
        .with("groups", 1i64);
    let case = Case::new(Op::Conv2d, attrs)
        .input(DType::F32, &[2, 2, 5, 6], rand(1, 120, -1.0, 1.0))
        .input(DType::F32, &[3, 2, 3, 3], rand(2, 54, -1.0, 1.0));
    let conv = Conv2dAttrs {
        stride: [2, 1],
        padding: [1, 1],
        dilation: [1, 1],
        groups: 1,
    };
    let want = r::conv2d(case.x(0), case.x(1), &conv).unwrap();
    case.check(want);
    for (op, kind) in [
        (Op::MaxPool2d, PoolKind::Max),
        (Op::AvgPool2d, PoolKind::Avg),
    ] {
        let attrs = Attrs::new()
            .with("kernel", vec![3i64, 2])
            .with("stride", vec![2i64, 2])
            .with("padding", vec![1i64, 0]);
        let case = Case::new(op, attrs).input(DType::F32, &[1, 2, 6, 7], rand(3, 84, -1.0, 1.0));
        let pool = Pool2dAttrs {
            kernel: [3, 2],
            stride: [2, 2],
            padding: [1, 0],
        };
        let want = r::pool2d(case.x(0), kind, &pool).unwrap();
        case.check(want);
    }
    let case = Case::new(
        Op::AdaptiveAvgPool2d,
        Attrs::new().with("output", vec![2i64, 3]),
    )
    .input(DType::F32, &[1, 2, 5, 7], rand(4, 70, -1.0, 1.0));
    let want = r::adaptive_avg_pool2d(case.x(0), [2, 3]).unwrap();
    case.check(want);
}

#[test]
fn neural_net_backward_ops() {
    let eps = Attrs::new().with("eps", 1e-5);
    for op in [Op::RmsNormGrad, Op::LayerNormGrad] {
        let case = Case::new(op, eps.clone())
            .input(DType::F32, &[3, 8], rand(1, 24, -2.0, 2.0))
            .input(DType::F32, &[3, 8], rand(2, 24, -1.0, 1.0));
        let want = if op == Op::RmsNormGrad {
            r::rms_norm_grad(case.x(0), case.x(1), 1e-5)
        } else {
            r::layer_norm_grad(case.x(0), case.x(1), 1e-5)
        };
        case.check(want.unwrap());
    }
    for (op, centered) in [
        (Op::RmsNormScaleGrad, false),
        (Op::LayerNormAffineGrad, true),
    ] {
        let case = Case::new(op, eps.clone())
            .input(DType::F32, &[3, 8], rand(1, 24, -2.0, 2.0))
            .input(DType::F32, &[8], rand(3, 8, -1.5, 1.5))
            .input(DType::F32, &[3, 8], rand(2, 24, -1.0, 1.0));
        let want = r::norm_affine_grad(centered, case.x(0), case.x(1), case.x(2), 1e-5).unwrap();
        case.check(concatenated(&want.iter().collect::<Vec<_>>()));
    }
    let case = Case::new(Op::EmbeddingGrad, Attrs::new().with("vocab", 5i64))
        .input(DType::I64, &[2, 3], vec![0.0, 4.0, 2.0, 2.0, 1.0, 2.0])
        .input(DType::F32, &[2, 3, 4], rand(3, 24, -1.0, 1.0));
    let want = r::embedding_grad(&case.ids(0), &[2, 3], case.x(1), 5).unwrap();
    case.check(want);
    let (qs, ks) = ([2usize, 5, 4, 8], [2usize, 6, 2, 8]);
    let q = rand(4, 2 * 5 * 4 * 8, -1.0, 1.0);
    let (kv, v) = (rand(5, 192, -1.0, 1.0), rand(6, 192, -1.0, 1.0));
    let t = |data, shape| TensorRef { data, shape };
    for causal in [false, true] {
        let a = Attrs::new().with("causal", causal);
        let case = Case::new(Op::AttentionLse, a.clone())
            .input(DType::F32, &qs, q.clone())
            .input(DType::F32, &ks, kv.clone())
            .input(DType::F32, &ks, v.clone());
        let (qt, kt, vt) = (t(&q, &qs), t(&kv, &ks), t(&v, &ks));
        let lse = r::attention_lse(qt, kt, vt, causal, None).unwrap();
        let out = r::attention(qt, kt, vt, causal, None).unwrap();
        case.check(concatenated(&[&out, &lse]));
        let dout = rand(7, q.len(), -1.0, 1.0);
        let case = Case::new(Op::AttentionGrad, a.clone())
            .input(DType::F32, &qs, q.clone())
            .input(DType::F32, &ks, kv.clone())
            .input(DType::F32, &ks, v.clone())
            .input(DType::F32, &qs, out.data.clone())
            .input(DType::F32, &qs, dout.clone())
            .input(DType::F32, &lse.shape, lse.data.clone());
        let grads: Vec<Tensor> = (0..3)
            .map(|wrt| {
                let x = |i| case.x(i);
                r::attention_grad(x(0), x(1), x(2), x(3), x(4), x(5), causal, None, wrt).unwrap()
            })
            .collect();
        case.check(concatenated(&grads.iter().collect::<Vec<_>>()));
    }
    let conv = Conv2dAttrs {
        stride: [2, 1],
        padding: [1, 1],
        dilation: [1, 2],
        groups: 2,
    };
    let window = Attrs::new()
        .with("stride", vec![2i64, 1])
        .with("padding", vec![1i64, 1])
        .with("dilation", vec![1i64, 2])
        .with("groups", 2i64);
    // x [2, 4, 5, 6], w [6, 2, 3, 2] → y [2, 6, 3, 6].
    let case = Case::new(
        Op::Conv2dGradInput,
        window.clone().with("size", vec![5i64, 6]),
    )
    .input(DType::F32, &[2, 6, 3, 6], rand(8, 216, -1.0, 1.0))
    .input(DType::F32, &[6, 2, 3, 2], rand(9, 72, -1.0, 1.0));
    let want = r::conv2d_grad_input(case.x(0), case.x(1), &conv, [5, 6]).unwrap();
    case.check(want);
    let case = Case::new(Op::Conv2dGradWeight, window.with("kernel", vec![3i64, 2]))
        .input(DType::F32, &[2, 4, 5, 6], rand(10, 240, -1.0, 1.0))
        .input(DType::F32, &[2, 6, 3, 6], rand(8, 216, -1.0, 1.0));
    let want = r::conv2d_grad_weight(case.x(0), case.x(1), &conv, [3, 2]).unwrap();
    case.check(want);
    let pool = Pool2dAttrs {
        kernel: [3, 2],
        stride: [2, 2],
        padding: [1, 0],
    };
    for (op, kind) in [
        (Op::MaxPool2dGrad, PoolKind::Max),
        (Op::AvgPool2dGrad, PoolKind::Avg),
    ] {
        let attrs = Attrs::new()
            .with("kernel", vec![3i64, 2])
            .with("stride", vec![2i64, 2])
            .with("padding", vec![1i64, 0]);
        // x [1, 2, 6, 7] → y [1, 2, 3, 3].
        let case = Case::new(op, attrs)
            .input(DType::F32, &[1, 2, 6, 7], rand(11, 84, -1.0, 1.0))
            .input(DType::F32, &[1, 2, 3, 3], rand(12, 18, -1.0, 1.0));
        let want = r::pool2d_grad(case.x(0), case.x(1), kind, &pool).unwrap();
        case.check(want);
    }
    let case = Case::new(
        Op::AdaptiveAvgPool2dGrad,
        Attrs::new().with("output", vec![2i64, 3]),
    )
    .input(DType::F32, &[1, 2, 5, 7], rand(13, 70, -1.0, 1.0))
    .input(DType::F32, &[1, 2, 2, 3], rand(14, 12, -1.0, 1.0));
    let want = r::adaptive_avg_pool2d_grad(case.x(0), case.x(1), [2, 3]).unwrap();
    case.check(want);
}

#[test]
fn losses_and_fused_elementwise() {
    let case = Case::new(Op::CrossEntropy, Attrs::new())
        .input(DType::F32, &[4, 6], rand(1, 24, -2.0, 2.0))
        .input(DType::I32, &[4], vec![0.0, 5.0, 2.0, 3.0]);
    let plain = r::CrossEntropyAttrs::default();
    let want = r::cross_entropy(case.x(0), &case.ids(1), &[4], &plain).unwrap();
    case.check(want);
    // PyTorch's ignore_index and label_smoothing, in the loss and its fused gradient.
    let ce = r::CrossEntropyAttrs {
        ignore_index: 3,
        label_smoothing: 0.2,
    };
    let attrs = Attrs::new()
        .with("ignore_index", 3i64)
        .with("label_smoothing", 0.2);
    let case = Case::new(Op::CrossEntropy, attrs.clone())
        .input(DType::F32, &[4, 6], rand(1, 24, -2.0, 2.0))
        .input(DType::I32, &[4], vec![0.0, 3.0, 2.0, 3.0]);
    let want = r::cross_entropy(case.x(0), &case.ids(1), &[4], &ce).unwrap();
    case.check(want);
    let case = Case::new(Op::CrossEntropyGrad, attrs)
        .input(DType::F32, &[4, 6], rand(1, 24, -2.0, 2.0))
        .input(DType::I32, &[4], vec![0.0, 3.0, 2.0, 3.0])
        .input(DType::F32, &[], vec![0.5]);
    let want = r::cross_entropy_grad(case.x(0), &case.ids(1), &[4], 0.5, &ce).unwrap();
    case.check(want);
    let case = Case::new(Op::MseLoss, Attrs::new())
        .input(DType::F32, &[3, 4], rand(2, 12, -1.0, 1.0))
        .input(DType::F32, &[3, 4], rand(3, 12, -1.0, 1.0));
    let want = r::mse_loss(case.x(0), case.x(1)).unwrap();
    case.check(want);
    let attrs = Attrs::new().with("program", "silu(x0); mul(t0, x1); add(t1, x0)");
    let case = Case::new(Op::FusedElementwise, attrs)
        .input(DType::F32, &[3, 4], rand(4, 12, -2.0, 2.0))
        .input(DType::F32, &[4], rand(5, 4, -2.0, 2.0));
    let silu = r::unary(UnaryOp::Silu, case.x(0)).unwrap();
    let prod = r::binary(BinaryOp::Mul, silu.view(), case.x(1)).unwrap();
    let want = r::binary(BinaryOp::Add, prod.view(), case.x(0)).unwrap();
    case.check(want);
}

/// The collectives on two ranks (threads, each its own executor): rank r's input is
/// `x + 100·r`; the results against the sum, concatenation and split computed here.
#[test]
fn collectives_on_two_ranks() {
    use mslc_exec::collectives::{threads::world, Collectives, Mesh};
    let x = rand(6, 12, -1.0, 1.0);
    let mine = |r: usize| -> Vec<f32> { x.iter().map(|v| v + 100.0 * r as f32).collect() };
    let group = |dim: Option<i64>| {
        let a = Attrs::new().with("axis", "mp").with("ranks", 2i64);
        dim.map_or(a.clone(), |d| a.with("dim", d))
    };
    let run = |op: Op, attrs: Attrs| -> Vec<Vec<f32>> {
        CHECKED.with(|c| c.borrow_mut().insert(op));
        let ty = TensorType::new(DType::F32, [2, 6]);
        let module = one_step(op, attrs, &[ty]);
        let ranks = world(Mesh::line("mp", 2).unwrap());
        std::thread::scope(|scope| {
            let handles: Vec<_> = ranks
                .into_iter()
                .map(|comm| {
                    let (module, input) = (module.clone(), mine(comm.rank()));
                    scope.spawn(move || {
                        let mut exec = super::common::executor(module, 1);
                        exec.set_collectives(Box::new(comm));
                        exec.set_input("x0", &array(DType::F32, &[2, 6], &input))
                            .unwrap();
                        exec.run().unwrap();
                        exec.output_f32("y").unwrap().1
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    };
    let (a, b) = (mine(0), mine(1));
    let sum: Vec<f32> = a.iter().zip(&b).map(|(p, q)| p + q).collect();
    for got in run(Op::AllReduce, group(None)) {
        assert_close("all_reduce", &got, &sum, ATOL, RTOL);
    }
    for got in run(Op::ParallelCopy, group(None)).iter().zip([&a, &b]) {
        assert_close("parallel_copy", got.0, got.1, 0.0, 0.0);
    }
    // Gathered along dim 1: each row is rank 0's row then rank 1's.
    let rows = |v: &[f32], r: usize| v[r * 6..r * 6 + 6].to_vec();
    let gathered: Vec<f32> = (0..2)
        .flat_map(|r| [rows(&a, r), rows(&b, r)].concat())
        .collect();
    for got in run(Op::AllGather, group(Some(1))) {
        assert_close("all_gather", &got, &gathered, 0.0, 0.0);
    }
    // Scattered along dim 0: rank r keeps row r of the sum.
    for (r, got) in run(Op::ReduceScatter, group(Some(0))).iter().enumerate() {
        assert_close("reduce_scatter", got, &rows(&sum, r), ATOL, RTOL);
    }
    // Sliced along dim 0: rank r keeps row r of its own input.
    for (r, got) in run(Op::RankSlice, group(Some(0))).iter().enumerate() {
        assert_close("rank_slice", got, &rows(&mine(r), r), 0.0, 0.0);
    }
}

/// The test that runs each op. An exhaustive `match`: a new op does not compile until it is
/// given one, and [`every_op_has_a_case_here`] checks that the test really runs it.
fn covering_test(op: Op) -> fn() {
    match op {
        Op::Add | Op::Sub | Op::Mul | Op::Div | Op::Pow | Op::Maximum | Op::Minimum => {
            elementwise_binary_ops_broadcast
        }
        Op::Neg
        | Op::Exp
        | Op::Log
        | Op::Sqrt
        | Op::Rsqrt
        | Op::Reciprocal
        | Op::Abs
        | Op::Tanh
        | Op::Sigmoid
        | Op::Relu
        | Op::Gelu
        | Op::GeluTanh
        | Op::Silu
        | Op::Erf
        | Op::Softplus
        | Op::Sign => elementwise_unary_ops,
        Op::Constant | Op::Cast | Op::Dropout | Op::Reshape => constant_cast_dropout_reshape,
        Op::Matmul | Op::FusedMatmul => matmul_and_fused_matmul,
        Op::Transpose | Op::BroadcastTo | Op::Concat | Op::Slice | Op::Select => layout_ops,
        Op::Sum
        | Op::Mean
        | Op::Max
        | Op::SquareSum
        | Op::SquareSumFinite
        | Op::Softmax
        | Op::LogSoftmax => reductions_and_softmax,
        Op::RmsNorm | Op::RmsNormScale | Op::LayerNorm | Op::LayerNormAffine | Op::BatchNorm => {
            norms
        }
        Op::Embedding
        | Op::Rope
        | Op::RopeTable
        | Op::RopeCached
        | Op::Attention
        | Op::CausalMask => transformer_ops,
        Op::Conv2d | Op::MaxPool2d | Op::AvgPool2d | Op::AdaptiveAvgPool2d => vision_ops,
        Op::CrossEntropy | Op::CrossEntropyGrad | Op::MseLoss | Op::FusedElementwise => {
            losses_and_fused_elementwise
        }
        Op::RmsNormGrad
        | Op::LayerNormGrad
        | Op::RmsNormScaleGrad
        | Op::LayerNormAffineGrad
        | Op::EmbeddingGrad
        | Op::AttentionLse
        | Op::AttentionGrad
        | Op::Conv2dGradInput
        | Op::Conv2dGradWeight
        | Op::MaxPool2dGrad
        | Op::AvgPool2dGrad
        | Op::AdaptiveAvgPool2dGrad => neural_net_backward_ops,
        Op::AllReduce | Op::ParallelCopy | Op::AllGather | Op::ReduceScatter | Op::RankSlice => {
            collectives_on_two_ranks
        }
        Op::AdamUpdate => adam_update_as_torch,
        Op::SgdUpdate => sgd_update_as_torch,
    }
}

/// `adam_update` against `torch.optim.Adam` / `AdamW`'s step written out in f64, at step 3:
/// Adam with L2 decay, AdamW with decoupled decay, and neither.
#[test]
fn adam_update_as_torch() {
    let (b1, b2, eps, lr, t) = (0.9f64, 0.95f64, 1e-8f64, 1e-2f64, 3);
    let step_size = lr / (1.0 - b1.powi(t));
    let bc2_sqrt = (1.0 - b2.powi(t)).sqrt();
    let [p, g, m] = [11, 12, 13].map(|seed| rand(seed, 15, -1.0, 1.0));
    let v = rand(14, 15, 0.0, 0.5);
    for (wd, decoupled) in [(0.1, true), (0.05, false), (0.0, true)] {
        let attrs = Attrs::new()
            .with("beta1", b1)
            .with("beta2", b2)
            .with("eps", eps)
            .with("weight_decay", wd)
            .with("decoupled", decoupled);
        let scalar = |x: f64| vec![x as f32];
        let mut case = Case::new(Op::AdamUpdate, attrs);
        for x in [&p, &g, &m, &v] {
            case = case.input(DType::F32, &[3, 5], x.clone());
        }
        for x in [lr, step_size, bc2_sqrt] {
            case = case.input(DType::F32, &[], scalar(x));
        }
        let mut want = vec![Vec::new(); 3];
        for i in 0..15 {
            let (mut pi, mut gi) = (p[i] as f64, g[i] as f64);
            if decoupled {
                pi *= 1.0 - lr * wd;
            } else {
                gi += wd * pi;
            }
            let mi = b1 * m[i] as f64 + (1.0 - b1) * gi;
            let vi = b2 * v[i] as f64 + (1.0 - b2) * gi * gi;
            let new_p = pi - step_size * mi / (vi.sqrt() / bc2_sqrt + eps);
            for (k, x) in [new_p, mi, vi].into_iter().enumerate() {
                want[k].push(x as f32);
            }
        }
        let data = want.concat();
        case.check(Tensor::new("outputs", vec![data.len()], data).unwrap());
    }
}

/// SGD with momentum as `torch.optim.SGD` steps (dampening 0): plain, with decay and a gradient
/// scale, and Nesterov's.
#[test]
fn sgd_update_as_torch() {
    let (lr, momentum) = (0.1f64, 0.9f64);
    let [p, g, buf] = [21, 22, 23].map(|seed| rand(seed, 15, -1.0, 1.0));
    for (wd, nesterov, g_scale) in [
        (0.0, false, None),
        (1e-2, false, Some(0.25)),
        (1e-2, true, None),
    ] {
        let attrs = Attrs::new()
            .with("momentum", momentum)
            .with("weight_decay", wd)
            .with("nesterov", nesterov);
        let mut case = Case::new(Op::SgdUpdate, attrs);
        for x in [&p, &g, &buf] {
            case = case.input(DType::F32, &[3, 5], x.clone());
        }
        case = case.input(DType::F32, &[], vec![lr as f32]);
        if let Some(s) = g_scale {
            case = case.input(DType::F32, &[], vec![s as f32]);
        }
        let mut want = vec![Vec::new(); 2];
        for i in 0..15 {
            let gi = g[i] as f64 * g_scale.unwrap_or(1.0) + wd * p[i] as f64;
            let bi = momentum * buf[i] as f64 + gi;
            let d = if nesterov { gi + momentum * bi } else { bi };
            for (k, x) in [p[i] as f64 - lr * d, bi].into_iter().enumerate() {
                want[k].push(x as f32);
            }
        }
        let data = want.concat();
        case.check(Tensor::new("outputs", vec![data.len()], data).unwrap());
    }
}

thread_local! {
    /// The ops [`Case::check`] ran on this thread.
    static CHECKED: std::cell::RefCell<std::collections::BTreeSet<Op>> =
        const { std::cell::RefCell::new(std::collections::BTreeSet::new()) };
}

#[test]
fn every_op_has_a_case_here() {
    for &op in Op::ALL {
        CHECKED.with(|c| c.borrow_mut().clear());
        covering_test(op)();
        assert!(
            CHECKED.with(|c| c.borrow().contains(&op)),
            "`{op}` is said to be covered by a test that never runs it"
        );
    }
}
