//! Pass tests: IR snapshots before and after each pass on the small models in
//! `tests/passes/*.msl`, idempotence, exact rewrite counts, the pass manager's contract, and
//! the default pipeline on a full-size LLaMA.

use std::collections::BTreeMap;
use std::path::Path;

use mslc_check::{check_path, CheckOptions};
use mslc_core::ops::{Attrs, DType, Op, TensorType};
use mslc_ir::passes::{
    all_passes, default_pipeline, pass_by_name, pass_descriptions, AmpConfig, AmpLevel, Pass,
    PassContext, PassError, PassManager, PassStats,
};
use mslc_ir::{print::to_text, Graph, NodeKind};

/// The graph of the first model in `path`, which must check without errors.
fn load_path(path: &Path) -> Graph {
    let checked = check_path(path, &CheckOptions::default());
    assert!(
        !checked.has_errors(),
        "{}: {:#?}",
        path.display(),
        checked.diagnostics
    );
    mslc_ir::lower(&checked.models[0]).expect("lowering")
}

fn load(name: &str) -> Graph {
    load_path(&Path::new("tests/passes").join(format!("{name}.msl")))
}

/// Inference, verifying after every pass, no mixed precision.
fn cx() -> PassContext {
    PassContext {
        verify: true,
        ..PassContext::default()
    }
}

fn amp_cx(level: AmpLevel, compute: DType) -> PassContext {
    PassContext {
        amp: Some(AmpConfig::new(level, compute)),
        ..cx()
    }
}

/// A pipeline of the named passes, each run once.
fn pipeline(names: &[&str]) -> PassManager {
    names.iter().fold(PassManager::new(), |pm, name| {
        pm.then(pass_by_name(name).unwrap_or_else(|| panic!("no pass `{name}`")))
    })
}

fn labels(rewrites: &BTreeMap<String, usize>) -> String {
    rewrites
        .iter()
        .map(|(label, n)| format!("{label}: {n}\n"))
        .collect()
}

/// The IR before, the IR after `pm`, and the rewrites it made.
fn before_after(g: &mut Graph, pm: &PassManager, cx: &PassContext) -> String {
    let before = to_text(g);
    let report = pm.run(g, cx).unwrap_or_else(|e| panic!("{e}"));
    format!(
        "{before}\n=== after {} ===\n{}\n=== rewrites ===\n{}",
        pm.describe(),
        to_text(g),
        labels(&report.rewrites_by_label)
    )
}

fn snapshot(file: &str, names: &[&str], cx: &PassContext) -> String {
    before_after(&mut load(file), &pipeline(names), cx)
}

fn op_count(g: &Graph, op: Op) -> usize {
    g.node_ids()
        .into_iter()
        .filter(|id| g.node(*id).op() == Some(op))
        .count()
}

// ------------------------------------------------------------------------------ snapshots

#[test]
fn fold_snapshot() {
    insta::assert_snapshot!(snapshot("fold", &["fold", "dce"], &cx()));
}

#[test]
fn simplify_snapshot() {
    insta::assert_snapshot!(snapshot("simplify", &["simplify", "dce"], &cx()));
}

#[test]
fn cse_dce_snapshot() {
    insta::assert_snapshot!(snapshot("cse_dce", &["cse", "dce"], &cx()));
}

#[test]
fn fuse_mlp_snapshot() {
    let mut g = load("mlp");
    insta::assert_snapshot!(before_after(&mut g, &default_pipeline(&cx()), &cx()));
}

#[test]
fn fuse_gpt_layer_snapshot() {
    let mut g = load("gpt_layer");
    insta::assert_snapshot!(before_after(&mut g, &default_pipeline(&cx()), &cx()));
}

#[test]
fn fuse_bert_layer_snapshot() {
    let mut g = load("bert_layer");
    insta::assert_snapshot!(before_after(&mut g, &default_pipeline(&cx()), &cx()));
}

#[test]
fn fuse_llama_layer_snapshot() {
    let mut g = load("llama_layer");
    insta::assert_snapshot!(before_after(&mut g, &default_pipeline(&cx()), &cx()));
}

#[test]
fn amp_o1_snapshot() {
    let cx = amp_cx(AmpLevel::O1, DType::F16);
    insta::assert_snapshot!(snapshot("amp", &["amp", "cast_cleanup", "dce"], &cx));
}

