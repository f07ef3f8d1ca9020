//! The custom-operator C protocol with a frontend written in Rust: `y = scale * x`, backward
//! `dx = scale * dy`, declaring `[out_grad 0, in_data 0]` as its backward dependencies.

use super::*;
use mxnet_core::autograd::invoke;
use mxnet_core::engine;
use mxnet_core::op::custom::{backward, forward};
use mxnet_core::op::lookup;
use std::sync::atomic::{AtomicUsize, Ordering};

const TAG_IN: c_int = 0;
const TAG_OUT: c_int = 1;
const TAG_IN_GRAD: c_int = 2;
const TAG_OUT_GRAD: c_int = 3;

static PROPS_ALIVE: AtomicUsize = AtomicUsize::new(0);
static OPS_ALIVE: AtomicUsize = AtomicUsize::new(0);

/// Callback context: the `scale` parameter.
struct Scale(f32);

fn leak_list(fns: Vec<*const ()>, ctx: *mut c_void) -> MXCallbackList {
    let n = fns.len();
    let fns: Vec<Option<unsafe extern "C" fn() -> c_int>> = fns
        .into_iter()
        .map(|f| Some(unsafe { std::mem::transmute::<*const (), unsafe extern "C" fn() -> c_int>(f) }))
        .collect();
    MXCallbackList {
        num_callbacks: n as c_int,
        callbacks: Box::leak(fns.into_boxed_slice()).as_mut_ptr(),
        contexts: Box::leak(vec![ctx; n].into_boxed_slice()).as_mut_ptr(),
    }
}

unsafe extern "C" fn prop_del(_: *mut c_void) -> c_int {
    PROPS_ALIVE.fetch_sub(1, Ordering::SeqCst);
    1
}
unsafe extern "C" fn op_del(_: *mut c_void) -> c_int {
    OPS_ALIVE.fetch_sub(1, Ordering::SeqCst);
    1
}

struct Names([*const c_char; 2]);
// SAFETY: pointers to static C strings.
unsafe impl Sync for Names {}
static ARGS: Names = Names([c"data".as_ptr(), std::ptr::null()]);
static OUTS: Names = Names([c"output".as_ptr(), std::ptr::null()]);
static NONE: Names = Names([std::ptr::null(), std::ptr::null()]);

unsafe extern "C" fn list_args(out: *mut *mut *mut c_char, _: *mut c_void) -> c_int {
    *out = ARGS.0.as_ptr() as *mut *mut c_char;
    1
}
unsafe extern "C" fn list_outs(out: *mut *mut *mut c_char, _: *mut c_void) -> c_int {
    *out = OUTS.0.as_ptr() as *mut *mut c_char;
    1
}
unsafe extern "C" fn list_aux(out: *mut *mut *mut c_char, _: *mut c_void) -> c_int {
    *out = NONE.0.as_ptr() as *mut *mut c_char;
    1
}
unsafe extern "C" fn infer_shape(n: c_int, ndims: *mut c_int, shapes: *mut *mut c_int, _: *mut c_void) -> c_int {
    assert_eq!(n, 2);
    *ndims.add(1) = *ndims;
    *shapes.add(1) = *shapes;
    1
}
unsafe extern "C" fn infer_type(n: c_int, types: *mut c_int, _: *mut c_void) -> c_int {
    assert_eq!(n, 2);
    *types.add(1) = *types;
    1
}
unsafe extern "C" fn bwd_deps(
    og: *const c_int,
    ind: *const c_int,
    _od: *const c_int,
    n: *mut c_int,
    deps: *mut *mut c_int,
    _: *mut c_void,
) -> c_int {
    *n = 2;
    *deps = Box::leak(Box::new([*og, *ind])).as_mut_ptr();
    1
}

