//! Training mode in `mslc train`, as PyTorch's `model.train()`: BatchNorm with batch statistics
//! and PyTorch's running-statistic updates against a float64 JAX training of the same model
//! (tests/reference/train_mode_ref.py), and live dropout — its keep rate and `1 / (1 − p)`
//! scaling measured through the loss and the gradient, the backward's mask the forward's, and
//! masks that a resume reproduces byte for byte.

use std::path::{Path, PathBuf};

use mslc_io::npy::{write_npy, NpyArray};
use mslc_io::safetensors::{write_safetensors, StDType, TensorRef};

use crate::exec::common::{have_python_module, mslc, root, s, Rng, TestDir};
use crate::train::{assert_rel, metric_losses, npy_f64, refusal_codes, safetensor_f64};

const BN_SOURCE: &str = "import std.nn.Conv2d
import std.nn.BatchNorm2d
import std.nn.LinearBias

model ConvNet {
    dims B = 1
    input images: f32[B, 2, 5, 5]
    let c = conv: Conv2d(images, 3, 3, padding: 1)
    let h = relu(bn: BatchNorm2d(c, momentum: 0.2))
    output logits = head: LinearBias(reshape(h, [B, 75]), 4)
}

train Fit for ConvNet {
    labels: i32[B]
    loss = cross_entropy(logits, labels)
    optimizer = sgd(lr: 0.1, momentum: 0.9)
    batch = 6
}
";

fn write_f32s(path: &Path, tensors: &[(&str, Vec<usize>, Vec<f32>)]) {
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, _, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    let refs: Vec<TensorRef> = tensors
        .iter()
        .zip(&bytes)
        .map(|((name, shape, _), data)| TensorRef {
            name,
            dtype: StDType::F32,
            shape,
            data,
        })
        .collect();
    write_safetensors(path, &refs).unwrap();
}

/// Three SGD steps (batches of 6, taken from the train's `batch` without `--dim`) of a
/// The ConvNet of [`BN_SOURCE`] in `dir` with `train_fields` added to its train and `policies`
/// after it, random weights for it, and 14 random samples in a data directory: the source,
/// weights and data paths and the images.
fn bn_setup(
    dir: &TestDir,
    train_fields: &str,
    policies: &str,
) -> (PathBuf, PathBuf, PathBuf, Vec<f32>) {
    let source = dir.path("convnet.msl");
    let train = BN_SOURCE.replace("    batch = 6\n", &format!("    batch = 6\n{train_fields}"));
    std::fs::write(&source, format!("{train}{policies}")).unwrap();
    let mut rng = Rng(21);
    let weights = dir.path("w.safetensors");
    write_f32s(
        &weights,
        &[
            ("conv.weight", vec![3, 2, 3, 3], rng.vec(54, -0.5, 0.5)),
            ("bn.weight", vec![3], rng.vec(3, 0.5, 1.5)),
            ("bn.bias", vec![3], rng.vec(3, -0.3, 0.3)),
            ("bn.running_mean", vec![3], rng.vec(3, -0.2, 0.2)),
            ("bn.running_var", vec![3], rng.vec(3, 0.5, 1.5)),
            ("head.weight", vec![4, 75], rng.vec(300, -0.2, 0.2)),
            ("head.bias", vec![4], rng.vec(4, -0.1, 0.1)),
        ],
    );
    let data = dir.path("data");
    std::fs::create_dir_all(&data).unwrap();
    let samples = 14;
    let images = rng.vec(samples * 50, -2.0, 2.0);
    write_npy(
        data.join("images.npy"),
        &NpyArray::from_f32(vec![samples, 2, 5, 5], &images).unwrap(),
    )
    .unwrap();
    let labels: Vec<i64> = rng
        .vec(samples, 0.0, 4.0)
        .iter()
        .map(|&x| x as i64)
        .collect();
    write_npy(
        data.join("labels.npy"),
        &NpyArray::from_i64(vec![samples], &labels).unwrap(),
    )
    .unwrap();
    (source, weights, data, images)
}

