//! `linnet`, the runtime CLI: one call of an entry (`run`), text or token
//! generation (`generate`), an OpenAI-compatible server (`serve`), random
//! checkpoints (`init-weights`), quantized GGUF files (`quantize`), the
//! perplexity of a text (`perplexity`) and throughput (`bench`).

use clap::{Args, Parser, Subcommand};
use linnet_exec::tensor::{Data, Tensor};
use linnet_frontend::package::{Checkpoint, LoadOptions};
use linnet_ir::Dtype;
use linnet_runtime::sampling::{Rng, Sampling};
use linnet_runtime::stops::Detokenizer;
use linnet_runtime::weights::NonFinite;
use linnet_runtime::{bench, generate, npy, speculative, Loaded, Weights};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Why a command failed, as the CLI prints it: any library's error.
type Failure = Box<dyn std::error::Error + Send + Sync>;

#[derive(Parser)]
#[command(name = "linnet", version, about = "Run Linnet models")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Clone)]
struct Model {
    /// The package directory.
    package: PathBuf,
    /// The checkpoint folder; or GGUF weights: a `.gguf` file (llama.cpp's,
    /// read through the package's gguf.json, or one `linnet quantize`
    /// wrote), one of a split model's files, or the folder holding them;
    /// else the Hugging Face cache at the card's repo.
    #[arg(long, conflicts_with = "random_weights")]
    weights: Option<PathBuf>,
    /// Refuse a checkpoint holding NaN or infinite weights (without it,
    /// each such tensor is named on stderr and loading goes on).
    #[arg(long, conflicts_with = "random_weights")]
    strict: bool,
    /// Parameters drawn at random from this seed instead of a checkpoint.
    #[arg(long, value_name = "SEED")]
    random_weights: Option<u64>,
    /// The text side from elsewhere than the weights: a GGUF file's
    /// vocabulary, or a folder with `tokenizer.json` (and its configs).
    #[arg(long, value_name = "PATH")]
    tokenizer: Option<PathBuf>,
    /// A Jinja chat template in place of the tokenizer's own.
    #[arg(long, value_name = "FILE")]
    chat_template: Option<PathBuf>,
    /// A model card other than `PACKAGE/nest.toml`.
    #[arg(long)]
    nest: Option<PathBuf>,
    /// Override a generic: `--set Groups=2`, `--set T=f32`.
    #[arg(long = "set", value_name = "NAME=VALUE", value_parser = assignment)]
    overrides: Vec<(String, String)>,
    /// `cpu` compiles with Cranelift; `interp` is the reference interpreter;
    /// `mlir-host` and `cuda` run the GPU kernels (builds with `--features nvptx`, `cuda`).
    #[arg(long, value_enum, default_value_t = BackendArg::Cpu)]
    backend: BackendArg,
    /// Make every CPU product batch-invariant, over weights in blocks too:
    /// a row's logits are then the same bits alone, batched with others or
    /// after a cached prefix in every format (by default only over f32 and
    /// bf16 weights). It costs a quantized model's decode steps and
    /// prefills several times their time (`docs/language.md`).
    #[arg(long, conflicts_with = "batch_variant")]
    batch_invariant: bool,
    /// Let each of the CPU's products take the fastest kernel for the rows
    /// it has, over f32 and bf16 weights too (f32 lanes for up to three
    /// rows of bf16 weights). It gives up batch invariance: a row's logits
    /// then depend in their last bits on the rows beside it, so a prompt
    /// alone, batched with others or after a cached prefix may differ (and
    /// so may its greedy text, at a near tie).
    #[arg(long)]
    batch_variant: bool,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum BackendArg {
    Cpu,
    Interp,
    /// The GPU kernels run on the host by MLIR (a build with `--features nvptx`).
    MlirHost,
    /// The GPU kernels on an NVIDIA GPU (a build with `--features cuda`).
    Cuda,
}

/// Where speculative decoding's drafts come from.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum Speculative {
    /// Prompt lookup: what followed the last tokens where they occurred
    /// before, in the prompt or the answer.
    Ngram,
    /// The checkpoint's multi-token-prediction layer (the card's
    /// `[drafter]`), reading the model's hidden states.
    Mtp,
}

