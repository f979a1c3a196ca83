//! The per-device plan as a picture (`mslc build --emit plan-svg`, `TRAIN.plan.svg`): on the
//! left one stacked bar per pipeline stage (the worst rank of its device group) — parameters,
//! gradients, optimizer states, activations, communication buffers, workspace, fragmentation
//! reserve — against the budget line; on the right the pipeline schedule, one row per stage
//! and time left to right, forwards and backwards as boxes on an idle (bubble) background.
//! Every part is labelled where it is drawn.

use std::fmt::Write;

use mslc_core::units::human_bytes;

use super::{PlanFile, Schedule};
use crate::memory_svg::escape;

/// The memory parts, their CSS class, label and colour.
const PARTS: [(&str, &str, &str); 7] = [
    ("parameters", "parameters", "#4e79a7"),
    ("gradients", "gradients", "#f28e2b"),
    ("optimizer_states", "optimizer states", "#e15759"),
    ("activations", "activations", "#76b7b2"),
    ("communication", "communication", "#59a14f"),
    ("workspace", "workspace", "#edc948"),
    ("fragmentation", "fragmentation reserve", "#bab0ac"),
];
const BAR_WIDTH: f64 = 28.0;
const BAR_GAP: f64 = 10.0;
const BARS_HEIGHT: f64 = 360.0;
const TOP: f64 = 60.0;
const LEFT: f64 = 90.0;
const SCHEDULE_WIDTH: f64 = 900.0;
const ROW: f64 = 18.0;

/// One box of the schedule: the stage, forward or backward, micro-batch, chunk, start, end.
#[derive(Clone, Debug, PartialEq)]
pub struct Slot {
    /// Pipeline stage (device group).
    pub stage: usize,
    /// Forward (else backward).
    pub forward: bool,
    /// Micro-batch.
    pub micro_batch: usize,
    /// Model chunk (0 unless interleaved).
    pub chunk: usize,
    /// Start and end, in seconds from the step's start.
    pub start: f64,
    /// End.
    pub end: f64,
}

/// The order a stage runs its forwards and backwards in: (forward, micro-batch, chunk).
/// GPipe: every forward, then every backward. 1F1B: `p − s − 1` warm-up forwards, then one
/// forward and one backward in turn, then the remaining backwards. Interleaved: Megatron-LM's
/// order over virtual micro-batches (`p` micro-batches per chunk in turn), with
/// `(p − s − 1)·2 + (v − 1)·p` warm-up forwards.
fn order(schedule: Schedule, p: usize, s: usize, m: usize) -> Vec<(bool, usize, usize)> {
    let v = schedule.chunks() as usize;
    let total = m * v;
    // Virtual micro-batch k → (micro-batch, chunk); backwards visit chunks last first.
    let at = |k: usize, forward: bool| {
        let chunk = (k / p) % v;
        let mb = (k / (p * v)) * p + k % p;
        (mb, if forward { chunk } else { v - 1 - chunk })
    };
    let warmup = match schedule {
        Schedule::GPipe => total,
        Schedule::OneFOneB => (p - s - 1).min(total),
        Schedule::Interleaved(_) => ((p - s - 1) * 2 + (v - 1) * p).min(total),
    };
    let mut out = Vec::with_capacity(2 * total);
    let (mut f, mut b) = (0, 0);
    while f < warmup {
        let (mb, c) = at(f, true);
        out.push((true, mb, c));
        f += 1;
    }
    while f < total {
        let (mb, c) = at(f, true);
        out.push((true, mb, c));
        f += 1;
        let (mb, c) = at(b, false);
        out.push((false, mb, c));
        b += 1;
    }
    while b < total {
        let (mb, c) = at(b, false);
        out.push((false, mb, c));
        b += 1;
    }
    // Micro-batches beyond `m` (interleaving with m not a multiple of p, which the planner
    // refuses) are left out rather than indexed.
    out.retain(|&(_, mb, _)| mb < m);
    out
}

