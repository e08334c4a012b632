//! [`ObjectiveConfig`]: clip range, KL estimator and placement, entropy bonus, aggregation,
//! off-policy correction.
//!
//! Defaults are the verl-agent ones (docs/algorithms/grpo.md) except `kl_coef`, which defaults to 0
//! here (verl-agent trains with `use_kl_loss = true`, `kl_loss_coef = 0.01`, `low_var_kl`; set
//! `kl_coef = 0.01` to match it). Every key is checked by [`ObjectiveConfig::validate`], whose
//! errors name the key and say what to do.
//!
//! Also the JSON reader the objective's inputs share (`from_json_at`: errors name the input and
//! the place of the bad value).

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{Error, Result};

/// KL estimator between the current policy and the reference, per sampled token, with
/// `ℓ = log π_θ`, `ℓ_ref = log π_ref` and `δ = ℓ_ref − ℓ` (Schulman's k1/k2/k3; verl names in
/// parentheses, accepted as aliases).
///
/// Gradients w.r.t. `ℓ` (OpenRLHF #1309, verl #2953): k1 → 1 (zero in expectation, so k1 in
/// the loss does not pull towards the reference at all); k2 → `ℓ − ℓ_ref`, the unbiased
/// per-sample gradient weight of the reverse KL `KL(π_θ ‖ π_ref)`; k3 → `1 − e^δ`, a biased
/// one (it follows another divergence) but bounded below.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KlEstimator {
    /// `k1 = ℓ − ℓ_ref` (`kl`). Can be negative.
    K1,
    /// `k2 = ½ (ℓ − ℓ_ref)²` (`mse`).
    K2,
    /// `k3 = e^δ − δ − 1 ≥ 0` (`low_var_kl`), clamped to [−10, 10] like verl; the gradient is 0
    /// where the clamp is active.
    K3,
}

/// Where the KL to the reference acts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KlMode {
    /// `+ kl_coef · agg(k)` in the loss (verl `use_kl_loss`, the GRPO default).
    Loss,
    /// Subtracted from the rewards before advantages are computed (verl `use_kl_in_reward`,
    /// classic PPO-RLHF); see [`crate::objective::apply_kl_to_rewards`]. No KL term in the loss.
    Reward,
}

/// How per-token values `X[row][l]` with mask `m` are reduced to a scalar (verl `agg_loss`;
/// docs/algorithms/objective.md#aggregation).
///
/// Every mode is a fixed weighted sum `Σ_r w_r Σ_l m X`, with `w_r` computed once over the
/// whole optimizer step, so the loss does not depend on how the step is split into
/// micro-batches. "Rows" below are the step's *active* rows: rows with at least one mask-1
/// token (a row without trainable tokens contributes nothing and is not counted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Aggregation {
    /// `Σ X m / Σ m` over the whole step (verl default).
    TokenMean,
    /// `mean_rows(Σ_l X m)`.
    SeqMeanTokenSum,
    /// `mean_rows(Σ_l X m / Σ_l m)`.
    SeqMeanTokenMean,
    /// `Σ_rows Σ_l X m / norm_constant` (Dr.GRPO): a constant normaliser, e.g. `G · L_max`, so
    /// the scale does not move with padding or batch composition.
    SeqMeanTokenSumNorm,
    /// Agent Lightning's `per_rollout_mean` (docs/algorithms/objective.md): each token of rollout `k` has
    /// weight `1 / (T_k · N_rows)`, `T_k` = masked tokens of all rows of the rollout, `N_rows` =
    /// rows in the step. Every rollout gets the same total weight `1 / N_rows` however many
    /// rows or tokens it produced (the total is `N_rollouts / N_rows`, 1 when every rollout is
    /// one row).
    PerRollout,
}

/// How the PPO term corrects for rows sampled by an older policy than the one `ℓ_old` was
/// computed with (asynchronous rollouts, `rollout.max_staleness > 0`), or by an inference path
/// whose numerics differ from the trainer's. With `ℓ_behav` the row's sampled
/// `response_logprobs` and `ℓ_old` the kernel's recomputation, per token
/// `r = exp(ℓ_old − ℓ_behav)` and cap `C = is_cap`:
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OffPolicy {
    /// No correction: the surrogate's ratio is `π_θ / π_old` alone.
    None,
    /// Truncated importance sampling (Yao et al. 2025, "Your Efficient RL Framework Secretly
    /// Brings You Off-Policy RL Training"): the token's surrogate is multiplied by
    /// `min(r, C)`.
    Tis,
    /// AReaL's decoupled PPO (Fu et al. 2025, arXiv 2505.24298): the clip is around the
    /// proximal policy `ℓ_old`, and the token's surrogate is multiplied by the behaviour
    /// weight `r`, or dropped (weight 0) where `r > C`.
    Decoupled,
}

