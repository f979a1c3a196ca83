//! Pipeline stages run for real: `mslc run --ranks N` of a plan with pipeline stages cuts the
//! tiny LLaMA between its layers, each stage's ranks run their part over the micro-batches and
//! hand the residual stream on, and rank 0 writes the logits one device writes — alone and
//! mixed with data and tensor (and sequence) parallelism; `mslc train --ranks N` trains it
//! under 1F1B with one device's losses, weights and checkpoints.

use std::path::Path;

use crate::exec::common::{mslc, random_weights, s, write_weights, TestDir};
use crate::ranks::{
    compile_options, llama_flags, llama_forward_parity, llama_source_in, llama_training_parity,
    random_tokens, tensors_of,
};
use crate::tolerance::{assert_rel_to_max, ADAMW_WEIGHTS_TOL};
use crate::train::{assert_rel, gemm_blocking, knowledge_base, npy_f64};

/// Two stages, four micro-batches of 2 sequences (1F1B).
const PP: &str = include_str!("../fixtures/tiny_llama_pp.msl-decls");
/// Two replicas × two stages × two tensor-parallel ranks, two micro-batches of 2.
const MIX: &str = include_str!("../fixtures/tiny_llama_mix.msl-decls");
/// GPT-2's model (its logits read the embedding's table) on two stages, and its sizes here
/// (without dropout, so that micro-batches draw no masks of their own).
const TIED: &str = include_str!("../fixtures/gpt2_tied_pp.msl-decls");
const TIED_SIZES: &str = include_str!("../fixtures/gpt2_tied_sizes.args");

/// Each stage's program holds its own layers' weights and nothing of the other's: the first
/// the embedding and layer 0, the second layer 1, the final norm and the head; the only value
/// crossing the cut is the residual stream of one micro-batch, `[2, 8, 32]`.
#[test]
fn each_stage_holds_its_layers_and_one_value_crosses_the_cut() {
    let dir = TestDir::new("pipeline-cut");
    let (_, checked) = llama_source_in(&dir, "pp.msl", PP, 2);
    let plan = mslc_driver::parallel::plan_train(&checked, &checked.decls.trains[0])
        .unwrap()
        .expect("a plan");
    let layout = mslc_driver::ranks::layout(Some(&plan), 2, "--ranks").unwrap();
    let pipeline = layout.pipeline.as_ref().expect("two stages");
    assert_eq!(pipeline.micro_batches, 4);
    let model = &checked.models[0];
    let mut stages = Vec::new();
    for stage in 0..2 {
        let (compiled, cut) =
            mslc_driver::ranks::compile_stage(model, &compile_options(), None, pipeline, stage)
                .unwrap();
        let params: Vec<String> = compiled
            .module
            .params()
            .map(|(path, _)| path.to_string())
            .collect();
        stages.push((compiled.module, cut, params));
    }
    let (first, second) = (&stages[0], &stages[1]);
    assert!(first
        .2
        .iter()
        .all(|p| p.starts_with("model.embed_tokens") || p.starts_with("model.layers.0.")));
    assert!(first.2.iter().any(|p| p.starts_with("model.layers.0.")));
    assert!(second.2.iter().all(|p| p.starts_with("model.layers.1.")
        || p == "model.norm.weight"
        || p == "lm_head.weight"));
    assert_eq!(first.1.sends.len(), 1);
    assert_eq!(second.1.receives.len(), 1);
    assert_eq!(first.1.sends[0].name, second.1.receives[0].name);
    assert!(first.1.outputs.is_empty());
    assert_eq!(second.1.outputs, ["logits"]);
    let crossing = &second.1.receives[0].name;
    let (_, v) = second
        .0
        .inputs()
        .find(|(n, _)| n == crossing)
        .expect("the received input");
    assert_eq!(second.0.values[v as usize].ty.shape, [2, 8, 32]);
    // The token ids are the first stage's input only.
    assert!(first.0.inputs().any(|(n, _)| n == "tokens"));
    assert!(!second.0.inputs().any(|(n, _)| n == "tokens"));
}

/// `mslc run` of `decls` on `ranks` ranks and on one device, from the same weights and a
/// batch of 8 sequences: the logits, within 1e-5 relative (each row goes through the same
/// weights in the same order; the tensor-parallel sums reassociate).
fn pipeline_forward_parity(tag: &str, decls: &str, batch: usize, ranks: &str) {
    let dir = TestDir::new(tag);
    let (src, checked) = llama_source_in(&dir, "llama.msl", decls, batch);
    llama_forward_parity(&dir, &src, &checked, 8, ranks);
}

#[test]
fn run_on_two_pipeline_stages_matches_one_device() {
    pipeline_forward_parity("pipeline-run-pp", PP, 2, "2");
}

#[test]
fn run_on_two_replicas_of_two_stages_of_two_tensor_ranks_matches_one_device() {
    pipeline_forward_parity("pipeline-run-mix", MIX, 2, "8");
}

