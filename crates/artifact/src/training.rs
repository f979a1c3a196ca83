//! The scalar inputs of a training module's interface (docs/mir-format.md, "Training
//! modules"): the names the training loop sets before each step, defined here, with the
//! format, so that the loop that builds and runs such modules and the executor that seeds one
//! run without data read the same names.

/// Input: the learning rate of this update.
pub const LR: &str = "train.lr";
/// Input (Adam): `lr / (1 − β1^t)` for update `t` (from 1).
pub const STEP_SIZE: &str = "train.step_size";
/// Input (Adam): `√(1 − β2^t)` for update `t` (from 1).
pub const BC2_SQRT: &str = "train.bias_correction2_sqrt";
/// Input (loss scaling): the scale this step multiplies its loss by.
pub const LOSS_SCALE: &str = "train.loss_scale";
/// The scalar inputs the loop sets before each step (those the module has).
pub const SCALAR_INPUTS: [&str; 4] = [LR, STEP_SIZE, BC2_SQRT, LOSS_SCALE];
/// The scalar inputs that scale the update: with each 0, a step computes its gradients and
/// optimizer states and leaves the parameters as they are.
pub const STEP_SCALES: [&str; 2] = [LR, STEP_SIZE];
