//! `train` declarations: labels, loss, optimizer, batch and the policies and target to use —
//! their fields' shapes here; the loss is elaborated with the model, and the policy names are
//! resolved by the caller, which then checks them together with [`check_train_against`].

use mslc_core::diag::{Code, Diagnostic, FileId};
use mslc_syntax::ast::{DeclItem, Expr, Ident, Span, TensorType};

use super::fields::{Extra, FieldSpec, Fields};
use super::memory::MemoryPolicy;
use super::optimizer::{optimizer, Optimizer};
use super::parallel::ParallelPolicy;
use super::pattern::ShardPattern;
use super::report::Reporter;
use super::schedule::{schedule, Schedule};
use super::target::TargetSpec;
use super::value::{Val, Value};
use crate::suggest;

/// A checked `train` declaration.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainSpec {
    /// The declaration's name.
    pub name: Ident,
    /// The file it is declared in.
    pub file: FileId,
    /// The model it trains (`for Model`).
    pub model: Ident,
    /// Label tensors the loss reads besides the model's outputs.
    pub labels: Vec<(Ident, TensorType)>,
    /// The loss expression, unevaluated.
    pub loss: Option<Expr>,
    /// The optimizer.
    pub optimizer: Option<Optimizer>,
    /// The learning-rate schedule (constant by default).
    pub schedule: Schedule,
    /// `clip_grad_norm`: the largest global 2-norm of the gradients, if they are clipped.
    pub clip_grad_norm: Option<f64>,
    /// `no_decay`: parameter-path patterns excluded from weight decay, with their spans.
    pub no_decay: Vec<(ShardPattern, Span)>,
    /// Samples per step over all devices.
    pub batch: i64,
    /// Where the batch is written (the declaration's name when it is not).
    pub batch_span: Span,
    /// Steps whose gradients are accumulated before an update (default 1).
    pub grad_accum: i64,
    /// Name of the precision policy.
    pub precision: Option<Ident>,
    /// Name of the parallel policy.
    pub parallel: Option<Ident>,
    /// Name of the memory policy.
    pub memory: Option<Ident>,
    /// Path of the target, e.g. `std.targets.ascend910b`.
    pub target: Option<Vec<Ident>>,
}

const FIELDS: &[FieldSpec] = &[
    FieldSpec::required("loss", "loss = cross_entropy(logits, labels)"),
    FieldSpec::required("optimizer", "optimizer = adamw(lr: 1e-4)"),
    FieldSpec::required("batch", "batch = 8"),
    FieldSpec::optional("grad_accum"),
    FieldSpec::optional("schedule"),
    FieldSpec::optional("clip_grad_norm"),
    FieldSpec::optional("no_decay"),
    FieldSpec::optional("precision"),
    FieldSpec::optional("parallel"),
    FieldSpec::optional("memory"),
    FieldSpec::optional("target"),
];

