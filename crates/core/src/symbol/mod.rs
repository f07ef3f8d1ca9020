//! Symbols: MXNet's symbolic graphs (nnvm's `Symbol`), their composition, attributes and
//! serialisation, and the flat [`Graph`] view the rest of the runtime executes.
//!
//! Owns: [`Symbol`] (a list of output [`Entry`]s into shared, mutable [`Node`]s, exactly as
//! nnvm shares nodes between symbols: `MXSymbolSetAttr` on one symbol is seen by every symbol
//! holding the node), composition ([`Symbol::compose`]: atomic composition fills an operator
//! node's inputs, creating `<node>_<argname>` variables for missing ones; general composition
//! replaces free variables), attributes (hidden keys such as `lr_mult` are stored as
//! `__lr_mult__`, as stock does), the stock naming of inputs and outputs, internals, children,
//! copies and `amp_cast` removal. Submodules: [`json`] (MXNet's JSON graph format, both ways)
//! and [`infer`] (shape and dtype inference, with the backward rules partial inference needs).
//!
//! **The graph API for executors** ([`Graph`], built with [`Symbol::graph`]):
//! - `graph.nodes`: every node reachable from the heads, in topological order (nnvm's
//!   post-order DFS, inputs in order), each a [`GNode`] with `op: Option<&'static OpDef>`
//!   (`None` = variable), `name`, the parsed `attrs: Option<Attrs>` (`None` for variables),
//!   the raw attribute strings `raw` (parameters and `__hidden__` attributes, sorted) and
//!   `inputs: Vec<(node index, output index)>`;
//! - `graph.heads`: the symbol's outputs as `(node index, output index)`;
//! - [`Graph::input_nodes`]: the variable nodes in `list_inputs` order (arguments and
//!   auxiliary states interleaved as they appear); [`Graph::arg_nodes`] and
//!   [`Graph::aux_nodes`] split them as `list_arguments` / `list_auxiliary_states` do
//!   (auxiliary = inputs an operator mutates, `OpDef::mutated_inputs`);
//! - [`Graph::num_outputs`] (all outputs of a node, visible or not) and
//!   [`Graph::entry_offsets`] (nnvm's `node_row_ptr`: entry id = offset[node] + output);
//! - [`Graph::to_symbol`] turns a (possibly rewritten) graph back into a symbol.

mod cse;
pub mod infer;
pub mod json;

use crate::error::{Error, Result};
use crate::op::{param::Attrs, Inputs, OpDef};
use crate::sync::{Mutex, RwLock};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Attribute keys stored as `__key__` (stock's kHiddenKeys).
pub const HIDDEN_KEYS: [&str; 6] =
    ["ctx_group", "lr_mult", "wd_mult", "force_mirroring", "mirror_stage", "profiler_scope"];

/// A node of a symbolic graph: an operator application or a variable.
pub struct Node {
    inner: RwLock<NodeData>,
    /// How many times an entry of this node has been stored among some node's inputs. Never
    /// decreased, so it bounds the number of consumers from above; composition's cycle check
    /// uses it to skip walking argument graphs that cannot contain the symbol's nodes. A plain
    /// counter: no other data is published through it.
    uses: AtomicUsize,
}

/// What a node holds.
#[derive(Clone)]
pub struct NodeData {
    /// `None` for a variable.
    pub op: Option<&'static OpDef>,
    pub name: String,
    /// Raw attributes: the operator's parameters as sent, and `__hidden__` attributes.
    pub dict: BTreeMap<String, String>,
    /// The parameters parsed with the operator's schema (operators only).
    pub attrs: Option<Attrs>,
    pub inputs: Vec<Entry>,
    /// Variables: how many times an operator mutating it was composed onto it.
    pub version: u32,
    /// A control-flow operator's graphs ([`OpDef::graph_inputs`]), in its order.
    pub subgraphs: Vec<Symbol>,
}

impl Node {
    fn new(data: NodeData) -> Arc<Node> {
        for e in &data.inputs {
            e.node.used();
        }
        Arc::new(Node { inner: RwLock::new(data), uses: AtomicUsize::new(0) })
    }
    /// Records that an entry of this node is about to be stored among another node's inputs.
    fn used(&self) {
        self.uses.fetch_add(1, Ordering::Relaxed);
    }
    /// A snapshot of the node.
    pub fn data(&self) -> NodeData {
        self.inner.read().clone()
    }
    pub fn name(&self) -> String {
        self.inner.read().name.clone()
    }
    pub fn op(&self) -> Option<&'static OpDef> {
        self.inner.read().op
    }
    pub fn is_variable(&self) -> bool {
        self.inner.read().op.is_none()
    }
    fn inputs(&self) -> Vec<Entry> {
        self.inner.read().inputs.clone()
    }
    /// All outputs (visible or not); 1 for a variable.
    pub fn num_outputs(&self) -> usize {
        let d = self.inner.read();
        match (d.op, &d.attrs) {
            (Some(op), Some(a)) => (op.num_outputs)(a),
            _ => 1,
        }
    }
    fn num_visible_outputs(&self) -> usize {
        let d = self.inner.read();
        match (d.op, &d.attrs) {
            (Some(op), Some(a)) => (op.num_visible_outputs)(a),
            _ => 1,
        }
    }
}

/// Dropping a graph whose last owner goes away frees it with a loop, not one nested drop per
/// node: a chain of 300k nodes (a JSON file, a long composition) would otherwise overflow the
/// stack. Each node's inputs are moved out to a work list; a node still shared elsewhere is
/// only released.
impl Drop for Node {
    fn drop(&mut self) {
        let mut pending: Vec<Entry> = std::mem::take(&mut self.inner.get_mut().inputs);
        while let Some(e) = pending.pop() {
            if let Some(node) = Arc::into_inner(e.node) {
                let mut node = node;
                pending.append(&mut node.inner.get_mut().inputs);
            }
        }
    }
}

/// One output of a node.
#[derive(Clone)]
pub struct Entry {
    pub node: Arc<Node>,
    pub index: usize,
    pub version: u32,
}

/// A symbol: a list of outputs of a graph of shared nodes.
#[derive(Clone, Default)]
pub struct Symbol {
    pub outputs: Vec<Entry>,
}

/// Which inputs `list_inputs` lists (stock's option codes 0, 1, 2).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum InputKind {
    All,
    Args,
    Aux,
}

