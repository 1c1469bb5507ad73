//! A model's parameters from a GGUF file: llama.cpp's (its converter's
//! names and changes, as the package's `gguf.json` declares them) or
//! `linnet quantize`'s (named as the checkpoint, through the bindings).
//! The file's architecture picks which; the model card's generics are
//! checked against the file's metadata; every parameter is checked
//! (present, its shape, its storage) and all problems are reported at
//! once, before anything runs.
//!
//! A parameter read from one tensor in a block format, unchanged, is used
//! where it lies in the mapped file. One concatenated from several tensors
//! or with heads to reorder keeps its blocks when the moves are of whole
//! blocks (rows, or runs of whole blocks within rows), copied once. Heads
//! tiled within the blocks of a weight's rows (llama.cpp's `ssm_out`) keep
//! the file's column order where the model reads the weight only as a
//! product's (`linnet_ir::tiled`), its blocks where they lie. A change of
//! values (`plus`, `negated_exp`), a transposition, or another move that
//! would split blocks reads plain values (blocks dequantized), the
//! converter's changes undone in f32, rounded to the parameter's dtype.

use super::{Files, Gguf, Meta, Part, Storage, TensorInfo};
use crate::weights::NonFinite;
use crate::Error;
use linnet_artifact::gguf_names::{Change, Expected, GgufNames, RopeFactors, Source};
use linnet_artifact::Naming;
use linnet_exec::tensor::{Data, Elements, Tensor};
use linnet_ir::quant::{self, BlockFormat};
use linnet_ir::tiled::{self, Tiled};
use linnet_ir::{Model, Param, StoredBlocks};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// `general.architecture` of the files `linnet quantize` writes.
pub const LINNET_ARCHITECTURE: &str = "linnet";

/// Where each parameter is in `files`: the bindings for `linnet
/// quantize`'s files, `gguf.json` for a file of its architecture, whose
/// metadata must then agree with the card.
fn sources(naming: &Naming, files: &Files) -> Result<HashMap<String, Source<i64>>, Vec<String>> {
    let named = named_sources(naming, files)?;
    // A name with alternatives (`output.weight | token_embd.weight`) is the
    // first the file holds.
    let held = |name: &String| {
        linnet_artifact::binding_names(name)
            .find(|alternative| files.tensor(alternative).is_some())
            .unwrap_or_else(|| linnet_artifact::written_name(name))
            .to_string()
    };
    Ok(named
        .into_iter()
        .map(|(param, source)| (param, Source { tensors: source.tensors.iter().map(held).collect(), ..source }))
        .collect())
}

/// Each parameter's source as the package names it.
fn named_sources(naming: &Naming, files: &Files) -> Result<HashMap<String, Source<i64>>, Vec<String>> {
    let (gguf, path) = (files.first(), files.path());
    let architecture = gguf.meta("general.architecture").and_then(Meta::as_str).unwrap_or("");
    if architecture == LINNET_ARCHITECTURE {
        return Ok(naming
            .bindings
            .iter()
            .map(|(param, tensor)| {
                (param.clone(), Source { tensors: vec![tensor.clone()], axis: 0, changes: Vec::new() })
            })
            .collect());
    }
    match &naming.gguf_names {
        Some(names) if names.architecture == architecture => {
            let mut problems = metadata_problems(names, gguf);
            problems.extend(names.rope_factors.as_ref().and_then(|expected| rope_factor_problem(expected, files)));
            if problems.is_empty() {
                Ok(names.tensors.clone().into_iter().collect())
            } else {
                Err(problems)
            }
        }
        Some(names) => Err(vec![format!(
            "{} is a GGUF file for the `{architecture}` architecture; this package reads `{}` files (its gguf.json) and linnet's own",
            path.display(),
            names.architecture
        )]),
        None => Err(vec![format!(
            "{} is a GGUF file for the `{architecture}` architecture, and this package has no gguf.json to read such files with (its nest.toml names none in [weights])",
            path.display()
        )]),
    }
}