/// [`run_on_two_replicas_of_two_stages_of_two_tensor_ranks_matches_one_device`] with
/// sequence parallelism: what crosses the cut is each tensor-parallel rank's block of the
/// residual stream, sent to the rank of the same block in the next stage.
#[test]
fn run_on_two_stages_with_sequence_parallelism_matches_one_device() {
    let mode = "mode = semi_auto";
    let decls = MIX.replace(mode, &format!("{mode}\n    sequence_parallel = true"));
    pipeline_forward_parity("pipeline-run-mix-sp", &decls, 2, "8");
    let dir = TestDir::new("pipeline-cut-sp");
    let (_, checked) = llama_source_in(&dir, "sp.msl", &decls, 2);
    let plan = mslc_driver::parallel::plan_train(&checked, &checked.decls.trains[0])
        .unwrap()
        .expect("a plan");
    let layout = mslc_driver::ranks::layout(Some(&plan), 8, "--ranks").unwrap();
    assert!(layout.sequence_parallel);
    let group = layout.tensor_group();
    let (module, cut) = mslc_driver::ranks::compile_stage(
        &checked.models[0],
        &compile_options(),
        layout.tensor(&group),
        layout.pipeline.as_ref().unwrap(),
        1,
    )
    .unwrap();
    let (_, v) = module
        .module
        .inputs()
        .find(|(n, _)| *n == cut.receives[0].name)
        .expect("the received input");
    assert_eq!(module.module.values[v as usize].ty.shape, [2, 4, 32]);
}

/// Ten AdamW steps of the tiny LLaMA on two pipeline stages (1F1B over 4 micro-batches of 2)
/// give one device's losses on the batch of 8 within 1e-5 relative, and — gathered into one
/// checkpoint by rank 0 — its weights and optimizer states within 1e-4 (each micro-batch's
/// GEMMs round differently from the whole batch's, ~1e-7, and AdamW's `m / √v` turns that into
/// up to ~2e-5 of a tensor's largest weight where a gradient is near zero; one device
/// accumulating the micro-batches rounds the same way as the stages, bit for bit, below).
#[test]
fn training_on_two_pipeline_stages_matches_one_device() {
    let dir = TestDir::new("pipeline-train-pp");
    let (src, checked) = llama_source_in(&dir, "pp.msl", PP, 2);
    llama_training_parity(&dir, (&src, &src), &checked, "2", ADAMW_WEIGHTS_TOL);
}

/// What is left between two pipeline stages and one device on the whole batch is the
/// accumulation's own rounding: one device accumulating the same 4 micro-batches of 2
/// (`grad_accum = 4`) gives the two stages' losses, final weights and optimizer states bit for
/// bit.
#[test]
fn two_pipeline_stages_train_as_one_device_accumulating_their_micro_batches() {
    let dir = TestDir::new("pipeline-train-accumulating");
    let (src, checked) = llama_source_in(&dir, "pp.msl", PP, 2);
    let accumulating = PP.replace("batch = 8", "batch = 8, grad_accum = 4");
    assert_ne!(accumulating, PP);
    let (single, _) = llama_source_in(&dir, "accumulating.msl", &accumulating, 2);
    llama_training_parity(&dir, (&src, &single), &checked, "2", 0.0);
}

/// GPipe's order (every forward, then every backward) gives the same update.
#[test]
fn training_under_gpipe_matches_one_device() {
    let dir = TestDir::new("pipeline-train-gpipe");
    let decls = PP.replace("schedule: 1f1b", "schedule: gpipe");
    assert_ne!(decls, PP);
    let (src, checked) = llama_source_in(&dir, "gpipe.msl", &decls, 2);
    llama_training_parity(&dir, (&src, &src), &checked, "2", ADAMW_WEIGHTS_TOL);
}

/// The same on 2 replicas × 2 stages × 2 tensor-parallel ranks (8 ranks, 2 micro-batches of 2
/// per replica): the losses within 1e-5; the weights within 2e-4 of a tensor's largest, as the
/// replicas' gradients are summed and the row-parallel products reassociated on top of the
/// micro-batches' rounding (measured: 1.2e-4 on one element of `gate_proj` whose gradient
/// is near zero).
#[test]
fn training_on_two_replicas_of_two_stages_of_two_tensor_ranks_matches_one_device() {
    let dir = TestDir::new("pipeline-train-mix");
    let (src, checked) = llama_source_in(&dir, "mix.msl", MIX, 2);
    llama_training_parity(&dir, (&src, &src), &checked, "8", 2e-4);
}

/// A pipeline's checkpoint is the whole model's, by parameter path, and its loop position
/// counts the train's batches as one device's does: one device resumes the pipeline's
/// checkpoint and the pipeline resumes one device's, each continuing as one device straight.
#[test]
fn pipeline_and_one_device_resume_each_other_s_checkpoints() {
    let dir = TestDir::new("pipeline-resume");
    let (src, _) = llama_source_in(&dir, "pp.msl", PP, 2);
    let data = random_tokens(&dir, 16, 8, 5);
    let run = |out: &str, steps: &str, extra: &[&str]| -> Vec<f64> {
        let rows = train_metrics(
            &dir,
            (&src, &llama_flags()),
            &data,
            out,
            &[&["--steps", steps][..], extra].concat(),
        );
        column(&rows, "loss")
    };
    let straight = run("straight", "6", &["--init-seed", "4"]);
    run("one", "3", &["--init-seed", "4"]);
    run("pp", "3", &["--init-seed", "4", "--ranks", "2"]);
    let one_ck = dir.path("one/step-3");
    let pp_ck = dir.path("pp/step-3");
    let pp_after_one = run(
        "pp-after-one",
        "6",
        &["--resume", s(&one_ck), "--ranks", "2"],
    );
    let one_after_pp = run("one-after-pp", "6", &["--resume", s(&pp_ck)]);
    assert_eq!(pp_after_one.len(), 3);
    assert_rel(
        "pipeline after one device",
        &pp_after_one,
        &straight[3..],
        1e-5,
    );
    assert_rel(
        "one device after the pipeline",
        &one_after_pp,
        &straight[3..],
        1e-5,
    );
}

