//! `mslc check FILE...`: report every problem; with `--summary`, describe each model.

use std::fmt::Write;
use std::path::PathBuf;

use mslc_check::{check_path, Model};
use mslc_core::ops::fmt_dims;
use mslc_core::units::human_count;

use super::{param_groups, MessageFormat, ModelArgs, Reporter};

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

/// Checks every file; 1 if any has errors. On success a person also reads one line saying
/// what was checked (`checked 1 file: 1 model, 6.74 B parameters`); JSON output is unchanged.
pub fn run(args: &CheckArgs, reporter: &Reporter) -> u8 {
    let options = args.model.check_options();
    let mut failed = false;
    let (mut models, mut parameters) = (0usize, 0u128);
    for file in &args.files {
        let checked = check_path(file, &options);
        reporter.emit(&checked.diagnostics, &checked.sources);
        failed |= checked.has_errors();
        if !checked.has_errors() {
            for train in &checked.decls.trains {
                match mslc_driver::parallel::plan_train(&checked, train) {
                    Ok(Some(plan)) => {
                        let warnings = mslc_driver::parallel::plan_warnings(&checked, train, &plan);
                        reporter.emit(&warnings, &checked.sources);
                        failed |= warnings.iter().any(|d| d.is_error());
                    }
                    Ok(None) => {}
                    Err(d) => {
                        reporter.emit(&[*d], &checked.sources);
                        failed = true;
                    }
                }
            }
        }
        models += checked.models.len();
        parameters = checked
            .models
            .iter()
            .fold(parameters, |n, m| n.saturating_add(m.param_count()));
        if args.summary && !checked.has_errors() {
            for model in &checked.models {
                let text = summary(model);
                let json = serde_json::json!({ "summary": { "model": model.name, "text": text } });
                reporter.result(&text, json);
            }
        }
    }
    if !failed && reporter.format == MessageFormat::Human {
        super::output::print_stdout(&success_line(args.files.len(), models, parameters));
    }
    u8::from(failed)
}

/// `checked 2 files: 3 models, 6.74 B parameters`.
fn success_line(files: usize, models: usize, parameters: u128) -> String {
    let plural = |n: usize, w: &str| format!("{n} {w}{}", if n == 1 { "" } else { "s" });
    let parameters = match parameters {
        1 => ", 1 parameter".to_string(),
        n if models > 0 => format!(", {} parameters", human_count(n)),
        _ => String::new(),
    };
    format!(
        "checked {}: {}{parameters}\n",
        plural(files, "file"),
        plural(models, "model")
    )
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
    let items: Vec<(&str, (String, &str, bool))> = model
        .params
        .iter()
        .map(|p| {
            let ty = model.ty(p.value);
            (
                p.path.as_str(),
                (fmt_dims(&ty.shape), ty.dtype.name(), p.trainable),
            )
        })
        .collect();
    let rows = param_groups::group(&items);
    let width = rows.iter().map(|r| r.path.len()).max().unwrap_or(4).max(4);
    let _ = writeln!(s, "  parameters:");
    let _ = writeln!(
        s,
        "    {:<width$}  {:<16} {:<5} {:>15}",
        "path", "shape", "dtype", "count"
    );
    for row in &rows {
        let p = &model.params[row.first];
        let ty = model.ty(p.value);
        let times = if row.members > 1 {
            format!(" × {}", row.members)
        } else {
            String::new()
        };
        let kind = if p.trainable { "" } else { "  (buffer)" };
        let _ = writeln!(
            s,
            "    {:<width$}  {:<16} {:<5} {:>15}{times}{kind}",
            row.path,
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
