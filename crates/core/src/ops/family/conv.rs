//! 2-D convolution and pooling over `[N, C, H, W]` tensors.

use crate::ops::attrs::{AttrKind, AttrSpec, Attrs, ConstAttr};
use crate::ops::error::OpError;
use crate::ops::shape::{fmt_dims, numel};
use crate::ops::spec::{
    Arity, Cost, CostRule, Emitter, GradCall, Handle, OpCtx, OpSpec, PrecisionClass,
};
use crate::ops::{Op, TensorType};

/// `conv2d`: on MindSpore's O1 white list.
pub const CONV2D: OpSpec = OpSpec {
    inputs: &["x", "w"],
    arity: Arity::Exact(2),
    attrs: &[
        AttrSpec::defaulted("stride", ConstAttr::Ints(&[1, 1])),
        AttrSpec::defaulted("padding", ConstAttr::Ints(&[0, 0])),
        AttrSpec::defaulted("dilation", ConstAttr::Ints(&[1, 1])),
        AttrSpec::defaulted("groups", ConstAttr::Int(1)),
    ],
    infer: infer_conv2d,
    cost: CostRule::Custom(cost_conv2d),
    precision: PrecisionClass::LowPrecisionFriendly,
    elementwise: false,
    in_place: false,
    grad: Some(grad_conv2d),
    shard: None,
};

/// `max_pool2d` and `avg_pool2d` (`stride` defaults to `kernel`; average counts padding).
pub const POOL2D: OpSpec = OpSpec {
    inputs: &["x"],
    arity: Arity::Exact(1),
    attrs: &[
        AttrSpec::required("kernel", AttrKind::Ints),
        AttrSpec::optional("stride", AttrKind::Ints),
        AttrSpec::defaulted("padding", ConstAttr::Ints(&[0, 0])),
    ],
    infer: infer_pool2d,
    cost: CostRule::Custom(cost_pool2d),
    precision: PrecisionClass::FollowInput,
    elementwise: false,
    in_place: false,
    grad: None,
    shard: None,
};

/// `max_pool2d`, differentiated by `max_pool2d_grad`.
pub const MAX_POOL2D: OpSpec = OpSpec {
    grad: Some(grad_max_pool2d),
    ..POOL2D
};

/// `avg_pool2d`, differentiated by `avg_pool2d_grad`.
pub const AVG_POOL2D: OpSpec = OpSpec {
    grad: Some(grad_avg_pool2d),
    ..POOL2D
};

/// `adaptive_avg_pool2d`: averages PyTorch's adaptive windows into `[N, C, oh, ow]`.
pub const ADAPTIVE_AVG_POOL2D: OpSpec = OpSpec {
    inputs: &["x"],
    arity: Arity::Exact(1),
    attrs: &[AttrSpec::required("output", AttrKind::Ints)],
    infer: infer_adaptive,
    cost: CostRule::PerInput(1),
    precision: PrecisionClass::FollowInput,
    elementwise: false,
    in_place: false,
    grad: Some(grad_adaptive_avg_pool2d),
    shard: None,
};

/// The window attributes of `conv2d`, shared by its backward ops.
const CONV_WINDOW: [AttrSpec; 4] = [
    AttrSpec::defaulted("stride", ConstAttr::Ints(&[1, 1])),
    AttrSpec::defaulted("padding", ConstAttr::Ints(&[0, 0])),
    AttrSpec::defaulted("dilation", ConstAttr::Ints(&[1, 1])),
    AttrSpec::defaulted("groups", ConstAttr::Int(1)),
];

