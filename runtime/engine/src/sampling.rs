//! Choosing the next token from logits: temperature, top-k, top-p, min-p
//! and a repetition penalty, with a seeded generator so a run can be
//! repeated. Temperature 0 is greedy (the largest logit, ties to the lower
//! id), the same choice as `generate::argmax_rows`.

use crate::Error;

/// A small, fast, seeded generator (SplitMix64): reproducible across
/// platforms, which is all sampling needs.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    pub temperature: f64,
    /// 0 keeps every token.
    pub top_k: usize,
    /// 1 keeps every token.
    pub top_p: f64,
    /// 0 keeps every token.
    pub min_p: f64,
    /// 1 is none; above 1 makes tokens already seen less likely.
    pub repetition_penalty: f64,
    /// OpenAI's `frequency_penalty` (-2 to 2, 0 is none): subtracted from a
    /// token's logit once for every time it was generated.
    pub frequency_penalty: f64,
    /// OpenAI's `presence_penalty` (-2 to 2, 0 is none): subtracted from a
    /// token's logit once if it was generated at all.
    pub presence_penalty: f64,
    /// OpenAI's `logit_bias`: added to these tokens' logits first, greedy
    /// or not.
    pub logit_bias: Vec<(usize, f64)>,
}

impl Default for Sampling {
    fn default() -> Sampling {
        Sampling {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            logit_bias: Vec::new(),
        }
    }
}

impl Sampling {
    /// Why these settings cannot be used, if they cannot.
    pub fn validate(&self) -> Result<(), Error> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(Error::Input(format!("temperature must be 0 or more, not {}", self.temperature)));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(Error::Input(format!("top_p must be in (0, 1], not {}", self.top_p)));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(Error::Input(format!("min_p must be in [0, 1], not {}", self.min_p)));
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return Err(Error::Input(format!("repetition_penalty must be positive, not {}", self.repetition_penalty)));
        }
        for (name, value) in
            [("frequency_penalty", self.frequency_penalty), ("presence_penalty", self.presence_penalty)]
        {
            if !(-2.0..=2.0).contains(&value) {
                return Err(Error::Input(format!("{name} must be in [-2, 2], not {value}")));
            }
        }
        Ok(())
    }

    /// The next token after `history` (the prompt, then the tokens
    /// generated: its last `generated`), from one row of logits (check
    /// them first with [`not_a_number`]).
    pub fn choose(&self, logits: &[f32], history: &[i64], generated: usize, rng: &mut Rng) -> i64 {
        self.candidates(logits, history, generated).draw(rng)
    }

    /// The tokens [`Sampling::choose`] can fall on after `history`, with
    /// their weights: one token where the choice is greedy.
    pub fn candidates(&self, logits: &[f32], history: &[i64], generated: usize) -> Candidates {
        let mut scores: Vec<f64> = logits.iter().map(|&l| l as f64).collect();
        for &(token, bias) in &self.logit_bias {
            if let Some(score) = scores.get_mut(token) {
                *score += bias;
            }
        }
        if self.frequency_penalty != 0.0 || self.presence_penalty != 0.0 {
            let mut counts = std::collections::HashMap::<i64, u32>::new();
            for &token in &history[history.len() - generated.min(history.len())..] {
                *counts.entry(token).or_default() += 1;
            }
            for (token, count) in counts {
                if let Some(score) = scores.get_mut(token as usize) {
                    *score -= self.frequency_penalty * count as f64 + self.presence_penalty;
                }
            }
        }
        if self.repetition_penalty != 1.0 {
            for &token in history {
                if let Some(score) = scores.get_mut(token as usize) {
                    // As transformers does: shrink positive logits, grow negative ones.
                    *score =
                        if *score > 0.0 { *score / self.repetition_penalty } else { *score * self.repetition_penalty };
                }
            }
        }
        if self.temperature == 0.0 {
            let largest = scores
                .iter()
                .enumerate()
                .fold((0, f64::NEG_INFINITY), |best, (at, &s)| if s > best.1 { (at, s) } else { best })
                .0;
            return Candidates { tokens: vec![largest], weights: vec![1.0] };
        }
        let mut order: Vec<usize> = (0..scores.len()).collect();
        order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
        if self.top_k > 0 {
            order.truncate(self.top_k);
        }
        let top = scores[order[0]];
        let mut weights: Vec<f64> = order.iter().map(|&at| ((scores[at] - top) / self.temperature).exp()).collect();
        let total: f64 = weights.iter().sum();
        weights.iter_mut().for_each(|w| *w /= total);
        // min-p: drop tokens less likely than min_p times the likeliest.
        let floor = self.min_p * weights[0];
        let mut keep = weights.iter().take_while(|&&w| w >= floor).count().max(1);
        // top-p: the smallest prefix whose mass reaches top_p.
        let mut mass = 0.0;
        for (at, w) in weights.iter().enumerate().take(keep) {
            mass += w;
            if mass >= self.top_p {
                keep = at + 1;
                break;
            }
        }
        order.truncate(keep);
        weights.truncate(keep);
        Candidates { tokens: order, weights }
    }
}

