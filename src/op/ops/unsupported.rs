//! Names the 1.9.1 frontend needs at import (its `mxnet.numpy` module attaches signatures to
//! these `_np_*` / `_npx_*` operators) but that mxnet-rt does not implement yet. They are
//! registered so that `import mxnet` works; calling one fails with
//! `NotImplementedError: operator <name> (mxnet.numpy interface) is not supported yet`.

use crate::error::Error;
use crate::op::param::{PType, ParamSpec};
use crate::op::{Inputs, OpDef};

const NAMES: &[&str] = &[
    "_np_all", "_np_any", "_np_sometrue", "_np_cumsum", "_npx_nonzero", "_np_repeat", "_np_transpose", "_np_dot",
    "_np_sum", "_np_copy", "_np_atleast_1d", "_np_atleast_2d", "_np_atleast_3d", "_np_reshape", "_np_roll",
    "_np_trace", "_np_squeeze", "_np_max", "_np_amax", "_np_min", "_np_amin", "_np_prod", "_np_product",
    "_np_moveaxis", "_np__random_shuffle", "_npx_constraint_check", "_npx_reshape", "_np_diag", "_np_diagonal",
    "_np_diagflat",
];

const CUSTOM_PARAMS: &[ParamSpec] =
    &[ParamSpec::req("op_type", PType::Str, "Name of the custom operator registered with MXCustomOpRegister")];

pub(super) fn register(ops: &mut Vec<OpDef>) {
    ops.push(
        OpDef::new(
            "Custom",
            Inputs::Variadic("data"),
            Box::new(|a, _| Err(Error::not_supported(format!("running custom operator {} (Custom)", a.str("op_type"))))),
            Box::new(|cx, _, _| Err(Error::not_supported(format!("running custom operator {} (Custom)", cx.attrs.str("op_type"))))),
        )
        .alias(&["_npi_Custom"])
        .params(CUSTOM_PARAMS)
        .doc("Apply a custom operator implemented in a frontend language. Registration works; running one is not supported by mxnet-rt yet."),
    );
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
