//! The operands of a contraction: weight elements ([`Weight`]), a weight
//! matrix in any of its storages ([`Matrix`]), and input and output rows
//! wherever they lie ([`Rows`]).

use linnet_ir::quant::BlockFormat;

/// A weight element: f32, or bf16 held as its bits.
pub trait Weight: Copy + Sync {
    /// Whether the elements are bf16 bits.
    const BF16: bool;
    fn value(self) -> f32;
}

impl Weight for f32 {
    const BF16: bool = false;
    fn value(self) -> f32 {
        self
    }
}

impl Weight for u16 {
    const BF16: bool = true;
    fn value(self) -> f32 {
        linnet_ir::numerics::bf16_value(self)
    }
}

/// A weight matrix, `columns × depth` values in rows: f32, bf16 bits, or
/// rows of blocks of a format (`linnet_ir::quant`), read where it lies.
#[derive(Clone, Copy, Debug)]
pub enum Matrix<'a> {
    F32(&'a [f32]),
    Bf16(&'a [u16]),
    Blocks(BlockFormat, &'a [u8]),
    /// Blocks of a parameter declared bf16: a product over more rows than
    /// a decode step's may take its values rounded to bf16
    /// (`docs/language.md`), then multiply them in bf16 dot products.
    Bf16Blocks(BlockFormat, &'a [u8]),
}

impl Matrix<'_> {
    /// Its bytes, which a product streams from memory.
    pub(crate) fn bytes(&self) -> usize {
        match self {
            Matrix::F32(values) => std::mem::size_of_val(*values),
            Matrix::Bf16(bits) => std::mem::size_of_val(*bits),
            Matrix::Blocks(_, bytes) | Matrix::Bf16Blocks(_, bytes) => bytes.len(),
        }
    }

    /// Whether it holds `columns × depth` values.
    pub(crate) fn holds(&self, columns: usize, depth: usize) -> bool {
        match self {
            Matrix::F32(values) => values.len() == columns * depth,
            Matrix::Bf16(bits) => bits.len() == columns * depth,
            Matrix::Blocks(format, bytes) | Matrix::Bf16Blocks(format, bytes) => {
                format.row_bytes(depth).map(|row| row * columns) == Some(bytes.len())
            }
        }
    }
}

impl<'a> From<&'a [f32]> for Matrix<'a> {
    fn from(values: &'a [f32]) -> Matrix<'a> {
        Matrix::F32(values)
    }
}

impl<'a> From<&'a [u16]> for Matrix<'a> {
    fn from(bits: &'a [u16]) -> Matrix<'a> {
        Matrix::Bf16(bits)
    }
}

/// Input rows and the output rows they produce, wherever they are.
pub struct Rows {
    pub inputs: Vec<*const f32>,
    pub outs: Vec<*mut f32>,
}

// SAFETY: the threads of `matmul_groups` read the inputs and write disjoint
// columns of the outputs.
unsafe impl Sync for Rows {}
