//! NumPy's `.npy` format, version 1 and 2: little-endian `f4`, `f2`, `i4`,
//! `i8` and `b1` arrays in C order, read into and written from tensors.

use linnet_exec::tensor::{Data, Tensor};
use linnet_ir::Dtype;

const MAGIC: &[u8] = b"\x93NUMPY";

pub fn read(bytes: &[u8]) -> Result<Tensor, String> {
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err("not an .npy file (no \\x93NUMPY magic)".into());
    }
    let (header_len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12),
        version => return Err(format!("unsupported .npy version {version}")),
    };
    let header = std::str::from_utf8(bytes.get(start..start + header_len).ok_or("truncated header")?)
        .map_err(|_| "header is not text")?;
    let field = |key: &str| -> Option<&str> {
        let at = header.find(&format!("'{key}'"))? + key.len() + 2;
        Some(header[at..].trim_start().trim_start_matches(':').trim_start())
    };
    let descr = field("descr").and_then(|rest| rest.split('\'').nth(1)).ok_or("no descr")?;
    if field("fortran_order").is_some_and(|rest| rest.starts_with("True")) {
        return Err("Fortran-ordered arrays are not supported; save with C order".into());
    }
    let shape_text = field("shape")
        .and_then(|rest| rest.strip_prefix('('))
        .and_then(|rest| rest.split(')').next())
        .ok_or("no shape")?;
    let shape: Vec<usize> = shape_text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>().map_err(|_| format!("bad shape `{shape_text}`")))
        .collect::<Result<_, _>>()?;
    let body = &bytes[start + header_len..];
    let count = shape.iter().try_fold(1usize, |count, axis| count.checked_mul(*axis));
    let (dtype, width) = match descr {
        "<f4" => (Dtype::F32, 4),
        "<f2" => (Dtype::F16, 2),
        "<i4" => (Dtype::I32, 4),
        "<i8" => (Dtype::I64, 8),
        "|b1" => (Dtype::Bool, 1),
        other => return Err(format!("unsupported dtype `{other}` (use float32, float16, int32, int64 or bool)")),
    };
    let count = count
        .filter(|count| count.checked_mul(width).is_some())
        .ok_or_else(|| format!("shape `({shape_text})` has more elements than memory can hold"))?;
    if body.len() / width < count {
        return Err(format!("truncated: {} bytes of data for {count} elements of {width} bytes", body.len()));
    }
    let chunks = body.chunks_exact(width).take(count);
    let data = match dtype {
        Dtype::F32 => {
            Data::F32(chunks.map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect::<Vec<f32>>().into())
        }
        Dtype::F16 => Data::F32(
            chunks
                .map(|c| half::f16::from_le_bytes(c.try_into().expect("2 bytes")).to_f32())
                .collect::<Vec<f32>>()
                .into(),
        ),
        Dtype::I32 => Data::I64(chunks.map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")) as i64).collect()),
        Dtype::I64 => Data::I64(chunks.map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes"))).collect()),
        _ => Data::Bool(chunks.map(|c| c[0] != 0).collect()),
    };
    Ok(Tensor { dtype, shape, data })
}

/// Writes floats as `<f4`, integers as `<i4`/`<i8`, bools as `|b1`.
pub fn write(tensor: &Tensor) -> Vec<u8> {
    let descr = match tensor.dtype {
        Dtype::I32 => "<i4",
        Dtype::I64 => "<i8",
        Dtype::Bool => "|b1",
        _ => "<f4",
    };
    let shape = match tensor.shape.len() {
        1 => format!("({},)", tensor.shape[0]),
        _ => format!("({})", tensor.shape.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = MAGIC.to_vec();
    out.extend([1, 0]);
    out.extend((header.len() as u16).to_le_bytes());
    out.extend(header.as_bytes());
    match &tensor.data {
        Data::F32(values) => values.iter().for_each(|v| out.extend(v.to_le_bytes())),
        Data::Bf16(bits) => bits.iter().for_each(|b| out.extend(linnet_ir::numerics::bf16_value(*b).to_le_bytes())),
        Data::I64(values) if tensor.dtype == Dtype::I32 => {
            values.iter().for_each(|v| out.extend((*v as i32).to_le_bytes()))
        }
        Data::I64(values) => values.iter().for_each(|v| out.extend(v.to_le_bytes())),
        Data::Bool(values) => values.iter().for_each(|v| out.push(u8::from(*v))),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let tensor = Tensor::from_f32(Dtype::F32, vec![2, 3], vec![1.0, -2.5, 3.0, 0.0, 1e-3, 7.0]);
        assert_eq!(read(&write(&tensor)).unwrap(), tensor);
        let ints = Tensor::from_i64(Dtype::I32, vec![4], vec![1, 2, -3, 4]);
        assert_eq!(read(&write(&ints)).unwrap(), ints);
    }

    #[test]
    fn rejects_garbage() {
        assert!(read(b"hello").is_err());
        let mut bytes = write(&Tensor::from_f32(Dtype::F32, vec![4], vec![1.0; 4]));
        bytes.truncate(bytes.len() - 3);
        assert!(read(&bytes).unwrap_err().contains("truncated"));
    }

    /// A crafted header whose shape product wraps around 64 bits.
    #[test]
    fn rejects_a_shape_that_overflows() {
        let bytes = write(&Tensor::from_f32(Dtype::F32, vec![4], vec![1.0; 4]));
        let mut fixed = bytes.clone();
        let header =
            String::from_utf8_lossy(&bytes[10..10 + u16::from_le_bytes([bytes[8], bytes[9]]) as usize]).to_string();
        let padded = format!(
            "{:<width$}",
            header.trim_end().replace("(4,)", "(4294967296, 4294967296, 16)"),
            width = header.len() - 1
        ) + "\n";
        assert_eq!(padded.len(), header.len());
        fixed[10..10 + header.len()].copy_from_slice(padded.as_bytes());
        assert!(read(&fixed).unwrap_err().contains("more elements than memory"), "{:?}", read(&fixed));
    }
}
