//! The C ABI boundary: the one wrapper every exported function runs its body in.
//!
//! Owns: panic containment, the thread-local last error behind `MXGetLastError`, the
//! per-thread return buffers for strings handed out through out-params, and the null/UTF-8
//! checks for pointers received from C.
//!
//! Conventions (also in the README): return 0 on success and -1 on failure; on failure the
//! calling thread's `MXGetLastError` text starts with `ErrorType: message` and stays valid until
//! the next failing call on that thread; out-params are written only on success; strings
//! returned through out-params stay valid until the next call on the same thread that returns
//! a string.

use mxnet_core::error::{Error, Result};
use std::any::Any;
use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Once;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
    static RET_STR: RefCell<CString> = RefCell::new(CString::default());
    /// Where the last contained panic happened, recorded by the panic hook.
    static PANIC_AT: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Panics inside [`call`] become the error text (with their location) instead of a message on
/// the host's stderr; panics elsewhere go to the previous hook unchanged.
#[inline]
fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            // A panic inside a call is reported, not printed.
            if mxnet_core::runtime::in_call() {
                let at = info.location().map(|l| format!("{}:{}", l.file(), l.line()));
                let _ = PANIC_AT.try_with(|p| *p.borrow_mut() = at);
            } else {
                previous(info);
            }
        }));
    });
}

/// Run an exported function's body: `Ok` → 0; `Err` or a panic → -1 with the last error set.
/// Nothing unwinds past this point. The body runs as a call of the fork protocol's call gate
/// (`mxnet_core::runtime::enter_call`, which also counts the thread's nested calls). Inlined
/// into each exported function (an engine push passes a dozen arguments through it); the
/// failure handling is out of line.
#[inline(always)]
pub fn call(api: &'static str, body: impl FnOnce() -> Result<()>) -> c_int {
    let gate = mxnet_core::runtime::enter_call();
    let rc = run(api, body);
    drop(gate);
    rc
}

/// [`call`] for a function that completes engine work (`MXEngineCompleteAsync`): it passes the
/// completion gate instead of the call gate, as a `fork` waits for that work with the call
/// gate closed (`mxnet_core::runtime::enter_completion`).
pub fn call_completing(api: &'static str, body: impl FnOnce() -> Result<()>) -> c_int {
    let gate = mxnet_core::runtime::enter_completion();
    let rc = run(api, body);
    drop(gate);
    rc
}

#[inline(always)]
fn run(api: &'static str, body: impl FnOnce() -> Result<()>) -> c_int {
    install_panic_hook();
    let start = mxnet_core::profiler::api_on().then(mxnet_core::profiler::api_begin);
    let outcome = catch_unwind(AssertUnwindSafe(body));
    if let Some(t) = start {
        mxnet_core::profiler::api_call(api, t);
    }
    match outcome {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => failed(&e),
        Err(payload) => panicked(api, payload),
    }
}

/// [`call`]'s body failed: record the error; -1.
#[cold]
#[inline(never)]
fn failed(e: &Error) -> c_int {
    set_last_error(e);
    -1
}

/// [`call`]'s body panicked: record the panic (with where it happened) as the error; -1.
#[cold]
#[inline(never)]
fn panicked(api: &'static str, payload: Box<dyn Any + Send>) -> c_int {
    let msg = panic_message(payload.as_ref());
    // try_with: during thread teardown the slot may be gone (a panic here would abort).
    let at = PANIC_AT.try_with(|p| p.borrow_mut().take()).ok().flatten().map(|l| format!(" (at {l})"));
    set_last_error(&Error::internal(format!("panic in {api}: {msg}{}", at.unwrap_or_default())));
    -1
}

