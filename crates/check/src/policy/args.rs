//! Binding the arguments of a setting written as a call (`dynamic(init: 1024)`,
//! `adamw(lr: 1e-4)`) or the fields of a record (`{stages: 2, micro_batches: 8}`) to the
//! parameters the setting knows, reporting unknown, repeated, surplus and missing ones.

use mslc_core::diag::Code;
use mslc_syntax::ast::{Ident, Span};

use super::report::Reporter;
use super::value::Value;
use crate::suggest;

/// A parameter of a call-like setting.
pub(crate) struct Param {
    /// Accepted names; the first is canonical, the others are MindSpore's spellings.
    pub names: &'static [&'static str],
    /// How to pass it, for the help of E0501; `None` when it has a default.
    pub required: Option<&'static str>,
}

impl Param {
    /// A parameter with a default.
    pub(crate) const fn optional(names: &'static [&'static str]) -> Self {
        Param {
            names,
            required: None,
        }
    }

    /// A parameter that must be given; `example` shows how.
    pub(crate) const fn required(names: &'static [&'static str], example: &'static str) -> Self {
        Param {
            names,
            required: Some(example),
        }
    }
}

/// Binds the arguments of `name(args)`; the result has one slot per parameter.
pub(crate) fn bind_call<'v>(
    name: &Ident,
    args: &'v [(Option<Ident>, Value)],
    span: Span,
    params: &[Param],
    rep: &mut Reporter,
) -> Vec<Option<&'v Value>> {
    let owner = format!("`{}`", name.name);
    let entries = args.iter().map(|(n, v)| (n.as_ref(), v));
    bind(
        entries,
        span,
        params,
        &Owner {
            name: &owner,
            record: false,
        },
        rep,
    )
}

/// Binds the fields of a record value describing `what`; the result has one slot per parameter.
pub(crate) fn bind_record<'v>(
    what: &str,
    fields: &'v [(Ident, Value)],
    span: Span,
    params: &[Param],
    rep: &mut Reporter,
) -> Vec<Option<&'v Value>> {
    let entries = fields.iter().map(|(n, v)| (Some(n), v));
    bind(
        entries,
        span,
        params,
        &Owner {
            name: what,
            record: true,
        },
        rep,
    )
}

/// What the arguments belong to: a call (named arguments) or a record (fields).
struct Owner<'n> {
    name: &'n str,
    record: bool,
}

fn bind<'v>(
    entries: impl Iterator<Item = (Option<&'v Ident>, &'v Value)>,
    span: Span,
    params: &[Param],
    owner: &Owner,
    rep: &mut Reporter,
) -> Vec<Option<&'v Value>> {
    let mut slots: Vec<Option<(Span, &'v Value)>> = vec![None; params.len()];
    let canonical: Vec<&str> = params.iter().map(|p| p.names[0]).collect();
    let (noun, unknown_code, twice_code) = if owner.record {
        ("field", Code::E0500, Code::E0502)
    } else {
        ("argument", Code::E0204, Code::E0204)
    };
    let mut named_seen = false;
    for (position, (name, value)) in entries.enumerate() {
        let (index, at) = match name {
            Some(name) => {
                named_seen = true;
                match params
                    .iter()
                    .position(|p| p.names.contains(&name.name.as_str()))
                {
                    Some(index) => (index, name.span),
                    None => {
                        let help = match suggest::closest(&name.name, canonical.iter().copied()) {
                            Some(best) => format!("did you mean `{best}`?"),
                            None => format!(
                                "{} takes {}",
                                owner.name,
                                suggest::one_of(canonical.iter().copied())
                            ),
                        };
                        let message = format!("unknown {noun} `{}` of {}", name.name, owner.name);
                        rep.push(
                            rep.error(unknown_code, name.span, message)
                                .with_label(format!("unknown {noun}"))
                                .with_help(help),
                        );
                        continue;
                    }
                }
            }
            None if named_seen => {
                let help = format!(
                    "name it, e.g. `{}: …`",
                    canonical.get(position).unwrap_or(&"name")
                );
                rep.invalid(
                    value.span,
                    "a positional argument cannot follow named ones".to_string(),
                    "positional after named",
                    help,
                );
                continue;
            }
            None if position >= params.len() => {
                let message = format!("{} takes at most {} arguments", owner.name, params.len());
                let help = format!(
                    "its arguments are {}",
                    suggest::one_of(canonical.iter().copied())
                );
                rep.push(
                    rep.error(Code::E0203, value.span, message)
                        .with_label("one argument too many")
                        .with_help(help),
                );
                continue;
            }
            None => (position, value.span),
        };
        match slots[index] {
            Some((first, _)) => rep.push(
                rep.error(
                    twice_code,
                    at,
                    format!("`{}` is given twice", canonical[index]),
                )
                .with_label("given again here")
                .with_related(rep.file(), first, "first given here")
                .with_help("remove one of them"),
            ),
            None => slots[index] = Some((at, value)),
        }
    }
    for (param, slot) in params.iter().zip(&slots) {
        if let (Some(example), None) = (param.required, slot) {
            rep.push(
                rep.error(
                    Code::E0501,
                    span,
                    format!("{} needs `{}`", owner.name, param.names[0]),
                )
                .with_label(format!("`{}` missing", param.names[0]))
                .with_help(format!("add `{example}`")),
            );
        }
    }
    slots.into_iter().map(|slot| slot.map(|(_, v)| v)).collect()
}

