//! Backward graphs through the normal pipeline: the default passes (verifier after each, CSE,
//! DCE, fusion) accept an MLP's forward + backward, and the f32 executor running the compiled
//! module agrees with the f64 evaluation of the same graph.

use std::collections::HashMap;

use super::eval64::eval_graph;
use super::fd::Rng;
use super::tensor64::T64;
use crate::exec::common::{executor, host};
use mslc_core::ops::{Attrs, DType, Op, TensorType};
use mslc_driver::compile::{compile_graph, CompileOptions, UpdatePlacement};
use mslc_io::npy::NpyArray;
use mslc_ir::{backward, Graph, ValueRef};

/// `cross_entropy(relu(x @ w1 + b1) @ w2ᵀ, labels)` with the gradients of `w1`, `b1` and `w2`
/// as outputs, and random feeds (`labels` whole numbers in `0..3`).
fn mlp() -> (Graph, HashMap<String, T64>) {
    let mut g = Graph::new("mlp_train");
    let mut rng = Rng(42);
    let mut feeds = HashMap::new();
    let mut input = |g: &mut Graph, name: &str, dtype: DType, shape: &[usize]| {
        let v = if dtype.is_float() {
            rng.tensor(shape, -1.0, 1.0)
        } else {
            rng.ints(shape, 3)
        };
        feeds.insert(name.to_string(), v);
        let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
        g.add_input(name, TensorType::new(dtype, dims))
    };
    let x = input(&mut g, "x", DType::F32, &[2, 4, 8]);
    let w1 = input(&mut g, "w1", DType::F32, &[8, 16]);
    let b1 = input(&mut g, "b1", DType::F32, &[16]);
    let w2 = input(&mut g, "w2", DType::F32, &[3, 16]);
    let labels = input(&mut g, "labels", DType::I64, &[2, 4]);
    let op = |g: &mut Graph, op: Op, attrs: Attrs, xs: &[ValueRef], origin: &str| {
        g.add_op(op, attrs, xs, origin).unwrap()[0]
    };
    let h = op(&mut g, Op::Matmul, Attrs::new(), &[x, w1], "model.fc1");
    let h = op(&mut g, Op::Add, Attrs::new(), &[h, b1], "model.fc1");
    let h = op(&mut g, Op::Relu, Attrs::new(), &[h], "model");
    let t = Attrs::new().with("transpose_b", true);
    let logits = op(&mut g, Op::Matmul, t, &[h, w2], "model.fc2");
    let loss = op(
        &mut g,
        Op::CrossEntropy,
        Attrs::new(),
        &[logits, labels],
        "loss",
    );
    let grads = backward(&mut g, loss, &[w1, b1, w2]).unwrap();
    g.set_output("loss", loss);
    for (name, v) in ["d_w1", "d_b1", "d_w2"].iter().zip(grads) {
        g.set_output(name, v);
    }
    (g, feeds)
}

#[test]
fn default_pipeline_and_f32_executor_run_an_mlp_backward() {
    let (g, feeds) = mlp();
    mslc_ir::verify(&g).unwrap();
    let want = eval_graph(&g, &feeds).unwrap();
    let options = CompileOptions {
        target: host(),
        verify: true,
        fuse: true,
        amp: None,
        unfused: Default::default(),
        updates: UpdatePlacement::Beside,
    };
    let compiled = compile_graph(g.clone(), &options).expect("the backward graph compiles");
    let module = compiled.module;
    // The weight gradients stay single matmuls with transpose flags (fused or not), and the
    // fusion pass chained the elementwise backward ops.
    let steps: Vec<Op> = module.steps.iter().map(|s| s.op).collect();
    let transposed_a = module.steps.iter().filter(|s| {
        matches!(s.op, Op::Matmul | Op::FusedMatmul)
            && s.attrs.get("transpose_a") == Some(&true.into())
    });
    assert_eq!(transposed_a.count(), 2, "{steps:?}");
    assert!(!steps.contains(&Op::Transpose), "{steps:?}");
    assert!(steps.contains(&Op::CrossEntropyGrad), "{steps:?}");
    assert!(
        steps.contains(&Op::FusedElementwise) || steps.contains(&Op::FusedMatmul),
        "{steps:?}"
    );
    assert!(compiled.memory.arena_bytes > 0);

    let mut exec = executor(module, 2);
    for (name, t) in &feeds {
        let array = if name == "labels" {
            let ints: Vec<i64> = t.data.iter().map(|&v| v as i64).collect();
            NpyArray::from_i64(t.shape.clone(), &ints).unwrap()
        } else {
            let f: Vec<f32> = t.data.iter().map(|&v| v as f32).collect();
            NpyArray::from_f32(t.shape.clone(), &f).unwrap()
        };
        exec.set_input(name, &array).unwrap();
    }
    exec.run().unwrap();
    for (name, v) in &g.outputs {
        let (shape, got) = exec.output_f32(name).unwrap();
        let reference = &want[v];
        assert_eq!(shape, reference.shape, "{name}");
        let scale = reference.data.iter().fold(0f64, |m, x| m.max(x.abs()));
        assert!(scale > 1e-3, "{name}: degenerate");
        for (i, (&a, &b)) in got.iter().zip(&reference.data).enumerate() {
            assert!(
                (a as f64 - b).abs() <= 1e-5 * scale + 1e-6,
                "{name}[{i}]: f32 {a}, f64 {b}"
            );
        }
    }
}
