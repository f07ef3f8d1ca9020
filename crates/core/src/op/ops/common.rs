//! Helpers shared by the operator families: inference shorthands and shape arithmetic.

use crate::context::Context;
use crate::error::{Error, Result};
use crate::ndarray::{DType, NDArray};
use crate::op::param::Attrs;
use crate::op::{InferFn, Meta};

/// Inference: one output like input 0.
pub fn same_as_first() -> InferFn {
    Box::new(|_: &Attrs, ins: &[Meta]| Ok(vec![ins[0].clone()]))
}

/// Inference: every input has the same shape and dtype; one output like them.
pub fn all_same(op: &'static str) -> InferFn {
    Box::new(move |_: &Attrs, ins: &[Meta]| {
        for (i, m) in ins.iter().enumerate().skip(1) {
            check_same(op, &ins[0], m, i)?;
        }
        Ok(vec![ins[0].clone()])
    })
}

pub fn check_same(op: &str, a: &Meta, b: &Meta, i: usize) -> Result<()> {
    if a.shape != b.shape {
        return Err(Error::value(format!(
            "operator {op}: input {i} has shape {:?}, expected {:?} like input 0",
            b.shape, a.shape
        )));
    }
    if a.dtype != b.dtype {
        return Err(Error::type_error(format!(
            "operator {op}: input {i} has dtype {}, expected {} like input 0",
            b.dtype.name(),
            a.dtype.name()
        )));
    }
    Ok(())
}

/// The inputs of a float operator: input 0 is float32, float64 or float16 and every other
/// input has its dtype (the weights and statistics of convolutions and normalisations).
pub fn floats_like_first(op: &str, ins: &[Meta]) -> Result<crate::ndarray::DType> {
    use crate::ndarray::DType;
    let dt = ins[0].dtype;
    if !matches!(dt, DType::F32 | DType::F64 | DType::F16) {
        return Err(Error::type_error(format!(
            "operator {op} supports float32, float64 and float16, not {}",
            dt.name()
        )));
    }
    for (i, m) in ins.iter().enumerate().skip(1) {
        if m.dtype != dt {
            return Err(Error::type_error(format!(
                "operator {op}: input {i} has dtype {}, expected {}",
                m.dtype.name(),
                dt.name()
            )));
        }
    }
    Ok(dt)
}

/// Normalise an axis in `[-ndim, ndim)` to `[0, ndim)`.
/// Inference check of stock's legacy float32-only operators (`real_t` kernels): every input is
/// float32.
pub fn float32_only(op: &str, ins: &[Meta]) -> Result<()> {
    match ins.iter().find(|m| m.dtype != crate::ndarray::DType::F32) {
        Some(m) => Err(Error::type_error(format!("operator {op} supports float32 only, not {}", m.dtype.name()))),
        None => Ok(()),
    }
}

/// Whether float32 reductions and the softmax family accumulate in float64
/// (`MXNET_SAFE_ACCUMULATION`, read at each call as stock reads it; float16 accumulates in
/// float32 whatever it says).
pub fn safe_accumulation() -> Result<bool> {
    Ok(crate::config::global().get_bool("MXNET_SAFE_ACCUMULATION", "reductions and softmax")?.unwrap_or(false))
}

pub fn norm_axis(op: &str, axis: i64, ndim: usize) -> Result<usize> {
    let n = ndim as i64;
    if axis < -n || axis >= n {
        return Err(Error::index(format!("operator {op}: axis {axis} is out of range for {ndim} dimensions")));
    }
    Ok(if axis < 0 { (axis + n) as usize } else { axis as usize })
}

/// A shape parameter as sizes (negative entries refused).
pub fn shape_param(op: &str, name: &str, s: &[i64]) -> Result<Vec<usize>> {
    s.iter()
        .map(|&d| {
            usize::try_from(d)
                .map_err(|_| Error::value(format!("operator {op}: {name} has a negative dimension: {s:?}")))
        })
        .collect()
}

/// A result an operator that makes its own output (`invoke_with`) computed on the host: the
/// elements (native byte order) of an array of `shape` and `dtype`.
pub struct HostResult {
    pub shape: Vec<usize>,
    pub dtype: DType,
    pub bytes: Vec<u8>,
}

impl HostResult {
    /// The result written into the one array given as `out=` (which must have its shape and
    /// dtype; the error reads "`op`: `what` [shape] dtype, out= has ..."), or into a new array
    /// on `ctx`.
    pub fn deliver(self, op: &str, what: &str, ctx: Context, out: Option<&[&NDArray]>) -> Result<NDArray> {
        let target = match out {
            None => NDArray::new(self.shape, ctx, self.dtype, false)?,
            Some(&[o]) if o.shape == self.shape && o.dtype == self.dtype => o.clone(),
            Some(&[o]) => {
                return Err(Error::value(format!(
                    "{op}: {what} {:?} {}, out= has shape {:?} {}",
                    self.shape,
                    self.dtype.name(),
                    o.shape,
                    o.dtype.name()
                )))
            }
            Some(o) => return Err(Error::value(format!("{op} has one output, got {} arrays as out=", o.len()))),
        };
        target.write_host_bytes(&self.bytes)?;
        Ok(target)
    }
}

/// The parameter schema of the already registered operator `name` (empty if there is none):
/// a backward operator declares its forward operator's.
pub fn params_of(ops: &[crate::op::OpDef], name: &str) -> &'static [crate::op::param::ParamSpec] {
    ops.iter().find(|o| o.name == name).map_or(&[], |o| o.params)
}
