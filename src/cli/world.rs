//! Which ranks of a parallel plan `mslc train` runs in this process, and what carries their
//! collectives: every rank as threads of this process (`--ranks N`), or this process's one
//! rank of the world an MPI launcher started (`--mpi`, cargo feature `mpi`). Everything else
//! about a rank — its program, shards, data and loop — is the same whichever runs it.

use mslc_exec::collectives::{Collectives, Mesh};

use super::output::Failure;

/// One rank this process runs: its number in the mesh and its collectives (none on a mesh of
/// one device).
pub type Rank = (usize, Option<Box<dyn Collectives>>);

/// The ranks this process runs.
pub enum World {
    /// Neither flag: one device, whatever the plan.
    One,
    /// `--ranks N`: N threads of this process.
    Threads(usize),
    /// `--mpi`: one rank of the world `mpiexec` started (a world of 1 without it).
    #[cfg(feature = "mpi")]
    Mpi(mslc_exec::collectives::mpi::MpiWorld),
}

impl World {
    /// The world `--ranks` and `--mpi` ask for (MPI is initialised here); a usage error for
    /// both at once, or for `--mpi` in a build without the `mpi` feature.
    pub fn of(ranks: Option<usize>, mpi: bool) -> Result<World, Failure> {
        match (ranks, mpi) {
            (Some(_), true) => Err(Failure::Usage(
                "give either --ranks (threads) or --mpi (processes), not both".to_string(),
            )),
            (Some(n), false) => Ok(World::Threads(n)),
            (None, false) => match launched_by_mpi() {
                Some((var, n)) => Err(Failure::Usage(format!(
                    "this process is one of {n} that an MPI launcher started ({var}={n}), but \
                     --mpi was not given, so each would train alone: add --mpi"
                ))),
                None => Ok(World::One),
            },
            (None, true) => mpi_world(),
        }
    }

    /// How many ranks were started and by what (for E0970); `None` for one device.
    pub fn started(&self) -> Option<(usize, &'static str)> {
        match self {
            World::One => None,
            World::Threads(n) => Some((*n, "--ranks")),
            #[cfg(feature = "mpi")]
            World::Mpi(w) => Some((w.size(), "mpiexec")),
        }
    }

    /// The ranks of `mesh` this process runs, in rank order.
    pub fn ranks(self, mesh: &Mesh) -> Result<Vec<Rank>, Failure> {
        let alone = mesh.size() == 1;
        let comms: Vec<(usize, Box<dyn Collectives>)> = match self {
            World::One | World::Threads(_) => mslc_driver::ranks::thread_world(mesh.clone())
                .into_iter()
                .enumerate()
                .collect(),
            #[cfg(feature = "mpi")]
            World::Mpi(w) => {
                let rank = w.rank();
                let comm = w
                    .into_rank(mesh.clone())
                    .map_err(|e| Failure::Message(mslc_core::diag::Code::E0973, e.message))?;
                vec![(rank, Box::new(comm) as Box<dyn Collectives>)]
            }
        };
        Ok(comms
            .into_iter()
            .map(|(rank, comm)| (rank, (!alone).then_some(comm)))
            .collect())
    }
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
fn mpi_world() -> Result<World, Failure> {
    mslc_exec::collectives::mpi::MpiWorld::init()
        .map(World::Mpi)
        .map_err(|e| Failure::Message(mslc_core::diag::Code::E0973, e.message))
}

#[cfg(not(feature = "mpi"))]
fn mpi_world() -> Result<World, Failure> {
    Err(Failure::Usage(
        "--mpi needs an mslc built with the `mpi` feature (`cargo install mslc --features mpi`, \
         with an MPI such as MPICH installed)"
            .to_string(),
    ))
}
