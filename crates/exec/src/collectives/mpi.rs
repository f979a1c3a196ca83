//! The MPI backend (cargo feature `mpi`): one rank per process, started by `mpiexec` (or a
//! hostfile across nodes), over one sub-communicator per mesh axis split from the world.
//!
//! Sums are taken the way the threads backend takes them — each member owns one block, adds
//! the group's contributions to it in member order, and the blocks are gathered — so both
//! backends give the same bits, and every member of a group gets the same bits. Members first
//! agree on buffer lengths, so a mismatch is an error on every member, not a hang or garbage.
//! That agreement waits at most the rank's timeout: a member that never arrives (it hangs)
//! makes the waiting ranks say so and abort the MPI job, since a collective in flight cannot
//! be called off.
//!
//! A point-to-point send returns once its message is handed to MPI, as the threads backend's
//! does: it owns a copy of the data until the receiver takes it. A pipeline stage sends its
//! activations on while the next stage sends gradients back, so two blocking sends of
//! messages above MPI's eager limit would wait for each other forever.

use std::time::{Duration, Instant};

use mpi::environment::Universe;
use mpi::request::{Request, StaticScope};
use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::*;

use super::{block_len, check_len, collective_error, Collectives, Mesh, DEFAULT_TIMEOUT};
use crate::error::ExecResult;

/// This process's rank of an MPI world laid out as a mesh.
pub struct MpiRank {
    world: SimpleCommunicator,
    /// One communicator per mesh axis: this rank's group along it, ranked by coordinate.
    axes: Vec<SimpleCommunicator>,
    mesh: Mesh,
    rank: usize,
    /// How long this rank waits for the others of a group to reach a collective.
    timeout: Duration,
    /// Sends whose receiver has not taken the message yet.
    in_flight: Vec<InFlight>,
    /// Dropping it finalises MPI, so it is the last field (fields drop in order): the axis
    /// communicators are freed before.
    _universe: Universe,
}

/// A send in flight: its request, over the copy of the data it owns.
struct InFlight {
    /// `None` once complete. Completed before `data` is dropped ([`MpiRank::progress`],
    /// [`MpiRank::flush`]): MPI reads `data` until then.
    request: Option<Request<'static, [f32], StaticScope>>,
    data: Box<[f32]>,
    to: usize,
}

// SAFETY: the request is a handle MPI lets any thread complete (this rank uses one thread at a
// time: `Collectives` methods take `&mut self`), and the data it reads is owned by the entry.
unsafe impl Send for InFlight {}

/// An initialised MPI world not yet laid out as a mesh: what a launcher started, so a caller
/// can read the world's size and this process's rank before it knows the plan's mesh.
pub struct MpiWorld {
    world: SimpleCommunicator,
    universe: Universe,
}

impl MpiWorld {
    /// Initialises MPI (once per process).
    pub fn init() -> ExecResult<MpiWorld> {
        let universe = mpi::initialize()
            .ok_or_else(|| collective_error("MPI is already initialised in this process"))?;
        let world = universe.world();
        Ok(MpiWorld { world, universe })
    }

    /// How many processes the launcher started (1 for a binary started without `mpiexec`, or
    /// by another MPI's launcher).
    pub fn size(&self) -> usize {
        self.world.size() as usize
    }

    /// This process's rank in the world.
    pub fn rank(&self) -> usize {
        self.world.rank() as usize
    }

    /// Lays the world out as `mesh`, whose size must be the world's; a rank waits at most
    /// `timeout` for the others to reach a collective, then aborts the job.
    pub fn into_rank(self, mesh: Mesh, timeout: Duration) -> ExecResult<MpiRank> {
        let MpiWorld { world, universe } = self;
        let size = world.size() as usize;
        if size != mesh.size() {
            return Err(collective_error(format!(
                "the MPI world has {size} process(es) but the plan has {} devices: start it \
                 with `mpiexec -n {}` of the MPI mslc was built with (a world of 1 is what a \
                 binary started without mpiexec, or by another MPI's launcher, sees)",
                mesh.size(),
                mesh.size()
            )));
        }
        let rank = world.rank() as usize;
        let coords = mesh.coords(rank);
        let mut axes = Vec::with_capacity(coords.len());
        for (axis, &coord) in coords.iter().enumerate() {
            let first = mesh.group(rank, axis)[0];
            let color = Color::with_value(first as i32);
            let comm = world
                .split_by_color_with_key(color, coord as i32)
                .ok_or_else(|| collective_error("MPI could not split the mesh's groups"))?;
            axes.push(comm);
        }
        Ok(MpiRank {
            world,
            axes,
            mesh,
            rank,
            timeout,
            in_flight: Vec::new(),
            _universe: universe,
        })
    }
}

