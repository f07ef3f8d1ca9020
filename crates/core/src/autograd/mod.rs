//! Autograd: recording imperative calls and computing gradients from the record.
//!
//! Owns the thread's recording flag, imperative invocation that records ([`invoke`]: the
//! entry of the frontend's and the executors' calls), the recorded graph ([`Node`]: a marked
//! variable or a recorded operator call with the tensors its gradient needs, or a call's own
//! backward, [`CustomBackward`]), the link from an array to the graph ([`Entry`], kept in
//! `NDArray::ag` as an opaque [`GraphLink`]), marking variables, the in-place rule (an array
//! already in a graph cannot be written while recording, as stock refuses), and backward:
//! a reverse topological walk that pushes each call's backward operator (`op::grad`) through
//! the engine, sums gradient contributions with `add_n`, writes or accumulates into the
//! variables' gradient arrays per their request, and releases the graph unless asked to
//! retain it; a record's history ([`history`], for `autograd.get_symbol`). With `create_graph` the backward pass is itself recorded (its calls read the
//! forward tensors as graph entries), so gradients can be differentiated again; backward
//! operators differentiate through their composed gradients (`Grad::Composed`). Views
//! taken while recording are recorded as `Reshape` / `slice` calls.
//!
//! The training flag kernels see lives with imperative invocation (`op::invoke`).

use crate::error::{Error, Result};
use crate::ndarray::{GraphLink, NDArray};
use crate::op::grad::Calls;
use crate::op::param::Attrs;
use crate::op::{self, grad, invoke, CustomBackward, Grad, Meta, OpDef};
use crate::sync::Mutex;
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub use crate::op::invoke::{is_training, set_training};

thread_local! {
    static RECORDING: Cell<bool> = const { Cell::new(false) };
}

/// This thread's recording flag (MXAutogradSetIsRecording); returns the previous value.
pub fn set_recording(on: bool) -> bool {
    RECORDING.with(|c| c.replace(on))
}
pub fn is_recording() -> bool {
    RECORDING.with(|c| c.get())
}

/// How a variable's gradient is written (stock's OpReqType codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GradReq {
    Null,
    Write,
    Add,
}

impl GradReq {
    pub fn from_code(code: u32) -> Result<GradReq> {
        match code {
            0 => Ok(GradReq::Null),
            1 | 2 => Ok(GradReq::Write),
            3 => Ok(GradReq::Add),
            _ => Err(Error::value(format!(
                "grad_req code {code} is not one of 0 (null), 1 (write), 2 (inplace), 3 (add)"
            ))),
        }
    }
}

/// An array's place in a recorded graph: output `index` of `node`.
#[derive(Clone)]
pub struct Entry {
    pub node: Arc<Node>,
    pub index: usize,
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Entry({}, {})", self.node.name(), self.index)
    }
}

impl Entry {
    /// This entry as an array's link to its graph.
    fn link(&self) -> GraphLink {
        GraphLink { node: self.node.clone(), index: self.index }
    }
}

/// The recorded node `x` is linked to (only this module links arrays to graphs, always to a
/// [`Node`]).
fn node_of(x: &NDArray) -> Option<&Node> {
    x.ag.as_ref().and_then(|l| l.node.downcast_ref::<Node>())
}

/// `x`'s place in a recorded graph.
fn entry_of(x: &NDArray) -> Option<Entry> {
    let l = x.ag.as_ref()?;
    Some(Entry { node: l.node.clone().downcast::<Node>().ok()?, index: l.index })
}

/// A node of a recorded graph.
pub struct Node {
    pub kind: Kind,
    /// Whether a gradient flows to a variable through this node.
    pub need_grad: bool,
    saved: Mutex<Saved>,
}

/// Releasing the last array of a long recorded chain frees the graph with a loop, not one
/// nested drop per node (a 300k-step chain would overflow the stack): each node's links
/// (its inputs' nodes and its mirror sources) are moved to a work list; a node still shared
/// elsewhere is only released.
impl Drop for Node {
    fn drop(&mut self) {
        let mut pending = self.take_links();
        while let Some(n) = pending.pop() {
            if let Some(mut node) = Arc::into_inner(n) {
                pending.append(&mut node.take_links());
            }
        }
    }
}

impl Node {
    /// Moves out the nodes this one refers to.
    fn take_links(&mut self) -> Vec<Arc<Node>> {
        let mut out = Vec::new();
        if let Kind::Call(c) = &mut self.kind {
            out.extend(std::mem::take(&mut c.inputs).into_iter().flatten().map(|e| e.node));
        }
        if let Some(sources) = self.saved.get_mut().mirror.take() {
            out.extend(sources.into_iter().filter_map(|s| match s {
                Source::Recompute(e) => Some(e.node),
                Source::Kept(_) => None,
            }));
        }
        out
    }
}

/// What a node is.
pub enum Kind {
    /// A marked variable: its gradient array and request.
    Variable { grad: Option<NDArray>, req: GradReq, data: Option<Arc<crate::ndarray::Chunk>> },
    /// A recorded call.
    Call(Call),
}

/// A recorded operator call.
pub struct Call {
    pub op: &'static OpDef,
    pub attrs: Attrs,
    /// The graph entries of the inputs (`None`: an input outside any graph).
    pub inputs: Vec<Option<Entry>>,
    pub in_meta: Vec<Meta>,
    /// Visible outputs.
    pub out_meta: Vec<Meta>,
    /// The backward of a call that is not an operator's (`autograd.Function`, `Custom`).
    pub custom: Option<Arc<dyn CustomBackward>>,
}

