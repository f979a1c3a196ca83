//! The MPI backend (cargo feature `mpi`): the ranks of a mesh over the processes `mpiexec`
//! (or a hostfile across nodes) started, one rank per process — or, under an interleaved
//! pipeline, each process's chunk-ranks as threads of it (MPI initialised for threads).
//! A group whose members are one per process talks over a sub-communicator split from the
//! world; a group with several members in one process (the chunk-ranks along the pipeline
//! axis) over point-to-point messages, tagged by which of each process's ranks sends and
//! receives.
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

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mpi::environment::{Threading, Universe};
use mpi::request::{Request, StaticScope};
use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::*;
use mpi::Tag;

use super::{
    block_bounds, block_len, check_len, collective_error, sum_in_member_order, Collectives, Mesh,
    SUM_CHUNK,
};
use crate::error::ExecResult;

/// One rank of a mesh over MPI.
pub struct MpiRank {
    world: SimpleCommunicator,
    /// Per mesh axis, how this rank reaches its group along it.
    axes: Vec<Route>,
    mesh: Mesh,
    rank: usize,
    /// Which process runs each rank of the mesh.
    placement: Arc<Placement>,
    /// How long this rank waits for the others of a group to reach a collective.
    timeout: Duration,
    /// Sends whose receiver has not taken the message yet.
    in_flight: Vec<InFlight>,
    /// The sums' buffers, kept from one collective to the next.
    scratch: Scratch,
    /// The thread support MPI gave: from `Serialized` on, another thread may make this rank's
    /// calls while the one that runs its steps makes none.
    threading: Threading,
    /// MPI stays initialised while a rank or its [`MpiWorld`] holds this (the world is meant
    /// to be dropped last); it is the last field (fields drop in order), so the axis
    /// communicators are freed before.
    _universe: Arc<Universe>,
}

/// The buffers a rank's sums work in, kept from one collective to the next: with a fresh
/// allocation per collective (new pages at a new address each time, which UCX then moves large
/// messages between) a 16 MiB all-reduce over two processes took 35–45 ms here, and 10 ms
/// with these kept.
#[derive(Default)]
struct Scratch {
    /// What every member sent this rank, block by block (over a communicator, the other
    /// members' parts of this rank's block of a sum: [`MpiRank::scatter_over`]).
    blocks: Vec<f32>,
    /// This rank's block of an all-reduce over peers, summed.
    mine: Vec<f32>,
    /// An all-reduce's buffer over peers padded to whole blocks (when it does not split
    /// evenly).
    padded: Vec<f32>,
}

/// What a member sends each member of its group in [`MpiRank::share`].
#[derive(Clone, Copy)]
enum Share {
    /// Its block `j` to member `j` (an all-to-all).
    Blocks,
    /// All of it to every member (an all-gather).
    Whole,
}

/// How a rank reaches its group along one mesh axis.
enum Route {
    /// A communicator of the group, one member per process, ranked by coordinate.
    Comm(SimpleCommunicator),
    /// A group with several members in one process (an interleaved pipeline's chunk-ranks
    /// along the pipeline axis): its ranks in group order, reached by tagged messages.
    Peers(Vec<usize>),
}

/// Where the ranks of a mesh run: each one's process, and its place among that process's
/// ranks (what tags a message between two ranks, whichever processes they share).
struct Placement {
    process: Vec<usize>,
    local: Vec<usize>,
    /// The most ranks one process runs.
    per_process: usize,
}

impl Placement {
    /// The tag of a message from rank `from` to rank `to` on `channel` (0: `send`/`recv`;
    /// `1 + axis`: a collective over that axis's peers), unique per pair of the two
    /// processes' ranks, so the messages of two pairs never match each other's receives.
    fn tag(&self, channel: usize, from: usize, to: usize) -> Tag {
        let n = self.per_process;
        ((channel * n + self.local[from]) * n + self.local[to]) as Tag
    }
}

/// A send in flight: its request, over the copy of the data it owns.
struct InFlight {
    /// `None` once complete. Completed before `data` is dropped ([`MpiRank::progress`],
    /// [`MpiRank::flush`]): MPI reads `data` until then.
    request: Option<Request<'static, [f32], StaticScope>>,
    data: Box<[f32]>,
    to: usize,
}

