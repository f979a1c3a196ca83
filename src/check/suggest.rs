//! "Did you mean …?": the closest known name to a misspelt one.

/// The candidate closest to `name`, if one is close enough to be a likely typo.
pub fn closest<'a>(name: &str, candidates: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let limit = (name.chars().count() / 3).max(1);
    candidates
        .filter(|c| *c != name)
        .map(|c| (strsim::damerau_levenshtein(name, c), c))
        .filter(|(d, c)| *d <= limit || c.eq_ignore_ascii_case(name))
        .min_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(b.1)))
        .map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::closest;

    #[test]
    fn finds_typos_but_not_strangers() {
        let names = ["hidden", "heads", "layers"];
        assert_eq!(closest("hiden", names.iter().copied()), Some("hidden"));
        assert_eq!(closest("layer", names.iter().copied()), Some("layers"));
        assert_eq!(closest("vocab", names.iter().copied()), None);
    }
}
