//! Running and timing one candidate: the [`CandidateRunner`] seam (the real kernels, or a
//! test's wrapper around them), the correctness check against the reference output, and
//! repeated timing with warm-up and outlier rejection.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use mslc_core::ops::DType;
use mslc_kernels::binding::KernelChoice;
use mslc_kernels::step::{Operands, StepKernel, MAX_OUTPUTS};

use crate::case::Case;

/// Runs a prepared candidate kernel on a case's inputs. The tuner times and checks whatever
/// this writes; tests wrap [`KernelRunner`] to plant wrong or failing candidates.
pub trait CandidateRunner: Sync {
    /// Runs `kernel` (prepared from `choice`) on `case`'s inputs into `out` (a multi-output
    /// step's outputs one after another, holding the operands it updates for an update in
    /// place: [`Case::start_state`]), reading input 1 from `packed_b` when given
    /// ([`Case::pack_ahead`]).
    fn run(
        &self,
        case: &Case,
        choice: &KernelChoice,
        kernel: &StepKernel,
        packed_b: Option<&[f32]>,
        out: &mut [f32],
    ) -> Result<(), String>;
}

/// The executor's kernels, called as a step of the module would call them.
pub struct KernelRunner;

impl CandidateRunner for KernelRunner {
    fn run(
        &self,
        case: &Case,
        _choice: &KernelChoice,
        kernel: &StepKernel,
        packed_b: Option<&[f32]>,
        out: &mut [f32],
    ) -> Result<(), String> {
        let inputs = case.views();
        let shape = case.output_shape();
        let (out, more_outs) = split_outputs(case, out)?;
        let io = Operands {
            inputs: &inputs,
            ints: case.ints(),
            out,
            out_shape: &shape,
            in_place: case.in_place,
            more_outs,
        };
        kernel
            .run_with_packed_b(io, packed_b)
            .map_err(|e| e.to_string())
    }
}

/// One candidate of a case, ready to run as the module's executor would run it: its kernel
/// and, where the executor packs input 1 ahead, that operand packed for it
/// ([`Case::pack_ahead`]).
pub struct Candidate<'a> {
    case: &'a Case,
    choice: KernelChoice,
    kernel: StepKernel,
    packed_b: Option<Vec<f32>>,
}

impl<'a> Candidate<'a> {
    /// `choice` for `case`, or why it cannot be prepared.
    pub fn new(case: &'a Case, choice: KernelChoice) -> Result<Candidate<'a>, String> {
        let kernel = case.prepare(&choice)?;
        let packed_b = case.pack_ahead(&kernel)?;
        Ok(Candidate {
            case,
            choice,
            kernel,
            packed_b,
        })
    }

    /// The prepared kernel.
    pub fn kernel(&self) -> &StepKernel {
        &self.kernel
    }

    /// Runs once into `out` (which holds the case's [`Case::start_state`]), turning a panic
    /// inside the kernel into an error.
    pub fn run_once(&self, runner: &dyn CandidateRunner, out: &mut [f32]) -> Result<(), String> {
        let (case, choice, kernel) = (self.case, &self.choice, &self.kernel);
        let packed_b = self.packed_b.as_deref();
        catch_unwind(AssertUnwindSafe(|| {
            runner.run(case, choice, kernel, packed_b, out)
        }))
        .unwrap_or_else(|_| Err("the kernel panicked".to_string()))
    }

    /// Seconds per run ([`repeat`]ed), with the case's weights evicted from every cache level
    /// before each timed run: a forward reads each weight once, from memory (or from the last
    /// level for a model whose weights all fit there), while a kernel run over and over finds
    /// them in L1 or L2. Timed warm, tiny_llama's decode products picked candidates reading
    /// their weights as f32 rather than f16 panels (up to 2× faster here), and the forward with
    /// them took 1.66× as long. TVM's CPU runner flushes its operands for the same reason
    /// (`enable_cpu_cache_flush`). An update in place starts each run from its state
    /// ([`Case::start_state`]), evicted too: a train step updates each parameter and its
    /// moments once, from memory.
    pub fn time(&self, runner: &dyn CandidateRunner, out: &mut [f32]) -> Result<f64, String> {
        let views = self.case.views();
        let weights: Vec<&[f32]> = views
            .iter()
            .zip(&self.case.weights)
            .filter(|(_, &weight)| weight)
            .map(|(v, _)| v.data)
            .chain(self.packed_b.as_deref())
            .collect();
        let out = std::cell::RefCell::new(out);
        repeat_with(
            || {
                weights.iter().for_each(|w| evict(w));
                if self.case.in_place {
                    let mut out = out.borrow_mut();
                    self.case.start_state(&self.kernel, &mut out);
                    evict(&out);
                }
            },
            || self.run_once(runner, &mut out.borrow_mut()),
            MIN_TIME,
        )
    }

    /// Seconds per run once a first run's output has passed [`check_output`] against
    /// `reference`; the error says which failed ("fails to run: …" or "wrong result: …").
    pub fn checked_time(
        &self,
        runner: &dyn CandidateRunner,
        reference: &[f32],
        out: &mut [f32],
    ) -> Result<f64, String> {
        self.case.start_state(&self.kernel, out);
        self.run_once(runner, out)
            .map_err(|e| format!("fails to run: {e}"))?;
        check_outputs(self.case, out, reference).map_err(|e| format!("wrong result: {e}"))?;
        self.time(runner, out)
            .map_err(|e| format!("fails to run: {e}"))
    }
}

/// A case's outputs, one after another in `out`: the first, and the slots of the rest as a
/// step's operands take them.
type SplitOutputs<'o> = (&'o mut [f32], [Option<&'o mut [f32]>; MAX_OUTPUTS - 1]);

/// `out` cut into a case's outputs ([`SplitOutputs`]), allocating nothing: a timed run does it.
fn split_outputs<'o>(case: &Case, out: &'o mut [f32]) -> Result<SplitOutputs<'o>, String> {
    let mut lens = case.output_lens();
    let first = lens.next().unwrap_or(0).min(out.len());
    let (first, mut rest) = out.split_at_mut(first);
    let mut more: [Option<&mut [f32]>; MAX_OUTPUTS - 1] = Default::default();
    for (i, len) in lens.enumerate() {
        let slot = more
            .get_mut(i)
            .ok_or_else(|| format!("a step writes at most {MAX_OUTPUTS} outputs"))?;
        let len = len.min(rest.len());
        let (this, tail) = std::mem::take(&mut rest).split_at_mut(len);
        *slot = Some(this);
        rest = tail;
    }
    Ok((first, more))
}

