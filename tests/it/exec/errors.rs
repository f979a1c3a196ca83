//! Bad inputs to the executor and `mslc run`: every one a clear error (exit 1), never a panic;
//! non-finite outputs a warning; a checkpoint's framework bookkeeping buffers a note.

use mslc_artifact::{encode, Module, Step, Storage, ValueInfo};
use mslc_core::ops::{Attrs, DType, Op, TensorType};
use mslc_exec::{ExecErrorKind, ExecOptions, Executor};
use mslc_io::npy::{write_npy, NpyArray};
use mslc_io::safetensors::{write_safetensors, StDType, TensorRef};
use mslc_kernels::binding::choose_kernel;

use super::common::{compile_file, mslc, one_step, s, TestDir};

/// Runs `mslc run` with `args`, expecting exit 1, no panic, and `expect` in stderr.
fn fails_with(args: &[&str], expect: &str) {
    fails_with_code(args, expect, 1);
}

/// Runs `mslc run` with `args`, expecting exit `want` (2: misused flags), no panic, and
/// `expect` in stderr.
fn fails_with_code(args: &[&str], expect: &str, want: i32) {
    let mut full = vec!["run"];
    full.extend_from_slice(args);
    let (code, out, err) = mslc(&full);
    assert!(!err.contains("panicked"), "panic for {args:?}:\n{err}");
    assert_eq!(code, want, "exit code for {args:?}:\n{out}\n{err}");
    assert!(
        err.contains(expect),
        "{args:?}: expected `{expect}` in:\n{err}"
    );
}

fn tokens(dir: &TestDir, name: &str, shape: Vec<usize>, ids: &[i64]) -> String {
    let path = dir.path(name);
    write_npy(&path, &NpyArray::from_i64(shape, ids).unwrap()).unwrap();
    format!("tokens={}", s(&path))
}

#[test]
fn bad_input_files_are_clear_errors() {
    let dir = TestDir::new("errors-inputs");
    let llama = "examples/tiny_llama.msl";
    let good = tokens(&dir, "good.npy", vec![1, 8], &[1; 8]);
    let bytes = std::fs::read(dir.path("good.npy")).unwrap();
    std::fs::write(dir.path("trunc.npy"), &bytes[..bytes.len() - 5]).unwrap();
    let trunc = format!("tokens={}", s(&dir.path("trunc.npy")));
    fails_with(
        &[llama, "--init-seed", "1", "--input", &trunc],
        "input `tokens`",
    );
    std::fs::write(dir.path("junk.npy"), b"not an npy file at all").unwrap();
    let junk = format!("tokens={}", s(&dir.path("junk.npy")));
    fails_with(
        &[llama, "--init-seed", "1", "--input", &junk],
        "input `tokens`",
    );
    let missing = format!("tokens={}", s(&dir.path("absent.npy")));
    fails_with(
        &[llama, "--init-seed", "1", "--input", &missing],
        "input `tokens`",
    );
    let rank3 = tokens(&dir, "rank3.npy", vec![1, 2, 4], &[1; 8]);
    fails_with(
        &[llama, "--init-seed", "1", "--input", &rank3],
        "must have shape",
    );
    let floats = dir.path("floats.npy");
    write_npy(&floats, &NpyArray::from_f32(vec![1, 8], &[1.0; 8]).unwrap()).unwrap();
    let floats = format!("tokens={}", s(&floats));
    fails_with(
        &[llama, "--init-seed", "1", "--input", &floats],
        "input `tokens` is i32",
    );
    let big = tokens(&dir, "big.npy", vec![1, 8], &[1, 2, 3, 5000, 4, 5, 6, 7]);
    fails_with(
        &[llama, "--init-seed", "1", "--input", &big],
        "id 5000 is outside the table",
    );
    fails_with(
        &[llama, "--init-seed", "1", "--input", "nope=x.npy"],
        "input `nope`",
    );
    fails_with_code(
        &[
            llama,
            "--init-seed",
            "1",
            "--iterations",
            "0",
            "--input",
            &good,
        ],
        "--iterations",
        2,
    );
    fails_with_code(&[llama, "--input", &good], "--weights", 2);
}

#[test]
fn bad_weights_are_reported_together() {
    let dir = TestDir::new("errors-weights");
    let llama = "examples/tiny_llama.msl";
    fails_with(
        &[llama, "--weights", s(&dir.path("absent.safetensors"))],
        "cannot read weights",
    );
    std::fs::write(dir.path("junk.safetensors"), [0xffu8; 64]).unwrap();
    fails_with(
        &[llama, "--weights", s(&dir.path("junk.safetensors"))],
        "cannot read weights",
    );
    let data = vec![0u8; 4 * 256];
    let tensors = [
        mslc_io::safetensors::TensorRef {
            name: "model.norm.weight",
            dtype: mslc_io::safetensors::StDType::F32,
            shape: &[256],
            data: &data,
        },
        mslc_io::safetensors::TensorRef {
            name: "lm_head.weight",
            dtype: mslc_io::safetensors::StDType::F32,
            shape: &[4, 64],
            data: &data,
        },
        mslc_io::safetensors::TensorRef {
            name: "not.a.param",
            dtype: mslc_io::safetensors::StDType::I32,
            shape: &[256],
            data: &data,
        },
    ];
    let partial = dir.path("partial.safetensors");
    mslc_io::safetensors::write_safetensors(&partial, &tensors).unwrap();
    let (code, _, err) = mslc(&["run", llama, "--weights", s(&partial)]);
    assert_eq!(code, 1);
    assert!(
        err.contains("missing from the file: model.embed_tokens.weight"),
        "{err}"
    );
    assert!(
        err.contains("`lm_head.weight` is f32[4,64] in the file"),
        "{err}"
    );
    assert!(
        err.contains("not parameters of the model: not.a.param"),
        "{err}"
    );
}