#[derive(Default)]
struct Saved {
    inputs: Vec<NDArray>,
    outputs: Vec<NDArray>,
    /// A mirrored call (`MXNET_BACKWARD_DO_MIRROR`) keeps neither its inputs nor its outputs
    /// but these, one per input, and recomputes both in backward.
    mirror: Option<Vec<Source>>,
    released: bool,
}

/// Where a mirrored call's input comes from in backward.
#[derive(Clone)]
enum Source {
    /// Kept from the forward pass.
    Kept(NDArray),
    /// The output of another mirrored call, recomputed in turn.
    Recompute(Entry),
}

/// `MXNET_BACKWARD_DO_MIRROR`, read at each recorded call (a value that is not a boolean is an
/// error, not a silent `0`).
pub fn mirror_enabled() -> Result<bool> {
    Ok(crate::config::global().get_bool("MXNET_BACKWARD_DO_MIRROR", "autograd recording")?.unwrap_or(false))
}

/// Whether a recorded call of `op` that keeps its outputs recomputes them in backward instead,
/// with mirroring `enabled` ([`mirror_enabled`]).
fn mirrored(op: &'static OpDef, attrs: &Attrs, enabled: bool) -> bool {
    let Grad::Backward { outputs: true, .. } = op.grad else { return false };
    if op.mutates_any()
        || !op.resources.is_empty()
        || op.invoke_with.is_some()
        || (op.num_outputs)(attrs) != 1
        || op.never_mirrored
    {
        return false;
    }
    enabled
}

/// What a recorded call of `op` keeps for its gradient: (inputs, outputs). A mirrored call
/// keeps its inputs (to recompute from) and not its outputs.
pub fn keeps(op: &'static OpDef, attrs: &Attrs, mirror: bool) -> (bool, bool) {
    if mirrored(op, attrs, mirror) {
        (true, false)
    } else {
        grad::needs(op)
    }
}

/// Outputs of mirrored calls recomputed during one backward pass, dropped once the call's
/// own backward is pushed (its consumers' came before).
type Memo = HashMap<*const Node, Vec<NDArray>>;

/// The outputs of the mirrored call `node`, recomputed once per backward pass (not recorded).
fn mirrored_outputs(node: &Arc<Node>, memo: &mut Memo) -> Result<Vec<NDArray>> {
    if let Some(v) = memo.get(&Arc::as_ptr(node)) {
        return Ok(v.clone());
    }
    let call = node.call().ok_or_else(|| Error::internal("a mirrored value points at a variable"))?;
    let sources =
        node.saved.lock().mirror.clone().ok_or_else(|| Error::internal("a mirrored value's call kept no sources"))?;
    let inputs = mirrored_inputs(&sources, memo)?;
    let refs: Vec<&NDArray> = inputs.iter().collect();
    let was = set_recording(false);
    let outs = invoke_attrs(call.op, &refs, None, call.attrs.clone());
    set_recording(was);
    let outs = outs?;
    memo.insert(Arc::as_ptr(node), outs.clone());
    Ok(outs)
}

/// A mirrored call's inputs: kept, or recomputed.
fn mirrored_inputs(sources: &[Source], memo: &mut Memo) -> Result<Vec<NDArray>> {
    sources
        .iter()
        .map(|s| match s {
            Source::Kept(x) => Ok(x.clone()),
            Source::Recompute(e) => mirrored_outputs(&e.node, memo)?
                .get(e.index)
                .cloned()
                .ok_or_else(|| Error::internal("a mirrored value's output index is out of range")),
        })
        .collect()
}

impl Node {
    pub fn name(&self) -> &str {
        match &self.kind {
            Kind::Variable { .. } => "variable",
            Kind::Call(c) => c.op.name,
        }
    }
    /// Whether the node still belongs to a live graph (variables always do).
    pub fn live(&self) -> bool {
        matches!(self.kind, Kind::Variable { .. }) || !self.saved.lock().released
    }
    pub fn call(&self) -> Option<&Call> {
        match &self.kind {
            Kind::Call(c) => Some(c),
            Kind::Variable { .. } => None,
        }
    }
}

/// A copy of `x` without graph membership (saved tensors must not point back at their node).
fn plain(x: &NDArray) -> NDArray {
    x.detached()
}

/// `x` as a marked variable with gradient array `grad` (None for req null).
pub fn mark_variable(x: &NDArray, req: GradReq, grad: Option<NDArray>) -> Result<NDArray> {
    if req != GradReq::Null {
        let g = grad.as_ref().ok_or_else(|| {
            Error::value("MXAutogradMarkVariables: a gradient array is required unless grad_req is null")
        })?;
        if g.shape != x.shape {
            return Err(Error::value(format!(
                "gradient array of shape {:?} does not match the variable's {:?}",
                g.shape, x.shape
            )));
        }
    }
    let node = Arc::new(Node {
        kind: Kind::Variable { grad: grad.map(|g| plain(&g)), req, data: x.chunk.clone() },
        need_grad: req != GradReq::Null,
        saved: Mutex::new(Saved::default()),
    });
    Ok(x.with_link(Entry { node, index: 0 }.link()))
}

/// The gradient array of a marked variable (None otherwise).
pub fn grad_of(x: &NDArray) -> Option<NDArray> {
    match &node_of(x)?.kind {
        Kind::Variable { grad, .. } => grad.clone(),
        Kind::Call(_) => None,
    }
}

