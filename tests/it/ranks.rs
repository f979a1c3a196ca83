//! `mslc train --ranks N`: a data-parallel plan run on N ranks (threads of one process, the
//! threads backend of the collectives) gives, step for step, the losses and final weights of
//! the same train on one device — the parity the sharded program must keep — and a world
//! that does not match the plan, or a layout the executor does not run, is a coded refusal.

use std::path::{Path, PathBuf};

use mslc_io::npy::{write_npy, NpyArray};
use mslc_io::safetensors::SafetensorsFile;

use crate::exec::common::{mslc, root, s, token_file, Rng, TestDir};
use crate::tolerance::{assert_same_weights, ADAMW_WEIGHTS_TOL, WEIGHTS_NORM_TOL};
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

/// Trains `steps` steps of `source` with `extra` flags into `out` (on one thread per rank
/// unless they say otherwise), returning the losses.
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
    ];
    let threads: &[&str] = match extra.contains(&"--threads") {
        true => &[],
        false => &["--threads", "1"],
    };
    let (code, stdout, stderr) = mslc(&[&args[..], threads, extra].concat());
    assert_eq!(code, 0, "{stdout}{stderr}");
    metric_losses(&metrics)
}

/// Every tensor of a safetensors file, by name, as f64.
pub(crate) fn tensors_of(file: &Path) -> Vec<(String, Vec<f64>)> {
    let file = file.to_path_buf();
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

/// Asserts the final checkpoints `one/step-10` and `two/step-10` hold the same weights, each
/// tensor within `tol` of its largest magnitude element by element and within 1e-5 in norm
/// ([`assert_same_weights`]).
pub(crate) fn assert_same_final_weights(one: &Path, two: &Path, tol: f64) {
    assert_same_tensors(
        one,
        two,
        "model.safetensors",
        tol,
        |name, got, want, tol| assert_same_weights(name, got, want, (tol, WEIGHTS_NORM_TOL)),
    );
}

/// Asserts `FILE` of the final checkpoints `one/step-10` and `two/step-10` holds the same
/// tensors, each compared by `same` with `tol`.
fn assert_same_tensors(
    one: &Path,
    two: &Path,
    file: &str,
    tol: f64,
    same: fn(&str, &[f64], &[f64], f64),
) {
    let (w1, w2) = (
        tensors_of(&one.join("step-10").join(file)),
        tensors_of(&two.join("step-10").join(file)),
    );
    assert_eq!(
        w1.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        w2.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
    for ((name, a), (_, b)) in w1.iter().zip(&w2) {
        same(name, b, a, tol);
    }
}

/// Trains 10 steps of `src` on one device into `DIR/one` and on two ranks into `DIR/two`, and
/// asserts the same losses and final weights (within 1e-5); the two output directories.
fn two_ranks_match_one_device(dir: &TestDir, src: &Path, data: &Path) -> (PathBuf, PathBuf) {
    let (one, two) = (dir.path("one"), dir.path("two"));
    let single = train(src, data, &one, "10", &[]);
    let ranked = train(src, data, &two, "10", &["--ranks", "2"]);
    assert_eq!(single.len(), 10);
    assert_rel("losses", &ranked, &single, 1e-5);
    assert_same_final_weights(&one, &two, 1e-5);
    (one, two)
}

/// Ten steps of `model` (its model part over token ids below 64, `Tp` its two-rank policy)
/// trained as `Fit` with `optimizer` on batches of 2, on one device and on two ranks, from
/// the same random tokens: the same losses and weights (within 1e-5).
fn tokens_on_two_ranks_match_one_device(dir: &TestDir, model: &str, name: &str, optimizer: &str) {
    let src = dir.path("model.msl");
    let train = format!(
        "
train Fit for {name} {{
    labels: i32[B, S]
    loss = cross_entropy(logits, labels)
    optimizer = {optimizer}
    batch = 2
    parallel = Tp
    target = std.targets.cpu
}}
"
    );
    std::fs::write(&src, format!("{model}{train}")).unwrap();
    let data = token_file(dir, [16, 9], 64.0, 5);
    two_ranks_match_one_device(dir, &src, &data);
}

/// Head-parallel attention written out op by op (std.llm's `DotProductAttention`, as BERT and
/// GPT-2 use it): `q @ kᵀ` and `weights @ v` multiply operands split along the same head dim
/// and the softmax runs along the keys, so each rank computes its own heads. Ten steps on two
/// tensor-parallel ranks equal one device's (losses and weights within 1e-5). Before, the
/// softmax gathered every head and the product of weights and values was refused (E0972).
#[test]
fn explicit_attention_runs_head_parallel_on_two_ranks() {
    let dir = TestDir::new("ranks-explicit-attention");
    let text = "import std.llm.{SplitHeads, MergeHeads, DotProductAttention}
import std.nn.{Embedding, LayerNorm, Linear, LinearBias}

model Heads {
    const vocab = 64, hidden = 32, heads = 4
    dims B = 2, S = 8
    input tokens: i32[B, S]
    let x = embed: Embedding(tokens, vocab, hidden)
    let q = query: Linear(x, hidden) |> SplitHeads(heads)
    let k = key: Linear(x, hidden) |> SplitHeads(heads)
    let v = value: Linear(x, hidden) |> SplitHeads(heads)
    let ctx = DotProductAttention(q, k, v, causal: true) |> MergeHeads()
    x = norm: LayerNorm(x + dense: Linear(ctx, hidden))
    output logits = head: LinearBias(x, vocab)
}

parallel Tp {
    mesh = { mp: 2 }
    mode = semi_auto
    shard \"{query,key,value}.weight\" = [mp, _]
    shard \"dense.weight\" = [_, mp]
}
";
    tokens_on_two_ranks_match_one_device(&dir, text, "Heads", "adamw(lr: 1e-2)");
}

/// A Megatron GPT layer (std.llm's `GptLayer`, as examples/gpt3_175b.msl builds it): one fused
/// `query_key_value` projection split by whole heads, q, k and v sliced out of it along the
/// head's last dim, dropout over split features, a GeLU MLP. Ten steps on two tensor-parallel
/// ranks equal one device's (losses and weights within 1e-5). Before, the slices gathered
/// every head and the row-parallel `dense` was refused (E0972). SGD, not AdamW: the key bias
/// shifts a query's scores by one constant, so its exact gradient is zero and AdamW would
/// turn each ordering's rounding noise (1e-9) into steps of 1e-4.
#[test]
fn a_fused_qkv_gpt_layer_runs_tensor_parallel_on_two_ranks() {
    let dir = TestDir::new("ranks-fused-qkv");
    let text = "import std.llm.GptLayer
import std.nn.{Embedding, LayerNorm, LinearBias}

model Gpt {
    const vocab = 64, hidden = 32, heads = 4
    dims B = 2, S = 8
    input tokens: i32[B, S]
    let x = layers[0]: GptLayer(embed: Embedding(tokens, vocab, hidden), heads, 4 * hidden)
    output logits = head: LinearBias(norm: LayerNorm(x), vocab)
}

parallel Tp {
    mesh = { mp: 2 }
    mode = semi_auto
    shard \"**.query_key_value.weight\" = [mp, _]
    shard \"**.query_key_value.bias\" = [mp]
    shard \"**.self_attention.dense.weight\" = [_, mp]
    shard \"**.dense_h_to_4h.weight\" = [mp, _]
    shard \"**.dense_h_to_4h.bias\" = [mp]
    shard \"**.dense_4h_to_h.weight\" = [_, mp]
}
";
    tokens_on_two_ranks_match_one_device(&dir, text, "Gpt", "sgd(lr: 0.1, momentum: 0.9)");
}

/// A distillation loss, two `mse_loss`es added (examples/bert_base.msl's `Distill`), is a mean
/// over the samples, so each of two data-parallel replicas weighs its own by half: ten steps
/// on two ranks equal one device's (losses and weights within 1e-5). Before, only a single
/// `cross_entropy`, `mse_loss` or `mean` ran data parallel (E0971).
#[test]
fn a_sum_of_mse_losses_runs_data_parallel_on_two_ranks() {
    let dir = TestDir::new("ranks-sum-of-means");
    let src = dir.path("distill.msl");
    let text = "import std.nn.LinearBias

model Net {
    dims B = 8
    input x: f32[B, 6]
    let h = relu(hidden: LinearBias(x, 16))
    output a = out_a: LinearBias(h, 4)
    output b = out_b: LinearBias(h, 3)
}

parallel P {
    mesh = { dp: 2 }
    mode = data
}

train Fit for Net {
    ta: f32[B, 4]
    tb: f32[B, 3]
    loss = mse_loss(a, ta) + mse_loss(b, tb)
    optimizer = adamw(lr: 1e-2, weight_decay: 0.1)
    batch = 8
    parallel = P
    target = std.targets.cpu
}
";
    std::fs::write(&src, text).unwrap();
    let data = dir.path("data");
    std::fs::create_dir_all(&data).unwrap();
    let mut rng = Rng(13);
    for (name, width) in [("x", 6), ("ta", 4), ("tb", 3)] {
        let values = rng.vec(SAMPLES * width, -1.0, 1.0);
        let array = NpyArray::from_f32(vec![SAMPLES, width], &values).unwrap();
        write_npy(data.join(format!("{name}.npy")), &array).unwrap();
    }
    two_ranks_match_one_device(&dir, &src, &data);
}

#[test]
fn data_parallel_on_two_ranks_matches_one_device() {
    let dir = TestDir::new("ranks-dp");
    let src = source(&dir, DATA, 4);
    let data = write_data(&dir);
    let (one, two) = two_ranks_match_one_device(&dir, &src, &data);
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

/// Dynamic loss scaling with optimizer sharding at level 2, where each replica holds slices
/// of the gradients: the overflow check sums over the replicas, so both ranks end the same
/// runs at their update's guard (one stopping alone would leave the other waiting in the
/// update's all-gather), the scale follows MindSpore's manager, and a skipped step changes no
/// weight or optimizer state (the checkpoints, gathered, byte for byte). (Which steps
/// overflow differs from one device's: in f16 a replica's gradients sum half the samples.)
#[test]
fn dynamic_loss_scaling_skips_whole_steps_on_sharded_ranks() {
    let dir = TestDir::new("ranks-zero-dynamic");
    let level2 = format!("{DATA}\n    optimizer_shard = level2");
    let src = source(&dir, &level2, 4);
    let init = 262_144.0;
    let mixed = std::fs::read_to_string(&src)
        .unwrap()
        .replace(
            "train Fit",
            "precision Mixed {\n    level = O2\n    compute = f16\n    \
             loss_scale = dynamic(init: 262144, factor: 2, window: 3)\n}\n\ntrain Fit",
        )
        .replace("batch = 8\n", "batch = 8\n    precision = Mixed\n");
    std::fs::write(&src, mixed).unwrap();
    let data = write_data(&dir);
    let out = dir.path("two");
    let steps = ["--ranks", "2", "--save-every", "1"];
    train(&src, &data, &out, "10", &steps);
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(out.with_extension("jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let overflows: Vec<bool> = rows
        .iter()
        .map(|r| r["skipped"].as_bool().unwrap())
        .collect();
    let scales: Vec<f64> = rows
        .iter()
        .map(|r| r["loss_scale"].as_f64().unwrap())
        .collect();
    assert!(overflows[0] && overflows.contains(&false), "{overflows:?}");
    assert_eq!(
        scales,
        crate::train_amp::mindspore_scales(init, 2.0, 3, &overflows)
    );
    for k in 2..=overflows.len() {
        for name in ["model", "optimizer"] {
            let file = |k: usize| std::fs::read(out.join(format!("step-{k}/{name}.safetensors")));
            let same = file(k - 1).unwrap() == file(k).unwrap();
            assert_eq!(same, overflows[k - 1], "step {k} ({name})");
        }
    }
}

#[test]
fn data_parallel_with_accumulation_on_two_ranks_matches_one_device() {
    // Each replica sums its two micro-batches' gradients unreduced; the update all-reduces the
    // sums once (a skipped micro-batch's run stops at its sums, before any all-reduce).
    let dir = TestDir::new("ranks-dp-accum");
    let src = source(&dir, DATA, 2);
    let text = std::fs::read_to_string(&src).unwrap();
    std::fs::write(&src, text.replace("batch = 8", "batch = 8, grad_accum = 2")).unwrap();
    let data = write_data(&dir);
    // No label ignored: a micro-batch of 4 whose labels are all ignored has a NaN loss (as
    // PyTorch's mean over none), which the metrics would carry.
    let labels: Vec<i64> = (0..SAMPLES as i64)
        .map(|i| i * 3 % CLASSES as i64)
        .collect();
    write_npy(
        data.join("labels.npy"),
        &NpyArray::from_i64(vec![SAMPLES], &labels).unwrap(),
    )
    .unwrap();
    two_ranks_match_one_device(&dir, &src, &data);
}

/// Under accumulation the replicas all-reduce each gradient sum once, in the update: in the
/// one-program step, a `dp` all-reduce reads every `PATH.grad_accum` output (the replica's own
/// sum); on the tiny LLaMA example's pipeline, a stage's step holds no `dp` all-reduce and its
/// update one per parameter.
#[test]
fn accumulated_gradients_are_all_reduced_once_per_update() {
    use mslc_core::ops::Op;
    let over_dp = |m: &mslc_artifact::Module| -> Vec<u32> {
        let steps = m.steps.iter().filter(|s| s.op == Op::AllReduce);
        let dp = steps.filter(|s| s.attrs.str("axis").is_ok_and(|a| a == "dp"));
        dp.map(|s| s.inputs[0]).collect()
    };
    let build = |src: &Path, entry: &str, out: &Path| {
        let (code, stdout, stderr) = mslc(&["build", s(src), "--entry", entry, "-o", s(out)]);
        assert_eq!(code, 0, "{stdout}{stderr}");
    };
    let dir = TestDir::new("ranks-accum-program");
    let src = source(&dir, DATA, 2);
    let text = std::fs::read_to_string(&src).unwrap();
    std::fs::write(&src, text.replace("batch = 8", "batch = 8, grad_accum = 2")).unwrap();
    build(&src, "Fit", &dir.path("one"));
    let (step, _, _) = rank_program(&dir.path("one"), "Fit");
    let reduced = over_dp(&step);
    let sums: Vec<_> = (step.outputs.iter())
        .filter(|(name, _)| name.ends_with(".grad_accum"))
        .collect();
    assert_eq!(sums.len(), 4, "hidden and head, weight and bias");
    for (name, v) in sums {
        assert!(reduced.contains(v), "`{name}` is not all-reduced");
    }

    let example = root().join("examples/tiny_llama.msl");
    let out = dir.path("pipeline");
    build(&example, "Pretrain", &out);
    let program = |file: &str| {
        let bytes = std::fs::read(out.join(format!("Pretrain.stage0.{file}.mir"))).unwrap();
        mslc_artifact::decode(&bytes).unwrap().module
    };
    assert_eq!(over_dp(&program("rank")), Vec::<u32>::new());
    let update = program("update");
    assert_eq!(over_dp(&update).len(), update.params().count());
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
    // At the mesh that sets the device count, with the two ways out.
    assert!(stderr.contains("this mesh has 2 device(s)"), "{stderr}");
    assert!(stderr.contains("start 2 rank(s) (`--ranks 2`"), "{stderr}");
    // A model without a train runs on one device, and says so at the model.
    let alone = dir.path("alone.msl");
    let text = "import std.nn.Linear\nmodel M {\n    dims B = 4\n    input x: f32[B, 8]\n    \
                output y = l: Linear(x, 4)\n}\n";
    std::fs::write(&alone, text).unwrap();
    let (code, _, stderr) = mslc(&["run", s(&alone), "--init-seed", "0", "--ranks", "2"]);
    assert_eq!(code, 2, "{stderr}");
    assert_eq!(stderr.matches("E0970").count(), 1, "{stderr}");
    assert!(stderr.contains("alone.msl:2:7"), "{stderr}");
    assert!(stderr.contains("without a `train`"), "{stderr}");
    let tensor = "mesh = { mp: 2 }\n    mode = semi_auto\n    shard \"hidden.weight\" = [mp, _]";
    let src = source(&dir, tensor, 8);
    let args = ["train", s(&src), "--init-seed", "0", "--data", s(&data)];
    let (code, _, stderr) = mslc(&[&args[..], &["--ranks", "2"]].concat());
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("E0972"), "{stderr}");
}

/// `--mpi` (one rank per process, tests/mpi_train.rs) is not `--ranks` as well, a build
/// without the cargo feature `mpi` says which build it needs, and `--collective-timeout` is
/// for ranks, in positive seconds.
#[test]
fn mpi_is_its_own_launcher() {
    let dir = TestDir::new("ranks-mpi-flag");
    let data = write_data(&dir);
    let src = source(&dir, DATA, 4);
    let args = ["train", s(&src), "--init-seed", "0", "--data", s(&data)];
    let (code, _, stderr) = mslc(&[&args[..], &["--ranks", "2", "--mpi"]].concat());
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("not both"), "{stderr}");
    // The collective timeout is for ranks, and a positive time.
    for (extra, says) in [
        (
            &["--collective-timeout", "5"][..],
            "for the ranks of --ranks or --mpi",
        ),
        (
            &["--ranks", "2", "--collective-timeout", "0"][..],
            "positive number",
        ),
        (
            &["--ranks", "2", "--collective-timeout=-1"][..],
            "positive number",
        ),
    ] {
        let (code, _, stderr) = mslc(&[&args[..], extra].concat());
        assert_eq!(code, 2, "{extra:?}: {stderr}");
        assert!(stderr.contains(says), "{extra:?}: {stderr}");
    }
    let (code, stdout, stderr) =
        mslc(&[&args[..], &["--ranks", "2", "--collective-timeout", "30"]].concat());
    assert_eq!(code, 0, "{stdout}{stderr}");
    if !cfg!(feature = "mpi") {
        let (code, _, stderr) = mslc(&[&args[..], &["--mpi"]].concat());
        assert_eq!(code, 2, "{stderr}");
        assert!(stderr.contains("the `mpi` feature"), "{stderr}");
    }
    // One of several processes an MPI launcher started, without --mpi, must not train alone.
    for var in ["PMI_SIZE", "OMPI_COMM_WORLD_SIZE"] {
        let out = crate::support::mslc_command(&args)
            .current_dir(root())
            .env(var, "2")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains(&format!("({var}=2)")) && stderr.contains("add --mpi"),
            "{stderr}"
        );
    }
}

/// examples/tiny_llama.msl's model (2 layers, hidden 32, vocab 64, S = 8) trained in f32 with
/// AdamW on batches of 4 sequences, data parallel over 2 ranks against one device; and against
/// one device accumulating the same two halves of each batch (`grad_accum = 2`), whose final
/// weights are the ranks' bit for bit: the replicas' gradients are summed in replica order, as
/// the micro-batches' are, so what separates the ranks from one device on the whole batch is
/// the accumulation's own rounding.
#[test]
fn tiny_llama_data_parallel_on_two_ranks_matches_one_device() {
    let dir = TestDir::new("ranks-llama");
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
    let src = tiny_llama_with(&dir, "llama.msl", decl);
    let data = random_tokens(&dir, 12, 8, 17);
    let sets = llama_flags();
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
    assert_same_final_weights(&one, &two, ADAMW_WEIGHTS_TOL);
    let halves = decl.replace("batch = 4", "batch = 4, grad_accum = 2");
    assert_ne!(halves, decl);
    let halves = tiny_llama_with(&dir, "halves.msl", &halves);
    let accumulating = dir.path("accumulating");
    let accumulated = train(&halves, &data, &accumulating, "10", &sets);
    // The weights are the same bits; a step's reported loss is combined from its halves'
    // in another order (the replicas' all-reduced, the micro-batches' summed), ~1 ulp.
    assert_rel("losses of grad_accum = 2", &ranked, &accumulated, 1e-7);
    assert_same_final_weights(&accumulating, &two, 0.0);
}

/// Data parallelism overlaps each gradient's all-reduce with the rest of the backward (the
/// executor hands it to the rank's communication thread, and the schedule moves what reads the
/// reduced gradient — its unscaling, overflow check and square sum — to where it is consumed)
/// and changes no bit: in f32 and under f16 with dynamic loss scaling, rank 0's profile has
/// gradients' all-reduces on the communication track, and the losses and final weights
/// are those of a run whose collectives all block (`--check-numerics` runs them on the step's
/// thread), byte for byte.
#[test]
fn gradient_all_reduces_overlap_the_backward_and_change_no_bit() {
    let dir = TestDir::new("ranks-overlap");
    let mixed = "precision Mixed {
    level = O2
    compute = f16
    keep_f32 = [rms_norm, softmax, cross_entropy]
    loss_scale = dynamic(init: 1024, factor: 2, window: 2)
}
";
    // The example's sizes (hidden 256), 2 layers: a backward long enough for the
    // communication thread to take the all-reduces before the step's thread needs them.
    let data = random_tokens(&dir, 8, 32, 21);
    let sets = ["--set", "layers=2", "--dim", "S=32"];
    for (name, precision) in [("f32", ""), ("mixed", "precision = Mixed, ")] {
        let decl = format!(
            "{mixed}
parallel P {{
    mesh = {{ dp: 2 }}
    mode = data
}}

train Pretrain for TinyLlama {{
    labels: i32[B, S]
    loss = cross_entropy(logits, labels)
    optimizer = adamw(lr: 1e-2, betas: (0.9, 0.95), weight_decay: 0.1)
    batch = 4
    {precision}parallel = P
    target = std.targets.cpu
}}
"
        );
        let src = tiny_llama_with(&dir, &format!("{name}.msl"), &decl);
        let (overlapped, blocking) = (
            dir.path(&format!("{name}-o")),
            dir.path(&format!("{name}-b")),
        );
        let profile = dir.path(&format!("{name}.trace.json"));
        // Two threads per rank: a rank on one overlaps nothing (its thread is never idle).
        let ranks = [&sets[..], &["--ranks", "2", "--threads", "2"]].concat();
        let with_profile = [&ranks[..], &["--profile", s(&profile)]].concat();
        let fast = train(&src, &data, &overlapped, "4", &with_profile);
        let checked = [&ranks[..], &["--check-numerics"]].concat();
        let slow = train(&src, &data, &blocking, "4", &checked);
        assert_eq!(fast, slow, "{name}: losses");
        let weights = |out: &Path| std::fs::read(out.join("step-4/model.safetensors")).unwrap();
        assert!(
            weights(&overlapped) == weights(&blocking),
            "{name}: final weights differ"
        );
        let trace: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&profile).unwrap()).unwrap();
        let events = trace["traceEvents"].as_array().unwrap();
        let track = events
            .iter()
            .find(|e| {
                e["name"] == "thread_name"
                    && e["args"]["name"]
                        .as_str()
                        .is_some_and(|n| n.starts_with("communication"))
            })
            .map(|e| e["tid"].clone())
            .unwrap_or_else(|| panic!("{name}: no communication track in the profile"));
        let on_track: Vec<&str> = events
            .iter()
            .filter(|e| e["ph"] == "X" && e["tid"] == track)
            .map(|e| e["name"].as_str().unwrap())
            .collect();
        // At most every gradient's but the last the backward computes (the embedding's, which
        // no step follows to overlap with); one the communication thread had not taken when
        // the step's thread needed it ran on the step's thread instead. On an idle machine
        // most are overlapped (20 of 21 here); beside other tests on 2 cores the
        // communication thread can lose its core for milliseconds, so the test asks for some.
        let params = tensors_of(&overlapped.join("step-4/model.safetensors")).len();
        let gradients = (on_track.iter())
            .filter(|n| n.ends_with("#grad#grad"))
            .count();
        eprintln!("{name}: {gradients} of {params} gradients' all-reduces overlapped");
        assert!(
            gradients >= 1 && gradients < params,
            "{name}: {gradients} of {params} overlapped: {on_track:?}"
        );
        assert!(
            on_track.iter().all(|n| n.starts_with("all_reduce")),
            "{name}: {on_track:?}"
        );
    }
}

