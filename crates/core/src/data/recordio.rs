//! MXNet's RecordIO format (dmlc-core's), read and written bit for bit.
//!
//! Owns: [`RecordWriter`] and [`RecordReader`]. A file is a sequence of parts, each a 4-byte
//! magic number ([`MAGIC`]), a 4-byte little-endian word holding a continuation flag (top 3
//! bits) and the part's length (low 29 bits), the part's bytes, and zero padding to a multiple
//! of 4. A record whose bytes contain the magic number at a 4-byte-aligned offset is split
//! there into several parts, the magic itself left out (flags: 1 first, 2 middle, 3 last; 0 a
//! whole record); the reader puts the magic back between the parts. The `.idx` files beside
//! the records are text the frontend writes and reads itself.

use crate::error::{Error, Result};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};

/// The magic number that starts every part.
pub const MAGIC: u32 = 0xced7_230a;
const MAGIC_BYTES: [u8; 4] = MAGIC.to_le_bytes();
/// Largest part length the 29-bit field holds.
const MAX_PART: usize = (1 << 29) - 1;

fn lrec(flag: u32, len: usize) -> [u8; 4] {
    ((flag << 29) | len as u32).to_le_bytes()
}

fn padding(len: usize) -> usize {
    (4 - len % 4) % 4
}

/// Writes records to a file (truncated when created).
pub struct RecordWriter {
    out: BufWriter<File>,
    path: String,
    pos: u64,
}

impl RecordWriter {
    pub fn create(path: &str) -> Result<RecordWriter> {
        let file = File::create(local_path(path)?).map_err(|e| Error::mxnet(format!("cannot create {path}: {e}")))?;
        Ok(RecordWriter { out: BufWriter::with_capacity(1 << 16, file), path: path.to_string(), pos: 0 })
    }

    /// Append one record (split where it holds the magic number, as dmlc-core does).
    pub fn write_record(&mut self, data: &[u8]) -> Result<()> {
        if data.len() > MAX_PART {
            return Err(Error::value(format!(
                "a RecordIO record holds at most {MAX_PART} bytes; this one has {}",
                data.len()
            )));
        }
        let mut start = 0;
        let mut first = true;
        for i in (0..data.len() / 4 * 4).step_by(4) {
            if data[i..i + 4] == MAGIC_BYTES {
                self.put(&[&MAGIC_BYTES, &lrec(if first { 1 } else { 2 }, i - start), &data[start..i]])?;
                start = i + 4;
                first = false;
            }
        }
        let tail = &data[start..];
        self.put(&[&MAGIC_BYTES, &lrec(if first { 0 } else { 3 }, tail.len()), tail, &[0u8; 3][..padding(tail.len())]])
    }

    fn put(&mut self, pieces: &[&[u8]]) -> Result<()> {
        for p in pieces {
            self.out.write_all(p).map_err(|e| Error::mxnet(format!("cannot write {}: {e}", self.path)))?;
            self.pos += p.len() as u64;
        }
        Ok(())
    }

    /// Bytes written so far: where the next record starts (what `.idx` files hold).
    pub fn tell(&self) -> u64 {
        self.pos
    }

    /// Write what is buffered to the file and close it; an error here means records were lost.
    pub fn close(mut self) -> Result<()> {
        self.out.flush().map_err(|e| Error::mxnet(format!("cannot write {}: {e}", self.path)))
    }

    /// Close the file without writing what is buffered (a forked child's copy of its
    /// parent's writer: the parent writes those bytes).
    pub fn abandon(self) {
        drop(self.out.into_parts());
    }
}

/// Reads records from a file, from the start or from a position a `.idx` file gives.
pub struct RecordReader {
    src: BufReader<File>,
    path: String,
    pos: u64,
    len: u64,
}

