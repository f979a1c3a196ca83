//! Proof that a forward pass allocates nothing once warmed up, and that the executor holds
//! exactly the memory its plan reports: a counting global allocator around `Executor::new` and
//! `Executor::run`. (Its own test binary, since the allocator is process-wide; the tests take a
//! lock so one's allocations never land in the other's count.)

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use mslc_check::{check_path, CheckOptions};
use mslc_driver::compile::{compile, Compiled};
use mslc_driver::select::{compile_options, Selection};
use mslc_exec::{ExecOptions, Executor};

/// Counts allocations (and reallocations) while `COUNTING` is set, and the bytes live at any
/// time.
struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);
static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);
/// The most bytes live at once since it was last reset to the live bytes.
static PEAK_BYTES: AtomicUsize = AtomicUsize::new(0);
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            let live = LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK_BYTES.fetch_max(live, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
            let live = LIVE_BYTES.fetch_add(new_size, Ordering::Relaxed) + new_size;
            PEAK_BYTES.fetch_max(live, Ordering::Relaxed);
        }
        new
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// `file` compiled for a CPU target with `sets` overriding consts and dims, with its train's
/// precision policy when `policy`.
fn compiled(file: &str, sets: &[(&str, &str)], policy: bool) -> Compiled {
    let mut options = CheckOptions::default();
    for (k, v) in sets {
        // Upper-case names are dims (`B`, `S`, `R`), others consts.
        let overrides = if k.starts_with(char::is_uppercase) {
            &mut options.overrides.dims
        } else {
            &mut options.overrides.sets
        };
        overrides.insert(k.to_string(), v.to_string());
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let checked = check_path(&root.join(file), &options);
    assert!(!checked.has_errors());
    let model = &checked.models[0];
    let mut options = compile_options(
        &checked,
        model,
        Selection {
            target: Some("cpu"),
            fuse: true,
            ..Selection::default()
        },
    )
    .unwrap();
    if !policy {
        options.amp = None;
    }
    compile(model, &options).unwrap()
}

/// An executor on `threads` threads with parameters and inputs set, after one run.
fn warm_executor(module: mslc_artifact::Module, threads: usize) -> Executor {
    let mut exec = Executor::new(
        module,
        &ExecOptions {
            threads,
            ..ExecOptions::default()
        },
    )
    .unwrap();
    exec.init_params(1);
    for input in exec.unset_inputs() {
        exec.seed_input(&input, 2).unwrap();
    }
    exec.run().unwrap();
    exec
}

#[test]
fn a_warm_forward_pass_allocates_nothing() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for (file, sets) in [
        ("examples/tiny_llama.msl", &[("layers", "2")][..]),
        ("examples/mlp.msl", &[][..]),
    ] {
        for threads in [1, 2] {
            // After one warm-up pass (lazy CPU-feature detection and the like).
            let mut exec = warm_executor(compiled(file, sets, false).module, threads);
            ALLOCATIONS.store(0, Ordering::SeqCst);
            COUNTING.store(true, Ordering::SeqCst);
            let result = exec.run();
            COUNTING.store(false, Ordering::SeqCst);
            result.unwrap();
            let n = ALLOCATIONS.load(Ordering::SeqCst);
            assert_eq!(
                n, 0,
                "{file} on {threads} thread(s): {n} allocations in one run"
            );
        }
    }
}

/// A warm training step holds nothing beyond its buffers and kept scratch: tiny LLaMA with
/// grouped-query attention (2 kv heads for 4 query heads, one sequence), whose attention
/// gradient splits each group over tasks and adds their dk / dv parts in scratch — it allocated
/// them on every call, outside the memory plan (2 × 2 × 2 × T × D floats, 128 KiB a layer
/// here). What a step still allocates is a few hundred bytes of fused programs' layouts.
#[test]
fn a_warm_training_step_holds_no_buffer_of_its_own() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!("mslc-alloc-train-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let source = std::fs::read_to_string(root.join("examples/tiny_llama.msl")).unwrap();
    let model_end = source.find("// f16 has a narrow").expect("the model part");
    let path = dir.join("fit.msl");
    let train = "train Fit for TinyLlama {\n    labels: i32[B, S]\n    \
                 loss = cross_entropy(logits, labels)\n    \
                 optimizer = adamw(lr: 1e-4)\n    batch = 1\n}\n";
    std::fs::write(&path, format!("{}\n{train}", &source[..model_end])).unwrap();
    let built = dir.join("built");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_mslc"))
        .args(["build", path.to_str().unwrap(), "--entry", "Fit", "-o"])
        .arg(&built)
        .args([
            "--set",
            "layers=1",
            "--set",
            "kv_heads=2",
            "--dim",
            "B=1",
            "--dim",
            "S=64",
        ])
        .output()
        .unwrap();
    assert!(status.status.success(), "{status:?}");
    let bytes = mslc_artifact::read_mir(&built.join("Fit.mir")).unwrap();
    let module = mslc_artifact::decode(&bytes).unwrap().module;
    std::fs::remove_dir_all(&dir).unwrap();
    for threads in [1, 2] {
        let mut exec = warm_executor(module.clone(), threads);
        let before = LIVE_BYTES.load(Ordering::SeqCst);
        PEAK_BYTES.store(before, Ordering::SeqCst);
        exec.run().unwrap();
        let above = PEAK_BYTES.load(Ordering::SeqCst) - before;
        assert!(
            above < 16 << 10,
            "{threads} thread(s): {above} bytes above the buffers in one step"
        );
    }
}

