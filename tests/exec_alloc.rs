//! Proof that a forward pass allocates nothing once warmed up: a counting global allocator
//! around `Executor::run`. (Its own test binary, since the allocator is process-wide.)

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use mslc_check::{check_path, CheckOptions};
use mslc_driver::compile::{compile, CompileOptions};
use mslc_exec::{ExecOptions, Executor};
use mslc_plan::target::Target;

/// Counts allocations (and reallocations) while `COUNTING` is set.
struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn module(file: &str, sets: &[(&str, &str)]) -> mslc_artifact::Module {
    let mut options = CheckOptions::default();
    for (k, v) in sets {
        options.overrides.sets.insert(k.to_string(), v.to_string());
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let checked = check_path(&root.join(file), &options);
    assert!(!checked.has_errors());
    let target = Target {
        name: "cpu".into(),
        peak_f32: 157e9,
        peak_f16: 157e9,
        peak_bf16: 157e9,
        memory_bytes: 24 << 30,
        bandwidth: 25e9,
        interconnect: 10e9,
        devices_per_node: 1,
    };
    let options = CompileOptions {
        target,
        verify: false,
        fuse: true,
        amp: None,
    };
    compile(&checked.models[0], &options).unwrap().module
}

#[test]
fn a_warm_forward_pass_allocates_nothing() {
    for (file, sets) in [
        ("examples/tiny_llama.msl", &[("layers", "2")][..]),
        ("examples/mlp.msl", &[][..]),
    ] {
        for threads in [1, 2] {
            let mut exec = Executor::new(
                module(file, sets),
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
            // One warm-up pass (lazy CPU-feature detection and the like).
            exec.run().unwrap();
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
