//! [`PullSource`]: the producer stage for a source that is asked for groups instead of playing
//! them: the gateway's episode source, which answers [`CollectGroups`] once harnesses have
//! finished enough episodes. For each [`Produce`] it asks for the step's groups and forwards
//! the answer to the reward actor, like the rollout actor does with the groups it plays.
//!
//! It also holds what a pipeline knows of such a source ([`GatewayLink`]): the kernel names
//! no gateway type, so the gateway (crate `cairn-gateway`) depends on the kernel and never the
//! other way.

use std::sync::atomic::Ordering;
use std::time::Instant;

use actix::prelude::*;

use crate::actors::flow::{Played, Produce};
use crate::actors::rollout::CollectGroups;
use crate::error::Error;

/// A pulled source as a training pipeline sees it: where a step's episodes come from, and the
/// pause around weight updates. Attached with [`super::Pipeline::attach_gateway`].
#[derive(Clone)]
pub struct GatewayLink {
    pub collect: Recipient<CollectGroups>,
    pub pause: Recipient<PauseSampling>,
    pub resume: Recipient<ResumeSampling>,
}

/// Stop launching generation batches; resolves when the batches in flight are done (the
/// optimizer sends it before a weight update).
#[derive(Message)]
#[rtype(result = "()")]
pub struct PauseSampling;

/// Launch the queued generation requests and go on batching (after the update).
#[derive(Message)]
#[rtype(result = "()")]
pub struct ResumeSampling;

/// See the module docs.
pub struct PullSource {
    pub source: Recipient<CollectGroups>,
    pub forward: Recipient<Played>,
    /// Task groups per step (B).
    pub groups: usize,
}

impl Actor for PullSource {
    type Context = Context<Self>;
}

impl Handler<Produce> for PullSource {
    type Result = ();

    fn handle(&mut self, msg: Produce, ctx: &mut Context<Self>) {
        let first_group_id = msg
            .next_group_id
            .fetch_add(self.groups as u64, Ordering::SeqCst);
        let ask = self.source.send(CollectGroups {
            step: msg.step,
            round: 0,
            groups: self.groups,
            first_group_id,
        });
        let forward = self.forward.clone();
        let started = Instant::now();
        // `wait`: one step at a time, in the order the credits came.
        ctx.wait(
            async move {
                let rollouts = ask.await.map_err(Error::from).and_then(|r| r);
                forward.do_send(Played {
                    step: msg.step,
                    rollouts,
                    rollout_secs: started.elapsed().as_secs_f64(),
                });
            }
            .into_actor(self),
        );
    }
}
