//! Kernel benchmark: prints GFLOP/s and the fraction of this machine's f32 peak (measured on
//! each thread count by `mslc_kernels::peak`) for the matmul and attention shapes the executor
//! runs most, `rope` with its table computed per call against once, and the GEMM on a weight
//! packed per call (before) against packed once at load, at tiny_llama's prefill and decode
//! shapes (`-- weights`), conv2d at ResNet-50's shapes on a 64×64 image (`-- conv2d`), and the
//! transcendental elementwise ops against libm (`-- unary`).
//!
//! Run: `cargo bench --bench kernels` (optionally `-- matmul` to filter by name; set
//! `KERNELS_BENCH_SECONDS` to sample longer on a busy machine).

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use mslc_kernels::attention::{attention, attention_lse, AttentionParams};
use mslc_kernels::attention_grad::attention_grad;
use mslc_kernels::convert;
use mslc_kernels::matmul::{
    matmul, Epilogue, GemmPlan, Isa, MatmulOptions, MatmulParams, MicroKernel, PackedB,
};
use mslc_kernels::par::RowParams;
use mslc_kernels::{rope, TensorRef};

/// This machine's measured f32 peak on `threads` threads in GFLOP/s, measured once per count.
fn peak_gflops(threads: usize) -> f64 {
    static PEAKS: Mutex<BTreeMap<usize, f64>> = Mutex::new(BTreeMap::new());
    let mut peaks = PEAKS.lock().unwrap_or_else(|e| e.into_inner());
    *peaks.entry(threads).or_insert_with(|| {
        mslc_kernels::peak::measure(threads).map_or(f64::NAN, |p| p.flops_per_s / 1e9)
    })
}

/// Deterministic pseudo-random values in [-1, 1).
fn data(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// Seconds of samples per measurement: `KERNELS_BENCH_SECONDS`, default 1.
fn budget() -> Duration {
    let secs = std::env::var("KERNELS_BENCH_SECONDS")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .unwrap_or(1.0);
    Duration::from_secs_f64(secs)
}

/// Best and median seconds per call of `f`, timed over [`budget`] after a warm-up. The best
/// run estimates the kernel on an otherwise idle machine (the cores here are shared).
fn time(mut f: impl FnMut()) -> (f64, f64) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(100) {
        f();
    }
    let mut samples = Vec::new();
    let budget = budget();
    let start = Instant::now();
    while start.elapsed() < budget || samples.len() < 5 {
        let t = Instant::now();
        f();
        samples.push(t.elapsed().as_secs_f64());
    }
    samples.sort_by(f64::total_cmp);
    (samples[0], samples[samples.len() / 2])
}

/// Prints a result against the measured peak on `threads` threads.
fn report(name: &str, threads: usize, flops: f64, (best, median): (f64, f64)) {
    let gflops = flops / best / 1e9;
    let peak = peak_gflops(threads);
    println!(
        "{name:<42} {threads}T best {:>8.1} us {gflops:>6.1} GFLOP/s {:>5.1} % of {peak:.0} | median {:>8.1} us {:>6.1} GFLOP/s",
        best * 1e6,
        100.0 * gflops / peak,
        median * 1e6,
        flops / median / 1e9,
    );
}

fn bench_matmul(isa: Isa, threads: usize, m: usize, k: usize, n: usize, flags: (bool, bool)) {
    let (transpose_a, transpose_b) = flags;
    let a = data(m * k, 1);
    let b = data(k * n, 2);
    let mut out = vec![0.0f32; m * n];
    let a_shape = if transpose_a { [k, m] } else { [m, k] };
    let b_shape = if transpose_b { [n, k] } else { [k, n] };
    let opts = MatmulOptions {
        transpose_a,
        transpose_b,
        ..Default::default()
    };
    let params = MatmulParams {
        isa,
        ..MatmulParams::default()
    };
    let seconds = in_pool(threads, || {
        time(|| {
            matmul(
                TensorRef {
                    data: &a,
                    shape: &a_shape,
                },
                TensorRef {
                    data: &b,
                    shape: &b_shape,
                },
                &opts,
                &params,
                &mut out,
            )
            .expect("matmul");
            black_box(&out);
        })
    });
    let t = match flags {
        (false, false) => "",
        (true, false) => " (a transposed)",
        (false, true) => " (b transposed)",
        (true, true) => " (both transposed)",
    };
    report(
        &format!("matmul {isa:?} m={m} k={k} n={n}{t}"),
        threads,
        2.0 * (m * n * k) as f64,
        seconds,
    );
}

