//! The NVPTX target without a GPU: every node of a model becomes an MLIR
//! kernel, MLIR lowers it to PTX, and `ptxas` (from the PyPI wheel
//! `nvidia-cuda-nvcc-cu12`, which `scripts/install-gpu-tools.sh` unpacks)
//! accepts every one for sm_90. The same kernels run on the host through
//! MLIR's execution engine are held to the oracle in
//! `runtime/tests/oracle.rs`; here, a kernel's fault is held to the
//! reference's error. Built only with `--features nvptx`.
#![cfg(feature = "nvptx")]

use linnet_exec::tensor::{Data, Tensor};
use linnet_exec::Machine;
use linnet_frontend::driver::lower_package;
use linnet_frontend::package::LoadOptions;
use linnet_gpu::host::MlirHost;
use linnet_gpu::{Form, Kernel, ModelEntry, WARP_LANES};
use linnet_ir::contraction;
use linnet_ir::dim::Dim;
use linnet_ir::quant::BlockFormat;
use linnet_ir::Dtype;
use linnet_ir::{
    BinaryOp, Entry, Input, Intrinsic, Model, Node, NodeKind, ReduceOp, Scalar, StoredBlocks, UnaryOp, Value,
};
use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// The CUDA compiler pieces: `LINNET_CUDA_NVCC`, else where the set-up
/// script unpacks them.
fn cuda_nvcc() -> PathBuf {
    std::env::var_os("LINNET_CUDA_NVCC")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/opt/linnet-cuda/nvidia/cuda_nvcc"))
}

#[test]
fn every_node_of_the_tiny_mlp_is_ptx_that_ptxas_accepts() {
    let options = LoadOptions { stdlib: Some(root().join("stdlib")), ..LoadOptions::default() };
    let (model, _) = lower_package(&root().join("examples/tiny-mlp"), &options).unwrap_or_else(|_| panic!("lowers"));
    let built = built_whole(&model);
    assert_eq!(built.entries.len(), model.entries.len());
    ptxas_accepts(&built.entries);
    // What the build writes into an artifact's section: each entry's PTX
    // and every kernel's launch, read back as the CUDA backend reads it.
    let set = linnet_gpu::PtxSet::of(&model, "sm_90", built);
    let section = set.to_section();
    assert_eq!((section.name.as_str(), section.section.target.as_str()), ("nvptx-sm_90", "sm_90"));
    let read: linnet_gpu::PtxSet = serde_json::from_slice(&section.bytes).unwrap();
    read.check(&model, "sm_90").unwrap();
    assert!(read.check(&model, "sm_80").unwrap_err().to_string().contains("built for sm_90"));
    let (mut contractions, mut rows) = (0, 0);
    for entry in &model.entries {
        let computes: Vec<usize> =
            (0..entry.nodes.len()).filter(|&at| matches!(entry.nodes[at].kind, NodeKind::Compute(_))).collect();
        let (launches, groups) = (&read.entries[&entry.name].launches, &read.entries[&entry.name].groups);
        assert_eq!(launches.iter().map(|launch| launch.node).collect::<Vec<_>>(), computes, "{}", entry.name);
        for launch in launches {
            let grouped = groups.iter().any(|group| group.members.contains(&launch.node));
            assert_eq!(
                read.entries[&entry.name].ptx.contains(&format!(".entry {}(", launch.name)),
                !grouped,
                "{}",
                launch.name
            );
            let shape = &entry.nodes[launch.node].shape;
            if contraction::of(entry, launch.node).is_some() {
                contractions += 1;
                assert_eq!(launch.lanes, WARP_LANES, "a contraction's item is a warp's");
                assert_eq!(launch.work.last(), shape.last(), "a contraction's items are per column");
            } else if launch.lanes == WARP_LANES {
                rows += 1;
                assert_eq!(launch.work, shape[..shape.len() - 1], "a row kernel's items are its rows");
            } else {
                assert_eq!(launch.lanes, 1);
                assert_eq!(&launch.work, shape, "a Compute node's work is its elements");
            }
        }
    }
    assert!(
        contractions > 0 && rows > 0,
        "the tiny MLP has no contraction or norm: this test covers less than it says"
    );
    // The PTX of another build of the model is refused.
    let (mut other, _) =
        lower_package(&root().join("examples/tiny-mlp"), &options).unwrap_or_else(|_| panic!("lowers"));
    other.entries.pop();
    assert!(read.check(&other, "sm_90").unwrap_err().to_string().contains("another build"));
}

/// `ptxas -arch=sm_90` accepts every PTX text, whose entry points are
/// each launch group and each kernel no group launches.
/// Every node of `model` as PTX kernels for sm_90, libdevice linked;
/// none missing.
fn built_whole(model: &Model) -> linnet_gpu::Built {
    let libdevice = cuda_nvcc().join("nvvm/libdevice/libdevice.10.bc");
    assert!(libdevice.is_file(), "{} is missing: run scripts/install-gpu-tools.sh", libdevice.display());
    let built = linnet_gpu::build(model, "sm_90", Some(&libdevice)).unwrap_or_else(|error| panic!("{error}"));
    assert!(
        built.missing.is_empty(),
        "{}",
        built.missing.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n")
    );
    built
}

