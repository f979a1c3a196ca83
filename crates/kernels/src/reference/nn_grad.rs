//! Reference backward kernels of the neural-net ops: the norms' input gradients, embedding's
//! table gradient, attention's log-sum-exp rows and q/k/v gradients, conv2d's input and weight
//! gradients and the pools' input gradients. Written straight from the chain rule, in f64.

use super::nn::{attention_dims, causal_visible};
use crate::conv::{Conv2dAttrs, Conv2dCall};
use crate::error::{KernelError, KernelResult};
use crate::pool::{
    adaptive_output_shape, adaptive_range, pool2d_output_shape, Pool2dAttrs, PoolKind,
};
use crate::shape::check_len;
use crate::tensor::{Tensor, TensorRef};

/// Applies `f(x_row, dy_row) -> dx_row` to every last-dim row, in f64.
fn per_row_pair(
    op: &'static str,
    x: TensorRef<'_>,
    dy: TensorRef<'_>,
    mut f: impl FnMut(&[f64], &[f64]) -> Vec<f64>,
) -> KernelResult<Tensor> {
    check_len(op, "x", x.data.len(), x.shape)?;
    if dy.shape != x.shape || dy.data.len() != x.data.len() {
        return Err(KernelError::new(
            op,
            format!("dy {:?} must have x's shape {:?}", dy.shape, x.shape),
        ));
    }
    let d = *x
        .shape
        .last()
        .ok_or_else(|| KernelError::new(op, "needs at least one dimension"))?;
    let mut data = Vec::with_capacity(x.data.len());
    if d > 0 {
        for (xr, gr) in x.data.chunks(d).zip(dy.data.chunks(d)) {
            let xr: Vec<f64> = xr.iter().map(|&v| v as f64).collect();
            let gr: Vec<f64> = gr.iter().map(|&v| v as f64).collect();
            data.extend(f(&xr, &gr).into_iter().map(|v| v as f32));
        }
    }
    Tensor::new(op, x.shape.to_vec(), data)
}

/// `rms_norm_grad`: with `r = rsqrt(mean(x²) + eps)`, `dx = r·dy − x·r³·mean(dy·x)`.
pub fn rms_norm_grad(x: TensorRef<'_>, dy: TensorRef<'_>, eps: f64) -> KernelResult<Tensor> {
    per_row_pair("rms_norm_grad", x, dy, |x, g| {
        let n = x.len() as f64;
        let r = 1.0 / (x.iter().map(|v| v * v).sum::<f64>() / n + eps).sqrt();
        let c = x.iter().zip(g).map(|(a, b)| a * b).sum::<f64>() / n * r * r * r;
        x.iter().zip(g).map(|(xi, gi)| r * gi - xi * c).collect()
    })
}

/// `layer_norm_grad`: with `x̂ = (x − mean)·r`, `dx = r·(dy − mean(dy) − x̂·mean(dy·x̂))`.
pub fn layer_norm_grad(x: TensorRef<'_>, dy: TensorRef<'_>, eps: f64) -> KernelResult<Tensor> {
    per_row_pair("layer_norm_grad", x, dy, |x, g| {
        let n = x.len() as f64;
        let mean = x.iter().sum::<f64>() / n;
        let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
        let r = 1.0 / (var + eps).sqrt();
        let xhat: Vec<f64> = x.iter().map(|v| (v - mean) * r).collect();
        let gm = g.iter().sum::<f64>() / n;
        let gx = g.iter().zip(&xhat).map(|(a, b)| a * b).sum::<f64>() / n;
        g.iter()
            .zip(&xhat)
            .map(|(gi, xi)| r * (gi - gm - xi * gx))
            .collect()
    })
}

