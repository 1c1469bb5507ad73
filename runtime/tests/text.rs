//! Text as people read it, on a model that has learned text (the trained
//! fixture `tiny-qwen3.5-moe-text`: the seed's architecture, a byte-level
//! BPE tokenizer, Qwen3.5's chat template): greedy answers are, byte for
//! byte, the text transformers decodes for the same prompts, in Latin with
//! diacritics, Cyrillic, CJK, emoji and code; every answer's text, streamed
//! or whole, sampled or not, is the decoding of its own `token_ids`;
//! constraints over non-ASCII text hold; the perplexity of held-out text is
//! transformers' own; llama-quantize's files of the model, in every format
//! Linnet reads, run as their values and give the same greedy text on the
//! CPU as on the interpreter.

use common::load_on;
use linnet_exec::tensor::Tensor;
use linnet_exec::Machine;
use linnet_frontend::package::LoadOptions;
use linnet_ir::Dtype;
use linnet_runtime::generate;
use linnet_runtime::mtp::MtpDrafter;
use linnet_runtime::sampling::{Rng, Sampling};
use linnet_runtime::speculative::{self, Request};
use linnet_runtime::stops::Detokenizer;
use linnet_runtime::weights::NonFinite;
use linnet_runtime::{BackendKind, Loaded, Weights};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::root;
use common::server::Server;

fn fixture() -> PathBuf {
    root().join("tests/fixtures/tiny-qwen3.5-moe-text")
}

fn card() -> PathBuf {
    fixture().join("package/nest.toml")
}

fn weights() -> PathBuf {
    fixture().join("weights-f32")
}

/// What transformers made of the fixture (`scripts/text-golden.py`).
fn golden() -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture().join("golden-text.json")).unwrap()).unwrap()
}

fn ids(value: &Value) -> Vec<i64> {
    value.as_array().unwrap().iter().map(|id| id.as_i64().unwrap()).collect()
}

/// Hugging Face's tokenizer of the fixture, as a client would decode with.
fn hugging_face() -> tokenizers::Tokenizer {
    tokenizers::Tokenizer::from_file(weights().join("tokenizer.json")).unwrap()
}

fn decoded(tokenizer: &tokenizers::Tokenizer, ids: &[i64]) -> String {
    tokenizer.decode(&ids.iter().map(|&id| id as u32).collect::<Vec<u32>>(), true).unwrap()
}

fn start(extra: &[&str]) -> Server {
    let weights = weights();
    let mut args = vec!["--weights", weights.to_str().unwrap()];
    args.extend(extra);
    Server::spawn_card(&card(), &args)
}

fn post(server: &Server, path: &str, body: &Value) -> Value {
    let (status, response) = server.call("POST", path, &body.to_string());
    assert_eq!(status, 200, "{body}: {response}");
    serde_json::from_str(&response).unwrap()
}

/// A streamed answer's events: each data line's JSON, up to `[DONE]`.
fn stream(server: &Server, path: &str, body: &Value) -> Vec<Value> {
    let (status, response) = server.call("POST", path, &body.to_string());
    assert_eq!(status, 200, "{body}: {response}");
    let events: Vec<&str> = response.lines().filter_map(|line| line.strip_prefix("data: ")).collect();
    assert_eq!(events.last(), Some(&"[DONE]"), "{response}");
    events[..events.len() - 1].iter().map(|event| serde_json::from_str(event).unwrap()).collect()
}

/// Per choice index: its streamed text (or content) joined.
fn joined(events: &[Value], field: &str) -> Vec<String> {
    let mut texts: Vec<String> = Vec::new();
    for event in events {
        for choice in event["choices"].as_array().unwrap() {
            let index = choice["index"].as_u64().unwrap() as usize;
            texts.resize(texts.len().max(index + 1), String::new());
            if let Some(piece) = choice.pointer(field).and_then(Value::as_str) {
                texts[index].push_str(piece);
            }
        }
    }
    texts
}

/// Per choice index: the `token_ids` of its chunks joined.
fn joined_ids(events: &[Value]) -> Vec<Vec<i64>> {
    let mut all: Vec<Vec<i64>> = Vec::new();
    for event in events {
        for choice in event["choices"].as_array().unwrap() {
            let index = choice["index"].as_u64().unwrap() as usize;
            all.resize(all.len().max(index + 1), Vec::new());
            all[index].extend(ids(&choice["token_ids"]));
        }
    }
    all
}

/// The package read through the fixture's card.
fn options() -> LoadOptions {
    LoadOptions { nest: Some(card()), stdlib: Some(root().join("stdlib")), ..LoadOptions::default() }
}

