//! Mutations: a corpus input changed one to eight times by byte flips,
//! deletions, duplications, splices from another input, runs of one
//! fragment (deep nesting, long chains) and tokens from a dictionary of
//! what the readers treat specially.

use linnet_runtime::sampling::Rng;

/// Fragments the readers give meaning to: brackets, operators, keywords,
/// numbers at the edges of their types, JSON and TOML punctuation.
const DICTIONARY: &[&str] = &[
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    "<",
    ">",
    "-",
    "!",
    "+",
    "*",
    "/",
    "%",
    ".",
    ",",
    ":",
    "::",
    "=",
    "->",
    "&&",
    "||",
    "let ",
    "var ",
    "return ",
    "static for ",
    " in ",
    "if ",
    "else ",
    "where ",
    "fn ",
    "entry ",
    "block ",
    "use ",
    "pub ",
    "sum[i] ",
    "max[j] ",
    "*S",
    "Tensor[",
    "cast<f32>(",
    "0",
    "1",
    "-1",
    "1e309",
    "99999999999",
    "9223372036854775807",
    "18446744073709551616",
    "4294967296",
    "\"",
    "\\",
    "\n",
    "#",
    "//",
    "null",
    "true",
    "[[",
    "]]",
    "\u{feff}",
    "\u{0}",
];

fn below(rng: &mut Rng, bound: usize) -> usize {
    (rng.next_u64() % bound.max(1) as u64) as usize
}

/// A place in `bytes`, `0..=len`.
fn place(rng: &mut Rng, bytes: &[u8]) -> usize {
    below(rng, bytes.len() + 1)
}

/// A range of up to 64 bytes in `bytes`.
fn range(rng: &mut Rng, bytes: &[u8]) -> std::ops::Range<usize> {
    let start = place(rng, bytes);
    let end = (start + below(rng, 64) + 1).min(bytes.len());
    start..end.max(start)
}

fn mutate_once(bytes: &mut Vec<u8>, corpus: &[Vec<u8>], rng: &mut Rng) {
    match below(rng, 7) {
        0 if !bytes.is_empty() => {
            let at = below(rng, bytes.len());
            bytes[at] ^= 1 << below(rng, 8);
        }
        1 => {
            let gone = range(rng, bytes);
            bytes.drain(gone);
        }
        2 => {
            let copied = bytes[range(rng, bytes)].to_vec();
            let at = place(rng, bytes);
            bytes.splice(at..at, copied);
        }
        3 => {
            let other = &corpus[below(rng, corpus.len())];
            let piece = other[range(rng, other)].to_vec();
            let at = place(rng, bytes);
            bytes.splice(at..at, piece);
        }
        4 => {
            // One fragment many times: nesting, chains, long numbers.
            let fragment = DICTIONARY[below(rng, DICTIONARY.len())].as_bytes();
            let times = 1 << below(rng, 13);
            let at = place(rng, bytes);
            bytes.splice(at..at, fragment.repeat(times));
        }
        5 if !bytes.is_empty() => {
            let at = below(rng, bytes.len());
            bytes.truncate(at);
        }
        _ => {
            let fragment = DICTIONARY[below(rng, DICTIONARY.len())].as_bytes();
            let at = place(rng, bytes);
            bytes.splice(at..at, fragment.iter().copied());
        }
    }
}

/// One corpus input, mutated one to eight times.
pub fn mutated(corpus: &[Vec<u8>], rng: &mut Rng) -> Vec<u8> {
    let mut bytes = corpus[below(rng, corpus.len())].clone();
    for _ in 0..=below(rng, 8) {
        mutate_once(&mut bytes, corpus, rng);
    }
    bytes
}
