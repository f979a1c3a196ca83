//! What the parallel planner needs to know about a training graph, read off the elaborated
//! model op by op: its repeated layers (the units a pipeline splits), and per layer the
//! parameters, the forward flops and bytes from the op registry, the activations the backward
//! keeps, and — under a tensor-parallel degree — which of them are split and which partial sums
//! need an all-reduce. The tensor-parallel layout follows from the split parameters by
//! propagation (see [`propagate`]).

use std::collections::BTreeMap;

use mslc_core::ops::{self, CostRule, DType, Op, TensorType};
use mslc_core::program::{Model, ValueId};

/// One contiguous part of the graph: a repeated layer, or what comes before the first
/// (embeddings) or after the last (final norm, output layer, loss).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Segment {
    /// The instance path, e.g. `model.layers.3`; `(before layers)` / `(after layers)`.
    pub name: String,
    /// Trainable parameter elements the segment's ops read, whole.
    pub params: u64,
    /// Of those, the elements split over the tensor-parallel axis.
    pub split_params: u64,
    /// Each parameter read: its index in the model, elements, whether split — so a stage
    /// holding two segments that share one (a tied embedding) counts it once.
    pub weights: Vec<(usize, u64, bool)>,
    /// Forward roofline time at tensor-parallel degree 1 of ops that are not split, seconds.
    pub rep_seconds: f64,
    /// Forward roofline time of ops that are split (divided by the degree), seconds.
    pub split_seconds: f64,
    /// Forward flops.
    pub flops: u64,
    /// Bytes of the activations the backward keeps that are not split.
    pub rep_acts: u64,
    /// Of those, the ones with a sequence dim (norm and dropout outputs, residual sums, the
    /// layer input): what sequence parallelism splits over the tensor-parallel axis.
    pub seq_acts: u64,
    /// Forward time of the unsplit ops producing `seq_acts` (split too under sequence
    /// parallelism).
    pub seq_seconds: f64,
    /// Bytes of kept activations split over the tensor-parallel axis.
    pub split_acts: u64,
    /// Of the split activations, those with two sequence-long dims (attention scores,
    /// probabilities, their dropout): what selective recompute drops.
    pub score_acts: u64,
    /// Forward time of the ops producing `score_acts` (what selective recompute repeats).
    pub score_seconds: f64,
    /// Bytes of the activations entering the segment (what full recompute keeps); under
    /// sequence parallelism those with a sequence dim are split.
    pub input_bytes: u64,
    /// Of `input_bytes`, those with a sequence dim.
    pub seq_input_bytes: u64,
    /// The largest single activation, as split (the transient an op needs at once).
    pub largest_act: u64,
    /// Forward all-reduces of partial sums (row-parallel outputs), bytes each.
    pub forward_all_reduces: Vec<u64>,
    /// Backward all-reduces of the input gradients of column-parallel ops, bytes each.
    pub backward_all_reduces: Vec<u64>,
    /// Redistributions the propagation could not avoid (an all-gather), bytes each, with the
    /// op that needed it.
    pub all_gathers: Vec<(String, u64)>,
}

/// A training graph as the parallel planner sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    /// Before the first layer.
    pub head: Segment,
    /// The repeated layers, in order.
    pub layers: Vec<Segment>,
    /// After the last layer.
    pub tail: Segment,
    /// Trainable parameter elements of the whole model (each counted once).
    pub params: u64,
    /// Bytes of the activation passed from one layer to the next (a pipeline send).
    pub boundary_bytes: u64,
    /// The tensor-parallel degree the layout was propagated for.
    pub tp: i64,
    /// Parameters whose split was chosen, with the dim split.
    pub shardings: BTreeMap<String, Vec<Option<String>>>,
    /// Parameters a shard rule asks to split along a dim the degree does not divide, left
    /// whole: path, dim, its size.
    pub undivided: Vec<(String, usize, i64)>,
    /// The large activations of the first layer, the head and the tail (at least 1/8 of the
    /// largest), largest first: what `--explain-plan` lists.
    pub activations: Vec<Activation>,
    /// The tensor-parallel collectives each split parameter causes per micro-batch (over all
    /// layers): path → (what, bytes). A row-parallel weight's output all-reduce (forward), a
    /// column-parallel weight's input-gradient all-reduce (backward; shared by the weights
    /// reading the same input, listed under the first).
    pub caused: BTreeMap<String, Vec<(&'static str, u64)>>,
    /// The tensor-parallel collectives that move an activation of the head, the first layer
    /// or the tail, per micro-batch: what `--explain-plan` lists per activation.
    pub moved: Vec<Moved>,
}

