//! Custom operators: operators implemented in the frontend (`mx.operator.CustomOp` and
//! `CustomOpProp`).
//!
//! Owns: the `Custom` and `_backward_Custom` operators; what the frontend provides, as traits
//! ([`PropCreator`], [`FrontendProp`], [`FrontendOp`]) that the C layer implements over
//! stock's callback protocol (`MXCustomOpRegister`), and their registry; the property
//! ([`Prop`]) created per call from the call's extra parameters, with its lists, backward
//! dependencies and the checks of what the frontend infers; the operator ([`CustomState`])
//! with its forward and backward; and how those run against the engine.
//!
//! Running a callback: the operation pushed for a call is asynchronous and holds the real
//! arrays' variables (inputs read; outputs, input gradients and auxiliary states written).
//! Its function only queues a job for the custom-operator threads ([`worker`]) and returns, so
//! no engine worker waits for the frontend. The job hands the frontend new arrays over the
//! same memory under *alias* variables (one per distinct chunk, [`Var::alias`]), calls the
//! callback with no lock of ours held (ctypes takes the GIL itself), then pushes a completion
//! operation that writes every alias: it runs once all that the frontend pushed on them has
//! finished, and completes the call's operation with the callback's failure or the first
//! failure those operations left. The frontend never sees a variable the call's operation
//! holds, so its own operations and waits (`out[:] = y`, `x.asnumpy()`) never wait for the
//! operation that waits for them. The threads and engines involved: the caller pushes; an
//! engine worker (or, under NaiveEngine, the caller) queues the job; a custom-operator thread
//! runs the callback and pushes the completion, which an engine worker runs.

pub mod worker;

use super::invoke;
use super::param::op_params;
use super::{Grad, Inputs, Meta, OpDef, Req};
use crate::context::Context;
use crate::engine::{self, Completion, FnProperty, Push, Var};
use crate::error::{Error, Result};
use crate::ndarray::{DType, NDArray};
use crate::sync::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

/// Which callback of the frontend's operator runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    Forward,
    Backward,
}

/// What an array handed to the frontend's forward or backward is (stock's `in_data`,
/// `out_data`, `in_grad`, `out_grad`, `aux`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tag {
    In,
    Out,
    InGrad,
    OutGrad,
    Aux,
}

/// Creates the frontend's property for one call (`CustomOpProp(**kwargs)`): what
/// `mx.operator.register` registers. The C layer implements it over stock's callbacks.
pub trait PropCreator: Send + Sync {
    fn create(&self, op_type: &str, kwargs: &[(String, String)]) -> Result<Box<dyn FrontendProp>>;
}

/// The frontend's `CustomOpProp`. An `Err` names the failed step for the caller's message.
/// Dropping it releases the frontend's object.
pub trait FrontendProp: Send + Sync {
    fn list_arguments(&self) -> Result<Vec<String>>;
    fn list_outputs(&self) -> Result<Vec<String>>;
    fn list_auxiliary_states(&self) -> Result<Vec<String>>;
    /// The ids (of those given: output gradients, inputs, outputs) the backward reads.
    fn declare_backward_dependency(
        &self,
        out_grad: &[usize],
        in_data: &[usize],
        out_data: &[usize],
    ) -> Result<Vec<i64>>;
    /// Every entry's shape (arguments, outputs, auxiliary states) from the known ones.
    fn infer_shape(&self, known: &[Option<&[usize]>]) -> Result<Vec<Vec<usize>>>;
    /// Every entry's dtype from the known ones; `None` when the frontend has no `infer_type`.
    fn infer_type(&self, known: &[Option<DType>]) -> Result<Option<Vec<DType>>>;
    /// The operator for inputs `inputs` (arguments then auxiliary states) on `ctx`.
    fn create_operator(&self, ctx: Context, inputs: &[Meta]) -> Result<Box<dyn FrontendOp>>;
}

