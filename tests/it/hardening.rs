//! Hostile inputs on the build and run side (issue 8): crafted `.mir` modules, flags and output
//! paths. Each must end in a coded error (or a clean success), never a panic (exit 3 or 101),
//! an abort (134) or a hang, and must not write where it was not asked to.

use super::support::mslc_command;
use std::path::Path;
use std::process::Output;

use mslc_artifact::{decode, encode, Module, Storage};
use mslc_kernels::binding::KernelParam;

/// Runs the binary in the repository root with JSON diagnostics.
fn mslc(args: &[&str]) -> Output {
    let out = mslc_command(&[&["--message-format=json"], args].concat())
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("mslc runs");
    let code = out.status.code();
    assert!(
        matches!(code, Some(0..=2)),
        "{args:?} exited with {code:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The codes of the JSON diagnostics on stdout; every stdout line must be a JSON object.
fn codes(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
            v["code"].as_str().unwrap_or_default().to_string()
        })
        .filter(|c| !c.is_empty())
        .collect()
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// `mslc run examples/mlp.msl --init-seed 1` with `extra` flags.
fn run_mlp(extra: &[&str]) -> Output {
    let mut args = vec!["run", "examples/mlp.msl", "--init-seed", "1"];
    args.extend_from_slice(extra);
    mslc(&args)
}

/// Builds `examples/mlp.msl` (no mixed precision) into `dir` and returns its module.
fn mlp_module(dir: &Path) -> Module {
    let out = mslc(&["build", "examples/mlp.msl", "-o", s(dir)]);
    assert!(out.status.success(), "{out:?}");
    decode(&std::fs::read(dir.join("Mlp.mir")).unwrap())
        .unwrap()
        .module
}

/// Writes `module`, re-sealed with a valid checksum, as `dir/name`.
fn write_mir(dir: &Path, name: &str, module: &Module) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, encode(module, None)).unwrap();
    path
}

#[test]
fn names_from_a_module_cannot_escape_the_output_directory() {
    let dir = tempfile::tempdir().unwrap();
    let module = mlp_module(dir.path());
    let od = dir.path().join("a/b/od");
    let outside = dir.path().join("x.npy");
    let abs = dir.path().join("abs");
    let abs_name = format!("{}/x", s(&abs));
    for name in ["../../../x", abs_name.as_str(), "", ".", ".."] {
        let mut bad = module.clone();
        bad.outputs[0].0 = name.to_string();
        let mir = write_mir(dir.path(), "bad.mir", &bad);
        let out = mslc(&["run", s(&mir), "--init-seed", "1", "--output-dir", s(&od)]);
        assert_eq!(out.status.code(), Some(1), "{name:?}");
        assert_eq!(codes(&out), ["E0602"], "{name:?}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("not an identifier"),
            "{name:?}"
        );
        assert!(!outside.exists() && !abs.join("x.npy").exists());
        assert!(!od.exists(), "nothing is written for a rejected module");
    }
    let mut bad = module.clone();
    for v in &mut bad.values {
        if let Storage::Input { name } = &mut v.storage {
            *name = "../in".to_string();
        }
    }
    bad.name = "/etc/passwd".to_string();
    assert!(decode(&encode(&bad, None)).is_err());
    let mut bad = module;
    for v in &mut bad.values {
        if let Storage::Param { path, .. } = &mut v.storage {
            *path = "layers..0".to_string();
        }
    }
    let err = decode(&encode(&bad, None)).unwrap_err().to_string();
    assert!(err.contains("layers..0"), "{err}");
}

#[test]
fn kernel_parameters_out_of_bounds_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let module = mlp_module(dir.path());
    for (param, value) in [
        ("block", 1i64 << 31),
        ("block", 1 << 62),
        ("block", 0),
        ("block", -1),
        ("mc", i64::MAX),
        ("nope", 1),
    ] {
        let mut bad = module.clone();
        let step = bad
            .steps
            .iter_mut()
            .find(|s| s.kernel.name == if param == "mc" { "gemm" } else { "elementwise" })
            .expect("a step with that kernel");
        step.kernel
            .params
            .insert(param.to_string(), KernelParam::Int(value));
        let mir = write_mir(dir.path(), "bad.mir", &bad);
        let out = mslc(&["run", s(&mir), "--init-seed", "1"]);
        assert_eq!(out.status.code(), Some(1), "{param}={value}");
        assert_eq!(codes(&out), ["E0602"], "{param}={value}");
        let inspect = mslc(&["inspect", s(&mir)]);
        assert_eq!(inspect.status.code(), Some(1), "{param}={value}");
    }
    // The largest allowed block still runs.
    let mut big = module;
    for step in &mut big.steps {
        if step.kernel.name == "elementwise" {
            step.kernel
                .params
                .insert("block".to_string(), KernelParam::Int(1 << 20));
        }
    }
    let mir = write_mir(dir.path(), "big.mir", &big);
    let out = mslc(&["run", s(&mir), "--init-seed", "1"]);
    assert!(out.status.success(), "{out:?}");
}

