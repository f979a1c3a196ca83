//! `parallel` policies: the device mesh, MindSpore's parallel mode, shard rules, pipeline stages
//! and optimizer-state sharding.

use mslc_core::diag::{Code, Diagnostic, FileId};
use mslc_syntax::ast::{DeclItem, Ident, Span};

use super::args::{bind_record, slot_or, Param};
use super::fields::{Extra, FieldSpec, Fields};
use super::report::{Choices, Reporter, WithRelatedIf};
use super::shard::{shard_rule, ShardRule};
use super::value::{Val, Value};

/// MindSpore's `parallel_mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParallelMode {
    /// One device.
    StandAlone,
    /// Every device holds the whole model and a slice of the batch.
    Data,
    /// Ops are split as the shard rules say; the rest follows by propagation.
    SemiAuto,
    /// The planner searches the strategies, keeping the shard rules given.
    Auto,
}

impl ParallelMode {
    /// The mode's word in `.msl`.
    pub fn keyword(self) -> &'static str {
        match self {
            ParallelMode::StandAlone => "stand_alone",
            ParallelMode::Data => "data",
            ParallelMode::SemiAuto => "semi_auto",
            ParallelMode::Auto => "auto",
        }
    }

    /// Whether shard rules and pipeline stages are honoured in this mode.
    pub fn splits_ops(self) -> bool {
        matches!(self, ParallelMode::SemiAuto | ParallelMode::Auto)
    }
}

/// How pipeline stages interleave forward and backward passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PipelineSchedule {
    /// All forwards, then all backwards: `micro_batches` activations alive.
    GPipe,
    /// One forward, one backward: at most `stages` micro-batches of activations alive.
    OneFOneB,
    /// 1F1B with each device running this many model chunks (Narayanan et al. 2021's
    /// interleaved schedule): the bubble divided by the chunk count.
    Interleaved(i64),
}

/// Pipeline parallelism: the model cut into stages, the batch into micro-batches.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pipeline {
    /// Number of stages.
    pub stages: i64,
    /// Micro-batches per step (MindSpore's `micro_size`).
    pub micro_batches: i64,
    /// The schedule (default 1F1B, as in MindSpore).
    pub schedule: PipelineSchedule,
    /// The `pipeline` value.
    pub span: Span,
    /// The `stages` entry's value.
    pub stages_span: Span,
    /// The `micro_batches` entry's value.
    pub micro_batches_span: Span,
}

/// MindSpore's optimizer-parallel levels (ZeRO stages 1–3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptimizerShard {
    /// Every data-parallel replica keeps the whole optimizer state.
    None,
    /// Optimizer state (and master weights) sharded.
    Level1,
    /// Also gradients.
    Level2,
    /// Also weights, gathered just in time.
    Level3,
}

/// A checked `parallel` policy.
#[derive(Clone, Debug, PartialEq)]
pub struct ParallelPolicy {
    /// The policy's name.
    pub name: Ident,
    /// The file it is declared in.
    pub file: FileId,
    /// Mesh axes in order, with their sizes (empty for stand-alone without a mesh).
    pub mesh: Vec<(String, i64)>,
    /// The mesh value, or the policy's name when there is no mesh.
    pub mesh_span: Span,
    /// The parallel mode.
    pub mode: ParallelMode,
    /// Device count: the product of the mesh.
    pub devices: i64,
    /// Shard rules whose pattern and form are valid, in source order.
    pub shards: Vec<ShardRule>,
    /// Pipeline parallelism, if configured.
    pub pipeline: Option<Pipeline>,
    /// Optimizer-state sharding.
    pub optimizer_shard: OptimizerShard,
    /// Sequence parallelism (Korthikanti et al. 2022) with tensor parallelism: `Some` when
    /// `sequence_parallel` is given, `None` to leave it to the planner (off outside `auto`).
    pub sequence_parallel: Option<bool>,
    /// `redistribution_threshold`: implicit redistributions moving more bytes than this per
    /// step are warning W0040 (the planner's default, 1 GiB, when not given), with the
    /// field's span.
    pub redistribution_threshold: Option<(u64, Span)>,
}