fn read(h: *mut c_void) -> Vec<f32> {
    let a = arrays().get(h).unwrap();
    let mut v = vec![0f32; a.size()];
    // SAFETY: `v` holds the array's elements (f32 in these tests).
    unsafe { a.copy_to_host(v.as_mut_ptr() as *mut u8, v.len()).unwrap() };
    v
}
fn write(h: *mut c_void, v: &[f32]) {
    let a = arrays().get(h).unwrap();
    // SAFETY: as in `read`.
    unsafe { a.copy_from_host(v.as_ptr() as *const u8, v.len()).unwrap() };
}

/// forward: handles [in, out]; backward: [out_grad, in, out (undeclared: empty), in_grad].
/// A negative scale fails. The handles belong to the callback, which frees them.
unsafe extern "C" fn fb(
    n: c_int,
    h: *mut *mut c_void,
    tags: *mut c_int,
    reqs: *mut c_int,
    _train: c_int,
    ctx: *mut c_void,
) -> c_int {
    let scale = (*(ctx as *const Scale)).0;
    let hs = std::slice::from_raw_parts(h, n as usize).to_vec();
    let tags = std::slice::from_raw_parts(tags, n as usize).to_vec();
    let ok = if scale < 0.0 {
        0
    } else if tags == [TAG_IN, TAG_OUT] {
        assert_eq!(*reqs, 1);
        let x = read(hs[0]);
        write(hs[1], &x.iter().map(|v| v * scale).collect::<Vec<_>>());
        1
    } else {
        assert_eq!(tags, [TAG_OUT_GRAD, TAG_IN, TAG_OUT, TAG_IN_GRAD]);
        assert!(arrays().get(hs[2]).unwrap().chunk.is_none(), "an undeclared dependency is empty");
        assert!(arrays().get(hs[1]).unwrap().chunk.is_some());
        let dy = read(hs[0]);
        write(hs[3], &dy.iter().map(|v| v * scale).collect::<Vec<_>>());
        1
    };
    for h in hs {
        arrays().remove(h).unwrap();
    }
    ok
}

unsafe extern "C" fn create_op(
    _ctx: *const c_char,
    n: c_int,
    _shapes: *mut *mut u32,
    _ndims: *mut c_int,
    dtypes: *mut c_int,
    ret: *mut MXCallbackList,
    pctx: *mut c_void,
) -> c_int {
    assert_eq!((n, *dtypes), (1, 0));
    OPS_ALIVE.fetch_add(1, Ordering::SeqCst);
    *ret = leak_list(vec![op_del as *const (), fb as *const (), fb as *const ()], pctx);
    1
}

unsafe extern "C" fn creator(
    _t: *const c_char,
    argc: c_int,
    keys: *mut *const c_char,
    vals: *mut *const c_char,
    ret: *mut MXCallbackList,
) -> c_int {
    let mut scale = 1.0f32;
    for i in 0..argc as usize {
        let k = CStr::from_ptr(*keys.add(i)).to_str().unwrap();
        let v = CStr::from_ptr(*vals.add(i)).to_str().unwrap();
        match (k, v.parse()) {
            ("scale", Ok(s)) => scale = s,
            _ => return 0,
        }
    }
    PROPS_ALIVE.fetch_add(1, Ordering::SeqCst);
    let ctx = Box::leak(Box::new(Scale(scale))) as *mut Scale as *mut c_void;
    let fns: Vec<*const ()> = vec![
        prop_del as *const (),
        list_args as *const (),
        list_outs as *const (),
        list_aux as *const (),
        infer_shape as *const (),
        bwd_deps as *const (),
        create_op as *const (),
        infer_type as *const (),
    ];
    *ret = leak_list(fns, ctx);
    1
}

fn register() {
    // SAFETY: a valid name and creator.
    let rc = unsafe { MXCustomOpRegister(c"rt_scale".as_ptr(), Some(creator)) };
    assert_eq!(rc, 0);
}