fn ptxas_accepts(entries: &[linnet_gpu::BuiltEntry]) {
    // Tests run at once in one process: each call has its own folder.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let scratch = std::env::temp_dir().join(format!("linnet-ptx-{}-{call}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    for entry in entries {
        assert!(!entry.kernels.is_empty());
        assert!(entry.ptx.contains(".target sm_90"), "{}", entry.ptx);
        let grouped: Vec<usize> = entry.groups.iter().flat_map(|group| group.members.iter().copied()).collect();
        let launched = entry
            .kernels
            .iter()
            .filter(|kernel| !grouped.contains(&kernel.node))
            .map(|kernel| &kernel.name)
            .chain(entry.groups.iter().map(|group| &group.name));
        for name in launched {
            assert!(entry.ptx.contains(&format!(".entry {name}(")), "no `{name}` in the PTX of `{}`", entry.entry);
        }
        let path = scratch.join(format!("{}.ptx", entry.entry));
        std::fs::write(&path, &entry.ptx).unwrap();
        let checked = Command::new(cuda_nvcc().join("bin/ptxas"))
            .args(["-arch=sm_90", "-o"])
            .arg(path.with_extension("cubin"))
            .arg(&path)
            .output()
            .expect("ptxas runs");
        assert!(
            checked.status.success(),
            "ptxas refused {}: {}",
            path.display(),
            String::from_utf8_lossy(&checked.stderr)
        );
    }
    std::fs::remove_dir_all(&scratch).unwrap();
}

/// The seed at the bf16 oracle's sizes: every node that computes (bf16
/// rounding, Euclidean division, lazy selects, reductions, gathers, and
/// the intrinsics: attention, the delta rule, cache writes) has a kernel,
/// and every kernel is PTX that ptxas accepts; so is every kernel of the
/// seed with its matrices in Q8_0 blocks.
#[test]
fn every_node_of_the_seed_is_ptx_that_ptxas_accepts() {
    let card = root().join("tests/fixtures/oracle/tiny-qwen3.5-moe-calm/package/nest-bf16.toml");
    let options = LoadOptions { stdlib: Some(root().join("stdlib")), nest: Some(card), ..LoadOptions::default() };
    let (model, _) =
        lower_package(&root().join("models/qwen3.6-35b-a3b"), &options).unwrap_or_else(|_| panic!("lowers"));
    let built = built_whole(&model);
    let working = |kind: &NodeKind| matches!(kind, NodeKind::Compute(_) | NodeKind::Intrinsic(..));
    let nodes: usize = model.entries.iter().map(|e| e.nodes.iter().filter(|n| working(&n.kind)).count()).sum();
    let with_kernels = |kernels: &[Kernel]| {
        let mut nodes: Vec<usize> = kernels.iter().map(|kernel| kernel.node).collect();
        nodes.dedup();
        nodes.len()
    };
    assert_eq!(built.entries.iter().map(|e| with_kernels(&e.kernels)).sum::<usize>(), nodes);
    for intrinsic in [
        Intrinsic::GroupedAttention,
        Intrinsic::GroupedAttentionRows,
        Intrinsic::GatedDeltaRule,
        Intrinsic::GatedDeltaStep,
        Intrinsic::WriteAt,
        Intrinsic::WriteSpan,
        Intrinsic::WriteRows,
        Intrinsic::WriteSlots,
    ] {
        let used = model
            .entries
            .iter()
            .flat_map(|e| &e.nodes)
            .any(|n| matches!(n.kind, NodeKind::Intrinsic(i, _) if i == intrinsic));
        assert!(used, "the seed no longer uses `{}`: this test covers less than it says", intrinsic.name());
    }
    assert!(built.entries.iter().all(|entry| !entry.groups.is_empty()), "every entry of the seed launches groups");
    ptxas_accepts(&built.entries);
    // Every matrix in Q8_0 blocks (the oracle's rows are whole blocks of
    // it only): the products, the experts' and the embeddings' gathers
    // decode them.
    let q8_0: std::collections::BTreeMap<String, StoredBlocks> = model
        .params
        .iter()
        .filter(|param| param.shape.len() >= 2 && param.shape.last().is_some_and(|row| row % 32 == 0))
        .map(|param| (param.path.clone(), BlockFormat::Q8_0.into()))
        .collect();
    assert!(
        q8_0.contains_key("embed_tokens.weight"),
        "the embeddings are not in blocks: this test covers less than it says"
    );
    let quantized = model.stored_as(&q8_0).unwrap_or_else(|problems| panic!("{problems:?}"));
    let built = built_whole(&quantized);
    ptxas_accepts(&built.entries);
}

/// gpt-oss at its tiny checkpoint's sizes (attention with sinks, over
/// rings and over the whole cache): every node has a kernel, and ptxas
/// accepts them all.
#[test]
fn every_node_of_gpt_oss_is_ptx_that_ptxas_accepts() {
    let config = root().join("tests/fixtures/families/tiny-gpt-oss/weights-f32/config.json");
    let options = LoadOptions {
        stdlib: Some(root().join("stdlib")),
        checkpoint: Some(linnet_frontend::package::Checkpoint::Config(config)),
        ..LoadOptions::default()
    };
    let (model, _) = lower_package(&root().join("models/gpt-oss"), &options).unwrap_or_else(|_| panic!("lowers"));
    let sinks = model
        .entries
        .iter()
        .flat_map(|e| &e.nodes)
        .any(|n| matches!(n.kind, NodeKind::Intrinsic(Intrinsic::GroupedAttentionSinks, _)));
    assert!(sinks, "gpt-oss no longer attends with sinks: this test covers less than it says");
    ptxas_accepts(&built_whole(&model).entries);
}

