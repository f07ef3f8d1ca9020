//! Reduction trees over a link topology: what stock's tree communicator
//! (`MXNET_KVSTORE_USETREE=1`, `CommDeviceTree`) reduces and broadcasts along when a store's
//! values live on several GPUs. Not driven yet (this build drives no multi-GPU store); built
//! and tested here on made-up topologies so that the GPU work only has to call it.
//!
//! Owns: one balanced binary tree per root device over a matrix of link weights (higher is a
//! better link; 0 is no link), and the link usage penalty between trees.
//!
//! A tree is written as stock writes it: level `k` has `2^k` entries, and entries `2j` and
//! `2j + 1` are the node at position `j` of level `k - 1` and the child it receives from at
//! that level (itself where it has none). Reducing runs the levels bottom up, broadcasting top
//! down. A tree over `n` devices has `ceil(log2 n) + 1` levels.
//!
//! Construction (our own; stock's uses Kernighan-Lin with random moves): the devices are split
//! in two halves, the root's of `ceil(m/2)` devices (or `floor(m/2)`, when that is what a
//! valid tree needs), keeping as much link weight as possible inside the halves; the other half's root is the device best linked to the root; each half
//! is built the same way. Small sets (up to [`EXHAUSTIVE`] devices, or any size with
//! `backtrack`, which is `MXNET_KVSTORE_TREE_BACKTRACK`) try every split, best first, until
//! one gives a tree whose every edge is a link; larger ones improve a greedy split by swaps
//! (Kernighan-Lin style, deterministic). After each tree the weights of the links it used are
//! multiplied by the penalty (`MXNET_KVSTORE_TREE_LINK_USAGE_PENALTY`), so that the trees of
//! different roots spread over different links.

use crate::error::{Error, Result};

/// Sets up to this size try every split.
pub const EXHAUSTIVE: usize = 12;

/// Sets above this size never try every split (with backtracking, or when the swap heuristic
/// fails): the number of splits grows exponentially.
pub const MAX_EXHAUSTIVE: usize = 16;

/// One tree: its levels (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tree {
    pub levels: Vec<Vec<usize>>,
}

impl Tree {
    /// The root.
    pub fn root(&self) -> usize {
        self.levels[0][0]
    }

    /// The edges (parent, child) it uses, top level first; self-pairs excluded.
    pub fn edges(&self) -> Vec<(usize, usize)> {
        self.levels[1..].iter().flat_map(|l| l.chunks_exact(2).map(|p| (p[0], p[1])).filter(|(a, b)| a != b)).collect()
    }

    /// One line per level, as `MXNET_KVSTORE_LOGTREE` prints them.
    pub fn describe(&self) -> String {
        let rows: Vec<String> =
            self.levels.iter().map(|l| l.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(" ")).collect();
        rows.join("\n")
    }
}

/// The link weights between `n` devices, row-major (symmetric).
#[derive(Debug, Clone)]
pub struct Links {
    n: usize,
    w: Vec<f64>,
}

impl Links {
    pub fn new(n: usize, w: Vec<f64>) -> Result<Self> {
        if w.len() != n * n {
            return Err(Error::value(format!("a link matrix of {n} devices needs {} weights, got {}", n * n, w.len())));
        }
        if w.iter().any(|x| !x.is_finite() || *x < 0.0) {
            return Err(Error::value("link weights must be finite and not negative"));
        }
        Ok(Links { n, w })
    }
    fn at(&self, a: usize, b: usize) -> f64 {
        self.w[a * self.n + b]
    }
    /// The link weight kept inside `set`.
    fn inside(&self, set: &[usize]) -> f64 {
        let mut s = 0.0;
        for (i, &a) in set.iter().enumerate() {
            for &b in &set[i + 1..] {
                s += self.at(a, b);
            }
        }
        s
    }
    fn penalize(&mut self, a: usize, b: usize, penalty: f64) {
        let n = self.n;
        self.w[a * n + b] *= penalty;
        self.w[b * n + a] *= penalty;
    }
}

