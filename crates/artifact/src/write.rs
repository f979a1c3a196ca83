//! Writing a set of files all or nothing: every file goes to a temporary next to its target,
//! and only when all of them are written are they renamed into place. A failure while writing
//! leaves neither half-written files nor a mix of old and new files behind; a failure while
//! renaming (rare: the temporaries are already complete) is reported with what was replaced.
//!
//! A build's artifacts are also a *set*: [`write_build_set`] locks the output directory against
//! a concurrent build, cleans temporaries a killed build left behind, and seals the set with a
//! manifest of content hashes that readers check (`docs/mir-format.md`).

use std::fmt;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use mslc_io::atomic::{is_special, temp_path};

/// Why writing a set of files failed.
#[derive(Debug)]
pub struct WriteError {
    /// The file that could not be written.
    pub path: PathBuf,
    /// What went wrong with it.
    pub error: io::Error,
    /// Files already replaced by their new contents before the failure (empty when nothing
    /// was changed).
    pub replaced: Vec<PathBuf>,
}

impl fmt::Display for WriteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot write `{}`: {}", self.path.display(), self.error)?;
        if self.replaced.is_empty() {
            write!(f, "; nothing was written")
        } else {
            let names: Vec<String> = self
                .replaced
                .iter()
                .map(|p| format!("`{}`", p.display()))
                .collect();
            write!(
                f,
                "; {} already hold the new contents, the other files the old ones",
                names.join(", ")
            )
        }
    }
}

/// Writes every `(path, bytes)`; on error removes its temporaries and says what it changed.
/// Targets that exist and are not regular files (devices, FIFOs) are written into directly,
/// after the regular files are in place, never renamed over.
pub fn write_all_or_nothing(files: &[(PathBuf, Vec<u8>)]) -> Result<(), WriteError> {
    let parts: Vec<(PathBuf, Vec<&[u8]>)> = (files.iter())
        .map(|(path, bytes)| (path.clone(), vec![bytes.as_slice()]))
        .collect();
    write_parts_all_or_nothing(&parts)
}

/// [`write_all_or_nothing`] of files given as parts written one after the other (a header and
/// data borrowed where it lies), so that no file's whole contents need be copied first.
pub fn write_parts_all_or_nothing(files: &[(PathBuf, Vec<&[u8]>)]) -> Result<(), WriteError> {
    let write_parts = |path: &Path, parts: &[&[u8]]| -> io::Result<File> {
        let mut file = File::create(path)?;
        parts.iter().try_for_each(|part| file.write_all(part))?;
        Ok(file)
    };
    let (special, regular): (Vec<_>, Vec<_>) = files.iter().partition(|(p, _)| is_special(p));
    let mut staged: Vec<(PathBuf, &Path)> = Vec::new();
    let cleanup = |staged: &[(PathBuf, &Path)]| {
        for (tmp, _) in staged {
            let _ = fs::remove_file(tmp);
        }
    };
    for (path, bytes) in &regular {
        let result = temp_path(path).and_then(|tmp| {
            staged.push((tmp.clone(), path.as_path()));
            write_parts(&tmp, bytes)?.sync_all()
        });
        if let Err(error) = result {
            cleanup(&staged);
            return Err(WriteError {
                path: path.clone(),
                error,
                replaced: Vec::new(),
            });
        }
    }
    let mut replaced = Vec::new();
    for (i, (tmp, path)) in staged.iter().enumerate() {
        if let Err(error) = fs::rename(tmp, path) {
            cleanup(&staged[i..]);
            return Err(WriteError {
                path: path.to_path_buf(),
                error,
                replaced,
            });
        }
        replaced.push(path.to_path_buf());
    }
    for (path, bytes) in special {
        if let Err(error) = write_parts(path, bytes) {
            return Err(WriteError {
                path: path.clone(),
                error,
                replaced,
            });
        }
        replaced.push(path.clone());
    }
    Ok(())
}

/// The advisory lock file `mslc build` holds in its output directory while writing.
pub const LOCK_FILE: &str = ".mslc-build.lock";

/// `NAME.manifest.json`: the files of one build and their SHA-256, written last.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Model name.
    pub model: String,
    /// Every artifact of the set but the manifest, by file name.
    pub files: Vec<ManifestEntry>,
}

/// One artifact in a [`Manifest`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ManifestEntry {
    /// File name in the output directory.
    pub name: String,
    /// Size in bytes.
    pub bytes: u64,
    /// SHA-256 of the contents, lowercase hex.
    pub sha256: String,
}

/// Lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The manifest's path for model `model` in `dir`.
pub fn manifest_path(dir: &Path, model: &str) -> PathBuf {
    dir.join(format!("{model}.manifest.json"))
}

/// Why a build's artifacts could not be written.
#[derive(Debug)]
pub enum SetError {
    /// The output path exists and is not a directory.
    NotADirectory(PathBuf),
    /// Another build holds the directory's lock.
    Locked(PathBuf),
    /// Creating the directory, taking the lock or writing failed.
    Io(WriteError),
}

