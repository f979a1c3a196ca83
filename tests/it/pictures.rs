//! The pictures `mslc build` draws: the Graphviz dump (labels escaped once, attributes and
//! origins shown, a cluster per layer, long runs of identical layers elided) and the memory
//! timeline SVG (one rectangle per planned buffer, the lower bound drawn), each parsed back.

use super::support::mslc_command;
use std::path::Path;

fn build(example: &str, dir: &Path, emit: &str) {
    let out = mslc_command(&[
        "build",
        example,
        "-o",
        dir.to_str().unwrap(),
        "--emit",
        emit,
    ])
    .output()
    .expect("run mslc");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every `label="…"` in a DOT file, unescaped as Graphviz reads it.
fn labels(dot: &str) -> Vec<String> {
    let mut found = Vec::new();
    for part in dot.split("label=\"").skip(1) {
        let mut label = String::new();
        let mut chars = part.chars();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => match chars.next() {
                    Some('n') => label.push('\n'),
                    Some(other) => label.push(other),
                    None => panic!("label ends in a backslash"),
                },
                c => label.push(c),
            }
        }
        found.push(label);
    }
    found
}

/// The label of every `subgraph cluster_…`, in order.
fn cluster_labels(dot: &str) -> Vec<String> {
    dot.split("subgraph cluster_")
        .skip(1)
        .map(|cluster| labels(cluster).swap_remove(0))
        .collect()
}

#[test]
fn dot_labels_are_escaped_once_and_show_fused_ops_attributes_and_origin() {
    let dir = tempfile::tempdir().unwrap();
    build("examples/tiny_llama.msl", dir.path(), "dot");
    let dot = std::fs::read_to_string(dir.path().join("TinyLlama.dot")).unwrap();
    let labels = labels(&dot);
    assert!(
        labels.iter().all(|l| !l.contains("\\n")),
        "a literal \\n shows"
    );
    let fused = labels
        .iter()
        .find(|l| l.starts_with("fused_matmul\n"))
        .expect("a fused matmul");
    assert!(
        fused.contains("\nactivation=") && fused.contains("\nmodel.layers."),
        "{fused}"
    );
    assert!(labels
        .iter()
        .any(|l| l.starts_with("fused_elementwise\nprogram=")));
    // One cluster per layer: TinyLlama has four, too few to elide.
    assert_eq!(
        cluster_labels(&dot),
        [
            "model.layers.0",
            "model.layers.1",
            "model.layers.2",
            "model.layers.3"
        ]
    );
    assert!(!dot.contains("more identical layers"));
}

#[test]
fn a_70b_graph_draws_its_repeated_layers_once() {
    let dir = tempfile::tempdir().unwrap();
    build("examples/llama2_70b.msl", dir.path(), "dot");
    let dot = std::fs::read_to_string(dir.path().join("Llama2_70B.dot")).unwrap();
    // Layer 0 differs from the rest (it computes the rotary tables); 1..=79 are one run.
    assert_eq!(
        cluster_labels(&dot),
        ["model.layers.0", "model.layers.1", "model.layers.79"]
    );
    assert!(dot.contains("model.layers.{2..78}\\n× 77 more identical layers"));
    assert!(dot.lines().count() < 400, "{} lines", dot.lines().count());
    assert!(!dot.contains("model.layers.40."));
}

#[test]
fn memory_svg_draws_every_planned_buffer_and_the_lower_bound() {
    for (example, name) in [
        ("examples/tiny_llama.msl", "TinyLlama"),
        ("examples/bert_base.msl", "BertBase"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        build(example, dir.path(), "memory-svg");
        let svg = std::fs::read_to_string(dir.path().join(format!("{name}.memory.svg")))
            .unwrap_or_else(|e| panic!("{example}: {e}"));
        let plan: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join(format!("{name}.memplan.json"))).unwrap(),
        )
        .unwrap();
        let doc = roxmltree::Document::parse(&svg).expect("well-formed SVG");
        let class = |node: &roxmltree::Node, c: &str| node.attribute("class") == Some(c);
        let count = |tag: &str, c: &str| {
            doc.descendants()
                .filter(|n| n.has_tag_name(tag) && class(n, c))
                .count()
        };
        let planned = |key: &str| plan[key].as_array().unwrap().len();
        assert_eq!(count("rect", "buffer"), planned("buffers"), "{example}");
        assert_eq!(count("rect", "hoisted"), planned("hoisted"), "{example}");
        assert_eq!(count("rect", "params"), 1);
        assert_eq!(count("line", "lower-bound"), 1);
        let num = |n: &roxmltree::Node, a: &str| n.attribute(a).unwrap().parse::<f64>().unwrap();
        let frames: Vec<_> = doc.descendants().filter(|n| class(n, "frame")).collect();
        let arena = frames.last().unwrap();
        let (top, bottom) = (num(arena, "y"), num(arena, "y") + num(arena, "height"));
        let bound = doc.descendants().find(|n| class(n, "lower-bound")).unwrap();
        let y = num(&bound, "y1");
        assert!(
            top <= y && y <= bottom + 1e-6,
            "{example}: {top} {y} {bottom}"
        );
        // Every buffer lies inside its panel's frame.
        for rect in doc.descendants().filter(|n| class(n, "buffer")) {
            let (ry, rh) = (num(&rect, "y"), num(&rect, "height"));
            assert!(ry >= top - 1e-6 && ry + rh <= bottom + 1.0, "{example}");
        }
    }
}

