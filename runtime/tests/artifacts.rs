//! Artifacts: `linnetc build` output runs in the runtime with the same
//! results as a model compiled in process; a package is built once into
//! the content-keyed cache and reused while its sources are unchanged; an
//! artifact for another host or ABI is refused, never run; f32 and bf16
//! weights are used in place in the mapped checkpoint.

use linnet_exec::tensor::{Data, Tensor};
use linnet_exec::Machine;
use linnet_frontend::package::LoadOptions;
use linnet_ir::Dtype;
use linnet_runtime::BackendKind;
use linnet_runtime::Weights;
use std::path::PathBuf;

mod common;

use common::{oracle, oracle_options as options, root};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("linnet-artifacts-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn logits(machine: &mut Machine) -> Tensor {
    let tokens = Tensor::from_i64(Dtype::I32, vec![2, 5], vec![5, 17, 42, 9, 300, 1, 2, 3, 4, 511]);
    machine.call("forward", vec![tokens]).unwrap().remove(0)
}

#[test]
fn a_built_artifact_runs_like_the_package() {
    let out = scratch("build");
    // Built through the library, as `linnetc build` does.
    let checked = linnet_frontend::driver::check_package(&root().join("models/qwen3.6-35b-a3b"), &options());
    let key = linnet_build::content_key(&checked.sources);
    let (model, checked) =
        linnet_frontend::driver::lower_checked(checked, Default::default()).unwrap_or_else(|_| panic!("lowers"));
    let manifest = linnet_build::write(&model, checked.package.as_ref().unwrap(), key, &out).unwrap();
    let records = linnet_cpu::load::records(&manifest.code[linnet_cpu::load::SECTION]).unwrap();
    assert!(records.values().map(Vec::len).sum::<usize>() > 100);
    assert!(manifest.params.iter().all(|p| p.tensor.is_some()), "every parameter names its checkpoint tensor");
    assert_eq!(manifest.plan.weight_bytes, model.param_bytes());

    let weights = Weights::Checkpoint {
        dir: Some(oracle().join("weights-f32")),
        non_finite: linnet_runtime::weights::NonFinite::Refuse,
    };
    let mut from_artifact = common::load_on(&out, &LoadOptions::default(), &weights, BackendKind::Cpu).unwrap().machine;
    let mut in_process =
        common::load_on(&root().join("models/qwen3.6-35b-a3b"), &options(), &weights, BackendKind::Interp)
            .unwrap()
            .machine;
    let (native, reference) = (logits(&mut from_artifact), logits(&mut in_process));
    linnet_exec::tolerance::compare(&reference, &native)
        .unwrap_or_else(|m| panic!("the artifact's kernels break the contract: {m}"));

    let refused = common::load_on(
        &out,
        &LoadOptions { overrides: vec![("Groups".into(), "2".into())], ..LoadOptions::default() },
        &weights,
        BackendKind::Cpu,
    );
    assert!(refused.err().unwrap().contains("`--set` apply when building"));
    std::fs::remove_dir_all(&out).unwrap();
}

/// The tiny MLP example built into a fresh scratch folder, with key `key`.
fn tiny_mlp_artifact(name: &str) -> PathBuf {
    let out = scratch(name);
    let checked = linnet_frontend::driver::check_package(&root().join("examples/tiny-mlp"), &LoadOptions::default());
    let (model, checked) =
        linnet_frontend::driver::lower_checked(checked, Default::default()).unwrap_or_else(|_| panic!("lowers"));
    linnet_build::write(&model, checked.package.as_ref().unwrap(), "key".into(), &out).unwrap();
    out
}

/// CPU code of another ABI or compiled on another host is refused; the
/// artifact itself is read (its IR runs on any backend).
#[test]
fn cpu_code_for_another_host_or_abi_is_refused() {
    let out = tiny_mlp_artifact("foreign");
    let built = linnet_artifact::read(&out).unwrap();
    let (section, bytes) = built.code(linnet_cpu::load::SECTION).map(|(s, b)| (s.clone(), b)).unwrap();
    // As another host or compiler would have written them: sealed.
    let rewritten = |section: linnet_artifact::CodeSection| {
        let name = linnet_cpu::load::SECTION.to_string();
        let artifact = linnet_artifact::read(&out).unwrap();
        artifact.with_section(linnet_artifact::Section { name, section, bytes: bytes.clone() }).unwrap();
        linnet_artifact::read(&out).unwrap()
    };
    let foreign =
        rewritten(linnet_artifact::CodeSection { target: "riscv64gc-unknown-linux-gnu []".into(), ..section.clone() });
    let error = linnet_cpu::load::from_artifact(&foreign).err().unwrap().to_string();
    assert!(error.contains("compiled for riscv64gc") && error.contains("rebuild it"), "{error}");
    let other_abi = rewritten(linnet_artifact::CodeSection { abi: 999, ..section });
    let error = linnet_cpu::load::from_artifact(&other_abi).err().unwrap().to_string();
    assert!(error.contains("kernel ABI 999"), "{error}");
    std::fs::remove_dir_all(&out).unwrap();
}

