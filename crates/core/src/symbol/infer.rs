//! Shape and dtype inference over a symbol's graph (stock's InferShape / InferType passes).
//!
//! Owns: [`infer`], which propagates partial shapes (`None` = unknown rank, `-1` = unknown
//! dimension) and dtypes through a [`Graph`] until nothing changes. Each operator node uses:
//! - its `OpDef::infer` once every input shape is known (exact shapes and, when the input
//!   dtypes are known, dtypes of the outputs);
//! - the backward rules below, keyed by operator name, which fill inputs from the data input
//!   and the parameters — the parameter shapes Gluon's deferred initialisation asks for:
//!   FullyConnected, Convolution/Deconvolution, BatchNorm and the other normalisations,
//!   Embedding, PReLU's gamma — and unify the inputs and output of same-shape elementwise
//!   operators;
//! - once exact propagation is exhausted, the stock default dtype rule (outputs and unknown
//!   inputs take the data dtype, or the `dtype` parameter where the operator has one).
//!
//! Variables start from the caller's shapes/dtypes, else their `__shape__` / `__dtype__`
//! attributes. A contradiction is an `MXNetError` naming the node and both shapes.

use super::{GNode, Graph};
use crate::error::{Error, Result};
use crate::ndarray::DType;
use crate::op::{param::Attrs, ControlFlow, Meta, OpDef};

/// A partial shape: `None` = unknown rank; `-1` = unknown dimension.
pub type PShape = Option<Vec<i64>>;

/// Whether a partial shape is fully known.
pub fn is_complete(s: &PShape) -> bool {
    s.as_ref().is_some_and(|v| v.iter().all(|&d| d >= 0))
}

fn show(s: &PShape) -> String {
    match s {
        None => "unknown".to_string(),
        Some(v) => format!(
            "({})",
            v.iter().map(|d| if *d < 0 { "?".to_string() } else { d.to_string() }).collect::<Vec<_>>().join(",")
        ),
    }
}

/// Merge `new` into `cur`; `Ok(true)` when `cur` gained information.
fn merge(cur: &mut PShape, new: &PShape, what: &dyn Fn() -> String) -> Result<bool> {
    let Some(n) = new else { return Ok(false) };
    match cur {
        None => {
            *cur = Some(n.clone());
            Ok(true)
        }
        Some(c) => {
            let before = Some(c.clone());
            let mismatch = || {
                Error::mxnet(format!(
                    "shape inconsistent for {}: provided {}, inferred {}",
                    what(),
                    show(&before),
                    show(new)
                ))
            };
            if c.len() != n.len() {
                return Err(mismatch());
            }
            let mut changed = false;
            for k in 0..c.len() {
                if n[k] >= 0 {
                    if c[k] < 0 {
                        c[k] = n[k];
                        changed = true;
                    } else if c[k] != n[k] {
                        return Err(mismatch());
                    }
                }
            }
            Ok(changed)
        }
    }
}

fn merge_dtype(cur: &mut Option<DType>, new: Option<DType>, what: &dyn Fn() -> String) -> Result<bool> {
    match (cur.as_ref(), new) {
        (_, None) => Ok(false),
        (None, Some(n)) => {
            *cur = Some(n);
            Ok(true)
        }
        (Some(c), Some(n)) if *c == n => Ok(false),
        (Some(c), Some(n)) => {
            Err(Error::mxnet(format!("type inconsistent for {}: provided {}, inferred {}", what(), c.name(), n.name())))
        }
    }
}

/// Parse a `__shape__` attribute (`(2, 0)`, `[2, 3]`); in legacy mode 0 means unknown.
pub fn parse_shape_attr(text: &str, np_shape: bool) -> Option<PShape> {
    let t = text.trim();
    let inner = t
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .or_else(|| t.strip_prefix('[').and_then(|r| r.strip_suffix(']')))?;
    let mut dims = Vec::new();
    for p in inner.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let d: i64 = p.trim_end_matches('L').parse().ok()?;
        dims.push(if d < 0 || (!np_shape && d == 0) { -1 } else { d });
    }
    if !np_shape && dims.is_empty() {
        return Some(None);
    }
    Some(Some(dims))
}

/// The inferred attributes of every entry (`entry id = offsets[node] + output`).
pub struct Inferred {
    pub offsets: Vec<usize>,
    pub shapes: Vec<PShape>,
    pub dtypes: Vec<Option<DType>>,
}

impl Inferred {
    pub fn shape_complete(&self) -> bool {
        self.shapes.iter().all(is_complete)
    }
    pub fn dtype_complete(&self) -> bool {
        self.dtypes.iter().all(Option::is_some)
    }
    pub fn node_shape(&self, node: usize) -> &PShape {
        &self.shapes[self.offsets[node]]
    }
    pub fn node_dtype(&self, node: usize) -> Option<DType> {
        self.dtypes[self.offsets[node]]
    }
}

