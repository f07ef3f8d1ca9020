//! Running control-flow nodes (`_foreach`, `_while_loop`, `_cond`) in a graph run.
//!
//! Owns [`Flow`]: a control-flow node's graphs, each ready to run as a [`Runner`], and the
//! loop that runs them. A step is a run of the graph's own operators, through the same
//! imperative calls as any node, and so are the calls that slice the sequence into steps and
//! stack the steps' outputs ([`crate::op::LoopCalls`]): recording a loop records its steps,
//! and its gradient is theirs, taken by autograd (stock writes a backward operator per loop
//! that replays the steps backwards; the result is the same).

use super::Runner;
use crate::error::{Error, Result};
use crate::ndarray::{DType, NDArray};
use crate::op::{ControlFlow, LoopCalls};
use crate::symbol::GNode;

/// A control-flow node ready to run.
pub(super) struct Flow {
    cf: ControlFlow,
    graphs: Vec<Runner>,
    /// Per graph, which of its outputs are its own inputs (a head that is a variable): a
    /// run copies those, so that no output is a caller's array.
    passed: Vec<Vec<bool>>,
}

/// One call, recorded when the thread records.
fn call(c: crate::op::LoopCall, ins: &[&NDArray]) -> Result<Vec<NDArray>> {
    crate::autograd::invoke_attrs(c.0, ins, None, c.1)
}

fn one(c: crate::op::LoopCall, x: &NDArray) -> Result<NDArray> {
    call(c, &[x])?.pop().ok_or_else(|| Error::internal("a loop call gave no output"))
}

impl Flow {
    /// The node's flow (`None`: not a control-flow node).
    pub(super) fn of(node: &GNode) -> Result<Option<Flow>> {
        let (Some(op), Some(attrs)) = (node.op, &node.attrs) else { return Ok(None) };
        let Some(of) = op.control_flow else { return Ok(None) };
        let graphs: Vec<&crate::symbol::Graph> = node.subgraphs.iter().map(|g| &**g).collect();
        crate::symbol::check_control_flow(op, attrs, &node.name, &graphs, node.inputs.len())?;
        let passed = graphs.iter().map(|g| g.heads.iter().map(|&(n, _)| g.nodes[n].is_variable()).collect()).collect();
        let graphs = node.subgraphs.iter().map(|g| Runner::from_graph((**g).clone())).collect::<Result<_>>()?;
        Ok(Some(Flow { cf: of(attrs)?, graphs, passed }))
    }

    /// Run graph `g` on `ins`.
    fn run_graph(&self, g: usize, ins: Vec<NDArray>) -> Result<Vec<NDArray>> {
        let r = &self.graphs[g];
        let bulk = r.configured_bulk(crate::autograd::is_training())?;
        let mut outs = r.run(&ins, bulk)?;
        for (o, &passed) in outs.iter_mut().zip(&self.passed[g]) {
            if passed {
                *o = one(LoopCalls::copy()?, o)?;
            }
        }
        Ok(outs)
    }

    /// The value of condition graph `g` on `ins`.
    fn holds(&self, g: usize, ins: Vec<NDArray>) -> Result<bool> {
        let out = self.run_graph(g, ins)?;
        crate::op::truth(out.first().ok_or_else(|| Error::internal("a condition graph gave no output"))?)
    }

    /// The stacked outputs of a loop that runs no step: for each of graph `g`'s first `nod`
    /// outputs (for inputs of these shapes and dtypes, from graph inference), zeros of `rows`
    /// rows of it on `ctx`.
    fn no_step_outputs(
        &self,
        g: usize,
        ins: &[(&[usize], DType)],
        nod: usize,
        rows: usize,
        ctx: crate::context::Context,
    ) -> Result<Vec<NDArray>> {
        let graph = &self.graphs[g].graph;
        let shapes: Vec<_> = ins.iter().map(|(s, _)| Some(s.iter().map(|&d| d as i64).collect())).collect();
        let dtypes: Vec<_> = ins.iter().map(|&(_, d)| Some(d)).collect();
        let r = crate::symbol::infer::infer(graph, &shapes, &dtypes, crate::ndarray::np_shape::get() != 0)?;
        graph
            .heads
            .iter()
            .take(nod)
            .map(|&(n, i)| {
                let e = r.offsets[n] + i;
                match (&r.shapes[e], r.dtypes[e]) {
                    (Some(s), Some(d)) if s.iter().all(|&x| x >= 0) => {
                        let shape: Vec<usize> = std::iter::once(rows).chain(s.iter().map(|&x| x as usize)).collect();
                        Ok(call(LoopCalls::zeros(&shape, d, ctx)?, &[])?.remove(0))
                    }
                    _ => Err(Error::mxnet(
                        "a loop that runs no step needs its outputs' shapes, and graph inference cannot find them",
                    )),
                }
            })
            .collect()
    }

