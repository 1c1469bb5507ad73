//! What the editor asks about a checked package, answered from the
//! checker's analysis: the type (and, under the model card, the concrete
//! shape and size) at a position, the declaration of a name, its uses, a
//! file's outline.

use linnet_frontend::driver::Checked;
use linnet_frontend::package::NestValue;
use linnet_frontend::sema::ty::{Axis, Elem, Ty};
use linnet_frontend::source::{FileId, Span};
use linnet_frontend::syntax::ast::{self, Item, Member};
use linnet_ir::dim::Generics;
use linnet_ir::Dtype;
use std::collections::HashMap;

fn contains(span: Span, file: FileId, offset: usize) -> bool {
    span.file == file && span.start as usize <= offset && offset <= span.end as usize
}

/// Of spans recorded with something, the smallest around `offset`.
fn innermost<T>(recorded: &[(Span, T)], file: FileId, offset: usize) -> Option<&(Span, T)> {
    recorded.iter().filter(|(span, _)| contains(*span, file, offset)).min_by_key(|(span, _)| span.end - span.start)
}

/// The smallest recorded span around `offset`, with its type.
pub fn type_at(checked: &Checked, file: FileId, offset: usize) -> Option<(Span, &Ty)> {
    innermost(&checked.index.types, file, offset).map(|(span, ty)| (*span, ty))
}

/// The declaration of the name at `offset`, if it names one.
pub fn definition_at(checked: &Checked, file: FileId, offset: usize) -> Option<Span> {
    innermost(&checked.index.definitions, file, offset).map(|(_, declared)| *declared)
}

/// Every use of the declaration at or named at `offset`, and the
/// declaration itself first.
pub fn references_at(checked: &Checked, file: FileId, offset: usize) -> Vec<Span> {
    let declared = definition_at(checked, file, offset)
        .or_else(|| checked.index.definitions.iter().map(|(_, d)| *d).find(|d| contains(*d, file, offset)));
    let Some(declared) = declared else { return Vec::new() };
    let mut spans = vec![declared];
    spans.extend(checked.index.definitions.iter().filter(|(_, d)| *d == declared).map(|(used, _)| *used));
    spans.dedup();
    spans
}

/// The model card's sizes and element types, `[check]` dims included.
fn card_values(checked: &Checked) -> (Generics, HashMap<String, Dtype>) {
    let mut dims = Generics::new();
    let mut elems = HashMap::new();
    if let Some(nest) = checked.package.as_ref().and_then(|p| p.nest.as_ref()) {
        for entry in nest.generics.iter().chain(&nest.check) {
            match &entry.value {
                NestValue::Int(value) => {
                    dims.insert(entry.name.as_str().into(), *value);
                }
                NestValue::Text(name) => {
                    if let Some(dtype) = Dtype::parse(name) {
                        elems.insert(entry.name.clone(), dtype);
                    }
                }
                NestValue::Float(_) | NestValue::Other(_) => {}
            }
        }
    }
    (dims, elems)
}

/// `H = 2048`, `Eps = 1e-5`: the card's value of the size or number named
/// at `offset`, when the name there is one the card (or `[check]`) sets.
pub fn card_dim_at(checked: &Checked, file: FileId, offset: usize) -> Option<String> {
    let text = &checked.sources.get(file).text;
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let start = text[..offset.min(text.len())].rfind(|c: char| !is_name(c)).map_or(0, |at| at + 1);
    let end = text[start..].find(|c: char| !is_name(c)).map_or(text.len(), |at| start + at);
    let name = &text[start..end];
    let nest = checked.package.as_ref()?.nest.as_ref()?;
    let entry = nest.generics.iter().chain(&nest.check).rfind(|entry| entry.name == name)?;
    matches!(entry.value, NestValue::Int(_) | NestValue::Float(_)).then(|| format!("{name} = {}", entry.value))
}

