//! "Did you mean …?" help for misspelt names, and lists of valid choices.

/// The candidate closest to `name`, if it is close enough to be a plausible typo (equal up to
/// case, within a third of the name's length (at least one edit), or a start of at least three
/// characters, counted as one edit) and no other candidate is as close: `O5` suggests none of
/// `O0`..`O3`.
pub fn closest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let limit = (name.chars().count() / 3).max(1);
    let mut best: Option<(usize, &str)> = None;
    let mut tied = false;
    for candidate in candidates.into_iter().filter(|c| *c != name) {
        let distance = if candidate.eq_ignore_ascii_case(name) {
            0
        } else if name.len() >= 3 && candidate.starts_with(name) {
            1
        } else {
            strsim::levenshtein(name, candidate)
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
pub fn one_of<'a>(choices: impl IntoIterator<Item = &'a str>) -> String {
    let quoted: Vec<String> = choices.into_iter().map(|c| format!("`{c}`")).collect();
    match quoted.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

/// A help line for an unknown name: the closest candidate if there is one, else all of them.
pub fn help_for(name: &str, candidates: &[&str]) -> String {
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
    fn closest_prefers_near_names_and_case() {
        let ops = ["softmax", "rms_norm", "layer_norm"];
        assert_eq!(closest("softmx", ops), Some("softmax"));
        assert_eq!(closest("rms_nrom", ops), Some("rms_norm"));
        assert_eq!(closest("matmul", ops), None);
        assert_eq!(closest("o2", ["O0", "O2"]), Some("O2"));
        assert_eq!(closest("O5", ["O0", "O1", "O2"]), None);
        assert_eq!(closest("semi", ["data", "semi_auto"]), Some("semi_auto"));
        assert_eq!(
            closest("hiden", ["hidden", "heads", "layers"]),
            Some("hidden")
        );
        assert_eq!(closest("vocab", ["hidden", "heads", "layers"]), None);
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
}