#[derive(Args, Clone)]
struct SamplingArgs {
    /// 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    top_p: f64,
    #[arg(long, default_value_t = 0.0)]
    min_p: f64,
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f64,
    /// Seeds the sampler, for a run that can be repeated.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

#[derive(Subcommand)]
enum Command {
    /// Call one entry once.
    Run {
        #[command(flatten)]
        model: Model,
        #[arg(long)]
        entry: String,
        /// A tensor input from a `.npy` file: `--input tokens=tokens.npy`.
        #[arg(long = "input", value_name = "NAME=FILE", value_parser = assignment)]
        inputs: Vec<(String, String)>,
        /// A scalar input: `--arg pos=3`.
        #[arg(long = "arg", value_name = "NAME=VALUE", value_parser = assignment)]
        args: Vec<(String, String)>,
        /// Where to write the (first) result as `.npy`; else a summary.
        #[arg(long)]
        output: Option<PathBuf>,
    },
    /// Prefill a prompt, then decode, streaming the text.
    Generate {
        #[command(flatten)]
        model: Model,
        /// The prompt as token ids: `--prompt-ids 1,2,3`.
        #[arg(long, value_delimiter = ',', conflicts_with = "prompt")]
        prompt_ids: Vec<i64>,
        /// The prompt as text, through the checkpoint's tokenizer.
        #[arg(long)]
        prompt: Option<String>,
        /// Wrap the prompt in the checkpoint's chat template.
        #[arg(long)]
        chat: bool,
        #[arg(long, default_value_t = 16)]
        max_tokens: usize,
        #[command(flatten)]
        sampling: SamplingArgs,
        /// Print the new token ids on one line.
        #[arg(long)]
        print_ids: bool,
        /// Draft tokens and check them several at a time in one call of the
        /// model's `verify` entry, kept by the rejection rule (so the
        /// tokens follow the sampling settings as without drafts; greedy,
        /// the same tokens): `ngram` drafts what followed the text's last
        /// tokens where they occurred before, `mtp` the checkpoint's
        /// multi-token-prediction layer. How the drafts fared is printed on
        /// stderr.
        #[arg(long, value_enum)]
        speculative: Option<Speculative>,
        /// The most tokens drafted a step.
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64), requires = "speculative")]
        draft: u32,
    },
    /// An OpenAI-compatible server with continuous batching.
    Serve {
        #[command(flatten)]
        model: Model,
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        #[arg(long, default_value_t = 8080)]
        port: u16,
        /// Requests that may wait for a free row; more get 429 with
        /// `Retry-After` instead of queueing without bound.
        #[arg(long, default_value_t = 256)]
        queue: usize,
        /// Require `Authorization: Bearer KEY` on every `/v1` route (and
        /// `/tokenize`, `/detokenize`); else `$LINNET_API_KEY`, if set.
        #[arg(long)]
        api_key: Option<String>,
        /// Memory for the prefix cache's snapshots of prompts' states, in
        /// MiB (0: no prefix cache).
        #[arg(long, default_value_t = 1024)]
        prefix_cache_mb: usize,
        /// The prefix cache's block, in tokens: snapshots are taken at its
        /// multiples.
        #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
        prefix_block: u32,
        /// On SIGTERM or Ctrl-C, how long requests already held may go on
        /// (new ones get 503 and `/ready` fails) before they are ended with
        /// `finish_reason: "abort"`, in seconds.
        #[arg(long, default_value_t = 30.0)]
        drain_timeout: f64,
        /// Publish the prefix cache's changes for prefix-aware routers, as
        /// vLLM's `--kv-events-config` does: a JSON object such as
        /// `{"enable_kv_cache_events": true, "publisher": "zmq",
        /// "endpoint": "tcp://*:5557", "topic": "kv-events"}`. Blocks are
        /// named by the hash seed `$PYTHONHASHSEED`, as vLLM's.
        #[arg(long, value_name = "JSON")]
        kv_events_config: Option<String>,
        /// Draft tokens for every request and check them several at a
        /// time in one call of the model's `verify_slots` entry, kept by
        /// the rejection rule (the tokens follow each request's sampling as
        /// without drafts); a request's `num_speculative_tokens` overrides
        /// `--draft` (0: none). `/metrics` counts drafts and those kept.
        #[arg(long, value_enum)]
        speculative: Option<Speculative>,
        /// The most tokens drafted a step.
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64), requires = "speculative")]
        draft: u32,
    },
    /// Write a random checkpoint laid out as bindings.json says (and copy
    /// the package's tokenizer files beside it).
    InitWeights {
        package: PathBuf,
        #[arg(long)]
        nest: Option<PathBuf>,
        #[arg(long = "set", value_name = "NAME=VALUE", value_parser = assignment)]
        overrides: Vec<(String, String)>,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[arg(long, default_value_t = 2)]
        shards: usize,
        /// Write one GGUF file in this format (`q8_0`, `q4_k`, `q4_k_m`,
        /// `q6_k`) instead of safetensors: `-o` names the file.
        #[arg(long = "type", value_name = "FORMAT", value_parser = recipe)]
        recipe: Option<linnet_runtime::quantize::Recipe>,
        #[arg(short = 'o', long)]
        output: PathBuf,
    },
    /// Quantize a checkpoint, read through the package's bindings, into a
    /// GGUF file whose tensors are named as the checkpoint names them.
    Quantize {
        package: PathBuf,
        /// The checkpoint folder; else the Hugging Face cache at the card's repo.
        #[arg(long)]
        weights: Option<PathBuf>,
        #[arg(long)]
        nest: Option<PathBuf>,
        #[arg(long = "set", value_name = "NAME=VALUE", value_parser = assignment)]
        overrides: Vec<(String, String)>,
        /// `q8_0`, `q4_k`, `q6_k`, or `q4_k_m` (Q4_K with Q6_K where
        /// llama.cpp's Q4_K_M puts it).
        #[arg(long = "type", value_name = "FORMAT", value_parser = recipe)]
        recipe: linnet_runtime::quantize::Recipe,
        #[arg(short = 'o', long)]
        output: PathBuf,
    },
    /// Perplexity of a text, as llama.cpp's llama-perplexity computes it:
    /// the text in chunks of `--ctx-size` tokens, each scored on its second
    /// half; or KL divergence from a base's log-probabilities.
    Perplexity {
        #[command(flatten)]
        model: Model,
        /// The text (UTF-8), tokenized whole.
        #[arg(short = 'f', long, required_unless_present = "kl_divergence")]
        file: Option<PathBuf>,
        /// Tokens in a chunk.
        #[arg(short = 'c', long, default_value_t = 512)]
        ctx_size: usize,
        /// Score at most this many chunks.
        #[arg(long)]
        chunks: Option<usize>,
        /// Where the base's log-probabilities are saved (with `--file`), or
        /// read from (with `--kl-divergence`): llama.cpp's file format.
        #[arg(long, value_name = "FILE")]
        kl_divergence_base: Option<PathBuf>,
        /// Compare with the base: KL divergence, Δp, same top token.
        #[arg(long, requires = "kl_divergence_base")]
        kl_divergence: bool,
    },
    /// Prefill and decode throughput, as llama-bench reports it.
    Bench {
        #[command(flatten)]
        model: Model,
        /// Prompt tokens per row.
        #[arg(short = 'p', long, default_value_t = 512)]
        prompt: usize,
        /// Generated tokens per row.
        #[arg(short = 'n', long, default_value_t = 32)]
        generate: usize,
        #[arg(short = 'r', long, default_value_t = 3)]
        repetitions: usize,
        /// Instead, time one `decode` step at each of these positions.
        #[arg(long, value_delimiter = ',')]
        decode_at: Vec<usize>,
        /// Threads for the kernels (default: one per core).
        #[arg(short = 't', long)]
        threads: Option<usize>,
        /// Also print where the measured calls' time went, by kind of node.
        #[arg(long)]
        profile: bool,
        /// Instead, time greedy decoding with speculative drafts beside
        /// decoding without: drafts whose every token is the model's
        /// choice with each of these probabilities, then n-gram drafts.
        #[arg(long, value_delimiter = ',', group = "speculative_bench")]
        draft_accuracy: Vec<f64>,
        /// Time drafts of the checkpoint's multi-token-prediction layer
        /// (the card's `[drafter]`) too, beside decoding without drafts and
        /// with n-gram drafts.
        #[arg(long, group = "speculative_bench")]
        mtp: bool,
        /// The most tokens drafted a step (with --draft-accuracy or --mtp).
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64), requires = "speculative_bench")]
        draft: u32,
        /// With --draft-accuracy or --mtp, continue this text (through the
        /// checkpoint's tokenizer) instead of `--prompt` counted tokens.
        #[arg(long, requires = "speculative_bench")]
        prompt_text: Option<String>,
    },
}