/// The seed's multi-token-prediction layer (its card's `[drafter]`): its
/// `draft` entry, every node a kernel `ptxas` accepts.
#[test]
fn every_node_of_the_seeds_mtp_layer_is_ptx_that_ptxas_accepts() {
    let card = root().join("tests/fixtures/tiny-qwen3.5-moe-text/package/nest.toml");
    let options =
        LoadOptions { stdlib: Some(root().join("stdlib")), nest: Some(card), drafter: true, ..LoadOptions::default() };
    let (model, _) =
        lower_package(&root().join("models/qwen3.6-35b-a3b"), &options).unwrap_or_else(|_| panic!("lowers"));
    assert_eq!(model.entries.iter().map(|entry| entry.name.as_str()).collect::<Vec<_>>(), ["draft"]);
    let built = built_whole(&model);
    ptxas_accepts(&built.entries);
}

/// `out[i] = x[i + 10] + x[i + 20]` over a 4-element `x`: every element
/// reads outside `x`, twice, and the next node reads outside it again.
/// The GPU kernels, whose faults are read once when the call ends, name
/// the fault the reference meets first (node v1, element 0's first load,
/// position 10), not a later one that overwrote it.
#[test]
fn a_kernel_reports_its_first_fault_as_the_reference_does() {
    let shape = vec![Dim::constant(4)];
    let shifted = |value: u32, offset: i64| {
        let position = Scalar::Binary(
            BinaryOp::Add,
            Box::new(Scalar::Index(0, Dtype::I64)),
            Box::new(Scalar::Int(offset, Dtype::I64)),
            Dtype::I64,
        );
        Scalar::Load(Value(value), vec![position], Dtype::F32)
    };
    let add = |a: Scalar, b: Scalar| Scalar::Binary(BinaryOp::Add, Box::new(a), Box::new(b), Dtype::F32);
    let entry = |name: &str, nodes: Vec<Scalar>| Entry {
        name: name.into(),
        dims: Vec::new(),
        requires: Vec::new(),
        inputs: vec![Input { name: "x".into(), shape: shape.clone(), dtype: Dtype::F32 }],
        outputs: vec![Value(nodes.len() as u32)],
        nodes: std::iter::once(Node {
            kind: NodeKind::Input(0),
            shape: shape.clone(),
            dtype: Dtype::F32,
            source: None,
        })
        .chain(nodes.into_iter().map(|scalar| Node {
            kind: NodeKind::Compute(scalar),
            shape: shape.clone(),
            dtype: Dtype::F32,
            source: None,
        }))
        .collect(),
    };
    // `shift`: v1 reads outside x twice per element, v2 once more; the
    // call fails at v1. `fine` reads inside x.
    let entries = vec![
        entry("shift", vec![add(shifted(0, 10), shifted(0, 20)), add(shifted(0, 30), shifted(1, 0))]),
        entry("fine", vec![add(shifted(0, 0), shifted(0, 0))]),
    ];
    let model = Model { name: "shift".into(), params: Vec::new(), states: Vec::new(), entries };
    let x = || vec![Tensor::from_f32(Dtype::F32, vec![4], vec![1.0; 4])];
    let reference = linnet_exec::interp::machine(model.clone(), Vec::new())
        .call("shift", x())
        .expect_err("every load is outside x")
        .to_string();
    let mut host = Machine::new(model, Vec::new(), MlirHost::default()).expect("the kernels build");
    let error = host.call("shift", x()).expect_err("every load is outside x").to_string();
    assert!(reference.contains("position 10 is outside 0..4") && reference.contains("v1"), "{reference}");
    assert_eq!(error, reference);
    // The faults of a failed call are not the next call's.
    assert_eq!(host.call("fine", x()).expect("the loads are inside x")[0].as_f32().unwrap(), [2.0; 4]);
}

/// Constant dims of these sizes.
fn dims(sizes: &[usize]) -> Vec<Dim> {
    sizes.iter().map(|&size| Dim::constant(size as i64)).collect()
}

/// Entry `name`: its inputs (name, sizes, type), then the `computed`
/// nodes, which are its outputs.
fn entry_of(name: &str, inputs: &[(&str, Vec<usize>, Dtype)], computed: Vec<Node>) -> Entry {
    let mut nodes: Vec<Node> = inputs
        .iter()
        .enumerate()
        .map(|(at, (_, sizes, dtype))| Node {
            kind: NodeKind::Input(at),
            shape: dims(sizes),
            dtype: *dtype,
            source: None,
        })
        .collect();
    let outputs = (nodes.len()..nodes.len() + computed.len()).map(|at| Value(at as u32)).collect();
    nodes.extend(computed);
    Entry {
        name: name.into(),
        dims: Vec::new(),
        requires: Vec::new(),
        inputs: inputs
            .iter()
            .map(|(name, sizes, dtype)| Input { name: (*name).into(), shape: dims(sizes), dtype: *dtype })
            .collect(),
        nodes,
        outputs,
    }
}

/// `count` values in -`size`..`size`, a different run for each `phase`.
fn wave(count: usize, phase: usize, size: f32) -> Vec<f32> {
    (0..count).map(|at| ((((at + phase) * 37 % 101) as f32 - 50.0) / 50.0) * size).collect()
}