impl fmt::Display for SetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SetError::NotADirectory(dir) => write!(
                f,
                "`{}` exists and is not a directory, so the artifacts cannot go there; nothing was written",
                dir.display()
            ),
            SetError::Locked(dir) => write!(
                f,
                "another `mslc build` is writing into `{}` (it holds `{LOCK_FILE}` there); nothing was written",
                dir.display()
            ),
            SetError::Io(e) => e.fmt(f),
        }
    }
}

/// Writes the artifacts of model `model` (`(file name, bytes)`) into `dir` as one set: under an
/// exclusive advisory lock on `dir/.mslc-build.lock` (a concurrent build fails with
/// [`SetError::Locked`] instead of mixing its files in), after removing temporaries that a
/// killed build of these files left, with the old manifest removed first and the new one
/// (`NAME.manifest.json`, the hashes of the others) written last. A reader that finds a
/// manifest can therefore trust that the files it lists belong together; without one the set
/// is incomplete or was written by an older mslc. Files named in `editable` (the kernel table,
/// which people and tuners edit and every reader checks) are written with the set but left out
/// of the manifest, so editing them does not make the set look mixed.
pub fn write_build_set(
    dir: &Path,
    model: &str,
    files: &[(String, Vec<u8>)],
    editable: &[&str],
) -> Result<(), SetError> {
    let io_error = |path: &Path, error: io::Error| {
        SetError::Io(WriteError {
            path: path.to_path_buf(),
            error,
            replaced: Vec::new(),
        })
    };
    if dir.exists() && !dir.is_dir() {
        return Err(SetError::NotADirectory(dir.to_path_buf()));
    }
    fs::create_dir_all(dir).map_err(|e| io_error(dir, e))?;
    let lock_path = dir.join(LOCK_FILE);
    let lock = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| io_error(&lock_path, e))?;
    match lock.try_lock() {
        Ok(()) => {}
        Err(fs::TryLockError::WouldBlock) => return Err(SetError::Locked(dir.to_path_buf())),
        Err(fs::TryLockError::Error(e)) => return Err(io_error(&lock_path, e)),
    }
    let manifest_path = manifest_path(dir, model);
    let mut names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    let manifest_name = format!("{model}.manifest.json");
    names.push(&manifest_name);
    remove_stale_temporaries(dir, &names);
    match fs::remove_file(&manifest_path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_error(&manifest_path, e)),
    }
    let manifest = Manifest {
        model: model.to_string(),
        files: files
            .iter()
            .filter(|(name, _)| !editable.contains(&name.as_str()))
            .map(|(name, bytes)| ManifestEntry {
                name: name.clone(),
                bytes: bytes.len() as u64,
                sha256: sha256_hex(bytes),
            })
            .collect(),
    };
    let paths: Vec<(PathBuf, Vec<u8>)> = files
        .iter()
        .map(|(name, bytes)| (dir.join(name), bytes.clone()))
        .collect();
    write_all_or_nothing(&paths).map_err(SetError::Io)?;
    let mut text = serde_json::to_string_pretty(&manifest).unwrap_or_default();
    text.push('\n');
    write_all_or_nothing(&[(manifest_path, text.into_bytes())]).map_err(|mut e| {
        e.replaced = paths.into_iter().map(|(p, _)| p).collect();
        SetError::Io(e)
    })?;
    drop(lock);
    Ok(())
}

