//! Reading a completion request: the prompt (text, token ids, or chat
//! messages through the model's template), the sampling settings with
//! OpenAI's ranges, and what is refused by name. Nothing here runs the
//! model; a refusal is the HTTP response that says why.

use super::batching::{Job, Update};
use super::{bad, error, Served};
use axum::http::StatusCode;
use axum::response::Response;
use linnet_runtime::constrain::{Constraint, Spec};
use linnet_runtime::sampling::Sampling;
use serde_json::{Map, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

pub struct Request {
    /// The prompts: one, or each of a completions request's list.
    pub prompts: Vec<Vec<i64>>,
    /// The completions API's `echo`: each choice's text starts with its
    /// prompt's.
    pub echo: bool,
    /// The tools the model may call (the chat API's `tools`), whose calls
    /// the answer is read for.
    pub tools: Vec<Value>,
    /// One job per choice (`n` for each prompt, the prompts in order),
    /// each with its own seed.
    pub jobs: Vec<Job>,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with the usage.
    pub stream_usage: bool,
    /// Stop strings: the answer ends before the first one generated.
    pub stops: Vec<String>,
    /// Each choice's updates, in the order of `jobs`.
    pub receivers: Vec<UnboundedReceiver<Update>>,
}

/// The most choices a request may ask for (each takes a row).
const MOST_CHOICES: u64 = 16;

/// The most tokens a request may have drafted a step.
const MOST_DRAFTS: u64 = 64;

/// A field that must be a number in a range, or absent.
fn number(body: &Value, name: &str, default: f64, range: std::ops::RangeInclusive<f64>) -> Result<f64, Response> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(value) => match value.as_f64() {
            Some(v) if range.contains(&v) => Ok(v),
            Some(v) => Err(bad(format!("`{name}` must be in {}..={}, got {v}", range.start(), range.end()), name)),
            None => Err(bad(format!("`{name}` must be a number, got {value}"), name)),
        },
    }
}

/// A field that must be a whole number in a range, or absent: `2.7` is
/// refused, not taken as 2, and so is a float past what a `u64` holds.
fn whole(body: &Value, name: &str, default: u64, range: std::ops::RangeInclusive<u64>) -> Result<u64, Response> {
    let value = match body.get(name) {
        None | Some(Value::Null) => return Ok(default),
        Some(value) => value,
    };
    let exact = value
        .as_u64()
        .or_else(|| value.as_f64().filter(|v| v.fract() == 0.0 && *v >= 0.0 && *v < 2f64.powi(53)).map(|v| v as u64));
    match exact {
        Some(v) if range.contains(&v) => Ok(v),
        _ => Err(bad(
            format!("`{name}` must be a whole number from {} to {}, got {value}", range.start(), range.end()),
            name,
        )),
    }
}

/// Whether a field's value means "not asked for".
type Unasked = fn(&Value) -> bool;

/// Request fields that would change the answer and that this server does
/// not do yet, with the value that means "not asked for": a request that
/// asks for one is refused, never answered as if it had not.
const NOT_YET: [(&str, Unasked); 6] = [
    ("best_of", |v| v.as_f64() == Some(1.0)),
    ("functions", |v| v.as_array().is_some_and(Vec::is_empty)),
    ("function_call", |v| v.as_str() == Some("none")),
    // The prompt's own log-probabilities need the logits of every prompt
    // position, which the serving entries do not return.
    ("prompt_logprobs", |v| v.as_u64() == Some(0) || v == &Value::Bool(false)),
    // Filling in between a prompt and a suffix needs a model trained for it.
    ("suffix", |v| v.as_str() == Some("")),
    // The chat API's `echo` (the last message again); the completions
    // API's is honoured.
    ("echo", |v| v == &Value::Bool(false)),
];

/// The most alternatives a token's log-probabilities come with, as OpenAI
/// allows.
const MOST_LOGPROBS: u64 = 20;

