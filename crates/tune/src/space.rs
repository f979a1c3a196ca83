//! A kernel's parameter space, read from the binding: one axis per field of the kernel's
//! parameter struct (so a field added to a struct is searched too). A size or threshold takes
//! values on a power-of-two ladder around its default, plus 0 (for thresholds: always
//! parallel; for thread splits: the calling thread only), within the bounds a module accepts
//! (`kernel_param_bounds`); a choice (the micro-kernel ISA)
//! takes every variant the parameter struct accepts.

use std::collections::BTreeMap;

use mslc_artifact::validate::kernel_param_bounds;
use mslc_core::ops::Op;
use mslc_kernels::binding::{KernelChoice, KernelKind, KernelParam};
use mslc_kernels::matmul::{Isa, MicroKernel};

/// One axis of the space.
#[derive(Clone, Debug, PartialEq)]
pub struct Axis {
    /// The parameter's field name.
    pub name: String,
    /// The values it takes; the default among them.
    pub values: Vec<KernelParam>,
    /// Index of the default value.
    pub default: usize,
}

/// A point of the space: one value index per axis.
pub type Point = Vec<usize>;

/// The parameter space of one op's kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct Space {
    /// The kernel family's name.
    pub kernel: String,
    /// One axis per parameter.
    pub axes: Vec<Axis>,
}

/// Multiples of a size's default that the ladder offers (and 0).
const LADDER: [(u32, u32); 8] = [
    (1, 8),
    (1, 4),
    (1, 2),
    (1, 1),
    (2, 1),
    (4, 1),
    (8, 1),
    (64, 1),
];

impl Space {
    /// The space of the kernel that runs `op`.
    pub fn of(op: Op) -> Space {
        let kind = KernelKind::for_op(op);
        let axes = kind
            .default_params()
            .into_iter()
            .map(|(name, default)| {
                let mut values = match &default {
                    KernelParam::Int(d) => ladder(*d, kernel_param_bounds(&name)),
                    KernelParam::Text(_) => variants(op, kind, &name),
                };
                if !values.contains(&default) {
                    values.push(default.clone());
                }
                values.sort();
                let default = values.iter().position(|v| *v == default).unwrap_or(0);
                Axis {
                    name,
                    values,
                    default,
                }
            })
            .collect();
        Space {
            kernel: kind.name().to_string(),
            axes,
        }
    }

    /// The default point.
    pub fn default_point(&self) -> Point {
        self.axes.iter().map(|a| a.default).collect()
    }

    /// Points in the space.
    pub fn size(&self) -> f64 {
        self.axes.iter().map(|a| a.values.len() as f64).product()
    }

    /// The kernel choice at `point`.
    pub fn choice(&self, point: &[usize]) -> KernelChoice {
        KernelChoice {
            name: self.kernel.clone(),
            params: self
                .axes
                .iter()
                .zip(point)
                .map(|(a, &i)| (a.name.clone(), a.values[i].clone()))
                .collect(),
        }
    }

    /// The point of `params` (values not on an axis map to its default), if every axis has
    /// a value there.
    pub fn point_of(&self, params: &BTreeMap<String, KernelParam>) -> Point {
        self.axes
            .iter()
            .map(|a| {
                params
                    .get(&a.name)
                    .and_then(|v| a.values.iter().position(|x| x == v))
                    .unwrap_or(a.default)
            })
            .collect()
    }

    /// The features the cost model learns from: per size axis, log2(1 + value) and its
    /// square; per choice axis, one indicator per value; and a constant.
    pub fn features(&self, point: &[usize]) -> Vec<f64> {
        let mut f = vec![1.0];
        for (a, &i) in self.axes.iter().zip(point) {
            match &a.values[i] {
                KernelParam::Int(v) => {
                    let x = ((*v).max(0) as f64 + 1.0).log2();
                    f.push(x);
                    f.push(x * x);
                }
                KernelParam::Text(_) => {
                    f.extend((0..a.values.len()).map(|j| if j == i { 1.0 } else { 0.0 }));
                }
            }
        }
        f
    }
}

