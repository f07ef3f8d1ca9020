//! The C++ data iterators of stock 1.9.1 that `mx.io` wraps: `MNISTIter` and `CSVIter` here,
//! the image iterators in [`super::image_iter`] and [`super::image_det_iter`].
//!
//! Owns: [`DataIter`] (reset, next batch), [`IterDef`] (an iterator's name, documentation and
//! parameter table, served through `MXDataIterGetIterInfo`) and the iterators. Parameters are
//! parsed like operator parameters, except that unknown keys are ignored, as stock's
//! `InitAllowUnknown` does (the frontend passes `data_name`/`label_name` through). Each batch is
//! a new pair of arrays (stock hands out its prefetch buffers, which later batches overwrite).
//! Semantics follow stock's: `MNISTIter` scales pixels by 1/256, shuffles once when created and
//! drops the last partial batch; `CSVIter` is stock's batch loader over CSV rows (`round_batch`
//! wraps around to fill the last batch and the next epoch then starts where it stopped;
//! otherwise the last batch is padded with the previous batch's rows). Both read on the
//! calling thread: `prefetch_buffer` and `ctx` are accepted and have no effect.

use crate::error::{Error, Result};
use crate::ndarray::{DType, NDArray};
use crate::op::param::{op_params, Attrs, ParamSpec};
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;

/// One batch: data, label, the number of padding instances at its end, and each instance's
/// index in its file.
pub struct Batch {
    pub data: NDArray,
    pub label: NDArray,
    pub pad: usize,
    pub index: Vec<u64>,
}

/// A created iterator.
pub trait DataIter: Send {
    /// Start the next epoch.
    fn before_first(&mut self) -> Result<()>;
    /// The next batch; `None` at the end of the epoch.
    fn next(&mut self) -> Result<Option<Batch>>;
    /// The process whose threads the iterator works with, for one that starts threads: a
    /// child forked from it cannot use the iterator (its copy has no threads) and must be told
    /// so before it waits on one of the iterator's locks, which a parent's thread may have
    /// held at the fork.
    fn owner_process(&self) -> Option<u32> {
        None
    }
}

/// An iterator type: what `MXListDataIters` lists.
pub struct IterDef {
    pub name: &'static str,
    pub doc: &'static str,
    /// The table's static itself, read when used: a copy of its value taken in a static
    /// initializer may point at another copy of the promoted array, and parameters are
    /// checked against their table by address.
    pub params: &'static &'static [ParamSpec],
    create: fn(&Attrs) -> Result<Box<dyn DataIter>>,
}

impl IterDef {
    /// Create one from the frontend's string parameters.
    pub fn create<'a>(&self, kv: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<Box<dyn DataIter>> {
        (self.create)(&Attrs::parse_open(self.name, self.params, kv)?)
    }
}

/// The iterators this library implements.
pub fn iterators() -> &'static [IterDef] {
    &ITERATORS
}

/// The iterator named `name`, if implemented.
pub fn find(name: &str) -> Option<&'static IterDef> {
    ITERATORS.iter().find(|d| d.name == name)
}

static ITERATORS: [IterDef; 8] = {
    use super::image_det_iter::{self as det, DET_PARAMS};
    use super::image_iter::{self as img, REC_PARAMS};
    [
        IterDef { name: "MNISTIter", doc: MNIST_DOC, params: &MNIST_PARAMS, create: Mnist::create },
        IterDef { name: "CSVIter", doc: CSV_DOC, params: &CSV_PARAMS, create: Csv::create },
        IterDef { name: "ImageRecordIter", doc: img::RECORD_ITER_DOC, params: &REC_PARAMS, create: img::create_f32 },
        IterDef { name: "ImageRecordIter_v1", doc: img::RECORD_ITER_DOC, params: &REC_PARAMS, create: img::create_f32 },
        IterDef { name: "ImageRecordUInt8Iter", doc: img::UINT8_ITER_DOC, params: &REC_PARAMS, create: img::create_u8 },
        IterDef {
            name: "ImageRecordUInt8Iter_v1",
            doc: img::UINT8_ITER_DOC,
            params: &REC_PARAMS,
            create: img::create_u8,
        },
        IterDef { name: "ImageRecordInt8Iter", doc: img::INT8_ITER_DOC, params: &REC_PARAMS, create: img::create_i8 },
        IterDef { name: "ImageDetRecordIter", doc: det::DET_ITER_DOC, params: &DET_PARAMS, create: det::create },
    ]
};