    /// Run the node on its inputs; returns its outputs.
    pub(super) fn run(&self, ins: &[&NDArray]) -> Result<Vec<NDArray>> {
        match &self.cf {
            ControlFlow::Foreach { num_outputs, num_out_data, data_locs, state_locs, remain_locs } => {
                self.foreach(ins, *num_outputs, *num_out_data, data_locs, state_locs, remain_locs)
            }
            ControlFlow::WhileLoop { num_out_data, max_iterations, cond_locs, func_locs, var_locs, .. } => {
                self.while_loop(ins, *num_out_data, *max_iterations, cond_locs, func_locs, var_locs)
            }
            ControlFlow::Cond { cond_locs, then_locs, else_locs, .. } => {
                let pick = |locs: &[usize]| locs.iter().map(|&l| ins[l].clone()).collect::<Vec<_>>();
                let branch = if self.holds(0, pick(cond_locs))? { 1 } else { 2 };
                self.run_graph(branch, pick(if branch == 1 { then_locs } else { else_locs }))
            }
        }
    }

    fn foreach(
        &self,
        ins: &[&NDArray],
        num_outputs: usize,
        nod: usize,
        data_locs: &[usize],
        state_locs: &[usize],
        remain_locs: &[usize],
    ) -> Result<Vec<NDArray>> {
        let (nd, ns) = (data_locs.len(), state_locs.len());
        let len =
            *ins[0].shape.first().ok_or_else(|| Error::value("foreach cannot iterate over a scalar (0-d data)"))?;
        for (j, x) in ins[..nd].iter().enumerate() {
            if x.shape.first() != Some(&len) {
                return Err(Error::value(format!(
                    "the data of a foreach must have one length: input 0 has {len} steps, input {j} has shape {:?}",
                    x.shape
                )));
            }
        }
        let mut graph_ins = vec![NDArray::none(); ins.len()];
        for (&l, x) in remain_locs.iter().zip(&ins[nd + ns..]) {
            graph_ins[l] = (*x).clone();
        }
        let mut states: Vec<NDArray> = ins[nd..nd + ns].iter().map(|x| (*x).clone()).collect();
        if len == 0 {
            // No step: the stacked outputs are empty and the states are the initial ones.
            let mut metas: Vec<(&[usize], DType)> = graph_ins.iter().map(|a| (&a.shape[..], a.dtype)).collect();
            for (&l, x) in data_locs.iter().zip(ins) {
                metas[l] = (if x.shape.len() > 1 { &x.shape[1..] } else { &[1] }, x.dtype);
            }
            for (&l, s) in state_locs.iter().zip(&states) {
                metas[l] = (&s.shape[..], s.dtype);
            }
            let ctx = ins[0].ctx().unwrap_or(crate::context::Context::CPU);
            let mut outs = self.no_step_outputs(0, &metas, nod, 0, ctx)?;
            outs.reserve(num_outputs - nod);
            for s in &states {
                outs.push(one(LoopCalls::copy()?, s)?);
            }
            return Ok(outs);
        }
        let steps: Vec<Vec<NDArray>> =
            ins[..nd].iter().map(|x| call(LoopCalls::steps(len, x.shape.len())?, &[x])).collect::<Result<_>>()?;
        let mut stepped: Vec<Vec<NDArray>> = vec![Vec::with_capacity(len); nod];
        for i in 0..len {
            for (&l, s) in data_locs.iter().zip(&steps) {
                graph_ins[l] = s[i].clone();
            }
            for (&l, s) in state_locs.iter().zip(&states) {
                graph_ins[l] = s.clone();
            }
            let mut outs = self.run_graph(0, graph_ins.clone())?;
            if outs.len() != num_outputs {
                return Err(Error::internal(format!("a foreach step gave {} outputs, not {num_outputs}", outs.len())));
            }
            states = outs.split_off(nod);
            for (k, o) in outs.into_iter().enumerate() {
                stepped[k].push(o);
            }
        }
        let mut outs = Vec::with_capacity(num_outputs);
        for k in stepped {
            let refs: Vec<&NDArray> = k.iter().collect();
            outs.push(call(LoopCalls::stack(refs.len())?, &refs)?.remove(0));
        }
        outs.extend(states);
        Ok(outs)
    }

