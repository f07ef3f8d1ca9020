//! Memory slots of graph runs that record nothing: stock's static memory plan.
//!
//! Owns [`Slots`], the storage an inference run puts its intermediate results in, kept by the
//! runner between runs, and the dry run ([`Runner::plan_slots`]) that sizes them from the
//! input shapes before the first run with those shapes, so the run itself allocates nothing
//! and replaces no slot with a larger one.

use super::{planned_metas, MemoryPlan, Resolved, Runner};
use crate::context::Context;
use crate::error::Result;
use crate::ndarray::{byte_size, DType, Meta, NDArray};

/// Memory slots for the intermediate results of a run that records nothing: each result goes
/// into a free slot (the smallest that holds it; a new one, or the largest free one grown, when
/// none does), and its slot is free again once the nodes that read it are pushed. The engine
/// orders the pushed operations through the slot's variable, so a later result never
/// overwrites one before its readers have run. Peak memory is then the largest set of results
/// alive at one point of the graph, not the sum of all of them.
///
/// The choices are made as the run pushes, which sees in-place results as they are made. A
/// slot grown during a run would leave its old storage held by the run's pending operations
/// until they finish (a DenseNet block's growing concatenations took five sizes of one slot
/// at once), so before the first run with new input shapes the runner makes the same choices
/// on shapes alone ([`Runner::plan_slots`]) and sizes the slots to what they end up as; the
/// run then finds a fitting slot for every result.
#[derive(Default)]
pub(super) struct Slots {
    /// Each slot's storage (bytes, as `uint8`), with how many live results use it.
    pub arrays: Vec<(NDArray, usize)>,
    /// What the slots were last planned for.
    planned_for: Option<PlanKey>,
}

/// What a dry run's choices depend on besides the graph: the inputs' shapes and dtypes, the
/// training mode (which fused chains apply) and the plan's switches.
#[derive(PartialEq)]
struct PlanKey {
    inputs: Vec<(Vec<usize>, DType)>,
    training: bool,
    fuse: bool,
    inplace: bool,
}

/// Where a result of some size goes, given the free slots.
enum Pick {
    /// Into this slot as it is.
    Fit(usize),
    /// Into this slot, grown.
    Grow(usize),
    /// Into a new slot.
    New,
}

/// The policy of [`Slots`], over the free slots' (index, size): the smallest that holds
/// `bytes`, or else the largest, grown (rather than keep both), or else a new one.
fn pick(free: impl Iterator<Item = (usize, usize)> + Clone, bytes: usize) -> Pick {
    if let Some((j, _)) = free.clone().filter(|&(_, size)| size >= bytes).min_by_key(|&(_, size)| size) {
        return Pick::Fit(j);
    }
    match free.max_by_key(|&(_, size)| size) {
        Some((j, _)) => Pick::Grow(j),
        None => Pick::New,
    }
}

/// A slot's size for a result of `bytes`.
fn slot_bytes(bytes: usize) -> usize {
    bytes.max(1).next_multiple_of(64)
}

impl Slots {
    /// A free slot for `bytes` on `ctx`, marked used.
    pub fn take(&mut self, bytes: usize, ctx: Context) -> Result<usize> {
        let bytes = slot_bytes(bytes);
        let free = self
            .arrays
            .iter()
            .enumerate()
            .filter(|(_, (a, users))| *users == 0 && a.ctx() == Some(ctx))
            .map(|(j, (a, _))| (j, a.size()));
        let j = match pick(free, bytes) {
            Pick::Fit(j) => j,
            Pick::Grow(j) => {
                self.arrays[j].0 = NDArray::new(vec![bytes], ctx, DType::U8, false)?;
                j
            }
            Pick::New => {
                self.arrays.push((NDArray::new(vec![bytes], ctx, DType::U8, false)?, 0));
                self.arrays.len() - 1
            }
        };
        self.arrays[j].1 += 1;
        Ok(j)
    }

    /// The slot whose storage `a` is in, if any.
    pub fn of(&self, a: &NDArray) -> Option<usize> {
        self.arrays.iter().position(|(s, _)| s.same_chunk(a))
    }

    /// Slot `j` has a user fewer.
    pub fn release(&mut self, j: usize) {
        self.arrays[j].1 = self.arrays[j].1.saturating_sub(1);
    }

    /// A head in a slot (a result some operator made in place of its input) leaves with the
    /// caller: the slot is dropped here.
    pub fn give_away(&mut self, heads: &[NDArray]) {
        let before = self.arrays.len();
        self.arrays.retain(|(s, _)| !heads.iter().any(|h| h.same_chunk(s)));
        if self.arrays.len() != before {
            // The next run plans again, for the slot it lost.
            self.planned_for = None;
        }
        for (_, users) in &mut self.arrays {
            *users = 0;
        }
    }

