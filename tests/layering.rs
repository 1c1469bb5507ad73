//! The crate graph of ARCHITECTURE.md, held by Cargo's own account of it
//! (`cargo metadata`, every feature on): what each layer may not reach, in
//! normal, build and dev dependencies alike, directly or through another
//! crate. A crate that starts to import what its layer must not fails here
//! by name, with the path that brought it in.

use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::process::Command;

/// Each crate, and the packages it must never depend on.
const FORBIDDEN: &[(&str, &[&str])] = &[
    (
        "linnet-ir",
        &[
            "linnet-frontend",
            "linnet-exec",
            "linnet-cpu",
            "linnet-gpu",
            "logos",
            "chumsky",
            "ariadne",
            "toml",
            "cranelift-codegen",
            "melior",
            "cudarc",
            "axum",
            "tokenizers",
        ],
    ),
    ("linnet-frontend", &["linnet-exec", "linnet-cpu", "linnet-gpu", "cranelift-codegen", "melior", "cudarc"]),
    (
        "linnet-exec",
        &["linnet-frontend", "linnet-cpu", "linnet-gpu", "logos", "chumsky", "ariadne", "cranelift-codegen"],
    ),
    ("linnet-cpu", &["linnet-frontend", "linnet-gpu", "melior", "cudarc", "chumsky", "logos", "ariadne"]),
    (
        "linnet-gpu",
        &[
            "linnet-cpu",
            "cranelift-codegen",
            "cranelift-frontend",
            "cranelift-jit",
            "cranelift-module",
            "cranelift-object",
        ],
    ),
    ("linnet-lsp", &["linnet-exec", "linnet-cpu", "linnet-gpu"]),
];

struct Graph {
    names: HashMap<String, String>,
    edges: HashMap<String, Vec<String>>,
}

fn graph() -> Graph {
    let output = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--all-features", "--locked"])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .expect("cargo runs");
    assert!(output.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&output.stderr));
    let metadata: Value = serde_json::from_slice(&output.stdout).expect("cargo metadata prints JSON");
    let names = metadata["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|package| (package["id"].as_str().unwrap().to_string(), package["name"].as_str().unwrap().to_string()))
        .collect();
    let edges = metadata["resolve"]["nodes"]
        .as_array()
        .expect("a resolved graph")
        .iter()
        .map(|node| {
            let deps = node["deps"].as_array().unwrap().iter().map(|dep| dep["pkg"].as_str().unwrap().to_string());
            (node["id"].as_str().unwrap().to_string(), deps.collect())
        })
        .collect();
    Graph { names, edges }
}

impl Graph {
    /// Every package `root` reaches, each with the path that reaches it.
    fn reached(&self, root: &str) -> HashMap<String, Vec<String>> {
        let id = self.names.iter().find(|(_, name)| *name == root).map(|(id, _)| id.clone()).expect("a member");
        let mut paths = HashMap::new();
        let mut seen = HashSet::from([id.clone()]);
        let mut queue = vec![(id, vec![root.to_string()])];
        while let Some((at, path)) = queue.pop() {
            for next in &self.edges[&at] {
                if seen.insert(next.clone()) {
                    let mut path = path.clone();
                    path.push(self.names[next].clone());
                    paths.entry(self.names[next].clone()).or_insert_with(|| path.clone());
                    queue.push((next.clone(), path));
                }
            }
        }
        paths
    }
}

#[test]
fn no_crate_reaches_what_its_layer_must_not() {
    let graph = graph();
    let mut breaches = Vec::new();
    for (krate, forbidden) in FORBIDDEN {
        let reached = graph.reached(krate);
        for package in *forbidden {
            if let Some(path) = reached.get(*package) {
                breaches.push(format!("{krate} depends on {package}: {}", path.join(" → ")));
            }
        }
    }
    assert!(breaches.is_empty(), "the layering is broken:\n{}", breaches.join("\n"));
}

/// The check above can fail: the runtime does reach the parser and the
/// code generators, and the graph says so.
#[test]
fn the_graph_sees_what_the_runtime_reaches() {
    let reached = graph().reached("linnet-runtime");
    for package in ["linnet-frontend", "chumsky", "linnet-cpu", "cranelift-codegen", "linnet-ir"] {
        assert!(reached.contains_key(package), "linnet-runtime should reach {package}");
    }
}

/// The IR is a leaf below the language: it names no module of the
/// standard library (which of its functions run as kernels is the
/// frontend's `lower/library.rs`).
#[test]
fn the_ir_names_no_module_of_the_standard_library() {
    let source = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../compiler/ir/src"));
    let mut folders = vec![source.to_path_buf()];
    let mut read = 0;
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|extension| extension == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                assert!(!text.contains("\"std.nn"), "{} names a module of the standard library", path.display());
                read += 1;
            }
        }
    }
    assert!(read > 10, "read only {read} files of the IR crate");
}