#[test]
fn amp_o2_snapshot() {
    let cx = amp_cx(AmpLevel::O2, DType::BF16);
    insta::assert_snapshot!(snapshot(
        "amp",
        &["amp", "fold", "cast_cleanup", "dce"],
        &cx
    ));
}

#[test]
fn amp_o3_snapshot() {
    let cx = amp_cx(AmpLevel::O3, DType::F16);
    insta::assert_snapshot!(snapshot(
        "amp",
        &["amp", "fold", "cast_cleanup", "dce"],
        &cx
    ));
}

#[test]
fn amp_o2_gpt_pipeline_snapshot() {
    let cx = amp_cx(AmpLevel::O2, DType::F16);
    let mut g = load("gpt_layer");
    insta::assert_snapshot!(before_after(&mut g, &default_pipeline(&cx), &cx));
}

#[test]
fn cast_cleanup_snapshot() {
    insta::assert_snapshot!(snapshot("casts", &["cast_cleanup", "dce"], &cx()));
}

// ------------------------------------------------------------------------- exact behaviour

const FILES: [&str; 9] = [
    "fold",
    "simplify",
    "cse_dce",
    "mlp",
    "gpt_layer",
    "bert_layer",
    "llama_layer",
    "amp",
    "casts",
];

#[test]
fn cse_and_dce_counts() {
    let mut g = load("cse_dce");
    let ops_before = g.op_count();
    let cse = pass_by_name("cse").unwrap().run(&mut g, &cx()).unwrap();
    // The second `x @ w` and the second sigmoid.
    assert_eq!(
        cse.rewrites,
        BTreeMap::from([("cse.merged".to_string(), 2)])
    );
    assert_eq!(g.op_count(), ops_before - 2);
    let dce = pass_by_name("dce").unwrap().run(&mut g, &cx()).unwrap();
    // tanh(x), the literal 3.0 and their product.
    assert_eq!(
        dce.rewrites,
        BTreeMap::from([("dce.removed".to_string(), 3)])
    );
    assert_eq!(g.op_count(), ops_before - 5);
    // Inputs and parameters stay, used or not.
    let kept = g
        .node_ids()
        .into_iter()
        .filter(|id| !matches!(g.node(*id).kind, NodeKind::Op { .. }))
        .count();
    assert_eq!(kept, 2);
}

#[test]
fn dce_keeps_unused_inputs_and_params() {
    let mut g = Graph::new("g");
    let x = g.add_input("x", TensorType::new(DType::F32, [2]));
    g.add_input("unused", TensorType::new(DType::F32, [2]));
    g.add_param(
        "p",
        TensorType::new(DType::F32, [2]),
        mslc_core::program::Init::Zeros,
        true,
    );
    let dead = g.add_op(Op::Exp, Attrs::new(), &[x], "").unwrap()[0];
    g.add_op(Op::Neg, Attrs::new(), &[dead], "").unwrap();
    let y = g.add_op(Op::Tanh, Attrs::new(), &[x], "").unwrap()[0];
    g.set_output("y", y);
    let stats = pass_by_name("dce").unwrap().run(&mut g, &cx()).unwrap();
    assert_eq!(stats.total(), 2);
    assert_eq!(g.node_ids().len(), 4);
}

/// Each pass, run after itself and `dce`, finds nothing more to do.
#[test]
fn passes_are_idempotent() {
    let contexts = [
        cx(),
        amp_cx(AmpLevel::O1, DType::F16),
        amp_cx(AmpLevel::O2, DType::BF16),
    ];
    for file in FILES {
        for pass in all_passes() {
            for cx in &contexts {
                let mut g = load(file);
                let once = pipeline(&[pass.name(), "dce"]);
                once.run(&mut g, cx).unwrap();
                let again = pass.run(&mut g, cx).unwrap();
                assert!(
                    again.is_empty(),
                    "{file}: `{}` rewrote again: {:?}",
                    pass.name(),
                    again.rewrites
                );
            }
        }
    }
}

/// After the default pipeline, no pass finds anything left to do (but `amp`, which runs
/// before fusion: a fused program may convert its operands itself).
#[test]
fn default_pipeline_reaches_a_fixpoint() {
    for file in FILES {
        for cx in [cx(), amp_cx(AmpLevel::O2, DType::F16)] {
            let mut g = load(file);
            default_pipeline(&cx).run(&mut g, &cx).unwrap();
            for pass in all_passes().into_iter().filter(|p| p.name() != "amp") {
                let again = pass.run(&mut g, &cx).unwrap();
                assert!(
                    again.is_empty(),
                    "{file}: `{}` rewrote after the pipeline: {:?}",
                    pass.name(),
                    again.rewrites
                );
            }
        }
    }
}