// SAFETY: the request is a handle MPI lets any thread complete (a rank is used by one thread
// at a time: `Collectives` methods take `&mut self`, and MPI is initialised for threads), and
// the data it reads is owned by the entry.
unsafe impl Send for InFlight {}

/// The bytes of a machine's name [`same_machine`] compares (MPI_MAX_PROCESSOR_NAME in MPICH).
const MACHINE_NAME_BYTES: usize = 256;
/// How many messages [`MpiWorld::warm_up`] exchanges with each other process: twice the
/// 64 cells of UCX's shared-memory FIFO, whose resident set stopped growing after 64 here.
const WARM_UP_ROUNDS: usize = 128;
/// The size of [`MpiWorld::warm_up`]'s messages: UCX's shared-memory segment (8 KiB), the
/// largest message copied through the FIFO's cells rather than handed over in place.
const WARM_UP_BYTES: usize = 8192;
/// The tag of [`MpiWorld::warm_up`]'s messages, apart from those of a rank's messages
/// ([`Placement::tag`]) and within the 32,767 every MPI allows.
const WARM_UP_TAG: Tag = 32_767;
/// The tags of a sum's two halves over a group's communicator ([`MpiRank::scatter_over`],
/// [`MpiRank::gather_over`]), which carries nothing else point to point.
const SCATTER_TAG: Tag = 1;
const GATHER_TAG: Tag = 2;

/// An initialised MPI world: what a launcher started, so a caller can read the world's size
/// and this process's rank before it knows the plan's mesh, then lay it out as the mesh
/// ([`MpiWorld::ranks`]). Drop it after the ranks, on the thread that initialised it: MPI is
/// finalised when it and every rank are gone, and MPI_Finalize belongs on the thread that
/// initialised MPI (a process's chunk-ranks are threads of it; finalised on one of those,
/// MPICH 4.0 over UCX 1.13's TCP transport hung in MPI_Finalize in about half the runs here.
/// Finalised on the main thread, 4-process runs over TCP still hang there now and then — a
/// UCX shutdown bug, openucx/ucx#8738 — while shared memory, which one machine uses, does not).
pub struct MpiWorld {
    world: SimpleCommunicator,
    universe: Arc<Universe>,
    /// The thread support MPI gave (several ranks in one process need `Multiple`).
    threading: Threading,
    /// The world ranks of the processes on this process's machine, in order (itself included).
    node: Vec<i32>,
}

impl MpiWorld {
    /// Initialises MPI (once per process), asking for full thread support, and finds the
    /// processes that share this one's machine.
    pub fn init() -> ExecResult<MpiWorld> {
        let (universe, threading) = mpi::initialize_with_threading(Threading::Multiple)
            .ok_or_else(|| collective_error("MPI is already initialised in this process"))?;
        let world = universe.world();
        let node = same_machine(&world);
        Ok(MpiWorld {
            world,
            universe: Arc::new(universe),
            threading,
            node,
        })
    }

    /// How many processes of the world run on this process's machine, itself included: those
    /// MPI's transport reaches over shared memory ([`MpiWorld::warm_up`]).
    pub fn processes_on_this_machine(&self) -> usize {
        self.node.len()
    }

