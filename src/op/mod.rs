//! Operators: the registry, their declarations and imperative invocation.
//!
//! Owns: [`OpDef`] (an operator under its MXNet name and aliases, with its parameter schema,
//! tensor inputs, shape/dtype inference, in-place pairs, mutated inputs, resources, gradient
//! declaration and CPU kernel), the process-wide [`Registry`] (built once, never changed, so an
//! operator's address is its stable handle), and the C views of each declaration that the
//! registry functions of the C API serve.
//!
//! Submodules: [`param`] (schemas and strict parsing), [`tensor`] (what kernels see),
//! [`kernel`] (the data-parallel pool and operator tuning), [`invoke`] (imperative
//! invocation through the engine), [`random`] (reproducible random streams), [`tune`]
//! (convolution algorithm selection) and `ops` (the operator families).

pub mod custom;
pub mod grad;
pub mod invoke;
pub mod kernel;
mod ops;
pub mod param;
pub mod random;
pub mod resource;
pub(crate) mod simd;
pub mod tensor;
pub mod tune;

use crate::error::{Error, Result};
use crate::ndarray::{self, DType};
use param::{Attrs, ParamSpec};
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CString};
use std::sync::{Arc, OnceLock};
use tensor::{OutBlob, TBlob};

/// Shape and dtype of an input or output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    pub shape: Vec<usize>,
    pub dtype: DType,
}

impl Meta {
    pub fn new(shape: Vec<usize>, dtype: DType) -> Self {
        Meta { shape, dtype }
    }
    pub fn size(&self) -> usize {
        self.shape.iter().product()
    }
}

/// How a kernel writes an output (stock's OpReqType).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Req {
    /// Do not write.
    Null,
    /// Overwrite.
    Write,
    /// Overwrite; the output is the same memory as a declared in-place input.
    Inplace,
    /// Add to what is there (gradient accumulation).
    Add,
}

/// A resource an operator asks for (stock's ResourceRequest).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    /// Temporary workspace memory.
    TempSpace,
    /// A random stream (seeded by MXRandomSeed, reproducible).
    Random,
}

/// What an operator's gradient is, declared for autograd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grad {
    /// Not differentiable and not part of gradient graphs (creation, random, updates).
    None,
    /// Differentiable almost nowhere (comparisons, rounding, argmax): inputs get zero gradients.
    Zero,
    /// Computed by the backward operator `op`, which takes the output gradients followed by
    /// the inputs (`inputs`) and/or outputs (`outputs`) of the forward call, in that order,
    /// and produces one gradient per forward input.
    Backward { op: &'static str, inputs: bool, outputs: bool },
    /// Computed by the backward operator `op` with the forward call's state (`Custom`: the
    /// frontend's operator object); which forward tensors it reads is decided by that state
    /// (see `custom::backward`).
    Stateful { op: &'static str },
}

/// Which tensor inputs an operator takes.
#[derive(Clone, Copy)]
pub enum Inputs {
    /// Exactly these.
    Fixed(&'static [&'static str]),
    /// Any number (given by the `num_args`-style parameter), under one name.
    Variadic(&'static str),
    /// The first `count(attrs)` of these (optional trailing inputs such as a bias the frontend
    /// drops when `no_bias` is set).
    Leading(&'static [&'static str], fn(&Attrs) -> usize),
}

