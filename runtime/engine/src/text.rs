//! Text in and out: the checkpoint's `tokenizer.json` (the `tokenizers`
//! crate), its chat template (`tokenizer_config.json` or
//! `chat_template.jinja`, rendered with minijinja), and its end-of-sequence
//! ids (`generation_config.json`, else `config.json`); or all three from
//! a GGUF file's metadata ([`crate::vocab`]). Text given as a prompt gets
//! the tokenizer's own additions (Llama's and Gemma's beginning of
//! sequence), as transformers' `tokenizer(text)` and vLLM's completions
//! give them; a rendered chat gets them from its template, which reads
//! the special tokens by name (`bos_token`, …) as transformers passes them.

use crate::Error;
use serde_json::{Map, Value};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use tokenizers::{DecoderWrapper, Tokenizer};

pub struct TextModel {
    tokenizer: Tokenizer,
    chat_template: Option<String>,
    /// The special tokens a template reads by name (`bos_token`,
    /// `eos_token`, `unk_token`, `pad_token`), as their text.
    named_tokens: Map<String, Value>,
    /// Generation stops after any of these.
    pub end_ids: Vec<i64>,
    /// The added tokens marked special: left out of decoded text.
    specials: HashSet<u32>,
    /// For a byte-level BPE tokenizer, the byte each character of its
    /// tokens' spelling stands for.
    byte_alphabet: Option<HashMap<char, u8>>,
}

/// GPT-2's map of bytes to the printable characters byte-level BPE spells
/// them with, inverted: character to byte.
fn byte_of_char() -> HashMap<char, u8> {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
    let mut next = 256u32;
    (0..=255u8)
        .map(|byte| {
            let c = if printable(byte) {
                char::from(byte)
            } else {
                let c = char::from_u32(next).expect("below the surrogates");
                next += 1;
                c
            };
            (c, byte)
        })
        .collect()
}

