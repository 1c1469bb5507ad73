//! The `linnet` runtime CLI. Running entries needs the tensor IR and its
//! interpreter, which are not built yet: until then every command says so
//! and exits with status 2 rather than pretending to run.

fn main() {
    let command = std::env::args().nth(1).unwrap_or_default();
    eprintln!(
        "linnet: `{command}` is not available yet: the runtime (IR, interpreter, weights) \
         is still to be built. `linnetc check PACKAGE` checks a package today."
    );
    std::process::exit(2);
}