/// A rank on one worker thread keeps its all-reduces blocking (that thread is never idle, so a
/// communication thread could only take time from it): its profile has no communication track,
/// where the same train on two threads per rank overlaps
/// ([`gradient_all_reduces_overlap_the_backward_and_change_no_bit`]).
#[test]
fn a_rank_on_one_thread_keeps_its_all_reduces_blocking() {
    let dir = TestDir::new("ranks-one-thread");
    let fields = "optimizer = adamw(lr: 1e-2)\n    batch = 4";
    let src = llama_zero_source(&dir, "one", "none", fields);
    let data = random_tokens(&dir, 8, 32, 21);
    let profile = dir.path("one.trace.json");
    let sets = ["--set", "layers=2", "--dim", "S=32", "--ranks", "2"];
    let with_profile = [&sets[..], &["--profile", s(&profile)]].concat();
    train(&src, &data, &dir.path("one"), "2", &with_profile);
    let trace = std::fs::read_to_string(&profile).unwrap();
    assert!(
        !trace.contains("communication ("),
        "a rank on one thread overlapped its all-reduces"
    );
    assert!(trace.contains("all_reduce"));
}

/// examples/tiny_llama.msl's model followed by `decls`, written as `file` in `dir`.
fn tiny_llama_with(dir: &TestDir, file: &str, decls: &str) -> PathBuf {
    let example = std::fs::read_to_string(root().join("examples/tiny_llama.msl")).unwrap();
    let model_end = example.find("// f16 has").expect("the model part");
    let path = dir.path(file);
    std::fs::write(&path, format!("{}{decls}", &example[..model_end])).unwrap();
    path
}

