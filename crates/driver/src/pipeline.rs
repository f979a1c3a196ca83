//! Running one pipeline stage's forward ([`mslc_ir::shard::pipeline`]) on its rank: the
//! micro-batches one after another, each received from the stages before, run, and sent on —
//! the forward half of GPipe's and 1F1B's schedules, in which every stage works on the next
//! micro-batch while the later stages take the last one — and the transfer of whole arrays of
//! any dtype between ranks.

pub mod messages;

use std::collections::BTreeMap;
use std::time::Duration;

use mslc_exec::collectives::Collectives;
use mslc_exec::{ExecError, ExecErrorKind, ExecResult, Executor};
use mslc_io::npy::NpyArray;
use mslc_ir::shard::pipeline::StageCut;
use mslc_plan::parallel::estimate::Schedule;

/// Runs stage `cut`'s program in `exec` once per micro-batch of `micro` (the model inputs of
/// each, of which those the stage reads are set), receiving what crosses the cut into it
/// before each run and sending what crosses out after, over `exec`'s collectives;
/// `rank_of(stage)` is the rank of `stage` in this rank's row (the same replica and
/// tensor-parallel member). Returns, per model output of the stage ([`StageCut::outputs`]),
/// its value for each micro-batch.
pub fn forward_micro_batches(
    exec: &mut Executor,
    cut: &StageCut,
    micro: &[BTreeMap<String, NpyArray>],
    rank_of: &dyn Fn(usize) -> usize,
) -> ExecResult<Vec<Vec<NpyArray>>> {
    let inputs: Vec<(String, Vec<usize>)> = exec
        .module()
        .inputs()
        .map(|(name, v)| {
            let shape = exec.module().values[v as usize].ty.shape.iter();
            (
                name.to_string(),
                shape.map(|&d| d.max(0) as usize).collect(),
            )
        })
        .collect();
    let shape_of = |name: &str| inputs.iter().find(|(n, _)| n == name).map(|(_, s)| s);
    let mut outputs = vec![Vec::with_capacity(micro.len()); cut.outputs.len()];
    for batch in micro {
        for (name, array) in batch {
            if shape_of(name).is_some() {
                exec.set_input(name, array)?;
            }
        }
        for crossing in &cut.receives {
            let shape = shape_of(&crossing.name)
                .ok_or_else(|| missing(format!("no input `{}` to receive", crossing.name)))?
                .clone();
            let mut values = vec![0f32; shape.iter().product()];
            comm(exec)?.recv(rank_of(crossing.peer), &mut values)?;
            exec.set_input_f32(&crossing.name, &shape, &values)?;
        }
        exec.run()?;
        for crossing in &cut.sends {
            exec.send_output(&crossing.name, rank_of(crossing.peer))?;
        }
        for (name, out) in cut.outputs.iter().zip(&mut outputs) {
            let array = exec
                .output_npy(name)
                .ok_or_else(|| missing(format!("output `{name}` has no array form")))?;
            out.push(array);
        }
    }
    Ok(outputs)
}

/// One step of a stage's schedule: the forward or the backward of a micro-batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// The forward of micro-batch `i`.
    Forward(usize),
    /// The backward of micro-batch `i`.
    Backward(usize),
}