/// The kernels' threads (and rayon's, which loading uses) at `threads`,
/// when given.
fn use_threads(threads: Option<usize>) -> Result<(), Failure> {
    match threads {
        Some(0) => Err("`--threads` must be at least 1".into()),
        Some(count) => {
            linnet_kernels::threads::set_threads(count)?;
            rayon::ThreadPoolBuilder::new()
                .num_threads(count)
                .build_global()
                .map_err(|e| format!("cannot start {count} threads: {e}").into())
        }
        None => Ok(()),
    }
}

fn assignment(text: &str) -> Result<(String, String), Failure> {
    match text.split_once('=') {
        Some((name, value)) if !name.trim().is_empty() => Ok((name.trim().to_string(), value.trim().to_string())),
        _ => Err(format!("expected NAME=VALUE, found `{text}`").into()),
    }
}

fn recipe(text: &str) -> Result<linnet_runtime::quantize::Recipe, Failure> {
    use linnet_runtime::quantize::Recipe;
    Recipe::parse(text).ok_or_else(|| {
        let known: Vec<&str> = Recipe::names().collect();
        format!("`{text}` is not a format Linnet writes: {}", known.join(", ")).into()
    })
}

/// How the package is read for `model`: its card, `--set`, and what the
/// checkpoint says of itself.
fn options(model: &Model) -> LoadOptions {
    let checkpoint = model.weights.as_deref().and_then(checkpoint_of);
    LoadOptions { nest: model.nest.clone(), overrides: model.overrides.clone(), checkpoint, ..LoadOptions::default() }
}

