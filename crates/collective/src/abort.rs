//! [`AbortHandle`]: fail a group from outside, e.g. when the coordinator bumps the generation.

use crate::error::Error;
use crate::group::Shared;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// A cloneable trigger that aborts the group formed with it (and any formation still under way).
/// Tripping it makes every in-flight and later call on the group return [`Error::Aborted`] at
/// once, closes the group's sockets and tells the peers.
///
/// A handle trips once; form the next generation's group with a fresh one. A worker that learns
/// generations from a `tokio::sync::watch` channel can spawn a task that waits for a change and
/// calls [`AbortHandle::abort`].
#[derive(Clone, Default)]
pub struct AbortHandle {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    aborted: AtomicBool,
    groups: Mutex<Vec<Weak<Shared>>>,
}

impl AbortHandle {
    /// A handle that has not tripped.
    pub fn new() -> AbortHandle {
        AbortHandle::default()
    }

    /// Aborts the group(s) formed with this handle. Idempotent; returns at once.
    pub fn abort(&self) {
        self.inner.aborted.store(true, Ordering::SeqCst);
        let groups = std::mem::take(&mut *self.inner.groups.lock().unwrap_or_else(|p| p.into_inner()));
        for group in groups.iter().filter_map(Weak::upgrade) {
            group.fail(Error::Aborted);
        }
    }

    /// Whether [`abort`](Self::abort) was called.
    pub fn is_aborted(&self) -> bool {
        self.inner.aborted.load(Ordering::SeqCst)
    }

    /// Ties a freshly formed group to this handle; fails it at once if the handle already tripped.
    pub(crate) fn attach(&self, group: &Arc<Shared>) {
        self.inner.groups.lock().unwrap_or_else(|p| p.into_inner()).push(Arc::downgrade(group));
        if self.is_aborted() {
            group.fail(Error::Aborted);
        }
    }
}

impl fmt::Debug for AbortHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AbortHandle").field("aborted", &self.is_aborted()).finish()
    }
}
