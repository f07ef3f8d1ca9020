//! MXNet's binary NDArray format: files from `mx.nd.save` and pickled arrays.
//!
//! Owns: reading and writing the format stock MXNet 1.9.1 uses, so files move both ways:
//! a list file is `u64 0x112, u64 0, u64 n, n arrays, u64 m, m names (u64 len + bytes)`; an
//! array is `u32 magic (0xF993FAC9, or 0xF993FACA in numpy-shape mode), i32 storage type,
//! shape (i32 ndim, i64 dims), then unless the array is empty: i32 dev_type, i32 dev_id,
//! i32 dtype, the raw little-endian data`. Older files (magic 0xF993FAC8, or no magic and
//! u32 dims) load too. Arrays saved on a GPU load on the CPU.
//!
//! Hostile input: every length is checked against the bytes that remain before anything is
//! allocated, so a file can never make the loader allocate more than its own size justifies;
//! truncated or corrupt input is an error, never a panic.

use super::MAX_NDIM;
use super::{byte_size, DType, NDArray};
use crate::context::Context;
use crate::error::{Error, Result};

const LIST_MAGIC: u64 = 0x112;
const V1_MAGIC: u32 = 0xF993_FAC8;
const V2_MAGIC: u32 = 0xF993_FAC9;
const V3_MAGIC: u32 = 0xF993_FACA;

/// The shape semantics a file is read in. Stock's rule: arrays saved in numpy-shape mode
/// load only in it; older arrays load in numpy-shape mode only while it is on globally
/// (`npx.set_np()`), not in a thread's scope (`mx.np_shape(True)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Semantics {
    Legacy,
    NumpyThread,
    NumpyGlobal,
}

impl Semantics {
    /// The calling thread's mode ([`super::np_shape::get`]).
    pub fn current() -> Semantics {
        match super::np_shape::get() {
            2 => Semantics::NumpyGlobal,
            1 => Semantics::NumpyThread,
            _ => Semantics::Legacy,
        }
    }
}

fn corrupt(what: impl std::fmt::Display) -> Error {
    Error::mxnet(format!("invalid NDArray file: {what}"))
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(corrupt(format!(
                "truncated: {what} needs {n} bytes at offset {}, {} left",
                self.pos,
                self.remaining()
            )));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().expect("4 bytes")))
    }
    fn i32(&mut self, what: &str) -> Result<i32> {
        Ok(self.u32(what)? as i32)
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().expect("8 bytes")))
    }
    fn i64(&mut self, what: &str) -> Result<i64> {
        Ok(self.u64(what)? as i64)
    }
    /// A count of items each at least `min_item` bytes long, checked against what remains.
    fn count(&mut self, min_item: usize, what: &str) -> Result<usize> {
        let n = self.u64(what)?;
        if n > (self.remaining() / min_item.max(1)) as u64 {
            return Err(corrupt(format!("{what} {n} exceeds what the remaining {} bytes can hold", self.remaining())));
        }
        Ok(n as usize)
    }
}

