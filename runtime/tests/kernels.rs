//! The standard library's kernels (attention that skips masked keys, with
//! sinks or without; cache writes in place) compute exactly what the
//! Linnet bodies they replace compute, and fusion changes no result, on
//! the interpreter: every entry path gives bit-identical results with and
//! without them, f32 and bf16, for the seed and for gpt-oss (attention
//! with sinks, over rings).
//! The CPU backend meets the numerics contract against the interpreter
//! (`linnet_exec::tolerance`) on every path, runs every node as native
//! code (nothing falls back), gives the same bits whether it carries the
//! DeltaNet states in place or not, and a deliberately wrong kernel fails
//! the contract.

use linnet_cpu::Cpu;
use linnet_cranelift::Elementwise;
use linnet_exec::tensor::{Data, Tensor};
use linnet_exec::{Backend, BuildError, Machine, MemoryError, NodeError, Site, Values};
use linnet_frontend::driver::lower_package_with;
use linnet_frontend::lower::Lowering;
use linnet_frontend::package::{Checkpoint, LoadOptions};
use linnet_ir::analysis::Analysis;
use linnet_ir::Dtype;
use linnet_ir::{Intrinsic, Model};

mod common;

use common::root;

/// A model the suite runs: the seed at an oracle's card, or gpt-oss at its
/// tiny checkpoint's `config.json` (sinks, sliding layers on rings of 5),
/// two batch rows.
#[derive(Clone, Copy, Debug)]
enum Case {
    Seed { config: &'static str, dtype: &'static str },
    GptOss,
}

const SEED_F32: Case = Case::Seed { config: "tiny-qwen3.5-moe", dtype: "f32" };
const SEED_BF16: Case = Case::Seed { config: "tiny-qwen3.5-moe-calm", dtype: "bf16" };

/// Every model the suite runs.
const CASES: [Case; 3] = [SEED_F32, SEED_BF16, Case::GptOss];

/// The model of `case` lowered with `lowering`, and its weights.
fn model(case: Case, lowering: Lowering) -> (Model, Vec<Tensor>) {
    let (package, options, weights) = match case {
        Case::Seed { config, dtype } => {
            let dir = root().join("tests/fixtures/oracle").join(config);
            let options = LoadOptions {
                nest: Some(dir.join(format!("package/nest-{dtype}.toml"))),
                stdlib: Some(root().join("stdlib")),
                ..LoadOptions::default()
            };
            ("models/qwen3.6-35b-a3b", options, dir.join(format!("weights-{dtype}")))
        }
        Case::GptOss => {
            let weights = root().join("tests/fixtures/families/tiny-gpt-oss/weights-f32");
            let options = LoadOptions {
                checkpoint: Some(Checkpoint::Config(weights.join("config.json"))),
                overrides: vec![("Batch".into(), "2".into())],
                stdlib: Some(root().join("stdlib")),
                ..LoadOptions::default()
            };
            ("models/gpt-oss", options, weights)
        }
    };
    let (model, checked) =
        lower_package_with(&root().join(package), &options, lowering).unwrap_or_else(|_| panic!("{case:?} lowers"));
    let package = checked.package.unwrap();
    let params = linnet_runtime::weights::load(
        &model,
        &linnet_build::naming(&package),
        &weights,
        linnet_runtime::weights::NonFinite::Refuse,
    )
    .unwrap();
    (model, params)
}

fn machine(case: Case, lowering: Lowering, backend: linnet_runtime::BackendKind) -> Machine {
    let (model, params) = model(case, lowering);
    common::machine_on(backend, model, params)
}

/// Every output of `outputs` within the contract of the reference's.
fn within_contract(reference: &[Tensor], outputs: &[Tensor]) -> Result<f64, String> {
    assert_eq!(reference.len(), outputs.len());
    let mut worst = 0f64;
    for (at, (a, b)) in reference.iter().zip(outputs).enumerate() {
        worst =
            worst.max(linnet_exec::tolerance::compare(a, b).map_err(|mismatch| format!("output {at}: {mismatch}"))?);
    }
    Ok(worst)
}

/// As many outputs in `outputs` as in `expected`, each equal to its own.
fn assert_equal_outputs(outputs: &[Tensor], expected: &[Tensor], what: &str) {
    assert_eq!(outputs.len(), expected.len(), "{what}: outputs");
    for (at, (a, b)) in outputs.iter().zip(expected).enumerate() {
        assert_eq!(a, b, "{what}: output {at} differs");
    }
}

