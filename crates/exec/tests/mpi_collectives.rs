//! The MPI backend against the threads backend, under a real `mpiexec` (cargo feature `mpi`;
//! `harness = false`). Run plainly, this test starts itself under `mpiexec -n 2` and `-n 4`
//! (and once without mpiexec, which must be refused as a world of 1), each process one rank,
//! then again with two ranks per process as threads of it (an interleaved pipeline's chunks:
//! 4 ranks along `pp` on 2 processes, and a `pp` × `dp` mesh of 8 on 4), whose `pp` groups
//! have several members in one process. Each MPI rank runs the same collectives on both
//! backends — the threads one in-process, all ranks as threads — and requires the same bits
//! (and finds every process on this one machine). Last, a rank that hangs before a collective,
//! one that hangs before the message its peer waits for, and one that hangs before the
//! transport's warm-up: the other says so after its timeout and aborts the job, well before
//! the hung rank would have arrived.

use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use mslc_exec::collectives::mpi::MpiWorld;
use mslc_exec::collectives::threads::world;
use mslc_exec::collectives::{Collectives, Mesh, DEFAULT_TIMEOUT};

/// Set in the processes mpiexec starts: the world size they expect.
const CHILD: &str = "MSLC_MPI_TEST_RANKS";
/// Set in the processes of a hung-rank run: what rank 0 waits in (`all_reduce`, `recv`).
const HANG: &str = "MSLC_MPI_TEST_HANG";
/// How long rank 1 of the hung-rank run sleeps before its collective.
const HUNG_FOR: Duration = Duration::from_secs(60);
/// Seconds one mpiexec run may take before it is killed and the test fails.
const LIMIT: Duration = Duration::from_secs(120);

/// The meshes the children run, by the name [`CHILD`] gives, with the process of each rank:
/// `2`, `4` (2 × 2) and `1x4` (one group of 4, where the order of a sum shows in its bits)
/// one rank per process; `2x2` and `4x2` two per process, the `pp` ranks `k`
/// and `k + 2` on one (as an interleaved pipeline of 2 devices places its 4 chunks).
fn layout(name: &str) -> (Mesh, Vec<usize>) {
    let axes = |axes: &[(&str, usize)]| {
        Mesh::new(axes.iter().map(|&(a, n)| (a.to_string(), n)).collect()).unwrap()
    };
    match name {
        "2" => (Mesh::line("dp", 2).unwrap(), vec![0, 1]),
        "4" => (axes(&[("dp", 2), ("mp", 2)]), (0..4).collect()),
        "1x4" => (Mesh::line("dp", 4).unwrap(), (0..4).collect()),
        "2x2" => (Mesh::line("pp", 4).unwrap(), vec![0, 1, 0, 1]),
        "4x2" => {
            // Rank (k, replica) = 2k + replica on device (k mod 2, replica).
            let devices = (0..8).map(|r| (r / 2 % 2) * 2 + r % 2).collect();
            (axes(&[("pp", 4), ("dp", 2)]), devices)
        }
        other => panic!("no mesh `{other}`"),
    }
}

/// Rank-dependent values whose sums round (so the order of summation shows in the bits).
fn values(rank: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((rank * 31 + i) as f32 * 0.7).sin() * 1e3 + 0.1)
        .collect()
}

