//! The tolerances the training tests of both test binaries (tests/it and tests/mpi_train.rs)
//! compare with: the error of every element weighed against the tensor's largest magnitude,
//! so an element near zero is not held to its own tiny scale, and for final weights also the
//! error of the tensor as a whole.

/// How close (of each tensor's largest magnitude, [`assert_rel_to_max`]) the tiny LLaMA's
/// weights after ten AdamW steps at lr 1e-2 on several ranks come to one device's, where the
/// ranks (or micro-batches) each sum their part of a gradient before the parts are added: that
/// fp32 reassociation is ~1e-7 relative in a gradient, and AdamW's `m / √v` turns it into up to
/// a few 1e-5 of a tensor's largest weight where an element's gradient is near zero (measured:
/// 2.5e-5 on two data-parallel ranks, 9e-6 under tensor parallelism, ~2e-5 on two pipeline
/// stages; the replicas' and the stages' rounding is that of accumulating micro-batches: one
/// device accumulating the same micro-batches gives their weights bit for bit, tests/it's
/// ranks.rs and pipeline.rs); the losses stay within 1e-5.
pub const ADAMW_WEIGHTS_TOL: f64 = 1e-4;

/// ‖got − want‖∞ ≤ tol · ‖want‖∞.
pub fn assert_rel_to_max(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    let scale = want.iter().fold(0f64, |m, x| m.max(x.abs()));
    let err = got
        .iter()
        .zip(want)
        .fold(0f64, |m, (g, w)| m.max((g - w).abs()));
    assert!(
        err <= tol * scale,
        "{what}: max error {err:e} > {tol:e} × {scale:e}\n got {got:?}\nwant {want:?}"
    );
}

/// How close a multi-rank run's final weight tensor comes to one device's as a whole
/// (‖got − want‖₂ ≤ tol · ‖want‖₂, [`assert_rel_to_norm`]): issue 11's 1e-5, which tests/it's
/// weight comparisons hold, its AdamW runs too (worst measured 5.1e-6, the 8-rank mix's
/// `model.layers.0.mlp.down_proj.weight`): the few near-zero-gradient elements
/// [`ADAMW_WEIGHTS_TOL`] is about move a tensor's norm far less than its largest element.
pub const WEIGHTS_NORM_TOL: f64 = 1e-5;

/// ‖got − want‖₂ ≤ tol · ‖want‖₂.
pub fn assert_rel_to_norm(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    let norm = want.iter().map(|w| w * w).sum::<f64>().sqrt();
    let err = got
        .iter()
        .zip(want)
        .map(|(g, w)| (g - w) * (g - w))
        .sum::<f64>()
        .sqrt();
    assert!(
        err <= tol * norm,
        "{what}: error norm {err:e} > {tol:e} × {norm:e} (relative {:e})",
        err / norm
    );
}

/// A multi-rank run's final weight tensor against one device's: every element within
/// `elementwise` of the tensor's largest magnitude ([`assert_rel_to_max`]), and the tensor
/// within `norm` in norm ([`assert_rel_to_norm`]; [`WEIGHTS_NORM_TOL`] unless stated).
pub fn assert_same_weights(what: &str, got: &[f64], want: &[f64], (elementwise, norm): (f64, f64)) {
    assert_rel_to_max(what, got, want, elementwise);
    assert_rel_to_norm(what, got, want, norm);
}
