//! `mslc run --check-numerics`: a forced overflow is found at the op where it happens, with the
//! operands' ranges and whether f32 would have stayed finite.

use mslc_io::npy::{write_npy, NpyArray};

use super::common::{mslc, s, TestDir};

/// `exp(x)` beside a linear layer, trained under an O3 f16 policy: `exp(12)` ≈ 1.6e5 overflows
/// f16 (largest 65504) but not f32; `exp(100)` overflows f32 too.
const MODEL: &str = "import std.nn.Linear

model Scale {
    input x: f32[2, 8]
    let h = proj: Linear(x, 8)
    output y = exp(x) + h
}

precision Half {
    level = O3
    compute = f16
}

train T for Scale {
    labels: f32[2, 8]
    loss = mse_loss(y, labels)
    optimizer = sgd(lr: 0.1)
    batch = 2
    precision = Half
}
";

fn filled(dir: &TestDir, name: &str, value: f32) -> String {
    let path = dir.path(name);
    write_npy(
        &path,
        &NpyArray::from_f32(vec![2, 8], &[value; 16]).unwrap(),
    )
    .unwrap();
    format!("x={}", s(&path))
}

#[test]
fn check_numerics_finds_the_op_that_overflows() {
    let dir = TestDir::new("numerics");
    let source = dir.path("scale.msl");
    std::fs::write(&source, MODEL).unwrap();
    let (twelve, hundred) = (filled(&dir, "12.npy", 12.0), filled(&dir, "100.npy", 100.0));
    let run = |file: &str, input: &str, extra: &[&str]| {
        let mut args = vec!["run", file, "--init-seed", "1", "--input", input];
        args.extend_from_slice(extra);
        mslc(&args)
    };

    // Without the check the run succeeds and warns about the output.
    let (code, _, err) = run(s(&source), &twelve, &[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("W0003") && err.contains("--check-numerics"),
        "{err}"
    );

    // f16 overflow only: the op, its line, its operand, and that f32 stays finite.
    let (code, _, err) = run(s(&source), &twelve, &["--check-numerics"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("E0614"), "{err}");
    assert!(
        err.contains("`exp` produced NaN or infinity (forward, step 2): 16 of its 16 elements"),
        "{err}"
    );
    assert!(
        err.contains("output y = exp(x) + h"),
        "points at the source:\n{err}"
    );
    assert!(
        err.contains("operand 0 f16[2,8]: min 1.2e1, max 1.2e1"),
        "{err}"
    );
    assert!(
        err.contains("stays finite (abs max 1.627548e5), beyond the range of f16"),
        "{err}"
    );

    // An input beyond f16 overflows where it is cast to f16 (a copy step, which converts the
    // operand's bytes straight into its own: the f32 result is the operand itself).
    let (code, _, err) = run(
        s(&source),
        &filled(&dir, "1e5.npy", 1e5),
        &["--check-numerics"],
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("`cast` in `proj` produced NaN or infinity (forward, step 0)"),
        "{err}"
    );
    assert!(
        err.contains("stays finite (abs max 1e5), beyond the range of f16"),
        "{err}"
    );

    // The same from the built artifact, without the source to point at.
    let out = dir.path("out");
    let (code, _, err) = mslc(&["build", s(&source), "-o", s(&out)]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = run(s(&out.join("Scale.mir")), &twelve, &["--check-numerics"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("E0614") && err.contains("`exp` produced NaN"),
        "{err}"
    );
    assert!(err.contains("beyond the range of f16"), "{err}");

    // In f32, exp(100) overflows the math itself.
    let (code, _, err) = run(
        s(&source),
        &hundred,
        &["--check-numerics", "--precision", "f32"],
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("`exp` produced NaN or infinity (forward, step 0)"),
        "{err}"
    );
    assert!(err.contains("the operands are finite"), "{err}");

    // A finite run passes the check.
    let ones = filled(&dir, "1.npy", 1.0);
    let (code, _, err) = run(s(&source), &ones, &["--check-numerics"]);
    assert_eq!(code, 0, "{err}");
}

/// A fused elementwise program whose last step overflows f16 (`exp(10) · 10` ≈ 2.2e5, while
/// `exp(10)` ≈ 2.2e4 fits): the report compares with the program's exact f32 result, not with
/// one already rounded to f16.
#[test]
fn check_numerics_judges_a_fused_program_by_its_f32_result() {
    let dir = TestDir::new("numerics-fused");
    let source = dir.path("fused.msl");
    std::fs::write(
        &source,
        "model Grow {\n    input x: f32[2, 8]\n    output y = exp(x) * x\n}\n\nprecision Half {\n    level = O3\n    compute = f16\n}\n",
    )
    .unwrap();
    let ten = filled(&dir, "10.npy", 10.0);
    let (code, _, err) = mslc(&[
        "run",
        s(&source),
        "--input",
        &ten,
        "--precision",
        "Half",
        "--check-numerics",
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("`fused_elementwise` produced NaN or infinity (forward"),
        "{err}"
    );
    assert!(
        err.contains("stays finite (abs max 2.2"),
        "the f32 result is exp(10) · 10:\n{err}"
    );
}

/// A fused program that writes its result over its operand (`exp(h) · h`, h's last read, both
/// f16): the report gives the operand as it was before the step — finite, with the f32 result
/// finite too — not the overflowed result that replaced it (which read as "an operand already
/// holds NaN or infinity").
#[test]
fn check_numerics_reports_an_operand_the_step_wrote_over_as_it_was() {
    let dir = TestDir::new("numerics-overwritten");
    let source = dir.path("alias.msl");
    std::fs::write(
        &source,
        "import std.nn.Linear\n\nmodel Grow {\n    input x: f32[2, 8]\n    let h = proj: Linear(x, 8)\n    let z = exp(h) * h\n    output y = out: Linear(z, 8)\n}\n\nprecision Half {\n    level = O3\n    compute = f16\n}\n",
    )
    .unwrap();
    // The case holds: the program's result is planned over the matmul's (its only operand).
    let out = dir.path("out");
    let (code, _, err) = mslc(&["build", s(&source), "-o", s(&out), "--precision", "Half"]);
    assert_eq!(code, 0, "{err}");
    let (code, listing, err) = mslc(&["inspect", s(&out.join("Grow.mir"))]);
    assert_eq!(code, 0, "{err}");
    let offset = |op: &str| {
        let line = listing
            .lines()
            .find(|l| l.contains(&format!("= {op}(")) && l.contains("f16[2,8] @"))
            .unwrap_or_else(|| panic!("no {op} in\n{listing}"));
        line.split(" @")
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .to_string()
    };
    assert_eq!(offset("matmul"), offset("fused_elementwise"), "{listing}");
    // |h| up to ~26: exp overflows f16, not f32.
    let x = filled(&dir, "300.npy", 300.0);
    let (code, _, err) = mslc(&[
        "run",
        s(&source),
        "--input",
        &x,
        "--precision",
        "Half",
        "--init-seed",
        "1",
        "--check-numerics",
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("`fused_elementwise` produced NaN"), "{err}");
    let help = err.split("help:").nth(1).expect("a help line");
    assert!(help.contains("operand 0 f16[2,8]: min -"), "{err}");
    assert!(
        !help.contains("non-finite") && !help.contains("already holds"),
        "{err}"
    );
    assert!(help.contains("stays finite"), "{err}");
}
