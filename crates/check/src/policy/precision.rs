//! `precision` policies: MindSpore's automatic mixed-precision levels O0–O3, the low-precision
//! type, the ops kept in f32, loss scaling and batch-norm handling, with MindSpore's defaults
//! per level.

use mslc_core::diag::{Code, Diagnostic, FileId};
use mslc_syntax::ast::{DeclItem, Ident, Span};

use super::args::{bind_call, slot_or, Param};
use super::fields::{Extra, FieldSpec, Fields};
use super::report::{Choices, Reporter};
use super::value::{Val, Value};
use crate::suggest;

pub use mslc_core::precision::{AmpLevel, LossScale, LowPrecision};
use mslc_core::precision::{DYNAMIC_FACTOR, DYNAMIC_INIT, DYNAMIC_WINDOW, FIXED_DROP, FIXED_SCALE};

/// A checked `precision` policy.
#[derive(Clone, Debug, PartialEq)]
pub struct PrecisionPolicy {
    /// The policy's name.
    pub name: Ident,
    /// The file it is declared in.
    pub file: FileId,
    /// The amp level.
    pub level: AmpLevel,
    /// The low-precision type (default f16, as in MindSpore).
    pub compute: LowPrecision,
    /// Ops (registry names) kept in f32 besides the level's own black list, without repeats.
    pub keep_f32: Vec<String>,
    /// Loss scaling (default per level).
    pub loss_scale: LossScale,
    /// Whether batch norms stay in f32 (default per level).
    pub keep_batchnorm_f32: bool,
}

const FIELDS: &[FieldSpec] = &[
    FieldSpec::required("level", "level = O2"),
    FieldSpec::optional("compute"),
    FieldSpec::optional("keep_f32"),
    FieldSpec::optional("loss_scale"),
    FieldSpec::optional("keep_batchnorm_f32"),
];

const LEVELS: &Choices<AmpLevel> = &[
    (&["O0"], AmpLevel::O0),
    (&["O1"], AmpLevel::O1),
    (&["O2"], AmpLevel::O2),
    (&["O3"], AmpLevel::O3),
];

const LOW_PRECISIONS: &Choices<LowPrecision> = &[
    (&["f16", "float16", "fp16"], LowPrecision::F16),
    (&["bf16", "bfloat16"], LowPrecision::BF16),
];

/// The loss-scale forms, before their arguments are read.
#[derive(Clone, Copy)]
enum ScaleKind {
    None,
    Fixed,
    Dynamic,
}

const LOSS_SCALES: &Choices<ScaleKind> = &[
    (&["none"], ScaleKind::None),
    (&["fixed"], ScaleKind::Fixed),
    (&["dynamic"], ScaleKind::Dynamic),
];

const FIXED_PARAMS: &[Param] = &[
    Param::optional(&["scale", "loss_scale"]),
    Param::optional(&["drop_overflow_update"]),
];

const DYNAMIC_PARAMS: &[Param] = &[
    Param::optional(&["init", "init_loss_scale"]),
    Param::optional(&["factor", "scale_factor"]),
    Param::optional(&["window", "scale_window"]),
];

/// Checks a `precision` declaration. `is_op` says whether a name is a registered op and
/// `op_names` lists them all (for did-you-mean). Fields left out, or reported as invalid, take
/// MindSpore's defaults for the level (O0 if the level itself is missing or invalid).
pub fn check_precision(
    decl: &DeclItem,
    file: FileId,
    is_op: &dyn Fn(&str) -> bool,
    op_names: &[&str],
    diags: &mut Vec<Diagnostic>,
) -> PrecisionPolicy {
    let rep = &mut Reporter::new(file, diags);
    let fields = Fields::collect(decl, FIELDS, Extra::Nothing, rep);
    let level = fields
        .value("level", rep)
        .and_then(|v| Some((rep.word(&v, "amp level", LEVELS)?, v.span)));
    let compute = fields
        .value("compute", rep)
        .and_then(|v| rep.word(&v, "low-precision type", LOW_PRECISIONS));
    let keep_f32 = fields
        .value("keep_f32", rep)
        .map(|v| op_list(&v, is_op, op_names, rep))
        .unwrap_or_default();
    let loss_scale = fields
        .value("loss_scale", rep)
        .and_then(|v| loss_scale(&v, rep));
    let keep_batchnorm_f32 = fields
        .value("keep_batchnorm_f32", rep)
        .and_then(|v| rep.flag(&v, "keep_batchnorm_f32"));
    if let Some(level) = level {
        warn_ineffective(level, &fields, rep);
    }
    let level = level.map_or(AmpLevel::O0, |(level, _)| level);
    PrecisionPolicy {
        name: decl.name.clone(),
        file,
        level,
        compute: compute.unwrap_or(LowPrecision::F16),
        keep_f32,
        loss_scale: loss_scale.unwrap_or(level.default_loss_scale()),
        keep_batchnorm_f32: keep_batchnorm_f32.unwrap_or(level.default_keep_batchnorm_f32()),
    }
}

