//! Flash-style attention: per query tile of each (batch, query head), one task, key blocks
//! stream through an online softmax, so no S×T score matrix is ever held. A block's scores are
//! computed transposed (keys × queries), so that the softmax of a tile's queries runs as vector
//! lanes — one pass for the maxima, one for the exponentials and sums — rather than row by row,
//! where per-row reductions cost more than the exponentials. Causal (last query aligned with
//! the last key), GQA (query head h reads kv head h / (Hq / Hkv)), layout `[B, S, H, D]`. The
//! same pass gives, in [`attention_lse`], the per-row log-sum-exp the backward
//! ([`crate::attention_grad`]) rebuilds the weights from.

use serde::{Deserialize, Serialize};

use super::cpu::dispatch_avx512;
use super::error::{KernelError, KernelResult};
use super::matmul::gemm::{pack_operand, packed_len, Gemm};
use super::matmul::pack::MatRef;
use super::matmul::{Isa, MatmulParams, MicroKernel};
use super::par::{self, SyncPtr};
use super::reference::nn::attention_dims;
use super::scratch::with_scratch;
use super::shape::check_len;
use super::tensor::TensorRef;
use super::{math, rows};

/// Tunable parameters of [`attention`]. Results are bit-identical for any thread count,
/// `block_q` and `min_parallel_flops`; `block_k` (the online-softmax steps) and the portable
/// kernel change the rounding.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttentionParams {
    /// Queries per tile (the rows of one score tile).
    pub block_q: usize,
    /// Keys per step of the online softmax (the columns of one score tile).
    pub block_k: usize,
    /// Problems with fewer flops (4·B·Hq·S·T·D) than this run on the calling thread.
    pub min_parallel_flops: usize,
    /// Micro-kernel used by the tile products; an ISA this CPU lacks is an error.
    pub isa: Isa,
}

impl Default for AttentionParams {
    fn default() -> Self {
        Self {
            block_q: 32,
            block_k: 128,
            min_parallel_flops: 1 << 19,
            isa: Isa::Auto,
        }
    }
}

/// The fixed facts of one call, shared by its tasks.
struct AttentionJob<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    s: usize,
    t: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    causal: bool,
    scale: f32,
    block_q: usize,
    block_k: usize,
    /// The tile products' parameters: both left operands (a block's keys, a tile's weights)
    /// are read in place.
    gemm: MatmulParams,
    kernel: MicroKernel,
    /// Where each row's log-sum-exp goes (`[B, S, Hq]`), when the caller wants it.
    lse: Option<SyncPtr>,
}

/// `attention(q, k, v)`: `softmax(q kᵀ · scale [+ causal mask]) v`; `scale` defaults to 1/√D.
/// q is `[B, S, Hq, D]`, k and v `[B, T, Hkv, D]`, `out` holds `B·S·Hq·D` values. A query that
/// sees no key (causal with S > T) gets zeros.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: TensorRef<'_>,
    k: TensorRef<'_>,
    v: TensorRef<'_>,
    causal: bool,
    scale: Option<f64>,
    params: &AttentionParams,
    out: &mut [f32],
) -> KernelResult<()> {
    run("attention", q, k, v, causal, scale, params, out, None)
}

/// [`attention`] into `out`, and into `lse` (`[B, S, Hq]`) per query row the log-sum-exp of its
/// visible scaled scores (`m + ln Σ exp(score − m)`, online over the key tiles; -inf for a row
/// that sees no key), from the same pass. `out` has the same bits as [`attention`]'s; both are
/// bit-identical for any thread count and `block_q`.
#[allow(clippy::too_many_arguments)]
pub fn attention_lse(
    q: TensorRef<'_>,
    k: TensorRef<'_>,
    v: TensorRef<'_>,
    causal: bool,
    scale: Option<f64>,
    params: &AttentionParams,
    out: &mut [f32],
    lse: &mut [f32],
) -> KernelResult<()> {
    run(
        "attention_lse",
        q,
        k,
        v,
        causal,
        scale,
        params,
        out,
        Some(lse),
    )
}

