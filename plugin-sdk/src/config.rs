//! Plugin config parsing with errors that name the key: every plugin's `create` function
//! starts here ([`parse_config`]), and its `validate` checks numbers with [`check_range`].

use crate::error::{PluginError, Result};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// Parses a plugin's JSON config object (an empty string or `null` means `{}`; every field has
/// a default). On error the message starts with the offending top-level key in backticks,
/// which the kernel turns into `algorithm.config.<key>`: serde's own messages do not name the
/// key of a value of the wrong type, so the key is found by deserialising each entry alone.
pub fn parse_config<T: DeserializeOwned>(json: &str) -> Result<T> {
    let text = json.trim();
    let value: Value = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(text)
            .map_err(|e| PluginError::config(format!("config is not valid JSON: {e}")))?
    };
    let map = match value {
        Value::Null => Map::new(),
        Value::Object(map) => map,
        other => {
            return Err(PluginError::config(format!(
                "config must be a JSON object, got {other}"
            )))
        }
    };
    serde_json::from_value::<T>(Value::Object(map.clone())).map_err(|e| {
        let message = e.to_string();
        if message.starts_with("unknown field") {
            return PluginError::config(message);
        }
        for (key, v) in &map {
            let alone = Map::from_iter([(key.clone(), v.clone())]);
            if let Err(e) = serde_json::from_value::<T>(Value::Object(alone)) {
                return PluginError::config(format!("`{key}`: {e}"));
            }
        }
        PluginError::config(message)
    })
}

/// The values a number in a plugin config may take, for [`check_range`]. Every form also
/// requires a finite number.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Range {
    /// `[lo, hi]`.
    Closed(f64, f64),
    /// `(lo, hi]`.
    OpenClosed(f64, f64),
    /// `[lo, hi)`.
    ClosedOpen(f64, f64),
    /// `(lo, hi)`.
    Open(f64, f64),
    /// `≥ lo`.
    AtLeast(f64),
    /// `> lo`.
    Above(f64),
}

impl Range {
    /// Whether `value` is finite and inside.
    pub fn contains(self, value: f64) -> bool {
        value.is_finite()
            && match self {
                Range::Closed(lo, hi) => lo <= value && value <= hi,
                Range::OpenClosed(lo, hi) => lo < value && value <= hi,
                Range::ClosedOpen(lo, hi) => lo <= value && value < hi,
                Range::Open(lo, hi) => lo < value && value < hi,
                Range::AtLeast(lo) => lo <= value,
                Range::Above(lo) => lo < value,
            }
    }
}

impl std::fmt::Display for Range {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Range::Closed(lo, hi) => write!(f, "in [{lo}, {hi}]"),
            Range::OpenClosed(lo, hi) => write!(f, "in ({lo}, {hi}]"),
            Range::ClosedOpen(lo, hi) => write!(f, "in [{lo}, {hi})"),
            Range::Open(lo, hi) => write!(f, "in ({lo}, {hi})"),
            Range::AtLeast(lo) => write!(f, "a finite number ≥ {lo}"),
            Range::Above(lo) => write!(f, "a finite number > {lo}"),
        }
    }
}

/// Checks config key `key`'s number against `range`. The error names the key and the value,
/// says what the number is (`what`, may be empty) and the range, then `hint` in parentheses
/// (the paper's or the default value; may be empty):
/// `` `gamma` = 2: the discount must be in [0, 1] (verl-agent uses 0.95) ``.
/// `value` is any number that widens to `f64` (`f32` keys print as written, not widened).
pub fn check_range<V: Into<f64> + Copy + std::fmt::Display>(
    key: &str,
    value: V,
    range: Range,
    what: &str,
    hint: &str,
) -> Result<()> {
    if range.contains(value.into()) {
        return Ok(());
    }
    let what = if what.is_empty() {
        String::new()
    } else {
        format!("{what} ")
    };
    let hint = if hint.is_empty() {
        String::new()
    } else {
        format!(" ({hint})")
    };
    Err(PluginError::config(format!(
        "`{key}` = {value}: {what}must be {range}{hint}"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default, PartialEq, serde::Deserialize)]
    #[serde(deny_unknown_fields, default)]
    struct Config {
        omega: f64,
        name: String,
    }

    #[test]
    fn empty_and_null_mean_defaults() {
        assert_eq!(parse_config::<Config>("").unwrap(), Config::default());
        assert_eq!(parse_config::<Config>("null").unwrap(), Config::default());
    }

    #[test]
    fn errors_name_the_key() {
        let e = parse_config::<Config>(r#"{"omega": "big", "name": "x"}"#).unwrap_err();
        assert!(e.message.starts_with("`omega`"), "{e}");
        let e = parse_config::<Config>(r#"{"omegaa": 1}"#).unwrap_err();
        assert!(e.message.contains("unknown field `omegaa`"), "{e}");
        let e = parse_config::<Config>("[1]").unwrap_err();
        assert!(e.message.contains("JSON object"), "{e}");
    }

    #[test]
    fn ranges_check_finite_values_and_errors_name_key_value_range_and_hint() {
        let check = |value: f64, range: Range| check_range("k", value, range, "", "").is_ok();
        assert!(check(0.0, Range::Closed(0.0, 1.0)) && check(1.0, Range::Closed(0.0, 1.0)));
        assert!(
            !check(0.0, Range::OpenClosed(0.0, 1.0)) && check(1.0, Range::OpenClosed(0.0, 1.0))
        );
        assert!(
            check(0.0, Range::ClosedOpen(0.0, 1.0)) && !check(1.0, Range::ClosedOpen(0.0, 1.0))
        );
        assert!(!check(1.0, Range::Open(0.0, 1.0)) && check(0.5, Range::Open(0.0, 1.0)));
        assert!(check(0.0, Range::AtLeast(0.0)) && !check(0.0, Range::Above(0.0)));
        assert!(
            !check(f64::INFINITY, Range::AtLeast(0.0)) && !check(f64::NAN, Range::AtLeast(0.0))
        );
        let e = check_range(
            "gamma",
            2.0,
            Range::Closed(0.0, 1.0),
            "the discount",
            "GiGPO uses 0.95",
        )
        .unwrap_err();
        assert_eq!(e.kind, crate::ErrorKind::Config);
        assert_eq!(
            e.message,
            "`gamma` = 2: the discount must be in [0, 1] (GiGPO uses 0.95)"
        );
        let e = check_range("coef", -0.1f32, Range::AtLeast(0.0), "", "").unwrap_err();
        assert_eq!(e.message, "`coef` = -0.1: must be a finite number ≥ 0");
    }
}
