//! The symbolic Executor (`MXExecutorBindEX`, `MXExecutorSimpleBindEx`,
//! `MXExecutorReshapeEx`): bound argument, gradient and auxiliary arrays; simple binding with
//! the Module API's sharing (parameters from a shared executor, data arrays from a shared
//! buffer); reshaping into a new executor over the same memory; forward (recorded in training
//! mode, optionally monitored) and backward into the bound gradient arrays per their requests.

use super::{Monitor, Run, Runner};
use crate::autograd::{self, BackwardArgs, GradReq};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::ndarray::{DType, NDArray};
use crate::symbol::Symbol;
use crate::sync::Mutex;
use std::collections::{BTreeMap, HashSet};

/// A bound executor.
pub struct Executor {
    runner: Runner,
    /// The bound symbol (a copy: later changes to the caller's symbol do not reach it).
    sym: Symbol,
    /// Argument and auxiliary-state names (`list_arguments`, `list_auxiliary_states` order)
    /// with their positions in `inputs`.
    args: Vec<(String, usize)>,
    aux: Vec<(String, usize)>,
    /// Bound arrays per input node (`list_inputs` order), with their gradient arrays/requests.
    inputs: Vec<NDArray>,
    grads: Vec<(GradReq, Option<NDArray>)>,
    /// The output arrays the frontend holds: allocated at bind (as stock does), and each
    /// forward writes its results into them.
    outputs: Mutex<Vec<NDArray>>,
    /// The last forward's results, linked to its recorded graph (the heads of backward).
    heads: Mutex<Vec<NDArray>>,
    monitor: Mutex<Option<Monitor>>,
    /// A partial forward in progress, with the step that comes next.
    partial: Mutex<Option<(Run, usize)>>,
}

/// What a simple-bound executor shares, as the Module API asks (stock's `shared_arg_names`,
/// `shared_exec` and `shared_buffer`; stock applies the first two only with a buffer, hence
/// one value).
pub struct Sharing<'a> {
    /// The model parameters: taken (with their gradients) from `exec` when given, else new.
    pub arg_names: HashSet<String>,
    /// Also gives every auxiliary state.
    pub exec: Option<&'a Executor>,
    /// Arrays by name that other arguments and their gradients (`grad of <name>`) reuse when
    /// large enough (a view of their first elements); new arrays are added to it.
    pub buffer: &'a mut BTreeMap<String, NDArray>,
}

/// An array's shape and dtype, as simple binding is given them.
pub type ArraySpec = (Vec<usize>, DType);

/// An array filled with zeros.
pub(super) fn zeros(shape: &[usize], ctx: Context, dtype: DType) -> Result<NDArray> {
    let a = NDArray::new(shape.to_vec(), ctx, dtype, false)?;
    crate::autograd::invoke(crate::op::lookup("zeros_like")?, &[&a], Some(&[&a]), std::iter::empty())?;
    Ok(a)
}

/// The array `shared` holds for `name` (`what`: which of the shared executor's arrays) when it
/// has the inferred shape and dtype; stock's messages otherwise.
fn reuse(name: &str, what: &str, shared: Option<&NDArray>, shape: &[usize], dtype: DType) -> Result<NDArray> {
    let a = shared.ok_or_else(|| Error::mxnet(format!("the shared executor has no {what} named {name}")))?;
    if a.shape != shape {
        return Err(Error::mxnet(format!(
            "Inferred shape does not match shared_exec.{what}'s shape. Therefore, the allocated memory for \
             shared_exec.{what} cannot be reused for the argument {name} of the current executor \
             (inferred {shape:?}, shared {:?})",
            a.shape
        )));
    }
    if a.dtype != dtype {
        return Err(Error::mxnet(format!(
            "Inferred dtype does not match shared_exec.{what}'s dtype ({} vs {}) for the argument {name}",
            dtype.name(),
            a.dtype.name()
        )));
    }
    Ok(a.clone())
}