/// Stage `stage` of `stages`'s passes over `micro` micro-batches under `schedule`. GPipe: every
/// forward, then every backward (all `micro` micro-batches held at once). PipeDream-Flush's
/// 1F1B (Narayanan et al. 2021): `min(stages − 1 − stage, micro)` forwards to fill the
/// pipeline, then one forward and one backward in turn, then the backwards left, so the stage
/// holds at most `stages − stage` micro-batches between their forward and their backward.
/// Interleaved over `v` chunks per device: the stages are the chunks (stage `k` on device
/// `k mod (stages / v)`), and a chunk's passes are its part of its device's order
/// ([`device_order`]), each at the position [`chunk_turns`] gives. All give the same gradients:
/// each stage's micro-batches go forward, and back, in order.
pub fn schedule_passes(schedule: Schedule, stages: usize, stage: usize, micro: usize) -> Vec<Pass> {
    if let Some(turns) = chunk_turns(schedule, stages, stage, micro) {
        return turns.into_iter().map(|(_, pass)| pass).collect();
    }
    let warmup = match schedule {
        Schedule::GPipe => micro,
        _ => stages.saturating_sub(stage + 1).min(micro),
    };
    let mut passes: Vec<Pass> = (0..warmup).map(Pass::Forward).collect();
    for i in 0..micro {
        if warmup + i < micro {
            passes.push(Pass::Forward(warmup + i));
        }
        passes.push(Pass::Backward(i));
    }
    passes
}

/// The passes of stage `stage` of `stages` ([`schedule_passes`]), each with its position in its
/// device's order under an interleaved schedule ([`chunk_turns`]): the order a stage's loop
/// runs them in, and what the plan of its messages follows.
pub fn stage_passes(
    schedule: Schedule,
    stages: usize,
    stage: usize,
    micro: usize,
) -> Vec<(Option<usize>, Pass)> {
    match chunk_turns(schedule, stages, stage, micro) {
        Some(turns) => turns
            .into_iter()
            .map(|(at, pass)| (Some(at), pass))
            .collect(),
        None => schedule_passes(schedule, stages, stage, micro)
            .into_iter()
            .map(|pass| (None, pass))
            .collect(),
    }
}

/// The devices a pipeline of `stages` stages runs on under `schedule`: as many as the stages,
/// but under an interleaved schedule, whose stages are chunks (stage `k` on device
/// `k mod devices`, as [`chunk_turns`] places them).
pub fn schedule_devices(schedule: Schedule, stages: usize) -> usize {
    (stages / schedule.chunks().max(1) as usize).max(1)
}

/// Under an interleaved schedule, the passes of chunk-stage `stage` of `stages` with each one's
/// position in its device's order of one update ([`device_order`]); `None` for the other
/// schedules, whose stages are devices.
pub fn chunk_turns(
    schedule: Schedule,
    stages: usize,
    stage: usize,
    micro: usize,
) -> Option<Vec<(usize, Pass)>> {
    let Schedule::Interleaved(v) = schedule else {
        return None;
    };
    let v = usize::try_from(v).ok().filter(|&v| v > 0)?;
    let devices = schedule_devices(schedule, stages);
    let (device, chunk) = (stage % devices, stage / devices);
    let order = device_order(devices, v, device, micro);
    let mine = order
        .into_iter()
        .enumerate()
        .filter(|(_, (c, _))| *c == chunk);
    Some(mine.map(|(position, (_, pass))| (position, pass)).collect())
}

/// Megatron-LM's interleaved 1F1B (Narayanan et al. 2021, §2.2.2) on device `device` of
/// `devices`, each holding `chunks` chunks of the layers (chunk `j` of device `s` the
/// `j·devices + s`-th), over `micro` micro-batches (a multiple of `devices`): the order of
/// its passes, each `(chunk, pass)`. Forwards go through the chunks in groups of `devices`
/// micro-batches, backwards through the chunks in reverse; the device warms up with
/// `2(devices − device − 1) + (chunks − 1)·devices` forwards (all of them when `micro` equals
/// `devices`), then alternates one forward with one backward, then drains. So it holds at most
/// `chunks·devices + devices − 1 − 2·device` chunk-micro-batches in flight (the plan's count).
pub fn device_order(
    devices: usize,
    chunks: usize,
    device: usize,
    micro: usize,
) -> Vec<(usize, Pass)> {
    let (p, v) = (devices.max(1), chunks.max(1));
    let total = micro * v;
    let group = p * v;
    let micro_of = |k: usize| (k / group) * p + k % p;
    let forward = |k: usize| ((k % group) / p, Pass::Forward(micro_of(k)));
    let backward = |k: usize| (v - 1 - (k % group) / p, Pass::Backward(micro_of(k)));
    let warmup = match micro == p {
        true => total,
        false => ((p - device.min(p - 1) - 1) * 2 + (v - 1) * p).min(total),
    };
    let mut order: Vec<(usize, Pass)> = (0..warmup).map(forward).collect();
    for k in 0..total - warmup {
        order.push(forward(warmup + k));
        order.push(backward(k));
    }
    order.extend((total - warmup..total).map(backward));
    order
}

