//! Weights from safetensors checkpoints: where they are (`--weights DIR`,
//! else the Hugging Face cache at the model card's repo and revision), which
//! file holds each tensor (`model.safetensors.index.json`, else the card's
//! `[weights] files`, else every `.safetensors` file), and every parameter
//! validated against the IR before anything runs: a missing tensor, a wrong
//! shape or dtype, an unreadable file. All problems are reported at once.

use crate::mxfp4;
use crate::Error;
use linnet_artifact::Naming;
use linnet_exec::tensor::{Data, Elements, Floats, Tensor};
use linnet_ir::quant::{self, BlockFormat};
use linnet_ir::Dtype;
use linnet_ir::{Model, StoredBlocks};
use memmap2::Mmap;
use safetensors::SafeTensors;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The Hugging Face hub cache folders, in the order they are consulted.
fn hub_caches() -> Vec<PathBuf> {
    let mut caches = Vec::new();
    if let Some(dir) = std::env::var_os("HF_HUB_CACHE") {
        caches.push(PathBuf::from(dir));
    }
    if let Some(dir) = std::env::var_os("HF_HOME") {
        caches.push(PathBuf::from(dir).join("hub"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        caches.push(PathBuf::from(home).join(".cache/huggingface/hub"));
    }
    caches
}

/// Whether `path` is named as a GGUF file.
pub fn is_gguf_file(path: &Path) -> bool {
    path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

/// Whether `path` holds GGUF weights, read in place of a safetensors
/// checkpoint: a GGUF file, or a folder of them (the splits of one model)
/// without safetensors files.
pub fn is_gguf(path: &Path) -> bool {
    if path.is_dir() {
        let names: Vec<PathBuf> = std::fs::read_dir(path)
            .map(|entries| entries.filter_map(|e| Some(e.ok()?.path())).collect())
            .unwrap_or_default();
        let safetensors = names.iter().any(|p| p.extension().is_some_and(|e| e == "safetensors"));
        return !safetensors && names.iter().any(|p| is_gguf_file(p));
    }
    is_gguf_file(path)
}

/// The weights: the folder or GGUF file given, else the model card's
/// snapshot in the Hugging Face cache; otherwise an error saying where it
/// looked.
pub fn locate(explicit: Option<&Path>, repo: Option<&str>, revision: Option<&str>) -> Result<PathBuf, Error> {
    if let Some(dir) = explicit {
        return if dir.is_dir() || is_gguf_file(dir) && dir.is_file() {
            Ok(dir.to_path_buf())
        } else {
            Err(Error::Weights(format!("--weights {}: no such folder or .gguf file", dir.display())))
        };
    }
    let Some(repo) = repo else {
        return Err(Error::Weights("no weights: pass --weights DIR (the model card names no `[weights] repo`)".into()));
    };
    locate_in_caches(&hub_caches(), repo, revision)
}

/// `models--ORG--NAME/snapshots/REVISION` in the first cache that has it.
pub fn locate_in_caches(caches: &[PathBuf], repo: &str, revision: Option<&str>) -> Result<PathBuf, Error> {
    let folder = format!("models--{}", repo.replace('/', "--"));
    let revision = revision.unwrap_or("main");
    let mut looked = Vec::new();
    for cache in caches {
        let snapshot = cache.join(&folder).join("snapshots").join(revision);
        if snapshot.is_dir() {
            return Ok(snapshot);
        }
        looked.push(snapshot.display().to_string());
    }
    Err(Error::Weights(format!(
        "no weights for {repo}@{revision}: looked in {}; pass --weights DIR",
        looked.join(", ")
    )))
}

/// The checkpoint's shard files, and the index's file for each tensor
/// when it has `model.safetensors.index.json`.
type Shards = (Vec<PathBuf>, Option<HashMap<String, PathBuf>>);

/// Which files hold the tensors: the checkpoint's own, as its index lists
/// them, else every `.safetensors` file in the folder (what
/// `save_pretrained` writes below its shard size is one file, no index).
fn tensor_files(dir: &Path) -> Result<Shards, Error> {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let text = std::fs::read_to_string(&index).map_err(|e| Error::Weights(format!("{}: {e}", index.display())))?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| Error::Weights(format!("{}: {e}", index.display())))?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| Error::Weights(format!("{}: no `weight_map`", index.display())))?;
        let named: HashMap<String, PathBuf> =
            map.iter().filter_map(|(tensor, file)| Some((tensor.clone(), dir.join(file.as_str()?)))).collect();
        let files: BTreeSet<&PathBuf> = named.values().collect();
        return Ok((files.into_iter().cloned().collect(), Some(named)));
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::Weights(format!("{}: {e}", dir.display())))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(Error::Weights(format!("{}: no .safetensors files", dir.display())));
    }
    Ok((files, None))
}

