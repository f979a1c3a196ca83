//! Op attributes: values, the typed map ops carry, and the per-op schema that validates them.

use super::dtype::DType;
use super::error::OpError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// One attribute value. Floats print with a decimal point or exponent so that the IR text
/// tells them apart from ints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttrValue {
    Int(i64),
    Float(f64),
    Bool(bool),
    Ints(Vec<i64>),
    DType(DType),
    Str(String),
}

/// The kind of an [`AttrValue`], as a schema states it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttrKind {
    Int,
    Float,
    Bool,
    Ints,
    DType,
    Str,
}

impl AttrKind {
    /// How error messages name the kind ("an int list").
    pub fn describe(self) -> &'static str {
        match self {
            AttrKind::Int => "an int",
            AttrKind::Float => "a float",
            AttrKind::Bool => "a bool",
            AttrKind::Ints => "an int list",
            AttrKind::DType => "a dtype",
            AttrKind::Str => "a string",
        }
    }
}

impl AttrValue {
    /// The kind of this value.
    pub const fn kind(&self) -> AttrKind {
        match self {
            AttrValue::Int(_) => AttrKind::Int,
            AttrValue::Float(_) => AttrKind::Float,
            AttrValue::Bool(_) => AttrKind::Bool,
            AttrValue::Ints(_) => AttrKind::Ints,
            AttrValue::DType(_) => AttrKind::DType,
            AttrValue::Str(_) => AttrKind::Str,
        }
    }

    /// Converts to `kind` where that loses nothing (an int where a float is expected);
    /// `None` when the kinds are incompatible.
    fn coerce(&self, kind: AttrKind) -> Option<AttrValue> {
        match (self, kind) {
            (v, k) if v.kind() == k => Some(v.clone()),
            (AttrValue::Int(i), AttrKind::Float) => Some(AttrValue::Float(*i as f64)),
            _ => None,
        }
    }
}

impl fmt::Display for AttrValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttrValue::Int(i) => write!(f, "{i}"),
            // `{:?}` is the shortest text that reads back to the same f64 and always has a
            // `.`, an exponent, `inf` or `NaN`.
            AttrValue::Float(x) => write!(f, "{x:?}"),
            AttrValue::Bool(b) => write!(f, "{b}"),
            AttrValue::Ints(v) => {
                f.write_str("[")?;
                for (i, x) in v.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{x}")?;
                }
                f.write_str("]")
            }
            AttrValue::DType(d) => write!(f, "{d}"),
            AttrValue::Str(s) => f.write_str(&quote(s)),
        }
    }
}

/// `s` in double quotes, escaping `"`, `\`, newline, tab and other control characters (as
/// `\u{..}`), so that any string survives a text round trip (IR dumps use it for names too).
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl From<i64> for AttrValue {
    fn from(v: i64) -> Self {
        AttrValue::Int(v)
    }
}
impl From<f64> for AttrValue {
    fn from(v: f64) -> Self {
        AttrValue::Float(v)
    }
}
impl From<bool> for AttrValue {
    fn from(v: bool) -> Self {
        AttrValue::Bool(v)
    }
}
impl From<Vec<i64>> for AttrValue {
    fn from(v: Vec<i64>) -> Self {
        AttrValue::Ints(v)
    }
}
impl From<&[i64]> for AttrValue {
    fn from(v: &[i64]) -> Self {
        AttrValue::Ints(v.to_vec())
    }
}
impl From<DType> for AttrValue {
    fn from(v: DType) -> Self {
        AttrValue::DType(v)
    }
}
impl From<&str> for AttrValue {
    fn from(v: &str) -> Self {
        AttrValue::Str(v.to_string())
    }
}

/// The attributes of one op application, by name, in a deterministic order.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Attrs(BTreeMap<String, AttrValue>);

impl Attrs {
    /// No attributes.
    pub fn new() -> Attrs {
        Attrs::default()
    }

    /// Builder form of [`Attrs::insert`]: `Attrs::new().with("axis", -1)`.
    pub fn with(mut self, name: &str, value: impl Into<AttrValue>) -> Attrs {
        self.insert(name, value);
        self
    }

