//! The packages one load can reach: the package itself and, through each
//! `linnet.toml`'s `[dependencies]`, the packages it uses, transitively.
//! Each is read once (a package two others depend on is one member), and a
//! dependency that is missing, misnamed or clashes with another package of
//! the same name is reported at its line in the manifest that declares it.

use super::manifest::{self, Dependency};
use super::LoadOptions;
use crate::code::Code;
use crate::diagnostic::Diagnostic;
use crate::source::SourceMap;
use std::collections::VecDeque;
use std::path::{Component, Path, PathBuf};

/// A package whose modules the load can reach.
#[derive(Clone, Debug)]
pub struct Member {
    /// `[package] name`: the first segment of its modules' names.
    pub name: String,
    /// The folder holding its `linnet.toml`.
    pub dir: PathBuf,
    /// Its root module's file; `name.x.y` is `x/y.linnet` beside it.
    pub root_file: PathBuf,
    /// The packages its modules may `use`, besides itself and `std`.
    pub dependencies: Vec<String>,
    /// Dependencies it declares that could not be linked (reported at
    /// their line): a `use` of one is not reported again.
    pub unlinked: Vec<String>,
}

impl Member {
    pub fn source_dir(&self) -> PathBuf {
        self.root_file.parent().map_or_else(|| self.dir.join("src"), Path::to_path_buf)
    }
}

/// `base` joined with `relative`, with `x/..` pairs taken out, so that a
/// file reached through a dependency has one name however it was reached.
pub fn join_normalized(base: &Path, relative: &Path) -> PathBuf {
    let mut joined = PathBuf::new();
    for component in base.join(relative).components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir if matches!(joined.components().next_back(), Some(Component::Normal(_))) => {
                joined.pop();
            }
            other => joined.push(other),
        }
    }
    if joined.as_os_str().is_empty() {
        joined.push(".");
    }
    joined
}

/// Reads the manifests of every package `root` depends on, transitively,
/// and returns the members, `root` first.
pub fn link(
    root: Member,
    dependencies: Vec<Dependency>,
    options: &LoadOptions,
    sources: &mut SourceMap,
    diagnostics: &mut Vec<Diagnostic>,
) -> Vec<Member> {
    let mut members = vec![root];
    let mut queue = VecDeque::from([(0, dependencies)]);
    while let Some((dependent, dependencies)) = queue.pop_front() {
        for dependency in dependencies {
            let dir = dependency.path.as_ref().map(|path| join_normalized(&members[dependent].dir, path));
            let found = dir.as_ref().and_then(|dir| read_dependency(&dependency, dir, options, sources, diagnostics));
            let (Some(dir), Some(found)) = (dir, found) else {
                members[dependent].unlinked.push(dependency.name);
                continue;
            };
            let at = match members.iter().position(|member| member.name == found.name) {
                Some(at) if same_dir(&members[at].dir, &dir) => at,
                Some(at) => {
                    diagnostics.push(
                        Diagnostic::error(
                            Code::PackageError,
                            dependency.path_span,
                            format!("two packages named `{}`", found.name),
                        )
                        .with_label(format!("this is `{}`", dir.display()))
                        .with_note(format!(
                            "the other is `{}`; one load has one package of each name",
                            members[at].dir.display()
                        )),
                    );
                    members[dependent].unlinked.push(dependency.name);
                    continue;
                }
                None => {
                    members.push(Member {
                        name: found.name.clone(),
                        dir: dir.clone(),
                        root_file: dir.join("src/lib.linnet"),
                        dependencies: Vec::new(),
                        unlinked: Vec::new(),
                    });
                    queue.push_back((members.len() - 1, found.dependencies));
                    members.len() - 1
                }
            };
            let name = members[at].name.clone();
            if !members[dependent].dependencies.contains(&name) {
                members[dependent].dependencies.push(name);
            }
        }
    }
    members
}

fn same_dir(a: &Path, b: &Path) -> bool {
    a == b || matches!((a.canonicalize(), b.canonicalize()), (Ok(a), Ok(b)) if a == b)
}

/// The manifest at `dir`, when it is there and names the package as the
/// dependency does.
fn read_dependency(
    dependency: &Dependency,
    dir: &Path,
    options: &LoadOptions,
    sources: &mut SourceMap,
    diagnostics: &mut Vec<Diagnostic>,
) -> Option<manifest::Manifest> {
    let manifest_path = dir.join("linnet.toml");
    let text = match options.read(&manifest_path) {
        Ok(text) => text,
        Err(error) => {
            diagnostics.push(
                Diagnostic::error(
                    Code::PackageError,
                    dependency.path_span,
                    format!("no Linnet package at `{}`", dir.display()),
                )
                .with_label(format!("cannot read `{}`: {error}", manifest_path.display())),
            );
            return None;
        }
    };
    let file = sources.add(&manifest_path, text);
    let found = manifest::parse_manifest(file, sources, diagnostics)?;
    if found.name != dependency.name {
        diagnostics.push(
            Diagnostic::error(
                Code::PackageError,
                dependency.name_span,
                format!("`{}` is package `{}`, not `{}`", dir.display(), found.name, dependency.name),
            )
            .with_label(format!("a dependency is named as its package is: `{} = {{ path = … }}`", found.name)),
        );
        return None;
    }
    Some(found)
}

#[cfg(test)]
mod tests {
    use super::join_normalized;
    use std::path::Path;

    #[test]
    fn joins_take_parent_steps_out() {
        assert_eq!(join_normalized(Path::new("models/a"), Path::new("../b")), Path::new("models/b"));
        assert_eq!(join_normalized(Path::new("/x/models/a"), Path::new("./../b/")), Path::new("/x/models/b"));
        assert_eq!(join_normalized(Path::new("."), Path::new("../b")), Path::new("../b"));
        assert_eq!(join_normalized(Path::new("a"), Path::new("..")), Path::new("."));
        assert_eq!(join_normalized(Path::new("../a"), Path::new("../../b")), Path::new("../../b"));
    }
}