/// `[1, 8, 2, 256] bf16, 8.0 KiB` under the card's values, if they decide it.
pub fn concrete(checked: &Checked, ty: &Ty) -> Option<String> {
    let Ty::Tensor(tensor) = ty else { return None };
    let (dims, elems) = card_values(checked);
    let mut shape = Vec::new();
    for axis in &tensor.axes {
        let Axis::Dim(dim) = axis else { return None };
        shape.push(dim.value_under(&dims).ok()?);
    }
    let dtype = match &tensor.elem {
        Elem::Known(dtype) => *dtype,
        Elem::Generic(name) => *elems.get(&**name)?,
        _ => return None,
    };
    let bytes =
        shape.iter().try_fold(dtype.bytes() as u128, |bytes, axis| bytes.checked_mul(u128::try_from(*axis).ok()?))?;
    let shape: Vec<String> = shape.iter().map(ToString::to_string).collect();
    Some(format!("[{}] {}, {}", shape.join(", "), dtype.name(), linnet_ir::plan::human_bytes(bytes)))
}

/// The declaration header (up to its body) and doc comment of the block
/// or function whose name is at `span`.
pub fn signature(checked: &Checked, span: Span) -> Option<String> {
    let package = checked.package.as_ref()?;
    let module = package.modules.iter().find(|m| m.file == span.file)?;
    let text = &checked.sources.get(span.file).text;
    let header = |decl: Span, doc: &Option<String>| {
        let body = &text[decl.start as usize..decl.end as usize];
        let head = body.find('{').map_or(body, |at| &body[..at]).trim_end();
        let doc = doc.as_ref().map(|d| format!("\n\n{d}")).unwrap_or_default();
        format!("```linnet\n{head}\n```{doc}")
    };
    for item in &module.ast.items {
        match item {
            Item::Block(block) if block.name.span == span => return Some(header(block.span, &block.doc)),
            Item::Block(block) => {
                for member in &block.members {
                    if let Member::Fn(function) = member {
                        if function.name.span == span {
                            return Some(header(function.span, &function.doc));
                        }
                    }
                }
            }
            Item::Fn(function) if function.name.span == span => return Some(header(function.span, &function.doc)),
            Item::Alias(alias) if alias.name.span == span => return Some(header(alias.span, &alias.doc)),
            _ => {}
        }
    }
    None
}

/// The name of the block or function declared at `offset`.
pub fn declaration_at(checked: &Checked, file: FileId, offset: usize) -> Option<Span> {
    let module = checked.package.as_ref()?.modules.iter().find(|m| m.file == file)?;
    outline(&module.ast)
        .into_iter()
        .flat_map(|symbol| {
            let mut all = vec![symbol.name_span];
            all.extend(symbol.children.iter().map(|child| child.name_span));
            all
        })
        .find(|span| contains(*span, file, offset))
}

/// A file's outline: blocks and traits with their members, functions,
/// constants, `type`s.
pub struct Symbol {
    pub name: String,
    pub kind: lsp_types::SymbolKind,
    pub span: Span,
    pub name_span: Span,
    pub children: Vec<Symbol>,
}

pub fn outline(module: &ast::Module) -> Vec<Symbol> {
    use lsp_types::SymbolKind;
    let leaf = |name: &ast::Ident, kind, span| Symbol {
        name: name.name.clone(),
        kind,
        span,
        name_span: name.span,
        children: Vec::new(),
    };
    module
        .items
        .iter()
        .map(|item| match item {
            Item::Block(block) => {
                let children = block
                    .members
                    .iter()
                    .map(|member| match member {
                        Member::Sub { name, span, .. } => leaf(name, SymbolKind::FIELD, *span),
                        Member::Param { name, span, .. } => leaf(name, SymbolKind::PROPERTY, *span),
                        Member::State { name, span, .. } => leaf(name, SymbolKind::VARIABLE, *span),
                        Member::Fn(function) => leaf(&function.name, SymbolKind::METHOD, function.span),
                    })
                    .collect();
                let kind = match block.kind {
                    ast::BlockKind::Block => SymbolKind::CLASS,
                    ast::BlockKind::Trait => SymbolKind::INTERFACE,
                };
                Symbol { children, ..leaf(&block.name, kind, block.span) }
            }
            Item::Alias(alias) => leaf(&alias.name, SymbolKind::TYPE_PARAMETER, alias.span),
            Item::Fn(function) => leaf(&function.name, SymbolKind::FUNCTION, function.span),
            Item::Const(constant) => leaf(&constant.name, SymbolKind::CONSTANT, constant.span),
        })
        .collect()
}
