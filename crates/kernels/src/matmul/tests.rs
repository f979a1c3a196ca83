//! Fast matmul against the reference, over shapes, layouts, epilogues, blockings and precisions.

use super::*;
use crate::elementwise::UnaryOp;
use crate::reference;
use crate::testing::{assert_close_in, assert_same_bits, in_pool, Precision, Rng};
use proptest::prelude::*;

/// A generated product: operand shapes and everything else a call takes.
#[derive(Clone, Debug)]
struct Case {
    a_shape: Vec<usize>,
    b_shape: Vec<usize>,
    bias_shape: Option<Vec<usize>>,
    transpose_a: bool,
    transpose_b: bool,
    activation: Activation,
    params: MatmulParams,
    precision: Precision,
    seed: u64,
}

/// Batch layouts exercising broadcasting and the folded (A-batched, B-shared) path.
fn batches(kind: usize) -> (Vec<usize>, Vec<usize>) {
    match kind {
        0 => (vec![], vec![]),
        1 => (vec![2], vec![2]),
        2 => (vec![3, 1], vec![2]),
        3 => (vec![3], vec![]),
        _ => (vec![], vec![2, 2]),
    }
}

fn operand(batch: &[usize], r: usize, c: usize, transpose: bool) -> Vec<usize> {
    let mut s = batch.to_vec();
    s.extend(if transpose { [c, r] } else { [r, c] });
    s
}

fn bias_shape(kind: usize, out: &[usize]) -> Option<Vec<usize>> {
    let (m, n) = (out[out.len() - 2], out[out.len() - 1]);
    match kind {
        0 => None,
        1 => Some(vec![n]),
        2 => Some(vec![m, 1]),
        3 => Some(vec![1, n]),
        _ => Some(out.to_vec()),
    }
}

fn case() -> impl Strategy<Value = Case> {
    let dims = (1usize..40, 1usize..40, 0usize..70);
    let layout = (0usize..5, any::<bool>(), any::<bool>(), 0usize..5);
    let acts = prop::sample::select(Activation::all().collect::<Vec<_>>());
    let params = (
        prop::sample::select(vec![1usize, 6, 13, 72]),
        prop::sample::select(vec![1usize, 5, 256]),
        prop::sample::select(vec![1usize, 16, 40, 1024]),
        0usize..4,
        prop::sample::select(available_isas()),
        prop::sample::select(vec![0usize, 8, 40]),
        prop::sample::select(vec![0usize, 8, 4096]),
    );
    let prec = prop::sample::select(Precision::ALL.to_vec());
    (dims, layout, acts, params, prec, any::<u64>()).prop_map(
        |(
            (m, n, k),
            (batch, ta, tb, bias),
            activation,
            (mc, kc, nc, tasks, isa, small_m, small_m_packed_b),
            precision,
            seed,
        )| {
            let (ab, bb) = batches(batch);
            let a_shape = operand(&ab, m, k, ta);
            let b_shape = operand(&bb, k, n, tb);
            let out = matmul_output_shape(&a_shape, &b_shape, ta, tb).unwrap();
            Case {
                bias_shape: bias_shape(bias, &out),
                a_shape,
                b_shape,
                transpose_a: ta,
                transpose_b: tb,
                activation,
                params: MatmulParams {
                    mc,
                    kc,
                    nc,
                    tasks_per_thread: tasks,
                    min_parallel_flops: 0,
                    isa,
                    small_m,
                    small_m_packed_b,
                    // Read by the step that decides on f16 panels, not by the GEMM itself.
                    half_b_rows: 0,
                },
                precision,
                seed,
            }
        },
    )
}

/// Every ISA this CPU can run.
fn available_isas() -> Vec<Isa> {
    [Isa::Auto, Isa::Avx512, Isa::Avx2, Isa::Portable]
        .into_iter()
        .filter(|&i| MicroKernel::select(i).is_ok())
        .collect()
}

