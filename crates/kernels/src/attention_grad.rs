//! The backward of attention, FlashAttention-2 style: the forward's per-row log-sum-exp
//! ([`crate::attention::attention_lse`]) lets [`attention_grad`] rebuild each tile of attention
//! weights from Q, K and the saved log-sum-exp as `exp(q·k·scale − lse)`, so no S×T matrix is
//! ever stored, and one pass gives all three gradients: per (query tile, key tile) the weights
//! and the score gradients are built once and feed dq, dk and dv — five GEMMs per tile, whose
//! kᵀ and vᵀ operands are packed once per key tile.
//! A task owns one kv head of one batch row (and the query heads sharing it), so the dq rows and
//! the dk / dv rows it writes are its own; where batch × kv heads is too few to keep the threads
//! busy (multi-query attention), the query heads of a group are split over tasks whose dk / dv
//! parts are added in a fixed order. The split depends on the shapes alone, so the result does
//! not depend on the thread count. Layout `[B, S, H, D]`, GQA (query head h reads kv head
//! h / (Hq / Hkv)), causal with the last query aligned to the last key.

use super::attention::{visible_keys, AttentionParams};
use super::error::{KernelError, KernelResult};
use super::matmul::gemm::{pack_operand, packed_len, Gemm};
use super::matmul::pack::MatRef;
use super::matmul::{MatmulParams, MicroKernel};
use super::norm_grad::dot_shifted;
use super::par::{self, SyncPtr};
use super::reference::nn::attention_dims;
use super::rows;
use super::scratch::with_scratch;
use super::shape::check_len;
use super::tensor::TensorRef;

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

    /// Floats of one key block of `block_k` keys (at most all of them) packed as kᵀ or vᵀ.
    fn packed_block_len(&self, block_k: usize) -> usize {
        packed_len(block_k.min(self.t.max(1)), self.d, self.kernel)
    }

    /// How many keys query `i` sees (a prefix of the keys).
    fn visible(&self, i: usize) -> usize {
        visible_keys(self.causal, i, self.s, self.t)
    }

    /// `c (m × n, row stride n) (+)= a · b` on the calling thread, reading b from `packed` (the
    /// first columns of the operand it holds) when given.
    fn product(
        &self,
        a: MatRef<'_>,
        b: MatRef<'_>,
        c: &mut [f32],
        accumulate: bool,
        packed: Option<&[f32]>,
    ) {
        let (a, b) = ([a], [b]);
        let g = Gemm::single(&a, &b, b[0].cols, accumulate, self.kernel);
        match packed {
            Some(p) => g.run_on_packed_prefix(c, &self.gemm, p),
            None => g.run(c, &self.gemm),
        }
    }

    /// The attention weights of queries `i0..i0+ni` (head `h`) over keys `j0..j0+nj` into `p`
    /// (`ni × nj`): `exp(q·k·scale − lse)`, 0 where the mask hides the key. `packed_k` holds
    /// the key block from `j0` as a packed kᵀ.
    #[allow(clippy::too_many_arguments)]
    fn weights(
        &self,
        b: usize,
        h: usize,
        i0: usize,
        ni: usize,
        j0: usize,
        nj: usize,
        packed_k: &[f32],
        p: &mut [f32],
    ) {
        let kh = h / (self.hq / self.hkv);
        let q = self.rows(self.q, b, i0, ni, h, self.s, self.hq);
        let k = self.rows(self.k, b, j0, nj, kh, self.t, self.hkv);
        self.product(q, k.t(), p, false, Some(packed_k));
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
    /// [`GradJob::weights`] into `ds`, from that tile's weights `p`; `packed_v` holds the value
    /// block from `j0` as a packed vᵀ.
    #[allow(clippy::too_many_arguments)]
    fn score_grads(
        &self,
        b: usize,
        h: usize,
        i0: usize,
        ni: usize,
        j0: usize,
        nj: usize,
        (p, packed_v): (&[f32], &[f32]),
        ds: &mut [f32],
    ) {
        let kh = h / (self.hq / self.hkv);
        let go = self.rows(self.dout, b, i0, ni, h, self.s, self.hq);
        let v = self.rows(self.v, b, j0, nj, kh, self.t, self.hkv);
        self.product(go, v.t(), ds, false, Some(packed_v));
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

    /// The gradients from query head `h` of batch row `b`: its dq rows into `dq` (`S × D`,
    /// overwritten) and its contributions to kv head `h / group`'s dk and dv into `dk`, `dv`
    /// (`T × D` each, added to). Key tiles of `block_k` keys go outermost, each packed once as
    /// kᵀ and vᵀ; every query tile of `block_q` rows that sees it follows, and each tile pair's
    /// weights `P` and score gradients `dS` (in `work`) give `dq += dS·k`, `dk += dSᵀ·q` and
    /// `dv += Pᵀ·dout`. A dq row gains its key tiles, and a dk / dv row its query tiles, in
    /// increasing order, as with query tiles outermost.
    #[allow(clippy::too_many_arguments)]
    fn head(
        &self,
        b: usize,
        h: usize,
        block_q: usize,
        block_k: usize,
        work: &mut [f32],
        dq: &mut [f32],
        dk: &mut [f32],
        dv: &mut [f32],
    ) {
        let (d, kh) = (self.d, h / (self.hq / self.hkv));
        dq.fill(0.0);
        let limit = if self.s == 0 {
            0
        } else {
            self.visible(self.s - 1)
        };
        let (packed, work) = work.split_at_mut(2 * self.packed_block_len(block_k));
        let (packed_k, packed_v) = packed.split_at_mut(packed.len() / 2);
        for j0 in (0..limit).step_by(block_k) {
            let block = block_k.min(limit - j0);
            let k_block = self.rows(self.k, b, j0, block, kh, self.t, self.hkv);
            let v_block = self.rows(self.v, b, j0, block, kh, self.t, self.hkv);
            let packed_k = pack_operand(k_block.t(), self.kernel, packed_k);
            let packed_v = pack_operand(v_block.t(), self.kernel, packed_v);
            for i0 in (0..self.s).step_by(block_q) {
                let ni = block_q.min(self.s - i0);
                let Some(nj) = self.visible(i0 + ni - 1).checked_sub(j0).filter(|&n| n > 0) else {
                    continue;
                };
                let nj = nj.min(block_k);
                let q = self.rows(self.q, b, i0, ni, h, self.s, self.hq);
                let go = self.rows(self.dout, b, i0, ni, h, self.s, self.hq);
                let (p, ds) = work[..2 * ni * nj].split_at_mut(ni * nj);
                self.weights(b, h, i0, ni, j0, nj, packed_k, p);
                self.score_grads(b, h, i0, ni, j0, nj, (p, packed_v), ds);
                let k = self.rows(self.k, b, j0, nj, kh, self.t, self.hkv);
                self.product(
                    Self::dense(ds, ni, nj, false),
                    k,
                    &mut dq[i0 * d..(i0 + ni) * d],
                    true,
                    None,
                );
                let keys = j0 * d..(j0 + nj) * d;
                self.product(
                    Self::dense(ds, ni, nj, true),
                    q,
                    &mut dk[keys.clone()],
                    true,
                    None,
                );
                self.product(Self::dense(p, ni, nj, true), go, &mut dv[keys], true, None);
            }
        }
    }
}

/// Fewer (batch row, kv head) pairs than this and the query heads of each group are split over
/// tasks too (see the module doc). A constant, not the thread count, so the bits never depend on
/// the pool.
const MIN_TASKS: usize = 8;

/// `attention_grad(q, k, v, out, dout, lse)`: the gradients of `attention(q, k, v)` with respect
/// to q, k and v into `dq`, `dk`, `dv` (the inputs' shapes). With `P = exp(q·k·scale − lse)`,
/// `dP = dout·vᵀ` and `dS = P·(dP − Σ dout·out)`: `dq = scale·Σ_j dS·k_j`,
/// `dk = scale·Σ dS·q_i`, `dv = Σ P·dout_i`, the kv sums running over every query head of the kv
/// head's group.
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
    params: &AttentionParams,
    dq: &mut [f32],
    dk: &mut [f32],
    dv: &mut [f32],
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
    check_len(OP, "dq", dq.len(), q.shape)?;
    check_len(OP, "dk", dk.len(), k.shape)?;
    check_len(OP, "dv", dv.len(), v.shape)?;
    if params.block_q == 0 || params.block_k == 0 {
        return Err(KernelError::new(OP, "block sizes must be at least 1"));
    }
    let kernel = MicroKernel::select(params.isa)?;
    let (block_q, block_k) = (params.block_q, params.block_k);
    let group = hq / hkv;
    let (splits, per_task) = group_splits(b, hq, hkv);
    let kv_len = t * d;
    // With split groups, each split's dk / dv go to a part of their own (every row written by
    // its task), added up after.
    let parts_len = split_parts_len(b, hq, hkv, t, d);
    with_scratch(b * s * hq + parts_len, |buf| {
        let (delta, parts) = buf.split_at_mut(b * s * hq);
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
                small_m: block_q.max(block_k),
                tasks_per_thread: 0,
                min_parallel_flops: usize::MAX,
                isa: params.isa,
                ..MatmulParams::default()
            },
            kernel,
        };
        let flops = [b, hq, s, t, d]
            .iter()
            .fold(4usize, |f, &x| f.saturating_mul(x));
        let parallel = flops >= params.min_parallel_flops;
        let (dq_ptr, dk_ptr, dv_ptr) = (
            SyncPtr(dq.as_mut_ptr()),
            SyncPtr(dk.as_mut_ptr()),
            SyncPtr(dv.as_mut_ptr()),
        );
        let parts_ptr = SyncPtr(parts.as_mut_ptr());
        par::for_each_index(parallel, b * hkv * splits, |task| {
            let (pair, split) = (task / splits, task % splits);
            let (bi, kh) = (pair / hkv, pair % hkv);
            let heads = kh * group + split * per_task
                ..(kh * group + (split + 1) * per_task).min((kh + 1) * group);
            let scratch =
                2 * kv_len + s * d + 2 * block_q * block_k + 2 * job.packed_block_len(block_k);
            with_scratch(scratch, |buf| {
                let (dkv, rest) = buf.split_at_mut(2 * kv_len);
                let (dq_head, work) = rest.split_at_mut(s * d);
                dkv.fill(0.0);
                let (dk_acc, dv_acc) = dkv.split_at_mut(kv_len);
                for h in heads {
                    job.head(bi, h, block_q, block_k, work, dq_head, dk_acc, dv_acc);
                    for (i, row) in dq_head.chunks_exact(d).enumerate() {
                        // SAFETY: dq row i of head h (batch bi) belongs to this task alone (its
                        // heads are its own) and lies inside `dq` (length checked).
                        unsafe { write_row(dq_ptr, ((bi * s + i) * hq + h) * d, row) };
                    }
                }
                for (acc, whole, part) in [(&*dk_acc, dk_ptr, 0), (&*dv_acc, dv_ptr, 1)] {
                    for (j, row) in acc.chunks_exact(d).enumerate() {
                        // SAFETY: without splits, row j of kv head kh (batch bi) belongs to
                        // this task alone and lies inside `dk` / `dv`; with splits, the task
                        // writes its own part, inside `parts` (sized for every split).
                        unsafe {
                            if splits == 1 {
                                write_row(whole, ((bi * t + j) * hkv + kh) * d, row);
                            } else {
                                let at = ((part * splits + split) * b * hkv + pair) * kv_len;
                                write_row(parts_ptr, at + j * d, row);
                            }
                        }
                    }
                }
            });
        });
        if splits > 1 {
            add_split_parts(parts, [dk, dv], [b, t, hkv, d], splits);
        }
    });
    Ok(())
}

