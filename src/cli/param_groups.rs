//! Collapsing repeated layers in a parameter table: paths that differ only in one numeric
//! segment (`model.layers.0.mlp.up_proj.weight` … `model.layers.79.mlp.up_proj.weight`) and
//! agree on everything printed about them become one row `model.layers.{0..79}.mlp.up_proj.weight`
//! with `× 80`, so a 70B model's `--summary` is a dozen lines, not 733.

use std::collections::HashMap;

use mslc_core::paths::split_index;

/// One row of the table: a single parameter, or a run of layers sharing a path template.
#[derive(Debug, PartialEq, Eq)]
pub struct Row {
    /// The path, with the varying segment written `{FIRST..LAST}` for a run.
    pub path: String,
    /// Index of the first member in the input (what to print shape and count from).
    pub first: usize,
    /// Members in the run (1 for a single parameter).
    pub members: usize,
}

/// A path around its layer index: the part before and the part after.
type Template = (String, String);

/// A member of a run: its position in the input and its layer index.
type Member = (usize, u64);

/// Groups `items` (path, and whatever else the row shows, which must match across a run) into
/// rows in order of first appearance. The first numeric segment of a path is the layer index;
/// a template whose indices form a contiguous range from its first index, each once, is one
/// row, anything else stays one row per parameter.
pub fn group<K: Eq + std::hash::Hash>(items: &[(&str, K)]) -> Vec<Row> {
    let mut runs: Vec<(Option<Template>, Vec<Member>)> = Vec::new();
    let mut by_key: HashMap<(String, String, &K), usize> = HashMap::new();
    for (i, (path, key)) in items.iter().enumerate() {
        match split_index(path) {
            Some((head, index, tail)) => {
                let slot = *by_key
                    .entry((head.to_string(), tail.to_string(), key))
                    .or_insert_with(|| {
                        runs.push((Some((head.to_string(), tail.to_string())), Vec::new()));
                        runs.len() - 1
                    });
                runs[slot].1.push((i, index));
            }
            None => runs.push((None, vec![(i, 0)])),
        }
    }
    let mut rows = Vec::new();
    for (template, members) in runs {
        let start = members[0].1;
        let contiguous = members
            .iter()
            .enumerate()
            .all(|(k, &(_, index))| Some(index) == start.checked_add(k as u64));
        match template {
            Some((head, tail)) if members.len() > 1 && contiguous => rows.push(Row {
                path: format!("{head}{{{start}..{}}}{tail}", members[members.len() - 1].1),
                first: members[0].0,
                members: members.len(),
            }),
            _ => rows.extend(members.iter().map(|&(i, _)| Row {
                path: items[i].0.to_string(),
                first: i,
                members: 1,
            })),
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_layers_become_one_row_each_member() {
        let mut items = vec![("embed.weight".to_string(), 1)];
        for layer in 0..80 {
            items.push((format!("model.layers.{layer}.q.weight"), 2));
            items.push((format!("model.layers.{layer}.norm.weight"), 3));
        }
        items.push(("norm.weight".to_string(), 3));
        let refs: Vec<(&str, i32)> = items.iter().map(|(p, k)| (p.as_str(), *k)).collect();
        let rows = group(&refs);
        let paths: Vec<(&str, usize)> = rows.iter().map(|r| (r.path.as_str(), r.members)).collect();
        assert_eq!(
            paths,
            [
                ("embed.weight", 1),
                ("model.layers.{0..79}.q.weight", 80),
                ("model.layers.{0..79}.norm.weight", 80),
                ("norm.weight", 1)
            ]
        );
        assert_eq!(rows[2].first, 2);
    }

    #[test]
    fn different_shapes_or_gaps_stay_apart() {
        let items = [
            ("l.0.w", 1),
            ("l.1.w", 2),
            ("m.0.w", 1),
            ("m.2.w", 1),
            ("n.7", 1),
        ];
        let rows = group(&items);
        let paths: Vec<&str> = rows.iter().map(|r| r.path.as_str()).collect();
        assert_eq!(paths, ["l.0.w", "l.1.w", "m.0.w", "m.2.w", "n.7"]);
    }
}