    /// Sets `name`, replacing any previous value.
    pub fn insert(&mut self, name: &str, value: impl Into<AttrValue>) {
        self.0.insert(name.to_string(), value.into());
    }

    /// Removes `name`, returning its value.
    pub fn remove(&mut self, name: &str) -> Option<AttrValue> {
        self.0.remove(name)
    }

    /// The raw value of `name`, if set.
    pub fn get(&self, name: &str) -> Option<&AttrValue> {
        self.0.get(name)
    }

    /// Attributes in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &AttrValue)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Number of attributes set.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when no attribute is set.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `name` as `kind`, converted by `extract`; `Ok(None)` when absent, an error when set
    /// to a value of another kind.
    fn typed<T>(
        &self,
        name: &str,
        kind: AttrKind,
        extract: impl Fn(AttrValue) -> Option<T>,
    ) -> Result<Option<T>, OpError> {
        match self.0.get(name) {
            None => Ok(None),
            Some(v) => v.coerce(kind).and_then(extract).map(Some).ok_or_else(|| {
                OpError::new(format!(
                    "attribute `{name}` must be {}, got {v}",
                    kind.describe()
                ))
            }),
        }
    }

    fn required<T>(&self, name: &str, value: Option<T>) -> Result<T, OpError> {
        value.ok_or_else(|| OpError::new(format!("missing attribute `{name}`")))
    }

    /// `name` as an int; an error when missing or of another kind.
    pub fn int(&self, name: &str) -> Result<i64, OpError> {
        self.required(name, self.opt_int(name)?)
    }

    /// `name` as a float (an int converts); an error when missing or of another kind.
    pub fn float(&self, name: &str) -> Result<f64, OpError> {
        self.required(name, self.opt_float(name)?)
    }

    /// `name` as a bool; an error when missing or of another kind.
    pub fn bool(&self, name: &str) -> Result<bool, OpError> {
        self.required(name, self.opt_bool(name)?)
    }

    /// `name` as an int list; an error when missing or of another kind.
    pub fn ints(&self, name: &str) -> Result<Vec<i64>, OpError> {
        self.required(name, self.opt_ints(name)?)
    }

    /// `name` as a dtype; an error when missing or of another kind.
    pub fn dtype(&self, name: &str) -> Result<DType, OpError> {
        self.required(
            name,
            self.typed(name, AttrKind::DType, |v| match v {
                AttrValue::DType(d) => Some(d),
                _ => None,
            })?,
        )
    }

    /// `name` as a string; an error when missing or of another kind.
    pub fn str(&self, name: &str) -> Result<String, OpError> {
        self.required(name, self.opt_str(name)?)
    }

    /// `name` as a string, `None` when absent; an error when of another kind.
    pub fn opt_str(&self, name: &str) -> Result<Option<String>, OpError> {
        self.typed(name, AttrKind::Str, |v| match v {
            AttrValue::Str(s) => Some(s),
            _ => None,
        })
    }

    /// `name` as an int, `None` when absent; an error when of another kind.
    pub fn opt_int(&self, name: &str) -> Result<Option<i64>, OpError> {
        self.typed(name, AttrKind::Int, |v| match v {
            AttrValue::Int(i) => Some(i),
            _ => None,
        })
    }

    /// `name` as a bool, `None` when absent; an error when of another kind.
    pub fn opt_bool(&self, name: &str) -> Result<Option<bool>, OpError> {
        self.typed(name, AttrKind::Bool, |v| match v {
            AttrValue::Bool(b) => Some(b),
            _ => None,
        })
    }

    /// `name` as a float, `None` when absent; an error when of another kind.
    pub fn opt_float(&self, name: &str) -> Result<Option<f64>, OpError> {
        self.typed(name, AttrKind::Float, |v| match v {
            AttrValue::Float(x) => Some(x),
            _ => None,
        })
    }