/// The ladder of a size whose default is `d`: 0 and `d` times each step of [`LADDER`], within
/// the bounds a module accepts for the parameter (none but the default without bounds).
fn ladder(d: i64, bounds: Option<(i64, i64)>) -> Vec<KernelParam> {
    let Some((low, high)) = bounds else {
        return vec![KernelParam::Int(d)];
    };
    let mut v: Vec<i64> = LADDER
        .iter()
        .map(|&(num, den)| d.saturating_mul(i64::from(num)) / i64::from(den))
        .chain([0])
        .filter(|x| (low..=high).contains(x))
        .collect();
    v.sort_unstable();
    v.dedup();
    v.into_iter().map(KernelParam::Int).collect()
}

/// The values a choice parameter accepts, as the parameter struct's own decoder lists them
/// when given a value it does not know (serde names every variant of the enum).
fn variants(op: Op, kind: KernelKind, field: &str) -> Vec<KernelParam> {
    let probe = KernelChoice {
        name: kind.name().to_string(),
        params: BTreeMap::from([(field.to_string(), KernelParam::Text("\u{1}".to_string()))]),
    };
    let Err(message) = probe.check_for(op) else {
        return Vec::new();
    };
    let Some((_, expected)) = message.split_once("expected") else {
        return Vec::new();
    };
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(|v| KernelParam::Text(v.to_string()))
        .filter(|v| runs_here(field, v))
        .collect()
}

/// Whether this CPU can run a choice value: a micro-kernel ISA it lacks (AVX-512 on an
/// AVX2-only machine) is no candidate, rather than a measurement that fails.
fn runs_here(field: &str, value: &KernelParam) -> bool {
    match (field, value) {
        ("isa", KernelParam::Text(name)) => {
            serde_json::from_value::<Isa>(serde_json::Value::String(name.clone()))
                .map_or(true, |isa| MicroKernel::select(isa).is_ok())
        }
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gemm_space_comes_from_its_parameter_struct() {
        let space = Space::of(Op::Matmul);
        let names: Vec<&str> = space.axes.iter().map(|a| a.name.as_str()).collect();
        for field in KernelKind::Gemm.default_params().keys() {
            assert!(names.contains(&field.as_str()), "{field} in {names:?}");
        }
        let isa = space.axes.iter().find(|a| a.name == "isa").unwrap();
        for v in ["auto", "portable"] {
            assert!(isa.values.contains(&KernelParam::Text(v.into())), "{v}");
        }
        // Exactly the micro-kernels this CPU runs are candidates.
        for (name, isa_kind) in [("avx2", Isa::Avx2), ("avx512", Isa::Avx512)] {
            assert_eq!(
                isa.values.contains(&KernelParam::Text(name.into())),
                MicroKernel::select(isa_kind).is_ok(),
                "{name}"
            );
        }
        let mc = space.axes.iter().find(|a| a.name == "mc").unwrap();
        assert!(mc.values.len() >= 6);
        // Only values a module accepts: mc is at least 1, kc at most 4096.
        assert!(!mc.values.contains(&KernelParam::Int(0)));
        let kc = space.axes.iter().find(|a| a.name == "kc").unwrap();
        assert!(
            kc.values.iter().all(|v| *v <= KernelParam::Int(4096)),
            "{kc:?}"
        );
        let tasks = space
            .axes
            .iter()
            .find(|a| a.name == "tasks_per_thread")
            .unwrap();
        assert!(tasks.values.contains(&KernelParam::Int(0)));
        // The default point is the binding's default choice.
        assert_eq!(
            space.choice(&space.default_point()),
            mslc_kernels::binding::choose_kernel(Op::Matmul)
        );
        let p = space.point_of(&space.choice(&space.default_point()).params);
        assert_eq!(p, space.default_point());
        assert_eq!(
            space.features(&p).len(),
            space.features(&vec![0; space.axes.len()]).len()
        );
    }

    #[test]
    fn kernels_without_parameters_have_an_empty_space() {
        let space = Space::of(Op::Dropout);
        assert!(space.axes.is_empty());
        assert_eq!(space.size(), 1.0);
    }
}
