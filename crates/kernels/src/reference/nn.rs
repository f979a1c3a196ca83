//! Reference transformer ops: embedding, rope, attention, causal_mask.

use crate::error::{KernelError, KernelResult};
use crate::shape::check_len;
use crate::tensor::{Tensor, TensorRef};

/// `embedding`: row `ids[i]` of `table [V, H]` for every id; output `[..., H]`.
pub fn embedding(ids: &[i64], ids_shape: &[usize], table: TensorRef<'_>) -> KernelResult<Tensor> {
    check_len("embedding", "ids", ids.len(), ids_shape)?;
    check_len("embedding", "table", table.data.len(), table.shape)?;
    let &[v, h] = table.shape else {
        return Err(KernelError::new(
            "embedding",
            format!("table must be [V, H], got {:?}", table.shape),
        ));
    };
    let mut data = Vec::with_capacity(ids.len() * h);
    for &id in ids {
        if id < 0 || id as u64 >= v as u64 {
            return Err(KernelError::new(
                "embedding",
                format!("id {id} is outside the table of {v} rows"),
            ));
        }
        let r = id as usize;
        data.extend_from_slice(&table.data[r * h..(r + 1) * h]);
    }
    let mut shape = ids_shape.to_vec();
    shape.push(h);
    Tensor::new("embedding", shape, data)
}

/// Checks a `[B, S, heads, D]` tensor and returns its dims.
pub fn dims4(op: &'static str, what: &str, x: TensorRef<'_>) -> KernelResult<[usize; 4]> {
    check_len(op, what, x.data.len(), x.shape)?;
    match *x.shape {
        [b, s, h, d] => Ok([b, s, h, d]),
        _ => Err(KernelError::new(
            op,
            format!("{what} must be [B, S, heads, D], got {:?}", x.shape),
        )),
    }
}

/// `rope`, rotate-half form (HF LLaMA): for position s and i < D/2, with
/// `f = theta^(-2i/D)`, `out[i] = x[i] cos(sf) - x[i + D/2] sin(sf)` and
/// `out[i + D/2] = x[i + D/2] cos(sf) + x[i] sin(sf)`.
pub fn rope(x: TensorRef<'_>, theta: f64) -> KernelResult<Tensor> {
    let [_, _, _, d] = dims4("rope", "x", x)?;
    if theta.is_nan() || theta <= 0.0 {
        return Err(KernelError::new(
            "rope",
            format!("theta {theta} must be positive"),
        ));
    }
    rotate_half(x, |pos, i| {
        let (sin, cos) = (pos as f64 * theta.powf(-2.0 * i as f64 / d as f64)).sin_cos();
        (cos, sin)
    })
}

/// `rope_cached(x, table)`: the rotation of [`rope`] with the cosines and sines read from
/// `table` (`[2, S, D/2]`: every position's cosines, then its sines).
pub fn rope_cached(x: TensorRef<'_>, table: TensorRef<'_>) -> KernelResult<Tensor> {
    let [_, s, _, d] = dims4("rope", "x", x)?;
    let half = d / 2;
    if table.shape != [2, s, half] || table.data.len() != 2 * s * half {
        return Err(KernelError::new(
            "rope",
            format!(
                "the table {:?} does not fit x {:?} (want [2, {s}, {half}])",
                table.shape, x.shape
            ),
        ));
    }
    let (cos, sin) = table.data.split_at(s * half);
    rotate_half(x, |pos, i| {
        (
            f64::from(cos[pos * half + i]),
            f64::from(sin[pos * half + i]),
        )
    })
}

/// Rotates each head vector of `x` (`[B, S, H, D]`, D even) in halves, in f64, with the
/// (cos, sin) of position s and frequency i given by `angle(s, i)`.
fn rotate_half(
    x: TensorRef<'_>,
    angle: impl Fn(usize, usize) -> (f64, f64),
) -> KernelResult<Tensor> {
    let [b, s, h, d] = dims4("rope", "x", x)?;
    if d % 2 != 0 {
        return Err(KernelError::new(
            "rope",
            format!("head dim {d} must be even"),
        ));
    }
    let half = d / 2;
    let mut data = vec![0.0f32; x.data.len()];
    for bi in 0..b {
        for pos in 0..s {
            for hi in 0..h {
                let base = ((bi * s + pos) * h + hi) * d;
                for i in 0..half {
                    let (cos, sin) = angle(pos, i);
                    let x1 = x.data[base + i] as f64;
                    let x2 = x.data[base + i + half] as f64;
                    data[base + i] = (x1 * cos - x2 * sin) as f32;
                    data[base + i + half] = (x2 * cos + x1 * sin) as f32;
                }
            }
        }
    }
    Tensor::new("rope", x.shape.to_vec(), data)
}