/// The op names of `keep_f32`, each checked against the registry (E0503).
fn op_list(
    value: &Value,
    is_op: &dyn Fn(&str) -> bool,
    op_names: &[&str],
    rep: &mut Reporter,
) -> Vec<String> {
    let Val::List(items) = &value.val else {
        let help = "list the ops, e.g. `keep_f32 = [softmax, rms_norm]`".to_string();
        rep.expected(value, "a list of op names", help);
        return Vec::new();
    };
    let mut ops: Vec<String> = Vec::new();
    for item in items {
        let Some(op) = item.word() else {
            rep.expected(
                item,
                "an op name",
                "write op names as words, e.g. `softmax`".to_string(),
            );
            continue;
        };
        if !is_op(&op.name) {
            let help = match suggest::closest(&op.name, op_names.iter().copied()) {
                Some(best) => format!("did you mean `{best}`?"),
                None => "`docs/ops.md` lists the op names".to_string(),
            };
            rep.push(
                rep.error(Code::E0503, op.span, format!("unknown op `{}`", op.name))
                    .with_label("not an op in the registry")
                    .with_help(help),
            );
        } else if !ops.contains(&op.name) {
            ops.push(op.name.clone());
        }
    }
    ops
}

fn loss_scale(value: &Value, rep: &mut Reporter) -> Option<LossScale> {
    let (name, args) = match &value.val {
        Val::Call(name, args) => (name, args.as_slice()),
        _ if value.word().is_some() => {
            return Some(match rep.word(value, "loss scale", LOSS_SCALES)? {
                ScaleKind::None => LossScale::None,
                ScaleKind::Fixed => LossScale::FIXED,
                ScaleKind::Dynamic => LossScale::DYNAMIC,
            })
        }
        _ => {
            let help =
                "write `none`, `fixed(128)` or `dynamic(init: 65536, factor: 2, window: 2000)`";
            rep.expected(value, "a loss scale", help.to_string());
            return None;
        }
    };
    let callee = Value {
        val: Val::Name(vec![name.clone()]),
        span: name.span,
    };
    match rep.word(&callee, "loss scale", LOSS_SCALES)? {
        ScaleKind::None => {
            let help = "write `loss_scale = none`".to_string();
            rep.invalid(
                value.span,
                "`none` takes no arguments".to_string(),
                "arguments to `none`",
                help,
            );
            None
        }
        ScaleKind::Fixed => {
            let slots = bind_call(name, args, value.span, FIXED_PARAMS, rep);
            let scale = slot_or(slots[0], FIXED_SCALE, rep, |rep, v| {
                at_least_one(rep, v, "the loss scale")
            });
            let drop = slot_or(slots[1], FIXED_DROP, rep, |rep, v| {
                rep.flag(v, "drop_overflow_update")
            });
            Some(LossScale::Fixed {
                scale: scale?,
                drop_overflow_update: drop?,
            })
        }
        ScaleKind::Dynamic => {
            let slots = bind_call(name, args, value.span, DYNAMIC_PARAMS, rep);
            let init = slot_or(slots[0], DYNAMIC_INIT, rep, |rep, v| {
                at_least_one(rep, v, "the initial loss scale")
            });
            let factor = slot_or(slots[1], DYNAMIC_FACTOR, rep, |rep, v| {
                let f = rep.number(v, "the scale factor")?;
                let help = "the scale grows and shrinks by this factor; MindSpore's default is 2";
                rep.ensure(
                    f > 1.0,
                    v,
                    format!("the scale factor must be greater than 1, found {f}"),
                    help,
                )
                .then_some(f)
            });
            let window = slot_or(slots[2], DYNAMIC_WINDOW, rep, |rep, v| {
                rep.positive_int(v, "the scale window").map(|w| w as u64)
            });
            Some(LossScale::Dynamic {
                init: init?,
                factor: factor?,
                window: window?,
            })
        }
    }
}

