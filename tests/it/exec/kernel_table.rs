//! `NAME.kernels.toml` is read back: an edited tile size changes what `mslc run` and a rebuild
//! run with, an illegal value or a malformed table is a coded error, and a table for another
//! target is not applied.

use super::common::{mslc, s, TestDir};

/// Replaces the first occurrence of `from` after the line `after` in `text`.
fn edit_after(text: &str, after: &str, from: &str, to: &str) -> String {
    let start = text.find(after).expect("the anchor is in the table");
    let at = start + text[start..].find(from).expect("the value is in the table");
    format!("{}{to}{}", &text[..at], &text[at + from.len()..])
}

#[test]
fn an_edited_kernel_table_changes_what_runs() {
    let dir = TestDir::new("kernel-table");
    let out = s(&dir.0).to_string();
    let (code, _, err) = mslc(&["build", "examples/tiny_llama.msl", "-o", &out]);
    assert_eq!(code, 0, "{err}");
    let mir = dir.path("TinyLlama.mir");
    let table_path = dir.path("TinyLlama.kernels.toml");
    let table = std::fs::read_to_string(&table_path).unwrap();
    let first_mir = std::fs::read(&mir).unwrap();

    // Rebuilding over an unedited table changes nothing.
    let (code, report, err) = mslc(&["build", "examples/tiny_llama.msl", "-o", &out]);
    assert_eq!(code, 0, "{err}");
    assert!(report.contains("126 steps from the table"), "{report}");
    assert_eq!(std::fs::read(&mir).unwrap(), first_mir);

    let edited = edit_after(
        &table,
        "name = \"flash_attention\"",
        "block_q = 32",
        "block_q = 16",
    );
    let edited = edit_after(&edited, "name = \"gemm\"", "mc = 192", "mc = 48");
    std::fs::write(&table_path, &edited).unwrap();
    let profile = dir.path("profile.json");
    let (code, report, err) = mslc(&[
        "run",
        s(&mir),
        "--init-seed",
        "1",
        "--threads",
        "1",
        "--profile",
        s(&profile),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(report.contains("kernels: "), "{report}");
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&profile).unwrap()).unwrap();
    let params_of = |kernel: &str| -> Vec<serde_json::Value> {
        trace["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["args"]["kernel"] == kernel)
            .map(|e| e["args"]["params"].clone())
            .collect()
    };
    let attention = params_of("flash_attention");
    assert!(!attention.is_empty() && attention.iter().all(|p| p["block_q"] == 16));
    assert!(params_of("gemm").iter().any(|p| p["mc"] == 48));

    // A rebuild takes the edited choices into the module, and marks them tuned.
    let (code, _, err) = mslc(&["build", "examples/tiny_llama.msl", "-o", &out]);
    assert_eq!(code, 0, "{err}");
    let (code, text, err) = mslc(&["inspect", s(&mir)]);
    assert_eq!(code, 0, "{err}");
    assert!(
        text.contains("[flash_attention block_k=128 block_q=16"),
        "{text}"
    );
    assert!(text.contains(" mc=48 "), "{text}");
    let rewritten = std::fs::read_to_string(&table_path).unwrap();
    assert!(rewritten.contains("tuned = true"), "{rewritten}");

    // An illegal value and a malformed table are coded errors, for run and build alike.
    for (bad, want) in [
        (rewritten.replace("block_q = 16", "block_q = -16"), "E0621"),
        (
            rewritten.replace("block_q = 16", "block_q = \"big\""),
            "E0621",
        ),
        (rewritten.replace("block_q = 16", "q_tile = 16"), "E0621"),
        (
            rewritten.replace("name = \"gemm\"", "name = \"rowwise\""),
            "E0621",
        ),
        (
            rewritten.replace("[kernel.params]", "[kernel.parms]"),
            "E0620",
        ),
        (rewritten.replace("[[kernel]]", "[[kernel"), "E0620"),
    ] {
        std::fs::write(&table_path, &bad).unwrap();
        let (code, _, err) = mslc(&["run", s(&mir), "--init-seed", "1"]);
        assert!(!err.contains("panicked"), "{err}");
        assert_eq!(code, 1, "{err}");
        assert!(err.contains(want), "want {want}:\n{err}");
        let (code, _, err) = mslc(&["build", "examples/tiny_llama.msl", "-o", &out]);
        assert_eq!(code, 1, "{err}");
        assert!(err.contains(want), "want {want}:\n{err}");
    }

    // A table for another target is read but not applied.
    let other = dir.path("other.toml");
    let foreign = edit_after(&rewritten, "fingerprint = ", "\"", "\"other-");
    std::fs::write(&other, foreign).unwrap();
    std::fs::remove_file(&table_path).unwrap();
    let (code, report, err) = mslc(&["run", s(&mir), "--init-seed", "1", "--kernels", s(&other)]);
    assert_eq!(code, 0, "{err}");
    assert!(report.contains("not applied"), "{report}");
    let (code, _, err) = mslc(&["run", s(&mir), "--kernels", s(&dir.path("absent.toml"))]);
    assert_eq!(code, 1);
    assert!(err.contains("E0602"), "{err}");
}