/// The file's value of `key` as a number, and whether it equals `expected`
/// (an array's value is its length: `tokenizer.ggml.tokens`, the vocabulary).
fn agrees(value: &Meta, expected: &Expected) -> Option<bool> {
    if let Meta::Array(items) = value {
        return Some(matches!(expected, Expected::Int(want) if usize::try_from(*want) == Ok(items.len())));
    }
    let float = match *value {
        Meta::F32(v) => Some(v as f64),
        Meta::F64(v) => Some(v),
        _ => None,
    };
    Some(match (expected, float) {
        (Expected::Int(want), None) => value.as_u64()? as i128 == *want as i128,
        (Expected::Int(want), Some(have)) => have == *want as f64,
        // The file's float is as precise as its type: compare at that precision.
        (Expected::Float(want), Some(have)) => match value {
            Meta::F32(v) => *v == *want as f32,
            _ => have == *want,
        },
        (Expected::Float(want), None) => value.as_u64()? as f64 == *want,
    })
}

fn shown(value: &Meta) -> String {
    match value {
        Meta::F32(v) => v.to_string(),
        Meta::F64(v) => v.to_string(),
        Meta::Str(text) => format!("{text:?}"),
        other => other.as_u64().map_or_else(|| format!("{other:?}"), |v| v.to_string()),
    }
}

fn shown_expected(expected: &Expected) -> String {
    match expected {
        Expected::Int(v) => v.to_string(),
        Expected::Float(v) => v.to_string(),
    }
}

/// Each metadata value the card's generics disagree with, as a sentence
/// naming both.
fn metadata_problems(names: &GgufNames, gguf: &Gguf) -> Vec<String> {
    let mut problems = Vec::new();
    for (key, expected) in &names.metadata {
        let want = shown_expected(expected);
        match (gguf.meta(key), names.absent_means.get(key)) {
            (None, Some(absent)) if absent == expected => {}
            (None, Some(absent)) => problems.push(format!(
                "the file has no metadata `{key}`, which means {}, and the model card makes it {want}: set the card's generics to the file's (`--set`)",
                shown_expected(absent)
            )),
            (None, None) => problems.push(format!("the file has no metadata `{key}` (the model card makes it {want})")),
            (Some(value), _) => match agrees(value, expected) {
                Some(true) => {}
                Some(false) => problems.push(format!(
                    "metadata `{key}` is {} in the file, and the model card makes it {want}: set the card's generics to the file's (`--set`)",
                    shown(value)
                )),
                None => problems.push(format!("metadata `{key}` is {} in the file, not a number", shown(value))),
            },
        }
    }
    problems
}

/// How far a file's rotary divisor may be from the card's: the converter
/// computes them in f32.
const ROPE_FACTOR_TOLERANCE: f64 = 1e-4;

/// Where the file's rotary divisors (`rope_freqs.weight`) disagree with
/// those of the card's scaling, as a sentence naming both; a file without
/// them is unscaled.
fn rope_factor_problem(expected: &RopeFactors, files: &Files) -> Option<String> {
    let RopeFactors { tensor, factors: card, settings } = expected;
    let fix = "set the card's scaling to the file's (`--set`)";
    let file = match files.tensor(tensor) {
        None if card.iter().all(|&divisor| divisor == 1.0) => return None,
        None => {
            return Some(format!(
                "the model card scales the rotary frequencies ({settings}), and the file has no `{tensor}`, which llama.cpp's converter writes for that scaling: the file's are unscaled; {fix}"
            ))
        }
        Some((part, info)) => match info.storage {
            Storage::Plain(stored) if stored.is_float() => crate::weights::to_f32(stored, part.bytes(info)),
            _ => return Some(format!("`{tensor}` in the file is not a tensor of floats")),
        },
    };
    if file.len() != card.len() {
        return Some(format!(
            "`{tensor}` in the file holds {} divisors, and the model card's rotary heads have {} pairs",
            file.len(),
            card.len()
        ));
    }
    let differs = |(&in_file, &by_card): &(&f32, &f64)| {
        (f64::from(in_file) - by_card).abs() > ROPE_FACTOR_TOLERANCE * by_card.abs().max(1.0)
    };
    let (pair, (in_file, by_card)) = file.iter().zip(card).enumerate().find(|(_, pair)| differs(pair))?;
    Some(format!(
        "`{tensor}` in the file divides rotary pair {pair}'s frequency by {in_file}, and the model card's scaling ({settings}) by {by_card}: {fix}"
    ))
}

