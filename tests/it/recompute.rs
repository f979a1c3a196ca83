//! Recomputation in the training step (memory policies' `recompute`, `@recompute`): on a shrunk
//! tiny_llama, recomputing gives bit-identical loss and gradients (the copies run the same
//! kernels on the same operands) while the planned arena shrinks — full < selective < none; a
//! `@recompute` instance call recomputes that instance alone; `auto` under a budget picks a
//! plan that fits and says so; a budget nothing fits is E0720 with the breakdown; and the
//! arena the executor allocates is the planned one.

use std::path::{Path, PathBuf};

use mslc_check::{check_path, CheckOptions};
use mslc_driver::recompute::MemoryRequest;
use mslc_driver::render::{render_human, RenderOptions};
use mslc_driver::select::{compile_options, Selection};
use mslc_driver::train::{compile_train, TrainError, TrainOptions};

use crate::exec::common::{mslc, root, s, token_file, train_summary, TestDir};

/// tiny_llama shrunk so that activations, not weights, dominate the step: 4 layers of width
/// 64 over 8 × 64 tokens.
const SHRINK: [&str; 12] = [
    "--set",
    "layers=4",
    "--set",
    "vocab=256",
    "--set",
    "hidden=64",
    "--set",
    "ffn=176",
    "--dim",
    "S=64",
    "--dim",
    "B=8",
];

/// examples/tiny_llama.msl's model with a memory policy (`fields`) and an AdamW train `Fit`.
fn llama_source(dir: &TestDir, name: &str, fields: &str) -> PathBuf {
    let source = std::fs::read_to_string(root().join("examples/tiny_llama.msl")).unwrap();
    let model_end = source.find("// f16 has a narrow").expect("the model part");
    let path = dir.path(&format!("{name}.msl"));
    let train = format!(
        "memory Budget {{ {fields} }}\n\ntrain Fit for TinyLlama {{\n    labels: i32[B, S]\n    \
         loss = cross_entropy(logits, labels)\n    optimizer = adamw(lr: 1e-3, weight_decay: 0.1)\n    \
         batch = 8\n    memory = Budget\n}}\n"
    );
    std::fs::write(&path, format!("{}\n{train}", &source[..model_end])).unwrap();
    path
}

/// Builds train `Fit` of `source` (with `extra` flags) into `out`; its report's `recompute`.
fn build_report(source: &Path, out: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["build", s(source), "--entry", "Fit", "-o", s(out)];
    args.extend_from_slice(extra);
    let (code, stdout, stderr) = mslc(&args);
    assert_eq!(code, 0, "mslc build:\n{stdout}\n{stderr}");
    let report = std::fs::read_to_string(out.join("Fit.report.json")).unwrap();
    let report: serde_json::Value = serde_json::from_str(&report).unwrap();
    report["recompute"].clone()
}

/// 8 random sequences of 65 token ids below 256, as `--data` takes them.
fn tokens(dir: &TestDir) -> PathBuf {
    token_file(dir, [8, 65], 256.0, 3)
}

/// One training step with `--dump-grads`; the gradients and loss files' bytes and the JSON
/// summary.
fn train_once(source: &Path, data: &Path, grads: &Path) -> (Vec<u8>, Vec<u8>, serde_json::Value) {
    let mut args = vec!["--message-format", "json", "train", s(source)];
    args.extend_from_slice(&SHRINK);
    args.extend_from_slice(&[
        "--init-seed",
        "4",
        "--data",
        s(data),
        "--steps",
        "1",
        "--dump-grads",
        s(grads),
    ]);
    let (code, stdout, stderr) = mslc(&args);
    assert_eq!(code, 0, "mslc train:\n{stdout}\n{stderr}");
    let summary = train_summary(&stdout);
    (
        std::fs::read(grads.join("grads.safetensors")).unwrap(),
        std::fs::read(grads.join("loss.npy")).unwrap(),
        summary,
    )
}

fn arena(report: &serde_json::Value) -> u64 {
    report["arena_bytes"].as_u64().unwrap()
}