    /// Brings MPI's shared-memory transport to the memory it holds once messages have gone
    /// every way, so a run's memory does not grow over its first steps: [`WARM_UP_ROUNDS`]
    /// exchanges of [`WARM_UP_BYTES`] with every other process on this machine (a ring shift,
    /// no pair waiting on another). Over MPICH 4.0 on UCX a process's resident set grew by
    /// 100 KB after one step of a small model and by 390 KB after 32 as messages reached more
    /// of the transport's cells; after this it has grown by 776 KiB before the first step and
    /// stays there, which the plan's `mpi_reserve` counts. A process that does not take part
    /// within `timeout` stops the job (E0973), as a rank that never reaches a collective does.
    pub fn warm_up(&self, timeout: Duration) {
        let node = &self.node;
        let Some(me) = node.iter().position(|&p| p == self.world.rank()) else {
            return;
        };
        let send = [0u8; WARM_UP_BYTES];
        let mut recv = [0u8; WARM_UP_BYTES];
        for shift in 1..node.len() {
            let to = node[(me + shift) % node.len()];
            let from = node[(me + node.len() - shift) % node.len()];
            let hung = || {
                format!(
                    "process {}: the first messages to process {to} and from process {from} \
                     did not go through",
                    node[me]
                )
            };
            for _ in 0..WARM_UP_ROUNDS {
                mpi::request::scope(|scope| {
                    let sent = self.world.process_at_rank(to).immediate_send_with_tag(
                        scope,
                        &send[..],
                        WARM_UP_TAG,
                    );
                    let received = self
                        .world
                        .process_at_rank(from)
                        .immediate_receive_into_with_tag(scope, &mut recv[..], WARM_UP_TAG);
                    complete_within(&self.world, timeout, received, hung);
                    complete_within(&self.world, timeout, sent, hung);
                });
            }
        }
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

    /// Ends every process of the job with `status` (MPI_Abort): for a process whose own
    /// failure the others would otherwise wait for in their next collective.
    pub fn abort(&self, status: i32) -> ! {
        abort_job(&self.world, status)
    }

    /// Lays the world out as `mesh` with rank `r` run by process `processes[r]`, whose
    /// processes must be the world's: this process's ranks, in rank order. A rank waits at
    /// most `timeout` for the others to reach a collective, then aborts the job.
    pub fn ranks(
        &self,
        mesh: Mesh,
        processes: &[usize],
        timeout: Duration,
    ) -> ExecResult<Vec<MpiRank>> {
        let MpiWorld {
            world,
            universe,
            threading,
            ..
        } = self;
        let threading = *threading;
        let size = world.size() as usize;
        let needed = processes.iter().max().map_or(0, |&p| p + 1);
        if processes.len() != mesh.size() || size != needed {
            return Err(collective_error(format!(
                "the MPI world has {size} process(es) but the plan has {needed} devices: start \
                 it with `mpiexec -n {needed}` of the MPI mslc was built with (a world of 1 is \
                 what a binary started without mpiexec, or by another MPI's launcher, sees)"
            )));
        }
        let mut local = vec![0; processes.len()];
        let mut count = vec![0; size];
        for (r, &p) in processes.iter().enumerate() {
            local[r] = count[p];
            count[p] += 1;
        }
        let per_process = count.iter().copied().max().unwrap_or(1);
        let placement = Arc::new(Placement {
            process: processes.to_vec(),
            local,
            per_process,
        });
        let me = world.rank() as usize;
        let mine: Vec<usize> = (0..mesh.size()).filter(|&r| processes[r] == me).collect();
        if mine.len() > 1 && threading < Threading::Multiple {
            return Err(collective_error(format!(
                "this process runs {} ranks as threads, which needs an MPI that supports \
                 MPI_THREAD_MULTIPLE; this one gives {threading:?}",
                mine.len()
            )));
        }
        // Every process splits the world once per axis its groups reach by communicator and
        // per place among a process's ranks, in the same order, so the calls match.
        let mut routes: Vec<Vec<Route>> = mine.iter().map(|_| Vec::new()).collect();
        for axis in 0..mesh.axes().len() {
            if !one_per_process(&mesh, &placement, axis) {
                for (routes, &r) in routes.iter_mut().zip(&mine) {
                    routes.push(Route::Peers(mesh.group(r, axis)));
                }
                continue;
            }
            for place in 0..per_process {
                let at = mine.iter().position(|&r| placement.local[r] == place);
                let (color, key) = match at {
                    Some(i) => {
                        let r = mine[i];
                        let first = mesh.group(r, axis)[0];
                        (Color::with_value(first as i32), mesh.coord(r, axis) as i32)
                    }
                    None => (Color::undefined(), 0),
                };
                let comm = world.split_by_color_with_key(color, key);
                if let Some(i) = at {
                    let comm = comm
                        .ok_or_else(|| collective_error("MPI could not split the mesh's groups"))?;
                    routes[i].push(Route::Comm(comm));
                }
            }
        }
        Ok(mine
            .into_iter()
            .zip(routes)
            .map(|(rank, axes)| MpiRank {
                world: universe.world(),
                axes,
                mesh: mesh.clone(),
                rank,
                placement: Arc::clone(&placement),
                timeout,
                in_flight: Vec::new(),
                scratch: Scratch::default(),
                threading,
                _universe: Arc::clone(universe),
            })
            .collect())
    }
}

/// The world ranks of the processes that run on this process's machine (MPI's processor
/// name), in order: every process gathers every name, so all of a machine's agree.
fn same_machine(world: &SimpleCommunicator) -> Vec<i32> {
    let mut mine = [0u8; MACHINE_NAME_BYTES];
    let name = mpi::environment::processor_name().unwrap_or_default();
    let len = name.len().min(MACHINE_NAME_BYTES);
    mine[..len].copy_from_slice(&name.as_bytes()[..len]);
    let mut all = vec![0u8; MACHINE_NAME_BYTES * world.size() as usize];
    world.all_gather_into(&mine[..], &mut all[..]);
    all.chunks_exact(MACHINE_NAME_BYTES)
        .enumerate()
        .filter(|(_, name)| *name == mine)
        .map(|(p, _)| p as i32)
        .collect()
}

/// Whether every group along `axis` has its members in distinct processes, each at the same
/// place among its process's ranks: then a communicator split from the world carries it.
fn one_per_process(mesh: &Mesh, placement: &Placement, axis: usize) -> bool {
    (0..mesh.size()).all(|r| {
        let group = mesh.group(r, axis);
        let mut processes: Vec<usize> = group.iter().map(|&m| placement.process[m]).collect();
        processes.sort_unstable();
        processes.dedup();
        processes.len() == group.len()
            && group
                .iter()
                .all(|&m| placement.local[m] == placement.local[r])
    })
}

impl MpiRank {
    fn route(&self, axis: usize) -> ExecResult<&Route> {
        self.axes.get(axis).ok_or_else(|| {
            collective_error(format!(
                "no mesh axis {axis} (the mesh has {})",
                self.axes.len()
            ))
        })
    }