#[test]
fn fusion_respects_the_context() {
    let no_fuse = PassContext {
        fuse: false,
        ..cx()
    };
    let mut g = load("gpt_layer");
    let before = to_text(&g);
    let stats = pass_by_name("fuse").unwrap().run(&mut g, &no_fuse).unwrap();
    assert!(stats.is_empty());
    assert_eq!(to_text(&g), before);
    let report = default_pipeline(&no_fuse).run(&mut g, &no_fuse).unwrap();
    assert!(report.passes.iter().all(|p| p.name != "fuse"));
    // qkv, scores, weighted values, dense, and the MLP's two.
    assert_eq!(op_count(&g, Op::Matmul), 6);
}

/// SwiGLU's `silu(x @ gate) * (x @ up)` is one product with the gate's activation and the up
/// product as its multiplier; a tuning decision that leaves that pattern unfused keeps the
/// `mul` but still fuses the activation into its product.
#[test]
fn a_multiplier_left_unfused_keeps_the_activation_fused() {
    let fused_signature = |g: &Graph| {
        let id = g
            .node_ids()
            .into_iter()
            .find(|id| {
                let node = g.node(*id);
                node.op() == Some(Op::FusedMatmul)
                    && node
                        .attrs()
                        .is_some_and(|a| a.bool("has_multiplier") == Ok(true))
            })
            .expect("a product with a multiplier");
        g.signature(id).unwrap()
    };
    let mut g = load("llama_layer");
    default_pipeline(&cx()).run(&mut g, &cx()).unwrap();
    assert_eq!(op_count(&g, Op::Mul), 0);
    let unfused = PassContext {
        unfused: [fused_signature(&g)].into(),
        ..cx()
    };
    let mut g = load("llama_layer");
    let report = default_pipeline(&unfused).run(&mut g, &unfused).unwrap();
    assert_eq!(op_count(&g, Op::Mul), 1);
    assert_eq!(report.rewrites_by_label.get("fuse.matmul_act"), Some(&1));
    assert_eq!(
        report.rewrites_by_label.get("fuse.matmul_left_unfused"),
        Some(&1)
    );
}

#[test]
fn training_keeps_dropout_and_its_attention() {
    let training = PassContext {
        training: true,
        ..cx()
    };
    let mut g = load("gpt_layer");
    let report = default_pipeline(&training).run(&mut g, &training).unwrap();
    assert_eq!(op_count(&g, Op::Dropout), 3);
    // Dropout on the attention weights sits inside the pattern: no `attention` op.
    assert_eq!(op_count(&g, Op::Attention), 0);
    assert!(!report.rewrites_by_label.contains_key("simplify.dropout"));
    assert_eq!(
        report.rewrites_by_label.get("fuse.matmul_bias_act"),
        Some(&1)
    );
}

#[test]
fn fused_ops_keep_the_root_origin() {
    let mut g = load("mlp");
    default_pipeline(&cx()).run(&mut g, &cx()).unwrap();
    let origins: Vec<(Op, String)> = g
        .node_ids()
        .into_iter()
        .filter_map(|id| Some((g.node(id).op()?, g.node(id).origin.clone())))
        .filter(|(op, _)| *op == Op::FusedMatmul)
        .collect();
    // gelu(fc1(x)) is rooted at the model's gelu, fc2's relu likewise; both have origin "".
    assert_eq!(origins.len(), 2);
    assert!(origins.iter().all(|(_, o)| o.is_empty()), "{origins:?}");
}

