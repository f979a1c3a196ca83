//! `mslc build` on LLaMA-2 70B: milliseconds per stage and in total at 10, 20, 40 and 80
//! layers (the time should grow linearly). Run: `cargo bench --bench build`.

use std::time::Instant;

use mslc_artifact::encode;
use mslc_check::{check_source, CheckOptions, Overrides};
use mslc_driver::compile::compile;
use mslc_driver::select::{compile_options, Selection};
use mslc_plan::kernels::KernelTable;

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    let text =
        std::fs::read_to_string("examples/llama2_70b.msl").expect("run from the repository root");
    println!(
        "{:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "layers", "check", "lower", "passes", "schedule", "memory", "encode", "total"
    );
    for layers in [10, 20, 40, 80] {
        let mut overrides = Overrides::default();
        overrides.sets.insert("layers".into(), layers.to_string());
        let opts = CheckOptions {
            overrides,
            ..CheckOptions::default()
        };
        let mut rows: Vec<[f64; 7]> = Vec::new();
        for _ in 0..15 {
            let t = Instant::now();
            let checked = check_source("examples/llama2_70b.msl", &text, &opts);
            let check = t.elapsed().as_secs_f64() * 1e3;
            assert!(!checked.has_errors());
            let selection = Selection {
                target: Some("ascend910b"),
                fuse: true,
                ..Selection::default()
            };
            let options = compile_options(&checked, &checked.models[0], selection)
                .expect("std.targets declares ascend910b");
            let compiled = compile(&checked.models[0], &options).unwrap();
            let t = Instant::now();
            let bytes = encode(&compiled.module, None);
            let toml = KernelTable::of(&compiled.module).to_toml();
            let encode_ms = t.elapsed().as_secs_f64() * 1e3;
            assert!(!bytes.is_empty() && !toml.is_empty());
            let s = &compiled.times;
            let total = check + s.lower_ms + s.passes_ms + s.schedule_ms + s.memory_ms + encode_ms;
            rows.push([
                check,
                s.lower_ms,
                s.passes_ms,
                s.schedule_ms,
                s.memory_ms,
                encode_ms,
                total,
            ]);
        }
        let col = |i: usize| median(rows.iter().map(|r| r[i]).collect());
        println!(
            "{layers:>6} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2}",
            col(0),
            col(1),
            col(2),
            col(3),
            col(4),
            col(5),
            col(6)
        );
    }
    println!("(milliseconds, median of 15; target: 80 layers within 200 ms)");
}
