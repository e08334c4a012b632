//! Answer scoring as in SQuAD's evaluation script (Rajpurkar et al., 2016, `evaluate-v1.1.py`):
//! lower-case, drop ASCII punctuation, drop the articles `a`, `an`, `the`, collapse
//! whitespace; exact match compares the normalised strings, token F1 the normalised tokens
//! as multisets.

use std::collections::HashMap;

/// The normalised answer: lower case, ASCII punctuation removed (`1.0079` → `10079`,
/// `(98)` → `98`, `J.L. Soret` → `jl soret`), the words `a`, `an`, `the` removed, tokens
/// joined by single spaces.
pub fn normalise(text: &str) -> String {
    tokens(text).join(" ")
}

fn tokens(text: &str) -> Vec<String> {
    let lower: String = text
        .to_lowercase()
        .chars()
        .filter(|c| !c.is_ascii_punctuation())
        .collect();
    lower
        .split_whitespace()
        .filter(|w| !matches!(*w, "a" | "an" | "the"))
        .map(str::to_string)
        .collect()
}

/// 1 when the normalised strings are equal, else 0.
pub fn exact_match(prediction: &str, gold: &str) -> f32 {
    f32::from(u8::from(normalise(prediction) == normalise(gold)))
}

/// Token F1 of the normalised token multisets: `2·P·R / (P + R)` with `P = common /
/// |prediction|`, `R = common / |gold|`; 0 when nothing is in common (so also when either is
/// empty). `f1("Henry Cavendish", "Cavendish") = 2·0.5·1/1.5 = 0.6667`.
pub fn f1(prediction: &str, gold: &str) -> f32 {
    let p = tokens(prediction);
    let g = tokens(gold);
    let mut counts: HashMap<&str, i64> = HashMap::new();
    for t in &g {
        *counts.entry(t.as_str()).or_default() += 1;
    }
    let mut common = 0i64;
    for t in &p {
        if let Some(c) = counts.get_mut(t.as_str()) {
            if *c > 0 {
                *c -= 1;
                common += 1;
            }
        }
    }
    if common == 0 {
        return 0.0;
    }
    let precision = common as f64 / p.len() as f64;
    let recall = common as f64 / g.len() as f64;
    (2.0 * precision * recall / (precision + recall)) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn squad_normalisation() {
        assert_eq!(normalise("  The Henry  Cavendish. "), "henry cavendish");
        assert_eq!(normalise("1.0079"), "10079");
        assert_eq!(normalise("(98)"), "98");
        assert_eq!(normalise("J.L. Soret and an Other"), "jl soret and other");
        assert_eq!(normalise("Münzenberg"), "münzenberg");
        assert_eq!(normalise("a an the"), "");
    }

    #[test]
    fn exact_match_and_f1_values() {
        assert_eq!(exact_match("henry cavendish", "Henry Cavendish"), 1.0);
        assert_eq!(exact_match("Cavendish", "Henry Cavendish"), 0.0);
        assert_eq!(exact_match("the Fe", "Fe"), 1.0);
        // 2·1·0.5/1.5, either way round.
        assert!((f1("Henry Cavendish", "Cavendish") - 0.6667).abs() < 5e-5);
        assert!((f1("Cavendish", "Henry Cavendish") - 0.6667).abs() < 5e-5);
        assert_eq!(f1("Henry Cavendish", "henry cavendish."), 1.0);
        // "Reich and Richter" vs "Richter": P = 1, R = 1/3, F1 = 2·(1/3)/(4/3) = 0.5.
        assert!((f1("Richter", "Reich and Richter") - 0.5).abs() < 1e-6);
        // Multisets: "davy davy" vs "humphry davy": common 1, P = 1/2, R = 1/2.
        assert!((f1("davy davy", "humphry davy") - 0.5).abs() < 1e-6);
        assert_eq!(f1("1776", "1766"), 0.0);
        assert_eq!(f1("", "Fe"), 0.0);
        assert_eq!(f1("the", "the"), 0.0);
    }
}
