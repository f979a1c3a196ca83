//! Tuner tests on small cases with tiny budgets: the correctness guard rejects a planted wrong
//! candidate (a kernel's, or a subgraph's unfused variant), the knowledge base makes a second
//! run measure nothing, a stop keeps what was measured, and the fusion pass honours a planted
//! unfused decision.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use mslc_core::ops::{Attrs, DType, Op, TensorType};
use mslc_core::program::Init;
use mslc_kernels::binding::{choose_kernel, KernelChoice};
use mslc_kernels::matmul::HalfType;
use mslc_kernels::step::StepKernel;

use mslc_artifact::Module;
use mslc_exec::Executor;
use mslc_ir::passes::{Fuse, Pass, PassContext, PassStats};
use mslc_ir::{Graph, NodeKind, ValueRef};
use mslc_plan::memory::plan_memory;
use mslc_plan::schedule::schedule;

use crate::case::Case;
use crate::graph::{
    host, tune_subgraphs, ExecRunner, GraphOutcome, Subgraph, Variant, VariantRunner,
};
use crate::kb::KnowledgeBase;
use crate::measure::{
    check_output, Candidate, CandidateRunner, KernelRunner, CONFIRM, KERNEL_ROUNDING,
};
use crate::reference::reference_output;
use crate::tuner::{tune, Observer, Options, Outcome, Progress, Source};

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
        packed_b: Option<&[f32]>,
        out: &mut [f32],
    ) -> Result<(), String> {
        self.runs.fetch_add(1, Ordering::Relaxed);
        KernelRunner.run(case, choice, kernel, packed_b, out)?;
        if self.break_others && *choice != case.default_choice() {
            // The last output's middle value (a multi-output step writes its outputs one
            // after another).
            let last = case.output_lens().last().unwrap_or(0);
            let at = out.len() - last + last / 2;
            out[at] += 0.5;
        }
        Ok(())
    }
}

struct Quiet;