/// `conv2d_grad_input`: the gradient of `conv2d`'s input `x [N, C, H, W]` (the spatial
/// `size = [H, W]` given, as several inputs sizes give one output size) from the output
/// cotangent `dy` and the weight: a transposed convolution.
pub const CONV2D_GRAD_INPUT: OpSpec = OpSpec {
    inputs: &["dy", "w"],
    arity: Arity::Exact(2),
    attrs: &[
        CONV_WINDOW[0],
        CONV_WINDOW[1],
        CONV_WINDOW[2],
        CONV_WINDOW[3],
        AttrSpec::required("size", AttrKind::Ints),
    ],
    infer: infer_conv2d_grad_input,
    cost: CostRule::Custom(cost_conv2d_grad_input),
    precision: PrecisionClass::LowPrecisionFriendly,
    elementwise: false,
    in_place: false,
    grad: None,
    shard: None,
};

/// `conv2d_grad_weight`: the gradient of `conv2d`'s weight `[O, C/groups, kh, kw]` (the
/// `kernel = [kh, kw]` given) from the input `x` and the output cotangent `dy`.
pub const CONV2D_GRAD_WEIGHT: OpSpec = OpSpec {
    inputs: &["x", "dy"],
    arity: Arity::Exact(2),
    attrs: &[
        CONV_WINDOW[0],
        CONV_WINDOW[1],
        CONV_WINDOW[2],
        CONV_WINDOW[3],
        AttrSpec::required("kernel", AttrKind::Ints),
    ],
    infer: infer_conv2d_grad_weight,
    cost: CostRule::Custom(cost_conv2d_grad_weight),
    precision: PrecisionClass::LowPrecisionFriendly,
    elementwise: false,
    in_place: false,
    grad: None,
    shard: None,
};

/// `max_pool2d_grad` / `avg_pool2d_grad`: the gradient of the pool's input `x` from the output
/// cotangent `dy` (max: each window's cotangent to its first maximum, as PyTorch; average:
/// spread evenly over the window, padding counted).
pub const POOL2D_GRAD: OpSpec = OpSpec {
    inputs: &["x", "dy"],
    arity: Arity::Exact(2),
    infer: infer_pool2d_grad,
    ..POOL2D
};

/// `adaptive_avg_pool2d_grad`: the gradient of the pool's input `x` from the output cotangent
/// `dy`, each window's cotangent spread evenly over it.
pub const ADAPTIVE_AVG_POOL2D_GRAD: OpSpec = OpSpec {
    inputs: &["x", "dy"],
    arity: Arity::Exact(2),
    infer: infer_adaptive_grad,
    grad: None,
    ..ADAPTIVE_AVG_POOL2D
};

/// What a gradient rule returns: one cotangent per input.
type Grads = Result<Vec<Option<Handle>>, OpError>;

/// `conv2d`: the input's gradient by `conv2d_grad_input` (a transposed convolution), the
/// weight's by `conv2d_grad_weight`, both with the forward's window and groups.
fn grad_conv2d(em: &mut dyn Emitter, call: &GradCall) -> Grads {
    let (x, w, dy) = (call.x(0), call.x(1), call.dy()?);
    let (xt, wt) = (em.ty(x)?, em.ty(w)?);
    let size = call.attrs.clone().with("size", xt.shape[2..].to_vec());
    let dx = em.op1(Op::Conv2dGradInput, size, &[dy, w])?;
    let kernel = call.attrs.clone().with("kernel", wt.shape[2..].to_vec());
    let dw = em.op1(Op::Conv2dGradWeight, kernel, &[x, dy])?;
    Ok(vec![Some(dx), Some(dw)])
}

/// A pool's input gradient by its backward op `grad_op`, with the forward's attributes.
fn grad_pool(em: &mut dyn Emitter, call: &GradCall, grad_op: Op) -> Grads {
    let dx = em.op1(grad_op, call.attrs.clone(), &[call.x(0), call.dy()?])?;
    Ok(vec![Some(dx)])
}

fn grad_max_pool2d(em: &mut dyn Emitter, call: &GradCall) -> Grads {
    grad_pool(em, call, Op::MaxPool2dGrad)
}

fn grad_avg_pool2d(em: &mut dyn Emitter, call: &GradCall) -> Grads {
    grad_pool(em, call, Op::AvgPool2dGrad)
}

