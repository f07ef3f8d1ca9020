//! The operator families. Each file registers its operators with `register`; the registry
//! calls them all once, in this order.

use super::OpDef;

mod common;
mod init;
mod optim;
mod random_ops;
mod elemwise;
mod unsupported;

pub(super) fn register_all(ops: &mut Vec<OpDef>) {
    init::register(ops);
    random_ops::register(ops);
    optim::register(ops);
    elemwise::register(ops);
    unsupported::register(ops);
}
