//! The model card's `[config]`: how a checkpoint's `config.json` gives the
//! card's generics, and what else it must say. Each line maps a key of the
//! file (a dotted path into its objects; alternatives separated by ` | `,
//! the first the file has) to
//! - a generic (`"hidden_size" = "H"`, or `"num_hidden_layers" = "4 *
//!   Groups"`, or `"dtype" = "T"` where torch's `bfloat16` is `bf16`):
//!   the generic takes the file's value, so one package runs every size
//!   of its family; `--set` still wins;
//!   `{ generic = "RopeFactor", otherwise = 1.0 }` gives the generic a
//!   value where the file has none of the keys (a setting a file states
//!   only when it is not the default);
//! - a value (`"tie_word_embeddings" = false`, `"hidden_act" = "silu"`):
//!   the file must say the same; `{ one_of = ["default", "llama3"] }`:
//!   one of these (`{ one_of = [] }`: the file must not have the key;
//!   `required = true` beside `one_of`: the file must have it);
//! - an expression over the generics (`"head_dim" = "H / Heads"`): the
//!   file's value must equal it under the generics the card ends with;
//! - a list of layer kinds with a period (`"layer_types" = { every =
//!   "full_attention", period = "Pattern", others = "sliding_attention" }`):
//!   every `period`-th element (the first at `period - 1`) is `every`, the
//!   others are `others`, as the package builds its stack; a generic
//!   period takes the file's (where its list has an `every`), a number
//!   must be the file's.
//!
//! A key the file does not have (or has as `null`) leaves the card's value.
//! A contradiction is an error at the card's line that names the file's
//! value and place.

use super::manifest::{NestEntry, NestValue};
use crate::code::Code;
use crate::diagnostic::Diagnostic;
use crate::source::{FileId, SourceMap, Span};
use std::collections::BTreeMap;
use toml::Spanned;

/// What one `[config]` line asks of the file's value.
#[derive(Clone, Debug)]
pub enum Rule {
    /// The generic is the value divided by `per`: `"num_hidden_layers" =
    /// "4 * Groups"`; `otherwise` where the file has none of the keys.
    Generic { name: String, per: i64, otherwise: Option<toml::Value> },
    /// The value must be this.
    Equals(toml::Value),
    /// The value must be one of these; with `required`, the file must
    /// have it.
    OneOf { allowed: Vec<toml::Value>, required: bool },
    /// The value must equal this expression over the integer generics.
    Derived(String),
    /// A list whose every `period`-th element is `every` and the others
    /// `others`.
    Periodic { every: String, others: String, period: Period },
}

/// A [`Rule::Periodic`] list's period: a generic that takes the file's, or
/// a number the file's must be.
#[derive(Clone, Debug)]
pub enum Period {
    Generic(String),
    Fixed(i64),
}

/// One `[config]` line.
#[derive(Clone, Debug)]
pub struct ConfigLine {
    /// The keys to try, in order.
    pub keys: Vec<String>,
    pub rule: Rule,
    pub span: Span,
}

/// A derived line whose value the file gave, checked once the generics are
/// known.
#[derive(Clone, Debug)]
pub struct ConfigCheck {
    pub key: String,
    pub expression: String,
    pub found: i64,
    pub span: Span,
    pub found_at: Span,
}

/// Reads `[config]` as written; a line that is neither a key and a value
/// nor a rule the loader knows is an error at it.
pub fn parse(
    file: FileId,
    table: BTreeMap<Spanned<String>, Spanned<toml::Value>>,
    diagnostics: &mut Vec<Diagnostic>,
) -> Vec<ConfigLine> {
    let mut lines = Vec::new();
    for (key, value) in table {
        let span = Span::new(file, key.span().start..value.span().end);
        let keys: Vec<String> = key.get_ref().split('|').map(|k| k.trim().to_string()).collect();
        if keys.iter().any(|k| k.is_empty() || k.split('.').any(str::is_empty)) {
            diagnostics.push(
                Diagnostic::error(Code::PackageError, span, format!("`{}` is not a config.json key", key.get_ref()))
                    .with_label("a key or a dotted path, alternatives separated by ` | `"),
            );
            continue;
        }
        let rule = match value.get_ref() {
            toml::Value::String(text) => rule_of(text),
            toml::Value::Table(table) => match table_rule(table) {
                Some(rule) => rule,
                None => {
                    diagnostics.push(
                        Diagnostic::error(Code::PackageError, span, "not a `[config]` rule")
                            .with_label("`{ generic = \"Name\", otherwise = VALUE }`, `{ one_of = [VALUES] }` or `{ every = KIND, period = N, others = KIND }`"),
                    );
                    continue;
                }
            },
            other => Rule::Equals(other.clone()),
        };
        lines.push(ConfigLine { keys, rule, span });
    }
    lines.sort_by_key(|line| line.span.start);
    lines
}

