//! Deadlines on plugin calls. Plugin code cannot be interrupted, so a call that must not hang
//! its caller runs on a worker thread while the caller waits for the answer with a deadline.
//!
//! Each calling thread has its own worker (thread-local), started on its first call and reused
//! by the next ones, so a call costs two channel hand-offs (about 14 µs on this project's
//! loaded 2-core machine; `cairn-bench env-calls`). A call that misses its deadline leaves its worker behind,
//! still inside the plugin with whatever the call owned (an episode, a batch): that worker is
//! abandoned, and the caller's next call starts a fresh one. An abandoned worker that does
//! return finds no one waiting: its answer is dropped and the thread ends.
//!
//! [`call_each`] runs a sequence of calls (a turn's environment steps, one per episode) with
//! one hand-off for the lot: the worker runs them in order, each under its own deadline from
//! its start, and the caller sleeps until the last answer or the running call's deadline. A
//! call that misses its deadline abandons the worker as [`call`] does, and the calls after it
//! go on on a fresh one.
//!
//! A panic inside the call (kernel code, or a plugin linked into the process rather than
//! loaded through the plugin ABI, whose boundary already catches panics) is caught on the
//! worker and returned as [`Missed::Panicked`].

use std::cell::RefCell;
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam::channel;
use parking_lot::{Condvar, Mutex};

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

/// `f`, with a panic turned into [`Missed::Panicked`].
fn caught<T>(f: impl FnOnce() -> T) -> Result<T, Missed> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| Missed::Panicked(panic_message(p)))
}

/// Hands `job` to this thread's worker, starting one when there is none (or it is gone).
fn submit(job: Job) -> std::io::Result<()> {
    WORKER.with(|w| {
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
    })
}

/// Forgets this thread's worker (it is stuck in a call): the next call starts a fresh one.
fn abandon_worker() {
    WORKER.with(|w| *w.borrow_mut() = None);
}

fn no_thread(e: &std::io::Error) -> Missed {
    Missed::Panicked(format!("could not start a thread for the plugin call: {e}"))
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
        return caught(f);
    };
    let (reply, answer) = channel::bounded(1);
    let job: Job = Box::new(move || {
        // The caller may have stopped waiting: then nobody reads the answer.
        let _ = reply.send(caught(f));
    });
    if let Err(e) = submit(job) {
        return Err(no_thread(&e));
    }
    match answer.recv_timeout(timeout) {
        Ok(value) => value,
        Err(channel::RecvTimeoutError::Timeout) => {
            abandon_worker();
            Err(Missed::TimedOut(timeout))
        }
        Err(channel::RecvTimeoutError::Disconnected) => Err(Missed::Panicked(
            "the plugin-call worker ended without an answer".into(),
        )),
    }
}

/// The calls of one [`call_each`] hand-off, shared by the caller and the worker.
struct Run<T, F> {
    state: Mutex<RunState<T, F>>,
    /// Signalled when the last call has answered.
    finished: Condvar,
}

struct RunState<T, F> {
    /// The calls not started yet, with their index in the caller's list.
    queue: VecDeque<(usize, F)>,
    /// The call running now and when it started.
    running: Option<(usize, Instant)>,
    /// Answers not yet collected by the caller.
    answers: Vec<(usize, Result<T, Missed>)>,
    /// The caller gave up on this worker (a call missed its deadline): it starts no more
    /// calls, and its answer of the stuck call is dropped.
    abandoned: bool,
}

impl<T, F: FnOnce() -> T> Run<T, F> {
    /// The worker's side: runs the queued calls in order until none is left or the caller
    /// abandons the run.
    fn work(&self) {
        let mut state = self.state.lock();
        loop {
            if state.abandoned {
                return;
            }
            let Some((i, f)) = state.queue.pop_front() else {
                state.running = None;
                self.finished.notify_one();
                return;
            };
            state.running = Some((i, Instant::now()));
            drop(state);
            let answer = caught(f);
            state = self.state.lock();
            if !state.abandoned {
                state.answers.push((i, answer));
            }
        }
    }
}

