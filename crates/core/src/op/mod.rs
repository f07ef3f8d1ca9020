//! Operators: the registry, their declarations and imperative invocation.
//!
//! Owns: [`OpDef`] (an operator under its MXNet name and aliases, with its parameter schema,
//! tensor inputs, shape/dtype inference, in-place pairs, mutated inputs, resources, gradient
//! declaration and CPU kernel), the process-wide [`Registry`] (the built-in operators, built
//! once, plus those extension libraries add at run time; nothing is ever removed or moved, so
//! an operator's address is its stable handle), and the C views of each declaration that the
//! registry functions of the C API serve.
//!
//! Submodules: [`param`] (schemas and strict parsing), [`tensor`] (what kernels see),
//! [`kernel`] (the data-parallel pool and operator tuning), [`invoke`] (imperative
//! invocation through the engine), [`random`] (reproducible random streams), [`tune`]
//! (convolution algorithm selection), [`library`] (operators of extension libraries,
//! `MXLoadLib`) and `ops` (the operator families).

pub mod custom;
pub mod gpu;
pub mod gpu_nn;
pub mod grad;
pub mod imgproc;
pub mod invoke;
pub mod kernel;
pub mod library;
mod ops;
pub mod param;
pub mod random;
pub mod resource;
pub(crate) mod simd;
pub mod tensor;
pub mod tune;

use crate::error::{Error, Result};
use crate::ndarray;
pub use crate::ndarray::Meta;
pub use ops::control_flow::{truth, Call as LoopCall, ControlFlow, LoopCalls};
use param::{Attrs, ParamSpec};
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CString};
use std::sync::{Arc, OnceLock};
use tensor::{OutBlob, TBlob};

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
#[derive(Debug, Clone, Copy)]
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
    /// Composed of other operators' calls ([`grad::Composed`]), as stock's FGradient graphs
    /// are: autograd records those calls when it records the backward pass (`create_graph`),
    /// so the gradient can be differentiated again. Backward operators declare it for
    /// higher-order gradients; it reads the call's inputs (`inputs`) and/or outputs (`outputs`).
    Composed { f: grad::ComposedFn, inputs: bool, outputs: bool },
}

impl Grad {
    /// Whether the declaration is [`Grad::None`].
    pub fn is_none(&self) -> bool {
        matches!(self, Grad::None)
    }
    /// Whether the declaration is [`Grad::Zero`].
    pub fn is_zero(&self) -> bool {
        matches!(self, Grad::Zero)
    }
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
    /// Those of these whose bit (`1 << index`) is set in `mask(attrs)`, in order (optional
    /// inputs anywhere: CTCLoss's `data_lengths` and `label_lengths` each by its own flag).
    Selected(&'static [&'static str], fn(&Attrs) -> u32),
}

impl Inputs {
    /// The names of a call's inputs with these parameters (`None`: variadic).
    pub fn names_for(&self, attrs: &Attrs) -> Option<Vec<&'static str>> {
        match *self {
            Inputs::Fixed(names) => Some(names.to_vec()),
            Inputs::Leading(names, count) => Some(names[..count(attrs).min(names.len())].to_vec()),
            Inputs::Selected(names, mask) => {
                let m = mask(attrs);
                Some(names.iter().enumerate().filter(|(i, _)| m & (1 << i) != 0).map(|(_, n)| *n).collect())
            }
            Inputs::Variadic(_) => None,
        }
    }
}

