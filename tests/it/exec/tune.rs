//! `mslc tune`: a small model tuned within a tiny budget fills the knowledge base, a second
//! run reuses it without measuring, `mslc build` marks the kernel table from it and follows
//! its graph-level decisions (a planted one is built, recorded and run), and bad input
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

/// The mlp example at sizes where a GEMM blocking of 1 costs many times the default, far
/// beyond the noise of a loaded machine.
const LARGER: [&str; 7] = [
    "examples/mlp.msl",
    "--set",
    "inputs=128",
    "--set",
    "hidden=256",
    "--dim",
    "B=64",
];

fn tune(dir: &TestDir, extra: &[&str]) -> (i32, String, String) {
    tune_model(dir, &SMALL, extra)
}

/// `mslc tune` of `model` (the source and its `--set`/`--dim`) into `dir`, its knowledge base
/// `dir/kb.json`.
fn tune_model(dir: &TestDir, model: &[&str], extra: &[&str]) -> (i32, String, String) {
    let db = dir.path("kb.json");
    let mut args = vec!["tune"];
    args.extend(model);
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
    let signature = |o: &serde_json::Value| o["signature"].as_str().unwrap().to_string();
    let fused = outcomes
        .iter()
        .filter(|o| signature(o).starts_with("fused_matmul("))
        .count();
    assert_eq!(fused, 3, "three distinct matmul signatures: {outcomes:?}");
    // Besides them, the ops of a subgraph that graph-level tuning measured faster unfused (the
    // tiny model's products take microseconds, so either may win).
    let unfused = report["subgraphs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["fused"] == false)
        .count();
    assert_eq!(outcomes.len() > 3, unfused > 0, "{report}");
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
    // Every signature of the built forward was tuned: the three products, or the ops of the
    // subgraphs left unfused in their place.
    let tuned: usize = out
        .split("tuning:")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    assert!(tuned >= 3 && tuned <= outcomes.len(), "{out}");
    let table = std::fs::read_to_string(out_dir.join("Mlp.kernels.toml")).unwrap();
    assert_eq!(table.matches("measured_us = ").count(), tuned, "{table}");
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

/// The knowledge base of `dir` as JSON.
fn read_kb(dir: &TestDir) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.path("kb.json")).unwrap()).unwrap()
}

