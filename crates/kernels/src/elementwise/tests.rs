//! Fused elementwise evaluation against per-element evaluation (exactly) and against the
//! reference (within the math tolerances), with broadcasting, blocks and thread counts.

use super::*;
use crate::reference;
use crate::testing::{
    assert_close, assert_close_in, assert_same_bits, assert_same_values, in_pool, Precision, Rng,
};
use crate::TensorRef;
use proptest::prelude::*;

/// Every cast target: each has its own loop in the evaluator.
const CASTS: [CastTarget; 7] = [
    CastTarget::F64,
    CastTarget::F32,
    CastTarget::F16,
    CastTarget::Bf16,
    CastTarget::I64,
    CastTarget::I32,
    CastTarget::Bool,
];

/// A random program over `inputs` inputs: loads first, then ops on earlier registers.
fn program(inputs: usize, len: usize, rng: &mut Rng) -> Program {
    let mut instrs: Vec<Instr> = (0..inputs).map(Instr::Input).collect();
    for _ in 0..len {
        let n = instrs.len();
        instrs.push(match rng.below(5) {
            0 => Instr::Const(rng.uniform() * 3.0),
            1 => Instr::Unary {
                op: UnaryOp::ALL[rng.below(UnaryOp::ALL.len())],
                x: rng.below(n),
            },
            2 => Instr::Cast {
                to: CASTS[rng.below(CASTS.len())],
                x: rng.below(n),
            },
            _ => Instr::Binary {
                op: BinaryOp::ALL[rng.below(BinaryOp::ALL.len())],
                a: rng.below(n),
                b: rng.below(n),
            },
        });
    }
    Program { instrs }
}

/// Shapes that broadcast to `out`: each dim kept or set to 1, some leading dims dropped.
fn input_shape(out: &[usize], rng: &mut Rng) -> Vec<usize> {
    let drop = rng.below(out.len() + 1);
    out[drop..]
        .iter()
        .map(|&d| if rng.below(3) == 0 { 1 } else { d })
        .collect()
}

/// The program on one element, with the same fast scalar ops the evaluator uses.
fn eval_one(p: &Program, inputs: &[f32]) -> f32 {
    let mut regs: Vec<f32> = Vec::new();
    for instr in &p.instrs {
        let v = match *instr {
            Instr::Input(n) => inputs[n],
            Instr::Const(c) => c,
            Instr::Unary { op, x } => {
                let mut v = [regs[x]];
                slice::unary_in_place(op, &mut v);
                v[0]
            }
            Instr::Cast { to, x } => to.apply(regs[x]),
            Instr::Binary { op, a, b } => apply_binary(op, regs[a], regs[b]),
        };
        regs.push(v);
    }
    regs[regs.len() - 1]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn blocks_broadcast_and_threads_do_not_change_bits(
        out_shape in prop::collection::vec(1usize..6, 0..6),
        inputs in 1usize..4,
        len in 1usize..8,
        block in prop::sample::select(vec![1usize, 3, 16, 2048]),
        seed in any::<u64>(),
    ) {
        let mut rng = Rng::new(seed);
        let shapes: Vec<Vec<usize>> = (0..inputs).map(|_| input_shape(&out_shape, &mut rng)).collect();
        let data: Vec<Vec<f32>> =
            shapes.iter().map(|s| rng.vec(s.iter().product(), 2.0)).collect();
        let prog = program(inputs, len, &mut rng);
        let views: Vec<TensorRef<'_>> =
            data.iter().zip(&shapes).map(|(d, s)| TensorRef::new("t", d, s).unwrap()).collect();
        let full = prog.output_shape(&shapes.iter().map(|s| s.as_slice()).collect::<Vec<_>>()).unwrap();
        let broadcast: Vec<Vec<f32>> =
            views.iter().map(|&v| reference::broadcast_values(v, &full)).collect();
        let count: usize = full.iter().product();
        let want: Vec<f32> = (0..count)
            .map(|e| eval_one(&prog, &broadcast.iter().map(|b| b[e]).collect::<Vec<_>>()))
            .collect();
        let params = ElementwiseParams { block, min_parallel_elems: 0 };
        let run = || {
            let mut out = vec![f32::NAN; count];
            fused_elementwise(&prog, &views, &params, &mut out).unwrap();
            out
        };
        let one = in_pool(1, run);
        let two = in_pool(2, run);
        assert_same_bits("threads", &one, &two);
        assert_same_values("per-element", &one, &want);
    }
}

/// Values covering each op's interesting range, specials included.
fn sample_values(rng: &mut Rng) -> Vec<f32> {
    let mut v = rng.vec(500, 4.0);
    v.extend(rng.vec(100, 30.0));
    v.extend([
        0.0,
        -0.0,
        1.0,
        -1.0,
        1e-20,
        -1e-20,
        88.0,
        -88.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
    ]);
    v
}