/// Which inputs an operator writes ([`OpDef::mutated_inputs`]).
#[derive(Clone, Copy, Debug)]
pub enum Mutates {
    /// Input indices; those past a call's input count are ignored, so a variadic operator
    /// lists those of its largest call.
    At(&'static [usize]),
    /// Positions counted from the end (1 = the last input).
    FromEnd(&'static [usize]),
    /// Every input (`reset_arrays`).
    All,
    /// Decided by the call's parameters (`Custom`: its property's auxiliary states), given
    /// the input count; only where the parameters are at hand ([`OpDef::mutated_inputs_of`]).
    Dynamic(fn(&Attrs, usize) -> smallvec::SmallVec<[usize; 4]>),
}

pub type InferFn = Box<dyn Fn(&Attrs, &[Meta]) -> Result<Vec<Meta>> + Send + Sync>;
/// A kernel: reads the inputs, writes the outputs (followed by the mutated inputs, see
/// [`OpDef::mutated_inputs`]).
pub type ComputeFn = Box<dyn Fn(&OpCtx, &[TBlob], &mut [OutBlob]) -> Result<()> + Send + Sync>;
/// Invocation of an operator that does not fit parse-infer-compute (see [`OpDef::invoke_with`]):
/// the operator, its inputs, the caller's outputs if any, and the parsed parameters; returns
/// the visible outputs and, for a call whose backward runs code of its own, that backward.
pub type InvokeFn = fn(&'static OpDef, &[&ndarray::NDArray], Option<&[&ndarray::NDArray]>, Attrs) -> Result<OwnInvoked>;
/// What an operator's own invocation returns: the visible outputs and the call's own backward.
pub type OwnInvoked = (Vec<ndarray::NDArray>, Option<Arc<dyn CustomBackward>>);

/// The backward of a call that runs code of its own rather than a backward operator's kernel
/// (`Custom` here; `autograd.Function`, whose backward the C layer implements with the
/// frontend's callback). Autograd keeps it with the recorded call.
pub trait CustomBackward: Send + Sync {
    /// Gradients of the call's inputs (`None` where `want` is false) from the gradients of its
    /// visible outputs.
    fn backward(&self, ograds: &[ndarray::NDArray], want: &[bool]) -> Result<Vec<Option<ndarray::NDArray>>>;
}

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
    /// This call's context with other parameters: for an operator that runs another's kernel
    /// (bilinear `UpSampling` is a `Deconvolution`).
    pub fn with_attrs<'b>(&'b self, attrs: &'b Attrs) -> OpCtx<'b> {
        OpCtx { attrs, req: self.req, rng: self.rng, is_train: self.is_train, temp: self.temp.clone() }
    }

    /// `bytes` of scratch memory for this kernel call: the operator's shared workspace, or
    /// memory of its own when it has none (a kernel called directly, as tests do).
    pub fn workspace(&self, bytes: usize) -> Result<resource::Scratch<'_>> {
        match &self.temp {
            Some(t) => t.get(bytes),
            None => Ok(resource::Scratch::owned(bytes)),
        }
    }
}

/// Graph inference of an operator's parameter inputs: given its parameters, the data's shape
/// (input 0; -1 for a dimension not known yet) and how many inputs the node has, the shapes of
/// the other inputs it determines, as `(input, shape)`. An error names what is inconsistent.
pub type ParamShapesFn = fn(&Attrs, &[i64], usize) -> Result<Vec<(usize, Vec<i64>)>>;

/// The input names a call's parameters give a variadic operator (see [`OpDef::input_names_of`]).
pub type InputNamesFn = fn(&Attrs) -> Result<Vec<String>>;

/// The parameters that give a source operator the output shape a graph found (see
/// [`OpDef::sized_by_graph`]); None when its own parameters decide its shape.
pub type SizedByGraphFn = fn(&Attrs, &[usize]) -> Option<Vec<(&'static str, String)>>;

/// Graph inference of outputs from partially known inputs (every rank known, some
/// dimensions -1): the output shapes, or None to leave them to the generic rule.
pub type PartialShapesFn = fn(&Attrs, &[Option<Vec<i64>>]) -> Option<Vec<Option<Vec<i64>>>>;

/// Graph inference of inputs from outputs: given the parameters and the partial shapes of the
/// inputs and outputs (`None`: unknown rank; -1: an unknown dimension), the input shapes they
/// determine, as `(input, shape)` (stock's backward shape inference: a `Reshape` whose
/// output is known fills its input's one unknown dimension; `_rnn_param_concat` its one
/// unknown input).
pub type InputShapesFn = fn(&Attrs, &[Option<Vec<i64>>], &[Option<Vec<i64>>]) -> Result<Vec<(usize, Vec<i64>)>>;

/// The positions of the parameters that code outside an operator's kernels reads.
#[derive(Debug, Clone, Copy, Default)]
struct ParamAt {
    num_args: Option<usize>,
    ctx: Option<usize>,
    dtype: Option<usize>,
    shape: Option<usize>,
}

impl ParamAt {
    fn of(params: &[ParamSpec], num_args_key: &str) -> Self {
        let at = |want: &dyn Fn(&ParamSpec) -> bool| params.iter().position(want);
        ParamAt {
            num_args: at(&|p| !num_args_key.is_empty() && p.name == num_args_key && p.ty == param::PType::Int),
            ctx: at(&|p| p.ty == param::PType::Ctx),
            dtype: at(&|p| p.name == "dtype" && matches!(p.ty, param::PType::DType | param::PType::Enum(_))),
            shape: at(&|p| p.name == "shape"),
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
    /// Where in `params` the count (`key_var_num_args`), the output context (a `ctx`
    /// parameter) and the output dtype (a `dtype` parameter) are: found once when the
    /// declaration is built, so calls read them by index ([`OpDef::num_args`],
    /// [`OpDef::ctx_of`], [`OpDef::dtype_of`]).
    param_at: ParamAt,
    pub num_outputs: fn(&Attrs) -> usize,
    /// Outputs the caller sees (the rest are internal, e.g. BatchNorm's saved statistics).
    pub num_visible_outputs: fn(&Attrs) -> usize,
    pub infer: InferFn,
    pub compute: ComputeFn,
    /// `(input, output)` pairs that may share memory.
    pub inplace: &'static [(usize, usize)],
    /// Inputs the kernel writes (stock's FMutateInputs: optimizer states, BatchNorm's moving
    /// statistics); see [`OpDef::mutated_inputs`].
    pub mutate_inputs: Mutates,
    pub resources: &'static [Resource],
    pub grad: Grad,
    /// Caller-given outputs may have any dtype (the kernel converts, as `_copyto` does).
    pub any_out_dtype: bool,
    /// With its `dtype` parameter unset ("None"), a caller-given output's dtype is the one
    /// produced (stock's sampling operators: `nd.random.uniform(..., out=float64_array)`, as
    /// Gluon's initializers call them); the kernel writes the output's dtype.
    pub dtype_from_out: bool,
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
    /// The names of a variadic operator's inputs when its parameters decide them (`Custom`:
    /// its property's arguments and auxiliary states), so that symbols compose by keyword
    /// and missing inputs become `<node>_<name>` variables, as stock's FListInputNames.
    pub input_names_of: Option<InputNamesFn>,
    /// Graph inference of the outputs from inputs of known rank but unknown dimensions (-1),
    /// where stock's rule differs from what the generic probing finds (see
    /// `symbol::infer`): None leaves it to the probing.
    pub partial_shapes: Option<PartialShapesFn>,
    /// For an operator without inputs whose output shape a graph decides (`_arange` with
    /// `infer_range`, which [`OpDef::partial_shapes`] leaves partial): the parameters, as
    /// (name, value), that give it the shape graph inference found. Executors run such a
    /// node with them.
    pub sized_by_graph: Option<SizedByGraphFn>,
    /// Stock declares no input names for it (no FListInputNames: `Activation`,
    /// `SoftmaxActivation`), so an executor monitor labels its inputs `<node>_input<i>`.
    pub unnamed_inputs: bool,
    /// When every input has one shape and dtype, the output is one array of that shape and
    /// dtype (element-wise operators, and broadcasting ones on equal shapes): the imperative
    /// call then skips general inference ([`invoke`]'s same-shape path).
    pub same_shape: bool,
    /// The first this many inputs (all: `usize::MAX`) and the first output have one shape
    /// (stock's element-wise shape rule): graph inference fills any of them that is unknown
    /// from one that is known, in both directions. 0: no such rule.
    pub elementwise_shape: usize,
    /// Graph inference of parameter inputs (weights, biases, statistics) from the data shape
    /// (input 0), for inputs whose shape is not given (stock's backward shape inference).
    pub param_shapes: Option<ParamShapesFn>,
    /// Graph inference of inputs from the outputs (see [`InputShapesFn`]).
    pub input_shapes: Option<InputShapesFn>,
    /// Stock's output names (FListOutputNames), when they are not just `output`.
    pub output_names: &'static [&'static str],
    /// Initialisers set on variable inputs when a symbol is composed (stock's
    /// FSetInputVarAttrOnCompose): `(input, __init__ value)`.
    pub input_inits: &'static [(usize, &'static str)],
    /// Parameter inputs (all but input 0) are float32 when the data is float16 (stock's
    /// normalizations): the dtype graph inference gives them when nothing else says.
    pub float32_params: bool,
    /// Parameter inputs (all but input 0) have the dtype the `dtype` parameter names when
    /// nothing else says (`Embedding`'s weight), not the data's.
    pub params_take_dtype: bool,
    /// An AMP cast: output `i` is input `i` in another dtype (`MXSymbolRemoveAmpCast` takes
    /// such nodes out of a graph).
    pub amp_cast: bool,
    /// The output's dtype is the `dtype` parameter whatever the input's (`Cast`): graph
    /// inference does not give an unknown input the output's dtype.
    pub converts_dtype: bool,
    /// Inputs whose dtype is fixed (stock's type inference assigns it: `batch_take`'s int32
    /// indices): graph inference gives them that dtype when nothing else says.
    pub input_dtypes: &'static [(usize, ndarray::DType)],
    /// For a stub ([`OpDef::not_supported`]): the count parameter and the arguments (name,
    /// type) stock lists, which `MXSymbolGetAtomicSymbolInfo` reports in place of the
    /// declaration's own, so the frontend generates stock's signature.
    pub stub_schema: Option<(&'static str, Vec<(&'static str, &'static str)>)>,
    /// Never recomputed by mirroring (`MXNET_BACKWARD_DO_MIRROR`): expensive, or not the same
    /// when run twice.
    pub never_mirrored: bool,
    /// How the operator runs on a GPU ([`gpu`]); `None`: not on GPUs yet.
    pub gpu: Option<gpu::GpuKernel>,
    /// Keeps a state per node of a bound executor ([`invoke::StateSlot`]): a stateful
    /// extension operator, whose state stock makes once per node at bind time.
    pub node_state: bool,
    /// A control-flow operator's graph arguments (stock's FInputGraph): the names of its
    /// leading arguments that are graphs, not tensors (`_foreach`'s `fn`). A symbol keeps them
    /// with the node, outside its inputs; the count parameter counts them too.
    pub graph_inputs: &'static [&'static str],
    /// A control-flow operator's parameters, checked ([`ControlFlow`]); executors run its
    /// graphs.
    pub control_flow: Option<fn(&Attrs) -> Result<ControlFlow>>,
    /// The operator's part in the inference fusion of graph runs (`executor/fuse.rs`), for
    /// the call's parameters: `None` takes no part.
    pub fusion: Option<fn(&Attrs) -> Option<Fusion>>,
    /// Two calls with equal attributes and inputs may be computed once (the graph pass of
    /// `symbol/cse.rs`, which also leaves out operators that write an input, draw random
    /// numbers or keep a state); false for those stock runs with a state
    /// ([`STOCK_STATEFUL`]), `Custom` and extension libraries' operators.
    pub mergeable: bool,
    /// Name interned for the engine and profiler.
    engine_name: OnceLock<Arc<str>>,
    c_info: OnceLock<CInfo>,
}

fn one(_: &Attrs) -> usize {
    1
}

/// An operator's part in the inference fusion of a graph run (`MXNET_MKLDNN_ENABLED`, the
/// executor's `fuse` module): a convolution followed by steps that each read the chain's value
/// once and nothing else reads runs as one operation, the steps applied to each output plane
/// as the convolution writes it, with the same arithmetic as the operators they replace (so
/// the outputs are identical). A BatchNorm step ([`FuseStep::Scale`]) that no convolution's
/// chain takes heads a chain of its own of element-wise steps (ReLU, clip:
/// [`fused_batch_norm`]), as DenseNet's and pre-activation ResNet's BatchNorm-ReLU pairs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fusion {
    /// Starts a chain: a convolution whose kernel applies [`FuseStep`]s
    /// ([`fused_convolution`]).
    Head,
    /// A step applied to the chain's value.
    Step(FuseStep),
}

