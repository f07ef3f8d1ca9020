//! Operator parameters: schemas and strict parsing of the strings the frontend sends.
//!
//! Owns: [`ParamSpec`] (name, type, default or required, doc — served to the frontend through
//! `MXSymbolGetAtomicSymbolInfo`), [`PType`] (the value types), [`Value`] and [`Attrs`] (one
//! parsed value per declared parameter). Values arrive as `str()` of Python values: `True`,
//! `0`, `None`, `(2, 3)`, `(3,)`, `[1, 2, 0]`, `(None, 1)`, `1.5951227848834706`, `inf`,
//! `cpu(0)`, dtype names. Parsing is strict: an unknown key or a bad value is a `ValueError`
//! naming the operator, the parameter, the value and what is accepted. The one exception is an
//! operator declared open ([`Attrs::parse_open`], `Custom`): it keeps unknown keys, in order,
//! as extra string parameters for its implementation to interpret.
//!
//! Operators declare their parameters with [`op_params!`]: the table and a typed struct from
//! one declaration, so kernels read `p.num_hidden`, not a string key.

use crate::context::{Context, DevType};
use crate::error::{Error, Result};
use crate::ndarray::DType;

/// The type of a parameter's value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PType {
    /// `True`/`False`/`true`/`false`/`1`/`0`.
    Bool,
    /// A (64-bit) integer.
    Int,
    /// A float (`inf`, `-inf`, `nan` accepted).
    Float,
    /// A tuple of integers: `(2, 3)`, `[1, 2]`, `(3,)`, `()` or a bare integer `5`.
    Shape,
    /// A tuple whose entries may be `None`: `(None, 1)`.
    OptShape,
    /// A tuple of floats: `(0.5, 1.0)`.
    FloatTuple,
    /// One of the listed strings.
    Enum(&'static [&'static str]),
    /// A dtype name (`float32`, ...).
    DType,
    /// A context string (`cpu(0)`, `gpu(1)`, `cpu_pinned(0)`, `cpu_shared(0)`).
    Ctx,
    /// Any string.
    Str,
}

/// One declared parameter.
#[derive(Debug, Clone, Copy)]
pub struct ParamSpec {
    pub name: &'static str,
    pub ty: PType,
    /// Whether `None` is accepted (the value types read "int or None", ...).
    pub nullable: bool,
    /// The default as a string (parsed like a sent value); `None` makes the parameter required.
    pub default: Option<&'static str>,
    pub doc: &'static str,
}

impl ParamSpec {
    pub const fn req(name: &'static str, ty: PType, doc: &'static str) -> Self {
        ParamSpec { name, ty, nullable: false, default: None, doc }
    }
    pub const fn opt(name: &'static str, ty: PType, default: &'static str, doc: &'static str) -> Self {
        ParamSpec { name, ty, nullable: false, default: Some(default), doc }
    }
    /// An optional parameter that also accepts `None`.
    pub const fn or_none(name: &'static str, ty: PType, default: &'static str, doc: &'static str) -> Self {
        ParamSpec { name, ty, nullable: true, default: Some(default), doc }
    }

    /// The type string `MXSymbolGetAtomicSymbolInfo` reports (stock style, e.g.
    /// `int or None, optional, default='None'`, `Shape(tuple), required`).
    pub fn type_string(&self) -> String {
        let base = match self.ty {
            PType::Bool => "boolean".to_string(),
            PType::Int => "int".to_string(),
            PType::Float => "float".to_string(),
            PType::Shape => "Shape(tuple)".to_string(),
            PType::OptShape => "Shape(tuple)".to_string(),
            PType::FloatTuple => "tuple of <float>".to_string(),
            PType::Enum(_) => enum_string(self.ty),
            PType::DType => enum_string(PType::Enum(DTYPE_NAMES)),
            PType::Ctx | PType::Str => "string".to_string(),
        };
        let base = if self.nullable { format!("{base} or None") } else { base };
        match self.default {
            None => format!("{base}, required"),
            Some(d) => format!("{base}, optional, default='{d}'"),
        }
    }