    /// How many members the group of `axis` has.
    fn members(&self, axis: usize) -> ExecResult<usize> {
        self.route(axis)?;
        Ok(self.mesh.axes()[axis].1)
    }

    /// Checks that every member of group `axis` passes the same `len`, waiting at most the
    /// timeout for them to arrive; past it, says which collective waited and aborts the job.
    /// Over peers, the lengths are checked as the blocks arrive ([`Self::exchange`]).
    fn agree(&self, what: &str, axis: usize, len: usize) -> ExecResult<()> {
        let Route::Comm(comm) = self.route(axis)? else {
            return Ok(());
        };
        let mut lens = vec![0u64; comm.size() as usize];
        let mine = len as u64;
        mpi::request::scope(|scope| {
            let request = comm.immediate_all_gather_into(scope, &mine, &mut lens[..]);
            self.complete(request, || self.group_hung(what, axis));
        });
        match lens.iter().position(|&l| l != mine) {
            None => Ok(()),
            Some(other) => Err(collective_error(format!(
                "{what}: member {other} of the group sent {} values, this rank {len}",
                lens[other]
            ))),
        }
    }

    /// Sends member `j` of group `axis` block `j` of `send` (`n` equal blocks: an all-to-all)
    /// or all of it (an all-gather), as `share` says, and puts what member `i` sent at block
    /// `i` of `recv`.
    fn share(
        &mut self,
        what: &str,
        axis: usize,
        share: Share,
        (send, recv): (&[f32], &mut [f32]),
    ) -> ExecResult<()> {
        let block = match share {
            Share::Blocks => block_len(what, send.len(), self.members(axis)?)?,
            Share::Whole => send.len(),
        };
        match (self.route(axis)?, share) {
            (Route::Comm(comm), Share::Blocks) => comm.all_to_all_into(send, recv),
            (Route::Comm(comm), Share::Whole) => comm.all_gather_into(send, recv),
            (Route::Peers(group), _) => {
                let group = group.clone();
                let block_for = |j: usize| match share {
                    Share::Blocks => &send[j * block..(j + 1) * block],
                    Share::Whole => send,
                };
                return self.exchange(what, axis, &group, block_for, recv);
            }
        }
        Ok(())
    }

