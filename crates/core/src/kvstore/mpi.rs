//! MPI for the distributed stores (`dist_sync`, `dist_device_sync`), loaded at run time.
//!
//! Owns: the MPI library (Open MPI's `libmpi.so.40`, opened with `dlopen` when the first
//! distributed store of a worker is created, so neither the build nor a machine without MPI
//! needs it), the one thread that makes every MPI call of the process, the order of the
//! collectives, and MPI's finalisation at exit.
//!
//! MPI requires every rank to call the same collectives in the same order. The stores take a
//! [`Ticket`] for each collective in program order (on the calling thread, under the world's
//! [`Order`], held until the collective's operation is submitted; a call takes all its
//! tickets before it can fail, and an unused one is sent as abandoned, so every rank takes as
//! many); the engine operation that runs it hands its ticket to the MPI thread when its
//! inputs are ready, and the MPI thread runs the collectives strictly by ticket, whatever
//! order the engine readies them in. Each collective is preceded by one small allreduce of its
//! description (kind, store, key, the store's call count, element count, dtype): when the
//! ranks disagree (a program that pushes other keys, or skips a call, on another rank, or a
//! rank whose input failed and whose ticket was abandoned), every rank fails that call with an
//! error and none moves data, so the stream of tickets stays aligned. An operation waiting for
//! a lower ticket holds no engine thread: it is an asynchronous engine operation that the MPI
//! thread completes. Collectives are nonblocking ones polled with `MPI_Test`; one that fails
//! in flight leaves its buffers allocated for good and ends all later calls with an error.
//!
//! At exit (`on_exit`, which sees the exit status) a process that initialised MPI finalises it
//! after its issued collectives have run when it exits with status 0; with another status it
//! leaves MPI unfinalised, so `mpirun` ends the other ranks instead of letting them wait for
//! this one forever.

use crate::error::{Error, Result};
use crate::ndarray::DType;
use crate::sync::Mutex;
use half::f16;
use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::OnceLock;

/// Open MPI's handles: addresses of the library's predefined objects.
type Handle = *mut c_void;

type IntOut = unsafe extern "C" fn(*mut c_int) -> c_int;
type InitThread = unsafe extern "C" fn(*mut c_int, *mut *mut *mut c_char, c_int, *mut c_int) -> c_int;
type CommInt = unsafe extern "C" fn(Handle, *mut c_int) -> c_int;
type SetErrhandler = unsafe extern "C" fn(Handle, Handle) -> c_int;
/// The nonblocking collectives (MPI-3): the last argument receives the request.
type Iallreduce = unsafe extern "C" fn(*const c_void, *mut c_void, c_int, Handle, Handle, Handle, *mut Handle) -> c_int;
type Iallgather =
    unsafe extern "C" fn(*const c_void, c_int, Handle, *mut c_void, c_int, Handle, Handle, *mut Handle) -> c_int;
type Ibcast = unsafe extern "C" fn(*mut c_void, c_int, Handle, c_int, Handle, *mut Handle) -> c_int;
type Ibarrier = unsafe extern "C" fn(Handle, *mut Handle) -> c_int;
/// `MPI_Test(request, flag, status)`.
type Test = unsafe extern "C" fn(*mut Handle, *mut c_int, *mut c_void) -> c_int;
type Finalize = unsafe extern "C" fn() -> c_int;
type ErrorString = unsafe extern "C" fn(c_int, *mut c_char, *mut c_int) -> c_int;

/// `MPI_THREAD_FUNNELED` and `MPI_THREAD_MULTIPLE` (the standard's order, Open MPI's values).
const THREAD_FUNNELED: c_int = 1;
const THREAD_MULTIPLE: c_int = 3;

/// The library names tried, in order.
const LIBRARIES: [&str; 2] = ["libmpi.so.40", "libmpi.so"];

/// The MPI functions and handles this module uses.
struct Api {
    initialized: IntOut,
    query_thread: IntOut,
    init_thread: InitThread,
    comm_rank: CommInt,
    comm_size: CommInt,
    set_errhandler: SetErrhandler,
    allreduce: Iallreduce,
    allgather: Iallgather,
    bcast: Ibcast,
    barrier: Ibarrier,
    test: Test,
    finalize: Finalize,
    error_string: ErrorString,
    world: Handle,
    sum: Handle,
    max: Handle,
    errors_return: Handle,
    /// float, double, uint8_t, int32_t, int8_t, int64_t.
    types: [Handle; 6],
    /// Set when a started collective failed while in flight (`MPI_Test` returned an error):
    /// MPI may still use that collective's buffers, so they are never freed (see `serve`),
    /// and no collective runs afterwards.
    broken: std::cell::RefCell<Option<String>>,
}

