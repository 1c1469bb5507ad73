//! Generated text as it comes: the ids so far decoded together (a token
//! may finish a character or a word that another began), a character
//! whose bytes have not all come yet held back, and a request's stop
//! strings: text that could be the start of one is held back, and
//! generation ends where one appears, without it (as the OpenAI API does).
//! What is handed out, piece by piece, adds up to the decoding of the ids
//! at every cut: no byte is given twice or lost. Each token decodes only
//! the ids since the text was last whole (and one before, for what a
//! decoder puts between tokens), not every id again.

use crate::text::TextModel;

pub struct Detokenizer {
    stops: Vec<String>,
    /// Bytes at the end held back: one less than the longest stop string.
    hold: usize,
    /// Special tokens written as their text (tags a parser reads, such as
    /// `</think>`); every other special token is left out.
    shown_specials: Vec<u32>,
    ids: Vec<i64>,
    shown: usize,
    /// The text of the ids before `settled`, which no later id changes:
    /// it ended whole (no character waiting for its bytes).
    settled: usize,
    settled_text: String,
}

impl Detokenizer {
    pub fn new(stops: Vec<String>, shown_specials: Vec<u32>) -> Detokenizer {
        let hold = stops.iter().map(|stop| stop.len().saturating_sub(1)).max().unwrap_or(0);
        Detokenizer { stops, hold, shown_specials, ids: Vec::new(), shown: 0, settled: 0, settled_text: String::new() }
    }

    /// The decoding of every id so far: the settled text, then the ids
    /// after it decoded from the one before it (whose own text is then
    /// taken off); the whole decoding where that does not line up.
    fn decoded(&mut self, text: &TextModel) -> String {
        let mut all = match self.settled.checked_sub(1) {
            Some(before) => {
                let head = text.decode_showing(&self.ids[before..self.settled], &self.shown_specials);
                let window = text.decode_showing(&self.ids[before..], &self.shown_specials);
                match window.strip_prefix(head.as_str()) {
                    Some(rest) => format!("{}{rest}", self.settled_text),
                    None => text.decode_showing(&self.ids, &self.shown_specials),
                }
            }
            None => text.decode_showing(&self.ids, &self.shown_specials),
        };
        if !all.ends_with(char::REPLACEMENT_CHARACTER) {
            self.settled = self.ids.len();
            self.settled_text = std::mem::take(&mut all);
            return self.settled_text.clone();
        }
        all
    }

    /// Adds a generated token: the text it makes safe to show, and whether
    /// a stop string ends the generation there. Without a tokenizer, the
    /// token's id and a space.
    pub fn push(&mut self, text: Option<&TextModel>, token: i64) -> (String, bool) {
        self.ids.push(token);
        let Some(text) = text else { return (format!("{token} "), false) };
        let all = self.decoded(text);
        let unshown = all.get(self.shown..).unwrap_or_default();
        if let Some(at) = self.stops.iter().filter_map(|stop| unshown.find(stop.as_str())).min() {
            let piece = unshown[..at].to_string();
            self.shown += at;
            return (piece, true);
        }
        // A character cut between tokens decodes as U+FFFD until its last
        // byte comes: it is not shown before.
        let complete = all.trim_end_matches(char::REPLACEMENT_CHARACTER).len();
        let mut safe = all.len().saturating_sub(self.hold).min(complete).max(self.shown);
        while !all.is_char_boundary(safe) {
            safe -= 1;
        }
        let piece = all.get(self.shown..safe).unwrap_or_default().to_string();
        self.shown = safe.max(self.shown);
        (piece, false)
    }

    /// What was held back, once generation ended without a stop string
    /// (a character never finished is U+FFFD, as in the whole decoding).
    pub fn finish(&mut self, text: Option<&TextModel>) -> String {
        let Some(text) = text else { return String::new() };
        let all = self.decoded(text);
        let rest = all.get(self.shown..).unwrap_or_default().to_string();
        self.shown = all.len();
        rest
    }

    /// The generated ids so far.
    pub fn ids(&self) -> &[i64] {
        &self.ids
    }
}

#[cfg(test)]
mod tests {
    use super::Detokenizer;
    use crate::text::TextModel;

    #[test]
    fn without_a_tokenizer_ids_are_shown() {
        let mut detokenizer = Detokenizer::new(Vec::new(), Vec::new());
        assert_eq!(detokenizer.push(None, 7), ("7 ".to_string(), false));
        assert_eq!(detokenizer.finish(None), "");
        assert_eq!(detokenizer.ids(), [7]);
    }

    /// The byte-level BPE tokenizer of the trained test model (GPT-2's
    /// byte alphabet, Qwen's pre-tokenizer and special tokens).
    fn byte_level() -> TextModel {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/tiny-qwen3.5-moe-text/weights-f32");
        TextModel::load(std::path::Path::new(dir)).unwrap().expect("the fixture's tokenizer")
    }

    /// Streamed one token at a time, the pieces of `ids` add up to their
    /// whole decoding at every cut, and no piece ever holds U+FFFD.
    fn assert_pieces_add_up(text: &TextModel, ids: &[i64]) {
        for cut in 1..=ids.len() {
            let mut detokenizer = Detokenizer::new(Vec::new(), Vec::new());
            let mut streamed = String::new();
            for &id in &ids[..cut] {
                let (piece, stopped) = detokenizer.push(Some(text), id);
                assert!(!stopped);
                assert!(!piece.contains(char::REPLACEMENT_CHARACTER), "{piece:?} at cut {cut}");
                streamed.push_str(&piece);
            }
            streamed.push_str(&detokenizer.finish(Some(text)));
            assert_eq!(streamed, text.decode(&ids[..cut]), "cut after {cut} tokens");
        }
    }

    /// Text with characters of two, three and four bytes, cut into single
    /// bytes where the vocabulary has no token for them.
    #[test]
    fn pieces_add_up_to_the_decoding_at_every_cut() {
        let text = byte_level();
        let sentence = "Kraków, Straße — Москва 北京 🐦🦜 «ok» ñ";
        let ids = text.encode(sentence).unwrap();
        assert_pieces_add_up(&text, &ids);
        assert_eq!(text.decode(&ids), sentence);
    }

    /// A decoder that puts text between tokens (a word-level vocabulary
    /// joins its words with spaces): the spaces come with the pieces.
    #[test]
    fn what_a_decoder_puts_between_tokens_is_streamed_too() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/oracle/tiny-qwen3.5-moe/weights-f32");
        let text = TextModel::load(std::path::Path::new(dir)).unwrap().expect("the oracle's tokenizer");
        let ids = text.encode("t5 t17 t42 t0 t511").unwrap();
        assert_pieces_add_up(&text, &ids);
        assert_eq!(text.decode(&ids), "t5 t17 t42 t0 t511");
    }

    /// A stop string is found across tokens and characters, and nothing
    /// after it is shown.
    #[test]
    fn a_stop_string_ends_the_text_before_it() {
        let text = byte_level();
        let ids = text.encode("Добрый день, Straße").unwrap();
        let mut detokenizer = Detokenizer::new(vec!["день".into()], Vec::new());
        let mut streamed = String::new();
        for &id in &ids {
            let (piece, stopped) = detokenizer.push(Some(&text), id);
            streamed.push_str(&piece);
            if stopped {
                break;
            }
        }
        assert_eq!(streamed, "Добрый ");
    }
}
