//! Mixed-precision training (`mslc train` with a `precision` policy) on examples/tiny_llama.msl's
//! model, shrunk with `--set`/`--dim`, over a fixed synthetic dataset it learns in 30 steps:
//! O2 bf16 and f16 reach f32's final loss within 5 %; dynamic loss scaling skips overflowing steps
//! (parameters, optimizer states and Adam's step untouched) and moves the scale by MindSpore's
//! rule; fixed scaling updates as no scaling does; a resume is byte-identical; each parameter is
//! cast once, by the forward; and `--check-numerics` says f32 would have stayed finite.

use std::path::{Path, PathBuf};

use mslc_io::npy::{write_npy, NpyArray};
use mslc_io::safetensors::SafetensorsFile;

use crate::exec::common::{mslc, root, s, TestDir};

/// The shrunk model: vocab 64, width 32, 2 layers, feed-forward 64, 8 sequences of 16 tokens.
const SIZES: [&str; 12] = [
    "--set",
    "vocab=64",
    "--set",
    "hidden=32",
    "--set",
    "layers=2",
    "--set",
    "ffn=64",
    "--dim",
    "S=16",
    "--dim",
    "B=8",
];
const VOCAB: i64 = 64;
const SAMPLES: usize = 32;
const TOKENS: usize = 17;
const LR: f64 = 1e-2;

/// tiny_llama's model with `policies` and a train `Fit` (AdamW, lr 1e-2, no weight decay) whose
/// own precision is `Amp`.
fn source(dir: &TestDir, policies: &str) -> PathBuf {
    source_with(dir, policies, "batch = 8")
}

/// [`source`] with `batch` as the train's batch field (and `grad_accum`, if it says so).
fn source_with(dir: &TestDir, policies: &str, batch: &str) -> PathBuf {
    let text = std::fs::read_to_string(root().join("examples/tiny_llama.msl")).unwrap();
    let model = &text[..text.find("// f16 has a narrow").expect("the model part")];
    let path = dir.path("llama_amp.msl");
    let train = format!(
        "train Fit for TinyLlama {{\n    labels: i32[B, S]\n    loss = cross_entropy(logits, labels)\n    optimizer = adamw(lr: {LR}, betas: (0.9, 0.95), weight_decay: 0.0)\n    {batch}\n    precision = Amp\n}}\n"
    );
    std::fs::write(&path, format!("{model}{policies}\n{train}")).unwrap();
    path
}

/// A policy `Amp` (or another name) at O2 in `compute` with `loss_scale`, keeping what
/// tiny_llama's `Mixed` keeps.
fn policy(name: &str, compute: &str, loss_scale: &str) -> String {
    format!(
        "precision {name} {{\n    level = O2\n    compute = {compute}\n    keep_f32 = [rms_norm, softmax, cross_entropy]\n    loss_scale = {loss_scale}\n}}\n"
    )
}

/// 32 rows of 17 tokens, each an arithmetic progression mod 64 with its own start and stride
/// (1 to 3): a next-token rule the model learns from context.
fn tokens(dir: &TestDir) -> PathBuf {
    let mut ids = Vec::with_capacity(SAMPLES * TOKENS);
    for r in 0..SAMPLES as i64 {
        let (start, stride) = ((r * 37 + 11) % VOCAB, 1 + r % 3);
        ids.extend((0..TOKENS as i64).map(|i| (start + stride * i) % VOCAB));
    }
    let path = dir.path("tokens.npy");
    write_npy(
        &path,
        &NpyArray::from_i64(vec![SAMPLES, TOKENS], &ids).unwrap(),
    )
    .unwrap();
    path
}

/// One step's metrics line.
struct Metrics {
    loss: f64,
    loss_scale: f64,
    skipped: bool,
}

/// `mslc train` of `source`, shrunk, from init seed 1 over the token data, with `extra` flags.
fn mslc_train(dir: &TestDir, source: &Path, extra: &[&str]) -> (i32, String, String) {
    let data = tokens(dir);
    let mut args = vec!["train", s(source)];
    args.extend_from_slice(&SIZES);
    args.extend(["--init-seed", "1", "--data", s(&data)]);
    args.extend_from_slice(extra);
    mslc(&args)
}

