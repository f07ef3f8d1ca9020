//! C API: KVStore handles (`mx.kv.create`, `gluon.Trainer`'s store), over
//! `mxnet_core::kvstore`.
//!
//! Owns: the KVStore handle table, the reading of key and array lists (int keys for the plain
//! functions, string keys for the `Ex` ones), and the C updaters: a push that updates calls
//! the caller's function on the pushing thread with two new NDArray handles (the summed
//! gradient and the stored value), which the callee owns and frees, as stock's do.
//! One-machine stores answer the distributed queries as stock's non-distributed build does:
//! rank 0, one worker, barriers and server commands that do nothing; distributed stores with
//! their MPI rank and world size, and a worker installs the optimizer the frontend sends its
//! "servers" itself (`install_pickled_optimizer`).

use super::ffi::{self, cstr, list};
use super::ndarray::arrays;
use super::types::{KVStoreHandle, NDArrayHandle};
use crate::handle::HandleTable;
use mxnet_core::error::{Error, Result};
use mxnet_core::kvstore::{KVStore, Keys, Updater, UpdaterKey};
use mxnet_core::ndarray::NDArray;
use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::{Arc, OnceLock};

fn stores() -> &'static HandleTable<KVStore> {
    static T: OnceLock<HandleTable<KVStore>> = OnceLock::new();
    T.get_or_init(|| HandleTable::new(18, "KVStore"))
}

/// `MXKVStoreUpdater`: (key, recv, local, handle). (The exported signatures spell the
/// function types out, as stock's header declares them.)
type CUpdater = unsafe extern "C" fn(c_int, NDArrayHandle, NDArrayHandle, *mut c_void);
/// `MXKVStoreStrUpdater`: (key, recv, local, handle).
type CStrUpdater = unsafe extern "C" fn(*const c_char, NDArrayHandle, NDArrayHandle, *mut c_void);

/// The caller's opaque updater argument.
#[derive(Clone, Copy)]
struct Opaque(*mut c_void);
// SAFETY: the pointer is never dereferenced by this library; it is only handed back to the
// caller's own callback, on the thread that pushes, as stock does.
unsafe impl Send for Opaque {}
// SAFETY: as above.
unsafe impl Sync for Opaque {}

/// New handles for the summed gradient and the stored value, owned by the callee.
fn updater_handles(recv: &NDArray, local: &NDArray) -> (NDArrayHandle, NDArrayHandle) {
    (arrays().insert(Arc::new(recv.clone())), arrays().insert(Arc::new(local.clone())))
}

fn wrap_int_updater(f: CUpdater, handle: Opaque) -> Updater {
    Arc::new(move |key, recv, local| {
        let k = match key {
            UpdaterKey::Int(k) => k,
            UpdaterKey::Str(_) => return, // string keys go to the string updater (see the core)
        };
        let (r, l) = updater_handles(recv, local);
        let h = handle;
        // SAFETY: the caller registered `f` for exactly this call shape; the handles are new
        // and valid, and become the callee's.
        unsafe { f(k, r, l, h.0) }
    })
}

fn wrap_str_updater(f: CStrUpdater, handle: Opaque) -> Updater {
    Arc::new(move |key, recv, local| {
        let UpdaterKey::Str(k) = key else { return };
        let Ok(k) = CString::new(k) else { return }; // keys came in as C strings: no NUL inside
        let (r, l) = updater_handles(recv, local);
        let h = handle;
        // SAFETY: as in `int_updater`; `k` outlives the call.
        unsafe { f(k.as_ptr(), r, l, h.0) }
    })
}

/// The `n` arrays at `handles`.
///
/// # Safety
/// `handles` must point to `n` readable handles when `n > 0`.
unsafe fn read_arrays(handles: *const NDArrayHandle, n: u32, what: &str) -> Result<Vec<NDArray>> {
    // SAFETY: per this function's contract.
    let hs = unsafe { list(handles, n, what) }?;
    hs.iter().map(|&h| arrays().get(h).map(|a| (*a).clone())).collect()
}

/// Where a call's keys are: ints (the plain functions) or strings (the `Ex` ones).
#[derive(Clone, Copy)]
enum KeyPtr {
    Int(*const c_int),
    Str(*const *const c_char),
}