impl InputKind {
    pub fn from_code(code: i32) -> Result<Self> {
        Ok(match code {
            0 => InputKind::All,
            1 => InputKind::Args,
            2 => InputKind::Aux,
            _ => {
                return Err(Error::value(format!(
                    "list input option must be 0 (all), 1 (arguments) or 2 (auxiliary states), got {code}"
                )))
            }
        })
    }
}

fn ptr(n: &Arc<Node>) -> usize {
    Arc::as_ptr(n) as usize
}

/// Post-order DFS from `heads` (inputs in order, each node once), as nnvm's DFSVisit.
fn dfs(heads: &[Entry]) -> Vec<Arc<Node>> {
    let mut seen = HashSet::new();
    let mut order = Vec::new();
    for h in heads {
        if !seen.insert(ptr(&h.node)) {
            continue;
        }
        // Stack of (node, its inputs, next input to visit).
        let mut stack: Vec<(Arc<Node>, Vec<Entry>, usize)> = vec![(h.node.clone(), h.node.inputs(), 0)];
        while let Some(top) = stack.last_mut() {
            if top.2 < top.1.len() {
                let child = top.1[top.2].node.clone();
                top.2 += 1;
                if seen.insert(ptr(&child)) {
                    let ins = child.inputs();
                    stack.push((child, ins, 0));
                }
            } else {
                let (n, _, _) = stack.pop().expect("non-empty");
                order.push(n);
            }
        }
    }
    order
}

/// The parameter names of an operator's tensor inputs for a call with these attributes
/// (`None`: variadic without a count, inputs only positional).
fn input_names(op: &OpDef, attrs: &Attrs) -> Result<Option<Vec<String>>> {
    if let Some(names) = op.input_names_of {
        return names(attrs).map(Some);
    }
    Ok(match op.inputs {
        Inputs::Variadic(_) if op.key_var_num_args.is_empty() => None,
        Inputs::Variadic(_) => Some((0..op.num_inputs(attrs, 0)?).map(|i| format!("arg{i}")).collect()),
        named => named.names_for(attrs).map(|v| v.iter().map(|s| s.to_string()).collect()),
    })
}

/// The name of output `index` of operator node `node`: `<node>_<output name>` (`output` for
/// a single-output operator, `output<i>` otherwise unless the operator names them).
pub fn output_name(op: &OpDef, attrs: Option<&Attrs>, node: &str, index: usize) -> String {
    let nout = attrs.map_or(1, |a| (op.num_outputs)(a));
    let r = match op.output_names.get(index) {
        Some(name) => name.to_string(),
        None if nout == 1 => "output".to_string(),
        _ => format!("output{index}"),
    };
    if node.is_empty() {
        r
    } else {
        format!("{node}_{r}")
    }
}

/// The name of input `index` of operator node `node`, as stock's executor monitor reports it:
/// `<node>_<parameter name>` (`input<i>` where the operator does not name its inputs).
pub fn input_label(op: &OpDef, attrs: &Attrs, node: &str, index: usize) -> String {
    let named = (!op.unnamed_inputs).then(|| input_names(op, attrs).ok().flatten()).flatten();
    let named = named.and_then(|v| v.get(index).cloned());
    format!("{node}_{}", named.unwrap_or_else(|| format!("input{index}")))
}

/// `key` as stored: a hidden key becomes `__key__`; a key that merely ends in one (the
/// deprecated `weight_lr_mult` style) is an error, as stock.
fn stored_key(key: &str, value: &str) -> Result<String> {
    for k in HIDDEN_KEYS {
        if key == k {
            return Ok(format!("__{key}__"));
        }
        if key.len() > k.len() && key.ends_with(k) && !key.starts_with("__") {
            let prefix = key[..key.len() - k.len()].trim_end_matches('_');
            return Err(Error::mxnet(format!(
                "setting variable attributes with {key} is deprecated. please instead use\nw = Variable({k}={value})\nsym = YourSymbolName({prefix}=w)"
            )));
        }
    }
    Ok(key.to_string())
}

fn parse_dict(op: &'static OpDef, dict: &BTreeMap<String, String>, num_inputs: usize) -> Result<Attrs> {
    op.parse_attrs(dict.iter().map(|(k, v)| (k.as_str(), v.as_str())), num_inputs)
        .map_err(crate::op::invoke::stock_class)
}

/// How many levels of control flow may nest (a loop in a loop ...): graphs are built, inferred
/// and run recursively, level by level.
pub const MAX_NESTING: usize = 16;

/// A control-flow node's graphs must be the ones its parameters describe: as many as the
/// operator takes, each with the inputs its locations place and the outputs it must give.
pub(crate) fn check_subgraphs(op: &OpDef, attrs: &Attrs, node: &str, graphs: &[&Graph]) -> Result<()> {
    let Some(of) = op.control_flow else {
        if graphs.is_empty() {
            return Ok(());
        }
        return Err(Error::mxnet(format!("node {node}: operator {} takes no graphs", op.name)));
    };
    let cf = of(attrs).map_err(|e| Error::new(e.kind(), format!("node {node}: {}", e.message())))?;
    if graphs.len() != cf.num_graphs() {
        return Err(Error::mxnet(format!(
            "node {node}: operator {} takes {} graphs ({}), got {}",
            op.name,
            cf.num_graphs(),
            op.graph_inputs.join(", "),
            graphs.len()
        )));
    }
    for (((g, locs), nout), what) in
        graphs.iter().zip(cf.graph_input_locs()).zip(cf.graph_outputs()).zip(op.graph_inputs)
    {
        let nin = g.input_nodes().len();
        if nin != locs.len() || g.heads.len() != nout {
            return Err(Error::mxnet(format!(
                "node {node}: operator {}'s graph {what} has {nin} inputs and {} outputs; its parameters give it {} \
                 inputs and {nout} outputs",
                op.name,
                g.heads.len(),
                locs.len()
            )));
        }
    }
    Ok(())
}

/// [`check_subgraphs`], and the node's `n_inputs` tensor inputs are the ones its parameters
/// give it (a composed node whose parameters `set_attr` may change).
pub(crate) fn check_control_flow(
    op: &OpDef,
    attrs: &Attrs,
    node: &str,
    graphs: &[&Graph],
    n_inputs: usize,
) -> Result<()> {
    check_subgraphs(op, attrs, node, graphs)?;
    let want = op.num_inputs(attrs, n_inputs)?;
    if want != n_inputs {
        return Err(Error::mxnet(format!(
            "node {node} ({}): its parameters give it {want} inputs, it has {n_inputs}",
            op.name
        )));
    }
    Ok(())
}