/// [`call`] for the most common shape of an exported function: compute one value and write
/// it to a required out-param (only on success).
///
/// # Safety
/// `out` must be NULL or valid for writes.
pub unsafe fn call_out<T>(api: &'static str, out: *mut T, what: &str, value: impl FnOnce() -> Result<T>) -> c_int {
    call(api, || {
        // SAFETY: per this function's contract.
        let o = unsafe { self::out(out, what) }?;
        *o = value()?;
        Ok(())
    })
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

/// Set this thread's last error text as given (`NNAPISetLastError`, a frontend reporting its
/// own failure through the library's error slot).
pub fn set_last_error_text(text: &CStr) {
    // During thread teardown the slot may be gone; the text is then dropped (nothing asked).
    let _ = LAST_ERROR.try_with(|slot| *slot.borrow_mut() = text.to_owned());
}

/// Record `e` as this thread's last error.
pub fn set_last_error(e: &Error) {
    let text = CString::new(e.to_string().replace('\0', "\\0")).unwrap_or_default();
    // During thread teardown (a thread-local destructor freeing handles) this thread's slot
    // may be gone: the text then goes to the process-wide slot, so it is never lost.
    if LAST_ERROR.try_with(|slot| *slot.borrow_mut() = text.clone()).is_err() {
        // Leaked on purpose: a pointer handed out earlier stays valid. Only calls that fail
        // while their thread is being torn down come here.
        let leaked: &'static CStr = Box::leak(text.into_boxed_c_str());
        TEARDOWN_ERROR.store(leaked.as_ptr() as *mut c_char, Ordering::Release);
    }
}

/// The last error of a call that failed while its thread was torn down (NULL: none).
static TEARDOWN_ERROR: AtomicPtr<c_char> = AtomicPtr::new(std::ptr::null_mut());

/// Pointer to this thread's last error text (empty string if none). Valid until the next
/// failing call on this thread.
pub fn last_error_ptr() -> *const c_char {
    LAST_ERROR.try_with(|slot| slot.borrow().as_ptr()).unwrap_or_else(|_| {
        let p = TEARDOWN_ERROR.load(Ordering::Acquire);
        if p.is_null() {
            c"".as_ptr()
        } else {
            p
        }
    })
}

/// Store `s` in this thread's return buffer and return a pointer valid until the next call on
/// this thread that returns a string.
pub fn return_str(s: &str) -> Result<*const c_char> {
    let c = CString::new(s).map_err(|_| Error::value("string contains a NUL byte"))?;
    Ok(RET_STR.with(|slot| {
        *slot.borrow_mut() = c;
        slot.borrow().as_ptr()
    }))
}

/// A required C string argument.
///
/// # Safety
/// `p` must be NULL or point to a NUL-terminated string that outlives `'a`.
pub unsafe fn cstr<'a>(p: *const c_char, what: &str) -> Result<&'a str> {
    if p.is_null() {
        return Err(Error::value(format!("{what} must not be NULL")));
    }
    // SAFETY: non-null and NUL-terminated per the caller's contract.
    unsafe { CStr::from_ptr(p) }.to_str().map_err(|_| Error::value(format!("{what} is not valid UTF-8")))
}

/// An optional C string argument (NULL → `None`).
///
/// # Safety
/// As [`cstr`].
#[inline]
pub unsafe fn opt_cstr<'a>(p: *const c_char, what: &str) -> Result<Option<&'a str>> {
    if p.is_null() {
        Ok(None)
    } else {
        // SAFETY: forwarded contract.
        unsafe { cstr(p, what) }.map(Some)
    }
}

/// `n` values at `p`, an array received from C (NULL allowed when `n` is 0; a negative
/// count is an error).
///
/// # Safety
/// `p` must point to `n` readable values when `n > 0`, valid for `'a`.
pub unsafe fn list<'a, T, N>(p: *const T, n: N, what: &str) -> Result<&'a [T]>
where
    N: TryInto<usize> + Copy + std::fmt::Display,
{
    let len: usize = n.try_into().map_err(|_| Error::value(format!("{what}: count {n} is not a valid size")))?;
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Error::value(format!("{what} is NULL but its count is {n}")));
    }
    // SAFETY: per this function's contract.
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

/// A required out-param.
///
/// # Safety
/// `p` must be NULL or valid for writes of `T` for `'a`.
pub unsafe fn out<'a, T>(p: *mut T, what: &str) -> Result<&'a mut T> {
    // SAFETY: validity for writes is the caller's contract; NULL is checked here.
    unsafe { p.as_mut() }.ok_or_else(|| Error::value(format!("{what} must not be NULL")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last() -> String {
        // SAFETY: last_error_ptr always points at a live NUL-terminated buffer.
        unsafe { CStr::from_ptr(last_error_ptr()) }.to_string_lossy().into_owned()
    }

    #[test]
    fn ok_err_and_panic() {
        assert_eq!(call("t", || Ok(())), 0);
        assert_eq!(call("t", || Err(Error::index("out of range"))), -1);
        assert_eq!(last(), "IndexError: out of range");
        assert_eq!(call("MXTest", || panic!("boom {}", 1)), -1);
        let e = last();
        assert!(e.starts_with("InternalError: panic in MXTest: boom 1 (at crates/c-api/src/ffi.rs:"), "{e}");
        // A later success leaves the last error as it was.
        assert_eq!(call("t", || Ok(())), 0);
        assert!(last().starts_with("InternalError"));
    }

    /// A call that fails in a thread-local destructor, after this thread's error slot is gone,
    /// still leaves its text for MXGetLastError.
    #[test]
    fn an_error_during_thread_teardown_keeps_its_text() {
        struct FailOnDrop(std::sync::mpsc::Sender<(bool, i32, String)>);
        impl Drop for FailOnDrop {
            fn drop(&mut self) {
                let slot_gone = LAST_ERROR.try_with(|_| ()).is_err();
                let rc = call("MXTeardown", || Err(Error::value("failed in teardown")));
                let _ = self.0.send((slot_gone, rc, last()));
            }
        }
        thread_local! {
            static GUARD: RefCell<Option<FailOnDrop>> = const { RefCell::new(None) };
        }
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // Registered before the error slot, so destroyed after it.
            GUARD.with(|g| *g.borrow_mut() = Some(FailOnDrop(tx)));
            call("t", || Err(Error::value("first")));
        })
        .join()
        .unwrap();
        let (slot_gone, rc, text) = rx.recv().unwrap();
        assert!(slot_gone, "the error slot outlived the guard: this test did not exercise teardown");
        assert_eq!((rc, text.as_str()), (-1, "ValueError: failed in teardown"));
    }

    #[test]
    fn errors_are_per_thread() {
        call("t", || Err(Error::value("main thread")));
        std::thread::spawn(|| {
            call("t", || Err(Error::type_error("other thread")));
            assert_eq!(last(), "TypeError: other thread");
        })
        .join()
        .unwrap();
        assert_eq!(last(), "ValueError: main thread");
    }

    #[test]
    fn pointer_checks() {
        // SAFETY: NULL and a static C string are valid inputs.
        unsafe {
            assert!(cstr(std::ptr::null(), "name").unwrap_err().to_string().contains("name must not be NULL"));
            assert_eq!(cstr(c"abc".as_ptr(), "name").unwrap(), "abc");
            assert_eq!(opt_cstr(std::ptr::null(), "v").unwrap(), None);
            assert!(cstr(c"\xff".as_ptr(), "n").unwrap_err().to_string().contains("UTF-8"));
            assert!(out::<i32>(std::ptr::null_mut(), "out").is_err());
        }
    }
}
