//! Replays the fuzz corpus (`fuzz/corpus/TARGET/`) and every crash the fuzzers found
//! (`fuzz/regressions/TARGET/`) through the same target bodies the libFuzzer targets run, on
//! stable: nothing here needs nightly or cargo-fuzz.

#[path = "../../fuzz/src/harness.rs"]
mod harness;

use std::path::Path;

fn replay(dir: &Path) -> usize {
    let mut count = 0;
    for (target, run) in harness::TARGETS {
        let Ok(entries) = std::fs::read_dir(dir.join(target)) else {
            continue;
        };
        let mut files: Vec<_> = entries.flatten().map(|e| e.path()).collect();
        files.sort();
        for file in files {
            let data = std::fs::read(&file).unwrap();
            eprintln!("{target}: {}", file.display());
            run(&data);
            count += 1;
        }
    }
    count
}

#[test]
fn corpus_replays() {
    let n = replay(Path::new("fuzz/corpus"));
    assert!(n >= harness::TARGETS.len(), "only {n} corpus entries");
}

#[test]
fn the_exec_target_has_a_module() {
    let module = harness::exec_base().expect("the exec target's model compiles");
    assert!(module.steps.iter().any(|s| !s.kernel.params.is_empty()));
}

#[test]
fn regressions_replay() {
    replay(Path::new("fuzz/regressions"));
}
