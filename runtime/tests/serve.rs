//! `linnet serve` as clients use it: concurrent requests get the tokens
//! each gets alone (more requests than rows wait their turn), bad requests
//! get a 4xx with an OpenAI-style error and the server keeps serving, a
//! client that disconnects frees its row, and Ctrl-C stops it cleanly.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start() -> Server {
        Server::start_with(&[])
    }

    fn start_with(extra: &[&str]) -> Server {
        let oracle = root().join("tests/fixtures/oracle/tiny-qwen3.5-moe");
        let mut child = Command::new(env!("CARGO_BIN_EXE_linnet"))
            .arg("serve")
            .arg(root().join("models/qwen3.6-35b-a3b"))
            .arg("--nest")
            .arg(oracle.join("package/nest-f32.toml"))
            .arg("--weights")
            .arg(oracle.join("weights-f32"))
            .args(["--port", "0"])
            .args(extra)
            .env("LINNET_STDLIB", root().join("stdlib"))
            .stderr(Stdio::piped())
            .spawn()
            .expect("linnet serve starts");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let port = loop {
            let line = lines.next().expect("the server says where it listens").unwrap();
            if let Some(address) = line.split("http://").nth(1) {
                break address.split_whitespace().next().unwrap().rsplit(':').next().unwrap().parse().unwrap();
            }
        };
        std::thread::spawn(move || lines.for_each(drop));
        Server { child, port }
    }

    /// Status and body of one request.
    fn call(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        let status = response.split_whitespace().nth(1).unwrap().parse().unwrap();
        let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
        (status, body)
    }

    fn complete(&self, prompt: &[i64], max_tokens: usize) -> Vec<i64> {
        let (status, body) = self.call(
            "POST",
            "/v1/completions",
            &json!({ "prompt": prompt, "max_tokens": max_tokens, "temperature": 0 }).to_string(),
        );
        assert_eq!(status, 200, "{body}");
        let value: Value = serde_json::from_str(&body).unwrap();
        value["choices"][0]["token_ids"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}

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
    let mut machine = linnet_runtime::load(&root().join("models/qwen3.6-35b-a3b"), &options, &weights).unwrap().machine;
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
        ("n", json!(2)),
        ("logprobs", json!(true)),
        ("echo", json!(true)),
        ("stream_options", json!({ "include_usage": true })),
    ] {
        let mut body = json!({ "prompt": [1, 2], "max_tokens": 2 });
        body[field] = value;
        let (status, response) = server.call("POST", "/v1/completions", &body.to_string());
        assert!(status == 400 && response.contains(&format!("`{field}`")), "{field}: {status} {response}");
    }
    let accepted = json!({ "prompt": [1, 2], "max_tokens": 2, "n": 1, "logprobs": false, "echo": false, "stop": [], "stream_options": null, "temperature": 0 });
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
    for refused in [json!(["a", "b", "c", "d", "e"]), json!([""]), json!(7)] {
        let (status, response) =
            server.call("POST", "/v1/completions", &json!({ "prompt": [1, 2], "stop": refused }).to_string());
        assert!(status == 400 && response.contains("`stop`"), "{refused}: {status} {response}");
    }
    // A body over the limit is a 413.
    let huge = format!(r#"{{"prompt": "{}"}}"#, "t1 ".repeat(1 << 20));
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
