//! Finite-difference checks of backward operators (tests only).
//!
//! [`check`] runs an operator's forward kernel on float64 inputs, draws output gradients,
//! calls its backward operator under the convention of [`super`], and compares every
//! requested input gradient with central differences of `sum(ograd * forward(x))`. Inputs
//! listed as non-differentiable must get zero gradients when asked, and a second backward
//! call with input 0 not requested ([`Req::Null`]) must leave the other gradients unchanged.

use super::{backward_op, needs};
use crate::ndarray::DType;
use crate::op::param::Attrs;
use crate::op::tensor::{OutBlob, TBlob};
use crate::op::{lookup, random, Meta, OpCtx, OpDef, Req, Resource};

fn blob(v: &[f64], shape: &[usize]) -> TBlob {
    assert_eq!(v.len(), shape.iter().product::<usize>());
    // SAFETY: `v` holds `shape.product()` f64s, is borrowed (unwritten) for as long as the
    // blob is used: each caller drops its blobs before touching the vector again.
    unsafe { TBlob::new(v.as_ptr().cast(), shape, DType::F64) }
}

fn out_blob(v: &mut [f64], shape: &[usize]) -> OutBlob {
    assert_eq!(v.len(), shape.iter().product::<usize>());
    // SAFETY: `v` holds `shape.product()` f64s; each caller makes one blob per vector and
    // reads the vector only after the kernel call, when the blob is no longer used.
    unsafe { OutBlob::new(v.as_mut_ptr().cast(), shape, DType::F64) }
}

fn forward(
    op: &OpDef,
    attrs: &Attrs,
    ins: &[Vec<f64>],
    shapes: &[Vec<usize>],
    outs: &[Meta],
    rng: Option<random::Stream>,
) -> Vec<Vec<f64>> {
    let in_blobs: Vec<TBlob> = ins.iter().zip(shapes).map(|(v, s)| blob(v, s)).collect();
    let mut out_vals: Vec<Vec<f64>> = outs.iter().map(|m| vec![0.0; m.size()]).collect();
    // Mutated inputs are written through their own blobs after the outputs (copies here, so
    // the finite differences always start from the same inputs).
    let mutated = op.mutated_inputs(ins.len());
    let mut mut_vals: Vec<Vec<f64>> = mutated.iter().map(|&i| ins[i].clone()).collect();
    let mut out_blobs: Vec<OutBlob> = out_vals.iter_mut().zip(outs).map(|(v, m)| out_blob(v, &m.shape)).collect();
    out_blobs.extend(mut_vals.iter_mut().zip(&mutated).map(|(v, &i)| out_blob(v, &shapes[i])));
    let req = vec![Req::Write; outs.len()];
    let cx = OpCtx { attrs, req: &req, rng, is_train: true, temp: None };
    (op.compute)(&cx, &in_blobs, &mut out_blobs).unwrap_or_else(|e| panic!("{} forward: {e}", op.name));
    drop(out_blobs);
    out_vals
}

