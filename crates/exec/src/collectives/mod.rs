//! Collective communication between the ranks of a device mesh: the one interface through
//! which a per-device program exchanges data, whatever carries it. [`threads`] runs N ranks as
//! threads of one process (what `cargo test` and `--ranks N` use); `mpi` (cargo feature `mpi`)
//! carries the same calls between processes started by `mpiexec`. Nothing above this module knows which backend runs.
//!
//! Every collective runs over the *group* of one mesh axis: the ranks whose coordinates differ
//! only along that axis, ordered by their coordinate on it (MindSpore's and GSPMD's device
//! groups). Results are the same bits on every member of a group, so replicas stay identical.

#[cfg(feature = "mpi")]
pub mod mpi;
pub(crate) mod overlap;
pub(crate) mod step;
pub mod threads;

pub use step::gather_dim;

/// How long a rank waits for the others of its group in one collective before it gives up
/// (E0973): a step's compute between collectives, or rank 0 writing a checkpoint while the
/// others wait, stays far below.
pub const DEFAULT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

use crate::error::{ExecError, ExecErrorKind, ExecResult};

/// The logical device mesh: named axes, the last varying fastest in the rank numbering
/// (rank = Σ coordᵢ · strideᵢ), as `mesh = { dp: 2, mp: 2 }` lays out ranks 0..4.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mesh {
    axes: Vec<(String, usize)>,
}

impl Mesh {
    /// A mesh of `axes` (name, size); every size at least 1, names distinct.
    pub fn new(axes: Vec<(String, usize)>) -> ExecResult<Mesh> {
        for (i, (name, size)) in axes.iter().enumerate() {
            if *size == 0 {
                return Err(collective_error(format!("mesh axis `{name}` has size 0")));
            }
            if axes[..i].iter().any(|(n, _)| n == name) {
                return Err(collective_error(format!(
                    "mesh axis `{name}` appears twice"
                )));
            }
        }
        let mesh = Mesh { axes };
        mesh.size_checked()
            .ok_or_else(|| collective_error("the mesh has more ranks than fit in memory"))?;
        Ok(mesh)
    }

    /// One axis of `size` ranks (plain data parallelism, or a single device with size 1).
    pub fn line(name: &str, size: usize) -> ExecResult<Mesh> {
        Mesh::new(vec![(name.to_string(), size)])
    }

    fn size_checked(&self) -> Option<usize> {
        self.axes
            .iter()
            .try_fold(1usize, |n, (_, s)| n.checked_mul(*s))
    }

    /// How many ranks the mesh has.
    pub fn size(&self) -> usize {
        self.axes.iter().map(|(_, s)| s).product()
    }

    /// The axes, in order.
    pub fn axes(&self) -> &[(String, usize)] {
        &self.axes
    }

    /// The index of axis `name`, or an error naming the axes there are.
    pub fn axis(&self, name: &str) -> ExecResult<usize> {
        self.axes
            .iter()
            .position(|(n, _)| n == name)
            .ok_or_else(|| {
                let names: Vec<&str> = self.axes.iter().map(|(n, _)| n.as_str()).collect();
                collective_error(format!(
                    "no mesh axis `{name}` (axes: {})",
                    names.join(", ")
                ))
            })
    }

    /// Distance in rank numbers between neighbours along `axis`.
    fn stride(&self, axis: usize) -> usize {
        self.axes[axis + 1..].iter().map(|(_, s)| s).product()
    }

    /// The coordinates of `rank`, one per axis.
    pub fn coords(&self, rank: usize) -> Vec<usize> {
        (0..self.axes.len()).map(|a| self.coord(rank, a)).collect()
    }

    /// The coordinate of `rank` on `axis`: its place in its group along that axis.
    pub fn coord(&self, rank: usize, axis: usize) -> usize {
        rank / self.stride(axis) % self.axes[axis].1
    }

    /// The group of `rank` along `axis`: every rank with the same coordinates elsewhere,
    /// ordered by coordinate on `axis` (so `rank` is member `coords(rank)[axis]`).
    pub fn group(&self, rank: usize, axis: usize) -> Vec<usize> {
        let stride = self.stride(axis);
        let base = rank - self.coords(rank)[axis] * stride;
        (0..self.axes[axis].1).map(|i| base + i * stride).collect()
    }
}

