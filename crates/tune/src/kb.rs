//! The knowledge base, like AOE's repository: every tuned signature's best kernel choice and
//! times, keyed by device fingerprint, thread count and signature, in one JSON file (by default
//! in the user's cache directory). Tuning another model reuses every signature already known;
//! `mslc build` fills the kernel table from it. Graph-level decisions (a fused subgraph runs
//! faster fused or unfused) are kept beside them, keyed the same way by the fused op's
//! signature; `mslc build` hands the unfused ones to the fusion pass. Written atomically, merged with what is on disk
//! at the time of writing, and never overwritten when it cannot be read back.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use mslc_artifact::validate::kernel_param_bounds;
use mslc_artifact::Module;
use mslc_core::diag::Code;
use mslc_core::ops::Op;
use mslc_kernels::binding::{choose_kernel, KernelChoice, KernelParam};
use mslc_plan::kernels::signature;

use crate::confirm::Confirmation;

/// The `format` field of a knowledge base file.
pub const FORMAT: &str = "mslc-tune-kb";
/// The file layout version this mslc writes (2 added `subgraphs`, 3 `models`); it reads 1 to 3.
pub const VERSION: u32 = 3;

/// One tuned signature.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    /// The device fingerprint it was measured on ([`crate::device::fingerprint`]).
    pub device: String,
    /// Worker threads it was measured with.
    pub threads: usize,
    /// The op signature, as the kernel table writes it.
    pub signature: String,
    /// The kernel family.
    pub kernel: String,
    /// The winning parameters.
    pub params: BTreeMap<String, KernelParam>,
    /// Microseconds per call with the default parameters.
    pub default_us: f64,
    /// Microseconds per call with the winning parameters.
    pub tuned_us: f64,
    /// Candidates measured.
    pub candidates: usize,
    /// Whether the search ran to its end; an interrupted one is used by `mslc build` but
    /// searched again by the next `mslc tune`.
    #[serde(default = "complete")]
    pub complete: bool,
}

/// Records written before `complete` existed were complete.
fn complete() -> bool {
    true
}

impl Record {
    /// The kernel choice it records.
    pub fn choice(&self) -> KernelChoice {
        KernelChoice {
            name: self.kernel.clone(),
            params: self.params.clone(),
        }
    }

    /// Whether its choice can still run its op and a module accepts its values (a kernel's
    /// parameters may have changed since it was written; such a record is kept but not used).
    pub fn usable(&self) -> bool {
        let op = self.signature.split('(').next().and_then(Op::from_name);
        let in_bounds = self.params.iter().all(|(name, v)| match v {
            KernelParam::Int(i) => {
                kernel_param_bounds(name).is_some_and(|(low, high)| (low..=high).contains(i))
            }
            KernelParam::Text(_) => true,
        });
        in_bounds && op.is_some_and(|op| self.choice().check_for(op).is_ok())
    }
}

/// One graph-level decision: whether a fused subgraph runs fused or unfused.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubgraphRecord {
    /// The device fingerprint it was measured on.
    pub device: String,
    /// Worker threads it was measured with.
    pub threads: usize,
    /// The fused op's signature, as the kernel table writes it.
    pub signature: String,
    /// The decision: run it as one fused op (true) or one step per op.
    pub fused: bool,
    /// Microseconds per call fused.
    pub fused_us: f64,
    /// Microseconds per call unfused (0 when the unfused variant was rejected).
    pub unfused_us: f64,
}

/// One model's whole-model confirmation ([`crate::confirm`]): the forward with the decisions
/// it kept, timed against the default's, keyed by [`crate::confirm::key`] of that forward, so
/// that tuning the model again with nothing new to decide measures nothing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelRecord {
    /// The device fingerprint it was measured on.
    pub device: String,
    /// Worker threads it was measured with.
    pub threads: usize,
    /// The confirmed forward's key.
    pub key: String,
    /// The model's name (informational).
    pub model: String,
    /// The measurement and the decisions kept.
    pub confirmation: Confirmation,
}

/// The file's contents.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    format: String,
    version: u32,
    records: Vec<Record>,
    #[serde(default)]
    subgraphs: Vec<SubgraphRecord>,
    #[serde(default)]
    models: Vec<ModelRecord>,
}