/// Stock's `ReshapeOrCreate`: `name`'s array in `buffer` viewed with `shape` when it holds
/// enough elements, else a new array of zeros, which the buffer then keeps under `name`.
fn reshape_or_create(
    name: &str,
    shape: &[usize],
    dtype: DType,
    ctx: Context,
    buffer: &mut BTreeMap<String, NDArray>,
) -> Result<NDArray> {
    let need: usize = shape.iter().product();
    if let Some(old) = buffer.get(name) {
        if old.size() >= need {
            if old.dtype != dtype {
                return Err(Error::mxnet(format!(
                    "Requested arg array's dtype does not match that of the reusable ndarray: {name} is {} in the \
                     shared buffer, {} here",
                    old.dtype.name(),
                    dtype.name()
                )));
            }
            return old.prefix_view(shape);
        }
    }
    if let Some(old) = buffer.get(name) {
        eprintln!(
            "[mxnet-rt] Bucketing: data {name} has a shape {shape:?}, which is larger than already allocated \
             shape {:?}. Need to re-allocate. Consider putting default bucket key to be the bucket taking the \
             largest input for better memory sharing.",
            old.shape
        );
    }
    let a = zeros(shape, ctx, dtype)?;
    buffer.insert(name.to_string(), a.clone());
    Ok(a)
}

impl Executor {
    /// `args`/`grads`/`reqs` in `list_arguments` order, `aux` in `list_auxiliary_states`
    /// order.
    pub fn bind(
        sym: &Symbol,
        args: Vec<NDArray>,
        grads: Vec<Option<NDArray>>,
        reqs: Vec<GradReq>,
        aux: Vec<NDArray>,
    ) -> Result<Executor> {
        let mut runner = Runner::new(sym)?;
        runner.keep_node_states();
        let (arg_nodes, aux_nodes) = (runner.graph.arg_nodes(), runner.graph.aux_nodes());
        if args.len() != arg_nodes.len() || grads.len() != args.len() || reqs.len() != args.len() {
            return Err(Error::value(format!(
                "bind: the symbol has {} arguments, got {} arrays, {} gradient arrays and {} requests",
                arg_nodes.len(),
                args.len(),
                grads.len(),
                reqs.len()
            )));
        }
        if aux.len() != aux_nodes.len() {
            return Err(Error::value(format!(
                "bind: the symbol has {} auxiliary states, got {} arrays",
                aux_nodes.len(),
                aux.len()
            )));
        }
        let mut inputs = vec![NDArray::none(); runner.inputs.len()];
        let mut gr = vec![(GradReq::Null, None); runner.inputs.len()];
        let pos = |node: usize| runner.inputs.iter().position(|&n| n == node).expect("inputs are variable nodes");
        let named = |nodes: &[usize]| -> Vec<(String, usize)> {
            nodes.iter().map(|&n| (runner.graph.nodes[n].name.clone(), pos(n))).collect()
        };
        let (arg_pos, aux_pos) = (named(&arg_nodes), named(&aux_nodes));
        for ((a, g), (r, (_, p))) in args.into_iter().zip(grads).zip(reqs.into_iter().zip(&arg_pos)) {
            let r = if g.is_none() { GradReq::Null } else { r };
            inputs[*p] = a;
            gr[*p] = (r, g);
        }
        for (a, (_, p)) in aux.into_iter().zip(&aux_pos) {
            inputs[*p] = a;
        }
        let outputs = Mutex::new(allocated_outputs(&runner, &inputs)?);
        Ok(Executor {
            runner,
            sym: sym.deep_copy(),
            args: arg_pos,
            aux: aux_pos,
            inputs,
            grads: gr,
            outputs,
            heads: Mutex::new(Vec::new()),
            monitor: Mutex::new(None),
            partial: Mutex::new(None),
        })
    }

