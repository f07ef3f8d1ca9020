//! Imperative invocation (`MXImperativeInvokeEx`): parse, infer, allocate, push.
//!
//! Owns the path from an operator, its input arrays, optional caller outputs and parameter
//! strings to an operation pushed to the engine under the operator's name: strict parameter
//! parsing (with `num_args` filled in), the input count check (optional inputs the frontend
//! drops), shape and dtype inference and the check of caller-given outputs against it, output
//! allocation from the storage pool, the read/write variable sets (inputs read, outputs and
//! mutated inputs written, each variable once), random stream reservation, and the overlap
//! rule that lets kernels take plain slices: an output that overlaps an input it was not
//! declared in-place with is computed into a temporary and copied over in the same operation.
//! Also owns the thread's training flag that kernels see (autograd sets it). An operator with
//! its own invocation ([`super::OpDef::invoke_with`], `Custom`) takes over after parsing.

use super::tensor::TBlob;
use super::{random, Meta, OpCtx, OpDef, Req, Resource};
use crate::context::Context;
use crate::engine::{self, Push, Var};
use crate::error::{Error, ErrorKind, Result};
use crate::ndarray::NDArray;
use crate::storage::Block;
use std::cell::Cell;
use std::sync::Arc;

thread_local! {
    static IS_TRAIN: Cell<bool> = const { Cell::new(false) };
}

/// This thread's training flag (MXAutogradSetIsTraining); returns the previous value.
pub fn set_training(on: bool) -> bool {
    IS_TRAIN.with(|c| c.replace(on))
}
pub fn is_training() -> bool {
    IS_TRAIN.with(|c| c.get())
}

fn overlaps(a: &NDArray, b: &NDArray) -> bool {
    match (&a.chunk, &b.chunk) {
        (Some(x), Some(y)) if Arc::ptr_eq(x, y) => {
            let (a0, a1) = (a.offset, a.offset + a.size() * a.dtype.size());
            let (b0, b1) = (b.offset, b.offset + b.size() * b.dtype.size());
            a0 < b1 && b0 < a1 && a1 > a0 && b1 > b0
        }
        _ => false,
    }
}

fn push_unique(list: &mut engine::VarList, v: &Arc<Var>) {
    if !list.iter().any(|x| Arc::ptr_eq(x, v)) {
        list.push(v.clone());
    }
}

/// Invoke `op` on `inputs` with parameters `kv`. `outputs`: the caller's arrays (all outputs or
/// the visible ones) or `None` to allocate. Returns the visible outputs.
///
/// A call the operator rejects (bad parameter, shape, dtype, axis, ...) fails with
/// `MXNetError`, the class stock's operator checks raise, so `except MXNetError` catches it as
/// it does with stock; `NotImplementedError` and internal errors keep their class.
pub fn invoke<'a>(
    op: &'static OpDef,
    inputs: &[&NDArray],
    outputs: Option<&[&NDArray]>,
    kv: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<Vec<NDArray>> {
    invoke_checked(op, inputs, outputs, kv).map_err(stock_class)
}

/// The class stock gives an operator's failure: `MXNetError` for what its checks reject.
pub fn stock_class(e: Error) -> Error {
    match e.kind() {
        ErrorKind::Value | ErrorKind::Type | ErrorKind::Index => Error::mxnet(e.message()),
        _ => e,
    }
}

fn invoke_checked<'a>(
    op: &'static OpDef,
    inputs: &[&NDArray],
    outputs: Option<&[&NDArray]>,
    kv: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<Vec<NDArray>> {
    if op.is_backward {
        return Err(Error::not_supported(format!("calling {} directly (it runs inside autograd)", op.name)));
    }
    let attrs = op.parse_attrs(kv, inputs.len())?;
    invoke_parsed(op, inputs, outputs, attrs)
}

/// [`invoke`] with parameters already parsed (graph executors parse once per node).
pub fn invoke_attrs(
    op: &'static OpDef,
    inputs: &[&NDArray],
    outputs: Option<&[&NDArray]>,
    attrs: super::param::Attrs,
) -> Result<Vec<NDArray>> {
    invoke_parsed(op, inputs, outputs, attrs).map_err(stock_class)
}

