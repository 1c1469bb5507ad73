//! Host tensors, the values of the backends that compute in host memory
//! (the interpreter and the CPU) and what crosses the executor's boundary
//! (inputs, outputs, parameters at load): a dtype, a row-major shape, and
//! the elements. Floats of every width are held as f32 (a bf16 or f16
//! value is exact in f32), and integers as i64, so that one evaluator
//! serves every dtype; the one
//! exceptions are parameters, held as stored ([`held_as_stored`]): a bf16
//! parameter as its bf16 bits, which halves the memory weights take, and a
//! quantized one as its blocks ([`Data::Blocks`]). Elements may be read
//! where they lie in a mapped checkpoint ([`Elements::Mapped`]), not
//! copied.

use linnet_ir::numerics::round;
pub use linnet_ir::numerics::{bf16_bits, bf16_value};
use linnet_ir::quant::{self, BlockFormat};
use linnet_ir::Dtype;
use linnet_ir::{Node, NodeKind, Param};
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

/// Element types every bit pattern of which is a value, so that mapped
/// bytes can be read as them.
pub trait Plain: Copy + PartialEq + std::fmt::Debug + 'static {}
impl Plain for f32 {}
impl Plain for u16 {}
impl Plain for u8 {}

/// Elements: owned, or in place in mapped bytes (a checkpoint's tensor of
/// the right dtype is not copied). Writing to mapped elements copies them
/// first.
pub enum Elements<T: Plain> {
    Owned(Vec<T>),
    Mapped { bytes: Arc<dyn AsRef<[u8]> + Send + Sync>, offset: usize, len: usize },
}

/// f32 elements, the storage of every float value but bf16 parameters.
pub type Floats = Elements<f32>;

impl<T: Plain> Elements<T> {
    /// `len` values at `offset` in `bytes`, in place; `None` when they are
    /// not aligned for `T`, out of bounds, or the host is big-endian.
    pub fn mapped(bytes: Arc<dyn AsRef<[u8]> + Send + Sync>, offset: usize, len: usize) -> Option<Elements<T>> {
        let all = (*bytes).as_ref();
        let fits = offset.checked_add(len.checked_mul(std::mem::size_of::<T>())?).is_some_and(|end| end <= all.len());
        let aligned = (all.as_ptr() as usize + offset).is_multiple_of(std::mem::align_of::<T>());
        (fits && aligned && cfg!(target_endian = "little")).then_some(Elements::Mapped { bytes, offset, len })
    }

    pub fn is_mapped(&self) -> bool {
        matches!(self, Elements::Mapped { .. })
    }
}

impl<T: Plain> Deref for Elements<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match self {
            Elements::Owned(values) => values,
            Elements::Mapped { bytes, offset, len } => {
                let all = (**bytes).as_ref();
                // SAFETY: `mapped` checked that the range is inside the
                // bytes and aligned for `T`; every bit pattern is a `T`
                // (`Plain`), and the bytes live as long as the `Arc`.
                unsafe { std::slice::from_raw_parts(all.as_ptr().add(*offset) as *const T, *len) }
            }
        }
    }
}

impl<T: Plain> DerefMut for Elements<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        if self.is_mapped() {
            *self = Elements::Owned(self.to_vec());
        }
        match self {
            Elements::Owned(values) => values,
            Elements::Mapped { .. } => unreachable!("copied above"),
        }
    }
}

impl<T: Plain> From<Vec<T>> for Elements<T> {
    fn from(values: Vec<T>) -> Elements<T> {
        Elements::Owned(values)
    }
}

impl<T: Plain> Clone for Elements<T> {
    fn clone(&self) -> Elements<T> {
        match self {
            Elements::Owned(values) => Elements::Owned(values.clone()),
            Elements::Mapped { bytes, offset, len } => {
                Elements::Mapped { bytes: Arc::clone(bytes), offset: *offset, len: *len }
            }
        }
    }
}

impl<T: Plain> std::fmt::Debug for Elements<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.deref().fmt(f)
    }
}

impl<T: Plain> PartialEq for Elements<T> {
    fn eq(&self, other: &Elements<T>) -> bool {
        self.deref() == other.deref()
    }
}

/// Whether a node's value is held as stored rather than as f32: bf16
/// parameters (as their bits) and quantized ones (as their blocks) are.
/// Backends address and widen such values themselves.
pub fn held_as_stored(node: &Node, params: &[Param]) -> bool {
    match node.kind {
        NodeKind::Param(at) => node.dtype == Dtype::Bf16 || params[at].storage.is_some(),
        _ => false,
    }
}

