//! Random and mutated sources never panic: they end either checked or with coded diagnostics
//! that point inside the file.

use mslc_check::{check_source, CheckOptions};
use proptest::prelude::*;

fn check_no_panic(text: &str) {
    let checked = check_source("fuzz.msl", text, &CheckOptions::default());
    for d in &checked.diagnostics {
        let file = checked.sources.get(d.primary.file);
        assert!(d.primary.span.start <= d.primary.span.end);
        assert!(
            d.primary.span.end <= file.text.len() + 1,
            "span past the end: {d:?}"
        );
        assert!(!d.message.is_empty());
    }
}

fn seed_sources() -> Vec<String> {
    [
        "examples/mlp.msl",
        "examples/tiny_llama.msl",
        "examples/bert_base.msl",
        "tests/fixtures/sketch.msl",
    ]
    .iter()
    .map(|p| std::fs::read_to_string(p).unwrap())
    .collect()
}

#[derive(Debug, Clone)]
enum Mutation {
    Delete(usize, usize),
    Insert(usize, String),
    Duplicate(usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let token = prop_oneof![
        Just("(".to_string()),
        Just(")".to_string()),
        Just("{".to_string()),
        Just("}".to_string()),
        Just("[".to_string()),
        Just("]".to_string()),
        Just(",".to_string()),
        Just(":".to_string()),
        Just("@".to_string()),
        Just("\"".to_string()),
        Just("/*".to_string()),
        Just("0".to_string()),
        Just("-1".to_string()),
        Just("x".to_string()),
        Just("let".to_string()),
        Just("...".to_string()),
        Just("1f1b".to_string()),
        "[a-z_]{1,6}",
        "[ -~]{1,4}",
    ];
    prop_oneof![
        (any::<usize>(), 1usize..20).prop_map(|(a, n)| Mutation::Delete(a, n)),
        (any::<usize>(), token).prop_map(|(a, t)| Mutation::Insert(a, t)),
        (any::<usize>(), 1usize..40).prop_map(|(a, n)| Mutation::Duplicate(a, n)),
    ]
}

fn apply(text: &str, m: &Mutation) -> String {
    let clamp = |i: usize| {
        let mut i = i % (text.len() + 1);
        while !text.is_char_boundary(i) {
            i -= 1;
        }
        i
    };
    match m {
        Mutation::Delete(at, n) => {
            let a = clamp(*at);
            let b = clamp((a + n).min(text.len()));
            format!("{}{}", &text[..a], &text[b.max(a)..])
        }
        Mutation::Insert(at, t) => {
            let a = clamp(*at);
            format!("{}{t}{}", &text[..a], &text[a..])
        }
        Mutation::Duplicate(at, n) => {
            let a = clamp(*at);
            let b = clamp((a + n).min(text.len())).max(a);
            format!("{}{}{}", &text[..b], &text[a..b], &text[b..])
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn mutated_examples_never_panic(seed in 0usize..4, ms in prop::collection::vec(mutation(), 1..4)) {
        let sources = seed_sources();
        let mut text = sources[seed % sources.len()].clone();
        for m in &ms {
            text = apply(&text, m);
        }
        check_no_panic(&text);
    }

    #[test]
    fn random_text_never_panics(text in "[ -~\n]{0,300}") {
        check_no_panic(&text);
    }

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        check_no_panic(&String::from_utf8_lossy(&bytes));
    }
}

#[test]
fn a_scalar_matches_an_ellipsis_pattern() {
    // `...` may match no dim: a scalar passed to `x: [...]` checked by reading a size that is
    // not there (found by `mutated_examples_never_panic`).
    let source = "block Id(x: [...]) -> [...] {\n    return x\n}\nmodel M {\n    input x: f32[2]\n    let s = sum(x)\n    output y = Id(s)\n}\n";
    let checked = mslc_check::check_source("scalar.msl", source, &Default::default());
    assert!(checked.diagnostics.is_empty(), "{:?}", checked.diagnostics);
    assert!(checked.models[0].outputs[0].name == "y");
}
