//! Per-step timings of the last run as a Chrome trace-event file (opens in Perfetto and
//! chrome://tracing): one named track per pool thread; on the thread that runs the steps, one
//! complete event per step named by its op and source path (`matmul model.layers.3.mlp.up_proj`)
//! with the kernel, its parameters and the operand types as arguments; on every other thread,
//! the time it spent in that step's parallel tasks; on a track of its own, the all-reduces that
//! ran on the communication thread beside the steps after them; and a counter track of the
//! arena bytes in use (and the hoisted region) over the run.

use std::time::Duration;

use serde_json::{json, Value};

use mslc_artifact::{Module, Storage};
use mslc_kernels::binding::KernelParam;

/// When one step started (since the run began) and how long it took.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepTime {
    /// Start, relative to the start of the run.
    pub start: Duration,
    /// Duration.
    pub duration: Duration,
    /// Whether it ran on the communication thread, overlapping the steps after it (an
    /// all-reduce the run did not wait for), rather than on the thread that runs the steps.
    pub overlapped: bool,
}

/// What each pool thread did during one run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorkerTimes {
    /// The pool thread that ran the steps one after another.
    pub loop_worker: usize,
    /// Per step, nanoseconds each pool thread spent in that step's parallel tasks.
    pub busy: Vec<Vec<u64>>,
}

/// The trace of one run of `module` whose steps took `times` (`None`: not run, hoisted), on
/// `threads` threads, with what each thread did when `workers` was recorded.
pub fn chrome_trace(
    module: &Module,
    times: &[Option<StepTime>],
    workers: Option<&WorkerTimes>,
    threads: usize,
) -> String {
    let types = |vs: &[u32]| -> Vec<String> {
        vs.iter()
            .map(|&v| module.values[v as usize].ty.to_string())
            .collect()
    };
    let loop_worker = workers.map_or(0, |w| w.loop_worker);
    let mut events: Vec<Value> = vec![json!({
        "name": "process_name", "ph": "M", "pid": 1, "tid": 0,
        "args": { "name": format!("mslc run {} ({threads} threads)", module.name) }
    })];
    for worker in 0..threads {
        let role = if worker == loop_worker {
            "runs the steps"
        } else {
            "parallel tasks"
        };
        events.push(json!({
            "name": "thread_name", "ph": "M", "pid": 1, "tid": tid(worker),
            "args": { "name": format!("pool thread {worker} ({role})") }
        }));
        events.push(json!({
            "name": "thread_sort_index", "ph": "M", "pid": 1, "tid": tid(worker),
            "args": { "sort_index": worker }
        }));
    }
    if times.iter().flatten().any(|t| t.overlapped) {
        events.push(json!({
            "name": "thread_name", "ph": "M", "pid": 1, "tid": tid(threads),
            "args": { "name": "communication (all-reduces overlapping the steps)" }
        }));
        events.push(json!({
            "name": "thread_sort_index", "ph": "M", "pid": 1, "tid": tid(threads),
            "args": { "sort_index": threads }
        }));
    }
    let in_use = arena_in_use(module);
    for (i, (step, t)) in module.steps.iter().zip(times).enumerate() {
        let Some(t) = t else {
            continue;
        };
        let params: serde_json::Map<String, Value> = step
            .kernel
            .params
            .iter()
            .map(|(k, v)| {
                let v = match v {
                    KernelParam::Int(i) => json!(i),
                    KernelParam::Text(s) => json!(s),
                };
                (k.clone(), v)
            })
            .collect();
        let name = if step.origin.is_empty() {
            step.op.name().to_string()
        } else {
            format!("{} {}", step.op.name(), step.origin)
        };
        let ts = t.start.as_secs_f64() * 1e6;
        events.push(json!({
            "name": "memory", "ph": "C", "pid": 1, "tid": tid(loop_worker), "ts": ts,
            "args": { "arena in use (bytes)": in_use[i], "hoisted (bytes)": module.hoisted_bytes }
        }));
        for (worker, &nanos) in workers
            .and_then(|w| w.busy.get(i))
            .into_iter()
            .flatten()
            .enumerate()
        {
            if worker == loop_worker || nanos == 0 {
                continue;
            }
            let dur = (nanos as f64 / 1e3).min(t.duration.as_secs_f64() * 1e6);
            events.push(json!({
                "name": name, "cat": "parallel tasks", "ph": "X", "pid": 1,
                "tid": tid(worker), "ts": ts, "dur": dur,
                "args": { "step": i, "busy_us": nanos as f64 / 1e3 }
            }));
        }
        events.push(json!({
            "name": name,
            "cat": step.kernel.name,
            "ph": "X",
            "pid": 1,
            "tid": tid(if t.overlapped { threads } else { loop_worker }),
            "ts": ts,
            "dur": t.duration.as_secs_f64() * 1e6,
            "args": {
                "step": i,
                "kernel": step.kernel.name,
                "params": params,
                "inputs": types(&step.inputs),
                "outputs": types(&step.outputs),
                "origin": step.origin,
            }
        }));
    }
    let trace = json!({ "traceEvents": events, "displayTimeUnit": "ms" });
    serde_json::to_string_pretty(&trace).unwrap_or_default()
}

/// The trace's thread id of pool thread `worker` (ids start at 1; 0 is the process).
fn tid(worker: usize) -> usize {
    worker + 1
}

/// Arena bytes holding a live value during each step: the union of the byte ranges of the
/// arena values written at or before the step and read at or after it (outputs live to the
/// end); values sharing bytes in place count once.
fn arena_in_use(module: &Module) -> Vec<u64> {
    let n = module.steps.len();
    let mut span: Vec<Option<(usize, usize)>> = vec![None; module.values.len()];
    for (s, step) in module.steps.iter().enumerate() {
        for &v in &step.outputs {
            span[v as usize] = Some((s, s));
        }
        for &v in &step.inputs {
            if let Some((_, last)) = span[v as usize].as_mut() {
                *last = s;
            }
        }
    }
    for &(_, v) in &module.outputs {
        if let Some((_, last)) = span[v as usize].as_mut() {
            *last = n.saturating_sub(1);
        }
    }
    let ranges: Vec<(usize, usize, u64, u64)> = module
        .values
        .iter()
        .zip(&span)
        .filter_map(|(value, span)| match (&value.storage, span) {
            (Storage::Arena { offset }, Some((first, last))) => {
                Some((*first, *last, *offset, offset + value.ty.bytes()))
            }
            _ => None,
        })
        .collect();
    (0..n)
        .map(|s| {
            let mut live: Vec<(u64, u64)> = ranges
                .iter()
                .filter(|r| r.0 <= s && s <= r.1)
                .map(|r| (r.2, r.3))
                .collect();
            live.sort_unstable();
            let (mut total, mut end) = (0, 0);
            for (start, stop) in live {
                let start = start.max(end);
                if stop > start {
                    total += stop - start;
                    end = stop;
                }
            }
            total
        })
        .collect()
}
