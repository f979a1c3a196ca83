//! All-reduce bandwidth of the threads backend of the collectives (what `--ranks N` uses)
//! against a memcpy of the same buffer on this machine: per size, the median time of an
//! all-reduce over 2 ranks (threads), its algorithm bandwidth (bytes / time) and bus bandwidth
//! (× 2(n−1)/n, NCCL's convention for what each rank moves), and the memcpy's bandwidth. One
//! line per size, then `JSON {…}` for scripts (scripts/bench_ranks.py).
//!
//! Run: `cargo bench -p mslc-exec --bench collectives` (optionally `-- RANKS`, default 2).

use std::hint::black_box;
use std::time::Instant;

use mslc_exec::collectives::threads::world;
use mslc_exec::collectives::{Collectives, Mesh};

/// Sizes from 1 to 64 MiB.
const MIB: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];

/// Repetitions timed per size (the median is reported), after one warm-up.
fn reps(bytes: usize) -> usize {
    (256 << 20) / bytes.max(1)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median seconds of one all-reduce of `bytes` over `ranks` threads, timed on rank 0.
fn all_reduce_seconds(ranks: usize, bytes: usize) -> f64 {
    let n = bytes / 4;
    let reps = reps(bytes).clamp(5, 200);
    let comms = world(Mesh::line("dp", ranks).expect("a mesh"));
    std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|mut comm| {
                scope.spawn(move || {
                    let mut data = vec![1.0f32; n];
                    let mut times = Vec::new();
                    for i in 0..=reps {
                        let start = Instant::now();
                        comm.all_reduce(0, &mut data).expect("all_reduce");
                        if i > 0 {
                            times.push(start.elapsed().as_secs_f64());
                        }
                        data.fill(1.0);
                    }
                    (comm.rank(), median(times))
                })
            })
            .collect();
        let results: Vec<(usize, f64)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        results
            .into_iter()
            .find(|(r, _)| *r == 0)
            .map_or(f64::NAN, |(_, t)| t)
    })
}

/// Median seconds of one memcpy of `bytes`.
fn memcpy_seconds(bytes: usize) -> f64 {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    let times = (0..=reps(bytes).clamp(5, 200))
        .map(|_| {
            let start = Instant::now();
            dst.copy_from_slice(black_box(&src));
            black_box(&mut dst);
            start.elapsed().as_secs_f64()
        })
        .skip(1)
        .collect();
    median(times)
}

fn main() {
    let ranks: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(2);
    let mut rows = Vec::new();
    println!("all-reduce over {ranks} ranks (threads backend) against memcpy, f32 buffers");
    for mib in MIB {
        let bytes = mib << 20;
        let t = all_reduce_seconds(ranks, bytes);
        let copy = memcpy_seconds(bytes);
        let algo = bytes as f64 / t / 1e9;
        let bus = algo * 2.0 * (ranks - 1) as f64 / ranks as f64;
        let memcpy = bytes as f64 / copy / 1e9;
        println!(
            "{mib:>3} MiB: all-reduce {:8.3} ms, {algo:6.2} GB/s algorithm, {bus:6.2} GB/s bus; \
             memcpy {:7.3} ms, {memcpy:6.2} GB/s; all-reduce / memcpy {:.3}",
            t * 1e3,
            copy * 1e3,
            algo / memcpy
        );
        rows.push(format!(
            "{{\"mib\": {mib}, \"all_reduce_s\": {t}, \"algo_gbps\": {algo}, \"bus_gbps\": {bus}, \"memcpy_s\": {copy}, \"memcpy_gbps\": {memcpy}}}"
        ));
    }
    println!(
        "JSON {{\"ranks\": {ranks}, \"sizes\": [{}]}}",
        rows.join(", ")
    );
}
