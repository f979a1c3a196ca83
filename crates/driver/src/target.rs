//! From checked `target` declarations to the planner's [`Target`]: the driver reads
//! `std.targets` (or the user's own declarations) so the planner never runs the checker.

use mslc_check::policy::TargetSpec;
use mslc_plan::target::Target;

/// The target a checked `target` declaration describes; the host (`cpu`) with this machine's
/// measured peak and compute efficiency on its default thread count ([`crate::host::rates`]).
pub fn target_from_spec(spec: &TargetSpec) -> Target {
    let target = Target {
        name: spec.name.name.clone(),
        peak_f32: spec.peak_flops.f32,
        peak_f16: spec.peak_flops.f16,
        peak_bf16: spec.peak_flops.bf16,
        memory_bytes: spec.memory_bytes,
        bandwidth: spec.bandwidth_bytes_per_s,
        interconnect: spec.interconnect_bytes_per_s,
        network: spec.network_bytes_per_s,
        devices_per_node: spec.devices_per_node,
        compute_efficiency: mslc_plan::parallel::estimate::COMPUTE_EFFICIENCY,
    };
    let (peak, gemm) = match target.is_host() {
        true => crate::host::rates(),
        false => (None, None),
    };
    target.with_host(peak, gemm)
}

/// A target of the standard library (`std.targets`) by name, e.g. `cpu` — the bundled
/// executor on this machine.
pub fn standard_target(name: &str) -> Option<Target> {
    let checked = mslc_check::check_source("<targets>", "", &Default::default());
    checked.decls.target(name).map(target_from_spec)
}