impl ParallelPolicy {
    /// The size of a mesh axis.
    pub fn axis_size(&self, axis: &str) -> Option<i64> {
        self.mesh
            .iter()
            .find(|(a, _)| a == axis)
            .map(|&(_, size)| size)
    }

    /// How many slices the batch is split into: every device in data mode, the `dp` axis in
    /// the semi-auto and auto modes (1 without one), 1 stand-alone.
    pub fn data_parallel_size(&self) -> i64 {
        match self.mode {
            ParallelMode::StandAlone => 1,
            ParallelMode::Data => self.devices,
            ParallelMode::SemiAuto | ParallelMode::Auto => self.axis_size("dp").unwrap_or(1),
        }
    }

    /// How many micro-batches of the model's batch dim one step's batch is: the data-parallel
    /// replicas × the pipeline's micro-batches (`batch = B × dp × micro_batches × grad_accum`).
    pub fn batch_parts(&self) -> i64 {
        let pipeline = self.pipeline.as_ref().map_or(1, |p| p.micro_batches.max(1));
        self.data_parallel_size().max(1).saturating_mul(pipeline)
    }
}

const FIELDS: &[FieldSpec] = &[
    FieldSpec::required("mode", "mode = semi_auto"),
    FieldSpec::optional("mesh"),
    FieldSpec::optional("devices"),
    FieldSpec::optional("pipeline"),
    FieldSpec::optional("optimizer_shard"),
    FieldSpec::optional("sequence_parallel"),
    FieldSpec::optional("redistribution_threshold"),
];

const MODES: &Choices<ParallelMode> = &[
    (&["stand_alone", "standalone"], ParallelMode::StandAlone),
    (&["data", "data_parallel"], ParallelMode::Data),
    (&["semi_auto", "semi_auto_parallel"], ParallelMode::SemiAuto),
    (&["auto", "auto_parallel"], ParallelMode::Auto),
];

const SCHEDULES: &Choices<PipelineSchedule> = &[
    (&["1f1b"], PipelineSchedule::OneFOneB),
    (&["gpipe"], PipelineSchedule::GPipe),
];

const OPTIMIZER_SHARDS: &Choices<OptimizerShard> = &[
    (&["none"], OptimizerShard::None),
    (&["level1"], OptimizerShard::Level1),
    (&["level2"], OptimizerShard::Level2),
    (&["level3"], OptimizerShard::Level3),
];

const PIPELINE_PARAMS: &[Param] = &[
    Param::required(&["stages", "pipeline_stages"], "stages: 2"),
    Param::required(&["micro_batches", "micro_size"], "micro_batches: 8"),
    Param::optional(&["schedule"]),
];