    /// Bind new arrays of the inferred shapes and dtypes (`args`, `reqs` in `list_arguments`
    /// order, `aux` in `list_auxiliary_states` order), zero-filled, or shared as `sharing`
    /// says (stock's `SimpleBind`; without sharing every array is new). An argument (with its
    /// gradient) or auxiliary state whose variable has a `ctx_group` that `group2ctx` maps
    /// lives on that device; the others on `ctx`.
    pub fn simple_bind(
        sym: &Symbol,
        ctx: Context,
        group2ctx: &BTreeMap<String, Context>,
        args: &[ArraySpec],
        aux: &[ArraySpec],
        reqs: Vec<GradReq>,
        mut sharing: Option<Sharing>,
    ) -> Result<Executor> {
        let g = sym.graph();
        // Where each variable lives: its `ctx_group`'s device, else `ctx`.
        let placed = |nodes: Vec<usize>| -> Vec<Context> {
            nodes
                .into_iter()
                .map(|n| g.nodes[n].raw.get("__ctx_group__").and_then(|k| group2ctx.get(k)).copied().unwrap_or(ctx))
                .collect()
        };
        let arg_names: Vec<&str> = g.arg_nodes().into_iter().map(|n| g.nodes[n].name.as_str()).collect();
        let arg_ctx = placed(g.arg_nodes());
        let aux_names: Vec<&str> = g.aux_nodes().into_iter().map(|n| g.nodes[n].name.as_str()).collect();
        if args.len() != arg_names.len() || reqs.len() != args.len() || aux.len() != aux_names.len() {
            return Err(Error::value(format!(
                "simple_bind: the symbol has {} arguments and {} auxiliary states, got {} argument shapes, {} \
                 requests and {} auxiliary shapes",
                arg_names.len(),
                aux_names.len(),
                args.len(),
                reqs.len(),
                aux.len()
            )));
        }
        let (mut bound, mut grads) = (Vec::with_capacity(args.len()), Vec::with_capacity(args.len()));
        for (((&name, (shape, dt)), &req), &ctx) in arg_names.iter().zip(args).zip(&reqs).zip(&arg_ctx) {
            let wants_grad = req != GradReq::Null;
            let (a, g) = match &mut sharing {
                None => (zeros(shape, ctx, *dt)?, wants_grad.then(|| zeros(shape, ctx, *dt)).transpose()?),
                Some(sh) if sh.arg_names.contains(name) => match sh.exec {
                    Some(e) => {
                        let a = reuse(name, "arg_array", e.arg(name), shape, *dt)?;
                        let g = match (wants_grad, e.grad(name)) {
                            (false, _) => None,
                            (true, Some(g)) => Some(reuse(name, "grad_array", Some(g), shape, *dt)?),
                            (true, None) => Some(zeros(shape, ctx, *dt)?),
                        };
                        (a, g)
                    }
                    None => (zeros(shape, ctx, *dt)?, wants_grad.then(|| zeros(shape, ctx, *dt)).transpose()?),
                },
                Some(sh) => {
                    let a = reshape_or_create(name, shape, *dt, ctx, sh.buffer)?;
                    let g = wants_grad
                        .then(|| reshape_or_create(&format!("grad of {name}"), shape, *dt, ctx, sh.buffer))
                        .transpose()?;
                    (a, g)
                }
            };
            bound.push(a);
            grads.push(g);
        }
        let aux_ctx = placed(g.aux_nodes());
        let aux = aux_names
            .iter()
            .zip(aux)
            .zip(&aux_ctx)
            .map(|((&name, (shape, dt)), &ctx)| match sharing.as_ref().and_then(|sh| sh.exec) {
                Some(e) => reuse(name, "aux_array", e.aux_state(name), shape, *dt),
                None => zeros(shape, ctx, *dt),
            })
            .collect::<Result<Vec<_>>>()?;
        Executor::bind(sym, bound, grads, reqs, aux)
    }