/// What the checkpoint at `weights` says of its model: a folder's
/// `config.json` (read through the card's `[config]`), or a GGUF file's
/// metadata (through `gguf.json`). A file that does not open is left to
/// the loader, which says why.
fn checkpoint_of(weights: &Path) -> Option<Checkpoint> {
    let config = weights.join("config.json");
    if config.is_file() {
        return Some(Checkpoint::Config(config));
    }
    if !linnet_runtime::weights::is_gguf(weights) {
        return None;
    }
    let files = linnet_runtime::gguf::Files::open(weights).ok()?;
    let gguf = files.first();
    Some(Checkpoint::GgufMetadata {
        path: files.path().to_path_buf(),
        values: gguf.card_metadata(),
        stored: gguf.float_type().map(str::to_string),
    })
}

/// The weights `model` names: a checkpoint, or random ones.
fn weights_of(model: &Model) -> Weights {
    match model.random_weights {
        Some(seed) => Weights::Random(seed),
        None => Weights::Checkpoint {
            dir: model.weights.clone(),
            non_finite: if model.strict { NonFinite::Refuse } else { NonFinite::Warn },
        },
    }
}

fn backend_of(model: &Model) -> linnet_runtime::BackendKind {
    match model.backend {
        BackendArg::Cpu => linnet_runtime::BackendKind::Cpu,
        BackendArg::Interp => linnet_runtime::BackendKind::Interp,
        BackendArg::MlirHost => linnet_runtime::BackendKind::MlirHost,
        BackendArg::Cuda => linnet_runtime::BackendKind::Cuda,
    }
}

/// The card's `[drafter]` on `model`'s weights and backend: the machine
/// of its multi-token-prediction layer.
fn load_drafter(model: &Model) -> Result<linnet_exec::Machine, Failure> {
    let options = LoadOptions { drafter: true, ..options(model) };
    let artifact = linnet_build::cache::artifact_for(&model.package, &options).map_err(|e| e.to_string())?;
    let loaded = linnet_runtime::load(&artifact, &weights_of(model), backend_of(model), Some(&linnet_build::Builder))
        .map_err(|error| format!("the MTP layer (the card's [drafter]): {error}"))?;
    Ok(loaded.machine)
}

fn load(model: &Model) -> Result<Loaded, Failure> {
    use linnet_kernels::choice::{set_batch_order, BatchOrder};
    let order = match (model.batch_invariant, model.batch_variant) {
        (true, _) => Some(("--batch-invariant", BatchOrder::Invariant)),
        (_, true) => Some(("--batch-variant", BatchOrder::Variant)),
        _ => None,
    };
    if let Some((flag, order)) = order {
        if !matches!(model.backend, BackendArg::Cpu) {
            return Err(format!("{flag} chooses the CPU backend's kernels: it needs `--backend cpu`").into());
        }
        set_batch_order(order);
    }
    let artifact = linnet_build::cache::artifact_for(&model.package, &options(model)).map_err(|e| e.to_string())?;
    let mut loaded =
        linnet_runtime::load(&artifact, &weights_of(model), backend_of(model), Some(&linnet_build::Builder))?;
    if let Some(path) = &model.tokenizer {
        let text = linnet_runtime::text::TextModel::open(path)?;
        loaded.text = Some(text.ok_or_else(|| format!("--tokenizer {}: no tokenizer there", path.display()))?);
    }
    if let Some(path) = &model.chat_template {
        let template = std::fs::read_to_string(path).map_err(|e| format!("--chat-template {}: {e}", path.display()))?;
        let text =
            loaded.text.as_mut().ok_or("--chat-template needs a tokenizer: the weights have none (--tokenizer)")?;
        text.set_chat_template(template);
    }
    Ok(loaded)
}

