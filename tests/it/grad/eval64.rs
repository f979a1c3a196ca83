//! A float64 interpreter of a [`Graph`]: every node in topological order, each op written the
//! straightforward way (loops over indices), independent of the kernels and of the gradient
//! rules. It evaluates forward and backward ops alike; ops it does not know go to
//! [`super::nn64::eval_op`].

use std::collections::HashMap;

use super::nn64;
use super::tensor64::T64;
use mslc_core::ops::family::elementwise::dropout_keeps;
use mslc_core::ops::family::layout::{permutation, select_index, SliceRange};
use mslc_core::ops::family::matmul::MatmulDims;
use mslc_core::ops::family::reduce::reduced_axes;
use mslc_core::ops::{normalize_axis, Attrs, DType, Op, TensorType};
use mslc_ir::{Graph, NodeKind, ValueRef};

/// Every value of `g`, given its inputs (by name) and parameters (by path).
pub fn eval_graph(
    g: &Graph,
    feeds: &HashMap<String, T64>,
) -> Result<HashMap<ValueRef, T64>, String> {
    let mut vals: HashMap<ValueRef, T64> = HashMap::new();
    for id in g.topo_order().ok_or("cycle")? {
        let node = g.node(id);
        let outs = match &node.kind {
            NodeKind::Input { name } => vec![feeds.get(name).ok_or(format!("no {name}"))?.clone()],
            NodeKind::Param { path, .. } => {
                vec![feeds.get(path).ok_or(format!("no {path}"))?.clone()]
            }
            NodeKind::Op { op, attrs } => {
                let ins: Vec<ValueRef> = g.inputs(id);
                let args: Vec<&T64> = ins.iter().map(|v| &vals[v]).collect();
                let types: Vec<TensorType> = ins.iter().map(|v| g.ty(*v).clone()).collect();
                eval_op(*op, attrs, &args, &types, &node.outputs)
                    .map_err(|e| format!("{op}: {e}"))?
            }
        };
        for (index, t) in outs.into_iter().enumerate() {
            let want: Vec<usize> = node.outputs[index]
                .shape
                .iter()
                .map(|&d| d as usize)
                .collect();
            if t.shape != want {
                return Err(format!("node {id:?} made {:?}, typed {want:?}", t.shape));
            }
            vals.insert(
                ValueRef {
                    node: id,
                    index: index as u32,
                },
                t,
            );
        }
    }
    Ok(vals)
}

fn dims(t: &TensorType) -> Vec<usize> {
    t.shape.iter().map(|&d| d as usize).collect()
}