/// One tree per root device, in root order; the links each tree uses are penalised before
/// the next is built.
pub fn trees(links: &Links, penalty: f64, backtrack: bool) -> Result<Vec<Tree>> {
    if !(penalty.is_finite() && penalty > 0.0) {
        return Err(Error::value(format!("the link usage penalty must be a positive number (got {penalty})")));
    }
    // A device without links has no tree: say so before searching.
    if let Some(d) = (0..links.n).find(|&d| links.n > 1 && (0..links.n).all(|o| o == d || links.at(d, o) <= 0.0)) {
        return Err(Error::mxnet(format!("no binary reduction tree: device {d} has no link to another device")));
    }
    let mut w = links.clone();
    let mut out = Vec::with_capacity(links.n);
    for root in 0..links.n {
        let all: Vec<usize> = (0..links.n).collect();
        let levels = build(&w, &all, root, backtrack).ok_or_else(|| {
            Error::mxnet(format!("no binary reduction tree from device {root} uses only existing links"))
        })?;
        let tree = Tree { levels };
        for (a, b) in tree.edges() {
            w.penalize(a, b, penalty);
        }
        out.push(tree);
    }
    Ok(out)
}

/// The levels of a tree over `set` (which holds `root`) whose every edge is a link, if any.
fn build(w: &Links, set: &[usize], root: usize, backtrack: bool) -> Option<Vec<Vec<usize>>> {
    if set.len() == 1 {
        return Some(vec![vec![root]]);
    }
    let exhaustive = set.len() <= EXHAUSTIVE || (backtrack && set.len() <= MAX_EXHAUSTIVE);
    let splits = if exhaustive { every_split(w, set, root) } else { vec![swapped_split(w, set, root)] };
    for (half, rest) in splits {
        // The other half's root: the device best linked to the root (lowest id on ties).
        let Some(other) = rest.iter().copied().filter(|&d| w.at(root, d) > 0.0).max_by(|&a, &b| {
            w.at(root, a).partial_cmp(&w.at(root, b)).unwrap_or(std::cmp::Ordering::Equal).then(b.cmp(&a))
        }) else {
            continue;
        };
        let Some(a) = build(w, &half, root, backtrack) else { continue };
        let Some(b) = build(w, &rest, other, backtrack) else { continue };
        return Some(merge(root, other, a, b));
    }
    // A heuristic split that fails falls back to trying every split (as stock falls back to
    // backtracking), where that is affordable.
    if !exhaustive && set.len() <= MAX_EXHAUSTIVE {
        return build(w, set, root, true);
    }
    None
}

/// The tree whose root `root` receives from `other` first, then runs `a` (its half's tree)
/// while `other` runs `b`.
fn merge(root: usize, other: usize, a: Vec<Vec<usize>>, b: Vec<Vec<usize>>) -> Vec<Vec<usize>> {
    let depth = a.len().max(b.len());
    let pad = |mut t: Vec<Vec<usize>>| {
        while t.len() < depth {
            let last = t.last().cloned().unwrap_or_default();
            t.push(last.iter().flat_map(|&d| [d, d]).collect());
        }
        t
    };
    let (a, b) = (pad(a), pad(b));
    let mut levels = vec![vec![root], vec![root, other]];
    for k in 1..depth {
        levels.push(a[k].iter().chain(&b[k]).copied().collect());
    }
    levels
}

/// Every split of `set` into the root's half (`ceil(m/2)` devices with the root, or for odd
/// `m` also `floor(m/2)`) and the rest, the most link weight kept inside the halves first
/// (ties: in enumeration order, the larger root half first).
fn every_split(w: &Links, set: &[usize], root: usize) -> Vec<(Vec<usize>, Vec<usize>)> {
    let others: Vec<usize> = set.iter().copied().filter(|&d| d != root).collect();
    let mut sizes = vec![set.len().div_ceil(2)];
    if set.len() % 2 == 1 && set.len() > 1 {
        sizes.push(set.len() / 2);
    }
    let mut splits = Vec::new();
    for size in sizes {
        let take = size - 1;
        let mut pick = Vec::with_capacity(take);
        combinations(&others, take, 0, &mut pick, &mut |chosen| {
            let mut half = vec![root];
            half.extend_from_slice(chosen);
            let rest: Vec<usize> = others.iter().copied().filter(|d| !chosen.contains(d)).collect();
            let score = w.inside(&half) + w.inside(&rest);
            splits.push((score, half, rest));
        });
    }
    splits.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap_or(std::cmp::Ordering::Equal));
    splits.into_iter().map(|(_, h, r)| (h, r)).collect()
}

