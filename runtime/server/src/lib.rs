//! `linnet serve`: an OpenAI-compatible HTTP server (axum on tokio) with
//! continuous batching through the model's own entries (`batching`).
//! `request` reads what a client asks for, `metrics` counts what was done,
//! `prefix` keeps what prompts left in their rows for the prompts after.
//! Routes: `/v1/completions`, `/v1/chat/completions`, `/v1/models` and
//! `/v1/models/{id}`, `/tokenize`, `/detokenize`, `/metrics`, `/health`
//! (liveness), `/ready` (readiness). With an API key, every route but
//! `/health`, `/ready` and `/metrics` needs it. SIGTERM or Ctrl-C drains.

// The error side of request parsing is an HTTP response, built only when
// a request is refused.
#![allow(clippy::result_large_err)]

mod batching;
pub mod kv_events;
mod metrics;
mod prefix;
mod reasoning;
mod request;
mod tools;

pub use batching::{limits, run_batches, Job, Limits, Load, StateBytes, Update};

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Request as HttpRequest, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use linnet_runtime::constrain::Grammars;
use linnet_runtime::sampling::Logprobs;
use linnet_runtime::stops::Detokenizer;
use linnet_runtime::text::TextModel;
use linnet_runtime::Loaded;
use metrics::Metrics;
use reasoning::Split;
use request::{chat_prompt, chat_text, check_model, parse_request, prompt_of, Prompt, Request};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::StreamExt;
use tools::Calls;

/// What the HTTP side knows of the model: enough to read and answer
/// requests, not to run them.
pub struct Served {
    pub limits: Limits,
    pub text: Option<TextModel>,
    /// Constrained output over the model's tokenizer, or why there is none.
    pub grammars: Result<Grammars, linnet_runtime::Error>,
    /// The chat tags (`<think>`, `<tool_call>`, …) that this vocabulary
    /// has as special tokens: a chat answer's text shows them, for the
    /// parsers that split reasoning and calls out of it.
    chat_tags: Vec<u32>,
    /// The most tokens drafted a step for a request that does not say
    /// (`--speculative ngram --draft N`; 0: none).
    pub draft: usize,
}

impl Served {
    pub fn new(limits: Limits, text: Option<TextModel>) -> Served {
        let grammars = match &text {
            Some(text) => Grammars::new(text, limits.vocab, text.end_ids.first().map_or(0, |&id| id as u32)),
            None => {
                Err(linnet_runtime::Error::Text("constrained output needs a tokenizer, and this model has none".into()))
            }
        };
        let chat_tags = text
            .as_ref()
            .map(|text| reasoning::TAGS.iter().chain(tools::TAGS).filter_map(|tag| text.special_token(tag)).collect())
            .unwrap_or_default();
        Served { limits, text, grammars, chat_tags, draft: 0 }
    }

    /// Drafts of up to `draft` tokens a step for every request that does
    /// not say otherwise.
    pub fn with_draft(self, draft: usize) -> Served {
        Served { draft, ..self }
    }

    /// Whether `tag` is one special token of this model's vocabulary.
    fn tag_is_token(&self, tag: &str) -> bool {
        self.text.as_ref().is_some_and(|text| text.special_token(tag).is_some())
    }

    /// Reads a request body as `/v1/completions` (or, with `chat`,
    /// `/v1/chat/completions`) does, without running it: the prompt's
    /// token ids, or the refusal's HTTP status. For fuzzing and tests.
    pub fn read(&self, body: &[u8], chat: bool) -> Result<Vec<i64>, u16> {
        let body: Value = serde_json::from_slice(body).map_err(|_| StatusCode::BAD_REQUEST.as_u16())?;
        let prompt = if chat { chat_prompt(self, &body) } else { prompt_of(self, &body) };
        prompt
            .and_then(|(prompts, thinking)| parse_request(self, &body, prompts, chat, thinking))
            .map(|request| request.prompts.concat())
            .map_err(|refusal| refusal.status().as_u16())
    }
}

/// How `linnet serve` listens.
pub struct Options {
    pub host: String,
    pub port: u16,
    /// Requests that may wait for a row beyond the model's rows; more are
    /// answered 429 with `Retry-After`.
    pub queue: usize,
    /// The bearer token every `/v1` route (and `/tokenize`, `/detokenize`)
    /// requires, if any.
    pub api_key: Option<String>,
    /// The prefix cache's budget in bytes (0: no prefix cache) and its
    /// block, in tokens: snapshots are taken at multiples of it.
    pub prefix_cache_bytes: usize,
    pub prefix_block: usize,
    /// How long a drain (on SIGTERM or Ctrl-C) lets held requests finish
    /// before it ends them.
    pub drain_timeout: std::time::Duration,
    /// Where the prefix cache's changes are published for routers, if
    /// anywhere (`--kv-events-config`).
    pub kv_events: Option<kv_events::KvEventsConfig>,
    /// The most tokens drafted a step (n-gram lookup) for requests that do
    /// not say (`num_speculative_tokens`); 0: none.
    pub draft: usize,
}

