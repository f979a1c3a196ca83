//! Helpers shared by the executor tests: a host target, in-process compilation, one-step
//! modules, a scratch directory, a seeded RNG, and tolerance checks.

use std::path::{Path, PathBuf};

use mslc_artifact::{Module, Step, Storage, ValueInfo};
use mslc_check::{check_path, CheckOptions};
use mslc_core::ops::{infer, Attrs, DType, Op, TensorType};
use mslc_driver::compile::{compile, CompileOptions, UpdatePlacement};
use mslc_exec::{ExecOptions, Executor};
use mslc_io::npy::{write_npy, NpyArray, NpyDType};
use mslc_io::safetensors::{write_safetensors, StDType, TensorRef};
use mslc_ir::passes::AmpConfig;
use mslc_kernels::binding::choose_kernel;
use mslc_plan::target::Target;

/// The CPU target the planner uses for this machine (`std.targets.cpu`).
pub fn host() -> Target {
    mslc_driver::target::standard_target("cpu").expect("the standard library declares `cpu`")
}

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Checks and compiles `file` (relative to the root) with `--set` overrides, fused or not.
pub fn compile_file(file: &str, sets: &[(&str, &str)], fuse: bool) -> Module {
    compile_with(file, sets, fuse, None)
}

/// [`compile_file`] with mixed precision.
pub fn compile_with(
    file: &str,
    sets: &[(&str, &str)],
    fuse: bool,
    amp: Option<AmpConfig>,
) -> Module {
    compile_overridden(file, sets, &[], fuse, amp)
}

/// [`compile_file`] with `--set` and `--dim` overrides, fused.
pub fn compile_sized(file: &str, sets: &[(&str, &str)], dims: &[(&str, &str)]) -> Module {
    compile_overridden(file, sets, dims, true, None)
}

fn compile_overridden(
    file: &str,
    sets: &[(&str, &str)],
    dims: &[(&str, &str)],
    fuse: bool,
    amp: Option<AmpConfig>,
) -> Module {
    let mut options = CheckOptions::default();
    for (k, v) in sets {
        options.overrides.sets.insert(k.to_string(), v.to_string());
    }
    for (k, v) in dims {
        options.overrides.dims.insert(k.to_string(), v.to_string());
    }
    let checked = check_path(&root().join(file), &options);
    assert!(!checked.has_errors(), "{file}: {:?}", checked.diagnostics);
    let options = CompileOptions {
        target: host(),
        verify: true,
        fuse,
        amp,
        unfused: Default::default(),
        updates: UpdatePlacement::Beside,
    };
    compile(&checked.models[0], &options)
        .expect("compiles")
        .module
}

/// Random HF-style weights for `module`'s parameters: norm scales near 1, projections ~U(±0.1),
/// embeddings (HF's `embed*`, GPT-2's `wte`/`wpe`, ViT's positions) ~U(±1).
pub fn random_weights(module: &Module, seed: u64) -> Vec<(String, Vec<usize>, Vec<u8>)> {
    let mut rng = Rng(seed);
    module
        .params()
        .map(|(path, v)| {
            let shape: Vec<usize> = module.values[v as usize]
                .ty
                .shape
                .iter()
                .map(|&d| d as usize)
                .collect();
            let n = shape.iter().product();
            let values = if is_norm_scale(path) {
                rng.vec(n, 0.8, 1.2)
            } else if path.contains("embed") || path.starts_with("wte.") || path.starts_with("wpe.")
            {
                rng.vec(n, -1.0, 1.0)
            } else {
                rng.vec(n, -0.1, 0.1)
            };
            let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            (path.to_string(), shape, bytes)
        })
        .collect()
}

pub fn write_weights(path: &std::path::Path, weights: &[(String, Vec<usize>, Vec<u8>)]) {
    let refs: Vec<TensorRef<'_>> = weights
        .iter()
        .map(|(name, shape, data)| TensorRef {
            name,
            dtype: StDType::F32,
            shape,
            data,
        })
        .collect();
    write_safetensors(path, &refs).expect("weights written");
}

/// A norm's learned scale: `…norm.weight` (LLaMA, BERT) or `…ln_1.weight`, `ln_f.weight`
/// (GPT-2, torchvision ViT).
fn is_norm_scale(path: &str) -> bool {
    let owner = path.strip_suffix(".weight").unwrap_or("");
    let last = owner.rsplit('.').next().unwrap_or("");
    last.ends_with("norm") || last.starts_with("ln")
}

/// `got` agrees with a float64 reference `want` of the same shape to 1e-5 of the reference's
/// largest magnitude, which must not be degenerate (≥ 0.1). That is tight enough to tell GPT-2's
/// tanh-approximated GeLU from the exact one at these weights' scale.
pub fn assert_matches_reference(got: &NpyArray, want: &NpyArray, what: &str) {
    assert_eq!(got.shape(), want.shape(), "{what}");
    let (got, want) = (got.to_f32().unwrap(), want.to_f32().unwrap());
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
    let worst = got
        .iter()
        .zip(&want)
        .fold(0f32, |m, (g, w)| m.max((g - w).abs()));
    eprintln!("{what}: max error {worst:.3e}, output scale {scale:.3}");
    assert!(scale > 0.1, "{what}: degenerate outputs (max {scale})");
    assert!(
        worst <= 1e-5 * scale,
        "{what}: max error {worst} vs scale {scale}"
    );
}

