//! `gguf.json`: how a package's parameters are found in a GGUF file made
//! by llama.cpp's converter, as data beside `bindings.json`. The converter
//! renames tensors, splits some (the experts' fused gate and up
//! projections) and changes values on the way (`-exp(A_log)` for `A_log`,
//! norm weights plus one, value heads reordered); the file says which
//! architecture it is for, and its metadata restates the model card's
//! generics. A package declares each of those as data:
//!
//! ```json
//! { "architecture": "qwen35moe",
//!   "metadata": { "qwen35moe.block_count": "4 * Groups", "qwen35moe.rope.freq_base": 10000000.0 },
//!   "tensors": {
//!     "norm.weight": { "tensor": "output_norm.weight", "changes": [{ "plus": 1 }] },
//!     "groups.0.linear.0.mlp.gate_up_proj":
//!       { "concat": ["blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight"], "axis": 1 } } }
//! ```
//!
//! `changes` lists what the converter did to the parameter, in order; the
//! loader undoes them in reverse. A rotary scaling the converter stores as
//! a tensor is named by `rope_factors` (`super::rope_factors`). Sizes are
//! integers or expressions over the card's generics (`+ - * / %`,
//! parentheses), evaluated for the instance being built: [`resolve`] gives
//! the concrete [`GgufNames`] an artifact records and the runtime applies.

use super::rope_factors::RawRopeFactors;
use crate::code::Code;
use crate::diagnostic::Diagnostic;
use crate::source::{FileId, SourceMap, Span};
pub use linnet_artifact::gguf_names::{Change, Expected, GgufNames, Source};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};

