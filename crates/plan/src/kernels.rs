//! The kernel table: for every step, which kernel runs it and with which parameters (tile sizes,
//! thread split). The planner's defaults come from the kernels crate's binding; a tuner — or a
//! person editing `NAME.kernels.toml` — replaces them. The table is keyed by op signature and
//! target fingerprint, written and read with serde: [`KernelTable::of`] and
//! [`KernelTable::to_toml`] write it, [`KernelTable::parse`] reads it back and
//! [`KernelTable::apply`] puts its choices into a module.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use mslc_artifact::Module;
use mslc_core::diag::Code;
use mslc_core::ops::Op;
use mslc_kernels::binding::{choose_kernel, KernelChoice, KernelParam};

/// The op signature a tuned kernel is keyed by: op, attributes and input types
/// ([`mslc_core::ops::signature`]).
pub fn signature(module: &Module, step: usize) -> String {
    let s = &module.steps[step];
    let inputs = s.inputs.iter().map(|&v| &module.values[v as usize].ty);
    mslc_core::ops::signature(s.op, inputs, &s.attrs)
}

/// The contents of `NAME.kernels.toml`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelTable {
    /// The model the table was written for (informational).
    pub model: String,
    /// The target name (informational).
    pub target: String,
    /// The target fingerprint the choices are valid for; a table for another fingerprint is
    /// not applied.
    pub fingerprint: String,
    /// One entry per distinct op signature.
    #[serde(default, rename = "kernel")]
    pub kernels: Vec<KernelEntry>,
    /// Graph-level decisions: fused subgraphs to build fused or unfused.
    #[serde(default, rename = "subgraph", skip_serializing_if = "Vec::is_empty")]
    pub subgraphs: Vec<SubgraphEntry>,
}

/// The fused ops whose patterns a `[[subgraph]]` entry may leave unfused: an elementwise
/// chain, a matmul with its bias and activation, a norm with its affine.
pub const SUBGRAPH_OPS: [Op; 4] = [
    Op::FusedElementwise,
    Op::FusedMatmul,
    Op::RmsNormScale,
    Op::LayerNormAffine,
];

/// One `[[subgraph]]` entry: whether the fusion pass fuses the pattern whose fused op has this
/// signature (`mslc tune` measured it faster unfused, or a person chose).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubgraphEntry {
    /// The fused op's signature (`fused_elementwise(…) {program=…}`, `fused_matmul(…)`, …),
    /// as [`signature`] writes it.
    pub signature: String,
    /// Fuse it (true) or leave its ops as they are.
    pub fused: bool,
    /// Microseconds per call the tuner measured fused (informational).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fused_us: Option<f64>,
    /// Microseconds per call the tuner measured unfused (informational).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unfused_us: Option<f64>,
}

/// One `[[kernel]]` entry: the kernel and parameters for every step of one op signature.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelEntry {
    /// The op signature, as [`signature`] writes it.
    pub signature: String,
    /// The kernel family's name.
    pub name: String,
    /// The steps of the module it was written from that have this signature (informational).
    #[serde(default)]
    pub steps: Vec<usize>,
    /// Whether the choice differs from the binding's default for the op, or was measured
    /// best on this target by `mslc tune` (informational).
    #[serde(default)]
    pub tuned: bool,
    /// Microseconds per call the tuner measured for this choice (informational).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_us: Option<f64>,
    /// Parameters by field name; a parameter left out takes the kernel's default.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub params: BTreeMap<String, TableParam>,
}

/// A parameter value as TOML writes it: a bare integer or string.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TableParam {
    /// A size or count.
    Int(i64),
    /// A choice, e.g. the micro-kernel ISA.
    Text(String),
}

impl From<&KernelParam> for TableParam {
    fn from(p: &KernelParam) -> Self {
        match p {
            KernelParam::Int(i) => TableParam::Int(*i),
            KernelParam::Text(t) => TableParam::Text(t.clone()),
        }
    }
}

impl From<&TableParam> for KernelParam {
    fn from(p: &TableParam) -> Self {
        match p {
            TableParam::Int(i) => KernelParam::Int(*i),
            TableParam::Text(t) => KernelParam::Text(t.clone()),
        }
    }
}

/// Why a kernel table cannot be used.
#[derive(Clone, Debug, PartialEq)]
pub enum KernelTableError {
    /// The file cannot be read (E0602).
    Unreadable(String),
    /// Not TOML, or not of the table's shape (E0620).
    Malformed(String),
    /// An entry names an op, kernel or parameter value that cannot run (E0621).
    Invalid {
        /// The entry's signature.
        signature: String,
        /// What is wrong with it.
        message: String,
    },
}

impl KernelTableError {
    /// The diagnostic code for this error.
    pub fn code(&self) -> Code {
        match self {
            KernelTableError::Unreadable(_) => Code::E0602,
            KernelTableError::Malformed(_) => Code::E0620,
            KernelTableError::Invalid { .. } => Code::E0621,
        }
    }
}

