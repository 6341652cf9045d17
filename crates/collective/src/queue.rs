//! A blocking queue whose every wait has a deadline and which a failing group can close, waking
//! everyone blocked on it. Used for the chunks moving between a rank's sender and receiver
//! threads and for the in-memory link between co-located ranks.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

/// Why a wait ended without an item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Interrupted {
    /// The queue was closed (the group is failing or shutting down).
    Closed,
    /// The deadline passed.
    TimedOut,
}

pub(crate) struct Queue<T> {
    state: Mutex<State<T>>,
    changed: Condvar,
    /// Most items held; a push waits for room beyond this.
    capacity: usize,
}

struct State<T> {
    items: VecDeque<T>,
    closed: bool,
}

impl<T> Queue<T> {
    /// A queue holding at most `capacity` items (`usize::MAX` for no bound beyond the producer's
    /// own: the chunks of buffers the caller already owns).
    pub fn new(capacity: usize) -> Queue<T> {
        Queue {
            state: Mutex::new(State { items: VecDeque::new(), closed: false }),
            changed: Condvar::new(),
            capacity: capacity.max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // A panic while holding this lock leaves only a queue of owned items behind; keep going.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Appends `item`, waiting until there is room, the deadline passes or the queue closes.
    pub fn push(&self, item: T, deadline: Option<Instant>) -> Result<(), Interrupted> {
        let mut state = self.lock();
        loop {
            if state.closed {
                return Err(Interrupted::Closed);
            }
            if state.items.len() < self.capacity {
                state.items.push_back(item);
                self.changed.notify_all();
                return Ok(());
            }
            state = self.wait(state, deadline)?;
        }
    }

    /// Takes the oldest item, waiting until there is one, the deadline passes or the queue
    /// closes. Items still queued when it closes are dropped, not returned.
    pub fn pop(&self, deadline: Option<Instant>) -> Result<T, Interrupted> {
        let mut state = self.lock();
        loop {
            if state.closed {
                return Err(Interrupted::Closed);
            }
            if let Some(item) = state.items.pop_front() {
                self.changed.notify_all();
                return Ok(item);
            }
            state = self.wait(state, deadline)?;
        }
    }

    /// Closes the queue: every current and future wait returns [`Interrupted::Closed`].
    pub fn close(&self) {
        let mut state = self.lock();
        state.closed = true;
        state.items.clear();
        self.changed.notify_all();
    }

    fn wait<'a>(
        &self,
        state: MutexGuard<'a, State<T>>,
        deadline: Option<Instant>,
    ) -> Result<MutexGuard<'a, State<T>>, Interrupted> {
        match deadline {
            None => Ok(self.changed.wait(state).unwrap_or_else(|p| p.into_inner())),
            Some(deadline) => {
                let now = Instant::now();
                if now >= deadline {
                    return Err(Interrupted::TimedOut);
                }
                let (state, _) =
                    self.changed.wait_timeout(state, deadline - now).unwrap_or_else(|p| p.into_inner());
                Ok(state)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn bounded_push_waits_for_room() {
        let q = Arc::new(Queue::new(1));
        q.push(1, None).unwrap();
        let soon = Some(Instant::now() + Duration::from_millis(20));
        assert_eq!(q.push(2, soon), Err(Interrupted::TimedOut));
        let consumer = {
            let q = q.clone();
            std::thread::spawn(move || (q.pop(None).unwrap(), q.pop(None).unwrap()))
        };
        q.push(2, Some(Instant::now() + Duration::from_secs(10))).unwrap();
        assert_eq!(consumer.join().unwrap(), (1, 2));
    }

    #[test]
    fn close_wakes_a_blocked_pop() {
        let q: Arc<Queue<u8>> = Arc::new(Queue::new(usize::MAX));
        let waiter = {
            let q = q.clone();
            std::thread::spawn(move || q.pop(None))
        };
        std::thread::sleep(Duration::from_millis(20));
        q.close();
        assert_eq!(waiter.join().unwrap(), Err(Interrupted::Closed));
        assert_eq!(q.push(1, None), Err(Interrupted::Closed));
    }

    #[test]
    fn pop_times_out() {
        let q: Queue<u8> = Queue::new(4);
        assert_eq!(q.pop(Some(Instant::now() + Duration::from_millis(5))), Err(Interrupted::TimedOut));
    }
}
