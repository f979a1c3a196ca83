//! This machine's figures for the planner's host target (`std.targets.cpu`): its f32 peak
//! ([`mslc_kernels::peak::measure`], about 100 ms) and the rate mslc's own GEMM sustains at a
//! training step's products ([`mslc_kernels::peak::gemm_rate`], about 120 ms), their ratio the
//! host's compute efficiency. Each is measured the first time a plan needs it on this machine
//! and thread count and kept in the user's cache (`host-peak.json`), so planning stays fast
//! and plans the same from run to run. Measuring on a busy machine only finds less, so the
//! figure kept is the highest measured: `mslc run`, which measures the peak anyway, raises it
//! ([`remember`]); the GEMM rate is measured again, [`RETRY_AFTER_S`] apart, until
//! [`GEMM_MEASUREMENTS`] measurements are kept (a first one taken beside other work stays
//! only until then); and a GEMM rate implausibly far below the peak (the cores were shared
//! while it was measured) is not used ([`PLAUSIBLE_EFFICIENCY`]).

use std::collections::BTreeMap;
use std::path::Path;

use mslc_kernels::peak::{machine_key, Peak};

/// The cache file's name in the user's cache directory.
const CACHE_FILE: &str = "host-peak.json";

/// The cache file's format tag (2 since GEMM rates are timed with the threads awake: the
/// lower rates kept by format 1 are not read).
const FORMAT: &str = "mslc-host-peak-2";

/// The cache file's map of peaks (f32 FLOP/s of the FMA loop) by machine key.
const PEAKS: &str = "peaks";

/// The cache file's map of GEMM rates (f32 FLOP/s of a training-shaped product) by machine key:
/// the highest plausible one measured.
const GEMM: &str = "gemm";

/// The cache file's map of the last GEMM measurement's time (Unix seconds) by machine key.
const LAST_MEASURED: &str = "gemm_measured_at";

/// The cache file's map of how many GEMM measurements were taken, by machine key.
const MEASUREMENTS: &str = "gemm_measurements";

/// The host's f32 FLOP/s peak and its GEMM rate on its default thread count (the one a run
/// uses unless told otherwise), read or measured once per process: a build plans several
/// targets, and the language server plans on every edit. `None` where nothing is kept and no
/// measurement can run; the GEMM rate is also `None` (the planner then keeps its declared
/// efficiency) while no plausible one was measured.
pub fn rates() -> (Option<f64>, Option<f64>) {
    static RATES: std::sync::OnceLock<(Option<f64>, Option<f64>)> = std::sync::OnceLock::new();
    *RATES.get_or_init(|| {
        let threads = mslc_kernels::par::cores();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let path = mslc_io::cache::cache_file(CACHE_FILE);
        kept_or_measured(path.as_deref(), threads, now, || {
            let peak = mslc_kernels::peak::measure(threads).map(|p| p.flops_per_s);
            (peak, mslc_kernels::peak::gemm_rate(threads))
        })
    })
}

/// The lowest GEMM rate, as a fraction of the FMA peak, that a measurement on an undisturbed
/// machine gives: mslc's GEMM sustains about 0.8 of the peak on these products on the
/// machines measured (0.79–0.85 on an AVX-512 EPYC). Far below it, something else was running
/// on the cores (another test, another rank measuring at the same moment: 0.05 was kept so
/// once), and a plan built on it predicts several times the real step time.
const PLAUSIBLE_EFFICIENCY: f64 = 0.3;

/// Whether a GEMM rate looks like an undisturbed machine's against its peak.
fn plausible(peak: f64, gemm: f64) -> bool {
    peak > 0.0 && gemm / peak >= PLAUSIBLE_EFFICIENCY
}

/// How many GEMM measurements, each at least [`RETRY_AFTER_S`] after the last, the kept rate
/// is the highest of. One is not enough: on a 2-core Intel Xeon a first measurement taken
/// while a test suite ran kept 0.37 of the peak where an idle machine measures 0.60–0.75 — a
/// plausible figure, so it stayed, and every later plan predicted a tiny_llama training step
/// at 194 ms for its measured 112 ms (+73 %).
const GEMM_MEASUREMENTS: f64 = 3.0;

/// How long after a GEMM measurement processes go on with what is kept before one measures
/// again (while fewer than [`GEMM_MEASUREMENTS`] are kept, or none was plausible): a test
/// suite or a busy hour starts many plans, and each would spend ~220 ms of every core
/// measuring what the same load would spoil again.
const RETRY_AFTER_S: f64 = 600.0;