/// [`training_on_two_replicas_of_two_stages_of_two_tensor_ranks_matches_one_device`] with
/// sequence parallelism within each stage: the residual stream's blocks cross the cut and
/// their gradients come back block by block.
#[test]
fn training_with_sequence_parallel_stages_matches_one_device() {
    let dir = TestDir::new("pipeline-train-mix-sp");
    let mode = "mode = semi_auto";
    let decls = MIX.replace(mode, &format!("{mode}\n    sequence_parallel = true"));
    let (src, checked) = llama_source_in(&dir, "mix-sp.msl", &decls, 2);
    llama_training_parity(&dir, (&src, &src), &checked, "8", 2e-4);
}

/// examples/tiny_llama.msl's own train — 2 replicas × 2 stages × Megatron over `mp: 2` with a
/// vocabulary-parallel embedding and head (gathered where read whole), 4 micro-batches, ZeRO
/// level 1, f16 O2 with dynamic loss scaling — on its 8 ranks, against one device from the
/// same weights: in f32 (`--precision f32`) the losses within 1e-5, in its own precision the
/// same loss scales and the losses within 1e-4 (measured 5e-6).
#[test]
fn the_tiny_llama_example_trains_on_its_eight_ranks_as_on_one_device() {
    let dir = TestDir::new("pipeline-example");
    let example = crate::exec::common::root().join("examples/tiny_llama.msl");
    let data = random_tokens(&dir, 16, 8, 11);
    let sizes = llama_flags();
    let run =
        |out: &str, extra: &[&str]| train_metrics(&dir, (&example, &sizes), &data, out, extra);
    let from = ["--init-seed", "2", "--steps", "4"];
    let f32 = [&from[..], &["--precision", "f32"]].concat();
    let one = run("f32-one", &f32);
    let eight = run("f32-eight", &[&f32[..], &["--ranks", "8"]].concat());
    assert_rel(
        "f32 losses",
        &column(&eight, "loss"),
        &column(&one, "loss"),
        1e-5,
    );
    let one = run("f16-one", &from);
    let eight = run("f16-eight", &[&from[..], &["--ranks", "8"]].concat());
    assert_eq!(column(&eight, "loss_scale"), column(&one, "loss_scale"));
    assert_rel(
        "f16 losses",
        &column(&eight, "loss"),
        &column(&one, "loss"),
        1e-4,
    );
}

/// A checkpoint written on 8 ranks resumes on 4 or on 1 (issue 11): examples/tiny_llama.msl's
/// train in f32 on its 8 ranks (2 replicas × 2 stages × 2 tensor-parallel ranks, ZeRO
/// level1) writes a whole checkpoint after 3 of 6 steps; from it, 2 stages × 2
/// tensor-parallel ranks (the same policy without the replicas) and one device each run the
/// last 3 steps with the 8 ranks' losses within 1e-5 relative.
#[test]
fn a_checkpoint_of_eight_ranks_resumes_on_four_and_on_one() {
    let dir = TestDir::new("pipeline-resume-8-4-1");
    let example = crate::exec::common::root().join("examples/tiny_llama.msl");
    let text = std::fs::read_to_string(&example).unwrap();
    let eight = "mesh = { dp: 2, pp: 2, mp: 2 }";
    assert!(text.contains(eight));
    let four = dir.path("four.msl");
    std::fs::write(&four, text.replace(eight, "mesh = { pp: 2, mp: 2 }")).unwrap();
    let data = random_tokens(&dir, 16, 8, 13);
    let sizes = llama_flags();
    let run = |src: &Path, out: &str, extra: &[&str]| {
        let f32 = ["--precision", "f32"];
        let rows = train_metrics(&dir, (src, &sizes), &data, out, &[&f32[..], extra].concat());
        column(&rows, "loss")
    };
    let seeded = ["--init-seed", "3", "--ranks", "8"];
    let straight = run(
        &example,
        "straight",
        &[&seeded[..], &["--steps", "6"]].concat(),
    );
    run(
        &example,
        "eight",
        &[&seeded[..], &["--steps", "3"]].concat(),
    );
    let checkpoint = dir.path("eight/step-3");
    let resume = ["--resume", s(&checkpoint), "--steps", "6"];
    let on_four = run(&four, "on-four", &[&resume[..], &["--ranks", "4"]].concat());
    let on_one = run(&example, "on-one", &resume);
    assert_eq!(on_four.len(), 3);
    assert_rel("resumed on four ranks", &on_four, &straight[3..], 1e-5);
    assert_rel("resumed on one device", &on_one, &straight[3..], 1e-5);
}

