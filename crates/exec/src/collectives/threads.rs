//! The threads backend: N ranks as threads of one process, exchanging through shared memory.
//! [`world`] hands out one [`ThreadRank`] per rank, to be moved into its own thread.
//!
//! Each group (mesh axis × the group's first rank) owns one rendezvous: a member deposits its
//! contribution, the last to arrive publishes all of them at once, and every member then reads
//! what it needs from the published set — sums are taken in group order, so every member gets
//! the same bits. A rank that is dropped (its thread returned or panicked) is marked as left,
//! and every rank waiting for it in a collective gets an error instead of hanging; a rank that
//! hangs (alive, never arriving or never sending) fails the others' wait after the world's
//! timeout. The contribution buffers of a completed round are kept for the next (no fresh
//! pages per collective), and sums run one cache-sized chunk at a time over every member. A
//! member that arrives before the others spins for a while before it sleeps (where every
//! thread of the world has a core: [`spins_while_waiting`]), so that the last arrival does not
//! wait for it to wake.
//!
//! A large all-reduce copies nothing: each member deposits the address of its own buffer
//! instead, and once all have arrived, member i sums slice i of every member's buffer (in
//! member order, the same bits as the copying path) and writes it into slice i of all of
//! them; a second meeting waits until every slice is written. Each rank then moves about 2n
//! bytes for an n-byte buffer, against about 5n through copies. A large all-gather,
//! reduce-scatter or all-to-all copies nothing into the exchange either: each member reads
//! what it needs of the others' inputs where they are, and the second meeting waits until all
//! have read, so no rank holds a copy of another's contribution.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::{
    block_bounds, block_len, check_len, collective_error, sum_in_member_order, Collectives, Mesh,
    DEFAULT_TIMEOUT, SUM_CHUNK,
};
use crate::error::ExecResult;
use mslc_kernels::step::runs_in_place;
#[cfg(test)]
use mslc_kernels::step::IN_PLACE_COLLECTIVE_MIN;

/// The contributions of one completed round, indexed by member.
type Round = Arc<Vec<Vec<f32>>>;

/// Each member's own buffer (address, length), by member: what an all-reduce in place shares.
type Buffers = Vec<(usize, usize)>;

/// Where the members of one group meet.
#[derive(Default)]
struct Rendezvous {
    state: Mutex<RoundState>,
    turn: Condvar,
    /// Bumped (under the lock) at every notification of `turn`: what a member spinning
    /// outside the lock watches for ([`Rendezvous::spin`]).
    progress: AtomicU64,
}

/// How long a member waits for the others of its group spinning before it sleeps on the
/// condition variable. Waking a sleeping thread costs tens of microseconds (a futex wake on a
/// VM), more than a small all-reduce itself: a data-parallel step's 77 gradient all-reduces
/// (tiny_llama, 8 layers, 2 ranks of one thread, 2-core Xeon) took ~70 µs for a norm's 1 KiB
/// and 11 ms in all; spinning first, 6 µs and 4.3-5.0 ms.
const SPIN_WAIT: Duration = Duration::from_micros(100);

impl Rendezvous {
    /// Wakes every member waiting on this rendezvous (under its lock).
    fn notify(&self) {
        self.progress.fetch_add(1, Ordering::Release);
        self.turn.notify_all();
    }

    /// Releases `state`, spins until the rendezvous moves past `seen` (its `progress` then) or
    /// [`SPIN_WAIT`] passes, and takes the lock again. The caller checks its condition again and
    /// sleeps on `turn` if it still does not hold.
    fn spin<'a>(
        &'a self,
        seen: u64,
        state: MutexGuard<'a, RoundState>,
    ) -> MutexGuard<'a, RoundState> {
        drop(state);
        let start = Instant::now();
        while self.progress.load(Ordering::Acquire) == seen && start.elapsed() < SPIN_WAIT {
            mslc_kernels::par::pause();
        }
        lock(&self.state)
    }
}

