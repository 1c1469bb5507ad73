//! `linnetc`, the Linnet compiler's command line.

use clap::{Parser, Subcommand, ValueEnum};
use linnet_frontend::code::Code;
use linnet_frontend::diagnostic;
use linnet_frontend::driver;
use linnet_frontend::package::{self, LoadOptions};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "linnetc", version, about = "The Linnet compiler")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Parse and shape-check a package: exit 0 when clean, 1 with errors.
    Check {
        /// The package: its directory (with `linnet.toml`), or a file or
        /// folder inside it.
        #[arg(default_value = ".")]
        package: PathBuf,
        /// How to print diagnostics.
        #[arg(long, value_enum, default_value_t = MessageFormat::Human)]
        message_format: MessageFormat,
        /// A model card other than `PACKAGE/nest.toml`.
        #[arg(long)]
        nest: Option<PathBuf>,
        /// Override a generic or a `[check]` dim: `--set Groups=2`, `--set T=f32`.
        #[arg(long = "set", value_name = "NAME=VALUE", value_parser = parse_assignment)]
        overrides: Vec<(String, String)>,
        /// Colour in human output.
        #[arg(long, value_enum, default_value_t = Colour::Auto)]
        color: Colour,
        /// Also lower a clean package and name the products the matrix
        /// kernels cannot run, with why (as `build` reports them).
        #[arg(long)]
        perf: bool,
        /// The card's `[drafter]` (a multi-token-prediction layer) in place
        /// of the model: its root, entry and bindings.
        #[arg(long)]
        drafter: bool,
    },
    /// Explain a diagnostic's code (`linnetc explain shape-mismatch`), or
    /// list every code.
    Explain {
        /// The code, as reports show it in brackets.
        code: Option<String>,
    },
    /// A language server over stdio, for editors.
    Lsp,
    /// Format Linnet files in the canonical layout.
    Fmt {
        /// Files or folders (every `.linnet` file below); default `.`.
        paths: Vec<PathBuf>,
        /// Change nothing; exit 1 if a file is not formatted.
        #[arg(long)]
        check: bool,
    },
    /// Check a package, lower it and compile it into an artifact that
    /// `linnet` runs; the memory plan is printed at the end.
    Build {
        #[arg(default_value = ".")]
        package: PathBuf,
        /// The artifact's folder; default `target/linnet/MODEL`.
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Print the IR's text form instead of writing an artifact.
        #[arg(long, value_enum)]
        emit: Option<Emit>,
        #[arg(long)]
        nest: Option<PathBuf>,
        #[arg(long = "set", value_name = "NAME=VALUE", value_parser = parse_assignment)]
        overrides: Vec<(String, String)>,
        /// What to compile for: the host's CPU (an artifact `linnet`
        /// runs), or NVIDIA GPUs (PTX, with a build that has the `nvptx`
        /// feature).
        #[arg(long, value_enum, default_value_t = Target::Cpu)]
        target: Target,
        /// The GPU architecture PTX is compiled for.
        #[arg(long, default_value = "sm_90")]
        gpu_arch: String,
        /// libdevice (`libdevice.10.bc`), linked for the math functions;
        /// default `$LINNET_LIBDEVICE`, else where
        /// `scripts/install-gpu-tools.sh` puts it.
        #[arg(long)]
        libdevice: Option<PathBuf>,
        /// The card's `[drafter]` (a multi-token-prediction layer) in place
        /// of the model: its root, entry and bindings.
        #[arg(long)]
        drafter: bool,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Emit {
    Ir,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Target {
    Cpu,
    Nvptx,
}

#[derive(Clone, Copy, ValueEnum)]
enum MessageFormat {
    Human,
    Json,
}

#[derive(Clone, Copy, ValueEnum)]
enum Colour {
    Auto,
    Always,
    Never,
}

fn parse_assignment(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((name, value)) if !name.trim().is_empty() => Ok((name.trim().to_string(), value.trim().to_string())),
        _ => Err(format!("expected NAME=VALUE, found `{text}`")),
    }
}

fn linnet_files(path: &std::path::Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    if path.is_dir() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(path)?.filter_map(|e| e.ok().map(|e| e.path())).collect();
        entries.sort();
        for entry in entries {
            if entry.file_name().is_some_and(|n| n != "target" && !n.to_string_lossy().starts_with('.')) {
                linnet_files(&entry, out)?;
            }
        }
    } else if path.extension().is_some_and(|e| e == "linnet") {
        out.push(path.to_path_buf());
    }
    Ok(())
}

