//! The f64 semantics of the nn ops (norms, embedding, rope, attention, convolution, pools) and
//! of their backward ops, for the gradient tests; `eval64` delegates every op it does not know
//! here. Written straight from the definitions (docs/ops.md), independently of the kernels.

use super::tensor64::T64;
use mslc_core::ops::{resolve_attrs, Attrs, Op};

type R<T> = Result<T, String>;

/// `op` applied to `inputs` in f64, or an error for an op this module does not implement.
pub fn eval_op(op: Op, attrs: &Attrs, inputs: &[&T64]) -> Result<Vec<T64>, String> {
    let a = resolve_attrs(op, attrs).map_err(|e| e.message)?;
    let x = inputs;
    let eps = || a.float("eps").map_err(|e| e.message);
    let norm = |f: fn(&[f64], &[f64], f64) -> Vec<f64>| -> R<T64> {
        let eps = eps()?;
        Ok(if x.len() == 1 {
            rows2(x[0], x[0], |r, _| f(r, &[], eps))
        } else {
            rows2(x[0], x[1], |r, g| f(r, g, eps))
        })
    };
    let out = match op {
        Op::RmsNorm => norm(|r, _, eps| rms(r, eps).0)?,
        Op::LayerNorm => norm(|r, _, eps| layer(r, eps).0)?,
        Op::RmsNormScale | Op::LayerNormAffine => {
            let f = if op == Op::RmsNormScale { rms } else { layer };
            let eps = eps()?;
            let mut y = rows2(x[0], x[0], |r, _| f(r, eps).0);
            let shape = y.shape.clone();
            for (i, v) in y.data.iter_mut().enumerate() {
                let idx = T64::unravel(i, &shape);
                *v *= x[1].at_broadcast(&idx);
                if let Some(b) = x.get(2) {
                    *v += b.at_broadcast(&idx);
                }
            }
            y
        }
        Op::RmsNormScaleGrad => return Ok(affine_norm_grads(x, eps()?, rms, rms_grad, false)),
        Op::LayerNormAffineGrad => {
            return Ok(affine_norm_grads(x, eps()?, layer, layer_grad, true))
        }
        Op::RmsNormGrad => norm(rms_grad)?,
        Op::LayerNormGrad => norm(layer_grad)?,
        Op::BatchNorm => batch_norm(x[0], x[1], x[2], eps()?),
        Op::Embedding => embedding(x[0], x[1])?,
        Op::EmbeddingGrad => embedding_grad(x[0], x[1], int(&a, "vocab")?)?,
        Op::Rope => {
            let table = rope_table(
                a.float("theta").map_err(|e| e.message)?,
                x[0].shape[1],
                x[0].shape[3],
            );
            rope_cached(x[0], &table)
        }
        Op::RopeTable => rope_table(
            a.float("theta").map_err(|e| e.message)?,
            int(&a, "positions")?,
            int(&a, "dim")?,
        ),
        Op::RopeCached => rope_cached(x[0], x[1]),
        Op::Attention => Attn::new(x, &a)?.forward().0,
        Op::AttentionLse => {
            let (out, lse) = Attn::new(x, &a)?.forward();
            return Ok(vec![out, lse]);
        }
        Op::AttentionGrad => {
            let attn = Attn::new(x, &a)?;
            return (0..3).map(|wrt| attn.grad(x[3], x[4], x[5], wrt)).collect();
        }
        Op::Conv2d => {
            let c = Conv::new(x[0].shape.clone(), x[1].shape.clone(), &a)?;
            let mut y = zeros(&c.y);
            c.taps(|xi, wi, yi| y.data[yi] += x[0].data[xi] * x[1].data[wi]);
            y
        }
        Op::Conv2dGradInput => {
            let (dy, w) = (x[0], x[1]);
            let size = ints(&a, "size")?;
            let groups = int(&a, "groups")?;
            let xs = vec![dy.shape[0], w.shape[1] * groups, size[0], size[1]];
            let c = Conv::new(xs, w.shape.clone(), &a)?;
            let mut dx = zeros(&c.x);
            c.taps(|xi, wi, yi| dx.data[xi] += dy.data[yi] * w.data[wi]);
            dx
        }
        Op::Conv2dGradWeight => {
            let (xv, dy) = (x[0], x[1]);
            let k = ints(&a, "kernel")?;
            let groups = int(&a, "groups")?;
            let ws = vec![dy.shape[1], xv.shape[1] / groups, k[0], k[1]];
            let c = Conv::new(xv.shape.clone(), ws, &a)?;
            let mut dw = zeros(&c.w);
            c.taps(|xi, wi, yi| dw.data[wi] += dy.data[yi] * xv.data[xi]);
            dw
        }
        Op::MaxPool2d | Op::AvgPool2d => {
            let p = Pool::new(x[0], &a)?;
            let max = op == Op::MaxPool2d;
            let mut y = zeros(&p.y);
            p.windows(|yi, cells| {
                y.data[yi] = if max {
                    x[0].data[first_max(x[0], cells)]
                } else {
                    cells.iter().map(|&c| x[0].data[c]).sum::<f64>() / p.divisor
                }
            });
            y
        }
        Op::MaxPool2dGrad | Op::AvgPool2dGrad => {
            let p = Pool::new(x[0], &a)?;
            let mut dx = zeros(&x[0].shape);
            p.windows(|yi, cells| {
                if op == Op::MaxPool2dGrad {
                    dx.data[first_max(x[0], cells)] += x[1].data[yi];
                } else {
                    for &c in cells {
                        dx.data[c] += x[1].data[yi] / p.divisor;
                    }
                }
            });
            dx
        }
        Op::AdaptiveAvgPool2d => {
            let o = ints(&a, "output")?;
            let mut y = zeros(&[x[0].shape[0], x[0].shape[1], o[0], o[1]]);
            adaptive(&x[0].shape, [o[0], o[1]], |yi, cells| {
                y.data[yi] = cells.iter().map(|&c| x[0].data[c]).sum::<f64>() / cells.len() as f64
            });
            y
        }
        Op::AdaptiveAvgPool2dGrad => {
            let o = ints(&a, "output")?;
            let mut dx = zeros(&x[0].shape);
            adaptive(&x[0].shape, [o[0], o[1]], |yi, cells| {
                for &c in cells {
                    dx.data[c] += x[1].data[yi] / cells.len() as f64;
                }
            });
            dx
        }
        _ => return Err(format!("the f64 evaluator does not know `{op}`")),
    };
    Ok(vec![out])
}