struct App {
    jobs: std::sync::Mutex<mpsc::Sender<Job>>,
    served: Served,
    /// Requests running or waiting for a row now, and the most allowed:
    /// past it, a request is answered 429 at once rather than queued.
    held: Arc<AtomicUsize>,
    capacity: usize,
    metrics: Metrics,
    load: Arc<Load>,
    api_key: Option<String>,
    /// Set on SIGTERM or Ctrl-C: new requests are refused (503) while
    /// those held finish.
    draining: AtomicBool,
}

fn error(status: StatusCode, message: impl Into<String>, param: Option<&str>) -> Response {
    (status, Json(error_object(status, message, param))).into_response()
}

/// OpenAI's error object, as a response's body or a stream's last event:
/// `invalid_request_error` for the request's fault, `requests` with code
/// `rate_limit_exceeded` for too many, `server_error` for the server's
/// (logged, as the client's view of it may be all there is).
fn error_object(status: StatusCode, message: impl Into<String>, param: Option<&str>) -> Value {
    let message = message.into();
    let (kind, code) = match status {
        StatusCode::TOO_MANY_REQUESTS => ("requests", json!("rate_limit_exceeded")),
        status if status.is_client_error() => ("invalid_request_error", Value::Null),
        _ => {
            tracing::error!(status = status.as_u16(), %message, "answered with a server error");
            ("server_error", Value::Null)
        }
    };
    json!({ "error": { "message": message, "type": kind, "param": param, "code": code } })
}

fn bad(message: impl Into<String>, param: &str) -> Response {
    error(StatusCode::BAD_REQUEST, message, Some(param))
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A response id no other response of this server shares: the time it
/// started and a count.
fn response_id(prefix: &str) -> String {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let started = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    format!("{prefix}-{started:x}{:06x}", COUNT.fetch_add(1, Ordering::Relaxed))
}

/// Times a request's tokens for `/metrics`: the first from admission, each
/// later one from the one before.
struct Clock {
    last: Instant,
    first: bool,
}

impl Clock {
    fn tick(&mut self, metrics: &Metrics) {
        let now = Instant::now();
        metrics.token(self.first, now.duration_since(self.last).as_secs_f64());
        self.first = false;
        self.last = now;
    }
}

/// A token as log-probabilities name it: its text where the model has a
/// tokenizer (with U+FFFD for a part of a character), else its id.
fn token_text(text: Option<&TextModel>, token: i64) -> String {
    text.map_or_else(|| format!("token_id:{token}"), |text| text.decode_with_specials(&[token]))
}

/// A token's own bytes, whole where it holds part of a character: what a
/// client joins to rebuild the text.
fn token_bytes(text: Option<&TextModel>, token: i64) -> Vec<u8> {
    text.map_or_else(|| token_text(None, token).into_bytes(), |text| text.token_bytes(token))
}

/// Tokens' log-probabilities as the API returns them: the chat API's
/// `{"content": [{token, logprob, bytes, top_logprobs}]}`, or the
/// completions API's `{tokens, token_logprobs, top_logprobs, text_offset}`
/// (`offset`: where the first token's text starts in the answer).
fn logprobs_json(text: Option<&TextModel>, tokens: &[(i64, Logprobs)], chat: bool, offset: usize) -> Value {
    let entry = |token: i64, logprob: f64| {
        let piece = token_text(text, token);
        json!({ "token": piece, "logprob": logprob, "bytes": token_bytes(text, token) })
    };
    if chat {
        let content: Vec<Value> = tokens
            .iter()
            .map(|(token, found)| {
                let mut chosen = entry(*token, found.chosen);
                chosen["top_logprobs"] = found.top.iter().map(|&(t, lp)| entry(t, lp)).collect();
                chosen
            })
            .collect();
        return json!({ "content": content });
    }
    let mut at = offset;
    let mut offsets = Vec::new();
    let mut pieces = Vec::new();
    for (token, _) in tokens {
        offsets.push(at);
        at += token_bytes(text, *token).len();
        pieces.push(token_text(text, *token));
    }
    let top: Vec<Value> = tokens
        .iter()
        .map(|(_, found)| {
            let alternatives: serde_json::Map<String, Value> =
                found.top.iter().map(|&(t, lp)| (token_text(text, t), json!(lp))).collect();
            Value::Object(alternatives)
        })
        .collect();
    let chosen: Vec<f64> = tokens.iter().map(|(_, found)| found.chosen).collect();
    json!({ "tokens": pieces, "token_logprobs": chosen, "top_logprobs": top, "text_offset": offsets })
}

/// A chat answer as it streams: the reasoning split off, then the tool
/// calls read out of what is left.
struct ChatAnswer {
    split: Split,
    calls: Option<Calls>,
}

impl ChatAnswer {
    fn push(&mut self, piece: &str) -> reasoning::Parts {
        let mut parts = self.split.push(piece);
        if let Some(calls) = &mut self.calls {
            parts.answer = calls.push(&parts.answer);
        }
        parts
    }

    /// What was held back, and the calls, at the end.
    fn finish(&mut self, last: &str) -> (reasoning::Parts, Vec<tools::Call>) {
        let mut parts = self.push(last);
        let rest = self.split.finish();
        parts.reasoning.push_str(&rest.reasoning);
        let Some(calls) = &mut self.calls else {
            parts.answer.push_str(&rest.answer);
            return (parts, Vec::new());
        };
        parts.answer.push_str(&calls.push(&rest.answer));
        let (held, found) = calls.finish();
        parts.answer.push_str(&held);
        (parts, found)
    }
}

/// How a chat answer's part is sent: whole, or as a stream's delta (the
/// first of its choice's, or a later one).
#[derive(Clone, Copy, PartialEq)]
enum Shape {
    Message,
    FirstDelta,
    Delta,
}

/// A chat answer's message or delta, as OpenAI's API and vLLM send them: a
/// message has its `role`, its `content` (null where the answer is only
/// reasoning or tool calls), `reasoning_content` and tool calls; a
/// stream's first delta has the `role` and `content` (`""` if nothing
/// yet), later ones only what they add.
fn message(parts: reasoning::Parts, calls: &[tools::Call], shape: Shape) -> Value {
    let mut message = json!({});
    if shape != Shape::Delta {
        message["role"] = json!("assistant");
    }
    let only_else = parts.answer.is_empty() && (!parts.reasoning.is_empty() || !calls.is_empty());
    match shape {
        Shape::Message if only_else => message["content"] = Value::Null,
        Shape::Delta if parts.answer.is_empty() => {}
        _ => message["content"] = json!(parts.answer),
    }
    if !parts.reasoning.is_empty() {
        message["reasoning_content"] = json!(parts.reasoning);
    } else if shape == Shape::Message {
        message["reasoning_content"] = Value::Null;
    }
    if !calls.is_empty() {
        let calls: Vec<Value> =
            calls.iter().enumerate().map(|(at, call)| call.to_json(&response_id("call"), at)).collect();
        message["tool_calls"] = Value::Array(calls);
    }
    message
}

/// A finish reason as `/metrics` counts it.
fn reason_name(reason: &Value) -> &'static str {
    match reason.as_str() {
        Some("stop") => "stop",
        Some("length") => "length",
        _ => "abort",
    }
}

