//! [`EpisodeSource`]: training steps fed by the gateway's episodes instead of the rollout
//! actor.
//!
//! It answers the trainer's [`CollectGroups`] like the rollout actor does, with
//! [`Rollouts`]: it waits until the [`EpisodeStore`] holds `groups` complete groups of
//! `group_size` finished episodes (episodes sharing the harness's task id), then hands over
//! their rows. With `step_timeout` set, a step that waited that long takes what is there
//! (complete groups first, then partial ones) as soon as anything is. Timed-out episodes are
//! swept while it waits. Runs on an async arbiter; the store is shared with the HTTP side
//! behind a mutex held only for short, non-blocking calls.
//!
//! The wait runs inside the actor's context, so [`StopCollecting`] (the host's shutdown) ends
//! it: the actor stops, and a step still waiting gets a mailbox error instead of a loop that
//! polls the store until the process exits. A stop request ([`cairn_kernel::trainer::request_stop`],
//! on SIGINT or SIGTERM) ends it too, with [`Error::Interrupted`]: the trainer then stops after
//! its last finished step instead of waiting for episodes a harness may never send.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use parking_lot::Mutex;

use super::store::EpisodeStore;
use cairn_kernel::actors::rollout::CollectGroups;
use cairn_kernel::error::{Error, Result};
use cairn_kernel::rollout::{FailedEpisode, FailureKind, Rollouts, TrajectoryOutcome};

/// How often a waiting step looks at the store.
const POLL: Duration = Duration::from_millis(20);
/// How often a waiting step logs that it is waiting.
const NOTE_EVERY: Duration = Duration::from_secs(30);

/// See the module docs.
pub struct EpisodeSource {
    pub store: Arc<Mutex<EpisodeStore>>,
    /// Episodes per group (the rollout config's `group_size`).
    pub group_size: usize,
    /// `None`: wait for complete groups however long it takes.
    pub step_timeout: Option<Duration>,
}

impl Actor for EpisodeSource {
    type Context = Context<Self>;
}

/// Stop the source: a pending [`CollectGroups`] is dropped with it.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StopCollecting;

impl Handler<StopCollecting> for EpisodeSource {
    type Result = ();

    fn handle(&mut self, _: StopCollecting, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

impl Handler<CollectGroups> for EpisodeSource {
    type Result = ResponseActFuture<Self, Result<Rollouts>>;

    fn handle(&mut self, msg: CollectGroups, _: &mut Context<Self>) -> Self::Result {
        let store = self.store.clone();
        let group_size = self.group_size;
        let step_timeout = self.step_timeout;
        // Inside the actor's context, so stopping the actor ends the wait.
        let wait = async move {
            let started = Instant::now();
            let mut noted = started;
            loop {
                let now = Instant::now();
                let partial = step_timeout.is_some_and(|t| now.duration_since(started) >= t);
                let collected = {
                    let mut store = store.lock();
                    store.sweep(now);
                    store.take_groups(msg.groups, group_size, msg.first_group_id, partial)
                };
                if let Some(collected) = collected {
                    return Ok(rollouts(collected));
                }
                // A stop request (SIGINT) ends the wait: the harness may never send more.
                if let Some(reason) = cairn_kernel::trainer::stop_requested() {
                    return Err(Error::Interrupted {
                        message: format!(
                            "{reason}: RL step {} was waiting for harness episodes",
                            msg.step
                        ),
                    });
                }
                if now.duration_since(noted) >= NOTE_EVERY {
                    noted = now;
                    let store = store.lock();
                    tracing::info!(
                        step = msg.step,
                        ready = store.ready_count(),
                        open = store.open_count(),
                        groups = msg.groups,
                        group_size,
                        "waiting for harness episodes"
                    );
                }
                actix::clock::sleep(POLL).await;
            }
        };
        Box::pin(wait.into_actor(self))
    }
}

fn rollouts(collected: super::store::Collected) -> Rollouts {
    let failed = collected
        .dropped
        .into_iter()
        .map(|(trajectory_id, task_id, reason)| FailedEpisode {
            trajectory_id,
            group_id: 0,
            kind: if reason.starts_with("timed_out") {
                FailureKind::Timeout
            } else {
                FailureKind::Error
            },
            task_id,
            reason,
        })
        .collect();
    let mut out = Rollouts {
        failed,
        ..Rollouts::default()
    };
    for e in collected.episodes {
        out.sampled_tokens += e.rows.iter().map(|r| r.trainable_tokens()).sum::<usize>();
        out.trajectories.push(TrajectoryOutcome {
            trajectory_id: e.seq,
            group_id: e.rows.first().map_or(0, |r| r.group_id),
            task_id: e.group_key.clone(),
            turns: e.rows.len() as u32,
            success: e.success,
            reward: e.reward,
        });
        out.rows.extend(e.rows);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EpisodeSettings, MissingReward, RowMode};

    /// A step still waiting for episodes when the source stops gets an error at once; the
    /// wait does not go on polling the store without anyone to answer.
    #[test]
    fn stopping_ends_a_pending_collect() {
        actix::System::new().block_on(async {
            let store = EpisodeStore::new(EpisodeSettings {
                timeout: Duration::from_secs(60),
                missing_reward: MissingReward::Drop,
                rows: RowMode::Merged,
                keep_finished: 4,
                max_ready: 4,
                max_open: 4,
            });
            let source = EpisodeSource {
                store: Arc::new(Mutex::new(store)),
                group_size: 2,
                step_timeout: None,
            }
            .start();
            let pending = source.send(CollectGroups {
                step: 1,
                round: 0,
                groups: 1,
                first_group_id: 0,
            });
            // The mailbox keeps send order: the collect is waiting when the stop is handled.
            source.send(StopCollecting).await.unwrap();
            let answer = actix::clock::timeout(Duration::from_secs(5), pending)
                .await
                .expect("the pending collect is answered once the source stops");
            assert!(answer.is_err(), "no episodes, so no rollouts");
        });
    }
}