/// A tensor of zeros.
fn zeros(shape: &[usize]) -> T64 {
    T64::new(shape, vec![0.0; shape.iter().product()])
}

fn int(a: &Attrs, name: &str) -> R<usize> {
    let v = a.int(name).map_err(|e| e.message)?;
    usize::try_from(v).map_err(|_| format!("`{name}` = {v}"))
}

fn ints(a: &Attrs, name: &str) -> R<Vec<usize>> {
    a.ints(name)
        .map_err(|e| e.message)?
        .into_iter()
        .map(|v| usize::try_from(v).map_err(|_| format!("`{name}` has {v}")))
        .collect()
}

/// `f` on every pair of last-dim rows of `x` and `g`.
fn rows2(x: &T64, g: &T64, f: impl Fn(&[f64], &[f64]) -> Vec<f64>) -> T64 {
    let d = x.shape.last().copied().unwrap_or(1).max(1);
    let data = x
        .data
        .chunks(d)
        .zip(g.data.chunks(d))
        .flat_map(|(a, b)| f(a, b))
        .collect();
    T64::new(&x.shape, data)
}

/// The gradients of `y = norm(x)·w (+ b)` for a per-feature `w` (inputs x, w, dy): the norm's vector-Jacobian
/// product `vjp` of `dy·w`, `Σ dy·norm(x)` over the rows and, `with_bias`, `Σ dy`.
fn affine_norm_grads(
    inputs: &[&T64],
    eps: f64,
    norm: fn(&[f64], f64) -> (Vec<f64>, f64),
    vjp: fn(&[f64], &[f64], f64) -> Vec<f64>,
    with_bias: bool,
) -> Vec<T64> {
    let (x, w, dy) = (inputs[0], inputs[1], inputs[2]);
    let d = w.data.len();
    let scaled: Vec<f64> = dy
        .data
        .iter()
        .enumerate()
        .map(|(i, g)| g * w.data[i % d])
        .collect();
    let dx = rows2(x, &T64::new(&dy.shape, scaled), |r, g| vjp(r, g, eps));
    let (mut dw, mut db) = (vec![0.0; d], vec![0.0; d]);
    for (r, g) in x.data.chunks(d).zip(dy.data.chunks(d)) {
        for (j, n) in norm(r, eps).0.into_iter().enumerate() {
            dw[j] += g[j] * n;
            db[j] += g[j];
        }
    }
    let mut out = vec![dx, T64::new(&w.shape, dw)];
    if with_bias {
        out.push(T64::new(&w.shape, db));
    }
    out
}