pub type InferFn = Box<dyn Fn(&Attrs, &[Meta]) -> Result<Vec<Meta>> + Send + Sync>;
/// A kernel: reads the inputs, writes the outputs (followed by the mutated inputs, see
/// [`OpDef::mutate_inputs`]).
pub type ComputeFn = Box<dyn Fn(&OpCtx, &[TBlob], &mut [OutBlob]) -> Result<()> + Send + Sync>;
/// Invocation of an operator that does not fit parse-infer-compute (see [`OpDef::invoke_with`]):
/// the operator, its inputs, the caller's outputs if any, and the parsed parameters; returns
/// the visible outputs.
pub type InvokeFn =
    fn(&'static OpDef, &[&ndarray::NDArray], Option<&[&ndarray::NDArray]>, Attrs) -> Result<Vec<ndarray::NDArray>>;

/// What a kernel gets besides its tensors.
pub struct OpCtx<'a> {
    pub attrs: &'a Attrs,
    /// One per output.
    pub req: &'a [Req],
    /// Present when the operator declared [`Resource::Random`].
    pub rng: Option<random::Stream>,
    /// Training mode (autograd's is_train), e.g. for Dropout and BatchNorm.
    pub is_train: bool,
    /// Present when the operator declared [`Resource::TempSpace`] and runs through the engine.
    pub temp: Option<std::sync::Arc<resource::TempSpace>>,
}

impl OpCtx<'_> {
    /// `bytes` of scratch memory for this kernel call: the operator's shared workspace, or
    /// memory of its own when it has none (a kernel called directly, as tests do).
    pub fn workspace(&self, bytes: usize) -> Result<resource::Scratch<'_>> {
        match &self.temp {
            Some(t) => t.get(bytes),
            None => Ok(resource::Scratch::owned(bytes)),
        }
    }
}

/// An operator.
pub struct OpDef {
    pub name: &'static str,
    pub aliases: Vec<&'static str>,
    pub doc: String,
    pub inputs: Inputs,
    pub params: &'static [ParamSpec],
    /// `num_args` for variadic operators whose count is a parameter; "" otherwise.
    pub key_var_num_args: &'static str,
    pub num_outputs: fn(&Attrs) -> usize,
    /// Outputs the caller sees (the rest are internal, e.g. BatchNorm's saved statistics).
    pub num_visible_outputs: fn(&Attrs) -> usize,
    pub infer: InferFn,
    pub compute: ComputeFn,
    /// `(input, output)` pairs that may share memory.
    pub inplace: &'static [(usize, usize)],
    /// Inputs the kernel writes (stock's FMutateInputs: optimizer states, BatchNorm's moving
    /// statistics). Indices past a call's input count are ignored, so a variadic operator
    /// lists those of its largest call.
    pub mutate_inputs: &'static [usize],
    pub resources: &'static [Resource],
    pub grad: Grad,
    /// Caller-given outputs may have any dtype (the kernel converts, as `_copyto` does).
    pub any_out_dtype: bool,
    /// A stock operator mxnet-rt does not implement: every call fails with
    /// NotImplementedError, whatever its parameters.
    pub not_supported: bool,
    /// Undeclared parameters are kept for the operator ([`Attrs::extra`]) instead of being
    /// refused (`Custom`, whose parameters belong to the frontend's operator).
    pub open_params: bool,
    /// Takes over imperative invocation once the parameters are parsed: for operators whose
    /// inference and computation call back into the frontend and complete asynchronously
    /// (`Custom`). `infer` still serves graph shape inference; `compute` is not used.
    pub invoke_with: Option<InvokeFn>,
    /// A backward operator (`_backward_*`, see [`grad`]): run by autograd with the forward
    /// call's parameters and the forward inputs' shapes; never invoked directly.
    pub is_backward: bool,
    /// The tensor inputs `MXSymbolGetAtomicSymbolInfo` lists when they differ from `inputs`
    /// (stock lists only `data` for log_softmax and softmin, whose optional `length` input is
    /// not a frontend argument, so `log_softmax(x, axis)` passes the axis as a parameter).
    pub listed_inputs: Option<&'static [&'static str]>,
    /// When every input has one shape and dtype, the output is one array of that shape and
    /// dtype (element-wise operators, and broadcasting ones on equal shapes): the imperative
    /// call then skips general inference ([`invoke`]'s same-shape path).
    pub same_shape: bool,
    /// Name interned for the engine and profiler.
    engine_name: OnceLock<Arc<str>>,
    c_info: OnceLock<CInfo>,
}

fn one(_: &Attrs) -> usize {
    1
}

