//! `cargo mslc`: finds the models of a cargo workspace through `cargo metadata` (listed in
//! `[package.metadata.mslc]`, or `models/**/*.msl`) and checks, builds or format-checks them.

use std::path::Path;
use std::process::{Command, Output};

const EXAMPLE_MANIFEST: &str = "examples/build-script/Cargo.toml";

fn cargo_mslc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cargo-mslc"))
        // As cargo runs it: `cargo mslc check` is `cargo-mslc mslc check`.
        .arg("mslc")
        .args(args)
        .env("CARGO_NET_OFFLINE", "true")
        .output()
        .expect("run cargo-mslc")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn checks_and_builds_the_example_crate() {
    let out = cargo_mslc(&["check", "--manifest-path", EXAMPLE_MANIFEST]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("checked 1 file(s) in 1 package(s): 0 error(s)"));
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().to_str().unwrap();
    let out = cargo_mslc(&[
        "build",
        "--manifest-path",
        EXAMPLE_MANIFEST,
        "--out-dir",
        out_dir,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let pkg = dir.path().join("mslc-build-script-example");
    assert!(pkg.join("Net.mir").is_file());
    assert!(pkg.join("mslc_models.rs").is_file());
}

/// A package that keeps its models in `models/` without listing them.
fn package_with(dir: &Path, models: &[(&str, &str)]) -> String {
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::write(
        dir.join("Cargo.toml"),
        "[package]\nname = \"uses-mslc\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[workspace]\n",
    )
    .unwrap();
    std::fs::write(dir.join("src/lib.rs"), "").unwrap();
    for (path, text) in models {
        let path = dir.join("models").join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    dir.join("Cargo.toml").to_str().unwrap().to_string()
}

#[test]
fn finds_models_by_convention_and_fails_on_errors() {
    let dir = tempfile::tempdir().unwrap();
    let good = "model Good {\n    input x: f32[4]\n    output y = relu(x)\n}\n";
    let bad = "model Bad {\n    input x: f32[4]\n    output y = nope(x)\n}\n";
    let manifest = package_with(dir.path(), &[("good.msl", good), ("deep/bad.msl", bad)]);
    let out = cargo_mslc(&["check", "--manifest-path", &manifest]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("E0202"), "{}", text(&out));
    assert!(text(&out).contains("checked 2 file(s)"), "{}", text(&out));
    let out = cargo_mslc(&["build", "--manifest-path", &manifest]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(!dir.path().join("target/mslc/uses-mslc/Good.mir").exists());
}

#[test]
fn fmt_runs_mslc_fmt_or_says_it_is_missing() {
    let out = cargo_mslc(&["fmt", "--manifest-path", EXAMPLE_MANIFEST]);
    let all = text(&out);
    match out.status.code() {
        Some(0) => {}
        Some(2) => assert!(
            all.contains("needs an `mslc` with a `fmt` command"),
            "{all}"
        ),
        other => panic!("exit {other:?}: {all}"),
    }
}