/// A size as written: an integer or an expression over the generics.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum Size {
    Int(i64),
    Expr(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSource {
    tensor: Option<String>,
    concat: Option<Vec<String>>,
    #[serde(default)]
    axis: usize,
    #[serde(default)]
    changes: Vec<Change<Size>>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawEntry {
    Name(String),
    Source(RawSource),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawExpected {
    Int(i64),
    Float(f64),
    Expr(String),
    /// `{ "generic": "GlobalFactor", "otherwise": 1.0 }`: a key the file
    /// may leave out, which then means `otherwise`.
    Optional {
        generic: String,
        otherwise: serde_json::Number,
    },
}

/// A number as the value it is: an integer where it is one.
fn expected_of(number: &serde_json::Number) -> Expected {
    match number.as_i64() {
        Some(value) => Expected::Int(value),
        None => Expected::Float(number.as_f64().unwrap_or(f64::NAN)),
    }
}

/// `gguf.json` as written, with the place of each entry.
pub struct GgufFile {
    pub file: FileId,
    pub architecture: String,
    metadata: Vec<(String, RawExpected, Span)>,
    pub tensors: Vec<(String, Source<Size>, Span)>,
    rope_factors: Option<(RawRopeFactors, Span)>,
}

fn problem(span: Span, message: String, label: &str) -> Diagnostic {
    Diagnostic::error(Code::GgufNames, span, message).with_label(label.to_string())
}

/// Parses `gguf.json`; each malformed entry is a diagnostic at its key.
pub fn parse(file: FileId, sources: &SourceMap, diagnostics: &mut Vec<Diagnostic>) -> Option<GgufFile> {
    let text = &sources.get(file).text;
    let root = match serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(text) {
        Ok(root) => root,
        Err(error) => {
            let line_start: usize = text.split_inclusive('\n').take(error.line().saturating_sub(1)).map(str::len).sum();
            let at = (line_start + error.column().saturating_sub(1)).min(text.len());
            diagnostics.push(problem(
                Span::new(file, at..at),
                format!("invalid gguf.json: {error}"),
                "expected an object with `architecture`, `metadata` and `tensors`",
            ));
            return None;
        }
    };
    let whole = Span::new(file, 0..1);
    let Some(architecture) = root.get("architecture").and_then(|a| a.as_str()) else {
        diagnostics.push(problem(
            whole,
            "gguf.json names no `architecture`".into(),
            "the GGUF files' `general.architecture`",
        ));
        return None;
    };
    let object = |key: &str| root.get(key).and_then(|v| v.as_object()).cloned().unwrap_or_default();
    let mut metadata = Vec::new();
    for (key, value) in object("metadata") {
        let span = super::json_key_span(file, text, &key);
        match serde_json::from_value::<RawExpected>(value) {
            Ok(expected) => metadata.push((key, expected, span)),
            Err(_) => diagnostics.push(problem(
                span,
                format!("metadata `{key}` is neither a number, an expression nor a generic with its default"),
                "expected a number, a string such as \"4 * Groups\", or {\"generic\": NAME, \"otherwise\": NUMBER}",
            )),
        }
    }
    let mut tensors = Vec::new();
    for (path, value) in object("tensors") {
        let span = super::json_key_span(file, text, &path);
        let source = match serde_json::from_value::<RawEntry>(value.clone()) {
            Ok(RawEntry::Name(name)) => Ok(Source { tensors: vec![name], axis: 0, changes: Vec::new() }),
            Ok(RawEntry::Source(raw)) => match (raw.tensor, raw.concat) {
                (Some(name), None) => Ok(Source { tensors: vec![name], axis: raw.axis, changes: raw.changes }),
                (None, Some(names)) if !names.is_empty() => {
                    Ok(Source { tensors: names, axis: raw.axis, changes: raw.changes })
                }
                _ => Err("give exactly one of `tensor` (a name) and `concat` (names)".to_string()),
            },
            // The untagged error says nothing; the tagged one says what is wrong.
            Err(_) => Err(serde_json::from_value::<RawSource>(value)
                .err()
                .map_or_else(|| "expected a tensor name or an object".to_string(), |error| error.to_string())),
        };
        match source {
            Ok(source) => tensors.push((path, source, span)),
            Err(why) => diagnostics.push(problem(span, format!("entry `{path}`: {why}"), "where this parameter is")),
        }
    }
    let rope_factors = root.get("rope_factors").and_then(|value| {
        let span = super::json_key_span(file, text, "rope_factors");
        serde_json::from_value::<RawRopeFactors>(value.clone())
            .map_err(|error| {
                diagnostics.push(problem(
                    span,
                    format!("`rope_factors`: {error}"),
                    "expected {\"tensor\": NAME, \"llama3\": {dims, theta, factor, low_freq_factor, high_freq_factor, original_context}}",
                ))
            })
            .ok()
            .map(|raw| (raw, span))
    });
    Some(GgufFile { file, architecture: architecture.to_string(), metadata, tensors, rope_factors })
}

/// The metadata lines of `gguf.json` as `[config]` lines: a GGUF file's
/// metadata gives the generics they name (`"llama.embedding_length": "H"`)
/// as a checkpoint's `config.json` gives those of `[config]`.
pub fn config_lines(file: &GgufFile) -> Vec<super::config::ConfigLine> {
    file.metadata
        .iter()
        .map(|(key, expected, span)| super::config::ConfigLine {
            keys: vec![key.clone()],
            rule: match expected {
                RawExpected::Int(value) => super::config::Rule::Equals(toml::Value::Integer(*value)),
                RawExpected::Float(value) => super::config::Rule::Equals(toml::Value::Float(*value)),
                RawExpected::Expr(text) => super::config::rule_of(text),
                RawExpected::Optional { generic, otherwise } => match super::config::rule_of(generic) {
                    super::config::Rule::Generic { name, per, .. } => {
                        let otherwise = match expected_of(otherwise) {
                            Expected::Int(value) => toml::Value::Integer(value),
                            Expected::Float(value) => toml::Value::Float(value),
                        };
                        super::config::Rule::Generic { name, per, otherwise: Some(otherwise) }
                    }
                    other => other,
                },
            },
            span: *span,
        })
        .collect()
}

/// Why a size in `gguf.json` does not evaluate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SizeError(pub String);

impl std::fmt::Display for SizeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SizeError {}

/// A tensor name of `gguf.json` or `bindings.json` with each `{expr}` in
/// it replaced by the expression's value over `values` ([`evaluate`]): a
/// tensor whose number follows the instance's sizes,
/// `model.layers.{Layers - Layers % Pattern + 1}.mlp.up_proj.weight`.
pub fn instance_name(name: &str, values: &HashMap<String, i64>) -> Result<String, SizeError> {
    let mut named = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(open) = rest.find('{') {
        let close = rest[open..]
            .find('}')
            .map(|at| open + at)
            .ok_or_else(|| SizeError(format!("`{{` without its `}}` in `{name}`")))?;
        named.push_str(&rest[..open]);
        named.push_str(&evaluate(&rest[open + 1..close], values)?.to_string());
        rest = &rest[close + 1..];
    }
    named.push_str(rest);
    Ok(named)
}

/// `text` evaluated over `values`: integers, names, `+ - * / %` and
/// parentheses, with the usual precedence; division must be exact.
pub fn evaluate(text: &str, values: &HashMap<String, i64>) -> Result<i64, SizeError> {
    let tokens = tokenize(text)?;
    let mut parser = Parser { tokens: &tokens, at: 0, values };
    let value = parser.sum()?;
    match parser.tokens.get(parser.at) {
        None => Ok(value),
        Some(token) => Err(SizeError(format!("unexpected `{token}` in `{text}`"))),
    }
}

fn tokenize(text: &str) -> Result<Vec<String>, SizeError> {
    let mut tokens = Vec::new();
    let mut chars = text.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        if c.is_whitespace() {
            continue;
        }
        if c.is_ascii_alphanumeric() || c == '_' {
            let mut end = at + c.len_utf8();
            while let Some(&(next, d)) = chars.peek() {
                if !(d.is_ascii_alphanumeric() || d == '_') {
                    break;
                }
                end = next + d.len_utf8();
                chars.next();
            }
            tokens.push(text[at..end].to_string());
        } else if "+-*/%()".contains(c) {
            tokens.push(c.to_string());
        } else {
            return Err(SizeError(format!("unexpected `{c}` in `{text}`")));
        }
    }
    Ok(tokens)
}

struct Parser<'a> {
    tokens: &'a [String],
    at: usize,
    values: &'a HashMap<String, i64>,
}

impl Parser<'_> {
    fn next_is(&self, symbol: &str) -> bool {
        self.tokens.get(self.at).is_some_and(|t| t == symbol)
    }

    fn sum(&mut self) -> Result<i64, SizeError> {
        let mut value = self.product()?;
        while self.next_is("+") || self.next_is("-") {
            let plus = self.next_is("+");
            self.at += 1;
            let right = self.product()?;
            value = if plus { value.checked_add(right) } else { value.checked_sub(right) }
                .ok_or_else(|| SizeError("overflow".into()))?;
        }
        Ok(value)
    }

    fn product(&mut self) -> Result<i64, SizeError> {
        let mut value = self.atom()?;
        while let Some(op) = self.tokens.get(self.at).filter(|t| ["*", "/", "%"].contains(&t.as_str())) {
            let op = op.clone();
            self.at += 1;
            let right = self.atom()?;
            value = match op.as_str() {
                "*" => value.checked_mul(right).ok_or_else(|| SizeError("overflow".into()))?,
                _ if right == 0 => return Err(SizeError("division by zero".into())),
                "/" if value % right != 0 => return Err(SizeError(format!("{value} / {right} is not whole"))),
                "/" => value / right,
                _ => value.rem_euclid(right),
            };
        }
        Ok(value)
    }

    fn atom(&mut self) -> Result<i64, SizeError> {
        let token = self.tokens.get(self.at).ok_or_else(|| SizeError("the expression ends early".into()))?.clone();
        self.at += 1;
        if token == "(" {
            let value = self.sum()?;
            if !self.next_is(")") {
                return Err(SizeError("a `(` is not closed".into()));
            }
            self.at += 1;
            return Ok(value);
        }
        if let Ok(value) = token.parse::<i64>() {
            return Ok(value);
        }
        self.values
            .get(&token)
            .copied()
            .ok_or_else(|| SizeError(format!("`{token}` is not an integer generic of the model card")))
    }
}

