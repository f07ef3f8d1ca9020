//! The live configuration: values, their sources, read-once fixing and `MXSetEnv`.
//!
//! Owns: per-variable state (value set through `MXSetEnv`, the value a read-once variable was
//! fixed to), the precedence rule, the typo warnings, and the JSON `MXGetConfig` returns.
//! It reads the environment only through an [`EnvSource`], so tests use a private map instead
//! of the process environment.
//!
//! Precedence (seed 003's "global default, local override"), highest first:
//! 1. a per-call parameter (e.g. an operator's `cudnn_tune`), see [`Registry::resolve_with`];
//! 2. a value set through `MXSetEnv`;
//! 3. the process environment (then the variable's `fallback` name, if it has one);
//! 4. the built-in default of the registry table.
//!
//! A read-once variable is fixed by its first successful use and never changes afterwards;
//! a dynamic one is resolved again at every use. A bad value is never replaced by the default:
//! the use fails with an error naming the variable, the value and what is accepted.

use super::spec::{Reading, Value, VarSpec};
use super::suggest;
use crate::error::{Error, Result};
use crate::sync::Mutex;
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// Where the environment comes from.
pub trait EnvSource: Send + Sync {
    fn get(&self, name: &str) -> Option<String>;
    /// Set (`Some`) or remove (`None`) a variable.
    fn set(&self, name: &str, value: Option<&str>);
    /// Names of all variables currently set.
    fn names(&self) -> Vec<String>;
}

/// The process environment.
pub struct ProcessEnv;

impl EnvSource for ProcessEnv {
    fn get(&self, name: &str) -> Option<String> {
        std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
    }
    fn set(&self, name: &str, value: Option<&str>) {
        // std serialises its own environment accesses with a lock; C code that calls
        // getenv concurrently on another thread is outside that lock (a libc limitation that
        // stock MXNet shares). This is the only place the library writes the environment.
        match value {
            Some(v) => std::env::set_var(name, v),
            None => std::env::remove_var(name),
        }
    }
    fn names(&self) -> Vec<String> {
        std::env::vars_os().filter_map(|(k, _)| k.into_string().ok()).collect()
    }
}

/// An environment held in a map (tests, embedding).
#[derive(Default)]
pub struct MapEnv(Mutex<HashMap<String, String>>);

impl MapEnv {
    pub fn with(pairs: &[(&str, &str)]) -> Self {
        MapEnv(Mutex::new(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()))
    }
}

impl EnvSource for MapEnv {
    fn get(&self, name: &str) -> Option<String> {
        self.0.lock().get(name).cloned()
    }
    fn set(&self, name: &str, value: Option<&str>) {
        let mut m = self.0.lock();
        match value {
            Some(v) => m.insert(name.to_string(), v.to_string()),
            None => m.remove(name),
        };
    }
    fn names(&self) -> Vec<String> {
        self.0.lock().keys().cloned().collect()
    }
}

/// Where an effective value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A per-call parameter overrode the variable.
    PerCall,
    /// `MXSetEnv`.
    SetEnv,
    /// The process environment.
    Environment,
    /// The built-in default.
    Default,
    /// Neither set nor defaulted.
    Unset,
}

impl Source {
    pub fn name(self) -> &'static str {
        match self {
            Source::PerCall => "per-call parameter",
            Source::SetEnv => "MXSetEnv",
            Source::Environment => "environment",
            Source::Default => "default",
            Source::Unset => "unset",
        }
    }
}

/// An effective value and its source.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// `None` only for a variable without default that is not set.
    pub value: Option<Value>,
    /// The text the value was parsed from.
    pub raw: Option<String>,
    pub source: Source,
}

/// The value a read-once variable was fixed to, and when.
#[derive(Debug, Clone)]
struct Fixed {
    resolved: Resolved,
    consumer: &'static str,
    after_load: Duration,
}

#[derive(Debug, Default)]
struct VarState {
    /// `Some(v)`: set through `MXSetEnv` (`v = None`: unset through it).
    via_api: Option<Option<String>>,
    fixed: Option<Fixed>,
}

/// The registry of every known variable with its live state.
pub struct Registry {
    specs: &'static [VarSpec],
    index: HashMap<&'static str, usize>,
    state: Vec<Mutex<VarState>>,
    env: Box<dyn EnvSource>,
    created: Instant,
    warned: Mutex<HashSet<String>>,
}