/// Whether to report log-probabilities, and how many alternatives: the chat
/// API's `logprobs: true` with `top_logprobs: N`, or the completions API's
/// `logprobs: N`.
fn logprobs(body: &Value, chat: bool) -> Result<Option<usize>, Response> {
    if !chat {
        return match body.get("logprobs") {
            None | Some(Value::Null) | Some(Value::Bool(false)) => Ok(None),
            Some(_) => Ok(Some(whole(body, "logprobs", 0, 0..=MOST_LOGPROBS)? as usize)),
        };
    }
    let asked = flag(body, "logprobs", false)?;
    let top = whole(body, "top_logprobs", 0, 0..=MOST_LOGPROBS)? as usize;
    if top > 0 && !asked {
        return Err(bad("`top_logprobs` needs `logprobs: true`", "top_logprobs"));
    }
    Ok(asked.then_some(top))
}

/// `model`, where given, must be the model served (404 otherwise, as
/// OpenAI's API answers).
pub fn check_model(served: &Served, body: &Value) -> Result<(), Response> {
    match body.get("model") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(name)) if *name == served.limits.model => Ok(()),
        Some(other) => Err(error(
            StatusCode::NOT_FOUND,
            format!("this server runs `{}`, not {other}", served.limits.model),
            Some("model"),
        )),
    }
}

/// A field that must be a boolean, or absent.
pub fn flag(body: &Value, name: &str, default: bool) -> Result<bool, Response> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(value)) => Ok(*value),
        Some(other) => Err(bad(format!("`{name}` must be a boolean, got {other}"), name)),
    }
}

/// `top_k`: 0 or -1 (vLLM's "off") keep every token.
fn top_k(body: &Value, vocab: usize) -> Result<usize, Response> {
    if body.get("top_k").and_then(Value::as_i64) == Some(-1) {
        return Ok(0);
    }
    Ok(whole(body, "top_k", 0, 0..=vocab as u64)? as usize)
}

/// OpenAI's `logit_bias`: token ids (as the object's keys) to a bias from
/// -100 to 100, added to their logits before sampling.
fn logit_bias(body: &Value, vocab: usize) -> Result<Vec<(usize, f64)>, Response> {
    let biases = match body.get("logit_bias") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Object(biases)) => biases,
        Some(other) => {
            return Err(bad(
                format!("`logit_bias` must be an object of token ids to biases, got {other}"),
                "logit_bias",
            ))
        }
    };
    biases
        .iter()
        .map(|(token, given)| {
            let id = token.parse::<usize>().ok().filter(|&id| id < vocab);
            let bias = given.as_f64().filter(|b| (-100.0..=100.0).contains(b));
            match (id, bias) {
                (Some(id), Some(bias)) => Ok((id, bias)),
                (None, _) => {
                    Err(bad(format!("`logit_bias` names `{token}`, not a token id in 0..{vocab}"), "logit_bias"))
                }
                (_, None) => Err(bad(
                    format!("`logit_bias` of {token} must be a number from -100 to 100, got {given}"),
                    "logit_bias",
                )),
            }
        })
        .collect()
}

/// A seed no other request of this process has drawn: the process's own
/// random keys (`RandomState`) over a count and the time.
fn fresh_seed() -> u64 {
    use std::hash::BuildHasher;
    static DRAWN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let count = DRAWN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let time = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    std::collections::hash_map::RandomState::new().hash_one((count, time))
}

