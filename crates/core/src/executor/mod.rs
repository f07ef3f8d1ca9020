//! Graph execution: the CachedOp of hybridized Gluon blocks and the symbolic Executor.
//!
//! Owns [`Runner`], which executes a symbol's graph (`symbol::Graph`) node by node through
//! imperative invocation with parameters parsed once, releasing each intermediate result
//! after its last use, so autograd records a graph call exactly as it records the same
//! operators called one by one (the backward of a hybridized block is the backward of its
//! operators, `_backward_*` names and all; a run bulks its operators into engine tasks as
//! `MXNET_EXEC_BULK_EXEC_*` say); [`cached_op::CachedOp`] (flags, inputs in
//! `list_inputs` order, outputs), and [`bind::Executor`] (bound arrays, forward with
//! recording in training mode, backward into the bound gradient arrays).

pub mod bind;
pub mod cached_op;
mod control_flow;
mod fuse;
pub mod predict;
mod slots;

use crate::config;
use crate::engine::{self, ExecBulk};
use crate::error::{Error, Result};
use crate::ndarray::NDArray;
use crate::symbol::{Graph, Symbol};
use slots::Slots;
use std::sync::Arc;

/// Stock's executor monitor (`MXExecutorSetMonitorCallbackEX`, and a CachedOp's operator hook
/// `MXCachedOpRegisterOpHook`): called after each operator
/// of a forward run with each output (`<node>_output`), and with `all` first with each input
/// (`<node>_<input>`, and, with `variables`, a variable input under its own name as well).
#[derive(Clone)]
pub struct Monitor {
    pub all: bool,
    /// With `all`, a variable input is also reported under its own name (the executor's rule;
    /// a CachedOp's hook reports it only as the operator's input).
    pub variables: bool,
    pub callback: std::sync::Arc<MonitorFn>,
}

/// What a [`Monitor`] calls: an array's name, the operator's name (the one whose output or
/// input it is) and the array.
pub type MonitorFn = dyn Fn(&str, &str, &NDArray) + Send + Sync;

/// A graph ready to run.
pub struct Runner {
    pub graph: Graph,
    /// Variable nodes in `list_inputs` order.
    pub inputs: Vec<usize>,
    /// For each node, the index of the last node that reads one of its outputs (or usize::MAX
    /// for nodes whose outputs are heads).
    last_use: Vec<usize>,
    /// For each node, the input it may overwrite with its output (index into its inputs):
    /// the operator declares the pair, the input is an intermediate result read by no later
    /// node and by no head; with the nodes that read it (this one included), which decide
    /// whether a recorded run may (none of them keeps it for a gradient).
    inplace: Vec<Option<(usize, Vec<usize>)>>,
    /// Creation nodes whose `shape` is empty or has a 0 dimension, "unknown" in the legacy shape semantics
    /// (a hybridized RNN's begin state, `F.zeros((L, 0, H))`), and source nodes sized by the
    /// graph (`_arange` with `infer_range`): each run gives them the shape graph inference
    /// finds from the inputs (stock runs them with the inferred shape).
    open_shapes: Vec<usize>,
    /// The parameters those nodes ran with for the last input shapes seen.
    resolved: std::sync::Mutex<Option<(Vec<Vec<usize>>, Resolved)>>,
    /// Per node, the state slot of an operator that keeps one per node
    /// ([`crate::op::OpDef::node_state`]), once [`Runner::keep_node_states`] is called.
    states: Vec<Option<Arc<crate::op::invoke::StateSlot>>>,
    /// Per node, a control-flow node's graphs ready to run.
    flows: Vec<Option<control_flow::Flow>>,
    /// Per node, which of its outputs are heads.
    head_outputs: Vec<Vec<usize>>,
    /// Per convolution or BatchNorm node, the chain an inference run computes with it
    /// ([`fuse`]).
    chains: Vec<Option<fuse::Chain>>,
    /// The memory slots of inference runs, kept between runs (stock's `static_alloc`); a
    /// run takes them and gives them back, so two runs at once never share one.
    slots: std::sync::Mutex<Option<Slots>>,
}