/// The turns of the chunk-stages of one device under an interleaved schedule, each a rank of
/// its own: a chunk waits for the position of its next pass in the device's order
/// ([`chunk_turns`]), runs it and hands the turn on, so the device runs one pass at a time,
/// in Megatron-LM's order, holding what that order holds.
#[derive(Debug, Default)]
pub struct Turns {
    turn: std::sync::Mutex<Turn>,
    taken: std::sync::Condvar,
}

/// Whose turn it is on a device ([`Turns`]).
#[derive(Debug, Default)]
struct Turn {
    /// The update (the first chunk to arrive sets it).
    update: Option<u64>,
    /// The position in the device's order of that update.
    position: usize,
    /// Whether a chunk failed: none waits any more.
    abandoned: bool,
}

impl Turns {
    /// Waits until it is the turn of `position` of update `update`; an error when another
    /// chunk of the device failed ([`Turns::abandon`]) or none came for `timeout`.
    pub fn wait(&self, update: u64, position: usize, timeout: Duration) -> ExecResult<()> {
        let mut turn = self.turn.lock().unwrap_or_else(|e| e.into_inner());
        turn.update.get_or_insert(update);
        let deadline = std::time::Instant::now() + timeout;
        while !turn.abandoned && (turn.update, turn.position) != (Some(update), position) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(missing(format!(
                    "the device's chunk whose turn it was did not take it within {timeout:?}"
                )));
            }
            turn = self
                .taken
                .wait_timeout(turn, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        match turn.abandoned {
            true => Err(missing("another chunk of this device failed".to_string())),
            false => Ok(()),
        }
    }

    /// Hands the turn on, after the pass whose turn it was, the device running `per_update`
    /// passes per update.
    pub fn pass(&self, per_update: usize) {
        let mut turn = self.turn.lock().unwrap_or_else(|e| e.into_inner());
        turn.position += 1;
        if turn.position >= per_update {
            turn.update = turn.update.map(|u| u + 1);
            turn.position = 0;
        }
        self.taken.notify_all();
    }

    /// Stops the device's other chunks waiting: this one failed.
    pub fn abandon(&self) {
        let mut turn = self.turn.lock().unwrap_or_else(|e| e.into_inner());
        turn.abandoned = true;
        self.taken.notify_all();
    }
}

/// Sends `array` (any dtype and shape) to rank `to` as its `.npy` bytes ([`send_bytes`]).
/// [`recv_array`] is the other side.
pub fn send_array(comm: &mut dyn Collectives, to: usize, array: &NpyArray) -> ExecResult<()> {
    send_bytes(comm, to, &array.to_npy_bytes())
}

/// Receives an array [`send_array`] sent from rank `from`.
pub fn recv_array(comm: &mut dyn Collectives, from: usize) -> ExecResult<NpyArray> {
    let bytes = recv_bytes(comm, from)?;
    NpyArray::from_npy_bytes(&bytes).map_err(|e| missing(format!("a received array: {e}")))
}

/// Sends `bytes` to rank `to`: their length, then the bytes, as f32 words (which the
/// collectives copy bit for bit). [`recv_bytes`] is the other side.
pub fn send_bytes(comm: &mut dyn Collectives, to: usize, bytes: &[u8]) -> ExecResult<()> {
    let len = bytes.len() as u64;
    let header = [len as u32, (len >> 32) as u32].map(f32::from_bits);
    comm.send(to, &header)?;
    let words: Vec<f32> = bytes
        .chunks(4)
        .map(|b| {
            let mut word = [0u8; 4];
            word[..b.len()].copy_from_slice(b);
            f32::from_bits(u32::from_le_bytes(word))
        })
        .collect();
    comm.send(to, &words)
}

