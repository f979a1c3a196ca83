//! The workspace's layering, read from `cargo metadata`: each crate depends only on crates
//! below it (ARCHITECTURE.md), and the runtime crates (the executor and the kernels) pull in
//! no compiler dependency — no parser, diagnostic renderer, argument parser or graph library.

use std::collections::{BTreeSet, HashMap};

use cargo_metadata::{DependencyKind, MetadataCommand, PackageId};

/// The library crates from the bottom up; each may use only crates before it.
const LAYERS: &[&str] = &[
    "mslc-core",
    "mslc-kernels",
    "mslc-io",
    "mslc-syntax",
    "mslc-check",
    "mslc-ir",
    "mslc-artifact",
    "mslc-plan",
    "mslc-exec",
    "mslc-tune",
    "mslc-driver",
    "mslc-build",
    "mslc-lsp",
    "mslc-export",
];

/// Compiler-only dependencies a runtime crate must not reach.
const COMPILER_ONLY: &[&str] = &["pest", "pest_derive", "miette", "clap", "petgraph"];

struct Graph {
    names: HashMap<PackageId, String>,
    /// Normal (not dev, not build) dependencies of each package.
    deps: HashMap<PackageId, Vec<PackageId>>,
}

impl Graph {
    fn load() -> Graph {
        let metadata = MetadataCommand::new().exec().expect("cargo metadata runs");
        let resolve = metadata.resolve.expect("cargo metadata resolves the graph");
        let names = metadata
            .packages
            .iter()
            .map(|p| (p.id.clone(), p.name.to_string()))
            .collect();
        let deps = resolve
            .nodes
            .iter()
            .map(|n| {
                let normal = n
                    .deps
                    .iter()
                    .filter(|d| d.dep_kinds.iter().any(|k| k.kind == DependencyKind::Normal))
                    .map(|d| d.pkg.clone())
                    .collect();
                (n.id.clone(), normal)
            })
            .collect();
        Graph { names, deps }
    }

    fn id(&self, name: &str) -> &PackageId {
        self.names
            .iter()
            .find(|(_, n)| n.as_str() == name)
            .map(|(id, _)| id)
            .unwrap_or_else(|| panic!("no package `{name}` in the workspace"))
    }

    /// Names of every package `name` depends on, directly or not.
    fn closure(&self, name: &str) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![self.id(name).clone()];
        while let Some(id) = stack.pop() {
            for dep in self.deps.get(&id).into_iter().flatten() {
                if seen.insert(self.names[dep].clone()) {
                    stack.push(dep.clone());
                }
            }
        }
        seen
    }
}

#[test]
fn runtime_crates_pull_in_no_compiler_dependency() {
    let graph = Graph::load();
    for runtime in ["mslc-exec", "mslc-kernels"] {
        let closure = graph.closure(runtime);
        let bad: Vec<&&str> = COMPILER_ONLY
            .iter()
            .filter(|c| closure.contains(**c))
            .collect();
        assert!(bad.is_empty(), "{runtime} depends on {bad:?}");
    }
}

#[test]
fn crates_depend_only_on_the_layers_below() {
    let graph = Graph::load();
    for (level, name) in LAYERS.iter().enumerate() {
        for dep in graph.closure(name) {
            if let Some(dep_level) = LAYERS.iter().position(|l| *l == dep) {
                assert!(
                    dep_level < level,
                    "{name} depends on {dep}, which is not below it"
                );
            }
        }
    }
}
