//! The backward of attention, FlashAttention-2 style: the forward's per-row log-sum-exp
//! ([`crate::attention::attention_lse`]) lets [`attention_grad`] rebuild each tile of attention
//! weights from Q, K and the saved log-sum-exp as `exp(q·k·scale − lse)`, so no S×T matrix is
//! ever stored. Each task owns a tile of output rows (query rows for dq, key rows for dk and dv)
//! and streams the other side through in tiles, every product a packed GEMM on the tile; threads
//! never write the same row and the result does not depend on the thread count. Layout
//! `[B, S, H, D]`, GQA (query head h reads kv head h / (Hq / Hkv)), causal with the last query
//! aligned to the last key.

use super::attention::AttentionParams;
use super::error::{KernelError, KernelResult};
use super::matmul::gemm::{Gemm, Problem};
use super::matmul::pack::MatRef;
use super::matmul::{MatmulParams, MicroKernel};
use super::norm_grad::dot_shifted;
use super::par::{self, SyncPtr};
use super::reference::nn::attention_dims;
use super::rows;
use super::scratch::with_scratch;
use super::shape::check_len;
use super::tensor::TensorRef;
use super::Activation;

/// The fixed facts of one backward call, shared by its tasks.
struct GradJob<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    dout: &'a [f32],
    lse: &'a [f32],
    /// Per query row, `Σ dout·out` (the softmax's correction term).
    delta: &'a [f32],
    s: usize,
    t: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    causal: bool,
    scale: f32,
    gemm: MatmulParams,
    kernel: MicroKernel,
}