// SAFETY: the handles are addresses of objects inside the MPI library, which is never
// unloaded (see `load`); the functions and handles are used only on the MPI thread, which
// owns the `Api` after `start` moves it there.
unsafe impl Send for Api {}

fn load() -> Result<Api> {
    use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
    let mut tried = Vec::new();
    let mut found = None;
    for name in LIBRARIES {
        // SAFETY: loading runs the MPI library's initialisers, which is what using MPI asks
        // for. RTLD_GLOBAL: Open MPI's components, which it loads itself, link against its
        // symbols. The library is leaked below, so it is never unloaded.
        match unsafe { Library::open(Some(name), RTLD_NOW | RTLD_GLOBAL) } {
            Ok(l) => {
                found = Some((name, l));
                break;
            }
            Err(e) => tried.push(e.to_string()),
        }
    }
    let Some((name, lib)) = found else {
        return Err(Error::not_supported(format!(
            "the distributed KVStore without MPI: it needs Open MPI's libmpi.so.40 (e.g. `apt-get install openmpi-bin`) \
             and a launch with `mpirun -np N python ...` ({})",
            tried.join("; ")
        )));
    };
    let lib: &'static Library = Box::leak(Box::new(lib));
    fn get<T: Copy>(lib: &Library, lib_name: &str, name: &str) -> Result<T> {
        // SAFETY: each call below names the type the MPI standard (and Open MPI's mpi.h)
        // gives the symbol; data symbols are read as their addresses. The library is never
        // unloaded.
        unsafe { lib.get::<T>(name.as_bytes()) }.map(|s| *s).map_err(|_| {
            Error::not_supported(format!(
                "MPI library {lib_name} without {name}: the distributed KVStore supports Open MPI (MPICH-ABI libraries are not supported yet)"
            ))
        })
    }
    let h = |n: &str| get::<Handle>(lib, name, n);
    Ok(Api {
        initialized: get(lib, name, "MPI_Initialized")?,
        query_thread: get(lib, name, "MPI_Query_thread")?,
        init_thread: get(lib, name, "MPI_Init_thread")?,
        comm_rank: get(lib, name, "MPI_Comm_rank")?,
        comm_size: get(lib, name, "MPI_Comm_size")?,
        set_errhandler: get(lib, name, "MPI_Comm_set_errhandler")?,
        allreduce: get(lib, name, "MPI_Iallreduce")?,
        allgather: get(lib, name, "MPI_Iallgather")?,
        bcast: get(lib, name, "MPI_Ibcast")?,
        barrier: get(lib, name, "MPI_Ibarrier")?,
        test: get(lib, name, "MPI_Test")?,
        finalize: get(lib, name, "MPI_Finalize")?,
        error_string: get(lib, name, "MPI_Error_string")?,
        world: h("ompi_mpi_comm_world")?,
        sum: h("ompi_mpi_op_sum")?,
        max: h("ompi_mpi_op_max")?,
        errors_return: h("ompi_mpi_errors_return")?,
        types: [
            h("ompi_mpi_float")?,
            h("ompi_mpi_double")?,
            h("ompi_mpi_uint8_t")?,
            h("ompi_mpi_int32_t")?,
            h("ompi_mpi_int8_t")?,
            h("ompi_mpi_int64_t")?,
        ],
        broken: std::cell::RefCell::new(None),
    })
}