/// The tiny LLaMA's sizes as `mslc` flags (tests/mpi_train.rs's too): 2 layers, hidden 32,
/// 4 heads, 2 kv heads, vocab 64; S = 8.
pub(crate) fn llama_flags() -> Vec<&'static str> {
    include_str!("../fixtures/tiny_llama_sizes.args")
        .split_whitespace()
        .collect()
}

/// examples/tiny_llama.msl's model ([`llama_flags`]) with the example's Megatron shard
/// patterns on a mesh of `mp: 2`, written in `dir`, and checked.
fn llama_tensor_parallel_in(dir: &TestDir) -> (PathBuf, mslc_check::Checked) {
    let decls = include_str!("../fixtures/tiny_llama_tp.msl-decls");
    // The train's batch of 2 on one device.
    llama_source_in(dir, "llama_tp.msl", decls, 2)
}

/// examples/tiny_llama.msl's model ([`llama_flags`]) followed by `decls`, written in `dir` as
/// `file`, and checked with the batch dim `B` = `batch`.
pub(crate) fn llama_source_in(
    dir: &TestDir,
    file: &str,
    decls: &str,
    batch: usize,
) -> (PathBuf, mslc_check::Checked) {
    let src = tiny_llama_with(dir, file, decls);
    let mut options = mslc_check::CheckOptions::default();
    for flag in llama_flags().chunks(2) {
        let (k, v) = flag[1].split_once('=').expect("NAME=VALUE");
        let overrides = match flag[0] {
            "--set" => &mut options.overrides.sets,
            _ => &mut options.overrides.dims,
        };
        overrides.insert(k.to_string(), v.to_string());
    }
    options
        .overrides
        .dims
        .insert("B".to_string(), batch.to_string());
    let checked = mslc_check::check_path(&src, &options);
    assert!(!checked.has_errors(), "{:?}", checked.diagnostics);
    (src, checked)
}

/// [`llama_tensor_parallel_in`] a scratch directory.
fn llama_tensor_parallel() -> mslc_check::Checked {
    llama_tensor_parallel_in(&TestDir::new("ranks-llama-tp")).1
}

/// The plan's splits of the tiny LLaMA and the tensor-parallel group of its 2 ranks.
fn llama_splits(
    checked: &mslc_check::Checked,
) -> (
    std::collections::BTreeMap<String, usize>,
    mslc_ir::shard::Group,
) {
    let train = &checked.decls.trains[0];
    let plan = mslc_driver::parallel::plan_train(checked, train)
        .expect("plans")
        .expect("a plan");
    assert_eq!(plan.devices, 2);
    let splits = mslc_driver::ranks::tensor_splits(&plan).unwrap();
    assert_eq!(
        splits.len(),
        2 * 7,
        "q, k, v, o, gate, up, down of 2 layers: {splits:?}"
    );
    let group = mslc_ir::shard::Group {
        axis: "tp".to_string(),
        ranks: 2,
    };
    (splits, group)
}

/// `n` rows of `seq + 1` random token ids below 64, from `seed`, as `DIR/tokens.npy` (the
/// language-model shorthand of `mslc train --data`).
pub(crate) fn random_tokens(dir: &TestDir, n: usize, seq: usize, seed: u64) -> std::path::PathBuf {
    let mut rng = Rng(seed);
    let tokens: Vec<i64> = (0..n * (seq + 1))
        .map(|_| (rng.uniform() * 64.0) as i64 % 64)
        .collect();
    let data = dir.path("tokens.npy");
    write_npy(
        &data,
        &NpyArray::from_i64(vec![n, seq + 1], &tokens).unwrap(),
    )
    .unwrap();
    data
}

pub(crate) fn compile_options() -> mslc_driver::compile::CompileOptions {
    mslc_driver::compile::CompileOptions {
        target: crate::exec::common::host(),
        verify: true,
        fuse: true,
        amp: None,
        unfused: Default::default(),
        updates: mslc_driver::compile::UpdatePlacement::Beside,
    }
}