fn grad_adaptive_avg_pool2d(em: &mut dyn Emitter, call: &GradCall) -> Grads {
    grad_pool(em, call, Op::AdaptiveAvgPool2dGrad)
}

/// The output length of a sliding window along one axis of length `len`: `(len + 2·padding −
/// span) / stride + 1` with `span = dilation·(kernel − 1) + 1` — the one rule the registry's
/// shape inference and the kernels share. `None` when the window does not fit or a size is not
/// positive where it must be (`kernel`, `stride`, `dilation` ≥ 1, `padding` ≥ 0).
pub fn window_len(len: i64, kernel: i64, stride: i64, padding: i64, dilation: i64) -> Option<i64> {
    if kernel < 1 || stride < 1 || dilation < 1 || padding < 0 || len < 0 {
        return None;
    }
    // i128: every argument is a user value, so nothing here may overflow.
    let span = i128::from(dilation) * (i128::from(kernel) - 1) + 1;
    let room = i128::from(len) + 2 * i128::from(padding) - span;
    if room < 0 {
        return None;
    }
    i64::try_from(room / i128::from(stride) + 1).ok()
}

/// A sliding window over the spatial dims: its size, step, zero padding and dilation, and
/// the output size it gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub kernel: [i64; 2],
    pub stride: [i64; 2],
    pub padding: [i64; 2],
    pub dilation: [i64; 2],
    /// Output height and width.
    pub out: [i64; 2],
}

impl Window {
    /// Applies the window to an input of spatial size `hw`, checking it fits.
    fn over(
        hw: [i64; 2],
        kernel: [i64; 2],
        stride: [i64; 2],
        padding: [i64; 2],
        dilation: [i64; 2],
    ) -> Result<Window, OpError> {
        let mut out = [0; 2];
        for i in 0..2 {
            out[i] = window_len(hw[i], kernel[i], stride[i], padding[i], dilation[i]).ok_or_else(
                || {
                    OpError::at(
                        0,
                        format!(
                            "the window (kernel {}, dilation {}, padding {}) does not fit the \
                             spatial size {} of x",
                            fmt_dims(&kernel),
                            fmt_dims(&dilation),
                            fmt_dims(&padding),
                            fmt_dims(&hw)
                        ),
                    )
                },
            )?;
        }
        Ok(Window {
            kernel,
            stride,
            padding,
            dilation,
            out,
        })
    }
}

/// The geometry of one `conv2d` of `x [N, C, H, W]` by `w [O, C/groups, kh, kw]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv2dGeometry {
    pub n: i64,
    pub c: i64,
    pub h: i64,
    pub w: i64,
    pub o: i64,
    pub groups: i64,
    pub window: Window,
}

impl Conv2dGeometry {
    /// Reads and checks the geometry (attributes absent from `attrs` take their defaults).
    pub fn of(x: &TensorType, w: &TensorType, attrs: &Attrs) -> Result<Conv2dGeometry, OpError> {
        let [n, c, h, wd] = nchw(x, 0, "x", "[N, C, H, W]")?;
        let [o, cg, kh, kw] = nchw(w, 1, "w", "[O, C/groups, kh, kw]")?;
        let groups = attrs.opt_int("groups")?.unwrap_or(1);
        if groups < 1 || c % groups != 0 || o % groups != 0 {
            return Err(OpError::new(format!(
                "`groups` {groups} must be positive and divide both the {c} input channels \
                 and the {o} output channels"
            )));
        }
        if kh < 1 || kw < 1 {
            return Err(OpError::at(
                1,
                format!("w {} has an empty kernel", fmt_dims(&w.shape)),
            ));
        }
        if cg != c / groups {
            return Err(OpError::at(
                1,
                format!(
                    "w {} must have C/groups = {} input channels, got {cg}",
                    fmt_dims(&w.shape),
                    c / groups
                ),
            ));
        }
        let window = Window::over(
            [h, wd],
            [kh, kw],
            pair(attrs, "stride", 1, [1, 1])?,
            pair(attrs, "padding", 0, [0, 0])?,
            pair(attrs, "dilation", 1, [1, 1])?,
        )?;
        Ok(Conv2dGeometry {
            n,
            c,
            h,
            w: wd,
            o,
            groups,
            window,
        })
    }

