//! The build-script API (`mslc_build`): bad input fails with the rendered diagnostic and writes
//! nothing, every imported file is watched, unchanged outputs are not rewritten — and the
//! example crate under `examples/build-script` builds, runs, and reruns its build script when
//! (and only when) an imported `.msl` file changes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, SystemTime};

use mslc_build::Config;

const EXAMPLE: &str = "examples/build-script";

fn quiet() -> Config {
    let mut config = Config::new();
    config.cargo_directives(false);
    config
}

#[test]
fn builds_the_example_model_and_watches_its_imports() {
    let out = tempfile::tempdir().unwrap();
    let built = quiet()
        .target("cpu")
        .out_dir(out.path())
        .compile(&[format!("{EXAMPLE}/models/net.msl")])
        .unwrap();
    let names: Vec<String> = built
        .inputs
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["layers.msl", "net.msl"], "{:?}", built.inputs);
    assert!(built.inputs.iter().all(|p| p.is_absolute()));
    assert_eq!(built.models.len(), 1);
    assert_eq!(built.models[0].name, "Net");
    assert_eq!(built.models[0].module, "net");
    for ext in ["mir", "kernels.toml", "memplan.json"] {
        assert!(out.path().join(format!("Net.{ext}")).is_file(), "{ext}");
    }
    let rust = std::fs::read_to_string(&built.bindings).unwrap();
    assert!(rust.starts_with("// @generated"), "{rust}");
    for needle in [
        "pub mod net {",
        "pub const INPUT_TOKENS_SHAPE: [usize; 2] = [2, 8];",
        "pub const INPUT_TOKENS_DTYPE: &str = \"i64\";",
        "pub const OUTPUT_LOGITS_SHAPE: [usize; 3] = [2, 8, 4];",
        "pub tokens: &'a [i64],",
        "\"head.fc1.weight\"",
        "pub fn load_with_weights(",
    ] {
        assert!(rust.contains(needle), "{needle} in\n{rust}");
    }
}

#[test]
fn unchanged_outputs_are_not_rewritten() {
    let out = tempfile::tempdir().unwrap();
    let build = || {
        quiet()
            .out_dir(out.path())
            .compile(&[format!("{EXAMPLE}/models/net.msl")])
            .unwrap()
    };
    let built = build();
    let mtime = |p: &Path| std::fs::metadata(p).unwrap().modified().unwrap();
    let before = [mtime(&built.bindings), mtime(&built.models[0].mir)];
    std::thread::sleep(Duration::from_millis(20));
    build();
    assert_eq!(
        before,
        [mtime(&built.bindings), mtime(&built.models[0].mir)]
    );
}

#[test]
fn bad_input_fails_with_the_rendered_diagnostic_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let broken = dir.path().join("broken.msl");
    std::fs::write(
        &broken,
        "model M {\n    input x: f32[4]\n    output y = nope(x)\n}\n",
    )
    .unwrap();
    let boolean = dir.path().join("boolean.msl");
    std::fs::write(
        &boolean,
        "model Masked {\n    input mask: bool[4]\n    output y = cast(mask, f32)\n}\n",
    )
    .unwrap();
    let missing = dir.path().join("missing.msl");
    for (file, code) in [(&missing, "E0100"), (&broken, "E0202"), (&boolean, "E0710")] {
        let err = quiet().out_dir(&out).compile(&[file]).unwrap_err();
        assert!(err.message().contains(code), "{code}: {err}");
        assert_eq!(format!("{err:?}"), err.to_string());
    }
    assert!(!out.exists(), "nothing is written on errors");
    // An output directory under a regular file cannot be created.
    let blocked = broken.join("out");
    std::fs::write(&broken, "").unwrap();
    let err = quiet()
        .out_dir(&blocked)
        .compile(&[format!("{EXAMPLE}/models/net.msl")])
        .unwrap_err();
    assert!(err.message().contains("cannot create"), "{err}");
}

#[test]
fn warnings_are_reported_and_do_not_fail_the_build() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("warned.msl");
    std::fs::write(
        &file,
        "model M {\n    input x: f32[4]\n    output y = relu(x)\n}\n\n\
         precision Careful {\n    level = O0\n    keep_f32 = [softmax]\n}\n",
    )
    .unwrap();
    let built = quiet()
        .out_dir(dir.path().join("out"))
        .compile(&[&file])
        .unwrap();
    assert_eq!(built.warnings.len(), 1, "{:?}", built.warnings);
    assert!(built.warnings[0].contains("W0002"), "{}", built.warnings[0]);
}

