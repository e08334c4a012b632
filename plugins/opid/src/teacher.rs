//! OPID's token-level teacher advantages and their fusion (arXiv 2606.26790; github
//! jinyangwu/OPID, `gigpo/core_gigpo.py`, `compute_teacher_token_advantage` and
//! `compute_seed_advantage_components`; `opid/prompting.py`, `select_skill_teacher_sources`).
//!
//! Per routed row, with `m_l` the response mask and `q` the row's routing masks:
//! - `D^ep_l = (ℓ^ep_l − ℓ_ref,l) · m_l · q^ep`, `D^st_l = (ℓ^st_l − ℓ_ref,l) · m_l · q^st`,
//!   where `ℓ^ep`, `ℓ^st` are the rollout-time weights' log-probs of the sampled response under
//!   the episode-skill and step-skill contexts and `ℓ_ref` is `ℓ_old` (or the re-scored plain
//!   context, [`crate::config::Reference`]);
//! - optional normalisation of each `D` over its active tokens in the batch, then clipping;
//! - the stacked term `add_l = w_ep · D^ep_l + w_st · D^st_l` (`Signals::advantage_add`), so the
//!   stack's advantage is the paper's `A^OPID_l = A^ep + w_step · A^S + w_ep · D^ep_l +
//!   w_st · D^st_l` with the estimator's `A^ep + w_step · A^S`.

use crate::config::{Normalise, Routing};

/// Which skill contexts a row is scored under (`q^ep`, `q^st`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Route {
    pub episode: bool,
    pub step: bool,
}

impl Route {
    pub fn any(self) -> bool {
        self.episode || self.step
    }
}

/// The routing rule: a step skill is used when it is non-empty and `w_st > 0`; the episode
/// skill when it exists, `w_ep > 0`, and (critical-first) no step skill is used or (additive)
/// always. Neither skill: no teacher.
pub fn route(
    episode_skill: Option<&str>,
    step_skill: Option<&str>,
    w_ep: f32,
    w_st: f32,
    routing: Routing,
) -> Route {
    let step = step_skill.is_some_and(|s| !s.trim().is_empty()) && w_st > 0.0;
    let episode = episode_skill.is_some_and(|s| !s.trim().is_empty())
        && w_ep > 0.0
        && (routing == Routing::Additive || !step);
    Route { episode, step }
}

/// `D_l = (teacher_l − reference_l) · m_l`, `[L]`: the detached log-prob gain of each sampled
/// token under the skill context; exactly 0 on mask-0 tokens (whatever they hold).
pub fn gain(teacher: &[f32], reference: &[f32], mask: &[u8]) -> Vec<f64> {
    teacher
        .iter()
        .zip(reference)
        .zip(mask)
        .map(|((&t, &r), &m)| {
            if m == 1 {
                f64::from(t) - f64::from(r)
            } else {
                0.0
            }
        })
        .collect()
}

/// Normalises the active values of one teacher advantage across the batch, in place:
/// `values[row][l]` is active where `active[row]` and `mask[row][l] == 1`. Population
/// statistics over the active values; `MeanStdNorm` divides by `std + eps` only when
/// `std > eps`. Inactive values are left as they are (0).
pub fn normalise(
    values: &mut [Vec<f64>],
    active: &[bool],
    masks: &[&[u8]],
    mode: Normalise,
    eps: f64,
) {
    if mode == Normalise::None {
        return;
    }
    let picked: Vec<f64> = values
        .iter()
        .zip(active)
        .zip(masks)
        .filter(|((_, &a), _)| a)
        .flat_map(|((v, _), m)| {
            v.iter()
                .zip(m.iter())
                .filter(|(_, &m)| m == 1)
                .map(|(&x, _)| x)
        })
        .collect();
    if picked.is_empty() {
        return;
    }
    let n = picked.len() as f64;
    let mean = picked.iter().sum::<f64>() / n;
    let std = (picked.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n).sqrt();
    let divide = mode == Normalise::MeanStdNorm && std > eps;
    for ((v, &a), m) in values.iter_mut().zip(active).zip(masks) {
        if !a {
            continue;
        }
        for (x, &mk) in v.iter_mut().zip(m.iter()) {
            if mk == 1 {
                *x -= mean;
                if divide {
                    *x /= std + eps;
                }
            }
        }
    }
}

/// Clamps every value to `[−c, c]` (OPID's `clip_teacher_adv`).
pub fn clip(values: &mut [Vec<f64>], c: Option<f32>) {
    if let Some(c) = c {
        let c = f64::from(c);
        for x in values.iter_mut().flatten() {
            *x = x.clamp(-c, c);
        }
    }
}

