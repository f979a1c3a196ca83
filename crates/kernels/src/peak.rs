//! This machine's f32 peak, measured: a short calibration runs independent fused multiply-adds
//! on every thread of a pool of the size a run uses, with the widest vectors the CPU has
//! (AVX-512, AVX2+FMA, or plain scalar code). `mslc run` quotes achieved GFLOP/s against it
//! instead of a constant, since the machines these run on differ (a 2-core AVX2 EPYC, an
//! AVX-512 Xeon).

use std::time::{Duration, Instant};

/// What the calibration found.
#[derive(Clone, Debug, PartialEq)]
pub struct Peak {
    /// f32 FLOP per second over all threads.
    pub flops_per_s: f64,
    /// Threads it ran on.
    pub threads: usize,
    /// The instructions it used: `AVX-512F`, `AVX2+FMA` or `scalar`.
    pub isa: &'static str,
    /// The CPU's model name, where `/proc/cpuinfo` gives one.
    pub cpu: Option<String>,
}

impl Peak {
    /// `measured f32 peak 98.2 GFLOP/s on 2 thread(s), AVX2+FMA (AMD EPYC)`; a build with debug
    /// assertions says so, as its unoptimized loop runs far below the hardware's peak.
    pub fn describe(&self) -> String {
        let cpu = self
            .cpu
            .as_deref()
            .map_or(String::new(), |c| format!(" ({c})"));
        let build = if cfg!(debug_assertions) {
            ", debug build"
        } else {
            ""
        };
        format!(
            "measured f32 peak {:.1} GFLOP/s on {} thread(s), {}{cpu}{build}",
            self.flops_per_s / 1e9,
            self.threads,
            self.isa
        )
    }
}

/// What a measured peak is kept under: the CPU's model, the instructions the calibration uses
/// and the thread count, e.g. `AMD EPYC | AVX2+FMA | 2 thread(s)`.
pub fn machine_key(threads: usize) -> String {
    format!(
        "{} | {} | {} thread(s)",
        cpu_model().as_deref().unwrap_or("unknown CPU"),
        widest().0,
        threads.max(1)
    )
}

/// How long each timed round runs on every thread.
const ROUND: Duration = Duration::from_millis(30);

/// Independent accumulators per thread: enough to cover the FMA latency on two FMA units.
const CHAINS: usize = 12;

/// Measures the peak on `threads` threads (about 100 ms); `None` when no pool can be started.
pub fn measure(threads: usize) -> Option<Peak> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .build()
        .ok()?;
    let (isa, kernel) = widest();
    // Size a round from a short single-thread probe, then keep the best of two rounds.
    let probe = 1 << 12;
    let start = Instant::now();
    kernel(probe);
    let per_iter = start.elapsed().as_secs_f64().max(1e-9) / probe as f64;
    let iters = ((ROUND.as_secs_f64() / per_iter) as u64).clamp(probe, 1 << 32);
    let mut best = 0.0f64;
    for _ in 0..2 {
        let start = Instant::now();
        let flops: u64 = pool.broadcast(|_| kernel(iters)).iter().sum();
        best = best.max(flops as f64 / start.elapsed().as_secs_f64().max(1e-9));
    }
    Some(Peak {
        flops_per_s: best,
        threads: pool.current_num_threads(),
        isa,
        cpu: cpu_model(),
    })
}

