//! Names this build of the compiler by a hash of its sources, so that the
//! runtime's artifact cache never serves code compiled by another build
//! (`artifact::content_key`).

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
    println!("cargo:rerun-if-changed=src");
    let mut paths = Vec::new();
    files(Path::new("src"), &mut paths);
    paths.sort();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for path in paths {
        path.hash(&mut hasher);
        std::fs::read(&path).unwrap_or_default().hash(&mut hasher);
    }
    println!("cargo:rustc-env=LINNET_COMPILER_SOURCE_HASH={:016x}", hasher.finish());
}