#[derive(Default)]
struct RoundState {
    /// Rounds completed so far.
    generation: u64,
    /// This round's contributions so far.
    pending: Vec<Option<Vec<f32>>>,
    /// The last completed round.
    published: Option<Round>,
    /// Contribution buffers of rounds every member is done with, for the next deposits.
    spare: Vec<Vec<f32>>,
    /// This round's members' own buffers (address, length), deposited for an all-reduce in
    /// place; (0, 0) for a member that deposited none or gave up waiting.
    buffers: Buffers,
    /// The buffers of the last completed round.
    published_buffers: Buffers,
    /// Members done writing their slice in the current all-reduce in place.
    written: usize,
    /// All-reduces in place completed so far.
    written_rounds: u64,
}

/// What every rank shares.
struct Shared {
    mesh: Mesh,
    /// Per (axis, first rank of the group).
    groups: HashMap<(usize, usize), Rendezvous>,
    /// The ranks that have left (their [`ThreadRank`] was dropped).
    left: Mutex<Vec<usize>>,
    /// How long a rank waits in a collective for the others before failing.
    timeout: Duration,
}

impl Shared {
    /// A rank of `group` that has left without contributing to the round in `pending`.
    fn missing(&self, group: &[usize], pending: &[Option<Vec<f32>>]) -> Option<usize> {
        let left = lock(&self.left);
        group
            .iter()
            .zip(pending)
            .find(|(rank, p)| p.is_none() && left.contains(rank))
            .map(|(&rank, _)| rank)
    }

    fn wake_all(&self) {
        for r in self.groups.values() {
            let _guard = lock(&r.state);
            r.notify();
        }
    }
}

/// Locks, ignoring poisoning: a panicking rank is marked as left, which every waiter checks.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One rank of a threads world: move it into the thread that runs that rank.
pub struct ThreadRank {
    rank: usize,
    shared: Arc<Shared>,
    /// Whether this rank spins before sleeping in a collective ([`spins_while_waiting`]).
    spins: bool,
    /// To every rank (index = destination).
    to: Vec<Sender<Vec<f32>>>,
    /// From every rank (index = source).
    from: Vec<Receiver<Vec<f32>>>,
}

/// The ranks of `mesh`, of one worker thread each, in rank order, waiting at most
/// [`DEFAULT_TIMEOUT`] in a collective.
pub fn world(mesh: Mesh) -> Vec<ThreadRank> {
    world_with_timeout(mesh, DEFAULT_TIMEOUT, 1)
}

/// Whether the members of a world of `ranks` ranks of `threads` worker threads each spin
/// before they sleep in a collective: where every thread the ranks keep busy has a core of its
/// own — each rank's workers and, where it has more than one, the communication thread that
/// overlaps its all-reduces — so that a spinning member takes no core another thread computes
/// on (2 ranks of 2 threads on 2 cores: a spinning communication thread delayed the backward
/// it overlaps, and fewer all-reduces overlapped).
pub fn spins_while_waiting(ranks: usize, threads: usize) -> bool {
    let busy = threads + usize::from(threads > 1);
    ranks.saturating_mul(busy) <= mslc_kernels::par::cores()
}

/// The ranks of `mesh`, of `threads` worker threads each, in rank order: a rank waiting longer
/// than `timeout` for the others of its group in a collective (one hangs) fails with an error
/// naming the missing ranks.
pub fn world_with_timeout(mesh: Mesh, timeout: Duration, threads: usize) -> Vec<ThreadRank> {
    let n = mesh.size();
    let spins = spins_while_waiting(n, threads);
    let mut groups = HashMap::new();
    for axis in 0..mesh.axes().len() {
        for rank in 0..n {
            groups
                .entry((axis, mesh.group(rank, axis)[0]))
                .or_insert_with(Rendezvous::default);
        }
    }
    let shared = Arc::new(Shared {
        mesh,
        groups,
        left: Mutex::new(Vec::new()),
        timeout,
    });
    // channels[src][dst]
    let mut senders: Vec<Vec<Sender<Vec<f32>>>> = Vec::with_capacity(n);
    let mut receivers: Vec<Vec<Option<Receiver<Vec<f32>>>>> =
        (0..n).map(|_| (0..n).map(|_| None).collect()).collect();
    for src in 0..n {
        let mut row = Vec::with_capacity(n);
        for dst_receivers in receivers.iter_mut() {
            let (tx, rx) = channel();
            row.push(tx);
            dst_receivers[src] = Some(rx);
        }
        senders.push(row);
    }
    senders
        .into_iter()
        .zip(receivers)
        .enumerate()
        .map(|(rank, (to, from))| ThreadRank {
            rank,
            shared: Arc::clone(&shared),
            spins,
            to,
            from: from
                .into_iter()
                .map(|r| r.expect("every pair has a channel"))
                .collect(),
        })
        .collect()
}