/// The collectives a per-device program calls. Buffers are f32; lengths are checked against
/// the group's size, and a mismatch between members is an error, never a hang or garbage.
pub trait Collectives: Send {
    /// This rank's number in the whole mesh.
    fn rank(&self) -> usize;

    /// The mesh the ranks form.
    fn mesh(&self) -> &Mesh;

    /// Whether a thread other than the one that runs the steps may make this rank's calls
    /// (one thread at a time): what lets a run overlap its all-reduces with its steps.
    fn callable_from_any_thread(&self) -> bool {
        true
    }

    /// Sums `data` over the group of `axis`, in place; every member gets the same bits.
    fn all_reduce(&mut self, axis: usize, data: &mut [f32]) -> ExecResult<()>;

    /// Concatenates every member's `send` in group order into `recv` (`n · send.len()`).
    fn all_gather(&mut self, axis: usize, send: &[f32], recv: &mut [f32]) -> ExecResult<()>;

    /// Sums `send` (`n` equal blocks) over the group; member i keeps block i in `recv`.
    fn reduce_scatter(&mut self, axis: usize, send: &[f32], recv: &mut [f32]) -> ExecResult<()>;

    /// Sends block j of `send` (`n` equal blocks) to member j and puts the block member i sent
    /// this rank at block i of `recv`.
    fn all_to_all(&mut self, axis: usize, send: &[f32], recv: &mut [f32]) -> ExecResult<()>;

    /// Sends `data` to rank `to` (pipeline activations and their gradients).
    fn send(&mut self, to: usize, data: &[f32]) -> ExecResult<()>;

    /// Receives exactly `data.len()` values from rank `from`.
    fn recv(&mut self, from: usize, data: &mut [f32]) -> ExecResult<()>;
}

/// Values summed per pass over the members (8 KiB: stays in L1 while every member's part is
/// added).
pub(crate) const SUM_CHUNK: usize = 2048;

/// `out[i] = 0.0 + c₀[offset + i] + c₁[offset + i] + …` over the members' contributions in
/// member order, one cache-sized chunk of `out` at a time, so each value is read once and
/// `out` written once. Both backends sum with it, so every member of a group, on either
/// backend, computes the same bits.
pub(crate) fn sum_in_member_order<C>(out: &mut [f32], contributions: C, offset: usize)
where
    C: IntoIterator + Clone,
    C::Item: AsRef<[f32]>,
{
    for (c, chunk) in out.chunks_mut(SUM_CHUNK).enumerate() {
        let start = offset + c * SUM_CHUNK;
        chunk.fill(0.0);
        for contribution in contributions.clone() {
            for (o, &x) in chunk.iter_mut().zip(&contribution.as_ref()[start..]) {
                *o += x;
            }
        }
    }
}

/// Member `i`'s block of a buffer of `len` values that a sum over `n` members splits, each
/// member summing its own block: the blocks differ by at most one value, so none is padded.
pub(crate) fn block_bounds(len: usize, n: usize, i: usize) -> std::ops::Range<usize> {
    i * len / n..(i + 1) * len / n
}

/// The error of a collective that cannot go ahead.
pub(crate) fn collective_error(message: impl Into<String>) -> ExecError {
    ExecError::new(ExecErrorKind::Collective, message)
}

/// Checks that a buffer of `got` values is the `want` a collective needs.
pub(crate) fn check_len(what: &str, got: usize, want: usize) -> ExecResult<()> {
    if got == want {
        Ok(())
    } else {
        Err(collective_error(format!(
            "{what}: buffer of {got} values where {want} are needed"
        )))
    }
}

/// The size of each of `n` equal blocks of `len` values, or an error saying they do not split.
pub(crate) fn block_len(what: &str, len: usize, n: usize) -> ExecResult<usize> {
    if n > 0 && len.is_multiple_of(n) {
        Ok(len / n)
    } else {
        Err(collective_error(format!(
            "{what}: {len} values do not split into {n} equal blocks"
        )))
    }
}
