//! The cost model: a roofline estimate of one forward pass on the target — per step, the longer
//! of its compute time at the target's peak for the step's dtype and its memory traffic at the
//! target's bandwidth — from the op registry's flops and bytes, never from closed-form formulas.

use serde::Serialize;

use mslc_artifact::Module;

use super::target::Target;

/// What the cost model says about a module.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CostEstimate {
    /// Floating-point operations per forward pass.
    pub flops: u64,
    /// Bytes read and written by all steps.
    pub bytes_moved: u64,
    /// Estimated seconds per forward pass on one device of the target.
    pub seconds: f64,
    /// Steps bound by compute rather than memory.
    pub compute_bound_steps: usize,
}

/// Estimates one forward pass of `module` on `target`.
pub fn estimate(module: &Module, target: &Target) -> CostEstimate {
    let mut est = CostEstimate::default();
    for (i, step) in module.steps.iter().enumerate() {
        let Some(cost) = module.step_cost(i) else {
            continue;
        };
        let dtype = step
            .outputs
            .first()
            .map_or(mslc_core::ops::DType::F32, |&o| {
                module.values[o as usize].ty.dtype
            });
        let bytes = cost.bytes_read + cost.bytes_written;
        let compute = cost.flops as f64 / target.peak(dtype).max(1.0);
        let memory = bytes as f64 / target.bandwidth.max(1.0);
        if compute >= memory {
            est.compute_bound_steps += 1;
        }
        est.flops += cost.flops;
        est.bytes_moved += bytes;
        est.seconds += compute.max(memory);
    }
    est
}
