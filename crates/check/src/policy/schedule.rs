//! The learning-rate `schedule` of a train declaration: `constant`, or a linear warm-up then a
//! cosine or linear decay to a floor — `warmup_cosine(warmup: 100, total: 1000, min_lr: 1e-5)`,
//! `warmup_linear(…)` — with the semantics of Hugging Face's `get_cosine_schedule_with_warmup`
//! and `get_linear_schedule_with_warmup` plus a floor: update `k` (from 0) uses
//! `lr · k / warmup` while `k < warmup`, then decays from `lr` at `k = warmup` to `min_lr` at
//! `k = total` and stays there.

use std::f64::consts::PI;

use super::args::{bind_call, Param};
use super::report::{Choices, Reporter};
use super::value::{Val, Value};

/// How the decay after the warm-up falls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decay {
    /// Half a cosine period.
    Cosine,
    /// A straight line.
    Linear,
}

/// A checked learning-rate schedule.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Schedule {
    /// The optimizer's lr at every update.
    Constant,
    /// Linear warm-up from 0, then a decay to `min_lr`.
    Warmup {
        /// The decay's shape.
        decay: Decay,
        /// Updates of warm-up.
        warmup: u64,
        /// The update at which the decay reaches `min_lr`.
        total: u64,
        /// The floor.
        min_lr: f64,
    },
}

impl Schedule {
    /// The learning rate of update `k` (from 0) for a peak of `lr`.
    pub fn lr(&self, lr: f64, k: u64) -> f64 {
        let Schedule::Warmup {
            decay,
            warmup,
            total,
            min_lr,
        } = *self
        else {
            return lr;
        };
        if k < warmup {
            return lr * k as f64 / warmup as f64;
        }
        let progress = ((k - warmup) as f64 / (total - warmup) as f64).min(1.0);
        let fraction = match decay {
            Decay::Cosine => 0.5 * (1.0 + (PI * progress).cos()),
            Decay::Linear => 1.0 - progress,
        };
        min_lr + (lr - min_lr) * fraction
    }

    /// The floor the schedule decays to, if any.
    pub fn min_lr(&self) -> Option<f64> {
        match self {
            Schedule::Constant => None,
            Schedule::Warmup { min_lr, .. } => Some(*min_lr),
        }
    }
}

const KINDS: &Choices<Option<Decay>> = &[
    (&["constant"], None),
    (&["warmup_cosine"], Some(Decay::Cosine)),
    (&["warmup_linear"], Some(Decay::Linear)),
];

const PARAMS: &[Param] = &[
    Param::required(&["warmup"], "warmup: 100"),
    Param::required(&["total"], "total: 1000"),
    Param::optional(&["min_lr"]),
];

/// Reads `constant` or `warmup_cosine(warmup: 100, total: 1000, min_lr: 1e-5)`.
pub(crate) fn schedule(value: &Value, rep: &mut Reporter) -> Option<Schedule> {
    let (name, args) = match &value.val {
        Val::Call(name, args) => (name, args.as_slice()),
        _ => match value.word() {
            Some(word) => (word, [].as_slice()),
            None => {
                let help = "write `constant` or e.g. `warmup_cosine(warmup: 100, total: 1000)`";
                rep.expected(value, "a learning-rate schedule", help.to_string());
                return None;
            }
        },
    };
    let callee = Value {
        val: Val::Name(vec![name.clone()]),
        span: name.span,
    };
    let Some(decay) = rep.word(&callee, "schedule", KINDS)? else {
        if !args.is_empty() {
            let help = "write `schedule = constant`".to_string();
            rep.invalid(
                value.span,
                "`constant` takes no arguments".to_string(),
                "arguments here",
                help,
            );
            return None;
        }
        return Some(Schedule::Constant);
    };
    let slots = bind_call(name, args, value.span, PARAMS, rep);
    let [warmup, total, min_lr] = slots.as_slice() else {
        return None;
    };
    let (warmup, total) = (*warmup.as_ref()?, *total.as_ref()?);
    let warmup_steps = rep.int(warmup, "the warm-up length");
    let total_steps = rep.positive_int(total, "the schedule's length");
    let floor = match min_lr {
        Some(v) => {
            let x = rep.number(v, "min_lr")?;
            rep.ensure(
                x >= 0.0,
                v,
                format!("min_lr must be at least 0, found {x}"),
                "the floor is a learning rate, e.g. `min_lr: 1e-5`",
            )
            .then_some(x)?
        }
        None => 0.0,
    };
    let (warmup_steps, total_steps) = (warmup_steps?, total_steps?);
    let ok = rep.ensure(
        warmup_steps >= 0,
        warmup,
        format!("the warm-up length must be at least 0, found {warmup_steps}"),
        "write `warmup: 0` for no warm-up",
    );
    let ordered = rep.ensure(
        total_steps > warmup_steps,
        total,
        format!(
            "the schedule ends at update {total_steps}, not after its warm-up of {warmup_steps}"
        ),
        "`total` counts every update, warm-up included; make it larger than `warmup`",
    );
    (ok && ordered).then_some(Schedule::Warmup {
        decay,
        warmup: warmup_steps as u64,
        total: total_steps as u64,
        min_lr: floor,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::field_expr;
    use crate::policy::value::eval;
    use mslc_core::diag::{Code, Diagnostic, FileId};

    fn read(src: &str) -> (Option<Schedule>, Vec<Diagnostic>) {
        let mut diags = Vec::new();
        let mut rep = Reporter::new(FileId(0), &mut diags);
        let value = eval(&field_expr(src), &mut rep).expect("evaluates");
        (schedule(&value, &mut rep), diags)
    }

    fn codes(src: &str) -> Vec<Code> {
        read(src).1.iter().map(|d| d.code).collect()
    }

    #[test]
    fn warmup_then_decay_to_the_floor() {
        let s = read("warmup_cosine(warmup: 4, total: 12, min_lr: 0.1)")
            .0
            .expect("schedule");
        let lrs: Vec<f64> = [0, 2, 4, 8, 12, 20].iter().map(|&k| s.lr(1.0, k)).collect();
        let want = [0.0, 0.5, 1.0, 0.1 + 0.9 * 0.5, 0.1, 0.1];
        for (got, want) in lrs.iter().zip(want) {
            assert!((got - want).abs() < 1e-12, "{lrs:?}");
        }
        let l = read("warmup_linear(warmup: 0, total: 10)")
            .0
            .expect("linear");
        assert_eq!((l.lr(2.0, 0), l.lr(2.0, 5), l.lr(2.0, 10)), (2.0, 1.0, 0.0));
        assert_eq!(read("constant").0.map(|c| c.lr(0.3, 99)), Some(0.3));
    }

    #[test]
    fn invalid_schedules() {
        assert_eq!(codes("warmup_cosine(total: 10)"), vec![Code::E0501]);
        assert_eq!(
            codes("warmup_cosine(warmup: 10, total: 10)"),
            vec![Code::E0502]
        );
        assert_eq!(
            codes("warmup_cosine(warmup: -1, total: 10)"),
            vec![Code::E0502]
        );
        assert_eq!(
            codes("warmup_linear(warmup: 1, total: 10, min_lr: -1)"),
            vec![Code::E0502]
        );
        assert_eq!(
            codes("warmup_linear(warmup: 1, total: 10, peak: 1)"),
            vec![Code::E0204]
        );
        assert_eq!(codes("constant(1)"), vec![Code::E0502]);
        assert_eq!(codes("cosine"), vec![Code::E0502]);
        assert_eq!(codes("3"), vec![Code::E0502]);
    }
}