/// `rms_norm_scale_grad` (`centered` false) / `layer_norm_affine_grad` (true) of
/// `y = norm(x)·w (+ b)` with `w` `[H]`: `[dx, dw]` (and `db` for the layer norm), where `dx` is
/// the norm's input gradient of `dy·w`, `dw = Σ dy·x̂` and `db = Σ dy` over the rows.
pub fn norm_affine_grad(
    centered: bool,
    x: TensorRef<'_>,
    w: TensorRef<'_>,
    dy: TensorRef<'_>,
    eps: f64,
) -> KernelResult<Vec<Tensor>> {
    const OP: &str = "norm_affine_grad";
    let d = x.shape.last().copied().unwrap_or(0);
    if w.shape != [d] {
        return Err(KernelError::new(
            OP,
            format!("w {:?} must be [{d}]", w.shape),
        ));
    }
    let wf: Vec<f64> = w.data.iter().map(|&v| f64::from(v)).collect();
    let (mut dw, mut db) = (vec![0f64; d], vec![0f64; d]);
    let dx = per_row_pair(OP, x, dy, |x, g| {
        let n = x.len() as f64;
        let mean = if centered {
            x.iter().sum::<f64>() / n
        } else {
            0.0
        };
        let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
        let r = 1.0 / (var + eps).sqrt();
        let xhat: Vec<f64> = x.iter().map(|v| (v - mean) * r).collect();
        let dn: Vec<f64> = g.iter().zip(&wf).map(|(g, w)| g * w).collect();
        let dn_mean = if centered {
            dn.iter().sum::<f64>() / n
        } else {
            0.0
        };
        let dn_xhat = dn.iter().zip(&xhat).map(|(a, b)| a * b).sum::<f64>() / n;
        for j in 0..x.len() {
            dw[j] += g[j] * xhat[j];
            db[j] += g[j];
        }
        dn.iter()
            .zip(&xhat)
            .map(|(dn, xh)| r * (dn - dn_mean - xh * dn_xhat))
            .collect()
    })?;
    let param = |v: Vec<f64>| Tensor::new(OP, vec![d], v.into_iter().map(|v| v as f32).collect());
    let mut out = vec![dx, param(dw)?];
    if centered {
        out.push(param(db)?);
    }
    Ok(out)
}

/// Checks `embedding_grad`'s operands and returns the feature width `H`.
pub fn embedding_grad_width(
    op: &'static str,
    ids: &[i64],
    ids_shape: &[usize],
    dy: TensorRef<'_>,
    vocab: usize,
) -> KernelResult<usize> {
    check_len(op, "ids", ids.len(), ids_shape)?;
    check_len(op, "dy", dy.data.len(), dy.shape)?;
    let h = match dy.shape.split_last() {
        Some((&h, lead)) if lead == ids_shape => h,
        _ => {
            return Err(KernelError::new(
                op,
                format!("dy {:?} must be ids {ids_shape:?} plus one dim", dy.shape),
            ))
        }
    };
    if let Some(bad) = ids.iter().find(|&&id| id < 0 || id as u64 >= vocab as u64) {
        return Err(KernelError::new(
            op,
            format!("id {bad} is outside the table of {vocab} rows"),
        ));
    }
    Ok(h)
}

/// `embedding_grad`: `[vocab, H]`, row v the sum of the dy rows whose id is v.
pub fn embedding_grad(
    ids: &[i64],
    ids_shape: &[usize],
    dy: TensorRef<'_>,
    vocab: usize,
) -> KernelResult<Tensor> {
    let h = embedding_grad_width("embedding_grad", ids, ids_shape, dy, vocab)?;
    let mut acc = vec![0.0f64; vocab * h];
    for (p, &id) in ids.iter().enumerate() {
        let row = &mut acc[id as usize * h..][..h];
        for (a, &g) in row.iter_mut().zip(&dy.data[p * h..][..h]) {
            *a += g as f64;
        }
    }
    Tensor::new(
        "embedding_grad",
        vec![vocab, h],
        acc.into_iter().map(|v| v as f32).collect(),
    )
}

/// One attention problem read as f64 closures over its operands.
struct Attn<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    dims: (usize, usize, usize, usize, usize, usize),
    causal: bool,
    scale: f64,
}

impl Attn<'_> {
    /// The scaled score of query `i`, head `h` against key `j` of batch `b`, or `None` when
    /// the mask hides it.
    fn score(&self, b: usize, h: usize, i: usize, j: usize) -> Option<f64> {
        let (_, s, t, hq, hkv, d) = self.dims;
        if self.causal && !causal_visible(i, j, s, t) {
            return None;
        }
        let kh = h / (hq / hkv);
        let qr = &self.q[((b * s + i) * hq + h) * d..][..d];
        let kr = &self.k[((b * t + j) * hkv + kh) * d..][..d];
        Some(
            qr.iter()
                .zip(kr)
                .map(|(&a, &c)| a as f64 * c as f64)
                .sum::<f64>()
                * self.scale,
        )
    }

    /// The log-sum-exp of query `i`, head `h`'s visible scores (-inf when none is).
    fn lse(&self, b: usize, h: usize, i: usize) -> f64 {
        let t = self.dims.2;
        let scores: Vec<f64> = (0..t).filter_map(|j| self.score(b, h, i, j)).collect();
        let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if m == f64::NEG_INFINITY {
            return m;
        }
        m + scores.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
    }
}