/// `thinking`: the prompt leaves the model inside a `<think>` block (a
/// constrained answer closes it first).
pub fn parse_request(
    served: &Served,
    body: &Value,
    prompts: Vec<Vec<i64>>,
    chat: bool,
    thinking: bool,
) -> Result<Request, Response> {
    let limits = &served.limits;
    check_model(served, body)?;
    for (field, unasked) in NOT_YET.iter().filter(|(field, _)| chat || *field != "echo") {
        match body.get(*field) {
            None | Some(Value::Null) => {}
            Some(value) if unasked(value) => {}
            Some(value) => return Err(bad(format!("`{field}` ({value}) is not supported by this server yet"), field)),
        }
    }
    if prompts.is_empty() {
        return Err(bad("`prompt` is an empty list", "prompt"));
    }
    for prompt in &prompts {
        if prompt.is_empty() {
            return Err(bad("the prompt is empty", "prompt"));
        }
        if let Some(token) = prompt.iter().find(|&&t| t < 0 || t as usize >= limits.vocab) {
            return Err(bad(format!("token {token} is outside the vocabulary (0..{})", limits.vocab), "prompt"));
        }
        if prompt.len() >= limits.max_seq {
            return Err(bad(
                format!("the prompt has {} tokens; this model holds {} positions", prompt.len(), limits.max_seq),
                "prompt",
            ));
        }
    }
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let room = (limits.max_seq - longest) as u64;
    // `max_completion_tokens` is the chat API's newer name for it. Without
    // either, an answer may run to the end of the context, as vLLM's and
    // OpenAI's do.
    let limit_field = if body.get("max_completion_tokens").is_some_and(|v| !v.is_null()) {
        "max_completion_tokens"
    } else {
        "max_tokens"
    };
    let asked_tokens = match body.get(limit_field) {
        None | Some(Value::Null) => None,
        Some(_) => Some(whole(body, limit_field, room, 1..=room)? as usize),
    };
    let top_p = number(body, "top_p", 1.0, 0.0..=1.0)?;
    if top_p == 0.0 {
        return Err(bad("`top_p` must be in (0, 1], got 0", "top_p"));
    }
    let sampling = Sampling {
        temperature: number(body, "temperature", 1.0, 0.0..=100.0)?,
        top_p,
        top_k: top_k(body, limits.vocab)?,
        min_p: number(body, "min_p", 0.0, 0.0..=1.0)?,
        repetition_penalty: number(body, "repetition_penalty", 1.0, 0.01..=100.0)?,
        frequency_penalty: number(body, "frequency_penalty", 0.0, -2.0..=2.0)?,
        presence_penalty: number(body, "presence_penalty", 0.0, -2.0..=2.0)?,
        logit_bias: logit_bias(body, limits.vocab)?,
    };
    sampling.validate().map_err(|error| bad(error.to_string(), "sampling"))?;
    // Without a seed, each request samples afresh, as OpenAI's and vLLM's.
    let seed = match body.get("seed") {
        None | Some(Value::Null) => fresh_seed(),
        Some(_) => whole(body, "seed", 0, 0..=u64::MAX)?,
    };
    let echo = !chat && flag(body, "echo", false)?;
    let ignore_eos = flag(body, "ignore_eos", false)?;
    let stream = flag(body, "stream", false)?;
    let stream_usage = stream_usage(body, stream)?;
    let stops = stop_strings(body)?;
    if !stops.is_empty() && served.text.is_none() {
        return Err(bad("`stop` strings need a tokenizer, and this model has none", "stop"));
    }
    // `ignore_eos`: the end of turn does not end the answer (benchmarks).
    let stop = match ignore_eos {
        true => Vec::new(),
        false => served.text.as_ref().map(|t| t.end_ids.clone()).unwrap_or_default(),
    };
    let logprobs = logprobs(body, chat)?;
    if echo && logprobs.is_some() {
        return Err(bad(
            "`echo` with `logprobs` needs the prompt's log-probabilities, which this server does not give yet",
            "echo",
        ));
    }
    let (tools, forced_calls) = tools(served, body, chat)?;
    let choices = whole(body, "n", 1, 1..=MOST_CHOICES)?;
    // An extension: the most tokens drafted a step for this request
    // (n-gram lookup), the server's `--draft` where it says nothing.
    let draft = whole(body, "num_speculative_tokens", served.draft as u64, 0..=MOST_DRAFTS)? as usize;
    if draft > 0 && !limits.verifies {
        return Err(bad("this model has no `verify_slots` entry: it cannot check drafts", "num_speculative_tokens"));
    }
    let structured = match (structured(body)?, forced_calls) {
        (Some((_, field)), Some(_)) => {
            return Err(bad(format!("`{field}` and a forced `tool_choice` cannot both constrain the answer"), field))
        }
        (structured, forced) => structured.or(forced.map(|spec| (spec, "tool_choice"))),
    };
    // Choice `i` samples from `seed + i`: the first is the answer `n: 1`
    // gives, and the same request gives the same choices.
    // Compiled once; each choice follows its own copy.
    let constraint = structured
        .map(|(spec, field)| {
            let grammars = served.grammars.as_ref().map_err(|why| bad(format!("`{field}`: {why}"), field))?;
            let after = thinking.then_some("</think>\n\n");
            // A grammar that does not compile is the request's fault; anything
            // else (the tokenizer failing on the forced text) is the server's.
            grammars.constraint(&spec, after).map_err(|why| match why.is_callers() {
                true => bad(format!("`{field}` does not compile: {why}"), field),
                false => error(StatusCode::INTERNAL_SERVER_ERROR, format!("`{field}`: {why}"), Some(field)),
            })
        })
        .transpose()?;
    let (jobs, receivers) = prompts
        .iter()
        .flat_map(|prompt| (0..choices).map(move |choice| (prompt, choice)))
        .map(|(prompt, choice)| {
            let (updates, receiver) = unbounded_channel();
            let seed = seed.wrapping_add(choice);
            let job = Job {
                prompt: prompt.clone(),
                max_tokens: asked_tokens.unwrap_or(limits.max_seq - prompt.len()),
                sampling: sampling.clone(),
                seed,
                stop: stop.clone(),
                logprobs,
                constraint: constraint.as_ref().map(Constraint::copy),
                draft,
                updates,
                cached: Default::default(),
                started: Default::default(),
            };
            (job, receiver)
        })
        .unzip();
    Ok(Request { prompts, echo, tools, jobs, stream, stream_usage, stops, receivers })
}

