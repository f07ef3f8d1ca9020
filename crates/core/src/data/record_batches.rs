//! What the RecordIO image iterators (`ImageRecordIter` and its typed variants in
//! [`super::image_iter`], `ImageDetRecordIter` in [`super::image_det_iter`]) share: reading a
//! part's records, stock's batch assembly and a prefetch thread.
//!
//! Owns: [`parse_record`] (a record's `IRHeader`, labels and image), [`part_offsets`] (which
//! records a part of `num_parts` holds), [`Rng`] (a record's generator), [`Batching`] (the
//! settings of batch assembly), [`BatchReader`] (records in file order or shuffled anew each
//! epoch, decoded in parallel by a per-record function, with stock's `round_batch` and
//! padding rules) and [`Prefetcher`] (the thread that runs a reader `prefetch_buffer`
//! batches ahead of the caller).

use super::iter::{f32_bytes, Batch, DataIter};
use super::recordio::RecordReader;
use crate::error::{Error, Result};
use crate::ndarray::{DType, NDArray};
use crate::op::random::SplitMix64;
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;

/// A record's generator: seeded from the record's place, so results do not depend on which
/// thread augments which record.
pub(super) struct Rng(SplitMix64);

impl Rng {
    pub(super) fn new(seed: u64) -> Rng {
        let mut r = SplitMix64(seed ^ 0x5851_f42d_4c95_7f2d);
        r.next_u64();
        Rng(r)
    }
    /// Uniform in `[0, 1)`.
    pub(super) fn unit(&mut self) -> f32 {
        self.0.uniform_f32()
    }
    /// Uniform in `[lo, hi)`.
    pub(super) fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.unit()
    }
    /// Uniform integer in `[lo, hi]` (`lo <= hi`).
    pub(super) fn int(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.0.up_to((hi - lo) as u64) as usize
    }
    pub(super) fn normal(&mut self, std: f32) -> f32 {
        std * self.0.normal() as f32
    }
    pub(super) fn shuffle<T>(&mut self, v: &mut [T]) {
        self.0.shuffle(v)
    }
}

/// What one record holds: its labels, its image id and the encoded image.
pub(super) struct Record<'a> {
    /// The header's `flag`: how many labels follow the header (0: the header's one label).
    pub flag: usize,
    pub labels: Vec<f32>,
    pub id: u64,
    pub image: &'a [u8],
}

/// Parse a record's `IRHeader` (u32 flag, f32 label, u64 id, u64 id2) and the `flag` extra
/// labels that follow it.
pub(super) fn parse_record(bytes: &[u8]) -> Result<Record<'_>> {
    if bytes.len() < 24 {
        return Err(Error::mxnet(format!("the record has {} bytes, fewer than its 24-byte header", bytes.len())));
    }
    let word = |i: usize| [bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]];
    let flag = u32::from_le_bytes(word(0)) as usize;
    let label = f32::from_le_bytes(word(4));
    let id = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    let body = &bytes[24..];
    if flag == 0 {
        return Ok(Record { flag, labels: vec![label], id, image: body });
    }
    let Some(image) = flag.checked_mul(4).and_then(|n| body.get(n..)) else {
        return Err(Error::mxnet(format!("the record's header announces {flag} labels, more than the record holds")));
    };
    let labels = body[..4 * flag].chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    Ok(Record { flag, labels, id, image })
}

