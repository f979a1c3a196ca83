//! The hostile inputs of issue 8 that reach the front end (sources, `--set` values, special
//! files): each ends with coded diagnostics or success, never a panic (101), an abort (134),
//! the internal-error exit (3) or a hang.

use super::support::mslc_command;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What one run of `mslc` left.
struct Run {
    status: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    /// The codes of the JSON diagnostics on stdout.
    fn codes(&self) -> Vec<String> {
        self.stdout
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| v["code"].as_str().map(str::to_string))
            .collect()
    }
}

/// Runs `mslc` with `args`, killing it after `limit`; panics (failing the test) on a hang or a
/// crash exit.
fn mslc_within(args: &[&str], limit: Duration) -> Run {
    let mut child = mslc_command(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run mslc");
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = stdout.read_to_end(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = stderr.read_to_end(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("mslc {args:?} ran longer than {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let run = Run {
        status: status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.join().unwrap()).into_owned(),
        stderr: String::from_utf8_lossy(&err.join().unwrap()).into_owned(),
    };
    assert!(
        ![3, 101, 134, -1].contains(&run.status),
        "mslc {args:?} crashed with {}: {}",
        run.status,
        run.stderr
    );
    run
}

fn mslc(args: &[&str]) -> Run {
    mslc_within(args, Duration::from_secs(60))
}

/// Checks `text` written to `dir/name`, human and JSON; returns the JSON run.
fn check_text(dir: &Path, name: &str, text: &str, extra: &[&str]) -> Run {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    let p = path.to_str().unwrap();
    let mut human = vec!["check", p];
    human.extend_from_slice(extra);
    let human = mslc(&human);
    let mut json = vec!["--message-format", "json", "check", p];
    json.extend_from_slice(extra);
    let json = mslc(&json);
    assert_eq!(human.status, json.status, "{name}: {}", human.stderr);
    json
}

#[test]
fn lines_past_column_65535_render() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        format!(
            "model M {{\n    input x: f32[4]\n    output y = x{} + zz\n}}\n",
            " ".repeat(70_000)
        ),
        format!("model M {{\n{}output y = qq\n}}\n", "\t".repeat(40_000)),
        format!(
            "model M {{\n    output y = q // {}\n  bad bad\n}}\n",
            "中".repeat(35_000)
        ),
        format!("model M {{ output y = {}", "中".repeat(35_000)),
    ];
    for (i, text) in cases.iter().enumerate() {
        let path = dir.path().join(format!("wide{i}.msl"));
        std::fs::write(&path, text).unwrap();
        let run = mslc(&["check", path.to_str().unwrap()]);
        assert_eq!(run.status, 1, "{}", run.stderr);
        assert!(run.stderr.contains('…'), "{}", run.stderr);
        assert!(
            run.stderr.lines().all(|l| l.chars().count() < 400),
            "an unclipped line: {}",
            run.stderr
        );
        if i == 0 {
            // The header gives the position in the file, not in the clipped quote.
            assert!(run.stderr.contains("wide0.msl:3:70020]"), "{}", run.stderr);
        }
    }
}

#[test]
fn control_characters_from_a_file_are_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let text = "model M {\n    input x: f32[4]\n    output y = x\u{1b}]0;pwned\u{7}\u{1b}[2J\u{202e}\u{9b}\n}\n";
    let json = check_text(dir.path(), "esc.msl", text, &[]);
    assert_eq!(json.codes(), ["E0001"]);
    let human = mslc(&["check", dir.path().join("esc.msl").to_str().unwrap()]);
    for out in [&json.stdout, &human.stderr] {
        assert!(
            !out.contains(['\u{1b}', '\u{7}', '\u{202e}', '\u{9b}']),
            "raw control characters in {out:?}"
        );
    }
    assert!(human.stderr.contains("\\u{1b}"), "{}", human.stderr);
    assert!(human.stderr.contains('\u{241b}'), "{}", human.stderr);
}

#[test]
fn special_files_and_huge_sources_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let fifo = d.join("pipe.msl");
    let made = Command::new("mkfifo").arg(&fifo).status();
    std::fs::create_dir(d.join("folder.msl")).unwrap();
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink("loop_b.msl", d.join("loop_a.msl")).unwrap();
        std::os::unix::fs::symlink("loop_a.msl", d.join("loop_b.msl")).unwrap();
    }
    std::fs::write(d.join("huge.msl"), " ".repeat(9 << 20)).unwrap();
    let mut cases = vec![
        ("/dev/zero".to_string(), "E0100", "character device"),
        (d.display().to_string(), "E0100", "directory"),
        (
            d.join("huge.msl").display().to_string(),
            "E0007",
            "too large",
        ),
    ];
    if cfg!(unix) {
        cases.push((
            d.join("loop_a.msl").display().to_string(),
            "E0100",
            "symbolic",
        ));
    }
    if made.is_ok_and(|s| s.success()) {
        cases.push((fifo.display().to_string(), "E0100", "FIFO"));
    }
    for (path, code, words) in cases {
        let run = mslc_within(
            &["--message-format", "json", "check", &path],
            Duration::from_secs(20),
        );
        assert_eq!(run.status, 1, "{path}");
        assert_eq!(run.codes(), [code], "{path}: {}", run.stdout);
        assert!(run.stdout.contains(words), "{path}: {}", run.stdout);
    }
    let text = "import .folder.X\nimport .loop_a.Y\nimport .huge.Z\n\
                model M {\n    input x: f32[4]\n    output y = x\n}\n";
    let run = check_text(d, "imports.msl", text, &[]);
    assert_eq!(run.codes(), ["E0100", "E0100", "E0007"], "{}", run.stdout);
    assert!(!run.stdout.contains("not found"), "{}", run.stdout);
}

