//! Stubs for the stock 1.9.1 operators mxnet-rt does not implement yet.
//!
//! The 1.9.1 wheel ships pre-generated `gen_*.py` modules whose functions return `(0,)`; the
//! frontend replaces only those whose names the library lists. Without a stub, a call such as
//! `mx.nd.add_n(a, b)` would silently return `(0,)`. Each stock name (`stock_op_names.txt`,
//! stock's `MXListAllOpNames`) that no family registered gets an operator here whose every
//! call fails with `NotImplementedError: operator <name> is not supported yet`.
//! Registered last, so implementing an operator anywhere removes its stub automatically.
//! `_backward_*` names get no stub: the frontend never calls them directly, and each listed
//! name costs `import mxnet` about a millisecond of Python code generation.

use std::collections::HashSet;

use crate::error::Error;
use crate::op::{Inputs, OpDef};

/// Every operator name (canonical and alias) stock 1.9.1 lists, one a line.
const STOCK_NAMES: &str = include_str!("stock_op_names.txt");

pub(super) fn register(ops: &mut Vec<OpDef>) {
    let have: HashSet<&str> =
        ops.iter().flat_map(|o| std::iter::once(o.name).chain(o.aliases.iter().copied())).collect();
    let missing: Vec<&'static str> =
        STOCK_NAMES.lines().filter(|n| !n.is_empty() && !n.starts_with("_backward_") && !have.contains(n)).collect();
    for name in missing {
        ops.push(
            OpDef::new(
                name,
                Inputs::Variadic("data"),
                Box::new(move |_, _| Err(Error::not_supported(format!("operator {name}")))),
                Box::new(move |_, _, _| Err(Error::not_supported(format!("operator {name}")))),
            )
            .not_supported()
            .doc(format!("{name}: not supported by mxnet-rt yet.")),
        );
    }
}

#[cfg(test)]
mod tests {
    use crate::op::registry;

    #[test]
    fn every_stock_name_is_registered_and_stubs_refuse_calls() {
        for name in super::STOCK_NAMES.lines().filter(|n| !n.starts_with("_backward_")) {
            assert!(registry().get(name).is_some(), "{name}");
        }
        let op = registry().get("_contrib_boolean_mask").or_else(|| registry().get("_cvimdecode")).unwrap();
        let err = op.parse_attrs([("axis", "0")], 2).unwrap_err().to_string();
        assert!(err.starts_with("NotImplementedError"), "{err}");
    }
}