fn attn<'a>(
    q: TensorRef<'a>,
    k: TensorRef<'a>,
    v: TensorRef<'a>,
    causal: bool,
    scale: Option<f64>,
) -> KernelResult<Attn<'a>> {
    let dims = attention_dims(q, k, v)?;
    Ok(Attn {
        q: q.data,
        k: k.data,
        v: v.data,
        dims,
        causal,
        scale: scale.unwrap_or(1.0 / (dims.5 as f64).sqrt()),
    })
}

/// `attention_lse`: `[B, S, Hq]`, each query row's log-sum-exp of its scaled visible scores.
pub fn attention_lse(
    q: TensorRef<'_>,
    k: TensorRef<'_>,
    v: TensorRef<'_>,
    causal: bool,
    scale: Option<f64>,
) -> KernelResult<Tensor> {
    let a = attn(q, k, v, causal, scale)?;
    let (b, s, _, hq, _, _) = a.dims;
    let mut data = Vec::with_capacity(b * s * hq);
    for bi in 0..b {
        for i in 0..s {
            for h in 0..hq {
                data.push(a.lse(bi, h, i) as f32);
            }
        }
    }
    Tensor::new("attention_lse", vec![b, s, hq], data)
}

/// `attention_grad` for input `wrt` (0 q, 1 k, 2 v): with `P = softmax(scores)`, `dP = dout·vᵀ`
/// and `dS = P ∘ (dP − rowsum(dout ∘ out))`: `dq = scale·dS·k`, `dk = scale·dSᵀ·q`,
/// `dv = Pᵀ·dout`, kv gradients summed over each group's query heads. The weights come from the
/// scores and `lse` (the f64 recomputation, so `out` and `lse` are trusted as given).
#[allow(clippy::too_many_arguments)]
pub fn attention_grad(
    q: TensorRef<'_>,
    k: TensorRef<'_>,
    v: TensorRef<'_>,
    out: TensorRef<'_>,
    dout: TensorRef<'_>,
    lse: TensorRef<'_>,
    causal: bool,
    scale: Option<f64>,
    wrt: usize,
) -> KernelResult<Tensor> {
    const OP: &str = "attention_grad";
    let a = attn(q, k, v, causal, scale)?;
    let (b, s, t, hq, hkv, d) = a.dims;
    for (what, x) in [("out", out), ("dout", dout)] {
        if x.shape != q.shape || x.data.len() != q.data.len() {
            return Err(KernelError::new(OP, format!("{what} must have q's shape")));
        }
    }
    if lse.shape != [b, s, hq] || lse.data.len() != b * s * hq {
        return Err(KernelError::new(
            OP,
            format!("lse must be [{b}, {s}, {hq}]"),
        ));
    }
    let group = hq / hkv;
    let target = [q, k, v][wrt.min(2)];
    let mut acc = vec![0.0f64; target.data.len()];
    let row = |x: &[f32], bi: usize, i: usize, h: usize, heads: usize, len: usize| -> Vec<f64> {
        x[((bi * len + i) * heads + h) * d..][..d]
            .iter()
            .map(|&z| z as f64)
            .collect()
    };
    for bi in 0..b {
        for h in 0..hq {
            let kh = h / group;
            for i in 0..s {
                let l = lse.data[(bi * s + i) * hq + h] as f64;
                let go = row(dout.data, bi, i, h, hq, s);
                let o = row(out.data, bi, i, h, hq, s);
                let delta: f64 = go.iter().zip(&o).map(|(x, y)| x * y).sum();
                for j in 0..t {
                    let Some(sc) = a.score(bi, h, i, j) else {
                        continue;
                    };
                    let p = (sc - l).exp();
                    let vr = row(a.v, bi, j, kh, hkv, t);
                    let dp: f64 = go.iter().zip(&vr).map(|(x, y)| x * y).sum();
                    let ds = p * (dp - delta);
                    let (dst, src, coef) = match wrt {
                        0 => (((bi * s + i) * hq + h) * d, row(a.k, bi, j, kh, hkv, t), ds),
                        1 => (((bi * t + j) * hkv + kh) * d, row(a.q, bi, i, h, hq, s), ds),
                        _ => (((bi * t + j) * hkv + kh) * d, go.clone(), p),
                    };
                    let coef = if wrt == 2 { coef } else { coef * a.scale };
                    for (slot, x) in acc[dst..dst + d].iter_mut().zip(&src) {
                        *slot += coef * x;
                    }
                }
            }
        }
    }
    Tensor::new(
        OP,
        target.shape.to_vec(),
        acc.into_iter().map(|z| z as f32).collect(),
    )
}

