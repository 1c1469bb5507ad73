//! `linnet serve` as clients use it: concurrent requests get the tokens
//! each gets alone (more requests than rows wait their turn), bad requests
//! get a 4xx with an OpenAI-style error and the server keeps serving, a
//! client that disconnects frees its row, and Ctrl-C stops it cleanly.

use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;

mod common;
use common::server::Server;
use common::{altered, root};

#[test]
fn a_server_session() {
    let server = Server::start();
    assert_eq!(server.call("GET", "/health", "").0, 200);
    let (_, models) = server.call("GET", "/v1/models", "");
    assert!(models.contains("tiny-qwen3.5-moe-f32"), "{models}");

    // Alone, then three at once on two rows: the same tokens each time.
    let prompts: [&[i64]; 3] = [&[5, 17, 42], &[393, 201, 20, 376, 357, 9, 1], &[7]];
    let alone: Vec<Vec<i64>> = prompts.iter().map(|p| server.complete(p, 10)).collect();
    let together: Vec<Vec<i64>> = std::thread::scope(|scope| {
        let handles: Vec<_> = prompts.iter().map(|p| scope.spawn(|| server.complete(p, 10))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(alone, together);
    // And the same as `generate` through prefill/decode.
    let options = linnet_frontend::package::LoadOptions {
        nest: Some(root().join("tests/fixtures/oracle/tiny-qwen3.5-moe/package/nest-f32.toml")),
        stdlib: Some(root().join("stdlib")),
        ..Default::default()
    };
    let weights = linnet_runtime::Weights::Checkpoint {
        dir: Some(root().join("tests/fixtures/oracle/tiny-qwen3.5-moe/weights-f32")),
        non_finite: linnet_runtime::weights::NonFinite::Refuse,
    };
    let mut machine = common::load(&root().join("models/qwen3.6-35b-a3b"), &options, &weights).unwrap().machine;
    assert_eq!(alone[0], linnet_runtime::generate::greedy(&mut machine, prompts[0], 10).unwrap());

    // Text in, text out, and the chat endpoint, streaming.
    let (status, body) =
        server.call("POST", "/v1/completions", r#"{"prompt": "t5 t17 t42", "max_tokens": 3, "temperature": 0}"#);
    assert_eq!(status, 200);
    let expected: Vec<String> = alone[0][..3].iter().map(|id| format!("t{id}")).collect();
    assert!(body.contains(&format!(r#""text":"{}""#, expected.join(" "))), "{body}");
    let (status, body) = server.call(
        "POST",
        "/v1/chat/completions",
        r#"{"messages": [{"role": "user", "content": "t1 t2"}], "max_tokens": 3, "stream": true}"#,
    );
    assert_eq!(status, 200);
    assert!(body.contains("chat.completion.chunk") && body.contains("data: [DONE]"), "{body}");

    // Bad requests: 4xx, an OpenAI-style error, and the server goes on.
    let long: Vec<i64> = (0..70).collect();
    let bad = [
        "{not json".to_string(),
        json!({ "prompt": long }).to_string(),
        json!({ "prompt": [1, 2], "max_tokens": "many" }).to_string(),
        json!({ "prompt": [1, 2], "max_tokens": 1000 }).to_string(),
        json!({ "prompt": [1, 99999] }).to_string(),
        json!({ "prompt": [1, 2], "temperature": -1 }).to_string(),
        json!({ "max_tokens": 3 }).to_string(),
    ];
    for body in &bad {
        let (status, response) = server.call("POST", "/v1/completions", body);
        assert_eq!(status, 400, "{body} -> {response}");
        let error: Value = serde_json::from_str(&response).unwrap();
        assert_eq!(error["error"]["type"], "invalid_request_error", "{response}");
    }
    let (status, _) = server.call("POST", "/v1/chat/completions", r#"{"messages": "hi"}"#);
    assert_eq!(status, 400);
    // Fields that would change the answer and are not done yet are refused
    // by name, not ignored; their "not asked for" values are accepted.
    for (field, value) in [
        ("n", json!(0)),
        ("suffix", json!("t9")),
        ("prompt_logprobs", json!(1)),
        ("stream_options", json!({ "include_usage": true })),
    ] {
        // (`stream_options` belongs to a stream: refused without one.)
        let mut body = json!({ "prompt": [1, 2], "max_tokens": 2 });
        body[field] = value;
        let (status, response) = server.call("POST", "/v1/completions", &body.to_string());
        assert!(status == 400 && response.contains(&format!("`{field}`")), "{field}: {status} {response}");
    }
    let accepted = json!({ "prompt": [1, 2], "max_tokens": 2, "n": 1, "logprobs": false, "echo": false, "suffix": "", "prompt_logprobs": 0, "stop": [], "stream_options": null, "temperature": 0 });
    let (status, response) = server.call("POST", "/v1/completions", &accepted.to_string());
    assert_eq!(status, 200, "{response}");
    // Another model's name is a 404; the model's own name is fine.
    let (status, response) =
        server.call("POST", "/v1/completions", &json!({ "prompt": [1, 2], "model": "gpt-4" }).to_string());
    assert!(status == 404 && response.contains("gpt-4"), "{status} {response}");
    let (_, models) = server.call("GET", "/v1/models", "");
    let name = serde_json::from_str::<Value>(&models).unwrap()["data"][0]["id"].clone();
    let (status, response) = server.call(
        "POST",
        "/v1/completions",
        &json!({ "prompt": [1, 2], "max_tokens": 1, "model": name }).to_string(),
    );
    assert_eq!(status, 200, "{response}");
    // Stop strings: the text ends before the first, in full answers and
    // in streams; without a tokenizer's text they are refused.
    let (_, full) =
        server.call("POST", "/v1/completions", r#"{"prompt": "t5 t17 t42", "max_tokens": 10, "temperature": 0}"#);
    let full: Value = serde_json::from_str(&full).unwrap();
    let full_text = full["choices"][0]["text"].as_str().unwrap().to_string();
    let stop = format!("t{}", alone[0][4]);
    let expected = &full_text[..full_text.find(&stop).unwrap()];
    let body =
        json!({ "prompt": "t5 t17 t42", "max_tokens": 10, "temperature": 0, "stop": [stop, "never"] }).to_string();
    let (status, response) = server.call("POST", "/v1/completions", &body);
    let answer: Value = serde_json::from_str(&response).unwrap();
    assert!(
        status == 200 && answer["choices"][0]["text"] == expected && answer["choices"][0]["finish_reason"] == "stop",
        "{response}"
    );
    let streamed =
        json!({ "prompt": "t5 t17 t42", "max_tokens": 10, "temperature": 0, "stop": stop, "stream": true }).to_string();
    let (status, response) = server.call("POST", "/v1/completions", &streamed);
    let pieces: String = response
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line.strip_prefix("data: ")?).ok())
        .map(|chunk| chunk["choices"][0]["text"].as_str().unwrap_or_default().to_string())
        .collect();
    assert!(status == 200 && pieces == expected && response.contains(r#""finish_reason":"stop""#), "{response}");
    // `n` choices, each sampled from its own seed (`seed + i`): the same
    // request gives the same choices, the first is the `n: 1` answer, and a
    // stream gives each choice's text under its index. Three choices on
    // two rows: the third waits for a row.
    let sampled = json!({ "prompt": "t5 t17 t42", "max_tokens": 6, "temperature": 1.0, "seed": 11, "n": 3 });
    let texts = |response: &str| -> Vec<String> {
        let answer: Value = serde_json::from_str(response).unwrap();
        let choices = answer["choices"].as_array().unwrap();
        assert!(choices.iter().enumerate().all(|(at, c)| c["index"] == at), "{response}");
        assert_eq!(answer["usage"]["completion_tokens"], 18, "{response}");
        choices.iter().map(|c| c["text"].as_str().unwrap().to_string()).collect()
    };
    let (status, first) = server.call("POST", "/v1/completions", &sampled.to_string());
    assert_eq!(status, 200, "{first}");
    let (_, again) = server.call("POST", "/v1/completions", &sampled.to_string());
    let choices = texts(&first);
    assert_eq!(choices, texts(&again));
    assert!(choices[0] != choices[1] || choices[1] != choices[2], "three samples, all alike: {choices:?}");
    let mut one = sampled.clone();
    one["n"] = json!(1);
    let (_, single) = server.call("POST", "/v1/completions", &one.to_string());
    let single: Value = serde_json::from_str(&single).unwrap();
    assert_eq!(single["choices"][0]["text"], choices[0].as_str());
    let mut streamed = sampled.clone();
    streamed["stream"] = json!(true);
    let (_, response) = server.call("POST", "/v1/completions", &streamed.to_string());
    let mut pieces = vec![String::new(); 3];
    for chunk in response.lines().filter_map(|line| serde_json::from_str::<Value>(line.strip_prefix("data: ")?).ok()) {
        let delta = &chunk["choices"][0];
        pieces[delta["index"].as_u64().unwrap() as usize].push_str(delta["text"].as_str().unwrap());
    }
    assert_eq!(pieces, choices, "{response}");
    let (status, response) = server.call("POST", "/v1/completions", &json!({ "prompt": [1], "n": 17 }).to_string());
    assert!(status == 400 && response.contains("`n`"), "{status} {response}");
    // Streamed usage, asked for: every chunk says `usage: null`, then one
    // without choices carries the counts of the answer the stream gave.
    let asked = json!({ "prompt": "t5 t17 t42", "max_tokens": 4, "temperature": 0, "stream": true, "stream_options": { "include_usage": true } });
    let (status, response) = server.call("POST", "/v1/completions", &asked.to_string());
    let chunks: Vec<Value> =
        response.lines().filter_map(|line| serde_json::from_str(line.strip_prefix("data: ")?).ok()).collect();
    let (last, answer) = chunks.split_last().unwrap();
    assert!(
        status == 200 && answer.iter().all(|c| c["usage"].is_null() && c["choices"].as_array().unwrap().len() == 1)
    );
    assert_eq!(last["choices"], json!([]), "{response}");
    let usage = json!({ "prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7, "prompt_tokens_details": { "cached_tokens": 0 } });
    assert_eq!(last["usage"], usage, "{response}");
    let not_asked =
        json!({ "prompt": [1, 2], "max_tokens": 2, "stream": true, "stream_options": { "include_usage": false } });
    let (_, response) = server.call("POST", "/v1/completions", &not_asked.to_string());
    assert!(!response.contains("usage"), "{response}");
    for bad in [json!({ "include_usage": 1 }), json!({ "continuous_usage_stats": true }), json!("yes")] {
        let body = json!({ "prompt": [1, 2], "stream": true, "stream_options": bad });
        let (status, response) = server.call("POST", "/v1/completions", &body.to_string());
        assert!(status == 400 && response.contains("stream_options"), "{bad}: {status} {response}");
    }
    for refused in [json!(["a", "b", "c", "d", "e"]), json!([""]), json!(7)] {
        let (status, response) =
            server.call("POST", "/v1/completions", &json!({ "prompt": [1, 2], "stop": refused }).to_string());
        assert!(status == 400 && response.contains("`stop`"), "{refused}: {status} {response}");
    }
    // A body over the limit (8 MiB here, room for a full context's text
    // beyond) is a 413: one just over it, all of it sent.
    let huge = format!(r#"{{"prompt": "{}"}}"#, "t1 ".repeat(((8 << 20) + (64 << 10)) / 3));
    assert_eq!(server.call("POST", "/v1/completions", &huge).0, 413);
    // Content as text parts, as the chat API allows.
    let parts = json!({ "messages": [{ "role": "user", "content": [{ "type": "text", "text": "t1" }, { "type": "text", "text": " t2" }] }], "max_tokens": 2 });
    let (status, response) = server.call("POST", "/v1/chat/completions", &parts.to_string());
    assert_eq!(status, 200, "{response}");
    // `max_completion_tokens` bounds the answer as `max_tokens` does.
    let (status, response) = server.call(
        "POST",
        "/v1/chat/completions",
        &json!({ "messages": [{ "role": "user", "content": "t1" }], "max_completion_tokens": 1000 }).to_string(),
    );
    assert_eq!(status, 400, "{response}");

    // A streaming client that goes away frees its row.
    for _ in 0..3 {
        let mut stream = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
        let body = json!({ "prompt": [3, 4], "max_tokens": 50, "stream": true }).to_string();
        write!(stream, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
        let mut first = [0u8; 64];
        let _ = stream.read(&mut first).unwrap();
        drop(stream);
    }
    assert_eq!(server.complete(prompts[0], 10), alone[0]);
}

/// With no room to wait, a request beyond the rows is answered 429 with
/// `Retry-After` at once; once the rows free, requests are served again.
#[test]
fn a_full_server_answers_429() {
    let server = Server::start_with(&["--queue", "0"]);
    let (_, models) = server.call("GET", "/v1/models", "");
    assert!(models.contains("tiny"), "{models}");
    let rows = 2;
    let streams: Vec<TcpStream> = (0..rows)
        .map(|_| {
            let mut stream = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
            let body = json!({ "prompt": [3, 4], "max_tokens": 60, "stream": true }).to_string();
            write!(stream, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
            let mut first = [0u8; 16];
            let _ = stream.read(&mut first).unwrap();
            stream
        })
        .collect();
    let mut stream = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    let body = json!({ "prompt": [1, 2], "max_tokens": 2 }).to_string();
    write!(stream, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 429") && response.to_lowercase().contains("retry-after: 1"), "{response}");
    assert!(
        response.contains(r#""type":"requests""#) && response.contains(r#""code":"rate_limit_exceeded""#),
        "{response}"
    );
    drop(streams);
    let served = (0..50).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(100));
        server.call("POST", "/v1/completions", &body).0 == 200
    });
    assert!(served, "requests are served again once the rows are free");
}

#[test]
fn ctrl_c_stops_the_server() {
    let mut server = Server::start();
    assert_eq!(server.call("GET", "/health", "").0, 200);
    let status = Command::new("kill").args(["-INT", &server.child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let exit = server.child.wait().unwrap();
    assert!(exit.success(), "{exit:?}");
}

/// Under load, `/metrics` says what a router reads (vLLM's names: rows
/// running, requests waiting, the states' use, the cache's config, the
/// latency and token histograms); then SIGTERM drains, as Kubernetes stops
/// a pod: new requests get 503 and `/ready` fails (`/health`, liveness,
/// does not), the streams already open go on until `--drain-timeout`, then
/// each ends with a `finish_reason` and `[DONE]`, and the server exits
/// cleanly.
#[test]
fn sigterm_drains_the_open_streams() {
    // Answers far longer than the drain's half second, so the drain, not
    // their length, ends them.
    let mut server = Server::start_with(&["--set", "MaxSeq=16000", "--drain-timeout", "0.5"]);
    assert_eq!(server.call("GET", "/ready", "").0, 200);
    let port = server.port;
    let streams: Vec<_> = (0..3)
        .map(|at| {
            std::thread::spawn(move || {
                let body = json!({ "prompt": [1, 2 + at], "max_tokens": 15900, "temperature": 0, "ignore_eos": true, "stream": true }).to_string();
                let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
                write!(stream, "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
                let mut response = String::new();
                stream.read_to_string(&mut response).unwrap();
                response
            })
        })
        .collect();
    // Each stream under way (its first tokens sent) before the signal.
    let running = (0..100).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(50));
        server
            .call("GET", "/metrics", "")
            .1
            .contains("vllm:num_requests_running{model_name=\"tiny-qwen3.5-moe-f32\"} 2")
    });
    assert!(running, "two rows decoding");
    // What the Gateway API Inference Extension reads, under vLLM's names:
    // the third request waits, the rows' states are partly in use.
    let metrics = server.call("GET", "/metrics", "").1;
    let sample = |name: &str| -> f64 {
        let line =
            metrics.lines().find(|line| line.starts_with(name)).unwrap_or_else(|| panic!("no {name}:\n{metrics}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert_eq!(sample("vllm:num_requests_waiting{"), 1.0, "{metrics}");
    let usage = sample("vllm:kv_cache_usage_perc{");
    assert!(usage > 0.0 && usage < 1.0, "{usage}");
    assert!(
        metrics.contains("vllm:cache_config_info{model_name=\"tiny-qwen3.5-moe-f32\",block_size=\"64\""),
        "{metrics}"
    );
    for histogram in [
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_prompt_tokens",
        "vllm:request_generation_tokens",
    ] {
        assert!(metrics.contains(&format!("# TYPE {histogram} histogram")), "{histogram}");
    }
    let status = Command::new("kill").args(["-TERM", &server.child.id().to_string()]).status().unwrap();
    assert!(status.success());
    std::thread::sleep(std::time::Duration::from_millis(100));
    let (refused, response) =
        server.call("POST", "/v1/completions", &json!({ "prompt": [1, 2], "max_tokens": 2 }).to_string());
    assert!(refused == 503 && response.contains("draining"), "{refused} {response}");
    assert_eq!(server.call("GET", "/ready", "").0, 503);
    assert_eq!(server.call("GET", "/health", "").0, 200);
    for stream in streams {
        let response = stream.join().unwrap();
        let chunks: Vec<Value> = response
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line.strip_prefix("data: ")?).ok())
            .collect();
        let last = chunks.last().unwrap_or_else(|| panic!("{response}"));
        assert_eq!(last["choices"][0]["finish_reason"], "abort", "{last}");
        let done = response.find("data: [DONE]").unwrap_or_else(|| panic!("{response}"));
        assert!(response.rfind(r#""finish_reason":"abort""#) < Some(done), "{response}");
    }
    let exit = server.child.wait().unwrap();
    assert!(exit.success(), "{exit:?}");
}

/// What a client of vLLM or llama-server sends, honoured as they do: an
/// answer without `max_tokens` runs to the end of the context, sampling
/// without `seed` differs request to request, `logit_bias`, `top_k: -1`,
/// `ignore_eos`, `echo`, a list of prompts; a stream's deltas as vLLM's;
/// routes and methods it does not have, another model at `/tokenize`, in
/// OpenAI's error shape. (Constrained output and chat rendering need a
/// real vocabulary: `structured_output_holds_on_a_real_vocabulary`.)
#[test]
fn the_server_as_vllm_clients_expect() {
    let server = Server::start();
    let post = |body: Value| {
        let (status, response) = server.call("POST", "/v1/completions", &body.to_string());
        assert_eq!(status, 200, "{body} -> {response}");
        serde_json::from_str::<Value>(&response).unwrap()
    };
    let ids = |answer: &Value, at: usize| -> Vec<i64> {
        answer["choices"][at]["token_ids"].as_array().unwrap().iter().map(|id| id.as_i64().unwrap()).collect()
    };
    // To the end of the context (64 positions, a prompt of 2), unless an
    // end of turn comes first.
    let whole = post(json!({ "prompt": [1, 2], "temperature": 0, "ignore_eos": true }));
    assert_eq!(
        (whole["usage"]["completion_tokens"].as_u64(), whole["choices"][0]["finish_reason"].as_str()),
        (Some(62), Some("length")),
        "{whole}"
    );
    // Without a seed, three samples are not one.
    let samples: Vec<Vec<i64>> =
        (0..3).map(|_| ids(&post(json!({ "prompt": [1, 2], "max_tokens": 8, "temperature": 1.0 })), 0)).collect();
    assert!(samples[0] != samples[1] || samples[1] != samples[2], "{samples:?}");
    // A bias of 100 makes token 7 the answer, greedy or not; -1 is top_k off.
    let biased =
        post(json!({ "prompt": [1, 2], "max_tokens": 4, "temperature": 1.0, "top_k": -1, "logit_bias": { "7": 100 } }));
    assert_eq!(ids(&biased, 0), [7, 7, 7, 7], "{biased}");
    for (field, value) in
        [("logit_bias", json!({ "99999": 1 })), ("logit_bias", json!({ "7": 101 })), ("top_p", json!(0))]
    {
        let mut body = json!({ "prompt": [1, 2], "max_tokens": 2 });
        body[field] = value;
        let (status, response) = server.call("POST", "/v1/completions", &body.to_string());
        let error: Value = serde_json::from_str(&response).unwrap();
        assert!(status == 400 && error["error"]["param"] == field, "{field}: {status} {response}");
    }
    // A list of prompts, `n` each: choice `i` answers prompt `i / n`, as the
    // prompt alone would; `echo` puts each prompt's text first.
    let listed = post(json!({ "prompt": ["t5 t17", "t42"], "n": 2, "max_tokens": 3, "temperature": 0, "echo": true }));
    assert_eq!(listed["choices"].as_array().unwrap().len(), 4, "{listed}");
    for (at, prompt) in [(0, "t5 t17"), (1, "t5 t17"), (2, "t42"), (3, "t42")] {
        let alone = post(json!({ "prompt": prompt, "max_tokens": 3, "temperature": 0 }));
        assert_eq!(ids(&listed, at), ids(&alone, 0), "choice {at}");
        let text = listed["choices"][at]["text"].as_str().unwrap();
        assert_eq!(text, format!("{prompt}{}", alone["choices"][0]["text"].as_str().unwrap()), "choice {at}");
    }
    assert_eq!(listed["usage"]["prompt_tokens"], 3, "each prompt counted once: {listed}");
    let token_lists = post(json!({ "prompt": [[5, 17], [42]], "max_tokens": 3, "temperature": 0 }));
    assert_eq!((ids(&token_lists, 0), ids(&token_lists, 1)), (ids(&listed, 0), ids(&listed, 2)));
    // A stream's first delta has the role; later ones only what they add.
    let (_, streamed) = server.call(
        "POST",
        "/v1/chat/completions",
        &json!({ "messages": [{ "role": "user", "content": "t1 t2" }], "max_tokens": 4, "stream": true, "temperature": 0 }).to_string(),
    );
    let deltas: Vec<Value> = streamed
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line.strip_prefix("data: ")?).ok())
        .map(|chunk| chunk["choices"][0]["delta"].clone())
        .collect();
    assert_eq!(deltas[0]["role"], "assistant", "{streamed}");
    assert!(
        deltas[1..].iter().all(|delta| delta.get("role").is_none() && delta.get("content") != Some(&json!(""))),
        "{streamed}"
    );
    // Routes and methods the server does not have; another model's name.
    for (method, path, status) in [("GET", "/v2/nothing", 404), ("GET", "/v1/completions", 405)] {
        let (got, response) = server.call(method, path, "");
        let error: Value = serde_json::from_str(&response).unwrap_or_default();
        assert!(got == status && error["error"]["message"].is_string(), "{method} {path}: {got} {response}");
    }
    let (status, _) = server.call("POST", "/tokenize", &json!({ "prompt": "t5", "model": "gpt-4" }).to_string());
    assert_eq!(status, 404);
}

/// What clients of an OpenAI-compatible server lean on: an API key on every
/// `/v1` route (not `/health`), a model's own card, tokenize and
/// detokenize, OpenAI's ranges and whole numbers, penalties, ids that never
/// repeat, fields not done yet refused by name, and `/metrics`.
#[test]
fn the_server_for_clients_and_operators() {
    let server = Server::start_with(&["--api-key", "sk-test"]);
    let key = "Authorization: Bearer sk-test\r\n";
    let body = json!({ "prompt": [1, 2], "max_tokens": 2, "temperature": 0 }).to_string();
    for headers in ["", "Authorization: Bearer sk-tesT\r\n", "Authorization: sk-test\r\n"] {
        let (status, response) = server.call_with("POST", "/v1/completions", &body, headers);
        assert!(status == 401 && response.contains("invalid_api_key"), "{headers:?}: {status} {response}");
    }
    assert_eq!(server.call_with("GET", "/v1/models", "", "").0, 401);
    assert_eq!(server.call("GET", "/health", "").0, 200);
    let call = |method: &str, path: &str, body: &str| server.call_with(method, path, body, key);
    // The scheme's name is not case-sensitive.
    assert_eq!(server.call_with("GET", "/v1/models", "", "Authorization: bearer sk-test\r\n").0, 200);

    let (status, first) = call("POST", "/v1/completions", &body);
    let (_, second) = call("POST", "/v1/completions", &body);
    assert_eq!(status, 200, "{first}");
    let id = |response: &str| serde_json::from_str::<Value>(response).unwrap()["id"].as_str().unwrap().to_string();
    assert_ne!(id(&first), id(&second), "response ids repeat");

    let (_, models) = call("GET", "/v1/models", "");
    let name = serde_json::from_str::<Value>(&models).unwrap()["data"][0]["id"].as_str().unwrap().to_string();
    let (status, card) = call("GET", &format!("/v1/models/{name}"), "");
    assert!(status == 200 && card.contains(&format!(r#""id":"{name}""#)), "{card}");
    assert_eq!(call("GET", "/v1/models/gpt-4", "").0, 404);

    let (status, tokens) = call("POST", "/tokenize", r#"{"prompt": "t5 t17 t42", "return_token_strs": true}"#);
    let tokens: Value = serde_json::from_str(&tokens).unwrap();
    assert!(status == 200 && tokens["count"] == 3, "{tokens}");
    assert_eq!(tokens["token_strs"], json!(["t5", "t17", "t42"]), "{tokens}");
    let (status, text) = call("POST", "/detokenize", &json!({ "tokens": tokens["tokens"] }).to_string());
    assert!(status == 200 && text.contains(r#""prompt":"t5 t17 t42""#), "{text}");
    assert_eq!(call("POST", "/detokenize", r#"{"tokens": [1, -2]}"#).0, 400);
    let chat = json!({ "messages": [{ "role": "user", "content": "t5" }] }).to_string();
    assert_eq!(call("POST", "/tokenize", &chat).0, 200);

    // Whole numbers in OpenAI's ranges, said plainly; penalties honoured.
    for (field, value, said) in [
        ("max_tokens", json!(0), "whole number from 1 to"),
        ("max_tokens", json!(2.7), "whole number from 1 to"),
        ("seed", json!(18446744073709552000.0), "whole number from 0 to"),
        ("seed", json!(-1), "whole number from 0 to"),
        ("frequency_penalty", json!(3), "-2..=2"),
        ("presence_penalty", json!("high"), "must be a number"),
        ("tools", json!([{ "type": "function", "function": { "name": "f" } }]), "`tools`"),
        ("tool_choice", json!("required"), "`tool_choice`: there are no tools to call"),
        // The oracle's word-level tokenizer cannot constrain output.
        ("response_format", json!({ "type": "json_object" }), "byte-level BPE tokenizer"),
    ] {
        let mut request = json!({ "prompt": [1, 2] });
        request[field] = value.clone();
        let (status, response) = call("POST", "/v1/completions", &request.to_string());
        assert!(status == 400 && response.contains(said), "{field} = {value}: {status} {response}");
        assert!(response.len() < 400, "a plain message: {response}");
    }
    let (status, response) = call("POST", "/v1/chat/completions", r#"{"messages": []}"#);
    assert!(status == 400 && response.contains("`messages` is empty"), "{response}");
    let penalized = json!({ "prompt": [1, 2], "max_tokens": 4, "temperature": 0, "frequency_penalty": 2, "presence_penalty": 2, "seed": 3 });
    assert_eq!(call("POST", "/v1/completions", &penalized.to_string()).0, 200);
    let accepted = json!({ "prompt": [1, 2], "max_tokens": 2.0, "tools": [], "tool_choice": "none", "response_format": { "type": "text" } });
    assert_eq!(call("POST", "/v1/completions", &accepted.to_string()).0, 200);

    // Log-probabilities: the greedy token is the likeliest, streamed and
    // whole answers agree, the chat API's shape and the completions API's.
    let asked = json!({ "prompt": [5, 17, 42], "max_tokens": 4, "temperature": 0, "logprobs": 3 });
    let (status, whole) = call("POST", "/v1/completions", &asked.to_string());
    assert_eq!(status, 200, "{whole}");
    let whole: Value = serde_json::from_str(&whole).unwrap();
    let found = &whole["choices"][0]["logprobs"];
    let chosen: Vec<f64> = found["token_logprobs"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    assert_eq!(chosen.len(), 4, "{found}");
    for (lp, top) in chosen.iter().zip(found["top_logprobs"].as_array().unwrap()) {
        let top: Vec<f64> = top.as_object().unwrap().values().map(|v| v.as_f64().unwrap()).collect();
        assert!(top.len() <= 3 && *lp <= 0.0, "{found}");
        assert_eq!(*lp, top.iter().cloned().fold(f64::NEG_INFINITY, f64::max), "greedy is the likeliest: {found}");
    }
    let mut streamed = asked.clone();
    streamed["stream"] = json!(true);
    let (_, events) = call("POST", "/v1/completions", &streamed.to_string());
    let streamed_lps: Vec<f64> = events
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line.strip_prefix("data: ")?).ok())
        .filter_map(|chunk| chunk["choices"][0]["logprobs"]["token_logprobs"][0].as_f64())
        .collect();
    assert_eq!(streamed_lps, chosen, "{events}");
    let chat = json!({ "messages": [{ "role": "user", "content": "t5 t17" }], "max_tokens": 3, "temperature": 0, "logprobs": true, "top_logprobs": 2 });
    let (status, answer) = call("POST", "/v1/chat/completions", &chat.to_string());
    let answer: Value = serde_json::from_str(&answer).unwrap();
    let content = answer["choices"][0]["logprobs"]["content"].as_array().unwrap_or_else(|| panic!("{answer}"));
    assert!(status == 200 && content.len() == 3, "{answer}");
    for entry in content {
        let top = entry["top_logprobs"].as_array().unwrap();
        assert!(
            top.len() == 2 && entry["logprob"] == top[0]["logprob"] && entry["token"] == top[0]["token"],
            "{entry}"
        );
    }
    for refused in
        [json!({ "top_logprobs": 2 }), json!({ "logprobs": true, "top_logprobs": 21 }), json!({ "logprobs": 3 })]
    {
        let mut request = json!({ "messages": [{ "role": "user", "content": "t5" }] });
        for (field, value) in refused.as_object().unwrap() {
            request[field] = value.clone();
        }
        let (status, response) = call("POST", "/v1/chat/completions", &request.to_string());
        assert!(status == 400 && response.contains("logprobs"), "{refused}: {response}");
    }

    // Tools: offered to the model through its template (`auto`), a past
    // call and its result read back; a choice that would force a call is
    // refused by name, as are tools on the completions API.
    let weather = json!([{ "type": "function", "function": { "name": "get_weather", "parameters": {
        "type": "object", "properties": { "city": { "type": "string" } } } } }]);
    let history = json!([
        { "role": "user", "content": "t5" },
        { "role": "assistant", "content": null, "tool_calls": [{ "id": "call_1", "type": "function",
            "function": { "name": "get_weather", "arguments": "{\"city\": \"Paris\"}" } }] },
        { "role": "tool", "tool_call_id": "call_1", "content": "t17" },
    ]);
    for choice in [json!("auto"), json!("none"), Value::Null] {
        let request = json!({ "messages": history, "tools": weather, "tool_choice": choice, "max_tokens": 2 });
        let (status, response) = call("POST", "/v1/chat/completions", &request.to_string());
        assert_eq!(status, 200, "{choice}: {response}");
    }
    for (request, said) in [
        // A forced call needs constrained output: not over a word-level tokenizer.
        (json!({ "messages": history, "tools": weather, "tool_choice": "required" }), "byte-level BPE tokenizer"),
        (
            json!({ "messages": history, "tools": weather, "tool_choice": { "type": "function", "function": { "name": "get_weather" } } }),
            "byte-level BPE tokenizer",
        ),
        (json!({ "messages": history, "tools": [{ "type": "retrieval" }] }), "each tool must be"),
        (json!({ "messages": history, "tools": "get_weather" }), "`tools` must be an array"),
    ] {
        let (status, response) = call("POST", "/v1/chat/completions", &request.to_string());
        assert!(status == 400 && response.contains(said), "{request}: {response}");
    }

    // `/metrics`, open like `/health`, in Prometheus' text format.
    let (status, metrics) = server.call("GET", "/metrics", "");
    assert_eq!(status, 200);
    let sample = |name: &str| -> f64 {
        let line = metrics.lines().find(|line| line.starts_with(name)).unwrap_or_else(|| panic!("{name}: {metrics}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert!(sample("linnet_requests_total{endpoint=\"completions\",status=\"200\"}") >= 6.0, "{metrics}");
    assert!(sample("linnet_requests_total{endpoint=\"completions\",status=\"400\"}") >= 9.0, "{metrics}");
    assert!(sample("linnet_time_to_first_token_seconds_count") >= 4.0, "{metrics}");
    assert!(sample("linnet_generation_tokens_total") >= 8.0, "{metrics}");
    // The gauges follow the scheduler, which frees a row just after its
    // last token is sent: idle soon after.
    let idle = (0..100).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(20));
        let metrics = server.call("GET", "/metrics", "").1;
        metrics.contains("\nlinnet_requests_running 0\n") && metrics.contains("\nlinnet_requests_waiting 0\n")
    });
    assert!(idle, "the server is idle after its requests");
    for line in metrics.lines().filter(|line| !line.starts_with('#')) {
        let (_, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("{line}"));
        assert!(value.parse::<f64>().is_ok(), "not a sample: {line}");
    }
}

/// A failure after a stream started is an `error` object in the stream, as
/// OpenAI's API sends it, never text in the answer; before the first byte
/// it is a 500.
#[test]
fn a_failure_is_an_error_not_an_answer() {
    const NORM: &str = "model.language_model.norm.weight";
    let weights = altered("nan-serve", NORM, |tensors| {
        for (name, _, _, data) in tensors.iter_mut() {
            if name == NORM {
                data[0..4].copy_from_slice(&f32::NAN.to_le_bytes());
            }
        }
    });
    let server = Server::start_on(&weights, &[]);
    let body = json!({ "prompt": [1, 2], "max_tokens": 3, "stream": true }).to_string();
    let (status, response) = server.call("POST", "/v1/completions", &body);
    assert_eq!(status, 200, "{response}");
    let events: Vec<Value> =
        response.lines().filter_map(|line| serde_json::from_str::<Value>(line.strip_prefix("data: ")?).ok()).collect();
    assert!(
        events.iter().any(|event| event["error"]["message"].as_str().is_some_and(|m| m.contains("NaN"))),
        "{response}"
    );
    assert!(!response.contains("[error"), "{response}");
    assert!(events.iter().all(|event| event["choices"][0]["finish_reason"] != "error"), "{response}");
    let whole = json!({ "prompt": [1, 2], "max_tokens": 3 }).to_string();
    let (status, response) = server.call("POST", "/v1/completions", &whole);
    assert!(status == 500 && response.contains("NaN"), "{status} {response}");
    drop(server);
    std::fs::remove_dir_all(&weights).unwrap();
}

/// Each family's package serves its checkpoint: greedy completions of
/// the oracle's prompts are transformers' tokens (through `prefill_slots`
/// and `decode_rows` as the standard library's decoder provides them), and
/// where the family's chat template is here, a conversation rendered as
/// transformers renders it (`tests/fixtures/chat-templates/rendered.json`,
/// tokenized alike) gets an answer of the length asked for.
#[test]
fn each_family_serves_its_checkpoint_and_chat_template() {
    let templates = root().join("tests/fixtures/chat-templates");
    let golden: Value =
        serde_json::from_str(&std::fs::read_to_string(templates.join("rendered.json")).unwrap()).unwrap();
    for (package, fixture, template) in [
        ("models/llama3", "tiny-llama3", Some("llama3.1")),
        ("models/gpt-oss", "tiny-gpt-oss", Some("gpt-oss")),
        ("models/gemma3", "tiny-gemma3", Some("gemma3")),
        // GPT-2 has no chat template; its rows decode through
        // `DecoderLayer`'s default `decode_rows`.
        ("models/gpt2", "tiny-gpt2", None),
    ] {
        let dir = root().join("tests/fixtures/families").join(fixture);
        let weights = dir.join("weights-f32");
        let mut args = vec!["--weights".to_string(), weights.to_str().unwrap().to_string()];
        if let Some(template) = template {
            args.push("--chat-template".into());
            args.push(templates.join(format!("{template}.jinja")).to_str().unwrap().into());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let server = Server::spawn_package(&root().join(package), &args);
        for sequence in common::golden(&dir, "f32").into_iter().take(3) {
            assert_eq!(server.complete(&sequence.tokens, sequence.greedy.len()), sequence.greedy, "{package}");
        }
        let Some(template) = template else { continue };
        let messages = golden["conversation"].clone();
        let tokens = |body: Value| {
            let (status, response) = server.call("POST", "/tokenize", &body.to_string());
            assert_eq!(status, 200, "{package}: {response}");
            serde_json::from_str::<Value>(&response).unwrap()["tokens"].clone()
        };
        let ours = tokens(json!({ "messages": messages }));
        assert_eq!(ours, tokens(json!({ "prompt": golden["rendered"][template] })), "{package}");
        let body = json!({ "messages": messages, "max_tokens": 4, "temperature": 0 });
        let (status, response) = server.call("POST", "/v1/chat/completions", &body.to_string());
        assert_eq!(status, 200, "{package}: {response}");
        let answer: Value = serde_json::from_str(&response).unwrap();
        assert_eq!(answer["usage"]["prompt_tokens"], ours.as_array().unwrap().len(), "{package}: {answer}");
        assert_eq!(answer["usage"]["completion_tokens"], 4, "{package}: {answer}");
        assert_eq!(answer["choices"][0]["finish_reason"], "length", "{package}: {answer}");
    }
}

/// A family whose sliding layers keep rings of their window: its package,
/// its tiny checkpoint's fixture and that checkpoint's window.
type Ringed = (&'static str, &'static str, usize);

/// gpt-oss (attention with sinks, a window of 5 in the tiny checkpoint)
/// and Gemma 3 (a window of 4, five sliding layers to a global one and two
/// after them).
const RINGED: [Ringed; 2] = [("models/gpt-oss", "tiny-gpt-oss", 5), ("models/gemma3", "tiny-gemma3", 4)];

/// The sliding layers' rings wrap within the prompts here: each family's
/// greedy tokens are transformers' alone, beside two other requests,
/// after a cached prefix longer than the window (the rings restored
/// whole), and with n-gram drafts checked in one call and refused ones
/// rolled back; the log-probabilities the same bits in every case, on the
/// CPU and on the reference interpreter (attention, with sinks or
/// without, is a kernel whose sums follow a query's admitted keys in
/// order: `docs/language.md`, "Batch invariance").
#[test]
fn sliding_rings_give_the_same_answer_alone_batched_cached_and_drafted() {
    for family in RINGED {
        rings_on(family, "cpu", usize::MAX, 0.0);
        rings_on(family, "interp", 1, 0.0);
    }
}

/// The same on the GPU kernels run on the host by MLIR (`--features
/// nvptx`), for one prompt: the same bits alone, batched and after a
/// cached prefix; with drafts within 1e-5, since a draft's check attends
/// as a prefill does where a decode step splits its keys into parts
/// (`docs/language.md`, "Batch invariance").
#[cfg(feature = "nvptx")]
#[test]
fn gpu_kernels_on_the_host_give_sliding_rings_the_same_answer_alone_batched_cached_and_drafted() {
    for family in RINGED {
        rings_on(family, "mlir-host", 1, 1e-5);
    }
}

/// [`sliding_rings_give_the_same_answer_alone_batched_cached_and_drafted`]
/// for `family` on `backend`, for up to `sequences` of the oracle's
/// prompts longer than the window: log-probabilities the same bits, with
/// drafts within `drafted`.
fn rings_on((package, fixture, window): Ringed, backend: &str, sequences: usize, drafted: f64) {
    let dir = root().join("tests/fixtures/families").join(fixture);
    let weights = dir.join("weights-f32");
    let args = ["--weights", weights.to_str().unwrap(), "--set", "Batch=4", "--backend", backend];
    let cache = ["--prefix-block", "4", "--prefix-cache-mb", "16"];
    let server = Server::spawn_package(&root().join(package), &[&args[..], &cache[..]].concat());
    let answer = |prompt: &[i64], max_tokens: usize, drafts: usize| {
        let body = json!({ "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "logprobs": 3,
                           "num_speculative_tokens": drafts });
        let (status, body) = server.call("POST", "/v1/completions", &body.to_string());
        assert_eq!(status, 200, "{body}");
        let value: Value = serde_json::from_str(&body).unwrap();
        let choice = &value["choices"][0];
        let cached = value["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0);
        let logprobs: Vec<f64> =
            choice["logprobs"]["token_logprobs"].as_array().unwrap().iter().map(|p| p.as_f64().unwrap()).collect();
        ((choice["token_ids"].clone(), logprobs), cached)
    };
    let agree = |(tokens, logprobs): &(Value, Vec<f64>),
                 (alone, alone_logprobs): &(Value, Vec<f64>),
                 case: &str,
                 tolerance: f64| {
        assert_eq!(tokens, alone, "{package} on {backend}: {case}");
        let apart = logprobs.iter().zip(alone_logprobs).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        assert!(apart <= tolerance, "{package} on {backend}: {case}: log-probabilities {apart:e} apart");
    };
    let all = common::golden(&dir, "f32");
    // Longer than the window by more than the token a cached prefix leaves out.
    let longer_than_the_window: Vec<_> = all.iter().filter(|sequence| sequence.tokens.len() > window + 1).collect();
    assert!(longer_than_the_window.len() >= 2, "prompts longer than the window");
    for sequence in longer_than_the_window.into_iter().take(sequences) {
        let length = sequence.greedy.len();
        let (alone, _) = answer(&sequence.tokens, length, 0);
        assert_eq!(alone.0, json!(sequence.greedy), "{package} on {backend}: transformers' greedy tokens");
        let batched = std::thread::scope(|scope| {
            let others: Vec<_> =
                all.iter().take(2).map(|other| scope.spawn(|| answer(&other.tokens, length, 0))).collect();
            let ours = answer(&sequence.tokens, length, 0).0;
            others.into_iter().for_each(|other| drop(other.join().unwrap()));
            ours
        });
        agree(&batched, &alone, "beside two other requests", 0.0);
        // A request that shares all but the prompt's last token caches the
        // prefix; the prompt then continues from it.
        let mut parted = sequence.tokens[..sequence.tokens.len() - 1].to_vec();
        parted.extend([1, 2, 3, 4, 5]);
        answer(&parted, 1, 0);
        let (after_prefix, found) = answer(&sequence.tokens, length, 0);
        assert!(
            found > window as u64,
            "{package} on {backend}: a cached prefix longer than the window ({found} tokens)"
        );
        agree(&after_prefix, &alone, &format!("after {found} cached tokens"), 0.0);
        let (drafted_answer, _) = answer(&sequence.tokens, length, 3);
        agree(&drafted_answer, &alone, "with n-gram drafts", drafted);
    }
    // Drafts were checked, and some refused: the rings were put back.
    let (_, metrics) = server.call("GET", "/metrics", "");
    let count = |name: &str| -> u64 {
        let line = metrics.lines().find(|line| line.starts_with(name)).unwrap_or_else(|| panic!("no {name}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let (drafted, kept) =
        (count("linnet_spec_decode_draft_tokens_total "), count("linnet_spec_decode_accepted_tokens_total "));
    assert!(drafted > 0 && kept < drafted, "{package} on {backend}: {kept} of {drafted} drafted tokens kept");
}

/// Constrained output over Qwen3.5's real vocabulary (llama.cpp's
/// vocabulary file) and chat template, with random weights: every answer
/// to a JSON schema parses and holds to it, a regex's matches it, thinking
/// is closed before the answer, a forced tool choice gets a call of the
/// template's format with arguments under the tool's schema, a list of
/// choices gives one of them, a GBNF grammar (llama-server's) a sentence of
/// it; a schema that does not compile, a tool that is not there, and a
/// tokenizer that is not byte-level, are refused by name. And a chat
/// rendered as the request's options say.
#[test]
fn structured_output_holds_on_a_real_vocabulary() {
    let vocab = root().join("tests/fixtures/llama-cpp/ggml-vocab-qwen35.gguf");
    let template = root().join("tests/fixtures/chat-templates/qwen3.5.jinja");
    let server = Server::spawn(&[
        "--random-weights",
        "7",
        "--set",
        "Vocab=151936",
        "--set",
        "MaxSeq=640",
        "--tokenizer",
        vocab.to_str().unwrap(),
        "--chat-template",
        template.to_str().unwrap(),
    ]);
    let schema = json!({
        "type": "object",
        "properties": {
            "name": { "type": "string", "maxLength": 8 },
            "age": { "type": "integer", "minimum": 0, "maximum": 150 },
            "pet": { "enum": ["cat", "dog"] },
        },
        "required": ["name", "age", "pet"],
        "additionalProperties": false,
    });
    let chat = |extra: Value| {
        let mut body = json!({
            "messages": [{ "role": "user", "content": "Who are you? Answer in JSON." }],
            "max_tokens": 60,
            "temperature": 1.0,
            "n": 4,
            "seed": 3,
        });
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let (status, response) = server.call("POST", "/v1/chat/completions", &body.to_string());
        (status, serde_json::from_str::<Value>(&response).unwrap_or(Value::String(response)))
    };
    let format =
        json!({ "response_format": { "type": "json_schema", "json_schema": { "name": "who", "schema": schema } } });
    for thinking in [false, true] {
        let mut extra = format.clone();
        extra["chat_template_kwargs"] = json!({ "enable_thinking": thinking });
        let (status, response) = chat(extra);
        assert_eq!(status, 200, "{response}");
        for choice in response["choices"].as_array().unwrap() {
            let content = choice["message"]["content"].as_str().unwrap();
            let answer: Value = serde_json::from_str(content).unwrap_or_else(|e| panic!("{content:?}: {e}"));
            let object = answer.as_object().unwrap();
            assert_eq!(object.len(), 3, "{answer}");
            assert!(object["name"].as_str().is_some_and(|name| name.chars().count() <= 8), "{answer}");
            assert!(object["age"].as_u64().is_some_and(|age| age <= 150), "{answer}");
            assert!(["cat", "dog"].contains(&object["pet"].as_str().unwrap()), "{answer}");
            assert_eq!(choice["finish_reason"], "stop", "{response}");
        }
    }
    let (status, response) = chat(json!({ "response_format": { "type": "json_object" } }));
    assert_eq!(status, 200, "{response}");
    for choice in response["choices"].as_array().unwrap() {
        let content = choice["message"]["content"].as_str().unwrap();
        let parsed: Result<Value, _> = serde_json::from_str(content);
        // An object may be cut at `max_tokens`; one that ended must parse.
        if choice["finish_reason"] == "stop" {
            assert!(parsed.is_ok_and(|v| v.is_object()), "{content:?}");
        }
    }
    let (status, response) = chat(json!({ "structured_outputs": { "regex": "[0-9]{3}-[a-z]{2}" } }));
    assert_eq!(status, 200, "{response}");
    for choice in response["choices"].as_array().unwrap() {
        let content = choice["message"]["content"].as_str().unwrap();
        let bytes = content.as_bytes();
        let shaped = bytes.len() == 6
            && bytes[..3].iter().all(u8::is_ascii_digit)
            && bytes[3] == b'-'
            && bytes[4..].iter().all(u8::is_ascii_lowercase);
        assert!(shaped, "{content:?}");
    }
    // Every choice of this one starts with the same byte (0xC3), which the
    // grammar forces before the model picks the second.
    let (status, response) = chat(json!({ "structured_outputs": { "regex": "(é|ü){1,3}" } }));
    assert_eq!(status, 200, "{response}");
    for choice in response["choices"].as_array().unwrap() {
        let content = choice["message"]["content"].as_str().unwrap();
        assert!((1..=3).contains(&content.chars().count()) && content.chars().all(|c| "éü".contains(c)), "{content:?}");
    }
    // Forced tool calls: the grammar of the template's call format.
    let tools = json!([
        { "type": "function", "function": { "name": "get_weather", "parameters": { "type": "object",
            "properties": { "city": { "type": "string", "maxLength": 10 },
                            "days": { "type": "integer", "minimum": 1, "maximum": 7 } },
            "required": ["city", "days"] } } },
        { "type": "function", "function": { "name": "get_time", "parameters": { "type": "object",
            "properties": { "zone": { "type": "string", "enum": ["UTC", "CET"] } }, "required": ["zone"] } } },
    ]);
    for (choice, names) in [
        (json!("required"), vec!["get_weather", "get_time"]),
        (json!({ "type": "function", "function": { "name": "get_time" } }), vec!["get_time"]),
    ] {
        let (status, response) = chat(json!({ "tools": tools, "tool_choice": choice, "parallel_tool_calls": false }));
        assert_eq!(status, 200, "{response}");
        for choice in response["choices"].as_array().unwrap() {
            assert_eq!(choice["finish_reason"], "tool_calls", "{response}");
            let calls = choice["message"]["tool_calls"].as_array().unwrap();
            assert_eq!(calls.len(), 1, "{response}");
            let name = calls[0]["function"]["name"].as_str().unwrap();
            assert!(names.contains(&name), "{response}");
            let arguments: Value = serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
            match name {
                "get_time" => assert!(["UTC", "CET"].contains(&arguments["zone"].as_str().unwrap()), "{arguments}"),
                _ => {
                    assert!(arguments["city"].as_str().is_some_and(|c| c.chars().count() <= 10), "{arguments}");
                    assert!(arguments["days"].as_u64().is_some_and(|d| (1..=7).contains(&d)), "{arguments}");
                }
            }
        }
    }
    let (status, response) =
        chat(json!({ "tools": tools, "tool_choice": { "type": "function", "function": { "name": "nope" } } }));
    assert!(status == 400 && response["error"]["message"].as_str().unwrap().contains("no tool is named `nope`"));
    let (status, response) = chat(json!({ "guided_json": { "type": "object", "properties": { "a": { "type": 7 } } } }));
    assert_eq!(status, 400, "{response}");
    assert!(response["error"]["message"].as_str().unwrap().contains("`guided_json` does not compile"), "{response}");
    // vLLM's choices and llama-server's GBNF grammar and top-level schema.
    for extra in [
        json!({ "guided_choice": ["cat", "dog 🐕"] }),
        json!({ "structured_outputs": { "choice": ["cat", "dog 🐕"] } }),
    ] {
        let (status, response) = chat(extra.clone());
        assert_eq!(status, 200, "{extra}: {response}");
        for choice in response["choices"].as_array().unwrap() {
            assert!(["cat", "dog 🐕"].contains(&choice["message"]["content"].as_str().unwrap()), "{response}");
        }
    }
    let grammar = "root ::= greeting \" \" [0-9]{2,3}\ngreeting ::= (\"hi\" | \"yo\") \"!\"?  # a comment\n";
    let (status, response) = chat(json!({ "grammar": grammar }));
    assert_eq!(status, 200, "{response}");
    for choice in response["choices"].as_array().unwrap() {
        let content = choice["message"]["content"].as_str().unwrap();
        let (greeting, number) = content.split_once(' ').unwrap_or_else(|| panic!("{content:?}"));
        assert!(["hi", "yo", "hi!", "yo!"].contains(&greeting), "{content:?}");
        assert!((2..=3).contains(&number.len()) && number.bytes().all(|b| b.is_ascii_digit()), "{content:?}");
    }
    let (status, response) = chat(json!({ "grammar": "root ::= item" }));
    assert!(status == 400 && response["error"]["message"].as_str().unwrap().contains("`item` is used but not defined"));
    let (status, response) = chat(json!({ "json_schema": { "enum": ["cat", "dog"] } }));
    assert_eq!(status, 200, "{response}");
    for choice in response["choices"].as_array().unwrap() {
        assert!(["\"cat\"", "\"dog\""].contains(&choice["message"]["content"].as_str().unwrap()), "{response}");
    }
    // A chat's turns as vLLM renders them: `developer` as `system` where the
    // template has none, `add_generation_prompt: false`, and
    // `continue_final_message`, the last message left open.
    let rendered = |body: Value| {
        let (status, response) = server.call("POST", "/tokenize", &body.to_string());
        assert_eq!(status, 200, "{body}: {response}");
        let tokens = serde_json::from_str::<Value>(&response).unwrap()["tokens"].clone();
        let (_, text) =
            server.call("POST", "/detokenize", &json!({ "tokens": tokens, "skip_special_tokens": false }).to_string());
        serde_json::from_str::<Value>(&text).unwrap()["prompt"].as_str().unwrap().to_string()
    };
    let turns = |first: &str| json!([{ "role": first, "content": "Be brief." }, { "role": "user", "content": "Hi?" }]);
    let with_system = rendered(json!({ "messages": turns("system") }));
    assert_eq!(rendered(json!({ "messages": turns("developer") })), with_system);
    let closed = rendered(json!({ "messages": turns("system"), "add_generation_prompt": false }));
    assert!(with_system.starts_with(&closed) && with_system.len() > closed.len(), "{closed:?} {with_system:?}");
    let mut answered = turns("system");
    answered.as_array_mut().unwrap().push(json!({ "role": "assistant", "content": "Hello, I" }));
    let continued = rendered(json!({ "messages": answered, "continue_final_message": true }));
    assert!(continued.ends_with("Hello, I"), "{continued:?}");
    let both = json!({ "messages": answered, "continue_final_message": true, "add_generation_prompt": true });
    assert_eq!(server.call("POST", "/tokenize", &both.to_string()).0, 400);
    drop(server);

    // The oracle's word-level tokenizer spells no bytes: refused by name.
    let server = Server::start();
    let body = json!({ "prompt": "t1 t2", "max_tokens": 3, "response_format": { "type": "json_object" } });
    let (status, response) = server.call("POST", "/v1/completions", &body.to_string());
    assert!(status == 400 && response.contains("byte-level BPE tokenizer"), "{status} {response}");
}

/// Prompts that share a prefix: the later ones find it in the prefix cache
/// (`usage.prompt_tokens_details.cached_tokens`, `/metrics`) and answer as
/// a server without the cache does, to the same greedy tokens and the
/// same log-probabilities, bit for bit (the contract's batch invariance).
#[test]
fn a_shared_prefix_is_prefilled_once() {
    let shared: Vec<i64> = (0..20).map(|at| 3 + at * 7 % 200).collect();
    let first = [&shared[..], &[401, 402, 403]].concat();
    let second = [&shared[..], &[404, 405]].concat();
    let answer = |server: &Server, prompt: &[i64]| {
        let body = json!({ "prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 0 }).to_string();
        let (status, body) = server.call("POST", "/v1/completions", &body);
        assert_eq!(status, 200, "{body}");
        let value: Value = serde_json::from_str(&body).unwrap();
        let choice = &value["choices"][0];
        let ids: Vec<i64> = choice["token_ids"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
        let logprobs: Vec<f64> =
            choice["logprobs"]["token_logprobs"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        (ids, logprobs, value["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap())
    };
    let cached = Server::start_with(&["--prefix-block", "8"]);
    let uncached = Server::start_with(&["--prefix-cache-mb", "0"]);
    let (first_ids, first_logprobs, found) = answer(&cached, &first);
    assert_eq!(found, 0, "nothing is cached yet");
    // The next turn of the conversation continues the first prompt.
    let turn = [&first[..], &first_ids[..], &[406]].concat();
    let mut hits = Vec::new();
    for prompt in [&first, &second, &turn] {
        let (ids, logprobs, found) = answer(&cached, prompt);
        let (expected_ids, expected_logprobs, none) = answer(&uncached, prompt);
        assert_eq!(none, 0);
        assert_eq!(ids, expected_ids, "{prompt:?}");
        assert_eq!(logprobs, expected_logprobs, "{prompt:?}");
        hits.push(found);
    }
    assert_eq!(first_logprobs.len(), 6);
    // The first prompt (23 tokens) was kept at 16; the second parts from
    // it after the shared 20 tokens and finds the same 16; the next turn
    // finds the first's 16 too (the first ran twice: the second time it
    // found its own 16).
    assert_eq!(hits, [16, 16, 16]);
    let (_, metrics) = cached.call("GET", "/metrics", "");
    assert!(metrics.contains("linnet_prefix_cache_hits_total 3\n"), "{metrics}");
    assert!(metrics.contains("linnet_prefix_cache_tokens_total 48\n"), "{metrics}");
}

/// The prefix cache's changes published as vLLM publishes KV-cache events
/// (`--kv-events-config`), read as a router reads them: each message the
/// topic, a sequence number and a batch in the consumers' schema
/// (`[ts, [["BlockStored", hashes, parent, tokens, block_size, lora_id,
/// medium], …]]`); a prompt's snapshot arrives as its blocks stored, named
/// by vLLM's hash chain under `PYTHONHASHSEED`, with their tokens and
/// parent; a prefix already held publishes nothing; a replay from sequence
/// 0 sends every batch again; stopping the server clears every block.
#[test]
fn kv_cache_events_tell_routers_what_the_prefix_cache_holds() {
    use zeromq::{Socket, SocketRecv, SocketSend};
    let free_port = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (events_port, replay_port) = (free_port(), free_port());
    let config = json!({
        "enable_kv_cache_events": true, "publisher": "zmq", "topic": "kv-events",
        "endpoint": format!("tcp://127.0.0.1:{events_port}"),
        "replay_endpoint": format!("tcp://127.0.0.1:{replay_port}"),
    })
    .to_string();
    let mut server = Server::start_with(&["--prefix-block", "8", "--kv-events-config", &config]);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let _in_runtime = runtime.enter();
    let mut subscriber = zeromq::SubSocket::new();
    runtime.block_on(async {
        subscriber.connect(&format!("tcp://127.0.0.1:{events_port}")).await.unwrap();
        subscriber.subscribe("kv-events").await.unwrap();
        // The subscription reaches the publisher before anything is sent.
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    });
    let mut next = || -> (i64, Vec<u8>) {
        let message = runtime
            .block_on(tokio::time::timeout(std::time::Duration::from_secs(60), subscriber.recv()))
            .expect("a batch of events")
            .unwrap()
            .into_vec();
        assert_eq!(message.len(), 3, "{message:?}");
        assert_eq!(&message[0][..], b"kv-events");
        (i64::from_be_bytes(message[1][..].try_into().unwrap()), message[2].to_vec())
    };
    let hashes = |tokens: &[i64]| linnet_server::kv_events::BlockHasher::new("0").chain(tokens, 8);
    let uints = |value: &rmpv::Value| -> Vec<u64> {
        value.as_array().unwrap().iter().map(|number| number.as_u64().unwrap()).collect()
    };
    // The batch's one event, checked against the schema.
    let only_event = |payload: &[u8]| -> Vec<rmpv::Value> {
        let batch = rmpv::decode::read_value(&mut &payload[..]).unwrap();
        let batch = batch.as_array().unwrap();
        assert_eq!(batch.len(), 2, "[ts, events]: {batch:?}");
        assert!(batch[0].as_f64().unwrap() > 1.7e9, "a time in seconds: {batch:?}");
        let events = batch[1].as_array().unwrap();
        assert_eq!(events.len(), 1, "{events:?}");
        events[0].as_array().unwrap().clone()
    };
    let stored = |event: &[rmpv::Value], tokens: &[i64], parent: Option<u64>| {
        assert_eq!(event.len(), 7, "{event:?}");
        assert_eq!(event[0].as_str(), Some("BlockStored"));
        let hashes = hashes(tokens);
        let first = parent.map_or(0, |parent| hashes.iter().position(|&hash| hash == parent).unwrap() + 1);
        assert_eq!(uints(&event[1]), hashes[first..]);
        assert_eq!(event[2].as_u64(), parent, "{event:?}");
        let ids: Vec<i64> = uints(&event[3]).into_iter().map(|id| id as i64).collect();
        assert_eq!(ids, tokens[first * 8..]);
        assert_eq!(event[4].as_u64(), Some(8));
        assert!(event[5].is_nil() && event[6].is_nil(), "no LoRA, one medium: {event:?}");
    };

    let shared: Vec<i64> = (0..20).map(|at| 3 + at * 7 % 200).collect();
    let first = [&shared[..], &[401, 402, 403]].concat();
    let answer = server.complete(&first, 6);
    // Kept at 16 of its 23 tokens: two blocks, the first with no parent.
    let (sequence, first_batch) = next();
    assert_eq!(sequence, 0);
    stored(&only_event(&first_batch), &first[..16], None);
    // Parting from the first after 20 tokens, the second's points are 16
    // too, held already: nothing to publish. The next turn of the first
    // conversation is kept at 24: one block more, under the second.
    server.complete(&[&shared[..], &[404, 405]].concat(), 2);
    let turn = [&first[..], &answer[..], &[406]].concat();
    server.complete(&turn, 2);
    let (sequence, turn_batch) = next();
    assert_eq!(sequence, 1, "the second prompt published nothing");
    stored(&only_event(&turn_batch), &turn[..24], Some(hashes(&turn[..16])[1]));

    // A router that missed batches asks for them again from sequence 0.
    let replayed = runtime.block_on(async {
        let mut dealer = zeromq::DealerSocket::new();
        dealer.connect(&format!("tcp://127.0.0.1:{replay_port}")).await.unwrap();
        let mut request = zeromq::ZmqMessage::from(Vec::new());
        request.push_back(0i64.to_be_bytes().to_vec().into());
        dealer.send(request).await.unwrap();
        let mut replayed = Vec::new();
        loop {
            let reply = tokio::time::timeout(std::time::Duration::from_secs(10), dealer.recv())
                .await
                .expect("a replay")
                .unwrap()
                .into_vec();
            assert_eq!((reply.len(), reply[0].len()), (3, 0), "[\"\", sequence, payload]: {reply:?}");
            let sequence = i64::from_be_bytes(reply[1][..].try_into().unwrap());
            if sequence == -1 {
                assert!(reply[2].is_empty());
                break replayed;
            }
            replayed.push((sequence, reply[2].to_vec()));
        }
    });
    assert_eq!(replayed, [(0, first_batch), (1, turn_batch)]);

    // Stopping, the replica's cache goes: every block is cleared.
    let status = Command::new("kill").args(["-TERM", &server.child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let (sequence, last) = next();
    assert_eq!(sequence, 2);
    let cleared = only_event(&last);
    assert_eq!(cleared.len(), 1);
    assert_eq!(cleared[0].as_str(), Some("AllBlocksCleared"));
    assert!(server.child.wait().unwrap().success());
}

/// A KV-cache event config that cannot be honoured stops the server
/// before it serves, saying why.
#[test]
fn a_kv_events_config_that_cannot_be_honoured_is_refused() {
    let weights = root().join("tests/fixtures/oracle/tiny-qwen3.5-moe/weights-f32");
    let card = root().join("tests/fixtures/oracle/tiny-qwen3.5-moe/package/nest-f32.toml");
    for (args, said) in [
        (vec!["--kv-events-config", r#"{"enable_kv_cache_events": true, "publisher": "nats"}"#], "`nats`"),
        (
            vec!["--kv-events-config", r#"{"enable_kv_cache_events": true}"#, "--prefix-cache-mb", "0"],
            "--prefix-cache-mb",
        ),
        (
            vec!["--kv-events-config", r#"{"enable_kv_cache_events": true, "endpoint": "tcp://256.0.0.1:1"}"#],
            "tcp://256.0.0.1:1",
        ),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_linnet"))
            .arg("serve")
            .arg(root().join("models/qwen3.6-35b-a3b"))
            .args(["--port", "0", "--nest", card.to_str().unwrap(), "--weights", weights.to_str().unwrap()])
            .args(&args)
            .env("LINNET_STDLIB", root().join("stdlib"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success() && stderr.contains(said), "{args:?}: {stderr}");
    }
}

/// Batch invariance (the numerics contract): a prompt's log-probabilities
/// and greedy text are the same bits alone, as one of eight requests at
/// once, and after another prompt left its prefix in the prefix cache (the
/// rest prefilled on its own), on the CPU, for the trained text model with
/// f32 weights and bf16 weights with bf16 activations (by default), and
/// Q4_K_M blocks of parameters declared f32 under `--batch-invariant`
/// (whose decode steps and prefills, in the default order, sum in other
/// orders: 1e-6 apart).
#[test]
fn a_prompt_gives_the_same_bits_alone_batched_and_after_a_cached_prefix() {
    let weights = [
        ("weights-f32", "f32", None),
        ("gguf/tiny-text-bf16.gguf", "bf16", None),
        ("gguf/tiny-text-q4_k_m.gguf", "f32", Some("--batch-invariant")),
    ];
    same_bits_alone_batched_and_after_a_cached_prefix("cpu", &weights);
}

/// The same on the GPU kernels run on the host by MLIR (`--features
/// nvptx`), f32 and bf16.
#[cfg(feature = "nvptx")]
#[test]
fn gpu_kernels_on_the_host_give_a_prompt_the_same_bits_alone_batched_and_after_a_cached_prefix() {
    same_bits_alone_batched_and_after_a_cached_prefix(
        "mlir-host",
        &[("weights-f32", "f32", None), ("gguf/tiny-text-bf16.gguf", "bf16", None)],
    );
}

/// The trained text model's servers on `backend`, one per (weights under
/// its fixture, activations' type `T`, a batch order's flag): a prompt's
/// answer alone, beside seven others, and after a cached prefix, compared
/// bit for bit.
fn same_bits_alone_batched_and_after_a_cached_prefix(backend: &str, weights: &[(&str, &str, Option<&str>)]) {
    let dir = root().join("tests/fixtures/tiny-qwen3.5-moe-text");
    let card = dir.join("package/nest.toml");
    let held_out: Vec<String> = std::fs::read_to_string(dir.join("held-out.txt"))
        .unwrap()
        .split("\n\n")
        .map(|saying| saying.replace('\n', " "))
        .collect();
    let prefix = held_out[..14].join(" ");
    let prompt = format!("{prefix} The cat sat on the mat, and");
    let others: Vec<String> = (0..7).map(|at| held_out[20 + 3 * at..23 + 4 * at].join(" ")).collect();
    // Text, each token's log-probability and the five most likely at each
    // step, and the prompt's tokens found in the prefix cache.
    let answer = |server: &Server, prompt: &str| {
        let body = json!({ "prompt": prompt, "max_tokens": 12, "temperature": 0, "logprobs": 5 }).to_string();
        let (status, body) = server.call("POST", "/v1/completions", &body);
        assert_eq!(status, 200, "{body}");
        let value: Value = serde_json::from_str(&body).unwrap();
        let choice = &value["choices"][0];
        let cached = value["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0);
        let logprobs = &choice["logprobs"];
        ((choice["text"].clone(), logprobs["token_logprobs"].clone(), logprobs["top_logprobs"].clone()), cached)
    };
    let tokenizer = dir.join("weights-f32");
    for &(weights, dtype, order) in weights {
        let what = format!("{weights} with T={dtype} on {backend} {}", order.unwrap_or_default());
        let weights = dir.join(weights);
        let spawn = |prefix_cache_mb: &str| {
            let set = [format!("T={dtype}"), "Batch=8".to_string()];
            let mut args = vec!["--weights", weights.to_str().unwrap(), "--tokenizer", tokenizer.to_str().unwrap()];
            args.extend(set.iter().flat_map(|value| ["--set", value.as_str()]));
            args.extend(["--backend", backend, "--prefix-block", "16", "--prefix-cache-mb", prefix_cache_mb]);
            args.extend(order);
            Server::spawn_card(&card, &args)
        };
        let uncached = spawn("0");
        let (alone, _) = answer(&uncached, &prompt);
        let (batched, _) = std::thread::scope(|scope| {
            let others: Vec<_> = others.iter().map(|other| scope.spawn(|| answer(&uncached, other))).collect();
            let ours = answer(&uncached, &prompt);
            others.into_iter().for_each(|other| drop(other.join().unwrap()));
            ours
        });
        assert_eq!(batched, alone, "{what}: beside seven other requests");
        let cached = spawn("64");
        let (_, none) = answer(&cached, &format!("{prefix} Another ending here"));
        let (after_prefix, found) = answer(&cached, &prompt);
        assert_eq!(none, 0);
        assert!(found >= 64, "{what}: the shared prefix is found in the cache ({found} tokens)");
        assert_eq!(after_prefix, alone, "{what}: after {found} cached tokens");
    }
}