/// Contractions split across a warp's lanes (`gpu::contraction`), run on
/// the host, against the reference: a depth that is no multiple of a run
/// (each lane reads single elements), one that is (runs), both longer
/// than a warp reads at once, so lanes come round again; rows that share
/// their weight row (items of eight rows, the last item part past the
/// rows) and rows that gather theirs (an expert per row: more rows than a
/// warp, ordered by expert first, so that an item's rows change expert
/// within it); and a gathered row outside its weights is refused as the
/// reference refuses it.
#[test]
fn contractions_split_across_lanes_meet_the_reference() {
    let (rows, columns, experts) = (37usize, 5usize, 3usize);
    let index = |k: u32| Scalar::Index(k, Dtype::I64);
    let load = |value: u32, positions: Vec<Scalar>, dtype: Dtype| {
        let loaded = Scalar::Load(Value(value), positions, dtype);
        if dtype == Dtype::F32 {
            loaded
        } else {
            Scalar::Cast(Box::new(loaded), Dtype::F32)
        }
    };
    let sum = |depth: usize, a: Scalar, w: Scalar| Scalar::Reduce {
        op: ReduceOp::Sum,
        index: 2,
        extent: Dim::constant(depth as i64),
        body: Box::new(Scalar::Binary(BinaryOp::Mul, Box::new(a), Box::new(w), Dtype::F32)),
        dtype: Dtype::F32,
    };
    let inputs = [
        ("a", vec![rows, 45], Dtype::F32),
        ("w", vec![columns, 45], Dtype::Bf16),
        ("b", vec![rows, 264], Dtype::Bf16),
        ("v", vec![experts, columns, 264], Dtype::Bf16),
        ("pick", vec![rows], Dtype::I32),
    ];
    let picked = Scalar::Cast(Box::new(Scalar::Load(Value(4), vec![index(0)], Dtype::I32)), Dtype::I64);
    let products = [
        sum(45, load(0, vec![index(0), index(2)], Dtype::F32), load(1, vec![index(1), index(2)], Dtype::Bf16)),
        sum(
            264,
            load(2, vec![index(0), index(2)], Dtype::Bf16),
            load(3, vec![picked, index(1), index(2)], Dtype::Bf16),
        ),
        sum(
            264,
            load(2, vec![index(0), index(2)], Dtype::Bf16),
            load(3, vec![Scalar::Int(1, Dtype::I64), index(1), index(2)], Dtype::Bf16),
        ),
    ];
    let computed = products
        .into_iter()
        .map(|product| Node {
            kind: NodeKind::Compute(product),
            shape: dims(&[rows, columns]),
            dtype: Dtype::F32,
            source: None,
        })
        .collect();
    let entry = entry_of("contract", &inputs, computed);
    for at in 5..8 {
        assert!(
            contraction::of(&entry, at).is_some(),
            "node {at} is not a contraction: this test covers less than it says"
        );
    }
    let stages = |at| {
        linnet_gpu::node_kernels(ModelEntry { entry: &entry, params: &[] }, at, Form::Host)
            .expect("a compute node has kernels")
            .expect("they build")
            .len()
    };
    assert_eq!(
        (stages(5), stages(6)),
        (1, 2),
        "the gathered product is not ordered first: this test covers less than it says"
    );
    let model = Model { name: "contract".into(), params: Vec::new(), states: Vec::new(), entries: vec![entry] };
    let values: Vec<Tensor> = inputs[..4]
        .iter()
        .enumerate()
        .map(|(phase, (_, sizes, dtype))| {
            Tensor::from_f32(*dtype, sizes.clone(), wave(sizes.iter().product(), phase * 7, 1.0))
        })
        .collect();
    let call = |pick: Vec<i64>| {
        let mut call = values.clone();
        call.push(Tensor::from_i64(Dtype::I32, vec![rows], pick));
        call
    };
    // Experts in no row's order: 2, 0, 1, 2, 0, …
    let good: Vec<i64> = (0..rows as i64).map(|row| (row + 2) % experts as i64).collect();
    let reference = linnet_exec::interp::machine(model.clone(), Vec::new())
        .call("contract", call(good.clone()))
        .expect("the reference runs");
    let mut host = Machine::new(model.clone(), Vec::new(), MlirHost::default()).expect("the kernels build");
    let computed = host.call("contract", call(good.clone())).expect("the kernels run");
    for (output, (expected, got)) in reference.iter().zip(&computed).enumerate() {
        let (expected, got) = (expected.as_f32().unwrap(), got.as_f32().unwrap());
        assert_eq!(expected.len(), rows * columns);
        for (at, (e, g)) in expected.iter().zip(got).enumerate() {
            assert!((e - g).abs() <= 1e-5 * (1.0 + e.abs()), "output {output}, element {at}: {g}, the reference {e}");
        }
    }
    let mut bad = good;
    bad[9] = experts as i64;
    let reference = linnet_exec::interp::machine(model, Vec::new())
        .call("contract", call(bad.clone()))
        .expect_err("expert 3 of 3")
        .to_string();
    let error = host.call("contract", call(bad)).expect_err("expert 3 of 3").to_string();
    assert!(reference.contains("holds 3, outside 0..3"), "{reference}");
    assert_eq!(error, reference);
}