fn ints(shape: Vec<usize>, values: Vec<i64>) -> Tensor {
    Tensor::from_i64(Dtype::I32, shape, values)
}

/// The outputs of a fixed script of calls through every entry.
fn script(machine: &mut Machine) -> Vec<Tensor> {
    let mut out = Vec::new();
    let mut call =
        |machine: &mut Machine, entry: &str, inputs: Vec<Tensor>| out.extend(machine.call(entry, inputs).unwrap());
    // Tokens of every case's vocabulary (gpt-oss's has 256).
    call(machine, "forward", vec![ints(vec![2, 5], vec![5, 17, 42, 9, 200, 1, 2, 3, 4, 255])]);
    call(machine, "next_token", vec![ints(vec![1, 4], vec![7, 8, 9, 10])]);
    call(machine, "prefill", vec![ints(vec![2, 4], vec![5, 17, 42, 9, 1, 2, 3, 4]), ints(vec![], vec![0])]);
    for position in 4..8 {
        call(machine, "decode", vec![ints(vec![2, 1], vec![position * 3, position * 5]), ints(vec![], vec![position])]);
    }
    let (slots, starts, lengths) = (ints(vec![2], vec![1, 0]), ints(vec![2], vec![0, 0]), ints(vec![2], vec![3, 2]));
    call(machine, "prefill_slots", vec![ints(vec![2, 3], vec![11, 12, 13, 21, 22, 0]), slots, starts, lengths]);
    // Row 0 continued from position 2, as after a prefix cache's restore.
    let (slots, starts, lengths) = (ints(vec![1], vec![0]), ints(vec![1], vec![2]), ints(vec![1], vec![2]));
    call(machine, "prefill_slots", vec![ints(vec![1, 2], vec![23, 24]), slots, starts, lengths]);
    for step in 0..3 {
        call(
            machine,
            "decode_rows",
            vec![ints(vec![2, 1], vec![30 + step, 40 + step]), ints(vec![2], vec![4 + step, 3 + step])],
        );
    }
    out
}

#[test]
fn kernels_equal_the_bodies_they_replace() {
    let mut used = std::collections::BTreeSet::new();
    for case in CASES {
        let mut kernels = machine(case, Lowering::default(), Interp);
        used.extend(kernels.model().entries.iter().flat_map(|e| &e.nodes).filter_map(|node| match node.kind {
            linnet_ir::NodeKind::Intrinsic(intrinsic, _) => Some(intrinsic.name()),
            _ => None,
        }));
        let with_kernels = script(&mut kernels);
        let inlined = script(&mut machine(case, Lowering { library_kernels: false, ..Lowering::default() }, Interp));
        assert_equal_outputs(&with_kernels, &inlined, &format!("{case:?}"));
    }
    for kernel in ["grouped_attention", "grouped_attention_rows", "grouped_attention_sinks", "write_at", "write_slots"]
    {
        assert!(used.contains(kernel), "no case runs `{kernel}`: this test covers less than it says");
    }
}

use linnet_runtime::BackendKind::{self, Interp};

/// Compiled code meets the contract against the interpreter through every
/// entry path, f32 and bf16.
fn meets_the_contract(backend: BackendKind) {
    for case in CASES {
        let started = std::time::Instant::now();
        let compiled = script(&mut machine(case, Lowering::default(), backend));
        let compiled_time = started.elapsed();
        let started = std::time::Instant::now();
        let reference = script(&mut machine(case, Lowering::default(), Interp));
        let worst = within_contract(&reference, &compiled).unwrap_or_else(|e| panic!("{case:?}: {e}"));
        eprintln!(
            "{case:?}: {backend:?} {compiled_time:?} (compiling included), interp {:?}; worst {worst:.2e} of the scale",
            started.elapsed()
        );
    }
}

/// Fused code (values inlined into their consumers) compiled meets the
/// contract against the unfused model on the interpreter.
fn fused_code_meets_the_contract(backend: BackendKind) {
    for case in CASES {
        let unfused = Lowering { optimize: false, ..Lowering::default() };
        let reference = script(&mut machine(case, unfused, Interp));
        let compiled = script(&mut machine(case, Lowering::default(), backend));
        within_contract(&reference, &compiled).unwrap_or_else(|e| panic!("{case:?} fused on {backend:?}: {e}"));
    }
}

/// The suite, once per compiled backend.
macro_rules! conformance {
    ($name:ident, $backend:expr) => {
        mod $name {
            #[test]
            fn meets_the_contract() {
                super::meets_the_contract($backend);
            }

            #[test]
            fn fused_code_meets_the_contract() {
                super::fused_code_meets_the_contract($backend);
            }
        }
    };
}

