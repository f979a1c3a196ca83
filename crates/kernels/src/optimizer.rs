//! Fused optimizer updates ([`adam_update`], [`sgd_update`]): each element of a parameter, its
//! gradient and its moments (or momentum buffer) is read once and the new values written once —
//! Adam's 28 bytes of traffic per element instead of the 40 that the separate moment and
//! parameter programs move, SGD's 20 instead of 28. Each operation is the
//! f32 operation the unfused graph performs, in the same order, so the results have its bits.

use super::cpu::dispatch_avx2;
use super::elementwise::ElementwiseParams;
use super::error::{KernelError, KernelResult};
use super::par::{self, SyncPtr};

/// The constants of one Adam / AdamW step (the op's attributes and scalar inputs, in f32 as
/// the graph's constants are).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamStep {
    /// β1 and 1 − β1.
    pub beta1: [f32; 2],
    /// β2 and 1 − β2.
    pub beta2: [f32; 2],
    /// Added to the bias-corrected root of v.
    pub eps: f32,
    /// The weight decay (0: none).
    pub weight_decay: f32,
    /// AdamW's decoupled decay `p − lr·wd·p` (else Adam's `g + wd·p`).
    pub decoupled: bool,
    /// The step's learning rate.
    pub lr: f32,
    /// `lr / (1 − β1^t)`.
    pub step_size: f32,
    /// `√(1 − β2^t)`.
    pub bc2_sqrt: f32,
    /// What the gradient is multiplied by first: the clipping coefficient, the reciprocal of
    /// the loss scale (1: neither).
    pub g_scale: f32,
}

impl AdamStep {
    /// The step of attributes `beta1`, `beta2`, `eps`, `weight_decay`, `decoupled` and scalar
    /// inputs `lr`, `step_size`, `bc2_sqrt`, `g_scale`; each attribute rounded to f32 as a
    /// graph constant.
    pub fn new(
        beta1: f64,
        beta2: f64,
        eps: f64,
        weight_decay: f64,
        decoupled: bool,
        [lr, step_size, bc2_sqrt, g_scale]: [f32; 4],
    ) -> AdamStep {
        AdamStep {
            beta1: [beta1 as f32, (1.0 - beta1) as f32],
            beta2: [beta2 as f32, (1.0 - beta2) as f32],
            eps: eps as f32,
            weight_decay: weight_decay as f32,
            decoupled,
            lr,
            step_size,
            bc2_sqrt,
            g_scale,
        }
    }
}

/// One element's Adam step: the new `[p, m, v]` from `p`, `g`, `m`, `v` (`lr_wd` is
/// `s.lr · s.weight_decay`, computed once per call).
#[inline(always)]
fn update_one(s: &AdamStep, lr_wd: f32, [mut p, g, m, v]: [f32; 4]) -> [f32; 3] {
    let mut g = g * s.g_scale;
    if s.weight_decay != 0.0 && s.decoupled {
        p -= p * lr_wd;
    } else if s.weight_decay != 0.0 {
        g += s.weight_decay * p;
    }
    let m = s.beta1[0] * m + s.beta1[1] * g;
    let v = s.beta2[0] * v + s.beta2[1] * (g * g);
    let denom = v.sqrt() / s.bc2_sqrt + s.eps;
    [p - m / denom * s.step_size, m, v]
}

/// One Adam step over equal-length slices: `[p, g, m, v]` into `[p_out, m_out, v_out]`.
#[inline(always)]
fn update_body(s: &AdamStep, [p, g, m, v]: [&[f32]; 4], [p_out, m_out, v_out]: [&mut [f32]; 3]) {
    let lr_wd = s.lr * s.weight_decay;
    let n = p_out.len();
    let (p, g, m, v, m_out, v_out) = (
        &p[..n],
        &g[..n],
        &m[..n],
        &v[..n],
        &mut m_out[..n],
        &mut v_out[..n],
    );
    for i in 0..n {
        [p_out[i], m_out[i], v_out[i]] = update_one(s, lr_wd, [p[i], g[i], m[i], v[i]]);
    }
}