/// The frontend's `CustomOp`. Dropping it releases the frontend's object.
pub trait FrontendOp: Send + Sync {
    /// Run `pass` over `arrays` (new views the frontend owns from here; `NDArray::none()` for
    /// an undeclared dependency), tagged by `tags`, writing the written ones per `reqs`.
    /// Called on a custom-operator thread with no lock of ours held.
    fn run(&self, pass: Pass, arrays: Vec<NDArray>, tags: &[Tag], reqs: &[Req], is_train: bool) -> Result<()>;
}

/// The property creators registered so far, by op_type.
fn creators() -> &'static Mutex<HashMap<String, Arc<dyn PropCreator>>> {
    static M: OnceLock<Mutex<HashMap<String, Arc<dyn PropCreator>>>> = OnceLock::new();
    M.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Register `creator` under `op_type` (`mx.operator.register`; re-registering replaces it).
pub fn register_prop(op_type: &str, creator: Arc<dyn PropCreator>) {
    creators().lock().insert(op_type.to_string(), creator);
}

/// Run `f`, a forward or backward callback of the custom operator `op_type`. The single place
/// where the profiler's `Custom Operator` scope belongs (an event `<op_type>::pure_python`
/// around `f`, and operations pushed by this thread meanwhile named `<op_type>::<name>`).
pub fn callback_scope<R>(op_type: &str, f: impl FnOnce() -> R) -> R {
    crate::profiler::custom_scope(op_type, f)
}

/// A custom operator's property: created by the registered creator for one call.
pub struct Prop {
    pub op_type: Arc<str>,
    frontend: Box<dyn FrontendProp>,
    pub args: Vec<String>,
    pub outputs: Vec<String>,
    pub aux: Vec<String>,
    /// What the backward reads, as stock numbers it: output gradients `0..n_out`, inputs
    /// `n_out..n_out + n_args`, then outputs.
    pub bwd_deps: Vec<usize>,
}

impl Prop {
    /// Create the property of `op_type` with `kwargs` (the call's parameters besides
    /// `op_type`) and read its lists and backward dependencies.
    pub fn create(op_type: &str, kwargs: &[(String, String)]) -> Result<Arc<Prop>> {
        // Cloned out: the creator runs with no lock held.
        let creator = creators().lock().get(op_type).cloned().ok_or_else(|| {
            Error::mxnet(format!(
                "custom operator {op_type} is not registered (register it with mx.operator.register(\"{op_type}\"))"
            ))
        })?;
        let frontend = creator.create(op_type, kwargs)?;
        let mut prop = Prop {
            op_type: Arc::from(op_type),
            args: frontend.list_arguments()?,
            outputs: frontend.list_outputs()?,
            aux: frontend.list_auxiliary_states()?,
            frontend,
            bwd_deps: Vec::new(),
        };
        prop.bwd_deps = prop.backward_deps()?;
        Ok(Arc::new(prop))
    }

    fn backward_deps(&self) -> Result<Vec<usize>> {
        let (n_out, n_args) = (self.outputs.len(), self.args.len());
        let ids = |from: usize, n: usize| (from..from + n).collect::<Vec<_>>();
        let raw = self.frontend.declare_backward_dependency(
            &ids(0, n_out),
            &ids(n_out, n_args),
            &ids(n_out + n_args, n_out),
        )?;
        let total = 2 * n_out + n_args;
        raw.into_iter()
            .map(|d| {
                usize::try_from(d).ok().filter(|&d| d < total).ok_or_else(|| {
                    Error::mxnet(format!(
                        "custom operator {}: declare_backward_dependency returned {d}, not one of the ids it was given (0..{total})",
                        self.op_type
                    ))
                })
            })
            .collect()
    }

