//! `mslc fmt [--check] FILE…`: rewrites files in their canonical layout, or with `--check`
//! changes nothing and prints a unified diff for each file that is not formatted.

use std::fs;
use std::path::{Path, PathBuf};

use mslc_check::read_source;
use mslc_core::diag::{Code, Severity, Sources};
use mslc_syntax::format::format_source;

use super::output::print_stdout;
use super::Reporter;

/// Arguments of `mslc fmt`.
#[derive(clap::Args, Debug)]
pub struct FmtArgs {
    /// Files to format.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Write nothing: print a diff for each file that is not formatted, and exit 1 if any is not.
    #[arg(long)]
    pub check: bool,
}

/// Formats (or checks) every file; 1 if any has syntax errors, cannot be written, or (with
/// `--check`) is not formatted.
pub fn run(args: &FmtArgs, reporter: &Reporter) -> u8 {
    let mut failed = false;
    for path in &args.files {
        failed |= !format_file(path, args.check, reporter);
    }
    u8::from(failed)
}

/// Formats one file; `false` when it failed or, with `check`, is not formatted.
fn format_file(path: &Path, check: bool, reporter: &Reporter) -> bool {
    let not_in_place = |why: String| {
        let message = format!("cannot format `{}` in place: {why}", path.display());
        reporter.emit_plain(Code::E0700, Severity::Error, &message);
        false
    };
    // Only regular files (a link is followed): a named pipe would block the read, and the rename
    // would replace a device or a directory with a plain file.
    let metadata = match fs::metadata(path) {
        Ok(m) if !m.is_file() => return not_in_place("it is not a regular file".to_string()),
        Ok(m) => Some(m),
        Err(_) => None, // read_source reports it, coded
    };
    let mut sources = Sources::new();
    let (file, text) = match read_source(path, &mut sources) {
        Ok(read) => read,
        Err(diagnostic) => {
            reporter.emit(&[*diagnostic], &sources);
            return false;
        }
    };
    let formatted = match format_source(file, &text) {
        Ok(formatted) => formatted,
        Err(diagnostics) => {
            reporter.emit(&diagnostics, &sources);
            return false;
        }
    };
    if formatted == text {
        return true;
    }
    if check {
        let name = path.display().to_string();
        let diff = similar::TextDiff::from_lines(text.as_str(), formatted.as_str())
            .unified_diff()
            .header(&name, &name)
            .to_string();
        print_stdout(&diff);
        return false;
    }
    // Through a link to its file; the file keeps its permissions.
    let written = fs::canonicalize(path).and_then(|target| {
        mslc_io::atomic::write_atomic(&target, |tmp| fs::write(tmp, &formatted))?;
        match &metadata {
            Some(m) => fs::set_permissions(&target, m.permissions()),
            None => Ok(()),
        }
    });
    match written {
        Ok(()) => true,
        Err(e) => not_in_place(e.to_string()),
    }
}