/// `rms_norm` of a row and its `rsqrt(mean(x²) + eps)`.
fn rms(r: &[f64], eps: f64) -> (Vec<f64>, f64) {
    let inv = 1.0 / (r.iter().map(|v| v * v).sum::<f64>() / r.len() as f64 + eps).sqrt();
    (r.iter().map(|v| v * inv).collect(), inv)
}

/// `layer_norm` of a row and its `rsqrt(var + eps)`.
fn layer(r: &[f64], eps: f64) -> (Vec<f64>, f64) {
    let n = r.len() as f64;
    let mean = r.iter().sum::<f64>() / n;
    let var = r.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    let inv = 1.0 / (var + eps).sqrt();
    (r.iter().map(|v| (v - mean) * inv).collect(), inv)
}

/// The vector-Jacobian product of `rms_norm` at row `r`: `Jᵀ g` with
/// `J_ij = inv·δ_ij − x_i·x_j·inv³/n`.
fn rms_grad(r: &[f64], g: &[f64], eps: f64) -> Vec<f64> {
    let (_, inv) = rms(r, eps);
    let n = r.len() as f64;
    (0..r.len())
        .map(|j| {
            (0..r.len())
                .map(|i| {
                    let d = if i == j { inv } else { 0.0 };
                    g[i] * (d - r[i] * r[j] * inv.powi(3) / n)
                })
                .sum()
        })
        .collect()
}

/// The vector-Jacobian product of `layer_norm` at row `r`, from the Jacobian
/// `J_ij = inv·(δ_ij − 1/n − x̂_i·x̂_j/n)`.
fn layer_grad(r: &[f64], g: &[f64], eps: f64) -> Vec<f64> {
    let (xhat, inv) = layer(r, eps);
    let n = r.len() as f64;
    (0..r.len())
        .map(|j| {
            (0..r.len())
                .map(|i| {
                    let d = if i == j { 1.0 } else { 0.0 };
                    g[i] * inv * (d - 1.0 / n - xhat[i] * xhat[j] / n)
                })
                .sum()
        })
        .collect()
}

fn batch_norm(x: &T64, mean: &T64, var: &T64, eps: f64) -> T64 {
    let c = x.shape[1];
    let inner: usize = x.shape[2..].iter().product();
    let data = x
        .data
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let ch = i / inner.max(1) % c;
            (v - mean.data[ch]) / (var.data[ch] + eps).sqrt()
        })
        .collect();
    T64::new(&x.shape, data)
}

fn embedding(ids: &T64, table: &T64) -> R<T64> {
    let (v, h) = (table.shape[0], table.shape[1]);
    let mut data = Vec::new();
    for &id in &ids.data {
        if id < 0.0 || id as usize >= v {
            return Err(format!("id {id} outside {v} rows"));
        }
        data.extend_from_slice(&table.data[id as usize * h..][..h]);
    }
    let mut shape = ids.shape.clone();
    shape.push(h);
    Ok(T64::new(&shape, data))
}

