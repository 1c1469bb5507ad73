//! GBNF, llama.cpp's grammar format (`root ::= "yes" | "no"`), as
//! llguidance's Lark, so a client that sends llama-server a `grammar` gets
//! the same constraint here. Rules become Lark rules (`root` is `start`),
//! string literals JSON strings, character classes and `.` regular
//! expressions written with `\x{…}` escapes; grouping, alternation and
//! repetition (`*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}`) carry over. As in
//! llama.cpp, a rule's alternatives end at a new line unless inside
//! parentheses or after `|`; `#` starts a comment.

use std::collections::BTreeMap;
use std::fmt::Write;

/// Why a GBNF grammar cannot be read, with the byte offset it was found at.
#[derive(Debug, PartialEq, thiserror::Error)]
#[error("GBNF at byte {at}: {why}")]
pub struct GbnfError {
    pub at: usize,
    pub why: String,
}

/// The grammar `gbnf` as Lark.
pub fn to_lark(gbnf: &str) -> Result<String, GbnfError> {
    let mut reader = Reader { text: gbnf, at: 0, used: BTreeMap::new() };
    let mut rules: Vec<(String, String)> = Vec::new();
    loop {
        reader.skip_space(true);
        if reader.at == gbnf.len() {
            break;
        }
        let start = reader.at;
        let name = reader.name()?;
        reader.skip_space(false);
        reader.expect("::=")?;
        reader.skip_space(true);
        let body = reader.alternatives(false)?;
        if rules.iter().any(|(defined, _)| *defined == name) {
            return Err(GbnfError { at: start, why: format!("rule `{name}` is defined twice") });
        }
        rules.push((name, body));
    }
    if !rules.iter().any(|(name, _)| name == "root") {
        return Err(GbnfError { at: 0, why: "there is no `root` rule".into() });
    }
    if let Some((name, &at)) = reader.used.iter().find(|(name, _)| !rules.iter().any(|(defined, _)| defined == *name)) {
        return Err(GbnfError { at, why: format!("rule `{name}` is used but not defined") });
    }
    let mut lark = String::new();
    for (name, body) in &rules {
        let _ = writeln!(lark, "{}: {body}", lark_name(name));
    }
    Ok(lark)
}

/// A GBNF rule's name as a Lark rule's: `root` is `start`, the others
/// lower case under a prefix of their own, spelled so that no two names
/// meet (a capital is `_` and its small letter, `-` is `__`, `_` is `_0`:
/// `Ab`, `ab`, `a-b` and `a_b` stay apart).
fn lark_name(name: &str) -> String {
    if name == "root" {
        return "start".into();
    }
    let mut out = String::from("r_");
    for c in name.chars() {
        match c {
            'a'..='z' | '0'..='9' => out.push(c),
            'A'..='Z' => {
                out.push('_');
                out.push(c.to_ascii_lowercase());
            }
            '-' => out.push_str("__"),
            _ => out.push_str("_0"),
        }
    }
    out
}

struct Reader<'t> {
    text: &'t str,
    at: usize,
    /// Each rule used, where it was first.
    used: BTreeMap<String, usize>,
}

