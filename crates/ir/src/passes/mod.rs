//! Optimisation passes over the graph IR. Each pass is a value implementing [`Pass`]; a
//! [`PassManager`] runs them in order (with fixpoint groups), times them, verifies the IR
//! after each one when asked, and collects every rewrite under a label such as
//! `fuse.matmul_bias_act` — rewrites as data, so a report can say what changed and why.

mod amp;
mod cast_cleanup;
mod cse;
mod dce;
mod fold;
mod fuse;
mod manager;
mod rewrite;
mod simplify;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::Serialize;

use crate::Graph;
use mslc_core::ops::OpError;

pub use amp::{Amp, AmpConfig, AmpLevel};
pub use cast_cleanup::CastCleanup;
pub use cse::Cse;
pub use dce::Dce;
pub use fold::Fold;
pub use fuse::{Fuse, FuseNorms};
pub use manager::{PassManager, PassTiming, PipelineReport};
pub use simplify::Simplify;

/// What every pass sees besides the graph: whether to verify after each pass, whether fusion
/// is wanted, whether the graph is for training (dropout is live), and the mixed-precision
/// policy, if any.
#[derive(Clone, Debug, PartialEq)]
pub struct PassContext {
    /// Run the IR verifier after every pass.
    pub verify: bool,
    /// Let the `fuse` pass rewrite (it does nothing when false).
    pub fuse: bool,
    /// The graph will be trained: dropout is not the identity.
    pub training: bool,
    /// Mixed precision to apply, if any.
    pub amp: Option<AmpConfig>,
    /// Signatures of fused ops (`fused_elementwise`, `fused_matmul`, `rms_norm_scale`,
    /// `layer_norm_affine`) whose patterns stay unfused (a tuning decision: their ops run faster
    /// on their own kernels here); the fusion pass keeps their ops as they are.
    pub unfused: BTreeSet<String>,
}

impl Default for PassContext {
    /// Verification in debug builds, fusion on, inference, no mixed precision.
    fn default() -> Self {
        PassContext {
            verify: cfg!(debug_assertions),
            fuse: true,
            training: false,
            amp: None,
            unfused: BTreeSet::new(),
        }
    }
}

/// A failed pass: which one, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PassError {
    /// The pass's name.
    pub pass: String,
    /// What went wrong.
    pub message: String,
}

impl PassError {
    /// An error of pass `pass`.
    pub fn new(pass: &str, message: impl Into<String>) -> PassError {
        PassError {
            pass: pass.to_string(),
            message: message.into(),
        }
    }

    /// Wraps a registry error raised while pass `pass` rewrote the graph.
    pub fn from_op(pass: &str, e: OpError) -> PassError {
        PassError::new(pass, e.message)
    }
}

impl fmt::Display for PassError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pass `{}`: {}", self.pass, self.message)
    }
}

impl std::error::Error for PassError {}

/// The rewrites one pass run made, counted by label (`"<pass>.<rewrite>"`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PassStats {
    /// Count per label.
    pub rewrites: BTreeMap<String, usize>,
}

impl PassStats {
    /// Records one rewrite named `label` made by pass `pass`.
    pub fn record(&mut self, pass: &str, label: &str) {
        *self.rewrites.entry(format!("{pass}.{label}")).or_default() += 1;
    }

    /// Total rewrites made.
    pub fn total(&self) -> usize {
        self.rewrites.values().sum()
    }

    /// Whether the pass changed nothing.
    pub fn is_empty(&self) -> bool {
        self.rewrites.is_empty()
    }
}

/// A graph-to-graph rewrite with a name the pipeline and the CLI refer to it by.
pub trait Pass: Send + Sync {
    /// Short name (`"fuse"`), unique among passes.
    fn name(&self) -> &'static str;
    /// One line saying what it does, for `mslc build --passes`.
    fn description(&self) -> &'static str;
    /// Rewrites `g`, returning what it changed. The graph must still verify afterwards.
    fn run(&self, g: &mut Graph, cx: &PassContext) -> Result<PassStats, PassError>;
}

/// Every pass, in the order of the default pipeline's first appearance.
pub fn all_passes() -> Vec<Box<dyn Pass>> {
    vec![
        Box::new(Fold),
        Box::new(Simplify),
        Box::new(Cse),
        Box::new(Dce),
        Box::new(Amp),
        Box::new(CastCleanup),
        Box::new(Fuse),
    ]
}

/// The pass called `name`, if there is one.
pub fn pass_by_name(name: &str) -> Option<Box<dyn Pass>> {
    all_passes().into_iter().find(|p| p.name() == name)
}

/// `(name, description)` of every pass, for listing.
pub fn pass_descriptions() -> Vec<(&'static str, &'static str)> {
    all_passes()
        .iter()
        .map(|p| (p.name(), p.description()))
        .collect()
}

/// The cleanup group run to a fixpoint between the bigger passes.
fn cleanup() -> Vec<Box<dyn Pass>> {
    vec![
        Box::new(Fold),
        Box::new(Simplify),
        Box::new(Cse),
        Box::new(Dce),
    ]
}

/// Iteration cap of the default pipeline's fixpoint groups; each group settles in two or
/// three rounds on real models.
const FIXPOINT_CAP: usize = 8;

/// What a training step runs on its forward graph before differentiating it. With a
/// mixed-precision policy, the front of [`default_pipeline`]: clean up, place the casts, tidy
/// them — so the backward reuses the forward's casts and differentiates them, and the passes
/// after autodiff (the default pipeline without a policy) cast nothing of the optimizer's f32
/// update. Then, when `cx.fuse`, [`FuseNorms`].
pub fn training_forward_pipeline(cx: &PassContext) -> PassManager {
    let mut pm = PassManager::new();
    if cx.amp.is_some() {
        pm = pm
            .fixpoint(cleanup(), FIXPOINT_CAP)
            .then(Box::new(Amp))
            .then(Box::new(CastCleanup));
    }
    if cx.fuse {
        pm = pm.then(Box::new(FuseNorms));
    }
    pm
}

/// The standard order: clean up; apply the mixed-precision policy if there is one; tidy casts
/// and clean up again (folding casts of constants); then, when `cx.fuse`, fuse and clean up
/// once more (cancelling the layout transposes fusion put around `attention` against the
/// model's own).
pub fn default_pipeline(cx: &PassContext) -> PassManager {
    let mut pm = PassManager::new().fixpoint(cleanup(), FIXPOINT_CAP);
    if cx.amp.is_some() {
        pm = pm.then(Box::new(Amp));
    }
    pm = pm
        .then(Box::new(CastCleanup))
        .fixpoint(cleanup(), FIXPOINT_CAP);
    if cx.fuse {
        pm = pm.then(Box::new(Fuse)).fixpoint(cleanup(), FIXPOINT_CAP);
    }
    pm
}
