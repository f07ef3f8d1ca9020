//! KVStore: the key-value stores of `mx.kv.create('local')` and `mx.kv.create('device')`,
//! with which data-parallel training sums gradients over devices and keeps weights.
//!
//! Owns: the stored values by key (int keys, or string keys mapped to ints, never both in one
//! store), the merge buffers that pushes reduce into, the optimizer updater a push runs, and
//! 2-bit gradient compression's residuals. Behaviour is stock 1.9.1's `KVStoreLocal`:
//! - `init` copies each value to `cpu_pinned(0)`;
//! - `push` groups the values by key (keys ascending, values of a key in the order given),
//!   sums each group into the key's merge buffer (`local`: on the host, added four sources at
//!   a time; `device`: on the sources' devices, load-balanced by size, added left to right),
//!   then either calls the updater with (key, sum, stored value) or makes the sum the stored
//!   value. One value with no compression is its own sum (no copy): the store then holds the
//!   pushed array itself, as stock's does;
//! - `pull` copies the stored value into every output (converting dtype when they differ);
//! - `broadcast` is `init` then `pull`, `pushpull` is `push` then `pull`.
//!
//! Every copy and sum is an engine operation on the arrays' variables, at the caller's
//! priority, so pushes and pulls overlap with computation; the updater runs on the pushing
//! thread, as stock's does (it pushes the optimizer's operations in turn). Unlike stock, bad
//! input is refused before anything changes: an unknown or uninitialised key, a duplicate
//! init, a pushed or pulled shape that differs from the key's, a device array.
//!
//! Sums of big arrays (at least `MXNET_KVSTORE_BIGARRAY_BOUND` elements) run on
//! `MXNET_KVSTORE_REDUCTION_NTHREADS` threads; both are read at each push.
//!
//! Distributed stores (`dist_sync`, `dist_device_sync`) are these stores plus one step across
//! the worker processes, over MPI ([`mpi`]) instead of stock's parameter servers: `init`
//! broadcasts rank 0's values, `push` sums each key's local sum over the ranks (an allreduce;
//! with 2-bit compression an allgather of the packed pushes, summed in rank order) and every
//! rank then runs the same update, so the stored values stay equal on every rank, as stock's
//! servers keep one copy. Processes whose `DMLC_ROLE` is `server` or `scheduler` (MXNet's
//! launcher starts them) get a store that only answers that it has nothing to serve.

mod kernels;
pub mod mpi;
pub mod tree;

use crate::context::{Context, DevType};
use crate::engine::{self, FnProperty, Push, Var, VarList};
use crate::error::{Error, Result};
use crate::ndarray::{DType, NDArray};
use crate::op::kernel::{par_for_mut, Cost};
use crate::op::tensor::{OutBlob, TBlob};
use crate::sync::Mutex;
use kernels::Order;
use std::collections::HashMap;
use std::sync::Arc;

/// The keys of one call: all ints or all strings (the C API has one function for each).
#[derive(Debug, Clone, Copy)]
pub enum Keys<'a> {
    Int(&'a [i32]),
    Str(&'a [&'a str]),
}

impl Keys<'_> {
    pub fn len(&self) -> usize {
        match self {
            Keys::Int(k) => k.len(),
            Keys::Str(k) => k.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn kind(&self) -> KeyType {
        match self {
            Keys::Int(_) => KeyType::Int,
            Keys::Str(_) => KeyType::Str,
        }
    }
    fn describe(&self, i: usize) -> String {
        match self {
            Keys::Int(k) => k[i].to_string(),
            Keys::Str(k) => k[i].to_string(),
        }
    }
}

/// The key an updater is called with: as the keys were given.
#[derive(Debug, Clone, Copy)]
pub enum UpdaterKey<'a> {
    Int(i32),
    Str(&'a str),
}

/// An optimizer step the store runs at each push: `(key, summed gradient, stored weight)`;
/// it updates the stored weight in place (by pushing operations).
pub type Updater = Arc<dyn Fn(UpdaterKey<'_>, &NDArray, &NDArray) + Send + Sync>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyType {
    Int,
    Str,
}

/// Where a store sums: stock's `CommCPU` and `CommDevice`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Comm {
    Host,
    Device,
}

/// The buffers one key's pushes reduce into.
struct Merge {
    ctx: Context,
    merged: NDArray,
    /// Copies of the sources after the first (all sources with compression).
    copies: Vec<NDArray>,
    /// Per source, with compression: (residual on the source's device, packed form there,
    /// packed form on the merge device when that differs).
    compressed: Vec<(NDArray, NDArray, Option<NDArray>)>,
}

struct Entry {
    /// The stored value; after a push without updater, the sum itself (see the module doc).
    value: NDArray,
    shape: Vec<usize>,
    /// The dtype the key was initialised with: sums are computed in it (as stock's `device`
    /// store does; values pushed in another dtype are converted).
    dtype: DType,
    merge: Option<Merge>,
    /// `device`: the context this key's sums run on, once placed.
    place: Option<Context>,
    /// Distributed stores: the buffers of the step across the ranks.
    cross: Option<Cross>,
}

#[derive(Default)]
struct State {
    key_type: Option<KeyType>,
    entries: HashMap<i32, Entry>,
    str_ids: HashMap<String, i32>,
    str_names: HashMap<i32, String>,
    next_str: i32,
    updater: Option<Updater>,
    str_updater: Option<Updater>,
    /// 2-bit compression's threshold, once set.
    threshold: Option<f32>,
    /// `device`: elements placed on each context so far.
    loads: Vec<(Context, usize)>,
    /// Distributed stores: calls that may issue collectives (push, init, broadcast, barrier)
    /// made so far, refused ones included, so that a call one rank skips shows.
    calls: u64,
}

/// A `local` or `device` store.
pub struct KVStore {
    name: String,
    comm: Comm,
    span: Span,
    /// A distributed store's number among the process's, given at its first collective (in
    /// program order under the world's order; a store only some ranks create then shifts
    /// nothing).
    number: std::sync::OnceLock<u32>,
    state: Mutex<State>,
}

/// Which processes a store spans.
#[derive(Clone, Copy)]
enum Span {
    /// This process alone (`local`, `device`).
    Local,
    /// A distributed store's worker: the MPI world's ranks.
    Workers(&'static mpi::World),
    /// A distributed store in a server or scheduler process: nothing to serve (the workers
    /// reduce among themselves).
    ServerRole,
}

/// The role of this process in distributed training, as stock's ps-lite reads it from
/// `DMLC_ROLE` (or from [`set_ps_env`]): a worker when unset or `worker`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Worker,
    Server,
    Scheduler,
    /// Another value: neither (stock's answers for it).
    Other,
}

/// `MXInitPSEnv`'s settings, which take precedence over the environment.
fn ps_env() -> &'static Mutex<HashMap<String, String>> {
    static ENV: std::sync::OnceLock<Mutex<HashMap<String, String>>> = std::sync::OnceLock::new();
    ENV.get_or_init(|| Mutex::new(HashMap::new()))
}