fn dtype_of(dtype: safetensors::Dtype) -> Option<Dtype> {
    Some(match dtype {
        safetensors::Dtype::BF16 => Dtype::Bf16,
        safetensors::Dtype::F16 => Dtype::F16,
        safetensors::Dtype::F32 => Dtype::F32,
        _ => return None,
    })
}

/// Little-endian f32, f16 or bf16 elements, exactly as f32.
pub(crate) fn to_f32(dtype: Dtype, bytes: &[u8]) -> Vec<f32> {
    match dtype {
        Dtype::Bf16 => bytes.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        Dtype::F16 => bytes.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        _ => bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
    }
}

/// How many elements of a little-endian float tensor are NaN or infinite,
/// and the first one's flat index; `None` when all are finite. Blocks are
/// counted on all threads, as whole words where the tensor is aligned for
/// them (a loop the compiler vectorizes).
fn non_finite(dtype: Dtype, bytes: &[u8]) -> Option<(usize, usize)> {
    use rayon::prelude::*;
    let (width, exponent): (usize, u32) = match dtype {
        Dtype::Bf16 => (2, 0x7f80),
        Dtype::F16 => (2, 0x7c00),
        _ => (4, 0x7f80_0000),
    };
    let bad = move |bits: u32| bits & exponent == exponent;
    let element = move |c: &[u8]| {
        bad(if width == 2 {
            u32::from(u16::from_le_bytes([c[0], c[1]]))
        } else {
            u32::from_le_bytes([c[0], c[1], c[2], c[3]])
        })
    };
    let count_block = |block: &[u8]| -> usize {
        // SAFETY: every bit pattern is a valid u16 and u32.
        match (width, unsafe { block.align_to::<u16>() }, unsafe { block.align_to::<u32>() }) {
            (2, ([], words, []), _) => words.iter().map(|w| usize::from(bad(u32::from(u16::from_le(*w))))).sum(),
            (4, _, ([], words, [])) => words.iter().map(|w| usize::from(bad(u32::from_le(*w)))).sum(),
            _ => block.chunks_exact(width).filter(|c| element(c)).count(),
        }
    };
    let count: usize = bytes.par_chunks(width << 20).map(count_block).sum();
    (count > 0).then(|| (count, bytes.chunks_exact(width).position(element).expect("one was counted")))
}

/// What the loader does with NaN or infinite weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NonFinite {
    /// Each tensor holding any is named on stderr; loading goes on.
    Warn,
    /// Each tensor holding any is a problem: the checkpoint is refused.
    Refuse,
}

impl NonFinite {
    /// `found` (a tensor's NaN or infinite values, as a sentence) named on
    /// stderr, or made a problem that refuses the `source` (`checkpoint`,
    /// `file`) holding it.
    pub fn report(self, found: String, source: &str, problems: &mut Vec<String>) {
        match self {
            NonFinite::Warn => eprintln!("warning: {found} (--strict refuses such a {source})"),
            NonFinite::Refuse => problems.push(format!("{found} (refused under --strict)")),
        }
    }
}

/// One checkpoint tensor as the safetensors header describes it.
struct Stored<'a> {
    name: String,
    file: &'a Path,
    /// The mapped file the view lies in.
    map: &'a Arc<Mmap>,
    view: safetensors::tensor::TensorView<'a>,
}

impl Stored<'_> {
    fn describe(&self) -> String {
        format!("tensor `{}` in {}", self.name, self.file.display())
    }

    /// NaN or infinite values, as a sentence.
    fn non_finite(&self) -> Option<String> {
        let dtype = dtype_of(self.view.dtype())?;
        let (count, first) = non_finite(dtype, self.view.data())?;
        Some(format!("{} holds {count} NaN or infinite value(s), the first at flat index {first}", self.describe()))
    }
}

