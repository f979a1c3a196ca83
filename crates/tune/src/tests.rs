//! Tuner tests on small cases with tiny budgets: the correctness guard rejects a planted wrong
//! candidate, the knowledge base makes a second run measure nothing, and a stop keeps what
//! was measured.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use mslc_core::ops::{Attrs, DType, Op, TensorType};
use mslc_kernels::binding::{choose_kernel, KernelChoice};
use mslc_kernels::step::StepKernel;

use crate::case::Case;
use crate::kb::KnowledgeBase;
use crate::measure::{CandidateRunner, KernelRunner};
use crate::tuner::{tune, Observer, Options, Progress, Source};

fn matmul_case(m: i64, k: i64, n: i64) -> Case {
    let a = TensorType::new(DType::F32, vec![m, k]);
    let b = TensorType::new(DType::F32, vec![k, n]);
    let out = TensorType::new(DType::F32, vec![m, n]);
    let sig = format!("matmul({a}, {b})");
    Case::new(sig, Op::Matmul, Attrs::new(), vec![a, b], out, 0)
}

fn softmax_case() -> Case {
    let x = TensorType::new(DType::F32, vec![64, 100]);
    let attrs = Attrs::new().with("axis", -1i64);
    Case::new(
        format!("softmax({x}) {{axis=-1}}"),
        Op::Softmax,
        attrs,
        vec![x.clone()],
        x,
        1,
    )
}

fn options(budget_ms: u64) -> Options {
    Options {
        budget: Duration::from_millis(budget_ms),
        threads: 2,
        device: "test-device".into(),
    }
}

/// Counts runs and, when `break_others` is set, corrupts the result of every candidate that
/// is not the binding's default.
struct Planted {
    runs: AtomicUsize,
    break_others: bool,
}

impl CandidateRunner for Planted {
    fn run(
        &self,
        case: &Case,
        choice: &KernelChoice,
        kernel: &StepKernel,
        out: &mut [f32],
    ) -> Result<(), String> {
        self.runs.fetch_add(1, Ordering::Relaxed);
        KernelRunner.run(case, choice, kernel, out)?;
        if self.break_others && *choice != case.default_choice() {
            out[out.len() / 2] += 0.5;
        }
        Ok(())
    }
}

struct Quiet;

impl Observer for Quiet {
    fn progress(&mut self, _: &Progress<'_>) {}
}

#[test]
fn a_wrong_candidate_is_rejected_and_never_wins() {
    let runner = Planted {
        runs: AtomicUsize::new(0),
        break_others: true,
    };
    let cases = [matmul_case(24, 40, 36)];
    let mut kb = KnowledgeBase::default();
    let stop = AtomicBool::new(false);
    let report = tune(
        &cases,
        &mut kb,
        None,
        &options(400),
        &runner,
        &stop,
        &mut Quiet,
    )
    .unwrap();
    let o = &report.outcomes[0];
    assert_eq!(o.source, Source::Measured);
    assert_eq!(
        o.params,
        choose_kernel(Op::Matmul).params,
        "the default stays"
    );
    assert!(
        o.rejected
            .iter()
            .any(|r| r.reason.starts_with("wrong result")),
        "{:?}",
        o.rejected
    );
    assert_eq!(o.candidates, 1, "only the default was measured");
}

#[test]
fn a_second_run_reuses_the_knowledge_base_and_measures_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("kb.json");
    let cases = [matmul_case(16, 32, 24), softmax_case()];
    let stop = AtomicBool::new(false);
    let mut kb = KnowledgeBase::default();
    let first = tune(
        &cases,
        &mut kb,
        Some(&db),
        &options(600),
        &KernelRunner,
        &stop,
        &mut Quiet,
    )
    .unwrap();
    for o in &first.outcomes {
        assert_eq!(o.source, Source::Measured, "{}", o.signature);
        assert!(o.default_us > 0.0 && o.tuned_us > 0.0);
        assert!(o.tuned_us <= o.default_us, "never slower than the default");
        assert!(o.candidates >= 1);
    }
    let counting = Planted {
        runs: AtomicUsize::new(0),
        break_others: false,
    };
    let mut kb = KnowledgeBase::read(&db).unwrap();
    let second = tune(
        &cases,
        &mut kb,
        Some(&db),
        &options(600),
        &counting,
        &stop,
        &mut Quiet,
    )
    .unwrap();
    assert_eq!(counting.runs.load(Ordering::Relaxed), 0);
    for (a, b) in first.outcomes.iter().zip(&second.outcomes) {
        assert_eq!(b.source, Source::KnowledgeBase);
        assert_eq!(a.params, b.params);
    }
    // Another thread count is another key: measured again.
    let mut other = options(300);
    other.threads = 1;
    let third = tune(
        &cases,
        &mut kb,
        Some(&db),
        &other,
        &KernelRunner,
        &stop,
        &mut Quiet,
    )
    .unwrap();
    assert_eq!(third.outcomes[0].source, Source::Measured);
}

/// Raises the stop flag once the tuner reports it is searching the second signature.
struct StopAtSecond<'a>(&'a AtomicBool);

impl Observer for StopAtSecond<'_> {
    fn progress(&mut self, p: &Progress<'_>) {
        if p.done >= 1 {
            self.0.store(true, Ordering::Relaxed);
        }
    }
}

#[test]
fn a_stop_keeps_what_was_measured() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("kb.json");
    let cases = [matmul_case(48, 64, 64), softmax_case()];
    let stop = AtomicBool::new(false);
    let mut kb = KnowledgeBase::default();
    let report = tune(
        &cases,
        &mut kb,
        Some(&db),
        &options(60_000),
        &KernelRunner,
        &stop,
        &mut StopAtSecond(&stop),
    )
    .unwrap();
    assert!(report.interrupted);
    assert!(report.seconds < 30.0, "stopped long before the budget");
    let saved = KnowledgeBase::read(&db).unwrap();
    let measured: Vec<_> = report
        .outcomes
        .iter()
        .filter(|o| matches!(o.source, Source::Measured | Source::Interrupted))
        .collect();
    assert!(!measured.is_empty());
    for o in measured {
        assert!(saved.get("test-device", 2, &o.signature).is_some());
    }
    let cut = report
        .outcomes
        .iter()
        .find(|o| o.source == Source::Interrupted)
        .expect("the signature being searched when stopped");
    let record = saved.get("test-device", 2, &cut.signature).unwrap();
    assert!(!record.complete, "searched again next time");
}
