//! Shard rules (`shard "pattern" = [mp, _]`): reading them from a parallel policy, and checking
//! them against the parameters of the model they will shard.

use mslc_core::diag::{Code, Diagnostic};
use mslc_syntax::ast::{Expr, Ident, Span};

use super::parallel::ParallelPolicy;
use super::pattern::ShardPattern;
use super::report::{Reporter, WithRelatedIf};
use super::value::{eval, Val};
use crate::suggest;

/// One `shard "pattern" = [axis | _, …]` rule.
#[derive(Clone, Debug, PartialEq)]
pub struct ShardRule {
    /// Which parameters it applies to.
    pub pattern: ShardPattern,
    /// The pattern string in the source, quotes included.
    pub pattern_span: Span,
    /// Per tensor dim, the mesh axis it is split over, or `None` (`_`) for not split.
    pub axes: Vec<Option<String>>,
    /// Where each entry of `axes` is written.
    pub axis_spans: Vec<Span>,
    /// The whole spec `[…]`.
    pub span: Span,
}

/// Reads one rule, checking the pattern's syntax and that each axis is in the mesh (`axes`,
/// declared at `mesh_span`). `None` when the pattern or the spec's form is invalid.
pub(crate) fn shard_rule(
    pattern: &Ident,
    spec: &Expr,
    axes: &[&str],
    mesh_span: Option<Span>,
    rep: &mut Reporter,
) -> Option<ShardRule> {
    let compiled = match ShardPattern::parse(&pattern.name) {
        Ok(compiled) => Some(compiled),
        Err(error) => {
            // Point inside the quotes when the text maps byte for byte (no escapes).
            let span = if pattern.span.len() == pattern.name.len() + 2 && !error.at.is_empty() {
                let base = pattern.span.start + 1;
                Span::new(base + error.at.start, base + error.at.end)
            } else {
                pattern.span
            };
            let help = "`*` matches one path segment, `**` any number, `{a,b}` either alternative";
            rep.invalid(
                span,
                format!("invalid shard pattern: {}", error.message),
                "invalid pattern",
                help.to_string(),
            );
            None
        }
    };
    let spec_value = eval(spec, rep)?;
    let Val::List(items) = &spec_value.val else {
        let help = "write one entry per tensor dim, e.g. `[mp, _]`".to_string();
        rep.expected(&spec_value, "a list of mesh axes and `_`", help);
        return None;
    };
    let mut entries: Vec<Option<String>> = Vec::new();
    let mut spans: Vec<Span> = Vec::new();
    let mut well_formed = true;
    for item in items {
        let axis = match (&item.val, item.word()) {
            (Val::Wildcard, _) => None,
            (_, Some(word)) => Some(word),
            _ => {
                let help = "each entry is a mesh axis that splits the dim, or `_` to keep it whole"
                    .to_string();
                rep.expected(item, "a mesh axis or `_`", help);
                well_formed = false;
                continue;
            }
        };
        if let Some(axis) = axis {
            if !axes.contains(&axis.name.as_str()) {
                let diagnostic = rep
                    .error(
                        Code::E0504,
                        axis.span,
                        format!("unknown mesh axis `{}`", axis.name),
                    )
                    .with_label("not an axis of the mesh")
                    .with_related_if(rep.file(), mesh_span, "mesh declared here")
                    .with_help(suggest::help_for(&axis.name, axes));
                rep.push(diagnostic);
            } else if let Some(first) = entries
                .iter()
                .position(|e| e.as_deref() == Some(&axis.name))
            {
                rep.push(
                    rep.error(
                        Code::E0502,
                        axis.span,
                        format!("axis `{}` splits two dims of the same tensor", axis.name),
                    )
                    .with_label("used again here")
                    .with_related(rep.file(), spans[first], "first used here")
                    .with_help("an axis can split at most one dim; use `_` for one of them"),
                );
            }
        }
        entries.push(axis.map(|a| a.name.clone()));
        spans.push(item.span);
    }
    Some(ShardRule {
        pattern: compiled?,
        pattern_span: pattern.span,
        axes: well_formed.then_some(entries)?,
        axis_spans: spans,
        span: spec_value.span,
    })
}

