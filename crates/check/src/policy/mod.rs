//! Checking the policy declarations of a `.msl` file — `precision`, `parallel`, `memory`,
//! `train` and `target` — into typed settings with MindSpore's semantics and defaults. Every
//! check collects all its diagnostics; the returned values hold defaults where a field was
//! missing or invalid, so they are meaningful only when no error was reported.

mod args;
mod fields;
mod memory;
mod optimizer;
mod parallel;
mod pattern;
mod precision;
mod report;
mod schedule;
mod shard;

mod target;
#[cfg(test)]
mod testing;
mod train;
mod value;

pub use memory::{check_memory, MemoryPolicy, Recompute};
pub use optimizer::{Optimizer, OptimizerKind};
pub use parallel::{
    check_parallel, OptimizerShard, ParallelMode, ParallelPolicy, Pipeline, PipelineSchedule,
};
pub use pattern::{pattern_matches, PatternError, ShardPattern};
pub use precision::{check_precision, AmpLevel, LossScale, LowPrecision, PrecisionPolicy};
pub use schedule::{Decay, Schedule};
pub use shard::{check_shards_against_params, ShardRule};
pub use target::{check_target, PeakFlops, TargetSpec};
pub use train::{
    check_no_decay_against_params, check_train, check_train_against, unknown_reference, TrainSpec,
};

#[cfg(test)]
mod tests {
    use super::*;
    use mslc_core::diag::{Diagnostic, FileId};
    use mslc_syntax::ast::{DeclKind, Item};
    use mslc_syntax::parse;
    use proptest::prelude::*;

    const OPS: &[&str] = &["rms_norm", "softmax", "matmul"];

    /// Runs the checker of each declaration's kind, then the cross checks on what came out.
    fn check_all(src: &str) -> Vec<Diagnostic> {
        let (file, mut diags) = parse(FileId(0), src);
        let (mut parallel, mut memory, mut target, mut train) = (None, None, None, None);
        for item in &file.items {
            let Item::Decl(decl) = item else { continue };
            match decl.kind {
                DeclKind::Precision => drop(check_precision(
                    decl,
                    FileId(0),
                    &|n| OPS.contains(&n),
                    OPS,
                    &mut diags,
                )),
                DeclKind::Parallel => parallel = Some(check_parallel(decl, FileId(0), &mut diags)),
                DeclKind::Memory => memory = Some(check_memory(decl, FileId(0), &mut diags)),
                DeclKind::Target => target = Some(check_target(decl, FileId(0), &mut diags)),
                DeclKind::Train => train = Some(check_train(decl, FileId(0), &mut diags)),
            }
        }
        if let Some(parallel) = &parallel {
            let params = [
                ("model.layers.0.w".to_string(), vec![6, 4]),
                ("lm_head.weight".to_string(), vec![10]),
            ];
            check_shards_against_params(parallel, &params, true, &mut diags);
        }
        if let Some(train) = &train {
            check_train_against(
                train,
                parallel.as_ref(),
                memory.as_ref(),
                target.as_ref(),
                &mut diags,
            );
        }
        diags
    }

    #[test]
    fn the_language_reference_policies_check_cleanly() {
        let doc = include_str!("../../../../docs/language.md");
        let policies = &doc[doc.find("## Policies").expect("a Policies section")..];
        let example = policies.split("```").nth(1).expect("an example block");
        let (file, diags) = parse(FileId(0), example);
        assert!(diags.is_empty(), "{diags:?}");
        let mut diags = Vec::new();
        let mut kinds = Vec::new();
        for item in &file.items {
            let Item::Decl(decl) = item else { continue };
            kinds.push(decl.kind);
            match decl.kind {
                DeclKind::Precision => drop(check_precision(
                    decl,
                    FileId(0),
                    &|n| OPS.contains(&n),
                    OPS,
                    &mut diags,
                )),
                DeclKind::Parallel => drop(check_parallel(decl, FileId(0), &mut diags)),
                DeclKind::Memory => drop(check_memory(decl, FileId(0), &mut diags)),
                DeclKind::Target => drop(check_target(decl, FileId(0), &mut diags)),
                DeclKind::Train => drop(check_train(decl, FileId(0), &mut diags)),
            }
        }
        assert_eq!(kinds.len(), 5);
        assert!(diags.is_empty(), "{diags:?}");
    }