    /// `name` as an int list, `None` when absent; an error when of another kind.
    pub fn opt_ints(&self, name: &str) -> Result<Option<Vec<i64>>, OpError> {
        self.typed(name, AttrKind::Ints, |v| match v {
            AttrValue::Ints(v) => Some(v),
            _ => None,
        })
    }
}

impl<S: Into<String>> FromIterator<(S, AttrValue)> for Attrs {
    fn from_iter<I: IntoIterator<Item = (S, AttrValue)>>(iter: I) -> Self {
        Attrs(iter.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }
}

/// A default value as a registry entry writes it: the `const`-friendly form of [`AttrValue`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ConstAttr {
    Int(i64),
    Float(f64),
    Bool(bool),
    Ints(&'static [i64]),
    DType(DType),
    Str(&'static str),
}

impl ConstAttr {
    /// The kind of this value.
    pub const fn kind(self) -> AttrKind {
        match self {
            ConstAttr::Int(_) => AttrKind::Int,
            ConstAttr::Float(_) => AttrKind::Float,
            ConstAttr::Bool(_) => AttrKind::Bool,
            ConstAttr::Ints(_) => AttrKind::Ints,
            ConstAttr::DType(_) => AttrKind::DType,
            ConstAttr::Str(_) => AttrKind::Str,
        }
    }
}

impl From<ConstAttr> for AttrValue {
    fn from(v: ConstAttr) -> Self {
        match v {
            ConstAttr::Int(i) => AttrValue::Int(i),
            ConstAttr::Float(x) => AttrValue::Float(x),
            ConstAttr::Bool(b) => AttrValue::Bool(b),
            ConstAttr::Ints(v) => AttrValue::Ints(v.to_vec()),
            ConstAttr::DType(d) => AttrValue::DType(d),
            ConstAttr::Str(s) => AttrValue::Str(s.to_string()),
        }
    }
}

/// Whether a schema attribute must be given, may be left out, or has a fixed default.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AttrDefault {
    /// Must be set.
    Required,
    /// May be absent; the op's rule documents what absence means (e.g. "all axes").
    Optional,
    /// Filled in with this value when absent.
    Value(ConstAttr),
}

/// One attribute an op accepts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttrSpec {
    pub name: &'static str,
    pub kind: AttrKind,
    pub default: AttrDefault,
}

impl AttrSpec {
    /// An attribute that must be set.
    pub const fn required(name: &'static str, kind: AttrKind) -> AttrSpec {
        AttrSpec {
            name,
            kind,
            default: AttrDefault::Required,
        }
    }

    /// An attribute that may be absent.
    pub const fn optional(name: &'static str, kind: AttrKind) -> AttrSpec {
        AttrSpec {
            name,
            kind,
            default: AttrDefault::Optional,
        }
    }

    /// An attribute with a default value (its kind is the value's kind).
    pub const fn defaulted(name: &'static str, value: ConstAttr) -> AttrSpec {
        AttrSpec {
            name,
            kind: value.kind(),
            default: AttrDefault::Value(value),
        }
    }
}