    /// Output metas from the input metas (arguments then auxiliary states), checking what the
    /// property says the inputs must be against what they are.
    pub fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let (n_args, n_out, n_aux) = (self.args.len(), self.outputs.len(), self.aux.len());
        if inputs.len() != n_args + n_aux {
            return Err(Error::value(format!(
                "custom operator {} takes {} inputs ({} arguments {:?} and {} auxiliary states {:?}), got {}",
                self.op_type,
                n_args + n_aux,
                n_args,
                self.args,
                n_aux,
                self.aux,
                inputs.len()
            )));
        }
        let total = n_args + n_out + n_aux;
        // The frontend's order: arguments, outputs, auxiliary states.
        let at = |i: usize| {
            if i < n_args {
                Some(&inputs[i])
            } else if i >= n_args + n_out {
                Some(&inputs[i - n_out])
            } else {
                None
            }
        };
        let known: Vec<Option<&[usize]>> = (0..total).map(|i| at(i).map(|m| &m.shape[..])).collect();
        let shapes = self.frontend.infer_shape(&known)?;
        let first = at(0).map(|m| m.dtype).unwrap_or(DType::F32);
        let dtypes = match self.frontend.infer_type(&(0..total).map(|i| at(i).map(|m| m.dtype)).collect::<Vec<_>>())? {
            Some(d) => d,
            // Frontends without infer_type: everything has the first input's dtype.
            None => vec![first; total],
        };
        if shapes.len() != total || dtypes.len() != total {
            return Err(Error::mxnet(format!(
                "custom operator {}: infer_shape/infer_type gave {} shapes and {} dtypes for {total} entries",
                self.op_type,
                shapes.len(),
                dtypes.len()
            )));
        }
        let mut out = Vec::with_capacity(n_out);
        for (i, (shape, dtype)) in shapes.into_iter().zip(dtypes).enumerate() {
            match at(i) {
                Some(m) if m.shape != shape || m.dtype != dtype => {
                    return Err(Error::value(format!(
                        "custom operator {}: input {i} has shape {:?} {} but infer_shape/infer_type say {shape:?} {}",
                        self.op_type,
                        m.shape,
                        m.dtype.name(),
                        dtype.name()
                    )))
                }
                Some(_) => {}
                None => out.push(Meta::new(shape, dtype)),
            }
        }
        Ok(out)
    }

    /// Create the operator for inputs `inputs` (arguments then auxiliary states) on `ctx`.
    pub fn create_operator(self: &Arc<Self>, ctx: Context, inputs: &[Meta]) -> Result<Arc<CustomState>> {
        let frontend = self.frontend.create_operator(ctx, inputs)?;
        Ok(Arc::new(CustomState { prop: self.clone(), frontend, ctx }))
    }
}

/// A custom operator created for a call: the frontend's `CustomOp` object, kept for a
/// backward with the same object (autograd keeps it from the forward).
pub struct CustomState {
    /// Declared first so that it is dropped first: the frontend's operator is deleted before
    /// its property (fields drop in declaration order).
    frontend: Box<dyn FrontendOp>,
    pub prop: Arc<Prop>,
    ctx: Context,
}

/// One array of a forward or backward callback: `None` is an empty array (a backward input
/// the property did not declare a dependency on).
struct Entry {
    array: Option<NDArray>,
    tag: Tag,
    write: bool,
}

fn push_unique(list: &mut Vec<Arc<Var>>, v: &Arc<Var>) {
    if !list.iter().any(|x| Arc::ptr_eq(x, v)) {
        list.push(v.clone());
    }
}

/// The context all `arrays` are on (CPU when there are none).
fn common_ctx(op_type: &str, arrays: &[&NDArray]) -> Result<Context> {
    let mut ctx: Option<Context> = None;
    for (i, x) in arrays.iter().enumerate() {
        let c =
            x.ctx().ok_or_else(|| Error::value(format!("custom operator {op_type}: array {i} is an empty NDArray")))?;
        if ctx.is_some_and(|p| p != c) {
            return Err(Error::value(format!("custom operator {op_type}: all arrays must be on one context")));
        }
        ctx = Some(c);
    }
    ctx.unwrap_or(Context::CPU).check_available()
}

