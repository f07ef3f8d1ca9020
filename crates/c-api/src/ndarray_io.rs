//! C API: NDArray files and pickling (MXNDArraySave, MXNDArrayLoad, MXNDArrayLoadFromBuffer,
//! MXNDArraySaveRawBytes, MXNDArrayLoadFromRawBytes), in stock MXNet's binary format.

use super::ffi::{self, cstr, out};
use super::ndarray::arrays;
use super::types::NDArrayHandle;
use mxnet_core::error::{Error, Result};
use mxnet_core::ndarray::{io, np_shape, NDArray};
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::Arc;

/// What the loaders return: handles, names (and their C pointers), and SaveRawBytes' bytes.
type Loaded = (Vec<NDArrayHandle>, Vec<CString>, Vec<*const c_char>, Vec<u8>);

thread_local! {
    /// Handles and names returned by the loaders, and the bytes of SaveRawBytes.
    /// (Boxed to keep the TLS block small.)
    static LOADED: RefCell<Box<Loaded>> = RefCell::new(Box::default());
}

/// # Safety
/// `args` must point to `n` handles; `keys` NULL or to `n` strings.
unsafe fn collect(
    n: u32,
    args: *mut NDArrayHandle,
    keys: *const *const c_char,
) -> Result<(Vec<NDArray>, Option<Vec<String>>)> {
    if n > 0 && args.is_null() {
        return Err(Error::value(format!("args is NULL but num_args is {n}")));
    }
    let handles = if n == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(args, n as usize) } };
    let arrays_in = handles.iter().map(|&h| arrays().get(h).map(|a| (*a).clone())).collect::<Result<Vec<_>>>()?;
    let names = if keys.is_null() {
        None
    } else {
        // SAFETY: per this function's contract.
        let ks = unsafe { std::slice::from_raw_parts(keys, n as usize) };
        Some(ks.iter().map(|&k| unsafe { cstr(k, "key") }.map(str::to_string)).collect::<Result<Vec<_>>>()?)
    };
    Ok((arrays_in, names))
}

/// Hand loaded arrays and names to C through the per-thread buffers.
///
/// # Safety
/// Out-params must be valid for writes.
unsafe fn hand_out(
    loaded: (Vec<NDArray>, Vec<String>),
    out_size: *mut u32,
    out_arr: *mut *mut NDArrayHandle,
    out_name_size: *mut u32,
    out_names: *mut *mut *const c_char,
) -> Result<()> {
    // SAFETY: per this function's contract.
    let (size, arr, name_size, names_out) = unsafe {
        (
            out(out_size, "out_size")?,
            out(out_arr, "out_arr")?,
            out(out_name_size, "out_name_size")?,
            out(out_names, "out_names")?,
        )
    };
    let (list, names) = loaded;
    let cnames = names
        .into_iter()
        .map(|n| CString::new(n).map_err(|_| Error::mxnet("invalid NDArray file: a name contains NUL")))
        .collect::<Result<Vec<_>>>()?;
    LOADED.with(|l| {
        let mut l = l.borrow_mut();
        l.0 = list.into_iter().map(|a| arrays().insert(Arc::new(a))).collect();
        l.2 = cnames.iter().map(|c| c.as_ptr()).collect();
        l.1 = cnames;
        *size = l.0.len() as u32;
        *arr = l.0.as_mut_ptr();
        *name_size = l.2.len() as u32;
        *names_out = l.2.as_mut_ptr();
    });
    Ok(())
}

/// Save arrays to a file; `keys` NULL saves a list, otherwise a dict with these names.
///
/// # Safety
/// `fname` must be a string, `args` `num_args` handles, `keys` NULL or `num_args` strings.
#[no_mangle]
pub unsafe extern "C" fn MXNDArraySave(
    fname: *const c_char,
    num_args: u32,
    args: *mut NDArrayHandle,
    keys: *mut *const c_char,
) -> c_int {
    ffi::call("MXNDArraySave", || {
        // SAFETY: per this function's contract.
        let (path, (list, names)) = unsafe { (cstr(fname, "fname")?, collect(num_args, args, keys)?) };
        let bytes = io::save_list(&list, names.as_deref(), np_shape::get() != 0)?;
        // Write then rename, so that a crash never leaves a half-written file behind.
        let tmp = format!("{path}.tmp{}", std::process::id());
        std::fs::write(&tmp, &bytes).and_then(|_| std::fs::rename(&tmp, path)).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            Error::mxnet(format!("cannot write {path}: {e}"))
        })
    })
}