/// Infer from the given shapes and dtypes of the input nodes (`g.input_nodes()` order;
/// `None` = unknown, then the variable's attributes are used).
pub fn infer(g: &Graph, in_shapes: &[PShape], in_dtypes: &[Option<DType>], np_shape: bool) -> Result<Inferred> {
    let _call = InferCall::enter();
    let offsets = g.entry_offsets();
    let n_entries = *offsets.last().unwrap_or(&0);
    let mut st = Inferred { offsets, shapes: vec![None; n_entries], dtypes: vec![None; n_entries] };
    for (k, &node) in g.input_nodes().iter().enumerate() {
        let n = &g.nodes[node];
        let e = st.offsets[node];
        let what = || format!("variable {}", n.name);
        // A given shape or dtype wins; the attributes serve where none is given (stock reads
        // them only for a variable whose shape or dtype is unknown). A malformed attribute (a
        // hand-edited JSON file) is an error, not silently no shape.
        if let Some(attr) = n.raw.get("__shape__") {
            st.shapes[e] = parse_shape_attr(attr, np_shape)
                .ok_or_else(|| Error::value(format!("{}: __shape__ {attr:?} is not a shape such as (2, 3)", what())))?;
        }
        if let Some(Some(s)) = in_shapes.get(k) {
            st.shapes[e] = Some(s.clone());
        }
        if let Some(attr) = n.raw.get("__dtype__") {
            let code = attr
                .trim()
                .parse::<i32>()
                .map_err(|_| Error::value(format!("{}: __dtype__ {attr:?} is not a dtype code", what())))?;
            if code >= 0 {
                st.dtypes[e] = Some(DType::from_code(code)?);
            }
        }
        if let Some(&Some(d)) = in_dtypes.get(k) {
            st.dtypes[e] = Some(d);
        }
    }
    for heuristics in [false, true] {
        for pass in 0..(2 * g.nodes.len() + 4) {
            let mut changed = false;
            let order: Vec<usize> =
                if pass % 2 == 0 { (0..g.nodes.len()).collect() } else { (0..g.nodes.len()).rev().collect() };
            for i in order {
                changed |= visit(g, i, &mut st, heuristics, np_shape)?;
            }
            if !changed {
                break;
            }
        }
    }
    Ok(st)
}

/// What the caller knows about the inputs: positional (in `list_arguments` order) or by
/// name (any input, auxiliary states included).
pub enum Given<T> {
    Positional(Vec<T>),
    Keyword(Vec<(String, T)>),
}

/// Inferred attributes of the arguments, outputs and auxiliary states, and whether every
/// entry of the graph is known.
pub struct Report<T> {
    pub args: Vec<T>,
    pub outs: Vec<T>,
    pub aux: Vec<T>,
    pub complete: bool,
}

/// Per input node (`g.input_nodes()` order), the given values (`T::default()` = unknown).
fn place<T: Clone + Default>(g: &Graph, given: Given<T>, what: &str) -> Result<Vec<T>> {
    let inputs = g.input_nodes();
    let mut v = vec![T::default(); inputs.len()];
    match given {
        Given::Positional(vals) => {
            let args = g.arg_nodes();
            if vals.len() > args.len() {
                return Err(Error::mxnet(format!(
                    "{what}: {} positional arguments given, the symbol has {}",
                    vals.len(),
                    args.len()
                )));
            }
            for (val, node) in vals.into_iter().zip(args) {
                let k = inputs.iter().position(|&n| n == node).expect("arguments are inputs");
                v[k] = val;
            }
        }
        Given::Keyword(pairs) => {
            for (name, val) in pairs {
                let mut found = false;
                for (k, &n) in inputs.iter().enumerate() {
                    if g.nodes[n].name == name {
                        v[k] = val.clone();
                        found = true;
                    }
                }
                if !found {
                    let cands: String =
                        inputs.iter().enumerate().map(|(k, &n)| format!("\t[{k}]{}\n", g.nodes[n].name)).collect();
                    return Err(Error::mxnet(format!(
                        "{what}: keyword argument name {name} not found.\nCandidate arguments:\n{cands}"
                    )));
                }
            }
        }
    }
    Ok(v)
}

fn report<T: Clone>(g: &Graph, r: &Inferred, per_entry: &[T], complete: bool) -> Report<T> {
    let node = |n: usize| per_entry[r.offsets[n]].clone();
    Report {
        args: g.arg_nodes().into_iter().map(node).collect(),
        outs: g.heads.iter().map(|&(n, i)| per_entry[r.offsets[n] + i].clone()).collect(),
        aux: g.aux_nodes().into_iter().map(node).collect(),
        complete,
    }
}

/// Shape inference for a symbol (`MXSymbolInferShapeEx`).
pub fn infer_shapes(sym: &super::Symbol, given: Given<PShape>, np_shape: bool) -> Result<Report<PShape>> {
    let g = sym.graph();
    let shapes = place(&g, given, "InferShape")?;
    let r = infer(&g, &shapes, &[], np_shape)?;
    Ok(report(&g, &r, &r.shapes, r.shape_complete()))
}

/// Type inference for a symbol (`MXSymbolInferType`).
pub fn infer_types(sym: &super::Symbol, given: Given<Option<DType>>) -> Result<Report<Option<DType>>> {
    let g = sym.graph();
    let dtypes = place(&g, given, "InferType")?;
    let r = infer(&g, &[], &dtypes, crate::ndarray::np_shape::get() != 0)?;
    Ok(report(&g, &r, &r.dtypes, r.dtype_complete()))
}

