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
    /// Fraction of the peak the matmul-heavy ops reach:
    /// [`COMPUTE_EFFICIENCY`](crate::parallel::estimate::COMPUTE_EFFICIENCY), calibrated on
    /// published runs, for a declared device; measured for the host ([`Target::with_host`]).
    pub compute_efficiency: f64,
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
            format!("cpu-{}-{}t", host_features(), mslc_kernels::par::cores())
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
    /// This target with the host's measured rates when it is the host: `peak`, its f32 FLOP/s,
    /// in all three peaks (the kernels widen f16 and bf16 to f32), and `gemm`, what mslc's own
    /// GEMM sustains at a training step's shape, over `peak` as its compute efficiency (kept
    /// within 0.2–0.95); otherwise unchanged. `std.targets.cpu`'s declared figures describe one
    /// machine; mslc runs on others (docs FACTS.md: never hard-code a peak), and what a CPU
    /// reports (its base clock, its vector width) is not what it reaches: a VM shows no boost
    /// clock, and Zen 4 runs 512-bit FMAs at the 256-bit rate.
    pub fn with_host(mut self, peak: Option<f64>, gemm: Option<f64>) -> Target {
        let Some(peak) = peak.filter(|_| self.is_host()) else {
            return self;
        };
        self.peak_f32 = peak;
        self.peak_f16 = peak;
        self.peak_bf16 = peak;
        if let Some(gemm) = gemm.filter(|g| g.is_finite() && *g > 0.0) {
            self.compute_efficiency = (gemm / peak).clamp(0.2, 0.95);
        }
        self
    }

    /// This target as one of `devices` devices that share it, when it is the host: ranks on
    /// this machine (the threads backend, or `mpiexec` on one node) divide its cores, memory
    /// bandwidth and memory between them. Other targets are one device each, unchanged.
    pub fn shared_by(mut self, devices: i64) -> Target {
        if self.is_host() && devices > 1 {
            let share = devices as f64;
            self.peak_f32 /= share;
            self.peak_f16 /= share;
            self.peak_bf16 /= share;
            self.bandwidth /= share;
            self.memory_bytes /= devices as u64;
        }
        self
    }
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
    use crate::parallel::estimate::COMPUTE_EFFICIENCY;

    #[test]
    fn only_the_host_takes_the_measured_peak() {
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
            compute_efficiency: COMPUTE_EFFICIENCY,
        };
        assert_eq!(t.clone().with_host(Some(1e11), Some(8e10)), t);
        let host = Target {
            name: "cpu".into(),
            ..t
        };
        assert_eq!(host.clone().with_host(None, Some(8e10)), host);
        let p = 1e11;
        let shared = host.clone().with_host(Some(p), Some(7e10)).shared_by(4);
        assert_eq!(
            shared.compute_efficiency, 0.7,
            "shared devices keep the ratio"
        );
        assert_eq!(
            (shared.peak_f32, shared.bandwidth),
            (p / 4.0, host.bandwidth / 4.0)
        );
        assert_eq!(t.clone().shared_by(4), t);
        assert_eq!(
            host.clone().with_host(Some(p), None).compute_efficiency,
            COMPUTE_EFFICIENCY
        );
        assert_eq!(
            host.clone()
                .with_host(Some(p), Some(2e11))
                .compute_efficiency,
            0.95
        );
        let measured = host.with_host(Some(p), None);
        assert_eq!(
            (measured.peak_f32, measured.peak_f16, measured.peak_bf16),
            (p, p, p)
        );
    }
}