/// Refuse to write `outs` while recording when one of them is already in a graph.
/// While recording, refuses a frontend call that is recorded (an input is in a graph) and
/// whose output is one of its inputs (`x[i] = y` for a `y` with a gradient): stock links each
/// input of a recorded call into the graph before it looks at the outputs, so such an output
/// is already in the graph. (Executors run planned in-place steps through [`invoke`]; only
/// calls from the frontend are checked.)
pub fn check_inplace(inputs: &[&NDArray], outs: &[&NDArray]) -> Result<()> {
    if !is_recording() || !inputs.iter().any(|i| entry_of(i).is_some_and(|e| e.node.need_grad && e.node.live())) {
        return Ok(());
    }
    let same = |a: &NDArray, b: &NDArray| a.same_chunk(b) && a.offset == b.offset && a.shape == b.shape;
    if outs.iter().any(|o| inputs.iter().any(|i| same(i, o))) {
        return Err(Error::mxnet(
            "Inplace operations (+=, -=, x[:]=, etc) are not supported when recording with autograd.",
        ));
    }
    Ok(())
}

pub fn check_writable(outs: &[&NDArray]) -> Result<()> {
    if !is_recording() {
        return Ok(());
    }
    for o in outs {
        if node_of(o).is_some_and(|n| n.live()) {
            return Err(Error::mxnet(
                "Assigning to NDArrays that are already in a computational graph will cause undefined behavior \
                 when evaluating gradients. Please call backward first to clear the graph or do this out side of \
                 a record section. Also note that you cannot use inplace operations like +=, *=, relu(x, out=x), \
                 y[idx]=x, etc inside a record section.",
            ));
        }
    }
    Ok(())
}

/// Invoke `op` imperatively (see [`op::invoke::invoke`]), recording the call while this
/// thread records.
pub fn invoke<'a>(
    op: &'static OpDef,
    inputs: &[&NDArray],
    outputs: Option<&[&NDArray]>,
    kv: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<Vec<NDArray>> {
    if !is_recording() {
        return invoke::invoke(op, inputs, outputs, kv);
    }
    let attrs = invoke::parse(op, kv, inputs.len())?;
    invoke_attrs(op, inputs, outputs, attrs)
}

/// [`invoke`] with parameters already parsed.
pub fn invoke_attrs(
    op: &'static OpDef,
    inputs: &[&NDArray],
    outputs: Option<&[&NDArray]>,
    attrs: Attrs,
) -> Result<Vec<NDArray>> {
    if !is_recording() {
        return invoke::invoke_attrs(op, inputs, outputs, attrs);
    }
    if let Some(given) = outputs {
        check_writable(given)?;
    }
    // Read before the call runs: a bad value fails the call before it writes anything.
    let mirror = mirror_enabled()?;
    let called = invoke::call(op, inputs, outputs, attrs.clone())?;
    Ok(record_call(op, &attrs, inputs, called.outputs, called.visible, called.backward, mirror))
}

/// Record a call of `op` (when recording): `outs` are all its outputs, hidden ones included;
/// returns the visible outputs with their graph entries.
pub fn record(
    op: &'static OpDef,
    attrs: &Attrs,
    inputs: &[&NDArray],
    outs: Vec<NDArray>,
    visible: usize,
) -> Result<Vec<NDArray>> {
    record_with(op, attrs, inputs, outs, visible, None)
}

/// [`record`] with a custom backward.
pub fn record_with(
    op: &'static OpDef,
    attrs: &Attrs,
    inputs: &[&NDArray],
    outs: Vec<NDArray>,
    visible: usize,
    custom: Option<Arc<dyn CustomBackward>>,
) -> Result<Vec<NDArray>> {
    // Only a recorded call without a backward of its own can be mirrored.
    let mirror = is_recording() && custom.is_none() && mirror_enabled()?;
    Ok(record_call(op, attrs, inputs, outs, visible, custom, mirror))
}

/// [`record_with`] with the mirroring setting already read.
#[allow(clippy::too_many_arguments)]
fn record_call(
    op: &'static OpDef,
    attrs: &Attrs,
    inputs: &[&NDArray],
    mut outs: Vec<NDArray>,
    visible: usize,
    custom: Option<Arc<dyn CustomBackward>>,
    mirror: bool,
) -> Vec<NDArray> {
    if !is_recording() {
        outs.truncate(visible);
        return outs;
    }
    // An output of a graph a backward pass has freed (`retain_graph=False`) enters a new
    // recording as a constant, as stock clears its autograd entry.
    let entries: Vec<Option<Entry>> =
        inputs.iter().map(|x| entry_of(x).filter(|e| e.node.need_grad && e.node.live())).collect();
    // A backward operator recorded by a backward pass that records (`create_graph`) stays in
    // the graph even without a gradient of its own, so that differentiating through it fails
    // as stock's does instead of giving zeros.
    let need_grad = entries.iter().any(|e| e.is_some()) && (!op.grad.is_none() || custom.is_some() || op.is_backward);
    let (need_in, need_out) = if custom.is_some() { (false, false) } else { grad::needs(op) };
    let saved = if need_grad && custom.is_none() && mirrored(op, attrs, mirror) {
        let sources = inputs
            .iter()
            .map(|x| match entry_of(x) {
                Some(e) if e.node.saved.lock().mirror.is_some() => Source::Recompute(e),
                _ => Source::Kept(plain(x)),
            })
            .collect();
        Saved { mirror: Some(sources), ..Saved::default() }
    } else if need_grad {
        Saved {
            inputs: if need_in { inputs.iter().map(|x| plain(x)).collect() } else { Vec::new() },
            outputs: if need_out { outs.iter().map(plain).collect() } else { Vec::new() },
            mirror: None,
            released: false,
        }
    } else {
        Saved::default()
    };
    let node = Arc::new(Node {
        kind: Kind::Call(Call {
            op,
            attrs: attrs.clone(),
            inputs: if need_grad { entries } else { Vec::new() },
            in_meta: inputs.iter().map(|x| Meta::new(x.shape.clone(), x.dtype)).collect(),
            out_meta: outs[..visible].iter().map(|x| Meta::new(x.shape.clone(), x.dtype)).collect(),
            custom,
        }),
        need_grad,
        saved: Mutex::new(saved),
    });
    outs.truncate(visible);
    for (i, o) in outs.iter_mut().enumerate() {
        o.ag = Some(Entry { node: node.clone(), index: i }.link());
    }
    outs
}