#[test]
fn a_planted_slower_decision_is_dropped_by_the_whole_model_confirmation() {
    let dir = TestDir::new("tune-confirm");
    let (code, _, err) = tune_model(&dir, &LARGER, &["--budget", "2s"]);
    assert_eq!(code, 0, "{err}");
    // Plant GEMM blockings of one value each for the three products, recorded as a 30x win:
    // each kernel on its own "measured" faster, the whole forward far slower. The subgraphs
    // run fused, as a confirmation that dropped their unfused decisions leaves them: at these
    // sizes a product with its bias is as fast either way, and an unfused decision adds
    // records for the ops it leaves, which this test is not about.
    let mut kb = read_kb(&dir);
    for r in kb["subgraphs"].as_array_mut().unwrap() {
        r["fused"] = serde_json::json!(true);
    }
    let records = kb["records"].as_array_mut().unwrap();
    records.retain(|r| {
        r["signature"]
            .as_str()
            .unwrap()
            .starts_with("fused_matmul(")
    });
    assert_eq!(records.len(), 3, "{records:?}");
    for r in records {
        assert_eq!(r["kernel"], "gemm", "{r}");
        for p in ["mc", "kc", "nc"] {
            r["params"][p] = serde_json::json!({ "Int": 1 });
        }
        r["tuned_us"] = serde_json::json!(r["default_us"].as_f64().unwrap() / 30.0);
    }
    std::fs::write(dir.path("kb.json"), kb.to_string()).unwrap();

    let (code, out, err) = tune_model(&dir, &LARGER, &["--budget", "2s"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("every decision dropped"), "{out}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path("Mlp.tune.json")).unwrap()).unwrap();
    let whole = &report["whole_model"];
    assert_eq!(whole["source"], "measured", "{whole}");
    assert_eq!(whole["kept"], "none", "{whole}");
    assert_eq!(
        whole["dropped_kernels"].as_array().unwrap().len(),
        3,
        "{whole}"
    );
    let (default_ms, tried) = (
        whole["default_ms"].as_f64().unwrap(),
        whole["tried"][0]["ms"].as_f64().unwrap(),
    );
    assert!(tried > default_ms, "{whole}");
    assert_eq!(whole["tuned_ms"].as_f64(), Some(default_ms), "{whole}");
    // The knowledge base now chooses the default blockings, which a build follows; the
    // confirmation is kept, so a third run measures nothing.
    for r in read_kb(&dir)["records"].as_array().unwrap() {
        assert_ne!(r["params"]["mc"], serde_json::json!({ "Int": 1 }), "{r}");
        assert_eq!(r["tuned_us"], r["default_us"], "{r}");
    }
    let (code, out, err) = tune_model(&dir, &LARGER, &["--budget", "2s"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("the defaults are kept; noise"), "{out}");
    let again: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path("Mlp.tune.json")).unwrap()).unwrap();
    assert_eq!(again["whole_model"]["source"], "knowledge_base");
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
    // Wait until the first decision is saved, then interrupt.
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
    // The first decision saved, a kernel's or a subgraph's (graph-level decisions come
    // first), is there.
    let saved = |key: &str| kb[key].as_array().unwrap().len();
    assert!(saved("records") + saved("subgraphs") > 0, "{kb}");
}

/// tiny_llama, shrunk: under its f16 policy its scaled RMS norm output is cast and scaled in
/// one fused elementwise subgraph.
const LLAMA: [&str; 5] = [
    "examples/tiny_llama.msl",
    "--set",
    "layers=1",
    "--dim",
    "S=8",
];

/// The logits of `args` (a source and its flags, or a `.mir`) run with seed 1, and the run's
/// profile (which names every step's op).
fn logits(dir: &TestDir, args: &[&str], out: &str) -> (Vec<f32>, String) {
    let out_dir = dir.path(out);
    let profile = dir.path(&format!("{out}.profile.json"));
    let mut run = vec!["run"];
    run.extend(args);
    run.extend(["--init-seed", "1", "--output-dir", s(&out_dir)]);
    run.extend(["--profile", s(&profile)]);
    let (code, _, err) = mslc(&run);
    assert_eq!(code, 0, "{err}");
    let array = mslc_io::npy::read_npy(out_dir.join("logits.npy")).unwrap();
    (
        array.to_f32().unwrap(),
        std::fs::read_to_string(profile).unwrap(),
    )
}

#[test]
fn a_planted_unfused_decision_is_built_recorded_and_run() {
    let dir = TestDir::new("tune-graph");
    let default_dir = dir.path("default");
    let mut build = vec!["build"];
    build.extend(LLAMA);
    build.extend(["-o", s(&default_dir)]);
    let (code, _, err) = mslc(&build);
    assert_eq!(code, 0, "{err}");
    let table = std::fs::read_to_string(default_dir.join("TinyLlama.kernels.toml")).unwrap();
    let table: toml::Value = toml::from_str(&table).unwrap();
    let fused: Vec<&str> = table["kernel"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|k| k["signature"].as_str())
        .filter(|sig| sig.starts_with("fused_elementwise("))
        .collect();
    assert_eq!(fused.len(), 1, "{fused:?}");
    let signature = fused[0];

    // A knowledge base deciding that subgraph unfused on this device.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let kb = serde_json::json!({
        "format": "mslc-tune-kb",
        "version": 2,
        "records": [],
        "subgraphs": [{
            "device": mslc_tune::device::fingerprint(),
            "threads": threads,
            "signature": signature,
            "fused": false,
            "fused_us": 10.0,
            "unfused_us": 5.0,
        }],
    });
    let db = dir.path("kb.json");
    std::fs::write(&db, serde_json::to_string(&kb).unwrap()).unwrap();
    let tuned_dir = dir.path("tuned");
    let mut build = vec!["build"];
    build.extend(LLAMA);
    build.extend(["--tune-db", s(&db), "-o", s(&tuned_dir)]);
    let (code, out, err) = mslc(&build);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("1 fused subgraph(s) left unfused"), "{out}");
    let tuned_table = tuned_dir.join("TinyLlama.kernels.toml");
    let text = std::fs::read_to_string(&tuned_table).unwrap();
    let table: toml::Value = toml::from_str(&text).unwrap();
    let kernels = table["kernel"].as_array().unwrap();
    assert!(
        kernels.iter().all(|k| !k["signature"]
            .as_str()
            .unwrap()
            .starts_with("fused_elementwise(")),
        "no fused op left: {text}"
    );
    let entry = &table["subgraph"][0];
    assert_eq!(entry["signature"].as_str(), Some(signature));
    assert_eq!(entry["fused"].as_bool(), Some(false));

    // The unfused module computes what the fused one does (f16 rounding at the same points),
    // built from the knowledge base or run from the source with the table.
    let (want, profile) = logits(&dir, &[s(&default_dir.join("TinyLlama.mir"))], "o-default");
    assert!(profile.contains("fused_elementwise"));
    let built = logits(&dir, &[s(&tuned_dir.join("TinyLlama.mir"))], "o-built");
    let mut from_source = LLAMA.to_vec();
    from_source.extend(["--kernels", s(&tuned_table)]);
    let run = logits(&dir, &from_source, "o-source");
    for (got, profile) in [built, run] {
        assert!(!profile.contains("fused_elementwise"), "the decision holds");
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-3 * (1.0 + w.abs()), "{g} vs {w}");
        }
    }
}

