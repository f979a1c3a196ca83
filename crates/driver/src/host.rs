//! This machine's f32 peak as the planner's figure for the host target (`std.targets.cpu`):
//! measured ([`mslc_kernels::peak::measure`], about 100 ms) the first time a plan needs it on
//! this machine and thread count, and kept in the user's cache (`host-peak.json`), so planning
//! stays fast and plans the same from run to run. A peak is a maximum — measuring on a busy
//! machine only finds less — so the figure kept is the highest measured: `mslc run`, which
//! measures it anyway, raises it ([`remember`]).

use std::collections::BTreeMap;
use std::path::Path;

use mslc_kernels::peak::{machine_key, Peak};

/// The cache file's name in the user's cache directory.
const CACHE_FILE: &str = "host-peak.json";

/// The cache file's format tag.
const FORMAT: &str = "mslc-host-peak-1";

/// The host's f32 FLOP/s on its default thread count (the one a run uses unless told
/// otherwise), read or measured once per process: a build plans several targets, and the
/// language server plans on every edit. `None` when nothing is kept and no measurement can
/// run.
pub fn peak_flops() -> Option<f64> {
    static PEAK: std::sync::OnceLock<Option<f64>> = std::sync::OnceLock::new();
    *PEAK.get_or_init(|| {
        kept_or_measured(std::thread::available_parallelism().map_or(1, |n| n.get()))
    })
}

/// The host's f32 FLOP/s on `threads` threads: the kept figure, else measured now (and kept
/// when there is a cache directory).
fn kept_or_measured(threads: usize) -> Option<f64> {
    let path = mslc_io::cache::cache_file(CACHE_FILE);
    let key = machine_key(threads);
    if let Some(kept) = path.as_deref().and_then(|p| read(p).remove(&key)) {
        return Some(kept);
    }
    let peak = mslc_kernels::peak::measure(threads)?;
    remember(&peak);
    Some(peak.flops_per_s)
}

/// Keeps `peak` as its machine's figure when it is above the one kept (best effort: a cache
/// that cannot be written only means measuring again next time).
pub fn remember(peak: &Peak) {
    if let Some(path) = mslc_io::cache::cache_file(CACHE_FILE) {
        let _ = raise(&path, &machine_key(peak.threads), peak.flops_per_s);
    }
}

/// Raises `key`'s figure in the cache file `path` to `flops` unless it is already higher;
/// written atomically, so a concurrent reader sees the old file or the new one.
fn raise(path: &Path, key: &str, flops: f64) -> std::io::Result<()> {
    let mut peaks = read(path);
    if !(flops.is_finite() && flops > 0.0) || peaks.get(key).is_some_and(|&k| k >= flops) {
        return Ok(());
    }
    peaks.insert(key.to_string(), flops);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let text = serde_json::json!({ "format": FORMAT, "peaks": peaks }).to_string();
    mslc_io::atomic::write_atomic(path, |tmp| std::fs::write(tmp, text))
}

/// The figures kept in `path`, by machine key; a missing, damaged or foreign file keeps none
/// (it is a cache: measuring again rebuilds it).
fn read(path: &Path) -> BTreeMap<String, f64> {
    let Ok(bytes) = std::fs::read(path) else {
        return BTreeMap::new();
    };
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
        return BTreeMap::new();
    };
    if value.get("format").and_then(|f| f.as_str()) != Some(FORMAT) {
        return BTreeMap::new();
    }
    value
        .get("peaks")
        .and_then(|p| p.as_object())
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), v.as_f64().filter(|f| *f > 0.0)?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kept_figure_only_rises_and_a_damaged_file_keeps_none() {
        let dir = std::env::temp_dir().join(format!("mslc-host-peak-{}", std::process::id()));
        let path = dir.join("cache").join(CACHE_FILE);
        assert!(read(&path).is_empty());
        raise(&path, "cpu | AVX2+FMA | 2 thread(s)", 1.5e11).unwrap();
        raise(&path, "cpu | AVX2+FMA | 2 thread(s)", 1.0e11).unwrap();
        raise(&path, "cpu | AVX2+FMA | 1 thread(s)", 0.8e11).unwrap();
        raise(&path, "cpu | AVX2+FMA | 1 thread(s)", f64::NAN).unwrap();
        let kept = read(&path);
        assert_eq!(kept["cpu | AVX2+FMA | 2 thread(s)"], 1.5e11);
        assert_eq!(kept["cpu | AVX2+FMA | 1 thread(s)"], 0.8e11);
        raise(&path, "cpu | AVX2+FMA | 2 thread(s)", 2.0e11).unwrap();
        assert_eq!(read(&path)["cpu | AVX2+FMA | 2 thread(s)"], 2.0e11);
        std::fs::write(&path, b"{\"format\": \"mslc-host-peak-1\", \"peaks\": [1").unwrap();
        assert!(read(&path).is_empty());
        std::fs::write(&path, b"{\"format\": \"other\", \"peaks\": {\"k\": 1.0}}").unwrap();
        assert!(read(&path).is_empty());
        raise(&path, "k", 3.0).unwrap();
        assert_eq!(read(&path)["k"], 3.0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