/// The keys of one call, read.
enum KeyList<'a> {
    Int(&'a [i32]),
    Str(Vec<&'a str>),
}

impl KeyList<'_> {
    fn keys(&self) -> Keys<'_> {
        match self {
            KeyList::Int(k) => Keys::Int(k),
            KeyList::Str(k) => Keys::Str(k),
        }
    }
}

/// The `n` strings at `p`.
///
/// # Safety
/// `p` must point to `n` readable NUL-terminated strings when `n > 0`.
unsafe fn read_strs<'a>(p: *const *const c_char, n: u32, what: &str) -> Result<Vec<&'a str>> {
    // SAFETY: per this function's contract.
    let ps = unsafe { list(p, n, what) }?;
    // SAFETY: each is a NUL-terminated string per the contract.
    ps.iter().map(|&s| unsafe { cstr(s, what) }).collect()
}

/// The `n` keys at `p`.
///
/// # Safety
/// `p` must point to `n` readable ints, or `n` readable NUL-terminated strings, when `n > 0`.
unsafe fn read_keys<'a>(p: KeyPtr, n: u32) -> Result<KeyList<'a>> {
    match p {
        // SAFETY: per this function's contract.
        KeyPtr::Int(k) => Ok(KeyList::Int(unsafe { list(k, n, "keys") }?)),
        // SAFETY: per this function's contract.
        KeyPtr::Str(k) => Ok(KeyList::Str(unsafe { read_strs(k, n, "keys") }?)),
    }
}

/// `api` over one list: `num` keys at `keys` and arrays at `vals`.
///
/// # Safety
/// As [`read_keys`] and [`read_arrays`] for `num` entries.
unsafe fn keyed(
    api: &'static str,
    handle: KVStoreHandle,
    keys: KeyPtr,
    num: u32,
    vals: *const NDArrayHandle,
    f: impl FnOnce(&KVStore, Keys, &[NDArray]) -> Result<()>,
) -> c_int {
    ffi::call(api, || {
        // SAFETY: per this function's contract.
        let (k, v) = unsafe { (read_keys(keys, num)?, read_arrays(vals, num, "vals")?) };
        f(&*stores().get(handle)?, k.keys(), &v)
    })
}

/// `api` over values (`vnum` keys at `vkeys`, arrays at `vals`) and outputs (`onum` keys at
/// `okeys`, arrays at `outs`).
///
/// # Safety
/// As [`read_keys`] and [`read_arrays`] for each list's count.
#[allow(clippy::too_many_arguments)]
unsafe fn keyed2(
    api: &'static str,
    handle: KVStoreHandle,
    (vkeys, vnum, vals): (KeyPtr, u32, *const NDArrayHandle),
    (okeys, onum, outs): (KeyPtr, u32, *const NDArrayHandle),
    f: impl FnOnce(&KVStore, Keys, &[NDArray], Keys, &[NDArray]) -> Result<()>,
) -> c_int {
    ffi::call(api, || {
        // SAFETY: per this function's contract.
        let (vk, ok, v, o) = unsafe {
            (
                read_keys(vkeys, vnum)?,
                read_keys(okeys, onum)?,
                read_arrays(vals, vnum, "vals")?,
                read_arrays(outs, onum, "outs")?,
            )
        };
        f(&*stores().get(handle)?, vk.keys(), &v, ok.keys(), &o)
    })
}

/// Create a store: `local`, `device` (any name containing it), `dist_sync` and
/// `dist_device_sync` (over MPI: a worker loads and initialises it here); `dist_async` and
/// `nccl` stores are refused with NotImplementedError.
///
/// # Safety
/// `type_` must be a NUL-terminated string; `out` NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXKVStoreCreate(type_: *const c_char, out: *mut KVStoreHandle) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        ffi::call_out("MXKVStoreCreate", out, "out", || {
            Ok(stores().insert(Arc::new(KVStore::create(cstr(type_, "type")?)?)))
        })
    }
}

/// Free a store (operations already pushed finish). NULL does nothing.
#[no_mangle]
pub extern "C" fn MXKVStoreFree(handle: KVStoreHandle) -> c_int {
    ffi::call("MXKVStoreFree", || if handle.is_null() { Ok(()) } else { stores().remove(handle).map(drop) })
}

