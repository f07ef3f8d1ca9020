//! Aggregate statistics: per category and name, how often and how long (or, for device
//! storage, how much memory), as `profiler.dumps()` prints them.
//!
//! Owns: [`Aggregate`] and its two renderings, stock's table and stock's JSON layout
//! (`Time`, `Memory`, `Unit`; per entry `Count`, `Total`, `Min`, `Max`, `Avg`; memory entries
//! have no `Total`). Times are kept in microseconds and shown in milliseconds; memory is kept
//! in bytes and shown in kB (1000 bytes), as stock shows them.

use super::buffer::{Event, Phase};
use super::trace::json_str;
use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::fmt::Write;

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Stat {
    pub count: u64,
    pub total: f64,
    pub min: f64,
    pub max: f64,
}

impl Stat {
    fn add(&mut self, v: f64) {
        if self.count == 0 {
            self.min = v;
            self.max = v;
        } else {
            self.min = self.min.min(v);
            self.max = self.max.max(v);
        }
        self.count += 1;
        self.total += v;
    }
    fn avg(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.total / self.count as f64
        }
    }
}

/// How `dumps()` orders the entries of a category (stock codes 0..=4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortBy {
    Total,
    Avg,
    Min,
    Max,
    Count,
}

impl SortBy {
    pub fn from_code(code: i32) -> Result<Self> {
        Ok(match code {
            0 => SortBy::Total,
            1 => SortBy::Avg,
            2 => SortBy::Min,
            3 => SortBy::Max,
            4 => SortBy::Count,
            _ => {
                return Err(Error::value(format!(
                    "sort_by code {code} is not valid (0 total, 1 avg, 2 min, 3 max, 4 count)"
                )))
            }
        })
    }
    fn key(self, s: &Stat) -> f64 {
        match self {
            SortBy::Total => s.total,
            SortBy::Avg => s.avg(),
            SortBy::Min => s.min,
            SortBy::Max => s.max,
            SortBy::Count => s.count as f64,
        }
    }
}

/// Statistics of everything dumped since the last reset.
#[derive(Debug, Default)]
pub struct Aggregate {
    /// category → name → durations (µs).
    time: BTreeMap<String, BTreeMap<String, Stat>>,
    /// `Memory: <device>` → bytes in use after each allocation or free.
    memory: BTreeMap<String, Stat>,
}

pub const STORAGE_CATEGORY: &str = "Device Storage";

impl Aggregate {
    /// Fold events in. Counters and markers are not durations and are left to the trace.
    pub fn add(&mut self, events: &[Event], memory_name: impl Fn(&Event) -> String) {
        for e in events {
            match e.phase {
                Phase::Complete { dur } => {
                    let cat = self.time.entry(e.cat.to_string()).or_default();
                    match cat.get_mut(&*e.name) {
                        Some(s) => s.add(dur),
                        None => cat.entry(e.name.to_string()).or_default().add(dur),
                    }
                }
                Phase::Memory { bytes } => self.memory.entry(memory_name(e)).or_default().add(bytes as f64),
                Phase::Counter { .. } | Phase::Instant { .. } => {}
            }
        }
    }

    pub fn reset(&mut self) {
        *self = Aggregate::default();
    }

    /// Count of `name` in `category`.
    #[cfg(test)]
    pub fn count(&self, category: &str, name: &str) -> u64 {
        self.time.get(category).and_then(|c| c.get(name)).map_or(0, |s| s.count)
    }

    fn sorted(entries: &BTreeMap<String, Stat>, by: SortBy, ascending: bool) -> Vec<(&String, &Stat)> {
        let mut v: Vec<_> = entries.iter().collect();
        v.sort_by(|a, b| {
            let o = by.key(a.1).total_cmp(&by.key(b.1));
            if ascending {
                o
            } else {
                o.reverse()
            }
        });
        v
    }

    /// Stock's table: a `Device Storage` block, then one block per category.
    pub fn table(&self, by: SortBy, ascending: bool) -> String {
        let mut s = String::from("\nProfile Statistics:\n\tNote the difference in units for different entries.\n");
        if !self.memory.is_empty() {
            s.push_str(STORAGE_CATEGORY);
            s.push_str("\n=================\n");
            let _ = writeln!(
                s,
                "{:<30}{:>11}{:>17}{:>17}{:>17}",
                "Name", "Total Count", "Min Use  (kB)", "Max Use  (kB)", "Avg Use  (kB)"
            );
            let _ = writeln!(
                s,
                "{:<30}{:>11}{:>17}{:>17}{:>17}",
                "----", "-----------", "-------------", "-------------", "-------------"
            );
            for (name, st) in Self::sorted(&self.memory, by, ascending) {
                let _ = writeln!(
                    s,
                    "{:<30}{:>11}{:>17.4}{:>17.4}{:>17.4}",
                    name,
                    st.count,
                    st.min / 1000.0,
                    st.max / 1000.0,
                    st.avg() / 1000.0
                );
            }
            s.push('\n');
        }
        for (cat, entries) in &self.time {
            s.push_str(cat);
            s.push_str("\n=================\n");
            let _ = writeln!(
                s,
                "{:<30}{:>11}{:>17}{:>17}{:>17}{:>17}",
                "Name", "Total Count", "Time (ms)", "Min Time (ms)", "Max Time (ms)", "Avg Time (ms)"
            );
            let _ = writeln!(
                s,
                "{:<30}{:>11}{:>17}{:>17}{:>17}{:>17}",
                "----", "-----------", "---------", "-------------", "-------------", "-------------"
            );
            for (name, st) in Self::sorted(entries, by, ascending) {
                let _ = writeln!(
                    s,
                    "{:<30}{:>11}{:>17.4}{:>17.4}{:>17.4}{:>17.4}",
                    name,
                    st.count,
                    st.total / 1000.0,
                    st.min / 1000.0,
                    st.max / 1000.0,
                    st.avg() / 1000.0
                );
            }
            s.push('\n');
        }
        s
    }

