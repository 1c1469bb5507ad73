//! Constrained decoding: output that must match a JSON schema, a regular
//! expression or a Lark grammar, through llguidance (the engine vLLM,
//! SGLang and llama.cpp use). A [`Grammars`] is made once per served model
//! from its tokenizer (each token's bytes, special tokens marked so no text
//! matches them); a [`Constraint`] per request says at each step which
//! tokens may come next, and follows the tokens chosen.
//!
//! Only a byte-level tokenizer (BPE over bytes, as Qwen's) spells its text
//! as the concatenation of its tokens' bytes, which the engine assumes;
//! another is refused by name.

use crate::text::TextModel;
use crate::Error;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;
use std::sync::Arc;
use tokenizers::Tokenizer;

/// What the output must match.
#[derive(Clone, Debug, PartialEq)]
pub enum Spec {
    /// A JSON value valid under the schema (`{"type": "object"}` for any
    /// object).
    JsonSchema(Value),
    Regex(String),
    /// A grammar in llguidance's Lark dialect.
    Lark(String),
}

/// `schema` asking for compact JSON (no whitespace between tokens) unless
/// it says otherwise (llguidance's `x-guidance` options): a model cannot
/// then spend its answer on whitespace.
fn compact(schema: &Value) -> Value {
    let mut schema = schema.clone();
    if let Value::Object(object) = &mut schema {
        object.entry("x-guidance").or_insert_with(|| serde_json::json!({ "whitespace_flexible": false }));
    }
    schema
}

/// The model's vocabulary as the engine sees it, tokenizing with the
/// model's own tokenizer.
struct Vocabulary {
    trie: TokTrie,
    /// The model's tokenizer reading special tokens' spellings as text:
    /// text the grammar forces is text, and a special token comes only
    /// where the grammar names it (`<|im_end|>` unquoted in Lark).
    text_only: Tokenizer,
}

impl TokenizerEnv for Vocabulary {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// The tokens of exactly `bytes`: their UTF-8 runs through the
    /// tokenizer, the bytes of a character cut short as byte tokens.
    fn tokenize_bytes(&self, bytes: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(bytes, |text| {
            self.text_only.encode(text, false).map(|e| e.get_ids().to_vec()).unwrap_or_default()
        })
    }
}

/// The parser factory of one model.
pub struct Grammars {
    factory: ParserFactory,
    tokenizer: Tokenizer,
}

impl Grammars {
    /// For a model of `vocab` tokens whose text side is `text`, ending
    /// with `end` (its end-of-sequence id), or why it cannot be.
    pub fn new(text: &TextModel, vocab: usize, end: u32) -> Result<Grammars, Error> {
        if !text.is_byte_level() {
            return Err(Error::Grammar(
                "constrained output needs a byte-level BPE tokenizer, and this model's is not one".into(),
            ));
        }
        // Each token's own bytes, a special token's marked so that no text
        // matches it; ids past the tokenizer's (a padded embedding) are
        // empty and never come.
        let words: Vec<Vec<u8>> = (0..vocab as u32)
            .map(|id| {
                let bytes = text.token_bytes(i64::from(id));
                match text.is_special(id) {
                    true => std::iter::once(TokTrie::SPECIAL_TOKEN_MARKER).chain(bytes).collect(),
                    false => bytes,
                }
            })
            .collect();
        let info = TokRxInfo::new(vocab as u32, end);
        let trie = TokTrie::from(&info, &words);
        let mut text_only = text.tokenizer().clone();
        text_only.set_encode_special_tokens(true);
        let env: TokEnv = Arc::new(Vocabulary { trie, text_only });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| Error::Grammar(e.to_string()))?;
        factory.quiet();
        Ok(Grammars { factory, tokenizer: text.tokenizer().clone() })
    }

    /// A constraint for one answer, or why `spec` does not compile;
    /// `after`: text the answer starts with before what `spec` constrains
    /// (the end of a thinking block a chat template opened).
    pub fn constraint(&self, spec: &Spec, after: Option<&str>) -> Result<Constraint, Error> {
        let grammar = match spec {
            Spec::JsonSchema(schema) => TopLevelGrammar::from_json_schema(compact(schema)),
            Spec::Regex(regex) => TopLevelGrammar::from_regex(regex),
            Spec::Lark(lark) => TopLevelGrammar::from_lark(lark.clone()),
        };
        let parser = self.factory.create_parser(grammar).map_err(|e| Error::Grammar(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(error) = matcher.get_error() {
            return Err(Error::Grammar(error));
        }
        let forced = match after {
            Some(text) => {
                self.tokenizer.encode(text, false).map_err(|e| Error::Text(e.to_string()))?.get_ids().to_vec()
            }
            None => Vec::new(),
        };
        Ok(Constraint { forced: forced.into(), matcher })
    }
}

/// One answer's constraint, step by step.
pub struct Constraint {
    /// Tokens the answer starts with, before the grammar applies.
    forced: std::collections::VecDeque<TokenId>,
    matcher: Matcher,
}

impl Constraint {
    /// An independent copy in the same state (another choice of the same
    /// request).
    pub fn copy(&self) -> Constraint {
        Constraint { forced: self.forced.clone(), matcher: self.matcher.deep_clone() }
    }

    /// `logits` with every token that may not come next pushed to minus
    /// infinity.
    pub fn mask(&mut self, logits: &[f32]) -> Result<Vec<f32>, Error> {
        if let Some(&next) = self.forced.front() {
            let only = |id: usize| id == next as usize;
            return Ok(logits
                .iter()
                .enumerate()
                .map(|(id, &l)| if only(id) { l } else { f32::NEG_INFINITY })
                .collect());
        }
        let allowed = self.matcher.compute_mask_or_eos().map_err(|e| Error::Grammar(e.to_string()))?;
        Ok(logits
            .iter()
            .enumerate()
            .map(|(id, &logit)| if allowed.is_allowed(id as TokenId) { logit } else { f32::NEG_INFINITY })
            .collect())
    }

    /// Follows the token chosen; says whether the output is complete (the
    /// grammar admits nothing more).
    pub fn advance(&mut self, token: i64) -> Result<bool, Error> {
        if let Some(next) = self.forced.pop_front() {
            return match token == i64::from(next) {
                true => Ok(false),
                false => Err(Error::Grammar(format!("token {token} came where the constraint put {next}"))),
            };
        }
        self.matcher.consume_token(token as TokenId).map_err(|e| Error::Grammar(e.to_string()))?;
        Ok(self.matcher.is_stopped())
    }
}