/// `mslc tune FILE.msl --entry TRAIN` tunes the training step as `mslc build --entry TRAIN`
/// compiles it for one device (its batch dim one micro-batch), the report named after the
/// train, and `mslc build` of the train then marks its kernel table from the knowledge base.
#[test]
fn a_train_entry_of_a_source_tunes_its_training_step() {
    let dir = TestDir::new("tune-train");
    let db = dir.path("kb.json");
    let model = [
        "examples/mlp.msl",
        "--set",
        "inputs=64",
        "--set",
        "hidden=32",
    ];
    let (code, out, err) = tune_model(&dir, &model, &["--entry", "Classify", "--budget", "2s"]);
    assert_eq!(code, 0, "{out}{err}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path("Classify.tune.json")).unwrap())
            .unwrap();
    let outcomes = report["report"]["outcomes"].as_array().unwrap();
    let signatures: Vec<&str> = outcomes
        .iter()
        .filter_map(|o| o["signature"].as_str())
        .collect();
    // A weight gradient's GEMM (xᵀ · dy) is the backward's alone.
    assert!(
        signatures
            .iter()
            .any(|s| s.starts_with("matmul(") && s.contains("transpose_a=true")),
        "the backward is tuned too: {signatures:?}"
    );
    // So is the optimizer's update, in place as the step runs it.
    let adam = outcomes
        .iter()
        .find(|o| {
            o["signature"]
                .as_str()
                .is_some_and(|s| s.starts_with("adam_update("))
        })
        .expect("an adam_update signature");
    assert_eq!(adam["source"], "measured", "{adam}");
    let mut args = vec!["build"];
    args.extend(model);
    args.extend(["--entry", "Classify", "--tune-db", s(&db), "-o", s(&dir.0)]);
    let (code, out, err) = mslc(&args);
    assert_eq!(code, 0, "{out}{err}");
    let table = std::fs::read_to_string(dir.path("Classify.kernels.toml")).unwrap();
    assert!(table.contains("tuned = true"), "{table}");
}

/// A step whose SGD updates overwrite their parameters (`p − lr·g` over p's own bytes, run in
/// place by the executor) is tuned as it computes: every signature's default passes the
/// correctness guard, none is skipped as wrong (a case run in place without its operand in its
/// output would be).
#[test]
fn an_sgd_step_tunes_the_updates_over_its_parameters() {
    let dir = TestDir::new("tune-sgd");
    let source = std::fs::read_to_string(super::common::root().join("examples/mlp.msl")).unwrap();
    let adam = "optimizer = adam(lr: 1e-3, betas: (0.9, 0.999))";
    assert!(
        source.contains(adam),
        "examples/mlp.msl's optimizer changed"
    );
    let sgd = dir.path("mlp_sgd.msl");
    std::fs::write(
        &sgd,
        source.replace(adam, "optimizer = sgd(lr: 0.1, momentum: 0.9)"),
    )
    .unwrap();
    let model = [s(&sgd), "--set", "inputs=64", "--set", "hidden=32"];
    let (code, out, err) = tune_model(&dir, &model, &["--entry", "Classify", "--budget", "3s"]);
    assert_eq!(code, 0, "{out}{err}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path("Classify.tune.json")).unwrap())
            .unwrap();
    let outcomes = report["report"]["outcomes"].as_array().unwrap();
    assert!(outcomes.len() > 10, "{out}");
    for o in outcomes {
        let skipped = o["source"]["skipped"].as_str().unwrap_or("");
        assert!(!skipped.contains("default kernel"), "{o}");
    }
}