const PREFETCH_DOC: &str =
    "Maximum number of batches to prefetch (accepted; this library reads on the calling thread).";
const CTX_DOC: &str = "Context data loader optimized for (accepted; batches are on the CPU).";
const DTYPE_DOC: &str = "Output data type. ``None`` means no change.";

/// A CPU array of `shape` holding `bytes` (of `dtype` elements).
fn host_array(shape: Vec<usize>, dtype: DType, bytes: &[u8]) -> Result<NDArray> {
    NDArray::from_host_bytes(shape, dtype, bytes)
}

pub(super) fn positive(op: &str, name: &str, v: i64) -> Result<usize> {
    usize::try_from(v)
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| Error::value(format!("{op}: {name} must be positive, got {v}")))
}

fn check_dtype(op: &str, asked: Option<DType>, produced: DType) -> Result<()> {
    match asked {
        Some(d) if d != produced => Err(Error::not_supported(format!(
            "{op} with dtype={} (it produces {}; stock fails on a different dtype too)",
            d.name(),
            produced.name()
        ))),
        _ => Ok(()),
    }
}

// ---- MNISTIter ----

const MNIST_DOC: &str =
    "Iterating on the MNIST dataset.\n\nOne can download the dataset from http://yann.lecun.com/exdb/mnist/\n";

op_params! {
    /// `MNISTIter`'s parameters (stock's MNISTParam and PrefetcherParam).
    struct MnistParams<'a> => MNIST_PARAMS {
        image: &'a str = "./train-images-idx3-ubyte", "Dataset Param: Mnist image path.";
        label: &'a str = "./train-labels-idx1-ubyte", "Dataset Param: Mnist label path.";
        batch_size: i64 = "128", "Batch Param: Batch Size.";
        shuffle: bool = "True", "Augmentation Param: Whether to shuffle data.";
        flat: bool = "False", "Augmentation Param: Whether to flat the data into 1D.";
        seed: i64 = "0", "Augmentation Param: Random Seed.";
        silent: bool = "False", "Auxiliary Param: Whether to print out data info.";
        num_parts: i64 = "1", "partition the data into multiple parts";
        part_index: i64 = "0", "the index of the part will read";
        prefetch_buffer: i64 = "4", PREFETCH_DOC;
        ctx: &'a str = "gpu" in ["cpu", "gpu"], CTX_DOC;
        dtype: Option<DType> = "None", DTYPE_DOC;
    }
}

struct Mnist {
    /// Pixels scaled to [0, 1), one image after the other.
    images: Vec<f32>,
    labels: Vec<f32>,
    rows: usize,
    cols: usize,
    batch: usize,
    flat: bool,
    loc: usize,
}

/// An idx file (MNIST's format): its dimensions and its bytes.
fn read_idx(path: &str, magic: u32, dims: usize) -> Result<(Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(path).map_err(|e| Error::mxnet(format!("MNISTIter: cannot read {path}: {e}")))?;
    let word = |i: usize| bytes.get(4 * i..4 * i + 4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize);
    if word(0) != Some(magic as usize) {
        return Err(Error::mxnet(format!(
            "MNISTIter: {path} is not an MNIST idx file (magic number {magic:#x} expected)"
        )));
    }
    let shape: Vec<usize> = (1..=dims)
        .map(word)
        .collect::<Option<_>>()
        .ok_or_else(|| Error::mxnet(format!("MNISTIter: {path} ends inside its header")))?;
    let start = 4 * (dims + 1);
    let body = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    let Some(body) = body.filter(|&b| bytes.len() - start >= b) else {
        return Err(Error::mxnet(format!(
            "MNISTIter: {path} is truncated: its header announces {shape:?} bytes of data, it has {}",
            bytes.len() - start
        )));
    };
    Ok((shape, bytes[start..start + body].to_vec()))
}