/// One Adam step over equal-length slices, in place: `p`, `m` and `v` become their new values.
#[inline(always)]
fn update_in_place_body(s: &AdamStep, g: &[f32], p: &mut [f32], m: &mut [f32], v: &mut [f32]) {
    let lr_wd = s.lr * s.weight_decay;
    let n = p.len();
    let (g, m, v) = (&g[..n], &mut m[..n], &mut v[..n]);
    for i in 0..n {
        [p[i], m[i], v[i]] = update_one(s, lr_wd, [p[i], g[i], m[i], v[i]]);
    }
}

dispatch_avx2! {
    fn update_in_place(s: &AdamStep, g: &[f32], p: &mut [f32], m: &mut [f32], v: &mut [f32]) =
        update_in_place_body;
}

/// [`update_body`] writing the results with streaming stores: the new values are next read a
/// whole step later, so writing them around the caches spares reading every destination line
/// first — a quarter of the update's memory traffic. The same operations in the same order
/// (no fused multiply-adds), so the same bits. Elements before the destinations are 32-byte
/// aligned, and after the last whole vector, go through [`update_body`]; destinations not
/// aligned alike go through it whole.
///
/// # Safety
/// The CPU must support AVX2 and FMA; the slices must have `p_out`'s length at least.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn update_streaming(
    s: &AdamStep,
    [p, g, m, v]: [&[f32]; 4],
    [p_out, m_out, v_out]: [&mut [f32]; 3],
) {
    use std::arch::x86_64::*;
    const LANES: usize = 8;
    let n = p_out.len();
    let misalignment = |x: &[f32]| (x.as_ptr() as usize / 4) % LANES;
    let head = (LANES - misalignment(p_out)) % LANES;
    if n < head + LANES
        || misalignment(m_out) != misalignment(p_out)
        || misalignment(v_out) != misalignment(p_out)
    {
        return update_body(s, [p, g, m, v], [p_out, m_out, v_out]);
    }
    let body_end = head + (n - head) / LANES * LANES;
    let heads = [&mut p_out[..head], &mut m_out[..head], &mut v_out[..head]];
    update_body(s, [p, g, m, v], heads);
    let decay = s.weight_decay != 0.0;
    let splat = _mm256_set1_ps;
    let (wd, lr_wd) = (splat(s.weight_decay), splat(s.lr * s.weight_decay));
    let (b1, c1, b2, c2) = (
        splat(s.beta1[0]),
        splat(s.beta1[1]),
        splat(s.beta2[0]),
        splat(s.beta2[1]),
    );
    let (bc2, eps, step_size) = (splat(s.bc2_sqrt), splat(s.eps), splat(s.step_size));
    let g_scale = splat(s.g_scale);
    for i in (head..body_end).step_by(LANES) {
        // SAFETY: i + LANES <= body_end <= n, inside every slice; the destinations at i are
        // 32-byte aligned (head aligned p_out, and the others share its misalignment).
        unsafe {
            let load = |x: &[f32]| _mm256_loadu_ps(x.as_ptr().add(i));
            let (mut pv, mut gv) = (load(p), _mm256_mul_ps(load(g), g_scale));
            if decay && s.decoupled {
                pv = _mm256_sub_ps(pv, _mm256_mul_ps(pv, lr_wd));
            } else if decay {
                gv = _mm256_add_ps(gv, _mm256_mul_ps(wd, pv));
            }
            let mv = _mm256_add_ps(_mm256_mul_ps(b1, load(m)), _mm256_mul_ps(c1, gv));
            let vv = _mm256_add_ps(
                _mm256_mul_ps(b2, load(v)),
                _mm256_mul_ps(c2, _mm256_mul_ps(gv, gv)),
            );
            let denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vv), bc2), eps);
            let pn = _mm256_sub_ps(pv, _mm256_mul_ps(_mm256_div_ps(mv, denom), step_size));
            _mm256_stream_ps(p_out.as_mut_ptr().add(i), pn);
            _mm256_stream_ps(m_out.as_mut_ptr().add(i), mv);
            _mm256_stream_ps(v_out.as_mut_ptr().add(i), vv);
        }
    }
    // Streaming stores are weakly ordered: make them visible before the task ends.
    _mm_sfence();
    let tail = body_end..n;
    update_body(
        s,
        [p, g, m, v].map(|x| &x[tail.clone()]),
        [p_out, m_out, v_out].map(|x| &mut x[tail.clone()]),
    );
}