impl Api {
    /// Start a nonblocking collective with `start` (which gets the request's address) and
    /// wait for it. The wait polls with `MPI_Test`, yielding the core between polls for the
    /// first 2 ms and then sleeping between them (up to 100 µs): a blocking collective spins
    /// its core for as long as the other ranks take to reach it, and that core is the one
    /// this rank's own computation (and on one machine the other ranks') needs. Measured on
    /// 2 ranks of 2 cores (bench/kvstore_dist_bench.py): an MLP training step at 110-167
    /// steps/s with blocking calls, 172-197 with sleeps alone, 266-332 this way (stock: 175).
    fn complete(&self, what: &str, start: impl FnOnce(*mut Handle) -> c_int) -> Result<()> {
        if let Some(why) = self.broken.borrow().as_ref() {
            return Err(Error::mxnet(format!("MPI failed earlier ({why}); no KVStore call can run")));
        }
        let mut req: Handle = std::ptr::null_mut();
        self.check(start(&mut req), what)?;
        let mut flag: c_int = 0;
        let started = std::time::Instant::now();
        let mut pause = std::time::Duration::from_micros(10);
        loop {
            // SAFETY: `req` is the request the collective just started; MPI_STATUS_IGNORE is
            // NULL in Open MPI. MPI frees the request when the test finds it complete.
            let tested = self.check(unsafe { (self.test)(&mut req, &mut flag, std::ptr::null_mut()) }, "MPI_Test");
            if let Err(e) = tested {
                // The request may still be in flight: the caller must not free its buffers.
                *self.broken.borrow_mut() = Some(e.message().to_string());
                return Err(e);
            }
            if flag != 0 {
                return Ok(());
            }
            if started.elapsed() < std::time::Duration::from_millis(2) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(pause);
                pause = (pause * 2).min(std::time::Duration::from_micros(100));
            }
        }
    }

    /// An error for return code `code` of `what`.
    fn check(&self, code: c_int, what: &str) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        let mut buf = [0 as c_char; 512];
        let mut len: c_int = 0;
        // SAFETY: MPI_Error_string writes at most MPI_MAX_ERROR_STRING (256 in Open MPI)
        // characters, and `len`.
        unsafe { (self.error_string)(code, buf.as_mut_ptr(), &mut len) };
        let len = (len.max(0) as usize).min(buf.len());
        let text: String = buf[..len].iter().map(|&c| c as u8 as char).collect();
        Err(Error::mxnet(format!("{what} failed (MPI error {code}: {text})")))
    }

    /// The MPI type of a dtype MPI sums natively (float16 goes through float32).
    fn mpi_type(&self, dtype: DType) -> Result<Handle> {
        Ok(match dtype {
            DType::F32 | DType::F16 => self.types[0],
            DType::F64 => self.types[1],
            DType::U8 => self.types[2],
            DType::I32 => self.types[3],
            DType::I8 => self.types[4],
            DType::I64 => self.types[5],
            DType::Bool => return Err(Error::not_supported("a distributed KVStore of bool arrays")),
        })
    }
}

/// Memory a collective reads or writes: `elems` elements of the call's dtype at `ptr`.
#[derive(Clone, Copy)]
pub struct Region {
    ptr: *mut u8,
    elems: usize,
}

// SAFETY: only the address moves to the MPI thread, which accesses the memory during the
// collective alone; `Region::new`'s contract keeps it valid and unshared until then.
unsafe impl Send for Region {}

impl Region {
    /// # Safety
    /// `ptr` must address `elems` elements of the collective's dtype that stay valid, and
    /// that nothing else writes (nor, for a region the collective writes, reads), until the
    /// collective's `done` callback has been called.
    pub unsafe fn new(ptr: *mut u8, elems: usize) -> Self {
        Region { ptr, elems }
    }
}

/// What identifies a collective among a process's: its store (numbered in creation order),
/// its key, and the store's count of collectives before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tag {
    pub store: u32,
    pub key: i32,
    pub round: u64,
}

/// One collective.
pub enum Call {
    /// Sum `send` over the ranks into `recv` (same length; distinct memory).
    Allreduce {
        tag: Tag,
        dtype: DType,
        send: Region,
        recv: Region,
    },
    /// Every rank's `send` (bytes), in rank order, into `recv` (`size` times as long).
    Allgather {
        tag: Tag,
        send: Region,
        recv: Region,
    },
    /// Rank 0's `buf` into every other rank's.
    Bcast {
        tag: Tag,
        dtype: DType,
        buf: Region,
    },
    Barrier {
        tag: Tag,
    },
    /// This rank's call whose inputs failed: every rank fails it.
    Abandoned,
}

/// The length of a description.
const D: usize = 6;