/// Nodes and the parameters a run gives them (see [`Runner::open_shapes`]).
type Resolved = Vec<(usize, crate::op::param::Attrs)>;

/// How a run uses memory, from the configuration.
struct MemoryPlan {
    /// `MXNET_EXEC_ENABLE_INPLACE`.
    inplace: bool,
    /// `NNVM_EXEC_MATCH_RANGE` > 0: an intermediate result's memory goes back to the pool
    /// after its last reader, for later nodes to reuse.
    share: bool,
    /// `MXNET_MKLDNN_ENABLED`: runs that record nothing compute fused chains ([`fuse`]).
    fuse: bool,
}

impl MemoryPlan {
    fn from_config() -> Result<MemoryPlan> {
        let reg = config::global();
        const BY: &str = "graph run";
        Ok(MemoryPlan {
            inplace: reg.get_bool("MXNET_EXEC_ENABLE_INPLACE", BY)?.unwrap_or(true),
            share: reg.get_int("NNVM_EXEC_MATCH_RANGE", BY)?.unwrap_or(16) > 0,
            fuse: reg.get_bool("MXNET_MKLDNN_ENABLED", BY)?.unwrap_or(true),
        })
    }
}

/// Whether node `i` creates an array from its `shape` parameter (no inputs) and that shape
/// is empty or has a 0 or negative dimension (see [`Runner::open_shapes`]).
fn has_open_shape(graph: &Graph, i: usize) -> bool {
    let n = &graph.nodes[i];
    let (Some(op), Some(attrs)) = (n.op, &n.attrs) else { return false };
    if op.sized_by_graph.is_some() && n.inputs.is_empty() {
        return op.partial_shapes.is_some_and(|rule| rule(attrs, &[]).is_some());
    }
    if !op.creates_from_shape() {
        return false;
    }
    if op.shape_of(attrs).is_some_and(|s| s.iter().any(|&d| d < 0)) {
        return true;
    }
    (op.infer)(attrs, &[]).is_ok_and(|outs| outs.iter().any(|m| m.shape.is_empty() || m.shape.contains(&0)))
}

/// Which input of node `i` its output may overwrite (see [`Runner::inplace`]).
/// `readers[src]`: the nodes reading an output of node `src` (each once, in order); `heads`:
/// the graph's heads as a set. Both built once, so planning is linear in the graph.
fn inplace_candidate(
    graph: &Graph,
    i: usize,
    last_use: &[usize],
    heads: &std::collections::HashSet<(usize, usize)>,
    readers: &[Vec<usize>],
) -> Option<(usize, Vec<usize>)> {
    let n = &graph.nodes[i];
    let op = n.op?;
    if (op.num_outputs)(n.attrs.as_ref()?) != 1 {
        return None;
    }
    for &(ii, oi) in op.inplace {
        let Some(&entry) = n.inputs.get(ii) else { continue };
        let (src, _) = entry;
        if graph.nodes[src].op.is_none()
            || oi != 0
            || last_use[src] != i
            || heads.contains(&entry)
            || n.inputs.iter().filter(|&&e| e == entry).count() != 1
        {
            continue;
        }
        let readers = readers[src].iter().copied().filter(|&r| graph.nodes[r].inputs.contains(&entry)).collect();
        return Some((ii, readers));
    }
    None
}

/// Whether a recorded run keeps the value `entry` for a gradient: as its producer's output,
/// or as an input of one of its `readers`.
fn kept_for_gradient(graph: &Graph, entry: (usize, usize), readers: &[usize], mirror: bool) -> bool {
    let keeps = |n: usize| match (graph.nodes[n].op, &graph.nodes[n].attrs) {
        // A control-flow node's inputs and outputs are its steps' operators' inputs and
        // outputs, which their gradients may read.
        (Some(op), Some(_)) if op.control_flow.is_some() => (true, true),
        (Some(op), Some(attrs)) => crate::autograd::keeps(op, attrs, mirror),
        _ => (true, true),
    };
    keeps(entry.0).1 || readers.iter().any(|&r| keeps(r).0)
}