/// Attributes an operator sets on its variable inputs at composition (stock's
/// FSetInputVarAttrOnCompose, [`OpDef::input_inits`]): BatchNorm's moving statistics get their
/// initialisers.
fn set_input_var_attrs(op: &OpDef, inputs: &[Entry]) {
    for &(k, init) in op.input_inits {
        if let Some(e) = inputs.get(k) {
            let mut v = e.node.inner.write();
            if v.op.is_none() && !v.dict.contains_key("__init__") {
                v.dict.insert("__init__".to_string(), init.to_string());
            }
        }
    }
}

/// Per-operator counters for automatic node names (`fullyconnected0`, ...).
fn auto_name(op: &OpDef) -> String {
    static COUNTERS: Mutex<Option<HashMap<String, usize>>> = Mutex::new(None);
    let base = op.name.to_lowercase();
    let mut g = COUNTERS.lock();
    let c = g.get_or_insert_with(HashMap::new).entry(base.clone()).or_insert(0);
    let name = format!("{base}{c}");
    *c += 1;
    name
}

impl Symbol {
    /// A variable.
    pub fn variable(name: &str) -> Symbol {
        let n = Node::new(NodeData {
            op: None,
            name: name.to_string(),
            dict: BTreeMap::new(),
            attrs: None,
            inputs: Vec::new(),
            version: 0,
            subgraphs: Vec::new(),
        });
        Symbol { outputs: vec![Entry { node: n, index: 0, version: 0 }] }
    }

    /// An operator node without inputs yet (compose fills them). Parameters are validated
    /// with the operator's schema and kept as sent; hidden keys become `__key__`.
    pub fn atomic<'a>(op: &'static OpDef, kv: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<Symbol> {
        let mut dict = BTreeMap::new();
        for (k, v) in kv {
            dict.insert(stored_key(k, v)?, v.to_string());
        }
        let attrs = parse_dict(op, &dict, 0)?;
        let n = Node::new(NodeData {
            op: Some(op),
            name: String::new(),
            dict,
            attrs: Some(attrs),
            inputs: Vec::new(),
            version: 0,
            subgraphs: Vec::new(),
        });
        let nout = n.num_visible_outputs();
        Ok(Symbol { outputs: (0..nout).map(|i| Entry { node: n.clone(), index: i, version: 0 }).collect() })
    }

    /// Several symbols' outputs as one symbol.
    pub fn group(symbols: &[&Symbol]) -> Symbol {
        Symbol { outputs: symbols.iter().flat_map(|s| s.outputs.iter().cloned()).collect() }
    }

    /// Nodes reachable from the outputs, in topological order.
    pub fn topo_nodes(&self) -> Vec<Arc<Node>> {
        dfs(&self.outputs)
    }

    fn single_node(&self) -> Option<Arc<Node>> {
        let first = self.outputs.first()?;
        self.outputs.iter().all(|e| Arc::ptr_eq(&e.node, &first.node)).then(|| first.node.clone())
    }

    fn is_atomic(&self) -> bool {
        self.single_node().is_some_and(|n| n.inner.read().inputs.is_empty())
    }

    /// Compose in place: positional `args` or keyword `kwargs` become the inputs (see the
    /// module doc); `name` names the node (an operator node left unnamed gets
    /// `<op lowercase><counter>`).
    pub fn compose(&mut self, args: &[&Symbol], kwargs: &[(&str, &Symbol)], name: Option<&str>) -> Result<()> {
        if self.outputs.is_empty() {
            return Err(Error::mxnet("Symbol.Compose: cannot compose an empty symbol"));
        }
        let graph_op = self.single_node().and_then(|n| n.op()).filter(|op| !op.graph_inputs.is_empty());
        if let Some(op) = graph_op.filter(|_| self.is_atomic()) {
            return self.compose_with_graphs(op, args, kwargs, name);
        }
        self.compose_tensors(args, kwargs, name)
    }

    /// [`Symbol::compose`] with tensor arguments only.
    fn compose_tensors(&mut self, args: &[&Symbol], kwargs: &[(&str, &Symbol)], name: Option<&str>) -> Result<()> {
        for (i, a) in args.iter().enumerate() {
            if a.outputs.len() != 1 {
                return Err(Error::mxnet(format!(
                    "Symbol.Compose: argument {i} is a tuple ({} outputs), single value is required",
                    a.outputs.len()
                )));
            }
        }
        for (k, a) in kwargs {
            if a.outputs.len() != 1 {
                return Err(Error::mxnet(format!(
                    "Symbol.Compose: keyword argument {k} is a tuple ({} outputs), single value is required",
                    a.outputs.len()
                )));
            }
        }
        let node = self.outputs[0].node.clone();
        self.check_acyclic(args.iter().copied().chain(kwargs.iter().map(|(_, s)| *s)))?;
        let name = name.filter(|n| !n.is_empty());
        if let Some(n) = name {
            node.inner.write().name = n.to_string();
        }
        if self.is_atomic() {
            self.compose_atomic(&node, args, kwargs)
        } else {
            self.compose_general(args, kwargs)
        }
    }

    /// Atomic composition of a control-flow operator: its leading arguments (positional, or by
    /// their names) are graphs, which the node keeps apart from its inputs (stock's
    /// FInputGraph); the rest compose as usual. The graphs must match the parameters.
    fn compose_with_graphs(
        &mut self,
        op: &'static OpDef,
        args: &[&Symbol],
        kwargs: &[(&str, &Symbol)],
        name: Option<&str>,
    ) -> Result<()> {
        let k = op.graph_inputs.len();
        let mut graphs: Vec<Symbol> = args.iter().take(k).map(|s| (*s).clone()).collect();
        for want in &op.graph_inputs[graphs.len()..] {
            let (_, s) = kwargs.iter().find(|(key, _)| key == want).ok_or_else(|| {
                Error::mxnet(format!(
                    "operator {}: its graph argument {want} is missing (arguments {} are graphs)",
                    op.name,
                    op.graph_inputs.join(", ")
                ))
            })?;
            graphs.push((*s).clone());
        }
        let rest: Vec<(&str, &Symbol)> =
            kwargs.iter().filter(|(key, _)| !op.graph_inputs.contains(key)).map(|(key, s)| (*key, *s)).collect();
        let node = self.outputs[0].node.clone();
        let flat: Vec<Graph> = graphs.iter().map(Symbol::graph).collect();
        if let Some(deep) = flat.iter().map(Graph::nesting).max().filter(|&d| d >= MAX_NESTING) {
            return Err(Error::mxnet(format!(
                "operator {}: its graphs nest control flow {deep} deep; at most {} levels are supported",
                op.name,
                MAX_NESTING - 1
            )));
        }
        // The node keeps its own copies: nothing the caller holds can later compose one of
        // its nodes onto the node itself (a cycle through a graph).
        let graphs: Vec<Symbol> = flat.iter().map(Graph::to_symbol).collect();
        {
            let d = node.inner.read();
            let attrs = d.attrs.as_ref().expect("operator nodes have parsed attributes");
            let refs: Vec<&Graph> = flat.iter().collect();
            check_subgraphs(op, attrs, if d.name.is_empty() { op.name } else { &d.name }, &refs)?;
        }
        self.compose_tensors(&args[k.min(args.len())..], &rest, name)?;
        node.inner.write().subgraphs = graphs;
        Ok(())
    }

