//! A scratch directory for file tests, removed when dropped.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A fresh, empty directory under the system temporary directory.
pub(crate) struct TestDir(PathBuf);

impl TestDir {
    /// Creates the directory.
    pub(crate) fn new() -> Self {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("mslc-io-{}-{n}", std::process::id()));
        fs::create_dir_all(&path).unwrap();
        TestDir(path)
    }

    /// Where the directory is.
    pub(crate) fn path(&self) -> &Path {
        &self.0
    }

    /// Names of the files in the directory, sorted.
    pub(crate) fn file_names(&self) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(&self.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}
