//! The CPU executor ("NPU"): runs a compiled module step by step on the kernels of
//! [`mslc_kernels`], with one arena for every intermediate, weights from safetensors or a
//! seeded init, inputs from `.npy`, and a per-step profile.

mod buffer;
pub mod collectives;
mod error;
mod executor;
pub mod init;
mod inputs;
pub mod limits;
pub mod numerics;
mod profile;
pub mod runner;
mod storage;
pub mod weights;

pub use error::{ExecError, ExecErrorKind, ExecResult};
pub use executor::{ExecOptions, Executor, Seeded, Stored};
pub use profile::StepTime;