fn at_least_one(rep: &mut Reporter, value: &Value, what: &str) -> Option<f64> {
    let x = rep.number(value, what)?;
    let ok = rep.ensure(
        x >= 1.0,
        value,
        format!("{what} must be at least 1, found {x}"),
        "MindSpore's loss scale managers reject scales below 1",
    );
    ok.then_some(x)
}

/// W0002 for settings the level ignores: at O0 nothing runs in low precision; MindSpore reads
/// `keep_batchnorm_fp32` only at O2 and O3.
fn warn_ineffective((level, level_span): (AmpLevel, Span), fields: &Fields, rep: &mut Reporter) {
    let ignored: &[&str] = match level {
        AmpLevel::O0 => &["compute", "keep_f32", "loss_scale", "keep_batchnorm_f32"],
        AmpLevel::O1 => &["keep_batchnorm_f32"],
        AmpLevel::O2 | AmpLevel::O3 => &[],
    };
    for key in ignored.iter().filter_map(|k| fields.key(k)) {
        let reason = if level == AmpLevel::O0 {
            "O0 computes everything in f32"
        } else {
            "O1 converts only its white-listed ops, and batch norm is not one of them"
        };
        let warning = Diagnostic::warning(
            Code::W0002,
            rep.file(),
            key.span,
            format!("`{}` has no effect at level {level:?}", key.name),
        )
        .with_label("ignored at this level")
        .with_related(rep.file(), level_span, "level set here")
        .with_help(format!(
            "{reason}; remove the setting or choose another level"
        ));
        rep.push(warning);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::{decl, span_of};

    const OPS: &[&str] = &[
        "softmax",
        "rms_norm",
        "layer_norm",
        "cross_entropy",
        "matmul",
    ];

    fn check(src: &str) -> (PrecisionPolicy, Vec<Diagnostic>) {
        let mut diags = Vec::new();
        let policy = check_precision(
            &decl(src),
            FileId(0),
            &|n| OPS.contains(&n),
            OPS,
            &mut diags,
        );
        (policy, diags)
    }

    fn codes(diags: &[Diagnostic]) -> Vec<Code> {
        diags.iter().map(|d| d.code).collect()
    }

    #[test]
    fn the_documented_policy_is_valid() {
        let src = "precision Mixed {
            level = O2
            compute = bf16
            keep_f32 = [rms_norm, softmax, softmax]
            loss_scale = dynamic(init: 65536, factor: 2, window: 2000)
            keep_batchnorm_f32 = true
        }";
        let (policy, diags) = check(src);
        assert!(diags.is_empty(), "{diags:?}");
        assert_eq!(policy.name.name, "Mixed");
        assert_eq!(policy.level, AmpLevel::O2);
        assert_eq!(policy.compute, LowPrecision::BF16);
        assert_eq!(policy.keep_f32, vec!["rms_norm", "softmax"]);
        assert_eq!(
            policy.loss_scale,
            LossScale::Dynamic {
                init: 65536.0,
                factor: 2.0,
                window: 2000
            }
        );
        assert!(policy.keep_batchnorm_f32);
    }

    #[test]
    fn defaults_follow_mindspore_per_level() {
        let (o2, _) = check("precision P { level = O2 }");
        assert_eq!(
            (o2.compute, o2.loss_scale, o2.keep_batchnorm_f32),
            (LowPrecision::F16, LossScale::DYNAMIC, true)
        );
        assert_eq!(
            LossScale::DYNAMIC,
            LossScale::Dynamic {
                init: 2f64.powi(24),
                factor: 2.0,
                window: 2000
            }
        );
        let (o3, _) = check("precision P { level = O3 }");
        assert_eq!(
            (o3.loss_scale, o3.keep_batchnorm_f32),
            (LossScale::None, false)
        );
        let (o1, _) = check("precision P { level = O1, loss_scale = fixed }");
        assert_eq!(
            (o1.loss_scale, o1.keep_batchnorm_f32),
            (LossScale::FIXED, false)
        );
        let (p, _) = check("precision P { level = O1, loss_scale = fixed(1024) }");
        assert_eq!(
            p.loss_scale,
            LossScale::Fixed {
                scale: 1024.0,
                drop_overflow_update: true
            }
        );
        let (p, _) = check(
            "precision P { level = O1, loss_scale = fixed(scale: 8, drop_overflow_update: false) }",
        );
        assert_eq!(
            p.loss_scale,
            LossScale::Fixed {
                scale: 8.0,
                drop_overflow_update: false
            }
        );
        let (p, d) = check(
            "precision P { level = O3, loss_scale = dynamic(scale_window: 10), compute = float16 }",
        );
        assert!(d.is_empty(), "{d:?}");
        assert_eq!(
            p.loss_scale,
            LossScale::Dynamic {
                init: 2f64.powi(24),
                factor: 2.0,
                window: 10
            }
        );
    }

    #[test]
    fn unknown_ops_and_bad_values_are_all_reported() {
        let src = "precision P {
            level = O5
            compute = f32
            keep_f32 = [softmx, rms_norm, 42, conv9]
            loss_scale = dynamic(init: 0.5, factor: 1, window: 0)
            keep_batchnorm_f32 = yes
        }";
        let (policy, diags) = check(src);
        assert_eq!(
            codes(&diags),
            vec![
                Code::E0502,
                Code::E0502,
                Code::E0503,
                Code::E0502,
                Code::E0503,
                Code::E0502,
                Code::E0502,
                Code::E0502,
                Code::E0502
            ]
        );
        assert_eq!(diags[0].primary.span, span_of(src, "O5", 0));
        assert_eq!(
            diags[0].help.as_deref(),
            Some("amp level is one of `O0`, `O1`, `O2` or `O3`")
        );
        assert_eq!(diags[2].primary.span, span_of(src, "softmx", 0));
        assert_eq!(diags[2].help.as_deref(), Some("did you mean `softmax`?"));
        assert_eq!(diags[3].primary.span, span_of(src, "42", 0));
        assert_eq!(
            diags[4].help.as_deref(),
            Some("`docs/ops.md` lists the op names")
        );
        assert_eq!(diags[5].primary.span, span_of(src, "0.5", 0));
        assert_eq!(diags[8].primary.span, span_of(src, "yes", 0));
        assert_eq!(policy.keep_f32, vec!["rms_norm"]);
        assert_eq!(policy.level, AmpLevel::O0);
    }

    #[test]
    fn malformed_loss_scales() {
        for (src, code) in [
            ("none(1)", Code::E0502),
            ("dynamc", Code::E0502),
            ("fixed(1, true, 3)", Code::E0203),
            ("dynamic(int: 2)", Code::E0204),
            ("128", Code::E0502),
            ("fixed(0.5)", Code::E0502),
        ] {
            let (_, diags) = check(&format!("precision P {{ level = O2, loss_scale = {src} }}"));
            assert_eq!(codes(&diags), vec![code], "{src}");
        }
        let (_, diags) = check("precision P { level = O2, loss_scale = dynamc(1) }");
        assert_eq!(
            diags[0].help.as_deref(),
            Some("did you mean `dynamic`? loss scale is one of `none`, `fixed` or `dynamic`")
        );
    }

    #[test]
    fn settings_without_effect_warn() {
        let src = "precision P { level = O0, compute = bf16, keep_f32 = [softmax], keep_batchnorm_f32 = false }";
        let (_, diags) = check(src);
        assert_eq!(codes(&diags), vec![Code::W0002; 3]);
        assert!(diags.iter().all(|d| !d.is_error()));
        assert_eq!(diags[0].primary.span, span_of(src, "compute", 0));
        assert_eq!(diags[0].related[0].span, span_of(src, "O0", 0));
        let (_, diags) =
            check("precision P { level = O1, keep_batchnorm_f32 = true, loss_scale = none }");
        assert_eq!(codes(&diags), vec![Code::W0002]);
        let (_, diags) = check("precision P { level = O3, keep_batchnorm_f32 = true }");
        assert!(diags.is_empty());
    }

    #[test]
    fn missing_level_points_at_the_name() {
        let src = "precision Mixed { compute = bf16 }";
        let (_, diags) = check(src);
        assert_eq!(codes(&diags), vec![Code::E0501]);
        assert_eq!(diags[0].primary.span, span_of(src, "Mixed", 0));
    }
}
