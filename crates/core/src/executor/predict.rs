//! The Predict API's predictor (`c_predict_api.h`): a symbol and its parameters loaded from
//! memory (a `-symbol.json` and a `-0000.params` as `HybridBlock.export` writes them), bound
//! for inference to input shapes given by name; reshaped predictors and the per-thread
//! predictors of `MXPredCreateMultiThread` share the parameters. Also the Predict API's
//! NDArray lists (`MXNDListCreate`): a list file's arrays as float32 values.

use super::bind::{zeros, Executor};
use super::Monitor;
use crate::autograd::GradReq;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::ndarray::{io, np_shape, DType, NDArray};
use crate::symbol::{infer, InputKind, Symbol};
#[cfg(test)]
use std::sync::Arc;

/// What a predictor is made from (`MXPredCreate*`'s arguments).
pub struct PredictorSpec<'a> {
    pub symbol_json: &'a str,
    /// A parameter file's bytes: `arg:<name>` and `aux:<name>` entries (others are ignored).
    pub params: &'a [u8],
    pub ctx: Context,
    /// Input shapes by argument name.
    pub inputs: &'a [(String, Vec<usize>)],
    /// `MXPredCreatePartialOut`: the nodes whose outputs (`<key>_output`) the predictor
    /// computes instead of the symbol's; empty: the symbol's outputs.
    pub outputs: &'a [String],
    /// `MXPredCreateEx`: dtypes of arguments the parameter file does not hold (float32
    /// otherwise).
    pub dtypes: &'a [(String, DType)],
}

/// A bound inference graph.
pub struct Predictor {
    /// The predictor's symbol (with `outputs` applied).
    sym: Symbol,
    exec: Executor,
    out_shapes: Vec<Vec<usize>>,
    out_dtypes: Vec<DType>,
}

/// An array's shape and dtype.
type Spec = (Vec<usize>, DType);

/// The inferred shape and dtype of each input node (`list_inputs` order) and of each head;
/// an error naming what inference could not determine.
fn infer_inputs(
    sym: &Symbol,
    shapes: &[Option<Vec<i64>>],
    dtypes: &[Option<DType>],
    unknown_keys: &[&str],
) -> Result<(Vec<Spec>, Vec<Spec>)> {
    let g = sym.graph();
    let r = infer::infer(&g, shapes, dtypes, np_shape::get() != 0)?;
    let known = |e: usize| -> Option<Spec> {
        let s = r.shapes[e].as_ref()?.iter().map(|&d| usize::try_from(d).ok()).collect::<Option<Vec<_>>>()?;
        Some((s, r.dtypes[e]?))
    };
    let inputs: Vec<Option<_>> = g.input_nodes().iter().map(|&n| known(r.offsets[n])).collect();
    let missing: Vec<&str> = g
        .input_nodes()
        .iter()
        .zip(&inputs)
        .filter(|(_, k)| k.is_none())
        .map(|(&n, _)| g.nodes[n].name.as_str())
        .collect();
    let outs: Vec<Option<_>> = g.heads.iter().map(|&(n, i)| known(r.offsets[n] + i)).collect();
    if !missing.is_empty() || outs.iter().any(Option::is_none) {
        let mut msg = format!(
            "The shape information is not enough to get the shapes (not determined: {})",
            if missing.is_empty() { "some outputs".to_string() } else { missing.join(", ") }
        );
        if !unknown_keys.is_empty() {
            msg.push_str(&format!("; input keys that name no input of the symbol: {}", unknown_keys.join(", ")));
        }
        return Err(Error::mxnet(msg));
    }
    Ok((inputs.into_iter().flatten().collect(), outs.into_iter().flatten().collect()))
}

/// The symbol's outputs named `<key>_output` for each key (`MXPredCreatePartialOut`).
fn partial_outputs(sym: &Symbol, keys: &[String]) -> Result<Symbol> {
    let internals = sym.internals();
    let names = internals.list_outputs();
    let mut outs = Vec::with_capacity(keys.len());
    for key in keys {
        let want = format!("{key}_output");
        let j = names
            .iter()
            .position(|n| *n == want)
            .ok_or_else(|| Error::value(format!("didn't find node name: {want}")))?;
        outs.push(internals.output(j)?);
    }
    Ok(Symbol::group(&outs.iter().collect::<Vec<_>>()))
}