/// Receives the bytes [`send_bytes`] sent from rank `from`.
pub fn recv_bytes(comm: &mut dyn Collectives, from: usize) -> ExecResult<Vec<u8>> {
    let mut header = [0f32; 2];
    comm.recv(from, &mut header)?;
    let len = u64::from(header[0].to_bits()) | (u64::from(header[1].to_bits()) << 32);
    let len = usize::try_from(len).map_err(|_| missing(format!("a message of {len} bytes")))?;
    let mut words = vec![0f32; len.div_ceil(4)];
    comm.recv(from, &mut words)?;
    let mut bytes: Vec<u8> = words
        .iter()
        .flat_map(|w| w.to_bits().to_le_bytes())
        .collect();
    bytes.truncate(len);
    Ok(bytes)
}

/// `parts` (arrays of one dtype, equal but for dim `dim`) joined along `dim`, in order.
pub fn concat(parts: &[NpyArray], dim: usize) -> Result<NpyArray, String> {
    let first = parts.first().ok_or("nothing to join")?;
    let shape = first.shape();
    if dim >= shape.len() {
        return Err(format!("dim {dim} of a rank-{} array", shape.len()));
    }
    let outer: usize = shape[..dim].iter().product();
    let mut joined = shape.to_vec();
    joined[dim] = 0;
    for p in parts {
        let same = p.dtype() == first.dtype()
            && p.shape().len() == shape.len()
            && (0..shape.len()).all(|d| d == dim || p.shape()[d] == shape[d]);
        if !same {
            return Err(format!(
                "parts {:?} and {:?} do not join along dim {dim}",
                shape,
                p.shape()
            ));
        }
        joined[dim] += p.shape()[dim];
    }
    let bytes: Vec<&[u8]> = parts.iter().map(NpyArray::data).collect();
    NpyArray::new(first.dtype(), joined, join_bytes(&bytes, outer)).map_err(|e| e.to_string())
}

/// The row-major tensors `parts`, each `outer` equal blocks (the dims before the one they
/// join along), joined block by block: for each block, every part's in order.
pub fn join_bytes(parts: &[&[u8]], outer: usize) -> Vec<u8> {
    let mut data = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
    for o in 0..outer {
        for p in parts {
            let block = p.len() / outer.max(1);
            data.extend_from_slice(&p[o * block..(o + 1) * block]);
        }
    }
    data
}

fn comm(exec: &mut Executor) -> ExecResult<&mut (dyn Collectives + 'static)> {
    exec.collectives()
        .ok_or_else(|| missing("a pipeline stage runs without collectives".to_string()))
}

fn missing(message: String) -> ExecError {
    ExecError::new(ExecErrorKind::Input, message)
}

#[cfg(test)]
mod tests {
    use mslc_exec::collectives::threads::world;
    use mslc_exec::collectives::Mesh;

    use super::*;

    #[test]
    fn arrays_of_any_dtype_travel_whole() {
        let ids = NpyArray::from_i64(vec![2, 3], &[1, -2, 3, i64::MAX, 5, 6]).unwrap();
        let mut ranks = world(Mesh::line("pp", 2).unwrap());
        let mut second = ranks.pop().unwrap();
        let mut first = ranks.pop().unwrap();
        send_array(&mut first, 1, &ids).unwrap();
        assert_eq!(recv_array(&mut second, 0).unwrap(), ids);
    }