impl fmt::Display for KernelTableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelTableError::Unreadable(m) => write!(f, "kernel table: {m}"),
            KernelTableError::Malformed(m) => write!(f, "malformed kernel table: {m}"),
            KernelTableError::Invalid { signature, message } => {
                write!(f, "kernel table entry `{signature}`: {message}")
            }
        }
    }
}

impl std::error::Error for KernelTableError {}

impl KernelEntry {
    /// The entry's kernel choice.
    pub fn choice(&self) -> KernelChoice {
        KernelChoice {
            name: self.name.clone(),
            params: self
                .params
                .iter()
                .map(|(k, v)| (k.clone(), v.into()))
                .collect(),
        }
    }

    /// The op named at the start of the signature.
    fn op(&self) -> Option<Op> {
        let name = self.signature.split('(').next()?;
        Op::from_name(name.trim())
    }
}

impl KernelTable {
    /// The table of `module`: one entry per distinct op signature, with the kernel its steps
    /// run on and the steps that use it.
    pub fn of(module: &Module) -> KernelTable {
        let mut by_signature: BTreeMap<String, KernelEntry> = BTreeMap::new();
        for (i, step) in module.steps.iter().enumerate() {
            by_signature
                .entry(signature(module, i))
                .or_insert_with_key(|sig| KernelEntry {
                    signature: sig.clone(),
                    name: step.kernel.name.clone(),
                    steps: Vec::new(),
                    tuned: step.kernel != choose_kernel(step.op),
                    measured_us: None,
                    params: step
                        .kernel
                        .params
                        .iter()
                        .map(|(k, v)| (k.clone(), v.into()))
                        .collect(),
                })
                .steps
                .push(i);
        }
        KernelTable {
            model: module.name.clone(),
            target: module.target.clone(),
            fingerprint: module.target_fingerprint.clone(),
            kernels: by_signature.into_values().collect(),
            subgraphs: Vec::new(),
        }
    }

    /// The `NAME.kernels.toml` text.
    pub fn to_toml(&self) -> String {
        let body = toml::to_string(self).unwrap_or_default();
        format!("# mslc kernel table: the kernel and parameters chosen per op signature.\n{body}")
    }

    /// Reads a table and checks every entry against the binding: its op exists, its kernel is
    /// the family that runs that op, and every parameter is one the kernel takes, with a legal
    /// value. A signature given twice is an error too.
    pub fn parse(text: &str) -> Result<KernelTable, KernelTableError> {
        let table: KernelTable =
            toml::from_str(text).map_err(|e| KernelTableError::Malformed(e.to_string()))?;
        let mut seen = std::collections::BTreeSet::new();
        for entry in &table.kernels {
            let invalid = |message: String| KernelTableError::Invalid {
                signature: entry.signature.clone(),
                message,
            };
            if !seen.insert(entry.signature.as_str()) {
                return Err(invalid("the signature has two entries".to_string()));
            }
            let op = entry
                .op()
                .ok_or_else(|| invalid("the signature names no known op".to_string()))?;
            entry.choice().check_for(op).map_err(invalid)?;
        }
        let mut seen = std::collections::BTreeSet::new();
        for entry in &table.subgraphs {
            let invalid = |message: &str| KernelTableError::Invalid {
                signature: entry.signature.clone(),
                message: message.to_string(),
            };
            let op = entry.signature.split('(').next().and_then(Op::from_name);
            if !op.is_some_and(|op| SUBGRAPH_OPS.contains(&op)) {
                return Err(invalid(
                    "a [[subgraph]] entry names a fused op (`fused_elementwise(…)`, `fused_matmul(…)`, `rms_norm_scale(…)` or `layer_norm_affine(…)`)",
                ));
            }
            if !seen.insert(entry.signature.as_str()) {
                return Err(invalid("the subgraph has two entries"));
            }
        }
        Ok(table)
    }

