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
//!
//! Also owns composed gradients ([`Composed`]): a gradient written as calls of other
//! operators, through [`Calls`] (which autograd implements and records), so that
//! higher-order gradients (`create_graph=True`) differentiate it again. Backward operators
//! declare one where stock's have an FGradient.

use super::param::Attrs;
use super::{invoke, lookup, Grad, Meta, OpDef, Req};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::ndarray::NDArray;

/// The backward operator of `op` (`None` for [`Grad::None`], [`Grad::Zero`] and
/// [`Grad::Composed`]).
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
        Grad::None | Grad::Zero | Grad::Composed { .. } => Ok(None),
    }
}

/// The forward tensors a backward call needs: (inputs, outputs).
pub fn needs(op: &OpDef) -> (bool, bool) {
    match op.grad {
        Grad::Backward { inputs, outputs, .. } | Grad::Composed { inputs, outputs, .. } => (inputs, outputs),
        Grad::Stateful { .. } => (true, true),
        Grad::None | Grad::Zero => (false, false),
    }
}

/// The tensor inputs of the backward call of a forward call of `op`: `ograds`, then the
/// forward `inputs` and/or `outputs` its declaration needs, and the backward operator.
pub fn args<'a>(
    op: &'static OpDef,
    ograds: &[&'a NDArray],
    inputs: &[&'a NDArray],
    outputs: &[&'a NDArray],
) -> Result<(&'static OpDef, Vec<&'a NDArray>)> {
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
    Ok((bop, args))
}

/// Push a call of the backward operator `bop` with the forward call's `attrs` on `args`.
/// Its outputs have the shapes and dtypes of `like` (the forward inputs); output `i` is
/// written when `want[i]` (into `into[i]` when given) and is a placeholder otherwise.
/// Returns every output.
pub fn launch(
    bop: &'static OpDef,
    attrs: &Attrs,
    args: &[&NDArray],
    like: &[Meta],
    want: &[bool],
    into: &[Option<NDArray>],
) -> Result<Vec<NDArray>> {
    // The first array that has memory decides (an input the backward does not need may be
    // an empty placeholder).
    let ctx = args.iter().find_map(|x| x.ctx()).unwrap_or(Context::CPU);
    let mut outs = Vec::with_capacity(like.len());
    let mut req = Vec::with_capacity(like.len());
    for (i, m) in like.iter().enumerate() {
        let w = want.get(i).copied().unwrap_or(false);
        match into.get(i).and_then(|o| o.as_ref()) {
            Some(o) if w => outs.push(o.clone()),
            _ if w => outs.push(NDArray::new(m.shape.clone(), ctx, m.dtype, false)?),
            _ => outs.push(NDArray::none_like_meta(m)),
        }
        req.push(if w { Req::Write } else { Req::Null });
    }
    invoke::launch(bop, attrs.clone(), args, &outs, req.into(), ctx).map_err(invoke::stock_class)?;
    Ok(outs)
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
    let (bop, args) = args(op, ograds, inputs, outputs)?;
    let like: Vec<Meta> = inputs.iter().map(|x| Meta::new(x.shape.clone(), x.dtype)).collect();
    let outs = launch(bop, attrs, &args, &like, want, into)?;
    Ok(outs.into_iter().zip(want.iter().chain(std::iter::repeat(&false))).map(|(o, &w)| w.then_some(o)).collect())
}

/// The operator calls a composed gradient ([`Grad::Composed`]) is built from. Autograd
/// supplies them: while it records the backward pass (`create_graph`), every call is
/// recorded, so the composed gradient can itself be differentiated.
pub trait Calls {
    /// A forward operator's call by name, with parameters as the frontend gives them: its
    /// visible outputs.
    fn call(&self, op: &str, inputs: &[&NDArray], kv: &[(&str, &str)]) -> Result<Vec<NDArray>>;
    /// A backward operator's call, as [`launch`] takes it (no caller-given outputs).
    fn backward(
        &self,
        bop: &'static OpDef,
        attrs: &Attrs,
        args: &[&NDArray],
        like: &[Meta],
        want: &[bool],
    ) -> Result<Vec<NDArray>>;
}

/// What a composed gradient gets: those of a recorded call of `op` (usually a backward
/// operator, whose gradient gives a second-order one).
pub struct Composed<'a> {
    /// The operator whose gradient this is.
    pub op: &'static OpDef,
    /// Its call's parameters.
    pub attrs: &'a Attrs,
    /// One gradient per visible output of the call (zeros where none flowed).
    pub ograds: &'a [NDArray],
    /// The call's inputs (placeholders without memory unless the declaration reads them).
    pub inputs: &'a [NDArray],
    /// The call's outputs, when the declaration reads them.
    pub outputs: &'a [NDArray],
    /// Which inputs need a gradient.
    pub want: &'a [bool],
    pub calls: &'a dyn Calls,
}

/// A composed gradient: one array per input of the call, `None` where not wanted (an input
/// whose gradient is zero may also get `None`).
pub type ComposedFn = fn(&Composed) -> Result<Vec<Option<NDArray>>>;

impl Composed<'_> {
    /// The first output of a call of forward operator `op`.
    pub fn call(&self, op: &str, inputs: &[&NDArray], kv: &[(&str, &str)]) -> Result<NDArray> {
        self.calls
            .call(op, inputs, kv)?
            .into_iter()
            .next()
            .ok_or_else(|| Error::internal(format!("{op} returned no output")))
    }
    /// `a * b`, element-wise (same shapes).
    pub fn mul(&self, a: &NDArray, b: &NDArray) -> Result<NDArray> {
        self.call("elemwise_mul", &[a, b], &[])
    }
    /// `a + b`, element-wise (same shapes).
    pub fn add(&self, a: &NDArray, b: &NDArray) -> Result<NDArray> {
        self.call("elemwise_add", &[a, b], &[])
    }
    /// `a - b`, element-wise (same shapes).
    pub fn sub(&self, a: &NDArray, b: &NDArray) -> Result<NDArray> {
        self.call("elemwise_sub", &[a, b], &[])
    }
    /// A scalar operator (`_mul_scalar`, `_plus_scalar`, `_power_scalar`, ...) with `s`.
    pub fn scalar(&self, op: &str, a: &NDArray, s: f64) -> Result<NDArray> {
        let s = format!("{s:?}");
        self.call(op, &[a], &[("scalar", &s)])
    }
    /// This call's own operator (a backward operator) on other arguments, with its
    /// parameters: its outputs have the shapes and dtypes of `like`.
    pub fn again(&self, args: &[&NDArray], like: &[Meta], want: &[bool]) -> Result<Vec<NDArray>> {
        self.calls.backward(self.op, self.attrs, args, like, want)
    }
    /// Whether input `i` of the call needs a gradient.
    pub fn wants(&self, i: usize) -> bool {
        self.want.get(i).copied().unwrap_or(false)
    }
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