/// Clipping by the global norm and dynamic loss scaling need every stage's gradients: each
/// stage's update sums the squared norms and the overflow checks over the stages, so the
/// pipeline clips, scales and skips as one device does — in f32 the losses and norms within
/// 1e-5; in f16 (O2, with a scale that grows every 3 finite steps and halves on overflow) the
/// same scales and skipped steps, the first loss within 1e-5 and the rest within 1e-2 (a
/// micro-batch's f16 activations round unlike the whole batch's where the f32 sums differ in
/// their last bit, and ten steps of fitting 8 sequences compound that: measured 3e-3 at step
/// 10).
#[test]
fn clipping_and_dynamic_loss_scaling_on_a_pipeline_match_one_device() {
    let dir = TestDir::new("pipeline-clip");
    let clipped = PP.replace("batch = 8\n", "batch = 8\n    clip_grad_norm = 0.5\n");
    let mixed = PP.replace(
        "train Pretrain",
        "precision Mixed {\n    level = O2\n    compute = f16\n    keep_f32 = [rms_norm, \
         softmax, cross_entropy]\n    loss_scale = dynamic(init: 65536, factor: 2, window: \
         3)\n}\n\ntrain Pretrain",
    );
    let mixed = mixed.replace("batch = 8\n", "batch = 8\n    precision = Mixed\n");
    assert!(clipped != PP && mixed.matches("Mixed").count() == 2);
    let data = random_tokens(&dir, 8, 8, 3);
    let metrics = |src: &Path, tag: &str, ranks: &[&str]| {
        let seeded = ["--init-seed", "1", "--steps", "10"];
        train_metrics(
            &dir,
            (src, &llama_flags()),
            &data,
            tag,
            &[&seeded[..], ranks].concat(),
        )
    };
    let (src, _) = llama_source_in(&dir, "clip.msl", &clipped, 2);
    let one = metrics(&src, "clip-one", &[]);
    let two = metrics(&src, "clip-two", &["--ranks", "2"]);
    for key in ["loss", "grad_norm"] {
        assert_rel(key, &column(&two, key), &column(&one, key), 1e-5);
    }
    let (src, _) = llama_source_in(&dir, "mixed.msl", &mixed, 2);
    let one = metrics(&src, "mixed-one", &[]);
    let two = metrics(&src, "mixed-two", &["--ranks", "2"]);
    assert_eq!(column(&two, "loss_scale"), column(&one, "loss_scale"));
    let skipped = |rows: &[serde_json::Value]| -> Vec<bool> {
        rows.iter()
            .map(|r| r["skipped"].as_bool().unwrap())
            .collect()
    };
    assert_eq!(skipped(&two), skipped(&one));
    assert!(column(&one, "loss_scale").iter().any(|&x| x != 65536.0));
    let (losses, want) = (column(&two, "loss"), column(&one, "loss"));
    assert_rel("the first f16 loss", &losses[..1], &want[..1], 1e-5);
    assert_rel("f16 losses", &losses, &want, 1e-2);
}

/// Optimizer sharding level 1 on a pipeline: each replica updates its slice of each stage's
/// parameters and states (its update program selects and gathers them) — exactly the update
/// without sharding, so the 8 ranks' checkpoint equals theirs bit for bit, optimizer states
/// gathered whole. Levels 2 and 3: each micro-batch's gradients are reduce-scattered, each
/// replica summing its slices (at level 3 each rank holds slices of the parameters too,
/// gathered where the step and the forward read them), so the replicas' sums reassociate: the
/// same losses within 1e-5, weights and states within 1e-4 of each tensor's largest (measured
/// 1.1e-5 at both levels).
#[test]
fn a_pipeline_with_optimizer_sharding_updates_as_without() {
    let dir = TestDir::new("pipeline-zero");
    let zero = MIX.replace(
        "schedule: 1f1b }",
        "schedule: 1f1b }\n    optimizer_shard = level1",
    );
    assert_ne!(zero, MIX);
    let data = random_tokens(&dir, 8, 8, 3);
    let (plain, checked) = llama_source_in(&dir, "plain.msl", MIX, 2);
    let single = mslc_driver::compile::compile(&checked.models[0], &compile_options())
        .unwrap()
        .module;
    let weights = dir.path("w.safetensors");
    write_weights(&weights, &random_weights(&single, 9));
    let train = |src: &std::path::Path, out: &str| {
        let out = dir.path(out);
        let metrics = out.with_extension("jsonl");
        let args = [
            &[
                "train",
                s(src),
                "--data",
                s(&data),
                "--weights",
                s(&weights),
                "--steps",
                "3",
                "--threads",
                "1",
                "--ranks",
                "8",
                "--output-dir",
                s(&out),
                "--metrics",
                s(&metrics),
            ][..],
            &llama_flags(),
        ]
        .concat();
        let (code, stdout, stderr) = mslc(&args);
        (code, format!("{stdout}{stderr}"), out)
    };
    let (sharded, _) = llama_source_in(&dir, "zero.msl", &zero, 2);
    let (code, log, without) = train(&plain, "plain");
    assert_eq!(code, 0, "{log}");
    let (code, log, with) = train(&sharded, "zero1");
    assert_eq!(code, 0, "{log}");
    for file in ["model.safetensors", "optimizer.safetensors"] {
        let read = |d: &std::path::Path| std::fs::read(d.join("step-3").join(file)).unwrap();
        assert!(read(&without) == read(&with), "{file} differs");
    }
    for level in ["level2", "level3"] {
        let (src, _) = llama_source_in(&dir, "zero.msl", &zero.replace("level1", level), 2);
        let (code, log, with) = train(&src, level);
        assert_eq!(code, 0, "{log}");
        assert_rel(
            &format!("{level} losses"),
            &crate::train::metric_losses(&with.with_extension("jsonl")),
            &crate::train::metric_losses(&without.with_extension("jsonl")),
            1e-5,
        );
        for file in ["model.safetensors", "optimizer.safetensors"] {
            let read = |d: &std::path::Path| tensors_of(&d.join("step-3").join(file));
            let (plain, sharded) = (read(&without), read(&with));
            assert_eq!(plain.len(), sharded.len(), "{file}");
            for ((name, a), (other, b)) in plain.iter().zip(&sharded) {
                assert_eq!(name, other);
                assert_rel_to_max(&format!("{level} {name}"), b, a, 1e-4);
            }
        }
    }
}