/// What the answer must match, and the field that says so: OpenAI's
/// `response_format` (`json_object`, `json_schema`), or vLLM's
/// `structured_outputs` (`json`, `regex`, `grammar`) and its older
/// `guided_json`, `guided_regex`, `guided_grammar`. At most one of them.
fn structured(body: &Value) -> Result<Option<(Spec, &'static str)>, Response> {
    let mut found = Vec::new();
    if let Some(format) = body.get("response_format").filter(|v| !v.is_null()) {
        let spec = match format.get("type").and_then(Value::as_str) {
            Some("text") => None,
            Some("json_object") => Some(Spec::JsonSchema(serde_json::json!({ "type": "object" }))),
            Some("json_schema") => match format.get("json_schema").and_then(|j| j.get("schema")) {
                Some(schema) if schema.is_object() || schema.is_boolean() => Some(Spec::JsonSchema(schema.clone())),
                _ => return Err(bad("`response_format.json_schema.schema` must be a JSON schema", "response_format")),
            },
            _ => {
                return Err(bad(
                    format!("`response_format` must have `type` text, json_object or json_schema, got {format}"),
                    "response_format",
                ))
            }
        };
        found.extend(spec.map(|spec| (spec, "response_format")));
    }
    let text = |value: &Value, field: &'static str| match value {
        Value::String(text) => Ok(text.clone()),
        other => Err(bad(format!("`{field}` must be a string, got {other}"), field)),
    };
    // A schema given as an object, or as its JSON text.
    let schema = |value: &Value, field: &'static str| match value {
        Value::String(text) => serde_json::from_str::<Value>(text)
            .map(Spec::JsonSchema)
            .map_err(|e| bad(format!("`{field}` is not JSON: {e}"), field)),
        Value::Object(_) | Value::Bool(_) => Ok(Spec::JsonSchema(value.clone())),
        other => Err(bad(format!("`{field}` must be a JSON schema, got {other}"), field)),
    };
    for (field, value) in ["guided_json", "guided_regex", "guided_grammar", "guided_choice", "json_schema", "grammar"]
        .iter()
        .filter_map(|&field| Some((field, body.get(field).filter(|v| !v.is_null())?)))
    {
        found.push(match field {
            // vLLM's older names, and llama-server's `json_schema` and
            // `grammar` (GBNF, read as Lark).
            "guided_json" | "json_schema" => (schema(value, field)?, field),
            "guided_regex" => (Spec::Regex(text(value, field)?), field),
            "guided_choice" => (choice(value, field)?, field),
            "grammar" => {
                let lark = linnet_runtime::gbnf::to_lark(&text(value, field)?)
                    .map_err(|why| bad(format!("`grammar` is not GBNF: {why}"), field))?;
                (Spec::Lark(lark), field)
            }
            _ => (Spec::Lark(text(value, field)?), field),
        });
    }
    if let Some(outputs) = body.get("structured_outputs").filter(|v| !v.is_null()) {
        let field = "structured_outputs";
        let Some(outputs) = outputs.as_object() else {
            return Err(bad(format!("`{field}` must be an object, got {outputs}"), field));
        };
        for (key, value) in outputs {
            found.push(match key.as_str() {
                "json" => (schema(value, field)?, field),
                "regex" => (Spec::Regex(text(value, field)?), field),
                "grammar" => (Spec::Lark(text(value, field)?), field),
                "choice" => (choice(value, field)?, field),
                other => {
                    return Err(bad(format!("`{field}.{other}` is not supported by this server yet"), field));
                }
            });
        }
    }
    match found.len() {
        0 | 1 => Ok(found.pop()),
        _ => {
            let fields: Vec<&str> = found.iter().map(|(_, field)| *field).collect();
            Err(bad(format!("give one output constraint, not {}", fields.join(" and ")), fields[1]))
        }
    }
}

