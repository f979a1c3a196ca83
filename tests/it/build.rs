//! `mslc build`: artifacts for every example, determinism across thread counts, the memory
//! plan against its lower bound, and bad input that must fail cleanly with nothing written.

use super::support::mslc_command;
use std::path::Path;
use std::process::Output;

fn mslc(args: &[&str], threads: &str) -> Output {
    mslc_command(args)
        .env("RAYON_NUM_THREADS", threads)
        .output()
        .expect("run mslc")
}

fn json_codes(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["code"].as_str().map(str::to_string))
        .collect()
}

fn build(example: &str, dir: &Path, extra: &[&str], threads: &str) -> Output {
    let mut args = vec![
        "--message-format",
        "json",
        "build",
        example,
        "-o",
        dir.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    mslc(&args, threads)
}

#[test]
fn every_example_builds_within_5_percent_of_the_lower_bound() {
    let dir = tempfile::tempdir().unwrap();
    for (example, name) in [
        ("examples/mlp.msl", "Mlp"),
        ("examples/tiny_llama.msl", "TinyLlama"),
        ("examples/bert_base.msl", "BertBase"),
        ("examples/resnet50.msl", "ResNet50"),
        ("examples/llama2_7b.msl", "Llama2_7B"),
        ("examples/llama2_70b.msl", "Llama2_70B"),
        ("examples/gpt3_175b.msl", "Gpt3_175B"),
        ("examples/gpt2.msl", "Gpt2"),
        ("examples/vit_b16.msl", "VitB16"),
    ] {
        let out = build(example, dir.path(), &["--verify"], "2");
        assert!(
            out.status.success(),
            "{example}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let plan: serde_json::Value = serde_json::from_slice(
            &std::fs::read(dir.path().join(format!("{name}.memplan.json"))).unwrap(),
        )
        .unwrap();
        let arena = plan["arena_bytes"].as_f64().unwrap();
        let bound = plan["lower_bound_bytes"].as_f64().unwrap();
        assert!(
            arena >= bound && arena <= 1.05 * bound,
            "{example}: arena {arena} vs lower bound {bound}"
        );
        for b in plan["buffers"].as_array().unwrap() {
            assert_eq!(b["offset"].as_u64().unwrap() % 64, 0);
            assert!(b["first"].as_u64() <= b["last"].as_u64());
        }
        // Every byte the executor allocates once is in the total: the arena, the hoisted
        // region (each hoisted value in its own slot), the parameters, the inputs, the next
        // values of inputs and parameters, the staging buffers and the packed weights; the per-thread scratch is reported beside it.
        let bytes = |k: &str| plan[k].as_u64().unwrap();
        assert_eq!(
            bytes("total_bytes"),
            bytes("arena_bytes")
                + bytes("hoisted_bytes")
                + bytes("params_bytes")
                + bytes("inputs_bytes")
                + bytes("next_bytes")
                + bytes("staging_bytes")
                + bytes("packed_bytes"),
            "{example}"
        );
        assert!(bytes("scratch_bytes_per_thread") > 0, "{example}");
        let mut end = 0;
        for h in plan["hoisted"].as_array().unwrap() {
            let offset = h["offset"].as_u64().unwrap();
            assert!(offset % 64 == 0 && offset >= end, "{example}: {h}");
            end = offset + h["bytes"].as_u64().unwrap();
        }
        assert!(end <= bytes("hoisted_bytes"), "{example}");
        let report: serde_json::Value = serde_json::from_slice(
            &std::fs::read(dir.path().join(format!("{name}.report.json"))).unwrap(),
        )
        .unwrap();
        assert!(report["flops_per_forward"].as_u64().unwrap() > 0);
        let table =
            std::fs::read_to_string(dir.path().join(format!("{name}.kernels.toml"))).unwrap();
        let parsed: toml::Value = table.parse().expect("the kernel table is valid TOML");
        assert!(parsed["kernel"].as_array().is_some_and(|k| !k.is_empty()));
        let inspect = mslc(
            &[
                "inspect",
                dir.path().join(format!("{name}.mir")).to_str().unwrap(),
            ],
            "1",
        );
        assert!(inspect.status.success());
    }
}

#[test]
fn emit_writes_the_ir_as_text_and_dot_and_passes_are_listed() {
    let dir = tempfile::tempdir().unwrap();
    let out = build(
        "examples/tiny_llama.msl",
        dir.path(),
        &["--emit", "ir,dot", "--no-fuse"],
        "1",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ir = std::fs::read_to_string(dir.path().join("TinyLlama.ir")).unwrap();
    assert!(
        ir.starts_with("graph TinyLlama {") && ir.contains("attention("),
        "{ir}"
    );
    assert!(!ir.contains("fused_"), "--no-fuse must leave no fused op");
    let dot = std::fs::read_to_string(dir.path().join("TinyLlama.dot")).unwrap();
    assert!(dot.starts_with("digraph") && dot.trim_end().ends_with('}'));
    let fused = tempfile::tempdir().unwrap();
    assert!(build(
        "examples/tiny_llama.msl",
        fused.path(),
        &["--emit", "ir"],
        "1"
    )
    .status
    .success());
    let fused_ir = std::fs::read_to_string(fused.path().join("TinyLlama.ir")).unwrap();
    assert!(fused_ir.contains("fused_"), "the default build fuses");
    let list = mslc(&["build", "--passes"], "1");
    let text = String::from_utf8_lossy(&list.stdout);
    for pass in [
        "fold",
        "simplify",
        "cse",
        "dce",
        "amp",
        "cast_cleanup",
        "fuse",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(pass)),
            "--passes lacks {pass}"
        );
    }
}