/// `mslc train` of `src` on `data` with `args` and the model's `sizes` (the tiny LLaMA's:
/// [`llama_flags`]), one thread, into `dir/TAG` (metrics in `dir/TAG.jsonl`): each step's
/// metrics.
fn train_metrics(
    dir: &TestDir,
    (src, sizes): (&Path, &[&str]),
    data: &Path,
    tag: &str,
    args: &[&str],
) -> Vec<serde_json::Value> {
    let metrics = dir.path(&format!("{tag}.jsonl"));
    let out = dir.path(tag);
    let head = ["train", s(src), "--data", s(data), "--threads", "1"];
    let tail = ["--metrics", s(&metrics), "--output-dir", s(&out)];
    let (code, stdout, stderr) = mslc(&[&head[..], args, &tail, sizes].concat());
    assert_eq!(code, 0, "{stdout}{stderr}");
    std::fs::read_to_string(&metrics)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Metric `key` of each step of `rows`.
fn column(rows: &[serde_json::Value], key: &str) -> Vec<f64> {
    rows.iter().map(|r| r[key].as_f64().unwrap()).collect()
}

/// BatchNorm's running statistics on a pipeline: a stage before the last updates them in its
/// forward, the last in its step, once per micro-batch and in the micro-batches' order, as one
/// device accumulating the same micro-batches does. Six SGD steps of a small CNN with a
/// BatchNorm on each of its two stages (4 micro-batches of 2) give exactly one device's
/// losses, weights, running statistics and momentum under `grad_accum = 4`.
#[test]
fn batch_norm_on_a_pipeline_trains_as_one_device_accumulating() {
    let dir = TestDir::new("pipeline-batch-norm");
    let src = dir.path("cnn.msl");
    std::fs::write(&src, include_str!("../fixtures/cnn_bn_pp.msl")).unwrap();
    let data = dir.path("data");
    std::fs::create_dir_all(&data).unwrap();
    let mut rng = crate::exec::common::Rng(5);
    let images = rng.vec(32 * 3 * 8 * 8, -2.0, 2.0);
    let labels: Vec<i64> = (0..32)
        .map(|_| (rng.uniform() * 10.0) as i64 % 10)
        .collect();
    let npy = |name: &str, array: mslc_io::npy::NpyArray| {
        mslc_io::npy::write_npy(data.join(name), &array).unwrap()
    };
    npy(
        "images.npy",
        mslc_io::npy::NpyArray::from_f32(vec![32, 3, 8, 8], &images).unwrap(),
    );
    npy(
        "labels.npy",
        mslc_io::npy::NpyArray::from_i64(vec![32], &labels).unwrap(),
    );
    let run = |entry: &str, tag: &str, extra: &[&str]| {
        let seeded = ["--entry", entry, "--init-seed", "0", "--steps", "6"];
        let rows = train_metrics(
            &dir,
            (&src, &[]),
            &data,
            tag,
            &[&seeded[..], extra].concat(),
        );
        column(&rows, "loss")
    };
    let one = run("Accumulated", "one", &[]);
    assert_eq!(one.len(), 6);
    assert_eq!(run("Staged", "two", &["--ranks", "2"]), one);
    for file in ["model.safetensors", "optimizer.safetensors"] {
        let read = |tag: &str| std::fs::read(dir.path(tag).join("step-6").join(file)).unwrap();
        assert!(read("one") == read("two"), "{file} differs");
    }
    let stats = tensors_of(&dir.path("two/step-6/model.safetensors"));
    let running: Vec<&str> = stats
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| n.contains("running"))
        .collect();
    assert_eq!(running.len(), 4, "{running:?}");
}