/// vLLM's `choice`: the answer is one of these strings, exactly.
fn choice(value: &Value, field: &'static str) -> Result<Spec, Response> {
    let choices: Option<Vec<&str>> = value.as_array().and_then(|items| items.iter().map(Value::as_str).collect());
    match choices {
        Some(choices) if !choices.is_empty() => {
            let alternatives: Vec<String> = choices.iter().map(|choice| regex_literal(choice)).collect();
            Ok(Spec::Regex(alternatives.join("|")))
        }
        _ => Err(bad(format!("`{field}` must be a non-empty list of strings, got {value}"), field)),
    }
}

/// `text` as a regular expression that matches it alone: every character
/// but letters and digits escaped as `\x{…}`.
fn regex_literal(text: &str) -> String {
    text.chars().map(|c| if c.is_alphanumeric() { c.to_string() } else { format!("\\x{{{:x}}}", c as u32) }).collect()
}

/// `stream_options: {"include_usage": bool}`, which only a stream takes.
fn stream_usage(body: &Value, stream: bool) -> Result<bool, Response> {
    let options = match body.get("stream_options") {
        None | Some(Value::Null) => return Ok(false),
        Some(Value::Object(options)) if stream => options,
        Some(Value::Object(_)) => return Err(bad("`stream_options` is for `stream: true`", "stream_options")),
        Some(other) => return Err(bad(format!("`stream_options` must be an object, got {other}"), "stream_options")),
    };
    if let Some(unknown) = options.keys().find(|key| *key != "include_usage") {
        return Err(bad(format!("`stream_options.{unknown}` is not supported by this server yet"), "stream_options"));
    }
    match options.get("include_usage") {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(asked)) => Ok(*asked),
        Some(other) => {
            Err(bad(format!("`stream_options.include_usage` must be a boolean, got {other}"), "stream_options"))
        }
    }
}

/// The tools a chat may call: `tools`, each `{"type": "function",
/// "function": {"name", …}}`, unless `tool_choice` is `"none"`; and, for
/// a choice that forces a call (`"required"`, a named function), the
/// grammar of such calls that constrains the answer.
fn tools(served: &Served, body: &Value, chat: bool) -> Result<(Vec<Value>, Option<Spec>), Response> {
    let tools = match body.get("tools") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(tools)) if !chat && !tools.is_empty() => {
            return Err(bad("`tools` belong to the chat API (/v1/chat/completions)", "tools"))
        }
        Some(Value::Array(tools)) => tools.clone(),
        Some(other) => return Err(bad(format!("`tools` must be an array, got {other}"), "tools")),
    };
    if let Some(tool) = tools.iter().find(|tool| {
        tool.get("type").and_then(Value::as_str) != Some("function")
            || tool.pointer("/function/name").and_then(Value::as_str).is_none()
    }) {
        return Err(bad(
            format!("each tool must be {{\"type\": \"function\", \"function\": {{\"name\": …}}}}, got {tool}"),
            "tools",
        ));
    }
    // A forced call is a grammar of calls (one, or several unless
    // `parallel_tool_calls` is false).
    let several = body.get("parallel_tool_calls").and_then(Value::as_bool).unwrap_or(true);
    let forced = |only: Option<&str>| {
        super::tools::call_grammar(&tools, only, several, |tag| served.tag_is_token(tag))
            .map(|grammar| Some(Spec::Lark(grammar)))
            .map_err(|why| bad(format!("`tool_choice`: {why}"), "tool_choice"))
    };
    let spec = match body.get("tool_choice") {
        None | Some(Value::Null) => None,
        Some(Value::String(choice)) if choice == "auto" => None,
        Some(Value::String(choice)) if choice == "none" => return Ok((Vec::new(), None)),
        Some(Value::String(choice)) if choice == "required" => forced(None)?,
        Some(choice) => match choice.pointer("/function/name").and_then(Value::as_str) {
            Some(name) if choice.get("type").and_then(Value::as_str) == Some("function") => forced(Some(name))?,
            _ => {
                return Err(bad(
                    format!("`tool_choice` must be \"none\", \"auto\", \"required\" or {{\"type\": \"function\", \"function\": {{\"name\": …}}}}, got {choice}"),
                    "tool_choice",
                ))
            }
        },
    };
    Ok((tools, spec))
}