fn embedding_grad(ids: &T64, dy: &T64, vocab: usize) -> R<T64> {
    let h = *dy.shape.last().unwrap_or(&0);
    let mut out = zeros(&[vocab, h]);
    for (p, &id) in ids.data.iter().enumerate() {
        if id < 0.0 || id as usize >= vocab {
            return Err(format!("id {id} outside {vocab} rows"));
        }
        for c in 0..h {
            out.data[id as usize * h + c] += dy.data[p * h + c];
        }
    }
    Ok(out)
}

/// `[2, positions, dim/2]`: cos, then sin, of `pos · theta^(-2i/dim)`.
fn rope_table(theta: f64, positions: usize, dim: usize) -> T64 {
    let half = dim / 2;
    let mut t = zeros(&[2, positions, half]);
    for p in 0..positions {
        for i in 0..half {
            let angle = p as f64 * theta.powf(-2.0 * i as f64 / dim as f64);
            t.data[p * half + i] = angle.cos();
            t.data[(positions + p) * half + i] = angle.sin();
        }
    }
    t
}

/// Rotate-half rope of `x [B, S, H, D]` with the table's cosines and sines.
fn rope_cached(x: &T64, table: &T64) -> T64 {
    let [b, s, h, d] = [x.shape[0], x.shape[1], x.shape[2], x.shape[3]];
    let half = d / 2;
    let mut out = x.clone();
    for bi in 0..b {
        for p in 0..s {
            for hi in 0..h {
                let base = ((bi * s + p) * h + hi) * d;
                for i in 0..half {
                    let (c, sn) = (table.data[p * half + i], table.data[(s + p) * half + i]);
                    let (x1, x2) = (x.data[base + i], x.data[base + i + half]);
                    out.data[base + i] = x1 * c - x2 * sn;
                    out.data[base + i + half] = x2 * c + x1 * sn;
                }
            }
        }
    }
    out
}

/// One attention problem in f64.
struct Attn<'a> {
    q: &'a T64,
    k: &'a T64,
    v: &'a T64,
    causal: bool,
    scale: f64,
}