/// Megatron-LM's interleaved schedule: 4 layers on 2 devices of 2 chunks each (device 0 runs
/// layers 0 and 2, device 1 layers 1 and 3), each chunk a rank of its own taking its turns in
/// its device's order, 4 micro-batches. Ten steps give one device's losses within 1e-5
/// relative, and the same weights and optimizer states, to the bit, as 1F1B on 2 stages of 2
/// layers: each chunk sums its micro-batches' gradients in the same order. (Against one
/// device the weights differ by ~1e-5 of their norm under both schedules: AdamW's `m / √v`
/// on the micro-batches' reassociated sums.)
#[test]
fn the_interleaved_schedule_trains_as_1f1b_and_one_device() {
    let dir = TestDir::new("pipeline-interleaved");
    let (model, four) = four_layer_llama(&dir);
    let source = |name: &str, schedule: &str| {
        let src = dir.path(name);
        let decls = PP.replace("schedule: 1f1b", &format!("schedule: {schedule}"));
        std::fs::write(&src, format!("{model}{decls}")).unwrap();
        src
    };
    let interleaved = source("interleaved.msl", "interleaved(2)");
    let one_f_one_b = source("1f1b.msl", "1f1b");
    let data = random_tokens(&dir, 16, 8, 9);
    let run = |src: &Path, tag: &str, extra: &[&str]| {
        let seeded = ["--init-seed", "6", "--steps", "10"];
        let rows = train_metrics(
            &dir,
            (src, &four),
            &data,
            tag,
            &[&seeded[..], extra].concat(),
        );
        column(&rows, "loss")
    };
    let ranks = ["--ranks", "2", "--collective-timeout", "60"];
    let one = run(&interleaved, "one", &[]);
    assert_eq!(one.len(), 10);
    let chunks = run(&interleaved, "chunks", &ranks);
    assert_rel("losses", &chunks, &one, 1e-5);
    let stages = run(&one_f_one_b, "stages", &ranks);
    assert_eq!(chunks, stages);
    for file in ["model.safetensors", "optimizer.safetensors"] {
        let read = |tag: &str| std::fs::read(dir.path(tag).join("step-10").join(file)).unwrap();
        assert!(read("chunks") == read("stages"), "{file} differs");
    }
    // The forward on the chunks: one device's logits.
    let tokens = dir.path("x.npy");
    let ids: Vec<i64> = (0..64).map(|i| (i * 7 + 1) % 64).collect();
    let array = mslc_io::npy::NpyArray::from_i64(vec![8, 8], &ids).unwrap();
    mslc_io::npy::write_npy(&tokens, &array).unwrap();
    let input = format!("tokens={}", s(&tokens));
    let args = [&["--init-seed", "6", "--input", &input][..], &four].concat();
    let (want, _) = crate::ranks::forward(&interleaved, &args, &dir.path("f1"), &[], "logits");
    let (got, stdout) =
        crate::ranks::forward(&interleaved, &args, &dir.path("f4"), &ranks, "logits");
    assert_rel("logits", &got, &want, 1e-5);
    assert!(
        stdout.contains("interleaved: 4 chunks, each a rank"),
        "{stdout}"
    );
    // What `mslc build` writes: a program per chunk, each chunk a rank on its device.
    let out = dir.path("out");
    let mut args = vec![
        "build",
        s(&interleaved),
        "--entry",
        "Pretrain",
        "-o",
        s(&out),
    ];
    args.extend(&four);
    let (code, stdout, stderr) = mslc(&args);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(out.join("Pretrain.stage3.rank.mir").exists(), "{stdout}");
    let ranks: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("Pretrain.ranks.json")).unwrap())
            .unwrap();
    let devices: Vec<(u64, u64)> = ranks["pipeline"]["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["stage"].as_u64().unwrap(), s["device"].as_u64().unwrap()))
        .collect();
    assert_eq!(devices, [(0, 0), (1, 1), (2, 0), (3, 1)]);
}

/// The tiny LLaMA's model part (written and checked in `dir`) and its sizes with 4 layers.
fn four_layer_llama(dir: &TestDir) -> (String, Vec<&'static str>) {
    let four: Vec<&str> = llama_flags()
        .into_iter()
        .map(|f| if f == "layers=2" { "layers=4" } else { f })
        .collect();
    assert!(four.contains(&"layers=4"));
    let (model, _) = llama_source_in(dir, "model.msl", "", 2);
    (std::fs::read_to_string(model).unwrap(), four)
}

/// Stages of two layers each under tensor parallelism — 2 replicas × 2 stages × 2
/// tensor-parallel ranks over the tiny LLaMA's 4 layers — under 1F1B, and interleaved (4
/// chunks of one layer, 16 ranks on the 8 devices): 5 steps with one device's losses within
/// 1e-5. (Megatron's rewrite reuses the ids of the nodes it replaces, so the layers' node order
/// no longer follows their index: a stage once got layers 0 and 2.)
#[test]
fn stages_of_several_layers_under_tensor_parallelism_train_as_one_device() {
    let dir = TestDir::new("pipeline-mix-four");
    let (model, four) = four_layer_llama(&dir);
    let data = random_tokens(&dir, 32, 8, 21);
    let seeded = ["--init-seed", "8", "--steps", "5"];
    for (schedule, tag) in [("1f1b", "1f1b"), ("interleaved(2)", "interleaved")] {
        let decls = MIX
            .replace("schedule: 1f1b", &format!("schedule: {schedule}"))
            .replace("micro_batches: 2", "micro_batches: 4")
            .replace("batch = 8", "batch = 16");
        let src = dir.path(&format!("{tag}.msl"));
        std::fs::write(&src, format!("{model}{decls}")).unwrap();
        let run = |tag: &str, extra: &[&str]| {
            let args = [&seeded[..], extra].concat();
            column(
                &train_metrics(&dir, (&src, &four), &data, tag, &args),
                "loss",
            )
        };
        let one = run(&format!("{tag}-one"), &[]);
        assert_eq!(one.len(), 5);
        let ranks = ["--ranks", "8", "--collective-timeout", "60"];
        let ranked = run(&format!("{tag}-ranked"), &ranks);
        assert_rel(&format!("{schedule} losses"), &ranked, &one, 1e-5);
    }
}