/// Rows whose elements share reductions along other axes than the last
/// (`gpu::kernel`'s row kernels: a norm, a softmax's maximum), run on the
/// host, against the reference: rows longer than a warp, a sum and a
/// maximum shared by the lanes, and a node of one axis (one row).
#[test]
fn rows_sharing_reductions_meet_the_reference() {
    let (rows, columns) = (3usize, 45usize);
    let index = |k: u32| Scalar::Index(k, Dtype::I64);
    let binary = |op: BinaryOp, a: Scalar, b: Scalar| Scalar::Binary(op, Box::new(a), Box::new(b), Dtype::F32);
    let x = |row: Scalar, column: Scalar| Scalar::Load(Value(0), vec![row, column], Dtype::F32);
    // A reduction's index is its own, numbered after the node's axes.
    let reduce = |op: ReduceOp, index: u32, body: Scalar| Scalar::Reduce {
        op,
        index,
        extent: Dim::constant(columns as i64),
        body: Box::new(body),
        dtype: Dtype::F32,
    };
    let squares = reduce(ReduceOp::Sum, 2, binary(BinaryOp::Mul, x(index(0), index(2)), x(index(0), index(2))));
    let scale = Scalar::Unary(
        UnaryOp::Rsqrt,
        Box::new(binary(BinaryOp::Add, squares, Scalar::Float(1.0, Dtype::F32))),
        Dtype::F32,
    );
    let norm = binary(
        BinaryOp::Sub,
        binary(BinaryOp::Mul, x(index(0), index(1)), scale),
        reduce(ReduceOp::Max, 3, x(index(0), index(3))),
    );
    let of_row_one = binary(
        BinaryOp::Div,
        x(Scalar::Int(1, Dtype::I64), index(0)),
        reduce(ReduceOp::Sum, 1, x(Scalar::Int(2, Dtype::I64), index(1))),
    );
    let computed = vec![
        Node { kind: NodeKind::Compute(norm), shape: dims(&[rows, columns]), dtype: Dtype::Bf16, source: None },
        Node { kind: NodeKind::Compute(of_row_one), shape: dims(&[columns]), dtype: Dtype::F32, source: None },
    ];
    let entry = entry_of("rows", &[("x", vec![rows, columns], Dtype::F32)], computed);
    for at in 1..3 {
        let kernel = &linnet_gpu::node_kernels(ModelEntry { entry: &entry, params: &[] }, at, Form::Host)
            .expect("a compute node has a kernel")
            .expect("it builds")[0];
        assert_eq!(kernel.lanes, WARP_LANES, "node {at} is not a row kernel: this test covers less than it says");
    }
    let model = Model { name: "rows".into(), params: Vec::new(), states: Vec::new(), entries: vec![entry] };
    let input = || vec![Tensor::from_f32(Dtype::F32, vec![rows, columns], wave(rows * columns, 0, 2.0))];
    let reference =
        linnet_exec::interp::machine(model.clone(), Vec::new()).call("rows", input()).expect("the reference runs");
    let computed = Machine::new(model, Vec::new(), MlirHost::default())
        .expect("the kernels build")
        .call("rows", input())
        .expect("the kernels run");
    // bf16 (a rounding may fall the other way), then f32.
    for (output, ((expected, got), tolerance)) in reference.iter().zip(&computed).zip([1e-2, 1e-5]).enumerate() {
        let (expected, got) = (expected.widened(), got.widened());
        let (expected, got) = (expected.as_f32().unwrap(), got.as_f32().unwrap());
        assert_eq!(expected.len(), got.len());
        for (at, (e, g)) in expected.iter().zip(got).enumerate() {
            assert!(
                (e - g).abs() <= tolerance * (1.0 + e.abs()),
                "output {output}, element {at}: {g}, the reference {e}"
            );
        }
    }
}

/// Attention as warps (`gpu::intrinsic`'s online softmax), run on the
/// host, against the reference: a head width that is no multiple of a
/// warp (a lane's last element past it), more keys than lanes, grouped
/// heads, a causal mask and a query row it admits no key of; without
/// sinks and with them.
#[test]
fn attention_in_warps_meets_the_reference() {
    let (heads, kv_heads, queries, keys, width) = (4usize, 2usize, 3usize, 37usize, 40usize);
    // Row 0 admits no key; row 1 the keys up to 20; row 2 every key.
    let mask: Vec<bool> = (0..queries * keys).map(|at| (at / keys == 1 && at % keys <= 20) || at / keys == 2).collect();
    for sinks in [false, true] {
        let mask_dims = if sinks { vec![1, queries, keys] } else { vec![queries, keys] };
        let inputs = attention_inputs([1, heads, kv_heads, queries, keys, width], mask_dims, Dtype::Bf16, sinks);
        let model = attention_model(&inputs, Dtype::Bf16);
        let kernel =
            &linnet_gpu::node_kernels(ModelEntry { entry: &model.entries[0], params: &[] }, inputs.len(), Form::Host)
                .expect("an intrinsic has a kernel")
                .expect("it builds")[0];
        assert_eq!(kernel.lanes, WARP_LANES, "attention is not in warps: this test covers less than it says");
        // bf16: a rounding may fall the other way.
        attention_meets_the_reference(model, &inputs, mask.clone(), 1e-2);
    }
}

/// The inputs of an attention node over `[batch, heads, kv_heads,
/// queries, keys, width]`: q, k and v of `dtype`, the scale, the mask of
/// `mask_dims`, and a logit per head where there are `sinks`.
fn attention_inputs(
    [batch, heads, kv_heads, queries, keys, width]: [usize; 6],
    mask_dims: Vec<usize>,
    dtype: Dtype,
    sinks: bool,
) -> Vec<(&'static str, Vec<usize>, Dtype)> {
    let mut inputs = vec![
        ("q", vec![batch, heads, queries, width], dtype),
        ("k", vec![batch, kv_heads, keys, width], dtype),
        ("v", vec![batch, kv_heads, keys, width], dtype),
        ("scale", Vec::new(), Dtype::F32),
        ("mask", mask_dims, Dtype::Bool),
    ];
    if sinks {
        inputs.push(("sinks", vec![heads], Dtype::F32));
    }
    inputs
}