impl OffPolicy {
    /// The config name.
    pub fn as_str(self) -> &'static str {
        match self {
            OffPolicy::None => "none",
            OffPolicy::Tis => "tis",
            OffPolicy::Decoupled => "decoupled",
        }
    }
}

impl Aggregation {
    /// The config name of the mode.
    pub fn as_str(self) -> &'static str {
        match self {
            Aggregation::TokenMean => "token-mean",
            Aggregation::SeqMeanTokenSum => "seq-mean-token-sum",
            Aggregation::SeqMeanTokenMean => "seq-mean-token-mean",
            Aggregation::SeqMeanTokenSumNorm => "seq-mean-token-sum-norm",
            Aggregation::PerRollout => "per-rollout",
        }
    }
}

/// The RL objective's settings (one `[objective]` table of the pipeline config).
///
/// Per token, with `ρ = exp(clamp(ℓ − ℓ_old, ±log_ratio_clamp))` and advantage `A`:
/// `ℓ^pg = max(−Aρ, −A·clip(ρ, 1 − clip_low, 1 + clip_high))`, and for `A < 0`
/// `ℓ^pg = min(ℓ^pg, −A·dual_clip)`. The loss is
/// `agg(ℓ^pg) + kl_coef·agg(k) − entropy_coef·agg(H) + Σ_aux coef·agg(c·ℓ)`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ObjectiveConfig {
    /// ε_lo: the ratio is clipped below at `1 − clip_low`. Default 0.2. In [0, 1).
    pub clip_low: f64,
    /// ε_hi: the ratio is clipped above at `1 + clip_high`. Default 0.2; DAPO's "clip-higher"
    /// is `clip_high = 0.28` with `clip_low = 0.2`. ≥ 0.
    pub clip_high: f64,
    /// Dual-clip constant `c` (> 1): for `A < 0` the token loss is capped at `−A·c`. Default 3.0;
    /// `null` or `false` disables it.
    #[serde(deserialize_with = "dual_clip")]
    pub dual_clip: Option<f64>,
    /// KL estimator. Default k3 (`low_var_kl`).
    pub kl_estimator: KlEstimator,
    /// β_KL ≥ 0. Default 0 (no reference forward needed); verl-agent uses 0.01 with k3.
    pub kl_coef: f64,
    /// Where the KL acts. Default `loss`.
    pub kl_mode: KlMode,
    /// c_H ≥ 0: the loss gets `−c_H · agg(H)`. Default 0.
    pub entropy_coef: f64,
    /// Loss aggregation. Default `token-mean`.
    pub aggregation: Aggregation,
    /// The constant divisor of `seq-mean-token-sum-norm` (> 0); required by that mode and
    /// rejected by the others. Dr.GRPO uses `G · L_max` (group size × max response tokens).
    pub norm_constant: Option<f64>,
    /// `ℓ − ℓ_old` is clamped to `[−log_ratio_clamp, log_ratio_clamp]` before `exp` (Agent
    /// Lightning / verl: 20), so one stale token cannot overflow the ratio. > 0.
    pub log_ratio_clamp: f64,
    /// Off-policy correction of the PPO term for stale rows ([`OffPolicy`]). Default `none`.
    pub off_policy: OffPolicy,
    /// The cap `C ≥ 1` of the behaviour importance weight `exp(ℓ_old − ℓ_behav)` (`tis`:
    /// truncated at C; `decoupled`: tokens above C dropped). Default 2.0.
    pub is_cap: f64,
}

impl Default for ObjectiveConfig {
    fn default() -> Self {
        ObjectiveConfig {
            clip_low: 0.2,
            clip_high: 0.2,
            dual_clip: Some(3.0),
            kl_estimator: KlEstimator::K3,
            kl_coef: 0.0,
            kl_mode: KlMode::Loss,
            entropy_coef: 0.0,
            aggregation: Aggregation::TokenMean,
            norm_constant: None,
            log_ratio_clamp: 20.0,
            off_policy: OffPolicy::None,
            is_cap: 2.0,
        }
    }
}

/// The error for a bad objective setting. `file` is a placeholder the caller replaces with the
/// real config path.
pub(crate) fn config_error(message: String) -> Error {
    Error::Config {
        file: "objective config".into(),
        message,
    }
}