/// `--dump-grads` on 2 replicas × 2 stages × 2 tensor-parallel ranks writes the whole
/// gradients of the first update, as one device does: each stage's gathered from its
/// tensor-parallel blocks and sent to rank 0, every tensor within 1e-5 of its largest (the
/// replicas' and micro-batches' sums and the row-parallel products reassociate), the loss
/// within 1e-6 relative. The same under optimizer sharding at levels 2 and 3, whose ranks hold
/// only their slices of the reduce-scattered gradients: the dump gathers them first.
#[test]
fn a_gradient_dump_of_stages_and_tensor_ranks_is_one_device_s() {
    let dir = TestDir::new("pipeline-dump-grads");
    let data = random_tokens(&dir, 16, 8, 5);
    let flags = llama_flags();
    let dump = |src: &Path, tag: &str, extra: &[&str]| {
        let grads = dir.path(&format!("{tag}-grads"));
        let args = [
            "--init-seed",
            "2",
            "--steps",
            "1",
            "--dump-grads",
            s(&grads),
        ];
        train_metrics(
            &dir,
            (src, &flags),
            &data,
            tag,
            &[&args[..], extra].concat(),
        );
        grads
    };
    let (src, _) = llama_source_in(&dir, "mix.msl", MIX, 2);
    let one = dump(&src, "one", &[]);
    let want = tensors_of(&one.join("grads.safetensors"));
    let names = |t: &[(String, Vec<f64>)]| t.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert!(want.iter().any(|(n, _)| n.ends_with("down_proj.weight")));
    for level in ["", "level2", "level3"] {
        let decls = match level {
            "" => MIX.to_string(),
            _ => MIX.replace(
                "schedule: 1f1b }",
                &format!("schedule: 1f1b }}\n    optimizer_shard = {level}"),
            ),
        };
        let (src, _) = llama_source_in(&dir, &format!("mix{level}.msl"), &decls, 2);
        let eight = dump(&src, &format!("eight{level}"), &["--ranks", "8"]);
        let got = tensors_of(&eight.join("grads.safetensors"));
        assert_eq!(names(&got), names(&want), "{level}");
        for ((name, g), (_, w)) in got.iter().zip(&want) {
            assert_rel_to_max(&format!("{level} {name}"), g, w, 1e-5);
        }
        let loss = |d: &Path| npy_f64(&d.join("loss.npy"));
        assert_rel(&format!("{level} loss"), &loss(&eight), &loss(&one), 1e-6);
    }
}

/// A weight two stages both train (GPT-2's logits read the input embedding's table) is a copy
/// on each stage whose gradients the stages sum: ten steps on the tiny LLaMA's two stages
/// (1F1B over 4 micro-batches) give one device's losses within 1e-5 relative and — gathered,
/// the table once — its weights and momentum within 1e-4 of each tensor's largest. (SGD with
/// momentum: AdamW's `m / √v` would blow up the rounding noise of GPT-2's key bias, whose
/// gradient is exactly zero, as softmax ignores a shift of every score of a query.)
/// `mslc build` writes both stages' programs, and `ranks.json` says which stages tie what.
#[test]
fn a_weight_tied_across_stages_trains_as_on_one_device() {
    let stages = tied_training_parity("pipeline-tied", 2);
    for stage in &stages {
        let tied = serde_json::json!([{ "parameter": "wte.weight", "stages": [0, 1] }]);
        assert_eq!(stage["tied"], tied, "{stage}");
    }
}

/// The same on three stages (a layer each): the first and the last hold the table, the middle
/// one takes no part in summing its gradients.
#[test]
fn a_weight_tied_across_non_adjacent_stages_trains_as_on_one_device() {
    let stages = tied_training_parity("pipeline-tied-3", 3);
    let tied = serde_json::json!([{ "parameter": "wte.weight", "stages": [0, 2] }]);
    assert_eq!(stages[0]["tied"], tied);
    assert_eq!(stages[1]["tied"], serde_json::json!([]));
    assert_eq!(stages[2]["tied"], tied);
}