/// Every collective on every mesh axis, then a ring of send/recv over the whole mesh: the
/// buffers each produced, in order.
fn scenario(c: &mut dyn Collectives) -> Result<Vec<Vec<f32>>, String> {
    let (rank, n_axes, size) = (c.rank(), c.mesh().axes().len(), c.mesh().size());
    let mut results = Vec::new();
    for axis in 0..n_axes {
        let n = c.mesh().axes()[axis].1;
        // 7 values do not split evenly over 2 or 4 members; 8 do.
        let mut reduced = values(rank, 7);
        c.all_reduce(axis, &mut reduced).map_err(|e| e.message)?;
        let mut even = values(rank, 8);
        c.all_reduce(axis, &mut even).map_err(|e| e.message)?;
        // Fewer values than 4 members (some blocks empty), and a sum over several of the
        // 2,048-value chunks the sums take, split unevenly.
        let mut short = values(rank, 3);
        c.all_reduce(axis, &mut short).map_err(|e| e.message)?;
        let mut long = values(rank, 3 * 2048 + 5);
        c.all_reduce(axis, &mut long).map_err(|e| e.message)?;
        let mut gathered = vec![0.0; 3 * n];
        c.all_gather(axis, &values(rank, 3), &mut gathered)
            .map_err(|e| e.message)?;
        let mut scattered = vec![0.0; 2];
        c.reduce_scatter(axis, &values(rank, 2 * n), &mut scattered)
            .map_err(|e| e.message)?;
        let mut swapped = vec![0.0; 2 * n];
        c.all_to_all(axis, &values(rank, 2 * n), &mut swapped)
            .map_err(|e| e.message)?;
        results.extend([reduced, even, short, long, gathered, scattered, swapped]);
    }
    let mut got = vec![0.0; 5];
    // Even ranks send first, odd ones receive first, so blocking sends cannot deadlock.
    let (next, prev) = ((rank + 1) % size, (rank + size - 1) % size);
    if rank % 2 == 0 {
        c.send(next, &values(rank, 5)).map_err(|e| e.message)?;
        c.recv(prev, &mut got).map_err(|e| e.message)?;
    } else {
        c.recv(prev, &mut got).map_err(|e| e.message)?;
        c.send(next, &values(rank, 5)).map_err(|e| e.message)?;
    }
    results.push(got);
    // Disagreeing lengths: an error on every member, never a hang.
    let mut uneven = vec![1.0; 2 + c.mesh().coords(rank)[0]];
    match c.all_reduce(0, &mut uneven) {
        Err(e) if e.message.contains("sent") => {}
        other => return Err(format!("uneven all_reduce gave {other:?}")),
    }
    Ok(results)
}

/// The threads backend's results for `rank` of `mesh`.
fn threads_results(mesh: Mesh, rank: usize) -> Vec<Vec<f32>> {
    let handles: Vec<_> = world(mesh)
        .into_iter()
        .map(|mut r| std::thread::spawn(move || scenario(&mut r).unwrap()))
        .collect();
    let mut all: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    all.swap_remove(rank)
}

/// One rank of a hung-rank run: rank 1 sleeps [`HUNG_FOR`] before its part of `what` (an
/// all-reduce, the send rank 0 receives, or the warm-up of MPI's transport that `mslc train`
/// runs before its first step), rank 0 waits 1 s for it, then says so and aborts the job.
fn hung_child(what: &str) -> ExitCode {
    let (mesh, processes) = layout("2");
    let world = match MpiWorld::init() {
        Ok(world) => world,
        Err(e) => {
            eprintln!("{}", e.message);
            return ExitCode::from(3);
        }
    };
    let me = world.ranks(mesh, &processes, Duration::from_secs(1));
    let mut me = match me.map(|mut ranks| ranks.pop()) {
        Ok(Some(me)) => me,
        Ok(None) => return ExitCode::from(3),
        Err(e) => {
            eprintln!("{}", e.message);
            return ExitCode::from(3);
        }
    };
    if me.rank() == 1 {
        std::thread::sleep(HUNG_FOR);
    }
    if what == "warm_up" {
        world.warm_up(Duration::from_secs(1));
        println!("rank {}: the warm-up completed", me.rank());
        return ExitCode::SUCCESS;
    }
    let mut data = values(me.rank(), 4);
    let done = match (what, me.rank()) {
        ("recv", 0) => me.recv(1, &mut data),
        ("recv", _) => me.send(0, &data),
        _ => me.all_reduce(0, &mut data),
    };
    match done {
        Ok(()) => println!("rank {}: the {what} completed", me.rank()),
        Err(e) => eprintln!("rank {}: {}", me.rank(), e.message),
    }
    ExitCode::SUCCESS
}