/// Trains `source` for `steps` on 2 threads with `extra` flags; returns the metrics.
fn train(dir: &TestDir, source: &Path, tag: &str, steps: u64, extra: &[&str]) -> Vec<Metrics> {
    let metrics = dir.path(&format!("{tag}.jsonl"));
    let _ = std::fs::remove_file(&metrics);
    let steps = steps.to_string();
    let mut args = vec![
        "--steps",
        &steps,
        "--threads",
        "2",
        "--metrics",
        s(&metrics),
    ];
    args.extend_from_slice(extra);
    let (code, stdout, stderr) = mslc_train(dir, source, &args);
    assert_eq!(code, 0, "mslc train ({tag}):\n{stdout}\n{stderr}");
    std::fs::read_to_string(&metrics)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            Metrics {
                loss: v["loss"].as_f64().unwrap(),
                loss_scale: v["loss_scale"].as_f64().unwrap(),
                skipped: v["skipped"].as_bool().unwrap(),
            }
        })
        .collect()
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn state(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&read(&dir.join("state.json"))).unwrap()
}

fn tensor(file: &Path, name: &str) -> Vec<f32> {
    SafetensorsFile::open(file)
        .unwrap()
        .tensor(name)
        .unwrap()
        .to_f32()
        .unwrap()
}

#[test]
fn o2_low_precision_with_dynamic_scaling_reaches_the_f32_loss() {
    let dir = TestDir::new("amp-converge");
    let policies = format!(
        "{}{}",
        policy("Amp", "bf16", "dynamic"),
        policy(
            "Half",
            "f16",
            "dynamic(init: 65536, factor: 2, window: 2000)"
        )
    );
    let source = source(&dir, &policies);
    let f32_run = train(&dir, &source, "f32", 30, &["--precision", "f32"]);
    let first = f32_run[0].loss;
    let f32_final = f32_run.last().unwrap().loss;
    assert!(
        f32_final < 0.25 * first,
        "the task is learnt in f32: {first} -> {f32_final}"
    );
    assert!(f32_run.iter().all(|m| m.loss_scale == 1.0 && !m.skipped));
    // The train's own policy by default: O2 bf16, MindSpore's dynamic manager (init 2^24).
    for (tag, extra) in [("bf16", &[][..]), ("f16", &["--precision", "Half"][..])] {
        let run = train(&dir, &source, tag, 30, extra);
        let last = run.last().unwrap().loss;
        assert!(
            (last - f32_final).abs() <= 0.05 * f32_final,
            "{tag}: final loss {last} is not within 5 % of f32's {f32_final}"
        );
        let applied = run.iter().filter(|m| !m.skipped).count();
        assert!(applied >= 25, "{tag}: only {applied} of 30 updates applied");
        if tag == "bf16" {
            assert_eq!(
                run[0].loss_scale, 16_777_216.0,
                "DynamicLossScaleManager's init"
            );
        }
    }
}

/// MindSpore's `DynamicLossScaleManager.update_loss_scale`, transcribed (iterations from 1; the
/// scale grows when the iterations since the last overflow are a multiple of the window).
pub(crate) fn mindspore_scales(
    init: f64,
    factor: f64,
    window: u64,
    overflows: &[bool],
) -> Vec<f64> {
    let (mut scale, mut cur_iter, mut last_overflow_iter) = (init, 1u64, 0u64);
    let mut used = Vec::new();
    for &overflow in overflows {
        used.push(scale);
        if overflow {
            scale = (scale / factor).max(1.0);
            last_overflow_iter = cur_iter;
        } else if (cur_iter - last_overflow_iter) % window == 0 {
            scale *= factor;
        }
        cur_iter += 1;
    }
    used
}

