//! Host tensors as the GPU kernels store values (`emit`: little-endian
//! elements of their dtype, bf16 as its bits, bool as one byte), and back:
//! what crosses to and from the kernels on the host and on a device.

use super::GpuError;
use linnet_exec::tensor::{Data, Tensor};
use linnet_ir::numerics::{bf16_bits, bf16_value};
use linnet_ir::Dtype;

/// A value as its kernel stores it: little-endian elements of its dtype
/// (bf16 and f16 as bits, bool as one byte); a quantized parameter's
/// blocks as they are (`dequant` reads them).
pub fn stored(tensor: &Tensor, dtype: Dtype) -> Result<Vec<u8>, GpuError> {
    if let Data::Blocks(_, blocks) = &tensor.data {
        return Ok(blocks.to_vec());
    }
    let widened = tensor.widened();
    Ok(match (&widened.data, dtype) {
        (Data::F32(values), Dtype::F32) => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        (Data::F32(values), Dtype::Bf16) => values.iter().flat_map(|v| bf16_bits(*v).to_le_bytes()).collect(),
        (Data::I64(values), Dtype::I32) => values.iter().flat_map(|v| (*v as i32).to_le_bytes()).collect(),
        (Data::I64(values), Dtype::I64) => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        (Data::Bool(values), Dtype::Bool) => values.iter().map(|v| u8::from(*v)).collect(),
        _ => return Err(GpuError::Layout(format!("the GPU kernels do not hold {} values", dtype.name()))),
    })
}

/// A kernel's output as a host tensor (floats held as f32).
pub fn loaded(bytes: &[u8], dtype: Dtype, shape: Vec<usize>) -> Tensor {
    match dtype {
        Dtype::F32 => Tensor {
            dtype,
            shape,
            data: Data::F32(
                bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect::<Vec<f32>>()
                    .into(),
            ),
        },
        Dtype::Bf16 => Tensor {
            dtype,
            shape,
            data: Data::F32(
                bytes
                    .chunks_exact(2)
                    .map(|c| bf16_value(u16::from_le_bytes([c[0], c[1]])))
                    .collect::<Vec<f32>>()
                    .into(),
            ),
        },
        Dtype::I32 => Tensor::from_i64(
            dtype,
            shape,
            bytes.chunks_exact(4).map(|c| i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect(),
        ),
        Dtype::I64 => Tensor::from_i64(
            dtype,
            shape,
            bytes.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes"))).collect(),
        ),
        Dtype::Bool => Tensor { dtype, shape, data: Data::Bool(bytes.iter().map(|b| *b != 0).collect()) },
        Dtype::F16 => unreachable!("an f16 node is refused when its entry is readied"),
    }
}