/// Sets `dk` and `dv` (`[b, t, hkv, d]`) to the sums of the parts split query-head groups
/// wrote, each kv head's added in split order.
fn add_split_parts(
    parts: &[f32],
    grads: [&mut [f32]; 2],
    [b, t, hkv, d]: [usize; 4],
    splits: usize,
) {
    let kv_len = t * d;
    for (part, grad) in grads.into_iter().enumerate() {
        for pair in 0..b * hkv {
            let (bi, kh) = (pair / hkv, pair % hkv);
            for j in 0..t {
                let row = &mut grad[((bi * t + j) * hkv + kh) * d..][..d];
                row.fill(0.0);
                for split in 0..splits {
                    let at = ((part * splits + split) * b * hkv + pair) * kv_len + j * d;
                    for (x, &y) in row.iter_mut().zip(&parts[at..at + d]) {
                        *x += y;
                    }
                }
            }
        }
    }
}

/// How many tasks share a kv head's group of query heads, and how many query heads each
/// takes: the whole group, or a share of it when there are few kv heads (`b · hkv` below
/// [`MIN_TASKS`]).
fn group_splits(b: usize, hq: usize, hkv: usize) -> (usize, usize) {
    let group = (hq / hkv.max(1)).max(1);
    let splits = MIN_TASKS.div_ceil((b * hkv).max(1)).clamp(1, group);
    let per_task = group.div_ceil(splits);
    (group.div_ceil(per_task), per_task)
}