/// Checks the fields of a `train` declaration.
pub fn check_train(decl: &DeclItem, file: FileId, diags: &mut Vec<Diagnostic>) -> TrainSpec {
    let rep = &mut Reporter::new(file, diags);
    let fields = Fields::collect(decl, FIELDS, Extra::Labels, rep);
    let model = decl.for_model.clone().unwrap_or_else(|| {
        rep.push(
            rep.error(
                Code::E0501,
                decl.name.span,
                format!("train `{}` does not name its model", decl.name.name),
            )
            .with_label("no model")
            .with_help(format!(
                "write `train {} for ModelName {{ … }}`",
                decl.name.name
            )),
        );
        Ident {
            name: String::new(),
            span: decl.name.span,
        }
    });
    let mut labels: Vec<(Ident, TensorType)> = Vec::new();
    for (name, ty) in &fields.labels {
        match labels.iter().find(|(l, _)| l.name == name.name) {
            Some((first, _)) => rep.push(
                rep.error(
                    Code::E0502,
                    name.span,
                    format!("label `{}` is declared twice", name.name),
                )
                .with_label("declared again here")
                .with_related(file, first.span, "first declared here")
                .with_help("give each label a distinct name"),
            ),
            None => labels.push(((*name).clone(), (*ty).clone())),
        }
    }
    let optimizer = fields
        .value("optimizer", rep)
        .and_then(|v| optimizer(&v, rep));
    let schedule = fields
        .value("schedule", rep)
        .and_then(|v| schedule(&v, rep))
        .unwrap_or(Schedule::Constant);
    if let (Some(opt), Some(min_lr)) = (optimizer, schedule.min_lr()) {
        if min_lr > opt.lr {
            let span = fields.expr("schedule").map_or(decl.name.span, |e| e.span);
            let message = format!(
                "the schedule's floor min_lr = {min_lr} is above the optimizer's lr = {}",
                opt.lr
            );
            let help = "the schedule decays from the optimizer's lr to min_lr; make min_lr smaller"
                .to_string();
            rep.invalid(span, message, "floor above the peak", help);
        }
    }
    let clip_grad_norm = fields.value("clip_grad_norm", rep).and_then(|v| {
        let x = rep.number(&v, "the gradient-norm limit")?;
        rep.ensure(
            x > 0.0 && x.is_finite(),
            &v,
            format!("clip_grad_norm must be a finite number above 0, found {x}"),
            "write e.g. `clip_grad_norm = 1.0`, or leave the field out not to clip",
        )
        .then_some(x)
    });
    let no_decay = fields
        .value("no_decay", rep)
        .map(|v| no_decay(&v, rep))
        .unwrap_or_default();
    let batch = fields
        .value("batch", rep)
        .and_then(|v| rep.positive_int(&v, "the batch size"));
    let grad_accum = fields
        .value("grad_accum", rep)
        .and_then(|v| rep.positive_int(&v, "the gradient accumulation count"));
    let mut policy = |key: &str| {
        let value = fields.value(key, rep)?;
        let word = value.word().cloned();
        if word.is_none() {
            let help = format!("name a `{key}` declaration, e.g. `{key} = Mixed`");
            rep.expected(&value, &format!("the name of a {key} policy"), help);
        }
        word
    };
    let (precision, parallel, memory) = (policy("precision"), policy("parallel"), policy("memory"));
    let target = fields
        .value("target", rep)
        .and_then(|value| match value.val {
            Val::Name(path) => Some(path),
            _ => {
                let help = "name a target declaration, e.g. `target = std.targets.cpu`".to_string();
                rep.expected(&value, "the name of a target", help);
                None
            }
        });
    TrainSpec {
        name: decl.name.clone(),
        file,
        model,
        labels,
        loss: fields.expr("loss").cloned(),
        optimizer,
        schedule,
        clip_grad_norm,
        no_decay,
        batch: batch.unwrap_or(1),
        batch_span: fields.expr("batch").map_or(decl.name.span, |e| e.span),
        grad_accum: grad_accum.unwrap_or(1),
        precision,
        parallel,
        memory,
        target,
    }
}

/// `no_decay = ["*.bias", "*norm*"]`: each string a parameter-path pattern.
fn no_decay(value: &Value, rep: &mut Reporter) -> Vec<(ShardPattern, Span)> {
    let help =
        "write a list of parameter-path patterns, e.g. `no_decay = [\"*.bias\", \"**.norm.*\"]`";
    let Val::List(items) = &value.val else {
        rep.expected(value, "a list of patterns", help.to_string());
        return Vec::new();
    };
    let mut patterns = Vec::new();
    for item in items {
        let Val::Str(text) = &item.val else {
            rep.expected(item, "a pattern string", help.to_string());
            continue;
        };
        match ShardPattern::parse(text) {
            Ok(pattern) => patterns.push((pattern, item.span)),
            Err(error) => rep.invalid(
                item.span,
                format!("invalid parameter pattern: {}", error.message),
                "invalid pattern",
                "`*` matches within one path segment, `**` any number of segments, `{a,b}` either alternative".to_string(),
            ),
        }
    }
    patterns
}

