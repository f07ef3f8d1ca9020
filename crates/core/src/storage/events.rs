//! Storage events: every allocation and free of array memory, for the profiler's memory view.
//!
//! Owns: [`StorageEvent`] and the one subscriber slot. The profiler subscribes when memory
//! profiling starts and unsubscribes when it stops; with no subscriber an event costs one
//! relaxed atomic load.

use super::pool::PoolStats;
use crate::context::Context;
use crate::sync::RwLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// An allocation or free, with the pool's figures after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageEvent {
    Alloc { ctx: Context, bytes: usize, stats: PoolStats },
    Free { ctx: Context, bytes: usize, stats: PoolStats },
}

type Sink = Arc<dyn Fn(&StorageEvent) + Send + Sync>;

/// The subscriber slot.
struct Subscriber {
    /// Whether `sink` holds one (read without the lock on every event).
    active: AtomicBool,
    sink: RwLock<Option<Sink>>,
}

static SUBSCRIBER: Subscriber = Subscriber { active: AtomicBool::new(false), sink: RwLock::new(None) };

/// Send every storage event to `sink` (replacing a previous subscriber); `None` stops.
pub fn subscribe(sink: Option<Sink>) {
    let mut s = SUBSCRIBER.sink.write();
    SUBSCRIBER.active.store(sink.is_some(), Ordering::Release);
    *s = sink;
}

/// Send the event `make` builds to the subscriber; with none, `make` is not called (so the
/// pool's figures are not read for nobody).
#[inline]
pub(crate) fn emit(make: impl FnOnce() -> StorageEvent) {
    if !SUBSCRIBER.active.load(Ordering::Relaxed) {
        return;
    }
    if let Some(sink) = SUBSCRIBER.sink.read().as_ref() {
        sink(&make());
    }
}

#[cfg(test)]
mod tests {
    use super::super::Block;
    use super::*;
    use crate::sync::Mutex;

    #[test]
    fn allocations_and_frees_reach_the_subscriber() {
        let seen: Arc<Mutex<Vec<StorageEvent>>> = Default::default();
        let s = seen.clone();
        // Other tests allocate concurrently: keep only the events of this test's odd size.
        subscribe(Some(Arc::new(move |e: &StorageEvent| {
            let bytes = match e {
                StorageEvent::Alloc { bytes, .. } | StorageEvent::Free { bytes, .. } => *bytes,
            };
            if bytes == 123_457 {
                s.lock().push(*e);
            }
        })));
        drop(Block::alloc(123_457, Context::CPU).unwrap());
        subscribe(None);
        drop(Block::alloc(123_457, Context::CPU).unwrap());
        let events = seen.lock().clone();
        assert_eq!(events.len(), 2, "{events:?}");
        assert!(
            matches!(events[0], StorageEvent::Alloc { bytes: 123_457, stats, .. } if stats.bytes_in_use >= 123_457)
        );
        assert!(matches!(events[1], StorageEvent::Free { ctx: Context::CPU, .. }));
    }
}
