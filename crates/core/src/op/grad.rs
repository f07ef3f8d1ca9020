//! Gradients: the calling convention of backward operators and their invocation.
//!
//! Owns how a forward call's gradient is computed from its declaration ([`Grad`]):
//!
//! - A backward operator (`OpDef::backward`, named `_backward_<op>` as stock names it) is
//!   called with the **forward call's parsed parameters**.
//! - Its tensor inputs are, in order: one output gradient per *visible* forward output; then,
//!   if the declaration says `inputs: true`, every forward input; then, if it says
//!   `outputs: true`, every forward output, hidden ones included (BatchNorm's saved mean and
//!   inverse std, Dropout's mask).
//! - It has one output per forward input, with that input's shape and dtype. Output `i` is
//!   written when `req[i]` is [`Req::Write`] and left alone (not even read: its blob has no
//!   address) when it is [`Req::Null`]; a kernel writes zeros for inputs with no gradient
//!   (indices, labels) when asked.
//!
//! Autograd and graph executors call [`backward`]; nothing calls a backward operator by name
//! through the C API (it answers NotImplementedError).

use super::param::Attrs;
use super::{invoke, lookup, Grad, OpDef, Req};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::ndarray::NDArray;

/// The backward operator of `op` (`None` for [`Grad::None`] and [`Grad::Zero`]).
pub fn backward_op(op: &OpDef) -> Result<Option<&'static OpDef>> {
    match op.grad {
        Grad::Backward { op: name, .. } | Grad::Stateful { op: name } => {
            let b = lookup(name).map_err(|_| Error::not_supported(format!("the gradient of {} ({name})", op.name)))?;
            if !b.is_backward && !matches!(op.grad, Grad::Stateful { .. }) {
                return Err(Error::internal(format!(
                    "{name}, the gradient of {}, is not a backward operator",
                    op.name
                )));
            }
            Ok(Some(b))
        }
        Grad::None | Grad::Zero => Ok(None),
    }
}

/// The forward tensors a backward call needs: (inputs, outputs).
pub fn needs(op: &OpDef) -> (bool, bool) {
    match op.grad {
        Grad::Backward { inputs, outputs, .. } => (inputs, outputs),
        Grad::Stateful { .. } => (true, true),
        Grad::None | Grad::Zero => (false, false),
    }
}

/// Push the backward call of a forward call of `op` with `attrs`: `ograds` (one per visible
/// output), the forward `inputs` and `outputs` (pass all; only what the declaration needs is
/// used). `want[i]` says whether forward input `i` needs a gradient. Returns one array per
/// forward input (`None` where not wanted). `into[i]`, when given, is written instead of a
/// new array (it must have input `i`'s shape and dtype).
pub fn backward(
    op: &'static OpDef,
    attrs: &Attrs,
    ograds: &[&NDArray],
    inputs: &[&NDArray],
    outputs: &[&NDArray],
    want: &[bool],
    into: &[Option<NDArray>],
) -> Result<Vec<Option<NDArray>>> {
    let Some(bop) = backward_op(op)? else {
        return Err(Error::internal(format!("{} has no backward operator", op.name)));
    };
    let (need_in, need_out) = needs(op);
    let mut args: Vec<&NDArray> = Vec::with_capacity(ograds.len() + inputs.len() + outputs.len());
    args.extend_from_slice(ograds);
    if need_in {
        args.extend_from_slice(inputs);
    }
    if need_out {
        args.extend_from_slice(outputs);
    }
    // The first array that has memory decides (an input the backward does not need may be
    // an empty placeholder).
    let ctx = ograds.iter().chain(inputs).chain(outputs).find_map(|x| x.ctx()).unwrap_or(Context::CPU);
    let mut outs = Vec::with_capacity(inputs.len());
    let mut req = Vec::with_capacity(inputs.len());
    for (i, x) in inputs.iter().enumerate() {
        let w = want.get(i).copied().unwrap_or(false);
        match into.get(i).and_then(|o| o.as_ref()) {
            Some(o) if w => outs.push(o.clone()),
            _ if w => outs.push(NDArray::new(x.shape.clone(), ctx, x.dtype, false)?),
            _ => outs.push(NDArray::none_like(x)),
        }
        req.push(if w { Req::Write } else { Req::Null });
    }
    invoke::launch(bop, attrs.clone(), &args, &outs, req.into(), ctx).map_err(invoke::stock_class)?;
    Ok(outs.into_iter().zip(want.iter().chain(std::iter::repeat(&false))).map(|(o, &w)| w.then_some(o)).collect())
}

#[cfg(test)]
pub mod check;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::registry;

    /// Every declared gradient names a registered backward operator, and every backward
    /// operator is some operator's gradient.
    #[test]
    fn every_declared_gradient_resolves() {
        let mut used = std::collections::HashSet::new();
        for op in registry().ops() {
            if let Grad::Backward { op: name, .. } = op.grad {
                let b = backward_op(op).unwrap_or_else(|e| panic!("{}: {e}", op.name)).expect("declared");
                assert!(b.is_backward, "{}'s gradient {name} is not a backward operator", op.name);
                used.insert(b.name);
            }
        }
        for op in registry().ops().iter().filter(|o| o.is_backward) {
            assert!(used.contains(op.name), "{} is no operator's gradient", op.name);
        }
    }
}