/// A byte-fallback token's byte: `<0xAB>`.
fn fallback_byte(token: &str) -> Option<u8> {
    let hex = token.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok()).flatten()
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
    pub fn load(dir: &Path) -> Result<Option<TextModel>, Error> {
        let path = dir.join("tokenizer.json");
        if !path.exists() {
            return Ok(None);
        }
        let tokenizer = Tokenizer::from_file(&path).map_err(|e| Error::Text(format!("{}: {e}", path.display())))?;
        let end_ids = ["generation_config.json", "config.json"]
            .iter()
            .filter_map(|name| json(&dir.join(name)))
            .map(|config| ids(&config["eos_token_id"]))
            .find(|ids| !ids.is_empty())
            .unwrap_or_default();
        let config = json(&dir.join("tokenizer_config.json")).unwrap_or_default();
        let chat_template = config["chat_template"]
            .as_str()
            .map(str::to_string)
            .or_else(|| std::fs::read_to_string(dir.join("chat_template.jinja")).ok());
        // Each is its text, or an added token's description with it.
        let named_tokens = NAMED_TOKENS
            .iter()
            .filter_map(|name| {
                let token = &config[*name];
                let text = token.as_str().or_else(|| token["content"].as_str())?;
                Some((name.to_string(), Value::String(text.to_string())))
            })
            .collect();
        Ok(Some(TextModel::new(tokenizer, chat_template, end_ids).with_named_tokens(named_tokens)))
    }

    /// A text side from its parts.
    pub fn new(tokenizer: Tokenizer, chat_template: Option<String>, end_ids: Vec<i64>) -> TextModel {
        let specials = tokenizer
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, token)| token.special)
            .map(|(id, _)| id)
            .collect();
        let byte_alphabet = matches!(tokenizer.get_decoder(), Some(DecoderWrapper::ByteLevel(_))).then(byte_of_char);
        TextModel { tokenizer, chat_template, named_tokens: Map::new(), end_ids, specials, byte_alphabet }
    }

    /// The special tokens the chat template reads by name.
    pub fn with_named_tokens(mut self, named_tokens: Map<String, Value>) -> TextModel {
        self.named_tokens = named_tokens;
        self
    }

    /// The text side of the GGUF file at `path`, from its own metadata
    /// (see [`crate::vocab`]); `None` when it has no vocabulary.
    pub fn from_gguf(path: &Path) -> Result<Option<TextModel>, Error> {
        TextModel::of_gguf(&crate::gguf::Files::open(path)?)
    }

    /// The text side of GGUF `files` already open (see [`Self::from_gguf`]).
    pub fn of_gguf(files: &crate::gguf::Files) -> Result<Option<TextModel>, Error> {
        let gguf = files.first();
        let Some(tokenizer) =
            crate::vocab::tokenizer(gguf).map_err(|e| Error::Text(format!("{}: {e}", files.path().display())))?
        else {
            return Ok(None);
        };
        let text = TextModel::new(tokenizer, crate::vocab::chat_template(gguf), crate::vocab::end_ids(gguf));
        Ok(Some(text.with_named_tokens(crate::vocab::named_tokens(gguf))))
    }

    /// The tokens of `text` as it stands: a rendered chat, a stop sequence.
    pub fn encode(&self, text: &str) -> Result<Vec<i64>, Error> {
        self.encode_with(text, false)
    }

    /// The tokens of a prompt given as text, with what the tokenizer adds
    /// to a sequence (Llama's and Gemma's beginning of sequence; nothing
    /// for Qwen's).
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<i64>, Error> {
        self.encode_with(text, true)
    }

    fn encode_with(&self, text: &str, add_special_tokens: bool) -> Result<Vec<i64>, Error> {
        let encoding = self
            .tokenizer
            .encode(text, add_special_tokens)
            .map_err(|e| Error::Text(format!("cannot tokenize the prompt: {e}")))?;
        Ok(encoding.get_ids().iter().map(|&id| id as i64).collect())
    }

    /// The text of `ids` as Hugging Face's `decode` gives it by default:
    /// special tokens left out, bytes that are not UTF-8 as U+FFFD.
    pub fn decode(&self, ids: &[i64]) -> String {
        self.decode_showing(ids, &[])
    }

    /// The text of `ids` with every special token written as itself
    /// (`skip_special_tokens=False`).
    pub fn decode_with_specials(&self, ids: &[i64]) -> String {
        let ids: Vec<u32> = ids.iter().map(|&id| id as u32).collect();
        self.tokenizer.decode(&ids, false).unwrap_or_default()
    }

    /// The text of `ids` with special tokens left out, except those of
    /// `shown`, written as themselves: the text around each shown token is
    /// decoded as [`Self::decode`] decodes it.
    pub fn decode_showing(&self, ids: &[i64], shown: &[u32]) -> String {
        let mut text = String::new();
        let mut run: Vec<u32> = Vec::with_capacity(ids.len());
        for &id in ids {
            let id = id as u32;
            if !shown.contains(&id) {
                run.push(id);
                continue;
            }
            text.push_str(&self.tokenizer.decode(&run, true).unwrap_or_default());
            run.clear();
            text.push_str(&self.tokenizer.id_to_token(id).unwrap_or_default());
        }
        text.push_str(&self.tokenizer.decode(&run, true).unwrap_or_default());
        text
    }

    /// The id of the special token spelled `text`, if the vocabulary has
    /// one (a tag the model writes as one token rather than as text).
    pub fn special_token(&self, text: &str) -> Option<u32> {
        self.tokenizer.token_to_id(text).filter(|id| self.specials.contains(id))
    }

    /// Whether the tokenizer is byte-level BPE: its tokens spell bytes in
    /// GPT-2's alphabet, and a text is the concatenation of its tokens'
    /// bytes.
    pub fn is_byte_level(&self) -> bool {
        self.byte_alphabet.is_some()
    }

    /// Whether `id` is a special token.
    pub fn is_special(&self, id: u32) -> bool {
        self.specials.contains(&id)
    }

    /// The bytes token `id` stands for, whole even where they are part of a
    /// character: a byte-level token's bytes, a byte-fallback token's
    /// byte, a special token's text; else its decoded text.
    pub fn token_bytes(&self, id: i64) -> Vec<u8> {
        let Some(token) = u32::try_from(id).ok().and_then(|id| self.tokenizer.id_to_token(id)) else {
            return Vec::new();
        };
        if self.is_special(id as u32) {
            return token.into_bytes();
        }
        if let Some(alphabet) = &self.byte_alphabet {
            if let Some(bytes) = token.chars().map(|c| alphabet.get(&c).copied()).collect::<Option<Vec<u8>>>() {
                return bytes;
            }
            return token.into_bytes();
        }
        match fallback_byte(&token) {
            Some(byte) => vec![byte],
            None => self.decode(&[id]).into_bytes(),
        }
    }

    /// The text side at `path`: a GGUF file's vocabulary, or a folder's
    /// (or a `tokenizer.json` file's folder's) tokenizer files.
    pub fn open(path: &Path) -> Result<Option<TextModel>, Error> {
        if crate::weights::is_gguf(path) {
            return TextModel::from_gguf(path);
        }
        match path.is_dir() {
            true => TextModel::load(path),
            false => TextModel::load(path.parent().unwrap_or(Path::new("."))),
        }
    }

    /// Uses `template` as the chat template.
    pub fn set_chat_template(&mut self, template: String) {
        self.chat_template = Some(template);
    }

    /// The tokenizer itself, for what reads its vocabulary.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn has_chat_template(&self) -> bool {
        self.chat_template.is_some()
    }

    /// Whether the chat template has a turn for `role` of its own (names
    /// it anywhere): a `developer` turn is rendered as `system` where not.
    pub fn template_knows_role(&self, role: &str) -> bool {
        self.chat_template.as_deref().is_some_and(|template| template.contains(role))
    }

    /// The prompt for a conversation, ready for the assistant's turn
    /// (unless `options` sets `add_generation_prompt` false):
    /// `messages` as the chat API sends them (`role`, `content`, and what
    /// else the template reads), `options` the template's own variables
    /// (`chat_template_kwargs`: `enable_thinking`, …).
    pub fn chat(&self, messages: &[Value], options: &Map<String, Value>) -> Result<String, Error> {
        let template =
            self.chat_template.as_ref().ok_or_else(|| Error::Text("the checkpoint has no chat template".into()))?;
        let mut context = self.named_tokens.clone();
        context.extend(options.clone());
        render_chat(template, messages, &context)
    }
}

