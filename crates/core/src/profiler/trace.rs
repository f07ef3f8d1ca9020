//! Chrome trace-event output: every dump is a complete JSON document, written to a temporary
//! file and renamed over the target so that no reader ever sees half a file.
//!
//! Owns: [`Trace`] (the events serialised so far, the pid/tid naming) and JSON string
//! escaping. pids are small integers given to trace processes in order of first appearance,
//! each with `process_name` metadata; tids are the small integers of the recording threads,
//! each with `thread_name` metadata per process it appears in.

use super::buffer::{Event, Phase, Proc, Scope};
use crate::error::{Error, Result};
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

/// Append `s` as a JSON string literal.
pub fn json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `cpu/0`, `gpu/1`, ...: how devices are named in traces and statistics.
pub fn device_label(ctx: crate::context::Context) -> String {
    format!("{}/{}", ctx.dev_type.name(), ctx.dev_id)
}

/// The name of a trace process.
pub fn proc_name(p: &Proc) -> String {
    match p {
        Proc::Device(ctx) => device_label(*ctx),
        Proc::Api => "MXNET_C_API".into(),
        Proc::Storage(_) => "Device Storage".into(),
        Proc::CustomOp => "Custom Operator".into(),
        Proc::Domain(name) => name.to_string(),
    }
}

/// The name an event is shown under (memory counters are named after their device).
pub fn event_name(e: &Event) -> String {
    match (&e.phase, &e.proc) {
        (Phase::Memory { .. }, Proc::Storage(ctx)) => format!("Memory: {}", device_label(*ctx)),
        _ => e.name.to_string(),
    }
}

/// Events serialised so far, and the pid/tid naming they use.
#[derive(Default)]
pub struct Trace {
    /// Serialised events, each preceded by `,\n`.
    body: String,
    events: usize,
    pids: HashMap<Proc, u32>,
    /// Metadata entries, each preceded by `,\n`.
    meta: String,
    named_threads: HashSet<(u32, u32)>,
    thread_names: HashMap<u32, String>,
}

impl Trace {
    pub fn len(&self) -> usize {
        self.events
    }

    pub fn is_empty(&self) -> bool {
        self.events == 0
    }

    fn pid(&mut self, p: &Proc) -> u32 {
        if let Some(&pid) = self.pids.get(p) {
            return pid;
        }
        let pid = self.pids.len() as u32;
        self.pids.insert(p.clone(), pid);
        self.meta.push_str(",\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":");
        let _ = write!(self.meta, "{pid},\"args\":{{\"name\":");
        json_str(&mut self.meta, &proc_name(p));
        self.meta.push_str("}}");
        let _ = write!(
            self.meta,
            ",\n{{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":{pid},\"args\":{{\"sort_index\":{pid}}}}}"
        );
        pid
    }

    fn name_thread(&mut self, pid: u32, tid: u32) {
        if !self.named_threads.insert((pid, tid)) {
            return;
        }
        let name = self.thread_names.get(&tid).cloned().unwrap_or_else(|| format!("thread {tid}"));
        let _ = write!(
            self.meta,
            ",\n{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"name\":"
        );
        json_str(&mut self.meta, &name);
        self.meta.push_str("}}");
    }

    /// Serialise events (ordered by time) and remember the threads' names.
    pub fn add(&mut self, events: &[Event], threads: &[(u32, String)]) {
        for (tid, name) in threads {
            self.thread_names.entry(*tid).or_insert_with(|| name.clone());
        }
        for e in events {
            let pid = self.pid(&e.proc);
            self.name_thread(pid, e.tid);
            let name = event_name(e);
            let b = &mut self.body;
            b.push_str(",\n{\"name\":");
            json_str(b, &name);
            b.push_str(",\"cat\":");
            json_str(b, &e.cat);
            let ph = match e.phase {
                Phase::Complete { .. } => "X",
                Phase::Counter { .. } | Phase::Memory { .. } => "C",
                Phase::Instant { .. } => "i",
            };
            let _ = write!(b, ",\"ph\":\"{ph}\",\"ts\":{:.3},\"pid\":{pid},\"tid\":{}", e.ts, e.tid);
            match e.phase {
                Phase::Complete { dur } => {
                    let _ = write!(b, ",\"dur\":{dur:.3}");
                    if let Some(a) = &e.args {
                        let _ = write!(b, ",\"args\":{{{a}}}");
                    }
                }
                Phase::Counter { value } => {
                    b.push_str(",\"args\":{");
                    json_str(b, &name);
                    let _ = write!(b, ":{value}}}");
                }
                Phase::Memory { bytes } => {
                    b.push_str(",\"args\":{");
                    json_str(b, &name);
                    let _ = write!(b, ":{bytes}}}");
                }
                Phase::Instant { scope } => {
                    let s = match scope {
                        Scope::Global => "g",
                        Scope::Process => "p",
                        Scope::Thread => "t",
                    };
                    let _ = write!(b, ",\"s\":\"{s}\"");
                }
            }
            b.push('}');
            self.events += 1;
        }
    }

    /// The complete document.
    pub fn document(&self) -> String {
        let mut s = String::with_capacity(self.meta.len() + self.body.len() + 64);
        s.push_str("{\"traceEvents\":[");
        // Both parts are lists of `,\n{...}`: drop the first separator.
        if self.meta.is_empty() {
            s.push_str(self.body.strip_prefix(',').unwrap_or(&self.body));
        } else {
            s.push_str(&self.meta[1..]);
            s.push_str(&self.body);
        }
        s.push_str("\n],\"displayTimeUnit\":\"ms\"}\n");
        s
    }

    /// Write the document to `path` atomically (temporary file in the same directory, then
    /// rename).
    pub fn write(&self, path: &str) -> Result<()> {
        write_atomic(path, self.document().as_bytes())
    }
}

/// Whether `path` names something other than a regular file or nothing (a device such as
/// `/dev/null`, a FIFO, a symbolic link, a directory): never renamed over or removed.
pub fn is_special(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| !m.file_type().is_file())
}

