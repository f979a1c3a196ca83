//! This machine's figures for the planner's host target (`std.targets.cpu`): its f32 peak
//! ([`mslc_kernels::peak::measure`], about 100 ms) and the rate mslc's own GEMM sustains at a
//! training step's products ([`mslc_kernels::peak::gemm_rate`], about 30 ms), their ratio the
//! host's compute efficiency. Each is measured the first time a plan needs it on this machine
//! and thread count and kept in the user's cache (`host-peak.json`), so planning stays fast
//! and plans the same from run to run. Measuring on a busy machine only finds less, so the
//! figure kept is the highest measured: `mslc run`, which measures the peak anyway, raises it
//! ([`remember`]).

use std::collections::BTreeMap;
use std::path::Path;

use mslc_kernels::peak::{machine_key, Peak};

/// The cache file's name in the user's cache directory.
const CACHE_FILE: &str = "host-peak.json";

/// The cache file's format tag.
const FORMAT: &str = "mslc-host-peak-1";

/// The cache file's map of peaks (f32 FLOP/s of the FMA loop) by machine key.
const PEAKS: &str = "peaks";

/// The cache file's map of GEMM rates (f32 FLOP/s of a training-shaped product) by machine key.
const GEMM: &str = "gemm";

/// The host's f32 FLOP/s peak and its GEMM rate on its default thread count (the one a run
/// uses unless told otherwise), read or measured once per process: a build plans several
/// targets, and the language server plans on every edit. `None` where nothing is kept and no
/// measurement can run.
pub fn rates() -> (Option<f64>, Option<f64>) {
    static RATES: std::sync::OnceLock<(Option<f64>, Option<f64>)> = std::sync::OnceLock::new();
    *RATES.get_or_init(|| {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let peak = kept_or_measured(PEAKS, threads, |t| {
            mslc_kernels::peak::measure(t).map(|p| p.flops_per_s)
        });
        let gemm = kept_or_measured(GEMM, threads, mslc_kernels::peak::gemm_rate);
        (peak, gemm)
    })
}

/// `map`'s figure for this machine on `threads` threads: the kept one, else measured now (and
/// kept when there is a cache directory).
fn kept_or_measured(map: &str, threads: usize, measure: fn(usize) -> Option<f64>) -> Option<f64> {
    let path = mslc_io::cache::cache_file(CACHE_FILE);
    let key = machine_key(threads);
    if let Some(kept) = path.as_deref().and_then(|p| read(p, map).remove(&key)) {
        return Some(kept);
    }
    let measured = measure(threads)?;
    if let Some(path) = &path {
        let _ = raise(path, map, &key, measured);
    }
    Some(measured)
}

/// Keeps `peak` as its machine's figure when it is above the one kept (best effort: a cache
/// that cannot be written only means measuring again next time).
pub fn remember(peak: &Peak) {
    if let Some(path) = mslc_io::cache::cache_file(CACHE_FILE) {
        let _ = raise(&path, PEAKS, &machine_key(peak.threads), peak.flops_per_s);
    }
}

/// Raises `key`'s figure in map `map` of the cache file `path` to `flops` unless it is already
/// higher; written atomically, so a concurrent reader sees the old file or the new one.
fn raise(path: &Path, map: &str, key: &str, flops: f64) -> std::io::Result<()> {
    let mut maps = read_maps(path);
    let figures = maps.entry(map).or_default();
    if !(flops.is_finite() && flops > 0.0) || figures.get(key).is_some_and(|&k| k >= flops) {
        return Ok(());
    }
    figures.insert(key.to_string(), flops);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut json = serde_json::json!({ "format": FORMAT });
    for (name, figures) in maps {
        json[name] = serde_json::json!(figures);
    }
    mslc_io::atomic::write_atomic(path, |tmp| std::fs::write(tmp, json.to_string()))
}

/// The figures of map `map` kept in `path`, by machine key.
fn read(path: &Path, map: &str) -> BTreeMap<String, f64> {
    read_maps(path).remove(map).unwrap_or_default()
}

/// Every map kept in `path` ([`PEAKS`], [`GEMM`]), read in one pass; a missing, damaged or
/// foreign file keeps none (it is a cache: measuring again rebuilds it).
fn read_maps(path: &Path) -> BTreeMap<&'static str, BTreeMap<String, f64>> {
    let Ok(bytes) = std::fs::read(path) else {
        return BTreeMap::new();
    };
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
        return BTreeMap::new();
    };
    if value.get("format").and_then(|f| f.as_str()) != Some(FORMAT) {
        return BTreeMap::new();
    }
    let figures = |map: &str| -> BTreeMap<String, f64> {
        value
            .get(map)
            .and_then(|p| p.as_object())
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| Some((k.clone(), v.as_f64().filter(|f| *f > 0.0)?)))
            .collect()
    };
    [PEAKS, GEMM].into_iter().map(|m| (m, figures(m))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kept_figure_only_rises_and_a_damaged_file_keeps_none() {
        let dir = std::env::temp_dir().join(format!("mslc-host-peak-{}", std::process::id()));
        let path = dir.join("cache").join(CACHE_FILE);
        assert!(read(&path, PEAKS).is_empty());
        raise(&path, PEAKS, "cpu | AVX2+FMA | 2 thread(s)", 1.5e11).unwrap();
        raise(&path, PEAKS, "cpu | AVX2+FMA | 2 thread(s)", 1.0e11).unwrap();
        raise(&path, PEAKS, "cpu | AVX2+FMA | 1 thread(s)", 0.8e11).unwrap();
        raise(&path, PEAKS, "cpu | AVX2+FMA | 1 thread(s)", f64::NAN).unwrap();
        raise(&path, GEMM, "cpu | AVX2+FMA | 2 thread(s)", 1.2e11).unwrap();
        let kept = read(&path, PEAKS);
        assert_eq!(kept["cpu | AVX2+FMA | 2 thread(s)"], 1.5e11);
        assert_eq!(kept["cpu | AVX2+FMA | 1 thread(s)"], 0.8e11);
        // The two maps are kept apart, and raising one keeps the other.
        assert_eq!(read(&path, GEMM)["cpu | AVX2+FMA | 2 thread(s)"], 1.2e11);
        raise(&path, PEAKS, "cpu | AVX2+FMA | 2 thread(s)", 2.0e11).unwrap();
        assert_eq!(read(&path, PEAKS)["cpu | AVX2+FMA | 2 thread(s)"], 2.0e11);
        assert_eq!(read(&path, GEMM).len(), 1);
        std::fs::write(&path, b"{\"format\": \"mslc-host-peak-1\", \"peaks\": [1").unwrap();
        assert!(read(&path, PEAKS).is_empty());
        std::fs::write(&path, b"{\"format\": \"other\", \"peaks\": {\"k\": 1.0}}").unwrap();
        assert!(read(&path, PEAKS).is_empty());
        raise(&path, PEAKS, "k", 3.0).unwrap();
        assert_eq!(read(&path, PEAKS)["k"], 3.0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
