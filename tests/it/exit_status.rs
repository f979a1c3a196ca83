//! Exit status: every registered code has the class the README's rule gives it, and each class
//! reaches the process exit status, whichever command reports it.

use std::collections::BTreeSet;

use mslc_core::diag::{Code, ExitClass};

use super::support::{codes, mslc};

/// The usage codes the README lists ("usage codes E0401, …").
fn readme_usage_codes() -> BTreeSet<String> {
    let readme = std::fs::read_to_string("README.md").unwrap();
    let readme = readme.split_whitespace().collect::<Vec<_>>().join(" ");
    let list = readme
        .split_once("usage codes ")
        .expect("the README lists the usage codes")
        .1;
    let list = &list[..list.find('.').unwrap()];
    list.split(", ").map(str::to_string).collect()
}

#[test]
fn every_code_has_the_class_the_readme_gives_it() {
    let usage = readme_usage_codes();
    for &code in Code::ALL {
        let name = code.as_str();
        let expected = if name.starts_with('W') {
            ExitClass::Warning
        } else if code == Code::E0608 {
            ExitClass::Internal
        } else if usage.contains(name) {
            ExitClass::Usage
        } else {
            ExitClass::Input
        };
        assert_eq!(code.exit_class(), expected, "{name}");
        let status = [0, 1, 2, 3][expected as usize];
        assert_eq!(code.exit_class().status(), status, "{name}");
    }
    for name in &usage {
        assert!(
            name.parse::<Code>().is_ok(),
            "the README lists {name}, no such code"
        );
    }
}

#[test]
fn each_class_reaches_the_exit_status() {
    let dir = tempfile::tempdir().unwrap();
    let o = dir.path().join("out");
    let o = o.to_str().unwrap();
    let bad = dir.path().join("bad.msl");
    std::fs::write(&bad, "model M { input x: f32[4] output y = nope }\n").unwrap();
    let dims = dir.path().join("dims.msl");
    std::fs::write(
        &dims,
        "model M { dims S = 4\n input x: f32[S] output y = x }\n",
    )
    .unwrap();
    let file = dir.path().join("a_file");
    std::fs::write(&file, "x").unwrap();
    let under_file = file.join("x");
    let under_file = under_file.to_str().unwrap();
    let mlp = "examples/mlp.msl";
    let cases: Vec<(Vec<&str>, &str, i32)> = vec![
        (vec!["build", mlp, "-o", o, "--target", "tpu"], "E0610", 2),
        (vec!["build", mlp, "-o", o, "--entry", "Foo"], "E0611", 2),
        (
            vec!["run", mlp, "--entry", "Foo", "--init-seed", "1"],
            "E0611",
            2,
        ),
        (vec!["build", mlp, "-o", o, "--set", "nope=3"], "E0401", 2),
        (
            vec!["check", dims.to_str().unwrap(), "--dim", "S=abc"],
            "E0402",
            2,
        ),
        (
            vec!["run", mlp, "--init-seed", "1", "--threads", "999"],
            "E0605",
            2,
        ),
        (vec!["run", mlp, "--no-such-flag"], "E0609", 2),
        (vec!["check", bad.to_str().unwrap()], "E0200", 1),
        (vec!["explain", "E9999"], "E0609", 2),
        // An unwritable output directory is E0600 in every command.
        (vec!["build", mlp, "-o", under_file], "E0600", 1),
        (
            vec!["run", mlp, "--init-seed", "1", "--output-dir", under_file],
            "E0600",
            1,
        ),
    ];
    for (args, code, status) in cases {
        let mut all = vec!["--message-format", "json"];
        all.extend_from_slice(&args);
        let out = mslc(&all);
        assert_eq!(out.status.code(), Some(status), "{args:?}");
        assert_eq!(codes(&out), [code], "{args:?}");
    }
}
