//! Every example and stdlib file, and the design document's sketch, survives parse → print → parse: the printed form parses
//! without diagnostics, and printing it again gives the same text (the printer is idempotent).

use mslc_core::diag::Sources;
use mslc_syntax::{parse, print::print_file};

fn msl_files(dir: &str) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "msl"))
        .collect();
    files.sort();
    files
}

#[test]
fn examples_and_stdlib_round_trip() {
    let files: Vec<_> = msl_files("examples")
        .into_iter()
        .chain(msl_files("stdlib"))
        .chain(msl_files("tests/fixtures"))
        .collect();
    assert!(
        files.len() >= 13,
        "expected the examples and stdlib files, found {}",
        files.len()
    );
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        let mut sources = Sources::new();
        let id = sources.add(path.display().to_string(), text.as_str());
        let (ast, diags) = parse(id, &text);
        assert!(diags.is_empty(), "{}: {diags:?}", path.display());
        let printed = print_file(&ast);
        let (reparsed, diags) = parse(id, &printed);
        assert!(
            diags.is_empty(),
            "{} printed form does not parse: {diags:?}\n{printed}",
            path.display()
        );
        assert_eq!(
            printed,
            print_file(&reparsed),
            "{}: printing is not stable",
            path.display()
        );
        assert_eq!(ast.items.len(), reparsed.items.len(), "{}", path.display());
    }
}
