//! Writing outputs only when their bytes change, so cargo does not rebuild what depends on
//! them needlessly.

use std::io;
use std::path::Path;

use mslc_io::atomic::write_atomic;

/// Writes `bytes` to `path` (atomically) unless the file already holds exactly them. Returns
/// whether it wrote.
pub fn write_if_changed(path: &Path, bytes: &[u8]) -> io::Result<bool> {
    if std::fs::read(path).is_ok_and(|old| old == bytes) {
        return Ok(false);
    }
    write_atomic(path, |tmp| std::fs::write(tmp, bytes))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrites_only_changed_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.txt");
        assert!(write_if_changed(&path, b"one").unwrap());
        assert!(!write_if_changed(&path, b"one").unwrap());
        assert!(write_if_changed(&path, b"two").unwrap());
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
    }
}
