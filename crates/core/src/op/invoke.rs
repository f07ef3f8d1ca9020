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

use super::tensor::{OutBlob, TBlob};
use super::{random, Meta, OpCtx, OpDef, Req, Resource};
use crate::context::{Context, DevType};
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
        // An alias (a custom operator's view) and its root are one memory.
        (Some(x), Some(y)) if Var::same_block(x, y) => {
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
    let attrs = parse(op, kv, inputs.len())?;
    invoke_parsed(op, inputs, outputs, attrs, false).map(Called::into_visible)
}

/// [`invoke`] with parameters already parsed (graph executors parse once per node).
pub fn invoke_attrs(
    op: &'static OpDef,
    inputs: &[&NDArray],
    outputs: Option<&[&NDArray]>,
    attrs: super::param::Attrs,
) -> Result<Vec<NDArray>> {
    invoke_parsed(op, inputs, outputs, attrs, false).map(Called::into_visible).map_err(stock_class)
}

/// Parse `kv` as `op`'s parameters for a call with `n_inputs` inputs, refusing a backward
/// operator (those run inside autograd).
pub fn parse<'a>(
    op: &'static OpDef,
    kv: impl IntoIterator<Item = (&'a str, &'a str)>,
    n_inputs: usize,
) -> Result<super::param::Attrs> {
    if op.is_backward {
        return Err(Error::not_supported(format!("calling {} directly (it runs inside autograd)", op.name)));
    }
    op.parse_attrs(kv, n_inputs).map_err(stock_class)
}

/// What a call produced, for a recorder (autograd): every output, hidden ones after the
/// visible ones, and the backward of a call that runs its own ([`super::CustomBackward`]).
pub struct Called {
    pub outputs: Vec<NDArray>,
    pub visible: usize,
    pub backward: Option<Arc<dyn super::CustomBackward>>,
}

impl Called {
    fn into_visible(mut self) -> Vec<NDArray> {
        self.outputs.truncate(self.visible);
        self.outputs
    }
}

/// [`invoke_attrs`] returning hidden outputs and any backward of the call's own too.
pub fn call(
    op: &'static OpDef,
    inputs: &[&NDArray],
    outputs: Option<&[&NDArray]>,
    attrs: super::param::Attrs,
) -> Result<Called> {
    invoke_parsed(op, inputs, outputs, attrs, true).map_err(stock_class)
}