/// Simulates the schedule of `plan`: each stage runs its boxes in [`order`], each box starting
/// when its stage is free and its input has arrived (the forward of the previous chunk-stage,
/// the backward of the next, or its own forward at the last). A forward takes a third of the
/// stage's micro-batch time over its chunks, a backward two thirds.
pub fn simulate(plan: &PlanFile) -> Vec<Slot> {
    let p = plan.per_device.len().max(1);
    let m = plan.micro_batches.max(1) as usize;
    let v = plan.schedule.chunks() as usize;
    let time: Vec<f64> = plan
        .per_device
        .iter()
        .map(|g| g.seconds_per_micro_batch / v as f64)
        .collect();
    let orders: Vec<Vec<(bool, usize, usize)>> =
        (0..p).map(|s| order(plan.schedule, p, s, m)).collect();
    // done[forward][virtual stage c·p + s][mb]: when it ended.
    let vs = p * v;
    let mut done = [vec![vec![f64::NAN; m]; vs], vec![vec![f64::NAN; m]; vs]];
    let mut next = vec![0usize; p];
    let mut free = vec![0.0f64; p];
    let mut slots = Vec::with_capacity(2 * m * v * p);
    // Sweep until every stage has run its list; a stage waits while its next box's input is
    // not ready. Each sweep runs at least one box (the schedules are deadlock-free).
    while (0..p).any(|s| next[s] < orders[s].len()) {
        let mut progressed = false;
        for s in 0..p {
            while next[s] < orders[s].len() {
                let (forward, mb, c) = orders[s][next[s]];
                let here = c * p + s;
                let ready = if forward {
                    if here == 0 {
                        0.0
                    } else {
                        done[1][here - 1][mb]
                    }
                } else if here + 1 == vs {
                    done[1][here][mb]
                } else {
                    done[0][here + 1][mb]
                };
                if ready.is_nan() {
                    break;
                }
                let t = time.get(s).copied().unwrap_or(0.0)
                    * if forward { 1.0 / 3.0 } else { 2.0 / 3.0 };
                let start = free[s].max(ready);
                let end = start + t;
                done[usize::from(forward)][here][mb] = end;
                free[s] = end;
                slots.push(Slot {
                    stage: s,
                    forward,
                    micro_batch: mb,
                    chunk: c,
                    start,
                    end,
                });
                next[s] += 1;
                progressed = true;
            }
        }
        if !progressed {
            break;
        }
    }
    slots
}

