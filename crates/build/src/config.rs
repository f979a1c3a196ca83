//! [`Config`]: which models to build, for which target, into which directory — and the one
//! call that checks, builds, writes and generates.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use mslc_artifact::encode;
use mslc_check::{check_path, CheckOptions, Checked};
use mslc_core::diag::{Code, Diagnostic, FileId, Severity};
use mslc_driver::artifacts::artifact_files;
use mslc_driver::compile::compile;
use mslc_driver::render::{render_human, RenderOptions};
use mslc_driver::select::{choose_model, compile_options, root_error, Selection};
use mslc_driver::stack::on_compiler_stack;

use crate::bindings::{bindings, module_ident, ModelBinding};
use crate::write::write_if_changed;

/// The generated bindings' file name in the output directory; include it with
/// `include!(concat!(env!("OUT_DIR"), "/mslc_models.rs"))`.
pub const BINDINGS_FILE: &str = "mslc_models.rs";

/// Why a build failed: the rendered diagnostics, or a plain message (an unwritable output
/// directory, a missing `OUT_DIR`). Its `Debug` is the same text, so a `build.rs` whose `main`
/// returns the error prints the diagnostics as they are.
pub struct Error {
    message: String,
}

impl Error {
    fn new(message: impl Into<String>) -> Error {
        Error {
            message: message.into(),
        }
    }

    /// The full text: rendered diagnostics or the message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// One model built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuiltModel {
    /// The model's name in its source (`Net`).
    pub name: String,
    /// The Rust module generated for it, named after its file (`net`).
    pub module: String,
    /// Its `.mir` file.
    pub mir: PathBuf,
}

/// What [`Config::compile`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Built {
    /// The models, in the order of the files given.
    pub models: Vec<BuiltModel>,
    /// Every source file read from disk (roots and everything they import), absolute.
    pub inputs: Vec<PathBuf>,
    /// The warnings, rendered.
    pub warnings: Vec<String>,
    /// The generated bindings.
    pub bindings: PathBuf,
}

/// One model built in memory, not yet written.
struct OneModel {
    /// Its artifact files.
    files: Vec<(PathBuf, Vec<u8>)>,
    built: BuiltModel,
    binding: ModelBinding,
}

/// How to build models; see the crate docs.
#[derive(Clone, Debug)]
pub struct Config {
    target: Option<String>,
    out_dir: Option<PathBuf>,
    cargo_directives: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            target: None,
            out_dir: None,
            cargo_directives: true,
        }
    }
}

impl Config {
    /// The defaults: each model's own target (else `cpu`), output into `OUT_DIR`, cargo
    /// directives printed.
    pub fn new() -> Config {
        Config::default()
    }

    /// Plans every model for the target declaration `name` (`cpu`, `a100`, …).
    pub fn target(&mut self, name: impl Into<String>) -> &mut Config {
        self.target = Some(name.into());
        self
    }

    /// Writes artifacts and bindings into `dir` instead of `OUT_DIR`.
    pub fn out_dir(&mut self, dir: impl Into<PathBuf>) -> &mut Config {
        self.out_dir = Some(dir.into());
        self
    }

    /// Whether to print `cargo:rerun-if-changed=` and `cargo:warning=` lines (default: yes;
    /// turn off outside build scripts).
    pub fn cargo_directives(&mut self, on: bool) -> &mut Config {
        self.cargo_directives = on;
        self
    }

    /// Checks and builds the model of each of `files`, writes `NAME.mir`, `NAME.kernels.toml`
    /// and `NAME.memplan.json` per model and the bindings ([`BINDINGS_FILE`]) into the output
    /// directory — each only if its bytes changed. Any error in any file fails the whole
    /// build, with every file's diagnostics rendered, and writes nothing.
    pub fn compile(&self, files: &[impl AsRef<Path>]) -> Result<Built, Error> {
        let files: Vec<PathBuf> = files.iter().map(|f| f.as_ref().to_path_buf()).collect();
        on_compiler_stack(|| self.compile_here(&files)).map_err(|e| Error::new(e.to_string()))?
    }