#[test]
fn hostile_iteration_and_thread_counts_are_refused() {
    for n in ["18446744073709551615", "1000000000000", "0", "-1", "abc"] {
        let out = run_mlp(&["--iterations", n]);
        assert_eq!(out.status.code(), Some(2), "--iterations {n}");
        assert_eq!(codes(&out), ["E0609"], "--iterations {n}");
    }
    let out = run_mlp(&["--threads", "1000"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(codes(&out), ["E0605"]);
}

#[test]
fn a_model_larger_than_the_memory_limit_is_refused_before_allocating() {
    let out = run_mlp(&["--max-memory", "100KB"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(codes(&out), ["E0604"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("100000 bytes") && text.contains("--max-memory"),
        "{text}"
    );
    let out = run_mlp(&["--max-memory", "1GiB"]);
    assert!(out.status.success());
    let out = mslc(&["run", "examples/mlp.msl", "--max-memory", "lots"]);
    assert_eq!(codes(&out), ["E0609"]);
}

#[test]
fn a_70b_model_is_refused_not_killed() {
    // 258 GiB: more than this machine has available, or than the flag allows on a bigger one.
    let out = mslc(&[
        "run",
        "examples/llama2_70b.msl",
        "--init-seed",
        "1",
        "--dim",
        "S=16",
        "--max-memory",
        "64GiB",
    ]);
    assert_eq!(out.status.code(), Some(1));
    // Planned for its train's target, as `build` plans it, and said so (W0004).
    assert_eq!(codes(&out), ["W0004", "E0604"]);
}

#[test]
fn a_device_given_as_an_output_is_written_into_never_replaced() {
    let null = Path::new("/dev/null");
    if !null.exists() {
        return;
    }
    use std::os::unix::fs::MetadataExt;
    let before = std::fs::symlink_metadata(null).unwrap();
    let out = run_mlp(&["--profile", "/dev/null"]);
    assert!(out.status.success(), "{out:?}");
    let after = std::fs::symlink_metadata(null).unwrap();
    assert!(after.file_type().is_char_device_like());
    assert_eq!(before.ino(), after.ino(), "/dev/null was replaced");
    assert_eq!(before.rdev(), after.rdev());
}

/// `is_char_device` without importing the Unix trait at every call.
trait CharDevice {
    fn is_char_device_like(&self) -> bool;
}

impl CharDevice for std::fs::FileType {
    fn is_char_device_like(&self) -> bool {
        use std::os::unix::fs::FileTypeExt;
        self.is_char_device()
    }
}

#[test]
fn json_mode_prints_nothing_but_json_lines() {
    let dir = tempfile::tempdir().unwrap();
    let od = dir.path().join("od");
    let runs: Vec<Vec<&str>> = vec![
        vec!["build", "examples/mlp.msl", "-o", s(dir.path())],
        vec![
            "run",
            "examples/mlp.msl",
            "--init-seed",
            "1",
            "--output-dir",
            s(&od),
        ],
        vec!["inspect", "examples/mlp.msl"],
        vec!["explain", "E0604"],
        vec!["explain", "nope"],
        vec!["run", "examples/mlp.msl", "--no-such-flag"],
        vec!["run", "examples/mlp.msl"],
        vec!["check", "--summary", "examples/mlp.msl"],
        vec!["build", "--passes"],
        vec!["--help"],
        vec!["inspect", "/dev/zero"],
        vec!["inspect", "examples"],
    ];
    for args in runs {
        let out = mslc(&args);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(!text.trim().is_empty(), "{args:?} printed nothing");
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {line}"));
            assert!(v.is_object(), "{args:?}: {line}");
            if v.get("severity").is_some_and(|s| s == "error") {
                assert!(
                    v["code"].is_string(),
                    "{args:?}: an error without a code: {line}"
                );
            }
        }
    }
    let inspect = mslc(&["inspect", s(&dir.path().join("Mlp.mir"))]);
    let v: serde_json::Value = serde_json::from_slice(&inspect.stdout).unwrap();
    assert_eq!(v["inspect"]["module"]["name"], "Mlp");
    assert!(v["inspect"]["manifest"]
        .as_str()
        .unwrap()
        .starts_with("verified"));
    let usage = mslc(&["run", "examples/mlp.msl"]);
    assert_eq!(usage.status.code(), Some(2));
    assert_eq!(codes(&usage), ["E0609"]);
}

#[test]
fn build_output_sets_are_locked_sealed_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let stale = dir.path().join(".Mlp.mir.99999.0.tmp");
    std::fs::create_dir_all(dir.path()).unwrap();
    std::fs::write(&stale, vec![0u8; 1000]).unwrap();
    mlp_module(dir.path());
    assert!(
        !stale.exists(),
        "the stale temporary of a killed build is removed"
    );
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("Mlp.manifest.json")).unwrap())
            .unwrap();
    // The .mir, the memory plan, the report and the train's per-device plan; the kernel table
    // is editable and not listed.
    assert_eq!(manifest["files"].as_array().unwrap().len(), 4);

    // A concurrent build (simulated by holding the lock) is refused and writes nothing.
    let before = std::fs::read(dir.path().join("Mlp.mir")).unwrap();
    let lock = std::fs::File::open(dir.path().join(".mslc-build.lock")).unwrap();
    lock.lock().unwrap();
    let out = mslc(&[
        "build",
        "examples/mlp.msl",
        "-o",
        s(dir.path()),
        "--set",
        "hidden=128",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(codes(&out), ["E0607"]);
    assert_eq!(std::fs::read(dir.path().join("Mlp.mir")).unwrap(), before);
    drop(lock);

    // A .mir from another build beside this set's manifest is a mixed set: refused.
    let other = tempfile::tempdir().unwrap();
    let out = mslc(&[
        "build",
        "examples/mlp.msl",
        "-o",
        s(other.path()),
        "--set",
        "hidden=128",
    ]);
    assert!(out.status.success());
    std::fs::copy(other.path().join("Mlp.mir"), dir.path().join("Mlp.mir")).unwrap();
    for cmd in [
        vec!["inspect", s(&dir.path().join("Mlp.mir"))],
        vec!["run", s(&dir.path().join("Mlp.mir")), "--init-seed", "1"],
    ] {
        let out = mslc(&cmd);
        assert_eq!(out.status.code(), Some(1), "{cmd:?}");
        assert_eq!(codes(&out), ["E0602"], "{cmd:?}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("different builds"));
    }

    // An existing file as the output directory is named as such.
    let file = dir.path().join("Mlp.report.json");
    let out = mslc(&["build", "examples/mlp.msl", "-o", s(&file)]);
    assert_eq!(codes(&out), ["E0600"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("is not a directory"));
    let out = run_mlp(&["--output-dir", s(&file)]);
    assert_eq!(codes(&out), ["E0600"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("is not a directory"));
}

#[test]
fn tensors_too_large_are_refused_by_build() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("huge.msl");
    std::fs::write(
        &src,
        "model Huge {\n    @allow(unused)\n    input unused: f32[3037000500, 3037000500]\n    input x: f32[4]\n    output y = relu(x)\n}\n",
    )
    .unwrap();
    let od = dir.path().join("od");
    let out = mslc(&["build", s(&src), "-o", s(&od)]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(codes(&out), ["E0606"]);
    assert!(!od.exists());
    let out = mslc(&["run", s(&src), "--init-seed", "1"]);
    assert_eq!(codes(&out), ["E0606"]);
}

#[test]
fn a_module_for_another_target_runs_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let out = mslc(&[
        "build",
        "examples/mlp.msl",
        "--target",
        "h100",
        "-o",
        s(dir.path()),
    ]);
    assert!(out.status.success());
    let out = mslc(&["run", s(&dir.path().join("Mlp.mir")), "--init-seed", "1"]);
    assert!(out.status.success());
    assert_eq!(codes(&out), ["W0004"]);
}

#[test]
fn weights_named_twice_or_a_directory_are_coded_errors() {
    let dir = tempfile::tempdir().unwrap();
    let header = r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(&[0u8; 8]);
    let dup = dir.path().join("dup.safetensors");
    std::fs::write(&dup, bytes).unwrap();
    for weights in [s(&dup), s(dir.path())] {
        let out = mslc(&["run", "examples/mlp.msl", "--weights", weights]);
        assert_eq!(out.status.code(), Some(1));
        assert_eq!(codes(&out), ["E0602"]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("two tensors are named 'w'") || text.contains("is a directory"),
            "{text}"
        );
    }
}

#[test]
fn live_values_sharing_memory_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let module = mlp_module(dir.path());
    // Move the output of the first step onto the offset of the second step's output: both are
    // alive at once (the first feeds the second or later steps).
    let offset_of = |m: &Module, v: u32| match m.values[v as usize].storage {
        Storage::Arena { offset } => Some(offset),
        _ => None,
    };
    // The first two steps whose outputs live in the arena (parameter-only steps are hoisted).
    let arena_outputs: Vec<u32> = module
        .steps
        .iter()
        .map(|s| s.outputs[0])
        .filter(|&v| offset_of(&module, v).is_some())
        .take(2)
        .collect();
    let [first, second] = arena_outputs[..] else {
        panic!("the MLP has two steps with arena outputs");
    };
    assert_ne!(offset_of(&module, first), offset_of(&module, second));
    // Put the smaller of the two where the other one is (so it still fits in the arena).
    let bytes = |v: u32| module.values[v as usize].ty.bytes();
    let (moved, onto) = if bytes(first) <= bytes(second) {
        (first, second)
    } else {
        (second, first)
    };
    let mut bad = module.clone();
    bad.values[moved as usize].storage = Storage::Arena {
        offset: offset_of(&module, onto).unwrap(),
    };
    let err = decode(&encode(&bad, None)).unwrap_err().to_string();
    assert!(err.contains("overlaps"), "{err}");
    let mir = write_mir(dir.path(), "bad.mir", &bad);
    let out = mslc(&["run", s(&mir), "--init-seed", "1"]);
    assert_eq!(codes(&out), ["E0602"]);
}
