//! C API: the C++ data iterators (`mx.io.MNISTIter`, `mx.io.CSVIter`, ...).
//!
//! Owns: the list of stock's iterator creators (`MXListDataIters`; the frontend defines a class
//! for each at import), their descriptions and parameters (`MXDataIterGetIterInfo`, from
//! `mxnet_core::data::iter`'s tables), and the iterator handle table. An iterator stock has
//! and this library does not implement yet describes itself as such and refuses creation with
//! NotImplementedError. A handle's current batch stays valid until its next `MXDataIterNext`;
//! the arrays `GetData`/`GetLabel` return are the caller's, independent of later batches.

use super::ffi::{self, out};
use super::ndarray::arrays;
use super::types::{DataIterCreator, DataIterHandle, NDArrayHandle};
use crate::handle::HandleTable;
use mxnet_core::data::iter::{self, Batch, DataIter};
use mxnet_core::error::{Error, Result};
use mxnet_core::sync::{Mutex, MutexGuard};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::{Arc, OnceLock};

/// Stock's data iterators, by name.
const DATA_ITERS: [&CStr; 9] = [
    c"CSVIter",
    c"ImageDetRecordIter",
    c"ImageRecordInt8Iter",
    c"ImageRecordIter",
    c"ImageRecordIter_v1",
    c"ImageRecordUInt8Iter",
    c"ImageRecordUInt8Iter_v1",
    c"LibSVMIter",
    c"MNISTIter",
];

/// What `MXDataIterGetIterInfo` reports for one iterator, kept for the process's lifetime.
struct Info {
    description: CString,
    strings: Vec<[CString; 3]>,
    names: Vec<*const c_char>,
    types: Vec<*const c_char>,
    docs: Vec<*const c_char>,
}

struct Infos([Info; 9]);
// SAFETY: the pointers address the CStrings each Info owns, which are never changed or freed.
unsafe impl Sync for Infos {}
// SAFETY: as above.
unsafe impl Send for Infos {}

fn infos() -> &'static [Info; 9] {
    static INFOS: OnceLock<Infos> = OnceLock::new();
    &INFOS
        .get_or_init(|| {
            Infos(DATA_ITERS.map(|name| {
                let c = |s: &str| CString::new(s.replace('\0', " ")).unwrap_or_default();
                let (description, strings) = match iter::find(&name.to_string_lossy()) {
                    Some(def) => {
                        (c(def.doc), def.params.iter().map(|p| [c(p.name), c(&p.type_string()), c(p.doc)]).collect())
                    }
                    None => (
                        c("Not supported by mxnet-rt yet: creating this iterator fails with NotImplementedError."),
                        Vec::new(),
                    ),
                };
                let col = |k: usize| strings.iter().map(|s: &[CString; 3]| s[k].as_ptr()).collect::<Vec<_>>();
                let (names, types, docs) = (col(0), col(1), col(2));
                Info { description, strings, names, types, docs }
            }))
        })
        .0
}

struct IterTable([*mut c_void; 9]);
// SAFETY: the pointers address the static C strings above and are never written through.
unsafe impl Sync for IterTable {}
// SAFETY: as above.
unsafe impl Send for IterTable {}
static ITER_HANDLES: OnceLock<IterTable> = OnceLock::new();

fn iter_handles() -> &'static [*mut c_void; 9] {
    &ITER_HANDLES.get_or_init(|| IterTable(DATA_ITERS.map(|c| c.as_ptr() as *mut c_void))).0
}

fn creator_index(creator: *mut c_void) -> Result<usize> {
    iter_handles()
        .iter()
        .position(|&h| h == creator)
        .ok_or_else(|| Error::value(format!("{creator:p} is not a data iterator creator")))
}

/// A created iterator and its current batch.
struct Running {
    iter: Box<dyn DataIter>,
    current: Option<Batch>,
}

/// A handle's value: the iterator under its lock, and what is checked before taking the lock.
struct Entry {
    name: String,
    /// The process whose threads the iterator works with (see [`DataIter::owner_process`]).
    owner: Option<u32>,
    state: Mutex<Running>,
}