/// Runs `c` through a [`GemmPlan`] with B packed ahead, as the executor does for weights: in
/// panels of `half` when given (B's values must be that format's).
fn run_prepacked(
    c: &Case,
    a: &[f32],
    b: &[f32],
    bias: Option<&[f32]>,
    multiplier: Option<&[f32]>,
    half: Option<HalfType>,
) -> Vec<f32> {
    let plan = GemmPlan::new(
        &c.a_shape,
        &c.b_shape,
        c.bias_shape.as_deref(),
        c.transpose_a,
        c.transpose_b,
    )
    .unwrap();
    let values = plan.packed_b_values(&c.params).unwrap();
    let mut region = vec![f32::NAN; region_floats(values, half)];
    match half {
        Some(half) => plan.pack_b_half(b, &c.params, half, &mut halves_mut(&mut region)[..values]),
        None => plan.pack_b(b, &c.params, &mut region),
    }
    .unwrap();
    let out_shape =
        matmul_output_shape(&c.a_shape, &c.b_shape, c.transpose_a, c.transpose_b).unwrap();
    let mut out = vec![f32::NAN; out_shape.iter().product()];
    let epilogue = Epilogue {
        bias,
        activation: c.activation,
        multiplier,
    };
    let packed = panels_in(&region, values, half).unwrap();
    plan.run_prepacked(a, packed, epilogue, &c.params, &mut out)
        .unwrap();
    out
}

/// Runs the fast kernel on `c` (inputs already rounded), returning the output.
fn run_fast(c: &Case, a: &[f32], b: &[f32], bias: Option<&[f32]>) -> Vec<f32> {
    let out_shape =
        matmul_output_shape(&c.a_shape, &c.b_shape, c.transpose_a, c.transpose_b).unwrap();
    let mut out = vec![f32::NAN; out_shape.iter().product()];
    let opts = MatmulOptions {
        transpose_a: c.transpose_a,
        transpose_b: c.transpose_b,
        bias: bias.map(|data| TensorRef {
            data,
            shape: c.bias_shape.as_deref().unwrap(),
        }),
        activation: c.activation,
    };
    matmul(
        TensorRef::new("t", a, &c.a_shape).unwrap(),
        TensorRef::new("t", b, &c.b_shape).unwrap(),
        &opts,
        &c.params,
        &mut out,
    )
    .unwrap();
    out
}

fn check(c: &Case) {
    let mut rng = Rng::new(c.seed);
    let p = c.precision;
    let a = p.round_vec(rng.vec(c.a_shape.iter().product(), 1.0));
    let b = p.round_vec(rng.vec(c.b_shape.iter().product(), 1.0));
    let bias = c
        .bias_shape
        .as_ref()
        .map(|s| p.round_vec(rng.vec(s.iter().product(), 1.0)));
    let want = reference::fused_matmul(
        TensorRef::new("t", &a, &c.a_shape).unwrap(),
        TensorRef::new("t", &b, &c.b_shape).unwrap(),
        bias.as_ref()
            .map(|d| TensorRef::new("t", d, c.bias_shape.as_deref().unwrap()).unwrap()),
        c.transpose_a,
        c.transpose_b,
        c.activation,
    )
    .unwrap();
    let one = in_pool(1, || run_fast(c, &a, &b, bias.as_deref()));
    let two = in_pool(2, || run_fast(c, &a, &b, bias.as_deref()));
    assert_same_bits("1 vs 2 threads", &one, &two);
    for threads in [1, 2] {
        let packed = in_pool(threads, || {
            run_prepacked(c, &a, &b, bias.as_deref(), None, None)
        });
        assert_same_bits("B packed ahead vs per call", &one, &packed);
    }
    // A multiplier (SwiGLU's gate on its up product) gives the bits of a separate `mul`, on
    // the unpacked-A and the tiled path.
    let multiplier = p.round_vec(rng.vec(one.len(), 1.0));
    let separate: Vec<f32> = one.iter().zip(&multiplier).map(|(x, m)| x * m).collect();
    let tiled_params = MatmulParams {
        small_m: 0,
        small_m_packed_b: 0,
        ..c.params.clone()
    };
    for params in [c.params.clone(), tiled_params.clone()] {
        let c = Case {
            params,
            ..c.clone()
        };
        let gated = in_pool(2, || {
            run_prepacked(&c, &a, &b, bias.as_deref(), Some(&multiplier), None)
        });
        assert_same_bits("multiplier vs a separate mul", &separate, &gated);
    }
    // B's values made f16's or bf16's (a weight stored so) and packed in panels of that
    // format: the bits of the product over them as f32, on the unpacked-A path (whose row
    // kernels widen the panels) and on the tiled one (which widens them first), on 1 and 2
    // threads.
    for half in [HalfType::F16, HalfType::Bf16] {
        let b16: Vec<f32> = b.iter().map(|&x| half.widen(half.narrow(x))).collect();
        let want16 = in_pool(1, || run_fast(c, &a, &b16, bias.as_deref()));
        let runs = [(&c.params, 1), (&c.params, 2), (&tiled_params, 2)];
        for (params, threads) in runs {
            let c = Case {
                params: params.clone(),
                ..c.clone()
            };
            let halves = in_pool(threads, || {
                run_prepacked(&c, &a, &b16, bias.as_deref(), None, Some(half))
            });
            assert_same_bits("16-bit panels vs f32", &want16, &halves);
        }
    }
    // The unpacked-A path gives the tiled path's bits.
    let tiled = Case {
        params: MatmulParams {
            small_m: 0,
            ..c.params.clone()
        },
        ..c.clone()
    };
    let tiled = in_pool(2, || run_fast(&tiled, &a, &b, bias.as_deref()));
    assert_same_bits("small-m vs tiled path", &one, &tiled);
    let k = if c.transpose_a {
        c.a_shape[c.a_shape.len() - 2]
    } else {
        c.a_shape[c.a_shape.len() - 1]
    };
    // f32: worst-case growth of FMA rounding over k terms of size <= 1.
    let atol = 1e-6 * (k as f32 + 1.0);
    assert_close_in(p, "matmul", &one, &want.data, atol, 1e-5);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn fast_matches_reference(c in case()) {
        check(&c);
    }
}