/// The stacked term of one row, `[L]`: `w_ep · D^ep_l + w_st · D^st_l` (a missing `D` is 0).
pub fn fuse(
    d_ep: Option<&[f64]>,
    d_st: Option<&[f64]>,
    w_ep: f32,
    w_st: f32,
    len: usize,
) -> Vec<f32> {
    (0..len)
        .map(|l| {
            let ep = d_ep.map_or(0.0, |d| d[l]);
            let st = d_st.map_or(0.0, |d| d[l]);
            (f64::from(w_ep) * ep + f64::from(w_st) * st) as f32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: [f32; 3] = [-0.7, -1.5, -0.2];
    const EP: [f32; 3] = [-0.5, -1.6, -0.2];
    const ST: [f32; 3] = [-0.3, -0.9, -0.1];

    fn close(got: &[f64], want: &[f64], tol: f64) {
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < tol, "{got:?} vs {want:?}");
        }
    }

    /// The worked example: `A^ep = 0.5`, w_ep = w_st = 0.001, the three routings.
    fn advantage(route: Route) -> Vec<f64> {
        let mask = [1u8, 1, 1];
        let d_ep = route.episode.then(|| gain(&EP, &OLD, &mask));
        let d_st = route.step.then(|| gain(&ST, &OLD, &mask));
        fuse(d_ep.as_deref(), d_st.as_deref(), 0.001, 0.001, 3)
            .iter()
            .map(|&a| 0.5 + f64::from(a))
            .collect()
    }

    #[test]
    fn the_worked_example_gives_the_teacher_advantages_and_fused_values() {
        let mask = [1u8, 1, 1];
        close(&gain(&EP, &OLD, &mask), &[0.2, -0.1, 0.0], 1e-6);
        close(&gain(&ST, &OLD, &mask), &[0.4, 0.6, 0.1], 1e-6);
        let both = (Some("episode"), Some("step"));
        let critical = route(both.0, both.1, 0.001, 0.001, Routing::StepPriority);
        assert_eq!(
            critical,
            Route {
                episode: false,
                step: true
            }
        );
        close(&advantage(critical), &[0.5004, 0.5006, 0.5001], 5e-8);
        let plain = route(Some("episode"), None, 0.001, 0.001, Routing::StepPriority);
        assert_eq!(
            plain,
            Route {
                episode: true,
                step: false
            }
        );
        close(&advantage(plain), &[0.5002, 0.4999, 0.5], 5e-8);
        let additive = route(both.0, both.1, 0.001, 0.001, Routing::Additive);
        assert_eq!(
            additive,
            Route {
                episode: true,
                step: true
            }
        );
        close(&advantage(additive), &[0.5006, 0.5005, 0.5001], 5e-8);
    }

    #[test]
    fn routing_is_step_skill_first_then_episode_then_none() {
        let r = |ep, st, w_st| route(ep, st, 0.001, w_st, Routing::StepPriority);
        assert_eq!(
            r(Some("e"), Some("s"), 0.001),
            Route {
                episode: false,
                step: true
            }
        );
        // A blank step skill is no step skill: the episode skill is the fallback.
        assert_eq!(
            r(Some("e"), Some("  "), 0.001),
            Route {
                episode: true,
                step: false
            }
        );
        // No step weight: the step skill is not used, the episode skill is.
        assert_eq!(
            r(Some("e"), Some("s"), 0.0),
            Route {
                episode: true,
                step: false
            }
        );
        assert_eq!(
            r(None, Some("s"), 0.001),
            Route {
                episode: false,
                step: true
            }
        );
        assert_eq!(r(None, None, 0.001), Route::default());
        assert!(!r(None, Some("s"), 0.0).any());
        // No episode weight: the episode skill is never used.
        assert_eq!(
            route(Some("e"), None, 0.0, 0.001, Routing::Additive),
            Route::default()
        );
    }

    #[test]
    fn masked_tokens_carry_no_teacher_advantage() {
        let got = gain(&[f32::NAN, -1.0, -0.5], &[0.0, -2.0, f32::NAN], &[0, 1, 0]);
        assert_eq!(got, [0.0, 1.0, 0.0]);
    }

    #[test]
    fn normalisation_runs_over_active_tokens_of_the_batch_and_clip_bounds() {
        // Two active rows (values 0.2, −0.1, 0 | 0.4 with its last token masked) and one
        // inactive row that stays 0.
        let mut d = vec![vec![0.2, -0.1, 0.0], vec![0.4, 0.0], vec![0.0, 0.0]];
        let masks: [&[u8]; 3] = [&[1, 1, 1], &[1, 0], &[1, 1]];
        normalise(
            &mut d,
            &[true, true, false],
            &masks,
            Normalise::MeanNorm,
            1e-6,
        );
        // mean of [0.2, −0.1, 0, 0.4] = 0.125.
        close(&d[0], &[0.075, -0.225, -0.125], 1e-12);
        close(&d[1], &[0.275, 0.0], 1e-12);
        assert_eq!(d[2], [0.0, 0.0]);

        let mut d = vec![vec![0.2, -0.1, 0.0], vec![0.4, 0.0]];
        normalise(
            &mut d,
            &[true, true],
            &masks[..2],
            Normalise::MeanStdNorm,
            1e-6,
        );
        // Population std of [0.2, −0.1, 0, 0.4] = sqrt(0.036875) = 0.19202864.
        let s = 0.036875f64.sqrt() + 1e-6;
        close(&d[0], &[0.075 / s, -0.225 / s, -0.125 / s], 1e-12);
        close(&d[1], &[0.275 / s, 0.0], 1e-12);
        assert!((d[0][0] - 0.390566).abs() < 5e-6, "{}", d[0][0]);

        // A constant set: the std is 0, only the mean is removed.
        let mut d = vec![vec![0.3, 0.3]];
        normalise(&mut d, &[true], &[&[1, 1]], Normalise::MeanStdNorm, 1e-6);
        assert_eq!(d[0], [0.0, 0.0]);

        let mut d = vec![vec![0.3, -2.0, 0.05]];
        clip(&mut d, Some(0.125));
        assert_eq!(d[0], [0.125, -0.125, 0.05]);
        clip(&mut d, None);
        assert_eq!(d[0], [0.125, -0.125, 0.05]);
    }
}
