//! A tokenizer from a GGUF file's own metadata, so that a file alone is
//! enough to generate text: `tokenizer.ggml.model` (byte-level BPE,
//! `gpt2`), `tokens`, `token_type`, `merges`, the pre-tokenizer named by
//! `tokenizer.ggml.pre`, the special ids and `tokenizer.chat_template`.
//! The tokenizer is built as the Hugging Face tokenizer of the same model
//! is (the `tokenizers` crate, from the same vocabulary and merges), so it
//! gives the same token ids.

use crate::gguf::{Gguf, Meta};
use crate::Error;
use serde_json::{json, Value};
use tokenizers::Tokenizer;

/// GGML's token types (`tokenizer.ggml.token_type`).
const CONTROL: u64 = 3;
const USER_DEFINED: u64 = 4;

/// The splitting expression of each pre-tokenizer llama.cpp names, as
/// the Hugging Face `tokenizer.json` of such models writes it, and its
/// normalizer (Qwen2's composes to NFC; Qwen3.5's leaves text as it is).
fn pre_tokenizer(name: &str) -> Option<(&'static str, Value)> {
    Some(match name {
        "qwen2" => (
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
            json!({ "type": "NFC" }),
        ),
        "qwen35" => (
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
            Value::Null,
        ),
        _ => return None,
    })
}

fn strings<'a>(gguf: &'a Gguf, key: &str) -> Result<Vec<&'a str>, Error> {
    match gguf.meta(key) {
        Some(Meta::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(at, item)| item.as_str().ok_or_else(|| Error::Text(format!("`{key}`[{at}] is not a string"))))
            .collect(),
        Some(_) => Err(Error::Text(format!("`{key}` is not an array of strings"))),
        None => Err(Error::Text(format!("the file has no `{key}`"))),
    }
}

/// The file's tokenizer, `None` when it has no vocabulary, or why it
/// cannot be built.
pub fn tokenizer(gguf: &Gguf) -> Result<Option<Tokenizer>, Error> {
    let Some(model) = gguf.meta("tokenizer.ggml.model") else { return Ok(None) };
    if model.as_str() != Some("gpt2") {
        return Err(Error::Text(format!(
            "the file's tokenizer is `{}`; linnet reads byte-level BPE (`gpt2`) ones",
            show(model)
        )));
    }
    let pre = gguf.meta("tokenizer.ggml.pre").and_then(Meta::as_str).unwrap_or("default");
    let (pattern, normalizer) = pre_tokenizer(pre).ok_or_else(|| {
        Error::Text(format!("the file's pre-tokenizer `{pre}` is not one linnet knows (qwen2, qwen35)"))
    })?;
    let tokens = strings(gguf, "tokenizer.ggml.tokens")?;
    // A vocabulary without merges is one of single symbols.
    let merges = match gguf.meta("tokenizer.ggml.merges") {
        Some(_) => strings(gguf, "tokenizer.ggml.merges")?,
        None => Vec::new(),
    };
    let types: Vec<u64> = match gguf.meta("tokenizer.ggml.token_type") {
        Some(Meta::Array(items)) => items.iter().map(|t| t.as_u64().unwrap_or(1)).collect(),
        _ => vec![1; tokens.len()],
    };
    if types.len() != tokens.len() {
        return Err(Error::Text(format!("the file has {} tokens and {} token types", tokens.len(), types.len())));
    }
    let vocab: serde_json::Map<String, Value> =
        tokens.iter().enumerate().map(|(id, token)| (token.to_string(), json!(id))).collect();
    let added: Vec<Value> = tokens
        .iter()
        .zip(&types)
        .enumerate()
        .filter(|(_, (_, &kind))| kind == CONTROL || kind == USER_DEFINED)
        .map(|(id, (token, &kind))| {
            json!({ "id": id, "content": token, "single_word": false, "lstrip": false, "rstrip": false,
                    "normalized": false, "special": kind == CONTROL })
        })
        .collect();
    let byte_level =
        json!({ "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false });
    let description = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": { "type": "Sequence", "pretokenizers": [
            { "type": "Split", "pattern": { "Regex": pattern }, "behavior": "Isolated", "invert": false },
            byte_level,
        ]},
        "post_processor": null,
        "decoder": byte_level,
        "model": { "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                   "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                   "vocab": vocab, "merges": merges },
    });
    description
        .to_string()
        .parse::<Tokenizer>()
        .map(Some)
        .map_err(|e| Error::Text(format!("the file's vocabulary does not make a tokenizer: {e}")))
}

fn show(value: &Meta) -> String {
    value.as_str().map_or_else(|| format!("{value:?}"), str::to_string)
}

/// The file's end-of-sequence ids: `eos_token_id`, and `eot_token_id`
/// where it differs.
pub fn end_ids(gguf: &Gguf) -> Vec<i64> {
    let mut ids: Vec<i64> = ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"]
        .iter()
        .filter_map(|key| gguf.meta(key)?.as_u64())
        .map(|id| id as i64)
        .collect();
    ids.dedup();
    ids
}

/// The special tokens a chat template reads by name, from the file's
/// special ids: `bos_token` for `tokenizer.ggml.bos_token_id`, and so on.
pub fn named_tokens(gguf: &Gguf) -> serde_json::Map<String, Value> {
    let Ok(tokens) = strings(gguf, "tokenizer.ggml.tokens") else { return serde_json::Map::new() };
    [("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"), ("pad_token", "padding")]
        .iter()
        .filter_map(|(name, key)| {
            let id = gguf.meta(&format!("tokenizer.ggml.{key}_token_id"))?.as_u64()?;
            let text = tokens.get(usize::try_from(id).ok()?)?;
            Some((name.to_string(), Value::String(text.to_string())))
        })
        .collect()
}

/// The file's chat template, if it has one.
pub fn chat_template(gguf: &Gguf) -> Option<String> {
    gguf.meta("tokenizer.chat_template").and_then(Meta::as_str).map(str::to_string)
}
