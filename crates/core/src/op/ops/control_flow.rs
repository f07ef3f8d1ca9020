//! The control-flow operators `_foreach`, `_while_loop` and `_cond` (stock's
//! `src/operator/control_flow.cc`): their parameters, their declaration as operators whose
//! leading arguments are graphs ([`OpDef::graph_inputs`]), and the calls a graph executor
//! makes to run them.
//!
//! Owns: the parameter schemas (stock's names, all required), [`ControlFlow`] (a call's
//! parameters, checked: every location names an input, no input is named twice), and
//! [`LoopCalls`] (the operator calls that slice a sequence into steps, stack the steps'
//! outputs, copy and zero-fill, which the executor records like any other call so that a
//! loop's gradient is the gradient of its steps), and [`truth`] (a condition's value).
//!
//! What the operators do is not here: a symbol keeps their graphs (`symbol`), graph inference
//! infers through them (`symbol::infer`) and an executor runs them (`executor`), step by step
//! through the graphs' own operators. Called imperatively, without graphs, they say so: stock's
//! frontend runs `mx.nd.contrib.foreach`, `while_loop` and `cond` as Python loops instead.

use crate::error::{Error, Result};
use crate::ndarray::{DType, NDArray};
use crate::op::param::{op_params, Attrs};
use crate::op::{lookup, Inputs, OpDef};

op_params! {
    struct ForeachParams<'a> => FOREACH_PARAMS {
        num_args: i64 = required, "Number of inputs.";
        num_outputs: i64 = required, "The number of outputs of the subgraph.";
        num_out_data: i64 = required, "The number of output data of the subgraph.";
        in_state_locs: &'a [i64] = required, "The locations of loop states among the inputs.";
        in_data_locs: &'a [i64] = required, "The locations of input data among the inputs.";
        remain_locs: &'a [i64] = required, "The locations of remaining data among the inputs.";
    }
}

op_params! {
    struct WhileLoopParams<'a> => WHILE_LOOP_PARAMS {
        num_args: i64 = required, "Number of input arguments, including cond and func as two symbol inputs.";
        num_outputs: i64 = required, "The number of outputs of the subgraph.";
        num_out_data: i64 = required, "The number of outputs from the function body.";
        max_iterations: i64 = required, "Maximum number of iterations.";
        cond_input_locs: &'a [i64] = required, "The locations of cond's inputs in the given inputs.";
        func_input_locs: &'a [i64] = required, "The locations of func's inputs in the given inputs.";
        func_var_locs: &'a [i64] = required, "The locations of loop_vars among func's inputs.";
    }
}

op_params! {
    struct CondParams<'a> => COND_PARAMS {
        num_args: i64 = required, "Number of input arguments, including cond, then and else as three symbol inputs.";
        num_outputs: i64 = required, "The number of outputs of the subgraph.";
        cond_input_locs: &'a [i64] = required, "The locations of cond's inputs in the given inputs.";
        then_input_locs: &'a [i64] = required, "The locations of then's inputs in the given inputs.";
        else_input_locs: &'a [i64] = required, "The locations of else's inputs in the given inputs.";
    }
}

/// A control-flow call's parameters, checked. `graphs` are the call's graphs in order; the
/// node's tensor inputs are counted without them.
#[derive(Debug, Clone, PartialEq)]
pub enum ControlFlow {
    /// `_foreach`: graph `fn` runs once per slice of the data along axis 0. Its inputs are
    /// the node's inputs placed at `data_locs` (sliced), `state_locs` (the loop states,
    /// replaced by its last outputs after each step) and `remain_locs`; its first
    /// `num_out_data` outputs are stacked, the rest are the new states.
    Foreach {
        num_outputs: usize,
        num_out_data: usize,
        data_locs: Vec<usize>,
        state_locs: Vec<usize>,
        remain_locs: Vec<usize>,
    },
    /// `_while_loop`: while graph `cond` (inputs: the node's inputs at `cond_locs`) is true and
    /// fewer than `max_iterations` steps ran, graph `func` (inputs: the node's inputs at
    /// `func_locs`) runs; loop variable `k` is `func`'s input `var_locs[k]` and becomes its
    /// output `num_out_data + k`. The first `num_out_data` outputs are stacked and padded
    /// with zeros to `max_iterations` rows.
    WhileLoop {
        num_outputs: usize,
        num_out_data: usize,
        max_iterations: usize,
        cond_locs: Vec<usize>,
        func_locs: Vec<usize>,
        var_locs: Vec<usize>,
    },
    /// `_cond`: graph `cond` (inputs at `cond_locs`) decides whether `then_branch` (inputs at
    /// `then_locs`) or `else_branch` (inputs at `else_locs`) gives the outputs.
    Cond { num_outputs: usize, cond_locs: Vec<usize>, then_locs: Vec<usize>, else_locs: Vec<usize> },
}

