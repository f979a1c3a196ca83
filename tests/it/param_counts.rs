//! `mslc check --summary` reproduces the published parameter counts of the example models
//! (docs/semantics.md: Hugging Face and torchvision), and the summary prints them.

use std::path::Path;
use std::process::Command;

use mslc_check::{check_path, CheckOptions};

const EXPECTED: &[(&str, u128)] = &[
    ("examples/llama2_7b.msl", 6_738_415_616),
    ("examples/llama2_13b.msl", 13_015_864_320),
    ("examples/llama2_70b.msl", 68_976_648_192),
    ("examples/bert_base.msl", 109_482_240),
    ("examples/resnet50.msl", 25_557_032),
    ("examples/gpt3_175b.msl", 174_615_846_912),
    ("examples/gpt2.msl", 124_439_808),
    ("examples/vit_b16.msl", 86_567_656),
];

#[test]
fn examples_have_the_published_parameter_counts() {
    for (file, count) in EXPECTED {
        let checked = check_path(Path::new(file), &CheckOptions::default());
        assert!(
            checked.diagnostics.is_empty(),
            "{file}: {:?}",
            checked.diagnostics
        );
        assert_eq!(checked.models[0].param_count(), *count, "{file}");
    }
}

/// An example's train section takes its sizes from the model's consts, so shrinking the model
/// with `--set` keeps the whole file valid (bert_base's teacher was once a literal 768).
#[test]
fn examples_stay_valid_when_shrunk() {
    let shrunk: &[(&str, &[(&str, &str)])] = &[
        (
            "examples/bert_base.msl",
            &[("hidden", "128"), ("heads", "2")],
        ),
        ("examples/gpt2.msl", &[("hidden", "64"), ("heads", "4")]),
        ("examples/vit_b16.msl", &[("hidden", "32"), ("heads", "4")]),
    ];
    for (file, sets) in shrunk {
        let mut options = CheckOptions::default();
        for (k, v) in *sets {
            options.overrides.sets.insert(k.to_string(), v.to_string());
        }
        let checked = check_path(Path::new(file), &options);
        assert!(
            checked.diagnostics.is_empty(),
            "{file} with {sets:?}: {:?}",
            checked.diagnostics
        );
    }
}

#[test]
fn summary_prints_the_total() {
    let out = Command::new(env!("CARGO_BIN_EXE_mslc"))
        .args(["check", "--summary", "examples/llama2_7b.msl"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("total parameters: 6,738,415,616"), "{text}");
    assert!(
        text.contains("model.layers.{0..31}.self_attn.q_proj.weight"),
        "{text}"
    );
}

#[test]
fn stdlib_dir_overrides_the_embedded_library() {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir("stdlib").unwrap().flatten() {
        std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
    }
    // A standard library whose Linear has no `pub` no longer exports it.
    let nn = std::fs::read_to_string(dir.path().join("nn.msl")).unwrap();
    std::fs::write(
        dir.path().join("nn.msl"),
        nn.replace("pub block Linear(", "block Linear("),
    )
    .unwrap();
    let options = CheckOptions {
        stdlib_dir: Some(dir.path().to_path_buf()),
        ..CheckOptions::default()
    };
    let checked = check_path(Path::new("examples/llama2_7b.msl"), &options);
    assert!(
        checked
            .diagnostics
            .iter()
            .any(|d| d.code.as_str() == "E0102"),
        "{:?}",
        checked.diagnostics
    );
}
