//! The layering of ARCHITECTURE.md. The crate graph, held by Cargo's own
//! account of it (`cargo metadata`, every feature on): what each layer may
//! not reach, in normal, build and dev dependencies alike, directly or
//! through another crate; a crate that starts to import what its layer
//! must not fails here by name, with the path that brought it in. And
//! within crates: the IR names no standard-library module, the kernel
//! library's files import none in a loop.

use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::process::Command;

/// The code generators and the parser, which nothing that runs a built
/// artifact may link.
const COMPILER: &[&str] = &[
    "linnet-frontend",
    "linnet-build",
    "linnet-cranelift",
    "logos",
    "chumsky",
    "ariadne",
    "cranelift-codegen",
    "cranelift-frontend",
    "cranelift-jit",
    "cranelift-module",
    "cranelift-object",
];

/// The backends, which the artifact format must not know.
const BACKENDS: &[&str] =
    &["linnet-exec", "linnet-kernels", "linnet-cpu", "linnet-cranelift", "linnet-gpu", "melior", "cudarc"];

/// Each crate, and the packages it must never depend on.
const FORBIDDEN: &[(&str, &[&[&str]])] = &[
    (
        "linnet-ir",
        &[
            &["linnet-frontend", "linnet-exec", "linnet-cpu", "linnet-gpu", "linnet-artifact"],
            &["logos", "chumsky", "ariadne", "toml", "cranelift-codegen", "melior", "cudarc", "axum", "tokenizers"],
        ],
    ),
    ("linnet-artifact", &[BACKENDS, COMPILER, &["axum"]]),
    ("linnet-frontend", &[&["linnet-exec", "linnet-cpu", "linnet-gpu", "cranelift-codegen", "melior", "cudarc"]]),
    ("linnet-exec", &[COMPILER, &["linnet-cpu", "linnet-gpu"]]),
    // The kernel library: no code generator, no other backend.
    ("linnet-kernels", &[COMPILER, &["linnet-cpu", "linnet-gpu", "melior", "cudarc", "axum"]]),
    // The CPU backend at run time: it loads code, it does not generate it.
    ("linnet-cpu", &[COMPILER, &["linnet-gpu", "melior", "cudarc"]]),
    ("linnet-cranelift", &[&["linnet-frontend", "linnet-gpu", "melior", "cudarc", "chumsky", "logos", "ariadne"]]),
    (
        "linnet-gpu",
        &[&[
            "linnet-cpu",
            "linnet-kernels",
            "cranelift-codegen",
            "cranelift-frontend",
            "cranelift-jit",
            "cranelift-module",
            "cranelift-object",
        ]],
    ),
    ("linnet-lsp", &[&["linnet-exec", "linnet-cpu", "linnet-gpu"]]),
    // The runtime loads and runs artifacts without the compiler, and serves
    // nothing: the HTTP server is a crate above it.
    ("linnet-runtime", &[COMPILER, &["linnet-server", "axum", "tokio"]]),
    ("linnet-server", &[COMPILER]),
    // The compiler builds artifacts; it runs and serves nothing.
    ("linnet-build", &[&["linnet-runtime", "linnet-server", "tokenizers", "llguidance", "axum", "tokio"]]),
    ("linnetc", &[&["linnet-runtime", "linnet-server", "tokenizers", "llguidance", "axum", "tokio"]]),
];

/// The one library that serves HTTP.
const SERVER: &str = "linnet-server";

struct Graph {
    names: HashMap<String, String>,
    edges: HashMap<String, Vec<String>>,
    /// The workspace's packages that have a library target.
    libraries: Vec<String>,
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
    let libraries = metadata["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .filter(|package| package["source"].is_null())
        .filter(|package| {
            let targets = package["targets"].as_array().expect("targets");
            targets.iter().any(|target| target["kind"].as_array().unwrap().iter().any(|kind| kind == "lib"))
        })
        .map(|package| package["name"].as_str().unwrap().to_string())
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
    Graph { names, edges, libraries }
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
        for package in forbidden.iter().flat_map(|group| group.iter()) {
            if let Some(path) = reached.get(*package) {
                breaches.push(format!("{krate} depends on {package}: {}", path.join(" → ")));
            }
        }
    }
    assert!(breaches.is_empty(), "the layering is broken:\n{}", breaches.join("\n"));
}

/// The HTTP server is a crate of its own that no library depends on: only
/// the `linnet` CLI (a binary) and tests link it, and it is the only
/// library of the workspace that reaches axum.
#[test]
fn no_library_depends_on_the_server() {
    let graph = graph();
    assert!(graph.libraries.iter().any(|library| library == "linnet-runtime"), "{:?}", graph.libraries);
    for library in &graph.libraries {
        let reached = graph.reached(library);
        assert!(
            library == SERVER || !reached.contains_key(SERVER),
            "{library} depends on {SERVER}: {:?}",
            reached[SERVER]
        );
        assert!(library == SERVER || !reached.contains_key("axum"), "{library} reaches axum: {:?}", reached["axum"]);
    }
}

