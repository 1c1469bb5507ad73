//! Tool calls in the format Qwen3.5 and 3.6 write them (their chat
//! template teaches it to the model):
//!
//! ```text
//! <tool_call>
//! <function=get_weather>
//! <parameter=city>
//! Paris
//! </parameter>
//! </function>
//! </tool_call>
//! ```
//!
//! [`Calls`] takes the answer's text as it streams: text before the first
//! `<tool_call>` is content, given out as it comes (holding back what could
//! still be the tag's start); the rest is held and read into calls at the
//! end. A parameter's value is JSON where the tool's schema says it is not
//! a string (or where it has no schema and the text reads as JSON), else
//! the text itself, as the template writes them. [`call_grammar`] is the
//! same format as a grammar, for a `tool_choice` that forces a call.

use super::reasoning::partial_tag;
use serde_json::{json, Map, Value};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
/// The tags, which a vocabulary may have as special tokens.
pub const TAGS: &[&str] = &[OPEN, CLOSE];

/// One call: the function's name and its arguments as a JSON object.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    pub name: String,
    pub arguments: Map<String, Value>,
}

impl Call {
    /// The call as the chat API returns it, with `id`.
    pub fn to_json(&self, id: &str, index: usize) -> Value {
        json!({
            "index": index,
            "id": id,
            "type": "function",
            "function": { "name": self.name, "arguments": Value::Object(self.arguments.clone()).to_string() },
        })
    }
}

/// Whether a parameter's value is written as text (its schema's type is
/// `string`).
fn is_text(schema: &Value) -> bool {
    schema.get("type").and_then(Value::as_str) == Some("string")
}

/// A value of text: anything without `</` (where its closing tag starts).
const TEXT: &str = r"TEXT: /([^<]|<[^\/])*/";

/// Why a request's tools or a model's tool call cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// The request's tools do not make a grammar.
    #[error("{0}")]
    Schema(String),
    /// What the model wrote does not read as calls.
    #[error("{0}")]
    Call(String),
}