/// `x [m, k] @ w [k, n]` three ways, timed in one run: the tiled path packing the weight on
/// every call (before: `small_m = 0`), the default path still packing nothing ahead, and the
/// default path on the weight packed once (what the executor runs); ratios against the first.
fn bench_weights(threads: usize, m: usize, k: usize, n: usize) {
    let (a, b) = (data(m * k, 1), data(k * n, 2));
    let mut out = vec![0.0f32; m * n];
    let plan = GemmPlan::new(&[m, k], &[k, n], None, false, false).expect("plan");
    let default = MatmulParams::default();
    let before = MatmulParams {
        small_m: 0,
        ..MatmulParams::default()
    };
    let mut packed = vec![0.0f32; plan.packed_b_values(&default).expect("kernel")];
    plan.pack_b(&b, &default, &mut packed).expect("pack");
    let plain = Epilogue::default();
    let (per_call, unpacked, once) = in_pool(threads, || {
        let per_call = time(|| {
            plan.run(&a, &b, plain, &before, &mut out).expect("run");
            black_box(&out);
        });
        let unpacked = time(|| {
            plan.run(&a, &b, plain, &default, &mut out).expect("run");
            black_box(&out);
        });
        let once = time(|| {
            plan.run_prepacked(&a, PackedB::F32(&packed), plain, &default, &mut out)
                .expect("run");
            black_box(&out);
        });
        (per_call, unpacked, once)
    });
    let flops = 2.0 * (m * n * k) as f64;
    report(
        &format!("weights m={m} k={k} n={n} packed per call"),
        threads,
        flops,
        per_call,
    );
    report(
        &format!("weights m={m} k={k} n={n} default path"),
        threads,
        flops,
        unpacked,
    );
    report(
        &format!("weights m={m} k={k} n={n} packed once"),
        threads,
        flops,
        once,
    );
    println!(
        "{:<42} {threads}T speed-up over packed per call: default path {:.2}x, packed once {:.2}x (medians {:.2}x, {:.2}x)",
        "",
        per_call.0 / unpacked.0,
        per_call.0 / once.0,
        per_call.1 / unpacked.1,
        per_call.1 / once.1,
    );
}

/// conv2d at ResNet-50's shapes for one 64×64 image (the tuning set's), weights packed once as
/// the executor packs them: `(channels in, size in, channels out, kernel, stride)`.
fn bench_conv(threads: usize) {
    use mslc_kernels::conv::{conv2d, conv2d_packed_weight_len, pack_conv2d_weight, Conv2dAttrs};
    for (c, h, o, k, stride) in [
        (3, 64, 64, 7, 2),
        (64, 16, 64, 3, 1),
        (128, 16, 128, 3, 2),
        (128, 8, 128, 3, 1),
        (256, 4, 256, 3, 1),
        (512, 2, 512, 3, 1),
        (256, 16, 64, 1, 1),
        (1024, 4, 256, 1, 1),
        (2048, 2, 512, 1, 1),
    ] {
        let attrs = Conv2dAttrs {
            stride: [stride; 2],
            padding: [k / 2; 2],
            ..Default::default()
        };
        let (x, w) = (data(c * h * h, 3), data(o * c * k * k, 4));
        let (x_shape, w_shape) = ([1, c, h, h], [o, c, k, k]);
        let xr = TensorRef::new("x", &x, &x_shape).expect("x");
        let wr = TensorRef::new("w", &w, &w_shape).expect("w");
        let params = MatmulParams::default();
        let oh = (h + 2 * (k / 2) - k) / stride + 1;
        let len = conv2d_packed_weight_len(&w_shape, 1, oh * oh, &params).expect("len");
        let mut packed = vec![0.0f32; len];
        pack_conv2d_weight(wr, 1, oh * oh, &params, &mut packed).expect("pack");
        let mut out = vec![0.0f32; o * oh * oh];
        let timing = in_pool(threads, || {
            time(|| {
                conv2d(
                    xr,
                    wr,
                    &attrs,
                    &params,
                    Some(PackedB::F32(&packed)),
                    &mut out,
                )
                .expect("conv");
                black_box(&out);
            })
        });
        let flops = 2.0 * (o * oh * oh * c * k * k) as f64;
        report(
            &format!("conv2d {c}x{h}x{h} -> {o} k{k} s{stride}"),
            threads,
            flops,
            timing,
        );
    }
}

