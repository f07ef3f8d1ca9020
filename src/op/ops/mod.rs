//! The operator families. Each file registers its operators with `register`; the registry
//! calls them all once, in this order.

use super::OpDef;

mod common;
mod init;
mod elemwise;
mod broadcast;
mod reduce;
mod unsupported;

pub(super) fn register_all(ops: &mut Vec<OpDef>) {
    init::register(ops);
    elemwise::register(ops);
    broadcast::register(ops);
    reduce::register(ops);
    unsupported::register(ops);
}