/// The tokens a sampled choice can fall on, likeliest first, with their
/// weights (in proportion to their probabilities; never empty).
#[derive(Clone, Debug, PartialEq)]
pub struct Candidates {
    tokens: Vec<usize>,
    weights: Vec<f64>,
}

impl Candidates {
    /// One token drawn by weight; a single candidate takes no draw, so a
    /// greedy choice leaves the generator as it was.
    pub fn draw(&self, rng: &mut Rng) -> i64 {
        if let [only] = self.tokens[..] {
            return only as i64;
        }
        let mut target = rng.next_f64() * self.weights.iter().sum::<f64>();
        for (token, weight) in self.tokens.iter().zip(&self.weights) {
            if target < *weight {
                return *token as i64;
            }
            target -= weight;
        }
        *self.tokens.last().expect("candidates are never empty") as i64
    }

    /// The chance that [`Candidates::draw`] gives `token`.
    pub fn probability(&self, token: i64) -> f64 {
        let weight: f64 =
            self.tokens.iter().zip(&self.weights).filter(|(t, _)| **t as i64 == token).map(|(_, w)| w).sum();
        weight / self.weights.iter().sum::<f64>()
    }

    /// The candidates but `token`; `None` where it was the only one.
    pub fn without(&self, token: i64) -> Option<Candidates> {
        let (tokens, weights) =
            self.tokens.iter().zip(&self.weights).filter(|(t, _)| **t as i64 != token).map(|(t, w)| (*t, *w)).unzip();
        let rest = Candidates { tokens, weights };
        (!rest.tokens.is_empty()).then_some(rest)
    }
}

/// A token's log-probability under the model (the log-softmax of the raw
/// logits, before any sampling setting), and the `top` likeliest tokens
/// with theirs, likeliest first (ties to the lower id).
#[derive(Clone, Debug, PartialEq)]
pub struct Logprobs {
    pub chosen: f64,
    pub top: Vec<(i64, f64)>,
}

impl Logprobs {
    pub fn of(logits: &[f32], chosen: i64, top: usize) -> Logprobs {
        let largest = logits.iter().fold(f64::NEG_INFINITY, |m, &l| m.max(l as f64));
        let total: f64 = logits.iter().map(|&l| (l as f64 - largest).exp()).sum();
        let normalizer = largest + total.ln();
        let logprob = |token: usize| logits[token] as f64 - normalizer;
        let mut order: Vec<usize> = (0..logits.len()).collect();
        let top = top.min(logits.len());
        if top > 0 {
            order.select_nth_unstable_by(top - 1, |&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
            order.truncate(top);
            order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        } else {
            order.clear();
        }
        Logprobs {
            chosen: logprob(chosen as usize),
            top: order.into_iter().map(|token| (token as i64, logprob(token))).collect(),
        }
    }
}

/// Why a row of logits cannot be sampled: a NaN in it (from a weight or an
/// input that is not a number; sampling would quietly pick token 0).
pub fn not_a_number(logits: &[f32]) -> Option<String> {
    let at = logits.iter().position(|l| l.is_nan())?;
    Some(format!("the logits hold NaN (token {at} first): a weight or an input is not a number"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_largest_and_the_lower_id_on_ties() {
        let greedy = Sampling::default();
        assert_eq!(greedy.choose(&[0.1, 3.0, 3.0, -1.0], &[], 0, &mut Rng::new(1)), 1);
    }

    #[test]
    fn top_k_one_is_greedy_and_seeds_repeat() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 11) as f32 / 3.0).collect();
        let one = Sampling { temperature: 1.0, top_k: 1, ..Sampling::default() };
        assert_eq!(
            one.choose(&logits, &[], 0, &mut Rng::new(7)),
            Sampling::default().choose(&logits, &[], 0, &mut Rng::new(0))
        );
        let warm = Sampling { temperature: 0.8, top_p: 0.9, ..Sampling::default() };
        let draw = |seed| {
            (0..20)
                .map(|_| 0)
                .scan(Rng::new(seed), |rng, _| Some(warm.choose(&logits, &[], 0, rng)))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(3), draw(3));
        assert_ne!(draw(3), draw(4));
    }

