use super::*;
use linnet_ir::dim::Dim;
use linnet_ir::{Entry, Input, Node, NodeKind, Value};

/// A model of one entry that returns its input.
fn identity() -> Model {
    let shape = vec![Dim::constant(4)];
    Model {
        name: "identity".into(),
        params: Vec::new(),
        states: Vec::new(),
        entries: vec![Entry {
            name: "run".into(),
            dims: Vec::new(),
            requires: Vec::new(),
            inputs: vec![Input { name: "x".into(), shape: shape.clone(), dtype: Dtype::F32 }],
            nodes: vec![Node { kind: NodeKind::Input(0), shape, dtype: Dtype::F32, source: None }],
            outputs: vec![Value(0)],
        }],
    }
}

fn manifest() -> Manifest {
    Manifest {
        format: 0,
        compiler: "test".into(),
        key: "key".into(),
        model: "identity".into(),
        weights: WeightSource::default(),
        params: Vec::new(),
        gguf_names: None,
        states: Vec::new(),
        entries: Vec::new(),
        plan: MemoryPlan { weight_bytes: 0, state_bytes: 0, at: BTreeMap::new(), peak_scratch: BTreeMap::new() },
        code: BTreeMap::new(),
        files: BTreeMap::new(),
        seal: String::new(),
    }
}

fn section(name: &str, file: &str, bytes: &[u8]) -> Section {
    Section {
        name: name.into(),
        section: CodeSection { file: file.into(), target: "host".into(), abi: 1, calls: serde_json::json!([1, 2]) },
        bytes: bytes.to_vec(),
    }
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("linnet-artifact-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Every section comes back as it was written, under one seal, and one
/// added later too.
#[test]
fn sections_come_back_as_written_under_one_seal() {
    let dir = scratch("round-trip");
    write(&dir, manifest(), &identity(), vec![section("cpu", "kernels.o", b"object")]).unwrap();
    let artifact = read(&dir).unwrap();
    assert_eq!(artifact.model.entries[0].name, "run");
    let (cpu, bytes) = artifact.code("cpu").unwrap();
    assert_eq!((cpu.file.as_str(), bytes.as_slice()), ("kernels.o", b"object".as_slice()));
    assert!(matches!(artifact.code("nvptx-sm_90"), Err(ArtifactError::NoSection { .. })));
    artifact.with_section(section("nvptx-sm_90", "nvptx-sm_90.json", b"{}")).unwrap();
    let artifact = read(&dir).unwrap();
    assert_eq!(artifact.code("nvptx-sm_90").unwrap().1, b"{}");
    assert_eq!(artifact.code("cpu").unwrap().1, b"object");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A section's file or the manifest changed after sealing is refused.
#[test]
fn a_changed_file_or_manifest_is_refused() {
    let dir = scratch("changed");
    write(&dir, manifest(), &identity(), vec![section("cpu", "kernels.o", b"object")]).unwrap();
    std::fs::write(dir.join("kernels.o"), b"other").unwrap();
    let artifact = read(&dir).unwrap();
    assert!(matches!(artifact.code("cpu"), Err(ArtifactError::FileChanged { .. })));
    let text = std::fs::read_to_string(dir.join(MANIFEST)).unwrap();
    std::fs::write(dir.join(MANIFEST), text.replace("\"target\": \"host\"", "\"target\": \"other\"")).unwrap();
    assert!(matches!(read(&dir), Err(ArtifactError::Edited { .. })));
    std::fs::remove_dir_all(&dir).unwrap();
}