    fn while_loop(
        &self,
        ins: &[&NDArray],
        nod: usize,
        max_iterations: usize,
        cond_locs: &[usize],
        func_locs: &[usize],
        var_locs: &[usize],
    ) -> Result<Vec<NDArray>> {
        // The current value of each input: loop variable k is the input at vars[k].
        let mut cur: Vec<NDArray> = ins.iter().map(|x| (*x).clone()).collect();
        let vars: Vec<usize> = var_locs.iter().map(|&v| func_locs[v]).collect();
        let pick = |cur: &[NDArray], locs: &[usize]| locs.iter().map(|&l| cur[l].clone()).collect::<Vec<_>>();
        let mut stepped: Vec<Vec<NDArray>> = vec![Vec::new(); nod];
        let mut steps = 0;
        while steps < max_iterations && self.holds(0, pick(&cur, cond_locs))? {
            let mut outs = self.run_graph(1, pick(&cur, func_locs))?;
            if outs.len() != nod + vars.len() {
                return Err(Error::internal(format!(
                    "a while_loop step gave {} outputs, not {}",
                    outs.len(),
                    nod + vars.len()
                )));
            }
            for (&p, v) in vars.iter().zip(outs.split_off(nod)) {
                cur[p] = v;
            }
            for (k, o) in outs.into_iter().enumerate() {
                stepped[k].push(o);
            }
            steps += 1;
        }
        let mut result = Vec::with_capacity(nod + vars.len());
        let ctx = ins.first().and_then(|x| x.ctx()).unwrap_or(crate::context::Context::CPU);
        if steps == 0 {
            let metas: Vec<(&[usize], DType)> = func_locs.iter().map(|&l| (&cur[l].shape[..], cur[l].dtype)).collect();
            result = self.no_step_outputs(1, &metas, nod, max_iterations, ctx)?;
        } else {
            // The steps' outputs, then zeros up to max_iterations rows (stock leaves them
            // unwritten).
            for k in stepped {
                let refs: Vec<&NDArray> = k.iter().collect();
                let stacked = call(LoopCalls::stack(refs.len())?, &refs)?.remove(0);
                if steps == max_iterations {
                    result.push(stacked);
                    continue;
                }
                let mut s = stacked.shape.clone();
                s[0] = max_iterations - steps;
                let pad = call(LoopCalls::zeros(&s, stacked.dtype, ctx)?, &[])?.remove(0);
                result.push(call(LoopCalls::concat()?, &[&stacked, &pad])?.remove(0));
            }
        }
        for &p in &vars {
            // A variable no step changed is still the caller's array: the output is a copy.
            result.push(if steps == 0 { one(LoopCalls::copy()?, &cur[p])? } else { cur[p].clone() });
        }
        Ok(result)
    }
}

#[cfg(test)]
mod tests {
    use crate::autograd::GradReq;
    use crate::executor::bind::Executor;
    use crate::ndarray::testing::{array_f32, values};
    use crate::op::lookup;
    use crate::symbol::Symbol;

    /// A symbol marked as part of control-flow graph `mark`.
    fn marked(s: Symbol, mark: &str) -> Symbol {
        s.set_attr("__subgraph_name__", mark).unwrap();
        s
    }

    fn apply(op: &str, kv: &[(&str, &str)], args: &[&Symbol], mark: &str) -> Symbol {
        let mut s = Symbol::atomic(lookup(op).unwrap(), kv.iter().copied()).unwrap();
        s.compose(args, &[], None).unwrap();
        marked(s, mark)
    }

    /// `foreach(data, [init], free w)`: out_t = x_t * w + s_t, s_{t+1} = out_t, with `w` cut
    /// from the outer graph as the frontend does.
    fn running_sum() -> Symbol {
        let w = Symbol::variable("w");
        let x = marked(Symbol::variable("x"), "fe0");
        let s = marked(Symbol::variable("s"), "fe0");
        let xw = apply("elemwise_mul", &[], &[&x, &w], "fe0");
        let out = apply("elemwise_add", &[], &[&xw, &s], "fe0");
        let body = Symbol::group(&[&out, &out]);
        let cut = body.cut_subgraph();
        assert_eq!(cut.len(), 1);
        assert_eq!(cut[0].list_outputs(), ["w"]);
        // The body's inputs, in list_inputs order: x, w (the new variable), s.
        assert_eq!(body.list_input_names(crate::symbol::InputKind::All), ["x", "w", "s"]);
        let mut fe = Symbol::atomic(
            lookup("_foreach").unwrap(),
            [
                ("num_args", "4"),
                ("num_outputs", "2"),
                ("num_out_data", "1"),
                ("in_data_locs", "(0,)"),
                ("in_state_locs", "(2,)"),
                ("remain_locs", "(1,)"),
            ],
        )
        .unwrap();
        let (data, init) = (Symbol::variable("data"), Symbol::variable("init"));
        fe.compose(&[&body, &data, &init, &cut[0]], &[], Some("loop")).unwrap();
        fe
    }