/// One step of a fused chain (see [`Fusion`]); the value is input 0 unless said otherwise.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FuseStep {
    /// BatchNorm with its moving statistics (inputs 1-4: gamma, beta, moving_mean,
    /// moving_var; its hidden outputs unread): `x · scale + shift` per channel. `global`:
    /// `use_global_stats`, so the step also applies in training mode.
    Scale { eps: f64, fix_gamma: bool, global: bool },
    /// `Activation(act_type='relu')`: `max(x, 0)`.
    Relu,
    /// `clip(x, lo, hi)` (stock's rule: above `hi` first).
    Clip { lo: f64, hi: f64 },
    /// The element-wise sum of the value and the other input, in the graph's operand order:
    /// `value_first` when the value is input 0 (the operator declares `true`; the chain
    /// search sets it).
    Add { value_first: bool },
}

/// Run a convolution (`cx.attrs` its parameters; `ins` its inputs, then each step's extra
/// inputs in order) with `steps` applied to its output (float32 only).
pub(crate) fn fused_convolution(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob], steps: &[FuseStep]) -> Result<()> {
    ops::conv::fused(cx, ins, outs, steps)
}

/// Run a BatchNorm (`cx.attrs` its parameters; `ins` its five inputs; `outs` its output,
/// then its lent moving statistics) by its moving statistics, with element-wise `steps`
/// applied to its output (float32 only).
pub(crate) fn fused_batch_norm(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob], steps: &[FuseStep]) -> Result<()> {
    ops::nn::fused_batch_norm(cx, ins, outs, steps)
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
            param_at: ParamAt::default(),
            num_outputs: one,
            num_visible_outputs: one,
            infer,
            compute,
            inplace: &[],
            mutate_inputs: Mutates::At(&[]),
            resources: &[],
            grad: Grad::None,
            any_out_dtype: false,
            dtype_from_out: false,
            not_supported: false,
            open_params: false,
            invoke_with: None,
            is_backward: false,
            listed_inputs: None,
            input_names_of: None,
            partial_shapes: None,
            sized_by_graph: None,
            unnamed_inputs: false,
            same_shape: false,
            elementwise_shape: 0,
            param_shapes: None,
            input_shapes: None,
            output_names: &[],
            input_inits: &[],
            never_mirrored: false,
            float32_params: false,
            params_take_dtype: false,
            amp_cast: false,
            converts_dtype: false,
            input_dtypes: &[],
            stub_schema: None,
            gpu: None,
            node_state: false,
            graph_inputs: &[],
            control_flow: None,
            fusion: None,
            mergeable: true,
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
    pub fn unnamed_inputs(mut self) -> Self {
        self.unnamed_inputs = true;
        self
    }
    pub fn partial_shapes(mut self, f: PartialShapesFn) -> Self {
        self.partial_shapes = Some(f);
        self
    }
    /// See [`OpDef::sized_by_graph`].
    pub fn sized_by_graph(mut self, f: SizedByGraphFn) -> Self {
        self.sized_by_graph = Some(f);
        self
    }
    pub fn input_names_of(mut self, f: InputNamesFn) -> Self {
        self.input_names_of = Some(f);
        self
    }
    pub fn listed_inputs(mut self, names: &'static [&'static str]) -> Self {
        self.listed_inputs = Some(names);
        self
    }
    /// The operator's part in inference fusion ([`Fusion`]).
    pub fn fusion(mut self, f: fn(&Attrs) -> Option<Fusion>) -> Self {
        self.fusion = Some(f);
        self
    }
    pub fn alias(mut self, names: &[&'static str]) -> Self {
        self.aliases.extend_from_slice(names);
        self
    }
    /// The operator's GPU form.
    pub fn gpu(mut self, kernel: gpu::GpuKernel) -> Self {
        self.gpu = Some(kernel);
        self
    }
    pub fn doc(mut self, doc: impl Into<String>) -> Self {
        self.doc = doc.into();
        self
    }
    pub fn params(mut self, params: &'static [ParamSpec]) -> Self {
        self.params = params;
        self.param_at = ParamAt::of(params, self.key_var_num_args);
        self
    }
    pub fn num_args_key(mut self, key: &'static str) -> Self {
        self.key_var_num_args = key;
        self.param_at = ParamAt::of(self.params, key);
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
    /// See [`OpDef::elementwise_shape`]: every input.
    pub fn elementwise_shape(self) -> Self {
        self.elementwise_shape_of(usize::MAX)
    }
    /// See [`OpDef::elementwise_shape`]: the first `n` inputs.
    pub fn elementwise_shape_of(mut self, n: usize) -> Self {
        self.elementwise_shape = n;
        self
    }
    /// See [`OpDef::param_shapes`].
    pub fn param_shapes(mut self, f: ParamShapesFn) -> Self {
        self.param_shapes = Some(f);
        self
    }
    /// See [`OpDef::input_shapes`].
    pub fn input_shapes(mut self, f: InputShapesFn) -> Self {
        self.input_shapes = Some(f);
        self
    }
    /// See [`OpDef::output_names`].
    pub fn output_names(mut self, names: &'static [&'static str]) -> Self {
        self.output_names = names;
        self
    }
    /// See [`OpDef::input_inits`].
    pub fn input_inits(mut self, inits: &'static [(usize, &'static str)]) -> Self {
        self.input_inits = inits;
        self
    }
    /// See [`OpDef::amp_cast`].
    pub fn amp_cast(mut self) -> Self {
        self.amp_cast = true;
        self
    }
    /// See [`OpDef::input_dtypes`].
    pub fn input_dtypes(mut self, fixed: &'static [(usize, ndarray::DType)]) -> Self {
        self.input_dtypes = fixed;
        self
    }
    /// See [`OpDef::converts_dtype`].
    pub fn converts_dtype(mut self) -> Self {
        self.converts_dtype = true;
        self
    }
    /// See [`OpDef::float32_params`].
    pub fn float32_params(mut self) -> Self {
        self.float32_params = true;
        self
    }
    /// See [`OpDef::params_take_dtype`].
    pub fn params_take_dtype(mut self) -> Self {
        self.params_take_dtype = true;
        self
    }
    /// See [`OpDef::never_mirrored`].
    pub fn never_mirrored(mut self) -> Self {
        self.never_mirrored = true;
        self
    }
    pub fn mutates(mut self, inputs: &'static [usize]) -> Self {
        self.mutate_inputs = Mutates::At(inputs);
        self
    }
    /// The parameters decide which inputs are mutated (see [`Mutates::Dynamic`]).
    pub fn mutates_dynamic(mut self, f: fn(&Attrs, usize) -> smallvec::SmallVec<[usize; 4]>) -> Self {
        self.mutate_inputs = Mutates::Dynamic(f);
        self
    }
    /// Every input is mutated (see [`Mutates::All`]).
    pub fn mutates_all(mut self) -> Self {
        self.mutate_inputs = Mutates::All;
        self
    }
    /// Mutated inputs counted from the end of the input list (1 = the last input): for a
    /// backward operator whose leading inputs (output gradients) vary in number.
    pub fn mutates_from_end(mut self, inputs: &'static [usize]) -> Self {
        self.mutate_inputs = Mutates::FromEnd(inputs);
        self
    }
    /// The inputs a call with `n_inputs` inputs writes, in declaration order (the kernel finds
    /// their blobs after its outputs in this order).
    pub fn mutated_inputs(&self, n_inputs: usize) -> smallvec::SmallVec<[usize; 4]> {
        match self.mutate_inputs {
            Mutates::At(at) => at.iter().copied().filter(|&i| i < n_inputs).collect(),
            Mutates::FromEnd(back) => {
                back.iter().filter(|&&k| k >= 1 && k <= n_inputs).map(|&k| n_inputs - k).collect()
            }
            Mutates::All => (0..n_inputs).collect(),
            Mutates::Dynamic(_) => smallvec::SmallVec::new(),
        }
    }
    /// [`OpDef::mutated_inputs`] for a call with these parameters (`None`: not parsed).
    pub fn mutated_inputs_of(&self, attrs: Option<&Attrs>, n_inputs: usize) -> smallvec::SmallVec<[usize; 4]> {
        match (self.mutate_inputs, attrs) {
            (Mutates::Dynamic(f), Some(a)) => f(a, n_inputs).into_iter().filter(|&i| i < n_inputs).collect(),
            _ => self.mutated_inputs(n_inputs),
        }
    }
    /// Whether some call of the operator writes one of its inputs.
    pub fn mutates_any(&self) -> bool {
        match self.mutate_inputs {
            Mutates::At(l) | Mutates::FromEnd(l) => !l.is_empty(),
            Mutates::All | Mutates::Dynamic(_) => true,
        }
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
    pub fn dtype_from_out(mut self) -> Self {
        self.dtype_from_out = true;
        self
    }
    pub fn not_supported(mut self) -> Self {
        self.not_supported = true;
        self
    }
    /// See [`OpDef::stub_schema`].
    pub fn stub_schema(mut self, key: &'static str, args: Vec<(&'static str, &'static str)>) -> Self {
        self.stub_schema = Some((key, args));
        self
    }
    pub fn open_params(mut self) -> Self {
        self.open_params = true;
        self
    }
    /// See [`OpDef::graph_inputs`] and [`OpDef::control_flow`].
    pub fn graph_inputs(mut self, names: &'static [&'static str], of: fn(&Attrs) -> Result<ControlFlow>) -> Self {
        self.graph_inputs = names;
        self.control_flow = Some(of);
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
            Inputs::Selected(names, mask) => (mask(attrs) & ((1u32 << names.len()) - 1)).count_ones() as usize,
            Inputs::Variadic(_) if self.key_var_num_args.is_empty() => given,
            Inputs::Variadic(_) => {
                let n = self.num_args(attrs) - self.graph_inputs.len() as i64;
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
        self.engine_name.get_or_init(|| crate::intern::intern(self.name))
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
        let n = (num_inputs + self.graph_inputs.len()).to_string();
        if !pairs.iter().any(|(k, _)| *k == self.key_var_num_args) {
            pairs.push((self.key_var_num_args, &n));
        }
        Attrs::parse(self.name, self.params, pairs)
    }

    /// The count parameter (`key_var_num_args`) of a call of this variadic operator.
    /// Panics for an operator without one (the registry checks that every operator that
    /// names one declares it as an integer).
    pub fn num_args(&self, attrs: &Attrs) -> i64 {
        let i = self.param_at.num_args.unwrap_or_else(|| panic!("operator {} has no count parameter", self.name));
        attrs.typed::<i64>(self.params, i)
    }

    /// Whether the operator has a `ctx` parameter (creation and random operators): the
    /// context it gives decides where the output lives.
    pub fn has_ctx(&self) -> bool {
        self.param_at.ctx.is_some()
    }

    /// The context a call's `ctx` parameter gives (None: the operator has none, or the call
    /// gave none).
    pub fn ctx_of(&self, attrs: &Attrs) -> Option<crate::context::Context> {
        self.param_at.ctx.and_then(|i| attrs.typed::<Option<crate::context::Context>>(self.params, i))
    }

    /// The dtype a call's `dtype` parameter names, declared as a dtype or as an enum of dtype
    /// names, for graph inference's default type rule (None: the operator has no such
    /// parameter, or the call gave `None`).
    pub fn dtype_of(&self, attrs: &Attrs) -> Option<ndarray::DType> {
        let i = self.param_at.dtype?;
        match attrs.value(self.params, i) {
            param::Value::DType(d) => Some(*d),
            param::Value::Str(name) => param::dtype_from_name(name),
            _ => None,
        }
    }

    /// The arguments `MXSymbolGetAtomicSymbolInfo` lists: tensor inputs, then parameters.
    fn arguments(&self) -> Vec<(String, String, String)> {
        if let Some((_, stock)) = &self.stub_schema {
            return stock.iter().map(|(n, t)| (n.to_string(), t.to_string(), String::new())).collect();
        }
        let mut args = Vec::new();
        for n in self.graph_inputs {
            args.push((n.to_string(), "Symbol".to_string(), format!("Input graph {n}.")));
        }
        match (self.listed_inputs, self.inputs) {
            (Some(names), _) => {
                for n in names {
                    args.push((n.to_string(), "NDArray-or-Symbol".to_string(), format!("Input {n}")));
                }
            }
            (None, Inputs::Fixed(names) | Inputs::Leading(names, _) | Inputs::Selected(names, _)) => {
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
            key_var_num_args: c_string(op.stub_schema.as_ref().map_or(op.key_var_num_args, |(key, _)| key)),
            _strings: strings,
            arg_names: n,
            arg_types: t,
            arg_descs: d,
        }
    }
}

/// All operators: the built-in ones, and those extension libraries added since
/// ([`Registry::add`]).
pub struct Registry {
    ops: Vec<OpDef>,
    by_name: HashMap<&'static str, usize>,
    /// Operators added at run time (leaked: they live, at a fixed address, for the process).
    added: crate::sync::RwLock<Added>,
}

/// The operators added at run time, and the lists the C API hands out.
struct Added {
    ops: Vec<&'static OpDef>,
    by_name: HashMap<&'static str, &'static OpDef>,
    /// The current lists (every name and every handle). A new set is made when operators are
    /// added and the old one is kept (leaked), since callers may still hold its arrays.
    lists: &'static Lists,
}

/// Every name (canonical and aliases, sorted), as C strings with pointers to them, and every
/// operator's handle (built-in ones in canonical order, then added ones).
struct Lists {
    _names: Vec<CString>,
    name_ptrs: Vec<*const c_char>,
    handles: Vec<*mut c_void>,
}

// SAFETY: the pointers address strings owned by the same `Lists`, or operators that live for
// the process; a `Lists` is never mutated once built.
unsafe impl Send for Lists {}
unsafe impl Sync for Lists {}

impl Lists {
    fn new<'a>(ops: impl Iterator<Item = &'a OpDef>) -> &'static Lists {
        let mut names = Vec::new();
        let mut handles = Vec::new();
        for op in ops {
            names.push(op.name);
            names.extend_from_slice(&op.aliases);
            handles.push(op.handle());
        }
        names.sort_unstable();
        let c_names: Vec<CString> = names.iter().map(|n| c_string(n)).collect();
        let name_ptrs = c_names.iter().map(|c| c.as_ptr()).collect();
        Box::leak(Box::new(Lists { _names: c_names, name_ptrs, handles }))
    }
}