/// Record a view taken while recording as the call `op_name(params)` of `src`.
pub fn record_view(op_name: &str, params: &[(&str, &str)], src: &NDArray, view: NDArray) -> Result<NDArray> {
    if !is_recording() {
        return Ok(view);
    }
    let op = op::lookup(op_name)?;
    let attrs = op.parse_attrs(params.iter().copied(), 1)?;
    Ok(record(op, &attrs, &[src], vec![view], 1)?.pop().expect("one output"))
}

/// A new array of `meta` filled with `value` (or `out`, filled).
fn filled(meta: &Meta, ctx: crate::context::Context, value: f64, out: Option<&NDArray>) -> Result<NDArray> {
    let shape = format!("({})", meta.shape.iter().map(|d| format!("{d},")).collect::<String>());
    let (v, c) = (value.to_string(), ctx.to_string());
    let kv = [("shape", shape.as_str()), ("dtype", meta.dtype.name()), ("value", v.as_str()), ("ctx", c.as_str())];
    let outs = out.map(|o| [o]);
    self::invoke(op::lookup("_full")?, &[], outs.as_ref().map(|o| &o[..]), kv).map(|mut v| v.remove(0))
}

fn ones_like(x: &Meta, ctx: crate::context::Context) -> Result<NDArray> {
    filled(x, ctx, 1.0, None)
}

fn zeros(x: &Meta, ctx: crate::context::Context) -> Result<NDArray> {
    filled(x, ctx, 0.0, None)
}

/// Sum of `parts` (one or more) into `out` (a new array when None).
fn sum_into(parts: &[NDArray], out: Option<&NDArray>) -> Result<NDArray> {
    let refs: Vec<&NDArray> = parts.iter().collect();
    if parts.len() == 1 {
        return match out {
            None => Ok(parts[0].clone()),
            Some(o) => {
                self::invoke(op::lookup("_copy")?, &refs, Some(&[o]), std::iter::empty()).map(|mut v| v.remove(0))
            }
        };
    }
    let outs = out.map(|o| [o]);
    self::invoke(op::lookup("add_n")?, &refs, outs.as_ref().map(|o| &o[..]), std::iter::empty())
        .map(|mut v| v.remove(0))
}

/// The gradients of a recorded call's inputs (one per input, `None` where not wanted), from
/// its backward operator or its composed gradient; `into` as [`grad::backward`] takes it
/// (ignored when `recorded`). While the backward pass records, the calls are recorded.
fn node_gradients(
    call: &Call,
    ograds: &[NDArray],
    inputs: &[NDArray],
    outputs: &[NDArray],
    want: &[bool],
    into: &[Option<NDArray>],
    recorded: bool,
) -> Result<Vec<Option<NDArray>>> {
    if let Grad::Composed { f, .. } = call.op.grad {
        let grads =
            f(&grad::Composed { op: call.op, attrs: &call.attrs, ograds, inputs, outputs, want, calls: &Recorder })?;
        if grads.len() != inputs.len() {
            return Err(Error::internal(format!(
                "the composed gradient of {} gave {} gradients for {} inputs",
                call.op.name,
                grads.len(),
                inputs.len()
            )));
        }
        return Ok(grads.into_iter().zip(want).map(|(g, &w)| g.filter(|_| w)).collect());
    }
    let og: Vec<&NDArray> = ograds.iter().collect();
    let ins: Vec<&NDArray> = inputs.iter().collect();
    let outs: Vec<&NDArray> = outputs.iter().collect();
    if !recorded {
        return grad::backward(call.op, &call.attrs, &og, &ins, &outs, want, into);
    }
    let (bop, bargs) = grad::args(call.op, &og, &ins, &outs)?;
    let outs = Recorder.backward(bop, &call.attrs, &bargs, &call.in_meta, want)?;
    Ok(outs.into_iter().zip(want.iter().chain(std::iter::repeat(&false))).map(|(o, &w)| w.then_some(o)).collect())
}

/// Operator calls for composed gradients and recorded backward passes: each is recorded
/// while this thread records.
struct Recorder;

impl grad::Calls for Recorder {
    fn call(&self, op: &str, inputs: &[&NDArray], kv: &[(&str, &str)]) -> Result<Vec<NDArray>> {
        self::invoke(op::lookup(op)?, inputs, None, kv.iter().copied())
    }

    fn backward(
        &self,
        bop: &'static OpDef,
        attrs: &Attrs,
        args: &[&NDArray],
        like: &[Meta],
        want: &[bool],
    ) -> Result<Vec<NDArray>> {
        let outs = grad::launch(bop, attrs, args, like, want, &[])?;
        let n = outs.len();
        Ok(record_call(bop, attrs, args, outs, n, None, false))
    }
}