/// Every parameter of `model`, read from the checkpoint in `dir` through
/// `bindings` (parameter path → tensor name). Tensors no binding names are
/// ignored. f32 and bf16 tensors are used where they lie in the mapped
/// file (bf16 parameters are held as bits); f16 ones are widened to f32,
/// as is a tensor not aligned for its type, and fused expert tensors the
/// checkpoint stores per expert are stacked (see [`crate::experts`]).
/// NaN or infinite weights are named on stderr, or refused (`non_finite`).
/// Errors list every problem found. A `.gguf` file in place of the folder
/// is read by [`crate::gguf::load`], through `naming`'s `gguf.json` when it
/// is llama.cpp's.
pub fn load(model: &Model, naming: &Naming, dir: &Path, non_finite: NonFinite) -> Result<Vec<Tensor>, Vec<String>> {
    if is_gguf(dir) {
        let files = crate::gguf::Files::open(dir).map_err(|e| vec![e.to_string()])?;
        return crate::gguf::load::load(model, naming, &files, non_finite);
    }
    let tensors = load_stored(model, naming, dir, non_finite)?;
    // Blocks are read in the model's order: a block runs along the axis
    // the model sums over, which its layout puts last.
    Ok(tensors
        .into_iter()
        .zip(&model.params)
        .map(|(tensor, param)| match tensor.data {
            Data::Blocks(..) => tensor,
            _ => tensor.laid_out(param),
        })
        .collect())
}

/// The block format of each parameter a safetensors checkpoint in `dir`
/// stores quantized (MXFP4 as OpenAI's checkpoints store it: `NAME_blocks`
/// and `NAME_scales` where `NAME` is missing): what the model is built
/// for before it loads.
pub fn formats(model: &Model, naming: &Naming, dir: &Path) -> Result<BTreeMap<String, StoredBlocks>, Error> {
    let names = tensor_names(dir)?;
    Ok(model
        .params
        .iter()
        .filter_map(|param| {
            let binding = naming.bindings.get(&param.path)?;
            let mut names_bound = linnet_artifact::binding_names(binding);
            if names_bound.any(|name| names.contains(name)) {
                return None;
            }
            let name = linnet_artifact::written_name(binding);
            let paired = names.contains(&format!("{name}{}", mxfp4::BLOCKS))
                && names.contains(&format!("{name}{}", mxfp4::SCALES));
            paired.then(|| (param.path.clone(), BlockFormat::Mxfp4.into()))
        })
        .collect())
}

/// The names of every tensor in the checkpoint in `dir`.
fn tensor_names(dir: &Path) -> Result<HashSet<String>, Error> {
    let (files, index) = tensor_files(dir)?;
    if let Some(index) = index {
        return Ok(index.into_keys().collect());
    }
    let mut names = HashSet::new();
    for path in files {
        let unreadable = |error: String| Error::Weights(format!("checkpoint file {}: {error}", path.display()));
        // SAFETY: the checkpoint is read-only input, as in `load_stored`.
        let map =
            File::open(&path).and_then(|file| unsafe { Mmap::map(&file) }).map_err(|e| unreadable(e.to_string()))?;
        let (_, metadata) = SafeTensors::read_metadata(&map).map_err(|e| unreadable(e.to_string()))?;
        names.extend(metadata.tensors().into_keys());
    }
    Ok(names)
}