impl Call {
    /// What the ranks must agree on: kind, store, key, round, elements, dtype.
    fn describe(&self) -> [i64; D] {
        let t = |kind: i64, tag: &Tag, elems: usize, dtype: DType| {
            [kind, tag.store as i64, tag.key as i64, tag.round as i64, elems as i64, dtype as i64]
        };
        match self {
            Call::Allreduce { tag, dtype, send, .. } => t(1, tag, send.elems, *dtype),
            Call::Allgather { tag, send, .. } => t(2, tag, send.elems, DType::U8),
            Call::Bcast { tag, dtype, buf } => t(3, tag, buf.elems, *dtype),
            Call::Barrier { tag } => t(4, tag, 0, DType::U8),
            Call::Abandoned => [-1, 0, 0, 0, 0, 0],
        }
    }
}

/// Words for an error about a description.
fn describe_text(d: &[i64; D]) -> String {
    let dtype = DType::from_code(d[5] as i32).map(|t| t.name()).unwrap_or("?");
    let (store, key, round, elems) = (d[1], d[2], d[3], d[4]);
    let at = format!("store #{store}'s call #{round}");
    match d[0] {
        1 => format!("a push of key {key} ({elems} {dtype} values) as {at}"),
        2 => format!("a compressed push of key {key} ({elems} bytes) as {at}"),
        3 => format!("an init of key {key} ({elems} {dtype} values) as {at}"),
        4 => format!("a barrier as {at}"),
        _ => "a call whose inputs failed".to_string(),
    }
}

/// `[d, -d]`: their maximum over the ranks gives each field's maximum and minimum.
fn both(d: [i64; D]) -> [i64; 2 * D] {
    let mut b = [0; 2 * D];
    for i in 0..D {
        b[i] = d[i];
        b[i + D] = -d[i];
    }
    b
}

/// Whether the ranks' descriptions agree, from the maximum of `[d, -d]` over the ranks.
fn agreed(max_of_both: &[i64; 2 * D]) -> bool {
    (0..D).all(|i| max_of_both[i] == -max_of_both[i + D])
}

/// Collectives by ticket: delivered in any order, taken strictly in ticket order.
struct Sequencer<T> {
    pending: BTreeMap<u64, T>,
    next: u64,
}

impl<T> Sequencer<T> {
    fn new() -> Self {
        Sequencer { pending: BTreeMap::new(), next: 0 }
    }
    fn deliver(&mut self, ticket: u64, item: T) {
        self.pending.insert(ticket, item);
    }
    /// The next item in ticket order, if it has been delivered.
    fn take(&mut self) -> Option<T> {
        let item = self.pending.remove(&self.next)?;
        self.next += 1;
        Some(item)
    }
}

type Done = Box<dyn FnOnce(Result<()>) + Send>;

enum Msg {
    Call {
        ticket: u64,
        call: Call,
        done: Done,
    },
    /// Finalise once tickets below `issued` have run; then answer.
    Finalize {
        issued: u64,
        reply: Sender<()>,
    },
}

/// This process's place among the ranks, and the way to its MPI thread.
pub struct World {
    rank: i32,
    size: i32,
    tx: Mutex<Sender<Msg>>,
    issued: AtomicU64,
    /// Held from taking a ticket until its operation is submitted ([`Order`]).
    order: Mutex<()>,
    /// The next store's number.
    stores: std::sync::atomic::AtomicU32,
    /// The MPI thread.
    thread: std::thread::ThreadId,
    /// The process that started MPI (a forked child has no MPI thread).
    pid: u32,
    /// Whether this library initialised MPI (and so finalises it).
    owns_init: bool,
}

static WORLD: OnceLock<std::result::Result<World, Error>> = OnceLock::new();

/// The world, started on first use (loading MPI and initialising it on the MPI thread).
pub fn world() -> Result<&'static World> {
    // Waits for the MPI thread outside the call gate: a singleton MPI_Init (a process not
    // started by mpirun) forks Open MPI's daemon from that thread, and the fork protocol
    // waits for calls in progress.
    if WORLD.get().is_none() && crate::runtime::runtime().is_forked_child() {
        // A child of a process that loaded the library (a DataLoader worker): MPI is the
        // parent's business.
        return Err(Error::not_supported("the distributed KVStore in a forked child process"));
    }
    let w = crate::runtime::outside_call(|| WORLD.get_or_init(start)).as_ref().map_err(Clone::clone)?;
    w.check_process()?;
    Ok(w)
}

