//! `mslc check` on bad input: every case ends with coded diagnostics and exit 1 (usage: 2),
//! never a panic (101), a hang or a stack overflow.

use std::path::Path;

use super::support::{codes, mslc};

fn check_bytes(dir: &Path, name: &str, bytes: &[u8], extra: &[&str]) -> (i32, Vec<String>) {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    let p = path.to_str().unwrap();
    let mut args = vec!["--message-format", "json", "check", p];
    args.extend_from_slice(extra);
    let out = mslc(&args);
    (out.status.code().unwrap_or(-1), codes(&out))
}

#[test]
fn bad_inputs_give_coded_errors() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let deep = format!(
        "model M {{ input x: f32[4]\n output y = {}x{} }}",
        "(".repeat(10_000),
        ")".repeat(10_000)
    );
    let long_line = format!(
        "model M {{ input x: f32[4] output y = x{} }}",
        " + x".repeat(250_000)
    );
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty.msl", b"".to_vec(), ""),
        (
            "garbage.msl",
            (0..=255u8).cycle().take(4096).collect(),
            "E0003",
        ),
        (
            "latin1.msl",
            b"model M { input x: f32[4] output y = x } // caf\xe9".to_vec(),
            "E0003",
        ),
        ("deep.msl", deep.into_bytes(), "E0002"),
        ("long.msl", long_line.into_bytes(), "E0002"),
        (
            "string.msl",
            b"parallel P { shard \"a.b = [dp] }".to_vec(),
            "E0004",
        ),
        (
            "comment.msl",
            b"/* never closed\nmodel M {}".to_vec(),
            "E0005",
        ),
        (
            "import.msl",
            b"import .nowhere.Block\nmodel M { input x: f32[4] output y = x }".to_vec(),
            "E0101",
        ),
    ];
    for (name, bytes, code) in cases {
        let (status, found) = check_bytes(d, name, &bytes, &[]);
        if code.is_empty() {
            assert_eq!(
                status, 0,
                "{name}: an empty file is a valid (empty) program"
            );
        } else {
            assert_eq!(status, 1, "{name}");
            assert!(
                found.iter().any(|c| c == code),
                "{name}: expected {code}, got {found:?}"
            );
        }
    }
}

#[test]
fn import_cycles_and_overrides() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("b.msl"),
        "import .a.A\npub block B(x: [N]) -> [N] { return A(x) }\n",
    )
    .unwrap();
    let (status, found) = check_bytes(
        d,
        "a.msl",
        b"import .b.B\npub block A(x: [N]) -> [N] { return x }\nmodel M { input x: f32[4] output y = B(x) }",
        &[],
    );
    assert_eq!(status, 1);
    assert!(found.contains(&"E0103".to_string()), "{found:?}");

    let model = b"model M { const layers = 2\n dims S = 4\n input x: f32[S] output y = x }";
    let (status, found) = check_bytes(d, "m.msl", model, &["--set", "layres=3"]);
    assert_eq!((status, found), (2, vec!["E0401".to_string()]));
    let (status, found) = check_bytes(d, "m.msl", model, &["--dim", "S=abc"]);
    assert_eq!((status, found), (2, vec!["E0402".to_string()]));
    let (status, _) = check_bytes(d, "m.msl", model, &["--dim", "S=8", "--set", "layers=3"]);
    assert_eq!(status, 0);
}

/// One root cause, one diagnostic: what follows from a bad override or a missing standard
/// library (unmatched shard patterns, unknown blocks, outputs, targets) is not reported again.
#[test]
fn a_root_cause_is_reported_once() {
    // (file, flags, the one code, exit status: 2 for a usage error)
    let cases: [(&str, &[&str], &str, i32); 4] = [
        (
            "examples/tiny_llama.msl",
            &["--set", "hidden=abc"],
            "E0402",
            2,
        ),
        (
            "examples/tiny_llama.msl",
            &["--stdlib", "/nonexistent"],
            "E0101",
            1,
        ),
        ("examples/tiny_llama.msl", &["--dim", "B=0"], "E0309", 1),
        ("examples/llama2_70b.msl", &["--set", "heads=7"], "E0302", 1),
    ];
    for (file, flags, code, status) in cases {
        let mut args = vec!["--message-format", "json", "check", file];
        args.extend_from_slice(flags);
        let out = mslc(&args);
        assert_eq!(out.status.code(), Some(status), "{file} {flags:?}");
        assert_eq!(codes(&out), vec![code.to_string()], "{file} {flags:?}");
    }
    let out = mslc(&[
        "check",
        "examples/tiny_llama.msl",
        "--stdlib",
        "/nonexistent",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("standard library directory `/nonexistent` does not exist"),
        "{stderr}"
    );
    // A directory that holds none of the standard library (a wrong path) is one error too, not
    // one per import and one per `std.targets` reference.
    let empty = tempfile::tempdir().unwrap();
    let dir = empty.path().to_str().unwrap();
    let args = [
        "--message-format",
        "json",
        "check",
        "examples/tiny_llama.msl",
    ];
    let out = mslc(&[&args[..], &["--stdlib", dir]].concat());
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(codes(&out), vec!["E0101".to_string()]);
    let out = mslc(&["check", "examples/tiny_llama.msl", "--stdlib", dir]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("holds no standard library module"),
        "{stderr}"
    );
}

#[test]
fn usage_errors_exit_2_and_missing_files_exit_1() {
    assert_eq!(mslc(&["check"]).status.code(), Some(2));
    assert_eq!(
        mslc(&["check", "x.msl", "--set", "novalue"]).status.code(),
        Some(2)
    );
    assert_eq!(mslc(&["frobnicate"]).status.code(), Some(2));
    assert_eq!(mslc(&["explain", "E9999"]).status.code(), Some(2));
    let out = mslc(&["--message-format", "json", "check", "/no/such/file.msl"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(codes(&out), vec!["E0100".to_string()]);
}

#[test]
fn explain_prints_the_page() {
    let out = mslc(&["explain", "E0301"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("# E0301"));
}