/// A step that loss scaling skips leaves every parameter as it was but, as PyTorch's forward in
/// `model.train()` (and MindSpore's, whose BatchNorm assigns its statistics in the forward),
/// still moves the running statistics: a fixed scale of 2^30 overflows f16 on every step.
#[test]
fn a_skipped_update_still_moves_the_running_statistics() {
    let dir = TestDir::new("train-mode-bn-skip");
    let policy = "precision Half {\n    level = O2\n    compute = f16\n    loss_scale = fixed(1073741824)\n}\n";
    let (source, weights, data, _) = bn_setup(&dir, "    precision = Half\n", policy);
    let (out, metrics) = (dir.path("out"), dir.path("m.jsonl"));
    let (code, stdout, stderr) = mslc(&[
        "train",
        s(&source),
        "--weights",
        s(&weights),
        "--data",
        s(&data),
        "--steps",
        "2",
        "--output-dir",
        s(&out),
        "--metrics",
        s(&metrics),
    ]);
    assert_eq!(code, 0, "mslc train:\n{stdout}\n{stderr}");
    let skipped: Vec<bool> = std::fs::read_to_string(&metrics)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["skipped"] == true)
        .collect();
    assert_eq!(skipped, [true, true]);
    let model = out.join("step-2/model.safetensors");
    for name in [
        "conv.weight",
        "bn.weight",
        "bn.bias",
        "head.weight",
        "head.bias",
    ] {
        let (got, before) = (safetensor_f64(&model, name), safetensor_f64(&weights, name));
        assert_eq!(got, before, "{name} changed in a skipped step");
    }
    for name in ["bn.running_mean", "bn.running_var"] {
        let (got, before) = (safetensor_f64(&model, name), safetensor_f64(&weights, name));
        assert_ne!(got, before, "{name} did not move");
    }
}

/// conv → BatchNorm2d → relu → linear classifier: every step's loss, the first step's
/// gradients (through the batch statistics) and the final parameters and running statistics
/// within 1e-4 relative of the float64 reference; then `mslc run` of the checkpoint stays in
/// eval mode, normalising with the saved running statistics, as the reference's eval forward.
#[test]
fn batch_norm_trains_with_batch_statistics_as_torch() {
    if !have_python_module("jax") {
        eprintln!("note: python3 with jax is not available; skipping the BatchNorm check");
        return;
    }
    let dir = TestDir::new("train-mode-bn");
    let (source, weights, data, images) = bn_setup(&dir, "", "");
    let eval_images = dir.path("eval_images.npy");
    write_npy(
        &eval_images,
        &NpyArray::from_f32(vec![6, 2, 5, 5], &images[..300]).unwrap(),
    )
    .unwrap();
    let (out, grads, metrics) = (dir.path("out"), dir.path("grads"), dir.path("m.jsonl"));
    let (code, stdout, stderr) = mslc(&[
        "train",
        s(&source),
        "--weights",
        s(&weights),
        "--data",
        s(&data),
        "--steps",
        "3",
        "--output-dir",
        s(&out),
        "--dump-grads",
        s(&grads),
        "--metrics",
        s(&metrics),
    ]);
    assert_eq!(code, 0, "mslc train:\n{stdout}\n{stderr}");
    let reference = dir.path("ref");
    let status = std::process::Command::new("python3")
        .arg(root().join("tests/reference/train_mode_ref.py"))
        .args([s(&weights), s(&data), s(&reference)])
        .args(["--batch", "6", "--steps", "3", "--lr", "0.1"])
        .args(["--momentum", "0.9", "--bn-momentum", "0.2"])
        .args(["--eval", s(&eval_images)])
        .status()
        .expect("python3 runs");
    assert!(status.success(), "the JAX reference failed");
    let losses = metric_losses(&metrics);
    assert_rel(
        "losses",
        &losses,
        &npy_f64(&reference.join("losses.npy")),
        1e-4,
    );
    let model = out.join("step-3/model.safetensors");
    for name in [
        "conv.weight",
        "bn.weight",
        "bn.bias",
        "head.weight",
        "head.bias",
    ] {
        let got = safetensor_f64(&grads.join("grads.safetensors"), name);
        let want = npy_f64(&reference.join("grads").join(format!("{name}.npy")));
        assert_rel(&format!("gradient of {name}"), &got, &want, 1e-4);
    }
    for name in [
        "conv.weight",
        "bn.weight",
        "bn.bias",
        "bn.running_mean",
        "bn.running_var",
        "head.weight",
        "head.bias",
    ] {
        let got = safetensor_f64(&model, name);
        let want = npy_f64(&reference.join("final").join(format!("{name}.npy")));
        assert_rel(&format!("final {name}"), &got, &want, 1e-4);
    }
    let run_out = dir.path("run");
    let images_arg = format!("images={}", s(&eval_images));
    let (code, stdout, stderr) = mslc(&[
        "run",
        s(&source),
        "--dim",
        "B=6",
        "--weights",
        s(&model),
        "--input",
        &images_arg,
        "--output-dir",
        s(&run_out),
    ]);
    assert_eq!(code, 0, "mslc run:\n{stdout}\n{stderr}");
    assert_rel(
        "eval-mode logits",
        &npy_f64(&run_out.join("logits.npy")),
        &npy_f64(&reference.join("eval_logits.npy")),
        1e-4,
    );
}