/// Greedy generation through the library, and its text streamed through
/// the detokenizer: transformers' tokens and transformers' text, for
/// prompts in every script of the corpus.
#[test]
fn greedy_text_is_the_text_transformers_decodes() {
    let checkpoint = Weights::Checkpoint { dir: Some(weights()), non_finite: NonFinite::Refuse };
    let package = root().join("models/qwen3.6-35b-a3b");
    let Loaded { mut machine, text, .. } = load_on(&package, &options(), &checkpoint, BackendKind::Cpu).unwrap();
    let text = text.expect("the fixture's tokenizer");
    let golden = golden();
    for (script, case) in golden["completions"].as_object().unwrap().iter().chain(golden["chats"].as_object().unwrap())
    {
        let prompt = ids(&case["prompt_ids"]);
        if let Some(words) = case["prompt"].as_str() {
            assert_eq!(text.encode(words).unwrap(), prompt, "{script}: the prompt's tokens");
        }
        let expected = ids(&case["ids"]);
        let greedy = generate::generate(
            &mut machine,
            &prompt,
            expected.len().max(1),
            &Sampling::default(),
            &mut Rng::new(0),
            &text.end_ids,
            |_| true,
        )
        .unwrap();
        assert_eq!(greedy, expected, "{script}: greedy tokens");
        let mut detokenizer = Detokenizer::new(Vec::new(), Vec::new());
        let mut streamed: String = greedy.iter().map(|&id| detokenizer.push(Some(&text), id).0).collect();
        streamed.push_str(&detokenizer.finish(Some(&text)));
        assert_eq!(streamed, case["text"].as_str().unwrap(), "{script}: streamed text");
        assert_eq!(text.decode(&greedy), streamed, "{script}: whole text");
    }
}

/// `linnet generate --prompt` prints transformers' text for a prompt in
/// Cyrillic and one in Chinese.
#[test]
fn generate_prints_the_text() {
    let golden = golden();
    for script in ["ru", "zh"] {
        let case = &golden["completions"][script];
        let max_tokens = case["ids"].as_array().unwrap().len().to_string();
        let args = ["--prompt", case["prompt"].as_str().unwrap(), "--max-tokens", &max_tokens];
        let printed = linnet("generate", &weights(), &args);
        assert_eq!(printed, format!("{}\n", case["text"].as_str().unwrap()));
    }
}

