//! What a person reads after `check` and `build`: one success line, a parameter table that
//! collapses repeated layers, and sizes in the unit that suits them.

use super::support::mslc_command;

fn mslc(args: &[&str]) -> (bool, String) {
    let out = mslc_command(args).output().expect("run mslc");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn check_says_what_it_checked_in_one_line() {
    let (ok, text) = mslc(&["check", "examples/llama2_7b.msl"]);
    assert!(ok);
    assert_eq!(text, "checked 1 file: 1 model, 6.74 B parameters\n");
    let (ok, text) = mslc(&["check", "examples/mlp.msl", "examples/llama2_70b.msl"]);
    assert!(ok);
    assert!(
        text.starts_with("checked 2 files: 2 models, 69.0 B parameters"),
        "{text}"
    );
    let (ok, text) = mslc(&["--message-format", "json", "check", "examples/mlp.msl"]);
    assert!(ok && text.is_empty(), "JSON output is unchanged: {text}");
}

#[test]
fn summary_collapses_repeated_layers() {
    let (ok, text) = mslc(&["check", "--summary", "examples/llama2_70b.msl"]);
    assert!(ok);
    assert!(text.lines().count() < 30, "{text}");
    let row = text
        .lines()
        .find(|l| l.contains("model.layers.{0..79}.mlp.up_proj.weight"))
        .expect("a collapsed row");
    assert!(
        row.contains("[28672, 8192]") && row.ends_with("234,881,024 × 80"),
        "{row}"
    );
    assert!(text.contains("total parameters: 68,976,648,192"));
}

#[test]
fn build_prints_sizes_in_units_that_read() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, text) = mslc(&[
        "build",
        "examples/llama2_70b.msl",
        "-o",
        dir.path().to_str().unwrap(),
        "--verify",
    ]);
    assert!(ok, "{text}");
    assert!(
        text.contains("parameters: 68,976,648,192 (257 GiB)"),
        "{text}"
    );
    assert!(text.contains("hoisted:    128 GiB"), "{text}");
    assert!(
        text.contains("verified:   the IR after lowering and after each of"),
        "{text}"
    );
    let (ok, text) = mslc(&[
        "build",
        "examples/mlp.msl",
        "-o",
        dir.path().to_str().unwrap(),
    ]);
    assert!(ok, "{text}");
    assert!(
        !text.contains("0.00 MiB") && !text.contains("0.0 MiB"),
        "{text}"
    );
    assert!(text.contains(" KiB") || text.contains(" B,"), "{text}");
}

#[test]
fn a_long_run_into_a_pipe_shows_no_progress_bar_and_names_its_peak() {
    let out = mslc_command(&["run", "examples/tiny_llama.msl", "--init-seed", "1"])
        .args(["--set", "layers=1", "--iterations", "30", "--threads", "2"])
        .output()
        .expect("run mslc");
    assert!(out.status.success());
    // However long the iterations take, stderr is a pipe: no bar.
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("% of the measured f32 peak ") && text.contains(" on 2 thread(s), "),
        "{text}"
    );
}