/// Checks the policy's shard rules against the model's parameters, given as (path, shape):
/// each pattern matches at least one parameter (E0508), each spec has one entry per dim of every
/// parameter it matches (E0505), each split dim is divisible by its axis size (E0506), and no
/// parameter is matched by two rules with different specs (E0502). Axes missing from the mesh
/// were reported by [`check_parallel`](super::check_parallel) and are skipped here. `complete`
/// is false when the model had errors, so `params` may lack some: a pattern matching nothing is
/// then a follow-on error and is not reported.
pub fn check_shards_against_params(
    policy: &ParallelPolicy,
    params: &[(String, Vec<i64>)],
    complete: bool,
    diags: &mut Vec<Diagnostic>,
) {
    let rep = &mut Reporter::new(policy.file, diags);
    // For each parameter, the first rule that matched it.
    let mut claimed: Vec<Option<usize>> = vec![None; params.len()];
    for (r, rule) in policy.shards.iter().enumerate() {
        let matched: Vec<usize> = (0..params.len())
            .filter(|&i| rule.pattern.matches(&params[i].0))
            .collect();
        if matched.is_empty() {
            if complete {
                no_match(rule, params, rep);
            }
            continue;
        }
        let (fitting, misfits): (Vec<usize>, Vec<usize>) = matched
            .iter()
            .partition(|&&i| params[i].1.len() == rule.axes.len());
        if let Some(&first) = misfits.first() {
            wrong_rank(rule, &params[first], misfits.len() - 1, rep);
        }
        for (dim, axis) in rule.axes.iter().enumerate() {
            let Some((axis, size)) = axis
                .as_deref()
                .and_then(|a| Some((a, policy.axis_size(a)?)))
            else {
                continue;
            };
            let offenders: Vec<usize> = fitting
                .iter()
                .copied()
                .filter(|&i| params[i].1[dim] % size != 0)
                .collect();
            if let Some(&first) = offenders.first() {
                let (path, shape) = &params[first];
                let mut diagnostic = rep
                    .error(
                        Code::E0506,
                        rule.axis_spans[dim],
                        format!("dim {dim} of `{path}` has size {}, which `{axis}` = {size} does not divide", shape[dim]),
                    )
                    .with_label(format!("splits dim {dim} into {size} parts"))
                    .with_related(rep.file(), policy.mesh_span, format!("`{axis}` has size {size} here"));
                let others = offenders.len() - 1;
                diagnostic = diagnostic.with_help(if others > 0 {
                    format!("{others} more matched parameters have the same problem; use `_` to keep the dim whole, or a smaller axis")
                } else {
                    "use `_` to keep the dim whole, or an axis whose size divides it".to_string()
                });
                rep.push(diagnostic);
            }
        }
        let mut reported: Vec<usize> = Vec::new();
        for &i in &matched {
            match claimed[i] {
                None => claimed[i] = Some(r),
                Some(earlier)
                    if policy.shards[earlier].axes != rule.axes && !reported.contains(&earlier) =>
                {
                    reported.push(earlier);
                    rep.push(
                        rep.error(
                            Code::E0502,
                            rule.pattern_span,
                            format!(
                                "`{}` is matched by two shard rules with different specs",
                                params[i].0
                            ),
                        )
                        .with_label("second rule matching it")
                        .with_related(
                            rep.file(),
                            policy.shards[earlier].pattern_span,
                            "first rule matching it",
                        )
                        .with_help("make the patterns disjoint, or give them the same spec"),
                    );
                }
                Some(_) => {}
            }
        }
    }
}

fn no_match(rule: &ShardRule, params: &[(String, Vec<i64>)], rep: &mut Reporter) {
    let help = match rule.pattern.nearest(params.iter().map(|(p, _)| p.as_str())) {
        Some(path) => format!("the closest parameter path is `{path}`"),
        None => "the model has no parameters".to_string(),
    };
    rep.push(
        rep.error(
            Code::E0508,
            rule.pattern_span,
            format!("shard pattern \"{}\" matches no parameter", rule.pattern),
        )
        .with_label("matches nothing")
        .with_help(help),
    );
}