impl OpDef {
    /// A declaration with one output, no parameters, no gradient; completed with the builder
    /// methods below.
    pub fn new(name: &'static str, inputs: Inputs, infer: InferFn, compute: ComputeFn) -> Self {
        OpDef {
            name,
            aliases: Vec::new(),
            doc: String::new(),
            inputs,
            params: &[],
            key_var_num_args: "",
            num_outputs: one,
            num_visible_outputs: one,
            infer,
            compute,
            inplace: &[],
            mutate_inputs: &[],
            resources: &[],
            grad: Grad::None,
            any_out_dtype: false,
            not_supported: false,
            open_params: false,
            invoke_with: None,
            is_backward: false,
            listed_inputs: None,
            same_shape: false,
            engine_name: OnceLock::new(),
            c_info: OnceLock::new(),
        }
    }
    /// A backward operator (see [`grad`] for its calling convention): `params` are the
    /// forward operator's (the call gets the forward call's parsed parameters), `compute`
    /// writes one gradient per forward input whose request is not [`Req::Null`].
    pub fn backward(name: &'static str, params: &'static [ParamSpec], compute: ComputeFn) -> Self {
        let infer: InferFn = Box::new(move |_, _| {
            Err(Error::not_supported(format!("calling {name} directly (it runs inside autograd)")))
        });
        let mut d = OpDef::new(name, Inputs::Variadic("grads_and_data"), infer, compute).params(params);
        d.is_backward = true;
        d
    }
    pub fn listed_inputs(mut self, names: &'static [&'static str]) -> Self {
        self.listed_inputs = Some(names);
        self
    }
    pub fn alias(mut self, names: &[&'static str]) -> Self {
        self.aliases.extend_from_slice(names);
        self
    }
    pub fn doc(mut self, doc: impl Into<String>) -> Self {
        self.doc = doc.into();
        self
    }
    pub fn params(mut self, params: &'static [ParamSpec]) -> Self {
        self.params = params;
        self
    }
    pub fn num_args_key(mut self, key: &'static str) -> Self {
        self.key_var_num_args = key;
        self
    }
    pub fn outputs(mut self, total: fn(&Attrs) -> usize, visible: fn(&Attrs) -> usize) -> Self {
        self.num_outputs = total;
        self.num_visible_outputs = visible;
        self
    }
    pub fn inplace(mut self, pairs: &'static [(usize, usize)]) -> Self {
        self.inplace = pairs;
        self
    }
    /// See [`OpDef::same_shape`].
    pub fn same_shape(mut self) -> Self {
        self.same_shape = true;
        self
    }
    pub fn mutates(mut self, inputs: &'static [usize]) -> Self {
        self.mutate_inputs = inputs;
        self
    }
    pub fn resources(mut self, r: &'static [Resource]) -> Self {
        self.resources = r;
        self
    }
    pub fn grad(mut self, g: Grad) -> Self {
        self.grad = g;
        self
    }
    pub fn any_out_dtype(mut self) -> Self {
        self.any_out_dtype = true;
        self
    }
    pub fn not_supported(mut self) -> Self {
        self.not_supported = true;
        self
    }
    pub fn open_params(mut self) -> Self {
        self.open_params = true;
        self
    }
    pub fn invoke_with(mut self, f: InvokeFn) -> Self {
        self.invoke_with = Some(f);
        self
    }

    /// The number of tensor inputs a call with these parameters takes (`given`: the number
    /// the caller passed, which a variadic operator without a count parameter accepts).
    pub fn num_inputs(&self, attrs: &Attrs, given: usize) -> Result<usize> {
        Ok(match self.inputs {
            Inputs::Fixed(names) => names.len(),
            Inputs::Leading(_, count) => count(attrs),
            Inputs::Variadic(_) if self.key_var_num_args.is_empty() => given,
            Inputs::Variadic(_) => {
                let n = attrs.int(self.key_var_num_args);
                if n < 0 {
                    return Err(Error::value(format!(
                        "operator {}: {} must be >= 0, got {n}",
                        self.name, self.key_var_num_args
                    )));
                }
                n as usize
            }
        })
    }

    /// The operator's name, interned for the engine and profiler.
    pub fn engine_name(&self) -> &Arc<str> {
        self.engine_name.get_or_init(|| crate::engine::intern(self.name))
    }

    /// Parse the parameters of a call with `num_inputs` inputs, filling in `num_args` for
    /// variadic operators when the caller did not send it.
    pub fn parse_attrs<'a>(
        &'static self,
        kv: impl IntoIterator<Item = (&'a str, &'a str)>,
        num_inputs: usize,
    ) -> Result<Attrs> {
        if self.not_supported {
            return Err(Error::not_supported(format!("operator {}", self.name)));
        }
        if self.open_params {
            return Attrs::parse_open(self.name, self.params, kv);
        }
        if self.key_var_num_args.is_empty() {
            return Attrs::parse(self.name, self.params, kv);
        }
        let mut pairs: Vec<(&str, &str)> = kv.into_iter().collect();
        let n = num_inputs.to_string();
        if !pairs.iter().any(|(k, _)| *k == self.key_var_num_args) {
            pairs.push((self.key_var_num_args, &n));
        }
        Attrs::parse(self.name, self.params, pairs)
    }

    /// The arguments `MXSymbolGetAtomicSymbolInfo` lists: tensor inputs, then parameters.
    fn arguments(&self) -> Vec<(String, String, String)> {
        let mut args = Vec::new();
        match (self.listed_inputs, self.inputs) {
            (Some(names), _) => {
                for n in names {
                    args.push((n.to_string(), "NDArray-or-Symbol".to_string(), format!("Input {n}")));
                }
            }
            (None, Inputs::Fixed(names) | Inputs::Leading(names, _)) => {
                for n in names {
                    args.push((n.to_string(), "NDArray-or-Symbol".to_string(), format!("Input {n}")));
                }
            }
            (None, Inputs::Variadic(n)) => {
                args.push((n.to_string(), "NDArray-or-Symbol[]".to_string(), "Positional input arrays".to_string()))
            }
        }
        for p in self.params {
            args.push((p.name.to_string(), p.type_string(), p.doc.to_string()));
        }
        args
    }

    /// The C strings of this declaration, built on first use and kept for the process.
    pub fn c_info(&self) -> &CInfo {
        self.c_info.get_or_init(|| CInfo::new(self))
    }
}