/// Entry `attend` of `inputs` (as [`attention_inputs`] makes them): the
/// attention intrinsic they are the arguments of (`grouped_attention`
/// with a mask `[Q, K]`, `grouped_attention_rows` with `[B, Q, K]`,
/// `grouped_attention_sinks` with sinks).
fn attention_model(inputs: &[(&str, Vec<usize>, Dtype)], dtype: Dtype) -> Model {
    let intrinsic = match (inputs.len(), inputs[4].1.len()) {
        (6, _) => Intrinsic::GroupedAttentionSinks,
        (_, 3) => Intrinsic::GroupedAttentionRows,
        _ => Intrinsic::GroupedAttention,
    };
    let attention = Node {
        kind: NodeKind::Intrinsic(intrinsic, (0..inputs.len() as u32).map(Value).collect()),
        shape: dims(&inputs[0].1),
        dtype,
        source: None,
    };
    let entry = entry_of("attend", inputs, vec![attention]);
    Model { name: "attend".into(), params: Vec::new(), states: Vec::new(), entries: vec![entry] }
}

/// Runs attention model `model` (its entry `attend` of `inputs`: q, k, v
/// as waves, the scale 0.3, `mask`, and sinks from -6 to 6 (a head's sink may outweigh its keys)
/// where it has them) on the reference and on the GPU kernels run on the
/// host: every element within `tolerance` (relative to one more than its
/// size).
fn attention_meets_the_reference(model: Model, inputs: &[(&str, Vec<usize>, Dtype)], mask: Vec<bool>, tolerance: f32) {
    let call = || {
        let mut call: Vec<Tensor> = inputs[..3]
            .iter()
            .enumerate()
            .map(|(phase, (_, dims, dtype))| {
                Tensor::from_f32(*dtype, dims.clone(), wave(dims.iter().product(), phase * 11, 1.0))
            })
            .collect();
        call.push(Tensor::from_f32(Dtype::F32, Vec::new(), vec![0.3]));
        call.push(Tensor { dtype: Dtype::Bool, shape: inputs[4].1.clone(), data: Data::Bool(mask.clone()) });
        if let Some((_, dims, dtype)) = inputs.get(5) {
            call.push(Tensor::from_f32(*dtype, dims.clone(), wave(dims[0], 7, 6.0)));
        }
        call
    };
    let reference =
        linnet_exec::interp::machine(model.clone(), Vec::new()).call("attend", call()).expect("the reference runs");
    let computed = Machine::new(model, Vec::new(), MlirHost::default())
        .expect("the kernels build")
        .call("attend", call())
        .expect("the kernels run");
    let (expected, got) = (reference[0].widened(), computed[0].widened());
    let (expected, got) = (expected.as_f32().unwrap(), got.as_f32().unwrap());
    assert_eq!(expected.len(), got.len());
    for (at, (e, g)) in expected.iter().zip(got).enumerate() {
        assert!((e - g).abs() <= tolerance * (1.0 + e.abs()), "element {at}: {g}, the reference {e}");
    }
}

/// Attention of one query per row (a decode step's) as `gpu::attention`
/// splits it: each mask row's chunks' ends first, then parts of a row's
/// keys walked by warps of their own, then the parts combined; run on the
/// host, against the reference (f32, so that a key left out shows): keys
/// over two mask chunks, a mask with holes, a batch row that admits no
/// key (every key weighs alike, or against a sink none) and one that
/// admits only the first; without sinks and with them.
#[test]
fn attention_split_over_keys_meets_the_reference() {
    let (batch, heads, kv_heads, keys, width) = (3usize, 4usize, 2usize, 1100usize, 40usize);
    // Row 0 admits the keys up to 1050 but every 7th; row 1 none; row 2
    // key 0 alone.
    let mask: Vec<bool> = (0..batch * keys).map(|at| (at <= 1050 && at % 7 != 3) || at == 2 * keys).collect();
    for sinks in [false, true] {
        let inputs =
            attention_inputs([batch, heads, kv_heads, 1, keys, width], vec![batch, 1, keys], Dtype::F32, sinks);
        let model = attention_model(&inputs, Dtype::F32);
        let kernels =
            linnet_gpu::node_kernels(ModelEntry { entry: &model.entries[0], params: &[] }, inputs.len(), Form::Host)
                .expect("an intrinsic has kernels")
                .expect("they build");
        assert_eq!(
            kernels.len(),
            3,
            "attention of one query is not split over its keys: this test covers less than it says"
        );
        attention_meets_the_reference(model, &inputs, mask.clone(), 1e-5);
    }
}

/// The delta rule over a span (`gpu::delta`: a warp per state column
/// walking the tokens), run on the host, against the reference: a key
/// width that is no multiple of a warp, 37 tokens, grouped heads, two
/// batch rows; every token's read and the final state.
#[test]
fn the_delta_rule_over_a_span_meets_the_reference() {
    assert_eq!(delta_rule_meets_the_reference(Some(37)), 1);
}

/// A decode step of the delta rule (`gpu::delta`: a state column's cells
/// in a warp's lanes), run on the host, against the reference.
#[test]
fn a_step_of_the_delta_rule_meets_the_reference() {
    assert_eq!(delta_rule_meets_the_reference(None), 1);
}