    /// A new executor for new input shapes (`provided`, by name) over this one's memory (stock's
    /// `Reshape`): an array keeps its memory, viewed with the new shape, when that holds no more
    /// elements; a larger one is new (zero-filled) and needs `allow_up_sizing`. An array whose
    /// shape was not given and changes is an error unless `partial_shaping`.
    pub fn reshape(
        &self,
        partial_shaping: bool,
        allow_up_sizing: bool,
        provided: &[(String, Vec<i64>)],
    ) -> Result<Executor> {
        let g = &self.runner.graph;
        let given: Vec<Option<Vec<i64>>> = self
            .runner
            .inputs
            .iter()
            .map(|&n| provided.iter().find(|(k, _)| *k == g.nodes[n].name).map(|(_, s)| s.clone()))
            .collect();
        for (k, _) in provided {
            if !self.runner.inputs.iter().any(|&n| g.nodes[n].name == *k) {
                return Err(Error::value(format!("reshape: the symbol has no input named {k}")));
            }
        }
        let inferred = crate::symbol::infer::infer(g, &given, &[], crate::ndarray::np_shape::get() != 0)?;
        let new_shape = |pos: usize, name: &str| -> Result<Vec<usize>> {
            let e = inferred.offsets[self.runner.inputs[pos]];
            inferred.shapes[e]
                .as_ref()
                .and_then(|s| s.iter().map(|&d| usize::try_from(d).ok()).collect::<Option<Vec<_>>>())
                .ok_or_else(|| Error::mxnet(format!("reshape: the new shape of {name} cannot be inferred")))
        };
        let resize = |name: &str, a: &NDArray, shape: &[usize]| -> Result<NDArray> {
            if shape.iter().product::<usize>() > a.size() {
                if !allow_up_sizing {
                    return Err(Error::mxnet(format!(
                        "New shape of arg: {name} is larger than original. First making a big executor and then \
                         down sizing it is more efficient than the reverse. If you really want to up size, set \
                         allow_up_sizing=True to enable allocation of new arrays."
                    )));
                }
                zeros(shape, a.ctx().unwrap_or(Context::CPU), a.dtype)
            } else {
                a.prefix_view(shape)
            }
        };
        let check_kept = |name: &str, given: bool, old: &[usize], new: &[usize]| -> Result<()> {
            if partial_shaping || given || old == new {
                Ok(())
            } else {
                Err(Error::mxnet(format!(
                    "Shape of unspecified arg: {name} changed ({old:?} to {new:?}). This can cause the new executor \
                     to not share parameters with the old one. Please check for error in network. If this is \
                     intended, set partial_shaping=True to suppress this warning."
                )))
            }
        };
        let (mut args, mut grads, mut reqs) = (Vec::new(), Vec::new(), Vec::new());
        for (name, p) in &self.args {
            let shape = new_shape(*p, name)?;
            let a = &self.inputs[*p];
            check_kept(name, given[*p].is_some(), &a.shape, &shape)?;
            args.push(resize(name, a, &shape)?);
            let (r, g) = &self.grads[*p];
            grads.push(g.as_ref().map(|g| resize(name, g, &shape)).transpose()?);
            reqs.push(*r);
        }
        let mut aux = Vec::new();
        for (name, p) in &self.aux {
            let shape = new_shape(*p, name)?;
            let a = &self.inputs[*p];
            check_kept(name, false, &a.shape, &shape)?;
            aux.push(resize(name, a, &shape)?);
        }
        let new = Executor::bind(&self.sym, args, grads, reqs, aux)?;
        // The outputs share memory too (stock's reshaped executor plans its memory in the
        // original's): where an old output holds enough elements, the new one is a view of it.
        {
            let old = self.outputs.lock();
            let mut outs = new.outputs.lock();
            for (o, prev) in outs.iter_mut().zip(old.iter()) {
                if o.dtype == prev.dtype && o.size() <= prev.size() && prev.ctx() == o.ctx() {
                    *o = prev.prefix_view(&o.shape)?;
                }
            }
        }
        Ok(new)
    }