/// A collective moving one activation (or its gradient), once per micro-batch.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Moved {
    /// The op making the activation, with its instance path (`matmul in model.layers.0.mlp`);
    /// `input NAME` for a model input.
    pub activation: String,
    /// Its shape, whole.
    pub shape: Vec<i64>,
    /// What moves it: `forward all-reduce`, `backward all-reduce of its gradient`,
    /// `all-gather before OP`.
    pub what: String,
    /// Bytes per call (the whole activation).
    pub bytes: u64,
    /// Whether it is in a repeated layer (the first), so every layer repeats it.
    pub per_layer: bool,
}

impl Segment {
    /// The segment for a micro-batch `factor` times the size: activations, flops, op times
    /// and collective bytes scaled (op times linearly — the weights' reads inside memory-bound
    /// ops do not really scale, a small overestimate for larger micro-batches), parameters
    /// not.
    fn scaled(&self, factor: f64) -> Segment {
        let b = |x: u64| (x as f64 * factor).round() as u64;
        Segment {
            rep_seconds: self.rep_seconds * factor,
            split_seconds: self.split_seconds * factor,
            seq_seconds: self.seq_seconds * factor,
            score_seconds: self.score_seconds * factor,
            flops: b(self.flops),
            rep_acts: b(self.rep_acts),
            seq_acts: b(self.seq_acts),
            split_acts: b(self.split_acts),
            score_acts: b(self.score_acts),
            input_bytes: b(self.input_bytes),
            seq_input_bytes: b(self.seq_input_bytes),
            largest_act: b(self.largest_act),
            forward_all_reduces: self.forward_all_reduces.iter().map(|&x| b(x)).collect(),
            backward_all_reduces: self.backward_all_reduces.iter().map(|&x| b(x)).collect(),
            all_gathers: self
                .all_gathers
                .iter()
                .map(|(op, x)| (op.clone(), b(*x)))
                .collect(),
            ..self.clone()
        }
    }
}

impl Workload {
    /// The workload of a micro-batch `factor` times the size (see [`Segment::scaled`]): what
    /// a what-if on the micro-batch count estimates with the batch per step unchanged.
    pub fn scaled(&self, factor: f64) -> Workload {
        Workload {
            head: self.head.scaled(factor),
            layers: self.layers.iter().map(|l| l.scaled(factor)).collect(),
            tail: self.tail.scaled(factor),
            boundary_bytes: (self.boundary_bytes as f64 * factor).round() as u64,
            ..self.clone()
        }
    }
}

/// One activation as the layout propagation left it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Activation {
    /// The op making it, with its instance path (`add in model.layers.0.mlp`).
    pub name: String,
    /// Its shape, whole.
    pub shape: Vec<i64>,
    /// The dim split over the tensor-parallel axis, `None` where every rank holds all of it.
    pub split: Option<usize>,
    /// Bytes per rank per micro-batch in that layout.
    pub bytes: u64,
    /// Whether it has a sequence dim (sequence parallelism would split it when whole).
    pub sequence: bool,
    /// Whether the backward keeps it (else a transient).
    pub kept: bool,
}

/// The layout of one value under tensor parallelism.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    /// Every device of the tensor-parallel group holds all of it.
    Rep,
    /// Split along this dim.
    Split(usize),
    /// Every device holds a partial sum (a row-parallel matmul's output before its all-reduce).
    Partial,
}

/// How the layout of the weights is decided.
#[derive(Clone, Debug)]
pub enum WeightSplits<'a> {
    /// As the user's shard rules say: parameter path → the dim split over the tensor axis.
    Given(&'a BTreeMap<String, usize>),
    /// Chosen per matmul by least redistribution: column-parallel where the input is
    /// replicated, row-parallel where it is already split (Megatron's pairing).
    Chosen,
}

/// What the workload is built for: the activation element width and the degree.
#[derive(Clone, Copy, Debug)]
pub struct Widths {
    /// Bytes per floating-point activation element (2 under f16/bf16 compute).
    pub act_bytes: u64,
    /// The tensor-parallel degree.
    pub tp: i64,
    /// Peak FLOP/s × efficiency, for each op's roofline.
    pub flops_per_s: f64,
    /// Memory bandwidth, bytes/s.
    pub bandwidth: f64,
}