common::for_each_compiled_backend!(conformance);

/// The router's ranks, written out pair by pair in the seed, are recognized
/// (`ir::ranking`) in every entry that routes, once per expert layer, so
/// the CPU backend sorts instead of comparing every pair; the contract
/// test above holds the result to the interpreter's.
#[test]
fn the_routers_ranks_are_recognized() {
    let (model, _) = model(SEED_F32, Lowering::default());
    let layers = model.params.iter().filter(|p| p.path.ends_with("mlp.gate_up_proj")).count();
    assert!(layers > 0);
    for entry in &model.entries {
        let analysis = linnet_ir::analysis::Analysis::of(entry);
        let rankings = analysis.ranking.iter().flatten().count();
        assert_eq!(rankings, layers, "entry `{}`", entry.name);
    }
}

/// Values inlined into their consumers give the results they gave stored,
/// bit for bit on the interpreter (compiled backends: the suite above);
/// and the fused model has fewer nodes.
#[test]
fn fusion_changes_no_result_on_the_interpreter() {
    for case in CASES {
        let unfused = Lowering { optimize: false, ..Lowering::default() };
        let (fused_nodes, unfused_nodes) =
            (nodes(&machine(case, Lowering::default(), Interp)), nodes(&machine(case, unfused, Interp)));
        assert!(
            fused_nodes * 10 < unfused_nodes * 8,
            "fusion removes over a fifth of the nodes: {fused_nodes} of {unfused_nodes} left"
        );
        let reference = script(&mut machine(case, unfused, Interp));
        let fused = script(&mut machine(case, Lowering::default(), Interp));
        assert_equal_outputs(&fused, &reference, &format!("{case:?} on the interpreter"));
    }
}

fn nodes(machine: &Machine) -> usize {
    machine.model().entries.iter().map(|e| e.nodes.len()).sum()
}

/// The CPU backend altered: one node's results scaled by `1 + skew` (a
/// kernel that is wrong by that much), and delta states carried in place
/// or not.
struct Altered {
    cpu: Cpu,
    entry: usize,
    node: usize,
    skew: f32,
    carries: bool,
}

impl Altered {
    fn carrying(carries: bool) -> Altered {
        Altered { cpu: Cpu::new(linnet_cranelift::Jit::default()), entry: usize::MAX, node: 0, skew: 0.0, carries }
    }
}

impl Backend for Altered {
    type Buffer = Tensor;
    fn name(&self) -> &'static str {
        "altered"
    }
    fn carries_delta_states(&self) -> bool {
        self.carries
    }
    fn delta_step_in_place(
        &mut self,
        site: Site<'_>,
        args: &[&Tensor],
        state: &mut Tensor,
    ) -> Result<Tensor, NodeError> {
        self.cpu.delta_step_in_place(site, args, state)
    }
    fn prepare(&mut self, model: &Model, analyses: &[Analysis]) -> Result<(), BuildError> {
        self.cpu.prepare(model, analyses)
    }
    fn upload(&mut self, tensor: Tensor) -> Result<Tensor, MemoryError> {
        self.cpu.upload(tensor)
    }
    fn download(&mut self, buffer: &Tensor) -> Result<Tensor, MemoryError> {
        self.cpu.download(buffer)
    }
    fn zeros(&mut self, dtype: Dtype, shape: &[usize]) -> Result<Tensor, MemoryError> {
        self.cpu.zeros(dtype, shape)
    }
    fn copy(&mut self, buffer: &Tensor) -> Result<Tensor, MemoryError> {
        self.cpu.copy(buffer)
    }
    fn compute(&mut self, site: Site<'_>, values: &Values<Tensor>) -> Result<Tensor, NodeError> {
        let mut out = self.cpu.compute(site, values)?;
        if (site.entry_number, site.at) == (self.entry, self.node) {
            let Data::F32(values) = &mut out.data else { panic!("the skewed node computes floats") };
            values.iter_mut().for_each(|v| *v *= 1.0 + self.skew);
        }
        Ok(out)
    }
    fn intrinsic(&mut self, site: Site<'_>, intrinsic: Intrinsic, args: &[&Tensor]) -> Result<Tensor, NodeError> {
        self.cpu.intrinsic(site, intrinsic, args)
    }
    fn write_cache(
        &mut self,
        site: Site<'_>,
        intrinsic: Intrinsic,
        cache: &mut Tensor,
        args: &[&Tensor],
    ) -> Result<(), NodeError> {
        self.cpu.write_cache(site, intrinsic, cache, args)
    }
}