    /// Before a run with `inputs`: when they (or the mode, or the plan) differ from the last
    /// planned run's, size the slots as `runner`'s dry run says the run will leave them
    /// (every slot on the inputs' context).
    pub fn prepare(
        &mut self,
        runner: &Runner,
        inputs: &[NDArray],
        resolved: &Resolved,
        plan: &MemoryPlan,
    ) -> Result<()> {
        let key = PlanKey {
            inputs: inputs.iter().map(|a| (a.shape.clone(), a.dtype)).collect(),
            training: crate::op::invoke::is_training(),
            fuse: plan.fuse,
            inplace: plan.inplace,
        };
        if self.planned_for.as_ref() == Some(&key) {
            return Ok(());
        }
        let Some(ctx) = inputs.first().and_then(|x| x.ctx()) else { return Ok(()) };
        if ctx.dev_type != crate::context::DevType::Cpu
            || inputs.iter().any(|x| x.ctx() != Some(ctx))
            || self.arrays.iter().any(|(a, _)| a.ctx() != Some(ctx))
        {
            return Ok(());
        }
        let mut sizes: Vec<usize> = self.arrays.iter().map(|(a, _)| a.size()).collect();
        // A run from the planned sizes may choose otherwise than the run that grew them;
        // plan again from them until a run changes nothing (twice, in practice).
        for _ in 0..4 {
            let next = runner.plan_slots(inputs, resolved, plan, sizes.clone());
            if next == sizes {
                break;
            }
            sizes = next;
        }
        for (j, &bytes) in sizes.iter().enumerate() {
            match self.arrays.get_mut(j) {
                Some((a, _)) if a.size() >= bytes => {}
                Some((a, _)) => *a = NDArray::new(vec![bytes], ctx, DType::U8, false)?,
                None => self.arrays.push((NDArray::new(vec![bytes], ctx, DType::U8, false)?, 0)),
            }
        }
        self.planned_for = Some(key);
        Ok(())
    }
}

/// The slots of a dry run: sizes only.
struct DrySlots {
    /// Each slot's size in bytes.
    sizes: Vec<usize>,
    /// How many live results use each slot.
    users: Vec<usize>,
}

/// A dry run in progress ([`Runner::plan_slots`]), per node: its output metas (empty: not
/// known), the slots its results hold (the run's `val_slots`) and each output's slot, and
/// whether a chain computes it.
struct DryRun {
    slots: DrySlots,
    metas: Vec<Vec<Meta>>,
    val_slots: Vec<Vec<usize>>,
    out_slot: Vec<Vec<Option<usize>>>,
    skip: Vec<bool>,
}

impl DryRun {
    /// Node `i`'s results are released: their slots have a user fewer.
    fn release(&mut self, i: usize) {
        for j in std::mem::take(&mut self.val_slots[i]) {
            self.slots.release(j);
        }
    }
}

impl DrySlots {
    /// A free slot for `bytes` ([`Slots::take`]'s choice), marked used.
    fn take(&mut self, bytes: usize) -> usize {
        let bytes = slot_bytes(bytes);
        let free = self.sizes.iter().copied().enumerate().filter(|&(j, _)| self.users[j] == 0);
        let j = match pick(free, bytes) {
            Pick::Fit(j) => j,
            Pick::Grow(j) => {
                self.sizes[j] = bytes;
                j
            }
            Pick::New => {
                self.sizes.push(bytes);
                self.users.push(0);
                self.sizes.len() - 1
            }
        };
        self.users[j] += 1;
        j
    }

    /// Slot `j` has a user fewer.
    fn release(&mut self, j: usize) {
        self.users[j] = self.users[j].saturating_sub(1);
    }
}

impl Runner {
    /// The slot sizes a run with `inputs` leaves when it starts from slots of `sizes`: the
    /// run's choices made on shapes alone (fused chains, in-place results, planned outputs,
    /// releases after the last reader), as [`Runner::run_monitored`] makes them. A node whose
    /// inputs or outputs it cannot tell without running (an operator with its own
    /// invocation, a failed inference) plans nothing, nor do the nodes that read it; the run
    /// grows slots for those as it goes.
    pub(super) fn plan_slots(
        &self,
        inputs: &[NDArray],
        resolved: &Resolved,
        plan: &MemoryPlan,
        sizes: Vec<usize>,
    ) -> Vec<usize> {
        let nodes = &self.graph.nodes;
        let mut d = DryRun {
            slots: DrySlots { users: vec![0; sizes.len()], sizes },
            metas: vec![Vec::new(); nodes.len()],
            val_slots: vec![Vec::new(); nodes.len()],
            out_slot: vec![Vec::new(); nodes.len()],
            skip: vec![false; nodes.len()],
        };
        for (&ni, x) in self.inputs.iter().zip(inputs) {
            d.metas[ni] = vec![Meta::new(x.shape.clone(), x.dtype)];
        }
        let training = crate::op::invoke::is_training();
        for (i, n) in nodes.iter().enumerate() {
            if n.op.is_none() {
                continue;
            }
            if !d.skip[i] {
                self.plan_node(i, resolved, plan, training, &mut d);
            }
            // Released as the run releases them: a result nothing reads at once, the inputs
            // this node reads last (`release_inputs`).
            if self.last_use[i] <= i {
                d.release(i);
            }
            for &(src, _) in &n.inputs {
                if self.last_use[src] == i && nodes[src].op.is_some() {
                    d.release(src);
                }
            }
        }
        d.slots.sizes
    }