fn start() -> Result<World> {
    let api = load()?;
    let (tx, rx) = channel::<Msg>();
    let (ready_tx, ready_rx) = channel::<Result<(i32, i32, bool)>>();
    let thread = std::thread::Builder::new()
        .name("mxrt-mpi".into())
        .spawn(move || {
            // The library's own thread: its fork (see `world`) must not wait for the call gate.
            crate::runtime::mark_library_thread();
            match init(&api) {
                Ok(info) => {
                    let _ = ready_tx.send(Ok(info));
                    serve(&api, rx);
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            }
        })
        .map_err(|e| Error::mxnet(format!("cannot start the MPI thread: {e}")))?
        .thread()
        .id();
    let (rank, size, owns_init) =
        ready_rx.recv().map_err(|_| Error::internal("the MPI thread ended during initialisation"))??;
    if owns_init {
        register_exit_hook();
    }
    Ok(World {
        rank,
        size,
        tx: Mutex::new(tx),
        issued: AtomicU64::new(0),
        order: Mutex::new(()),
        stores: std::sync::atomic::AtomicU32::new(0),
        thread,
        pid: std::process::id(),
        owns_init,
    })
}

/// Initialise MPI on this (the MPI) thread, unless another library has; returns (rank, size,
/// whether this library initialised it).
fn init(api: &Api) -> Result<(i32, i32, bool)> {
    let mut flag: c_int = 0;
    // SAFETY: MPI_Initialized may be called at any time; it writes `flag`.
    api.check(unsafe { (api.initialized)(&mut flag) }, "MPI_Initialized")?;
    let owns = flag == 0;
    if owns {
        let mut provided: c_int = 0;
        // SAFETY: NULL argc/argv are allowed (MPI-2); MPI was not initialised (checked).
        // This thread is MPI's main thread from now on: every later call is made here.
        let code =
            unsafe { (api.init_thread)(std::ptr::null_mut(), std::ptr::null_mut(), THREAD_FUNNELED, &mut provided) };
        api.check(code, "MPI_Init_thread")?;
        if provided < THREAD_FUNNELED {
            return Err(Error::not_supported("an MPI library without MPI_THREAD_FUNNELED"));
        }
    } else {
        let mut provided: c_int = 0;
        // SAFETY: MPI is initialised (checked); the call writes `provided`.
        api.check(unsafe { (api.query_thread)(&mut provided) }, "MPI_Query_thread")?;
        if provided < THREAD_MULTIPLE {
            return Err(Error::not_supported(
                "MPI initialised by another library below MPI_THREAD_MULTIPLE (the distributed KVStore calls MPI from its own thread)",
            ));
        }
    }
    // SAFETY: both handles are Open MPI's predefined objects (see `load`); errors now come
    // back as return codes instead of aborting the job.
    api.check(unsafe { (api.set_errhandler)(api.world, api.errors_return) }, "MPI_Comm_set_errhandler")?;
    let (mut rank, mut size) = (0, 0);
    // SAFETY: MPI is initialised; the calls write `rank` and `size`.
    api.check(unsafe { (api.comm_rank)(api.world, &mut rank) }, "MPI_Comm_rank")?;
    // SAFETY: as above.
    api.check(unsafe { (api.comm_size)(api.world, &mut size) }, "MPI_Comm_size")?;
    Ok((rank, size, owns))
}

/// The MPI thread's loop: collectives by ticket, then finalisation when asked.
fn serve(api: &Api, rx: Receiver<Msg>) {
    let mut seq: Sequencer<(Call, Done)> = Sequencer::new();
    let mut finalize: Option<(u64, Sender<()>)> = None;
    loop {
        while let Some((call, done)) = seq.take() {
            let was_broken = api.broken.borrow().is_some();
            let result = run(api, &call);
            if !was_broken && api.broken.borrow().is_some() {
                // This call's collective failed in flight: MPI may still write its buffers, so
                // its operation never completes and they stay held and allocated (waits on
                // them do not return; later calls fail at once, see `Api::complete`).
                std::mem::forget(done);
                continue;
            }
            // A panic in a completion must not end this thread: the other ranks wait for it.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| done(result)));
        }
        if let Some((issued, reply)) = &finalize {
            if seq.next >= *issued {
                // SAFETY: this thread initialised MPI (only then is Finalize sent) and has no
                // collective in flight.
                unsafe { (api.finalize)() };
                let _ = reply.send(());
                return;
            }
        }
        match rx.recv() {
            Ok(Msg::Call { ticket, call, done }) => seq.deliver(ticket, (call, done)),
            Ok(Msg::Finalize { issued, reply }) => finalize = Some((issued, reply)),
            Err(_) => return,
        }
    }
}

/// Elements per MPI call (its counts are C ints).
const CHUNK: usize = 1 << 30;

impl Api {
    /// Sum `n` elements of type `ty` at `send` over the ranks (with `op`) into `recv`.
    ///
    /// # Safety
    /// `send` and `recv` address `n` elements of `ty` each, in distinct memory that nothing
    /// else accesses until this returns; `n` fits a C int.
    unsafe fn allreduce(&self, send: *const u8, recv: *mut u8, n: usize, ty: Handle, op: Handle) -> Result<()> {
        // SAFETY: per this function's contract; the request is completed before returning.
        self.complete("MPI_Iallreduce", |req| unsafe {
            (self.allreduce)(send.cast(), recv.cast(), n as c_int, ty, op, self.world, req)
        })
    }

    /// Rank 0's `n` elements of type `ty` at `buf` into every rank's.
    ///
    /// # Safety
    /// `buf` addresses `n` elements of `ty` that nothing else accesses until this returns; `n`
    /// fits a C int.
    unsafe fn bcast(&self, buf: *mut u8, n: usize, ty: Handle) -> Result<()> {
        // SAFETY: per this function's contract.
        self.complete("MPI_Ibcast", |req| unsafe { (self.bcast)(buf.cast(), n as c_int, ty, 0, self.world, req) })
    }
}

/// Run one collective (after checking that every rank runs the same one).
fn run(api: &Api, call: &Call) -> Result<()> {
    let d = call.describe();
    let mine = Box::new(both(d));
    let mut all = Box::new([0i64; 2 * D]);
    // SAFETY: both buffers hold 2 * D int64 values and live until the call returns, or for
    // ever when it fails in flight (leaked below).
    let described =
        unsafe { api.allreduce(mine.as_ptr().cast(), all.as_mut_ptr().cast(), 2 * D, api.types[5], api.max) };
    if let Err(e) = described {
        if api.broken.borrow().is_some() {
            Box::leak(mine);
            Box::leak(all);
        }
        return Err(e);
    }
    if !agreed(&all) {
        return Err(Error::mxnet(format!(
            "the workers' KVStore calls disagree: this worker made {}, another rank something else \
             (every rank must push, pull and init the same keys in the same order, and each rank's pushed values must be computable)",
            describe_text(&d)
        )));
    }
    match *call {
        Call::Abandoned => Err(Error::mxnet("the KVStore call's inputs failed on every rank")),
        // SAFETY: MPI is initialised; the request is completed before returning.
        Call::Barrier { .. } => api.complete("MPI_Ibarrier", |req| unsafe { (api.barrier)(api.world, req) }),
        Call::Allreduce { dtype, send, recv, .. } => {
            if dtype == DType::F16 {
                return allreduce_f16(api, send, recv);
            }
            let (ty, width) = (api.mpi_type(dtype)?, dtype.size());
            for start in (0..send.elems).step_by(CHUNK) {
                let n = CHUNK.min(send.elems - start);
                // SAFETY: `Region::new`'s contract: `send` and `recv` address `elems`
                // elements of `dtype` in distinct memory, and the collective has them to
                // itself; the chunk lies inside both.
                unsafe { api.allreduce(send.ptr.add(start * width), recv.ptr.add(start * width), n, ty, api.sum) }?;
            }
            Ok(())
        }
        Call::Allgather { send, recv, .. } => {
            if send.elems > CHUNK {
                return Err(Error::not_supported("a compressed push of more than 2^30 bytes per rank"));
            }
            let n = send.elems as c_int;
            // SAFETY: `Region::new`'s contract: `send` holds `elems` bytes and `recv`
            // `size * elems` (the store allocates it so); the request is completed before
            // returning.
            api.complete("MPI_Iallgather", |req| unsafe {
                (api.allgather)(send.ptr.cast(), n, api.types[2], recv.ptr.cast(), n, api.types[2], api.world, req)
            })
        }
        Call::Bcast { dtype, buf, .. } => {
            // Bytes are bytes (float16 has no MPI type of its own).
            let (ty, width) = (api.types[2], dtype.size());
            let bytes = buf.elems * width;
            for start in (0..bytes).step_by(CHUNK) {
                // SAFETY: `Region::new`'s contract: `buf` holds `elems` elements of `dtype`,
                // `bytes` bytes, that the collective has to itself; the chunk lies inside.
                unsafe { api.bcast(buf.ptr.add(start), CHUNK.min(bytes - start), ty) }?;
            }
            Ok(())
        }
    }
}

/// float16 sums: widened to float32 for MPI (which has no float16 sum), rounded once after.
fn allreduce_f16(api: &Api, send: Region, recv: Region) -> Result<()> {
    // SAFETY: `Region::new`'s contract: `send` holds `elems` float16 values nothing writes.
    let src = unsafe { std::slice::from_raw_parts(send.ptr as *const f16, send.elems) };
    let wide: Vec<f32> = src.iter().map(|v| v.to_f32()).collect();
    let mut sum = vec![0f32; wide.len()];
    for start in (0..wide.len()).step_by(CHUNK) {
        let n = CHUNK.min(wide.len() - start);
        // SAFETY: both vectors hold the chunk and outlive the call (leaked when it fails in
        // flight).
        let r = unsafe {
            api.allreduce(wide[start..].as_ptr().cast(), sum[start..].as_mut_ptr().cast(), n, api.types[0], api.sum)
        };
        if r.is_err() && api.broken.borrow().is_some() {
            std::mem::forget(wide);
            std::mem::forget(sum);
            return r;
        }
        r?;
    }
    // SAFETY: `recv` holds `elems` float16 values that this collective alone accesses, in
    // memory distinct from `send`.
    let dst = unsafe { std::slice::from_raw_parts_mut(recv.ptr as *mut f16, recv.elems) };
    for (d, s) in dst.iter_mut().zip(&sum) {
        *d = f16::from_f32(*s);
    }
    Ok(())
}

/// The right to take tickets: held from taking a ticket until its operation is submitted, so
/// that stores used from several threads take their tickets in one order, and no operation
/// pushed between a ticket and its own operation can depend on that operation.
pub struct Order<'a> {
    world: &'static World,
    _held: crate::sync::MutexGuard<'a, ()>,
}