    #[test]
    fn foreach_runs_its_steps_and_their_gradient() {
        let fe = running_sum();
        assert_eq!(fe.list_input_names(crate::symbol::InputKind::All), ["data", "init", "w"]);
        let shapes = crate::symbol::infer::infer_shapes(
            &fe,
            crate::symbol::infer::Given::Keyword(vec![("data".into(), Some(vec![3, 2])), ("init".into(), None)]),
            false,
        )
        .unwrap();
        assert_eq!(shapes.args, [Some(vec![3, 2]), Some(vec![2]), Some(vec![2])]);
        assert_eq!(shapes.outs, [Some(vec![3, 2]), Some(vec![2])]);
        let data = array_f32(&[3, 2], &[1., 2., 3., 4., 5., 6.]);
        let init = array_f32(&[2], &[10., 20.]);
        let w = array_f32(&[2], &[2., 1.]);
        let gd = array_f32(&[3, 2], &[0.; 6]);
        let gw = array_f32(&[2], &[0.; 2]);
        let e = Executor::bind(
            &fe,
            vec![data, init, w],
            vec![Some(gd.clone()), None, Some(gw.clone())],
            vec![GradReq::Write, GradReq::Null, GradReq::Write],
            vec![],
        )
        .unwrap();
        e.forward(true).unwrap();
        let outs = e.outputs();
        // Running sums of x * w from (10, 20).
        assert_eq!(values(&outs[0]), [12., 22., 18., 26., 28., 32.]);
        assert_eq!(values(&outs[1]), [28., 32.]);
        // d(sum of the outputs)/dx_t = w * (number of outputs x_t reaches: 3 - t, plus the state).
        let ones = |shape: &[usize]| array_f32(shape, &vec![1.; shape.iter().product()]);
        e.backward(&[Some(ones(&[3, 2])), Some(ones(&[2]))], true).unwrap();
        assert_eq!(values(&gd), [8., 4., 6., 3., 4., 2.]);
        // d/dw = sum_t x_t * (4 - t).
        assert_eq!(values(&gw), [1. * 4. + 3. * 3. + 5. * 2., 2. * 4. + 4. * 3. + 6. * 2.]);
    }

    #[test]
    fn a_graph_that_does_not_fit_the_parameters_is_refused() {
        let x = marked(Symbol::variable("x"), "g");
        let body = apply("negative", &[], &[&x], "g");
        let mut fe = Symbol::atomic(
            lookup("_foreach").unwrap(),
            [
                ("num_args", "3"),
                ("num_outputs", "2"),
                ("num_out_data", "1"),
                ("in_data_locs", "(0,)"),
                ("in_state_locs", "(1,)"),
                ("remain_locs", "()"),
            ],
        )
        .unwrap();
        let (d, s) = (Symbol::variable("d"), Symbol::variable("s"));
        let err = fe.compose(&[&body, &d, &s], &[], None).unwrap_err().to_string();
        assert!(err.starts_with("MXNetError") && err.contains("graph fn has 1 inputs and 1 outputs"), "{err}");
    }

    #[test]
    fn json_keeps_the_graphs() {
        let fe = running_sum();
        let text = crate::symbol::json::save(&fe.graph(), false);
        assert!(text.contains("\"subgraphs\""));
        let back = crate::symbol::json::load(&text).unwrap();
        assert_eq!(crate::symbol::json::save(&back.graph(), false), text);
        // An operator whose graphs do not fit its parameters is refused.
        let wrong = text.replace("\"num_outputs\": \"2\"", "\"num_outputs\": \"3\"");
        assert!(crate::symbol::json::load(&wrong).is_err());
    }

    #[test]
    fn nesting_is_bounded() {
        // Each level wraps the last in a foreach; a graph nesting MAX_NESTING levels is refused.
        let mut inner = marked(Symbol::variable("x0"), "n0");
        inner = apply("negative", &[], &[&inner], "n0");
        for level in 1..=crate::symbol::MAX_NESTING + 1 {
            let mark = format!("n{level}");
            let x = marked(Symbol::variable(&format!("x{level}")), &mark);
            let mut fe = Symbol::atomic(
                lookup("_foreach").unwrap(),
                [
                    ("num_args", "2"),
                    ("num_outputs", "1"),
                    ("num_out_data", "1"),
                    ("in_data_locs", "(0,)"),
                    ("in_state_locs", "()"),
                    ("remain_locs", "()"),
                ],
            )
            .unwrap();
            let r = fe.compose(&[&inner, &x], &[], None);
            if level == crate::symbol::MAX_NESTING + 1 {
                assert!(r.unwrap_err().to_string().contains("nest control flow"));
                return;
            }
            r.unwrap();
            inner = marked(fe, &mark);
        }
        unreachable!();
    }
}
