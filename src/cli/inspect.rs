//! `mslc inspect FILE.mir`: the compiled module as text — values, the scheduled steps with their
//! kernels and arena (or hoisted-region) offsets, and the outputs.

use std::fmt::Write;
use std::path::PathBuf;

use mslc_artifact::write::{check_manifest, ManifestCheck};
use mslc_artifact::{decode, read_mir, Module, Storage};
use mslc_core::diag::{Code, Severity};
use mslc_core::units::human_bytes;
use mslc_kernels::binding::KernelParam;

use super::Reporter;

/// Arguments of `mslc inspect`.
#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    /// The `.mir` file.
    pub file: PathBuf,
}

/// Prints the module (in JSON mode, the module structure as one JSON object); 1 if the file
/// cannot be read.
pub fn run(args: &InspectArgs, reporter: &Reporter) -> u8 {
    let decoded = read_mir(&args.file).and_then(|bytes| {
        let decoded = decode(&bytes).map_err(|e| format!("{}: {e}", args.file.display()))?;
        let manifest = match check_manifest(&args.file, &decoded.module.name, &bytes) {
            ManifestCheck::Mismatch(m) => return Err(m),
            ManifestCheck::Verified(n) => format!("verified: one set of {n} files"),
            ManifestCheck::NotListed => "the manifest beside it does not list it".to_string(),
            ManifestCheck::Absent => "none beside it (the set is unverified)".to_string(),
        };
        let weights = decoded.weights.map(<[u8]>::len);
        Ok((decoded.module, weights, manifest))
    });
    match decoded {
        Ok((module, weights, manifest)) => {
            let json = serde_json::json!({
                "inspect": {
                    "module": module,
                    "embedded_weights_bytes": weights,
                    "manifest": manifest,
                }
            });
            let mut text = module_text(&module, weights);
            let first_line_end = text.find('\n').map_or(text.len(), |i| i + 1);
            text.insert_str(first_line_end, &format!("  manifest: {manifest}\n"));
            reporter.result(&text, json);
            0
        }
        Err(message) => {
            reporter.emit_plain(Code::E0602, Severity::Error, &message);
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
        "  arena {}, hoisted {}, {} steps, {:.3} GFLOP per forward",
        human_bytes(m.arena_bytes),
        human_bytes(m.hoisted_bytes),
        m.steps.len(),
        m.flops() as f64 / 1e9
    );
    if let Some(w) = embedded_weights {
        let _ = writeln!(
            s,
            "  embedded weights: {} (safetensors)",
            human_bytes(w as u64)
        );
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
            Storage::Arena { .. }
            | Storage::Hoisted { .. }
            | Storage::Next { .. }
            | Storage::Overwrite { .. } => {}
        }
    }
    for (i, step) in m.steps.iter().enumerate() {
        if let Some(g) = m.guard.filter(|g| g.from as usize == i) {
            let _ = writeln!(
                s,
                "  guard %{} == 0 (else the run ends here: the update below is skipped)",
                g.flag
            );
        }
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
                Storage::Next { .. } => "next".to_string(),
                Storage::Overwrite { ref name } => format!("over {name:?}"),
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