/// `all`: the caller wants every output with its metadata (a recorder), so the shortcut that
/// skips inference is not taken.
fn invoke_parsed(
    op: &'static OpDef,
    inputs: &[&NDArray],
    outputs: Option<&[&NDArray]>,
    attrs: super::param::Attrs,
    all: bool,
) -> Result<Called> {
    if let Some(own) = op.invoke_with {
        let (outputs, backward) = own(op, inputs, outputs, attrs)?;
        return Ok(Called { visible: outputs.len(), outputs, backward });
    }
    let want = op.num_inputs(&attrs, inputs.len())?;
    if inputs.len() != want {
        return Err(Error::value(format!(
            "operator {} expects {want} inputs, got {} (check optional inputs against the parameters)",
            op.name,
            inputs.len()
        )));
    }
    if let Some(ctx) = same_shape_call(op, inputs, outputs).filter(|_| !all) {
        let ctx = ctx.check_available()?;
        let outs = vec![NDArray::new(inputs[0].shape.clone(), ctx, inputs[0].dtype, false)?];
        launch(op, attrs, inputs, &outs, ReqList::from_buf_and_len([Req::Write; 4], 1), ctx)?;
        return Ok(Called { outputs: outs, visible: 1, backward: None });
    }
    let mut in_meta = Vec::with_capacity(inputs.len());
    let mut ctx: Option<Context> = None;
    for (i, x) in inputs.iter().enumerate() {
        let c =
            x.ctx().ok_or_else(|| Error::value(format!("input {i} of operator {} is an empty NDArray", op.name)))?;
        // As stock: the host contexts (cpu(i), cpu_pinned, cpu_shared) are one memory and mix;
        // the call runs on the first input's context.
        match ctx {
            Some(prev) if prev != c && !(prev.dev_type.is_host() && c.dev_type.is_host()) => {
                return Err(Error::value(format!(
                    "operator {}: all inputs must be on one context, got {prev} and {c}",
                    op.name
                )));
            }
            Some(_) => {}
            None => ctx = Some(c),
        }
        in_meta.push(Meta::new(x.shape.clone(), x.dtype));
    }
    // As stock's GetContext: the inputs' context, else the caller's outputs' (`_zeros(out=...)`,
    // an initializer filling a CPU array while gpu(0) is the current context), else the
    // `ctx` parameter.
    let ctx = ctx.or_else(|| outputs.and_then(|o| o.first()).and_then(|x| x.ctx())).or_else(|| op.ctx_of(&attrs));
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

    // `_copyto` into another device's array (`copyto(mx.gpu())`, `as_in_context`): a copy
    // between the devices, not a kernel.
    if let (Some(&[o]), true) = (outputs, op.name == "_copyto") {
        let oc = o.ctx();
        if oc.is_some_and(|c| c != ctx && !(c.dev_type.is_host() && ctx.dev_type.is_host())) {
            if o.dtype != inputs[0].dtype || o.shape != inputs[0].shape {
                return Err(Error::not_supported(format!(
                    "_copyto between devices with a change of dtype or shape ({} {:?} to {} {:?})",
                    inputs[0].dtype.name(),
                    inputs[0].shape,
                    o.dtype.name(),
                    o.shape
                )));
            }
            o.copy_from(inputs[0])?;
            return Ok(Called { outputs: vec![o.clone()], visible: 1, backward: None });
        }
    }
    let any_dtype = op.any_out_dtype || (op.dtype_from_out && op.dtype_of(&attrs).is_none());
    let outs = outputs_for(op, outputs, out_meta, visible, ctx, any_dtype)?;
    let req: ReqList = smallvec::smallvec![Req::Write; outs.len()];
    launch(op, attrs, inputs, &outs, req, ctx)?;
    Ok(Called { outputs: outs, visible, backward: None })
}