/// The forward's tiles over every (batch, head, query tile), writing the outputs and, when
/// asked, the log-sum-exps.
#[allow(clippy::too_many_arguments)]
fn run(
    op: &'static str,
    q: TensorRef<'_>,
    k: TensorRef<'_>,
    v: TensorRef<'_>,
    causal: bool,
    scale: Option<f64>,
    params: &AttentionParams,
    out: &mut [f32],
    lse: Option<&mut [f32]>,
) -> KernelResult<()> {
    let (b, s, t, hq, hkv, d) = attention_dims(q, k, v)?;
    check_len(op, "out", out.len(), q.shape)?;
    if let Some(lse) = &lse {
        check_len(op, "lse", lse.len(), &[b, s, hq])?;
    }
    if params.block_q == 0 || params.block_k == 0 {
        return Err(KernelError::new(op, "block sizes must be at least 1"));
    }
    let kernel = MicroKernel::select(params.isa)?;
    let gemm = MatmulParams {
        mc: params.block_q,
        kc: d.max(params.block_k),
        nc: d.max(params.block_k),
        small_m: params.block_q.max(params.block_k),
        tasks_per_thread: 0,
        min_parallel_flops: usize::MAX,
        isa: params.isa,
        ..MatmulParams::default()
    };
    let p = AttentionJob {
        q: q.data,
        k: k.data,
        v: v.data,
        s,
        t,
        hq,
        hkv,
        d,
        causal,
        scale: scale.unwrap_or(1.0 / (d as f64).sqrt()) as f32,
        block_q: params.block_q,
        block_k: params.block_k,
        gemm,
        kernel,
        lse: lse.map(|l| SyncPtr(l.as_mut_ptr())),
    };
    let q_tiles = s.div_ceil(params.block_q);
    let heads = b * hq;
    let flops = [b, hq, s, t, d]
        .iter()
        .fold(4usize, |f, &x| f.saturating_mul(x));
    let parallel = flops >= params.min_parallel_flops;
    let out_ptr = SyncPtr(out.as_mut_ptr());
    // One task per query tile of every (batch, head): a tile packs its own queries and reads
    // the keys and values in place, so nothing is shared between tiles; the causal tiles' costs
    // (growing with their position) even out over the pool's work stealing.
    par::for_each_index(parallel, heads * q_tiles, |task| {
        let (bh, tile) = (task / q_tiles, task % q_tiles);
        // SAFETY: the task writes only the rows and log-sum-exps of query tile `tile` at
        // (batch, head) `bh`, disjoint from every other task's, inside `out` and `lse` (lengths
        // checked).
        unsafe { p.tile(bh / hq, bh % hq, tile, out_ptr) };
    });
    Ok(())
}

/// How many keys query `q` sees, a prefix of the `t` keys: all of them, or under a causal mask
/// (the last query aligned with the last key) those at most `q + t − s`. The forward and the
/// backward ([`crate::attention_grad`]) mask by this one rule.
pub(crate) fn visible_keys(causal: bool, q: usize, s: usize, t: usize) -> usize {
    if causal {
        (q + t + 1).saturating_sub(s).min(t)
    } else {
        t
    }
}