/// `y = dropout(x · w)` on ones, against zero targets: the loss, mean(y²), counts the kept
/// elements times `scale²`, and the gradient of `w[j]` counts those of column `j` times
/// `2·scale² / numel` — so the keep rate, the scaling and that the backward reuses the forward's
/// mask are all read off one step.
const DROP_SOURCE: &str = "model Drop {
    dims B = 64
    input x: f32[B, 256]
    param w: [256] ~ ones
    output y = dropout(x * w, p: 0.25)
}

train Fit for Drop {
    labels: f32[B, 256]
    loss = mse_loss(y, labels)
    optimizer = sgd(lr: 0.01)
    batch = 64
}
";

fn drop_setup(dir: &TestDir) -> (std::path::PathBuf, std::path::PathBuf) {
    let source = dir.path("drop.msl");
    std::fs::write(&source, DROP_SOURCE).unwrap();
    let data = dir.path("data");
    std::fs::create_dir_all(&data).unwrap();
    let n = 128 * 256;
    write_npy(
        data.join("x.npy"),
        &NpyArray::from_f32(vec![128, 256], &vec![1.0; n]).unwrap(),
    )
    .unwrap();
    write_npy(
        data.join("labels.npy"),
        &NpyArray::from_f32(vec![128, 256], &vec![0.0; n]).unwrap(),
    )
    .unwrap();
    (source, data)
}

#[test]
fn dropout_keeps_1_minus_p_scales_and_reuses_its_mask_in_the_backward() {
    let dir = TestDir::new("train-mode-dropout");
    let (source, data) = drop_setup(&dir);
    let grads = dir.path("grads");
    let (code, stdout, stderr) = mslc(&[
        "train",
        s(&source),
        "--init-seed",
        "0",
        "--data",
        s(&data),
        "--dump-grads",
        s(&grads),
        "--seed",
        "5",
    ]);
    assert_eq!(code, 0, "mslc train:\n{stdout}\n{stderr}");
    let numel = 64.0 * 256.0;
    let scale2 = (1.0f64 / 0.75).powi(2);
    let loss = npy_f64(&grads.join("loss.npy"))[0];
    let kept = loss * numel / scale2;
    assert!((kept - kept.round()).abs() < 0.05, "kept {kept} is a count");
    // Binomial(16384, 0.75): standard deviation ≈ 55; allow 5.
    assert!(
        (kept - 0.75 * numel).abs() < 280.0,
        "kept {kept} of {numel}"
    );
    let g = safetensor_f64(&grads.join("grads.safetensors"), "w");
    let per_column: Vec<f64> = g.iter().map(|v| v * numel / (2.0 * scale2)).collect();
    for c in &per_column {
        assert!((c - c.round()).abs() < 0.05, "column count {c}");
    }
    let backward_kept: f64 = per_column.iter().map(|c| c.round()).sum();
    assert_eq!(
        backward_kept,
        kept.round(),
        "the backward drops what the forward dropped"
    );
}