/// A call's outputs: the caller's `given` ones (checked against inference: shape, dtype unless
/// `any_dtype`, and memory the call can write), then new arrays for the rest. `given` may
/// hold every output or the `visible` ones.
pub(crate) fn outputs_for(
    op: &OpDef,
    given: Option<&[&NDArray]>,
    out_meta: Vec<Meta>,
    visible: usize,
    ctx: Context,
    any_dtype: bool,
) -> Result<Vec<NDArray>> {
    let total = out_meta.len();
    let mut outs: Vec<NDArray> = Vec::with_capacity(total);
    if let Some(given) = given {
        if given.len() != total && given.len() != visible {
            return Err(Error::value(format!("operator {} has {visible} outputs, {} given", op.name, given.len())));
        }
        for (i, o) in given.iter().enumerate() {
            let m = &out_meta[i];
            if o.chunk.is_none() {
                return Err(Error::value(format!("output {i} of operator {} is an empty NDArray", op.name)));
            }
            if o.shape != m.shape || (o.dtype != m.dtype && !any_dtype) {
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
    Ok(outs)
}

/// Whether this call of a [`OpDef::same_shape`] operator is on inputs of one shape, dtype and
/// context, into a new output, for a caller that does not record it: its inference is then
/// known (one output like the inputs) and none runs. Returns the inputs' context; `None` sends the call down the
/// general path (which reports any error).
fn same_shape_call(op: &OpDef, inputs: &[&NDArray], outputs: Option<&[&NDArray]>) -> Option<Context> {
    let first = inputs.first()?;
    if !op.same_shape || outputs.is_some() || op.has_ctx() {
        return None;
    }
    let ctx = first.ctx()?;
    let alike = |x: &&&NDArray| x.ctx() == Some(ctx) && x.dtype == first.dtype && x.shape == first.shape;
    inputs[1..].iter().all(|x| alike(&x)).then_some(ctx)
}

/// Every array of an operation on `ctx` must be memory that its kernel can reach: on a GPU,
/// that GPU's; on the host, host memory (the host contexts share one address space). A CPU
/// kernel handed device memory would read and write through device addresses; this is the
/// one check that keeps every caller (autograd, graphs, the C API) from doing so.
fn check_devices(op: &OpDef, inputs: &[&NDArray], outs: &[NDArray], ctx: Context) -> Result<()> {
    let host = ctx.dev_type.is_host();
    for x in inputs.iter().copied().chain(outs) {
        if let Some(c) = x.ctx() {
            if (host && !c.dev_type.is_host()) || (!host && c != ctx) {
                return Err(Error::value(format!(
                    "operator {}: an array on {c} cannot be used by an operation on {ctx} \
                     (copy it with copyto or as_in_context first)",
                    op.name
                )));
            }
        }
    }
    Ok(())
}

/// The body of an imperative operation: the kernel, then the copies of outputs computed into
/// temporaries (see [`launch`]).
fn run_kernel(op: &OpDef, cx: &OpCtx, in_blobs: &[TBlob], blobs: &mut Blobs) -> Result<()> {
    // Kernels raise IndexError only where stock's do (gather_nd), MXNetError otherwise.
    let ran = (op.compute)(cx, in_blobs, &mut blobs.outs).map_err(|e| {
        if e.kind() == ErrorKind::Index {
            e
        } else {
            stock_class(e)
        }
    });
    run_temps(ran, blobs)
}

/// After a kernel that `ran`: the copies of outputs it computed into temporaries.
fn run_temps(ran: Result<()>, blobs: &mut Blobs) -> Result<()> {
    ran?;
    for (oi, block, dst) in &mut blobs.temps {
        let n = dst.bytes();
        // SAFETY: the block was allocated with at least the output's bytes and is owned by
        // this operation; the kernel that wrote it has returned.
        let src = unsafe { TBlob::new(block.ptr(), &[n], crate::ndarray::DType::U8) };
        debug_assert_eq!(blobs.outs[*oi].bytes(), n);
        dst.copy_from(&src);
    }
    Ok(())
}

/// The kernel's read views of one operation's inputs (inline for the common few).
type InBlobs = smallvec::SmallVec<[TBlob; 3]>;

/// The kernel's writable blobs of one operation: the outputs followed by the mutated inputs,
/// and, for each output computed into a temporary, the temporary and the real output.
#[derive(Default)]
struct Blobs {
    outs: smallvec::SmallVec<[OutBlob; 2]>,
    temps: Vec<(usize, Block, OutBlob)>,
}

/// Whether `a` and `b` are exactly the same bytes (an in-place pair the kernel may read
/// through the output).
fn same_bytes(a: &NDArray, b: &NDArray) -> bool {
    matches!((&a.chunk, &b.chunk), (Some(x), Some(y)) if Arc::ptr_eq(x, y))
        && a.offset == b.offset
        && a.size() * a.dtype.size() == b.size() * b.dtype.size()
}

/// The blobs of one operation, made so that no kernel can see two overlapping views of which
/// one is written (the contract of [`TBlob`] and [`OutBlob`]):
/// - an output that is exactly an input's bytes, declared in place, takes that input as lent
///   (the kernel reads it through the output); `req` becomes [`Req::Inplace`];
/// - a mutated input is lent to a writable blob appended after the outputs;
/// - an output that overlaps any other input, a mutated input or an earlier output is
///   computed into a temporary and copied over after the kernel;
/// - an input that overlaps a mutated input it is not is read from a snapshot taken now;
///   its snapshot block is returned to live as long as the operation.
///
/// They are made where the operation keeps them (`in_blobs`, `blobs`, `snapshots`: empty on
/// entry), not moved there after.
#[allow(clippy::too_many_arguments)]
fn fill_blobs(
    op: &OpDef,
    inputs: &[&NDArray],
    outs: &[NDArray],
    req: &mut [Req],
    ctx: Context,
    in_blobs: &mut InBlobs,
    blobs: &mut Blobs,
    snapshots: &mut Vec<Block>,
) -> Result<()> {
    let mutated = op.mutated_inputs(inputs.len());
    in_blobs.reserve(inputs.len());
    for x in inputs {
        // SAFETY: the address lies in the chunk, which the pushed operation holds for reading;
        // inputs written by this operation are lent below.
        in_blobs.push(unsafe { TBlob::new(x.data()?, &x.shape, x.dtype) });
    }
    for (j, &m) in mutated.iter().enumerate() {
        if mutated[..j].iter().any(|&k| overlaps(inputs[k], inputs[m])) {
            return Err(Error::value(format!("operator {}: two inputs it writes share memory", op.name)));
        }
    }
    blobs.outs.reserve(outs.len() + mutated.len());
    for (oi, o) in outs.iter().enumerate() {
        if req[oi] == Req::Null {
            // Not computed: the kernel must not touch it (a null address makes any access fail).
            // SAFETY: a null blob is never dereferenced (OutBlob's accessors refuse it).
            blobs.outs.push(unsafe { OutBlob::new(std::ptr::null_mut(), &o.shape, o.dtype) });
            continue;
        }
        let lendable = |ii: usize, x: &NDArray| {
            op.inplace.contains(&(ii, oi))
                && same_bytes(o, x)
                && !mutated.contains(&ii)
                && in_blobs[ii].lent_to().is_none()
        };
        let clash = inputs.iter().enumerate().any(|(ii, x)| overlaps(o, x) && !lendable(ii, x))
            || outs[..oi].iter().zip(&req[..oi]).any(|(p, r)| *r != Req::Null && overlaps(o, p));
        if clash {
            if !ctx.dev_type.is_host() {
                return Err(Error::not_supported(format!(
                    "operator {} on {ctx} with an output that overlaps its inputs",
                    op.name
                )));
            }
            let block = Block::alloc((o.size() * o.dtype.size()).max(1), ctx)?;
            // SAFETY: the temporary block is owned by the operation, sized for the output and
            // seen by nothing else; the real output overlaps inputs or other outputs, so it is
            // only written after the kernel returned, through `copy_from`.
            blobs.outs.push(unsafe { OutBlob::new(block.ptr(), &o.shape, o.dtype) });
            // SAFETY: the engine grants this operation the output for writing; it is written
            // once the kernel is done, when no other view of this operation is live.
            let dst = unsafe { OutBlob::new(o.data()?, &o.shape, o.dtype) };
            blobs.temps.push((oi, block, dst));
            req[oi] = Req::Write;
            continue;
        }
        for (ii, x) in inputs.iter().enumerate() {
            if overlaps(o, x) {
                // Lendable (not a clash): exactly this output's bytes.
                in_blobs[ii] = in_blobs[ii].clone().lend(oi);
                if req[oi] == Req::Write {
                    req[oi] = Req::Inplace;
                }
            }
        }
        // SAFETY: the engine grants this operation the output for writing; no input view
        // overlaps it but those lent to it (checked above).
        blobs.outs.push(unsafe { OutBlob::new(o.data()?, &o.shape, o.dtype) });
    }
    for (j, &m) in mutated.iter().enumerate() {
        let x = inputs[m];
        // SAFETY: the engine grants this operation the mutated input for writing; the
        // outputs that overlap it went to temporaries above, and other inputs that overlap it
        // read snapshots below.
        blobs.outs.push(unsafe { OutBlob::new(x.data()?, &x.shape, x.dtype) });
        in_blobs[m] = in_blobs[m].clone().lend(outs.len() + j);
        for (ii, y) in inputs.iter().enumerate() {
            if ii != m && !mutated.contains(&ii) && overlaps(x, y) {
                if !ctx.dev_type.is_host() {
                    return Err(Error::not_supported(format!(
                        "operator {} on {ctx} reading an input that overlaps one it writes",
                        op.name
                    )));
                }
                let n = y.size() * y.dtype.size();
                let block = Block::alloc(n.max(1), ctx)?;
                // SAFETY: `y`'s bytes are readable (the chunk is alive; the operation has not
                // been pushed yet, and the caller's thread is the one queueing writes to it, so
                // the snapshot sees the value the operation would read); the block is new.
                unsafe { y.copy_to_host(block.ptr(), y.size())? };
                // SAFETY: the block is owned by the operation and nothing writes it.
                in_blobs[ii] = unsafe { TBlob::new(block.ptr(), &y.shape, y.dtype) };
                snapshots.push(block);
            }
        }
    }
    Ok(())
}

/// [`fill_blobs`] into new lists.
#[cfg(test)]
fn make_blobs(
    op: &OpDef,
    inputs: &[&NDArray],
    outs: &[NDArray],
    req: &mut [Req],
    ctx: Context,
) -> Result<(InBlobs, Blobs, Vec<Block>)> {
    let (mut in_blobs, mut blobs, mut snapshots) = (InBlobs::new(), Blobs::default(), Vec::new());
    fill_blobs(op, inputs, outs, req, ctx, &mut in_blobs, &mut blobs, &mut snapshots)?;
    Ok((in_blobs, blobs, snapshots))
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
    let mutated = op.mutated_inputs(inputs.len());
    let mut mutable = engine::VarList::with_capacity(outs.len() + mutated.len());
    for (o, r) in outs.iter().zip(req) {
        if *r != Req::Null {
            push_unique(&mut mutable, o.chunk()?);
        }
    }
    // Variadic operators declare the mutated inputs of their largest call.
    for i in mutated {
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

/// A graph node's operator state (stock's `OpStatePtr` of a bound executor's node): made by a
/// stateful operator at the node's first run and reused by later runs of the same executor.
pub type StateSlot = crate::sync::Mutex<Option<Arc<dyn std::any::Any + Send + Sync>>>;

thread_local! {
    /// The slot of the node this thread is running ([`with_state_slot`]).
    static NODE_STATE: std::cell::RefCell<Option<Arc<StateSlot>>> = const { std::cell::RefCell::new(None) };
}

/// Run `f` (one node's call) with `slot` as the node's state slot.
pub fn with_state_slot<R>(slot: &Arc<StateSlot>, f: impl FnOnce() -> R) -> R {
    /// Puts the previous slot back, also when `f` panics.
    struct Restore(Option<Arc<StateSlot>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let prev = self.0.take();
            NODE_STATE.with(|s| *s.borrow_mut() = prev);
        }
    }
    let _restore = Restore(NODE_STATE.with(|s| s.replace(Some(slot.clone()))));
    f()
}

/// The state slot of the node being run on this thread, if a bound executor runs one (an
/// imperative call, or a CachedOp's node, has none: its state is made per call, as stock's).
pub(crate) fn state_slot() -> Option<Arc<StateSlot>> {
    NODE_STATE.with(|s| s.borrow().clone())
}

/// Push `op`'s kernel on `inputs` writing `outs` (allocated, checked against inference) as
/// one engine operation. `req[i]` is how output `i` is written; [`Req::Null`] outputs are
/// neither written nor listed as written variables.
pub(crate) fn launch(
    op: &'static OpDef,
    attrs: super::param::Attrs,
    inputs: &[&NDArray],
    outs: &[NDArray],
    req: ReqList,
    ctx: Context,
) -> Result<()> {
    launch_with(op, attrs, inputs, outs, req, ctx, None)
}

/// A kernel of one call rather than of its operator: it holds what the call made (a stateful
/// extension operator's state, see [`super::library`]).
pub(crate) type CallKernel = Arc<dyn Fn(&OpCtx, &[TBlob], &mut [OutBlob]) -> Result<()> + Send + Sync>;

/// [`launch`] running `kernel` (a CPU kernel) instead of the operator's own, which also writes
/// `state` (the variable of what the kernel holds, so calls on one state run in the order they
/// were pushed): the operation is otherwise the same (its variables, resources, profiler name
/// and in-place rules are the operator's).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_kernel(
    op: &'static OpDef,
    attrs: super::param::Attrs,
    inputs: &[&NDArray],
    outs: &[NDArray],
    req: ReqList,
    ctx: Context,
    kernel: CallKernel,
    state: &Arc<Var>,
) -> Result<()> {
    if !ctx.dev_type.is_host() {
        return Err(Error::not_supported(format!("operator {} on {ctx}", op.name)));
    }
    launch_with(op, attrs, inputs, outs, req, ctx, Some((kernel, state)))
}

fn launch_with(
    op: &'static OpDef,
    attrs: super::param::Attrs,
    inputs: &[&NDArray],
    outs: &[NDArray],
    req: ReqList,
    ctx: Context,
    kernel: Option<(CallKernel, &Arc<Var>)>,
) -> Result<()> {
    let (kernel, state_var) = kernel.map_or((None, None), |(k, v)| (Some(k), Some(v)));
    if !ctx.dev_type.is_host() && op.gpu.is_none() {
        return Err(Error::not_supported(format!("operator {} on {ctx}", op.name)));
    }
    check_devices(op, inputs, outs, ctx)?;
    // The call the engine runs, made in place (moving its views would cost more than the rest
    // of a tiny call); run where it is when the engine runs it here, boxed only when queued.
    let mut slot = Some(KernelCall {
        op,
        attrs,
        req,
        rng: None,
        ctx,
        is_train: is_training(),
        temp: None,
        in_blobs: InBlobs::new(),
        blobs: Blobs::default(),
        snapshots: Vec::new(),
        ran: false,
        kernel,
    });
    let call = slot.as_mut().expect("just made");
    fill_blobs(op, inputs, outs, &mut call.req, ctx, &mut call.in_blobs, &mut call.blobs, &mut call.snapshots)?;
    if op.resources.contains(&Resource::Random) {
        let draws: u64 = outs.iter().map(|m| m.size() as u64).sum::<u64>() * 2 + 2;
        call.rng = Some(random::take(ctx, draws));
    }
    // GPU forms take their workspace (device memory) from the pool themselves.
    if op.resources.contains(&Resource::TempSpace) && ctx.dev_type.is_host() {
        call.temp = Some(super::resource::request(ctx)?);
    }
    let elems: usize = inputs.iter().map(|x| x.size()).chain(outs.iter().map(NDArray::size)).sum();
    // The operator's interned name, borrowed unless the profiler renames it.
    let (profiled_name, scope) = if crate::profiler::ops_on(false) {
        (Some(crate::profiler::op_name(op.engine_name())), crate::profiler::scope())
    } else {
        (None, None)
    };
    // The variables, listed only if the engine needs them (an operation run solo needs
    // none unless it fails); `temp` moves into the kernel, its variable stays here.
    let temp_var = call.temp.as_ref().map(|t| t.var().clone());
    let lists_req = ReqList::from_slice(&call.req);
    let lists = || {
        let (reads, mut writes) = var_lists(op, inputs, outs, &lists_req, temp_var.as_ref())?;
        writes.extend(state_var.cloned());
        Ok((reads, writes))
    };
    let mut p = Push::with(engine::Func::Job(&mut slot), engine::Vars::Lazy(&lists));
    p.ctx = ctx;
    p.cheap = elems <= CHEAP_ELEMENTS;
    p.name = Some(profiled_name.as_ref().unwrap_or(op.engine_name()));
    p.scope = scope;
    engine::global()?.submit(p)
}

/// One operator call as the engine runs it: the kernel with its parameters and views.
struct KernelCall {
    op: &'static OpDef,
    attrs: super::param::Attrs,
    req: ReqList,
    rng: Option<random::Stream>,
    /// Where the kernel runs: on a GPU context, the operator's GPU form.
    ctx: Context,
    is_train: bool,
    temp: Option<Arc<super::resource::TempSpace>>,
    in_blobs: InBlobs,
    blobs: Blobs,
    /// Inputs' snapshots (see `fill_blobs`): they outlive the kernel that reads them.
    snapshots: Vec<Block>,
    /// The kernel has run (its workspace and snapshots are gone): it must not run again.
    ran: bool,
    /// The call's own kernel, run instead of the operator's ([`launch_kernel`]).
    kernel: Option<CallKernel>,
}

impl KernelCall {
    fn run(&mut self) -> Result<()> {
        if std::mem::replace(&mut self.ran, true) {
            return Err(Error::internal(format!("operator {} ran twice", self.op.name)));
        }
        let cx = OpCtx {
            attrs: &self.attrs,
            req: &self.req,
            rng: self.rng,
            is_train: self.is_train,
            temp: self.temp.take(),
        };
        let done = match (self.ctx.dev_type, self.op.gpu) {
            (DevType::Gpu, Some(k)) => {
                super::gpu::run(self.op.name, k, &cx, self.ctx.dev_id, &self.in_blobs, &mut self.blobs.outs)
                    .map_err(stock_class)
            }
            (DevType::Gpu, None) => Err(Error::not_supported(format!("operator {} on {}", self.op.name, self.ctx))),
            _ => match &self.kernel {
                Some(k) => {
                    run_temps(k(&cx, &self.in_blobs, &mut self.blobs.outs).map_err(stock_class), &mut self.blobs)
                }
                None => run_kernel(self.op, &cx, &self.in_blobs, &mut self.blobs),
            },
        };
        drop(std::mem::take(&mut self.snapshots));
        done
    }
}

impl engine::Job for Option<KernelCall> {
    fn run(&mut self, _: &engine::RunContext) -> Result<()> {
        self.as_mut().ok_or_else(|| Error::internal("an operator call ran after it was queued"))?.run()
    }
    fn boxed(&mut self) -> engine::SyncFn {
        let mut call = self.take();
        Box::new(move |rctx: &engine::RunContext| engine::Job::run(&mut call, rctx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CPU kernel is never handed device memory, nor a GPU kernel host memory or another
    /// GPU's, whoever computed the operation's context.
    #[test]
    fn arrays_on_another_device_are_refused_before_any_kernel() {
        use crate::ndarray::DType;
        let op = crate::op::lookup("elemwise_add").unwrap();
        let gpu = NDArray::unallocated_on(Context::gpu(0), vec![3], DType::F32);
        let gpu1 = NDArray::unallocated_on(Context::gpu(1), vec![3], DType::F32);
        let cpu = NDArray::new(vec![3], Context::CPU, DType::F32, false).unwrap();
        let pinned = NDArray::unallocated_on(Context::new(DevType::CpuPinned, 0).unwrap(), vec![3], DType::F32);
        let e = check_devices(op, &[&cpu, &gpu], &[], Context::CPU).unwrap_err().to_string();
        assert!(e.contains("an array on gpu(0) cannot be used by an operation on cpu(0)"), "{e}");
        assert!(check_devices(op, &[&cpu], std::slice::from_ref(&gpu), Context::CPU).is_err());
        assert!(check_devices(op, &[&gpu, &cpu], &[], Context::gpu(0)).is_err());
        assert!(check_devices(op, &[&gpu, &gpu1], &[], Context::gpu(0)).is_err());
        assert!(check_devices(op, &[&gpu, &gpu], &[], Context::gpu(0)).is_ok());
        assert!(check_devices(op, &[&cpu, &pinned], std::slice::from_ref(&cpu), Context::CPU).is_ok());
        // Through the public path, on a machine without that GPU too.
        let e = invoke(op, &[&cpu, &gpu], None, std::iter::empty()).unwrap_err().to_string();
        assert!(e.contains("gpu(0)"), "{e}");
    }
    use crate::ndarray::testing::{array_f32, values};
    use crate::ndarray::DType;
    use crate::op::lookup;

    #[test]
    fn in_place_pairs_read_through_the_output() {
        // x += y and x *= x into x itself: the declared pairs are lent (no temporary), and
        // the results are what separate arrays give.
        let x = array_f32(&[4], &[1.0, 2.0, 3.0, 4.0]);
        let y = array_f32(&[4], &[10.0, 20.0, 30.0, 40.0]);
        let add = lookup("elemwise_add").unwrap();
        invoke(add, &[&x, &y], Some(&[&x]), []).unwrap();
        assert_eq!(values(&x), [11.0, 22.0, 33.0, 44.0]);
        let mul = lookup("elemwise_mul").unwrap();
        invoke(mul, &[&x, &x], Some(&[&x]), []).unwrap();
        assert_eq!(values(&x), [121.0, 484.0, 1089.0, 1936.0]);
        let (mut req, outs) = (vec![Req::Write], vec![x.clone()]);
        let (ins, blobs, snaps) = make_blobs(mul, &[&x, &x], &outs, &mut req, Context::CPU).unwrap();
        assert_eq!((ins[0].lent_to(), ins[1].lent_to()), (Some(0), Some(0)));
        assert!(blobs.temps.is_empty() && snaps.is_empty());
        assert_eq!(req[0], Req::Inplace);
        // Unary and scalar operators in place.
        invoke(lookup("negative").unwrap(), &[&x], Some(&[&x]), []).unwrap();
        invoke(lookup("_plus_scalar").unwrap(), &[&x], Some(&[&x]), [("scalar", "1")]).unwrap();
        assert_eq!(values(&x), [-120.0, -483.0, -1088.0, -1935.0]);
    }

    #[test]
    fn overlaps_that_are_not_declared_pairs_use_a_temporary() {
        // out = x[1:3] + x[0:2] written into x[0:2]: x[1:3] overlaps the output without
        // being its exact bytes, so the output is computed aside and copied over.
        let x = array_f32(&[4], &[1.0, 2.0, 3.0, 4.0]);
        let (a, b) = (x.slice(1, 3).unwrap(), x.slice(0, 2).unwrap());
        let add = lookup("elemwise_add").unwrap();
        let (mut req, outs) = (vec![Req::Write], vec![b.clone()]);
        let (ins, blobs, _) = make_blobs(add, &[&a, &b], &outs, &mut req, Context::CPU).unwrap();
        assert_eq!(blobs.temps.len(), 1);
        assert!(ins.iter().all(|i| i.lent_to().is_none()));
        drop((ins, blobs));
        invoke(add, &[&a, &b], Some(&[&b]), []).unwrap();
        assert_eq!(values(&x), [3.0, 5.0, 3.0, 4.0]);
        // An operator without in-place pairs (dot) into one of its inputs: a temporary too.
        let m = array_f32(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
        invoke(lookup("dot").unwrap(), &[&m, &m], Some(&[&m]), []).unwrap();
        assert_eq!(values(&m), [7.0, 10.0, 15.0, 22.0]);
    }

    #[test]
    fn mutated_inputs_are_written_through_their_own_blobs() {
        // sgd_mom_update(w, g, mom) with out = w: mom (input 2) is lent to writable blob 1.
        let (w, g, mom) = (array_f32(&[2], &[1.0, 2.0]), array_f32(&[2], &[0.5, -1.0]), array_f32(&[2], &[0.0, 0.0]));
        let op = lookup("sgd_mom_update").unwrap();
        let (mut req, outs) = (vec![Req::Write], vec![w.clone()]);
        let (ins, blobs, _) = make_blobs(op, &[&w, &g, &mom], &outs, &mut req, Context::CPU).unwrap();
        assert_eq!((ins[0].lent_to(), ins[1].lent_to(), ins[2].lent_to()), (Some(0), None, Some(1)));
        assert_eq!(blobs.outs.len(), 2);
        drop((ins, blobs));
        let kv = [("lr", "0.1"), ("momentum", "0.9")];
        invoke(op, &[&w, &g, &mom], Some(&[&w]), kv).unwrap();
        let close = |a: Vec<f32>, b: [f32; 2]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-6);
        assert!(close(values(&mom), [-0.05, 0.1]), "{:?}", values(&mom));
        assert!(close(values(&w), [0.95, 2.1]), "{:?}", values(&w));
        // The gradient is the momentum array itself: it is read from a snapshot taken before
        // the update, as if it were a separate array.
        let (w2, m2) = (array_f32(&[2], &[1.0, 2.0]), array_f32(&[2], &[0.5, -1.0]));
        invoke(op, &[&w2, &m2, &m2], Some(&[&w2]), kv).unwrap();
        let (w3, g3, m3) = (array_f32(&[2], &[1.0, 2.0]), array_f32(&[2], &[0.5, -1.0]), array_f32(&[2], &[0.5, -1.0]));
        invoke(op, &[&w3, &g3, &m3], Some(&[&w3]), kv).unwrap();
        assert_eq!((values(&w2), values(&m2)), (values(&w3), values(&m3)));
    }

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
            assert!(same_shape_call(op, &ins, None).is_some(), "{name}");
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
        let z = array_f32(&[2], &[1.0, 2.0]);
        assert!(same_shape_call(add, &[&x, &z], None).is_none());
        let e = invoke(add, &[&x, &z], None, []).unwrap_err().to_string();
        assert!(e.contains("shape"), "{e}");
        let h = NDArray::new(vec![2, 2], Context::CPU, DType::F16, false).unwrap();
        assert!(same_shape_call(add, &[&x, &h], None).is_none());
        assert!(invoke(add, &[&x, &h], None, []).is_err());
        assert!(same_shape_call(add, &[&x, &y], Some(&[&x])).is_none());
        assert!(!lookup("dot").unwrap().same_shape);
    }
}