/// [`check_output`] of each of a case's outputs against the reference's, which lie one after
/// another in `got` and `want` alike (each output's own scale sets its tolerance).
fn check_outputs(case: &Case, got: &[f32], want: &[f32]) -> Result<(), String> {
    if got.len() != want.len() {
        return check_output(got, want, KERNEL_ROUNDING);
    }
    let mut start = 0;
    for (i, len) in case.output_lens().enumerate() {
        let span = start..start + len;
        check_output(&got[span.clone()], &want[span], KERNEL_ROUNDING).map_err(|e| {
            match case.more_outputs.is_empty() {
                true => e,
                false => format!("output {i}: {e}"),
            }
        })?;
        start += len;
    }
    Ok(())
}

/// The rounding of a kernel's own output, which it writes in f32 whatever the case's dtypes.
pub(crate) const KERNEL_ROUNDING: f64 = DType::F32.unit_roundoff();

/// Fewest timed runs per measurement.
const MIN_SAMPLES: usize = 5;
/// Most timed runs per measurement.
const MAX_SAMPLES: usize = 200;
/// Timed runs continue (up to [`MAX_SAMPLES`]) until this much time has been spent.
const MIN_TIME: Duration = Duration::from_millis(15);

/// Seconds per call of `run`: one warm-up call, then at least [`MIN_SAMPLES`] timed calls
/// (more, up to [`MAX_SAMPLES`], while under [`MIN_TIME`]); the slowest quarter of the samples
/// is dropped as interference (page faults, other processes) and the median of the rest is
/// the result.
pub fn repeat(run: impl FnMut() -> Result<(), String>) -> Result<f64, String> {
    repeat_for(run, MIN_TIME)
}

/// [`repeat`], with timed calls continuing (up to [`MAX_SAMPLES`]) until `min_time` has been
/// spent (a whole forward is measured for longer than one kernel).
pub fn repeat_for(
    run: impl FnMut() -> Result<(), String>,
    min_time: Duration,
) -> Result<f64, String> {
    repeat_with(|| {}, run, min_time)
}

/// [`repeat_for`], calling `before` (untimed) before each call of `run`, the warm-up's included.
fn repeat_with(
    mut before: impl FnMut(),
    mut run: impl FnMut() -> Result<(), String>,
    min_time: Duration,
) -> Result<f64, String> {
    mslc_kernels::par::with_threads_awake(|| {
        before();
        run()?;
        let start = Instant::now();
        let mut samples = Vec::new();
        while samples.len() < MIN_SAMPLES
            || (samples.len() < MAX_SAMPLES && start.elapsed() < min_time)
        {
            before();
            let t = Instant::now();
            run()?;
            samples.push(t.elapsed().as_secs_f64());
        }
        Ok(robust_time(&mut samples))
    })
}