impl Mnist {
    fn create(a: &Attrs) -> Result<Box<dyn DataIter>> {
        let p = MnistParams::of(a);
        check_dtype(a.op, p.dtype, DType::F32)?;
        let batch = positive(a.op, "batch_size", p.batch_size)?;
        let (parts, part) = (positive(a.op, "num_parts", p.num_parts)?, p.part_index);
        let part = usize::try_from(part)
            .ok()
            .filter(|&q| q < parts)
            .ok_or_else(|| Error::value(format!("MNISTIter: part_index {part} is not in [0, num_parts={parts})")))?;
        let (ishape, pixels) = read_idx(p.image, 0x803, 3)?;
        let (lshape, labels) = read_idx(p.label, 0x801, 1)?;
        if ishape[0] != lshape[0] {
            return Err(Error::mxnet(format!(
                "MNISTIter: {} holds {} images but {} holds {} labels",
                p.image, ishape[0], p.label, lshape[0]
            )));
        }
        // Stock's partition: [count / parts × part, count / parts × (part + 1)), in doubles.
        let bound = |p: usize| (ishape[0] as f64 / parts as f64 * p as f64) as usize;
        let (start, end) = (bound(part), bound(part + 1));
        let (rows, cols) = (ishape[1], ishape[2]);
        let unit = rows * cols;
        let mut order: Vec<usize> = (start..end).collect();
        if p.shuffle {
            shuffle(&mut order, p.seed as u64);
        }
        let mut images = Vec::with_capacity(order.len() * unit);
        for &i in &order {
            images.extend(pixels[i * unit..(i + 1) * unit].iter().map(|&p| p as f32 * (1.0 / 256.0)));
        }
        let labels: Vec<f32> = order.iter().map(|&i| labels[i] as f32).collect();
        if !p.silent {
            let shape = if p.flat { format!("({batch},{unit})") } else { format!("({batch},1,{rows},{cols})") };
            eprintln!("MNISTIter: load {} images, shuffle={}, shape={shape}", order.len(), u8::from(p.shuffle));
        }
        Ok(Box::new(Mnist { images, labels, rows, cols, batch, flat: p.flat, loc: 0 }))
    }
}

/// Fisher-Yates with SplitMix64 (stock uses `std::shuffle` with `std::mt19937`, whose order
/// this does not reproduce).
fn shuffle(v: &mut [usize], seed: u64) {
    crate::op::random::SplitMix64(seed ^ 0x9e37_79b9_7f4a_7c15).shuffle(v);
}

pub(super) fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

impl DataIter for Mnist {
    fn before_first(&mut self) -> Result<()> {
        self.loc = 0;
        Ok(())
    }

    fn next(&mut self) -> Result<Option<Batch>> {
        if self.loc + self.batch > self.labels.len() {
            return Ok(None);
        }
        let unit = self.rows * self.cols;
        let (lo, hi) = (self.loc, self.loc + self.batch);
        let shape = if self.flat { vec![self.batch, unit] } else { vec![self.batch, 1, self.rows, self.cols] };
        let data = host_array(shape, DType::F32, &f32_bytes(&self.images[lo * unit..hi * unit]))?;
        let label = host_array(vec![self.batch], DType::F32, &f32_bytes(&self.labels[lo..hi]))?;
        self.loc = hi;
        Ok(Some(Batch { data, label, pad: 0, index: vec![0; self.batch] }))
    }
}

// ---- CSVIter ----