/// Drawing the parameters from a seed writes each f32 parameter straight into its buffer:
/// the most bytes live while it runs stay below one copy of the largest parameter (mlp's
/// 784 × 256 weight, 803 KB; the whole-parameter copy it replaced was that much above); and
/// seeding an f32 input, below a copy of it.
#[test]
fn drawing_f32_parameters_and_inputs_holds_no_copy_of_them() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let module = compiled("examples/mlp.msl", &[], false).module;
    let largest = (module.values.iter())
        .filter(|v| matches!(v.storage, mslc_artifact::Storage::Param { .. }))
        .map(|v| v.ty.bytes() as usize)
        .max()
        .unwrap();
    let mut exec = warm_executor(module, 1);
    let before = LIVE_BYTES.load(Ordering::SeqCst);
    PEAK_BYTES.store(before, Ordering::SeqCst);
    exec.init_params(7);
    let above = PEAK_BYTES.load(Ordering::SeqCst) - before;
    assert!(
        above < largest / 4,
        "{above} bytes above the buffers while drawing (largest parameter {largest})"
    );
    // So is a seeded f32 input (mlp's images).
    let (name, v) = exec.module().inputs().next().unwrap();
    let (name, image) = (
        name.to_string(),
        exec.module().values[v as usize].ty.bytes() as usize,
    );
    let before = LIVE_BYTES.load(Ordering::SeqCst);
    PEAK_BYTES.store(before, Ordering::SeqCst);
    exec.seed_input(&name, 3).unwrap();
    let above = PEAK_BYTES.load(Ordering::SeqCst) - before;
    assert!(
        above < image / 4,
        "{above} bytes above the buffers while seeding (the images {image})"
    );
}

/// `mslc run` checks its outputs for NaN and writes them (`--output-dir`) where they lie: the
/// most bytes live while it views and checks every output stay far below one copy of the
/// logits (tiny LLaMA's `[B, S, 1000]` f32, 2 MB); the view holds the output's values.
#[test]
fn outputs_are_viewed_and_checked_without_a_copy() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let module = compiled("examples/tiny_llama.msl", &[("layers", "1")], false).module;
    let exec = warm_executor(module, 1);
    let names: Vec<String> = (exec.module().outputs.iter())
        .map(|(n, _)| n.clone())
        .collect();
    let logits = exec.output_npy("logits").unwrap();
    let before = LIVE_BYTES.load(Ordering::SeqCst);
    PEAK_BYTES.store(before, Ordering::SeqCst);
    let views: Vec<_> = names.iter().map(|n| exec.output_view(n).unwrap()).collect();
    assert!(exec.nonfinite_outputs().is_empty());
    let above = PEAK_BYTES.load(Ordering::SeqCst) - before;
    assert!(
        above < logits.data().len() / 16,
        "{above} bytes above the buffers while viewing outputs (logits {} bytes)",
        logits.data().len()
    );
    let view = &views[names.iter().position(|n| n == "logits").unwrap()];
    assert_eq!(view.clone().into_array(), logits);
}

/// The live bytes once they stop changing: the threads of a dropped pool free their
/// thread-local scratch as they exit, after the drop returns.
fn settled_live_bytes() -> usize {
    let mut last = LIVE_BYTES.load(Ordering::SeqCst);
    for _ in 0..100 {
        std::thread::sleep(std::time::Duration::from_millis(50));
        let now = LIVE_BYTES.load(Ordering::SeqCst);
        if now == last {
            return now;
        }
        last = now;
    }
    last
}

/// The memory plan is what runs: after setup and a run, the executor holds the plan's
/// `total_bytes` (arena, hoisted region, parameters, inputs, staging) plus its per-thread
/// scratch for each thread — and beyond them what it keeps for the prepared program, which the
/// plan gives as `program_bytes` (`EXECUTOR_BYTES_PER_STEP` a step).
#[test]
fn the_executor_holds_what_the_memory_plan_reports() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for (file, sets, policy) in [
        ("examples/tiny_llama.msl", &[("layers", "1")][..], false),
        ("examples/tiny_llama.msl", &[("layers", "8")][..], false),
        // bf16 under O2: operands converted to f32 and results stored back through staging.
        ("examples/tiny_llama.msl", &[("layers", "2")][..], true),
        ("examples/mlp.msl", &[][..], false),
        (
            "examples/resnet50.msl",
            &[("B", "1"), ("R", "32")][..],
            false,
        ),
    ] {
        let compiled = compiled(file, sets, policy);
        let plan = &compiled.memory;
        assert!(
            !policy || plan.staging_bytes > 0,
            "{file}: bf16 needs staging"
        );
        for threads in [1, 2] {
            // The module exists before the executor, as it does before a run's memory mark.
            let module = compiled.module.clone();
            let before = settled_live_bytes();
            let exec = warm_executor(module, threads);
            let held = LIVE_BYTES.load(Ordering::SeqCst) - before;
            let planned =
                plan.total_bytes as usize + plan.scratch_bytes_per_thread as usize * threads;
            // The program's share is an estimate per step: within a fifth of it, beside what
            // the pool's thread-locals hold whatever the program (12 kB measured on mlp).
            let program = plan.program_bytes as usize;
            let beyond = held as i64 - planned as i64;
            let off = beyond - program as i64;
            assert!(
                held >= planned && off.unsigned_abs() as usize <= program / 5 + (32 << 10),
                "{file} (policy {policy}) on {threads} thread(s): holds {held} bytes, \
                 the plan reports {planned} ({} + {} scratch per thread) and {program} for \
                 the program: {beyond} beyond the buffers",
                plan.total_bytes,
                plan.scratch_bytes_per_thread
            );
            drop(exec);
        }
    }
}
