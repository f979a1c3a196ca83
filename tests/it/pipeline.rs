//! Pipeline stages run for real: `mslc run --ranks N` of a plan with pipeline stages cuts the
//! tiny LLaMA between its layers, each stage's ranks run their part over the micro-batches and
//! hand the residual stream on, and rank 0 writes the logits one device writes — alone and
//! mixed with data and tensor (and sequence) parallelism. Training a pipeline plan is a coded
//! refusal.

use mslc_io::npy::{write_npy, NpyArray};

use crate::exec::common::{mslc, random_weights, s, write_weights, Rng, TestDir};
use crate::ranks::{compile_options, forward, llama_flags, llama_source_in};
use crate::train::assert_rel;

/// Two stages, four micro-batches of 2 sequences (1F1B).
const PP: &str = include_str!("../fixtures/tiny_llama_pp.msl-decls");
/// Two replicas × two stages × two tensor-parallel ranks, two micro-batches of 2.
const MIX: &str = include_str!("../fixtures/tiny_llama_mix.msl-decls");

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
    let single = mslc_driver::compile::compile(&checked.models[0], &compile_options())
        .unwrap()
        .module;
    let weights = dir.path("w.safetensors");
    write_weights(&weights, &random_weights(&single, 5));
    let mut rng = Rng(21);
    let tokens: Vec<i64> = (0..64)
        .map(|_| (rng.uniform() * 64.0) as i64 % 64)
        .collect();
    let tokens_file = dir.path("tokens.npy");
    write_npy(
        &tokens_file,
        &NpyArray::from_i64(vec![8, 8], &tokens).unwrap(),
    )
    .unwrap();
    let input = format!("tokens={}", s(&tokens_file));
    let args = [
        &["--weights", s(&weights), "--input", &input][..],
        &llama_flags(),
    ]
    .concat();
    let (want, _) = forward(&src, &args, &dir.path("one"), &[], "logits");
    let (got, _) = forward(
        &src,
        &args,
        &dir.path("ranks"),
        &["--ranks", ranks],
        "logits",
    );
    assert_eq!(want.len(), 8 * 8 * 64);
    assert_rel("pipelined logits", &got, &want, 1e-5);
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

/// The training step of a pipeline is not run yet: `mslc train --ranks` of the plan says so
/// (E0972) rather than running something else.
#[test]
fn training_a_pipeline_plan_is_refused() {
    let dir = TestDir::new("pipeline-train");
    let (src, _) = llama_source_in(&dir, "pp.msl", PP, 2);
    let mut rng = Rng(3);
    let tokens: Vec<i64> = (0..72)
        .map(|_| (rng.uniform() * 64.0) as i64 % 64)
        .collect();
    let data = dir.path("tokens.npy");
    write_npy(&data, &NpyArray::from_i64(vec![8, 9], &tokens).unwrap()).unwrap();
    let args = [
        &[
            "train",
            s(&src),
            "--data",
            s(&data),
            "--init-seed",
            "1",
            "--steps",
            "1",
            "--ranks",
            "2",
        ][..],
        &llama_flags(),
    ]
    .concat();
    let (code, stdout, stderr) = mslc(&args);
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(
        stderr.contains("E0972") && stderr.contains("pipeline"),
        "{stderr}"
    );
}
