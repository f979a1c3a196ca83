//! `mslc train --ranks N`: a data-parallel plan run on N ranks (threads of one process, the
//! threads backend of the collectives) gives, step for step, the losses and final weights of
//! the same train on one device — the parity the sharded program must keep — and a world
//! that does not match the plan, or a layout the executor does not run, is a coded refusal.

use std::path::{Path, PathBuf};

use mslc_io::npy::{write_npy, NpyArray};
use mslc_io::safetensors::SafetensorsFile;

use crate::exec::common::{mslc, root, s, Rng, TestDir};
use crate::train::{assert_rel, metric_losses, safetensor_f64};

const INPUTS: usize = 12;
const CLASSES: usize = 5;
const SAMPLES: usize = 40;

/// The data-parallel policy of the parity tests.
const DATA: &str = "mesh = { dp: 2 }\n    mode = data";

/// A two-layer classifier trained with AdamW on batches of 8, with a parallel policy of
/// `policy` and the model's batch dim declared as `batch_dim`.
fn source(dir: &TestDir, policy: &str, batch_dim: usize) -> PathBuf {
    let text = format!(
        "import std.nn.LinearBias

model Net {{
    dims B = {batch_dim}
    input x: f32[B, {INPUTS}]
    output logits = head: LinearBias(relu(hidden: LinearBias(x, 16)), {CLASSES})
}}

parallel P {{
    {policy}
}}

train Fit for Net {{
    labels: i32[B]
    loss = cross_entropy(logits, labels, ignore_index: -1)
    optimizer = adamw(lr: 1e-2, weight_decay: 0.1)
    batch = 8
    parallel = P
    target = std.targets.cpu
}}
"
    );
    let path = dir.path("net.msl");
    std::fs::write(&path, text).unwrap();
    path
}

/// Random samples whose labels are ignored (-1) unevenly: the replicas count different
/// numbers of positions, so averaging their means would be wrong.
fn write_data(dir: &TestDir) -> PathBuf {
    let mut rng = Rng(5);
    let data = dir.path("data");
    std::fs::create_dir_all(&data).unwrap();
    let x = rng.vec(SAMPLES * INPUTS, -2.0, 2.0);
    write_npy(
        data.join("x.npy"),
        &NpyArray::from_f32(vec![SAMPLES, INPUTS], &x).unwrap(),
    )
    .unwrap();
    let labels: Vec<i64> = (0..SAMPLES)
        .map(|i| match i % 8 {
            // Rows 1, 2 and 3 of every batch of 8 land on replica 0 of 2.
            1..=3 => -1,
            _ => (rng.uniform() * CLASSES as f32) as i64 % CLASSES as i64,
        })
        .collect();
    write_npy(
        data.join("labels.npy"),
        &NpyArray::from_i64(vec![SAMPLES], &labels).unwrap(),
    )
    .unwrap();
    data
}

/// Trains `steps` steps of `source` with `extra` flags into `out`, returning the losses.
fn train(source: &Path, data: &Path, out: &Path, steps: &str, extra: &[&str]) -> Vec<f64> {
    let metrics = out.with_extension("jsonl");
    let args = [
        "train",
        s(source),
        "--init-seed",
        "3",
        "--data",
        s(data),
        "--steps",
        steps,
        "--shuffle",
        "9",
        "--metrics",
        s(&metrics),
        "--output-dir",
        s(out),
        "--threads",
        "1",
    ];
    let (code, stdout, stderr) = mslc(&[&args[..], extra].concat());
    assert_eq!(code, 0, "{stdout}{stderr}");
    metric_losses(&metrics)
}

fn weights(dir: &Path) -> Vec<(String, Vec<f64>)> {
    let file = dir.join("model.safetensors");
    let names: Vec<String> = SafetensorsFile::open(&file)
        .unwrap()
        .tensors()
        .map(|t| t.name.to_string())
        .collect();
    names
        .into_iter()
        .map(|n| {
            let v = safetensor_f64(&file, &n);
            (n, v)
        })
        .collect()
}