type Key = (*const Node, usize);

fn key(e: &Entry) -> Key {
    (Arc::as_ptr(&e.node), e.index)
}

/// The nodes that need a gradient, reachable from `heads`, in topological order (inputs first).
fn topo(heads: &[Entry]) -> Vec<Arc<Node>> {
    let mut order = Vec::new();
    let mut seen: HashMap<*const Node, ()> = HashMap::new();
    let mut stack: Vec<(Arc<Node>, usize)> = Vec::new();
    for h in heads {
        if !h.node.need_grad || seen.insert(Arc::as_ptr(&h.node), ()).is_some() {
            continue;
        }
        stack.push((h.node.clone(), 0));
        while let Some((n, i)) = stack.pop() {
            let inputs: &[Option<Entry>] = n.call().map(|c| &c.inputs[..]).unwrap_or(&[]);
            if let Some(next) = inputs[i.min(inputs.len())..]
                .iter()
                .position(|e| e.as_ref().is_some_and(|e| e.node.need_grad && !seen.contains_key(&Arc::as_ptr(&e.node))))
            {
                let j = i + next;
                let child = inputs[j].as_ref().expect("checked").node.clone();
                seen.insert(Arc::as_ptr(&child), ());
                stack.push((n, j + 1));
                stack.push((child, 0));
            } else {
                order.push(n);
            }
        }
    }
    order
}

/// What `MXAutogradBackwardEx` asks for.
pub struct BackwardArgs<'a> {
    pub heads: &'a [NDArray],
    /// One per head; `None`: ones.
    pub head_grads: &'a [Option<NDArray>],
    /// Compute and return these arrays' gradients instead of writing the variables' (`autograd.grad`).
    pub variables: &'a [NDArray],
    pub retain_graph: bool,
    pub create_graph: bool,
    pub is_train: bool,
    /// A head gradient larger than its head (same dtype) is read by its leading elements, as
    /// stock's imperative backward reads it (it does not check the shape; upstream
    /// test_contrib_control_flow passes one row too many). Stock's executor refuses it.
    pub larger_head_grads: bool,
}

/// Run backward; returns the gradients of `variables` (empty when none were given).
pub fn backward(args: BackwardArgs) -> Result<Vec<NDArray>> {
    let not_in_graph = || {
        Error::mxnet(
            "Cannot differentiate node because it is not in a computational graph. You need to set is_recording to \
             true or use autograd.record() to save computational graphs for backward. If you want to differentiate \
             the same graph twice, you need to pass retain_graph=True to backward.",
        )
    };
    let mut heads = Vec::with_capacity(args.heads.len());
    for h in args.heads {
        let e = entry_of(h).ok_or_else(not_in_graph)?;
        if !e.node.live() {
            return Err(not_in_graph());
        }
        heads.push(e);
    }
    let order = topo(&heads);
    for n in &order {
        if !n.live() {
            return Err(not_in_graph());
        }
    }
    let bulk = crate::engine::ExecBulk::from_config(crate::config::global())?.backward_size();
    let prev_train = set_training(args.is_train);
    // As stock: the backward pass is recorded exactly when it is to create a graph.
    let prev_recording = set_recording(args.create_graph);
    let result = crate::engine::global().and_then(|e| {
        let _bulk = e.bulk_scope(bulk);
        run_backward(&args, &heads, &order)
    });
    set_recording(prev_recording);
    set_training(prev_train);
    let grads = result?;
    if !args.retain_graph {
        for n in &order {
            if n.call().is_some() {
                let mut s = n.saved.lock();
                *s = Saved { released: true, ..Saved::default() };
            }
        }
    }
    Ok(grads)
}