impl Reader<'_> {
    fn peek(&self) -> Option<char> {
        self.text[self.at..].chars().next()
    }

    fn fail<T>(&self, why: impl Into<String>) -> Result<T, GbnfError> {
        Err(GbnfError { at: self.at, why: why.into() })
    }

    /// Blanks and comments; new lines too where `lines`.
    fn skip_space(&mut self, lines: bool) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' => self.at += 1,
                '\r' | '\n' if lines => self.at += 1,
                '#' => {
                    let end = self.text[self.at..].find('\n').map_or(self.text.len(), |n| self.at + n);
                    self.at = end;
                }
                _ => break,
            }
        }
    }

    fn expect(&mut self, word: &str) -> Result<(), GbnfError> {
        if self.text[self.at..].starts_with(word) {
            self.at += word.len();
            Ok(())
        } else {
            self.fail(format!("expected `{word}`"))
        }
    }

    fn name(&mut self) -> Result<String, GbnfError> {
        let length = self.text[self.at..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
            .unwrap_or(self.text.len() - self.at);
        if length == 0 {
            return self.fail("expected a rule's name");
        }
        let name = self.text[self.at..self.at + length].to_string();
        self.at += length;
        Ok(name)
    }

    /// Sequences separated by `|`.
    fn alternatives(&mut self, nested: bool) -> Result<String, GbnfError> {
        let mut out = self.sequence(nested)?;
        while self.peek() == Some('|') {
            self.at += 1;
            self.skip_space(true);
            out.push_str(" | ");
            out.push_str(&self.sequence(nested)?);
        }
        Ok(out)
    }

    /// Items with their repetitions, to a `|`, a `)`, or (outside
    /// parentheses) the end of the line.
    fn sequence(&mut self, nested: bool) -> Result<String, GbnfError> {
        let mut items: Vec<String> = Vec::new();
        loop {
            self.skip_space(nested);
            let item = match self.peek() {
                Some('"') => self.literal()?,
                Some('[') => self.class()?,
                Some('.') => {
                    self.at += 1;
                    "/(?s:.)/".to_string()
                }
                Some('(') => {
                    self.at += 1;
                    self.skip_space(true);
                    let inner = self.alternatives(true)?;
                    self.skip_space(true);
                    self.expect(")")?;
                    format!("({inner})")
                }
                Some(c) if c.is_ascii_alphanumeric() || c == '-' || c == '_' => {
                    let at = self.at;
                    let name = self.name()?;
                    self.used.entry(name.clone()).or_insert(at);
                    lark_name(&name)
                }
                _ => break,
            };
            let repeat = self.repetition()?;
            items.push(item + &repeat);
        }
        Ok(if items.is_empty() { "\"\"".into() } else { items.join(" ") })
    }

    /// `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}` after an item, if any.
    fn repetition(&mut self) -> Result<String, GbnfError> {
        match self.peek() {
            Some(c @ ('*' | '+' | '?')) => {
                self.at += 1;
                Ok(c.to_string())
            }
            Some('{') => {
                let end = match self.text[self.at..].find('}') {
                    Some(end) => self.at + end,
                    None => return self.fail("a `{` without its `}`"),
                };
                let inner: String = self.text[self.at + 1..end].chars().filter(|c| !c.is_whitespace()).collect();
                let (low, high) = inner.split_once(',').unwrap_or((&inner, &inner));
                let number = |text: &str| text.is_empty() || text.chars().all(|c| c.is_ascii_digit());
                if low.is_empty() || !number(low) || !number(high) {
                    return self.fail(format!("`{{{inner}}}` is not a repetition"));
                }
                self.at = end + 1;
                Ok(format!("{{{inner}}}"))
            }
            _ => Ok(String::new()),
        }
    }

    /// One character of a literal or class, its escapes read.
    fn character(&mut self) -> Result<char, GbnfError> {
        let Some(c) = self.peek() else { return self.fail("the grammar ends inside a literal") };
        self.at += c.len_utf8();
        if c != '\\' {
            return Ok(c);
        }
        let Some(escaped) = self.peek() else { return self.fail("the grammar ends after `\\`") };
        self.at += escaped.len_utf8();
        let digits = match escaped {
            'x' => 2,
            'u' => 4,
            'U' => 8,
            'n' => return Ok('\n'),
            'r' => return Ok('\r'),
            't' => return Ok('\t'),
            other => return Ok(other),
        };
        let hex = self.text.get(self.at..self.at + digits).unwrap_or_default();
        match u32::from_str_radix(hex, 16).ok().and_then(char::from_u32) {
            Some(c) if hex.len() == digits => {
                self.at += digits;
                Ok(c)
            }
            _ => self.fail(format!("`\\{escaped}` needs {digits} hexadecimal digits of a character")),
        }
    }

    /// `"…"` as a JSON string.
    fn literal(&mut self) -> Result<String, GbnfError> {
        self.at += 1;
        let mut text = String::new();
        loop {
            match self.peek() {
                Some('"') => {
                    self.at += 1;
                    return Ok(serde_json::to_string(&text).expect("a string is JSON"));
                }
                _ => text.push(self.character()?),
            }
        }
    }

    /// `[…]` (`[^…]` negated) as a regular expression's class.
    fn class(&mut self) -> Result<String, GbnfError> {
        self.at += 1;
        let mut out = String::from("/[");
        if self.peek() == Some('^') {
            self.at += 1;
            out.push('^');
        }
        loop {
            if self.peek() == Some(']') {
                self.at += 1;
                out.push_str("]/");
                return Ok(out);
            }
            let low = self.character()?;
            let _ = write!(out, "\\x{{{:x}}}", low as u32);
            if self.peek() == Some('-') && !self.text[self.at + 1..].starts_with(']') {
                self.at += 1;
                let high = self.character()?;
                if high < low {
                    return self.fail(format!("the range {low:?}-{high:?} runs backwards"));
                }
                let _ = write!(out, "-\\x{{{:x}}}", high as u32);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_literals_classes_and_repetitions() {
        let gbnf = "# an answer\nroot ::= answer (\" \" answer){0,2}\nanswer ::= \"yes\" | \"no\" |\n  [0-9]+ \"\\n\"\nAb-c ::= [^\\]a] .*\n";
        assert_eq!(
            to_lark(gbnf).unwrap(),
            "start: r_answer (\" \" r_answer){0,2}\n\
             r_answer: \"yes\" | \"no\" | /[\\x{30}-\\x{39}]/+ \"\\n\"\n\
             r__ab__c: /[^\\x{5d}\\x{61}]/ /(?s:.)/*\n"
        );
    }

    #[test]
    fn names_that_differ_stay_apart() {
        let names = ["Ab", "ab", "a-b", "a_b", "a__b", "a-_b"];
        let lark: std::collections::BTreeSet<String> = names.iter().map(|name| lark_name(name)).collect();
        assert_eq!(lark.len(), names.len(), "{lark:?}");
    }

    #[test]
    fn mistakes_are_named_where_they_are() {
        assert_eq!(to_lark("root ::= item").unwrap_err().why, "rule `item` is used but not defined");
        assert_eq!(to_lark("item ::= \"x\"").unwrap_err().why, "there is no `root` rule");
        let unclosed = to_lark("root ::= (\"x\"").unwrap_err();
        assert_eq!((unclosed.at, unclosed.why.as_str()), (13, "expected `)`"));
        assert!(to_lark("root ::= \"\\u12\"").unwrap_err().why.contains("4 hexadecimal digits"));
        assert!(to_lark("root = \"x\"").is_err());
    }
}