    /// The bound argument arrays (`list_arguments` order).
    pub fn arg_arrays(&self) -> Vec<NDArray> {
        self.args.iter().map(|(_, p)| self.inputs[*p].clone()).collect()
    }
    /// The bound gradient arrays (`list_arguments` order; `None` where the request is null).
    pub fn grad_arrays(&self) -> Vec<Option<NDArray>> {
        self.args.iter().map(|(_, p)| self.grads[*p].1.clone()).collect()
    }
    /// The bound auxiliary states (`list_auxiliary_states` order).
    pub fn aux_arrays(&self) -> Vec<NDArray> {
        self.aux.iter().map(|(_, p)| self.inputs[*p].clone()).collect()
    }
    /// The bound arrays in `list_inputs` order (arguments and auxiliary states together).
    pub fn inputs(&self) -> &[NDArray] {
        &self.inputs
    }
    /// The bound array of argument `name`.
    pub fn arg(&self, name: &str) -> Option<&NDArray> {
        self.args.iter().find(|(n, _)| n == name).map(|(_, p)| &self.inputs[*p])
    }
    fn grad(&self, name: &str) -> Option<&NDArray> {
        self.args.iter().find(|(n, _)| n == name).and_then(|(_, p)| self.grads[*p].1.as_ref())
    }
    fn aux_state(&self, name: &str) -> Option<&NDArray> {
        self.aux.iter().find(|(n, _)| n == name).map(|(_, p)| &self.inputs[*p])
    }
    /// The graph the executor runs, as a symbol (stock's "optimized" symbol: the bound one
    /// with common subexpressions eliminated, [`Runner::new`]).
    pub fn symbol(&self) -> Symbol {
        self.runner.graph.to_symbol()
    }

    /// Show each later forward's operator outputs (and inputs) to `monitor`; `None` stops.
    pub fn set_monitor(&self, monitor: Option<Monitor>) {
        *self.monitor.lock() = monitor;
    }

    /// Run forward; in training mode the run is recorded for [`Executor::backward`].
    pub fn forward(&self, is_train: bool) -> Result<()> {
        // A clone: the callback may call back into this executor's frontend.
        let monitor = self.monitor.lock().clone();
        // Stock's executor can run backward after any forward, training or not, so a run is
        // recorded whenever some argument wants a gradient (in inference mode when not
        // training: Dropout passes through, BatchNorm uses its moving statistics).
        let record = is_train || self.grads.iter().any(|(r, _)| *r != GradReq::Null);
        let inputs: Vec<NDArray> = if record {
            self.inputs
                .iter()
                .zip(&self.grads)
                .map(|(x, (r, g))| match r {
                    GradReq::Null => Ok(x.detached()),
                    _ => autograd::mark_variable(x, *r, g.clone()),
                })
                .collect::<Result<_>>()?
        } else {
            self.inputs.clone()
        };
        let prev_rec = autograd::set_recording(record);
        let prev_train = autograd::set_training(is_train);
        let r =
            self.runner.configured_bulk(is_train).and_then(|b| self.runner.run_monitored(&inputs, b, monitor.as_ref()));
        autograd::set_recording(prev_rec);
        autograd::set_training(prev_train);
        self.store_outputs(r?)
    }

    /// Stock's `PartialForward` (inference): node `step` of the graph (topological order,
    /// variables included: they run nothing). Step 0 starts a run from the bound arrays and
    /// each later step follows the one before; after the last node the outputs hold the run's
    /// results, as after [`Executor::forward`]. Returns the steps left (0 past the end).
    /// Inference only (the Predict API's): nothing is recorded, so no backward can follow.
    pub fn partial_forward(&self, step: usize) -> Result<usize> {
        let n = self.runner.graph.nodes.len();
        if step >= n {
            return Ok(0);
        }
        let prev_rec = autograd::set_recording(false);
        let prev_train = autograd::set_training(false);
        let r = self.partial_step(step, n);
        autograd::set_recording(prev_rec);
        autograd::set_training(prev_train);
        r.map(|()| n - step - 1)
    }