/// A Lark grammar (llguidance's dialect) of calls in this format to
/// `tools`, or only to the one named `only`: one call, or with `several`
/// one or more; each function's parameters in the order its schema lists
/// them, the required ones present; a string's value as text, another's
/// as compact JSON under its schema, as the chat template writes them.
/// A tag that `is_token` says is one special token of the vocabulary is
/// that token in the grammar, else its text.
pub fn call_grammar(
    tools: &[Value],
    only: Option<&str>,
    several: bool,
    is_token: impl Fn(&str) -> bool,
) -> Result<String, ToolError> {
    let quote = |text: &str| serde_json::to_string(text).expect("a string serializes");
    let mut rules = Vec::new();
    let mut functions = Vec::new();
    for (at, function) in tools.iter().filter_map(|tool| tool.get("function")).enumerate() {
        let name = function.get("name").and_then(Value::as_str).unwrap_or_default();
        if only.is_some_and(|only| only != name) {
            continue;
        }
        let required: Vec<&str> = function
            .pointer("/parameters/required")
            .and_then(Value::as_array)
            .map(|names| names.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut body = vec![quote(&format!("{name}>\n"))];
        let properties = function.pointer("/parameters/properties").and_then(Value::as_object);
        for (index, (parameter, schema)) in properties.into_iter().flatten().enumerate() {
            let rule = format!("f{at}_p{index}");
            let value = if let Some(Value::Array(choices)) = schema.get("enum").filter(|_| is_text(schema)) {
                // The template writes a string as itself: one of the choices.
                let choices: Vec<String> = choices.iter().filter_map(Value::as_str).map(quote).collect();
                format!("({})", choices.join(" | "))
            } else if is_text(schema) {
                match schema.get("maxLength").and_then(Value::as_u64) {
                    Some(most) => {
                        rules.push(format!("{}: /([^<]|<[^\\/]){{0,{most}}}/", rule.to_uppercase()));
                        rule.to_uppercase()
                    }
                    None => "TEXT".to_string(),
                }
            } else {
                let mut schema = schema.clone();
                if let Value::Object(object) = &mut schema {
                    object.entry("x-guidance").or_insert_with(|| json!({ "whitespace_flexible": false }));
                }
                rules.push(format!("{rule}_value: %json {schema}"));
                format!("{rule}_value")
            };
            let open = quote(&format!("<parameter={parameter}>\n"));
            rules.push(format!("{rule}: {open} {value} \"\\n</parameter>\\n\""));
            body.push(if required.contains(&parameter.as_str()) { rule } else { format!("{rule}?") });
        }
        rules.push(format!("f{at}: {}", body.join(" ")));
        functions.push(format!("f{at}"));
    }
    if functions.is_empty() {
        return Err(ToolError::Schema(match only {
            Some(name) => format!("no tool is named `{name}`"),
            None => "there are no tools to call".into(),
        }));
    }
    let start = if several { "start: call (\"\\n\" call)*" } else { "start: call" };
    let tag = |tag: &str| if is_token(tag) { tag.to_string() } else { quote(tag) };
    let call =
        format!("call: {} \"\\n<function=\" ({}) \"</function>\\n\" {}", tag(OPEN), functions.join(" | "), tag(CLOSE));
    Ok([start.to_string(), call].into_iter().chain(rules).chain([TEXT.to_string()]).collect::<Vec<_>>().join("\n"))
}

pub struct Calls {
    /// Each tool's parameters' JSON types, by tool name, then parameter.
    types: Map<String, Value>,
    held: String,
    calling: bool,
}

impl Calls {
    /// For a request's `tools` (the chat API's `[{"type": "function",
    /// "function": {"name", "parameters"}}]`).
    pub fn new(tools: &[Value]) -> Calls {
        let types = tools
            .iter()
            .filter_map(|tool| {
                let function = tool.get("function")?;
                let name = function.get("name")?.as_str()?;
                let properties = function.pointer("/parameters/properties").cloned().unwrap_or(json!({}));
                Some((name.to_string(), properties))
            })
            .collect();
        Calls { types, held: String::new(), calling: false }
    }

    /// The content that is final, given the next piece of the answer.
    pub fn push(&mut self, piece: &str) -> String {
        self.held.push_str(piece);
        if self.calling {
            return String::new();
        }
        if let Some(at) = self.held.find(OPEN) {
            self.calling = true;
            let content: String = self.held.drain(..at).collect();
            return content.trim_end().to_string();
        }
        // Hold back a possible `<tool_call>` and the white space before it.
        let keep = partial_tag(&self.held, OPEN);
        let ready = self.held[..self.held.len() - keep].trim_end().len();
        self.held.drain(..ready).collect()
    }

    /// At the end of the answer: the content still held, and the calls. A
    /// call that does not read as one leaves its text as content, as it
    /// was written (and the log says why).
    pub fn finish(&mut self) -> (String, Vec<Call>) {
        let held = std::mem::take(&mut self.held);
        if !self.calling {
            return (held, Vec::new());
        }
        match self.calls(&held) {
            Ok(calls) => (String::new(), calls),
            Err(why) => {
                tracing::warn!(%why, "a tool call the model wrote does not read as one; returned as text");
                (held, Vec::new())
            }
        }
    }

    /// The calls in `text`, or why they do not read as calls.
    fn calls(&self, text: &str) -> Result<Vec<Call>, ToolError> {
        let mut calls = Vec::new();
        let mut rest = text;
        while let Some(start) = rest.find(OPEN) {
            let body = &rest[start + OPEN.len()..];
            let end = body.find(CLOSE).ok_or_else(|| ToolError::Call("a <tool_call> is not closed".into()))?;
            calls.push(self.call(&body[..end])?);
            rest = &body[end + CLOSE.len()..];
        }
        Ok(calls)
    }

    fn call(&self, text: &str) -> Result<Call, ToolError> {
        let text = text.trim();
        let inner = text
            .strip_prefix("<function=")
            .ok_or_else(|| ToolError::Call(format!("a tool call without <function=…>: {text}")))?;
        let close = inner.find('>').ok_or_else(|| ToolError::Call("a <function= tag is not closed".into()))?;
        let name = inner[..close].trim().to_string();
        let body = inner[close + 1..].trim_end();
        let body = body
            .strip_suffix("</function>")
            .ok_or_else(|| ToolError::Call(format!("`{name}`'s call has no </function>")))?;
        let mut arguments = Map::new();
        let mut rest = body;
        while let Some(start) = rest.find("<parameter=") {
            let after = &rest[start + "<parameter=".len()..];
            let close = after.find('>').ok_or_else(|| ToolError::Call("a <parameter= tag is not closed".into()))?;
            let parameter = after[..close].trim().to_string();
            let value_and_rest = &after[close + 1..];
            let end = value_and_rest
                .find("</parameter>")
                .ok_or_else(|| ToolError::Call(format!("parameter `{parameter}` of `{name}` has no </parameter>")))?;
            let value = value_and_rest[..end].strip_prefix('\n').unwrap_or(&value_and_rest[..end]);
            let value = value.strip_suffix('\n').unwrap_or(value);
            arguments.insert(parameter.clone(), self.value(&name, &parameter, value));
            rest = &value_and_rest[end + "</parameter>".len()..];
        }
        Ok(Call { name, arguments })
    }

    /// A parameter's text as its schema's type reads it.
    fn value(&self, tool: &str, parameter: &str, text: &str) -> Value {
        let declared = self.types.get(tool).and_then(|p| p.get(parameter)).and_then(|p| p.get("type"));
        match declared.and_then(Value::as_str) {
            Some("string") => Value::String(text.to_string()),
            _ => serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Vec<Value> {
        vec![json!({ "type": "function", "function": { "name": "get_weather", "parameters": {
            "type": "object",
            "properties": { "city": { "type": "string" }, "days": { "type": "integer" }, "zip": { "type": "string" } },
        } } })]
    }

    /// The answer, given a piece at a time: its content and its calls.
    fn read(pieces: &[&str]) -> (String, Vec<Call>) {
        let mut calls = Calls::new(&tools());
        let mut content: String = pieces.iter().map(|piece| calls.push(piece)).collect();
        let (rest, found) = calls.finish();
        content.push_str(&rest);
        (content, found)
    }

    #[test]
    fn calls_are_read_with_their_schema_types_however_the_text_is_cut() {
        let text = "Let me look.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n</parameter>\n\
                    <parameter=days>\n3\n</parameter>\n<parameter=zip>\n94103\n</parameter>\n</function>\n</tool_call>\n\
                    <tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>";
        let expected = (
            "Let me look.".to_string(),
            vec![
                Call {
                    name: "get_weather".into(),
                    arguments: json!({ "city": "San Francisco", "days": 3, "zip": "94103" })
                        .as_object()
                        .unwrap()
                        .clone(),
                },
                Call { name: "get_weather".into(), arguments: json!({ "city": "Paris" }).as_object().unwrap().clone() },
            ],
        );
        assert_eq!(read(&[text]), expected);
        for cut in 1..text.len() {
            assert_eq!(read(&[&text[..cut], &text[cut..]]), expected, "cut at {cut}");
        }
    }

    #[test]
    fn text_without_calls_is_all_content() {
        assert_eq!(read(&["a < b, and <tool", " is not a call"]), ("a < b, and <tool is not a call".into(), vec![]));
        assert_eq!(read(&["ends with <tool_"]), ("ends with <tool_".into(), vec![]));
    }

    /// A call that does not read as one is said why, and its text is kept
    /// as the answer's content rather than lost.
    #[test]
    fn a_broken_call_stays_text() {
        let calls = Calls::new(&tools());
        let unclosed = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n";
        assert!(calls.calls(unclosed).unwrap_err().to_string().contains("not closed"));
        let unended = "<tool_call>\n<function=f>\n<parameter=x>\n1\n</function>\n</tool_call>";
        assert!(calls.calls(unended).unwrap_err().to_string().contains("no </parameter>"));
        assert_eq!(read(&["So: ", unclosed]), (format!("So:{unclosed}"), vec![]));
    }

    #[test]
    fn a_call_is_returned_as_the_chat_api_does() {
        let call = Call { name: "f".into(), arguments: json!({ "x": 1 }).as_object().unwrap().clone() };
        let value = call.to_json("call_1", 0);
        assert_eq!(value["function"]["arguments"], "{\"x\":1}");
        assert_eq!(value["type"], "function");
    }
}