fn check_declaration(op: &OpDef) -> Result<()> {
    if !op.key_var_num_args.is_empty() && op.param_at.num_args.is_none() {
        return Err(Error::internal(format!(
            "operator {}: its count parameter {} is not a declared integer parameter",
            op.name, op.key_var_num_args
        )));
    }
    Ok(())
}

/// Operators stock 1.9.1 runs with a state (its `OperatorProperty` operators, and those it
/// registers `FCreateOpState` for), which its common-subexpression pass never merges. Two of
/// its legacy names are aliases here (`Convolution_v1` of Convolution, `_CrossDeviceCopy` of
/// `_copy`), whose nodes merge as those operators' do.
const STOCK_STATEFUL: &[&str] = &[
    "BatchNorm_v1",
    "BilinearSampler",
    "Correlation",
    "Crop",
    "GridGenerator",
    "IdentityAttachKLSparseReg",
    "InstanceNorm",
    "L2Normalization",
    "MakeLoss",
    "Pad",
    "Pooling_v1",
    "ROIPooling",
    "SVMOutput",
    "SequenceLast",
    "SequenceMask",
    "SequenceReverse",
    "SliceChannel",
    "SpatialTransformer",
    "SwapAxis",
    "_NDArray",
    "_Native",
    "_contrib_DeformableConvolution",
    "_contrib_DeformablePSROIPooling",
    "_contrib_ModulatedDeformableConvolution",
    "_contrib_MultiBoxDetection",
    "_contrib_MultiBoxPrior",
    "_contrib_MultiBoxTarget",
    "_contrib_MultiProposal",
    "_contrib_PSROIPooling",
    "_contrib_Proposal",
    "_contrib_SyncBatchNorm",
    "_contrib_count_sketch",
    "_contrib_fft",
    "_contrib_ifft",
    "RNN",
    "Dropout",
    "Custom",
    "_CachedOp",
];