/// `{ generic = "Name", otherwise = VALUE }`, `{ one_of = [VALUES] }`
/// (with `required = true` or not), or `{ every = KIND, period = "Name" |
/// N, others = KIND }`.
fn table_rule(table: &toml::value::Table) -> Option<Rule> {
    let mut keys: Vec<&str> = table.keys().map(String::as_str).collect();
    keys.sort_unstable();
    match keys.as_slice() {
        ["every", "others", "period"] => {
            let period = match &table["period"] {
                toml::Value::Integer(count) if *count > 0 => Period::Fixed(*count),
                toml::Value::String(name) => match rule_of(name) {
                    Rule::Generic { name, per: 1, .. } => Period::Generic(name),
                    _ => return None,
                },
                _ => return None,
            };
            let kind = |key: &str| table[key].as_str().map(str::to_string);
            Some(Rule::Periodic { every: kind("every")?, others: kind("others")?, period })
        }
        ["generic", "otherwise"] => match rule_of(table["generic"].as_str()?) {
            Rule::Generic { name, per, .. } => {
                Some(Rule::Generic { name, per, otherwise: Some(table["otherwise"].clone()) })
            }
            _ => None,
        },
        ["one_of"] => Some(Rule::OneOf { allowed: table["one_of"].as_array()?.clone(), required: false }),
        ["one_of", "required"] => {
            Some(Rule::OneOf { allowed: table["one_of"].as_array()?.clone(), required: table["required"].as_bool()? })
        }
        _ => None,
    }
}

/// `"H"` is a generic, `"4 * Groups"` a generic per 4, `"H / Heads"` a
/// derived value; text that is not an expression is a value to equal.
pub(super) fn rule_of(text: &str) -> Rule {
    let is_name = |word: &str| {
        word.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && word.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    let words: Vec<&str> = text.split_whitespace().collect();
    match words.as_slice() {
        [name] if is_name(name) && name.chars().next().is_some_and(|c| c.is_ascii_uppercase()) => {
            Rule::Generic { name: name.to_string(), per: 1, otherwise: None }
        }
        [count, "*", name] | [name, "*", count] if is_name(name) && count.parse::<i64>().is_ok_and(|c| c > 0) => {
            Rule::Generic { name: name.to_string(), per: count.parse().expect("checked"), otherwise: None }
        }
        _ if words.iter().any(|w| ["+", "-", "*", "/", "%"].contains(w)) => Rule::Derived(text.to_string()),
        _ => Rule::Equals(toml::Value::String(text.to_string())),
    }
}

/// The value at `key`: a key of the top object as it is (GGUF metadata's
/// keys have dots in them), else a dotted path; `None` where absent or
/// `null`.
fn lookup<'v>(config: &'v serde_json::Value, key: &str) -> Option<&'v serde_json::Value> {
    let found = config.get(key).or_else(|| key.split('.').try_fold(config, |at, part| at.get(part)))?;
    (!found.is_null()).then_some(found)
}

/// The span of the last segment of `key` (`"rope_theta":`) in the file's
/// text, for pointing at what it says.
fn found_span(file: FileId, text: &str, key: &str) -> Span {
    super::json_key_span(file, text, key.rsplit('.').next().unwrap_or(key))
}

