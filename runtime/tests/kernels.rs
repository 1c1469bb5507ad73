//! The standard library's kernels (attention that skips masked keys, cache
//! writes in place) compute exactly what the Linnet bodies they replace
//! compute, and fusion changes no result: every entry path gives
//! bit-identical results with and without them, f32 and bf16.

use linnet_compiler::driver::lower_package_with;
use linnet_compiler::interp::{Machine, Tensor};
use linnet_compiler::lower::Lowering;
use linnet_compiler::package::LoadOptions;
use linnet_compiler::sema::ty::Dtype;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn machine(config: &str, dtype: &str, lowering: Lowering) -> Machine {
    let dir = root().join("tests/fixtures/oracle").join(config);
    let options = LoadOptions { nest: Some(dir.join(format!("package/nest-{dtype}.toml"))), stdlib: Some(root().join("stdlib")), ..LoadOptions::default() };
    let (model, checked) = lower_package_with(&root().join("models/qwen3.6-35b-a3b"), &options, lowering).unwrap_or_else(|_| panic!("lowers"));
    let package = checked.package.unwrap();
    let params = linnet_runtime::weights::load(&model, &linnet_runtime::bindings(&package), &dir.join(format!("weights-{dtype}")), &[]).unwrap();
    Machine::new(model, params)
}

fn ints(shape: Vec<usize>, values: Vec<i64>) -> Tensor {
    Tensor::from_i64(Dtype::I32, shape, values)
}

/// The outputs of a fixed script of calls through every entry.
fn script(machine: &mut Machine) -> Vec<Tensor> {
    let mut out = Vec::new();
    let mut call = |machine: &mut Machine, entry: &str, inputs: Vec<Tensor>| out.extend(machine.call(entry, inputs).unwrap());
    call(machine, "forward", vec![ints(vec![2, 5], vec![5, 17, 42, 9, 300, 1, 2, 3, 4, 511])]);
    call(machine, "next_token", vec![ints(vec![1, 4], vec![7, 8, 9, 10])]);
    call(machine, "prefill", vec![ints(vec![2, 4], vec![5, 17, 42, 9, 1, 2, 3, 4]), ints(vec![], vec![0])]);
    for position in 4..8 {
        call(machine, "decode", vec![ints(vec![2, 1], vec![position * 3, position * 5]), ints(vec![], vec![position])]);
    }
    call(machine, "prefill_slots", vec![ints(vec![2, 3], vec![11, 12, 13, 21, 22, 0]), ints(vec![2], vec![1, 0]), ints(vec![2], vec![3, 2])]);
    for step in 0..3 {
        call(machine, "decode_rows", vec![ints(vec![2, 1], vec![30 + step, 40 + step]), ints(vec![2], vec![2 + step, 3 + step])]);
    }
    out
}

#[test]
fn kernels_equal_the_bodies_they_replace() {
    for (config, dtype) in [("tiny-qwen3.5-moe", "f32"), ("tiny-qwen3.5-moe-calm", "bf16")] {
        let with_kernels = script(&mut machine(config, dtype, Lowering::default()));
        let inlined = script(&mut machine(config, dtype, Lowering { library_kernels: false, ..Lowering::default() }));
        assert_eq!(with_kernels.len(), inlined.len());
        for (at, (a, b)) in with_kernels.iter().zip(&inlined).enumerate() {
            assert_eq!(a, b, "{config} {dtype}: output {at} differs");
        }
    }
}

/// Native code from Cranelift computes bit for bit what the interpreter
/// computes, through every entry path, f32 and bf16.
#[test]
fn the_cpu_backend_equals_the_interpreter() {
    use linnet_compiler::interp::Backend;
    for (config, dtype) in [("tiny-qwen3.5-moe", "f32"), ("tiny-qwen3.5-moe-calm", "bf16")] {
        let started = std::time::Instant::now();
        let native = script(&mut machine(config, dtype, Lowering::default()).with_backend(Backend::Cpu));
        let native_time = started.elapsed();
        let started = std::time::Instant::now();
        let reference = script(&mut machine(config, dtype, Lowering::default()));
        eprintln!("{config} {dtype}: cpu {native_time:?} (compiling included), interp {:?}", started.elapsed());
        for (at, (a, b)) in native.iter().zip(&reference).enumerate() {
            assert_eq!(a, b, "{config} {dtype}: output {at} differs");
        }
    }
}

/// Values inlined into their consumers give the results they gave stored,
/// on both backends, and the fused model has fewer nodes.
#[test]
fn fusion_changes_no_result() {
    use linnet_compiler::interp::Backend;
    for (config, dtype) in [("tiny-qwen3.5-moe", "f32"), ("tiny-qwen3.5-moe-calm", "bf16")] {
        let unfused = Lowering { fuse: false, ..Lowering::default() };
        let (fused_nodes, unfused_nodes) = (nodes(&machine(config, dtype, Lowering::default())), nodes(&machine(config, dtype, unfused)));
        assert!(fused_nodes * 10 < unfused_nodes * 8, "fusion removes over a fifth of the nodes: {fused_nodes} of {unfused_nodes} left");
        let reference = script(&mut machine(config, dtype, unfused));
        for backend in [Backend::Interp, Backend::Cpu] {
            let fused = script(&mut machine(config, dtype, Lowering::default()).with_backend(backend));
            for (at, (a, b)) in fused.iter().zip(&reference).enumerate() {
                assert_eq!(a, b, "{config} {dtype} {backend:?}: output {at} differs");
            }
        }
    }
}

fn nodes(machine: &Machine) -> usize {
    machine.model().entries.iter().map(|e| e.nodes.len()).sum()
}