    /// Over the tagged messages of group `group` (`axis`'s peers): sends `block_for(j)` to
    /// member `j`, then takes member `i`'s block into block `i` of `recv`, in member order.
    /// A block of another length is an error after every member's block is taken, so none is
    /// left to match a later collective's receive.
    fn exchange<'a>(
        &mut self,
        what: &str,
        axis: usize,
        group: &[usize],
        block_for: impl Fn(usize) -> &'a [f32],
        recv: &mut [f32],
    ) -> ExecResult<()> {
        let block = block_len(what, recv.len(), group.len())?;
        let me = group
            .iter()
            .position(|&m| m == self.rank)
            .ok_or_else(|| collective_error(format!("{what}: this rank is not in its group")))?;
        for (j, &to) in group.iter().enumerate().filter(|&(j, _)| j != me) {
            self.post(1 + axis, to, block_for(j));
        }
        let mut mismatch = None;
        for (i, (&from, into)) in group.iter().zip(recv.chunks_exact_mut(block)).enumerate() {
            if i == me {
                let own = block_for(me);
                match own.len() == block {
                    true => into.copy_from_slice(own),
                    false => mismatch = mismatch.or(Some((i, own.len()))),
                }
                continue;
            }
            let hung = || self.group_hung(what, axis);
            if let Err(sent) = self.take(1 + axis, from, into, hung) {
                mismatch = mismatch.or(Some((i, sent)));
            }
        }
        match mismatch {
            None => Ok(()),
            Some((member, sent)) => Err(collective_error(format!(
                "{what}: member {member} of the group sent {sent} values, this rank {}",
                block_for(me).len()
            ))),
        }
    }

    /// Sends `data` to rank `to` on `channel` ([`Placement::tag`]), a copy kept until the
    /// receiver takes it.
    fn post(&mut self, channel: usize, to: usize, data: &[f32]) {
        self.progress();
        let process = self
            .world
            .process_at_rank(self.placement.process[to] as i32);
        let tag = self.placement.tag(channel, self.rank, to);
        let data: Box<[f32]> = data.into();
        // SAFETY: the boxed values do not move while the entry holds the box, and the entry
        // keeps it until the request completes (`InFlight::request`).
        let message: &'static [f32] = unsafe { &*(data.as_ref() as *const [f32]) };
        let request = process.immediate_send_with_tag(StaticScope, message, tag);
        self.in_flight.push(InFlight {
            request: Some(request),
            data,
            to,
        });
    }

    /// Takes the next message rank `from` sent this rank on `channel` into `data`, waiting at
    /// most the timeout ([`Self::within`], `hung` saying what did not come); a message of
    /// another length is taken off the queue and its length returned as the error.
    fn take(
        &self,
        channel: usize,
        from: usize,
        data: &mut [f32],
        hung: impl FnOnce() -> String,
    ) -> Result<(), usize> {
        let process = self
            .world
            .process_at_rank(self.placement.process[from] as i32);
        let tag = self.placement.tag(channel, from, self.rank);
        let (message, status) = self.within(hung, || process.immediate_matched_probe_with_tag(tag));
        let sent = status.count(f32::equivalent_datatype()).max(0) as usize;
        if sent != data.len() {
            let _ = (message, status).matched_receive_vec::<f32>();
            return Err(sent);
        }
        message.matched_receive_into(data);
        Ok(())
    }
    /// [`poll_within`] this rank's timeout, `hung` saying what did not come.
    fn within<T>(&self, hung: impl FnOnce() -> String, poll: impl FnMut() -> Option<T>) -> T {
        let hung = || format!("rank {}: {}", self.rank, hung());
        poll_within(&self.world, self.timeout, hung, poll)
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
        let hung = || format!("rank {}: {}", self.rank, hung());
        complete_within(&self.world, self.timeout, request, hung)
    }

    /// What a member of group `axis` that never reached collective `what` failed to do.
    fn group_hung(&self, what: &str, axis: usize) -> String {
        format!(
            "a member of its group on mesh axis `{}` did not reach the {what}",
            self.mesh.axes()[axis].0
        )
    }