impl Runner {
    /// A runner of `sym`'s graph, with common subexpressions eliminated unless
    /// `MXNET_ELIMINATE_COMMON_EXPR` is off (stock's executors and CachedOps do the same).
    pub fn new(sym: &Symbol) -> Result<Runner> {
        let graph = sym.graph();
        match config::global().get_bool("MXNET_ELIMINATE_COMMON_EXPR", "graph building")? {
            Some(false) => Runner::from_graph(graph),
            _ => Runner::from_graph(graph.eliminate_common_exprs()),
        }
    }

    /// A runner of a graph.
    pub fn from_graph(graph: Graph) -> Result<Runner> {
        let inputs = graph.input_nodes();
        let mut last_use = vec![0usize; graph.nodes.len()];
        for (i, n) in graph.nodes.iter().enumerate() {
            if n.op.is_some() && n.attrs.is_none() {
                return Err(Error::value(format!("node {} has no parsed parameters", n.name)));
            }
            for &(src, _) in &n.inputs {
                last_use[src] = last_use[src].max(i);
            }
        }
        for &(h, _) in &graph.heads {
            last_use[h] = usize::MAX;
        }
        let mut readers: Vec<Vec<usize>> = vec![Vec::new(); graph.nodes.len()];
        for (i, n) in graph.nodes.iter().enumerate() {
            for &(src, _) in &n.inputs {
                if readers[src].last() != Some(&i) {
                    readers[src].push(i);
                }
            }
        }
        let heads: std::collections::HashSet<(usize, usize)> = graph.heads.iter().copied().collect();
        let inplace =
            (0..graph.nodes.len()).map(|i| inplace_candidate(&graph, i, &last_use, &heads, &readers)).collect();
        let open_shapes = (0..graph.nodes.len()).filter(|&i| has_open_shape(&graph, i)).collect();
        let flows = graph.nodes.iter().map(control_flow::Flow::of).collect::<Result<_>>()?;
        let mut head_outputs = vec![Vec::new(); graph.nodes.len()];
        for &(h, k) in &graph.heads {
            head_outputs[h].push(k);
        }
        let chains = fuse::chains(&graph, &readers, &heads);
        Ok(Runner {
            graph,
            inputs,
            last_use,
            inplace,
            open_shapes,
            resolved: std::sync::Mutex::new(None),
            states: Vec::new(),
            flows,
            head_outputs,
            chains,
            slots: std::sync::Mutex::new(None),
        })
    }

    /// Give each node whose operator keeps a state per node a slot for it (a bound executor,
    /// as stock's: its nodes' states are made once and reused by every run).
    pub fn keep_node_states(&mut self) {
        self.states = self
            .graph
            .nodes
            .iter()
            .map(|n| n.op.filter(|op| op.node_state).map(|_| Arc::new(crate::op::invoke::StateSlot::new(None))))
            .collect();
    }