/// Check caller-given outputs against what the operator produces, or allocate them.
fn outputs_for(op_type: &str, metas: &[Meta], given: Option<&[&NDArray]>, ctx: Context) -> Result<Vec<NDArray>> {
    let Some(given) = given else {
        return metas.iter().map(|m| NDArray::new(m.shape.clone(), ctx, m.dtype, false)).collect();
    };
    if given.len() != metas.len() {
        return Err(Error::value(format!(
            "custom operator {op_type} has {} outputs, {} given",
            metas.len(),
            given.len()
        )));
    }
    for (i, (o, m)) in given.iter().zip(metas).enumerate() {
        if o.chunk.is_none() || o.shape != m.shape || o.dtype != m.dtype || o.ctx() != Some(ctx) {
            return Err(Error::value(format!(
                "custom operator {op_type}: output {i} must be {:?} {} on {ctx}, got {:?} {}",
                m.shape,
                m.dtype.name(),
                o.shape,
                o.dtype.name()
            )));
        }
    }
    Ok(given.iter().map(|o| (*o).clone()).collect())
}

/// Run a custom operator forward: `inputs` are its arguments then auxiliary states;
/// `outputs` the caller's arrays or `None` to allocate. Returns the outputs and the operator
/// (for a backward with it). Everything up to the push (property, inference, operator
/// creation) runs on the calling thread; the forward callback runs asynchronously.
pub fn forward(
    op_type: &str,
    kwargs: &[(String, String)],
    inputs: &[&NDArray],
    outputs: Option<&[&NDArray]>,
    is_train: bool,
) -> Result<(Vec<NDArray>, Arc<CustomState>)> {
    let prop = Prop::create(op_type, kwargs)?;
    let ctx = common_ctx(op_type, inputs)?;
    let in_meta: Vec<Meta> = inputs.iter().map(|x| Meta::new(x.shape.clone(), x.dtype)).collect();
    let out_meta = prop.infer(&in_meta)?;
    let outs = outputs_for(op_type, &out_meta, outputs, ctx)?;
    let state = prop.create_operator(ctx, &in_meta)?;
    let n_args = prop.args.len();
    let mut entries = Vec::with_capacity(inputs.len() + outs.len());
    entries.extend(inputs[..n_args].iter().map(|x| Entry { array: Some((*x).clone()), tag: Tag::In, write: false }));
    entries.extend(outs.iter().map(|o| Entry { array: Some(o.clone()), tag: Tag::Out, write: true }));
    entries.extend(inputs[n_args..].iter().map(|x| Entry { array: Some((*x).clone()), tag: Tag::Aux, write: true }));
    let reqs = vec![Req::Write; outs.len()];
    push(&state, Pass::Forward, entries, reqs, is_train, crate::intern::intern("Custom"))?;
    Ok((outs, state))
}

