//! Which ranks of a parallel plan `mslc train` and `mslc run` run in this process, and what
//! carries their collectives: every rank as threads of this process (`--ranks N`), or this
//! process's device of the world an MPI launcher started (`--mpi`, cargo feature `mpi`): one
//! rank, or under an interleaved schedule the device's chunk-ranks as threads.
//! Everything else about a rank — its program, shards, data and loop — is the same whichever
//! runs it, and so is how the ranks are driven ([`command`], [`run_ranks`]).

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use mslc_core::diag::Code;
use mslc_driver::ranks::{self, RankLayout};
use mslc_exec::collectives::Collectives;
use mslc_exec::collectives::DEFAULT_TIMEOUT;
use mslc_exec::Executor;
use mslc_io::safetensors::SafetensorsFile;
use mslc_ir::shard::zero::ZeroShard;

use super::output::Failure;
use super::Reporter;

/// How `mslc run` and `mslc train` start the ranks of the parallel plan they run.
#[derive(clap::Args, Debug, Default)]
pub struct LaunchArgs {
    /// Run the plan (the train's, or for `run` the model's first train's) on N ranks, threads
    /// of this process exchanging through shared memory; N must equal the plan's device count
    /// (E0970). Data, tensor and pipeline parallelism and optimizer sharding run (E0972 for the rest);
    /// rank 0 reports and writes the outputs or checkpoints.
    #[arg(long, value_name = "N")]
    pub ranks: Option<usize>,
    /// Run this process's device of the plan over MPI, one device per process (its chunks as
    /// threads under an interleaved schedule): `mpiexec -n N mslc run|train --mpi …`, N the
    /// plan's device count (E0970 otherwise, a
    /// world of 1 included). Rank 0 reports and writes; the others stay quiet. Needs an mslc
    /// built with the cargo feature `mpi`.
    #[arg(long)]
    pub mpi: bool,
    /// How long a rank waits in a collective for the others before it stops with E0973 (one
    /// hung): with --ranks naming the ranks that did not arrive, with --mpi aborting the MPI
    /// job; default 600.
    #[arg(long, value_name = "SECONDS")]
    pub collective_timeout: Option<f64>,
}

/// A command's summary as text and JSON; `None` in the ranks of an MPI world other than 0.
pub type Outcome = Result<Option<(String, serde_json::Value)>, Failure>;

/// Runs a command that may run ranks: the world `--ranks`/`--mpi` ask for, lent to
/// `execute`; in the processes of an MPI world other than rank 0 nothing is printed (rank 0
/// reports for all, and they exit with the status of what they found) unless a failure is
/// their own ([`run_ranks`]). The exit status.
///
/// The world is dropped (MPI finalised) only once the outcome is printed, and a finalisation
/// that has not returned after [`FINALIZE_GRACE`] ends the process with that status: over
/// UCX's TCP transport, between processes on different machines, MPI_Finalize now and then
/// never returns (openucx/ucx#8738, open: the transport stops progressing before its
/// endpoints are flushed; one step of examples/mlp.msl on 4 processes, each in a namespace of
/// its own named as another machine, hung there in 3 runs of 4 here), and such a run said
/// nothing and never ended, though its steps and checkpoints were done.
pub fn command(
    reporter: &Reporter,
    launch: &LaunchArgs,
    execute: impl FnOnce(&World) -> Outcome,
) -> u8 {
    let world = match World::of(launch) {
        Ok(world) => world,
        Err(failure) => return reporter.finish(Err(failure)),
    };
    reporter.mute(world.follower());
    let status = match execute(&world) {
        Ok(None) => 0,
        outcome => reporter.finish(outcome.map(Option::unwrap_or_default)),
    };
    #[cfg(feature = "mpi")]
    if matches!(world, World::Mpi(..)) {
        std::thread::spawn(move || {
            std::thread::sleep(FINALIZE_GRACE);
            eprintln!(
                "warning: MPI_Finalize did not return within {} s (UCX's TCP transport, \
                 openucx/ucx#8738); this process ends without it, its run complete (mpiexec \
                 may report the ending as a bad termination)",
                FINALIZE_GRACE.as_secs()
            );
            std::process::exit(i32::from(status))
        });
        // Where tests make finalisation hang (cargo feature `failpoints`,
        // `FAILPOINTS=mpi-finalize=pause`), as UCX's does across machines.
        #[cfg(feature = "failpoints")]
        fail::fail_point!("mpi-finalize");
    }
    // The world drops here, finalising MPI, once the outcome is printed.
    status
}