/// `MXInitPSEnv`: settings of the distributed environment (`DMLC_ROLE`, ...) that take
/// precedence over the process environment.
pub fn set_ps_env(pairs: &[(&str, &str)]) {
    let mut env = ps_env().lock();
    env.clear(); // replaced, as ps-lite's Environment::Init replaces its settings
    for (k, v) in pairs {
        env.insert(k.to_string(), v.to_string());
    }
}

/// This process's role (see [`Role`]).
pub fn role() -> Role {
    let set = ps_env().lock().get("DMLC_ROLE").cloned();
    match set.or_else(|| std::env::var("DMLC_ROLE").ok()).as_deref() {
        None | Some("worker") => Role::Worker,
        Some("server") => Role::Server,
        Some("scheduler") => Role::Scheduler,
        Some(_) => Role::Other,
    }
}

/// A distributed store's buffers for one key: the sum over the ranks, the key's dtype's copy
/// of a pushed value of another dtype, and with compression (residual, this rank's packed
/// push, every rank's packed pushes).
struct Cross {
    reduced: NDArray,
    cast: Option<NDArray>,
    compressed: Option<(NDArray, NDArray, NDArray)>,
}

/// A distributed worker's right to issue collectives: the world's order (held while they are
/// taken and pushed), this store's number, and the number of the call (push, init,
/// broadcast, barrier) that holds it.
struct Issue {
    order: mpi::Order<'static>,
    world: &'static mpi::World,
    store: u32,
    round: u64,
}

impl Issue {
    /// The next collective's ticket and tag (key `key`; -1 for a barrier).
    fn next(&self, key: i32) -> (mpi::Ticket, mpi::Tag) {
        (self.order.ticket(), mpi::Tag { store: self.store, key, round: self.round })
    }
}

/// Where stored values live (stock's pinned context).
fn pinned() -> Context {
    Context { dev_type: DevType::CpuPinned, dev_id: 0 }
}

fn host_only(a: &NDArray, what: &str) -> Result<()> {
    match a.ctx() {
        None => Err(Error::mxnet(format!("{what} is an empty array (created with MXNDArrayCreateNone)"))),
        Some(c) if !c.dev_type.is_host() => Err(Error::not_supported(format!("KVStore with arrays on {c}"))),
        Some(_) => Ok(()),
    }
}

/// Whether `a` and `b` are views of one memory block (the same variable, or an alias of it:
/// a custom operator's view).
fn same_block(a: &NDArray, b: &NDArray) -> bool {
    matches!((&a.chunk, &b.chunk), (Some(x), Some(y)) if Var::same_block(x, y))
}

/// Whether `a` and `b` are views of one variable.
fn same_var(a: &NDArray, b: &NDArray) -> bool {
    matches!((&a.chunk, &b.chunk), (Some(x), Some(y)) if Arc::ptr_eq(x, y))
}

fn shape_text(s: &[usize]) -> String {
    format!("({})", s.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(","))
}

/// Push `f` to the engine as `name`, reading `reads` and writing `writes`, at `priority`.
/// Refused unless every array is on the host and no written array shares a memory block
/// with another array of the operation: that is what makes the views below sound.
fn push_op(
    name: &str,
    reads: &[&NDArray],
    writes: &[&NDArray],
    priority: i32,
    f: impl FnOnce(&[TBlob], &mut [OutBlob]) -> Result<()> + Send + 'static,
) -> Result<()> {
    check_distinct(name, reads, writes)?;
    let mut const_vars: VarList = VarList::new();
    let mut ins = Vec::with_capacity(reads.len());
    for r in reads {
        host_only(r, "an input")?;
        let v: &Arc<Var> = r.chunk()?;
        if !const_vars.iter().any(|c| Arc::ptr_eq(c, v)) {
            const_vars.push(v.clone());
        }
        // SAFETY: the address is the view's start inside its chunk (`data` allocates it); the
        // operation holds the chunk's variable for reading, so nothing writes it while the
        // blob is used, and no blob this operation writes shares the memory block (checked
        // above, aliases included). The chunk stays alive: the variable list and `keep` hold it.
        ins.push(unsafe { TBlob::new(r.data()?, &r.shape, r.dtype) });
    }
    let mut mutable_vars: VarList = VarList::new();
    let mut outs = Vec::with_capacity(writes.len());
    for w in writes {
        host_only(w, "an output")?;
        mutable_vars.push(w.chunk()?.clone());
        // SAFETY: as above; the operation holds the variable for writing, and no other blob
        // of the operation shares the memory block (checked above), so this blob is the one
        // access.
        outs.push(unsafe { OutBlob::new(w.data()?, &w.shape, w.dtype) });
    }
    let keep: Vec<NDArray> = reads.iter().chain(writes).map(|a| (*a).clone()).collect();
    let p = Push::sync(
        move |_| {
            let _keep = &keep;
            f(&ins, &mut outs)
        },
        const_vars,
        mutable_vars,
    );
    submit(p, &crate::intern::intern(name), priority)
}

/// Refuse an operation whose written array shares a memory block with another of its arrays.
fn check_distinct(name: &str, reads: &[&NDArray], writes: &[&NDArray]) -> Result<()> {
    for (i, w) in writes.iter().enumerate() {
        let clash = reads.iter().any(|r| same_block(r, w)) || writes[..i].iter().any(|o| same_block(o, w));
        if clash {
            return Err(Error::mxnet(format!("{name}: an array it writes shares memory with another of its arrays")));
        }
    }
    Ok(())
}

/// Push the collective `call` makes of the arrays' memory (`reads` then `writes`, as
/// regions, all of `dtype`) as an asynchronous engine operation: it hands `ticket` to the MPI
/// thread once the arrays are ready and finishes when the collective has run. Checked as
/// [`push_op`].
fn push_collective(
    name: &str,
    (reads, writes): (&[&NDArray], &[&NDArray]),
    dtype: DType,
    priority: i32,
    ticket: mpi::Ticket,
    call: impl FnOnce(&[mpi::Region]) -> mpi::Call + Send + 'static,
) -> Result<()> {
    check_distinct(name, reads, writes)?;
    if let Some(a) = reads.iter().chain(writes).find(|a| a.dtype != dtype) {
        return Err(Error::internal(format!("{name}: a {} array in a {} collective", a.dtype.name(), dtype.name())));
    }
    let mut const_vars: VarList = VarList::new();
    let mut mutable_vars: VarList = VarList::new();
    let mut regions = Vec::with_capacity(reads.len() + writes.len());
    for (k, a) in reads.iter().chain(writes).enumerate() {
        host_only(a, if k < reads.len() { "an input" } else { "an output" })?;
        let v: &Arc<Var> = a.chunk()?;
        if k >= reads.len() {
            mutable_vars.push(v.clone());
        } else if !const_vars.iter().any(|c| Arc::ptr_eq(c, v)) {
            const_vars.push(v.clone());
        }
        // SAFETY: the address is the view's start inside its chunk, holding `size()`
        // elements of its dtype, which is the collective's (checked above). The operation holds the arrays' variables (for reading or
        // writing) until its completion, which the MPI thread calls after the collective has
        // run, so nothing else writes them (or, for written ones, reads them) meanwhile; no
        // written array shares a block with another (checked above); `keep` holds the chunks.
        regions.push(unsafe { mpi::Region::new(a.data()?, a.size()) });
    }
    let keep: Vec<NDArray> = reads.iter().chain(writes).map(|a| (*a).clone()).collect();
    let p = Push::asynchronous(
        move |_, completion| {
            let c = call(&regions);
            ticket.run(c, move |r| {
                drop(keep);
                completion.complete(r);
            });
        },
        const_vars,
        mutable_vars,
    );
    submit(p, &crate::intern::intern(name), priority)
}