/// `stop`: absent, one string, or up to four non-empty strings.
fn stop_strings(body: &Value) -> Result<Vec<String>, Response> {
    let refused = || bad("`stop` must be a string or a list of at most 4 non-empty strings", "stop");
    let stops = match body.get("stop") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::String(stop)) => vec![stop.clone()],
        Some(Value::Array(items)) if items.len() <= 4 => items
            .iter()
            .map(|item| item.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(refused)?,
        Some(_) => return Err(refused()),
    };
    if stops.iter().any(String::is_empty) {
        return Err(refused());
    }
    Ok(stops)
}

/// A request's prompts (a chat's one, or a completions request's each)
/// as token ids, and whether they leave the model thinking (a chat
/// template that opened a `<think>` block).
pub type Prompt = (Vec<Vec<i64>>, bool);

/// `/v1/completions`' prompt: text through the tokenizer, token ids, or a
/// list of either (one answer for each, as vLLM gives).
pub fn prompt_of(served: &Served, body: &Value) -> Result<Prompt, Response> {
    let prompt = body.get("prompt").ok_or_else(|| bad("`prompt` is required", "prompt"))?;
    let prompts = match prompt {
        Value::Array(items) if !items.is_empty() && items.iter().all(|item| item.is_string() || item.is_array()) => {
            items.iter().map(|item| one_prompt(served, item)).collect::<Result<_, _>>()?
        }
        one => vec![one_prompt(served, one)?],
    };
    Ok((prompts, false))
}

fn one_prompt(served: &Served, prompt: &Value) -> Result<Vec<i64>, Response> {
    match prompt {
        Value::String(text) => match &served.text {
            Some(text_model) => text_model.encode_prompt(text).map_err(|e| bad(e.to_string(), "prompt")),
            None => Err(bad("this model has no tokenizer: send the prompt as token ids", "prompt")),
        },
        Value::Array(items) if items.iter().all(Value::is_i64) => Ok(items.iter().filter_map(Value::as_i64).collect()),
        other => Err(bad(
            format!("`prompt` must be a string, an array of token ids, or a list of either, got {other}"),
            "prompt",
        )),
    }
}

/// A message's content: a string, or text parts (`[{"type": "text",
/// "text": …}]`) joined; `None` for anything else (an image part, say).
fn text_of(content: &Value) -> Option<String> {
    match content {
        Value::String(text) => Some(text.clone()),
        Value::Array(parts) => parts
            .iter()
            .map(|part| {
                (part.get("type")?.as_str()? == "text")
                    .then(|| part.get("text")?.as_str().map(str::to_string))
                    .flatten()
            })
            .collect(),
        _ => None,
    }
}