/// Checks a `parallel` declaration: mode, mesh, device count (E0507), shard rules (axes in the
/// mesh, E0504) and pipeline (E0510). Shard rules are checked against the model's parameters
/// separately, by [`check_shards_against_params`](super::check_shards_against_params).
pub fn check_parallel(
    decl: &DeclItem,
    file: FileId,
    diags: &mut Vec<Diagnostic>,
) -> ParallelPolicy {
    let rep = &mut Reporter::new(file, diags);
    let fields = Fields::collect(decl, FIELDS, Extra::ShardRules, rep);
    let mode = fields
        .value("mode", rep)
        .and_then(|v| Some((rep.word(&v, "parallel mode", MODES)?, v.span)));
    let mesh_value = fields.value("mesh", rep);
    let mesh = mesh_value
        .as_ref()
        .and_then(|v| mesh(v, rep))
        .unwrap_or_default();
    let mesh_span = mesh_value.as_ref().map(|v| v.span);
    let mut devices = mesh_devices(&mesh, mesh_span, rep);
    let given = fields.value("devices", rep);
    // `auto` with a device count and no mesh leaves the mesh to the planner's search.
    let searched = mode.is_some_and(|(m, _)| m == ParallelMode::Auto) && mesh_span.is_none();
    if let Some(mode) = mode.filter(|_| !(searched && given.is_some())) {
        check_mode_fits_mesh(decl, mode, mesh_span, devices, rep);
    }
    match given {
        Some(given) if searched => {
            devices = rep.positive_int(&given, "the device count").unwrap_or(1);
        }
        Some(given) => check_device_count(&given, &mesh, mesh_span, devices, rep),
        None => {}
    }
    let shards = shard_rules(&fields, &mesh, mesh_span, mode, rep);
    let pipeline = fields
        .value("pipeline", rep)
        .and_then(|v| pipeline(&v, mode, devices, mesh_span, rep));
    let optimizer_shard = fields
        .value("optimizer_shard", rep)
        .and_then(|v| match v.val {
            // MindSpore's `enable_parallel_optimizer = True` means level 1.
            Val::Bool(true) => Some(OptimizerShard::Level1),
            Val::Bool(false) => Some(OptimizerShard::None),
            _ => rep.word(&v, "optimizer shard level", OPTIMIZER_SHARDS),
        })
        .unwrap_or(OptimizerShard::None);
    let sequence_parallel = fields
        .value("sequence_parallel", rep)
        .and_then(|v| rep.flag(&v, "sequence_parallel"));
    let redistribution_threshold = fields
        .value("redistribution_threshold", rep)
        .and_then(|v| Some((rep.bytes(&v, "512MB")?, v.span)));
    if let (Some((_, span)), Some((m, _))) = (redistribution_threshold, mode) {
        if matches!(m, ParallelMode::StandAlone | ParallelMode::Data) {
            rep.push(
                Diagnostic::warning(
                    Code::W0042,
                    file,
                    span,
                    format!(
                        "`redistribution_threshold` has no effect in mode `{}`: only tensor-parallel layouts redistribute",
                        m.keyword()
                    ),
                )
                .with_label("never reached")
                .with_help("remove it, or use `mode = semi_auto` or `auto` with shard rules"),
            );
        }
    }
    ParallelPolicy {
        name: decl.name.clone(),
        file,
        mesh: mesh
            .into_iter()
            .map(|(axis, size)| (axis.name, size))
            .collect(),
        mesh_span: mesh_span.unwrap_or(decl.name.span),
        mode: mode.map_or(ParallelMode::StandAlone, |(m, _)| m),
        devices,
        shards,
        pipeline,
        optimizer_shard,
        sequence_parallel,
        redistribution_threshold,
    }
}

/// The mesh's axes with their sizes; axes with invalid sizes or repeated names are left out.
fn mesh(value: &Value, rep: &mut Reporter) -> Option<Vec<(Ident, i64)>> {
    let Val::Record(entries) = &value.val else {
        let help = "write the axes and their sizes, e.g. `{ dp: 2, mp: 4 }`".to_string();
        rep.expected(value, "a record of axis sizes", help);
        return None;
    };
    if entries.is_empty() {
        let help = "give at least one axis, e.g. `{ dp: 8 }`".to_string();
        rep.invalid(
            value.span,
            "the mesh has no axes".to_string(),
            "empty mesh",
            help,
        );
        return None;
    }
    let mut axes: Vec<(Ident, i64)> = Vec::new();
    for (axis, size) in entries {
        if axis.name == "_" {
            let help = "`_` marks an unsplit dim in shard specs; pick another name".to_string();
            rep.invalid(
                axis.span,
                "`_` cannot name a mesh axis".to_string(),
                "reserved name",
                help,
            );
        } else if let Some((first, _)) = axes.iter().find(|(a, _)| a.name == axis.name) {
            rep.push(
                rep.error(
                    Code::E0502,
                    axis.span,
                    format!("mesh axis `{}` is declared twice", axis.name),
                )
                .with_label("declared again here")
                .with_related(rep.file(), first.span, "first declared here")
                .with_help("give each axis a distinct name"),
            );
        } else if let Some(size) =
            rep.positive_int(size, &format!("the size of axis `{}`", axis.name))
        {
            axes.push((axis.clone(), size));
        }
    }
    Some(axes)
}

