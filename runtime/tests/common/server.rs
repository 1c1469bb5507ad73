//! A `linnet serve` process for a test, on a port of its own, and plain
//! HTTP/1.1 requests to it.

use super::root;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};

pub struct Server {
    pub child: Child,
    pub port: u16,
}

impl Server {
    pub fn start() -> Server {
        Server::start_with(&[])
    }

    pub fn start_with(extra: &[&str]) -> Server {
        Server::start_on(&root().join("tests/fixtures/oracle/tiny-qwen3.5-moe/weights-f32"), extra)
    }

    pub fn start_on(weights: &Path, extra: &[&str]) -> Server {
        let mut args = vec!["--weights", weights.to_str().unwrap()];
        args.extend(extra);
        Server::spawn(&args)
    }

    /// The oracle's model card, with `args` saying where its weights are.
    pub fn spawn(args: &[&str]) -> Server {
        Server::spawn_card(&root().join("tests/fixtures/oracle/tiny-qwen3.5-moe/package/nest-f32.toml"), args)
    }

    /// The seed package under the model card `card`, with `args`.
    pub fn spawn_card(card: &Path, args: &[&str]) -> Server {
        let mut with_card = vec!["--nest", card.to_str().unwrap()];
        with_card.extend(args);
        Server::spawn_package(&root().join("models/qwen3.6-35b-a3b"), &with_card)
    }

    /// The package at `package` under its own card, with `args`.
    pub fn spawn_package(package: &Path, args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_linnet"))
            .arg("serve")
            .arg(package)
            .args(["--port", "0"])
            .args(args)
            .env("LINNET_STDLIB", root().join("stdlib"))
            // KV-cache events name blocks alike in every run.
            .env("PYTHONHASHSEED", "0")
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
    pub fn call(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        self.call_with(method, path, body, "")
    }

    /// Status and body of one request with more header lines (each ending
    /// in `\r\n`).
    pub fn call_with(&self, method: &str, path: &str, body: &str, headers: &str) -> (u16, String) {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{headers}Connection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        let status = response.split_whitespace().nth(1).unwrap().parse().unwrap();
        let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
        (status, body)
    }

    pub fn complete(&self, prompt: &[i64], max_tokens: usize) -> Vec<i64> {
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