/// A torchvision-style checkpoint of a conv + BatchNorm model, with BatchNorm's
/// `num_batches_tracked` counter and, when given, one more tensor.
fn batchnorm_checkpoint(dir: &TestDir, extra: Option<&str>) -> (String, String) {
    let model = dir.path("bn.msl");
    std::fs::write(
        &model,
        "import std.nn.{Conv2d, BatchNorm2d}\n\nmodel Bn {\n    dims B = 1\n    input x: [B, 2, 4, 4]\n    output y = bn1: BatchNorm2d(conv1: Conv2d(x, 3, kernel: 1))\n}\n",
    )
    .unwrap();
    let ones = 1f32.to_le_bytes().repeat(6);
    let count = 7i64.to_le_bytes();
    let f32s = |name, shape: &'static [usize]| TensorRef {
        name,
        dtype: StDType::F32,
        shape,
        data: &ones[..4 * shape.iter().product::<usize>()],
    };
    let mut tensors = vec![
        f32s("conv1.weight", &[3, 2, 1, 1]),
        f32s("bn1.weight", &[3]),
        f32s("bn1.bias", &[3]),
        f32s("bn1.running_mean", &[3]),
        f32s("bn1.running_var", &[3]),
        TensorRef {
            name: "bn1.num_batches_tracked",
            dtype: StDType::I64,
            shape: &[],
            data: &count,
        },
    ];
    if let Some(name) = extra {
        tensors.push(f32s(name, &[3]));
    }
    let weights = dir.path("bn.safetensors");
    write_safetensors(&weights, &tensors).unwrap();
    (s(&model).to_string(), s(&weights).to_string())
}

#[test]
fn bookkeeping_buffers_load_with_a_note_and_unknown_extras_stay_errors() {
    let dir = TestDir::new("errors-bookkeeping");
    let (model, weights) = batchnorm_checkpoint(&dir, None);
    let x = dir.path("x.npy");
    write_npy(
        &x,
        &NpyArray::from_f32(vec![1, 2, 4, 4], &[0.5; 32]).unwrap(),
    )
    .unwrap();
    let input = format!("x={}", s(&x));
    let (code, out, err) = mslc(&["run", &model, "--weights", &weights, "--input", &input]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("weights: ignored 1 tensor(s) of framework bookkeeping, torch BatchNorm's count of training batches (bn1.num_batches_tracked)"),
        "{out}"
    );
    let (model, weights) = batchnorm_checkpoint(&dir, Some("bn1.momentum"));
    let (code, _, err) = mslc(&["run", &model, "--weights", &weights, "--input", &input]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("E0601"), "{err}");
    assert!(
        err.contains("not parameters of the model: bn1.momentum\n")
            || err.ends_with("not parameters of the model: bn1.momentum"),
        "{err}"
    );
    assert!(!err.contains("num_batches_tracked"), "{err}");
}

