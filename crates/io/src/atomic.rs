//! Writing a file so that readers see either its old content or the complete new one, never a
//! half-written file.

use std::fs::{self, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::process;
use std::sync::atomic::{AtomicU64, Ordering};

/// Replaces `path` with a file that `write` creates at the temporary path it is given (in the
/// same directory, so the final rename cannot cross file systems). The temporary is flushed to
/// disk and renamed over `path` only when `write` succeeds; otherwise it is removed and `path`
/// is left as it was.
///
/// An existing `path` that is not a regular file — a device such as `/dev/null`, a FIFO, a
/// socket — is never replaced: `write` writes into it directly (there is nothing to keep atomic
/// about a stream).
pub fn write_atomic<E: From<io::Error>>(
    path: &Path,
    write: impl FnOnce(&Path) -> Result<(), E>,
) -> Result<(), E> {
    if is_special(path) {
        return write(path);
    }
    let tmp = temp_path(path)?;
    let result = write(&tmp).and_then(|()| {
        OpenOptions::new().write(true).open(&tmp)?.sync_all()?;
        fs::rename(&tmp, path)?;
        Ok(())
    });
    if result.is_err() {
        // Best effort: the write may have failed before creating the file, and the error that
        // matters is the one being returned.
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Whether `path` (after following symlinks) exists and is neither a regular file nor a
/// directory: a device, a FIFO or a socket, which must be written into, never renamed over.
pub fn is_special(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|m| !m.is_file() && !m.is_dir())
}

/// `.NAME.PID.N.tmp` next to `path`, unique within this process and across processes.
pub fn temp_path(path: &Path) -> io::Result<PathBuf> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} does not name a file", path.display()),
        )
    })?;
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut tmp = std::ffi::OsString::from(".");
    tmp.push(name);
    tmp.push(format!(".{}.{n}.tmp", process::id()));
    Ok(path.with_file_name(tmp))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_dir::TestDir;

    #[test]
    fn success_replaces_the_file_and_leaves_no_temporary() {
        let dir = TestDir::new();
        let path = dir.path().join("out.bin");
        fs::write(&path, b"old").unwrap();
        write_atomic(&path, |tmp| fs::write(tmp, b"new")).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"new");
        assert_eq!(dir.file_names(), vec!["out.bin"]);
    }

    #[test]
    fn failure_keeps_the_old_file_and_leaves_no_temporary() {
        let dir = TestDir::new();
        let path = dir.path().join("out.bin");
        fs::write(&path, b"old").unwrap();
        let err = write_atomic(&path, |tmp| {
            fs::write(tmp, b"half")?;
            Err(io::Error::other("disk on fire"))
        })
        .unwrap_err();
        assert_eq!(err.to_string(), "disk on fire");
        assert_eq!(fs::read(&path).unwrap(), b"old");
        assert_eq!(dir.file_names(), vec!["out.bin"]);
    }

    #[test]
    fn devices_are_written_into_never_replaced() {
        let null = Path::new("/dev/null");
        if !null.exists() {
            return;
        }
        let before = fs::symlink_metadata(null).unwrap();
        write_atomic(null, |p| fs::write(p, b"x")).unwrap();
        let after = fs::symlink_metadata(null).unwrap();
        assert!(is_special(null));
        assert!(!after.is_file());
        use std::os::unix::fs::MetadataExt;
        assert_eq!(before.ino(), after.ino(), "/dev/null was replaced");
    }

    #[test]
    fn paths_without_a_file_name_are_rejected() {
        let err = write_atomic(Path::new("/"), |tmp| fs::write(tmp, b"x")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }
}
