//! The artifact set of a build, in memory: the module (`NAME.mir`), its kernel table
//! (`NAME.kernels.toml`) and its memory plan (`NAME.memplan.json`) — the files every front end
//! that builds (`mslc build`, build scripts) writes the same way.

use std::path::{Path, PathBuf};

use serde::Serialize;

use mslc_plan::kernels::KernelTable;

use crate::compile::Compiled;

/// The artifact files of `compiled` in `dir` as `(path, bytes)`, named after `name`, with
/// `mir` the encoded module (see [`mslc_artifact::encode`]).
pub fn artifact_files(
    dir: &Path,
    name: &str,
    compiled: &Compiled,
    mir: Vec<u8>,
) -> Vec<(PathBuf, Vec<u8>)> {
    vec![
        (dir.join(format!("{name}.mir")), mir),
        (
            dir.join(format!("{name}.kernels.toml")),
            KernelTable::of(&compiled.module).to_toml().into_bytes(),
        ),
        (
            dir.join(format!("{name}.memplan.json")),
            json(&compiled.memory),
        ),
    ]
}

/// `value` as pretty JSON with a final newline.
pub fn json<T: Serialize>(value: &T) -> Vec<u8> {
    let mut text = serde_json::to_string_pretty(value).unwrap_or_default();
    text.push('\n');
    text.into_bytes()
}