    /// `2·N·O·oh·ow·(C/groups)·kh·kw` (saturating).
    pub fn flops(&self) -> u64 {
        let [kh, kw] = self.window.kernel;
        let [oh, ow] = self.window.out;
        numel(&[self.n, self.o, oh, ow, self.c / self.groups, kh, kw]).saturating_mul(2)
    }
}

/// The window of a `max_pool2d` / `avg_pool2d` over `x [N, C, H, W]`; `stride` defaults to
/// `kernel`, and padding may be at most half the kernel (as in PyTorch).
pub fn pool_window(x: &TensorType, attrs: &Attrs) -> Result<Window, OpError> {
    let [_, _, h, w] = nchw(x, 0, "x", "[N, C, H, W]")?;
    let kernel = pair(attrs, "kernel", 1, [1, 1])?;
    let stride = pair(attrs, "stride", 1, kernel)?;
    let padding = pair(attrs, "padding", 0, [0, 0])?;
    if padding[0] > kernel[0] / 2 || padding[1] > kernel[1] / 2 {
        return Err(OpError::new(format!(
            "`padding` {} must be at most half of `kernel` {}",
            fmt_dims(&padding),
            fmt_dims(&kernel)
        )));
    }
    Window::over([h, w], kernel, stride, padding, [1, 1])
}

/// The four dims of a rank-4 input, or an error pointing at it.
fn nchw(t: &TensorType, i: usize, name: &str, layout: &str) -> Result<[i64; 4], OpError> {
    match t.shape[..] {
        [a, b, c, d] => Ok([a, b, c, d]),
        _ => Err(OpError::at(
            i,
            format!(
                "expects {name} of rank 4 ({layout}), but {name} is {}{}",
                t.dtype,
                fmt_dims(&t.shape)
            ),
        )),
    }
}

/// Attribute `name` as a (height, width) pair of values at least `min`; `default` when absent.
fn pair(attrs: &Attrs, name: &str, min: i64, default: [i64; 2]) -> Result<[i64; 2], OpError> {
    let Some(v) = attrs.opt_ints(name)? else {
        return Ok(default);
    };
    match v[..] {
        [a, b] if a >= min && b >= min => Ok([a, b]),
        [_, _] => Err(OpError::new(format!(
            "`{name}` must be at least {min} in both dims, got {}",
            fmt_dims(&v)
        ))),
        _ => Err(OpError::new(format!(
            "`{name}` must list 2 values (height, width), got {}",
            fmt_dims(&v)
        ))),
    }
}

fn infer_conv2d(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    let g = Conv2dGeometry::of(ctx.input(0), ctx.input(1), ctx.attrs)?;
    let dtype = ctx.float_input(0)?;
    ctx.same_dtype(0, 1)?;
    let [oh, ow] = g.window.out;
    Ok(vec![TensorType::new(dtype, [g.n, g.o, oh, ow])])
}

fn cost_conv2d(ctx: &OpCtx, outputs: &[TensorType]) -> Cost {
    let flops = Conv2dGeometry::of(ctx.input(0), ctx.input(1), ctx.attrs).map_or(0, |g| g.flops());
    Cost::streaming(flops, ctx.inputs, outputs)
}

/// Checks that `dy` (input `i`) is `want`, the forward's output type.
fn expect_cotangent(ctx: &OpCtx, i: usize, want: &TensorType) -> Result<(), OpError> {
    if ctx.input(i) == want {
        Ok(())
    } else {
        Err(OpError::at(
            i,
            format!(
                "{} must be {want} (the forward's output), got {}",
                ctx.arg_name(i),
                ctx.input(i)
            ),
        ))
    }
}