fn invoke_parsed(
    op: &'static OpDef,
    inputs: &[&NDArray],
    outputs: Option<&[&NDArray]>,
    attrs: super::param::Attrs,
) -> Result<Vec<NDArray>> {
    if let Some(own) = op.invoke_with {
        return own(op, inputs, outputs, attrs);
    }
    let want = op.num_inputs(&attrs, inputs.len())?;
    if inputs.len() != want {
        return Err(Error::value(format!(
            "operator {} expects {want} inputs, got {} (check optional inputs against the parameters)",
            op.name,
            inputs.len()
        )));
    }
    if let Some(ctx) = same_shape_call(op, &attrs, inputs, outputs) {
        let ctx = ctx.check_available()?;
        let outs = vec![NDArray::new(inputs[0].shape.clone(), ctx, inputs[0].dtype, false)?];
        launch(op, attrs, inputs, &outs, ReqList::from_buf_and_len([Req::Write; 4], 1), ctx)?;
        return Ok(outs);
    }
    let mut in_meta = Vec::with_capacity(inputs.len());
    let mut ctx: Option<Context> = None;
    for (i, x) in inputs.iter().enumerate() {
        let c =
            x.ctx().ok_or_else(|| Error::value(format!("input {i} of operator {} is an empty NDArray", op.name)))?;
        if let Some(prev) = ctx {
            if prev != c {
                return Err(Error::value(format!(
                    "operator {}: all inputs must be on one context, got {prev} and {c}",
                    op.name
                )));
            }
        }
        ctx = Some(c);
        in_meta.push(Meta::new(x.shape.clone(), x.dtype));
    }
    if attrs.has("ctx") {
        if let Some(c) = attrs.ctx("ctx") {
            ctx = Some(c);
        }
    }
    let ctx = ctx.unwrap_or(Context::CPU).check_available()?;
    let out_meta = (op.infer)(&attrs, &in_meta)?;
    let total = (op.num_outputs)(&attrs);
    let visible = (op.num_visible_outputs)(&attrs);
    if out_meta.len() != total {
        return Err(Error::internal(format!(
            "operator {} inferred {} outputs, declared {total}",
            op.name,
            out_meta.len()
        )));
    }

    // Outputs: the caller's (checked against inference) or new arrays.
    let mut outs: Vec<NDArray> = Vec::with_capacity(total);
    if let Some(given) = outputs {
        if given.len() != total && given.len() != visible {
            return Err(Error::value(format!("operator {} has {visible} outputs, {} given", op.name, given.len())));
        }
        for (i, o) in given.iter().enumerate() {
            let m = &out_meta[i];
            if o.chunk.is_none() {
                return Err(Error::value(format!("output {i} of operator {} is an empty NDArray", op.name)));
            }
            if o.shape != m.shape || (o.dtype != m.dtype && !op.any_out_dtype) {
                return Err(Error::value(format!(
                    "operator {}: output {i} has shape {:?} {} but the operator produces {:?} {}",
                    op.name,
                    o.shape,
                    o.dtype.name(),
                    m.shape,
                    m.dtype.name()
                )));
            }
            // Host contexts (cpu(n), cpu_pinned, cpu_shared) share one address space, so an
            // operator may write an output on another one (`copyto(mx.cpu(1))` does).
            let reachable = o.ctx().is_some_and(|c| c == ctx || (c.dev_type.is_host() && ctx.dev_type.is_host()));
            if !reachable {
                return Err(Error::value(format!(
                    "operator {}: output {i} is on {} but the operator runs on {ctx}",
                    op.name,
                    o.ctx().map(|c| c.to_string()).unwrap_or_default()
                )));
            }
            outs.push((*o).clone());
        }
    }
    let given = outs.len();
    for m in out_meta.into_iter().skip(given) {
        outs.push(NDArray::new(m.shape, ctx, m.dtype, false)?);
    }

    let req: ReqList = smallvec::smallvec![Req::Write; outs.len()];
    if !crate::autograd::is_recording() {
        launch(op, attrs, inputs, &outs, req, ctx)?;
        outs.truncate(visible);
        return Ok(outs);
    }
    crate::autograd::check_writable(&outs.iter().take(outputs.map_or(0, |g| g.len())).collect::<Vec<_>>())?;
    launch(op, attrs.clone(), inputs, &outs, req, ctx)?;
    Ok(crate::autograd::record(op, &attrs, inputs, outs, visible))
}