#[test]
fn amp_levels_follow_mindspore() {
    let dtype_of = |g: &Graph, op: Op| -> Vec<DType> {
        g.node_ids()
            .into_iter()
            .filter(|id| g.node(*id).op() == Some(op))
            .map(|id| g.node(id).outputs[0].dtype)
            .collect()
    };
    // O0 changes nothing.
    let mut g = load("amp");
    let before = to_text(&g);
    let o0 = amp_cx(AmpLevel::O0, DType::F16);
    assert!(pass_by_name("amp")
        .unwrap()
        .run(&mut g, &o0)
        .unwrap()
        .is_empty());
    assert_eq!(to_text(&g), before);
    // O1: only matmul and relu in f16; everything after them sees f32.
    let mut g = load("amp");
    let o1 = amp_cx(AmpLevel::O1, DType::F16);
    pass_by_name("amp").unwrap().run(&mut g, &o1).unwrap();
    assert_eq!(dtype_of(&g, Op::Matmul), [DType::F16, DType::F16]);
    assert_eq!(dtype_of(&g, Op::Relu), [DType::F16]);
    assert_eq!(dtype_of(&g, Op::LayerNorm), [DType::F32]);
    assert_eq!(dtype_of(&g, Op::Softmax), [DType::F32]);
    // O2: layer norm, softmax and the @f32 exp stay f32; matmul, relu in bf16; outputs f32.
    let mut g = load("amp");
    let o2 = amp_cx(AmpLevel::O2, DType::BF16);
    pass_by_name("amp").unwrap().run(&mut g, &o2).unwrap();
    assert_eq!(dtype_of(&g, Op::Matmul), [DType::BF16, DType::BF16]);
    assert_eq!(dtype_of(&g, Op::LayerNorm), [DType::F32]);
    assert_eq!(dtype_of(&g, Op::Softmax), [DType::F32]);
    assert_eq!(dtype_of(&g, Op::Exp), [DType::F32]);
    assert_eq!(g.ty(g.outputs[0].1).dtype, DType::F32);
    // O3: everything low but the annotated exp; the keep_f32 list still applies.
    let mut g = load("amp");
    let mut o3 = amp_cx(AmpLevel::O3, DType::F16);
    if let Some(a) = o3.amp.as_mut() {
        a.keep_f32 = vec![Op::Relu];
    }
    pass_by_name("amp").unwrap().run(&mut g, &o3).unwrap();
    assert_eq!(dtype_of(&g, Op::LayerNorm), [DType::F16]);
    assert_eq!(dtype_of(&g, Op::Softmax), [DType::F16]);
    assert_eq!(dtype_of(&g, Op::Relu), [DType::F32]);
    assert_eq!(dtype_of(&g, Op::Exp), [DType::F32]);
    assert_eq!(g.ty(g.outputs[0].1).dtype, DType::F32);
    // Parameters stay f32 masters.
    for id in g.node_ids() {
        if let NodeKind::Param { .. } = g.node(id).kind {
            assert_eq!(g.node(id).outputs[0].dtype, DType::F32);
        }
    }
}

#[test]
fn amp_rejects_a_full_precision_compute_dtype() {
    let mut g = load("amp");
    let e = pass_by_name("amp")
        .unwrap()
        .run(&mut g, &amp_cx(AmpLevel::O2, DType::F32))
        .unwrap_err();
    assert_eq!(e.pass, "amp");
    assert_eq!(
        e.to_string(),
        "pass `amp`: the compute dtype must be f16 or bf16, got f32"
    );
}

/// A graph `constant(a) OP constant(b)` (or `OP constant(a)`) → the folded constant, if any.
fn fold_one(op: Op, attrs: Attrs, args: &[(f64, DType)]) -> Option<(f64, DType)> {
    let mut g = Graph::new("g");
    let inputs: Vec<_> = args
        .iter()
        .map(|(v, d)| {
            let a = Attrs::new().with("value", *v).with("dtype", *d);
            g.add_op(Op::Constant, a, &[], "").unwrap()[0]
        })
        .collect();
    let y = g.add_op(op, attrs, &inputs, "").unwrap()[0];
    g.set_output("y", y);
    pipeline(&["fold", "dce"]).run(&mut g, &cx()).unwrap();
    let out = g.outputs[0].1;
    let node = g.node(out.node);
    (node.op() == Some(Op::Constant)).then(|| {
        (
            node.attrs().unwrap().float("value").unwrap(),
            node.outputs[0].dtype,
        )
    })
}