impl Predictor {
    /// `copies` predictors (`MXPredCreateMultiThread`'s threads; 1 otherwise) sharing the
    /// parameters, each with its own input arrays.
    pub fn create(spec: &PredictorSpec, copies: usize) -> Result<Vec<Predictor>> {
        let ctx = spec.ctx.check_available()?;
        let mut sym = crate::symbol::json::load(spec.symbol_json)?;
        if !spec.outputs.is_empty() {
            sym = partial_outputs(&sym, spec.outputs)?;
        }
        let arg_names = sym.list_input_names(InputKind::Args);
        let aux_names = sym.list_input_names(InputKind::Aux);
        let all_names = sym.list_input_names(InputKind::All);
        let (arrays, names) = io::load_list(spec.params, io::Semantics::current())?;
        if names.len() != arrays.len() {
            return Err(Error::value(format!(
                "Invalid param file format: {} arrays and {} names (parameters are saved by name)",
                arrays.len(),
                names.len()
            )));
        }
        // `arg:`/`aux:` entries that the symbol uses, by input name.
        let mut params: Vec<(String, NDArray)> = Vec::new();
        for (name, a) in names.iter().zip(arrays) {
            let used = match (name.strip_prefix("arg:"), name.strip_prefix("aux:")) {
                (Some(n), _) if arg_names.iter().any(|a| a == n) => Some(n),
                (_, Some(n)) if aux_names.iter().any(|a| a == n) => Some(n),
                _ => None,
            };
            if let Some(n) = used {
                params.retain(|(k, _)| k != n);
                params.push((n.to_string(), a));
            }
        }
        let param = |name: &str| params.iter().find(|(k, _)| k == name).map(|(_, a)| a);
        let shapes: Vec<Option<Vec<i64>>> = all_names
            .iter()
            .map(|n| spec.inputs.iter().find(|(k, _)| k == n).map(|(_, s)| s.iter().map(|&d| d as i64).collect()))
            .collect();
        let dtypes: Vec<Option<DType>> = all_names
            .iter()
            .map(|n| {
                let given = spec.dtypes.iter().find(|(k, _)| k == n).map(|(_, d)| *d);
                Some(param(n).map(|a| a.dtype).or(given).unwrap_or(DType::F32))
            })
            .collect();
        let unknown: Vec<&str> =
            spec.inputs.iter().map(|(k, _)| k.as_str()).filter(|k| !all_names.iter().any(|n| n == k)).collect();
        let (inferred, outs) = infer_inputs(&sym, &shapes, &dtypes, &unknown)?;
        let is_input = |n: &str| spec.inputs.iter().any(|(k, _)| k == n);
        // The arrays every copy shares: parameters (on the predictor's device) and arguments
        // no one sets (zeros); `None` for an input, which each copy has its own of.
        let mut shared: Vec<Option<NDArray>> = Vec::with_capacity(all_names.len());
        for (name, (shape, dtype)) in all_names.iter().zip(&inferred) {
            let a = match param(name) {
                Some(p) => {
                    if p.shape != *shape || p.dtype != *dtype {
                        return Err(Error::value(format!(
                            "the parameter {name} is {:?} {} in the parameter file, the symbol needs {shape:?} {}",
                            p.shape,
                            p.dtype.name(),
                            dtype.name()
                        )));
                    }
                    if p.ctx() == Some(ctx) {
                        Some(p.clone())
                    } else {
                        let a = NDArray::new(shape.clone(), ctx, *dtype, false)?;
                        a.copy_from(p)?;
                        Some(a)
                    }
                }
                None if is_input(name) => None,
                None => Some(zeros(shape, ctx, *dtype)?),
            };
            shared.push(a);
        }
        let (out_shapes, out_dtypes): (Vec<_>, Vec<_>) = outs.into_iter().unzip();
        (0..copies.max(1))
            .map(|_| {
                let bound = shared
                    .iter()
                    .zip(&inferred)
                    .map(|(a, (shape, dtype))| a.clone().map_or_else(|| zeros(shape, ctx, *dtype), Ok))
                    .collect::<Result<Vec<_>>>()?;
                let exec = bind(&sym, &all_names, bound)?;
                Ok(Predictor { sym: sym.clone(), exec, out_shapes: out_shapes.clone(), out_dtypes: out_dtypes.clone() })
            })
            .collect()
    }