/// Trains the tiny GPT-2 ([`TIED`], one layer per stage) on one device and on `stages`
/// pipeline stages and asserts what [`a_weight_tied_across_stages_trains_as_on_one_device`]
/// says; then builds it: the per-stage entries of `ranks.json`.
fn tied_training_parity(tag: &str, stages: usize) -> Vec<serde_json::Value> {
    let dir = TestDir::new(tag);
    let example =
        std::fs::read_to_string(crate::exec::common::root().join("examples/gpt2.msl")).unwrap();
    let model_end = example.find("precision Mixed").expect("the model part");
    let src = dir.path("tied.msl");
    let decls = TIED
        .replace("pp: 2", &format!("pp: {stages}"))
        .replace("stages: 2", &format!("stages: {stages}"));
    std::fs::write(&src, format!("{}{decls}", &example[..model_end])).unwrap();
    let layers = format!("layers={stages}");
    let sizes: Vec<&str> = TIED_SIZES
        .split_whitespace()
        .map(|a| if a == "layers=2" { &layers } else { a })
        .collect();
    assert!(sizes.contains(&layers.as_str()));
    let ranks = stages.to_string();
    let data = random_tokens(&dir, 16, 8, 3);
    let run = |tag: &str, extra: &[&str]| {
        let grads = dir.path(&format!("{tag}-grads"));
        let seeded = [
            "--init-seed",
            "0",
            "--steps",
            "10",
            "--dump-grads",
            s(&grads),
        ];
        let rows = train_metrics(
            &dir,
            (&src, &sizes),
            &data,
            tag,
            &[&seeded[..], extra].concat(),
        );
        (column(&rows, "loss"), column(&rows, "grad_norm"))
    };
    let (one, two) = (dir.path("one"), dir.path("two"));
    let (losses, norms) = run("one", &[]);
    assert_eq!(losses.len(), 10);
    let (staged_losses, staged_norms) = run("two", &["--ranks", &ranks]);
    assert_rel("losses", &staged_losses, &losses, 1e-5);
    // The table's gradient counted once in the global norm.
    assert_rel("gradient norms", &staged_norms, &norms, 1e-5);
    crate::ranks::assert_same_final_weights(&one, &two, ADAMW_WEIGHTS_TOL);
    let state = |d: &Path| {
        crate::train::safetensor_f64(
            &d.join("step-10/optimizer.safetensors"),
            "wte.weight.momentum_buffer",
        )
    };
    assert_rel(
        "the tied table's momentum",
        &state(&two),
        &state(&one),
        1e-4,
    );
    // The first update's gradients, gathered from the stages: the table's once, summed.
    let table = |tag: &str| {
        let grads = dir.path(&format!("{tag}-grads")).join("grads.safetensors");
        crate::train::safetensor_f64(&grads, "wte.weight")
    };
    assert_rel_to_max(
        "the tied table's gradient",
        &table("two"),
        &table("one"),
        1e-5,
    );

    let out = dir.path("out");
    let mut args = vec!["build", s(&src), "-o", s(&out)];
    args.extend(&sizes);
    let (code, stdout, stderr) = mslc(&args);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let last = format!("Tied.stage{}.update.mir", stages - 1);
    assert!(out.join(last).exists(), "{stdout}");
    let ranks: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("Tied.ranks.json")).unwrap())
            .unwrap();
    let entries = ranks["pipeline"]["stages"].as_array().unwrap().clone();
    assert_eq!(entries.len(), stages);
    entries
}

/// A knowledge base's choices reach every stage, the first too (which once ran its defaults
/// while the summary counted its tuned signatures): a GEMM blocking recorded for one of the
/// first stage's matmuls (its signature from `mslc build`'s kernel table of that stage) shows
/// in rank 0's `--profile` trace of its step.
#[test]
fn a_knowledge_base_reaches_the_first_stage() {
    let dir = TestDir::new("pipeline-tuned");
    let (src, _) = llama_source_in(&dir, "pp.msl", PP, 2);
    let built = dir.path("built");
    let mut args = vec!["build", s(&src), "--entry", "Pretrain", "-o", s(&built)];
    args.extend(llama_flags());
    let (code, stdout, stderr) = mslc(&args);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let table: toml::Value = toml::from_str(
        &std::fs::read_to_string(built.join("Pretrain.stage0.rank.kernels.toml")).unwrap(),
    )
    .unwrap();
    let signature = table["kernel"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|k| k["signature"].as_str())
        .find(|sig| sig.starts_with("matmul("))
        .expect("a matmul on the first stage")
        .to_string();
    let kb = knowledge_base(gemm_blocking(&signature, 1, 16), serde_json::json!([]));
    let db = dir.path("kb.json");
    std::fs::write(&db, kb.to_string()).unwrap();
    let data = random_tokens(&dir, 8, 8, 3);
    let trace = dir.path("trace.json");
    let mut args = vec!["train", s(&src), "--data", s(&data), "--init-seed", "0"];
    args.extend(llama_flags());
    args.extend(["--steps", "1", "--ranks", "2", "--threads", "1"]);
    args.extend(["--tune-db", s(&db), "--profile", s(&trace)]);
    let (code, stdout, stderr) = mslc(&args);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stdout.contains("tuning:  "), "{stdout}");
    let trace: serde_json::Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let blockings: Vec<i64> = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["args"]["kernel"] == "gemm")
        .filter_map(|e| e["args"]["params"]["mc"].as_i64())
        .collect();
    assert!(!blockings.is_empty(), "no GEMM in rank 0's trace");
    assert!(
        blockings.contains(&16),
        "rank 0 ran none of its GEMMs with the recorded blocking: {blockings:?}"
    );
}