#[test]
fn bits_do_not_depend_on_tiling_or_threads() {
    let mut rng = Rng::new(7);
    let (m, k, n) = (67, 300, 45);
    let a = rng.vec(m * k, 1.0);
    let b = rng.vec(k * n, 1.0);
    let bias = rng.vec(n, 1.0);
    let run = |params: &MatmulParams| {
        let mut out = vec![0.0; m * n];
        let opts = MatmulOptions {
            bias: Some(TensorRef {
                data: &bias,
                shape: &[n],
            }),
            activation: Activation::new(UnaryOp::Gelu).unwrap(),
            ..Default::default()
        };
        matmul(
            TensorRef::new("t", &a, &[m, k]).unwrap(),
            TensorRef::new("t", &b, &[k, n]).unwrap(),
            &opts,
            params,
            &mut out,
        )
        .unwrap();
        out
    };
    let base = in_pool(1, || run(&MatmulParams::default()));
    for (mc, nc, tasks) in [(6, 16, 1), (12, 1024, 4), (1000, 32, 2), (72, 1024, 0)] {
        let params = MatmulParams {
            mc,
            nc,
            tasks_per_thread: tasks,
            min_parallel_flops: 0,
            ..Default::default()
        };
        let got = in_pool(2, || run(&params));
        assert_same_bits("tiling", &base, &got);
    }
}

#[test]
fn fma_kernels_agree_bit_for_bit() {
    let isas: Vec<Isa> = available_isas()
        .into_iter()
        .filter(|i| matches!(i, Isa::Avx2 | Isa::Avx512))
        .collect();
    let mut rng = Rng::new(8);
    let (m, k, n) = (37, 300, 70);
    let a = rng.vec(m * k, 1.0);
    let b = rng.vec(k * n, 1.0);
    let results: Vec<Vec<f32>> = isas
        .iter()
        .map(|&isa| {
            let mut out = vec![0.0; m * n];
            let params = MatmulParams {
                isa,
                ..Default::default()
            };
            matmul(
                TensorRef::new("t", &a, &[m, k]).unwrap(),
                TensorRef::new("t", &b, &[k, n]).unwrap(),
                &MatmulOptions::default(),
                &params,
                &mut out,
            )
            .unwrap();
            out
        })
        .collect();
    for pair in results.windows(2) {
        assert_same_bits("AVX2 vs AVX-512", &pair[0], &pair[1]);
    }
}

