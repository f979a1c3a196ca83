//! The checkpoints a training run has written, for the tests of both test binaries (tests/it
//! and tests/mpi_train.rs) that stop a run midway and resume from what is on disk.

use std::path::Path;

/// The steps of the checkpoints in `out`, ascending (none before it exists).
pub fn checkpoints(out: &Path) -> Vec<u64> {
    let mut steps: Vec<u64> = std::fs::read_dir(out)
        .into_iter()
        .flatten()
        .filter_map(|e| {
            e.ok()?
                .file_name()
                .to_str()?
                .strip_prefix("step-")?
                .parse()
                .ok()
        })
        .collect();
    steps.sort_unstable();
    steps
}