/// The special tokens transformers hands a chat template by name.
const NAMED_TOKENS: [&str; 4] = ["bos_token", "eos_token", "unk_token", "pad_token"];

/// Renders a chat template as Jinja2 in Python would: Python's string and
/// list methods (`startswith`, `split`, `strip`, …) through minijinja's
/// Python compatibility, `raise_exception` and `strftime_now` (in UTC) as
/// templates call them, and
/// `messages` over the caller's options, and `add_generation_prompt`
/// true unless they set it.
pub fn render_chat(template: &str, messages: &[Value], options: &Map<String, Value>) -> Result<String, Error> {
    let mut env = minijinja::Environment::new();
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |message: String| -> Result<String, minijinja::Error> {
        Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, message))
    });
    env.add_function("strftime_now", |format: String| crate::clock::strftime_now(&format));
    env.add_filter("tojson", python_json);
    env.add_template("chat", template).map_err(|e| Error::Text(format!("the chat template does not parse: {e}")))?;
    let mut context = options.clone();
    context.insert("messages".into(), Value::Array(messages.to_vec()));
    context.entry("add_generation_prompt").or_insert(Value::Bool(true));
    env.get_template("chat")
        .and_then(|t| t.render(&context))
        .map_err(|e| Error::Text(format!("the chat template failed: {e}")))
}