    /// A composition must not make the graph cyclic: no argument may reach one of this
    /// symbol's operator nodes. An argument graph can reach one only through its head or
    /// through a node outside this symbol that consumes one of them, so the argument graphs
    /// are walked only when some operator node here has more uses than this symbol's own nodes
    /// account for. Composing a fresh operator onto a long chain (`y = relu(y)`) then costs
    /// the size of the operator, not of the chain.
    fn check_acyclic<'s>(&self, args: impl Iterator<Item = &'s Symbol> + Clone) -> Result<()> {
        let own_nodes: Vec<Arc<Node>> = self.topo_nodes().into_iter().filter(|n| !n.is_variable()).collect();
        let own: HashSet<usize> = own_nodes.iter().map(ptr).collect();
        let mut internal: HashMap<usize, usize> = HashMap::new();
        for n in &own_nodes {
            for e in n.inner.read().inputs.iter().filter(|e| own.contains(&ptr(&e.node))) {
                *internal.entry(ptr(&e.node)).or_insert(0) += 1;
            }
        }
        let shared =
            own_nodes.iter().any(|n| n.uses.load(Ordering::Relaxed) > internal.get(&ptr(n)).copied().unwrap_or(0));
        let cyclic = args.clone().any(|a| own.contains(&ptr(&a.outputs[0].node)))
            || (shared && args.into_iter().any(|a| a.topo_nodes().iter().any(|n| own.contains(&ptr(n)))));
        if cyclic {
            return Err(Error::mxnet(
                "Symbol.Compose: an argument depends on the symbol being composed (the graph would be cyclic)",
            ));
        }
        Ok(())
    }

    fn compose_atomic(&self, node: &Arc<Node>, args: &[&Symbol], kwargs: &[(&str, &Symbol)]) -> Result<()> {
        let mut d = node.inner.write();
        let Some(op) = d.op else {
            if args.is_empty() && kwargs.is_empty() {
                return Ok(());
            }
            return Err(Error::mxnet(format!("Symbol.Compose: variable {} takes no inputs", d.name)));
        };
        if d.name.is_empty() {
            d.name = auto_name(op);
        }
        let attrs = d.attrs.clone().expect("operator nodes have parsed attributes");
        let mut inputs: Vec<Entry> = Vec::new();
        match input_names(op, &attrs)? {
            None => {
                if !kwargs.is_empty() {
                    return Err(Error::mxnet(format!(
                        "operator {}: variable length inputs do not accept keyword arguments",
                        op.name
                    )));
                }
                inputs.extend(args.iter().map(|a| a.outputs[0].clone()));
            }
            Some(names) => {
                if args.len() > names.len() {
                    return Err(Error::mxnet(format!(
                        "operator {} ({}): incorrect number of arguments, requires {}, provided {}",
                        op.name,
                        d.name,
                        names.len(),
                        args.len()
                    )));
                }
                inputs.extend(args.iter().map(|a| a.outputs[0].clone()));
                let mut matched = 0;
                for arg in &names[args.len()..] {
                    if let Some((_, s)) = kwargs.iter().find(|(k, _)| k == arg) {
                        inputs.push(s.outputs[0].clone());
                        matched += 1;
                    } else {
                        let v = Symbol::variable(&format!("{}_{arg}", d.name));
                        v.outputs[0].node.inner.write().dict = d.dict.clone();
                        inputs.push(v.outputs[0].clone());
                    }
                }
                // As nnvm's Compose: keyword symbols are matched only when the positional
                // ones leave inputs open, so extra ones beside a full set (or given to an
                // operator without inputs, as `sym.random.randn(data=...)` does) are ignored.
                if matched != kwargs.len() && args.len() != names.len() {
                    let bad: Vec<&str> = kwargs
                        .iter()
                        .map(|(k, _)| *k)
                        .filter(|k| !names[args.len()..].iter().any(|n| n == k))
                        .collect();
                    return Err(Error::mxnet(format!(
                        "Symbol.Compose: keyword argument name {} not found for operator {} ({}); candidate arguments: [{}]",
                        bad.join(", "),
                        op.name,
                        d.name,
                        names[args.len()..].join(", ")
                    )));
                }
            }
        }
        d.attrs = Some(parse_dict(op, &d.dict, inputs.len())?);
        set_input_var_attrs(op, &inputs);
        for e in &inputs {
            e.node.used();
        }
        d.inputs = inputs;
        update_versions(&mut d)
    }

    fn compose_general(&self, args: &[&Symbol], kwargs: &[(&str, &Symbol)]) -> Result<()> {
        let nodes = self.topo_nodes();
        let mut replace: HashMap<usize, Entry> = HashMap::new();
        let (mut positional, mut matched) = (0, 0);
        for n in nodes.iter().filter(|n| n.is_variable()) {
            if positional < args.len() {
                replace.insert(ptr(n), args[positional].outputs[0].clone());
                positional += 1;
            } else if let Some((_, s)) = kwargs.iter().find(|(k, _)| *k == n.name()) {
                replace.insert(ptr(n), s.outputs[0].clone());
                matched += 1;
            }
        }
        if matched != kwargs.len() || positional < args.len() {
            let names: Vec<String> = nodes.iter().filter(|n| n.is_variable()).map(|n| n.name()).collect();
            return Err(Error::mxnet(format!(
                "Symbol.Compose: {} arguments do not match the free variables [{}]",
                if positional < args.len() { "too many positional" } else { "keyword" },
                names.join(", ")
            )));
        }
        for n in nodes.iter().filter(|n| !n.is_variable()) {
            let mut d = n.inner.write();
            let mut touched = false;
            for e in d.inputs.iter_mut() {
                if let Some(r) = replace.get(&ptr(&e.node)) {
                    r.node.used();
                    *e = r.clone();
                    touched = true;
                }
            }
            if touched {
                update_versions(&mut d)?;
            }
        }
        Ok(())
    }

    /// Input variables (`list_inputs` order) of the given kind.
    pub fn list_inputs(&self, kind: InputKind) -> Vec<Arc<Node>> {
        let nodes = self.topo_nodes();
        if kind == InputKind::All {
            return nodes.into_iter().filter(|n| n.is_variable()).collect();
        }
        let mutated = mutated_inputs(&nodes);
        nodes
            .into_iter()
            .filter(|n| n.is_variable() && (mutated.contains(&ptr(n)) == (kind == InputKind::Aux)))
            .collect()
    }

    pub fn list_input_names(&self, kind: InputKind) -> Vec<String> {
        self.list_inputs(kind).iter().map(|n| n.name()).collect()
    }

    /// Output names: a variable's name, else `<node>_<output name>` (`output` for a
    /// single-output operator, `output<i>` otherwise unless the operator names them).
    pub fn list_outputs(&self) -> Vec<String> {
        self.outputs
            .iter()
            .map(|e| {
                let d = e.node.inner.read();
                match d.op {
                    None => d.name.clone(),
                    Some(op) => output_name(op, d.attrs.as_ref(), &d.name, e.index),
                }
            })
            .collect()
    }

    /// `name`, `op_name`, `_value_index` or a raw attribute of the symbol's single node.
    pub fn get_attr(&self, key: &str) -> Option<String> {
        let node = self.single_node()?;
        let d = node.inner.read();
        match key {
            "name" => Some(d.name.clone()),
            "op_name" => Some(d.op.map_or("null", |o| o.name).to_string()),
            "_value_index" => Some(self.outputs.iter().map(|e| e.index.to_string()).collect::<Vec<_>>().join(", ")),
            _ => {
                d.dict.get(key).cloned().or_else(|| {
                    HIDDEN_KEYS.contains(&key).then(|| d.dict.get(&format!("__{key}__")).cloned()).flatten()
                })
            }
        }
    }

    /// Set an attribute of the symbol's single node (`name` renames it); an operator
    /// parameter is re-validated.
    pub fn set_attr(&self, key: &str, value: &str) -> Result<()> {
        let node =
            self.single_node().ok_or_else(|| Error::mxnet("Symbol.SetAttr only works for non-grouped symbols"))?;
        let key = stored_key(key, value)?;
        let mut d = node.inner.write();
        if key == "name" {
            d.name = value.to_string();
            return Ok(());
        }
        let mut dict = d.dict.clone();
        dict.insert(key, value.to_string());
        if let Some(op) = d.op {
            let attrs = parse_dict(op, &dict, d.inputs.len())?;
            if op.control_flow.is_some() && !d.subgraphs.is_empty() {
                // A control-flow node's parameters must still fit its graphs and inputs.
                let flat: Vec<Graph> = d.subgraphs.iter().map(Symbol::graph).collect();
                let refs: Vec<&Graph> = flat.iter().collect();
                check_control_flow(op, &attrs, &d.name, &refs, d.inputs.len())?;
            }
            d.attrs = Some(attrs);
        }
        d.dict = dict;
        Ok(())
    }

    /// `(key, value)` of the first output's node, with `lr_mult` style aliases of hidden keys.
    pub fn list_attr_shallow(&self) -> Vec<(String, String)> {
        let Some(e) = self.outputs.first() else { return Vec::new() };
        let d = e.node.inner.read();
        let mut out = Vec::new();
        for (k, v) in &d.dict {
            out.push((k.clone(), v.clone()));
            if let Some(short) = hidden_alias(k) {
                out.push((short.to_string(), v.clone()));
            }
        }
        out
    }

    /// `(node$key, value)` over every node, in topological order.
    pub fn list_attr_recursive(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for n in self.topo_nodes() {
            let d = n.inner.read();
            for (k, v) in &d.dict {
                out.push((format!("{}${k}", d.name), v.clone()));
                if let Some(short) = hidden_alias(k) {
                    out.push((format!("{}${short}", d.name), v.clone()));
                }
            }
        }
        out
    }

    /// Every node's visible outputs (variables: themselves), in topological order.
    pub fn internals(&self) -> Symbol {
        let mut outputs = Vec::new();
        for n in self.topo_nodes() {
            let (nout, version) = (n.num_visible_outputs(), n.inner.read().version);
            for i in 0..nout {
                outputs.push(Entry { node: n.clone(), index: i, version: if n.is_variable() { version } else { 0 } });
            }
        }
        Symbol { outputs }
    }

    /// The inputs of the output nodes (each node once).
    pub fn children(&self) -> Symbol {
        let mut seen = HashSet::new();
        let mut outputs = Vec::new();
        for e in &self.outputs {
            if seen.insert(ptr(&e.node)) {
                outputs.extend(e.node.inputs());
            }
        }
        Symbol { outputs }
    }

    pub fn output(&self, index: usize) -> Result<Symbol> {
        let e = self.outputs.get(index).ok_or_else(|| {
            Error::index(format!("output index {index} out of range: the symbol has {} outputs", self.outputs.len()))
        })?;
        Ok(Symbol { outputs: vec![e.clone()] })
    }

    /// Stock's `MXSymbolCutSubgraph`, how the frontend makes a control-flow graph: the nodes
    /// marked with the output node's `__subgraph_name__` are the graph; each of their inputs
    /// produced by an unmarked node is replaced, in place, by a new variable named as that
    /// output (one variable per distinct output). Returns the outputs cut off, one per input
    /// replaced, in the order found (empty when the output node is unmarked).
    pub fn cut_subgraph(&self) -> Vec<Symbol> {
        const KEY: &str = "__subgraph_name__";
        let Some(mark) = self.outputs.first().and_then(|e| e.node.inner.read().dict.get(KEY).cloned()) else {
            return Vec::new();
        };
        let marked = |n: &Node| n.inner.read().dict.get(KEY) == Some(&mark);
        let mut cut: Vec<Symbol> = Vec::new();
        let mut made: HashMap<(usize, usize), Arc<Node>> = HashMap::new();
        for n in self.topo_nodes() {
            if !marked(&n) {
                continue;
            }
            let inputs = n.inputs();
            let mut replaced = inputs.clone();
            for (j, e) in inputs.iter().enumerate() {
                if marked(&e.node) {
                    continue;
                }
                let orig = Symbol { outputs: vec![e.clone()] };
                let var = made
                    .entry((ptr(&e.node), e.index))
                    .or_insert_with(|| {
                        let name = orig.list_outputs().pop().unwrap_or_default();
                        Symbol::variable(&name).outputs[0].node.clone()
                    })
                    .clone();
                var.used();
                replaced[j] = Entry { node: var, index: 0, version: 0 };
                cut.push(orig);
            }
            n.inner.write().inputs = replaced;
        }
        cut
    }

    /// An operator symbol without inputs with the operator, name and attributes of this
    /// symbol's node (every output must be that node's), as stock's
    /// `MXGenAtomicSymbolFromSymbol`.
    pub fn atomic_copy(&self) -> Result<Symbol> {
        let node = self
            .single_node()
            .ok_or_else(|| Error::mxnet("Generating atomic symbol with other node is not supported."))?;
        let d = node.data();
        if d.op.is_none() {
            return Err(Error::mxnet(format!("{} is a variable, not an operator", d.name)));
        }
        let n = Node::new(NodeData { inputs: Vec::new(), version: 0, ..d });
        let nout = n.num_visible_outputs();
        Ok(Symbol { outputs: (0..nout).map(|i| Entry { node: n.clone(), index: i, version: 0 }).collect() })
    }

    /// A deep copy: new nodes, same structure and attributes.
    pub fn deep_copy(&self) -> Symbol {
        self.graph().to_symbol()
    }

    /// A copy without AMP casts ([`crate::op::OpDef::amp_cast`]: `amp_cast`, `amp_multicast`;
    /// their consumers read their inputs).
    pub fn remove_amp_cast(&self) -> Symbol {
        let mut g = self.graph();
        let target = |g: &Graph, (mut n, mut i): (usize, usize)| loop {
            match g.nodes[n].op {
                Some(op) if op.amp_cast && i < g.nodes[n].inputs.len() => (n, i) = g.nodes[n].inputs[i],
                _ => return (n, i),
            }
        };
        for k in 0..g.nodes.len() {
            let ins: Vec<(usize, usize)> = g.nodes[k].inputs.iter().map(|&e| target(&g, e)).collect();
            g.nodes[k].inputs = ins;
        }
        g.heads = g.heads.iter().map(|&e| target(&g, e)).collect();
        g.to_symbol()
    }

    /// The flat view of this symbol's graph (see the module doc).
    pub fn graph(&self) -> Graph {
        let nodes = self.topo_nodes();
        let index: HashMap<usize, usize> = nodes.iter().enumerate().map(|(i, n)| (ptr(n), i)).collect();
        let gnodes = nodes
            .iter()
            .map(|n| {
                let d = n.inner.read();
                GNode {
                    op: d.op,
                    name: d.name.clone(),
                    attrs: d.attrs.clone(),
                    raw: d.dict.clone(),
                    inputs: d.inputs.iter().map(|e| (index[&ptr(&e.node)], e.index)).collect(),
                    input_versions: d.inputs.iter().map(|e| e.version).collect(),
                    subgraphs: d.subgraphs.iter().map(|s| Arc::new(s.graph())).collect(),
                }
            })
            .collect();
        let heads = self.outputs.iter().map(|e| (index[&ptr(&e.node)], e.index)).collect();
        Graph { nodes: gnodes, heads }
    }

    /// nnvm's `Symbol::Print` text.
    pub fn print(&self) -> String {
        let mut s = String::from("Symbol Outputs:\n");
        for (i, e) in self.outputs.iter().enumerate() {
            s += &format!("\toutput[{i}]={}({})\n", e.node.name(), e.index);
        }
        for n in self.topo_nodes() {
            let d = n.inner.read();
            match d.op {
                None => s += &format!("Variable:{}\n", d.name),
                Some(op) => {
                    s += &format!("--------------------\nOp:{}, Name={}\nInputs:\n", op.name, d.name);
                    for (i, e) in d.inputs.iter().enumerate() {
                        s += &format!("\targ[{i}]={}({}) version={}\n", e.node.name(), e.index, e.version);
                    }
                    if !d.dict.is_empty() {
                        s += "Attrs:\n";
                        for (k, v) in &d.dict {
                            s += &format!("\t{k}={v}\n");
                        }
                    }
                }
            }
        }
        s
    }
}