/// The updates are computed over the parameters and optimizer states they replace unless the
/// loss scaling may skip one: `mslc build` of the same AdamW train plans no buffer of their
/// own under `loss_scale = none` (`next_bytes` 0, every parameter and moment written `over`
/// itself), and under `dynamic` a buffer of its own for each (the skipped update leaves the
/// old values intact: `dynamic_scaling_skips_accumulated_updates_that_overflow`).
#[test]
fn updates_are_computed_in_place_and_behind_a_guard_where_the_loss_scale_may_skip_them() {
    let dir = TestDir::new("amp-in-place");
    let dynamic = "dynamic(init: 1024, factor: 2, window: 3)";
    for (tag, scale) in [("none", "none"), ("dynamic", dynamic)] {
        let source = source_with(&dir, &policy("Amp", "bf16", scale), "batch = 8");
        let out = dir.path(tag);
        let (code, stdout, stderr) = mslc(&["build", s(&source), "--entry", "Fit", "-o", s(&out)]);
        assert_eq!(code, 0, "mslc build ({tag}):\n{stdout}\n{stderr}");
        let plan: serde_json::Value =
            serde_json::from_slice(&read(&out.join("Fit.memplan.json"))).unwrap();
        let next_bytes = plan["next_bytes"].as_u64().unwrap();
        let (code, listing, stderr) = mslc(&["inspect", s(&out.join("Fit.mir"))]);
        assert_eq!(code, 0, "mslc inspect ({tag}):\n{stderr}");
        let over = listing.matches(" over \"").count();
        let own = listing.matches(" next").count();
        assert!(
            next_bytes == 0 && own == 0 && over > 0,
            "{tag}: {over} {own}"
        );
        // Under dynamic scaling the update, and only the update, follows the guard.
        let guard = listing.find("  guard %");
        assert_eq!(guard.is_some(), tag == "dynamic", "{tag}");
        if let Some(at) = guard {
            assert!(
                !listing[..at].contains(" over \""),
                "an update before the guard"
            );
            for kept in ["loss", "grad_norm", "overflow"] {
                let value = listing
                    .split(&format!("output {kept} = "))
                    .nth(1)
                    .and_then(|rest| rest.lines().next())
                    .unwrap_or_else(|| panic!("no output {kept}"));
                let computed = listing.find(&format!("  {value} = ")).unwrap();
                assert!(computed < at, "{kept} ({value}) computed after the guard");
            }
        }
    }
}

/// Under a loss scale that skips overflowing steps, each gradient is read once for its norm
/// and the overflow check (`square_sum_finite`, one per parameter, and no `square_sum` or
/// `sum` of the gradients beside it), and no pass of its own unscales a gradient: the
/// reciprocal of the scale multiplies the sums and, inside the update, each gradient.
#[test]
fn a_scaled_step_reads_each_gradient_once_for_its_norm_and_overflow_check() {
    let dir = TestDir::new("amp-one-read");
    let source = source_with(&dir, &policy("Amp", "f16", "fixed(1024)"), "batch = 8");
    let out = dir.path("out");
    let mut args = vec!["build", s(&source), "--entry", "Fit", "-o", s(&out)];
    args.extend_from_slice(&SIZES);
    let (code, stdout, stderr) = mslc(&args);
    assert_eq!(code, 0, "mslc build:\n{stdout}\n{stderr}");
    let (code, listing, stderr) = mslc(&["inspect", s(&out.join("Fit.mir"))]);
    assert_eq!(code, 0, "mslc inspect:\n{stderr}");
    let steps = |op: &str| -> Vec<&str> {
        listing
            .lines()
            .filter(|l| l.contains(&format!(" = {op}(")) && l.ends_with("# train"))
            .collect()
    };
    let parameters = 2 * 9 + 3;
    assert_eq!(steps("square_sum_finite").len(), parameters, "{listing}");
    assert!(steps("square_sum").is_empty() && steps("sum").is_empty());
    // Only scalars are multiplied on their own (the reciprocal, its square, the norm's sum).
    for step in steps("mul") {
        assert!(
            step.contains(": f32[] "),
            "a gradient unscaled in a pass of its own: {step}"
        );
    }
}