    /// A predictor for new input shapes (`MXPredReshape`) sharing this one's parameters: the
    /// inputs named get new arrays; any other argument or auxiliary state must keep its
    /// number of elements.
    pub fn reshape(&self, inputs: &[(String, Vec<usize>)]) -> Result<Predictor> {
        let all_names = self.sym.list_input_names(InputKind::All);
        let current = self.exec.inputs();
        let shapes: Vec<Option<Vec<i64>>> = all_names
            .iter()
            .map(|n| inputs.iter().find(|(k, _)| k == n).map(|(_, s)| s.iter().map(|&d| d as i64).collect()))
            .collect();
        let dtypes: Vec<Option<DType>> = current.iter().map(|a| Some(a.dtype)).collect();
        let unknown: Vec<&str> =
            inputs.iter().map(|(k, _)| k.as_str()).filter(|k| !all_names.iter().any(|n| n == k)).collect();
        let (inferred, outs) = infer_inputs(&self.sym, &shapes, &dtypes, &unknown)?;
        let aux_names = self.sym.list_input_names(InputKind::Aux);
        let mut bound = Vec::with_capacity(current.len());
        for ((name, old), (shape, dtype)) in all_names.iter().zip(current).zip(&inferred) {
            let ctx = old.ctx().unwrap_or(Context::CPU);
            if inputs.iter().any(|(k, _)| k == name) {
                bound.push(zeros(shape, ctx, *dtype)?);
            } else if shape.iter().product::<usize>() != old.size() {
                let what = if aux_names.contains(name) { "aux" } else { "arg" };
                return Err(Error::value(format!(
                    "{what} {name} shape has been changed ({:?} to {shape:?}), only allow to change the shape of \
                     input data.",
                    old.shape
                )));
            } else if old.shape == *shape {
                bound.push(old.clone());
            } else {
                bound.push(old.prefix_view(shape)?);
            }
        }
        let exec = bind(&self.sym, &all_names, bound)?;
        let (out_shapes, out_dtypes) = outs.into_iter().unzip();
        Ok(Predictor { sym: self.sym.clone(), exec, out_shapes, out_dtypes })
    }

    pub fn num_outputs(&self) -> usize {
        self.out_shapes.len()
    }

    fn check_output(&self, index: usize) -> Result<()> {
        if index >= self.out_shapes.len() {
            return Err(Error::index(format!(
                "output index {index} out of range: the predictor has {} outputs",
                self.out_shapes.len()
            )));
        }
        Ok(())
    }

    pub fn output_shape(&self, index: usize) -> Result<&[usize]> {
        self.check_output(index)?;
        Ok(&self.out_shapes[index])
    }

    pub fn output_dtype(&self, index: usize) -> Result<DType> {
        self.check_output(index)?;
        Ok(self.out_dtypes[index])
    }

    /// The bound array of argument `key` (an input, or a parameter: setting one changes it for
    /// every predictor sharing it, as in stock).
    pub fn argument(&self, key: &str) -> Result<NDArray> {
        self.exec.arg(key).cloned().ok_or_else(|| {
            let names = self.sym.list_input_names(InputKind::Args);
            Error::value(format!("cannot find input key {key} (the arguments are {})", names.join(", ")))
        })
    }

    pub fn forward(&self) -> Result<()> {
        self.exec.forward(false)
    }

    /// [`Executor::partial_forward`].
    pub fn partial_forward(&self, step: usize) -> Result<usize> {
        self.exec.partial_forward(step)
    }

    /// Output `index` as of the last forward.
    pub fn output(&self, index: usize) -> Result<NDArray> {
        self.check_output(index)?;
        self.exec
            .outputs()
            .into_iter()
            .nth(index)
            .ok_or_else(|| Error::internal(format!("the executor has no output {index}")))
    }

    pub fn set_monitor(&self, monitor: Option<Monitor>) {
        self.exec.set_monitor(monitor);
    }
}

