//! The graph-level tuning decisions `mslc build` and `mslc run FILE.msl` follow: the kernel
//! table's `[[subgraph]]` entries and the knowledge base's unfused decisions for this device,
//! handed to the fusion pass; and the table's record of those that applied to the model.
//! Training builds and `mslc train` follow them too, with the knowledge base's kernel
//! choices.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use mslc_artifact::Module;
use mslc_check::Model;
use mslc_driver::compile::{compile, CompileError, CompileOptions, Compiled};
use mslc_plan::kernels::{KernelTable, SubgraphEntry};
use mslc_tune::device::fingerprint;
use mslc_tune::graph::Subgraph;
use mslc_tune::kb::KnowledgeBase;

/// The subgraphs the kernel table at `path` says to build unfused; none when there is no
/// table or it cannot be read (the caller reads it again to apply its kernels, and reports
/// that).
pub fn table_unfused(path: Option<&Path>) -> BTreeSet<String> {
    path.and_then(|p| KernelTable::read(p).ok())
        .map(|t| t.unfused())
        .unwrap_or_default()
}

/// The decisions a build weighs: the kernel table's entries (a person's or an earlier
/// build's), then the knowledge base's unfused decisions for this device and the executor's
/// default thread count that the table does not decide. Files that cannot be read give none
/// here; the build reads them again and reports that.
pub fn decisions(table: Option<&Path>, kb: Option<&Path>) -> Vec<SubgraphEntry> {
    let mut out: Vec<SubgraphEntry> = table
        .and_then(|p| KernelTable::read(p).ok())
        .map(|t| t.subgraphs)
        .unwrap_or_default();
    let Some(kb) = kb.and_then(|p| KnowledgeBase::read(p).ok()) else {
        return out;
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    for (signature, r) in kb.unfused(&fingerprint(), threads) {
        if !out.iter().any(|e| e.signature == signature) {
            out.push(SubgraphEntry {
                signature,
                fused: false,
                fused_us: Some(r.fused_us),
                unfused_us: Some(r.unfused_us),
            });
        }
    }
    out
}

/// Compiles `model` following `decisions`: as usual first, then — when an unfused decision
/// names one of its fused subgraphs — again with those left unfused. Returns the compiled
/// model and the decisions that name one of its subgraphs.
pub fn compile_deciding(
    model: &Model,
    options: CompileOptions,
    decisions: &[SubgraphEntry],
) -> Result<(Compiled, Vec<SubgraphEntry>), CompileError> {
    deciding(options, decisions, |o| compile(model, o), |c| &c.module)
}

/// [`compile_deciding`] for any compilation (a model's forward, a training step): `compile`
/// compiles with the given options, `module` is the module it compiled.
pub fn deciding<T, E>(
    mut options: CompileOptions,
    decisions: &[SubgraphEntry],
    compile: impl Fn(&CompileOptions) -> Result<T, E>,
    module: impl Fn(&T) -> &Module,
) -> Result<(T, Vec<SubgraphEntry>), E> {
    let compiled = compile(&options)?;
    if decisions.is_empty() {
        return Ok((compiled, Vec::new()));
    }
    let present: BTreeSet<String> = Subgraph::of_module(module(&compiled))
        .into_iter()
        .map(|s| s.signature)
        .collect();
    let applied: Vec<SubgraphEntry> = decisions
        .iter()
        .filter(|d| present.contains(&d.signature))
        .cloned()
        .collect();
    options.unfused = applied
        .iter()
        .filter(|d| !d.fused)
        .map(|d| d.signature.clone())
        .collect();
    if options.unfused.is_empty() {
        return Ok((compiled, applied));
    }
    Ok((compile(&options)?, applied))
}

/// Gives the steps of `module` the kernel choices the knowledge base at `kb` holds for this
/// device and `threads` worker threads (as `mslc build` does for the table it writes), for a
/// module run without a build (`mslc train`); the number of signatures applied. A file that
/// cannot be read gives none here.
pub fn apply_kernels(module: &mut Module, kb: Option<&Path>, threads: usize) -> usize {
    kb.and_then(|p| KnowledgeBase::read(p).ok())
        .map_or(0, |kb| {
            kb.apply(module, &fingerprint(), threads, &BTreeSet::new())
                .len()
        })
}

/// Writes `applied` as the `[[subgraph]]` entries of the kernel table `NAME.kernels.toml`
/// among `files`, so that the table records them and `mslc run --kernels` follows them too.
pub fn record(files: &mut [(PathBuf, Vec<u8>)], model: &str, applied: &[SubgraphEntry]) {
    let file = format!("{model}.kernels.toml");
    let Some(entry) = files.iter_mut().find(|(p, _)| p.ends_with(&file)) else {
        return;
    };
    let Ok(mut table) = KernelTable::parse(&String::from_utf8_lossy(&entry.1)) else {
        return;
    };
    table.subgraphs = applied.to_vec();
    entry.1 = table.to_toml().into_bytes();
}

/// The summary line for `applied`, if any applied.
pub fn summary_line(applied: &[SubgraphEntry]) -> Option<String> {
    let unfused = applied.iter().filter(|d| !d.fused).count();
    (!applied.is_empty()).then(|| {
        format!(
            "  subgraphs:  {unfused} fused subgraph(s) left unfused, {} kept fused (tuning decisions)\n",
            applied.len() - unfused
        )
    })
}
