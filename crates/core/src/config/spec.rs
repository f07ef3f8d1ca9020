//! Variable specifications: the type of each configuration variable and its strict parser.
//!
//! Owns: [`VarSpec`] (what the registry table declares), [`VarType`] (accepted values) and
//! [`Value`] (a parsed value). Parsing never falls back to a default: a string that is not an
//! accepted value is an error naming the variable, the value and what is accepted.

use crate::error::{Error, Result};
use serde_json::json;

/// Whether a variable is fixed at its first use or read again at each use
/// (MegEngine's 仅首次设置生效, seed 002).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// Read at first use, then fixed for the life of the process.
    Once,
    /// Read at each use; a change takes effect at the next use.
    Dynamic,
}

/// What a variable does in this build: honest about configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Read by the runtime; changing it changes behaviour.
    Active,
    /// Validated and reported, but the part of the runtime that reads it is not built yet
    /// (GPU, KVStore, MKLDNN, ...). Setting it has no effect yet.
    Reserved,
    /// Read by the Python frontend or loaders, not by the library itself.
    Frontend,
}

impl Status {
    pub fn name(self) -> &'static str {
        match self {
            Status::Active => "active",
            Status::Reserved => "reserved",
            Status::Frontend => "frontend",
        }
    }
}

/// Accepted values of a variable.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum VarType {
    /// A decimal integer within `[min, max]`.
    Int { min: i64, max: i64 },
    /// `0`, `1`, `true` or `false` (case-insensitive), as dmlc's bool parser accepts.
    Bool,
    /// A finite decimal number within `[min, max]`.
    Float { min: f64, max: f64 },
    /// Exactly one of the listed strings (case-sensitive, as stock compares them).
    Choice(&'static [&'static str]),
    /// An absolute filesystem path.
    AbsPath,
    /// A filesystem path (relative paths allowed), non-empty.
    Path,
    /// An `http://`, `https://` or `file://` URL.
    Url,
    /// `0` (disable all), `1` (enable all) or a comma-separated list of dtype names
    /// (operator tuning, seed 001).
    DTypeList,
}

/// Dtype names accepted by [`VarType::DTypeList`].
pub const TUNING_DTYPES: &[&str] = &["float32", "float64", "float16", "uint8", "int8", "int32", "int64", "bool"];

/// A parsed value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Int(i64),
    Bool(bool),
    Float(f64),
    Str(String),
    /// `None`: enable all, `Some(list)`: enable only these dtypes (empty list: disable all).
    DTypes(Option<Vec<String>>),
}

impl Value {
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Value::Int(v) => json!(v),
            Value::Bool(v) => json!(v),
            Value::Float(v) => json!(v),
            Value::Str(v) => json!(v),
            Value::DTypes(None) => json!("all"),
            Value::DTypes(Some(list)) => json!(list),
        }
    }
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(v) => Some(*v),
            _ => None,
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(v) => Some(*v),
            _ => None,
        }
    }
    pub fn as_float(&self) -> Option<f64> {
        match self {
            Value::Float(v) => Some(*v),
            _ => None,
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(v) => Some(v),
            _ => None,
        }
    }
}

/// One row of the registry table.
#[derive(Debug, Clone, Copy)]
pub struct VarSpec {
    pub name: &'static str,
    pub ty: VarType,
    /// The built-in default as it would be written in the environment; `None`: unset.
    pub default: Option<&'static str>,
    pub reading: Reading,
    pub status: Status,
    /// Section of the reference (seed 001's headings).
    pub category: &'static str,
    /// One-line documentation.
    pub doc: &'static str,
    /// Another name whose value this variable takes when it is itself unset.
    pub fallback: Option<&'static str>,
}