/// Initialise int keys with copies of `vals`.
///
/// # Safety
/// `keys` and `vals` must point to `num` readable entries.
#[no_mangle]
pub unsafe extern "C" fn MXKVStoreInit(
    handle: KVStoreHandle,
    num: u32,
    keys: *const c_int,
    vals: *mut NDArrayHandle,
) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { keyed("MXKVStoreInit", handle, KeyPtr::Int(keys), num, vals, |kv, k, v| kv.init(k, v)) }
}

/// Initialise string keys with copies of `vals`.
///
/// # Safety
/// `keys` and `vals` must point to `num` readable entries.
#[no_mangle]
pub unsafe extern "C" fn MXKVStoreInitEx(
    handle: KVStoreHandle,
    num: u32,
    keys: *mut *const c_char,
    vals: *mut NDArrayHandle,
) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { keyed("MXKVStoreInitEx", handle, KeyPtr::Str(keys), num, vals, |kv, k, v| kv.init(k, v)) }
}

/// Push `vals` (a key given several times sums its values).
///
/// # Safety
/// `keys` and `vals` must point to `num` readable entries.
#[no_mangle]
pub unsafe extern "C" fn MXKVStorePush(
    handle: KVStoreHandle,
    num: u32,
    keys: *const c_int,
    vals: *mut NDArrayHandle,
    priority: c_int,
) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { keyed("MXKVStorePush", handle, KeyPtr::Int(keys), num, vals, |kv, k, v| kv.push(k, v, priority)) }
}

/// [`MXKVStorePush`] with string keys.
///
/// # Safety
/// `keys` and `vals` must point to `num` readable entries.
#[no_mangle]
pub unsafe extern "C" fn MXKVStorePushEx(
    handle: KVStoreHandle,
    num: u32,
    keys: *mut *const c_char,
    vals: *mut NDArrayHandle,
    priority: c_int,
) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { keyed("MXKVStorePushEx", handle, KeyPtr::Str(keys), num, vals, |kv, k, v| kv.push(k, v, priority)) }
}

/// Copy the stored values into `vals`.
///
/// # Safety
/// `keys` and `vals` must point to `num` readable entries.
#[no_mangle]
pub unsafe extern "C" fn MXKVStorePull(
    handle: KVStoreHandle,
    num: u32,
    keys: *const c_int,
    vals: *mut NDArrayHandle,
    priority: c_int,
) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { keyed("MXKVStorePull", handle, KeyPtr::Int(keys), num, vals, |kv, k, v| kv.pull(k, v, priority)) }
}

/// [`MXKVStorePull`] with string keys.
///
/// # Safety
/// `keys` and `vals` must point to `num` readable entries.
#[no_mangle]
pub unsafe extern "C" fn MXKVStorePullEx(
    handle: KVStoreHandle,
    num: u32,
    keys: *mut *const c_char,
    vals: *mut NDArrayHandle,
    priority: c_int,
) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { keyed("MXKVStorePullEx", handle, KeyPtr::Str(keys), num, vals, |kv, k, v| kv.pull(k, v, priority)) }
}

/// [`MXKVStorePull`]; `ignore_sparse` has nothing to skip (arrays are dense here).
///
/// # Safety
/// `keys` and `vals` must point to `num` readable entries.
#[no_mangle]
pub unsafe extern "C" fn MXKVStorePullWithSparse(
    handle: KVStoreHandle,
    num: u32,
    keys: *const c_int,
    vals: *mut NDArrayHandle,
    priority: c_int,
    _ignore_sparse: bool,
) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        keyed("MXKVStorePullWithSparse", handle, KeyPtr::Int(keys), num, vals, |kv, k, v| kv.pull(k, v, priority))
    }
}

/// [`MXKVStorePullWithSparse`] with string keys.
///
/// # Safety
/// `keys` and `vals` must point to `num` readable entries.
#[no_mangle]
pub unsafe extern "C" fn MXKVStorePullWithSparseEx(
    handle: KVStoreHandle,
    num: u32,
    keys: *mut *const c_char,
    vals: *mut NDArrayHandle,
    priority: c_int,
    _ignore_sparse: bool,
) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        keyed("MXKVStorePullWithSparseEx", handle, KeyPtr::Str(keys), num, vals, |kv, k, v| kv.pull(k, v, priority))
    }
}