/// Visits every (input, weight, output) index triple of a conv2d of `x_shape` by `w_shape`:
/// `f(x_index, w_index, y_index)` for each tap that lands inside the input.
fn for_each_tap(
    x_shape: [usize; 4],
    w_shape: [usize; 4],
    y_shape: [usize; 4],
    a: &Conv2dAttrs,
    mut f: impl FnMut(usize, usize, usize),
) {
    let [n, c, h, w] = x_shape;
    let [o, cg, kh, kw] = w_shape;
    let [_, _, oh, ow] = y_shape;
    let og = o / a.groups;
    for ni in 0..n {
        for oc in 0..o {
            let g = oc / og;
            for oy in 0..oh {
                for ox in 0..ow {
                    let yi = ((ni * o + oc) * oh + oy) * ow + ox;
                    for ci in 0..cg {
                        let ic = g * cg + ci;
                        for ky in 0..kh {
                            let iy = (oy * a.stride[0] + ky * a.dilation[0]) as isize
                                - a.padding[0] as isize;
                            if iy < 0 || iy as usize >= h {
                                continue;
                            }
                            for kx in 0..kw {
                                let ix = (ox * a.stride[1] + kx * a.dilation[1]) as isize
                                    - a.padding[1] as isize;
                                if ix < 0 || ix as usize >= w {
                                    continue;
                                }
                                let xi = ((ni * c + ic) * h + iy as usize) * w + ix as usize;
                                let wi = ((oc * cg + ci) * kh + ky) * kw + kx;
                                f(xi, wi, yi);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Reads a rank-4 shape.
fn dims4(op: &'static str, what: &str, shape: &[usize]) -> KernelResult<[usize; 4]> {
    match *shape {
        [a, b, c, d] => Ok([a, b, c, d]),
        _ => Err(KernelError::new(
            op,
            format!("{what} must be rank 4, got {shape:?}"),
        )),
    }
}

/// `conv2d_grad_input`: `dx [N, C, H, W]` (`size = [H, W]`) of a conv2d by `w` from `dy`.
pub fn conv2d_grad_input(
    dy: TensorRef<'_>,
    w: TensorRef<'_>,
    a: &Conv2dAttrs,
    size: [usize; 2],
) -> KernelResult<Tensor> {
    const OP: &str = "conv2d_grad_input";
    let [n, _, _, _] = dims4(OP, "dy", dy.shape)?;
    let ws = dims4(OP, "w", w.shape)?;
    let xs = [n, ws[1] * a.groups, size[0], size[1]];
    check_len(OP, "w", w.data.len(), w.shape)?;
    let ys = Conv2dCall::of_shapes(OP, &xs, w.shape, a)?.output_shape();
    if dy.shape != ys || dy.data.len() != ys.iter().product::<usize>() {
        return Err(KernelError::new(OP, format!("dy must be {ys:?}")));
    }
    let mut acc = vec![0.0f64; xs.iter().product()];
    for_each_tap(xs, ws, ys, a, |xi, wi, yi| {
        acc[xi] += dy.data[yi] as f64 * w.data[wi] as f64;
    });
    Tensor::new(OP, xs.to_vec(), acc.into_iter().map(|v| v as f32).collect())
}

/// `conv2d_grad_weight`: `dw [O, C/groups, kh, kw]` (`kernel = [kh, kw]`) of a conv2d of `x`
/// from `dy`.
pub fn conv2d_grad_weight(
    x: TensorRef<'_>,
    dy: TensorRef<'_>,
    a: &Conv2dAttrs,
    kernel: [usize; 2],
) -> KernelResult<Tensor> {
    const OP: &str = "conv2d_grad_weight";
    let xs = dims4(OP, "x", x.shape)?;
    check_len(OP, "x", x.data.len(), x.shape)?;
    let [_, o, _, _] = dims4(OP, "dy", dy.shape)?;
    if a.groups == 0 || xs[1] % a.groups != 0 {
        return Err(KernelError::new(OP, "groups must divide the channels"));
    }
    let ws = [o, xs[1] / a.groups, kernel[0], kernel[1]];
    let ys = Conv2dCall::of_shapes(OP, &xs, &ws, a)?.output_shape();
    if dy.shape != ys || dy.data.len() != ys.iter().product::<usize>() {
        return Err(KernelError::new(OP, format!("dy must be {ys:?}")));
    }
    let mut acc = vec![0.0f64; ws.iter().product()];
    for_each_tap(xs, ws, ys, a, |xi, wi, yi| {
        acc[wi] += dy.data[yi] as f64 * x.data[xi] as f64;
    });
    Tensor::new(OP, ws.to_vec(), acc.into_iter().map(|v| v as f32).collect())
}

/// Checks that `dy` is the pool's output `[N, C, oh, ow]`.
fn check_dy(op: &'static str, dy: TensorRef<'_>, want: [usize; 4]) -> KernelResult<()> {
    check_len(op, "dy", dy.data.len(), dy.shape)?;
    if dy.shape != want {
        return Err(KernelError::new(
            op,
            format!("dy {:?} must be the pool's output {want:?}", dy.shape),
        ));
    }
    Ok(())
}

/// `max_pool2d_grad` / `avg_pool2d_grad`: max sends each window's cotangent to the window's
/// first maximum (a NaN wins, a later NaN replaces it, as PyTorch); average spreads it as
/// `dy / (kh·kw)` over the window's cells inside the input.
pub fn pool2d_grad(
    x: TensorRef<'_>,
    dy: TensorRef<'_>,
    kind: PoolKind,
    a: &Pool2dAttrs,
) -> KernelResult<Tensor> {
    const OP: &str = "pool2d_grad";
    let shape = pool2d_output_shape(x, a)?;
    check_dy(OP, dy, shape)?;
    let [n, c, oh, ow] = shape;
    let (h, w) = (x.shape[2], x.shape[3]);
    let mut acc = vec![0.0f64; x.data.len()];
    let divisor = (a.kernel[0] * a.kernel[1]) as f64;
    for plane in 0..n * c {
        for oy in 0..oh {
            let y0 = (oy * a.stride[0]).saturating_sub(a.padding[0]);
            let y1 = (oy * a.stride[0] + a.kernel[0])
                .saturating_sub(a.padding[0])
                .min(h);
            for ox in 0..ow {
                let x0 = (ox * a.stride[1]).saturating_sub(a.padding[1]);
                let x1 = (ox * a.stride[1] + a.kernel[1])
                    .saturating_sub(a.padding[1])
                    .min(w);
                let g = dy.data[(plane * oh + oy) * ow + ox] as f64;
                let cells =
                    (y0..y1).flat_map(|y| (x0..x1).map(move |xx| plane * h * w + y * w + xx));
                match kind {
                    PoolKind::Max => {
                        let mut best = (y0 < y1 && x0 < x1).then_some(plane * h * w + y0 * w + x0);
                        let mut max = f32::NEG_INFINITY;
                        for i in cells {
                            if x.data[i] > max || x.data[i].is_nan() {
                                max = x.data[i];
                                best = Some(i);
                            }
                        }
                        if let Some(i) = best {
                            acc[i] += g;
                        }
                    }
                    PoolKind::Avg => {
                        for i in cells {
                            acc[i] += g / divisor;
                        }
                    }
                }
            }
        }
    }
    Tensor::new(
        OP,
        x.shape.to_vec(),
        acc.into_iter().map(|v| v as f32).collect(),
    )
}

/// `adaptive_avg_pool2d_grad`: each output cell's cotangent spread evenly over its bin.
pub fn adaptive_avg_pool2d_grad(
    x: TensorRef<'_>,
    dy: TensorRef<'_>,
    output: [usize; 2],
) -> KernelResult<Tensor> {
    const OP: &str = "adaptive_avg_pool2d_grad";
    let shape = adaptive_output_shape(x, output)?;
    check_dy(OP, dy, shape)?;
    let [n, c, oh, ow] = shape;
    let (h, w) = (x.shape[2], x.shape[3]);
    let mut acc = vec![0.0f64; x.data.len()];
    for plane in 0..n * c {
        for oy in 0..oh {
            let (y0, y1) = adaptive_range(oy, oh, h);
            for ox in 0..ow {
                let (x0, x1) = adaptive_range(ox, ow, w);
                let g =
                    dy.data[(plane * oh + oy) * ow + ox] as f64 / ((y1 - y0) * (x1 - x0)) as f64;
                for y in y0..y1 {
                    for xx in x0..x1 {
                        acc[plane * h * w + y * w + xx] += g;
                    }
                }
            }
        }
    }
    Tensor::new(
        OP,
        x.shape.to_vec(),
        acc.into_iter().map(|v| v as f32).collect(),
    )
}
