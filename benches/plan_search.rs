//! `mode = auto` strategy search for GPT-3 175B (A100) and LLaMA-2 70B (Ascend 910B) on 8 to
//! 4,096 devices: milliseconds the search takes (median of 5), the strategy it picks and its
//! estimated step time. Run: `cargo bench --bench plan_search`.

use std::time::Instant;

use mslc_check::{check_source, CheckOptions};
use mslc_driver::parallel::plan_train;

/// `file`'s text with its parallel declaration reduced to `mode = auto, devices = N`: no mesh,
/// shard rules, pipeline or optimizer level, and `recompute = auto`, so the search chooses all.
fn auto_source(text: &str, devices: i64) -> String {
    let mut out = String::new();
    let mut in_parallel = false;
    for line in text.lines() {
        if line.starts_with("parallel ") {
            in_parallel = true;
            out.push_str(line);
            out.push_str(&format!("\n    mode = auto\n    devices = {devices}\n"));
            continue;
        }
        if in_parallel {
            in_parallel = line != "}";
            if in_parallel {
                continue;
            }
        }
        out.push_str(&line.replace("recompute = full", "recompute = auto"));
        out.push('\n');
    }
    out
}

fn main() {
    println!(
        "{:<16} {:>7} {:>10} {:>10} {:>20} {:>10}",
        "model", "devices", "search ms", "plan ms", "dp×tp×pp, m", "step s"
    );
    for (path, name) in [
        ("examples/gpt3_175b.msl", "GPT-3 175B"),
        ("examples/llama2_70b.msl", "LLaMA-2 70B"),
    ] {
        let text = std::fs::read_to_string(path).expect("run from the repository root");
        for devices in [8, 64, 256, 768, 1000, 1024, 2048, 4096] {
            let source = auto_source(&text, devices);
            let checked = check_source(path, &source, &CheckOptions::default());
            assert!(!checked.has_errors(), "{:?}", checked.diagnostics);
            let mut search = Vec::new();
            let mut total = Vec::new();
            let mut last = None;
            for _ in 0..5 {
                let t = Instant::now();
                let plan = plan_train(&checked, &checked.decls.trains[0]);
                total.push(t.elapsed().as_secs_f64() * 1e3);
                if let Ok(Some(p)) = &plan {
                    search.push(p.search.seconds * 1e3);
                }
                last = Some(plan);
            }
            let median = |mut xs: Vec<f64>| {
                xs.sort_by(f64::total_cmp);
                xs.get(xs.len() / 2).copied().unwrap_or(f64::NAN)
            };
            let (strategy, step) = match last {
                Some(Ok(Some(p))) => (
                    format!(
                        "{}×{}×{}, {}",
                        p.mesh["dp"], p.mesh["tp"], p.mesh["pp"], p.micro_batches
                    ),
                    format!("{:.2}", p.step_time_s),
                ),
                Some(Err(d)) => (d.code.to_string(), "-".to_string()),
                _ => ("-".to_string(), "-".to_string()),
            };
            println!(
                "{name:<16} {devices:>7} {:>10.1} {:>10.1} {strategy:>20} {step:>10}",
                median(search),
                median(total)
            );
        }
    }
}