impl RecordReader {
    pub fn open(path: &str) -> Result<RecordReader> {
        let file = File::open(local_path(path)?).map_err(|e| Error::mxnet(format!("cannot open {path}: {e}")))?;
        let len = file.metadata().map_err(|e| Error::mxnet(format!("cannot read {path}: {e}")))?.len();
        Ok(RecordReader { src: BufReader::with_capacity(1 << 16, file), path: path.to_string(), pos: 0, len })
    }

    /// The header of part `part` of the record that started at `start`: (its offset, flag,
    /// length), or `None` at the end of the file before a record's first part.
    fn part_header(&mut self, start: u64, part: usize) -> Result<Option<(u64, u32, usize)>> {
        let mut head = [0u8; 8];
        let got = self.fill(&mut head)?;
        if got == 0 && part == 0 {
            return Ok(None);
        }
        let at = self.pos - got as u64;
        if got < 8 {
            return Err(self.corrupt(at, "the file ends inside a record header"));
        }
        if head[..4] != MAGIC_BYTES {
            return Err(self.corrupt(at, "no RecordIO magic number where a record should start"));
        }
        let word = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
        let (flag, len) = (word >> 29, (word & MAX_PART as u32) as usize);
        match (part, flag) {
            (0, 0 | 1) | (1.., 2 | 3) => Ok(Some((at, flag, len))),
            (0, _) => Err(self.corrupt(at, "a record starts with the continuation of a split record")),
            _ => Err(self.corrupt(start, "a split record is missing its continuation")),
        }
    }

    /// The next record into `out` (replacing its contents); false at the end of the file.
    pub fn read_record(&mut self, out: &mut Vec<u8>) -> Result<bool> {
        out.clear();
        let start = self.pos;
        for part in 0.. {
            let Some((at, flag, len)) = self.part_header(start, part)? else { return Ok(false) };
            let begin = out.len();
            out.resize(begin + len + padding(len), 0);
            if self.fill(&mut out[begin..])? < len + padding(len) {
                return Err(self.corrupt(at, &format!("the file ends inside a record of {len} bytes")));
            }
            out.truncate(begin + len);
            if flag == 0 || flag == 3 {
                break;
            }
            out.extend_from_slice(&MAGIC_BYTES);
        }
        Ok(true)
    }

    /// Skip the next record without reading its bytes; false at the end of the file.
    pub fn skip_record(&mut self) -> Result<bool> {
        let start = self.pos;
        for part in 0.. {
            let Some((at, flag, len)) = self.part_header(start, part)? else { return Ok(false) };
            let body = (len + padding(len)) as u64;
            if self.pos + body > self.len {
                return Err(self.corrupt(at, &format!("the file ends inside a record of {len} bytes")));
            }
            self.src
                .seek_relative(body as i64)
                .map_err(|e| Error::mxnet(format!("cannot seek in {}: {e}", self.path)))?;
            self.pos += body;
            if flag == 0 || flag == 3 {
                break;
            }
        }
        Ok(true)
    }

    /// Read as much of `buf` as the file has; returns the bytes read.
    fn fill(&mut self, buf: &mut [u8]) -> Result<usize> {
        let mut n = 0;
        while n < buf.len() {
            match self.src.read(&mut buf[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::mxnet(format!("cannot read {}: {e}", self.path))),
            }
        }
        self.pos += n as u64;
        Ok(n)
    }

    fn corrupt(&self, at: u64, what: &str) -> Error {
        Error::mxnet(format!("invalid RecordIO file {} at byte {at}: {what}", self.path))
    }

    /// The file's length in bytes.
    pub fn file_len(&self) -> u64 {
        self.len
    }

    /// Continue reading at byte `pos` (a record's start, from a `.idx` file).
    pub fn seek(&mut self, pos: u64) -> Result<()> {
        if pos == self.pos {
            return Ok(()); // already there: keep the buffered bytes
        }
        if pos > self.len {
            return Err(Error::value(format!(
                "cannot seek to byte {pos} of {}, which has {} bytes",
                self.path, self.len
            )));
        }
        self.src.seek(SeekFrom::Start(pos)).map_err(|e| Error::mxnet(format!("cannot seek in {}: {e}", self.path)))?;
        self.pos = pos;
        Ok(())
    }

