//! tmp
use crate::op::OpDef;
pub(super) fn register(_: &mut Vec<OpDef>) {}
