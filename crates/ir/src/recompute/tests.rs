use super::*;
use crate::{backward, verify};
use mslc_core::ops::{Attrs, DType};
use mslc_core::program::Init;

#[test]
fn layers_are_cut_after_the_first_list_index() {
    assert_eq!(
        layer_of("model.layers.3.mlp.down_proj"),
        Some("model.layers.3")
    );
    assert_eq!(layer_of("layer1.0.conv1"), Some("layer1.0"));
    assert_eq!(layer_of("layers.12"), Some("layers.12"));
    assert_eq!(layer_of("model.norm"), None);
    assert_eq!(layer_of("lm_head"), None);
    assert_eq!(layer_of(""), None);
    assert_eq!(layer_of("3.x"), None);
}

/// Two layers `l.N` of `a = tanh(h @ wN); h = a * a` on input `x: [4, k]`, then `sum` as the
/// loss, with the backward for both weights: (graph, loss, [m0, a0, h0, m1, a1, h1]).
fn two_layers(k: i64) -> (Graph, ValueRef, Vec<NodeId>) {
    let mut g = Graph::new("m");
    let t = |s: [i64; 2]| TensorType::new(DType::F32, s);
    let mut h = g.add_input("x", t([4, k]));
    let mut nodes = Vec::new();
    let mut wrt = Vec::new();
    for l in 0..2 {
        let w = g.add_param(
            &format!("l.{l}.w"),
            t([h_cols(&g, h), 8]),
            Init::Zeros,
            true,
        );
        wrt.push(w);
        let origin = format!("l.{l}");
        let m = g
            .add_op(Op::Matmul, Attrs::new(), &[h, w], &origin)
            .unwrap()[0];
        let a = g.add_op(Op::Tanh, Attrs::new(), &[m], &origin).unwrap()[0];
        h = g.add_op(Op::Mul, Attrs::new(), &[a, a], &origin).unwrap()[0];
        nodes.extend([m.node, a.node, h.node]);
    }
    let loss = g.add_op(Op::Sum, Attrs::new(), &[h], "").unwrap()[0];
    g.set_output("loss", loss);
    backward(&mut g, loss, &wrt).unwrap();
    (g, loss, nodes)
}

fn h_cols(g: &Graph, h: ValueRef) -> i64 {
    g.ty(h).shape[1]
}

fn choose(layers: &[(&str, LayerChoice)]) -> Choice {
    Choice {
        layers: layers.iter().map(|(l, c)| (l.to_string(), *c)).collect(),
        annotated: false,
    }
}

#[test]
fn a_full_layer_keeps_its_output_and_recomputes_the_rest() {
    let (g, loss, n) = two_layers(8);
    let fwd = Forward::of(&g, loss).unwrap();
    assert_eq!(fwd.layers.len(), 2);
    // Each layer's result is the next one's input (or the loss's): the checkpoint.
    let set = fwd.recompute_set(&g, &choose(&[("l.0", LayerChoice::Full)]));
    assert_eq!(set, HashSet::from([n[0], n[1]]));
    let both = choose(&[("l.0", LayerChoice::Full), ("l.1", LayerChoice::Full)]);
    let set = fwd.recompute_set(&g, &both);
    assert_eq!(set, HashSet::from([n[0], n[1], n[3], n[4]]));
    assert!(fwd.recompute_set(&g, &Choice::default()).is_empty());
}

#[test]
fn the_backward_reads_copies_and_the_forward_the_originals() {
    let (mut g, loss, n) = two_layers(8);
    let fwd = Forward::of(&g, loss).unwrap();
    let set = fwd.recompute_set(&g, &choose(&[("l.0", LayerChoice::Full)]));
    let done = recompute(&mut g, &fwd, &set);
    verify(&g).unwrap();
    // tanh0's result is read by the gradients of tanh and mul: it is copied, and so is the
    // matmul it is computed from.
    assert_eq!(done.ops, 2);
    assert_eq!(done.flops, 2 * 4 * 8 * 8 + 4 * 4 * 8);
    assert_eq!(done.released_bytes, 4 * 8 * 4);
    let a0 = ValueRef {
        node: n[1],
        index: 0,
    };
    let users = g.users(a0);
    assert!(users.iter().all(|&(u, _)| fwd.contains(u)), "{users:?}");
    let copies: Vec<NodeId> = g
        .node_ids()
        .into_iter()
        .filter(|&id| is_recomputed(&g, id))
        .collect();
    assert_eq!(copies.len(), 2);
    assert_eq!(g.node(copies[1]).origin, "l.0#recompute");
    assert_eq!(
        g.inputs(copies[1]),
        [ValueRef {
            node: copies[0],
            index: 0
        }]
    );
    assert!(g
        .users(ValueRef {
            node: copies[1],
            index: 0
        })
        .iter()
        .all(|&(u, _)| !fwd.contains(u)));
}

#[test]
fn recompute_annotations_choose_ops_without_a_layer_choice() {
    let (mut g, loss, n) = two_layers(8);
    for &id in &n[3..] {
        g.node_mut(id).annotations.recompute = true;
    }
    let fwd = Forward::of(&g, loss).unwrap();
    assert!(fwd.recompute_set(&g, &Choice::default()).is_empty());
    let marked = Choice {
        annotated: true,
        ..Choice::default()
    };
    assert_eq!(fwd.recompute_set(&g, &marked), HashSet::from([n[3], n[4]]));
    let full = Choice::uniform(&fwd, LayerChoice::Full);
    assert_eq!(full.layers.len(), 2);
    assert_eq!(fwd.recompute_set(&g, &full).len(), 4);
}

#[test]
fn selective_keeps_matmul_results() {
    let selective = choose(&[("l.0", LayerChoice::Selective)]);
    // [4, 8] @ [8, 8] does 16 flops per result: light, recomputed.
    let (g, loss, n) = two_layers(8);
    let fwd = Forward::of(&g, loss).unwrap();
    assert_eq!(
        fwd.recompute_set(&g, &selective),
        HashSet::from([n[0], n[1]])
    );
    // [4, 64] @ [64, 8] does 128: matmul-like, kept.
    let (g, loss, n) = two_layers(64);
    let fwd = Forward::of(&g, loss).unwrap();
    assert_eq!(fwd.recompute_set(&g, &selective), HashSet::from([n[1]]));
}