impl Drop for ThreadRank {
    fn drop(&mut self) {
        lock(&self.shared.left).push(self.rank);
        self.shared.wake_all();
    }
}

impl ThreadRank {
    /// Deposits a copy of `mine` in this rank's group along `axis` and returns every member's
    /// contribution once all have arrived, with this rank's index in the group.
    fn exchange(&self, axis: usize, mine: &[f32]) -> ExecResult<(Round, usize)> {
        self.meet(axis, mine, (0, 0))
            .map(|(round, _, member)| (round, member))
    }

    /// [`ThreadRank::exchange`], also depositing `buffer` (address, length) and returning every
    /// member's. A member that gives up waiting withdraws its buffer (to (0, 0)) under the
    /// lock, so a round completed after it left never hands out its address.
    fn meet(
        &self,
        axis: usize,
        mine: &[f32],
        buffer: (usize, usize),
    ) -> ExecResult<(Round, Buffers, usize)> {
        let mesh = &self.shared.mesh;
        let (group, rendezvous) = self.group_of(axis)?;
        let member = mesh.coords(self.rank)[axis];
        // Copied outside the lock, into a buffer of an earlier round when there is one.
        let mut copy = lock(&rendezvous.state).spare.pop().unwrap_or_default();
        copy.clear();
        copy.extend_from_slice(mine);
        let mut state = lock(&rendezvous.state);
        if state.pending.len() != group.len() {
            state.pending = vec![None; group.len()];
        }
        if state.buffers.len() != group.len() {
            state.buffers = vec![(0, 0); group.len()];
        }
        let generation = state.generation;
        let seen = rendezvous.progress.load(Ordering::Acquire);
        state.pending[member] = Some(copy);
        state.buffers[member] = buffer;
        if state.pending.iter().all(Option::is_some) {
            let round: Vec<Vec<f32>> = state
                .pending
                .iter_mut()
                .map(|p| p.take().unwrap_or_default())
                .collect();
            // Every member has arrived here, so each is done with the previous round.
            if let Some(done) = state.published.take().and_then(|r| Arc::try_unwrap(r).ok()) {
                state.spare.extend(done);
            }
            state.published = Some(Arc::new(round));
            let none = vec![(0, 0); group.len()];
            state.published_buffers = std::mem::replace(&mut state.buffers, none);
            state.generation += 1;
            rendezvous.notify();
        }
        if self.spins && state.generation == generation {
            state = rendezvous.spin(seen, state);
        }
        let deadline = Instant::now() + self.shared.timeout;
        while state.generation == generation {
            let axis_name = &mesh.axes()[axis].0;
            if let Some(left) = self.shared.missing(&group, &state.pending) {
                state.buffers[member] = (0, 0);
                return Err(collective_error(format!(
                    "rank {left} left before the collective on axis `{axis_name}` completed"
                )));
            }
            let now = Instant::now();
            if now >= deadline {
                state.buffers[member] = (0, 0);
                let absent: Vec<String> = group
                    .iter()
                    .zip(&state.pending)
                    .filter(|(_, p)| p.is_none())
                    .map(|(rank, _)| rank.to_string())
                    .collect();
                return Err(collective_error(format!(
                    "rank(s) {} did not reach the collective on axis `{axis_name}` within {:.1} s \
                     (hung?)",
                    absent.join(", "),
                    self.shared.timeout.as_secs_f64()
                )));
            }
            state = rendezvous
                .turn
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        let round = state
            .published
            .clone()
            .expect("a completed round is published");
        Ok((round, state.published_buffers.clone(), member))
    }

    /// Sums `data` over the group along `axis` without copying it anywhere (see the module
    /// docs): `data` is read and written by the group's members until every slice is written.
    fn all_reduce_in_place(&self, axis: usize, data: &mut [f32]) -> ExecResult<()> {
        let len = data.len();
        let (buffers, member) =
            self.meet_buffers("all_reduce", axis, (data.as_mut_ptr() as usize, len))?;
        let g = buffers.len();
        let std::ops::Range { start: lo, end: hi } = block_bounds(len, g, member);
        let mut sum = [0.0f32; SUM_CHUNK];
        for start in (lo..hi).step_by(SUM_CHUNK) {
            let n = SUM_CHUNK.min(hi - start);
            let sum = &mut sum[..n];
            let members = buffers.iter().map(|&(address, _)| {
                // SAFETY: every member's buffer holds `len` f32 and stays borrowed by its
                // owner, who touches it only through this all-reduce until the second
                // meeting below; slice `lo..hi` of each is read and written by this member
                // alone.
                unsafe { std::slice::from_raw_parts((address as *const f32).add(start), n) }
            });
            sum_in_member_order(sum, members, 0);
            for &(address, _) in &buffers {
                // SAFETY: as above.
                let theirs = unsafe {
                    std::slice::from_raw_parts_mut((address as *mut f32).add(start), sum.len())
                };
                theirs.copy_from_slice(sum);
            }
        }
        self.all_written(axis)
    }

    /// Deposits this rank's own `buffer` (address, length) in its group along `axis` and
    /// returns every member's once all have arrived, with this rank's index in the group; an
    /// error (on every member alike: they check the same published buffers) when one gave up
    /// waiting or deposited another length than this rank.
    fn meet_buffers(
        &self,
        what: &str,
        axis: usize,
        buffer: (usize, usize),
    ) -> ExecResult<(Buffers, usize)> {
        let (_, buffers, member) = self.meet(axis, &[], buffer)?;
        if let Some(other) = buffers.iter().position(|&(address, _)| address == 0) {
            return Err(collective_error(format!(
                "{what}: member {other} of the group gave up before the others arrived"
            )));
        }
        let len = buffer.1;
        if let Some(other) = buffers.iter().position(|&(_, l)| l != len) {
            return Err(collective_error(format!(
                "{what}: member {other} of the group sent {} values, this rank {len}",
                buffers[other].1
            )));
        }
        Ok((buffers, member))
    }

    /// Runs `read` on every member's `send` (in member order) and this rank's index in the
    /// group along `axis`, reading the members' own buffers instead of copies of them; returns
    /// once every member is done reading, so no `send` changes or goes while another reads it.
    fn read_in_place(
        &self,
        what: &str,
        axis: usize,
        send: &[f32],
        read: impl FnOnce(&[&[f32]], usize),
    ) -> ExecResult<()> {
        let (buffers, member) =
            self.meet_buffers(what, axis, (send.as_ptr() as usize, send.len()))?;
        let sends: Vec<&[f32]> = buffers
            .iter()
            .map(|&(address, len)| {
                // SAFETY: every member's `send` holds `len` f32 and stays borrowed by its
                // owner, unwritten, until the meeting in `all_written` below, which each
                // member reaches only after its own reads.
                unsafe { std::slice::from_raw_parts(address as *const f32, len) }
            })
            .collect();
        read(&sends, member);
        self.all_written(axis)
    }

    /// Waits until every member of this rank's group along `axis` has written its slice of an
    /// all-reduce in place (or read what it needs of the others' buffers). No timeout: each
    /// member got here through a completed meeting and runs a loop that cannot fail, and its
    /// buffer must outlive the others' writes and reads.
    fn all_written(&self, axis: usize) -> ExecResult<()> {
        let (group, rendezvous) = self.group_of(axis)?;
        let mut state = lock(&rendezvous.state);
        let round = state.written_rounds;
        let seen = rendezvous.progress.load(Ordering::Acquire);
        state.written += 1;
        if state.written == group.len() {
            state.written = 0;
            state.written_rounds += 1;
            rendezvous.notify();
        }
        if self.spins && state.written_rounds == round {
            state = rendezvous.spin(seen, state);
        }
        while state.written_rounds == round {
            state = rendezvous
                .turn
                .wait(state)
                .unwrap_or_else(|e| e.into_inner());
        }
        Ok(())
    }

    /// This rank's group along `axis` (its ranks) and the group's rendezvous.
    fn group_of(&self, axis: usize) -> ExecResult<(Vec<usize>, &Rendezvous)> {
        let mesh = &self.shared.mesh;
        if axis >= mesh.axes().len() {
            return Err(collective_error(format!(
                "no mesh axis {axis} (the mesh has {})",
                mesh.axes().len()
            )));
        }
        let group = mesh.group(self.rank, axis);
        let rendezvous = &self.shared.groups[&(axis, group[0])];
        Ok((group, rendezvous))
    }

    /// Checks that every member contributed `len` values.
    fn same_lengths(&self, what: &str, round: &Round, len: usize) -> ExecResult<()> {
        match round.iter().position(|c| c.len() != len) {
            None => Ok(()),
            Some(other) => Err(collective_error(format!(
                "{what}: member {other} of the group sent {} values, this rank {len}",
                round[other].len()
            ))),
        }
    }

    fn group_size(&self, axis: usize) -> usize {
        self.shared.mesh.axes().get(axis).map_or(0, |(_, s)| *s)
    }
}

impl Collectives for ThreadRank {
    fn rank(&self) -> usize {
        self.rank
    }