/// The finish reason of an answer that made `calls`.
fn finish_reason(reason: Value, calls: &[tools::Call]) -> Value {
    if !calls.is_empty() && reason == "stop" {
        json!("tool_calls")
    } else {
        reason
    }
}

/// One choice of an answer as it is made: its tokens to text, stop
/// strings applied; for chat, reasoning and tool calls split out.
struct Choice {
    detokenizer: Detokenizer,
    chat: ChatAnswer,
    /// Bytes of text streamed so far (log-probabilities' offsets).
    streamed: usize,
    /// Whether a chunk of it was sent.
    started: bool,
    /// A finish reason was sent.
    ended: bool,
    /// The tokens made while the model was reasoning.
    reasoning_tokens: usize,
    /// The completions API's `echo`: the prompt's text, before the answer.
    echo: String,
}

impl Choice {
    /// A choice of a chat answer (`chat`) shows the tags `chat_tags`
    /// that are special tokens, for its parsers; a completion's text
    /// leaves every special token out.
    fn new(stops: &[String], chat: bool, chat_tags: &[u32], thinking: bool, tools: &[Value], echo: String) -> Choice {
        let shown = if chat { chat_tags.to_vec() } else { Vec::new() };
        let answer = ChatAnswer { split: Split::new(thinking), calls: (!tools.is_empty()).then(|| Calls::new(tools)) };
        Choice {
            detokenizer: Detokenizer::new(stops.to_vec(), shown),
            chat: answer,
            streamed: 0,
            started: false,
            ended: false,
            reasoning_tokens: 0,
            echo,
        }
    }

    /// The text of `token`, and whether a stop string ended the answer
    /// with it; counted as reasoning if the model was reasoning.
    fn push(&mut self, text: Option<&TextModel>, token: i64) -> (String, bool) {
        self.reasoning_tokens += usize::from(self.chat.split.is_thinking());
        self.detokenizer.push(text, token)
    }
}