    fn expected(&self) -> String {
        let what = match self.ty {
            PType::Bool => "a boolean (True, False, 1 or 0)".to_string(),
            PType::Int => "an integer".to_string(),
            PType::Float => "a number".to_string(),
            PType::Shape => "a tuple of integers such as (2, 3)".to_string(),
            PType::OptShape => "a tuple of integers or None such as (None, 1)".to_string(),
            PType::FloatTuple => "a tuple of numbers such as (0.5, 1.0)".to_string(),
            PType::Enum(names) => format!("one of {}", names.join(", ")),
            PType::DType => format!("a dtype name ({})", DTYPE_NAMES.join(", ")),
            PType::Ctx => "a context such as cpu(0)".to_string(),
            PType::Str => "a string".to_string(),
        };
        if self.nullable {
            format!("{what} or None")
        } else {
            what
        }
    }

    /// Parse `text` as this parameter's value.
    pub fn parse(&self, text: &str) -> std::result::Result<Value, String> {
        let t = text.trim();
        if (self.nullable && t == "None") || (self.ty == PType::Ctx && (t.is_empty() || t == "None")) {
            return Ok(Value::None);
        }
        let bad = || format!("expected {}", self.expected());
        Ok(match self.ty {
            PType::Bool => Value::Bool(match t {
                "True" | "true" | "1" => true,
                "False" | "false" | "0" => false,
                _ => return Err(bad()),
            }),
            PType::Int => Value::Int(parse_int(t).ok_or_else(bad)?),
            PType::Float => Value::Float(parse_float(t).ok_or_else(bad)?),
            PType::Shape => Value::Shape(
                parse_tuple(t, |s| parse_int(s).map(Some))
                    .ok_or_else(bad)?
                    .into_iter()
                    .map(|v| v.unwrap_or_default())
                    .collect(),
            ),
            PType::OptShape => Value::OptShape(
                parse_tuple(t, |s| if s == "None" { Some(None) } else { parse_int(s).map(Some) }).ok_or_else(bad)?,
            ),
            PType::FloatTuple => Value::FloatTuple(
                parse_tuple(t, |s| parse_float(s).map(Some))
                    .ok_or_else(bad)?
                    .into_iter()
                    .map(|v| v.unwrap_or_default())
                    .collect(),
            ),
            PType::Enum(names) => {
                let s = t.trim_matches('\'');
                if !names.contains(&s) {
                    return Err(bad());
                }
                Value::Str(s.to_string())
            }
            PType::DType => Value::DType(dtype_from_name(t).ok_or_else(bad)?),
            PType::Ctx => Value::Ctx(parse_ctx(t).ok_or_else(bad)?),
            PType::Str => Value::Str(text.to_string()),
        })
    }
}

fn enum_string(ty: PType) -> String {
    match ty {
        PType::Enum(names) => {
            let quoted: Vec<String> = names.iter().map(|n| format!("'{n}'")).collect();
            format!("{{{}}}", quoted.join(", "))
        }
        _ => String::new(),
    }
}

/// The dtype names parameters accept.
pub const DTYPE_NAMES: &[&str] = &["bool", "float16", "float32", "float64", "int32", "int64", "int8", "uint8"];

pub fn dtype_from_name(name: &str) -> Option<DType> {
    Some(match name.trim_matches('\'') {
        "float32" => DType::F32,
        "float64" => DType::F64,
        "float16" => DType::F16,
        "uint8" => DType::U8,
        "int32" => DType::I32,
        "int8" => DType::I8,
        "int64" => DType::I64,
        "bool" => DType::Bool,
        _ => return None,
    })
}

fn parse_int(s: &str) -> Option<i64> {
    let s = s.trim();
    // Python prints large ints plainly, numpy ints too; a trailing "L" is Python 2.
    s.strip_suffix('L').unwrap_or(s).parse::<i64>().ok()
}

fn parse_float(s: &str) -> Option<f64> {
    let s = s.trim();
    match s {
        "inf" | "+inf" | "Infinity" => Some(f64::INFINITY),
        "-inf" | "-Infinity" => Some(f64::NEG_INFINITY),
        "nan" | "NaN" => Some(f64::NAN),
        _ => s.parse::<f64>().ok().filter(|v| v.is_finite()),
    }
}

