//! Parses Linnet files and prints their syntax errors: a debugging aid.
use linnet_frontend::{diagnostic, source, syntax};
fn main() {
    let mut sources = source::SourceMap::default();
    let mut diagnostics = Vec::new();
    for path in std::env::args().skip(1) {
        let text = std::fs::read_to_string(&path).expect("readable");
        let file = sources.add(path.clone(), text.clone());
        let module = syntax::parse_module(file, &text, &mut diagnostics);
        eprintln!("{path}: {} items", module.items.len());
    }
    diagnostic::render_human(&diagnostics, &sources, false, &mut std::io::stderr()).expect("stderr");
}