#[test]
fn bad_artifacts_are_clear_errors() {
    let dir = TestDir::new("errors-mir");
    let module = compile_file("examples/mlp.msl", &[], true);
    let bytes = encode(&module, None);
    let good = dir.path("mlp.mir");
    std::fs::write(&good, &bytes).unwrap();
    let (code, out, err) = mslc(&["run", s(&good), "--init-seed", "3", "--threads", "1"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("GFLOP/s"), "{out}");
    let mut flipped = bytes.clone();
    flipped[40] ^= 0x55;
    std::fs::write(dir.path("flipped.mir"), &flipped).unwrap();
    fails_with(
        &[s(&dir.path("flipped.mir")), "--init-seed", "1"],
        "checksum",
    );
    std::fs::write(dir.path("short.mir"), &bytes[..30]).unwrap();
    fails_with(
        &[s(&dir.path("short.mir")), "--init-seed", "1"],
        "short.mir",
    );
    fails_with(
        &[s(&dir.path("absent.mir")), "--init-seed", "1"],
        "cannot read",
    );
    fails_with_code(
        &[s(&good), "--set", "depth=3", "--init-seed", "1"],
        "--set, --dim and --precision apply to .msl sources",
        2,
    );
}

#[test]
fn nan_inputs_warn_about_the_outputs() {
    let dir = TestDir::new("errors-nan");
    let mut images = vec![0.5f32; 64 * 784];
    images[100] = f32::NAN;
    let path = dir.path("images.npy");
    write_npy(&path, &NpyArray::from_f32(vec![64, 784], &images).unwrap()).unwrap();
    let input = format!("images={}", s(&path));
    let (code, out, err) = mslc(&[
        "run",
        "examples/mlp.msl",
        "--init-seed",
        "1",
        "--input",
        &input,
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        err.contains("W0003") && err.contains("output(s) `logits` hold NaN or infinite values"),
        "{err}"
    );
}

/// A module computing `x → neg → softmax → silu → add x → cast f16 → relu`, every arena step
/// after the first written over its input 0 (offset 0), the f16 pair at offset 128.
fn in_place_chain() -> Module {
    let f32t = TensorType::new(DType::F32, [4, 8]);
    let f16t = TensorType::new(DType::F16, [4, 8]);
    let mut values = vec![ValueInfo {
        ty: f32t.clone(),
        storage: Storage::Input { name: "x".into() },
    }];
    let mut steps = Vec::new();
    let chain = [
        (Op::Neg, Attrs::new(), vec![0u32], &f32t, 0u64),
        (
            Op::Softmax,
            Attrs::new().with("axis", -1i64),
            vec![1],
            &f32t,
            0,
        ),
        (Op::Silu, Attrs::new(), vec![2], &f32t, 0),
        (Op::Add, Attrs::new(), vec![3, 0], &f32t, 0),
        (
            Op::Cast,
            Attrs::new().with("dtype", DType::F16),
            vec![4],
            &f16t,
            128,
        ),
        (Op::Relu, Attrs::new(), vec![5], &f16t, 128),
    ];
    for (op, attrs, inputs, ty, offset) in chain {
        values.push(ValueInfo {
            ty: ty.clone(),
            storage: Storage::Arena { offset },
        });
        steps.push(Step {
            op,
            kernel: choose_kernel(op),
            attrs,
            inputs,
            outputs: vec![values.len() as u32 - 1],
            origin: String::new(),
            loc: None,
        });
    }
    Module {
        name: "chain".into(),
        target: "cpu".into(),
        target_fingerprint: String::new(),
        outputs: vec![("y".into(), values.len() as u32 - 1)],
        values,
        steps,
        arena_bytes: 192,
        hoisted_bytes: 0,
        guard: None,
    }
}

/// A step of `op` reading `inputs` into the one value `out`, with the op's default kernel.
fn step_of(op: Op, attrs: Attrs, inputs: Vec<u32>, out: u32) -> Step {
    Step {
        op,
        kernel: choose_kernel(op),
        attrs,
        inputs,
        outputs: vec![out],
        origin: String::new(),
        loc: None,
    }
}

/// A `reshape` step to `shape`.
fn reshape_step(shape: [i64; 2], input: u32, out: u32) -> Step {
    step_of(
        Op::Reshape,
        Attrs::new().with("shape", shape.to_vec()),
        vec![input],
        out,
    )
}

/// The module of `steps` over input `x: f32[4, 8]` (value 0) and f32 arena values of
/// `shapes` (values 1, 2, ...), the last one output as `y`, placed by the memory planner.
fn planned_views(shapes: &[[i64; 2]], steps: Vec<Step>) -> Module {
    let t = |shape: [i64; 2]| TensorType::new(DType::F32, shape);
    let input = ValueInfo {
        ty: t([4, 8]),
        storage: Storage::Input { name: "x".into() },
    };
    let arena = shapes.iter().map(|&shape| ValueInfo {
        ty: t(shape),
        storage: Storage::Arena { offset: 0 },
    });
    let mut m = Module {
        name: "views".into(),
        target: "cpu".into(),
        target_fingerprint: String::new(),
        values: std::iter::once(input).chain(arena).collect(),
        steps,
        outputs: vec![("y".into(), shapes.len() as u32)],
        arena_bytes: 0,
        hoisted_bytes: 0,
        guard: None,
    };
    mslc_plan::memory::plan_memory(&mut m, false).expect("planned");
    m
}

/// Where the planner put arena value `v` of `m`.
fn arena_offset(m: &Module, v: usize) -> u64 {
    match m.values[v].storage {
        Storage::Arena { offset } => offset,
        ref other => panic!("%{v} is {other:?}"),
    }
}

/// `output y` of `m` run on `x` = 0..32 − 10 (shape [4, 8]), with that `x`.
fn run_views(m: Module) -> (Vec<f32>, Vec<f32>) {
    let x: Vec<f32> = (0..32).map(|i| i as f32 - 10.0).collect();
    let mut exec = Executor::new(m, &ExecOptions::default()).unwrap();
    exec.set_input("x", &NpyArray::from_f32(vec![4, 8], &x).unwrap())
        .unwrap();
    exec.run().unwrap();
    (exec.output_f32("y").unwrap().1, x)
}

/// `v = neg(x)`, `r = reshape(v, [8, 4])`, `n = neg(r)`, `t = reshape(n, [4, 8])`,
/// `y = add(v, t)`, every value in the arena, placed by the memory planner.
fn view_chain() -> Module {
    planned_views(
        &[[4, 8], [8, 4], [8, 4], [4, 8], [4, 8]],
        vec![
            step_of(Op::Neg, Attrs::new(), vec![0], 1),
            reshape_step([8, 4], 1, 2),
            step_of(Op::Neg, Attrs::new(), vec![2], 3),
            reshape_step([4, 8], 3, 4),
            step_of(Op::Add, Attrs::new(), vec![1, 4], 5),
        ],
    )
}

/// A reshape shares its input's buffer even while the input stays alive (no copy), and a
/// later step may not write in place over the view while the input it shares bytes with is
/// still read.
#[test]
fn reshapes_are_views_of_live_buffers() {
    let m = view_chain();
    let offset = |v: usize| arena_offset(&m, v);
    // The view of the live %1 shares its bytes; the neg of that view, while %1 is still read
    // by the add, gets bytes of its own; the add then writes over %1 (and its view), both dead.
    assert_eq!(offset(2), offset(1));
    assert_ne!(offset(3), offset(1));
    assert_eq!((offset(4), offset(5)), (offset(3), offset(1)));
    assert_eq!(m.arena_bytes, 2 * 128);
    let (got, _) = run_views(m.clone());
    // -x + -(-x) = 0 exactly: the view's neg did not clobber %1.
    assert_eq!(got, vec![0.0; 32]);
    // Crafted: the neg written over the view while %1 is still read.
    let mut clobbering = m;
    clobbering.values[3].storage = clobbering.values[2].storage.clone();
    clobbering.values[4].storage = clobbering.values[2].storage.clone();
    rejected(clobbering, "overlaps %1");
}

/// `v = neg(x)`, `r = reshape(v)`, `y = add(v, reshape(r))`: both operands of the add are
/// views of one buffer and die there, so the planner may not write the add over it (its other
/// operand reads the same bytes): the add gets a buffer of its own and computes `-2x`.
#[test]
fn no_step_writes_in_place_over_a_buffer_its_other_operand_reads_through_a_view() {
    let m = planned_views(
        &[[4, 8], [8, 4], [4, 8], [4, 8]],
        vec![
            step_of(Op::Neg, Attrs::new(), vec![0], 1),
            reshape_step([8, 4], 1, 2),
            reshape_step([4, 8], 2, 3),
            step_of(Op::Add, Attrs::new(), vec![1, 3], 4),
        ],
    );
    let offset = |v: usize| arena_offset(&m, v);
    assert_eq!((offset(2), offset(3)), (offset(1), offset(1)));
    assert_ne!(offset(4), offset(1));
    let (got, x) = run_views(m);
    let want: Vec<f32> = x.iter().map(|v| -2.0 * v).collect();
    assert_eq!(got, want);
}

#[test]
fn in_place_steps_compute_what_separate_buffers_would() {
    let x: Vec<f32> = (0..32).map(|i| (i as f32 - 16.0) / 4.0).collect();
    let mut exec = Executor::new(
        in_place_chain(),
        &ExecOptions {
            threads: 2,
            ..ExecOptions::default()
        },
    )
    .unwrap();
    exec.set_input("x", &NpyArray::from_f32(vec![4, 8], &x).unwrap())
        .unwrap();
    exec.run().unwrap();
    let (shape, got) = exec.output_f32("y").unwrap();
    assert_eq!(shape, vec![4, 8]);
    let mut want = Vec::new();
    for row in x.chunks(8) {
        let max = row.iter().map(|v| -v).fold(f32::NEG_INFINITY, f32::max);
        let sum: f32 = row.iter().map(|v| (-v - max).exp()).sum();
        for &v in row {
            let p = (-v - max).exp() / sum;
            let y = p / (1.0 + (-p).exp()) + v;
            want.push(half::f16::from_f32(y).to_f32().max(0.0));
        }
    }
    // f16 output: one f16 ulp (2^-10 relative) plus the f32 kernels' error.
    super::common::assert_close("in-place chain", &got, &want, 1e-5, 2e-3);
}

#[test]
fn crafted_overlaps_and_kernels_are_rejected() {
    let mut m = in_place_chain();
    m.values[2].storage = Storage::Arena { offset: 64 };
    let e = Executor::new(m, &ExecOptions::default())
        .err()
        .expect("rejected");
    assert_eq!(e.kind, ExecErrorKind::Module);
    // The validator's liveness check finds it first: %1 is still read when %2 is written.
    assert!(
        e.message.contains("invalid module") && e.message.contains("overlaps %1"),
        "{}",
        e.message
    );
    let mut m = in_place_chain();
    m.steps[1].kernel.name = "gemm".into();
    let e = Executor::new(m, &ExecOptions::default())
        .err()
        .expect("rejected");
    assert!(
        e.message
            .contains("step 1 (softmax): asks for kernel `gemm`"),
        "{}",
        e.message
    );
    let mut m = in_place_chain();
    m.steps[1].kernel.params.insert(
        "rows_per_task".into(),
        mslc_kernels::binding::KernelParam::Int(8),
    );
    let e = Executor::new(m, &ExecOptions::default())
        .err()
        .expect("rejected");
    assert!(
        e.message.contains("no integer parameter `rows_per_task`"),
        "{}",
        e.message
    );
    let mut m = in_place_chain();
    m.arena_bytes = 100;
    let e = Executor::new(m, &ExecOptions::default())
        .err()
        .expect("rejected");
    assert!(e.message.contains("invalid module"), "{}", e.message);
}

/// Asserts the executor refuses module `m` as invalid, with a message containing `want`.
fn rejected(m: Module, want: &str) {
    let e = Executor::new(m, &ExecOptions::default())
        .err()
        .expect("rejected");
    assert_eq!(e.kind, ExecErrorKind::Module);
    assert!(e.message.contains(want), "want `{want}`: {}", e.message);
}

/// A multi-output step's outputs are all checked: two placed over each other, or a step giving
/// fewer outputs than its op has, are refused.
#[test]
fn crafted_multi_output_steps_are_rejected() {
    let q = TensorType::new(DType::F32, [1, 4, 2, 8]);
    let qkv = [q.clone(), q.clone(), q];
    let m = one_step(Op::AttentionLse, Attrs::new(), &qkv);
    assert_eq!(m.steps[0].outputs.len(), 2);
    let mut overlapping = m.clone();
    overlapping.values[4].storage = Storage::Arena { offset: 0 };
    rejected(overlapping, "overlaps %3");
    let mut short = m;
    short.steps[0].outputs.pop();
    rejected(short, "has 1 outputs, the op gives 2");
}

#[test]
fn crafted_hoisted_values_are_rejected() {
    // Computed from an input, so it would go stale on the next run.
    let mut m = in_place_chain();
    m.values[1].storage = Storage::Hoisted { offset: 0 };
    m.hoisted_bytes = 128;
    rejected(m, "reads %0, which is not a parameter or hoisted value");
    // Outside the region.
    let mut m = in_place_chain();
    m.values[1].storage = Storage::Hoisted { offset: 0 };
    rejected(m, "does not fit the 0-byte hoisted region");
    // Two hoisted values sharing bytes.
    let mut m = in_place_chain();
    m.values[0].storage = Storage::Param {
        path: "x".into(),
        init: mslc_core::program::Init::Zeros,
        trainable: true,
    };
    m.values[1].storage = Storage::Hoisted { offset: 0 };
    m.values[2].storage = Storage::Hoisted { offset: 64 };
    m.hoisted_bytes = 256;
    rejected(m, "hoisted values %1 and %2 overlap");
}

#[test]
fn a_next_value_changes_buffers_with_its_input_and_crafted_ones_are_rejected() {
    // `x0 ← −x0`: the result is the next value of input `x0`, output under its name.
    let next_of_input = || {
        let mut m = one_step(Op::Neg, Attrs::new(), &[TensorType::new(DType::F32, [4])]);
        m.outputs = vec![("x0".into(), 1)];
        m.values[1].storage = Storage::Next { name: "x0".into() };
        m
    };
    let mut exec = Executor::new(next_of_input(), &ExecOptions::default()).unwrap();
    exec.set_input(
        "x0",
        &NpyArray::from_f32(vec![4], &[1.0, -2.0, 3.0, 0.5]).unwrap(),
    )
    .unwrap();
    exec.run().unwrap();
    assert_eq!(exec.output_f32("x0").unwrap().1, [-1.0, 2.0, -3.0, -0.5]);
    exec.write_back(["x0"]).unwrap();
    // The input now holds the result; the output, the replaced value until the next run.
    assert_eq!(exec.input_f32("x0").unwrap().1, [-1.0, 2.0, -3.0, -0.5]);
    assert_eq!(exec.output_f32("x0").unwrap().1, [1.0, -2.0, 3.0, 0.5]);
    exec.run().unwrap();
    assert_eq!(exec.output_f32("x0").unwrap().1, [1.0, -2.0, 3.0, 0.5]);
    // Output under another name than the input it claims to replace.
    let mut m = next_of_input();
    m.outputs = vec![("y".into(), 1)];
    rejected(m, "the next value of `x0`, is not the output `x0`");
    // No input or parameter of that name and type.
    let mut m = next_of_input();
    m.outputs = vec![("z".into(), 1)];
    m.values[1].storage = Storage::Next { name: "z".into() };
    rejected(m, "no input or parameter `z` has its type");
    let mut m = one_step(Op::Sum, Attrs::new(), &[TensorType::new(DType::F32, [4])]);
    m.outputs = vec![("x0".into(), 1)];
    m.values[1].storage = Storage::Next { name: "x0".into() };
    rejected(m, "no input or parameter `x0` has its type");
}

/// An update computed over the input it replaces (`Storage::Overwrite`, as `torch.optim`
/// updates in place): an AdamW step whose p, m and v are inputs `x0`, `x2` and `x3` gives, run
/// after run, the bits of the same step with buffers of its own (`Storage::Next`, written back
/// by exchange), as does one that overwrites m and v and updates a copy of p in p's own buffer
/// (an optimizer-sharded update's p, a slice); its write-back moves nothing. Crafted claims that would read an
/// overwritten value, or write one over an operand its kernel cannot, are rejected.
#[test]
fn an_update_over_its_input_is_the_update_into_buffers_of_its_own() {
    let t = TensorType::new(DType::F32, [1000]);
    let scalar = TensorType::new(DType::F32, Vec::<i64>::new());
    let attrs = Attrs::new()
        .with("beta1", 0.9)
        .with("beta2", 0.999)
        .with("eps", 1e-8)
        .with("weight_decay", 0.1)
        .with("decoupled", true);
    let names = ["x0", "x2", "x3"];
    // Whether p, m and v each overwrite their input.
    let adam = |over: [bool; 3]| {
        let mut inputs = vec![t.clone(); 4];
        inputs.extend([scalar.clone(), scalar.clone(), scalar.clone()]);
        let mut m = one_step(Op::AdamUpdate, attrs.clone(), &inputs);
        m.outputs = names
            .iter()
            .zip(7u32..)
            .map(|(n, v)| (n.to_string(), v))
            .collect();
        for ((n, v), over) in names.iter().zip(7usize..).zip(over) {
            let name = n.to_string();
            m.values[v].storage = match over {
                true => Storage::Overwrite { name },
                false => Storage::Next { name },
            };
        }
        m
    };
    let array = |values: Vec<f32>| NpyArray::from_f32(vec![values.len()], &values).unwrap();
    let wave = |k: usize, scale: f32| -> Vec<f32> {
        (0..1000)
            .map(|i| scale * ((i * 7 + k * 13) as f32 * 0.37).sin())
            .collect()
    };
    let train = |over: [bool; 3]| {
        let mut exec = Executor::new(adam(over), &ExecOptions::default()).unwrap();
        exec.set_input("x0", &array(wave(0, 1.0))).unwrap();
        exec.set_input("x2", &array(vec![0.0; 1000])).unwrap();
        exec.set_input("x3", &array(vec![0.0; 1000])).unwrap();
        for step in 1..=3 {
            let scalar = |x: f64| NpyArray::from_f32(vec![], &[x as f32]).unwrap();
            exec.set_input("x1", &array(wave(step, 0.1))).unwrap();
            exec.set_input("x4", &scalar(1e-3)).unwrap();
            exec.set_input("x5", &scalar(1e-3 / (1.0 - 0.9f64.powi(step as i32))))
                .unwrap();
            exec.set_input("x6", &scalar((1.0 - 0.999f64.powi(step as i32)).sqrt()))
                .unwrap();
            exec.run().unwrap();
            exec.write_back(names).unwrap();
        }
        names.map(|n| exec.input_f32(n).unwrap().1)
    };
    let next = train([false; 3]);
    for kinds in [[true; 3], [false, true, true]] {
        let over = train(kinds);
        for ((name, a), b) in names.iter().zip(&over).zip(&next) {
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(a), bits(b), "{name} {kinds:?}");
        }
        assert_ne!(over[0], wave(0, 1.0), "the parameter moved");
    }
    // m and v are written in place together or not at all, and p only with them.
    for kinds in [
        [true, false, false],
        [false, true, false],
        [true, true, false],
    ] {
        rejected(adam(kinds), "overwrites its states together");
    }
    // `y ← x0 + x0` over x0 reads it twice; over x1 it writes an operand its kernel cannot.
    let add = |name: &str, inputs: Vec<u32>| {
        let mut m = one_step(Op::Add, Attrs::new(), &[t.clone(), t.clone()]);
        m.steps[0].inputs = inputs;
        m.outputs = vec![(name.into(), 2)];
        m.values[2].storage = Storage::Overwrite { name: name.into() };
        m
    };
    rejected(add("x0", vec![0, 0]), "reads it twice");
    rejected(
        add("x1", vec![0, 1]),
        "cannot write its output 0 over that operand",
    );
    // A later step reads the overwritten input, whether the step writing over it read it
    // or not (`x1 + x1` written into x0's buffer).
    for inputs in [vec![0, 1], vec![1, 1]] {
        let mut m = add("x0", inputs);
        m.values.push(ValueInfo {
            ty: t.clone(),
            storage: Storage::Arena { offset: 0 },
        });
        m.steps.push(Step {
            op: Op::Neg,
            kernel: choose_kernel(Op::Neg),
            attrs: Attrs::new(),
            inputs: vec![0],
            outputs: vec![3],
            origin: "test".into(),
            loc: None,
        });
        m.outputs.push(("z".into(), 3));
        rejected(m, "step 1 (neg) reads it after step 0 overwrote it");
    }
    // A fused program may write over any operand of its output's type, which it reads from a
    // copy: a gradient sum `acc ← acc + g · s` whose program numbers acc last (x2).
    let program = Attrs::new().with("program", "mul(x0, x1); add(x2, t0)");
    let scalar1 = TensorType::new(DType::F32, [1]);
    let mut sum = one_step(
        Op::FusedElementwise,
        program,
        &[t.clone(), scalar1, t.clone()],
    );
    sum.outputs = vec![("x2".into(), 3)];
    sum.values[3].storage = Storage::Overwrite { name: "x2".into() };
    let mut exec = Executor::new(sum, &ExecOptions::default()).unwrap();
    exec.set_input("x1", &array(vec![0.5])).unwrap();
    exec.set_input("x2", &array(wave(2, 1.0))).unwrap();
    for k in 3..5 {
        exec.set_input("x0", &array(wave(k, 1.0))).unwrap();
        exec.run().unwrap();
        exec.write_back(["x2"]).unwrap();
    }
    let want: Vec<f32> = (0..1000)
        .map(|i| wave(2, 1.0)[i] + wave(3, 1.0)[i] * 0.5 + wave(4, 1.0)[i] * 0.5)
        .collect();
    // (Within rounding: the kernel may fuse the multiply-add.)
    for (got, want) in exec.input_f32("x2").unwrap().1.iter().zip(&want) {
        assert!(
            (got - want).abs() <= 1e-6 * want.abs().max(1.0),
            "{got} {want}"
        );
    }
    // Into the buffer of an input nothing reads any more: x0 becomes x1 + x1.
    let mut exec = Executor::new(add("x0", vec![1, 1]), &ExecOptions::default()).unwrap();
    exec.set_input("x0", &array(vec![5.0; 1000])).unwrap();
    exec.set_input("x1", &array(wave(1, 1.0))).unwrap();
    exec.run().unwrap();
    exec.write_back(["x0"]).unwrap();
    let doubled: Vec<f32> = wave(1, 1.0).iter().map(|x| x + x).collect();
    assert_eq!(exec.input_f32("x0").unwrap().1, doubled);
}

/// y = x + neg(w) + c over four values: `c` (a constant) and `neg(w)` are hoisted; `y` is also
/// output as `x` and `w`, to write it back over the input or the parameter.
fn hoisting_module() -> Module {
    let t = TensorType::new(DType::F32, [4]);
    let scalar = TensorType::new(DType::F32, Vec::<i64>::new());
    let value = |ty: &TensorType, storage| ValueInfo {
        ty: ty.clone(),
        storage,
    };
    Module {
        name: "hoisting".into(),
        target: "cpu".into(),
        target_fingerprint: String::new(),
        values: vec![
            value(&t, Storage::Input { name: "x".into() }),
            value(
                &t,
                Storage::Param {
                    path: "w".into(),
                    init: mslc_core::program::Init::Ones,
                    trainable: true,
                },
            ),
            value(&scalar, Storage::Hoisted { offset: 0 }),
            value(&t, Storage::Hoisted { offset: 64 }),
            value(&t, Storage::Arena { offset: 0 }),
            value(&t, Storage::Arena { offset: 64 }),
        ],
        steps: vec![
            step_of(
                Op::Constant,
                Attrs::new().with("value", 0.5).with("dtype", DType::F32),
                vec![],
                2,
            ),
            step_of(Op::Neg, Attrs::new(), vec![1], 3),
            step_of(Op::Add, Attrs::new(), vec![0, 3], 4),
            step_of(Op::Add, Attrs::new(), vec![4, 2], 5),
        ],
        // Also output as `x` and `w`, to write it back over the input or the parameter.
        outputs: vec![("y".into(), 5), ("x".into(), 5), ("w".into(), 5)],
        arena_bytes: 128,
        hoisted_bytes: 128,
        guard: None,
    }
}

#[test]
fn new_parameters_recompute_only_the_hoisted_values_that_read_them() {
    // y = x + neg(w) + c: `c` (a constant) and `neg(w)` are hoisted; a parameter change (a
    // training step's write-back, a reload) recomputes `neg(w)` but never the constant, and an
    // input's write-back neither.
    let mut exec = hoisting_executor(hoisting_module());
    exec.run().unwrap();
    assert_eq!(ran(&exec), [true, true, true, true]);
    assert_eq!(exec.output_f32("y").unwrap().1, [0.5, 1.5, 2.5, 3.5]);
    exec.run().unwrap();
    assert_eq!(ran(&exec), [false, false, true, true]);
    exec.init_params(0);
    exec.run().unwrap();
    assert_eq!(ran(&exec), [false, true, true, true]);
    assert_eq!(exec.output_f32("y").unwrap().1, [0.5, 1.5, 2.5, 3.5]);
    // Writing back an input (a gradient accumulator between micro-batches) changes no
    // parameter: the hoisted values, and the weights packed ahead, are kept.
    exec.write_back(["x"]).unwrap();
    exec.run().unwrap();
    assert_eq!(ran(&exec), [false, false, true, true]);
    assert_eq!(exec.output_f32("y").unwrap().1, [0.0, 1.0, 2.0, 3.0]);
    // Writing back the parameter recomputes what reads it.
    exec.write_back(["w"]).unwrap();
    exec.run().unwrap();
    assert_eq!(ran(&exec), [false, true, true, true]);
    assert_eq!(exec.output_f32("y").unwrap().1, [1.0; 4]);
}

/// An executor of `module` (a [`hoisting_module`]) with `x` = [1, 2, 3, 4] and `w` = ones.
fn hoisting_executor(module: Module) -> Executor {
    let mut exec = Executor::new(module, &ExecOptions::default()).unwrap();
    exec.set_input(
        "x",
        &NpyArray::from_f32(vec![4], &[1.0, 2.0, 3.0, 4.0]).unwrap(),
    )
    .unwrap();
    exec.init_params(0);
    exec
}

/// Which steps of an executor's last run ran (a hoisted step whose inputs did not change skips).
fn ran(exec: &Executor) -> Vec<bool> {
    exec.step_times().iter().map(Option::is_some).collect()
}

#[test]
fn lent_parameters_run_the_borrower_and_refresh_what_reads_them_on_return() {
    // A pipeline stage's forward and update run on its step's parameters, lent for the run:
    // the lender cannot run meanwhile, and what the borrower writes into them is what the
    // lender computes from afterwards (its hoisted `neg(w)` is recomputed, the constant not).
    let x = NpyArray::from_f32(vec![4], &[1.0, 2.0, 3.0, 4.0]).unwrap();
    let mut lender = Executor::new(hoisting_module(), &ExecOptions::default()).unwrap();
    let mut borrower =
        Executor::borrowing(hoisting_module(), &lender, &ExecOptions::default()).unwrap();
    lender.set_input("x", &x).unwrap();
    borrower.set_input("x", &x).unwrap();
    lender.init_params(0);
    // The parameter `w` is 4 f32: the borrower holds none of its own.
    assert_eq!(lender.allocated_bytes() - borrower.allocated_bytes(), 16);
    let refused = borrower.run().unwrap_err();
    assert!(refused.message.contains("no values"), "{}", refused.message);
    lender.run().unwrap();
    assert_eq!(lender.output_f32("y").unwrap().1, [0.5, 1.5, 2.5, 3.5]);

    lender.swap_params(&mut borrower).unwrap();
    assert_eq!(borrower.allocated_bytes() - lender.allocated_bytes(), 16);
    let refused = lender.run().unwrap_err();
    assert!(refused.message.contains("lent"), "{}", refused.message);
    let refused = lender.load_weights(std::iter::empty()).unwrap_err();
    assert!(refused.message.contains("lent"), "{}", refused.message);
    borrower.run().unwrap();
    assert_eq!(borrower.output_f32("y").unwrap().1, [0.5, 1.5, 2.5, 3.5]);
    // The borrower updates the parameter (w ← y) and gives it back.
    borrower.write_back(["w"]).unwrap();
    lender.swap_params(&mut borrower).unwrap();
    lender.run().unwrap();
    assert_eq!(ran(&lender), [false, true, true, true]);
    assert_eq!(lender.output_f32("y").unwrap().1, [1.0; 4]);
    // Lent again unchanged, the borrower keeps what it computed from them.
    lender.swap_params(&mut borrower).unwrap();
    borrower.run().unwrap();
    assert_eq!(ran(&borrower), [false, true, true, true]);
    lender.swap_params(&mut borrower).unwrap();
    lender.run().unwrap();
    assert_eq!(ran(&lender), [false, false, true, true]);
    // A borrower whose parameters the lender lacks is refused, nothing exchanged.
    let mut other = hoisting_module();
    if let Storage::Param { path, .. } = &mut other.values[1].storage {
        *path = "v".into();
    }
    let mut stranger = Executor::new(other, &ExecOptions::default()).unwrap();
    let refused = lender.swap_params(&mut stranger).unwrap_err();
    assert!(refused.message.contains("`v`"), "{}", refused.message);
    lender.run().unwrap();
}

#[test]
fn a_run_for_some_outputs_skips_the_steps_they_do_not_need() {
    // An earlier micro-batch of a training step keeps its gradient sums and skips the update:
    // here `partial` = x + neg(w) needs the third step, not the last (y = partial + c); the
    // hoisted values still run while stale, since later runs count on them.
    let mut module = hoisting_module();
    module.outputs.push(("partial".into(), 4));
    let mut exec = hoisting_executor(module);
    exec.run_for(&["partial"]).unwrap();
    assert_eq!(ran(&exec), [true, true, true, false]);
    assert_eq!(exec.output_f32("partial").unwrap().1, [0.0, 1.0, 2.0, 3.0]);
    exec.run_for(&["partial"]).unwrap();
    assert_eq!(ran(&exec), [false, false, true, false]);
    exec.run_for(&["y", "partial"]).unwrap();
    assert_eq!(ran(&exec), [false, false, true, true]);
    assert_eq!(exec.output_f32("y").unwrap().1, [0.5, 1.5, 2.5, 3.5]);
    let refused = exec.run_for(&["nope"]).unwrap_err();
    assert!(
        refused.message.contains("no output `nope`"),
        "{}",
        refused.message
    );
}
