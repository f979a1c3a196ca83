//! One scheduled step's kernel: [`prepare`](prepare::prepare)d once from the op, its attributes
//! and its kernel choice, [`run`](prepare::StepKernel::run) on each call, and the staging and
//! scratch it needs ([`needs`]) — one definition that the executor allocates by and the memory
//! plan reports.

pub mod dispatch;
pub mod needs;
pub mod prepare;

pub use dispatch::{Operands, MAX_OUTPUTS};
pub use needs::{OperandMode, Staging};
pub use prepare::{
    prepare, runs_in_place, CollectiveStep, DropoutBlock, StepKernel, IN_PLACE_COLLECTIVE_MIN,
};