impl Registry {
    pub fn new(specs: &'static [VarSpec], env: Box<dyn EnvSource>) -> Self {
        Registry {
            specs,
            index: specs.iter().enumerate().map(|(i, s)| (s.name, i)).collect(),
            state: specs.iter().map(|_| Mutex::new(VarState::default())).collect(),
            env,
            created: Instant::now(),
            warned: Mutex::new(HashSet::new()),
        }
    }

    pub fn specs(&self) -> &'static [VarSpec] {
        self.specs
    }

    pub fn spec(&self, name: &str) -> Option<&'static VarSpec> {
        self.index.get(name).map(|&i| &self.specs[i])
    }

    fn slot(&self, name: &str) -> Result<usize> {
        self.index.get(name).copied().ok_or_else(|| {
            let hint = suggest::closest(name, self.specs.iter().map(|s| s.name))
                .map(|s| format!(" (did you mean {s}?)"))
                .unwrap_or_default();
            Error::value(format!("unknown configuration variable {name:?}{hint}"))
        })
    }

    /// The effective raw text and its source, without parsing or fixing anything.
    fn effective_raw(&self, i: usize, st: &VarState) -> (Option<String>, Source) {
        let spec = &self.specs[i];
        if let Some(api) = &st.via_api {
            return match api {
                Some(v) => (Some(v.clone()), Source::SetEnv),
                None => self.fallback_or_default(spec),
            };
        }
        if let Some(v) = self.env.get(spec.name) {
            return (Some(v), Source::Environment);
        }
        self.fallback_or_default(spec)
    }

    fn fallback_or_default(&self, spec: &VarSpec) -> (Option<String>, Source) {
        if let Some(other) = spec.fallback.and_then(|f| self.index.get(f)) {
            let st = self.state[*other].lock();
            let (raw, source) = self.effective_raw(*other, &st);
            if raw.is_some() && source != Source::Default {
                return (raw, source);
            }
        }
        match spec.default {
            Some(d) => (Some(d.to_string()), Source::Default),
            None => (None, Source::Unset),
        }
    }

    fn parse_effective(&self, i: usize, st: &VarState) -> Result<Resolved> {
        let spec = &self.specs[i];
        let (raw, source) = self.effective_raw(i, st);
        let value = match &raw {
            Some(text) => Some(
                spec.ty
                    .parse(spec.name, text)
                    .map_err(|e| Error::value(format!("{} (value from {})", e.message(), source.name())))?,
            ),
            None => None,
        };
        Ok(Resolved { value, raw, source })
    }

    /// Use a variable: the value `consumer` must act on. A read-once variable is fixed by the
    /// first successful use; later uses return the fixed value whatever the environment says.
    pub fn get(&self, name: &str, consumer: &'static str) -> Result<Resolved> {
        let i = self.slot(name)?;
        let mut st = self.state[i].lock();
        if let Some(f) = &st.fixed {
            return Ok(f.resolved.clone());
        }
        let resolved = self.parse_effective(i, &st)?;
        if self.specs[i].reading == Reading::Once {
            st.fixed = Some(Fixed { resolved: resolved.clone(), consumer, after_load: self.created.elapsed() });
        }
        Ok(resolved)
    }

    /// The precedence lookup operators use: a per-call value wins; otherwise the variable's
    /// effective value converted by `convert`. The variable is not read at all when the
    /// per-call value is given, so a bad environment value cannot fail such a call.
    pub fn resolve_with<T>(
        &self,
        name: &str,
        per_call: Option<T>,
        consumer: &'static str,
        convert: impl FnOnce(&Value) -> Result<T>,
    ) -> Result<(Option<T>, Source)> {
        if let Some(v) = per_call {
            return Ok((Some(v), Source::PerCall));
        }
        let r = self.get(name, consumer)?;
        match r.value {
            Some(v) => Ok((Some(convert(&v)?), r.source)),
            None => Ok((None, r.source)),
        }
    }

    /// Typed helpers over [`Registry::get`]. A type mismatch between the caller and the table
    /// is a bug in the runtime and reported as an internal error.
    pub fn get_int(&self, name: &str, consumer: &'static str) -> Result<Option<i64>> {
        self.typed(name, consumer, Value::as_int)
    }
    pub fn get_bool(&self, name: &str, consumer: &'static str) -> Result<Option<bool>> {
        self.typed(name, consumer, Value::as_bool)
    }
    pub fn get_float(&self, name: &str, consumer: &'static str) -> Result<Option<f64>> {
        self.typed(name, consumer, Value::as_float)
    }
    pub fn get_str(&self, name: &str, consumer: &'static str) -> Result<Option<String>> {
        self.typed(name, consumer, |v| v.as_str().map(str::to_string))
    }

    fn typed<T>(&self, name: &str, consumer: &'static str, pick: impl Fn(&Value) -> Option<T>) -> Result<Option<T>> {
        match self.get(name, consumer)?.value {
            None => Ok(None),
            Some(v) => pick(&v)
                .map(Some)
                .ok_or_else(|| Error::internal(format!("{consumer} read {name} as the wrong type ({v:?})"))),
        }
    }

    /// `MXSetEnv`: set (`Some`) or unset (`None`) a variable in the process environment.
    /// A registry variable is validated first; a read-once variable that is already fixed
    /// accepts only its fixed value. Unknown `MXNET_*` names are set with a typo warning.
    pub fn set_env(&self, name: &str, value: Option<&str>) -> Result<()> {
        if name.is_empty() || name.contains('=') || name.contains('\0') {
            return Err(Error::value(format!("invalid environment variable name {name:?}")));
        }
        if value.is_some_and(|v| v.contains('\0')) {
            return Err(Error::value(format!("value for {name} contains a NUL byte")));
        }
        let Some(&i) = self.index.get(name) else {
            if let Some(w) = self.unknown_warning(name) {
                self.warn_once(name, &w);
            }
            self.env.set(name, value);
            return Ok(());
        };
        let spec = &self.specs[i];
        let mut st = self.state[i].lock();
        let parsed = match value {
            Some(v) => Some(
                spec.ty
                    .parse(name, v)
                    .map_err(|e| Error::value(format!("{} (value from {})", e.message(), Source::SetEnv.name())))?,
            ),
            None => None,
        };
        if let Some(f) = &st.fixed {
            // Allowed only when the effective value would not change.
            let same = match parsed {
                Some(v) => f.resolved.value.as_ref() == Some(&v),
                None => matches!(f.resolved.source, Source::Default | Source::Unset),
            };
            if !same {
                return Err(Error::value(format!(
                    "{name} is read once and was already fixed to {} (from {}) at its first use \
                     by {}, {:.3} s after the library loaded; it cannot change in this process. \
                     Set it before that use (e.g. in the environment before starting)",
                    f.resolved.raw.as_deref().map(|r| format!("{r:?}")).unwrap_or("unset".into()),
                    f.resolved.source.name(),
                    f.consumer,
                    f.after_load.as_secs_f64()
                )));
            }
        }
        self.env.set(name, value);
        st.via_api = Some(value.map(str::to_string));
        Ok(())
    }

    /// `MXGetEnv`: the live process environment (not the effective value).
    pub fn env_value(&self, name: &str) -> Option<String> {
        self.env.get(name)
    }

    /// The warning for an `MXNET_*`/`NNVM_*` name the registry does not know, if it is one.
    pub fn unknown_warning(&self, name: &str) -> Option<String> {
        if !(name.starts_with("MXNET_") || name.starts_with("NNVM_")) || self.index.contains_key(name) {
            return None;
        }
        let hint = match suggest::closest(name, self.specs.iter().map(|s| s.name)) {
            Some(s) => format!("; did you mean {s}?"),
            None => String::new(),
        };
        Some(format!(
            "mxnet-rt warning: environment variable {name} is not known to this runtime; \
             nothing reads it{hint}"
        ))
    }

    /// Warnings for every unknown `MXNET_*` variable now in the environment, sorted by name.
    pub fn unknown_in_env(&self) -> Vec<(String, String)> {
        let mut names = self.env.names();
        names.sort();
        names.into_iter().filter_map(|n| self.unknown_warning(&n).map(|w| (n, w))).collect()
    }

    /// Print each unknown variable's warning on stderr, once per name per process.
    pub fn warn_unknown_in_env(&self) {
        for (name, w) in self.unknown_in_env() {
            self.warn_once(&name, &w);
        }
    }

    fn warn_once(&self, name: &str, warning: &str) {
        if self.warned.lock().insert(name.to_string()) {
            eprintln!("{warning}");
        }
    }

    /// `MXGetConfig` for one variable. Reading it does not count as a use.
    pub fn describe(&self, name: &str) -> Result<serde_json::Value> {
        let i = self.slot(name)?;
        Ok(self.describe_at(i))
    }

    /// `MXGetConfig(NULL)`: every variable, in table order.
    pub fn describe_all(&self) -> serde_json::Value {
        serde_json::Value::Array((0..self.specs.len()).map(|i| self.describe_at(i)).collect())
    }

    fn describe_at(&self, i: usize) -> serde_json::Value {
        let spec = &self.specs[i];
        let st = self.state[i].lock();
        let (resolved, error, fixed) = match &st.fixed {
            Some(f) => (Some(f.resolved.clone()), None, Some(f)),
            None => match self.parse_effective(i, &st) {
                Ok(r) => (Some(r), None, None),
                Err(e) => (None, Some(e.to_string()), None),
            },
        };
        let (value, source) = match &resolved {
            Some(r) => (r.value.as_ref().map(Value::to_json), r.source.name()),
            None => (None, self.effective_raw(i, &st).1.name()),
        };
        json!({
            "name": spec.name,
            "value": value,
            "default": spec.default,
            "type": spec.ty.type_name(),
            "accepted": spec.ty.accepted(),
            "doc": spec.doc,
            "category": spec.category,
            "read_once": spec.reading == Reading::Once,
            "already_read": fixed.is_some(),
            "fixed_by": fixed.map(|f| f.consumer),
            "source": source,
            "env": self.env.get(spec.name),
            "fallback": spec.fallback,
            "status": spec.status.name(),
            "valid": error.is_none(),
            "error": error,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::vars::VARS;

    fn reg(pairs: &[(&str, &str)]) -> Registry {
        Registry::new(VARS, Box::new(MapEnv::with(pairs)))
    }

    #[test]
    fn default_environment_setenv_precedence() {
        let r = reg(&[]);
        let got = r.get("MXNET_EXEC_NUM_TEMP", "test").unwrap();
        assert_eq!((got.value, got.source), (Some(Value::Int(1)), Source::Default));

        let r = reg(&[("MXNET_EXEC_NUM_TEMP", "3")]);
        let got = r.get("MXNET_EXEC_NUM_TEMP", "test").unwrap();
        assert_eq!((got.value, got.source), (Some(Value::Int(3)), Source::Environment));

        r.set_env("MXNET_EXEC_NUM_TEMP", Some("5")).unwrap();
        // MXSetEnv wins over a later direct change of the environment.
        r.env.set("MXNET_EXEC_NUM_TEMP", Some("7"));
        let got = r.get("MXNET_EXEC_NUM_TEMP", "test").unwrap();
        assert_eq!((got.value, got.source), (Some(Value::Int(5)), Source::SetEnv));

        // Unsetting through MXSetEnv falls back to the default, not the environment.
        r.set_env("MXNET_EXEC_NUM_TEMP", None).unwrap();
        assert_eq!(r.env_value("MXNET_EXEC_NUM_TEMP"), None);
        let got = r.get("MXNET_EXEC_NUM_TEMP", "test").unwrap();
        assert_eq!((got.value, got.source), (Some(Value::Int(1)), Source::Default));
    }

    #[test]
    fn per_call_parameter_wins_and_skips_the_variable() {
        let r = reg(&[("MXNET_CUDNN_AUTOTUNE_DEFAULT", "2")]);
        let conv = |v: &Value| Ok(v.as_int().unwrap());
        assert_eq!(
            r.resolve_with("MXNET_CUDNN_AUTOTUNE_DEFAULT", Some(0), "conv", conv).unwrap(),
            (Some(0), Source::PerCall)
        );
        assert_eq!(
            r.resolve_with("MXNET_CUDNN_AUTOTUNE_DEFAULT", None, "conv", conv).unwrap(),
            (Some(2), Source::Environment)
        );
        r.set_env("MXNET_CUDNN_AUTOTUNE_DEFAULT", Some("1")).unwrap();
        assert_eq!(
            r.resolve_with("MXNET_CUDNN_AUTOTUNE_DEFAULT", None, "conv", conv).unwrap(),
            (Some(1), Source::SetEnv)
        );
        // A bad global value does not fail a call that overrides it...
        let r = reg(&[("MXNET_CUDNN_AUTOTUNE_DEFAULT", "7")]);
        assert!(r.resolve_with("MXNET_CUDNN_AUTOTUNE_DEFAULT", Some(1), "conv", conv).is_ok());
        // ...but fails one that depends on it.
        let e = r.resolve_with("MXNET_CUDNN_AUTOTUNE_DEFAULT", None, "conv", conv).unwrap_err();
        assert!(e.to_string().contains("MXNET_CUDNN_AUTOTUNE_DEFAULT=\"7\""), "{e}");
    }

    #[test]
    fn bad_values_fail_every_use_and_never_default() {
        let r = reg(&[("MXNET_ENGINE_TYPE", "NativeEngine"), ("MXNET_CPU_WORKER_NTHREADS", "-2")]);
        for _ in 0..2 {
            let e = r.get("MXNET_ENGINE_TYPE", "engine start").unwrap_err().to_string();
            assert!(e.starts_with("ValueError: environment variable MXNET_ENGINE_TYPE=\"NativeEngine\""));
            assert!(e.contains("did you mean NaiveEngine?") && e.contains("value from environment"));
        }
        assert!(r.get_int("MXNET_CPU_WORKER_NTHREADS", "x").is_err());
        // A failed use does not fix a read-once variable: a corrected value still applies.
        r.set_env("MXNET_ENGINE_TYPE", Some("NaiveEngine")).unwrap();
        assert_eq!(r.get_str("MXNET_ENGINE_TYPE", "engine start").unwrap().as_deref(), Some("NaiveEngine"));
        // MXSetEnv validates before touching anything.
        let e = r.set_env("MXNET_CPU_WORKER_NTHREADS", Some("many")).unwrap_err();
        assert!(e.to_string().contains("an integer in [1, 1024]"), "{e}");
        // Every numeric variable has a sensible range: a count that would exhaust memory is
        // refused, not reported valid and then allocated.
        for (name, huge) in [("MXNET_EXEC_NUM_TEMP", "2147483648"), ("MXNET_EXEC_NUM_TEMP", "100000000")] {
            let e = r.set_env(name, Some(huge)).unwrap_err().to_string();
            assert!(e.contains("an integer in [1, 64]"), "{e}");
        }
        assert!(e.to_string().contains("(value from MXSetEnv)"), "{e}");
        assert_eq!(r.env_value("MXNET_CPU_WORKER_NTHREADS").as_deref(), Some("-2"));
    }

    #[test]
    fn read_once_is_fixed_at_first_use() {
        let r = reg(&[("MXNET_ENGINE_TYPE", "ThreadedEngine")]);
        assert!(r.describe("MXNET_ENGINE_TYPE").unwrap()["already_read"] == json!(false));
        // Before first use MXSetEnv may change it.
        r.set_env("MXNET_ENGINE_TYPE", Some("NaiveEngine")).unwrap();
        assert_eq!(r.get_str("MXNET_ENGINE_TYPE", "engine start").unwrap().as_deref(), Some("NaiveEngine"));
        let e = r.set_env("MXNET_ENGINE_TYPE", Some("ThreadedEngine")).unwrap_err().to_string();
        assert!(e.contains("read once") && e.contains("\"NaiveEngine\"") && e.contains("engine start"), "{e}");
        assert!(e.contains("from MXSetEnv"), "{e}");
        assert!(r.set_env("MXNET_ENGINE_TYPE", None).is_err());
        // Unsetting one that was fixed from its default changes nothing, so it is allowed.
        assert_eq!(r.get_int("MXNET_CPU_WORKER_NTHREADS", "engine start").unwrap(), Some(1));
        r.set_env("MXNET_CPU_WORKER_NTHREADS", None).unwrap();
        assert!(r.set_env("MXNET_CPU_WORKER_NTHREADS", Some("2")).is_err());
        // Setting the fixed value again is harmless.
        r.set_env("MXNET_ENGINE_TYPE", Some("NaiveEngine")).unwrap();
        // A direct environment change is ignored after fixing.
        r.env.set("MXNET_ENGINE_TYPE", Some("ThreadedEngine"));
        assert_eq!(r.get_str("MXNET_ENGINE_TYPE", "other").unwrap().as_deref(), Some("NaiveEngine"));
        let d = r.describe("MXNET_ENGINE_TYPE").unwrap();
        assert_eq!(d["already_read"], json!(true));
        assert_eq!(d["fixed_by"], json!("engine start"));
        assert_eq!(d["value"], json!("NaiveEngine"));
        assert_eq!(d["env"], json!("ThreadedEngine"));
    }

    #[test]
    fn dynamic_takes_effect_at_next_use() {
        let r = reg(&[]);
        assert_eq!(r.get_int("MXNET_CPU_PARALLEL_COPY_SIZE", "copy").unwrap(), Some(200000));
        r.set_env("MXNET_CPU_PARALLEL_COPY_SIZE", Some("10")).unwrap();
        assert_eq!(r.get_int("MXNET_CPU_PARALLEL_COPY_SIZE", "copy").unwrap(), Some(10));
        r.set_env("MXNET_CPU_PARALLEL_COPY_SIZE", Some("20")).unwrap();
        assert_eq!(r.get_int("MXNET_CPU_PARALLEL_COPY_SIZE", "copy").unwrap(), Some(20));
        assert_eq!(r.describe("MXNET_CPU_PARALLEL_COPY_SIZE").unwrap()["already_read"], json!(false));
    }

    #[test]
    fn typed_getters_cover_every_type() {
        let r = reg(&[
            ("MXNET_KVSTORE_TREE_LINK_USAGE_PENALTY", "0.25"),
            ("MXNET_EXEC_ENABLE_INPLACE", "false"),
            ("MXNET_HOME", "/data/mx"),
        ]);
        assert_eq!(r.get_float("MXNET_KVSTORE_TREE_LINK_USAGE_PENALTY", "t").unwrap(), Some(0.25));
        assert_eq!(r.get_bool("MXNET_EXEC_ENABLE_INPLACE", "t").unwrap(), Some(false));
        assert_eq!(r.get_str("MXNET_HOME", "t").unwrap().as_deref(), Some("/data/mx"));
        assert_eq!(r.get_int("MXNET_USE_NUM_CORES_OPERATOR_TUNING", "t").unwrap(), None);
        assert!(r.get_int("MXNET_HOME", "t").unwrap_err().to_string().starts_with("InternalError"));
        assert!(r.get("MXNET_NOT_A_VAR", "t").is_err());
    }

    #[test]
    fn fallback_name_is_used_when_primary_unset() {
        let r = reg(&[("MXNET_ENABLE_OPERATOR_TUNING", "float32")]);
        let got = r.get("MXNET_USE_OPERATOR_TUNING", "tuning").unwrap();
        assert_eq!(got.value, Some(Value::DTypes(Some(vec!["float32".into()]))));
        assert_eq!(got.source, Source::Environment);
        let r = reg(&[("MXNET_ENABLE_OPERATOR_TUNING", "float32"), ("MXNET_USE_OPERATOR_TUNING", "0")]);
        assert_eq!(r.get("MXNET_USE_OPERATOR_TUNING", "t").unwrap().value, Some(Value::DTypes(Some(vec![]))));
        let r = reg(&[]);
        assert_eq!(r.get("MXNET_USE_OPERATOR_TUNING", "t").unwrap().value, Some(Value::DTypes(None)));
    }

    #[test]
    fn unknown_names_are_warned_with_a_suggestion() {
        let r = reg(&[
            ("MXNET_GPU_WORKER_NTHREAD", "3"),
            ("MXNET_COMPLETELY_UNRELATED_SETTING", "1"),
            ("MXNET_HOME", "/x"),
            ("PATH", "/bin"),
        ]);
        let w = r.unknown_in_env();
        assert_eq!(w.len(), 2, "{w:?}");
        assert_eq!(w[1].0, "MXNET_GPU_WORKER_NTHREAD");
        assert!(w[1].1.contains("did you mean MXNET_GPU_WORKER_NTHREADS?"), "{}", w[1].1);
        assert!(!w[0].1.contains("did you mean"), "{}", w[0].1);
        // MXSetEnv of an unknown name still sets it.
        r.set_env("MXNET_GPU_COPY_NTHREAD", Some("1")).unwrap();
        assert_eq!(r.env_value("MXNET_GPU_COPY_NTHREAD").as_deref(), Some("1"));
        // Non-MXNet names are none of our business.
        r.set_env("SOME_OTHER", Some("v")).unwrap();
        assert!(r.unknown_warning("SOME_OTHER").is_none());
    }

    #[test]
    fn set_env_rejects_bad_names() {
        let r = reg(&[]);
        assert!(r.set_env("", Some("1")).is_err());
        assert!(r.set_env("A=B", Some("1")).is_err());
        assert!(r.set_env("A", Some("x\0y")).is_err());
    }

    #[test]
    fn describe_reports_invalid_values_without_failing() {
        let r = reg(&[("MXNET_GPU_MEM_POOL_TYPE", "Bucket")]);
        let d = r.describe("MXNET_GPU_MEM_POOL_TYPE").unwrap();
        assert_eq!(d["valid"], json!(false));
        assert_eq!(d["source"], json!("environment"));
        assert!(d["error"].as_str().unwrap().contains("one of Naive, Round, Unpooled"));
        let all = r.describe_all();
        assert_eq!(all.as_array().unwrap().len(), VARS.len());
        assert!(r.describe("MXNET_GPU_MEM_POOL_TYP").unwrap_err().to_string().contains("did you mean"));
    }
}