#[test]
fn fold_values() {
    use DType::*;
    let none = Attrs::new;
    // Tolerance: exact — each result is the correctly rounded value in its dtype.
    assert_eq!(
        fold_one(Op::Rsqrt, none(), &[(64.0, F32)]),
        Some((0.125, F32))
    );
    assert_eq!(
        fold_one(Op::Div, none(), &[(1.0, F32), (3.0, F32)]),
        Some((f64::from(1.0f32 / 3.0), F32))
    );
    assert_eq!(
        fold_one(Op::Mul, none(), &[(3.0, I32), (0.5, F16)]),
        Some((1.5, F16))
    );
    assert_eq!(
        fold_one(Op::Add, none(), &[(2.0, I32), (3.0, I32)]),
        Some((5.0, I32))
    );
    let cast = |d: DType| Attrs::new().with("dtype", d);
    assert_eq!(
        fold_one(Op::Cast, cast(F16), &[(0.1, F32)]),
        Some((half::f16::from_f64(0.1).to_f64(), F16))
    );
    assert_eq!(
        fold_one(Op::Cast, cast(Bool), &[(-2.0, F32)]),
        Some((1.0, Bool))
    );
    assert_eq!(
        fold_one(Op::Div, none(), &[(1.0, F32), (0.0, F32)]),
        Some((f64::INFINITY, F32))
    );
    // Left to the kernels: overflow, NaN, fractional to int, erf.
    assert_eq!(
        fold_one(Op::Mul, none(), &[(65536.0, I32), (65536.0, I32)]),
        None
    );
    assert_eq!(fold_one(Op::Log, none(), &[(-1.0, F32)]), None);
    assert_eq!(fold_one(Op::Cast, cast(I32), &[(2.5, F32)]), None);
    assert_eq!(fold_one(Op::Erf, none(), &[(0.5, F32)]), None);
}

#[test]
fn fold_casts_of_causal_masks() {
    let mut g = Graph::new("g");
    let mask = Attrs::new().with("size", 4).with("dtype", DType::F32);
    let m = g.add_op(Op::CausalMask, mask, &[], "").unwrap()[0];
    let c = g
        .add_op(Op::Cast, Attrs::new().with("dtype", DType::BF16), &[m], "")
        .unwrap()[0];
    g.set_output("m", c);
    let report = pipeline(&["fold", "dce"]).run(&mut g, &cx()).unwrap();
    assert_eq!(report.rewrites_by_label.get("fold.mask_cast"), Some(&1));
    assert_eq!(report.ops_after, 1);
    assert_eq!(g.ty(g.outputs[0].1).dtype, DType::BF16);
}

// -------------------------------------------------------------------------- the manager

/// A pass that records a rewrite every time and optionally breaks the graph.
struct Restless {
    breaks: bool,
}

impl Pass for Restless {
    fn name(&self) -> &'static str {
        "restless"
    }
    fn description(&self) -> &'static str {
        "test pass"
    }
    fn run(&self, g: &mut Graph, _cx: &PassContext) -> Result<PassStats, PassError> {
        if self.breaks {
            // Claims a type the registry disagrees with.
            if let Some(id) = g
                .node_ids()
                .into_iter()
                .find(|id| g.node(*id).op().is_some())
            {
                g.node_mut(id).outputs[0].dtype = DType::I64;
            }
        }
        let mut stats = PassStats::default();
        stats.record(self.name(), "spin");
        Ok(stats)
    }
}

#[test]
fn fixpoint_groups_stop_at_their_cap() {
    let mut g = load("mlp");
    let pm = PassManager::new().fixpoint(
        vec![
            Box::new(Restless { breaks: false }),
            pass_by_name("dce").unwrap(),
        ],
        3,
    );
    let report = pm.run(&mut g, &cx()).unwrap();
    assert_eq!(report.passes.len(), 6);
    assert_eq!(report.rewrites_by_label.get("restless.spin"), Some(&3));
    assert_eq!(pm.describe(), "(restless, dce)*");
}

#[test]
fn verification_names_the_failing_pass() {
    let mut g = load("mlp");
    let pm = pipeline(&["simplify"]).then(Box::new(Restless { breaks: true }));
    let e = pm.run(&mut g, &cx()).unwrap_err();
    assert_eq!(e.pass, "restless");
    assert!(e.message.contains("does not verify"), "{}", e.message);
    // Without verification the broken graph goes through.
    let quiet = PassContext {
        verify: false,
        ..cx()
    };
    assert!(pm.run(&mut load("mlp"), &quiet).is_ok());
}