impl Observer for Quiet {
    fn progress(&mut self, _: &Progress<'_>) {}
}

/// Tunes `cases` with every candidate but the default corrupted ([`Planted`]): the first
/// signature's outcome, once checked that it was measured and that a candidate was rejected
/// for a reason starting with `reason`.
fn tune_planting_wrong_candidates(cases: &[Case], reason: &str) -> Outcome {
    let runner = Planted {
        runs: AtomicUsize::new(0),
        break_others: true,
    };
    let mut kb = KnowledgeBase::default();
    let stop = AtomicBool::new(false);
    let report = tune(
        cases,
        &mut kb,
        None,
        &options(400),
        &runner,
        &stop,
        &mut Quiet,
    )
    .unwrap();
    let o = report.outcomes.into_iter().next().expect("an outcome");
    assert_eq!(o.source, Source::Measured);
    assert!(
        o.rejected.iter().any(|r| r.reason.starts_with(reason)),
        "{:?}",
        o.rejected
    );
    o
}

#[test]
fn a_wrong_candidate_is_rejected_and_never_wins() {
    let o = tune_planting_wrong_candidates(&[matmul_case(24, 40, 36)], "wrong result");
    assert_eq!(
        o.params,
        choose_kernel(Op::Matmul).params,
        "the default stays"
    );
    assert_eq!(o.candidates, 1, "only the default was measured");
}

/// Inference batch norm and the kernels of a training step's backward (norm, embedding and
/// cross-entropy gradients; the multi-output attention with its log-sum-exps, attention
/// gradient and affine norm gradients, each output checked; convolution and pool gradients)
/// and its optimizer update (in place) are searched against their reference kernels like the
/// forward's, not skipped.
#[test]
fn batch_norm_and_backward_kernels_are_searched() {
    let f32_of = |shape: &[i64]| TensorType::new(DType::F32, shape.to_vec());
    let ids = TensorType::new(DType::I32, vec![4, 6]);
    let eps = Attrs::new().with("eps", 1e-5f64);
    let losses = Attrs::new()
        .with("ignore_index", -100i64)
        .with("label_smoothing", 0.1f64);
    let cases = [
        (
            Op::BatchNorm,
            Attrs::new().with("eps", 1e-5f64).with("momentum", 0.1f64),
            vec![f32_of(&[2, 8, 5, 5]), f32_of(&[8]), f32_of(&[8])],
            f32_of(&[2, 8, 5, 5]),
        ),
        (
            Op::RmsNormGrad,
            eps.clone(),
            vec![f32_of(&[24, 32]), f32_of(&[24, 32])],
            f32_of(&[24, 32]),
        ),
        (
            Op::LayerNormGrad,
            eps,
            vec![f32_of(&[24, 32]), f32_of(&[24, 32])],
            f32_of(&[24, 32]),
        ),
        (
            Op::EmbeddingGrad,
            Attrs::new().with("vocab", 50i64),
            vec![ids.clone(), f32_of(&[4, 6, 16])],
            f32_of(&[50, 16]),
        ),
        (
            Op::CrossEntropyGrad,
            losses,
            vec![f32_of(&[4, 6, 40]), ids, f32_of(&[])],
            f32_of(&[4, 6, 40]),
        ),
    ]
    .into_iter()
    .chain(convolution_backward_cases())
    .map(|(op, attrs, inputs, output)| Case::new(format!("{op:?}"), op, attrs, inputs, output, 0))
    .chain(multi_output_cases())
    .collect::<Vec<_>>();
    let mut kb = KnowledgeBase::default();
    let stop = AtomicBool::new(false);
    let options = options(150 * cases.len() as u64);
    let report = tune(
        &cases,
        &mut kb,
        None,
        &options,
        &KernelRunner,
        &stop,
        &mut Quiet,
    )
    .unwrap();
    for o in &report.outcomes {
        assert_eq!(o.source, Source::Measured, "{}", o.signature);
        assert!(o.candidates >= 1, "{}", o.signature);
        assert!(o.rejected.is_empty(), "{}: {:?}", o.signature, o.rejected);
    }
}

/// A convolutional network's backward steps (ResNet's): a strided, padded convolution's input
/// and weight gradients and those of its max and adaptive average pools, in f16 as ResNet
/// trains them: `(op, attrs, inputs, output)`.
fn convolution_backward_cases() -> [(Op, Attrs, Vec<TensorType>, TensorType); 4] {
    let f16_of = |shape: &[i64]| TensorType::new(DType::F16, shape.to_vec());
    let pairs = |attrs: Attrs, names: [(&str, [i64; 2]); 3]| {
        names
            .into_iter()
            .fold(attrs, |a, (name, pair)| a.with(name, pair.to_vec()))
    };
    let conv = |last: (&str, [i64; 2])| {
        let a = Attrs::new()
            .with("groups", 1i64)
            .with("dilation", vec![1i64, 1]);
        pairs(a, [("stride", [2, 2]), ("padding", [1, 1]), last])
    };
    let (x, w, dy) = (
        f16_of(&[2, 8, 9, 9]),
        f16_of(&[16, 8, 3, 3]),
        f16_of(&[2, 16, 5, 5]),
    );
    let pool = pairs(
        Attrs::new(),
        [("kernel", [3, 3]), ("stride", [2, 2]), ("padding", [1, 1])],
    );
    [
        (
            Op::Conv2dGradInput,
            conv(("size", [9, 9])),
            vec![dy.clone(), w.clone()],
            x.clone(),
        ),
        (
            Op::Conv2dGradWeight,
            conv(("kernel", [3, 3])),
            vec![x.clone(), dy],
            w,
        ),
        (
            Op::MaxPool2dGrad,
            pool,
            vec![x.clone(), f16_of(&[2, 8, 5, 5])],
            x.clone(),
        ),
        (
            Op::AdaptiveAvgPool2dGrad,
            Attrs::new().with("output", vec![1i64, 1]),
            vec![x.clone(), f16_of(&[2, 8, 1, 1])],
            x,
        ),
    ]
}

/// Steps of the backward that write several outputs.
fn multi_output_cases() -> Vec<Case> {
    let f32_of = |shape: &[i64]| TensorType::new(DType::F32, shape.to_vec());
    let (qkv, lse) = (f32_of(&[2, 20, 2, 8]), f32_of(&[2, 20, 2]));
    let causal = Attrs::new().with("causal", true);
    let eps = Attrs::new().with("eps", 1e-5f64);
    let (x, w) = (f32_of(&[24, 32]), f32_of(&[32]));
    let mut attention_grad_inputs = vec![qkv.clone(); 5];
    attention_grad_inputs.push(lse.clone());
    [
        (
            Op::AttentionLse,
            causal.clone(),
            vec![qkv.clone(); 3],
            vec![qkv.clone(), lse],
        ),
        (
            Op::AttentionGrad,
            causal,
            attention_grad_inputs,
            vec![qkv; 3],
        ),
        (
            Op::RmsNormScaleGrad,
            eps.clone(),
            vec![x.clone(), w.clone(), x.clone()],
            vec![x.clone(), w.clone()],
        ),
        (
            Op::LayerNormAffineGrad,
            eps,
            vec![x.clone(), w.clone(), x.clone()],
            vec![x, w.clone(), w],
        ),
    ]
    .into_iter()
    .map(|(op, attrs, inputs, mut outputs)| {
        let first = outputs.remove(0);
        let mut case = Case::new(format!("{op:?}"), op, attrs, inputs, first, 0);
        case.more_outputs = outputs;
        case
    })
    .chain([adam_case()])
    .collect()
}

/// A train step's AdamW update of a 3,000-element parameter, in place: its outputs p, m and v
/// overwrite its operands p, m and v.
fn adam_case() -> Case {
    let (state, scalar) = (
        TensorType::new(DType::F32, vec![3000]),
        TensorType::new(DType::F32, vec![]),
    );
    let attrs = Attrs::new()
        .with("beta1", 0.9f64)
        .with("beta2", 0.95f64)
        .with("eps", 1e-8f64)
        .with("weight_decay", 0.1f64)
        .with("decoupled", true);
    let mut inputs = vec![state.clone(); 4];
    inputs.extend([scalar.clone(), scalar.clone(), scalar]);
    let mut case = Case::new("AdamUpdate".into(), Op::AdamUpdate, attrs, inputs, state, 0);
    case.more_outputs = vec![case.output.clone(); 2];
    case.in_place = true;
    case
}

/// An update in place starts every run from its state, as a train step's does: after the
/// check's run, the warm-up and every timed run, its outputs hold one step's update (the
/// reference's), not one per run.
#[test]
fn an_update_in_place_starts_every_run_from_its_state() {
    let case = adam_case();
    let candidate = Candidate::new(&case, case.default_choice()).unwrap();
    let views = case.views();
    let want = reference_output(
        candidate.kernel(),
        case.op,
        &case.attrs,
        &views,
        case.ints(),
    )
    .unwrap()
    .unwrap();
    let mut out = vec![f32::NAN; case.output_len()];
    candidate
        .checked_time(&KernelRunner, &want, &mut out)
        .unwrap();
    check_output(&out, &want, KERNEL_ROUNDING).unwrap();
    // Run once more from where the runs left it, it is two steps on: the check would see it.
    candidate.run_once(&KernelRunner, &mut out).unwrap();
    assert!(check_output(&out, &want, KERNEL_ROUNDING).is_err());
}

/// A candidate that is wrong only in a multi-output step's last output is rejected.
#[test]
fn a_candidate_wrong_in_a_later_output_is_rejected() {
    let cases: Vec<Case> = multi_output_cases()
        .into_iter()
        .filter(|c| c.op == Op::AttentionGrad)
        .collect();
    tune_planting_wrong_candidates(&cases, "wrong result: output 2:");
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

/// `relu(x * w + x)` over `x: DTYPE[64, 300]`, `w: DTYPE[300]`: one elementwise chain.
fn chain_graph(dtype: DType) -> Graph {
    let mut g = Graph::new("chain");
    let x = g.add_input("x", TensorType::new(dtype, vec![64, 300]));
    let w = g.add_input("w", TensorType::new(dtype, vec![300]));
    let op =
        |g: &mut Graph, op: Op, args: &[ValueRef]| g.add_op(op, Attrs::new(), args, "").unwrap()[0];
    let m = op(&mut g, Op::Mul, &[x, w]);
    let a = op(&mut g, Op::Add, &[m, x]);
    let y = op(&mut g, Op::Relu, &[a]);
    g.set_output("y", y);
    g
}

/// `graph` fused under `cx`, scheduled and memory-planned; with the fusion pass's rewrites.
fn fused_module(mut graph: Graph, cx: &PassContext) -> (Module, PassStats) {
    let stats = Fuse.run(&mut graph, cx).unwrap();
    let mut module = schedule(&graph, &host()).unwrap();
    plan_memory(&mut module, false).unwrap();
    (module, stats)
}

#[test]
fn a_planted_unfused_decision_is_honoured_by_the_fusion_pass() {
    let (module, stats) = fused_module(chain_graph(DType::F16), &PassContext::default());
    assert_eq!(stats.rewrites.get("fuse.elementwise"), Some(&1));
    let subgraphs = Subgraph::of_module(&module);
    assert_eq!(subgraphs.len(), 1);
    let signature = subgraphs[0].signature.clone();
    assert!(
        signature.starts_with("fused_elementwise(f16[64,300], f16[300]) {program="),
        "{signature}"
    );

    // A decision for another subgraph changes nothing.
    let other = PassContext {
        unfused: BTreeSet::from([signature.replace("f16[300]", "f16[301]")]),
        ..PassContext::default()
    };
    let (same, _) = fused_module(chain_graph(DType::F16), &other);
    assert_eq!(Subgraph::of_module(&same).len(), 1);

    let planted = PassContext {
        unfused: BTreeSet::from([signature]),
        ..PassContext::default()
    };
    let (unfused, stats) = fused_module(chain_graph(DType::F16), &planted);
    assert_eq!(
        stats.rewrites.get("fuse.elementwise_left_unfused"),
        Some(&1)
    );
    assert!(!stats.rewrites.contains_key("fuse.elementwise"));
    let ops: Vec<Op> = unfused.steps.iter().map(|s| s.op).collect();
    assert_eq!(ops, [Op::Mul, Op::Add, Op::Relu]);
}

/// Counts variant runs and, when `break_unfused` is set, corrupts the unfused result.
struct PlantedVariant {
    runs: AtomicUsize,
    break_unfused: bool,
}

impl VariantRunner for PlantedVariant {
    fn run(&self, variant: Variant, exec: &mut Executor) -> Result<(), String> {
        self.runs.fetch_add(1, Ordering::Relaxed);
        ExecRunner.run(variant, exec)
    }

    fn output(&self, variant: Variant, exec: &Executor) -> Result<Vec<f32>, String> {
        let mut out = ExecRunner.output(variant, exec)?;
        if self.break_unfused && variant == Variant::Unfused {
            let mid = out.len() / 2;
            out[mid] += 0.5;
        }
        Ok(out)
    }
}

#[test]
fn subgraphs_are_decided_by_measuring_both_variants_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("kb.json");
    let stop = AtomicBool::new(false);
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let (module, _) = fused_module(chain_graph(dtype), &PassContext::default());
        let subgraphs = Subgraph::of_module(&module);
        let mut kb = KnowledgeBase::default();
        let first = tune_subgraphs(
            &subgraphs,
            &mut kb,
            Some(&db),
            &options(5_000),
            &ExecRunner,
            &stop,
            &mut Quiet,
        )
        .unwrap();
        let o = &first[0];
        assert_eq!(o.source, Source::Measured, "{dtype}: {o:?}");
        // Both variants matched the reference kernel, or the unfused one would be rejected.
        assert_eq!(o.rejected, None, "{dtype}");
        assert!(o.fused_us > 0.0 && o.unfused_us > 0.0, "{o:?}");
        assert_eq!(o.fused, o.unfused_us >= o.fused_us * CONFIRM, "{o:?}");
        assert_eq!(o.ops, 3);

        let counting = PlantedVariant {
            runs: AtomicUsize::new(0),
            break_unfused: false,
        };
        let mut kb = KnowledgeBase::read(&db).unwrap();
        let second = tune_subgraphs(
            &subgraphs,
            &mut kb,
            Some(&db),
            &options(5_000),
            &counting,
            &stop,
            &mut Quiet,
        )
        .unwrap();
        assert_eq!(counting.runs.load(Ordering::Relaxed), 0);
        assert_eq!(second[0].source, Source::KnowledgeBase);
        assert_eq!(second[0].fused, o.fused);
    }
}

