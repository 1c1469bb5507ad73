//! The NVPTX target without a GPU: every node of a model becomes an MLIR
//! kernel, MLIR lowers it to PTX, and `ptxas` (from the PyPI wheel
//! `nvidia-cuda-nvcc-cu12`, which `scripts/install-gpu-tools.sh` unpacks)
//! accepts every one for sm_90; a model with intrinsics is refused with
//! each missing kernel named. Built only with `--features nvptx`.
#![cfg(feature = "nvptx")]

use linnet_compiler::driver::lower_package;
use linnet_compiler::package::LoadOptions;
use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// The CUDA compiler pieces: `LINNET_CUDA_NVCC`, else where the set-up
/// script unpacks them.
fn cuda_nvcc() -> PathBuf {
    std::env::var_os("LINNET_CUDA_NVCC").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/opt/linnet-cuda/nvidia/cuda_nvcc"))
}

#[test]
fn every_node_of_the_tiny_mlp_is_ptx_that_ptxas_accepts() {
    let options = LoadOptions { stdlib: Some(root().join("stdlib")), ..LoadOptions::default() };
    let (model, _) = lower_package(&root().join("examples/tiny-mlp"), &options).unwrap_or_else(|_| panic!("lowers"));
    let libdevice = cuda_nvcc().join("nvvm/libdevice/libdevice.10.bc");
    assert!(libdevice.is_file(), "{} is missing: run scripts/install-gpu-tools.sh", libdevice.display());
    let built = linnet_compiler::gpu::build(&model, "sm_90", Some(&libdevice)).unwrap_or_else(|error| panic!("{error}"));
    assert!(built.missing.is_empty(), "{}", built.missing.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"));
    assert_eq!(built.entries.len(), model.entries.len());
    ptxas_accepts(&built.entries);
}

/// `ptxas -arch=sm_90` accepts every PTX text.
fn ptxas_accepts(entries: &[linnet_compiler::gpu::EntryPtx]) {
    let scratch = std::env::temp_dir().join(format!("linnet-ptx-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    for entry in entries {
        assert!(!entry.kernels.is_empty());
        for (at, ptx) in entry.ptx.iter().enumerate() {
            assert!(ptx.contains(".target sm_90"), "{ptx}");
            let path = scratch.join(format!("{}-{at}.ptx", entry.entry));
            std::fs::write(&path, ptx).unwrap();
            let checked = Command::new(cuda_nvcc().join("bin/ptxas")).args(["-arch=sm_90", "-o"]).arg(path.with_extension("cubin")).arg(&path).output().expect("ptxas runs");
            assert!(checked.status.success(), "ptxas refused {}: {}", path.display(), String::from_utf8_lossy(&checked.stderr));
        }
    }
    std::fs::remove_dir_all(&scratch).unwrap();
}

/// The seed at the bf16 oracle's sizes: every `Compute` node of every
/// entry (bf16 rounding, Euclidean division, lazy selects, reductions,
/// gathers) is PTX that ptxas accepts; the intrinsics are named missing.
#[test]
fn the_seeds_compute_nodes_are_ptx_and_its_intrinsics_are_named_missing() {
    let card = root().join("tests/fixtures/oracle/tiny-qwen3.5-moe-calm/package/nest-bf16.toml");
    let options = LoadOptions { stdlib: Some(root().join("stdlib")), nest: Some(card), ..LoadOptions::default() };
    let (model, _) = lower_package(&root().join("models/qwen3.6-35b-a3b"), &options).unwrap_or_else(|_| panic!("lowers"));
    let libdevice = cuda_nvcc().join("nvvm/libdevice/libdevice.10.bc");
    let built = linnet_compiler::gpu::build(&model, "sm_90", Some(&libdevice)).unwrap_or_else(|error| panic!("{error}"));
    let computes: usize = model.entries.iter().map(|e| e.nodes.iter().filter(|n| matches!(n.kind, linnet_compiler::ir::NodeKind::Compute(_))).count()).sum();
    assert_eq!(built.entries.iter().map(|e| e.kernels.len()).sum::<usize>(), computes);
    ptxas_accepts(&built.entries);
    let text: Vec<String> = built.missing.iter().map(ToString::to_string).collect();
    assert!(text.iter().all(|e| e.contains("yet")), "{text:?}");
    assert!(text.iter().any(|e| e.contains("no GPU kernel for `grouped_attention` yet")), "{text:?}");
    assert!(text.iter().any(|e| e.contains("gated_delta")), "{text:?}");
}

/// Parameters for `model`, drawn from a fixed sequence in [-0.1, 0.1).
fn parameters(model: &linnet_compiler::ir::Model) -> Vec<linnet_compiler::tensor::Tensor> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    model
        .params
        .iter()
        .map(|param| {
            let count: usize = param.shape.iter().product();
            let values = (0..count)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.2
                })
                .collect();
            linnet_compiler::tensor::Tensor::from_f32(param.dtype, param.shape.clone(), values)
        })
        .collect()
}

