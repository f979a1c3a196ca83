//! Dep-info: a Makefile fragment naming every source file a build read, as `rustc --emit
//! dep-info` writes it, so `make` (or any tool that reads `.d` files) rebuilds when one changes.

use std::path::Path;

/// `OUTPUT: DEP…` followed by an empty rule for each dependency (so a deleted file does not
/// stop `make`), with spaces, `#` and `$` escaped as Make needs them.
pub fn dep_info(output: &Path, deps: &[impl AsRef<Path>]) -> String {
    let deps: Vec<String> = deps.iter().map(|d| escape(d.as_ref())).collect();
    let mut text = format!("{}:", escape(output));
    for dep in &deps {
        text.push(' ');
        text.push_str(dep);
    }
    text.push('\n');
    for dep in &deps {
        text.push('\n');
        text.push_str(dep);
        text.push_str(":\n");
    }
    text
}

fn escape(path: &Path) -> String {
    let mut out = String::new();
    for c in path.display().to_string().chars() {
        match c {
            ' ' => out.push_str("\\ "),
            '#' => out.push_str("\\#"),
            '$' => out.push_str("$$"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::dep_info;
    use std::path::Path;

    #[test]
    fn lists_deps_with_empty_rules_and_escapes_spaces() {
        let text = dep_info(
            Path::new("build/Net.mir"),
            &["/src/my models/net.msl", "/src/lib#1.msl"],
        );
        assert_eq!(
            text,
            "build/Net.mir: /src/my\\ models/net.msl /src/lib\\#1.msl\n\n\
             /src/my\\ models/net.msl:\n\n/src/lib\\#1.msl:\n"
        );
    }
}