    fn value() -> impl Strategy<Value = String> {
        let words = prop::sample::select(vec![
            "O2",
            "O0",
            "bf16",
            "none",
            "dynamic",
            "fixed",
            "semi_auto",
            "data",
            "stand_alone",
            "level1",
            "1f1b",
            "gpipe",
            "dp",
            "mp",
            "true",
            "false",
            "adamw",
            "momentum",
            "auto",
            "full",
            "softmax",
            "x",
        ]);
        let leaf = prop_oneof![
            words.prop_map(str::to_string),
            "-?[0-9]{1,20}",
            "[0-9]{1,3}\\.[0-9]{1,2}(e-?[0-9])?",
            "[0-9]{1,4}(B|KB|GiB|TB|GB/s|TFLOPS|FLOPS)",
            "\"[a-z.*{},]{0,8}\"",
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            let key = prop::sample::select(vec![
                "dp",
                "mp",
                "stages",
                "micro_batches",
                "init",
                "lr",
                "betas",
                "x",
            ]);
            prop_oneof![
                prop::collection::vec(prop_oneof![inner.clone(), Just("_".to_string())], 0..4)
                    .prop_map(|v| format!("[{}]", v.join(", "))),
                prop::collection::vec(inner.clone(), 2..4)
                    .prop_map(|v| format!("({})", v.join(", "))),
                prop::collection::vec((key.clone(), inner.clone()), 0..4).prop_map(|v| format!(
                    "{{{}}}",
                    v.iter()
                        .map(|(k, e)| format!("{k}: {e}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
                (
                    prop::sample::select(vec!["dynamic", "fixed", "adamw", "sgd", "none", "f"]),
                    prop::collection::vec((key, inner.clone()), 0..3)
                )
                    .prop_map(|(f, v)| format!(
                        "{f}({})",
                        v.iter()
                            .map(|(k, e)| format!("{k}: {e}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )),
                (
                    inner.clone(),
                    prop::sample::select(vec!["+", "-", "*", "/", "%", "=="]),
                    inner.clone()
                )
                    .prop_map(|(a, op, b)| format!("{a} {op} {b}")),
                inner.prop_map(|e| format!("-{e}")),
            ]
        })
    }

    fn decl() -> impl Strategy<Value = String> {
        let keys = prop::sample::select(vec![
            "level",
            "compute",
            "keep_f32",
            "loss_scale",
            "keep_batchnorm_f32",
            "mesh",
            "mode",
            "devices",
            "pipeline",
            "optimizer_shard",
            "max_device_memory",
            "recompute",
            "peak_f32",
            "memory",
            "bandwidth",
            "interconnect",
            "loss",
            "optimizer",
            "batch",
            "grad_accum",
            "precision",
            "target",
            "colour",
        ]);
        let head = prop::sample::select(vec![
            "precision P",
            "parallel P",
            "memory M",
            "pub target T",
            "train R for Model",
        ]);
        let field = prop_oneof![
            3 => (keys, value()).prop_map(|(k, v)| format!("{k} = {v}")),
            1 => ("[a-z.*{},]{0,8}", value()).prop_map(|(p, v)| format!("shard \"{p}\" = {v}")),
            1 => Just("labels: i32[B, S]".to_string()),
        ];
        (head, prop::collection::vec(field, 0..6))
            .prop_map(|(h, f)| format!("{h} {{\n{}\n}}", f.join("\n")))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        #[test]
        fn arbitrary_declarations_never_panic_and_spans_stay_in_the_source(decls in prop::collection::vec(decl(), 1..5)) {
            let src = decls.join("\n");
            for d in check_all(&src) {
                for label in std::iter::once(&d.primary).chain(&d.related) {
                    prop_assert!(label.span.start <= label.span.end && label.span.end <= src.len(), "{d:?} in {src}");
                }
            }
        }
    }
}