/// `op` on f64 tensors; `types` are the inputs' IR types and `outs` the results' (for dtype
/// rules such as casts to integers).
pub fn eval_op(
    op: Op,
    attrs: &Attrs,
    x: &[&T64],
    types: &[TensorType],
    outs: &[TensorType],
) -> Result<Vec<T64>, String> {
    let e = |m: mslc_core::ops::OpError| m.message;
    if let Some(b) = op.binary() {
        let shape = dims(&outs[0]);
        let n = shape.iter().product();
        let data = (0..n)
            .map(|f| {
                let idx = T64::unravel(f, &shape);
                b.eval(x[0].at_broadcast(&idx), x[1].at_broadcast(&idx))
            })
            .collect();
        return Ok(vec![T64::new(&shape, data)]);
    }
    if let Some(u) = op.unary() {
        let data = x[0].data.iter().map(|&v| u.eval(v)).collect();
        return Ok(vec![T64::new(&x[0].shape, data)]);
    }
    let one = |t: T64| Ok(vec![t]);
    match op {
        Op::Constant => one(T64::scalar(attrs.float("value").map_err(e)?)),
        Op::Cast => {
            let to = attrs.dtype("dtype").map_err(e)?;
            let f = |v: f64| match to {
                DType::Bool => f64::from(v != 0.0),
                d if d.is_int() => v.trunc(),
                _ => v,
            };
            one(T64::new(
                &x[0].shape,
                x[0].data.iter().map(|&v| f(v)).collect(),
            ))
        }
        Op::Dropout => match x.get(1) {
            // Training mode: the kernels' mask, from the seed, the salt and the index.
            Some(seed) => {
                let p = attrs.float("p").map_err(e)?;
                let salt = attrs.opt_int("salt").map_err(e)?.unwrap_or(0);
                let seed = seed.data[0] as i64;
                let data = (x[0].data.iter().enumerate())
                    .map(|(i, &v)| match dropout_keeps(seed, salt, i as u64, p) {
                        true => v / (1.0 - p),
                        false => 0.0,
                    })
                    .collect();
                one(T64::new(&x[0].shape, data))
            }
            None => one(x[0].clone()),
        },
        Op::CausalMask => {
            let s = attrs.int("size").map_err(e)? as usize;
            let data = (0..s * s)
                .map(|i| {
                    if i % s > i / s {
                        f64::NEG_INFINITY
                    } else {
                        0.0
                    }
                })
                .collect();
            one(T64::new(&[s, s], data))
        }
        Op::Matmul => one(matmul(x[0], x[1], &types[0], &types[1], attrs, &outs[0])?),
        Op::Transpose => {
            let perm = permutation(attrs, x[0].rank()).map_err(e)?;
            let shape = dims(&outs[0]);
            let st = T64::strides(&x[0].shape);
            let data = (0..x[0].data.len())
                .map(|f| {
                    let idx = T64::unravel(f, &shape);
                    let src: usize = perm.iter().enumerate().map(|(i, &p)| idx[i] * st[p]).sum();
                    x[0].data[src]
                })
                .collect();
            one(T64::new(&shape, data))
        }
        Op::Reshape => one(T64::new(&dims(&outs[0]), x[0].data.clone())),
        Op::BroadcastTo => one(x[0].broadcast_to(&dims(&outs[0]))),
        Op::Concat => {
            let axis = normalize_axis(attrs.int("axis").map_err(e)?, x[0].rank())?;
            let shape = dims(&outs[0]);
            let n = shape.iter().product();
            let data = (0..n)
                .map(|f| {
                    let mut idx = T64::unravel(f, &shape);
                    let mut k = 0;
                    while idx[axis] >= x[k].shape[axis] {
                        idx[axis] -= x[k].shape[axis];
                        k += 1;
                    }
                    let st = T64::strides(&x[k].shape);
                    x[k].data[idx.iter().zip(&st).map(|(i, s)| i * s).sum::<usize>()]
                })
                .collect();
            one(T64::new(&shape, data))
        }
        Op::Slice => {
            let r = SliceRange::of(&types[0], attrs).map_err(e)?;
            one(gather_axis(
                x[0],
                r.axis,
                r.start as usize,
                &dims(&outs[0]),
                false,
            ))
        }
        Op::Select => {
            let (axis, index) = select_index(&types[0], attrs).map_err(e)?;
            one(gather_axis(
                x[0],
                axis,
                index as usize,
                &dims(&outs[0]),
                true,
            ))
        }
        Op::Sum | Op::Mean | Op::Max => {
            let axes = reduced_axes(attrs, x[0].rank()).map_err(e)?;
            let r = x[0].reduce_keep(&axes, |g| match op {
                Op::Sum => g.iter().sum(),
                Op::Mean => g.iter().sum::<f64>() / g.len() as f64,
                _ => g.iter().copied().fold(f64::NEG_INFINITY, |m, v| {
                    if v.is_nan() || m.is_nan() {
                        f64::NAN
                    } else {
                        m.max(v)
                    }
                }),
            });
            one(T64::new(&dims(&outs[0]), r.data))
        }
        Op::Softmax | Op::LogSoftmax => {
            let axis = normalize_axis(attrs.int("axis").map_err(e)?, x[0].rank())?;
            let m = x[0].reduce_keep(&[axis], |g| {
                g.iter().copied().fold(f64::NEG_INFINITY, f64::max)
            });
            let shape = x[0].shape.clone();
            let ex: Vec<f64> = (0..x[0].data.len())
                .map(|f| (x[0].data[f] - m.at_broadcast(&T64::unravel(f, &shape))).exp())
                .collect();
            let s = T64::new(&shape, ex.clone()).reduce_keep(&[axis], |g| g.iter().sum());
            let data = (0..ex.len())
                .map(|f| {
                    let idx = T64::unravel(f, &shape);
                    if op == Op::Softmax {
                        ex[f] / s.at_broadcast(&idx)
                    } else {
                        x[0].data[f] - m.at_broadcast(&idx) - s.at_broadcast(&idx).ln()
                    }
                })
                .collect();
            one(T64::new(&shape, data))
        }
        Op::MseLoss => {
            let n = x[0].data.len() as f64;
            let s: f64 = x[0]
                .data
                .iter()
                .zip(&x[1].data)
                .map(|(a, b)| (a - b) * (a - b))
                .sum();
            one(T64::scalar(s / n))
        }
        Op::CrossEntropy => one(cross_entropy(x[0], x[1], attrs)?.0),
        Op::CrossEntropyGrad => one(cross_entropy(x[0], x[1], attrs)?.1.scaled(x[2].data[0])),
        _ => nn64::eval_op(op, attrs, x),
    }
}