impl AttentionJob<'_> {
    /// Rows `d` wide, `stride` apart: the (batch, head) slice of a `[B, L, H, D]` tensor.
    fn rows<'a>(
        &self,
        data: &'a [f32],
        first_row: usize,
        rows: usize,
        stride: usize,
    ) -> MatRef<'a> {
        MatRef {
            data,
            offset: first_row,
            rs: stride,
            cs: 1,
            rows,
            cols: self.d,
        }
    }

    /// Computes query tile `tile` of one (batch, head): per block of keys, the scores
    /// transposed (one key's scores for the tile's queries contiguous, so that the softmax
    /// statistics of many queries advance together in one vector), the online
    /// softmax over them, and the weighted values added into the tile's accumulators.
    ///
    /// # Safety
    /// `out` must point to the `[B, S, Hq, D]` output (and `self.lse`, if any, to `[B, S, Hq]`),
    /// and no other task may write this tile.
    unsafe fn tile(&self, b: usize, h: usize, tile: usize, out: SyncPtr) {
        let (s, t, d) = (self.s, self.t, self.d);
        let kh = h / (self.hq / self.hkv);
        let (qs, ks) = (self.hq * d, self.hkv * d);
        let q0 = tile * self.block_q;
        let bq = self.block_q.min(s - q0);
        // Keys the tile's last query sees: its other queries see a prefix of them.
        let limit = visible_keys(self.causal, q0 + bq - 1, s, t);
        let bk_max = self.block_k.min(limit.max(1));
        let packed_q_len = packed_len(bq, d, self.kernel);
        let scratch = packed_q_len + (bk_max + 4 + rows::LANES) * bq + bq * d;
        with_scratch(scratch, |buf| {
            let (packed_q, rest) = buf.split_at_mut(packed_q_len);
            let (scores, rest) = rest.split_at_mut(bk_max * bq);
            let (acc, rest) = rest.split_at_mut(bq * d);
            let (max, rest) = rest.split_at_mut(bq);
            let (sum, rest) = rest.split_at_mut(bq);
            let (correction, rest) = rest.split_at_mut(bq);
            let (visible, partials) = rest.split_at_mut(bq);
            acc.fill(0.0);
            max.fill(f32::NEG_INFINITY);
            sum.fill(0.0);
            let mut lanes = Lanes {
                max,
                sum,
                correction,
                partials,
            };
            let queries = [self
                .rows(self.q, ((b * s + q0) * self.hq + h) * d, bq, qs)
                .t()];
            let packed_q = pack_operand(queries[0], self.kernel, packed_q);
            // `n` rows of k or v from key t0.
            let kv_rows =
                |data, t0: usize, n| self.rows(data, ((b * t + t0) * self.hkv + kh) * d, n, ks);
            for t0 in (0..limit).step_by(self.block_k) {
                let bk = self.block_k.min(limit - t0);
                let scores = &mut scores[..bk * bq];
                let keys = [kv_rows(self.k, t0, bk)];
                Gemm::single(&keys, &queries, bq, false, self.kernel)
                    .run_on_packed_prefix(scores, &self.gemm, packed_q);
                for (r, v) in visible.iter_mut().enumerate() {
                    let keys = visible_keys(self.causal, q0 + r, s, t).saturating_sub(t0);
                    *v = keys.min(bk) as f32;
                }
                softmax_block(scores, visible, self.scale, &mut lanes);
                if t0 > 0 {
                    for (row, &c) in acc.chunks_exact_mut(d).zip(lanes.correction.iter()) {
                        if c != 1.0 {
                            rows::scale(row, c);
                        }
                    }
                }
                // The weights, stored transposed, are the left operand as they lie.
                let weights = [MatRef {
                    data: scores,
                    offset: 0,
                    rs: 1,
                    cs: bq,
                    rows: bq,
                    cols: bk,
                }];
                let values = [kv_rows(self.v, t0, bk)];
                Gemm::single(&weights, &values, d, true, self.kernel).run(acc, &self.gemm);
            }
            for (r, row) in acc.chunks_exact_mut(d).enumerate() {
                self.finish_row(b, h, q0 + r, (lanes.max[r], lanes.sum[r]), row, out);
            }
        });
    }

    /// Divides query row `q`'s accumulated values by its softmax sum and writes them (and its
    /// log-sum-exp, when asked) to the outputs.
    ///
    /// # Safety
    /// As [`AttentionJob::tile`], for a row of this task's tile.
    unsafe fn finish_row(
        &self,
        b: usize,
        h: usize,
        q: usize,
        (max, sum): (f32, f32),
        row: &mut [f32],
        out: SyncPtr,
    ) {
        if let Some(lse_out) = self.lse {
            let lse = if sum > 0.0 {
                max + math::log(sum)
            } else {
                f32::NEG_INFINITY
            };
            // SAFETY: entry (b, q, h) lies inside `lse` and belongs to this task.
            unsafe { *lse_out.get().add((b * self.s + q) * self.hq + h) = lse };
        }
        rows::scale(row, if sum > 0.0 { 1.0 / sum } else { 0.0 });
        // SAFETY: row q of head h lies inside `out` and belongs to this task.
        let dst = unsafe {
            std::slice::from_raw_parts_mut(
                out.get().add(((b * self.s + q) * self.hq + h) * self.d),
                self.d,
            )
        };
        dst.copy_from_slice(row);
    }
}

