//! Deadlines on plugin calls. Plugin code cannot be interrupted, so a call that must not hang
//! its caller runs on a worker thread while the caller waits for the answer with a deadline.
//!
//! Each calling thread has its own worker (thread-local), started on its first call and reused
//! by the next ones, so a call costs two channel hand-offs (a few microseconds; see
//! `benches/src/bin/deadline.rs`). A call that misses its deadline leaves its worker behind,
//! still inside the plugin with whatever the call owned (an episode, a batch): that worker is
//! abandoned, and the caller's next call starts a fresh one. An abandoned worker that does
//! return finds no one waiting: its answer is dropped and the thread ends.
//!
//! A panic inside the call (kernel code, or a plugin linked into the process rather than
//! loaded through the plugin ABI, whose boundary already catches panics) is caught on the
//! worker and returned as [`Missed::Panicked`].

use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use crossbeam::channel;

type Job = Box<dyn FnOnce() + Send>;

/// Why a call under a deadline gave no value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Missed {
    /// No answer within the deadline (the duration); the worker was abandoned.
    TimedOut(Duration),
    /// The call panicked; the panic's message.
    Panicked(String),
}

thread_local! {
    static WORKER: RefCell<Option<channel::Sender<Job>>> = const { RefCell::new(None) };
}

fn spawn_worker() -> std::io::Result<channel::Sender<Job>> {
    let (tx, rx) = channel::unbounded::<Job>();
    std::thread::Builder::new()
        .name("cairn-plugin-call".into())
        .spawn(move || {
            for job in rx {
                job();
            }
        })?;
    Ok(tx)
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    cairn_plugin_sdk::PluginError::from_panic(payload).message
}

/// Runs `f` and returns its value, or why it gave none. With `timeout`, `f` runs on this
/// thread's worker and the wait ends after `timeout` ([`Missed::TimedOut`]; the worker is
/// abandoned, see the module docs); with `None`, `f` runs on this thread, with no deadline.
/// A panic in `f` is [`Missed::Panicked`] either way.
pub fn call<T, F>(timeout: Option<Duration>, f: F) -> Result<T, Missed>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let Some(timeout) = timeout else {
        return catch_unwind(AssertUnwindSafe(f)).map_err(|p| Missed::Panicked(panic_message(p)));
    };
    let (reply, answer) = channel::bounded(1);
    let job: Job = Box::new(move || {
        let value =
            catch_unwind(AssertUnwindSafe(f)).map_err(|p| Missed::Panicked(panic_message(p)));
        // The caller may have stopped waiting: then nobody reads the answer.
        let _ = reply.send(value);
    });
    let sent = WORKER.with(|w| -> std::io::Result<()> {
        let mut w = w.borrow_mut();
        let sender = match w.as_ref() {
            Some(s) => s.clone(),
            None => w.insert(spawn_worker()?).clone(),
        };
        if let Err(channel::SendError(job)) = sender.send(job) {
            // The worker is gone (it cannot panic, so only at thread exit): a fresh one.
            let fresh = spawn_worker()?;
            let _ = fresh.send(job);
            *w = Some(fresh);
        }
        Ok(())
    });
    if let Err(e) = sent {
        return Err(Missed::Panicked(format!(
            "could not start a thread for the plugin call: {e}"
        )));
    }
    match answer.recv_timeout(timeout) {
        Ok(value) => value,
        Err(channel::RecvTimeoutError::Timeout) => {
            WORKER.with(|w| *w.borrow_mut() = None);
            Err(Missed::TimedOut(timeout))
        }
        Err(channel::RecvTimeoutError::Disconnected) => Err(Missed::Panicked(
            "the plugin-call worker ended without an answer".into(),
        )),
    }
}

/// `seconds` as a deadline: `None` for 0 (no deadline), else the duration.
pub fn seconds(seconds: f64) -> Option<Duration> {
    (seconds > 0.0).then(|| Duration::from_secs_f64(seconds))
}

/// Where a plugin call under a deadline comes from, for the error of a missed deadline.
#[derive(Clone, Debug)]
pub struct Site<'a> {
    /// `rollout` or `optimizer`.
    pub actor: &'static str,
    /// The plugin, as "algorithm `name`" or "environment `name`".
    pub plugin: &'a str,
    /// The plugin method.
    pub call: &'static str,
    /// The config key of the deadline.
    pub key: &'static str,
}

/// [`call`] for a plugin call whose miss stops the run: a timeout is
/// [`crate::Error::PluginHang`] naming the actor, the plugin, the method and `context()` (the
/// step, group or task); a panic outside the plugin boundary is a plugin error of kind panic.
pub fn plugin_call<T, F>(
    timeout: Option<Duration>,
    site: &Site<'_>,
    context: impl FnOnce() -> String,
    f: F,
) -> crate::Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    call(timeout, f).map_err(|m| match m {
        Missed::TimedOut(d) => crate::Error::PluginHang {
            actor: site.actor,
            plugin: site.plugin.to_string(),
            call: site.call,
            context: context(),
            seconds: d.as_secs_f64(),
            key: site.key,
        },
        Missed::Panicked(message) => crate::Error::Plugin(cairn_plugin_sdk::PluginError::new(
            cairn_plugin_sdk::ErrorKind::Panic,
            format!(
                "{} {message} in `{}` ({})",
                site.plugin,
                site.call,
                context()
            ),
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[test]
    fn answers_come_back_and_the_worker_is_reused() {
        let first = call(Some(Duration::from_secs(60)), || {
            std::thread::current().id()
        })
        .unwrap();
        let second = call(Some(Duration::from_secs(60)), || {
            std::thread::current().id()
        })
        .unwrap();
        assert_eq!(first, second, "one worker per calling thread");
        assert_ne!(first, std::thread::current().id());
        assert_eq!(call(None, || 7), Ok(7));
    }

    #[test]
    fn a_hung_call_times_out_and_the_next_call_gets_a_fresh_worker() {
        let release = Arc::new(AtomicBool::new(false));
        let hung_release = release.clone();
        let hung = call(Some(Duration::from_millis(50)), move || {
            while !hung_release.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
            std::thread::current().id()
        });
        assert_eq!(hung, Err(Missed::TimedOut(Duration::from_millis(50))));
        // The hung worker is still inside the call: the next call must not queue behind it.
        let next = call(Some(Duration::from_secs(60)), || 1 + 1);
        assert_eq!(next, Ok(2));
        release.store(true, Ordering::SeqCst);
    }

    #[test]
    fn a_panic_is_an_error_value_and_the_worker_survives() {
        let e = call(Some(Duration::from_secs(60)), || -> u32 { panic!("boom") }).unwrap_err();
        assert!(
            matches!(&e, Missed::Panicked(m) if m.contains("boom")),
            "{e:?}"
        );
        let e = call(None, || -> u32 { panic!("inline boom") }).unwrap_err();
        assert!(
            matches!(&e, Missed::Panicked(m) if m.contains("inline boom")),
            "{e:?}"
        );
        assert_eq!(call(Some(Duration::from_secs(60)), || 3), Ok(3));
    }

    #[test]
    fn zero_seconds_is_no_deadline() {
        assert_eq!(seconds(0.0), None);
        assert_eq!(seconds(1.5), Some(Duration::from_millis(1500)));
    }
}