/// An integer array converted to the integer type an input wants.
fn fit_input(mut tensor: Tensor, dtype: Dtype, name: &str) -> Result<Tensor, Failure> {
    if tensor.dtype == dtype {
        return Ok(tensor);
    }
    match (&tensor.data, dtype) {
        (Data::I64(values), Dtype::I32) if values.iter().all(|v| i32::try_from(*v).is_ok()) => {
            tensor.dtype = Dtype::I32;
            Ok(tensor)
        }
        (Data::I64(_), Dtype::I64) => {
            tensor.dtype = Dtype::I64;
            Ok(tensor)
        }
        _ => Err(format!("input `{name}` must be {}, the file holds {}", dtype.name(), tensor.dtype.name()).into()),
    }
}

fn run(
    model: &Model,
    entry_name: &str,
    inputs: &[(String, String)],
    args: &[(String, String)],
    output: Option<&PathBuf>,
) -> Result<(), Failure> {
    let mut machine = load(model)?.machine;
    let entry = machine.model().entry(entry_name).ok_or_else(|| {
        let names: Vec<&str> = machine.model().entries.iter().map(|e| e.name.as_str()).collect();
        format!("the model has no entry `{entry_name}`; it has {}", names.join(", "))
    })?;
    let known: Vec<&str> = entry.inputs.iter().map(|i| i.name.as_str()).collect();
    for (name, _) in inputs.iter().chain(args) {
        if !known.contains(&name.as_str()) {
            return Err(format!("entry `{entry_name}` has no input `{name}`; it takes {}", known.join(", ")).into());
        }
    }
    let mut values = Vec::new();
    for input in &entry.inputs {
        let tensor = if let Some((_, file)) = inputs.iter().find(|(n, _)| *n == input.name) {
            let bytes = std::fs::read(file).map_err(|e| format!("input `{}`: {file}: {e}", input.name))?;
            npy::read(&bytes).map_err(|e| format!("input `{}`: {file}: {e}", input.name))?
        } else if let Some((_, text)) = args.iter().find(|(n, _)| *n == input.name) {
            if !input.shape.is_empty() {
                return Err(format!(
                    "input `{}` is a tensor: pass it with --input {}=FILE.npy",
                    input.name, input.name
                )
                .into());
            }
            if input.dtype.is_float() {
                let value: f32 = text.parse().map_err(|_| format!("--arg {}: `{text}` is not a number", input.name))?;
                Tensor::from_f32(input.dtype, Vec::new(), vec![value])
            } else {
                let value: i64 =
                    text.parse().map_err(|_| format!("--arg {}: `{text}` is not an integer", input.name))?;
                Tensor::from_i64(Dtype::I64, Vec::new(), vec![value])
            }
        } else {
            let how = if input.shape.is_empty() { "--arg" } else { "--input" };
            return Err(
                format!("entry `{entry_name}` needs `{}`: pass it with {how} {}=...", input.name, input.name).into()
            );
        };
        values.push(fit_input(tensor, input.dtype, &input.name)?);
    }
    let results = machine.call(entry_name, values).map_err(|e| e.to_string())?;
    let result = &results[0];
    match output {
        Some(path) => std::fs::write(path, npy::write(result)).map_err(|e| format!("{}: {e}", path.display()))?,
        None => println!("{}", summary(result)),
    }
    Ok(())
}

fn summary(tensor: &Tensor) -> String {
    let shape: Vec<String> = tensor.shape.iter().map(ToString::to_string).collect();
    let values: Vec<f64> = match &tensor.widened().data {
        Data::F32(v) => v.iter().map(|x| *x as f64).collect(),
        Data::Bf16(_) | Data::Blocks(..) => unreachable!("widened to f32"),
        Data::I64(v) => v.iter().map(|x| *x as f64).collect(),
        Data::Bool(v) => v.iter().map(|x| f64::from(u8::from(*x))).collect(),
    };
    let min = values.iter().cloned().fold(f64::INFINITY, f64::min);
    let max = values.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let mean = values.iter().sum::<f64>() / values.len().max(1) as f64;
    let head: Vec<String> = values.iter().take(6).map(|v| format!("{v:.5}")).collect();
    format!(
        "[{}] {}: min {min:.5}, max {max:.5}, mean {mean:.5}; first {}",
        shape.join(", "),
        tensor.dtype.name(),
        head.join(" ")
    )
}

