//! `cargo mslc`: check, build or format-check every `.msl` model of a cargo workspace — the
//! command a CI of a crate that uses mslc runs. Packages come from `cargo metadata`; a
//! package's models are listed in `[package.metadata.mslc] models = [...]` (paths relative to
//! its manifest), or else are all of `models/**/*.msl`. Exit codes: 0 clean (warnings
//! allowed), 1 errors in the models, 2 usage errors or a workspace cargo cannot read.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use cargo_metadata::{MetadataCommand, Package};
use clap::{Parser, Subcommand};

use mslc_check::{check_path, CheckOptions};
use mslc_core::diag::Severity;
use mslc_driver::render::{render_human, RenderOptions};
use mslc_driver::stack::on_compiler_stack;

/// Check, build or format-check the `.msl` models of a cargo workspace.
#[derive(Parser, Debug)]
#[command(name = "cargo mslc", bin_name = "cargo mslc", version)]
struct Args {
    /// The workspace's `Cargo.toml` (default: found from the current directory).
    #[arg(long, global = true, value_name = "PATH")]
    manifest_path: Option<PathBuf>,
    /// What to do.
    #[command(subcommand)]
    command: Action,
}

/// What `cargo mslc` does across the models.
#[derive(Subcommand, Debug)]
enum Action {
    /// Check every model and print its diagnostics.
    Check,
    /// Build every model (artifacts and bindings under `target/mslc/PACKAGE/`).
    Build {
        /// Output directory instead of `target/mslc` (one folder per package inside).
        #[arg(long, value_name = "DIR")]
        out_dir: Option<PathBuf>,
    },
    /// Run `mslc fmt --check` on every model file.
    Fmt,
}

/// One package's model files.
struct PackageModels {
    name: String,
    files: Vec<PathBuf>,
}

fn main() -> ExitCode {
    // `cargo mslc ARGS` runs `cargo-mslc mslc ARGS`.
    let mut argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv.get(1).is_some_and(|a| a == "mslc") {
        argv.remove(1);
    }
    let args = Args::parse_from(argv);
    match on_compiler_stack(|| run(&args)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(3)
        }
    }
}

fn run(args: &Args) -> u8 {
    let mut command = MetadataCommand::new();
    command.no_deps();
    if let Some(path) = &args.manifest_path {
        command.manifest_path(path);
    }
    let metadata = match command.exec() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: cannot read the cargo workspace: {e}");
            return 2;
        }
    };
    let members: Vec<&Package> = metadata.workspace_packages();
    let mut packages = Vec::new();
    for package in members {
        match models_of(package) {
            Ok(files) if !files.is_empty() => packages.push(PackageModels {
                name: package.name.to_string(),
                files,
            }),
            Ok(_) => {}
            Err(message) => {
                eprintln!("error: package `{}`: {message}", package.name);
                return 2;
            }
        }
    }
    let count: usize = packages.iter().map(|p| p.files.len()).sum();
    if count == 0 {
        eprintln!(
            "warning: no .msl models found (looked in models/**/*.msl and \
             [package.metadata.mslc] models of each workspace package)"
        );
        return 0;
    }
    match &args.command {
        Action::Check => check(&packages),
        Action::Build { out_dir } => {
            let root = out_dir
                .clone()
                .unwrap_or_else(|| metadata.target_directory.join("mslc").into_std_path_buf());
            build(&packages, &root)
        }
        Action::Fmt => fmt(&packages),
    }
}

/// The package's model files: `[package.metadata.mslc] models`, else `models/**/*.msl`.
fn models_of(package: &Package) -> Result<Vec<PathBuf>, String> {
    let dir = package
        .manifest_path
        .parent()
        .map(|d| d.as_std_path().to_path_buf())
        .unwrap_or_default();
    let listed = &package.metadata["mslc"]["models"];
    if !listed.is_null() {
        let list = listed
            .as_array()
            .ok_or("[package.metadata.mslc] models must be a list of paths")?;
        return list
            .iter()
            .map(|v| {
                v.as_str()
                    .map(|s| dir.join(s))
                    .ok_or_else(|| format!("[package.metadata.mslc] models: {v} is not a path"))
            })
            .collect();
    }
    let mut files = Vec::new();
    msl_files(&dir.join("models"), &mut files);
    files.sort();
    Ok(files)
}

/// Every `.msl` file under `dir`, recursively (nothing if it does not exist).
fn msl_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            msl_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "msl") {
            out.push(path);
        }
    }
}

fn check(packages: &[PackageModels]) -> u8 {
    let (mut errors, mut warnings) = (0, 0);
    for file in packages.iter().flat_map(|p| &p.files) {
        let checked = check_path(file, &CheckOptions::default());
        for d in &checked.diagnostics {
            eprint!(
                "{}",
                render_human(d, &checked.sources, RenderOptions::default())
            );
            match d.severity {
                Severity::Error => errors += 1,
                Severity::Warning => warnings += 1,
            }
        }
    }
    let files: usize = packages.iter().map(|p| p.files.len()).sum();
    println!(
        "checked {files} file(s) in {} package(s): {errors} error(s), {warnings} warning(s)",
        packages.len()
    );
    u8::from(errors > 0)
}

fn build(packages: &[PackageModels], root: &Path) -> u8 {
    let mut failed = false;
    for package in packages {
        // Files that only hold blocks for others to import have no model to build.
        let models: Vec<&PathBuf> = package
            .files
            .iter()
            .filter(|f| !check_path(f, &CheckOptions::default()).models.is_empty())
            .collect();
        let dir = root.join(&package.name);
        let result = mslc_build::Config::new()
            .cargo_directives(false)
            .out_dir(&dir)
            .compile(&models);
        match result {
            Ok(built) => {
                for w in &built.warnings {
                    eprint!("{w}");
                }
                for m in &built.models {
                    println!("built {} ({}) -> {}", m.name, package.name, m.mir.display());
                }
            }
            Err(e) => {
                eprint!("{e}");
                failed = true;
            }
        }
    }
    u8::from(failed)
}

/// The `mslc` binary installed next to this one, else the one on `PATH`.
fn mslc_binary() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| {
            let sibling = exe.with_file_name(format!("mslc{}", std::env::consts::EXE_SUFFIX));
            sibling.is_file().then_some(sibling)
        })
        .unwrap_or_else(|| PathBuf::from("mslc"))
}

fn fmt(packages: &[PackageModels]) -> u8 {
    let mslc = mslc_binary();
    let has_fmt = Command::new(&mslc)
        .args(["fmt", "--help"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_fmt {
        eprintln!(
            "error: `cargo mslc fmt` needs an `mslc` with a `fmt` command, and `{}` {}",
            mslc.display(),
            if Command::new(&mslc).arg("--version").output().is_ok() {
                "has none (install a newer mslc)"
            } else {
                "cannot be run (install mslc next to cargo-mslc or on PATH)"
            }
        );
        return 2;
    }
    let files = packages.iter().flat_map(|p| &p.files);
    match Command::new(&mslc)
        .args(["fmt", "--check"])
        .args(files)
        .status()
    {
        Ok(status) if status.success() => 0,
        Ok(_) => 1,
        Err(e) => {
            eprintln!("error: cannot run `{}`: {e}", mslc.display());
            2
        }
    }
}
