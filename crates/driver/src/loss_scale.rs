//! Loss scaling between the steps of a mixed-precision training run, as MindSpore's managers
//! do it (`mindspore/amp.py`, `mindspore/nn/wrap/loss_scale.py`): the scale a step multiplies its
//! loss by, whether a step whose gradients are not all finite is skipped, and how the scale
//! moves afterwards.
//!
//! - `none`: no scaling and no finiteness check (a non-finite gradient is applied, as without a
//!   manager in MindSpore or a `GradScaler` in PyTorch).
//! - `fixed(S)` (`FixedLossScaleManager`): scale `S`; with `drop_overflow_update` (the default) a
//!   step with a non-finite gradient is skipped, and the scale never changes.
//! - `dynamic(init, factor, window)` (`DynamicLossScaleManager.update_loss_scale`): on a
//!   non-finite gradient the step is skipped and the scale becomes `max(scale / factor, 1)`;
//!   after `window` consecutive finite steps it is multiplied by `factor` (and the count starts
//!   again). This is also `torch.cuda.amp.GradScaler`'s rule, with MindSpore's floor of 1.
//!
//! A skipped step leaves the parameters and optimizer states untouched and does not count as an
//! optimizer update: Adam's step `t` and the learning-rate schedule advance only with applied
//! updates, as in MindSpore, whose `TrainOneStepWithLossScaleCell` does not call the optimizer
//! (and so neither advances its `global_step` nor its `beta1_power`) on overflow, and as
//! `GradScaler.step` does for `torch.optim.Adam`'s `state["step"]`.

use serde::{Deserialize, Serialize};

use mslc_core::precision::LossScale;

/// Where the loss scaling is between steps; saved in a checkpoint's `state.json`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScaleState {
    /// The scale the next step multiplies its loss by (1 without loss scaling).
    pub loss_scale: f64,
    /// Finite steps since the last overflow or the last growth of a dynamic scale.
    pub good_steps: u64,
}

/// How a run scales its loss: the train's loss-scale manager (by default none).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossScaler(pub LossScale);

impl Default for LossScaler {
    fn default() -> Self {
        LossScaler(LossScale::None)
    }
}

impl LossScaler {
    /// The state before the first step.
    pub fn initial(self) -> ScaleState {
        let loss_scale = match self.0 {
            LossScale::None => 1.0,
            LossScale::Fixed { scale, .. } => scale,
            LossScale::Dynamic { init, .. } => init,
        };
        ScaleState {
            loss_scale,
            good_steps: 0,
        }
    }

    /// Whether a step multiplies its loss by a scale (an input of the training module).
    pub fn scales(self) -> bool {
        self != LossScaler(LossScale::None)
    }

    /// Whether a step with a non-finite gradient is skipped, so the module must report one.
    pub fn skips_overflow(self) -> bool {
        match self.0 {
            LossScale::None => false,
            LossScale::Fixed {
                drop_overflow_update,
                ..
            } => drop_overflow_update,
            LossScale::Dynamic { .. } => true,
        }
    }

    /// Moves `state` past a step whose gradients were all finite (`overflow` false) or not;
    /// returns whether the step's update is skipped.
    pub fn after_step(self, state: &mut ScaleState, overflow: bool) -> bool {
        match self.0 {
            LossScale::None => false,
            LossScale::Fixed {
                drop_overflow_update,
                ..
            } => overflow && drop_overflow_update,
            LossScale::Dynamic { factor, window, .. } => {
                if overflow {
                    state.loss_scale = (state.loss_scale / factor).max(1.0);
                    state.good_steps = 0;
                } else {
                    state.good_steps += 1;
                    if state.good_steps >= window {
                        state.loss_scale *= factor;
                        state.good_steps = 0;
                    }
                }
                overflow
            }
        }
    }
}

impl std::fmt::Display for LossScaler {
    /// The manager as a `precision` policy writes it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            LossScale::None => write!(f, "none"),
            LossScale::Fixed {
                scale,
                drop_overflow_update,
            } => write!(
                f,
                "fixed(scale: {scale}, drop_overflow_update: {drop_overflow_update})"
            ),
            LossScale::Dynamic {
                init,
                factor,
                window,
            } => write!(
                f,
                "dynamic(init: {init}, factor: {factor}, window: {window})"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dynamic_scaling_backs_off_to_one_and_grows_after_a_window() {
        let scaler = LossScaler(LossScale::Dynamic {
            init: 1024.0,
            factor: 2.0,
            window: 3,
        });
        let mut state = scaler.initial();
        // Three finite steps grow the scale; an overflow halves it and restarts the count; the
        // scale stops at 1.
        let overflows = "000100111111111111000";
        let want = [
            1024.0, 1024.0, 2048.0, 1024.0, 1024.0, 1024.0, 512.0, 256.0, 128.0, 64.0, 32.0, 16.0,
            8.0, 4.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 2.0,
        ];
        for (i, (c, want)) in overflows.chars().zip(want).enumerate() {
            let overflow = c == '1';
            assert_eq!(scaler.after_step(&mut state, overflow), overflow);
            assert_eq!(state.loss_scale, want, "after step {}", i + 1);
        }
        assert_eq!(state.good_steps, 0);
    }

    #[test]
    fn fixed_scaling_skips_only_with_drop_overflow_update() {
        for drop in [true, false] {
            let scaler = LossScaler(LossScale::Fixed {
                scale: 128.0,
                drop_overflow_update: drop,
            });
            let mut state = scaler.initial();
            assert_eq!(scaler.after_step(&mut state, true), drop);
            assert!(!scaler.after_step(&mut state, false));
            assert_eq!(state.loss_scale, 128.0);
            assert_eq!(scaler.skips_overflow(), drop);
        }
        let none = LossScaler(LossScale::None);
        let mut state = none.initial();
        assert!(!none.after_step(&mut state, true));
        assert!(!none.scales() && !none.skips_overflow());
        assert_eq!(state.loss_scale, 1.0);
    }
}