/// How long a process whose command is done waits for MPI_Finalize before it ends without it
/// ([`command`]): finalising takes milliseconds when it works.
#[cfg(feature = "mpi")]
const FINALIZE_GRACE: Duration = Duration::from_secs(30);

/// One rank this process runs: its number in the mesh and its collectives (none on a mesh of
/// one device).
pub type Rank = (usize, Option<Box<dyn Collectives>>);

/// The ranks this process runs.
pub enum World {
    /// Neither flag: one device, whatever the plan.
    One,
    /// `--ranks N`: N threads of this process, and how long one waits in a collective.
    Threads(usize, Duration),
    /// `--mpi`: one rank of the world `mpiexec` started (a world of 1 without it), and how
    /// long it waits in a collective.
    #[cfg(feature = "mpi")]
    Mpi(mslc_exec::collectives::mpi::MpiWorld, Duration),
}

impl World {
    /// The world `--ranks` and `--mpi` ask for (MPI is initialised here); a usage error for
    /// both at once, for `--mpi` in a build without the `mpi` feature, and for a collective
    /// timeout that is not a positive number of seconds or has no ranks to time.
    pub fn of(launch: &LaunchArgs) -> Result<World, Failure> {
        let timeout = match launch.collective_timeout {
            None => DEFAULT_TIMEOUT,
            Some(_) if launch.ranks.is_none() && !launch.mpi => {
                return Err(Failure::Usage(
                    "--collective-timeout is for the ranks of --ranks or --mpi".to_string(),
                ))
            }
            Some(s) => Duration::try_from_secs_f64(s)
                .ok()
                .filter(|d| !d.is_zero())
                .ok_or_else(|| {
                    Failure::Usage(format!(
                        "--collective-timeout {s}: give a positive number of seconds"
                    ))
                })?,
        };
        match (launch.ranks, launch.mpi) {
            (Some(_), true) => Err(Failure::Usage(
                "give either --ranks (threads) or --mpi (processes), not both".to_string(),
            )),
            (Some(n), false) => Ok(World::Threads(n, timeout)),
            (None, false) => match launched_by_mpi() {
                Some((var, n)) => Err(Failure::Usage(format!(
                    "this process is one of {n} that an MPI launcher started ({var}={n}), but \
                     --mpi was not given, so each would run alone: add --mpi"
                ))),
                None => Ok(World::One),
            },
            (None, true) => mpi_world(timeout),
        }
    }

    /// How many ranks were started and by what (for E0970); `None` for one device.
    pub fn started(&self) -> Option<(usize, &'static str)> {
        match self {
            World::One => None,
            World::Threads(n, _) => Some((*n, "--ranks")),
            #[cfg(feature = "mpi")]
            World::Mpi(w, _) => Some((w.size(), "mpiexec")),
        }
    }

    /// How long a rank waits for the others (`--collective-timeout`, or the default).
    pub fn timeout(&self) -> Duration {
        match self {
            World::One => DEFAULT_TIMEOUT,
            World::Threads(_, timeout) => *timeout,
            #[cfg(feature = "mpi")]
            World::Mpi(_, timeout) => *timeout,
        }
    }

    /// `failure` given back; but in an MPI job of several processes it is printed at once
    /// and ends the job with its exit status (MPI_Abort), since the other processes would wait
    /// for this one in their next collective until their timeout, whose abort loses it.
    #[cfg_attr(not(feature = "mpi"), allow(unused_variables))]
    fn end_job_on(&self, failure: Failure, reporter: &Reporter) -> Failure {
        #[cfg(feature = "mpi")]
        if let World::Mpi(w, _) = self {
            if w.size() > 1 {
                w.abort(i32::from(reporter.finish(Err(failure))))
            }
        }
        failure
    }

    /// What this process holds beside its devices' plans for the collectives' library: under
    /// MPI, [`mpi_reserve`](mslc_plan::parallel::estimate::mpi_reserve) for the processes on
    /// this machine and on others; none on the threads backend, whose exchanges the plans
    /// count.
    pub fn library_reserve(&self) -> u64 {
        match self {
            World::One | World::Threads(..) => 0,
            #[cfg(feature = "mpi")]
            World::Mpi(w, _) => {
                let here = w.processes_on_this_machine();
                mslc_plan::parallel::estimate::mpi_reserve(here, w.size().saturating_sub(here))
            }
        }
    }