/// The kernels' bodies lowered by MLIR for the host and run with its
/// execution engine give the interpreter's results within the contract,
/// for the seed in f32 and bf16, through `forward` and through `prefill`
/// then `decode`: a wrong index, reduction or rounding in a GPU kernel
/// fails here, without a GPU.
#[test]
fn the_kernels_run_on_the_host_within_the_contract() {
    use linnet_compiler::exec::Machine;
    use linnet_compiler::sema::ty::Dtype;
    use linnet_compiler::tensor::Tensor;
    for card in ["tiny-qwen3.5-moe/package/nest-f32.toml", "tiny-qwen3.5-moe-calm/package/nest-bf16.toml"] {
        let card = root().join("tests/fixtures/oracle").join(card);
        let options = LoadOptions { stdlib: Some(root().join("stdlib")), nest: Some(card.clone()), ..LoadOptions::default() };
        let (model, _) = lower_package(&root().join("models/qwen3.6-35b-a3b"), &options).unwrap_or_else(|_| panic!("lowers"));
        let params = parameters(&model);
        let rows = model.entry("decode").expect("a decode entry").inputs[0].shape[0].as_constant().expect("fixed rows") as usize;
        let script = |machine: &mut Machine| -> Vec<Tensor> {
            let tokens = |values: Vec<i64>, shape: Vec<usize>| Tensor::from_i64(Dtype::I32, shape, values);
            let mut outputs = machine.call("forward", vec![tokens(vec![5, 17, 42, 7], vec![1, 4])]).unwrap();
            let prompt: Vec<i64> = (0..rows).flat_map(|_| [3, 9, 27]).collect();
            outputs.extend(machine.call("prefill", vec![tokens(prompt, vec![rows, 3]), tokens(vec![0], vec![])]).unwrap());
            outputs.extend(machine.call("decode", vec![tokens(vec![11; rows], vec![rows, 1]), tokens(vec![3], vec![])]).unwrap());
            outputs
        };
        let reference = script(&mut linnet_compiler::interp::machine(model.clone(), params.clone()));
        let mut host = Machine::new(model, params, linnet_compiler::gpu::host::MlirHost::default()).unwrap_or_else(|e| panic!("{e}"));
        let outputs = script(&mut host);
        for (at, (reference, output)) in reference.iter().zip(&outputs).enumerate() {
            let finite = reference.widened().as_f32().is_some_and(|values| values.iter().all(|v| v.is_finite()));
            assert!(finite, "{}: output {at} of the reference is not all finite: the comparison would say nothing", card.display());
            let worst = linnet_compiler::tolerance::compare(reference, output).unwrap_or_else(|mismatch| panic!("{}: output {at}: {mismatch}", card.display()));
            eprintln!("{}: output {at} within {worst:.2e} of the scale", card.display());
        }
    }
}
