//! What a pipeline stage holds of its messages over a step, for its memory plan: the values it
//! received for each micro-batch between that micro-batch's forward and its backward, the
//! gradients it receives for a backward, and its sends the receiver has not taken yet (the
//! collectives keep a copy of each until then: a channel's on the threads backend, a request's
//! under MPI). How far a sender runs ahead of its receiver depends on timing, so the sends are
//! bounded over every order the stages' passes can run in: a send is counted until its receive
//! happened before it (vector clocks over the messages and, under an interleaved schedule, the
//! turns of a device's chunks).

use std::collections::HashMap;

use mslc_plan::parallel::estimate::Schedule;

use super::{schedule_devices, stage_passes, Pass};

/// A value that crosses a pipeline's cut: stage `from` sends it to stage `to` in each
/// forward, and `to` sends its gradient back in each backward, `bytes` each way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Link {
    /// The sending stage (in the forward).
    pub from: usize,
    /// The receiving stage (in the forward).
    pub to: usize,
    /// Bytes of the value, and of its gradient.
    pub bytes: u64,
}

/// One message of a step: link `link`'s value of micro-batch `micro`, or its gradient.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Message {
    link: usize,
    micro: usize,
    gradient: bool,
}

/// What a stage does, in order, as far as its messages and turns go.
#[derive(Clone, Copy, Debug)]
enum Event {
    /// A pass begins at this position of its device's order (interleaved schedules only).
    Start(usize),
    /// A pass at this position of its device's order ends.
    End(usize),
    Recv(Message),
    Send(Message),
}

/// The most bytes of pipeline messages each device ([`schedule_devices`]) holds at once over one update
/// of `micro` micro-batches under `schedule`, `stages` stages' cuts crossed by `links`: the
/// received values its stages keep for their micro-batches in flight and a backward's
/// received gradients, plus its sends not yet taken.
pub fn held_message_bytes(
    schedule: Schedule,
    stages: usize,
    micro: usize,
    links: &[Link],
) -> Vec<u64> {
    let received = received_bytes(schedule, stages, micro, links);
    let sent = unreceived_send_bytes(schedule, stages, micro, links);
    received
        .into_iter()
        .zip(sent)
        .map(|(r, s)| r.saturating_add(s))
        .collect()
}

/// The most bytes each device keeps of what its stages received: each micro-batch's received
/// values from its forward to its backward, and during a backward that micro-batch's values
/// with the gradients the backward receives. A device's stages run one pass at a time, in
/// its order.
fn received_bytes(schedule: Schedule, stages: usize, micro: usize, links: &[Link]) -> Vec<u64> {
    let devices = schedule_devices(schedule, stages);
    let sum = |of: &dyn Fn(&Link) -> bool| -> u64 {
        links.iter().filter(|l| of(l)).map(|l| l.bytes).sum()
    };
    let values: Vec<u64> = (0..stages).map(|s| sum(&|l| l.to == s)).collect();
    let gradients: Vec<u64> = (0..stages).map(|s| sum(&|l| l.from == s)).collect();
    (0..devices)
        .map(|device| {
            let mut order: Vec<(usize, usize, Pass)> = (device..stages)
                .step_by(devices)
                .flat_map(|s| {
                    let passes = stage_passes(schedule, stages, s, micro)
                        .into_iter()
                        .enumerate();
                    passes.map(move |(i, (at, pass))| (at.unwrap_or(i), s, pass))
                })
                .collect();
            order.sort_by_key(|&(at, s, _)| (at, s));
            let (mut held, mut most) = (vec![0u64; stages], 0u64);
            let kept = |held: &[u64]| -> u64 {
                held.iter()
                    .zip(&values)
                    .map(|(&h, &v)| h.saturating_mul(v))
                    .fold(0u64, u64::saturating_add)
            };
            for (_, s, pass) in order {
                match pass {
                    Pass::Forward(_) => {
                        held[s] += 1;
                        most = most.max(kept(&held));
                    }
                    Pass::Backward(_) => {
                        most = most.max(kept(&held).saturating_add(gradients[s]));
                        held[s] = held[s].saturating_sub(1);
                    }
                }
            }
            most
        })
        .collect()
}