#[test]
fn a_wrong_unfused_variant_is_rejected_and_the_subgraph_stays_fused() {
    let (module, _) = fused_module(chain_graph(DType::F16), &PassContext::default());
    let subgraphs = Subgraph::of_module(&module);
    let runner = PlantedVariant {
        runs: AtomicUsize::new(0),
        break_unfused: true,
    };
    let mut kb = KnowledgeBase::default();
    let stop = AtomicBool::new(false);
    let out = tune_subgraphs(
        &subgraphs,
        &mut kb,
        None,
        &options(5_000),
        &runner,
        &stop,
        &mut Quiet,
    )
    .unwrap();
    let o = &out[0];
    assert!(o.fused, "{o:?}");
    assert_eq!(o.unfused_us, 0.0);
    let why = o.rejected.as_deref().unwrap_or_default();
    assert!(why.starts_with("wrong result"), "{why}");
    let record = kb.subgraph("test-device", 2, &o.signature).unwrap();
    assert!(record.fused);
    assert!(kb.unfused("test-device", 2).is_empty());
}

/// Every subgraph of `subgraphs` decided by measuring it, from an empty knowledge base.
fn decide_afresh(subgraphs: &[Subgraph]) -> Vec<GraphOutcome> {
    let stop = AtomicBool::new(false);
    let mut kb = KnowledgeBase::default();
    tune_subgraphs(
        subgraphs,
        &mut kb,
        None,
        &options(5_000),
        &ExecRunner,
        &stop,
        &mut Quiet,
    )
    .unwrap()
}