/// `(a, b)`, `[a, b]`, `(a,)`, `()`, or a bare `a`.
fn parse_tuple<T>(s: &str, item: impl Fn(&str) -> Option<T>) -> Option<Vec<T>> {
    let s = s.trim();
    let inner = if let Some(r) = s.strip_prefix('(') {
        r.strip_suffix(')')?
    } else if let Some(r) = s.strip_prefix('[') {
        r.strip_suffix(']')?
    } else {
        return item(s).map(|v| vec![v]);
    };
    let inner = inner.trim();
    if inner.is_empty() {
        return Some(Vec::new());
    }
    let inner = inner.strip_suffix(',').unwrap_or(inner);
    inner.split(',').map(|p| item(p.trim())).collect()
}

fn parse_ctx(s: &str) -> Option<Context> {
    let (name, rest) = s.split_once('(')?;
    let id: i32 = rest.strip_suffix(')')?.trim().parse().ok()?;
    let dev = match name.trim() {
        "cpu" => DevType::Cpu,
        "gpu" => DevType::Gpu,
        "cpu_pinned" => DevType::CpuPinned,
        "cpu_shared" => DevType::CpuShared,
        _ => return None,
    };
    Context::new(dev, id).ok()
}

/// A parsed parameter value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Shape(Vec<i64>),
    OptShape(Vec<Option<i64>>),
    FloatTuple(Vec<f64>),
    Str(String),
    DType(DType),
    Ctx(Context),
}

impl Value {
    /// The value as a parameter string that parses back to it (Python's spelling: `True`,
    /// `(2, 3)`, `(1,)`, `None`).
    pub fn to_param(&self) -> String {
        fn tuple<T>(items: &[T], f: impl Fn(&T) -> String) -> String {
            match items {
                [one] => format!("({},)", f(one)),
                _ => format!("({})", items.iter().map(f).collect::<Vec<_>>().join(", ")),
            }
        }
        match self {
            Value::None => "None".to_string(),
            Value::Bool(b) => if *b { "True" } else { "False" }.to_string(),
            Value::Int(i) => i.to_string(),
            Value::Float(f) => float_param(*f),
            Value::Shape(v) => tuple(v, |d| d.to_string()),
            Value::OptShape(v) => tuple(v, |d| d.map_or("None".to_string(), |d| d.to_string())),
            Value::FloatTuple(v) => tuple(v, |f| float_param(*f)),
            Value::Str(s) => s.clone(),
            Value::DType(d) => d.name().to_string(),
            Value::Ctx(c) => c.to_string(),
        }
    }
}

/// A float as Python prints it (`inf`, `nan`; otherwise the shortest string that reads back).
fn float_param(f: f64) -> String {
    if f.is_nan() {
        "nan".to_string()
    } else if f.is_infinite() {
        if f > 0.0 { "inf" } else { "-inf" }.to_string()
    } else {
        format!("{f:?}")
    }
}

/// The parsed parameters of one operator call: one value per declared parameter, in
/// declaration order. Accessors panic on a name the operator did not declare or a mismatched
/// type; both are programming errors inside an operator, caught at the C boundary.
#[derive(Debug, Clone)]
pub struct Attrs {
    pub op: &'static str,
    specs: &'static [ParamSpec],
    values: Vec<Value>,
    /// Undeclared keys of an open operator, with their raw values, in the caller's order.
    extra: Vec<(String, String)>,
}

impl Attrs {
    /// Parse `kv` against `specs`; keys of the form `__name__` (graph attributes, not
    /// parameters) are ignored.
    pub fn parse<'a>(
        op: &'static str,
        specs: &'static [ParamSpec],
        kv: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Attrs> {
        Self::parse_with(op, specs, kv, false)
    }

    /// [`Attrs::parse`] for an open operator: undeclared keys are kept (see [`Attrs::extra`])
    /// instead of being refused; declared ones are parsed as strictly.
    pub fn parse_open<'a>(
        op: &'static str,
        specs: &'static [ParamSpec],
        kv: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Attrs> {
        Self::parse_with(op, specs, kv, true)
    }