/// `row_sparse_pull`: refused (sparse storage is not supported yet).
#[no_mangle]
pub extern "C" fn MXKVStorePullRowSparse(
    _handle: KVStoreHandle,
    _num: u32,
    _keys: *const c_int,
    _vals: *mut NDArrayHandle,
    _row_ids: *const NDArrayHandle,
    _priority: c_int,
) -> c_int {
    ffi::call("MXKVStorePullRowSparse", || {
        Err(Error::not_supported("row_sparse_pull (sparse storage; MXKVStorePullRowSparse)"))
    })
}

/// `row_sparse_pull` with string keys: refused (sparse storage is not supported yet).
#[no_mangle]
pub extern "C" fn MXKVStorePullRowSparseEx(
    _handle: KVStoreHandle,
    _num: u32,
    _keys: *mut *const c_char,
    _vals: *mut NDArrayHandle,
    _row_ids: *const NDArrayHandle,
    _priority: c_int,
) -> c_int {
    ffi::call("MXKVStorePullRowSparseEx", || {
        Err(Error::not_supported("row_sparse_pull (sparse storage; MXKVStorePullRowSparseEx)"))
    })
}

/// Initialise `vkeys` with `vals`, then pull `okeys` into `outs`.
///
/// # Safety
/// Each list must hold its count of readable entries.
#[no_mangle]
pub unsafe extern "C" fn MXKVStoreBroadcast(
    handle: KVStoreHandle,
    vnum: u32,
    vkeys: *const c_int,
    onum: u32,
    okeys: *const c_int,
    vals: *mut NDArrayHandle,
    outs: *mut NDArrayHandle,
    priority: c_int,
) -> c_int {
    let (v, o) = ((KeyPtr::Int(vkeys), vnum, vals as *const _), (KeyPtr::Int(okeys), onum, outs as *const _));
    // SAFETY: per this function's contract.
    unsafe { keyed2("MXKVStoreBroadcast", handle, v, o, |kv, vk, v, ok, o| kv.broadcast(vk, v, ok, o, priority)) }
}

/// [`MXKVStoreBroadcast`] with string keys.
///
/// # Safety
/// Each list must hold its count of readable entries.
#[no_mangle]
pub unsafe extern "C" fn MXKVStoreBroadcastEx(
    handle: KVStoreHandle,
    vnum: u32,
    vkeys: *mut *const c_char,
    onum: u32,
    okeys: *mut *const c_char,
    vals: *mut NDArrayHandle,
    outs: *mut NDArrayHandle,
    priority: c_int,
) -> c_int {
    let (v, o) = ((KeyPtr::Str(vkeys), vnum, vals as *const _), (KeyPtr::Str(okeys), onum, outs as *const _));
    // SAFETY: per this function's contract.
    unsafe { keyed2("MXKVStoreBroadcastEx", handle, v, o, |kv, vk, v, ok, o| kv.broadcast(vk, v, ok, o, priority)) }
}

/// Push `vals` under `vkeys`, then pull `okeys` into `outs`.
///
/// # Safety
/// Each list must hold its count of readable entries.
#[no_mangle]
pub unsafe extern "C" fn MXKVStorePushPull(
    handle: KVStoreHandle,
    vnum: u32,
    vkeys: *const c_int,
    onum: u32,
    okeys: *const c_int,
    vals: *mut NDArrayHandle,
    outs: *mut NDArrayHandle,
    priority: c_int,
) -> c_int {
    let (v, o) = ((KeyPtr::Int(vkeys), vnum, vals as *const _), (KeyPtr::Int(okeys), onum, outs as *const _));
    // SAFETY: per this function's contract.
    unsafe { keyed2("MXKVStorePushPull", handle, v, o, |kv, vk, v, ok, o| kv.pushpull(vk, v, ok, o, priority)) }
}

/// [`MXKVStorePushPull`] with string keys.
///
/// # Safety
/// Each list must hold its count of readable entries.
#[no_mangle]
pub unsafe extern "C" fn MXKVStorePushPullEx(
    handle: KVStoreHandle,
    vnum: u32,
    vkeys: *mut *const c_char,
    onum: u32,
    okeys: *mut *const c_char,
    vals: *mut NDArrayHandle,
    outs: *mut NDArrayHandle,
    priority: c_int,
) -> c_int {
    let (v, o) = ((KeyPtr::Str(vkeys), vnum, vals as *const _), (KeyPtr::Str(okeys), onum, outs as *const _));
    // SAFETY: per this function's contract.
    unsafe { keyed2("MXKVStorePushPullEx", handle, v, o, |kv, vk, v, ok, o| kv.pushpull(vk, v, ok, o, priority)) }
}