/// Run the backward of `state` (the operator of a forward call). `inputs` are laid out as
/// `_backward_Custom` takes them: the tensors the property declared as backward dependencies
/// (in its order), then the auxiliary states. `in_grads` (one per argument) are written with
/// `req`.
pub fn backward(
    state: &Arc<CustomState>,
    inputs: &[&NDArray],
    in_grads: &[&NDArray],
    req: &[Req],
    is_train: bool,
) -> Result<()> {
    let prop = &state.prop;
    let op_type = &*prop.op_type;
    let (n_args, n_out, n_aux, n_dep) = (prop.args.len(), prop.outputs.len(), prop.aux.len(), prop.bwd_deps.len());
    if inputs.len() != n_dep + n_aux {
        return Err(Error::value(format!(
            "_backward_Custom ({op_type}) takes {} inputs ({n_dep} declared dependencies and {n_aux} auxiliary states), got {}",
            n_dep + n_aux,
            inputs.len()
        )));
    }
    if in_grads.len() != n_args || req.len() != n_args {
        return Err(Error::value(format!(
            "_backward_Custom ({op_type}) produces {n_args} input gradients, got {} arrays and {} reqs",
            in_grads.len(),
            req.len()
        )));
    }
    let ctx = common_ctx(op_type, &[inputs, in_grads].concat())?;
    if ctx != state.ctx {
        return Err(Error::value(format!(
            "_backward_Custom ({op_type}): arrays on {ctx}, the operator runs on {}",
            state.ctx
        )));
    }
    // Stock's layout: output gradients, inputs, outputs (undeclared ones empty), then input
    // gradients and auxiliary states.
    let mut entries: Vec<Entry> = (0..2 * n_out + n_args)
        .map(|i| Entry {
            array: None,
            tag: if i < n_out {
                Tag::OutGrad
            } else if i < n_out + n_args {
                Tag::In
            } else {
                Tag::Out
            },
            write: false,
        })
        .collect();
    for (&d, x) in prop.bwd_deps.iter().zip(inputs) {
        entries[d].array = Some((*x).clone());
    }
    entries.extend(in_grads.iter().map(|g| Entry { array: Some((*g).clone()), tag: Tag::InGrad, write: true }));
    entries.extend(inputs[n_dep..].iter().map(|a| Entry { array: Some((*a).clone()), tag: Tag::Aux, write: true }));
    push(state, Pass::Backward, entries, req.to_vec(), is_train, crate::intern::intern("_backward_Custom"))
}

/// Push the asynchronous operation that runs `pass` of `state` on `entries`.
fn push(
    state: &Arc<CustomState>,
    pass: Pass,
    entries: Vec<Entry>,
    reqs: Vec<Req>,
    is_train: bool,
    name: Arc<str>,
) -> Result<()> {
    let (mut reads, mut writes) = (Vec::new(), Vec::new());
    for e in entries.iter().filter(|e| e.write) {
        push_unique(&mut writes, e.array.as_ref().expect("written arrays exist").chunk()?);
    }
    for e in entries.iter().filter(|e| !e.write) {
        if let Some(a) = &e.array {
            let c = a.chunk()?;
            if !writes.iter().any(|w| Arc::ptr_eq(w, c)) {
                push_unique(&mut reads, c);
            }
        }
    }
    // One alias per distinct chunk, so that the frontend's operations on two views of one
    // array (an input that is also an output) are ordered.
    let mut aliases: Vec<(Arc<Var>, Arc<Var>)> = Vec::new();
    let mut views = Vec::with_capacity(entries.len());
    for e in &entries {
        views.push(match &e.array {
            None => None,
            Some(a) => {
                let c = a.chunk()?;
                a.data()?; // allocate a delayed array before the frontend sees it
                let alias = match aliases.iter().find(|(real, _)| Arc::ptr_eq(real, c)) {
                    Some((_, al)) => al.clone(),
                    None => {
                        let al = Var::alias(c);
                        aliases.push((c.clone(), al.clone()));
                        al
                    }
                };
                Some(a.through_alias(&alias)?)
            }
        });
    }
    let job = CallbackJob {
        state: state.clone(),
        pass,
        views,
        tags: entries.iter().map(|e| e.tag).collect(),
        reqs,
        is_train,
        aliases: aliases.into_iter().map(|(_, al)| al).collect(),
    };
    let ctx = state.ctx;
    let mut p = Push::asynchronous(
        move |_, completion| {
            worker::submit(Box::new(move |ready: Result<()>| match ready {
                Ok(()) => job.run(completion),
                Err(e) => completion.complete(Err(e)),
            }))
        },
        reads,
        writes,
    );
    p.ctx = ctx;
    p.name = Some(&name);
    engine::global()?.submit(p)
}

/// A forward or backward callback waiting for a custom-operator thread.
struct CallbackJob {
    state: Arc<CustomState>,
    pass: Pass,
    views: Vec<Option<NDArray>>,
    tags: Vec<Tag>,
    reqs: Vec<Req>,
    is_train: bool,
    aliases: Vec<Arc<Var>>,
}