/// Whether this call of a [`OpDef::same_shape`] operator is on inputs of one shape, dtype and
/// context, into a new output, outside autograd: its inference is then known (one output like
/// the inputs) and none runs. Returns the inputs' context; `None` sends the call down the
/// general path (which reports any error).
fn same_shape_call(
    op: &OpDef,
    attrs: &super::param::Attrs,
    inputs: &[&NDArray],
    outputs: Option<&[&NDArray]>,
) -> Option<Context> {
    let first = inputs.first()?;
    if !op.same_shape || outputs.is_some() || attrs.has("ctx") || crate::autograd::is_recording() {
        return None;
    }
    let ctx = first.ctx()?;
    let alike = |x: &&&NDArray| x.ctx() == Some(ctx) && x.dtype == first.dtype && x.shape == first.shape;
    inputs[1..].iter().all(|x| alike(&x)).then_some(ctx)
}

/// The body of an imperative operation: the kernel, then the copies of outputs computed into
/// temporaries (see [`launch`]).
fn run_kernel(
    op: &OpDef,
    cx: &OpCtx,
    in_blobs: &[TBlob],
    out_blobs: &[TBlob],
    temps: &[(usize, Block)],
    final_outs: &[TBlob],
) -> Result<()> {
    // Kernels raise IndexError only where stock's do (gather_nd), MXNetError otherwise.
    (op.compute)(cx, in_blobs, out_blobs).map_err(|e| if e.kind() == ErrorKind::Index { e } else { stock_class(e) })?;
    for (oi, block) in temps {
        let dst = &final_outs[*oi];
        // SAFETY: the temporary holds exactly the output's bytes; the output is written by
        // this operation only and does not overlap the temporary.
        unsafe { std::ptr::copy_nonoverlapping(block.ptr(), dst.ptr(), dst.bytes()) };
    }
    Ok(())
}

/// Operations on at most this many elements (inputs and outputs together) are
/// [`Push::cheap`]: their kernel should take no longer than handing them to a worker thread
/// (measured at 2-3 µs per tiny call on 2 cores; at the kernels' declared cost of 6 ns per
/// element for transcendental functions, 256 elements are about 1.5 µs).
const CHEAP_ELEMENTS: usize = 256;

/// How each output of a launch is written (inline for the common few: no allocation).
pub(crate) type ReqList = smallvec::SmallVec<[Req; 4]>;

/// An operation's variables: inputs read, outputs (unless [`Req::Null`]), mutated inputs and
/// the temporary space written, each listed once.
fn var_lists(
    op: &OpDef,
    inputs: &[&NDArray],
    outs: &[NDArray],
    req: &[Req],
    temp: Option<&Arc<Var>>,
) -> Result<(engine::VarList, engine::VarList)> {
    // Inline for the common few (no allocation unless the operation has more).
    let mut mutable = engine::VarList::with_capacity(outs.len() + op.mutate_inputs.len());
    for (o, r) in outs.iter().zip(req) {
        if *r != Req::Null {
            push_unique(&mut mutable, o.chunk()?);
        }
    }
    // Variadic operators declare the mutated inputs of their largest call.
    for &i in op.mutate_inputs.iter().filter(|&&i| i < inputs.len()) {
        push_unique(&mut mutable, inputs[i].chunk()?);
    }
    let mut constant = engine::VarList::with_capacity(inputs.len());
    for x in inputs {
        let c = x.chunk()?;
        if !mutable.iter().any(|m| Arc::ptr_eq(m, c)) {
            push_unique(&mut constant, c);
        }
    }
    if let Some(t) = temp {
        mutable.push(t.clone());
    }
    Ok((constant, mutable))
}