/// The checks above can fail: the CLI does reach the parser, the code
/// generator and the server, and the graph says so.
#[test]
fn the_graph_sees_what_the_cli_reaches() {
    let reached = graph().reached("linnet");
    for package in ["linnet-frontend", "chumsky", "linnet-cranelift", "cranelift-codegen", "linnet-server", "axum"] {
        assert!(reached.contains_key(package), "linnet should reach {package}");
    }
}

/// Every Rust file under `dir`, with its text.
fn rust_files(dir: &std::path::Path) -> Vec<(std::path::PathBuf, String)> {
    let mut files = Vec::new();
    let mut folders = vec![dir.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|extension| extension == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                files.push((path, text));
            }
        }
    }
    files
}

/// The IR is a leaf below the language: it names no module of the
/// standard library (which of its functions run as kernels is the
/// frontend's `lower/library.rs`).
#[test]
fn the_ir_names_no_module_of_the_standard_library() {
    let source = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../compiler/ir/src"));
    let files = rust_files(source);
    for (path, text) in &files {
        assert!(!text.contains("\"std.nn"), "{} names a module of the standard library", path.display());
    }
    let read = files.len();
    assert!(read > 10, "read only {read} files of the IR crate");
}

/// The sibling modules each file of `dir` names (`super::x`, `crate::x`,
/// `use super::{x, y}`), by file stem.
fn module_imports(dir: &std::path::Path) -> HashMap<String, HashSet<String>> {
    let files: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "rs"))
        .collect();
    let stems: HashSet<String> = files.iter().map(|path| path.file_stem().unwrap().to_string_lossy().into()).collect();
    let mut imports = HashMap::new();
    for path in &files {
        let stem: String = path.file_stem().unwrap().to_string_lossy().into();
        let text = std::fs::read_to_string(path).unwrap();
        let mut named = HashSet::new();
        for prefix in ["super::", "crate::"] {
            for (at, _) in text.match_indices(prefix) {
                let rest = &text[at + prefix.len()..];
                let names: Vec<&str> = match rest.strip_prefix('{') {
                    Some(group) => group[..group.find('}').unwrap_or(0)].split(',').collect(),
                    None => vec![rest],
                };
                for name in names {
                    let name: String = name.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                    if stems.contains(&name) && name != stem && name != "lib" {
                        named.insert(name);
                    }
                }
            }
        }
        imports.insert(stem, named);
    }
    imports
}

