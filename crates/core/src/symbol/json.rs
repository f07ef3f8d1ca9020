//! MXNet's JSON graph format (nnvm's SaveJSON/LoadJSON), both ways.
//!
//! Owns: [`save`] (the text `Symbol.tojson()` returns: `nodes` with `op` (`"null"` for
//! variables), `name`, `attrs` (sorted, only when non-empty) and `inputs` as
//! `[node, output, version]`; `arg_nodes` (every variable), `node_row_ptr`, `heads`, and the
//! graph `attrs` `{"mxnet_version": ["int", 10901]}` plus `is_np_shape` in numpy-shape mode),
//! laid out as dmlc's JSON writer lays it out, so files match stock's byte for byte; and
//! [`load`], which also reads older files: `param`/`attr` instead of `attrs`, two-element
//! input entries, and (before 0.9) hidden attribute keys without their underscores.

use super::{GNode, Graph, Symbol, HIDDEN_KEYS, MAX_NESTING};
use crate::error::{Error, Result};
use crate::op;
use serde_json::Value;
use std::collections::BTreeMap;

/// dmlc::JSONWriter's layout: nested scopes, each single- or multi-line.
struct Writer {
    out: String,
    multi: Vec<bool>,
    count: Vec<usize>,
}

impl Writer {
    fn sep(&mut self) {
        if self.multi.last().copied().unwrap_or(true) {
            self.out.push('\n');
            self.out.push_str(&" ".repeat(self.multi.len() * 2));
        }
    }
    fn begin(&mut self, c: char, multi: bool) {
        self.out.push(c);
        self.multi.push(multi);
        self.count.push(0);
    }
    fn end(&mut self, c: char) {
        let multi = self.multi.pop().unwrap_or(false);
        let n = self.count.pop().unwrap_or(0);
        if multi && n != 0 {
            self.sep();
        }
        self.out.push(c);
    }
    /// Before an array item or an object key.
    fn next(&mut self) {
        if let Some(c) = self.count.last_mut() {
            if *c != 0 {
                self.out.push_str(", ");
            }
            *c += 1;
        }
        self.sep();
    }
    fn key(&mut self, k: &str) {
        self.next();
        self.string(k);
        self.out.push_str(": ");
    }
    fn string(&mut self, s: &str) {
        self.out.push('"');
        for ch in s.chars() {
            match ch {
                '\r' => self.out.push_str("\\r"),
                '\n' => self.out.push_str("\\n"),
                '\\' => self.out.push_str("\\\\"),
                '\t' => self.out.push_str("\\t"),
                '"' => self.out.push_str("\\\""),
                c if (c as u32) < 0x20 => self.out.push_str(&format!("\\u{:04x}", c as u32)),
                c => self.out.push(c),
            }
        }
        self.out.push('"');
    }
    /// An array of plain numbers (multi-line above 10 items, as dmlc writes POD arrays).
    fn ints(&mut self, v: &[usize]) {
        self.begin('[', v.len() > 10);
        for x in v {
            self.next();
            self.out.push_str(&x.to_string());
        }
        self.end(']');
    }
    /// An array of `[node, index, version]` entries.
    fn entries(&mut self, v: &[(usize, usize, u32)]) {
        self.begin('[', v.len() > 10);
        for (n, i, ver) in v {
            self.next();
            self.out.push_str(&format!("[{n}, {i}, {ver}]"));
        }
        self.end(']');
    }
    fn map(&mut self, m: &BTreeMap<String, String>) {
        self.begin('{', m.len() > 1);
        for (k, v) in m {
            self.key(k);
            self.string(v);
        }
        self.end('}');
    }
}

/// The JSON text of a graph.
pub fn save(g: &Graph, np_shape: bool) -> String {
    let mut w = Writer { out: String::new(), multi: Vec::new(), count: Vec::new() };
    write_graph(&mut w, g, Some(np_shape));
    w.out
}