/// JSON as Python's `json.dumps` writes it, which is what the templates'
/// `tojson` gives where models are trained (transformers' chat templates):
/// `", "` between items, `": "` after keys, keys in the order given (or
/// sorted with `sort_keys=true`), non-ASCII text as it is, `indent=N`.
fn python_json(
    value: minijinja::Value,
    options: minijinja::value::Kwargs,
) -> Result<minijinja::Value, minijinja::Error> {
    let indent: Option<usize> = options.get("indent")?;
    let sort_keys: Option<bool> = options.get("sort_keys")?;
    // Python's own options that change nothing here.
    let _: Option<bool> = options.get("ensure_ascii")?;
    options.assert_all_used()?;
    let mut json = serde_json::to_value(&value)
        .map_err(|e| minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, e.to_string()))?;
    if sort_keys == Some(true) {
        sort_keys_of(&mut json);
    }
    let mut out = Vec::new();
    let indentation = indent.map(|n| " ".repeat(n));
    let formatter = PythonFormatter { indent: indentation.as_deref(), written: Vec::new() };
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, formatter);
    serde::Serialize::serialize(&json, &mut serializer)
        .map_err(|e| minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, e.to_string()))?;
    Ok(minijinja::Value::from_safe_string(String::from_utf8(out).expect("JSON is UTF-8")))
}

fn sort_keys_of(value: &mut Value) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = std::mem::take(map).into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            for (key, mut item) in entries {
                sort_keys_of(&mut item);
                map.insert(key, item);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(sort_keys_of),
        _ => {}
    }
}

/// `json.dumps`' separators: `", "` and `": "`, or with an indent, each
/// item on its own line and `","` at its end.
struct PythonFormatter<'a> {
    indent: Option<&'a str>,
    /// Per open bracket, whether anything was written inside it.
    written: Vec<bool>,
}

impl PythonFormatter<'_> {
    fn open<W: ?Sized + std::io::Write>(&mut self, writer: &mut W, bracket: &[u8]) -> std::io::Result<()> {
        self.written.push(false);
        writer.write_all(bracket)
    }

    fn item<W: ?Sized + std::io::Write>(&mut self, writer: &mut W, first: bool) -> std::io::Result<()> {
        if let Some(written) = self.written.last_mut() {
            *written = true;
        }
        match self.indent {
            None if first => Ok(()),
            None => writer.write_all(b", "),
            Some(indent) => {
                writer.write_all(if first { b"\n" } else { b",\n" })?;
                writer.write_all(indent.repeat(self.written.len()).as_bytes())
            }
        }
    }

    fn close<W: ?Sized + std::io::Write>(&mut self, writer: &mut W, bracket: &[u8]) -> std::io::Result<()> {
        let written = self.written.pop().unwrap_or(false);
        if let (Some(indent), true) = (self.indent, written) {
            writer.write_all(b"\n")?;
            writer.write_all(indent.repeat(self.written.len()).as_bytes())?;
        }
        writer.write_all(bracket)
    }
}

