//! A matmul planned once for fixed operand shapes: the batch layout, broadcasting and bias
//! strides are resolved by [`GemmPlan::new`], so [`GemmPlan::run`] only points the packed GEMM
//! at the operands, without allocating. The executor plans each step once at setup; the
//! convenience [`super::matmul`] plans and runs in one call.

use super::gemm::{BiasRef, Gemm, HalfType, PackedB, Problem, RightForm};
use super::pack::MatRef;
use super::{matmul_output_shape, MatmulParams, MicroKernel};
use crate::activation::Activation;
use crate::error::{KernelError, KernelResult};
use crate::shape::{broadcast_shapes, broadcast_strides, check_len, for_each_offset};

/// Where one matrix of a batched operand sits in its buffer, as used (transposed or not).
#[derive(Clone, Copy, Debug, PartialEq)]
struct MatDesc {
    offset: usize,
    rs: usize,
    cs: usize,
    rows: usize,
    cols: usize,
}

impl MatDesc {
    fn on(self, data: &[f32]) -> MatRef<'_> {
        MatRef {
            data,
            offset: self.offset,
            rs: self.rs,
            cs: self.cs,
            rows: self.rows,
            cols: self.cols,
        }
    }
}

/// Matrices per operand whose references live on the stack during a call.
const INLINE: usize = 64;
const NO_MAT: MatRef<'static> = MatRef {
    data: &[],
    offset: 0,
    rs: 0,
    cs: 0,
    rows: 0,
    cols: 0,
};

/// `activation(op(a) @ op(b) + bias)` for fixed operand shapes, NumPy batch broadcasting.
#[derive(Clone, Debug)]
pub struct GemmPlan {
    m: usize,
    n: usize,
    k: usize,
    a: Vec<MatDesc>,
    b: Vec<MatDesc>,
    problems: Vec<Problem>,
    /// Row and column strides of the bias, broadcast to one product.
    bias: Option<(usize, usize)>,
    lens: [usize; 4],
}

/// The product of `dims`, or an error when it overflows.
fn checked_product(dims: &[usize]) -> KernelResult<usize> {
    dims.iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| KernelError::new("matmul", format!("shape {dims:?} has too many elements")))
}

/// An empty vector with room for `count` items, or an error when the memory cannot be had
/// (a batch far too large to plan), instead of aborting.
fn room_for<T>(count: usize) -> KernelResult<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(count).map_err(|_| {
        KernelError::new(
            "matmul",
            format!("a batch of {count} products is too large to plan"),
        )
    })?;
    Ok(v)
}

/// The matrices of a batched operand of `shape`, each transposed when asked.
fn mats(shape: &[usize], transpose: bool) -> KernelResult<Vec<MatDesc>> {
    let (sr, sc) = (shape[shape.len() - 2], shape[shape.len() - 1]);
    let count = checked_product(&shape[..shape.len() - 2])?;
    checked_product(shape)?;
    let mut out = room_for(count)?;
    out.extend((0..count).map(|i| {
        let m = MatDesc {
            offset: i * sr * sc,
            rs: sc,
            cs: 1,
            rows: sr,
            cols: sc,
        };
        if transpose {
            MatDesc {
                rs: m.cs,
                cs: m.rs,
                rows: m.cols,
                cols: m.rows,
                ..m
            }
        } else {
            m
        }
    }));
    Ok(out)
}

impl GemmPlan {
    /// Plans `a [..., m, k] @ b [..., k, n] (+ bias)` with the transposition flags.
    pub fn new(
        a: &[usize],
        b: &[usize],
        bias: Option<&[usize]>,
        transpose_a: bool,
        transpose_b: bool,
    ) -> KernelResult<GemmPlan> {
        let out = matmul_output_shape(a, b, transpose_a, transpose_b)?;
        let rank = out.len();
        let (m, n) = (out[rank - 2], out[rank - 1]);
        let k = if transpose_a {
            a[a.len() - 2]
        } else {
            a[a.len() - 1]
        };
        let bias_strides = match bias {
            None => None,
            Some(shape) => {
                if broadcast_shapes("matmul", &[&out, shape])? != out {
                    return Err(KernelError::new(
                        "matmul",
                        format!(
                            "bias shape {shape:?} does not broadcast to the output shape {out:?}"
                        ),
                    ));
                }
                Some(broadcast_strides(shape, &out))
            }
        };
        let lens = [
            checked_product(a)?,
            checked_product(b)?,
            bias.map_or(Ok(0), checked_product)?,
            checked_product(&out)?,
        ];
        let a_mats = mats(a, transpose_a)?;
        let b_mats = mats(b, transpose_b)?;
        let bias_rows_free = bias_strides
            .as_ref()
            .is_none_or(|s| s[..rank - 1].iter().all(|&x| x == 0));
        let bias_rc = bias_strides.as_ref().map(|s| (s[rank - 2], s[rank - 1]));
        // A batch of row-major A against one B is a single taller product.
        if b_mats.len() == 1 && !transpose_a && a_mats.len() > 1 && bias_rows_free {
            let rows = a_mats.len() * m;
            let a = MatDesc {
                offset: 0,
                rs: k,
                cs: 1,
                rows,
                cols: k,
            };
            return Ok(GemmPlan {
                m: rows,
                n,
                k,
                a: vec![a],
                b: b_mats,
                problems: vec![Problem {
                    a: 0,
                    b: 0,
                    c_offset: 0,
                    bias_offset: 0,
                }],
                bias: bias_rc,
                lens,
            });
        }
        let batch = &out[..rank - 2];
        let count = checked_product(batch)?;
        let index = |shape: &[usize]| -> KernelResult<Vec<usize>> {
            let strides = broadcast_strides(&shape[..shape.len() - 2], batch);
            let mut idx = room_for(count)?;
            for_each_offset(batch, &strides, |o| idx.push(o));
            Ok(idx)
        };
        let (a_idx, b_idx) = (index(a)?, index(b)?);
        let mut bias_off = room_for(count)?;
        match &bias_strides {
            Some(s) => for_each_offset(batch, &s[..rank - 2], |o| bias_off.push(o)),
            None => bias_off.resize(count, 0),
        }
        let mut problems = room_for(count)?;
        problems.extend((0..count).map(|i| Problem {
            a: a_idx[i],
            b: b_idx[i],
            c_offset: i * m * n,
            bias_offset: bias_off[i],
        }));
        Ok(GemmPlan {
            m,
            n,
            k,
            a: a_mats,
            b: b_mats,
            problems,
            bias: bias_rc,
            lens,
        })
    }