fn running() -> &'static HandleTable<Entry> {
    static T: OnceLock<HandleTable<Entry>> = OnceLock::new();
    T.get_or_init(|| HandleTable::new(17, "DataIter"))
}

/// The iterator behind a handle, refused in a process forked from the one it works in before
/// its lock is taken: a thread of the parent may have held it at the fork. The lock is taken
/// by the caller, outside the handle table's slot lock (a batch takes time to make).
fn entry(h: DataIterHandle) -> Result<Arc<Entry>> {
    let e = running().get(h)?;
    match e.owner {
        Some(pid) if pid != std::process::id() => Err(Error::mxnet(format!(
            "this {} was created before fork(); its reading thread is in the parent process: create the iterator in the child",
            e.name
        ))),
        _ => Ok(e),
    }
}

impl Entry {
    /// The iterator's lock. One with threads may be held by a call waiting for its thread
    /// outside the call gate; waiting for it inside the gate would close a cycle with a fork
    /// being prepared (the fork waits for this call, the holder's thread for the fork, the
    /// holder for its thread), so that wait is outside the gate too. Holding it across a
    /// fork is harmless: the child is refused before it takes the lock ([`entry`]).
    fn lock(&self) -> MutexGuard<'_, Running> {
        match self.owner {
            Some(_) => self.state.try_lock().unwrap_or_else(|| mxnet_core::runtime::outside_call(|| self.state.lock())),
            None => self.state.lock(),
        }
    }
}

fn with_batch<R>(h: DataIterHandle, f: impl FnOnce(&Batch) -> Result<R>) -> Result<R> {
    match &entry(h)?.lock().current {
        Some(b) => f(b),
        None => Err(Error::value("the data iterator has no current batch (call MXDataIterNext first)")),
    }
}

/// The stock data iterator names.
///
/// # Safety
/// Out-params must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXListDataIters(out_size: *mut u32, out_array: *mut *mut DataIterCreator) -> c_int {
    ffi::call("MXListDataIters", || {
        // SAFETY: per this function's contract.
        let (n, a) = unsafe { (out(out_size, "out_size")?, out(out_array, "out_array")?) };
        *n = DATA_ITERS.len() as u32;
        *a = iter_handles().as_ptr() as *mut DataIterCreator;
        Ok(())
    })
}

/// A data iterator's name, description and parameters (none for those not implemented yet).
///
/// # Safety
/// Out-params must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXDataIterGetIterInfo(
    creator: DataIterCreator,
    name: *mut *const c_char,
    description: *mut *const c_char,
    num_args: *mut u32,
    arg_names: *mut *mut *const c_char,
    arg_type_infos: *mut *mut *const c_char,
    arg_descriptions: *mut *mut *const c_char,
) -> c_int {
    ffi::call("MXDataIterGetIterInfo", || {
        let i = creator_index(creator)?;
        let info = &infos()[i];
        // SAFETY: per this function's contract; the arrays live for the process.
        unsafe {
            *out(name, "name")? = DATA_ITERS[i].as_ptr();
            *out(description, "description")? = info.description.as_ptr();
            *out(num_args, "num_args")? = info.strings.len() as u32;
            *out(arg_names, "arg_names")? = info.names.as_ptr().cast_mut();
            *out(arg_type_infos, "arg_type_infos")? = info.types.as_ptr().cast_mut();
            *out(arg_descriptions, "arg_descriptions")? = info.docs.as_ptr().cast_mut();
        }
        Ok(())
    })
}