    /// Checks that `rank` is in the mesh (`what`: `send to`, `recv from`).
    fn peer(&self, what: &str, rank: usize) -> ExecResult<()> {
        if rank >= self.mesh.size() {
            return Err(collective_error(format!(
                "{what} rank {rank}: the mesh has {} ranks",
                self.mesh.size()
            )));
        }
        Ok(())
    }

    /// Sums `data` in place over `comm`, the communicator of group `axis`, as the threads
    /// backend's in-place all-reduce does: each member sums its block ([`block_bounds`]) of
    /// every member's buffer in member order, then sends the sum to the others. Point to
    /// point, so this member's own block never leaves `data`: built on MPI's all-to-all and
    /// all-gather, it was copied through a buffer of theirs each way and summed into one more
    /// (`cargo bench -p mslc-exec --features mpi --bench collectives -- --mpi`, 2 processes:
    /// 8 MiB in 4.6 ms instead of 7.7, 64 MiB in 54 instead of 60, where MPICH's own
    /// MPI_Allreduce takes 45). `others` receives the other members' parts of this member's
    /// block.
    fn all_reduce_over(
        &self,
        comm: &SimpleCommunicator,
        axis: usize,
        data: &mut [f32],
        others: &mut Vec<f32>,
    ) {
        self.scatter_over(comm, "all_reduce", axis, data, others);
        let (n, me) = (comm.size() as usize, comm.rank() as usize);
        let mine = block_bounds(data.len(), n, me);
        let mut sum = [0.0f32; SUM_CHUNK];
        for start in (0..mine.len()).step_by(SUM_CHUNK) {
            let sum = &mut sum[..SUM_CHUNK.min(mine.len() - start)];
            sum_in_member_order(
                sum,
                member_blocks((n, me), &data[mine.clone()], others),
                start,
            );
            data[mine.start + start..][..sum.len()].copy_from_slice(sum);
        }
        self.gather_over(comm, axis, data);
    }

    /// The first half of a sum over `comm`, the communicator of group `axis` (`what`): sends
    /// each other member its block of `send` ([`block_bounds`]) and receives theirs of this
    /// member's block into `others`, in member order (this member's own left out).
    fn scatter_over(
        &self,
        comm: &SimpleCommunicator,
        what: &str,
        axis: usize,
        send: &[f32],
        others: &mut Vec<f32>,
    ) {
        let (n, me) = (comm.size() as usize, comm.rank() as usize);
        let block = block_bounds(send.len(), n, me).len();
        others.resize(block * (n - 1), 0.0);
        let slots = split_blocks(others, std::iter::repeat_n(block, n - 1));
        let theirs = |j| &send[block_bounds(send.len(), n, j)];
        self.swap_over(comm, (what, axis, SCATTER_TAG), slots, theirs);
    }

    /// The second half of an all-reduce over `comm`, the communicator of group `axis`: sends
    /// this member's block of `data` ([`block_bounds`]) to the others and receives each of
    /// theirs into its place.
    fn gather_over(&self, comm: &SimpleCommunicator, axis: usize, data: &mut [f32]) {
        let (n, me, len) = (comm.size() as usize, comm.rank() as usize, data.len());
        let mut blocks = split_blocks(data, (0..n).map(|j| block_bounds(len, n, j).len()));
        let mine: &[f32] = blocks.remove(me);
        self.swap_over(comm, ("all_reduce", axis, GATHER_TAG), blocks, |_| mine);
    }