impl MpiRank {
    /// Initialises MPI and lays the world out as `mesh`; the world's size must be the mesh's
    /// (a binary started without `mpiexec`, or by another MPI's launcher, sees a world of 1).
    pub fn init(mesh: Mesh) -> ExecResult<MpiRank> {
        MpiWorld::init()?.into_rank(mesh, DEFAULT_TIMEOUT)
    }

    fn comm(&self, axis: usize) -> ExecResult<&SimpleCommunicator> {
        self.axes.get(axis).ok_or_else(|| {
            collective_error(format!(
                "no mesh axis {axis} (the mesh has {})",
                self.axes.len()
            ))
        })
    }

    /// Checks that every member of group `axis` passes the same `len`, waiting at most the
    /// timeout for them to arrive; past it, says which collective waited and aborts the job.
    fn agree(&self, what: &str, axis: usize, len: usize) -> ExecResult<&SimpleCommunicator> {
        let comm = self.comm(axis)?;
        let mut lens = vec![0u64; comm.size() as usize];
        let mine = len as u64;
        mpi::request::scope(|scope| {
            let request = comm.immediate_all_gather_into(scope, &mine, &mut lens[..]);
            self.complete(request, || self.group_hung(what, axis));
        });
        match lens.iter().position(|&l| l != mine) {
            None => Ok(comm),
            Some(other) => Err(collective_error(format!(
                "{what}: member {other} of the group sent {} values, this rank {len}",
                lens[other]
            ))),
        }
    }

    /// Polls `poll` until it gives a value, spinning briefly (collectives and messages
    /// usually meet within microseconds), then without holding the core; past the timeout,
    /// says what `hung` describes and aborts the MPI job, since an operation in flight cannot
    /// be called off and every rank must stop.
    fn within<T>(&self, hung: impl FnOnce() -> String, mut poll: impl FnMut() -> Option<T>) -> T {
        let start = Instant::now();
        loop {
            if let Some(done) = poll() {
                return done;
            }
            let waited = start.elapsed();
            if waited >= self.timeout {
                eprintln!(
                    "error[E0973]: rank {}: {} within {:.1} s (hung?); aborting the MPI job",
                    self.rank,
                    hung(),
                    self.timeout.as_secs_f64()
                );
                self.world.abort(1)
            }
            match waited < Duration::from_millis(5) {
                true => std::thread::yield_now(),
                false => std::thread::sleep(Duration::from_micros(200)),
            }
        }
    }

    /// Forgets the sends whose receivers have taken their messages.
    fn progress(&mut self) {
        for sent in &mut self.in_flight {
            if let Some(request) = sent.request.take() {
                sent.request = request.test().err();
            }
        }
        self.in_flight.retain(|sent| sent.request.is_some());
    }

    /// Waits for every send in flight to be taken, within the timeout each.
    fn flush(&mut self) {
        for mut sent in std::mem::take(&mut self.in_flight) {
            if let Some(request) = sent.request.take() {
                let to = sent.to;
                self.complete(request, || format!("rank {to} did not take its message"));
            }
            drop(sent.data);
        }
    }

    /// Waits for `request` to complete, within the timeout ([`Self::within`]).
    fn complete<'a, D: ?Sized, S: mpi::request::Scope<'a>>(
        &self,
        request: mpi::request::Request<'a, D, S>,
        hung: impl FnOnce() -> String,
    ) {
        let mut pending = Some(request);
        self.within(hung, || match pending.take()?.test() {
            Ok(_) => Some(()),
            Err(request) => {
                pending = Some(request);
                None
            }
        })
    }

    /// What a member of group `axis` that never reached collective `what` failed to do.
    fn group_hung(&self, what: &str, axis: usize) -> String {
        format!(
            "a member of its group on mesh axis `{}` did not reach the {what}",
            self.mesh.axes()[axis].0
        )
    }