/// The operator's inference on complete input shapes. Inputs of unknown dtype are taken to
/// have the first known one (float32 when none is known), so shapes are found whatever the
/// dtypes: data of unknown dtype with float64 weights (`net.cast('float64')` before Gluon's
/// deferred shape inference) is no conflict. Output dtypes are only learned (by the caller)
/// when every input's is known.
fn infer_complete(op: &OpDef, attrs: &Attrs, ish: &[PShape], idt: &[Option<DType>]) -> Result<Vec<Meta>> {
    let fixed = |k: usize| op.input_dtypes.iter().find(|(i, _)| *i == k).map(|&(_, d)| d);
    let fill = idt.iter().enumerate().filter(|&(k, _)| fixed(k).is_none()).find_map(|(_, d)| *d).unwrap_or(DType::F32);
    let metas: Vec<Meta> = ish
        .iter()
        .zip(idt)
        .enumerate()
        .map(|(k, (s, d))| {
            let shape = s.as_ref().expect("complete").iter().map(|&x| x as usize).collect();
            Meta::new(shape, d.or_else(|| fixed(k)).unwrap_or(fill))
        })
        .collect();
    (op.infer)(attrs, &metas)
}

/// Dimensions an unknown input dimension is given in turn by [`infer_partial`]: small (so a
/// `min(d, 10)` or a slice to 10 is not mistaken for known) and distinct.
const PROBES: [i64; 3] = [2, 3, 5];

/// Forward inference from inputs of known rank with unknown dimensions (stock's partial
/// inference, e.g. `slice` of a `(0, 20)` variable is `(0, 10)`), for any operator: its
/// inference runs once per probe value, every unknown input dimension set to it; an output
/// dimension the same in every run is known, the others stay unknown. A run that fails (the
/// probe contradicts a known dimension, say) means nothing is learned: never an error, since
/// the real dimensions may well fit.
fn infer_partial(op: &OpDef, attrs: &Attrs, ish: &[PShape], idt: &[Option<DType>]) -> Vec<PShape> {
    let mut runs: Vec<Vec<Meta>> = Vec::with_capacity(PROBES.len());
    for p in PROBES {
        let probe: Vec<PShape> =
            ish.iter().map(|s| s.as_ref().map(|v| v.iter().map(|&d| if d < 0 { p } else { d }).collect())).collect();
        match infer_complete(op, attrs, &probe, idt) {
            Ok(outs) => runs.push(outs),
            Err(_) => return Vec::new(),
        }
    }
    let (first, rest) = runs.split_first().expect("one run per probe");
    first
        .iter()
        .enumerate()
        .map(|(k, m)| {
            if rest.iter().any(|r| r.get(k).is_none_or(|o| o.shape.len() != m.shape.len())) {
                return None;
            }
            Some(
                (0..m.shape.len())
                    .map(|d| if rest.iter().all(|r| r[k].shape[d] == m.shape[d]) { m.shape[d] as i64 } else { -1 })
                    .collect(),
            )
        })
        .collect()
}