/// How a parameter is read from its tensors.
struct Plan<'g> {
    /// Each tensor, and the file it is in.
    parts: Vec<(&'g Part, &'g TensorInfo)>,
    /// Each part's length along the source's axis.
    lengths: Vec<usize>,
    /// The block format the parameter keeps, when it keeps its blocks.
    blocks: Option<BlockFormat>,
}

fn elements(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// A shape without its size-1 axes: two shapes equal so lay their
/// elements out alike.
fn squeezed(shape: &[usize]) -> Vec<usize> {
    shape.iter().copied().filter(|&d| d != 1).collect()
}

/// Whether a run of `length` elements starting at `start` along `axis` of
/// `shape` is made of whole blocks of `values` elements.
fn whole_blocks(shape: &[usize], axis: usize, start: usize, length: usize, values: usize) -> bool {
    axis + 1 < shape.len() || (start.is_multiple_of(values) && length.is_multiple_of(values))
}

/// How `param` is read from `source`'s tensors in `gguf`, or why it cannot be.
fn plan<'g>(param: &Param, source: &Source<i64>, files: &'g Files) -> Result<Plan<'g>, Error> {
    let shape = &param.shape;
    let axis = source.axis;
    if axis >= shape.len().max(1) {
        return Err(Error::Weights(format!(
            "gguf.json concatenates along axis {axis}, and the parameter has {} axes",
            shape.len()
        )));
    }
    let mut parts = Vec::new();
    for name in &source.tensors {
        parts.push(files.tensor(name).ok_or_else(|| Error::Weights(format!("the file has no tensor `{name}`")))?);
    }
    let transposed = source.changes.contains(&Change::Transposed);
    if transposed && shape.len() < 2 {
        return Err(Error::Weights(format!("gguf.json transposes a parameter of shape {shape:?}")));
    }
    let along = shape.get(axis).copied().unwrap_or(1);
    let across = elements(shape) / along.max(1);
    let mut lengths = Vec::new();
    for (_, part) in &parts {
        let count =
            usize::try_from(part.elements()).map_err(|_| Error::Weights(format!("`{}` is too large", part.name)))?;
        let mut wanted = shape.clone();
        if let Some(slot) = wanted.get_mut(axis) {
            *slot = count.checked_div(across).unwrap_or(0);
        }
        let file_shape: Vec<usize> = part.shape().iter().map(|&d| d as usize).collect();
        let mut stored = wanted.clone();
        if transposed {
            stored.swap(shape.len() - 2, shape.len() - 1);
        }
        if squeezed(&file_shape) != squeezed(&stored) || elements(&wanted) != count {
            let expected = if parts.len() == 1 { format!("{shape:?}") } else { format!("{shape:?} together") };
            return Err(Error::Weights(format!("`{}` has shape {file_shape:?}, expected {expected}", part.name)));
        }
        lengths.push(wanted.get(axis).copied().unwrap_or(1));
    }
    if lengths.iter().sum::<usize>() != along {
        let names: Vec<&str> = parts.iter().map(|(_, p)| p.name.as_str()).collect();
        return Err(Error::Weights(format!(
            "{} hold {:?} along axis {axis}, and the parameter {along}",
            names.join(" + "),
            lengths
        )));
    }
    for change in &source.changes {
        let (axis, from, length) = match *change {
            Change::TiledHeads { axis, from, groups, per_group, head } => {
                (axis, from, groups.checked_mul(per_group).and_then(|n| n.checked_mul(head)))
            }
            Change::RotaryPairs { axis, heads, head } if head % 2 == 0 => (axis, 0, heads.checked_mul(head)),
            Change::RotaryPairs { head, .. } => {
                return Err(Error::Weights(format!("gguf.json pairs the halves of heads of {head}, an odd size")))
            }
            Change::Plus(_) | Change::NegatedExp | Change::Transposed => continue,
        };
        let end = length.filter(|&l| l >= 0 && from >= 0).and_then(|l| from.checked_add(l));
        let fits = end.is_some_and(|end| axis < shape.len() && end as usize <= shape[axis]);
        if !fits {
            return Err(Error::Weights(format!(
                "gguf.json reorders {change:?} along axis {axis}, outside the shape {shape:?}"
            )));
        }
    }
    let format = match parts.first().map(|(_, p)| p.storage) {
        Some(Storage::Blocks(format)) if parts.iter().all(|(_, p)| p.storage == Storage::Blocks(format)) => {
            Some(format)
        }
        _ => None,
    };
    let keeps = |format: BlockFormat| {
        let values = format.block_values();
        let mut start = 0;
        let concat = lengths.iter().all(|&length| {
            let whole = whole_blocks(shape, axis, start, length, values);
            start += length;
            whole
        });
        concat
            && source.changes.iter().all(|change| match *change {
                Change::TiledHeads { axis, from, head, .. } => {
                    whole_blocks(shape, axis, from as usize, head as usize, values)
                }
                // Runs of one element along the axis: whole blocks only
                // when the axis is not the blocks' own.
                Change::RotaryPairs { axis, .. } => whole_blocks(shape, axis, 0, 1, values),
                Change::Plus(_) | Change::NegatedExp | Change::Transposed => false,
            })
    };
    let blocks = format.filter(|&f| param.dtype.is_float() && keeps(f));
    Ok(Plan { parts, lengths, blocks })
}