/// `adam_update`: the new parameter, first and second moments of one Adam / AdamW step into
/// `out = [p, m, v]`, blocks of `params.block` elements in parallel for large parameters.
pub fn adam_update(
    step: &AdamStep,
    inputs: [&[f32]; 4],
    params: &ElementwiseParams,
    out: [&mut [f32]; 3],
) -> KernelResult<()> {
    let [p, g, m, v] = inputs;
    let operands = "p, g, m, v and the three results";
    for_each_block(
        "adam_update",
        operands,
        params,
        &inputs,
        out,
        |at, [p_out, m_out, v_out]| {
            let r = at..at + p_out.len();
            let (p, g, m, v) = (&p[r.clone()], &g[r.clone()], &m[r.clone()], &v[r]);
            #[cfg(target_arch = "x86_64")]
            if crate::cpu::has_avx2_fma() {
                // SAFETY: the CPU supports AVX2 and FMA (checked just above); every slice has
                // p_out's length.
                return unsafe { update_streaming(step, [p, g, m, v], [p_out, m_out, v_out]) };
            }
            // Without AVX2, the portable build of the same operations.
            update_body(step, [p, g, m, v], [p_out, m_out, v_out]);
        },
    )
}

/// Runs `f(at, blocks)` on the blocks of `params.block` elements, starting at element `at`, of
/// `N` slices (in parallel for slices of `params.min_parallel_elems` or more), after checking
/// that they and the slices `f` reads (`reads`) have one length: an error naming `operands`
/// otherwise.
fn for_each_block<const N: usize>(
    op: &'static str,
    operands: &str,
    params: &ElementwiseParams,
    reads: &[&[f32]],
    slices: [&mut [f32]; N],
    f: impl Fn(usize, [&mut [f32]; N]) + Sync,
) -> KernelResult<()> {
    if params.block == 0 {
        return Err(KernelError::new(op, "block must be at least 1"));
    }
    let n = slices.first().map_or(0, |x| x.len());
    if slices.iter().any(|x| x.len() != n) || reads.iter().any(|x| x.len() != n) {
        return Err(KernelError::new(
            op,
            format!("{operands} must have one length"),
        ));
    }
    let ptrs = slices.map(|x| SyncPtr(x.as_mut_ptr()));
    let parallel = n >= params.min_parallel_elems;
    par::for_each_index(parallel, n.div_ceil(params.block), |i| {
        let at = i * params.block;
        let len = params.block.min(n - at);
        // SAFETY: block i (elements at..at + len, inside every slice, all n long) belongs to
        // this task alone.
        let blocks = ptrs.map(|p| unsafe { std::slice::from_raw_parts_mut(p.get().add(at), len) });
        f(at, blocks);
    });
    Ok(())
}

/// [`adam_update`] in place, as `torch.optim` updates: `state = [p, m, v]` becomes the new
/// parameter and moments (the same bits), with no second buffer for them.
pub fn adam_update_in_place(
    step: &AdamStep,
    g: &[f32],
    params: &ElementwiseParams,
    state: [&mut [f32]; 3],
) -> KernelResult<()> {
    let operands = "p, g, m and v";
    for_each_block(
        "adam_update",
        operands,
        params,
        &[g],
        state,
        |at, [p, m, v]| update_in_place(step, &g[at..at + p.len()], p, m, v),
    )
}

/// The constants of one step of SGD with momentum (the op's attributes and scalar inputs, in
/// f32 as the graph's constants are).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdStep {
    /// The momentum factor.
    pub momentum: f32,
    /// The weight decay; `decay` says whether it is added at all.
    pub weight_decay: f32,
    /// Whether the gradient gets `weight_decay · p` added (a decay above 0).
    pub decay: bool,
    /// Nesterov's step `g + momentum · buf` instead of `buf`.
    pub nesterov: bool,
    /// The step's learning rate.
    pub lr: f32,
    /// What the gradient is multiplied by first (1: nothing).
    pub g_scale: f32,
}