/// The contract catches a kernel that is wrong by a little: the output
/// head's product of `forward` scaled by 1 + 1e-3 fails it, and by
/// 1 + 1e-6 (rounding-sized) passes.
#[test]
fn a_deliberately_wrong_kernel_fails_the_contract() {
    let (model, params) = model(SEED_F32, Lowering::default());
    let entry = model.entries.iter().position(|e| e.name == "forward").unwrap();
    let node = model.entries[entry].outputs[0].index();
    let tokens = vec![Tensor::from_i64(Dtype::I32, vec![2, 5], vec![5, 17, 42, 9, 300, 1, 2, 3, 4, 511])];
    let reference =
        linnet_exec::interp::machine(model.clone(), params.clone()).call("forward", tokens.clone()).unwrap();
    for (skew, passes) in [(1e-3, false), (1e-6, true)] {
        let skewed = Altered { entry, node, skew, ..Altered::carrying(true) };
        let outputs =
            Machine::new(model.clone(), params.clone(), skewed).unwrap().call("forward", tokens.clone()).unwrap();
        let verdict = within_contract(&reference, &outputs);
        assert_eq!(verdict.is_ok(), passes, "skew {skew}: {verdict:?}");
    }
}

/// The seed's decoding steps advance their DeltaNet states where they lie
/// (`ir::carry`): once per linear-attention layer in each entry that
/// steps, and nowhere else.
#[test]
fn the_decoding_steps_carry_their_states() {
    let (model, _) = model(SEED_F32, Lowering::default());
    let layers = model.params.iter().filter(|p| p.path.ends_with("linear_attn.A_log")).count();
    assert!(layers > 0);
    for entry in &model.entries {
        let analysis = Analysis::of(entry);
        let expected = if matches!(entry.name.as_str(), "decode" | "decode_rows") { layers } else { 0 };
        assert_eq!(analysis.carried.iter().flatten().count(), expected, "entry `{}`", entry.name);
        assert_eq!(analysis.carried_away.iter().filter(|away| **away).count(), 2 * expected, "entry `{}`", entry.name);
        let without = Analysis::of(entry).without_carries();
        assert!(without.carried.iter().all(Option::is_none) && !without.carried_away.contains(&true));
    }
}

/// A state carried in place is the state the step, its view and its
/// write make, to the bit: every entry path on the CPU backend gives the
/// same outputs whether it carries the DeltaNet states or not, f32 and
/// bf16, two rows at a time.
#[test]
fn carrying_states_in_place_changes_no_bit() {
    for case in [SEED_F32, SEED_BF16] {
        let (model, params) = model(case, Lowering::default());
        let [carried, written] = [true, false].map(|carries| {
            script(&mut Machine::new(model.clone(), params.clone(), Altered::carrying(carries)).unwrap())
        });
        assert_equal_outputs(&carried, &written, &format!("{case:?}"));
    }
}

/// No node of the seed's entries falls back: the CPU backend has a kernel
/// for every `Compute` node, and code that lacks one is refused when the
/// model is loaded, with the node named.
#[test]
fn every_node_runs_as_native_code_or_the_model_is_refused() {
    let (model, params) = model(SEED_F32, Lowering::default());
    let mut compiled = std::collections::HashMap::new();
    for entry in &model.entries {
        let analysis = Analysis::of(entry);
        let code = linnet_cranelift::jit(&model.params, entry, &analysis, Elementwise::default()).unwrap();
        let computes = entry.nodes.iter().filter(|n| matches!(n.kind, linnet_ir::NodeKind::Compute(_))).count();
        assert_eq!(
            code.kernels.iter().flatten().count(),
            computes,
            "entry `{}`: a kernel per `Compute` node",
            entry.name
        );
        compiled.insert(entry.name.clone(), code);
    }
    let decode = &model.entries.iter().find(|e| e.name == "decode").unwrap();
    let missing = decode.nodes.iter().position(|n| matches!(n.kind, linnet_ir::NodeKind::Compute(_))).unwrap();
    compiled.get_mut("decode").unwrap().kernels[missing] = None;
    let error = linnet_cpu::machine(model, params, compiled).err().expect("a missing kernel is refused");
    assert_eq!((error.entry.as_str(), error.node), ("decode", Some(missing)));
    let text = error.to_string();
    assert!(
        text.contains(&format!("cannot run v{missing} of entry `decode` (lowered from ")) && text.contains(".linnet:"),
        "{text}"
    );
}