    /// Megatron-LM's interleaved order on 2 devices of 2 chunks over 4 micro-batches: the first
    /// device warms up with 4 forwards (both chunks, micro-batches in pairs), alternates, and
    /// drains the second chunk's backwards before the first's; the last device's last chunk
    /// runs each backward right after its forward.
    #[test]
    fn the_interleaved_order_is_megatron_s() {
        use Pass::{Backward as B, Forward as F};
        let first = [
            (0, F(0)),
            (0, F(1)),
            (1, F(0)),
            (1, F(1)),
            (0, F(2)),
            (1, B(0)),
            (0, F(3)),
            (1, B(1)),
            (1, F(2)),
            (0, B(0)),
            (1, F(3)),
            (0, B(1)),
            (1, B(2)),
            (1, B(3)),
            (0, B(2)),
            (0, B(3)),
        ];
        assert_eq!(device_order(2, 2, 0, 4), first);
        let last = device_order(2, 2, 1, 4);
        assert_eq!(last[..4], [(0, F(0)), (0, F(1)), (1, F(0)), (1, B(0))]);
        // Chunk-stage 2 (device 0's second chunk): its passes at their device positions.
        let turns = chunk_turns(Schedule::Interleaved(2), 4, 2, 4).unwrap();
        assert_eq!(turns[..3], [(2, F(0)), (3, F(1)), (5, B(0))]);
        assert_eq!(chunk_turns(Schedule::OneFOneB, 4, 2, 4), None);
    }

    /// Every device running its interleaved order one pass at a time — a forward waiting for
    /// the chunk-stage before, a backward for the one after — finishes (no device waits on
    /// another that waits on it), each chunk-stage takes its micro-batches forward and back in
    /// order, and device `s` holds at most `v·p + p − 1 − 2s` chunk-micro-batches (all
    /// `m·v` when `m = p`).
    #[test]
    fn interleaved_orders_run_to_the_end_holding_what_the_plan_counts() {
        for (p, v, m) in [
            (2, 2, 4),
            (2, 3, 4),
            (4, 2, 8),
            (4, 2, 4),
            (3, 2, 9),
            (2, 2, 2),
        ] {
            let stages = p * v;
            let orders: Vec<Vec<(usize, Pass)>> =
                (0..p).map(|s| device_order(p, v, s, m)).collect();
            for (s, order) in orders.iter().enumerate() {
                assert_eq!(order.len(), 2 * m * v);
                for j in 0..v {
                    let passes =
                        schedule_passes(Schedule::Interleaved(v as i64), stages, j * p + s, m);
                    let (forwards, backwards): (Vec<Pass>, Vec<Pass>) = passes
                        .into_iter()
                        .partition(|x| matches!(x, Pass::Forward(_)));
                    let micro_batch = |x: &Pass| match *x {
                        Pass::Forward(i) | Pass::Backward(i) => i,
                    };
                    let forwards: Vec<usize> = forwards.iter().map(micro_batch).collect();
                    let backwards: Vec<usize> = backwards.iter().map(micro_batch).collect();
                    assert_eq!(forwards, (0..m).collect::<Vec<_>>(), "{p} {v} {m}");
                    assert_eq!(backwards, forwards);
                }
            }
            let mut done: Vec<(usize, Pass)> = Vec::new();
            let mut next = vec![0usize; p];
            let mut held = vec![(0usize, 0usize); p];
            while next.iter().zip(&orders).any(|(n, o)| *n < o.len()) {
                let mut moved = false;
                for s in 0..p {
                    let Some(&(chunk, pass)) = orders[s].get(next[s]) else {
                        continue;
                    };
                    let k = chunk * p + s;
                    let ready = match pass {
                        Pass::Forward(i) => k == 0 || done.contains(&(k - 1, Pass::Forward(i))),
                        Pass::Backward(i) => {
                            k + 1 == stages || done.contains(&(k + 1, Pass::Backward(i)))
                        }
                    };
                    if ready {
                        done.push((k, pass));
                        next[s] += 1;
                        let (now, most) = &mut held[s];
                        match pass {
                            Pass::Forward(_) => *now += 1,
                            Pass::Backward(_) => *now -= 1,
                        }
                        *most = (*most).max(*now);
                        moved = true;
                    }
                }
                assert!(moved, "p {p} v {v} m {m}: every device waits at {next:?}");
            }
            for (s, (_, most)) in held.iter().enumerate() {
                let bound = if m == p { m * v } else { v * p + p - 1 - 2 * s };
                assert!(
                    *most <= bound,
                    "p {p} v {v} m {m} device {s}: {most} > {bound}"
                );
            }
        }
    }