/// The SVG of `plan` for train `train`.
pub fn plan_svg(plan: &PlanFile, train: &str) -> String {
    let mut body = String::new();
    let title = format!(
        "{train}: {} devices, {}, {} micro-batches ({}), ~{:.3} s per step, bubble {:.1} %",
        plan.devices,
        plan.degrees_text(),
        plan.micro_batches,
        plan.schedule.name(),
        plan.step_time_s,
        plan.bubble_fraction * 100.0
    );
    let _ = writeln!(
        body,
        r#"<text x="{LEFT}" y="24" class="title">{}</text>"#,
        escape(&title)
    );
    // Memory bars.
    let groups = &plan.per_device;
    let top_bytes = groups
        .iter()
        .map(|g| g.memory.total)
        .chain([plan.max_device_memory])
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let scale = BARS_HEIGHT / top_bytes;
    let base = TOP + BARS_HEIGHT;
    let _ = writeln!(
        body,
        r#"<text x="{LEFT}" y="{}" class="heading">memory per rank, worst rank of each stage</text>"#,
        TOP - 12.0
    );
    for (i, g) in groups.iter().enumerate() {
        let x = LEFT + i as f64 * (BAR_WIDTH + BAR_GAP);
        let mut y = base;
        let m = &g.memory;
        for ((class, label, _), (_, bytes)) in PARTS.iter().zip(m.rows()) {
            let h = bytes as f64 * scale;
            y -= h;
            let _ = writeln!(
                body,
                r#"<rect class="mem {class}" x="{x:.1}" y="{y:.2}" width="{BAR_WIDTH}" height="{h:.2}"><title>stage {} ({}): {label} {}</title></rect>"#,
                g.stage,
                g.ranks_text(),
                escape(&human_bytes(bytes))
            );
        }
        let _ = writeln!(
            body,
            r#"<text x="{:.1}" y="{:.1}" class="axis" text-anchor="middle">stage {}</text>"#,
            x + BAR_WIDTH / 2.0,
            base + 14.0,
            g.stage
        );
        let _ = writeln!(
            body,
            r#"<text x="{:.1}" y="{:.1}" class="axis" text-anchor="middle">{}</text>"#,
            x + BAR_WIDTH / 2.0,
            y - 4.0,
            escape(&human_bytes(m.total))
        );
    }
    let bars_right = LEFT + groups.len() as f64 * (BAR_WIDTH + BAR_GAP);
    let budget_y = base - plan.max_device_memory as f64 * scale;
    let _ = writeln!(
        body,
        r#"<line class="budget" x1="{}" y1="{budget_y:.2}" x2="{bars_right:.1}" y2="{budget_y:.2}"/>"#,
        LEFT - 10.0
    );
    let _ = writeln!(
        body,
        r#"<text x="{}" y="{:.2}" class="axis" text-anchor="end">budget {}</text>"#,
        LEFT - 12.0,
        budget_y + 4.0,
        escape(&human_bytes(plan.max_device_memory))
    );
    // The parts' names beside the bars, in stacking order (bottom first).
    for (k, (class, label, _)) in PARTS.iter().enumerate() {
        let y = base - k as f64 * 16.0;
        let _ = writeln!(
            body,
            r#"<rect class="mem {class}" x="{:.1}" y="{:.1}" width="10" height="10"/><text x="{:.1}" y="{:.1}" class="axis">{label}</text>"#,
            bars_right + 6.0,
            y - 10.0,
            bars_right + 20.0,
            y
        );
    }
    // The schedule.
    let slots = simulate(plan);
    let end = slots.iter().map(|s| s.end).fold(0.0, f64::max).max(1e-12);
    let sx = LEFT;
    let sy = base + 60.0;
    let p = groups.len().max(1);
    let _ = writeln!(
        body,
        r#"<text x="{sx}" y="{:.1}" class="heading">pipeline schedule, one micro-batch step ({:.3} s of compute and communication; blue forward, green backward, grey idle = bubble)</text>"#,
        sy - 12.0,
        end
    );
    for s in 0..p {
        let y = sy + s as f64 * ROW;
        let _ = writeln!(
            body,
            r#"<rect class="idle" x="{sx}" y="{y:.1}" width="{SCHEDULE_WIDTH}" height="{:.1}"><title>stage {s} idle (bubble)</title></rect><text x="{:.1}" y="{:.1}" class="axis" text-anchor="end">stage {s}</text>"#,
            ROW - 2.0,
            sx - 4.0,
            y + ROW - 6.0
        );
    }
    for slot in &slots {
        let x = sx + slot.start / end * SCHEDULE_WIDTH;
        let w = ((slot.end - slot.start) / end * SCHEDULE_WIDTH).max(0.2);
        let y = sy + slot.stage as f64 * ROW;
        let (class, word) = if slot.forward {
            ("forward", "forward")
        } else {
            ("backward", "backward")
        };
        let _ = writeln!(
            body,
            r#"<rect class="{class}" x="{x:.2}" y="{y:.1}" width="{w:.2}" height="{:.1}"><title>stage {}: {word} of micro-batch {}, chunk {}</title></rect>"#,
            ROW - 2.0,
            slot.stage,
            slot.micro_batch,
            slot.chunk
        );
    }
    let height = sy + p as f64 * ROW + 30.0;
    let width = (LEFT + SCHEDULE_WIDTH + 40.0).max(bars_right + 180.0);
    let mut style = String::from(
        "text { font-family: sans-serif; font-size: 11px; } .title { font-size: 14px; } .heading { font-size: 12px; font-weight: bold; } .budget { stroke: #d62728; stroke-width: 2; stroke-dasharray: 6 3; } .idle { fill: #e5e5e5; } .forward { fill: #4e79a7; } .backward { fill: #59a14f; }",
    );
    for (class, _, colour) in PARTS {
        let _ = write!(style, " .mem.{class} {{ fill: {colour}; }}");
    }
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" viewBox=\"0 0 {width:.0} {height:.0}\">\n<style>{style}</style>\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n{body}</svg>\n"
    )
}
