//! `/metrics`: what the server did and holds, in Prometheus' text format
//! (version 0.0.4), under Linnet's names and, for the routers and
//! autoscalers built for vLLM (the Gateway API Inference Extension's
//! model-server protocol, llm-d, Dynamo, vLLM's production stack), under
//! vLLM's: requests running and waiting, the share of the rows' states in
//! use (`vllm:kv_cache_usage_perc`), the cache's block size and capacity
//! (`vllm:cache_config_info`), tokens, speculative drafts and those kept
//! (`vllm:spec_decode_*`), finishes by reason, and the time to
//! the first token, between tokens, end to end and in the queue, and each
//! request's prompt and generated tokens, as histograms.

use super::batching::{Limits, Load};
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Upper bounds of the latency histograms' buckets, in seconds.
const SECONDS: &[f64] =
    &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0];

/// Upper bounds of the token-count histograms' buckets, as vLLM's.
const TOKENS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, 20000.0, 50000.0, 100000.0,
    200000.0,
];

/// A cumulative histogram: the count at or under each bucket's bound, the
/// count in all, and their sum.
struct Histogram {
    bounds: &'static [f64],
    buckets: Vec<u64>,
    count: u64,
    sum: f64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram { bounds, buckets: vec![0; bounds.len()], count: 0, sum: 0.0 }
    }

    fn observe(&mut self, value: f64) {
        for (bucket, bound) in self.buckets.iter_mut().zip(self.bounds) {
            if value <= *bound {
                *bucket += 1;
            }
        }
        self.count += 1;
        self.sum += value;
    }

    /// The histogram under `name`, labelled.
    fn write(&self, out: &mut String, name: &str, labels: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let sep = if labels.is_empty() { "" } else { "," };
        for (count, bound) in self.buckets.iter().zip(self.bounds) {
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {count}");
        }
        let braces = if labels.is_empty() { String::new() } else { format!("{{{labels}}}") };
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}\n{name}_sum{braces} {}\n{name}_count{braces} {}",
            self.count, self.sum, self.count
        );
    }
}

/// The prefix cache as vLLM's `cache_config_info` describes a cache: its
/// block, in tokens, and how many blocks the rows' states hold.
#[derive(Clone, Copy, Default)]
pub struct CacheConfig {
    pub block: usize,
    pub prefix_cache_bytes: usize,
}

/// One request's answer (a choice) as it finished, for the histograms.
pub struct Finished {
    pub reason: &'static str,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub seconds: f64,
    pub queued_seconds: f64,
}

pub struct Metrics {
    /// (endpoint, status) → requests answered.
    requests: Mutex<std::collections::BTreeMap<(&'static str, u16), u64>>,
    prompt_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    first_token: Mutex<Histogram>,
    per_output_token: Mutex<Histogram>,
    end_to_end: Mutex<Histogram>,
    queued: Mutex<Histogram>,
    request_prompt: Mutex<Histogram>,
    request_generated: Mutex<Histogram>,
    /// Finish reason → answers.
    finished: Mutex<std::collections::BTreeMap<&'static str, u64>>,
    cache: CacheConfig,
}

impl Metrics {
    pub fn new(cache: CacheConfig) -> Metrics {
        Metrics {
            requests: Mutex::default(),
            prompt_tokens: AtomicU64::default(),
            generated_tokens: AtomicU64::default(),
            first_token: Mutex::new(Histogram::new(SECONDS)),
            per_output_token: Mutex::new(Histogram::new(SECONDS)),
            end_to_end: Mutex::new(Histogram::new(SECONDS)),
            queued: Mutex::new(Histogram::new(SECONDS)),
            request_prompt: Mutex::new(Histogram::new(TOKENS)),
            request_generated: Mutex::new(Histogram::new(TOKENS)),
            finished: Mutex::default(),
            cache,
        }
    }

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

    /// An answer that ended (each of a request's choices).
    pub fn finished(&self, answer: Finished) {
        *self.finished.lock().expect("metrics").entry(answer.reason).or_default() += 1;
        self.end_to_end.lock().expect("metrics").observe(answer.seconds);
        self.queued.lock().expect("metrics").observe(answer.queued_seconds);
        self.request_prompt.lock().expect("metrics").observe(answer.prompt_tokens as f64);
        self.request_generated.lock().expect("metrics").observe(answer.generated_tokens as f64);
    }