fn lcg(seed: &mut u64) -> f64 {
    *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    ((*seed >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
}

/// `op`'s forward outputs at `inputs` (shape, values), all float64.
pub fn run(op_name: &str, params: &[(&str, &str)], inputs: &[(&[usize], Vec<f64>)]) -> Vec<Vec<f64>> {
    let op = lookup(op_name).unwrap();
    let attrs = op.parse_attrs(params.iter().copied(), inputs.len()).unwrap_or_else(|e| panic!("{op_name}: {e}"));
    let shapes: Vec<Vec<usize>> = inputs.iter().map(|(s, _)| s.to_vec()).collect();
    let xs: Vec<Vec<f64>> = inputs.iter().map(|(_, v)| v.clone()).collect();
    let metas: Vec<Meta> = shapes.iter().map(|s| Meta::new(s.clone(), DType::F64)).collect();
    let outs = (op.infer)(&attrs, &metas).unwrap_or_else(|e| panic!("{op_name} infer: {e}"));
    let rng = op.resources.contains(&Resource::Random).then(|| random::take(crate::context::Context::CPU, 1 << 20));
    forward(op, &attrs, &xs, &shapes, &outs, rng)
}

/// Check `op`'s gradient at `inputs` (shape, values). `no_grad`: inputs without a gradient
/// (indices, labels), which must get zeros. Panics with the first mismatch.
pub fn check(op_name: &str, params: &[(&str, &str)], inputs: &[(&[usize], Vec<f64>)], no_grad: &[usize]) {
    check_tol(op_name, params, inputs, no_grad, 1e-4, 1e-6)
}

/// [`check`] with explicit tolerances: |analytic - numeric| <= atol + rtol * |numeric|.
pub fn check_tol(
    op_name: &str,
    params: &[(&str, &str)],
    inputs: &[(&[usize], Vec<f64>)],
    no_grad: &[usize],
    rtol: f64,
    atol: f64,
) {
    let op = lookup(op_name).unwrap();
    let attrs = op.parse_attrs(params.iter().copied(), inputs.len()).unwrap_or_else(|e| panic!("{op_name}: {e}"));
    let bop = backward_op(op).unwrap().unwrap_or_else(|| panic!("{op_name} declares no backward operator"));
    let shapes: Vec<Vec<usize>> = inputs.iter().map(|(s, _)| s.to_vec()).collect();
    let mut xs: Vec<Vec<f64>> = inputs.iter().map(|(_, v)| v.clone()).collect();
    for (x, s) in xs.iter().zip(&shapes) {
        assert_eq!(x.len(), s.iter().product::<usize>(), "{op_name}: input values do not match the shape");
    }
    let metas: Vec<Meta> = shapes.iter().map(|s| Meta::new(s.clone(), DType::F64)).collect();
    let outs = (op.infer)(&attrs, &metas).unwrap_or_else(|e| panic!("{op_name} infer: {e}"));
    assert!(outs.iter().all(|m| m.dtype == DType::F64), "{op_name}: outputs are not float64");
    let rng = op.resources.contains(&Resource::Random).then(|| random::take(crate::context::Context::CPU, 1 << 20));
    let visible = (op.num_visible_outputs)(&attrs);
    let ys = forward(op, &attrs, &xs, &shapes, &outs, rng);
    let mut seed = 0x5eed_u64 ^ op_name.len() as u64;
    let ograds: Vec<Vec<f64>> =
        outs[..visible].iter().map(|m| (0..m.size()).map(|_| lcg(&mut seed)).collect()).collect();

    let (need_in, need_out) = needs(op);
    let run_backward = |req: &[Req], xs: &[Vec<f64>]| -> Vec<Vec<f64>> {
        let mut arg_vals: Vec<(&[f64], &[usize])> =
            ograds.iter().zip(&outs).map(|(g, m)| (&g[..], &m.shape[..])).collect();
        if need_in {
            arg_vals.extend(xs.iter().zip(&shapes).map(|(v, s)| (&v[..], &s[..])));
        }
        if need_out {
            arg_vals.extend(ys.iter().zip(&outs).map(|(v, m)| (&v[..], &m.shape[..])));
        }
        let args: Vec<TBlob> = arg_vals.iter().map(|(v, s)| blob(v, s)).collect();
        // Inputs the backward operator writes (BatchNorm's moving statistics): copies.
        let bmutated = bop.mutated_inputs(args.len());
        let mut bmut_vals: Vec<Vec<f64>> = bmutated.iter().map(|&i| arg_vals[i].0.to_vec()).collect();
        let mut grads: Vec<Vec<f64>> = metas.iter().map(|m| vec![f64::NAN; m.size()]).collect();
        let mut gblobs: Vec<OutBlob> = grads
            .iter_mut()
            .zip(&metas)
            .zip(req)
            .map(|((g, m), r)| {
                if *r == Req::Null {
                    // SAFETY: never dereferenced (the accessors refuse a null blob).
                    unsafe { OutBlob::new(std::ptr::null_mut(), &m.shape, DType::F64) }
                } else {
                    out_blob(g, &m.shape)
                }
            })
            .collect();
        gblobs.extend(bmut_vals.iter_mut().zip(&bmutated).map(|(v, &i)| out_blob(v, arg_vals[i].1)));
        let cx = OpCtx { attrs: &attrs, req, rng, is_train: true, temp: None };
        (bop.compute)(&cx, &args, &mut gblobs).unwrap_or_else(|e| panic!("{}: {e}", bop.name));
        drop(gblobs);
        grads
    };
    let all = vec![Req::Write; metas.len()];
    let grads = run_backward(&all, &xs);

    let loss = |xs: &[Vec<f64>]| -> f64 {
        let ys = forward(op, &attrs, xs, &shapes, &outs, rng);
        ys.iter().zip(&ograds).map(|(y, g)| y.iter().zip(g).map(|(a, b)| a * b).sum::<f64>()).sum()
    };
    let eps = 1e-6;
    for i in 0..xs.len() {
        if no_grad.contains(&i) {
            assert!(
                grads[i].iter().all(|&g| g == 0.0),
                "{}: input {i} has no gradient but got {:?}",
                bop.name,
                &grads[i]
            );
            continue;
        }
        for j in 0..xs[i].len() {
            let orig = xs[i][j];
            xs[i][j] = orig + eps;
            let up = loss(&xs);
            xs[i][j] = orig - eps;
            let down = loss(&xs);
            xs[i][j] = orig;
            let num = (up - down) / (2.0 * eps);
            let ana = grads[i][j];
            assert!(
                (ana - num).abs() <= atol + rtol * num.abs(),
                "{}: d/d input {i}[{j}]: analytic {ana}, numeric {num} (params {params:?})",
                bop.name
            );
        }
    }
    if xs.len() > 1 {
        let mut req = all.clone();
        req[0] = Req::Null;
        let again = run_backward(&req, &xs);
        for i in 1..xs.len() {
            assert_eq!(again[i], grads[i], "{}: gradient {i} changed when input 0 was not requested", bop.name);
        }
    }
}

/// `n` values in [lo, hi), deterministic.
pub fn values(n: usize, lo: f64, hi: f64, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_add(17);
    (0..n).map(|_| lo + (lcg(&mut s) + 1.0) / 2.0 * (hi - lo)).collect()
}
