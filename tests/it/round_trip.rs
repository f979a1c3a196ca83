//! Every example and stdlib file, and the design document's sketch, survives parse → print → parse: the printed form parses
//! without diagnostics into the same tree, and printing it again gives the same text (the printer is idempotent).

use mslc_core::diag::Sources;
use mslc_syntax::{ast::File, parse, print::print_file};

/// Whether two syntax trees are the same but for their spans (where they were written).
pub fn same_tree(a: &File, b: &File) -> bool {
    without_spans(&format!("{a:?}")) == without_spans(&format!("{b:?}"))
}

/// Every span (`255..258`, how a span debug-prints) → `..` in a tree's debug text.
fn without_spans(debug: &str) -> String {
    let bytes = debug.as_bytes();
    let mut out = String::new();
    let mut i = 0;
    while i < bytes.len() {
        let digits = |from: usize| {
            bytes[from..]
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .count()
        };
        let start = digits(i);
        let is_span = start > 0
            && (i == 0 || !bytes[i - 1].is_ascii_alphanumeric())
            && debug[i + start..].starts_with("..")
            && digits(i + start + 2) > 0;
        if is_span {
            out.push_str("..");
            i += start + 2 + digits(i + start + 2);
        } else {
            let c = debug[i..].chars().next().unwrap_or(' ');
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// The `.msl` files directly in `dir`, sorted.
pub fn msl_files(dir: &str) -> Vec<std::path::PathBuf> {
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
        assert!(
            same_tree(&ast, &reparsed),
            "{}: the printed tree differs",
            path.display()
        );
    }
}
