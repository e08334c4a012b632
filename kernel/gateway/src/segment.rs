//! Segments: the row sequences a gateway episode's calls merge into (Agent Lightning's
//! trajectory mode, github microsoft/agent-lightning; docs/gateway.md).
//!
//! A [`Segment`] starts from one call's rendered prompt ids and one sampled choice. A later call
//! *extends* it when its prompt ids start with the segment's prompt + response ids: the ids in
//! between (the newline after `<|im_end|>`, tool results, the next generation prompt: whatever
//! the template rendered) are appended with loss mask 0 and log-prob 0, then the new sampled
//! ids with mask 1. The test is on token ids, never on text, so a re-tokenised assistant turn,
//! a context rewrite or a dropped think block all fail it and start a new segment. Callers:
//! [`super::store::EpisodeStore`].

use cairn_plugin_sdk::FinishReason;

/// One sampled response as the gateway returned it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SampledChoice {
    /// Sampled ids `[L]`, verbatim (stop id included when one was sampled).
    pub ids: Vec<u32>,
    /// `log softmax(logits / T)` of each id, `[L]`, nats.
    pub logprobs: Vec<f32>,
    pub finish_reason: FinishReason,
    /// Tool calls parsed from the response (chat completions), for row metadata.
    pub tool_calls: u32,
}

/// A row sequence: the first call's prompt, then sampled ids (mask 1) and inserted
/// observation ids (mask 0).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Segment {
    /// Prompt ids of the first call, `[P]`.
    pub prompt_ids: Vec<u32>,
    /// `[L]`: sampled and observation ids in order.
    pub response_ids: Vec<u32>,
    /// `[L]`: sampled log-probs, 0 on observation ids.
    pub response_logprobs: Vec<f32>,
    /// `[L]`: 1 on sampled ids, 0 on observation ids.
    pub response_mask: Vec<u8>,
    /// The policy version that sampled every mask-1 id (a segment never mixes versions).
    pub policy_version: u64,
    /// `(call index, choice index)` of each call merged into the segment, in order.
    pub calls: Vec<(u32, u32)>,
    /// Anchor key of the first call (GiGPO), when the harness sent one.
    pub anchor: Option<String>,
    /// The observation text the first call acted on (its last message).
    pub observation: String,
    /// Finish reason of the last merged call.
    pub finish_reason: FinishReason,
    /// Tool calls made over the merged calls.
    pub tool_calls: u32,
}

impl Segment {
    /// A segment holding one call's prompt and sampled choice.
    pub fn start(
        prompt_ids: &[u32],
        choice: &SampledChoice,
        call: (u32, u32),
        policy_version: u64,
        anchor: Option<String>,
        observation: String,
    ) -> Segment {
        let mut segment = Segment {
            prompt_ids: prompt_ids.to_vec(),
            policy_version,
            anchor,
            observation,
            ..Segment::default()
        };
        segment.push_sampled(choice, call);
        segment
    }

    /// Length of prompt + response ids.
    pub fn len(&self) -> usize {
        self.prompt_ids.len() + self.response_ids.len()
    }

    /// Whether the segment holds no ids at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `prompt` starts with this segment's prompt + response ids. `Err(position)`
    /// gives the first index where they differ (the prompt's length when it is shorter).
    pub fn prefix_of(&self, prompt: &[u32]) -> Result<(), usize> {
        let mine = self.prompt_ids.iter().chain(&self.response_ids);
        match mine.zip(prompt).position(|(a, b)| a != b) {
            Some(position) => Err(position),
            None if prompt.len() < self.len() => Err(prompt.len()),
            None => Ok(()),
        }
    }

    /// Appends the ids of `prompt` past this segment (mask 0), then `choice` (mask 1).
    /// Precondition: [`Segment::prefix_of`] holds.
    pub fn extend(&mut self, prompt: &[u32], choice: &SampledChoice, call: (u32, u32)) {
        debug_assert!(
            self.prefix_of(prompt).is_ok(),
            "extend needs a prefix match"
        );
        let observation = &prompt[self.len()..];
        self.response_ids.extend_from_slice(observation);
        self.response_logprobs.resize(self.response_ids.len(), 0.0);
        self.response_mask.resize(self.response_ids.len(), 0);
        self.push_sampled(choice, call);
    }

    fn push_sampled(&mut self, choice: &SampledChoice, call: (u32, u32)) {
        self.response_ids.extend_from_slice(&choice.ids);
        self.response_logprobs.extend_from_slice(&choice.logprobs);
        self.response_mask.resize(self.response_ids.len(), 1);
        self.finish_reason = choice.finish_reason;
        self.tool_calls += choice.tool_calls;
        self.calls.push(call);
    }

    /// Number of mask-1 (sampled) ids.
    pub fn sampled_tokens(&self) -> usize {
        self.response_mask.iter().filter(|&&m| m == 1).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choice(ids: &[u32]) -> SampledChoice {
        SampledChoice {
            ids: ids.to_vec(),
            logprobs: ids.iter().map(|&i| -(i as f32) / 10.0).collect(),
            finish_reason: FinishReason::Stop,
            tool_calls: 0,
        }
    }

    #[test]
    fn extends_with_masked_observation_ids() {
        let mut s = Segment::start(&[1, 2], &choice(&[3, 4]), (0, 0), 7, None, String::new());
        assert_eq!(s.prefix_of(&[1, 2, 3, 4, 5, 6]), Ok(()));
        s.extend(&[1, 2, 3, 4, 5, 6], &choice(&[8]), (1, 0));
        assert_eq!(s.prompt_ids, vec![1, 2]);
        assert_eq!(s.response_ids, vec![3, 4, 5, 6, 8]);
        assert_eq!(s.response_mask, vec![1, 1, 0, 0, 1]);
        assert_eq!(s.response_logprobs, vec![-0.3, -0.4, 0.0, 0.0, -0.8]);
        assert_eq!(s.calls, vec![(0, 0), (1, 0)]);
        assert_eq!(s.sampled_tokens(), 3);
    }

    #[test]
    fn prefix_test_is_on_ids() {
        let s = Segment::start(&[1, 2], &choice(&[3, 4]), (0, 0), 0, None, String::new());
        assert_eq!(s.prefix_of(&[1, 2, 3, 9, 5]), Err(3));
        assert_eq!(s.prefix_of(&[1, 2, 3]), Err(3));
        assert_eq!(s.prefix_of(&[1, 2, 3, 4]), Ok(()));
    }
}
