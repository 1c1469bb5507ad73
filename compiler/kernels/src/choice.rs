//! Which kernel multiplies a group of input rows by a weight matrix: one
//! table of what each block format's weights can be multiplied with
//! ([`FormatKernels`]), and one function ([`choose`]) of the weights'
//! storage, the instruction set, the count of rows and the batch order
//! ([`BatchOrder`]) that the products (`matmul`) and their tests both ask.

use super::dequant::{self, DOT_ROWS};
use super::isa::Isa;
use super::matrix::Matrix;
use super::{amx, byte_tiles, int8};
use linnet_ir::quant::BlockFormat;
use std::sync::atomic::{AtomicU8, Ordering};

/// How a weight matrix is held, as far as choosing its kernel goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    F32,
    Bf16,
    /// Blocks of a parameter declared f32: decoded exactly.
    Blocks(BlockFormat),
    /// Blocks of a parameter declared bf16, whose products the numerics
    /// contract lets round (`docs/language.md`).
    Bf16Blocks(BlockFormat),
}

impl Storage {
    pub fn of(matrix: &Matrix) -> Storage {
        match matrix {
            Matrix::F32(_) => Storage::F32,
            Matrix::Bf16(_) => Storage::Bf16,
            Matrix::Blocks(format, _) => Storage::Blocks(*format),
            Matrix::Bf16Blocks(format, _) => Storage::Bf16Blocks(*format),
        }
    }
}

/// Whether a row's products may depend on the rows multiplied beside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchOrder {
    /// One kernel for every count of rows of a storage on an instruction
    /// set, so that each row's sums are taken in one order: a row's
    /// outputs are the same bits alone, batched with others or prefilled
    /// in parts (the numerics contract's batch invariance), whatever the
    /// weights' storage (`--batch-invariant`).
    Invariant,
    /// [`BatchOrder::Invariant`] for weights stored as plain values (f32,
    /// bf16), whose invariant kernels are the fast ones;
    /// [`BatchOrder::Variant`] for weights in blocks, whose invariant
    /// kernels cost a decode step or a prefill several times its time
    /// (`docs/language.md`). The default.
    PlainInvariant,
    /// The fastest kernel for the count of rows: f32 lanes for up to three
    /// rows of bf16 weights, decoded blocks summed from registers for a
    /// decode step's rows, the VNNI panels, AMX byte tiles and bf16 tiles
    /// past them. A row's last bits then depend on how many rows share its
    /// call, and what they are (`--batch-variant`).
    Variant,
}

impl BatchOrder {
    /// Whether products over weights held as `storage` take one kernel
    /// whatever the rows.
    pub fn invariant_for(self, storage: Storage) -> bool {
        match self {
            BatchOrder::Invariant => true,
            BatchOrder::PlainInvariant => matches!(storage, Storage::F32 | Storage::Bf16),
            BatchOrder::Variant => false,
        }
    }
}

/// The process's batch order, as its index in [`ORDERS`].
static ORDER: AtomicU8 = AtomicU8::new(1);

/// Every batch order, in [`ORDER`]'s numbering.
const ORDERS: [BatchOrder; 3] = [BatchOrder::Invariant, BatchOrder::PlainInvariant, BatchOrder::Variant];

/// The batch order every product of this process takes (`matmul::matmul`
/// and the grouped products), [`BatchOrder::PlainInvariant`] unless set.
pub fn batch_order() -> BatchOrder {
    ORDERS[usize::from(ORDER.load(Ordering::Relaxed))]
}

/// Sets the process's batch order: before the first product, since rows
/// multiplied in one order and then another are not comparable.
pub fn set_batch_order(order: BatchOrder) {
    let at = ORDERS.iter().position(|&o| o == order).expect("every order is listed");
    ORDER.store(at as u8, Ordering::Relaxed);
}