    /// Computes the planned product into `out`, then applies `epilogue` to it.
    pub fn run(
        &self,
        a: &[f32],
        b: &[f32],
        epilogue: Epilogue<'_>,
        params: &MatmulParams,
        out: &mut [f32],
    ) -> KernelResult<()> {
        self.launch(a, Right::Raw(b), epilogue, params, out)
    }

    /// Rows of the product (all batches of a row-major A against one B count as one taller
    /// product): what decides the GEMM's path.
    pub fn rows(&self) -> usize {
        self.m
    }

    /// Values B takes once packed by [`GemmPlan::pack_b`] (or [`GemmPlan::pack_b_half`]) for
    /// the micro-kernel `params` pick.
    pub fn packed_b_values(&self, params: &MatmulParams) -> KernelResult<usize> {
        let nr = MicroKernel::select(params.isa)?.nr;
        Ok(self.b.len() * self.n.div_ceil(nr) * self.k * nr)
    }

    /// The scratch (f32) one call asks for with B in `form` ([`Gemm::scratch_len`]): what the
    /// memory plan reserves for this product.
    pub fn scratch_floats(&self, params: &MatmulParams, form: RightForm) -> KernelResult<usize> {
        let a: Vec<MatRef<'_>> = self.a.iter().map(|d| d.on(&[])).collect();
        let b: Vec<MatRef<'_>> = self.b.iter().map(|d| d.on(&[])).collect();
        let gemm = self.gemm(&a, &b, Epilogue::default(), params)?;
        Ok(gemm.scratch_len(params, false, form))
    }

    /// Packs B into `dst` ([`GemmPlan::packed_b_values`] floats) in the layout the micro-kernel
    /// `params` pick reads, once, for [`GemmPlan::run_prepacked`] to use on every call (a
    /// weight does not change between calls).
    pub fn pack_b(&self, b: &[f32], params: &MatmulParams, dst: &mut [f32]) -> KernelResult<()> {
        let len = dst.len();
        self.packing(b, params, len, |g, parallel| g.pack_b(parallel, dst))
    }

    /// As [`GemmPlan::pack_b`], into panels of `half` (exact where B's values are that
    /// format's: a weight stored in it), read by the unpacked-A path
    /// ([`MatmulParams::half_b_rows`]).
    pub fn pack_b_half(
        &self,
        b: &[f32],
        params: &MatmulParams,
        half: HalfType,
        dst: &mut [u16],
    ) -> KernelResult<()> {
        let len = dst.len();
        self.packing(b, params, len, |g, parallel| {
            g.pack_b_half(parallel, half, dst)
        })
    }

