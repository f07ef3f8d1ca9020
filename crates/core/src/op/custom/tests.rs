//! The domain side of custom operators with a frontend written in Rust (the C protocol is
//! tested in `c_api::custom_op`): `y = 2 * x`, and a property whose backward dependency is out
//! of range.

use super::*;
use crate::ndarray::testing::{array_f32, values};
use crate::op::{invoke, lookup};

/// `bad_deps`: declare a dependency id the frontend was not given.
struct Double {
    bad_deps: bool,
}

impl PropCreator for Double {
    fn create(&self, _: &str, _: &[(String, String)]) -> Result<Box<dyn FrontendProp>> {
        Ok(Box::new(Double { bad_deps: self.bad_deps }))
    }
}

impl FrontendProp for Double {
    fn list_arguments(&self) -> Result<Vec<String>> {
        Ok(vec!["data".into()])
    }
    fn list_outputs(&self) -> Result<Vec<String>> {
        Ok(vec!["output".into()])
    }
    fn list_auxiliary_states(&self) -> Result<Vec<String>> {
        Ok(vec![])
    }
    fn declare_backward_dependency(&self, og: &[usize], _: &[usize], _: &[usize]) -> Result<Vec<i64>> {
        Ok(if self.bad_deps { vec![99] } else { vec![og[0] as i64] })
    }
    fn infer_shape(&self, known: &[Option<&[usize]>]) -> Result<Vec<Vec<usize>>> {
        let s = known[0].expect("the argument's shape is known").to_vec();
        Ok(vec![s.clone(), s])
    }
    fn infer_type(&self, _: &[Option<DType>]) -> Result<Option<Vec<DType>>> {
        Ok(None)
    }
    fn create_operator(&self, _: Context, _: &[Meta]) -> Result<Box<dyn FrontendOp>> {
        Ok(Box::new(Twice))
    }
}

struct Twice;

impl FrontendOp for Twice {
    fn run(&self, pass: Pass, arrays: Vec<NDArray>, tags: &[Tag], reqs: &[Req], _: bool) -> Result<()> {
        assert_eq!((pass, tags, reqs), (Pass::Forward, &[Tag::In, Tag::Out][..], &[Req::Write][..]));
        let x = values(&arrays[0]);
        let y: Vec<f32> = x.iter().map(|v| 2.0 * v).collect();
        // SAFETY: `y` holds the output's elements.
        unsafe { arrays[1].copy_from_host(y.as_ptr() as *const u8, y.len()) }
    }
}

#[test]
fn a_rust_frontend_runs_through_the_traits() {
    register_prop("rt_double", Arc::new(Double { bad_deps: false }));
    register_prop("rt_bad_deps", Arc::new(Double { bad_deps: true }));
    let custom = lookup("Custom").unwrap();
    let x = array_f32(&[3], &[1.0, -2.0, 3.0]);
    let y = invoke::invoke(custom, &[&x], None, [("op_type", "rt_double")]).unwrap();
    assert_eq!(values(&y[0]), [2.0, -4.0, 6.0]);
    let e = invoke::invoke(custom, &[&x], None, [("op_type", "rt_bad_deps")]).unwrap_err().to_string();
    assert!(e.starts_with("MXNetError") && e.contains("returned 99"), "{e}");
}