/// `layer_norm(rms_norm(relu(x @ w.T + b)) * g) * g2 + b2` over `x: f32[16, 32]`,
/// `w: f32[24, 32]`: a matmul epilogue, a scaled RMS norm and an affine layer norm.
fn matmul_norm_graph() -> Graph {
    let mut g = Graph::new("matmul_norm");
    let f32s = |shape: Vec<i64>| TensorType::new(DType::F32, shape);
    let x = g.add_input("x", f32s(vec![16, 32]));
    let w = g.add_input("w", f32s(vec![24, 32]));
    let [b, gain, gain2, b2] = ["b", "g", "g2", "b2"].map(|n| g.add_input(n, f32s(vec![24])));
    let op = |g: &mut Graph, op: Op, attrs: Attrs, args: &[ValueRef]| {
        g.add_op(op, attrs, args, "").unwrap()[0]
    };
    let flags = Attrs::new().with("transpose_b", true);
    let eps = || Attrs::new().with("eps", 1e-5);
    let mm = op(&mut g, Op::Matmul, flags, &[x, w]);
    let a = op(&mut g, Op::Add, Attrs::new(), &[mm, b]);
    let r = op(&mut g, Op::Relu, Attrs::new(), &[a]);
    let n = op(&mut g, Op::RmsNorm, eps(), &[r]);
    let s = op(&mut g, Op::Mul, Attrs::new(), &[n, gain]);
    let l = op(&mut g, Op::LayerNorm, eps(), &[s]);
    let m = op(&mut g, Op::Mul, Attrs::new(), &[l, gain2]);
    let y = op(&mut g, Op::Add, Attrs::new(), &[m, b2]);
    g.set_output("y", y);
    g
}

