//! Per-token weights of an auxiliary row: the action span, the action factor and the
//! sampled-token gate (github TU2021/UCOB: `main_ucob.py` `append_aux_row` for the weights,
//! `sdar_utils.py` `compute_dsdar_topk_loss` for the gate).
//!
//! For the winner's response with mask `m_l`, pair weight `w`, action tokens `a_l ∈ {0, 1}`:
//!
//! * `scope = response`: `W_l = m_l · w · (1 + (action_weight − 1) · a_l)`;
//! * `scope = action`: `W_l = m_l · a_l · w`;
//!
//! and with the gate on, `W_l · g_l` where `g_l = σ(β (ℓ^T_l − ℓ^S_l))` on the sampled token,
//! detached: `ℓ^T` the winner's log-prob under its own (teacher) prompt, `ℓ^S` under the
//! target's prompt in the target view. The objective then adds `coef · agg(W_l · d_l)`, `d_l`
//! the renormalised top-k forward KL of the teacher's top-k ids.

use cairn_plugin_sdk::{FinishReason, TurnRow};

use crate::config::{ActionSpan, Scope, UcobConfig};

/// The logistic sigmoid, `1 / (1 + e^{−x})`, stable for large `|x|`.
pub fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// The gate `σ(β (ℓ^T − ℓ^S))` of one token.
pub fn gate(beta: f64, teacher: f64, student: f64) -> f64 {
    sigmoid(beta * (teacher - student))
}

/// Finds `needle` in `hay` at or after `from`; the index of its first token.
fn find(hay: &[u32], needle: &[u32], from: usize) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    (from..=hay.len() - needle.len()).find(|&i| hay[i..i + needle.len()] == *needle)
}

/// The action tokens of `row`'s response, `[L]` (see [`ActionSpan`]); `tags` are the token
/// ids of `(action_open, action_close)` for the tagged span. Only mask-1 tokens are ever
/// action tokens. Returns the mask and whether a span was found (always true for `plain`
/// with at least one action token; false for `none`).
pub fn action_tokens(
    row: &TurnRow,
    span: ActionSpan,
    tags: &(Vec<u32>, Vec<u32>),
) -> (Vec<bool>, bool) {
    let l = row.response_ids.len();
    let mut out = vec![false; l];
    let stop = match row.finish_reason {
        FinishReason::Stop => row.last_policy_token(),
        _ => None,
    };
    match span {
        ActionSpan::None => return (out, false),
        ActionSpan::Plain => {
            for (k, slot) in out.iter_mut().enumerate() {
                *slot = row.response_mask[k] == 1 && Some(k) != stop;
            }
        }
        ActionSpan::Tagged => {
            let (open, close) = tags;
            let ids = &row.response_ids;
            let mut from = 0;
            while let Some(o) = find(ids, open, from) {
                let start = o + open.len();
                let end = find(ids, close, start).unwrap_or(l);
                for (k, slot) in out.iter_mut().enumerate().take(end).skip(start) {
                    *slot = row.response_mask[k] == 1 && Some(k) != stop;
                }
                from = (end + close.len()).min(l);
                if end == l {
                    break;
                }
            }
        }
    }
    let found = out.iter().any(|&a| a);
    (out, found)
}

/// The weights `W_l` before the gate (see the module docs), `[L]`.
pub fn base_weights(config: &UcobConfig, mask: &[u8], action: &[bool], w: f64) -> Vec<f64> {
    mask.iter()
        .zip(action)
        .map(|(&m, &a)| {
            if m != 1 {
                return 0.0;
            }
            match config.scope {
                Scope::Response if a => w * config.action_weight,
                Scope::Response => w,
                Scope::Action if a => w,
                Scope::Action => 0.0,
            }
        })
        .collect()
}