/// A record's key: device, threads, signature.
type Key = (String, usize, String);

fn key(device: &str, threads: usize, signature: &str) -> Key {
    (device.to_string(), threads, signature.to_string())
}

/// The knowledge base: kernel records and graph-level decisions by (device, threads,
/// signature).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KnowledgeBase {
    records: BTreeMap<Key, Record>,
    subgraphs: BTreeMap<Key, SubgraphRecord>,
    models: BTreeMap<Key, ModelRecord>,
}

/// Why a knowledge base cannot be used.
#[derive(Clone, Debug, PartialEq)]
pub enum KbError {
    /// The file exists but cannot be read (E0602).
    Unreadable(String),
    /// Not a knowledge base, or a damaged one (E0622).
    Unusable(String),
    /// It cannot be written (E0600).
    Unwritable(String),
}

impl KbError {
    /// The diagnostic code for this error.
    pub fn code(&self) -> Code {
        match self {
            KbError::Unreadable(_) => Code::E0602,
            KbError::Unusable(_) => Code::E0622,
            KbError::Unwritable(_) => Code::E0600,
        }
    }
}

impl fmt::Display for KbError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KbError::Unreadable(m) | KbError::Unusable(m) | KbError::Unwritable(m) => {
                f.write_str(m)
            }
        }
    }
}

impl std::error::Error for KbError {}

/// The default file: `$XDG_CACHE_HOME/mslc/tune-kb.json`, else `~/.cache/mslc/tune-kb.json`;
/// `None` when neither variable is set.
pub fn default_path() -> Option<PathBuf> {
    mslc_io::cache::cache_file("tune-kb.json")
}