/// Reads `model` (the train's graph: model, labels and loss) into a workload, propagating the
/// tensor-parallel layout from `splits` to every op.
pub fn workload(model: &Model, splits: &WeightSplits, w: Widths) -> Workload {
    let tp = w.tp.max(1);
    let param_of: BTreeMap<ValueId, usize> = model
        .params
        .iter()
        .enumerate()
        .filter(|(_, p)| p.trainable)
        .map(|(i, p)| (p.value, i))
        .collect();
    let n = model.values.len();
    // A value derived from a single parameter through views and casts stands for it; the flag
    // says the view is the parameter transposed (a rank-2 weight used as `W.T`).
    let mut root: Vec<Option<(usize, bool)>> = vec![None; n];
    let mut is_act = vec![false; n];
    let mut layout = vec![Layout::Rep; n];
    for input in &model.inputs {
        is_act[input.value.0 as usize] = true;
    }
    for (&v, &i) in &param_of {
        root[v.0 as usize] = Some((i, false));
    }
    let mut chosen: BTreeMap<usize, usize> = BTreeMap::new();
    let given_layout = |chosen: &BTreeMap<usize, usize>, p: usize, root_ty: &TensorType| {
        let split = match splits {
            WeightSplits::Given(map) => map.get(&model.params[p].path).copied(),
            WeightSplits::Chosen => chosen.get(&p).copied(),
        };
        match split {
            Some(d) if tp > 1 && root_ty.shape.get(d).is_some_and(|s| s % tp == 0) => {
                Layout::Split(d)
            }
            _ => Layout::Rep,
        }
    };
    let seq = model
        .inputs
        .first()
        .and_then(|i| model.ty(i.value).shape.get(1).copied())
        .unwrap_or(0);
    // A tensor with a sequence dim after its batch dim: what sequence parallelism splits.
    let has_seq = |ty: &TensorType| seq > 1 && ty.rank() >= 2 && ty.shape[1] == seq;
    // Attention scores, what selective recompute drops: [..., S, S] with more in front than
    // the batch (the heads) — so a [B, S, H] activation with H = S is not one.
    let batch = model
        .inputs
        .first()
        .and_then(|i| model.ty(i.value).shape.first().copied())
        .unwrap_or(1);
    let is_score = |ty: &TensorType| {
        let r = ty.rank();
        seq > 1
            && r >= 3
            && ty.shape[r - 1] == seq
            && ty.shape[r - 2] == seq
            && ty.shape[..r - 2].iter().product::<i64>() != batch
    };
    // The buffer each value lives in (a view's is its input's), and the buffers the backward
    // reads.
    let mut storage: Vec<usize> = (0..n).collect();
    let mut saved: std::collections::BTreeSet<usize> = Default::default();
    let mut reads_cache: std::collections::HashMap<String, Vec<bool>> = Default::default();
    // Outputs of the head, the tail and the first layer, for `activations`.
    let mut logged: Vec<(usize, String)> = Vec::new();
    let seg_of = |origin: &str| layer_key(origin);
    let first_layer = model.nodes.iter().position(|n| seg_of(&n.origin).is_some());
    let mut head = Segment {
        name: "(before layers)".into(),
        ..Default::default()
    };
    let mut tail = Segment {
        name: "(after layers)".into(),
        ..Default::default()
    };
    let mut layers: Vec<Segment> = Vec::new();
    let mut layer_index: BTreeMap<String, usize> = BTreeMap::new();
    // The segment that produced each activation (`NONE` for model inputs).
    const NONE: isize = isize::MIN;
    let mut producer_seg: Vec<isize> = vec![NONE; n];
    let mut seg_params: Vec<std::collections::BTreeSet<usize>> = Vec::new();
    let (mut head_params, mut tail_params) = (Default::default(), Default::default());
    let mut seg_inputs: Vec<std::collections::BTreeSet<ValueId>> = Vec::new();
    let mut boundary_bytes = 0u64;
    let mut col_inputs: std::collections::BTreeSet<ValueId> = Default::default();
    // The split parameter that made each partial sum.
    let mut partial_of: Vec<Option<usize>> = vec![None; n];
    let mut caused: BTreeMap<usize, Vec<(&'static str, u64)>> = BTreeMap::new();
    // The name of each activation of the head, the first layer and the tail, and the
    // collectives moving them.
    let mut act_name: Vec<Option<String>> = vec![None; n];
    for input in &model.inputs {
        act_name[input.value.0 as usize] = Some(format!("input {}", input.name));
    }
    let mut moved: Vec<Moved> = Vec::new();
    // `seg`: the segment whose op causes the collective; only the head, the first layer (0)
    // and the tail (−2) are listed, like the large activations.
    let mut record = |(names, seg): (&[Option<String>], isize), v: ValueId, what, bytes| {
        if let (Some(name), true) = (&names[v.0 as usize], seg <= 0) {
            moved.push(Moved {
                activation: name.clone(),
                shape: model.ty(v).shape.clone(),
                what,
                bytes,
                per_layer: seg == 0,
            });
        }
    };
    let bytes_of = |ty: &TensorType, lay: Layout| -> u64 {
        let width = if ty.dtype.is_float() {
            w.act_bytes.min(ty.dtype.size_bytes())
        } else {
            ty.dtype.size_bytes()
        };
        let b = ty.numel().saturating_mul(width);
        match lay {
            Layout::Split(_) => b.div_ceil(tp as u64),
            _ => b,
        }
    };
    for (idx, node) in model.nodes.iter().enumerate() {
        let act_in = node.inputs.iter().any(|v| is_act[v.0 as usize]);
        if !act_in {
            // Parameter-only work (casts, views of weights, masks): no activation.
            if let ([input], [out]) = (&node.inputs[..], &node.outputs[..]) {
                let flips = node.op == Op::Transpose && model.ty(*out).rank() == 2;
                root[out.0 as usize] = root[input.0 as usize].map(|(p, t)| (p, t != flips));
            }
            continue;
        }
        let seg_id: isize = match seg_of(&node.origin) {
            Some(key) => {
                let next = layers.len();
                let i = *layer_index.entry(key.clone()).or_insert(next);
                if i == next {
                    layers.push(Segment {
                        name: key,
                        ..Default::default()
                    });
                    seg_params.push(Default::default());
                    seg_inputs.push(Default::default());
                }
                i as isize
            }
            None if first_layer.is_none_or(|f| idx < f) => -1,
            None => -2,
        };
        let in_types: Vec<TensorType> = node.inputs.iter().map(|v| model.ty(*v).clone()).collect();
        // Weight layouts: given, or chosen for this matmul by least redistribution.
        if let (WeightSplits::Chosen, Op::Matmul) = (splits, node.op) {
            if let [a, b] = &node.inputs[..] {
                if let Some((p, transposed)) = root[b.0 as usize].filter(|_| !is_act[b.0 as usize])
                {
                    let tb = node
                        .attrs
                        .opt_bool("transpose_b")
                        .ok()
                        .flatten()
                        .unwrap_or(false);
                    let pty = model.ty(model.params[p].value);
                    if pty.rank() == 2 && !chosen.contains_key(&p) {
                        // The operand's dims: [k, n], or [n, k] when transposed by the matmul;
                        // a transposed view of the parameter flips them once more.
                        let (k_dim, n_dim) = if tb != transposed { (1, 0) } else { (0, 1) };
                        let dim = match layout[a.0 as usize] {
                            Layout::Split(d) if d + 1 == in_types[0].rank() => k_dim,
                            _ => n_dim,
                        };
                        chosen.insert(p, dim);
                    }
                }
            }
        }
        let mut in_layouts: Vec<Layout> = Vec::with_capacity(node.inputs.len());
        for v in &node.inputs {
            let i = v.0 as usize;
            let lay = if is_act[i] {
                layout[i]
            } else if let Some((p, transposed)) = root[i] {
                let pty = model.ty(model.params[p].value).clone();
                // A transposed view of a weight moves its split dim.
                match given_layout(&chosen, p, &pty) {
                    Layout::Split(d) if transposed => Layout::Split(1 - d),
                    l => l,
                }
            } else {
                Layout::Rep
            };
            in_layouts.push(lay);
        }
        // A partial sum is all-reduced where it is produced, before anything but a matmul
        // output reads it.
        for (k, v) in node.inputs.iter().enumerate() {
            if in_layouts[k] == Layout::Partial {
                let owner = match producer_seg[v.0 as usize] {
                    NONE => seg_id,
                    s => s,
                };
                let bytes = bytes_of(model.ty(*v), Layout::Rep);
                segment_mut(&mut head, &mut tail, &mut layers, owner)
                    .forward_all_reduces
                    .push(bytes);
                if let Some(p) = partial_of[v.0 as usize] {
                    caused
                        .entry(p)
                        .or_default()
                        .push(("forward all-reduce of its output", bytes));
                }
                record((&act_name, owner), *v, "forward all-reduce".into(), bytes);
                in_layouts[k] = Layout::Rep;
                layout[v.0 as usize] = Layout::Rep;
            }
        }
        let segment = segment_mut(&mut head, &mut tail, &mut layers, seg_id);
        // Parameters read.
        let params_here: &mut std::collections::BTreeSet<usize> = match seg_id {
            -1 => &mut head_params,
            -2 => &mut tail_params,
            i => &mut seg_params[i as usize],
        };
        for (v, lay) in node.inputs.iter().zip(&in_layouts) {
            if let Some((p, _)) = root[v.0 as usize].filter(|_| !is_act[v.0 as usize]) {
                if params_here.insert(p) {
                    let numel = model.ty(model.params[p].value).numel();
                    let split = matches!(lay, Layout::Split(_));
                    segment.params += numel;
                    segment.weights.push((p, numel, split));
                    if split {
                        segment.split_params += numel;
                    }
                }
            }
        }
        // Activations entering a layer from before it.
        if seg_id >= 0 {
            for v in &node.inputs {
                let i = v.0 as usize;
                if is_act[i]
                    && producer_seg[i] != seg_id
                    && producer_seg[i] != NONE
                    && seg_inputs[seg_id as usize].insert(*v)
                {
                    let b = bytes_of(model.ty(*v), layout[i]);
                    segment.input_bytes += b;
                    if has_seq(model.ty(*v)) && layout[i] == Layout::Rep {
                        segment.seq_input_bytes += b;
                    }
                    boundary_bytes = boundary_bytes.max(b);
                }
            }
        }
        let out_types: Vec<TensorType> =
            node.outputs.iter().map(|v| model.ty(*v).clone()).collect();
        let (out_layout, gathers, col_parallel) =
            propagate(node.op, &node.attrs, &in_types, &in_layouts, &out_types, tp);
        for (k, bytes_needed) in gathers {
            let whole = bytes_of(&in_types[k], Layout::Rep);
            record(
                (&act_name, seg_id),
                node.inputs[k],
                format!("all-gather before {}", node.op.name()),
                whole,
            );
            segment.all_gathers.push((
                format!("{} in {}", node.op.name(), node.origin),
                match bytes_needed {
                    0 => bytes_of(&in_types[k], Layout::Rep),
                    stats => stats,
                },
            ));
        }
        // Column-parallel matmuls reading the same input (q, k, v; gate, up) share one
        // all-reduce of its gradient, as Megatron's `f` operator does.
        let weight = node
            .inputs
            .iter()
            .zip(&in_layouts)
            .find(|(v, l)| matches!(l, Layout::Split(_)) && !is_act[v.0 as usize])
            .and_then(|(v, _)| root[v.0 as usize])
            .map(|(p, _)| p);
        if col_parallel && col_inputs.insert(node.inputs[0]) {
            let bytes = bytes_of(&in_types[0], Layout::Rep);
            record(
                (&act_name, seg_id),
                node.inputs[0],
                "backward all-reduce of its gradient".into(),
                bytes,
            );
            segment.backward_all_reduces.push(bytes);
            if let Some(p) = weight {
                caused
                    .entry(p)
                    .or_default()
                    .push(("backward all-reduce of its input's gradient", bytes));
            }
        }
        if out_layout == Layout::Partial {
            for v in &node.outputs {
                partial_of[v.0 as usize] = weight;
            }
        }
        let split = matches!(out_layout, Layout::Split(_) | Layout::Partial);
        if let Ok(cost) = ops::cost(node.op, &node.attrs, &in_types) {
            let scale = |x: u64| x as f64 * (w.act_bytes as f64 / 4.0).min(1.0);
            let t = (cost.flops as f64 / w.flops_per_s)
                .max(scale(cost.bytes_read + cost.bytes_written) / w.bandwidth);
            segment.flops += cost.flops;
            if split {
                segment.split_seconds += t;
            } else {
                segment.rep_seconds += t;
            }
            let view = matches!(node.op.spec().cost, CostRule::View);
            for (v, ty) in node.outputs.iter().zip(&out_types) {
                let i = v.0 as usize;
                is_act[i] = true;
                layout[i] = out_layout;
                producer_seg[i] = seg_id;
                storage[i] = match (view, node.inputs.first()) {
                    (true, Some(input)) if is_act[input.0 as usize] => storage[input.0 as usize],
                    _ => i,
                };
                if view || !ty.dtype.is_float() && ty.dtype != DType::Bool {
                    continue;
                }
                let b = bytes_of(ty, out_layout);
                segment.largest_act = segment.largest_act.max(b);
                if seg_id <= 0 {
                    let place = match node.origin.as_str() {
                        "" => "the model's body",
                        o => o,
                    };
                    let name = format!("{} in {place}", node.op.name());
                    act_name[i] = Some(name.clone());
                    logged.push((i, name));
                }
                if is_score(ty) {
                    segment.score_seconds += t;
                } else if !split && has_seq(ty) {
                    segment.seq_seconds += t;
                }
            }
        }
        // What the backward keeps of this op: the values its gradient rule reads.
        let needs_grad: Vec<bool> = node
            .inputs
            .iter()
            .map(|v| {
                let i = v.0 as usize;
                is_act[i] || root[i].is_some_and(|(p, _)| model.params[p].trainable)
            })
            .collect();
        // Repeated layers repeat the same ops: run each distinct rule application once.
        let key = format!("{:?}{:?}{:?}{needs_grad:?}", node.op, node.attrs, in_types);
        let reads = reads_cache.entry(key).or_insert_with(|| {
            backward_reads(node.op, &node.attrs, &in_types, &out_types, &needs_grad).unwrap_or_else(
                || {
                    let mut all = vec![true; node.inputs.len()];
                    all.resize(node.inputs.len() + node.outputs.len(), false);
                    all
                },
            )
        });
        for (v, &read) in node.inputs.iter().chain(&node.outputs).zip(reads.iter()) {
            let i = v.0 as usize;
            if read && is_act[i] {
                saved.insert(storage[i]);
            }
        }
    }
    // The kept activations, each buffer once, in the layout it ends in, to the segment that
    // made it (model inputs, held by the data loader, are not counted).
    for &i in &saved {
        let seg = producer_seg[i];
        let ty = &model.values[i];
        if seg == NONE || !ty.dtype.is_float() && ty.dtype != DType::Bool {
            continue;
        }
        let b = bytes_of(ty, layout[i]);
        let segment = segment_mut(&mut head, &mut tail, &mut layers, seg);
        if is_score(ty) {
            segment.score_acts += b;
        }
        if matches!(layout[i], Layout::Split(_)) {
            segment.split_acts += b;
        } else {
            segment.rep_acts += b;
            if has_seq(ty) {
                segment.seq_acts += b;
            }
        }
    }
    let mut activations: Vec<Activation> = logged
        .into_iter()
        .map(|(i, name)| {
            let ty = &model.values[i];
            Activation {
                name,
                shape: ty.shape.clone(),
                split: match layout[i] {
                    Layout::Split(d) => Some(d),
                    _ => None,
                },
                bytes: bytes_of(ty, layout[i]),
                sequence: has_seq(ty),
                kept: saved.contains(&storage[i]),
            }
        })
        .collect();
    activations.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.name.cmp(&b.name)));
    let cut = activations.first().map_or(0, |a| a.bytes / 8);
    activations.retain(|a| a.bytes >= cut);
    let undivided = model
        .params
        .iter()
        .enumerate()
        .filter_map(|(i, p)| {
            let d = match splits {
                WeightSplits::Given(map) => map.get(&p.path).copied(),
                WeightSplits::Chosen => chosen.get(&i).copied(),
            }?;
            let size = *model.ty(p.value).shape.get(d)?;
            (tp > 1 && size % tp != 0).then(|| (p.path.clone(), d, size))
        })
        .collect();
    let caused = caused
        .into_iter()
        .map(|(p, c)| (model.params[p].path.clone(), c))
        .collect();
    let shardings = model
        .params
        .iter()
        .enumerate()
        .filter_map(|(i, p)| {
            let ty = model.ty(p.value);
            match given_layout(&chosen, i, ty) {
                Layout::Split(d) => {
                    let mut spec = vec![None; ty.rank()];
                    spec[d] = Some("tp".to_string());
                    Some((p.path.clone(), spec))
                }
                _ => None,
            }
        })
        .collect();
    Workload {
        head,
        layers,
        tail,
        params: model
            .params
            .iter()
            .filter(|p| p.trainable)
            .map(|p| model.ty(p.value).numel())
            .sum(),
        boundary_bytes,
        tp,
        shardings,
        undivided,
        activations,
        caused,
        moved,
    }
}