#[test]
fn runaway_loops_stop_quickly_and_overflow_is_coded() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let loops = [
        "model M {\n    input x: f32[4]\n    for i in 0..1000000000000 { }\n    output y = x\n}\n",
        "model M {\n    input x: f32[4]\n    for i in 0..1000000 { for j in 0..1000000 { for k in 0..1000000 { } } }\n    output y = x\n}\n",
        "model M {\n    input x: f32[4]\n    let h = x\n    for i in 0..1000000000 { h = h + x }\n    output y = h\n}\n",
    ];
    for (i, text) in loops.iter().enumerate() {
        let path = d.join(format!("loop{i}.msl"));
        std::fs::write(&path, text).unwrap();
        let start = Instant::now();
        let run = mslc_within(
            &["--message-format", "json", "check", path.to_str().unwrap()],
            Duration::from_secs(30),
        );
        assert_eq!(run.codes(), ["E0211"], "{}", run.stdout);
        assert!(start.elapsed() < Duration::from_secs(30));
    }
    let text = "model M {\n    const hidden = 4, heads = 2\n    const hd = hidden / heads\n    \
                input x: f32[4]\n    output y = x\n}\n";
    let run = check_text(
        d,
        "set.msl",
        text,
        &["--set", "hidden=-9223372036854775808", "--set", "heads=-1"],
    );
    assert_eq!(run.codes(), ["E0308"], "{}", run.stdout);
}

#[test]
fn byte_order_marks_pass_and_odd_line_breaks_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let good = "\u{feff}model M {\n    input x: f32[4]\n    output y = x\n}\n";
    assert_eq!(check_text(d, "bom.msl", good, &[]).status, 0);
    let bad = "\u{feff}model M {\n    input x: f32[4]\n    output y = nope\n}\n";
    let run = check_text(d, "bom_bad.msl", bad, &[]);
    assert_eq!(run.codes(), ["E0200"]);
    let at = bad.find("nope").unwrap();
    assert!(
        run.stdout.contains(&format!("\"byte_start\":{at},")),
        "{}",
        run.stdout
    );
    for (name, text) in [
        (
            "cr.msl",
            "model M {\r    // c\r    input x: f32[4]\r    output y = x\r}\r",
        ),
        (
            "ls.msl",
            "model M {\u{2028}    // c\u{2028}    input x: f32[4]\n    output y = x\n}\n",
        ),
        (
            "ps.msl",
            "model M {\n    // c\u{2029}    input x: f32[4]\n    output y = x\n}\n",
        ),
        (
            "nel.msl",
            "model M {\n    input x: f32[4] // c\u{85}    output y = x\n}\n",
        ),
    ] {
        let run = check_text(d, name, text, &[]);
        assert_eq!(run.codes(), ["E0008"], "{name}: {}", run.stdout);
    }
    let crlf = "model M {\r\n    // c\r\n    input x: f32[4]\r\n    output y = x\r\n}\r\n";
    assert_eq!(check_text(d, "crlf.msl", crlf, &[]).status, 0);
}

#[test]
fn parameter_totals_do_not_wrap_or_saturate() {
    let dir = tempfile::tempdir().unwrap();
    let text = "model M {\n    input x: f32[4]\n    output y = x\n    \
                param w: f32[4000000000, 4000000000]\n    param v: f32[4000000000, 4000000000]\n}\n";
    let path = dir.path().join("big.msl");
    std::fs::write(&path, text).unwrap();
    let run = mslc(&["check", "--summary", path.to_str().unwrap()]);
    assert_eq!(run.status, 0, "{}", run.stderr);
    assert!(
        run.stdout.contains(
            "total parameters: 32,000,000,000,000,000,000 (128,000,000,000,000,000,000 bytes)"
        ),
        "{}",
        run.stdout
    );
    assert!(!run.stdout.contains("18,446,744,073,709,551,615"));
    let text = "model M {\n    input x: f32[4]\n    output y = x\n    \
                param w: f32[9223372036854775807, 9223372036854775807, 9223372036854775807]\n}\n";
    std::fs::write(&path, text).unwrap();
    let run = mslc(&["check", "--summary", path.to_str().unwrap()]);
    assert!(
        run.stdout.contains("total parameters: more than 10^38"),
        "{}",
        run.stdout
    );
}

#[test]
fn a_long_shard_pattern_that_matches_nothing_is_quick() {
    let dir = tempfile::tempdir().unwrap();
    let groups: String = (0..10)
        .map(|i| format!("{{{}{i},{}{i}}}", "a".repeat(95), "b".repeat(95)))
        .collect();
    let rule = "shard \"lm_head.weight\" = [mp, _]";
    let source = std::fs::read_to_string("examples/llama2_70b.msl").unwrap();
    assert!(source.contains(rule));
    let text = source.replace(
        rule,
        &format!("{rule}\n    shard \"model.layers.*.{groups}.weight\" = [mp, _]"),
    );
    let start = Instant::now();
    let run = check_text(dir.path(), "pattern.msl", &text, &[]);
    assert!(start.elapsed() < Duration::from_secs(60));
    assert_eq!(run.codes(), ["E0508"], "{}", run.stdout);
    assert!(
        run.stdout
            .contains("the closest parameter path is `model.layers."),
        "{}",
        run.stdout
    );
}