/// The f32 FLOP/s mslc's own GEMM sustains on `threads` threads on a training step's products,
/// as a step weighs them: two like the forward's and the input gradient's (512 × 256 by
/// 256 × 688, B transposed) for each like a weight gradient's (688 × 512 by 512 × 256, A
/// transposed), both operands packed per call as activations and gradients are. Each is the
/// first-quartile time of the calls in 40 ms after 20 ms of warm-up (about 120 ms in all),
/// timed with the pool's threads kept awake ([`crate::par::with_threads_awake`]) as the
/// executor runs a step: timed cold, each call also paid a sleeping thread's wake-up, and on
/// a 2-core AVX-512 Xeon the rate came out at 0.37 of the peak where a step's products reach
/// 0.55-0.6. What the planner's compute efficiency on the host is measured by, against
/// [`measure`]'s peak: the FMA loop is what a core can do, this what a step's products get.
pub fn gemm_rate(threads: usize) -> Option<f64> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .build()
        .ok()?;
    let (tokens, hidden, ffn) = (512usize, 256usize, 688usize);
    let (plain, weight_grad) = pool.install(|| {
        crate::par::with_threads_awake(|| {
            let plain = typical_fast_seconds([tokens, hidden], [ffn, hidden], (false, true))?;
            let weight_grad = typical_fast_seconds([tokens, ffn], [tokens, hidden], (true, false))?;
            Some((plain, weight_grad))
        })
    })?;
    let flops = (2 * tokens * hidden * ffn) as f64;
    Some(3.0 * flops / (2.0 * plain + weight_grad).max(1e-9))
}

/// The first-quartile seconds of the calls made in [`GEMM_TIMED`] (at least nine, after
/// [`GEMM_WARM_UP`] of warm-up calls) of the product of an `a_shape` and a `b_shape` operand
/// with the given transpositions, on the current thread pool.
fn typical_fast_seconds(
    a_shape: [usize; 2],
    b_shape: [usize; 2],
    (ta, tb): (bool, bool),
) -> Option<f64> {
    use crate::matmul::{matmul, matmul_output_shape, MatmulOptions, MatmulParams};
    use crate::tensor::TensorRef;
    let a: Vec<f32> = (0..a_shape[0] * a_shape[1])
        .map(|i| (i % 13) as f32 * 0.01)
        .collect();
    let b: Vec<f32> = (0..b_shape[0] * b_shape[1])
        .map(|i| (i % 7) as f32 * 0.01)
        .collect();
    let out = matmul_output_shape(&a_shape, &b_shape, ta, tb).ok()?;
    let mut c = vec![0f32; out.iter().product()];
    let opts = MatmulOptions {
        transpose_a: ta,
        transpose_b: tb,
        ..MatmulOptions::default()
    };
    let params = MatmulParams::default();
    let a = TensorRef::new("matmul", &a, &a_shape).ok()?;
    let b = TensorRef::new("matmul", &b, &b_shape).ok()?;
    let mut call = || {
        let start = Instant::now();
        matmul(a, b, &opts, &params, &mut c).ok()?;
        std::hint::black_box(&c);
        Some(start.elapsed().as_secs_f64())
    };
    let warming = Instant::now();
    for warm_up in 0.. {
        if warm_up >= 2 && warming.elapsed() >= GEMM_WARM_UP {
            break;
        }
        call()?;
    }
    let timing = Instant::now();
    let mut timed = Vec::new();
    while timed.len() < 9 || timing.elapsed() < GEMM_TIMED {
        timed.push(call()?);
    }
    timed.sort_by(f64::total_cmp);
    Some(timed[timed.len() / 4])
}

/// How long [`gemm_rate`] times each product after its warm-up. A 2-core VM's cores are
/// taken away for 5-10 ms at a time (a product then runs at the 1-thread rate), so a rate is
/// the fastest quartile's time over a window several such episodes long, not the median of a
/// few calls that one episode can cover.
const GEMM_TIMED: Duration = Duration::from_millis(40);

/// How long [`gemm_rate`]'s products run before they are timed: a new pool's threads start on
/// the core that spawned them and the kernel moves them to idle cores only after some
/// milliseconds (timed after two calls, the first product's rate on 2 threads was the
/// 1-thread rate in five runs of six on a 2-core Xeon).
const GEMM_WARM_UP: Duration = Duration::from_millis(20);

/// The widest FMA loop this CPU runs, and its name; the loop returns the FLOPs it did.
fn widest() -> (&'static str, fn(u64) -> u64) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return ("AVX-512F", x86::avx512);
        }
        if crate::cpu::has_avx2_fma() {
            return ("AVX2+FMA", x86::avx2);
        }
    }
    ("scalar", scalar)
}