    /// Over `comm`, the communicator of group `axis` (`what`), on `tag`: receives each other
    /// member's message into the next of `slots` (in member order) and sends member `j`
    /// `message(j)`, all at once, waiting at most the timeout for every one of them.
    fn swap_over<'a>(
        &self,
        comm: &SimpleCommunicator,
        (what, axis, tag): (&str, usize, Tag),
        slots: Vec<&'a mut [f32]>,
        message: impl Fn(usize) -> &'a [f32],
    ) {
        let (n, me) = (comm.size() as usize, comm.rank() as usize);
        let others = || (0..n).filter(move |&j| j != me);
        mpi::request::scope(|scope| {
            let mut requests = Vec::with_capacity(2 * (n - 1));
            for (j, slot) in others().zip(slots) {
                let peer = comm.process_at_rank(j as i32);
                requests.push(peer.immediate_receive_into_with_tag(scope, slot, tag));
            }
            for j in others() {
                let peer = comm.process_at_rank(j as i32);
                requests.push(peer.immediate_send_with_tag(scope, message(j), tag));
            }
            for request in requests {
                self.complete(request, || self.group_hung(what, axis));
            }
        });
    }

    /// Runs `sum` with the rank's buffer of received blocks when group `axis` has a
    /// communicator (one member per process); `None` when its members are peers.
    fn over_comm<T>(
        &mut self,
        axis: usize,
        sum: impl FnOnce(&Self, &SimpleCommunicator, &mut Vec<f32>) -> T,
    ) -> Option<T> {
        let mut received = std::mem::take(&mut self.scratch.blocks);
        let done = match self.axes.get(axis) {
            Some(Route::Comm(comm)) => Some(sum(self, comm, &mut received)),
            _ => None,
        };
        self.scratch.blocks = received;
        done
    }

    /// Each member's block `b` of `send` (`n` blocks of `sum.len()`) summed over group `axis`
    /// in member order into `sum`, for this member's `b`.
    fn sum_my_block(
        &mut self,
        what: &str,
        axis: usize,
        send: &[f32],
        sum: &mut [f32],
    ) -> ExecResult<()> {
        let mut blocks = std::mem::take(&mut self.scratch.blocks);
        blocks.resize(send.len(), 0.0);
        self.share(what, axis, Share::Blocks, (send, &mut blocks[..send.len()]))?;
        sum_in_member_order(sum, blocks[..send.len()].chunks_exact(sum.len().max(1)), 0);
        self.scratch.blocks = blocks;
        Ok(())
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

    fn callable_from_any_thread(&self) -> bool {
        self.threading >= Threading::Serialized
    }

    fn all_reduce(&mut self, axis: usize, data: &mut [f32]) -> ExecResult<()> {
        self.agree("all_reduce", axis, data.len())?;
        let n = self.members(axis)?;
        let summed = self.over_comm(axis, |rank, comm, others| {
            rank.all_reduce_over(comm, axis, data, others)
        });
        if summed.is_some() {
            return Ok(());
        }
        let block = data.len().div_ceil(n);
        let mut mine = std::mem::take(&mut self.scratch.mine);
        mine.resize(block, 0.0);
        if block * n == data.len() {
            self.sum_my_block("all_reduce", axis, data, &mut mine)?;
            self.share("all_reduce", axis, Share::Whole, (&mine, data))?;
        } else {
            let mut padded = std::mem::take(&mut self.scratch.padded);
            padded.clear();
            padded.extend_from_slice(data);
            padded.resize(block * n, 0.0);
            self.sum_my_block("all_reduce", axis, &padded, &mut mine)?;
            self.share("all_reduce", axis, Share::Whole, (&mine, &mut padded))?;
            data.copy_from_slice(&padded[..data.len()]);
            self.scratch.padded = padded;
        }
        self.scratch.mine = mine;
        Ok(())
    }

    fn all_gather(&mut self, axis: usize, send: &[f32], recv: &mut [f32]) -> ExecResult<()> {
        let n = self.members(axis)?;
        check_len("all_gather", recv.len(), send.len() * n)?;
        self.agree("all_gather", axis, send.len())?;
        self.share("all_gather", axis, Share::Whole, (send, recv))
    }

    fn reduce_scatter(&mut self, axis: usize, send: &[f32], recv: &mut [f32]) -> ExecResult<()> {
        let n = self.members(axis)?;
        check_len("reduce_scatter", send.len(), recv.len() * n)?;
        self.agree("reduce_scatter", axis, send.len())?;
        let summed = self.over_comm(axis, |rank, comm, others| {
            rank.scatter_over(comm, "reduce_scatter", axis, send, others);
            let me = comm.rank() as usize;
            let own = &send[me * recv.len()..][..recv.len()];
            sum_in_member_order(recv, member_blocks((n, me), own, others), 0);
        });
        if summed.is_some() {
            return Ok(());
        }
        self.sum_my_block("reduce_scatter", axis, send, recv)
    }

    fn all_to_all(&mut self, axis: usize, send: &[f32], recv: &mut [f32]) -> ExecResult<()> {
        let n = self.members(axis)?;
        check_len("all_to_all", recv.len(), send.len())?;
        block_len("all_to_all", send.len(), n)?;
        self.agree("all_to_all", axis, send.len())?;
        self.share("all_to_all", axis, Share::Blocks, (send, recv))
    }

    fn send(&mut self, to: usize, data: &[f32]) -> ExecResult<()> {
        self.peer("send to", to)?;
        self.post(0, to, data);
        Ok(())
    }

    fn recv(&mut self, from: usize, data: &mut [f32]) -> ExecResult<()> {
        self.peer("recv from", from)?;
        let hung = || format!("rank {from} did not send the message it was waited for");
        self.take(0, from, data, hung)
            .or_else(|sent| check_len(&format!("recv from rank {from}"), sent, data.len()))
    }
}

