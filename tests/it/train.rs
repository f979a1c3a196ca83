//! `mslc train` on examples/mlp.msl (shrunk with `--set`/`--dim`): every step's loss, the first
//! step's gradients and the final weights against an independent float64 NumPy training
//! (tests/reference/mlp_train_ref.py) for SGD with Nesterov momentum, Adam and AdamW with
//! clipping, a warm-up-cosine schedule and `no_decay`; exact resumption; checkpoints that a
//! kill -9 cannot leave half-written; each bad input as a coded error; and the whole-model
//! gradients of tiny_llama against JAX (tests/reference/llama_grad_ref.py).

use std::path::{Path, PathBuf};

use mslc_io::npy::{read_npy, write_npy, NpyArray};
use mslc_io::safetensors::{write_safetensors, SafetensorsFile, StDType, TensorRef};

use crate::exec::common::{
    compile_sized, have_numpy, have_python_module, mslc, random_weights, root, s, write_weights,
    Rng, TestDir,
};

/// The mlp's sizes here: 12 inputs, two hidden layers of 8, 10 classes, batches of 4.
const SETS: [&str; 6] = ["--set", "inputs=12", "--set", "hidden=8", "--dim", "B=4"];
const INPUTS: usize = 12;
const HIDDEN: usize = 8;
const CLASSES: usize = 10;
const SAMPLES: usize = 26;

/// examples/mlp.msl's model with `train` as its only train declaration.
fn mlp_source(dir: &TestDir, train: &str) -> PathBuf {
    let source = std::fs::read_to_string(root().join("examples/mlp.msl")).unwrap();
    let model_end = source.find("// bf16 keeps").expect("the model part");
    let path = dir.path("mlp_train.msl");
    std::fs::write(&path, format!("{}\n{train}\n", &source[..model_end])).unwrap();
    path
}

/// A train of the mlp with `fields` (optimizer and the rest) filled in.
fn train_decl(fields: &str) -> String {
    format!("train Fit for Mlp {{\n    labels: i32[B]\n    loss = cross_entropy(logits, labels)\n    batch = 4\n    {fields}\n}}")
}

/// The mlp's parameter paths and shapes.
fn param_shapes() -> Vec<(String, Vec<usize>)> {
    vec![
        ("layers.0.weight".into(), vec![HIDDEN, INPUTS]),
        ("layers.0.bias".into(), vec![HIDDEN]),
        ("layers.1.weight".into(), vec![HIDDEN, HIDDEN]),
        ("layers.1.bias".into(), vec![HIDDEN]),
        ("head.weight".into(), vec![CLASSES, HIDDEN]),
        ("head.bias".into(), vec![CLASSES]),
    ]
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Random weights, data (images.npy, labels.npy) in `dir`; returns the weights' path.
fn write_inputs(dir: &TestDir) -> PathBuf {
    let mut rng = Rng(11);
    let weights: Vec<(String, Vec<usize>, Vec<u8>)> = param_shapes()
        .into_iter()
        .map(|(n, shape)| {
            let values = rng.vec(shape.iter().product(), -0.5, 0.5);
            (n, shape, f32_bytes(&values))
        })
        .collect();
    let tensors: Vec<TensorRef> = weights
        .iter()
        .map(|(name, shape, data)| TensorRef {
            name,
            dtype: StDType::F32,
            shape,
            data,
        })
        .collect();
    let path = dir.path("w.safetensors");
    write_safetensors(&path, &tensors).unwrap();
    let data = dir.path("data");
    std::fs::create_dir_all(&data).unwrap();
    let images = rng.vec(SAMPLES * INPUTS, -2.0, 2.0);
    write_npy(
        data.join("images.npy"),
        &NpyArray::from_f32(vec![SAMPLES, INPUTS], &images).unwrap(),
    )
    .unwrap();
    let labels: Vec<i64> = rng
        .vec(SAMPLES, 0.0, CLASSES as f32)
        .iter()
        .map(|&x| x as i64)
        .collect();
    write_npy(
        data.join("labels.npy"),
        &NpyArray::from_i64(vec![SAMPLES], &labels).unwrap(),
    )
    .unwrap();
    path
}

/// Runs `mslc train` on `source` with the shrunk sizes and `extra` flags.
fn train(source: &Path, extra: &[&str]) -> (i32, String, String) {
    let mut args = vec!["train", s(source)];
    args.extend_from_slice(&SETS);
    args.extend_from_slice(extra);
    mslc(&args)
}

/// ‖got − want‖∞ ≤ tol · ‖want‖∞ (the measure tests/mpi_train.rs shares).
pub(crate) use crate::tolerance::assert_rel_to_max as assert_rel;

/// The `loss` of every line of a `--metrics` file, in order.
pub(crate) fn metric_losses(path: &Path) -> Vec<f64> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["loss"]
                .as_f64()
                .unwrap()
        })
        .collect()
}

/// Writes `source` to a file and trains it on no data: the codes it is refused with.
pub(crate) fn refusal_codes(dir: &TestDir, source: &str) -> Vec<String> {
    let path = dir.path("refused.msl");
    std::fs::write(&path, source).unwrap();
    let args = ["--message-format", "json", "train", s(&path)];
    let (code, stdout, stderr) =
        mslc(&[&args[..], &["--init-seed", "0", "--data", s(&dir.0)]].concat());
    assert_eq!(code, 1, "{stdout}{stderr}");
    error_codes(&stderr, &stdout)
}

/// Runs tests/reference/llama_grad_ref.py for examples/tiny_llama.msl's 2-layer model on
/// `weights` and `tokens` into `out`, with `extra` arguments (the AdamW steps).
fn llama_reference(weights: &Path, tokens: &Path, out: &Path, extra: &[&str]) {
    let status = std::process::Command::new("python3")
        .arg(root().join("tests/reference/llama_grad_ref.py"))
        .args([s(weights), s(tokens), s(out)])
        .args([
            "--layers",
            "2",
            "--heads",
            "4",
            "--kv-heads",
            "4",
            "--eps",
            "1e-6",
        ])
        .args(extra)
        .status()
        .expect("python3 runs");
    assert!(status.success(), "the JAX reference failed");
}

