//! The threads backend: N ranks as threads of one process, exchanging through shared memory.
//! [`world`] hands out one [`ThreadRank`] per rank, to be moved into its own thread.
//!
//! Each group (mesh axis × the group's first rank) owns one rendezvous: a member deposits its
//! contribution, the last to arrive publishes all of them at once, and every member then reads
//! what it needs from the published set — sums are taken in group order, so every member gets
//! the same bits. A rank that is dropped (its thread returned or panicked) is marked as left,
//! and every rank waiting for it in a collective gets an error instead of hanging.

use std::collections::HashMap;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use super::{block_len, check_len, collective_error, Collectives, Mesh};
use crate::error::ExecResult;

/// The contributions of one completed round, indexed by member.
type Round = Arc<Vec<Vec<f32>>>;

/// Where the members of one group meet.
#[derive(Default)]
struct Rendezvous {
    state: Mutex<RoundState>,
    turn: Condvar,
}

#[derive(Default)]
struct RoundState {
    /// Rounds completed so far.
    generation: u64,
    /// This round's contributions so far.
    pending: Vec<Option<Vec<f32>>>,
    /// The last completed round.
    published: Option<Round>,
}

/// What every rank shares.
struct Shared {
    mesh: Mesh,
    /// Per (axis, first rank of the group).
    groups: HashMap<(usize, usize), Rendezvous>,
    /// The ranks that have left (their [`ThreadRank`] was dropped).
    left: Mutex<Vec<usize>>,
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
            r.turn.notify_all();
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
    /// To every rank (index = destination).
    to: Vec<Sender<Vec<f32>>>,
    /// From every rank (index = source).
    from: Vec<Receiver<Vec<f32>>>,
}

