//! Writing a build's files all or nothing: every file goes to a temporary next to its target,
//! and only when all of them are written are they renamed into place. A failure leaves neither
//! half-written files nor a mix of old and new artifacts behind.

use std::path::{Path, PathBuf};

use mslc_io::atomic::temp_path;

/// Writes every `(path, bytes)`; on error removes what it wrote and returns the failing path.
pub fn write_all_or_nothing(files: &[(PathBuf, Vec<u8>)]) -> Result<(), (PathBuf, std::io::Error)> {
    let mut staged: Vec<(PathBuf, &Path)> = Vec::new();
    let cleanup = |staged: &[(PathBuf, &Path)]| {
        for (tmp, _) in staged {
            let _ = std::fs::remove_file(tmp);
        }
    };
    for (path, bytes) in files {
        let result = temp_path(path).and_then(|tmp| {
            staged.push((tmp.clone(), path.as_path()));
            std::fs::write(&tmp, bytes)?;
            std::fs::File::open(&tmp)?.sync_all()
        });
        if let Err(e) = result {
            cleanup(&staged);
            return Err((path.clone(), e));
        }
    }
    for (i, (tmp, path)) in staged.iter().enumerate() {
        if let Err(e) = std::fs::rename(tmp, path) {
            cleanup(&staged[i..]);
            return Err((path.to_path_buf(), e));
        }
    }
    Ok(())
}