impl Order<'_> {
    /// The next place in the order of collectives. Every rank must take its tickets in the
    /// same order (the stores take them in their callers' program order).
    pub fn ticket(&self) -> Ticket {
        Ticket { n: self.world.issued.fetch_add(1, Ordering::SeqCst), world: self.world, used: false }
    }
}

/// A place in the order of collectives, taken in program order. Dropped unused (its engine
/// operation skipped because an input failed), it tells the other ranks so.
pub struct Ticket {
    n: u64,
    world: &'static World,
    used: bool,
}

impl Ticket {
    /// Run `call` in this ticket's turn; `done` gets its outcome on the MPI thread.
    pub fn run(mut self, call: Call, done: impl FnOnce(Result<()>) + Send + 'static) {
        self.used = true;
        self.world.send(self.n, call, Box::new(done));
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.used {
            self.world.send(self.n, Call::Abandoned, Box::new(|_| {}));
        }
    }
}

impl World {
    pub fn rank(&self) -> i32 {
        self.rank
    }
    pub fn size(&self) -> i32 {
        self.size
    }

    /// Refused in a forked child: it has no MPI thread (its calls would wait forever).
    pub fn check_process(&self) -> Result<()> {
        if std::process::id() != self.pid {
            return Err(Error::not_supported("the distributed KVStore in a forked child process"));
        }
        Ok(())
    }

