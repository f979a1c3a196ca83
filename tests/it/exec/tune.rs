//! `mslc tune`: a small model tuned within a tiny budget fills the knowledge base, a second
//! run reuses it without measuring, `mslc build` marks the kernel table from it, and bad input
//! (a damaged or foreign knowledge base, a budget of zero or of days, a model with nothing to
//! tune, Ctrl-C) gets a clear answer with nothing lost.

use super::common::{mslc, s, TestDir};

/// The mlp example, shrunk.
const SMALL: [&str; 7] = [
    "examples/mlp.msl",
    "--set",
    "inputs=64",
    "--set",
    "hidden=32",
    "--dim",
    "B=8",
];

fn tune(dir: &TestDir, extra: &[&str]) -> (i32, String, String) {
    let db = dir.path("kb.json");
    let mut args = vec!["tune"];
    args.extend(SMALL);
    args.extend(["--db", s(&db), "-o", s(&dir.0)]);
    args.extend(extra);
    mslc(&args)
}

#[test]
fn tuning_fills_the_knowledge_base_that_a_second_run_and_build_reuse() {
    let dir = TestDir::new("tune-kb");
    let (code, out, err) = tune(&dir, &["--budget", "2s"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("measured") && out.contains("fused_matmul("),
        "{out}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path("Mlp.tune.json")).unwrap()).unwrap();
    let outcomes = report["report"]["outcomes"].as_array().unwrap();
    assert_eq!(outcomes.len(), 3, "three distinct matmul signatures");
    for o in outcomes {
        assert_eq!(o["source"], "measured", "{o}");
        let (d, t) = (
            o["default_us"].as_f64().unwrap(),
            o["tuned_us"].as_f64().unwrap(),
        );
        assert!(d > 0.0 && t > 0.0 && t <= d, "{o}");
    }

    let (code, out, err) = tune(&dir, &["--budget", "2s"]);
    assert_eq!(code, 0, "{err}");
    let again: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path("Mlp.tune.json")).unwrap()).unwrap();
    assert!(again["report"]["seconds"].as_f64().unwrap() < 2.0, "{out}");
    for o in again["report"]["outcomes"].as_array().unwrap() {
        assert_eq!(o["source"], "knowledge_base", "{o}");
    }

    // The build takes the tuned choices and says so in the kernel table.
    let mut args = vec!["build"];
    args.extend(SMALL);
    let db = dir.path("kb.json");
    let out_dir = dir.path("out");
    args.extend(["--tune-db", s(&db), "-o", s(&out_dir)]);
    let (code, out, err) = mslc(&args);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("tuning:     3 signatures from"), "{out}");
    let table = std::fs::read_to_string(out_dir.join("Mlp.kernels.toml")).unwrap();
    assert_eq!(table.matches("measured_us = ").count(), 3, "{table}");
    assert!(table.contains("tuned = true"), "{table}");

    // Results for another device are not used.
    let kb = std::fs::read_to_string(&db).unwrap();
    let device = serde_json::from_str::<serde_json::Value>(&kb).unwrap()["records"][0]["device"]
        .as_str()
        .unwrap()
        .to_string();
    let foreign = dir.path("foreign.json");
    std::fs::write(&foreign, kb.replace(&device, "another CPU")).unwrap();
    let args: Vec<&str> = args
        .iter()
        .map(|a| if *a == s(&db) { s(&foreign) } else { a })
        .collect();
    let (code, out, err) = mslc(&args);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("results for other devices only"), "{out}");
    let table = std::fs::read_to_string(out_dir.join("Mlp.kernels.toml")).unwrap();
    assert!(!table.contains("measured_us"), "{table}");
}

#[test]
fn a_damaged_or_foreign_knowledge_base_is_reported_and_left_alone() {
    let dir = TestDir::new("tune-bad-kb");
    let kb = dir.path("kb.json");
    for text in [
        "{\"format\": \"mslc-tune-kb\", \"version\": 1, \"rec",
        "[1, 2, 3]",
    ] {
        std::fs::write(dir.path("kb.json"), text).unwrap();
        let (code, _, err) = tune(&dir, &["--budget", "1s"]);
        assert_eq!(code, 1, "{err}");
        assert!(
            err.contains("E0622") && err.contains("move it aside"),
            "{err}"
        );
        assert_eq!(std::fs::read_to_string(dir.path("kb.json")).unwrap(), text);
        let mut args = vec!["build"];
        args.extend(SMALL);
        args.extend(["--tune-db", s(&kb), "-o", s(&dir.0)]);
        let (code, _, err) = mslc(&args);
        assert_eq!(code, 1, "{err}");
        assert!(err.contains("E0622"), "{err}");
    }
}

#[test]
fn budgets_of_zero_or_days_are_refused() {
    let dir = TestDir::new("tune-budget");
    for (budget, says) in [("0", "no time"), ("3d", "24h"), ("soon", "not a duration")] {
        let (code, _, err) = tune(&dir, &["--budget", budget]);
        assert_eq!(code, 2, "a usage error: {err}");
        assert!(err.contains("E0623") && err.contains(says), "{err}");
    }
    assert!(!dir.path("kb.json").exists(), "nothing written");
}

#[test]
fn a_model_with_nothing_to_tune_says_so() {
    let dir = TestDir::new("tune-nothing");
    let src = dir.path("id.msl");
    std::fs::write(
        &src,
        "model Id {\n    input x: f32[4]\n    output y = reshape(x, [2, 2])\n}\n",
    )
    .unwrap();
    let (code, _, err) = mslc(&[
        "tune",
        s(&src),
        "--db",
        s(&dir.path("kb.json")),
        "-o",
        s(&dir.0),
        "--budget",
        "1s",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("W0013"), "{err}");
}

#[cfg(unix)]
#[test]
fn ctrl_c_stops_the_run_and_keeps_what_was_measured() {
    use std::time::{Duration, Instant};
    let dir = TestDir::new("tune-ctrl-c");
    let db = dir.path("kb.json");
    // The full-size mlp: its signatures take long enough to search that the interrupt lands
    // mid-tune (the shrunk one can finish between two polls).
    let args = [
        "tune",
        "examples/mlp.msl",
        "--db",
        s(&db),
        "-o",
        s(&dir.0),
        "--budget",
        "10m",
    ];
    let child = crate::support::mslc_command(&args)
        .current_dir(super::common::root())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the first signature is saved, then interrupt.
    let start = Instant::now();
    while !db.exists() && start.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(2));
    }
    let killed = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("interrupted"), "{stdout}");
    assert!(
        start.elapsed() < Duration::from_secs(300),
        "stopped long before 10m"
    );
    let kb: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&db).unwrap()).unwrap();
    assert!(!kb["records"].as_array().unwrap().is_empty());
}
