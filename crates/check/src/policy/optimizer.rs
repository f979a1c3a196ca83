//! The `optimizer` of a train declaration: `sgd`, `adam` or `adamw` with PyTorch's argument
//! names, defaults and algorithms (`torch.optim.SGD` with dampening 0, `torch.optim.Adam` with L2
//! decay added to the gradient, `torch.optim.AdamW` with decoupled decay); MindSpore's spellings
//! `learning_rate`, `momentum(lr, momentum)` and `adam_weight_decay` are accepted where they mean
//! the same thing.

use mslc_core::span::Span;

use super::args::{bind_call, Param};
use super::report::{Choices, Reporter};
use super::value::{Val, Value};

/// The optimizer algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptimizerKind {
    /// Stochastic gradient descent, optionally with (Nesterov) momentum.
    Sgd,
    /// Adam with L2 weight decay added to the gradient.
    Adam,
    /// Adam with decoupled weight decay.
    AdamW,
}

/// A checked optimizer. Settings an algorithm does not use keep their defaults (0 or false).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Optimizer {
    /// The algorithm.
    pub kind: OptimizerKind,
    /// Learning rate (the peak of a schedule).
    pub lr: f64,
    /// Adam's moment decay rates (β1, β2).
    pub betas: (f64, f64),
    /// Adam's denominator term.
    pub eps: f64,
    /// Weight decay.
    pub weight_decay: f64,
    /// SGD momentum.
    pub momentum: f64,
    /// SGD: Nesterov momentum.
    pub nesterov: bool,
    /// The optimizer value.
    pub span: Span,
}

impl Optimizer {
    /// PyTorch's defaults for the algorithm.
    pub fn defaults(kind: OptimizerKind, span: Span) -> Optimizer {
        let sgd = Optimizer {
            kind,
            lr: 1e-3,
            betas: (0.0, 0.0),
            eps: 0.0,
            weight_decay: 0.0,
            momentum: 0.0,
            nesterov: false,
            span,
        };
        let adam = Optimizer {
            betas: (0.9, 0.999),
            eps: 1e-8,
            ..sgd
        };
        match kind {
            OptimizerKind::Sgd => sgd,
            OptimizerKind::Adam => adam,
            OptimizerKind::AdamW => Optimizer {
                weight_decay: 0.01,
                ..adam
            },
        }
    }
}

/// How the optimizer is spelled: its algorithm and the parameters that spelling takes.
#[derive(Clone, Copy)]
enum Spelling {
    Sgd,
    /// MindSpore's `nn.Momentum`: SGD whose lr and momentum are required.
    Momentum,
    Adam,
    AdamW,
}

const SPELLINGS: &Choices<Spelling> = &[
    (&["sgd"], Spelling::Sgd),
    (&["momentum"], Spelling::Momentum),
    (&["adam"], Spelling::Adam),
    (&["adamw", "adam_weight_decay"], Spelling::AdamW),
];

const LR: &[&str] = &["lr", "learning_rate"];
const SGD_PARAMS: &[Param] = &[
    Param::optional(LR),
    Param::optional(&["momentum"]),
    Param::optional(&["nesterov", "use_nesterov"]),
    Param::optional(&["weight_decay"]),
];
const MOMENTUM_PARAMS: &[Param] = &[
    Param::required(LR, "lr: 0.1"),
    Param::required(&["momentum"], "momentum: 0.9"),
    Param::optional(&["nesterov", "use_nesterov"]),
    Param::optional(&["weight_decay"]),
];
const ADAM_PARAMS: &[Param] = &[
    Param::optional(LR),
    Param::optional(&["betas"]),
    Param::optional(&["eps"]),
    Param::optional(&["weight_decay"]),
];

