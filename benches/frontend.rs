//! How long `mslc check` takes on the 70B LLaMA example, and how it grows with the layer count
//! (it should grow linearly). Run: `cargo bench --bench frontend`.

use std::path::Path;
use std::time::Instant;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use mslc_check::{check_source, CheckOptions, Overrides};

fn options(layers: u32) -> CheckOptions {
    let mut overrides = Overrides::default();
    overrides
        .sets
        .insert("layers".to_string(), layers.to_string());
    CheckOptions {
        overrides,
        ..CheckOptions::default()
    }
}

fn check_70b(c: &mut Criterion) {
    let path = Path::new("examples/llama2_70b.msl");
    let text = std::fs::read_to_string(path).expect("examples/llama2_70b.msl");
    let mut group = c.benchmark_group("check llama2_70b");
    for layers in [10u32, 20, 40, 80] {
        let opts = options(layers);
        let checked = check_source("examples/llama2_70b.msl", &text, &opts);
        assert!(!checked.has_errors(), "the example must check clean");
        group.bench_with_input(BenchmarkId::from_parameter(layers), &opts, |b, opts| {
            b.iter(|| check_source("examples/llama2_70b.msl", &text, opts))
        });
    }
    group.finish();
    let start = Instant::now();
    let runs = 20;
    for _ in 0..runs {
        check_source("examples/llama2_70b.msl", &text, &options(80));
    }
    let per_run = start.elapsed().as_secs_f64() * 1e3 / f64::from(runs);
    println!("check llama2_70b, 80 layers: {per_run:.2} ms per check (target: well under 50 ms)");
}

criterion_group!(benches, check_70b);
criterion_main!(benches);