fn hidden_alias(key: &str) -> Option<&'static str> {
    HIDDEN_KEYS.iter().copied().find(|k| {
        key.len() == k.len() + 4 && key.starts_with("__") && key.ends_with("__") && &key[2..key.len() - 2] == *k
    })
}

/// Variables some operator among `nodes` mutates.
fn mutated_inputs(nodes: &[Arc<Node>]) -> HashSet<usize> {
    let mut set = HashSet::new();
    for n in nodes {
        let d = n.inner.read();
        if let Some(op) = d.op {
            for i in op.mutated_inputs_of(d.attrs.as_ref(), d.inputs.len()) {
                if let Some(e) = d.inputs.get(i) {
                    set.insert(ptr(&e.node));
                }
            }
        }
    }
    set
}

/// nnvm's UpdateNodeVersion: entries of variables take the variable's version; a mutated
/// input (which must be a variable) gets a new one.
fn update_versions(d: &mut NodeData) -> Result<()> {
    for e in d.inputs.iter_mut() {
        let v = e.node.inner.read();
        if v.op.is_none() {
            e.version = v.version;
        }
    }
    if let Some(op) = d.op {
        for i in op.mutated_inputs_of(d.attrs.as_ref(), d.inputs.len()) {
            let Some(e) = d.inputs.get_mut(i) else { continue };
            let mut v = e.node.inner.write();
            if v.op.is_some() {
                return Err(Error::mxnet(format!(
                    "operator {} ({}) mutates its input {i}, which must be a variable, not the output of {}",
                    op.name, d.name, v.name
                )));
            }
            v.version += 1;
            e.version = v.version;
        }
    }
    Ok(())
}