    fn mesh(&self) -> &Mesh {
        &self.shared.mesh
    }

    fn all_reduce(&mut self, axis: usize, data: &mut [f32]) -> ExecResult<()> {
        if runs_in_place(data.len(), self.group_size(axis)) {
            return self.all_reduce_in_place(axis, data);
        }
        let (round, _) = self.exchange(axis, data)?;
        self.same_lengths("all_reduce", &round, data.len())?;
        sum_in_member_order(data, round.iter(), 0);
        Ok(())
    }

    fn all_gather(&mut self, axis: usize, send: &[f32], recv: &mut [f32]) -> ExecResult<()> {
        check_len("all_gather", recv.len(), send.len() * self.group_size(axis))?;
        if runs_in_place(send.len(), self.group_size(axis)) {
            return self.read_in_place("all_gather", axis, send, |sends, _| {
                for (block, theirs) in recv.chunks_exact_mut(send.len()).zip(sends) {
                    block.copy_from_slice(theirs);
                }
            });
        }
        let (round, _) = self.exchange(axis, send)?;
        self.same_lengths("all_gather", &round, send.len())?;
        for (block, contribution) in recv.chunks_exact_mut(send.len().max(1)).zip(round.iter()) {
            block.copy_from_slice(contribution);
        }
        Ok(())
    }