impl T64 {
    /// Every element times `k`.
    pub fn scaled(mut self, k: f64) -> T64 {
        self.data.iter_mut().for_each(|v| *v *= k);
        self
    }
}

/// The elements at `start..` of `axis` for an output of `shape` (`drop`: `select`, whose
/// output lacks the axis).
fn gather_axis(x: &T64, axis: usize, start: usize, shape: &[usize], drop: bool) -> T64 {
    let st = T64::strides(&x.shape);
    let n = shape.iter().product();
    let data = (0..n)
        .map(|f| {
            let mut idx = T64::unravel(f, shape);
            if drop {
                idx.insert(axis, 0);
            }
            idx[axis] += start;
            x.data[idx.iter().zip(&st).map(|(i, s)| i * s).sum::<usize>()]
        })
        .collect();
    T64::new(shape, data)
}

fn matmul(
    a: &T64,
    b: &T64,
    ta: &TensorType,
    tb: &TensorType,
    attrs: &Attrs,
    out: &TensorType,
) -> Result<T64, String> {
    let d = MatmulDims::of(ta, tb, attrs).map_err(|e| e.message)?;
    let k = d.k as usize;
    let shape = dims(out);
    let total = shape.iter().product();
    let (ra, rb) = (a.rank(), b.rank());
    let data = (0..total)
        .map(|f| {
            let idx = T64::unravel(f, &shape);
            let batch = &idx[..idx.len() - 2];
            let (i, j) = (idx[idx.len() - 2], idx[idx.len() - 1]);
            let elem = |t: &T64, rank: usize, r: usize, c: usize| {
                let mut full: Vec<usize> = batch[batch.len() - (rank - 2)..].to_vec();
                full.extend([r, c]);
                let bshape = &t.shape[..rank - 2];
                for (q, &dim) in bshape.iter().enumerate() {
                    if dim == 1 {
                        full[q] = 0;
                    }
                }
                let st = T64::strides(&t.shape);
                t.data[full.iter().zip(&st).map(|(x, s)| x * s).sum::<usize>()]
            };
            (0..k)
                .map(|p| {
                    let av = if d.transpose_a {
                        elem(a, ra, p, i)
                    } else {
                        elem(a, ra, i, p)
                    };
                    let bv = if d.transpose_b {
                        elem(b, rb, j, p)
                    } else {
                        elem(b, rb, p, j)
                    };
                    av * bv
                })
                .sum()
        })
        .collect();
    Ok(T64::new(&shape, data))
}

/// PyTorch's `cross_entropy` (mean over the positions whose label is not `ignore_index`,
/// with `label_smoothing`) and its gradient w.r.t. the logits for a unit loss cotangent.
pub fn cross_entropy(logits: &T64, labels: &T64, attrs: &Attrs) -> Result<(T64, T64), String> {
    let ignore = attrs
        .opt_int("ignore_index")
        .map_err(|e| e.message)?
        .unwrap_or(-100);
    let eps = attrs
        .opt_float("label_smoothing")
        .map_err(|e| e.message)?
        .unwrap_or(0.0);
    let v = *logits.shape.last().ok_or("no class dim")?;
    let rows = labels.data.len();
    let mut total = 0.0;
    let mut count = 0usize;
    let mut grad = vec![0.0; logits.data.len()];
    for r in 0..rows {
        let label = labels.data[r] as i64;
        if label == ignore {
            continue;
        }
        if label < 0 || label as usize >= v {
            return Err(format!("label {label} out of range"));
        }
        count += 1;
        let z = &logits.data[r * v..(r + 1) * v];
        let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = m + z.iter().map(|&q| (q - m).exp()).sum::<f64>().ln();
        let nll = lse - z[label as usize];
        let smooth: f64 = z.iter().map(|&q| lse - q).sum::<f64>() / v as f64;
        total += (1.0 - eps) * nll + eps * smooth;
        for c in 0..v {
            let p = (z[c] - lse).exp();
            let hot = if c == label as usize { 1.0 - eps } else { 0.0 };
            grad[r * v + c] = p - hot - eps / v as f64;
        }
    }
    let n = count as f64;
    let grad = grad.into_iter().map(|g| g / n).collect();
    let grad = if count == 0 {
        vec![0.0; logits.data.len()]
    } else {
        grad
    };
    Ok((T64::scalar(total / n), T64::new(&logits.shape, grad)))
}
