//! The backward of attention, FlashAttention-2 style: the forward's per-row log-sum-exp
//! ([`attention_lse`]) lets [`attention_grad`] rebuild each attention weight from one score
//! `q·k` as `exp(score − lse)`, so no S×T matrix is stored. Each output row (a query position for
//! dq, a key position for dk and dv) is one unit of parallel work that walks the keys (or the
//! queries) it meets, so threads never write the same row and the result does not depend on the
//! thread count. Layout `[B, S, H, D]`, GQA (query head h reads kv head h / (Hq / Hkv)), causal
//! with the last query aligned to the last key.

use super::error::{KernelError, KernelResult};
use super::norm_grad::dot_shifted;
use super::par::{for_each_row_group, RowParams};
use super::reference::nn::{attention_dims, causal_visible};
use super::scratch::with_scratch;
use super::shape::check_len;
use super::tensor::TensorRef;

/// `Σ a·b`.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    dot_shifted(a, b, 0.0)
}

/// `y += a·x`.
fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (o, &v) in y.iter_mut().zip(x) {
        *o += a * v;
    }
}

/// One checked attention problem.
struct Geometry {
    b: usize,
    s: usize,
    t: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    causal: bool,
    scale: f32,
}

impl Geometry {
    fn of(
        q: TensorRef<'_>,
        k: TensorRef<'_>,
        v: TensorRef<'_>,
        causal: bool,
        scale: Option<f64>,
    ) -> KernelResult<Self> {
        let (b, s, t, hq, hkv, d) = attention_dims(q, k, v)?;
        Ok(Self {
            b,
            s,
            t,
            hq,
            hkv,
            d,
            causal,
            scale: scale.unwrap_or(1.0 / (d as f64).sqrt()) as f32,
        })
    }

    /// Row `i` of head `h` of a `[B, len, heads, D]` tensor.
    fn row<'a>(
        &self,
        x: &'a [f32],
        b: usize,
        i: usize,
        h: usize,
        len: usize,
        heads: usize,
    ) -> &'a [f32] {
        &x[((b * len + i) * heads + h) * self.d..][..self.d]
    }

    /// The keys query `i` sees.
    fn keys(&self, i: usize) -> std::ops::Range<usize> {
        if self.causal {
            0..(i + self.t + 1).saturating_sub(self.s).min(self.t)
        } else {
            0..self.t
        }
    }

    /// The queries that see key `j`.
    fn queries(&self, j: usize) -> std::ops::Range<usize> {
        if self.causal {
            (j + self.s).saturating_sub(self.t).min(self.s)..self.s
        } else {
            0..self.s
        }
    }
}

/// `attention_lse(q, k, v)` into `out` (`[B, S, Hq]`): per query row, `m + ln Σ exp(score − m)`
/// over its visible scaled scores, `m` their running maximum (one pass, online); -inf for a row
/// that sees no key.
pub fn attention_lse(
    q: TensorRef<'_>,
    k: TensorRef<'_>,
    v: TensorRef<'_>,
    causal: bool,
    scale: Option<f64>,
    params: &RowParams,
    out: &mut [f32],
) -> KernelResult<()> {
    let g = Geometry::of(q, k, v, causal, scale)?;
    check_len("attention_lse", "out", out.len(), &[g.b, g.s, g.hq])?;
    let work = g.s.saturating_mul(g.t).saturating_mul(g.hq * g.d * g.b);
    for_each_row_group(params, work, out, g.hq, |first, chunk| {
        for (r, row) in chunk.chunks_exact_mut(g.hq).enumerate() {
            let (b, i) = ((first + r) / g.s, (first + r) % g.s);
            for (h, o) in row.iter_mut().enumerate() {
                let qr = g.row(q.data, b, i, h, g.s, g.hq);
                let kh = h / (g.hq / g.hkv);
                let (mut m, mut l) = (f32::NEG_INFINITY, 0.0f32);
                for j in g.keys(i) {
                    let sc = dot(qr, g.row(k.data, b, j, kh, g.t, g.hkv)) * g.scale;
                    if sc > m {
                        l = l * (m - sc).exp() + 1.0;
                        m = sc;
                    } else {
                        l += (sc - m).exp();
                    }
                }
                *o = if l > 0.0 {
                    m + l.ln()
                } else {
                    f32::NEG_INFINITY
                };
            }
        }
    });
    Ok(())
}

