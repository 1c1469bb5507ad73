//! The instruction sets the kernels run on, chosen at run time: what this
//! CPU has, best first, and what `LINNET_ISA` asks for.

use std::sync::OnceLock;

/// `LINNET_ISA` naming no instruction set of this CPU: what it names, and
/// what the CPU runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownIsa {
    pub requested: std::ffi::OsString,
    pub available: Vec<Isa>,
}

impl std::fmt::Display for UnknownIsa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.available.iter().map(|isa| isa.name()).collect();
        write!(f, "LINNET_ISA={:?}: this CPU runs {}", self.requested, names.join(", "))
    }
}

impl std::error::Error for UnknownIsa {}

/// The instruction sets the kernel runs on, best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// AVX-512 BF16 with AMX tiles: bf16 products sixteen rows by sixteen
    /// (`amx`) past a decode step's rows.
    Amx,
    /// AVX-512 with bf16 dot products (`vdpbf16ps`).
    Avx512Bf16,
    /// AVX-512 F and BW: sixteen f32 lanes with FMA.
    Avx512,
    /// AVX2 with FMA: eight f32 lanes.
    Avx2,
    /// OneLane code, for any CPU.
    Portable,
}

impl Isa {
    /// What the kernels run on, chosen once: the one [`Isa::requested`]
    /// names, else the best this CPU has.
    ///
    /// # Panics
    /// If `LINNET_ISA` names no instruction set of this CPU: a program
    /// checks [`Isa::requested`] first, to say so as an error.
    pub fn host() -> Isa {
        static HOST: OnceLock<Isa> = OnceLock::new();
        *HOST.get_or_init(|| match Isa::requested() {
            Ok(requested) => requested.unwrap_or_else(|| Isa::available()[0]),
            Err(message) => panic!("{message}"),
        })
    }

    /// The instruction set the environment variable `LINNET_ISA` names
    /// (as [`Isa::name`] writes it), when it is set: the kernels then keep
    /// to it, to measure or test on this CPU what a CPU with less runs.
    /// An error when the name is not one of this CPU's.
    pub fn requested() -> Result<Option<Isa>, UnknownIsa> {
        let Some(name) = std::env::var_os("LINNET_ISA") else { return Ok(None) };
        let available = Isa::available();
        let found = available.iter().find(|isa| name.to_str() == Some(isa.name()));
        found.map(|isa| Some(*isa)).ok_or(UnknownIsa { requested: name, available })
    }

    /// Every instruction set this CPU can run, best first.
    pub fn available() -> Vec<Isa> {
        let mut found = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            // The AVX-512 kernels use BW's 16-bit widening as well as F;
            // the block decoders widen halves with F16C (`dequant`).
            let f16c = std::arch::is_x86_feature_detected!("f16c");
            let avx512 = std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && f16c;
            if avx512 && std::arch::is_x86_feature_detected!("avx512bf16") {
                if super::amx::available() {
                    found.push(Isa::Amx);
                }
                found.push(Isa::Avx512Bf16);
            }
            if avx512 {
                found.push(Isa::Avx512);
            }
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") && f16c {
                found.push(Isa::Avx2);
            }
        }
        found.push(Isa::Portable);
        found
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Amx => "amx",
            Isa::Avx512Bf16 => "avx512bf16",
            Isa::Avx512 => "avx512",
            Isa::Avx2 => "avx2+fma",
            Isa::Portable => "portable",
        }
    }

    /// Whether it multiplies bf16 values in bf16 dot products.
    pub fn has_bf16_dots(self) -> bool {
        matches!(self, Isa::Amx | Isa::Avx512Bf16)
    }

    /// The instruction set of its f32 lanes: what products of f32 values
    /// (or of weights decoded to f32) run on.
    pub fn lanes(self) -> Isa {
        if self.has_bf16_dots() {
            Isa::Avx512
        } else {
            self
        }
    }
}