    /// [`Config::compile`] on the current thread.
    fn compile_here(&self, files: &[PathBuf]) -> Result<Built, Error> {
        let dir = self.output_dir()?;
        let mut inputs = Vec::new();
        let mut warnings = Vec::new();
        let mut errors = Vec::new();
        let mut outputs: Vec<(PathBuf, Vec<u8>)> = Vec::new();
        let mut models: Vec<(BuiltModel, ModelBinding)> = Vec::new();
        for file in files {
            let checked = check_path(file, &CheckOptions::default());
            inputs.extend(files_read(&checked, file));
            for d in &checked.diagnostics {
                let text = render_human(d, &checked.sources, RenderOptions::default());
                match d.severity {
                    Severity::Warning => warnings.push(text),
                    Severity::Error => errors.push(text),
                }
            }
            if checked.has_errors() {
                continue;
            }
            match self.build_one(&checked, file, &dir) {
                Ok(one) => {
                    outputs.extend(one.files);
                    models.push((one.built, one.binding));
                }
                Err(d) => errors.push(render_human(&d, &checked.sources, RenderOptions::default())),
            }
        }
        inputs.sort();
        inputs.dedup();
        if self.cargo_directives {
            for path in &inputs {
                println!("cargo:rerun-if-changed={}", path.display());
            }
            for line in warnings.iter().flat_map(|w| w.lines()) {
                println!("cargo:warning={line}");
            }
        }
        if !errors.is_empty() {
            return Err(Error::new(errors.concat()));
        }
        unique(&models)?;
        let bindings_path = dir.join(BINDINGS_FILE);
        let rust = bindings(models.iter().map(|(_, b)| b), self.out_dir.as_deref());
        outputs.push((bindings_path.clone(), rust.into_bytes()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::new(format!("cannot create `{}`: {e}", dir.display())))?;
        for (path, bytes) in &outputs {
            write_if_changed(path, bytes)
                .map_err(|e| Error::new(format!("cannot write `{}`: {e}", path.display())))?;
        }
        Ok(Built {
            models: models.into_iter().map(|(m, _)| m).collect(),
            inputs,
            warnings,
            bindings: bindings_path,
        })
    }

    fn output_dir(&self) -> Result<PathBuf, Error> {
        match &self.out_dir {
            Some(dir) => Ok(dir.clone()),
            None => std::env::var_os("OUT_DIR")
                .map(PathBuf::from)
                .ok_or_else(|| {
                    Error::new(
                        "OUT_DIR is not set: call mslc_build from a build script, or set \
                     Config::out_dir",
                    )
                }),
        }
    }

    /// Chooses, compiles and encodes the model of one checked file.
    fn build_one(
        &self,
        checked: &Checked,
        file: &Path,
        dir: &Path,
    ) -> Result<OneModel, Box<Diagnostic>> {
        let model = choose_model(checked, None)?;
        let options = compile_options(
            checked,
            model,
            Selection {
                target: self.target.as_deref(),
                fuse: true,
                ..Selection::default()
            },
        )?;
        let compiled = compile(model, &options).map_err(|e| e.diagnostic(checked))?;
        let mir_name = format!("{}.mir", model.name);
        let module = module_ident(file);
        let binding =
            ModelBinding::new(&compiled.module, &module, &mir_name, file).map_err(|message| {
                root_error(
                    checked,
                    Code::E0710,
                    message,
                    "build scripts bind f32, f16, bf16, f64, i32 and i64 inputs".to_string(),
                )
            })?;
        let files = artifact_files(dir, &model.name, &compiled, encode(&compiled.module, None));
        let built = BuiltModel {
            name: model.name.clone(),
            module,
            mir: dir.join(mir_name),
        };
        Ok(OneModel {
            files,
            built,
            binding,
        })
    }
}

/// The files `checked` read from disk (the embedded stdlib has none), absolute; the root
/// `file` always, so a missing one is watched until it appears.
fn files_read(checked: &Checked, file: &Path) -> Vec<PathBuf> {
    let mut paths = vec![absolute(file)];
    for i in 0..checked.sources.len() {
        let name = &checked.sources.get(FileId(i as u32)).name;
        let path = Path::new(name);
        if path.is_file() {
            paths.push(absolute(path));
        }
    }
    paths
}

fn absolute(path: &Path) -> PathBuf {
    std::fs::canonicalize(path)
        .or_else(|_| std::path::absolute(path))
        .unwrap_or_else(|_| path.to_path_buf())
}

/// Two files must not generate the same Rust module or the same `.mir`.
fn unique(models: &[(BuiltModel, ModelBinding)]) -> Result<(), Error> {
    let mut modules = BTreeMap::new();
    let mut names = BTreeMap::new();
    for (m, _) in models {
        if let Some(other) = modules.insert(&m.module, &m.name) {
            return Err(Error::new(format!(
                "models `{other}` and `{}` would both generate module `{}`: rename a file",
                m.name, m.module
            )));
        }
        if names.insert(&m.name, ()).is_some() {
            return Err(Error::new(format!(
                "two files declare model `{}`, and both would write `{}.mir`",
                m.name, m.name
            )));
        }
    }
    Ok(())
}
