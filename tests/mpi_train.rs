//! `mpiexec -n 2 mslc train --mpi` (cargo feature `mpi`; `harness = false`): a data-parallel
//! train run as one rank per process over MPI gives, step for step, the losses and the final
//! weights of the same train on one device within 1e-5 relative, with rank 0 alone reporting
//! and writing; a world that does not match the plan (a binary started without mpiexec sees
//! a world of 1) is E0970 naming both numbers. The same train under `optimizer_shard = level3`
//! (each process holding its slices of the parameters and optimizer states) gives the same
//! losses, and its gathered checkpoint the same weights and optimizer states. Without
//! mpiexec installed the test fails.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mslc_io::npy::{write_npy, NpyArray};
use mslc_io::safetensors::{SafetensorsFile, StDType};

/// Seconds one mslc or mpiexec run may take before it is killed and the test fails.
const LIMIT: Duration = Duration::from_secs(180);
const INPUTS: usize = 12;
const CLASSES: usize = 5;
const SAMPLES: usize = 40;
const STEPS: &str = "6";

/// A two-layer classifier trained with AdamW on batches of 8, data parallel on two devices
/// (each replica's micro-batch of 4 is the model's batch dim).
const SOURCE: &str = "import std.nn.LinearBias

model Net {
    dims B = 4
    input x: f32[B, 12]
    output logits = head: LinearBias(relu(hidden: LinearBias(x, 16)), 5)
}

parallel P {
    mesh = { dp: 2 }
    mode = data
}

train Fit for Net {
    labels: i32[B]
    loss = cross_entropy(logits, labels, ignore_index: -1)
    optimizer = adamw(lr: 1e-2, weight_decay: 0.1)
    batch = 8
    parallel = P
    target = std.targets.cpu
}
";

/// Deterministic values in [-2, 2) and labels, some ignored (-1) unevenly between the
/// replicas, so a mean of the replicas' means would be wrong.
fn write_data(dir: &Path) -> PathBuf {
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let mut state = 0x9e37_79b9_u32;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        state as f32 / u32::MAX as f32
    };
    let x: Vec<f32> = (0..SAMPLES * INPUTS).map(|_| next() * 4.0 - 2.0).collect();
    let x = NpyArray::from_f32(vec![SAMPLES, INPUTS], &x).unwrap();
    write_npy(data.join("x.npy"), &x).unwrap();
    let labels: Vec<i64> = (0..SAMPLES)
        .map(|i| match i % 8 {
            1..=3 => -1,
            _ => (next() * CLASSES as f32) as i64 % CLASSES as i64,
        })
        .collect();
    let labels = NpyArray::from_i64(vec![SAMPLES], &labels).unwrap();
    write_npy(data.join("labels.npy"), &labels).unwrap();
    data
}

/// Runs `cmd` to completion within [`LIMIT`]: (exit code, stdout, stderr).
fn run_limited(mut cmd: Command) -> (i32, String, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e} (is MPICH installed?)"));
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > LIMIT {
            child.kill().ok();
            panic!("{cmd:?} ran past {LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).to_string();
    (
        out.status.code().unwrap_or(-1),
        text(&out.stdout),
        text(&out.stderr),
    )
}

/// `mslc train` of the source `dir/net.msl` for [`STEPS`] steps into `out`, under `launcher`
/// (e.g. `mpiexec -n 2`, or nothing) with `extra` flags.
fn train(dir: &Path, out: &str, launcher: &[&str], extra: &[&str]) -> (i32, String, String) {
    train_source(dir, "net.msl", out, launcher, extra)
}

/// [`train`] of the source `dir/source`.
fn train_source(
    dir: &Path,
    source: &str,
    out: &str,
    launcher: &[&str],
    extra: &[&str],
) -> (i32, String, String) {
    let mslc = env!("CARGO_BIN_EXE_mslc");
    let mut cmd = match launcher.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(mslc);
            c
        }
        None => Command::new(mslc),
    };
    let (src, data, out) = (dir.join(source), dir.join("data"), dir.join(out));
    cmd.arg("train")
        .arg(&src)
        .args(["--init-seed", "3", "--shuffle", "9", "--threads", "1"])
        .args(["--steps", STEPS, "--data"])
        .arg(&data)
        .arg("--metrics")
        .arg(out.with_extension("jsonl"))
        .arg("--output-dir")
        .arg(&out)
        .args(extra)
        // No tuning knowledge base of the user's changes what the build chooses (mpiexec
        // passes the environment on to its ranks).
        .env("XDG_CACHE_HOME", dir.join("cache"))
        .env("RAYON_NUM_THREADS", "1");
    run_limited(cmd)
}

/// The losses of a metrics file, one per step.
fn losses(path: &Path) -> Vec<f64> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["loss"]
                .as_f64()
                .unwrap()
        })
        .collect()
}