/// The tiny LLaMA's training graph as one rank of its tensor-parallel group builds it, with
/// Megatron's sequence parallelism when `sequence`, differentiated for every parameter: per
/// collective op and direction (`true`: the backward), the bytes each one sends, in order; and
/// the graph as text.
fn llama_rank_collectives(
    sequence: bool,
) -> (
    std::collections::BTreeMap<(mslc_core::ops::Op, bool), Vec<u64>>,
    String,
) {
    let checked = llama_tensor_parallel();
    let (splits, group) = llama_splits(&checked);
    let model = checked.decls.trains[0].graph.as_ref().unwrap();
    let mut graph = mslc_driver::compile::lower_verified(model, &compile_options()).unwrap();
    let tensor = mslc_driver::train::TensorSplits {
        splits: &splits,
        group: &group,
        sequence_parallel: sequence,
    };
    assert_eq!(tensor.apply(&mut graph).unwrap().len(), splits.len());
    mslc_ir::verify(&graph).unwrap();
    let loss = graph.outputs.iter().find(|(n, _)| n == "loss").unwrap().1;
    let params: Vec<_> = graph
        .node_ids()
        .into_iter()
        .filter(|&id| matches!(graph.node(id).kind, mslc_ir::NodeKind::Param { .. }))
        .map(|node| mslc_ir::ValueRef { node, index: 0 })
        .collect();
    mslc_ir::backward(&mut graph, loss, &params).unwrap();
    mslc_ir::verify(&graph).unwrap();
    let mut out = std::collections::BTreeMap::<_, Vec<u64>>::new();
    for id in graph.topo_order().unwrap() {
        let node = graph.node(id);
        let Some(op) = node.op().filter(|&op| mslc_ir::shard::is_collective(op)) else {
            continue;
        };
        let input = graph.ty(graph.inputs(id)[0]);
        let bytes = mslc_core::ops::family::collective::payload_bytes(op, input);
        let backward = node.origin.ends_with("#grad");
        out.entry((op, backward)).or_default().push(bytes);
    }
    (out, mslc_ir::print::to_text(&graph))
}

/// Megatron's count: with q/k/v/gate/up column parallel and o/down row parallel, the training
/// graph of each rank has exactly two all-reduces per layer in the forward (after o and down,
/// each of the whole [2, 8, 32] stream) and two in the backward (the gradients of the copies in
/// front of q/k/v and gate/up).
#[test]
fn tiny_llama_tensor_parallel_has_two_all_reduces_per_layer_each_way() {
    use mslc_core::ops::Op;
    let (c, text) = llama_rank_collectives(false);
    assert_eq!(c[&(Op::AllReduce, false)], vec![2048; 4], "2 layers");
    assert_eq!(c[&(Op::AllReduce, true)].len(), 4, "2 layers");
    assert_eq!(c[&(Op::ParallelCopy, false)].len(), 4);
    assert_eq!(c.len(), 3, "{c:?}");
    assert!(
        text.contains("all_reduce(") && text.contains("@sends(2048 B)"),
        "{text}"
    );
}

/// Korthikanti et al.'s count under sequence parallelism: per layer the forward has two
/// all-gathers of the [2, 4, 32] sequence block (in front of q/k/v and gate/up) and two
/// reduce-scatters of the [2, 8, 32] partial sums (after o and down), the backward the other
/// way round; no activation is all-reduced. The residual stream is cut once after the
/// embedding (`rank_slice`, whose gradient gathers) and gathered once before the head (whose
/// gradient is this rank's block). What is all-reduced are the gradients of the five RMSNorm
/// scales, [32] each, which every rank sees only its positions of.
#[test]
fn tiny_llama_sequence_parallel_has_two_gathers_and_two_scatters_per_layer_each_way() {
    use mslc_core::ops::Op;
    let (c, _) = llama_rank_collectives(true);
    let count = |op: Op, backward: bool| c.get(&(op, backward)).map_or(0, Vec::len);
    let f: Vec<u64> = c[&(Op::AllGather, false)].clone();
    assert_eq!(
        f.iter().filter(|&&b| b == 1024).count(),
        5,
        "4 layers' f, the head: {f:?}"
    );
    assert_eq!(c[&(Op::ReduceScatter, false)], vec![2048; 4], "2 layers' g");
    assert_eq!(count(Op::ReduceScatter, true), 4, "the gradients of f");
    assert_eq!(
        count(Op::AllGather, true),
        4 + 1,
        "the gradients of g and of the cut"
    );
    assert_eq!(
        (count(Op::RankSlice, false), count(Op::RankSlice, true)),
        (1, 1)
    );
    assert_eq!(count(Op::AllReduce, false), 0);
    assert_eq!(
        c[&(Op::AllReduce, true)],
        vec![128; 5],
        "2 norms per layer and the final one"
    );
    assert_eq!(count(Op::ParallelCopy, false), 5, "the norms' scales");
}