/// This machine's peak and GEMM rate on `threads` threads at `now` (Unix seconds): the kept
/// figures, else measured now by `measure` and kept (where there is a cache file). The peak
/// kept is the highest measured; the GEMM rate kept is the highest plausible one against the
/// peak, used only when there is one (else the planner keeps its declared efficiency), and
/// measured again [`RETRY_AFTER_S`] after the last until [`GEMM_MEASUREMENTS`] were taken and
/// one was plausible. Measuring holds an exclusive lock beside the cache file, so ranks of one
/// job started together on this machine (`mpiexec -n 8`) take turns: the first measures the
/// whole machine, the others wait and read what it kept, instead of each measuring a share of
/// it at once.
fn kept_or_measured(
    path: Option<&Path>,
    threads: usize,
    now: f64,
    measure: impl FnOnce() -> (Option<f64>, Option<f64>),
) -> (Option<f64>, Option<f64>) {
    let key = machine_key(threads);
    // The kept peak and usable GEMM rate, and whether they are settled (no measuring due).
    let kept = |path: Option<&Path>| {
        let maps = path.map(read_maps).unwrap_or_default();
        let figure = |map: &str| maps.get(map).and_then(|m| m.get(&key)).copied();
        let peak = figure(PEAKS);
        let gemm = figure(GEMM).filter(|&g| peak.is_some_and(|p| plausible(p, g)));
        let measured_lately =
            figure(LAST_MEASURED).is_some_and(|t| (now - t).abs() < RETRY_AFTER_S);
        let enough = gemm.is_some() && figure(MEASUREMENTS).unwrap_or(0.0) >= GEMM_MEASUREMENTS;
        (peak, gemm, peak.is_some() && (enough || measured_lately))
    };
    if let (peak, gemm, true) = kept(path) {
        return (peak, gemm);
    }
    let _lock = path.and_then(lock_beside);
    if let (peak, gemm, true) = kept(path) {
        return (peak, gemm);
    }
    let (peak, gemm) = measure();
    let gemm = gemm.filter(|&g| peak.is_some_and(|p| plausible(p, g)));
    let Some(path) = path else {
        return (peak, gemm);
    };
    let _ = record(path, &key, peak, gemm, now);
    match kept(Some(path)) {
        (Some(kept_peak), kept_gemm, _) => (Some(kept_peak), kept_gemm),
        // The cache could not be written.
        (None, _, _) => (peak, gemm),
    }
}

/// An exclusive lock on the file `path` + `.lock`, held until the returned file is dropped;
/// `None` (measure unlocked) where it cannot be created or locked.
fn lock_beside(path: &Path) -> Option<std::fs::File> {
    let mut name = path.as_os_str().to_os_string();
    name.push(".lock");
    std::fs::create_dir_all(path.parent()?).ok()?;
    let file = std::fs::File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(name)
        .ok()?;
    file.lock().ok()?;
    Some(file)
}

/// Keeps `peak` as its machine's figure when it is above the one kept (best effort: a cache
/// that cannot be written only means measuring again next time).
pub fn remember(peak: &Peak) {
    if let Some(path) = mslc_io::cache::cache_file(CACHE_FILE) {
        let _ = raise(
            &path,
            &machine_key(peak.threads),
            &[(PEAKS, peak.flops_per_s)],
        );
    }
}

/// The cache file's maps by name, each a figure by machine key.
type Maps = BTreeMap<&'static str, BTreeMap<String, f64>>;