/// A non-negative count parameter.
fn count(op: &str, name: &str, v: i64, min: i64) -> Result<usize> {
    if v < min {
        return Err(Error::value(format!("operator {op}: {name} must be at least {min}, got {v}")));
    }
    Ok(v as usize)
}

/// Locations, each below `n`.
fn locs(op: &str, name: &str, v: &[i64], n: usize) -> Result<Vec<usize>> {
    v.iter()
        .map(|&l| {
            usize::try_from(l).ok().filter(|&l| l < n).ok_or_else(|| {
                Error::value(format!("operator {op}: {name} {v:?} names input {l}, but there are {n} inputs"))
            })
        })
        .collect()
}

/// No location named twice among `lists` (each names a distinct input).
fn distinct(op: &str, lists: &[(&str, &[usize])]) -> Result<()> {
    let mut seen = std::collections::HashSet::new();
    for (name, l) in lists {
        for &x in *l {
            if !seen.insert(x) {
                return Err(Error::value(format!("operator {op}: {name} names location {x} a second time")));
            }
        }
    }
    Ok(())
}

fn foreach_of(a: &Attrs) -> Result<ControlFlow> {
    let op = a.op;
    let p = ForeachParams::of(a);
    let n = count(op, "num_args", p.num_args, 2)? - 1;
    let num_outputs = count(op, "num_outputs", p.num_outputs, 1)?;
    let num_out_data = count(op, "num_out_data", p.num_out_data, 0)?;
    let data_locs = locs(op, "in_data_locs", p.in_data_locs, n)?;
    let state_locs = locs(op, "in_state_locs", p.in_state_locs, n)?;
    let remain_locs = locs(op, "remain_locs", p.remain_locs, n)?;
    distinct(op, &[("in_data_locs", &data_locs), ("in_state_locs", &state_locs), ("remain_locs", &remain_locs)])?;
    if data_locs.is_empty() {
        return Err(Error::value(format!(
            "operator {op}: the loop needs data to iterate over (in_data_locs is empty)"
        )));
    }
    if data_locs.len() + state_locs.len() + remain_locs.len() != n {
        return Err(Error::value(format!(
            "operator {op}: in_data_locs, in_state_locs and remain_locs place {} inputs, the loop has {n}",
            data_locs.len() + state_locs.len() + remain_locs.len()
        )));
    }
    if num_out_data > num_outputs || num_outputs - num_out_data != state_locs.len() {
        return Err(Error::value(format!(
            "operator {op}: num_outputs {num_outputs} must be num_out_data {num_out_data} plus the {} loop states",
            state_locs.len()
        )));
    }
    Ok(ControlFlow::Foreach { num_outputs, num_out_data, data_locs, state_locs, remain_locs })
}