impl CallbackJob {
    /// On a custom-operator thread: call the frontend, then complete the operation once
    /// everything the frontend pushed on the arrays has finished.
    fn run(self, completion: Completion) {
        let CallbackJob { state, pass, views, tags, reqs, is_train, aliases } = self;
        let op_type = state.prop.op_type.clone();
        let ctx = state.ctx;
        let arrays: Vec<NDArray> = views.into_iter().map(|v| v.unwrap_or_else(NDArray::none)).collect();
        let was_training = invoke::set_training(is_train);
        let ran = callback_scope(&op_type, || state.frontend.run(pass, arrays, &tags, &reqs, is_train));
        invoke::set_training(was_training);
        // Release the operator here, on this thread, before the operation completes (unless a
        // caller keeps it for a backward): its release enters the frontend too.
        drop(state);
        let mut result = ran;
        let watched = aliases.clone();
        let mut p = Push::sync(
            move |_| {
                for v in &watched {
                    if let Some(e) = v.take_failure() {
                        if result.is_ok() {
                            result = Err(Error::new(e.kind(), format!("custom operator {op_type}: {}", e.message())));
                        }
                    }
                }
                completion.complete(result);
                Ok(())
            },
            vec![],
            aliases,
        );
        p.prop = FnProperty::NoSkip;
        p.ctx = ctx;
        let name = crate::intern::intern("CustomOperator");
        p.name = Some(&name);
        // A failed push drops the completion, which then fails the operation.
        if let Ok(e) = engine::global() {
            let _ = e.submit(p);
        }
    }
}

op_params! {
    /// `Custom`'s one declared parameter; the others are the frontend's (`Attrs::extra`).
    struct CustomParams<'a> => CUSTOM_PARAMS {
        op_type: &'a str = required, "Name of the custom operator. This is the name that is passed to `mx.operator.register` to register the operator.";
    }
}

fn no_kernel(op: &'static str) -> super::ComputeFn {
    Box::new(move |_, _, _| Err(Error::internal(format!("{op} runs through its own invocation, not a kernel"))))
}

fn invoke_custom(
    _: &'static OpDef,
    inputs: &[&NDArray],
    outputs: Option<&[&NDArray]>,
    attrs: super::param::Attrs,
) -> Result<super::OwnInvoked> {
    let (outs, state) =
        forward(CustomParams::of(&attrs).op_type, attrs.extra(), inputs, outputs, invoke::is_training())?;
    let rec = Recorded {
        state,
        inputs: inputs.iter().map(|x| x.detached()).collect(),
        outputs: outs.iter().map(|x| x.detached()).collect(),
    };
    Ok((outs, Some(Arc::new(rec))))
}

/// A custom operator call recorded by autograd: its operator and tensors.
struct Recorded {
    state: Arc<CustomState>,
    /// Arguments then auxiliary states.
    inputs: Vec<NDArray>,
    outputs: Vec<NDArray>,
}

impl super::CustomBackward for Recorded {
    fn backward(&self, ograds: &[NDArray], want: &[bool]) -> Result<Vec<Option<NDArray>>> {
        let prop = &self.state.prop;
        let (n_args, n_out) = (prop.args.len(), prop.outputs.len());
        let mut deps: Vec<&NDArray> = Vec::with_capacity(prop.bwd_deps.len() + prop.aux.len());
        for &d in &prop.bwd_deps {
            deps.push(if d < n_out {
                &ograds[d]
            } else if d < n_out + n_args {
                &self.inputs[d - n_out]
            } else {
                &self.outputs[d - n_out - n_args]
            });
        }
        deps.extend(self.inputs[n_args..].iter());
        let mut grads = Vec::with_capacity(n_args);
        let mut req = Vec::with_capacity(n_args);
        for (i, x) in self.inputs[..n_args].iter().enumerate() {
            let w = want.get(i).copied().unwrap_or(false);
            grads.push(if w {
                NDArray::new(x.shape.clone(), self.state.ctx, x.dtype, false)?
            } else {
                NDArray::new(x.shape.clone(), self.state.ctx, x.dtype, true)?
            });
            req.push(if w { Req::Write } else { Req::Null });
        }
        let refs: Vec<&NDArray> = grads.iter().collect();
        backward(&self.state, &deps, &refs, &req, invoke::is_training())?;
        let mut out: Vec<Option<NDArray>> =
            grads.into_iter().zip(req).map(|(g, r)| (r == Req::Write).then_some(g)).collect();
        out.resize(self.inputs.len(), None);
        Ok(out)
    }
}