    fn partial_step(&self, step: usize, n: usize) -> Result<()> {
        // Out of the lock while the node runs: a monitor callback may call back in.
        let taken = self.partial.lock().take();
        let (mut run, next) = match taken {
            _ if step == 0 => (self.runner.start(&self.inputs, false)?, 0),
            Some((run, next)) if next == step => (run, next),
            other => {
                let expected = other.map_or(0, |(_, next)| next);
                return Err(Error::value(format!(
                    "partial forward runs its steps in order from 0: step {step} was asked for, step {expected} \
                     comes next"
                )));
            }
        };
        let monitor = self.monitor.lock().clone();
        self.runner.step(&mut run, step, monitor.as_ref())?;
        if step + 1 == n {
            return self.store_outputs(self.runner.heads(&run)?);
        }
        *self.partial.lock() = Some((run, next + 1));
        Ok(())
    }

    /// A forward's results: copied into the output arrays the frontend holds when they have
    /// the same shapes and dtypes, else they become the outputs; they are backward's heads.
    fn store_outputs(&self, outs: Vec<NDArray>) -> Result<()> {
        let mut bound = self.outputs.lock();
        if bound.len() == outs.len() && bound.iter().zip(&outs).all(|(b, o)| b.shape == o.shape && b.dtype == o.dtype) {
            // Into the arrays the frontend already holds (queued, not waited for).
            let copy = crate::op::lookup("_copy")?;
            for (b, o) in bound.iter().zip(&outs) {
                crate::op::invoke::invoke(copy, &[o], Some(&[b]), std::iter::empty())?;
            }
        } else {
            *bound = outs.iter().map(|o| o.detached()).collect();
        }
        drop(bound);
        *self.heads.lock() = outs;
        Ok(())
    }

    /// Backward from the last training forward, with head gradients (`None`: ones).
    pub fn backward(&self, head_grads: &[Option<NDArray>], is_train: bool) -> Result<()> {
        // No argument wants a gradient (`grad_req='null'`): nothing to compute, as in stock.
        if self.grads.iter().all(|(r, _)| *r == GradReq::Null) {
            return Ok(());
        }
        let mut heads = self.heads.lock().clone();
        if heads.is_empty() {
            // Stock runs the backward graph on whatever its arrays hold, even before any
            // forward; a gradient that reads no forward value (`repeat`, `tile`) is then
            // right. Here the forward runs first, so every gradient is.
            self.forward(true)?;
            heads = self.heads.lock().clone();
        }
        if heads.is_empty() || heads.iter().all(|h| h.ag.is_none()) {
            return Err(Error::mxnet("Executor.backward needs a forward pass first (and an argument with a gradient)"));
        }
        let mut hg = head_grads.to_vec();
        hg.resize(heads.len(), None);
        autograd::backward(BackwardArgs {
            heads: &heads,
            head_grads: &hg,
            variables: &[],
            // Stock's executor may run backward again after one forward (its arrays stay).
            retain_graph: true,
            create_graph: false,
            is_train,
            larger_head_grads: false,
        })?;
        Ok(())
    }

    pub fn outputs(&self) -> Vec<NDArray> {
        self.outputs.lock().iter().map(|o| o.detached()).collect()
    }
}

/// The heads as stock's bind allocates them, before any forward (the frontend's Executor reads
/// them at once): shapes and dtypes inferred from the bound arrays, storage allocated at first
/// use. Empty when inference cannot tell every head's shape (forward then makes them).
fn allocated_outputs(runner: &Runner, inputs: &[NDArray]) -> Result<Vec<NDArray>> {
    let g = &runner.graph;
    let shapes: Vec<_> = inputs.iter().map(|a| Some(a.shape.iter().map(|&d| d as i64).collect())).collect();
    let dtypes: Vec<_> = inputs.iter().map(|a| Some(a.dtype)).collect();
    let np = crate::ndarray::np_shape::get() != 0;
    // Bound arrays that contradict the graph fail the bind, as stock's does; outputs that
    // inference leaves open are allocated by the first forward instead.
    let inferred = crate::symbol::infer::infer(g, &shapes, &dtypes, np)?;
    let ctx = inputs.iter().find_map(|a| a.ctx()).unwrap_or(crate::context::Context::CPU);
    let mut outs = Vec::with_capacity(g.heads.len());
    for &(node, i) in &g.heads {
        let e = inferred.offsets[node] + i;
        let (Some(shape), Some(dtype)) = (&inferred.shapes[e], inferred.dtypes[e]) else { return Ok(Vec::new()) };
        let Ok(shape) = shape.iter().map(|&d| usize::try_from(d)).collect::<std::result::Result<Vec<_>, _>>() else {
            return Ok(Vec::new());
        };
        match NDArray::new(shape, ctx, dtype, true) {
            Ok(a) => outs.push(a),
            Err(_) => return Ok(Vec::new()),
        }
    }
    Ok(outs)
}

