//! A module's guard (`mslc_artifact::Guard`): a run whose flag is not 0 ends before the steps
//! it guards, so an update computed in place leaves its parameter as it was; a reader rejects
//! a guard it cannot honour.

use mslc_artifact::{Guard, Module, Step, Storage, ValueInfo};
use mslc_core::ops::{Attrs, DType, Op, TensorType};
use mslc_exec::{ExecOptions, Executor};
use mslc_io::npy::NpyArray;
use mslc_kernels::binding::choose_kernel;

/// `flag = neg(f)`, then the guarded `x = neg(x)`, computed over `x` in place; outputs `flag`
/// and `x`.
fn guarded_update(guard: Guard) -> Module {
    let value = |shape: Vec<i64>, storage| ValueInfo {
        ty: TensorType::new(DType::F32, shape),
        storage,
    };
    let step = |input: u32, output: u32| Step {
        op: Op::Neg,
        attrs: Attrs::new(),
        inputs: vec![input],
        outputs: vec![output],
        origin: String::new(),
        loc: None,
        kernel: choose_kernel(Op::Neg),
    };
    let mut m = Module {
        name: "guarded".into(),
        target: "cpu".into(),
        target_fingerprint: String::new(),
        values: vec![
            value(vec![4], Storage::Input { name: "x".into() }),
            value(vec![], Storage::Input { name: "f".into() }),
            value(vec![], Storage::Arena { offset: 0 }),
            value(vec![4], Storage::Arena { offset: 0 }),
        ],
        steps: vec![step(1, 2), step(0, 3)],
        outputs: vec![("flag".into(), 2), ("x".into(), 3)],
        arena_bytes: 0,
        hoisted_bytes: 0,
        guard: Some(guard),
    };
    mslc_plan::memory::plan_memory(&mut m, true).expect("planned");
    m
}

const GUARD: Guard = Guard { flag: 2, from: 1 };

/// `x` after one run with flag `-f` (all of it, or only what output `x` needs).
fn x_after(f: f32, whole: bool) -> Vec<f32> {
    let m = guarded_update(GUARD);
    assert_eq!(m.values[3].storage, Storage::Overwrite { name: "x".into() });
    let mut exec = Executor::new(m, &ExecOptions::default()).unwrap();
    let x = NpyArray::from_f32(vec![4], &[1.0, -2.0, 3.0, -4.0]).unwrap();
    exec.set_input("x", &x).unwrap();
    exec.set_input("f", &NpyArray::from_f32(vec![], &[f]).unwrap())
        .unwrap();
    match whole {
        true => exec.run().unwrap(),
        false => exec.run_for(&["x"]).unwrap(),
    }
    exec.write_back(["x"]).unwrap();
    exec.output_f32("x").unwrap().1
}

#[test]
fn a_flag_of_zero_runs_the_update_and_any_other_skips_it() {
    for whole in [true, false] {
        // −0 is 0.
        assert_eq!(x_after(0.0, whole), [-1.0, 2.0, -3.0, 4.0], "{whole}");
        for f in [1.0, f32::NAN, f32::INFINITY] {
            assert_eq!(x_after(f, whole), [1.0, -2.0, 3.0, -4.0], "{f} {whole}");
        }
    }
}

#[test]
fn a_reader_rejects_a_guard_it_cannot_honour() {
    let cases = [
        (Guard { flag: 2, from: 0 }, "not computed before step 0"),
        (Guard { flag: 1, from: 1 }, "not computed before step 1"),
        (Guard { flag: 0, from: 1 }, "not one f32"),
        (Guard { flag: 9, from: 1 }, "is no value"),
        (Guard { flag: 2, from: 3 }, "past the 2 steps"),
    ];
    for (guard, expect) in cases {
        let Err(e) = Executor::new(guarded_update(guard), &ExecOptions::default()) else {
            panic!("{guard:?} accepted");
        };
        assert!(e.message.contains(expect), "{guard:?}: {}", e.message);
    }
}

/// A constant only the update reads is computed behind the guard, once, and kept: a run that
/// stops at the guard before computing it leaves it to the next run (`x ← x · c` with
/// `c = constant(3)`, skipped, then run).
#[test]
fn a_run_stopped_at_the_guard_leaves_the_update_s_constants_to_compute() {
    let mut m = guarded_update(GUARD);
    let scalar = TensorType::new(DType::F32, Vec::<i64>::new());
    m.values.push(ValueInfo {
        ty: scalar,
        storage: Storage::Arena { offset: 0 },
    });
    m.steps.insert(
        1,
        Step {
            op: Op::Constant,
            attrs: Attrs::new().with("value", 3.0).with("dtype", DType::F32),
            inputs: vec![],
            outputs: vec![4],
            origin: String::new(),
            loc: None,
            kernel: choose_kernel(Op::Constant),
        },
    );
    m.steps[2].op = Op::Mul;
    m.steps[2].kernel = choose_kernel(Op::Mul);
    m.steps[2].inputs = vec![0, 4];
    m.values[3].storage = Storage::Arena { offset: 0 };
    mslc_plan::memory::plan_memory(&mut m, true).expect("planned");
    assert!(matches!(m.values[4].storage, Storage::Hoisted { .. }));
    let mut exec = Executor::new(m, &ExecOptions::default()).unwrap();
    let x = NpyArray::from_f32(vec![4], &[1.0, -2.0, 3.0, -4.0]).unwrap();
    exec.set_input("x", &x).unwrap();
    for f in [1.0, 0.0] {
        exec.set_input("f", &NpyArray::from_f32(vec![], &[f]).unwrap())
            .unwrap();
        exec.run().unwrap();
        exec.write_back(["x"]).unwrap();
    }
    assert_eq!(exec.output_f32("x").unwrap().1, [3.0, -6.0, 9.0, -12.0]);
}