/// Checks q, k, v of `attention` and returns `(B, S, T, Hq, Hkv, D)`.
pub fn attention_dims(
    q: TensorRef<'_>,
    k: TensorRef<'_>,
    v: TensorRef<'_>,
) -> KernelResult<(usize, usize, usize, usize, usize, usize)> {
    let [b, s, hq, d] = dims4("attention", "q", q)?;
    let [bk, t, hkv, dk] = dims4("attention", "k", k)?;
    if v.shape != k.shape || v.data.len() != k.data.len() {
        return Err(KernelError::new(
            "attention",
            format!("v {:?} must have k's shape {:?}", v.shape, k.shape),
        ));
    }
    if bk != b || dk != d {
        return Err(KernelError::new(
            "attention",
            format!(
                "k {:?} does not match q {:?} in batch or head dim",
                k.shape, q.shape
            ),
        ));
    }
    if hkv == 0 || hq % hkv != 0 {
        return Err(KernelError::new(
            "attention",
            format!("{hkv} kv heads do not divide {hq} query heads"),
        ));
    }
    Ok((b, s, t, hq, hkv, d))
}

/// Whether query `i` of `s` may see key `j` of `t`: causal alignment puts the last query on the
/// last key, so query i sees keys `j <= i + t - s`.
pub fn causal_visible(i: usize, j: usize, s: usize, t: usize) -> bool {
    j + s <= i + t
}

/// `attention`: `softmax(q kᵀ · scale [+ causal mask]) v` per (batch, query head), query head h
/// reading kv head `h / (Hq / Hkv)`; scale defaults to 1/√D. A query that sees no key (causal
/// with S > T) yields zeros.
pub fn attention(
    q: TensorRef<'_>,
    k: TensorRef<'_>,
    v: TensorRef<'_>,
    causal: bool,
    scale: Option<f64>,
) -> KernelResult<Tensor> {
    let (b, s, t, hq, hkv, d) = attention_dims(q, k, v)?;
    let scale = scale.unwrap_or(1.0 / (d as f64).sqrt());
    let group = hq / hkv;
    let mut data = vec![0.0f32; q.data.len()];
    for bi in 0..b {
        for h in 0..hq {
            let kh = h / group;
            for i in 0..s {
                let qrow = &q.data[((bi * s + i) * hq + h) * d..][..d];
                let visible: Vec<usize> = (0..t)
                    .filter(|&j| !causal || causal_visible(i, j, s, t))
                    .collect();
                let scores: Vec<f64> = visible
                    .iter()
                    .map(|&j| {
                        let krow = &k.data[((bi * t + j) * hkv + kh) * d..][..d];
                        qrow.iter()
                            .zip(krow)
                            .map(|(&a, &b)| a as f64 * b as f64)
                            .sum::<f64>()
                            * scale
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|&x| (x - max).exp()).collect();
                let total: f64 = weights.iter().sum();
                let out = &mut data[((bi * s + i) * hq + h) * d..][..d];
                for (c, o) in out.iter_mut().enumerate() {
                    let acc: f64 = visible
                        .iter()
                        .zip(&weights)
                        .map(|(&j, &w)| w * v.data[((bi * t + j) * hkv + kh) * d + c] as f64)
                        .sum();
                    *o = if visible.is_empty() {
                        0.0
                    } else {
                        (acc / total) as f32
                    };
                }
            }
        }
    }
    Tensor::new("attention", q.shape.to_vec(), data)
}

/// `causal_mask`: `[size, size]`, 0 on and below the diagonal, -inf above.
pub fn causal_mask(size: usize) -> Tensor {
    let data = (0..size * size)
        .map(|i| {
            if i % size > i / size {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    Tensor {
        shape: vec![size, size],
        data,
    }
}
