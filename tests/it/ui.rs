//! UI tests: every `tests/ui/*.msl` is checked (and its trains planned, as `mslc check` does), and its source plus the rendered diagnostics
//! (no colour, fixed width) are snapshotted, one snapshot per file (`insta::glob!`, so one
//! mismatch does not hide the rest). Each case must produce at least one diagnostic, every
//! code must be registered with a page, and nothing may panic.

use std::path::Path;

use mslc_check::{check_path, CheckOptions};
use mslc_driver::render::{render_human, render_json, RenderOptions};

fn render_case(path: &Path) -> String {
    let checked = check_path(path, &CheckOptions::default());
    let source = std::fs::read_to_string(path).unwrap_or_default();
    let mut out = format!("--- source\n{source}\n--- diagnostics\n");
    // What `mslc check` adds after checking: each train's per-device plan.
    let mut diagnostics = checked.diagnostics.clone();
    if !checked.has_errors() {
        for train in &checked.decls.trains {
            match mslc_driver::parallel::plan_train(&checked, train) {
                Ok(Some(plan)) => {
                    diagnostics.extend(mslc_driver::parallel::plan_warnings(&checked, train, &plan))
                }
                Ok(None) => {}
                Err(d) => diagnostics.push(*d),
            }
        }
    }
    assert!(
        !diagnostics.is_empty(),
        "{} produced no diagnostic",
        path.display()
    );
    for d in &diagnostics {
        assert!(!d.code.page().is_empty());
        let human = render_human(
            d,
            &checked.sources,
            RenderOptions {
                color: false,
                width: 100,
            },
        );
        out.push_str(&human);
        let json: serde_json::Value =
            serde_json::from_str(&render_json(d, &checked.sources)).unwrap();
        assert_eq!(json["code"], d.code.as_str());
        assert!(json["line_start"].as_u64().unwrap() >= 1);
        // Some header's `[file:line:column]` (the one over the primary label) is the JSON's
        // position, both in characters.
        let position = format!(":{}:{}]\n", json["line_start"], json["column_start"]);
        assert!(
            human.contains(&position),
            "no header at {position} in\n{human}"
        );
    }
    out
}

#[test]
fn ui_cases() {
    let cases = std::fs::read_dir("tests/ui").map_or(0, |d| {
        d.flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "msl"))
            .count()
    });
    assert!(cases >= 30, "expected at least 30 UI cases, found {cases}");
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path("../ui/snapshots");
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| {
        insta::glob!("../ui", "*.msl", |path| {
            // Relative to the package, so snapshots name files as a user would.
            let cwd = std::env::current_dir().unwrap_or_default();
            insta::assert_snapshot!(render_case(path.strip_prefix(&cwd).unwrap_or(path)));
        });
    });
}
