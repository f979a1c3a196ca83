//! What each declaration field means and which values it takes, for hover and completion.

use mslc_syntax::ast::DeclKind;

/// One documented field: kind, key, meaning, values to offer.
pub struct FieldDoc {
    /// The declaration kind it belongs to.
    pub kind: DeclKind,
    /// The key.
    pub key: &'static str,
    /// What it means.
    pub doc: &'static str,
    /// Values to complete after `key = `.
    pub values: &'static [&'static str],
}

const fn f(
    kind: DeclKind,
    key: &'static str,
    doc: &'static str,
    values: &'static [&'static str],
) -> FieldDoc {
    FieldDoc {
        kind,
        key,
        doc,
        values,
    }
}

use DeclKind::{Memory, Parallel, Precision, Target, Train};

/// Every field of every declaration kind.
pub const FIELDS: &[FieldDoc] = &[
    f(Precision, "level", "Mixed-precision level: O0 keeps everything f32, O1 casts ops on an allow list, O2 computes in `compute` and keeps f32 master weights.", &["O0", "O1", "O2"]),
    f(Precision, "compute", "The reduced dtype ops compute in.", &["f16", "bf16"]),
    f(Precision, "keep_f32", "Ops that always compute in f32, e.g. `[rms_norm, softmax]`.", &["[softmax]"]),
    f(Precision, "loss_scale", "Loss scaling for f16: a number, or `dynamic(init:, factor:, window:)`.", &["dynamic(init: 65536, factor: 2, window: 2000)", "none"]),
    f(Precision, "keep_batchnorm_f32", "Keep batch-norm in f32.", &["true", "false"]),
    f(Parallel, "mesh", "The device mesh: named axes and their sizes, `{ dp: 2, mp: 4 }`.", &["{ dp: 2, mp: 2 }"]),
    f(Parallel, "mode", "How sharding is decided: `semi_auto` propagates the `shard` rules.", &["semi_auto", "data_parallel", "auto"]),
    f(Parallel, "devices", "Number of devices; the product of the mesh sizes and pipeline stages.", &["8"]),
    f(Parallel, "pipeline", "Pipeline parallelism: `{ stages:, micro_batches:, schedule: 1f1b | gpipe }`.", &["{ stages: 2, micro_batches: 4, schedule: 1f1b }"]),
    f(Parallel, "optimizer_shard", "ZeRO-style optimizer-state sharding level.", &["none", "level1", "level2", "level3"]),
    f(Parallel, "redistribution_threshold", "Implicit redistributions above this many bytes per step are warning W0040 (default 1GiB).", &["1GiB"]),
    f(Memory, "max_device_memory", "The memory budget of one device, e.g. `16GB`.", &["16GB"]),
    f(Memory, "recompute", "Activation recomputation: `none`, `full`, `selective`, or `auto` (the least that fits).", &["auto", "none", "full", "selective"]),
    f(Train, "loss", "The loss expression over the model's outputs and the labels.", &["cross_entropy(logits, labels)"]),
    f(Train, "optimizer", "The optimizer and its hyper-parameters.", &["adamw(lr: 1e-4)", "sgd(lr: 0.1, momentum: 0.9)", "adam(lr: 1e-3)"]),
    f(Train, "batch", "Samples per step per data-parallel replica.", &["8"]),
    f(Train, "grad_accum", "Micro-steps accumulated before each optimizer step.", &["1"]),
    f(Train, "schedule", "Learning-rate schedule: `constant`, or linear warm-up then cosine or linear decay to `min_lr`.", &["constant", "warmup_cosine(warmup: 100, total: 1000, min_lr: 1e-5)", "warmup_linear(warmup: 100, total: 1000)"]),
    f(Train, "clip_grad_norm", "Largest global 2-norm of the gradients; larger ones are scaled down.", &["1.0"]),
    f(Train, "no_decay", "Parameter-path patterns excluded from weight decay.", &["[\"**.bias\"]"]),
    f(Train, "precision", "The precision policy to train with.", &[]),
    f(Train, "parallel", "The parallel policy to train with.", &[]),
    f(Train, "memory", "The memory policy to train with.", &[]),
    f(Train, "target", "The hardware target, e.g. `std.targets.cpu`.", &["std.targets.cpu"]),
    f(Target, "peak_f32", "Peak f32 throughput of one device, e.g. `157GFLOPS`.", &[]),
    f(Target, "peak_f16", "Peak f16 throughput of one device.", &[]),
    f(Target, "peak_bf16", "Peak bf16 throughput of one device.", &[]),
    f(Target, "memory", "Memory of one device, e.g. `64GB`.", &[]),
    f(Target, "bandwidth", "Memory bandwidth of one device, e.g. `1.6TB/s`.", &[]),
    f(Target, "interconnect", "Bandwidth between devices, e.g. `56GB/s`.", &[]),
    f(Target, "network", "Per-device bandwidth to other nodes, e.g. `50GB/s` (default: `interconnect`).", &[]),
    f(Target, "devices_per_node", "Devices in one node.", &[]),
    f(Target, "cores", "CPU cores one device has.", &[]),
];

/// The documentation of `key` in a declaration of `kind`.
pub fn field(kind: DeclKind, key: &str) -> Option<&'static FieldDoc> {
    FIELDS.iter().find(|d| d.kind == kind && d.key == key)
}

#[cfg(test)]
mod tests {
    use super::FIELDS;
    use mslc_check::{check_source, CheckOptions};
    use mslc_core::diag::Code;

    /// Every documented field is one the checker accepts (no "unknown field").
    #[test]
    fn every_documented_field_is_known_to_the_checker() {
        for f in FIELDS {
            let kind = f.kind.keyword();
            let text = format!("{kind} D {{\n    {} = 1\n}}\n", f.key);
            let checked = check_source("fields.msl", &text, &CheckOptions::default());
            assert!(
                !checked.diagnostics.iter().any(|d| d.code == Code::E0500),
                "{kind}.{}: {:?}",
                f.key,
                checked.diagnostics
            );
        }
    }
}
