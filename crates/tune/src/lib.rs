//! The kernel auto-tuner behind `mslc tune`: for every distinct kernel signature of a module,
//! a measured search of the kernel's parameters on this machine, guided by a cost model learned
//! as it goes, with every candidate checked against the reference kernel; results kept in a
//! knowledge base keyed by signature and device fingerprint, which `mslc build` reads to fill
//! the kernel table; and, per fused subgraph, whether it runs faster fused or unfused, which
//! `mslc build` hands to the fusion pass.
//!
//! - [`case`]: a signature as a tuning problem, with seeded inputs.
//! - [`space`]: a kernel's parameter space, from the binding's parameter structs.
//! - [`measure`]: running, checking and timing a candidate (the [`measure::CandidateRunner`]
//!   seam).
//! - [`reference`]: the reference output a candidate must match.
//! - [`model`], [`search`]: the learned cost model and the evolutionary search.
//! - [`tuner`]: a module's run — budget split, knowledge base reuse, progress.
//! - [`graph`]: graph-level tuning — per fused subgraph, fused or unfused, measured by the
//!   executor.
//! - [`confirm`]: whole-model confirmation — the tuned forward against the default's.
//! - [`kb`], [`device`]: the knowledge base file and the device fingerprint.
//! - [`budget`]: the `--budget` value.

#![deny(missing_docs)]

pub mod budget;
pub mod case;
pub mod confirm;
pub mod device;
pub mod graph;
pub mod kb;
pub mod measure;
pub mod model;
pub mod reference;
pub mod search;
pub mod space;
pub mod tuner;

#[cfg(test)]
mod tests;