/// The parameters from a safetensors checkpoint, as it stores them.
/// `model` is laid out as it runs; each parameter is read as the
/// checkpoint stores it (`Model::as_stored`), but for one held in blocks,
/// read in the model's order.
fn load_stored(model: &Model, naming: &Naming, dir: &Path, non_finite: NonFinite) -> Result<Vec<Tensor>, Vec<String>> {
    let laid_out = model;
    let model = &model.as_stored();
    let bindings = &naming.bindings;
    let (files, index) = tensor_files(dir).map_err(|e| vec![e.to_string()])?;
    let mut problems = Vec::new();
    let mut maps = Vec::new();
    for path in &files {
        match File::open(path).and_then(|file| unsafe { Mmap::map(&file) }) {
            // SAFETY: the checkpoint is read-only input; a file changed while
            // mapped is outside what this loader promises to survive.
            Ok(map) => maps.push((path, Arc::new(map))),
            Err(error) => problems.push(format!("cannot open checkpoint file {}: {error}", path.display())),
        }
    }
    let mut parsed = Vec::new();
    for (path, map) in &maps {
        match SafeTensors::deserialize(map) {
            Ok(tensors) => parsed.push((path, map, tensors)),
            Err(error) => problems.push(format!("checkpoint file {} is corrupt or truncated: {error}", path.display())),
        }
    }
    // Each tensor's file: the index's when there is one; a tensor in two
    // files that no index settles is a problem, not the last file's.
    let mut holder: HashMap<String, usize> = HashMap::new();
    for (at, (path, _, tensors)) in parsed.iter().enumerate() {
        for name in tensors.names() {
            let indexed = index.as_ref().and_then(|index| index.get(name));
            match (holder.get(name), indexed) {
                (_, Some(file)) if file != **path => {}
                (Some(&earlier), None) => problems.push(format!(
                    "tensor `{name}` is in both {} and {}, and no index says which",
                    parsed[earlier].0.display(),
                    path.display()
                )),
                _ => {
                    holder.insert(name.to_string(), at);
                }
            }
        }
    }
    let mut params = Vec::with_capacity(model.params.len());
    let mut mapped = 0usize;
    let progress = indicatif::ProgressBar::new(model.params.len() as u64).with_message("loading weights");
    tracing::info!(files = files.len(), params = model.params.len(), dir = %dir.display(), "loading weights");
    let stored = |name: &str| {
        let (file, map, tensors) = &parsed[*holder.get(name)?];
        Some(Stored { name: name.to_string(), file, map, view: tensors.tensor(name).ok()? })
    };
    let mut unfinite = Vec::new();
    for (param, laid_out) in model.params.iter().zip(&laid_out.params) {
        progress.inc(1);
        let Some(binding) = bindings.get(&param.path) else {
            problems.push(format!("parameter `{}` has no binding in bindings.json", param.path));
            continue;
        };
        // The first of the binding's names the checkpoint holds.
        let name = &linnet_artifact::binding_names(binding)
            .find(|name| holder.contains_key(*name))
            .unwrap_or_else(|| linnet_artifact::written_name(binding))
            .to_string();
        let in_mxfp4 = |suffix: &str| stored(&format!("{name}{suffix}"));
        if let (None, Some(blocks), Some(scales)) = (stored(name), in_mxfp4(mxfp4::BLOCKS), in_mxfp4(mxfp4::SCALES)) {
            match bind_mxfp4(laid_out, &blocks, &scales) {
                Ok((tensor, unfinite_block)) => {
                    unfinite.extend(unfinite_block);
                    params.push(tensor);
                }
                Err(problem) => problems.push(problem.to_string()),
            }
            continue;
        }
        // Experts stored one tensor each are looked for only where the fused
        // tensor is missing, each part once.
        let per_expert = || {
            let experts = crate::experts::per_expert_parts(name, *param.shape.first()?)?;
            let found: Vec<Vec<(String, Option<Stored>)>> = experts
                .into_iter()
                .map(|parts| parts.into_iter().map(|part| (part.clone(), stored(&part))).collect())
                .collect();
            found.iter().flatten().any(|(_, tensor)| tensor.is_some()).then_some(found)
        };
        let parts = match stored(name).map(|tensor| vec![vec![tensor]]).ok_or_else(per_expert) {
            Ok(fused) => fused,
            Err(Some(experts)) => {
                // Name the parts that are missing, not the fused tensor.
                let missing: Vec<&String> =
                    experts.iter().flatten().filter(|(_, tensor)| tensor.is_none()).map(|(part, _)| part).collect();
                if let Some(first) = missing.first() {
                    let more = match missing.len() {
                        1 => String::new(),
                        count => format!(" and {} more", count - 1),
                    };
                    problems.push(format!(
                        "parameter `{}`: the checkpoint stores `{name}` one tensor per expert but has no `{first}`{more}",
                        param.path
                    ));
                    continue;
                }
                experts.into_iter().map(|parts| parts.into_iter().filter_map(|(_, tensor)| tensor).collect()).collect()
            }
            Err(None) => {
                if problems.iter().all(|p| !p.contains("corrupt")) {
                    problems.push(format!("parameter `{}`: the checkpoint has no tensor `{name}`", param.path));
                }
                continue;
            }
        };
        unfinite.extend(
            parts
                .iter()
                .flatten()
                .filter_map(|part| part.non_finite().map(|found| format!("parameter `{}`: {found}", param.path))),
        );
        let bound = match parts.as_slice() {
            [one] if one.len() == 1 => bind(param, &one[0]),
            experts => stack(param, name, experts),
        };
        match bound {
            Ok((tensor, in_place)) => {
                mapped += usize::from(in_place);
                params.push(tensor);
            }
            Err(problem) => problems.push(problem.to_string()),
        }
    }
    unfinite.into_iter().for_each(|found| non_finite.report(found, "checkpoint", &mut problems));
    progress.finish_and_clear();
    tracing::info!(
        mapped,
        copied = params.len() - mapped,
        "weights bound: f32 and bf16 tensors in place where aligned, the others copied"
    );
    if problems.is_empty() {
        Ok(params)
    } else {
        Err(problems)
    }
}

