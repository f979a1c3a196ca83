//! The field list of one declaration, checked against the fields its kind allows: unknown
//! fields (E0500), fields set twice (E0502) and missing required fields (E0501) are reported
//! once here, so each policy checker only reads the values it knows.

use mslc_core::diag::Code;
use mslc_syntax::ast::{DeclItem, Expr, Field, Ident, TensorType};

use super::report::Reporter;
use super::value::{eval, Value};
use crate::suggest;

/// One `key = value` field a declaration kind accepts.
pub(crate) struct FieldSpec {
    key: &'static str,
    /// How to write the field, for the help of E0501; `None` when it is optional.
    required: Option<&'static str>,
}

impl FieldSpec {
    /// A field that may be left out.
    pub(crate) const fn optional(key: &'static str) -> Self {
        FieldSpec {
            key,
            required: None,
        }
    }

    /// A field that must be set; `example` shows a way to set it.
    pub(crate) const fn required(key: &'static str, example: &'static str) -> Self {
        FieldSpec {
            key,
            required: Some(example),
        }
    }
}

/// Which fields other than `key = value` a declaration kind accepts.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Extra {
    /// Neither shard rules nor labels.
    Nothing,
    /// `shard "pattern" = [..]` (parallel policies).
    ShardRules,
    /// `name: dtype[dims]` (train declarations).
    Labels,
}

/// The fields of a declaration, each known key set at most once.
pub(crate) struct Fields<'a> {
    assigns: Vec<(&'a Ident, &'a Expr)>,
    /// `shard` rules as (pattern, spec), when the kind allows them.
    pub(crate) shards: Vec<(&'a Ident, &'a Expr)>,
    /// Label declarations, when the kind allows them.
    pub(crate) labels: Vec<(&'a Ident, &'a TensorType)>,
}

impl<'a> Fields<'a> {
    /// Sorts the declaration's fields, reporting unknown, repeated and missing ones.
    pub(crate) fn collect(
        decl: &'a DeclItem,
        specs: &[FieldSpec],
        extra: Extra,
        rep: &mut Reporter,
    ) -> Self {
        let kind = decl.kind.keyword();
        let keys: Vec<&str> = specs.iter().map(|s| s.key).collect();
        let mut fields = Fields {
            assigns: Vec::new(),
            shards: Vec::new(),
            labels: Vec::new(),
        };
        for field in &decl.fields {
            match field {
                Field::Assign { key, value, .. } => {
                    if !keys.contains(&key.name.as_str()) {
                        let help = match suggest::closest(&key.name, keys.iter().copied()) {
                            Some(best) => format!("did you mean `{best}`?"),
                            None => format!(
                                "a {kind} declaration has the fields {}",
                                suggest::one_of(keys.iter().copied())
                            ),
                        };
                        rep.push(
                            rep.error(
                                Code::E0500,
                                key.span,
                                format!(
                                    "unknown field `{}` in {kind} `{}`",
                                    key.name, decl.name.name
                                ),
                            )
                            .with_label("unknown field")
                            .with_help(help),
                        );
                    } else if let Some(first) = fields.key(&key.name) {
                        rep.push(
                            rep.error(
                                Code::E0502,
                                key.span,
                                format!("field `{}` is set twice", key.name),
                            )
                            .with_label("set again here")
                            .with_related(rep.file(), first.span, "first set here")
                            .with_help("remove one of them"),
                        );
                    } else {
                        fields.assigns.push((key, value));
                    }
                }
                Field::Shard { pattern, value, .. } if extra == Extra::ShardRules => {
                    fields.shards.push((pattern, value));
                }
                Field::Shard { pattern, .. } => rep.push(
                    rep.error(
                        Code::E0500,
                        pattern.span,
                        format!("a {kind} declaration has no shard rules"),
                    )
                    .with_label("shard rule outside a parallel policy")
                    .with_help("move it into a `parallel` policy"),
                ),
                Field::Typed { name, ty, .. } if extra == Extra::Labels => {
                    fields.labels.push((name, ty))
                }
                Field::Typed { name, .. } => rep.push(
                    rep.error(
                        Code::E0500,
                        name.span,
                        format!("a {kind} declaration has no labels"),
                    )
                    .with_label("label declaration outside a train declaration")
                    .with_help(format!("set a field with `{} = value`", name.name)),
                ),
            }
        }
        for spec in specs {
            if let (Some(example), None) = (spec.required, fields.key(spec.key)) {
                rep.push(
                    rep.error(
                        Code::E0501,
                        decl.name.span,
                        format!("{kind} `{}` does not set `{}`", decl.name.name, spec.key),
                    )
                    .with_label(format!("missing `{}`", spec.key))
                    .with_help(format!("add `{example}`")),
                );
            }
        }
        fields
    }