/// The forward `conv2d`'s input type for `conv2d_grad_input(dy, w)`.
fn grad_input_type(ctx: &OpCtx) -> Result<TensorType, OpError> {
    let dy = ctx.input(0);
    let [n, _, _, _] = nchw(dy, 0, "dy", "[N, O, oh, ow]")?;
    let [_, cg, _, _] = nchw(ctx.input(1), 1, "w", "[O, C/groups, kh, kw]")?;
    let [h, w] = pair(ctx.attrs, "size", 1, [1, 1])?;
    let groups = ctx.attrs.opt_int("groups")?.unwrap_or(1);
    Ok(TensorType::new(
        dy.dtype,
        [n, cg.saturating_mul(groups), h, w],
    ))
}

fn infer_conv2d_grad_input(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    let dtype = ctx.float_input(0)?;
    ctx.same_dtype(0, 1)?;
    let x = grad_input_type(ctx)?;
    let g = Conv2dGeometry::of(&x, ctx.input(1), ctx.attrs)?;
    let [oh, ow] = g.window.out;
    expect_cotangent(ctx, 0, &TensorType::new(dtype, [g.n, g.o, oh, ow]))?;
    Ok(vec![x])
}

fn cost_conv2d_grad_input(ctx: &OpCtx, outputs: &[TensorType]) -> Cost {
    let flops = grad_input_type(ctx)
        .and_then(|x| Conv2dGeometry::of(&x, ctx.input(1), ctx.attrs))
        .map_or(0, |g| g.flops());
    Cost::streaming(flops, ctx.inputs, outputs)
}

/// The forward `conv2d`'s weight type for `conv2d_grad_weight(x, dy)`.
fn grad_weight_type(ctx: &OpCtx) -> Result<TensorType, OpError> {
    let [_, c, _, _] = nchw(ctx.input(0), 0, "x", "[N, C, H, W]")?;
    let [_, o, _, _] = nchw(ctx.input(1), 1, "dy", "[N, O, oh, ow]")?;
    let [kh, kw] = pair(ctx.attrs, "kernel", 1, [1, 1])?;
    let groups = ctx.attrs.opt_int("groups")?.unwrap_or(1);
    let cg = if groups >= 1 { c / groups } else { c };
    Ok(TensorType::new(ctx.input(0).dtype, [o, cg, kh, kw]))
}

fn infer_conv2d_grad_weight(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    let dtype = ctx.float_input(0)?;
    ctx.same_dtype(0, 1)?;
    let w = grad_weight_type(ctx)?;
    let g = Conv2dGeometry::of(ctx.input(0), &w, ctx.attrs)?;
    let [oh, ow] = g.window.out;
    expect_cotangent(ctx, 1, &TensorType::new(dtype, [g.n, g.o, oh, ow]))?;
    Ok(vec![w])
}

fn cost_conv2d_grad_weight(ctx: &OpCtx, outputs: &[TensorType]) -> Cost {
    let flops = grad_weight_type(ctx)
        .and_then(|w| Conv2dGeometry::of(ctx.input(0), &w, ctx.attrs))
        .map_or(0, |g| g.flops());
    Cost::streaming(flops, ctx.inputs, outputs)
}

fn infer_pool2d_grad(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    let y = infer_pool2d(ctx)?.remove(0);
    expect_cotangent(ctx, 1, &y)?;
    Ok(vec![ctx.input(0).clone()])
}

fn infer_adaptive_grad(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    let y = infer_adaptive(ctx)?.remove(0);
    expect_cotangent(ctx, 1, &y)?;
    Ok(vec![ctx.input(0).clone()])
}

fn infer_pool2d(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    let x = ctx.input(0);
    let win = pool_window(x, ctx.attrs)?;
    ctx.float_input(0)?;
    let [oh, ow] = win.out;
    Ok(vec![TensorType::new(
        x.dtype,
        [x.shape[0], x.shape[1], oh, ow],
    )])
}

