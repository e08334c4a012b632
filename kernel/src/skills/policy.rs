//! The `policy` reflector: the policy itself answers the reflection prompt (self-analysis, as
//! in SEED and OPID).
//!
//! The prompt ([`super::render_prompt`]) is framed by the pipeline's prompt builder as the
//! observation of a turn (so a chat model sees it through its chat template), sampled by the
//! policy actor with `[skills.policy]`'s settings and the builder's stop ids, and the reply
//! (stop id dropped, special tokens skipped) is read with [`super::parse_reply`], or checked
//! against the request's JSON reply format and re-asked when invalid ([`super::ask`]).
//!
//! Generation goes through the policy actor's mailbox like the rollout's: the RL step never
//! waits for a reflection, but a queued reflection runs between two of its generate calls.

use std::sync::Arc;

use actix::Recipient;
use cairn_plugin_sdk::{ContextVariant, Observation};

use super::config::PolicyReflectorConfig;
use super::{ask, Draft, Job, ReflectionFailure, Reflector};
use crate::backend::SamplingParams;
use crate::messages::Generate;
use crate::rollout::prompt::{PromptBuilder, TextCodec};

pub struct PolicyReflector {
    settings: PolicyReflectorConfig,
    generate: Recipient<Generate>,
    builder: Arc<dyn PromptBuilder>,
    codec: Arc<dyn TextCodec>,
}

impl PolicyReflector {
    pub fn new(
        settings: &PolicyReflectorConfig,
        generate: Recipient<Generate>,
        builder: Arc<dyn PromptBuilder>,
        codec: Arc<dyn TextCodec>,
    ) -> Self {
        PolicyReflector {
            settings: settings.clone(),
            generate,
            builder,
            codec,
        }
    }

    /// The policy's reply to one prompt: framed by the builder, sampled with the reflector's
    /// settings, stop id dropped, decoded.
    fn reply(&self, job: &Job, text: &str, attempt: u32) -> Result<String, ReflectionFailure> {
        let observation = Observation {
            text: text.to_string(),
            ..Default::default()
        };
        let prompt = self
            .builder
            .prompt(&reflection_variant(), &observation)
            .map_err(|e| {
                ReflectionFailure::error(format!("rendering the reflection prompt: {e}"))
            })?;
        let stop_ids = self.builder.stop_ids().to_vec();
        let message = Generate {
            prompts: vec![prompt],
            params: SamplingParams {
                temperature: self.settings.temperature,
                top_p: 1.0,
                max_new_tokens: self.settings.max_new_tokens,
                stop_ids: stop_ids.clone(),
                // One stream per ticket and attempt: a rerun of the same requests samples the
                // same replies (the first attempt's seed is the ticket).
                seed: job.ticket ^ (u64::from(attempt) << 48),
            },
        };
        // One of the kernel's few blocking waits on an actor: [`Reflector::reflect`] is
        // synchronous (the `endpoint` reflector's HTTP is too), and it runs on the reflector's
        // own `SyncArbiter` thread, which nothing else needs, while the policy actor answers
        // on its own: blocking here holds up nothing else and cannot deadlock.
        let generated = futures::executor::block_on(self.generate.send(message))
            .map_err(|e| ReflectionFailure::error(format!("policy actor: {e}")))?
            .map_err(|e| ReflectionFailure::error(format!("policy generation: {e}")))?;
        let Some(generation) = generated.generations.first() else {
            return Err(ReflectionFailure::error(
                "policy generation returned no response for the reflection prompt",
            ));
        };
        let ids = match generation.ids.split_last() {
            Some((last, body)) if stop_ids.contains(last) => body,
            _ => &generation.ids[..],
        };
        self.codec
            .decode(ids)
            .map_err(|e| ReflectionFailure::error(format!("decoding the policy's reply: {e}")))
    }
}

/// The context of a reflection prompt: no injection, no tools.
fn reflection_variant() -> ContextVariant {
    ContextVariant {
        label: "reflection".into(),
        tools_enabled: false,
        ..Default::default()
    }
}

impl Reflector for PolicyReflector {
    fn name(&self) -> &'static str {
        "policy"
    }

    fn reflect(&mut self, job: &Job) -> Result<Draft, ReflectionFailure> {
        let codec = self.codec.clone();
        ask(
            job,
            codec.as_ref(),
            "the policy's reply",
            |text, attempt| self.reply(job, text, attempt),
        )
    }
}