#[test]
fn registry_and_report() {
    let names: Vec<&str> = pass_descriptions().iter().map(|(n, _)| *n).collect();
    assert_eq!(
        names,
        [
            "fold",
            "simplify",
            "cse",
            "dce",
            "amp",
            "cast_cleanup",
            "fuse"
        ]
    );
    assert!(pass_descriptions().iter().all(|(_, d)| !d.is_empty()));
    assert!(pass_by_name("nope").is_none());
    assert_eq!(
        default_pipeline(&cx()).describe(),
        "(fold, simplify, cse, dce)* -> cast_cleanup -> (fold, simplify, cse, dce)* -> fuse \
         -> (fold, simplify, cse, dce)*"
    );
    let with_amp = amp_cx(AmpLevel::O2, DType::F16);
    assert!(default_pipeline(&with_amp)
        .describe()
        .contains("-> amp -> cast_cleanup"));
    let mut g = load("mlp");
    let report = default_pipeline(&cx()).run(&mut g, &cx()).unwrap();
    assert_eq!((report.ops_before, report.ops_after), (14, 5));
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["rewrites_by_label"]["fuse.matmul_bias_act"], 2);
    assert!(json["passes"][0]["micros"].is_u64());
    assert!(report.to_string().starts_with("ops: 14 -> 5 in "));
}

// ------------------------------------------------------------------------------- at scale

#[test]
fn llama2_70b_through_the_default_pipeline() {
    let mut g = load_path(Path::new("examples/llama2_70b.msl"));
    let cx = amp_cx(AmpLevel::O2, DType::BF16);
    let start = std::time::Instant::now();
    let report = default_pipeline(&cx).run(&mut g, &cx).unwrap();
    let elapsed = start.elapsed();
    eprintln!(
        "llama2_70b: {} -> {} ops in {elapsed:?} ({} us in passes, verified after each)",
        report.ops_before,
        report.ops_after,
        report.total_micros()
    );
    // 80 layers: two RMS norms each plus the final one, one SwiGLU gate each.
    assert_eq!(op_count(&g, Op::Attention), 80);
    assert_eq!(
        op_count(&g, Op::RmsNorm) + op_count(&g, Op::RmsNormScale),
        161
    );
    assert!(report.ops_after < report.ops_before + 80 * 16);
    mslc_ir::verify(&g).unwrap();
}

// ------------------------------------------------------------------ cast numerics, exactly

/// What a cast kernel does to one value: round to the nearest float of the target, or
/// truncate and saturate to an integer (NaN to 0), or test for non-zero.
fn convert(v: f64, to: DType) -> f64 {
    match to {
        DType::F64 => v,
        DType::F32 => v as f32 as f64,
        DType::F16 => half::f16::from_f64(v).to_f64(),
        DType::BF16 => half::bf16::from_f64(v).to_f64(),
        DType::I32 => v as i32 as f64,
        DType::I64 => v as i64 as f64,
        DType::Bool => f64::from(u8::from(v != 0.0)),
    }
}

/// The dtypes of the casts between input `x` and output `y`, in order.
fn cast_chain(g: &Graph) -> Vec<DType> {
    let mut v = g.outputs[0].1;
    let mut chain = Vec::new();
    while let Some(op) = g.node(v.node).op() {
        assert_eq!(op, Op::Cast);
        chain.push(g.ty(v).dtype);
        v = g.inputs(v.node)[0];
    }
    chain.reverse();
    chain
}

const SAMPLES: [f64; 14] = [
    0.0,
    -0.0,
    0.1,
    -2.5,
    1.0 / 3.0,
    65504.0,
    70000.0,
    16777217.0,
    3.0e38,
    1.0e300,
    2147483647.0,
    -9.3e18,
    f64::INFINITY,
    f64::NAN,
];

proptest::proptest! {
    /// cast_cleanup never changes what a chain of casts computes, on values picked to hit
    /// rounding, overflow, saturation, NaN and signed zero.
    #[test]
    fn cast_cleanup_keeps_numerics(
        from in proptest::sample::select(DType::ALL),
        casts in proptest::collection::vec(proptest::sample::select(DType::ALL), 1..5),
    ) {
        let mut g = Graph::new("casts");
        let mut v = g.add_input("x", TensorType::new(from, [2]));
        for d in &casts {
            v = g.add_op(Op::Cast, Attrs::new().with("dtype", *d), &[v], "").unwrap()[0];
        }
        g.set_output("y", v);
        pipeline(&["cast_cleanup", "dce"]).run(&mut g, &cx()).unwrap();
        let kept = cast_chain(&g);
        proptest::prop_assert!(kept.len() <= casts.len());
        for s in SAMPLES {
            let x = convert(s, from);
            let want = casts.iter().fold(x, |v, d| convert(v, *d));
            let got = kept.iter().fold(x, |v, d| convert(v, *d));
            proptest::prop_assert!(
                want.to_bits() == got.to_bits() || (want.is_nan() && got.is_nan()),
                "{from} {casts:?} -> {kept:?} on {s}: {want} vs {got}"
            );
        }
    }
}