    /// The parameters of [`Runner::open_shapes`]' nodes for a run with `inputs`: their
    /// `shape` is the one graph inference finds (legacy shape semantics only; with NumPy
    /// shape semantics a 0 is a size); nodes it does not determine keep their own.
    fn resolve_open_shapes(&self, inputs: &[NDArray]) -> Result<Resolved> {
        if self.open_shapes.is_empty() || crate::ndarray::np_shape::get() != 0 {
            return Ok(Vec::new());
        }
        let key: Vec<Vec<usize>> = inputs.iter().map(|a| a.shape.clone()).collect();
        if let Some((k, v)) = &*self.resolved.lock().unwrap_or_else(|e| e.into_inner()) {
            if *k == key {
                return Ok(v.clone());
            }
        }
        let g = &self.graph;
        let shapes: Vec<_> = key.iter().map(|s| Some(s.iter().map(|&d| d as i64).collect())).collect();
        let dtypes: Vec<_> = inputs.iter().map(|a| Some(a.dtype)).collect();
        // A node the graph does not determine (or a graph inference cannot complete) keeps
        // its literal shape, 0 and all, as before.
        let mut out = Vec::with_capacity(self.open_shapes.len());
        let Ok(inferred) = crate::symbol::infer::infer(g, &shapes, &dtypes, false) else { return Ok(out) };
        for &i in &self.open_shapes {
            let n = &g.nodes[i];
            let op = n.op.expect("an operator node");
            let shape = match &inferred.shapes[inferred.offsets[i]] {
                Some(s) if s.iter().all(|&d| d >= 0) => s,
                _ => continue,
            };
            if let Some(sized) = op.sized_by_graph {
                let dims: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
                let Some(set) = sized(n.attrs.as_ref().expect("an operator node's parameters"), &dims) else {
                    continue;
                };
                let mut kv: Vec<(&str, &str)> = n
                    .raw
                    .iter()
                    .filter(|(k, _)| !set.iter().any(|(s, _)| s == k))
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect();
                kv.extend(set.iter().map(|(k, v)| (*k, v.as_str())));
                out.push((i, op.parse_attrs(kv, 0)?));
                continue;
            }
            let text = format!("({})", shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", "));
            let mut kv: Vec<(&str, &str)> = n
                .raw
                .iter()
                .map(|(k, v)| (k.as_str(), if k == "shape" { text.as_str() } else { v.as_str() }))
                .collect();
            if !n.raw.contains_key("shape") {
                kv.push(("shape", text.as_str()));
            }
            out.push((i, op.parse_attrs(kv, 0)?));
        }
        *self.resolved.lock().unwrap_or_else(|e| e.into_inner()) = Some((key, out.clone()));
        Ok(out)
    }

    /// The input names in `list_inputs` order.
    pub fn input_names(&self) -> Vec<&str> {
        self.inputs.iter().map(|&i| self.graph.nodes[i].name.as_str()).collect()
    }

    /// Operator nodes in the graph.
    pub fn num_ops(&self) -> usize {
        self.graph.nodes.iter().filter(|n| n.op.is_some()).count()
    }

    /// The bulk size of a run from the configuration (`MXNET_EXEC_BULK_EXEC_*`): the whole
    /// graph in inference, segments of `MAX_NODE_TRAIN` operators in training.
    pub fn configured_bulk(&self, training: bool) -> Result<usize> {
        Ok(ExecBulk::from_config(config::global())?.segment_size(training, self.num_ops()))
    }

    /// Run with `inputs` in `list_inputs` order, up to `bulk` operators per engine task;
    /// returns the heads.
    pub fn run(&self, inputs: &[NDArray], bulk: usize) -> Result<Vec<NDArray>> {
        self.run_monitored(inputs, bulk, None)
    }

    /// [`Runner::run`], showing each operator's outputs (and inputs) to `monitor`. A monitored
    /// run pushes one operator per task and writes no result over its input, so every array
    /// the monitor sees keeps its value.
    pub fn run_monitored(&self, inputs: &[NDArray], bulk: usize, monitor: Option<&Monitor>) -> Result<Vec<NDArray>> {
        let bulk = if monitor.is_some() { 1 } else { bulk };
        let _bulk = engine::global()?.bulk_scope(bulk);
        let mut run = self.start(inputs, true)?;
        if monitor.is_none()
            && run.plan.share
            && !run.recording
            && run.plan.fuse
            && self.chains.iter().any(Option::is_some)
        {
            run.skip = vec![false; self.graph.nodes.len()];
        }
        if monitor.is_none() && run.plan.share && !run.recording {
            let kept = self.slots.lock().unwrap_or_else(|e| e.into_inner()).take();
            let mut slots = kept.unwrap_or_default();
            slots.prepare(self, inputs, &run.resolved, &run.plan)?;
            run.slots = Some(slots);
            run.val_slots = vec![Vec::new(); self.graph.nodes.len()];
        }
        for i in 0..self.graph.nodes.len() {
            self.run_node(&mut run, i, monitor)?;
        }
        let heads = self.heads(&run)?;
        if let Some(mut slots) = run.slots.take() {
            // The run's operations may still sit in this thread's bulk (a control-flow body
            // inside the outer run's bulk, a caller's `engine.bulk`): the engine orders uses
            // of a slot by when they reach it, so they go to the engine before another run
            // can take the slots.
            engine::global()?.flush_bulk();
            slots.give_away(&heads);
            *self.slots.lock().unwrap_or_else(|e| e.into_inner()) = Some(slots);
        }
        Ok(heads)
    }

    /// A run with `inputs` (`list_inputs` order) whose nodes the caller runs one by one
    /// ([`Runner::step`]); `share`: intermediate results may be released after their last
    /// reader, and overwritten in place, as the configuration allows (a run whose nodes may
    /// be repeated keeps every result).
    pub fn start(&self, inputs: &[NDArray], share: bool) -> Result<Run> {
        if inputs.len() != self.inputs.len() {
            return Err(Error::value(format!(
                "the graph takes {} inputs ({}), got {}",
                self.inputs.len(),
                self.input_names().join(", "),
                inputs.len()
            )));
        }
        let mut plan = MemoryPlan::from_config()?;
        plan.share &= share;
        let recording = crate::autograd::is_recording();
        let mirror = recording && crate::autograd::mirror_enabled()?;
        let resolved = self.resolve_open_shapes(inputs)?;
        let mut vals: Vec<Vec<NDArray>> = vec![Vec::new(); self.graph.nodes.len()];
        for (&ni, x) in self.inputs.iter().zip(inputs) {
            vals[ni] = vec![x.clone()];
        }
        Ok(Run { vals, resolved, plan, recording, mirror, slots: None, val_slots: Vec::new(), skip: Vec::new() })
    }

    /// Run node `i` of `run` (nothing for a variable), after the nodes it reads.
    pub fn step(&self, run: &mut Run, i: usize, monitor: Option<&Monitor>) -> Result<()> {
        let _bulk = engine::global()?.bulk_scope(1);
        self.run_node(run, i, monitor)
    }

    /// The graph's heads, once every node of `run` has run.
    pub fn heads(&self, run: &Run) -> Result<Vec<NDArray>> {
        self.graph
            .heads
            .iter()
            .map(|&(n, i)| {
                run.vals[n].get(i).cloned().ok_or_else(|| Error::internal(format!("head {n}:{i} was not computed")))
            })
            .collect()
    }

    fn run_node(&self, run: &mut Run, i: usize, monitor: Option<&Monitor>) -> Result<()> {
        let n = &self.graph.nodes[i];
        let (Some(op), Some(attrs)) = (n.op, &n.attrs) else { return Ok(()) };
        if !run.skip.is_empty() {
            if run.skip[i] {
                // Computed with its chain's head.
                if let (Some(slots), true) = (run.slots.as_mut(), self.last_use[i] <= i) {
                    for j in std::mem::take(&mut run.val_slots[i]) {
                        slots.release(j);
                    }
                }
                self.release_inputs(run, i);
                return Ok(());
            }
            if let Some(chain) = &self.chains[i] {
                if self.run_chain(run, i, chain)? {
                    for k in chain.nodes() {
                        run.skip[k] = true;
                    }
                    self.release_inputs(run, i);
                    return Ok(());
                }
            }
        }
        let attrs = run.resolved.iter().find(|(k, _)| *k == i).map_or(attrs, |(_, a)| a);
        let vals = &mut run.vals;
        let outs = {
            let mut ins: Vec<&NDArray> = Vec::with_capacity(n.inputs.len());
            for &(src, idx) in &n.inputs {
                ins.push(vals[src].get(idx).ok_or_else(|| {
                    Error::value(format!(
                        "node {} reads output {idx} of {}, which has none",
                        n.name, self.graph.nodes[src].name
                    ))
                })?);
            }
            // Inputs on several CPU contexts (a host-only `group2ctx` placement) are read
            // on the first one's: the same memory under that label.
            let relabelled: Vec<NDArray>;
            if let Some(c) = ins.first().and_then(|x| x.ctx()) {
                if ins.iter().any(|x| x.ctx().is_some_and(|d| d != c)) {
                    relabelled = ins.iter().map(|x| x.on_host_context(c)).collect::<Result<_>>()?;
                    ins = relabelled.iter().collect();
                }
            }
            if let Some(m) = monitor.filter(|m| m.all) {
                for (k, (&(src, _), x)) in n.inputs.iter().zip(&ins).enumerate() {
                    if m.variables && self.graph.nodes[src].is_variable() {
                        (m.callback)(&self.graph.nodes[src].name, op.name, x);
                    }
                    (m.callback)(&crate::symbol::input_label(op, attrs, &n.name, k), op.name, x);
                }
            }
            let plan = &run.plan;
            let target = match &self.inplace[i] {
                Some((ii, readers))
                    if plan.inplace
                        && monitor.is_none()
                        && plan.share
                        && !(run.recording && kept_for_gradient(&self.graph, n.inputs[*ii], readers, run.mirror)) =>
                {
                    // A head leaves with the caller: written over a slot, it would take the
                    // slot with it and the next run would allocate it again.
                    let in_slot = |x: &NDArray| run.slots.as_ref().is_some_and(|s| s.of(x).is_some());
                    if !self.head_outputs[i].is_empty() && in_slot(ins[*ii]) {
                        None
                    } else {
                        inplace_target(op, attrs, &ins, *ii)
                    }
                }
                _ => None,
            };
            let planned = match (&target, run.slots.as_mut()) {
                (None, Some(slots)) if self.flows[i].is_none() => {
                    plan_outputs(op, attrs, &ins, &self.head_outputs[i], slots, &mut run.val_slots[i])?
                }
                _ => Vec::new(),
            };
            let target: Vec<&NDArray> = target.iter().chain(&planned).collect();
            let call =
                || crate::autograd::invoke_attrs(op, &ins, (!target.is_empty()).then_some(&target[..]), attrs.clone());
            match (self.states.get(i).and_then(|s| s.as_ref()), &self.flows[i]) {
                (_, Some(flow)) => flow.run(&ins),
                (Some(slot), None) => crate::op::invoke::with_state_slot(slot, call),
                (None, None) => call(),
            }
            .map_err(|e| Error::new(e.kind(), format!("{} (node {})", e.message(), n.name)))?
        };
        if let Some(m) = monitor {
            for (k, o) in outs.iter().enumerate() {
                (m.callback)(&crate::symbol::output_name(op, Some(attrs), &n.name, k), op.name, o);
            }
        }
        if let Some(slots) = run.slots.as_mut() {
            if run.val_slots[i].is_empty() {
                // An in-place result is in its input's slot: one more user of it.
                for o in &outs {
                    if let Some(j) = slots.of(o) {
                        slots.arrays[j].1 += 1;
                        run.val_slots[i].push(j);
                    }
                }
            }
            if self.last_use[i] <= i {
                // Read by no later node and not a head: free at once.
                for j in std::mem::take(&mut run.val_slots[i]) {
                    slots.release(j);
                }
            }
        }
        vals[i] = outs;
        self.release_inputs(run, i);
        Ok(())
    }

    /// Release the intermediate results node `i` was the last to read (their slots too).
    fn release_inputs(&self, run: &mut Run, i: usize) {
        if !run.plan.share {
            return;
        }
        for &(src, _) in &self.graph.nodes[i].inputs {
            if self.last_use[src] == i && self.graph.nodes[src].op.is_some() && !run.vals[src].is_empty() {
                run.vals[src] = Vec::new();
                if let Some(slots) = run.slots.as_mut() {
                    for j in std::mem::take(&mut run.val_slots[src]) {
                        slots.release(j);
                    }
                }
            }
        }
    }

    /// The output of node `i` (a convolution or BatchNorm) with its `chain` on inputs of
    /// `metas` (node `i`'s, then each step's others), if the chain can compute it: float32
    /// throughout, and shapes the steps fit (otherwise the unfused run reports what is wrong).
    fn chain_output(&self, i: usize, chain: &fuse::Chain, metas: &[crate::op::Meta]) -> Option<crate::op::Meta> {
        use crate::ndarray::DType;
        let n = &self.graph.nodes[i];
        let (op, attrs) = n.op.zip(n.attrs.as_ref())?;
        if metas.iter().any(|m| m.dtype != DType::F32) {
            return None;
        }
        let out = (op.infer)(attrs, metas.get(..n.inputs.len())?).ok()?.into_iter().next()?;
        let (mut at, channels) = (n.inputs.len(), out.shape.get(1).copied().unwrap_or(0));
        for (_, step, others) in &chain.steps {
            let fits = match step {
                crate::op::FuseStep::Scale { .. } => metas.get(at..at + 4)?.iter().all(|m| m.shape[..] == [channels]),
                crate::op::FuseStep::Add { .. } => metas.get(at)?.shape == out.shape,
                _ => true,
            };
            if !fits || out.dtype != DType::F32 {
                return None;
            }
            at += others.len();
        }
        Some(out)
    }

    /// Push node `i` (a convolution or BatchNorm) with its `chain` as one operation, its
    /// result the chain's last node's; false (nothing pushed) when the call does not qualify:
    /// a BatchNorm step in training mode, data off the CPU or not float32, shapes the steps do not fit (the
    /// unfused run then reports what is wrong).
    fn run_chain(&self, run: &mut Run, i: usize, chain: &fuse::Chain) -> Result<bool> {
        let n = &self.graph.nodes[i];
        let (Some(op), Some(attrs)) = (n.op, &n.attrs) else { return Ok(false) };
        if !chain.applies(crate::op::invoke::is_training()) {
            return Ok(false);
        }
        let mut ins: Vec<&NDArray> = Vec::new();
        for &(src, idx) in n.inputs.iter().chain(chain.steps.iter().flat_map(|(_, _, e)| e)) {
            match run.vals[src].get(idx) {
                Some(a) => ins.push(a),
                None => return Ok(false),
            }
        }
        let ctx = match ins.first().and_then(|x| x.ctx()) {
            Some(c) if c.dev_type == crate::context::DevType::Cpu => c,
            _ => return Ok(false),
        };
        if ins.iter().any(|a| a.ctx() != Some(ctx)) {
            return Ok(false);
        }
        let metas: Vec<crate::op::Meta> = ins.iter().map(|a| crate::op::Meta::new(a.shape.clone(), a.dtype)).collect();
        let Some(out) = self.chain_output(i, chain, &metas) else { return Ok(false) };
        let last = chain.last;
        let array = match run.slots.as_mut() {
            Some(slots) if !self.head_outputs[last].contains(&0) => {
                let (_, bytes) = crate::ndarray::byte_size(&out.shape, out.dtype)?;
                let j = slots.take(bytes, ctx)?;
                run.val_slots[last].push(j);
                slots.arrays[j].0.typed_prefix_view(&out.shape, out.dtype)?
            }
            _ => NDArray::new(out.shape, ctx, out.dtype, false)?,
        };
        let steps: Vec<crate::op::FuseStep> = chain.steps.iter().map(|(_, s, _)| *s).collect();
        let kernel: crate::op::invoke::CallKernel = if chain.norm.is_some() {
            Arc::new(move |cx, ins, outs| crate::op::fused_batch_norm(cx, ins, outs, &steps))
        } else {
            Arc::new(move |cx, ins, outs| crate::op::fused_convolution(cx, ins, outs, &steps))
        };
        let req = crate::op::invoke::ReqList::from_elem(crate::op::Req::Write, 1);
        // A variable of the call's own: calls of one chain from concurrent runs need no order.
        let var = crate::engine::Var::new();
        crate::op::invoke::launch_kernel(op, attrs.clone(), &ins, std::slice::from_ref(&array), req, ctx, kernel, &var)
            .map_err(|e| Error::new(e.kind(), format!("{} (node {})", e.message(), n.name)))?;
        run.vals[last] = vec![array];
        Ok(true)
    }
}