/// The micro-kernel alone on one thread, operands hot in L1: the ceiling for everything else.
fn bench_microkernel(isa: Isa) {
    const KC: usize = 256;
    let Ok(kernel) = MicroKernel::select(isa) else {
        println!("micro-kernel {isa:?}: not supported by this CPU");
        return;
    };
    let (mr, nr) = (kernel.mr, kernel.nr);
    let a = data(KC * mr, 6);
    let b = data(KC * nr, 7);
    let mut c = vec![0.0f32; mr * nr];
    const CALLS: usize = 1000;
    let seconds = time(|| {
        for _ in 0..CALLS {
            // SAFETY: the panels hold KC steps and `c` is one mr×nr tile of row stride nr.
            unsafe { (kernel.run)(KC, a.as_ptr(), b.as_ptr(), c.as_mut_ptr(), nr, true) };
        }
        black_box(&c);
    });
    report(
        &format!("micro-kernel {isa:?} {mr}x{nr}, in L1"),
        1,
        2.0 * (CALLS * mr * nr * KC) as f64,
        seconds,
    );
}

fn bench_attention(threads: usize, b: usize, s: usize, h: usize, d: usize) {
    let q = data(b * s * h * d, 3);
    let k = data(b * s * h * d, 4);
    let v = data(b * s * h * d, 5);
    let shape = [b, s, h, d];
    let mut out = vec![0.0f32; q.len()];
    let params = AttentionParams::default();
    let seconds = in_pool(threads, || {
        time(|| {
            attention(
                TensorRef {
                    data: &q,
                    shape: &shape,
                },
                TensorRef {
                    data: &k,
                    shape: &shape,
                },
                TensorRef {
                    data: &v,
                    shape: &shape,
                },
                true,
                None,
                &params,
                &mut out,
            )
            .expect("attention");
            black_box(&out);
        })
    });
    report(
        &format!("attention B={b} S={s} H={h} D={d} causal"),
        threads,
        4.0 * (b * h * s * s * d) as f64,
        seconds,
    );
}

/// The backward of causal attention on `[b, s, h, d]` (what autodiff emits: an `attention_lse`
/// that is also the forward, and one `attention_grad` for all three gradients) against the plain
/// forward, timed in the same run; prints each time and the backward / forward ratio.
fn bench_attention_backward(threads: usize, b: usize, s: usize, h: usize, d: usize) {
    let shape = [b, s, h, d];
    let [q, k, v, dout] = [3, 4, 5, 6].map(|seed| data(b * s * h * d, seed));
    let [q, k, v, dout] = [&q, &k, &v, &dout].map(|x| TensorRef {
        data: x,
        shape: &shape,
    });
    let mut out = vec![0.0f32; q.data.len()];
    let mut lse = vec![0.0f32; b * s * h];
    let lse_shape = [b, s, h];
    let mut grads = [0, 1, 2].map(|_| vec![0.0f32; q.data.len()]);
    let params = AttentionParams::default();
    let (fwd, _) = in_pool(threads, || {
        time(|| attention(q, k, v, true, None, &params, &mut out).expect("attention"))
    });
    let (with_lse, _) = in_pool(threads, || {
        time(|| attention_lse(q, k, v, true, None, &params, &mut out, &mut lse).expect("lse"))
    });
    let lse_t = TensorRef {
        data: &lse,
        shape: &lse_shape,
    };
    let out_t = TensorRef {
        data: &out,
        shape: &shape,
    };
    let [dq, dk, dv] = &mut grads;
    let (backward, _) = in_pool(threads, || {
        time(|| {
            attention_grad(q, k, v, out_t, dout, lse_t, true, None, &params, dq, dk, dv)
                .expect("attention_grad")
        })
    });
    println!(
        "attention backward B={b} S={s} H={h} D={d} causal t={threads}: forward {:8.1} us, forward with lse {:8.1} us, dq+dk+dv {:8.1} us, backward / forward {:.2}x",
        fwd * 1e6,
        with_lse * 1e6,
        backward * 1e6,
        backward / fwd
    );
    black_box((&out, &grads));
}