fn run_backward(args: &BackwardArgs, heads: &[Entry], order: &[Arc<Node>]) -> Result<Vec<NDArray>> {
    let ctx = args.heads.first().and_then(|h| h.ctx()).unwrap_or(crate::context::Context::CPU);
    let mut grads: HashMap<Key, Vec<NDArray>> = HashMap::new();
    // Heads given a gradient of another shape: (head, given shape, head's shape).
    let mut misshapen: HashMap<Key, (usize, Vec<usize>, Vec<usize>)> = HashMap::new();
    for (i, (h, e)) in args.heads.iter().zip(heads).enumerate() {
        let g = match args.head_grads.get(i).and_then(|g| g.clone()) {
            // See BackwardArgs::larger_head_grads.
            Some(g) if args.larger_head_grads && g.shape != h.shape && g.dtype == h.dtype && g.size() > h.size() => {
                g.prefix_view(&h.shape)?
            }
            // A head gradient of another shape is refused only where a backward operation
            // would read it (below): stock ignores head gradients the gradient does not use
            // (`shape_array`, `argsort`: zero gradients).
            Some(g) if g.shape != h.shape => {
                misshapen.insert(key(e), (i, g.shape.clone(), h.shape.clone()));
                g
            }
            // Another dtype is converted, as stock's executor copies head gradients into
            // arrays of the outputs' dtypes.
            Some(g) if g.dtype != h.dtype => {
                let dtype = h.dtype.name();
                self::invoke(op::lookup("Cast")?, &[&g], None, [("dtype", dtype)]).map(|mut v| v.remove(0))?
            }
            Some(g) => g,
            None => ones_like(&Meta::new(h.shape.clone(), h.dtype), h.ctx().unwrap_or(ctx))?,
        };
        grads.entry(key(e)).or_default().push(plain(&g));
    }
    // Gradients asked for explicitly (autograd.grad) are returned, not written. As stock's,
    // each must be reachable from the heads (through any recorded call, differentiable or
    // not).
    let reached: std::collections::HashSet<*const Node> =
        if args.variables.is_empty() { Default::default() } else { order.iter().map(Arc::as_ptr).collect() };
    let wanted: Vec<Key> = args
        .variables
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let k = entry_of(v).as_ref().map(key).ok_or_else(|| {
                Error::value(
                    "a variable of autograd.grad is not in the graph (call attach_grad or record its computation)",
                )
            })?;
            if !reached.contains(&k.0) {
                return Err(Error::mxnet(format!(
                    "Cannot differentiate with respect to the {}-th variable because it is unreachable from the \
                     outputs.",
                    i + 1
                )));
            }
            Ok(k)
        })
        .collect::<Result<_>>()?;
    // Consumers per entry, to write a lone contribution straight into a variable's gradient.
    let mut consumers: HashMap<Key, usize> = HashMap::new();
    for n in order {
        if let Some(c) = n.call() {
            for e in c.inputs.iter().flatten() {
                *consumers.entry(key(e)).or_default() += 1;
            }
        }
    }
    for h in heads {
        *consumers.entry(key(h)).or_default() += 1;
    }
    let direct = |e: &Entry| -> Option<NDArray> {
        match &e.node.kind {
            Kind::Variable { grad: Some(g), req: GradReq::Write, .. }
                if args.variables.is_empty() && !args.create_graph && consumers.get(&key(e)) == Some(&1) =>
            {
                Some(g.clone())
            }
            _ => None,
        }
    };
    let mut written_direct: HashMap<Key, ()> = HashMap::new();
    let mut memo = Memo::new();

    for n in order.iter().rev() {
        let Some(call) = n.call() else { continue };
        let nk = Arc::as_ptr(n);
        let mut ograds: Vec<Option<NDArray>> = Vec::with_capacity(call.out_meta.len());
        let mut any = false;
        for i in 0..call.out_meta.len() {
            let g = match grads.remove(&(nk, i)) {
                None => None,
                Some(parts) => {
                    any = true;
                    Some(sum_into(&parts, None)?)
                }
            };
            ograds.push(g);
        }
        if !any || call.op.grad.is_zero() && call.custom.is_none() {
            continue;
        }
        if let Some((i, given, want)) = (0..call.out_meta.len()).find_map(|i| misshapen.get(&(nk, i))) {
            return Err(Error::value(format!("head gradient {i} has shape {given:?}, the head has {want:?}")));
        }
        if call.op.grad.is_none() && call.custom.is_none() {
            return Err(Error::mxnet(format!(
                "Operator {} is non-differentiable because it didn't register FGradient attribute.",
                call.op.name
            )));
        }
        let ograds: Vec<NDArray> = ograds
            .into_iter()
            .zip(&call.out_meta)
            .map(|(g, m)| match g {
                Some(g) => Ok(g),
                None => zeros(m, ctx),
            })
            .collect::<Result<_>>()?;
        let want: Vec<bool> = call.inputs.iter().map(|e| e.is_some()).collect();
        // A custom backward allocates its own gradients; operators may write a variable's.
        let into: Vec<Option<NDArray>> = if call.custom.is_some() || matches!(call.op.grad, Grad::Composed { .. }) {
            vec![None; call.inputs.len()]
        } else {
            call.inputs.iter().map(|e| e.as_ref().and_then(direct)).collect()
        };
        let mut saved = n.saved.lock();
        if let Some(sources) = saved.mirror.clone() {
            // Mirrored: recompute what the gradient reads (the lock is not held meanwhile, so
            // the recomputation may read other nodes' sources).
            drop(saved);
            if !memo.contains_key(&Arc::as_ptr(n)) {
                // A new recomputation: first let the backward work already pushed finish (it
                // produced `ograds`), so that what it held is released before the recomputed
                // values are allocated; otherwise pushing outruns execution and every
                // recomputed value is alive at once, which is what mirroring is to avoid.
                for g in &ograds {
                    // Only pacing: a failed producer reports to whoever reads the gradient.
                    let _ = g.wait(false);
                }
            }
            let inputs = mirrored_inputs(&sources, &mut memo)?;
            let outputs = mirrored_outputs(n, &mut memo)?;
            memo.remove(&Arc::as_ptr(n));
            saved = n.saved.lock();
            saved.inputs = inputs;
            saved.outputs = outputs;
        }
        let in_grads = if let Some(custom) = &call.custom {
            // No lock is held across frontend code (`runtime::outside_call`).
            drop(saved);
            custom.backward(&ograds, &want)?
        } else {
            let mut inputs: Vec<NDArray> = if saved.inputs.is_empty() {
                call.in_meta.iter().map(NDArray::none_like_meta).collect()
            } else {
                saved.inputs.clone()
            };
            let mut outputs = saved.outputs.clone();
            drop(saved);
            if args.create_graph {
                // What the gradient reads is part of the graph being differentiated: the
                // recorded backward calls link to the forward entries, as stock's do.
                for (x, e) in inputs.iter_mut().zip(&call.inputs) {
                    if let Some(e) = e {
                        *x = x.with_link(e.link());
                    }
                }
                for (i, y) in outputs.iter_mut().enumerate().take(call.out_meta.len()) {
                    *y = y.with_link(Entry { node: n.clone(), index: i }.link());
                }
            }
            node_gradients(call, &ograds, &inputs, &outputs, &want, &into, args.create_graph)?
        };
        if !args.retain_graph {
            // The backward operation holds what it reads; the graph need not.
            *n.saved.lock() = Saved { released: true, ..Saved::default() };
        }
        for ((e, g), d) in call.inputs.iter().zip(in_grads).zip(&into) {
            let (Some(e), Some(g)) = (e, g) else { continue };
            if d.is_some() {
                written_direct.insert(key(e), ());
            } else {
                grads.entry(key(e)).or_default().push(g);
            }
        }
    }

    // Variables: write or accumulate.
    if !args.variables.is_empty() {
        return wanted
            .iter()
            .zip(args.variables)
            .map(|(k, v)| match grads.remove(k) {
                Some(parts) => sum_into(&parts, None),
                None => zeros(&Meta::new(v.shape.clone(), v.dtype), v.ctx().unwrap_or(ctx)),
            })
            .collect();
    }
    for n in order {
        let Kind::Variable { grad: Some(g), req, data } = &n.kind else { continue };
        let k = (Arc::as_ptr(n), 0);
        let parts = grads.remove(&k);
        match (req, parts) {
            (GradReq::Null, _) => continue,
            (GradReq::Write, Some(parts)) => {
                sum_into(&parts, Some(g))?;
            }
            (GradReq::Write, None) => {
                if !written_direct.contains_key(&k) {
                    filled(&Meta::new(g.shape.clone(), g.dtype), g.ctx().unwrap_or(ctx), 0.0, Some(g))?;
                }
            }
            (GradReq::Add, Some(mut parts)) => {
                parts.insert(0, g.clone());
                sum_into(&parts, Some(g))?;
            }
            (GradReq::Add, None) => {}
        }
        if let Some(d) = data {
            d.fresh_grad.store(true, Ordering::Release);
        }
    }
    Ok(Vec::new())
}