impl KnowledgeBase {
    /// Reads the knowledge base in `path`; a missing file is an empty one.
    pub fn read(path: &Path) -> Result<KnowledgeBase, KbError> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(KnowledgeBase::default())
            }
            Err(e) => {
                return Err(KbError::Unreadable(format!(
                    "cannot read the knowledge base `{}`: {e}",
                    path.display()
                )))
            }
        };
        KnowledgeBase::parse(&bytes)
            .map_err(|m| KbError::Unusable(format!("knowledge base `{}`: {m}", path.display())))
    }

    /// Reads a knowledge base from its bytes; the error says what is wrong.
    pub fn parse(bytes: &[u8]) -> Result<KnowledgeBase, String> {
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| format!("damaged: not JSON ({e})"))?;
        match value.get("format").and_then(|f| f.as_str()) {
            Some(FORMAT) => {}
            _ => {
                return Err(format!(
                    "not an mslc knowledge base (no `format: \"{FORMAT}\"`)"
                ))
            }
        }
        match value.get("version").and_then(|v| v.as_u64()) {
            Some(v) if (1..=u64::from(VERSION)).contains(&v) => {}
            Some(v) => {
                return Err(format!(
                    "version {v}, this mslc reads version {VERSION} (written by another mslc)"
                ))
            }
            None => return Err("damaged: no `version`".to_string()),
        }
        let file: File = serde_json::from_value(value).map_err(|e| format!("damaged: {e}"))?;
        let mut kb = KnowledgeBase::default();
        for r in file.records {
            kb.insert(r);
        }
        for r in file.subgraphs {
            kb.insert_subgraph(r);
        }
        for r in file.models {
            kb.insert_model(r);
        }
        Ok(kb)
    }

    /// Adds or replaces a record.
    pub fn insert(&mut self, record: Record) {
        self.records.insert(
            key(&record.device, record.threads, &record.signature),
            record,
        );
    }

    /// The usable record for `signature` on `device` with `threads` threads.
    pub fn get(&self, device: &str, threads: usize, signature: &str) -> Option<&Record> {
        self.records
            .get(&key(device, threads, signature))
            .filter(|r| r.usable())
    }

    /// Adds or replaces a graph-level decision.
    pub fn insert_subgraph(&mut self, record: SubgraphRecord) {
        self.subgraphs.insert(
            key(&record.device, record.threads, &record.signature),
            record,
        );
    }

    /// The decision for fused subgraph `signature` on `device` with `threads` threads.
    pub fn subgraph(
        &self,
        device: &str,
        threads: usize,
        signature: &str,
    ) -> Option<&SubgraphRecord> {
        self.subgraphs.get(&key(device, threads, signature))
    }

    /// Adds or replaces a whole-model confirmation.
    pub fn insert_model(&mut self, record: ModelRecord) {
        self.models
            .insert(key(&record.device, record.threads, &record.key), record);
    }

    /// The confirmation of the forward keyed `model_key` on `device` with `threads` threads.
    pub fn model(&self, device: &str, threads: usize, model_key: &str) -> Option<&ModelRecord> {
        self.models.get(&key(device, threads, model_key))
    }

    /// Drops the kernel decisions for `signatures` on `device` with `threads` threads: each
    /// record keeps its times but now chooses its kernel's default parameters (the whole
    /// forward was slower with them).
    pub fn drop_kernels<'s>(
        &mut self,
        device: &str,
        threads: usize,
        signatures: impl IntoIterator<Item = &'s String>,
    ) {
        for sig in signatures {
            let Some(r) = self.records.get_mut(&key(device, threads, sig)) else {
                continue;
            };
            let Some(op) = sig.split('(').next().and_then(Op::from_name) else {
                continue;
            };
            r.params = choose_kernel(op).params;
            r.tuned_us = r.default_us;
        }
    }

    /// Drops the unfused decisions for `signatures` on `device` with `threads` threads: they
    /// run fused again (the whole forward was slower unfused).
    pub fn drop_unfused<'s>(
        &mut self,
        device: &str,
        threads: usize,
        signatures: impl IntoIterator<Item = &'s String>,
    ) {
        for sig in signatures {
            if let Some(r) = self.subgraphs.get_mut(&key(device, threads, sig)) {
                r.fused = true;
            }
        }
    }

    /// The signatures of the subgraphs decided unfused on `device` with `threads` threads,
    /// with their decisions.
    pub fn unfused(&self, device: &str, threads: usize) -> BTreeMap<String, &SubgraphRecord> {
        self.subgraphs
            .values()
            .filter(|r| r.device == device && r.threads == threads && !r.fused)
            .map(|r| (r.signature.clone(), r))
            .collect()
    }

    /// Every record.
    pub fn records(&self) -> impl Iterator<Item = &Record> {
        self.records.values()
    }

    /// Records and decisions measured on `device` (any thread count).
    pub fn count_for(&self, device: &str) -> usize {
        self.records.values().filter(|r| r.device == device).count()
            + self
                .subgraphs
                .values()
                .filter(|r| r.device == device)
                .count()
    }

    /// The file's bytes.
    fn to_bytes(&self) -> Vec<u8> {
        let file = File {
            format: FORMAT.to_string(),
            version: VERSION,
            records: self.records.values().cloned().collect(),
            subgraphs: self.subgraphs.values().cloned().collect(),
            models: self.models.values().cloned().collect(),
        };
        let mut text = serde_json::to_string_pretty(&file).unwrap_or_default();
        text.push('\n');
        text.into_bytes()
    }

    /// Writes the knowledge base to `path` atomically (a temporary file beside it, then a
    /// rename), after merging in records another process wrote there meanwhile (ours win on
    /// the same key). A file there that is not a readable knowledge base is left alone and
    /// reported: nothing in it is lost.
    pub fn save(&self, path: &Path) -> Result<(), KbError> {
        let mut merged = KnowledgeBase::read(path)?;
        for r in self.records.values() {
            merged.insert(r.clone());
        }
        for r in self.subgraphs.values() {
            merged.insert_subgraph(r.clone());
        }
        for r in self.models.values() {
            merged.insert_model(r.clone());
        }
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let unwritable = |e: std::io::Error| {
            KbError::Unwritable(format!(
                "cannot write the knowledge base `{}`: {e}",
                path.display()
            ))
        };
        std::fs::create_dir_all(dir).map_err(unwritable)?;
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
        std::fs::write(&tmp, merged.to_bytes())
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(|e| {
                let _ = std::fs::remove_file(&tmp);
                unwritable(e)
            })
    }

    /// Gives the steps of `module` whose signature has a usable record for `device` and
    /// `threads` the recorded kernel choice — those still on the binding's default choice, or
    /// whose signature is in `replaceable` (choices an earlier tuning put there); a choice
    /// edited by hand stays. Returns the tuned time in microseconds of each signature applied.
    pub fn apply(
        &self,
        module: &mut Module,
        device: &str,
        threads: usize,
        replaceable: &BTreeSet<String>,
    ) -> BTreeMap<String, f64> {
        let mut applied = BTreeMap::new();
        for i in 0..module.steps.len() {
            let sig = signature(module, i);
            let step = &mut module.steps[i];
            let open = step.kernel == choose_kernel(step.op) || replaceable.contains(&sig);
            if let Some(r) = self.get(device, threads, &sig).filter(|_| open) {
                step.kernel = r.choice();
                applied.insert(sig, r.tuned_us);
            }
        }
        applied
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(sig: &str) -> Record {
        Record {
            device: "dev".into(),
            threads: 2,
            signature: sig.into(),
            kernel: "gemm".into(),
            params: BTreeMap::from([("mc".to_string(), KernelParam::Int(48))]),
            default_us: 10.0,
            tuned_us: 8.0,
            candidates: 12,
            complete: true,
        }
    }

    #[test]
    fn records_round_trip_and_merge_on_save() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("kb.json");
        let mut a = KnowledgeBase::default();
        a.insert(record("matmul(f32[2, 3], f32[3, 4])"));
        a.save(&path).unwrap();
        let mut b = KnowledgeBase::default();
        b.insert(record("matmul(f32[5, 3], f32[3, 4])"));
        let decision = SubgraphRecord {
            device: "dev".into(),
            threads: 2,
            signature: "fused_elementwise(f16[4]) {program=\"relu(x0)\"}".into(),
            fused: false,
            fused_us: 3.0,
            unfused_us: 1.0,
        };
        b.insert_subgraph(decision.clone());
        b.save(&path).unwrap();
        let back = KnowledgeBase::read(&path).unwrap();
        assert_eq!(back.records().count(), 2);
        assert_eq!(
            back.subgraph("dev", 2, &decision.signature),
            Some(&decision)
        );
        assert_eq!(back.unfused("dev", 2).len(), 1);
        assert!(back.unfused("dev", 1).is_empty());
        assert!(back.get("dev", 2, "matmul(f32[2, 3], f32[3, 4])").is_some());
        assert!(back.get("dev", 4, "matmul(f32[2, 3], f32[3, 4])").is_none());
        assert!(back
            .get("other", 2, "matmul(f32[2, 3], f32[3, 4])")
            .is_none());
    }

    #[test]
    fn damaged_or_foreign_files_are_reported_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kb.json");
        for (text, says) in [
            (
                "{\"format\": \"mslc-tune-kb\", \"version\": 1, \"rec",
                "damaged",
            ),
            (
                "{\"name\": \"some other tool\"}",
                "not an mslc knowledge base",
            ),
            (
                "{\"format\": \"mslc-tune-kb\", \"version\": 9, \"records\": []}",
                "version 9",
            ),
            (
                "{\"format\": \"mslc-tune-kb\", \"version\": 1, \"records\": [1]}",
                "damaged",
            ),
            (
                "{\"format\": \"mslc-tune-kb\", \"version\": 2, \"records\": [], \"subgraphs\": [{\"device\": \"d\"}]}",
                "damaged",
            ),
        ] {
            std::fs::write(&path, text).unwrap();
            let e = KnowledgeBase::read(&path).unwrap_err();
            assert_eq!(e.code(), Code::E0622);
            assert!(e.to_string().contains(says), "{e}");
            let mut kb = KnowledgeBase::default();
            kb.insert(record("matmul(f32[2, 3], f32[3, 4])"));
            assert_eq!(kb.save(&path).unwrap_err().code(), Code::E0622);
            assert_eq!(
                std::fs::read_to_string(&path).unwrap(),
                text,
                "left as it was"
            );
        }
    }

    #[test]
    fn a_record_the_kernel_no_longer_takes_is_kept_but_not_used() {
        let mut kb = KnowledgeBase::default();
        let mut r = record("matmul(f32[2, 3], f32[3, 4])");
        r.params.insert("no_such_field".into(), KernelParam::Int(1));
        kb.insert(r);
        assert!(kb.get("dev", 2, "matmul(f32[2, 3], f32[3, 4])").is_none());
        assert_eq!(kb.records().count(), 1);
    }
}