impl Registry {
    fn build() -> Registry {
        let mut ops = Vec::new();
        ops::register_all(&mut ops);
        for op in &mut ops {
            op.mergeable &= !STOCK_STATEFUL.contains(&op.name);
        }
        let mut by_name = HashMap::new();
        for (i, op) in ops.iter().enumerate() {
            for n in std::iter::once(&op.name).chain(op.aliases.iter()) {
                let prev = by_name.insert(*n, i);
                assert!(prev.is_none(), "operator name {n} registered twice");
            }
            if let Err(e) = check_declaration(op) {
                panic!("{e}");
            }
        }
        // The operators' addresses are their handles: `ops` is not moved or changed after this.
        let lists = Lists::new(ops.iter());
        let added = Added { ops: Vec::new(), by_name: HashMap::new(), lists };
        Registry { ops, by_name, added: crate::sync::RwLock::new(added) }
    }

    /// The built-in operators.
    pub fn ops(&self) -> &[OpDef] {
        &self.ops
    }
    /// The operator named `name` (canonical or alias), built-in or added.
    pub fn get(&'static self, name: &str) -> Option<&'static OpDef> {
        match self.by_name.get(name) {
            Some(&i) => Some(&self.ops[i]),
            None => self.added.read().by_name.get(name).copied(),
        }
    }
    /// Every name, aliases included (sorted). The array lives as long as the process.
    pub fn all_name_ptrs(&self) -> &'static [*const c_char] {
        let lists: &'static Lists = self.added.read().lists;
        &lists.name_ptrs
    }
    /// Every operator's handle. The array lives as long as the process.
    pub fn handles(&self) -> &'static [*mut c_void] {
        let lists: &'static Lists = self.added.read().lists;
        &lists.handles
    }

    /// Add operators (an extension library's) under names not taken yet; all or none are
    /// added. They live for the rest of the process.
    pub fn add(&'static self, defs: Vec<OpDef>) -> Result<Vec<&'static OpDef>> {
        let mut added = self.added.write();
        let mut fresh = std::collections::HashSet::new();
        for op in &defs {
            check_declaration(op)?;
            for n in std::iter::once(&op.name).chain(op.aliases.iter()) {
                if self.by_name.contains_key(n) || added.by_name.contains_key(n) || !fresh.insert(*n) {
                    return Err(Error::not_supported(format!(
                        "replacing the registered operator {n} (an extension library's operator of that name)"
                    )));
                }
            }
        }
        let leaked: Vec<&'static OpDef> = defs.into_iter().map(|d| &*Box::leak(Box::new(d))).collect();
        for &op in &leaked {
            for n in std::iter::once(&op.name).chain(op.aliases.iter()) {
                added.by_name.insert(n, op);
            }
            added.ops.push(op);
        }
        added.lists = Lists::new(self.ops.iter().chain(added.ops.iter().copied()));
        Ok(leaked)
    }

    /// The operator behind a handle given out by [`OpDef::handle`]; anything else is an error.
    pub fn from_handle(&'static self, h: *const c_void) -> Result<&'static OpDef> {
        if h.is_null() {
            return Err(Error::value("operator handle is NULL"));
        }
        let base = self.ops.as_ptr() as usize;
        let size = std::mem::size_of::<OpDef>();
        let addr = h as usize;
        if addr >= base && (addr - base) % size == 0 && (addr - base) / size < self.ops.len() {
            return Ok(&self.ops[(addr - base) / size]);
        }
        let added = self.added.read();
        added
            .ops
            .iter()
            .copied()
            .find(|&op| std::ptr::eq(op, h as *const OpDef))
            .ok_or_else(|| Error::value(format!("{h:p} is not an operator handle")))
    }
}

impl OpDef {
    /// Whether the operator creates its output from a `shape` parameter, without tensor
    /// inputs (`_zeros`, `_full`, the samplers): in legacy shape semantics a 0 dimension of
    /// that shape means "unknown" (stock's InitShape), which graph inference fills in.
    /// A creation operator's `shape` parameter as given (None: no such parameter, or `None`).
    pub fn shape_of<'a>(&self, attrs: &'a Attrs) -> Option<&'a [i64]> {
        match attrs.value(self.params, self.param_at.shape?) {
            param::Value::Shape(v) => Some(v),
            _ => None,
        }
    }

    pub fn creates_from_shape(&self) -> bool {
        self.param_at.shape.is_some() && matches!(self.inputs, Inputs::Fixed(&[]))
    }

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

    /// Every forward operator, called once on small float32 inputs with its defaults (required
    /// parameters given a value of their type), reads only the parameter struct its own table
    /// declares: `op_params!`'s `of` panics otherwise, and a helper shared by operators of
    /// different tables is where that would hide.
    #[test]
    fn every_operator_reads_only_its_own_parameter_struct() {
        use crate::ndarray::NDArray;
        use param::PType;
        let mut wrong = Vec::new();
        let mut called = 0;
        for op in registry().ops() {
            if op.is_backward || op.not_supported || op.invoke_with.is_some() {
                continue;
            }
            let dummy = |ty: PType| match ty {
                PType::Bool => "False",
                PType::Int => "1",
                PType::Float => "1",
                PType::Shape => "(1,)",
                PType::OptShape => "(None,)",
                PType::FloatTuple => "(1.0,)",
                PType::Enum(names) => names[0],
                PType::DType => "float32",
                PType::Ctx => "cpu(0)",
                PType::Str => "x",
            };
            let kv: Vec<(&str, &str)> =
                op.params.iter().filter(|s| s.default.is_none()).map(|s| (s.name, dummy(s.ty))).collect();
            let Ok(attrs) = op.parse_attrs(kv.iter().copied(), 2) else { continue };
            let Ok(n) = op.num_inputs(&attrs, 2) else { continue };
            // Ones, not whatever the pool hands out: the calls are the same on every run.
            let inputs: Vec<NDArray> =
                (0..n).map(|_| crate::ndarray::testing::array_f32(&[2, 3, 4], &[1.0; 24])).collect();
            let refs: Vec<&NDArray> = inputs.iter().collect();
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let outs = invoke::invoke_attrs(op, &refs, None, attrs.clone())?;
                outs.iter().try_for_each(|o| o.wait(false))
            }));
            called += 1;
            let text = match outcome {
                Err(payload) => {
                    payload.downcast_ref::<String>().cloned().or(payload.downcast_ref::<&str>().map(|s| s.to_string()))
                }
                Ok(Err(e)) => Some(e.to_string()),
                Ok(Ok(())) => None,
            };
            if let Some(t) = text.filter(|t| t.contains("reads parameters of another table")) {
                wrong.push(format!("{}: {t}", op.name));
            }
        }
        assert!(called > 200, "only {called} operators were called");
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    /// Parameters are read through the struct their table declares (`op_params!`), not by
    /// string key: `Attrs`' getters by name exist only in test builds, so the library cannot
    /// call them, and this test keeps the crates' test code off them too (outside
    /// `op/param.rs`, whose own tests check parsing).
    #[test]
    fn parameters_are_read_through_declared_structs() {
        const GETTERS: &[&str] = &[
            "has",
            "int",
            "float",
            "bool",
            "str",
            "shape",
            "opt_int",
            "opt_float",
            "opt_shape",
            "opt_tuple",
            "floats",
            "dtype",
            "ctx",
            "is_none",
        ];
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = vec![root.clone(), root.join("../../c-api/src")];
        let mut reads = Vec::new();
        while let Some(p) = files.pop() {
            if p.is_dir() {
                files.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
                continue;
            }
            if p.extension().is_none_or(|e| e != "rs") || p.ends_with("op/param.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&p).unwrap();
            for (n, line) in text.lines().enumerate() {
                for g in GETTERS {
                    let call = format!(".{g}(\"");
                    reads.extend(line.match_indices(&call).map(|_| format!("{}:{}", p.display(), n + 1)));
                }
            }
        }
        assert!(
            reads.is_empty(),
            "{} parameter reads by string key; declare the parameters with op_params! and \
             read the struct (docs/adding-an-operator.md):\n{}",
            reads.len(),
            reads.join("\n")
        );
    }

    /// An operator is described in its declaration only: no code outside `crates/core/src/op` matches on
    /// an operator's name (in a `match` arm, a comparison, `matches!`, or a list of names).
    /// Looking an operator up by name (`op::lookup("...")`) is not matching.
    #[test]
    fn no_code_outside_src_op_matches_on_an_operator_name() {
        let r = registry();
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        // This crate and the C layer's.
        let mut files = vec![root.clone(), root.join("../../c-api/src")];
        let mut found = Vec::new();
        // A list of strings (`["a", "b"]`), not an index into a map (`j["a"]`).
        let list_literal = |code: &str| {
            code.match_indices("[\"").any(|(i, _)| {
                code[..i].chars().next_back().is_none_or(|c| !(c.is_alphanumeric() || c == ']' || c == ')' || c == '_'))
            })
        };
        while let Some(p) = files.pop() {
            if p.is_dir() {
                if p != root.join("op") {
                    files.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
                }
                continue;
            }
            if p.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&p).unwrap();
            for (n, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("").trim();
                let matching = code.contains("=>")
                    || code.contains("==")
                    || code.contains("!=")
                    || code.contains("matches!")
                    || code.contains("[&str")
                    || list_literal(code)
                    || code.contains(".starts_with(")
                    || code.contains(".eq(")
                    || code.contains("&str = \"")
                    || code.starts_with('|')
                    || (code.starts_with('"') && (code.ends_with(',') || code.ends_with(']') || code.ends_with("];")));
                if !matching {
                    continue;
                }
                for lit in code.split('"').skip(1).step_by(2) {
                    if r.get(lit).is_some() {
                        found.push(format!("{}:{}: {}", p.display(), n + 1, line.trim()));
                    }
                }
            }
        }
        assert!(found.is_empty(), "operator names matched outside crates/core/src/op:\n{}", found.join("\n"));
    }

    /// The rules graph inference and composition took from per-name tables are the
    /// declarations' own now (issue 33): spot checks of each.
    #[test]
    fn declarations_carry_their_graph_rules() {
        let r = registry();
        for name in ["elemwise_add", "_plus", "relu", "exp", "_copy", "identity", "clip", "add_n", "ElementWiseSum"] {
            assert_eq!(r.get(name).unwrap().elementwise_shape, usize::MAX, "{name}");
        }
        for name in ["Activation", "BlockGrad", "stop_gradient", "Dropout", "zeros_like", "ones_like", "_maximum"] {
            assert_eq!(r.get(name).unwrap().elementwise_shape, usize::MAX, "{name}");
        }
        assert_eq!(r.get("softmax").unwrap().elementwise_shape, 1, "the length input has its own shape");
        for name in ["broadcast_add", "dot", "Concat", "FullyConnected", "reshape"] {
            assert_eq!(r.get(name).unwrap().elementwise_shape, 0, "{name}");
        }
        assert_eq!(r.get("BatchNorm").unwrap().output_names, ["output", "mean", "var"]);
        assert_eq!(r.get("LayerNorm").unwrap().output_names, ["output", "mean", "std"]);
        assert_eq!(r.get("Dropout").unwrap().output_names, ["output", "mask"]);
        assert!(r.get("amp_cast").unwrap().amp_cast && !r.get("Cast").unwrap().amp_cast);
        assert!(r.get("BatchNorm").unwrap().float32_params && r.get("LayerNorm").unwrap().float32_params);
        assert_eq!(r.get("BatchNorm").unwrap().input_inits.iter().map(|p| p.0).collect::<Vec<_>>(), [3, 4]);
        for name in
            ["Convolution", "FullyConnected", "Concat", "SoftmaxOutput", "Dropout", "BatchNorm", "dot", "batch_dot"]
        {
            assert!(r.get(name).unwrap().never_mirrored, "{name}");
        }
        let attrs = |op: &'static OpDef, kv: &[(&str, &str)]| op.parse_attrs(kv.iter().copied(), 3).unwrap();
        let fc = r.get("FullyConnected").unwrap();
        let rule = fc.param_shapes.unwrap();
        let a = attrs(fc, &[("num_hidden", "10")]);
        assert_eq!(rule(&a, &[4, 3, 5], 3).unwrap(), [(1, vec![10, 15]), (2, vec![10])]);
        assert_eq!(rule(&a, &[4, -1, 5], 3).unwrap(), [(1, vec![10, -1]), (2, vec![10])]);
        let a = attrs(fc, &[("num_hidden", "10"), ("flatten", "False")]);
        assert_eq!(rule(&a, &[4, 3, 5], 3).unwrap(), [(1, vec![10, 5]), (2, vec![10])]);
        let conv = r.get("Convolution").unwrap();
        let a = attrs(conv, &[("kernel", "(3,3)"), ("num_filter", "8"), ("num_group", "2")]);
        assert_eq!(conv.param_shapes.unwrap()(&a, &[1, 4, 9, 9], 3).unwrap(), [(1, vec![8, 2, 3, 3]), (2, vec![8])]);
        let err = conv.param_shapes.unwrap()(&a, &[1, 4, 9], 3).unwrap_err().to_string();
        assert!(err.contains("a 2-d kernel needs 4-d data, got data shape (1,4,9)"), "{err}");
        let bn = r.get("BatchNorm").unwrap();
        let a = bn.parse_attrs([("axis", "-1")], 5).unwrap();
        assert_eq!(bn.param_shapes.unwrap()(&a, &[2, 3, 7], 5).unwrap().len(), 4);
        assert!(bn.param_shapes.unwrap()(&a, &[2, 3, 7], 5).unwrap().iter().all(|(_, s)| s == &[7]));
    }
}
