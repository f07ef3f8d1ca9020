//! Backward passes that are not an operator's: `autograd.Function` (MXCustomFunctionRecord)
//! and custom operators recorded by autograd.
//!
//! Owns the trait such a backward implements; the C API implements it with the frontend's
//! callbacks (`c_api::autograd::Function`), so the domain knows no C.

use crate::error::Result;
use crate::ndarray::NDArray;

/// The backward of a recorded call that runs code of its own.
pub trait CustomBackward: Send + Sync {
    /// Gradients of the call's inputs (`None` where `want` is false) from the gradients of its
    /// visible outputs.
    fn backward(&self, ograds: &[NDArray], want: &[bool]) -> Result<Vec<Option<NDArray>>>;
}