/// Every f32 tensor of a checkpoint's weights, by name.
fn weights(dir: &Path) -> Vec<(String, Vec<f64>)> {
    tensors(&dir.join("model.safetensors"))
}

/// Every f32 tensor of a safetensors file, by name.
fn tensors(file: &Path) -> Vec<(String, Vec<f64>)> {
    let file = SafetensorsFile::open(file).unwrap();
    file.tensors()
        .map(|t| {
            assert_eq!(t.dtype, StDType::F32, "{}", t.name);
            let values = t
                .data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64)
                .collect();
            (t.name.to_string(), values)
        })
        .collect()
}

/// `got` equals `want` within `rel` relative (of the larger magnitude, at least 1e-6).
fn assert_rel(what: &str, got: &[f64], want: &[f64], rel: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let scale = g.abs().max(w.abs()).max(1e-6);
        assert!(
            (g - w).abs() <= rel * scale,
            "{what}[{i}]: MPI {g}, one device {w}"
        );
    }
}

fn main() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("net.msl"), SOURCE).unwrap();
    write_data(dir);

    let (code, stdout, stderr) = train(dir, "one", &[], &[]);
    assert_eq!(code, 0, "one device:\n{stdout}{stderr}");
    let (code, stdout, stderr) = train(dir, "two", &["mpiexec", "-n", "2"], &["--mpi"]);
    assert_eq!(code, 0, "mpiexec -n 2:\n{stdout}{stderr}");
    // Rank 0 alone reports (once) and writes the metrics and checkpoints.
    assert_eq!(stdout.matches("trained Fit").count(), 1, "{stdout}{stderr}");
    let single = losses(&dir.join("one.jsonl"));
    let mpi = losses(&dir.join("two.jsonl"));
    assert_eq!(single.len(), STEPS.parse::<usize>().unwrap());
    assert_rel("losses", &mpi, &single, 1e-5);
    let last = format!("step-{STEPS}");
    let (w1, w2) = (
        weights(&dir.join("one").join(&last)),
        weights(&dir.join("two").join(&last)),
    );
    let names = |w: &[(String, Vec<f64>)]| w.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(&w1), names(&w2));
    for ((name, a), (_, b)) in w1.iter().zip(&w2) {
        assert_rel(name, b, a, 1e-5);
    }
    println!(
        "mpiexec -n 2: {} losses and {} weights match one device within 1e-5",
        mpi.len(),
        w2.len()
    );

    // Optimizer sharding level 3 (ZeRO stage 3): the same numbers, checkpoint gathered whole.
    let level3 = SOURCE.replace("mode = data", "mode = data\n    optimizer_shard = level3");
    std::fs::write(dir.join("net3.msl"), level3).unwrap();
    let launcher = ["mpiexec", "-n", "2"];
    let (code, stdout, stderr) = train_source(dir, "net3.msl", "zero3", &launcher, &["--mpi"]);
    assert_eq!(code, 0, "mpiexec -n 2, level3:\n{stdout}{stderr}");
    assert_rel(
        "level3 losses",
        &losses(&dir.join("zero3.jsonl")),
        &single,
        1e-5,
    );
    for file in ["model.safetensors", "optimizer.safetensors"] {
        let one = tensors(&dir.join("one").join(&last).join(file));
        let zero = tensors(&dir.join("zero3").join(&last).join(file));
        assert_eq!(names(&one), names(&zero), "{file}");
        for ((name, a), (_, b)) in one.iter().zip(&zero) {
            // Of the tensor's largest magnitude: a moment's element near zero carries the
            // gradient sum's reassociation (the replicas' shares added in another order) at
            // ~1e-5 of itself, ~1e-10 absolute.
            let scale = a.iter().fold(0f64, |m, x| m.max(x.abs()));
            let err = a.iter().zip(b).fold(0f64, |m, (x, y)| m.max((x - y).abs()));
            assert!(
                err <= 1e-5 * scale,
                "level3 {name}: error {err:e} of {scale:e}"
            );
        }
    }
    println!("mpiexec -n 2, optimizer_shard = level3: losses, weights and states match one device within 1e-5");

    // Started without mpiexec, the process sees a world of 1, and the plan has 2 devices.
    let (code, _, stderr) = train(dir, "alone", &[], &["--mpi"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("E0970"), "{stderr}");
    assert!(
        stderr.contains("mpiexec started 1 rank(s), but the plan has 2 device(s)"),
        "{stderr}"
    );
    // Three processes for two devices: every rank refuses, none trains.
    let (code, _, stderr) = train(dir, "three", &["mpiexec", "-n", "3"], &["--mpi"]);
    assert_ne!(code, 0, "{stderr}");
    assert!(
        stderr.contains("mpiexec started 3 rank(s), but the plan has 2 device(s)"),
        "{stderr}"
    );
    assert!(!dir.join("three.jsonl").exists());
    println!("worlds of 1 and 3 for a plan of 2 devices: E0970");
}
