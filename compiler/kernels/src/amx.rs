//! AMX tiles (Intel's Advanced Matrix Extensions): bf16 products of
//! sixteen weight rows by sixteen input rows over thirty-two values an
//! instruction (`tdpbf16ps`, into f32 sums), for the products over more
//! rows than a decode step's, where the CPU has the tiles and Linux grants
//! the process their state (`arch_prctl(ARCH_REQ_XCOMP_PERM)`). Each
//! product is the one `vdpbf16ps` makes (exact products of bf16 values,
//! summed in f32, subnormals flushed to zero), summed in another order:
//! the freedom `docs/language.md` states for bf16 dot products.
//!
//! The weight rows are the tiles' A operand, read where they lie (a bf16
//! parameter's rows, or block rows decoded into a thread's buffer, `matmul`);
//! the input rows are the B operand, laid out once per call as B tiles
//! hold them ([`Inputs`]: each row's pairs gathered in a vector, sixteen
//! rows transposed into a tile's rows, as the sums are transposed back).
//! Stable Rust has no AMX intrinsics: the few instructions are inline
//! assembly.

use super::matrix::Rows;

/// Values of the depth one tile spans: 32 bf16 values, a tile row's 64 bytes.
pub const DEPTH: usize = 32;

/// Rows of a tile: sixteen weight rows (A), sixteen input rows (B's
/// columns), and the 16 × 16 sums they make (C).
const EDGE: usize = 16;

/// Bytes of a tile: sixteen rows of 64 bytes.
const TILE_BYTES: usize = EDGE * 64;

/// Whether this CPU has AMX tiles with bf16 products (and AVX-512 BW,
/// which every CPU with them has, for the inputs' layout) and the kernel
/// lets this process use them; asked once (the grant is the process's).
pub fn available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        return x86::has_tiles() && std::arch::is_x86_feature_detected!("avx512bw") && x86::granted();
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
        false
    })
}

/// Whether the tiles also have byte products (AMX-INT8) and the process
/// the tiles: what `byte_tiles` runs on; asked once (CPUID is slow, and a
/// hypervisor's trap in a VM).
pub fn has_byte_products() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        return available() && x86::has_byte_products();
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}

/// Input rows as bf16 pairs in B tiles: for each block of sixteen rows
/// (the last filled out with zeros) and each 32 values of the depth, one
/// tile of sixteen pairs by sixteen rows (1 KiB), whose pair `p` of row
/// `j` holds values `2p` and `2p + 1` of that row's span.
pub struct Inputs {
    pairs: Vec<u32>,
    /// Tiles along the depth: `depth / DEPTH`.
    spans: usize,
}