/// The product of the mesh's sizes (1 for no mesh), reporting overflow.
fn mesh_devices(mesh: &[(Ident, i64)], span: Option<Span>, rep: &mut Reporter) -> i64 {
    let product = mesh
        .iter()
        .try_fold(1i64, |acc, (_, size)| acc.checked_mul(*size));
    match (product, span) {
        (Some(product), _) => product,
        (None, Some(span)) => {
            let message = "the mesh has more devices than fit in 64 bits".to_string();
            rep.invalid(
                span,
                message,
                "too many devices",
                "use smaller axis sizes".to_string(),
            );
            1
        }
        (None, None) => 1,
    }
}

/// Stand-alone runs on one device and needs no mesh; every other mode needs one.
fn check_mode_fits_mesh(
    decl: &DeclItem,
    (mode, mode_span): (ParallelMode, Span),
    mesh_span: Option<Span>,
    devices: i64,
    rep: &mut Reporter,
) {
    match (mode, mesh_span) {
        (ParallelMode::StandAlone, Some(mesh_span)) if devices > 1 => rep.push(
            rep.error(
                Code::E0502,
                mesh_span,
                format!("stand-alone mode runs on one device, but the mesh has {devices}"),
            )
            .with_label(format!("{devices} devices"))
            .with_related(rep.file(), mode_span, "mode set here")
            .with_help("choose `mode = data`, `semi_auto` or `auto`, or remove the mesh"),
        ),
        (ParallelMode::StandAlone, _) | (_, Some(_)) => {}
        (_, None) => rep.push(
            rep.error(
                Code::E0501,
                decl.name.span,
                format!("parallel `{}` does not set `mesh`", decl.name.name),
            )
            .with_label("missing `mesh`")
            .with_help(match mode {
                ParallelMode::Auto => "add the device count, e.g. `devices = 1024`, and the planner searches the mesh; or give the mesh, e.g. `mesh = { dp: 2, mp: 4 }`",
                _ => "add the device mesh, e.g. `mesh = { dp: 2, mp: 4 }`",
            }),
        ),
    }
}

/// E0507 unless `devices` equals the mesh's device count.
fn check_device_count(
    given: &Value,
    mesh: &[(Ident, i64)],
    mesh_span: Option<Span>,
    devices: i64,
    rep: &mut Reporter,
) {
    match rep.positive_int(given, "the device count") {
        Some(count) if count != devices => {
            let sizes: Vec<String> = mesh.iter().map(|(_, size)| size.to_string()).collect();
            let diagnostic = rep
                .error(
                    Code::E0507,
                    given.span,
                    format!("`devices` is {count}, but the mesh has {devices}"),
                )
                .with_label(format!("{count} devices"))
                .with_help(format!("set `devices = {devices}` or resize the mesh"))
                .with_related_if(
                    rep.file(),
                    mesh_span,
                    format!("{} = {devices} devices", sizes.join(" × ")),
                );
            rep.push(diagnostic);
        }
        _ => {}
    }
}

/// The valid shard rules; a pattern given twice is reported and its repeat left out.
fn shard_rules(
    fields: &Fields,
    mesh: &[(Ident, i64)],
    mesh_span: Option<Span>,
    mode: Option<(ParallelMode, Span)>,
    rep: &mut Reporter,
) -> Vec<ShardRule> {
    let axes: Vec<&str> = mesh.iter().map(|(axis, _)| axis.name.as_str()).collect();
    let mut rules: Vec<ShardRule> = Vec::new();
    for (n, (pattern, spec)) in fields.shards.iter().enumerate() {
        match fields.shards[..n]
            .iter()
            .find(|(p, _)| p.name == pattern.name)
        {
            Some((first, _)) => rep.push(
                rep.error(
                    Code::E0502,
                    pattern.span,
                    format!("shard pattern \"{}\" is given twice", pattern.name),
                )
                .with_label("given again here")
                .with_related(rep.file(), first.span, "first given here")
                .with_help("keep one rule per pattern"),
            ),
            None => rules.extend(shard_rule(pattern, spec, &axes, mesh_span, rep)),
        }
    }
    if let (Some((mode, mode_span)), Some((first, _))) = (mode, fields.shards.first()) {
        if !mode.splits_ops() {
            rep.push(
                rep.error(
                    Code::E0502,
                    first.span,
                    format!("shard rules have no effect in {} mode", mode.keyword()),
                )
                .with_label("ignored in this mode")
                .with_related(rep.file(), mode_span, "mode set here")
                .with_help("use `mode = semi_auto` or `mode = auto` to shard parameters"),
            );
        }
    }
    rules
}