    fn parse_with<'a>(
        op: &'static str,
        specs: &'static [ParamSpec],
        kv: impl IntoIterator<Item = (&'a str, &'a str)>,
        open: bool,
    ) -> Result<Attrs> {
        let is_graph_attr = |k: &str| k.starts_with("__") && k.ends_with("__") && k.len() > 4;
        let unknown = |k: &str| {
            let known: Vec<&str> = specs.iter().map(|s| s.name).collect();
            Error::value(format!("operator {op} has no parameter '{k}' (its parameters: {})", known.join(", ")))
        };
        if specs.is_empty() && !open {
            // An operator without parameters (most element-wise ones): nothing to fill in,
            // and, as in stock (whose operators without a parameter structure never parse
            // their attributes), any attribute given is ignored: Gluon's
            // CosineEmbeddingLoss passes `axis` to broadcast_maximum.
            return Ok(Attrs { op, specs, values: Vec::new(), extra: Vec::new() });
        }
        let mut values: Vec<Option<Value>> = vec![None; specs.len()];
        let mut extra = Vec::new();
        for (k, v) in kv {
            if is_graph_attr(k) {
                continue;
            }
            let Some(i) = specs.iter().position(|s| s.name == k) else {
                if open {
                    extra.push((k.to_string(), v.to_string()));
                    continue;
                }
                return Err(unknown(k));
            };
            let value = specs[i].parse(v).map_err(|why| {
                Error::value(format!("invalid value '{v}' for parameter '{k}' of operator {op}: {why}"))
            })?;
            values[i] = Some(value);
        }
        let mut out = Vec::with_capacity(specs.len());
        for (spec, v) in specs.iter().zip(values) {
            out.push(match v {
                Some(v) => v,
                None => match spec.default {
                    Some(d) => spec.parse(d).map_err(|why| {
                        Error::internal(format!("default '{d}' of {op}.{} does not parse: {why}", spec.name))
                    })?,
                    None => {
                        return Err(Error::value(format!(
                            "required parameter '{}' of operator {op} is missing ({})",
                            spec.name,
                            spec.type_string()
                        )))
                    }
                },
            });
        }
        Ok(Attrs { op, specs, values: out, extra })
    }

    /// The undeclared parameters of an open operator, in the caller's order (empty for every
    /// other operator).
    pub fn extra(&self) -> &[(String, String)] {
        &self.extra
    }

    /// The parameters as strings that parse back to them: those that differ from their
    /// defaults (required ones always), in declaration order, then the undeclared ones of an
    /// open operator. For a graph rebuilt from a record (`autograd.get_symbol`).
    pub fn to_kv(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (spec, v) in self.specs.iter().zip(&self.values) {
            let default = spec.default.and_then(|d| spec.parse(d).ok());
            if default.as_ref() != Some(v) {
                out.push((spec.name.to_string(), v.to_param()));
            }
        }
        out.extend(self.extra.iter().cloned());
        out
    }

    /// Whether these attributes were parsed against `specs` (the table itself, not a copy):
    /// a helper shared by operators of several tables picks the struct to read with it.
    pub fn declares(&self, specs: &'static [ParamSpec]) -> bool {
        std::ptr::eq(self.specs, specs)
    }

    /// Whether `name` is a declared parameter.
    #[cfg(test)]
    pub fn has(&self, name: &str) -> bool {
        self.specs.iter().any(|s| s.name == name)
    }

    #[cfg(test)]
    pub fn get(&self, name: &str) -> &Value {
        let i = self
            .specs
            .iter()
            .position(|s| s.name == name)
            .unwrap_or_else(|| panic!("operator {} reads undeclared parameter {name}", self.op));
        &self.values[i]
    }
    #[cfg(test)]
    fn mismatch(&self, name: &str, want: &str) -> ! {
        panic!("parameter {name} of {} is not {want}: {:?}", self.op, self.get(name))
    }
    #[cfg(test)]
    pub fn is_none(&self, name: &str) -> bool {
        matches!(self.get(name), Value::None)
    }
    #[cfg(test)]
    pub fn bool(&self, name: &str) -> bool {
        match self.get(name) {
            Value::Bool(b) => *b,
            _ => self.mismatch(name, "a bool"),
        }
    }
    #[cfg(test)]
    pub fn int(&self, name: &str) -> i64 {
        match self.get(name) {
            Value::Int(v) => *v,
            _ => self.mismatch(name, "an int"),
        }
    }
    #[cfg(test)]
    pub fn opt_int(&self, name: &str) -> Option<i64> {
        match self.get(name) {
            Value::None => None,
            Value::Int(v) => Some(*v),
            _ => self.mismatch(name, "an int or None"),
        }
    }
    #[cfg(test)]
    pub fn float(&self, name: &str) -> f64 {
        match self.get(name) {
            Value::Float(v) => *v,
            Value::Int(v) => *v as f64,
            _ => self.mismatch(name, "a float"),
        }
    }
    #[cfg(test)]
    pub fn opt_float(&self, name: &str) -> Option<f64> {
        match self.get(name) {
            Value::None => None,
            Value::Float(v) => Some(*v),
            _ => self.mismatch(name, "a float or None"),
        }
    }
    #[cfg(test)]
    pub fn shape(&self, name: &str) -> &[i64] {
        match self.get(name) {
            Value::Shape(v) => v,
            _ => self.mismatch(name, "a shape"),
        }
    }
    #[cfg(test)]
    pub fn opt_shape(&self, name: &str) -> Option<&[i64]> {
        match self.get(name) {
            Value::None => None,
            Value::Shape(v) => Some(v),
            _ => self.mismatch(name, "a shape or None"),
        }
    }
    #[cfg(test)]
    pub fn opt_tuple(&self, name: &str) -> &[Option<i64>] {
        match self.get(name) {
            Value::OptShape(v) => v,
            _ => self.mismatch(name, "a tuple of optional ints"),
        }
    }
    #[cfg(test)]
    pub fn floats(&self, name: &str) -> &[f64] {
        match self.get(name) {
            Value::FloatTuple(v) => v,
            _ => self.mismatch(name, "a tuple of floats"),
        }
    }
    #[cfg(test)]
    pub fn str(&self, name: &str) -> &str {
        match self.get(name) {
            Value::Str(s) => s,
            _ => self.mismatch(name, "a string"),
        }
    }
    #[cfg(test)]
    pub fn dtype(&self, name: &str) -> Option<DType> {
        match self.get(name) {
            Value::None => None,
            Value::DType(d) => Some(*d),
            _ => self.mismatch(name, "a dtype"),
        }
    }
    #[cfg(test)]
    pub fn ctx(&self, name: &str) -> Option<Context> {
        match self.get(name) {
            Value::None => None,
            Value::Ctx(c) => Some(*c),
            _ => self.mismatch(name, "a context"),
        }
    }
}

