//! A model's PTX and how to launch each kernel: what `linnetc build
//! --target nvptx` writes into an artifact as its `nvptx-ARCH` code
//! section (one JSON file: each entry's PTX, launches and groups) and what
//! the CUDA backend reads, so a machine that runs the model needs no MLIR.
//! The set names the model it was built from by a fingerprint of its IR and
//! the architecture it was built for: PTX of another build is refused,
//! never run.

use super::GpuError;
use linnet_artifact::{Artifact, ArtifactError, CodeSection, Section};
use linnet_ir::dim::Dim;
use linnet_ir::{Model, NodeKind};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The layout of a PTX section's file; bumped when it changes.
pub const PTX_FORMAT: u32 = 1;

/// The name of the code section of PTX for `arch`.
pub fn section_name(arch: &str) -> String {
    format!("nvptx-{arch}")
}

/// How one kernel is launched: its PTX entry point, the node it computes
/// (its output; for a cache write, the cache it changes in place), the
/// values it reads, the scratch its node's kernels share (if any), the
/// dims table it is given, and its work: `lanes` threads per item (1, or
/// a warp's), `threads` to a block, as many items as the product of
/// `work`; whether it can raise a fault, and the axes its loads check
/// (numbered as a fault names them). Every buffer is passed as a memref
/// descriptor (`pipeline`). A node of several kernels has a launch for
/// each, in the order they run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Launch {
    pub name: String,
    pub node: usize,
    /// Its place among its node's launches (a fault names it so).
    pub stage: usize,
    pub loads: Vec<usize>,
    pub scratch: Option<super::Scratch>,
    pub dims: Vec<Dim>,
    pub work: Vec<Dim>,
    pub lanes: u32,
    pub threads: u32,
    pub faults: bool,
    pub checks: Vec<super::Check>,
    /// Whether its node is hoisted (`ir::plan::hoistable`): launched once
    /// per loaded model, not per call.
    #[serde(default)]
    pub hoisted: bool,
}

/// A launch of several nodes' kernels at once (`group`): the dispatch
/// `name`, computing `members` (in order; their outputs are its first
/// buffers, in that order) from `loads`, with its dims table, as many
/// threads as `work`, `threads` to a block. Each member also has its own
/// [`Launch`], which names its checks (its kernel is not an entry point).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GroupLaunch {
    pub name: String,
    pub members: Vec<usize>,
    pub loads: Vec<usize>,
    pub dims: Vec<Dim>,
    pub work: Dim,
    pub threads: u32,
    pub faults: bool,
}

/// One entry's PTX module, its launches in node order, and its launch
/// groups.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EntryPtx {
    pub ptx: String,
    pub launches: Vec<Launch>,
    pub groups: Vec<GroupLaunch>,
}

impl EntryPtx {
    /// The kernels a call of the entry launches: each group once, each
    /// kernel no group launches once, but a hoisted node's, which only
    /// the model's first call launches (groups hold none).
    pub fn launches_per_call(&self) -> usize {
        let grouped: usize = self.groups.iter().map(|group| group.members.len()).sum();
        let hoisted = self.launches.iter().filter(|launch| launch.hoisted).count();
        self.launches.len() - grouped - hoisted + self.groups.len()
    }
}

/// A model's PTX, by entry name.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PtxSet {
    pub model: String,
    pub fingerprint: String,
    pub arch: String,
    pub entries: BTreeMap<String, EntryPtx>,
}

/// Why an artifact's PTX cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PtxError {
    #[error("the artifact's PTX section has layout {0}; this runtime reads layout {PTX_FORMAT}: build it again")]
    OtherFormat(u32),
    #[error("the artifact's PTX section is not a PTX set: {0}")]
    NotASet(String),
    #[error(transparent)]
    Unfit(#[from] GpuError),
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
}

/// A hash of `model`'s IR: two builds with the same fingerprint have the
/// same nodes, shapes and types.
pub fn fingerprint(model: &Model) -> String {
    let text = serde_json::to_vec(model).expect("the IR serializes");
    linnet_artifact::sha256(&text)
}

impl PtxSet {
    /// The set MLIR built for `model` (every entry with kernels).
    #[cfg(feature = "nvptx")]
    pub fn of(model: &Model, arch: &str, built: super::Built) -> PtxSet {
        let entries = built
            .entries
            .into_iter()
            .map(|entry| {
                let launches = entry
                    .kernels
                    .iter()
                    .map(|kernel| Launch {
                        name: kernel.name.clone(),
                        node: kernel.node,
                        stage: kernel.stage,
                        loads: kernel.loads.iter().map(|value| value.index()).collect(),
                        scratch: kernel.scratch.clone(),
                        dims: kernel.dims.clone(),
                        work: kernel.work.clone(),
                        lanes: kernel.lanes,
                        threads: super::THREADS,
                        faults: kernel.faults,
                        checks: kernel.checks.clone(),
                        hoisted: entry.hoisted[kernel.node],
                    })
                    .collect();
                let groups = entry
                    .groups
                    .iter()
                    .map(|group| GroupLaunch {
                        name: group.name.clone(),
                        members: group.members.clone(),
                        loads: group.loads.iter().map(|value| value.index()).collect(),
                        dims: group.dims.clone(),
                        work: group.units.clone(),
                        threads: super::THREADS,
                        faults: group.faults,
                    })
                    .collect();
                (entry.entry, EntryPtx { ptx: entry.ptx, launches, groups })
            })
            .collect();
        PtxSet { model: model.name.clone(), fingerprint: fingerprint(model), arch: arch.to_string(), entries }
    }

