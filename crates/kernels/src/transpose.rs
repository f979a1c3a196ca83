//! `transpose` (any permutation): dims that stay adjacent are merged first; a preserved last
//! dim becomes run copies, anything else a cache-tiled 2-D transpose per outer index.

use serde::{Deserialize, Serialize};

use super::error::{KernelError, KernelResult};
use super::par::{self, for_each_row_group, RowParams, SyncPtr};
use super::shape::{check_len, normalize_axis, strides};
use super::tensor::TensorRef;

/// Tunable parameters of [`transpose`]; results never depend on them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TransposeParams {
    /// Side of the square tiles of the 2-D transpose.
    pub tile: usize,
    /// Elements of work per parallel task.
    pub task_elems: usize,
    /// Inputs with fewer elements run on the calling thread.
    pub min_parallel_elems: usize,
}

impl Default for TransposeParams {
    fn default() -> Self {
        Self {
            tile: 32,
            task_elems: 1 << 14,
            min_parallel_elems: 1 << 15,
        }
    }
}

/// Checks that `perm` is a permutation of the axes of a rank-`rank` tensor (negative axes count
/// from the end) and returns it with non-negative entries.
pub fn normalize_perm(op: &'static str, perm: &[i64], rank: usize) -> KernelResult<Vec<usize>> {
    if perm.len() != rank {
        return Err(KernelError::new(
            op,
            format!("perm {perm:?} has {} entries for rank {rank}", perm.len()),
        ));
    }
    let mut seen = vec![false; rank];
    let mut out = Vec::with_capacity(rank);
    for &p in perm {
        let a = normalize_axis(op, p, rank)?;
        if std::mem::replace(&mut seen[a], true) {
            return Err(KernelError::new(
                op,
                format!("perm {perm:?} repeats axis {p}"),
            ));
        }
        out.push(a);
    }
    Ok(out)
}

/// The transposed shape: output dim i is input dim `perm[i]`.
pub fn transpose_output_shape(shape: &[usize], perm: &[i64]) -> KernelResult<Vec<usize>> {
    Ok(normalize_perm("transpose", perm, shape.len())?
        .iter()
        .map(|&p| shape[p])
        .collect())
}

/// An equivalent smaller problem: size-1 dims dropped, and input dims that stay adjacent and in
/// order in the output merged. Returns (input shape, perm).
fn simplify(shape: &[usize], perm: &[usize]) -> (Vec<usize>, Vec<usize>) {
    // Output-ordered list of surviving input dims, grouped when consecutive.
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for &p in perm.iter().filter(|&&p| shape[p] != 1) {
        match groups.last_mut() {
            Some(g) if *g.last().expect("non-empty") + 1 == p => g.push(p),
            _ => groups.push(vec![p]),
        }
    }
    // Number the groups in input order.
    let mut order: Vec<usize> = (0..groups.len()).collect();
    order.sort_by_key(|&g| groups[g][0]);
    let mut new_shape = vec![0; groups.len()];
    let mut new_perm = vec![0; groups.len()];
    for (new_in, &g) in order.iter().enumerate() {
        new_shape[new_in] = groups[g].iter().map(|&d| shape[d]).product();
        new_perm[g] = new_in;
    }
    (new_shape, new_perm)
}

/// `transpose(x, perm)` into `out` (output dim i is input dim `perm[i]`).
pub fn transpose(
    x: TensorRef<'_>,
    perm: &[i64],
    params: &TransposeParams,
    out: &mut [f32],
) -> KernelResult<()> {
    const OP: &str = "transpose";
    check_len(OP, "x", x.data.len(), x.shape)?;
    check_len(OP, "out", out.len(), x.shape)?;
    if params.tile == 0 {
        return Err(KernelError::new(OP, "tile must be at least 1"));
    }
    let perm = normalize_perm(OP, perm, x.shape.len())?;
    let (shape, perm) = simplify(x.shape, &perm);
    let rank = shape.len();
    if out.is_empty() {
        return Ok(());
    }
    if rank <= 1 {
        out.copy_from_slice(x.data);
        return Ok(());
    }
    let in_strides = strides(&shape);
    // Output dims in order, each with its length and input stride.
    let dims: Vec<(usize, usize)> = perm.iter().map(|&p| (shape[p], in_strides[p])).collect();
    let rows = RowParams {
        task_elems: params.task_elems,
        min_parallel_elems: params.min_parallel_elems,
    };
    if perm[rank - 1] == rank - 1 {
        copy_runs(x.data, &dims, &rows, out);
    } else {
        tiled(x.data, &dims, &perm, params, out);
    }
    Ok(())
}

/// Input offset of output row `row` (all output dims but the last, row-major).
fn row_offset(dims: &[(usize, usize)], mut row: usize) -> usize {
    let mut offset = 0;
    for &(len, stride) in dims.iter().rev() {
        offset += (row % len) * stride;
        row /= len;
    }
    offset
}