/// The byte offsets of the records of part `part_index` of `num_parts` (the iterator
/// parameters, checked here): from the `.idx` file (records split by count), or by scanning
/// the `.rec` file (split by bytes, as dmlc-core's input splits do).
pub(super) fn part_offsets(op: &str, rec: &str, idx: &str, num_parts: i64, part_index: i64) -> Result<Vec<u64>> {
    let parts = usize::try_from(num_parts).ok().filter(|&n| n > 0);
    let parts = parts.ok_or_else(|| Error::value(format!("{op}: num_parts must be positive, got {num_parts}")))?;
    let part = usize::try_from(part_index)
        .ok()
        .filter(|&i| i < parts)
        .ok_or_else(|| Error::value(format!("{op}: part_index {part_index} is not in [0, num_parts={parts})")))?;
    if !idx.is_empty() {
        let text = std::fs::read_to_string(idx).map_err(|e| Error::mxnet(format!("cannot read {idx}: {e}")))?;
        let mut offsets = Vec::new();
        for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let off = line.split_whitespace().nth(1).and_then(|f| f.parse::<u64>().ok());
            offsets
                .push(off.ok_or_else(|| Error::mxnet(format!("line {} of {idx} is not '<key>\\t<offset>'", n + 1)))?);
        }
        offsets.sort_unstable();
        let len = RecordReader::open(rec)?.file_len();
        if let Some(bad) = offsets.iter().find(|&&o| o >= len) {
            return Err(Error::mxnet(format!("{idx} points past the end of {rec} (byte {bad} of {len})")));
        }
        let step = offsets.len().div_ceil(parts);
        let (lo, hi) = (step.saturating_mul(part).min(offsets.len()), step.saturating_mul(part + 1).min(offsets.len()));
        return Ok(offsets[lo..hi].to_vec());
    }
    let mut reader = RecordReader::open(rec)?;
    let total = reader.file_len();
    let step = total.div_ceil(parts as u64).div_ceil(4) * 4;
    let (lo, hi) = (step.saturating_mul(part as u64), step.saturating_mul(part as u64 + 1));
    let mut offsets = Vec::new();
    loop {
        let at = reader.tell();
        if at >= hi || !reader.skip_record()? {
            break;
        }
        if at >= lo {
            offsets.push(at);
        }
    }
    Ok(offsets)
}

/// The settings of batch assembly an iterator gives its [`BatchReader`].
#[derive(Clone)]
pub(super) struct Batching {
    /// The `.rec` file.
    pub rec: String,
    /// One instance's data shape `(channels, height, width)` and the batch's dtype.
    pub shape: [usize; 3],
    pub dtype: DType,
    pub batch: usize,
    /// Labels per instance; a width of 1 gives a `(batch,)` label array unless `label_2d`.
    pub label_width: usize,
    pub label_2d: bool,
    pub round_batch: bool,
    /// Decoding threads.
    pub threads: usize,
    pub shuffle: bool,
    /// The shuffle's seed and the augmentations' seed.
    pub seed: u64,
    pub aug_seed: u64,
}