/// One node; returns whether anything was learned.
fn visit(g: &Graph, i: usize, st: &mut Inferred, heuristics: bool, np_shape: bool) -> Result<bool> {
    let node = &g.nodes[i];
    let (Some(op), Some(attrs)) = (node.op, node.attrs.as_ref()) else { return Ok(false) };
    let in_e: Vec<usize> = node.inputs.iter().map(|&(n, o)| st.offsets[n] + o).collect();
    let out_e: Vec<usize> = (st.offsets[i]..st.offsets[i + 1]).collect();
    let mut ish: Vec<PShape> = in_e.iter().map(|&e| st.shapes[e].clone()).collect();
    let mut osh: Vec<PShape> = out_e.iter().map(|&e| st.shapes[e].clone()).collect();
    let mut idt: Vec<Option<DType>> = in_e.iter().map(|&e| st.dtypes[e]).collect();
    let mut odt: Vec<Option<DType>> = out_e.iter().map(|&e| st.dtypes[e]).collect();
    let in_what = |k: usize| {
        let (src, _) = node.inputs[k];
        move || format!("input {k} ({}) of {} ({})", g.nodes[src].name, node.name, op.name)
    };
    let out_what = |k: usize| move || format!("output {k} of {} ({})", node.name, op.name);

    if let Some(of) = op.control_flow {
        // The graphs and the inputs must still fit the parameters (set_attr may have changed
        // them since composition).
        let graphs: Vec<&Graph> = node.subgraphs.iter().map(|g| &**g).collect();
        super::check_control_flow(op, attrs, &node.name, &graphs, node.inputs.len())?;
        let cf =
            of(attrs).map_err(|e| Error::new(e.kind(), format!("{} ({}): {}", node.name, op.name, e.message())))?;
        flow(&cf, node, np_shape, &mut ish, &mut osh, &mut idt, &mut odt)
            .map_err(|e| Error::new(e.kind(), format!("{} ({}): {}", node.name, op.name, e.message())))?;
    } else {
        let names: Vec<String> = node.inputs.iter().map(|&(src, _)| g.nodes[src].name.clone()).collect();
        param_shapes(op, attrs, node, &names, &mut ish)?;
        input_shapes(op, attrs, node, &names, &mut ish, &osh)?;
        // A creation operator's `shape` parameter (no inputs) with a 0 or negative dimension means
        // "unknown" in the legacy shape semantics (stock's InitShape): `F.zeros((0, H))` as a begin
        // state takes its batch size from the operator that reads it, `sym.ones(shape=(-1, -1))`
        // its shape from its consumers. So does an empty shape (`shape=()`, unknown rank):
        // `sym.random.randn(...) + x` is x's shape.
        let unknown_zeros = !np_shape && op.creates_from_shape();
        let partial_creation = unknown_zeros && op.shape_of(attrs).is_some_and(|s| s.iter().any(|&d| d < 0));
        // An operator without inputs whose own rule leaves its shape partial (`_arange` with
        // `infer_range`): its consumers fill the rest.
        let partial_source = if ish.is_empty() { op.partial_shapes.and_then(|rule| rule(attrs, &ish)) } else { None };
        if let Some(partial) = partial_source {
            for (k, shape) in partial.into_iter().enumerate().take(osh.len()) {
                merge(&mut osh[k], &shape, &out_what(k))?;
                merge_dtype(&mut odt[k], op.dtype_of(attrs), &out_what(k))?;
            }
        } else if partial_creation {
            let dims = op.shape_of(attrs).unwrap_or_default().iter().map(|&d| if d <= 0 { -1 } else { d }).collect();
            merge(&mut osh[0], &Some(dims), &out_what(0))?;
        } else if ish.iter().all(is_complete) {
            let outs = infer_complete(op, attrs, &ish, &idt)
                .map_err(|e| Error::mxnet(format!("{} ({}): {}", node.name, op.name, e.message())))?;
            let dtypes_known = idt.iter().all(Option::is_some);
            for (k, m) in outs.iter().enumerate().take(osh.len()) {
                if unknown_zeros && m.shape.is_empty() {
                    continue;
                }
                let shape = m.shape.iter().map(|&x| if x == 0 && unknown_zeros { -1 } else { x as i64 }).collect();
                merge(&mut osh[k], &Some(shape), &out_what(k))?;
                if dtypes_known {
                    merge_dtype(&mut odt[k], Some(m.dtype), &out_what(k))?;
                }
            }
        } else if ish.iter().all(Option::is_some) {
            let partial = op.partial_shapes.and_then(|rule| rule(attrs, &ish));
            let partial = partial.unwrap_or_else(|| infer_partial(op, attrs, &ish, &idt));
            for (k, shape) in partial.into_iter().enumerate().take(osh.len()) {
                merge(&mut osh[k], &shape, &out_what(k))?;
            }
        }
        if heuristics {
            default_dtypes(op, attrs, &mut idt, &mut odt);
        }
        elementwise_shapes(op, &mut ish, &mut osh)?;
    }

    let mut changed = false;
    for (k, &e) in in_e.iter().enumerate() {
        changed |= merge(&mut st.shapes[e], &ish[k], &in_what(k))?;
        changed |= merge_dtype(&mut st.dtypes[e], idt[k], &in_what(k))?;
    }
    for (k, &e) in out_e.iter().enumerate() {
        changed |= merge(&mut st.shapes[e], &osh[k], &out_what(k))?;
        changed |= merge_dtype(&mut st.dtypes[e], odt[k], &out_what(k))?;
    }
    Ok(changed)
}

/// What inference finds in one graph of a control-flow node: its inputs' and outputs'
/// shapes and dtypes (in its `list_inputs` and heads order).
#[derive(Clone)]
struct SubInferred {
    in_sh: Vec<PShape>,
    in_dt: Vec<Option<DType>>,
    out_sh: Vec<PShape>,
    out_dt: Vec<Option<DType>>,
}

/// What a graph was given: the graph (its address, stable for the whole inference), its
/// inputs' shapes and dtypes, and the shape semantics.
type SubKey = (usize, Vec<PShape>, Vec<Option<DType>>, bool);

/// The calls in progress, and the graphs inferred so far with their results.
type SubCache = (usize, std::collections::HashMap<SubKey, (std::sync::Arc<Graph>, SubInferred)>);

thread_local! {
    /// Within one outermost [`infer`] call: each control-flow graph's inference by what it
    /// was given. The passes visit a control-flow node many times, and nested graphs would
    /// multiply that by every level; each graph is inferred again only when it is given
    /// something new. Cleared when the outermost call returns.
    /// Each entry keeps its graph alive, so no other graph can take its address meanwhile.
    static SUB_INFERRED: std::cell::RefCell<SubCache> =
        std::cell::RefCell::new((0, std::collections::HashMap::new()));
}

/// Marks an [`infer`] call in progress on this thread (see [`SUB_INFERRED`]).
struct InferCall;

impl InferCall {
    fn enter() -> InferCall {
        SUB_INFERRED.with(|c| c.borrow_mut().0 += 1);
        InferCall
    }
}