/// Warns (W0014) about each `no_decay` pattern of `train` that matches none of the model's
/// parameter paths, naming the closest path.
pub fn check_no_decay_against_params(
    train: &TrainSpec,
    params: &[&str],
    diags: &mut Vec<Diagnostic>,
) {
    for (pattern, span) in &train.no_decay {
        if params.iter().any(|p| pattern.matches(p)) {
            continue;
        }
        let help = match pattern.nearest(params.iter().copied()) {
            Some(path) => {
                format!("the closest parameter path is `{path}`; a pattern matches the whole path")
            }
            None => "the model has no parameters".to_string(),
        };
        diags.push(
            Diagnostic::warning(
                Code::W0014,
                train.file,
                *span,
                format!("no_decay pattern \"{pattern}\" matches no parameter"),
            )
            .with_label("matches nothing")
            .with_help(help),
        );
    }
}

/// Checks a train declaration against the policies and target it resolved to: the batch splits
/// evenly over the data-parallel replicas (E0506) and, with a pipeline, into its micro-batches
/// (E0510); the memory budget fits the target's memory (E0502).
pub fn check_train_against(
    train: &TrainSpec,
    parallel: Option<&ParallelPolicy>,
    memory: Option<&MemoryPolicy>,
    target: Option<&TargetSpec>,
    diags: &mut Vec<Diagnostic>,
) {
    if let Some(parallel) = parallel {
        check_batch_split(train, parallel, diags);
    }
    if let (Some(memory), Some(target)) = (memory, target) {
        if let Some(limit) = memory
            .max_device_memory
            .filter(|&m| m > target.memory_bytes)
        {
            diags.push(
                Diagnostic::error(
                    Code::E0502,
                    memory.file,
                    memory.max_device_memory_span,
                    format!("`max_device_memory` is {}, more than target `{}` has", bytes(limit), target.name.name),
                )
                .with_label("over the device's memory")
                .with_related(target.file, target.memory_span, format!("the device has {}", bytes(target.memory_bytes)))
                .with_help(format!(
                    "use at most {}; MindSpore's advice is to leave 10–20 % of the card for communication buffers and the framework",
                    bytes(target.memory_bytes)
                )),
            );
        }
    }
}

fn check_batch_split(train: &TrainSpec, parallel: &ParallelPolicy, diags: &mut Vec<Diagnostic>) {
    let dp = parallel.data_parallel_size();
    let micro = parallel.pipeline.map_or(1, |p| p.micro_batches);
    let Some(parts) = dp.checked_mul(micro) else {
        return;
    };
    if parts < 1 || train.batch % parts == 0 {
        return;
    }
    let batch = train.batch;
    let diagnostic = match parallel.pipeline {
        Some(pipeline) => Diagnostic::error(
            Code::E0510,
            train.file,
            train.batch_span,
            format!("a batch of {batch} cannot be split into {dp} data-parallel replicas × {micro} micro-batches"),
        )
        .with_label(format!("not a multiple of {parts}"))
        .with_related(parallel.file, pipeline.span, format!("{micro} micro-batches per replica"))
        .with_related(parallel.file, parallel.mesh_span, format!("{dp} data-parallel replicas")),
        None => Diagnostic::error(
            Code::E0506,
            train.file,
            train.batch_span,
            format!("a batch of {batch} cannot be split evenly over {dp} data-parallel replicas"),
        )
        .with_label(format!("not a multiple of {dp}"))
        .with_related(parallel.file, parallel.mesh_span, format!("{dp} data-parallel replicas")),
    };
    let lower = batch / parts * parts;
    let help = match (lower, lower.checked_add(parts)) {
        (0, _) => format!("use a batch that is a multiple of {parts}, e.g. {parts}"),
        (_, Some(upper)) => {
            format!("use a batch that is a multiple of {parts}, e.g. {lower} or {upper}")
        }
        (_, None) => format!("use a batch that is a multiple of {parts}, e.g. {lower}"),
    };
    diags.push(diagnostic.with_help(help));
}

