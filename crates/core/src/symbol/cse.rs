//! Common-subexpression elimination of graphs about to run (`MXNET_ELIMINATE_COMMON_EXPR`,
//! on by default, as stock's pass of its executors and CachedOps).
//!
//! Owns [`Graph::eliminate_common_exprs`]: two operator nodes with the same operator, the same
//! attributes (all of them, as saved) and the same inputs compute the same values, so the
//! later one is dropped and its readers read the earlier one. Nodes whose result is not a
//! function of their inputs alone stay: those that write an input, draw random numbers, keep
//! a state, or are operators stock runs as stateful (its legacy operators, RNN, Custom,
//! control flow), so the optimized graph of built-in operators has stock's node count. When nodes were merged, a
//! graph output that repeats an earlier one is given a `_copy` node (named `<node>_<k>_copy`),
//! so the outputs stay separate arrays.

use super::{GNode, Graph};
use crate::op::{OpDef, Resource};
use std::collections::{BTreeMap, HashMap};

/// Whether two nodes of `op` with equal attributes and inputs compute the same values: not
/// when the operator writes an input, draws random numbers, keeps a state, runs control flow,
/// or declares itself not mergeable ([`OpDef::mergeable`]: the operators stock runs with a
/// state, `Custom` and extension libraries' operators).
fn mergeable(op: &OpDef) -> bool {
    op.mergeable
        && !op.mutates_any()
        && !op.resources.contains(&Resource::Random)
        && !op.node_state
        && op.control_flow.is_none()
}

impl Graph {
    /// This graph with common subexpressions eliminated (see the module doc); the inputs
    /// (variables) and the number of outputs are unchanged. Passes repeat until one merges
    /// nothing, as stock's do: copies a pass makes for one output may merge in the next.
    pub fn eliminate_common_exprs(self) -> Graph {
        let mut g = self;
        loop {
            let merged;
            (g, merged) = g.merge_pass();
            if !merged {
                return g;
            }
        }
    }

    /// One pass: every node merged into the first equal one, then, if any was, repeated
    /// outputs copied; and whether any was.
    fn merge_pass(self) -> (Graph, bool) {
        let Graph { nodes, heads } = self;
        // Per old node, its node in the new graph.
        let mut new_index: Vec<usize> = Vec::with_capacity(nodes.len());
        let mut kept: Vec<GNode> = Vec::with_capacity(nodes.len());
        // The inputs' versions too: a read of a variable before an operator writes it and a
        // read after it differ (stock's key leaves them out).
        type Key<'a> = (&'static str, &'a BTreeMap<String, String>, Vec<(usize, usize)>, &'a [u32]);
        let mut seen: HashMap<Key, usize> = HashMap::new();
        for n in &nodes {
            let inputs: Vec<(usize, usize)> = n.inputs.iter().map(|&(s, k)| (new_index[s], k)).collect();
            let key = match n.op {
                Some(op) if !inputs.is_empty() && mergeable(op) => {
                    Some((op.name, &n.raw, inputs.clone(), &n.input_versions[..]))
                }
                _ => None,
            };
            match key.as_ref().and_then(|k| seen.get(k)) {
                Some(&earlier) => new_index.push(earlier),
                None => {
                    if let Some(k) = key {
                        seen.insert(k, kept.len());
                    }
                    new_index.push(kept.len());
                    kept.push(GNode { inputs, ..n.clone() });
                }
            }
        }
        let mut heads: Vec<(usize, usize)> = heads.iter().map(|&(h, k)| (new_index[h], k)).collect();
        if kept.len() == nodes.len() {
            // Nothing merged: the graph as it was, repeated outputs and all (stock's pass
            // gives copies only when it merges).
            return (Graph { nodes: kept, heads }, false);
        }
        // A repeated output gets a copy of its own, as stock's pass gives it.
        let copy = crate::op::lookup("_copy").ok();
        let mut copies: HashMap<(usize, usize), usize> = HashMap::new();
        let mut seen_heads = std::collections::HashSet::new();
        for head in heads.iter_mut() {
            let entry = *head;
            if seen_heads.insert(entry) {
                continue;
            }
            let Some(copy) = copy else { break };
            let k = copies.entry(entry).or_insert(0);
            let name = format!("{}_{}_copy", kept[entry.0].name, *k);
            *k += 1;
            let attrs = copy.parse_attrs(Vec::<(&str, &str)>::new(), 1).ok();
            kept.push(GNode {
                op: Some(copy),
                name,
                attrs,
                raw: BTreeMap::new(),
                inputs: vec![entry],
                input_versions: vec![0],
                subgraphs: Vec::new(),
            });
            *head = (kept.len() - 1, 0);
        }
        (Graph { nodes: kept, heads }, true)
    }
}

#[cfg(test)]
mod tests {
    use super::super::json;

