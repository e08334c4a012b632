//! How a command's process runs and ends: the actix system its actors run on
//! ([`on_actor_system`], which waits for their threads before `main` returns), SIGINT and
//! SIGTERM ([`Signals`]), and the immediate exit of a second signal ([`exit_now`]). `cairn
//! train`, `cairn eval` and `cairn serve` share them.

use anyhow::Result;
use cairn_kernel::actors::threads::SyncThreads;
use futures::future::{self, Either};

/// How long a finished command waits for its actor threads (the policy actor finishes the
/// backend call it is in first).
const THREAD_EXIT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Runs `work` on a fresh actix system, then stops and drops the system (every actor goes
/// with it; the `SyncArbiter` threads see their queues close) and waits until the threads
/// `work` hands back have dropped their actors. Returning from `main` earlier would run
/// libtorch's static destructors under a policy thread that may still generate, and its
/// next tch call panics (`Invalid (backend, op) pair`).
pub(crate) fn on_actor_system<T>(
    work: impl std::future::Future<Output = (SyncThreads, Result<T>)>,
) -> Result<T> {
    let (threads, result) = actix::System::new().block_on(async {
        let out = work.await;
        actix::System::current().stop();
        out
    });
    // The system runner is dropped here, so its actors are.
    if let Err(running) = threads.wait(THREAD_EXIT_TIMEOUT) {
        let e = anyhow::anyhow!(
            "{running} actor thread(s) were still busy {} s after the actors stopped (the \
             policy actor's holds libtorch, so exiting now could crash it); rerun with \
             CAIRN_LOG=debug to see which backend call did not return",
            THREAD_EXIT_TIMEOUT.as_secs()
        );
        match &result {
            // The command's own error says more; this one is logged.
            Err(_) => tracing::error!("{e:#}"),
            Ok(_) => return Err(e),
        }
    }
    result
}

/// SIGINT (Ctrl-C) and SIGTERM, listened to from creation on: a signal that arrives while
/// the first is being handled is not lost (each [`Signals::next`] takes one). A signal
/// whose handler cannot be installed is never awaited (the other still is).
pub(crate) struct Signals {
    interrupt: Option<actix_rt::signal::unix::Signal>,
    terminate: Option<actix_rt::signal::unix::Signal>,
}

impl Signals {
    /// Installs the handlers (on the running actix system).
    pub(crate) fn new() -> Self {
        use actix_rt::signal::unix::{signal, SignalKind};
        Signals {
            interrupt: signal(SignalKind::interrupt()).ok(),
            terminate: signal(SignalKind::terminate()).ok(),
        }
    }

    /// Resolves on the next SIGINT or SIGTERM, naming it.
    pub(crate) async fn next(&mut self) -> &'static str {
        async fn recv(s: Option<&mut actix_rt::signal::unix::Signal>) {
            match s {
                Some(s) => {
                    if s.recv().await.is_none() {
                        future::pending::<()>().await;
                    }
                }
                None => future::pending::<()>().await,
            }
        }
        let interrupt = recv(self.interrupt.as_mut());
        let terminate = recv(self.terminate.as_mut());
        match future::select(Box::pin(interrupt), Box::pin(terminate)).await {
            Either::Left(_) => "interrupted (SIGINT)",
            Either::Right(_) => "terminated (SIGTERM)",
        }
    }
}

/// Ends the process at once with `code`, for a second signal: stdout and stderr are flushed,
/// then `_exit` ends every thread together, running no `atexit` handler and no static
/// destructor. (`std::process::exit` runs libtorch's static destructors while its worker
/// threads may still compute: a segfault or a libtorch panic.) What was in flight is lost;
/// every file a resume reads was written atomically or is cut back on resume.
pub(crate) fn exit_now(code: i32) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: `_exit` takes no pointers and never returns; skipping the process's exit-time
    // cleanup is the point (the OS closes files and releases the run directory's lock).
    unsafe { libc::_exit(code) }
}
