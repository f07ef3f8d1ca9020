//! The operator families. Each file registers its operators with `register`; the registry
//! calls them all once, in this order.

use super::OpDef;

mod add_n;
mod attention;
mod broadcast;
mod broadcast_grad;
mod common;
mod contrib;
mod conv;
mod conv_grad;
mod deconv;
mod detection;
mod elemwise;
mod elemwise_grad;
mod image;
mod index;
mod index_grad;
mod init;
mod la;
mod legacy_nn;
mod linalg;
mod linalg_grad;
mod loss;
mod missing;
mod nn;
mod nn_grad;
mod norms;
mod optim;
mod optim_adamw_lamb;
mod random_ops;
mod reduce;
mod reduce_grad;
mod resize;
mod rnn;
mod roi;
mod sequence;
mod shape;
mod shape_grad;
mod special;
mod strided;
mod unsupported;

pub(super) fn register_all(ops: &mut Vec<OpDef>) {
    init::register(ops);
    random_ops::register(ops);
    optim::register(ops);
    optim_adamw_lamb::register(ops);
    add_n::register(ops);
    elemwise::register(ops);
    elemwise_grad::register(ops);
    broadcast::register(ops);
    broadcast_grad::register(ops);
    shape::register(ops);
    index::register(ops);
    linalg::register(ops);
    linalg_grad::register(ops);
    nn::register(ops);
    nn_grad::register(ops);
    norms::register(ops);
    conv::register(ops);
    conv_grad::register(ops);
    deconv::register(ops);
    resize::register(ops);
    image::register(ops);
    reduce::register(ops);
    reduce_grad::register(ops);
    shape_grad::register(ops);
    index_grad::register(ops);
    sequence::register(ops);
    rnn::register(ops);
    attention::register(ops);
    detection::register(ops);
    roi::register(ops);
    la::register(ops);
    legacy_nn::register(ops);
    loss::register(ops);
    contrib::register(ops);
    special::register(ops);
    super::custom::register(ops);
    unsupported::register(ops);
    // last: stubs for the stock names no family registered
    missing::register(ops);
}
