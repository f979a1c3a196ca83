//! Build script: records the git commit that `mslc --version` prints next to the version, or
//! `unknown` when there is no git or no repository (a source tarball). It never fails.

use std::process::Command;

fn main() {
    let commit = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=MSLC_COMMIT={commit}");
    println!("cargo:rerun-if-changed=build.rs");
    // Rerun when HEAD moves: a checkout (HEAD), a commit on the branch (its ref), or a gc (packed
    // refs). In a worktree these live in different git directories; git knows where.
    let branch = git(&["rev-parse", "--symbolic-full-name", "HEAD"]);
    for name in ["HEAD", "packed-refs"].into_iter().chain(branch.as_deref()) {
        if let Some(path) = git(&["rev-parse", "--git-path", name]) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
}

/// The trimmed output of a successful `git ARGS`, if any.
fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(output.stdout).ok()?;
    let text = text.trim();
    (output.status.success() && !text.is_empty()).then(|| text.to_string())
}
