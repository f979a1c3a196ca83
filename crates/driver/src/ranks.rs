//! Running a plan's ranks: which per-rank program a plan asks for (today: data parallelism),
//! the check that the world started matches the plan's device count (E0970), and N ranks as
//! threads of one process, each with its own executor, talking through the threads backend of
//! [`mslc_exec::collectives`].

use std::collections::BTreeMap;

use mslc_core::diag::Code;
use mslc_exec::collectives::threads::world;
use mslc_exec::collectives::{Collectives, Mesh};
use mslc_plan::parallel::PlanFile;

use crate::train::DATA_AXIS;

/// A coded refusal to run a plan's ranks.
#[derive(Clone, Debug, PartialEq)]
pub struct RanksError {
    /// E0970 (world size), E0972 (layout not runnable) or E0973 (a rank stopped).
    pub code: Code,
    /// What is wrong, with the numbers.
    pub message: String,
}

impl RanksError {
    fn new(code: Code, message: impl Into<String>) -> RanksError {
        RanksError {
            code,
            message: message.into(),
        }
    }
}

/// Checks that `world` ranks (started by `launcher`, for the message) are the `devices` a
/// plan has (E0970).
pub fn check_world(devices: i64, world: usize, launcher: &str) -> Result<(), RanksError> {
    let devices = devices.max(1) as usize;
    if world != devices {
        let alone = if world == 1 && launcher.starts_with("mpiexec") {
            " (a binary started without mpiexec, or by another MPI's launcher, sees one rank)"
        } else {
            ""
        };
        return Err(RanksError::new(
            Code::E0970,
            format!(
                "{launcher} started {world} rank(s), but the plan has {devices} device(s){alone}"
            ),
        ));
    }
    Ok(())
}

/// The data-parallel degree each of `world` ranks runs `plan` with (no plan: one device). An
/// error when `world` differs from the plan's device count, or when the plan splits anything
/// but the batch (tensor or pipeline parallelism, optimizer sharding: planned, not yet run).
pub fn data_parallel_degree(
    plan: Option<&PlanFile>,
    world: usize,
    launcher: &str,
) -> Result<usize, RanksError> {
    let layout = plan.map(|p| Layout {
        devices: p.devices,
        mesh: &p.mesh,
        optimizer_shard: p.optimizer_shard,
    });
    degree_of(layout, world, launcher)
}

/// What of a plan decides the per-rank program.
struct Layout<'a> {
    devices: i64,
    mesh: &'a BTreeMap<String, i64>,
    optimizer_shard: u8,
}

fn degree_of(plan: Option<Layout>, world: usize, launcher: &str) -> Result<usize, RanksError> {
    check_world(plan.as_ref().map_or(1, |p| p.devices), world, launcher)?;
    let Some(plan) = plan else {
        return Ok(1);
    };
    let degree = |axis: &str| plan.mesh.get(axis).copied().unwrap_or(1).max(1);
    let others: Vec<String> = plan
        .mesh
        .iter()
        .filter(|(axis, &n)| axis.as_str() != "dp" && n > 1)
        .map(|(axis, n)| format!("{axis} = {n}"))
        .collect();
    if !others.is_empty() || plan.optimizer_shard > 0 {
        let mut what = others;
        if plan.optimizer_shard > 0 {
            what.push(format!(
                "optimizer_shard = {}",
                mslc_plan::parallel::level_name(plan.optimizer_shard)
            ));
        }
        return Err(RanksError::new(
            Code::E0972,
            format!(
                "the plan asks for {}; the executor runs data parallelism only (replicated \
                 weights and optimizer states)",
                what.join(", ")
            ),
        ));
    }
    Ok(degree("dp") as usize)
}