/// A byte count in the largest binary or decimal unit that states it exactly.
fn bytes(n: u64) -> String {
    const UNITS: [(u64, &str); 8] = [
        (1 << 40, "TiB"),
        (1_000_000_000_000, "TB"),
        (1 << 30, "GiB"),
        (1_000_000_000, "GB"),
        (1 << 20, "MiB"),
        (1_000_000, "MB"),
        (1 << 10, "KiB"),
        (1_000, "KB"),
    ];
    UNITS
        .iter()
        .find(|(size, _)| n >= *size && n.is_multiple_of(*size))
        .map_or(format!("{n} B"), |(size, unit)| {
            format!("{} {unit}", n / size)
        })
}

/// E0509 for a train declaration's reference to a policy or target (`kind`, e.g. "precision")
/// that names nothing; `known` lists the names that exist, for did-you-mean.
pub fn unknown_reference(
    reference: &Ident,
    kind: &str,
    known: &[&str],
    file: FileId,
) -> Diagnostic {
    let help = match suggest::closest(&reference.name, known.iter().copied()) {
        Some(best) => format!("did you mean `{best}`?"),
        None if known.is_empty() => format!("declare it with `{kind} {} {{ … }}`", reference.name),
        None => format!(
            "the {kind} declarations in scope are {}",
            suggest::one_of(known.iter().copied())
        ),
    };
    Diagnostic::error(
        Code::E0509,
        file,
        reference.span,
        format!("no {kind} named `{}`", reference.name),
    )
    .with_label(format!("unknown {kind}"))
    .with_help(help)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::{decls, span_of};
    use crate::policy::{check_memory, check_parallel, check_target, OptimizerKind};

    const TRAIN: &str = "train Pretrain for TinyLlama {
        labels: i32[B, S]
        loss = cross_entropy(logits, labels)
        optimizer = adamw(lr: 1e-4, betas: (0.9, 0.95), weight_decay: 0.1)
        batch = 8, grad_accum = 4
        precision = Mixed, parallel = Eight, memory = Budget
        target = std.targets.ascend910b
    }";

    fn check(src: &str) -> (TrainSpec, Vec<Diagnostic>) {
        let mut diags = Vec::new();
        let train = check_train(&decls(src)[0], FileId(0), &mut diags);
        (train, diags)
    }

    fn codes(diags: &[Diagnostic]) -> Vec<Code> {
        diags.iter().map(|d| d.code).collect()
    }

    #[test]
    fn the_documented_declaration_is_valid() {
        let (train, diags) = check(TRAIN);
        assert!(diags.is_empty(), "{diags:?}");
        assert_eq!(train.model.name, "TinyLlama");
        assert_eq!(train.labels.len(), 1);
        assert_eq!(train.labels[0].0.name, "labels");
        assert_eq!(train.labels[0].1.dims.len(), 2);
        assert_eq!(
            train.loss.as_ref().map(|e| e.span),
            Some(span_of(TRAIN, "cross_entropy(logits, labels)", 0))
        );
        assert_eq!(train.optimizer.map(|o| o.kind), Some(OptimizerKind::AdamW));
        assert_eq!(
            (train.batch, train.batch_span, train.grad_accum),
            (8, span_of(TRAIN, "8", 0), 4)
        );
        assert_eq!(train.precision.map(|i| i.name), Some("Mixed".to_string()));
        assert_eq!(
            train.parallel.map(|i| i.span),
            Some(span_of(TRAIN, "Eight", 0))
        );
        assert_eq!(train.memory.map(|i| i.name), Some("Budget".to_string()));
        let target: Vec<String> = train
            .target
            .unwrap_or_default()
            .into_iter()
            .map(|i| i.name)
            .collect();
        assert_eq!(target, vec!["std", "targets", "ascend910b"]);
    }

    #[test]
    fn field_problems() {
        let src = "train T for M {
            labels: i32[B]
            labels: f32[B]
            batch = 0, grad_accum = 1.5
            precision = 3, target = \"cpu\"
            lr = 1
        }";
        let (train, diags) = check(src);
        assert_eq!(
            codes(&diags),
            vec![
                Code::E0500,
                Code::E0501,
                Code::E0501,
                Code::E0502,
                Code::E0502,
                Code::E0502,
                Code::E0502,
                Code::E0502
            ]
        );
        assert_eq!(diags[1].primary.span, span_of(src, "T", 0));
        assert_eq!(
            diags[1].help.as_deref(),
            Some("add `loss = cross_entropy(logits, labels)`")
        );
        assert_eq!(diags[3].primary.span, span_of(src, "labels", 1));
        assert_eq!(diags[3].related[0].span, span_of(src, "labels", 0));
        assert_eq!(diags[4].primary.span, span_of(src, "0", 0));
        assert_eq!(
            (train.batch, train.grad_accum, train.loss, train.optimizer),
            (1, 1, None, None)
        );
    }

    #[test]
    fn schedule_clip_and_no_decay() {
        let src = r#"train T for M {
            loss = l, optimizer = adamw(lr: 1e-3), batch = 4
            schedule = warmup_cosine(warmup: 2, total: 10, min_lr: 1e-4)
            clip_grad_norm = 1.0
            no_decay = ["**.bias", "**.*norm*.weight"]
        }"#;
        let (train, diags) = check(src);
        assert!(diags.is_empty(), "{diags:?}");
        assert_eq!(train.schedule.min_lr(), Some(1e-4));
        assert_eq!(train.clip_grad_norm, Some(1.0));
        assert_eq!(train.no_decay.len(), 2);
        assert_eq!(train.no_decay[1].1, span_of(src, "\"**.*norm*.weight\"", 0));
        let mut warnings = Vec::new();
        check_no_decay_against_params(
            &train,
            &["layers.0.bias", "layers.0.weight", "final_norm.weight"],
            &mut warnings,
        );
        assert!(warnings.is_empty(), "{warnings:?}");
        check_no_decay_against_params(&train, &["head.weight", "head.bias"], &mut warnings);
        assert_eq!(codes(&warnings), vec![Code::W0014]);
        assert_eq!(
            warnings[0].help.as_deref(),
            Some("the closest parameter path is `head.weight`; a pattern matches the whole path")
        );
        let (train, _) = check("train T for M { loss = l, optimizer = sgd, batch = 4 }");
        assert_eq!(
            (train.schedule, train.clip_grad_norm, train.no_decay.len()),
            (Schedule::Constant, None, 0)
        );
    }

    #[test]
    fn schedule_clip_and_no_decay_problems() {
        let src = r#"train T for M {
            loss = l, optimizer = sgd(lr: 0.01), batch = 4
            schedule = warmup_linear(warmup: 1, total: 5, min_lr: 0.1)
            clip_grad_norm = 0
            no_decay = ["a..b", 3]
        }"#;
        let (_, diags) = check(src);
        assert_eq!(codes(&diags), vec![Code::E0502; 4], "{diags:?}");
        assert_eq!(
            diags[0].message,
            "the schedule's floor min_lr = 0.1 is above the optimizer's lr = 0.01"
        );
        let (_, diags) =
            check("train T for M { loss = l, optimizer = sgd, batch = 4, no_decay = \"*.bias\" }");
        assert_eq!(codes(&diags), vec![Code::E0502]);
    }

    fn policies(src: &str) -> (TrainSpec, ParallelPolicy, MemoryPolicy, TargetSpec) {
        let all = decls(src);
        let mut diags = Vec::new();
        let parsed = (
            check_train(&all[0], FileId(0), &mut diags),
            check_parallel(&all[1], FileId(0), &mut diags),
            check_memory(&all[2], FileId(0), &mut diags),
            check_target(&all[3], FileId(0), &mut diags),
        );
        assert!(diags.is_empty(), "{diags:?}");
        parsed
    }

    const REST: &str = "memory Budget { max_device_memory = 31GB }
        target npu { peak_f32 = 1PFLOPS, memory = 32GiB, bandwidth = 1.6TB/s, interconnect = 56GB/s }";

    #[test]
    fn batch_must_split_over_replicas_and_micro_batches() {
        let src = format!(
            "train T for M {{ loss = l, optimizer = sgd, batch = 24 }}
             parallel P {{ mesh = {{ dp: 2, mp: 4 }}, mode = semi_auto, pipeline = {{ stages: 2, micro_batches: 8 }} }}
             {REST}"
        );
        let (train, parallel, memory, target) = policies(&src);
        let mut diags = Vec::new();
        check_train_against(
            &train,
            Some(&parallel),
            Some(&memory),
            Some(&target),
            &mut diags,
        );
        assert_eq!(codes(&diags), vec![Code::E0510]);
        assert_eq!(diags[0].primary.span, span_of(&src, "24", 0));
        assert_eq!(
            diags[0].related[0].span,
            span_of(&src, "{ stages: 2, micro_batches: 8 }", 0)
        );
        assert_eq!(
            diags[0].help.as_deref(),
            Some("use a batch that is a multiple of 16, e.g. 16 or 32")
        );

        let src = src
            .replace(", pipeline = { stages: 2, micro_batches: 8 }", "")
            .replace("dp: 2", "dp: 5")
            .replace("mp: 4", "mp: 1");
        let (train, parallel, _, _) = policies(&src);
        let mut diags = Vec::new();
        check_train_against(&train, Some(&parallel), None, None, &mut diags);
        assert_eq!(codes(&diags), vec![Code::E0506]);
        assert_eq!(
            diags[0].help.as_deref(),
            Some("use a batch that is a multiple of 5, e.g. 20 or 25")
        );

        let src = src.replace("batch = 24", "batch = 25");
        let (train, parallel, memory, target) = policies(&src);
        let mut diags = Vec::new();
        check_train_against(
            &train,
            Some(&parallel),
            Some(&memory),
            Some(&target),
            &mut diags,
        );
        assert!(diags.is_empty(), "{diags:?}");
    }

    #[test]
    fn memory_budget_must_fit_the_target() {
        let src = format!(
            "train T for M {{ loss = l, optimizer = sgd, batch = 8 }}
             parallel P {{ mode = stand_alone }}
             {}",
            REST.replace("31GB", "40GB")
        );
        let (train, parallel, memory, target) = policies(&src);
        let mut diags = Vec::new();
        check_train_against(
            &train,
            Some(&parallel),
            Some(&memory),
            Some(&target),
            &mut diags,
        );
        assert_eq!(codes(&diags), vec![Code::E0502]);
        assert_eq!(diags[0].primary.span, span_of(&src, "40GB", 0));
        assert_eq!(diags[0].related[0].span, span_of(&src, "32GiB", 0));
        assert_eq!(
            diags[0].message,
            "`max_device_memory` is 40 GB, more than target `npu` has"
        );
        assert_eq!(diags[0].related[0].message, "the device has 32 GiB");
    }

    #[test]
    fn byte_counts_read_naturally() {
        assert_eq!(bytes(32 << 30), "32 GiB");
        assert_eq!(bytes(31_000_000_000), "31 GB");
        assert_eq!(bytes(1536), "1536 B");
        assert_eq!(bytes(1 << 41), "2 TiB");
        assert_eq!(bytes(7), "7 B");
    }

    #[test]
    fn unknown_references_suggest_declared_names() {
        let reference = Ident {
            name: "Mixd".to_string(),
            span: Span::new(3, 7),
        };
        let d = unknown_reference(&reference, "precision", &["Mixed", "Full"], FileId(0));
        assert_eq!(
            (d.code, d.primary.span, d.help.as_deref()),
            (Code::E0509, Span::new(3, 7), Some("did you mean `Mixed`?"))
        );
        let d = unknown_reference(&reference, "precision", &[], FileId(0));
        assert_eq!(
            d.help.as_deref(),
            Some("declare it with `precision Mixd { … }`")
        );
    }
}
