//! Compile-time values the elaborator computes with: numbers, shapes, dtypes, initializers and
//! handles to tensors of the model being built.

use mslc_core::ops::DType;

use mslc_core::program::{Init, ValueId};

/// A value during elaboration.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// An integer (also a dimension size).
    Int(i64),
    /// A float.
    Float(f64),
    /// A boolean.
    Bool(bool),
    /// A string.
    Str(String),
    /// An element type.
    DType(DType),
    /// `[a, b]`; a shape when all elements are ints.
    List(Vec<Value>),
    /// `(a, b)`
    Tuple(Vec<Value>),
    /// `{k: v}`
    Record(Vec<(String, Value)>),
    /// A tensor of the model.
    Tensor(ValueId),
    /// A parameter initializer.
    Init(Init),
    /// `31GB` and the like: the value in base units.
    Quantity(f64),
    /// Something already reported as an error; propagates silently.
    Error,
}

impl Value {
    /// How the value is described in messages ("an int", "a tensor").
    pub fn describe(&self) -> &'static str {
        match self {
            Value::Int(_) => "an int",
            Value::Float(_) => "a float",
            Value::Bool(_) => "a bool",
            Value::Str(_) => "a string",
            Value::DType(_) => "a dtype",
            Value::List(_) => "a list",
            Value::Tuple(_) => "a tuple",
            Value::Record(_) => "a record",
            Value::Tensor(_) => "a tensor",
            Value::Init(_) => "an initializer",
            Value::Quantity(_) => "a quantity",
            Value::Error => "an invalid value",
        }
    }

    /// The value as a float, if it is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Int(v) => Some(*v as f64),
            Value::Float(v) => Some(*v),
            _ => None,
        }
    }

    /// The value as a list of ints (a shape), if it is one.
    pub fn as_ints(&self) -> Option<Vec<i64>> {
        match self {
            Value::List(items) | Value::Tuple(items) => items
                .iter()
                .map(|v| {
                    if let Value::Int(i) = v {
                        Some(*i)
                    } else {
                        None
                    }
                })
                .collect(),
            _ => None,
        }
    }

    /// Whether this is, or contains, the poisoned value.
    pub fn contains_error(&self) -> bool {
        match self {
            Value::Error => true,
            Value::List(items) | Value::Tuple(items) => items.iter().any(Value::contains_error),
            Value::Record(fields) => fields.iter().any(|(_, v)| v.contains_error()),
            _ => false,
        }
    }

    /// Whether this is the poisoned value.
    pub fn is_error(&self) -> bool {
        matches!(self, Value::Error)
    }
}