impl<'a> Attn<'a> {
    fn new(x: &[&'a T64], a: &Attrs) -> R<Self> {
        let d = x[0].shape[3];
        Ok(Attn {
            q: x[0],
            k: x[1],
            v: x[2],
            causal: a.bool("causal").map_err(|e| e.message)?,
            scale: a
                .opt_float("scale")
                .map_err(|e| e.message)?
                .unwrap_or(1.0 / (d as f64).sqrt()),
        })
    }

    fn dims(&self) -> (usize, usize, usize, usize, usize, usize) {
        let (q, k) = (&self.q.shape, &self.k.shape);
        (q[0], q[1], k[1], q[2], k[2], q[3])
    }

    fn row<'t>(&self, x: &'t T64, b: usize, i: usize, h: usize) -> &'t [f64] {
        let (len, heads, d) = (x.shape[1], x.shape[2], x.shape[3]);
        &x.data[((b * len + i) * heads + h) * d..][..d]
    }

    /// The attention weights of query `i`, head `h` (zero where masked), and their log-sum-exp.
    fn weights(&self, b: usize, h: usize, i: usize) -> (Vec<f64>, f64) {
        let (_, s, t, hq, hkv, _) = self.dims();
        let kh = h / (hq / hkv);
        let qr = self.row(self.q, b, i, h);
        let scores: Vec<Option<f64>> = (0..t)
            .map(|j| {
                (!self.causal || j + s <= i + t).then(|| {
                    let kr = self.row(self.k, b, j, kh);
                    qr.iter().zip(kr).map(|(x, y)| x * y).sum::<f64>() * self.scale
                })
            })
            .collect();
        let m = scores
            .iter()
            .flatten()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max);
        if m == f64::NEG_INFINITY {
            return (vec![0.0; t], m);
        }
        let lse = m + scores
            .iter()
            .flatten()
            .map(|x| (x - m).exp())
            .sum::<f64>()
            .ln();
        let p = scores
            .iter()
            .map(|x| x.map_or(0.0, |x| (x - lse).exp()))
            .collect();
        (p, lse)
    }

    /// The output and the `[B, S, Hq]` log-sum-exp rows.
    fn forward(&self) -> (T64, T64) {
        let (b, s, _, hq, hkv, d) = self.dims();
        let mut out = zeros(&self.q.shape);
        let mut lse = zeros(&[b, s, hq]);
        for bi in 0..b {
            for i in 0..s {
                for h in 0..hq {
                    let (p, l) = self.weights(bi, h, i);
                    lse.data[(bi * s + i) * hq + h] = l;
                    for (j, pj) in p.iter().enumerate() {
                        let vr = self.row(self.v, bi, j, h / (hq / hkv));
                        let at = ((bi * s + i) * hq + h) * d;
                        for (o, vc) in out.data[at..at + d].iter_mut().zip(vr) {
                            *o += pj * vc;
                        }
                    }
                }
            }
        }
        (out, lse)
    }

    /// The gradient w.r.t. input `wrt`, from the softmax Jacobian directly (the weights
    /// recomputed here; `out` and `lse` are checked against this module's forward).
    fn grad(&self, out: &T64, dout: &T64, lse: &T64, wrt: usize) -> R<T64> {
        let (fwd, l) = self.forward();
        let close = |a: &T64, b: &T64| {
            a.data
                .iter()
                .zip(&b.data)
                .all(|(x, y)| x == y || (x - y).abs() <= 1e-9 * (1.0 + y.abs()))
        };
        if !close(out, &fwd) || !close(lse, &l) {
            return Err("attention_grad given an out or lse its q, k, v do not give".into());
        }
        let (b, s, t, hq, hkv, d) = self.dims();
        let target = [self.q, self.k, self.v][wrt];
        let mut g = zeros(&target.shape);
        for bi in 0..b {
            for i in 0..s {
                for h in 0..hq {
                    let kh = h / (hq / hkv);
                    let (p, _) = self.weights(bi, h, i);
                    let go = self.row(dout, bi, i, h);
                    let dp: Vec<f64> = (0..t)
                        .map(|j| {
                            go.iter()
                                .zip(self.row(self.v, bi, j, kh))
                                .map(|(x, y)| x * y)
                                .sum()
                        })
                        .collect();
                    let mix: f64 = p.iter().zip(&dp).map(|(x, y)| x * y).sum();
                    for j in 0..t {
                        let ds = p[j] * (dp[j] - mix) * self.scale;
                        let (at, src, coef) = match wrt {
                            0 => (((bi * s + i) * hq + h) * d, self.row(self.k, bi, j, kh), ds),
                            1 => (
                                ((bi * t + j) * hkv + kh) * d,
                                self.row(self.q, bi, i, h),
                                ds,
                            ),
                            _ => (((bi * t + j) * hkv + kh) * d, go, p[j]),
                        };
                        for (o, x) in g.data[at..at + d].iter_mut().zip(src) {
                            *o += coef * x;
                        }
                    }
                }
            }
        }
        Ok(g)
    }
}

/// One conv2d geometry: shapes of x, w, y and the window.
struct Conv {
    x: Vec<usize>,
    w: Vec<usize>,
    y: Vec<usize>,
    stride: Vec<usize>,
    padding: Vec<usize>,
    dilation: Vec<usize>,
    groups: usize,
}

impl Conv {
    fn new(x: Vec<usize>, w: Vec<usize>, a: &Attrs) -> R<Conv> {
        let (stride, padding, dilation) = (
            ints(a, "stride")?,
            ints(a, "padding")?,
            ints(a, "dilation")?,
        );
        let out = |i: usize| {
            (x[2 + i] + 2 * padding[i] - dilation[i] * (w[2 + i] - 1) - 1) / stride[i] + 1
        };
        let y = vec![x[0], w[0], out(0), out(1)];
        Ok(Conv {
            x,
            w,
            y,
            stride,
            padding,
            dilation,
            groups: int(a, "groups")?,
        })
    }

