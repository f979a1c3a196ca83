//! The hardware a module is planned for: peak compute per dtype, memory, bandwidths — what the
//! cost model and the memory budget check need — and a fingerprint that keys tuned kernels.

use mslc_core::ops::DType;

/// A target device, as its `target` declaration describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    /// Declaration name, e.g. `cpu`, `ascend910b`.
    pub name: String,
    /// Peak FLOP/s in f32.
    pub peak_f32: f64,
    /// Peak FLOP/s in f16.
    pub peak_f16: f64,
    /// Peak FLOP/s in bf16.
    pub peak_bf16: f64,
    /// Device memory in bytes.
    pub memory_bytes: u64,
    /// Device memory bandwidth in bytes/s.
    pub bandwidth: f64,
    /// Device-to-device bandwidth inside a node in bytes/s.
    pub interconnect: f64,
    /// Per-device bandwidth to devices of other nodes in bytes/s.
    pub network: f64,
    /// Devices per node.
    pub devices_per_node: i64,
}

impl Target {
    /// Peak FLOP/s when computing in `dtype`.
    pub fn peak(&self, dtype: DType) -> f64 {
        match dtype {
            DType::F16 => self.peak_f16,
            DType::BF16 => self.peak_bf16,
            _ => self.peak_f32,
        }
    }

    /// Whether this target is the bundled executor on this machine.
    pub fn is_host(&self) -> bool {
        self.name == "cpu"
    }

    /// What tuned kernels are keyed by: for the host, the CPU features the kernels use and the
    /// thread count; for other targets, the name and peaks (results from one chip are not valid
    /// on another, as AOE's repositories are keyed by chip).
    pub fn fingerprint(&self) -> String {
        if self.is_host() {
            format!(
                "cpu-{}-{}t",
                host_features(),
                std::thread::available_parallelism().map_or(1, |n| n.get())
            )
        } else {
            format!(
                "{}-{:.0}-{:.0}",
                self.name,
                self.peak_f32 / 1e9,
                self.peak_bf16 / 1e9
            )
        }
    }
}

impl Target {
    /// This target with the host's detected f32 peak ([`host_peak`]) in all three peaks (the
    /// kernels widen f16 and bf16 to f32) when it is the host and the peak can be detected;
    /// otherwise unchanged. `std.targets.cpu`'s declared figures describe one machine; mslc
    /// runs on others (docs FACTS.md: never hard-code a peak).
    pub fn detected(mut self) -> Target {
        if let Some(peak) = self.is_host().then(host_peak).flatten() {
            self.peak_f32 = peak;
            self.peak_f16 = peak;
            self.peak_bf16 = peak;
        }
        self
    }
}

/// This machine's f32 peak FLOP/s from what it reports, without running anything (so plans
/// are the same on every build of mslc): threads × 2 FMA units × lanes × 2 FLOP × the clock,
/// the lanes of the widest FMA the kernels use (16 with AVX-512F, 8 with AVX2+FMA, else 4
/// lanes of separate multiply and add, counted as 1 unit) and the clock `/proc/cpuinfo`
/// gives. `None` where the clock cannot be read.
pub fn host_peak() -> Option<f64> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    peak_from(&cpuinfo, &host_features(), threads)
}

/// [`host_peak`] from a cpuinfo text, the feature string of [`host_features`] and a thread
/// count.
fn peak_from(cpuinfo: &str, features: &str, threads: usize) -> Option<f64> {
    let mhz: f64 = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("cpu MHz")?.split_once(':'))
        .and_then(|(_, v)| v.trim().parse().ok())
        .filter(|&m: &f64| m > 0.0)?;
    let has = |f: &str| features.split('+').any(|x| x == f);
    let (units, lanes) = if has("avx512f") {
        (2.0, 16.0)
    } else if has("avx2") && has("fma") {
        (2.0, 8.0)
    } else {
        (1.0, 4.0)
    };
    Some(threads as f64 * units * lanes * 2.0 * mhz * 1e6)
}

/// The SIMD features of this CPU that kernels choose between.
pub fn host_features() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        let mut f = vec!["x86_64"];
        if std::arch::is_x86_feature_detected!("avx2") {
            f.push("avx2");
        }
        if std::arch::is_x86_feature_detected!("fma") {
            f.push("fma");
        }
        if std::arch::is_x86_feature_detected!("f16c") {
            f.push("f16c");
        }
        if std::arch::is_x86_feature_detected!("avx512f") {
            f.push("avx512f");
        }
        f.join("+")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        std::env::consts::ARCH.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// FACTS.md's EPYC: 2 FMA × 8 lanes × 2 FLOP × 2.45 GHz × 2 cores ≈ 157 GFLOP/s.
    #[test]
    fn the_peak_follows_from_features_threads_and_clock() {
        let info = "processor\t: 0\nmodel name\t: AMD EPYC\ncpu MHz\t\t: 2445.424\n";
        let p = peak_from(info, "x86_64+avx2+fma+f16c", 2).unwrap();
        assert!((p - 156.507e9).abs() < 1e6, "{p}");
        let avx512 = peak_from(info, "x86_64+avx2+fma+avx512f", 2).unwrap();
        assert_eq!(avx512, 2.0 * p);
        assert_eq!(peak_from(info, "aarch64", 1).unwrap(), p / 8.0);
        assert_eq!(peak_from("processor: 0\n", "x86_64", 1), None);
    }

    #[test]
    fn only_the_host_takes_the_detected_peak() {
        let t = Target {
            name: "a100".into(),
            peak_f32: 19.5e12,
            peak_f16: 312e12,
            peak_bf16: 312e12,
            memory_bytes: 0,
            bandwidth: 0.0,
            interconnect: 0.0,
            network: 0.0,
            devices_per_node: 8,
        };
        assert_eq!(t.clone().detected(), t);
        let host = Target {
            name: "cpu".into(),
            ..t
        }
        .detected();
        if let Some(p) = host_peak() {
            assert_eq!((host.peak_f32, host.peak_f16, host.peak_bf16), (p, p, p));
        }
    }
}
