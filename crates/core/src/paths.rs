//! Instance paths (`model.layers.3.mlp.up_proj.weight`) read as layer runs: the first all-digit
//! segment is the layer index. The parameter table collapses `model.layers.{0..79}` with it
//! and the Graphviz dump clusters and elides repeated layers with it, so both agree on what a
//! layer is.

/// `a.12.b` → (`a.`, 12, `.b`): the path around its first all-digit segment; `None` when no
/// segment is all digits (or the index does not fit a `u64`).
pub fn split_index(path: &str) -> Option<(&str, u64, &str)> {
    let mut offset = 0;
    for segment in path.split('.') {
        if !segment.is_empty() && segment.bytes().all(|b| b.is_ascii_digit()) {
            let index = segment.parse().ok()?;
            let end = offset + segment.len();
            return Some((&path[..offset], index, &path[end..]));
        }
        offset += segment.len() + 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_numeric_segment_is_the_layer() {
        assert_eq!(
            split_index("model.layers.12.mlp.0.w"),
            Some(("model.layers.", 12, ".mlp.0.w"))
        );
        assert_eq!(split_index("layers.3"), Some(("layers.", 3, "")));
        assert_eq!(split_index("7"), Some(("", 7, "")));
        assert_eq!(split_index("model.norm.weight"), None);
        assert_eq!(split_index("a.99999999999999999999999.b"), None);
        assert_eq!(split_index("a..b"), None);
    }
}