/// Submit one of the store's operations as `name` at the caller's `priority`
/// (`CpuPrioritized`, as stock's communicators push theirs).
fn submit<'a>(p: Push<'a>, name: &'a Arc<str>, priority: i32) -> Result<()> {
    engine::global()?.submit(Push { priority, prop: FnProperty::CpuPrioritized, name: Some(name), ..p })
}

/// Whether [`copy`] can copy `src` into `dst`: views of one memory block must be views of
/// one variable (not a custom operator's alias, which the engine does not order against its
/// root) and, where their bytes meet, of one dtype.
fn copy_check(src: &NDArray, dst: &NDArray) -> Result<()> {
    if !same_block(src, dst) {
        return Ok(());
    }
    if !same_var(src, dst) {
        return Err(Error::not_supported("a KVStore copy between an array and a custom operator's view of it"));
    }
    if src.dtype != dst.dtype {
        return Err(Error::not_supported("a KVStore copy with a dtype change between views of one array"));
    }
    Ok(())
}

/// Source and destination of a copy within one chunk.
struct WithinChunk {
    src: *const u8,
    dst: *mut u8,
    bytes: usize,
}
// SAFETY: only the addresses move to the engine's thread; they are dereferenced there by
// `ptr::copy` alone, while the operation holds the chunk for writing (see `copy`).
unsafe impl Send for WithinChunk {}

/// Copy `src` into `dst` (same number of elements; the dtype converts) as an engine
/// operation. Nothing to do when they are the same bytes; views of one array (which may
/// overlap; one dtype, see [`copy_check`]) are copied as bytes in one operation that holds
/// the array for writing.
fn copy(src: &NDArray, dst: &NDArray, priority: i32) -> Result<()> {
    copy_check(src, dst)?;
    let (sd, dd) = (src.dtype, dst.dtype);
    if same_var(src, dst) {
        if src.offset == dst.offset {
            return Ok(());
        }
        let m = WithinChunk { src: src.data()?, dst: dst.data()?, bytes: src.size() * sd.size() };
        let keep = (src.clone(), dst.clone());
        let p = Push::sync(
            move |_| {
                let _keep = &keep;
                let m = m;
                // SAFETY: both ranges lie inside the chunk (a view is checked against its
                // chunk when it is made), which `keep` keeps alive and this operation holds
                // for writing, so nothing else reads or writes it meanwhile; `ptr::copy`
                // allows the ranges to overlap, and no reference to them is made.
                unsafe { std::ptr::copy(m.src, m.dst, m.bytes) };
                Ok(())
            },
            VarList::new(),
            [dst.chunk()?.clone()].into_iter().collect::<VarList>(),
        );
        return submit(p, &crate::intern::intern("CopyCPU2CPU"), priority);
    }
    push_op("CopyCPU2CPU", &[src], &[dst], priority, move |ins, outs| {
        if sd == dd {
            crate::dispatch_num!(sd, "KVStore copy", T => {
                let src = ins[0].as_slice::<T>();
                // On the kernel threads for big arrays, as other operators' copies.
                par_for_mut(outs[0].as_mut::<T>(), 1, Cost(0.1), sd, |r, dst| dst.copy_from_slice(&src[r]));
            });
        } else {
            crate::dispatch_num!(sd, "KVStore copy", S => {
                crate::dispatch_num!(dd, "KVStore copy", D => kernels::cast_copy(ins[0].as_slice::<S>(), outs[0].as_mut::<D>()))
            });
        }
        Ok(())
    })
}

/// The reduction's configuration, read at each push: arrays of at least
/// `MXNET_KVSTORE_BIGARRAY_BOUND` elements are summed on `MXNET_KVSTORE_REDUCTION_NTHREADS`
/// threads, others on one.
#[derive(Clone, Copy)]
struct Reduction {
    bound: usize,
    threads: usize,
}

impl Reduction {
    fn read() -> Result<Self> {
        let reg = crate::config::global();
        const BY: &str = "KVStore push";
        let bound = reg.get_int("MXNET_KVSTORE_BIGARRAY_BOUND", BY)?.unwrap_or(1_000_000).max(1) as usize;
        let threads = reg.get_int("MXNET_KVSTORE_REDUCTION_NTHREADS", BY)?.unwrap_or(4).max(1) as usize;
        Ok(Reduction { bound, threads })
    }
    fn threads(self, elements: usize) -> usize {
        if elements >= self.bound {
            self.threads
        } else {
            1
        }
    }
}

/// Push the 2-bit quantization of `src` (with its `residual`) into `packed`.
fn push_quantize(src: &NDArray, residual: &NDArray, packed: &NDArray, threshold: f32, priority: i32) -> Result<()> {
    push_op("QuantizeCPU", &[src], &[residual, packed], priority, move |ins, outs| {
        let (r, p) = outs.split_at_mut(1);
        kernels::quantize_2bit(ins[0].as_slice::<f32>(), r[0].as_mut::<f32>(), p[0].as_mut::<u8>(), threshold);
        Ok(())
    })
}

/// A float32 array of zeros (a compression residual).
fn zeros_f32(shape: Vec<usize>, ctx: Context) -> Result<NDArray> {
    let a = NDArray::new(shape, ctx, DType::F32, false)?;
    let zeros = vec![0f32; a.size()];
    // SAFETY: `zeros` holds the array's elements and outlives the (waited-for) copy.
    unsafe { a.copy_from_host(zeros.as_ptr() as *const u8, zeros.len())? };
    Ok(a)
}

/// Push the sum of `srcs` into `dst` (`first`: whether `dst` already holds the first source,
/// which `srcs` then lacks).
fn push_sum(srcs: &[&NDArray], dst: &NDArray, order: Order, first: bool, threads: usize, priority: i32) -> Result<()> {
    let dtype = dst.dtype;
    push_op("KVStoreReduce", srcs, &[dst], priority, move |ins, outs| {
        crate::dispatch_num!(dtype, "KVStore reduction", T => {
            let all: Vec<&[T]> = ins.iter().map(|b| b.as_slice::<T>()).collect();
            let out = outs[0].as_mut::<T>();
            let rest = if first { &all[..] } else {
                out.copy_from_slice(all[0]);
                &all[1..]
            };
            kernels::sum_into(out, rest, order, threads);
        });
        Ok(())
    })
}

