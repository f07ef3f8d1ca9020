//! C API: RecordIO files (`mx.recordio.MXRecordIO` and `MXIndexedRecordIO`).
//!
//! Owns: the RecordIO handle table. A handle is a writer or a reader of one file; the format
//! is `mxnet_core::data::recordio`'s. A reader's last record stays valid until the next read
//! on the handle or its free. A writer's buffered records reach the file at the latest when
//! it is freed, and a failure there is reported by the free; a writer freed in a process
//! forked from the one that created it drops its buffer instead of writing it a second time.

use super::ffi::{self, cstr, out};
use super::types::RecordIOHandle;
use crate::handle::HandleTable;
use mxnet_core::data::recordio::{RecordReader, RecordWriter};
use mxnet_core::error::{Error, Result};
use mxnet_core::sync::Mutex;
use std::ffi::{c_char, c_int};
use std::sync::{Arc, OnceLock};

enum RecordFile {
    /// `None` once closed by a failed write.
    Writer {
        file: Mutex<Option<RecordWriter>>,
        pid: u32,
    },
    Reader {
        file: Mutex<RecordReader>,
        record: Mutex<Vec<u8>>,
    },
}

fn files() -> &'static HandleTable<RecordFile> {
    static T: OnceLock<HandleTable<RecordFile>> = OnceLock::new();
    T.get_or_init(|| HandleTable::new(16, "RecordIO"))
}

// File I/O runs on a clone of the handle's value, not under the handle table's slot lock.
fn with_writer<R>(h: RecordIOHandle, f: impl FnOnce(&mut RecordWriter) -> Result<R>) -> Result<R> {
    match &*files().get(h)? {
        RecordFile::Writer { file, .. } => match file.lock().as_mut() {
            Some(w) => f(w),
            None => Err(Error::value("the RecordIO writer is closed")),
        },
        RecordFile::Reader { .. } => Err(Error::value("a RecordIO reader handle where a writer's is expected")),
    }
}

fn with_reader<R>(h: RecordIOHandle, f: impl FnOnce(&mut RecordReader, &mut Vec<u8>) -> Result<R>) -> Result<R> {
    match &*files().get(h)? {
        RecordFile::Reader { file, record } => f(&mut file.lock(), &mut record.lock()),
        RecordFile::Writer { .. } => Err(Error::value("a RecordIO writer handle where a reader's is expected")),
    }
}

/// Create (truncate) the RecordIO file `uri` (a local path or `file://`) for writing.
///
/// # Safety
/// `uri` must be a NUL-terminated string; `out` NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXRecordIOWriterCreate(uri: *const c_char, out: *mut RecordIOHandle) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        ffi::call_out("MXRecordIOWriterCreate", out, "out", || {
            let w = RecordWriter::create(cstr(uri, "uri")?)?;
            let file = RecordFile::Writer { file: Mutex::new(Some(w)), pid: std::process::id() };
            Ok(files().insert(Arc::new(file)))
        })
    }
}

/// Write what is buffered and close the file; an error means records were lost. NULL does
/// nothing.
#[no_mangle]
pub extern "C" fn MXRecordIOWriterFree(handle: RecordIOHandle) -> c_int {
    ffi::call("MXRecordIOWriterFree", || {
        if handle.is_null() {
            return Ok(());
        }
        if let RecordFile::Reader { .. } = &*files().get(handle)? {
            return Err(Error::value("a RecordIO reader handle where a writer's is expected"));
        }
        match &*files().remove(handle)? {
            RecordFile::Writer { file, pid } => match file.lock().take() {
                Some(w) if *pid == std::process::id() => w.close(),
                Some(w) => {
                    w.abandon();
                    Ok(())
                }
                None => Ok(()),
            },
            RecordFile::Reader { .. } => Ok(()),
        }
    })
}

/// Append one record of `size` bytes.
///
/// # Safety
/// `buf` must point to `size` readable bytes (NULL allowed when `size` is 0).
#[no_mangle]
pub unsafe extern "C" fn MXRecordIOWriterWriteRecord(handle: RecordIOHandle, buf: *const c_char, size: usize) -> c_int {
    ffi::call("MXRecordIOWriterWriteRecord", || {
        // SAFETY: per this function's contract.
        let data = unsafe { ffi::list(buf.cast::<u8>(), size, "buf")? };
        with_writer(handle, |w| w.write_record(data))
    })
}

/// The number of bytes written so far: where the next record starts.
///
/// # Safety
/// `pos` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXRecordIOWriterTell(handle: RecordIOHandle, pos: *mut usize) -> c_int {
    ffi::call("MXRecordIOWriterTell", || {
        // SAFETY: per this function's contract.
        let pos = unsafe { out(pos, "pos")? };
        *pos = with_writer(handle, |w| Ok(w.tell()))? as usize;
        Ok(())
    })
}

/// Open the RecordIO file `uri` for reading.
///
/// # Safety
/// `uri` must be a NUL-terminated string; `out` NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXRecordIOReaderCreate(uri: *const c_char, out: *mut RecordIOHandle) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        ffi::call_out("MXRecordIOReaderCreate", out, "out", || {
            let r = RecordReader::open(cstr(uri, "uri")?)?;
            let file = RecordFile::Reader { file: Mutex::new(r), record: Mutex::new(Vec::new()) };
            Ok(files().insert(Arc::new(file)))
        })
    }
}

/// Close a reader. NULL does nothing.
#[no_mangle]
pub extern "C" fn MXRecordIOReaderFree(handle: RecordIOHandle) -> c_int {
    ffi::call("MXRecordIOReaderFree", || {
        if handle.is_null() {
            return Ok(());
        }
        if let RecordFile::Writer { .. } = &*files().get(handle)? {
            return Err(Error::value("a RecordIO writer handle where a reader's is expected"));
        }
        files().remove(handle).map(drop)
    })
}

/// The next record: `*buf` points to its `*size` bytes until the next read on this handle or
/// its free; at the end of the file `*buf` is NULL and `*size` 0. A damaged file is an error
/// naming the byte where the damage is.
///
/// # Safety
/// `buf` and `size` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXRecordIOReaderReadRecord(
    handle: RecordIOHandle,
    buf: *mut *const c_char,
    size: *mut usize,
) -> c_int {
    ffi::call("MXRecordIOReaderReadRecord", || {
        // SAFETY: per this function's contract.
        let (buf, size) = unsafe { (out(buf, "buf")?, out(size, "size")?) };
        let (p, n) = with_reader(handle, |r, record| {
            Ok(if r.read_record(record)? {
                (record.as_ptr().cast::<c_char>(), record.len())
            } else {
                (std::ptr::null(), 0)
            })
        })?;
        (*buf, *size) = (p, n);
        Ok(())
    })
}

/// Continue reading at byte `pos` (a record's start, as the `.idx` file gives it); beyond the
/// end of the file is an error.
#[no_mangle]
pub extern "C" fn MXRecordIOReaderSeek(handle: RecordIOHandle, pos: usize) -> c_int {
    ffi::call("MXRecordIOReaderSeek", || with_reader(handle, |r, _| r.seek(pos as u64)))
}

/// The byte where the next read starts.
///
/// # Safety
/// `pos` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXRecordIOReaderTell(handle: RecordIOHandle, pos: *mut usize) -> c_int {
    ffi::call("MXRecordIOReaderTell", || {
        // SAFETY: per this function's contract.
        let pos = unsafe { out(pos, "pos")? };
        *pos = with_reader(handle, |r, _| Ok(r.tell()))? as usize;
        Ok(())
    })
}