/// `iters` rounds of `CHAINS` independent multiply-adds in plain code (2 FLOP each).
fn scalar(iters: u64) -> u64 {
    let (m, a) = (
        std::hint::black_box(0.999_99f32),
        std::hint::black_box(1e-6f32),
    );
    let mut acc = [1.0f32; CHAINS];
    for _ in 0..iters {
        for x in &mut acc {
            *x = *x * m + a;
        }
    }
    std::hint::black_box(acc);
    iters * CHAINS as u64 * 2
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::CHAINS;

    /// AVX2+FMA: `CHAINS` chains of 8-lane FMAs.
    pub(super) fn avx2(iters: u64) -> u64 {
        // SAFETY: chosen only when the CPU has AVX2 and FMA (`widest`).
        unsafe { avx2_loop(iters) }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2_loop(iters: u64) -> u64 {
        let m = _mm256_set1_ps(std::hint::black_box(0.999_99));
        let a = _mm256_set1_ps(std::hint::black_box(1e-6));
        let mut acc = [_mm256_set1_ps(1.0); CHAINS];
        for _ in 0..iters {
            for x in &mut acc {
                *x = _mm256_fmadd_ps(*x, m, a);
            }
        }
        std::hint::black_box(acc);
        iters * CHAINS as u64 * 8 * 2
    }

    /// AVX-512F: `CHAINS` chains of 16-lane FMAs.
    pub(super) fn avx512(iters: u64) -> u64 {
        // SAFETY: chosen only when the CPU has AVX-512F (`widest`).
        unsafe { avx512_loop(iters) }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn avx512_loop(iters: u64) -> u64 {
        let m = _mm512_set1_ps(std::hint::black_box(0.999_99));
        let a = _mm512_set1_ps(std::hint::black_box(1e-6));
        let mut acc = [_mm512_set1_ps(1.0); CHAINS];
        for _ in 0..iters {
            for x in &mut acc {
                *x = _mm512_fmadd_ps(*x, m, a);
            }
        }
        std::hint::black_box(acc);
        iters * CHAINS as u64 * 16 * 2
    }
}

/// The first `model name` in `/proc/cpuinfo`, where there is one.
fn cpu_model() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    model_name(&text)
}

/// The value of the first `model name` line of a cpuinfo text.
fn model_name(cpuinfo: &str) -> Option<String> {
    cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peak_is_measured_on_the_threads_asked_for() {
        let peak = measure(2).unwrap();
        assert_eq!(peak.threads, 2);
        assert!(peak.flops_per_s > 1e6, "{peak:?}");
        eprintln!("{}", peak.describe());
        assert!(peak.describe().starts_with("measured f32 peak "));
        assert!(machine_key(2).ends_with(&format!(" | {} | 2 thread(s)", peak.isa)));
    }

    /// The peak is the best of three measurements around the GEMM's: on a shared machine one
    /// measurement can lose its core to another process (and the tests run in parallel).
    #[test]
    fn the_gemm_rate_is_below_the_peak() {
        let peak_now = || measure(1).unwrap().flops_per_s;
        let before = peak_now();
        let rate = gemm_rate(1).unwrap();
        let peak = [before, peak_now(), peak_now()]
            .into_iter()
            .fold(0.0, f64::max);
        eprintln!(
            "GEMM {:.1} GFLOP/s of a {:.1} GFLOP/s peak",
            rate / 1e9,
            peak / 1e9
        );
        assert!(rate > 0.0 && rate < 1.2 * peak, "{rate} against {peak}");
    }

    #[test]
    fn the_cpu_model_is_read_from_cpuinfo() {
        let text = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t: fma avx2\n";
        assert_eq!(model_name(text).as_deref(), Some("AMD EPYC 7B13"));
        assert_eq!(model_name("processor: 0\n"), None);
    }

    #[test]
    fn every_loop_counts_its_flops() {
        assert_eq!(scalar(10), 10 * CHAINS as u64 * 2);
        let (_, kernel) = widest();
        assert!(kernel(10) >= 10 * CHAINS as u64 * 2);
    }
}