/// Where each parameter of `model` is in `files`, and how it reads: every
/// problem at once.
fn plans<'g>(model: &Model, naming: &Naming, files: &'g Files) -> Result<Vec<(Source<i64>, Plan<'g>)>, Vec<String>> {
    let sources = sources(naming, files)?;
    let mut problems = Vec::new();
    let mut plans = Vec::new();
    for param in &model.params {
        let Some(source) = sources.get(&param.path) else {
            let file = if naming.gguf_names.is_some() { "gguf.json" } else { "bindings.json" };
            problems.push(format!("parameter `{}` has no entry in {file}", param.path));
            continue;
        };
        match plan(param, source, files) {
            Ok(plan) => plans.push((source.clone(), plan)),
            Err(why) => problems.push(format!("parameter `{}`: {why} (in {})", param.path, files.path().display())),
        }
    }
    if problems.is_empty() {
        Ok(plans)
    } else {
        Err(problems)
    }
}

/// The block format of each parameter that keeps its blocks from
/// `files`: what the model is built for before it loads. A parameter the
/// model lays out otherwise than the checkpoint (`Param::axes`) keeps its
/// blocks only where the file stores it in the model's order
/// ([`in_model_order`]); one whose columns the file tiles keeps them where
/// the model can read its columns as stored ([`in_file_column_order`]);
/// else it is read as values, whatever the format.
pub fn formats(model: &Model, naming: &Naming, files: &Files) -> Result<BTreeMap<String, StoredBlocks>, Error> {
    let plans = plans(&model.as_stored(), naming, files).map_err(|problems| Error::Weights(problems.join("\n")))?;
    let mut formats = BTreeMap::new();
    for (at, (param, (source, plan))) in model.params.iter().zip(plans).enumerate() {
        let blocks = match (&param.axes, in_model_order(param, &source)) {
            (None, _) => plan.blocks,
            (Some(_), Some(source)) => kept_blocks(param, &source, files)?,
            (Some(_), None) => None,
        };
        if let Some(format) = blocks {
            formats.insert(param.path.clone(), format.into());
        } else if let Some((tiled, source)) = in_file_column_order(param, &source) {
            let Some(format) = kept_blocks(param, &source, files)? else { continue };
            match tiled::readable_tiled(model, at, tiled) {
                Ok(()) => {
                    formats.insert(param.path.clone(), StoredBlocks { format, tiled: Some(tiled) });
                }
                Err(not_kept) => tracing::info!(
                    param = %param.path,
                    why = %not_kept.why,
                    "read as values: the model cannot read its columns in the file's tiled order"
                ),
            }
        }
    }
    Ok(formats)
}