#[test]
fn recomputing_gives_the_same_gradients_with_a_smaller_arena() {
    let dir = TestDir::new("recompute-policies");
    let data = tokens(&dir);
    let mut arenas = Vec::new();
    let mut first: Option<(Vec<u8>, Vec<u8>)> = None;
    for policy in ["none", "selective", "full"] {
        let source = llama_source(&dir, policy, &format!("recompute = {policy}"));
        let report = build_report(&source, &dir.path(&format!("out-{policy}")), &SHRINK);
        assert_eq!(report["policy"], policy);
        let (grads, loss, summary) = train_once(&source, &data, &dir.path(policy));
        // The executor allocates the arena the plan sized (it refuses to run otherwise).
        assert_eq!(
            summary["allocated_arena_bytes"].as_u64(),
            Some(arena(&report)),
            "{summary}"
        );
        assert_eq!(summary["recompute"]["arena_bytes"], report["arena_bytes"]);
        match &first {
            None => first = Some((grads, loss)),
            Some((g, l)) => {
                assert!(g == &grads, "{policy}: the gradients differ from none's");
                assert!(l == &loss, "{policy}: the loss differs from none's");
            }
        }
        if policy != "none" {
            assert!(report["recomputed_ops"].as_u64().unwrap() > 0, "{report}");
            assert!(report["flops_added"].as_u64().unwrap() > 0, "{report}");
            assert_eq!(report["layers"].as_object().unwrap().len(), 4, "{report}");
        }
        arenas.push(arena(&report));
    }
    let [none, selective, full] = arenas[..] else {
        unreachable!()
    };
    assert!(
        full < selective && selective < none,
        "arena: none {none}, selective {selective}, full {full}"
    );
}

#[test]
fn an_annotated_instance_call_recomputes_that_instance_alone() {
    let dir = TestDir::new("recompute-annotation");
    let model = |annotation: &str| {
        format!(
            "import std.llm.LlamaLayer\nimport std.nn.Embedding\nimport std.nn.RMSNorm\nimport std.nn.Linear\n\n\
             model Two {{\n    const vocab = 64, hidden = 32, heads = 2, ffn = 64\n    dims B = 4, S = 16\n    \
             input tokens: i32[B, S]\n    let x = embed: Embedding(tokens, vocab, hidden)\n    \
             let a = first: LlamaLayer(x, heads, heads, ffn){annotation}\n    \
             let b = second: LlamaLayer(a, heads, heads, ffn)\n    \
             output logits = head: Linear(norm: RMSNorm(b), vocab)\n}}\n\n\
             train Fit for Two {{\n    labels: i32[B, S]\n    loss = cross_entropy(logits, labels)\n    \
             optimizer = sgd(lr: 0.1)\n    batch = 4\n}}\n"
        )
    };
    let mut reports = Vec::new();
    for (name, annotation) in [("plain", ""), ("marked", " @recompute")] {
        let source = dir.path(&format!("{name}.msl"));
        std::fs::write(&source, model(annotation)).unwrap();
        let out = dir.path(&format!("out-{name}"));
        reports.push(build_report(&source, &out, &["--emit", "ir"]));
        let ir = std::fs::read_to_string(out.join("Fit.ir")).unwrap();
        let copies: Vec<&str> = ir.lines().filter(|l| l.contains("#recompute")).collect();
        if annotation.is_empty() {
            assert!(copies.is_empty(), "{copies:#?}");
        } else {
            assert!(!copies.is_empty(), "no recomputed op in\n{ir}");
            assert!(
                copies
                    .iter()
                    .all(|l| l.contains("first.") || l.contains("first#")),
                "{copies:#?}"
            );
        }
    }
    assert_eq!(reports[0]["recomputed_ops"], 0);
    assert!(reports[1]["recomputed_ops"].as_u64().unwrap() > 0);
    assert!(
        arena(&reports[1]) < arena(&reports[0]),
        "{} vs {}",
        reports[1],
        reports[0]
    );
}

/// The total of a report's step-memory breakdown (`recompute.breakdown` or `.without`).
pub(crate) fn breakdown_total(breakdown: &serde_json::Value) -> u64 {
    [
        "parameters",
        "gradients",
        "optimizer_states",
        "activations",
        "workspace",
    ]
    .iter()
    .map(|k| breakdown[k].as_u64().unwrap())
    .sum()
}