/// The tensor-parallel forward on two ranks (threads, each holding its shards of q, k, v, o,
/// gate, up and down) gives the single-device logits within 1e-5 relative.
#[test]
fn tiny_llama_tensor_parallel_forward_matches_one_device() {
    use mslc_exec::collectives::{threads::world, Mesh};
    let checked = llama_tensor_parallel();
    let (splits, group) = llama_splits(&checked);
    let model = &checked.models[0];
    let options = compile_options();
    let single = mslc_driver::compile::compile(model, &options)
        .unwrap()
        .module;
    let mut graph = mslc_driver::compile::lower_verified(model, &options).unwrap();
    mslc_ir::shard::tensor::tensor_parallel(&mut graph, &splits, &group).unwrap();
    let per_rank = mslc_driver::compile::compile_graph(graph, &options)
        .unwrap()
        .module;
    let weights = crate::exec::common::random_weights(&single, 4);
    let mut rng = Rng(8);
    let tokens: Vec<i64> = (0..16)
        .map(|_| (rng.uniform() * 64.0) as i64 % 64)
        .collect();
    let tokens = NpyArray::from_i64(vec![2, 8], &tokens).unwrap();
    let run = |module: mslc_artifact::Module,
               weights: &[(String, Vec<usize>, Vec<u8>)],
               comm: Option<Box<dyn mslc_exec::collectives::Collectives>>| {
        let mut exec = crate::exec::common::executor(module, 1);
        if let Some(comm) = comm {
            exec.set_collectives(comm);
        }
        exec.load_weights(
            weights
                .iter()
                .map(|(n, s, d)| mslc_io::safetensors::TensorRef {
                    name: n,
                    dtype: mslc_io::safetensors::StDType::F32,
                    shape: s,
                    data: d,
                }),
        )
        .unwrap();
        exec.set_input("tokens", &tokens).unwrap();
        exec.run().unwrap();
        exec.output_f32("logits").unwrap().1
    };
    let want = run(single, &weights, None);
    let ranks = world(Mesh::line("tp", 2).unwrap());
    let got: Vec<Vec<f32>> = std::thread::scope(|scope| {
        let handles: Vec<_> = ranks
            .into_iter()
            .enumerate()
            .map(|(r, comm)| {
                let shards: Vec<_> = weights
                    .iter()
                    .map(|(name, shape, data)| match splits.get(name) {
                        Some(&d) => {
                            let (s, b) =
                                mslc_driver::ranks::shard_block(shape, data, d, r, 2).unwrap();
                            (name.clone(), s, b)
                        }
                        None => (name.clone(), shape.clone(), data.clone()),
                    })
                    .collect();
                let (module, run) = (per_rank.clone(), &run);
                scope.spawn(move || run(module, &shards, Some(Box::new(comm))))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let want: Vec<f64> = want.into_iter().map(f64::from).collect();
    for logits in got {
        let logits: Vec<f64> = logits.into_iter().map(f64::from).collect();
        assert_rel("tensor-parallel logits", &logits, &want, 1e-5);
    }
}

/// Ten AdamW steps (with clipping) of the tensor-parallel tiny LLaMA on two ranks give the
/// single-device losses within 1e-5 relative and, gathered into a full checkpoint by rank 0,
/// the same weights and optimizer states. Those are compared within 1e-4 relative per
/// tensor: the row-parallel products add their two halves in another order (fp32
/// reassociation, ~1e-7 relative), and AdamW's `m / √v` turns that into up to ~5e-5 of a
/// tensor's largest weight where an element's gradient is near zero (measured: the moments
/// agree to 2e-6, the worst weight differs by 9e-6).
#[test]
fn tiny_llama_tensor_parallel_training_matches_one_device() {
    tensor_parallel_training_parity("ranks-llama-tp-train", |text| text, "2", ADAMW_WEIGHTS_TOL);
}

/// [`tiny_llama_tensor_parallel_training_matches_one_device`] with Megatron's sequence
/// parallelism (the norms and residual adds on each rank's half of the sequence), within the
/// same tolerances: the reduce-scatters add the same two halves as the all-reduces did.
#[test]
fn tiny_llama_sequence_parallel_training_matches_one_device() {
    tensor_parallel_training_parity(
        "ranks-llama-sp-train",
        sequence_parallel,
        "2",
        ADAMW_WEIGHTS_TOL,
    );
}

/// [`tiny_llama_sequence_parallel_training_matches_one_device`] with dropout (p = 0.1) on
/// both residual branches of every layer, inside the sequence-split region: each rank draws
/// its half of the sequence's mask at the positions one device draws it, so the losses agree
/// within 1e-5 (a rank drawing by its block's own indices is 2e-2 off). The weights are
/// compared within 2e-4: the masks' zeros leave more gradients near zero, where AdamW's
/// `m / √v` amplifies the row-parallel reassociation (measured: 1.4e-4 of q_proj's largest
/// weight, the same without sequence parallelism).
#[test]
fn tiny_llama_sequence_parallel_with_dropout_matches_one_device() {
    let policy = |text: String| {
        let decls = &text[text.find("parallel TP").expect("the policy")..];
        sequence_parallel(format!(
            "{}\n{decls}",
            include_str!("../fixtures/drop_llama.msl")
        ))
    };
    tensor_parallel_training_parity("ranks-llama-sp-dropout", policy, "2", 2e-4);
}

/// The tiny LLaMA's tensor-parallel policy with `sequence_parallel = true`.
fn sequence_parallel(text: String) -> String {
    let mode = "mode = semi_auto";
    assert!(text.contains(mode));
    text.replace(mode, &format!("{mode}\n    sequence_parallel = true"))
}

/// [`tiny_llama_tensor_parallel_training_matches_one_device`] on a mesh of 2 data-parallel ×
/// 2 tensor-parallel ranks under optimizer sharding level 3: each rank holds half of its
/// tensor-parallel shard of every parameter and of its states (with the same tolerances: the
/// same row-parallel reassociation).
#[test]
fn tiny_llama_data_tensor_parallel_with_level3_matches_one_device() {
    tensor_parallel_training_parity(
        "ranks-llama-dp-tp-zero",
        data_and_level3,
        "4",
        ADAMW_WEIGHTS_TOL,
    );
}

/// [`tiny_llama_data_tensor_parallel_with_level3_matches_one_device`] with sequence
/// parallelism in each tensor-parallel group: a rank's block of the sequence is its place on
/// the `mp` axis of the 2 × 2 mesh.
#[test]
fn tiny_llama_data_sequence_parallel_with_level3_matches_one_device() {
    let policy = |text| sequence_parallel(data_and_level3(text));
    tensor_parallel_training_parity("ranks-llama-dp-sp-zero", policy, "4", ADAMW_WEIGHTS_TOL);
}

/// Checkpoints move between a tensor-parallel layout and one device: the tiny LLaMA on 2
/// data-parallel × 2 tensor-parallel ranks under optimizer sharding level 3 (each rank holds
/// half of its tensor-parallel block of every parameter and state) starts from the weights
/// `--init-seed` gives one device (its losses those of one device within 1e-5 relative), and
/// its whole checkpoint, and one device's, each resume on one device and on the 4 ranks —
/// each rank cutting its block, then its slice — to the losses one device continues with.
#[test]
fn tensor_parallel_checkpoints_resume_on_one_device_and_on_ranks() {
    let dir = TestDir::new("ranks-llama-tp-resume");
    let (src, _) = llama_tensor_parallel_in(&dir);
    let text = std::fs::read_to_string(&src).unwrap();
    std::fs::write(&src, data_and_level3(text)).unwrap();
    let data = random_tokens(&dir, 16, 8, 31);
    let run = |out: &str, steps: &str, extra: &[&str]| -> Vec<f64> {
        let out = dir.path(out);
        let metrics = out.with_extension("jsonl");
        let args = [
            "train",
            s(&src),
            "--data",
            s(&data),
            "--steps",
            steps,
            "--metrics",
            s(&metrics),
            "--output-dir",
            s(&out),
            "--threads",
            "1",
        ];
        let (code, stdout, stderr) = mslc(&[&args[..], &llama_flags(), extra].concat());
        assert_eq!(code, 0, "{stdout}{stderr}");
        metric_losses(&metrics)
    };
    let seed = ["--init-seed", "5"];
    let one = run("one", "6", &seed);
    let four = run("four", "6", &[&seed[..], &["--ranks", "4"]].concat());
    assert_eq!(one.len(), 6);
    assert_rel("losses from --init-seed on ranks", &four, &one, 1e-5);
    let from = |run: &str| dir.path(run).join("step-6");
    let continued = run("continued", "9", &["--resume", s(&from("one"))]);
    assert_eq!(continued.len(), 3);
    for (checkpoint, out, ranks) in [
        ("four", "four-on-one", None),
        ("four", "four-on-four", Some("4")),
        ("one", "one-on-four", Some("4")),
    ] {
        let checkpoint = from(checkpoint);
        let mut extra = vec!["--resume", s(&checkpoint)];
        extra.extend(ranks.map(|n| ["--ranks", n]).into_iter().flatten());
        let resumed = run(out, "9", &extra);
        assert_rel(&format!("losses of {out}"), &resumed, &continued, 1e-5);
    }
}

/// The tiny LLaMA's tensor-parallel policy on a mesh of 2 data-parallel × 2 tensor-parallel
/// ranks under optimizer sharding level 3, with a batch of 4.
fn data_and_level3(text: String) -> String {
    text.replace(
        "mesh = { mp: 2 }",
        "mesh = { dp: 2, mp: 2 }\n    optimizer_shard = level3",
    )
    .replace("batch = 2", "batch = 4")
}

/// Trains the tensor-parallel tiny LLaMA, its train rewritten by `policy`, 10 steps on one
/// device and on `ranks` ranks from the same whole weights, and compares losses (1e-5
/// relative), final weights and an optimizer state (`tol` relative per tensor).
fn tensor_parallel_training_parity(
    tag: &str,
    policy: impl Fn(String) -> String,
    ranks: &str,
    tol: f64,
) {
    let dir = TestDir::new(tag);
    let (src, checked) = llama_tensor_parallel_in(&dir);
    let text = std::fs::read_to_string(&src).unwrap();
    std::fs::write(&src, policy(text)).unwrap();
    llama_training_parity(&dir, (&src, &src), &checked, ranks, tol);
}

/// Trains the tiny LLaMA of `ranked` (checked as `checked`) 10 steps on `ranks` ranks and that
/// of `single` (the same model) on one device, from the same random whole weights, and
/// compares the losses (within 1e-5 relative, or `tol` when smaller), the final weights and an
/// optimizer state (within `tol`; 0: the same bits).
pub(crate) fn llama_training_parity(
    dir: &TestDir,
    (ranked, single_src): (&Path, &Path),
    checked: &mslc_check::Checked,
    ranks: &str,
    tol: f64,
) {
    let options = compile_options();
    let single = mslc_driver::compile::compile(&checked.models[0], &options)
        .unwrap()
        .module;
    let weights = dir.path("w.safetensors");
    crate::exec::common::write_weights(&weights, &crate::exec::common::random_weights(&single, 6));
    let data = random_tokens(dir, 8, 8, 23);
    let flags = [&["--weights", s(&weights)][..], &llama_flags()].concat();
    let run = |src: &Path, out: &Path, extra: &[&str]| -> Vec<f64> {
        let metrics = out.with_extension("jsonl");
        let args = [
            "train",
            s(src),
            "--data",
            s(&data),
            "--steps",
            "10",
            "--metrics",
            s(&metrics),
            "--output-dir",
            s(out),
            "--threads",
            "1",
        ];
        let (code, stdout, stderr) = mslc(&[&args[..], &flags, extra].concat());
        assert_eq!(code, 0, "{stdout}{stderr}");
        metric_losses(&metrics)
    };
    let (one, two) = (dir.path("one"), dir.path("two"));
    let single_losses = run(single_src, &one, &[]);
    let ranked_losses = run(ranked, &two, &["--ranks", ranks]);
    assert_eq!(single_losses.len(), 10);
    assert_rel("losses", &ranked_losses, &single_losses, tol.min(1e-5));
    assert_same_final_weights(&one, &two, tol);
    let states = |d: &Path| {
        safetensor_f64(
            &d.join("step-10/optimizer.safetensors"),
            "model.layers.1.mlp.down_proj.weight.exp_avg_sq",
        )
    };
    assert_rel(
        "a gathered optimizer state",
        &states(&two),
        &states(&one),
        tol,
    );
}

/// Runs `mslc run` of `src` with `args` (and `extra`, e.g. `--ranks 2`) writing into `out`;
/// the values of output `name`, and what the run printed.
pub(crate) fn forward(
    src: &Path,
    args: &[&str],
    out: &Path,
    extra: &[&str],
    name: &str,
) -> (Vec<f64>, String) {
    let head = ["run", s(src), "--output-dir", s(out), "--threads", "1"];
    let (code, stdout, stderr) = mslc(&[&head[..], args, extra].concat());
    assert_eq!(code, 0, "{stdout}{stderr}");
    let array = mslc_io::npy::read_npy(out.join(format!("{name}.npy"))).unwrap();
    let values = array.to_f32().unwrap().into_iter().map(f64::from).collect();
    (values, stdout)
}

/// `mslc run --ranks 2` of the tensor-parallel tiny LLaMA — each rank holding its shards of
/// q, k, v, o, gate, up and down, cut from `--weights` — writes the logits `mslc run` writes
/// on one device, within 1e-5 relative (the row-parallel sums reassociate). Under
/// `--init-seed` each rank draws the weights one device draws and keeps its blocks: the same
/// logits again (a rank drawing its blocks by their own shape would draw other values).
#[test]
fn run_on_two_ranks_tensor_parallel_matches_one_device() {
    let dir = TestDir::new("ranks-run-tp");
    let (src, args, _) = tensor_parallel_forward_parity(&dir, |text| text);
    let seeded = [
        &["--init-seed", "1"][..],
        &args[2..].iter().map(String::as_str).collect::<Vec<_>>(),
    ]
    .concat();
    let (want, _) = forward(&src, &seeded, &dir.path("seeded-one"), &[], "logits");
    let ranks = ["--ranks", "2"];
    let (got, _) = forward(&src, &seeded, &dir.path("seeded-ranks"), &ranks, "logits");
    assert_rel("logits of --init-seed on ranks", &got, &want, 1e-5);
}

/// [`run_on_two_ranks_tensor_parallel_matches_one_device`] with Megatron's sequence
/// parallelism: the norms and residual adds run on each rank's half of the 8 positions, the
/// stream gathered before the head; the same logits within 1e-5 relative.
#[test]
fn run_on_two_ranks_sequence_parallel_matches_one_device() {
    let dir = TestDir::new("ranks-run-sp");
    let (_, _, stdout) = tensor_parallel_forward_parity(&dir, sequence_parallel);
    assert!(
        stdout.contains("ranks:   2 (data 1 × tensor 2 with sequence parallelism, --ranks)"),
        "{stdout}"
    );
}

/// Writes the tensor-parallel tiny LLaMA (its source rewritten by `policy`), random whole
/// weights and a batch of tokens in `dir`, and checks that `mslc run --ranks 2` writes the
/// logits of one device within 1e-5 relative. Returns the source, the run's flags (weights,
/// input, sizes) and what the ranked run printed.
fn tensor_parallel_forward_parity(
    dir: &TestDir,
    policy: impl Fn(String) -> String,
) -> (PathBuf, Vec<String>, String) {
    let (src, checked) = llama_tensor_parallel_in(dir);
    let text = std::fs::read_to_string(&src).unwrap();
    std::fs::write(&src, policy(text)).unwrap();
    let (args, stdout) = llama_forward_parity(dir, &src, &checked, 2, "2");
    (src, args, stdout)
}

/// Writes random whole weights of the tiny LLaMA of `src` (checked as `checked`) and `rows`
/// sequences of 8 random tokens in `dir`, and checks that `mslc run --ranks RANKS` writes the
/// logits of one device within 1e-5 relative. The run's flags (weights, input, sizes) and
/// what the ranked run printed.
pub(crate) fn llama_forward_parity(
    dir: &TestDir,
    src: &Path,
    checked: &mslc_check::Checked,
    rows: usize,
    ranks: &str,
) -> (Vec<String>, String) {
    let single = mslc_driver::compile::compile(&checked.models[0], &compile_options())
        .unwrap()
        .module;
    let weights = dir.path("w.safetensors");
    crate::exec::common::write_weights(&weights, &crate::exec::common::random_weights(&single, 7));
    let mut rng = Rng(11);
    let tokens: Vec<i64> = (0..rows * 8)
        .map(|_| (rng.uniform() * 64.0) as i64 % 64)
        .collect();
    let tokens_file = dir.path("tokens.npy");
    write_npy(
        &tokens_file,
        &NpyArray::from_i64(vec![rows, 8], &tokens).unwrap(),
    )
    .unwrap();
    let input = format!("tokens={}", s(&tokens_file));
    let args = [
        &["--weights", s(&weights), "--input", &input][..],
        &llama_flags(),
    ]
    .concat();
    let (want, _) = forward(src, &args, &dir.path("one"), &[], "logits");
    let (got, stdout) = forward(
        src,
        &args,
        &dir.path("ranks"),
        &["--ranks", ranks],
        "logits",
    );
    assert_eq!(want.len(), rows * 8 * 64);
    assert_rel("logits on ranks", &got, &want, 1e-5);
    let args = args.into_iter().map(str::to_string).collect();
    (args, stdout)
}

/// `mslc run --ranks 2` of the classifier under data parallelism: each replica runs half of
/// the batch, and rank 0 writes the whole logits, equal to one device's within 1e-5 relative
/// (the same rows through the same weights). A batch that does not split is E0974, a world
/// that does not match the plan E0970, and the launcher flags are misused as for train.
#[test]
fn run_on_two_ranks_data_parallel_matches_one_device() {
    let dir = TestDir::new("ranks-run-dp");
    let src = source(&dir, DATA, 4);
    let mut rng = Rng(13);
    let write_x = |name: &str, rows: usize, rng: &mut Rng| {
        let path = dir.path(name);
        let x = rng.vec(rows * INPUTS, -2.0, 2.0);
        write_npy(&path, &NpyArray::from_f32(vec![rows, INPUTS], &x).unwrap()).unwrap();
        format!("x={}", s(&path))
    };
    let x = write_x("x.npy", 6, &mut rng);
    let args = ["--init-seed", "3", "--input", &x];
    let (want, _) = forward(&src, &args, &dir.path("one"), &[], "logits");
    let (got, _) = forward(&src, &args, &dir.path("two"), &["--ranks", "2"], "logits");
    assert_eq!(want.len(), 6 * CLASSES);
    assert_rel("data-parallel logits", &got, &want, 1e-5);
    let odd = write_x("x5.npy", 5, &mut rng);
    let run = |extra: &[&str]| {
        let head = ["run", s(&src), "--init-seed", "3", "--input", &odd];
        mslc(&[&head[..], extra].concat())
    };
    let (code, _, stderr) = run(&["--ranks", "2"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("E0974") && stderr.contains("batch of 5"),
        "{stderr}"
    );
    let (code, _, stderr) = run(&["--ranks", "3"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("started 3 rank(s), but the plan has 2"),
        "{stderr}"
    );
    let (code, _, stderr) = run(&["--ranks", "2", "--mpi"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("not both"), "{stderr}");
    let out = crate::support::mslc_command(&["run", s(&src), "--init-seed", "3", "--input", &x])
        .current_dir(root())
        .env("PMI_SIZE", "2")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("add --mpi"), "{stderr}");
}

/// The optimizer-sharding levels run on two data-parallel ranks.
const LEVELS: [&str; 3] = ["level1", "level2", "level3"];

/// Trains `src` for 10 steps on one device and on two ranks under each of [`LEVELS`] (the
/// source's `optimizer_shard` written in by `with_level`), asserting that each gives the
/// single-device losses within 1e-5 relative, and final weights and final optimizer states —
/// gathered whole into rank 0's checkpoint — within `state_tol` of each tensor's largest
/// magnitude. Returns the directories of the one-device run and of each level's run.
fn zero_parity(
    dir: &TestDir,
    with_level: impl Fn(&str) -> PathBuf,
    train: impl Fn(&Path, &Path, &[&str]) -> Vec<f64>,
    state_tol: f64,
) -> (PathBuf, Vec<PathBuf>) {
    let one = dir.path("one");
    let single = train(&with_level("none"), &one, &[]);
    assert_eq!(single.len(), 10);
    let mut runs = Vec::new();
    for level in LEVELS {
        let out = dir.path(level);
        let ranked = train(&with_level(level), &out, &["--ranks", "2"]);
        assert_rel(&format!("{level} losses"), &ranked, &single, 1e-5);
        assert_same_final_weights(&one, &out, state_tol);
        assert_same_tensors(&one, &out, "optimizer.safetensors", state_tol, assert_rel);
        runs.push(out);
    }
    (one, runs)
}

/// The classifier of [`source`] with clipping (0.5, which the early steps hit), data parallel
/// on two ranks under optimizer sharding: `head.bias` has 5 values, which 2 ranks hold as
/// padded slices of 3. A level-3 checkpoint (whole: parameters and states gathered) resumes on
/// one device and on two level-3 ranks (each taking its slice) as one device's own does.
#[test]
fn optimizer_sharding_on_two_ranks_matches_one_device() {
    let dir = TestDir::new("ranks-zero");
    let data = write_data(&dir);
    let with_level = |level: &str| {
        let policy = format!("{DATA}\n    optimizer_shard = {level}");
        let src = source(&dir, &policy, 4);
        let text = std::fs::read_to_string(&src).unwrap();
        let text = text.replace("batch = 8", "batch = 8\n    clip_grad_norm = 0.5");
        let path = dir.path(&format!("net_{level}.msl"));
        std::fs::write(&path, text).unwrap();
        path
    };
    let run = |src: &Path, out: &Path, extra: &[&str]| train(src, &data, out, "10", extra);
    let (one, runs) = zero_parity(&dir, with_level, run, 1e-5);
    let level3 = with_level("level3");
    let resume = |from: &Path, out: &str, extra: &[&str]| {
        let checkpoint = from.join("step-10");
        let flags = [&["--resume", s(&checkpoint)][..], extra].concat();
        train(&level3, &data, &dir.path(out), "12", &flags)
    };
    let continued = resume(&one, "continued", &[]);
    assert_eq!(continued.len(), 2);
    let on_one = resume(&runs[2], "level3-on-one", &[]);
    assert_rel("level3 resumed on one device", &on_one, &continued, 1e-5);
    let on_two = resume(&runs[2], "level3-on-two", &["--ranks", "2"]);
    assert_rel("level3 resumed on two ranks", &on_two, &continued, 1e-5);
}

/// examples/tiny_llama.msl's model (2 layers, hidden 32, vocab 64, S = 8) trained in f32 with
/// AdamW and clipping on batches of 4 sequences, data parallel over 2 ranks under each
/// optimizer-sharding level, against one device.
#[test]
fn tiny_llama_optimizer_sharding_on_two_ranks_matches_one_device() {
    let dir = TestDir::new("ranks-llama-zero");
    let fields = "optimizer = adamw(lr: 1e-2, betas: (0.9, 0.95), weight_decay: 0.1)
    batch = 4
    clip_grad_norm = 1.0";
    let with_level = |level: &str| llama_zero_source(&dir, "llama", level, fields);
    let data = random_tokens(&dir, 12, 8, 17);
    let sets = llama_flags();
    let run = |src: &Path, out: &Path, extra: &[&str]| {
        train(src, &data, out, "10", &[&sets[..], extra].concat())
    };
    zero_parity(&dir, with_level, run, ADAMW_WEIGHTS_TOL);
}

/// The per-rank program of each optimizer-sharding level holds the collectives over `dp` that
/// ZeRO prescribes and the plan counts: per parameter an all-reduce of its gradient (levels 0
/// and 1) or a reduce-scatter (levels 2 and 3), and as many all-gathers as the plan has per
/// step (one of the updated slices at levels 1 and 2; at level 3 one for the forward and one
/// for each parameter the backward reads, the parameters staying sliced). Besides those, the two scalar
/// all-reduces of the loss, and at levels 2 and 3 the one of the sliced gradients' squares.
#[test]
fn optimizer_sharding_programs_hold_the_planned_collectives() {
    use mslc_core::ops::Op;
    let dir = TestDir::new("ranks-zero-program");
    for (level, name) in [(0u8, "none"), (1, "level1"), (2, "level2"), (3, "level3")] {
        let src = source(&dir, &format!("{DATA}\n    optimizer_shard = {name}"), 4);
        let checked = mslc_check::check_path(&src, &Default::default());
        assert!(!checked.has_errors(), "{:?}", checked.diagnostics);
        let train = &checked.decls.trains[0];
        let plan = mslc_driver::parallel::plan_train(&checked, train)
            .unwrap()
            .unwrap();
        assert_eq!(plan.optimizer_shard, level);
        let model = train.graph.as_ref().unwrap();
        let selection = mslc_driver::select::Selection::default();
        let (options, loss_scale) =
            mslc_driver::train::train_compile_options(&checked, train, model, selection).unwrap();
        let options_train = mslc_driver::train::TrainOptions {
            loss_scale,
            data_parallel: 2,
            optimizer_shard: level,
            ..Default::default()
        };
        let Ok(step) =
            mslc_driver::train::compile_train_ranked(train, &options, options_train, None)
        else {
            panic!("{name} compiles");
        };
        let count = |op: Op| {
            let steps = &step.compiled.module.steps;
            steps.iter().filter(|s| s.op == op).count()
        };
        let params = step.params.len();
        assert_eq!(params, 4, "hidden and head, weight and bias");
        let planned = |kind: &str| {
            let calls = plan
                .collectives
                .iter()
                .filter(|c| c.axis == "dp" && c.kind == kind);
            calls.map(|c| c.count as usize).sum::<usize>()
        };
        let (reduced, scattered) = match level {
            0 | 1 => (params + 2, 0),
            _ => (3, params),
        };
        assert_eq!(count(Op::AllReduce), reduced, "{name}");
        assert_eq!(count(Op::ReduceScatter), scattered, "{name}");
        // Level 3 gathers again only what the backward reads: of this net, `head.weight`
        // (for the hidden layer's gradient); the input's gradient is not taken and a bias is
        // never read. The plan counts 2 per parameter, an upper bound.
        let gathers = match level {
            3 => params + 1,
            _ => params * planned("all_gather"),
        };
        assert_eq!(count(Op::AllGather), gathers, "{name}");
        assert!(
            count(Op::AllGather) <= params * planned("all_gather"),
            "{name}"
        );
        assert_eq!(planned("reduce_scatter") > 0, scattered > 0, "{name}");
        assert_eq!(
            step.zero.as_ref().map(|z| z.level),
            (level > 0).then_some(level)
        );
    }
}

/// Each rank's memory under data parallelism on 2 ranks, level0 against level3 (tiny LLaMA,
/// f32 AdamW): what every rank's executor allocated (buffers and its threads' scratch) is
/// within 5 % of its per-rank program's memory plan, and ZeRO stage 3 halves what each rank
/// keeps of the parameters (with the next values the update writes) and of the optimizer
/// states — up to each tensor's padding to an even split — so its total falls.
#[test]
fn optimizer_sharding_per_rank_memory_falls_and_matches_the_plan() {
    let dir = TestDir::new("ranks-zero-memory");
    let data = random_tokens(&dir, 8, 8, 5);
    let memory = |level: &str| {
        let fields = "optimizer = adamw(lr: 1e-2)\n    batch = 4";
        let src = llama_zero_source(&dir, "llama", level, fields);
        let args = [
            "--message-format",
            "json",
            "train",
            s(&src),
            "--set",
            "layers=2",
            "--set",
            "hidden=64",
            "--set",
            "ffn=128",
            "--set",
            "vocab=64",
            "--dim",
            "S=8",
            "--init-seed",
            "1",
            "--data",
            s(&data),
            "--steps",
            "1",
            "--threads",
            "1",
            "--ranks",
            "2",
        ];
        let (code, stdout, stderr) = mslc(&args);
        assert_eq!(code, 0, "{stdout}{stderr}");
        let summary = crate::exec::common::train_summary(&stdout);
        let m = &summary["rank_memory"];
        let get = |k: &str| m[k].as_u64().unwrap_or_else(|| panic!("{k} in {m}"));
        let (planned, allocated) = (get("planned_bytes"), get("allocated_bytes"));
        assert!(
            allocated.abs_diff(planned) as f64 <= 0.05 * planned as f64,
            "{level}: allocated {allocated} against the planned {planned}"
        );
        (
            allocated,
            get("params_bytes"),
            get("inputs_bytes"),
            get("next_bytes"),
        )
    };
    let (whole, params0, inputs0, next0) = memory("none");
    let (sharded, params3, inputs3, next3) = memory("level3");
    // Halved, up to the padding (at most one value per tensor) and the data inputs.
    let half = |x: u64| x / 2;
    assert!(params3 <= half(params0) + 64 * 4, "{params3} of {params0}");
    assert!(next3 <= half(next0) + 64 * 4 * 3, "{next3} of {next0}");
    assert!(inputs3 < inputs0 * 6 / 10, "{inputs3} of {inputs0}");
    assert!(sharded < whole, "level3 {sharded} ≥ level0 {whole}");
    eprintln!("per rank: level0 {whole} bytes, level3 {sharded} bytes");
}

/// examples/tiny_llama.msl's model with a train `Pretrain` of `fields` (optimizer, batch, …),
/// data parallel on 2 ranks under optimizer-sharding `level`, written as `dir/NAME_LEVEL.msl`.
fn llama_zero_source(dir: &TestDir, name: &str, level: &str, fields: &str) -> PathBuf {
    let decl = format!(
        "parallel P {{
    mesh = {{ dp: 2 }}
    mode = data
    optimizer_shard = {level}
}}

train Pretrain for TinyLlama {{
    labels: i32[B, S]
    loss = cross_entropy(logits, labels)
    {fields}
    parallel = P
    target = std.targets.cpu
}}
"
    );
    tiny_llama_with(dir, &format!("{name}_{level}.msl"), &decl)
}

/// Under optimizer sharding (level 1) each replica's update writes its slices of Adam's m and
/// v over the states they replace and updates a copy of its slice of the parameter beside
/// them, which the all-gather makes whole again in the parameter's own buffer; nothing derived
/// from a trained parameter is hoisted or packed ahead, since every run replaces it.
#[test]
fn a_sharded_update_writes_its_states_in_place() {
    use mslc_artifact::Storage;
    use mslc_core::ops::Op;
    let dir = TestDir::new("ranks-zero-in-place");
    let level1 = format!("{DATA}\n    optimizer_shard = level1");
    let src = source(&dir, &level1, 4);
    let out = dir.path("dp");
    let (code, stdout, stderr) = mslc(&["build", s(&src), "--entry", "Fit", "--out-dir", s(&out)]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let (module, _, _) = rank_program(&out, "Fit");
    let updates: Vec<_> = module
        .steps
        .iter()
        .filter(|s| s.op == Op::AdamUpdate)
        .collect();
    assert_eq!(updates.len(), 4, "two weights and two biases");
    for step in updates {
        let storage = |k: usize| &module.values[step.outputs[k] as usize].storage;
        assert!(
            matches!(storage(0), Storage::Arena { .. }),
            "{:?}",
            storage(0)
        );
        for k in [1, 2] {
            assert!(
                matches!(storage(k), Storage::Overwrite { .. }),
                "{:?}",
                storage(k)
            );
        }
    }
    let memplan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("Fit.rank.memplan.json")).unwrap())
            .unwrap();
    assert_eq!(memplan["packed_bytes"], 0);
    // The all-gathered parameters are written into the parameters' own buffers.
    assert_eq!(memplan["next_bytes"], 0);
    let storage = |v: &u32| &module.values[*v as usize].storage;
    for step in &module.steps {
        if step
            .outputs
            .iter()
            .any(|o| matches!(storage(o), Storage::Hoisted { .. }))
        {
            assert!(
                !step
                    .inputs
                    .iter()
                    .any(|i| matches!(storage(i), Storage::Param { .. })),
                "{} hoisted from a trained parameter",
                step.op
            );
        }
    }
}

/// The module and parameter shapes of `dir/NAME.rank.mir`, and `dir/NAME.ranks.json`.
fn rank_program(
    dir: &Path,
    name: &str,
) -> (
    mslc_artifact::Module,
    std::collections::BTreeMap<String, Vec<i64>>,
    serde_json::Value,
) {
    let bytes = std::fs::read(dir.join(format!("{name}.rank.mir"))).unwrap();
    let module = mslc_artifact::decode(&bytes).unwrap().module;
    let shapes = module
        .params()
        .map(|(path, v)| (path.to_string(), module.values[v as usize].ty.shape.clone()))
        .collect();
    let ranks = std::fs::read_to_string(dir.join(format!("{name}.ranks.json"))).unwrap();
    (module, shapes, serde_json::from_str(&ranks).unwrap())
}

/// `mslc build --entry Pretrain` of the tiny LLaMA under `sequence_parallel = true` writes
/// the sequence-parallel step (the program `mslc train --ranks 2` runs): each way, two
/// reduce-scatters and two all-gathers per layer, the stream cut after the embedding and
/// gathered before the head; the all-reduces are the five norm scales' gradients and the
/// clipping norm's.
#[test]
fn build_writes_the_sequence_parallel_per_rank_program() {
    use mslc_core::ops::Op;
    let dir = TestDir::new("ranks-build-sp");
    let (src, _) = llama_tensor_parallel_in(&dir);
    let text = std::fs::read_to_string(&src).unwrap();
    std::fs::write(&src, sequence_parallel(text)).unwrap();
    let out = dir.path("sp");
    let stdout = build_llama(&src, "Pretrain", &out);
    assert!(
        stdout.contains("for all 2 ranks (1 data × 2 tensor, sequence parallel)"),
        "{stdout}"
    );
    let (module, _, ranks) = rank_program(&out, "Pretrain");
    assert_eq!(ranks["sequence_parallel"], true);
    let count = |op: Op| module.steps.iter().filter(|s| s.op == op).count();
    assert_eq!(count(Op::ReduceScatter), 2 * 2 * 2);
    assert_eq!(
        count(Op::AllGather),
        2 * 2 * 2 + 2,
        "and the head's and the cut's"
    );
    assert_eq!(
        count(Op::RankSlice),
        2,
        "the cut and the head gather's gradient"
    );
    assert_eq!(count(Op::AllReduce), 5 + 1);
}

/// `mslc build --entry TRAIN` of a parallel train writes the step every rank runs
/// (docs/mir-format.md, "Per-rank programs"): the tensor-parallel tiny LLaMA's holds each
/// rank's shards and the plan's all-reduces (two per layer each way, and the clipping norm's);
/// the data-parallel classifier under level 3 takes one replica's half of the batch and holds
/// slices of every parameter, gathered before use; a pipeline plan writes none and says why.
#[test]
fn build_writes_the_per_rank_program() {
    use mslc_core::ops::Op;
    let dir = TestDir::new("ranks-build");
    let (src, _) = llama_tensor_parallel_in(&dir);
    let out = dir.path("tp");
    let stdout = build_llama(&src, "Pretrain", &out);
    assert!(
        stdout.contains("per rank:   Pretrain.rank.mir for all 2 ranks (1 data × 2 tensor)"),
        "{stdout}"
    );
    let (module, shapes, ranks) = rank_program(&out, "Pretrain");
    let all_reduces = module
        .steps
        .iter()
        .filter(|s| s.op == Op::AllReduce)
        .count();
    assert_eq!(
        all_reduces,
        2 * 2 * 2 + 1,
        "2 layers, forward and backward, and the norm"
    );
    let o_proj = "model.layers.0.self_attn.o_proj.weight";
    assert_eq!(shapes[o_proj], [32, 16]);
    assert_eq!(shapes["model.layers.1.mlp.up_proj.weight"], [32, 32]);
    assert_eq!(shapes["lm_head.weight"], [64, 32]);
    assert_eq!(ranks["mesh"], serde_json::json!([["dp", 1], ["mp", 2]]));
    assert_eq!(ranks["ranks"].as_array().unwrap().len(), 2);
    assert_eq!(ranks["ranks"][1]["tensor"], 1);
    let o = &ranks["parameters"][o_proj];
    assert_eq!(o["shape"], serde_json::json!([32, 32]));
    assert_eq!(o["rank_shape"], serde_json::json!([32, 16]));
    assert_eq!(o["tensor_split_dim"], 1);
    let memplan: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("Pretrain.rank.memplan.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(memplan["arena_bytes"].as_u64(), Some(module.arena_bytes));
    let (code, stdout, stderr) = mslc(&["inspect", s(&out.join("Pretrain.rank.mir"))]);
    assert_eq!(code, 0, "{stdout}{stderr}");

    // Data parallel, level 3: one replica's 4 of the 8 samples, every parameter a slice.
    let level3 = format!("{DATA}\n    optimizer_shard = level3");
    let src = source(&dir, &level3, 4);
    let out = dir.path("dp");
    let (code, stdout, stderr) = mslc(&["build", s(&src), "--entry", "Fit", "--out-dir", s(&out)]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let (module, shapes, ranks) = rank_program(&out, "Fit");
    let x = module.inputs().find(|(n, _)| *n == "x").unwrap().1;
    assert_eq!(module.values[x as usize].ty.shape, [4, INPUTS as i64]);
    assert_eq!(
        shapes["head.bias"],
        [3],
        "5 values padded to 6, in 2 slices"
    );
    assert_eq!(ranks["parameters"]["head.bias"]["parameter_sliced"], true);
    assert_eq!(ranks["optimizer_shard"], "level3");
    assert!(module.steps.iter().any(|s| s.op == Op::AllGather));

    // A pipeline: one step per stage (and a forward for the first), with what crosses the cut.
    let decls = "parallel PP {
    mesh = { pp: 2 }
    mode = semi_auto
    pipeline = { stages: 2, micro_batches: 2, schedule: gpipe }
}

train Piped for TinyLlama {
    labels: i32[B, S]
    loss = cross_entropy(logits, labels)
    optimizer = adamw(lr: 1e-2)
    batch = 4
    parallel = PP
    target = std.targets.cpu
}
";
    let piped = tiny_llama_with(&dir, "piped.msl", decls);
    let out = dir.path("pp");
    // The step takes one of the 2 pipeline micro-batches of the batch of 4: B = 2.
    let stdout = build_llama(&piped, "Piped", &out);
    assert!(
        stdout.contains("one step per pipeline stage for all 2 ranks")
            && stdout.contains("2 micro-batches, gpipe"),
        "{stdout}"
    );
    assert!(!out.join("Piped.rank.mir").exists());
    for file in [
        "Piped.stage0.rank.mir",
        "Piped.stage0.forward.mir",
        "Piped.stage0.update.mir",
        "Piped.stage1.rank.mir",
        "Piped.stage1.update.mir",
    ] {
        assert!(out.join(file).exists(), "{file}");
    }
    assert!(!out.join("Piped.stage1.forward.mir").exists());
    let ranks: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("Piped.ranks.json")).unwrap()).unwrap();
    let stages = &ranks["pipeline"]["stages"];
    assert_eq!(stages[0]["sends"][0]["stage"], 1);
    assert_eq!(
        stages[1]["receives"][0]["value"],
        stages[0]["sends"][0]["value"]
    );
    assert_eq!(ranks["parameters"]["lm_head.weight"]["stage"], 1);
    assert_eq!(ranks["parameters"]["model.embed_tokens.weight"]["stage"], 0);
    // On the host target the plan also gives what the executor allocates on each stage's
    // ranks, from the programs just written — the figure `mslc train` plans and measures with.
    let plan: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("Piped.plan.json")).unwrap()).unwrap();
    let executor = |stage: usize| &plan["per_device"][stage]["executor"];
    // GPipe over 2 micro-batches, one value of 2 KiB across the cut each way (the plan's
    // send_recv): stage 0 may have both forwards' sends untaken when it receives its first
    // backward's gradient (3 messages); stage 1 holds both micro-batches' received values and
    // may send both gradients back before stage 0 takes one (4).
    let message = plan["collectives"][0]["bytes"].as_u64().unwrap();
    assert_eq!(message, 2048, "{plan}");
    for (stage, messages) in [(0, 3), (1, 4)] {
        let [allocated, programs, exchanged, pipelined, total] =
            ["allocated", "programs", "exchanged", "pipelined", "total"]
                .map(|k| executor(stage)[k].as_u64().unwrap());
        // The stage's update sums its norm over the stages: one f32, kept twice.
        assert_eq!(exchanged, 8, "{plan}");
        assert_eq!(pipelined, messages * message, "{plan}");
        // What the executor keeps for the stage's three programs, by their steps.
        let steps: usize = ["rank", "forward", "update"]
            .iter()
            .map(|p| out.join(format!("Piped.stage{stage}.{p}.mir")))
            .filter(|path| path.exists())
            .map(|path| {
                let bytes = std::fs::read(path).unwrap();
                mslc_artifact::decode(&bytes).unwrap().module.steps.len()
            })
            .sum();
        let per_step = mslc_plan::memory::EXECUTOR_BYTES_PER_STEP;
        assert_eq!(programs, per_step * steps as u64, "{plan}");
        let held = allocated + programs + exchanged + pipelined;
        let reserve = mslc_plan::parallel::estimate::executor_reserve(held);
        assert_eq!(total, held + reserve, "{plan}");
        // More than the analytic model: the stage runs a forward and an update beside its step.
        assert!(
            total
                > plan["per_device"][stage]["memory"]["total"]
                    .as_u64()
                    .unwrap()
        );
    }
    assert!(stdout.contains("on this machine's executor: "), "{stdout}");
    let data = random_tokens(&dir, 8, 8, 3);
    let mut args = vec![
        "--message-format",
        "json",
        "train",
        s(&piped),
        "--entry",
        "Piped",
    ];
    args.extend(llama_flags());
    args.extend(["--init-seed", "0", "--data", s(&data), "--ranks", "2"]);
    let (code, trained, stderr) = mslc(&args);
    assert_eq!(code, 0, "{trained}{stderr}");
    let summary = crate::exec::common::train_summary(&trained);
    assert_eq!(
        summary["rank_memory"]["planned_bytes"],
        executor(0)["allocated"]
    );
    // The stage's forward and update run on its step's parameters, lent to them: what its
    // executors allocate is the plan, which counts the parameters once.
    assert_eq!(
        summary["rank_memory"]["allocated_bytes"],
        summary["rank_memory"]["planned_bytes"]
    );
    // The example's own train (2 data × 2 tensor × 2 stages, 4 micro-batches) builds with
    // the sizes it declares: B = 8 / (2 × 4) = 1, one step per stage for its 8 ranks.
    let example = root().join("examples/tiny_llama.msl");
    let args = ["build", s(&example), "--entry", "Pretrain", "-o", s(&out)];
    let (code, stdout, stderr) = mslc(&args);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.contains("one step per pipeline stage for all 8 ranks (2 stages × 2 data × 2"),
        "{stdout}"
    );
}