/// The segment `id` names: −1 the head, −2 the tail, else a layer.
fn segment_mut<'a>(
    head: &'a mut Segment,
    tail: &'a mut Segment,
    layers: &'a mut [Segment],
    id: isize,
) -> &'a mut Segment {
    match id {
        -1 => head,
        -2 => tail,
        i => &mut layers[i as usize],
    }
}

/// The layer an op belongs to: its instance path up to the first numeric segment
/// (`model.layers.3.mlp` → `model.layers.3`), `None` outside the repeated layers.
pub fn layer_key(origin: &str) -> Option<String> {
    let mut end = 0;
    for (i, part) in origin.split('.').enumerate() {
        end += part.len() + usize::from(i > 0);
        if !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()) {
            return Some(origin[..end].to_string());
        }
    }
    None
}

/// One op's tensor-parallel rule: the layout of its outputs from its inputs', the inputs that
/// must be all-gathered first (index, bytes), and whether it is a column-parallel matmul (whose
/// input gradient is a partial sum needing an all-reduce in the backward).
fn propagate(
    op: Op,
    attrs: &mslc_core::ops::Attrs,
    inputs: &[TensorType],
    layouts: &[Layout],
    outputs: &[TensorType],
    tp: i64,
) -> (Layout, Vec<(usize, u64)>, bool) {
    let out_rank = outputs.first().map_or(0, TensorType::rank);
    let split_inputs: Vec<(usize, usize)> = layouts
        .iter()
        .enumerate()
        .filter_map(|(k, l)| match l {
            Layout::Split(d) => Some((k, *d)),
            _ => None,
        })
        .collect();
    if split_inputs.is_empty() {
        return (Layout::Rep, vec![], false);
    }
    let gather_all = || {
        let g = split_inputs.iter().map(|&(k, _)| (k, 0)).collect();
        (Layout::Rep, g, false)
    };
    let flag = |name: &str| attrs.opt_bool(name).ok().flatten().unwrap_or(false);
    match op {
        Op::Matmul => {
            let (ra, rb) = (inputs[0].rank(), inputs[1].rank());
            if ra < 2 || rb < 2 {
                return gather_all();
            }
            let (ta, tb) = (flag("transpose_a"), flag("transpose_b"));
            let a_k = if ta { ra - 2 } else { ra - 1 };
            let a_m = if ta { ra - 1 } else { ra - 2 };
            let b_k = if tb { rb - 1 } else { rb - 2 };
            let b_n = if tb { rb - 2 } else { rb - 1 };
            match (layouts[0], layouts[1]) {
                (Layout::Split(d), Layout::Split(e)) if d == a_k && e == b_k => {
                    (Layout::Partial, vec![], false)
                }
                (Layout::Rep, Layout::Split(e)) if e == b_k => (Layout::Partial, vec![], false),
                (Layout::Rep, Layout::Split(e)) if e == b_n => {
                    (Layout::Split(out_rank - 1), vec![], true)
                }
                (Layout::Split(d), Layout::Rep) if d == a_m => {
                    (Layout::Split(out_rank - 2), vec![], false)
                }
                (Layout::Split(d), Layout::Rep) if d + 2 < ra && rb == 2 => {
                    (Layout::Split(d), vec![], false)
                }
                (Layout::Split(d), Layout::Split(e)) if d == e && d + 2 < ra => {
                    (Layout::Split(d), vec![], false)
                }
                (Layout::Split(d), Layout::Split(e)) if d + 2 < ra && e == b_n => {
                    (Layout::Split(d), vec![(1, 0)], false)
                }
                (Layout::Split(d), Layout::Split(e)) if d == a_m && e + 2 < rb => {
                    (Layout::Split(out_rank - 2), vec![(1, 0)], false)
                }
                _ => gather_all(),
            }
        }
        Op::Embedding => match layouts.get(1) {
            Some(Layout::Split(0)) => (Layout::Partial, vec![], false),
            Some(Layout::Split(_)) => (Layout::Split(out_rank - 1), vec![], false),
            _ => gather_all(),
        },
        Op::Transpose => {
            let perm = attrs.ints("perm").unwrap_or_default();
            let d = split_inputs[0].1;
            match perm.iter().position(|&p| p as usize == d) {
                Some(e) => (Layout::Split(e), vec![], false),
                None => gather_all(),
            }
        }
        Op::Reshape => {
            let d = split_inputs[0].1;
            match reshape_dim(&inputs[0].shape, &outputs[0].shape, d, tp) {
                Some(e) => (Layout::Split(e), vec![], false),
                None => gather_all(),
            }
        }
        _ => {
            // Shape-preserving ops (elementwise, norms, softmax, dropout, casts): the split
            // follows, right-aligned; an op that reduces over the split dim or changes the
            // shape needs the whole tensor.
            let (k, d) = split_inputs[0];
            let offset = out_rank as isize - inputs[k].rank() as isize;
            let e = d as isize + offset;
            let axis = attrs.opt_int("axis").ok().flatten();
            let reduces_split = axis.is_some_and(|a| {
                let r = inputs[k].rank() as i64;
                (if a < 0 { a + r } else { a }) == d as i64
            }) || matches!(op, Op::LayerNorm);
            let same_shape = outputs
                .first()
                .is_some_and(|o| e >= 0 && o.shape.get(e as usize) == inputs[k].shape.get(d));
            let all_agree = split_inputs
                .iter()
                .all(|&(k2, d2)| d2 as isize + out_rank as isize - inputs[k2].rank() as isize == e);
            if same_shape && all_agree && !reduces_split {
                (Layout::Split(e as usize), vec![], false)
            } else if same_shape && all_agree && out_rank == inputs[k].rank() {
                // Softmax or a norm over the split dim: statistics all-reduced, tiny.
                let stats = outputs[0].numel() / outputs[0].shape[e as usize].max(1) as u64 * 8;
                (Layout::Split(e as usize), vec![(k, stats)], false)
            } else if out_rank < inputs[k].rank() && outputs[0].numel() * 64 < inputs[k].numel() {
                // A reduction (a loss over the vocabulary) of a split input: partial results.
                (Layout::Partial, vec![], false)
            } else {
                gather_all()
            }
        }
    }
}