    /// Under MPI, brings the transport's memory to its steady state before the first step
    /// ([`MpiWorld::warm_up`](mslc_exec::collectives::mpi::MpiWorld::warm_up)), so a run's
    /// peak is what the plan's reserve counts whether it runs one step or a thousand.
    pub fn warm_up(&self) {
        #[cfg(feature = "mpi")]
        if let World::Mpi(w, timeout) = self {
            w.warm_up(*timeout)
        }
    }

    /// Whether this process runs a rank of an MPI world other than 0 (which reports for it).
    pub fn follower(&self) -> bool {
        match self {
            World::One | World::Threads(..) => false,
            #[cfg(feature = "mpi")]
            World::Mpi(w, _) => w.rank() != 0,
        }
    }

    /// The ranks of `layout`'s mesh this process runs, in rank order: all of them as threads,
    /// or in an MPI world those of the device this process is (under an interleaved schedule
    /// its chunk-ranks, as threads of it). Each rank runs `threads` worker threads, which
    /// decides whether the threads backend's members spin while they wait
    /// ([`mslc_exec::collectives::threads::spins_while_waiting`]). The world is to outlive
    /// them: an MPI world is finalised when it is dropped, on this thread, after the ranks.
    pub fn ranks(&self, layout: &RankLayout, threads: usize) -> Result<Vec<Rank>, Failure> {
        let mesh = &layout
            .mesh()
            .map_err(|e| Failure::Message(e.code, e.message))?;
        let alone = mesh.size() == 1;
        let comms: Vec<(usize, Box<dyn Collectives>)> = match self {
            World::One => ranks::thread_world(mesh.clone(), DEFAULT_TIMEOUT, threads)
                .into_iter()
                .enumerate()
                .collect(),
            World::Threads(_, timeout) => ranks::thread_world(mesh.clone(), *timeout, threads)
                .into_iter()
                .enumerate()
                .collect(),
            #[cfg(feature = "mpi")]
            World::Mpi(w, timeout) => w
                .ranks(mesh.clone(), &layout.rank_devices(), *timeout)
                .map_err(|e| Failure::Message(Code::E0973, e.message))?
                .into_iter()
                .map(|comm| (comm.rank(), Box::new(comm) as Box<dyn Collectives>))
                .collect(),
        };
        Ok(comms
            .into_iter()
            .map(|(rank, comm)| (rank, (!alone).then_some(comm)))
            .collect())
    }
}

/// Runs the `ranks` of this process: rank 0, when it is here, on this thread through `lead`
/// (its result is returned), the others through `follow` — on threads of their own (a rank
/// that fails drops its collectives, and the others stop at their next collective with E0973
/// instead of waiting forever), but this process's one rank of an MPI world on this thread
/// (`None` returned without rank 0). Of several failures the root cause is returned
/// ([`ranks::root_cause`]). In an MPI job a rank's failure is printed at once — a follower's
/// own naming its rank, though rank 0 speaks for the rest — and ends the job (MPI_Abort):
/// the other processes would otherwise wait for it in their next collective until their
/// timeout, whose abort would lose the report.
pub fn run_ranks<T: Send>(
    world: &World,
    ranks: Vec<Rank>,
    reporter: &Reporter,
    lead: impl FnOnce(Option<Box<dyn Collectives>>) -> Result<T, Failure>,
    follow: impl Fn(usize, Option<Box<dyn Collectives>>) -> Result<(), Failure> + Sync,
) -> Result<Option<T>, Failure> {
    let mut ranks = ranks.into_iter().peekable();
    let leader = ranks.next_if(|(rank, _)| *rank == 0).map(|(_, comm)| comm);
    let failed = |failure| world.end_job_on(failure, reporter);
    // Ranks of an MPI world other than 0's process: a failure of their own is said, naming
    // the rank.
    let follow_mpi = |rank: usize, comm| {
        follow(rank, comm).map_err(|e| match e {
            Failure::Message(code, m) if code != Code::E0973 => {
                reporter.mute(false);
                failed(Failure::Message(code, format!("rank {rank}: {m}")))
            }
            e => failed(e),
        })
    };
    let Some(leader) = leader else {
        let mut followers: Vec<Rank> = ranks.collect();
        if followers.len() == 1 {
            let (rank, comm) = followers.remove(0);
            return follow_mpi(rank, comm).map(|()| None);
        }
        return run_together(followers, None::<fn() -> Result<T, Failure>>, &follow_mpi);
    };
    let follow = |rank, comm| follow(rank, comm).map_err(failed);
    run_together(
        ranks.collect(),
        Some(|| lead(leader).map_err(failed)),
        &follow,
    )
}

