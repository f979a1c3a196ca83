//! `--embed-weights`: read a safetensors file and check it against the module's parameters.

use std::path::Path;

use mslc_artifact::Module;
use mslc_core::diag::Code;
use mslc_core::ops::TensorType;
use mslc_exec::weights::match_weights;
use mslc_io::safetensors::SafetensorsFile;

/// The file's bytes when every parameter matches; otherwise (code, message, help).
pub fn read_matching(path: &Path, module: &Module) -> Result<Vec<u8>, (Code, String, String)> {
    let file = SafetensorsFile::open(path).map_err(|e| {
        (
            Code::E0602,
            format!("cannot read weights: {e}"),
            "pass a complete .safetensors file".to_string(),
        )
    })?;
    let params: Vec<(&str, &TensorType)> = module
        .params()
        .map(|(p, v)| (p, &module.values[v as usize].ty))
        .collect();
    match_weights(&params, file.tensors()).map_err(|problems| {
        (
            Code::E0601,
            format!("{} does not match the model:\n{problems}", path.display()),
            "weights are matched by parameter path and shape; check --set/--dim against the checkpoint's config"
                .to_string(),
        )
    })?;
    std::fs::read(path).map_err(|e| {
        (
            Code::E0602,
            format!("cannot read {}: {e}", path.display()),
            String::new(),
        )
    })
}