/// The output dim of a reshape that starts where input dim `d` starts (same count of elements
/// before it) and divides by the degree `tp` (heads split whole); `None` when there is none.
fn reshape_dim(from: &[i64], to: &[i64], d: usize, tp: i64) -> Option<usize> {
    let before: i64 = from[..d].iter().product();
    let mut acc = 1i64;
    for (e, &size) in to.iter().enumerate() {
        if acc == before && size % tp == 0 {
            return Some(e);
        }
        acc = acc.checked_mul(size)?;
        if acc > before {
            return None;
        }
    }
    None
}

/// A gradient rule's view of the graph: handles `0..inputs` are the op's inputs, then its
/// outputs, then one cotangent per output, then what the rule emits; each emitted value
/// remembers which of the op's inputs and outputs it was computed from.
struct Recorder {
    types: Vec<TensorType>,
    /// Per handle, the op's inputs and outputs (by handle) it depends on.
    deps: Vec<std::collections::BTreeSet<usize>>,
    /// Inputs plus outputs: handles below this are the forward values.
    forward: usize,
}

impl ops::Emitter for Recorder {
    fn ty(&self, value: ops::Handle) -> Result<TensorType, ops::OpError> {
        self.types
            .get(value.0)
            .cloned()
            .ok_or_else(|| ops::OpError::new("unknown handle"))
    }