/// `rope` computing its cos/sin table on every call against `rope_cached` reading a table made
/// once (what the fusion pass compiles a rope into), on `[b, s, h, d]`; prints both times and
/// their ratio, measured in the same run.
fn bench_rope(threads: usize, b: usize, s: usize, h: usize, d: usize) {
    let shape = [b, s, h, d];
    let x = data(b * s * h * d, 9);
    let x = TensorRef::new("x", &x, &shape).expect("x");
    let mut out = vec![0.0f32; x.data.len()];
    let params = RowParams::default();
    let mut table = vec![0.0f32; s * d];
    rope::rope_table(10_000.0, s, d, &mut table).expect("table");
    let table_shape = [2, s, d / 2];
    let table = TensorRef::new("table", &table, &table_shape).expect("table");
    let (per_call, _) = in_pool(threads, || {
        time(|| rope::rope(x, 10_000.0, &params, &mut out).expect("rope"))
    });
    let (cached, _) = in_pool(threads, || {
        time(|| rope::rope_cached(x, table, &params, &mut out).expect("rope_cached"))
    });
    println!(
        "rope {b}x{s}x{h}x{d} t={threads}: per-call table {:8.1} us, cached table {:8.1} us, {:.2}x",
        per_call * 1e6,
        cached * 1e6,
        per_call / cached
    );
    black_box(&out);
}

/// The SwiGLU backward's fused program (what autodiff and fusion emit for `silu(g) * u`'s
/// gradient with respect to `g`) over `[4, 128, 688]`, at several register blocks.
fn bench_fused_swiglu_grad(threads: usize) {
    use mslc_kernels::elementwise::op::{BinaryOp, UnaryOp};
    use mslc_kernels::elementwise::program::{Instr, Program};
    use mslc_kernels::elementwise::{fused_elementwise, ElementwiseParams};
    let bin = |op, a, b| Instr::Binary { op, a, b };
    // mul(x0, x1); sigmoid(x2); sub(x3, t1); mul(x2, t2); add(x3, t3); mul(t1, t4); mul(t0, t5)
    let program = Program {
        instrs: vec![
            Instr::Input(0),
            Instr::Input(1),
            Instr::Input(2),
            Instr::Input(3),
            bin(BinaryOp::Mul, 0, 1),
            Instr::Unary {
                op: UnaryOp::Sigmoid,
                x: 2,
            },
            bin(BinaryOp::Sub, 3, 5),
            bin(BinaryOp::Mul, 2, 6),
            bin(BinaryOp::Add, 3, 7),
            bin(BinaryOp::Mul, 5, 8),
            bin(BinaryOp::Mul, 4, 9),
        ],
    };
    let shape = [4, 128, 688];
    let n: usize = shape.iter().product();
    let [x0, x1, x2] = [11, 12, 13].map(|seed| data(n, seed));
    let one = [1.0f32];
    let inputs = [
        TensorRef::new("x0", &x0, &shape).expect("x0"),
        TensorRef::new("x1", &x1, &shape).expect("x1"),
        TensorRef::new("x2", &x2, &shape).expect("x2"),
        TensorRef::new("one", &one, &[]).expect("one"),
    ];
    let mut out = vec![0.0f32; n];
    for block in [512, 1024, 2048, 4096] {
        let params = ElementwiseParams {
            block,
            ..Default::default()
        };
        let (best, median) = in_pool(threads, || {
            time(|| fused_elementwise(&program, &inputs, &params, &mut out).expect("fused"))
        });
        println!(
            "fused swiglu grad 4x128x688 block {block:>5} t={threads}: best {:8.1} us, median {:8.1} us, {:.2} ns/value",
            best * 1e6,
            median * 1e6,
            best * 1e9 / n as f64
        );
    }
    black_box(&out);
}