#[allow(clippy::too_many_arguments)]
fn generate_text(
    model: &Model,
    prompt_ids: Vec<i64>,
    prompt: Option<String>,
    chat: bool,
    max_tokens: usize,
    sampling: &SamplingArgs,
    print_ids: bool,
    speculative: Option<(Speculative, usize)>,
) -> Result<(), Failure> {
    let settings = Sampling {
        temperature: sampling.temperature,
        top_k: sampling.top_k,
        top_p: sampling.top_p,
        min_p: sampling.min_p,
        repetition_penalty: sampling.repetition_penalty,
        ..Sampling::default()
    };
    settings.validate()?;
    if max_tokens == 0 {
        return Err("--max-tokens must be at least 1".into());
    }
    if prompt.as_deref() == Some("") {
        return Err("--prompt is empty: give the text to continue".into());
    }
    let Loaded { mut machine, text, .. } = load(model)?;
    let prompt_ids = match (&prompt, &text) {
        (Some(prompt), Some(text)) => {
            if chat {
                let message = serde_json::json!({ "role": "user", "content": prompt });
                text.encode(&text.chat(&[message], &serde_json::Map::new())?)?
            } else {
                text.encode_prompt(prompt)?
            }
        }
        (Some(_), None) => return Err("--prompt needs a tokenizer.json beside the weights; pass --prompt-ids".into()),
        (None, _) if chat => return Err("--chat needs a text --prompt".into()),
        (None, _) if prompt_ids.is_empty() => return Err("give a prompt: --prompt TEXT or --prompt-ids 1,2,3".into()),
        (None, _) => prompt_ids,
    };
    if prompt_ids.is_empty() {
        return Err("the prompt makes no tokens: give text the tokenizer reads as at least one token".into());
    }
    let stop = text.as_ref().map(|t| t.end_ids.clone()).unwrap_or_default();
    let mut stream = text.as_ref().filter(|_| !print_ids).map(|text| (text, Detokenizer::new(Vec::new(), Vec::new())));
    let mut stdout = std::io::stdout();
    let on_token = |token| {
        if let Some((text, detokenizer)) = stream.as_mut() {
            let _ = write!(stdout, "{}", detokenizer.push(Some(text), token).0);
            let _ = stdout.flush();
        }
        true
    };
    let mut rng = Rng::new(sampling.seed);
    let (generated, speculation) = match speculative {
        Some((drafter, draft)) => {
            let request =
                speculative::Request { prompt: &prompt_ids, max_tokens, draft, sampling: &settings, stop: &stop };
            let (generated, acceptance) = match drafter {
                Speculative::Ngram => {
                    speculative::speculate(&mut machine, &request, speculative::ngram_draft, &mut rng, on_token)
                }
                Speculative::Mtp => {
                    let mut layer = load_drafter(model)?;
                    let drafter = linnet_runtime::mtp::MtpDrafter::new(&mut layer).map_err(|e| e.to_string())?;
                    speculative::speculate(&mut machine, &request, drafter, &mut rng, on_token)
                }
            }
            .map_err(|e| e.to_string())?;
            let report = format!(
                "linnet: speculative ({}, up to {draft} a step): {} of {} drafted tokens accepted ({:.2}) in {} checks; {} tokens in {} model calls",
                format!("{drafter:?}").to_lowercase(),
                acceptance.accepted,
                acceptance.drafted,
                acceptance.rate(),
                acceptance.checks,
                generated.len(),
                acceptance.calls
            );
            (generated, Some(report))
        }
        None => (
            generate::generate(&mut machine, &prompt_ids, max_tokens, &settings, &mut rng, &stop, on_token)
                .map_err(|e| e.to_string())?,
            None,
        ),
    };
    let ids: Vec<String> = generated.iter().map(ToString::to_string).collect();
    if print_ids {
        println!("{}", ids.join(" "));
    } else if let Some((text, mut detokenizer)) = stream {
        println!("{}", detokenizer.finish(Some(text)));
    } else {
        println!("generated {} token(s): {}", ids.len(), ids.join(" "));
    }
    // How the drafts fared, after the text.
    if let Some(report) = speculation {
        eprintln!("{report}");
    }
    Ok(())
}