impl KVStore {
    /// `mx.kv.create(name)`: `local` (or any name without `device`/`dist`/`nccl`) sums on
    /// the host, a name containing `device` on the arrays' devices. A name containing `dist`
    /// makes a distributed store (MPI, started here in a worker); `dist_async` and NCCL
    /// stores are refused.
    pub fn create(name: &str) -> Result<Self> {
        let lower = name.to_lowercase();
        if lower.contains("nccl") {
            return Err(Error::not_supported(format!("the NCCL KVStore '{name}' (no GPU support in this build)")));
        }
        let span = if !lower.contains("dist") {
            Span::Local
        } else if lower.contains("async") {
            return Err(Error::not_supported(format!(
                "the asynchronous distributed KVStore '{name}' (use 'dist_sync' or 'dist_device_sync': synchronous training over MPI)"
            )));
        } else if role() == Role::Worker {
            let world = mpi::world()?;
            // MXNet's launcher says how many workers it started: all of them must be in this
            // world (workers started without mpirun would each train alone).
            let said =
                ps_env().lock().get("DMLC_NUM_WORKER").cloned().or_else(|| std::env::var("DMLC_NUM_WORKER").ok());
            if let Some(n) = said {
                if n.trim().parse::<i32>().ok() != Some(world.size()) {
                    return Err(Error::mxnet(format!(
                        "DMLC_NUM_WORKER is {n} but MPI started {} worker(s): launch the workers with `mpirun -np {n}` \
                         (or MXNet's tools/launch.py --launcher mpi)",
                        world.size()
                    )));
                }
            }
            Span::Workers(world)
        } else {
            Span::ServerRole
        };
        let comm = if lower.contains("device") { Comm::Device } else { Comm::Host };
        Ok(KVStore { name: lower, comm, span, number: std::sync::OnceLock::new(), state: Mutex::new(State::default()) })
    }

    /// This worker's rank (0 unless distributed).
    pub fn rank(&self) -> i32 {
        match self.span {
            Span::Workers(world) => world.rank(),
            _ => 0,
        }
    }

    /// The number of workers (1 unless distributed).
    pub fn num_workers(&self) -> i32 {
        match self.span {
            Span::Workers(world) => world.size(),
            _ => 1,
        }
    }

    /// Whether this is a distributed store (of a worker or a server process).
    pub fn is_distributed(&self) -> bool {
        !matches!(self.span, Span::Local)
    }

    /// `Barrier`: wait until every worker has reached it (after this worker's earlier
    /// pushes and inits have run). Nothing to wait for unless distributed.
    pub fn barrier(&self) -> Result<()> {
        let (ticket, tag, world) = {
            let mut st = self.state.lock();
            let Some(issue) = self.issue(&mut st)? else { return Ok(()) };
            let (ticket, tag) = issue.next(-1);
            (ticket, tag, issue.world)
        };
        world.run_blocking(ticket, mpi::Call::Barrier { tag })
    }

    /// A distributed worker's right to issue collectives, held while they are pushed (see
    /// [`Issue`]); `None` unless this is a distributed worker's store. Taken first thing by
    /// every call that may issue collectives, and counted there, before any check can refuse
    /// the call. Refused in a forked child.
    fn issue(&self, st: &mut State) -> Result<Option<Issue>> {
        match self.span {
            Span::Workers(world) => {
                let order = world.order()?;
                let store = *self.number.get_or_init(|| world.new_store());
                let round = st.calls;
                st.calls += 1;
                Ok(Some(Issue { order, world, store, round }))
            }
            _ => Ok(None),
        }
    }

    /// The type name (lower case), as `kv.type` shows it.
    pub fn type_name(&self) -> &str {
        &self.name
    }

    /// `SetUpdater(Ex)`: the updaters pushes of int and string keys call.
    pub fn set_updater(&self, int: Option<Updater>, string: Option<Updater>) {
        let mut st = self.state.lock();
        if int.is_some() {
            st.updater = int;
        }
        if string.is_some() {
            st.str_updater = string;
        }
    }

    /// `SetGradientCompression`: `type` (`2bit`, the one kind 1.9.1 has) and `threshold`
    /// (default 0.5, must be > 0). Compression applies to `device` stores' pushes (a `local`
    /// store accepts the setting and ignores it, as stock's does).
    pub fn set_gradient_compression(&self, params: &[(&str, &str)]) -> Result<()> {
        let (mut kind, mut threshold) = (None, 0.5f32);
        for &(k, v) in params {
            match k {
                "type" => kind = Some(v),
                "threshold" => {
                    threshold = v.trim().parse::<f32>().map_err(|_| {
                        Error::mxnet(format!("Invalid Parameter format for threshold expect float but value='{v}'"))
                    })?
                }
                _ => {} // stock ignores unknown keys (InitAllowUnknown)
            }
        }
        let kind = kind.ok_or_else(|| Error::mxnet("Required parameter type of string is not presented"))?;
        if threshold.is_nan() || threshold <= 0.0 {
            return Err(Error::mxnet(format!("threshold must be greater than 0 (got {threshold})")));
        }
        if kind != "2bit" {
            return Err(Error::mxnet(format!("Unknown type for gradient compression {kind}")));
        }
        self.state.lock().threshold = Some(threshold);
        Ok(())
    }

    fn check_key_type(st: &State, keys: &Keys) -> Result<()> {
        match st.key_type {
            Some(t) if t != keys.kind() => Err(Error::mxnet("Mixed key types are not allowed")),
            _ => Ok(()),
        }
    }

    /// The int ids of existing `keys`.
    fn ids(st: &State, keys: &Keys) -> Result<Vec<i32>> {
        Self::check_key_type(st, keys)?;
        let ids: Vec<i32> = match keys {
            Keys::Int(k) => k.to_vec(),
            Keys::Str(k) => k
                .iter()
                .map(|s| {
                    st.str_ids
                        .get(*s)
                        .copied()
                        .ok_or_else(|| Error::mxnet(format!("key {s} doesn't exist. Did you init?")))
                })
                .collect::<Result<_>>()?,
        };
        for (i, id) in ids.iter().enumerate() {
            if !st.entries.contains_key(id) {
                return Err(Error::mxnet(format!("key {} has not been initialized", keys.describe(i))));
            }
        }
        Ok(ids)
    }

    /// `Init`: store a copy of each value under its key.
    pub fn init(&self, keys: Keys, values: &[NDArray]) -> Result<()> {
        let mut st = self.state.lock();
        let issue = self.issue(&mut st)?;
        Self::init_locked(&mut st, keys, values, issue.as_ref())
    }