/// Runs `lead` (when given) on this thread and each of `followers` on a thread of its own:
/// `lead`'s result (`None` without it), or of the failures the root cause
/// ([`ranks::root_cause`]).
fn run_together<T: Send>(
    followers: Vec<Rank>,
    lead: Option<impl FnOnce() -> Result<T, Failure>>,
    follow: &(impl Fn(usize, Option<Box<dyn Collectives>>) -> Result<(), Failure> + Sync),
) -> Result<Option<T>, Failure> {
    std::thread::scope(|scope| {
        let followers: Vec<_> = followers
            .into_iter()
            .map(|(rank, comm)| scope.spawn(move || follow(rank, comm)))
            .collect();
        let (done, mut errors) = match lead.map(|lead| lead()) {
            Some(Ok(done)) => (Some(done), Vec::new()),
            Some(Err(e)) => (None, vec![e]),
            None => (None, Vec::new()),
        };
        for f in followers {
            match f.join() {
                Ok(Err(e)) => errors.push(e),
                Ok(Ok(())) => {}
                Err(_) => errors.push(Failure::Message(
                    Code::E0973,
                    "a rank's thread panicked".to_string(),
                )),
            }
        }
        let code = |f: &Failure| match f {
            Failure::Message(c, _) => Some(*c),
            _ => None,
        };
        match ranks::root_cause(errors, code) {
            Some(e) => Err(e),
            None => Ok(done),
        }
    })
}

/// Loads into `exec` the weights of `path` as tensor-parallel member `part` of `layout`
/// holds them ([`ranks::load_rank_weights`]: only its block of each split parameter, and of those
/// ZeRO shards over the data-parallel axis — `zero`: the sharding and this rank's replica —
/// only its slice), those of the parameters in `elsewhere` (which only other pipeline stages
/// read) left out; any other the program lacks is still an error. The framework bookkeeping
/// tensors of the file left out.
pub fn load_stage_shard(
    exec: &mut Executor,
    path: &Path,
    layout: &RankLayout,
    part: usize,
    zero: Option<(&ZeroShard, usize)>,
    elsewhere: &BTreeSet<String>,
) -> Result<Vec<(String, &'static str)>, Failure> {
    let file = SafetensorsFile::open(path)
        .map_err(|e| Failure::Message(Code::E0602, format!("cannot read weights: {e}")))?;
    let here = file.tensors().filter(|t| !elsewhere.contains(t.name));
    let share = (part, layout.tp);
    ranks::load_rank_weights(exec, &file, here, &layout.splits, share, zero).map_err(|e| {
        let message = match e.code {
            Code::E0601 => format!("`{}`: {}", path.display(), e.message),
            _ => e.message,
        };
        Failure::Message(e.code, message)
    })
}

/// The parameter paths of `module`.
pub fn params_of(module: &mslc_artifact::Module) -> BTreeSet<String> {
    module.params().map(|(path, _)| path.to_string()).collect()
}

/// The parameters only stages other than `stage` read, of each stage's `params`: what a
/// rank of `stage` leaves out of a whole weights file.
pub fn elsewhere(params: &[BTreeSet<String>], stage: usize) -> BTreeSet<String> {
    let own = params.get(stage);
    params
        .iter()
        .flatten()
        .filter(|p| own.is_none_or(|own| !own.contains(*p)))
        .cloned()
        .collect()
}

/// The world size an MPI launcher announces to each process it starts (MPICH's Hydra:
/// `PMI_SIZE`; Open MPI: `OMPI_COMM_WORLD_SIZE`), with the variable's name, when it is over 1.
fn launched_by_mpi() -> Option<(&'static str, usize)> {
    ["PMI_SIZE", "OMPI_COMM_WORLD_SIZE"]
        .into_iter()
        .find_map(|var| {
            let n: usize = std::env::var(var).ok()?.trim().parse().ok()?;
            (n > 1).then_some((var, n))
        })
}

#[cfg(feature = "mpi")]
fn mpi_world(timeout: Duration) -> Result<World, Failure> {
    mslc_exec::collectives::mpi::MpiWorld::init()
        .map(|w| World::Mpi(w, timeout))
        .map_err(|e| Failure::Message(mslc_core::diag::Code::E0973, e.message))
}

#[cfg(not(feature = "mpi"))]
fn mpi_world(_: Duration) -> Result<World, Failure> {
    Err(Failure::Usage(
        "--mpi needs an mslc built with the `mpi` feature (`cargo install mslc --features mpi`, \
         with an MPI such as MPICH installed)"
            .to_string(),
    ))
}
