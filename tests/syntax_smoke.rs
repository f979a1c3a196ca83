use mslc::diag::Sources;

#[test]
fn sketch_parses_and_round_trips() {
    let text = std::fs::read_to_string("tests/fixtures/sketch.msl").unwrap();
    let mut sources = Sources::new();
    let id = sources.add("sketch.msl", text.as_str());
    let (file, diags) = mslc::syntax::parse(id, &text);
    for d in &diags {
        eprintln!(
            "{}",
            mslc::diag::render::render_human(d, &sources, Default::default())
        );
    }
    assert!(diags.is_empty());
    let printed = mslc::syntax::print::print_file(&file);
    println!("{printed}");
    let (file2, diags2) = mslc::syntax::parse(id, &printed);
    assert!(diags2.is_empty(), "{diags2:?}");
    assert_eq!(printed, mslc::syntax::print::print_file(&file2));
}