/// A run in progress ([`Runner::start`]): every node's results so far, and what was fixed at
/// its start.
pub struct Run {
    vals: Vec<Vec<NDArray>>,
    resolved: Resolved,
    plan: MemoryPlan,
    recording: bool,
    mirror: bool,
    /// The memory slots of a run that plans its intermediate results ([`Slots`]).
    slots: Option<Slots>,
    /// Per node, the slots its outputs are in.
    val_slots: Vec<Vec<usize>>,
    /// Per node, whether a fused chain computed it (empty: the run fuses nothing).
    skip: Vec<bool>,
}

/// The outputs a planned run gives a node: each visible output in a slot of `slots` (recorded
/// in `val_slots`), a head in an array of its own; none (the call allocates) for an operator
/// whose outputs inference does not fix (its own invocation, an output dtype chosen by the
/// output) or a call off the CPU.
fn plan_outputs(
    op: &'static crate::op::OpDef,
    attrs: &crate::op::param::Attrs,
    ins: &[&NDArray],
    heads: &[usize],
    slots: &mut Slots,
    val_slots: &mut Vec<usize>,
) -> Result<Vec<NDArray>> {
    let ctx = match ins.first().and_then(|x| x.ctx()) {
        Some(c) if c.dev_type == crate::context::DevType::Cpu => c,
        _ => return Ok(Vec::new()),
    };
    let metas: Vec<crate::op::Meta> = ins.iter().map(|a| crate::op::Meta::new(a.shape.clone(), a.dtype)).collect();
    let Some(outs) = planned_metas(op, attrs, &metas) else { return Ok(Vec::new()) };
    let visible = outs.len();
    let mut planned = Vec::with_capacity(visible);
    for (k, m) in outs.into_iter().enumerate() {
        if heads.contains(&k) {
            planned.push(NDArray::new(m.shape, ctx, m.dtype, false)?);
            continue;
        }
        let (_, bytes) = crate::ndarray::byte_size(&m.shape, m.dtype)?;
        let j = slots.take(bytes, ctx)?;
        val_slots.push(j);
        planned.push(slots.arrays[j].0.typed_prefix_view(&m.shape, m.dtype)?);
    }
    Ok(planned)
}