/// The updater pushes of int keys call (NULL: none).
///
/// # Safety
/// `updater` must be callable as `MXKVStoreUpdater` with `updater_handle` whenever the store
/// pushes, until it is replaced or the store freed.
#[no_mangle]
pub unsafe extern "C" fn MXKVStoreSetUpdater(
    handle: KVStoreHandle,
    updater: Option<unsafe extern "C" fn(c_int, NDArrayHandle, NDArrayHandle, *mut c_void)>,
    updater_handle: *mut c_void,
) -> c_int {
    ffi::call("MXKVStoreSetUpdater", || {
        let f = updater.ok_or_else(|| Error::mxnet("invalid updater"))?;
        stores().get(handle)?.set_updater(Some(wrap_int_updater(f, Opaque(updater_handle))), None);
        Ok(())
    })
}

/// The updaters pushes of int and string keys call.
///
/// # Safety
/// As [`MXKVStoreSetUpdater`], for both functions.
#[no_mangle]
pub unsafe extern "C" fn MXKVStoreSetUpdaterEx(
    handle: KVStoreHandle,
    updater: Option<unsafe extern "C" fn(c_int, NDArrayHandle, NDArrayHandle, *mut c_void)>,
    str_updater: Option<unsafe extern "C" fn(*const c_char, NDArrayHandle, NDArrayHandle, *mut c_void)>,
    updater_handle: *mut c_void,
) -> c_int {
    ffi::call("MXKVStoreSetUpdaterEx", || {
        let (f, g) = match (updater, str_updater) {
            (Some(f), Some(g)) => (f, g),
            _ => return Err(Error::mxnet("invalid updater")),
        };
        let h = Opaque(updater_handle);
        stores().get(handle)?.set_updater(Some(wrap_int_updater(f, h)), Some(wrap_str_updater(g, h)));
        Ok(())
    })
}

/// Gradient compression: `type` (`2bit`) and `threshold`.
///
/// # Safety
/// `keys` and `vals` must point to `num_params` NUL-terminated strings each.
#[no_mangle]
pub unsafe extern "C" fn MXKVStoreSetGradientCompression(
    handle: KVStoreHandle,
    num_params: u32,
    keys: *mut *const c_char,
    vals: *mut *const c_char,
) -> c_int {
    ffi::call("MXKVStoreSetGradientCompression", || {
        // SAFETY: per this function's contract.
        let (k, v) = unsafe { (read_strs(keys, num_params, "keys")?, read_strs(vals, num_params, "vals")?) };
        let params: Vec<(&str, &str)> = k.into_iter().zip(v).collect();
        stores().get(handle)?.set_gradient_compression(&params)
    })
}

/// The store's type name (valid while the store lives).
///
/// # Safety
/// `type_` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXKVStoreGetType(handle: KVStoreHandle, type_: *mut *const c_char) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { ffi::call_out("MXKVStoreGetType", type_, "type", || ffi::return_str(stores().get(handle)?.type_name())) }
}

/// This worker's rank: its MPI rank for a distributed store, else 0.
///
/// # Safety
/// `ret` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXKVStoreGetRank(handle: KVStoreHandle, ret: *mut c_int) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { ffi::call_out("MXKVStoreGetRank", ret, "ret", || stores().get(handle).map(|s| s.rank())) }
}

/// The number of workers: the MPI world's size for a distributed store, else 1.
///
/// # Safety
/// `ret` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXKVStoreGetGroupSize(handle: KVStoreHandle, ret: *mut c_int) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { ffi::call_out("MXKVStoreGetGroupSize", ret, "ret", || stores().get(handle).map(|s| s.num_workers())) }
}

/// Dead nodes: none (MPI ends the whole job when a rank dies).
///
/// # Safety
/// `number` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXKVStoreGetNumDeadNode(
    handle: KVStoreHandle,
    _node_id: c_int,
    number: *mut c_int,
    _timeout_sec: c_int,
) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { ffi::call_out("MXKVStoreGetNumDeadNode", number, "number", || stores().get(handle).map(|_| 0)) }
}