fn array(v: &[f32]) -> NDArray {
    let a = NDArray::new(vec![v.len()], Context::CPU, DType::F32, false).unwrap();
    // SAFETY: `v.len()` f32.
    unsafe { a.copy_from_host(v.as_ptr() as *const u8, v.len()).unwrap() };
    a
}
fn host(a: &NDArray) -> Result<Vec<f32>> {
    let mut v = vec![0f32; a.size()];
    // SAFETY: as above.
    unsafe { a.copy_to_host(v.as_mut_ptr() as *mut u8, v.len())? };
    Ok(v)
}

#[test]
fn forward_backward_and_failures() {
    register();
    let custom = lookup("Custom").unwrap();
    let x = array(&[1.0, -2.0, 3.0]);
    let kv = [("op_type", "rt_scale"), ("scale", "2.5")];
    for _ in 0..50 {
        let y = invoke(custom, &[&x], None, kv).unwrap();
        assert_eq!(host(&y[0]).unwrap(), [2.5, -5.0, 7.5]);
    }
    // Into a caller's output that is also the input: ordered through one alias.
    let z = array(&[1.0, 2.0, 3.0]);
    invoke(custom, &[&z], Some(&[&z]), kv).unwrap();
    assert_eq!(host(&z).unwrap(), [2.5, 5.0, 7.5]);

    // Backward with the forward's operator: inputs are the dependencies [dy, x].
    let (outs, state) = forward("rt_scale", &[("scale".into(), "3".into())], &[&x], None, false).unwrap();
    let dy = array(&[1.0, 1.0, 2.0]);
    let dx = NDArray::new(vec![3], Context::CPU, DType::F32, false).unwrap();
    backward(&state, &[&dy, &x], &[&dx], &[Req::Write], true).unwrap();
    assert_eq!(host(&dx).unwrap(), [3.0, 3.0, 6.0]);
    assert_eq!(host(&outs[0]).unwrap(), [3.0, -6.0, 9.0]);
    assert!(backward(&state, &[&dy], &[&dx], &[Req::Write], true).is_err());
    drop(state);
    // ... and as the registered operator, gradients allocated from x's meta.
    let g = invoke(lookup("_backward_Custom").unwrap(), &[&dy, &x], None, kv).unwrap();
    assert_eq!(host(&g[0]).unwrap(), [2.5, 2.5, 5.0]);

    // A failing callback fails the outputs, not the caller or the engine.
    let y = invoke(custom, &[&x], None, [("op_type", "rt_scale"), ("scale", "-1")]).unwrap();
    let e = host(&y[0]).unwrap_err().to_string();
    assert!(e.contains("rt_scale") && e.contains("CustomOp.forward"), "{e}");
    let y = invoke(custom, &[&x], None, kv).unwrap();
    assert_eq!(host(&y[0]).unwrap(), [2.5, -5.0, 7.5]);

    // Errors before the push are the call's.
    let e = invoke(custom, &[&x], None, [("op_type", "rt_missing")]).unwrap_err().to_string();
    assert!(e.starts_with("MXNetError") && e.contains("rt_missing"), "{e}");
    let e = invoke(custom, &[&x], None, [("op_type", "rt_scale"), ("bogus", "1")]).unwrap_err().to_string();
    assert!(e.contains("creating its CustomOpProp"), "{e}");
    let e = invoke(custom, &[&x, &x], None, kv).unwrap_err().to_string();
    assert!(e.contains("takes 1 inputs"), "{e}");
    // Strictness elsewhere is unchanged.
    assert!(invoke(lookup("_plus_scalar").unwrap(), &[&x], None, [("scalar", "1"), ("bogus", "1")]).is_err());

    engine::global().unwrap().wait_all().unwrap();
    // Every property and operator the frontend created was deleted (other tests may run
    // concurrently, but only this one registers rt_scale).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while (PROPS_ALIVE.load(Ordering::SeqCst), OPS_ALIVE.load(Ordering::SeqCst)) != (0, 0) {
        assert!(std::time::Instant::now() < deadline, "leaked custom operator objects");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}