/// A Rust type a parameter can have in an [`op_params!`] struct: which [`PType`] the frontend
/// is told and parses with, and how the parsed [`Value`] is read, borrowed for `'a` (reading
/// allocates nothing). `Option<T>` is the nullable form (the frontend may pass `None`).
pub trait ParamType<'a>: Sized {
    const PTYPE: PType;
    const NULLABLE: bool = false;
    /// `None` when `v` is not a value of this type (parsing by [`Self::PTYPE`] never gives one).
    fn read(v: &'a Value) -> Option<Self>;
}

macro_rules! param_type {
    ($ty:ty, $ptype:expr, $pat:pat => $out:expr) => {
        impl<'a> ParamType<'a> for $ty {
            const PTYPE: PType = $ptype;
            fn read(v: &'a Value) -> Option<Self> {
                match v {
                    $pat => Some($out),
                    _ => None,
                }
            }
        }
    };
}
param_type!(bool, PType::Bool, Value::Bool(b) => *b);
param_type!(i64, PType::Int, Value::Int(i) => *i);
param_type!(f64, PType::Float, Value::Float(f) => *f);
param_type!(DType, PType::DType, Value::DType(d) => *d);
// A tuple of integers, one whose entries may be `None`, a tuple of floats.
param_type!(&'a [i64], PType::Shape, Value::Shape(s) => &s[..]);
param_type!(&'a [Option<i64>], PType::OptShape, Value::OptShape(s) => &s[..]);
param_type!(&'a [f64], PType::FloatTuple, Value::FloatTuple(s) => &s[..]);
// Any string, or (declared `in [...]`) one of the listed ones.
param_type!(&'a str, PType::Str, Value::Str(s) => s.as_str());

/// A context parameter: `None` when absent or empty (the frontend's `ctx=''`), not a
/// nullable type for the frontend (stock describes it as a plain string).
impl<'a> ParamType<'a> for Option<Context> {
    const PTYPE: PType = PType::Ctx;
    fn read(v: &'a Value) -> Option<Self> {
        match v {
            Value::None => Some(None),
            Value::Ctx(c) => Some(Some(*c)),
            _ => None,
        }
    }
}

impl<'a, T: ParamType<'a>> ParamType<'a> for Option<T> {
    const PTYPE: PType = T::PTYPE;
    const NULLABLE: bool = true;
    fn read(v: &'a Value) -> Option<Self> {
        match v {
            Value::None => Some(None),
            v => T::read(v).map(Some),
        }
    }
}

impl Attrs {
    /// Parameter `i` of these attributes as a `T`, after checking that they were parsed
    /// against `specs` (the same table, not a copy), the table the caller's struct declares.
    /// For [`op_params!`] structs; reading a struct of another table is an error in the
    /// operator's code and panics on every call (so any test of the operator finds it).
    pub fn typed<'a, T: ParamType<'a>>(&'a self, specs: &'static [ParamSpec], i: usize) -> T {
        T::read(self.value(specs, i)).unwrap_or_else(|| {
            panic!(
                "parameter {} of {} is not {}: {:?}",
                specs[i].name,
                self.op,
                std::any::type_name::<T>(),
                self.values[i]
            )
        })
    }

    /// Parameter `i`'s parsed value, after the same check as [`Attrs::typed`].
    pub fn value(&self, specs: &'static [ParamSpec], i: usize) -> &Value {
        if !std::ptr::eq(self.specs, specs) {
            panic!(
                "operator {} reads parameters of another table ({}) than it declares",
                self.op,
                specs.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
            );
        }
        &self.values[i]
    }
}

/// A parameter's name from its field's identifier: `r#type` declares `type`.
pub const fn unraw(ident: &'static str) -> &'static str {
    match ident.as_bytes() {
        [b'r', b'#', rest @ ..] => match std::str::from_utf8(rest) {
            Ok(name) => name,
            Err(_) => ident,
        },
        _ => ident,
    }
}

/// Declares an operator family's parameters once: the table (`ParamSpec`s: name, type,
/// default, doc) that is served to the frontend and parsed against, and a struct with one
/// typed field per parameter, read with `Struct::of(&attrs)` (by index, borrowing: it
/// allocates nothing). A misspelt field does not compile, and a field's type is the type the
/// frontend is told and parsed with. `of` panics for attributes parsed against another table
/// (an operator reading a struct it does not declare).
///
/// ```ignore
/// op_params! {
///     /// Softmax's parameters.
///     pub(super) struct SoftmaxParams<'a> => SOFTMAX_PARAMS {
///         axis: i64 = "-1", "The axis along which to compute softmax.";
///         temperature: Option<f64> = "None", "Temperature parameter in softmax";
///         dtype: Option<&'a str> = "None" in ["float16", "float32", "float64"], "DType of the output.";
///         kernel: &'a [i64] = required, "Kernel size.";
///     }
/// }
/// ```
/// `Option<T>` fields accept `None`; `&str` fields with `in [...]` (or `in *NAMES`, a
/// `&[&str]` constant) after the default accept only those strings; `required` has no
/// default. A doc may be a `&str` constant, for a parameter several tables share.
macro_rules! op_params {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident<$lt:lifetime> => $specs:ident {
            $($field:ident : $ty:ty = $default:tt $(in $choices:expr)?, $doc:expr;)*
        }
    ) => {
        $(#[$meta])*
        // Every parameter the frontend may pass is declared, also those an operator ignores
        // (`cudnn_off` on CPU), under stock's names (`_eye`'s `N`).
        #[allow(dead_code, non_snake_case)]
        #[derive(Debug, Clone, Copy)]
        $vis struct $name<$lt> {
            $(pub $field: $ty,)*
            _attrs: std::marker::PhantomData<&$lt ()>,
        }
        #[allow(dead_code)]
        impl<$lt> $name<$lt> {
            const SPECS: &'static [$crate::op::param::ParamSpec] = &[
                $($crate::op::param::ParamSpec {
                    name: $crate::op::param::unraw(stringify!($field)),
                    ty: $crate::op::param::op_params!(@ty $lt, $ty $(, $choices)?),
                    nullable: <$ty as $crate::op::param::ParamType<$lt>>::NULLABLE,
                    default: $crate::op::param::op_params!(@default $default),
                    doc: $doc,
                },)*
            ];

            /// The parameters of a call of an operator that declares them.
            #[allow(unused_assignments, unused_mut, unused_variables)]
            $vis fn of(a: &$lt $crate::op::param::Attrs) -> Self {
                let mut i = 0usize;
                $name {
                    $($field: {
                        let v = a.typed::<$ty>($specs, i);
                        i += 1;
                        v
                    },)*
                    _attrs: std::marker::PhantomData,
                }
            }
        }
        $vis static $specs: &[$crate::op::param::ParamSpec] = $name::<'static>::SPECS;
    };
    (@ty $lt:lifetime, $ty:ty) => { <$ty as $crate::op::param::ParamType<$lt>>::PTYPE };
    (@ty $lt:lifetime, $ty:ty, $choices:expr) => { $crate::op::param::PType::Enum(&$choices) };
    (@default required) => { None };
    (@default $d:literal) => { Some($d) };
}
pub(crate) use op_params;

#[cfg(test)]
mod tests {
    use super::*;

    const SPECS: &[ParamSpec] = &[
        ParamSpec::req("shape", PType::Shape, "output shape"),
        ParamSpec::or_none("axis", PType::Int, "None", "axis"),
        ParamSpec::opt("keepdims", PType::Bool, "False", "keep reduced axes"),
        ParamSpec::opt("scalar", PType::Float, "1", "scalar"),
        ParamSpec::opt("begin", PType::OptShape, "()", "begin"),
        ParamSpec::opt("mode", PType::Enum(&["max", "avg"]), "max", "mode"),
        ParamSpec::or_none("dtype", PType::DType, "None", "dtype"),
        ParamSpec::opt("ctx", PType::Ctx, "cpu(0)", "context"),
    ];

    fn parse(kv: &[(&str, &str)]) -> Result<Attrs> {
        Attrs::parse("test_op", SPECS, kv.iter().copied())
    }

    op_params! {
        /// The table above, declared once with types.
        struct TestParams<'a> => TEST_PARAMS {
            shape: &'a [i64] = required, "output shape";
            axis: Option<i64> = "None", "axis";
            keepdims: bool = "False", "keep reduced axes";
            scalar: f64 = "1", "scalar";
            begin: &'a [Option<i64>] = "()", "begin";
            mode: &'a str = "max" in ["max", "avg"], "mode";
            dtype: Option<DType> = "None", "dtype";
        }
    }

    #[test]
    fn declared_params_are_one_table_and_one_typed_struct() {
        // The table is what the hand-written one says (the frontend sees no difference).
        assert_eq!(TEST_PARAMS.len(), 7);
        for (typed, by_hand) in TEST_PARAMS.iter().zip(SPECS) {
            assert_eq!((typed.name, typed.doc, typed.default), (by_hand.name, by_hand.doc, by_hand.default));
            assert_eq!(typed.type_string(), by_hand.type_string(), "{}", typed.name);
        }
        let kv = [("shape", "(2, 3)"), ("axis", "-1"), ("mode", "avg"), ("dtype", "float16"), ("begin", "(None, 1)")];
        let a = Attrs::parse("test_op", TEST_PARAMS, kv).unwrap();
        let p = TestParams::of(&a);
        assert_eq!((p.shape, p.axis, p.keepdims, p.scalar), (&[2, 3][..], Some(-1), false, 1.0));
        assert_eq!((p.begin, p.mode, p.dtype), (&[None, Some(1)][..], "avg", Some(DType::F16)));
        // Attributes parsed against another table, even one with the same names: refused.
        let b = Attrs::parse("test_op", SPECS, kv).unwrap();
        let refused = std::panic::catch_unwind(|| TestParams::of(&b).axis).unwrap_err();
        let msg = refused.downcast_ref::<String>().unwrap();
        assert!(msg.contains("reads parameters of another table"), "{msg}");
        // Parsing is as strict as ever.
        assert!(Attrs::parse("test_op", TEST_PARAMS, [("shape", "1"), ("mode", "min")]).is_err());
        assert!(Attrs::parse("test_op", TEST_PARAMS, [("axis", "1")]).is_err());
    }

    #[test]
    fn frontend_forms() {
        let a = parse(&[
            ("shape", "(2, 3)"),
            ("axis", "None"),
            ("keepdims", "True"),
            ("scalar", "inf"),
            ("begin", "(None, 1)"),
            ("mode", "avg"),
            ("dtype", "float16"),
            ("ctx", "cpu_shared(0)"),
        ])
        .unwrap();
        assert_eq!(a.shape("shape"), &[2, 3]);
        assert_eq!(a.opt_int("axis"), None);
        assert!(a.bool("keepdims"));
        assert_eq!(a.float("scalar"), f64::INFINITY);
        assert_eq!(a.opt_tuple("begin"), &[None, Some(1)]);
        assert_eq!(a.str("mode"), "avg");
        assert_eq!(a.dtype("dtype"), Some(DType::F16));
        assert_eq!(a.ctx("ctx").unwrap().dev_type, DevType::CpuShared);
        for (text, want) in
            [("[1, 2, 0]", vec![1, 2, 0]), ("(3,)", vec![3]), ("()", vec![]), ("5", vec![5]), ("[7]", vec![7])]
        {
            assert_eq!(parse(&[("shape", text)]).unwrap().shape("shape"), &want[..], "{text}");
        }
        assert_eq!(
            parse(&[("shape", "1"), ("scalar", "1.5951227848834706")]).unwrap().float("scalar"),
            1.5951227848834706
        );
        assert_eq!(parse(&[("shape", "1"), ("axis", "-2")]).unwrap().opt_int("axis"), Some(-2));
    }

    #[test]
    fn defaults_and_required() {
        let a = parse(&[("shape", "(1,)")]).unwrap();
        assert!(!a.bool("keepdims"));
        assert_eq!(a.dtype("dtype"), None);
        let e = parse(&[]).unwrap_err();
        assert!(e.to_string().starts_with("ValueError: required parameter 'shape' of operator test_op"), "{e}");
    }

    #[test]
    fn strict_errors_name_op_and_param() {
        for (k, v, needle) in [
            ("shape", "(2, x)", "parameter 'shape' of operator test_op"),
            ("keepdims", "yes", "boolean"),
            ("axis", "1.5", "an integer or None"),
            ("mode", "min", "one of max, avg"),
            ("dtype", "float8", "dtype name"),
            ("ctx", "tpu(0)", "context"),
            ("scalar", "", "a number"),
            ("bogus", "1", "has no parameter 'bogus'"),
        ] {
            let e = parse(&[("shape", "(1,)"), (k, v)]).unwrap_err().to_string();
            assert!(e.starts_with("ValueError: "), "{e}");
            assert!(e.contains(needle), "{k}={v}: {e}");
        }
        // Dunder graph attributes are not parameters and are ignored.
        assert!(parse(&[("shape", "(1,)"), ("__layout__", "NCHW")]).is_ok());
    }

    #[test]
    fn an_operator_without_parameters_ignores_attributes() {
        let a = Attrs::parse("no_params", &[], [("__layout__", "NC"), ("__ctx_group__", "g")]).unwrap();
        assert!(!a.has("scalar") && a.extra().is_empty());
        let a = Attrs::parse("no_params", &[], [("__layout__", "NC"), ("scalar", "1")]).unwrap();
        assert!(!a.has("scalar") && a.extra().is_empty());
        // An open operator without declared parameters keeps them instead.
        let a = Attrs::parse_open("open_none", &[], [("scalar", "1")]).unwrap();
        assert_eq!(a.extra(), &[("scalar".to_string(), "1".to_string())]);
    }

    #[test]
    fn open_operators_keep_unknown_keys_in_order() {
        let kv = [("zeta", "1"), ("shape", "(2,)"), ("alpha", "x y"), ("__layout__", "NC")];
        let a = Attrs::parse_open("open_op", SPECS, kv.iter().copied()).unwrap();
        assert_eq!(a.shape("shape"), &[2]);
        assert_eq!(a.extra(), &[("zeta".to_string(), "1".to_string()), ("alpha".to_string(), "x y".to_string())]);
        // Declared parameters stay strict, and a strict parse keeps nothing extra.
        assert!(Attrs::parse_open("open_op", SPECS, [("shape", "(2, x)")]).is_err());
        assert!(parse(&[("shape", "(1,)")]).unwrap().extra().is_empty());
    }

    #[test]
    fn type_strings() {
        assert_eq!(SPECS[0].type_string(), "Shape(tuple), required");
        assert_eq!(SPECS[1].type_string(), "int or None, optional, default='None'");
        assert_eq!(SPECS[5].type_string(), "{'max', 'avg'}, optional, default='max'");
    }
}