/// NUL-terminated copies of an operator's declaration, with pointer arrays into them.
pub struct CInfo {
    pub name: CString,
    pub desc: CString,
    pub key_var_num_args: CString,
    _strings: Vec<CString>,
    pub arg_names: Vec<*const c_char>,
    pub arg_types: Vec<*const c_char>,
    pub arg_descs: Vec<*const c_char>,
}

// SAFETY: the pointers address the CStrings owned by the same CInfo, which is never mutated.
unsafe impl Send for CInfo {}
unsafe impl Sync for CInfo {}

fn c_string(s: &str) -> CString {
    CString::new(s.replace('\0', " ")).expect("NULs replaced")
}

impl CInfo {
    fn new(op: &OpDef) -> Self {
        let args = op.arguments();
        let mut strings = Vec::new();
        let mut ptrs = |s: &str| {
            let c = c_string(s);
            let p = c.as_ptr();
            strings.push(c);
            p
        };
        let (mut n, mut t, mut d) = (Vec::new(), Vec::new(), Vec::new());
        for (name, ty, desc) in &args {
            n.push(ptrs(name));
            t.push(ptrs(ty));
            d.push(ptrs(desc));
        }
        let desc = if op.doc.is_empty() { format!("{} (mxnet-rt)", op.name) } else { op.doc.clone() };
        CInfo {
            name: c_string(op.name),
            desc: c_string(&desc),
            key_var_num_args: c_string(op.key_var_num_args),
            _strings: strings,
            arg_names: n,
            arg_types: t,
            arg_descs: d,
        }
    }
}