fn format_files(paths: Vec<PathBuf>, check: bool) -> ExitCode {
    let mut files = Vec::new();
    for path in &paths {
        if let Err(error) = linnet_files(path, &mut files) {
            eprintln!("linnetc fmt: {}: {error}", path.display());
            return ExitCode::from(2);
        }
    }
    let (mut unformatted, mut unparsed) = (0, 0);
    for file in &files {
        let text = match std::fs::read_to_string(file) {
            Ok(text) => text,
            Err(error) => {
                eprintln!("linnetc fmt: {}: {error}", file.display());
                return ExitCode::from(2);
            }
        };
        let Some(formatted) = linnet_frontend::syntax::format::format(&text) else {
            eprintln!(
                "linnetc fmt: {}: has syntax errors, so it is left as it is; run `linnetc check` to see them",
                file.display()
            );
            unparsed += 1;
            continue;
        };
        if formatted == text {
            continue;
        }
        unformatted += 1;
        if check {
            println!("{}", file.display());
        } else if let Err(error) = std::fs::write(file, formatted) {
            eprintln!("linnetc fmt: {}: {error}", file.display());
            return ExitCode::from(2);
        }
    }
    if check && unformatted > 0 {
        eprintln!("{unformatted} of {} file(s) are not formatted", files.len());
    }
    if unparsed > 0 {
        eprintln!("{unparsed} of {} file(s) have syntax errors and were not formatted", files.len());
    }
    if (check && unformatted > 0) || unparsed > 0 {
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}

/// The package a path names: the folder itself, or the package a file or
/// folder lies in; a file outside any package is not one.
fn package_of(path: PathBuf, command: &str) -> Result<PathBuf, ExitCode> {
    match package::enclosing(&path) {
        Some(package) => Ok(package),
        None if path.is_file() => {
            eprintln!(
                "linnetc {command}: `{}` is a file in no package: give a package's folder (one with a linnet.toml)",
                path.display()
            );
            Err(ExitCode::from(2))
        }
        None => Ok(path),
    }
}

/// `linnetc explain`: what `code` means, or every code with the first
/// sentence of its explanation; an unknown code exits 2 with the list.
fn explain(code: Option<&str>) -> ExitCode {
    let list = || {
        Code::ALL
            .iter()
            .map(|code| {
                let first = code.explanation().split(". ").next().unwrap_or_default().trim_end_matches('.');
                format!("{:24} {first}.", code.name())
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    match code {
        None => {
            println!("{}", list());
            ExitCode::SUCCESS
        }
        Some(name) => match Code::parse(name.trim_start_matches('[').trim_end_matches(']')) {
            Some(code) => {
                println!("{}\n\n{}", code.name(), wrap(code.explanation(), 76));
                ExitCode::SUCCESS
            }
            None => {
                eprintln!("linnetc explain: no code `{name}`; the codes are:\n{}", list());
                ExitCode::from(2)
            }
        },
    }
}

/// `text` in lines of at most `width` characters, broken between words.
fn wrap(text: &str, width: usize) -> String {
    let mut lines: Vec<String> = vec![String::new()];
    for word in text.split_whitespace() {
        let line = lines.last_mut().expect("one line at least");
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            lines.push(word.to_string());
        } else {
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(word);
        }
    }
    lines.join("\n")
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Explain { code } => explain(code.as_deref()),
        Command::Lsp => match linnet_lsp::serve() {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("linnetc lsp: {error}");
                ExitCode::from(2)
            }
        },
        Command::Fmt { paths, check } => {
            format_files(if paths.is_empty() { vec![PathBuf::from(".")] } else { paths }, check)
        }
        Command::Build { package, output, emit, nest, overrides, target, gpu_arch, libdevice, drafter } => {
            let package = match package_of(package, "build") {
                Ok(package) => package,
                Err(code) => return code,
            };
            let options = LoadOptions { nest, overrides, drafter, ..LoadOptions::default() };
            match target {
                Target::Cpu => build(&package, output, emit, &options),
                Target::Nvptx => build_nvptx(&package, output, &gpu_arch, libdevice, &options),
            }
        }
        Command::Check { package, message_format, nest, overrides, color, perf, drafter } => {
            let package = match package_of(package, "check") {
                Ok(package) => package,
                Err(code) => return code,
            };
            let options = LoadOptions { nest, overrides, drafter, ..LoadOptions::default() };
            let checked = driver::check_package(&package, &options);
            let stdout = std::io::stdout();
            let mut out = stdout.lock();
            let written = match message_format {
                MessageFormat::Json => checked
                    .diagnostics
                    .iter()
                    .try_for_each(|d| writeln!(out, "{}", diagnostic::to_json(d, &checked.sources))),
                MessageFormat::Human => {
                    let colour = match color {
                        Colour::Always => true,
                        Colour::Never => false,
                        Colour::Auto => std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
                    };
                    let mut err = std::io::stderr().lock();
                    let errors = checked.diagnostics.iter().filter(|d| d.is_error()).count();
                    let warnings = checked.diagnostics.len() - errors;
                    diagnostic::render_human(&checked.diagnostics, &checked.sources, colour, &mut err).and_then(|()| {
                        if errors == 0 {
                            writeln!(err, "checked `{}`: no errors, {warnings} warning(s)", package.display())
                        } else {
                            writeln!(
                                err,
                                "checking `{}` failed: {errors} error(s), {warnings} warning(s)",
                                package.display()
                            )
                        }
                    })
                }
            };
            if let Err(error) = written {
                eprintln!("linnetc: cannot write diagnostics: {error}");
                return ExitCode::from(2);
            }
            if checked.has_errors() {
                return ExitCode::from(1);
            }
            if perf {
                let Ok((model, _)) = driver::lower_checked(checked, linnet_frontend::lower::Lowering::default()) else {
                    eprintln!("linnetc check: the package checks clean but does not lower");
                    return ExitCode::from(1);
                };
                match missed_products(&model) {
                    Some(report) => eprintln!("{report}"),
                    None => eprintln!("every product with a stored weight runs on the matrix kernels"),
                }
            }
            ExitCode::SUCCESS
        }
    }
}

/// The model lowered with its package and content key, or its
/// diagnostics printed.
fn lowered(package: &std::path::Path, options: &LoadOptions) -> Option<(linnet_ir::Model, driver::Checked, String)> {
    let checked = driver::check_package(package, options);
    let key = linnet_build::content_key(&checked.sources);
    match driver::lower_checked(checked, linnet_frontend::lower::Lowering::default()) {
        Ok((model, checked)) => Some((model, checked, key)),
        Err(checked) => {
            let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
            let _ =
                diagnostic::render_human(&checked.diagnostics, &checked.sources, colour, &mut std::io::stderr().lock());
            None
        }
    }
}

/// `linnetc build --target nvptx`: the artifact (its IR and CPU code) with
/// each entry's kernels as PTX for `arch` in its `nvptx-ARCH` section.
#[cfg(feature = "nvptx")]
fn build_nvptx(
    package: &std::path::Path,
    output: Option<PathBuf>,
    arch: &str,
    libdevice: Option<PathBuf>,
    options: &LoadOptions,
) -> ExitCode {
    let started = std::time::Instant::now();
    let libdevice = libdevice.unwrap_or_else(linnet_gpu::default_libdevice);
    let Some((model, checked, key)) = lowered(package, options) else { return ExitCode::from(1) };
    let package = checked.package.as_ref().expect("a lowered package was loaded");
    let dir = output.unwrap_or_else(|| PathBuf::from("target/linnet").join(&model.name));
    let built = linnet_build::write(&model, package, key, &dir)
        .and_then(|_| Ok(linnet_artifact::read(&dir)?))
        .and_then(|artifact| linnet_build::add_ptx(artifact, arch, &libdevice));
    let set = match built {
        Ok((_, set)) => set,
        Err(error) => {
            eprintln!("linnetc build: {error}");
            return ExitCode::from(1);
        }
    };
    let kernels: usize = set.entries.values().map(|entry| entry.launches.len()).sum();
    let bytes: usize = set.entries.values().map(|entry| entry.ptx.len()).sum();
    let calls: Vec<String> =
        set.entries.iter().map(|(name, entry)| format!("{name} {}", entry.launches_per_call())).collect();
    eprintln!(
        "built `{}` for {arch} into {} in {:.2} s: {} entries, {kernels} kernels, {bytes} bytes of PTX; launches per call: {}",
        model.name,
        dir.display(),
        started.elapsed().as_secs_f64(),
        set.entries.len(),
        calls.join(", ")
    );
    ExitCode::SUCCESS
}

#[cfg(not(feature = "nvptx"))]
fn build_nvptx(_: &std::path::Path, _: Option<PathBuf>, _: &str, _: Option<PathBuf>, _: &LoadOptions) -> ExitCode {
    eprintln!("linnetc build: this linnetc was built without the nvptx target; run scripts/install-gpu-tools.sh, then build with `cargo build --release --features nvptx`");
    ExitCode::from(2)
}

/// The products outside the matrix kernels, as the build's report says
/// them (`None` where there are none): one line for each parameter
/// (layers' copies as one, `#` for their numbers), its axis summed over
/// and why.
fn missed_products(model: &linnet_ir::Model) -> Option<String> {
    let mut lines: Vec<(String, usize, &str, Vec<String>)> = Vec::new();
    for missed in linnet_ir::contraction::missed(model) {
        let param = &model.params[missed.param];
        let structural: Vec<&str> = param
            .path
            .split('.')
            .map(|part| if part.bytes().all(|b| b.is_ascii_digit()) { "#" } else { part })
            .collect();
        let structural = structural.join(".");
        match lines.iter_mut().find(|(path, axis, ..)| *path == structural && *axis == missed.axis) {
            Some((.., entries)) => {
                if !entries.contains(&missed.entry) {
                    entries.push(missed.entry);
                }
            }
            None => lines.push((structural, missed.axis, missed.why, vec![missed.entry])),
        }
    }
    let lines: Vec<String> = lines
        .into_iter()
        .map(|(path, axis, why, entries)| {
            format!("  `{path}`, summed over its axis {axis} (in {}): {why}", entries.join(", "))
        })
        .collect();
    (!lines.is_empty())
        .then(|| format!("products outside the matrix kernels (generated loops, slower):\n{}", lines.join("\n")))
}

fn build(package: &std::path::Path, output: Option<PathBuf>, emit: Option<Emit>, options: &LoadOptions) -> ExitCode {
    let started = std::time::Instant::now();
    let Some((model, checked, key)) = lowered(package, options) else { return ExitCode::from(1) };
    let package = checked.package.as_ref().expect("a lowered package was loaded");
    if let Some(Emit::Ir) = emit {
        print!("{model}");
        let dims = driver::check_dims(package);
        eprintln!(
            "lowered `{}`: {} entries\n{}",
            model.name,
            model.entries.len(),
            linnet_ir::plan::describe(&model, &dims)
        );
        return ExitCode::SUCCESS;
    }
    let dir = output.unwrap_or_else(|| PathBuf::from("target/linnet").join(&model.name));
    match linnet_build::write(&model, package, key, &dir) {
        Ok(manifest) => {
            let records = manifest.code.get(linnet_cpu::load::SECTION).map(linnet_cpu::load::records);
            let kernels: usize = records.and_then(Result::ok).map_or(0, |records| records.values().map(Vec::len).sum());
            eprintln!(
                "built `{}` into {} in {:.2} s: {} entries, {kernels} kernels\n{}",
                model.name,
                dir.display(),
                started.elapsed().as_secs_f64(),
                model.entries.len(),
                manifest.plan.describe()
            );
            if let Some(report) = missed_products(&model) {
                eprintln!("{report}");
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("linnetc build: {error}");
            ExitCode::from(2)
        }
    }
}
