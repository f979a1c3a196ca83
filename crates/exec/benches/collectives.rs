//! All-reduce bandwidth of the collectives against a memcpy of the same buffer on this
//! machine: per size, the median time of an all-reduce over 2 ranks, its algorithm bandwidth
//! (bytes / time) and bus bandwidth (× 2(n−1)/n, NCCL's convention for what each rank moves),
//! and the memcpy's bandwidth. The ranks are threads (the threads backend, what `--ranks N`
//! uses), or with `--mpi` processes under `mpiexec` (the MPI backend, cargo feature `mpi`: the
//! bench starts itself under `mpiexec -n RANKS`). One line per size, then `JSON {…}` for
//! scripts (scripts/bench_ranks.py).
//!
//! Run: `cargo bench -p mslc-exec --bench collectives` (optionally `-- RANKS`, default 2), or
//! `cargo bench -p mslc-exec --features mpi --bench collectives -- --mpi`.

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

/// Median seconds of one all-reduce of `bytes` by `comm`.
fn time_all_reduce(comm: &mut dyn Collectives, bytes: usize) -> f64 {
    let mut data = vec![1.0f32; bytes / 4];
    let mut times = Vec::new();
    for i in 0..=reps(bytes).clamp(5, 200) {
        let start = Instant::now();
        comm.all_reduce(0, &mut data).expect("all_reduce");
        if i > 0 {
            times.push(start.elapsed().as_secs_f64());
        }
        data.fill(1.0);
    }
    median(times)
}

/// Median seconds of one all-reduce of `bytes` over `ranks` threads, timed on rank 0.
fn all_reduce_seconds(ranks: usize, bytes: usize) -> f64 {
    let comms = world(Mesh::line("dp", ranks).expect("a mesh"));
    std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|mut comm| scope.spawn(move || (comm.rank(), time_all_reduce(&mut comm, bytes))))
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

/// Set in the processes the `--mpi` bench starts under mpiexec: the world size.
#[cfg(feature = "mpi")]
const MPI_CHILD: &str = "MSLC_BENCH_MPI_RANKS";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let ranks: usize = args.iter().find_map(|a| a.parse().ok()).unwrap_or(2);
    #[cfg(feature = "mpi")]
    if let Ok(ranks) = std::env::var(MPI_CHILD) {
        return mpi_child(ranks.parse().expect("a rank count"));
    }
    if args.iter().any(|a| a == "--mpi") {
        return start_mpi(ranks);
    }
    report(ranks, "threads backend", |bytes| {
        all_reduce_seconds(ranks, bytes)
    });
}

/// Prints the figures of each size, the all-reduce timed by `all_reduce` over `ranks` ranks
/// of `backend`.
fn report(ranks: usize, backend: &str, mut all_reduce: impl FnMut(usize) -> f64) {
    let mut rows = Vec::new();
    println!("all-reduce over {ranks} ranks ({backend}) against memcpy, f32 buffers");
    for mib in MIB {
        let bytes = mib << 20;
        let t = all_reduce(bytes);
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
        "JSON {{\"ranks\": {ranks}, \"backend\": \"{backend}\", \"sizes\": [{}]}}",
        rows.join(", ")
    );
}

/// Starts this bench under `mpiexec -n RANKS`, whose rank 0 prints the figures.
#[cfg(feature = "mpi")]
fn start_mpi(ranks: usize) {
    let exe = std::env::current_exe().expect("the bench's path");
    let status = std::process::Command::new("mpiexec")
        .args(["-n", &ranks.to_string()])
        .arg(exe)
        .env(MPI_CHILD, ranks.to_string())
        .status()
        .unwrap_or_else(|e| panic!("cannot start mpiexec: {e} (is MPICH installed?)"));
    assert!(status.success(), "mpiexec -n {ranks} failed: {status}");
}

#[cfg(not(feature = "mpi"))]
fn start_mpi(_: usize) {
    eprintln!("--mpi needs the `mpi` feature: cargo bench -p mslc-exec --features mpi --bench collectives -- --mpi");
    std::process::exit(2);
}

/// One process of the `--mpi` bench: every size's all-reduce over the world's ranks, the
/// figures printed by rank 0 (each rank times its own; rank 0's are reported).
#[cfg(feature = "mpi")]
fn mpi_child(ranks: usize) {
    use mslc_exec::collectives::mpi::MpiWorld;
    let mesh = Mesh::line("dp", ranks).expect("a mesh");
    let processes: Vec<usize> = (0..ranks).collect();
    let timeout = mslc_exec::collectives::DEFAULT_TIMEOUT;
    let world = MpiWorld::init().unwrap_or_else(|e| panic!("{}", e.message));
    let mut me = world
        .ranks(mesh, &processes, timeout)
        .map(|mut ranks| ranks.pop().expect("this process's rank"))
        .unwrap_or_else(|e| panic!("{}", e.message));
    if me.rank() == 0 {
        report(ranks, "MPI backend", |bytes| {
            time_all_reduce(&mut me, bytes)
        });
    } else {
        for mib in MIB {
            time_all_reduce(&mut me, mib << 20);
        }
    }
}
