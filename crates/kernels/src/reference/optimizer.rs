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
    const OP: &str = "adam_update";
    for (name, x) in [("p", p), ("g", g), ("m", m), ("v", v)] {
        check_len(OP, name, x.data.len(), x.shape)?;
        if x.shape != p.shape {
            return Err(KernelError::new(
                OP,
                format!("{name} {:?} must have p's shape {:?}", x.shape, p.shape),
            ));
        }
    }
    let (lr, step_size, bc2_sqrt) = (f64::from(lr), f64::from(step_size), f64::from(bc2_sqrt));
    let AdamAttrs {
        beta1,
        beta2,
        eps,
        weight_decay: wd,
        decoupled,
    } = *attrs;
    let n = p.data.len();
    let mut out = [vec![0f32; n], vec![0f32; n], vec![0f32; n]];
    for i in 0..n {
        let [mut pi, mut gi, mi, vi] = [p, g, m, v].map(|x| f64::from(x.data[i]));
        gi *= f64::from(g_scale);
        if decoupled {
            pi -= lr * wd * pi;
        } else {
            gi += wd * pi;
        }
        let mi = beta1 * mi + (1.0 - beta1) * gi;
        let vi = beta2 * vi + (1.0 - beta2) * gi * gi;
        let pi = pi - step_size * mi / (vi.sqrt() / bc2_sqrt + eps);
        for (o, x) in out.iter_mut().zip([pi, mi, vi]) {
            o[i] = x as f32;
        }
    }
    Ok(out
        .into_iter()
        .map(|data| Tensor {
            shape: p.shape.to_vec(),
            data,
        })
        .collect())
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
    const OP: &str = "sgd_update";
    for (name, x) in [("p", p), ("g", g), ("buf", buf)] {
        check_len(OP, name, x.data.len(), x.shape)?;
        if x.shape != p.shape {
            return Err(KernelError::new(
                OP,
                format!("{name} {:?} must have p's shape {:?}", x.shape, p.shape),
            ));
        }
    }
    let (lr, g_scale) = (f64::from(lr), f64::from(g_scale));
    let n = p.data.len();
    let mut out = [vec![0f32; n], vec![0f32; n]];
    for i in 0..n {
        let [pi, gi, bi] = [p, g, buf].map(|x| f64::from(x.data[i]));
        let gi = gi * g_scale + weight_decay * pi;
        let bi = momentum * bi + gi;
        let d = if nesterov { gi + momentum * bi } else { bi };
        for (o, x) in out.iter_mut().zip([pi - lr * d, bi]) {
            o[i] = x as f32;
        }
    }
    Ok(out
        .into_iter()
        .map(|data| Tensor {
            shape: p.shape.to_vec(),
            data,
        })
        .collect())
}