impl ObjectiveConfig {
    /// Parses a JSON object and validates it.
    pub fn from_json(text: &str) -> Result<Self> {
        // Errors name the key (`kl_coef: invalid type: ...`), as `--set KEY=VALUE` wrote it.
        let config: ObjectiveConfig = from_json_at(text, "objective config")?;
        config.validate()?;
        Ok(config)
    }

    /// Checks every key; the error names the key, its value and the accepted range.
    pub fn validate(&self) -> Result<()> {
        let check = |ok: bool, message: String| {
            if ok {
                Ok(())
            } else {
                Err(config_error(message))
            }
        };
        check(
            self.clip_low.is_finite() && (0.0..1.0).contains(&self.clip_low),
            format!("clip_low = {}: must be in [0, 1) (the ratio is clipped below at 1 − clip_low; PPO uses 0.2)", self.clip_low),
        )?;
        check(
            self.clip_high.is_finite() && self.clip_high >= 0.0,
            format!("clip_high = {}: must be ≥ 0 (the ratio is clipped above at 1 + clip_high; PPO uses 0.2, DAPO 0.28)", self.clip_high),
        )?;
        if let Some(c) = self.dual_clip {
            check(
                c.is_finite() && c > 1.0,
                format!("dual_clip = {c}: must be > 1 (verl uses 3.0); set it to null or false to disable dual clipping"),
            )?;
        }
        check(
            self.kl_coef.is_finite() && self.kl_coef >= 0.0,
            format!(
                "kl_coef = {}: must be ≥ 0 (verl-agent uses 0.01; 0 disables the KL term)",
                self.kl_coef
            ),
        )?;
        check(
            self.entropy_coef.is_finite() && self.entropy_coef >= 0.0,
            format!("entropy_coef = {}: must be ≥ 0 (the loss gets −entropy_coef·agg(H); 0 disables it)", self.entropy_coef),
        )?;
        check(
            self.log_ratio_clamp.is_finite() && self.log_ratio_clamp > 0.0,
            format!(
                "log_ratio_clamp = {}: must be a positive number (20 is usual)",
                self.log_ratio_clamp
            ),
        )?;
        check(
            self.is_cap.is_finite() && self.is_cap >= 1.0,
            format!(
                "is_cap = {}: must be a number ≥ 1 (the cap of the behaviour importance weight \
                 exp(ℓ_old − ℓ_behav); 2.0 is the default)",
                self.is_cap
            ),
        )?;
        match (self.aggregation, self.norm_constant) {
            (Aggregation::SeqMeanTokenSumNorm, None) => Err(config_error(
                "aggregation = \"seq-mean-token-sum-norm\" needs norm_constant: set it to a positive \
                 constant such as group size × max response tokens (Dr.GRPO)"
                    .into(),
            )),
            (Aggregation::SeqMeanTokenSumNorm, Some(c)) => check(
                c.is_finite() && c > 0.0,
                format!("norm_constant = {c}: must be a positive number (e.g. group size × max response tokens)"),
            ),
            (mode, Some(_)) => Err(config_error(format!(
                "norm_constant is only used by aggregation = \"seq-mean-token-sum-norm\", but \
                 aggregation is \"{}\"; remove norm_constant or change the aggregation",
                mode.as_str()
            ))),
            (_, None) => Ok(()),
        }
    }

    /// Whether reference log-probs are needed this step (for the loss or for the reward
    /// penalty).
    pub fn uses_reference(&self) -> bool {
        self.kl_coef > 0.0
    }

    /// Whether the loss uses per-token entropies.
    pub fn needs_entropy(&self) -> bool {
        self.entropy_coef != 0.0
    }
}

/// Reads a string and maps it through `choices`; the error names the key and lists the choices.
fn choice<'de, D: Deserializer<'de>, T: Copy>(
    d: D,
    key: &str,
    choices: &[(&str, T)],
) -> Result<T, D::Error> {
    let s = String::deserialize(d)?;
    choices
        .iter()
        .find(|(name, _)| *name == s)
        .map(|&(_, v)| v)
        .ok_or_else(|| {
            let names: Vec<String> = choices.iter().map(|(n, _)| format!("\"{n}\"")).collect();
            D::Error::custom(format!(
                "{key}: unknown value \"{s}\"; expected one of {}",
                names.join(", ")
            ))
        })
}

impl<'de> Deserialize<'de> for Aggregation {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use Aggregation::*;
        let modes = [
            TokenMean,
            SeqMeanTokenSum,
            SeqMeanTokenMean,
            SeqMeanTokenSumNorm,
            PerRollout,
        ];
        let choices: Vec<(&str, Aggregation)> = modes.iter().map(|&m| (m.as_str(), m)).collect();
        choice(d, "aggregation", &choices)
    }
}