/// `source` without its tiling of `param`'s columns (a [`Change::TiledHeads`]
/// over the whole last axis), and that tiling: how the parameter reads
/// where the model keeps its columns in the file's order
/// (`linnet_ir::tiled`). `None` where the source tiles no columns so.
fn in_file_column_order(param: &Param, source: &Source<i64>) -> Option<(Tiled, Source<i64>)> {
    let last = param.shape.len().checked_sub(1)?;
    if param.axes.is_some() || param.shape.len() < 2 {
        return None;
    }
    let tilings: Vec<Tiled> = source
        .changes
        .iter()
        .filter_map(|change| match *change {
            Change::TiledHeads { axis, from: 0, groups, per_group, head } if axis == last => Some(Tiled {
                groups: usize::try_from(groups).ok()?,
                per_group: usize::try_from(per_group).ok()?,
                head: usize::try_from(head).ok()?,
            }),
            _ => None,
        })
        .collect();
    let [tiled] = tilings.as_slice() else { return None };
    if tiled.columns() != param.shape[last] {
        return None;
    }
    let changes = source
        .changes
        .iter()
        .filter(|change| !matches!(change, Change::TiledHeads { axis, .. } if *axis == last))
        .cloned()
        .collect();
    Some((*tiled, Source { tensors: source.tensors.clone(), axis: source.axis, changes }))
}

/// `source` as it reads for `param` laid out as the model keeps it, where
/// the file stores the parameter in that order: the model swaps the
/// checkpoint's last two axes (`Param::axes`) and the file holds each part
/// transposed (gpt-oss's experts, `[in, out]` in the checkpoint, `[out,
/// in]` in both the file and the model). Its axes are the model's, and the
/// transposition is gone.
fn in_model_order(param: &Param, source: &Source<i64>) -> Option<Source<i64>> {
    let axes = param.axes.as_ref()?;
    let rank = axes.len();
    let swaps_last_two = rank >= 2
        && axes[..rank - 2].iter().enumerate().all(|(at, &a)| at == a)
        && axes[rank - 2..] == [rank - 1, rank - 2];
    if !swaps_last_two || !source.changes.contains(&Change::Transposed) {
        return None;
    }
    let model_axis = |axis: usize| axes.iter().position(|&from| from == axis).unwrap_or(axis);
    let changes = source
        .changes
        .iter()
        .filter(|change| **change != Change::Transposed)
        .map(|change| match *change {
            Change::TiledHeads { axis, from, groups, per_group, head } => {
                Change::TiledHeads { axis: model_axis(axis), from, groups, per_group, head }
            }
            Change::RotaryPairs { axis, heads, head } => Change::RotaryPairs { axis: model_axis(axis), heads, head },
            ref other => other.clone(),
        })
        .collect();
    Some(Source { tensors: source.tensors.clone(), axis: model_axis(source.axis), changes })
}

/// The block format `param`, as the model keeps it, keeps when read
/// through `source` (in the model's axis order, or the file's column order).
fn kept_blocks(param: &Param, source: &Source<i64>, files: &Files) -> Result<Option<BlockFormat>, Error> {
    plan(param, source, files)
        .map(|plan| plan.blocks)
        .map_err(|why| Error::Weights(format!("parameter `{}`: {why} (in {})", param.path, files.path().display())))
}

/// Moves runs of `T`: the parts of a tensor of `shape` (in units of
/// `unit` items) concatenated along `axis`, each `lengths[i]` long there.
fn concatenate<T: Copy>(parts: &[&[T]], shape: &[usize], axis: usize, lengths: &[usize], unit: usize) -> Vec<T> {
    let outer = elements(&shape[..axis]);
    let inner = elements(&shape[axis + 1..]) * unit;
    let mut out = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
    for o in 0..outer {
        for (part, &length) in parts.iter().zip(lengths) {
            out.extend_from_slice(&part[o * length * inner..(o + 1) * length * inner]);
        }
    }
    out
}