fn cargo(dir: &Path, target: &Path, args: &[&str]) -> Output {
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string()))
        .args(args)
        .arg("--offline")
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", target)
        .env_remove("RUSTFLAGS")
        .output()
        .expect("run cargo");
    assert!(
        out.status.success(),
        "cargo {args:?}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Whether a `cargo build -v` ran the example's build script.
fn ran_build_script(out: &Output) -> bool {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .any(|l| l.contains("Running") && l.contains("build-script-build"))
}

/// A copy of the example crate in `dir` whose path dependencies point back at this workspace.
fn copy_example(dir: &Path) -> PathBuf {
    let root = std::fs::canonicalize(".").unwrap();
    let crate_dir = dir.join("build-script");
    std::fs::create_dir_all(crate_dir.join("models")).unwrap();
    std::fs::create_dir_all(crate_dir.join("src")).unwrap();
    for file in [
        "Cargo.lock",
        "build.rs",
        "models/net.msl",
        "models/layers.msl",
        "src/main.rs",
    ] {
        std::fs::copy(Path::new(EXAMPLE).join(file), crate_dir.join(file)).unwrap();
    }
    let manifest = std::fs::read_to_string(Path::new(EXAMPLE).join("Cargo.toml"))
        .unwrap()
        .replace("../../crates/", &format!("{}/crates/", root.display()));
    std::fs::write(crate_dir.join("Cargo.toml"), manifest).unwrap();
    crate_dir
}

/// Slow the first time (it compiles the compiler into its own target directory under
/// `target/`); later runs reuse that directory.
#[test]
fn example_crate_runs_and_rebuilds_only_when_an_import_changes() {
    let target = std::fs::canonicalize("target")
        .unwrap()
        .join("example-build-script");
    let run = cargo(Path::new(EXAMPLE), &target, &["run", "-q"]);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(stdout.contains("Net on cpu: logits [2, 8, 4]"), "{stdout}");

    let tmp = tempfile::tempdir().unwrap();
    let copy = copy_example(tmp.path());
    let first = cargo(&copy, &target, &["build", "-v"]);
    assert!(ran_build_script(&first));
    let again = cargo(&copy, &target, &["build", "-v"]);
    assert!(
        !ran_build_script(&again),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert!(String::from_utf8_lossy(&again.stderr).contains("Fresh mslc-build-script-example"));
    // Touch the imported file (not the root): the build script reruns.
    std::fs::File::options()
        .append(true)
        .open(copy.join("models/layers.msl"))
        .unwrap()
        .set_modified(SystemTime::now() + Duration::from_secs(2))
        .unwrap();
    let touched = cargo(&copy, &target, &["build", "-v"]);
    assert!(
        ran_build_script(&touched),
        "{}",
        String::from_utf8_lossy(&touched.stderr)
    );
}

#[test]
fn the_runner_checks_input_lengths_and_runs() {
    use mslc_exec::runner::Runner;
    use mslc_exec::ExecErrorKind;

    let out = tempfile::tempdir().unwrap();
    let built = quiet()
        .out_dir(out.path())
        .compile(&[format!("{EXAMPLE}/models/net.msl")])
        .unwrap();
    let mir = std::fs::read(&built.models[0].mir).unwrap();
    let mut runner = Runner::from_mir(&mir).unwrap();
    runner.init_seed(3);
    let err = runner.set_input("tokens", &[1i64, 2, 3]).unwrap_err();
    assert_eq!(err.kind, ExecErrorKind::Input);
    assert!(err.message.contains("16 values"), "{err}");
    assert!(runner.set_input("nope", &[0i64; 16]).is_err());
    runner.set_input("tokens", &[5i32; 16]).unwrap();
    runner.run().unwrap();
    let logits = runner.output("logits").unwrap();
    assert_eq!(logits.shape, [2, 8, 4]);
    assert_eq!(logits.data.len(), 64);
    assert!(runner.output("nope").is_err());
    assert!(Runner::from_mir(b"not a mir").is_err());
}