    /// Reads and checks the table in file `path` (see [`KernelTable::parse`]).
    pub fn read(path: &Path) -> Result<KernelTable, KernelTableError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            KernelTableError::Unreadable(format!("cannot read `{}`: {e}", path.display()))
        })?;
        KernelTable::parse(&text).map_err(|e| match e {
            KernelTableError::Malformed(m) => {
                KernelTableError::Malformed(format!("`{}`: {m}", path.display()))
            }
            other => other,
        })
    }

    /// The signatures whose entry holds a tuner's result (`measured_us` set) rather than a
    /// person's edit: a newer tuning result may replace them.
    pub fn tuner_entries(&self) -> std::collections::BTreeSet<String> {
        self.kernels
            .iter()
            .filter(|e| e.measured_us.is_some())
            .map(|e| e.signature.clone())
            .collect()
    }

    /// The subgraphs the table says to build unfused.
    pub fn unfused(&self) -> std::collections::BTreeSet<String> {
        self.subgraphs
            .iter()
            .filter(|e| !e.fused)
            .map(|e| e.signature.clone())
            .collect()
    }

    /// Marks the entries of the signatures in `measured` as tuned, with the measured time in
    /// microseconds (what `mslc build` takes from the tuner's knowledge base).
    pub fn mark_tuned(&mut self, measured: &BTreeMap<String, f64>) {
        for entry in &mut self.kernels {
            if let Some(&us) = measured.get(&entry.signature) {
                entry.tuned = true;
                entry.measured_us = Some(us);
            }
        }
    }

    /// Gives every step of `module` whose signature has an entry that entry's kernel choice.
    /// A table for another target fingerprint changes nothing.
    pub fn apply(&self, module: &mut Module) -> Applied {
        if self.fingerprint != module.target_fingerprint {
            return Applied::OtherTarget {
                table: self.fingerprint.clone(),
                module: module.target_fingerprint.clone(),
            };
        }
        let by_signature: BTreeMap<&str, &KernelEntry> = self
            .kernels
            .iter()
            .map(|e| (e.signature.as_str(), e))
            .collect();
        let mut steps = 0;
        for i in 0..module.steps.len() {
            if let Some(entry) = by_signature.get(signature(module, i).as_str()) {
                module.steps[i].kernel = entry.choice();
                steps += 1;
            }
        }
        Applied::Steps(steps)
    }
}

/// What [`KernelTable::apply`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Applied {
    /// This many steps took their kernel choice from the table.
    Steps(usize),
    /// The table is for another target fingerprint; the module kept its kernels.
    OtherTarget {
        /// The table's fingerprint.
        table: String,
        /// The module's fingerprint.
        module: String,
    },
}

impl fmt::Display for Applied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Applied::Steps(n) => write!(f, "{n} steps from the table"),
            Applied::OtherTarget { table, module } => write!(
                f,
                "not applied: the table is for target fingerprint `{table}`, \
                 the module's is `{module}` (default kernels used)"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = r#"
model = "M"
target = "cpu"
fingerprint = "fp"

[[kernel]]
signature = "attention(f32[1, 2, 4, 8], f32[1, 2, 4, 8], f32[1, 2, 4, 8]) {causal=true}"
name = "flash_attention"
params = { block_q = 16 }
"#;

    #[test]
    fn subgraph_decisions_round_trip_and_are_checked() {
        let text = format!(
            "{TABLE}\n[[subgraph]]\nsignature = \"fused_elementwise(f16[2, 3]) {{program=relu(x0)}}\"\nfused = false\nunfused_us = 1.5\n"
        );
        let table = KernelTable::parse(&text).unwrap();
        assert_eq!(table.subgraphs.len(), 1);
        assert_eq!(
            table.unfused(),
            std::collections::BTreeSet::from([
                "fused_elementwise(f16[2, 3]) {program=relu(x0)}".to_string()
            ])
        );
        assert_eq!(KernelTable::parse(&table.to_toml()).unwrap(), table);
        let e = KernelTable::parse(&text.replace("fused_elementwise(", "relu(")).unwrap_err();
        assert_eq!(e.code(), Code::E0621);
        let twice = format!("{text}\n[[subgraph]]\nsignature = \"fused_elementwise(f16[2, 3]) {{program=relu(x0)}}\"\nfused = true\n");
        let e = KernelTable::parse(&twice).unwrap_err();
        assert!(e.to_string().contains("two entries"), "{e}");
    }

    #[test]
    fn a_table_reads_back_and_checks_its_entries() {
        let table = KernelTable::parse(TABLE).unwrap();
        assert_eq!(
            table.kernels[0].choice().params["block_q"],
            KernelParam::Int(16)
        );
        let again = KernelTable::parse(&table.to_toml()).unwrap();
        assert_eq!(again, table);

        let e = KernelTable::parse("model = 3").unwrap_err();
        assert_eq!(e.code(), Code::E0620);
        let e = KernelTable::parse(&TABLE.replace("params", "parms")).unwrap_err();
        assert_eq!(e.code(), Code::E0620, "{e}");
        for bad in ["block_q = -4", "block_q = \"big\"", "q_tile = 4"] {
            let e = KernelTable::parse(&TABLE.replace("block_q = 16", bad)).unwrap_err();
            assert_eq!(e.code(), Code::E0621, "{bad}: {e}");
        }
        let e = KernelTable::parse(&TABLE.replace("flash_attention", "gemm")).unwrap_err();
        assert!(e.to_string().contains("runs on `flash_attention`"), "{e}");
        let e = KernelTable::parse(&TABLE.replace("attention(", "atention(")).unwrap_err();
        assert_eq!(e.code(), Code::E0621, "{e}");
    }
}