/// Reads `adamw(lr: 1e-4, betas: (0.9, 0.95))` or a bare `sgd`.
pub(crate) fn optimizer(value: &Value, rep: &mut Reporter) -> Option<Optimizer> {
    let (name, args) = match &value.val {
        Val::Call(name, args) => (name, args.as_slice()),
        _ => match value.word() {
            Some(word) => (word, [].as_slice()),
            None => {
                rep.expected(
                    value,
                    "an optimizer",
                    "write e.g. `adamw(lr: 1e-4)` or `sgd(lr: 0.1)`".to_string(),
                );
                return None;
            }
        },
    };
    let callee = Value {
        val: Val::Name(vec![name.clone()]),
        span: name.span,
    };
    let spelling = rep.word(&callee, "optimizer", SPELLINGS)?;
    let (kind, params) = match spelling {
        Spelling::Sgd => (OptimizerKind::Sgd, SGD_PARAMS),
        Spelling::Momentum => (OptimizerKind::Sgd, MOMENTUM_PARAMS),
        Spelling::Adam => (OptimizerKind::Adam, ADAM_PARAMS),
        Spelling::AdamW => (OptimizerKind::AdamW, ADAM_PARAMS),
    };
    let slots = bind_call(name, args, value.span, params, rep);
    let mut opt = Optimizer::defaults(kind, value.span);
    let mut valid = params
        .iter()
        .zip(&slots)
        .all(|(p, s)| p.required.is_none() || s.is_some());
    let mut nesterov_at = None;
    for (param, slot) in params.iter().zip(slots) {
        let Some(v) = slot else { continue };
        let setting = match param.names[0] {
            "lr" => at_least(rep, v, "the learning rate", 0.0, false).map(|x| opt.lr = x),
            "momentum" => at_least(rep, v, "momentum", 0.0, true).map(|x| opt.momentum = x),
            "weight_decay" => {
                at_least(rep, v, "weight decay", 0.0, true).map(|x| opt.weight_decay = x)
            }
            "eps" => at_least(rep, v, "eps", 0.0, false).map(|x| opt.eps = x),
            "nesterov" => rep.flag(v, "nesterov").map(|b| {
                opt.nesterov = b;
                nesterov_at = Some(v);
            }),
            _ => betas(rep, v).map(|b| opt.betas = b),
        };
        valid &= setting.is_some();
    }
    if let Some(v) = nesterov_at.filter(|_| opt.nesterov && opt.momentum == 0.0) {
        valid &= rep.ensure(
            false,
            v,
            "Nesterov momentum needs a momentum above 0".to_string(),
            "add e.g. `momentum: 0.9`, or drop `nesterov`",
        );
    }
    valid.then_some(opt)
}

/// A number above `bound` (or equal to it when `inclusive`).
fn at_least(
    rep: &mut Reporter,
    value: &Value,
    what: &str,
    bound: f64,
    inclusive: bool,
) -> Option<f64> {
    let x = rep.number(value, what)?;
    let (ok, relation) = if inclusive {
        (x >= bound, "at least")
    } else {
        (x > bound, "greater than")
    };
    rep.ensure(
        ok,
        value,
        format!("{what} must be {relation} {bound}, found {x}"),
        "check the sign and the exponent",
    )
    .then_some(x)
}

