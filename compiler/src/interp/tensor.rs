//! Host tensors: a dtype, a row-major shape, and the elements. Floats of
//! every width are held as f32 (a bf16 or f16 value is exact in f32), and
//! integers as i64, so that one evaluator serves every dtype.

use crate::sema::ty::Dtype;

#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    F32(Vec<f32>),
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
            _ => Data::F32(vec![0.0; count]),
        };
        Tensor { dtype, shape, data }
    }

    pub fn from_f32(dtype: Dtype, shape: Vec<usize>, values: Vec<f32>) -> Tensor {
        debug_assert!(dtype.is_float());
        Tensor { dtype, shape, data: Data::F32(values.into_iter().map(|v| round(v as f64, dtype) as f32).collect()) }
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