#[test]
fn auto_under_a_budget_picks_a_plan_that_fits_and_reports_it() {
    let dir = TestDir::new("recompute-auto");
    let free = build_report(
        &llama_source(&dir, "free", "recompute = auto"),
        &dir.path("out-free"),
        &SHRINK,
    );
    // Without a budget, auto keeps everything.
    assert_eq!(free["recomputed_ops"], 0);
    let none = free["without"]["parameters"].as_u64().unwrap();
    assert!(none > 0);
    let keep_all = breakdown_total(&free["without"]);
    let full = build_report(
        &llama_source(&dir, "full", "recompute = full"),
        &dir.path("out-full"),
        &SHRINK,
    );
    let least = breakdown_total(&full["breakdown"]);
    assert!(least < keep_all);
    // A budget between full recomputation and none.
    let budget = least + (keep_all - least) / 3;
    let source = llama_source(
        &dir,
        "auto",
        &format!("max_device_memory = {budget}B, recompute = auto"),
    );
    let mut args = vec!["build", s(&source), "--entry", "Fit", "-o"];
    let out = dir.path("out-auto");
    args.push(s(&out));
    args.extend_from_slice(&SHRINK);
    let (code, stdout, stderr) = mslc(&args);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stdout.contains("recompute:  auto within"), "{stdout}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("Fit.report.json")).unwrap())
            .unwrap();
    let auto = &report["recompute"];
    assert!(breakdown_total(&auto["breakdown"]) <= budget, "{auto}");
    assert!(!auto["layers"].as_object().unwrap().is_empty(), "{auto}");
    assert!(auto["flops_added"].as_u64().unwrap() > 0);
    // It recomputes no more than full recomputation of every layer does.
    assert!(auto["flops_added"].as_u64() <= full["flops_added"].as_u64());
}

/// Sizes vary with the CPU's kernels (packed panels, scratch): the snapshot shows each
/// `12.3 MiB` as `… MiB` and `17605452B` as `…B`.
fn redact_sizes(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find(|c: char| c.is_ascii_digit()) {
        out.push_str(&rest[..start]);
        let after = &rest[start..];
        let end = after
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(after.len());
        let tail = &after[end..];
        let unit = [" B", " KiB", " MiB", " GiB", "B"].into_iter().find(|u| {
            tail.starts_with(u) && !tail[u.len()..].starts_with(|c: char| c.is_ascii_alphanumeric())
        });
        out.push_str(if unit.is_some() { "…" } else { &after[..end] });
        rest = tail;
    }
    out.push_str(rest);
    out
}

#[test]
fn a_budget_nothing_fits_is_e0720_with_the_breakdown() {
    let dir = TestDir::new("recompute-nofit");
    let source = llama_source(
        &dir,
        "tight",
        "max_device_memory = 1MB, recompute = selective",
    );
    let mut options = CheckOptions::default();
    for pair in SHRINK.chunks(2) {
        let (k, v) = pair[1].split_once('=').unwrap();
        let map = if pair[0] == "--set" {
            &mut options.overrides.sets
        } else {
            &mut options.overrides.dims
        };
        map.insert(k.to_string(), v.to_string());
    }
    let checked = check_path(&source, &options);
    assert!(!checked.has_errors(), "{:?}", checked.diagnostics);
    let train = &checked.decls.trains[0];
    let model = train.graph.as_ref().unwrap();
    let compile = compile_options(&checked, model, Selection::default()).unwrap();
    let request = MemoryRequest::of_train(&checked, train);
    let options = TrainOptions {
        memory: request,
        ..TrainOptions::default()
    };
    let Err(TrainError::Train(d)) = compile_train(train, &compile, options) else {
        panic!("a 1 MB budget fits");
    };
    assert_eq!(d.code.as_str(), "E0720");
    let help = d.help.clone().unwrap();
    assert!(
        help.contains("even recomputing every layer needs"),
        "{help}"
    );
    for name in [
        "parameters",
        "gradients",
        "optimizer states",
        "activations",
        "workspace",
    ] {
        assert!(help.contains(name), "{help}");
    }
    let human = render_human(
        &d,
        &checked.sources,
        RenderOptions {
            color: false,
            width: 100,
        },
    );
    let human = human.replace(&dir.path("").display().to_string(), "DIR/");
    assert_eq!(
        redact_sizes("needs 30.4 MiB, 1 B, 12 KiB2 and 3 layers"),
        "needs … MiB, … B, 12 KiB2 and 3 layers"
    );
    insta::assert_snapshot!(redact_sizes(&human));
}