/// A barrier among the workers of a distributed store (after this worker's earlier pushes
/// and inits); nothing to wait for on one machine.
#[no_mangle]
pub extern "C" fn MXKVStoreBarrier(handle: KVStoreHandle) -> c_int {
    ffi::call("MXKVStoreBarrier", || stores().get(handle)?.barrier())
}

/// Stock's server command ids (the frontend's `_get_kvstore_server_command_type`).
const CMD_CONTROLLER: c_int = 0;

/// A command to the servers. One-machine stores have none and do nothing (as stock's). A
/// distributed store's workers are its servers: the controller command (`set_optimizer`'s
/// pickled optimizer) installs that optimizer as this store's updater, as stock's server
/// process does with it (see [`install_pickled_optimizer`]); the other commands (multi-
/// precision, sync mode, compression and profiler settings for servers) change nothing here,
/// where the workers' own settings already apply.
///
/// # Safety
/// `cmd_body` must be NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn MXKVStoreSendCommmandToServers(
    handle: KVStoreHandle,
    cmd_id: c_int,
    cmd_body: *const c_char,
) -> c_int {
    ffi::call("MXKVStoreSendCommmandToServers", || {
        let store = stores().get(handle)?;
        if !store.is_distributed() || cmd_id != CMD_CONTROLLER {
            return Ok(());
        }
        if cmd_body.is_null() {
            return Err(Error::mxnet("the controller command has no body (the pickled optimizer)"));
        }
        // SAFETY: per this function's contract.
        let body = unsafe { std::ffi::CStr::from_ptr(cmd_body) }.to_bytes();
        install_pickled_optimizer(handle, body)
    })
}

/// The Python C API functions [`install_pickled_optimizer`] calls.
struct Python {
    is_initialized: unsafe extern "C" fn() -> c_int,
    gil_ensure: unsafe extern "C" fn() -> c_int,
    gil_release: unsafe extern "C" fn(c_int),
    run_simple_string: unsafe extern "C" fn(*const c_char) -> c_int,
}

/// The Python interpreter this process runs, if any (its symbols are global: the `python`
/// executable exports them for extension modules).
fn python() -> Option<Python> {
    fn sym(name: &std::ffi::CStr) -> Option<*mut c_void> {
        // SAFETY: dlsym with RTLD_DEFAULT only looks the name up.
        let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
        (!p.is_null()).then_some(p)
    }
    let (a, b, c, d) = (
        sym(c"Py_IsInitialized")?,
        sym(c"PyGILState_Ensure")?,
        sym(c"PyGILState_Release")?,
        sym(c"PyRun_SimpleString")?,
    );
    // SAFETY: these are the Python C API's functions of these names, with these signatures
    // (PyGILState_STATE is a C enum, an int).
    unsafe {
        Some(Python {
            is_initialized: std::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> c_int>(a),
            gil_ensure: std::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> c_int>(b),
            gil_release: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(c_int)>(c),
            run_simple_string: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*const c_char) -> c_int>(d),
        })
    }
}

