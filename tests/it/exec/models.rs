//! Whole models through the executor: tiny_llama against an independent NumPy implementation
//! of HF LLaMA, fused against unfused graphs, 1 against 2 threads, in-place steps.

use mslc_artifact::runtime::CopyStep;
use mslc_artifact::Module;

use mslc_io::npy::{read_npy, write_npy, NpyArray};

use mslc_artifact::Storage;
use mslc_check::policy::AmpLevel;
use mslc_core::ops::{DType, Op};
use mslc_ir::passes::AmpConfig;

use super::common::{
    assert_close, assert_matches_reference, compile_file, compile_sized, compile_with, executor,
    have_numpy, mslc, random_weights, root, run_one, s, write_weights, Rng, TestDir,
};

#[test]
fn tiny_llama_matches_numpy_hf_llama() {
    if !have_numpy() {
        eprintln!("note: python3 with numpy is not available; skipping the HF LLaMA comparison");
        return;
    }
    let dir = TestDir::new("llama");
    // 2 layers; the sequence length (32) comes from the tokens' shape.
    let module = compile_file("examples/tiny_llama.msl", &[("layers", "2")], true);
    write_weights(&dir.path("w.safetensors"), &random_weights(&module, 7));
    let ids: Vec<i64> = Rng(3)
        .vec(32, 0.0, 1000.0)
        .iter()
        .map(|&x| x as i64)
        .collect();
    write_npy(
        dir.path("tokens.npy"),
        &NpyArray::from_i64(vec![1, 32], &ids).unwrap(),
    )
    .unwrap();
    let (code, out, err) = mslc(&[
        "run",
        s(&root().join("examples/tiny_llama.msl")),
        "--precision",
        "f32",
        "--set",
        "layers=2",
        "--weights",
        s(&dir.path("w.safetensors")),
        "--input",
        &format!("tokens={}", s(&dir.path("tokens.npy"))),
        "--output-dir",
        s(&dir.0),
    ]);
    assert_eq!(code, 0, "mslc run failed:\n{out}\n{err}");
    let script = root().join("tests/reference/llama_ref.py");
    let status = std::process::Command::new("python3")
        .args([
            s(&script),
            s(&dir.path("w.safetensors")),
            s(&dir.path("tokens.npy")),
        ])
        .arg(dir.path("ref.npy"))
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
        .status()
        .expect("python3 runs");
    assert!(status.success(), "the reference script failed");
    let got = read_npy(dir.path("logits.npy")).unwrap();
    assert_eq!(got.shape(), &[1, 32, 1000]);
    assert_matches_reference(
        &got,
        &read_npy(dir.path("ref.npy")).unwrap(),
        "tiny_llama vs HF LLaMA in NumPy",
    );
}

/// Runs `module` with seeded parameters and inputs on `threads` threads; output `name`.
fn run_seeded(module: Module, threads: usize, name: &str) -> Vec<f32> {
    let mut exec = executor(module, threads);
    exec.init_params(5);
    for input in exec.unset_inputs() {
        exec.seed_input(&input, 9).expect("seeded input");
    }
    exec.run().expect("run");
    exec.output_f32(name).expect("output").1
}

#[test]
fn thread_count_does_not_change_a_bit() {
    let module = compile_file("examples/tiny_llama.msl", &[("layers", "2")], true);
    let one = run_seeded(module.clone(), 1, "logits");
    let two = run_seeded(module, 2, "logits");
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&one), bits(&two));
}

#[test]
fn fused_and_unfused_graphs_agree() {
    // Tolerance: |fused − unfused| ≤ 1e-5 + 1e-4·|unfused| (fusion reorders float sums).
    for (file, sets, output) in [
        ("examples/tiny_llama.msl", &[("layers", "1")][..], "logits"),
        ("examples/mlp.msl", &[][..], "logits"),
    ] {
        let fused = compile_file(file, sets, true);
        let plain = compile_file(file, sets, false);
        assert!(
            fused.steps.len() < plain.steps.len(),
            "{file}: fusion changed nothing"
        );
        let a = run_seeded(fused, 2, output);
        let b = run_seeded(plain, 2, output);
        assert_close(file, &a, &b, 1e-5, 1e-4);
    }
}

