//! The host as native code is compiled for and checked against: its target
//! triple and the instruction-set features the code generator may use,
//! detected here without the code generator, so that the runtime can tell
//! whether an artifact's code runs on this host before it maps it, and the
//! code generator enables exactly these features (no more) when it
//! compiles.

/// A feature by the code generator's name, and whether this CPU has it.
type Feature = (&'static str, fn() -> bool);

/// The features, in the code generator's own names and in the order it
/// lists them, with how the CPU is asked for each.
#[cfg(target_arch = "x86_64")]
const FEATURES: [Feature; 19] = [
    ("has_sse3", || std::arch::is_x86_feature_detected!("sse3")),
    ("has_ssse3", || std::arch::is_x86_feature_detected!("ssse3")),
    ("has_cmpxchg16b", || std::arch::is_x86_feature_detected!("cmpxchg16b")),
    ("has_sse41", || std::arch::is_x86_feature_detected!("sse4.1")),
    ("has_sse42", || std::arch::is_x86_feature_detected!("sse4.2")),
    ("has_avx", || std::arch::is_x86_feature_detected!("avx")),
    ("has_avx2", || std::arch::is_x86_feature_detected!("avx2")),
    ("has_fma", || std::arch::is_x86_feature_detected!("fma")),
    ("has_avx_vnni", || std::arch::is_x86_feature_detected!("avxvnni")),
    ("has_avx512bitalg", || std::arch::is_x86_feature_detected!("avx512bitalg")),
    ("has_avx512dq", || std::arch::is_x86_feature_detected!("avx512dq")),
    ("has_avx512vl", || std::arch::is_x86_feature_detected!("avx512vl")),
    ("has_avx512vbmi", || std::arch::is_x86_feature_detected!("avx512vbmi")),
    ("has_avx512f", || std::arch::is_x86_feature_detected!("avx512f")),
    ("has_avx512vnni", || std::arch::is_x86_feature_detected!("avx512vnni")),
    ("has_popcnt", || std::arch::is_x86_feature_detected!("popcnt")),
    ("has_bmi1", || std::arch::is_x86_feature_detected!("bmi1")),
    ("has_bmi2", || std::arch::is_x86_feature_detected!("bmi2")),
    ("has_lzcnt", || std::arch::is_x86_feature_detected!("lzcnt")),
];

#[cfg(target_arch = "aarch64")]
const FEATURES: [Feature; 5] = [
    ("has_lse", || std::arch::is_aarch64_feature_detected!("lse")),
    ("has_pauth", || std::arch::is_aarch64_feature_detected!("paca")),
    ("has_fp16", || std::arch::is_aarch64_feature_detected!("fp16")),
    ("has_dotprod", || std::arch::is_aarch64_feature_detected!("dotprod")),
    ("has_i8mm", || std::arch::is_aarch64_feature_detected!("i8mm")),
];

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const FEATURES: [Feature; 0] = [];

/// The target triple this crate was built for: the host's.
pub const TRIPLE: &str = env!("LINNET_TARGET_TRIPLE");

/// The features this CPU has, in the code generator's names.
pub fn features() -> Vec<&'static str> {
    FEATURES.iter().filter(|(_, detected)| detected()).map(|(name, _)| *name).collect()
}

/// The host as an artifact records it, triple and features: code built
/// for one host's features must not run on a host without them.
pub fn target() -> String {
    format!("{TRIPLE} [{}]", features().join(" "))
}

#[cfg(test)]
mod tests {
    /// The description names the triple, and a feature at most once.
    #[test]
    fn the_target_names_the_triple_and_each_feature_once() {
        let target = super::target();
        assert!(target.starts_with(super::TRIPLE), "{target}");
        let features = super::features();
        let mut unique = features.clone();
        unique.dedup();
        assert_eq!(features, unique);
    }
}