/// Write `bytes` to `path` through a temporary file renamed over it. A path that names a
/// device, FIFO or symbolic link is written in place instead (renaming over `/dev/null`
/// would replace the device with a file).
pub fn write_atomic(path: &str, bytes: &[u8]) -> Result<()> {
    let target = Path::new(path);
    let io = |e: std::io::Error, what: &str| Error::mxnet(format!("cannot {what} profiler output '{path}': {e}"));
    if is_special(target) {
        let mut f = std::fs::OpenOptions::new().write(true).truncate(true).open(target).map_err(|e| io(e, "open"))?;
        return f.write_all(bytes).map_err(|e| io(e, "write"));
    }
    let file_name =
        target.file_name().ok_or_else(|| Error::value(format!("profiler filename '{path}' names no file")))?;
    let tmp = target.with_file_name(format!(".{}.tmp{}", file_name.to_string_lossy(), std::process::id()));
    let mut f = std::fs::File::create(&tmp).map_err(|e| io(e, "create"))?;
    f.write_all(bytes).map_err(|e| io(e, "write"))?;
    drop(f);
    std::fs::rename(&tmp, target).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io(e, "rename into")
    })
}

#[cfg(test)]
mod tests {
    use super::super::buffer::Text;
    use super::*;
    use crate::context::Context;
    use std::sync::Arc;

    #[test]
    fn documents_are_valid_json_with_small_ids_and_escaped_names() {
        let mut t = Trace::default();
        assert!(serde_json::from_str::<serde_json::Value>(&t.document()).is_ok());
        let ev = |name: &str, phase| Event {
            name: Text::Shared(Arc::from(name)),
            cat: Text::Static("operator"),
            proc: Proc::Device(Context::CPU),
            tid: 3,
            ts: 12.5,
            phase,
            args: Some("\"algo\":\"gemm\"".into()),
        };
        t.add(
            &[
                ev("we\"ird\n\u{1}name", Phase::Complete { dur: 2.0 }),
                ev("c", Phase::Counter { value: -4 }),
                ev("m", Phase::Instant { scope: Scope::Thread }),
                Event { proc: Proc::Storage(Context::CPU), ..ev("x", Phase::Memory { bytes: 4096 }) },
            ],
            &[(3, "cpu worker 1".into())],
        );
        let doc: serde_json::Value = serde_json::from_str(&t.document()).unwrap();
        let evs = doc["traceEvents"].as_array().unwrap();
        assert_eq!(doc["displayTimeUnit"], "ms");
        let names: Vec<_> = evs
            .iter()
            .filter(|e| e["ph"] == "M" && e["name"] == "process_name")
            .map(|e| e["args"]["name"].clone())
            .collect();
        assert_eq!(names, ["cpu/0", "Device Storage"]);
        assert!(evs.iter().any(|e| e["name"] == "thread_name" && e["args"]["name"] == "cpu worker 1"));
        let x = evs.iter().find(|e| e["ph"] == "X").unwrap();
        assert_eq!(x["name"], "we\"ird\n\u{1}name");
        assert_eq!(x["dur"], 2.0);
        assert_eq!(x["args"]["algo"], "gemm");
        assert!(evs.iter().any(|e| e["ph"] == "C" && e["args"]["Memory: cpu/0"] == 4096));
        assert!(evs.iter().any(|e| e["ph"] == "C" && e["args"]["c"] == -4));
        assert!(evs.iter().any(|e| e["ph"] == "i" && e["s"] == "t"));
        for e in evs {
            assert!(e["pid"].as_u64().unwrap() < 16);
        }
        assert_eq!(t.len(), 4);
    }

    #[test]
    fn atomic_write_replaces_the_file() {
        let dir = std::env::temp_dir().join(format!("mxrt-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("t.json");
        let ps = p.to_str().unwrap();
        write_atomic(ps, b"{}").unwrap();
        write_atomic(ps, b"{\"a\":1}").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "{\"a\":1}");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "no temporary file left");
        assert!(write_atomic(dir.join("missing/t.json").to_str().unwrap(), b"{}").is_err());
        // A device is written in place, never replaced by a file.
        write_atomic("/dev/null", b"{}").unwrap();
        assert!(is_special(Path::new("/dev/null")));
        use std::os::unix::fs::FileTypeExt;
        assert!(std::fs::metadata("/dev/null").unwrap().file_type().is_char_device());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