impl SgdStep {
    /// The step of attributes `momentum`, `weight_decay`, `nesterov` and scalar inputs `lr`,
    /// `g_scale`; each attribute rounded to f32 as a graph constant.
    pub fn new(momentum: f64, weight_decay: f64, nesterov: bool, [lr, g_scale]: [f32; 2]) -> Self {
        SgdStep {
            momentum: momentum as f32,
            weight_decay: weight_decay as f32,
            decay: weight_decay > 0.0,
            nesterov,
            lr,
            g_scale,
        }
    }
}

/// One element's SGD step: the new `[p, buf]` from `p`, `g`, `buf`, each operation the f32
/// operation of the unfused graph (`g + wd·p`, `momentum·buf + g`, `p − d·lr`).
#[inline(always)]
fn sgd_one(s: &SgdStep, [p, g, buf]: [f32; 3]) -> [f32; 2] {
    let mut g = g * s.g_scale;
    if s.decay {
        g += s.weight_decay * p;
    }
    let buf = s.momentum * buf + g;
    let d = if s.nesterov {
        g + s.momentum * buf
    } else {
        buf
    };
    [p - d * s.lr, buf]
}

#[inline(always)]
fn sgd_body(s: &SgdStep, [p, g, buf]: [&[f32]; 3], [p_out, buf_out]: [&mut [f32]; 2]) {
    let n = p_out.len();
    let (p, g, buf, buf_out) = (&p[..n], &g[..n], &buf[..n], &mut buf_out[..n]);
    for i in 0..n {
        [p_out[i], buf_out[i]] = sgd_one(s, [p[i], g[i], buf[i]]);
    }
}

#[inline(always)]
fn sgd_in_place_body(s: &SgdStep, g: &[f32], p: &mut [f32], buf: &mut [f32]) {
    let n = p.len();
    let (g, buf) = (&g[..n], &mut buf[..n]);
    for i in 0..n {
        [p[i], buf[i]] = sgd_one(s, [p[i], g[i], buf[i]]);
    }
}

dispatch_avx2! {
    fn sgd_into(s: &SgdStep, inputs: [&[f32]; 3], out: [&mut [f32]; 2]) = sgd_body;
}

dispatch_avx2! {
    fn sgd_in_place(s: &SgdStep, g: &[f32], p: &mut [f32], buf: &mut [f32]) = sgd_in_place_body;
}

/// `sgd_update`: the new parameter and momentum buffer of one step of SGD with momentum into
/// `out = [p, buf]` from `[p, g, buf]`, one pass, blocks of `params.block` elements in
/// parallel for large parameters.
pub fn sgd_update(
    step: &SgdStep,
    inputs: [&[f32]; 3],
    params: &ElementwiseParams,
    out: [&mut [f32]; 2],
) -> KernelResult<()> {
    let operands = "p, g, buf and the two results";
    for_each_block(
        "sgd_update",
        operands,
        params,
        &inputs,
        out,
        |at, [p_out, buf_out]| {
            let r = at..at + p_out.len();
            sgd_into(step, inputs.map(|x| &x[r.clone()]), [p_out, buf_out]);
        },
    )
}