/// The visible outputs of a call of `op` on inputs of `metas` when a run plans them: none for
/// an operator whose outputs inference does not fix (its own invocation, an output dtype
/// chosen by the output, a context of its own).
fn planned_metas(
    op: &'static crate::op::OpDef,
    attrs: &crate::op::param::Attrs,
    metas: &[crate::op::Meta],
) -> Option<Vec<crate::op::Meta>> {
    if op.invoke_with.is_some() || op.any_out_dtype || op.dtype_from_out || op.has_ctx() {
        return None;
    }
    let mut outs = (op.infer)(attrs, metas).ok()?;
    let visible = (op.num_visible_outputs)(attrs);
    if outs.len() < visible {
        return None;
    }
    outs.truncate(visible);
    Some(outs)
}

/// Whether an operator's output `out` can be written over its input `x`: the same dtype and
/// element count (the run's [`inplace_target`] and the dry run's plan both ask).
pub(super) fn inplace_fits(out: &crate::op::Meta, x: &crate::op::Meta) -> bool {
    let size = |m: &crate::op::Meta| m.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    out.dtype == x.dtype && size(out) == size(x)
}

/// The output array of an in-place call: input `ii`'s memory with the output's shape, when the
/// output has the input's dtype and byte size (otherwise the call gets a new array).
fn inplace_target(
    op: &'static crate::op::OpDef,
    attrs: &crate::op::param::Attrs,
    ins: &[&NDArray],
    ii: usize,
) -> Option<NDArray> {
    let x = ins.get(ii)?;
    let metas: Vec<crate::op::Meta> = ins.iter().map(|a| crate::op::Meta::new(a.shape.clone(), a.dtype)).collect();
    let out = (op.infer)(attrs, &metas).ok()?.into_iter().next()?;
    if !inplace_fits(&out, &metas[ii]) {
        return None;
    }
    let spec: Vec<i64> = out.shape.iter().map(|&d| d as i64).collect();
    x.reshape(&spec, false).ok().map(|v| v.detached())
}