fn pipeline(
    value: &Value,
    mode: Option<(ParallelMode, Span)>,
    devices: i64,
    mesh_span: Option<Span>,
    rep: &mut Reporter,
) -> Option<Pipeline> {
    let Val::Record(entries) = &value.val else {
        let help = "write e.g. `{ stages: 2, micro_batches: 8, schedule: 1f1b }`".to_string();
        rep.expected(value, "a pipeline record", help);
        return None;
    };
    let slots = bind_record("the pipeline", entries, value.span, PIPELINE_PARAMS, rep);
    let stages = slots[0].and_then(|v| Some((rep.positive_int(v, "the stage count")?, v.span)));
    let micro =
        slots[1].and_then(|v| Some((rep.positive_int(v, "the micro-batch count")?, v.span)));
    let schedule = slot_or(slots[2], PipelineSchedule::OneFOneB, rep, schedule);
    let mut valid = true;
    if let Some((mode, mode_span)) = mode.filter(|(m, _)| !m.splits_ops()) {
        rep.push(
            rep.error(
                Code::E0510,
                value.span,
                "pipeline parallelism needs `semi_auto` or `auto` mode",
            )
            .with_label(format!("pipeline in {} mode", mode.keyword()))
            .with_related(rep.file(), mode_span, "mode set here")
            .with_help("MindSpore runs pipeline stages only in the semi-auto and auto modes"),
        );
        valid = false;
    }
    if let (Some((stages, stages_span)), Some((micro, micro_span))) = (stages, micro) {
        if micro < stages {
            rep.push(
                rep.error(
                    Code::E0510,
                    micro_span,
                    format!("{micro} micro-batches cannot fill {stages} pipeline stages"),
                )
                .with_label("fewer micro-batches than stages")
                .with_related(rep.file(), stages_span, format!("{stages} stages"))
                .with_help(format!(
                    "MindSpore requires micro_size ≥ stages; use at least {stages} \
                         (the idle bubble is (stages − 1) / micro_batches of each step)"
                )),
            );
            valid = false;
        }
    }
    if let Some((stages, stages_span)) = stages.filter(|(stages, _)| devices % stages != 0) {
        rep.push(
            rep.error(
                Code::E0510,
                stages_span,
                format!("{devices} devices cannot be split into {stages} equal pipeline stages"),
            )
            .with_label(format!("{stages} stages"))
            .with_related_if(rep.file(), mesh_span, format!("{devices} devices"))
            .with_help("use a stage count that divides the device count"),
        );
        valid = false;
    }
    let pipeline = Pipeline {
        stages: stages?.0,
        micro_batches: micro?.0,
        schedule: schedule?,
        span: value.span,
        stages_span: stages?.1,
        micro_batches_span: micro?.1,
    };
    valid.then_some(pipeline)
}