/// `(β1, β2)`, each in [0, 1).
fn betas(rep: &mut Reporter, value: &Value) -> Option<(f64, f64)> {
    let (Val::Tuple(items) | Val::List(items)) = &value.val else {
        rep.expected(
            value,
            "a pair of decay rates",
            "write e.g. `betas: (0.9, 0.999)`".to_string(),
        );
        return None;
    };
    let [b1, b2] = items.as_slice() else {
        let message = format!("`betas` takes 2 decay rates, found {}", items.len());
        rep.invalid(
            value.span,
            message,
            "not a pair",
            "write e.g. `betas: (0.9, 0.999)`".to_string(),
        );
        return None;
    };
    let mut rate = |v: &Value, what: &str| {
        let x = rep.number(v, what)?;
        let help = "a decay rate is at least 0 and below 1, e.g. 0.9";
        rep.ensure(
            (0.0..1.0).contains(&x),
            v,
            format!("{what} must be in [0, 1), found {x}"),
            help,
        )
        .then_some(x)
    };
    let (b1, b2) = (rate(b1, "β1"), rate(b2, "β2"));
    Some((b1?, b2?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::{field_expr, field_span};
    use crate::policy::value::eval;
    use mslc_core::diag::{Code, Diagnostic, FileId};

    fn read(src: &str) -> (Option<Optimizer>, Vec<Diagnostic>) {
        let mut diags = Vec::new();
        let mut rep = Reporter::new(FileId(0), &mut diags);
        let value = eval(&field_expr(src), &mut rep).expect("evaluates");
        (optimizer(&value, &mut rep), diags)
    }

    fn codes(src: &str) -> Vec<Code> {
        read(src).1.iter().map(|d| d.code).collect()
    }

    #[test]
    fn pytorch_defaults_and_arguments() {
        let (opt, diags) = read("adamw(lr: 1e-4, betas: (0.9, 0.95), weight_decay: 0.1)");
        assert!(diags.is_empty(), "{diags:?}");
        let opt = opt.expect("optimizer");
        assert_eq!(
            (opt.kind, opt.lr, opt.betas, opt.eps, opt.weight_decay),
            (OptimizerKind::AdamW, 1e-4, (0.9, 0.95), 1e-8, 0.1)
        );
        let adamw = read("adamw").0.expect("adamw");
        assert_eq!(
            (adamw.lr, adamw.betas, adamw.eps, adamw.weight_decay),
            (1e-3, (0.9, 0.999), 1e-8, 0.01)
        );
        let adam = read("adam").0.expect("adam");
        assert_eq!(
            (adam.lr, adam.betas, adam.eps, adam.weight_decay),
            (1e-3, (0.9, 0.999), 1e-8, 0.0)
        );
        let sgd = read("sgd(0.01, 0.9, true)").0.expect("sgd");
        assert_eq!(
            (sgd.kind, sgd.lr, sgd.momentum, sgd.nesterov),
            (OptimizerKind::Sgd, 0.01, 0.9, true)
        );
        assert_eq!(
            read("sgd").0.map(|o| (o.lr, o.nesterov)),
            Some((1e-3, false))
        );
        let m = read("momentum(learning_rate: 0.1, momentum: 0.9)")
            .0
            .expect("momentum");
        assert_eq!((m.kind, m.lr, m.momentum), (OptimizerKind::Sgd, 0.1, 0.9));
    }

    #[test]
    fn invalid_optimizers() {
        assert_eq!(codes("momentum"), vec![Code::E0501, Code::E0501]);
        assert_eq!(codes("sgd(betas: (0.9, 0.99))"), vec![Code::E0204]);
        assert_eq!(codes("adam(nesterov: true)"), vec![Code::E0204]);
        assert_eq!(codes("sgd(lr: 0.1, nesterov: true)"), vec![Code::E0502]);
        assert_eq!(
            codes("sgd(lr: 0.1, momentum: 0.9, nesterov: 1)"),
            vec![Code::E0502]
        );
        assert_eq!(
            codes("adam(lr: -1, eps: 0, weight_decay: -0.1)"),
            vec![Code::E0502; 3]
        );
        assert_eq!(codes("adam(betas: (0.9, 1.0))"), vec![Code::E0502]);
        assert_eq!(codes("adam(betas: (-0.1, 0.9))"), vec![Code::E0502]);
        assert_eq!(codes("adam(betas: 0.9)"), vec![Code::E0502]);
        assert_eq!(codes("adam(betas: (0.9, 0.99, 0.999))"), vec![Code::E0502]);
        assert_eq!(codes("\"adam\""), vec![Code::E0502]);
        let src = "adamww(lr: 1)";
        let (opt, diags) = read(src);
        assert_eq!(opt, None);
        assert_eq!(diags[0].primary.span, field_span(src, "adamww", 0));
        assert_eq!(
            diags[0].help.as_deref(),
            Some("did you mean `adamw`? optimizer is one of `sgd`, `momentum`, `adam` or `adamw`")
        );
        let src = "adam(betas: (0.9, 1.5))";
        assert_eq!(read(src).1[0].primary.span, field_span(src, "1.5", 0));
    }
}