    /// `issue`: a distributed store's, whose rank 0's values every rank takes.
    fn init_locked(st: &mut State, keys: Keys, values: &[NDArray], issue: Option<&Issue>) -> Result<()> {
        if keys.len() != values.len() {
            return Err(Error::mxnet(format!("{} keys but {} values", keys.len(), values.len())));
        }
        Self::check_key_type(st, &keys)?;
        for (i, v) in values.iter().enumerate() {
            host_only(v, "a value")?;
            if issue.is_some() && v.dtype == DType::Bool {
                return Err(Error::not_supported(format!(
                    "a distributed KVStore key of bool values (key {}; MPI has no sum of them)",
                    keys.describe(i)
                )));
            }
            let dup = match keys {
                Keys::Int(k) => st.entries.contains_key(&k[i]) || k[..i].contains(&k[i]),
                Keys::Str(k) => st.str_ids.contains_key(k[i]) || k[..i].contains(&k[i]),
            };
            if dup {
                return Err(Error::mxnet(format!(
                    "duplicate init of key {}. Please double check if you called kv.init or kv.broadcast with this key multiple times",
                    keys.describe(i)
                )));
            }
        }
        // Allocate everything before changing anything.
        let stored: Vec<NDArray> =
            values.iter().map(|v| NDArray::new(v.shape.clone(), pinned(), v.dtype, false)).collect::<Result<_>>()?;
        // String keys get the next ids, in order.
        let ids: Vec<i32> = match keys {
            Keys::Int(k) => k.to_vec(),
            Keys::Str(_) => (0..values.len()).map(|i| st.next_str + i as i32).collect(),
        };
        // Every ticket up front: one the loop below does not use (it failed) tells the other
        // ranks, so that every rank takes as many.
        let mut tickets: std::collections::VecDeque<_> =
            issue.map(|iss| ids.iter().map(|&id| iss.next(id)).collect()).unwrap_or_default();
        for (v, s) in values.iter().zip(&stored) {
            copy(v, s, 0)?;
            if let Some((ticket, tag)) = tickets.pop_front() {
                let dtype = s.dtype;
                push_collective("MPIBroadcast", (&[], &[s]), dtype, 0, ticket, move |r| mpi::Call::Bcast {
                    tag,
                    dtype,
                    buf: r[0],
                })?;
            }
        }
        // The keys exist once everything was pushed.
        st.key_type = Some(keys.kind());
        for (i, (v, s)) in values.iter().zip(stored).enumerate() {
            if let Keys::Str(k) = keys {
                st.next_str += 1;
                st.str_ids.insert(k[i].to_string(), ids[i]);
                st.str_names.insert(ids[i], k[i].to_string());
            }
            st.entries.insert(
                ids[i],
                Entry { shape: v.shape.clone(), dtype: v.dtype, value: s, merge: None, place: None, cross: None },
            );
        }
        Ok(())
    }

    /// Positions of `ids` grouped by key: keys ascending, positions in the order given.
    fn group(ids: &[i32]) -> Vec<(i32, Vec<usize>)> {
        let mut order: Vec<usize> = (0..ids.len()).collect();
        order.sort_by_key(|&i| ids[i]); // stable: a key's values keep their order
        let mut groups: Vec<(i32, Vec<usize>)> = Vec::new();
        for i in order {
            match groups.last_mut() {
                Some((k, v)) if *k == ids[i] => v.push(i),
                _ => groups.push((ids[i], vec![i])),
            }
        }
        groups
    }

    /// `Push`: sum each key's values and update or replace the stored value.
    pub fn push(&self, keys: Keys, values: &[NDArray], priority: i32) -> Result<()> {
        let calls = {
            let mut st = self.state.lock();
            self.push_locked(&mut st, keys, values, priority)?
        };
        // The updater runs without the lock: it calls back into this library.
        for (updater, key, merged, stored) in calls {
            match &key {
                Pushed::Int(k) => updater(UpdaterKey::Int(*k), &merged, &stored),
                Pushed::Str(k) => updater(UpdaterKey::Str(k), &merged, &stored),
            }
        }
        Ok(())
    }

    fn push_locked(&self, st: &mut State, keys: Keys, values: &[NDArray], priority: i32) -> Result<Vec<UpdaterCall>> {
        let issue = self.issue(st)?;
        if keys.len() != values.len() {
            return Err(Error::mxnet(format!("{} keys but {} values", keys.len(), values.len())));
        }
        let ids = Self::ids(st, &keys)?;
        let groups = Self::group(&ids);
        // Distributed stores compress what crosses between ranks (as stock's workers compress
        // what they send their servers), and not the sums over a rank's devices (stock's
        // `dist_device_sync` does not compress twice).
        let compress = if self.comm == Comm::Device && issue.is_none() { st.threshold } else { None };
        let cross_compress = issue.as_ref().and(st.threshold);
        for (id, members) in &groups {
            let e = st.entries.get(id).ok_or_else(|| Error::internal("a checked KVStore key vanished"))?;
            for &i in members {
                let v = &values[i];
                host_only(v, "a pushed value")?;
                if v.shape != e.shape {
                    return Err(Error::mxnet(format!(
                        "shape mismatch for key {}: it was initialized with shape {}, pushed {}",
                        keys.describe(i),
                        shape_text(&e.shape),
                        shape_text(&v.shape)
                    )));
                }
                if (compress.is_some() || cross_compress.is_some()) && (v.dtype != DType::F32 || e.dtype != DType::F32)
                {
                    return Err(Error::not_supported(format!(
                        "gradient compression of {} arrays (key {}; it compresses float32)",
                        if v.dtype != DType::F32 { v.dtype } else { e.dtype }.name(),
                        keys.describe(i)
                    )));
                }
            }
        }
        // Everything that can fail happens before the first operation is pushed: a refused push
        // changes no stored value.
        let reduction = Reduction::read()?;
        let srcs_of = |members: &[usize]| members.iter().map(|&i| &values[i]).collect::<Vec<&NDArray>>();
        for (id, members) in &groups {
            self.prepare(st, *id, &srcs_of(members), compress)?;
            if let Some(issue) = &issue {
                Self::prepare_cross(st, *id, &srcs_of(members), issue.world, cross_compress.is_some())?;
            }
        }
        // Every ticket up front (see `init_locked`).
        let mut tickets: std::collections::VecDeque<_> =
            issue.as_ref().map(|iss| groups.iter().map(|(id, _)| iss.next(*id)).collect()).unwrap_or_default();
        let mut calls = Vec::new();
        for (id, members) in &groups {
            let mut merged = Self::reduce(st, *id, &srcs_of(members), compress, self.comm, reduction, priority)?;
            if let Some(ticket) = tickets.pop_front() {
                merged = Self::across(st, *id, ticket, &merged, cross_compress, priority)?;
            }
            // As stock: an update needs the int-key updater; string keys go to the string
            // one when there is one, else to the int one with the key's internal number.
            let call = match (&st.updater, &st.str_updater, keys) {
                (None, _, _) => None,
                (Some(_), Some(su), Keys::Str(_)) => {
                    let name = st.str_names.get(id).ok_or_else(|| Error::internal("a string key without its name"))?;
                    Some((su.clone(), Pushed::Str(name.clone())))
                }
                (Some(u), _, _) => Some((u.clone(), Pushed::Int(*id))),
            };
            let entry = st.entries.get_mut(id).ok_or_else(|| Error::internal("a checked KVStore key vanished"))?;
            match call {
                Some((u, key)) => calls.push((u, key, merged, entry.value.clone())),
                // A distributed store keeps its value apart from the sum's buffer, as stock's
                // server copies the sum into its stored value.
                None if issue.is_some() => copy(&merged, &entry.value, priority)?,
                None => entry.value = merged,
            }
        }
        Ok(calls)
    }