/// Undoes [`Change::TiledHeads`] on `data` of `shape` (in units of `unit`
/// items): heads stored `[per_group][groups][head]` from `from` along
/// `axis` are put back `[groups][per_group][head]`.
fn untile<T: Copy>(
    data: &mut [T],
    shape: &[usize],
    axis: usize,
    from: usize,
    (groups, per_group, head): (usize, usize, usize),
    unit: usize,
) {
    let outer = elements(&shape[..axis]);
    let inner = elements(&shape[axis + 1..]) * unit;
    let run = head * inner;
    for o in 0..outer {
        let start = (o * shape[axis] + from) * inner;
        let segment = data[start..start + groups * per_group * run].to_vec();
        for g in 0..groups {
            for p in 0..per_group {
                let to = start + (g * per_group + p) * run;
                let at = (p * groups + g) * run;
                data[to..to + run].copy_from_slice(&segment[at..at + run]);
            }
        }
    }
}

/// `data` (of `shape` in units of `unit`) with every head reordering of
/// `changes` undone, the last change first. A head whose halves are
/// interleaved is a head of two tiled groups of one element.
fn unmove<T: Copy>(data: &mut [T], shape: &[usize], changes: &[Change<i64>], unit: usize) {
    for change in changes.iter().rev() {
        match *change {
            Change::TiledHeads { axis, from, groups, per_group, head } => {
                untile(data, shape, axis, from as usize, (groups as usize, per_group as usize, head as usize), unit);
            }
            Change::RotaryPairs { axis, heads, head } => {
                let head = head as usize;
                for at in 0..heads as usize {
                    untile(data, shape, axis, at * head, (2, head / 2, 1), unit);
                }
            }
            Change::Plus(_) | Change::NegatedExp | Change::Transposed => {}
        }
    }
}

/// The plain values of a part, or why it has none.
fn part_values(param: &Param, part: &TensorInfo, bytes: &[u8]) -> Result<Vec<f32>, Error> {
    match part.storage {
        Storage::Plain(stored) if stored.is_float() && param.dtype.is_float() => {
            Ok(crate::weights::to_f32(stored, bytes))
        }
        Storage::Plain(stored) => Err(Error::Weights(format!(
            "`{}` is {}, and `{}` is {}",
            part.name,
            stored.name(),
            param.path,
            param.dtype.name()
        ))),
        Storage::Blocks(format) if param.dtype.is_float() => {
            let mut values = vec![0.0; part.elements() as usize];
            quant::dequantize(format, bytes, &mut values)
                .map_err(|e| Error::Weights(format!("`{}`: {e}", part.name)))?;
            Ok(values)
        }
        Storage::Blocks(format) => {
            Err(Error::Weights(format!("`{}` is {format}, and `{}` is {}", part.name, param.path, param.dtype.name())))
        }
    }
}

/// `param`'s tensor `name` holding NaN or infinite values, as a sentence.
fn unfinite(param: &Param, name: &str, first: usize) -> String {
    format!("parameter `{}`: `{name}` holds NaN or infinite values, the first at flat index {first}", param.path)
}

