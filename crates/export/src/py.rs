//! Python literals of the values the generated program embeds.

/// A Python string literal (JSON's escapes are Python's).
pub fn py_str(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

/// A Python float literal that reads back to the same f64 (`float("inf")` for the infinities).
pub fn py_float(x: f64) -> String {
    if x.is_nan() {
        "float(\"nan\")".to_string()
    } else if x.is_infinite() {
        format!("float(\"{}inf\")", if x < 0.0 { "-" } else { "" })
    } else {
        // `{:?}` is the shortest text that reads back to the same f64, always with `.` or `e`.
        format!("{x:?}")
    }
}

/// A Python list literal of `items`.
pub fn py_list(items: impl IntoIterator<Item = String>) -> String {
    format!("[{}]", items.into_iter().collect::<Vec<_>>().join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_read_back() {
        assert_eq!(py_str("a\"b\n"), "\"a\\\"b\\n\"");
        assert_eq!(py_float(1e-6), "1e-6");
        assert_eq!(py_float(0.5), "0.5");
        assert_eq!(py_float(f64::NEG_INFINITY), "float(\"-inf\")");
        assert_eq!(py_list(["1".to_string(), "2".to_string()]), "[1, 2]");
    }
}