/// Why the weights in `dir` do not fit `model`: every problem [`load`]
/// found, one a line.
pub fn unfit(dir: &Path, model: &Model, problems: &[String]) -> Error {
    Error::Weights(format!(
        "the weights in {} do not fit `{}`:\n  {}",
        dir.display(),
        model.name,
        problems.join("\n  ")
    ))
}

/// `want` matches the parameter's shape and dtype, or the problem.
fn check_fits(param: &linnet_ir::Param, tensor: &Stored, shape: &[usize], want: &[usize]) -> Result<(), Error> {
    let mut wrong = Vec::new();
    if shape != want {
        wrong.push(format!("shape {shape:?}, expected {want:?}"));
    }
    if dtype_of(tensor.view.dtype()) != Some(param.dtype) {
        wrong.push(format!("dtype {:?}, expected {}", tensor.view.dtype(), param.dtype.name()));
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(Error::Weights(format!("parameter `{}`: {} has {}", param.path, tensor.describe(), wrong.join(" and "))))
    }
}

/// A parameter stored as one tensor: used where it lies in the mapped file
/// when its type allows (then `true`), else widened.
fn bind(param: &linnet_ir::Param, tensor: &Stored) -> Result<(Tensor, bool), Error> {
    let shape = tensor.view.shape().to_vec();
    check_fits(param, tensor, &shape, &param.shape)?;
    let map = tensor.map;
    let offset = tensor.view.data().as_ptr() as usize - map.as_ptr() as usize;
    let bytes = || Arc::clone(map) as Arc<dyn AsRef<[u8]> + Send + Sync>;
    let in_place = match param.dtype {
        Dtype::F32 => Floats::mapped(bytes(), offset, tensor.view.data().len() / 4).map(Data::F32),
        Dtype::Bf16 => Elements::mapped(bytes(), offset, tensor.view.data().len() / 2).map(Data::Bf16),
        _ => None,
    };
    Ok(match in_place {
        Some(data) => (Tensor { dtype: param.dtype, shape, data }, true),
        None => (Tensor::from_f32(param.dtype, shape, to_f32(param.dtype, tensor.view.data())), false),
    })
}