/// The online softmax's state of a query tile, one lane per query.
struct Lanes<'a> {
    /// The largest scaled score seen so far.
    max: &'a mut [f32],
    /// Σ e^(score − max) so far.
    sum: &'a mut [f32],
    /// What the last key block multiplied the sum by, for the accumulated values to follow.
    correction: &'a mut [f32],
    /// `rows::LANES` blocks of one value per query: a block's partial sums.
    partials: &'a mut [f32],
}

/// [`softmax_block`]'s body, compiled once per instruction set: loops over a key's lanes, which
/// vectorise whatever the tile's width.
#[inline(always)]
fn softmax_block_body(scores: &mut [f32], visible: &[f32], scale: f32, lanes: &mut Lanes<'_>) {
    let Lanes {
        max,
        sum,
        correction,
        partials,
    } = lanes;
    let width = visible.len();
    // The new maxima, into `correction` while `max` keeps the old ones.
    correction.copy_from_slice(max);
    for (key, row) in scores.chunks_exact_mut(width).enumerate() {
        let key = key as f32;
        for ((x, m), &seen) in row.iter_mut().zip(&mut **correction).zip(visible) {
            *x = if key < seen {
                *x * scale
            } else {
                f32::NEG_INFINITY
            };
            *m = rows::max_step(*m, *x);
        }
    }
    for (c, m) in correction.iter_mut().zip(&mut **max) {
        let new = *c;
        *c = if new == f32::NEG_INFINITY {
            1.0
        } else {
            math::exp(*m - new)
        };
        *m = new;
    }
    // A query's exponentials summed as `rows::exp_sum` sums a row: key j into lane j % LANES.
    partials.fill(0.0);
    for (key, row) in scores.chunks_exact_mut(width).enumerate() {
        let lane = &mut partials[(key % rows::LANES) * width..][..width];
        for ((x, &m), s) in row.iter_mut().zip(&**max).zip(lane) {
            *x = if m == f32::NEG_INFINITY {
                0.0
            } else {
                math::exp(*x - m)
            };
            *s += *x;
        }
    }
    rows::tree_sums(partials, width);
    for ((s, &c), &added) in sum.iter_mut().zip(&**correction).zip(&**partials) {
        *s = *s * c + added;
    }
}