/// `attention_grad(q, k, v, out, dout, lse)` for the input `wrt` (0 q, 1 k, 2 v) into `grad`
/// (that input's shape). With `P = exp(score − lse)`, `dP = dout·v` and
/// `dS = P·(dP − dout·out)`: `dq = scale·Σ_j dS·k_j`, `dk = scale·Σ dS·q_i`, `dv = Σ P·dout_i`,
/// the kv sums running over every query head of the kv head's group.
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
    params: &RowParams,
    grad: &mut [f32],
) -> KernelResult<()> {
    const OP: &str = "attention_grad";
    let g = Geometry::of(q, k, v, causal, scale)?;
    for (what, x) in [("out", out), ("dout", dout)] {
        if x.shape != q.shape || x.data.len() != q.data.len() {
            return Err(KernelError::new(
                OP,
                format!("{what} {:?} must have q's shape {:?}", x.shape, q.shape),
            ));
        }
    }
    check_len(OP, "lse", lse.data.len(), &[g.b, g.s, g.hq])?;
    if lse.shape != [g.b, g.s, g.hq] {
        return Err(KernelError::new(
            OP,
            format!("lse {:?} must be [{}, {}, {}]", lse.shape, g.b, g.s, g.hq),
        ));
    }
    let target = match wrt {
        0 => q,
        1 => k,
        2 => v,
        _ => {
            return Err(KernelError::new(
                OP,
                format!("no input {wrt} to differentiate"),
            ))
        }
    };
    check_len(OP, "grad", grad.len(), target.shape)?;
    let work = g.s.saturating_mul(g.t).saturating_mul(g.hq * g.d * g.b);
    let rows = g.b * g.s * g.hq;
    with_scratch(rows, |delta| {
        // delta = rowsum(dout ∘ out), the softmax's correction term, once per query row.
        for (r, dl) in delta.iter_mut().enumerate() {
            let at = r * g.d..(r + 1) * g.d;
            *dl = dot(&dout.data[at.clone()], &out.data[at]);
        }
        let delta: &[f32] = delta;
        if wrt == 0 {
            for_each_row_group(params, work, grad, g.hq * g.d, |first, chunk| {
                chunk.fill(0.0);
                for (r, row) in chunk.chunks_exact_mut(g.hq * g.d).enumerate() {
                    let (b, i) = ((first + r) / g.s, (first + r) % g.s);
                    for (h, dq) in row.chunks_exact_mut(g.d).enumerate() {
                        let at = (b * g.s + i) * g.hq + h;
                        let l = lse.data[at];
                        if l == f32::NEG_INFINITY {
                            continue;
                        }
                        let kh = h / (g.hq / g.hkv);
                        let qr = g.row(q.data, b, i, h, g.s, g.hq);
                        let go = g.row(dout.data, b, i, h, g.s, g.hq);
                        for j in g.keys(i) {
                            let kr = g.row(k.data, b, j, kh, g.t, g.hkv);
                            let p = (dot(qr, kr) * g.scale - l).exp();
                            let dp = dot(go, g.row(v.data, b, j, kh, g.t, g.hkv));
                            axpy(dq, p * (dp - delta[at]) * g.scale, kr);
                        }
                    }
                }
            });
        } else {
            let group = g.hq / g.hkv;
            for_each_row_group(params, work, grad, g.hkv * g.d, |first, chunk| {
                chunk.fill(0.0);
                for (r, row) in chunk.chunks_exact_mut(g.hkv * g.d).enumerate() {
                    let (b, j) = ((first + r) / g.t, (first + r) % g.t);
                    for (kh, acc) in row.chunks_exact_mut(g.d).enumerate() {
                        let kr = g.row(k.data, b, j, kh, g.t, g.hkv);
                        let vr = g.row(v.data, b, j, kh, g.t, g.hkv);
                        for h in kh * group..(kh + 1) * group {
                            for i in g.queries(j) {
                                debug_assert!(!g.causal || causal_visible(i, j, g.s, g.t));
                                let at = (b * g.s + i) * g.hq + h;
                                let l = lse.data[at];
                                let qr = g.row(q.data, b, i, h, g.s, g.hq);
                                let p = (dot(qr, kr) * g.scale - l).exp();
                                let go = g.row(dout.data, b, i, h, g.s, g.hq);
                                if wrt == 2 {
                                    axpy(acc, p, go);
                                } else {
                                    let ds = p * (dot(go, vr) - delta[at]);
                                    axpy(acc, ds * g.scale, qr);
                                }
                            }
                        }
                    }
                }
            });
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference;
    use crate::testing::{assert_close, assert_same_bits, in_pool, Rng};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// lse and the three gradients against the f64 reference (fed the reference's own
        /// forward output and lse), GQA, causal or not, S ≠ T; 1 and 2 threads agree bit for bit.
        /// Tolerance: f32 dot products of at most 16 terms and sums over at most 9·4 scores.
        #[test]
        fn fast_matches_reference(
            b in 1usize..3, s in 1usize..9, t in 1usize..9,
            hkv in 1usize..3, group in 1usize..3, d in 1usize..17,
            causal in any::<bool>(),
            task in prop::sample::select(vec![1usize, 40, 1 << 14]),
            seed in any::<u64>(),
        ) {
            let hq = hkv * group;
            let mut rng = Rng::new(seed);
            let (qs, ks) = ([b, s, hq, d], [b, t, hkv, d]);
            let q = rng.vec(b * s * hq * d, 1.0);
            let k = rng.vec(b * t * hkv * d, 1.0);
            let v = rng.vec(b * t * hkv * d, 1.0);
            let dout = rng.vec(q.len(), 1.0);
            let (qt, kt, vt) = (
                TensorRef::new("t", &q, &qs).unwrap(),
                TensorRef::new("t", &k, &ks).unwrap(),
                TensorRef::new("t", &v, &ks).unwrap(),
            );
            let gt = TensorRef::new("t", &dout, &qs).unwrap();
            let fwd = reference::attention(qt, kt, vt, causal, None).unwrap();
            let lse = reference::attention_lse(qt, kt, vt, causal, None).unwrap();
            let params = RowParams { task_elems: task, min_parallel_elems: 0 };
            let run_lse = || {
                let mut o = vec![f32::NAN; b * s * hq];
                attention_lse(qt, kt, vt, causal, None, &params, &mut o).unwrap();
                o
            };
            let got = in_pool(1, run_lse);
            assert_same_bits("lse threads", &got, &in_pool(2, run_lse));
            assert_close("lse", &got, &lse.data, 1e-5, 1e-5);
            for wrt in 0..3 {
                let want = reference::attention_grad(
                    qt, kt, vt, fwd.view(), gt, lse.view(), causal, None, wrt,
                ).unwrap();
                let run = || {
                    let mut o = vec![f32::NAN; want.data.len()];
                    attention_grad(
                        qt, kt, vt, fwd.view(), gt, lse.view(), causal, None, wrt, &params, &mut o,
                    ).unwrap();
                    o
                };
                let one = in_pool(1, run);
                assert_same_bits("grad threads", &one, &in_pool(2, run));
                assert_close("attention grad", &one, &want.data, 2e-5, 1e-4);
            }
        }
    }

    #[test]
    fn wrt_and_lse_shape_are_checked() {
        let x = [0.5f32; 4];
        let t = TensorRef::new("t", &x, &[1, 1, 1, 4]).unwrap();
        let l = [0.0f32; 1];
        let lt = TensorRef::new("t", &l, &[1, 1, 1]).unwrap();
        let p = RowParams::default();
        let mut out = [0.0; 4];
        assert!(attention_grad(t, t, t, t, t, lt, false, None, 3, &p, &mut out).is_err());
        let bad = TensorRef::new("t", &l, &[1, 1]).unwrap();
        assert!(attention_grad(t, t, t, t, t, bad, false, None, 0, &p, &mut out).is_err());
        assert!(attention_grad(t, t, t, t, t, lt, false, None, 0, &p, &mut out).is_ok());
    }
}