    /// Checks B and a packing destination of `dst_len` values, then calls `pack` with the
    /// product over B alone and whether to pack in parallel.
    fn packing(
        &self,
        b: &[f32],
        params: &MatmulParams,
        dst_len: usize,
        pack: impl FnOnce(&Gemm<'_>, bool),
    ) -> KernelResult<()> {
        check_len("matmul", "b", b.len(), &[self.lens[1]])?;
        check_len(
            "matmul",
            "packed b",
            dst_len,
            &[self.packed_b_values(params)?],
        )?;
        let b_refs: Vec<MatRef<'_>> = self.b.iter().map(|d| d.on(b)).collect();
        let gemm = self.gemm(&[], &b_refs, Epilogue::default(), params)?;
        pack(&gemm, rayon::current_num_threads() > 1);
        Ok(())
    }

    /// As [`GemmPlan::run`], with B already packed by [`GemmPlan::pack_b`] (or
    /// [`GemmPlan::pack_b_half`]) with the same `params`: no packing of B at all. Same bits
    /// as `run`.
    pub fn run_prepacked(
        &self,
        a: &[f32],
        packed_b: PackedB<'_>,
        epilogue: Epilogue<'_>,
        params: &MatmulParams,
        out: &mut [f32],
    ) -> KernelResult<()> {
        check_len(
            "matmul",
            "packed b",
            packed_b.len(),
            &[self.packed_b_values(params)?],
        )?;
        self.launch(a, Right::Packed(packed_b), epilogue, params, out)
    }

    /// The GEMM over the given operand views.
    fn gemm<'g>(
        &'g self,
        a: &'g [MatRef<'g>],
        b: &'g [MatRef<'g>],
        epilogue: Epilogue<'g>,
        params: &MatmulParams,
    ) -> KernelResult<Gemm<'g>> {
        Ok(Gemm {
            m: self.m,
            n: self.n,
            k: self.k,
            a,
            b,
            problems: &self.problems,
            ldc: self.n,
            accumulate: false,
            bias: epilogue
                .bias
                .zip(self.bias)
                .map(|(data, (rs, cs))| BiasRef { data, rs, cs }),
            activation: epilogue.activation,
            multiplier: epilogue.multiplier,
            kernel: MicroKernel::select(params.isa)?,
        })
    }

    /// Checks the buffers and runs the product, B raw or packed.
    fn launch(
        &self,
        a: &[f32],
        b: Right<'_>,
        epilogue: Epilogue<'_>,
        params: &MatmulParams,
        out: &mut [f32],
    ) -> KernelResult<()> {
        let [la, lb, lbias, lout] = self.lens;
        check_len("matmul", "a", a.len(), &[la])?;
        if let Right::Raw(b) = b {
            check_len("matmul", "b", b.len(), &[lb])?;
        }
        check_len("matmul", "out", out.len(), &[lout])?;
        if let Some(bias) = epilogue.bias {
            check_len("matmul", "bias", bias.len(), &[lbias])?;
        }
        if let Some(multiplier) = epilogue.multiplier {
            check_len("matmul", "multiplier", multiplier.len(), &[lout])?;
        }
        // A packed B is read from its panels only; its views carry the geometry.
        let (raw_b, packed_b) = match b {
            Right::Raw(b) => (b, None),
            Right::Packed(p) => (&[][..], Some(p)),
        };
        let (mut a_inline, mut b_inline) = ([NO_MAT; INLINE], [NO_MAT; INLINE]);
        let (a_heap, b_heap): (Vec<MatRef<'_>>, Vec<MatRef<'_>>);
        let a_refs: &[MatRef<'_>] = if self.a.len() <= INLINE {
            for (r, d) in a_inline.iter_mut().zip(&self.a) {
                *r = d.on(a);
            }
            &a_inline[..self.a.len()]
        } else {
            a_heap = self.a.iter().map(|d| d.on(a)).collect();
            &a_heap
        };
        let b_refs: &[MatRef<'_>] = if self.b.len() <= INLINE {
            for (r, d) in b_inline.iter_mut().zip(&self.b) {
                *r = d.on(raw_b);
            }
            &b_inline[..self.b.len()]
        } else {
            b_heap = self.b.iter().map(|d| d.on(raw_b)).collect();
            &b_heap
        };
        self.gemm(a_refs, b_refs, epilogue, params)?
            .run_packed(out, params, None, packed_b);
        Ok(())
    }
}

/// What a planned product applies to its result, in this order, while each tile is in cache:
/// `act(a @ b + bias) * multiplier` (`fused_matmul`'s epilogue).
#[derive(Clone, Copy, Debug, Default)]
pub struct Epilogue<'a> {
    /// Added first, broadcast as planned ([`GemmPlan::new`]'s bias shape).
    pub bias: Option<&'a [f32]>,
    /// Applied to the sum.
    pub activation: Activation,
    /// Multiplies last, elementwise: the output's own shape.
    pub multiplier: Option<&'a [f32]>,
}

/// The right operand of a call: as stored, or packed ahead by [`GemmPlan::pack_b`].
#[derive(Clone, Copy)]
enum Right<'a> {
    Raw(&'a [f32]),
    Packed(PackedB<'a>),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_broadcast_batches_are_errors_not_aborts() {
        let huge = 1usize << 40;
        // Overflows usize in the element count.
        assert!(GemmPlan::new(&[huge, huge, 2, 2], &[2, 2], None, false, false).is_err());
        // A count that fits but whose plan cannot be allocated (more than `isize::MAX` bytes,
        // so this fails the same way whatever the machine's overcommit policy).
        let count = 1usize << 60;
        assert!(GemmPlan::new(&[count, 1, 1], &[1, 1], None, true, false).is_err());
        assert!(GemmPlan::new(&[count, 1, 1], &[1, 1], None, false, false).is_err());
        assert!(GemmPlan::new(&[3, 2, 4], &[3, 4, 5], None, false, false).is_ok());
    }
}
