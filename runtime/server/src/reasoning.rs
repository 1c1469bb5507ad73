//! Thinking models (Qwen3.5 and 3.6) reason inside `<think>…</think>`
//! before they answer; chat clients expect the reasoning apart, as
//! `reasoning_content`, and the answer as `content`. [`Split`] divides the
//! text as it streams, holding back what could still be the start of a tag,
//! so that a tag cut between two tokens is never shown as text.

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";
/// The tags, which a vocabulary may have as special tokens.
pub const TAGS: &[&str] = &[OPEN, CLOSE];

/// Whether a chat prompt leaves the model inside a `<think>` block (its
/// template opened one for the answer, as Qwen3.5's does unless
/// `enable_thinking` is false).
pub fn prompt_opens_thinking(prompt: &str) -> bool {
    prompt.trim_end().ends_with(OPEN)
}

/// Text so far, divided into reasoning and answer.
#[derive(Debug, Default, PartialEq)]
pub struct Parts {
    pub reasoning: String,
    pub answer: String,
}

pub struct Split {
    thinking: bool,
    /// Text not yet given out: a possible tag's start, trailing white
    /// space of the reasoning, or the answer's leading new lines.
    held: String,
    /// Whether any of the answer has been given out (the model may open a
    /// `<think>` block itself only before it answers).
    answered: bool,
    /// Whether any reasoning has been given out (its leading new lines are
    /// dropped).
    reasoned: bool,
    /// Whether a `</think>` closed a block: the new lines the template
    /// writes after it are not the answer's. Without one, the answer is the
    /// text as it is, to the byte.
    closed: bool,
}

/// The longest end of `text` that a `tag` could start with: what to hold
/// back while a tag may still be arriving.
pub(super) fn partial_tag(text: &str, tag: &str) -> usize {
    (1..tag.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && tag.starts_with(&text[text.len() - n..]))
        .unwrap_or(0)
}

impl Split {
    /// `thinking`: whether the prompt left the model inside a `<think>`.
    pub fn new(thinking: bool) -> Split {
        Split { thinking, held: String::new(), answered: false, reasoned: false, closed: false }
    }

    /// Whether the model is inside a `<think>` block now.
    pub fn is_thinking(&self) -> bool {
        self.thinking
    }

    /// The parts of the text so far that are final, given the next piece.
    pub fn push(&mut self, piece: &str) -> Parts {
        self.held.push_str(piece);
        let mut parts = Parts::default();
        loop {
            if self.thinking {
                if let Some(at) = self.held.find(CLOSE) {
                    let reasoning = self.held[..at].trim_end().to_string();
                    self.give_reasoning(&reasoning, &mut parts);
                    self.held.drain(..at + CLOSE.len());
                    self.thinking = false;
                    self.closed = true;
                    continue;
                }
                // Hold back a possible `</think>` and trailing white space.
                let keep = partial_tag(&self.held, CLOSE);
                let ready = self.held[..self.held.len() - keep].trim_end().len();
                let reasoning: String = self.held.drain(..ready).collect();
                self.give_reasoning(&reasoning, &mut parts);
                return parts;
            }
            if !self.answered {
                let start = self.held.trim_start();
                if start.starts_with(OPEN) {
                    let at = self.held.len() - start.len() + OPEN.len();
                    self.held.drain(..at);
                    self.thinking = true;
                    continue;
                }
                if OPEN.starts_with(start) {
                    // Blank so far, or a `<think>` still arriving.
                    return parts;
                }
                let answer = self.answer_start(&self.held).to_string();
                self.held.clear();
                self.answered = true;
                parts.answer.push_str(&answer);
                return parts;
            }
            parts.answer.push_str(&std::mem::take(&mut self.held));
            return parts;
        }
    }

    /// What is held back, at the end of the text.
    pub fn finish(&mut self) -> Parts {
        let held = std::mem::take(&mut self.held);
        let mut parts = Parts::default();
        if self.thinking {
            self.give_reasoning(held.trim_end(), &mut parts);
        } else if self.answered {
            parts.answer = held;
        } else {
            parts.answer = self.answer_start(&held).to_string();
        }
        parts
    }

    /// The answer in `text`, its first text: after a closed block, without
    /// the blank space the template puts after `</think>`.
    fn answer_start<'a>(&self, text: &'a str) -> &'a str {
        if self.closed {
            text.trim_start_matches(['\n', '\r', ' '])
        } else {
            text
        }
    }

    fn give_reasoning(&mut self, text: &str, parts: &mut Parts) {
        let text = if self.reasoned { text } else { text.trim_start_matches(['\n', '\r', ' ']) };
        if !text.is_empty() {
            self.reasoned = true;
            parts.reasoning.push_str(text);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole text split, given a piece at a time.
    fn split(thinking: bool, pieces: &[&str]) -> Parts {
        let mut split = Split::new(thinking);
        let mut all = Parts::default();
        let mut parts: Vec<Parts> = pieces.iter().map(|piece| split.push(piece)).collect();
        parts.push(split.finish());
        for piece in parts {
            all.reasoning.push_str(&piece.reasoning);
            all.answer.push_str(&piece.answer);
        }
        all
    }

    #[test]
    fn reasoning_and_answer_part_at_the_closing_tag_however_it_is_cut() {
        let text = "\nLet me see.\nTwo and two.\n</think>\n\nFour.";
        let expected = Parts { reasoning: "Let me see.\nTwo and two.".into(), answer: "Four.".into() };
        assert_eq!(split(true, &[text]), expected);
        for cut in 1..text.len() {
            assert_eq!(split(true, &[&text[..cut], &text[cut..]]), expected, "cut at {cut}");
        }
        let by_char: Vec<String> = text.chars().map(String::from).collect();
        assert_eq!(split(true, &by_char.iter().map(String::as_str).collect::<Vec<_>>()), expected);
    }

    #[test]
    fn a_block_the_model_opens_itself_and_none_at_all() {
        let expected = Parts { reasoning: "hm".into(), answer: "Yes.".into() };
        assert_eq!(split(false, &["<thi", "nk>\nhm\n</th", "ink>\n\nYes."]), expected);
        assert_eq!(
            split(false, &["Yes, ", "<think> is a tag."]),
            Parts { reasoning: "".into(), answer: "Yes, <think> is a tag.".into() }
        );
        assert_eq!(split(false, &["<", "b>bold</b>"]), Parts { reasoning: "".into(), answer: "<b>bold</b>".into() });
        // Without a block, the answer is the text to the byte.
        assert_eq!(split(false, &["\n", "\nHi"]), Parts { reasoning: "".into(), answer: "\n\nHi".into() });
        // Cut off while thinking: all of it is reasoning.
        assert_eq!(split(true, &["still going\n"]), Parts { reasoning: "still going".into(), answer: "".into() });
    }

    #[test]
    fn what_opens_thinking() {
        assert!(prompt_opens_thinking("<|im_start|>assistant\n<think>\n"));
        assert!(!prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
        assert!(!prompt_opens_thinking("<|im_start|>assistant\n"));
    }
}