    /// The key of a field that is set.
    pub(crate) fn key(&self, key: &str) -> Option<&'a Ident> {
        self.assigns
            .iter()
            .find(|(k, _)| k.name == key)
            .map(|(k, _)| *k)
    }

    /// The value of a field that is set, evaluated; `None` if unset or reported as invalid.
    pub(crate) fn value(&self, key: &str, rep: &mut Reporter) -> Option<Value> {
        let (_, expr) = self.assigns.iter().find(|(k, _)| k.name == key)?;
        eval(expr, rep)
    }

    /// The expression of a field that is set, unevaluated.
    pub(crate) fn expr(&self, key: &str) -> Option<&'a Expr> {
        self.assigns
            .iter()
            .find(|(k, _)| k.name == key)
            .map(|(_, e)| *e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::{decl, span_of};
    use mslc_core::diag::{Diagnostic, FileId};

    const SPECS: &[FieldSpec] = &[
        FieldSpec::required("level", "level = O2"),
        FieldSpec::optional("compute"),
    ];

    fn collect(src: &str, extra: Extra) -> (usize, usize, Vec<Diagnostic>) {
        let decl = decl(src);
        let mut diags = Vec::new();
        let fields = Fields::collect(
            &decl,
            SPECS,
            extra,
            &mut Reporter::new(FileId(0), &mut diags),
        );
        (fields.shards.len(), fields.labels.len(), diags)
    }

    #[test]
    fn reports_unknown_repeated_and_missing_fields() {
        let src = "precision P {\n compute = f16\n levl = O2\n compute = bf16\n colour = 3\n}";
        let (_, _, diags) = collect(src, Extra::Nothing);
        let codes: Vec<Code> = diags.iter().map(|d| d.code).collect();
        assert_eq!(
            codes,
            vec![Code::E0500, Code::E0502, Code::E0500, Code::E0501]
        );
        assert_eq!(diags[0].primary.span, span_of(src, "levl", 0));
        assert_eq!(diags[0].help.as_deref(), Some("did you mean `level`?"));
        assert_eq!(diags[1].primary.span, span_of(src, "compute", 1));
        assert_eq!(diags[1].related[0].span, span_of(src, "compute", 0));
        assert_eq!(
            diags[2].help.as_deref(),
            Some("a precision declaration has the fields `level` or `compute`")
        );
        assert_eq!(diags[3].primary.span, span_of(src, "P", 0));
        assert_eq!(diags[3].help.as_deref(), Some("add `level = O2`"));
    }

    #[test]
    fn shard_rules_and_labels_only_where_allowed() {
        let src = "parallel P { level = O1, shard \"a.*\" = [_], x: f32[2] }";
        let (shards, labels, diags) = collect(src, Extra::ShardRules);
        assert_eq!((shards, labels), (1, 0));
        assert_eq!(diags.len(), 1);
        assert_eq!(diags[0].primary.span, span_of(src, "x", 0));
        let (shards, labels, diags) = collect(src, Extra::Labels);
        assert_eq!((shards, labels), (0, 1));
        assert_eq!(diags[0].primary.span, span_of(src, "\"a.*\"", 0));
    }
}