const CSV_DOC: &str = "Returns the CSV file iterator.\n\nIn this function, the `data_shape` parameter is used to set the shape of each line of the input data.\nIf a row in an input file is `1,2,3,4,5,6`` and `data_shape` is (3,2), that row\nwill be reshaped, yielding the array [[1,2],[3,4],[5,6]] of shape (3,2).\n\nBy default, the `CSVIter` has `round_batch` parameter set to ``True``. So, if `batch_size`\nis 3 and there are 4 total rows in CSV file, 2 more examples\nare consumed at the first round. If `reset` function is called after first round,\nthe call is ignored and remaining examples are returned in the second round.\n\nIf one wants all the instances in the second round after calling `reset`, make sure\nto set `round_batch` to False.\n\nIf ``data_csv = 'data/'`` is set, then all the files in this directory will be read.\n\n``reset()`` is expected to be called only after a complete pass of data.\n\nBy default, the CSVIter parses all entries in the data file as float32 data type,\nif `dtype` argument is set to be 'int32' or 'int64' then CSVIter will parse all entries in the file\nas int32 or int64 data type accordingly.\n";

op_params! {
    /// `CSVIter`'s parameters (stock's CSVIterParam, BatchParam and PrefetcherParam).
    struct CsvParams<'a> => CSV_PARAMS {
        data_csv: &'a str = required, "The input CSV file or a directory path.";
        data_shape: &'a [i64] = required, "The shape of one example.";
        label_csv: &'a str = "NULL", "The input CSV file or a directory path. If NULL, all labels will be returned as 0.";
        label_shape: &'a [i64] = "(1,)", "The shape of one label.";
        batch_size: i64 = required, "Batch size.";
        round_batch: bool = "True", "Whether to use round robin to handle overflow batch or not.";
        prefetch_buffer: i64 = "4", PREFETCH_DOC;
        ctx: &'a str = "gpu" in ["cpu", "gpu"], CTX_DOC;
        dtype: Option<DType> = "None", DTYPE_DOC;
    }
}

/// The rows of a CSV file, or of every file of a directory (in name order), parsed as
/// `dtype` values.
struct CsvRows {
    files: Vec<PathBuf>,
    dtype: DType,
    file: usize,
    reader: Option<BufReader<File>>,
    line: usize,
    text: String,
}

impl CsvRows {
    fn open(path: &str, dtype: DType) -> Result<CsvRows> {
        let meta = std::fs::metadata(path).map_err(|e| Error::mxnet(format!("CSVIter: cannot open {path}: {e}")))?;
        let files = if meta.is_dir() {
            let mut f: Vec<PathBuf> = std::fs::read_dir(path)
                .and_then(|d| d.map(|e| e.map(|e| e.path())).collect())
                .map_err(|e| Error::mxnet(format!("CSVIter: cannot list {path}: {e}")))?;
            f.retain(|p| p.is_file());
            f.sort();
            f
        } else {
            vec![PathBuf::from(path)]
        };
        Ok(CsvRows { files, dtype, file: 0, reader: None, line: 0, text: String::new() })
    }

    fn rewind(&mut self) {
        (self.file, self.reader, self.line) = (0, None, 0);
    }

    /// Append the next non-empty row's values (as bytes of the dtype) to `out`; returns how
    /// many values, or `None` after the last row.
    fn next_row(&mut self, out: &mut Vec<u8>) -> Result<Option<usize>> {
        loop {
            if self.reader.is_none() {
                let Some(p) = self.files.get(self.file) else { return Ok(None) };
                let f =
                    File::open(p).map_err(|e| Error::mxnet(format!("CSVIter: cannot open {}: {e}", p.display())))?;
                (self.reader, self.line) = (Some(BufReader::new(f)), 0);
            }
            let reader = self.reader.as_mut().expect("opened above");
            self.text.clear();
            let n = reader
                .read_line(&mut self.text)
                .map_err(|e| Error::mxnet(format!("CSVIter: cannot read {}: {e}", self.files[self.file].display())))?;
            if n == 0 {
                (self.reader, self.file) = (None, self.file + 1);
                continue;
            }
            self.line += 1;
            let row = self.text.trim();
            if row.is_empty() {
                continue;
            }
            let mut count = 0;
            for field in row.split(',') {
                let f = field.trim();
                let bad = || {
                    Error::mxnet(format!(
                        "CSVIter: '{f}' in line {} of {} is not a {} value",
                        self.line,
                        self.files[self.file].display(),
                        self.dtype.name()
                    ))
                };
                match self.dtype {
                    DType::I32 => out.extend(f.parse::<i32>().map_err(|_| bad())?.to_ne_bytes()),
                    DType::I64 => out.extend(f.parse::<i64>().map_err(|_| bad())?.to_ne_bytes()),
                    _ => out.extend(f.parse::<f32>().map_err(|_| bad())?.to_ne_bytes()),
                }
                count += 1;
            }
            return Ok(Some(count));
        }
    }