/// examples/mlp.msl's own train — 2 replicas × its hidden layers' columns split over `mp: 2`
/// (two column-parallel layers in a row: the second reads the first's output gathered; the
/// biases split with their features), the head row parallel, ZeRO level 1 — builds its
/// per-rank program and trains on its 4 ranks as on one device (f32, 5 steps, losses within
/// 1e-5).
#[test]
fn the_mlp_example_trains_on_its_four_ranks_as_on_one_device() {
    let dir = TestDir::new("ranks-mlp-example");
    let example = root().join("examples/mlp.msl");
    let mut rng = Rng(17);
    let data = dir.path("data");
    std::fs::create_dir_all(&data).unwrap();
    let images = rng.vec(128 * 784, -1.0, 1.0);
    write_npy(
        data.join("images.npy"),
        &NpyArray::from_f32(vec![128, 784], &images).unwrap(),
    )
    .unwrap();
    let labels: Vec<i64> = (0..128).map(|i| (i * 7 % 10) as i64).collect();
    write_npy(
        data.join("labels.npy"),
        &NpyArray::from_i64(vec![128], &labels).unwrap(),
    )
    .unwrap();
    let run = |out: &str, extra: &[&str]| -> Vec<f64> {
        let metrics = dir.path(&format!("{out}.jsonl"));
        let out = dir.path(out);
        let head = ["train", s(&example), "--data", s(&data), "--threads", "1"];
        let tail = ["--metrics", s(&metrics), "--output-dir", s(&out)];
        let (code, stdout, stderr) = mslc(&[&head[..], extra, &tail].concat());
        assert_eq!(code, 0, "{stdout}{stderr}");
        metric_losses(&metrics)
    };
    run("init", &["--init-seed", "1", "--steps", "1"]);
    let weights = dir.path("init/step-1/model.safetensors");
    let flags = [
        "--weights",
        s(&weights),
        "--steps",
        "5",
        "--precision",
        "f32",
    ];
    let one = run("one", &flags);
    let four = run("four", &[&flags[..], &["--ranks", "4"]].concat());
    assert_eq!(one.len(), 5);
    assert_rel("mlp example losses", &four, &one, 1e-5);
    let out = dir.path("built");
    let args = ["build", s(&example), "--entry", "Classify", "-o", s(&out)];
    let (code, stdout, stderr) = mslc(&args);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(out.join("Classify.rank.mir").exists(), "{stdout}");
}

/// `mslc build` of train `entry` of the tiny LLaMA source `src` at its test sizes
/// ([`llama_flags`]) into `out`: what it printed.
fn build_llama(src: &Path, entry: &str, out: &Path) -> String {
    let mut args = vec!["build", s(src), "--entry", entry, "--out-dir", s(out)];
    args.extend(llama_flags());
    let (code, stdout, stderr) = mslc(&args);
    assert_eq!(code, 0, "{stdout}{stderr}");
    stdout
}
