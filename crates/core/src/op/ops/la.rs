//! Linear algebra operators (`linalg_*`): not yet written.

use crate::op::OpDef;

pub(super) fn register(_ops: &mut Vec<OpDef>) {}