/// Answers a request: `chat` in the chat API's shapes, `thinking` when its
/// prompt left the model inside a `<think>` block. Each of its `n` choices
/// is a row of its own, sampled from a seed of its own.
async fn respond(app: Arc<App>, request: Request, chat: bool, thinking: bool) -> Response {
    let Request { prompts, echo, tools, jobs, stream, stream_usage, stops, receivers } = request;
    let arrived = Instant::now();
    let started: Vec<_> = jobs.iter().map(|job| job.started.clone()).collect();
    let prompt_tokens: usize = prompts.iter().map(Vec::len).sum();
    // Each choice's prompt: its text first where echoed, its length for
    // `/metrics`.
    let echoes: Vec<String> = jobs
        .iter()
        .map(|job| match (echo, app.served.text.as_ref()) {
            (true, Some(text)) => text.decode(&job.prompt),
            _ => String::new(),
        })
        .collect();
    let prompt_lengths: Vec<usize> = jobs.iter().map(|job| job.prompt.len()).collect();
    // An answer's end, for `/metrics`.
    let finished = move |metrics: &Metrics, index: usize, reason: &'static str, generated_tokens: usize| {
        let queued_seconds = started[index].get().map_or(0.0, |at| at.duration_since(arrived).as_secs_f64());
        let seconds = arrived.elapsed().as_secs_f64();
        let prompt_tokens = prompt_lengths[index];
        metrics.finished(metrics::Finished { reason, prompt_tokens, generated_tokens, seconds, queued_seconds });
    };

    let asked_logprobs = jobs[0].logprobs.is_some();
    // The prompt is prefilled for each choice; its first's cache hit is
    // the request's.
    let cached = jobs[0].cached.clone();
    let Some(admitted) = Admitted::new(&app) else {
        let mut refused = error(
            StatusCode::TOO_MANY_REQUESTS,
            format!("the server holds {} requests, its most; try again shortly", app.capacity),
            None,
        );
        refused.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        return refused;
    };
    let sent = match app.jobs.lock() {
        Ok(sender) => jobs.into_iter().try_for_each(|job| sender.send(job)).is_ok(),
        Err(_) => false,
    };
    if !sent {
        return error(StatusCode::SERVICE_UNAVAILABLE, "the model is not running", None);
    }
    app.metrics.prompt(prompt_tokens);
    let mut clock = Clock { last: Instant::now(), first: true };
    let id = response_id(if chat { "chatcmpl" } else { "cmpl" });
    let model = app.served.limits.model.clone();
    let object = if chat { "chat.completion" } else { "text_completion" };
    let mut choices: Vec<Choice> = echoes
        .into_iter()
        .map(|echo| Choice::new(&stops, chat, &app.served.chat_tags, thinking, &tools, echo))
        .collect();
    if stream {
        let mut failed = false;
        // The tokens of the answer, once every choice ended well: the usage
        // chunk's.
        let answered = Arc::new(std::sync::Mutex::new(None::<(usize, usize)>));
        let answer_tokens = answered.clone();
        let usage_field = if stream_usage { Some(Value::Null) } else { None };
        let (usage_id, usage_model) = (id.clone(), model.clone());
        let mut updates = tokio_stream::StreamMap::new();
        for (index, receiver) in receivers.into_iter().enumerate() {
            updates.insert(index, UnboundedReceiverStream::new(receiver));
        }
        let events = updates.map_while(move |(index, update)| {
            // Dropping the stream (here, or when the client goes) drops
            // the receivers, which frees the rows.
            let _admitted = &admitted;
            if failed {
                return None;
            }
            if choices[index].ended {
                return Some(None);
            }
            let text = app.served.text.as_ref();
            let choice = &mut choices[index];
            let mut logprobs = Value::Null;
            // The chunk's own tokens: joined over the chunks, the answer's
            // `token_ids`, whose decoding the joined text is.
            let mut token_ids = Vec::new();
            let (piece, finish) = match update {
                Update::Token(token, found) => {
                    clock.tick(&app.metrics);
                    if let Some(found) = found {
                        logprobs = logprobs_json(text, &[(token, found)], chat, choice.streamed);
                    }
                    token_ids.push(token);
                    let (piece, stopped) = choice.push(text, token);
                    choice.streamed += piece.len();
                    (piece, if stopped { json!("stop") } else { Value::Null })
                }
                Update::Finished(reason) => (choice.detokenizer.finish(text), json!(reason)),
                Update::Failed(message) => {
                    // After the stream started, a failure is an error
                    // object in the stream, as OpenAI's API sends it,
                    // never text in the answer.
                    failed = true;
                    let failure = error_object(StatusCode::INTERNAL_SERVER_ERROR, message, None);
                    return Some(Some(Ok::<_, std::convert::Infallible>(Event::default().data(failure.to_string()))));
                }
            };
            choice.ended = !finish.is_null();
            if choice.ended {
                finished(&app.metrics, index, reason_name(&finish), choice.detokenizer.ids().len());
            }
            let shape = if choice.started { Shape::Delta } else { Shape::FirstDelta };
            choice.started = true;
            let delta = if chat {
                let (parts, calls) =
                    if finish.is_null() { (choice.chat.push(&piece), Vec::new()) } else { choice.chat.finish(&piece) };
                let finish = finish_reason(finish, &calls);
                json!({ "index": index, "delta": message(parts, &calls, shape), "logprobs": logprobs, "finish_reason": finish, "token_ids": token_ids })
            } else {
                let piece = if shape == Shape::FirstDelta { std::mem::take(&mut choice.echo) + &piece } else { piece };
                json!({ "index": index, "text": piece, "logprobs": logprobs, "finish_reason": finish, "token_ids": token_ids })
            };
            if choices.iter().all(|choice| choice.ended) {
                let tokens = choices.iter().map(|choice| choice.detokenizer.ids().len()).sum();
                let reasoning = choices.iter().map(|choice| choice.reasoning_tokens).sum();
                *answer_tokens.lock().expect("not poisoned") = Some((tokens, reasoning));
            }
            let mut chunk = json!({ "id": id, "object": format!("{object}.chunk"), "created": now(), "model": model, "choices": [delta] });
            if let Some(usage) = &usage_field {
                chunk["usage"] = usage.clone();
            }
            Some(Some(Ok(Event::default().data(chunk.to_string()))))
        });
        // Asked for, and the answer ended well: its usage, in a last chunk
        // without choices, as OpenAI's API sends it.
        let usage = std::iter::once_with(move || {
            let (completion, reasoning) = (*answered.lock().expect("not poisoned")).filter(|_| stream_usage)?;
            let usage = usage_json(prompt_tokens, cached.load(Ordering::Acquire), completion, chat.then_some(reasoning));
            let chunk = json!({ "id": usage_id, "object": format!("{object}.chunk"), "created": now(), "model": usage_model, "choices": [], "usage": usage });
            Some(Ok(Event::default().data(chunk.to_string())))
        })
        .flatten();
        let done = tokio_stream::once(Ok(Event::default().data("[DONE]")));
        let events = events.filter_map(|event| event);
        return Sse::new(events.chain(tokio_stream::iter(usage)).chain(done)).into_response();
    }
    let text = app.served.text.as_ref();
    let mut answers = Vec::with_capacity(choices.len());
    let (mut completion_tokens, mut reasoning_tokens) = (0, 0);
    for (index, (mut receiver, choice)) in receivers.into_iter().zip(&mut choices).enumerate() {
        let mut answer = String::new();
        let mut finish = "length";
        let mut found_logprobs = Vec::new();
        while let Some(update) = receiver.recv().await {
            match update {
                Update::Token(token, found) => {
                    clock.tick(&app.metrics);
                    found_logprobs.extend(found.map(|found| (token, found)));
                    let (piece, stopped) = choice.push(text, token);
                    answer.push_str(&piece);
                    if stopped {
                        finish = "stop";
                        break;
                    }
                }
                Update::Finished(reason) => {
                    finish = reason;
                    answer.push_str(&choice.detokenizer.finish(text));
                    break;
                }
                Update::Failed(message) => return error(StatusCode::INTERNAL_SERVER_ERROR, message, None),
            }
        }
        drop(receiver);
        if text.is_none() {
            answer.clear();
        }
        let ids = choice.detokenizer.ids();
        completion_tokens += ids.len();
        reasoning_tokens += choice.reasoning_tokens;
        finished(&app.metrics, index, finish, ids.len());
        found_logprobs.truncate(ids.len());
        let logprobs = if found_logprobs.is_empty() && !asked_logprobs {
            Value::Null
        } else {
            logprobs_json(text, &found_logprobs, chat, 0)
        };
        answers.push(if chat {
            let (parts, calls) = choice.chat.finish(&answer);
            let finish = finish_reason(json!(finish), &calls);
            json!({ "index": index, "message": message(parts, &calls, Shape::Message), "logprobs": logprobs, "finish_reason": finish, "token_ids": ids })
        } else {
            let text = std::mem::take(&mut choice.echo) + &answer;
            json!({ "index": index, "text": text, "logprobs": logprobs, "finish_reason": finish, "token_ids": ids })
        });
    }
    drop(admitted);
    let reasoning = chat.then_some(reasoning_tokens);
    let usage = usage_json(prompt_tokens, cached.load(Ordering::Acquire), completion_tokens, reasoning);
    Json(json!({ "id": id, "object": object, "created": now(), "model": model, "choices": answers, "usage": usage }))
        .into_response()
}