/// Whether `tensor` can be `param`'s value: its shape, and its elements
/// held as the parameter is stored (blocks of its format, whole).
pub fn holds(tensor: &Tensor, param: &Param) -> bool {
    let held = match (&tensor.data, param.storage) {
        (Data::Blocks(format, bytes), Some(stored)) => *format == stored && bytes.len() == param.bytes(),
        (Data::Blocks(..), None) | (_, Some(_)) => false,
        (data, None) => data_len(data) == tensor.len(),
    };
    tensor.shape == param.shape && held
}

fn data_len(data: &Data) -> usize {
    match data {
        Data::F32(values) => values.len(),
        Data::Bf16(bits) => bits.len(),
        Data::Blocks(_, bytes) => bytes.len(),
        Data::I64(values) => values.len(),
        Data::Bool(values) => values.len(),
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    F32(Floats),
    /// bf16 values as their bits (bf16 parameters only).
    Bf16(Elements<u16>),
    /// Values in blocks of a format (quantized parameters only): they mean
    /// their dequantized values (`quant::dequantize`).
    Blocks(BlockFormat, Elements<u8>),
    I64(Vec<i64>),
    Bool(Vec<bool>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub data: Data,
}

impl Tensor {
    pub fn zeros(dtype: Dtype, shape: Vec<usize>) -> Tensor {
        let count = shape.iter().product();
        let data = match dtype {
            Dtype::Bool => Data::Bool(vec![false; count]),
            Dtype::I32 | Dtype::I64 => Data::I64(vec![0; count]),
            _ => Data::F32(vec![0.0; count].into()),
        };
        Tensor { dtype, shape, data }
    }

    pub fn from_f32(dtype: Dtype, shape: Vec<usize>, values: Vec<f32>) -> Tensor {
        debug_assert!(dtype.is_float());
        Tensor {
            dtype,
            shape,
            data: Data::F32(values.into_iter().map(|v| round(v as f64, dtype) as f32).collect::<Vec<f32>>().into()),
        }
    }

    pub fn from_i64(dtype: Dtype, shape: Vec<usize>, values: Vec<i64>) -> Tensor {
        Tensor { dtype, shape, data: Data::I64(values) }
    }

    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn as_f32(&self) -> Option<&[f32]> {
        match &self.data {
            Data::F32(values) => Some(values),
            _ => None,
        }
    }

    /// A bf16 tensor held as its bits (as bf16 parameters are); blocks
    /// stay blocks.
    pub fn into_bits(self) -> Tensor {
        match self.data {
            Data::F32(values) if self.dtype == Dtype::Bf16 => {
                let bits = values.iter().map(|v| bf16_bits(*v)).collect::<Vec<u16>>();
                Tensor { data: Data::Bf16(bits.into()), ..self }
            }
            _ => self,
        }
    }

    /// The tensor with floats held as f32, widened if it is held as bits or
    /// dequantized if it is held as blocks.
    pub fn widened(&self) -> std::borrow::Cow<'_, Tensor> {
        match &self.data {
            Data::Bf16(bits) => {
                let values: Vec<f32> = bits.iter().map(|b| bf16_value(*b)).collect();
                std::borrow::Cow::Owned(Tensor {
                    dtype: self.dtype,
                    shape: self.shape.clone(),
                    data: Data::F32(values.into()),
                })
            }
            Data::Blocks(format, blocks) => {
                let mut values = vec![0f32; self.len()];
                quant::dequantize(*format, blocks, &mut values).expect("blocks are checked when they are loaded");
                std::borrow::Cow::Owned(Tensor {
                    dtype: self.dtype,
                    shape: self.shape.clone(),
                    data: Data::F32(values.into()),
                })
            }
            _ => std::borrow::Cow::Borrowed(self),
        }
    }

    /// A parameter's tensor as its checkpoint stores it
    /// (`Param::checkpoint_shape`), laid out as the model keeps it
    /// (`Param::axes`): its values moved, blocks dequantized first.
    pub fn laid_out(self, param: &Param) -> Tensor {
        let Some(axes) = &param.axes else { return self };
        let widened = self.widened();
        let values = widened.as_f32().expect("a laid-out parameter is a float");
        let from = &self.shape;
        // Each kept axis's stride in the stored tensor.
        let mut stored_strides = vec![1usize; from.len()];
        for axis in (0..from.len().saturating_sub(1)).rev() {
            stored_strides[axis] = stored_strides[axis + 1] * from[axis + 1];
        }
        let strides = linnet_ir::layout::permuted(&stored_strides, axes);
        let shape = linnet_ir::layout::permuted(from, axes);
        let mut out = Vec::with_capacity(values.len());
        let mut at = vec![0usize; shape.len()];
        for _ in 0..values.len() {
            out.push(values[at.iter().zip(&strides).map(|(i, s)| i * s).sum::<usize>()]);
            for axis in (0..shape.len()).rev() {
                at[axis] += 1;
                if at[axis] < shape[axis] {
                    break;
                }
                at[axis] = 0;
            }
        }
        Tensor::from_f32(self.dtype, shape, out).into_bits()
    }

    pub fn as_i64(&self) -> Option<&[i64]> {
        match &self.data {
            Data::I64(values) => Some(values),
            _ => None,
        }
    }
}

/// The memory half of `exec::Backend` for the backends that compute on
/// host tensors (the interpreter, the CPU): inputs and parameters are used
/// where they are (`dequantized`: blocks are dequantized exactly when
/// uploaded), values come back with floats as f32, copies too.
#[macro_export]
#[doc(hidden)]
macro_rules! __host_memory {
    () => {
        fn upload(&mut self, tensor: $crate::tensor::Tensor) -> Result<$crate::tensor::Tensor, $crate::MemoryError> {
            Ok(tensor)
        }
        $crate::tensor::host_memory!(@rest);
    };
    // Blocks held dequantized (exactly), for a backend that reads values
    // one at a time: decoding a value from its block on every read would
    // cost as much as a block's worth of reads.
    (dequantized) => {
        fn upload(&mut self, tensor: $crate::tensor::Tensor) -> Result<$crate::tensor::Tensor, $crate::MemoryError> {
            Ok(match tensor.data {
                $crate::tensor::Data::Blocks(..) => tensor.widened().into_owned(),
                _ => tensor,
            })
        }
        $crate::tensor::host_memory!(@rest);
    };
    (@rest) => {
        fn download(&mut self, buffer: &$crate::tensor::Tensor) -> Result<$crate::tensor::Tensor, $crate::MemoryError> {
            Ok(buffer.widened().into_owned())
        }

        fn zeros(
            &mut self,
            dtype: ::linnet_ir::Dtype,
            shape: &[usize],
        ) -> Result<$crate::tensor::Tensor, $crate::MemoryError> {
            Ok($crate::tensor::Tensor::zeros(dtype, shape.to_vec()))
        }

        fn copy(&mut self, buffer: &$crate::tensor::Tensor) -> Result<$crate::tensor::Tensor, $crate::MemoryError> {
            Ok(buffer.widened().into_owned())
        }

        fn read_row(
            &mut self,
            buffer: &$crate::tensor::Tensor,
            row: usize,
            length: Option<usize>,
        ) -> Result<$crate::tensor::Tensor, $crate::MemoryError> {
            $crate::rows::read_row(buffer, row, length)
        }

        fn write_row(
            &mut self,
            buffer: &mut $crate::tensor::Tensor,
            row: usize,
            part: &$crate::tensor::Tensor,
        ) -> Result<(), $crate::MemoryError> {
            $crate::rows::write_row(buffer, row, part)
        }
    };
}
pub use crate::__host_memory as host_memory;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parameter_is_laid_out_with_its_axes_moved() {
        // Stored [2, 3, 4]; kept with axis 1 last: [2, 4, 3].
        let param = Param {
            path: "w".into(),
            shape: vec![2, 4, 3],
            dtype: Dtype::Bf16,
            storage: None,
            axes: Some(vec![0, 2, 1]),
            tiled: None,
        };
        assert_eq!(param.checkpoint_shape(), vec![2, 3, 4]);
        let stored = Tensor::from_f32(Dtype::Bf16, vec![2, 3, 4], (0..24).map(|v| v as f32).collect()).into_bits();
        let kept = stored.laid_out(&param);
        assert_eq!((kept.shape.clone(), kept.dtype), (vec![2, 4, 3], Dtype::Bf16));
        assert!(matches!(kept.data, Data::Bf16(_)), "bf16 stays bits");
        // kept[a][c][b] = stored[a][b][c] = 12a + 4b + c.
        let values = kept.widened().as_f32().unwrap().to_vec();
        let expected: Vec<f32> =
            (0..2).flat_map(|a| (0..4).flat_map(move |c| (0..3).map(move |b| (12 * a + 4 * b + c) as f32))).collect();
        assert_eq!(values, expected);
    }
}