/// Reads `param` as `plan` says from its mapped files.
fn read(
    param: &Param,
    source: &Source<i64>,
    plan: &Plan,
    non_finite: NonFinite,
    problems: &mut Vec<String>,
) -> Option<Tensor> {
    let bytes: Vec<&[u8]> = plan.parts.iter().map(|(file, tensor)| file.bytes(tensor)).collect();
    let names: Vec<&str> = plan.parts.iter().map(|(_, p)| p.name.as_str()).collect();
    let name = names.join(" + ");
    if let Some(format) = plan.blocks {
        for ((_, part), bytes) in plan.parts.iter().zip(&bytes) {
            if let Some(block) = quant::first_non_finite_block(format, bytes) {
                non_finite.report(unfinite(param, &part.name, block * format.block_values()), "file", problems);
            }
        }
        let blocks = if plan.parts.len() == 1 && source.changes.is_empty() {
            let (file, tensor) = plan.parts[0];
            let offset = (file.gguf.data_offset + tensor.offset) as usize;
            Elements::mapped(Arc::clone(&file.map) as Arc<dyn AsRef<[u8]> + Send + Sync>, offset, bytes[0].len())
                .expect("a tensor the reader checked lies inside the file")
        } else {
            // Runs of whole blocks: the last axis counts blocks.
            let mut shape = param.shape.clone();
            if let Some(last) = shape.last_mut() {
                *last /= format.block_values();
            }
            let values = format.block_values();
            let lengths: Vec<usize> = if source.axis + 1 == param.shape.len() {
                plan.lengths.iter().map(|l| l / values).collect()
            } else {
                plan.lengths.clone()
            };
            let unit = format.block_bytes();
            let mut data = concatenate(&bytes, &shape, source.axis, &lengths, unit);
            let changes: Vec<Change<i64>> = source.changes.iter().map(|c| in_blocks(c, &param.shape, values)).collect();
            unmove(&mut data, &shape, &changes, unit);
            Elements::from(data)
        };
        return Some(Tensor { dtype: param.dtype, shape: param.shape.clone(), data: Data::Blocks(format, blocks) });
    }
    let mut parts = Vec::new();
    for ((_, part), bytes) in plan.parts.iter().zip(&bytes) {
        match part_values(param, part, bytes) {
            Ok(values) => parts.push(values),
            Err(why) => {
                problems.push(format!("parameter `{}`: {why}", param.path));
                return None;
            }
        }
    }
    if source.changes.contains(&Change::Transposed) {
        for (part, &length) in parts.iter_mut().zip(&plan.lengths) {
            let mut shape = param.shape.clone();
            shape[source.axis] = length;
            *part = untranspose(part, &shape);
        }
    }
    let slices: Vec<&[f32]> = parts.iter().map(Vec::as_slice).collect();
    let mut values = concatenate(&slices, &param.shape, source.axis, &plan.lengths, 1);
    for change in source.changes.iter().rev() {
        match *change {
            Change::Plus(constant) => values.iter_mut().for_each(|v| *v = (*v as f64 - constant) as f32),
            Change::NegatedExp => values.iter_mut().for_each(|v| *v = (-*v).ln()),
            Change::TiledHeads { .. } | Change::RotaryPairs { .. } => {
                unmove(&mut values, &param.shape, std::slice::from_ref(change), 1)
            }
            // Undone on each part, before the concatenation.
            Change::Transposed => {}
        }
    }
    if let Some(first) = values.iter().position(|v| !v.is_finite()) {
        non_finite.report(unfinite(param, &name, first), "file", problems);
    }
    Some(Tensor::from_f32(param.dtype, param.shape.clone(), values).into_bits())
}

/// The values of `shape` from a file that holds them with the last two
/// axes swapped (`[…, columns, rows]`).
fn untranspose(stored: &[f32], shape: &[usize]) -> Vec<f32> {
    let (rows, columns) = (shape[shape.len() - 2], shape[shape.len() - 1]);
    let mut out = Vec::with_capacity(stored.len());
    for matrix in stored.chunks_exact((rows * columns).max(1)) {
        for row in 0..rows {
            out.extend((0..columns).map(|column| matrix[column * rows + row]));
        }
    }
    out
}

/// `change` with its sizes along the last axis of `shape` counted in
/// blocks of `values` elements (the plan checked they are whole).
fn in_blocks(change: &Change<i64>, shape: &[usize], values: usize) -> Change<i64> {
    match *change {
        Change::TiledHeads { axis, from, groups, per_group, head } if axis + 1 == shape.len() => {
            let values = values as i64;
            Change::TiledHeads { axis, from: from / values, groups, per_group, head: head / values }
        }
        ref other => other.clone(),
    }
}