fn while_loop_of(a: &Attrs) -> Result<ControlFlow> {
    let op = a.op;
    let p = WhileLoopParams::of(a);
    let n = count(op, "num_args", p.num_args, 2)? - 2;
    let num_outputs = count(op, "num_outputs", p.num_outputs, 1)?;
    let num_out_data = count(op, "num_out_data", p.num_out_data, 0)?;
    let max_iterations = count(op, "max_iterations", p.max_iterations, 1)?;
    if p.max_iterations > i64::from(i32::MAX) {
        return Err(Error::value(format!(
            "operator {op}: max_iterations {} is out of range (stock's is a 32-bit int)",
            p.max_iterations
        )));
    }
    let cond_locs = locs(op, "cond_input_locs", p.cond_input_locs, n)?;
    let func_locs = locs(op, "func_input_locs", p.func_input_locs, n)?;
    let var_locs = locs(op, "func_var_locs", p.func_var_locs, func_locs.len())?;
    distinct(op, &[("cond_input_locs", &cond_locs)])?;
    distinct(op, &[("func_input_locs", &func_locs)])?;
    distinct(op, &[("func_var_locs", &var_locs)])?;
    if num_out_data > num_outputs || num_outputs - num_out_data != var_locs.len() {
        return Err(Error::value(format!(
            "operator {op}: num_outputs {num_outputs} must be num_out_data {num_out_data} plus the {} loop variables",
            var_locs.len()
        )));
    }
    Ok(ControlFlow::WhileLoop { num_outputs, num_out_data, max_iterations, cond_locs, func_locs, var_locs })
}

fn cond_of(a: &Attrs) -> Result<ControlFlow> {
    let op = a.op;
    let p = CondParams::of(a);
    let n = count(op, "num_args", p.num_args, 3)? - 3;
    let num_outputs = count(op, "num_outputs", p.num_outputs, 1)?;
    let cond_locs = locs(op, "cond_input_locs", p.cond_input_locs, n)?;
    let then_locs = locs(op, "then_input_locs", p.then_input_locs, n)?;
    let else_locs = locs(op, "else_input_locs", p.else_input_locs, n)?;
    for (name, l) in [("cond_input_locs", &cond_locs), ("then_input_locs", &then_locs), ("else_input_locs", &else_locs)]
    {
        distinct(op, &[(name, l)])?;
    }
    Ok(ControlFlow::Cond { num_outputs, cond_locs, then_locs, else_locs })
}

impl ControlFlow {
    /// The number of graphs the operator takes.
    pub fn num_graphs(&self) -> usize {
        match self {
            ControlFlow::Foreach { .. } => 1,
            ControlFlow::WhileLoop { .. } => 2,
            ControlFlow::Cond { .. } => 3,
        }
    }

    /// For each graph, the node inputs it reads, in its own input order.
    pub fn graph_input_locs(&self) -> Vec<Vec<usize>> {
        match self {
            ControlFlow::Foreach { data_locs, state_locs, remain_locs, .. } => {
                let n = data_locs.len() + state_locs.len() + remain_locs.len();
                let mut at = vec![0; n];
                for (k, &l) in data_locs.iter().chain(state_locs).chain(remain_locs).enumerate() {
                    at[l] = k;
                }
                vec![at]
            }
            ControlFlow::WhileLoop { cond_locs, func_locs, .. } => vec![cond_locs.clone(), func_locs.clone()],
            ControlFlow::Cond { cond_locs, then_locs, else_locs, .. } => {
                vec![cond_locs.clone(), then_locs.clone(), else_locs.clone()]
            }
        }
    }

    /// For each graph, the number of outputs it must have.
    pub fn graph_outputs(&self) -> Vec<usize> {
        match self {
            ControlFlow::Foreach { num_outputs, .. } => vec![*num_outputs],
            ControlFlow::WhileLoop { num_outputs, .. } => vec![1, *num_outputs],
            ControlFlow::Cond { num_outputs, .. } => vec![1, *num_outputs, *num_outputs],
        }
    }
}

/// The outputs and the tensor inputs' names (`data0`, ... as stock's FListInputNames) of a
/// call, from its count parameters (the graphs are counted in `num_args`, not named).
macro_rules! counts {
    ($outputs:ident, $names:ident, $P:ident, $graphs:expr) => {
        fn $outputs(a: &Attrs) -> usize {
            $P::of(a).num_outputs.max(0) as usize
        }
        fn $names(a: &Attrs) -> Result<Vec<String>> {
            let n = ($P::of(a).num_args - $graphs).max(0);
            Ok((0..n).map(|i| format!("data{i}")).collect())
        }
    };
}
counts!(foreach_outputs, foreach_names, ForeachParams, 1);
counts!(while_loop_outputs, while_loop_names, WhileLoopParams, 2);
counts!(cond_outputs, cond_names, CondParams, 3);