/// `relu(x @ w.T + b)` over `x: bf16[64, 784]`, `w: bf16[256, 784]`: `examples/mlp.msl`'s
/// first layer, whose sums over 784 terms reach magnitudes where a bf16 spacing is 0.125.
#[test]
fn a_bf16_matmul_subgraph_is_checked_at_bf16_precision() {
    let mut g = Graph::new("bf16_linear");
    let bf16 = |shape: Vec<i64>| TensorType::new(DType::BF16, shape);
    let x = g.add_input("x", bf16(vec![64, 784]));
    let w = g.add_input("w", bf16(vec![256, 784]));
    let b = g.add_input("b", bf16(vec![256]));
    let flags = Attrs::new().with("transpose_b", true);
    let mm = g.add_op(Op::Matmul, flags, &[x, w], "").unwrap()[0];
    let a = g.add_op(Op::Add, Attrs::new(), &[mm, b], "").unwrap()[0];
    let y = g.add_op(Op::Relu, Attrs::new(), &[a], "").unwrap()[0];
    g.set_output("y", y);
    let (module, _) = fused_module(g, &PassContext::default());
    let out = decide_afresh(&Subgraph::of_module(&module));
    assert_eq!(out.len(), 1);
    // Both variants, rounded to bf16 (the unfused one twice), pass the f32 reference's check.
    assert_eq!(out[0].source, Source::Measured, "{:?}", out[0]);
    assert_eq!(out[0].rejected, None, "{:?}", out[0]);
}