#[test]
fn every_unary_op_matches_the_reference() {
    let mut rng = Rng::new(11);
    for precision in Precision::ALL {
        let x = precision.round_vec(sample_values(&mut rng));
        for &op in UnaryOp::ALL {
            let shape = [x.len()];
            let want = reference::unary(op, TensorRef::new("t", &x, &shape).unwrap()).unwrap();
            let mut got = x.clone();
            slice::unary_in_place(op, &mut got);
            // Math approximations: relative 4e-6 (see kernels::math); tiny outputs absolutely.
            assert_close_in(precision, &format!("{op:?}"), &got, &want.data, 1e-6, 4e-6);
            let mut into = vec![f32::NAN; x.len()];
            slice::unary_into(op, &x, &mut into);
            assert_same_bits(&format!("{op:?} into"), &into, &got);
            // The 16- and 8-lane paths with FMA instructions give the baseline build's bits.
            let mut baseline = x.clone();
            slice::unary_in_place_baseline(op, &mut baseline);
            assert_same_values(&format!("{op:?} baseline"), &got, &baseline);
        }
        for to in CASTS {
            let shape = [x.len()];
            let want = reference::cast(TensorRef::new("t", &x, &shape).unwrap(), to).unwrap();
            let mut got = vec![f32::NAN; x.len()];
            slice::cast_into(to, &x, &mut got);
            assert_same_bits(&format!("{to:?}"), &got, &want.data);
        }
    }
}

#[test]
fn binary_ops_broadcast_like_the_reference() {
    let mut rng = Rng::new(12);
    let a = rng.vec(24, 3.0);
    let b: Vec<f32> = rng.vec(4, 3.0).into_iter().map(f32::abs).collect();
    for &op in BinaryOp::ALL {
        let prog = Program {
            instrs: vec![
                Instr::Input(0),
                Instr::Input(1),
                Instr::Binary { op, a: 0, b: 1 },
            ],
        };
        let ta = TensorRef::new("t", &a, &[2, 3, 4]).unwrap();
        let tb = TensorRef::new("t", &b, &[4]).unwrap();
        let want = reference::binary(op, ta, tb).unwrap();
        let mut got = vec![0.0; 24];
        fused_elementwise(&prog, &[ta, tb], &ElementwiseParams::default(), &mut got).unwrap();
        assert_close(&format!("{op:?}"), &got, &want.data, 0.0, 0.0);
    }
}

#[test]
fn swiglu_chain_matches_reference_in_all_precisions() {
    let mut rng = Rng::new(13);
    // silu(gate) * up + bias, bias broadcast over rows.
    let prog = Program {
        instrs: vec![
            Instr::Input(0),
            Instr::Input(1),
            Instr::Input(2),
            Instr::Unary {
                op: UnaryOp::Silu,
                x: 0,
            },
            Instr::Binary {
                op: BinaryOp::Mul,
                a: 3,
                b: 1,
            },
            Instr::Binary {
                op: BinaryOp::Add,
                a: 4,
                b: 2,
            },
        ],
    };
    for p in Precision::ALL {
        let gate = p.round_vec(rng.vec(7 * 33, 4.0));
        let up = p.round_vec(rng.vec(7 * 33, 2.0));
        let bias = p.round_vec(rng.vec(33, 1.0));
        let ins = [
            TensorRef::new("t", &gate, &[7, 33]).unwrap(),
            TensorRef::new("t", &up, &[7, 33]).unwrap(),
            TensorRef::new("t", &bias, &[33]).unwrap(),
        ];
        let want = reference::fused_elementwise(&prog, &ins).unwrap();
        let mut got = vec![0.0; 7 * 33];
        fused_elementwise(&prog, &ins, &ElementwiseParams::default(), &mut got).unwrap();
        assert_close_in(p, "swiglu", &got, &want.data, 1e-5, 1e-5);
    }
}

#[test]
fn bad_programs_and_shapes_are_errors() {
    let x = [1.0f32; 6];
    let t = TensorRef::new("t", &x, &[2, 3]).unwrap();
    let u = TensorRef::new("t", &x[..2], &[2]).unwrap();
    let p = ElementwiseParams::default();
    let id = Program {
        instrs: vec![
            Instr::Input(0),
            Instr::Input(1),
            Instr::Binary {
                op: BinaryOp::Add,
                a: 0,
                b: 1,
            },
        ],
    };
    let mut out = [0.0f32; 6];
    assert!(fused_elementwise(&id, &[t, u], &p, &mut out).is_err());
    assert!(fused_elementwise(&id, &[t], &p, &mut out).is_err());
    assert!(fused_elementwise(&id, &[t, t], &p, &mut out[..5]).is_err());
    assert!(
        fused_elementwise(&id, &[t, t], &ElementwiseParams { block: 0, ..p }, &mut out).is_err()
    );
}