/// The transcendental elementwise ops on 2048 values (one block of a fused program, hot in
/// L1), against the same functions from the system's libm called per value (`f32::exp`,
/// `f32::tanh`) in the same run: ns per value and the ratio.
fn bench_unary() {
    use mslc_kernels::elementwise::op::UnaryOp;
    use mslc_kernels::elementwise::slice::unary_into;
    let wide = if mslc_kernels::cpu::has_avx512f() {
        "AVX-512"
    } else if mslc_kernels::cpu::has_avx2_fma() {
        "AVX2+FMA"
    } else {
        "baseline"
    };
    let x: Vec<f32> = data(2048, 21).iter().map(|v| v * 8.0).collect();
    let mut out = vec![0.0f32; x.len()];
    let per_value = |seconds: f64| seconds * 1e9 / x.len() as f64;
    type Scalar = fn(f32) -> f32;
    let cases: [(UnaryOp, Scalar); 4] = [
        (UnaryOp::Exp, f32::exp),
        (UnaryOp::Tanh, f32::tanh),
        (UnaryOp::Sigmoid, |v| 1.0 / (1.0 + (-v).exp())),
        (UnaryOp::Silu, |v| v / (1.0 + (-v).exp())),
    ];
    for (op, reference) in cases {
        let (ours, _) = time(|| {
            unary_into(op, &x, &mut out);
            black_box(&out);
        });
        let (theirs, _) = time(|| {
            for (o, &v) in out.iter_mut().zip(&x) {
                *o = reference(black_box(v));
            }
            black_box(&out);
        });
        println!(
            "unary {op:?} ({wide}): {:.3} ns/value, libm per value {:.3} ns/value: {:.2}x",
            per_value(ours),
            per_value(theirs),
            theirs / ours
        );
    }
}

/// One AdamW step over 6.8 Mi parameters (tiny_llama's 8 layers: p, g, m, v and the three
/// results are 190 MB, far beyond the caches, as in a training step): time and the traffic
/// rate over the 28 bytes per element it must move.
fn bench_adam(threads: usize) {
    use mslc_kernels::elementwise::ElementwiseParams;
    use mslc_kernels::optimizer::{adam_update, AdamStep};
    let n = 6_800_000;
    let [p, g, m] = [21, 22, 23].map(|seed| data(n, seed));
    let v: Vec<f32> = data(n, 24).iter().map(|x| x.abs()).collect();
    let [mut p_out, mut m_out, mut v_out] = [0, 1, 2].map(|_| vec![0.0f32; n]);
    let step = AdamStep::new(0.9, 0.999, 1e-8, 0.1, true, [1e-4, 1e-3, 0.03, 1.0]);
    let params = ElementwiseParams::default();
    let (best, median) = in_pool(threads, || {
        time(|| {
            adam_update(
                &step,
                [&p, &g, &m, &v],
                &params,
                [&mut p_out, &mut m_out, &mut v_out],
            )
            .expect("adam_update")
        })
    });
    println!(
        "adam_update 6.8M t={threads}: best {:7.2} ms ({:5.1} GB/s of 28 B/element), median {:7.2} ms",
        best * 1e3,
        28.0 * n as f64 / best / 1e9,
        median * 1e3
    );
    black_box((&p_out, &m_out, &v_out));
}