/// Each stage's events over one update: per pass, its start (interleaved), its receives, its
/// sends, its end.
fn events(
    schedule: Schedule,
    stages: usize,
    stage: usize,
    micro: usize,
    links: &[Link],
) -> Vec<Event> {
    let into = |s: usize| links.iter().enumerate().filter(move |(_, l)| l.to == s);
    let out_of = |s: usize| links.iter().enumerate().filter(move |(_, l)| l.from == s);
    let message = |link, micro, gradient| Message {
        link,
        micro,
        gradient,
    };
    let mut events = Vec::new();
    for (position, pass) in stage_passes(schedule, stages, stage, micro) {
        events.extend(position.map(Event::Start));
        match pass {
            Pass::Forward(j) => {
                events.extend(into(stage).map(|(l, _)| Event::Recv(message(l, j, false))));
                events.extend(out_of(stage).map(|(l, _)| Event::Send(message(l, j, false))));
            }
            Pass::Backward(j) => {
                events.extend(out_of(stage).map(|(l, _)| Event::Recv(message(l, j, true))));
                events.extend(into(stage).map(|(l, _)| Event::Send(message(l, j, true))));
            }
        }
        events.extend(position.map(Event::End));
    }
    events
}

/// The most bytes of each device's sends whose receive did not happen before a later send of
/// that device: what the collectives may hold of its messages at once, however the stages'
/// passes interleave. Runs the stages' events in any order their messages and turns allow,
/// keeping a vector clock per stage (each entry: that stage's events known to have happened);
/// a device's stages take turns, so the clock of its stage running a send knows all that its
/// other stages knew. A schedule that cannot finish (none does) counts every send of the
/// devices left.
fn unreceived_send_bytes(
    schedule: Schedule,
    stages: usize,
    micro: usize,
    links: &[Link],
) -> Vec<u64> {
    let devices = schedule_devices(schedule, stages);
    let events: Vec<Vec<Event>> = (0..stages)
        .map(|s| events(schedule, stages, s, micro, links))
        .collect();
    // Where each message is received: its receiver and that one's event index.
    let mut received_at = HashMap::new();
    for (s, list) in events.iter().enumerate() {
        for (i, e) in list.iter().enumerate() {
            if let Event::Recv(m) = e {
                received_at.insert(*m, (s, i));
            }
        }
    }
    let mut clocks = vec![vec![0usize; stages]; stages];
    let mut next = vec![0usize; stages];
    let mut sent: HashMap<Message, Vec<usize>> = HashMap::new();
    let mut ended: HashMap<(usize, usize), Vec<usize>> = HashMap::new();
    // Per device: its sends not known to be taken (receiver, its event index, bytes).
    let mut pending: Vec<Vec<(usize, usize, u64)>> = vec![Vec::new(); devices];
    let mut most = vec![0u64; devices];
    loop {
        let mut moved = false;
        for s in 0..stages {
            let device = s % devices;
            while let Some(&event) = events[s].get(next[s]) {
                let waits_for = match event {
                    Event::Recv(m) => Some(sent.get(&m)),
                    Event::Start(at) if at > 0 => Some(ended.get(&(device, at - 1))),
                    _ => None,
                };
                match waits_for {
                    Some(None) => break,
                    Some(Some(before)) => {
                        for (mine, &theirs) in clocks[s].iter_mut().zip(before) {
                            *mine = (*mine).max(theirs);
                        }
                    }
                    None => {}
                }
                clocks[s][s] += 1;
                next[s] += 1;
                moved = true;
                match event {
                    Event::Send(m) => {
                        sent.insert(m, clocks[s].clone());
                        let (to, at) = received_at.get(&m).copied().unwrap_or((s, usize::MAX));
                        pending[device].push((to, at, links[m.link].bytes));
                        let clock = &clocks[s];
                        pending[device].retain(|&(to, at, _)| at >= clock[to]);
                        let bytes = pending[device].iter().map(|p| p.2).sum::<u64>();
                        most[device] = most[device].max(bytes);
                    }
                    Event::End(at) => {
                        ended.insert((device, at), clocks[s].clone());
                    }
                    Event::Start(_) | Event::Recv(_) => {}
                }
            }
        }
        if !moved {
            break;
        }
    }
    for s in (0..stages).filter(|&s| next[s] < events[s].len()) {
        most[s % devices] = (s % devices..stages)
            .step_by(devices)
            .flat_map(|d| &events[d])
            .filter_map(|e| match e {
                Event::Send(m) => Some(links[m.link].bytes),
                _ => None,
            })
            .sum();
    }
    most
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chain of `stages` stages, one value of `bytes` across each cut.
    fn chain(stages: usize, bytes: u64) -> Vec<Link> {
        (1..stages)
            .map(|to| Link {
                from: to - 1,
                to,
                bytes,
            })
            .collect()
    }

    #[test]
    fn gpipe_may_leave_every_forward_message_untaken() {
        // Stage 0 sends all 4 forwards before it waits for anything: stage 1 may not have
        // taken any; its backward receives a gradient. Stage 1 keeps all 4 received values
        // until its backwards, the first one's received gradient beside them, and may send
        // all 4 gradients back before stage 0 takes one (its forward sends were all taken
        // before its first backward: the last stage's first backward follows its last
        // forward). Stage 2 keeps 4 values and may send 4 gradients.
        let held = held_message_bytes(Schedule::GPipe, 3, 4, &chain(3, 10));
        assert_eq!(held, vec![10 + 40, 40 + 10 + 40, 40 + 40]);
    }

    #[test]
    fn one_f_one_b_holds_what_its_warm_up_sends() {
        // 1F1B over 4 stages and 8 micro-batches: stage s keeps at most 4 − s received
        // micro-batches (stage 0 receives none, only a backward's gradient).
        let links = chain(4, 1);
        let received = received_bytes(Schedule::OneFOneB, 4, 8, &links);
        assert_eq!(received, vec![1, 3 + 1, 2 + 1, 1]);
        // Stage 0 runs 3 forwards, then a 4th, before its first backward waits on stage 1's,
        // which follows stage 1's 3rd forward: 4 sends may be untaken, never more.
        let sent = unreceived_send_bytes(Schedule::OneFOneB, 4, 8, &links);
        assert_eq!(sent[0], 4);
        assert!(sent.iter().all(|&s| s <= 4), "{sent:?}");
        let held = held_message_bytes(Schedule::OneFOneB, 4, 8, &links);
        assert_eq!(
            held,
            received
                .iter()
                .zip(&sent)
                .map(|(r, s)| r + s)
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_single_stage_holds_no_messages() {
        assert_eq!(held_message_bytes(Schedule::OneFOneB, 1, 4, &[]), vec![0]);
    }

    #[test]
    fn interleaved_chunks_are_counted_on_their_device() {
        // 2 devices × 2 chunks (stages 0 and 2 on device 0, 1 and 3 on device 1), 4
        // micro-batches. Device 0's order: stage 0 F0 F1, stage 2 F0 F1, stage 0 F2, stage 2
        // B0 (holding 2 values and receiving a gradient: 3), ...: at most 3 at once, where
        // its stages' own maxima (1 and 2 + 1) add up to 4.
        let links = chain(4, 1);
        let received = received_bytes(Schedule::Interleaved(2), 4, 4, &links);
        assert_eq!(received, vec![3, 4]);
        let sent = unreceived_send_bytes(Schedule::Interleaved(2), 4, 4, &links);
        assert_eq!(sent, vec![4, 4]);
    }
}