#[test]
fn data_parallel_on_two_ranks_matches_one_device() {
    let dir = TestDir::new("ranks-dp");
    let src = source(&dir, DATA, 4);
    let data = write_data(&dir);
    let (one, two) = (dir.path("one"), dir.path("two"));
    let single = train(&src, &data, &one, "10", &[]);
    let ranked = train(&src, &data, &two, "10", &["--ranks", "2"]);
    assert_eq!(single.len(), 10);
    assert_rel("losses", &ranked, &single, 1e-5);
    let (w1, w2) = (weights(&one.join("step-10")), weights(&two.join("step-10")));
    assert_eq!(
        w1.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        w2.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
    for ((name, a), (_, b)) in w1.iter().zip(&w2) {
        assert_rel(name, b, a, 1e-5);
    }
    // A checkpoint of two ranks resumes on one device.
    let resumed = train(
        &src,
        &data,
        &dir.path("resumed"),
        "12",
        &["--resume", s(&two.join("step-10"))],
    );
    assert_eq!(resumed.len(), 2);
    let continued = train(
        &src,
        &data,
        &dir.path("continued"),
        "12",
        &["--resume", s(&one.join("step-10"))],
    );
    assert_rel("losses after resuming", &resumed, &continued, 1e-5);
}

#[test]
fn the_world_must_match_the_plan_and_be_runnable() {
    let dir = TestDir::new("ranks-refused");
    let data = write_data(&dir);
    let src = source(&dir, DATA, 4);
    let args = ["train", s(&src), "--init-seed", "0", "--data", s(&data)];
    let (code, _, stderr) = mslc(&[&args[..], &["--ranks", "3"]].concat());
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("E0970"), "{stderr}");
    assert!(
        stderr.contains("started 3 rank(s), but the plan has 2"),
        "{stderr}"
    );
    let tensor = "mesh = { mp: 2 }\n    mode = semi_auto\n    shard \"hidden.weight\" = [mp, _]";
    let src = source(&dir, tensor, 8);
    let args = ["train", s(&src), "--init-seed", "0", "--data", s(&data)];
    let (code, _, stderr) = mslc(&[&args[..], &["--ranks", "2"]].concat());
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("E0972"), "{stderr}");
}

/// examples/tiny_llama.msl's model (2 layers, hidden 32, vocab 64, S = 8) trained in f32 with
/// AdamW on batches of 4 sequences, data parallel over 2 ranks against one device.
#[test]
fn tiny_llama_data_parallel_on_two_ranks_matches_one_device() {
    let dir = TestDir::new("ranks-llama");
    let example = std::fs::read_to_string(root().join("examples/tiny_llama.msl")).unwrap();
    let model_end = example.find("// f16 has").expect("the model part");
    let decl = "parallel P {
    mesh = { dp: 2 }
    mode = data
}

train Pretrain for TinyLlama {
    labels: i32[B, S]
    loss = cross_entropy(logits, labels)
    optimizer = adamw(lr: 1e-2, betas: (0.9, 0.95), weight_decay: 0.1)
    batch = 4
    clip_grad_norm = 1.0
    parallel = P
    target = std.targets.cpu
}
";
    let src = dir.path("llama.msl");
    std::fs::write(&src, format!("{}{decl}", &example[..model_end])).unwrap();
    let mut rng = Rng(17);
    let (n, seq) = (12, 8);
    let tokens: Vec<i64> = (0..n * (seq + 1))
        .map(|_| (rng.uniform() * 64.0) as i64 % 64)
        .collect();
    let data = dir.path("tokens.npy");
    write_npy(
        &data,
        &NpyArray::from_i64(vec![n, seq + 1], &tokens).unwrap(),
    )
    .unwrap();
    let sets = [
        "--set",
        "layers=2",
        "--set",
        "hidden=32",
        "--set",
        "ffn=64",
        "--set",
        "vocab=64",
        "--set",
        "heads=4",
        "--set",
        "kv_heads=2",
        "--dim",
        "S=8",
    ];
    let (one, two) = (dir.path("one"), dir.path("two"));
    let single = train(&src, &data, &one, "10", &sets);
    let ranked = train(
        &src,
        &data,
        &two,
        "10",
        &[&sets[..], &["--ranks", "2"]].concat(),
    );
    assert_eq!(single.len(), 10);
    assert_rel("losses", &ranked, &single, 1e-5);
    let (w1, w2) = (weights(&one.join("step-10")), weights(&two.join("step-10")));
    assert_eq!(w1.len(), w2.len());
    for ((name, a), (_, b)) in w1.iter().zip(&w2) {
        assert_rel(name, b, a, 1e-5);
    }
}