/// Gives a generic the value `entry` says, in place of the card's.
fn set_generic(generics: &mut Vec<NestEntry>, entry: NestEntry) {
    match generics.iter_mut().find(|e| e.name == entry.name) {
        Some(slot) => *slot = entry,
        None => generics.push(entry),
    }
}

/// A torch dtype's name as the card writes it: `bfloat16` is `bf16`.
fn dtype_name(torch: &str) -> &str {
    match torch {
        "float32" => "f32",
        "bfloat16" => "bf16",
        "float16" => "f16",
        other => other,
    }
}

/// Numbers are equal at f32's precision: a GGUF file stores its settings as
/// f32 (`1e-6` is `9.99999997e-7` there).
fn same(expected: &toml::Value, found: &serde_json::Value) -> bool {
    let number = |want: f64| found.as_f64().is_some_and(|have| have == want || have as f32 == want as f32);
    match (expected, found) {
        (toml::Value::Boolean(a), serde_json::Value::Bool(b)) => a == b,
        (toml::Value::String(a), serde_json::Value::String(b)) => a == b,
        (toml::Value::Integer(a), _) => number(*a as f64),
        (toml::Value::Float(a), _) => number(*a),
        _ => false,
    }
}

/// The element type a checkpoint's tensors are stored in, as torch names it
/// (`bfloat16`): the most common floating type in the header of its first
/// `.safetensors` file. What transformers' `dtype="auto"` falls back to
/// where the config does not say.
pub fn stored_dtype(dir: &std::path::Path) -> Option<&'static str> {
    use std::io::Read;
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    files.sort();
    let mut file = std::fs::File::open(files.first()?).ok()?;
    let mut length = [0u8; 8];
    file.read_exact(&mut length).ok()?;
    let length = usize::try_from(u64::from_le_bytes(length)).ok().filter(|n| *n <= 100 << 20)?;
    let mut header = vec![0u8; length];
    file.read_exact(&mut header).ok()?;
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&header).ok()?;
    let mut counts: BTreeMap<&'static str, usize> = BTreeMap::new();
    for tensor in header.values() {
        let torch = match tensor.get("dtype").and_then(|d| d.as_str()) {
            Some("F32") => "float32",
            Some("BF16") => "bfloat16",
            Some("F16") => "float16",
            _ => continue,
        };
        *counts.entry(torch).or_default() += 1;
    }
    counts.into_iter().max_by_key(|(_, count)| *count).map(|(torch, _)| torch)
}