/// The server, as clients use it: greedy completions and chats give
/// transformers' text, whole and streamed; sampled answers (`n` > 1, with
/// and without stop strings) are always the decoding of their own
/// `token_ids`; log-probabilities' bytes rebuild the text.
#[test]
fn the_server_answers_in_the_text_of_its_tokens() {
    let server = start(&[]);
    let tokenizer = hugging_face();
    let golden = golden();
    for (script, case) in golden["completions"].as_object().unwrap() {
        let body = json!({ "prompt": case["prompt"], "max_tokens": case["ids"].as_array().unwrap().len(),
                           "temperature": 0 });
        let answer = post(&server, "/v1/completions", &body);
        assert_eq!(answer["choices"][0]["text"], case["text"], "{script}: {answer}");
        assert_eq!(answer["choices"][0]["token_ids"], case["ids"], "{script}");
        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        let texts = joined(&stream(&server, "/v1/completions", &streamed), "/text");
        assert_eq!(texts, [case["text"].as_str().unwrap()], "{script}: streamed");
    }
    for (script, case) in golden["chats"].as_object().unwrap() {
        let body = json!({ "messages": [{ "role": "user", "content": case["question"] }], "temperature": 0,
                           "max_tokens": case["ids"].as_array().unwrap().len(),
                           "chat_template_kwargs": { "enable_thinking": false } });
        let answer = post(&server, "/v1/chat/completions", &body);
        assert_eq!(answer["choices"][0]["message"]["content"], case["text"], "{script}: {answer}");
        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        let texts = joined(&stream(&server, "/v1/chat/completions", &streamed), "/delta/content");
        assert_eq!(texts, [case["text"].as_str().unwrap()], "{script}: streamed chat");
    }

    // Sampled: four choices a request, in every script, whole and streamed.
    for (script, case) in golden["completions"].as_object().unwrap() {
        let body = json!({ "prompt": case["prompt"], "max_tokens": 40, "temperature": 1.0, "n": 4, "seed": 11,
                           "logprobs": 1 });
        let answer = post(&server, "/v1/completions", &body);
        let mut texts = Vec::new();
        for choice in answer["choices"].as_array().unwrap() {
            let token_ids = ids(&choice["token_ids"]);
            let text = choice["text"].as_str().unwrap();
            assert_eq!(text, decoded(&tokenizer, &token_ids), "{script}: {choice}");
            texts.push(text.to_string());
        }
        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        let events = stream(&server, "/v1/completions", &streamed);
        let streamed_texts = joined(&events, "/text");
        assert_eq!(streamed_texts, texts, "{script}: streamed");
        for (text, token_ids) in streamed_texts.iter().zip(joined_ids(&events)) {
            assert_eq!(*text, decoded(&tokenizer, &token_ids), "{script}: streamed");
        }
    }
    let body = json!({ "messages": [{ "role": "user", "content": "Расскажи что-нибудь." }], "max_tokens": 40,
                       "temperature": 1.0, "n": 3, "seed": 5, "logprobs": true,
                       "chat_template_kwargs": { "enable_thinking": false } });
    let answer = post(&server, "/v1/chat/completions", &body);
    for choice in answer["choices"].as_array().unwrap() {
        let token_ids = ids(&choice["token_ids"]);
        assert_eq!(choice["message"]["content"], decoded(&tokenizer, &token_ids), "{choice}");
        // The tokens' own bytes (special tokens' left out) are the text's.
        let bytes: Vec<u8> = choice["logprobs"]["content"]
            .as_array()
            .unwrap()
            .iter()
            .zip(&token_ids)
            .filter(|(_, &id)| {
                !tokenizer.get_added_vocabulary().is_special_token(&tokenizer.id_to_token(id as u32).unwrap())
            })
            .flat_map(|(entry, _)| entry["bytes"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap() as u8))
            .collect();
        assert_eq!(String::from_utf8(bytes).unwrap(), decoded(&tokenizer, &token_ids), "{choice}");
    }
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let contents: Vec<Value> =
        answer["choices"].as_array().unwrap().iter().map(|c| c["message"]["content"].clone()).collect();
    let events = stream(&server, "/v1/chat/completions", &streamed);
    let texts = joined(&events, "/delta/content");
    assert_eq!(texts.iter().map(|t| json!(t)).collect::<Vec<_>>(), contents);
    for (text, token_ids) in texts.iter().zip(joined_ids(&events)) {
        assert_eq!(*text, decoded(&tokenizer, &token_ids));
    }

    // A stop string: the text ends before it, and is the decoding of the
    // tokens up to it.
    let body = json!({ "prompt": "Der Mensch ist", "max_tokens": 40, "temperature": 1.0, "n": 4, "seed": 3,
                       "stop": ["e", "ä"] });
    for choice in post(&server, "/v1/completions", &body)["choices"].as_array().unwrap() {
        let text = choice["text"].as_str().unwrap();
        let whole = decoded(&tokenizer, &ids(&choice["token_ids"]));
        assert!(whole.starts_with(text) && !text.contains(['e', 'ä']), "{text:?} of {whole:?}");
        // Cut short by a stop string (not by the end of the answer): the
        // decoding goes on with it.
        if whole != text {
            assert!(whole[text.len()..].starts_with(['e', 'ä']), "{text:?} of {whole:?}");
        }
    }

    // `/detokenize`: special tokens left out unless asked for.
    let im_end = tokenizer.token_to_id("<|im_end|>").unwrap();
    let ru = ids(&golden["completions"]["ru"]["prompt_ids"]);
    let tokens: Vec<i64> = ru.iter().copied().chain([im_end as i64]).collect();
    let plain = post(&server, "/detokenize", &json!({ "tokens": tokens }));
    assert_eq!(plain["prompt"], golden["completions"]["ru"]["prompt"]);
    let kept = post(&server, "/detokenize", &json!({ "tokens": tokens, "skip_special_tokens": false }));
    assert_eq!(kept["prompt"], format!("{}<|im_end|>", golden["completions"]["ru"]["prompt"].as_str().unwrap()));
}