impl serde_json::ser::Formatter for PythonFormatter<'_> {
    fn begin_array<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.open(writer, b"[")
    }
    fn end_array<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.close(writer, b"]")
    }
    fn begin_array_value<W: ?Sized + std::io::Write>(&mut self, writer: &mut W, first: bool) -> std::io::Result<()> {
        self.item(writer, first)
    }
    fn begin_object<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.open(writer, b"{")
    }
    fn end_object<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.close(writer, b"}")
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(&mut self, writer: &mut W, first: bool) -> std::io::Result<()> {
        self.item(writer, first)
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn qwen35() -> String {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/chat-templates/qwen3.5.jinja");
        std::fs::read_to_string(path).expect("the Qwen3.5 template fixture")
    }

    fn messages() -> Vec<Value> {
        vec![
            json!({ "role": "system", "content": "You are terse." }),
            json!({ "role": "user", "content": "Hi" }),
            json!({ "role": "assistant", "content": "<think>\nhmm\n</think>\n\nHello" }),
            json!({ "role": "user", "content": [{ "type": "text", "text": "Bye" }] }),
        ]
    }

    /// Llama 3.1's, gpt-oss's and Gemma 3's templates as their checkpoints
    /// ship them render one conversation as transformers'
    /// `apply_chat_template` does, given each tokenizer's named tokens
    /// (`tests/fixtures/chat-templates/rendered.json`), byte for byte but
    /// for gpt-oss's date of today.
    #[test]
    fn each_family_s_template_renders_as_transformers_does() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/chat-templates");
        let golden: Value =
            serde_json::from_str(&std::fs::read_to_string(format!("{dir}/rendered.json")).unwrap()).unwrap();
        let messages = golden["conversation"].as_array().unwrap();
        let undated = |text: &str| match text.split_once("Current date: ") {
            Some((before, after)) => format!("{before}Current date: DATE{}", &after[10..]),
            None => text.to_string(),
        };
        for name in ["llama3.1", "gpt-oss", "gemma3"] {
            let template = std::fs::read_to_string(format!("{dir}/{name}.jinja")).unwrap();
            let named_tokens = golden["named_tokens"][name].as_object().unwrap();
            let ours = render_chat(&template, messages, named_tokens).unwrap();
            let theirs = golden["rendered"][name].as_str().unwrap();
            assert_eq!(undated(&ours), undated(theirs), "{name}");
        }
    }

    /// A checkpoint's `tokenizer_config.json` names its special tokens (as
    /// text, or as an added token's description): its template reads them,
    /// and a prompt given as text gets what the tokenizer adds to a
    /// sequence, where a rendered chat does not get it twice.
    #[test]
    fn the_template_reads_the_named_tokens_and_prompts_get_the_tokenizer_s_additions() {
        let dir = std::env::temp_dir().join(format!("linnet-text-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let tokenizer = json!({
            "version": "1.0", "truncation": null, "padding": null, "normalizer": null, "decoder": null,
            "added_tokens": [{ "id": 0, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false,
                               "normalized": false, "special": true }],
            "pre_tokenizer": { "type": "WhitespaceSplit" },
            "post_processor": { "type": "TemplateProcessing",
                "single": [{ "SpecialToken": { "id": "<s>", "type_id": 0 } }, { "Sequence": { "id": "A", "type_id": 0 } }],
                "pair": [{ "Sequence": { "id": "A", "type_id": 0 } }, { "Sequence": { "id": "B", "type_id": 1 } }],
                "special_tokens": { "<s>": { "id": "<s>", "ids": [0], "tokens": ["<s>"] } } },
            "model": { "type": "WordLevel", "vocab": { "<s>": 0, "hi": 1, "there": 2, "<unk>": 3 }, "unk_token": "<unk>" },
        });
        std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
        let config = json!({ "bos_token": { "content": "<s>", "special": true }, "eos_token": "there",
                             "chat_template": "{{ bos_token }} {{ messages[0]['content'] }} {{ eos_token }}" });
        std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
        let text = TextModel::load(&dir).unwrap().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let chat = text.chat(&[json!({ "role": "user", "content": "hi" })], &Map::new()).unwrap();
        assert_eq!(chat, "<s> hi there");
        assert_eq!(text.encode(&chat).unwrap(), [0, 1, 2]);
        assert_eq!(text.encode_prompt("hi there").unwrap(), [0, 1, 2]);
        assert_eq!(text.encode("hi there").unwrap(), [1, 2]);
        // The caller's variables win over the tokenizer's.
        let options = Map::from_iter([("eos_token".to_string(), json!("hi"))]);
        assert_eq!(text.chat(&[json!({ "role": "user", "content": "hi" })], &options).unwrap(), "<s> hi hi");
    }

    /// The real template calls Python's string methods (`startswith`,
    /// `split`, `rstrip`, `lstrip`): it renders, the earlier turn's
    /// thinking dropped, thinking opened for the answer unless the caller
    /// turns it off.
    #[test]
    fn the_qwen35_template_renders_as_python_jinja_does() {
        let turns = "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
                     <|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n";
        let thinking = render_chat(&qwen35(), &messages(), &Map::new()).unwrap();
        assert_eq!(thinking, format!("{turns}<think>\n"));
        let options = json!({ "enable_thinking": false }).as_object().unwrap().clone();
        let direct = render_chat(&qwen35(), &messages(), &options).unwrap();
        assert_eq!(direct, format!("{turns}<think>\n\n</think>\n\n"));
    }

    /// Tools and a past call reach the template as the server passes them
    /// (arguments as a mapping, the tool's answer as its own turn), and it
    /// writes them in the model's own format.
    #[test]
    fn the_qwen35_template_writes_tools_and_calls() {
        let tools = json!([{ "type": "function", "function": { "name": "get_weather", "parameters": {} } }]);
        let messages = vec![
            json!({ "role": "user", "content": "Weather in Paris?" }),
            json!({ "role": "assistant", "content": "", "tool_calls": [{ "type": "function",
                "function": { "name": "get_weather", "arguments": { "city": "Paris" } } }] }),
            json!({ "role": "tool", "content": "sunny" }),
        ];
        let options = json!({ "tools": tools }).as_object().unwrap().clone();
        let prompt = render_chat(&qwen35(), &messages, &options).unwrap();
        assert!(
            prompt.starts_with("<|im_start|>system\n# Tools") && prompt.contains("\"name\": \"get_weather\""),
            "{prompt}"
        );
        assert!(
            prompt.contains(
                "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
            ),
            "{prompt}"
        );
        assert!(prompt.contains("<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>"), "{prompt}");
    }

    /// `tojson` writes JSON as Python's `json.dumps` does, keys in the
    /// order the client sent them.
    #[test]
    fn tojson_writes_as_python_does() {
        let render = |template: &str| render_chat(template, &[], &Map::new()).unwrap();
        let value: Value =
            serde_json::from_str(r#"{"type": "function", "function": {"name": "f", "list": [1, 2.5, "é"]}}"#).unwrap();
        let options = json!({ "tool": value }).as_object().unwrap().clone();
        let rendered = render_chat("{{ tool | tojson }}", &[], &options).unwrap();
        assert_eq!(rendered, r#"{"type": "function", "function": {"name": "f", "list": [1, 2.5, "é"]}}"#);
        let sorted = render_chat("{{ tool | tojson(sort_keys=true) }}", &[], &options).unwrap();
        assert_eq!(sorted, r#"{"function": {"list": [1, 2.5, "é"], "name": "f"}, "type": "function"}"#);
        let indented = render_chat("{{ tool.function | tojson(indent=2) }}", &[], &options).unwrap();
        assert_eq!(indented, "{\n  \"name\": \"f\",\n  \"list\": [\n    1,\n    2.5,\n    \"é\"\n  ]\n}");
        assert_eq!(render("{{ [] | tojson }}{{ {} | tojson(indent=2) }}"), "[]{}");
    }

    /// What the template refuses (`raise_exception`) is an error that says
    /// so, not a panic or an empty prompt.
    #[test]
    fn a_template_that_raises_is_an_error_with_its_words() {
        let error = render_chat(&qwen35(), &[], &Map::new()).unwrap_err().to_string();
        assert!(error.contains("No messages provided"), "{error}");
        let error =
            render_chat(&qwen35(), &[json!({ "role": "robot", "content": "x" })], &Map::new()).unwrap_err().to_string();
        assert!(error.contains("No user query found"), "{error}");
    }
}