/// Push `op`'s kernel on `inputs` writing `outs` (allocated, checked against inference) as
/// one engine operation. `req[i]` is how output `i` is written; [`Req::Null`] outputs are
/// neither written nor listed as written variables.
pub(crate) fn launch(
    op: &'static OpDef,
    attrs: super::param::Attrs,
    inputs: &[&NDArray],
    outs: &[NDArray],
    mut req: ReqList,
    ctx: Context,
) -> Result<()> {
    // Blobs, with temporaries for undeclared overlaps.
    // Inline for the common few operands (moved into the pushed closure, no allocation).
    let mut in_blobs: smallvec::SmallVec<[TBlob; 3]> = smallvec::SmallVec::with_capacity(inputs.len());
    for x in inputs {
        // SAFETY: the address lies in the chunk, which the pushed operation holds.
        in_blobs.push(unsafe { TBlob::new(x.data()?, &x.shape, x.dtype) });
    }
    let mut out_blobs: smallvec::SmallVec<[TBlob; 2]> = smallvec::SmallVec::with_capacity(outs.len());
    let mut temps: Vec<(usize, Block)> = Vec::new();

    for (oi, o) in outs.iter().enumerate() {
        if req[oi] == Req::Null {
            // Not computed: the kernel must not touch it (a null address makes any access fail).
            // SAFETY: a null blob is never dereferenced (TBlob's accessors refuse it).
            out_blobs.push(unsafe { TBlob::new(std::ptr::null_mut(), &o.shape, o.dtype) });
            continue;
        }
        let clash = inputs.iter().enumerate().any(|(ii, x)| overlaps(o, x) && !op.inplace.contains(&(ii, oi)));
        let inplace = inputs.iter().enumerate().any(|(ii, x)| overlaps(o, x) && op.inplace.contains(&(ii, oi)));
        if clash {
            let bytes = o.size() * o.dtype.size();
            let block = Block::alloc(bytes.max(1), ctx)?;
            // SAFETY: the temporary block is owned by the operation and sized for the output.
            out_blobs.push(unsafe { TBlob::new(block.ptr(), &o.shape, o.dtype) });
            temps.push((oi, block));
            req[oi] = Req::Write;
        } else {
            // SAFETY: as for inputs.
            out_blobs.push(unsafe { TBlob::new(o.data()?, &o.shape, o.dtype) });
            if inplace && req[oi] == Req::Write {
                req[oi] = Req::Inplace;
            }
        }
    }
    let final_outs: Vec<TBlob> = if temps.is_empty() {
        Vec::new()
    } else {
        // SAFETY: as for inputs.
        outs.iter()
            .map(|o| {
                Ok(unsafe {
                    TBlob::new(if o.chunk.is_some() { o.data()? } else { std::ptr::null_mut() }, &o.shape, o.dtype)
                })
            })
            .collect::<Result<_>>()?
    };

    let rng = if op.resources.contains(&Resource::Random) {
        let draws: u64 = outs.iter().map(|m| m.size() as u64).sum::<u64>() * 2 + 2;
        Some(random::take(ctx, draws))
    } else {
        None
    };
    let temp = if op.resources.contains(&Resource::TempSpace) { Some(super::resource::request(ctx)?) } else { None };
    let is_train = is_training();
    let elems: usize = inputs.iter().map(|x| x.size()).chain(outs.iter().map(NDArray::size)).sum();
    // The operator's interned name, borrowed unless the profiler renames it.
    let (profiled_name, scope) = if crate::profiler::ops_on(false) {
        (Some(crate::profiler::op_name(op.engine_name())), crate::profiler::scope())
    } else {
        (None, None)
    };
    let name = profiled_name.as_ref().unwrap_or(op.engine_name());
    let engine = engine::global()?;
    let cheap = elems <= CHEAP_ELEMENTS;
    let tag = engine::OpTag { name: Some(name), symbolic: false, scope: scope.as_ref(), cheap };
    if cheap {
        // Solo (see engine::solo): no variable is taken, so none is listed; on a failure the
        // written ones are marked.
        if let Some(guard) = engine.enter_solo_cheap(ctx) {
            // The kernel takes `temp`; its variable stays here for a failure to mark. The
            // written variables are listed only on a failure (every chunk was checked when the
            // blobs were made).
            let temp_var = temp.as_ref().map(|t| t.var().clone());
            let mark_writes = |mark: &mut dyn FnMut(&Var)| {
                if let Ok((_, written)) = var_lists(op, inputs, outs, &req, temp_var.as_ref()) {
                    written.iter().for_each(|v| mark(v));
                }
            };
            let kernel = |_: &engine::RunContext| {
                let cx = OpCtx { attrs: &attrs, req: &req, rng, is_train, temp };
                run_kernel(op, &cx, &in_blobs, &out_blobs, &temps, &final_outs)
            };
            engine.run_solo(guard, ctx, tag, kernel, mark_writes);
            return Ok(());
        }
    }
    let (constant, mutable) = var_lists(op, inputs, outs, &req, temp.as_ref().map(|t| t.var()))?;
    if cheap {
        // A cheap operation that may run at once runs here, from the stack: nothing is boxed
        // or moved into an engine operation.
        if let Some(slot) = engine.acquire_cheap(&constant, &mutable, ctx, tag) {
            slot.run(|_| {
                let cx = OpCtx { attrs: &attrs, req: &req, rng, is_train, temp };
                run_kernel(op, &cx, &in_blobs, &out_blobs, &temps, &final_outs)
            });
            return Ok(());
        }
    }
    let func = move |_: &engine::RunContext| -> Result<()> {
        let cx = OpCtx { attrs: &attrs, req: &req, rng, is_train, temp };
        run_kernel(op, &cx, &in_blobs, &out_blobs, &temps, &final_outs)
    };
    let mut p = Push::sync(func, constant, mutable);
    p.ctx = ctx;
    p.cheap = cheap;
    p.name = Some(name.clone());
    p.scope = scope;
    engine.push(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ndarray::testing::{array_f32, values};
    use crate::ndarray::DType;
    use crate::op::lookup;

    #[test]
    fn same_shape_calls_match_the_general_path() {
        let x = array_f32(&[2, 2], &[1.0, -2.0, 3.0, 4.0]);
        let y = array_f32(&[2, 2], &[0.5, 2.0, -1.0, 8.0]);
        for (name, kv) in [
            ("elemwise_add", vec![]),
            ("broadcast_mul", vec![]),
            ("_plus_scalar", vec![("scalar", "1.5")]),
            ("relu", vec![]),
            ("clip", vec![("a_min", "-1"), ("a_max", "2")]),
        ] {
            let op = lookup(name).unwrap();
            let ins: Vec<&NDArray> =
                if name.starts_with("elemwise") || name.starts_with("broadcast") { vec![&x, &y] } else { vec![&x] };
            assert!(op.same_shape, "{name}");
            let attrs = op.parse_attrs(kv.iter().copied(), ins.len()).unwrap();
            assert!(same_shape_call(op, &attrs, &ins, None).is_some(), "{name}");
            let fast = invoke(op, &ins, None, kv.iter().copied()).unwrap();
            // Into a given output: the general path.
            let given = NDArray::new(vec![2, 2], Context::CPU, DType::F32, false).unwrap();
            invoke(op, &ins, Some(&[&given]), kv.iter().copied()).unwrap();
            assert_eq!(fast.len(), 1);
            assert_eq!((&fast[0].shape[..], fast[0].dtype), (&[2usize, 2][..], DType::F32));
            assert_eq!(values(&fast[0]), values(&given), "{name}");
        }
        // Anything else takes the general path, with its errors.
        let add = lookup("elemwise_add").unwrap();
        let attrs = add.parse_attrs([], 2).unwrap();
        let z = array_f32(&[2], &[1.0, 2.0]);
        assert!(same_shape_call(add, &attrs, &[&x, &z], None).is_none());
        let e = invoke(add, &[&x, &z], None, []).unwrap_err().to_string();
        assert!(e.contains("shape"), "{e}");
        let h = NDArray::new(vec![2, 2], Context::CPU, DType::F16, false).unwrap();
        assert!(same_shape_call(add, &attrs, &[&x, &h], None).is_none());
        assert!(invoke(add, &[&x, &h], None, []).is_err());
        assert!(same_shape_call(add, &attrs, &[&x, &y], Some(&[&x])).is_none());
        assert!(!lookup("dot").unwrap().same_shape);
    }
}
