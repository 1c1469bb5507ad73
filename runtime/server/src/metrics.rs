//! `/metrics`: what the server did and holds, in Prometheus' text format
//! (version 0.0.4): requests by endpoint and status, prompt and generated
//! tokens, rows decoding and requests waiting, the prefix cache's lookups,
//! hits, tokens and bytes, and the time to the first token and per output
//! token as histograms.

use super::batching::Load;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Upper bounds of the latency histograms' buckets, in seconds.
const BUCKETS: [f64; 14] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// A cumulative histogram: the count at or under each bucket's bound, the
/// count in all, and their sum.
#[derive(Default)]
struct Histogram {
    buckets: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, seconds: f64) {
        for (bucket, bound) in self.buckets.iter_mut().zip(BUCKETS) {
            if seconds <= bound {
                *bucket += 1;
            }
        }
        self.count += 1;
        self.sum += seconds;
    }

    fn write(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (count, bound) in self.buckets.iter().zip(BUCKETS) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {count}");
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{le=\"+Inf\"}} {}\n{name}_sum {}\n{name}_count {}",
            self.count, self.sum, self.count
        );
    }
}

#[derive(Default)]
pub struct Metrics {
    /// (endpoint, status) → requests answered.
    requests: Mutex<std::collections::BTreeMap<(&'static str, u16), u64>>,
    prompt_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    first_token: Mutex<Histogram>,
    per_output_token: Mutex<Histogram>,
}

impl Metrics {
    pub fn answered(&self, endpoint: &'static str, status: u16) {
        *self.requests.lock().expect("metrics").entry((endpoint, status)).or_default() += 1;
    }

    pub fn prompt(&self, tokens: usize) {
        self.prompt_tokens.fetch_add(tokens as u64, Ordering::Relaxed);
    }

    /// A token generated, `seconds` after the request was admitted (the
    /// first) or after the token before it (the rest).
    pub fn token(&self, first: bool, seconds: f64) {
        self.generated_tokens.fetch_add(1, Ordering::Relaxed);
        let histogram = if first { &self.first_token } else { &self.per_output_token };
        histogram.lock().expect("metrics").observe(seconds);
    }

    /// The text exposition, with the scheduler's load now.
    pub fn render(&self, model: &str, load: &Load) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# HELP linnet_requests_total Requests answered, by endpoint and HTTP status.");
        let _ = writeln!(out, "# TYPE linnet_requests_total counter");
        for ((endpoint, status), count) in self.requests.lock().expect("metrics").iter() {
            let _ = writeln!(out, "linnet_requests_total{{endpoint=\"{endpoint}\",status=\"{status}\"}} {count}");
        }
        let samples = [
            (
                "linnet_prompt_tokens_total",
                "counter",
                "Prompt tokens of requests admitted.",
                self.prompt_tokens.load(Ordering::Relaxed),
            ),
            (
                "linnet_generation_tokens_total",
                "counter",
                "Tokens generated.",
                self.generated_tokens.load(Ordering::Relaxed),
            ),
            ("linnet_requests_running", "gauge", "Rows decoding now.", load.running.load(Ordering::Relaxed) as u64),
            (
                "linnet_requests_waiting",
                "gauge",
                "Requests waiting for a row.",
                load.waiting.load(Ordering::Relaxed) as u64,
            ),
            (
                "linnet_prefix_cache_queries_total",
                "counter",
                "Prompts looked up in the prefix cache.",
                load.prefix_queries.load(Ordering::Relaxed),
            ),
            (
                "linnet_prefix_cache_hits_total",
                "counter",
                "Prompts that found a prefix in the prefix cache.",
                load.prefix_hits.load(Ordering::Relaxed),
            ),
            (
                "linnet_prefix_cache_tokens_total",
                "counter",
                "Prompt tokens found in the prefix cache, not prefilled again.",
                load.prefix_tokens.load(Ordering::Relaxed),
            ),
            (
                "linnet_prefix_cache_bytes",
                "gauge",
                "Bytes the prefix cache's snapshots hold.",
                load.cache_bytes.load(Ordering::Relaxed),
            ),
        ];
        for (name, kind, help, value) in samples {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
        }
        self.first_token.lock().expect("metrics").write(
            &mut out,
            "linnet_time_to_first_token_seconds",
            "Seconds from a request's admission to its first token.",
        );
        self.per_output_token.lock().expect("metrics").write(
            &mut out,
            "linnet_time_per_output_token_seconds",
            "Seconds between a request's consecutive tokens.",
        );
        let _ = writeln!(out, "# HELP linnet_model_info The model served.\n# TYPE linnet_model_info gauge");
        let _ = writeln!(out, "linnet_model_info{{model=\"{}\"}} 1", model.replace('\\', "\\\\").replace('"', "\\\""));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Buckets are cumulative and end at `+Inf` = count, as Prometheus
    /// reads them.
    #[test]
    fn histograms_are_cumulative() {
        let metrics = Metrics::default();
        metrics.token(true, 0.003);
        metrics.token(true, 0.2);
        metrics.token(false, 100.0);
        metrics.answered("completions", 200);
        metrics.answered("completions", 200);
        metrics.answered("chat", 400);
        let text = metrics.render("tiny", &Load::default());
        assert!(text.contains("linnet_time_to_first_token_seconds_bucket{le=\"0.001\"} 0\n"), "{text}");
        assert!(text.contains("linnet_time_to_first_token_seconds_bucket{le=\"0.005\"} 1\n"), "{text}");
        assert!(text.contains("linnet_time_to_first_token_seconds_bucket{le=\"0.25\"} 2\n"), "{text}");
        assert!(text.contains("linnet_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2\n"), "{text}");
        assert!(text.contains("linnet_time_per_output_token_seconds_bucket{le=\"30\"} 0\n"), "{text}");
        assert!(text.contains("linnet_time_per_output_token_seconds_count 1\n"), "{text}");
        assert!(text.contains("linnet_requests_total{endpoint=\"completions\",status=\"200\"} 2\n"), "{text}");
        assert!(text.contains("linnet_generation_tokens_total 3\n"), "{text}");
    }
}