impl Symbol {
    /// A recorded history as a symbol (`autograd.get_symbol`), named as stock names it: marked
    /// variables `var<i>`, inputs that were in no graph `null<i>`, calls `node_<i>` with their
    /// parameters (those not at their defaults).
    pub fn from_history(h: &crate::autograd::History) -> Symbol {
        use crate::autograd::HistoryNode;
        let (mut vars, mut nulls, mut calls) = (0usize, 0usize, 0usize);
        let nodes = h
            .nodes
            .iter()
            .map(|n| match n {
                HistoryNode::Variable { marked } => {
                    let name = if *marked {
                        vars += 1;
                        format!("var{}", vars - 1)
                    } else {
                        nulls += 1;
                        format!("null{}", nulls - 1)
                    };
                    GNode {
                        op: None,
                        name,
                        attrs: None,
                        raw: BTreeMap::new(),
                        inputs: Vec::new(),
                        input_versions: Vec::new(),
                        subgraphs: Vec::new(),
                    }
                }
                HistoryNode::Call { op, attrs, inputs } => {
                    calls += 1;
                    GNode {
                        op: Some(op),
                        name: format!("node_{}", calls - 1),
                        attrs: Some(attrs.clone()),
                        raw: attrs.to_kv().into_iter().collect(),
                        inputs: inputs.clone(),
                        input_versions: vec![0; inputs.len()],
                        subgraphs: Vec::new(),
                    }
                }
            })
            .collect();
        Graph { nodes, heads: vec![h.head] }.to_symbol()
    }
}

