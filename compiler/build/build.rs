//! Names this build of the compiler by a hash of the sources of every crate
//! that decides what an artifact holds (the IR, the frontend, the executor,
//! the kernels, the code generators, the artifact format and this crate),
//! so that the artifact cache never serves code compiled by another build
//! (`content_key`).

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            files(&path, out);
        } else {
            out.push(path);
        }
    }
}

fn main() {
    let mut paths = Vec::new();
    for krate in ["ir", "frontend", "exec", "kernels", "cpu", "cranelift", "gpu", "artifact", "build"] {
        let src = Path::new("..").join(krate).join("src");
        println!("cargo:rerun-if-changed={}", src.display());
        files(&src, &mut paths);
    }
    paths.sort();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for path in paths {
        path.hash(&mut hasher);
        std::fs::read(&path).unwrap_or_default().hash(&mut hasher);
    }
    println!("cargo:rustc-env=LINNET_COMPILER_SOURCE_HASH={:016x}", hasher.finish());
}