/// Evicts `data` from every level of this machine's caches (each of its cache lines flushed
/// to memory), so the next read of it comes from memory; nothing where the CPU has no such
/// instruction.
fn evict(data: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        /// Bytes of a cache line.
        const LINE_BYTES: usize = 64;
        let bytes = std::mem::size_of_val(data);
        let start = data.as_ptr().cast::<u8>();
        for offset in (0..bytes).step_by(LINE_BYTES) {
            // SAFETY: the address lies inside `data`; CLFLUSH (SSE2, part of the x86_64
            // baseline) writes nothing the program sees.
            unsafe { std::arch::x86_64::_mm_clflush(start.add(offset)) };
        }
        // SAFETY: MFENCE (SSE2) orders the flushes before the timed run's loads.
        unsafe { std::arch::x86_64::_mm_mfence() };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

/// A tuned choice must beat the default by this factor in the final, fresh re-measurement
/// of both, or the default is kept: a "win" inside the noise is no win.
pub const CONFIRM: f64 = 0.97;

/// The median of the fastest three quarters of `samples`.
pub fn robust_time(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    let keep = (samples.len() * 3).div_ceil(4).max(1);
    samples[keep / 2]
}

/// Checks `got` against the reference `want`: same length, finite where the reference is, and
/// within a tolerance scaled by the reference's largest magnitude (f32 accumulation in any
/// order stays far inside it; a wrong tile, a missed row or a bad epilogue does not). `rounding`
/// is the unit roundoff ([`DType::unit_roundoff`]) of the coarsest dtype `got` was held in on
/// its way: a bf16 result is off its f32 reference by up to half a bf16 spacing, and by two
/// when an unfused chain rounds its intermediate too.
pub fn check_output(got: &[f32], want: &[f32], rounding: f64) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{} values where the reference has {}",
            got.len(),
            want.len()
        ));
    }
    let scale = want
        .iter()
        .filter(|w| w.is_finite())
        .fold(0.0f32, |m, w| m.max(w.abs()));
    let rounding = rounding as f32;
    let tol = |w: f32| 1e-3 * (scale + w.abs()) + rounding * (scale + 2.0 * w.abs()) + 1e-6;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let same = if w.is_finite() {
            (g - w).abs() <= tol(w)
        } else {
            g.is_nan() == w.is_nan() && (w.is_nan() || g == w)
        };
        if !same {
            return Err(format!(
                "value {i} is {g}, the reference kernel gives {w} (tolerance {:.2e})",
                tol(w)
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn robust_time_drops_the_slow_outliers() {
        let mut s = vec![1.0, 1.1, 0.9, 1.0, 50.0, 1.05, 40.0, 0.95];
        let t = robust_time(&mut s);
        assert!((0.9..=1.1).contains(&t), "{t}");
        assert_eq!(robust_time(&mut [2.0]), 2.0);
    }

    /// What must happen before a timed run (evicting a candidate's weights) happens before
    /// every run, the warm-up's included, and outside the timed span; evicting changes no value.
    #[test]
    fn the_untimed_preparation_precedes_every_run() {
        use std::cell::Cell;
        let (prepared, runs) = (Cell::new(0), Cell::new(0));
        let weights = vec![1.5f32; 4096];
        let t = repeat_with(
            || {
                prepared.set(prepared.get() + 1);
                evict(&weights);
                std::thread::sleep(Duration::from_millis(2));
            },
            || {
                assert_eq!(prepared.get(), runs.get() + 1);
                runs.set(runs.get() + 1);
                Ok(())
            },
            Duration::ZERO,
        )
        .unwrap();
        assert_eq!(runs.get(), MIN_SAMPLES + 1);
        assert!(t < 1e-3, "the preparation's 2 ms were timed: {t} s");
        assert!(weights.iter().all(|&w| w == 1.5));
        evict(&[]);
    }

    #[test]
    fn outputs_are_checked_against_the_reference() {
        let want = [1.0, -2.0, 3.0];
        let f32_ = KERNEL_ROUNDING;
        assert!(check_output(&[1.0, -2.0, 3.0005], &want, f32_).is_ok());
        assert!(check_output(&[1.0, -2.0, 3.1], &want, f32_).is_err());
        assert!(check_output(&[1.0, -2.0], &want, f32_).is_err());
        assert!(check_output(&[1.0, f32::NAN, 3.0], &want, f32_).is_err());
    }

    /// A bf16 result is its f32 reference rounded (16.069 is 16.125 in bf16, whose spacing
    /// there is 0.125): correct, though off by far more than f32 accumulation ever is; a bf16
    /// result off by a few spacings is still wrong.
    #[test]
    fn a_result_held_in_bf16_may_be_off_by_its_rounding() {
        let bf16 = DType::BF16.unit_roundoff();
        let want = [16.069405, -36.6, 2.0];
        let rounded = want.map(|w| half::bf16::from_f32(w).to_f32());
        assert_eq!(rounded[0], 16.125);
        assert!(check_output(&rounded, &want, KERNEL_ROUNDING).is_err());
        assert!(check_output(&rounded, &want, bf16).is_ok());
        assert!(check_output(&[16.125, -36.6, 3.0], &want, bf16).is_err());
        assert!(check_output(&[17.0, -36.6, 2.0], &want, bf16).is_err());
    }
}