    pub fn tell(&self) -> u64 {
        self.pos
    }
}

/// The local path of a URI: a plain path or `file://`; other file systems (`hdfs://`,
/// `s3://`, ...) are not supported yet.
fn local_path(uri: &str) -> Result<&str> {
    if let Some(p) = uri.strip_prefix("file://") {
        return Ok(p);
    }
    match uri.find("://") {
        Some(i) => Err(Error::not_supported(format!("RecordIO files on {}:// (only local files)", &uri[..i]))),
        None => Ok(uri),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> String {
        let d = std::env::temp_dir().join(format!("mxrt-recordio-{}-{name}", std::process::id()));
        d.to_str().unwrap().to_string()
    }

    #[test]
    fn records_round_trip_with_magic_inside_and_padding() {
        let path = tmp("round");
        let m = MAGIC_BYTES;
        let records: Vec<Vec<u8>> = vec![
            b"abc".to_vec(),
            vec![],
            [&m[..], b"xy"].concat(),                        // magic first
            [b"1234".as_slice(), &m, &m, b"tail!"].concat(), // two in a row, in the middle
            [b"12".as_slice(), &m, b"34"].concat(),          // unaligned: not split
            [b"abcd".as_slice(), &m].concat(),               // magic last
        ];
        let mut w = RecordWriter::create(&path).unwrap();
        let mut starts = vec![];
        for r in &records {
            starts.push(w.tell());
            w.write_record(r).unwrap();
        }
        let total = w.tell();
        w.close().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len() as u64, total);
        // "abc": magic, flag 0 | length 3, the bytes, one zero.
        assert_eq!(&bytes[..12], &[0x0a, 0x23, 0xd7, 0xce, 3, 0, 0, 0, b'a', b'b', b'c', 0]);
        // The record with magic first: an empty first part (flag 1), then "xy" (flag 3).
        let at = starts[2] as usize;
        assert_eq!(&bytes[at + 4..at + 8], &(1u32 << 29).to_le_bytes());
        assert_eq!(&bytes[at + 12..at + 16], &((3u32 << 29) | 2).to_le_bytes());

        let mut r = RecordReader::open(&path).unwrap();
        let mut buf = vec![];
        for want in &records {
            assert!(r.read_record(&mut buf).unwrap());
            assert_eq!(&buf, want);
        }
        assert!(!r.read_record(&mut buf).unwrap());
        r.seek(starts[3]).unwrap();
        assert!(r.read_record(&mut buf).unwrap());
        assert_eq!(buf, records[3]);
        assert_eq!(r.tell(), starts[4]);
        assert!(r.seek(total + 1).unwrap_err().to_string().contains("which has"));

        // Corrupt files: a bad magic, a truncated record, a seek into a continuation.
        std::fs::write(&path, &bytes[..bytes.len() - 2]).unwrap();
        let mut r = RecordReader::open(&path).unwrap();
        r.seek(starts[5]).unwrap();
        let e = r.read_record(&mut buf).unwrap_err().to_string();
        assert!(e.starts_with("MXNetError: invalid RecordIO file") && e.contains("ends inside"), "{e}");
        let mut r = RecordReader::open(&path).unwrap();
        r.seek(4).unwrap();
        assert!(r.read_record(&mut buf).unwrap_err().to_string().contains("no RecordIO magic"));
        let second_part = starts[3] + 8 + 4;
        r.seek(second_part).unwrap();
        assert!(r.read_record(&mut buf).unwrap_err().to_string().contains("continuation"));
        std::fs::remove_file(&path).unwrap();
        assert!(RecordReader::open(&path).is_err());
        assert!(RecordWriter::create("s3://bucket/x.rec")
            .err()
            .unwrap()
            .to_string()
            .starts_with("NotImplementedError"));
    }
}
