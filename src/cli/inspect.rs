//! `mslc inspect FILE.mir`: the compiled module as text — values, the scheduled steps with their
//! kernels and arena (or hoisted-region) offsets, and the outputs.

use std::fmt::Write;
use std::path::PathBuf;

use mslc_artifact::{decode, Module, Storage};
use mslc_kernels::binding::KernelParam;

use super::output::print_stdout;

/// Arguments of `mslc inspect`.
#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    /// The `.mir` file.
    pub file: PathBuf,
}

/// Prints the module; 1 if the file cannot be read.
pub fn run(args: &InspectArgs) -> u8 {
    let bytes = match std::fs::read(&args.file) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error[E0602]: cannot read {}: {e}", args.file.display());
            return 1;
        }
    };
    match decode(&bytes) {
        Ok(decoded) => {
            print_stdout(&module_text(
                &decoded.module,
                decoded.weights.map(<[u8]>::len),
            ));
            0
        }
        Err(e) => {
            eprintln!("error[E0602]: {}: {e}", args.file.display());
            1
        }
    }
}

/// The text form of a module.
pub fn module_text(m: &Module, embedded_weights: Option<usize>) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "module {} for {} ({})",
        m.name, m.target, m.target_fingerprint
    );
    let _ = writeln!(
        s,
        "  arena {} bytes, hoisted {} bytes, {} steps, {:.3} GFLOP per forward",
        m.arena_bytes,
        m.hoisted_bytes,
        m.steps.len(),
        m.flops() as f64 / 1e9
    );
    if let Some(w) = embedded_weights {
        let _ = writeln!(s, "  embedded weights: {w} bytes (safetensors)");
    }
    for (i, v) in m.values.iter().enumerate() {
        match &v.storage {
            Storage::Input { name } => {
                let _ = writeln!(s, "  %{i} = input {name:?} : {}", v.ty);
            }
            Storage::Param {
                path, trainable, ..
            } => {
                let kw = if *trainable { "param" } else { "buffer" };
                let _ = writeln!(s, "  %{i} = {kw} {path:?} : {}", v.ty);
            }
            Storage::Arena { .. } | Storage::Hoisted { .. } => {}
        }
    }
    for step in &m.steps {
        let outs: Vec<String> = step.outputs.iter().map(|o| format!("%{o}")).collect();
        let ins: Vec<String> = step.inputs.iter().map(|i| format!("%{i}")).collect();
        let types: Vec<String> = step
            .outputs
            .iter()
            .map(|&o| m.values[o as usize].ty.to_string())
            .collect();
        let offsets: Vec<String> = step
            .outputs
            .iter()
            .map(|&o| match m.values[o as usize].storage {
                Storage::Arena { offset } => format!("@{offset}"),
                Storage::Hoisted { offset } => format!("hoisted@{offset}"),
                _ => String::new(),
            })
            .collect();
        let _ = write!(s, "  {} = {}({})", outs.join(", "), step.op, ins.join(", "));
        if !step.attrs.is_empty() {
            let attrs: Vec<String> = step.attrs.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let _ = write!(s, " {{{}}}", attrs.join(", "));
        }
        let params: Vec<String> = step
            .kernel
            .params
            .iter()
            .map(|(k, v)| match v {
                KernelParam::Int(i) => format!("{k}={i}"),
                KernelParam::Text(t) => format!("{k}={t}"),
            })
            .collect();
        let _ = write!(
            s,
            " : {} {} [{} {}]",
            types.join(", "),
            offsets.join(","),
            step.kernel.name,
            params.join(" ")
        );
        if !step.origin.is_empty() {
            let _ = write!(s, "  # {}", step.origin);
        }
        s.push('\n');
    }
    for (name, v) in &m.outputs {
        let _ = writeln!(s, "  output {name} = %{v}");
    }
    s
}