/// Runs `calls` in order, each under its own deadline of `timeout` from its start, and returns
/// their answers in the same order: [`call`] for each, with one hand-off to the worker for
/// the lot instead of two per call. A call that misses its deadline is
/// [`Missed::TimedOut`]; its worker is abandoned inside it, and the calls after it run on a
/// fresh worker. With `None`, the calls run on this thread, with no deadline. A panic in one
/// call is that call's [`Missed::Panicked`]; the others still run.
pub fn call_each<T, F>(timeout: Option<Duration>, calls: Vec<F>) -> Vec<Result<T, Missed>>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let Some(timeout) = timeout else {
        return calls.into_iter().map(caught).collect();
    };
    let mut answers: Vec<Option<Result<T, Missed>>> = calls.iter().map(|_| None).collect();
    let mut queue: VecDeque<(usize, F)> = calls.into_iter().enumerate().collect();
    while !queue.is_empty() {
        let run = Arc::new(Run {
            state: Mutex::new(RunState {
                queue: std::mem::take(&mut queue),
                running: None,
                answers: Vec::new(),
                abandoned: false,
            }),
            finished: Condvar::new(),
        });
        let submitted = Instant::now();
        let worker = run.clone();
        if let Err(e) = submit(Box::new(move || worker.work())) {
            let left = std::mem::take(&mut run.state.lock().queue);
            for (i, _) in left {
                answers[i] = Some(Err(no_thread(&e)));
            }
            break;
        }
        let mut state = run.state.lock();
        loop {
            for (i, answer) in state.answers.drain(..) {
                answers[i] = Some(answer);
            }
            if state.queue.is_empty() && state.running.is_none() {
                break;
            }
            // The running call's deadline; before the worker has taken the first call, the
            // first call's, counted from the hand-off.
            let (i, started) = match state.running {
                Some(running) => running,
                None => (state.queue.front().map_or(0, |(i, _)| *i), submitted),
            };
            let deadline = started + timeout;
            if Instant::now() < deadline {
                // Woken by the last answer, or at the deadline to look again (the call running
                // then may be a later one, with a later deadline).
                run.finished.wait_until(&mut state, deadline);
                continue;
            }
            answers[i] = Some(Err(Missed::TimedOut(timeout)));
            state.abandoned = true;
            queue = std::mem::take(&mut state.queue);
            queue.retain(|(j, _)| *j != i);
            abandon_worker();
            break;
        }
    }
    answers
        .into_iter()
        .map(|a| a.expect("call_each answers every call: by the worker, a deadline or an error"))
        .collect()
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
    fn call_each_answers_in_order_on_one_worker_and_a_panic_fails_its_call_only() {
        let calls: Vec<Box<dyn FnOnce() -> (u32, std::thread::ThreadId) + Send>> = vec![
            Box::new(|| (1, std::thread::current().id())),
            Box::new(|| panic!("boom")),
            Box::new(|| (3, std::thread::current().id())),
        ];
        let answers = call_each(Some(Duration::from_secs(60)), calls);
        let (one, first) = answers[0].clone().unwrap();
        assert!(matches!(&answers[1], Err(Missed::Panicked(m)) if m.contains("boom")));
        let (three, third) = answers[2].clone().unwrap();
        assert_eq!((one, three), (1, 3));
        assert_eq!(first, third, "one worker for the lot");
        assert_ne!(first, std::thread::current().id());
        // The same worker serves single calls too.
        assert_eq!(
            call(Some(Duration::from_secs(60)), || std::thread::current()
                .id()),
            Ok(first)
        );
        let inline = call_each(None, vec![|| std::thread::current().id()]);
        assert_eq!(inline, vec![Ok(std::thread::current().id())]);
        assert!(call_each(Some(Duration::from_secs(1)), Vec::<fn() -> u32>::new()).is_empty());
    }

    #[test]
    fn call_each_times_out_a_hung_call_alone_and_runs_the_rest_on_a_fresh_worker() {
        let release = Arc::new(AtomicBool::new(false));
        let hung_release = release.clone();
        let calls: Vec<Box<dyn FnOnce() -> std::thread::ThreadId + Send>> = vec![
            Box::new(|| std::thread::current().id()),
            Box::new(move || {
                while !hung_release.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                std::thread::current().id()
            }),
            Box::new(|| std::thread::current().id()),
            Box::new(|| std::thread::current().id()),
        ];
        let started = Instant::now();
        let answers = call_each(Some(Duration::from_millis(100)), calls);
        assert!(started.elapsed() >= Duration::from_millis(100));
        assert_eq!(
            answers[1],
            Err(Missed::TimedOut(Duration::from_millis(100)))
        );
        let ids: Vec<_> = [0, 2, 3].map(|i| answers[i].clone().unwrap()).into();
        assert_ne!(
            ids[0], ids[1],
            "the calls after the hung one ran on a fresh worker"
        );
        assert_eq!(ids[1], ids[2]);
        // The hung worker is still inside its call: the next calls do not queue behind it.
        assert_eq!(call(Some(Duration::from_secs(60)), || 2), Ok(2));
        release.store(true, Ordering::SeqCst);
    }

    #[test]
    fn zero_seconds_is_no_deadline() {
        assert_eq!(seconds(0.0), None);
        assert_eq!(seconds(1.5), Some(Duration::from_millis(1500)));
    }
}