/// The gated weights `W_l · g_l` (`W_l` alone with the gate off), as `f32`, with the gates
/// of the active tokens. `teacher` and `student` are the sampled-token log-probs, `[L]`.
pub fn gated_weights(
    config: &UcobConfig,
    base: &[f64],
    teacher: &[f32],
    student: &[f32],
) -> (Vec<f32>, Vec<f64>) {
    let mut gates = Vec::new();
    let weights = base
        .iter()
        .enumerate()
        .map(|(l, &b)| {
            if b == 0.0 {
                return 0.0;
            }
            let g = if config.gate_enable {
                gate(
                    config.gate_beta,
                    f64::from(teacher[l]),
                    f64::from(student[l]),
                )
            } else {
                1.0
            };
            gates.push(g);
            (b * g) as f32
        })
        .collect();
    (weights, gates)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(ids: &[u32], mask: &[u8], finish: FinishReason) -> TurnRow {
        TurnRow {
            response_ids: ids.to_vec(),
            response_logprobs: vec![0.0; ids.len()],
            response_mask: mask.to_vec(),
            finish_reason: finish,
            ..TurnRow::default()
        }
    }

    #[test]
    fn the_top_k_toys_gate_and_weight_on_an_action_token() {
        // Teacher logits [2, 1, 0] and student [1, 1.5, 0]; the sampled token is id 0.
        let lse = |x: [f64; 3]| x.iter().map(|v| v.exp()).sum::<f64>().ln();
        let t = [2.0, 1.0, 0.0].map(|v| v - lse([2.0, 1.0, 0.0]));
        let s = [1.0, 1.5, 0.0].map(|v| v - lse([1.0, 1.5, 0.0]));
        for (got, want) in t.iter().zip([-0.4076, -1.4076, -2.4076]) {
            assert!((got - want).abs() < 5e-5, "{got}");
        }
        for (got, want) in s.iter().zip([-1.1041, -0.6041, -2.1041]) {
            assert!((got - want).abs() < 5e-5, "{got}");
        }
        let delta = t[0] - s[0];
        assert!((delta - 0.6965).abs() < 5e-5, "{delta}");
        assert!((5.0 * delta - 3.4825).abs() < 5e-4);
        let g = gate(5.0, t[0], s[0]);
        assert!((g - 0.9702).abs() < 5e-5, "{g}");

        // One action token (a plain action `[7]` ended by a stop id), w = 1.
        let config = UcobConfig::default();
        let r = row(&[7, 2], &[1, 1], FinishReason::Stop);
        let (action, found) = action_tokens(&r, ActionSpan::Plain, &(vec![], vec![]));
        assert_eq!((action.clone(), found), (vec![true, false], true));
        let base = base_weights(&config, &r.response_mask, &action, 1.0);
        assert_eq!(base, [2.0, 1.0]);
        let (w, gates) = gated_weights(&config, &base, &[t[0] as f32; 2], &[s[0] as f32; 2]);
        assert!((f64::from(w[0]) - 1.9404).abs() < 5e-4, "{}", w[0]);
        assert_eq!(gates.len(), 2);
        // With d = 0.2394 (the kernel's top-k forward KL of the toy): 0.9702 × 0.2394 × 2.0.
        let d = (0..3).map(|v| t[v].exp() * (t[v] - s[v])).sum::<f64>();
        assert!((d - 0.2394).abs() < 5e-5, "{d}");
        assert!((f64::from(w[0]) * d - 0.4645).abs() < 5e-5);
    }

    #[test]
    fn the_gate_is_a_sigmoid_of_the_gap_and_saturates_without_overflow() {
        assert_eq!(sigmoid(0.0), 0.5);
        assert!((gate(5.0, -0.4, -1.2) - 0.9820).abs() < 5e-5);
        assert!((gate(5.0, -0.9, -0.2) - 0.0293).abs() < 5e-5);
        assert!(gate(5.0, 0.0, -1000.0) == 1.0);
        let tiny = gate(5.0, -1000.0, 0.0);
        assert!((0.0..1e-300).contains(&tiny));
        assert_eq!(gate(0.0, -3.0, -1.0), 0.5);
    }

    #[test]
    fn scopes_and_the_gate_switch_shape_the_weights() {
        let mask = [1, 0, 1, 1];
        let action = [true, true, false, true];
        let c = UcobConfig::default();
        assert_eq!(base_weights(&c, &mask, &action, 0.5), [1.0, 0.0, 0.5, 1.0]);
        let a = UcobConfig {
            scope: Scope::Action,
            ..UcobConfig::default()
        };
        assert_eq!(base_weights(&a, &mask, &action, 0.5), [0.5, 0.0, 0.0, 0.5]);
        let off = UcobConfig {
            gate_enable: false,
            ..UcobConfig::default()
        };
        let (w, g) = gated_weights(&off, &[1.0, 0.0, 0.5], &[-9.0; 3], &[0.0; 3]);
        assert_eq!((w, g), (vec![1.0, 0.0, 0.5], vec![1.0, 1.0]));
    }

    #[test]
    fn plain_spans_leave_out_the_stop_id_and_unsampled_tokens() {
        let r = row(&[5, 6, 9, 2], &[1, 0, 1, 1], FinishReason::Stop);
        let tags = (vec![], vec![]);
        assert_eq!(
            action_tokens(&r, ActionSpan::Plain, &tags).0,
            [true, false, true, false]
        );
        let cut = row(&[5, 6, 9], &[1, 1, 1], FinishReason::Length);
        assert_eq!(action_tokens(&cut, ActionSpan::Plain, &tags).0, [true; 3]);
        let only_stop = row(&[2], &[1], FinishReason::Stop);
        assert_eq!(
            action_tokens(&only_stop, ActionSpan::Plain, &tags),
            (vec![false], false)
        );
        assert_eq!(
            action_tokens(&r, ActionSpan::None, &tags),
            (vec![false; 4], false)
        );
    }

    #[test]
    fn tagged_spans_are_found_in_the_sampled_ids() {
        // `think <a> x y </a> more <a> z` with <a> = [60, 61], </a> = [62]; stop id 2 last.
        let tags = (vec![60, 61], vec![62]);
        let r = row(
            &[10, 60, 61, 20, 21, 62, 11, 60, 61, 30, 2],
            &[1; 11],
            FinishReason::Stop,
        );
        let (a, found) = action_tokens(&r, ActionSpan::Tagged, &tags);
        let at: Vec<usize> = (0..a.len()).filter(|&k| a[k]).collect();
        // The unclosed second span runs to the end, stop id excluded.
        assert_eq!((at, found), (vec![3, 4, 9], true));
        let none = row(&[10, 60, 20, 62], &[1; 4], FinishReason::Length);
        assert_eq!(
            action_tokens(&none, ActionSpan::Tagged, &tags),
            (vec![false; 4], false)
        );
    }
}