/// With `grad_accum`, the overflow check sees the gradients summed over the update's
/// micro-batches: an update that overflows is skipped whole, the scale follows MindSpore's
/// manager as without accumulation, and a skipped update changes no weight or state.
#[test]
fn dynamic_scaling_skips_accumulated_updates_that_overflow() {
    let dir = TestDir::new("amp-accum");
    let init = 1_073_741_824.0;
    let dynamic = "dynamic(init: 1073741824, factor: 2, window: 3)";
    let source = source_with(
        &dir,
        &policy("Amp", "f16", dynamic),
        "batch = 16, grad_accum = 2",
    );
    let out = dir.path("out");
    let save = ["--output-dir", s(&out), "--save-every", "1"];
    let run = train(&dir, &source, "accum", 20, &save);
    let overflows: Vec<bool> = run.iter().map(|m| m.skipped).collect();
    let scales: Vec<f64> = run.iter().map(|m| m.loss_scale).collect();
    assert_eq!(scales, mindspore_scales(init, 2.0, 3, &overflows));
    assert!(overflows[0], "2^30 overflows f16");
    assert!(
        overflows.contains(&false),
        "an update is applied: {scales:?}"
    );
    for k in 2..=run.len() {
        for name in ["model", "optimizer"] {
            let file = |k: usize| read(&out.join(format!("step-{k}/{name}.safetensors")));
            assert_eq!(
                file(k - 1) == file(k),
                overflows[k - 1],
                "step {k} ({name})"
            );
        }
    }
}

#[test]
fn dynamic_scaling_skips_overflowing_steps_and_grows_after_a_window() {
    let dir = TestDir::new("amp-dynamic");
    // f16 at 2^30: the loss's cotangent, over 65504 once cast to f16, overflows at first.
    let init = 1_073_741_824.0;
    let source = source(
        &dir,
        &policy(
            "Amp",
            "f16",
            "dynamic(init: 1073741824, factor: 2, window: 3)",
        ),
    );
    let out = dir.path("out");
    let run = train(
        &dir,
        &source,
        "dynamic",
        20,
        &["--output-dir", s(&out), "--save-every", "1"],
    );
    let overflows: Vec<bool> = run.iter().map(|m| m.skipped).collect();
    let scales: Vec<f64> = run.iter().map(|m| m.loss_scale).collect();
    assert_eq!(scales, mindspore_scales(init, 2.0, 3, &overflows));
    assert!(overflows[0], "2^30 overflows f16");
    let grew = scales.windows(2).any(|w| w[1] > w[0]);
    assert!(grew, "the scale grows after 3 finite steps: {scales:?}");
    let first_update = overflows
        .iter()
        .position(|o| !o)
        .expect("an applied update");
    // A skipped step changes nothing: the weights and optimizer states of step-K are step-(K-1)'s.
    for k in 2..=run.len() {
        let (before, after) = (
            out.join(format!("step-{}", k - 1)),
            out.join(format!("step-{k}")),
        );
        for file in ["model.safetensors", "optimizer.safetensors"] {
            let same = read(&before.join(file)) == read(&after.join(file));
            assert_eq!(same, overflows[k - 1], "step {k}: {file}");
        }
    }
    let last = state(&out.join("step-20"));
    let skipped = overflows.iter().filter(|&&o| o).count() as u64;
    assert_eq!(last["step"], 20);
    assert_eq!(last["skipped"], skipped);
    assert_eq!(last["updates"], 20 - skipped);
    // Adam's step is not advanced by skipped steps: the first applied update is update t = 1,
    // whose bias-corrected step moves each weight by lr · g / (|g| + eps), so by lr where |g|
    // dominates eps — at a later t it would be lr · √(1 − β2^t) / (1 − β1^t) · (…), not lr.
    // Step 1 is skipped, so step-(first_update) (0-based index) still holds the init.
    let name = "model.layers.0.mlp.up_proj.weight";
    let at = |k: usize| tensor(&out.join(format!("step-{k}/model.safetensors")), name);
    let (before, after) = (at(first_update), at(first_update + 1));
    let moved = before
        .iter()
        .zip(&after)
        .fold(0f64, |m, (a, b)| m.max(f64::from((a - b).abs())));
    assert!(
        (moved - LR).abs() <= 0.01 * LR,
        "the first applied update moves weights by at most lr = {LR}, got {moved}"
    );
}

