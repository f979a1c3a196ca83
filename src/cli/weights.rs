//! `--embed-weights`: read a safetensors file and check it against the module's parameters.

use std::path::Path;

use crate::artifact::Module;
use crate::diag::Code;
use crate::io::safetensors::SafetensorsFile;
use crate::io::weights::match_params;

/// The file's bytes when every parameter matches; otherwise (code, message, help).
pub fn read_matching(path: &Path, module: &Module) -> Result<Vec<u8>, (Code, String, String)> {
    let file = SafetensorsFile::open(path).map_err(|e| {
        (
            Code::E0602,
            format!("cannot read weights: {e}"),
            "pass a complete .safetensors file".to_string(),
        )
    })?;
    let params: Vec<(&str, &[i64])> = module
        .params()
        .map(|(p, v)| (p, module.values[v as usize].ty.shape.as_slice()))
        .collect();
    let mismatch = match_params(&file, &params);
    if !mismatch.is_empty() {
        return Err((
            Code::E0601,
            format!("{} does not match the model: {mismatch}", path.display()),
            "weights are matched by parameter path and shape; check --set/--dim against the checkpoint's config".to_string(),
        ));
    }
    std::fs::read(path).map_err(|e| {
        (
            Code::E0602,
            format!("cannot read {}: {e}", path.display()),
            String::new(),
        )
    })
}
