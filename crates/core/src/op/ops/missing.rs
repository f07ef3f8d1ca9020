//! Stubs for the stock 1.9.1 operators mxnet-rt does not implement yet.
//!
//! The 1.9.1 wheel ships pre-generated `gen_*.py` modules whose functions return `(0,)`; the
//! frontend replaces only those whose names the library lists. Without a stub, a call such as
//! `mx.nd.add_n(a, b)` would silently return `(0,)`. Each stock name (`stock_op_schemas.txt`,
//! stock's `MXListAllOpNames` with each operator's arguments, written by
//! `scripts/stock_op_schemas.py`) that no family registered gets an operator here whose every
//! call fails with `NotImplementedError: operator <name> is not supported yet`. The stub
//! lists stock's arguments and count parameter, so the frontend's generated function has
//! stock's signature and the call reaches the library (with a generic signature,
//! `mx.nd.random.multinomial(x, shape)` failed in Python on its positional `shape`).
//! Registered last, so implementing an operator anywhere removes its stub automatically.
//! `_backward_*` names get no stub: the frontend never calls them directly, and each listed
//! name costs `import mxnet` about a millisecond of Python code generation.

use std::collections::HashSet;

use crate::error::Error;
use crate::op::{Inputs, OpDef};

/// Every operator name (canonical and alias) stock 1.9.1 lists, each with its count
/// parameter and its arguments (see the file's header).
const STOCK_SCHEMAS: &str = include_str!("stock_op_schemas.txt");

/// One stock operator's schema: name, count parameter ("" if none), arguments (name, type).
struct Schema {
    name: &'static str,
    key: &'static str,
    args: Vec<(&'static str, &'static str)>,
}

fn schemas() -> Vec<Schema> {
    let mut out: Vec<Schema> = Vec::new();
    for line in STOCK_SCHEMAS.lines().filter(|l| !l.is_empty() && !l.starts_with('#')) {
        if let Some(arg) = line.strip_prefix('\t') {
            let (name, ty) = arg.split_once('\t').expect("an argument line is name<TAB>type");
            out.last_mut().expect("an argument follows its operator").args.push((name, ty));
        } else {
            let (name, key) = line.split_once('\t').unwrap_or((line, ""));
            out.push(Schema { name, key, args: Vec::new() });
        }
    }
    out
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    let have: HashSet<&str> =
        ops.iter().flat_map(|o| std::iter::once(o.name).chain(o.aliases.iter().copied())).collect();
    let missing = schemas().into_iter().filter(|s| !s.name.starts_with("_backward_") && !have.contains(s.name));
    for Schema { name, key, args } in missing {
        ops.push(
            OpDef::new(
                name,
                Inputs::Variadic("data"),
                Box::new(move |_, _| Err(Error::not_supported(format!("operator {name}")))),
                Box::new(move |_, _, _| Err(Error::not_supported(format!("operator {name}")))),
            )
            .not_supported()
            .stub_schema(key, args)
            .doc(format!("{name}: not supported by mxnet-rt yet.")),
        );
    }
}

#[cfg(test)]
mod tests {
    use crate::op::registry;

    #[test]
    fn every_stock_name_is_registered_and_stubs_refuse_calls() {
        let schemas = super::schemas();
        assert!(schemas.len() > 1000);
        for s in schemas.iter().filter(|s| !s.name.starts_with("_backward_")) {
            assert!(registry().get(s.name).is_some(), "{}", s.name);
        }
        let op = registry().get("_contrib_fft").unwrap();
        let err = op.parse_attrs([], 1).unwrap_err().to_string();
        assert!(err.starts_with("NotImplementedError"), "{err}");
    }

    #[test]
    fn stubs_list_stock_arguments() {
        // Stock's CPU build lacks it too (GPU only), so it stays a stub here.
        let op = registry().get("_contrib_count_sketch").unwrap();
        assert!(op.not_supported, "implemented now: pick another stub");
        let info = op.c_info();
        let names: Vec<String> = info
            .arg_names
            .iter()
            // SAFETY: the pointers address NUL-terminated strings owned by the static CInfo.
            .map(|&p| unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["data", "h", "s", "out_dim", "processing_batch_size"]);
        // SAFETY: as above.
        let first = unsafe { std::ffi::CStr::from_ptr(info.arg_types[0]) };
        assert_eq!(first.to_str().unwrap(), "NDArray-or-Symbol");
        let stub = registry().get("_contrib_fft").unwrap();
        assert!(stub.not_supported && stub.key_var_num_args.is_empty());
    }
}
