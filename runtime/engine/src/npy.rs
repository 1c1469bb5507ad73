//! NumPy's `.npy` format, version 1 and 2: little-endian `f4`, `f2`, `i4`,
//! `i8` and `b1` arrays in C order, read into and written from tensors.

use crate::Error;
use linnet_exec::tensor::{Data, Tensor};
use linnet_ir::Dtype;

const MAGIC: &[u8] = b"\x93NUMPY";

pub fn read(bytes: &[u8]) -> Result<Tensor, Error> {
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err(Error::Input("not an .npy file (no \\x93NUMPY magic)".into()));
    }
    let (header_len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12),
        version => return Err(Error::Input(format!("unsupported .npy version {version}"))),
    };
    let header = std::str::from_utf8(
        bytes.get(start..start + header_len).ok_or_else(|| Error::Input("truncated header".into()))?,
    )
    .map_err(|_| Error::Input("header is not text".into()))?;
    let Header { descr, fortran_order, shape } = Header::parse(header)?;
    if fortran_order {
        return Err(Error::Input("Fortran-ordered arrays are not supported; save with C order".into()));
    }
    let shape_text = shape.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
    let descr = descr.as_str();
    let body = &bytes[start + header_len..];
    let count = shape.iter().try_fold(1usize, |count, axis| count.checked_mul(*axis));
    let (dtype, width) = match descr {
        "<f4" => (Dtype::F32, 4),
        "<f2" => (Dtype::F16, 2),
        "<i4" => (Dtype::I32, 4),
        "<i8" => (Dtype::I64, 8),
        "|b1" => (Dtype::Bool, 1),
        other => {
            return Err(Error::Input(format!(
                "unsupported dtype `{other}` (use float32, float16, int32, int64 or bool)"
            )))
        }
    };
    let count = count
        .filter(|count| count.checked_mul(width).is_some())
        .ok_or_else(|| Error::Input(format!("shape `({shape_text})` has more elements than memory can hold")))?;
    if body.len() / width < count {
        return Err(Error::Input(format!(
            "truncated: {} bytes of data for {count} elements of {width} bytes",
            body.len()
        )));
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
/// An `.npy` header: the Python dict literal `{'descr': '<f4',
/// 'fortran_order': False, 'shape': (2, 3), }`, read whole and strictly: a
/// missing bracket, an unknown key or a key given twice is an error.
struct Header {
    descr: String,
    fortran_order: bool,
    shape: Vec<usize>,
}

impl Header {
    fn parse(text: &str) -> Result<Header, Error> {
        let malformed = |why: &str| Error::Input(format!("malformed header ({why}): {}", text.trim_end()));
        let mut rest = text.trim_start().strip_prefix('{').ok_or_else(|| malformed("no opening `{`"))?;
        let (mut descr, mut fortran_order, mut shape) = (None, None, None);
        loop {
            rest = rest.trim_start();
            if rest.is_empty() {
                return Err(malformed("no closing `}`"));
            }
            if let Some(after) = rest.strip_prefix('}') {
                if !after.trim().is_empty() {
                    return Err(malformed("text after the closing `}`"));
                }
                break;
            }
            let (key, after) = quoted(rest).ok_or_else(|| malformed("a key is not a quoted string"))?;
            rest = after.trim_start().strip_prefix(':').ok_or_else(|| malformed("no `:` after a key"))?.trim_start();
            let twice = || malformed(&format!("`{key}` given twice"));
            rest = match key {
                "descr" => {
                    let (value, after) = quoted(rest).ok_or_else(|| malformed("`descr` is not a quoted string"))?;
                    descr.replace(value.to_string()).map_or(Ok(()), |_| Err(twice()))?;
                    after
                }
                "fortran_order" => {
                    let (value, after) = if let Some(after) = rest.strip_prefix("True") {
                        (true, after)
                    } else if let Some(after) = rest.strip_prefix("False") {
                        (false, after)
                    } else {
                        return Err(malformed("`fortran_order` is neither True nor False"));
                    };
                    fortran_order.replace(value).map_or(Ok(()), |_| Err(twice()))?;
                    after
                }
                "shape" => {
                    let inner = rest.strip_prefix('(').ok_or_else(|| malformed("`shape` is not a tuple"))?;
                    let close = inner.find(')').ok_or_else(|| malformed("`shape` has no closing `)`"))?;
                    let axes = inner[..close]
                        .split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(|s| s.parse::<usize>().map_err(|_| malformed(&format!("bad axis `{s}` in `shape`"))))
                        .collect::<Result<Vec<_>, _>>()?;
                    shape.replace(axes).map_or(Ok(()), |_| Err(twice()))?;
                    &inner[close + 1..]
                }
                other => return Err(malformed(&format!("unknown key `{other}`"))),
            };
            rest = rest.trim_start();
            match rest.strip_prefix(',') {
                Some(after) => rest = after,
                None if rest.starts_with('}') => {}
                None => return Err(malformed("no `,` or `}` after a value")),
            }
        }
        Ok(Header {
            descr: descr.ok_or_else(|| malformed("no `descr`"))?,
            fortran_order: fortran_order.ok_or_else(|| malformed("no `fortran_order`"))?,
            shape: shape.ok_or_else(|| malformed("no `shape`"))?,
        })
    }
}

/// A single-quoted string at the start of `text`, and what follows it.
fn quoted(text: &str) -> Option<(&str, &str)> {
    let inner = text.strip_prefix('\'')?;
    let end = inner.find('\'')?;
    Some((&inner[..end], &inner[end + 1..]))
}

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
    match &tensor.widened().data {
        Data::F32(values) => values.iter().for_each(|v| out.extend(v.to_le_bytes())),
        Data::Bf16(_) | Data::Blocks(..) => unreachable!("widened to f32"),
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

    /// A header missing its closing brackets, or with a key twice or one
    /// NumPy does not write, is refused, not read as far as it goes.
    #[test]
    fn rejects_a_malformed_header() {
        let good = write(&Tensor::from_f32(Dtype::F32, vec![2], vec![1.0, 2.0]));
        assert!(read(&good).is_ok());
        let header = |text: &str| {
            let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
            bytes.extend((text.len() as u16).to_le_bytes());
            bytes.extend(text.as_bytes());
            bytes.extend([0u8; 8]);
            bytes
        };
        for (text, why) in [
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (2,", "`shape` has no closing `)`"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), ", "no closing `}`"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (2,) 'x'}", "no `,` or `}`"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (2,) }x", "text after"),
            ("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", "given twice"),
            ("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2,)}", "neither True nor False"),
            ("{'descr': '<f4', 'shape': (2,), 'extra': 1}", "unknown key"),
            ("{'descr': '<f4', 'shape': (2,)}", "no `fortran_order`"),
        ] {
            let error = read(&header(text)).unwrap_err().to_string();
            assert!(error.contains(why), "{text}: {error}");
        }
        let padded = header("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }          \n");
        assert_eq!(read(&padded).unwrap().shape, vec![2]);
    }

    #[test]
    fn rejects_garbage() {
        assert!(read(b"hello").is_err());
        let mut bytes = write(&Tensor::from_f32(Dtype::F32, vec![4], vec![1.0; 4]));
        bytes.truncate(bytes.len() - 3);
        assert!(read(&bytes).unwrap_err().to_string().contains("truncated"));
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
        assert!(read(&fixed).unwrap_err().to_string().contains("more elements than memory"), "{:?}", read(&fixed));
    }
}