fn shape_str(shape: &[usize]) -> String {
    format!("({})", shape.iter().map(|d| format!("{d},")).collect::<String>())
}

/// A node of a recorded history ([`history`]).
pub enum HistoryNode {
    /// A marked variable (`marked`), or an input that was in no graph when it was recorded.
    Variable { marked: bool },
    /// A recorded call; its inputs as (node index, output index), earlier nodes.
    Call { op: &'static OpDef, attrs: Attrs, inputs: Vec<(usize, usize)> },
}

/// The recorded history of an array, flat and in topological order (inputs first), with the
/// array's entry as `head`: what `autograd.get_symbol` turns into a symbol.
pub struct History {
    pub nodes: Vec<HistoryNode>,
    pub head: (usize, usize),
}

/// The recorded history of `x` (`autograd.get_symbol`, `MXAutogradGetSymbol`).
pub fn history(x: &NDArray) -> Result<History> {
    let head = entry_of(x).ok_or_else(|| {
        Error::mxnet("NDArray is not part of a computation graph. Did you forget to turn on recording?")
    })?;
    let mut index: HashMap<*const Node, usize> = HashMap::new();
    let mut nodes: Vec<HistoryNode> = Vec::new();
    // Post-order depth-first walk with an explicit stack (recorded graphs can be deep).
    let mut stack: Vec<(Arc<Node>, usize)> = vec![(head.node.clone(), 0)];
    while let Some((n, from)) = stack.pop() {
        if index.contains_key(&Arc::as_ptr(&n)) {
            continue;
        }
        let Some(call) = n.call() else {
            index.insert(Arc::as_ptr(&n), nodes.len());
            nodes.push(HistoryNode::Variable { marked: true });
            continue;
        };
        let input = |k: usize| call.inputs.get(k).and_then(|e| e.as_ref());
        let slots = call.in_meta.len();
        if let Some(k) = (from..slots).find(|&k| input(k).is_some_and(|e| !index.contains_key(&Arc::as_ptr(&e.node)))) {
            let child = input(k).expect("found above").node.clone();
            stack.push((n, k + 1));
            stack.push((child, 0));
            continue;
        }
        let mut inputs = Vec::with_capacity(slots);
        for k in 0..slots {
            match input(k) {
                Some(e) => inputs.push((index[&Arc::as_ptr(&e.node)], e.index)),
                None => {
                    inputs.push((nodes.len(), 0));
                    nodes.push(HistoryNode::Variable { marked: false });
                }
            }
        }
        index.insert(Arc::as_ptr(&n), nodes.len());
        nodes.push(HistoryNode::Call { op: call.op, attrs: call.attrs.clone(), inputs });
    }
    Ok(History { head: (index[&Arc::as_ptr(&head.node)], head.index), nodes })
}

/// `src.slice(begin, end)`, recorded as `slice` while recording.
pub fn slice_view(src: &NDArray, begin: usize, end: usize) -> Result<NDArray> {
    let v = src.slice(begin, end)?;
    if !is_recording() {
        return Ok(v);
    }
    let mut b = vec!["None".to_string(); src.shape.len()];
    let mut e = b.clone();
    b[0] = begin.to_string();
    e[0] = end.to_string();
    let (b, e) = (format!("({})", b.join(",")), format!("({})", e.join(",")));
    record_view("slice", &[("begin", &b), ("end", &e)], src, v)
}

/// `src.reshape(spec, reverse)`, recorded as `Reshape` while recording. Outside
/// numpy-shape mode and recording, a shape of fewer elements views the leading ones, as
/// stock's `MXNDArrayReshape64` does (its frontend then raises `ValueError` for the size).
pub fn reshape_view(src: &NDArray, spec: &[i64], reverse: bool) -> Result<NDArray> {
    if !is_recording() && crate::ndarray::np_shape::get() == 0 {
        let shape = crate::ndarray::reshape_dims(&src.shape, spec, reverse)?;
        if shape.iter().product::<usize>() < src.size() {
            return src.prefix_view(&shape);
        }
    }
    let v = src.reshape(spec, reverse)?;
    if !is_recording() {
        return Ok(v);
    }
    let s = shape_str(&v.shape);
    record_view("Reshape", &[("shape", &s)], src, v)
}

/// `src.at(idx)`, recorded as `slice` then `Reshape` while recording.
pub fn at_view(src: &NDArray, idx: usize) -> Result<NDArray> {
    let v = src.at(idx)?;
    if !is_recording() {
        return Ok(v);
    }
    let row = slice_view(src, idx, idx + 1)?;
    let s = shape_str(&v.shape);
    let view = v.detached();
    record_view("Reshape", &[("shape", &s)], &row, view)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ndarray::testing::{array_f32, values};

    /// `autograd.grad(sin(x), x, create_graph=True)` three times: cos, -sin, -cos (each times
    /// the head gradients), through `_backward_sin`'s composed gradient and the calls it
    /// records; a variable the heads do not reach is refused.
    #[test]
    fn create_graph_differentiates_again() {
        let xs = [0.3f32, -1.2, 2.0];
        let var = || mark_variable(&array_f32(&[3], &xs), GradReq::Write, Some(array_f32(&[3], &[0.0; 3]))).unwrap();
        let x = var();
        let was = set_recording(true);
        let mut y = invoke(op::lookup("sin").unwrap(), &[&x], None, std::iter::empty()).unwrap().remove(0);
        let mut orders = Vec::new();
        for _ in 0..3 {
            let head = [Some(array_f32(&[3], &[2.0; 3]))];
            let args = BackwardArgs {
                heads: &[y],
                head_grads: &head,
                variables: std::slice::from_ref(&x),
                retain_graph: true,
                create_graph: true,
                is_train: true,
                larger_head_grads: false,
            };
            y = backward(args).unwrap().remove(0);
            orders.push(values(&y));
        }
        let other = var();
        let refused = backward(BackwardArgs {
            heads: std::slice::from_ref(&y),
            head_grads: &[None],
            variables: &[other],
            retain_graph: true,
            create_graph: false,
            is_train: true,
            larger_head_grads: false,
        });
        set_recording(was);
        let want: [fn(f32) -> f32; 3] = [|x| 2.0 * x.cos(), |x| -4.0 * x.sin(), |x| -8.0 * x.cos()];
        for (order, (got, f)) in orders.iter().zip(want).enumerate() {
            for (g, &x) in got.iter().zip(&xs) {
                assert!((g - f(x)).abs() < 1e-5, "order {}: {g} vs {}", order + 1, f(x));
            }
        }
        let err = refused.unwrap_err().to_string();
        assert!(err.contains("unreachable from the outputs"), "{err}");
    }

    /// After a backward pass frees its graph, its outputs enter a new recording as constants
    /// (stock's upstream `test_cached`): `z = y·w` with `y = w·w` from the freed graph has
    /// the gradient `y` for `w`, and differentiating `y` itself again is refused.
    #[test]
    fn a_freed_graphs_outputs_are_constants_in_a_new_recording() {
        let w = mark_variable(&array_f32(&[2], &[1.0, 3.0]), GradReq::Write, Some(array_f32(&[2], &[0.0; 2]))).unwrap();
        let mul = |a: &NDArray, b: &NDArray| {
            invoke(op::lookup("elemwise_mul").unwrap(), &[a, b], None, std::iter::empty()).unwrap().remove(0)
        };
        let grad = |head: &NDArray, retain_graph: bool| {
            backward(BackwardArgs {
                heads: std::slice::from_ref(head),
                head_grads: &[None],
                variables: std::slice::from_ref(&w),
                retain_graph,
                create_graph: false,
                is_train: true,
                larger_head_grads: false,
            })
            .map(|mut g| values(&g.remove(0)))
        };
        let was = set_recording(true);
        let y = mul(&w, &w);
        assert_eq!(grad(&y, false).unwrap(), vec![2.0, 6.0]);
        let z = mul(&y, &w);
        let got = grad(&z, true);
        let again = grad(&y, true);
        set_recording(was);
        assert_eq!(got.unwrap(), vec![1.0, 9.0]);
        assert!(again.unwrap_err().to_string().contains("not in a computational graph"));
    }

    /// The last array of a recorded chain of 100k calls is freed without overflowing the
    /// stack (the graph goes with it).
    #[test]
    fn a_deep_recorded_chain_is_freed_with_a_loop() {
        let x = mark_variable(&array_f32(&[1], &[1.0]), GradReq::Write, Some(array_f32(&[1], &[0.0]))).unwrap();
        let op = op::lookup("_plus_scalar").unwrap();
        let was = set_recording(true);
        let mut y = x.clone();
        for _ in 0..100_000 {
            y = invoke(op, &[&y], None, [("scalar", "1")]).unwrap().remove(0);
        }
        set_recording(was);
        drop(x);
        assert!(node_of(&y).is_some());
        // On a thread with a small stack, so that a recursive drop would fail here.
        std::thread::Builder::new().stack_size(256 << 10).spawn(move || drop(y)).unwrap().join().unwrap();
    }
}