dispatch_avx512! {
    /// One key block's step of the online softmax over a transposed score tile: `scores` holds
    /// the block's keys as rows of one lane per query, lane `r` seeing the first `visible[r]`
    /// keys. Each lane's scores are scaled and its maximum raised to theirs, the scores replaced
    /// by `e^(score − max)` (0 where masked or while the lane has seen no key), and its sum set
    /// to `sum · correction` plus their sum, with `correction = e^(old max − new max)` (1 while
    /// the lane has seen no key): a query's bits are those of a row-by-row softmax over `rows`'
    /// helpers, whatever tile it shares.
    fn softmax_block(
        scores: &mut [f32],
        visible: &[f32],
        scale: f32,
        lanes: &mut Lanes<'_>,
    ) = softmax_block_body;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference;
    use crate::testing::{assert_close_in, assert_same_bits, in_pool, Precision, Rng};
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    struct Case {
        b: usize,
        s: usize,
        t: usize,
        hkv: usize,
        group: usize,
        d: usize,
        causal: bool,
        scale: Option<f64>,
        params: AttentionParams,
        precision: Precision,
        seed: u64,
    }

    fn case() -> impl Strategy<Value = Case> {
        let dims = (1usize..3, 1usize..40, 0usize..40, 1usize..3, 1usize..4);
        let d = prop::sample::select(vec![1usize, 2, 7, 16, 33, 64]);
        let blocks = (
            prop::sample::select(vec![1usize, 3, 16, 64]),
            prop::sample::select(vec![1usize, 5, 16, 64]),
            prop::sample::select(vec![Isa::Auto, Isa::Portable]),
        );
        let scale = prop::option::of(-1.0f64..2.0);
        let prec = prop::sample::select(Precision::ALL.to_vec());
        (dims, d, any::<bool>(), scale, blocks, prec, any::<u64>()).prop_map(
            |((b, s, t, hkv, group), d, causal, scale, (bq, bk, isa), precision, seed)| Case {
                b,
                s,
                t,
                hkv,
                group,
                d,
                causal,
                scale,
                params: AttentionParams {
                    block_q: bq,
                    block_k: bk,
                    min_parallel_flops: 0,
                    isa,
                },
                precision,
                seed,
            },
        )
    }

    fn check(c: &Case) {
        let mut rng = Rng::new(c.seed);
        let p = c.precision;
        let hq = c.hkv * c.group;
        let q_shape = [c.b, c.s, hq, c.d];
        let kv_shape = [c.b, c.t, c.hkv, c.d];
        let q = p.round_vec(rng.vec(q_shape.iter().product(), 2.0));
        let k = p.round_vec(rng.vec(kv_shape.iter().product(), 2.0));
        let v = p.round_vec(rng.vec(kv_shape.iter().product(), 1.0));
        let t = |d, s| TensorRef::new("t", d, s).unwrap();
        let want = reference::attention(
            t(&q, &q_shape),
            t(&k, &kv_shape),
            t(&v, &kv_shape),
            c.causal,
            c.scale,
        )
        .unwrap();
        let run = || {
            let mut out = vec![f32::NAN; q.len()];
            attention(
                t(&q, &q_shape),
                t(&k, &kv_shape),
                t(&v, &kv_shape),
                c.causal,
                c.scale,
                &c.params,
                &mut out,
            )
            .unwrap();
            out
        };
        let one = in_pool(1, run);
        let two = in_pool(2, run);
        assert_same_bits("attention threads", &one, &two);
        // Outputs are convex combinations of values in [-1, 1].
        assert_close_in(p, "attention", &one, &want.data, 2e-5, 1e-4);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        #[test]
        fn fast_matches_reference(c in case()) {
            check(&c);
        }
    }

    /// Two key blocks of a transposed tile through `softmax_block` give each query the bits of
    /// the row-by-row online softmax over `rows`' helpers (scale, mask, max, `exp_sum`, the
    /// sum rescaled and added): its maxima, sums and weights, for queries that see every key,
    /// some, or none of a block or of both.
    #[test]
    fn lane_softmax_has_the_bits_of_the_row_by_row_one() {
        let (width, keys, scale) = (21, 160, 0.37f32);
        let mut rng = Rng::new(11);
        let scores = rng.vec(keys * width, 4.0);
        // Visible keys per query: none, within the first block, into the second, all.
        let seen: Vec<usize> = (0..width)
            .map(|r| if r + 1 == width { keys } else { r * 7 })
            .collect();
        let blocks = [0..100, 100..keys];
        let (mut max, mut sum) = (vec![f32::NEG_INFINITY; width], vec![0.0; width]);
        let (mut correction, mut partials) = (vec![0.0; width], vec![0.0; rows::LANES * width]);
        let mut weights = vec![0.0; keys * width];
        for block in blocks.clone() {
            let mut tile = scores[block.start * width..block.end * width].to_vec();
            let visible: Vec<f32> = seen
                .iter()
                .map(|&n| n.saturating_sub(block.start).min(block.len()) as f32)
                .collect();
            let mut lanes = Lanes {
                max: &mut max,
                sum: &mut sum,
                correction: &mut correction,
                partials: &mut partials,
            };
            softmax_block(&mut tile, &visible, scale, &mut lanes);
            weights[block.start * width..block.end * width].copy_from_slice(&tile);
        }
        for (r, &n) in seen.iter().enumerate() {
            let (mut row_max, mut row_sum) = (f32::NEG_INFINITY, 0.0f32);
            for block in blocks.clone() {
                let mut row: Vec<f32> = block.clone().map(|j| scores[j * width + r]).collect();
                rows::scale(&mut row, scale);
                row[n.saturating_sub(block.start).min(block.len())..].fill(f32::NEG_INFINITY);
                let new_max = row_max.max(rows::max(&row));
                if new_max == f32::NEG_INFINITY {
                    row.fill(0.0);
                } else {
                    let correction = rows::exp_one(row_max - new_max);
                    row_sum = row_sum * correction + rows::exp_sum(&mut row, 1.0, new_max);
                    row_max = new_max;
                }
                let lane: Vec<f32> = block.map(|j| weights[j * width + r]).collect();
                assert_same_bits(&format!("query {r}'s weights"), &lane, &row);
            }
            assert_same_bits(&format!("query {r}'s maximum"), &[max[r]], &[row_max]);
            assert_same_bits(&format!("query {r}'s sum"), &[sum[r]], &[row_sum]);
        }
    }

    #[test]
    fn query_tiling_does_not_change_bits() {
        let mut rng = Rng::new(5);
        let (qs, ks) = ([2, 37, 4, 24], [2, 41, 2, 24]);
        let q = rng.vec(qs.iter().product(), 1.0);
        let k = rng.vec(ks.iter().product(), 1.0);
        let v = rng.vec(ks.iter().product(), 1.0);
        let run = |block_q| {
            let mut out = vec![0.0; q.len()];
            let params = AttentionParams {
                block_q,
                ..Default::default()
            };
            let t = |d, s| TensorRef::new("t", d, s).unwrap();
            attention(
                t(&q, &qs),
                t(&k, &ks),
                t(&v, &ks),
                true,
                None,
                &params,
                &mut out,
            )
            .unwrap();
            out
        };
        let base = run(1);
        for bq in [7, 32, 64] {
            assert_same_bits("block_q", &base, &run(bq));
        }
    }

    /// A long sequence in many query tiles (one task each) and in one: the same bits, on one
    /// thread and on two, and the reference's values.
    #[test]
    fn long_sequences_split_over_tasks_keep_their_bits() {
        let mut rng = Rng::new(9);
        let shape = [1, 300, 1, 16];
        let [q, k, v] = [0; 3].map(|_| rng.vec(shape.iter().product(), 1.0));
        let t = |d| TensorRef::new("t", d, &shape).unwrap();
        let run = |block_q, threads| {
            let params = AttentionParams {
                block_q,
                block_k: 64,
                min_parallel_flops: 0,
                ..Default::default()
            };
            in_pool(threads, || {
                let mut out = vec![f32::NAN; q.len()];
                attention(t(&q), t(&k), t(&v), true, None, &params, &mut out).unwrap();
                out
            })
        };
        let tiled = run(16, 1);
        assert_same_bits("19 tiles vs 1 tile", &tiled, &run(300, 1));
        assert_same_bits("19 tiles on 2 threads", &tiled, &run(16, 2));
        let want = reference::attention(t(&q), t(&k), t(&v), true, None).unwrap();
        assert_close_in(Precision::F32, "attention", &tiled, &want.data, 2e-5, 1e-4);
    }

    #[test]
    fn rejects_bad_shapes() {
        let x = [0.0f32; 8];
        let mut out = [0.0f32; 8];
        let t = |s: &'static [usize]| TensorRef {
            data: &x[..s.iter().product::<usize>()],
            shape: s,
        };
        let p = AttentionParams::default();
        // Three query heads cannot share two kv heads.
        assert!(attention(
            t(&[1, 1, 3, 2]),
            t(&[1, 1, 2, 2]),
            t(&[1, 1, 2, 2]),
            false,
            None,
            &p,
            &mut out[..6]
        )
        .is_err());
        // Head dims differ.
        assert!(attention(
            t(&[1, 1, 2, 2]),
            t(&[1, 2, 1, 1]),
            t(&[1, 2, 1, 1]),
            false,
            None,
            &p,
            &mut out[..4]
        )
        .is_err());
        // Output too short.
        assert!(attention(
            t(&[1, 2, 2, 2]),
            t(&[1, 2, 2, 2]),
            t(&[1, 2, 2, 2]),
            true,
            None,
            &p,
            &mut out[..7]
        )
        .is_err());
        let zero = AttentionParams {
            block_q: 0,
            ..Default::default()
        };
        assert!(attention(
            t(&[1, 2, 2, 2]),
            t(&[1, 2, 2, 2]),
            t(&[1, 2, 2, 2]),
            true,
            None,
            &zero,
            &mut out
        )
        .is_err());
    }
}