fn refuse_imperative(name: &'static str, frontend: &'static str) -> crate::op::InferFn {
    Box::new(move |_, _| {
        Err(Error::value(format!(
            "operator {name} runs its graphs only inside a symbol's executor; imperatively, call {frontend}"
        )))
    })
}

/// One control-flow operator: its graphs, parameters and count functions.
struct Decl {
    name: &'static str,
    graphs: &'static [&'static str],
    params: &'static [crate::op::param::ParamSpec],
    of: fn(&Attrs) -> Result<ControlFlow>,
    outputs: fn(&Attrs) -> usize,
    names: crate::op::InputNamesFn,
    frontend: &'static str,
    doc: &'static str,
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    let decls = [
        Decl {
            name: "_foreach",
            graphs: &["fn"],
            params: FOREACH_PARAMS,
            of: foreach_of,
            outputs: foreach_outputs,
            names: foreach_names,
            frontend: "mx.nd.contrib.foreach",
            doc: "Run a for loop over an NDArray with user-defined computation",
        },
        Decl {
            name: "_while_loop",
            graphs: &["cond", "func"],
            params: WHILE_LOOP_PARAMS,
            of: while_loop_of,
            outputs: while_loop_outputs,
            names: while_loop_names,
            frontend: "mx.nd.contrib.while_loop",
            doc: "Run a while loop over with user-defined condition and computation",
        },
        Decl {
            name: "_cond",
            graphs: &["cond", "then_branch", "else_branch"],
            params: COND_PARAMS,
            of: cond_of,
            outputs: cond_outputs,
            names: cond_names,
            frontend: "mx.nd.contrib.cond",
            doc: "Run a if-then-else using user-defined condition and computation",
        },
    ];
    for d in decls {
        let name = d.name;
        let never: crate::op::ComputeFn = Box::new(move |_, _, _| {
            Err(Error::internal(format!("operator {name} has no kernel: executors run its graphs")))
        });
        ops.push(
            OpDef::new(name, Inputs::Variadic("data"), refuse_imperative(name, d.frontend), never)
                .params(d.params)
                .num_args_key("num_args")
                .outputs(d.outputs, d.outputs)
                .graph_inputs(d.graphs, d.of)
                .input_names_of(d.names)
                .doc(d.doc),
        );
    }
}

/// The operator calls an executor makes to run a loop, each an operator and its parameters,
/// so that recording them records the loop.
pub struct LoopCalls;