    fn reduce_scatter(&mut self, axis: usize, send: &[f32], recv: &mut [f32]) -> ExecResult<()> {
        check_len(
            "reduce_scatter",
            send.len(),
            recv.len() * self.group_size(axis),
        )?;
        if runs_in_place(send.len(), self.group_size(axis)) {
            return self.read_in_place("reduce_scatter", axis, send, |sends, member| {
                sum_in_member_order(recv, sends, member * recv.len())
            });
        }
        let (round, member) = self.exchange(axis, send)?;
        self.same_lengths("reduce_scatter", &round, send.len())?;
        sum_in_member_order(recv, round.iter(), member * recv.len());
        Ok(())
    }

    fn all_to_all(&mut self, axis: usize, send: &[f32], recv: &mut [f32]) -> ExecResult<()> {
        let n = self.group_size(axis);
        check_len("all_to_all", recv.len(), send.len())?;
        let b = block_len("all_to_all", send.len(), n)?;
        if runs_in_place(send.len(), n) {
            return self.read_in_place("all_to_all", axis, send, |sends, member| {
                for (block, theirs) in recv.chunks_exact_mut(b.max(1)).zip(sends) {
                    block.copy_from_slice(&theirs[member * b..(member + 1) * b]);
                }
            });
        }
        let (round, member) = self.exchange(axis, send)?;
        self.same_lengths("all_to_all", &round, send.len())?;
        for (i, block) in recv.chunks_exact_mut(b.max(1)).take(n).enumerate() {
            block.copy_from_slice(&round[i][member * b..(member + 1) * b]);
        }
        Ok(())
    }

    fn send(&mut self, to: usize, data: &[f32]) -> ExecResult<()> {
        let channel = self.to.get(to).ok_or_else(|| {
            collective_error(format!(
                "send to rank {to}: the mesh has {} ranks",
                self.to.len()
            ))
        })?;
        channel
            .send(data.to_vec())
            .map_err(|_| collective_error(format!("send to rank {to}: that rank has left")))
    }

