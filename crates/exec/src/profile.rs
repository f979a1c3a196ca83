//! Per-step timings of the last run as a Chrome trace-event file (opens in Perfetto and
//! chrome://tracing): one complete event per step, named by its op, with the kernel, its
//! parameters, the operand types and the source path as arguments.

use std::time::Duration;

use serde_json::{json, Value};

use mslc_artifact::Module;
use mslc_kernels::binding::KernelParam;

/// When one step started (since the run began) and how long it took.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepTime {
    /// Start, relative to the start of the run.
    pub start: Duration,
    /// Duration.
    pub duration: Duration,
}

/// The trace of one run of `module` whose steps took `times` (`None`: not run, hoisted), on
/// `threads` threads.
pub fn chrome_trace(module: &Module, times: &[Option<StepTime>], threads: usize) -> String {
    let types = |vs: &[u32]| -> Vec<String> {
        vs.iter()
            .map(|&v| module.values[v as usize].ty.to_string())
            .collect()
    };
    let mut events: Vec<Value> = vec![json!({
        "name": "process_name", "ph": "M", "pid": 1, "tid": 1,
        "args": { "name": format!("mslc run {} ({threads} threads)", module.name) }
    })];
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
        events.push(json!({
            "name": step.op.name(),
            "cat": step.kernel.name,
            "ph": "X",
            "pid": 1,
            "tid": 1,
            "ts": t.start.as_secs_f64() * 1e6,
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