/// `linnet perplexity`: the perplexity of `file` (saving the base to
/// `base`), or with `divergence` the comparison with the base at `base`.
fn perplexity(
    model: &Model,
    file: Option<&PathBuf>,
    ctx: usize,
    limit: Option<usize>,
    base: Option<&PathBuf>,
    divergence: bool,
) -> Result<(), Failure> {
    use linnet_runtime::perplexity::{self as ppl, Base, BaseWriter, Divergence, Likelihood};
    let progress = |chunks: usize| indicatif::ProgressBar::new(chunks as u64).with_message("perplexity");
    let Loaded { mut machine, text, .. } = load(model)?;
    if divergence {
        let path = base.expect("clap requires the base");
        let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let base = Base::read(std::io::BufReader::new(file), &path.display().to_string()).map_err(|e| e.to_string())?;
        let chunks = base.chunks();
        let chunks = &chunks[..chunks.len().min(limit.unwrap_or(usize::MAX))];
        let bar = progress(chunks.len());
        let mut found = Divergence::default();
        for (index, chunk) in chunks.iter().enumerate() {
            let logits = ppl::chunk_logits(&mut machine, chunk)?;
            if logits.len() != base.ctx * base.vocab {
                return Err(format!(
                    "the base has a vocabulary of {}; this model's logits have {}",
                    base.vocab,
                    logits.len() / base.ctx
                )
                .into());
            }
            found.chunk(&base, index, &logits);
            bar.inc(1);
        }
        bar.finish_and_clear();
        print!("{}", found.report());
        return Ok(());
    }
    let path = file.expect("clap requires the text");
    let content = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let text = text.ok_or("perplexity needs the model's tokenizer: the weights have none (--tokenizer)")?;
    let tokens = text.encode(&content)?;
    let chunks = ppl::chunks(&tokens, ctx, limit).map_err(|e| e.to_string())?;
    let open_base = |path: &PathBuf, vocab: usize| {
        let fail = |e: std::io::Error| format!("{}: {e}", path.display());
        let file = std::fs::File::create(path).map_err(fail)?;
        BaseWriter::new(std::io::BufWriter::new(file), ctx, vocab, &chunks).map_err(fail)
    };
    eprintln!("perplexity: {} tokens, {} chunks of {ctx}", tokens.len(), chunks.len());
    let bar = progress(chunks.len());
    let mut likelihood = Likelihood::default();
    let mut writer = None;
    for chunk in &chunks {
        let logits = ppl::chunk_logits(&mut machine, chunk)?;
        let vocab = logits.len() / ctx;
        likelihood.score(chunk, &logits, vocab);
        if let Some(path) = base {
            let writer = match writer.as_mut() {
                Some(writer) => writer,
                None => writer.insert(open_base(path, vocab)?),
            };
            writer.chunk(ctx, &logits).map_err(|e| format!("{}: {e}", path.display()))?;
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    if let Some(writer) = writer {
        writer.finish().map_err(|e| format!("the base file: {e}"))?;
    }
    let (value, error) = likelihood.perplexity();
    println!("Final estimate: PPL = {value:.4} +/- {error:.5}");
    Ok(())
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    if let Err(message) = linnet_kernels::isa::Isa::requested() {
        eprintln!("linnet: {message}");
        return ExitCode::from(1);
    }
    let result = match cli.command {
        Command::Run { model, entry, inputs, args, output } => run(&model, &entry, &inputs, &args, output.as_ref()),
        Command::Generate { model, prompt_ids, prompt, chat, max_tokens, sampling, print_ids, speculative, draft } => {
            let speculative = speculative.map(|drafter| (drafter, draft as usize));
            generate_text(&model, prompt_ids, prompt, chat, max_tokens, &sampling, print_ids, speculative)
        }
        Command::Serve {
            model,
            host,
            port,
            queue,
            api_key,
            prefix_cache_mb,
            prefix_block,
            drain_timeout,
            kv_events_config,
            speculative,
            draft,
        } => {
            let api_key = api_key.or_else(|| std::env::var("LINNET_API_KEY").ok());
            let kv_events = kv_events_config
                .map(|text| linnet_server::kv_events::KvEventsConfig::parse(&text))
                .transpose()
                .map(Option::flatten)
                .map_err(|error| Failure::from(format!("--kv-events-config: {error}")));
            let prefix_cache_bytes = prefix_cache_mb.saturating_mul(1 << 20);
            let prefix_block = prefix_block as usize;
            let drain_timeout = std::time::Duration::try_from_secs_f64(drain_timeout)
                .map_err(|_| Failure::from(format!("--drain-timeout must be 0 or more seconds, not {drain_timeout}")));
            let options = drain_timeout.and_then(|drain_timeout| {
                Ok(linnet_server::Options {
                    host,
                    port,
                    queue,
                    api_key,
                    prefix_cache_bytes,
                    prefix_block,
                    drain_timeout,
                    kv_events: kv_events?,
                    draft: speculative.map_or(0, |_| draft as usize),
                })
            });
            let options = options.and_then(|options| match speculative {
                Some(Speculative::Mtp) => Err(Failure::from(
                    "--speculative mtp: the server drafts by n-gram only (--speculative ngram); `linnet generate` drafts with the MTP layer",
                )),
                _ => Ok(options),
            });
            options.and_then(|options| load(&model).and_then(|loaded| Ok(linnet_server::serve(loaded, options)?)))
        }
        Command::InitWeights { package, nest, overrides, seed, recipe: Some(recipe), output, .. } => {
            let options = LoadOptions { nest, overrides, ..LoadOptions::default() };
            linnet_build::lower(&package, &options).map_err(Failure::from).and_then(|(model, package)| {
                let bindings = linnet_build::bindings(&package);
                // The file holds the parameters as a checkpoint stores them.
                let model = model.as_stored();
                let summary = linnet_runtime::quantize::random(&model, &bindings, seed, recipe, &output)?;
                println!(
                    "wrote random `{}` as {} to {}\n{}",
                    model.name,
                    recipe.name(),
                    output.display(),
                    summary.report()
                );
                Ok(())
            })
        }
        Command::Quantize { package, weights, nest, overrides, recipe, output } => {
            let checkpoint = weights.as_deref().and_then(checkpoint_of);
            let options = LoadOptions { nest, overrides, checkpoint, ..LoadOptions::default() };
            linnet_build::lower(&package, &options).map_err(Failure::from).and_then(|(model, package)| {
                let bindings = linnet_build::bindings(&package);
                // Read and written as the checkpoint stores the parameters.
                let model = model.as_stored();
                let card = package.nest.as_ref();
                let (repo, revision) = (card.and_then(|n| n.repo.as_deref()), card.and_then(|n| n.revision.as_deref()));
                let dir = linnet_runtime::weights::locate(weights.as_deref(), repo, revision)?;
                let params =
                    linnet_runtime::weights::load(&model, &linnet_build::naming(&package), &dir, NonFinite::Refuse)
                        .map_err(|problems| linnet_runtime::weights::unfit(&dir, &model, &problems))?;
                let summary = linnet_runtime::quantize::from_params(&model, &bindings, &params, recipe, &output)?;
                println!(
                    "quantized `{}` to {} in {}\n{}",
                    model.name,
                    recipe.name(),
                    output.display(),
                    summary.report()
                );
                Ok(())
            })
        }
        Command::InitWeights { package, nest, overrides, seed, shards, recipe: None, output } => {
            let options = LoadOptions { nest, overrides, ..LoadOptions::default() };
            linnet_build::lower(&package, &options).map_err(Failure::from).and_then(|(model, package)| {
                // A checkpoint holds the parameters as it stores them.
                let model = model.as_stored();
                let written =
                    linnet_runtime::init::write(&model, &linnet_build::bindings(&package), seed, shards, &output)?;
                linnet_runtime::init::copy_text_files(package.dir(), &output)?;
                println!(
                    "wrote {} parameters ({written} bytes) of `{}` to {}",
                    model.params.len(),
                    model.name,
                    output.display()
                );
                Ok(())
            })
        }
        Command::Perplexity { model, file, ctx_size, chunks, kl_divergence_base, kl_divergence } => {
            perplexity(&model, file.as_ref(), ctx_size, chunks, kl_divergence_base.as_ref(), kl_divergence)
        }
        Command::Bench {
            model,
            prompt,
            generate,
            repetitions,
            decode_at,
            threads,
            profile,
            draft_accuracy,
            mtp,
            draft,
            prompt_text,
        } => {
            use_threads(threads).and_then(|()| load(&model)).and_then(|loaded| {
                let Loaded { mut machine, text, .. } = loaded;
                if !decode_at.is_empty() {
                    // A first call computes what is hoisted (the rotary tables).
                    bench::decode_at(&mut machine, &decode_at[..1], 1)?;
                    for (position, mean, sd) in bench::decode_at(&mut machine, &decode_at, repetitions.max(1))? {
                        println!("decode at position {position}: {mean:.1} ms ± {sd:.1} ms per step");
                    }
                    return Ok(());
                }
                if !draft_accuracy.is_empty() || mtp {
                    let tokens = match (prompt_text, &text) {
                        (Some(prompt), Some(text)) => Some(text.encode_prompt(&prompt)?),
                        (Some(_), None) => return Err("--prompt-text needs a tokenizer.json beside the weights".into()),
                        (None, _) => None,
                    };
                    let prompt = tokens
                        .as_deref()
                        .map_or(bench::speculative::Prompt::Counting(prompt), bench::speculative::Prompt::Tokens);
                    let mut layer = if mtp { Some(load_drafter(&model)?) } else { None };
                    let timed = bench::speculative::Timed {
                        prompt,
                        generate,
                        draft: draft as usize,
                        accuracies: &draft_accuracy,
                        mtp: layer.as_mut(),
                        repetitions: repetitions.max(1),
                    };
                    let report = bench::speculative::run(&mut machine, timed)?;
                    println!("{report}");
                    return Ok(());
                }
                let report = bench::run(&mut machine, prompt, generate, repetitions.max(1), profile)?;
                println!("{report}");
                Ok(())
            })
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("linnet: {message}");
            ExitCode::from(1)
        }
    }
}