/// The products a block format's weights have besides being decoded into
/// f32 lanes, each over input rows quantized to 8-bit levels per
/// [`int8::SPAN`] values (the contract's integer-product freedom).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FormatKernels {
    /// Integer dot products, row by row (`int8`), for a decode step's rows.
    pub int8: bool,
    /// Integer products past a decode step's rows too: where AVX2's byte
    /// products multiply four times the values an instruction its eight
    /// f32 lanes do, and where the panels or byte tiles take the rows.
    pub int8_past_decode: bool,
    /// AVX-512 VNNI panels of sixteen weight rows (`panels`).
    pub panels: bool,
    /// AMX byte tiles (`byte_tiles`).
    pub byte_tiles: bool,
}

/// The table: what each block format is multiplied with.
pub fn kernels_of(format: BlockFormat) -> FormatKernels {
    match format {
        BlockFormat::Q4K => FormatKernels { int8: true, int8_past_decode: true, panels: true, byte_tiles: true },
        BlockFormat::Q2K | BlockFormat::Q3K | BlockFormat::Q5K | BlockFormat::Q6K => {
            FormatKernels { int8: true, int8_past_decode: true, panels: false, byte_tiles: false }
        }
        BlockFormat::Q4_0
        | BlockFormat::Q4_1
        | BlockFormat::Q5_0
        | BlockFormat::Q5_1
        | BlockFormat::Q8_0
        | BlockFormat::Iq4Nl
        | BlockFormat::Iq4Xs
        | BlockFormat::Mxfp4 => FormatKernels { int8: true, int8_past_decode: false, panels: false, byte_tiles: false },
    }
}

/// A kernel of the contractions, as [`choose`] picks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Product {
    /// The weights widened into f32 lanes as they are read (f32, bf16 bits).
    Lanes,
    /// Blocks decoded into f32 lanes, exactly, and multiplied as f32
    /// weights (`matmul`'s tiles).
    Decoded,
    /// Blocks decoded in registers straight into a decode step's sums
    /// (`dequant::dot_columns`): the same values, each group's scale
    /// applied to its sum.
    Dots,
    /// bf16 dot products (vectors or AMX tiles) over inputs that are
    /// exactly bf16 values; other inputs take [`Product::Lanes`].
    Bf16Dots,
    /// Blocks decoded and rounded to bf16, then bf16 dot products, over
    /// inputs that are exactly bf16 values; other inputs take
    /// [`Product::Decoded`].
    RoundedBf16Dots,
    /// Integer dot products over quantized inputs, row by row (`int8`).
    Int8,
    /// The VNNI panels over quantized inputs (`panels`).
    Panels,
    /// AMX byte tiles over quantized inputs (`byte_tiles`).
    ByteTiles,
}

impl Product {
    /// Whether the inputs are quantized to 8-bit levels for it.
    pub fn quantizes(self) -> bool {
        matches!(self, Product::Int8 | Product::Panels | Product::ByteTiles)
    }

    /// Whether the inputs are converted to bf16 for it.
    pub fn converts_to_bf16(self) -> bool {
        matches!(self, Product::Bf16Dots | Product::RoundedBf16Dots)
    }
}

/// The kernel that multiplies `rows` input rows of `depth` values by
/// weights held as `storage` on `isa` (which the CPU has), in `order`.
pub fn choose(isa: Isa, storage: Storage, rows: usize, depth: usize, order: BatchOrder) -> Product {
    match order.invariant_for(storage) {
        true => invariant(isa, storage, depth),
        false => fastest(isa, storage, rows, depth),
    }
}