    /// Plan operator node `i` (not computed by a chain) in dry run `d`: its outputs' slots and
    /// metas, or those of the chain it heads.
    fn plan_node(&self, i: usize, resolved: &Resolved, plan: &MemoryPlan, training: bool, d: &mut DryRun) {
        let n = &self.graph.nodes[i];
        let (Some(op), Some(attrs)) = (n.op, &n.attrs) else { return };
        let DryRun { slots, metas, val_slots, out_slot, skip } = d;
        let Some(ins) = n.inputs.iter().map(|&(src, k)| metas[src].get(k).cloned()).collect::<Option<Vec<_>>>() else {
            return;
        };
        if let Some(chain) = self.chains[i].as_ref().filter(|c| plan.fuse && c.applies(training)) {
            let others: Option<Vec<Meta>> =
                chain.steps.iter().flat_map(|(_, _, e)| e).map(|&(src, k)| metas[src].get(k).cloned()).collect();
            if let Some(others) = others {
                let all: Vec<Meta> = ins.iter().cloned().chain(others).collect();
                if let Some(out) = self.chain_output(i, chain, &all) {
                    let last = chain.last;
                    if !self.head_outputs[last].contains(&0) {
                        let Ok((_, bytes)) = byte_size(&out.shape, out.dtype) else { return };
                        let j = slots.take(bytes);
                        val_slots[last].push(j);
                        out_slot[last] = vec![Some(j)];
                    }
                    metas[last] = vec![out];
                    for k in chain.nodes() {
                        skip[k] = true;
                    }
                    return;
                }
            }
        }
        if op.invoke_with.is_some() {
            return;
        }
        let attrs = resolved.iter().find(|(k, _)| *k == i).map_or(attrs, |(_, a)| a);
        let Ok(outs) = (op.infer)(attrs, &ins) else { return };
        let inplace = match &self.inplace[i] {
            Some((ii, _)) if plan.inplace => {
                let (src, k) = n.inputs[*ii];
                let slot = out_slot[src].get(k).copied().flatten();
                let fits = outs.first().is_some_and(|o| super::inplace_fits(o, &ins[*ii]));
                match slot {
                    // A head is not written over a slot (`run_node`).
                    Some(_) if !self.head_outputs[i].is_empty() => None,
                    _ if fits => Some(slot),
                    _ => None,
                }
            }
            _ => None,
        };
        out_slot[i] = vec![None; outs.len()];
        match inplace {
            // The result is its input's memory: one more user of the input's slot.
            Some(Some(j)) => {
                slots.users[j] += 1;
                val_slots[i].push(j);
                out_slot[i][0] = Some(j);
            }
            Some(None) => {}
            // `plan_outputs`, which plans nothing for a call without inputs (no context).
            None if self.flows[i].is_none() && !ins.is_empty() => {
                for (k, m) in planned_metas(op, attrs, &ins).into_iter().flatten().enumerate() {
                    if self.head_outputs[i].contains(&k) {
                        continue;
                    }
                    let Ok((_, bytes)) = byte_size(&m.shape, m.dtype) else { break };
                    let j = slots.take(bytes);
                    val_slots[i].push(j);
                    out_slot[i][k] = Some(j);
                }
            }
            None => {}
        }
        metas[i] = outs;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pick_takes_the_smallest_fit_else_grows_the_largest() {
        let free = [(0, 128), (1, 64), (3, 256)];
        assert!(matches!(pick(free.iter().copied(), 100), Pick::Fit(0)));
        assert!(matches!(pick(free.iter().copied(), 64), Pick::Fit(1)));
        assert!(matches!(pick(free.iter().copied(), 300), Pick::Grow(3)));
        assert!(matches!(pick(std::iter::empty(), 1), Pick::New));
    }

    #[test]
    fn dry_slots_follow_the_policy() {
        let mut s = DrySlots { sizes: vec![], users: vec![] };
        let a = s.take(100);
        let b = s.take(50);
        assert_eq!((a, b), (0, 1));
        s.release(a);
        // Grows the only free slot rather than adding one.
        assert_eq!(s.take(200), 0);
        assert_eq!(s.sizes, vec![256, 64]);
        s.release(b);
        assert_eq!(s.take(10), 1);
    }
}