/// Batch invariance of the delta rule's kernels: a span of 37 tokens
/// taken whole, in two parts (the second from the first's final state,
/// as a prefill after the prefix cache takes it), and its first token as
/// a decode step, give the same bits: every token's read and the final
/// state.
#[test]
fn the_delta_rule_in_parts_gives_the_bits_of_the_whole_span() {
    let (span, first) = (37usize, 20usize);
    let run = |tokens: Option<usize>, call: Vec<Tensor>| {
        let (model, _) = delta_model(tokens);
        let mut machine = Machine::new(model, Vec::new(), MlirHost::default()).expect("the kernels build");
        machine.call("delta", call).expect("the kernels run").remove(0)
    };
    let (_, inputs) = delta_model(Some(span));
    let whole_call = delta_call(&inputs);
    let whole = run(Some(span), whole_call.clone());
    // Tokens `range` of each per-token input, and `state` in place of the state.
    let part = |range: std::ops::Range<usize>, state: Tensor| -> Vec<Tensor> {
        let mut call: Vec<Tensor> = whole_call[..5].iter().map(|tensor| tokens_of(tensor, range.clone())).collect();
        call.extend([state, whole_call[6].clone()]);
        call
    };
    let head = run(Some(first), part(0..first, whole_call[5].clone()));
    // The output's rows past the tokens are the state `[B, KD, VH, VD]`;
    // the input state is `[B, VH, KD, VD]`.
    let rows = tokens_of(&head, first..head.shape[1]);
    let [batch, key_width, heads, width] = rows.shape[..] else { unreachable!("four axes") };
    let values = rows.as_f32().unwrap();
    let state: Vec<f32> = (0..batch * heads * key_width * width)
        .map(|at| {
            let (b, h, i, j) = (
                at / (heads * key_width * width),
                at / (key_width * width) % heads,
                at / width % key_width,
                at % width,
            );
            values[((b * key_width + i) * heads + h) * width + j]
        })
        .collect();
    let state = Tensor::from_f32(Dtype::F32, vec![batch, heads, key_width, width], state);
    let tail = run(Some(span - first), part(first..span, state));
    let bits = |tensor: &Tensor| tensor.as_f32().unwrap().iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&tokens_of(&whole, 0..first)), bits(&tokens_of(&head, 0..first)), "the first part's reads");
    assert_eq!(bits(&tokens_of(&whole, first..whole.shape[1])), bits(&tail), "the second part's reads and the state");
    // The first token as a decode step: the step's operands have no token axis.
    let mut step_call: Vec<Tensor> = part(0..1, whole_call[5].clone());
    for tensor in &mut step_call[..5] {
        tensor.shape.remove(1);
    }
    let step = run(None, step_call);
    assert_eq!(bits(&tokens_of(&whole, 0..1)), bits(&tokens_of(&step, 0..1)), "the first token's read as a step");
}