/// The parameters `plan` splits, each with the one dim it splits (what
/// [`mslc_ir::shard::tensor::tensor_parallel`] takes); an error for a parameter split along
/// more than one dim (not run yet).
pub fn tensor_splits(plan: &PlanFile) -> Result<BTreeMap<String, usize>, RanksError> {
    let mut splits = BTreeMap::new();
    for (path, spec) in &plan.shardings {
        let dims: Vec<usize> = spec
            .iter()
            .enumerate()
            .filter_map(|(d, a)| a.as_ref().map(|_| d))
            .collect();
        match dims[..] {
            [] => {}
            [d] => {
                splits.insert(path.clone(), d);
            }
            _ => {
                return Err(RanksError::new(
                    Code::E0972,
                    format!("`{path}` is split along {} dims; one is run", dims.len()),
                ))
            }
        }
    }
    Ok(splits)
}

/// The collectives of `replicas` data-parallel ranks as threads of this process, rank order.
pub fn thread_world(replicas: usize) -> Result<Vec<Box<dyn Collectives>>, RanksError> {
    let mesh = Mesh::line(DATA_AXIS, replicas.max(1))
        .map_err(|e| RanksError::new(Code::E0970, e.message))?;
    Ok(world(mesh)
        .into_iter()
        .map(|r| Box::new(r) as Box<dyn Collectives>)
        .collect())
}

/// Worker threads per rank when `--threads` is not given: the cores shared among the ranks.
pub fn threads_per_rank(given: Option<usize>, ranks: usize) -> usize {
    given.unwrap_or_else(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        (cores / ranks.max(1)).max(1)
    })
}

/// The error to report when ranks failed: the first that is not a rank stopping because
/// another one left (E0973), which names the real cause; else the first.
pub fn root_cause<E>(errors: Vec<E>, code: impl Fn(&E) -> Option<Code>) -> Option<E> {
    let first_real = errors.iter().position(|e| code(e) != Some(Code::E0973));
    let mut errors = errors;
    match first_real {
        Some(i) => Some(errors.swap_remove(i)),
        None => errors.into_iter().next(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The degree `world` ranks run a plan of `mesh` and optimizer-shard `level` with.
    fn run(
        mesh: &[(&str, i64)],
        level: u8,
        world: usize,
        launcher: &str,
    ) -> Result<usize, RanksError> {
        let mesh: BTreeMap<String, i64> = mesh.iter().map(|(a, n)| (a.to_string(), *n)).collect();
        let layout = Layout {
            devices: mesh.values().product(),
            mesh: &mesh,
            optimizer_shard: level,
        };
        degree_of(Some(layout), world, launcher)
    }

    #[test]
    fn the_world_must_match_the_plan() {
        let dp = [("dp", 2), ("tp", 1), ("pp", 1)];
        assert_eq!(run(&dp, 0, 2, "--ranks"), Ok(2));
        let e = run(&dp, 0, 4, "--ranks").unwrap_err();
        assert_eq!(e.code, Code::E0970);
        assert!(e.message.contains("started 4 rank(s), but the plan has 2"));
        let e = run(&dp, 0, 1, "mpiexec").unwrap_err();
        assert!(e.message.contains("without mpiexec"), "{}", e.message);
        assert_eq!(data_parallel_degree(None, 1, "--ranks"), Ok(1));
    }

    #[test]
    fn only_data_parallel_plans_run() {
        let e = run(&[("dp", 1), ("tp", 2), ("pp", 1)], 0, 2, "--ranks").unwrap_err();
        assert_eq!(e.code, Code::E0972);
        assert!(e.message.contains("tp = 2"), "{}", e.message);
        let e = run(&[("dp", 2)], 1, 2, "--ranks").unwrap_err();
        assert!(
            e.message.contains("optimizer_shard = level1"),
            "{}",
            e.message
        );
    }

    #[test]
    fn the_root_cause_is_not_a_rank_that_stopped() {
        let errors = vec![(Code::E0973, "left"), (Code::E0601, "bad weights")];
        let e = root_cause(errors, |e| Some(e.0)).unwrap();
        assert_eq!(e.1, "bad weights");
        assert_eq!(
            root_cause(vec![(Code::E0973, "x")], |e| Some(e.0))
                .unwrap()
                .1,
            "x"
        );
    }
}