fn cost_pool2d(ctx: &OpCtx, outputs: &[TensorType]) -> Cost {
    let window = pool_window(ctx.input(0), ctx.attrs).map_or(0, |w| numel(&w.kernel));
    let out = outputs.iter().map(TensorType::numel).sum::<u64>();
    Cost::streaming(out.saturating_mul(window), ctx.inputs, outputs)
}

fn infer_adaptive(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    let x = ctx.input(0);
    let [n, c, _, _] = nchw(x, 0, "x", "[N, C, H, W]")?;
    ctx.float_input(0)?;
    // `output` is required by the schema, so the default never applies.
    let [oh, ow] = pair(ctx.attrs, "output", 1, [1, 1])?;
    Ok(vec![TensorType::new(x.dtype, [n, c, oh, ow])])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::family::testing::*;
    use crate::ops::{cost, DType, Op};

    #[test]
    fn conv2d_shapes() {
        let x = f32t(&[2, 4, 10, 12]);
        let w = f32t(&[8, 4, 3, 3]);
        assert_eq!(
            ok(Op::Conv2d, Attrs::new(), &[x.clone(), w.clone()]),
            f32t(&[2, 8, 8, 10])
        );
        let a = Attrs::new()
            .with("stride", vec![2, 2])
            .with("padding", vec![1, 1])
            .with("dilation", vec![2, 1]);
        // H: (10 + 2 - 2*2 - 1) / 2 + 1 = 4; W: (12 + 2 - 2 - 1) / 2 + 1 = 6.
        assert_eq!(ok(Op::Conv2d, a, &[x.clone(), w]), f32t(&[2, 8, 4, 6]));
        let a = Attrs::new().with("groups", 2);
        let wg = f32t(&[6, 2, 1, 1]);
        assert_eq!(ok(Op::Conv2d, a, &[x, wg]), f32t(&[2, 6, 10, 12]));
    }

    #[test]
    fn conv2d_errors() {
        let x = f32t(&[2, 4, 10, 12]);
        let e = err(Op::Conv2d, Attrs::new(), &[x.clone(), f32t(&[8, 3, 3, 3])]);
        assert_eq!(
            e.message,
            "conv2d: w [8, 3, 3, 3] must have C/groups = 4 input channels, got 3"
        );
        assert_eq!(e.input, Some(1));
        let e = err(
            Op::Conv2d,
            Attrs::new().with("groups", 3),
            &[x.clone(), f32t(&[6, 1, 1, 1])],
        );
        assert!(e.message.contains("`groups` 3 must be positive and divide"));
        let e = err(Op::Conv2d, Attrs::new(), &[x.clone(), f32t(&[8, 4, 11, 3])]);
        assert!(
            e.message.contains("does not fit the spatial size [10, 12]"),
            "{}",
            e.message
        );
        let e = err(
            Op::Conv2d,
            Attrs::new().with("stride", vec![0, 1]),
            &[x.clone(), f32t(&[8, 4, 3, 3])],
        );
        assert_eq!(
            e.message,
            "conv2d: `stride` must be at least 1 in both dims, got [0, 1]"
        );
        let e = err(
            Op::Conv2d,
            Attrs::new().with("padding", vec![1]),
            &[x.clone(), f32t(&[8, 4, 3, 3])],
        );
        assert_eq!(
            e.message,
            "conv2d: `padding` must list 2 values (height, width), got [1]"
        );
        let e = err(
            Op::Conv2d,
            Attrs::new(),
            &[f32t(&[4, 10, 12]), f32t(&[8, 4, 3, 3])],
        );
        assert!(e.message.contains("expects x of rank 4 ([N, C, H, W])"));
        let e = err(Op::Conv2d, Attrs::new(), &[x, t(DType::F16, &[8, 4, 3, 3])]);
        assert!(e.message.contains("dtypes differ"));
        let e = err(
            Op::Conv2d,
            Attrs::new().with("dilation", vec![i64::MAX, 1]),
            &[f32t(&[1, 1, 4, 4]), f32t(&[1, 1, 3, 3])],
        );
        assert!(e.message.contains("does not fit"));
    }

    #[test]
    fn conv2d_flops() {
        let a = Attrs::new();
        let c = cost(
            Op::Conv2d,
            &a,
            &[f32t(&[2, 4, 10, 12]), f32t(&[8, 4, 3, 3])],
        )
        .unwrap();
        assert_eq!(c.flops, 2 * 2 * 8 * 8 * 10 * 4 * 3 * 3);
    }

    #[test]
    fn pools() {
        let x = [f32t(&[1, 3, 8, 8])];
        let a = Attrs::new().with("kernel", vec![2, 2]);
        assert_eq!(ok(Op::MaxPool2d, a.clone(), &x), f32t(&[1, 3, 4, 4]));
        let s = a
            .clone()
            .with("stride", vec![1, 1])
            .with("padding", vec![1, 1]);
        assert_eq!(ok(Op::AvgPool2d, s, &x), f32t(&[1, 3, 9, 9]));
        let bad = a.clone().with("padding", vec![2, 0]);
        assert_eq!(
            err(Op::MaxPool2d, bad, &x).message,
            "max_pool2d: `padding` [2, 0] must be at most half of `kernel` [2, 2]"
        );
        assert!(err(Op::MaxPool2d, Attrs::new(), &x)
            .message
            .contains("missing attribute"));
        let c = cost(Op::AvgPool2d, &a, &x).unwrap();
        assert_eq!(c.flops, 3 * 4 * 4 * 4);
        let out = ok(
            Op::AdaptiveAvgPool2d,
            Attrs::new().with("output", vec![1, 1]),
            &x,
        );
        assert_eq!(out, f32t(&[1, 3, 1, 1]));
        let e = err(
            Op::AdaptiveAvgPool2d,
            Attrs::new().with("output", vec![0, 1]),
            &x,
        );
        assert!(e.message.contains("at least 1"));
    }

    #[test]
    fn conv2d_grads() {
        let (x, w) = (f32t(&[2, 4, 10, 12]), f32t(&[6, 2, 3, 3]));
        let a = Attrs::new()
            .with("stride", vec![2, 2])
            .with("padding", vec![1, 1])
            .with("dilation", vec![2, 1])
            .with("groups", 2);
        let y = ok(Op::Conv2d, a.clone(), &[x.clone(), w.clone()]);
        let gi = a.clone().with("size", vec![10, 12]);
        assert_eq!(ok(Op::Conv2dGradInput, gi, &[y.clone(), w.clone()]), x);
        let gw = a.clone().with("kernel", vec![3, 3]);
        assert_eq!(ok(Op::Conv2dGradWeight, gw, &[x.clone(), y.clone()]), w);
        let gi = a.clone().with("size", vec![10, 13]);
        let e = err(Op::Conv2dGradInput, gi, &[y.clone(), w.clone()]);
        assert!(e.message.contains("the forward's output"), "{}", e.message);
        let gw = a.with("kernel", vec![3, 3]);
        let e = err(Op::Conv2dGradWeight, gw, &[x, f32t(&[2, 6, 4, 5])]);
        assert_eq!(e.input, Some(1));
    }

    #[test]
    fn pool_grads() {
        let x = f32t(&[1, 3, 8, 8]);
        let a = Attrs::new().with("kernel", vec![2, 2]);
        let dy = f32t(&[1, 3, 4, 4]);
        for op in [Op::MaxPool2dGrad, Op::AvgPool2dGrad] {
            assert_eq!(ok(op, a.clone(), &[x.clone(), dy.clone()]), x);
            let e = err(op, a.clone(), &[x.clone(), f32t(&[1, 3, 4, 5])]);
            assert_eq!(e.input, Some(1));
        }
        let a = Attrs::new().with("output", vec![3, 2]);
        let dy = f32t(&[1, 3, 3, 2]);
        assert_eq!(ok(Op::AdaptiveAvgPool2dGrad, a, &[x.clone(), dy]), x);
    }
}