#[test]
fn a_transposed_product_runs_as_the_swapped_product() {
    // (x0ᵀ·x1)ᵀ and a batched (x2·x3)ᵀ: fused, each is one matmul with its operands swapped and
    // no transpose step; the result equals the unfused graph's within float reassociation
    // (|Δ| ≤ 1e-6 + 1e-5·|unfused|).
    let file = "tests/passes/transposed_product.msl";
    let fused = compile_file(file, &[], true);
    let plain = compile_file(file, &[], false);
    let ops = |m: &Module, op: Op| m.steps.iter().filter(|s| s.op == op).count();
    assert_eq!(ops(&fused, Op::Transpose), 0);
    assert_eq!(ops(&fused, Op::Matmul), 2);
    assert!(ops(&plain, Op::Transpose) >= 3);
    let mut rng = Rng(11);
    let inputs: Vec<NpyArray> = [&[6, 5][..], &[6, 4], &[2, 3, 7], &[2, 7, 5]]
        .iter()
        .map(|shape| {
            let n = shape.iter().product();
            NpyArray::from_f32(shape.to_vec(), &rng.vec(n, -1.0, 1.0)).unwrap()
        })
        .collect();
    let a = run_one(fused, &inputs, 2);
    let b = run_one(plain, &inputs, 2);
    assert_close(file, &a, &b, 1e-6, 1e-5);
}

