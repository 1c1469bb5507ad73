//! Records the target triple the crate is built for: the host's, which
//! artifacts name (`host::TRIPLE`).
fn main() {
    let target = std::env::var("TARGET").expect("cargo sets TARGET for build scripts");
    println!("cargo:rustc-env=LINNET_TARGET_TRIPLE={target}");
}
