//! [`SyncThreads`]: starts `SyncArbiter` actors and tells the host when their threads are done.
//!
//! actix hands out no join handle for a `SyncArbiter`'s threads: a thread drops its actor when
//! the arbiter's queue closes (the actix system that ran the arbiter was stopped and dropped),
//! after the message it is handling, while `main` goes on. The policy actor's thread owns the
//! libtorch backend; if the process exits while it still generates, libtorch's static
//! destructors run under it and its next tch call fails ("Invalid (backend, op) pair") and
//! panics. So the host starts every `SyncArbiter` through [`SyncThreads::start`] and, once the
//! system is dropped, calls [`SyncThreads::wait`] before it returns from `main`.
//!
//! How it knows: the factory closure handed to `SyncArbiter::start` holds a token. Each thread
//! keeps the factory until it has dropped its actor (actix rebuilds a stopped sync actor from
//! it), so the token goes, and the count falls, only after the actor (and the backend it
//! owns) is gone. Only thread-local teardown is left on that thread then.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use parking_lot::{Condvar, Mutex};

/// Counts the `SyncArbiter` actors started through it that are not yet dropped; cheap to
/// clone (shared count).
#[derive(Clone, Default)]
pub struct SyncThreads {
    live: Arc<Live>,
}

#[derive(Default)]
struct Live {
    count: Mutex<usize>,
    changed: Condvar,
}

/// Held by a factory closure; its drop counts the arbiter's thread as finished.
struct Token(Arc<Live>);

impl Drop for Token {
    fn drop(&mut self) {
        *self.0.count.lock() -= 1;
        self.0.changed.notify_all();
    }
}

impl SyncThreads {
    /// `SyncArbiter::start(1, factory)`, counted until its thread has dropped the actor. Call
    /// inside a running actix system.
    pub fn start<A, F>(&self, factory: F) -> Addr<A>
    where
        A: Actor<Context = SyncContext<A>>,
        F: Fn() -> A + Send + Sync + 'static,
    {
        *self.live.count.lock() += 1;
        let token = Token(self.live.clone());
        SyncArbiter::start(1, move || {
            let _counted = &token; // moved into the closure: dropped with the factory
            factory()
        })
    }

    /// Actors started here and not dropped yet.
    pub fn running(&self) -> usize {
        *self.live.count.lock()
    }

    /// Blocks until every actor started here has been dropped, or `timeout` passed: then
    /// `Err` with how many are still running. Call only after the actix system that runs the
    /// arbiters was dropped (from the thread that ran it): its threads finish only then, so
    /// waiting inside the system would wait for itself.
    pub fn wait(&self, timeout: Duration) -> Result<(), usize> {
        let deadline = Instant::now() + timeout;
        let mut count = self.live.count.lock();
        while *count > 0 {
            if self
                .live
                .changed
                .wait_until(&mut count, deadline)
                .timed_out()
            {
                return if *count == 0 { Ok(()) } else { Err(*count) };
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc;

    use futures::channel::oneshot;

    use super::*;

    struct Slow(Arc<AtomicBool>);

    impl Actor for Slow {
        type Context = SyncContext<Self>;
    }

    /// Says `started`, then stays busy until `release` gets a value (or its sender is gone).
    #[derive(Message)]
    #[rtype(result = "()")]
    struct Busy {
        started: oneshot::Sender<()>,
        release: mpsc::Receiver<()>,
    }

    impl Handler<Busy> for Slow {
        type Result = ();
        fn handle(&mut self, msg: Busy, _: &mut SyncContext<Self>) {
            let _ = msg.started.send(());
            let _ = msg.release.recv();
        }
    }

    impl Drop for Slow {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    /// The count stays up while a thread is still busy with a message its system no longer
    /// waits for, and `wait` returns only once the actor is dropped.
    #[test]
    fn wait_returns_once_the_actor_is_dropped_after_its_last_message() {
        let threads = SyncThreads::default();
        let dropped = Arc::new(AtomicBool::new(false));
        let (release, released) = mpsc::channel();
        {
            let (threads, dropped) = (threads.clone(), dropped.clone());
            actix::System::new().block_on(async move {
                let addr = threads.start(move || Slow(dropped.clone()));
                let (started, handling) = oneshot::channel();
                addr.do_send(Busy {
                    started,
                    release: released,
                });
                // The arbiter has handed the message to its thread.
                actix::clock::timeout(Duration::from_secs(10), handling)
                    .await
                    .expect("the sync thread took the message within 10 s")
                    .expect("the handler said it started");
                actix::System::current().stop();
            });
        }
        // The system is gone, the thread is still busy.
        assert_eq!(threads.running(), 1);
        assert!(!dropped.load(Ordering::SeqCst));
        assert_eq!(threads.wait(Duration::from_millis(10)), Err(1));
        release.send(()).unwrap();
        assert_eq!(threads.wait(Duration::from_secs(10)), Ok(()));
        assert!(
            dropped.load(Ordering::SeqCst),
            "the actor was dropped first"
        );
        assert_eq!(threads.running(), 0);
    }
}