    /// The buffers one key's push of `srcs` sums into, allocated (and placed) before anything
    /// is pushed. A single value without compression needs none.
    fn prepare(&self, st: &mut State, id: i32, srcs: &[&NDArray], compress: Option<f32>) -> Result<()> {
        if srcs.len() == 1 && compress.is_none() {
            return Ok(());
        }
        let ctx = match self.comm {
            Comm::Host => pinned(),
            Comm::Device => Self::place(st, id, srcs)?,
        };
        let entry = st.entries.get_mut(&id).ok_or_else(|| Error::internal("a checked KVStore key vanished"))?;
        let (shape, dtype) = (entry.shape.clone(), entry.dtype);
        let m = match &mut entry.merge {
            Some(m) if m.ctx == ctx => m,
            slot => slot.insert(Merge {
                ctx,
                merged: NDArray::new(shape.clone(), ctx, dtype, false)?,
                copies: Vec::new(),
                compressed: Vec::new(),
            }),
        };
        let n_copies = if compress.is_some() { srcs.len() } else { srcs.len() - 1 };
        while m.copies.len() < n_copies {
            m.copies.push(NDArray::new(shape.clone(), ctx, dtype, false)?);
        }
        if compress.is_some() {
            let bytes = kernels::two_bit_words(m.merged.size()) * 4;
            while m.compressed.len() < srcs.len() {
                let sctx = srcs[m.compressed.len()].ctx().unwrap_or(ctx);
                let residual = zeros_f32(shape.clone(), sctx)?;
                let send = NDArray::new(vec![bytes], sctx, DType::U8, false)?;
                let recv = if sctx != ctx { Some(NDArray::new(vec![bytes], ctx, DType::U8, false)?) } else { None };
                m.compressed.push((residual, send, recv));
            }
        }
        Ok(())
    }

    /// Push the operations that sum one key's `srcs` into its prepared buffers (stock's
    /// `Comm::Reduce`); returns the sum.
    fn reduce(
        st: &State,
        id: i32,
        srcs: &[&NDArray],
        compress: Option<f32>,
        comm: Comm,
        reduction: Reduction,
        priority: i32,
    ) -> Result<NDArray> {
        if srcs.len() == 1 && compress.is_none() {
            return Ok(srcs[0].clone());
        }
        let m = st
            .entries
            .get(&id)
            .and_then(|e| e.merge.as_ref())
            .ok_or_else(|| Error::internal("a KVStore merge buffer was not prepared"))?;
        let threads = reduction.threads(m.merged.size());
        match compress {
            None => {
                let order = if comm == Comm::Host { Order::Grouped } else { Order::Fold };
                copy(srcs[0], &m.merged, priority)?;
                for (s, c) in srcs[1..].iter().zip(&m.copies) {
                    copy(s, c, priority)?;
                }
                let copies: Vec<&NDArray> = m.copies[..srcs.len() - 1].iter().collect();
                push_sum(&copies, &m.merged, order, true, threads, priority)?;
            }
            Some(threshold) => {
                for (k, &s) in srcs.iter().enumerate() {
                    let (residual, send, recv) = &m.compressed[k];
                    push_quantize(s, residual, send, threshold, priority)?;
                    let packed = match recv {
                        Some(r) => {
                            copy(send, r, priority)?;
                            r
                        }
                        None => send,
                    };
                    push_op("DequantizeCPU", &[packed], &[&m.copies[k]], priority, move |ins, outs| {
                        kernels::dequantize_2bit(ins[0].as_slice::<u8>(), outs[0].as_mut::<f32>(), threshold);
                        Ok(())
                    })?;
                }
                let copies: Vec<&NDArray> = m.copies[..srcs.len()].iter().collect();
                push_sum(&copies, &m.merged, Order::Fold, false, threads, priority)?;
            }
        }
        Ok(m.merged.clone())
    }

    /// A distributed store's buffers for key `id` (see [`Cross`]), allocated before anything
    /// is pushed.
    fn prepare_cross(st: &mut State, id: i32, srcs: &[&NDArray], world: &mpi::World, compress: bool) -> Result<()> {
        let entry = st.entries.get_mut(&id).ok_or_else(|| Error::internal("a checked KVStore key vanished"))?;
        let (shape, dtype) = (entry.shape.clone(), entry.dtype);
        let cross = match &mut entry.cross {
            Some(c) => c,
            slot => slot.insert(Cross {
                reduced: NDArray::new(shape.clone(), pinned(), dtype, false)?,
                cast: None,
                compressed: None,
            }),
        };
        if cross.cast.is_none() && srcs.iter().any(|s| s.dtype != dtype) {
            cross.cast = Some(NDArray::new(shape.clone(), pinned(), dtype, false)?);
        }
        if compress && cross.compressed.is_none() {
            let bytes = kernels::two_bit_words(cross.reduced.size()) * 4;
            let residual = zeros_f32(shape, pinned())?;
            let packed = NDArray::new(vec![bytes], pinned(), DType::U8, false)?;
            let ranks = usize::try_from(world.size()).map_err(|_| Error::internal("a negative MPI world size"))?;
            let gathered = NDArray::new(vec![bytes * ranks], pinned(), DType::U8, false)?;
            cross.compressed = Some((residual, packed, gathered));
        }
        Ok(())
    }

    /// Push the step across the ranks for key `id`: its local sum `merged` summed over the
    /// ranks (with compression: each rank's 2-bit quantized sum, gathered and summed in rank
    /// order, as stock's server sums its workers' pushes). Returns the sum.
    fn across(
        st: &State,
        id: i32,
        (ticket, tag): (mpi::Ticket, mpi::Tag),
        merged: &NDArray,
        compress: Option<f32>,
        priority: i32,
    ) -> Result<NDArray> {
        let cross = st
            .entries
            .get(&id)
            .and_then(|e| e.cross.as_ref())
            .ok_or_else(|| Error::internal("a KVStore's cross-rank buffers were not prepared"))?;
        let reduced = &cross.reduced;
        let dtype = reduced.dtype;
        // A single pushed value is its own local sum, in its own dtype: the ranks sum the key's.
        let merged = match &cross.cast {
            Some(cast) if merged.dtype != dtype => {
                copy(merged, cast, priority)?;
                cast
            }
            _ => merged,
        };
        match (compress, &cross.compressed) {
            (None, _) => {
                push_collective("MPIAllreduce", (&[merged], &[reduced]), dtype, priority, ticket, move |r| {
                    mpi::Call::Allreduce { tag, dtype, send: r[0], recv: r[1] }
                })?;
            }
            (Some(threshold), Some((residual, packed, gathered))) => {
                push_quantize(merged, residual, packed, threshold, priority)?;
                push_collective("MPIAllgather", (&[packed], &[gathered]), DType::U8, priority, ticket, move |r| {
                    mpi::Call::Allgather { tag, send: r[0], recv: r[1] }
                })?;
                let per = packed.size();
                push_op("DequantizeCPU", &[gathered], &[reduced], priority, move |ins, outs| {
                    let all = ins[0].as_slice::<u8>();
                    let out = outs[0].as_mut::<f32>();
                    if per == 0 {
                        return Ok(()); // an empty key
                    }
                    let mut one = vec![0f32; out.len()];
                    for (r, packed) in all.chunks_exact(per).enumerate() {
                        if r == 0 {
                            kernels::dequantize_2bit(packed, out, threshold);
                        } else {
                            kernels::dequantize_2bit(packed, &mut one, threshold);
                            out.iter_mut().zip(&one).for_each(|(o, v)| *o += *v);
                        }
                    }
                    Ok(())
                })?;
            }
            (Some(_), None) => return Err(Error::internal("a KVStore's compression buffers were not prepared")),
        }
        Ok(reduced.clone())
    }