#[test]
fn fixed_scaling_updates_as_no_scaling_does() {
    let dir = TestDir::new("amp-fixed");
    let policies = format!(
        "{}{}",
        policy("Amp", "bf16", "fixed(1024)"),
        policy("Unscaled", "bf16", "none")
    );
    let source = source(&dir, &policies);
    let (fixed, none) = (dir.path("fixed"), dir.path("none"));
    let a = train(&dir, &source, "fixed", 6, &["--output-dir", s(&fixed)]);
    let b = train(
        &dir,
        &source,
        "none",
        6,
        &["--output-dir", s(&none), "--precision", "Unscaled"],
    );
    assert!(a.iter().all(|m| m.loss_scale == 1024.0 && !m.skipped));
    assert!(b.iter().all(|m| m.loss_scale == 1.0));
    for (x, y) in a.iter().zip(&b) {
        assert!(
            (x.loss - y.loss).abs() <= 1e-6 * y.loss,
            "{} vs {}",
            x.loss,
            y.loss
        );
    }
    // Scaling by a power of two commutes with every rounding here (bf16 keeps f32's exponent
    // range): the same weights to the last bit but for rounding, within 1e-6.
    let (wa, wb) = (
        fixed.join("step-6/model.safetensors"),
        none.join("step-6/model.safetensors"),
    );
    let file = SafetensorsFile::open(&wb).unwrap();
    let names: Vec<String> = file.tensors().map(|t| t.name.to_string()).collect();
    assert_eq!(names.len(), 2 * 9 + 3);
    for name in &names {
        let (x, y) = (tensor(&wa, name), tensor(&wb, name));
        let scale = y.iter().fold(0f32, |m, v| m.max(v.abs()));
        let err = x
            .iter()
            .zip(&y)
            .fold(0f32, |m, (p, q)| m.max((p - q).abs()));
        assert!(err <= 1e-6 * scale, "{name}: {err} > 1e-6 × {scale}");
    }
}

#[test]
fn resuming_under_amp_is_byte_identical() {
    let dir = TestDir::new("amp-resume");
    // From 2^22 the first steps overflow, then the scale settles and grows across step 5.
    let source = source(
        &dir,
        &policy("Amp", "f16", "dynamic(init: 4194304, factor: 2, window: 3)"),
    );
    let (straight, halves) = (dir.path("straight"), dir.path("halves"));
    let a = train(
        &dir,
        &source,
        "straight",
        10,
        &["--output-dir", s(&straight)],
    );
    train(&dir, &source, "half", 5, &["--output-dir", s(&halves)]);
    let resume = halves.join("step-5");
    train(
        &dir,
        &source,
        "resumed",
        10,
        &["--output-dir", s(&halves), "--resume", s(&resume)],
    );
    assert!(a.iter().any(|m| m.skipped), "some step overflows");
    assert!(
        a[..5].iter().any(|m| !m.skipped),
        "an update before the resume"
    );
    let saved = state(&resume);
    assert!(saved["good_steps"].as_u64().unwrap() > 0, "{saved}");
    for file in ["model.safetensors", "optimizer.safetensors", "state.json"] {
        assert!(
            read(&straight.join("step-10").join(file)) == read(&halves.join("step-10").join(file)),
            "{file} differs after a resume"
        );
    }
}

/// The optimised IR of train `Fit` built from [`source`] with `policies`, at [`SIZES`].
fn train_ir(dir: &TestDir, policies: &str) -> String {
    let source = source(dir, policies);
    let out = dir.path("out");
    let mut args = vec!["build", s(&source), "--entry", "Fit"];
    args.extend_from_slice(&SIZES);
    args.extend(["-o", s(&out), "--emit", "ir"]);
    let (code, stdout, stderr) = mslc(&args);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    std::fs::read_to_string(out.join("Fit.ir")).unwrap()
}

/// In f32 (O0), the step's forward fuses each norm with its scale before autodiff, so each is
/// differentiated by one `rms_norm_scale_grad` (no normalised value kept, no composed rule),
/// and the gradient norm reads each gradient once, by a `square_sum`.
#[test]
fn an_f32_step_differentiates_each_norm_in_one_op_and_squares_each_gradient_once() {
    let dir = TestDir::new("f32-fused-norm-grads");
    let ir = train_ir(&dir, "precision Amp {\n    level = O0\n}\n");
    let count = |op: &str| {
        ir.lines()
            .filter(|l| l.contains(&format!(" = {op}(")))
            .count()
    };
    // Two layers of two norms, and the final one.
    assert_eq!(count("rms_norm_scale"), 5, "{ir}");
    assert_eq!(count("rms_norm_scale_grad"), 5, "{ir}");
    assert_eq!(count("rms_norm") + count("rms_norm_grad"), 0, "{ir}");
    assert_eq!(count("square_sum"), 2 * 9 + 3, "{ir}");
}