    /// The number of a new store (stores are numbered in creation order on every rank).
    pub fn new_store(&self) -> u32 {
        self.stores.fetch_add(1, Ordering::SeqCst)
    }

    /// The right to take tickets (see [`Order`]); refused in a forked child.
    pub fn order(&'static self) -> Result<Order<'static>> {
        self.check_process()?;
        Ok(Order { world: self, _held: self.order.lock() })
    }

    fn send(&self, ticket: u64, call: Call, done: Done) {
        if self.check_process().is_err() {
            return done(Err(Error::not_supported("the distributed KVStore in a forked child process")));
        }
        let msg = Msg::Call { ticket, call, done };
        if let Err(std::sync::mpsc::SendError(Msg::Call { done, .. })) = self.tx.lock().send(msg) {
            done(Err(Error::mxnet("the MPI thread has ended (MPI was finalised)")));
        }
    }

    /// Run `call` in `ticket`'s turn and wait for it (a barrier), outside the call gate (the
    /// wait is for other processes; a fork meanwhile need not wait for it). The caller holds
    /// no lock of the library.
    pub fn run_blocking(&self, ticket: Ticket, call: Call) -> Result<()> {
        let (tx, rx) = channel();
        ticket.run(call, move |r| {
            let _ = tx.send(r);
        });
        crate::runtime::outside_call(|| rx.recv()).map_err(|_| Error::internal("the MPI thread dropped a call"))?
    }

    /// Finalise MPI after the issued collectives (at exit).
    fn finalize(&self) {
        // Not from the MPI thread itself (an exit there would wait for itself).
        if !self.owns_init || std::process::id() != self.pid || std::thread::current().id() == self.thread {
            return;
        }
        let (reply, done) = channel();
        let issued = self.issued.load(Ordering::SeqCst);
        if self.tx.lock().send(Msg::Finalize { issued, reply }).is_ok() {
            let _ = done.recv();
        }
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
extern "C" {
    /// glibc's `on_exit`: like `atexit`, with the exit status.
    fn on_exit(f: extern "C" fn(c_int, *mut c_void), arg: *mut c_void) -> c_int;
}

extern "C" fn finalize_at_exit(status: c_int, _arg: *mut c_void) {
    if status != 0 {
        return; // see the module doc: mpirun ends the other ranks
    }
    if let Some(Ok(w)) = WORLD.get() {
        w.finalize();
    }
}

fn register_exit_hook() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: a plain extern "C" function that captures nothing and does not unwind.
    unsafe {
        on_exit(finalize_at_exit, std::ptr::null_mut());
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        extern "C" fn at_exit() {
            finalize_at_exit(0, std::ptr::null_mut());
        }
        // SAFETY: as above.
        unsafe {
            libc::atexit(at_exit);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequencer_takes_in_ticket_order_whatever_the_delivery_order() {
        let mut s = Sequencer::new();
        s.deliver(2, "c");
        assert_eq!(s.take(), None, "ticket 0 is not there yet");
        s.deliver(0, "a");
        assert_eq!(s.take(), Some("a"));
        assert_eq!(s.take(), None, "ticket 1 is missing");
        s.deliver(1, "b");
        assert_eq!(s.take(), Some("b"));
        assert_eq!(s.take(), Some("c"));
        assert_eq!(s.take(), None);
        assert_eq!(s.next, 3);
    }

    /// The element-wise maximum over ranks, as MPI_MAX computes it.
    fn max_over(ranks: &[[i64; 2 * D]]) -> [i64; 2 * D] {
        let mut m = [i64::MIN; 2 * D];
        for r in ranks {
            for i in 0..2 * D {
                m[i] = m[i].max(r[i]);
            }
        }
        m
    }

    #[test]
    fn descriptions_agree_only_when_every_rank_makes_the_same_call() {
        let region = Region { ptr: std::ptr::null_mut(), elems: 12 };
        let tag = |store, key, round| Tag { store, key, round };
        let push = |t| Call::Allreduce { tag: t, dtype: DType::F32, send: region, recv: region }.describe();
        let agree = |calls: &[[i64; D]]| agreed(&max_over(&calls.iter().map(|d| both(*d)).collect::<Vec<_>>()));
        let p = push(tag(0, 3, 7));
        assert!(agree(&[p, p, p]));
        assert!(!agree(&[p, push(tag(0, 4, 7))]), "another key");
        assert!(!agree(&[p, push(tag(1, 3, 7))]), "another store");
        assert!(!agree(&[p, push(tag(0, 3, 8))]), "another round: a rank skipped a call");
        assert!(!agree(&[p, Call::Abandoned.describe()]), "a failed input");
        let f64_push = Call::Allreduce { tag: tag(0, 3, 7), dtype: DType::F64, send: region, recv: region }.describe();
        assert!(!agree(&[p, f64_push]), "another dtype");
        let init = Call::Bcast { tag: tag(0, 3, 7), dtype: DType::F32, buf: region }.describe();
        assert!(!agree(&[p, init]), "another kind");
        assert!(agree(&[Call::Abandoned.describe(), Call::Abandoned.describe()]));
        assert_eq!(describe_text(&p), "a push of key 3 (12 float32 values) as store #0's call #7");
    }
}