    fn place(&self) -> String {
        match self.files.get(self.file) {
            Some(p) => format!("line {} of {}", self.line, p.display()),
            None => "the end of the files".into(),
        }
    }
}

struct Csv {
    data: CsvRows,
    label: Option<CsvRows>,
    dtype: DType,
    data_shape: Vec<usize>,
    label_shape: Vec<usize>,
    batch: usize,
    round_batch: bool,
    /// The next instance's index (stock's per-epoch counter).
    counter: u64,
    /// Instances taken from the next epoch to fill the last batch (round_batch).
    overflow: usize,
    /// The batch buffers, reused: rows a short batch does not fill keep the last batch's.
    data_buf: Vec<u8>,
    label_buf: Vec<u8>,
    last_index: Vec<u64>,
    row: Vec<u8>,
}

impl Csv {
    fn create(a: &Attrs) -> Result<Box<dyn DataIter>> {
        let p = CsvParams::of(a);
        let dtype = match p.dtype {
            None | Some(DType::F32) => DType::F32,
            Some(d @ (DType::I32 | DType::I64)) => d,
            Some(d) => {
                return Err(Error::value(format!(
                    "CSVIter: dtype {} is not supported (float32, int32 or int64)",
                    d.name()
                )))
            }
        };
        let shape = |name: &str, s: &[i64]| -> Result<Vec<usize>> {
            s.iter()
                .map(|&d| usize::try_from(d).ok().filter(|&d| d > 0))
                .collect::<Option<Vec<_>>>()
                .filter(|v| !v.is_empty())
                .ok_or_else(|| Error::value(format!("CSVIter: {name} {s:?} must have positive sizes")))
        };
        let (data_shape, label_shape) = (shape("data_shape", p.data_shape)?, shape("label_shape", p.label_shape)?);
        let batch = positive(a.op, "batch_size", p.batch_size)?;
        let data = CsvRows::open(p.data_csv, dtype)?;
        let label = match p.label_csv {
            "NULL" => None,
            path => Some(CsvRows::open(path, dtype)?),
        };
        let bytes = |s: &[usize]| s.iter().product::<usize>() * dtype.size() * batch;
        Ok(Box::new(Csv {
            data,
            label,
            dtype,
            data_buf: vec![0; bytes(&data_shape)],
            label_buf: vec![0; bytes(&label_shape)],
            last_index: vec![0; batch],
            data_shape,
            label_shape,
            batch,
            round_batch: p.round_batch,
            counter: 0,
            overflow: 0,
            row: Vec::new(),
        }))
    }

    fn rewind(&mut self) {
        self.data.rewind();
        if let Some(l) = &mut self.label {
            l.rewind();
        }
        self.counter = 0;
    }

    /// Read one instance into row `slot` of the batch buffers; returns its index, or `None`
    /// at the end of the data.
    fn read_instance(&mut self, slot: usize) -> Result<Option<u64>> {
        let esize = self.dtype.size();
        let unit: usize = self.data_shape.iter().product();
        self.row.clear();
        let Some(n) = self.data.next_row(&mut self.row)? else { return Ok(None) };
        if n != unit {
            return Err(Error::mxnet(format!(
                "CSVIter: {} has {n} values; data_shape {:?} needs {unit}",
                self.data.place(),
                self.data_shape
            )));
        }
        self.data_buf[slot * unit * esize..(slot + 1) * unit * esize].copy_from_slice(&self.row);
        let lunit: usize = self.label_shape.iter().product();
        let dst = &mut self.label_buf[slot * lunit * esize..(slot + 1) * lunit * esize];
        match &mut self.label {
            None => dst.fill(0),
            Some(l) => {
                self.row.clear();
                match l.next_row(&mut self.row)? {
                    None => return Err(Error::mxnet("CSVIter: label_csv has fewer rows than data_csv")),
                    Some(m) if m != lunit => {
                        return Err(Error::mxnet(format!(
                            "CSVIter: {} has {m} values; label_shape {:?} needs {lunit}",
                            l.place(),
                            self.label_shape
                        )))
                    }
                    Some(_) => dst.copy_from_slice(&self.row),
                }
            }
        }
        self.counter += 1;
        Ok(Some(self.counter - 1))
    }
}