/// One graph object; `top`: the top-level graph (with the graph attributes, numpy-shape mode
/// given), not a control-flow node's graph (without them, as nnvm writes those).
fn write_graph(w: &mut Writer, g: &Graph, top: Option<bool>) {
    w.begin('{', true);
    w.key("nodes");
    w.begin('[', true);
    for n in &g.nodes {
        w.next();
        w.begin('{', true);
        w.key("op");
        w.string(n.op.map_or("null", |o| o.name));
        w.key("name");
        w.string(&n.name);
        if !n.raw.is_empty() {
            w.key("attrs");
            w.map(&n.raw);
        }
        w.key("inputs");
        let ins: Vec<(usize, usize, u32)> = n
            .inputs
            .iter()
            .enumerate()
            .map(|(k, &(src, i))| (src, i, n.input_versions.get(k).copied().unwrap_or(0)))
            .collect();
        w.entries(&ins);
        if !n.subgraphs.is_empty() {
            w.key("subgraphs");
            w.begin('[', true);
            for sub in &n.subgraphs {
                w.next();
                write_graph(w, sub, None);
            }
            w.end(']');
        }
        w.end('}');
    }
    w.end(']');
    w.key("arg_nodes");
    w.ints(&g.input_nodes());
    w.key("node_row_ptr");
    w.ints(&g.entry_offsets());
    w.key("heads");
    let heads: Vec<(usize, usize, u32)> = g.heads.iter().map(|&(n, i)| (n, i, 0)).collect();
    w.entries(&heads);
    if let Some(np_shape) = top {
        w.key("attrs");
        w.begin('{', np_shape);
        if np_shape {
            w.key("is_np_shape");
            w.out.push_str("[\"int\", 1]");
        }
        w.key("mxnet_version");
        w.out.push_str(&format!("[\"int\", {}]", crate::runtime::MXNET_VERSION));
        w.end('}');
    }
    w.end('}');
}

fn bad(msg: impl std::fmt::Display) -> Error {
    Error::mxnet(format!("invalid symbol JSON: {msg}"))
}

fn as_index(v: &Value, what: &str) -> Result<usize> {
    v.as_u64().map(|x| x as usize).ok_or_else(|| bad(format!("{what} must be a non-negative integer, got {v}")))
}

