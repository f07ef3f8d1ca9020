//! CachedOp: a symbol's graph behind `MXCreateCachedOpEx` / `MXInvokeCachedOpEx`, as
//! hybridized Gluon blocks call it.
//!
//! Owns the flags 1.9.1's Gluon passes (`static_alloc`, `static_shape`, `is_dynamic`,
//! `inline_limit`, `forward_bulk_size`, `backward_bulk_size`, `data_indices`,
//! `param_indices`; values are `str()` of Python values), validated strictly (an unknown
//! flag or a bad value is an error, as stock's parameter parsing makes it), and invocation:
//! inputs in `list_inputs` order, outputs the symbol's heads. The allocation flags are
//! accepted; memory here comes from the storage pool either way. `forward_bulk_size` sets
//! the forward's bulk size; `backward_bulk_size` is accepted, and the backward pass (autograd
//! over the recorded operators) bulks as the configuration says.

use super::{Monitor, Runner};
use crate::error::{Error, Result};
use crate::ndarray::NDArray;
use crate::symbol::Symbol;

/// The flags of a CachedOp.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Flags {
    pub static_alloc: bool,
    pub static_shape: bool,
    pub is_dynamic: bool,
    pub inline_limit: i64,
    pub forward_bulk_size: Option<i64>,
    pub backward_bulk_size: Option<i64>,
    pub data_indices: Vec<usize>,
    pub param_indices: Vec<usize>,
}

fn parse_bool(k: &str, v: &str) -> Result<bool> {
    match v.trim() {
        "True" | "true" | "1" => Ok(true),
        "False" | "false" | "0" => Ok(false),
        _ => Err(Error::mxnet(format!("CachedOp flag {k}: invalid boolean '{v}'"))),
    }
}

fn parse_int(k: &str, v: &str) -> Result<i64> {
    v.trim().parse().map_err(|_| Error::mxnet(format!("CachedOp flag {k}: invalid integer '{v}'")))
}

fn parse_indices(k: &str, v: &str) -> Result<Vec<usize>> {
    let t = v.trim();
    let inner = t
        .strip_prefix('[')
        .and_then(|x| x.strip_suffix(']'))
        .or_else(|| t.strip_prefix('(').and_then(|x| x.strip_suffix(')')))
        .ok_or_else(|| Error::mxnet(format!("CachedOp flag {k}: expected a list of indices, got '{v}'")))?;
    inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<usize>().map_err(|_| Error::mxnet(format!("CachedOp flag {k}: invalid index '{s}' in '{v}'")))
        })
        .collect()
}

impl Flags {
    pub fn parse<'a>(kv: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<Flags> {
        let mut f = Flags { inline_limit: 2, ..Flags::default() };
        for (k, v) in kv {
            match k {
                "static_alloc" => f.static_alloc = parse_bool(k, v)?,
                "static_shape" => f.static_shape = parse_bool(k, v)?,
                "is_dynamic" => f.is_dynamic = parse_bool(k, v)?,
                "inline_limit" => f.inline_limit = parse_int(k, v)?,
                "forward_bulk_size" => f.forward_bulk_size = Some(parse_int(k, v)?),
                "backward_bulk_size" => f.backward_bulk_size = Some(parse_int(k, v)?),
                "data_indices" => f.data_indices = parse_indices(k, v)?,
                "param_indices" => f.param_indices = parse_indices(k, v)?,
                _ => {
                    return Err(Error::mxnet(format!(
                        "CachedOp has no flag '{k}' (flags: static_alloc, static_shape, is_dynamic, inline_limit, \
                         forward_bulk_size, backward_bulk_size, data_indices, param_indices)"
                    )))
                }
            }
        }
        Ok(f)
    }
}

/// A cached graph.
pub struct CachedOp {
    pub flags: Flags,
    runner: Runner,
    /// The operator hook (Gluon's `register_op_hook`).
    monitor: crate::sync::Mutex<Option<Monitor>>,
}

impl CachedOp {
    pub fn new<'a>(sym: &Symbol, flags: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<CachedOp> {
        let flags = Flags::parse(flags)?;
        let runner = Runner::new(sym)?;
        let n = runner.inputs.len();
        if let Some(&bad) = flags.data_indices.iter().chain(&flags.param_indices).find(|&&i| i >= n) {
            return Err(Error::mxnet(format!("CachedOp: input index {bad} is out of range for a graph of {n} inputs")));
        }
        Ok(CachedOp { flags, runner, monitor: crate::sync::Mutex::new(None) })
    }

    /// Show each later run's operator outputs (and inputs) to `monitor`; `None` stops.
    pub fn set_monitor(&self, monitor: Option<Monitor>) {
        *self.monitor.lock() = monitor;
    }

    pub fn num_inputs(&self) -> usize {
        self.runner.inputs.len()
    }

    /// Run on `inputs` (in `list_inputs` order); returns the outputs. Bulking follows the
    /// `forward_bulk_size` flag when given, the configuration otherwise.
    pub fn invoke(&self, inputs: &[NDArray]) -> Result<Vec<NDArray>> {
        let bulk = match self.flags.forward_bulk_size {
            Some(n) => n.max(0) as usize,
            None => self.runner.configured_bulk(crate::autograd::is_training())?,
        };
        // A clone: the hook may call back into the frontend, which may use this CachedOp.
        let monitor = self.monitor.lock().clone();
        self.runner.run_monitored(inputs, bulk, monitor.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse_strictly() {
        let f = Flags::parse([
            ("static_alloc", "True"),
            ("data_indices", "[0]"),
            ("param_indices", "[1, 2, 3]"),
            ("forward_bulk_size", "15"),
        ])
        .unwrap();
        assert!(f.static_alloc && !f.static_shape);
        assert_eq!(f.data_indices, vec![0]);
        assert_eq!(f.param_indices, vec![1, 2, 3]);
        assert_eq!(f.forward_bulk_size, Some(15));
        assert!(Flags::parse([("static_alloc", "maybe")]).is_err());
        assert!(Flags::parse([("no_such_flag", "1")]).unwrap_err().to_string().contains("no flag"));
        assert!(Flags::parse([("data_indices", "[x]")]).is_err());
        assert_eq!(Flags::parse([("param_indices", "[]")]).unwrap().param_indices, Vec::<usize>::new());
    }
}
