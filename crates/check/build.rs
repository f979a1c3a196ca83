//! Embeds every `stdlib/**/*.msl` file in the binary, so `import std.…` works without files.

use std::fmt::Write;
use std::path::Path;

fn collect(dir: &Path, prefix: &str, out: &mut Vec<(String, String)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for path in entries {
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_string();
        if path.is_dir() {
            collect(&path, &format!("{prefix}{stem}/"), out);
        } else if path.extension().is_some_and(|e| e == "msl") {
            out.push((
                format!("{prefix}{stem}"),
                path.canonicalize().unwrap().display().to_string(),
            ));
        }
    }
}

fn main() {
    // Read at run time, not with `env!`: a build-script binary reused from another checkout (a
    // copied target folder) must embed this checkout's stdlib, not the other one's.
    let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let root = Path::new(&manifest).join("../../stdlib");
    println!("cargo:rerun-if-changed={}", root.display());
    let mut files = Vec::new();
    collect(&root, "", &mut files);
    assert!(
        !files.is_empty(),
        "no .msl files under {}: the standard library would be empty",
        root.display()
    );
    let mut code = String::from("&[\n");
    for (name, path) in &files {
        println!("cargo:rerun-if-changed={path}");
        writeln!(code, "    ({name:?}, include_str!({path:?})),").unwrap();
    }
    code.push(']');
    let out = Path::new(&std::env::var("OUT_DIR").unwrap()).join("stdlib_files.rs");
    std::fs::write(out, code).unwrap();
}
