//! The user's own profiling objects (`profiler.Domain`, `Task`, `Frame`, `Event`, `Counter`,
//! `Marker`).
//!
//! Owns: [`Object`] and how each kind turns into trace events. A domain is a trace process;
//! tasks are durations in the domain's category, frames in `<domain>,frame`, events (which
//! have no domain) in `event`, markers are instants in `<domain>,instant_marker`, counters are
//! counter events. Objects record only while the profiler runs.

use super::buffer::{self, now, Event, Phase, Proc, Scope, Text};
use super::running;
use crate::error::{Error, Result};
use crate::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

/// A started duration: when, and on which thread.
type Started = Mutex<Option<(f64, u32)>>;

pub enum Object {
    Domain {
        name: Arc<str>,
    },
    /// Task, frame or event: a duration that can be started and stopped.
    Duration {
        name: Arc<str>,
        cat: Arc<str>,
        proc: Proc,
        started: Started,
    },
    Counter {
        name: Arc<str>,
        domain: Arc<str>,
        value: AtomicI64,
    },
}

fn check_name(name: &str, what: &str) -> Result<Arc<str>> {
    if name.is_empty() {
        return Err(Error::value(format!("profiler {what} name must not be empty")));
    }
    Ok(Arc::from(name))
}

impl Object {
    pub fn domain(name: &str) -> Result<Object> {
        Ok(Object::Domain { name: check_name(name, "domain")? })
    }

    fn domain_name(&self) -> Result<Arc<str>> {
        match self {
            Object::Domain { name } => Ok(name.clone()),
            _ => Err(Error::type_error(format!("profiler handle is a {}, not a domain", self.kind()))),
        }
    }

    pub fn task(domain: &Object, name: &str) -> Result<Object> {
        let d = domain.domain_name()?;
        Ok(Object::Duration {
            name: check_name(name, "task")?,
            cat: d.clone(),
            proc: Proc::Domain(d),
            started: Mutex::new(None),
        })
    }

    pub fn frame(domain: &Object, name: &str) -> Result<Object> {
        let d = domain.domain_name()?;
        Ok(Object::Duration {
            name: check_name(name, "frame")?,
            cat: Arc::from(format!("{d},frame")),
            proc: Proc::Domain(d),
            started: Mutex::new(None),
        })
    }

    pub fn event(name: &str) -> Result<Object> {
        let cat: Arc<str> = Arc::from("event");
        Ok(Object::Duration {
            name: check_name(name, "event")?,
            cat: cat.clone(),
            proc: Proc::Domain(cat),
            started: Mutex::new(None),
        })
    }

    pub fn counter(domain: &Object, name: &str) -> Result<Object> {
        Ok(Object::Counter {
            name: check_name(name, "counter")?,
            domain: domain.domain_name()?,
            value: AtomicI64::new(0),
        })
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Object::Domain { .. } => "domain",
            Object::Duration { .. } => "task, frame or event",
            Object::Counter { .. } => "counter",
        }
    }

    /// `MXProfileDurationStart`.
    pub fn start(&self) -> Result<()> {
        let Object::Duration { started, .. } = self else {
            return Err(Error::type_error(format!("a profiler {} has no duration to start", self.kind())));
        };
        *started.lock() = Some((now(), buffer::current_tid()));
        Ok(())
    }

    /// `MXProfileDurationStop`: records the duration if the profiler runs. Stopping what was
    /// not started is an error.
    pub fn stop(&self) -> Result<()> {
        let Object::Duration { name, cat, proc, started } = self else {
            return Err(Error::type_error(format!("a profiler {} has no duration to stop", self.kind())));
        };
        let (t0, tid) = started
            .lock()
            .take()
            .ok_or_else(|| Error::value(format!("profiler object '{name}' was stopped without being started")))?;
        if running() {
            buffer::record(Event {
                name: Text::Shared(name.clone()),
                cat: Text::Shared(cat.clone()),
                proc: proc.clone(),
                tid,
                ts: t0,
                phase: Phase::Complete { dur: now() - t0 },
                args: None,
            });
        }
        Ok(())
    }

    fn counter_parts(&self) -> Result<(&Arc<str>, &Arc<str>, &AtomicI64)> {
        match self {
            Object::Counter { name, domain, value } => Ok((name, domain, value)),
            _ => Err(Error::type_error(format!("profiler handle is a {}, not a counter", self.kind()))),
        }
    }

    fn record_counter(name: &Arc<str>, domain: &Arc<str>, value: i64) {
        if running() {
            buffer::record(Event {
                name: Text::Shared(name.clone()),
                cat: Text::Shared(domain.clone()),
                proc: Proc::Domain(domain.clone()),
                tid: buffer::current_tid(),
                ts: now(),
                phase: Phase::Counter { value },
                args: None,
            });
        }
    }

    /// `MXProfileSetCounter`.
    pub fn set_counter(&self, v: u64) -> Result<()> {
        let (name, domain, value) = self.counter_parts()?;
        let v = i64::try_from(v).map_err(|_| Error::value(format!("counter value {v} exceeds the int64 range")))?;
        value.store(v, Ordering::Relaxed);
        Self::record_counter(name, domain, v);
        Ok(())
    }

    /// `MXProfileAdjustCounter`: add `delta` (negative to decrement); returns the new value.
    pub fn adjust_counter(&self, delta: i64) -> Result<i64> {
        let (name, domain, value) = self.counter_parts()?;
        let v = value.fetch_add(delta, Ordering::Relaxed).wrapping_add(delta);
        Self::record_counter(name, domain, v);
        Ok(v)
    }
}

/// `MXProfileSetMarker`: an instant in `<domain>,instant_marker` with scope `global`,
/// `process`, `thread`, `task` or `marker` (the last two are shown thread-scoped).
pub fn marker(domain: &Object, name: &str, scope: &str) -> Result<()> {
    let d = domain.domain_name()?;
    let name = check_name(name, "marker")?;
    let scope = match scope {
        "global" => Scope::Global,
        "process" => Scope::Process,
        "thread" | "task" | "marker" => Scope::Thread,
        _ => {
            return Err(Error::mxnet(format!(
                "marker scope '{scope}' is not one of global, process, thread, task, marker"
            )))
        }
    };
    if running() {
        buffer::record(Event {
            name: Text::Shared(name),
            cat: Text::Shared(Arc::from(format!("{d},instant_marker"))),
            proc: Proc::Domain(d),
            tid: buffer::current_tid(),
            ts: now(),
            phase: Phase::Instant { scope },
            args: None,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_check_their_kind_and_inputs() {
        let d = Object::domain("dom").unwrap();
        assert!(Object::domain("").is_err());
        let t = Object::task(&d, "t").unwrap();
        assert!(Object::task(&t, "x").is_err(), "a task is not a domain");
        assert!(t.stop().is_err(), "not started");
        t.start().unwrap();
        t.stop().unwrap();
        let c = Object::counter(&d, "c").unwrap();
        c.set_counter(5).unwrap();
        assert_eq!(c.adjust_counter(-7).unwrap(), -2);
        assert!(c.set_counter(u64::MAX).is_err());
        assert!(c.start().is_err());
        assert!(t.adjust_counter(1).is_err());
        assert!(marker(&d, "m", "process").is_ok());
        assert!(marker(&d, "m", "galaxy").is_err());
        match Object::frame(&d, "f").unwrap() {
            Object::Duration { cat, .. } => assert_eq!(&*cat, "dom,frame"),
            _ => unreachable!(),
        }
    }
}