impl Drop for InferCall {
    fn drop(&mut self) {
        SUB_INFERRED.with(|c| {
            let mut c = c.borrow_mut();
            c.0 -= 1;
            if c.0 == 0 {
                c.1.clear();
            }
        });
    }
}

fn infer_sub(
    g: &std::sync::Arc<Graph>,
    shapes: &[PShape],
    dtypes: &[Option<DType>],
    np_shape: bool,
) -> Result<SubInferred> {
    let key: SubKey = (std::sync::Arc::as_ptr(g) as usize, shapes.to_vec(), dtypes.to_vec(), np_shape);
    if let Some(hit) = SUB_INFERRED.with(|c| c.borrow().1.get(&key).map(|(_, r)| r.clone())) {
        return Ok(hit);
    }
    let r = infer(g, shapes, dtypes, np_shape)?;
    let inputs = g.input_nodes();
    let out = SubInferred {
        in_sh: inputs.iter().map(|&n| r.node_shape(n).clone()).collect(),
        in_dt: inputs.iter().map(|&n| r.node_dtype(n)).collect(),
        out_sh: g.heads.iter().map(|&(n, i)| r.shapes[r.offsets[n] + i].clone()).collect(),
        out_dt: g.heads.iter().map(|&(n, i)| r.dtypes[r.offsets[n] + i]).collect(),
    };
    SUB_INFERRED.with(|c| c.borrow_mut().1.insert(key, (g.clone(), out.clone())));
    Ok(out)
}

/// The node inputs at `locs`, in that order.
fn pick<T: Clone>(v: &[T], locs: &[usize]) -> Vec<T> {
    locs.iter().map(|&l| v[l].clone()).collect()
}

