//! Printing diagnostics in the format and colour the user chose.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use mslc_core::diag::{Code, Diagnostic, Severity, Sources};
use mslc_driver::numerics::NumericsReport;
use mslc_driver::render::{
    render_human, render_json, render_plain_human, render_plain_json, Plain, RenderOptions,
};

use super::MessageFormat;

/// Where and how diagnostics are printed, and the exit status they add up to.
#[derive(Debug)]
pub struct Reporter {
    /// Human or JSON.
    pub format: MessageFormat,
    /// ANSI colours in human output.
    pub color: bool,
    /// The highest exit status of the codes reported so far ([`Code::exit_class`]).
    status: AtomicU8,
    /// Counts but prints nothing: the ranks but 0 of an MPI world, which rank 0 speaks for.
    muted: AtomicBool,
}

impl Reporter {
    /// A reporter that has reported nothing.
    pub fn new(format: MessageFormat, color: bool) -> Reporter {
        Reporter {
            format,
            color,
            status: AtomicU8::new(0),
            muted: AtomicBool::new(false),
        }
    }

    /// Stops (or resumes) printing; the exit status still counts every code reported.
    pub fn mute(&self, muted: bool) {
        self.muted.store(muted, Ordering::Relaxed);
    }

    /// The exit status the reported codes call for: the highest of their classes' (README,
    /// "Exit status"), so that a usage error exits 2 whichever command found it.
    pub fn status(&self) -> u8 {
        self.status.load(Ordering::Relaxed)
    }

    fn count(&self, code: Code) {
        self.status
            .fetch_max(code.exit_class().status(), Ordering::Relaxed);
    }

    /// Prints every diagnostic to stderr (JSON lines go to stdout, for tools).
    pub fn emit(&self, diags: &[Diagnostic], sources: &Sources) {
        if self.muted.load(Ordering::Relaxed) {
            diags.iter().for_each(|d| self.count(d.code));
            return;
        }
        for d in diags {
            self.count(d.code);
            match self.format {
                MessageFormat::Human => eprint!("{}", render_human(d, sources, self.options())),
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
    /// executor), with its code, through the same renderer and JSON schema as [`Reporter::emit`].
    pub fn emit_plain(&self, code: Code, severity: Severity, message: &str) {
        self.emit_plain_with_help(code, severity, message, None);
    }

    /// A `--check-numerics` fault (E0614): at the op's source when the module knows where it was
    /// written and the sources are at hand, else as a plain message with the same help.
    pub fn emit_numerics(&self, report: &NumericsReport, sources: Option<&Sources>) {
        match (report.diagnostic(), sources) {
            (Some(d), Some(sources)) => self.emit(&[d], sources),
            _ => self.emit_plain_with_help(
                Code::E0614,
                Severity::Error,
                &report.message,
                Some(&report.help),
            ),
        }
    }

    /// [`Reporter::emit_plain`] with a help line.
    pub fn emit_plain_with_help(
        &self,
        code: Code,
        severity: Severity,
        message: &str,
        help: Option<&str>,
    ) {
        self.count(code);
        if self.muted.load(Ordering::Relaxed) {
            return;
        }
        let plain = Plain {
            code,
            severity,
            message,
            help,
        };
        match self.format {
            MessageFormat::Human => eprint!("{}", render_plain_human(&plain, self.options())),
            MessageFormat::Json => print_stdout(&format!("{}\n", render_plain_json(&plain))),
        }
    }

    fn options(&self) -> RenderOptions {
        RenderOptions {
            color: self.color,
            width: 100,
        }
    }
}

/// How a command that runs a module (`run`, `train`) failed: diagnostics already printed, a
/// misuse of the flags (exit 2), or one coded message to print.
pub enum Failure {
    /// Already reported.
    Reported,
    /// A bad flag or flag value (E0609).
    Usage(String),
    /// One coded message.
    Message(Code, String),
}

impl From<String> for Failure {
    /// A failure while running the module.
    fn from(m: String) -> Self {
        Failure::Message(Code::E0603, m)
    }
}

impl Reporter {
    /// Prints a command's result or its failure; the exit status (0, 1 for errors in the
    /// input, 2 for misused flags).
    pub fn finish(&self, outcome: Result<(String, serde_json::Value), Failure>) -> u8 {
        match outcome {
            Ok((text, json)) => {
                self.result(&text, json);
                0
            }
            Err(Failure::Reported) => 1,
            Err(Failure::Usage(m)) => {
                self.emit_plain(Code::E0609, Severity::Error, &m);
                2
            }
            Err(Failure::Message(code, m)) => {
                self.emit_plain(code, Severity::Error, &m);
                1
            }
        }
    }

    /// Prints a command's result: `text` as it is in human mode, one JSON object in JSON mode
    /// (so that stdout carries nothing but JSON lines there).
    pub fn result(&self, text: &str, json: serde_json::Value) {
        if self.muted.load(Ordering::Relaxed) {
            return;
        }
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