#[test]
fn fused_matmul_and_norm_subgraphs_are_decided_and_the_fusion_pass_honours_them() {
    let (module, _) = fused_module(matmul_norm_graph(), &PassContext::default());
    let subgraphs = Subgraph::of_module(&module);
    let ops: Vec<&str> = subgraphs
        .iter()
        .map(|s| s.signature.split('(').next().unwrap())
        .collect();
    assert_eq!(ops, ["fused_matmul", "rms_norm_scale", "layer_norm_affine"]);

    // Both variants of each are built, checked against the fused op's reference kernel
    // (a wrong decomposition would be rejected) and timed.
    let out = decide_afresh(&subgraphs);
    for o in &out {
        assert_eq!(o.source, Source::Measured, "{o:?}");
        assert_eq!(o.rejected, None, "{o:?}");
        assert!(o.fused_us > 0.0 && o.unfused_us > 0.0, "{o:?}");
        assert_eq!(o.fused, o.unfused_us >= o.fused_us * CONFIRM, "{o:?}");
    }
    assert_eq!(out.iter().map(|o| o.ops).collect::<Vec<_>>(), [3, 2, 3]);

    // Planted unfused decisions: the patterns stay as they are, what is left of them fused
    // by the elementwise rule.
    let planted = PassContext {
        unfused: subgraphs.iter().map(|s| s.signature.clone()).collect(),
        ..PassContext::default()
    };
    let (unfused, stats) = fused_module(matmul_norm_graph(), &planted);
    // Kernel tuning then searches the unfused ops and the fused ones both, whichever the
    // whole-model confirmation keeps.
    let tuned: BTreeSet<String> = Case::to_tune(&module, &unfused, &planted.unfused)
        .into_iter()
        .map(|c| c.signature)
        .collect();
    let of = |m: &Module| Case::of_module(m).into_iter().map(|c| c.signature);
    assert!(
        of(&module).chain(of(&unfused)).all(|s| tuned.contains(&s)),
        "{tuned:?}"
    );
    assert!(
        planted.unfused.iter().all(|s| tuned.contains(s)),
        "{tuned:?}"
    );
    assert_eq!(stats.rewrites.get("fuse.matmul_left_unfused"), Some(&1));
    assert_eq!(stats.rewrites.get("fuse.norm_left_unfused"), Some(&2));
    let ops: Vec<Op> = unfused.steps.iter().map(|s| s.op).collect();
    assert_eq!(
        ops,
        [
            Op::Matmul,
            Op::FusedElementwise,
            Op::RmsNorm,
            Op::Mul,
            Op::LayerNorm,
            Op::FusedElementwise
        ]
    );
}

/// `relu(x @ w.T + b) * m` with `w: f32[24, 32]` a parameter (a weight), `x: f32[16, 32]` an
/// input and `m: f32[16, 24]` the product's multiplier.
fn weighted_graph() -> Graph {
    let mut g = Graph::new("weighted");
    let f32s = |shape: Vec<i64>| TensorType::new(DType::F32, shape);
    let x = g.add_input("x", f32s(vec![16, 32]));
    let w = g.add_param("w", f32s(vec![24, 32]), Init::Zeros, true);
    let b = g.add_input("b", f32s(vec![24]));
    let flags = Attrs::new().with("transpose_b", true);
    let mm = g.add_op(Op::Matmul, flags, &[x, w], "").unwrap()[0];
    let a = g.add_op(Op::Add, Attrs::new(), &[mm, b], "").unwrap()[0];
    let r = g.add_op(Op::Relu, Attrs::new(), &[a], "").unwrap()[0];
    let m = g.add_input("m", f32s(vec![16, 24]));
    let y = g.add_op(Op::Mul, Attrs::new(), &[r, m], "").unwrap()[0];
    g.set_output("y", y);
    g
}