impl Serialize for Aggregation {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for KlEstimator {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use KlEstimator::*;
        let choices = [
            ("k1", K1),
            ("kl", K1),
            ("k2", K2),
            ("mse", K2),
            ("k3", K3),
            ("low_var_kl", K3),
        ];
        choice(d, "kl_estimator", &choices)
    }
}

impl Serialize for KlEstimator {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(match self {
            KlEstimator::K1 => "k1",
            KlEstimator::K2 => "k2",
            KlEstimator::K3 => "k3",
        })
    }
}

impl<'de> Deserialize<'de> for OffPolicy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use OffPolicy::*;
        let choices: Vec<(&str, OffPolicy)> = [None, Tis, Decoupled]
            .iter()
            .map(|&m| (m.as_str(), m))
            .collect();
        choice(d, "off_policy", &choices)
    }
}

impl Serialize for OffPolicy {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for KlMode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        choice(
            d,
            "kl_mode",
            &[("loss", KlMode::Loss), ("reward", KlMode::Reward)],
        )
    }
}

impl Serialize for KlMode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(match self {
            KlMode::Loss => "loss",
            KlMode::Reward => "reward",
        })
    }
}

/// `dual_clip`: a number, or `null` / `false` for "off" (TOML has no null).
fn dual_clip<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Number(f64),
        Flag(bool),
        Null(()),
    }
    match Raw::deserialize(d)? {
        Raw::Number(c) => Ok(Some(c)),
        Raw::Flag(false) | Raw::Null(()) => Ok(None),
        Raw::Flag(true) => Err(D::Error::custom(
            "dual_clip: `true` is not a constant; give the cap as a number > 1 (e.g. 3.0), or false to disable",
        )),
    }
}