    /// The text exposition, with the scheduler's load now.
    pub fn render(&self, limits: &Limits, load: &Load) -> String {
        let mut out = String::new();
        let model = limits.model.replace('\\', "\\\\").replace('"', "\\\"");
        let label = format!("model_name=\"{model}\"");
        let _ = writeln!(out, "# HELP linnet_requests_total Requests answered, by endpoint and HTTP status.");
        let _ = writeln!(out, "# TYPE linnet_requests_total counter");
        for ((endpoint, status), count) in self.requests.lock().expect("metrics").iter() {
            let _ = writeln!(out, "linnet_requests_total{{endpoint=\"{endpoint}\",status=\"{status}\"}} {count}");
        }
        let (running, waiting) = (load.running.load(Ordering::Relaxed), load.waiting.load(Ordering::Relaxed));
        let prompt = self.prompt_tokens.load(Ordering::Relaxed).to_string();
        let generated = self.generated_tokens.load(Ordering::Relaxed).to_string();
        let usage = load.usage().to_string();
        // (Linnet's name, vLLM's names, type, help, value.)
        let counted = |counter: &AtomicU64| counter.load(Ordering::Relaxed).to_string();
        let samples: [(&str, &[&str], &str, &str, String); 11] = [
            ("linnet_prompt_tokens_total", &["vllm:prompt_tokens_total"], "counter", "Prompt tokens of requests admitted.", prompt),
            ("linnet_generation_tokens_total", &["vllm:generation_tokens_total"], "counter", "Tokens generated.", generated),
            ("linnet_requests_running", &["vllm:num_requests_running"], "gauge", "Rows decoding now.", running.to_string()),
            ("linnet_requests_waiting", &["vllm:num_requests_waiting"], "gauge", "Requests waiting for a row.", waiting.to_string()),
            (
                "linnet_state_usage_ratio",
                &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
                "gauge",
                "The share of the rows' states in use, 0 to 1: each row in use holds its recurrent states whole and its attention caches' positions so far.",
                usage,
            ),
            ("linnet_prefix_cache_queries_total", &[], "counter", "Prompts looked up in the prefix cache.", counted(&load.prefix_queries)),
            ("linnet_prefix_cache_hits_total", &[], "counter", "Prompts that found a prefix in the prefix cache.", counted(&load.prefix_hits)),
            ("linnet_prefix_cache_tokens_total", &[], "counter", "Prompt tokens found in the prefix cache, not prefilled again.", counted(&load.prefix_tokens)),
            ("linnet_spec_decode_drafts_total", &["vllm:spec_decode_num_drafts_total"], "counter", "Speculative checks of drafted tokens.", counted(&load.spec_drafts)),
            ("linnet_spec_decode_draft_tokens_total", &["vllm:spec_decode_num_draft_tokens_total"], "counter", "Tokens drafted and checked.", counted(&load.spec_draft_tokens)),
            ("linnet_spec_decode_accepted_tokens_total", &["vllm:spec_decode_num_accepted_tokens_total"], "counter", "Drafted tokens kept.", counted(&load.spec_accepted_tokens)),
        ];
        for (name, vllm, kind, help, value) in samples {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
            for vllm in vllm {
                let _ = writeln!(out, "# HELP {vllm} {help}\n# TYPE {vllm} {kind}\n{vllm}{{{label}}} {value}");
            }
        }
        let bytes = load.cache_bytes.load(Ordering::Relaxed);
        let _ = writeln!(out, "# HELP linnet_prefix_cache_bytes Bytes the prefix cache's snapshots hold.\n# TYPE linnet_prefix_cache_bytes gauge\nlinnet_prefix_cache_bytes {bytes}");
        let _ = writeln!(
            out,
            "# HELP vllm:request_success_total Answers finished, by reason.\n# TYPE vllm:request_success_total counter"
        );
        for (reason, count) in self.finished.lock().expect("metrics").iter() {
            let _ = writeln!(out, "vllm:request_success_total{{{label},finished_reason=\"{reason}\"}} {count}");
        }
        let block = self.cache.block.max(1);
        let blocks = limits.rows * limits.max_seq.min(1 << 40) / block;
        let _ = writeln!(
            out,
            "# HELP vllm:cache_config_info The cache's block (tokens) and the blocks the rows hold.\n# TYPE vllm:cache_config_info gauge\n\
             vllm:cache_config_info{{{label},block_size=\"{block}\",num_gpu_blocks=\"{blocks}\",enable_prefix_caching=\"{}\"}} 1",
            self.cache.prefix_cache_bytes > 0
        );
        let histograms: [(&Mutex<Histogram>, &[&str], &str); 6] = [
            (
                &self.first_token,
                &["linnet_time_to_first_token_seconds", "vllm:time_to_first_token_seconds"],
                "Seconds from a request's admission to its first token.",
            ),
            (
                &self.per_output_token,
                &[
                    "linnet_time_per_output_token_seconds",
                    "vllm:inter_token_latency_seconds",
                    "vllm:time_per_output_token_seconds",
                ],
                "Seconds between a request's consecutive tokens.",
            ),
            (
                &self.end_to_end,
                &["vllm:e2e_request_latency_seconds"],
                "Seconds from a request's admission to its answer's end.",
            ),
            (&self.queued, &["vllm:request_queue_time_seconds"], "Seconds a request waited for a row."),
            (&self.request_prompt, &["vllm:request_prompt_tokens"], "Each request's prompt tokens."),
            (&self.request_generated, &["vllm:request_generation_tokens"], "Each request's generated tokens."),
        ];
        for (histogram, names, help) in histograms {
            let histogram = histogram.lock().expect("metrics");
            for name in names {
                let labels = if name.starts_with("vllm:") { label.as_str() } else { "" };
                histogram.write(&mut out, name, labels, help);
            }
        }
        let _ = writeln!(out, "# HELP linnet_model_info The model served.\n# TYPE linnet_model_info gauge");
        let _ = writeln!(out, "linnet_model_info{{model=\"{model}\"}} 1");
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
        let metrics = Metrics::new(CacheConfig::default());
        metrics.token(true, 0.003);
        metrics.token(true, 0.2);
        metrics.token(false, 100.0);
        metrics.answered("completions", 200);
        metrics.answered("completions", 200);
        metrics.answered("chat", 400);
        let limits =
            Limits { model: "tiny".into(), rows: 2, max_seq: 64, vocab: 8, states: Default::default(), verifies: true };
        let text = metrics.render(&limits, &Load::default());
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
