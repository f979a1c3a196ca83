//! The memory plan as a picture (`mslc build --emit memory-svg`, `NAME.memory.svg`): schedule
//! steps run left to right, byte offsets top to bottom, one rectangle per buffer over the steps
//! it holds a value. Parameters and inputs, the hoisted region and the arena are separate
//! panels, each drawn to its own scale; the arena's lower bound is a dashed line. A hoisted
//! value kept for the whole run (a bf16 copy of a tied embedding) shows as a bar from its step
//! to the right edge.

use std::fmt::Write;

use mslc_core::units::human_bytes;

use super::memory::{MemoryPlan, PlannedBuffer};

/// Width of the plotting area, in pixels.
const PLOT_WIDTH: f64 = 1000.0;
/// Left margin (the offset axis labels) and right margin.
const LEFT: f64 = 90.0;
const RIGHT: f64 = 20.0;
/// Height of the arena panel and of the hoisted panel; of the parameter and input bars.
const ARENA_HEIGHT: f64 = 320.0;
const HOISTED_HEIGHT: f64 = 160.0;
const BAR_HEIGHT: f64 = 18.0;

/// The SVG of `plan` for a module of `steps` steps named `name`.
pub fn memory_svg(plan: &MemoryPlan, steps: usize, name: &str) -> String {
    let steps = steps.max(1);
    let mut body = String::new();
    let mut y = 50.0;
    let title = format!(
        "{name}: {} in all; arena {} (lower bound {}), hoisted {}, parameters {}, inputs {}, next values {}",
        human_bytes(plan.total_bytes),
        human_bytes(plan.arena_bytes),
        human_bytes(plan.lower_bound_bytes),
        human_bytes(plan.hoisted_bytes),
        human_bytes(plan.params_bytes),
        human_bytes(plan.inputs_bytes),
        human_bytes(plan.next_bytes),
    );
    let _ = writeln!(
        body,
        r#"<text x="{LEFT}" y="24" class="title">{}</text>"#,
        escape(&title)
    );
    for (label, bytes, class) in [
        ("parameters and buffers", plan.params_bytes, "params"),
        ("inputs", plan.inputs_bytes, "inputs"),
    ] {
        let _ = writeln!(
            body,
            r#"<rect class="{class}" x="{LEFT}" y="{y}" width="{PLOT_WIDTH}" height="{BAR_HEIGHT}"><title>{label}: {}, held for every step</title></rect>"#,
            escape(&human_bytes(bytes))
        );
        let _ = writeln!(
            body,
            r#"<text x="{}" y="{}" class="bar">{label}: {}</text>"#,
            LEFT + 6.0,
            y + 13.0,
            escape(&human_bytes(bytes))
        );
        y += BAR_HEIGHT + 8.0;
    }
    y += 24.0;
    if !plan.hoisted.is_empty() {
        let region = Panel {
            top: y,
            height: HOISTED_HEIGHT,
            bytes: plan.hoisted_bytes,
            steps,
        };
        region.frame(
            &mut body,
            "hoisted parameter-only values (computed once, kept to the end)",
        );
        for b in &plan.hoisted {
            region.buffer(&mut body, b, steps - 1, "hoisted");
        }
        y += HOISTED_HEIGHT + 48.0;
    }
    let arena = Panel {
        top: y,
        height: ARENA_HEIGHT,
        bytes: plan.arena_bytes.max(plan.lower_bound_bytes),
        steps,
    };
    arena.frame(&mut body, "arena (intermediates)");
    for b in &plan.buffers {
        arena.buffer(&mut body, b, b.last, "buffer");
    }
    let bound = arena.y(plan.lower_bound_bytes);
    let _ = writeln!(
        body,
        r#"<line class="lower-bound" x1="{LEFT}" y1="{bound:.2}" x2="{}" y2="{bound:.2}"><title>lower bound: {} live at once at the busiest step</title></line>"#,
        LEFT + PLOT_WIDTH,
        escape(&human_bytes(plan.lower_bound_bytes))
    );
    y += ARENA_HEIGHT + 24.0;
    let _ = writeln!(
        body,
        r#"<text x="{LEFT}" y="{y}" class="axis">schedule step 0 … {} →</text>"#,
        steps - 1
    );
    let width = LEFT + PLOT_WIDTH + RIGHT;
    let height = y + 16.0;
    format!(
        r#"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="monospace" font-size="11">
<style>
.title {{ font-size: 13px; font-weight: bold; }}
.params {{ fill: #c7d7ee; stroke: #5577aa; }}
.inputs {{ fill: #d9ead3; stroke: #6a9955; }}
.frame {{ fill: none; stroke: #888; }}
.buffer, .hoisted {{ stroke: #333; stroke-width: 0.3; }}
.lower-bound {{ stroke: #c00; stroke-width: 1.5; stroke-dasharray: 6 4; }}
</style>
{body}</svg>
"#
    )
}

/// A panel: a region of `bytes` drawn `height` pixels tall from `top`, over `steps` steps.
struct Panel {
    top: f64,
    height: f64,
    bytes: u64,
    steps: usize,
}

impl Panel {
    /// The y coordinate of byte offset `offset`.
    fn y(&self, offset: u64) -> f64 {
        self.top + self.height * offset as f64 / self.bytes.max(1) as f64
    }

    /// The x coordinate of the start of step `step`.
    fn x(&self, step: usize) -> f64 {
        LEFT + PLOT_WIDTH * step as f64 / self.steps as f64
    }

    /// The panel's outline, heading and size labels.
    fn frame(&self, out: &mut String, heading: &str) {
        let _ = writeln!(
            out,
            r#"<text x="{LEFT}" y="{}">{} — {}</text>"#,
            self.top - 6.0,
            escape(heading),
            escape(&human_bytes(self.bytes))
        );
        let _ = writeln!(
            out,
            r#"<rect class="frame" x="{LEFT}" y="{}" width="{PLOT_WIDTH}" height="{}"/>"#,
            self.top, self.height
        );
        for (offset, anchor) in [(0, self.top + 10.0), (self.bytes, self.top + self.height)] {
            let _ = writeln!(
                out,
                r#"<text x="{}" y="{anchor}" text-anchor="end">{}</text>"#,
                LEFT - 4.0,
                escape(&human_bytes(offset))
            );
        }
    }

    /// One buffer, from its first step to `last` (inclusive), at its offset.
    fn buffer(&self, out: &mut String, b: &PlannedBuffer, last: usize, class: &str) {
        let (x0, x1) = (self.x(b.first), self.x(last.max(b.first) + 1));
        let (y0, y1) = (self.y(b.offset), self.y(b.offset.saturating_add(b.bytes)));
        let op = b.op.split(' ').next().unwrap_or_default();
        let hue = op
            .bytes()
            .fold(7u32, |h, c| h.wrapping_mul(31).wrapping_add(c.into()))
            % 360;
        let _ = writeln!(
            out,
            r#"<rect class="{class}" x="{x0:.2}" y="{y0:.2}" width="{:.2}" height="{:.2}" fill="hsl({hue},55%,70%)"><title>{} {}: {} at offset {}, steps {}..={last}</title></rect>"#,
            (x1 - x0).max(0.5),
            (y1 - y0).max(0.5),
            escape(&b.name),
            escape(&b.op),
            escape(&human_bytes(b.bytes)),
            b.offset,
            b.first
        );
    }
}

/// `text` with XML's special characters escaped.
pub(crate) fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
