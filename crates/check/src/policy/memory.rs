//! `memory` policies: the device-memory budget (MindSpore's `max_device_memory`) and how much
//! of the forward pass is recomputed in the backward pass to fit it.

use mslc_core::diag::{Code, Diagnostic, FileId};
use mslc_syntax::ast::{DeclItem, Ident, Span};

use super::fields::{Extra, FieldSpec, Fields};
use super::report::{Choices, Reporter};

/// Which activations are recomputed instead of kept for the backward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recompute {
    /// Keep every activation.
    None,
    /// Keep each layer's input and recompute the layer in the backward.
    Full,
    /// Keep the results of matmul-like ops and recompute the cheap ones (norms, elementwise).
    Selective,
    /// The least recomputation that fits the budget, chosen by the planner.
    Auto,
}

/// A checked `memory` policy.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryPolicy {
    /// The policy's name.
    pub name: Ident,
    /// The file it is declared in.
    pub file: FileId,
    /// Bytes a device may use, if limited.
    pub max_device_memory: Option<u64>,
    /// Where the limit is written (the policy's name when it is not).
    pub max_device_memory_span: Span,
    /// Recompute strategy (default none).
    pub recompute: Recompute,
}

const FIELDS: &[FieldSpec] = &[
    FieldSpec::optional("max_device_memory"),
    FieldSpec::optional("recompute"),
];

const RECOMPUTES: &Choices<Recompute> = &[
    (&["none"], Recompute::None),
    (&["full"], Recompute::Full),
    (&["selective"], Recompute::Selective),
    (&["auto"], Recompute::Auto),
];

/// Checks a `memory` declaration.
pub fn check_memory(decl: &DeclItem, file: FileId, diags: &mut Vec<Diagnostic>) -> MemoryPolicy {
    let rep = &mut Reporter::new(file, diags);
    let fields = Fields::collect(decl, FIELDS, Extra::Nothing, rep);
    let max_device_memory = fields
        .value("max_device_memory", rep)
        .and_then(|v| rep.bytes(&v, "31GB"));
    let recompute = fields
        .value("recompute", rep)
        .and_then(|v| rep.word_coded(&v, "recompute strategy", RECOMPUTES, Code::E0511));
    MemoryPolicy {
        name: decl.name.clone(),
        file,
        max_device_memory,
        max_device_memory_span: fields
            .expr("max_device_memory")
            .map_or(decl.name.span, |e| e.span),
        recompute: recompute.unwrap_or(Recompute::None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::{decl, span_of};
    use mslc_core::diag::Code;

    fn check(src: &str) -> (MemoryPolicy, Vec<Diagnostic>) {
        let mut diags = Vec::new();
        let policy = check_memory(&decl(src), FileId(0), &mut diags);
        (policy, diags)
    }

    #[test]
    fn budget_and_recompute() {
        let src = "memory Budget { max_device_memory = 31GB, recompute = auto }";
        let (policy, diags) = check(src);
        assert!(diags.is_empty(), "{diags:?}");
        assert_eq!(policy.max_device_memory, Some(31_000_000_000));
        assert_eq!(policy.max_device_memory_span, span_of(src, "31GB", 0));
        assert_eq!(policy.recompute, Recompute::Auto);
        let (policy, _) = check("memory M { max_device_memory = 28GiB }");
        assert_eq!(
            (policy.max_device_memory, policy.recompute),
            (Some(28 << 30), Recompute::None)
        );
        let (policy, _) = check("memory M {}");
        assert_eq!(policy.max_device_memory, None);
    }

    #[test]
    fn bad_values() {
        let src = "memory M { max_device_memory = 31, recompute = ful, recomptue = full }";
        let (_, diags) = check(src);
        let codes: Vec<Code> = diags.iter().map(|d| d.code).collect();
        assert_eq!(codes, vec![Code::E0500, Code::E0502, Code::E0511]);
        assert_eq!(diags[0].help.as_deref(), Some("did you mean `recompute`?"));
        assert_eq!(diags[1].primary.span, span_of(src, "31", 0));
        assert_eq!(diags[1].message, "expected a size, found the integer `31`");
        assert_eq!(diags[2].help.as_deref(), Some("did you mean `full`? recompute strategy is one of `none`, `full`, `selective` or `auto`"));
    }
}