pub(crate) fn npy_f64(path: &Path) -> Vec<f64> {
    let array = read_npy(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    array.to_f32().unwrap().into_iter().map(f64::from).collect()
}

pub(crate) fn safetensor_f64(path: &Path, name: &str) -> Vec<f64> {
    let file = SafetensorsFile::open(path).unwrap();
    let t = file.tensor(name).unwrap();
    t.to_f32().unwrap().into_iter().map(f64::from).collect()
}

/// Trains 6 steps with `fields` and `ref_args`, and compares with the NumPy reference.
fn matches_reference(tag: &str, fields: &str, ref_args: &[&str]) {
    matches_reference_with(tag, &train_decl(fields), &SETS, ref_args)
}

/// [`matches_reference`] for the train declaration `decl` compiled with `sets`.
fn matches_reference_with(tag: &str, decl: &str, sets: &[&str], ref_args: &[&str]) {
    if !have_numpy() {
        eprintln!("note: python3 with numpy is not available; skipping the {tag} comparison");
        return;
    }
    let dir = TestDir::new(&format!("train-{tag}"));
    let weights = write_inputs(&dir);
    let source = mlp_source(&dir, decl);
    let (out, grads, metrics) = (dir.path("out"), dir.path("grads"), dir.path("m.jsonl"));
    let mut args = vec!["train", s(&source)];
    args.extend_from_slice(sets);
    let (code, stdout, stderr) = mslc(
        &[
            args.as_slice(),
            &[
                "--weights",
                s(&weights),
                "--data",
                s(&dir.path("data")),
                "--steps",
                "6",
                "--output-dir",
                s(&out),
                "--dump-grads",
                s(&grads),
                "--metrics",
                s(&metrics),
            ],
        ]
        .concat(),
    );
    assert_eq!(code, 0, "mslc train failed:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains("the last 2 of each epoch are dropped"),
        "{stdout}"
    );
    let reference = dir.path("ref");
    let mut args = vec![
        root()
            .join("tests/reference/mlp_train_ref.py")
            .display()
            .to_string(),
        s(&weights).to_string(),
        s(&dir.path("data")).to_string(),
        s(&reference).to_string(),
    ];
    args.extend(
        ["--depth", "2", "--batch", "4", "--steps", "6"]
            .iter()
            .chain(ref_args)
            .map(|a| a.to_string()),
    );
    let status = std::process::Command::new("python3")
        .args(&args)
        .status()
        .expect("python3 runs");
    assert!(status.success(), "the reference failed");
    let lines = std::fs::read_to_string(&metrics).unwrap();
    let losses: Vec<f64> = lines
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            for key in [
                "step",
                "loss",
                "lr",
                "loss_scale",
                "grad_norm",
                "skipped",
                "ms",
            ] {
                assert!(v.get(key).is_some(), "metrics line without `{key}`: {l}");
            }
            v["loss"].as_f64().unwrap()
        })
        .collect();
    let want = npy_f64(&reference.join("losses.npy"));
    for (k, (g, w)) in losses.iter().zip(&want).enumerate() {
        assert_rel(
            &format!("{tag}: loss of step {}", k + 1),
            &[*g],
            &[*w],
            1e-4,
        );
    }
    assert_eq!(losses.len(), 6);
    let loss0 = npy_f64(&grads.join("loss.npy"));
    assert_rel(&format!("{tag}: dumped loss"), &loss0, &want[..1], 1e-4);
    for (name, _) in param_shapes() {
        let got = safetensor_f64(&grads.join("grads.safetensors"), &name);
        let want = npy_f64(&reference.join("grads").join(format!("{name}.npy")));
        assert_rel(&format!("{tag}: gradient of {name}"), &got, &want, 1e-4);
        let got = safetensor_f64(&out.join("step-6/model.safetensors"), &name);
        let want = npy_f64(&reference.join("final").join(format!("{name}.npy")));
        assert_rel(&format!("{tag}: final {name}"), &got, &want, 1e-4);
    }
}

#[test]
fn sgd_with_nesterov_momentum_matches_torch_semantics() {
    matches_reference(
        "sgd",
        "optimizer = sgd(lr: 0.1, momentum: 0.9, nesterov: true, weight_decay: 0.01)",
        &[
            "--optimizer",
            "sgd",
            "--lr",
            "0.1",
            "--momentum",
            "0.9",
            "--nesterov",
            "--weight-decay",
            "0.01",
        ],
    );
}

#[test]
fn adam_matches_torch_semantics() {
    matches_reference(
        "adam",
        "optimizer = adam(lr: 0.01, weight_decay: 0.01)",
        &[
            "--optimizer",
            "adam",
            "--lr",
            "0.01",
            "--weight-decay",
            "0.01",
        ],
    );
}

