//! The symbolic Executor (`MXExecutorBindEX`, `MXExecutorSimpleBindEx`): bound argument,
//! gradient and auxiliary arrays; forward (recorded in training mode) and backward into the
//! bound gradient arrays per their requests.

use super::Runner;
use crate::autograd::{self, BackwardArgs, GradReq};
use crate::error::{Error, Result};
use crate::ndarray::NDArray;
use crate::symbol::Symbol;
use crate::sync::Mutex;

/// A bound executor.
pub struct Executor {
    runner: Runner,
    /// Bound arrays per input node (`list_inputs` order), with their gradient arrays/requests.
    inputs: Vec<NDArray>,
    grads: Vec<(GradReq, Option<NDArray>)>,
    /// The output arrays the frontend holds: allocated at bind (as stock does), and each
    /// forward writes its results into them.
    outputs: Mutex<Vec<NDArray>>,
    /// The last forward's results, linked to its recorded graph (the heads of backward).
    heads: Mutex<Vec<NDArray>>,
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
        let runner = Runner::new(sym)?;
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
        for (k, ((a, g), r)) in args.into_iter().zip(grads).zip(reqs).enumerate() {
            let p = pos(arg_nodes[k]);
            let r = if g.is_none() { GradReq::Null } else { r };
            inputs[p] = a;
            gr[p] = (r, g);
        }
        for (k, a) in aux.into_iter().enumerate() {
            inputs[pos(aux_nodes[k])] = a;
        }
        let outputs = Mutex::new(allocated_outputs(&runner, &inputs));
        Ok(Executor { runner, inputs, grads: gr, outputs, heads: Mutex::new(Vec::new()) })
    }

    /// Run forward; in training mode the run is recorded for [`Executor::backward`].
    pub fn forward(&self, is_train: bool) -> Result<()> {
        let outs =
            if is_train {
                let inputs: Vec<NDArray> =
                    self.inputs
                        .iter()
                        .zip(&self.grads)
                        .map(|(x, (r, g))| {
                            if *r == GradReq::Null {
                                Ok(x.detached())
                            } else {
                                autograd::mark_variable(x, *r, g.clone())
                            }
                        })
                        .collect::<Result<_>>()?;
                let prev_rec = autograd::set_recording(true);
                let prev_train = autograd::set_training(true);
                let r = self.runner.configured_bulk(true).and_then(|b| self.runner.run(&inputs, b));
                autograd::set_recording(prev_rec);
                autograd::set_training(prev_train);
                r?
            } else {
                let prev_rec = autograd::set_recording(false);
                let prev_train = autograd::set_training(false);
                let r = self.runner.configured_bulk(false).and_then(|b| self.runner.run(&self.inputs, b));
                autograd::set_recording(prev_rec);
                autograd::set_training(prev_train);
                r?
            };
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
        *self.heads.lock() = outs;
        Ok(())
    }

    /// Backward from the last training forward, with head gradients (`None`: ones).
    pub fn backward(&self, head_grads: &[Option<NDArray>], is_train: bool) -> Result<()> {
        let heads = self.heads.lock().clone();
        if heads.is_empty() || heads.iter().all(|h| h.ag.is_none()) {
            return Err(Error::mxnet("Executor.backward needs a forward pass with is_train=True first"));
        }
        let mut hg = head_grads.to_vec();
        hg.resize(heads.len(), None);
        autograd::backward(BackwardArgs {
            heads: &heads,
            head_grads: &hg,
            variables: &[],
            retain_graph: false,
            create_graph: false,
            is_train,
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
fn allocated_outputs(runner: &Runner, inputs: &[NDArray]) -> Vec<NDArray> {
    let g = &runner.graph;
    let shapes: Vec<_> = inputs.iter().map(|a| Some(a.shape.iter().map(|&d| d as i64).collect())).collect();
    let dtypes: Vec<_> = inputs.iter().map(|a| Some(a.dtype)).collect();
    let np = crate::ndarray::np_shape::get() != 0;
    let Ok(inferred) = crate::symbol::infer::infer(g, &shapes, &dtypes, np) else { return Vec::new() };
    let ctx = inputs.iter().find_map(|a| a.ctx()).unwrap_or(crate::context::Context::CPU);
    let mut outs = Vec::with_capacity(g.heads.len());
    for &(node, i) in &g.heads {
        let e = inferred.offsets[node] + i;
        let (Some(shape), Some(dtype)) = (&inferred.shapes[e], inferred.dtypes[e]) else { return Vec::new() };
        let Ok(shape) = shape.iter().map(|&d| usize::try_from(d)).collect::<std::result::Result<Vec<_>, _>>() else {
            return Vec::new();
        };
        match NDArray::new(shape, ctx, dtype, true) {
            Ok(a) => outs.push(a),
            Err(_) => return Vec::new(),
        }
    }
    outs
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
        s
    }
}
