//! The kernel table: for every step, which kernel runs it and with which parameters (tile sizes,
//! thread split). These are the defaults for the host; a tuner replaces them with measured
//! winners. `NAME.kernels.toml` records them keyed by op signature and target fingerprint.

use std::collections::BTreeMap;
use std::fmt::Write;

use mslc_artifact::Module;
use mslc_kernels::binding::{KernelChoice, KernelParam};

/// The op signature a tuned kernel is keyed by: op, attributes and input types.
pub fn signature(module: &Module, step: usize) -> String {
    let s = &module.steps[step];
    let inputs: Vec<String> = s
        .inputs
        .iter()
        .map(|&v| module.values[v as usize].ty.to_string())
        .collect();
    let attrs: Vec<String> = s.attrs.iter().map(|(k, v)| format!("{k}={v}")).collect();
    if attrs.is_empty() {
        format!("{}({})", s.op, inputs.join(", "))
    } else {
        format!("{}({}) {{{}}}", s.op, inputs.join(", "), attrs.join(", "))
    }
}

/// The `NAME.kernels.toml` text: one table per distinct op signature, with the kernel, its
/// parameters and the steps that use it.
pub fn kernel_table_toml(module: &Module) -> String {
    let mut by_signature: BTreeMap<String, (KernelChoice, Vec<usize>)> = BTreeMap::new();
    for (i, step) in module.steps.iter().enumerate() {
        by_signature
            .entry(signature(module, i))
            .or_insert_with(|| (step.kernel.clone(), Vec::new()))
            .1
            .push(i);
    }
    let mut out =
        String::from("# mslc kernel table: the kernel and parameters chosen per op signature.\n");
    let _ = writeln!(out, "model = {}", toml_string(&module.name));
    let _ = writeln!(out, "target = {}", toml_string(&module.target));
    let _ = writeln!(
        out,
        "fingerprint = {}",
        toml_string(&module.target_fingerprint)
    );
    for (sig, (kernel, steps)) in &by_signature {
        let _ = writeln!(out, "\n[[kernel]]");
        let _ = writeln!(out, "signature = {}", toml_string(sig));
        let _ = writeln!(out, "name = {}", toml_string(&kernel.name));
        let steps: Vec<String> = steps.iter().map(usize::to_string).collect();
        let _ = writeln!(out, "steps = [{}]", steps.join(", "));
        let _ = writeln!(out, "tuned = false");
        if !kernel.params.is_empty() {
            let params: Vec<String> = kernel
                .params
                .iter()
                .map(|(k, v)| match v {
                    KernelParam::Int(i) => format!("{k} = {i}"),
                    KernelParam::Text(t) => format!("{k} = {}", toml_string(t)),
                })
                .collect();
            let _ = writeln!(out, "params = {{ {} }}", params.join(", "));
        }
    }
    out
}

fn toml_string(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}
