//! `linnet`, the runtime CLI: one call of an entry (`run`) and greedy
//! generation (`generate`), on the reference interpreter.

use clap::{Args, Parser, Subcommand};
use linnet_compiler::interp::{Data, Tensor};
use linnet_compiler::package::LoadOptions;
use linnet_compiler::sema::ty::Dtype;
use linnet_runtime::{generate, npy};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "linnet", version, about = "Run Linnet models")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Args)]
struct Model {
    /// The package directory.
    package: PathBuf,
    /// The checkpoint folder; else the Hugging Face cache at the card's repo.
    #[arg(long)]
    weights: Option<PathBuf>,
    /// A model card other than `PACKAGE/nest.toml`.
    #[arg(long)]
    nest: Option<PathBuf>,
    /// Override a generic: `--set Groups=2`, `--set T=f32`.
    #[arg(long = "set", value_name = "NAME=VALUE", value_parser = assignment)]
    overrides: Vec<(String, String)>,
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
    /// Prefill a prompt, then decode greedily.
    Generate {
        #[command(flatten)]
        model: Model,
        /// The prompt as token ids: `--prompt-ids 1,2,3`.
        #[arg(long, value_delimiter = ',', required = true)]
        prompt_ids: Vec<i64>,
        #[arg(long, default_value_t = 16)]
        max_tokens: usize,
        /// 0 is greedy, the only mode yet.
        #[arg(long, default_value_t = 0.0)]
        temperature: f64,
        /// Print the new token ids on one line.
        #[arg(long)]
        print_ids: bool,
    },
}

fn assignment(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((name, value)) if !name.trim().is_empty() => Ok((name.trim().to_string(), value.trim().to_string())),
        _ => Err(format!("expected NAME=VALUE, found `{text}`")),
    }
}

fn load(model: &Model) -> Result<linnet_compiler::interp::Machine, String> {
    let options = LoadOptions { nest: model.nest.clone(), overrides: model.overrides.clone(), ..LoadOptions::default() };
    linnet_runtime::load(&model.package, &options, model.weights.as_deref())
}

/// An integer array converted to the integer type an input wants.
fn fit_input(mut tensor: Tensor, dtype: Dtype, name: &str) -> Result<Tensor, String> {
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
        _ => Err(format!("input `{name}` must be {}, the file holds {}", dtype.name(), tensor.dtype.name())),
    }
}

fn run(model: &Model, entry_name: &str, inputs: &[(String, String)], args: &[(String, String)], output: Option<&PathBuf>) -> Result<(), String> {
    let mut machine = load(model)?;
    let entry = machine.model().entry(entry_name).ok_or_else(|| {
        let names: Vec<&str> = machine.model().entries.iter().map(|e| e.name.as_str()).collect();
        format!("the model has no entry `{entry_name}`; it has {}", names.join(", "))
    })?;
    let known: Vec<&str> = entry.inputs.iter().map(|i| i.name.as_str()).collect();
    for (name, _) in inputs.iter().chain(args) {
        if !known.contains(&name.as_str()) {
            return Err(format!("entry `{entry_name}` has no input `{name}`; it takes {}", known.join(", ")));
        }
    }
    let mut values = Vec::new();
    for input in &entry.inputs {
        let tensor = if let Some((_, file)) = inputs.iter().find(|(n, _)| *n == input.name) {
            let bytes = std::fs::read(file).map_err(|e| format!("input `{}`: {file}: {e}", input.name))?;
            npy::read(&bytes).map_err(|e| format!("input `{}`: {file}: {e}", input.name))?
        } else if let Some((_, text)) = args.iter().find(|(n, _)| *n == input.name) {
            if !input.shape.is_empty() {
                return Err(format!("input `{}` is a tensor: pass it with --input {}=FILE.npy", input.name, input.name));
            }
            if input.dtype.is_float() {
                let value: f32 = text.parse().map_err(|_| format!("--arg {}: `{text}` is not a number", input.name))?;
                Tensor::from_f32(input.dtype, Vec::new(), vec![value])
            } else {
                let value: i64 = text.parse().map_err(|_| format!("--arg {}: `{text}` is not an integer", input.name))?;
                Tensor::from_i64(Dtype::I64, Vec::new(), vec![value])
            }
        } else {
            let how = if input.shape.is_empty() { "--arg" } else { "--input" };
            return Err(format!("entry `{entry_name}` needs `{}`: pass it with {how} {}=...", input.name, input.name));
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
    let values: Vec<f64> = match &tensor.data {
        Data::F32(v) => v.iter().map(|x| *x as f64).collect(),
        Data::I64(v) => v.iter().map(|x| *x as f64).collect(),
        Data::Bool(v) => v.iter().map(|x| f64::from(u8::from(*x))).collect(),
    };
    let min = values.iter().cloned().fold(f64::INFINITY, f64::min);
    let max = values.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let mean = values.iter().sum::<f64>() / values.len().max(1) as f64;
    let head: Vec<String> = values.iter().take(6).map(|v| format!("{v:.5}")).collect();
    format!("[{}] {}: min {min:.5}, max {max:.5}, mean {mean:.5}; first {}", shape.join(", "), tensor.dtype.name(), head.join(" "))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run { model, entry, inputs, args, output } => run(&model, &entry, &inputs, &args, output.as_ref()),
        Command::Generate { model, prompt_ids, max_tokens, temperature, print_ids } => {
            if temperature != 0.0 {
                Err("only greedy decoding (--temperature 0) is implemented so far".to_string())
            } else {
                load(&model).and_then(|mut machine| {
                    let generated = generate::greedy(&mut machine, &prompt_ids, max_tokens).map_err(|e| e.to_string())?;
                    let ids: Vec<String> = generated.iter().map(ToString::to_string).collect();
                    if print_ids {
                        println!("{}", ids.join(" "));
                    } else {
                        println!("generated {} token(s): {}", ids.len(), ids.join(" "));
                    }
                    Ok(())
                })
            }
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