fn size(value: &Size, values: &HashMap<String, i64>) -> Result<i64, SizeError> {
    match value {
        Size::Int(value) => Ok(*value),
        Size::Expr(text) => evaluate(text, values),
    }
}

fn resolve_change(change: &Change<Size>, values: &HashMap<String, i64>) -> Result<Change<i64>, SizeError> {
    Ok(match change {
        Change::Plus(constant) => Change::Plus(*constant),
        Change::NegatedExp => Change::NegatedExp,
        Change::Transposed => Change::Transposed,
        Change::TiledHeads { axis, from, groups, per_group, head } => Change::TiledHeads {
            axis: *axis,
            from: size(from, values)?,
            groups: size(groups, values)?,
            per_group: size(per_group, values)?,
            head: size(head, values)?,
        },
        Change::RotaryPairs { axis, heads, head } => {
            Change::RotaryPairs { axis: *axis, heads: size(heads, values)?, head: size(head, values)? }
        }
    })
}

/// `file` for the instance whose generics are `values`; every entry that
/// cannot be evaluated is a diagnostic at its key.
/// A metadata value that names a number setting (`"Eps"`) is that
/// setting's value.
pub fn resolve(
    file: &GgufFile,
    values: &HashMap<String, i64>,
    numbers: &HashMap<String, f64>,
    diagnostics: &mut Vec<Diagnostic>,
) -> Option<GgufNames> {
    let before = diagnostics.len();
    let mut metadata = BTreeMap::new();
    let mut absent_means = BTreeMap::new();
    let setting = |text: &String| match numbers.get(text.trim()) {
        Some(number) if !values.contains_key(text.trim()) => Ok(Expected::Float(*number)),
        _ => evaluate(text, values).map(Expected::Int),
    };
    for (key, expected, span) in &file.metadata {
        let value = match expected {
            RawExpected::Int(value) => Ok(Expected::Int(*value)),
            RawExpected::Float(value) => Ok(Expected::Float(*value)),
            RawExpected::Expr(text) => setting(text),
            RawExpected::Optional { generic, otherwise } => {
                absent_means.insert(key.clone(), expected_of(otherwise));
                setting(generic)
            }
        };
        match value {
            Ok(value) => {
                metadata.insert(key.clone(), value);
            }
            Err(why) => {
                diagnostics.push(problem(*span, format!("metadata `{key}`: {why}"), "the value the file must hold"))
            }
        }
    }
    let mut tensors = BTreeMap::new();
    for (path, source, span) in &file.tensors {
        let changes: Result<Vec<_>, _> = source.changes.iter().map(|change| resolve_change(change, values)).collect();
        let names: Result<Vec<_>, _> = source.tensors.iter().map(|name| instance_name(name, values)).collect();
        match changes.and_then(|changes| names.map(|names| (changes, names))) {
            Ok((changes, names)) => {
                tensors.insert(path.clone(), Source { tensors: names, axis: source.axis, changes });
            }
            Err(why) => diagnostics.push(problem(*span, format!("entry `{path}`: {why}"), "where this parameter is")),
        }
    }
    let rope_factors = file.rope_factors.as_ref().and_then(|(raw, span)| {
        super::rope_factors::resolve(raw, values, numbers)
            .map_err(|why| diagnostics.push(problem(*span, format!("`rope_factors`: {why}"), "the rotary scaling")))
            .ok()
    });
    (diagnostics.len() == before).then(|| GgufNames {
        architecture: file.architecture.clone(),
        metadata,
        absent_means,
        tensors,
        rope_factors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values() -> HashMap<String, i64> {
        [("Groups".to_string(), 10), ("KeyHeads".to_string(), 16), ("ValueHeads".to_string(), 32)].into()
    }

    #[test]
    fn expressions_follow_precedence_and_refuse_what_they_cannot_say() {
        assert_eq!(evaluate("4 * Groups", &values()), Ok(40));
        assert_eq!(evaluate("2 + 3 * (Groups - 8) % 4", &values()), Ok(4));
        assert_eq!(evaluate("ValueHeads / KeyHeads", &values()), Ok(2));
        assert!(evaluate("KeyHeads / 3", &values()).unwrap_err().0.contains("not whole"));
        assert!(evaluate("Layers", &values()).unwrap_err().0.contains("`Layers`"));
        assert!(evaluate("(Groups", &values()).unwrap_err().0.contains("not closed"));
        assert!(evaluate("Groups 2", &values()).unwrap_err().0.contains("unexpected `2`"));
        assert!(evaluate("Groups / 0", &values()).is_err());
    }

    /// Each `{expr}` of a name is its value for the instance; text outside
    /// them is kept; an unclosed one, or one that does not evaluate, is
    /// an error that says which.
    #[test]
    fn names_take_the_instances_numbers() {
        let name = "model.layers.{Groups - Groups % 4 + 1}.mlp.{KeyHeads / 16}";
        assert_eq!(instance_name(name, &values()), Ok("model.layers.9.mlp.1".to_string()));
        assert_eq!(instance_name("blk.0.ffn_up.weight", &values()), Ok("blk.0.ffn_up.weight".to_string()));
        assert!(instance_name("blk.{Groups.weight", &values()).unwrap_err().0.contains("without its `}`"));
        assert!(instance_name("blk.{Layers}.weight", &values()).unwrap_err().0.contains("`Layers`"));
    }

    #[test]
    fn entries_parse_resolve_and_report_at_their_key() {
        let mut sources = SourceMap::default();
        let text = r#"{"architecture": "qwen35moe",
            "metadata": {"qwen35moe.block_count": "4 * Groups", "qwen35moe.rope.freq_base": 1e7, "bad": "Layers"},
            "tensors": {
              "norm.weight": {"tensor": "output_norm.weight", "changes": [{"plus": 1}]},
              "a": {"concat": ["x", "y"], "axis": 1, "changes": ["transposed"]},
              "b": {"tensor": "z", "changes": [{"tiled_heads": {"axis": 0, "from": 0, "groups": "KeyHeads",
                    "per_group": "ValueHeads / KeyHeads", "head": 128}}, "negated_exp"]},
              "c": {"tensor": "z", "concat": ["w"]},
              "d": {"tensor": "z", "changes": ["squared"]}
            }}"#;
        let file = sources.add("gguf.json", text.to_string());
        let mut diagnostics = Vec::new();
        let parsed = parse(file, &sources, &mut diagnostics).unwrap();
        let messages: Vec<&str> = diagnostics.iter().map(|d| d.message.as_str()).collect();
        assert_eq!(messages.len(), 2, "{messages:?}");
        assert!(messages[0].contains("entry `c`") && messages[1].contains("entry `d`"), "{messages:?}");
        assert_eq!(&text[diagnostics[0].primary.span.range()], "\"c\"");
        diagnostics.clear();
        assert!(resolve(&parsed, &values(), &HashMap::new(), &mut diagnostics).is_none());
        assert_eq!(diagnostics.len(), 1);
        assert!(diagnostics[0].message.contains("metadata `bad`"));
        let mut fine = values();
        fine.insert("Layers".into(), 1);
        diagnostics.clear();
        let names = resolve(&parsed, &fine, &HashMap::new(), &mut diagnostics).unwrap();
        assert_eq!(names.metadata["qwen35moe.block_count"], Expected::Int(40));
        assert_eq!(names.metadata["qwen35moe.rope.freq_base"], Expected::Float(1e7));
        let a = Source { tensors: vec!["x".into(), "y".into()], axis: 1, changes: vec![Change::Transposed] };
        assert_eq!(names.tensors["a"], a);
        assert_eq!(
            names.tensors["b"].changes,
            vec![Change::TiledHeads { axis: 0, from: 0, groups: 16, per_group: 2, head: 128 }, Change::NegatedExp]
        );
        assert_eq!(names.tensors["norm.weight"].changes, vec![Change::Plus(1.0)]);
    }
}