/// `gpipe`, `1f1b` or `interleaved(v)` with v ≥ 1 model chunks per device.
fn schedule(rep: &mut Reporter, value: &Value) -> Option<PipelineSchedule> {
    match &value.val {
        Val::Call(name, args) if name.name == "interleaved" => match &args[..] {
            [(None, chunks)] => rep
                .positive_int(chunks, "the chunk count")
                .map(PipelineSchedule::Interleaved),
            _ => {
                let help = "write e.g. `interleaved(2)`: each device runs 2 model chunks".into();
                rep.expected(value, "`interleaved(v)` with one chunk count", help);
                None
            }
        },
        _ => rep.word(value, "pipeline schedule", SCHEDULES),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::{decl, span_of};

    fn check(src: &str) -> (ParallelPolicy, Vec<Diagnostic>) {
        let mut diags = Vec::new();
        let policy = check_parallel(&decl(src), FileId(0), &mut diags);
        (policy, diags)
    }

    fn codes(diags: &[Diagnostic]) -> Vec<Code> {
        diags.iter().map(|d| d.code).collect()
    }

    #[test]
    fn the_documented_policy_is_valid() {
        let src = r#"parallel Eight {
            mesh = { dp: 2, mp: 4 }
            mode = semi_auto
            devices = 8
            shard "model.layers.*.self_attn.{q,k,v}_proj.weight" = [mp, _]
            shard "model.layers.*.self_attn.o_proj.weight" = [_, mp]
            pipeline = { stages: 2, micro_batches: 8, schedule: 1f1b }
            optimizer_shard = level1
        }"#;
        let (policy, diags) = check(src);
        assert!(diags.is_empty(), "{diags:?}");
        assert_eq!(
            policy.mesh,
            vec![("dp".to_string(), 2), ("mp".to_string(), 4)]
        );
        assert_eq!(policy.mesh_span, span_of(src, "{ dp: 2, mp: 4 }", 0));
        assert_eq!(
            (policy.mode, policy.devices, policy.data_parallel_size()),
            (ParallelMode::SemiAuto, 8, 2)
        );
        assert_eq!(policy.shards.len(), 2);
        assert_eq!(policy.shards[1].axes, vec![None, Some("mp".to_string())]);
        assert_eq!(policy.shards[1].axis_spans[1], span_of(src, "mp", 2));
        let pipeline = policy.pipeline.expect("pipeline");
        assert_eq!(
            (pipeline.stages, pipeline.micro_batches, pipeline.schedule),
            (2, 8, PipelineSchedule::OneFOneB)
        );
        assert_eq!(policy.optimizer_shard, OptimizerShard::Level1);
    }

    #[test]
    fn mindspore_spellings_and_defaults() {
        let (p, d) =
            check("parallel P { mode = data_parallel, mesh = { dp: 8 }, optimizer_shard = true }");
        assert!(d.is_empty(), "{d:?}");
        assert_eq!(
            (p.mode, p.devices, p.data_parallel_size(), p.optimizer_shard),
            (ParallelMode::Data, 8, 8, OptimizerShard::Level1)
        );
        let (p, d) = check("parallel P { mode = stand_alone }");
        assert!(d.is_empty(), "{d:?}");
        assert_eq!(
            (p.devices, p.data_parallel_size(), p.pipeline),
            (1, 1, None)
        );
        let (p, _) = check("parallel P { mode = auto_parallel, mesh = { x: 4 }, pipeline = { stages: 2, micro_size: 4, schedule: gpipe } }");
        assert_eq!(p.mode, ParallelMode::Auto);
        assert_eq!(p.data_parallel_size(), 1);
        assert_eq!(
            p.pipeline.map(|p| p.schedule),
            Some(PipelineSchedule::GPipe)
        );
    }

    #[test]
    fn auto_needs_only_a_device_count() {
        let (p, diags) = check("parallel P { mode = auto, devices = 1024 }");
        assert!(diags.is_empty(), "{diags:?}");
        assert_eq!(
            (p.mode, p.devices, p.mesh.len()),
            (ParallelMode::Auto, 1024, 0)
        );
        // Without either, the help says both ways.
        let (_, diags) = check("parallel P { mode = auto }");
        assert_eq!(codes(&diags), vec![Code::E0501]);
        assert!(diags[0].help.as_deref().unwrap().contains("devices = 1024"));
        // Other modes still need the mesh.
        let (_, diags) = check("parallel P { mode = semi_auto, devices = 8 }");
        assert_eq!(codes(&diags), vec![Code::E0501, Code::E0507]);
    }

    #[test]
    fn device_count_must_match_the_mesh() {
        let src = "parallel P { mesh = { dp: 2, mp: 4 }, mode = semi_auto, devices = 6 }";
        let (_, diags) = check(src);
        assert_eq!(codes(&diags), vec![Code::E0507]);
        assert_eq!(diags[0].primary.span, span_of(src, "6", 0));
        assert_eq!(
            diags[0].related[0].span,
            span_of(src, "{ dp: 2, mp: 4 }", 0)
        );
        assert_eq!(diags[0].related[0].message, "2 × 4 = 8 devices");
        let (_, diags) = check("parallel P { mode = stand_alone, devices = 4 }");
        assert_eq!(codes(&diags), vec![Code::E0507]);
    }

    #[test]
    fn mesh_problems() {
        let src = "parallel P { mesh = { dp: 2, dp: 4, mp: 0, _: 2 }, mode = semi_auto }";
        let (p, diags) = check(src);
        assert_eq!(codes(&diags), vec![Code::E0502; 3]);
        assert_eq!(diags[0].primary.span, span_of(src, "dp", 1));
        assert_eq!(diags[0].related[0].span, span_of(src, "dp", 0));
        assert_eq!(diags[1].primary.span, span_of(src, "0", 0));
        assert_eq!(p.mesh, vec![("dp".to_string(), 2)]);
        let (_, diags) = check("parallel P { mode = semi_auto }");
        assert_eq!(codes(&diags), vec![Code::E0501]);
        let (_, diags) = check("parallel P { mode = stand_alone, mesh = { dp: 2 } }");
        assert_eq!(codes(&diags), vec![Code::E0502]);
        let (_, diags) = check("parallel P { mode = semi_auto, mesh = {} }");
        assert_eq!(codes(&diags), vec![Code::E0502]);
        let (_, diags) = check("parallel P { mode = semi, mesh = [2, 4] }");
        assert_eq!(codes(&diags), vec![Code::E0502, Code::E0502]);
        assert_eq!(diags[0].help.as_deref(), Some("did you mean `semi_auto`? parallel mode is one of `stand_alone`, `data`, `semi_auto` or `auto`"));
        let (_, diags) =
            check("parallel P { mode = semi_auto, mesh = { a: 4294967296, b: 4294967296 } }");
        assert_eq!(codes(&diags), vec![Code::E0502]);
    }

    #[test]
    fn shard_rule_problems() {
        let src = r#"parallel P {
            mesh = { dp: 2, mp: 4 }, mode = semi_auto
            shard "a.{b,c" = [mp]
            shard "x.*" = [tp, _]
            shard "y" = [mp, mp]
            shard "x.*" = [mp]
            shard "z" = mp
            shard "w" = [3]
        }"#;
        let (p, diags) = check(src);
        assert_eq!(
            codes(&diags),
            vec![
                Code::E0502,
                Code::E0504,
                Code::E0502,
                Code::E0502,
                Code::E0502,
                Code::E0502
            ]
        );
        let brace = span_of(src, "{b,c", 0).start;
        assert_eq!(diags[0].primary.span, Span::new(brace, brace + 1));
        assert_eq!(diags[1].primary.span, span_of(src, "tp", 0));
        assert_eq!(
            diags[1].related[0].span,
            span_of(src, "{ dp: 2, mp: 4 }", 0)
        );
        assert_eq!(diags[1].help.as_deref(), Some("expected `dp` or `mp`"));
        assert_eq!(diags[2].primary.span, span_of(src, "mp", 3));
        assert_eq!(diags[2].related[0].span, span_of(src, "mp", 2));
        assert_eq!(diags[3].primary.span, span_of(src, "\"x.*\"", 1));
        assert_eq!(diags[4].primary.span, span_of(src, "mp", 5));
        assert_eq!(diags[5].primary.span, span_of(src, "3", 0));
        // The rule with an unknown axis is kept, so its pattern is still checked against the model.
        let patterns: Vec<&str> = p.shards.iter().map(|r| r.pattern.as_str()).collect();
        assert_eq!(patterns, vec!["x.*", "y"]);

        let src = "parallel P { mesh = { dp: 8 }, mode = data, shard \"w\" = [dp] }";
        let (_, diags) = check(src);
        assert_eq!(codes(&diags), vec![Code::E0502]);
        assert_eq!(diags[0].primary.span, span_of(src, "\"w\"", 0));
        assert_eq!(diags[0].related[0].span, span_of(src, "data", 0));
    }

    #[test]
    fn pipeline_problems() {
        let src = "parallel P { mesh = { dp: 2, mp: 3 }, mode = semi_auto, pipeline = { stages: 4, micro_batches: 2 } }";
        let (p, diags) = check(src);
        assert_eq!(codes(&diags), vec![Code::E0510, Code::E0510]);
        let micro = span_of(src, "micro_batches: 2", 0).end;
        assert_eq!(diags[0].primary.span, Span::new(micro - 1, micro));
        assert_eq!(diags[1].primary.span, span_of(src, "4", 0));
        assert_eq!(p.pipeline, None);
        let (_, diags) = check("parallel P { mesh = { dp: 2 }, mode = data, pipeline = { stages: 2, micro_batches: 2 } }");
        assert_eq!(codes(&diags), vec![Code::E0510]);
        let (_, diags) = check("parallel P { mesh = { dp: 2 }, mode = auto, pipeline = { stages: 2, schedule: zero_bubble } }");
        assert_eq!(codes(&diags), vec![Code::E0501, Code::E0502]);
        let (_, diags) = check(
            "parallel P { mesh = { dp: 2 }, mode = auto, pipeline = 2, optimizer_shard = level4 }",
        );
        assert_eq!(codes(&diags), vec![Code::E0502, Code::E0502]);
    }

    /// The W0040 threshold is a size; anything else is an error at the value, and a mode that
    /// never redistributes makes it W0042 at the field.
    #[test]
    fn redistribution_threshold_is_a_size_for_tensor_parallel_modes() {
        let src = "parallel P { mesh = { dp: 2, mp: 2 }, mode = semi_auto, redistribution_threshold = 256MB }";
        let (p, diags) = check(src);
        assert!(diags.is_empty(), "{diags:?}");
        let value = span_of(src, "256MB", 0);
        assert_eq!(p.redistribution_threshold, Some((256_000_000, value)));
        let (p, diags) = check(
            "parallel P { mesh = { dp: 2, mp: 2 }, mode = semi_auto, redistribution_threshold = 3 }",
        );
        assert_eq!(codes(&diags).len(), 1, "{diags:?}");
        assert!(diags[0].is_error());
        assert_eq!(p.redistribution_threshold, None);
        let src = "parallel P { mesh = { dp: 2 }, mode = data, redistribution_threshold = 1GB }";
        let (_, diags) = check(src);
        assert_eq!(codes(&diags), vec![Code::W0042]);
        assert_eq!(diags[0].primary.span, span_of(src, "1GB", 0));
    }

    #[test]
    fn interleaved_schedule_and_sequence_parallel() {
        let (p, diags) = check("parallel P { mesh = { dp: 2, mp: 2 }, mode = semi_auto, pipeline = { stages: 2, micro_batches: 4, schedule: interleaved(3) }, sequence_parallel = true }");
        assert!(diags.is_empty(), "{diags:?}");
        assert_eq!(
            p.pipeline.map(|p| p.schedule),
            Some(PipelineSchedule::Interleaved(3))
        );
        assert_eq!(p.sequence_parallel, Some(true));
        let (p, _) = check("parallel P { mode = auto, devices = 8 }");
        assert_eq!(p.sequence_parallel, None);
        for bad in [
            "interleaved(0)",
            "interleaved()",
            "interleaved(2, 3)",
            "interleaved(v: 2)",
        ] {
            let src = format!("parallel P {{ mesh = {{ dp: 2 }}, mode = semi_auto, pipeline = {{ stages: 2, micro_batches: 4, schedule: {bad} }} }}");
            let (p, diags) = check(&src);
            assert_eq!(codes(&diags), vec![Code::E0502], "{bad}");
            assert_eq!(p.pipeline, None);
        }
        let (_, diags) = check("parallel P { mode = auto, devices = 8, sequence_parallel = 1 }");
        assert_eq!(codes(&diags), vec![Code::E0502]);
    }
}