    /// The MPI rank of point-to-point peer `rank` (`what`: `send to`, `recv from`), which
    /// must be in the mesh.
    fn peer(&self, what: &str, rank: usize) -> ExecResult<i32> {
        if rank >= self.mesh.size() {
            return Err(collective_error(format!(
                "{what} rank {rank}: the mesh has {} ranks",
                self.mesh.size()
            )));
        }
        Ok(rank as i32)
    }

    /// Each member's block `b` of `send` (`n` blocks of `block`) summed over the group in
    /// member order, for this member's `b`.
    fn sum_my_block(comm: &SimpleCommunicator, send: &[f32], block: usize) -> Vec<f32> {
        let mut blocks = vec![0.0f32; send.len()];
        comm.all_to_all_into(send, &mut blocks[..]);
        let mut sum = vec![0.0f32; block];
        for contribution in blocks.chunks_exact(block.max(1)) {
            for (s, &c) in sum.iter_mut().zip(contribution) {
                *s += c;
            }
        }
        sum
    }
}

impl Drop for MpiRank {
    /// Every message sent is taken before MPI is finalised (the last field drops after this).
    fn drop(&mut self) {
        self.flush();
    }
}

impl Collectives for MpiRank {
    fn rank(&self) -> usize {
        self.rank
    }

    fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    fn all_reduce(&mut self, axis: usize, data: &mut [f32]) -> ExecResult<()> {
        let comm = self.agree("all_reduce", axis, data.len())?;
        let n = comm.size() as usize;
        let block = data.len().div_ceil(n);
        let mut padded = data.to_vec();
        padded.resize(block * n, 0.0);
        let mine = Self::sum_my_block(comm, &padded, block);
        comm.all_gather_into(&mine[..], &mut padded[..]);
        data.copy_from_slice(&padded[..data.len()]);
        Ok(())
    }

    fn all_gather(&mut self, axis: usize, send: &[f32], recv: &mut [f32]) -> ExecResult<()> {
        let n = self.comm(axis)?.size() as usize;
        check_len("all_gather", recv.len(), send.len() * n)?;
        let comm = self.agree("all_gather", axis, send.len())?;
        comm.all_gather_into(send, recv);
        Ok(())
    }

    fn reduce_scatter(&mut self, axis: usize, send: &[f32], recv: &mut [f32]) -> ExecResult<()> {
        let n = self.comm(axis)?.size() as usize;
        check_len("reduce_scatter", send.len(), recv.len() * n)?;
        let comm = self.agree("reduce_scatter", axis, send.len())?;
        recv.copy_from_slice(&Self::sum_my_block(comm, send, recv.len()));
        Ok(())
    }

    fn all_to_all(&mut self, axis: usize, send: &[f32], recv: &mut [f32]) -> ExecResult<()> {
        let n = self.comm(axis)?.size() as usize;
        check_len("all_to_all", recv.len(), send.len())?;
        block_len("all_to_all", send.len(), n)?;
        let comm = self.agree("all_to_all", axis, send.len())?;
        comm.all_to_all_into(send, recv);
        Ok(())
    }

    fn send(&mut self, to: usize, data: &[f32]) -> ExecResult<()> {
        let peer_rank = self.peer("send to", to)?;
        self.progress();
        let peer = self.world.process_at_rank(peer_rank);
        let data: Box<[f32]> = data.into();
        // SAFETY: the boxed values do not move while the entry holds the box, and the entry
        // keeps it until the request completes (`InFlight::request`).
        let message: &'static [f32] = unsafe { &*(data.as_ref() as *const [f32]) };
        let request = peer.immediate_send(StaticScope, message);
        self.in_flight.push(InFlight {
            request: Some(request),
            data,
            to,
        });
        Ok(())
    }

    fn recv(&mut self, from: usize, data: &mut [f32]) -> ExecResult<()> {
        let peer = self.world.process_at_rank(self.peer("recv from", from)?);
        let (message, status) = self.within(
            || format!("rank {from} did not send the message it was waited for"),
            || peer.immediate_matched_probe(),
        );
        let sent = status.count(f32::equivalent_datatype()).max(0) as usize;
        if sent != data.len() {
            // Take the message off the queue before saying it does not fit.
            let _ = (message, status).matched_receive_vec::<f32>();
            return check_len(&format!("recv from rank {from}"), sent, data.len());
        }
        message.matched_receive_into(data);
        Ok(())
    }
}