/// What a control-flow node's graphs say about its inputs and outputs (stock's ForeachShape,
/// WhileLoopType, ...), both ways: the node's inputs feed its graphs' inputs, whose inferred
/// shapes come back to the node's inputs, and the graphs' outputs give the node's. A loop
/// state (variable) has one shape and dtype in and out. Unlike stock, `_while_loop` and
/// `_cond` have static shapes: a while loop's stacked outputs have `max_iterations` rows,
/// and both branches of a condition give the outputs' shapes.
fn flow(
    cf: &ControlFlow,
    node: &GNode,
    np_shape: bool,
    ish: &mut [PShape],
    osh: &mut [PShape],
    idt: &mut [Option<DType>],
    odt: &mut [Option<DType>],
) -> Result<()> {
    let in_what = |k: usize| move || format!("input {k}");
    let out_what = |k: usize| move || format!("output {k}");
    let sub_what = |g: usize, k: usize| move || format!("input {k} of graph {g}");
    match cf {
        ControlFlow::Foreach { num_out_data: nod, data_locs, state_locs, remain_locs, .. } => {
            let (nd, ns) = (data_locs.len(), state_locs.len());
            for j in 0..ns {
                merge(&mut ish[nd + j], &osh[nod + j].clone(), &in_what(nd + j))?;
                merge(&mut osh[nod + j], &ish[nd + j].clone(), &out_what(nod + j))?;
                merge_dtype(&mut idt[nd + j], odt[nod + j], &in_what(nd + j))?;
                merge_dtype(&mut odt[nod + j], idt[nd + j], &out_what(nod + j))?;
            }
            // The sequence length: the first known length of the data (every one must have it).
            let mut len = -1;
            for (j, data) in ish[..nd].iter().enumerate() {
                if let Some(&l) = data.as_ref().and_then(|s| s.first()).filter(|&&l| l >= 0) {
                    if len >= 0 && l != len {
                        return Err(Error::mxnet(format!(
                            "the data of a foreach have different lengths: {len} and {l} (input {j})"
                        )));
                    }
                    len = l;
                }
            }
            let n = ish.len();
            let (mut sin, mut sdt) = (vec![None; n], vec![None; n]);
            for (j, &l) in data_locs.iter().enumerate() {
                sin[l] = ish[j].as_ref().map(|s| if s.len() > 1 { s[1..].to_vec() } else { vec![1] });
                sdt[l] = idt[j];
            }
            for (j, &l) in state_locs.iter().chain(remain_locs).enumerate() {
                sin[l] = ish[nd + j].clone();
                sdt[l] = idt[nd + j];
            }
            let r = infer_sub(&node.subgraphs[0], &sin, &sdt, np_shape)?;
            for k in 0..osh.len() {
                let shape = match &r.out_sh[k] {
                    Some(h) if k < *nod => Some(std::iter::once(len).chain(h.iter().copied()).collect()),
                    other => other.clone(),
                };
                merge(&mut osh[k], &shape, &out_what(k))?;
                merge_dtype(&mut odt[k], r.out_dt[k], &out_what(k))?;
            }
            for (j, &l) in data_locs.iter().enumerate() {
                if let Some(s) = &r.in_sh[l] {
                    // A 1-D sequence's steps are (1,): its own rank decides how a step's
                    // shape maps back.
                    let full = match &ish[j] {
                        Some(known) if known.len() == 1 => None,
                        _ => Some(std::iter::once(len).chain(s.iter().copied()).collect()),
                    };
                    merge(&mut ish[j], &full, &in_what(j))?;
                }
                merge_dtype(&mut idt[j], r.in_dt[l], &in_what(j))?;
            }
            for (j, &l) in state_locs.iter().chain(remain_locs).enumerate() {
                merge(&mut ish[nd + j], &r.in_sh[l], &in_what(nd + j))?;
                merge_dtype(&mut idt[nd + j], r.in_dt[l], &in_what(nd + j))?;
            }
        }
        ControlFlow::WhileLoop { num_out_data: nod, max_iterations, cond_locs, func_locs, var_locs, .. } => {
            let vars: Vec<usize> = var_locs.iter().map(|&v| func_locs[v]).collect();
            let sync =
                |ish: &mut [PShape], osh: &mut [PShape], idt: &mut [Option<DType>], odt: &mut [Option<DType>]| {
                    for (k, &p) in vars.iter().enumerate() {
                        merge(&mut ish[p], &osh[nod + k].clone(), &in_what(p))?;
                        merge(&mut osh[nod + k], &ish[p].clone(), &out_what(nod + k))?;
                        merge_dtype(&mut idt[p], odt[nod + k], &in_what(p))?;
                        merge_dtype(&mut odt[nod + k], idt[p], &out_what(nod + k))?;
                    }
                    Ok::<(), Error>(())
                };
            sync(ish, osh, idt, odt)?;
            let c = infer_sub(&node.subgraphs[0], &pick(ish, cond_locs), &pick(idt, cond_locs), np_shape)?;
            for (j, &l) in cond_locs.iter().enumerate() {
                merge(&mut ish[l], &c.in_sh[j], &sub_what(0, j))?;
                merge_dtype(&mut idt[l], c.in_dt[j], &sub_what(0, j))?;
            }
            let f = infer_sub(&node.subgraphs[1], &pick(ish, func_locs), &pick(idt, func_locs), np_shape)?;
            for (j, &l) in func_locs.iter().enumerate() {
                merge(&mut ish[l], &f.in_sh[j], &sub_what(1, j))?;
                merge_dtype(&mut idt[l], f.in_dt[j], &sub_what(1, j))?;
            }
            for k in 0..osh.len() {
                let shape = match &f.out_sh[k] {
                    Some(h) if k < *nod => {
                        Some(std::iter::once(*max_iterations as i64).chain(h.iter().copied()).collect())
                    }
                    other => other.clone(),
                };
                merge(&mut osh[k], &shape, &out_what(k))?;
                merge_dtype(&mut odt[k], f.out_dt[k], &out_what(k))?;
            }
            sync(ish, osh, idt, odt)?;
        }
        ControlFlow::Cond { cond_locs, then_locs, else_locs, .. } => {
            for (g, locs) in [cond_locs, then_locs, else_locs].into_iter().enumerate() {
                let r = infer_sub(&node.subgraphs[g], &pick(ish, locs), &pick(idt, locs), np_shape)?;
                for (j, &l) in locs.iter().enumerate() {
                    merge(&mut ish[l], &r.in_sh[j], &sub_what(g, j))?;
                    merge_dtype(&mut idt[l], r.in_dt[j], &sub_what(g, j))?;
                }
                if g > 0 {
                    for k in 0..osh.len() {
                        merge(&mut osh[k], &r.out_sh[k], &out_what(k))?;
                        merge_dtype(&mut odt[k], r.out_dt[k], &out_what(k))?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// Fill input `k` with `shape` (checked against what is known).
fn set(ins: &mut [PShape], k: usize, shape: Vec<i64>, node: &GNode, names: &[String]) -> Result<()> {
    if k < ins.len() {
        let input = names.get(k).map_or("?", String::as_str);
        merge(&mut ins[k], &Some(shape), &|| format!("input {k} ({input}) of {}", node.name))?;
    }
    Ok(())
}

/// Parameter shapes from the data shape, by the operator's rule ([`OpDef::param_shapes`]).
fn param_shapes(op: &OpDef, a: &Attrs, node: &GNode, names: &[String], ins: &mut [PShape]) -> Result<()> {
    let Some(rule) = op.param_shapes else { return Ok(()) };
    // The data's rank must be known; unknown dimensions (-1) stay unknown in what is derived
    // (stock's partial inference: Gluon asks for (20, 0, 5, 5) before it knows the channels).
    let Some(data) = ins.first().cloned().flatten() else { return Ok(()) };
    if ins.len() < 2 || ins[1..].iter().all(is_complete) {
        return Ok(());
    }
    let derived =
        rule(a, &data, ins.len()).map_err(|e| Error::mxnet(format!("{} ({}): {}", node.name, op.name, e.message())))?;
    for (k, shape) in derived {
        set(ins, k, shape, node, names)?;
    }
    Ok(())
}

/// Input shapes from the outputs, by the operator's rule ([`OpDef::input_shapes`]).
fn input_shapes(
    op: &OpDef,
    a: &Attrs,
    node: &GNode,
    names: &[String],
    ins: &mut [PShape],
    outs: &[PShape],
) -> Result<()> {
    let Some(rule) = op.input_shapes else { return Ok(()) };
    if ins.iter().all(is_complete) || !outs.iter().any(is_complete) {
        return Ok(());
    }
    let derived =
        rule(a, ins, outs).map_err(|e| Error::mxnet(format!("{} ({}): {}", node.name, op.name, e.message())))?;
    for (k, shape) in derived {
        set(ins, k, shape, node, names)?;
    }
    Ok(())
}

/// The element-wise shape rule ([`OpDef::elementwise_shape`]): the inputs it covers and the
/// first output take the shape any of them has, dimension by dimension: `(2, ?)` and `(?, 3)`
/// are `(2, 3)`, as in stock.
fn elementwise_shapes(op: &OpDef, ins: &mut [PShape], outs: &mut [PShape]) -> Result<()> {
    let n = op.elementwise_shape.min(ins.len());
    if n == 0 {
        return Ok(());
    }
    let what = || format!("an input of {} (its inputs have one shape)", op.name);
    let mut known: PShape = None;
    for s in ins[..n].iter().chain(outs.first()) {
        merge(&mut known, s, &what)?;
    }
    if known.is_some() {
        for s in ins[..n].iter_mut().chain(outs.first_mut()) {
            merge(s, &known, &what)?;
        }
    }
    Ok(())
}

/// Stock's default type rule for nodes whose shapes are not all known.
fn default_dtypes(op: &OpDef, a: &Attrs, ins: &mut [Option<DType>], outs: &mut [Option<DType>]) {
    let fixed = |k: usize| op.input_dtypes.iter().any(|&(i, _)| i == k);
    for &(k, d) in op.input_dtypes {
        if let Some(slot @ None) = ins.get_mut(k) {
            *slot = Some(d);
        }
    }
    // The data's dtype: input 0's, else another input's (inputs of a fixed dtype say nothing
    // of the others').
    let data = ins
        .iter()
        .enumerate()
        .filter(|&(k, _)| !fixed(k))
        .find_map(|(_, d)| *d)
        // A cast's output dtype says nothing of its input's (stock leaves it unknown).
        .or_else(|| if op.converts_dtype { None } else { outs.first().copied().flatten() });
    let Some(d) = data else {
        if let Some(t) = op.dtype_of(a) {
            for o in outs.iter_mut().filter(|o| o.is_none()) {
                *o = Some(t);
            }
        }
        return;
    };
    let param_dtype = if op.float32_params && d == DType::F16 {
        DType::F32
    } else if op.params_take_dtype {
        op.dtype_of(a).unwrap_or(d)
    } else {
        d
    };
    for (k, s) in ins.iter_mut().enumerate() {
        if s.is_none() {
            *s = Some(if k == 0 { d } else { param_dtype });
        }
    }
    let out = op.dtype_of(a).unwrap_or(d);
    for o in outs.iter_mut().filter(|o| o.is_none()) {
        *o = Some(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::lookup;
    use crate::symbol::Symbol;

    fn conv_bn_fc() -> Symbol {
        let x = Symbol::variable("data");
        let mut c = Symbol::atomic(
            lookup("Convolution").unwrap(),
            [("kernel", "(3, 3)"), ("num_filter", "4"), ("pad", "(1, 1)")],
        )
        .unwrap();
        c.compose(&[&x], &[], Some("conv")).unwrap();
        let mut bn = Symbol::atomic(lookup("BatchNorm").unwrap(), std::iter::empty()).unwrap();
        bn.compose(&[&c], &[], Some("bn")).unwrap();
        let mut r = Symbol::atomic(lookup("Activation").unwrap(), [("act_type", "relu")]).unwrap();
        r.compose(&[&bn], &[], Some("relu")).unwrap();
        let mut fc = Symbol::atomic(lookup("FullyConnected").unwrap(), [("num_hidden", "10")]).unwrap();
        fc.compose(&[&r], &[], Some("fc")).unwrap();
        fc
    }

    #[test]
    fn parameter_shapes_from_data() {
        let s = conv_bn_fc();
        let g = s.graph();
        let inputs = g.input_nodes();
        let mut shapes = vec![None; inputs.len()];
        shapes[0] = Some(vec![2, 3, 8, 8]);
        let r = infer(&g, &shapes, &[], false).unwrap();
        assert!(r.shape_complete());
        let by_name = |n: &str| r.node_shape(g.nodes.iter().position(|x| x.name == n).unwrap()).clone().unwrap();
        assert_eq!(by_name("conv_weight"), [4, 3, 3, 3]);
        assert_eq!(by_name("conv_bias"), [4]);
        assert_eq!(by_name("bn_moving_var"), [4]);
        assert_eq!(by_name("fc_weight"), [10, 4 * 8 * 8]);
        let (h, o) = g.heads[0];
        assert_eq!(r.shapes[r.offsets[h] + o], Some(vec![2, 10]));
    }

    #[test]
    fn shapes_of_float64_parameters_with_data_of_unknown_dtype() {
        let s = conv_bn_fc();
        let g = s.graph();
        let inputs = g.input_nodes();
        let mut shapes = vec![None; inputs.len()];
        shapes[0] = Some(vec![2, 3, 8, 8]);
        let mut dtypes = vec![None; inputs.len()];
        let w = inputs.iter().position(|&n| g.nodes[n].name == "conv_weight").unwrap();
        dtypes[w] = Some(DType::F64);
        let r = infer(&g, &shapes, &dtypes, false).unwrap();
        assert!(r.shape_complete());
        let conv = g.nodes.iter().position(|x| x.name == "conv_weight").unwrap();
        assert_eq!(r.node_shape(conv).clone().unwrap(), [4, 3, 3, 3]);
        assert_eq!(r.node_dtype(conv), Some(DType::F64));
    }

    #[test]
    fn partial_and_inconsistent() {
        let s = conv_bn_fc();
        let g = s.graph();
        let n = g.input_nodes().len();
        let r = infer(&g, &vec![None; n], &[], false).unwrap();
        assert!(!r.shape_complete());
        // A weight shape that contradicts the data.
        let mut shapes = vec![None; n];
        shapes[0] = Some(vec![2, 3, 8, 8]);
        shapes[1] = Some(vec![4, 5, 3, 3]);
        let e = infer(&g, &shapes, &[], false).err().unwrap().to_string();
        assert!(e.starts_with("MXNetError") && e.contains("conv_weight"), "{e}");
        // Data of known rank but unknown channels (Gluon's weight-shape probe, data (1, 0, 0, 0)):
        // the known dimensions of the parameters are still derived.
        let mut shapes = vec![None; n];
        shapes[0] = Some(vec![1, -1, -1, -1]);
        let r = infer(&g, &shapes, &[], false).unwrap();
        let by_name = |n: &str| r.node_shape(g.nodes.iter().position(|x| x.name == n).unwrap()).clone().unwrap();
        assert_eq!(by_name("conv_weight"), [4, -1, 3, 3]);
        assert_eq!(by_name("conv_bias"), [4]);
        // Partial shapes are carried forward (by probing the unknown dimensions): the
        // convolution's output is (1, 4, ?, ?), so the FullyConnected weight is (10, ?).
        assert_eq!(by_name("fc_weight"), [10, -1]);
        // __shape__ with an unknown dim (Gluon's deferred parameters).
        assert_eq!(parse_shape_attr("(10, 0)", false), Some(Some(vec![10, -1])));
        assert_eq!(parse_shape_attr("()", false), Some(None));
    }

    #[test]
    fn partial_forward_inference_and_given_attributes() {
        // slice of a (?, 20) variable: the sliced known axis is known, the unknown one stays
        // unknown even where a large probe would give a constant (`end` 5 on dim 0).
        let v = Symbol::variable("data");
        let mut sl = Symbol::atomic(lookup("slice").unwrap(), [("begin", "(None, 3)"), ("end", "(5, 10)")]).unwrap();
        sl.compose(&[&v], &[], Some("s")).unwrap();
        let g = sl.graph();
        let r = infer(&g, &[Some(vec![-1, 20])], &[], false).unwrap();
        assert_eq!(r.shapes[r.offsets[g.heads[0].0]], Some(vec![-1, 7]));
        // Element-wise operands merge dimension by dimension: (2, ?) + (?, 3) = (2, 3).
        let (a, b) = (Symbol::variable("a"), Symbol::variable("b"));
        let mut add = Symbol::atomic(lookup("elemwise_add").unwrap(), std::iter::empty()).unwrap();
        add.compose(&[&a, &b], &[], Some("add")).unwrap();
        let g = add.graph();
        let r = infer(&g, &[Some(vec![2, -1]), Some(vec![-1, 3])], &[], false).unwrap();
        assert!(r.shape_complete());
        // A given dtype wins over the variable's __dtype__ attribute.
        let x = Symbol::variable("x");
        x.outputs[0].node.inner.write().dict.insert("__dtype__".into(), "1".into());
        let g = x.graph();
        assert_eq!(infer(&g, &[], &[Some(DType::F32)], false).unwrap().node_dtype(0), Some(DType::F32));
        assert_eq!(infer(&g, &[], &[None], false).unwrap().node_dtype(0), Some(DType::F64));
    }

    #[test]
    fn dtypes() {
        let s = conv_bn_fc();
        let g = s.graph();
        let n = g.input_nodes().len();
        let mut dt = vec![None; n];
        dt[0] = Some(DType::F64);
        let r = infer(&g, &[], &dt, false).unwrap();
        assert!(r.dtype_complete());
        assert!(r.dtypes.iter().all(|d| *d == Some(DType::F64)));
        // An elementwise op unifies a known and an unknown input.
        let a = Symbol::variable("a");
        let b = Symbol::variable("b");
        let mut add = Symbol::atomic(lookup("elemwise_add").unwrap(), std::iter::empty()).unwrap();
        add.compose(&[&a, &b], &[], Some("add")).unwrap();
        let g = add.graph();
        let r = infer(&g, &[Some(vec![2, 3]), None], &[], false).unwrap();
        assert!(r.shape_complete());
    }
}