/// Constraints over text outside ASCII: a JSON schema whose choices are
/// Polish, German, Russian and Chinese names validates; a regex of
/// accented letters, whose every choice begins with the same byte, is
/// followed byte for byte.
#[test]
fn constraints_hold_over_any_script() {
    let server = start(&[]);
    let cities = ["Kraków", "Zürich", "Москва", "北京"];
    let schema = json!({ "type": "object", "properties": { "city": { "enum": cities } }, "required": ["city"],
                         "additionalProperties": false });
    let body = json!({ "messages": [{ "role": "user", "content": "Which city?" }], "max_tokens": 30,
                       "temperature": 1.0, "n": 8, "seed": 2,
                       "response_format": { "type": "json_schema", "json_schema": { "name": "city", "schema": schema } } });
    let answer = post(&server, "/v1/chat/completions", &body);
    let tokenizer = hugging_face();
    for choice in answer["choices"].as_array().unwrap() {
        let content = choice["message"]["content"].as_str().unwrap();
        let parsed: Value = serde_json::from_str(content).unwrap_or_else(|e| panic!("{content:?}: {e}"));
        assert!(cities.contains(&parsed["city"].as_str().unwrap()), "{content}");
        // Thinking was on: the grammar closed the block before the answer.
        assert_eq!(format!("</think>\n\n{content}"), decoded(&tokenizer, &ids(&choice["token_ids"])));
    }
    let body = json!({ "prompt": "Straße", "max_tokens": 6, "temperature": 1.0, "n": 4, "seed": 9,
                       "structured_outputs": { "regex": "(é|ü)+" } });
    for choice in post(&server, "/v1/completions", &body)["choices"].as_array().unwrap() {
        let text = choice["text"].as_str().unwrap();
        // Cut at `max_tokens`, the last character may be half there.
        let whole = if choice["finish_reason"] == "length" { text.trim_end_matches('\u{FFFD}') } else { text };
        assert!(!whole.is_empty() && whole.chars().all(|c| c == 'é' || c == 'ü'), "{text:?}");
    }
}

