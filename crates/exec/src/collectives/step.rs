//! Running one collective step of a per-rank program: the step names its mesh axis and group
//! size; the rank's [`Collectives`] carries the data. Gathers and scatters along a dim other
//! than 0 are laid out here, since the backends exchange flat, equal blocks; `rank_slice`
//! copies this rank's block, its place in the group read from the mesh.

use mslc_core::ops::Op;
use mslc_kernels::scratch::with_scratch;
use mslc_kernels::step::CollectiveStep;

use super::{collective_error, Collectives, Mesh};
use crate::error::ExecResult;

/// Runs `step` on input `x` (its shape `shape`) into `out` through `comm`; an error when the
/// executor has no collectives or the mesh's group differs from what the step was built for.
pub(crate) fn run_collective(
    step: &CollectiveStep,
    comm: Option<&mut (dyn Collectives + '_)>,
    x: &[f32],
    shape: &[usize],
    out: &mut [f32],
) -> ExecResult<()> {
    let comm = comm.ok_or_else(|| {
        collective_error(format!(
            "`{}` over mesh axis `{}` needs ranks to talk to, but this program runs alone",
            step.op, step.axis
        ))
    })?;
    let axis = group_axis(step, comm.mesh())?;
    let size = comm.mesh().axes()[axis].1;
    // Values before `dim` (outer) and from `dim` on (inner) of the input.
    let outer: usize = shape[..step.dim].iter().product();
    let inner = x.len() / outer.max(1);
    // Values a gather or scatter along a later dim reorders its blocks through, in the
    // thread's kernel scratch, which the plan sizes for them; none for the others.
    let reorder = step.reorder_floats(shape);
    match step.op {
        Op::AllReduce => {
            out.copy_from_slice(x);
            comm.all_reduce(axis, out)
        }
        Op::AllGather if reorder == 0 => comm.all_gather(axis, x, out),
        // Blocks arrive rank-major ([n][outer][inner]); the result is [outer][n][inner].
        Op::AllGather => with_scratch(reorder, |blocks| {
            comm.all_gather(axis, x, blocks)?;
            for (r, block) in blocks.chunks_exact(x.len()).enumerate() {
                for (o, row) in block.chunks_exact(inner).enumerate() {
                    let at = (o * size + r) * inner;
                    out[at..at + inner].copy_from_slice(row);
                }
            }
            Ok(())
        }),
        Op::ReduceScatter if reorder == 0 => comm.reduce_scatter(axis, x, out),
        // Input [outer][n][piece] reordered rank-major, so member r's block is its piece.
        Op::ReduceScatter => with_scratch(reorder, |blocks| {
            let piece = inner / size;
            for (o, row) in x.chunks_exact(inner).enumerate() {
                for (r, part) in row.chunks_exact(piece).enumerate() {
                    let at = (r * outer + o) * piece;
                    blocks[at..at + piece].copy_from_slice(part);
                }
            }
            comm.reduce_scatter(axis, blocks, out)
        }),
        Op::RankSlice => {
            // Input [outer][n][piece]: this rank keeps [outer][its index][piece].
            let me = comm.mesh().coord(comm.rank(), axis);
            let piece = inner / size;
            for (row, dst) in x.chunks_exact(inner).zip(out.chunks_exact_mut(piece)) {
                dst.copy_from_slice(&row[me * piece..(me + 1) * piece]);
            }
            Ok(())
        }
        other => Err(collective_error(format!("`{other}` is not a collective"))),
    }
}

/// The index in `mesh` of the axis `step` runs over; an error when the mesh has no such axis
/// or its group differs from what the step was built for.
pub(crate) fn group_axis(step: &CollectiveStep, mesh: &Mesh) -> ExecResult<usize> {
    let axis = mesh.axis(&step.axis)?;
    let size = mesh.axes()[axis].1;
    if size != step.ranks {
        return Err(collective_error(format!(
            "`{}` was compiled for {} ranks on mesh axis `{}`, which has {size}",
            step.op, step.ranks, step.axis
        )));
    }
    Ok(axis)
}

/// The whole tensor of which every member of the group of mesh axis `axis` holds one block
/// along `dim` (this rank's is `data`, of shape `shape`): what a sharded checkpoint gathers.
pub fn gather_dim(
    comm: &mut dyn Collectives,
    axis: &str,
    dim: usize,
    shape: &[usize],
    data: &[f32],
) -> ExecResult<Vec<f32>> {
    let a = comm.mesh().axis(axis)?;
    let ranks = comm.mesh().axes()[a].1;
    let step = CollectiveStep {
        op: Op::AllGather,
        axis: axis.to_string(),
        ranks,
        dim,
    };
    let mut out = vec![0.0; data.len() * ranks];
    run_collective(&step, Some(comm), data, shape, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collectives::threads::world;
    use crate::collectives::Mesh;

    fn step(op: Op, dim: usize) -> CollectiveStep {
        CollectiveStep {
            op,
            axis: "mp".to_string(),
            ranks: 2,
            dim,
        }
    }

    /// Runs `f` on both ranks of a 2-rank `mp` mesh, returning each rank's result.
    fn on_two(f: impl Fn(usize, &mut dyn Collectives) -> Vec<f32> + Sync) -> Vec<Vec<f32>> {
        let ranks = world(Mesh::line("mp", 2).unwrap());
        std::thread::scope(|s| {
            let handles: Vec<_> = ranks
                .into_iter()
                .map(|mut r| {
                    let f = &f;
                    s.spawn(move || f(r.rank(), &mut r))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn gathers_and_scatters_along_an_inner_dim() {
        // Rank r holds a [2, 2] block with values 10r + i; gathered along dim 1 → [2, 4].
        let got = on_two(|r, comm| {
            let x: Vec<f32> = (0..4).map(|i| (10 * r + i) as f32).collect();
            let mut out = vec![0.0; 8];
            run_collective(&step(Op::AllGather, 1), Some(comm), &x, &[2, 2], &mut out).unwrap();
            out
        });
        assert_eq!(got[0], vec![0., 1., 10., 11., 2., 3., 12., 13.]);
        assert_eq!(got[0], got[1]);
        // Both ranks hold [2, 4] = 0..8 (+100 on rank 1); scattered along dim 1.
        let got = on_two(|r, comm| {
            let x: Vec<f32> = (0..8).map(|i| (i + 100 * r) as f32).collect();
            let mut out = vec![0.0; 4];
            run_collective(
                &step(Op::ReduceScatter, 1),
                Some(comm),
                &x,
                &[2, 4],
                &mut out,
            )
            .unwrap();
            out
        });
        assert_eq!(got[0], vec![100., 102., 108., 110.]);
        assert_eq!(got[1], vec![104., 106., 112., 114.]);
    }

    #[test]
    fn each_rank_slices_its_own_block() {
        // Both ranks hold the same [2, 4] = 0..8; each keeps its [2, 2] block of dim 1.
        let got = on_two(|_, comm| {
            let x: Vec<f32> = (0..8).map(|i| i as f32).collect();
            let mut out = vec![0.0; 4];
            let step = step(Op::RankSlice, 1);
            run_collective(&step, Some(comm), &x, &[2, 4], &mut out).unwrap();
            out
        });
        assert_eq!(got, vec![vec![0., 1., 4., 5.], vec![2., 3., 6., 7.]]);
    }

    #[test]
    fn a_lone_program_or_a_different_group_is_an_error() {
        let e = run_collective(&step(Op::AllReduce, 0), None, &[1.0], &[1], &mut [0.0]);
        assert!(e.unwrap_err().message.contains("runs alone"));
        let got = on_two(|_, comm| {
            let wrong = CollectiveStep {
                ranks: 4,
                ..step(Op::AllReduce, 0)
            };
            let e = run_collective(&wrong, Some(comm), &[1.0], &[1], &mut [0.0]).unwrap_err();
            assert!(e.message.contains("compiled for 4 ranks"), "{}", e.message);
            vec![]
        });
        assert_eq!(got.len(), 2);
    }
}
