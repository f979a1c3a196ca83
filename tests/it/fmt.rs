//! `mslc fmt` and `mslc_syntax::format`: every example and stdlib file is formatted; formatting
//! is idempotent, keeps every comment in order and keeps the meaning (the same syntax tree);
//! `--check` prints a diff and exits 1; a file with a syntax error or that is not a regular file
//! is reported, coded, and left alone.

use super::support::mslc_command;
use std::path::Path;
use std::process::Output;

use mslc_core::diag::FileId;
use mslc_syntax::format::{format_source, WIDTH};
use mslc_syntax::{parse, trivia};

use super::round_trip::{msl_files, same_tree};

fn mslc(args: &[&str]) -> Output {
    mslc_command(args).output().expect("run mslc")
}

fn comment_texts(text: &str) -> Vec<String> {
    trivia::comments(text)
        .iter()
        .map(|c| text[c.start..c.end].trim_end().to_string())
        .collect()
}

/// Formats `text` and checks the formatter's promises on it; returns the formatted text.
fn check_formatting(name: &str, text: &str) -> String {
    let file = FileId(0);
    let (before, diags) = parse(file, text);
    assert!(diags.is_empty(), "{name}: {diags:?}");
    let once = format_source(file, text).unwrap_or_else(|d| panic!("{name}: {d:?}"));
    let (after, diags) = parse(file, &once);
    assert!(
        diags.is_empty(),
        "{name}: formatted text does not parse: {diags:?}\n{once}"
    );
    assert!(
        same_tree(&before, &after),
        "{name}: formatting changed the tree\n{once}"
    );
    assert_eq!(
        comment_texts(text),
        comment_texts(&once),
        "{name}: comments lost or reordered\n{once}"
    );
    let twice = format_source(file, &once).unwrap();
    assert_eq!(once, twice, "{name}: formatting is not idempotent");
    once
}

#[test]
fn formatting_is_idempotent_and_keeps_comments_and_meaning() {
    let mut checked = 0;
    for dir in [
        "examples",
        "stdlib",
        "tests/fixtures",
        "tests/ui",
        "tests/ui/lib",
    ] {
        for path in msl_files(dir) {
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            // UI cases that are syntax errors have nothing to format.
            if !parse(FileId(0), &text).1.is_empty() {
                assert!(format_source(FileId(0), &text).is_err());
                continue;
            }
            check_formatting(&path.display().to_string(), &text);
            checked += 1;
        }
    }
    assert!(checked >= 50, "only {checked} files formatted");
}

#[test]
fn comments_anywhere_and_long_lines() {
    let messy = r#"// head

import std.nn.{Linear, LinearBias} // trailing on an import
/* a block
   comment */ import std.llm.LlamaModel

pub block Wide(x: [B, S, H], first_parameter: int, second_parameter: int = 3, third: float = 1e-5) -> [B, S, H] { // after the brace
    // leading
    let y = some_function(x, first_parameter, second_parameter, /* inside */ third, named_argument: [1, 2, 3])
    let z = y |> f(a: first_parameter) |> g(second_parameter) |> h(third, more: [first_parameter, second_parameter])
    if first_parameter > 1 {
        y = y + 1 // then
    } else if third < 0.5 {
        y = y - 1


        // else-if, after blank lines
    } else {
        y = y * 2 /* block at the end */
    }
    return (y, { a: 1, b: [1, 2] }) // done
    // before the closing brace
}

target t { peak_f32 = 1TFLOPS, memory = 2GB // same line
    bandwidth = 3GB/s, interconnect = max(1GB/s, /* inside a field */ 2GB/s)
}
// tail
"#;
    let out = check_formatting("messy", messy);
    assert!(
        out.lines()
            .all(|l| l.chars().count() <= WIDTH || l.contains("//")),
        "{out}"
    );
    assert!(
        out.contains("pub block Wide(\n    x: [B, S, H],\n"),
        "{out}"
    );
    assert!(out.contains("        |> g(second_parameter)\n"), "{out}");
    assert!(
        out.contains("    peak_f32 = 1TFLOPS, memory = 2GB        // same line\n"),
        "{out}"
    );
    assert!(out.ends_with("}\n// tail\n"), "{out}");
    // Floats keep their spelling.
    assert!(out.contains("third: float = 1e-5"), "{out}");
}

#[test]
fn allow_attributes_stay_before_what_they_annotate() {
    let text = "@allow(unused) import std.nn.{Linear}\n@allow(unused)\nblock B(x: [..., D]) -> [..., D] {\n    @allow(unused)   let y = x\n    for i in 0..2 {\n        // kept\n        @allow( unused ) let z = x\n    }\n    return x\n}\n\nmodel M {\n    dims N = 2\n    @allow(unused)\n    input x: f32[N]\n    output y = x @ x\n}\n";
    let out = check_formatting("allow", text);
    assert_eq!(
        out,
        "@allow(unused)\nimport std.nn.{Linear}\n\n@allow(unused)\nblock B(x: [..., D]) -> [..., D] {\n    @allow(unused)\n    let y = x\n    for i in 0..2 {\n        // kept\n        @allow(unused)\n        let z = x\n    }\n    return x\n}\n\nmodel M {\n    dims N = 2\n    @allow(unused)\n    input x: f32[N]\n    output y = x @ x\n}\n"
    );
    let (tree, _) = parse(FileId(0), &out);
    let targets: Vec<&str> = tree
        .allows
        .iter()
        .map(|a| {
            out[a.target.start..a.target.end]
                .lines()
                .next()
                .unwrap_or("")
        })
        .collect();
    assert_eq!(
        targets,
        [
            "import std.nn.{Linear}",
            "block B(x: [..., D]) -> [..., D] {",
            "let y = x",
            "let z = x",
            "input x: f32[N]"
        ]
    );
}

