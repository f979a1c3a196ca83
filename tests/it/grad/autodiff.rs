//! What `backward` reports and how backward nodes are marked.

use mslc_core::diag::Code;
use mslc_core::ops::{Attrs, DType, Op, TensorType};
use mslc_core::program::Init;
use mslc_ir::autodiff::{AutodiffError, GRAD_MARK};
use mslc_ir::{backward, Graph};

fn f32t(shape: &[i64]) -> TensorType {
    TensorType::new(DType::F32, shape)
}

#[test]
fn backward_nodes_carry_the_forward_origin_and_mark() {
    let mut g = Graph::new("m");
    let x = g.add_input("x", f32t(&[2, 3]));
    let w = g.add_param("fc.w", f32t(&[3, 4]), Init::Zeros, true);
    let y = g
        .add_op(Op::Matmul, Attrs::new(), &[x, w], "model.fc")
        .unwrap()[0];
    let l = g.add_op(Op::Sum, Attrs::new(), &[y], "model").unwrap()[0];
    let before = g.node_ids().len();
    let grads = backward(&mut g, l, &[w]).unwrap();
    assert_eq!(g.ty(grads[0]), &f32t(&[3, 4]));
    let node = g.node(grads[0].node);
    assert_eq!(node.op(), Some(Op::Matmul));
    assert_eq!(node.origin, format!("model.fc{GRAD_MARK}"));
    // Only what the weight's gradient needs: seed, sum's broadcast, one matmul (no dx).
    let added: Vec<Op> = g.node_ids()[before..]
        .iter()
        .filter_map(|&id| g.node(id).op())
        .collect();
    assert_eq!(
        added,
        [Op::Constant, Op::BroadcastTo, Op::Matmul],
        "{added:?}"
    );
    mslc_ir::verify(&g).unwrap();
    assert!(mslc_ir::print::to_text(&g).contains("# model.fc#grad"));
}

#[test]
fn errors_name_the_op_or_the_value() {
    let mut g = Graph::new("m");
    let x = g.add_input("x", f32t(&[4]));
    let w = g.add_param("w", f32t(&[4]), Init::Zeros, true);
    let unused = g.add_param("unused", f32t(&[4]), Init::Zeros, true);
    let xi = g
        .add_op(
            Op::Cast,
            Attrs::new().with("dtype", DType::I32),
            &[w],
            "model.q",
        )
        .unwrap()[0];
    let back = g
        .add_op(
            Op::Cast,
            Attrs::new().with("dtype", DType::F32),
            &[xi],
            "model.q",
        )
        .unwrap()[0];
    let y = g
        .add_op(Op::Mul, Attrs::new(), &[x, back], "model")
        .unwrap()[0];
    let l = g.add_op(Op::Sum, Attrs::new(), &[y], "model").unwrap()[0];
    let e = backward(&mut g.clone(), l, &[w]).unwrap_err();
    assert!(
        matches!(
            e,
            AutodiffError::NotDifferentiable {
                op: Some(Op::Cast),
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "parameter \"w\" reaches the loss only through `cast` (in model.q), which passes no \
         gradient back"
    );
    assert_eq!(e.code(), Code::E0802);
    let e = backward(&mut g.clone(), l, &[unused]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "parameter \"unused\" does not reach the loss"
    );
    assert_eq!(e.code(), Code::E0801);
    let e = backward(&mut g.clone(), y, &[x]).unwrap_err();
    assert!(matches!(e, AutodiffError::LossNotScalar { .. }));
    assert_eq!(e.code(), Code::E0803);
    let e = backward(&mut g.clone(), l, &[xi]).unwrap_err();
    assert!(e.to_string().contains("is not a float value"), "{e}");
    // An op without a rule on the path: the fused ops exist only after autodiff.
    let mut g = Graph::new("m");
    let a = g.add_input("a", f32t(&[2, 2]));
    let f = g
        .add_op(Op::FusedMatmul, Attrs::new(), &[a, a], "model.blk")
        .unwrap()[0];
    let l = g.add_op(Op::Sum, Attrs::new(), &[f], "").unwrap()[0];
    let e = backward(&mut g, l, &[a]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "`fused_matmul` (in model.blk) has no gradient rule"
    );
    assert_eq!(e.code(), Code::E0800);
}