/// Attention over keys and values shared by every head (rank 3, broadcast by the matmuls) is
/// left alone: the `attention` op needs them per batch and head.
#[test]
fn attention_with_broadcast_keys_is_not_fused() {
    let mut g = Graph::new("g");
    let f32t = |s: &[i64]| TensorType::new(DType::F32, s.to_vec());
    let q = g.add_input("q", f32t(&[1, 2, 4, 8]));
    let k = g.add_input("k", f32t(&[1, 2, 8]));
    let v = g.add_input("v", f32t(&[1, 2, 8]));
    let mut op = |op, attrs: Attrs, args: &[_]| g.add_op(op, attrs, args, "").unwrap()[0];
    let s = op(Op::Matmul, Attrs::new().with("transpose_b", true), &[q, k]);
    let c = op(
        Op::Constant,
        Attrs::new().with("value", 0.5).with("dtype", DType::F32),
        &[],
    );
    let s = op(Op::Mul, Attrs::new(), &[s, c]);
    let p = op(Op::Softmax, Attrs::new(), &[s]);
    let y = op(Op::Matmul, Attrs::new(), &[p, v]);
    g.set_output("y", y);
    let stats = pass_by_name("fuse").unwrap().run(&mut g, &cx()).unwrap();
    assert!(!stats.rewrites.contains_key("fuse.attention"), "{stats:?}");
    mslc_ir::verify(&g).unwrap();
}

/// A reduction's gradient broadcasts per-channel values over an activation only to combine
/// them elementwise (batch norm's backward): the fused chain reads the values before the
/// broadcast, which is then dead and dropped. A broadcast that sets the chain's shape (every
/// other operand smaller) stays.
#[test]
fn fused_chains_read_values_before_their_broadcasts() {
    let f32_of = |shape: Vec<i64>| TensorType::new(DType::F32, shape);
    let mut g = Graph::new("broadcasts");
    let x = g.add_input("x", f32_of(vec![8, 4, 2, 2]));
    let s = g.add_input("s", f32_of(vec![1, 4, 1, 1]));
    let t = g.add_input("t", f32_of(vec![4, 1, 1]));
    let op = |g: &mut Graph, op: Op, attrs: Attrs, args: &[mslc_ir::ValueRef]| {
        g.add_op(op, attrs, args, "").unwrap()[0]
    };
    let full = Attrs::new().with("shape", vec![8i64, 4, 2, 2]);
    let b = op(&mut g, Op::BroadcastTo, full.clone(), &[s]);
    let m = op(&mut g, Op::Mul, Attrs::new(), &[x, b]);
    let y = op(&mut g, Op::Neg, Attrs::new(), &[m]);
    g.set_output("y", y);
    // Here the broadcast alone gives the chain its shape.
    let c = op(&mut g, Op::BroadcastTo, full, &[t]);
    let d = op(&mut g, Op::Add, Attrs::new(), &[c, s]);
    let z = op(&mut g, Op::Relu, Attrs::new(), &[d]);
    g.set_output("z", z);
    let report = pipeline(&["fuse", "dce"]).run(&mut g, &cx()).unwrap();
    assert_eq!(op_count(&g, Op::FusedElementwise), 2, "{}", to_text(&g));
    assert_eq!(op_count(&g, Op::BroadcastTo), 1, "{}", to_text(&g));
    let output = |name: &str| g.outputs.iter().find(|(n, _)| n == name).unwrap().1;
    let fused_y = output("y");
    assert_eq!(g.inputs(fused_y.node), vec![x, s], "{}", to_text(&g));
    assert_eq!(g.ty(fused_y).shape, vec![8, 4, 2, 2]);
    assert!(report.rewrites_by_label.contains_key("fuse.elementwise"));
}