/// The ranks of `mesh`, in rank order.
pub fn world(mesh: Mesh) -> Vec<ThreadRank> {
    let n = mesh.size();
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
    /// Deposits `mine` in this rank's group along `axis` and returns every member's
    /// contribution once all have arrived, with this rank's index in the group.
    fn exchange(&self, axis: usize, mine: Vec<f32>) -> ExecResult<(Round, usize)> {
        let mesh = &self.shared.mesh;
        if axis >= mesh.axes().len() {
            return Err(collective_error(format!(
                "no mesh axis {axis} (the mesh has {})",
                mesh.axes().len()
            )));
        }
        let group = mesh.group(self.rank, axis);
        let member = mesh.coords(self.rank)[axis];
        let rendezvous = &self.shared.groups[&(axis, group[0])];
        let mut state = lock(&rendezvous.state);
        if state.pending.len() != group.len() {
            state.pending = vec![None; group.len()];
        }
        let generation = state.generation;
        state.pending[member] = Some(mine);
        if state.pending.iter().all(Option::is_some) {
            let round: Vec<Vec<f32>> = state
                .pending
                .iter_mut()
                .map(|p| p.take().unwrap_or_default())
                .collect();
            state.published = Some(Arc::new(round));
            state.generation += 1;
            rendezvous.turn.notify_all();
        }
        while state.generation == generation {
            if let Some(left) = self.shared.missing(&group, &state.pending) {
                return Err(collective_error(format!(
                    "rank {} left before the collective on axis `{}` completed",
                    left,
                    mesh.axes()[axis].0
                )));
            }
            state = rendezvous
                .turn
                .wait(state)
                .unwrap_or_else(|e| e.into_inner());
        }
        let round = state
            .published
            .clone()
            .expect("a completed round is published");
        Ok((round, member))
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
        let (round, _) = self.exchange(axis, data.to_vec())?;
        self.same_lengths("all_reduce", &round, data.len())?;
        data.fill(0.0);
        for contribution in round.iter() {
            for (d, &c) in data.iter_mut().zip(contribution) {
                *d += c;
            }
        }
        Ok(())
    }

    fn all_gather(&mut self, axis: usize, send: &[f32], recv: &mut [f32]) -> ExecResult<()> {
        check_len("all_gather", recv.len(), send.len() * self.group_size(axis))?;
        let (round, _) = self.exchange(axis, send.to_vec())?;
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
        let (round, member) = self.exchange(axis, send.to_vec())?;
        self.same_lengths("reduce_scatter", &round, send.len())?;
        let block = member * recv.len()..(member + 1) * recv.len();
        recv.fill(0.0);
        for contribution in round.iter() {
            for (r, &c) in recv.iter_mut().zip(&contribution[block.clone()]) {
                *r += c;
            }
        }
        Ok(())
    }

    fn all_to_all(&mut self, axis: usize, send: &[f32], recv: &mut [f32]) -> ExecResult<()> {
        let n = self.group_size(axis);
        check_len("all_to_all", recv.len(), send.len())?;
        let b = block_len("all_to_all", send.len(), n)?;
        let (round, member) = self.exchange(axis, send.to_vec())?;
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
        let message = channel
            .recv()
            .map_err(|_| collective_error(format!("recv from rank {from}: that rank has left")))?;
        check_len(&format!("recv from rank {from}"), message.len(), data.len())?;
        data.copy_from_slice(&message);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn all_reduce_sums_over_each_axis_group() {
        let out = on_ranks(mesh_2x3(), |r| {
            let mut over_mp = values(r.rank(), 5);
            r.all_reduce(1, &mut over_mp).unwrap();
            let mut over_dp = values(r.rank(), 5);
            r.all_reduce(0, &mut over_dp).unwrap();
            (over_mp, over_dp)
        });
        let m = mesh_2x3();
        for (rank, (over_mp, over_dp)) in out.iter().enumerate() {
            for (axis, got) in [(1, over_mp), (0, over_dp)] {
                let group = m.group(rank, axis);
                let want: Vec<f32> = (0..5)
                    .map(|i| group.iter().map(|&g| values(g, 5)[i]).sum())
                    .collect();
                assert_eq!(got, &want, "rank {rank} axis {axis}");
            }
        }
    }

    #[test]
    fn gather_scatter_and_all_to_all_move_the_right_blocks() {
        let mesh = Mesh::line("dp", 3).unwrap();
        let out = on_ranks(mesh, |r| {
            let rank = r.rank();
            let mut gathered = vec![0.0; 6];
            r.all_gather(0, &values(rank, 2), &mut gathered).unwrap();
            let mut scattered = vec![0.0; 2];
            r.reduce_scatter(0, &values(rank, 6), &mut scattered)
                .unwrap();
            let mut swapped = vec![0.0; 6];
            r.all_to_all(0, &values(rank, 6), &mut swapped).unwrap();
            (gathered, scattered, swapped)
        });
        for (rank, (gathered, scattered, swapped)) in out.iter().enumerate() {
            let want: Vec<f32> = (0..3).flat_map(|g| values(g, 2)).collect();
            assert_eq!(gathered, &want);
            let sum: Vec<f32> = (0..2)
                .map(|i| (0..3).map(|g| values(g, 6)[rank * 2 + i]).sum())
                .collect();
            assert_eq!(scattered, &sum);
            let swap: Vec<f32> = (0..3)
                .flat_map(|g| values(g, 6)[rank * 2..rank * 2 + 2].to_vec())
                .collect();
            assert_eq!(swapped, &swap);
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
        let out = on_ranks(Mesh::line("dp", 3).unwrap(), |r| {
            if r.rank() == 1 {
                return Ok(());
            }
            let mut data = vec![1.0; 4];
            r.all_reduce(0, &mut data)
        });
        // Rank 1's thread returns without joining the all-reduce (its rank is dropped with
        // it): the others fail, naming it.
        assert!(out[1].is_ok());
        for rank in [0, 2] {
            let err = out[rank].as_ref().unwrap_err();
            assert!(err.message.contains("rank 1 left"), "{}", err.message);
        }
    }
}