/// A module of one `op` step over inputs `x0, x1, ...` of the given types, outputs `y` (and
/// `y1`, `y2`, ... for a multi-output op).
pub fn one_step(op: Op, attrs: Attrs, inputs: &[TensorType]) -> Module {
    let outs = infer(op, &attrs, inputs).expect("valid op");
    let mut values: Vec<ValueInfo> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| ValueInfo {
            ty: t.clone(),
            storage: Storage::Input {
                name: format!("x{i}"),
            },
        })
        .collect();
    // The outputs side by side in the arena, named y, y1, y2, ...
    let mut arena_bytes = 0;
    let mut outputs = Vec::new();
    for (i, ty) in outs.into_iter().enumerate() {
        let bytes = ty.bytes().div_ceil(64) * 64;
        values.push(ValueInfo {
            ty,
            storage: Storage::Arena {
                offset: arena_bytes,
            },
        });
        arena_bytes += bytes;
        let name = if i == 0 { "y".into() } else { format!("y{i}") };
        outputs.push((name, (values.len() - 1) as u32));
    }
    Module {
        name: format!("one_{op}"),
        target: "cpu".into(),
        target_fingerprint: String::new(),
        values,
        steps: vec![Step {
            op,
            kernel: choose_kernel(op),
            attrs,
            inputs: (0..inputs.len() as u32).collect(),
            outputs: outputs.iter().map(|(_, v)| *v).collect(),
            origin: "test".into(),
            loc: None,
        }],
        outputs,
        arena_bytes,
        hoisted_bytes: 0,
        guard: None,
    }
}

/// An array of `values` stored as `dtype` (ints and bools from the values as written).
pub fn array(dtype: DType, shape: &[usize], values: &[f32]) -> NpyArray {
    let shape = shape.to_vec();
    match dtype {
        DType::I32 | DType::I64 => {
            let ints: Vec<i64> = values.iter().map(|&v| v as i64).collect();
            NpyArray::from_i64(shape, &ints).expect("array")
        }
        DType::F16 => {
            let bytes = values
                .iter()
                .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
                .collect();
            NpyArray::new(NpyDType::F16, shape, bytes).expect("array")
        }
        _ => NpyArray::from_f32(shape, values).expect("array"),
    }
}

/// An executor for `module` on `threads` threads.
pub fn executor(module: Module, threads: usize) -> Executor {
    Executor::new(
        module,
        &ExecOptions {
            threads,
            ..ExecOptions::default()
        },
    )
    .expect("setup")
}

/// Runs `module` on `threads` threads with inputs `x0, x1, ...` and returns its outputs, one
/// after another.
pub fn run_one(module: Module, inputs: &[NpyArray], threads: usize) -> Vec<f32> {
    let mut exec = executor(module, threads);
    for (i, a) in inputs.iter().enumerate() {
        exec.set_input(&format!("x{i}"), a).expect("input");
    }
    exec.run().expect("run");
    let names: Vec<String> = exec
        .module()
        .outputs
        .iter()
        .map(|(n, _)| n.clone())
        .collect();
    names
        .iter()
        .flat_map(|name| exec.output_f32(name).expect("output").1)
        .collect()
}

/// SplitMix64 values for test data.
pub struct Rng(pub u64);

impl Rng {
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32
    }

    /// `n` values uniform in [lo, hi).
    pub fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| lo + (hi - lo) * self.uniform()).collect()
    }
}

/// Asserts `|got - want| <= atol + rtol * |want|` elementwise (NaNs must match).
pub fn assert_close(what: &str, got: &[f32], want: &[f32], atol: f32, rtol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= atol + rtol * w.abs();
        assert!(
            ok,
            "{what}: element {i}: got {g}, want {w} (atol {atol}, rtol {rtol})"
        );
    }
}

/// A directory removed when dropped.
pub struct TestDir(pub PathBuf);

impl TestDir {
    /// A fresh, empty directory named after `tag`.
    pub fn new(tag: &str) -> TestDir {
        // Unique per call: tests running at once that share a helper (and so a tag) must not
        // remove each other's files.
        static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("mslc-exec-{tag}-{}-{call}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        TestDir(dir)
    }

    /// A path inside the directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the `mslc` binary with `args`; (exit code, stdout, stderr).
pub fn mslc(args: &[&str]) -> (i32, String, String) {
    let out = crate::support::mslc_command(args)
        .current_dir(root())
        .output()
        .expect("mslc runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Whether `python3` with NumPy is available. Under CI (`CI` set) it must be: a reference
/// that cannot run fails there instead of passing silently.
pub fn have_numpy() -> bool {
    have_python_module("numpy")
}

/// Whether python3 can import `module`; with `CI` set its absence fails the test instead (a
/// reference that cannot run must not pass as skipped).
pub fn have_python_module(module: &str) -> bool {
    let ok = std::process::Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok || std::env::var_os("CI").is_none(),
        "CI is set but python3 with {module} is missing: the reference tests cannot run"
    );
    ok
}

/// A path as a `&str` for command lines.
pub fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// `rows` random sequences of `cols` token ids below `vocab`, from seed `seed`, written as
/// `DIR/tokens.npy` the way `mslc train --data` takes them.
pub fn token_file(dir: &TestDir, [rows, cols]: [usize; 2], vocab: f32, seed: u64) -> PathBuf {
    let ids: Vec<i64> = Rng(seed)
        .vec(rows * cols, 0.0, vocab)
        .iter()
        .map(|&x| x as i64)
        .collect();
    let path = dir.path("tokens.npy");
    write_npy(&path, &NpyArray::from_i64(vec![rows, cols], &ids).unwrap()).unwrap();
    path
}

/// The summary object of `mslc --message-format json train`'s stdout.
pub fn train_summary(stdout: &str) -> serde_json::Value {
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v.get("train").is_some())
        .unwrap_or_else(|| panic!("no JSON summary in\n{stdout}"))
}