impl Inputs {
    /// The inputs of `rows` laid out for tiles, when every value is
    /// exactly a bf16 value (a bf16 model's are; then each product is
    /// exact, as it is in f32); `depth` is a multiple of [`DEPTH`].
    ///
    /// # Safety
    /// Each input row has `depth` readable values.
    pub unsafe fn new(rows: &Rows, depth: usize) -> Option<Inputs> {
        assert!(depth.is_multiple_of(DEPTH), "whole tiles along the depth");
        let spans = depth / DEPTH;
        let mut pairs = vec![0u32; rows.inputs.len().div_ceil(EDGE) * spans * EDGE * EDGE];
        #[cfg(target_arch = "x86_64")]
        for (block, inputs) in rows.inputs.chunks(EDGE).enumerate() {
            let tiles = &mut pairs[block * spans * EDGE * EDGE..(block + 1) * spans * EDGE * EDGE];
            // SAFETY: the CPU has AVX-512 BW (`available`); each row has
            // `depth` values, as the caller promises.
            if !unsafe { x86::lay_out_block(inputs, spans, tiles) } {
                return None;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!("AMX is x86's ({depth} values a row)");
        Some(Inputs { pairs, spans })
    }

    /// The B tile of rows `16 · block..`, span `span` of the depth.
    fn tile(&self, block: usize, span: usize) -> *const u8 {
        self.pairs[(block * self.spans + span) * EDGE * EDGE..].as_ptr() as *const u8
    }
}

/// Blocks of sixteen input rows multiplied by every weight row of a call
/// before the next blocks: their tiles (64 KiB a block at a depth of 2048)
/// stay in L2 while the weight rows pass over them.
const CHUNK_BLOCKS: usize = 4;

thread_local! {
    /// A thread's last weight rows filled out to a whole tile with zeros.
    static PADDED: std::cell::RefCell<Vec<u16>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Columns `range` of every output row of `rows`: weight row `n - first`
/// of `weight` (bf16 bits, `stride` from one row to the next, the inputs'
/// depth of them read) makes column `n`, against
/// `inputs` (the rows laid out). Thirty-two weight rows by thirty-two
/// input rows at a time: four tiles of sums, each loaded tile used twice.
///
/// # Safety
/// The CPU has AMX ([`available`]); `inputs` are `rows`' inputs; each
/// output row has room for the range's columns, which no other thread
/// writes.
pub unsafe fn columns(
    rows: &Rows,
    inputs: &Inputs,
    weight: &[u16],
    stride: usize,
    first: usize,
    range: std::ops::Range<usize>,
) {
    let depth = inputs.spans * DEPTH;
    assert!(stride >= depth, "weight rows of the inputs' depth");
    #[cfg(target_arch = "x86_64")]
    PADDED.with_borrow_mut(|padded| {
        // SAFETY: as the caller promises.
        let _tiles = unsafe { x86::Configured::new() };
        let blocks = rows.inputs.len().div_ceil(EDGE);
        for chunk in (0..blocks).step_by(CHUNK_BLOCKS) {
            let chunk = chunk..(chunk + CHUNK_BLOCKS).min(blocks);
            let mut n = range.start;
            while n < range.end {
                let height = (range.end - n).min(2 * EDGE);
                // A tile of sixteen weight rows where they lie, or the last
                // few copied into a tile filled out with zeros.
                let mut operand = |at: usize| -> *const u8 {
                    let rows_here = (n + height - at).min(EDGE);
                    let start = (at - first) * stride;
                    if rows_here == EDGE {
                        return weight[start..].as_ptr() as *const u8;
                    }
                    padded.clear();
                    padded.extend_from_slice(&weight[start..start + rows_here * stride]);
                    padded.resize(EDGE * stride, 0);
                    padded.as_ptr() as *const u8
                };
                let a = [operand(n), if height > EDGE { operand(n + EDGE) } else { std::ptr::null() }];
                for block in chunk.clone().step_by(2) {
                    let b = [block, (block + 1).min(blocks - 1)];
                    // SAFETY: the tiles lie inside `weight`, `padded` and
                    // `inputs`, `stride * 2` bytes apart (A) and 64 (B).
                    let sums = unsafe {
                        match (height > EDGE, block + 1 < blocks) {
                            (true, true) => x86::sums::<true, true>(a, stride * 2, inputs, b),
                            (true, false) => x86::sums::<true, false>(a, stride * 2, inputs, b),
                            (false, true) => x86::sums::<false, true>(a, stride * 2, inputs, b),
                            (false, false) => x86::sums::<false, false>(a, stride * 2, inputs, b),
                        }
                    };
                    // SAFETY: as the caller promises.
                    unsafe { x86::store_sums(&sums, &rows.outs, n, block, range.end) };
                }
                n += height;
            }
        }
    });
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("AMX is x86's ({} rows, {first}, {range:?}, {})", rows.inputs.len(), weight.len())
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use super::{Inputs, DEPTH, EDGE, TILE_BYTES};
    use std::arch::asm;

    /// A tile configuration (palette 1): each of the eight tiles' rows and
    /// bytes a row.
    #[repr(C, align(64))]
    pub struct Config([u8; 64]);

    impl Config {
        /// Tile `t` of `rows` rows of `bytes` bytes, for each `(rows, bytes)`.
        pub const fn new(shapes: [(u8, u8); 8]) -> Config {
            let mut config = [0u8; 64];
            config[0] = 1;
            let mut tile = 0;
            while tile < 8 {
                config[16 + 2 * tile] = shapes[tile].1;
                config[48 + tile] = shapes[tile].0;
                tile += 1;
            }
            Config(config)
        }
    }

    /// The bf16 products' tiles: all eight sixteen rows of 64 bytes (sums:
    /// tmm0–3, weights: tmm4–5, inputs: tmm6–7).
    const CONFIG: Config = Config::new([(EDGE as u8, 64); 8]);

    /// Leaf 7 of CPUID: the AMX features are bits of EDX.
    fn leaf_7_edx() -> u32 {
        // SAFETY: every x86-64 CPU has CPUID leaf 7 or answers zeros.
        #[allow(unused_unsafe)]
        unsafe { std::arch::x86_64::__cpuid_count(7, 0) }.edx
    }

    /// Whether the CPU has AMX tiles and their bf16 products (CPUID leaf 7).
    pub fn has_tiles() -> bool {
        let edx = leaf_7_edx();
        let (bf16, tile) = (edx >> 22 & 1 == 1, edx >> 24 & 1 == 1);
        bf16 && tile && std::arch::is_x86_feature_detected!("avx512bf16")
    }

    /// Whether the tiles also have byte products (AMX-INT8, CPUID leaf 7).
    pub fn has_byte_products() -> bool {
        leaf_7_edx() >> 25 & 1 == 1
    }

    /// Asks Linux for the tiles' state (XTILEDATA) for this process.
    #[cfg(target_os = "linux")]
    pub fn granted() -> bool {
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: the request only changes what this process may use.
        unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
    }

    /// The tiles configured on this thread, released when dropped (so that
    /// a context switch saves no tile state for it).
    pub struct Configured(());

    impl Configured {
        /// The bf16 products' tiles.
        ///
        /// # Safety
        /// The CPU has AMX and the process the grant.
        pub unsafe fn new() -> Configured {
            // SAFETY: as the caller promises.
            unsafe { Configured::as_in(&CONFIG) }
        }

        /// The tiles as `config` shapes them.
        ///
        /// # Safety
        /// The CPU has AMX and the process the grant.
        pub unsafe fn as_in(config: &Config) -> Configured {
            // SAFETY: as the caller promises.
            unsafe { asm!("ldtilecfg [{}]", in(reg) config.0.as_ptr(), options(nostack, readonly)) };
            Configured(())
        }
    }

    impl Drop for Configured {
        fn drop(&mut self) {
            // SAFETY: the tiles were configured by `new`.
            unsafe { asm!("tilerelease", options(nostack, nomem)) };
        }
    }

    /// Sixteen rows of sixteen 32-bit lanes transposed in registers: the
    /// standard 16 × 16 transpose, pairs of rows interleaved by values,
    /// then by pairs of values, then by 128-bit lanes twice.
    #[inline(always)]
    fn transpose(mut r: [std::arch::x86_64::__m512; EDGE]) -> [std::arch::x86_64::__m512; EDGE] {
        use std::arch::x86_64::*;
        // SAFETY: only inlined into functions with AVX-512 F.
        unsafe {
            let mut t = [_mm512_setzero_ps(); EDGE];
            for i in 0..EDGE / 2 {
                t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
                t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
            }
            for q in 0..EDGE / 4 {
                let b = 4 * q;
                r[b] = pairs_low(t[b], t[b + 2]);
                r[b + 1] = pairs_high(t[b], t[b + 2]);
                r[b + 2] = pairs_low(t[b + 1], t[b + 3]);
                r[b + 3] = pairs_high(t[b + 1], t[b + 3]);
            }
            for half in 0..2 {
                let b = 8 * half;
                for i in 0..4 {
                    t[b + i] = _mm512_shuffle_f32x4::<0x88>(r[b + i], r[b + i + 4]);
                    t[b + i + 4] = _mm512_shuffle_f32x4::<0xdd>(r[b + i], r[b + i + 4]);
                }
            }
            for i in 0..EDGE / 2 {
                r[i] = _mm512_shuffle_f32x4::<0x88>(t[i], t[i + 8]);
                r[i + 8] = _mm512_shuffle_f32x4::<0xdd>(t[i], t[i + 8]);
            }
        }
        r
    }

    /// Up to sixteen input rows (`depth = 32 · spans` values each) laid
    /// out as a block of [`Inputs`]: per span, a tile whose row `p` holds
    /// pair `p` (values `2p`, `2p + 1` as bf16 bits) of each input row, in
    /// its column; zeros for the rows past them. Each row's pairs are
    /// gathered in a vector (their high halves), and sixteen rows'
    /// transposed into the tile's rows. False where a value is no bf16
    /// value (low bits set).
    ///
    /// # Safety
    /// The CPU has AVX-512 F and BW; each row has `32 · spans` readable
    /// values; `tiles` holds `spans` tiles.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn lay_out_block(rows: &[*const f32], spans: usize, tiles: &mut [u32]) -> bool {
        use std::arch::x86_64::*;
        // Word `2e + 1` of two vectors of sixteen values is value `e`'s
        // high half: pair `p` is words `4p + 1` and `4p + 3`.
        let high_halves = _mm512_set_epi16(
            63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11,
            9, 7, 5, 3, 1,
        );
        let low_halves = _mm512_set1_epi32(0xffff);
        let mut dropped = _mm512_setzero_si512();
        for span in 0..spans {
            let mut r = [_mm512_setzero_ps(); EDGE];
            for (pairs, &row) in r.iter_mut().zip(rows) {
                // SAFETY: the row has this span's 32 values.
                let (first, second) = unsafe {
                    let at = row.add(span * DEPTH);
                    (_mm512_loadu_si512(at.cast()), _mm512_loadu_si512(at.add(EDGE).cast()))
                };
                dropped = _mm512_or_si512(dropped, _mm512_and_si512(_mm512_or_si512(first, second), low_halves));
                *pairs = _mm512_castsi512_ps(_mm512_permutex2var_epi16(first, high_halves, second));
            }
            for (p, row) in transpose(r).into_iter().enumerate() {
                let at = (span * EDGE + p) * EDGE;
                // SAFETY: tile `span`'s row `p` lies inside `tiles`.
                unsafe { _mm512_storeu_ps(tiles[at..at + EDGE].as_mut_ptr().cast(), row) };
            }
        }
        _mm512_test_epi32_mask(dropped, dropped) == 0
    }

    /// A tile of sums (sixteen weight rows by sixteen input rows) into
    /// the output rows `outs` (up to sixteen, one per input row), columns
    /// `n..n + columns`: transposed in registers, a row's sums stored at once.
    ///
    /// # Safety
    /// Each of `outs` has room for those columns; the CPU has AVX-512 F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn store_transposed(sums: &[f32; EDGE * EDGE], outs: &[*mut f32], n: usize, columns: usize) {
        use std::arch::x86_64::*;
        let mut r = [_mm512_setzero_ps(); EDGE];
        for (i, row) in r.iter_mut().enumerate() {
            // SAFETY: `sums` holds sixteen rows of sixteen.
            *row = unsafe { _mm512_loadu_ps(sums[i * EDGE..].as_ptr()) };
        }
        let r = transpose(r);
        let mask: __mmask16 = if columns >= EDGE { !0 } else { (1 << columns) - 1 };
        for (out, row) in outs.iter().zip(r) {
            // SAFETY: as the caller promises.
            unsafe { _mm512_mask_storeu_ps(out.add(n), mask, row) };
        }
    }

    /// The four tiles of [`sums`] of weight rows `n..` against input
    /// blocks `block` and `block + 1` into their output rows (`outs`, one
    /// per input row), the columns before `end`.
    ///
    /// # Safety
    /// Each of `outs` has room for columns `n..end`, which no other thread
    /// writes.
    #[inline(always)]
    pub unsafe fn store_sums(sums: &[[f32; EDGE * EDGE]; 4], outs: &[*mut f32], n: usize, block: usize, end: usize) {
        // Sums tile `2i + j` holds weight rows `16i..` by input rows `16j..`.
        for (tile, sums) in sums.iter().enumerate() {
            let (n0, m0) = (n + (tile / 2) * EDGE, (block + tile % 2) * EDGE);
            let (columns, outs) = (end.saturating_sub(n0).min(EDGE), outs.get(m0..).unwrap_or(&[]));
            if columns > 0 && !outs.is_empty() {
                // SAFETY: each of the first sixteen rows of `outs` has room
                // for columns `n0..n0 + columns`, as the caller promises.
                unsafe { store_transposed(sums, &outs[..outs.len().min(EDGE)], n0, columns) };
            }
        }
    }

    /// The low pairs of values of each 128-bit lane of `a` and `b`, interleaved.
    #[inline(always)]
    fn pairs_low(a: std::arch::x86_64::__m512, b: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // SAFETY: only inlined into functions with AVX-512 F.
        unsafe { _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b))) }
    }

    /// The high pairs of values of each 128-bit lane of `a` and `b`, interleaved.
    #[inline(always)]
    fn pairs_high(a: std::arch::x86_64::__m512, b: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // SAFETY: only inlined into functions with AVX-512 F.
        unsafe { _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b))) }
    }

    /// The four tiles of sums of weight tiles `a` (rows `a_stride` bytes
    /// apart) against input tiles of blocks `b`, over the whole depth:
    /// tile `2i + j` is A`i` · B`j`, the tiles without an A1 (`TWO_A`) or
    /// a B1 (`TWO_B`) left zero.
    ///
    /// # Safety
    /// The tiles are configured; `a`'s rows and `b`'s blocks exist.
    #[inline(always)]
    pub unsafe fn sums<const TWO_A: bool, const TWO_B: bool>(
        a: [*const u8; 2],
        a_stride: usize,
        inputs: &Inputs,
        b: [usize; 2],
    ) -> [[f32; EDGE * EDGE]; 4] {
        #[repr(C, align(64))]
        struct Sums([[f32; EDGE * EDGE]; 4]);
        let mut out = Sums([[0.0; EDGE * EDGE]; 4]);
        // SAFETY: as the caller promises; every tile's 16 rows of 64
        // bytes lie inside its operand.
        unsafe {
            asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack, nomem));
            for span in 0..inputs.spans {
                let a_at = span * DEPTH * 2;
                asm!("tileloadd tmm4, [{p} + {s}*1]", p = in(reg) a[0].add(a_at), s = in(reg) a_stride, options(nostack, readonly));
                asm!("tileloadd tmm6, [{p} + {s}*1]", p = in(reg) inputs.tile(b[0], span), s = in(reg) 64usize, options(nostack, readonly));
                if TWO_B {
                    asm!("tileloadd tmm7, [{p} + {s}*1]", p = in(reg) inputs.tile(b[1], span), s = in(reg) 64usize, options(nostack, readonly));
                }
                if TWO_A {
                    asm!("tileloadd tmm5, [{p} + {s}*1]", p = in(reg) a[1].add(a_at), s = in(reg) a_stride, options(nostack, readonly));
                }
                asm!("tdpbf16ps tmm0, tmm4, tmm6", options(nostack, nomem));
                if TWO_B {
                    asm!("tdpbf16ps tmm1, tmm4, tmm7", options(nostack, nomem));
                }
                if TWO_A {
                    asm!("tdpbf16ps tmm2, tmm5, tmm6", options(nostack, nomem));
                }
                if TWO_A && TWO_B {
                    asm!("tdpbf16ps tmm3, tmm5, tmm7", options(nostack, nomem));
                }
            }
            let base = out.0.as_mut_ptr() as *mut u8;
            let at = |tile: usize| base.add(tile * TILE_BYTES);
            asm!("tilestored [{p} + {s}*1], tmm0", p = in(reg) at(0), s = in(reg) 64usize, options(nostack));
            asm!("tilestored [{p} + {s}*1], tmm1", p = in(reg) at(1), s = in(reg) 64usize, options(nostack));
            asm!("tilestored [{p} + {s}*1], tmm2", p = in(reg) at(2), s = in(reg) 64usize, options(nostack));
            asm!("tilestored [{p} + {s}*1], tmm3", p = in(reg) at(3), s = in(reg) 64usize, options(nostack));
        }
        out.0
    }
}
