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