    /// A device's turns go position by position, update after update, whichever chunk takes
    /// them; a chunk that fails releases the one waiting with an error, and so does a turn
    /// nobody takes within the timeout, rather than a wait forever.
    #[test]
    fn turns_go_in_order_and_a_failed_chunk_releases_the_others() {
        let second = Duration::from_secs(10);
        let turns = std::sync::Arc::new(Turns::default());
        let later = std::sync::Arc::clone(&turns);
        let waiter = std::thread::spawn(move || {
            later.wait(3, 1, second).unwrap();
            later.pass(2);
            later.wait(4, 1, second)
        });
        turns.wait(3, 0, second).unwrap();
        turns.pass(2);
        turns.wait(4, 0, second).unwrap();
        turns.abandon();
        let failed = waiter.join().unwrap().unwrap_err();
        assert!(failed.message.contains("failed"), "{}", failed.message);
        let alone = Turns::default();
        let late = alone.wait(0, 1, Duration::from_millis(20)).unwrap_err();
        assert!(late.message.contains("did not take it"), "{}", late.message);
    }

    /// Megatron-LM's 1F1B on 4 stages of 6 micro-batches: the first stage fills the pipeline
    /// with 3 forwards and never holds more than 4 micro-batches; the last alternates. GPipe
    /// runs every forward first.
    #[test]
    fn one_f_one_b_fills_alternates_and_drains_and_gpipe_holds_all() {
        use Pass::{Backward as B, Forward as F};
        let one_f_one_b =
            |stages, stage, micro| schedule_passes(Schedule::OneFOneB, stages, stage, micro);
        let first = [
            F(0),
            F(1),
            F(2),
            F(3),
            B(0),
            F(4),
            B(1),
            F(5),
            B(2),
            B(3),
            B(4),
            B(5),
        ];
        assert_eq!(one_f_one_b(4, 0, 6), first);
        assert_eq!(one_f_one_b(4, 3, 3), [F(0), B(0), F(1), B(1), F(2), B(2)]);
        assert_eq!(one_f_one_b(4, 1, 1), [F(0), B(0)]);
        let gpipe = schedule_passes(Schedule::GPipe, 4, 3, 3);
        assert_eq!(gpipe, [F(0), F(1), F(2), B(0), B(1), B(2)]);
        for stage in 0..4 {
            let mut held: usize = 0;
            let mut most = 0;
            for pass in one_f_one_b(4, stage, 8) {
                match pass {
                    F(_) => held += 1,
                    B(_) => held -= 1,
                }
                most = most.max(held);
            }
            assert_eq!(most, 4 - stage);
        }
    }

    #[test]
    fn parts_join_along_their_dim() {
        let a = NpyArray::from_f32(vec![2, 1], &[1.0, 2.0]).unwrap();
        let b = NpyArray::from_f32(vec![2, 2], &[3.0, 4.0, 5.0, 6.0]).unwrap();
        let joined = concat(&[a.clone(), b.clone()], 1).unwrap();
        assert_eq!(joined.shape(), [2, 3]);
        assert_eq!(joined.to_f32().unwrap(), [1.0, 3.0, 4.0, 2.0, 5.0, 6.0]);
        let rows = concat(&[a.clone(), a.clone()], 0).unwrap();
        assert_eq!(rows.to_f32().unwrap(), [1.0, 2.0, 1.0, 2.0]);
        assert!(concat(&[a, b], 0).is_err());
    }
}