impl VarType {
    /// Short type name for documentation and `MXGetConfig`.
    pub fn type_name(&self) -> &'static str {
        match self {
            VarType::Int { .. } => "int",
            VarType::Bool => "bool",
            VarType::Float { .. } => "float",
            VarType::Choice(_) => "choice",
            VarType::AbsPath => "absolute path",
            VarType::Path => "path",
            VarType::Url => "url",
            VarType::DTypeList => "dtype list",
        }
    }

    /// Human-readable description of the accepted values.
    pub fn accepted(&self) -> String {
        match self {
            VarType::Int { min, max } => match (*min, *max) {
                (lo, i64::MAX) => format!("an integer >= {lo}"),
                (lo, hi) => format!("an integer in [{lo}, {hi}]"),
            },
            VarType::Bool => "0, 1, true or false".to_string(),
            VarType::Float { min, max } => {
                if *max == f64::MAX {
                    format!("a number >= {min}")
                } else {
                    format!("a number in [{min}, {max}]")
                }
            }
            VarType::Choice(options) => format!("one of {}", options.join(", ")),
            VarType::AbsPath => "an absolute path".to_string(),
            VarType::Path => "a non-empty path".to_string(),
            VarType::Url => "an http://, https:// or file:// URL".to_string(),
            VarType::DTypeList => {
                format!("0, 1, or a comma-separated list of {}", TUNING_DTYPES.join(", "))
            }
        }
    }

    /// Parse `raw` strictly. The error names `name`, the value and what is accepted.
    pub fn parse(&self, name: &str, raw: &str) -> Result<Value> {
        let bad = |why: Option<String>| {
            let mut msg = format!("environment variable {name}={raw:?} is not valid: expected {}", self.accepted());
            if let Some(why) = why {
                msg.push_str(&format!(" ({why})"));
            }
            Error::value(msg)
        };
        let trimmed = raw.trim();
        match *self {
            VarType::Int { min, max } => {
                let v: i64 = trimmed.parse().map_err(|_| bad(None))?;
                if v < min || v > max {
                    return Err(bad(Some("out of range".into())));
                }
                Ok(Value::Int(v))
            }
            VarType::Bool => match trimmed.to_ascii_lowercase().as_str() {
                "1" | "true" => Ok(Value::Bool(true)),
                "0" | "false" => Ok(Value::Bool(false)),
                _ => Err(bad(None)),
            },
            VarType::Float { min, max } => {
                let v: f64 = trimmed.parse().map_err(|_| bad(None))?;
                if !v.is_finite() || v < min || v > max {
                    return Err(bad(Some("out of range".into())));
                }
                Ok(Value::Float(v))
            }
            VarType::Choice(options) => {
                if options.contains(&trimmed) {
                    Ok(Value::Str(trimmed.to_string()))
                } else {
                    let hint = crate::config::suggest::closest(trimmed, options.iter().copied())
                        .map(|s| format!("did you mean {s}?"));
                    Err(bad(hint))
                }
            }
            VarType::AbsPath => {
                if !trimmed.is_empty() && std::path::Path::new(raw).is_absolute() {
                    Ok(Value::Str(raw.to_string()))
                } else {
                    Err(bad(None))
                }
            }
            VarType::Path => {
                if trimmed.is_empty() {
                    Err(bad(None))
                } else {
                    Ok(Value::Str(raw.to_string()))
                }
            }
            VarType::Url => {
                let ok = ["http://", "https://", "file://"]
                    .iter()
                    .any(|p| trimmed.len() > p.len() && trimmed.starts_with(p));
                if ok && !trimmed.contains(char::is_whitespace) {
                    Ok(Value::Str(trimmed.to_string()))
                } else {
                    Err(bad(None))
                }
            }
            VarType::DTypeList => match trimmed {
                "0" => Ok(Value::DTypes(Some(Vec::new()))),
                "1" => Ok(Value::DTypes(None)),
                _ => {
                    let mut list = Vec::new();
                    for item in trimmed.split(',').map(str::trim) {
                        if !TUNING_DTYPES.contains(&item) {
                            return Err(bad(Some(format!("unknown dtype {item:?}"))));
                        }
                        if !list.iter().any(|d| d == item) {
                            list.push(item.to_string());
                        }
                    }
                    Ok(Value::DTypes(Some(list)))
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const N: &str = "MXNET_TEST_VAR";

    #[test]
    fn int_good_and_bad() {
        let t = VarType::Int { min: 1, max: i64::MAX };
        assert_eq!(t.parse(N, "4").unwrap(), Value::Int(4));
        assert_eq!(t.parse(N, " 7 ").unwrap(), Value::Int(7));
        for bad in ["-1", "0", "abc", "", "1.5", "99999999999999999999"] {
            let e = t.parse(N, bad).unwrap_err().to_string();
            assert!(e.starts_with("ValueError: environment variable MXNET_TEST_VAR="), "{e}");
            assert!(e.contains("an integer >= 1"), "{e}");
        }
        let ranged = VarType::Int { min: 0, max: 2 };
        assert!(ranged.parse(N, "2").is_ok());
        assert!(ranged.parse(N, "3").unwrap_err().to_string().contains("[0, 2]"));
    }

    #[test]
    fn bool_forms() {
        for (s, v) in [("1", true), ("0", false), ("true", true), ("False", false), ("TRUE", true)] {
            assert_eq!(VarType::Bool.parse(N, s).unwrap(), Value::Bool(v));
        }
        for bad in ["2", "yes", "", "on"] {
            assert!(VarType::Bool.parse(N, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn float_range_and_finiteness() {
        let t = VarType::Float { min: 0.0, max: 1.0 };
        assert_eq!(t.parse(N, "0.7").unwrap(), Value::Float(0.7));
        for bad in ["1.5", "-0.1", "nan", "inf", "x"] {
            assert!(t.parse(N, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn choice_is_exact_and_suggests() {
        let t = VarType::Choice(&["NaiveEngine", "ThreadedEngine", "ThreadedEnginePerDevice"]);
        assert!(t.parse(N, "NaiveEngine").is_ok());
        let e = t.parse(N, "NativeEngine").unwrap_err().to_string();
        assert!(e.contains("\"NativeEngine\""), "{e}");
        assert!(e.contains("one of NaiveEngine, ThreadedEngine, ThreadedEnginePerDevice"), "{e}");
        assert!(e.contains("did you mean NaiveEngine?"), "{e}");
        assert!(t.parse(N, "naiveengine").is_err());
    }

    #[test]
    fn paths_and_urls() {
        assert!(VarType::AbsPath.parse(N, "/usr/lib/libmxnet.so").is_ok());
        assert!(VarType::AbsPath.parse(N, "lib/libmxnet.so").is_err());
        assert!(VarType::AbsPath.parse(N, "").is_err());
        assert!(VarType::Path.parse(N, "data").is_ok());
        assert!(VarType::Path.parse(N, " ").is_err());
        assert!(VarType::Url.parse(N, "https://example.org/repo/").is_ok());
        assert!(VarType::Url.parse(N, "ftp://x").is_err());
        assert!(VarType::Url.parse(N, "https://").is_err());
    }

    #[test]
    fn dtype_lists() {
        let t = VarType::DTypeList;
        assert_eq!(t.parse(N, "1").unwrap(), Value::DTypes(None));
        assert_eq!(t.parse(N, "0").unwrap(), Value::DTypes(Some(vec![])));
        assert_eq!(
            t.parse(N, "float32, float16,float32").unwrap(),
            Value::DTypes(Some(vec!["float32".into(), "float16".into()]))
        );
        assert!(t.parse(N, "float33").unwrap_err().to_string().contains("unknown dtype"));
        assert!(t.parse(N, "").is_err());
    }
}
