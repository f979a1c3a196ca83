//! Printing diagnostics in the format and colour the user chose.

use mslc_core::diag::{Code, Diagnostic, Severity, Sources};
use mslc_driver::render::{render_human, render_json, RenderOptions};

use super::MessageFormat;

/// Where and how diagnostics are printed.
#[derive(Clone, Copy, Debug)]
pub struct Reporter {
    /// Human or JSON.
    pub format: MessageFormat,
    /// ANSI colours in human output.
    pub color: bool,
}

impl Reporter {
    /// Prints every diagnostic to stderr (JSON lines go to stdout, for tools).
    pub fn emit(&self, diags: &[Diagnostic], sources: &Sources) {
        for d in diags {
            match self.format {
                MessageFormat::Human => {
                    let options = RenderOptions {
                        color: self.color,
                        width: 100,
                    };
                    eprint!("{}", render_human(d, sources, options));
                }
                MessageFormat::Json => print_stdout(&format!("{}\n", render_json(d, sources))),
            }
        }
        if self.format == MessageFormat::Human {
            let errors = diags.iter().filter(|d| d.is_error()).count();
            let warnings = diags.len() - errors;
            if errors > 0 || warnings > 0 {
                eprintln!("{}", summary_line(errors, warnings));
            }
        }
    }
}

impl Reporter {
    /// Prints a problem that has no place in a source file (a weights file, an input, the
    /// executor), with its code: `error[E0602]: …` or one JSON object.
    pub fn emit_plain(&self, code: Code, severity: Severity, message: &str) {
        match self.format {
            MessageFormat::Human => {
                let word = if severity == Severity::Error {
                    "error"
                } else {
                    "warning"
                };
                eprintln!("{word}[{code}]: {message}");
            }
            MessageFormat::Json => {
                let json = serde_json::json!({ "code": code.as_str(), "severity": severity, "message": message, "file": null });
                print_stdout(&format!("{json}\n"));
            }
        }
    }
}

impl Reporter {
    /// Prints a command's result: `text` as it is in human mode, one JSON object in JSON mode
    /// (so that stdout carries nothing but JSON lines there).
    pub fn result(&self, text: &str, json: serde_json::Value) {
        match self.format {
            MessageFormat::Human => print_stdout(text),
            MessageFormat::Json => print_stdout(&format!("{json}\n")),
        }
    }
}

/// Writes to stdout, ignoring a closed pipe (`mslc check --summary … | head`).
pub fn print_stdout(text: &str) {
    use std::io::Write;
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

fn summary_line(errors: usize, warnings: usize) -> String {
    let plural = |n: usize, w: &str| format!("{n} {w}{}", if n == 1 { "" } else { "s" });
    match (errors, warnings) {
        (0, w) => plural(w, "warning"),
        (e, 0) => plural(e, "error"),
        (e, w) => format!("{}, {}", plural(e, "error"), plural(w, "warning")),
    }
}
