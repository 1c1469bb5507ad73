//! Finding the standard library without configuration: `LINNET_STDLIB`
//! if set, else a `stdlib` folder beside the running compiler or above it
//! (a checkout's `target/debug/linnetc` finds the checkout's `stdlib`),
//! else the folder this compiler was built from.

use std::path::PathBuf;

fn is_stdlib(dir: &std::path::Path) -> bool {
    dir.join("nn").is_dir()
}

pub fn stdlib_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("LINNET_STDLIB") {
        return Some(PathBuf::from(dir));
    }
    let beside_exe = std::env::current_exe().ok().and_then(|exe| {
        exe.ancestors()
            .skip(1)
            .flat_map(|dir| [dir.join("stdlib"), dir.join("share/linnet/stdlib")])
            .find(|dir| is_stdlib(dir))
    });
    beside_exe.or_else(|| {
        let built_from = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../stdlib"));
        is_stdlib(&built_from).then_some(built_from)
    })
}