/// Checks `attrs` against `schema` and returns them complete: every value of its declared
/// kind (ints widened to floats where a float is declared) and every default filled in.
/// Unknown, missing or ill-typed attributes are errors.
pub fn resolve(schema: &[AttrSpec], attrs: &Attrs) -> Result<Attrs, OpError> {
    if let Some((name, _)) = attrs
        .iter()
        .find(|(name, _)| !schema.iter().any(|s| s.name == *name))
    {
        let known: Vec<&str> = schema.iter().map(|s| s.name).collect();
        let help = if known.is_empty() {
            "this op takes no attributes".to_string()
        } else {
            format!("expected one of: {}", known.join(", "))
        };
        return Err(OpError::new(format!("unknown attribute `{name}`")).with_help(help));
    }
    let mut out = Attrs::new();
    for spec in schema {
        match (attrs.get(spec.name), &spec.default) {
            (Some(v), _) => {
                let v = v.coerce(spec.kind).ok_or_else(|| {
                    OpError::new(format!(
                        "attribute `{}` must be {}, got {v}",
                        spec.name,
                        spec.kind.describe()
                    ))
                })?;
                out.insert(spec.name, v);
            }
            (None, AttrDefault::Required) => {
                return Err(OpError::new(format!(
                    "missing attribute `{}` ({})",
                    spec.name,
                    spec.kind.describe()
                )))
            }
            (None, AttrDefault::Optional) => {}
            (None, AttrDefault::Value(v)) => out.insert(spec.name, *v),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCHEMA: &[AttrSpec] = &[
        AttrSpec::required("axis", AttrKind::Int),
        AttrSpec::defaulted("keepdim", ConstAttr::Bool(false)),
        AttrSpec::defaulted("stride", ConstAttr::Ints(&[1, 1])),
        AttrSpec::optional("scale", AttrKind::Float),
        AttrSpec::required("eps", AttrKind::Float),
    ];

    #[test]
    fn resolve_fills_defaults_and_coerces() {
        let a = Attrs::new().with("axis", -1).with("eps", 1i64);
        let r = resolve(SCHEMA, &a).unwrap();
        assert_eq!(r.int("axis").unwrap(), -1);
        assert!(!r.bool("keepdim").unwrap());
        assert_eq!(r.get("eps"), Some(&AttrValue::Float(1.0)));
        assert_eq!(r.opt_float("scale").unwrap(), None);
        assert_eq!(r.ints("stride").unwrap(), vec![1, 1]);
        assert_eq!(r.len(), 4);
    }

    #[test]
    fn resolve_rejects_bad_attributes() {
        let missing = resolve(SCHEMA, &Attrs::new().with("axis", 0)).unwrap_err();
        assert_eq!(missing.message, "missing attribute `eps` (a float)");
        let wrong = resolve(SCHEMA, &Attrs::new().with("axis", true).with("eps", 0.1));
        assert_eq!(
            wrong.unwrap_err().message,
            "attribute `axis` must be an int, got true"
        );
        let unknown = resolve(SCHEMA, &Attrs::new().with("axes", vec![1])).unwrap_err();
        assert_eq!(unknown.message, "unknown attribute `axes`");
        assert_eq!(
            unknown.help.as_deref(),
            Some("expected one of: axis, keepdim, stride, scale, eps")
        );
        let none = resolve(&[], &Attrs::new().with("x", 1)).unwrap_err();
        assert_eq!(none.help.as_deref(), Some("this op takes no attributes"));
    }

    #[test]
    fn typed_getters() {
        let a = Attrs::new()
            .with("d", DType::BF16)
            .with("s", "relu")
            .with("v", vec![1, -2])
            .with("f", 0.5);
        assert_eq!(a.dtype("d").unwrap(), DType::BF16);
        assert_eq!(a.str("s").unwrap(), "relu");
        assert_eq!(a.ints("v").unwrap(), vec![1, -2]);
        assert_eq!(a.float("f").unwrap(), 0.5);
        assert_eq!(
            a.int("f").unwrap_err().message,
            "attribute `f` must be an int, got 0.5"
        );
        assert_eq!(a.bool("zz").unwrap_err().message, "missing attribute `zz`");
        assert_eq!(a.opt_ints("zz").unwrap(), None);
    }

    #[test]
    fn display_is_unambiguous() {
        let shown: Vec<String> = [
            AttrValue::Int(3),
            AttrValue::Float(3.0),
            AttrValue::Float(1e-5),
            AttrValue::Float(f64::NEG_INFINITY),
            AttrValue::Bool(true),
            AttrValue::Ints(vec![0, 2, 1]),
            AttrValue::Ints(vec![]),
            AttrValue::DType(DType::F16),
            AttrValue::Str("a\"b\\c\nd\u{1}".into()),
        ]
        .iter()
        .map(|v| v.to_string())
        .collect();
        assert_eq!(
            shown,
            [
                "3",
                "3.0",
                "1e-5",
                "-inf",
                "true",
                "[0,2,1]",
                "[]",
                "f16",
                r#""a\"b\\c\nd\u{1}""#
            ]
        );
    }
}