/// Raises `key`'s figure in each `(map, figure)` of `figures` in the cache file `path` unless
/// the one kept is already higher.
fn raise(path: &Path, key: &str, figures: &[(&'static str, f64)]) -> std::io::Result<()> {
    update(path, |maps| raise_in(maps, key, figures))
}

/// Keeps one measurement taken at `now` in the cache file `path`: raises `key`'s peak and
/// (where plausible) GEMM rate, and counts the GEMM measurement and its time.
fn record(
    path: &Path,
    key: &str,
    peak: Option<f64>,
    gemm: Option<f64>,
    now: f64,
) -> std::io::Result<()> {
    update(path, |maps| {
        let figures: Vec<_> = [(PEAKS, peak), (GEMM, gemm)]
            .into_iter()
            .filter_map(|(map, figure)| Some((map, figure?)))
            .collect();
        raise_in(maps, key, &figures);
        let count = maps.entry(MEASUREMENTS).or_default();
        *count.entry(key.to_string()).or_insert(0.0) += 1.0;
        maps.entry(LAST_MEASURED)
            .or_default()
            .insert(key.to_string(), now);
        true
    })
}

/// Raises `key`'s figure in each `(map, figure)` of `figures` in `maps` unless the one kept is
/// already higher; whether one rose.
fn raise_in(maps: &mut Maps, key: &str, figures: &[(&'static str, f64)]) -> bool {
    let mut rose = false;
    for &(map, figure) in figures {
        let kept = maps.entry(map).or_default();
        if figure.is_finite() && figure > 0.0 && kept.get(key).is_none_or(|&k| k < figure) {
            kept.insert(key.to_string(), figure);
            rose = true;
        }
    }
    rose
}

/// Reads the cache file `path`, lets `change` change its maps and, where it says it did,
/// writes the file once, atomically, so a concurrent reader sees the old file or the new one.
fn update(path: &Path, change: impl FnOnce(&mut Maps) -> bool) -> std::io::Result<()> {
    let mut maps = read_maps(path);
    if !change(&mut maps) {
        return Ok(());
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut json = serde_json::json!({ "format": FORMAT });
    for (name, figures) in maps.into_iter().filter(|(_, f)| !f.is_empty()) {
        json[name] = serde_json::json!(figures);
    }
    mslc_io::atomic::write_atomic(path, |tmp| std::fs::write(tmp, json.to_string()))
}

/// Every map kept in `path` ([`PEAKS`], [`GEMM`], [`LAST_MEASURED`], [`MEASUREMENTS`]), read
/// in one pass; a missing, damaged or foreign file keeps none (it is a cache: measuring again
/// rebuilds it).
fn read_maps(path: &Path) -> Maps {
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
    [PEAKS, GEMM, LAST_MEASURED, MEASUREMENTS]
        .into_iter()
        .map(|m| (m, figures(m)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The figures of map `map` kept in `path`, by machine key.
    fn read(path: &Path, map: &str) -> BTreeMap<String, f64> {
        read_maps(path).remove(map).unwrap_or_default()
    }

    #[test]
    fn a_disturbed_gemm_rate_is_not_used_and_measured_again_later() {
        let dir = std::env::temp_dir().join(format!("mslc-host-rates-{}", std::process::id()));
        let path = dir.join("cache").join(CACHE_FILE);
        let key = machine_key(2);
        let never = || -> (Option<f64>, Option<f64>) { panic!("measured again") };
        let at = |now, measured: (f64, f64)| {
            kept_or_measured(Some(&path), 2, now, || (Some(measured.0), Some(measured.1)))
        };
        // Nothing kept: measured, and the plausible pair kept; the next process reads it.
        assert_eq!(at(1.0, (2.0e11, 1.6e11)), (Some(2.0e11), Some(1.6e11)));
        assert_eq!(
            kept_or_measured(Some(&path), 2, 500.0, never),
            (Some(2.0e11), Some(1.6e11))
        );
        // A GEMM at 5 % of the peak (another process had the cores): the peak serves, the
        // GEMM rate does not (the planner keeps its declared efficiency), nor is it kept; for
        // the next ten minutes processes do not measure again, then one does.
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(at(1000.0, (1.2e11, 0.06e11)), (Some(1.2e11), None));
        assert!(read(&path, GEMM).is_empty());
        assert_eq!(
            kept_or_measured(Some(&path), 2, 1500.0, never),
            (Some(1.2e11), None)
        );
        assert_eq!(at(1700.0, (2.2e11, 1.8e11)), (Some(2.2e11), Some(1.8e11)));
        // A pair an older mslc kept, from a disturbed measurement or uncounted, is measured
        // again at once.
        std::fs::remove_dir_all(&dir).unwrap();
        raise(&path, &key, &[(PEAKS, 2.3e11), (GEMM, 0.06e11)]).unwrap();
        assert_eq!(at(1.0, (2.2e11, 1.8e11)), (Some(2.3e11), Some(1.8e11)));
        assert_eq!(read(&path, GEMM)[&key], 1.8e11);
        std::fs::remove_dir_all(&dir).unwrap();
        raise(&path, &key, &[(PEAKS, 2.3e11), (GEMM, 0.9e11)]).unwrap();
        assert_eq!(at(1.0, (2.2e11, 1.8e11)), (Some(2.3e11), Some(1.8e11)));
        // Without a cache directory it measures every time, and still drops a disturbed rate.
        let measured = || (Some(2.0e11), Some(0.1e11));
        assert_eq!(
            kept_or_measured(None, 2, 0.0, measured),
            (Some(2.0e11), None)
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_gemm_rate_is_the_highest_of_measurements_taken_apart() {
        let dir = std::env::temp_dir().join(format!("mslc-host-apart-{}", std::process::id()));
        let path = dir.join("cache").join(CACHE_FILE);
        let never = || -> (Option<f64>, Option<f64>) { panic!("measured again") };
        let at = |now, measured: (f64, f64)| {
            kept_or_measured(Some(&path), 2, now, || (Some(measured.0), Some(measured.1)))
        };
        // A first measurement beside other work: plausible, so used, but measured again once
        // ten minutes have passed, until three were taken; the highest is kept.
        assert_eq!(at(1.0, (2.0e11, 0.8e11)), (Some(2.0e11), Some(0.8e11)));
        assert_eq!(
            kept_or_measured(Some(&path), 2, 600.0, never),
            (Some(2.0e11), Some(0.8e11))
        );
        assert_eq!(at(601.0, (2.0e11, 1.6e11)), (Some(2.0e11), Some(1.6e11)));
        assert_eq!(at(1300.0, (1.9e11, 1.2e11)), (Some(2.0e11), Some(1.6e11)));
        assert_eq!(read(&path, MEASUREMENTS)[&machine_key(2)], 3.0);
        // Three kept: settled for good.
        assert_eq!(
            kept_or_measured(Some(&path), 2, 1e9, never),
            (Some(2.0e11), Some(1.6e11))
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Processes started together (ranks of one `mpiexec` job) take turns through the lock:
    /// one measures, the others wait and read what it kept. Two threads stand for them here
    /// (each opens the lock file itself, and such locks exclude each other within a process
    /// too).
    #[test]
    fn processes_started_together_measure_once() {
        let dir = std::env::temp_dir().join(format!("mslc-host-turns-{}", std::process::id()));
        let path = dir.join("cache").join(CACHE_FILE);
        let measured = std::sync::atomic::AtomicUsize::new(0);
        let measure = || {
            measured.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(200));
            (Some(2.0e11), Some(1.6e11))
        };
        let rates: Vec<_> = std::thread::scope(|s| {
            let runs: Vec<_> = (0..2)
                .map(|_| s.spawn(|| kept_or_measured(Some(&path), 2, 1.0, measure)))
                .collect();
            runs.into_iter().map(|r| r.join().unwrap()).collect()
        });
        assert_eq!(measured.into_inner(), 1);
        assert!(rates.iter().all(|r| *r == (Some(2.0e11), Some(1.6e11))));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_kept_figure_only_rises_and_a_damaged_file_keeps_none() {
        let dir = std::env::temp_dir().join(format!("mslc-host-peak-{}", std::process::id()));
        let path = dir.join("cache").join(CACHE_FILE);
        assert!(read(&path, PEAKS).is_empty());
        raise(&path, "cpu | AVX2+FMA | 2 thread(s)", &[(PEAKS, 1.5e11)]).unwrap();
        raise(&path, "cpu | AVX2+FMA | 2 thread(s)", &[(PEAKS, 1.0e11)]).unwrap();
        raise(&path, "cpu | AVX2+FMA | 1 thread(s)", &[(PEAKS, 0.8e11)]).unwrap();
        raise(&path, "cpu | AVX2+FMA | 1 thread(s)", &[(PEAKS, f64::NAN)]).unwrap();
        raise(&path, "cpu | AVX2+FMA | 2 thread(s)", &[(GEMM, 1.2e11)]).unwrap();
        let kept = read(&path, PEAKS);
        assert_eq!(kept["cpu | AVX2+FMA | 2 thread(s)"], 1.5e11);
        assert_eq!(kept["cpu | AVX2+FMA | 1 thread(s)"], 0.8e11);
        // The two maps are kept apart, and raising one keeps the other.
        assert_eq!(read(&path, GEMM)["cpu | AVX2+FMA | 2 thread(s)"], 1.2e11);
        raise(&path, "cpu | AVX2+FMA | 2 thread(s)", &[(PEAKS, 2.0e11)]).unwrap();
        assert_eq!(read(&path, PEAKS)["cpu | AVX2+FMA | 2 thread(s)"], 2.0e11);
        assert_eq!(read(&path, GEMM).len(), 1);
        std::fs::write(&path, b"{\"format\": \"mslc-host-peak-2\", \"peaks\": [1").unwrap();
        assert!(read(&path, PEAKS).is_empty());
        std::fs::write(&path, b"{\"format\": \"other\", \"peaks\": {\"k\": 1.0}}").unwrap();
        assert!(read(&path, PEAKS).is_empty());
        raise(&path, "k", &[(PEAKS, 3.0)]).unwrap();
        assert_eq!(read(&path, PEAKS)["k"], 3.0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