/// Removes `.NAME.*.tmp` files in `dir` for each of `names`: temporaries of the write that a
/// killed process left. Called under the directory's lock, when no other build is writing.
fn remove_stale_temporaries(dir: &Path, names: &[&str]) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(file_name) = file_name.to_str() else {
            continue;
        };
        let stale = names.iter().any(|name| {
            file_name
                .strip_prefix('.')
                .and_then(|rest| rest.strip_prefix(name))
                .and_then(|rest| rest.strip_suffix(".tmp"))
                .is_some_and(|middle| {
                    // `.PID.N` exactly, as `temp_path` writes it.
                    let mut parts = middle.split('.');
                    parts.next() == Some("")
                        && parts.clone().count() == 2
                        && parts.all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
                })
        });
        if stale && entry.file_type().is_ok_and(|t| t.is_file()) {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// What the manifest beside a `.mir` says about it.
#[derive(Clone, Debug, PartialEq)]
pub enum ManifestCheck {
    /// No manifest for the module's model beside the file (an interrupted or older build, or
    /// a file copied on its own).
    Absent,
    /// The manifest lists the file with these contents, and every other file it lists is
    /// there with its contents; the set has this many files.
    Verified(usize),
    /// The manifest does not list the file under its name (a renamed copy).
    NotListed,
    /// The manifest lists the file, or another of the set, with other contents (or the other
    /// is missing): the directory holds a mixed set.
    Mismatch(String),
}

/// Checks `bytes`, read from `mir` and holding model `model`, and the other files of its set
/// against the manifest beside it.
pub fn check_manifest(mir: &Path, model: &str, bytes: &[u8]) -> ManifestCheck {
    let dir = mir.parent().unwrap_or(Path::new("."));
    let path = manifest_path(dir, model);
    let Ok(text) = fs::read_to_string(&path) else {
        return ManifestCheck::Absent;
    };
    let manifest: Manifest = match serde_json::from_str(&text) {
        Ok(m) => m,
        Err(e) => {
            return ManifestCheck::Mismatch(format!("`{}` is malformed: {e}", path.display()))
        }
    };
    let name = mir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !manifest.files.iter().any(|f| f.name == name) {
        return ManifestCheck::NotListed;
    }
    for entry in &manifest.files {
        let matches = if entry.name == name {
            entry.sha256 == sha256_hex(bytes)
        } else {
            // Only plain file names: a manifest is no more trusted than the files it lists.
            Path::new(&entry.name).file_name() == Some(entry.name.as_ref())
                && fs::read(dir.join(&entry.name)).is_ok_and(|b| entry.sha256 == sha256_hex(&b))
        };
        if !matches {
            return ManifestCheck::Mismatch(format!(
                "`{}` lists other contents for `{}`: the directory holds files of different builds; rebuild",
                path.display(),
                entry.name
            ));
        }
    }
    ManifestCheck::Verified(manifest.files.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(a: &str) -> Vec<(String, Vec<u8>)> {
        vec![
            ("M.mir".to_string(), a.as_bytes().to_vec()),
            ("M.report.json".to_string(), b"{}".to_vec()),
        ]
    }

    #[test]
    fn a_set_is_sealed_by_a_manifest_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let stale = dir.path().join(".M.mir.4242.0.tmp");
        let foreign = dir.path().join(".other.4242.0.tmp");
        fs::write(&stale, b"half").unwrap();
        fs::write(&foreign, b"not ours").unwrap();
        write_build_set(dir.path(), "M", &set("one"), &[]).unwrap();
        assert!(!stale.exists(), "stale temporaries are removed");
        assert!(foreign.exists(), "other files are left alone");
        let mir = dir.path().join("M.mir");
        assert_eq!(
            check_manifest(&mir, "M", b"one"),
            ManifestCheck::Verified(2)
        );
        assert!(matches!(
            check_manifest(&mir, "M", b"two"),
            ManifestCheck::Mismatch(_)
        ));
        assert_eq!(
            check_manifest(&dir.path().join("copy.mir"), "M", b"one"),
            ManifestCheck::NotListed
        );
        assert_eq!(check_manifest(&mir, "N", b"one"), ManifestCheck::Absent);
        fs::write(dir.path().join("M.report.json"), b"{\"other\": 1}").unwrap();
        assert!(matches!(
            check_manifest(&mir, "M", b"one"),
            ManifestCheck::Mismatch(m) if m.contains("M.report.json")
        ));
    }

    #[test]
    fn a_locked_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let lock = File::create(dir.path().join(LOCK_FILE)).unwrap();
        lock.lock().unwrap();
        let err = write_build_set(dir.path(), "M", &set("one"), &[]).unwrap_err();
        assert!(matches!(err, SetError::Locked(_)), "{err}");
        assert!(!dir.path().join("M.mir").exists());
        drop(lock);
        write_build_set(dir.path(), "M", &set("one"), &[]).unwrap();
    }

    #[test]
    fn a_file_as_directory_is_named_as_such() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        fs::write(&file, b"x").unwrap();
        let err = write_build_set(&file, "M", &set("one"), &[]).unwrap_err();
        assert!(err.to_string().contains("is not a directory"), "{err}");
    }

    #[test]
    fn a_failed_rename_says_what_was_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("b");
        fs::create_dir(&blocker).unwrap();
        fs::write(blocker.join("inside"), b"x").unwrap();
        let files = vec![
            (dir.path().join("a"), b"new".to_vec()),
            (blocker.clone(), b"new".to_vec()),
        ];
        let err = write_all_or_nothing(&files).unwrap_err();
        assert_eq!(err.path, blocker);
        assert_eq!(err.replaced, vec![dir.path().join("a")]);
        assert!(err.to_string().contains("already hold the new contents"));
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().flatten().collect();
        assert_eq!(names.len(), 2, "no temporaries are left");
    }

    #[test]
    fn a_file_given_in_parts_holds_them_end_to_end() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        fs::write(&a, b"old").unwrap();
        let data = vec![7u8; 100_000];
        let files = vec![
            (a.clone(), vec![&b"head"[..], &[], &data[..]]),
            (b.clone(), vec![]),
        ];
        write_parts_all_or_nothing(&files).unwrap();
        let written = fs::read(&a).unwrap();
        assert_eq!((&written[..4], &written[4..]), (&b"head"[..], &data[..]));
        assert!(fs::read(&b).unwrap().is_empty());
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().flatten().collect();
        assert_eq!(names.len(), 2, "no temporaries are left");
    }
}