/// OpenAI's usage object; `cached` of the prompt's tokens came from the
/// prefix cache; a chat's `reasoning` of the answer's were reasoning.
fn usage_json(prompt: usize, cached: usize, completion: usize, reasoning: Option<usize>) -> Value {
    let mut usage = json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": { "cached_tokens": cached },
    });
    if let Some(reasoning) = reasoning {
        usage["completion_tokens_details"] = json!({ "reasoning_tokens": reasoning });
    }
    usage
}

/// One request counted against the server's capacity while it is held.
struct Admitted(Arc<AtomicUsize>);

impl Admitted {
    /// Counts a request in, unless the server already holds its most.
    fn new(app: &App) -> Option<Admitted> {
        let held = app.held.fetch_add(1, Ordering::SeqCst);
        let admitted = Admitted(app.held.clone());
        (held < app.capacity).then_some(admitted)
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A JSON body, or the response its rejection deserves: 400 for bad JSON,
/// 413 for a body over the limit, 415 without a JSON content type.
fn json_body(body: Result<Json<Value>, JsonRejection>) -> Result<Value, Response> {
    body.map(|Json(body)| body).map_err(|rejection| {
        error(rejection.status(), format!("malformed request: {}", rejection.body_text()), Some("body"))
    })
}

/// A completion request: the body parsed, its prompt read by `prompt`,
/// its settings validated, then answered.
async fn complete(
    app: Arc<App>,
    body: Result<Json<Value>, JsonRejection>,
    prompt: fn(&Served, &Value) -> Result<Prompt, Response>,
    chat: bool,
) -> Response {
    let request = json_body(body).and_then(|body| {
        let (prompt, thinking) = prompt(&app.served, &body)?;
        parse_request(&app.served, &body, prompt, chat, thinking).map(|request| (request, thinking))
    });
    let response = match request {
        Ok((request, thinking)) => respond(app.clone(), request, chat, thinking).await,
        Err(response) => response,
    };
    app.metrics.answered(if chat { "chat_completions" } else { "completions" }, response.status().as_u16());
    response
}

async fn completions(State(app): State<Arc<App>>, body: Result<Json<Value>, JsonRejection>) -> Response {
    complete(app, body, prompt_of, false).await
}

async fn chat_completions(State(app): State<Arc<App>>, body: Result<Json<Value>, JsonRejection>) -> Response {
    complete(app, body, chat_prompt, true).await
}

fn model_card(app: &App) -> Value {
    json!({
        "id": app.served.limits.model,
        "object": "model",
        "created": 0,
        "owned_by": "linnet",
        "max_model_len": app.served.limits.max_seq,
    })
}

async fn models(State(app): State<Arc<App>>) -> Json<Value> {
    Json(json!({ "object": "list", "data": [model_card(&app)] }))
}

async fn model(State(app): State<Arc<App>>, Path(id): Path<String>) -> Response {
    if id == app.served.limits.model {
        Json(model_card(&app)).into_response()
    } else {
        error(
            StatusCode::NOT_FOUND,
            format!("this server runs `{}`, not `{id}`", app.served.limits.model),
            Some("model"),
        )
    }
}

/// `/tokenize`: `{"prompt": TEXT}`, or a chat's `messages` through the
/// template, to `{"tokens", "count", "max_model_len"}`.
async fn tokenize(State(app): State<Arc<App>>, body: Result<Json<Value>, JsonRejection>) -> Response {
    let tokens = json_body(body).and_then(|body| {
        let text = app.served.text.as_ref().ok_or_else(|| bad("this model has no tokenizer", "prompt"))?;
        // As vLLM's: a prompt gets the tokenizer's additions, a rendered
        // chat has them from its template, unless `add_special_tokens` says.
        check_model(&app.served, &body)?;
        let (prompt, adds_by_default) = match (body.get("prompt"), body.get("messages")) {
            (Some(Value::String(prompt)), None) => (prompt.clone(), true),
            (None, Some(_)) => (chat_text(&app.served, &body)?, false),
            _ => return Err(bad("give `prompt` (a string) or `messages`", "prompt")),
        };
        let add_special_tokens = match body.get("add_special_tokens").map(Value::as_bool) {
            None => adds_by_default,
            Some(Some(given)) => given,
            Some(None) => return Err(bad("`add_special_tokens` must be true or false", "add_special_tokens")),
        };
        let tokens = if add_special_tokens { text.encode_prompt(&prompt) } else { text.encode(&prompt) };
        let tokens = tokens.map_err(|e| bad(e.to_string(), "prompt"))?;
        let mut answer = json!({ "count": tokens.len(), "max_model_len": app.served.limits.max_seq, "tokens": tokens });
        // vLLM's `return_token_strs`: each token as the vocabulary spells it.
        if request::flag(&body, "return_token_strs", false)? {
            let spelled: Vec<Value> = tokens
                .iter()
                .map(|&id| text.tokenizer().id_to_token(id as u32).map_or(Value::Null, Value::String))
                .collect();
            answer["token_strs"] = Value::Array(spelled);
        }
        Ok(answer)
    });
    match tokens {
        Ok(answer) => Json(answer).into_response(),
        Err(response) => response,
    }
}

/// `/detokenize`: `{"tokens": [ids]}` to `{"prompt": TEXT}`, special
/// tokens left out unless `"skip_special_tokens": false`.
async fn detokenize(State(app): State<Arc<App>>, body: Result<Json<Value>, JsonRejection>) -> Response {
    let text = json_body(body).and_then(|body| {
        let skip_specials = request::flag(&body, "skip_special_tokens", true)?;
        check_model(&app.served, &body)?;
        let text = app.served.text.as_ref().ok_or_else(|| bad("this model has no tokenizer", "tokens"))?;
        let vocab = app.served.limits.vocab as u64;
        let tokens: Vec<i64> = body
            .get("tokens")
            .and_then(Value::as_array)
            .and_then(|ids| ids.iter().map(|id| id.as_u64().filter(|&id| id < vocab).map(|id| id as i64)).collect())
            .ok_or_else(|| bad(format!("`tokens` must be an array of ids in 0..{vocab}"), "tokens"))?;
        Ok::<_, Response>(if skip_specials { text.decode(&tokens) } else { text.decode_with_specials(&tokens) })
    });
    match text {
        Ok(text) => Json(json!({ "prompt": text })).into_response(),
        Err(response) => response,
    }
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    let text = app.metrics.render(&app.served.limits, &app.load);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

async fn health() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// `/ready`: whether the server takes requests (not while draining), as
/// Kubernetes' readiness probe reads it; `/health` is its liveness.
async fn ready(State(app): State<Arc<App>>) -> Response {
    match app.draining.load(Ordering::Acquire) {
        false => Json(json!({ "status": "ready" })).into_response(),
        true => draining(),
    }
}

/// The answer while the server drains: 503.
fn draining() -> Response {
    error(StatusCode::SERVICE_UNAVAILABLE, "the server is draining: it takes no new requests", None)
}

/// While draining, a new request is refused with 503 (another replica
/// takes it); those already held go on.
async fn refuse_while_draining(State(app): State<Arc<App>>, request: HttpRequest, next: Next) -> Response {
    if app.draining.load(Ordering::Acquire) {
        let mut refused = draining();
        refused.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        return refused;
    }
    next.run(request).await
}

/// Waits for SIGTERM or Ctrl-C, then drains: new requests are refused,
/// those held may finish within `timeout`, then every answer still going
/// ends with `finish_reason: "abort"` (a stream with its last chunk and
/// `[DONE]`), and the server stops once they are sent.
async fn drain(app: Arc<App>, timeout: std::time::Duration) {
    #[cfg(unix)]
    let terminated = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => drop(signal.recv().await),
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminated = std::future::pending::<()>();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminated => {}
    }
    app.draining.store(true, Ordering::Release);
    let held = || app.held.load(Ordering::Acquire);
    eprintln!("linnet: draining: {} request(s) held, up to {:.0} s", held(), timeout.as_secs_f64());
    // Whether every request held has gone within `within`.
    let all_gone = |within: std::time::Duration| async move {
        let deadline = tokio::time::Instant::now() + within;
        while held() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        held() == 0
    };
    if !all_gone(timeout).await {
        eprintln!("linnet: drain timed out: ending {} request(s)", held());
        app.load.abort.store(true, Ordering::Release);
        // Their last chunks go out as soon as the scheduler ends them.
        all_gone(std::time::Duration::from_secs(5)).await;
    }
    eprintln!("linnet: shutting down");
}

/// A route this server does not have, in OpenAI's error shape.
async fn no_route(request: HttpRequest) -> Response {
    error(StatusCode::NOT_FOUND, format!("no route {} {}", request.method(), request.uri().path()), None)
}

/// A route asked with a method it does not take.
async fn wrong_method(request: HttpRequest) -> Response {
    let message = format!("{} does not take {}", request.uri().path(), request.method());
    error(StatusCode::METHOD_NOT_ALLOWED, message, None)
}

/// The most bytes a request body may have: room for a prompt that fills
/// the context as text or ids, with the JSON around it (never under 8 MiB).
fn body_limit(max_seq: usize) -> usize {
    (64 * max_seq).max(8 << 20)
}

/// Whether two strings are equal, in a time that depends on their lengths
/// only, not on where they differ.
fn same_secret(given: &[u8], key: &[u8]) -> bool {
    let longest = given.len().max(key.len());
    let differences = (0..longest).fold(given.len() ^ key.len(), |acc, at| {
        acc | (given.get(at).copied().unwrap_or(0) ^ key.get(at).copied().unwrap_or(0)) as usize
    });
    differences == 0
}

/// With an API key, a request needs `Authorization: Bearer KEY`; else 401
/// in OpenAI's error shape.
async fn authorize(State(app): State<Arc<App>>, request: HttpRequest, next: Next) -> Response {
    if let Some(key) = &app.api_key {
        let given = request.headers().get(header::AUTHORIZATION).and_then(|value| value.to_str().ok());
        // The scheme's name is case-insensitive (RFC 9110).
        let token = given
            .and_then(|value| value.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map_or("", |(_, token)| token.trim_start());
        if !same_secret(token.as_bytes(), key.as_bytes()) {
            let mut refused = (
                StatusCode::UNAUTHORIZED,
                Json(json!({ "error": {
                    "message": "a valid API key is required: Authorization: Bearer KEY",
                    "type": "invalid_request_error",
                    "param": Value::Null,
                    "code": "invalid_api_key",
                } })),
            )
                .into_response();
            refused.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return refused;
        }
    }
    next.run(request).await
}

/// Why the server could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The model has not what serving needs (its batched entries).
    #[error("{0}")]
    CannotServe(String),
    #[error("cannot listen on {address}: {error}")]
    Listen { address: String, error: std::io::Error },
    /// The async runtime or the connection loop failed.
    #[error("the server failed: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    KvEvents(#[from] kv_events::KvEventsError),
}

/// Serves `loaded` until Ctrl-C: its machine moves to the scheduler's
/// thread, which alone runs it.
pub fn serve(loaded: Loaded, options: Options) -> Result<(), ServeError> {
    let Loaded { machine, text, .. } = loaded;
    let limits = limits(&machine)?;
    if options.draft > 0 && !limits.verifies {
        return Err(ServeError::CannotServe(
            "drafts are checked by a `verify_slots` entry, and this model has none".into(),
        ));
    }
    let (jobs, receiver) = mpsc::channel::<Job>();
    let scheduler_load = Arc::new(Load::default());
    let held_load = scheduler_load.clone();
    let mut cache = prefix::PrefixCache::new(options.prefix_cache_bytes, options.prefix_block);
    let (events, publisher) = match options.kv_events {
        Some(_) if options.prefix_cache_bytes == 0 => return Err(ServeError::CannotServe(
            "KV-cache events tell of the prefix cache's blocks: they need a prefix cache (--prefix-cache-mb above 0)"
                .to_string(),
        )),
        Some(config) => {
            let (sink, publisher) = kv_events::Publisher::start(config)?;
            let hasher = kv_events::BlockHasher::new(&kv_events::hash_seed());
            cache = cache.with_ledger(kv_events::BlockLedger::new(hasher, options.prefix_block));
            (Some(sink), Some(publisher))
        }
        None => (None, None),
    };
    let scheduler_limits = limits.clone();
    let scheduler =
        std::thread::spawn(move || run_batches(machine, scheduler_limits, receiver, &scheduler_load, cache, events));
    let capacity = limits.rows + options.queue;
    let app = Arc::new(App {
        jobs: std::sync::Mutex::new(jobs),
        served: Served::new(limits, text).with_draft(options.draft),
        held: Arc::new(AtomicUsize::new(0)),
        capacity,
        metrics: Metrics::new(metrics::CacheConfig {
            block: options.prefix_block,
            prefix_cache_bytes: options.prefix_cache_bytes,
        }),
        draining: AtomicBool::new(false),
        load: held_load,
        api_key: options.api_key.filter(|key| !key.is_empty()),
    });
    let guarded = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route_layer(middleware::from_fn_with_state(app.clone(), authorize))
        .route_layer(middleware::from_fn_with_state(app.clone(), refuse_while_draining));
    let router = guarded
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(axum::extract::DefaultBodyLimit::max(body_limit(app.served.limits.max_seq)))
        .with_state(app.clone());
    let (host, port) = (options.host.as_str(), options.port);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind((host, port))
            .await
            .map_err(|error| ServeError::Listen { address: format!("{host}:{port}"), error })?;
        let address = listener.local_addr()?;
        if app.api_key.is_none() && !address.ip().is_loopback() {
            eprintln!(
                "linnet: warning: listening on {address} without an API key: anyone who can reach it can use the \
                 model (give --api-key or LINNET_API_KEY)"
            );
        }
        eprintln!(
            "linnet: serving `{}` on http://{address} ({} rows)",
            app.served.limits.model, app.served.limits.rows
        );
        tracing::info!(%address, "serving");
        axum::serve(listener, router)
            .with_graceful_shutdown(drain(app.clone(), options.drain_timeout))
            .await
            .map_err(ServeError::Io)
    })?;
    drop(runtime);
    let _ = scheduler.join();
    if let Some(publisher) = publisher {
        publisher.finish();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"sk-abc", b"sk-abc"));
        assert!(!same_secret(b"sk-abd", b"sk-abc"));
        assert!(!same_secret(b"sk-ab", b"sk-abc"));
        assert!(!same_secret(b"", b"sk-abc"));
        assert!(!same_secret(b"sk-abc\0", b"sk-abc"));
    }

    #[test]
    fn response_ids_do_not_repeat() {
        let ids: std::collections::HashSet<String> = (0..1000).map(|_| response_id("cmpl")).collect();
        assert_eq!(ids.len(), 1000);
    }
}
