//! Element-wise operators on same-shape inputs.

use super::common::all_same;
use crate::error::Result;
use crate::op::kernel::{par_for, Cost};
use crate::op::tensor::{Elem, SendPtr, TBlob};
use crate::op::{Grad, Inputs, OpCtx, OpDef};
use crate::dispatch_num;

/// `out[i] = f(a[i], b[i])` over the kernel pool.
pub(crate) fn binary_map<T: Elem>(a: &TBlob, b: &TBlob, out: &TBlob, cost: Cost, f: impl Fn(T, T) -> T + Sync + Send) {
    let (a, b) = (a.as_slice::<T>(), b.as_slice::<T>());
    let o = SendPtr(out.as_mut::<T>().as_mut_ptr());
    par_for(a.len(), cost, T::DTYPE, |r| {
        let o = o;
        // SAFETY: par_for ranges are disjoint and within the output.
        let o = unsafe { std::slice::from_raw_parts_mut(o.0.add(r.start), r.len()) };
        for ((o, &x), &y) in o.iter_mut().zip(&a[r.clone()]).zip(&b[r]) {
            *o = f(x, y);
        }
    });
}

fn add(cx: &OpCtx, ins: &[TBlob], outs: &[TBlob]) -> Result<()> {
    dispatch_num!(ins[0].dtype, cx.attrs.op, T => binary_map::<T>(&ins[0], &ins[1], &outs[0], Cost::CHEAP, |x, y| T::from_f64(x.to_f64() + y.to_f64())));
    Ok(())
}

fn add_f32(cx: &OpCtx, ins: &[TBlob], outs: &[TBlob]) -> Result<()> {
    if ins[0].dtype == crate::ndarray::DType::F32 {
        binary_map::<f32>(&ins[0], &ins[1], &outs[0], Cost::CHEAP, |x, y| x + y);
        return Ok(());
    }
    add(cx, ins, outs)
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    ops.push(
        OpDef::new("elemwise_add", Inputs::Fixed(&["lhs", "rhs"]), all_same("elemwise_add"), Box::new(add_f32))
            .alias(&["_plus", "_add", "_Plus"])
            .inplace(&[(0, 0), (1, 0)])
            .grad(Grad::Backward { op: "_backward_add", inputs: false, outputs: false })
            .doc("Adds arguments element-wise."),
    );
}