    /// `f(x_index, w_index, y_index)` for every tap inside the input.
    fn taps(&self, mut f: impl FnMut(usize, usize, usize)) {
        let ([n, c, h, wd], [o, cg, kh, kw], [_, _, oh, ow]) = (
            [self.x[0], self.x[1], self.x[2], self.x[3]],
            [self.w[0], self.w[1], self.w[2], self.w[3]],
            [self.y[0], self.y[1], self.y[2], self.y[3]],
        );
        let og = o / self.groups;
        for ni in 0..n {
            for oc in 0..o {
                for oy in 0..oh {
                    for ox in 0..ow {
                        for ci in 0..cg {
                            let ic = oc / og * cg + ci;
                            for ky in 0..kh {
                                for kx in 0..kw {
                                    let iy = (oy * self.stride[0] + ky * self.dilation[0]) as i64
                                        - self.padding[0] as i64;
                                    let ix = (ox * self.stride[1] + kx * self.dilation[1]) as i64
                                        - self.padding[1] as i64;
                                    if iy < 0 || ix < 0 || iy as usize >= h || ix as usize >= wd {
                                        continue;
                                    }
                                    f(
                                        ((ni * c + ic) * h + iy as usize) * wd + ix as usize,
                                        ((oc * cg + ci) * kh + ky) * kw + kx,
                                        ((ni * o + oc) * oh + oy) * ow + ox,
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// One max/avg pool geometry.
struct Pool {
    x: Vec<usize>,
    y: Vec<usize>,
    kernel: Vec<usize>,
    stride: Vec<usize>,
    padding: Vec<usize>,
    divisor: f64,
}

impl Pool {
    fn new(x: &T64, a: &Attrs) -> R<Pool> {
        let kernel = ints(a, "kernel")?;
        let stride = match a.opt_ints("stride").map_err(|e| e.message)? {
            Some(_) => ints(a, "stride")?,
            None => kernel.clone(),
        };
        let padding = ints(a, "padding")?;
        let out = |i: usize| (x.shape[2 + i] + 2 * padding[i] - kernel[i]) / stride[i] + 1;
        Ok(Pool {
            x: x.shape.clone(),
            y: vec![x.shape[0], x.shape[1], out(0), out(1)],
            divisor: (kernel[0] * kernel[1]) as f64,
            kernel,
            stride,
            padding,
        })
    }

    /// `f(y_index, cells)` with each window's cells inside the input, row-major.
    fn windows(&self, mut f: impl FnMut(usize, &[usize])) {
        let (h, w) = (self.x[2] as i64, self.x[3] as i64);
        let (oh, ow) = (self.y[2], self.y[3]);
        for plane in 0..self.x[0] * self.x[1] {
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut cells = Vec::new();
                    for ky in 0..self.kernel[0] {
                        for kx in 0..self.kernel[1] {
                            let iy = (oy * self.stride[0] + ky) as i64 - self.padding[0] as i64;
                            let ix = (ox * self.stride[1] + kx) as i64 - self.padding[1] as i64;
                            if (0..h).contains(&iy) && (0..w).contains(&ix) {
                                cells.push(plane * (h * w) as usize + (iy * w + ix) as usize);
                            }
                        }
                    }
                    f((plane * oh + oy) * ow + ox, &cells);
                }
            }
        }
    }
}

/// The first cell holding the window's maximum (PyTorch's tie rule).
fn first_max(x: &T64, cells: &[usize]) -> usize {
    let mut best = cells[0];
    for &c in cells {
        if x.data[c] > x.data[best] {
            best = c;
        }
    }
    best
}

/// `f(y_index, cells)` over PyTorch's adaptive bins: `[⌊i·H/o⌋, ⌈(i+1)·H/o⌉)`.
fn adaptive(shape: &[usize], o: [usize; 2], mut f: impl FnMut(usize, &[usize])) {
    let (h, w) = (shape[2], shape[3]);
    for plane in 0..shape[0] * shape[1] {
        for oy in 0..o[0] {
            for ox in 0..o[1] {
                let (y0, y1) = (oy * h / o[0], ((oy + 1) * h).div_ceil(o[0]));
                let (x0, x1) = (ox * w / o[1], ((ox + 1) * w).div_ceil(o[1]));
                let cells: Vec<usize> = (y0..y1)
                    .flat_map(|y| (x0..x1).map(move |x| plane * h * w + y * w + x))
                    .collect();
                f((plane * o[0] + oy) * o[1] + ox, &cells);
            }
        }
    }
}
