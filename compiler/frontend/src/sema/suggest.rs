//! "Did you mean" for unknown names: the closest candidate by edit
//! distance, if it is close enough to be a typo, offered as a fix.

use crate::diagnostic::{Applicability, Diagnostic};

pub fn closest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let limit = (name.chars().count() / 3).max(1);
    candidates
        .into_iter()
        .map(|candidate| (edit_distance(name, candidate), candidate))
        .filter(|(distance, _)| *distance <= limit)
        .min_by_key(|(distance, candidate)| (*distance, *candidate))
        .map(|(_, candidate)| candidate)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = if ca == *cb { diagonal } else { 1 + diagonal.min(above).min(row[j]) };
            diagonal = above;
        }
    }
    row[b.len()]
}

/// `diagnostic`, about the unknown `name` at its primary span, with a
/// `help:` that offers the closest of `candidates` in its place (a guess
/// to confirm); `quoted` where the span covers a quoted string (a model
/// card's value, a JSON key), whose quotes the fix keeps.
pub fn did_you_mean<'a>(
    diagnostic: Diagnostic,
    name: &str,
    candidates: impl IntoIterator<Item = &'a str>,
    quoted: bool,
) -> Diagnostic {
    let Some(candidate) = closest(name, candidates) else { return diagnostic };
    let span = diagnostic.primary.span;
    let replacement = if quoted { format!("\"{candidate}\"") } else { candidate.to_string() };
    diagnostic.with_suggestion(format!("did you mean `{candidate}`?"), span, replacement, Applicability::MaybeIncorrect)
}

#[cfg(test)]
mod tests {
    #[test]
    fn finds_typos() {
        assert_eq!(super::closest("lienar", ["linear", "full"]), Some("linear"));
        assert_eq!(super::closest("q", ["linear", "full"]), None);
    }
}
