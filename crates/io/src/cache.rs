//! Where mslc keeps what it learns about this machine between runs (the tuning knowledge
//! base, the measured peak): the user's cache directory, as the XDG base-directory
//! specification places it.

use std::path::PathBuf;

/// `$XDG_CACHE_HOME/mslc/NAME`, else `~/.cache/mslc/NAME`; `None` when neither variable is
/// set (or both are empty).
pub fn cache_file(name: &str) -> Option<PathBuf> {
    let nonempty = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    let cache = nonempty("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| nonempty("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(cache.join("mslc").join(name))
}