fn invoke_backward(
    _: &'static OpDef,
    inputs: &[&NDArray],
    outputs: Option<&[&NDArray]>,
    attrs: super::param::Attrs,
) -> Result<super::OwnInvoked> {
    let op_type = CustomParams::of(&attrs).op_type;
    let prop = Prop::create(op_type, attrs.extra())?;
    let (n_args, n_out, n_aux, n_dep) = (prop.args.len(), prop.outputs.len(), prop.aux.len(), prop.bwd_deps.len());
    if inputs.len() != n_dep + n_aux {
        return Err(Error::value(format!(
            "_backward_Custom ({op_type}) takes {} inputs ({n_dep} declared dependencies and {n_aux} auxiliary states), got {}",
            n_dep + n_aux,
            inputs.len()
        )));
    }
    let ctx = common_ctx(op_type, inputs)?;
    // The forward inputs' metas: from the caller's gradient arrays, else from the inputs
    // among the dependencies.
    let arg_meta: Vec<Meta> = match outputs {
        Some(g) if g.len() == n_args => g.iter().map(|x| Meta::new(x.shape.clone(), x.dtype)).collect(),
        Some(g) => {
            return Err(Error::value(format!("_backward_Custom ({op_type}) produces {n_args} input gradients, {} given", g.len())))
        }
        None => (0..n_args)
            .map(|i| {
                let k = prop.bwd_deps.iter().position(|&d| d == n_out + i).ok_or_else(|| {
                    Error::value(format!(
                        "_backward_Custom ({op_type}): input {i} is not a declared backward dependency, so its gradient's shape is unknown; pass the gradient arrays as out="
                    ))
                })?;
                Ok(Meta::new(inputs[k].shape.clone(), inputs[k].dtype))
            })
            .collect::<Result<_>>()?,
    };
    let grads = outputs_for(op_type, &arg_meta, outputs, ctx)?;
    let mut in_meta = arg_meta;
    in_meta.extend(inputs[n_dep..].iter().map(|a| Meta::new(a.shape.clone(), a.dtype)));
    let state = prop.create_operator(ctx, &in_meta)?;
    let refs: Vec<&NDArray> = grads.iter().collect();
    backward(&state, inputs, &refs, &vec![Req::Write; n_args], invoke::is_training())?;
    Ok((grads, None))
}

/// The number of outputs of a `Custom` call (asks the frontend; 0 when it fails, and the call
/// itself then reports why).
fn num_outputs(a: &super::param::Attrs) -> usize {
    Prop::create(CustomParams::of(a).op_type, a.extra()).map_or(0, |p| p.outputs.len())
}

