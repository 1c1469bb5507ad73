//! `linnet serve`: an OpenAI-compatible HTTP server (axum on tokio) with
//! continuous batching through the model's own entries. One scheduler
//! thread owns the model: new requests are prefilled into free rows with
//! `prefill_slots` while the others keep decoding with `decode_rows`;
//! `Batch` rows at most, the rest wait in a queue. Each row computes only
//! from its own tokens, so a request's tokens do not depend on what else
//! runs. A client that goes away frees its row.

// The error side of request parsing is an HTTP response, built only when
// a request is refused.
#![allow(clippy::result_large_err)]

use crate::sampling::{Rng, Sampling};
use crate::stops::Detokenizer;
use crate::text::TextModel;
use crate::Loaded;
use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use linnet_exec::tensor::Tensor;
use linnet_exec::Machine;
use linnet_ir::Dtype;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::StreamExt;

/// What the scheduler reports to a request.
#[derive(Debug)]
pub enum Update {
    Token(i64),
    Finished(&'static str),
    Failed(String),
}

pub struct Job {
    pub prompt: Vec<i64>,
    pub max_tokens: usize,
    pub sampling: Sampling,
    pub seed: u64,
    pub stop: Vec<i64>,
    pub updates: UnboundedSender<Update>,
}

struct Row {
    job: Job,
    rng: Rng,
    history: Vec<i64>,
    generated: usize,
    /// The position the next token goes to.
    position: usize,
}

/// The model's limits, known to the HTTP side for validation.
#[derive(Clone)]
pub struct Limits {
    pub model: String,
    pub rows: usize,
    pub max_seq: usize,
    pub vocab: usize,
}

pub fn limits(machine: &Machine) -> Result<Limits, String> {
    let entry = machine.model().entry("decode_rows").ok_or("the model has no `decode_rows` entry: it cannot serve")?;
    machine.model().entry("prefill_slots").ok_or("the model has no `prefill_slots` entry: it cannot serve")?;
    let rows = entry.inputs[0].shape[0].as_constant().ok_or("`decode_rows` takes a batch of unknown size")? as usize;
    let vocab =
        entry.nodes[entry.outputs[0].index()].shape.last().and_then(|d| d.as_constant()).ok_or("no vocabulary size")?
            as usize;
    let max_seq = crate::generate::cache_positions(machine.model()).unwrap_or(usize::MAX);
    Ok(Limits { model: machine.model().name.clone(), rows, max_seq, vocab })
}

fn logits_rows(logits: &Tensor) -> Vec<&[f32]> {
    let width = *logits.shape.last().expect("[rows, vocab]");
    logits.as_f32().expect("float logits").chunks(width).collect()
}

/// Sends the chosen token; says whether the row goes on.
fn emit(row: &mut Row, logits: &[f32], limits: &Limits) -> bool {
    if let Some(message) = crate::sampling::not_a_number(logits) {
        let _ = row.job.updates.send(Update::Failed(message));
        return false;
    }
    let next = row.job.sampling.choose(logits, &row.history, &mut row.rng);
    row.history.push(next);
    row.generated += 1;
    if row.job.updates.send(Update::Token(next)).is_err() {
        return false;
    }
    let reason = if row.job.stop.contains(&next) {
        Some("stop")
    } else if row.generated >= row.job.max_tokens || row.position + 1 >= limits.max_seq {
        Some("length")
    } else {
        None
    };
    if let Some(reason) = reason {
        let _ = row.job.updates.send(Update::Finished(reason));
        return false;
    }
    true
}

/// The scheduler loop: runs until every sender of jobs is gone.
pub fn schedule(mut machine: Machine, limits: Limits, jobs: mpsc::Receiver<Job>) {
    let mut rows: Vec<Option<Row>> = (0..limits.rows).map(|_| None).collect();
    let mut queue: VecDeque<Job> = VecDeque::new();
    loop {
        let busy = rows.iter().any(Option::is_some);
        if !busy && queue.is_empty() {
            match jobs.recv() {
                Ok(job) => queue.push_back(job),
                Err(_) => return,
            }
        }
        while let Ok(job) = jobs.try_recv() {
            queue.push_back(job);
        }
        // A client that went away frees its row and its place in the queue.
        for slot in rows.iter_mut() {
            if slot.as_ref().is_some_and(|row| row.job.updates.is_closed()) {
                *slot = None;
            }
        }
        queue.retain(|job| !job.updates.is_closed());
        // Admit waiting requests into free rows, in one `prefill_slots`.
        let free: Vec<usize> = rows.iter().enumerate().filter(|(_, r)| r.is_none()).map(|(at, _)| at).collect();
        let admitted: Vec<(usize, Job)> = free.into_iter().zip(std::iter::from_fn(|| queue.pop_front())).collect();
        if !admitted.is_empty() {
            tracing::debug!(requests = admitted.len(), waiting = queue.len(), "prefill_slots");
            let width = admitted.iter().map(|(_, job)| job.prompt.len()).max().unwrap_or(1);
            let mut tokens = Vec::with_capacity(admitted.len() * width);
            for (_, job) in &admitted {
                tokens.extend(job.prompt.iter().copied());
                tokens.extend(std::iter::repeat_n(0, width - job.prompt.len()));
            }
            let inputs = vec![
                Tensor::from_i64(Dtype::I32, vec![admitted.len(), width], tokens),
                Tensor::from_i64(
                    Dtype::I32,
                    vec![admitted.len()],
                    admitted.iter().map(|(slot, _)| *slot as i64).collect(),
                ),
                Tensor::from_i64(
                    Dtype::I32,
                    vec![admitted.len()],
                    admitted.iter().map(|(_, job)| job.prompt.len() as i64).collect(),
                ),
            ];
            match machine.call("prefill_slots", inputs) {
                Ok(outputs) => {
                    let logits = &outputs[0];
                    for ((slot, job), row_logits) in admitted.into_iter().zip(logits_rows(logits)) {
                        let mut row = Row {
                            rng: Rng::new(job.seed),
                            history: job.prompt.clone(),
                            generated: 0,
                            position: job.prompt.len(),
                            job,
                        };
                        if emit(&mut row, row_logits, &limits) {
                            rows[slot] = Some(row);
                        }
                    }
                }
                Err(error) => {
                    for (_, job) in admitted {
                        let _ = job.updates.send(Update::Failed(error.to_string()));
                    }
                }
            }
        }
        if !rows.iter().any(Option::is_some) {
            continue;
        }
        // One step for every row; a free row computes along and is ignored.
        let tokens: Vec<i64> =
            rows.iter().map(|r| r.as_ref().map_or(0, |row| *row.history.last().expect("a token"))).collect();
        let positions: Vec<i64> = rows.iter().map(|r| r.as_ref().map_or(0, |row| row.position as i64)).collect();
        let inputs = vec![
            Tensor::from_i64(Dtype::I32, vec![limits.rows, 1], tokens),
            Tensor::from_i64(Dtype::I32, vec![limits.rows], positions),
        ];
        match machine.call("decode_rows", inputs) {
            Ok(outputs) => {
                let logits = &outputs[0];
                for (slot, row_logits) in rows.iter_mut().zip(logits_rows(logits)) {
                    if let Some(row) = slot {
                        row.position += 1;
                        if !emit(row, row_logits, &limits) {
                            *slot = None;
                        }
                    }
                }
            }
            Err(error) => {
                for slot in rows.iter_mut() {
                    if let Some(row) = slot.take() {
                        let _ = row.job.updates.send(Update::Failed(error.to_string()));
                    }
                }
            }
        }
    }
}

/// What the HTTP side knows of the model: enough to read and answer
/// requests, not to run them.
pub struct Served {
    pub limits: Limits,
    pub text: Option<TextModel>,
}

impl Served {
    /// Reads a request body as `/v1/completions` (or, with `chat`,
    /// `/v1/chat/completions`) does, without running it: the prompt's
    /// token ids, or the refusal's HTTP status. For fuzzing and tests.
    pub fn read(&self, body: &[u8], chat: bool) -> Result<Vec<i64>, u16> {
        let body: Value = serde_json::from_slice(body).map_err(|_| StatusCode::BAD_REQUEST.as_u16())?;
        let prompt = if chat { chat_prompt(self, &body) } else { prompt_of(self, &body) };
        prompt
            .and_then(|prompt| parse_request(self, &body, prompt))
            .map(|request| request.prompt)
            .map_err(|refusal| refusal.status().as_u16())
    }
}

struct App {
    jobs: std::sync::Mutex<mpsc::Sender<Job>>,
    served: Served,
    /// Requests running or waiting for a row now, and the most allowed:
    /// past it, a request is answered 429 at once rather than queued.
    held: Arc<AtomicUsize>,
    capacity: usize,
}

fn error(status: StatusCode, message: impl Into<String>, param: Option<&str>) -> Response {
    let kind = if status.is_client_error() { "invalid_request_error" } else { "server_error" };
    (status, Json(json!({ "error": { "message": message.into(), "type": kind, "param": param, "code": Value::Null } })))
        .into_response()
}

fn bad(message: impl Into<String>, param: &str) -> Response {
    error(StatusCode::BAD_REQUEST, message, Some(param))
}

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

struct Request {
    prompt: Vec<i64>,
    job: Job,
    stream: bool,
    /// Stop strings: the answer ends before the first one generated.
    stops: Vec<String>,
    receiver: UnboundedReceiver<Update>,
}

/// Whether a field's value means "not asked for".
type Unasked = fn(&Value) -> bool;

/// Request fields that would change the answer and that this server does
/// not do yet, with the value that means "not asked for": a request that
/// asks for one is refused, never answered as if it had not.
const NOT_YET: [(&str, Unasked); 7] = [
    ("n", |v| v.as_f64() == Some(1.0)),
    ("best_of", |v| v.as_f64() == Some(1.0)),
    ("logprobs", |v| v == &Value::Bool(false)),
    ("top_logprobs", |v| v.as_f64() == Some(0.0)),
    ("echo", |v| v == &Value::Bool(false)),
    ("logit_bias", |v| v.as_object().is_some_and(|o| o.is_empty())),
    ("stream_options", |v| v.get("include_usage").is_none_or(|u| u == &Value::Bool(false))),
];

fn parse_request(served: &Served, body: &Value, prompt: Vec<i64>) -> Result<Request, Response> {
    let limits = &served.limits;
    match body.get("model") {
        None | Some(Value::Null) => {}
        Some(Value::String(name)) if *name == limits.model => {}
        Some(other) => {
            return Err(error(
                StatusCode::NOT_FOUND,
                format!("this server runs `{}`, not {other}", limits.model),
                Some("model"),
            ))
        }
    }
    for (field, unasked) in NOT_YET {
        match body.get(field) {
            None | Some(Value::Null) => {}
            Some(value) if unasked(value) => {}
            Some(value) => return Err(bad(format!("`{field}` ({value}) is not supported by this server yet"), field)),
        }
    }
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
    let room = limits.max_seq - prompt.len();
    // `max_completion_tokens` is the chat API's newer name for it.
    let limit_field = if body.get("max_completion_tokens").is_some_and(|v| !v.is_null()) {
        "max_completion_tokens"
    } else {
        "max_tokens"
    };
    let max_tokens = number(body, limit_field, 16f64.min(room as f64), 1.0..=f64::MAX)? as usize;
    if max_tokens > room {
        return Err(bad(
            format!("max_tokens {max_tokens} does not fit: the prompt leaves {room} of {} positions", limits.max_seq),
            "max_tokens",
        ));
    }
    let sampling = Sampling {
        temperature: number(body, "temperature", 1.0, 0.0..=100.0)?,
        top_p: number(body, "top_p", 1.0, 0.0..=1.0)?,
        top_k: number(body, "top_k", 0.0, 0.0..=1e9)? as usize,
        min_p: number(body, "min_p", 0.0, 0.0..=1.0)?,
        repetition_penalty: number(body, "repetition_penalty", 1.0, 0.01..=100.0)?,
    };
    sampling.validate().map_err(|message| bad(message, "sampling"))?;
    let seed = number(body, "seed", 0.0, 0.0..=u64::MAX as f64)? as u64;
    let stream = match body.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => return Err(bad(format!("`stream` must be a boolean, got {other}"), "stream")),
    };
    let stops = stop_strings(body)?;
    if !stops.is_empty() && served.text.is_none() {
        return Err(bad("`stop` strings need a tokenizer, and this model has none", "stop"));
    }
    let stop = served.text.as_ref().map(|t| t.end_ids.clone()).unwrap_or_default();
    let (updates, receiver) = unbounded_channel();
    let job = Job { prompt: prompt.clone(), max_tokens, sampling, seed, stop, updates };
    Ok(Request { prompt, job, stream, stops, receiver })
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

fn prompt_of(served: &Served, body: &Value) -> Result<Vec<i64>, Response> {
    match body.get("prompt") {
        Some(Value::String(text)) => match &served.text {
            Some(text_model) => text_model.encode(text).map_err(|e| bad(e, "prompt")),
            None => Err(bad("this model has no tokenizer: send the prompt as token ids", "prompt")),
        },
        Some(Value::Array(items)) if items.iter().all(Value::is_i64) => {
            Ok(items.iter().filter_map(Value::as_i64).collect())
        }
        Some(other) => Err(bad(format!("`prompt` must be a string or an array of token ids, got {other}"), "prompt")),
        None => Err(bad("`prompt` is required", "prompt")),
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

fn chat_prompt(served: &Served, body: &Value) -> Result<Vec<i64>, Response> {
    let Some(Value::Array(messages)) = body.get("messages") else {
        return Err(bad("`messages` must be an array of {role, content}", "messages"));
    };
    let mut turns = Vec::new();
    for message in messages {
        match (message.get("role").and_then(Value::as_str), message.get("content").and_then(text_of)) {
            (Some(role), Some(content)) => turns.push((role.to_string(), content)),
            _ => {
                return Err(bad(format!("each message needs a string `role` and `content`, got {message}"), "messages"))
            }
        }
    }
    let Some(text) = &served.text else {
        return Err(bad("this model has no tokenizer, so it cannot chat", "messages"));
    };
    let prompt = if text.has_chat_template() {
        text.chat(&turns).map_err(|e| bad(e, "messages"))?
    } else {
        turns.iter().map(|(_, content)| content.as_str()).collect::<Vec<_>>().join("\n")
    };
    text.encode(&prompt).map_err(|e| bad(e, "messages"))
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

async fn respond(app: Arc<App>, request: Request, chat: bool) -> Response {
    let Request { prompt, job, stream, stops, mut receiver } = request;
    let Some(admitted) = Admitted::new(&app) else {
        let mut refused = error(
            StatusCode::TOO_MANY_REQUESTS,
            format!("the server holds {} requests, its most; try again shortly", app.capacity),
            None,
        );
        refused.headers_mut().insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from_static("1"));
        return refused;
    };
    if app.jobs.lock().map(|jobs| jobs.send(job)).is_err() {
        return error(StatusCode::SERVICE_UNAVAILABLE, "the model is not running", None);
    }
    let id = format!("{}-{}", if chat { "chatcmpl" } else { "cmpl" }, now());
    let model = app.served.limits.model.clone();
    let object = if chat { "chat.completion" } else { "text_completion" };
    let mut detokenizer = Detokenizer::new(stops);
    if stream {
        let mut ended = false;
        let events = UnboundedReceiverStream::new(receiver).map_while(move |update| {
            // Dropping the stream (here, or when the client goes) drops
            // the receiver, which frees the row.
            let _admitted = &admitted;
            if ended {
                return None;
            }
            let text = app.served.text.as_ref();
            let (piece, finish) = match update {
                Update::Token(token) => match detokenizer.push(text, token) {
                    (piece, true) => (piece, json!("stop")),
                    (piece, false) => (piece, Value::Null),
                },
                Update::Finished(reason) => (detokenizer.finish(text), json!(reason)),
                Update::Failed(message) => (format!("[error: {message}]"), json!("error")),
            };
            ended = !finish.is_null();
            let choice = if chat {
                json!({ "index": 0, "delta": { "role": "assistant", "content": piece }, "finish_reason": finish })
            } else {
                json!({ "index": 0, "text": piece, "finish_reason": finish })
            };
            let chunk = json!({ "id": id, "object": format!("{object}.chunk"), "created": now(), "model": model, "choices": [choice] });
            Some(Ok::<_, std::convert::Infallible>(Event::default().data(chunk.to_string())))
        });
        let done = tokio_stream::once(Ok(Event::default().data("[DONE]")));
        return Sse::new(events.chain(done)).into_response();
    }
    let text = app.served.text.as_ref();
    let mut answer = String::new();
    let mut finish = "length";
    while let Some(update) = receiver.recv().await {
        match update {
            Update::Token(token) => {
                let (piece, stopped) = detokenizer.push(text, token);
                answer.push_str(&piece);
                if stopped {
                    finish = "stop";
                    break;
                }
            }
            Update::Finished(reason) => {
                finish = reason;
                answer.push_str(&detokenizer.finish(text));
                break;
            }
            Update::Failed(message) => return error(StatusCode::INTERNAL_SERVER_ERROR, message, None),
        }
    }
    drop((receiver, admitted));
    if text.is_none() {
        answer.clear();
    }
    let ids = detokenizer.ids();
    let choice = if chat {
        json!({ "index": 0, "message": { "role": "assistant", "content": answer }, "finish_reason": finish, "token_ids": ids })
    } else {
        json!({ "index": 0, "text": answer, "finish_reason": finish, "token_ids": ids })
    };
    let usage = json!({ "prompt_tokens": prompt.len(), "completion_tokens": ids.len(), "total_tokens": prompt.len() + ids.len() });
    Json(json!({ "id": id, "object": object, "created": now(), "model": model, "choices": [choice], "usage": usage }))
        .into_response()
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

/// A completion request: the body parsed, its prompt read by `prompt`,
/// its settings validated, then answered.
async fn complete(
    app: Arc<App>,
    body: Result<Json<Value>, JsonRejection>,
    prompt: fn(&Served, &Value) -> Result<Vec<i64>, Response>,
    chat: bool,
) -> Response {
    let body = match body {
        Ok(Json(body)) => body,
        // 400 for bad JSON, 413 for a body over the limit, 415 without a
        // JSON content type: the status the rejection carries.
        Err(rejection) => {
            return error(rejection.status(), format!("malformed request: {}", rejection.body_text()), Some("body"))
        }
    };
    match prompt(&app.served, &body).and_then(|prompt| parse_request(&app.served, &body, prompt)) {
        Ok(request) => respond(app, request, chat).await,
        Err(response) => response,
    }
}

async fn completions(State(app): State<Arc<App>>, body: Result<Json<Value>, JsonRejection>) -> Response {
    complete(app, body, prompt_of, false).await
}

async fn chat_completions(State(app): State<Arc<App>>, body: Result<Json<Value>, JsonRejection>) -> Response {
    complete(app, body, chat_prompt, true).await
}

async fn models(State(app): State<Arc<App>>) -> Json<Value> {
    Json(
        json!({ "object": "list", "data": [{ "id": app.served.limits.model, "object": "model", "created": 0, "owned_by": "linnet" }] }),
    )
}

async fn health() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// Serves until Ctrl-C: `queue` requests may wait for a row beyond the
/// model's rows; more are answered 429 with `Retry-After`. The model is
/// loaded by `load` on the scheduler thread.
pub fn serve(
    load: impl FnOnce() -> Result<Loaded, String> + Send + 'static,
    host: &str,
    port: u16,
    queue: usize,
) -> Result<(), String> {
    let (jobs, receiver) = mpsc::channel::<Job>();
    let (ready, started) = mpsc::channel::<Result<(Limits, Option<TextModel>), String>>();
    let scheduler = std::thread::spawn(move || {
        let loaded = match load().and_then(|loaded| limits(&loaded.machine).map(|limits| (loaded, limits))) {
            Ok(loaded) => loaded,
            Err(message) => {
                let _ = ready.send(Err(message));
                return;
            }
        };
        let (Loaded { machine, text, .. }, limits) = loaded;
        let _ = ready.send(Ok((limits.clone(), text)));
        schedule(machine, limits, receiver);
    });
    let (limits, text) = started.recv().map_err(|_| "the model thread stopped".to_string())??;
    let capacity = limits.rows + queue;
    let app = Arc::new(App {
        jobs: std::sync::Mutex::new(jobs),
        served: Served { limits, text },
        held: Arc::new(AtomicUsize::new(0)),
        capacity,
    });
    let router = Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .with_state(app.clone());
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|e| e.to_string())?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind((host, port))
            .await
            .map_err(|e| format!("cannot listen on {host}:{port}: {e}"))?;
        let address = listener.local_addr().map_err(|e| e.to_string())?;
        eprintln!(
            "linnet: serving `{}` on http://{address} ({} rows)",
            app.served.limits.model, app.served.limits.rows
        );
        tracing::info!(%address, "serving");
        axum::serve(listener, router)
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
                eprintln!("linnet: shutting down");
            })
            .await
            .map_err(|e| e.to_string())
    })?;
    drop(runtime);
    let _ = scheduler.join();
    Ok(())
}