#[test]
fn empty_inner_dimension_gives_bias_and_activation() {
    let mut out = vec![f32::NAN; 6];
    let opts = MatmulOptions {
        bias: Some(TensorRef {
            data: &[-1.0, 2.0, 3.0],
            shape: &[3],
        }),
        activation: Activation::new(UnaryOp::Relu).unwrap(),
        ..Default::default()
    };
    matmul(
        TensorRef::new("t", &[], &[2, 0]).unwrap(),
        TensorRef::new("t", &[], &[0, 3]).unwrap(),
        &opts,
        &MatmulParams::default(),
        &mut out,
    )
    .unwrap();
    assert_eq!(out, vec![0.0, 2.0, 3.0, 0.0, 2.0, 3.0]);
}

#[test]
fn bad_arguments_are_errors() {
    let p = MatmulParams::default();
    let o = MatmulOptions::default();
    let x = [0.0f32; 6];
    let mut out = [0.0f32; 4];
    let t = |s: &'static [usize]| TensorRef {
        data: &x[..s.iter().product::<usize>()],
        shape: s,
    };
    assert!(matmul(t(&[2, 3]), t(&[2, 3]), &o, &p, &mut out).is_err());
    assert!(matmul(t(&[6]), t(&[6, 1]), &o, &p, &mut out).is_err());
    assert!(matmul(t(&[2, 3]), t(&[3, 2]), &o, &p, &mut out[..3]).is_err());
    let bad_bias = MatmulOptions {
        bias: Some(t(&[3])),
        ..Default::default()
    };
    assert!(matmul(t(&[2, 3]), t(&[3, 2]), &bad_bias, &p, &mut out).is_err());
    let short = TensorRef {
        data: &x[..5],
        shape: &[2, 3],
    };
    assert!(matmul(short, t(&[3, 2]), &o, &p, &mut out).is_err());
}

#[test]
fn default_params_on_larger_and_tiny_shapes() {
    // Large enough to be split into parallel tiles with the default blocking, and the smallest.
    for (batch, m, k, n) in [(2, 131, 300, 97), (1, 1, 1, 1), (3, 7, 2, 1)] {
        let c = Case {
            a_shape: vec![batch, m, k],
            b_shape: vec![k, n],
            bias_shape: Some(vec![n]),
            transpose_a: false,
            transpose_b: false,
            activation: Activation::new(UnaryOp::Silu).unwrap(),
            params: MatmulParams::default(),
            precision: Precision::F32,
            seed: (m * n) as u64,
        };
        check(&c);
        check(&Case {
            b_shape: vec![batch, n, k],
            transpose_b: true,
            bias_shape: Some(vec![batch, m, n]),
            ..c.clone()
        });
    }
}

/// One-row products (decode shapes), whose AVX2 row path computes two or four full panels per
/// call: 1, 2, 4, 5 and 7 full panels, a narrower last panel, k within one slab and over
/// several, B row-major (read in place) and transposed (packed), a batch of rows that each take
/// the path alone, an A read transposed, and every ISA this CPU runs. `check` compares their
/// bits with the tiled path's, with B packed ahead in f32, f16 and bf16 panels, on 1 and 2
/// threads, and the values with the reference.
#[test]
fn one_row_products_on_every_panel_layout() {
    for isa in available_isas() {
        for (n, k) in [(32, 70), (45, 300), (64, 1), (80, 600), (16, 40), (112, 9)] {
            for (transpose_a, transpose_b) in [(false, false), (false, true), (true, false)] {
                let c = Case {
                    a_shape: vec![3, 1, k],
                    b_shape: vec![k, n],
                    bias_shape: Some(vec![n]),
                    transpose_a: false,
                    transpose_b: false,
                    activation: Activation::new(UnaryOp::Silu).unwrap(),
                    params: MatmulParams {
                        isa,
                        min_parallel_flops: 0,
                        ..MatmulParams::default()
                    },
                    precision: Precision::F32,
                    seed: (n * k) as u64,
                };
                check(&Case {
                    a_shape: if transpose_a {
                        vec![3, k, 1]
                    } else {
                        c.a_shape.clone()
                    },
                    b_shape: if transpose_b {
                        vec![n, k]
                    } else {
                        c.b_shape.clone()
                    },
                    transpose_a,
                    transpose_b,
                    ..c.clone()
                });
            }
        }
    }
}
