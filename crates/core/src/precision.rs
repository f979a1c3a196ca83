//! Mixed-precision choices shared by the checker (which reads them from `precision` policies),
//! the IR passes (which place casts by them) and the executor (loss scaling): MindSpore's amp
//! levels, the low-precision type and loss scaling, with MindSpore's defaults.

/// MindSpore's amp levels: how much of the network runs in low precision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub enum AmpLevel {
    /// Everything in f32.
    O0,
    /// Only white-listed ops (matmul, convolutions, …) in low precision.
    O1,
    /// The whole network in low precision except the black list (norms).
    O2,
    /// Everything in low precision.
    O3,
}

impl AmpLevel {
    /// MindSpore's loss scaling for the level: a dynamic manager at O2, none otherwise.
    pub fn default_loss_scale(self) -> LossScale {
        match self {
            AmpLevel::O2 => LossScale::DYNAMIC,
            AmpLevel::O0 | AmpLevel::O1 | AmpLevel::O3 => LossScale::None,
        }
    }

    /// MindSpore's `keep_batchnorm_fp32` for the level: true at O2 only.
    pub fn default_keep_batchnorm_f32(self) -> bool {
        self == AmpLevel::O2
    }
}

/// The low-precision float type the policy computes in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LowPrecision {
    /// IEEE half precision (MindSpore's default).
    F16,
    /// bfloat16.
    BF16,
}

/// How the loss is scaled so small low-precision gradients do not underflow.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LossScale {
    /// No scaling.
    None,
    /// MindSpore's `FixedLossScaleManager`: a constant scale; on overflow the step is skipped
    /// when `drop_overflow_update` is set.
    Fixed {
        scale: f64,
        drop_overflow_update: bool,
    },
    /// MindSpore's `DynamicLossScaleManager`: on overflow the step is skipped and the scale
    /// divided by `factor` (not below 1); after `window` clean steps it is multiplied by it.
    Dynamic { init: f64, factor: f64, window: u64 },
}

impl LossScale {
    /// `FixedLossScaleManager()`'s defaults.
    pub const FIXED: LossScale = LossScale::Fixed {
        scale: FIXED_SCALE,
        drop_overflow_update: FIXED_DROP,
    };

    /// `DynamicLossScaleManager()`'s defaults.
    pub const DYNAMIC: LossScale = LossScale::Dynamic {
        init: DYNAMIC_INIT,
        factor: DYNAMIC_FACTOR,
        window: DYNAMIC_WINDOW,
    };
}

/// `FixedLossScaleManager`'s default `loss_scale`.
pub const FIXED_SCALE: f64 = 128.0;
/// `FixedLossScaleManager`'s default `drop_overflow_update`.
pub const FIXED_DROP: bool = true;
/// `DynamicLossScaleManager`'s default `init_loss_scale` (2^24).
pub const DYNAMIC_INIT: f64 = 16_777_216.0;
/// `DynamicLossScaleManager`'s default `scale_factor`.
pub const DYNAMIC_FACTOR: f64 = 2.0;
/// `DynamicLossScaleManager`'s default `scale_window`.
pub const DYNAMIC_WINDOW: u64 = 2000;
