//! Host tensors: a dtype, a row-major shape, and the elements. Floats of
//! every width are held as f32 (a bf16 or f16 value is exact in f32), and
//! integers as i64, so that one evaluator serves every dtype. f32 elements
//! may also be read where they lie in a mapped checkpoint ([`Floats`]).

use crate::sema::ty::Dtype;
use std::ops::{Deref, DerefMut};
use std::rc::Rc;

/// Float elements: owned, or f32 data in place in mapped bytes (a
/// checkpoint's f32 tensor is not copied). Writing to mapped elements
/// copies them first.
pub enum Floats {
    Owned(Vec<f32>),
    Mapped { bytes: Rc<dyn AsRef<[u8]>>, offset: usize, len: usize },
}

impl Floats {
    /// `len` f32 values at `offset` in `bytes`, in place; `None` when they
    /// are not aligned for f32, out of bounds, or the host is big-endian.
    pub fn mapped(bytes: Rc<dyn AsRef<[u8]>>, offset: usize, len: usize) -> Option<Floats> {
        let all = (*bytes).as_ref();
        let fits = offset.checked_add(len.checked_mul(4)?).is_some_and(|end| end <= all.len());
        let aligned = (all.as_ptr() as usize + offset).is_multiple_of(std::mem::align_of::<f32>());
        (fits && aligned && cfg!(target_endian = "little")).then_some(Floats::Mapped { bytes, offset, len })
    }

    pub fn is_mapped(&self) -> bool {
        matches!(self, Floats::Mapped { .. })
    }
}

impl Deref for Floats {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        match self {
            Floats::Owned(values) => values,
            Floats::Mapped { bytes, offset, len } => {
                let all = (**bytes).as_ref();
                // SAFETY: `mapped` checked that the range is inside the
                // bytes and aligned for f32; every bit pattern is an f32,
                // and the bytes live as long as the `Rc`.
                unsafe { std::slice::from_raw_parts(all.as_ptr().add(*offset) as *const f32, *len) }
            }
        }
    }
}

impl DerefMut for Floats {
    fn deref_mut(&mut self) -> &mut [f32] {
        if self.is_mapped() {
            *self = Floats::Owned(self.to_vec());
        }
        match self {
            Floats::Owned(values) => values,
            Floats::Mapped { .. } => unreachable!("copied above"),
        }
    }
}

impl From<Vec<f32>> for Floats {
    fn from(values: Vec<f32>) -> Floats {
        Floats::Owned(values)
    }
}

impl Clone for Floats {
    fn clone(&self) -> Floats {
        match self {
            Floats::Owned(values) => Floats::Owned(values.clone()),
            Floats::Mapped { bytes, offset, len } => Floats::Mapped { bytes: Rc::clone(bytes), offset: *offset, len: *len },
        }
    }
}

impl std::fmt::Debug for Floats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.deref().fmt(f)
    }
}

impl PartialEq for Floats {
    fn eq(&self, other: &Floats) -> bool {
        self.deref() == other.deref()
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    F32(Floats),
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
        Tensor { dtype, shape, data: Data::F32(values.into_iter().map(|v| round(v as f64, dtype) as f32).collect::<Vec<f32>>().into()) }
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

    pub fn as_i64(&self) -> Option<&[i64]> {
        match &self.data {
            Data::I64(values) => Some(values),
            _ => None,
        }
    }
}

/// A float rounded to `dtype` (nearest-even), held in f64.
pub fn round(value: f64, dtype: Dtype) -> f64 {
    match dtype {
        Dtype::F32 => value as f32 as f64,
        Dtype::Bf16 => half::bf16::from_f64(value).to_f64(),
        Dtype::F16 => half::f16::from_f64(value).to_f64(),
        _ => value,
    }
}

/// An integer wrapped to `dtype`.
pub fn wrap(value: i64, dtype: Dtype) -> i64 {
    match dtype {
        Dtype::I32 => value as i32 as i64,
        _ => value,
    }
}

/// Integer floor division as the language defines it: by zero gives 0,
/// overflow wraps.
pub fn div_euclid(x: i64, y: i64) -> i64 {
    if y == 0 { 0 } else { x.wrapping_div_euclid(y) }
}

/// The remainder matching `div_euclid`.
pub fn rem_euclid(x: i64, y: i64) -> i64 {
    if y == 0 { 0 } else { x.wrapping_rem_euclid(y) }
}
