//! "Did you mean" help for misspelt names, and the formatting of lists of valid choices.

/// Levenshtein distance between two strings, counted in characters.
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let substitute = diagonal + usize::from(ca != cb);
            diagonal = row[j + 1];
            row[j + 1] = substitute.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[b.len()]
}

/// The candidate closest to `name`, if it is close enough to be a plausible typo (equal up to
/// case, within a third of the name's length (at least one edit), or a start of at least three
/// characters, counted as one edit) and no other candidate is as close: `O5` suggests none of
/// `O0`..`O3`.
pub(crate) fn closest<'a>(
    name: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let limit = (name.chars().count() / 3).max(1);
    let mut best: Option<(usize, &str)> = None;
    let mut tied = false;
    for candidate in candidates.into_iter().filter(|c| *c != name) {
        let distance = if candidate.eq_ignore_ascii_case(name) {
            0
        } else if name.len() >= 3 && candidate.starts_with(name) {
            1
        } else {
            edit_distance(name, candidate)
        };
        match best {
            Some((d, c)) if d == distance && c != candidate => tied = true,
            Some((d, _)) if d <= distance => {}
            _ if distance <= limit => {
                best = Some((distance, candidate));
                tied = false;
            }
            _ => {}
        }
    }
    best.filter(|_| !tied).map(|(_, c)| c)
}

/// `` `a`, `b` or `c` `` for a help line.
pub(crate) fn one_of<'a>(choices: impl IntoIterator<Item = &'a str>) -> String {
    let quoted: Vec<String> = choices.into_iter().map(|c| format!("`{c}`")).collect();
    match quoted.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

/// A help line for an unknown name: the closest candidate if there is one, else all of them.
pub(crate) fn help_for(name: &str, candidates: &[&str]) -> String {
    match closest(name, candidates.iter().copied()) {
        Some(best) => format!("did you mean `{best}`?"),
        None if candidates.is_empty() => "there is nothing to choose from".to_string(),
        None => format!("expected {}", one_of(candidates.iter().copied())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distance_counts_edits() {
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("softmax", "softmax"), 0);
        assert_eq!(edit_distance("sofmtax", "softmax"), 2);
    }

    #[test]
    fn closest_prefers_near_names_and_case() {
        let ops = ["softmax", "rms_norm", "layer_norm"];
        assert_eq!(closest("softmx", ops), Some("softmax"));
        assert_eq!(closest("rms_nrom", ops), Some("rms_norm"));
        assert_eq!(closest("matmul", ops), None);
        assert_eq!(closest("o2", ["O0", "O2"]), Some("O2"));
        assert_eq!(closest("O5", ["O0", "O1", "O2"]), None);
        assert_eq!(closest("semi", ["data", "semi_auto"]), Some("semi_auto"));
    }

    #[test]
    fn help_lists_choices_when_nothing_is_close() {
        assert_eq!(
            help_for("zzz", &["gpipe", "1f1b"]),
            "expected `gpipe` or `1f1b`"
        );
        assert_eq!(
            help_for("gpip", &["gpipe", "1f1b"]),
            "did you mean `gpipe`?"
        );
        assert_eq!(one_of(["a", "b", "c"]), "`a`, `b` or `c`");
    }

    proptest::proptest! {
        #[test]
        fn distance_is_a_metric(a in "[a-c]{0,6}", b in "[a-c]{0,6}", c in "[a-c]{0,6}") {
            proptest::prop_assert_eq!(edit_distance(&a, &b), edit_distance(&b, &a));
            proptest::prop_assert!(edit_distance(&a, &c) <= edit_distance(&a, &b) + edit_distance(&b, &c));
            proptest::prop_assert_eq!(edit_distance(&a, &b) == 0, a == b);
        }
    }
}
