//! Inference fusion of graph runs: the accelerated CPU path that `MXNET_MKLDNN_ENABLED`
//! switches (on by default, as stock's oneDNN path).
//!
//! Owns [`Chain`]: a convolution followed by operators that each take the previous one's
//! result as their only reader (BatchNorm with its moving statistics, a ReLU, a clip, an
//! addition of another array; see [`crate::op::Fusion`]), as stock's MKLDNN subgraph backend
//! fuses them (`_sg_mkldnn_conv` with BatchNorm folded, a post-op activation and a sum); and
//! a BatchNorm that no convolution's chain takes followed by ReLUs and clips (DenseNet's and
//! pre-activation ResNet's BatchNorm-ReLU pairs, one pass over the data instead of two).
//! A run that records nothing pushes the chain as one operation whose kernel applies the steps
//! to each output plane while it is in cache, with the same arithmetic as the operators it
//! replaces, so the outputs are bit for bit those of the unfused graph. The graph itself is
//! unchanged: symbols, exports and monitored runs see every node.

use crate::op::{FuseStep, Fusion};
use crate::symbol::Graph;
use std::collections::HashSet;

/// One step of a chain: its node, the step, and the entries (node, output) of its other
/// inputs (BatchNorm's four parameters, the addend), all computed before the head.
pub(super) type Step = (usize, FuseStep, Vec<(usize, usize)>);

/// A convolution or BatchNorm node and the nodes it computes in one operation.
pub(super) struct Chain {
    /// A BatchNorm's step when one heads the chain (its steps are ReLUs and clips); `None`
    /// for a convolution.
    pub norm: Option<FuseStep>,
    pub steps: Vec<Step>,
    /// The node whose output the chain computes (the last step's).
    pub last: usize,
}

impl Chain {
    /// Whether the chain applies in the current mode: a BatchNorm without
    /// `use_global_stats` uses batch statistics in training mode, which no step computes.
    pub fn applies(&self, training: bool) -> bool {
        let batch_stats = |s: &FuseStep| matches!(s, FuseStep::Scale { global: false, .. });
        !training || !(self.norm.iter().any(batch_stats) || self.steps.iter().any(|(_, s, _)| batch_stats(s)))
    }

    /// The nodes the chain computes besides its head, in order.
    pub fn nodes(&self) -> impl Iterator<Item = usize> + '_ {
        self.steps.iter().map(|(n, _, _)| *n)
    }
}

/// Every chain of `graph`, at its head's index: the convolutions' first, then those of the
/// BatchNorms none of them takes. `readers[n]`: the nodes reading an output of node `n`
/// (each once, in order); `heads`: the graph's heads.
pub(super) fn chains(graph: &Graph, readers: &[Vec<usize>], heads: &HashSet<(usize, usize)>) -> Vec<Option<Chain>> {
    let mut chains: Vec<Option<Chain>> =
        (0..graph.nodes.len()).map(|i| chain_at(graph, i, false, readers, heads)).collect();
    let taken: HashSet<usize> = chains.iter().flatten().flat_map(Chain::nodes).collect();
    for (i, chain) in chains.iter_mut().enumerate() {
        if chain.is_none() && !taken.contains(&i) {
            *chain = chain_at(graph, i, true, readers, heads);
        }
    }
    chains
}

/// The fusion role of node `n`'s operator.
fn role(graph: &Graph, n: usize) -> Option<Fusion> {
    let node = &graph.nodes[n];
    node.op.zip(node.attrs.as_ref()).and_then(|(op, attrs)| op.fusion.and_then(|f| f(attrs)))
}