/// [`sgd_update`] in place: `state = [p, buf]` becomes the new parameter and buffer (the same
/// bits).
pub fn sgd_update_in_place(
    step: &SgdStep,
    g: &[f32],
    params: &ElementwiseParams,
    state: [&mut [f32]; 2],
) -> KernelResult<()> {
    let operands = "p, g and buf";
    for_each_block(
        "sgd_update",
        operands,
        params,
        &[g],
        state,
        |at, [p, buf]| sgd_in_place(step, &g[at..at + p.len()], p, buf),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{assert_same_bits, in_pool, Rng};

    /// Against the update written as the unfused graph computes it, element by element in f32
    /// (same bits), for Adam and AdamW with and without decay, the gradient multiplied first
    /// (by a clipping coefficient, say) or not; 1 and 2 threads agree. The three
    /// results are slices of one buffer 8-aligned apart, as a plan's buffers are, so the
    /// streaming path runs, with heads and tails (blocks of 777).
    #[test]
    fn matches_the_unfused_update_bit_for_bit() {
        let n = 5000;
        let [p, g, m, v] = random_state(n, 3);
        let cases = [(0.0, true, 1.0), (0.1, true, 0.37), (0.01, false, 0.37)];
        for (wd, decoupled, g_scale) in cases {
            let step = AdamStep::new(0.9, 0.95, 1e-8, wd, decoupled, [3e-4, 3e-3, 0.2, g_scale]);
            let params = ElementwiseParams {
                block: 777,
                min_parallel_elems: 0,
            };
            let run = || {
                let stride = n.next_multiple_of(8);
                let mut out = vec![f32::NAN; 3 * stride];
                let (a, rest) = out.split_at_mut(stride);
                let (b, c) = rest.split_at_mut(stride);
                let outs = [&mut a[..n], &mut b[..n], &mut c[..n]];
                adam_update(&step, [&p, &g, &m, &v], &params, outs).unwrap();
                out.chunks(stride)
                    .map(|r| r[..n].to_vec())
                    .collect::<Vec<_>>()
            };
            let got = in_pool(1, run);
            assert_same_bits("threads", &got.concat(), &in_pool(2, run).concat());
            let (wd32, lr_wd) = (wd as f32, 3e-4f32 * wd as f32);
            for i in 0..n {
                let (mut pi, mut gi) = (p[i], g[i] * g_scale);
                if wd > 0.0 && decoupled {
                    pi = pi - pi * lr_wd;
                } else if wd > 0.0 {
                    gi = 1.0 * gi + wd32 * pi;
                }
                let mi = 0.9f32 * m[i] + (1.0f64 - 0.9) as f32 * gi;
                let vi = 0.95f32 * v[i] + (1.0f64 - 0.95) as f32 * (gi * gi);
                let denom = vi.sqrt() / 0.2 + 1e-8f32;
                let want = [pi - (mi / denom) * 3e-3, mi, vi];
                for (k, w) in want.iter().enumerate() {
                    assert_eq!(got[k][i].to_bits(), w.to_bits(), "output {k} element {i}");
                }
            }
        }
    }

    /// `n` random parameters, gradients, first moments and (non-negative) second moments.
    fn random_state(n: usize, seed: u64) -> [Vec<f32>; 4] {
        let mut rng = Rng::new(seed);
        let [p, g, m] = [0, 1, 2].map(|_| rng.vec(n, 1.0));
        let v = rng.vec(n, 1.0).iter().map(|x| x * x).collect();
        [p, g, m, v]
    }

    /// In place, the update gives the bits it writes into buffers of their own, on 1 and 2
    /// threads, with and without decay, in blocks that leave tails.
    #[test]
    fn in_place_matches_the_update_into_other_buffers() {
        let n = 3001;
        let [p, g, m, v] = random_state(n, 7);
        let params = ElementwiseParams {
            block: 640,
            min_parallel_elems: 0,
        };
        for (wd, decoupled) in [(0.0, true), (0.1, true), (0.01, false)] {
            let step = AdamStep::new(0.9, 0.999, 1e-8, wd, decoupled, [1e-3, 2e-3, 0.3, 1.0]);
            let mut want = [vec![0.0; n], vec![0.0; n], vec![0.0; n]];
            let [a, b, c] = &mut want;
            adam_update(&step, [&p, &g, &m, &v], &params, [a, b, c]).unwrap();
            for threads in [1, 2] {
                let got = in_pool(threads, || {
                    let [mut p2, mut m2, mut v2] = [p.clone(), m.clone(), v.clone()];
                    let state = [&mut p2[..], &mut m2[..], &mut v2[..]];
                    adam_update_in_place(&step, &g, &params, state).unwrap();
                    [p2, m2, v2].concat()
                });
                assert_same_bits("in place", &got, &want.concat());
            }
        }
        let mut short = [vec![0.0; n], vec![0.0; n], vec![0.0; n - 1]];
        let [a, b, c] = &mut short;
        let step = AdamStep::new(0.9, 0.999, 1e-8, 0.0, true, [1e-3, 1e-3, 1.0, 1.0]);
        assert!(adam_update_in_place(&step, &g, &params, [a, b, c]).is_err());
    }

    #[test]
    fn lengths_and_block_are_checked() {
        let x = [1.0f32; 4];
        let step = AdamStep::new(0.9, 0.99, 1e-8, 0.0, true, [1e-3, 1e-3, 1.0, 1.0]);
        let p = ElementwiseParams::default();
        let (mut a, mut b, mut c) = ([0.0; 4], [0.0; 4], [0.0; 3]);
        assert!(adam_update(&step, [&x, &x, &x, &x], &p, [&mut a, &mut b, &mut c]).is_err());
        let mut c = [0.0; 4];
        let zero = ElementwiseParams {
            block: 0,
            ..Default::default()
        };
        assert!(adam_update(&step, [&x, &x, &x, &x], &zero, [&mut a, &mut b, &mut c]).is_err());
        assert!(adam_update(&step, [&x, &x, &x, &x], &p, [&mut a, &mut b, &mut c]).is_ok());
    }

    /// SGD with momentum against the unfused graph's f32 arithmetic bit for bit (`g·s + wd·p`,
    /// `momentum·buf + g`, `p − d·lr`), with and without decay, Nesterov and a gradient scale;
    /// in place the same bits; 1 and 2 threads agree (blocks of 640 leave a tail); and within
    /// f32 rounding of the f64 reference.
    #[test]
    fn sgd_matches_the_unfused_update_bit_for_bit() {
        let n = 3001;
        let [p, g, buf, _] = random_state(n, 5);
        let params = ElementwiseParams {
            block: 640,
            min_parallel_elems: 0,
        };
        for (wd, nesterov, g_scale) in [(0.0, false, 1.0), (1e-4, false, 0.37), (0.01, true, 0.5)] {
            let step = SgdStep::new(0.9, wd, nesterov, [0.1, g_scale]);
            let run = || {
                let mut out = [vec![f32::NAN; n], vec![f32::NAN; n]];
                let [a, b] = &mut out;
                sgd_update(&step, [&p, &g, &buf], &params, [a, b]).unwrap();
                out.concat()
            };
            let got = crate::testing::on_one_and_two_threads(run);
            let (wd32, m) = (wd as f32, 0.9f32);
            for i in 0..n {
                let mut gi = g[i] * g_scale;
                if wd > 0.0 {
                    gi += wd32 * p[i];
                }
                let bi = m * buf[i] + gi;
                let d = if nesterov { gi + m * bi } else { bi };
                let want = [p[i] - d * 0.1, bi];
                assert_eq!(got[i].to_bits(), want[0].to_bits(), "p {i}");
                assert_eq!(got[n + i].to_bits(), want[1].to_bits(), "buf {i}");
            }
            let [mut p2, mut b2] = [p.clone(), buf.clone()];
            sgd_update_in_place(&step, &g, &params, [&mut p2, &mut b2]).unwrap();
            assert_same_bits("in place", &[p2, b2].concat(), &got);
            let shape = [n];
            let t = |data| crate::tensor::TensorRef {
                data,
                shape: &shape,
            };
            let reference = crate::reference::sgd_update(
                [t(&p), t(&g), t(&buf)],
                [0.9, wd],
                nesterov,
                [0.1, g_scale],
            )
            .unwrap();
            let want: Vec<f32> = reference.iter().flat_map(|x| x.data.clone()).collect();
            crate::testing::assert_close("reference", &got, &want, 1e-6, 1e-5);
        }
        let mut short = [vec![0.0; n], vec![0.0; n - 1]];
        let [a, b] = &mut short;
        let step = SgdStep::new(0.9, 0.0, false, [0.1, 1.0]);
        assert!(sgd_update_in_place(&step, &g, &params, [a, b]).is_err());
        assert!(sgd_update(&step, [&p, &g, &buf[..n - 1]], &params, [a, b]).is_err());
    }
}
