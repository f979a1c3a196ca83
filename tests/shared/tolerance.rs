//! The tolerance the training tests of both test binaries (tests/it and tests/mpi_train.rs)
//! compare with: the error of every element weighed against the tensor's largest magnitude,
//! so an element near zero is not held to its own tiny scale.

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
