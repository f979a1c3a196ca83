//! `mslc check FILE...`: report every problem; with `--summary`, describe each model.

use std::fmt::Write;
use std::path::PathBuf;

use mslc_check::{check_path, Model};
use mslc_core::ops::fmt_dims;

use super::{ModelArgs, Reporter};

/// Arguments of `mslc check`.
#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    /// Files to check.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Print each model's inputs, outputs and parameter table.
    #[arg(long)]
    pub summary: bool,
    #[command(flatten)]
    pub model: ModelArgs,
}

/// Checks every file; 1 if any has errors.
pub fn run(args: &CheckArgs, reporter: &Reporter) -> u8 {
    let options = args.model.check_options();
    let mut failed = false;
    for file in &args.files {
        let checked = check_path(file, &options);
        reporter.emit(&checked.diagnostics, &checked.sources);
        failed |= checked.has_errors();
        if args.summary && !checked.has_errors() {
            for model in &checked.models {
                let text = summary(model);
                let json = serde_json::json!({ "summary": { "model": model.name, "text": text } });
                reporter.result(&text, json);
            }
        }
    }
    u8::from(failed)
}

/// `1234567` → `1,234,567`; `u128::MAX`, where exact counts saturate, → `more than 10^38`.
pub fn group_thousands(n: impl Into<u128>) -> String {
    let n = n.into();
    if n == u128::MAX {
        return "more than 10^38".to_string();
    }
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The `--summary` text of one model.
pub fn summary(model: &Model) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "model {}", model.name);
    if !model.consts.is_empty() {
        let consts: Vec<String> = model
            .consts
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let _ = writeln!(s, "  consts: {}", consts.join(" "));
    }
    if !model.dims.is_empty() {
        let dims: Vec<String> = model.dims.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = writeln!(s, "  dims:   {}", dims.join(" "));
    }
    let _ = writeln!(s, "  inputs:");
    for i in &model.inputs {
        let _ = writeln!(s, "    {:<24} {}", i.name, model.ty(i.value));
    }
    let _ = writeln!(s, "  outputs:");
    for o in &model.outputs {
        let _ = writeln!(s, "    {:<24} {}", o.name, model.ty(o.value));
    }
    let width = model
        .params
        .iter()
        .map(|p| p.path.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let _ = writeln!(s, "  parameters:");
    let _ = writeln!(
        s,
        "    {:<width$}  {:<16} {:<5} {:>15}",
        "path", "shape", "dtype", "count"
    );
    for p in &model.params {
        let ty = model.ty(p.value);
        let kind = if p.trainable { "" } else { "  (buffer)" };
        let _ = writeln!(
            s,
            "    {:<width$}  {:<16} {:<5} {:>15}{kind}",
            p.path,
            fmt_dims(&ty.shape),
            ty.dtype.name(),
            group_thousands(ty.wide_numel())
        );
    }
    let _ = writeln!(
        s,
        "  total parameters: {} ({} bytes)",
        group_thousands(model.param_count()),
        group_thousands(model.param_bytes())
    );
    if model.buffer_count() > 0 {
        let _ = writeln!(
            s,
            "  total buffers:    {}",
            group_thousands(model.buffer_count())
        );
    }
    s
}
