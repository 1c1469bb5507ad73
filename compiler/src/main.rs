use linnet_compiler::*;
fn main() {
    let mut sm = source::SourceMap::default();
    let mut diags = Vec::new();
    for path in std::env::args().skip(1) {
        let text = std::fs::read_to_string(&path).unwrap();
        let id = sm.add(path.clone(), text.clone());
        let t = std::time::Instant::now();
        let m = syntax::parse_module(id, &text, &mut diags);
        eprintln!("{path}: {} items in {:?}", m.items.len(), t.elapsed());
    }
    diagnostic::render_human(&diags, &sm, false, &mut std::io::stderr()).unwrap();
}