/// A weight is packed once, ahead of a GEMM's calls, as the executor packs it at load: the
/// tuner times candidates (and a subgraph's variants) that way too, not packing it per call,
/// and gets the same results.
#[test]
fn weights_are_timed_packed_ahead_as_the_executor_reads_them() {
    let (module, _) = fused_module(weighted_graph(), &PassContext::default());
    let cases = Case::of_module(&module);
    let case = cases
        .iter()
        .find(|c| c.op == Op::FusedMatmul)
        .expect("the fused product");
    assert!(case.b_packed_ahead());
    // Its weight is the one operand timed cold: x, the bias and the multiplier are inputs.
    assert_eq!(case.weights, [false, true, false, false]);
    let choice = case.default_choice();
    let kernel = case.prepare(&choice).unwrap();
    let packed = case
        .pack_ahead(&kernel)
        .unwrap()
        .expect("the weight packed");
    let run = |packed_b: Option<&[f32]>| {
        let mut out = vec![f32::NAN; case.output_len()];
        KernelRunner
            .run(case, &choice, &kernel, packed_b, &mut out)
            .unwrap();
        out
    };
    let (per_call, ahead) = (run(None), run(Some(&packed)));
    assert!(per_call
        .iter()
        .zip(&ahead)
        .all(|(a, b)| a.to_bits() == b.to_bits()));
    // The reference the guard checks candidates against applies the multiplier too.
    let views = case.views();
    let want = reference_output(&kernel, case.op, &case.attrs, &views, case.ints())
        .unwrap()
        .unwrap();
    check_output(&per_call, &want, KERNEL_ROUNDING).unwrap();
    // A right operand that is an input is packed by each call.
    let plain = matmul_case(8, 16, 8);
    assert!(!plain.b_packed_ahead());
    let kernel = plain.prepare(&plain.default_choice()).unwrap();
    assert_eq!(plain.pack_ahead(&kernel).unwrap(), None);

    // The subgraph's variants take the weight as a parameter and match the reference.
    let subgraphs = Subgraph::of_module(&module);
    for variant in [Variant::Fused, Variant::Unfused] {
        let g = subgraphs[0].graph(variant).unwrap();
        let params = g
            .node_ids()
            .into_iter()
            .filter(|&id| matches!(g.node(id).kind, NodeKind::Param { .. }))
            .count();
        assert_eq!(params, 1, "{variant:?}");
    }
    let out = decide_afresh(&subgraphs);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].rejected, None, "{:?}", out[0]);
    assert_eq!(out[0].source, Source::Measured);
}

/// A case seeds an operand stored in f16 or bf16 with values of that dtype, as the executor
/// holds them (a weight packed in 16-bit panels is then exact, and passes the guard), and an
/// f32 operand with f32 values.
#[test]
fn a_case_seeds_each_operand_with_values_of_its_dtype() {
    let ty = |dtype, shape: &[i64]| TensorType::new(dtype, shape.to_vec());
    for (dtype, half) in [(DType::F16, HalfType::F16), (DType::BF16, HalfType::Bf16)] {
        let round = |v: f32| half.widen(half.narrow(v));
        let (a, b, out) = (
            ty(DType::F32, &[4, 64]),
            ty(dtype, &[64, 8]),
            ty(DType::F32, &[4, 8]),
        );
        let case = Case::new("s".into(), Op::Matmul, Attrs::new(), vec![a, b], out, 0);
        let views = case.views();
        assert!(views[1].data.iter().all(|&v| round(v) == v), "{dtype}");
        assert!(
            views[0].data.iter().any(|&v| round(v) != v),
            "f32 beside {dtype}"
        );
    }
}

/// Operands seeded within what their op reads: an embedding gradient's ids over the whole
/// table (not only below the ids' last dim), a batch norm's running variance nonnegative.
#[test]
fn a_case_seeds_ids_and_variances_its_op_can_read() {
    let f32_of = |shape: &[i64]| TensorType::new(DType::F32, shape.to_vec());
    let ids = TensorType::new(DType::I32, vec![8, 6]);
    let vocab = 50;
    let grad = Case::new(
        "e".into(),
        Op::EmbeddingGrad,
        Attrs::new().with("vocab", vocab),
        vec![ids, f32_of(&[8, 6, 4])],
        f32_of(&[vocab, 4]),
        0,
    );
    let drawn = grad.ints();
    assert_eq!(drawn.len(), 48);
    assert!(
        drawn.iter().all(|&id| (0..vocab).contains(&id)),
        "{drawn:?}"
    );
    assert!(drawn.iter().any(|&id| id >= 6), "{drawn:?}");
    let norm = Case::new(
        "b".into(),
        Op::BatchNorm,
        Attrs::new().with("eps", 1e-5f64).with("momentum", 0.1f64),
        vec![f32_of(&[2, 64, 3, 3]), f32_of(&[64]), f32_of(&[64])],
        f32_of(&[2, 64, 3, 3]),
        0,
    );
    let views = norm.views();
    assert!(views[2].data.iter().all(|&v| v >= 0.0));
    assert!(
        views[1].data.iter().any(|&v| v < 0.0),
        "the mean is not the variance"
    );
}