/// A node of a [`Graph`].
#[derive(Clone)]
pub struct GNode {
    /// `None` for a variable.
    pub op: Option<&'static OpDef>,
    pub name: String,
    /// Parsed parameters (operators only).
    pub attrs: Option<Attrs>,
    /// Raw attributes as saved in JSON: parameters as sent and `__hidden__` attributes.
    pub raw: BTreeMap<String, String>,
    /// `(node index, output index)` per input; node indices are smaller than this node's.
    pub inputs: Vec<(usize, usize)>,
    /// nnvm's entry versions (saved in JSON).
    pub input_versions: Vec<u32>,
    /// A control-flow operator's graphs ([`NodeData::subgraphs`]).
    pub subgraphs: Vec<Arc<Graph>>,
}

impl GNode {
    pub fn is_variable(&self) -> bool {
        self.op.is_none()
    }
}

/// A symbol's graph, flat and in topological order (see the module doc).
#[derive(Clone)]
pub struct Graph {
    pub nodes: Vec<GNode>,
    pub heads: Vec<(usize, usize)>,
}

impl Graph {
    /// All outputs of node `i` (visible or not; 1 for a variable).
    pub fn num_outputs(&self, i: usize) -> usize {
        match (&self.nodes[i].op, &self.nodes[i].attrs) {
            (Some(op), Some(a)) => (op.num_outputs)(a),
            _ => 1,
        }
    }

    /// nnvm's node_row_ptr: the entry id of output `k` of node `i` is `offsets[i] + k`;
    /// the last element is the number of entries.
    pub fn entry_offsets(&self) -> Vec<usize> {
        let mut v = Vec::with_capacity(self.nodes.len() + 1);
        let mut acc = 0;
        v.push(0);
        for i in 0..self.nodes.len() {
            acc += self.num_outputs(i);
            v.push(acc);
        }
        v
    }

    /// How deeply control flow nests in this graph: 0 without control-flow nodes, else one
    /// more than the deepest of their graphs.
    pub fn nesting(&self) -> usize {
        self.nodes.iter().flat_map(|n| &n.subgraphs).map(|g| 1 + g.nesting()).max().unwrap_or(0)
    }

    /// Variable nodes in `list_inputs` order.
    pub fn input_nodes(&self) -> Vec<usize> {
        (0..self.nodes.len()).filter(|&i| self.nodes[i].is_variable()).collect()
    }

    /// Variable nodes some operator mutates (auxiliary states).
    pub fn mutable_nodes(&self) -> HashSet<usize> {
        let mut set = HashSet::new();
        for n in &self.nodes {
            if let Some(op) = n.op {
                for i in op.mutated_inputs_of(n.attrs.as_ref(), n.inputs.len()) {
                    if let Some(&(src, _)) = n.inputs.get(i) {
                        set.insert(src);
                    }
                }
            }
        }
        set
    }

    /// Argument nodes (`list_arguments` order).
    pub fn arg_nodes(&self) -> Vec<usize> {
        let m = self.mutable_nodes();
        self.input_nodes().into_iter().filter(|i| !m.contains(i)).collect()
    }

    /// Auxiliary-state nodes (`list_auxiliary_states` order).
    pub fn aux_nodes(&self) -> Vec<usize> {
        let m = self.mutable_nodes();
        self.input_nodes().into_iter().filter(|i| m.contains(i)).collect()
    }