#[test]
fn the_forward_casts_each_parameter_once_and_the_update_stays_f32() {
    let dir = TestDir::new("amp-casts");
    let ir = train_ir(&dir, &policy("Amp", "f16", "dynamic"));
    assert!(ir.contains("input \"train.loss_scale\" : f32[]"), "{ir}");
    assert!(ir.contains("output overflow = "), "{ir}");
    let params: Vec<String> = ir
        .lines()
        .filter(|l| l.contains(" = param \""))
        .map(|l| l.trim().split(' ').next().unwrap().to_string())
        .collect();
    assert_eq!(params.len(), 2 * 9 + 3);
    for p in &params {
        let casts: Vec<&str> = ir
            .lines()
            .filter(|l| l.contains(&format!("cast({p})")))
            .collect();
        assert!(casts.len() <= 1, "{p} is cast more than once: {casts:#?}");
        for c in casts {
            assert!(!c.contains("#grad") && !c.contains("# train"), "{c}");
        }
        // No fused program of the backward or the update converts a parameter again.
        let recast = ir.lines().find(|l| {
            l.contains("fused_elementwise(") && l.contains("cast<f16>") && operands(l).contains(p)
        });
        assert!(recast.is_none(), "{recast:?}");
    }
    // O2 computes in f16 but what `keep_f32` lists, forward and backward alike.
    let typed = |op: &str| -> Vec<&str> {
        ir.lines()
            .filter(|l| l.contains(&format!(" = {op}(")))
            .collect()
    };
    for op in [
        "rms_norm",
        "rms_norm_grad",
        "cross_entropy",
        "cross_entropy_grad",
    ] {
        let lines = typed(op);
        assert!(!lines.is_empty(), "no {op}");
        assert!(lines.iter().all(|l| l.contains(": f32[")), "{lines:#?}");
    }
    for op in ["attention_lse", "attention_grad", "embedding"] {
        let lines = typed(op);
        assert!(!lines.is_empty(), "no {op}");
        assert!(lines.iter().all(|l| l.contains(": f16[")), "{lines:#?}");
    }
    // The forward's attention is the attention_lse the backward reads (one pass, CSE).
    assert!(typed("attention").is_empty(), "{:#?}", typed("attention"));
    // The optimizer states are f32, as the masters they update.
    let states: Vec<&str> = ir
        .lines()
        .filter(|l| l.contains("= input \"") && l.contains(".exp_avg"))
        .collect();
    assert_eq!(states.len(), 2 * params.len());
    assert!(states.iter().all(|l| l.contains(": f32[")), "{states:#?}");
}

/// The operands of an IR line `%N = op(%A, %B) {…} : …`.
fn operands(line: &str) -> Vec<String> {
    let call = line.split(" {").next().unwrap_or(line);
    let (Some(open), Some(close)) = (call.find('('), call.rfind(')')) else {
        return Vec::new();
    };
    call[open + 1..close]
        .split(", ")
        .map(str::to_string)
        .collect()
}

#[test]
fn an_unknown_precision_on_train_is_a_usage_error() {
    let dir = TestDir::new("amp-flag");
    let source = source(&dir, &policy("Amp", "bf16", "dynamic"));
    let (code, stdout, stderr) = mslc_train(&dir, &source, &["--precision", "Nope"]);
    assert_eq!(code, 2, "{stdout}{stderr}");
    assert!(
        stderr.contains("E0613") && stderr.contains("policies: f32, Amp"),
        "{stderr}"
    );
}

#[test]
fn check_numerics_under_amp_says_f32_stays_finite() {
    let dir = TestDir::new("amp-numerics");
    let source = source(&dir, &policy("Amp", "f16", "fixed(1073741824)"));
    let (code, stdout, stderr) = mslc_train(&dir, &source, &["--check-numerics"]);
    assert_eq!(code, 1, "{stdout}{stderr}");
    // The help wraps at any space.
    let stderr = stderr.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(stderr.contains("E0614"), "{stderr}");
    assert!(
        stderr.contains("produced NaN or infinity (backward"),
        "{stderr}"
    );
    assert!(
        stderr.contains("computed in f32 on the same operands the result stays finite"),
        "{stderr}"
    );
    assert!(
        stderr.contains("scaled by 1073741824") && stderr.contains("is skipped"),
        "{stderr}"
    );
}