    #[test]
    fn a_logit_bias_moves_greedy_choices_too() {
        let biased = Sampling { logit_bias: vec![(0, 5.0)], ..Sampling::default() };
        assert_eq!(biased.choose(&[1.0, 3.0, 2.0], &[], 0, &mut Rng::new(1)), 0, "the bias lifts token 0 past 1");
        let banned = Sampling { temperature: 1.0, logit_bias: vec![(1, -100.0)], ..Sampling::default() };
        let mut rng = Rng::new(5);
        assert!((0..200).all(|_| banned.choose(&[0.0, 30.0, 0.0], &[], 0, &mut rng) != 1), "a bias of -100 bans");
    }

    #[test]
    fn repetition_penalty_demotes_seen_tokens() {
        let penalized = Sampling { repetition_penalty: 10.0, ..Sampling::default() };
        assert_eq!(penalized.choose(&[2.0, 1.9], &[0], 0, &mut Rng::new(0)), 1);
    }

    #[test]
    fn bad_settings_are_refused() {
        assert!(Sampling { top_p: 0.0, ..Sampling::default() }.validate().is_err());
        assert!(Sampling { frequency_penalty: 2.5, ..Sampling::default() }.validate().is_err());
        assert!(Sampling { presence_penalty: -2.1, ..Sampling::default() }.validate().is_err());
        assert!(Sampling { temperature: -1.0, ..Sampling::default() }.validate().is_err());
    }

    /// OpenAI's penalties count only what was generated, not the prompt:
    /// token 0, generated twice, loses to token 1 under a frequency
    /// penalty, and under a presence penalty only where it was generated.
    #[test]
    fn frequency_and_presence_penalties_count_generated_tokens() {
        let logits = [2.0, 1.5, -1.0];
        let frequency = Sampling { frequency_penalty: 0.3, ..Sampling::default() };
        assert_eq!(frequency.choose(&logits, &[0, 0], 1, &mut Rng::new(0)), 0, "one generated: 2.0 - 0.3 > 1.5");
        assert_eq!(frequency.choose(&logits, &[0, 0], 2, &mut Rng::new(0)), 1, "two generated: 2.0 - 0.6 < 1.5");
        let presence = Sampling { presence_penalty: 1.0, ..Sampling::default() };
        assert_eq!(presence.choose(&logits, &[0], 0, &mut Rng::new(0)), 0, "a prompt token is not penalized");
        assert_eq!(presence.choose(&logits, &[0], 1, &mut Rng::new(0)), 1);
        let negative = Sampling { presence_penalty: -2.0, ..Sampling::default() };
        assert_eq!(negative.choose(&logits, &[2], 1, &mut Rng::new(0)), 0, "-1.0 + 2.0 < 2.0");
    }

    /// Log-probabilities sum to one over the vocabulary, the top ones come
    /// likeliest first, and the greedy choice is the likeliest.
    #[test]
    fn logprobs_are_a_log_softmax() {
        let logits = [1.0f32, 3.0, -2.0, 3.0, 0.5];
        let greedy = Sampling::default().choose(&logits, &[], 0, &mut Rng::new(0));
        let found = Logprobs::of(&logits, greedy, 3);
        assert_eq!(greedy, 1);
        assert_eq!(found.top.iter().map(|(t, _)| *t).collect::<Vec<_>>(), vec![1, 3, 0]);
        assert_eq!(found.chosen, found.top[0].1);
        let total: f64 = (0..logits.len()).map(|t| Logprobs::of(&logits, t as i64, 0).chosen.exp()).sum();
        assert!((total - 1.0).abs() < 1e-12, "{total}");
        assert!(Logprobs::of(&logits, 2, 0).top.is_empty());
    }
}
