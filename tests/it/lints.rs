//! Unused-code lints (W0005–W0012) beyond what the UI cases show: the standard library is never
//! linted while the same code in a user's file is; a file with errors gets none; the examples
//! have none; a warning leaves the exit status at 0 and `--summary` still counts what it names.

use std::path::Path;
use std::process::Command;

use mslc_check::{check_path, CheckOptions};

/// A block with an unused argument, `let` and parameter.
const SPARE: &str = "pub block Spare(x: [..., D], unused_arg: int) -> [..., D] {\n    let t = x * 2.0\n    param p: [D] ~ ones\n    return x\n}\n";

fn unused_codes(path: &Path, options: &CheckOptions) -> Vec<(String, String)> {
    let checked = check_path(path, options);
    checked
        .diagnostics
        .iter()
        .filter(|d| d.code.is_unused_lint())
        .map(|d| {
            let file = checked.sources.get(d.primary.file);
            (d.code.as_str().to_string(), file.name.clone())
        })
        .collect()
}

#[test]
fn the_standard_library_is_never_linted_but_user_modules_are() {
    let dir = tempfile::tempdir().unwrap();
    let std_dir = dir.path().join("std");
    std::fs::create_dir(&std_dir).unwrap();
    for entry in std::fs::read_dir("stdlib").unwrap().flatten() {
        std::fs::copy(entry.path(), std_dir.join(entry.file_name())).unwrap();
    }
    let nn = std::fs::read_to_string(std_dir.join("nn.msl")).unwrap();
    std::fs::write(std_dir.join("nn.msl"), format!("{nn}\n{SPARE}")).unwrap();
    std::fs::write(dir.path().join("mine.msl"), SPARE).unwrap();
    let model = |module: &str| {
        format!("import {module}.{{Spare}}\n\nmodel M {{\n    input x: f32[2, 4]\n    output y = spare: Spare(x, 1)\n}}\n")
    };
    let options = CheckOptions {
        stdlib_dir: Some(std_dir),
        ..CheckOptions::default()
    };
    let from_std = dir.path().join("from_std.msl");
    std::fs::write(&from_std, model("std.nn")).unwrap();
    assert_eq!(unused_codes(&from_std, &options), []);

    let from_mine = dir.path().join("from_mine.msl");
    std::fs::write(&from_mine, model(".mine")).unwrap();
    let got = unused_codes(&from_mine, &options);
    let codes: Vec<&str> = got.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(codes, ["W0012", "W0007", "W0005"], "{got:?}");
    assert!(got.iter().all(|(_, f)| f.ends_with("mine.msl")), "{got:?}");
}

#[test]
fn a_file_with_errors_gets_no_unused_code_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("typo.msl");
    std::fs::write(
        &path,
        "model M {\n    input x: f32[2, 4]\n    let scaled = x * 2.0\n    output y = scaledd\n}\n",
    )
    .unwrap();
    let checked = check_path(&path, &CheckOptions::default());
    let codes: Vec<&str> = checked
        .diagnostics
        .iter()
        .map(|d| d.code.as_str())
        .collect();
    assert_eq!(codes, ["E0200"]);
}

#[test]
fn examples_have_no_unused_code() {
    for entry in std::fs::read_dir("examples").unwrap().flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "msl") {
            assert_eq!(
                unused_codes(&path, &CheckOptions::default()),
                [],
                "{}",
                path.display()
            );
        }
    }
}

#[test]
fn warnings_keep_exit_status_zero_and_the_summary_counts() {
    let out = Command::new(env!("CARGO_BIN_EXE_mslc"))
        .args(["check", "--summary", "tests/ui/lint_dropped_instance.msl"])
        .output()
        .expect("run mslc");
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.contains("wpe.weight"), "{stdout}");
    assert!(stdout.contains("total parameters: 1,984"), "{stdout}");
    assert!(stderr.contains("W0011"), "{stderr}");
}