#[test]
fn examples_and_stdlib_are_formatted() {
    let mut args = vec!["fmt".to_string(), "--check".to_string()];
    for dir in ["examples", "stdlib"] {
        args.extend(msl_files(dir).iter().map(|p| p.display().to_string()));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = mslc(&args);
    assert!(
        out.status.success(),
        "run `mslc fmt examples/*.msl stdlib/*.msl`:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn check_prints_a_diff_and_fmt_rewrites_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.msl");
    let p = path.to_str().unwrap();
    let messy = "model M {\n  input x: f32[4]   // the input\n  output y=x+x\n}\n";
    std::fs::write(&path, messy).unwrap();

    let out = mslc(&["fmt", "--check", p]);
    assert_eq!(out.status.code(), Some(1));
    let diff = String::from_utf8_lossy(&out.stdout);
    assert!(
        diff.starts_with(&format!("--- {p}\n+++ {p}\n@@ ")),
        "{diff}"
    );
    assert!(
        diff.contains(
            "-  output y=x+x\n+    input x: f32[4] // the input\n+    output y = x + x\n"
        ),
        "{diff}"
    );
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        messy,
        "--check wrote"
    );

    let out = mslc(&["fmt", p]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let formatted = std::fs::read_to_string(&path).unwrap();
    assert_eq!(
        formatted,
        "model M {\n    input x: f32[4] // the input\n    output y = x + x\n}\n"
    );
    assert_eq!(mslc(&["fmt", "--check", p]).status.code(), Some(0));
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
    assert_eq!(names.len(), 1, "a temporary file was left behind");
}

#[test]
fn syntax_errors_and_non_files_are_reported_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken.msl");
    let text = "model M {\n  input x: f32[4\n}\n";
    std::fs::write(&broken, text).unwrap();
    let folder = dir.path().join("folder.msl");
    std::fs::create_dir(&folder).unwrap();
    let missing = dir.path().join("missing.msl");
    for (path, code) in [(&broken, "E0009"), (&folder, "E0700"), (&missing, "E0100")] {
        let out = mslc(&["--message-format", "json", "fmt", path.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(1), "{}", path.display());
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains(&format!("\"code\":\"{code}\"")),
            "{}: {stdout}",
            path.display()
        );
    }
    assert_eq!(std::fs::read_to_string(&broken).unwrap(), text);
    assert!(folder.is_dir());
    assert!(!missing.exists());
}

#[test]
fn dep_info_lists_every_file_read_from_disk() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("my models");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(
        src.join("lib.msl"),
        "pub block Twice(x: [B, H]) -> [B, H] {\n    return x + x\n}\n",
    )
    .unwrap();
    std::fs::write(
        src.join("net.msl"),
        "import .lib.Twice\nimport std.nn.Linear\n\nmodel Net {\n    input x: f32[2, 4]\n    output y = Twice(x)\n}\n",
    )
    .unwrap();
    let out_dir = dir.path().join("out");
    let net = src.join("net.msl");
    let out = mslc(&[
        "build",
        net.to_str().unwrap(),
        "-o",
        out_dir.to_str().unwrap(),
        "--emit",
        "dep-info",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let escaped = |p: &Path| p.display().to_string().replace(' ', "\\ ");
    let src = src.canonicalize().unwrap();
    let (net, lib) = (escaped(&src.join("net.msl")), escaped(&src.join("lib.msl")));
    let d = std::fs::read_to_string(out_dir.join("Net.d")).unwrap();
    assert_eq!(
        d,
        format!(
            "{}: {net} {lib}\n\n{net}:\n\n{lib}:\n",
            escaped(&out_dir.join("Net.mir"))
        )
    );
}

#[test]
fn completions_man_page_and_version() {
    let bash = mslc(&["completions", "bash"]);
    assert!(bash.status.success());
    let bash = String::from_utf8_lossy(&bash.stdout);
    for command in [
        "check",
        "build",
        "run",
        "export",
        "fmt",
        "completions",
        "man",
    ] {
        assert!(bash.contains(command), "bash completions lack `{command}`");
    }
    for shell in ["zsh", "fish", "powershell", "elvish"] {
        let out = mslc(&["completions", shell]);
        assert!(out.status.success() && !out.stdout.is_empty(), "{shell}");
    }
    let man = mslc(&["man"]);
    assert!(man.status.success());
    let man = String::from_utf8_lossy(&man.stdout);
    // clap_mangen defines the quote string (`.ie`/`.el`) before the title header.
    let first = man
        .lines()
        .find(|l| !l.starts_with(".ie") && !l.starts_with(".el"));
    assert!(first.is_some_and(|l| l.starts_with(".TH mslc 1")), "{man}");
    assert!(man.contains("fmt"), "{man}");

    let version = mslc(&["--version"]);
    let version = String::from_utf8_lossy(&version.stdout);
    let rest = version
        .trim_end()
        .strip_prefix(&format!("mslc {} (", env!("CARGO_PKG_VERSION")))
        .and_then(|r| r.strip_suffix(')'))
        .unwrap_or_else(|| panic!("unexpected --version: {version}"));
    assert!(
        rest == "unknown" || (rest.len() >= 4 && rest.chars().all(|c| c.is_ascii_hexdigit())),
        "{version}"
    );
}