/// The messages as the template reads them: each an object with a string
/// `role` and its text `content` (text parts joined), its other fields
/// kept.
fn chat_messages(body: &Value) -> Result<Vec<Value>, Response> {
    let Some(Value::Array(messages)) = body.get("messages") else {
        return Err(bad("`messages` must be an array of {role, content}", "messages"));
    };
    if messages.is_empty() {
        return Err(bad("`messages` is empty: a chat needs at least one message", "messages"));
    }
    messages
        .iter()
        .map(|message| {
            let calls = message.get("tool_calls").and_then(Value::as_array);
            // An assistant's turn that only called tools has no content.
            let content = match message.get("content") {
                None | Some(Value::Null) if calls.is_some() => Some(String::new()),
                content => content.and_then(text_of),
            };
            match (message.as_object(), message.get("role").and_then(Value::as_str), content) {
                (Some(fields), Some(_), Some(content)) => {
                    let mut fields = fields.clone();
                    fields.insert("content".into(), Value::String(content));
                    if let Some(calls) = calls {
                        fields
                            .insert("tool_calls".into(), Value::Array(calls.iter().map(arguments_as_object).collect()));
                    }
                    Ok(Value::Object(fields))
                }
                _ => Err(bad(
                    format!("each message needs a string `role` and text `content`, got {message}"),
                    "messages",
                )),
            }
        })
        .collect()
}

/// A past tool call as templates read it: the API sends its arguments as
/// a JSON string, templates walk them as a mapping.
fn arguments_as_object(call: &Value) -> Value {
    let mut call = call.clone();
    if let Some(arguments) = call.pointer_mut("/function/arguments") {
        if let Some(parsed) = arguments.as_str().and_then(|text| serde_json::from_str::<Value>(text).ok()) {
            *arguments = parsed;
        }
    }
    call
}

/// `chat_template_kwargs`: the template's own variables (`enable_thinking`).
fn template_options(body: &Value) -> Result<Map<String, Value>, Response> {
    match body.get("chat_template_kwargs") {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(options)) => Ok(options.clone()),
        Some(other) => {
            Err(bad(format!("`chat_template_kwargs` must be an object, got {other}"), "chat_template_kwargs"))
        }
    }
}

/// The text a chat request's messages make, through the model's template
/// (or, without one, the contents joined by lines). As vLLM's:
/// `add_generation_prompt: false` leaves the assistant's turn unopened,
/// `continue_final_message: true` leaves the last message open for the
/// answer to continue (the rendering cut after its content), and a
/// `developer` message is a `system` one where the template has no
/// `developer` turn.
pub fn chat_text(served: &Served, body: &Value) -> Result<String, Response> {
    let mut messages = chat_messages(body)?;
    let mut options = template_options(body)?;
    let (tools, _) = tools(served, body, true)?;
    if !tools.is_empty() {
        options.insert("tools".into(), Value::Array(tools));
    }
    let Some(text) = &served.text else {
        return Err(bad("this model has no tokenizer, so it cannot chat", "messages"));
    };
    let continues = flag(body, "continue_final_message", false)?;
    let generation_prompt = flag(body, "add_generation_prompt", !continues)?;
    if continues && generation_prompt {
        return Err(bad(
            "`continue_final_message` and `add_generation_prompt` cannot both be true",
            "continue_final_message",
        ));
    }
    options.insert("add_generation_prompt".into(), Value::Bool(generation_prompt));
    if !text.template_knows_role("developer") {
        for message in messages.iter_mut().filter(|message| message["role"] == "developer") {
            message["role"] = Value::from("system");
        }
    }
    let rendered = if text.has_chat_template() {
        text.chat(&messages, &options).map_err(|e| bad(e.to_string(), "messages"))?
    } else {
        messages.iter().filter_map(|m| m["content"].as_str()).collect::<Vec<_>>().join("\n")
    };
    if !continues {
        return Ok(rendered);
    }
    let last = messages.last().and_then(|message| message["content"].as_str()).unwrap_or_default();
    match rendered.rfind(last) {
        Some(at) if !last.is_empty() => Ok(rendered[..at + last.len()].to_string()),
        _ => Err(bad(
            "`continue_final_message`: the template does not render the last message's content as it is",
            "continue_final_message",
        )),
    }
}

/// `/v1/chat/completions`' prompt: the chat's text, tokenized.
pub fn chat_prompt(served: &Served, body: &Value) -> Result<Prompt, Response> {
    let prompt = chat_text(served, body)?;
    let text = served.text.as_ref().expect("chat_text needs a tokenizer");
    let ids = text.encode(&prompt).map_err(|e| bad(e.to_string(), "messages"))?;
    Ok((vec![ids], super::reasoning::prompt_opens_thinking(&prompt)))
}