    /// A symbol over new nodes with this graph's structure. Inputs must refer to earlier
    /// nodes (as they do in every graph built here or loaded from JSON).
    pub fn to_symbol(&self) -> Symbol {
        let mut made: Vec<Arc<Node>> = Vec::with_capacity(self.nodes.len());
        let mut var_versions = vec![0u32; self.nodes.len()];
        for n in &self.nodes {
            for (k, &(src, _)) in n.inputs.iter().enumerate() {
                let v = n.input_versions.get(k).copied().unwrap_or(0);
                var_versions[src] = var_versions[src].max(v);
            }
        }
        for (i, n) in self.nodes.iter().enumerate() {
            let inputs = n
                .inputs
                .iter()
                .enumerate()
                .map(|(k, &(src, idx))| Entry {
                    node: made[src].clone(),
                    index: idx,
                    version: n.input_versions.get(k).copied().unwrap_or(0),
                })
                .collect();
            made.push(Node::new(NodeData {
                op: n.op,
                name: n.name.clone(),
                dict: n.raw.clone(),
                attrs: n.attrs.clone(),
                inputs,
                version: if n.op.is_none() { var_versions[i] } else { 0 },
                subgraphs: n.subgraphs.iter().map(|g| g.to_symbol()).collect(),
            }));
        }
        Symbol {
            outputs: self.heads.iter().map(|&(n, i)| Entry { node: made[n].clone(), index: i, version: 0 }).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::lookup;

    /// A chain of 200k nodes loaded from JSON is freed without overflowing the stack.
    #[test]
    fn a_deep_chain_is_freed_with_a_loop() {
        let n = 200_000;
        let mut json = String::from(r#"{"nodes": [{"op": "null", "name": "x", "inputs": []}"#);
        for i in 1..=n {
            json.push_str(&format!(r#", {{"op": "relu", "name": "r{i}", "inputs": [[{}, 0, 0]]}}"#, i - 1));
        }
        json.push_str(&format!(r#"], "arg_nodes": [0], "heads": [[{n}, 0, 0]]}}"#));
        let sym = json::load(&json).unwrap();
        assert_eq!(sym.outputs.len(), 1);
        // On a thread with a small stack, so that a recursive drop would fail here.
        std::thread::Builder::new().stack_size(256 << 10).spawn(move || drop(sym)).unwrap().join().unwrap();
    }

    fn fc(data: &Symbol, name: &str, hidden: &str) -> Symbol {
        let mut s = Symbol::atomic(lookup("FullyConnected").unwrap(), [("num_hidden", hidden)]).unwrap();
        s.compose(&[], &[("data", data)], Some(name)).unwrap();
        s
    }

    #[test]
    fn compose_names_inputs_like_stock() {
        let x = Symbol::variable("data");
        let y = fc(&x, "fc1", "10");
        assert_eq!(y.list_input_names(InputKind::Args), ["data", "fc1_weight", "fc1_bias"]);
        assert_eq!(y.list_outputs(), ["fc1_output"]);
        // Auto-created variables carry the parent's attributes (stock copies them).
        let w = y.graph().nodes.iter().find(|n| n.name == "fc1_weight").unwrap().raw.clone();
        assert_eq!(w.get("num_hidden").map(String::as_str), Some("10"));
        // Unnamed composition gets <op><counter>.
        let mut z = Symbol::atomic(lookup("Activation").unwrap(), [("act_type", "relu")]).unwrap();
        z.compose(&[&y], &[], None).unwrap();
        assert!(z.get_attr("name").unwrap().starts_with("activation"), "{:?}", z.get_attr("name"));
        // Bad keyword.
        let mut bad = Symbol::atomic(lookup("FullyConnected").unwrap(), [("num_hidden", "3")]).unwrap();
        let e = bad.compose(&[], &[("weights", &x)], Some("f")).unwrap_err().to_string();
        assert!(e.contains("weights"), "{e}");
        // A cycle is refused.
        let mut a = Symbol::atomic(lookup("Activation").unwrap(), [("act_type", "relu")]).unwrap();
        let a2 = a.clone();
        assert!(a.compose(&[&a2], &[], Some("cyc")).is_err());
    }

    fn relu() -> Symbol {
        Symbol::atomic(lookup("Activation").unwrap(), [("act_type", "relu")]).unwrap()
    }

    /// The cycle check's shortcut (skip argument graphs when no operator node of the symbol is
    /// consumed from outside it) still refuses every cycle: through an argument's head,
    /// through an outside consumer of an atomic node, and through one of a composed graph.
    #[test]
    fn compose_refuses_cycles_through_outside_consumers() {
        let x = Symbol::variable("x");
        // `b = relu(a)` while `a` has no inputs yet; composing `a` with `exp(b)` would close a loop.
        let mut a = relu();
        let mut b = relu();
        b.compose(&[&a], &[], Some("b")).unwrap();
        let mut c = Symbol::atomic(lookup("exp").unwrap(), std::iter::empty()).unwrap();
        c.compose(&[&b], &[], Some("c")).unwrap();
        let e = a.compose(&[&c], &[], Some("a")).unwrap_err().to_string();
        assert!(e.contains("cyclic"), "{e}");
        a.compose(&[&x], &[], Some("a")).unwrap();
        // A composed graph `z = relu(relu(x))` whose head another graph consumes.
        let mut y = relu();
        y.compose(&[&x], &[], Some("y")).unwrap();
        let mut z = relu();
        z.compose(&[&y], &[], Some("z")).unwrap();
        let mut w = Symbol::atomic(lookup("exp").unwrap(), std::iter::empty()).unwrap();
        w.compose(&[&z], &[], Some("w")).unwrap();
        let e = z.clone().compose(&[], &[("x", &w)], None).unwrap_err().to_string();
        assert!(e.contains("cyclic"), "{e}");
        // ... and one whose inner node (not its head) another graph consumes.
        let mut v = Symbol::atomic(lookup("exp").unwrap(), std::iter::empty()).unwrap();
        v.compose(&[&y], &[], Some("v")).unwrap();
        let e = z.clone().compose(&[], &[("x", &v)], None).unwrap_err().to_string();
        assert!(e.contains("cyclic"), "{e}");
        // The same symbol with an unrelated argument composes (the walk finds nothing).
        let mut z2 = z.clone();
        z2.compose(&[], &[("x", &Symbol::variable("u"))], None).unwrap();
        assert_eq!(z2.list_input_names(InputKind::All), ["u"]);
        // A long chain of fresh operators composes without walking it, and stays acyclic.
        let mut chain = x.clone();
        for _ in 0..1000 {
            let mut r = relu();
            r.compose(&[&chain], &[], None).unwrap();
            chain = r;
        }
        assert_eq!(chain.topo_nodes().len(), 1001);
    }

    #[test]
    fn aux_states_and_internals() {
        let x = Symbol::variable("data");
        let mut bn = Symbol::atomic(lookup("BatchNorm").unwrap(), std::iter::empty()).unwrap();
        bn.compose(&[&x], &[], Some("bn")).unwrap();
        assert_eq!(bn.list_input_names(InputKind::Args), ["data", "bn_gamma", "bn_beta"]);
        assert_eq!(bn.list_input_names(InputKind::Aux), ["bn_moving_mean", "bn_moving_var"]);
        assert_eq!(bn.list_input_names(InputKind::All).len(), 5);
        let g = bn.graph();
        assert_eq!(g.aux_nodes().len(), 2);
        let bn_node = g.nodes.last().unwrap();
        assert_eq!(bn_node.input_versions, [0, 0, 0, 1, 1]);
        let int = bn.internals();
        assert_eq!(int.list_outputs()[0], "data");
        assert_eq!(bn.children().list_outputs(), ["data", "bn_gamma", "bn_beta", "bn_moving_mean", "bn_moving_var"]);
    }

    #[test]
    fn attributes_and_general_compose() {
        let x = Symbol::variable("x");
        x.set_attr("lr_mult", "2").unwrap();
        assert_eq!(x.get_attr("__lr_mult__").as_deref(), Some("2"));
        assert_eq!(x.get_attr("lr_mult").as_deref(), Some("2"));
        assert!(x.set_attr("weight_lr_mult", "1").is_err());
        let y = fc(&x, "f", "4");
        assert!(y.set_attr("num_hidden", "abc").is_err());
        assert_eq!(y.get_attr("num_hidden").as_deref(), Some("4"));
        let rec = y.list_attr_recursive();
        assert!(rec.contains(&("x$lr_mult".to_string(), "2".to_string())));
        // General composition replaces the free variable x.
        let mut y2 = y.deep_copy();
        let z = Symbol::variable("z");
        y2.compose(&[], &[("x", &z)], None).unwrap();
        assert_eq!(y2.list_input_names(InputKind::All), ["z", "f_weight", "f_bias"]);
        assert_eq!(y.list_input_names(InputKind::All), ["x", "f_weight", "f_bias"], "the original is untouched");
        assert!(y2.clone().compose(&[], &[("nope", &z)], None).is_err());
    }
}