fn wrong_rank(
    rule: &ShardRule,
    (path, shape): &(String, Vec<i64>),
    others: usize,
    rep: &mut Reporter,
) {
    let also = match others {
        0 => String::new(),
        n => format!(" (and {n} more matched parameters)"),
    };
    let message = format!(
        "shard spec has {} entries but `{path}` has rank {}{also}",
        rule.axes.len(),
        shape.len()
    );
    rep.push(
        rep.error(Code::E0505, rule.span, message)
            .with_label(format!("{} entries", rule.axes.len()))
            .with_related(
                rep.file(),
                rule.pattern_span,
                format!("matches `{path}` of shape {shape:?}"),
            )
            .with_help("write one entry per dim: a mesh axis to split it, `_` to keep it whole"),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::check_parallel;
    use crate::policy::testing::{decl, span_of};
    use mslc_core::diag::FileId;

    /// A two-layer LLaMA-style parameter list with hidden 64 and ffn 172.
    fn params() -> Vec<(String, Vec<i64>)> {
        let mut params = vec![("model.embed_tokens.weight".to_string(), vec![1000, 64])];
        for i in 0..2 {
            for p in ["q", "k", "v", "o"] {
                params.push((
                    format!("model.layers.{i}.self_attn.{p}_proj.weight"),
                    vec![64, 64],
                ));
            }
            params.push((
                format!("model.layers.{i}.mlp.up_proj.weight"),
                vec![172, 64],
            ));
            params.push((format!("model.layers.{i}.input_layernorm.weight"), vec![64]));
        }
        params.push(("lm_head.weight".to_string(), vec![1000, 64]));
        params
    }

    fn check(rules: &str) -> (String, Vec<Diagnostic>) {
        let src = format!("parallel P {{ mesh = {{ dp: 2, mp: 8 }}, mode = semi_auto\n{rules} }}");
        let mut diags = Vec::new();
        let policy = check_parallel(&decl(&src), FileId(0), &mut diags);
        assert!(diags.is_empty(), "{diags:?}");
        check_shards_against_params(&policy, &params(), true, &mut diags);
        (src, diags)
    }

    fn codes(diags: &[Diagnostic]) -> Vec<Code> {
        diags.iter().map(|d| d.code).collect()
    }

    #[test]
    fn valid_rules_pass() {
        let (_, diags) = check(
            r#"shard "model.layers.*.self_attn.{q,k,v}_proj.weight" = [mp, _]
               shard "model.layers.*.self_attn.o_proj.weight" = [_, mp]
               shard "{model.embed_tokens,lm_head}.weight" = [dp, mp]
               shard "**.input_layernorm.weight" = [_]"#,
        );
        assert!(diags.is_empty(), "{diags:?}");
    }

    #[test]
    fn pattern_matching_nothing_suggests_the_nearest_path() {
        let (src, diags) = check(r#"shard "model.layers.*.self_atn.q_proj.weight" = [mp, _]"#);
        assert_eq!(codes(&diags), vec![Code::E0508]);
        assert_eq!(
            diags[0].primary.span,
            span_of(&src, "\"model.layers.*.self_atn.q_proj.weight\"", 0)
        );
        assert_eq!(
            diags[0].help.as_deref(),
            Some("the closest parameter path is `model.layers.0.self_attn.q_proj.weight`")
        );
    }

    #[test]
    fn rank_and_divisibility_are_reported_once_per_rule() {
        let (src, diags) = check(
            r#"shard "model.layers.*.self_attn.{q,k}_proj.weight" = [mp, _, _]
               shard "model.layers.*.mlp.up_proj.weight" = [mp, _]
               shard "model.layers.*.input_layernorm.weight" = [_]"#,
        );
        assert_eq!(codes(&diags), vec![Code::E0505, Code::E0506]);
        assert_eq!(diags[0].primary.span, span_of(&src, "[mp, _, _]", 0));
        assert_eq!(diags[0].message, "shard spec has 3 entries but `model.layers.0.self_attn.q_proj.weight` has rank 2 (and 3 more matched parameters)");
        assert_eq!(diags[1].primary.span, span_of(&src, "mp", 2));
        assert_eq!(diags[1].message, "dim 0 of `model.layers.0.mlp.up_proj.weight` has size 172, which `mp` = 8 does not divide");
        assert_eq!(
            diags[1].related[0].span,
            span_of(&src, "{ dp: 2, mp: 8 }", 0)
        );
        assert!(diags[1]
            .help
            .as_deref()
            .unwrap_or("")
            .starts_with("1 more matched parameters"));
    }

    #[test]
    fn overlapping_rules_must_agree() {
        let (src, diags) = check(
            r#"shard "model.layers.*.self_attn.*.weight" = [mp, _]
               shard "model.layers.*.self_attn.q_proj.weight" = [mp, _]
               shard "model.layers.**.weight" = [_, mp]"#,
        );
        assert_eq!(codes(&diags), vec![Code::E0505, Code::E0502]);
        assert_eq!(
            diags[1].primary.span,
            span_of(&src, "\"model.layers.**.weight\"", 0)
        );
        assert_eq!(
            diags[1].related[0].span,
            span_of(&src, "\"model.layers.*.self_attn.*.weight\"", 0)
        );
    }

    #[test]
    fn a_model_without_parameters() {
        let src = r#"parallel P { mesh = { mp: 2 }, mode = semi_auto, shard "w" = [mp] }"#;
        let mut diags = Vec::new();
        let policy = check_parallel(&decl(src), FileId(0), &mut diags);
        check_shards_against_params(&policy, &[], true, &mut diags);
        assert_eq!(
            diags[0].help.as_deref(),
            Some("the model has no parameters")
        );
    }

    #[test]
    fn a_model_with_errors_reports_no_unmatched_pattern_but_still_checks_matches() {
        let src = format!(
            "parallel P {{ mesh = {{ dp: 2, mp: 8 }}, mode = semi_auto\n{} }}",
            r#"shard "nothing.*" = [mp] shard "lm_head.weight" = [mp]"#
        );
        let mut diags = Vec::new();
        let policy = check_parallel(&decl(&src), FileId(0), &mut diags);
        check_shards_against_params(&policy, &params(), false, &mut diags);
        assert_eq!(codes(&diags), vec![Code::E0505]);
    }
}