/// A cycle among `imports`, as the files along it, if there is one.
fn import_cycle(imports: &HashMap<String, HashSet<String>>) -> Option<Vec<String>> {
    fn visit(
        at: &str,
        imports: &HashMap<String, HashSet<String>>,
        path: &mut Vec<String>,
        done: &mut HashSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|file| file == at) {
            let mut cycle = path[start..].to_vec();
            cycle.push(at.to_string());
            return Some(cycle);
        }
        if done.contains(at) {
            return None;
        }
        path.push(at.to_string());
        let mut next: Vec<&String> = imports[at].iter().collect();
        next.sort();
        for file in next {
            if let Some(cycle) = visit(file, imports, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(at.to_string());
        None
    }
    let mut done = HashSet::new();
    let mut files: Vec<&String> = imports.keys().collect();
    files.sort();
    files.into_iter().find_map(|file| visit(file, imports, &mut Vec::new(), &mut done))
}

/// No two files of the CPU kernel library import each other, directly or
/// around a loop: a newcomer reads them from the leaves (`isa`, `matrix`,
/// `simd`) up to `matmul`.
#[test]
fn the_cpu_kernels_import_no_file_in_a_loop() {
    let dir = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../compiler/kernels/src"));
    let imports = module_imports(dir);
    assert!(imports["matmul"].contains("choice") && imports.len() > 10, "{imports:?}");
    assert_eq!(import_cycle(&imports), None);
    // The check can fail: a loop added to a copy of the graph is found.
    let mut looped = imports.clone();
    looped.get_mut("isa").unwrap().insert("matmul".into());
    assert!(import_cycle(&looped).is_some());
}

/// The `unsafe fn`s of `dir`'s files that state no contract: a free
/// function needs its own `# Safety`; a trait's methods are covered by the
/// trait's, and so are its implementations'. As `file:line`.
fn uncontracted_unsafe_fns(dir: &std::path::Path) -> Vec<String> {
    let indent = |line: &str| line.len() - line.trim_start().len();
    let mut missing = Vec::new();
    for (path, text) in rust_files(dir) {
        let lines: Vec<&str> = text.lines().collect();
        for (at, line) in lines.iter().enumerate() {
            if !line.contains("unsafe fn ") || line.trim_start().starts_with("//") {
                continue;
            }
            let above = lines[..at].iter().rev().take_while(|l| {
                let l = l.trim_start();
                l.starts_with("///") || l.starts_with("#[")
            });
            if above.clone().any(|l| l.contains("# Safety")) {
                continue;
            }
            let owner = lines[..at].iter().rev().find(|l| {
                let t = l.trim_start();
                !t.is_empty() && !t.starts_with("//") && !t.starts_with('#') && indent(l) < indent(line)
            });
            let in_trait = owner.is_some_and(|owner| {
                let owner = owner.trim_start().trim_start_matches("pub(crate) ").trim_start_matches("pub ");
                let owner = owner.trim_start_matches("unsafe ");
                owner.starts_with("trait ") || (owner.starts_with("impl") && owner.contains(" for "))
            });
            if !in_trait {
                missing.push(format!("{}:{}", path.display(), at + 1));
            }
        }
    }
    missing
}

/// Every `unsafe fn` of the CPU crates states its contract (`# Safety`),
/// and every `unsafe` block of the kernel library says why it holds.
#[test]
fn every_unsafe_fn_of_the_cpu_crates_states_its_contract() {
    let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../compiler"));
    for krate in ["kernels", "cpu", "cranelift"] {
        let missing = uncontracted_unsafe_fns(&root.join(krate).join("src"));
        assert!(missing.is_empty(), "unsafe fns without `# Safety`:\n{}", missing.join("\n"));
    }
    let mut unexplained = Vec::new();
    for (path, text) in rust_files(&root.join("kernels/src")) {
        let lines: Vec<&str> = text.lines().collect();
        for (at, line) in lines.iter().enumerate() {
            let opens = line.contains("unsafe {") && !line.trim_start().starts_with("//");
            if opens && !lines[at.saturating_sub(6)..=at].iter().any(|l| l.contains("SAFETY")) {
                unexplained.push(format!("{}:{}", path.display(), at + 1));
            }
        }
    }
    assert!(unexplained.is_empty(), "unsafe blocks without `SAFETY:`:\n{}", unexplained.join("\n"));
    // The check can fail: a free function without a contract is found.
    let scratch = std::env::temp_dir().join(format!("linnet-safety-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    std::fs::write(scratch.join("bare.rs"), "/// Reads.\nunsafe fn read(at: *const u8) -> u8 {\n    *at\n}\n").unwrap();
    assert_eq!(uncontracted_unsafe_fns(&scratch).len(), 1);
    std::fs::remove_dir_all(&scratch).unwrap();
}

/// Whether `line` names a `Result<_, String>`: a `Result` of two type
/// arguments whose second, at its own depth, is `String`.
fn results_a_string(line: &str) -> bool {
    line.match_indices("Result<").any(|(at, found)| {
        let (mut depth, mut last, mut arguments) = (1, String::new(), 1);
        for c in line[at + found.len()..].chars() {
            match c {
                '<' | '(' | '[' => depth += 1,
                '>' | ')' | ']' if depth == 1 => return arguments == 2 && last.trim() == "String",
                '>' | ')' | ']' => depth -= 1,
                ',' if depth == 1 => {
                    last.clear();
                    arguments += 1;
                    continue;
                }
                _ => {}
            }
            if depth == 1 {
                last.push(c);
            }
        }
        false
    })
}

/// No library signature returns its error as a bare `String`: each library
/// has error types that say what failed (strings only at the CLIs' edge,
/// `linnetc` and `linnet`, which are binaries).
#[test]
fn no_library_returns_a_string_as_its_error() {
    let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    let libraries = [
        "compiler/ir/src",
        "compiler/frontend/src",
        "compiler/exec/src",
        "compiler/artifact/src",
        "compiler/kernels/src",
        "compiler/cpu/src",
        "compiler/cranelift/src",
        "compiler/gpu/src",
        "compiler/build/src",
        "compiler/lsp/src",
        "runtime/engine/src",
        "runtime/server/src",
    ];
    let mut found = Vec::new();
    for library in libraries {
        for (path, text) in rust_files(&root.join(library)) {
            for (at, line) in text.lines().enumerate() {
                if results_a_string(line) {
                    found.push(format!("{}:{}: {}", path.display(), at + 1, line.trim()));
                }
            }
        }
    }
    assert!(found.is_empty(), "errors as strings in library signatures:\n{}", found.join("\n"));
    // The check can fail, and tells a map of strings from an error.
    assert!(results_a_string("fn f() -> Result<Vec<u8>, String> {"));
    assert!(!results_a_string("fn f(m: &HashMap<String, String>) -> Result<(), Error> {"));
    assert!(!results_a_string("fn read(&self) -> std::io::Result<String> {"));
}
