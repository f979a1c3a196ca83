//! `target` declarations: what the hardware a model is planned for can do — peak compute per
//! dtype, memory, bandwidths, devices per node.

use mslc_core::diag::{Diagnostic, FileId};
use mslc_syntax::ast::{DeclItem, Ident, Span};

use super::fields::{Extra, FieldSpec, Fields};
use super::report::Reporter;
use super::value::Unit;

/// Peak compute rate per floating-point type, in FLOP/s.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PeakFlops {
    /// f32.
    pub f32: f64,
    /// f16.
    pub f16: f64,
    /// bf16.
    pub bf16: f64,
}

/// A checked `target` declaration.
#[derive(Clone, Debug, PartialEq)]
pub struct TargetSpec {
    /// The target's name.
    pub name: Ident,
    /// The file it is declared in.
    pub file: FileId,
    /// Peak compute; f16 and bf16 default to the f32 rate.
    pub peak_flops: PeakFlops,
    /// Device memory in bytes.
    pub memory_bytes: u64,
    /// Where the memory size is written (the target's name when invalid).
    pub memory_span: Span,
    /// Device memory bandwidth.
    pub bandwidth_bytes_per_s: f64,
    /// Bandwidth between devices of one node.
    pub interconnect_bytes_per_s: f64,
    /// Bandwidth from a device to devices of other nodes (default: `interconnect`).
    pub network_bytes_per_s: f64,
    /// Devices in one node (default 1).
    pub devices_per_node: i64,
    /// Compute cores per device, where the target says.
    pub cores: Option<i64>,
}

const FIELDS: &[FieldSpec] = &[
    FieldSpec::required("peak_f32", "peak_f32 = 157GFLOPS"),
    FieldSpec::optional("peak_f16"),
    FieldSpec::optional("peak_bf16"),
    FieldSpec::required("memory", "memory = 64GB"),
    FieldSpec::required("bandwidth", "bandwidth = 1.6TB/s"),
    FieldSpec::required("interconnect", "interconnect = 56GB/s"),
    FieldSpec::optional("network"),
    FieldSpec::optional("devices_per_node"),
    FieldSpec::optional("cores"),
];

/// Checks a `target` declaration.
pub fn check_target(decl: &DeclItem, file: FileId, diags: &mut Vec<Diagnostic>) -> TargetSpec {
    let rep = &mut Reporter::new(file, diags);
    let fields = Fields::collect(decl, FIELDS, Extra::Nothing, rep);
    let mut rate = |key: &str, unit: Unit, example: &str| {
        fields
            .value(key, rep)
            .and_then(|v| rep.quantity(&v, unit, example))
    };
    let f32 = rate("peak_f32", Unit::Flops, "157GFLOPS");
    let f16 = rate("peak_f16", Unit::Flops, "312TFLOPS");
    let bf16 = rate("peak_bf16", Unit::Flops, "312TFLOPS");
    let bandwidth = rate("bandwidth", Unit::BytesPerSecond, "1.6TB/s");
    let interconnect = rate("interconnect", Unit::BytesPerSecond, "56GB/s");
    let network = rate("network", Unit::BytesPerSecond, "50GB/s");
    let memory = fields
        .value("memory", rep)
        .and_then(|v| rep.bytes(&v, "64GB"));
    let mut count = |key: &str, what: &str| {
        fields
            .value(key, rep)
            .and_then(|v| rep.positive_int(&v, what))
    };
    let devices_per_node = count("devices_per_node", "the number of devices per node");
    let cores = count("cores", "the number of cores");
    let f32 = f32.unwrap_or(1.0);
    TargetSpec {
        name: decl.name.clone(),
        file,
        peak_flops: PeakFlops {
            f32,
            f16: f16.unwrap_or(f32),
            bf16: bf16.unwrap_or(f32),
        },
        memory_bytes: memory.unwrap_or(0),
        memory_span: fields.expr("memory").map_or(decl.name.span, |e| e.span),
        bandwidth_bytes_per_s: bandwidth.unwrap_or(1.0),
        interconnect_bytes_per_s: interconnect.unwrap_or(1.0),
        network_bytes_per_s: network.or(interconnect).unwrap_or(1.0),
        devices_per_node: devices_per_node.unwrap_or(1),
        cores,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::{decl, span_of};
    use mslc_core::diag::Code;

    fn check(src: &str) -> (TargetSpec, Vec<Diagnostic>) {
        let mut diags = Vec::new();
        let target = check_target(&decl(src), FileId(0), &mut diags);
        (target, diags)
    }

    #[test]
    fn the_documented_target_is_valid() {
        let src = "pub target cpu {
            peak_f32 = 157GFLOPS, peak_f16 = 157GFLOPS, peak_bf16 = 157GFLOPS
            memory = 24GiB, bandwidth = 40GB/s, interconnect = 10GB/s
            devices_per_node = 1, cores = 2
        }";
        let (t, diags) = check(src);
        assert!(diags.is_empty(), "{diags:?}");
        assert_eq!(
            t.peak_flops,
            PeakFlops {
                f32: 157e9,
                f16: 157e9,
                bf16: 157e9
            }
        );
        assert_eq!(
            (t.memory_bytes, t.memory_span),
            (24 << 30, span_of(src, "24GiB", 0))
        );
        assert_eq!(
            (
                t.bandwidth_bytes_per_s,
                t.interconnect_bytes_per_s,
                t.network_bytes_per_s
            ),
            (40e9, 10e9, 10e9)
        );
        assert_eq!((t.devices_per_node, t.cores), (1, Some(2)));
    }

    #[test]
    fn low_precision_peaks_default_to_f32() {
        let (t, diags) = check("target npu { peak_f32 = 1PFLOPS, memory = 64GB, bandwidth = 1.6TB/s, interconnect = 56GB/s, peak_bf16 = 2 * 1PFLOPS }");
        assert!(diags.is_empty(), "{diags:?}");
        assert_eq!(
            t.peak_flops,
            PeakFlops {
                f32: 1e15,
                f16: 1e15,
                bf16: 2e15
            }
        );
        assert_eq!((t.devices_per_node, t.cores), (1, None));
    }

    #[test]
    fn wrong_units_and_missing_fields() {
        let src = "target Tpu { peak_f32 = 40GB/s, memory = 24GB/s, bandwidth = 0TB/s, devices_per_node = 0 }";
        let (_, diags) = check(src);
        let codes: Vec<Code> = diags.iter().map(|d| d.code).collect();
        assert_eq!(
            codes,
            vec![
                Code::E0501,
                Code::E0502,
                Code::E0502,
                Code::E0502,
                Code::E0502
            ]
        );
        assert_eq!(diags[0].primary.span, span_of(src, "Tpu", 0));
        assert_eq!(
            diags[0].help.as_deref(),
            Some("add `interconnect = 56GB/s`")
        );
        assert_eq!(diags[1].primary.span, span_of(src, "40GB/s", 0));
        assert_eq!(
            diags[1].message,
            "expected a compute rate, found a bandwidth"
        );
        assert_eq!(
            diags[1].help.as_deref(),
            Some("write a compute rate with its unit, e.g. `157GFLOPS`")
        );
        assert_eq!(diags[2].primary.span, span_of(src, "0TB/s", 0));
        assert_eq!(diags[3].message, "expected a size, found a bandwidth");
    }
}