/// Bind `arrays` (`list_inputs` order, named `names`) for inference.
fn bind(sym: &Symbol, names: &[String], arrays: Vec<NDArray>) -> Result<Executor> {
    let aux_names = sym.list_input_names(InputKind::Aux);
    let (mut args, mut aux) = (Vec::new(), Vec::new());
    for (n, a) in names.iter().zip(arrays) {
        if aux_names.contains(n) {
            aux.push(a);
        } else {
            args.push(a);
        }
    }
    let n = args.len();
    Executor::bind(sym, args, vec![None; n], vec![GradReq::Null; n], aux)
}

/// One array of an NDArray list file as the Predict API hands it out.
pub struct ListEntry {
    /// The array's name (empty in an unnamed list).
    pub key: String,
    pub shape: Vec<usize>,
    /// The values, converted to float32.
    pub data: Vec<f32>,
}

/// The arrays of a list file's bytes (`MXNDListCreate`).
pub fn load_nd_list(bytes: &[u8]) -> Result<Vec<ListEntry>> {
    let (arrays, mut names) = io::load_list(bytes, io::Semantics::current())?;
    names.resize(arrays.len(), String::new());
    let cast = crate::op::lookup("Cast")?;
    arrays
        .into_iter()
        .zip(names)
        .map(|(a, key)| {
            let a = if a.dtype == DType::F32 {
                a
            } else {
                crate::op::invoke::invoke(cast, &[&a], None, [("dtype", "float32")])?.swap_remove(0)
            };
            let mut data = vec![0f32; a.size()];
            // SAFETY: `data` holds `a.size()` float32 elements, `a`'s dtype.
            unsafe { a.copy_to_host(data.as_mut_ptr().cast(), data.len())? };
            Ok(ListEntry { key, shape: a.shape.clone(), data })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ndarray::testing::{array_f32, values};

    /// relu(FullyConnected(data, num_hidden=2)) with weight [[1, -1], [2, 0.5]], bias [0, -1].
    fn model() -> (String, Vec<u8>) {
        let mut fc = Symbol::atomic(crate::op::lookup("FullyConnected").unwrap(), [("num_hidden", "2")]).unwrap();
        fc.compose(&[&Symbol::variable("data")], &[], Some("fc")).unwrap();
        let mut relu = Symbol::atomic(crate::op::lookup("Activation").unwrap(), [("act_type", "relu")]).unwrap();
        relu.compose(&[&fc], &[], Some("act")).unwrap();
        let json = crate::symbol::json::save(&relu.graph(), false);
        let arrays = [array_f32(&[2, 2], &[1., -1., 2., 0.5]), array_f32(&[2], &[0., -1.])];
        let names = ["arg:fc_weight".to_string(), "arg:fc_bias".to_string()];
        (json, io::save_list(&arrays, Some(&names), false).unwrap())
    }

    fn spec<'a>(json: &'a str, params: &'a [u8], inputs: &'a [(String, Vec<usize>)]) -> PredictorSpec<'a> {
        PredictorSpec { symbol_json: json, params, ctx: Context::CPU, inputs, outputs: &[], dtypes: &[] }
    }

    fn run(p: &Predictor, x: &[f32]) -> Vec<f32> {
        let a = p.argument("data").unwrap();
        // SAFETY: `x` holds the elements the size check asks for.
        unsafe { a.copy_from_host(x.as_ptr().cast(), x.len()).unwrap() };
        p.forward().unwrap();
        values(&p.output(0).unwrap())
    }

    #[test]
    fn create_forward_partial_forward_reshape() {
        let (json, params) = model();
        let inputs = [("data".to_string(), vec![2, 2])];
        let p = Predictor::create(&spec(&json, &params, &inputs), 1).unwrap().pop().unwrap();
        assert_eq!((p.output_shape(0).unwrap(), p.output_dtype(0).unwrap()), (&[2usize, 2][..], DType::F32));
        // Row [1, 2]: fc = [1 - 2, 2 + 1 - 1] = [-1, 2] → relu [0, 2].
        assert_eq!(run(&p, &[1., 2., 3., 0.]), [0., 2., 3., 5.]);
        // Node by node (data, weight, bias, fc, relu) on a new input.
        let x = [2f32, 1., 0., 1.];
        // SAFETY: four elements, the input's.
        unsafe { p.argument("data").unwrap().copy_from_host(x.as_ptr().cast(), 4).unwrap() };
        let steps: Vec<usize> = (0..5).map(|s| p.partial_forward(s).unwrap()).collect();
        assert_eq!(steps, [4, 3, 2, 1, 0]);
        assert_eq!(values(&p.output(0).unwrap()), [1., 3.5, 0., 0.]);
        assert!(p.partial_forward(2).is_err(), "steps run in order from 0");
        assert_eq!(p.partial_forward(7).unwrap(), 0);
        // A reshaped predictor shares the parameters; the original keeps its input.
        run(&p, &[1., 2., 3., 0.]);
        let q = p.reshape(&[("data".to_string(), vec![1, 2])]).unwrap();
        assert_eq!(run(&q, &[2., 1.]), [1., 3.5]);
        assert!(Arc::ptr_eq(
            q.argument("fc_weight").unwrap().chunk().unwrap(),
            p.argument("fc_weight").unwrap().chunk().unwrap()
        ));
        assert_eq!(values(&p.argument("data").unwrap()), [1., 2., 3., 0.]);
        let e = p.reshape(&[("data".to_string(), vec![2, 3])]).err().unwrap();
        assert!(e.to_string().contains("arg fc_weight shape has been changed"), "{e}");
        // Copies share the parameters, not the inputs.
        let two = Predictor::create(&spec(&json, &params, &inputs), 2).unwrap();
        let (a, b) = (two[0].argument("data").unwrap(), two[1].argument("data").unwrap());
        assert!(!Arc::ptr_eq(a.chunk().unwrap(), b.chunk().unwrap()));
        let (a, b) = (two[0].argument("fc_bias").unwrap(), two[1].argument("fc_bias").unwrap());
        assert!(Arc::ptr_eq(a.chunk().unwrap(), b.chunk().unwrap()));
    }

    #[test]
    fn partial_outputs_and_errors() {
        let (json, params) = model();
        let inputs = [("data".to_string(), vec![1, 2])];
        let outputs = ["fc".to_string(), "act".to_string()];
        let s = PredictorSpec { outputs: &outputs, ..spec(&json, &params, &inputs) };
        let p = Predictor::create(&s, 1).unwrap().pop().unwrap();
        run(&p, &[1., 2.]);
        assert_eq!(values(&p.output(0).unwrap()), [-1., 2.]);
        assert_eq!(values(&p.output(1).unwrap()), [0., 2.]);
        assert!(p.output(2).unwrap_err().to_string().starts_with("IndexError"));
        assert!(p.argument("label").unwrap_err().to_string().contains("cannot find input key label"));
        let missing = ["nope".to_string()];
        let s = PredictorSpec { outputs: &missing, ..spec(&json, &params, &inputs) };
        assert!(Predictor::create(&s, 1).err().unwrap().to_string().contains("didn't find node name: nope_output"));
        let e = Predictor::create(&spec(&json, &params, &[]), 1).err().unwrap().to_string();
        assert!(e.contains("The shape information is not enough") && e.contains("data"), "{e}");
        let wrong = [("data".to_string(), vec![1, 3])];
        let e = Predictor::create(&spec(&json, &params, &wrong), 1).err().unwrap().to_string();
        assert!(e.contains("fc_weight is [2, 2] float32 in the parameter file"), "{e}");
        assert!(Predictor::create(&spec(&json, &params[..10], &inputs), 1).is_err());
    }

    #[test]
    fn lists_convert_to_float32() {
        let f64s = NDArray::new(vec![2], Context::CPU, DType::F64, false).unwrap();
        let v = [0.5f64, -2.0];
        // SAFETY: two float64 elements.
        unsafe { f64s.copy_from_host(v.as_ptr().cast(), 2).unwrap() };
        let bytes = io::save_list(&[array_f32(&[1, 2], &[3., 4.]), f64s], None, false).unwrap();
        let l = load_nd_list(&bytes).unwrap();
        assert_eq!(l.len(), 2);
        assert_eq!(
            (l[0].key.as_str(), l[0].shape.as_slice(), l[0].data.as_slice()),
            ("", &[1usize, 2][..], &[3f32, 4.][..])
        );
        assert_eq!(l[1].data, [0.5, -2.0]);
        assert!(load_nd_list(&bytes[..bytes.len() - 3]).is_err());
    }
}