    /// Stock's JSON layout, entries of each category in the requested order.
    pub fn json(&self, by: SortBy, ascending: bool) -> String {
        // Rounded to nanoseconds (or milli-kB), as the table's precision suggests.
        let num = |v: f64| if v.is_finite() { format!("{}", (v * 1e6).round() / 1e6) } else { "0".to_string() };
        let mut s = String::from("{\n    \"Time\": {");
        for (ci, (cat, entries)) in self.time.iter().enumerate() {
            s.push_str(if ci == 0 { "\n        " } else { ",\n        " });
            json_str(&mut s, cat);
            s.push_str(": {");
            for (i, (name, st)) in Self::sorted(entries, by, ascending).into_iter().enumerate() {
                s.push_str(if i == 0 { "\n            " } else { ",\n            " });
                json_str(&mut s, name);
                let _ = write!(
                    s,
                    ": {{\"Count\": {}, \"Total\": {}, \"Min\": {}, \"Max\": {}, \"Avg\": {}}}",
                    st.count,
                    num(st.total / 1000.0),
                    num(st.min / 1000.0),
                    num(st.max / 1000.0),
                    num(st.avg() / 1000.0)
                );
            }
            s.push_str("\n        }");
        }
        s.push_str("\n    },\n    \"Memory\": {");
        if !self.memory.is_empty() {
            s.push_str("\n        ");
            json_str(&mut s, STORAGE_CATEGORY);
            s.push_str(": {");
            for (i, (name, st)) in Self::sorted(&self.memory, by, ascending).into_iter().enumerate() {
                s.push_str(if i == 0 { "\n            " } else { ",\n            " });
                json_str(&mut s, name);
                let _ = write!(
                    s,
                    ": {{\"Count\": {}, \"Min\": {}, \"Max\": {}, \"Avg\": {}}}",
                    st.count,
                    num(st.min / 1000.0),
                    num(st.max / 1000.0),
                    num(st.avg() / 1000.0)
                );
            }
            s.push_str("\n        }");
        }
        s.push_str("\n    },\n    \"Unit\": {\"Time\": \"ms\", \"Memory\": \"kB\"}\n}\n");
        s
    }
}

#[cfg(test)]
mod tests {
    use super::super::buffer::{Proc, Text};
    use super::*;

    fn op(name: &'static str, dur: f64) -> Event {
        Event {
            name: Text::Static(name),
            cat: Text::Static("operator"),
            proc: Proc::Api,
            tid: 0,
            ts: 0.0,
            phase: Phase::Complete { dur },
            args: None,
        }
    }

    #[test]
    fn stats_sorting_and_both_renderings() {
        let mut a = Aggregate::default();
        a.add(&[op("dot", 1000.0), op("sqrt", 50.0), op("sqrt", 150.0), op("a\"b", 1.0)], |_| String::new());
        assert_eq!(a.count("operator", "sqrt"), 2);
        let t = a.table(SortBy::Total, false);
        assert!(t.starts_with("\nProfile Statistics:\n\tNote the difference in units for different entries.\n"));
        let dot = t.find("\ndot ").unwrap();
        let sqrt = t.find("\nsqrt ").unwrap();
        assert!(dot < sqrt, "descending by total: {t}");
        assert!(t.contains("sqrt                                    2           0.2000           0.0500           0.1500           0.1000"), "{t}");
        let asc = a.table(SortBy::Count, true);
        assert!(asc.find("\nsqrt ").unwrap() > asc.find("\ndot ").unwrap());
        let j: serde_json::Value = serde_json::from_str(&a.json(SortBy::Avg, false)).unwrap();
        assert_eq!(j["Time"]["operator"]["sqrt"]["Count"], 2);
        assert_eq!(j["Time"]["operator"]["sqrt"]["Avg"], 0.1);
        assert_eq!(j["Time"]["operator"]["a\"b"]["Count"], 1);
        assert_eq!(j["Unit"]["Memory"], "kB");
        a.reset();
        assert_eq!(a.count("operator", "sqrt"), 0);
        assert!(SortBy::from_code(5).is_err());
    }
}