/// A parameter (as the model lays it out) stored in MXFP4 as OpenAI's
/// checkpoints store it, in GGML's blocks ([`mxfp4`]), and a block with
/// a NaN scale, as a sentence, if there is one.
fn bind_mxfp4(param: &linnet_ir::Param, blocks: &Stored, scales: &Stored) -> Result<(Tensor, Option<String>), Error> {
    let wrong = |why: String| Error::Weights(format!("parameter `{}`: {why}", param.path));
    for tensor in [blocks, scales] {
        if tensor.view.dtype() != safetensors::Dtype::U8 {
            return Err(wrong(format!(
                "{} has dtype {:?}, expected U8 (MXFP4)",
                tensor.describe(),
                tensor.view.dtype()
            )));
        }
    }
    let shape = mxfp4::value_shape(blocks.view.shape(), scales.view.shape()).ok_or_else(|| {
        wrong(format!(
            "{} of shape {:?} and {} of shape {:?} are not an MXFP4 pair ([..., groups, 16] and [..., groups])",
            blocks.describe(),
            blocks.view.shape(),
            scales.describe(),
            scales.view.shape()
        ))
    })?;
    if shape != param.shape {
        return Err(wrong(format!(
            "{} holds MXFP4 values of shape {shape:?}, and the model lays the parameter out {:?} (its blocks must run \
             along the axis it sums over)",
            blocks.describe(),
            param.shape
        )));
    }
    if param.storage != Some(BlockFormat::Mxfp4) {
        return Err(wrong(format!("{} is MXFP4, and the model was not built to read it so", blocks.describe())));
    }
    let data = mxfp4::to_ggml(blocks.view.data(), scales.view.data());
    let unfinite = quant::first_non_finite_block(BlockFormat::Mxfp4, &data).map(|block| {
        format!(
            "parameter `{}`: {} holds a NaN scale, the first in the group at flat index {}",
            param.path,
            scales.describe(),
            block * BlockFormat::Mxfp4.block_values()
        )
    });
    let tensor = Tensor { dtype: param.dtype, shape, data: Data::Blocks(BlockFormat::Mxfp4, Elements::from(data)) };
    Ok((tensor, unfinite))
}

/// A fused expert parameter from its per-expert parts: each expert's
/// parts, their rows in order, make that expert's slice.
fn stack(param: &linnet_ir::Param, fused: &str, experts: &[Vec<Stored>]) -> Result<(Tensor, bool), Error> {
    let slice = &param.shape[1..];
    let mut values = Vec::with_capacity(param.shape.iter().product());
    for parts in experts {
        let rows: usize = parts.iter().map(|part| part.view.shape().first().copied().unwrap_or(0)).sum();
        for part in parts {
            let shape = part.view.shape();
            // Each part holds its share of the rows, with the slice's other axes.
            let want: Vec<usize> = shape.first().copied().into_iter().chain(slice.iter().skip(1).copied()).collect();
            check_fits(param, part, shape, &want).map_err(|problem| {
                Error::Weights(format!("{problem} (stacking `{fused}` from its per-expert tensors)"))
            })?;
            values.extend(to_f32(param.dtype, part.view.data()));
        }
        if rows != slice.first().copied().unwrap_or(1) {
            let names: Vec<&str> = parts.iter().map(|part| part.name.as_str()).collect();
            return Err(Error::Weights(format!(
                "parameter `{}`: per-expert tensors {} have {rows} rows together, expected {:?} (stacking `{fused}`)",
                param.path,
                names.join(" and "),
                slice.first()
            )));
        }
    }
    Ok((Tensor::from_f32(param.dtype, param.shape.clone(), values), false))
}

#[cfg(test)]
mod tests {
    use super::non_finite;
    use linnet_ir::Dtype;

    /// The same count and first index whether the bytes are aligned for
    /// whole words or not, for each float type.
    #[test]
    fn non_finite_values_are_found_aligned_or_not() {
        let cases: [(Dtype, Vec<u8>); 3] = [
            (
                Dtype::Bf16,
                [1.0f32, f32::NAN, 2.0, f32::INFINITY]
                    .iter()
                    .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
                    .collect(),
            ),
            (Dtype::F16, [0x3c00u16, 0x7c00, 0x7e00, 0x0001].iter().flat_map(|v| v.to_le_bytes()).collect()),
            (
                Dtype::F32,
                [f32::NEG_INFINITY, 0.5, 3.0, f32::NAN].iter().flat_map(|v| v.to_bits().to_le_bytes()).collect(),
            ),
        ];
        let expected = [(2, 1), (2, 1), (2, 0)];
        for ((dtype, bytes), want) in cases.iter().zip(expected) {
            let mut buffer = vec![0u8; bytes.len() + 1];
            for shift in [0, 1] {
                buffer[shift..shift + bytes.len()].copy_from_slice(bytes);
                assert_eq!(
                    non_finite(*dtype, &buffer[shift..shift + bytes.len()]),
                    Some(want),
                    "{dtype:?}, shifted by {shift}"
                );
            }
            let finite = vec![0u8; 4096];
            assert_eq!(non_finite(*dtype, &finite), None);
        }
    }
}
