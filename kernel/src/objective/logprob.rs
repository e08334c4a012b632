//! Log-probs at a sampling temperature: the reference computation the backend's scorer and the
//! gateway's sampler must both follow (trl #4159).
//!
//! The sampling distribution at temperature `T` is `softmax(z / T)`, so the log-prob of token
//! `y` is `log_softmax(z / T)[y]`. Two mistakes give a ratio `≠ 1` at step 0 even though nothing
//! changed: scoring the raw logits (`T = 1`) on one side, or dividing an already-normalised
//! log-prob by `T` (`log_softmax(z)[y] / T`).

use crate::error::{Error, Result};

/// `log_softmax(logits / temperature)[token]` in `f64`, stabilised by the max logit.
pub fn token_logprob(logits: &[f32], token: usize, temperature: f32) -> Result<f64> {
    if !(temperature.is_finite() && temperature > 0.0) {
        return Err(Error::Other(format!(
            "log-prob at temperature {temperature}: the temperature must be a positive number \
             (greedy decoding reports log-probs at temperature 1)"
        )));
    }
    let Some(&chosen) = logits.get(token) else {
        return Err(Error::Other(format!(
            "log-prob of token {token}: only {} logits",
            logits.len()
        )));
    };
    if let Some(bad) = logits.iter().find(|z| !z.is_finite()) {
        return Err(Error::Other(format!("log-prob: logit {bad} is not finite")));
    }
    let t = f64::from(temperature);
    let max = logits
        .iter()
        .map(|&z| f64::from(z) / t)
        .fold(f64::NEG_INFINITY, f64::max);
    let log_sum: f64 = logits
        .iter()
        .map(|&z| (f64::from(z) / t - max).exp())
        .sum::<f64>()
        .ln();
    Ok(f64::from(chosen) / t - max - log_sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temperature_is_applied_to_logits_trl_4159() {
        // Case trl-4159-temperature-logprobs: logits [2, 1, 0, −1], T = 0.6, token 0.
        let logits = [2.0, 1.0, 0.0, -1.0];
        let at_t = token_logprob(&logits, 0, 0.6).unwrap();
        assert!((at_t - -0.20806).abs() < 1e-5, "{at_t}");
        // Trainer and sampler both at T: ratio exactly 1.
        assert_eq!((at_t - token_logprob(&logits, 0, 0.6).unwrap()).exp(), 1.0);
        // The wrong variants differ: raw logits, and a normalised log-prob divided by T.
        let raw = token_logprob(&logits, 0, 1.0).unwrap();
        assert!((raw - -0.44019).abs() < 1e-5, "{raw}");
        assert!(((at_t - raw).exp() - 1.261283).abs() < 1e-5);
        let divided = raw / 0.6;
        assert!((divided - -0.733649).abs() < 1e-5, "{divided}");
        assert!((at_t - raw).abs() > 0.2 && (at_t - divided).abs() > 0.5);
    }

    #[test]
    fn bad_inputs_are_errors() {
        assert!(token_logprob(&[1.0], 0, 0.0)
            .unwrap_err()
            .to_string()
            .contains("positive"));
        assert!(token_logprob(&[1.0], 3, 1.0)
            .unwrap_err()
            .to_string()
            .contains("only 1 logits"));
        assert!(token_logprob(&[f32::NAN, 1.0], 1, 1.0).is_err());
        // Large logits do not overflow.
        let lp = token_logprob(&[1000.0, 0.0], 0, 0.5).unwrap();
        assert!(lp.abs() < 1e-12, "{lp}");
    }
}