impl Batching {
    fn unit(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Decodes one record into its batch slot: `(record bytes, the record's seed, the slot)` to
/// its labels (`label_width` of them) and image id.
pub(super) type RecordFn = dyn Fn(&[u8], u64, &mut [u8]) -> Result<(Vec<f32>, u64)> + Send + Sync;

/// Reads a part's records in batches: file order, or shuffled anew each epoch.
pub(super) struct BatchReader {
    cfg: Batching,
    process: Arc<RecordFn>,
    reader: RecordReader,
    offsets: Vec<u64>,
    order: Vec<usize>,
    next: usize,
    epoch: u64,
    overflow: bool,
    /// The last batch's data, kept for the padding of a short batch without `round_batch`.
    last: Vec<u8>,
    last_labels: Vec<f32>,
    /// The `preprocess_threads` decoding threads, started once.
    workers: rayon::ThreadPool,
}

impl BatchReader {
    pub(super) fn new(cfg: Batching, process: Arc<RecordFn>, offsets: Vec<u64>) -> Result<BatchReader> {
        let reader = RecordReader::open(&cfg.rec)?;
        let bytes = cfg.batch * cfg.unit() * cfg.dtype.size();
        let labels = cfg.batch * cfg.label_width;
        let workers = rayon::ThreadPoolBuilder::new()
            .num_threads(cfg.threads)
            .thread_name(|i| format!("mxrt-imgdec-{i}"))
            .build()
            .map_err(|e| Error::mxnet(format!("cannot start the decoding threads: {e}")))?;
        let mut p = BatchReader {
            process,
            workers,
            reader,
            order: (0..offsets.len()).collect(),
            offsets,
            next: 0,
            epoch: 0,
            overflow: false,
            last: vec![0; bytes],
            last_labels: vec![0.0; labels],
            cfg,
        };
        p.reorder();
        Ok(p)
    }

    fn reorder(&mut self) {
        if self.cfg.shuffle {
            self.order = (0..self.offsets.len()).collect();
            Rng::new(self.cfg.seed.wrapping_mul(0x1000_0001).wrapping_add(self.epoch)).shuffle(&mut self.order);
        }
    }

    fn rewind(&mut self) {
        self.next = 0;
        self.epoch += 1;
        self.reorder();
    }

    fn before_first(&mut self) {
        if self.cfg.round_batch && self.overflow {
            self.overflow = false;
        } else {
            self.rewind();
        }
    }

    /// The next record's bytes and its position in the epoch, or `None` at the end.
    fn read(&mut self) -> Result<Option<(Vec<u8>, u64)>> {
        let Some(&i) = self.order.get(self.next) else { return Ok(None) };
        let at = self.offsets[i];
        self.reader.seek(at)?;
        let mut buf = Vec::new();
        if !self.reader.read_record(&mut buf)? {
            return Err(Error::mxnet(format!("{}: no record at byte {at} (a stale .idx file?)", self.cfg.rec)));
        }
        self.next += 1;
        Ok(Some((buf, self.epoch << 32 | self.next as u64)))
    }

    fn next_batch(&mut self) -> Result<Option<Batch>> {
        if self.overflow {
            return Ok(None);
        }
        let batch = self.cfg.batch;
        let mut records = Vec::with_capacity(batch);
        while records.len() < batch {
            match self.read()? {
                Some(r) => records.push(r),
                None => break,
            }
        }
        if records.is_empty() {
            return Ok(None);
        }
        let real = records.len();
        if real < batch && self.cfg.round_batch {
            self.overflow = true;
            self.rewind();
            while records.len() < batch {
                match self.read()? {
                    Some(r) => records.push(r),
                    None => {
                        return Err(Error::mxnet(format!(
                            "{}: number of input images must be bigger than the batch size",
                            self.cfg.rec
                        )))
                    }
                }
            }
        }
        let pad = batch - real;
        // The buffers go back whatever happens: a failed batch must not break the next ones.
        let (mut data, mut labels) = (std::mem::take(&mut self.last), std::mem::take(&mut self.last_labels));
        let made = self.fill(&records, &mut data, &mut labels).and_then(|ids| {
            let cfg = &self.cfg;
            let [c, h, w] = cfg.shape;
            let data_arr = NDArray::from_host_bytes(vec![batch, c, h, w], cfg.dtype, &data)?;
            let lshape = if cfg.label_width == 1 && !cfg.label_2d { vec![batch] } else { vec![batch, cfg.label_width] };
            let label_arr = NDArray::from_host_bytes(lshape, DType::F32, &f32_bytes(&labels))?;
            Ok(Batch { data: data_arr, label: label_arr, pad, index: ids })
        });
        (self.last, self.last_labels) = (data, labels);
        made.map(Some)
    }

    /// Decode, augment and normalise `records` into the batch buffers' first slots; returns
    /// every slot's image id (0 for padding).
    fn fill(&self, records: &[(Vec<u8>, u64)], data: &mut [u8], labels: &mut [f32]) -> Result<Vec<u64>> {
        let cfg = &self.cfg;
        let unit = cfg.unit() * cfg.dtype.size();
        let mut ids = vec![0u64; cfg.batch];
        let jobs: Vec<_> = records.iter().zip(data.chunks_exact_mut(unit)).enumerate().collect();
        use rayon::prelude::*;
        let results: Vec<_> = self.workers.install(|| {
            jobs.into_par_iter()
                .map(|(slot, ((bytes, place), out))| {
                    let seed = cfg.aug_seed.wrapping_mul(0x9e37_79b9).wrapping_add(*place);
                    // A decoder's panic is this record's error, not the end of the reading thread.
                    let run =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (self.process)(bytes, seed, out)));
                    let done = run.unwrap_or_else(|p| {
                        let why = p
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| p.downcast_ref::<String>().cloned());
                        Err(Error::internal(format!("decoding panicked: {}", why.unwrap_or_default())))
                    });
                    done.map(|r| (slot, r)).map_err(|e| {
                        let msg = e.to_string();
                        let body = msg.split_once(": ").map_or(msg.as_str(), |(_, b)| b);
                        Error::mxnet(format!("{}: record {} of the epoch: {body}", cfg.rec, place & 0xffff_ffff))
                    })
                })
                .collect()
        });
        for r in results {
            let (slot, (l, id)) = r?;
            labels[slot * cfg.label_width..(slot + 1) * cfg.label_width].copy_from_slice(&l);
            ids[slot] = id;
        }
        Ok(ids)
    }
}