/// The argument's value converted by `convert`, or `default` when it was not given.
pub(crate) fn slot_or<T>(
    slot: Option<&Value>,
    default: T,
    rep: &mut Reporter,
    convert: impl FnOnce(&mut Reporter, &Value) -> Option<T>,
) -> Option<T> {
    match slot {
        Some(value) => convert(rep, value),
        None => Some(default),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::{field_expr, field_span as span_of};
    use crate::policy::value::{eval, Val};
    use mslc_core::diag::{Diagnostic, FileId};

    const PARAMS: &[Param] = &[
        Param::required(&["init", "init_loss_scale"], "init: 65536"),
        Param::optional(&["factor"]),
    ];

    fn bound(src: &str) -> (Vec<Option<Val>>, Vec<Diagnostic>) {
        let mut diags = Vec::new();
        let mut rep = Reporter::new(FileId(0), &mut diags);
        let value = eval(&field_expr(src), &mut rep).expect("evaluates");
        let slots = match &value.val {
            Val::Call(name, args) => bind_call(name, args, value.span, PARAMS, &mut rep),
            Val::Record(fields) => bind_record("the record", fields, value.span, PARAMS, &mut rep),
            _ => unreachable!("test inputs are calls or records"),
        };
        let slots = slots
            .into_iter()
            .map(|s| s.map(|v| v.val.clone()))
            .collect();
        (slots, diags)
    }

    #[test]
    fn positional_named_and_aliases() {
        assert_eq!(
            bound("d(1, factor: 3)").0,
            vec![Some(Val::Int(1)), Some(Val::Int(3))]
        );
        assert_eq!(
            bound("d(init_loss_scale: 8)").0,
            vec![Some(Val::Int(8)), None]
        );
        assert_eq!(
            bound("{factor: 2, init: 4}").0,
            vec![Some(Val::Int(4)), Some(Val::Int(2))]
        );
    }

    #[test]
    fn every_problem_is_reported() {
        let src = "d(factor: 2, 5, init: 1, init: 2, windw: 3)";
        let (slots, diags) = bound(src);
        assert_eq!(slots, vec![Some(Val::Int(1)), Some(Val::Int(2))]);
        let codes: Vec<Code> = diags.iter().map(|d| d.code).collect();
        assert_eq!(codes, vec![Code::E0502, Code::E0204, Code::E0204]);
        assert_eq!(diags[0].primary.span, span_of(src, "5", 0));
        assert_eq!(diags[1].primary.span, span_of(src, "init", 1));
        assert_eq!(diags[1].related[0].span, span_of(src, "init", 0));
        assert_eq!(diags[2].primary.span, span_of(src, "windw", 0));

        let (_, diags) = bound("d(1, 2, 3)");
        assert_eq!(
            (diags[0].code, diags[0].message.as_str()),
            (Code::E0203, "`d` takes at most 2 arguments")
        );
        let (_, diags) = bound("{factor: 2}");
        assert_eq!(diags[0].code, Code::E0501);
        assert_eq!(diags[0].help.as_deref(), Some("add `init: 65536`"));
        let (_, diags) = bound("{init: 1, colour: 2, init: 3}");
        let codes: Vec<Code> = diags.iter().map(|d| d.code).collect();
        assert_eq!(codes, vec![Code::E0500, Code::E0502]);
    }
}
