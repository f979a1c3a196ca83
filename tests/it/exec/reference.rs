//! The GPT-2 and ViT-B/16 examples, shrunk with `--set`/`--dim`, against independent NumPy
//! implementations of Hugging Face's GPT2Model and torchvision's VisionTransformer
//! (tests/reference/*.py), fed the same random weights by their checkpoint names.

use mslc_io::npy::{read_npy, write_npy, NpyArray};

use super::common::{
    assert_matches_reference, compile_sized, have_numpy, mslc, random_weights, root, s,
    write_weights, Rng, TestDir,
};

/// `--set`/`--dim` pairs as command-line flags.
fn override_flags(sets: &[(&str, &str)], dims: &[(&str, &str)]) -> Vec<String> {
    let flag = |f: &str, (k, v): &(&str, &str)| [f.to_string(), format!("{k}={v}")];
    sets.iter()
        .flat_map(|kv| flag("--set", kv))
        .chain(dims.iter().flat_map(|kv| flag("--dim", kv)))
        .collect()
}

/// Runs `example` with `weights` and one `input`, its outputs written to `dir`.
fn run_example(
    example: &str,
    overrides: &[String],
    dir: &TestDir,
    input: (&str, &std::path::Path),
) {
    let mut args = vec![
        "run".to_string(),
        s(&root().join(example)).to_string(),
        "--precision".to_string(),
        "f32".to_string(),
        "--weights".to_string(),
        s(&dir.path("w.safetensors")).to_string(),
        "--input".to_string(),
        format!("{}={}", input.0, s(input.1)),
        "--output-dir".to_string(),
        s(&dir.0).to_string(),
    ];
    args.extend_from_slice(overrides);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, out, err) = mslc(&args);
    assert_eq!(code, 0, "mslc run {example} failed:\n{out}\n{err}");
}

/// Runs tests/reference/`script` with `args`; it must succeed.
fn run_reference(script: &str, args: &[&str]) {
    let status = std::process::Command::new("python3")
        .arg(root().join("tests/reference").join(script))
        .args(args)
        .status()
        .expect("python3 runs");
    assert!(status.success(), "the reference script {script} failed");
}

#[test]
fn gpt2_matches_numpy_hf_gpt2() {
    if !have_numpy() {
        eprintln!("note: python3 with numpy is not available; skipping the HF GPT-2 comparison");
        return;
    }
    let dir = TestDir::new("gpt2");
    let sets = [
        ("layers", "2"),
        ("hidden", "64"),
        ("heads", "4"),
        ("vocab", "300"),
        ("max_positions", "32"),
    ];
    let dims = [("B", "2"), ("S", "16")];
    let module = compile_sized("examples/gpt2.msl", &sets, &dims);
    write_weights(&dir.path("w.safetensors"), &random_weights(&module, 5));
    let ids: Vec<i64> = Rng(9)
        .vec(32, 0.0, 300.0)
        .iter()
        .map(|&x| x as i64)
        .collect();
    let input = dir.path("input_ids.npy");
    write_npy(&input, &NpyArray::from_i64(vec![2, 16], &ids).unwrap()).unwrap();
    run_example(
        "examples/gpt2.msl",
        &override_flags(&sets, &dims),
        &dir,
        ("input_ids", &input),
    );
    run_reference(
        "gpt2_ref.py",
        &[
            s(&dir.path("w.safetensors")),
            s(&input),
            s(&dir.path("ref_hidden.npy")),
            s(&dir.path("ref_logits.npy")),
            "--layers",
            "2",
            "--heads",
            "4",
        ],
    );
    for (output, reference) in [
        ("last_hidden_state", "ref_hidden"),
        ("logits", "ref_logits"),
    ] {
        let got = read_npy(dir.path(&format!("{output}.npy"))).unwrap();
        let want = read_npy(dir.path(&format!("{reference}.npy"))).unwrap();
        assert_matches_reference(&got, &want, &format!("gpt2 {output} vs HF GPT-2 in NumPy"));
    }
}

#[test]
fn vit_b16_matches_numpy_torchvision_vit() {
    if !have_numpy() {
        eprintln!(
            "note: python3 with numpy is not available; skipping the torchvision ViT comparison"
        );
        return;
    }
    let dir = TestDir::new("vit");
    let sets = [
        ("layers", "2"),
        ("hidden", "32"),
        ("heads", "4"),
        ("mlp_dim", "64"),
        ("classes", "10"),
        ("patch", "8"),
    ];
    let dims = [("B", "2"), ("R", "32")];
    let module = compile_sized("examples/vit_b16.msl", &sets, &dims);
    write_weights(&dir.path("w.safetensors"), &random_weights(&module, 13));
    let pixels = Rng(17).vec(2 * 3 * 32 * 32, -1.0, 1.0);
    let input = dir.path("images.npy");
    write_npy(
        &input,
        &NpyArray::from_f32(vec![2, 3, 32, 32], &pixels).unwrap(),
    )
    .unwrap();
    run_example(
        "examples/vit_b16.msl",
        &override_flags(&sets, &dims),
        &dir,
        ("images", &input),
    );
    run_reference(
        "vit_ref.py",
        &[
            s(&dir.path("w.safetensors")),
            s(&input),
            s(&dir.path("ref.npy")),
            "--layers",
            "2",
            "--heads",
            "4",
            "--patch",
            "8",
        ],
    );
    let got = read_npy(dir.path("logits.npy")).unwrap();
    assert_eq!(got.shape(), &[2, 10]);
    let want = read_npy(dir.path("ref.npy")).unwrap();
    assert_matches_reference(&got, &want, "vit_b16 logits vs torchvision ViT in NumPy");
}