/// Load a file written by MXNDArraySave (here or by stock MXNet). `*out_name_size` is 0 for
/// a list, else equal to `*out_size`. Handles and names live in per-thread buffers until the
/// next load on this thread; each handle must be freed with MXNDArrayFree.
///
/// # Safety
/// `fname` must be a string; out-params valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayLoad(
    fname: *const c_char,
    out_size: *mut u32,
    out_arr: *mut *mut NDArrayHandle,
    out_name_size: *mut u32,
    out_names: *mut *mut *const c_char,
) -> c_int {
    ffi::call("MXNDArrayLoad", || {
        // SAFETY: per this function's contract.
        let path = unsafe { cstr(fname, "fname") }?;
        let bytes = io::read_list_file(path)?;
        let loaded = io::load_list(&bytes, io::Semantics::current())?;
        // SAFETY: per this function's contract.
        unsafe { hand_out(loaded, out_size, out_arr, out_name_size, out_names) }
    })
}

/// As MXNDArrayLoad, from `size` bytes in memory.
///
/// # Safety
/// `ndarray_buffer` must point to `size` bytes; out-params valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayLoadFromBuffer(
    ndarray_buffer: *const c_void,
    size: usize,
    out_size: *mut u32,
    out_arr: *mut *mut NDArrayHandle,
    out_name_size: *mut u32,
    out_names: *mut *mut *const c_char,
) -> c_int {
    ffi::call("MXNDArrayLoadFromBuffer", || {
        // SAFETY: per this function's contract.
        let bytes = unsafe { bytes_in(ndarray_buffer, size)? };
        let loaded = io::load_list(bytes, io::Semantics::current())?;
        // SAFETY: per this function's contract.
        unsafe { hand_out(loaded, out_size, out_arr, out_name_size, out_names) }
    })
}

/// # Safety
/// `buf` must point to `size` readable bytes.
unsafe fn bytes_in<'a>(buf: *const c_void, size: usize) -> Result<&'a [u8]> {
    if buf.is_null() && size > 0 {
        return Err(Error::value("buffer is NULL"));
    }
    Ok(if size == 0 { &[] } else { unsafe { std::slice::from_raw_parts(buf as *const u8, size) } })
}

/// One array in the binary format (pickling); the bytes live in a per-thread buffer until the
/// next call of this function on the thread.
///
/// # Safety
/// Out-params must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXNDArraySaveRawBytes(
    handle: NDArrayHandle,
    out_size: *mut usize,
    out_buf: *mut *const c_char,
) -> c_int {
    ffi::call("MXNDArraySaveRawBytes", || {
        // SAFETY: per this function's contract.
        let (size, buf) = unsafe { (out(out_size, "out_size")?, out(out_buf, "out_buf")?) };
        let nd = arrays().get(handle)?;
        let mut bytes = Vec::new();
        io::save_array(&nd, np_shape::get() != 0, &mut bytes)?;
        LOADED.with(|l| {
            let mut l = l.borrow_mut();
            l.3 = bytes;
            *size = l.3.len();
            *buf = l.3.as_ptr() as *const c_char;
        });
        Ok(())
    })
}

/// An array from the bytes of MXNDArraySaveRawBytes (unpickling).
///
/// # Safety
/// `buf` must point to `size` bytes; `out` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayLoadFromRawBytes(buf: *const c_void, size: usize, out: *mut NDArrayHandle) -> c_int {
    ffi::call("MXNDArrayLoadFromRawBytes", || {
        // SAFETY: per this function's contract.
        let (bytes, o) = unsafe { (bytes_in(buf, size)?, ffi::out(out, "out")?) };
        *o = arrays().insert(Arc::new(io::load_array(bytes, io::Semantics::current())?));
        Ok(())
    })
}