/// The one kernel of a storage whatever the rows: bf16 dot products for
/// bf16 weights and for blocks of a parameter declared bf16 (decoded and
/// rounded to bf16) where the CPU has them (AMX tiles or `vdpbf16ps`,
/// whose sums of a row take one order however many rows share the
/// weights: `matmul` splits a call's rows that are not bf16 values off to
/// the f32 lanes, row by row); for a parameter declared bf16 in a format
/// with integer products, those products over every row (each row
/// quantized on its own); else f32 lanes for f32 and bf16 weights, blocks
/// decoded and multiplied as f32 weights.
fn invariant(isa: Isa, storage: Storage, depth: usize) -> Product {
    let bf16_dots = isa.has_bf16_dots() && depth.is_multiple_of(2);
    match storage {
        Storage::Bf16Blocks(format) if kernels_of(format).int8 && depth.is_multiple_of(format.block_values()) => {
            Product::Int8
        }
        Storage::Bf16 if bf16_dots => Product::Bf16Dots,
        Storage::Bf16Blocks(_) if bf16_dots => Product::RoundedBf16Dots,
        Storage::F32 | Storage::Bf16 => Product::Lanes,
        Storage::Blocks(_) | Storage::Bf16Blocks(_) => Product::Decoded,
    }
}

/// The fastest kernel for `rows`.
///
/// Integer products over quantized inputs, for a parameter declared bf16
/// in blocks, where its format has them and the rows are whole blocks: a
/// decode step's few rows (decoding each weight into an f32 lane costs
/// more than reading it), and past them where [`FormatKernels`] says so
/// and the lanes are AVX2's or the panels or byte tiles take the rows (the
/// panels past a decode step's rows on a CPU with VNNI whose bf16 products
/// are vectors; the byte tiles up to [`byte_tiles::MOST_ROWS`] on AMX with
/// byte products). Else bf16 dot products where tiles of four rows reuse
/// each weight load: bf16 weights from four rows, a parameter declared
/// bf16 in blocks past a decode step's rows. Blocks against a decode
/// step's rows are summed from registers.
fn fastest(isa: Isa, storage: Storage, rows: usize, depth: usize) -> Product {
    let past_decode = rows > DOT_ROWS;
    if let Storage::Bf16Blocks(format) = storage {
        let kernels = kernels_of(format);
        let panels = kernels.panels && past_decode && matches!(isa, Isa::Avx512Bf16 | Isa::Avx512) && int8::has_vnni();
        let byte_tiles = kernels.byte_tiles
            && past_decode
            && rows <= byte_tiles::MOST_ROWS
            && isa == Isa::Amx
            && amx::has_byte_products();
        let past_them = kernels.int8_past_decode && (isa.lanes() == Isa::Avx2 || panels || byte_tiles);
        if kernels.int8 && depth.is_multiple_of(format.block_values()) && (!past_decode || past_them) {
            return match (panels, byte_tiles) {
                (true, _) => Product::Panels,
                (_, true) => Product::ByteTiles,
                _ => Product::Int8,
            };
        }
    }
    let bf16_dots = isa.has_bf16_dots() && depth.is_multiple_of(2);
    match storage {
        Storage::Bf16 if bf16_dots && rows >= 4 => Product::Bf16Dots,
        Storage::Bf16Blocks(_) if bf16_dots && past_decode => Product::RoundedBf16Dots,
        Storage::F32 | Storage::Bf16 => Product::Lanes,
        Storage::Blocks(_) | Storage::Bf16Blocks(_) if !past_decode && dequant::dots_on(isa) => Product::Dots,
        Storage::Blocks(_) | Storage::Bf16Blocks(_) => Product::Decoded,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each kernel over quantized inputs is chosen only on a CPU that has
    /// its instructions, and only for the formats the table gives it.
    #[test]
    fn a_kernel_is_chosen_only_where_the_cpu_and_the_format_have_it() {
        for (isa, order) in Isa::available().into_iter().flat_map(|isa| ORDERS.map(|order| (isa, order))) {
            for format in BlockFormat::ALL {
                for rows in 1..=byte_tiles::MOST_ROWS + 1 {
                    let product = choose(isa, Storage::Bf16Blocks(format), rows, 4 * int8::SPAN, order);
                    if product == Product::Panels {
                        assert!(int8::has_vnni() && kernels_of(format).panels, "panels for {format} on {isa:?}");
                    }
                    if product == Product::ByteTiles {
                        assert!(amx::has_byte_products() && kernels_of(format).byte_tiles, "tiles for {format}");
                    }
                    if product == Product::Dots {
                        assert!(dequant::dots_on(isa) && rows <= DOT_ROWS, "dots for {rows} rows on {isa:?}");
                    }
                    assert!(!choose(isa, Storage::Blocks(format), rows, 4 * int8::SPAN, order).quantizes());
                }
            }
        }
    }

    /// A decode step's rows of a format with integer products always take
    /// them; an odd depth never takes bf16 dot products.
    #[test]
    fn decode_rows_take_integer_products_and_odd_depths_no_bf16_dots() {
        for (isa, order) in Isa::available().into_iter().flat_map(|isa| ORDERS.map(|order| (isa, order))) {
            for format in BlockFormat::ALL {
                let invariant = order.invariant_for(Storage::Bf16Blocks(format));
                let others = match (invariant, dequant::dots_on(isa), isa.has_bf16_dots()) {
                    (false, true, _) => Product::Dots,
                    (true, _, true) => Product::RoundedBf16Dots,
                    _ => Product::Decoded,
                };
                let expected = if kernels_of(format).int8 { Product::Int8 } else { others };
                assert_eq!(choose(isa, Storage::Bf16Blocks(format), 1, int8::SPAN, order), expected, "{format}");
                // A depth the span does not divide (gpt-oss's 2880) but the blocks do.
                if format.block_values() == int8::RUN {
                    assert_eq!(choose(isa, Storage::Bf16Blocks(format), 1, 2880, order), expected, "{format}");
                }
            }
            assert_eq!(choose(isa, Storage::Bf16, 64, 33, order), Product::Lanes);
        }
    }

    /// Every storage on every instruction set this CPU has.
    fn every_storage_on_every_isa() -> impl Iterator<Item = (Isa, Storage)> {
        let storages = [Storage::F32, Storage::Bf16].into_iter().chain(
            BlockFormat::ALL.into_iter().flat_map(|format| [Storage::Blocks(format), Storage::Bf16Blocks(format)]),
        );
        Isa::available().into_iter().flat_map(move |isa| storages.clone().map(move |storage| (isa, storage)))
    }

    /// In the invariant order a storage takes one kernel whatever the
    /// count of rows, on every instruction set.
    #[test]
    fn the_invariant_order_takes_one_kernel_for_every_count_of_rows() {
        for (isa, storage) in every_storage_on_every_isa() {
            for depth in [int8::SPAN, 4 * int8::SPAN, 96, 33] {
                let one = choose(isa, storage, 1, depth, BatchOrder::Invariant);
                for rows in 2..=byte_tiles::MOST_ROWS + 20 {
                    assert_eq!(choose(isa, storage, rows, depth, BatchOrder::Invariant), one, "{storage:?} on {isa:?}");
                }
            }
        }
    }

    /// The default order is the invariant one for weights stored as plain
    /// values and the variant one for blocks, and the process starts in it.
    #[test]
    fn the_default_order_is_invariant_for_plain_weights_only() {
        assert_eq!(batch_order(), BatchOrder::PlainInvariant);
        for (isa, storage) in every_storage_on_every_isa() {
            let like = match storage {
                Storage::F32 | Storage::Bf16 => BatchOrder::Invariant,
                Storage::Blocks(_) | Storage::Bf16Blocks(_) => BatchOrder::Variant,
            };
            for rows in 1..=byte_tiles::MOST_ROWS + 1 {
                let default = choose(isa, storage, rows, 4 * int8::SPAN, BatchOrder::PlainInvariant);
                assert_eq!(default, choose(isa, storage, rows, 4 * int8::SPAN, like), "{storage:?} on {isa:?}");
            }
        }
    }
}