/// Save arrays (and names, when given) as a list file.
pub fn save_list(arrays: &[NDArray], names: Option<&[String]>, np_shape: bool) -> Result<Vec<u8>> {
    if let Some(n) = names {
        if n.len() != arrays.len() {
            return Err(Error::value(format!("{} names for {} arrays", n.len(), arrays.len())));
        }
    }
    let mut out = Vec::new();
    out.extend_from_slice(&LIST_MAGIC.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
    out.extend_from_slice(&(arrays.len() as u64).to_le_bytes());
    for a in arrays {
        save_array(a, np_shape, &mut out)?;
    }
    let names = names.unwrap_or(&[]);
    out.extend_from_slice(&(names.len() as u64).to_le_bytes());
    for n in names {
        out.extend_from_slice(&(n.len() as u64).to_le_bytes());
        out.extend_from_slice(n.as_bytes());
    }
    Ok(out)
}

/// Append one array in the stock format (waits for its pending writes).
pub fn save_array(a: &NDArray, np_shape: bool, out: &mut Vec<u8>) -> Result<()> {
    out.extend_from_slice(&(if np_shape { V3_MAGIC } else { V2_MAGIC }).to_le_bytes());
    out.extend_from_slice(&0i32.to_le_bytes()); // default (dense) storage
    if a.chunk.is_none() {
        // An empty array: unknown shape (ndim -1), nothing follows.
        out.extend_from_slice(&(-1i32).to_le_bytes());
        return Ok(());
    }
    if !np_shape && a.shape.is_empty() {
        return Err(Error::value(format!(
            "an array of shape {:?} can only be saved in numpy-shape mode (legacy files read \
             ndim 0 as an unknown shape)",
            a.shape
        )));
    }
    out.extend_from_slice(&(a.shape.len() as i32).to_le_bytes());
    for &d in &a.shape {
        out.extend_from_slice(&(d as i64).to_le_bytes());
    }
    let ctx = a.ctx().expect("not empty");
    out.extend_from_slice(&(ctx.dev_type as i32).to_le_bytes());
    out.extend_from_slice(&ctx.dev_id.to_le_bytes());
    out.extend_from_slice(&(a.dtype as i32).to_le_bytes());
    let (_, bytes) = byte_size(&a.shape, a.dtype)?;
    let start = out.len();
    out.resize(start + bytes, 0);
    // SAFETY: the destination holds exactly the array's bytes.
    unsafe { a.copy_to_host(out[start..].as_mut_ptr(), a.size()) }
}

/// The bytes of the list file at `path`, refusing it at its header when it is not one (so
/// `/dev/zero` or a large unrelated file is not read whole into memory first).
pub fn read_list_file(path: &str) -> Result<Vec<u8>> {
    use std::io::Read;
    let cannot = |e: std::io::Error| Error::mxnet(format!("cannot read {path}: {e}"));
    let mut f = std::fs::File::open(path).map_err(cannot)?;
    let mut head = [0u8; 8];
    f.read_exact(&mut head).map_err(|_| corrupt(format!("{path} is shorter than the 8-byte header")))?;
    let magic = u64::from_le_bytes(head);
    if magic != LIST_MAGIC {
        return Err(corrupt(format!("header {magic:#x} of {path} is not an NDArray list (expected 0x112)")));
    }
    let mut buf = head.to_vec();
    f.read_to_end(&mut buf).map_err(cannot)?;
    Ok(buf)
}

/// Load a list file: the arrays and their names (empty for a list).
pub fn load_list(buf: &[u8], sem: Semantics) -> Result<(Vec<NDArray>, Vec<String>)> {
    let mut r = Reader { buf, pos: 0 };
    let magic = r.u64("header")?;
    if magic != LIST_MAGIC {
        return Err(corrupt(format!("header {magic:#x} is not an NDArray list (expected 0x112)")));
    }
    r.u64("reserved field")?;
    // Every array takes at least 12 bytes (magic, storage type, ndim).
    let n = r.count(12, "array count")?;
    let mut arrays = Vec::with_capacity(n);
    for i in 0..n {
        arrays.push(
            load_array_from(&mut r, sem).map_err(|e| Error::new(e.kind(), format!("array {i}: {}", e.message())))?,
        );
    }
    let m = r.count(8, "name count")?;
    if m != 0 && m != n {
        return Err(corrupt(format!("{m} names for {n} arrays")));
    }
    let mut names = Vec::with_capacity(m);
    for _ in 0..m {
        let len = r.count(1, "name length")?;
        let bytes = r.take(len, "name")?;
        names.push(String::from_utf8(bytes.to_vec()).map_err(|_| corrupt("a name is not UTF-8"))?);
    }
    if r.remaining() != 0 {
        return Err(corrupt(format!("{} bytes after the end of the list", r.remaining())));
    }
    Ok((arrays, names))
}

/// Load one array (the pickled form, `MXNDArrayLoadFromRawBytes`).
pub fn load_array(buf: &[u8], sem: Semantics) -> Result<NDArray> {
    let mut r = Reader { buf, pos: 0 };
    load_array_from(&mut r, sem)
}

fn load_array_from(r: &mut Reader, sem: Semantics) -> Result<NDArray> {
    let magic = r.u32("array magic")?;
    if magic == V3_MAGIC && sem == Semantics::Legacy {
        return Err(Error::mxnet(
            "this array was saved in numpy-shape mode; turn numpy shape on \
             (mx.npx.set_np() or MXSetIsNumpyShape) to load it",
        ));
    }
    if magic != V3_MAGIC && sem == Semantics::NumpyThread {
        return Err(Error::mxnet(
            "this array was not saved in numpy-shape mode, and numpy shape is on in this \
             scope: load it with numpy shape off (mx.np_shape(False)), or with it on globally",
        ));
    }
    let shape: Option<Vec<usize>> = match magic {
        V2_MAGIC | V3_MAGIC => {
            let stype = r.i32("storage type")?;
            if stype != 0 {
                return Err(Error::not_supported(format!("loading sparse storage (type {stype})")));
            }
            let ndim = r.i32("ndim")?;
            if ndim < 0 || (ndim == 0 && magic == V2_MAGIC) {
                None // unknown shape: an empty array
            } else {
                Some(read_dims(r, ndim as usize, true)?)
            }
        }
        V1_MAGIC => {
            let ndim = r.i32("ndim")?;
            if ndim <= 0 {
                None
            } else {
                Some(read_dims(r, ndim as usize, true)?)
            }
        }
        // The oldest format: no magic, the first word is ndim and dims are u32.
        ndim => {
            if ndim == 0 {
                None
            } else {
                Some(read_dims(r, ndim as usize, false)?)
            }
        }
    };
    let Some(shape) = shape else {
        return Ok(NDArray::none());
    };
    let dev_type = r.i32("device type")?;
    let dev_id = r.i32("device id")?;
    let ctx = Context::from_codes(dev_type, dev_id).map_err(|e| corrupt(e.message()))?;
    let dtype = DType::from_code(r.i32("dtype")?)?;
    let (n, bytes) = byte_size(&shape, dtype)?;
    let data = r.take(bytes, "array data")?;
    // A GPU array loads on the CPU of this build.
    let target = if ctx.dev_type.is_host() { ctx } else { Context::CPU };
    let a = NDArray::new(shape, target, dtype, false)?;
    // SAFETY: `data` holds exactly `n` elements of `dtype`.
    unsafe { a.copy_from_host(data.as_ptr(), n)? };
    Ok(a)
}

fn read_dims(r: &mut Reader, ndim: usize, wide: bool) -> Result<Vec<usize>> {
    if ndim > MAX_NDIM {
        return Err(corrupt(format!("{ndim} dimensions (at most {MAX_NDIM})")));
    }
    let mut dims = Vec::with_capacity(ndim);
    for _ in 0..ndim {
        let d = if wide { r.i64("dimension")? } else { r.u32("dimension")? as i64 };
        if d < 0 {
            return Err(corrupt(format!("negative dimension {d}")));
        }
        dims.push(usize::try_from(d).map_err(|_| corrupt(format!("dimension {d} is too large")))?);
    }
    Ok(dims)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::ndarray::testing::{array_f32, values};

    /// Bytes of `mx.nd.save('list.nd', [nd.array([[1,2,3],[4,5,6]]), nd.array([7], dtype='int64')])`
    /// written by stock MXNet 1.9.1.
    const STOCK_LIST: &[u8] = include_bytes!("../../../../tests/data/ndarray_corpus/ok_stock_list.nd");

    #[test]
    fn reads_and_writes_the_stock_bytes() {
        let bytes = STOCK_LIST.to_vec();
        let (arrays, names) = load_list(&bytes, Semantics::Legacy).unwrap();
        assert!(names.is_empty());
        assert_eq!(arrays[0].shape, vec![2, 3]);
        assert_eq!(values(&arrays[0]), vec![1., 2., 3., 4., 5., 6.]);
        assert_eq!((arrays[1].shape.clone(), arrays[1].dtype), (vec![1], DType::I64));
        // Writing the same arrays gives the same bytes.
        assert_eq!(save_list(&arrays, None, false).unwrap(), bytes);
    }

    #[test]
    fn names_numpy_mode_and_legacy_formats() {
        let a = array_f32(&[2], &[1.5, -2.0]);
        let names = vec!["weight".to_string(), "bias".to_string()];
        let b = array_f32(&[1, 1], &[9.0]);
        let bytes = save_list(&[a.clone(), b], Some(&names), false).unwrap();
        let (arrays, got) = load_list(&bytes, Semantics::Legacy).unwrap();
        assert_eq!(got, names);
        assert_eq!(values(&arrays[0]), vec![1.5, -2.0]);
        // numpy-shape files: scalars and zero-size arrays; refused without numpy shape.
        let scalar = array_f32(&[], &[4.0]);
        let empty = NDArray::new(vec![0, 3], Context::CPU, DType::F32, false).unwrap();
        let np = save_list(&[scalar, empty], None, true).unwrap();
        assert!(load_list(&np, Semantics::Legacy).unwrap_err().to_string().contains("numpy-shape mode"));
        let (arrays, _) = load_list(&np, Semantics::NumpyThread).unwrap();
        assert_eq!((arrays[0].shape.clone(), values(&arrays[0])), (vec![], vec![4.0]));
        assert_eq!(arrays[1].shape, vec![0, 3]);
        assert!(save_list(&[array_f32(&[], &[1.0])], None, false).is_err());
        // Zero-size arrays keep their shapes in legacy files too (as stock's do), and such
        // files load in numpy-shape mode only while it is on globally.
        let zero = NDArray::new(vec![2, 0, 1], Context::CPU, DType::F32, false).unwrap();
        let legacy = save_list(&[zero], None, false).unwrap();
        assert_eq!(load_list(&legacy, Semantics::Legacy).unwrap().0[0].shape, vec![2, 0, 1]);
        assert_eq!(load_list(&legacy, Semantics::NumpyGlobal).unwrap().0[0].shape, vec![2, 0, 1]);
        let refused = load_list(&legacy, Semantics::NumpyThread).unwrap_err().to_string();
        assert!(refused.contains("not saved in numpy-shape mode"), "{refused}");
        // The oldest format: ndim then u32 dims, context, dtype, data.
        let mut old = Vec::new();
        for w in [2u32, 1, 2, 1, 0, 0] {
            old.extend_from_slice(&w.to_le_bytes());
        }
        old.extend_from_slice(&3.0f32.to_le_bytes());
        old.extend_from_slice(&4.0f32.to_le_bytes());
        let legacy = load_array(&old, Semantics::Legacy).unwrap();
        assert_eq!((legacy.shape.clone(), values(&legacy)), (vec![1, 2], vec![3.0, 4.0]));
        // A GPU array loads on the CPU.
        let mut gpu = bytes.clone();
        let ctx_at = 8 * 3 + 4 + 4 + 4 + 8; // list header, magic, stype, ndim, one dim
        gpu[ctx_at..ctx_at + 4].copy_from_slice(&2i32.to_le_bytes());
        let (arrays, _) = load_list(&gpu, Semantics::Legacy).unwrap();
        assert_eq!(arrays[0].ctx(), Some(Context::CPU));
    }

    #[test]
    fn truncated_and_corrupt_input_is_an_error() {
        let bytes = STOCK_LIST.to_vec();
        for n in 0..bytes.len() {
            assert!(load_list(&bytes[..n], Semantics::Legacy).is_err(), "prefix of {n} bytes loaded");
        }
        let mut huge = bytes.clone();
        huge[16..24].copy_from_slice(&u64::MAX.to_le_bytes()); // array count
        assert!(load_list(&huge, Semantics::Legacy).unwrap_err().to_string().contains("array count"));
        let mut dims = bytes.clone();
        dims[36..44].copy_from_slice(&(1i64 << 40).to_le_bytes()); // first dim
        assert!(load_list(&dims, Semantics::Legacy).unwrap_err().to_string().contains("truncated"));
        let mut neg = bytes.clone();
        neg[36..44].copy_from_slice(&(-5i64).to_le_bytes());
        assert!(load_list(&neg, Semantics::Legacy).unwrap_err().to_string().contains("negative"));
        let mut dtype = bytes.clone();
        dtype[60..64].copy_from_slice(&99i32.to_le_bytes());
        assert!(load_list(&dtype, Semantics::Legacy).unwrap_err().to_string().contains("dtype"));
        let mut sparse = bytes;
        sparse[28..32].copy_from_slice(&1i32.to_le_bytes());
        assert!(load_list(&sparse, Semantics::Legacy).unwrap_err().to_string().starts_with("NotImplementedError"));
    }

    /// Random bytes and random mutations of valid files never panic and never allocate
    /// beyond what the input holds (checked by the loader's length checks).
    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut seed = 0x2545F4914F6CDD1Du64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let valid = STOCK_LIST.to_vec();
        for round in 0..20_000 {
            let mut buf =
                if round % 2 == 0 { valid.clone() } else { (0..(next() % 200)).map(|_| next() as u8).collect() };
            for _ in 0..(next() % 6) {
                if !buf.is_empty() {
                    let i = (next() as usize) % buf.len();
                    buf[i] = next() as u8;
                }
            }
            let sem = [Semantics::Legacy, Semantics::NumpyThread, Semantics::NumpyGlobal][round % 3];
            let _ = load_list(&buf, sem);
            let _ = load_array(&buf, sem);
        }
    }

    /// Inputs that once mattered, kept as regression tests (tests/data/ndarray_corpus).
    #[test]
    fn corpus_inputs_load_or_fail_cleanly() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/ndarray_corpus");
        let mut seen = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let sem = if name.contains("_np_") { Semantics::NumpyThread } else { Semantics::Legacy };
            let result = load_list(&bytes, sem);
            assert_eq!(result.is_ok(), name.starts_with("ok_"), "{name}: {:?}", result.err());
            seen += 1;
        }
        assert!(seen >= 4);
    }
}
