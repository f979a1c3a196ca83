//! The reference optimizer updates: one Adam / AdamW step (`adam_update`) and one step of SGD
//! with momentum (`sgd_update`), written from `torch.optim`'s formulas element by element, in
//! f64.

use crate::error::{KernelError, KernelResult};
use crate::shape::check_len;
use crate::tensor::{Tensor, TensorRef};

/// `adam_update`'s attributes (docs/ops.md): the moments' decay rates, the eps added to the
/// root of v, the weight decay, and whether that decay is AdamW's decoupled `p − lr·wd·p`
/// (else Adam's `g + wd·p`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamAttrs {
    /// β1, the first moment's decay rate.
    pub beta1: f64,
    /// β2, the second moment's decay rate.
    pub beta2: f64,
    /// Added to the bias-corrected root of v.
    pub eps: f64,
    /// The weight decay (0: none).
    pub weight_decay: f64,
    /// AdamW's decoupled decay.
    pub decoupled: bool,
}

/// The new `[p, m, v]` of one Adam / AdamW step from `[p, g, m, v]` (one shape) and the
/// step's scalars `[lr, step_size, bc2_sqrt, g_scale]` (`step_size = lr / (1 − β1^t)`,
/// `bc2_sqrt = √(1 − β2^t)`, the gradient multiplied by `g_scale` first).
pub fn adam_update(
    [p, g, m, v]: [TensorRef<'_>; 4],
    [lr, step_size, bc2_sqrt, g_scale]: [f32; 4],
    attrs: &AdamAttrs,
) -> KernelResult<Vec<Tensor>> {
    let (lr, step_size, bc2_sqrt) = (f64::from(lr), f64::from(step_size), f64::from(bc2_sqrt));
    let AdamAttrs {
        beta1,
        beta2,
        eps,
        weight_decay: wd,
        decoupled,
    } = *attrs;
    let names = ["p", "g", "m", "v"];
    per_element("adam_update", names, [p, g, m, v], |[mut p, g, m, v]| {
        let mut g = g * f64::from(g_scale);
        if decoupled {
            p -= lr * wd * p;
        } else {
            g += wd * p;
        }
        let m = beta1 * m + (1.0 - beta1) * g;
        let v = beta2 * v + (1.0 - beta2) * g * g;
        [p - step_size * m / (v.sqrt() / bc2_sqrt + eps), m, v]
    })
}

/// The new `[p, buf]` of one step of SGD with momentum (`torch.optim.SGD`, dampening 0) from
/// `[p, g, buf]` (one shape), the attributes `[momentum, weight_decay]`, `nesterov`, and the
/// step's scalars `[lr, g_scale]` (the gradient multiplied by `g_scale` first).
pub fn sgd_update(
    [p, g, buf]: [TensorRef<'_>; 3],
    [momentum, weight_decay]: [f64; 2],
    nesterov: bool,
    [lr, g_scale]: [f32; 2],
) -> KernelResult<Vec<Tensor>> {
    let (lr, g_scale) = (f64::from(lr), f64::from(g_scale));
    per_element(
        "sgd_update",
        ["p", "g", "buf"],
        [p, g, buf],
        |[p, g, buf]| {
            let g = g * g_scale + weight_decay * p;
            let buf = momentum * buf + g;
            let d = if nesterov { g + momentum * buf } else { buf };
            [p - lr * d, buf]
        },
    )
}

/// An update's `O` results, element by element in f64 from its `I` tensors (`names`, one shape,
/// p's first).
fn per_element<const I: usize, const O: usize>(
    op: &'static str,
    names: [&str; I],
    inputs: [TensorRef<'_>; I],
    f: impl Fn([f64; I]) -> [f64; O],
) -> KernelResult<Vec<Tensor>> {
    let shape = inputs[0].shape;
    for (name, x) in names.into_iter().zip(inputs) {
        check_len(op, name, x.data.len(), x.shape)?;
        if x.shape != shape {
            return Err(KernelError::new(
                op,
                format!("{name} {:?} must have p's shape {shape:?}", x.shape),
            ));
        }
    }
    let n = inputs[0].data.len();
    let mut out: Vec<Vec<f32>> = vec![Vec::with_capacity(n); O];
    for i in 0..n {
        let results = f(inputs.map(|x| f64::from(x.data[i])));
        for (o, x) in out.iter_mut().zip(results) {
            o.push(x as f32);
        }
    }
    Ok(out
        .into_iter()
        .map(|data| Tensor {
            shape: shape.to_vec(),
            data,
        })
        .collect())
}