#[test]
fn a_hoisted_f16_copy_of_the_embedding_spans_the_whole_run() {
    let dir = tempfile::tempdir().unwrap();
    build("examples/tiny_llama.msl", dir.path(), "memory-svg");
    let svg = std::fs::read_to_string(dir.path().join("TinyLlama.memory.svg")).unwrap();
    let doc = roxmltree::Document::parse(&svg).unwrap();
    let frame = doc
        .descendants()
        .find(|n| n.attribute("class") == Some("frame"))
        .unwrap();
    let num = |n: &roxmltree::Node, a: &str| n.attribute(a).unwrap().parse::<f64>().unwrap();
    let (left, right) = (num(&frame, "x"), num(&frame, "x") + num(&frame, "width"));
    let embed = doc
        .descendants()
        .filter(|n| n.attribute("class") == Some("hoisted"))
        .find(|n| {
            n.descendants().any(|c| {
                c.text()
                    .unwrap_or_default()
                    .contains("(model.embed_tokens)")
            })
        })
        .expect("the embedding's hoisted cast");
    let (x, w) = (num(&embed, "x"), num(&embed, "width"));
    assert!(
        (x - left).abs() < 1e-6 && (x + w - right).abs() < 0.01,
        "{x} {w}"
    );
}

#[test]
fn the_profile_has_a_named_track_per_pool_thread_a_memory_counter_and_layer_names() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.json");
    let out = mslc_command(&[
        "run",
        "examples/tiny_llama.msl",
        "--init-seed",
        "1",
        "--threads",
        "2",
    ])
    .args(["--iterations", "2", "--set", "layers=1", "--profile"])
    .arg(&trace)
    .output()
    .expect("run mslc");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let of = |ph: &'static str| events.iter().filter(move |e| e["ph"] == ph);
    let threads: Vec<(u64, &str)> = of("M")
        .filter(|e| e["name"] == "thread_name")
        .map(|e| {
            (
                e["tid"].as_u64().unwrap(),
                e["args"]["name"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(threads.len(), 2, "{threads:?}");
    assert!(threads.iter().all(|(_, n)| n.starts_with("pool thread ")));
    let tids: std::collections::BTreeSet<u64> = threads.iter().map(|t| t.0).collect();
    let slices: Vec<&serde_json::Value> = of("X").collect();
    assert!(slices
        .iter()
        .all(|e| tids.contains(&e["tid"].as_u64().unwrap())));
    assert!(
        slices
            .iter()
            .any(|e| e["name"] == "matmul model.layers.0.self_attn.q_proj"),
        "slice names carry the layer"
    );
    let counters: Vec<u64> = of("C")
        .map(|e| e["args"]["arena in use (bytes)"].as_u64().unwrap())
        .collect();
    assert_eq!(
        counters.len(),
        slices
            .iter()
            .filter(|e| e["cat"] != "parallel tasks")
            .count()
    );
    assert!(counters.iter().any(|&b| b > 0));
    // The steps themselves run on one thread, one after another.
    let loop_tid = threads
        .iter()
        .find(|(_, n)| n.ends_with("(runs the steps)"))
        .unwrap()
        .0;
    let mut end = 0.0;
    for e in slices.iter().filter(|e| e["tid"] == loop_tid) {
        let ts = e["ts"].as_f64().unwrap();
        assert!(ts + 1e-3 >= end, "steps overlap");
        end = ts + e["dur"].as_f64().unwrap();
    }
}
