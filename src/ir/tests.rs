//! Whole-IR tests: snapshots of the text and DOT dumps, and text round trips.

use super::*;
use crate::ops::{Attrs, DType, Op, TensorType};
use proptest::prelude::*;

fn f32t(s: &[i64]) -> TensorType {
    TensorType::new(DType::F32, s)
}

/// A small attention layer reading `x [1, 8, 32]`: norm, q/k/v projections, rope,
/// attention, output projection, residual; with origins and a few annotations.
fn attention_layer(g: &mut Graph, x: ValueRef, layer: usize) -> ValueRef {
    let (s, h, heads, d) = (8, 32, 4, 8);
    let prefix = format!("layers.{layer}");
    let scope = format!("model.{prefix}.self_attn");
    let norm_w = g.add_param(
        &format!("{prefix}.input_layernorm.weight"),
        f32t(&[h]),
        Init::Ones,
        true,
    );
    let normed = g
        .add_op(Op::RmsNorm, Attrs::new().with("eps", 1e-5), &[x])
        .unwrap()[0];
    let scaled = g.add_op(Op::Mul, Attrs::new(), &[normed, norm_w]).unwrap()[0];
    let proj = |g: &mut Graph, name: &str, input: ValueRef| {
        let w = g.add_param(
            &format!("{prefix}.self_attn.{name}.weight"),
            f32t(&[h, h]),
            Init::Normal {
                mean: 0.0,
                std: 0.02,
            },
            true,
        );
        let y = g
            .add_op(
                Op::Matmul,
                Attrs::new().with("transpose_b", true),
                &[input, w],
            )
            .unwrap()[0];
        g.node_mut(y.node).unwrap().origin = Some(format!("{scope}.{name}"));
        y
    };
    let split = |g: &mut Graph, v: ValueRef| {
        g.add_op(
            Op::Reshape,
            Attrs::new().with("shape", vec![1, s, heads, d]),
            &[v],
        )
        .unwrap()[0]
    };
    let q = proj(g, "q_proj", scaled);
    let k = proj(g, "k_proj", scaled);
    let v = proj(g, "v_proj", scaled);
    let (q, k, v) = (split(g, q), split(g, k), split(g, v));
    let q = g.add_op(Op::Rope, Attrs::new(), &[q]).unwrap()[0];
    let k = g.add_op(Op::Rope, Attrs::new(), &[k]).unwrap()[0];
    let a = g
        .add_op(Op::Attention, Attrs::new().with("causal", true), &[q, k, v])
        .unwrap()[0];
    let ann = &mut g.node_mut(a.node).unwrap().annotations;
    ann.recompute = true;
    ann.keep_dtype = Some(DType::F32);
    let layout = vec![Some("dp".to_string()), None, Some("mp".to_string()), None];
    ann.shard = Some(vec![layout.clone(), layout.clone(), layout]);
    let merged = g
        .add_op(Op::Reshape, Attrs::new().with("shape", vec![1, s, h]), &[a])
        .unwrap()[0];
    let o = proj(g, "o_proj", merged);
    g.add_op(Op::Add, Attrs::new(), &[x, o]).unwrap()[0]
}

/// `layers` attention layers over one input.
fn attention_model(layers: usize) -> Graph {
    let mut g = Graph::new();
    let mut x = g.add_input("x", f32t(&[1, 8, 32]));
    for layer in 0..layers {
        x = attention_layer(&mut g, x, layer);
    }
    g.set_output("hidden", x).unwrap();
    g
}

fn attention_block() -> Graph {
    attention_model(1)
}

#[test]
fn text_snapshot() {
    let g = attention_block();
    verify(&g).unwrap();
    insta::assert_snapshot!(to_text(&g));
}

#[test]
fn dot_snapshot() {
    insta::assert_snapshot!(to_dot(&attention_block()));
}

#[test]
fn text_round_trips() {
    let g = attention_block();
    let text = to_text(&g);
    let back = parse_text(&text).unwrap();
    verify(&back).unwrap();
    assert_eq!(to_text(&back), text);
}

#[test]
fn numbering_is_stable_across_rewrites() {
    // Replacing a node by an equal one built later gives the same dump.
    let mut g = Graph::new();
    let x = g.add_input("x", f32t(&[4]));
    let e = g.add_op(Op::Exp, Attrs::new(), &[x]).unwrap()[0];
    let n = g.add_op(Op::Neg, Attrs::new(), &[e]).unwrap()[0];
    g.set_output("y", n).unwrap();
    let before = to_text(&g);
    let e2 = g.add_op(Op::Exp, Attrs::new(), &[x]).unwrap()[0];
    g.replace_all_uses(e, e2).unwrap();
    g.remove_node(e.node).unwrap();
    assert_eq!(to_text(&g), before);
    assert_eq!(
        before,
        "%0 = input \"x\" : f32[4]\n%1 = exp(%0) : f32[4]\n%2 = neg(%1) : f32[4]\noutput \"y\" = %2\n"
    );
}