/// Every parameter of `model` from `files`, laid out as the model keeps
/// it (`Tensor::laid_out`).
pub fn load(model: &Model, naming: &Naming, files: &Files, non_finite: NonFinite) -> Result<Vec<Tensor>, Vec<String>> {
    let stored = model.as_stored();
    let plans = plans(&stored, naming, files)?;
    let mut problems = Vec::new();
    let mut params = Vec::with_capacity(model.params.len());
    for ((param, kept), (source, stored_plan)) in stored.params.iter().zip(&model.params).zip(&plans) {
        // Blocks laid out otherwise than the checkpoint are read in the
        // model's order, where the file has them so.
        if let (Some(_), Some(source)) = (kept.storage.filter(|_| kept.axes.is_some()), in_model_order(kept, source)) {
            match plan(kept, &source, files) {
                Ok(plan) if plan.blocks == kept.storage => {
                    params.extend(read(kept, &source, &plan, non_finite, &mut problems));
                }
                Ok(_) => problems.push(format!(
                    "parameter `{}`: the file does not keep it in the blocks the model was built for",
                    kept.path
                )),
                Err(why) => problems.push(format!("parameter `{}`: {why}", kept.path)),
            }
            continue;
        }
        if let (Some(tiled), Some((file_tiling, source))) = (kept.tiled, in_file_column_order(kept, source)) {
            match plan(kept, &source, files) {
                Ok(plan) if plan.blocks == kept.storage && tiled == file_tiling => {
                    params.extend(read(kept, &source, &plan, non_finite, &mut problems));
                }
                Ok(_) => problems.push(format!(
                    "parameter `{}`: the file does not keep it in the blocks and column order the model was built for",
                    kept.path
                )),
                Err(why) => problems.push(format!("parameter `{}`: {why}", kept.path)),
            }
            continue;
        }
        if stored_plan.blocks != param.storage && kept.axes.is_none() {
            let built = param.storage.map_or("plain elements", BlockFormat::name);
            let stored = stored_plan.blocks.map_or("plain elements", BlockFormat::name);
            problems.push(format!(
                "parameter `{}`: the file gives it as {stored}, and the model was built for {built}",
                param.path
            ));
            continue;
        }
        if let Some(tensor) = read(param, source, stored_plan, non_finite, &mut problems) {
            params.push(tensor.laid_out(kept));
        }
    }
    if problems.is_empty() {
        Ok(params)
    } else {
        Err(problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(metadata: &[(&str, Expected)], absent_means: &[(&str, Expected)]) -> GgufNames {
        let map = |entries: &[(&str, Expected)]| entries.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
        GgufNames {
            architecture: "gemma3".into(),
            metadata: map(metadata),
            absent_means: map(absent_means),
            tensors: BTreeMap::new(),
            rope_factors: None,
        }
    }

    fn file(metadata: Vec<(&str, Meta)>) -> Gguf {
        let metadata = metadata.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        Gguf { metadata, tensors: Vec::new(), data_offset: 0, alignment: 32 }
    }

    /// A list is held to its length; a key the converter leaves out is
    /// held to what its absence means; a key that must be there is.
    #[test]
    fn the_metadata_is_held_to_the_card() {
        let tokens = Meta::Array((0..3).map(|t| Meta::Str(format!("t{t}"))).collect());
        let names = names_with_factor(1.0);
        assert!(metadata_problems(&names, &file(vec![("tokenizer.ggml.tokens", tokens.clone())])).is_empty());
        let scaled =
            file(vec![("tokenizer.ggml.tokens", tokens.clone()), ("gemma3.rope.scaling.factor", Meta::F32(8.0))]);
        let problems = metadata_problems(&names, &scaled);
        assert!(problems.len() == 1 && problems[0].contains("is 8 in the file"), "{problems:?}");
        let card_scaled = names_with_factor(8.0);
        let problems = metadata_problems(&card_scaled, &file(vec![("tokenizer.ggml.tokens", tokens)]));
        assert!(
            problems.len() == 1 && problems[0].contains("which means 1, and the model card makes it 8"),
            "{problems:?}"
        );
        let problems = metadata_problems(&card_scaled, &file(vec![]));
        assert!(problems.iter().any(|p| p.contains("no metadata `tokenizer.ggml.tokens`")), "{problems:?}");
    }

    fn names_with_factor(factor: f64) -> GgufNames {
        names(
            &[("tokenizer.ggml.tokens", Expected::Int(3)), ("gemma3.rope.scaling.factor", Expected::Float(factor))],
            &[("gemma3.rope.scaling.factor", Expected::Float(1.0))],
        )
    }
}