impl Executor {
    /// One line per node: `op name <- inputs`.
    pub fn describe(&self) -> String {
        let g = &self.runner.graph;
        let mut s = String::from("Symbol Outputs:\n");
        for &(n, i) in &g.heads {
            s.push_str(&format!("\toutput[{i}]={}\n", g.nodes[n].name));
        }
        for n in &g.nodes {
            let ins: Vec<&str> = n.inputs.iter().map(|&(src, _)| g.nodes[src].name.as_str()).collect();
            match n.op {
                None => s.push_str(&format!("Variable:{}\n", n.name)),
                Some(op) => s.push_str(&format!("Op:{}, Name={} <- {}\n", op.name, n.name, ins.join(", "))),
            }
        }
        // Stock's two closing lines, which the Module API parses: here the memory is that of
        // the arrays bound and made at bind (intermediate results come from the storage pool
        // during each run), and no operator holds a temporary-space resource across runs.
        let bytes: usize = self
            .inputs
            .iter()
            .chain(self.grads.iter().filter_map(|(_, g)| g.as_ref()))
            .chain(self.outputs.lock().iter())
            .map(|a| a.size() * a.dtype.size())
            .sum();
        s.push_str(&format!("Total {} MB allocated\nTotal 0 TempSpace resource requested\n", bytes >> 20));
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::lookup;
    use std::sync::Arc;

    /// out = FullyConnected(data, num_hidden=2) → BatchNorm (an auxiliary state).
    fn net() -> Symbol {
        let mut fc = Symbol::atomic(lookup("FullyConnected").unwrap(), [("num_hidden", "2")]).unwrap();
        fc.compose(&[], &[("data", &Symbol::variable("data"))], Some("fc")).unwrap();
        let mut bn = Symbol::atomic(lookup("BatchNorm").unwrap(), []).unwrap();
        bn.compose(&[], &[("data", &fc)], Some("bn")).unwrap();
        bn
    }

    fn specs(batch: usize) -> (Vec<ArraySpec>, Vec<ArraySpec>) {
        let f = DType::F32;
        let args = vec![(vec![batch, 3], f), (vec![2, 3], f), (vec![2], f), (vec![2], f), (vec![2], f)];
        (args, vec![(vec![2], f), (vec![2], f)])
    }

    fn same_memory(a: &NDArray, b: &NDArray) -> bool {
        Arc::ptr_eq(a.chunk().unwrap(), b.chunk().unwrap())
    }

    #[test]
    fn simple_bind_shares_parameters_with_the_executor_and_data_through_the_buffer() {
        let sym = net();
        let params: HashSet<String> = ["fc_weight", "fc_bias", "bn_gamma", "bn_beta"].map(String::from).into();
        let mut buffer = BTreeMap::new();
        let (args, aux) = specs(8);
        let reqs = vec![GradReq::Write; 5];
        let sharing = Sharing { arg_names: params.clone(), exec: None, buffer: &mut buffer };
        let big = Executor::simple_bind(&sym, Context::CPU, &BTreeMap::new(), &args, &aux, reqs.clone(), Some(sharing))
            .unwrap();
        assert_eq!(buffer.keys().collect::<Vec<_>>(), ["data", "grad of data"]);
        let (args, aux) = specs(4);
        let sharing = Sharing { arg_names: params.clone(), exec: Some(&big), buffer: &mut buffer };
        let small =
            Executor::simple_bind(&sym, Context::CPU, &BTreeMap::new(), &args, &aux, reqs.clone(), Some(sharing))
                .unwrap();
        let (b, s) = (big.arg_arrays(), small.arg_arrays());
        assert!((1..5).all(|k| same_memory(&b[k], &s[k])), "parameters are the big executor's");
        assert!(same_memory(&b[0], &s[0]) && s[0].shape == [4, 3], "the data is a view of the buffer's");
        let (bg, sg) = (big.grad_arrays(), small.grad_arrays());
        assert!(same_memory(bg[1].as_ref().unwrap(), sg[1].as_ref().unwrap()));
        assert!(big.aux_arrays().iter().zip(small.aux_arrays()).all(|(a, b)| same_memory(a, &b)));
        // A larger batch replaces the buffer's arrays (and warns); without a buffer, nothing is shared.
        let (args, aux) = specs(16);
        let sharing = Sharing { arg_names: params.clone(), exec: Some(&big), buffer: &mut buffer };
        let larger =
            Executor::simple_bind(&sym, Context::CPU, &BTreeMap::new(), &args, &aux, reqs.clone(), Some(sharing))
                .unwrap();
        assert_eq!(buffer["data"].shape, [16, 3]);
        assert!(same_memory(&buffer["data"], &larger.arg_arrays()[0]));
        let alone =
            Executor::simple_bind(&sym, Context::CPU, &BTreeMap::new(), &args, &aux, reqs.clone(), None).unwrap();
        assert!(!same_memory(&alone.arg_arrays()[1], &b[1]));
        // A parameter whose shape differs from the shared executor's is an error.
        let mut wrong = specs(8).0;
        wrong[1].0 = vec![2, 4];
        wrong[0].0 = vec![8, 4];
        let sharing = Sharing { arg_names: params, exec: Some(&big), buffer: &mut buffer };
        let err = Executor::simple_bind(&sym, Context::CPU, &BTreeMap::new(), &wrong, &aux, reqs, Some(sharing))
            .err()
            .unwrap();
        assert!(err.to_string().contains("Inferred shape does not match shared_exec.arg_array's shape"), "{err}");
    }

    #[test]
    fn reshape_views_smaller_shapes_and_needs_leave_to_grow() {
        let sym = net();
        let (args, aux) = specs(8);
        let e = Executor::simple_bind(&sym, Context::CPU, &BTreeMap::new(), &args, &aux, vec![GradReq::Write; 5], None)
            .unwrap();
        let small = e.reshape(false, false, &[("data".into(), vec![2, 3])]).unwrap();
        assert_eq!(small.arg_arrays()[0].shape, [2, 3]);
        assert!(same_memory(&small.arg_arrays()[0], &e.arg_arrays()[0]));
        assert!(same_memory(&small.arg_arrays()[1], &e.arg_arrays()[1]));
        let up = e.reshape(false, false, &[("data".into(), vec![9, 3])]).err().unwrap();
        assert!(up.to_string().contains("New shape of arg: data is larger than original"), "{up}");
        let grown = e.reshape(false, true, &[("data".into(), vec![9, 3])]).unwrap();
        assert!(!same_memory(&grown.arg_arrays()[0], &e.arg_arrays()[0]));
        // A parameter whose shape changes without being given needs partial_shaping.
        let changed = e.reshape(false, false, &[("data".into(), vec![8, 1])]).err().unwrap();
        assert!(changed.to_string().contains("Shape of unspecified arg: fc_weight changed"), "{changed}");
        let partial = e.reshape(true, false, &[("data".into(), vec![8, 1])]).unwrap();
        assert_eq!(partial.arg_arrays()[1].shape, [2, 1]);
        assert!(e.reshape(false, false, &[("nope".into(), vec![1])]).is_err());
    }

    #[test]
    fn prefix_views_cannot_grow() {
        let a = NDArray::new(vec![4, 3], Context::CPU, DType::F32, false).unwrap();
        assert_eq!(a.prefix_view(&[2, 5]).unwrap().shape, [2, 5]);
        assert!(a.prefix_view(&[13]).is_err());
        assert!(a.prefix_view(&[usize::MAX, 2]).is_err());
    }
}