/// Create a data iterator from string parameters (unknown keys are ignored, as in stock).
///
/// # Safety
/// `keys` and `vals` must point to `num_param` NUL-terminated strings; `out` NULL or valid for
/// writes.
#[no_mangle]
pub unsafe extern "C" fn MXDataIterCreateIter(
    handle: DataIterCreator,
    num_param: u32,
    keys: *mut *const c_char,
    vals: *mut *const c_char,
    out: *mut DataIterHandle,
) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        ffi::call_out("MXDataIterCreateIter", out, "out", || {
            let name = DATA_ITERS[creator_index(handle)?].to_string_lossy();
            let def = iter::find(&name).ok_or_else(|| Error::not_supported(format!("data iterator {name}")))?;
            let keys = ffi::list(keys.cast_const(), num_param, "keys")?;
            let vals = ffi::list(vals.cast_const(), num_param, "vals")?;
            let kv = keys
                .iter()
                .zip(vals)
                .map(|(&k, &v)| Ok((ffi::cstr(k, "a key")?, ffi::cstr(v, "a value")?)))
                .collect::<Result<Vec<_>>>()?;
            let iter = def.create(kv)?;
            let owner = iter.owner_process();
            let state = Mutex::new(Running { iter, current: None });
            Ok(running().insert(Arc::new(Entry { name: name.into_owned(), owner, state })))
        })
    }
}

/// Free a data iterator (NULL does nothing).
#[no_mangle]
pub extern "C" fn MXDataIterFree(handle: DataIterHandle) -> c_int {
    ffi::call("MXDataIterFree", || if handle.is_null() { Ok(()) } else { running().remove(handle).map(drop) })
}

/// Start the next epoch.
#[no_mangle]
pub extern "C" fn MXDataIterBeforeFirst(handle: DataIterHandle) -> c_int {
    ffi::call("MXDataIterBeforeFirst", || {
        let e = entry(handle)?;
        let mut r = e.lock();
        r.current = None;
        r.iter.before_first()
    })
}

/// Move to the next batch: `*out` is 1, or 0 at the end of the epoch.
///
/// # Safety
/// `out` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXDataIterNext(handle: DataIterHandle, out: *mut c_int) -> c_int {
    ffi::call("MXDataIterNext", || {
        // SAFETY: per this function's contract.
        let out = unsafe { self::out(out, "out")? };
        let e = entry(handle)?;
        let mut r = e.lock();
        r.current = r.iter.next()?;
        let more = r.current.is_some();
        *out = c_int::from(more);
        Ok(())
    })
}

/// The current batch's data, as a new NDArray handle.
///
/// # Safety
/// `out` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXDataIterGetData(handle: DataIterHandle, out: *mut NDArrayHandle) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        ffi::call_out("MXDataIterGetData", out, "out", || {
            with_batch(handle, |b| Ok(arrays().insert(Arc::new(b.data.clone()))))
        })
    }
}

/// The current batch's label, as a new NDArray handle.
///
/// # Safety
/// `out` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXDataIterGetLabel(handle: DataIterHandle, out: *mut NDArrayHandle) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        ffi::call_out("MXDataIterGetLabel", out, "out", || {
            with_batch(handle, |b| Ok(arrays().insert(Arc::new(b.label.clone()))))
        })
    }
}

/// The current batch's instance indices: `*out_size` values at `*out_index`, valid until the
/// next `MXDataIterNext` or `MXDataIterFree` on the handle.
///
/// # Safety
/// Out-params must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXDataIterGetIndex(
    handle: DataIterHandle,
    out_index: *mut *mut u64,
    out_size: *mut u64,
) -> c_int {
    ffi::call("MXDataIterGetIndex", || {
        // SAFETY: per this function's contract.
        let (index, size) = unsafe { (out(out_index, "out_index")?, out(out_size, "out_size")?) };
        // The vector lives in the handle's current batch until the next batch replaces it.
        let (p, n) = with_batch(handle, |b| Ok((b.index.as_ptr().cast_mut(), b.index.len() as u64)))?;
        (*index, *size) = (p, n);
        Ok(())
    })
}

/// The number of padding instances at the end of the current batch.
///
/// # Safety
/// `pad` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXDataIterGetPadNum(handle: DataIterHandle, pad: *mut c_int) -> c_int {
    ffi::call("MXDataIterGetPadNum", || {
        // SAFETY: per this function's contract.
        let pad = unsafe { out(pad, "pad")? };
        *pad = with_batch(handle, |b| Ok(b.pad as c_int))?;
        Ok(())
    })
}
