//! Token-level bookkeeping rules shared by the rollout, the reward actor and the gateway.
//!
//! Each function fixes a whole class of bug seen in other frameworks (cases in
//! `shared/cases/bugs.json`, pinned by the tests below):
//! - masks come from lengths and stop ids, never from comparing tokens with the pad id
//!   (trl #4970), and every configured stop id ends a completion (trl #7039);
//! - an outcome reward sits on the last policy token of a response: not on a pad (trl #3750),
//!   not on a tool-output token (verl #6392), and nowhere when there is no policy token
//!   (verl #6310);
//! - a truncated response stays as sampled (OpenRLHF #238).

use cairn_plugin_sdk::FinishReason;

/// The completion mask of a padded completion: 1 up to and including the first stop id, 0
/// after it. Returns `(mask, terminated)`; `terminated` is false when no stop id occurs (the
/// completion was truncated). Pad ids are never looked at: a stop id that equals the pad id
/// (Qwen's `<|endoftext|>`) still counts as the stop.
pub fn completion_mask(ids: &[u32], stop_ids: &[u32]) -> (Vec<u8>, bool) {
    match ids.iter().position(|id| stop_ids.contains(id)) {
        Some(stop) => {
            let mask = (0..ids.len()).map(|i| u8::from(i <= stop)).collect();
            (mask, true)
        }
        None => (vec![1; ids.len()], false),
    }
}

/// The mask of a padded completion whose generated length is known: 1 on the first
/// `generated_len` slots.
pub fn mask_from_length(padded_len: usize, generated_len: usize) -> Vec<u8> {
    (0..padded_len)
        .map(|i| u8::from(i < generated_len))
        .collect()
}

/// Where an outcome reward belongs: the last token with loss mask 1 (a policy token). `None`
/// when the response has no policy token; then the reward has nowhere to go.
pub fn reward_index(response_mask: &[u8]) -> Option<usize> {
    response_mask.iter().rposition(|&m| m == 1)
}

/// Places `score` on [`reward_index`], zeros elsewhere. An empty response gets all zeros.
pub fn token_level_rewards(response_mask: &[u8], score: f32) -> Vec<f32> {
    let mut out = vec![0.0; response_mask.len()];
    if let Some(i) = reward_index(response_mask) {
        out[i] = score;
    }
    out
}

/// The outcome score carried by a row: the masked sum of its token-level rewards.
/// Select-then-reduce: masked slots are skipped, whatever they hold.
pub fn outcome_score(token_rewards: &[f32], response_mask: &[u8]) -> f32 {
    token_rewards
        .iter()
        .zip(response_mask)
        .filter(|(_, &m)| m == 1)
        .map(|(r, _)| r)
        .sum()
}

/// The policy's own tokens of a response (mask 1), in order: what a verifier should read.
pub fn policy_tokens<T: Clone>(tokens: &[T], response_mask: &[u8]) -> Vec<T> {
    tokens
        .iter()
        .zip(response_mask)
        .filter(|(_, &m)| m == 1)
        .map(|(t, _)| t.clone())
        .collect()
}

/// The finish reason of a sampled response: `Stop` when its last id is a stop id, `Length`
/// otherwise. The ids themselves are never changed.
pub fn finish_reason(ids: &[u32], stop_ids: &[u32]) -> FinishReason {
    match ids.last() {
        Some(id) if stop_ids.contains(id) => FinishReason::Stop,
        _ => FinishReason::Length,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IM_END: u32 = 151645;
    const ENDOFTEXT: u32 = 151643;

    #[test]
    fn trl_7039_every_generation_stop_id_ends_the_completion() {
        let ids = [9707, 1879, ENDOFTEXT, ENDOFTEXT, ENDOFTEXT];
        let (mask, terminated) = completion_mask(&ids, &[IM_END, ENDOFTEXT]);
        assert_eq!(mask, vec![1, 1, 1, 0, 0]);
        assert!(terminated);
        // Only the tokenizer's eos: the secondary stop id is missed (the bug).
        let (buggy, t) = completion_mask(&ids, &[IM_END]);
        assert_eq!(buggy, vec![1, 1, 1, 1, 1]);
        assert!(!t);
    }

    #[test]
    fn trl_4970_mask_comes_from_length_not_pad_id() {
        // Pad and eos share an id: the genuine eos at index 2 must stay in the mask.
        assert_eq!(mask_from_length(5, 3), vec![1, 1, 1, 0, 0]);
        let (mask, _) =
            completion_mask(&[9707, 1879, ENDOFTEXT, ENDOFTEXT, ENDOFTEXT], &[ENDOFTEXT]);
        assert_eq!(mask, vec![1, 1, 1, 0, 0]);
    }

    #[test]
    fn trl_3750_reward_sits_on_the_eos_not_the_first_pad() {
        let ids = [9707, 1879, IM_END, ENDOFTEXT, ENDOFTEXT];
        let (mask, _) = completion_mask(&ids, &[IM_END]);
        assert_eq!(reward_index(&mask), Some(2));
        let full = [9707, 1879, 11, 1879, 0];
        let (mask, terminated) = completion_mask(&full, &[IM_END]);
        assert!(!terminated);
        assert_eq!(reward_index(&mask), Some(4));
    }

    #[test]
    fn verl_6392_reward_on_last_policy_token_not_tool_output() {
        let tokens = ["assistant", "final", "TOOL_LEAK", "<pad>"];
        let response_mask = [1, 1, 0, 0];
        assert_eq!(reward_index(&response_mask), Some(1));
        assert_eq!(
            token_level_rewards(&response_mask, 1.0),
            vec![0.0, 1.0, 0.0, 0.0]
        );
        assert_eq!(
            policy_tokens(&tokens, &response_mask),
            vec!["assistant", "final"]
        );
    }

    #[test]
    fn verl_6310_empty_response_gets_no_phantom_reward() {
        let masks = [[1u8, 1, 0], [0, 0, 0]];
        let scores = [1.0f32, 10.0];
        let rewards: Vec<Vec<f32>> = masks
            .iter()
            .zip(scores)
            .map(|(m, s)| token_level_rewards(m, s))
            .collect();
        assert_eq!(rewards, vec![vec![0.0, 1.0, 0.0], vec![0.0, 0.0, 0.0]]);
        let outcome: Vec<f64> = rewards
            .iter()
            .zip(&masks)
            .map(|(r, m)| f64::from(outcome_score(r, m)))
            .collect();
        assert_eq!(outcome, vec![1.0, 0.0]);
        let adv = cairn_plugin_sdk::stats::normalise_groups(
            &outcome,
            &[vec![0, 1]],
            cairn_plugin_sdk::stats::Normalise::MeanStd {
                eps: 1e-6,
                std: cairn_plugin_sdk::stats::StdKind::Unbiased,
            },
        );
        // The case's expected ±0.707106 is 1/√2 truncated.
        let half = std::f64::consts::FRAC_1_SQRT_2;
        assert!(
            (adv[0] - half).abs() < 1e-6 && (adv[1] + half).abs() < 1e-6,
            "{adv:?}"
        );
    }

    #[test]
    fn masked_reward_slots_are_never_summed() {
        assert_eq!(outcome_score(&[f32::NAN, 2.0], &[0, 1]), 2.0);
    }

    #[test]
    fn openrlhf_238_truncated_response_is_kept_as_sampled() {
        let sampled = [9707, 1879, 11, 1879];
        assert_eq!(finish_reason(&sampled, &[IM_END]), FinishReason::Length);
        assert_eq!(
            finish_reason(&[9707, IM_END], &[IM_END]),
            FinishReason::Stop
        );
    }
}