/// `buffer` cut, from its start, into consecutive slices of `lens`.
fn split_blocks(mut buffer: &mut [f32], lens: impl Iterator<Item = usize>) -> Vec<&mut [f32]> {
    lens.map(|len| {
        let (block, rest) = std::mem::take(&mut buffer).split_at_mut(len);
        buffer = rest;
        block
    })
    .collect()
}

/// Every member's part of this member's block, in member order: `own` for member `me`, the
/// others' from `others` ([`MpiRank::scatter_over`]'s layout).
fn member_blocks<'a>(
    (n, me): (usize, usize),
    own: &'a [f32],
    others: &'a [f32],
) -> impl Iterator<Item = &'a [f32]> + Clone {
    (0..n).map(move |i| match i.cmp(&me) {
        std::cmp::Ordering::Equal => own,
        std::cmp::Ordering::Less => &others[i * own.len()..][..own.len()],
        std::cmp::Ordering::Greater => &others[(i - 1) * own.len()..][..own.len()],
    })
}

/// Polls `poll` until it gives a value, spinning briefly (collectives and messages usually
/// meet within microseconds), then without holding the core; past `timeout`, says what `hung`
/// describes and aborts the MPI job, since an operation in flight cannot be called off and
/// every process must stop.
fn poll_within<T>(
    world: &SimpleCommunicator,
    timeout: Duration,
    hung: impl FnOnce() -> String,
    mut poll: impl FnMut() -> Option<T>,
) -> T {
    let start = Instant::now();
    loop {
        if let Some(done) = poll() {
            return done;
        }
        let waited = start.elapsed();
        if waited >= timeout {
            eprintln!(
                "error[E0973]: {} within {:.1} s (hung?); aborting the MPI job",
                hung(),
                timeout.as_secs_f64()
            );
            abort_job(world, 1)
        }
        match waited < Duration::from_millis(5) {
            true => std::thread::yield_now(),
            false => std::thread::sleep(Duration::from_micros(200)),
        }
    }
}

/// Waits for `request` to complete within `timeout` ([`poll_within`]).
fn complete_within<'a, D: ?Sized, S: mpi::request::Scope<'a>>(
    world: &SimpleCommunicator,
    timeout: Duration,
    request: mpi::request::Request<'a, D, S>,
    hung: impl FnOnce() -> String,
) {
    let mut pending = Some(request);
    poll_within(world, timeout, hung, || match pending.take()?.test() {
        Ok(_) => Some(()),
        Err(request) => {
            pending = Some(request);
            None
        }
    })
}

/// How long a process that ends the job gives mpiexec to forward what it wrote.
const OUTPUT_DRAIN: Duration = Duration::from_millis(300);

/// Ends every process of the job with `status` (MPI_Abort), once this process's output had
/// time to reach mpiexec: the launcher stops forwarding output when it kills the processes,
/// and an abort at once lost the message saying why (seen under CI: an empty stderr).
fn abort_job(world: &impl Communicator, status: i32) -> ! {
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    std::thread::sleep(OUTPUT_DRAIN);
    world.abort(status)
}
