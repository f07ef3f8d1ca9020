//! Names the 1.9.1 frontend needs at import (its `mxnet.numpy` module attaches signatures to
//! these `_np_*` / `_npx_*` operators) but that mxnet-rt does not implement yet. They are
//! registered so that `import mxnet` works; calling one fails with
//! `NotImplementedError: operator <name> (mxnet.numpy interface) is not supported yet`.

use crate::error::Error;
use crate::op::{Inputs, OpDef};

const NAMES: &[&str] = &[
    "_np_all",
    "_np_any",
    "_np_sometrue",
    "_npx_nonzero",
    "_np_repeat",
    "_np_transpose",
    "_np_dot",
    "_np_sum",
    "_np_copy",
    "_np_atleast_1d",
    "_np_atleast_2d",
    "_np_atleast_3d",
    "_np_reshape",
    "_np_roll",
    "_np_trace",
    "_np_squeeze",
    "_np_max",
    "_np_amax",
    "_np_min",
    "_np_amin",
    "_np_prod",
    "_np_product",
    "_np_moveaxis",
    "_np__random_shuffle",
    "_npx_constraint_check",
    "_npx_reshape",
    "_np_diag",
    "_np_diagonal",
    "_np_diagflat",
];

pub(super) fn register(ops: &mut Vec<OpDef>) {
    for &name in NAMES {
        ops.push(
            OpDef::new(
                name,
                Inputs::Fixed(&["a"]),
                Box::new(move |_, _| Err(Error::not_supported(format!("operator {name} (mxnet.numpy interface)")))),
                Box::new(move |_, _, _| Err(Error::not_supported(format!("operator {name} (mxnet.numpy interface)")))),
            )
            .doc(format!("{name}: the mxnet.numpy interface is not supported by mxnet-rt yet.")),
        );
    }
}