/// Floats of the parts split groups write their dk and dv to before they are added up (0
/// without splits): scratch of the calling thread, beside the query rows' sums.
pub(crate) fn split_parts_len(b: usize, hq: usize, hkv: usize, t: usize, d: usize) -> usize {
    match group_splits(b, hq, hkv).0 {
        1 => 0,
        splits => (2 * splits * b * hkv).saturating_mul(t).saturating_mul(d),
    }
}

/// Copies `row` to `dst + at`.
///
/// # Safety
/// `at..at + row.len()` must lie inside the buffer `dst` points to, and no other thread may
/// touch it meanwhile.
unsafe fn write_row(dst: SyncPtr, at: usize, row: &[f32]) {
    // SAFETY: as the caller guarantees.
    unsafe { std::slice::from_raw_parts_mut(dst.get().add(at), row.len()) }.copy_from_slice(row);
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
        /// forward output and lse), GQA with and without split groups, causal or not, S ≠ T, any
        /// tiling and micro-kernel; 1 and 2 threads agree bit for bit, and the output written
        /// with the lse has `attention`'s bits. Tolerance: f32 dot products of at most 16 terms
        /// and sums over at most 9·4 scores.
        #[test]
        fn fast_matches_reference(
            b in 1usize..4, s in 1usize..9, t in 1usize..9,
            hkv in 1usize..5, group in 1usize..5, d in 1usize..17,
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
                let (mut o, mut l) = (vec![f32::NAN; q.len()], vec![f32::NAN; b * s * hq]);
                attention::attention_lse(qt, kt, vt, causal, None, &params, &mut o, &mut l)
                    .unwrap();
                (o, l)
            };
            let (out, got) = in_pool(1, run_lse);
            let (out2, got2) = in_pool(2, run_lse);
            assert_same_bits("lse threads", &got, &got2);
            assert_same_bits("out threads", &out, &out2);
            assert_close("lse", &got, &lse.data, 1e-5, 1e-5);
            let mut alone = vec![f32::NAN; q.len()];
            attention::attention(qt, kt, vt, causal, None, &params, &mut alone).unwrap();
            assert_same_bits("out with lse", &out, &alone);
            let run = || {
                let mut g = [q.len(), k.len(), v.len()].map(|n| vec![f32::NAN; n]);
                let [dq, dk, dv] = &mut g;
                attention_grad(
                    qt, kt, vt, fwd.view(), gt, lse.view(), causal, None, &params, dq, dk, dv,
                ).unwrap();
                g
            };
            let one = in_pool(1, run);
            let two = in_pool(2, run);
            for (wrt, (one, two)) in one.iter().zip(&two).enumerate() {
                let want = reference::attention_grad(
                    qt, kt, vt, fwd.view(), gt, lse.view(), causal, None, wrt,
                ).unwrap();
                assert_same_bits("grad threads", one, two);
                assert_close("attention grad", one, &want.data, 2e-5, 1e-4);
            }
        }
    }

    /// The memory plan's per-step scratch bound (`step::needs::scratch_floats`) covers the
    /// largest request of the forward and of the gradient, whatever the tiling: long and short
    /// sequences, S ≠ T, grouped heads, causal or not.
    #[test]
    fn requests_stay_within_the_scratch_bound() {
        use crate::step::prepare::StepKernel;
        use mslc_core::ops::{DType, TensorType};
        let mut rng = Rng::new(8);
        let ty = |shape: [usize; 4]| TensorType::new(DType::F32, shape.map(|d| d as i64));
        let shapes = [
            (1, 300, 520, 4, 2, 128),
            (2, 1, 700, 2, 1, 64),
            (1, 257, 3, 3, 3, 8),
            // One kv head for eight query heads: eight tasks, each adding dk / dv parts.
            (1, 64, 96, 8, 1, 32),
        ];
        for (b, s, t, hq, hkv, d) in shapes {
            let (qs, ks) = ([b, s, hq, d], [b, t, hkv, d]);
            let q = rng.vec(b * s * hq * d, 1.0);
            let (k, v) = (rng.vec(b * t * hkv * d, 1.0), rng.vec(b * t * hkv * d, 1.0));
            let (qt, kt, vt) = (
                TensorRef::new("t", &q, &qs).unwrap(),
                TensorRef::new("t", &k, &ks).unwrap(),
                TensorRef::new("t", &v, &ks).unwrap(),
            );
            for (block_q, block_k) in [(32, 128), (1, 5), (256, 512)] {
                for causal in [false, true] {
                    let params = AttentionParams {
                        block_q,
                        block_k,
                        min_parallel_flops: 0,
                        isa: Isa::Auto,
                    };
                    let asked = in_pool(1, || {
                        let (mut o, mut l) = (vec![0.0; q.len()], vec![0.0; b * s * hq]);
                        attention::attention_lse(qt, kt, vt, causal, None, &params, &mut o, &mut l)
                            .unwrap();
                        let ls = [b, s, hq];
                        let (ot, lt) = (
                            TensorRef::new("t", &o, &qs).unwrap(),
                            TensorRef::new("t", &l, &ls).unwrap(),
                        );
                        let mut g = [q.len(), k.len(), v.len()].map(|n| vec![0.0; n]);
                        let [dq, dk, dv] = &mut g;
                        attention_grad(qt, kt, vt, ot, ot, lt, causal, None, &params, dq, dk, dv)
                            .unwrap();
                        crate::scratch::largest_request()
                    });
                    let kernel = StepKernel::AttentionGrad {
                        causal,
                        scale: 1.0,
                        params,
                    };
                    let inputs = [ty(qs), ty(ks), ty(ks)];
                    let bound =
                        crate::step::needs::scratch_floats(&kernel, &inputs, &ty(qs), false);
                    assert!(
                        asked <= bound,
                        "{qs:?} {ks:?} blocks ({block_q}, {block_k}): asked {asked} of {bound}"
                    );
                }
            }
        }
    }

    #[test]
    fn gradient_and_lse_shapes_are_checked() {
        let x = [0.5f32; 4];
        let t = TensorRef::new("t", &x, &[1, 1, 1, 4]).unwrap();
        let l = [0.0f32; 1];
        let lt = TensorRef::new("t", &l, &[1, 1, 1]).unwrap();
        let p = AttentionParams::default();
        let ([mut a, mut b], mut short) = ([[0.0; 4]; 2], [0.0; 3]);
        let mut c = [0.0; 4];
        assert!(
            attention_grad(t, t, t, t, t, lt, false, None, &p, &mut a, &mut b, &mut short).is_err()
        );
        let bad = TensorRef::new("t", &l, &[1, 1]).unwrap();
        assert!(
            attention_grad(t, t, t, t, t, bad, false, None, &p, &mut a, &mut b, &mut c).is_err()
        );
        assert!(attention_grad(t, t, t, t, t, lt, false, None, &p, &mut a, &mut b, &mut c).is_ok());
    }
}
