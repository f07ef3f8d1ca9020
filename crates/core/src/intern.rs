//! Interned names: operation and operator names shared, not copied, per push.
//!
//! Owns: the process-wide table of interned strings. A leaf: it uses only the crate's locks.

use crate::sync::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

/// `name`, shared: every call with the same text gives the same allocation.
pub fn intern(name: &str) -> Arc<str> {
    static NAMES: OnceLock<Mutex<HashMap<Box<str>, Arc<str>>>> = OnceLock::new();
    let mut names = NAMES.get_or_init(Default::default).lock();
    if let Some(n) = names.get(name) {
        return n.clone();
    }
    let n: Arc<str> = Arc::from(name);
    names.insert(name.into(), n.clone());
    n
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_same_text_gives_the_same_allocation() {
        let (a, b) = (super::intern("x_op"), super::intern("x_op"));
        assert!(std::sync::Arc::ptr_eq(&a, &b));
        assert!(!std::sync::Arc::ptr_eq(&a, &super::intern("y_op")));
    }
}