    /// The set as its artifact's code section.
    pub fn to_section(&self) -> Section {
        let name = section_name(&self.arch);
        Section {
            section: CodeSection {
                file: format!("{name}.json"),
                target: self.arch.clone(),
                abi: PTX_FORMAT,
                calls: serde_json::Value::Null,
            },
            name,
            bytes: serde_json::to_vec(self).expect("a PTX set serializes"),
        }
    }

    /// The set of `artifact` for `arch`, if it has one, checked against its
    /// model: `Ok(None)` when it has none.
    pub fn of_artifact(artifact: &Artifact, arch: &str) -> Result<Option<PtxSet>, PtxError> {
        let name = section_name(arch);
        let Some(section) = artifact.manifest.code.get(&name) else { return Ok(None) };
        if section.abi != PTX_FORMAT {
            return Err(PtxError::OtherFormat(section.abi));
        }
        let (_, bytes) = artifact.code(&name)?;
        let set: PtxSet = serde_json::from_slice(&bytes).map_err(|e| PtxError::NotASet(e.to_string()))?;
        set.check(&artifact.model, arch)?;
        Ok(Some(set))
    }

    /// Whether the set was built from `model` for `arch`, and launches
    /// kernels for exactly the nodes that need them (a node's together,
    /// reading the same values with the same scratch), each reading values
    /// its entry has; a group's members are `Compute` nodes of one kernel
    /// in order, in no other group, that read values computed before its
    /// first.
    pub fn check(&self, model: &Model, arch: &str) -> Result<(), GpuError> {
        if self.fingerprint != fingerprint(model) {
            return Err(GpuError::Unfit(format!(
                "this PTX was built from another build of `{}` (its IR differs): build it again",
                self.model
            )));
        }
        if self.arch != arch {
            return Err(GpuError::Unfit(format!(
                "this PTX was built for {}, not for this device's {arch}: build it with --gpu-arch {arch}",
                self.arch
            )));
        }
        for entry in &model.entries {
            let working: Vec<usize> = (0..entry.nodes.len())
                .filter(|&at| matches!(entry.nodes[at].kind, NodeKind::Compute(_) | NodeKind::Intrinsic(..)))
                .collect();
            let launches = self.entries.get(&entry.name).map(|set| set.launches.as_slice()).unwrap_or_default();
            let mut launched: Vec<usize> = launches.iter().map(|launch| launch.node).collect();
            launched.dedup();
            if launched != working {
                return Err(GpuError::Unfit(format!(
                    "the PTX of entry `{}` does not launch a kernel for each of its nodes",
                    entry.name
                )));
            }
            let reads_its_own = self.entries.get(&entry.name).is_none_or(|set| {
                set.launches.iter().all(|launch| launch.loads.iter().all(|&load| load < launch.node))
            });
            if !reads_its_own {
                return Err(GpuError::Unfit(format!(
                    "a kernel of entry `{}` reads a value its node cannot",
                    entry.name
                )));
            }
            let in_order = launches.iter().enumerate().all(|(at, launch)| {
                launch.stage == launches[..at].iter().rev().take_while(|earlier| earlier.node == launch.node).count()
            });
            let stages_agree = in_order
                && launches.windows(2).all(|pair| {
                    pair[0].node != pair[1].node
                        || (pair[0].loads == pair[1].loads && pair[0].scratch == pair[1].scratch)
                });
            if !stages_agree {
                return Err(GpuError::Unfit(format!(
                    "the kernels of a node of entry `{}` do not take the same arguments",
                    entry.name
                )));
            }
            let groups = self.entries.get(&entry.name).map(|set| set.groups.as_slice()).unwrap_or_default();
            let mut grouped = vec![false; entry.nodes.len()];
            for group in groups {
                let first = group.members.first().copied().unwrap_or(usize::MAX);
                let sound = group.members.len() > 1
                    && group.members.windows(2).all(|pair| pair[0] < pair[1])
                    && group.loads.iter().all(|&load| load < first)
                    && group.members.iter().all(|&member| {
                        let once = !std::mem::replace(grouped.get_mut(member).unwrap_or(&mut true), true);
                        let one_kernel = launches.iter().filter(|launch| launch.node == member).count() == 1;
                        once && one_kernel && matches!(entry.nodes[member].kind, NodeKind::Compute(_))
                    });
                if !sound {
                    return Err(GpuError::Unfit(format!(
                        "launch group `{}` of entry `{}` is not one the PTX can run",
                        group.name, entry.name
                    )));
                }
            }
        }
        Ok(())
    }
}