    fn recv(&mut self, from: usize, data: &mut [f32]) -> ExecResult<()> {
        let channel = self.from.get(from).ok_or_else(|| {
            collective_error(format!(
                "recv from rank {from}: the mesh has {} ranks",
                self.from.len()
            ))
        })?;
        // A sender that hangs fails the receive after the world's timeout, as a collective does.
        let timeout = self.shared.timeout;
        let message = channel.recv_timeout(timeout).map_err(|e| match e {
            RecvTimeoutError::Timeout => collective_error(format!(
                "recv from rank {from}: nothing came within {:.1} s (hung?)",
                timeout.as_secs_f64()
            )),
            RecvTimeoutError::Disconnected => {
                collective_error(format!("recv from rank {from}: that rank has left"))
            }
        })?;
        check_len(&format!("recv from rank {from}"), message.len(), data.len())?;
        data.copy_from_slice(&message);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Members spin only where every busy thread has a core: ranks of one worker each up to
    /// the core count; not ranks of two (a worker more, and a communication thread each).
    #[test]
    fn members_spin_only_where_every_thread_has_a_core() {
        let cores = mslc_kernels::par::cores();
        assert!(spins_while_waiting(1, 1));
        assert!(spins_while_waiting(cores, 1));
        assert!(!spins_while_waiting(cores + 1, 1));
        assert!(!spins_while_waiting(cores, 2));
        assert!(!spins_while_waiting(2, cores));
    }

    /// Runs `body` on every rank of `mesh`, each in its own thread; the results in rank order.
    fn on_ranks<T: Send>(mesh: Mesh, body: impl Fn(&mut ThreadRank) -> T + Sync) -> Vec<T> {
        let ranks = world(mesh);
        let body = &body;
        std::thread::scope(|scope| {
            let handles: Vec<_> = ranks
                .into_iter()
                .map(|mut r| scope.spawn(move || body(&mut r)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    fn mesh_2x3() -> Mesh {
        Mesh::new(vec![("dp".into(), 2), ("mp".into(), 3)]).unwrap()
    }

    /// Rank r's test values: r + i/8 (exact in f32, so sums are exact too).
    fn values(rank: usize, len: usize) -> Vec<f32> {
        (0..len).map(|i| rank as f32 + i as f32 / 8.0).collect()
    }

    #[test]
    fn mesh_numbers_ranks_with_the_last_axis_fastest() {
        let m = mesh_2x3();
        assert_eq!(m.size(), 6);
        assert_eq!(m.coords(4), vec![1, 1]);
        assert_eq!(m.group(4, 0), vec![1, 4]);
        assert_eq!(m.group(4, 1), vec![3, 4, 5]);
        assert_eq!(m.axis("mp").unwrap(), 1);
        assert!(m.axis("pp").unwrap_err().message.contains("axes: dp, mp"));
        assert!(Mesh::new(vec![("a".into(), 2), ("a".into(), 2)]).is_err());
        assert!(Mesh::new(vec![("a".into(), 0)]).is_err());
    }

    /// All-reduces `mine(rank)` on every rank of a 2×3 mesh over `mp`, then over `dp`; per
    /// rank and axis: the rank, the axis, its group and what it got.
    fn all_reduced_over_each_axis(
        mine: impl Fn(usize) -> Vec<f32> + Sync,
    ) -> Vec<(usize, usize, Vec<usize>, Vec<f32>)> {
        let out = on_ranks(mesh_2x3(), |r| {
            let mut over_mp = mine(r.rank());
            r.all_reduce(1, &mut over_mp).unwrap();
            let mut over_dp = mine(r.rank());
            r.all_reduce(0, &mut over_dp).unwrap();
            (over_mp, over_dp)
        });
        let m = mesh_2x3();
        out.into_iter()
            .enumerate()
            .flat_map(|(rank, (over_mp, over_dp))| {
                [(1, over_mp), (0, over_dp)]
                    .map(|(axis, got)| (rank, axis, m.group(rank, axis), got))
            })
            .collect()
    }

    #[test]
    fn all_reduce_sums_over_each_axis_group() {
        for (rank, axis, group, got) in all_reduced_over_each_axis(|rank| values(rank, 5)) {
            let want: Vec<f32> = (0..5)
                .map(|i| group.iter().map(|&g| values(g, 5)[i]).sum())
                .collect();
            assert_eq!(got, want, "rank {rank} axis {axis}");
        }
    }

    /// Through copies (blocks of 2 values) and in place (blocks of a large collective's
    /// size): the same blocks, the same sums in member order.
    #[test]
    fn gather_scatter_and_all_to_all_move_the_right_blocks() {
        for b in [2, IN_PLACE_COLLECTIVE_MIN] {
            gather_scatter_and_all_to_all_blocks_of(b);
        }
    }

    fn gather_scatter_and_all_to_all_blocks_of(b: usize) {
        let mesh = Mesh::line("dp", 3).unwrap();
        let out = on_ranks(mesh, |r| {
            let rank = r.rank();
            let mut gathered = vec![0.0; 3 * b];
            r.all_gather(0, &values(rank, b), &mut gathered).unwrap();
            let mut scattered = vec![0.0; b];
            r.reduce_scatter(0, &values(rank, 3 * b), &mut scattered)
                .unwrap();
            let mut swapped = vec![0.0; 3 * b];
            r.all_to_all(0, &values(rank, 3 * b), &mut swapped).unwrap();
            (gathered, scattered, swapped)
        });
        for (rank, (gathered, scattered, swapped)) in out.iter().enumerate() {
            let want: Vec<f32> = (0..3).flat_map(|g| values(g, b)).collect();
            assert_eq!(gathered, &want, "blocks of {b}");
            let sum: Vec<f32> = (0..b)
                .map(|i| (0..3).map(|g| values(g, 3 * b)[rank * b + i]).sum())
                .collect();
            assert_eq!(scattered, &sum, "blocks of {b}");
            let swap: Vec<f32> = (0..3)
                .flat_map(|g| values(g, 3 * b)[rank * b..(rank + 1) * b].to_vec())
                .collect();
            assert_eq!(swapped, &swap, "blocks of {b}");
        }
    }

    #[test]
    fn send_and_recv_pass_a_ring() {
        let out = on_ranks(Mesh::line("pp", 4).unwrap(), |r| {
            let (rank, n) = (r.rank(), 4);
            r.send((rank + 1) % n, &values(rank, 3)).unwrap();
            let mut got = vec![0.0; 3];
            r.recv((rank + n - 1) % n, &mut got).unwrap();
            got
        });
        for (rank, got) in out.iter().enumerate() {
            assert_eq!(got, &values((rank + 3) % 4, 3));
        }
    }

    #[test]
    fn disagreeing_lengths_are_an_error_on_every_member() {
        let out = on_ranks(Mesh::line("dp", 2).unwrap(), |r| {
            let mut data = vec![1.0; 2 + r.rank()];
            r.all_reduce(0, &mut data).map(drop)
        });
        for result in out {
            assert!(result.unwrap_err().message.contains("sent"));
        }
        let out = on_ranks(Mesh::line("pp", 2).unwrap(), |r| {
            if r.rank() == 0 {
                r.send(1, &[1.0, 2.0]).map(drop)
            } else {
                r.recv(0, &mut [0.0; 3])
            }
        });
        assert!(out[1]
            .as_ref()
            .unwrap_err()
            .message
            .contains("2 values where 3"));
    }

    #[test]
    fn a_rank_that_leaves_fails_its_peers_instead_of_hanging() {
        for len in [4, IN_PLACE_COLLECTIVE_MIN] {
            let out = on_ranks(Mesh::line("dp", 3).unwrap(), |r| {
                if r.rank() == 1 {
                    return Ok(());
                }
                let mut data = vec![1.0; len];
                r.all_reduce(0, &mut data)
            });
            // Rank 1's thread returns without joining the all-reduce (its rank is dropped
            // with it): the others fail, naming it.
            assert!(out[1].is_ok());
            for rank in [0, 2] {
                let err = out[rank].as_ref().unwrap_err();
                assert!(err.message.contains("rank 1 left"), "{}", err.message);
            }
        }
    }

    /// A rank that hangs — alive, holding its rank, never arriving — fails the others after
    /// the world's timeout, naming it, instead of blocking them forever.
    #[test]
    fn a_rank_that_hangs_fails_its_peers_after_the_timeout() {
        for len in [4, IN_PLACE_COLLECTIVE_MIN] {
            a_rank_that_hangs_fails_its_peer(len);
        }
    }

    fn a_rank_that_hangs_fails_its_peer(len: usize) {
        let timeout = Duration::from_millis(200);
        let ranks = world_with_timeout(Mesh::line("dp", 2).unwrap(), timeout, 1);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let mut rx = Some(rx);
        let out: Vec<ExecResult<Duration>> = std::thread::scope(|scope| {
            let handles: Vec<_> = ranks
                .into_iter()
                .map(|mut r| {
                    let rx = if r.rank() == 1 { rx.take() } else { None };
                    let tx = tx.clone();
                    scope.spawn(move || {
                        if let Some(rx) = rx {
                            // Hangs until rank 0 has given up, then leaves.
                            let _ = rx.recv();
                            return Ok(Duration::ZERO);
                        }
                        let start = Instant::now();
                        let mut data = vec![1.0; len];
                        let result = r.all_reduce(0, &mut data).map(|()| start.elapsed());
                        tx.send(()).unwrap();
                        result
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let err = out[0].as_ref().unwrap_err();
        assert!(
            err.message.contains("rank(s) 1 did not reach") && err.message.contains("0.2 s"),
            "{}",
            err.message
        );
    }

    /// A receive from a rank that never sends (a pipeline stage that hangs) fails after the
    /// world's timeout too, naming the sender.
    #[test]
    fn a_receive_from_a_rank_that_never_sends_fails_after_the_timeout() {
        let timeout = Duration::from_millis(100);
        let mut ranks = world_with_timeout(Mesh::line("pp", 2).unwrap(), timeout, 1);
        let _silent = ranks.pop();
        let mut waiting = ranks.pop().unwrap();
        let mut data = vec![0.0; 3];
        let err = waiting.recv(1, &mut data).unwrap_err();
        assert!(
            err.message.contains("recv from rank 1") && err.message.contains("0.1 s"),
            "{}",
            err.message
        );
    }

    /// A large all-reduce runs in place: over both axes of a 2×3 mesh, with lengths the groups
    /// do not divide, every member gets the same bits as the copying path's member-order sum.
    #[test]
    fn large_all_reduces_in_place_sum_over_each_axis_group() {
        let len = IN_PLACE_COLLECTIVE_MIN + 7;
        let value = |rank: usize, i: usize| (rank as f32 + 0.1) * (i as f32 * 0.37).sin();
        let mine = |rank: usize| (0..len).map(|i| value(rank, i)).collect::<Vec<f32>>();
        for (rank, axis, group, got) in all_reduced_over_each_axis(mine) {
            let round: Vec<Vec<f32>> = group.iter().map(|&g| mine(g)).collect();
            let mut want = vec![f32::NAN; len];
            sum_in_member_order(&mut want, &round, 0);
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "rank {rank} axis {axis}"
            );
        }
        let out = on_ranks(Mesh::line("dp", 2).unwrap(), |r| {
            let mut data = vec![1.0; IN_PLACE_COLLECTIVE_MIN + r.rank()];
            r.all_reduce(0, &mut data).map(drop)
        });
        for result in out {
            assert!(result.unwrap_err().message.contains("sent"));
        }
    }

    /// Buffers of earlier rounds are reused, and every round still sums its own values.
    #[test]
    fn repeated_all_reduces_reuse_buffers_and_stay_exact() {
        let out = on_ranks(Mesh::line("dp", 2).unwrap(), |r| {
            (0..5)
                .map(|round| {
                    let mut data: Vec<f32> =
                        (0..5000).map(|i| (i + r.rank() + round) as f32).collect();
                    r.all_reduce(0, &mut data).unwrap();
                    data
                })
                .collect::<Vec<_>>()
        });
        for (round, got) in out[0].iter().enumerate() {
            let want: Vec<f32> = (0..5000).map(|i| (2 * (i + round) + 1) as f32).collect();
            assert_eq!(got, &want, "round {round}");
            assert_eq!(got, &out[1][round]);
        }
    }
}