impl DataIter for Csv {
    fn before_first(&mut self) -> Result<()> {
        if !self.round_batch || self.overflow == 0 {
            self.rewind();
        } else {
            self.overflow = 0;
        }
        Ok(())
    }

    fn next(&mut self) -> Result<Option<Batch>> {
        if self.overflow != 0 {
            return Ok(None);
        }
        let mut index = Vec::with_capacity(self.batch);
        while index.len() < self.batch {
            match self.read_instance(index.len())? {
                Some(i) => index.push(i),
                None => break,
            }
        }
        if index.is_empty() {
            return Ok(None);
        }
        let mut pad = 0;
        if index.len() < self.batch {
            if self.round_batch {
                self.rewind();
                while index.len() < self.batch {
                    let i = self.read_instance(index.len())?.ok_or_else(|| {
                        Error::mxnet(format!("CSVIter: the data has fewer rows than batch_size {}", self.batch))
                    })?;
                    index.push(i);
                    self.overflow += 1;
                }
                pad = self.overflow;
            } else {
                // As the rows, the indices of the padding are the last batch's.
                pad = self.batch - index.len();
                index.extend_from_slice(&self.last_index[index.len()..]);
            }
        }
        let mut dshape = vec![self.batch];
        dshape.extend(&self.data_shape);
        // Stock's GetLabel makes a (batch, 1) label one-dimensional.
        let mut lshape = vec![self.batch];
        if self.label_shape != [1] {
            lshape.extend(&self.label_shape);
        }
        self.last_index.clone_from(&index);
        let data = host_array(dshape, self.dtype, &self.data_buf)?;
        let label = host_array(lshape, self.dtype, &self.label_buf)?;
        Ok(Some(Batch { data, label, pad, index }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ndarray::testing;

    fn tmp(name: &str) -> String {
        std::env::temp_dir().join(format!("mxrt-iter-{}-{name}", std::process::id())).to_str().unwrap().to_string()
    }

    fn labels(b: &Batch) -> Vec<f32> {
        testing::values(&b.label)
    }

    #[test]
    fn csv_round_batch_wraps_and_the_next_epoch_goes_on_from_there() {
        let path = tmp("d.csv");
        std::fs::write(&path, "1,2\n3,4\n\n5,6\n7,8\n").unwrap();
        let lpath = tmp("l.csv");
        std::fs::write(&lpath, "10\n20\n30\n40\n").unwrap();
        let def = find("CSVIter").unwrap();
        let kv = [
            ("data_csv", path.as_str()),
            ("data_shape", "(2,)"),
            ("label_csv", lpath.as_str()),
            ("batch_size", "3"),
            ("data_name", "x"),
        ];
        let mut it = def.create(kv).unwrap();
        let b = it.next().unwrap().unwrap();
        assert_eq!(
            (b.data.shape.clone(), labels(&b), b.pad, b.index.clone()),
            (vec![3, 2], vec![10., 20., 30.], 0, vec![0, 1, 2])
        );
        let b = it.next().unwrap().unwrap();
        assert_eq!(
            (testing::values(&b.data), b.pad, b.index.clone()),
            (vec![7., 8., 1., 2., 3., 4.], 2, vec![3, 0, 1])
        );
        assert!(it.next().unwrap().is_none());
        it.before_first().unwrap();
        let b = it.next().unwrap().unwrap();
        assert_eq!((labels(&b), b.index.clone()), (vec![30., 40., 10.], vec![2, 3, 0]));

        // Without round_batch: the short batch keeps the previous batch's rows as padding.
        let kv = [("data_csv", path.as_str()), ("data_shape", "(2,)"), ("batch_size", "3"), ("round_batch", "False")];
        let mut it = def.create(kv).unwrap();
        it.next().unwrap().unwrap();
        let b = it.next().unwrap().unwrap();
        assert_eq!((testing::values(&b.data), b.pad, labels(&b)), (vec![7., 8., 3., 4., 5., 6.], 2, vec![0., 0., 0.]));

        // Bad rows and shapes are errors naming the place.
        std::fs::write(&path, "1,2\n3,x\n").unwrap();
        let kv = [("data_csv", path.as_str()), ("data_shape", "(2,)"), ("batch_size", "2")];
        let e = def.create(kv).unwrap().next().err().unwrap().to_string();
        assert!(e.contains("'x' in line 2") && e.contains("float32"), "{e}");
        let kv = [("data_csv", path.as_str()), ("data_shape", "(3,)"), ("batch_size", "2")];
        assert!(def.create(kv).unwrap().next().err().unwrap().to_string().contains("data_shape [3] needs 3"));
        assert!(def.create([("data_csv", "/nonexistent.csv"), ("data_shape", "(3,)"), ("batch_size", "2")]).is_err());
        std::fs::remove_file(&path).unwrap();
        std::fs::remove_file(&lpath).unwrap();
    }

    #[test]
    fn mnist_reads_idx_files_in_parts() {
        let (img, lab) = (tmp("i-idx3"), tmp("l-idx1"));
        let mut bytes = vec![0, 0, 8, 3, 0, 0, 0, 5, 0, 0, 0, 2, 0, 0, 0, 2];
        bytes.extend((0..20).map(|i| i as u8 * 10));
        std::fs::write(&img, &bytes).unwrap();
        std::fs::write(&lab, [0, 0, 8, 1, 0, 0, 0, 5, 9, 8, 7, 6, 5]).unwrap();
        let def = find("MNISTIter").unwrap();
        let kv = |extra: &[(&'static str, &'static str)]| {
            let mut v =
                vec![("image", img.clone()), ("label", lab.clone()), ("shuffle", "0".into()), ("silent", "1".into())];
            v.extend(extra.iter().map(|(k, x)| (*k, x.to_string())));
            v
        };
        let args = kv(&[("batch_size", "2")]);
        let mut it = def.create(args.iter().map(|(k, v)| (*k, v.as_str()))).unwrap();
        let b = it.next().unwrap().unwrap();
        assert_eq!(b.data.shape, [2, 1, 2, 2]);
        assert_eq!(testing::values(&b.data)[..5], [0.0, 10. / 256., 20. / 256., 30. / 256., 40. / 256.]);
        assert_eq!(labels(&b), [9., 8.]);
        it.next().unwrap().unwrap();
        assert!(it.next().unwrap().is_none(), "the last partial batch is dropped");
        let args = kv(&[("batch_size", "1"), ("num_parts", "2"), ("part_index", "1"), ("flat", "1")]);
        let mut it = def.create(args.iter().map(|(k, v)| (*k, v.as_str()))).unwrap();
        let b = it.next().unwrap().unwrap();
        assert_eq!((b.data.shape.clone(), labels(&b)), (vec![1, 4], vec![7.]));
        std::fs::write(&lab, [0, 0, 8, 1, 0, 0, 0, 4, 9, 8, 7, 6]).unwrap();
        let e = def.create(args.iter().map(|(k, v)| (*k, v.as_str()))).err().unwrap().to_string();
        assert!(e.contains("holds 5 images but") && e.contains("holds 4 labels"), "{e}");
        std::fs::write(&lab, [0, 0, 8, 1, 0, 0, 0, 9, 9]).unwrap();
        assert!(def
            .create(args.iter().map(|(k, v)| (*k, v.as_str())))
            .err()
            .unwrap()
            .to_string()
            .contains("truncated"));
        std::fs::remove_file(&img).unwrap();
        std::fs::remove_file(&lab).unwrap();
    }
}