/// The chain headed by node `i`: a convolution's (`norm_head` false), or one of ReLUs and
/// clips headed by a BatchNorm step (`norm_head` true); none when no step follows.
fn chain_at(
    graph: &Graph,
    i: usize,
    norm_head: bool,
    readers: &[Vec<usize>],
    heads: &HashSet<(usize, usize)>,
) -> Option<Chain> {
    let norm = match role(graph, i) {
        Some(Fusion::Head) if !norm_head => None,
        Some(Fusion::Step(s @ FuseStep::Scale { .. })) if norm_head && graph.nodes[i].inputs.len() == 5 => Some(s),
        _ => return None,
    };
    let role = |n: usize| role(graph, n);
    let mut steps = Vec::new();
    let mut cur = i;
    loop {
        // The value must go nowhere else: not a head (no output of it), one reader that
        // reads it once and reads no other output of its node.
        if heads.iter().any(|&(h, _)| h == cur) || readers[cur].len() != 1 {
            break;
        }
        let r = readers[cur][0];
        let inputs = &graph.nodes[r].inputs;
        if inputs.iter().filter(|e| e.0 == cur).count() != 1 {
            break;
        }
        let Some(pos) = inputs.iter().position(|&e| e == (cur, 0)) else { break };
        let Some(Fusion::Step(step)) = role(r) else { break };
        if norm.is_some() && !matches!(step, FuseStep::Relu | FuseStep::Clip { .. }) {
            break;
        }
        let (step, others): (FuseStep, Vec<(usize, usize)>) = match step {
            FuseStep::Add { .. } if inputs.len() == 2 => {
                (FuseStep::Add { value_first: pos == 0 }, vec![inputs[1 - pos]])
            }
            FuseStep::Scale { .. } if pos == 0 && inputs.len() == 5 => (step, inputs[1..].to_vec()),
            FuseStep::Relu | FuseStep::Clip { .. } if pos == 0 && inputs.len() == 1 => (step, Vec::new()),
            _ => break,
        };
        // The chain reads the step's other inputs when the convolution runs: they must be
        // there by then, and no node in between may write them (an optimizer update's state,
        // BatchNorm's moving statistics).
        if others.iter().any(|&(s, _)| s >= i && !graph.nodes[s].is_variable()) {
            break;
        }
        let written_between = (i + 1..r).any(|m| {
            let node = &graph.nodes[m];
            node.op.is_some_and(|op| {
                op.mutated_inputs_of(node.attrs.as_ref(), node.inputs.len())
                    .iter()
                    .any(|&k| others.iter().any(|o| o.0 == node.inputs[k].0))
            })
        });
        if written_between {
            break;
        }
        steps.push((r, step, others));
        cur = r;
    }
    (!steps.is_empty()).then_some(Chain { norm, steps, last: cur })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A convolution's chain takes its BatchNorm and ReLU (that BatchNorm heads nothing); a
    /// BatchNorm on the data heads its own ReLU, and not the BatchNorm after it; a BatchNorm
    /// whose output is also a head heads nothing.
    #[test]
    fn batch_norms_head_chains_only_outside_convolutions() {
        let var = |name: &str| format!(r#"{{"op": "null", "name": "{name}", "inputs": []}}"#);
        let bn = |name: &str, x: usize, p: usize| {
            format!(
                r#"{{"op": "BatchNorm", "name": "{name}", "attrs": {{"fix_gamma": "False"}},
                    "inputs": [[{x}, 0, 0], [{p}, 0, 0], [{}, 0, 0], [{}, 0, 0], [{}, 0, 0]]}}"#,
                p + 1,
                p + 2,
                p + 3
            )
        };
        let relu = |name: &str, x: usize| {
            format!(
                r#"{{"op": "Activation", "name": "{name}", "attrs": {{"act_type": "relu"}}, "inputs": [[{x}, 0, 0]]}}"#
            )
        };
        let nodes = [
            var("data"),
            var("w"),
            r#"{"op": "Convolution", "name": "conv", "attrs": {"kernel": "(3, 3)", "num_filter": "4", "no_bias": "True"},
                "inputs": [[0, 0, 0], [1, 0, 0]]}"#
                .to_string(),
            var("g1"),
            var("b1"),
            var("m1"),
            var("v1"),
            bn("bn1", 2, 3),
            relu("relu1", 7),
            var("g2"),
            var("b2"),
            var("m2"),
            var("v2"),
            bn("bn2", 0, 9),
            relu("relu2", 13),
            var("g3"),
            var("b3"),
            var("m3"),
            var("v3"),
            bn("bn3", 14, 15),
            relu("relu3", 19),
        ];
        let json = format!(r#"{{"nodes": [{}], "heads": [[20, 0, 0], [19, 0, 0], [8, 0, 0]]}}"#, nodes.join(","));
        let graph = crate::symbol::json::load_graph(&json).unwrap();
        let mut readers: Vec<Vec<usize>> = vec![Vec::new(); graph.nodes.len()];
        for (i, n) in graph.nodes.iter().enumerate() {
            for &(src, _) in &n.inputs {
                if readers[src].last() != Some(&i) {
                    readers[src].push(i);
                }
            }
        }
        let heads: HashSet<(usize, usize)> = graph.heads.iter().copied().collect();
        let chains = chains(&graph, &readers, &heads);
        let conv = chains[2].as_ref().expect("the convolution's chain");
        assert!(conv.norm.is_none() && conv.nodes().collect::<Vec<_>>() == [7, 8] && conv.last == 8);
        assert!(chains[7].is_none(), "a BatchNorm in a convolution's chain heads none");
        let own = chains[13].as_ref().expect("bn2 heads its ReLU");
        assert!(matches!(own.norm, Some(FuseStep::Scale { global: false, .. })) && own.last == 14);
        assert!(own.applies(false) && !own.applies(true));
        assert!(chains[19].is_none(), "bn3's output is a head");
        let with_chains: Vec<usize> = (0..chains.len()).filter(|&i| chains[i].is_some()).collect();
        assert_eq!(with_chains, [2, 13]);
    }
}