/// One MPI process, running its ranks of mesh `name` ([`layout`]) as threads: both backends,
/// the same bits.
fn child(name: &str) -> ExitCode {
    let (mesh, processes) = layout(name);
    // Dropped last, on this thread, which finalises MPI.
    let world = match MpiWorld::init() {
        Ok(world) => world,
        Err(e) => {
            eprintln!("{}", e.message);
            return ExitCode::from(3);
        }
    };
    // One machine: every process of the world shares it (what the warm-up and MPI's
    // memory reserve reach).
    if world.processes_on_this_machine() != world.size() {
        eprintln!(
            "{} of {} processes found on this machine",
            world.processes_on_this_machine(),
            world.size()
        );
        return ExitCode::FAILURE;
    }
    let ranks = match world.ranks(mesh.clone(), &processes, DEFAULT_TIMEOUT) {
        Ok(ranks) => ranks,
        Err(e) => {
            eprintln!("{}", e.message);
            return ExitCode::from(3);
        }
    };
    let handles: Vec<_> = ranks
        .into_iter()
        .map(|mut me| std::thread::spawn(move || (me.rank(), scenario(&mut me))))
        .collect();
    let mut failed = false;
    for handle in handles {
        let (rank, got) = handle.join().unwrap();
        let got = match got {
            Ok(got) => got,
            Err(e) => {
                eprintln!("rank {rank}: {e}");
                failed = true;
                continue;
            }
        };
        let want = threads_results(mesh.clone(), rank);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let same =
                g.len() == w.len() && g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits());
            if !same {
                eprintln!("rank {rank}: result {i} differs: MPI {g:?}, threads {w:?}");
                failed = true;
            }
        }
        println!(
            "rank {rank} of {}: {} results match the threads backend",
            mesh.size(),
            got.len()
        );
    }
    match failed {
        true => ExitCode::FAILURE,
        false => ExitCode::SUCCESS,
    }
}

/// Runs `cmd` to completion within [`LIMIT`]: (success, stdout + stderr).
fn run_limited(mut cmd: Command) -> (bool, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e} (is MPICH installed?)"));
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr);
            return (status.success(), text);
        }
        if start.elapsed() > LIMIT {
            child.kill().ok();
            panic!("{cmd:?} ran past {LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn main() -> ExitCode {
    if let Ok(what) = std::env::var(HANG) {
        return hung_child(&what);
    }
    if let Ok(name) = std::env::var(CHILD) {
        return child(&name);
    }
    let exe = std::env::current_exe().unwrap();
    for name in ["2", "4", "1x4", "2x2", "4x2"] {
        let (mesh, processes) = layout(name);
        let n = processes.iter().max().unwrap() + 1;
        let mut cmd = Command::new("mpiexec");
        cmd.args(["-n", &n.to_string()]).arg(&exe).env(CHILD, name);
        let (ok, out) = run_limited(cmd);
        assert!(ok, "mpiexec -n {n} ({name}) failed:\n{out}");
        assert_eq!(out.matches("results match").count(), mesh.size(), "{out}");
        println!(
            "mpiexec -n {n} ({name}): every one of {} ranks ({} per process) matches the threads backend",
            mesh.size(),
            mesh.size() / n
        );
    }
    let mut alone = Command::new(&exe);
    alone.env(CHILD, "4");
    let (ok, out) = run_limited(alone);
    assert!(!ok && out.contains("world has 1 process"), "{out}");
    println!("started without mpiexec: refused as a world of 1");
    let hangs = [
        (
            "all_reduce",
            "rank 0: a member of its group on mesh axis `dp` did not reach the all_reduce",
        ),
        (
            "recv",
            "rank 0: rank 1 did not send the message it was waited for",
        ),
        (
            "warm_up",
            "process 0: the first messages to process 1 and from process 1 did not go through",
        ),
    ];
    for (what, said) in hangs {
        let mut hung = Command::new("mpiexec");
        hung.args(["-n", "2"]).arg(&exe).env(HANG, what);
        let start = Instant::now();
        let (ok, out) = run_limited(hung);
        let took = start.elapsed();
        assert!(!ok, "{out}");
        assert!(
            out.contains("E0973") && out.contains(&format!("{said} within 1.0 s")),
            "{out}"
        );
        assert!(took < HUNG_FOR / 2, "took {took:?}:\n{out}");
        println!("a rank that hangs ({what}): the other aborts the job after its 1 s timeout ({took:.1?})");
    }
    ExitCode::SUCCESS
}