/// An operator and the parameters of one call.
pub type Call = (&'static OpDef, Attrs);

fn call(name: &str, kv: &[(&str, &str)], n_inputs: usize) -> Result<Call> {
    let op = lookup(name)?;
    Ok((op, op.parse_attrs(kv.iter().copied(), n_inputs)?))
}

impl LoopCalls {
    /// Slices `len` steps of an array along axis 0: step `i` is row `i` without the axis,
    /// except that a 1-D array's steps keep it (shape `(1,)`, as stock's).
    pub fn steps(len: usize, ndim: usize) -> Result<Call> {
        let n = len.to_string();
        let squeeze = if ndim > 1 { "True" } else { "False" };
        call("SliceChannel", &[("num_outputs", &n), ("axis", "0"), ("squeeze_axis", squeeze)], 1)
    }

    /// Stacks `n` arrays along a new axis 0.
    pub fn stack(n: usize) -> Result<Call> {
        call("stack", &[("num_args", &n.to_string()), ("axis", "0")], n)
    }

    /// A copy.
    pub fn copy() -> Result<Call> {
        call("_copy", &[], 1)
    }

    /// Zeros of a shape and dtype on a device.
    pub fn zeros(shape: &[usize], dtype: DType, ctx: crate::context::Context) -> Result<Call> {
        let s = format!("({})", shape.iter().map(|d| format!("{d},")).collect::<String>());
        call("_zeros", &[("shape", &s), ("dtype", dtype.name()), ("ctx", &ctx.to_string())], 0)
    }

    /// Joins two arrays along axis 0.
    pub fn concat() -> Result<Call> {
        call("Concat", &[("num_args", "2"), ("dim", "0")], 2)
    }
}

/// Whether a condition's value (one element, as stock's `asscalar` requires) is non-zero,
/// once it is computed.
pub fn truth(a: &NDArray) -> Result<bool> {
    if a.size() != 1 {
        return Err(Error::value(format!(
            "the condition of a control-flow operator must have one element, got shape {:?}",
            a.shape
        )));
    }
    let bytes = a.to_host_bytes()?;
    let v = crate::dispatch_all!(a.dtype, T => {
        if bytes.len() < std::mem::size_of::<T>() {
            return Err(Error::internal("a condition's bytes are shorter than one element"));
        }
        // SAFETY: `bytes` holds at least one `T` (checked above), and `Elem` types accept every
        // bit pattern; the read is unaligned-safe.
        let x: T = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) };
        crate::op::tensor::Elem::to_f64(x)
    });
    Ok(v != 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::registry;

    fn parse(name: &str, kv: &[(&str, &str)]) -> Result<ControlFlow> {
        let op = registry().get(name).unwrap();
        let a = op.parse_attrs(kv.iter().copied(), 0)?;
        (op.control_flow.unwrap())(&a)
    }

    #[test]
    fn foreach_locations_are_checked() {
        let ok = parse(
            "_foreach",
            &[
                ("num_args", "4"),
                ("num_outputs", "2"),
                ("num_out_data", "1"),
                ("in_data_locs", "(1,)"),
                ("in_state_locs", "(2,)"),
                ("remain_locs", "(0,)"),
            ],
        )
        .unwrap();
        assert_eq!(ok.graph_input_locs(), vec![vec![2, 0, 1]]);
        let bad = parse(
            "_foreach",
            &[
                ("num_args", "3"),
                ("num_outputs", "1"),
                ("num_out_data", "1"),
                ("in_data_locs", "(0,)"),
                ("in_state_locs", "(0,)"),
                ("remain_locs", "()"),
            ],
        );
        assert!(bad.unwrap_err().to_string().contains("a second time"));
        let out_of_range = parse(
            "_foreach",
            &[
                ("num_args", "2"),
                ("num_outputs", "1"),
                ("num_out_data", "1"),
                ("in_data_locs", "(5,)"),
                ("in_state_locs", "()"),
                ("remain_locs", "()"),
            ],
        );
        assert!(out_of_range.unwrap_err().to_string().contains("names input 5"));
    }

    #[test]
    fn while_loop_and_cond_parameters() {
        let w = parse(
            "_while_loop",
            &[
                ("num_args", "4"),
                ("num_outputs", "2"),
                ("num_out_data", "1"),
                ("max_iterations", "3"),
                ("cond_input_locs", "(0,)"),
                ("func_input_locs", "(0, 1)"),
                ("func_var_locs", "(0,)"),
            ],
        )
        .unwrap();
        assert_eq!(w.graph_outputs(), vec![1, 2]);
        let e = parse(
            "_while_loop",
            &[
                ("num_args", "3"),
                ("num_outputs", "1"),
                ("num_out_data", "0"),
                ("max_iterations", "0"),
                ("cond_input_locs", "(0,)"),
                ("func_input_locs", "(0,)"),
                ("func_var_locs", "(0,)"),
            ],
        );
        assert!(e.unwrap_err().to_string().contains("max_iterations must be at least 1"));
        let c = parse(
            "_cond",
            &[
                ("num_args", "5"),
                ("num_outputs", "1"),
                ("cond_input_locs", "(0,)"),
                ("then_input_locs", "(0, 1)"),
                ("else_input_locs", "(1,)"),
            ],
        )
        .unwrap();
        assert_eq!(c.num_graphs(), 3);
    }

    #[test]
    fn the_truth_of_a_condition() {
        let a = NDArray::from_host_bytes(vec![1], DType::F32, &2.5f32.to_le_bytes()).unwrap();
        assert!(truth(&a).unwrap());
        let z = NDArray::from_host_bytes(vec![1], DType::I64, &0i64.to_le_bytes()).unwrap();
        assert!(!truth(&z).unwrap());
    }
}