/// Bytes changed after the build, in the manifest, the IR or the native
/// code, are refused before anything is parsed or mapped.
#[test]
fn an_altered_artifact_is_refused() {
    let out = tiny_mlp_artifact("altered");
    let built = linnet_artifact::read(&out).unwrap();
    assert!(linnet_cpu::load::from_artifact(&built).is_ok());

    let manifest_path = out.join("artifact.json");
    let text = std::fs::read_to_string(&manifest_path).unwrap();
    std::fs::write(&manifest_path, text.replace("\"key\": \"key\"", "\"key\": \"another\"")).unwrap();
    let error = linnet_artifact::read(&out).err().unwrap().to_string();
    assert!(error.contains("artifact.json was edited"), "{error}");
    std::fs::write(&manifest_path, &text).unwrap();

    for file in ["kernels.o", "model.ir.json"] {
        let path = out.join(file);
        let bytes = std::fs::read(&path).unwrap();
        let mut flipped = bytes.clone();
        let middle = flipped.len() / 2;
        flipped[middle] ^= 0x10;
        std::fs::write(&path, &flipped).unwrap();
        let error = match linnet_artifact::read(&out) {
            Ok(built) => linnet_cpu::load::from_artifact(&built).err().unwrap().to_string(),
            Err(error) => error.to_string(),
        };
        assert!(error.contains(file) && error.contains("SHA-256 differs"), "{error}");
        std::fs::write(&path, &bytes).unwrap();
    }
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn packages_are_built_once_per_content() {
    let cache = scratch("cache");
    let package = scratch("package");
    std::fs::create_dir_all(package.join("src")).unwrap();
    for file in ["linnet.toml", "nest.toml", "bindings.json", "src/lib.linnet"] {
        std::fs::copy(root().join("examples/tiny-mlp").join(file), package.join(file)).unwrap();
    }
    let options = LoadOptions { stdlib: Some(root().join("stdlib")), ..LoadOptions::default() };
    // Two threads building the same package at once both get the artifact.
    let built: Vec<PathBuf> = std::thread::scope(|scope| {
        let builds: Vec<_> = (0..2)
            .map(|_| {
                scope.spawn(|| {
                    linnet_build::cache::artifact_in(
                        Some(&cache),
                        &package,
                        &LoadOptions { stdlib: Some(root().join("stdlib")), ..LoadOptions::default() },
                    )
                })
            })
            .collect();
        builds.into_iter().map(|build| build.join().unwrap().unwrap()).collect()
    });
    assert_eq!(built[0], built[1]);
    let first = linnet_build::cache::artifact_in(Some(&cache), &package, &options).unwrap();
    assert!(first.starts_with(&cache) && linnet_artifact::is_artifact(&first));
    let modified = std::fs::metadata(first.join("artifact.json")).unwrap().modified().unwrap();
    assert_eq!(
        linnet_build::cache::artifact_in(Some(&cache), &package, &options).unwrap(),
        first,
        "unchanged sources reuse the artifact"
    );
    assert_eq!(
        std::fs::metadata(first.join("artifact.json")).unwrap().modified().unwrap(),
        modified,
        "and do not rebuild it"
    );
    let source = std::fs::read_to_string(package.join("src/lib.linnet")).unwrap();
    std::fs::write(package.join("src/lib.linnet"), format!("{source}\n// changed\n")).unwrap();
    let second = linnet_build::cache::artifact_in(Some(&cache), &package, &options).unwrap();
    assert_ne!(second, first, "changed sources get an artifact of their own");
    std::fs::remove_dir_all(&cache).unwrap();
    std::fs::remove_dir_all(&package).unwrap();
}

#[test]
fn weights_are_used_in_place() {
    let (model, package) = linnet_build::lower(&root().join("models/qwen3.6-35b-a3b"), &options()).unwrap();
    let params = linnet_runtime::weights::load(
        &model,
        &linnet_build::naming(&package),
        &oracle().join("weights-f32"),
        linnet_runtime::weights::NonFinite::Refuse,
    )
    .unwrap();
    let mapped = params.iter().filter(|p| matches!(&p.data, Data::F32(floats) if floats.is_mapped())).count();
    assert_eq!(mapped, params.len(), "every f32 tensor of an aligned checkpoint is mapped, not copied");

    let calm = root().join("tests/fixtures/oracle/tiny-qwen3.5-moe-calm");
    let options = LoadOptions {
        nest: Some(calm.join("package/nest-bf16.toml")),
        stdlib: Some(root().join("stdlib")),
        ..LoadOptions::default()
    };
    let (model, package) = linnet_build::lower(&root().join("models/qwen3.6-35b-a3b"), &options).unwrap();
    let params = linnet_runtime::weights::load(
        &model,
        &linnet_build::naming(&package),
        &calm.join("weights-bf16"),
        linnet_runtime::weights::NonFinite::Refuse,
    )
    .unwrap();
    let bf16 = model.params.iter().filter(|p| p.dtype == Dtype::Bf16).count();
    let bits = params.iter().filter(|p| matches!(&p.data, Data::Bf16(bits) if bits.is_mapped())).count();
    assert!(bf16 > 0 && bits == bf16, "every bf16 parameter is held as bits in the mapped file: {bits} of {bf16}");
}

/// A loaded machine is `Send`: one loaded on this thread runs on another
/// (as the server's scheduler runs it), with the same results.
#[test]
fn a_machine_runs_on_another_thread() {
    let out = tiny_mlp_artifact("threads");
    let loaded = linnet_runtime::load(&out, &Weights::Random(7), BackendKind::Cpu, None).unwrap();
    let mut machine = loaded.machine;
    let tokens = || Tensor::from_i64(Dtype::I32, vec![1, 3], vec![1, 2, 3]);
    let here = machine.call("forward", vec![tokens()]).unwrap().remove(0);
    let there = std::thread::spawn(move || machine.call("forward", vec![tokens()]).unwrap().remove(0)).join().unwrap();
    assert_eq!(here.as_f32().unwrap(), there.as_f32().unwrap());
    std::fs::remove_dir_all(&out).unwrap();
}
