//! What each fuzz target does with its input. Uses only mslc's crates, `sha2` and `std`, so
//! `tests/it/fuzz_replay.rs` of the main package includes this file by path and replays every corpus
//! entry and regression on stable. A target "passes" an input when it returns: errors are
//! fine, panics, aborts and hangs are not.

use std::path::PathBuf;
use std::sync::OnceLock;

use mslc_artifact::{decode, encode, Module};
use mslc_check::{check_source, CheckOptions};
use mslc_driver::compile::{compile, CompileOptions, UpdatePlacement};
use mslc_driver::render::{render_human, render_json, RenderOptions};
use mslc_driver::target::standard_target;
use mslc_exec::{ExecOptions, Executor};
use mslc_io::npy::NpyArray;
use mslc_io::safetensors::SafetensorsFile;
use mslc_kernels::binding::KernelParam;
use sha2::{Digest, Sha256};

/// A target's body.
pub type Target = fn(&[u8]);

/// The targets, by name (the names of `fuzz/fuzz_targets/*.rs` and `fuzz/corpus/*/`).
pub const TARGETS: &[(&str, Target)] = &[
    ("check", check),
    ("mir", mir),
    ("mir_resealed", mir_resealed),
    ("safetensors", safetensors),
    ("npy", npy),
    ("exec", exec),
];

/// Largest source the `check` target looks at; longer inputs only slow the fuzzer down.
const MAX_SOURCE: usize = 64 << 10;

/// Source text (decoded lossily) through the parser and checker, every diagnostic rendered as
/// a human report and as JSON.
pub fn check(data: &[u8]) {
    if data.len() > MAX_SOURCE {
        return;
    }
    let text = String::from_utf8_lossy(data);
    let checked = check_source("fuzz.msl", &text, &CheckOptions::default());
    let options = RenderOptions {
        color: false,
        width: 80,
    };
    for d in &checked.diagnostics {
        let _ = render_human(d, &checked.sources, options);
        let _ = render_json(d, &checked.sources);
    }
}

/// A `.mir` file as is: most mutations stop at the checksum.
pub fn mir(data: &[u8]) {
    let _ = decode(data);
}

/// A `.mir` file without its trailing SHA-256, which is recomputed, so that mutations reach
/// the module decoder and the validator.
pub fn mir_resealed(data: &[u8]) {
    let _ = decode(&reseal(data));
}

/// `body` followed by its SHA-256, as `.mir` files end.
pub fn reseal(body: &[u8]) -> Vec<u8> {
    let mut bytes = body.to_vec();
    bytes.extend_from_slice(&Sha256::digest(body));
    bytes
}

/// A safetensors file: opened (header and index checked), every tensor converted to f32.
pub fn safetensors(data: &[u8]) {
    let path = scratch("safetensors");
    if std::fs::write(&path, data).is_err() {
        return;
    }
    if let Ok(file) = SafetensorsFile::open(&path) {
        for tensor in file.tensors() {
            let _ = tensor.to_f32();
        }
    }
    let _ = std::fs::remove_file(&path);
}

/// A `.npy` file: parsed, converted to f32 and i64, written back.
pub fn npy(data: &[u8]) {
    if let Ok(array) = NpyArray::from_npy_bytes(data) {
        let _ = array.to_f32();
        let _ = array.to_i64();
        let _ = array.to_npy_bytes();
    }
}

/// A small valid module whose kernel parameters the input overwrites; what survives the
/// validator (through a `.mir` round trip) runs on seeded inputs and parameters.
pub fn exec(data: &[u8]) {
    let Some(base) = exec_base() else {
        return;
    };
    let mut module = base.clone();
    let mut input = data.iter().copied();
    for step in &mut module.steps {
        for value in step.kernel.params.values_mut() {
            mutate_param(value, &mut input);
        }
    }
    let bytes = encode(&module, None);
    let Ok(decoded) = decode(&bytes) else {
        return;
    };
    let Ok(mut executor) = Executor::new(
        decoded.module,
        &ExecOptions {
            threads: 1,
            ..ExecOptions::default()
        },
    ) else {
        return;
    };
    executor.init_params(1);
    let inputs: Vec<String> = executor.unset_inputs();
    for (i, name) in inputs.iter().enumerate() {
        if executor.seed_input(name, i as u64 + 1).is_err() {
            return;
        }
    }
    let _ = executor.run();
}

/// The model the `exec` target runs: matmuls, elementwise ops, a reduction and a softmax.
const EXEC_SOURCE: &str = "import std.nn.{Linear, LayerNorm}

model M {
    dims B = 2, S = 3
    input x: f32[B, S, 16]
    let h = gelu(up: Linear(x, 32))
    let y = norm: LayerNorm(down: Linear(h, 16) + x)
    output probs = softmax(y, axis: -1)
    output total = sum(y * y, axis: -1)
}
";

/// The `exec` target's module before mutation; `None` would make the target a no-op.
pub fn exec_base() -> Option<&'static Module> {
    static BASE: OnceLock<Option<Module>> = OnceLock::new();
    BASE.get_or_init(|| {
        let checked = check_source("exec.msl", EXEC_SOURCE, &CheckOptions::default());
        let model = checked.models.first().filter(|_| !checked.has_errors())?;
        let options = CompileOptions {
            target: standard_target("cpu")?,
            verify: false,
            fuse: true,
            amp: None,
            unfused: Default::default(),
            updates: UpdatePlacement::Beside,
        };
        compile(model, &options).ok().map(|c| c.module)
    })
    .as_ref()
}

/// Sizes a hostile module might give a kernel: edges of every integer width.
const INTERESTING: &[i64] = &[
    0,
    1,
    -1,
    2,
    3,
    7,
    64,
    1 << 16,
    1 << 31,
    (1 << 31) - 1,
    1 << 32,
    1 << 62,
    i64::MAX,
    i64::MIN,
];

/// Overwrites one kernel parameter as the next input bytes say (or leaves it).
fn mutate_param(value: &mut KernelParam, bytes: &mut impl Iterator<Item = u8>) {
    let Some(b) = bytes.next() else {
        return;
    };
    match value {
        KernelParam::Int(n) => match b {
            0..=127 => {}
            128..=191 => *n = INTERESTING[usize::from(b) % INTERESTING.len()],
            _ => {
                let mut raw = [0u8; 8];
                for r in &mut raw {
                    *r = bytes.next().unwrap_or(0);
                }
                *n = i64::from_le_bytes(raw);
            }
        },
        KernelParam::Text(text) => {
            if b >= 128 {
                let len = usize::from(b - 128) % 16;
                *text = bytes.by_ref().take(len).map(char::from).collect();
            }
        }
    }
}

/// A file path of this process and thread, for targets that need a file.
fn scratch(ext: &str) -> PathBuf {
    let thread = format!("{:?}", std::thread::current().id());
    let thread: String = thread.chars().filter(char::is_ascii_digit).collect();
    std::env::temp_dir().join(format!("mslc-fuzz-{}-{thread}.{ext}", std::process::id()))
}