/// What a checkpoint's `config.json` makes of the card: the generics it
/// gives (as `[generics]` lines placed at the card's `[config]` line), the
/// derived values to check later, and a diagnostic for each value it
/// contradicts or cannot give.
/// A config without `dtype` or `torch_dtype` takes `stored` (the tensors'
/// type) as its `dtype`.
pub fn apply(
    lines: &[ConfigLine],
    config_file: FileId,
    stored: Option<&str>,
    sources: &SourceMap,
    generics: &mut Vec<NestEntry>,
    diagnostics: &mut Vec<Diagnostic>,
) -> Vec<ConfigCheck> {
    let text = &sources.get(config_file).text;
    let path = sources.get(config_file).path.display().to_string();
    let mut config: serde_json::Value = match serde_json::from_str(text) {
        Ok(config) => config,
        Err(error) => {
            diagnostics.push(
                Diagnostic::error(
                    Code::CheckpointConfig,
                    Span::new(config_file, 0..0),
                    format!("invalid JSON: {error}"),
                )
                .with_label("the checkpoint's config.json"),
            );
            return Vec::new();
        }
    };
    if let (Some(object), Some(stored)) = (config.as_object_mut(), stored) {
        if !object.contains_key("dtype") && !object.contains_key("torch_dtype") {
            object.insert("dtype".to_string(), serde_json::Value::String(stored.to_string()));
        }
    }
    let mut checks = Vec::new();
    for line in lines {
        let Some((key, found)) = line.keys.iter().find_map(|key| Some((key, lookup(&config, key)?))) else {
            if let Rule::OneOf { required: true, .. } = &line.rule {
                diagnostics.push(
                    Diagnostic::error(
                        Code::CheckpointConfig,
                        line.span,
                        format!(
                            "the checkpoint's config.json has no `{}`, which the card requires",
                            line.keys.join("` or `")
                        ),
                    )
                    .with_label(format!("the card's `[config]` line; {path} does not say it")),
                );
            }
            if let Rule::Generic { name, otherwise: Some(value), .. } = &line.rule {
                let value = match value {
                    toml::Value::Integer(whole) => NestValue::Int(*whole),
                    toml::Value::Float(number) => NestValue::Float(*number),
                    toml::Value::String(text) => NestValue::Text(text.clone()),
                    other => NestValue::Other(other.to_string()),
                };
                set_generic(
                    generics,
                    NestEntry { name: name.clone(), value, name_span: line.span, value_span: line.span },
                );
            }
            continue;
        };
        let found_at = found_span(config_file, text, key);
        let contradiction = |wanted: String| {
            Diagnostic::error(
                Code::CheckpointConfig,
                line.span,
                format!("the checkpoint's config.json says `{key}` is {found}, where the card {wanted}"),
            )
            .with_label(format!("the card's `[config]` line; {path} says {found}"))
            .with_secondary(found_at, "the checkpoint says this")
        };
        match &line.rule {
            Rule::Equals(expected) if same(expected, found) => {}
            Rule::Equals(expected) => diagnostics.push(contradiction(format!("requires {expected}"))),
            Rule::OneOf { allowed, .. } if allowed.iter().any(|expected| same(expected, found)) => {}
            Rule::OneOf { allowed, .. } if allowed.is_empty() => {
                diagnostics.push(contradiction("does not read it: the package cannot run this setting".to_string()))
            }
            Rule::OneOf { allowed, .. } => {
                let listed: Vec<String> = allowed.iter().map(toml::Value::to_string).collect();
                diagnostics.push(contradiction(format!("requires one of {}", listed.join(", "))));
            }
            Rule::Generic { name, per, .. } => {
                let value = match (found.as_i64(), found.as_f64(), found.as_str()) {
                    (Some(whole), _, _) if whole % per == 0 => NestValue::Int(whole / per),
                    (None, Some(number), _) if *per == 1 => NestValue::Float(number),
                    (_, _, Some(text)) if *per == 1 => NestValue::Text(dtype_name(text).to_string()),
                    _ => {
                        let needs = if *per == 1 { "a number".to_string() } else { format!("a multiple of {per}") };
                        diagnostics.push(contradiction(format!("reads it as `{name}` and needs {needs}")));
                        continue;
                    }
                };
                set_generic(
                    generics,
                    NestEntry { name: name.clone(), value, name_span: line.span, value_span: line.span },
                );
            }
            Rule::Periodic { every, others, period } => {
                let kinds: Option<Vec<&str>> =
                    found.as_array().and_then(|list| list.iter().map(serde_json::Value::as_str).collect());
                let Some(kinds) = kinds else {
                    diagnostics.push(contradiction("requires a list of layer kinds".to_string()));
                    continue;
                };
                let first = kinds.iter().position(|kind| kind == every).map(|at| at as i64 + 1);
                let length = match (period, first) {
                    (Period::Fixed(length), _) => *length,
                    (Period::Generic(_), Some(length)) => length,
                    // No `every` in the list: a period past its end.
                    (Period::Generic(_), None) => kinds.len() as i64 + 1,
                };
                let expected = |at: usize| if (at as i64 + 1) % length == 0 { every } else { others };
                if let Some(at) = (0..kinds.len()).find(|&at| kinds[at] != expected(at)) {
                    let period_name = match period {
                        Period::Fixed(length) => length.to_string(),
                        Period::Generic(name) => format!("`{name}` ({length})"),
                    };
                    diagnostics.push(contradiction(format!(
                        "builds layer {at} as \"{}\": \"{every}\" where the layer's number plus one is a multiple of {period_name}, \"{others}\" elsewhere",
                        expected(at)
                    )));
                    continue;
                }
                if let (Period::Generic(name), Some(length)) = (period, first) {
                    let entry = NestEntry {
                        name: name.clone(),
                        value: NestValue::Int(length),
                        name_span: line.span,
                        value_span: line.span,
                    };
                    set_generic(generics, entry);
                }
            }
            Rule::Derived(expression) => match found.as_i64() {
                Some(found) => checks.push(ConfigCheck {
                    key: key.clone(),
                    expression: expression.clone(),
                    found,
                    span: line.span,
                    found_at,
                }),
                None => diagnostics.push(contradiction(format!("requires the integer `{expression}`"))),
            },
        }
    }
    checks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_read_generics_multiples_values_and_expressions() {
        assert!(matches!(rule_of("H"), Rule::Generic { ref name, per: 1, .. } if name == "H"));
        assert!(matches!(rule_of("4 * Groups"), Rule::Generic { ref name, per: 4, .. } if name == "Groups"));
        assert!(matches!(rule_of("Groups * 4"), Rule::Generic { ref name, per: 4, .. } if name == "Groups"));
        assert!(matches!(rule_of("H / Heads"), Rule::Derived(_)));
        assert!(matches!(rule_of("silu"), Rule::Equals(toml::Value::String(ref s)) if s == "silu"));
    }

    /// A periodic list of layer kinds: a generic period takes the file's, a
    /// fixed one must be the file's, and a list the stack would not build
    /// is an error naming the first layer it parts at.
    #[test]
    fn layer_kinds_follow_their_period() {
        let check = |rule: &str, config: &str| {
            let mut sources = SourceMap::default();
            let card = sources.add("nest.toml", format!("layer_types = {rule}\n"));
            let table: BTreeMap<Spanned<String>, Spanned<toml::Value>> =
                toml::from_str(&sources.get(card).text).unwrap();
            let mut diagnostics = Vec::new();
            let lines = parse(card, table, &mut diagnostics);
            let file = sources.add("config.json", config.to_string());
            let mut generics = Vec::new();
            apply(&lines, file, None, &sources, &mut generics, &mut diagnostics);
            let messages: Vec<String> = diagnostics.iter().map(|d| d.message.clone()).collect();
            (generics.iter().map(|entry| (entry.name.clone(), entry.value.clone())).collect::<Vec<_>>(), messages)
        };
        let gemma = r#"{ every = "full", period = "Pattern", others = "sliding" }"#;
        let six = r#"{"layer_types": ["sliding", "sliding", "full", "sliding", "sliding", "full", "sliding"]}"#;
        assert_eq!(check(gemma, six), (vec![("Pattern".to_string(), NestValue::Int(3))], vec![]));
        let (_, errors) = check(gemma, r#"{"layer_types": ["sliding", "full", "full"]}"#);
        assert!(errors[0].contains("builds layer 2 as \"sliding\""), "{errors:?}");
        let pairs = r#"{ every = "full", period = 2, others = "sliding" }"#;
        assert_eq!(check(pairs, r#"{"layer_types": ["sliding", "full", "sliding", "full"]}"#), (vec![], vec![]));
        let (_, errors) = check(pairs, r#"{"layer_types": ["full", "full"]}"#);
        assert!(
            errors[0].contains(
                "builds layer 0 as \"sliding\": \"full\" where the layer's number plus one is a multiple of 2"
            ),
            "{errors:?}"
        );
        let (_, errors) = check(pairs, r#"{"layer_types": "full"}"#);
        assert!(errors[0].contains("requires a list of layer kinds"), "{errors:?}");
    }

    #[test]
    fn dotted_keys_reach_into_objects_and_null_is_absent() {
        let config = serde_json::json!({"rope_parameters": {"rope_theta": 1e6}, "sliding_window": null});
        assert_eq!(lookup(&config, "rope_parameters.rope_theta").and_then(|v| v.as_f64()), Some(1e6));
        assert!(lookup(&config, "sliding_window").is_none());
        assert!(lookup(&config, "rope_theta").is_none());
        let metadata = serde_json::json!({"llama.block_count": 3});
        assert_eq!(lookup(&metadata, "llama.block_count").and_then(|v| v.as_i64()), Some(3));
    }
}