    fn emit(
        &mut self,
        op: Op,
        attrs: ops::Attrs,
        inputs: &[ops::Handle],
    ) -> Result<Vec<ops::Handle>, ops::OpError> {
        let types: Vec<TensorType> = inputs
            .iter()
            .map(|h| self.ty(*h))
            .collect::<Result<_, _>>()?;
        let out = ops::infer(op, &attrs, &types)?;
        let mut deps = std::collections::BTreeSet::new();
        for h in inputs {
            if h.0 < self.forward {
                deps.insert(h.0);
            } else {
                deps.extend(self.deps[h.0].iter().copied());
            }
        }
        Ok(out
            .into_iter()
            .map(|t| {
                self.types.push(t);
                self.deps.push(deps.clone());
                ops::Handle(self.types.len() - 1)
            })
            .collect())
    }
}

/// Which of an op's inputs and outputs its backward reads — found by running the op's
/// gradient rule (the one autodiff runs) on placeholders and following the gradients of the
/// inputs in `needs_grad` back to the forward values they use, as autodiff's dead-code
/// elimination leaves them. Dropout redraws its mask from the seed, so it keeps nothing.
/// `None` when the op has no rule or it fails here (the caller then keeps every input).
fn backward_reads(
    op: Op,
    attrs: &ops::Attrs,
    inputs: &[TensorType],
    outputs: &[TensorType],
    needs_grad: &[bool],
) -> Option<Vec<bool>> {
    let rule = op.grad_rule().ok()?;
    let attrs = ops::resolve_attrs(op, attrs).unwrap_or_else(|_| attrs.clone());
    let forward = inputs.len() + outputs.len();
    let mut rec = Recorder {
        types: inputs
            .iter()
            .chain(outputs)
            .chain(outputs)
            .cloned()
            .collect(),
        deps: vec![Default::default(); forward + outputs.len()],
        forward,
    };
    let handles: Vec<ops::Handle> = (0..forward + outputs.len()).map(ops::Handle).collect();
    let cotangents: Vec<Option<ops::Handle>> =
        handles[forward..].iter().map(|&h| Some(h)).collect();
    let call = ops::GradCall {
        attrs: &attrs,
        inputs: &handles[..inputs.len()],
        outputs: &handles[inputs.len()..forward],
        cotangents: &cotangents,
    };
    let grads = rule(&mut rec, &call).ok()?;
    let mut read = vec![false; forward];
    for (g, _) in grads.iter().zip(needs_grad).filter(|(_, &n)| n) {
        if let Some(h) = g {
            if h.0 < forward {
                // A gradient that is a forward value itself (rare) keeps it.
                read[h.0] = true;
            } else {
                for &d in &rec.deps[h.0] {
                    read[d] = true;
                }
            }
        }
    }
    Some(read)
}