/// Four steps straight and two plus a resume of two give byte-identical weights with dropout
/// live, and another `--seed` other weights.
#[test]
fn dropout_masks_are_the_same_after_a_resume() {
    let dir = TestDir::new("train-mode-resume");
    let (source, data) = drop_setup(&dir);
    let run = |out: &Path, steps: &str, extra: &[&str]| {
        let mut args = vec![
            "train",
            s(&source),
            "--data",
            s(&data),
            "--steps",
            steps,
            "--output-dir",
            s(out),
        ];
        args.extend_from_slice(extra);
        let (code, stdout, stderr) = mslc(&args);
        assert_eq!(code, 0, "mslc train:\n{stdout}\n{stderr}");
    };
    let (straight, split, other) = (dir.path("a"), dir.path("b"), dir.path("c"));
    run(&straight, "4", &["--init-seed", "1", "--seed", "9"]);
    run(&split, "2", &["--init-seed", "1", "--seed", "9"]);
    run(&split, "4", &["--resume", s(&split.join("step-2"))]);
    run(&other, "4", &["--init-seed", "1", "--seed", "10"]);
    let bytes = |d: &Path| std::fs::read(d.join("step-4/model.safetensors")).unwrap();
    assert_eq!(bytes(&straight), bytes(&split));
    assert_ne!(bytes(&straight), bytes(&other), "the seed picks the masks");
}

#[test]
fn batch_norm_without_buffers_cannot_train() {
    let dir = TestDir::new("train-mode-bn-bad");
    let source = "model M {\n    dims B = 4\n    input x: f32[B, 3, 2, 2]\n    param w: [3] ~ ones\n    output y = reshape(batch_norm(x, w * 0.0, w), [B, 12])\n}\ntrain T for M {\n    labels: i32[B]\n    loss = cross_entropy(y, labels)\n    optimizer = sgd(lr: 0.1)\n    batch = 4\n}\n";
    assert_eq!(refusal_codes(&dir, source), ["E0650"]);
}

/// `mslc build --entry TRAIN` compiles the step `mslc train` runs: one micro-batch of
/// `batch / grad_accum` samples (6 here, the model's default `B = 1` not withstanding), the
/// running statistics as outputs named by their buffers; and with dropout, the seed input.
#[test]
fn a_built_training_step_is_in_training_mode() {
    let dir = TestDir::new("train-mode-build");
    let inspect = |name: &str, source: &str| {
        let path = dir.path(name);
        std::fs::write(&path, source).unwrap();
        let out = dir.path(&format!("{name}.out"));
        let (code, stdout, stderr) = mslc(&["build", s(&path), "--entry", "Fit", "-o", s(&out)]);
        assert_eq!(code, 0, "mslc build:\n{stdout}\n{stderr}");
        let (code, stdout, stderr) = mslc(&["inspect", s(&out.join("Fit.mir"))]);
        assert_eq!(code, 0, "mslc inspect:\n{stdout}\n{stderr}");
        stdout
    };
    let bn = inspect("convnet.msl", BN_SOURCE);
    assert!(bn.contains("input \"images\" : f32[6,2,5,5]"), "{bn}");
    for name in ["bn.running_mean", "bn.running_var"] {
        assert!(bn.contains(&format!("output {name} = ")), "{bn}");
    }
    assert!(!bn.contains("train.seed"), "{bn}");
    let drop = inspect("drop.msl", DROP_SOURCE);
    assert!(drop.contains("input \"train.seed\" : i64[]"), "{drop}");
}