/// An entry's input: its name, shape and type.
type NamedInput = (&'static str, Vec<usize>, Dtype);

/// The delta rule's node over `span` tokens (`gated_delta_step` where
/// none) as a model of one entry, `delta`, and its inputs (name, shape,
/// type): two batch rows, grouped heads, a key width no multiple of a
/// warp.
fn delta_model(span: Option<usize>) -> (Model, Vec<NamedInput>) {
    let (batch, key_heads, value_heads, key_width, value_width) = (2usize, 2usize, 4usize, 40usize, 5usize);
    let tokens: Vec<usize> = span.into_iter().collect();
    let shape = |rest: &[usize]| [&[batch][..], &tokens, rest].concat();
    let inputs = vec![
        ("q", shape(&[key_heads, key_width]), Dtype::Bf16),
        ("k", shape(&[key_heads, key_width]), Dtype::Bf16),
        ("v", shape(&[value_heads, value_width]), Dtype::Bf16),
        ("decay", shape(&[value_heads]), Dtype::F32),
        ("beta", shape(&[value_heads]), Dtype::F32),
        ("state", vec![batch, value_heads, key_width, value_width], Dtype::F32),
        ("scale", Vec::new(), Dtype::F32),
    ];
    let out = dims(&[batch, span.unwrap_or(1) + key_width, value_heads, value_width]);
    let intrinsic = if span.is_some() { Intrinsic::GatedDeltaRule } else { Intrinsic::GatedDeltaStep };
    let delta = Node {
        kind: NodeKind::Intrinsic(intrinsic, (0..7).map(Value).collect()),
        shape: out,
        dtype: Dtype::F32,
        source: None,
    };
    let entry = entry_of("delta", &inputs, vec![delta]);
    (Model { name: "delta".into(), params: Vec::new(), states: Vec::new(), entries: vec![entry] }, inputs)
}

/// A call of [`delta_model`]'s entry: keys and queries of unit scale over
/// the width, decays below 0, rates in 0..1, the scale 0.15.
fn delta_call(inputs: &[NamedInput]) -> Vec<Tensor> {
    let sizes = [0.2, 0.2, 1.0, 0.5, 0.5, 1.0];
    let mut call: Vec<Tensor> = inputs[..6]
        .iter()
        .zip(sizes)
        .enumerate()
        .map(|(phase, ((name, dims, dtype), size))| {
            let mut values = wave(dims.iter().product(), phase * 13, size);
            if *name == "decay" {
                values.iter_mut().for_each(|x| *x = -x.abs());
            } else if *name == "beta" {
                values.iter_mut().for_each(|x| *x = x.abs());
            }
            Tensor::from_f32(*dtype, dims.clone(), values)
        })
        .collect();
    call.push(Tensor::from_f32(Dtype::F32, Vec::new(), vec![0.15]));
    call
}

/// Rows `range` of the second axis of `tensor` (a batch's tokens), in
/// its type.
fn tokens_of(tensor: &Tensor, range: std::ops::Range<usize>) -> Tensor {
    let (batch, rows) = (tensor.shape[0], tensor.shape[1]);
    let row: usize = tensor.shape[2..].iter().product();
    let values = tensor.as_f32().unwrap();
    let taken: Vec<f32> = (0..batch)
        .flat_map(|b| values[(b * rows + range.start) * row..(b * rows + range.end) * row].to_vec())
        .collect();
    let mut shape = tensor.shape.clone();
    shape[1] = range.len();
    Tensor::from_f32(tensor.dtype, shape, taken)
}

/// Runs `gated_delta_rule` over `span` tokens (`gated_delta_step` where
/// none) on the reference and on the GPU kernels run on the host, and
/// compares every element (f32, so that a token left out shows); the
/// node's kernels.
fn delta_rule_meets_the_reference(span: Option<usize>) -> usize {
    let (model, inputs) = delta_model(span);
    let kernels = linnet_gpu::node_kernels(ModelEntry { entry: &model.entries[0], params: &[] }, 7, Form::Host)
        .expect("an intrinsic has kernels")
        .expect("they build");
    assert!(
        kernels.iter().all(|kernel| kernel.lanes == WARP_LANES),
        "the delta rule is not in warps: this test covers less than it says"
    );
    let reference = linnet_exec::interp::machine(model.clone(), Vec::new())
        .call("delta", delta_call(&inputs))
        .expect("the reference runs");
    let computed = Machine::new(model, Vec::new(), MlirHost::default())
        .expect("the kernels build")
        .call("delta", delta_call(&inputs))
        .expect("the kernels run");
    let (expected, got) = (reference[0].as_f32().unwrap(), computed[0].as_f32().unwrap());
    assert_eq!(expected.len(), got.len());
    for (at, (e, g)) in expected.iter().zip(got).enumerate() {
        assert!((e - g).abs() <= 1e-5 * (1.0 + e.abs()), "element {at}: {g}, the reference {e}");
    }
    kernels.len()
}

/// Parameters stored in blocks (`gpu::decode`), run on the host: a
/// contraction's runs (an identity against the weights gives back every
/// weight, exactly: one product of 1 each, the rest of 0, summed from +0)
/// and single
/// elements (a copy) decode each format bit for bit as the reference
/// dequantizes it, from blocks of arbitrary levels and scales; and ptxas
/// accepts both kernels of every format.
#[test]
fn parameters_in_blocks_read_their_values_exactly() {
    use linnet_ir::quant::{arbitrary_blocks, dequantize};
    use linnet_ir::Param;
    let (columns, depth) = (3usize, 512usize);
    let index = |k: u32| Scalar::Index(k, Dtype::I64);
    let product = Scalar::Reduce {
        op: ReduceOp::Sum,
        index: 2,
        extent: Dim::constant(depth as i64),
        body: Box::new(Scalar::Binary(
            BinaryOp::Mul,
            Box::new(Scalar::Load(Value(0), vec![index(0), index(2)], Dtype::F32)),
            Box::new(Scalar::Load(Value(1), vec![index(1), index(2)], Dtype::F32)),
            Dtype::F32,
        )),
        dtype: Dtype::F32,
    };
    let copy = Scalar::Load(Value(1), vec![index(0), index(1)], Dtype::F32);
    let mut entry = entry_of("blocks", &[("x", vec![depth, depth], Dtype::F32)], Vec::new());
    entry.nodes.push(Node {
        kind: NodeKind::Param(0),
        shape: dims(&[columns, depth]),
        dtype: Dtype::F32,
        source: None,
    });
    for (scalar, shape) in [(product, [depth, columns]), (copy, [columns, depth])] {
        entry.nodes.push(Node {
            kind: NodeKind::Compute(scalar),
            shape: dims(&shape),
            dtype: Dtype::F32,
            source: None,
        });
    }
    entry.outputs = vec![Value(2), Value(3)];
    assert!(contraction::of(&entry, 2).is_some(), "the product is no contraction: this test covers less than it says");
    let identity: Vec<f32> = (0..depth * depth).map(|at| f32::from(u8::from(at / depth == at % depth))).collect();
    for (seed, format) in BlockFormat::ALL.into_iter().enumerate() {
        let param = Param {
            path: "w".into(),
            shape: vec![columns, depth],
            dtype: Dtype::F32,
            storage: Some(format),
            axes: None,
            tiled: None,
        };
        let model =
            Model { name: "blocks".into(), params: vec![param], states: Vec::new(), entries: vec![entry.clone()] };
        let blocks = arbitrary_blocks(format, columns * depth / format.block_values(), seed as u64 + 3);
        let mut values = vec![0f32; columns * depth];
        dequantize(format, &blocks, &mut values).unwrap();
        let weights =
            Tensor { dtype: Dtype::F32, shape: vec![columns, depth], data: Data::Blocks(format, blocks.into()) };
        let mut host = Machine::new(model.clone(), vec![weights], MlirHost::default()).expect("the kernels build");
        let x = Tensor::from_f32(Dtype::F32, vec![depth, depth], identity.clone());
        let outputs = host.call("blocks", vec![x]).expect("the kernels run");
        let (product, copy) = (outputs[0].as_f32().unwrap(), outputs[1].as_f32().unwrap());
        for (at, value) in values.iter().enumerate() {
            let (n, k) = (at / depth, at % depth);
            assert_eq!(copy[at].to_bits(), value.to_bits(), "{format}: element {n}, {k} read alone");
            // A sum from +0 gives -0 as +0.
            assert_eq!(
                product[k * columns + n].to_bits(),
                (value + 0.0).to_bits(),
                "{format}: element {n}, {k} in a run"
            );
        }
        let built = built_whole(&model);
        ptxas_accepts(&built.entries);
    }
}