#[test]
fn adamw_with_clipping_schedule_and_no_decay_matches_torch_semantics() {
    matches_reference(
        "adamw",
        "optimizer = adamw(lr: 0.02, betas: (0.8, 0.95), weight_decay: 0.1)
    schedule = warmup_cosine(warmup: 2, total: 5, min_lr: 0.002)
    clip_grad_norm = 0.5
    no_decay = [\"**.bias\"]",
        &[
            "--optimizer",
            "adamw",
            "--lr",
            "0.02",
            "--betas",
            "0.8",
            "0.95",
            "--weight-decay",
            "0.1",
            "--no-decay-bias",
            "--clip",
            "0.5",
            "--schedule",
            "warmup_cosine",
            "--warmup",
            "2",
            "--total",
            "5",
            "--min-lr",
            "0.002",
        ],
    );
}

/// `grad_accum = 2` with `batch = 8` and no `--dim B`: micro-batches of 4 samples, against
/// the reference's PyTorch accumulation recipe (the gradients of `loss / 2` of two batches of
/// 4 summed, clipped and applied once).
#[test]
fn gradient_accumulation_matches_the_torch_recipe() {
    let decl = "train Fit for Mlp {\n    labels: i32[B]\n    loss = cross_entropy(logits, labels)\n    batch = 8, grad_accum = 2\n    optimizer = adamw(lr: 0.02, weight_decay: 0.1)\n    clip_grad_norm = 0.5\n}";
    matches_reference_with(
        "accum",
        decl,
        &SETS[..4],
        &[
            "--optimizer",
            "adamw",
            "--lr",
            "0.02",
            "--weight-decay",
            "0.1",
            "--clip",
            "0.5",
            "--grad-accum",
            "2",
        ],
    );
}

#[test]
fn a_batch_that_grad_accum_does_not_divide_is_refused() {
    let dir = TestDir::new("train-accum-bad");
    let weights = write_inputs(&dir);
    let decl = "train Fit for Mlp {\n    labels: i32[B]\n    loss = cross_entropy(logits, labels)\n    batch = 10, grad_accum = 4\n    optimizer = sgd(lr: 0.1)\n}";
    let source = mlp_source(&dir, decl);
    let (code, stdout, stderr) = mslc(&[
        "--message-format",
        "json",
        "train",
        s(&source),
        "--weights",
        s(&weights),
        "--data",
        s(&dir.path("data")),
    ]);
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert_eq!(error_codes(&stderr, &stdout), ["E0651"]);
}

/// `--dim B=4` under `batch = 8` (grad_accum 1): each update takes 4 samples, not 8. Training
/// and building say so (W0015, exit status 0), and the built train's plan counts the one
/// micro-batch of 4 the steps run — the same step as `batch = 4`'s — not two.
#[test]
fn a_batch_dim_from_dim_that_disagrees_with_batch_is_warned_and_planned_as_run() {
    let dir = TestDir::new("train-dim-batch");
    let weights = write_inputs(&dir);
    let decl = |batch: u32| {
        format!(
            "memory Host {{\n    max_device_memory = 1GB\n}}\n\ntrain Fit for Mlp {{\n    \
             labels: i32[B]\n    loss = cross_entropy(logits, labels)\n    batch = {batch}\n    \
             optimizer = sgd(lr: 0.1)\n    memory = Host\n    target = std.targets.cpu\n}}"
        )
    };
    let source = mlp_source(&dir, &decl(8));
    let data = dir.path("data");
    let mut args = vec!["--message-format", "json", "train", s(&source)];
    args.extend(SETS);
    args.extend(["--weights", s(&weights), "--data", s(&data)]);
    let (code, stdout, stderr) = mslc(&args);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert_eq!(error_codes(&stderr, &stdout), ["W0015"]);
    let plan = |batch: u32| {
        let source = dir.path(&format!("batch{batch}.msl"));
        std::fs::copy(mlp_source(&dir, &decl(batch)), &source).unwrap();
        let out = dir.path(&format!("build{batch}"));
        let mut args = vec!["--message-format", "json", "build", s(&source)];
        args.extend(SETS);
        args.extend(["--entry", "Fit", "-o", s(&out)]);
        let (code, stdout, stderr) = mslc(&args);
        assert_eq!(code, 0, "{stdout}{stderr}");
        let text = std::fs::read_to_string(out.join("Fit.plan.json")).unwrap();
        let plan: serde_json::Value = serde_json::from_str(&text).unwrap();
        (
            error_codes(&stderr, &stdout),
            plan["micro_batches"].clone(),
            plan["step_time_s"].clone(),
        )
    };
    let (warned, micro_batches, step) = plan(8);
    assert_eq!(warned, ["W0015"]);
    let (consistent, micro_batches_of_4, step_of_4) = plan(4);
    assert!(consistent.is_empty(), "{consistent:?}");
    assert_eq!((micro_batches, step), (micro_batches_of_4, step_of_4));
}

/// The same under `--ranks 2` of a data-parallel train: `--dim B=4` with 2 replicas takes 8
/// samples per update, not `batch = 16`; training says so, naming the replicas, and trains.
#[test]
fn a_batch_dim_from_dim_that_disagrees_with_batch_is_warned_on_ranks() {
    let dir = TestDir::new("train-dim-batch-ranks");
    let weights = write_inputs(&dir);
    let decl =
        "parallel Data {\n    mesh = { dp: 2 }\n    mode = data\n}\n\ntrain Fit for Mlp {\n    \
                labels: i32[B]\n    loss = cross_entropy(logits, labels)\n    batch = 16\n    \
                optimizer = sgd(lr: 0.1)\n    parallel = Data\n    target = std.targets.cpu\n}";
    let source = mlp_source(&dir, decl);
    let data = dir.path("data");
    let mut args = vec!["--message-format", "json", "train", s(&source)];
    args.extend(SETS);
    args.extend(["--weights", s(&weights), "--data", s(&data), "--ranks", "2"]);
    let (code, stdout, stderr) = mslc(&args);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert_eq!(error_codes(&stderr, &stdout), ["W0015"]);
    let said = format!("{stdout}{stderr}");
    assert!(
        said.contains("× 2 replicas") && said.contains("= 8 samples"),
        "{said}"
    );
}

const ADAMW: &str = "optimizer = adamw(lr: 0.01)";

#[test]
fn resuming_gives_byte_identical_weights() {
    let dir = TestDir::new("train-resume");
    let weights = write_inputs(&dir);
    let source = mlp_source(&dir, &train_decl(ADAMW));
    let data = dir.path("data");
    let run = |out: &Path, steps: &str, resume: Option<&Path>| {
        let mut args = vec![
            "--weights",
            s(&weights),
            "--data",
            s(&data),
            "--shuffle",
            "7",
            "--steps",
            steps,
            "--output-dir",
            s(out),
            "--threads",
            "2",
        ];
        if let Some(r) = resume {
            args.extend(["--resume", s(r)]);
        }
        let (code, stdout, stderr) = train(&source, &args);
        assert_eq!(code, 0, "{stdout}\n{stderr}");
    };
    let (straight, halves) = (dir.path("straight"), dir.path("halves"));
    run(&straight, "10", None);
    run(&halves, "5", None);
    run(&halves, "10", Some(&halves.join("step-5")));
    for file in ["model.safetensors", "optimizer.safetensors"] {
        let a = std::fs::read(straight.join("step-10").join(file)).unwrap();
        let b = std::fs::read(halves.join("step-10").join(file)).unwrap();
        assert!(a == b, "{file} differs after a resume");
    }
    let state = std::fs::read_to_string(halves.join("step-10/state.json")).unwrap();
    assert!(state.contains("\"step\": 10"), "{state}");
}

/// A checkpoint whose optimizer states are stored as f16 (set from their stored bytes) or as
/// bf16 (which `.npy` has no type for: through f32) resumes exactly as the same values stored
/// as f32: the next step's weights are byte for byte the same.
#[test]
fn optimizer_states_stored_as_half_floats_resume_as_their_f32_values() {
    let dir = TestDir::new("train-resume-half");
    let weights = write_inputs(&dir);
    let source = mlp_source(&dir, &train_decl(ADAMW));
    let data = dir.path("data");
    let run = |out: &Path, steps: &str, resume: Option<&Path>| {
        let mut args = vec!["--data", s(&data), "--steps", steps, "--output-dir", s(out)];
        match resume {
            Some(r) => args.extend(["--resume", s(r)]),
            None => args.extend(["--weights", s(&weights)]),
        }
        let (code, stdout, stderr) = train(&source, &args);
        assert_eq!(code, 0, "{stdout}\n{stderr}");
    };
    let first = dir.path("first");
    run(&first, "2", None);
    let step = first.join("step-2");
    let optim = SafetensorsFile::open(step.join("optimizer.safetensors")).unwrap();
    // Each state rounded through `round`, written as `dtype` (its bytes by `bytes`) and as f32.
    let variant = |tag: &str, dtype: StDType, round: fn(f32) -> f32, bytes: fn(f32) -> [u8; 2]| {
        let values: Vec<Vec<f32>> = optim
            .tensors()
            .map(|t| t.to_f32().unwrap().into_iter().map(round).collect())
            .collect();
        let stored: Vec<Vec<u8>> = values
            .iter()
            .map(|v| v.iter().flat_map(|&x| bytes(x)).collect())
            .collect();
        let as_f32: Vec<Vec<u8>> = values
            .iter()
            .map(|v| v.iter().flat_map(|x| x.to_le_bytes()).collect())
            .collect();
        let mut resumed = Vec::new();
        for (name, dtype, data) in [(tag, dtype, &stored), ("f32", StDType::F32, &as_f32)] {
            let ck = dir.path(&format!("{tag}-{name}-ck"));
            std::fs::create_dir_all(&ck).unwrap();
            for f in ["model.safetensors", "state.json"] {
                std::fs::copy(step.join(f), ck.join(f)).unwrap();
            }
            let tensors: Vec<TensorRef> = optim
                .tensors()
                .zip(data)
                .map(|(t, d)| TensorRef {
                    dtype,
                    data: d,
                    ..t
                })
                .collect();
            write_safetensors(ck.join("optimizer.safetensors"), &tensors).unwrap();
            let out = dir.path(&format!("{tag}-{name}-out"));
            run(&out, "3", Some(&ck));
            resumed.push(std::fs::read(out.join("step-3/model.safetensors")).unwrap());
        }
        assert!(
            resumed[0] == resumed[1],
            "{tag} states resume unlike their f32 values"
        );
    };
    variant(
        "f16",
        StDType::F16,
        |x| half::f16::from_f32(x).to_f32(),
        |x| half::f16::from_f32(x).to_le_bytes(),
    );
    variant(
        "bf16",
        StDType::BF16,
        |x| half::bf16::from_f32(x).to_f32(),
        |x| half::bf16::from_f32(x).to_le_bytes(),
    );
}

#[test]
fn a_kill_during_saving_leaves_every_checkpoint_loadable() {
    let dir = TestDir::new("train-kill");
    let weights = write_inputs(&dir);
    let source = mlp_source(&dir, &train_decl(ADAMW));
    let (out, data) = (dir.path("out"), dir.path("data"));
    let mut args: Vec<&str> = vec!["train", s(&source)];
    args.extend_from_slice(&SETS);
    args.extend([
        "--weights",
        s(&weights),
        "--data",
        s(&data),
        "--steps",
        "1000000",
        "--save-every",
        "1",
        "--output-dir",
        s(&out),
    ]);
    let mut child = crate::support::mslc_command(&args)
        .current_dir(root())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Let it save a few checkpoints, then kill it (SIGKILL) wherever it is.
    let start = std::time::Instant::now();
    while std::fs::read_dir(&out).map_or(0, |d| d.count()) < 4 {
        assert!(start.elapsed().as_secs() < 120, "no checkpoints written");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let steps = crate::checkpoints::checkpoints(&out);
    let last = *steps.last().expect("a complete checkpoint");
    for k in &steps {
        for file in ["model.safetensors", "optimizer.safetensors", "state.json"] {
            assert!(
                out.join(format!("step-{k}")).join(file).is_file(),
                "step-{k}/{file}"
            );
        }
    }
    let resume = out.join(format!("step-{last}"));
    let next = (last + 1).to_string();
    let (code, stdout, stderr) = train(
        &source,
        &[
            "--data",
            s(&dir.path("data")),
            "--resume",
            s(&resume),
            "--steps",
            &next,
        ],
    );
    assert_eq!(
        code, 0,
        "the last checkpoint does not load:\n{stdout}\n{stderr}"
    );
}

/// The codes of `mslc train`'s errors, from its JSON diagnostics.
pub(crate) fn error_codes(stderr: &str, stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .chain(stderr.lines())
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v.get("code").and_then(|c| c.as_str()).map(str::to_string))
        .collect()
}

#[test]
fn bad_input_is_a_coded_error_naming_the_file() {
    let dir = TestDir::new("train-bad");
    let weights = write_inputs(&dir);
    let source = mlp_source(&dir, &train_decl(ADAMW));
    let data = dir.path("data");
    let out = dir.path("out");
    let run = |data: &Path, extra: &[&str]| {
        let mut args = vec![
            "--message-format",
            "json",
            "--weights",
            s(&weights),
            "--data",
            s(data),
            "--output-dir",
            s(&out),
        ];
        args.extend_from_slice(extra);
        let (code, stdout, stderr) = train(&source, &args);
        (
            code,
            error_codes(&stderr, &stdout),
            format!("{stdout}{stderr}"),
        )
    };
    let bad = |name: &str, array: NpyArray| {
        let d = dir.path(name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::copy(data.join("images.npy"), d.join("images.npy")).unwrap();
        std::fs::copy(data.join("labels.npy"), d.join("labels.npy")).unwrap();
        let file = if array.shape().len() == 1 {
            "labels.npy"
        } else {
            "images.npy"
        };
        write_npy(d.join(file), &array).unwrap();
        d
    };
    let wide = bad(
        "wide",
        NpyArray::from_f32(vec![8, 13], &[0.0; 104]).unwrap(),
    );
    let float_labels = bad(
        "float_labels",
        NpyArray::from_f32(vec![SAMPLES], &[1.0; SAMPLES]).unwrap(),
    );
    let mut labels = vec![1i64; SAMPLES];
    labels[5] = CLASSES as i64;
    let out_of_range = bad("range", NpyArray::from_i64(vec![SAMPLES], &labels).unwrap());
    for (d, needle) in [
        (&wide, "images.npy"),
        (&float_labels, "labels.npy"),
        (&out_of_range, "label 10"),
    ] {
        let (code, codes, text) = run(d, &["--steps", "2"]);
        assert_eq!((code, codes), (1, vec!["E0630".to_string()]), "{text}");
        assert!(text.contains(needle), "{text}");
    }
    assert!(!out.exists(), "nothing is written for refused data");
    // A good run, then corrupt and mismatched checkpoints.
    let (code, _, text) = run(&data, &["--steps", "2"]);
    assert_eq!(code, 0, "{text}");
    let step = out.join("step-2");
    // An optimizer state of another shape: refused, naming it (the states are checked one at a
    // time before anything is loaded).
    let other = dir.path("other-state");
    std::fs::create_dir_all(&other).unwrap();
    for f in ["model.safetensors", "state.json"] {
        std::fs::copy(step.join(f), other.join(f)).unwrap();
    }
    let optim = SafetensorsFile::open(step.join("optimizer.safetensors")).unwrap();
    let first = optim.tensors().next().unwrap().name.to_string();
    let shapes: Vec<Vec<usize>> = optim
        .tensors()
        .map(|t| match t.name == first {
            true => vec![t.len() - 1],
            false => t.shape.to_vec(),
        })
        .collect();
    let tensors: Vec<TensorRef> = optim
        .tensors()
        .zip(&shapes)
        .map(|(t, shape)| TensorRef {
            name: t.name,
            dtype: t.dtype,
            shape,
            data: &t.data[..shape.iter().product::<usize>() * t.dtype.size()],
        })
        .collect();
    write_safetensors(other.join("optimizer.safetensors"), &tensors).unwrap();
    let (code, codes, text) = run(&data, &["--resume", s(&other), "--steps", "3"]);
    assert_eq!((code, codes), (1, vec!["E0631".to_string()]), "{text}");
    assert!(
        text.contains(&format!("optimizer state `{first}`")),
        "{text}"
    );
    assert!(!out.join("step-3").exists());
    // An optimizer state stored as integers: refused before anything is loaded, naming it.
    let ints: Vec<TensorRef> = optim
        .tensors()
        .map(|t| match t.name == first {
            true => TensorRef {
                dtype: StDType::I32,
                ..t
            },
            false => t,
        })
        .collect();
    write_safetensors(other.join("optimizer.safetensors"), &ints).unwrap();
    let (code, codes, text) = run(&data, &["--resume", s(&other), "--steps", "3"]);
    assert_eq!((code, codes), (1, vec!["E0631".to_string()]), "{text}");
    assert!(
        text.contains(&format!(
            "optimizer state `{first}` is stored as I32, not floats"
        )),
        "{text}"
    );
    assert!(!out.join("step-3").exists());
    let model = std::fs::read(step.join("model.safetensors")).unwrap();
    std::fs::write(
        step.join("optimizer.safetensors"),
        b"not a safetensors file",
    )
    .unwrap();
    let (code, codes, text) = run(&data, &["--resume", s(&step), "--steps", "3"]);
    assert_eq!((code, codes), (1, vec!["E0631".to_string()]), "{text}");
    assert!(text.contains("step-2"), "{text}");
    assert!(!out.join("step-3").exists());
    assert_eq!(
        std::fs::read(step.join("model.safetensors")).unwrap(),
        model
    );
    let sgd = mlp_source(&dir, &train_decl("optimizer = sgd(lr: 0.1, momentum: 0.9)"));
    let (code, stdout, stderr) = train(
        &sgd,
        &[
            "--message-format",
            "json",
            "--data",
            s(&data),
            "--resume",
            s(&step),
            "--steps",
            "3",
        ],
    );
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert_eq!(error_codes(&stderr, &stdout), ["E0631"]);
}

/// `mslc run` of a built training step, without data, runs it as the step before the first
/// update: Adam's states seeded with zeros, its learning rate and step size with 0, its bias
/// correction and loss scale with 1, so the whole step runs (under the dynamic loss scale too,
/// which does not skip it), every output is finite — written under the dotted paths training
/// modules name them by — and the parameters stay as they were. Seeded from N(0, 1) as
/// before, the second moments are negative and the update NaN.
#[test]
fn a_training_step_run_on_seeded_inputs_updates_as_before_the_first_update() {
    let dir = TestDir::new("train_run_seeded");
    let source = std::fs::read_to_string(root().join("examples/mlp.msl")).unwrap();
    let model_end = source.find("// bf16 keeps").expect("the model part");
    let path = dir.path("mlp_run.msl");
    std::fs::write(
        &path,
        format!(
            "{}\nprecision Scaled {{\n    level = O1\n    compute = bf16\n    \
             loss_scale = dynamic(init: 65536)\n}}\n{}\n",
            &source[..model_end],
            train_decl("optimizer = adam(lr: 1e-3)\n    precision = Scaled")
        ),
    )
    .unwrap();
    let built = dir.path("built");
    let mut args = vec!["build", s(&path), "--entry", "Fit", "-o", s(&built)];
    args.extend_from_slice(&SETS);
    let (code, stdout, stderr) = mslc(&args);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let out = dir.path("out");
    let mir = built.join("Fit.mir");
    let (code, stdout, stderr) =
        mslc(&["run", s(&mir), "--init-seed", "3", "--output-dir", s(&out)]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    for line in [
        "head.weight.exp_avg_sq not given: seeded zeros (state the step carries",
        "train.lr not given: seeded 0 (the update leaves the parameters as they are)",
        "train.step_size not given: seeded 0 (the update leaves the parameters as they are)",
        "train.bias_correction2_sqrt not given: seeded 1 (a float scalar)",
        "train.loss_scale not given: seeded 1 (a float scalar)",
        "labels not given: seeded ids in [0, 10)",
        "ms per training step (median",
    ] {
        assert!(stdout.contains(line), "{line:?} not in:\n{stdout}");
    }
    assert!(!stderr.contains("W0003"), "{stderr}");
    let read = |name: &str| {
        read_npy(out.join(format!("{name}.npy")))
            .unwrap()
            .to_f32()
            .unwrap()
    };
    assert_eq!(read("overflow"), [0.0]);
    for name in ["loss", "grad_norm", "head.weight", "head.weight.exp_avg_sq"] {
        let values = read(name);
        assert!(values.iter().all(|v| v.is_finite()), "{name}: {values:?}");
    }
    // The update ran: the second moments hold squared gradients; with no step, the new
    // parameters are the seeded ones.
    assert!(read("head.weight.exp_avg_sq").iter().any(|&v| v > 0.0));
    let bytes = mslc_artifact::read_mir(&mir).unwrap();
    let module = mslc_artifact::decode(&bytes).unwrap().module;
    let mut exec = mslc_exec::Executor::new(module, &Default::default()).unwrap();
    exec.init_params(3);
    for input in exec.unset_inputs() {
        exec.seed_input(&input, 3).unwrap();
    }
    exec.run().unwrap();
    for (path, _, before) in exec.params_f32() {
        assert_eq!(exec.output_f32(&path).unwrap().1, before, "{path}");
    }
}

/// `mslc tune` confirms a training step's kernel decisions on a run seeded as above: tiny
/// LLaMA's AdamW step with its GEMMs blocked otherwise sums in another order, and its outputs
/// stay within the rounding the comparison allows. With a learning rate of 1, Adam's first
/// update (`lr · sign(g)` where a gradient is far above `eps`) turns that rounding, on
/// gradients near `eps`, into differences of the whole step (`value 51804 is -0.13326173, the
/// reference kernel gives -0.13441464`), and every decision was rejected. A candidate that
/// computes something else is rejected, and the report still gives the default's time (it
/// said 0 ms when no candidate was timed).
#[test]
fn a_training_steps_kernel_decisions_are_confirmed_on_its_seeded_run() {
    let dir = TestDir::new("train_confirm_seeded");
    let source = std::fs::read_to_string(root().join("examples/tiny_llama.msl")).unwrap();
    let model_end = source.find("// f16 has a narrow").expect("the model part");
    let path = dir.path("llama_fit.msl");
    let train = "train Fit for TinyLlama {\n    labels: i32[B, S]\n    \
                 loss = cross_entropy(logits, labels)\n    \
                 optimizer = adamw(lr: 1e-4, betas: (0.9, 0.95), weight_decay: 0.1)\n    \
                 batch = 4\n}\n";
    std::fs::write(&path, format!("{}\n{train}", &source[..model_end])).unwrap();
    let built = dir.path("built");
    let sizes = ["--set", "layers=2", "--dim", "B=4", "--dim", "S=128"];
    let args = [
        &["build", s(&path), "--entry", "Fit", "-o", s(&built)][..],
        &sizes,
    ]
    .concat();
    let (code, stdout, stderr) = mslc(&args);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let bytes = mslc_artifact::read_mir(&built.join("Fit.mir")).unwrap();
    let module = mslc_artifact::decode(&bytes).unwrap().module;
    let mut blocked = module.clone();
    for step in &mut blocked.steps {
        if step.kernel.name == "gemm" {
            (step.kernel.params).insert("kc".into(), mslc_kernels::binding::KernelParam::Int(8));
        }
    }
    let candidate = mslc_tune::confirm::Candidate {
        kept: mslc_tune::confirm::Kept::All,
        module: blocked,
    };
    // A candidate that computes something else (a norm's `eps` changed) is rejected; the
    // default is timed all the same.
    let mut wrong = module.clone();
    let norm = (wrong.steps.iter_mut())
        .find(|step| step.attrs.get("eps").is_some())
        .expect("a norm");
    norm.attrs.insert("eps", 0.5);
    let wrong = mslc_tune::confirm::Candidate {
        kept: mslc_tune::confirm::Kept::Kernels,
        module: wrong,
    };
    let stop = std::sync::atomic::AtomicBool::new(false);
    let confirmed = mslc_tune::confirm::confirm(&module, &[candidate], 1, &stop).unwrap();
    assert_eq!(confirmed.tried[0].rejected, None);
    let refused = mslc_tune::confirm::confirm(&module, &[wrong], 1, &stop).unwrap();
    let why = refused.tried[0].rejected.as_deref().unwrap_or_default();
    assert!(why.starts_with("its outputs differ"), "{why:?}");
    assert_eq!(refused.kept, mslc_tune::confirm::Kept::None);
    assert!(refused.default_ms > 0.0 && refused.tuned_ms == refused.default_ms);
}

#[test]
fn a_train_without_trainable_parameters_is_refused() {
    let dir = TestDir::new("train-none");
    let source = "model Fixed {\n    dims B = 4\n    input x: f32[B, 8]\n    buffer w: [8, 2] ~ zeros\n    output y = matmul(x, w)\n}\ntrain T for Fixed {\n    labels: i32[B]\n    loss = cross_entropy(y, labels)\n    optimizer = sgd(lr: 0.1)\n    batch = 4\n}\n";
    assert_eq!(refusal_codes(&dir, source), ["E0520"]);
}

/// The whole-model gradients of tiny_llama (2 layers, S = 16, one batch of 8 sequences) after the first
/// step's backward, against JAX's float64 autodiff of the NumPy Hugging Face LLaMA forward
/// (tests/reference/llama_grad_ref.py), the same random weights and tokens: every parameter's
/// gradient within 1e-4 of the reference's largest magnitude, and the loss within 1e-5.
#[test]
fn tiny_llama_gradients_match_jax() {
    if !have_python_module("jax") {
        eprintln!("note: python3 with jax is not available; skipping the LLaMA gradient check");
        return;
    }
    let dir = TestDir::new("train-llama-grads");
    let (module, weights) = tiny_llama_weights(&dir);
    let mut rng = Rng(5);
    let ids: Vec<i64> = rng
        .vec(8 * 17, 0.0, 1000.0)
        .iter()
        .map(|&x| x as i64)
        .collect();
    let tokens = dir.path("tokens.npy");
    write_npy(&tokens, &NpyArray::from_i64(vec![8, 17], &ids).unwrap()).unwrap();
    let grads = dir.path("grads");
    let (code, out, err) = mslc(&[
        "train",
        s(&root().join("examples/tiny_llama.msl")),
        "--set",
        "layers=2",
        "--dim",
        "S=16",
        "--dim",
        "B=8",
        "--weights",
        s(&weights),
        "--data",
        s(&tokens),
        "--steps",
        "1",
        "--dump-grads",
        s(&grads),
        // The example's train names its O2 f16 policy; the reference is float64.
        "--precision",
        "f32",
    ]);
    assert_eq!(code, 0, "mslc train:\n{out}\n{err}");
    let reference = dir.path("ref.safetensors");
    llama_reference(&weights, &tokens, &reference, &[]);
    let got_loss = npy_f64(&grads.join("loss.npy"));
    assert_rel("loss", &got_loss, &safetensor_f64(&reference, "loss"), 1e-5);
    let mut checked = 0;
    for (path, _) in module.params() {
        let got = safetensor_f64(&grads.join("grads.safetensors"), path);
        assert_rel(path, &got, &safetensor_f64(&reference, path), 1e-4);
        checked += 1;
    }
    assert_eq!(checked, 2 * 9 + 3, "every parameter of the 2-layer model");
}

/// tiny_llama with 2 layers and S = 16, and random weights in `dir`.
fn tiny_llama_weights(dir: &TestDir) -> (mslc_artifact::Module, PathBuf) {
    let module = compile_sized(
        "examples/tiny_llama.msl",
        &[("layers", "2")],
        &[("S", "16")],
    );
    let weights = dir.path("w.safetensors");
    write_weights(&weights, &random_weights(&module, 7));
    (module, weights)
}

/// Twenty AdamW steps of tiny_llama (2 layers, S = 16) with the example's own train
/// (`adamw(lr: 1e-4, betas: (0.9, 0.95), weight_decay: 0.1)`, `batch = 8`, so steps of 8
/// sequences without `--dim B`) on a fixed synthetic dataset — 64 sequences of a next-token
/// rule, taken in order — against the JAX reference's float64 torch.optim.AdamW
/// (tests/reference/llama_grad_ref.py --steps): every step's loss within 1e-4 relative.
#[test]
fn tiny_llama_twenty_adamw_steps_match_jax() {
    if !have_python_module("jax") {
        eprintln!("note: python3 with jax is not available; skipping the LLaMA AdamW check");
        return;
    }
    let dir = TestDir::new("train-llama-adamw");
    let (_, weights) = tiny_llama_weights(&dir);
    let mut ids = Vec::new();
    for r in 0..64i64 {
        let mut t = (r * 37) % 1000;
        for _ in 0..17 {
            ids.push(t);
            t = (t * 7 + 3) % 1000;
        }
    }
    let tokens = dir.path("tokens.npy");
    write_npy(&tokens, &NpyArray::from_i64(vec![64, 17], &ids).unwrap()).unwrap();
    let metrics = dir.path("m.jsonl");
    let (code, out, err) = mslc(&[
        "train",
        s(&root().join("examples/tiny_llama.msl")),
        "--set",
        "layers=2",
        "--dim",
        "S=16",
        "--weights",
        s(&weights),
        "--data",
        s(&tokens),
        "--steps",
        "20",
        "--metrics",
        s(&metrics),
        "--precision",
        "f32",
    ]);
    assert_eq!(code, 0, "mslc train:\n{out}\n{err}");
    let reference = dir.path("ref.safetensors");
    let adamw = [
        "--steps",
        "20",
        "--batch",
        "8",
        "--lr",
        "1e-4",
        "--betas",
        "0.9",
        "0.95",
        "--weight-decay",
        "0.1",
        "--adam-eps",
        "1e-8",
    ];
    llama_reference(&weights, &tokens, &reference, &adamw);
    let losses = metric_losses(&metrics);
    let want = safetensor_f64(&reference, "losses");
    assert_eq!(losses.len(), 20);
    for (k, (g, w)) in losses.iter().zip(&want).enumerate() {
        assert_rel(&format!("loss of step {}", k + 1), &[*g], &[*w], 1e-4);
    }
    assert!(
        want[19] < want[0] - 1e-3,
        "the twenty steps learn something: {want:?}"
    );
}

/// The whole-model gradients of bert_base shrunk with `--set` (2 layers, hidden 16, 2 heads,
/// `p = 0`: eval-mode dropout) under the example's `Distill` loss, against JAX's float64
/// autodiff of the Hugging Face BertModel forward (tests/reference/bert_grad_ref.py): the loss
/// within 1e-5 and every gradient within 1e-4 relative — of the tensor's largest magnitude, or
/// of a thousandth of the model's largest gradient for the attention key biases, whose exact
/// gradient is zero (softmax ignores a shift shared by a query's scores), leaving f32 rounding.
#[test]
fn bert_base_gradients_match_jax() {
    if !have_python_module("jax") {
        eprintln!("note: python3 with jax is not available; skipping the BERT gradient check");
        return;
    }
    let dir = TestDir::new("train-bert-grads");
    let sets = [
        ("vocab", "50"),
        ("hidden", "16"),
        ("layers", "2"),
        ("heads", "2"),
        ("ffn", "32"),
        ("max_positions", "8"),
        ("p", "0"),
    ];
    let module = compile_sized("examples/bert_base.msl", &sets, &[("S", "8"), ("B", "4")]);
    let weights = dir.path("w.safetensors");
    write_weights(&weights, &random_weights(&module, 13));
    let data = dir.path("data");
    std::fs::create_dir_all(&data).unwrap();
    let mut rng = Rng(17);
    let mut ints = |name: &str, hi: f32| {
        let v: Vec<i64> = rng.vec(32, 0.0, hi).iter().map(|&x| x as i64).collect();
        write_npy(
            data.join(name),
            &NpyArray::from_i64(vec![4, 8], &v).unwrap(),
        )
        .unwrap();
    };
    ints("input_ids.npy", 50.0);
    ints("token_type_ids.npy", 2.0);
    let teacher = rng.vec(4 * 8 * 16, -1.0, 1.0);
    write_npy(
        data.join("teacher.npy"),
        &NpyArray::from_f32(vec![4, 8, 16], &teacher).unwrap(),
    )
    .unwrap();
    let pooled = rng.vec(4 * 16, -0.5, 0.5);
    write_npy(
        data.join("teacher_pooled.npy"),
        &NpyArray::from_f32(vec![4, 16], &pooled).unwrap(),
    )
    .unwrap();
    let grads = dir.path("grads");
    let mut args = vec!["train", "examples/bert_base.msl"];
    let pairs: Vec<String> = sets.iter().map(|(k, v)| format!("{k}={v}")).collect();
    for p in &pairs {
        args.extend(["--set", p]);
    }
    args.extend(["--dim", "S=8", "--dim", "B=4", "--weights", s(&weights)]);
    args.extend(["--data", s(&data), "--dump-grads", s(&grads)]);
    args.extend(["--precision", "f32"]);
    let (code, out, err) = mslc(&args);
    assert_eq!(code, 0, "mslc train:\n{out}\n{err}");
    let reference = dir.path("ref.safetensors");
    let status = std::process::Command::new("python3")
        .arg(root().join("tests/reference/bert_grad_ref.py"))
        .args([s(&weights), s(&data), s(&reference)])
        .args(["--layers", "2", "--heads", "2", "--eps", "1e-12"])
        .status()
        .expect("python3 runs");
    assert!(status.success(), "the JAX reference failed");
    let got_loss = npy_f64(&grads.join("loss.npy"));
    assert_rel("loss", &got_loss, &safetensor_f64(&reference, "loss"), 1e-5);
    let pairs: Vec<(String, Vec<f64>, Vec<f64>)> = module
        .params()
        .map(|(path, _)| {
            let got = safetensor_f64(&grads.join("grads.safetensors"), path);
            (path.to_string(), got, safetensor_f64(&reference, path))
        })
        .collect();
    let largest = pairs
        .iter()
        .flat_map(|(_, _, w)| w.iter())
        .fold(0f64, |m, x| m.max(x.abs()));
    for (path, got, want) in &pairs {
        let own = want.iter().fold(0f64, |m, x| m.max(x.abs()));
        let scale = if path.ends_with("attention.self.key.bias") {
            own.max(1e-3 * largest)
        } else {
            own
        };
        let err = got
            .iter()
            .zip(want)
            .fold(0f64, |m, (g, w)| m.max((g - w).abs()));
        assert!(
            err <= 1e-4 * scale,
            "{path}: max error {err:e} > 1e-4 × {scale:e}"
        );
    }
    assert_eq!(
        pairs.len(),
        5 + 2 * 16 + 2,
        "every parameter of the 2-layer model"
    );
}

#[test]
fn tuning_decisions_apply_to_training_builds_and_runs() {
    let dir = TestDir::new("train-tuned");
    let weights = write_inputs(&dir);
    let source = mlp_source(&dir, &train_decl("optimizer = sgd(lr: 0.1, momentum: 0.9)"));
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .to_string();
    // A knowledge base for this device: the head's input gradient times the ReLU's mask (a
    // product with a multiplier) left unfused, and a GEMM blocking for its matmul, which runs
    // on its own then.
    let gemm = "matmul(f32[4,10], f32[10,8]) {transpose_a=false, transpose_b=false}";
    let relu_grad = "fused_matmul(f32[4,10], f32[10,8], f32[4,8]) {activation=\"none\", \
                     has_bias=false, has_multiplier=true, transpose_a=false, transpose_b=false}";
    let threads_n: usize = threads.parse().unwrap();
    let kb = knowledge_base(
        gemm_blocking(gemm, threads_n, 16),
        serde_json::json!([{
            "device": mslc_tune::device::fingerprint(), "threads": threads_n,
            "signature": relu_grad, "fused": false, "fused_us": 2.0, "unfused_us": 1.0,
        }]),
    );
    let db = dir.path("kb.json");
    std::fs::write(&db, kb.to_string()).unwrap();

    // `mslc build --entry TRAIN` follows both, as a forward build does.
    let out = dir.path("built");
    let mut args = vec!["build", s(&source), "--entry", "Fit"];
    args.extend_from_slice(&SETS);
    args.extend(["--tune-db", s(&db), "-o", s(&out)]);
    let (code, stdout, stderr) = mslc(&args);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("1 fused subgraph(s) left unfused"),
        "{stdout}"
    );
    let table: toml::Value =
        toml::from_str(&std::fs::read_to_string(out.join("Fit.kernels.toml")).unwrap()).unwrap();
    let entry = |sig: &str| {
        table["kernel"]
            .as_array()
            .unwrap()
            .iter()
            .find(|k| k["signature"].as_str() == Some(sig))
            .cloned()
    };
    let tuned = entry(gemm).expect("the backward's matmul");
    assert_eq!(tuned["tuned"].as_bool(), Some(true), "{tuned}");
    assert_eq!(tuned["params"]["mc"].as_integer(), Some(16), "{tuned}");
    assert!(entry(relu_grad).is_none(), "left unfused");

    // `mslc train` follows them too and trains as the defaults do: the same losses.
    let data = dir.path("data");
    let run = |extra: &[&str], metrics: &Path| {
        let mut args = vec![
            "--weights",
            s(&weights),
            "--data",
            s(&data),
            "--steps",
            "4",
            "--threads",
            &threads,
            "--metrics",
            s(metrics),
        ];
        args.extend_from_slice(extra);
        let (code, stdout, stderr) = train(&source, &args);
        assert_eq!(code, 0, "{stdout}\n{stderr}");
        (stdout, metric_losses(metrics))
    };
    let (_, want) = run(&[], &dir.path("default.jsonl"));
    let (stdout, got) = run(&["--tune-db", s(&db)], &dir.path("tuned.jsonl"));
    assert!(
        stdout.contains("tuning:  1 kernel signature(s), 1 subgraph decision(s)"),
        "{stdout}"
    );
    assert_rel("losses with the tuned choices", &got, &want, 1e-5);
}

/// A knowledge base of this device holding `records` and `subgraphs` (JSON arrays).
pub(crate) fn knowledge_base(
    records: serde_json::Value,
    subgraphs: serde_json::Value,
) -> serde_json::Value {
    serde_json::json!({
        "format": "mslc-tune-kb",
        "version": 3,
        "records": records,
        "subgraphs": subgraphs,
    })
}

/// The knowledge-base records of one GEMM blocking on this device: the default parameters
/// with `mc` rows per block, for `signature` on `threads` threads.
pub(crate) fn gemm_blocking(signature: &str, threads: usize, mc: i64) -> serde_json::Value {
    let mut params = mslc_kernels::binding::choose_kernel(mslc_core::ops::Op::Matmul).params;
    params.insert("mc".into(), mslc_kernels::binding::KernelParam::Int(mc));
    serde_json::json!([{
        "device": mslc_tune::device::fingerprint(), "threads": threads, "signature": signature,
        "kernel": "gemm", "params": params, "default_us": 2.0, "tuned_us": 1.0,
        "candidates": 4,
    }])
}

/// `--profile F.json` writes a Chrome trace of the last run of the step: one event per op with
/// its source path — the forward's, the backward's (`#grad`) and the optimizer update's — and
/// the pool threads' tracks; it is written atomically and named in the summary.
#[test]
fn profile_traces_the_last_step() {
    let dir = TestDir::new("train-profile");
    let weights = write_inputs(&dir);
    let source = mlp_source(&dir, &train_decl(ADAMW));
    let (data, trace) = (dir.path("data"), dir.path("step.json"));
    let args = [
        "--weights",
        s(&weights),
        "--data",
        s(&data),
        "--steps",
        "2",
        "--threads",
        "2",
        "--profile",
        s(&trace),
    ];
    let (code, stdout, stderr) = train(&source, &args);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!("wrote {}", trace.display())),
        "{stdout}"
    );
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let names: Vec<&str> = json["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X")
        .filter_map(|e| e["name"].as_str())
        .collect();
    for want in ["matmul ", "#grad", "adam_update "] {
        assert!(
            names.iter().any(|n| n.contains(want)),
            "{want} in {names:?}"
        );
    }
}
