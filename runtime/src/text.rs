//! Text in and out: the checkpoint's `tokenizer.json` (the `tokenizers`
//! crate), its chat template (`tokenizer_config.json` or
//! `chat_template.jinja`, rendered with minijinja), and its end-of-sequence
//! ids (`generation_config.json`, else `config.json`).

use std::path::Path;
use tokenizers::Tokenizer;

pub struct TextModel {
    tokenizer: Tokenizer,
    chat_template: Option<String>,
    /// Generation stops after any of these.
    pub end_ids: Vec<i64>,
}

fn json(path: &Path) -> Option<serde_json::Value> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

fn ids(value: &serde_json::Value) -> Vec<i64> {
    match value {
        serde_json::Value::Number(n) => n.as_i64().into_iter().collect(),
        serde_json::Value::Array(items) => items.iter().filter_map(|v| v.as_i64()).collect(),
        _ => Vec::new(),
    }
}

impl TextModel {
    /// The text side of the checkpoint in `dir`; `None` without a tokenizer.
    pub fn load(dir: &Path) -> Result<Option<TextModel>, String> {
        let path = dir.join("tokenizer.json");
        if !path.exists() {
            return Ok(None);
        }
        let tokenizer = Tokenizer::from_file(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let end_ids = ["generation_config.json", "config.json"]
            .iter()
            .filter_map(|name| json(&dir.join(name)))
            .map(|config| ids(&config["eos_token_id"]))
            .find(|ids| !ids.is_empty())
            .unwrap_or_default();
        let chat_template = json(&dir.join("tokenizer_config.json"))
            .and_then(|config| config["chat_template"].as_str().map(str::to_string))
            .or_else(|| std::fs::read_to_string(dir.join("chat_template.jinja")).ok());
        Ok(Some(TextModel { tokenizer, chat_template, end_ids }))
    }

    pub fn encode(&self, text: &str) -> Result<Vec<i64>, String> {
        let encoding = self.tokenizer.encode(text, false).map_err(|e| format!("cannot tokenize the prompt: {e}"))?;
        Ok(encoding.get_ids().iter().map(|&id| id as i64).collect())
    }

    pub fn decode(&self, ids: &[i64]) -> String {
        let ids: Vec<u32> = ids.iter().map(|&id| id as u32).collect();
        self.tokenizer.decode(&ids, true).unwrap_or_default()
    }

    pub fn has_chat_template(&self) -> bool {
        self.chat_template.is_some()
    }

    /// The prompt for a conversation, ready for the assistant's turn.
    pub fn chat(&self, messages: &[(String, String)]) -> Result<String, String> {
        let template = self.chat_template.as_ref().ok_or("the checkpoint has no chat template")?;
        let mut env = minijinja::Environment::new();
        env.add_function("raise_exception", |message: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, message))
        });
        env.add_template("chat", template).map_err(|e| format!("the chat template does not parse: {e}"))?;
        let messages: Vec<_> = messages.iter().map(|(role, content)| minijinja::context! { role, content }).collect();
        env.get_template("chat")
            .and_then(|t| t.render(minijinja::context! { messages, add_generation_prompt => true }))
            .map_err(|e| format!("the chat template failed: {e}"))
    }
}

/// Text decoded so far, handing out only what is new each time (a token
/// may complete a character that an earlier one began).
pub struct Stream<'t> {
    text: &'t TextModel,
    ids: Vec<i64>,
    shown: usize,
}

impl<'t> Stream<'t> {
    pub fn new(text: &'t TextModel) -> Stream<'t> {
        Stream { text, ids: Vec::new(), shown: 0 }
    }

    pub fn push(&mut self, id: i64) -> String {
        self.ids.push(id);
        let all = self.text.decode(&self.ids);
        if !all.is_char_boundary(self.shown.min(all.len())) || all.len() < self.shown {
            return String::new();
        }
        let new = all[self.shown..].to_string();
        self.shown = all.len();
        new
    }
}
