//! A model's PTX and how to launch each kernel: what `linnetc build
//! --target nvptx` writes into an artifact's `ptx/` folder (each entry's
//! `ENTRY.ptx`, and `launches.json`) and what the CUDA backend reads, so a
//! machine that runs the model needs no MLIR. The launches name the model
//! they were built from by a fingerprint of its IR and the architecture
//! they were built for: PTX of another build is refused, never run.

use linnet_ir::dim::Dim;
use linnet_ir::{Model, NodeKind};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::Path;

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
#[derive(Clone, Debug)]
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

/// An entry's launches and groups, as `launches.json` holds them.
#[derive(Serialize, Deserialize)]
struct EntryLaunches {
    launches: Vec<Launch>,
    groups: Vec<GroupLaunch>,
}

/// A model's PTX, by entry name.
#[derive(Clone, Debug)]
pub struct PtxSet {
    pub model: String,
    pub fingerprint: String,
    pub arch: String,
    pub entries: BTreeMap<String, EntryPtx>,
}

/// `launches.json`: everything but the PTX texts.
#[derive(Serialize, Deserialize)]
struct Launches {
    model: String,
    fingerprint: String,
    arch: String,
    entries: BTreeMap<String, EntryLaunches>,
}

/// A hash of `model`'s IR: two builds with the same fingerprint have the
/// same nodes, shapes and types.
pub fn fingerprint(model: &Model) -> String {
    let text = serde_json::to_vec(model).expect("the IR serializes");
    Sha256::digest(&text).iter().map(|byte| format!("{byte:02x}")).collect()
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

    /// Writes the set into `dir` (created); the bytes of PTX written.
    pub fn write(&self, dir: &Path) -> Result<usize, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let mut written = 0;
        for (name, entry) in &self.entries {
            let path = dir.join(format!("{name}.ptx"));
            std::fs::write(&path, &entry.ptx).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            written += entry.ptx.len();
        }
        let launches = Launches {
            model: self.model.clone(),
            fingerprint: self.fingerprint.clone(),
            arch: self.arch.clone(),
            entries: self
                .entries
                .iter()
                .map(|(name, entry)| {
                    (name.clone(), EntryLaunches { launches: entry.launches.clone(), groups: entry.groups.clone() })
                })
                .collect(),
        };
        let path = dir.join("launches.json");
        std::fs::write(&path, serde_json::to_string(&launches).expect("launches serialize"))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        Ok(written)
    }

    /// Whether `dir` holds a set (its `launches.json`).
    pub fn is_in(dir: &Path) -> bool {
        dir.join("launches.json").is_file()
    }

    /// The set in `dir`.
    pub fn read(dir: &Path) -> Result<PtxSet, String> {
        let path = dir.join("launches.json");
        let text = std::fs::read_to_string(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let launches: Launches =
            serde_json::from_str(&text).map_err(|e| format!("{} is not a set of launches: {e}", path.display()))?;
        let mut entries = BTreeMap::new();
        for (name, EntryLaunches { launches, groups }) in launches.entries {
            let path = dir.join(format!("{name}.ptx"));
            let ptx = std::fs::read_to_string(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            entries.insert(name, EntryPtx { ptx, launches, groups });
        }
        Ok(PtxSet { model: launches.model, fingerprint: launches.fingerprint, arch: launches.arch, entries })
    }

    /// Whether the set was built from `model` for `arch`, and launches
    /// kernels for exactly the nodes that need them (a node's together,
    /// reading the same values with the same scratch), each reading values
    /// its entry has; a group's members are `Compute` nodes of one kernel
    /// in order, in no other group, that read values computed before its
    /// first.
    pub fn check(&self, model: &Model, arch: &str) -> Result<(), String> {
        if self.fingerprint != fingerprint(model) {
            return Err(format!(
                "this PTX was built from another build of `{}` (its IR differs): build it again",
                self.model
            ));
        }
        if self.arch != arch {
            return Err(format!(
                "this PTX was built for {}, not for this device's {arch}: build it with --gpu-arch {arch}",
                self.arch
            ));
        }
        for entry in &model.entries {
            let working: Vec<usize> = (0..entry.nodes.len())
                .filter(|&at| matches!(entry.nodes[at].kind, NodeKind::Compute(_) | NodeKind::Intrinsic(..)))
                .collect();
            let launches = self.entries.get(&entry.name).map(|set| set.launches.as_slice()).unwrap_or_default();
            let mut launched: Vec<usize> = launches.iter().map(|launch| launch.node).collect();
            launched.dedup();
            if launched != working {
                return Err(format!(
                    "the PTX of entry `{}` does not launch a kernel for each of its nodes",
                    entry.name
                ));
            }
            let reads_its_own = self.entries.get(&entry.name).is_none_or(|set| {
                set.launches.iter().all(|launch| launch.loads.iter().all(|&load| load < launch.node))
            });
            if !reads_its_own {
                return Err(format!("a kernel of entry `{}` reads a value its node cannot", entry.name));
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
                return Err(format!("the kernels of a node of entry `{}` do not take the same arguments", entry.name));
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
                    return Err(format!(
                        "launch group `{}` of entry `{}` is not one the PTX can run",
                        group.name, entry.name
                    ));
                }
            }
        }
        Ok(())
    }
}
