//! The README's language example must stay true: it checks clean.

#[test]
fn readme_example_checks_clean() {
    let readme = std::fs::read_to_string("README.md").unwrap();
    let start = readme
        .find("```\nimport std.llm")
        .expect("the README's language example")
        + 4;
    let end = start + readme[start..].find("```").unwrap();
    let checked = mslc_check::check_source("README.msl", &readme[start..end], &Default::default());
    assert!(checked.diagnostics.is_empty(), "{:?}", checked.diagnostics);
    assert_eq!(checked.models[0].param_count(), 3_676_416);
}