/// The fixture's tokenizer with its chat tags (`<think>`, `<tool_call>`
/// and their ends) marked special, as some vocabularies have them, in a
/// folder of its own.
fn tags_as_special_tokens() -> PathBuf {
    let folder = std::env::temp_dir().join(format!("linnet-special-tags-{}", std::process::id()));
    std::fs::create_dir_all(&folder).unwrap();
    for name in ["tokenizer_config.json", "chat_template.jinja", "generation_config.json"] {
        std::fs::copy(weights().join(name), folder.join(name)).unwrap();
    }
    let mut tokenizer: Value =
        serde_json::from_str(&std::fs::read_to_string(weights().join("tokenizer.json")).unwrap()).unwrap();
    for token in tokenizer["added_tokens"].as_array_mut().unwrap() {
        if ["<think>", "</think>", "<tool_call>", "</tool_call>"].contains(&token["content"].as_str().unwrap()) {
            token["special"] = json!(true);
        }
    }
    std::fs::write(folder.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    folder
}

/// Where the chat tags are special tokens (which decoding leaves out),
/// the reasoning is still split from the answer at `</think>` (here the
/// one a constraint puts before the answer), the answer is not lost in
/// `reasoning_content`, and a forced tool call is the grammar's call, its
/// tags the special tokens.
#[test]
fn chat_tags_that_are_special_tokens_are_read_as_tags() {
    let folder = tags_as_special_tokens();
    let server = start(&["--tokenizer", folder.to_str().unwrap()]);
    let tokenizer = tokenizers::Tokenizer::from_file(folder.join("tokenizer.json")).unwrap();
    let close = i64::from(tokenizer.token_to_id("</think>").unwrap());
    let body = json!({ "messages": [{ "role": "user", "content": "Welche Stadt?" }], "max_tokens": 30,
                       "temperature": 1.0, "n": 4, "seed": 8,
                       "structured_outputs": { "regex": "(Kraków|Zürich|Москва)" } });
    for choice in post(&server, "/v1/chat/completions", &body)["choices"].as_array().unwrap() {
        let message = &choice["message"];
        assert!(ids(&choice["token_ids"]).contains(&close), "{choice}");
        assert_eq!(message["reasoning_content"], Value::Null, "{choice}");
        assert!(["Kraków", "Zürich", "Москва"].contains(&message["content"].as_str().unwrap()), "{choice}");
    }

    let tools = json!([{ "type": "function", "function": { "name": "get_weather", "parameters": { "type": "object",
        "properties": { "city": { "type": "string", "enum": ["Kraków", "Москва"] } }, "required": ["city"] } } }]);
    let body = json!({ "messages": [{ "role": "user", "content": "Wetter?" }], "tools": tools,
                       "tool_choice": "required", "parallel_tool_calls": false, "max_tokens": 100, "temperature": 1.0,
                       "n": 2, "seed": 4, "chat_template_kwargs": { "enable_thinking": false } });
    let open = i64::from(tokenizer.token_to_id("<tool_call>").unwrap());
    for choice in post(&server, "/v1/chat/completions", &body)["choices"].as_array().unwrap() {
        assert_eq!(choice["finish_reason"], "tool_calls", "{choice}");
        assert_eq!(ids(&choice["token_ids"])[0], open, "{choice}");
        let call = &choice["message"]["tool_calls"][0]["function"];
        assert_eq!(call["name"], "get_weather", "{choice}");
        let arguments: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
        assert!(["Kraków", "Москва"].contains(&arguments["city"].as_str().unwrap()), "{arguments}");
    }
    drop(server);
    std::fs::remove_dir_all(folder).unwrap();
}

/// `linnet perplexity` on the held-out text is transformers' perplexity
/// computed the same way (chunks of 64 tokens, each scored on its second
/// half), within 1e-4 of it.
#[test]
fn perplexity_is_the_perplexity_transformers_computes() {
    let golden = golden();
    let expected = golden["perplexity"].as_array().unwrap().iter().find(|score| score["ctx"] == 64).unwrap();
    let output = perplexity(&weights(), &["-f", fixture().join("held-out.txt").to_str().unwrap(), "-c", "64"]);
    let ppl = final_estimate(&output);
    let reference = expected["ppl"].as_f64().unwrap();
    assert!((ppl - reference).abs() <= 1e-4 * reference, "{ppl} against transformers' {reference}");
    // Far below the vocabulary's 2048: the model has learned the text.
    assert!(reference < 60.0, "{reference}");
    // The reference interpreter scores the same chunks alike.
    let first = |backend: &str| {
        let text = fixture().join("held-out.txt");
        final_estimate(&perplexity(
            &weights(),
            &["-f", text.to_str().unwrap(), "-c", "64", "--chunks", "2", "--backend", backend],
        ))
    };
    let (interpreted, native) = (first("interp"), first("cpu"));
    assert!((interpreted - native).abs() <= 1e-4 * native, "{interpreted} on the interpreter, {native} native");
}

fn perplexity(weights: &Path, args: &[&str]) -> String {
    linnet("perplexity", weights, args)
}

/// What `linnet COMMAND` prints for the seed package under the fixture's
/// card, with `weights` and `args`; it must succeed.
fn linnet(command: &str, weights: &Path, args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_linnet"))
        .arg(command)
        .arg(root().join("models/qwen3.6-35b-a3b"))
        .arg("--nest")
        .arg(card())
        .arg("--weights")
        .arg(weights)
        .args(args)
        .env("LINNET_STDLIB", root().join("stdlib"))
        .env("LINNET_CACHE_DIR", std::env::temp_dir().join("linnet-test-cache"))
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap()
}

/// The `PPL = X +/- Y` line's `X`.
fn final_estimate(output: &str) -> f64 {
    let line = output.lines().find(|line| line.starts_with("Final estimate: PPL = ")).expect(output);
    line["Final estimate: PPL = ".len()..].split_whitespace().next().unwrap().parse().unwrap()
}

/// Each GGUF file llama.cpp makes of the model, through `linnet
/// perplexity --kl-divergence` against the f32 checkpoint's base: its f32
/// file is the checkpoint (the same perplexity, no divergence), and each
/// format costs what its bits say: bf16 and Q8_0 next to nothing, Q6_K a
/// little, Q4_K_M the most; every one still has the f32 model's top token
/// almost everywhere.
#[test]
fn every_format_costs_what_its_bits_say() {
    let folder = std::env::temp_dir().join(format!("linnet-quality-{}", std::process::id()));
    std::fs::create_dir_all(&folder).unwrap();
    let base = folder.join("base.bin");
    let text = fixture().join("held-out.txt");
    let args = ["-f", text.to_str().unwrap(), "-c", "256", "--kl-divergence-base", base.to_str().unwrap()];
    let reference = final_estimate(&perplexity(&weights(), &args));
    let compare = ["--kl-divergence-base", base.to_str().unwrap(), "--kl-divergence"];
    let mut divergences = Vec::new();
    for format in ["f32", "bf16", "q8_0", "q6_k", "q4_k_m"] {
        let file = fixture().join(format!("gguf/tiny-text-{format}.gguf"));
        let report = perplexity(&file, &compare);
        let number = |label: &str| -> f64 {
            let line = report.lines().find(|line| line.starts_with(label)).expect(&report);
            line.split(':').nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap()
        };
        let (ppl, kld, same_top) = (number("Mean PPL(Q)"), number("Mean    KLD"), number("Same top p"));
        assert!((ppl / reference - 1.0).abs() < 0.05, "{format}: perplexity {ppl} against {reference}");
        assert!(same_top > 80.0, "{format}: the same top token at only {same_top}%");
        divergences.push((format, ppl, kld));
    }
    let kld = |name: &str| divergences.iter().find(|(format, ..)| *format == name).unwrap().2;
    assert!(kld("f32") < 1e-4, "{divergences:?}");
    assert!((divergences[0].1 / reference - 1.0).abs() < 1e-4, "{divergences:?}");
    assert!(kld("bf16") < kld("q6_k") && kld("q8_0") < kld("q6_k") && kld("q6_k") < kld("q4_k_m"), "{divergences:?}");
    std::fs::remove_dir_all(folder).unwrap();
}

/// llama-quantize's own files of the model: `tiny-text-q3_k_m.gguf`, its
/// Q3_K_M mix (Q3_K, Q4_K, Q5_K, Q6_K), and `tiny-text-mixed.gguf`, each
/// kind of matrix in another format (`--tensor-type`: every other format
/// Linnet reads). On the interpreter each file's `forward` is bit for bit
/// that of its values dequantized into a plain file; the CPU backend's is
/// within the f32 contract, and its greedy text is the interpreter's.
#[test]
fn llama_quantize_files_in_every_format_read_as_their_values() {
    let package = root().join("models/qwen3.6-35b-a3b");
    let case = &golden()["completions"]["ru"];
    let prompt = ids(&case["prompt_ids"]);
    let load = |file: &Path, backend| {
        let checkpoint = Weights::Checkpoint { dir: Some(file.to_path_buf()), non_finite: NonFinite::Refuse };
        load_on(&package, &options(), &checkpoint, backend).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
    };
    let forward = |loaded: &mut Loaded| -> Vec<f32> {
        let tokens = Tensor::from_i64(Dtype::I32, vec![1, prompt.len()], prompt.clone());
        let out = loaded.machine.call("forward", vec![tokens]).unwrap().swap_remove(0);
        out.widened().as_f32().unwrap().to_vec()
    };
    let greedy_text = |loaded: &mut Loaded| -> String {
        loaded.machine.reset().unwrap();
        let text = loaded.text.as_ref().expect("the fixture's tokenizer");
        let ids = generate::generate(
            &mut loaded.machine,
            &prompt,
            24,
            &Sampling::default(),
            &mut Rng::new(0),
            &text.end_ids,
            |_| true,
        )
        .unwrap();
        text.decode(&ids)
    };
    for name in ["q3_k_m", "mixed"] {
        let file = fixture().join(format!("gguf/tiny-text-{name}.gguf"));
        let plain = common::dequantized_gguf(&file);
        let expected = forward(&mut load(&plain, BackendKind::Interp));
        std::fs::remove_file(&plain).unwrap();
        let mut interpreted = load(&file, BackendKind::Interp);
        let reference = forward(&mut interpreted);
        assert!(reference.iter().zip(&expected).all(|(a, b)| a.to_bits() == b.to_bits()), "{name}: not its values");
        let mut compiled = load(&file, BackendKind::Cpu);
        let ours = forward(&mut compiled);
        let scale = reference.iter().fold(0f32, |m, v| m.max(v.abs()));
        let apart = ours.iter().zip(&reference).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale;
        assert!(apart <= 1e-4, "{name}: the CPU is {apart:.2e} of the scale from the interpreter");
        assert_eq!(greedy_text(&mut compiled), greedy_text(&mut interpreted), "{name}: greedy text");
    }
}

/// Speculative decoding with n-gram drafts gives the tokens decoding
/// without drafts gives, on the trained model (whose text repeats, so some
/// drafts are kept, and where they part from the model's choice the
/// recurrent states are rolled back), on the interpreter and the CPU:
/// greedily, and with a frequency penalty (each draft judged after the
/// drafts kept before it).
#[test]
fn speculative_ngram_decoding_gives_the_tokens_decoding_gives() {
    let package = root().join("models/qwen3.6-35b-a3b");
    let checkpoint = Weights::Checkpoint { dir: Some(weights()), non_finite: NonFinite::Refuse };
    let greedily = Sampling::default();
    let penalized = Sampling { frequency_penalty: 0.5, ..Sampling::default() };
    let runs =
        [(BackendKind::Interp, &greedily, 4), (BackendKind::Cpu, &greedily, 1), (BackendKind::Cpu, &penalized, 4)];
    for (backend, sampling, draft) in runs {
        let Loaded { mut machine, text, .. } = load_on(&package, &options(), &checkpoint, backend).unwrap();
        let prompt =
            text.unwrap().encode_prompt("The cat sat on the mat. The cat sat on the mat. The cat sat on the").unwrap();
        let plain = generate::generate(&mut machine, &prompt, 32, sampling, &mut Rng::new(0), &[], |_| true).unwrap();
        let request = Request { prompt: &prompt, max_tokens: 32, draft, sampling, stop: &[] };
        let (tokens, acceptance) =
            speculative::speculate(&mut machine, &request, speculative::ngram_draft, &mut Rng::new(0), |_| true)
                .unwrap();
        assert_eq!(tokens, plain, "{backend:?}, {sampling:?}, drafts of {draft}");
        // Both ways through a check: drafts kept, and drafts refused.
        assert!(acceptance.accepted > 0 && acceptance.accepted < acceptance.drafted, "{backend:?}: {acceptance:?}");
    }
}

/// The model and its multi-token-prediction layer (the card's
/// `[drafter]`) on `backend`.
fn model_and_drafter(backend: BackendKind) -> (Loaded, Machine) {
    let package = root().join("models/qwen3.6-35b-a3b");
    let checkpoint = Weights::Checkpoint { dir: Some(weights()), non_finite: NonFinite::Refuse };
    let model = load_on(&package, &options(), &checkpoint, backend).unwrap();
    let drafter = load_on(&package, &LoadOptions { drafter: true, ..options() }, &checkpoint, backend).unwrap();
    (model, drafter.machine)
}

/// The trained MTP layer's logits on `backend` are those its torch module
/// computes (`scripts/train-text-mtp.py`, `golden-mtp.json`), at every
/// position of three held-out prompts: from the model's hidden states
/// (`prefill_hidden`), the first five positions in one call of `draft`,
/// then one a call, continuing its cache.
fn mtp_logits_meet_torch_on(backend: BackendKind) {
    let golden = std::fs::read_to_string(fixture().join("golden-mtp.json")).unwrap();
    let golden: Value = serde_json::from_str(&golden).unwrap();
    let (Loaded { mut machine, .. }, mut drafter) = model_and_drafter(backend);
    let rows = 2;
    let repeated = |values: &[i64]| (0..rows).flat_map(|_| values.to_vec()).collect::<Vec<_>>();
    for prompt in golden["prompts"].as_array().unwrap() {
        let ids = ids(&prompt["ids"]);
        let tokens = Tensor::from_i64(Dtype::I32, vec![rows, ids.len()], repeated(&ids));
        machine.reset().unwrap();
        let hidden =
            machine.call("prefill_hidden", vec![tokens, position(0)]).unwrap().remove(1).widened().into_owned();
        let width = hidden.shape[2];
        let hidden = hidden.as_f32().unwrap().to_vec();
        drafter.reset().unwrap();
        let mut at = 0;
        for length in std::iter::once(5).chain(std::iter::repeat(1)).take(ids.len() - 5) {
            // Position p's hidden state with the token at p + 1.
            let states = (0..rows)
                .flat_map(|row| {
                    hidden[(row * ids.len() + at) * width..(row * ids.len() + at + length) * width].to_vec()
                })
                .collect();
            let inputs = vec![
                Tensor::from_i64(Dtype::I32, vec![rows, length], repeated(&ids[at + 1..=at + length])),
                Tensor::from_f32(Dtype::F32, vec![rows, length, width], states),
                position(at),
            ];
            let logits = drafter.call("draft", inputs).unwrap().remove(0).widened().into_owned();
            at += length;
            let expected: Vec<f32> =
                prompt["logits"][at - 1].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
            let scale = expected.iter().fold(0f32, |m, v| m.max(v.abs()));
            for ours in logits.as_f32().unwrap().chunks(expected.len()) {
                let apart = ours.iter().zip(&expected).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale;
                assert!(apart <= 1e-4, "{backend:?}, position {}: {apart:.2e} of the scale from torch", at - 1);
            }
        }
    }
}

fn position(at: usize) -> Tensor {
    Tensor::from_i64(Dtype::I32, vec![], vec![at as i64])
}

#[test]
fn the_mtp_layer_gives_the_logits_its_torch_module_computes() {
    mtp_logits_meet_torch_on(BackendKind::Cpu);
    mtp_logits_meet_torch_on(BackendKind::Interp);
}

/// Speculative decoding with drafts of the trained MTP layer on `backend`
/// gives the tokens decoding without drafts gives, with each sampling and
/// length of drafts; the layer has learned, so drafts are kept, and some
/// are refused (the states rolled back).
fn mtp_drafts_are_lossless_on(backend: BackendKind, runs: &[(&Sampling, usize)]) {
    let (Loaded { mut machine, text, .. }, mut layer) = model_and_drafter(backend);
    let prompt = text.unwrap().encode_prompt("Der Mensch ist").unwrap();
    for &(sampling, draft) in runs {
        let plain = generate::generate(&mut machine, &prompt, 24, sampling, &mut Rng::new(0), &[], |_| true).unwrap();
        let request = Request { prompt: &prompt, max_tokens: 24, draft, sampling, stop: &[] };
        let drafter = MtpDrafter::new(&mut layer).unwrap();
        let (tokens, acceptance) =
            speculative::speculate(&mut machine, &request, drafter, &mut Rng::new(0), |_| true).unwrap();
        assert_eq!(tokens, plain, "{backend:?}, {sampling:?}, drafts of {draft}");
        assert!(acceptance.accepted > 0 && acceptance.accepted < acceptance.drafted, "{backend:?}: {acceptance:?}");
    }
}

#[test]
fn mtp_drafts_give_the_tokens_decoding_gives() {
    let penalized = Sampling { frequency_penalty: 0.5, ..Sampling::default() };
    mtp_drafts_are_lossless_on(BackendKind::Interp, &[(&Sampling::default(), 2)]);
    mtp_drafts_are_lossless_on(BackendKind::Cpu, &[(&Sampling::default(), 1), (&penalized, 3)]);
}

/// The GPU kernels' bodies, run on the host by MLIR (`--features nvptx`),
/// for the MTP layer and the entries speculative decoding calls.
#[cfg(feature = "nvptx")]
#[test]
fn gpu_kernels_on_the_host_run_the_mtp_layer_and_its_drafts() {
    mtp_logits_meet_torch_on(BackendKind::MlirHost);
    mtp_drafts_are_lossless_on(BackendKind::MlirHost, &[(&Sampling::default(), 2)]);
}

/// Speculative decoding in the server (`--speculative ngram`), on the
/// trained model: each request's greedy text and log-probabilities are
/// those of a server without drafts, whether it drafts or not
/// (`num_speculative_tokens: 0`) and whatever runs beside it (four
/// requests at once on two rows, one in Cyrillic); `/metrics` counts the checks, the
/// drafts and those kept, under vLLM's names; a request asking for more
/// drafts than allowed is refused.
#[test]
fn drafts_checked_by_the_server_give_the_text_without_them() {
    let drafting = start(&["--speculative", "ngram", "--draft", "3"]);
    let plain = start(&[]);
    let request = |prompt: &str, drafts: Option<u64>| {
        let mut body = json!({ "prompt": prompt, "max_tokens": 30, "temperature": 0, "logprobs": 0 });
        if let Some(drafts) = drafts {
            body["num_speculative_tokens"] = json!(drafts);
        }
        body
    };
    let requests = [
        request("1 2 3 4 5 1 2 3 4 5 1 2 3 4 5 1 2 3", None),
        request("The cat sat on the mat. The cat sat on the mat. The cat sat on the", None),
        request("1 2 3 4 5 1 2 3 4 5 1 2 3 4 5 1 2 3", Some(0)),
        // Characters of several bytes, which tokens split.
        request("Жизнь — это жизнь. Жизнь — это жизнь. Жизнь — это", None),
    ];
    let answer = |server: &Server, body: &Value| {
        let value = post(server, "/v1/completions", body);
        let choice = &value["choices"][0];
        let logprobs: Vec<f64> =
            choice["logprobs"]["token_logprobs"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        (choice["text"].as_str().unwrap().to_string(), logprobs)
    };
    let together: Vec<(String, Vec<f64>)> = std::thread::scope(|scope| {
        let running: Vec<_> = requests.iter().map(|body| scope.spawn(|| answer(&drafting, body))).collect();
        running.into_iter().map(|handle| handle.join().unwrap()).collect()
    });
    for (body, (text, logprobs)) in requests.iter().zip(&together) {
        let (expected_text, expected_logprobs) = answer(&plain, body);
        assert_eq!(*text, expected_text, "{body}");
        assert_eq!(logprobs.len(), expected_logprobs.len());
        for (got, expected) in logprobs.iter().zip(&expected_logprobs) {
            assert!((got - expected).abs() < 1e-3, "{body}: {got} vs {expected}");
        }
    }
    let (_, metrics) = drafting.call("GET", "/metrics", "");
    let count = |name: &str| -> u64 {
        let line =
            metrics.lines().find(|line| line.starts_with(name)).unwrap_or_else(|| panic!("no {name}: {metrics}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let (checks, drafted, kept) = (
        count("vllm:spec_decode_num_drafts_total{"),
        count("vllm:spec_decode_num_draft_tokens_total{"),
        count("vllm:spec_decode_num_accepted_tokens_total{"),
    );
    assert!(checks > 0 && drafted >= checks && kept > 0 && kept < drafted, "{checks} {drafted} {kept}");
    assert_eq!(count("linnet_spec_decode_accepted_tokens_total "), kept);
    let too_many = json!({ "prompt": "1 2", "max_tokens": 2, "num_speculative_tokens": 65 }).to_string();
    let (status, body) = drafting.call("POST", "/v1/completions", &too_many);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("num_speculative_tokens"), "{body}");
}