/// Graph inference of a `Custom` call's other inputs (arguments after the first, auxiliary
/// states) from the first's shape, by the property's `infer_shape` (stock passes what it
/// knows, so a property deriving its auxiliary states from the data fills them). Nothing is
/// learned when the data's shape is incomplete or the property needs more.
fn param_shapes(a: &super::param::Attrs, data: &[i64], n_inputs: usize) -> Result<Vec<(usize, Vec<i64>)>> {
    let Ok(data) = data.iter().map(|&d| usize::try_from(d)).collect::<std::result::Result<Vec<usize>, _>>() else {
        return Ok(Vec::new());
    };
    let prop = Prop::create(CustomParams::of(a).op_type, a.extra())?;
    let (n_args, n_out, n_aux) = (prop.args.len(), prop.outputs.len(), prop.aux.len());
    if n_inputs != n_args + n_aux || n_args == 0 {
        return Ok(Vec::new());
    }
    let mut known: Vec<Option<&[usize]>> = vec![None; n_args + n_out + n_aux];
    known[0] = Some(&data);
    let Ok(shapes) = prop.frontend.infer_shape(&known) else { return Ok(Vec::new()) };
    if shapes.len() != known.len() {
        return Ok(Vec::new());
    }
    let as_i64 = |s: &Vec<usize>| s.iter().map(|&d| d as i64).collect::<Vec<i64>>();
    let args = (1..n_args).map(|i| (i, as_i64(&shapes[i])));
    let aux = (0..n_aux).map(|k| (n_args + k, as_i64(&shapes[n_args + n_out + k])));
    Ok(args.chain(aux).collect())
}

/// A `Custom` call's auxiliary states (the inputs after its arguments), which it may write.
fn aux_inputs(a: &super::param::Attrs, n_inputs: usize) -> smallvec::SmallVec<[usize; 4]> {
    match Prop::create(CustomParams::of(a).op_type, a.extra()) {
        Ok(p) => (p.args.len()..n_inputs).collect(),
        Err(_) => smallvec::SmallVec::new(),
    }
}

/// A `Custom` call's input names: its property's arguments, then its auxiliary states.
fn input_names(a: &super::param::Attrs) -> Result<Vec<String>> {
    let prop = Prop::create(CustomParams::of(a).op_type, a.extra())?;
    Ok(prop.args.iter().chain(&prop.aux).cloned().collect())
}

/// The number of outputs of a `_backward_Custom` call: one gradient per argument.
fn num_in_grads(a: &super::param::Attrs) -> usize {
    Prop::create(CustomParams::of(a).op_type, a.extra()).map_or(0, |p| p.args.len())
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    ops.push(
        OpDef::new(
            "Custom",
            Inputs::Variadic("data"),
            Box::new(|a, inputs| Prop::create(CustomParams::of(a).op_type, a.extra())?.infer(inputs)),
            no_kernel("Custom"),
        )
        .alias(&["_npi_Custom"])
        .params(CUSTOM_PARAMS)
        .open_params()
        .input_names_of(input_names)
        .mutates_dynamic(aux_inputs)
        .param_shapes(param_shapes)
        .invoke_with(invoke_custom)
        .outputs(num_outputs, num_outputs)
        .grad(Grad::Stateful { op: "_backward_Custom" })
        .doc("Apply a custom operator implemented in a frontend language (like Python).\n\nCustom operators should override required methods like `forward` and `backward`.\nThe custom operator must be registered before it can be used (mx.operator.register)."),
    );
    ops.push(
        OpDef::new(
            "_backward_Custom",
            Inputs::Variadic("data"),
            Box::new(|a, _| Err(Error::not_supported(format!("shape inference of _backward_Custom ({})", CustomParams::of(a).op_type)))),
            no_kernel("_backward_Custom"),
        )
        .params(CUSTOM_PARAMS)
        .open_params()
        .invoke_with(invoke_backward)
        .outputs(num_in_grads, num_in_grads)
        .doc("The backward of a custom operator: the declared backward dependencies and the auxiliary states in, one gradient per argument out."),
    );
    // Recorded by MXCustomFunctionRecord (autograd.Function); its backward is the frontend's.
    ops.push(
        OpDef::new(
            "_CustomFunction",
            Inputs::Variadic("data"),
            Box::new(|_, _| {
                Err(Error::not_supported("calling _CustomFunction directly (autograd.Function records it)"))
            }),
            no_kernel("_CustomFunction"),
        )
        .not_supported()
        .grad(Grad::Stateful { op: "_backward_CustomFunction" })
        .doc("An autograd.Function call (recorded by MXCustomFunctionRecord)."),
    );
}

#[cfg(test)]
mod tests;