fn combinations(items: &[usize], k: usize, from: usize, pick: &mut Vec<usize>, f: &mut impl FnMut(&[usize])) {
    if pick.len() == k {
        f(pick);
        return;
    }
    for i in from..items.len() {
        if items.len() - i < k - pick.len() {
            break;
        }
        pick.push(items[i]);
        combinations(items, k, i + 1, pick, f);
        pick.pop();
    }
}

/// A split by improvement: the root's half starts as the devices best linked to the root,
/// then the best swap between the halves is made while one keeps more weight inside them.
fn swapped_split(w: &Links, set: &[usize], root: usize) -> (Vec<usize>, Vec<usize>) {
    let mut others: Vec<usize> = set.iter().copied().filter(|&d| d != root).collect();
    others.sort_by(|&a, &b| {
        w.at(root, b).partial_cmp(&w.at(root, a)).unwrap_or(std::cmp::Ordering::Equal).then(a.cmp(&b))
    });
    let take = set.len().div_ceil(2) - 1;
    let mut half: Vec<usize> = std::iter::once(root).chain(others[..take].iter().copied()).collect();
    let mut rest: Vec<usize> = others[take..].to_vec();
    let score = |h: &[usize], r: &[usize]| w.inside(h) + w.inside(r);
    let mut best = score(&half, &rest);
    loop {
        let mut found = None;
        for i in 1..half.len() {
            for j in 0..rest.len() {
                let (mut h, mut r) = (half.clone(), rest.clone());
                std::mem::swap(&mut h[i], &mut r[j]);
                let s = score(&h, &r);
                if s > best + 1e-12 && found.as_ref().is_none_or(|(fs, _, _)| s > *fs) {
                    found = Some((s, h, r));
                }
            }
        }
        match found {
            Some((s, h, r)) => {
                best = s;
                half = h;
                rest = r;
            }
            None => return (half, rest),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An 8-GPU hybrid cube-mesh (DGX-1 style): GPUs 0-3 and 4-7 each fully linked (weight
    /// 2 on a ring, 1 on the diagonals), and GPU i linked to i+4 (weight 1).
    fn cube_mesh() -> Links {
        let n = 8;
        let mut w = vec![0.0; n * n];
        let mut link = |a: usize, b: usize, x: f64| {
            w[a * n + b] = x;
            w[b * n + a] = x;
        };
        for q in [0, 4] {
            for i in 0..4 {
                link(q + i, q + (i + 1) % 4, 2.0);
            }
            link(q, q + 2, 1.0);
            link(q + 1, q + 3, 1.0);
        }
        for i in 0..4 {
            link(i, i + 4, 1.0);
        }
        Links::new(n, w).unwrap()
    }

    /// Checks the shape of a tree over `n` devices and that it uses only links.
    fn check(tree: &Tree, links: &Links, n: usize) {
        let depth = (n as f64).log2().ceil() as usize + 1;
        assert_eq!(tree.levels.len(), depth, "{}", tree.describe());
        for (k, l) in tree.levels.iter().enumerate() {
            assert_eq!(l.len(), 1 << k);
            if k > 0 {
                // Each pair's first entry is the previous level's node at that position.
                let parents: Vec<usize> = l.chunks_exact(2).map(|p| p[0]).collect();
                assert_eq!(parents, tree.levels[k - 1]);
            }
        }
        // Every device joins exactly once (as the root or as a child).
        let mut seen = vec![tree.root()];
        seen.extend(tree.edges().iter().map(|e| e.1));
        seen.sort_unstable();
        assert_eq!(seen, (0..n).collect::<Vec<_>>(), "{}", tree.describe());
        for (a, b) in tree.edges() {
            assert!(links.at(a, b) > 0.0, "edge {a}-{b} is no link:\n{}", tree.describe());
        }
    }

    #[test]
    fn cube_mesh_trees_are_balanced_use_links_and_keep_quads_together() {
        let links = cube_mesh();
        for backtrack in [false, true] {
            let ts = trees(&links, 0.7, backtrack).unwrap();
            assert_eq!(ts.len(), 8);
            for (r, t) in ts.iter().enumerate() {
                assert_eq!(t.root(), r);
                check(t, &links, 8);
                // The first split keeps the root's quad (all its heavy links) together: the
                // other half's root is across the cube (i <-> i+4), its only link there.
                assert_eq!(t.levels[1], vec![r, (r + 4) % 8], "{}", t.describe());
            }
        }
    }

    #[test]
    fn the_penalty_spreads_trees_over_links() {
        // Four devices on a ring with both diagonals; all links equal.
        let n = 4;
        let mut w = vec![1.0; n * n];
        for i in 0..n {
            w[i * n + i] = 0.0;
        }
        let links = Links::new(n, w).unwrap();
        let usage = |penalty: f64| {
            let ts = trees(&links, penalty, false).unwrap();
            ts.iter().for_each(|t| check(t, &links, n));
            let mut count = vec![0; n * n];
            for t in &ts {
                for (a, b) in t.edges() {
                    count[a.min(b) * n + a.max(b)] += 1;
                }
            }
            *count.iter().max().unwrap()
        };
        // Without a penalty every root picks the same best-ranked links; with one they spread.
        assert!(usage(0.5) < usage(1.0), "{} vs {}", usage(0.5), usage(1.0));
    }

    #[test]
    fn odd_sizes_pad_with_self_pairs_and_missing_links_are_refused() {
        // A line 0 - 1 - 2: from 0 the tree must go through 1.
        let w = vec![0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0];
        let links = Links::new(3, w).unwrap();
        let ts = trees(&links, 1.0, false).unwrap();
        for t in &ts {
            check(t, &links, 3);
        }
        assert_eq!(ts[0].levels, vec![vec![0], vec![0, 1], vec![0, 0, 1, 2]]);
        // Two devices with no link between them: no tree.
        let none = Links::new(2, vec![0.0; 4]).unwrap();
        let err = trees(&none, 0.7, false).unwrap_err();
        assert!(err.to_string().contains("device 0 has no link to another device"), "{err}");
        // Links, but none that makes a tree from device 0: 0 - 1 and 2 - 3 only.
        let mut w = vec![0.0; 16];
        for (a, b) in [(0, 1), (2, 3)] {
            w[a * 4 + b] = 1.0;
            w[b * 4 + a] = 1.0;
        }
        let err = trees(&Links::new(4, w).unwrap(), 0.7, false).unwrap_err();
        assert!(err.to_string().contains("no binary reduction tree from device 0"), "{err}");
        assert!(trees(&links, 0.0, false).is_err(), "a penalty of 0 would remove every used link");
        assert!(Links::new(2, vec![1.0; 3]).is_err());
        assert!(Links::new(2, vec![0.0, f64::NAN, 1.0, 0.0]).is_err());
    }

    #[test]
    fn large_sets_use_the_swap_heuristic_and_still_give_valid_trees() {
        // 16 devices: two fully linked groups of 8 (weight 3), device i linked to i+8 (1).
        let n = 16;
        let mut w = vec![0.0; n * n];
        for a in 0..n {
            for b in 0..n {
                if a != b && a / 8 == b / 8 {
                    w[a * n + b] = 3.0;
                }
            }
        }
        for i in 0..8 {
            w[i * n + i + 8] = 1.0;
            w[(i + 8) * n + i] = 1.0;
        }
        let links = Links::new(n, w).unwrap();
        for (r, t) in trees(&links, 0.7, false).unwrap().iter().enumerate() {
            check(t, &links, n);
            assert_eq!(t.levels[1], vec![r, (r + 8) % 16], "the groups split at the top");
        }
    }
}