enum Control {
    /// Start the next epoch; batches sent from now on carry this epoch number.
    Reset(u64),
}

/// The iterator: a prefetch thread running a [`BatchReader`], `prefetch_buffer` batches ahead.
pub(super) struct Prefetcher {
    /// The iterator's name, for errors.
    name: &'static str,
    batches: Receiver<(u64, Result<Option<Batch>>)>,
    control: Option<Sender<Control>>,
    thread: Option<JoinHandle<()>>,
    epoch: u64,
    ended: bool,
    /// The process that started the thread: a forked child has no such thread.
    pid: u32,
}

impl Prefetcher {
    pub(super) fn start(name: &'static str, mut parser: BatchReader, depth: usize) -> Result<Prefetcher> {
        let (tx, batches) = mpsc::sync_channel(depth);
        // Unbounded: resets never block, even while the thread waits to hand over a batch.
        let (control, commands) = mpsc::channel::<Control>();
        let thread = std::thread::Builder::new()
            .name("mxrt-imagerec".into())
            .spawn(move || {
                let mut epoch = 0;
                let mut ended = false;
                loop {
                    let command = if ended {
                        commands.recv().map_err(|_| TryRecvError::Disconnected)
                    } else {
                        commands.try_recv()
                    };
                    match command {
                        Ok(Control::Reset(e)) => {
                            let _call = crate::runtime::enter_call();
                            parser.before_first();
                            (epoch, ended) = (e, false);
                            continue;
                        }
                        Err(TryRecvError::Disconnected) => return,
                        Err(TryRecvError::Empty) => {}
                    }
                    // Inside the call gate, as a C call is: a fork waits until this batch is
                    // made, so the child inherits no lock this thread held (never across the
                    // channel waits, where a fork must not wait for us).
                    let item = {
                        let _call = crate::runtime::enter_call();
                        parser.next_batch()
                    };
                    ended = !matches!(item, Ok(Some(_)));
                    if tx.send((epoch, item)).is_err() {
                        return;
                    }
                }
            })
            .map_err(|e| Error::mxnet(format!("cannot start the {name} thread: {e}")))?;
        Ok(Prefetcher {
            name,
            batches,
            control: Some(control),
            thread: Some(thread),
            epoch: 0,
            ended: false,
            pid: std::process::id(),
        })
    }
}

impl DataIter for Prefetcher {
    fn before_first(&mut self) -> Result<()> {
        self.epoch += 1;
        self.ended = false;
        let control =
            self.control.as_ref().ok_or_else(|| Error::internal(format!("{} without its thread", self.name)))?;
        control
            .send(Control::Reset(self.epoch))
            .map_err(|_| Error::mxnet(format!("the {} thread has stopped", self.name)))
    }

    fn next(&mut self) -> Result<Option<Batch>> {
        if self.ended {
            return Ok(None);
        }
        loop {
            // Outside the call gate: the thread takes it to make the batch.
            let (epoch, item) = crate::runtime::outside_call(|| self.batches.recv())
                .map_err(|_| Error::mxnet(format!("the {} thread has stopped", self.name)))?;
            if epoch == self.epoch {
                self.ended = !matches!(item, Ok(Some(_)));
                return item;
            }
        }
    }

    fn owner_process(&self) -> Option<u32> {
        Some(self.pid)
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        if std::process::id() != self.pid {
            // A forked child's copy: the thread is not here, and the channels' queued batches
            // belong to the parent's state; leak them rather than tear them down here.
            std::mem::forget(self.thread.take());
            std::mem::forget(self.control.take());
            std::mem::forget(std::mem::replace(&mut self.batches, mpsc::sync_channel(0).1));
            return;
        }
        // Closing both channels ends the thread at its next send or command.
        self.control = None;
        let (_, dead) = mpsc::sync_channel(0);
        drop(std::mem::replace(&mut self.batches, dead));
        if let Some(t) = self.thread.take() {
            // Outside the call gate, as in `next`: the thread may be about to take it.
            let _ = crate::runtime::outside_call(|| t.join());
        }
    }
}