    /// `device`: the context key `id` sums on. Keys not placed yet are placed together, the
    /// largest first, each on the source context with the fewest elements placed so far.
    fn place(st: &mut State, id: i32, srcs: &[&NDArray]) -> Result<Context> {
        let placed = |st: &State| st.entries.get(&id).and_then(|e| e.place);
        if let Some(c) = placed(st) {
            return Ok(c);
        }
        for c in srcs.iter().filter_map(|s| s.ctx()) {
            if !st.loads.iter().any(|(x, _)| *x == c) {
                st.loads.push((c, 0));
            }
        }
        st.loads.sort_by_key(|(c, _)| (c.dev_type as i32, c.dev_id));
        let mut todo: Vec<(i32, usize)> =
            st.entries.iter().filter(|(_, e)| e.place.is_none()).map(|(k, e)| (*k, e.shape.iter().product())).collect();
        todo.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        for (k, size) in todo {
            let Some(slot) = st.loads.iter_mut().min_by_key(|(_, load)| *load) else { break };
            slot.1 += size;
            let c = slot.0;
            if let Some(e) = st.entries.get_mut(&k) {
                e.place = Some(c);
            }
        }
        placed(st).ok_or_else(|| Error::internal("a KVStore key could not be placed"))
    }

    /// `Pull`: copy each key's stored value into its outputs.
    pub fn pull(&self, keys: Keys, outs: &[NDArray], priority: i32) -> Result<()> {
        let st = self.state.lock();
        Self::pull_locked(&st, keys, outs, priority)
    }

    fn check_outs(st: &State, keys: &Keys, ids: &[i32], outs: &[NDArray], pending: &[(i32, &[usize])]) -> Result<()> {
        if ids.len() != outs.len() {
            return Err(Error::mxnet(format!("{} keys but {} outputs", ids.len(), outs.len())));
        }
        for (i, (id, o)) in ids.iter().zip(outs).enumerate() {
            host_only(o, "an output")?;
            let shape = match st.entries.get(id) {
                Some(e) => {
                    copy_check(&e.value, o)?;
                    &e.shape[..]
                }
                None => pending
                    .iter()
                    .find(|(k, _)| k == id)
                    .map(|(_, s)| *s)
                    .ok_or_else(|| Error::internal("an output's KVStore key was not resolved"))?,
            };
            if o.shape != shape {
                return Err(Error::mxnet(format!(
                    "shape mismatch for key {}: its value has shape {}, the output {}",
                    keys.describe(i),
                    shape_text(shape),
                    shape_text(&o.shape)
                )));
            }
        }
        Ok(())
    }

    fn pull_locked(st: &State, keys: Keys, outs: &[NDArray], priority: i32) -> Result<()> {
        let ids = Self::ids(st, &keys)?;
        Self::check_outs(st, &keys, &ids, outs, &[])?;
        for (id, members) in Self::group(&ids) {
            let value = &st.entries.get(&id).ok_or_else(|| Error::internal("a checked KVStore key vanished"))?.value;
            for i in members {
                copy(value, &outs[i], priority)?;
            }
        }
        Ok(())
    }

    /// `Broadcast`: `init(vkeys, values)` then `pull(okeys, outs)`, checked as a whole first.
    pub fn broadcast(
        &self,
        vkeys: Keys,
        values: &[NDArray],
        okeys: Keys,
        outs: &[NDArray],
        priority: i32,
    ) -> Result<()> {
        let mut st = self.state.lock();
        let issue = self.issue(&mut st)?;
        Self::check_key_type(&st, &vkeys)?;
        if vkeys.kind() != okeys.kind() {
            return Err(Error::mxnet("Mixed key types are not allowed"));
        }
        if vkeys.len() != values.len() {
            return Err(Error::mxnet(format!("{} keys but {} values", vkeys.len(), values.len())));
        }
        // The outputs' keys: existing ones, or among those being initialised.
        let mut ids = Vec::with_capacity(okeys.len());
        let mut pending: Vec<(i32, &[usize])> = Vec::new();
        for i in 0..okeys.len() {
            let fresh = (0..vkeys.len()).find(|&j| same_key(&vkeys, j, &okeys, i));
            match fresh {
                Some(j) => {
                    let pseudo = -1 - j as i32; // not a stored id: the value being initialised
                    let id = match okeys {
                        Keys::Int(o) => o[i],
                        Keys::Str(_) => pseudo,
                    };
                    if !pending.iter().any(|(k, _)| *k == id) && !st.entries.contains_key(&id) {
                        pending.push((id, &values[j].shape[..]));
                    }
                    ids.push(id);
                }
                None => ids.push(Self::ids(&st, &okeys_one(&okeys, i))?[0]),
            }
        }
        Self::check_outs(&st, &okeys, &ids, outs, &pending)?;
        Self::init_locked(&mut st, vkeys, values, issue.as_ref())?;
        Self::pull_locked(&st, okeys, outs, priority)
    }

    /// `PushPull`: `push(vkeys, values)` then `pull(okeys, outs)`.
    pub fn pushpull(
        &self,
        vkeys: Keys,
        values: &[NDArray],
        okeys: Keys,
        outs: &[NDArray],
        priority: i32,
    ) -> Result<()> {
        {
            let st = self.state.lock();
            if self.is_distributed() && st.threshold.is_some() {
                // As stock's distributed stores (its servers have no compressed pushpull).
                return Err(Error::mxnet("Compression not supported with PushPull"));
            }
            let ids = Self::ids(&st, &okeys)?;
            Self::check_outs(&st, &okeys, &ids, outs, &[])?;
            // The value pulled may be one of those pushed (one value, no update): the pull must
            // be able to copy from it too, so that it cannot fail after the push.
            for (i, o) in outs.iter().enumerate() {
                for (j, v) in values.iter().enumerate() {
                    if same_key(&vkeys, j, &okeys, i) {
                        copy_check(v, o)?;
                    }
                }
            }
        }
        self.push(vkeys, values, priority)?;
        self.pull(okeys, outs, priority)
    }
}

/// The key of one pending updater call.
enum Pushed {
    Int(i32),
    Str(String),
}

type UpdaterCall = (Updater, Pushed, NDArray, NDArray);

/// Whether key `j` of `a` is key `i` of `b`.
fn same_key(a: &Keys, j: usize, b: &Keys, i: usize) -> bool {
    match (a, b) {
        (Keys::Int(a), Keys::Int(b)) => a.get(j) == b.get(i),
        (Keys::Str(a), Keys::Str(b)) => a.get(j) == b.get(i),
        _ => false,
    }
}