#[test]
fn artifacts_are_byte_identical_whatever_the_thread_count() {
    let one = tempfile::tempdir().unwrap();
    let two = tempfile::tempdir().unwrap();
    assert!(build("examples/tiny_llama.msl", one.path(), &[], "1")
        .status
        .success());
    assert!(build("examples/tiny_llama.msl", two.path(), &[], "2")
        .status
        .success());
    for file in ["TinyLlama.mir", "TinyLlama.memplan.json"] {
        let a = std::fs::read(one.path().join(file)).unwrap();
        let b = std::fs::read(two.path().join(file)).unwrap();
        assert!(a == b, "{file} differs between 1 and 2 threads");
    }
}

#[test]
fn bad_build_input_fails_cleanly_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    // A name on the command line that names nothing is a usage error (exit 2); a model that
    // does not fit its dims is an error in the input (exit 1).
    let cases: Vec<(Vec<&str>, &str, i32)> = vec![
        (vec!["--entry", "Nope"], "E0611", 2),
        (vec!["--target", "tpu9"], "E0610", 2),
        (vec!["--dim", "S=4096"], "E0303", 1),
        (vec!["--set", "nope=3"], "E0401", 2),
    ];
    for (extra, code, status) in cases {
        let example = if extra.contains(&"S=4096") {
            "examples/gpt3_175b.msl"
        } else {
            "examples/mlp.msl"
        };
        let out = build(example, &out_dir, &extra, "1");
        assert_eq!(out.status.code(), Some(status), "{extra:?}");
        assert!(
            json_codes(&out).iter().any(|c| c == code),
            "{extra:?}: expected {code}, got {:?}",
            json_codes(&out)
        );
    }
    assert!(
        !out_dir.exists() || std::fs::read_dir(&out_dir).unwrap().next().is_none(),
        "nothing may be written"
    );

    let file = dir.path().join("a_file");
    std::fs::write(&file, "x").unwrap();
    let out = build("examples/mlp.msl", &file, &[], "1");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(json_codes(&out), vec!["E0600".to_string()]);

    let weights = dir.path().join("w.safetensors");
    let data = vec![0u8; 16];
    mslc_io::safetensors::write_safetensors(
        &weights,
        &[mslc_io::safetensors::TensorRef {
            name: "not.a.param",
            dtype: mslc_io::safetensors::StDType::F32,
            shape: &[4],
            data: &data,
        }],
    )
    .unwrap();
    let out = build(
        "examples/mlp.msl",
        &out_dir,
        &["--embed-weights", weights.to_str().unwrap()],
        "1",
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(json_codes(&out), vec!["E0601".to_string()]);
    let msg = String::from_utf8_lossy(&out.stdout);
    assert!(
        msg.contains("not.a.param") && msg.contains("missing"),
        "{msg}"
    );
    assert!(!out_dir.join("Mlp.mir").exists());
}

#[test]
fn mir_reader_rejects_damaged_files() {
    let dir = tempfile::tempdir().unwrap();
    assert!(build("examples/mlp.msl", dir.path(), &[], "1")
        .status
        .success());
    let good = std::fs::read(dir.path().join("Mlp.mir")).unwrap();
    assert!(mslc_artifact::decode(&good).is_ok());
    let mut wrong_magic = good.clone();
    wrong_magic[0] = b'X';
    let mut other_version = good.clone();
    other_version[8] = 9;
    let mut flipped = good.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0x40;
    let truncated = &good[..good.len() - 10];
    use mslc_artifact::MirError;
    assert_eq!(
        mslc_artifact::decode(&wrong_magic).unwrap_err(),
        MirError::BadMagic
    );
    assert_eq!(
        mslc_artifact::decode(&other_version).unwrap_err(),
        MirError::Version { found: 9 }
    );
    assert_eq!(
        mslc_artifact::decode(&flipped).unwrap_err(),
        MirError::Checksum
    );
    assert_eq!(
        mslc_artifact::decode(truncated).unwrap_err(),
        MirError::Checksum
    );
    assert!(matches!(
        mslc_artifact::decode(&good[..20]).unwrap_err(),
        MirError::Truncated { .. }
    ));
    for cut in [0, 7, 30, good.len() / 3] {
        let _ = mslc_artifact::decode(&good[..cut]);
    }
    let path = dir.path().join("bad.mir");
    std::fs::write(&path, &flipped).unwrap();
    let out = mslc(&["inspect", path.to_str().unwrap()], "1");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("checksum"));
}

/// `run FILE.msl` compiles with the options `build` uses (the train's precision policy and
/// target), so running the source and running the built `.mir` give the same bits.
#[test]
fn run_of_the_source_matches_run_of_the_built_module_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let d = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let out = build("examples/mlp.msl", &dir.path().join("build"), &[], "2");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d("build/Mlp.report.json")).unwrap()).unwrap();
    let mir = d("build/Mlp.mir");
    for (file, to) in [
        ("examples/mlp.msl", d("from_msl")),
        (mir.as_str(), d("from_mir")),
    ] {
        let args = ["run", file, "--init-seed", "7", "--output-dir", &to];
        let out = mslc(&args, "2");
        assert!(
            out.status.success(),
            "{file}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let from_msl = std::fs::read(d("from_msl/logits.npy")).unwrap();
    let from_mir = std::fs::read(d("from_mir/logits.npy")).unwrap();
    assert!(from_msl == from_mir, "run Mlp.msl and run Mlp.mir differ");
    // The policy is bf16 (O2): the module holds bf16 values, or the test proves nothing.
    let text = mslc(&["inspect", &mir], "2");
    assert!(String::from_utf8_lossy(&text.stdout).contains("bf16"));
    assert_eq!(report["target"], "cpu");
}
