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

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use parking_lot::Mutex;

use super::store::EpisodeStore;
use crate::actors::rollout::CollectGroups;
use crate::error::Result;
use crate::rollout::{Rollouts, TrajectoryOutcome};

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

impl Handler<CollectGroups> for EpisodeSource {
    type Result = ResponseFuture<Result<Rollouts>>;

    fn handle(&mut self, msg: CollectGroups, _: &mut Context<Self>) -> Self::Result {
        let store = self.store.clone();
        let group_size = self.group_size;
        let step_timeout = self.step_timeout;
        Box::pin(async move {
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
        })
    }
}

fn rollouts(collected: super::store::Collected) -> Rollouts {
    let mut out = Rollouts {
        aborted: collected.dropped,
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