/// The last dim is preserved: every output row is one contiguous input run.
fn copy_runs(x: &[f32], dims: &[(usize, usize)], params: &RowParams, out: &mut [f32]) {
    let (outer, last) = dims.split_at(dims.len() - 1);
    let run = last[0].0;
    for_each_row_group(params, x.len(), out, run, |first, chunk| {
        for (r, dst) in chunk.chunks_exact_mut(run).enumerate() {
            let src = row_offset(outer, first + r);
            dst.copy_from_slice(&x[src..src + run]);
        }
    });
}

/// General case: the output's last dim reads input dim `a` (stride > 1) and the input's last
/// dim (stride 1) lands in output dim `j`; each task transposes a band of `tile` values of j
/// for one index of the other dims, tile by tile.
fn tiled(
    x: &[f32],
    dims: &[(usize, usize)],
    perm: &[usize],
    params: &TransposeParams,
    out: &mut [f32],
) {
    let rank = dims.len();
    let j = perm
        .iter()
        .position(|&p| p == rank - 1)
        .expect("perm covers the last dim");
    let (nj, na, sa) = (dims[j].0, dims[rank - 1].0, dims[rank - 1].1);
    let out_strides = strides(&dims.iter().map(|d| d.0).collect::<Vec<_>>());
    let osj = out_strides[j];
    // The dims other than j and the last, with (len, input stride, output stride).
    let others: Vec<(usize, usize, usize)> = (0..rank - 1)
        .filter(|&d| d != j)
        .map(|d| (dims[d].0, dims[d].1, out_strides[d]))
        .collect();
    let outer: usize = others.iter().map(|o| o.0).product();
    let t = params.tile;
    let bands = nj.div_ceil(t);
    let bands_per_task = params.task_elems.div_ceil(t * na).max(1);
    let tasks = (outer * bands).div_ceil(bands_per_task);
    let parallel = x.len() >= params.min_parallel_elems;
    let out_ptr = SyncPtr(out.as_mut_ptr());
    par::for_each_index(parallel, tasks, |task| {
        for band in task * bands_per_task..((task + 1) * bands_per_task).min(outer * bands) {
            let (mut o, b) = (band / bands, band % bands);
            let (mut ib, mut ob) = (0, 0);
            for &(len, is, os) in others.iter().rev() {
                ib += (o % len) * is;
                ob += (o % len) * os;
                o /= len;
            }
            let (u0, u1) = (b * t, ((b + 1) * t).min(nj));
            for v0 in (0..na).step_by(t) {
                let v1 = (v0 + t).min(na);
                for u in u0..u1 {
                    // SAFETY: output row (o, u) of this band belongs to this task only and lies
                    // inside `out` (its length equals the input's).
                    let dst = unsafe {
                        std::slice::from_raw_parts_mut(
                            out_ptr.get().add(ob + u * osj + v0),
                            v1 - v0,
                        )
                    };
                    for (v, d) in (v0..v1).zip(dst) {
                        *d = x[ib + u + v * sa];
                    }
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference;
    use crate::testing::{assert_same_bits, on_one_and_two_threads, Rng};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        #[test]
        fn fast_matches_reference(
            shape in prop::collection::vec(1usize..7, 0..5),
            perm_seed in any::<u64>(),
            tile in prop::sample::select(vec![1usize, 3, 32]),
            task in prop::sample::select(vec![1usize, 1 << 14]),
        ) {
            let mut rng = Rng::new(perm_seed);
            let mut perm: Vec<i64> = (0..shape.len() as i64).collect();
            for i in (1..perm.len()).rev() {
                perm.swap(i, rng.below(i + 1));
            }
            let x = rng.vec(shape.iter().product(), 1.0);
            let t = TensorRef::new("t", &x, &shape).unwrap();
            let want = reference::transpose(t, &perm).unwrap();
            prop_assert_eq!(transpose_output_shape(&shape, &perm).unwrap(), want.shape.clone());
            let params = TransposeParams { tile, task_elems: task, min_parallel_elems: 0 };
            let run = || {
                let mut out = vec![f32::NAN; x.len()];
                transpose(t, &perm, &params, &mut out).unwrap();
                out
            };
            let one = on_one_and_two_threads(run);
            assert_same_bits("reference", &one, &want.data);
        }
    }

    #[test]
    fn bad_perms_are_errors() {
        let x = [0.0f32; 6];
        let t = TensorRef::new("t", &x, &[2, 3]).unwrap();
        let mut out = [0.0; 6];
        let p = TransposeParams::default();
        assert!(transpose(t, &[0, 0], &p, &mut out).is_err());
        assert!(transpose(t, &[0], &p, &mut out).is_err());
        assert!(transpose(t, &[0, 2], &p, &mut out).is_err());
        assert!(transpose(t, &[-1, -2], &p, &mut out).is_ok());
        assert_eq!(out, [0.0; 6]);
    }
}