/// An `[node, index(, version)]` entry.
fn entry(v: &Value, what: &str) -> Result<(usize, usize, u32)> {
    let a = v
        .as_array()
        .filter(|a| a.len() == 2 || a.len() == 3)
        .ok_or_else(|| bad(format!("{what} must be [node, index, version], got {v}")))?;
    let ver = match a.get(2) {
        Some(x) => as_index(x, what)? as u32,
        None => 0,
    };
    Ok((as_index(&a[0], what)?, as_index(&a[1], what)?, ver))
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A graph from JSON text (stock's and older formats).
pub fn load_graph(json: &str) -> Result<Graph> {
    let root: Value = serde_json::from_str(json).map_err(bad)?;
    graph_of(&root, None, 0)
}

/// The graph of a JSON object; `version`: the file's, for a control-flow node's graph (which
/// has no attributes of its own).
fn graph_of(root: &Value, version: Option<i64>, depth: usize) -> Result<Graph> {
    graph_in(root, version, None, depth)
}

/// [`graph_of`]; `top_np`: for a control-flow node's graph, whether the file it is in was
/// written with NumPy shape semantics.
fn graph_in(root: &Value, version: Option<i64>, top_np: Option<bool>, depth: usize) -> Result<Graph> {
    // A hostile file nesting graphs without end must not exhaust the stack.
    if depth >= MAX_NESTING {
        return Err(bad(format!("control-flow graphs nest more than {MAX_NESTING} deep")));
    }
    let obj = root.as_object().ok_or_else(|| bad("a graph must be an object"))?;
    let version = version.unwrap_or_else(|| {
        obj.get("attrs")
            .and_then(|a| a.get("mxnet_version"))
            .and_then(|v| v.as_array())
            .and_then(|a| a.get(1))
            .and_then(Value::as_i64)
            .unwrap_or(0)
    });
    // A file written without NumPy shape semantics, loaded with them: its `__shape__` zeros
    // mean "unknown", so they become -1 (stock's ConvertShapeAttrToNumPyCompatible).
    let np_file = |o: &serde_json::Map<String, Value>| {
        o.get("attrs")
            .and_then(|a| a.get("is_np_shape"))
            .and_then(|v| v.as_array())
            .and_then(|a| a.get(1))
            .and_then(Value::as_i64)
            == Some(1)
    };
    let legacy_zeros = crate::ndarray::np_shape::get() != 0 && !np_file(obj) && top_np.is_none_or(|np| !np);
    let nodes_v = obj.get("nodes").and_then(Value::as_array).ok_or_else(|| bad("missing \"nodes\" array"))?;
    let mut g = Graph { nodes: Vec::with_capacity(nodes_v.len()), heads: Vec::new() };
    for (i, nv) in nodes_v.iter().enumerate() {
        let no = nv.as_object().ok_or_else(|| bad(format!("node {i} is not an object")))?;
        let op_name = no.get("op").and_then(Value::as_str).ok_or_else(|| bad(format!("node {i} has no \"op\"")))?;
        let name = no.get("name").and_then(Value::as_str).unwrap_or("").to_string();
        let mut raw = BTreeMap::new();
        for key in ["param", "attr", "attrs"] {
            if let Some(m) = no.get(key).and_then(Value::as_object) {
                for (k, v) in m {
                    raw.insert(k.clone(), text(v));
                }
            }
        }
        if legacy_zeros {
            if let Some(v) = raw.get_mut("__shape__") {
                *v = zeros_unknown(v);
            }
        }
        if version < 900 {
            for k in HIDDEN_KEYS {
                if let Some(v) = raw.remove(k) {
                    raw.insert(format!("__{k}__"), v);
                }
            }
        }
        let mut inputs = Vec::new();
        let mut versions = Vec::new();
        for e in no.get("inputs").and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[]) {
            let (src, idx, ver) = entry(e, &format!("input of node {i} ({name})"))?;
            if src >= i {
                return Err(bad(format!("node {i} ({name}) reads node {src}, which does not come before it")));
            }
            if idx >= g.num_outputs(src) {
                return Err(bad(format!(
                    "node {i} ({name}) reads output {idx} of node {src}, which has {}",
                    g.num_outputs(src)
                )));
            }
            inputs.push((src, idx));
            versions.push(ver);
        }
        let subgraphs = no
            .get("subgraphs")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or(&[])
            .iter()
            // As a symbol would have it: only the nodes its outputs reach.
            .map(|sg| {
                graph_in(sg, Some(version), Some(!legacy_zeros), depth + 1)
                    .map(|g| std::sync::Arc::new(g.to_symbol().graph()))
            })
            .collect::<Result<Vec<_>>>()?;
        let (op, attrs) = if op_name == "null" {
            if !subgraphs.is_empty() {
                return Err(bad(format!("variable {name} has subgraphs")));
            }
            (None, None)
        } else {
            let op = op::lookup(op_name).map_err(|_| {
                Error::mxnet(format!("failed loading symbol JSON: operator {op_name} (node {name}) is not registered"))
            })?;
            let attrs = super::parse_dict(op, &raw, inputs.len())
                .map_err(|e| Error::new(e.kind(), format!("node {name}: {}", e.message())))?;
            let want = op.num_inputs(&attrs, inputs.len())?;
            if want != inputs.len() {
                return Err(bad(format!(
                    "node {name} ({op_name}) has {} inputs, the operator takes {want}",
                    inputs.len()
                )));
            }
            let graphs: Vec<&Graph> = subgraphs.iter().map(|g| &**g).collect();
            super::check_subgraphs(op, &attrs, &name, &graphs)?;
            (Some(op), Some(attrs))
        };
        g.nodes.push(GNode { op, name, attrs, raw, inputs, input_versions: versions, subgraphs });
    }
    for h in obj.get("heads").and_then(Value::as_array).ok_or_else(|| bad("missing \"heads\" array"))? {
        let (n, i, _) = entry(h, "head")?;
        if n >= g.nodes.len() || i >= g.num_outputs(n) {
            return Err(bad(format!("head [{n}, {i}] does not name an output of the graph")));
        }
        g.heads.push((n, i));
    }
    Ok(g)
}

/// A shape text with its 0 dimensions written as -1 (`(128, 0)` is `(128, -1)`); other text
/// is kept.
fn zeros_unknown(text: &str) -> String {
    let t = text.trim();
    let (open, close, inner) = match (t.strip_prefix('('), t.strip_prefix('[')) {
        (Some(r), _) => ('(', ')', r.strip_suffix(')')),
        (_, Some(r)) => ('[', ']', r.strip_suffix(']')),
        _ => return text.to_string(),
    };
    let Some(inner) = inner else { return text.to_string() };
    let dims: Vec<&str> = inner.split(',').map(str::trim).filter(|d| !d.is_empty()).collect();
    let dims: Vec<&str> = dims.iter().map(|&d| if d.trim_end_matches('L') == "0" { "-1" } else { d }).collect();
    format!("{open}{}{close}", dims.join(", "))
}

/// A symbol from JSON text.
pub fn load(json: &str) -> Result<Symbol> {
    Ok(load_graph(json)?.to_symbol())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::lookup;
    use crate::symbol::InputKind;

    fn net() -> Symbol {
        let x = Symbol::variable("data");
        let mut bn = Symbol::atomic(lookup("BatchNorm").unwrap(), [("fix_gamma", "False")]).unwrap();
        bn.compose(&[&x], &[], Some("bn")).unwrap();
        let mut fc =
            Symbol::atomic(lookup("FullyConnected").unwrap(), [("num_hidden", "8"), ("lr_mult", "2")]).unwrap();
        fc.compose(&[&bn], &[], Some("fc")).unwrap();
        fc
    }

    #[test]
    fn layout_matches_dmlc() {
        let s = save(&net().graph(), false);
        assert!(s.starts_with("{\n  \"nodes\": [\n    {\n      \"op\": \"null\", \n      \"name\": \"data\", \n      \"inputs\": []\n    }, \n"), "{s}");
        assert!(s.contains("\"inputs\": [[0, 0, 0], [1, 0, 0], [2, 0, 0], [3, 0, 1], [4, 0, 1]]"), "{s}");
        assert!(s.contains("\"attrs\": {\"fix_gamma\": \"False\"}"), "{s}");
        assert!(
            s.contains("\"attrs\": {\n        \"__lr_mult__\": \"2\", \n        \"num_hidden\": \"8\"\n      }"),
            "{s}"
        );
        assert!(s.ends_with("\"heads\": [[8, 0, 0]], \n  \"attrs\": {\"mxnet_version\": [\"int\", 10901]}\n}"), "{s}");
        assert!(
            s.contains(
                "\"arg_nodes\": [0, 1, 2, 3, 4, 6, 7], \n  \"node_row_ptr\": [0, 1, 2, 3, 4, 5, 8, 9, 10, 11], \n"
            ),
            "{s}"
        );
    }

    #[test]
    fn round_trip() {
        let a = net();
        let text = save(&a.graph(), false);
        let b = load(&text).unwrap();
        assert_eq!(save(&b.graph(), false), text);
        assert_eq!(b.list_input_names(InputKind::Aux), ["bn_moving_mean", "bn_moving_var"]);
        assert_eq!(b.list_outputs(), ["fc_output"]);
        assert_eq!(b.get_attr("lr_mult").as_deref(), Some("2"));
    }

    #[test]
    fn legacy_and_bad_input() {
        let legacy = r#"{"nodes": [{"op": "null", "param": {}, "name": "x", "inputs": [], "backward_source_id": -1, "attr": {"ctx_group": "a"}},
            {"op": "Activation", "param": {"act_type": "relu"}, "name": "r", "inputs": [[0, 0]], "backward_source_id": -1}],
            "arg_nodes": [0], "heads": [[1, 0]]}"#;
        let s = load(legacy).unwrap();
        assert_eq!(s.list_outputs(), ["r_output"]);
        assert_eq!(s.internals().output(0).unwrap().get_attr("__ctx_group__").as_deref(), Some("a"));
        for bad in [
            "not json",
            r#"{"nodes": [], "heads": [[0, 0, 0]]}"#,
            r#"{"nodes": [{"op": "NoSuchOp", "name": "a", "inputs": []}], "heads": [[0, 0, 0]]}"#,
            r#"{"nodes": [{"op": "Activation", "name": "a", "attrs": {"act_type": "relu"}, "inputs": [[0, 0, 0]]}], "heads": [[0, 0, 0]]}"#,
            r#"{"nodes": [{"op": "null", "name": "x", "inputs": []}, {"op": "Activation", "name": "a", "attrs": {"act_type": "bogus"}, "inputs": [[0, 0, 0]]}], "heads": [[1, 0, 0]]}"#,
        ] {
            assert!(load(bad).is_err(), "{bad}");
        }
    }
}