/// f16 / bf16 conversion throughput over 4 Mi values (one thread), in values per nanosecond.
fn bench_convert() {
    let n = 1 << 22;
    let x = data(n, 8);
    let mut h = vec![half::f16::ZERO; n];
    let mut b = vec![half::bf16::ZERO; n];
    let mut back = vec![0.0f32; n];
    let rate = |(best, _): (f64, f64)| n as f64 / best / 1e9;
    let r = rate(time(|| convert::f32_to_f16(&x, &mut h).expect("f16")));
    println!("convert f32 -> f16   {r:6.2} Gvalues/s");
    let r = rate(time(|| convert::f16_to_f32(&h, &mut back).expect("f16")));
    println!("convert f16 -> f32   {r:6.2} Gvalues/s");
    let r = rate(time(|| convert::f32_to_bf16(&x, &mut b).expect("bf16")));
    println!("convert f32 -> bf16  {r:6.2} Gvalues/s");
    let r = rate(time(|| convert::bf16_to_f32(&b, &mut back).expect("bf16")));
    println!("convert bf16 -> f32  {r:6.2} Gvalues/s");
    black_box((&h, &b, &back));
}

/// Runs `f` in a rayon pool of `threads` threads.
fn in_pool<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("thread pool")
        .install(f)
}

fn main() {
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let wanted = |name: &str| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str()));
    let threads = [rayon::current_num_threads(), 1];
    if wanted("micro") {
        for isa in [Isa::Avx512, Isa::Avx2, Isa::Portable] {
            bench_microkernel(isa);
        }
    }
    if wanted("matmul") {
        // Auto picks AVX-512 where the CPU has it; Avx2 is the kernel of the 157 GFLOP/s target.
        for isa in [Isa::Auto, Isa::Avx2] {
            if MicroKernel::select(isa).is_err() {
                continue;
            }
            for t in threads {
                bench_matmul(isa, t, 512, 512, 512, (false, false));
                for (k, n) in [(256, 256), (256, 688), (256, 1000), (688, 256)] {
                    bench_matmul(isa, t, 128, k, n, (false, false));
                    bench_matmul(isa, t, 128, k, n, (false, true));
                }
            }
        }
    }
    if wanted("gemm512") {
        // The square product scripts/bench_gemm.py compares with NumPy's BLAS.
        for t in threads {
            bench_matmul(Isa::Auto, t, 512, 512, 512, (false, false));
        }
    }
    if wanted("train_gemm") {
        // The products of a tiny_llama training step (B·S = 512 tokens, hidden 256, ffn 688):
        // forward x·Wᵀ, input gradients dy·W, weight gradients xᵀ·dy.
        for (m, k, n, flags) in [
            (512, 256, 688, (false, true)),
            (512, 256, 256, (false, true)),
            (512, 688, 256, (false, false)),
            (256, 512, 688, (true, false)),
            (688, 512, 256, (true, false)),
            (256, 512, 256, (true, false)),
        ] {
            bench_matmul(Isa::Auto, threads[0], m, k, n, flags);
        }
    }
    if wanted("weights") {
        for t in threads {
            for m in [1, 4, 8, 128] {
                for (k, n) in [(256, 688), (256, 1000), (688, 256)] {
                    bench_weights(t, m, k, n);
                }
            }
        }
    }
    if wanted("conv2d") {
        for t in threads {
            bench_conv(t);
        }
    }
    if wanted("convert") {
        bench_convert();
    }
    if wanted("attention") {
        for t in threads {
            bench_attention(t, 1, 128, 4, 64);
        }
    }
    if wanted("attention_backward") {
        for t in threads {
            bench_attention_backward(t, 1, 128, 4, 64);
        }
    }
    if wanted("adam") {
        for t in threads {
            bench_adam(t);
        }
    }
    if wanted("unary") {
        bench_unary();
    }
    if wanted("fused") {
        for t in threads {
            bench_fused_swiglu_grad(t);
        }
    }
    if wanted("rope") {
        for t in threads {
            bench_rope(t, 1, 128, 4, 64);
        }
    }
}