/// `kv.set_optimizer(opt)` on a distributed store sends the pickled optimizer to the servers;
/// stock's server process unpickles it and installs `mx.optimizer.get_updater(opt)` as its
/// store's updater. Here every worker is its own server, so the worker does that, by running
/// the same frontend code in the interpreter that called (ctypes released the GIL for this
/// call; it is taken back for the run). Outside Python there is nothing to unpickle with: a
/// C program sets an updater itself (`MXKVStoreSetUpdater`).
fn install_pickled_optimizer(handle: KVStoreHandle, body: &[u8]) -> Result<()> {
    let py = python().ok_or_else(|| {
        Error::not_supported(
            "a pickled optimizer outside a Python process (set the updater with MXKVStoreSetUpdater instead)",
        )
    })?;
    // SAFETY: Py_IsInitialized may be called at any time.
    if unsafe { (py.is_initialized)() } == 0 {
        return Err(Error::not_supported("a pickled optimizer before the Python interpreter is initialised"));
    }
    const CAP: usize = 4096;
    let mut message = vec![0u8; CAP];
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let code = format!(
        "import ctypes, pickle\n\
         try:\n\
         \x20   from mxnet import optimizer as _opt\n\
         \x20   from mxnet.base import _LIB, check_call\n\
         \x20   from mxnet.kvstore import kvstore as _kvs\n\
         \x20   upd = _opt.get_updater(pickle.loads(bytes.fromhex('{body}')))\n\
         \x20   f = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(_kvs._updater_wrapper(upd))\n\
         \x20   g = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(_kvs._updater_wrapper(upd))\n\
         \x20   check_call(_LIB.MXKVStoreSetUpdaterEx(ctypes.c_void_p({handle}), f, g, None))\n\
         \x20   _kvs.__dict__.setdefault('_mxrt_dist_updaters', {{}})[{handle}] = (upd, f, g)\n\
         except BaseException as e:\n\
         \x20   m = ('%s: %s' % (type(e).__name__, e)).encode('utf-8', 'replace')[:{cap}]\n\
         \x20   ctypes.memmove({buf}, m, len(m))\n",
        body = hex(body),
        handle = handle as usize,
        cap = CAP - 1,
        buf = message.as_mut_ptr() as usize,
    );
    // Run in a fresh namespace, not the caller's __main__.
    let outer = CString::new(format!("exec(bytes.fromhex('{}').decode(), {{}})", hex(code.as_bytes())))
        .map_err(|_| Error::internal("a NUL in generated Python code"))?;
    // Outside the call gate: a Python thread forking holds the GIL while the fork waits for
    // calls in progress (see `runtime::outside_call`).
    let rc = mxnet_core::runtime::outside_call(|| {
        // SAFETY: the interpreter is initialised (checked); Ensure takes the GIL whether or not
        // this thread holds it (ctypes released it for this call) and Release restores that
        // state. The code writes at most CAP - 1 bytes into `message`, which outlives the run.
        unsafe {
            let gil = (py.gil_ensure)();
            let rc = (py.run_simple_string)(outer.as_ptr());
            (py.gil_release)(gil);
            rc
        }
    });
    let len = message.iter().position(|&b| b == 0).unwrap_or(CAP);
    if len > 0 {
        let text = String::from_utf8_lossy(&message[..len]);
        return Err(Error::mxnet(format!(
            "the optimizer sent to the distributed store could not be installed: {text}"
        )));
    }
    if rc != 0 {
        return Err(Error::mxnet(
            "the optimizer sent to the distributed store could not be installed (see Python's message above)",
        ));
    }
    Ok(())
}

/// Run a server: the workers reduce among themselves, so a server has nothing to serve and
/// returns at once (the frontend's server process then exits, as when stock's stops).
#[no_mangle]
pub extern "C" fn MXKVStoreRunServer(
    handle: KVStoreHandle,
    _controller: Option<unsafe extern "C" fn(c_int, *const c_char, *mut c_void)>,
    _controller_handle: *mut c_void,
) -> c_int {
    ffi::call("MXKVStoreRunServer", || stores().get(handle).map(drop))
}

/// Whether a worker's distributed store waits for the others before it exits (stock's
/// default: yes). Accepted on workers, as stock accepts it; it changes nothing here, where
/// every rank's MPI finalisation at exit waits for all ranks. Refused on servers and
/// schedulers, as stock refuses it.
#[no_mangle]
pub extern "C" fn MXKVStoreSetBarrierBeforeExit(handle: KVStoreHandle, _barrier_before_exit: c_int) -> c_int {
    ffi::call("MXKVStoreSetBarrierBeforeExit", || {
        stores().get(handle)?;
        if mxnet_core::kvstore::role() != mxnet_core::kvstore::Role::Worker {
            return Err(Error::mxnet("barrier_before_exit takes effect only on worker nodes"));
        }
        Ok(())
    })
}

/// The parameter servers' environment (`DMLC_ROLE`, ...): settings that take precedence over
/// the process environment where this library reads them (the role).
///
/// # Safety
/// `keys` and `vals` must point to `num_vars` NUL-terminated strings each.
#[no_mangle]
pub unsafe extern "C" fn MXInitPSEnv(num_vars: u32, keys: *mut *const c_char, vals: *mut *const c_char) -> c_int {
    ffi::call("MXInitPSEnv", || {
        // SAFETY: per this function's contract.
        let (k, v) = unsafe { (read_strs(keys, num_vars, "keys")?, read_strs(vals, num_vars, "vals")?) };
        let pairs: Vec<(&str, &str)> = k.into_iter().zip(v).collect();
        mxnet_core::kvstore::set_ps_env(&pairs);
        Ok(())
    })
}