impl GradJob<'_> {
    /// `rows` consecutive rows of head `h` from position `first` of batch `b` of a
    /// `[B, len, heads, D]` tensor.
    #[allow(clippy::too_many_arguments)]
    fn rows<'a>(
        &self,
        data: &'a [f32],
        b: usize,
        first: usize,
        rows: usize,
        h: usize,
        len: usize,
        heads: usize,
    ) -> MatRef<'a> {
        MatRef {
            data,
            offset: ((b * len + first) * heads + h) * self.d,
            rs: heads * self.d,
            cs: 1,
            rows,
            cols: self.d,
        }
    }

    /// How many keys query `i` sees (a prefix of the keys).
    fn visible(&self, i: usize) -> usize {
        if self.causal {
            (i + self.t + 1).saturating_sub(self.s).min(self.t)
        } else {
            self.t
        }
    }

    /// `c (m × n, row stride n) (+)= a · b` on the calling thread.
    fn product(&self, a: MatRef<'_>, b: MatRef<'_>, c: &mut [f32], accumulate: bool) {
        let (a, b) = ([a], [b]);
        Gemm {
            m: a[0].rows,
            n: b[0].cols,
            k: a[0].cols,
            a: &a,
            b: &b,
            problems: &[Problem {
                a: 0,
                b: 0,
                c_offset: 0,
                bias_offset: 0,
            }],
            ldc: b[0].cols,
            accumulate,
            bias: None,
            activation: Activation::NONE,
            kernel: self.kernel,
        }
        .run(c, &self.gemm);
    }

    /// The attention weights of queries `i0..i0+ni` (head `h`) over keys `j0..j0+nj` into `p`
    /// (`ni × nj`): `exp(q·k·scale − lse)`, 0 where the mask hides the key.
    #[allow(clippy::too_many_arguments)]
    fn weights(
        &self,
        b: usize,
        h: usize,
        i0: usize,
        ni: usize,
        j0: usize,
        nj: usize,
        p: &mut [f32],
    ) {
        let kh = h / (self.hq / self.hkv);
        let q = self.rows(self.q, b, i0, ni, h, self.s, self.hq);
        let k = self.rows(self.k, b, j0, nj, kh, self.t, self.hkv);
        self.product(q, k.t(), p, false);
        for (r, row) in p.chunks_exact_mut(nj).enumerate() {
            let l = self.lse[(b * self.s + i0 + r) * self.hq + h];
            let seen = if l == f32::NEG_INFINITY {
                0
            } else {
                self.visible(i0 + r).saturating_sub(j0).min(nj)
            };
            let (kept, hidden) = row.split_at_mut(seen);
            rows::exp_sum(kept, self.scale, l);
            hidden.fill(0.0);
        }
    }

    /// The score gradients `dS = P ∘ (dout·vᵀ − delta) · scale` of the same tile as
    /// [`GradJob::weights`] into `ds`, from that tile's weights `p`.
    #[allow(clippy::too_many_arguments)]
    fn score_grads(
        &self,
        b: usize,
        h: usize,
        i0: usize,
        ni: usize,
        j0: usize,
        nj: usize,
        p: &[f32],
        ds: &mut [f32],
    ) {
        let kh = h / (self.hq / self.hkv);
        let go = self.rows(self.dout, b, i0, ni, h, self.s, self.hq);
        let v = self.rows(self.v, b, j0, nj, kh, self.t, self.hkv);
        self.product(go, v.t(), ds, false);
        for (r, (ds, p)) in ds.chunks_exact_mut(nj).zip(p.chunks_exact(nj)).enumerate() {
            let delta = self.delta[(b * self.s + i0 + r) * self.hq + h];
            for (g, &w) in ds.iter_mut().zip(p) {
                *g = w * (*g - delta) * self.scale;
            }
        }
    }

    /// A dense `rows × cols` matrix in `data` (row stride `cols`), or its transpose.
    fn dense(data: &[f32], rows: usize, cols: usize, transposed: bool) -> MatRef<'_> {
        let m = MatRef {
            data,
            offset: 0,
            rs: cols,
            cs: 1,
            rows,
            cols,
        };
        if transposed {
            m.t()
        } else {
            m
        }
    }

    /// dq rows `i0..i0+ni` of head `h` into `acc` (`ni × D`): `Σ_j dS·k_j` over the visible keys,
    /// `block_k` keys at a time.
    #[allow(clippy::too_many_arguments)]
    fn dq_tile(
        &self,
        b: usize,
        h: usize,
        i0: usize,
        ni: usize,
        block_k: usize,
        buf: &mut [f32],
        acc: &mut [f32],
    ) {
        let kh = h / (self.hq / self.hkv);
        let limit = self.visible(i0 + ni - 1);
        for j0 in (0..limit).step_by(block_k) {
            let nj = block_k.min(limit - j0);
            let (p, ds) = buf[..2 * ni * nj].split_at_mut(ni * nj);
            self.weights(b, h, i0, ni, j0, nj, p);
            self.score_grads(b, h, i0, ni, j0, nj, p, ds);
            let k = self.rows(self.k, b, j0, nj, kh, self.t, self.hkv);
            self.product(Self::dense(ds, ni, nj, false), k, acc, true);
        }
    }

    /// dk (`wrt` 1) or dv (`wrt` 2) rows `j0..j0+nj` of kv head `kh` into `acc` (`nj × D`):
    /// `Σ dS·q_i` or `Σ P·dout_i` over every query of the head's group that sees the keys,
    /// `step` queries at a time.
    #[allow(clippy::too_many_arguments)]
    fn dkv_tile(
        &self,
        b: usize,
        kh: usize,
        j0: usize,
        nj: usize,
        wrt: usize,
        step: usize,
        buf: &mut [f32],
        acc: &mut [f32],
    ) {
        let group = self.hq / self.hkv;
        // The first query that sees key j0.
        let first = if self.causal {
            (j0 + self.s).saturating_sub(self.t).min(self.s)
        } else {
            0
        };
        for h in kh * group..(kh + 1) * group {
            for i0 in (first..self.s).step_by(step) {
                let ni = step.min(self.s - i0);
                let (p, ds) = buf[..2 * ni * nj].split_at_mut(ni * nj);
                self.weights(b, h, i0, ni, j0, nj, p);
                let (weights, rows) = if wrt == 2 {
                    (&*p, self.rows(self.dout, b, i0, ni, h, self.s, self.hq))
                } else {
                    self.score_grads(b, h, i0, ni, j0, nj, p, ds);
                    (&*ds, self.rows(self.q, b, i0, ni, h, self.s, self.hq))
                };
                self.product(Self::dense(weights, ni, nj, true), rows, acc, true);
            }
        }
    }
}