/// `serde_json` with the path of the failing value in the message (serde_json alone gives
/// only a line and column for a value of the wrong type); `source` names the input.
pub(crate) fn from_json_at<T: serde::de::DeserializeOwned>(text: &str, source: &str) -> Result<T> {
    let error = |message: String| Error::Config {
        file: source.into(),
        message,
    };
    let de = &mut serde_json::Deserializer::from_str(text);
    let value: T = serde_path_to_error::deserialize(&mut *de).map_err(|e| {
        let path = e.path().to_string();
        error(if path == "." {
            e.inner().to_string()
        } else {
            format!("{path}: {}", e.inner())
        })
    })?;
    // Trailing characters after the document are an error too, as in serde_json::from_str.
    de.end().map_err(|e| error(e.to_string()))?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses `json` and validates; `Ok(config)` or the error message.
    fn parse(json: &str) -> std::result::Result<ObjectiveConfig, String> {
        ObjectiveConfig::from_json(json).map_err(|e| e.to_string())
    }

    fn check_err(json: &str, needles: &[&str]) {
        let message = parse(json).expect_err(json);
        for n in needles {
            assert!(
                message.contains(n),
                "{json}: `{message}` should mention `{n}`"
            );
        }
    }

    #[test]
    fn a_value_of_the_wrong_type_names_its_key() {
        // Found by the fuzzer (kernel/tests/it/fuzz/batch.rs): serde_json alone said only
        // "invalid type: sequence, expected f64 at line 1 column 14".
        check_err(r#"{"kl_coef": [1]}"#, &["kl_coef: invalid type: sequence"]);
        check_err(
            r#"{"aggregation": {}}"#,
            &["aggregation: invalid type: map"],
        );
        check_err(
            r#"{"clip_high": 1e400}"#,
            &["clip_high: number out of range"],
        );
    }

    #[test]
    fn defaults_are_verl_agent_except_kl_coef() {
        let c = parse("{}").unwrap();
        assert_eq!(c, ObjectiveConfig::default());
        assert_eq!(
            (c.clip_low, c.clip_high, c.dual_clip),
            (0.2, 0.2, Some(3.0))
        );
        assert_eq!(
            (c.kl_estimator, c.kl_mode, c.kl_coef),
            (KlEstimator::K3, KlMode::Loss, 0.0)
        );
        assert_eq!(
            (c.aggregation, c.entropy_coef, c.log_ratio_clamp),
            (Aggregation::TokenMean, 0.0, 20.0)
        );
        assert_eq!((c.off_policy, c.is_cap), (OffPolicy::None, 2.0));
        assert!(!c.uses_reference() && !c.needs_entropy());
    }

    #[test]
    fn names_and_aliases_parse() {
        let c = parse(r#"{"kl_estimator": "low_var_kl", "kl_mode": "reward", "kl_coef": 0.01, "aggregation": "per-rollout", "dual_clip": null}"#).unwrap();
        assert_eq!(
            (c.kl_estimator, c.kl_mode, c.aggregation, c.dual_clip),
            (
                KlEstimator::K3,
                KlMode::Reward,
                Aggregation::PerRollout,
                None
            )
        );
        assert!(c.uses_reference());
        assert_eq!(parse(r#"{"dual_clip": false}"#).unwrap().dual_clip, None);
        assert_eq!(
            parse(r#"{"kl_estimator": "mse"}"#).unwrap().kl_estimator,
            KlEstimator::K2
        );
        let c = parse(r#"{"aggregation": "seq-mean-token-sum-norm", "norm_constant": 8}"#).unwrap();
        assert_eq!(
            (c.aggregation, c.norm_constant),
            (Aggregation::SeqMeanTokenSumNorm, Some(8.0))
        );
        // Round trip through the serialised names.
        let back: ObjectiveConfig =
            serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
        // TOML, as the pipeline config writes it.
        let t: ObjectiveConfig = toml::from_str(
            "clip_high = 0.28\ndual_clip = false\naggregation = \"seq-mean-token-mean\"",
        )
        .unwrap();
        assert_eq!(
            (t.clip_high, t.dual_clip, t.aggregation),
            (0.28, None, Aggregation::SeqMeanTokenMean)
        );
        for (name, mode) in [
            ("none", OffPolicy::None),
            ("tis", OffPolicy::Tis),
            ("decoupled", OffPolicy::Decoupled),
        ] {
            let c = parse(&format!(r#"{{"off_policy": "{name}", "is_cap": 3}}"#)).unwrap();
            assert_eq!((c.off_policy, c.is_cap), (mode, 3.0));
            let back: ObjectiveConfig =
                serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
            assert_eq!(back, c);
        }
        // In TOML the error carries the line and column of the bad value.
        let e = toml::from_str::<ObjectiveConfig>("clip_high = 0.28\noff_policy = \"async\"")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 2") && e.contains("off_policy: unknown value \"async\""),
            "{e}"
        );
    }

    #[test]
    fn bad_values_name_the_key() {
        check_err(r#"{"clip_low": -0.1}"#, &["clip_low = -0.1", "[0, 1)"]);
        check_err(r#"{"clip_high": -1}"#, &["clip_high = -1", "≥ 0"]);
        check_err(
            r#"{"dual_clip": 1.0}"#,
            &["dual_clip = 1", "> 1", "disable"],
        );
        check_err(r#"{"dual_clip": true}"#, &["dual_clip", "number > 1"]);
        check_err(r#"{"kl_coef": -0.01}"#, &["kl_coef = -0.01"]);
        check_err(r#"{"entropy_coef": -1e-3}"#, &["entropy_coef"]);
        check_err(r#"{"log_ratio_clamp": 0}"#, &["log_ratio_clamp = 0"]);
        check_err(
            r#"{"aggregation": "token-sum"}"#,
            &[
                "aggregation: unknown value \"token-sum\"",
                "\"seq-mean-token-sum-norm\"",
            ],
        );
        check_err(
            r#"{"kl_estimator": "k4"}"#,
            &["kl_estimator: unknown value \"k4\"", "\"low_var_kl\""],
        );
        check_err(
            r#"{"kl_mode": "both"}"#,
            &["kl_mode: unknown value \"both\""],
        );
        check_err(
            r#"{"aggregation": "seq-mean-token-sum-norm"}"#,
            &["needs norm_constant"],
        );
        check_err(
            r#"{"aggregation": "seq-mean-token-sum-norm", "norm_constant": 0}"#,
            &["norm_constant = 0", "positive"],
        );
        check_err(
            r#"{"norm_constant": 4}"#,
            &["only used by", "\"token-mean\""],
        );
        check_err(r#"{"clip_ratio": 0.2}"#, &["unknown field `clip_ratio`"]);
        check_err(
            r#"{"off_policy": "is"}"#,
            &[
                "off_policy: unknown value \"is\"",
                "\"none\", \"tis\", \"decoupled\"",
            ],
        );
        check_err(r#"{"is_cap": 0.5}"#, &["is_cap = 0.5", "≥ 1"]);
        check_err(r#"{"is_cap_max": 2}"#, &["unknown field `is_cap_max`"]);
        check_err(r#"{"clip_low": -0.1}"#, &["objective config"]);
    }
}