#[test]
fn odd_names_and_values_round_trip() {
    let mut g = Graph::new();
    let x = g.add_input("we\"ird\nname", f32t(&[2]));
    let b = g.add_param(
        "buf",
        f32t(&[2]),
        Init::Uniform {
            low: -0.5,
            high: 1e-3,
        },
        false,
    );
    let c = g
        .add_op(
            Op::Constant,
            Attrs::new()
                .with("value", f64::NEG_INFINITY)
                .with("dtype", DType::BF16),
            &[],
        )
        .unwrap()[0];
    let s = g.add_op(Op::Add, Attrs::new(), &[x, b]).unwrap()[0];
    let f = g
        .add_op(
            Op::FusedElementwise,
            Attrs::new().with("program", "silu(x0); mul(t0, x1)"),
            &[s, b],
        )
        .unwrap()[0];
    g.node_mut(f.node).unwrap().origin = Some(" spaced \"origin\" ".into());
    g.node_mut(s.node).unwrap().annotations.shard =
        Some(vec![vec![Some("_".into())], vec![Some("a b".into())]]);
    g.set_output("c", c).unwrap();
    g.set_output("f", f).unwrap();
    let text = to_text(&g);
    assert!(
        text.contains("constant() {dtype=bf16, value=-inf} : bf16[]"),
        "{text}"
    );
    assert!(text.contains("@shard([\"_\"],[\"a b\"])"), "{text}");
    assert!(
        text.contains("buffer \"buf\" uniform(-0.5, 0.001)"),
        "{text}"
    );
    let back = parse_text(&text).unwrap();
    assert_eq!(to_text(&back), text);
    assert_eq!(
        back.node(back.outputs()[1].1.node)
            .unwrap()
            .origin
            .as_deref(),
        Some(" spaced \"origin\" ")
    );
}

#[test]
fn parse_errors_name_the_line() {
    let err = |text: &str| parse_text(text).unwrap_err().to_string();
    assert_eq!(
        err("%0 = input \"x\" : f32[4]\n%1 = frob(%0) : f32[4]"),
        "line 2: unknown op `frob`"
    );
    assert_eq!(
        err("%0 = input \"x\" : f32[4]\n%1 = exp(%2) : f32[4]"),
        "line 2: %2 is used before it is defined"
    );
    assert_eq!(
        err("%0 = input \"x\" : f32[4]\n%1 = exp(%0) : f32[5]"),
        "line 2: the text says f32[5] but exp gives f32[4]"
    );
    assert_eq!(
        err("%0 = input \"x\" : f32[4]\n%0 = input \"y\" : f32[4]"),
        "line 2: %0 is defined twice"
    );
    assert_eq!(
        err("%0 = input \"x\" : f32[4]\n\n%1 = exp(%0, %0) : f32[4]"),
        "line 3: exp: expects 1 input, got 2"
    );
    assert!(err("%0 = input \"x : f32[4]").contains("unterminated string"));
    assert!(err("%0 = param \"w\" normal(1.0) : f32[4]").contains("bad initializer"));
    assert!(err("%0 = input \"x\" @frob : f32[4]").contains("unknown annotation `@frob`"));
    assert!(err("%0 = input \"x\" : f32[4] extra").contains("unexpected `extra`"));
    assert!(err("output \"y\" = %0").contains("used before it is defined"));
    assert!(err("%0 = input \"x\" : q32[4]").contains("unknown dtype `q32`"));
}

#[test]
fn a_deep_model_verifies_and_round_trips() {
    // 32 layers, ~600 nodes: the depth of a LLaMA-7B forward graph.
    let g = attention_model(32);
    assert_eq!(g.node_count(), 1 + 32 * 19);
    verify(&g).unwrap();
    let text = to_text(&g);
    assert_eq!(to_text(&parse_text(&text).unwrap()), text);
}

/// A random chain of unary and binary elementwise ops over two inputs.
fn any_chain() -> impl Strategy<Value = Graph> {
    let ops = vec![Op::Exp, Op::Neg, Op::Tanh, Op::Add, Op::Mul, Op::Maximum];
    proptest::collection::vec(
        (proptest::sample::select(ops), 0usize..100, 0usize..100),
        1..12,
    )
    .prop_map(|steps| {
        let mut g = Graph::new();
        let mut vals = vec![
            g.add_input("a", f32t(&[2, 3])),
            g.add_input("b", f32t(&[3])),
        ];
        for (op, i, j) in steps {
            let (x, y) = (vals[i % vals.len()], vals[j % vals.len()]);
            let args: Vec<ValueRef> = if op.spec().arity.accepts(1) {
                vec![x]
            } else {
                vec![x, y]
            };
            vals.push(g.add_op(op, Attrs::new(), &args).unwrap()[0]);
        }
        let last = *vals.last().unwrap_or(&vals[0]);
        g.set_output("out", last).unwrap();
        g
    })
}

proptest! {
    #[test]
    fn parsing_damaged_text_never_panics(
        cut in 0usize..2000,
        len in 0usize..6,
        junk in "[%@{}\\[\\](),=:#\"a-z0-9 .-]{0,6}",
    ) {
        let text = to_text(&attention_block());
        let mut chars: Vec<char> = text.chars().collect();
        let at = cut % chars.len();
        let end = (at + len).min(chars.len());
        chars.splice(at..end, junk.chars());
        let damaged: String = chars.into_iter().collect();
        if let Ok(g) = parse_text(&damaged) {
            let _ = verify(&g);
        }
    }

    #[test]
    fn random_graphs_verify_and_round_trip(g in any_chain()) {
        prop_assert_eq!(verify(&g), Ok(()));
        let text = to_text(&g);
        let back = parse_text(&text).unwrap();
        prop_assert_eq!(to_text(&back), text);
    }
}
