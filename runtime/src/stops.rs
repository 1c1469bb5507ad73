//! Generated text as it comes: the ids so far decoded together (a token
//! may finish a character or a word that another began), and a request's
//! stop strings: text that could be the start of one is held back, and
//! generation ends where one appears, without it (as the OpenAI API does).

use crate::text::TextModel;

pub struct Detokenizer {
    stops: Vec<String>,
    /// Bytes at the end held back: one less than the longest stop string.
    hold: usize,
    ids: Vec<i64>,
    shown: usize,
}

impl Detokenizer {
    pub fn new(stops: Vec<String>) -> Detokenizer {
        let hold = stops.iter().map(|stop| stop.len().saturating_sub(1)).max().unwrap_or(0);
        Detokenizer { stops, hold, ids: Vec::new(), shown: 0 }
    }

    /// Adds a generated token: the text it makes safe to show, and whether
    /// a stop string ends the generation there. Without a tokenizer, the
    /// token's id and a space.
    pub fn push(&mut self, text: Option<&TextModel>, token: i64) -> (String, bool) {
        self.ids.push(token);
        let Some(text) = text else { return (format!("{token} "), false) };
        let all = text.decode(&self.ids);
        let unshown = all.get(self.shown..).unwrap_or_default();
        if let Some(at) = self.stops.iter().filter_map(|stop| unshown.find(stop.as_str())).min() {
            let piece = unshown[..at].to_string();
            self.shown += at;
            return (piece, true);
        }
        let mut safe = all.len().saturating_sub(self.hold).max(self.shown);
        while !all.is_char_boundary(safe) {
            safe -= 1;
        }
        let piece = all.get(self.shown..safe).unwrap_or_default().to_string();
        self.shown = safe.max(self.shown);
        (piece, false)
    }

    /// What was held back, once generation ended without a stop string.
    pub fn finish(&mut self, text: Option<&TextModel>) -> String {
        let Some(text) = text else { return String::new() };
        let all = text.decode(&self.ids);
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

    #[test]
    fn without_a_tokenizer_ids_are_shown() {
        let mut detokenizer = Detokenizer::new(Vec::new());
        assert_eq!(detokenizer.push(None, 7), ("7 ".to_string(), false));
        assert_eq!(detokenizer.finish(None), "");
        assert_eq!(detokenizer.ids(), [7]);
    }
}