/// `attention_grad(q, k, v, out, dout, lse)` for the input `wrt` (0 q, 1 k, 2 v) into `grad`
/// (that input's shape). With `P = exp(q·k·scale − lse)`, `dP = dout·vᵀ` and
/// `dS = P·(dP − Σ dout·out)`: `dq = scale·Σ_j dS·k_j`, `dk = scale·Σ dS·q_i`, `dv = Σ P·dout_i`,
/// the kv sums running over every query head of the kv head's group. A task owns `block_q` rows
/// of the gradient and streams the other side `block_k` rows at a time.
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
    params: &AttentionParams,
    grad: &mut [f32],
) -> KernelResult<()> {
    const OP: &str = "attention_grad";
    let (b, s, t, hq, hkv, d) = attention_dims(q, k, v)?;
    for (what, x) in [("out", out), ("dout", dout)] {
        if x.shape != q.shape || x.data.len() != q.data.len() {
            return Err(KernelError::new(
                OP,
                format!("{what} {:?} must have q's shape {:?}", x.shape, q.shape),
            ));
        }
    }
    check_len(OP, "lse", lse.data.len(), &[b, s, hq])?;
    if lse.shape != [b, s, hq] {
        return Err(KernelError::new(
            OP,
            format!("lse {:?} must be [{b}, {s}, {hq}]", lse.shape),
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
    if params.block_q == 0 || params.block_k == 0 {
        return Err(KernelError::new(OP, "block sizes must be at least 1"));
    }
    let kernel = MicroKernel::select(params.isa)?;
    let (block_q, block_k) = (params.block_q, params.block_k);
    let rows_total = b * s * hq;
    with_scratch(rows_total, |delta| {
        // delta = rowsum(dout ∘ out), once per query row.
        for (r, dl) in delta.iter_mut().enumerate() {
            let at = r * d..(r + 1) * d;
            *dl = dot_shifted(&dout.data[at.clone()], &out.data[at], 0.0);
        }
        let job = GradJob {
            q: q.data,
            k: k.data,
            v: v.data,
            dout: dout.data,
            lse: lse.data,
            delta,
            s,
            t,
            hq,
            hkv,
            d,
            causal,
            scale: scale.unwrap_or(1.0 / (d as f64).sqrt()) as f32,
            gemm: MatmulParams {
                mc: block_q.max(block_k),
                kc: d.max(block_q).max(block_k),
                nc: d.max(block_q).max(block_k),
                tasks_per_thread: 0,
                min_parallel_flops: usize::MAX,
                isa: params.isa,
                small_m: MatmulParams::default().small_m,
            },
            kernel,
        };
        // Output rows per (batch, head) and the heads of the gradient.
        let (len, heads) = if wrt == 0 { (s, hq) } else { (t, hkv) };
        let tiles = len.div_ceil(block_q);
        let flops = [b, hq, s, t, d]
            .iter()
            .fold(4usize, |f, &x| f.saturating_mul(x));
        let parallel = flops >= params.min_parallel_flops;
        let grad_ptr = SyncPtr(grad.as_mut_ptr());
        par::for_each_index(parallel, b * heads * tiles, |task| {
            let (bh, tile) = (task / tiles, task % tiles);
            let (bi, h) = (bh / heads, bh % heads);
            let r0 = tile * block_q;
            let nr = block_q.min(len - r0);
            with_scratch(nr * d + 2 * block_q * block_k, |buf| {
                let (acc, work) = buf.split_at_mut(nr * d);
                acc.fill(0.0);
                if wrt == 0 {
                    job.dq_tile(bi, h, r0, nr, block_k, work, acc);
                } else {
                    job.dkv_tile(bi, h, r0, nr, wrt, block_k, work, acc);
                }
                for (r, row) in acc.chunks_exact(d).enumerate() {
                    // SAFETY: row r0 + r of head h belongs to this task alone and lies inside
                    // `grad` (its length was checked against the target's shape).
                    let dst = unsafe {
                        std::slice::from_raw_parts_mut(
                            grad_ptr.get().add(((bi * len + r0 + r) * heads + h) * d),
                            d,
                        )
                    };
                    dst.copy_from_slice(row);
                }
            });
        });
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matmul::Isa;
    use crate::testing::{assert_close, assert_same_bits, in_pool, Rng};
    use crate::{attention, reference};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// lse and the three gradients against the f64 reference (fed the reference's own
        /// forward output and lse), GQA, causal or not, S ≠ T, any tiling and micro-kernel; 1 and
        /// 2 threads agree bit for bit. Tolerance: f32 dot products of at most 16 terms and sums
        /// over at most 9·4 scores.
        #[test]
        fn fast_matches_reference(
            b in 1usize..3, s in 1usize..9, t in 1usize..9,
            hkv in 1usize..3, group in 1usize..3, d in 1usize..17,
            causal in any::<bool>(),
            block_q in prop::sample::select(vec![1usize, 3, 32]),
            block_k in prop::sample::select(vec![1usize, 5, 128]),
            isa in prop::sample::select(vec![Isa::Auto, Isa::Portable]),
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
            let params = AttentionParams { block_q, block_k, min_parallel_flops: 0, isa };
            let run_lse = || {
                let mut o = vec![f32::NAN; b * s * hq];
                attention::attention_lse(qt, kt, vt, causal, None, &params, &mut o).unwrap();
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
        let p = AttentionParams::default();
        let mut out = [0.0; 4];
        assert!(attention_grad(t, t, t, t, t, lt, false, None, 3, &p, &mut out).is_err());
        let bad = TensorRef::new("t", &l, &[1, 1]).unwrap();
        assert!(attention_grad(t, t, t, t, t, bad, false, None, 0, &p, &mut out).is_err());
        assert!(attention_grad(t, t, t, t, t, lt, false, None, 0, &p, &mut out).is_ok());
    }
}
