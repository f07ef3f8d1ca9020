//! Cumulative operators: `cumsum` (stock's `_np_cumsum` under its legacy alias) and its
//! backward, a reverse cumulative sum.
//!
//! The sum runs in the output type, as stock's kernel does (so a float16 or integer sum
//! rounds or wraps at each step); without `axis` it runs over the flattened array. Each
//! outer block (the axes before `axis`) is one task; within it the rows along `axis` are
//! added one after another, the trailing axes forming each row.

use super::common::norm_axis;
use super::shape::cast_into;
use crate::error::{Error, Result};
use crate::ndarray::DType;
use crate::op::kernel::{par_for_mut, Cost};
use crate::op::param::{dtype_from_name, op_params, Attrs};
use crate::op::tensor::{OutBlob, TBlob};
use crate::op::{Grad, Inputs, Meta, OpCtx, OpDef, Req};

op_params! {
    /// `cumsum`'s parameters.
    struct CumsumParams<'a> => CUMSUM_PARAMS {
        axis: Option<i64> = "None", "Axis along which the cumulative sum is computed. The default (None) is to compute the cumsum over the flattened array.";
        dtype: Option<&'a str> = "None" in ["float16", "float32", "float64", "int32", "int64", "int8"], "Type of the returned array and of the accumulator in which the elements are summed. If dtype is not specified, it defaults to the dtype of a, unless a has an integer dtype with a precision less than that of the default platform integer. In that case, the default platform integer is used.";
    }
}

/// The (outer, middle, trailing) extents of a scan of `shape` along `axis` (None: flattened).
fn geometry(shape: &[usize], axis: Option<i64>) -> Result<(usize, usize, usize)> {
    let size: usize = shape.iter().product();
    let Some(a) = axis else { return Ok((1, size, 1)) };
    let a = norm_axis("cumsum", a, shape.len())?;
    let (outer, trailing) = (shape[..a].iter().product(), shape[a + 1..].iter().product());
    Ok((outer, shape[a], trailing))
}

fn infer_cumsum(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let p = CumsumParams::of(a);
    let x = &ins[0];
    geometry(&x.shape, p.axis)?;
    let shape = if p.axis.is_some() { x.shape.clone() } else { vec![x.size()] };
    let dtype = match p.dtype {
        Some(name) => {
            dtype_from_name(name).ok_or_else(|| Error::value(format!("operator cumsum: unknown dtype {name}")))?
        }
        None if x.dtype == DType::Bool => DType::I64,
        None => x.dtype,
    };
    Ok(vec![Meta::new(shape, dtype)])
}

/// Addition as stock's kernels do it in each type: rounded floats, wrapping integers.
trait ScanAdd: Copy + Send + Sync {
    fn add(self, o: Self) -> Self;
}

macro_rules! scan_add {
    (float: $($t:ty),*; int: $($i:ty),*) => {
        $(impl ScanAdd for $t {
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self + o
            }
        })*
        $(impl ScanAdd for $i {
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
        })*
    };
}
scan_add!(float: f32, f64, half::f16; int: u8, i8, i32, i64);

/// Scan `d` in place: `(outer, middle, trailing)` blocks, each row along the middle axis
/// adding the one before it (`reverse`: the one after it).
fn scan<T: ScanAdd>(d: &mut [T], (_, middle, trailing): (usize, usize, usize), reverse: bool, dtype: DType) {
    let block = middle * trailing;
    if block == 0 {
        return;
    }
    par_for_mut(d, block, Cost(block as f64), dtype, |_, part| {
        for b in part.chunks_mut(block) {
            for j in 1..middle {
                let (prev, row) = if reverse {
                    let k = middle - 1 - j;
                    let (head, tail) = b.split_at_mut((k + 1) * trailing);
                    (&tail[..trailing], &mut head[k * trailing..])
                } else {
                    let (head, tail) = b.split_at_mut(j * trailing);
                    (&head[(j - 1) * trailing..], &mut tail[..trailing])
                };
                for (r, p) in row.iter_mut().zip(prev) {
                    *r = p.add(*r);
                }
            }
        }
    });
}

/// The input (or, backward, the output gradient) converted into `out`, then scanned there.
fn cast_and_scan(op: &str, src: &TBlob, out: &mut OutBlob, geom: (usize, usize, usize), reverse: bool) -> Result<()> {
    cast_into(src, out);
    let dtype = out.dtype;
    match dtype {
        DType::F32 => scan(out.as_mut::<f32>(), geom, reverse, dtype),
        DType::F64 => scan(out.as_mut::<f64>(), geom, reverse, dtype),
        DType::F16 => scan(out.as_mut::<half::f16>(), geom, reverse, dtype),
        DType::U8 => scan(out.as_mut::<u8>(), geom, reverse, dtype),
        DType::I8 => scan(out.as_mut::<i8>(), geom, reverse, dtype),
        DType::I32 => scan(out.as_mut::<i32>(), geom, reverse, dtype),
        DType::I64 => scan(out.as_mut::<i64>(), geom, reverse, dtype),
        DType::Bool => return Err(Error::type_error(format!("operator {op}: cannot sum into a bool array"))),
    }
    Ok(())
}

fn run_cumsum(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let geom = geometry(&ins[0].shape, CumsumParams::of(cx.attrs).axis)?;
    cast_and_scan("cumsum", &ins[0], &mut outs[0], geom, false)
}

/// Inputs (output gradient); the input's gradient is the reverse cumulative sum of the
/// output gradient, in the input's type.
fn cumsum_back(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] == Req::Null {
        return Ok(());
    }
    let geom = geometry(&outs[0].shape, CumsumParams::of(cx.attrs).axis)?;
    cast_and_scan("_backward_np_cumsum", &ins[0], &mut outs[0], geom, true)
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    ops.push(
        OpDef::new("cumsum", Inputs::Fixed(&["a"]), Box::new(infer_cumsum), Box::new(run_cumsum))
            .alias(&["_np_cumsum"])
            .params(CUMSUM_PARAMS)
            .grad(Grad::Backward { op: "_backward_np_cumsum", inputs: false, outputs: false })
            .doc("Return the cumulative sum of the elements along a given axis."),
    );
    ops.push(OpDef::backward("_backward_np_cumsum", CUMSUM_PARAMS, Box::new(cumsum_back)));
}