    /// A graph from `nodes` (JSON node objects after the variables `a` and `b`) with `heads`.
    fn graph(nodes: &[&str], heads: &str) -> super::Graph {
        let mut all = vec![
            r#"{"op": "null", "name": "a", "inputs": []}"#.to_string(),
            r#"{"op": "null", "name": "b", "inputs": []}"#.to_string(),
        ];
        all.extend(nodes.iter().map(|s| s.to_string()));
        let text = format!(r#"{{"nodes": [{}], "arg_nodes": [0, 1], "heads": {heads}}}"#, all.join(", "));
        json::load(&text).unwrap().graph()
    }

    fn names(g: &super::Graph) -> Vec<&str> {
        g.nodes.iter().map(|n| n.name.as_str()).collect()
    }

    #[test]
    fn equal_nodes_merge_and_their_readers_follow() {
        // p = a+b twice, then q = p*p read from both copies: q's inputs become one node, so
        // the two q's merge in the same pass.
        let g = graph(
            &[
                r#"{"op": "elemwise_add", "name": "p0", "inputs": [[0, 0, 0], [1, 0, 0]]}"#,
                r#"{"op": "elemwise_add", "name": "p1", "inputs": [[0, 0, 0], [1, 0, 0]]}"#,
                r#"{"op": "elemwise_mul", "name": "q0", "inputs": [[2, 0, 0], [2, 0, 0]]}"#,
                r#"{"op": "elemwise_mul", "name": "q1", "inputs": [[3, 0, 0], [3, 0, 0]]}"#,
                r#"{"op": "elemwise_add", "name": "r", "inputs": [[4, 0, 0], [5, 0, 0]]}"#,
            ],
            "[[6, 0, 0]]",
        )
        .eliminate_common_exprs();
        assert_eq!(names(&g), ["a", "b", "p0", "q0", "r"]);
        assert_eq!(g.nodes[4].inputs, [(3, 0), (3, 0)]);
        assert_eq!(g.heads, [(4, 0)]);
    }

    #[test]
    fn attributes_random_draws_and_writes_keep_nodes_apart() {
        // Two BatchNorms of one input write the same moving statistics: not merged.
        let var = |name: &str| format!(r#"{{"op": "null", "name": "{name}", "inputs": []}}"#);
        let bn = |name: &str| {
            format!(
                r#"{{"op": "BatchNorm", "name": "{name}", "inputs": [[0, 0, 0], [1, 0, 0], [2, 0, 0], [3, 0, 0], [4, 0, 0]]}}"#
            )
        };
        let nodes = [var("beta"), var("mean"), var("var"), bn("bn1"), bn("bn2")];
        let refs: Vec<&str> = nodes.iter().map(String::as_str).collect();
        let g = graph(&refs, "[[5, 0, 0], [6, 0, 0]]");
        assert_eq!(g.nodes.iter().filter(|n| n.op.is_some()).count(), 2);
        assert_eq!(g.clone().eliminate_common_exprs().nodes.len(), g.nodes.len());
        let g = graph(
            &[
                r#"{"op": "_plus_scalar", "name": "s1", "attrs": {"scalar": "1"}, "inputs": [[0, 0, 0]]}"#,
                r#"{"op": "_plus_scalar", "name": "s2", "attrs": {"scalar": "2"}, "inputs": [[0, 0, 0]]}"#,
                r#"{"op": "Dropout", "name": "d1", "attrs": {"p": "0.5"}, "inputs": [[0, 0, 0]]}"#,
                r#"{"op": "Dropout", "name": "d2", "attrs": {"p": "0.5"}, "inputs": [[0, 0, 0]]}"#,
                r#"{"op": "_sample_uniform", "name": "u1", "inputs": [[0, 0, 0], [1, 0, 0]]}"#,
                r#"{"op": "_sample_uniform", "name": "u2", "inputs": [[0, 0, 0], [1, 0, 0]]}"#,
            ],
            "[[2, 0, 0], [3, 0, 0], [4, 0, 0], [5, 0, 0], [6, 0, 0], [7, 0, 0]]",
        );
        let before = names(&g).iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let g = g.eliminate_common_exprs();
        assert_eq!(names(&g), before);
    }

    #[test]
    fn repeated_outputs_get_copies_only_after_a_merge() {
        // (`b` is read by nothing, so the graph leaves it out.)
        let twice = r#"[[2, 0, 0], [2, 0, 0]]"#;
        let g = graph(&[r#"{"op": "relu", "name": "r", "inputs": [[0, 0, 0]]}"#], twice).eliminate_common_exprs();
        assert_eq!((names(&g), g.heads.clone()), (vec!["a", "r"], vec![(1, 0), (1, 0)]));
        let g = graph(
            &[
                r#"{"op": "relu", "name": "r0", "inputs": [[0, 0, 0]]}"#,
                r#"{"op": "relu", "name": "r1", "inputs": [[0, 0, 0]]}"#,
            ],
            "[[2, 0, 0], [3, 0, 0]]",
        )
        .eliminate_common_exprs();
        assert_eq!(names(&g), ["a", "r0", "r0_0_copy"]);
        assert_eq!(g.heads, [(1, 0), (2, 0)]);
        assert_eq!(g.nodes[2].op.map(|op| op.name), Some("_copy"));
        assert_eq!(g.nodes[2].inputs, [(1, 0)]);
    }
}