#[test]
fn repeated_runs_give_the_same_result() {
    let module = compile_file("examples/mlp.msl", &[], true);
    let mut exec = executor(module, 2);
    exec.init_params(1);
    exec.seed_input("images", 2).unwrap();
    exec.run().unwrap();
    let first = exec.output_f32("logits").unwrap().1;
    exec.run().unwrap();
    assert_eq!(first, exec.output_f32("logits").unwrap().1);
    assert!(exec.nonfinite_outputs().is_empty());
    let trace: serde_json::Value = serde_json::from_str(&exec.profile_json()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let ran = exec.step_times().iter().flatten().count();
    // Without recorded worker times, one slice per step that ran, each with a memory counter.
    let slices: Vec<_> = events.iter().filter(|e| e["ph"] == "X").collect();
    assert_eq!(slices.len(), ran);
    assert_eq!(events.iter().filter(|e| e["ph"] == "C").count(), ran);
    assert!(slices[0]["args"]["kernel"].is_string());
}

/// tiny_llama with one layer, compiled fused under O2 with f16 compute.
fn one_layer_llama_in_f16() -> Module {
    let amp = AmpConfig::new(AmpLevel::O2, DType::F16);
    compile_with(
        "examples/tiny_llama.msl",
        &[("layers", "1")],
        true,
        Some(amp),
    )
}

#[test]
fn parameter_only_steps_run_once_per_parameter_change() {
    // Under O2 every weight is cast to f16 by a step that reads only that weight.
    let module = one_layer_llama_in_f16();
    let casts = module
        .steps
        .iter()
        .filter(|s| {
            s.op == Op::Cast
                && matches!(
                    module.values[s.inputs[0] as usize].storage,
                    Storage::Param { .. }
                )
        })
        .count();
    assert!(casts > 0, "no weight casts to hoist");
    // The planner hoisted them: their outputs live in the hoisted region, which the executor
    // allocates exactly as planned, beside an arena of exactly the planned size.
    let hoisted = |m: &Module| {
        m.steps
            .iter()
            .filter(|s| {
                matches!(
                    m.values[s.outputs[0] as usize].storage,
                    Storage::Hoisted { .. }
                )
            })
            .count()
    };
    assert!(hoisted(&module) >= casts);
    let (arena, region) = (module.arena_bytes, module.hoisted_bytes);
    assert!(region > 0);
    let mut exec = executor(module, 2);
    assert_eq!(
        (exec.arena_bytes() as u64, exec.hoisted_bytes() as u64),
        (arena, region)
    );
    exec.init_params(1);
    exec.seed_input("tokens", 2).unwrap();
    // Reshapes over their own f16 bytes never run (`a_reshape_over_its_own_f16_bytes_is_not_run`).
    let needs = mslc_artifact::runtime::RuntimeNeeds::of(exec.module()).unwrap();
    let unchanged = (needs.steps.iter())
        .filter(|p| p.copy == Some(CopyStep::Unchanged))
        .count();
    exec.run().unwrap();
    let first = exec.output_f32("logits").unwrap().1;
    let all = exec.step_times().iter().flatten().count();
    exec.run().unwrap();
    let skipped = exec.step_times().iter().filter(|t| t.is_none()).count() - unchanged;
    assert!(
        skipped >= casts,
        "{skipped} steps skipped, {casts} weight casts"
    );
    assert_eq!(skipped, hoisted(exec.module()));
    assert_eq!(all + unchanged, exec.module().steps.len());
    // The hoisted f16 weights survived the arena's reuse: same logits.
    assert_eq!(first, exec.output_f32("logits").unwrap().1);
    // New parameters recompute them, but not the hoisted values that read no parameter
    // (constants, the rope tables).
    exec.init_params(2);
    exec.run().unwrap();
    let m = exec.module();
    let mut reads_params: Vec<bool> = m
        .values
        .iter()
        .map(|v| matches!(v.storage, Storage::Param { .. }))
        .collect();
    let mut constants = 0;
    for step in &m.steps {
        let reads = step.inputs.iter().any(|&i| reads_params[i as usize]);
        reads_params[step.outputs[0] as usize] = reads;
        let out = &m.values[step.outputs[0] as usize].storage;
        constants += usize::from(!reads && matches!(out, Storage::Hoisted { .. }));
    }
    assert!(constants > 0);
    assert_eq!(exec.step_times().iter().flatten().count(), all - constants);
    assert_ne!(first, exec.output_f32("logits").unwrap().1);
}

#[test]
fn packed_weights_follow_parameter_changes() {
    let module = compile_file("examples/tiny_llama.msl", &[("layers", "1")], true);
    let needs = mslc_artifact::runtime::RuntimeNeeds::of(&module).unwrap();
    let packed = needs.steps.iter().filter(|s| s.packed_b.is_some()).count();
    assert!(packed >= 4, "only {packed} matmuls read packed weights");
    let seeded = |exec: &mut mslc_exec::Executor, seed: u64| {
        exec.init_params(seed);
        exec.seed_input("tokens", 2).unwrap();
        exec.run().unwrap();
        exec.output_f32("logits").unwrap().1
    };
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let mut exec = executor(module.clone(), 2);
    let first = seeded(&mut exec, 1);
    // New parameters are packed again before use: the same bits as a fresh executor's.
    let second = seeded(&mut exec, 2);
    assert_ne!(bits(&first), bits(&second));
    let fresh = seeded(&mut executor(module, 1), 2);
    assert_eq!(bits(&second), bits(&fresh));
}

#[test]
fn cli_threads_profile_and_embedded_weights() {
    let dir = TestDir::new("cli");
    let module = compile_file("examples/mlp.msl", &[], true);
    write_weights(&dir.path("w.safetensors"), &random_weights(&module, 11));
    let images: Vec<f32> = Rng(4).vec(64 * 784, -1.0, 1.0);
    let images_path = dir.path("images.npy");
    write_npy(
        &images_path,
        &NpyArray::from_f32(vec![64, 784], &images).unwrap(),
    )
    .unwrap();
    let input = format!("images={}", s(&images_path));
    let run = |args: &[&str], out: &str| -> Vec<u8> {
        let out_dir = dir.path(out);
        let mut full = vec!["run", "--input", &input, "--output-dir", s(&out_dir)];
        full.extend_from_slice(args);
        let (code, stdout, err) = mslc(&full);
        assert_eq!(code, 0, "{args:?}:\n{stdout}\n{err}");
        std::fs::read(out_dir.join("logits.npy")).unwrap()
    };
    let w = s(&dir.path("w.safetensors")).to_string();
    let profile = dir.path("trace.json");
    let one = run(
        &["examples/mlp.msl", "--weights", &w, "--threads", "1"],
        "one",
    );
    let two = run(
        &[
            "examples/mlp.msl",
            "--weights",
            &w,
            "--threads",
            "2",
            "--profile",
            s(&profile),
        ],
        "two",
    );
    assert_eq!(one, two, "1 and 2 threads differ");
    let trace: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&profile).unwrap()).unwrap();
    assert!(trace["traceEvents"].as_array().is_some_and(|e| e.len() > 1));
    // Weights embedded by `mslc build` give what the same file gives from outside.
    let build = dir.path("build");
    let (code, out, err) = mslc(&[
        "build",
        "examples/mlp.msl",
        "-o",
        s(&build),
        "--embed-weights",
        &w,
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    let mir = build.join("Mlp.mir");
    let embedded = run(&[s(&mir)], "embedded");
    let outside = run(&[s(&mir), "--weights", &w], "outside");
    assert_eq!(embedded, outside);
}

#[test]
fn precision_flag_overrides_the_trains_policy() {
    let dir = TestDir::new("precision-flag");
    let tokens = dir.path("tokens.npy");
    let ids: Vec<i64> = (0..16).map(|i| (i * 37) % 1000).collect();
    write_npy(&tokens, &NpyArray::from_i64(vec![1, 16], &ids).unwrap()).unwrap();
    let source = root().join("examples/tiny_llama.msl");
    let input = format!("tokens={}", s(&tokens));
    let run = |file: &str, extra: &[&str]| -> Vec<f32> {
        let out = dir.path(&format!("out-{}", extra.join("-")));
        let mut args = vec!["run", file, "--init-seed", "3", "--input", &input];
        args.extend_from_slice(&["--output-dir", s(&out)]);
        args.extend_from_slice(extra);
        let (code, stdout, stderr) = mslc(&args);
        assert_eq!(code, 0, "mslc run {extra:?}:\n{stdout}\n{stderr}");
        read_npy(out.join("logits.npy")).unwrap().to_f32().unwrap()
    };
    let sets = ["--set", "layers=1"];
    // The train's policy (f16 mixed precision) is what `run FILE.msl` computes in, exactly as a
    // built artifact does.
    let mixed = run(s(&source), &sets);
    let (code, out, err) = mslc(&[
        "build",
        s(&source),
        sets[0],
        sets[1],
        "--dim",
        "S=16",
        "-o",
        s(&dir.0),
    ]);
    assert_eq!(code, 0, "mslc build:\n{out}\n{err}");
    let mir = dir.path("TinyLlama.mir");
    assert_eq!(run(s(&mir), &[]), mixed);
    // `--precision f32` computes in f32: the in-process f32 compile gives the same bits.
    let f32_logits = run(s(&source), &["--set", "layers=1", "--precision", "f32"]);
    assert_ne!(f32_logits, mixed);
    let module = compile_sized(
        "examples/tiny_llama.msl",
        &[("layers", "1")],
        &[("S", "16")],
    );
    let mut exec = executor(module, 2);
    exec.init_params(3);
    let array = NpyArray::from_i64(vec![1, 16], &ids).unwrap();
    exec.set_input("tokens", &array).expect("tokens");
    exec.run().expect("run");
    assert_eq!(exec.output_f32("logits").expect("logits").1, f32_logits);
    // An unknown policy is a usage error; a built artifact cannot be recompiled.
    let (code, _, err) = mslc(&["run", s(&source), "--precision", "O2", "--init-seed", "3"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("E0613") && err.contains("policies: f32, Mixed"),
        "{err}"
    );
    let (code, _, err) = mslc(&["run", s(&mir), "--precision", "f32", "--init-seed", "3"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--precision apply to .msl sources"), "{err}");
}

/// No kernel asks a pool thread for more scratch than the module reserves per thread (a larger
/// request would allocate while running, outside the memory plan): the tiny LLaMA's training
/// step (GEMMs and their gradients, attention and its gradient, cross-entropy, fused
/// elementwise programs), ResNet-50's forward at 64 × 64 (convolutions, pooling) and its
/// training step at 32 × 32 (the convolutions' and pools' gradients), on 2 threads.
#[test]
fn kernels_stay_within_the_scratch_each_thread_reserves() {
    let dir = TestDir::new("exec-scratch");
    let step = |file: &str, entry: &str, flags: &[&str]| {
        let out = dir.path(entry);
        let example = root().join(file);
        let mut args = vec!["build", s(&example), "--entry", entry, "-o", s(&out)];
        args.extend(flags);
        let (code, stdout, stderr) = mslc(&args);
        assert_eq!(code, 0, "{stdout}{stderr}");
        let bytes = std::fs::read(out.join(format!("{entry}.mir"))).unwrap();
        mslc_artifact::decode(&bytes).unwrap().module
    };
    let llama = step(
        "examples/tiny_llama.msl",
        "Pretrain",
        &crate::ranks::llama_flags(),
    );
    let resnet_step = step(
        "examples/resnet50.msl",
        "ImageNet",
        &["--dim", "B=2", "--dim", "R=32"],
    );
    let resnet = compile_sized("examples/resnet50.msl", &[], &[("B", "1"), ("R", "64")]);
    let modules = [
        ("training step", llama),
        ("resnet50", resnet),
        ("resnet50 training step", resnet_step),
    ];
    for (what, module) in modules {
        let mut exec = executor(module, 2);
        exec.init_params(3);
        for input in exec.unset_inputs() {
            exec.seed_input(&input, 4).expect("seeded input");
        }
        exec.run().expect("run");
        let (reserved, asked) = exec.scratch_floats();
        assert!(
            asked > 0 && asked <= reserved,
            "{what}: asked {asked} of {reserved}"
        );
        eprintln!("{what}: largest scratch request {asked} f32, reserved {reserved}");
    }
}

#[test]
fn a_reshape_over_its_own_f16_bytes_is_not_run() {
    // Under O2 the attention's heads are split and merged by reshapes of f16 values, which the
    // plan places over their operands: the executor leaves those bytes as they are, instead of
    // widening, copying and narrowing them back.
    let module = one_layer_llama_in_f16();
    let needs = mslc_artifact::runtime::RuntimeNeeds::of(&module).unwrap();
    let skipped: Vec<_> = module
        .steps
        .iter()
        .zip(&needs.steps)
        .filter(|(_, prepared)| prepared.copy == Some(CopyStep::Unchanged))
        .map(|(step, _)| step)
        .collect();
    assert!(skipped.len() >= 3, "{} steps left unrun", skipped.len());
    for step in &skipped {
        let (x, y) = (
            &module.values[step.inputs[0] as usize],
            &module.values[step.outputs[0] as usize],
        );
        assert_eq!(step.op, Op::Reshape);
        assert_eq!((x.ty.dtype, y.ty.dtype), (DType::F16, DType::F16));
        assert_eq!(x.storage, y.storage, "a reshape over its operand's bytes");
    }
    // They do not run, and the logits are the f32 model's, to f16's precision.
    let logits = |module: Module| {
        let mut exec = executor(module, 2);
        exec.init_params(1);
        exec.seed_input("tokens", 2).unwrap();
        exec.run().unwrap();
        let ran = (exec.module().steps.iter().zip(exec.step_times()))
            .filter(|(step, time)| step.op == Op::Reshape && time.is_some())
            .count();
        (exec.output_f32("logits").unwrap().1, ran)
    };
    let (want, _) = logits(compile_file(
        "examples/tiny_llama.msl",
        &[("layers", "1")],
        true,
    ));
    let reshapes = module.steps.iter().filter(|s| s.op == Op::Reshape).count();
    let left = reshapes - skipped.len();
    let (got, ran) = logits(module);
    assert_eq!(ran, left);
    let max = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    assert_close("O2 logits", &got, &want, 2e-2 * max, 0.0);
}
