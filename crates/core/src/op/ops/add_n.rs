//! `add_n` (alias `ElementWiseSum`): the elementwise sum of any number of same-shape arrays,
//! which autograd also uses to accumulate gradients, and its backward `_backward_add_n` (the
//! output gradient copied to every input).

use super::common::all_same;
use crate::error::Result;
use crate::op::kernel::{par_for_mut, Cost};
use crate::op::param::op_params;
use crate::op::tensor::{Elem, OutBlob, TBlob};
use crate::op::{Grad, Inputs, OpCtx, OpDef, Req};

op_params! {
    pub(super) struct AddNParams<'a> => PARAMS {
        num_args: i64 = required, "Number of inputs to be summed.";
    }
}

fn sum<T: Elem>(ins: &[TBlob], out: &mut OutBlob) {
    let srcs: Vec<&[T]> = ins.iter().map(|b| b.as_slice::<T>()).collect();
    par_for_mut(out.as_mut::<T>(), 1, Cost(0.25 * srcs.len() as f64), T::DTYPE, |r, dst| {
        if std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>() {
            // SAFETY: T is f32 (same TypeId, checked above), so the casts are identities.
            let dst: &mut [f32] = unsafe { &mut *(dst as *mut [T] as *mut [f32]) };
            // SAFETY: as above.
            let first: &[f32] = unsafe { &*(&srcs[0][r.clone()] as *const [T] as *const [f32]) };
            dst.copy_from_slice(first);
            for s in &srcs[1..] {
                // SAFETY: as above.
                let s: &[f32] = unsafe { &*(&s[r.clone()] as *const [T] as *const [f32]) };
                for (d, &v) in dst.iter_mut().zip(s) {
                    *d += v;
                }
            }
        } else {
            for (k, d) in dst.iter_mut().enumerate() {
                let i = r.start + k;
                *d = T::from_f64(srcs.iter().map(|s| s[i].to_f64()).sum());
            }
        }
    });
}

fn add_n(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if ins.is_empty() {
        return Err(crate::error::Error::value("operator add_n needs at least one input"));
    }
    let _ = cx;
    crate::dispatch_num!(outs[0].dtype, "add_n", T => sum::<T>(ins, &mut outs[0]));
    Ok(())
}

fn add_n_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    for (o, r) in outs.iter_mut().zip(cx.req) {
        if *r != Req::Null {
            o.copy_from(&ins[0]);
        }
    }
    Ok(())
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    ops.push(
        OpDef::new("add_n", Inputs::Variadic("args"), all_same("add_n"), Box::new(add_n))
            .alias(&["ElementWiseSum", "_sparse_ElementWiseSum", "_sparse_add_n"])
            .gpu(crate::op::gpu::GpuKernel::AddN)
            .elementwise_shape()
            .params(PARAMS)
            .num_args_key("num_args")
            .grad(Grad::Backward { op: "_backward_add_n", inputs: false, outputs: false })
            .doc("Adds all input arguments element-wise."),
    );
    ops.push(OpDef::backward("_backward_add_n", PARAMS, Box::new(add_n_backward)));
}

#[cfg(test)]
mod tests {
    use crate::op::grad::check::{check, values};

    #[test]
    fn add_n_gradient() {
        check(
            "add_n",
            &[],
            &[
                (&[2, 3], values(6, -1.0, 1.0, 1)),
                (&[2, 3], values(6, -1.0, 1.0, 2)),
                (&[2, 3], values(6, -1.0, 1.0, 3)),
            ],
            &[],
        );
    }
}