/// Key `i` of `keys` alone.
fn okeys_one<'a>(keys: &Keys<'a>, i: usize) -> Keys<'a> {
    match *keys {
        Keys::Int(k) => Keys::Int(&k[i..i + 1]),
        Keys::Str(k) => Keys::Str(&k[i..i + 1]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ndarray::testing::{array_f32, values};

    fn arr(v: &[f32]) -> NDArray {
        array_f32(&[v.len()], v)
    }

    #[test]
    fn push_sums_in_each_order_and_pull_copies() {
        for name in ["local", "device"] {
            let kv = KVStore::create(name).unwrap();
            kv.init(Keys::Int(&[3, 5]), &[arr(&[0.0; 3]), arr(&[1.0, 2.0])]).unwrap();
            let a = arr(&[1.0, 2.0, 3.0]);
            let b = arr(&[10.0, 20.0, 30.0]);
            let c = arr(&[100.0, 200.0, 300.0]);
            // Keys out of order: grouped by key, values of a key in the order given.
            kv.push(Keys::Int(&[5, 3, 3, 3]), &[arr(&[7.0, 8.0]), a.clone(), b, c], 0).unwrap();
            let out = arr(&[0.0; 3]);
            let out5 = arr(&[0.0; 2]);
            kv.pull(Keys::Int(&[3, 5]), &[out.clone(), out5.clone()], 0).unwrap();
            assert_eq!(values(&out), vec![111.0, 222.0, 333.0], "{name}");
            assert_eq!(values(&out5), vec![7.0, 8.0], "{name}");
        }
    }

    #[test]
    fn bad_input_is_refused_and_changes_nothing() {
        let kv = KVStore::create("local").unwrap();
        kv.init(Keys::Int(&[1]), &[arr(&[1.0, 2.0])]).unwrap();
        let e = kv.init(Keys::Int(&[2, 1]), &[arr(&[0.0]), arr(&[0.0])]).unwrap_err();
        assert!(e.message().starts_with("duplicate init of key 1"), "{e}");
        // Key 2 was not initialised by the refused call.
        let e = kv.pull(Keys::Int(&[2]), &[arr(&[0.0])], 0).unwrap_err();
        assert_eq!(e.message(), "key 2 has not been initialized");
        let e = kv.push(Keys::Int(&[1]), &[arr(&[1.0, 2.0, 3.0])], 0).unwrap_err();
        assert!(e.message().contains("initialized with shape (2), pushed (3)"), "{e}");
        let e = kv.init(Keys::Str(&["w"]), &[arr(&[0.0])]).unwrap_err();
        assert_eq!(e.message(), "Mixed key types are not allowed");
        let out = arr(&[0.0, 0.0]);
        kv.pull(Keys::Int(&[1]), std::slice::from_ref(&out), 0).unwrap();
        assert_eq!(values(&out), vec![1.0, 2.0]);
        assert!(KVStore::create("dist_async").is_err());
    }

    #[test]
    fn updater_gets_sum_and_stored_value() {
        let kv = KVStore::create("local").unwrap();
        kv.init(Keys::Str(&["w"]), &[arr(&[1.0, 1.0])]).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = seen.clone();
        let up: Updater = Arc::new(move |k, g, w| {
            let UpdaterKey::Str(k) = k else { panic!("a string key") };
            s2.lock().push((k.to_string(), values(g), values(w)));
            w.copy_from(&arr(&[5.0, 6.0])).unwrap();
        });
        kv.set_updater(Some(Arc::new(|_, _, _| panic!("the string updater serves string keys"))), Some(up));
        kv.push(Keys::Str(&["w", "w"]), &[arr(&[1.0, 2.0]), arr(&[3.0, 4.0])], 0).unwrap();
        assert_eq!(seen.lock().clone(), vec![("w".to_string(), vec![4.0, 6.0], vec![1.0, 1.0])]);
        let out = arr(&[0.0, 0.0]);
        kv.pull(Keys::Str(&["w"]), std::slice::from_ref(&out), 0).unwrap();
        assert_eq!(values(&out), vec![5.0, 6.0]);
    }

    #[test]
    fn views_of_one_array_copy_as_bytes_and_aliases_are_refused() {
        let kv = KVStore::create("local").unwrap();
        let x = arr(&[1.0, 2.0, 3.0, 4.0, 5.0]);
        kv.init(Keys::Int(&[0]), &[arr(&[0.0, 0.0, 0.0])]).unwrap();
        // One value is stored as itself; pulling it into an overlapping view of the same array
        // copies the bytes in one operation (memmove).
        kv.push(Keys::Int(&[0]), &[x.slice(0, 3).unwrap()], 0).unwrap();
        kv.pull(Keys::Int(&[0]), &[x.slice(2, 5).unwrap()], 0).unwrap();
        assert_eq!(values(&x), vec![1.0, 2.0, 1.0, 2.0, 3.0]);
        // A custom operator's alias of the stored array: refused before anything is pushed.
        let alias = x.slice(0, 3).unwrap().through_alias(&Var::alias(x.chunk().unwrap())).unwrap();
        let e = kv.pull(Keys::Int(&[0]), std::slice::from_ref(&alias), 0).unwrap_err();
        assert!(e.message().contains("custom operator's view"), "{e}");
        // pushpull whose pull could not copy from the value pushed: refused before the push.
        kv.push(Keys::Int(&[0]), &[arr(&[7.0, 8.0, 9.0])], 0).unwrap();
        let e = kv.pushpull(Keys::Int(&[0]), &[x.slice(0, 3).unwrap()], Keys::Int(&[0]), &[alias], 0).unwrap_err();
        assert!(e.message().contains("custom operator's view"), "{e}");
        let out = arr(&[0.0; 3]);
        kv.pull(Keys::Int(&[0]), std::slice::from_ref(&out), 0).unwrap();
        assert_eq!(values(&out), vec![7.0, 8.0, 9.0]);
    }

    #[test]
    fn sums_run_in_the_dtype_the_key_was_initialised_with() {
        let kv = KVStore::create("device").unwrap();
        kv.init(Keys::Int(&[0]), &[arr(&[0.0, 0.0])]).unwrap();
        let f64s = NDArray::new(vec![2], Context::CPU, DType::F64, false).unwrap();
        let v = [0.25f64, 1e-9];
        // SAFETY: two f64 values for a two-element f64 array.
        unsafe { f64s.copy_from_host(v.as_ptr() as *const u8, 2).unwrap() };
        kv.push(Keys::Int(&[0, 0]), &[arr(&[1.0, 1.0]), f64s], 0).unwrap();
        let out = arr(&[0.0; 2]);
        kv.pull(Keys::Int(&[0]), std::slice::from_ref(&out), 0).unwrap();
        assert_eq!(values(&out), vec![1.25, 1.0]);
    }

    #[test]
    fn compression_sends_thresholds_and_keeps_residuals() {
        let kv = KVStore::create("device").unwrap();
        kv.set_gradient_compression(&[("type", "2bit"), ("threshold", "0.5")]).unwrap();
        kv.init(Keys::Int(&[0]), &[arr(&[0.0; 4])]).unwrap();
        let g = arr(&[0.3, -0.7, 0.6, 0.1]);
        let out = arr(&[0.0; 4]);
        kv.pushpull(Keys::Int(&[0]), std::slice::from_ref(&g), Keys::Int(&[0]), std::slice::from_ref(&out), 0).unwrap();
        assert_eq!(values(&out), vec![0.0, -0.5, 0.5, 0.0]);
        kv.pushpull(Keys::Int(&[0]), &[g], Keys::Int(&[0]), std::slice::from_ref(&out), 0).unwrap();
        assert_eq!(values(&out), vec![0.5, -0.5, 0.5, 0.0]);
        assert!(kv.set_gradient_compression(&[("type", "1bit")]).is_err());
        assert!(kv.set_gradient_compression(&[("type", "2bit"), ("threshold", "0")]).is_err());
    }
}