/// All operators.
pub struct Registry {
    ops: Vec<OpDef>,
    by_name: HashMap<&'static str, usize>,
    /// Every name (canonical and aliases), as C strings, and pointers to them.
    _all_names: Vec<CString>,
    all_name_ptrs: Vec<*const c_char>,
    /// The operators' addresses (their handles), canonical order.
    handles: Vec<*mut c_void>,
}

// SAFETY: built once and never mutated; the pointers address data owned by the registry.
unsafe impl Send for Registry {}
unsafe impl Sync for Registry {}

impl Registry {
    fn build() -> Registry {
        let mut ops = Vec::new();
        ops::register_all(&mut ops);
        let mut by_name = HashMap::new();
        for (i, op) in ops.iter().enumerate() {
            for n in std::iter::once(&op.name).chain(op.aliases.iter()) {
                let prev = by_name.insert(*n, i);
                assert!(prev.is_none(), "operator name {n} registered twice");
            }
        }
        let mut names: Vec<&'static str> = by_name.keys().copied().collect();
        names.sort_unstable();
        let all_names: Vec<CString> = names.iter().map(|n| c_string(n)).collect();
        let all_name_ptrs = all_names.iter().map(|c| c.as_ptr()).collect();
        let mut reg = Registry { ops, by_name, _all_names: all_names, all_name_ptrs, handles: Vec::new() };
        reg.handles = reg.ops.iter().map(|o| o as *const OpDef as *mut c_void).collect();
        reg
    }

    pub fn ops(&self) -> &[OpDef] {
        &self.ops
    }
    pub fn get(&self, name: &str) -> Option<&OpDef> {
        self.by_name.get(name).map(|&i| &self.ops[i])
    }
    /// Every name, aliases included (sorted).
    pub fn all_name_ptrs(&self) -> &[*const c_char] {
        &self.all_name_ptrs
    }
    pub fn handles(&self) -> &[*mut c_void] {
        &self.handles
    }

    /// The operator behind a handle given out by [`OpDef::handle`]; anything else is an error.
    pub fn from_handle(&self, h: *const c_void) -> Result<&OpDef> {
        if h.is_null() {
            return Err(Error::value("operator handle is NULL"));
        }
        let base = self.ops.as_ptr() as usize;
        let size = std::mem::size_of::<OpDef>();
        let addr = h as usize;
        if addr < base || (addr - base) % size != 0 || (addr - base) / size >= self.ops.len() {
            return Err(Error::value(format!("{h:p} is not an operator handle")));
        }
        Ok(&self.ops[(addr - base) / size])
    }
}

impl OpDef {
    /// This operator's handle (its address in the registry; stable for the process).
    pub fn handle(&self) -> *mut c_void {
        self as *const OpDef as *mut c_void
    }
}

/// The registry, built at first use.
pub fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(Registry::build)
}

/// The operator named `name` (canonical or alias).
pub fn lookup(name: &str) -> Result<&'static OpDef> {
    registry().get(name).ok_or_else(|| Error::value(format!("operator {name} is not registered")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_names_resolve_and_handles_roundtrip() {
        let r = registry();
        assert!(!r.ops().is_empty());
        for op in r.ops() {
            let h = op.handle();
            assert!(std::ptr::eq(r.from_handle(h).unwrap(), op));
            for a in &op.aliases {
                assert!(std::ptr::eq(r.get(a).unwrap(), op), "alias {a} of {}", op.name);
            }
            let info = op.c_info();
            assert_eq!(info.arg_names.len(), info.arg_types.len());
            // Variadic operators name their count parameter, and it is declared.
            if let (Inputs::Variadic(_), false) = (op.inputs, op.key_var_num_args.is_empty()) {
                assert!(op.params.iter().any(|p| p.name == op.key_var_num_args), "{}", op.name);
            }
        }
        assert!(r.from_handle(std::ptr::null()).is_err());
        let bogus = (r.ops().as_ptr() as usize + 1) as *const c_void;
        assert!(r.from_handle(bogus).is_err());
    }
}
