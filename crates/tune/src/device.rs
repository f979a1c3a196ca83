//! The device fingerprint tuning results are keyed by: CPU model, the SIMD features the
//! kernels choose between (the planner's notion, `host_features`), core count and cache sizes.
//! A result measured on one machine is only reused on a machine with the same fingerprint.

use mslc_plan::target::host_features;

/// This machine's fingerprint, e.g.
/// `AMD EPYC 7B13 | x86_64+avx2+fma+f16c | 2 cores | L1d 32K, L2 512K, L3 32768K`.
pub fn fingerprint() -> String {
    let cores = mslc_kernels::par::cores();
    format!(
        "{} | {} | {cores} cores | {}",
        cpu_model(),
        host_features(),
        caches()
    )
}

/// The CPU's model name (Linux `/proc/cpuinfo`), or the architecture elsewhere.
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name") || l.starts_with("Model"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.split_whitespace().collect::<Vec<_>>().join(" "))
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// The cache levels of CPU 0 and their sizes (Linux sysfs), or `caches unknown`.
fn caches() -> String {
    let dir = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
    let read = |p: std::path::PathBuf| {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_string())
    };
    let mut levels: Vec<String> = (0..8)
        .filter_map(|i| {
            let index = dir.join(format!("index{i}"));
            let level = read(index.join("level"))?;
            let kind = read(index.join("type"))?;
            let size = read(index.join("size"))?;
            let suffix = match kind.as_str() {
                "Data" => "d",
                "Instruction" => "i",
                _ => "",
            };
            Some(format!("L{level}{suffix} {size}"))
        })
        .collect();
    if levels.is_empty() {
        return "caches unknown".to_string();
    }
    levels.sort();
    levels.join(", ")
}
