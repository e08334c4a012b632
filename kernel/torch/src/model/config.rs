//! The model's hyper-parameters, read from and written to a Hugging Face `config.json`.
//!
//! [`ModelConfig`] covers the three decoder families the backend runs, which differ only in a
//! few switches (see [`ModelType`]). Parsing follows transformers' defaults for absent keys, so
//! a `config.json` means the same model here as in Python; keys this crate does not use
//! (`bos_token_id`, `eos_token_id`, ...) are kept in [`ModelConfig::extra`] and written back
//! by [`ModelConfig::to_hf_json`].

use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};
use tch::Kind;

use crate::error::{Error, Result};

/// The decoder family, from `model_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelType {
    /// Qwen3: per-head RMSNorm on queries and keys (`q_norm`, `k_norm`); biases on q/k/v/o
    /// only when `attention_bias`.
    Qwen3,
    /// Qwen2 / Qwen2.5: biases on q/k/v always, never on o; no q/k norm.
    Qwen2,
    /// Llama 3: biases on q/k/v/o only when `attention_bias`; no q/k norm; `llama3` RoPE
    /// scaling.
    Llama,
}

impl ModelType {
    pub fn as_str(self) -> &'static str {
        match self {
            ModelType::Qwen3 => "qwen3",
            ModelType::Qwen2 => "qwen2",
            ModelType::Llama => "llama",
        }
    }

    /// The transformers class written to `architectures`.
    fn architecture(self) -> &'static str {
        match self {
            ModelType::Qwen3 => "Qwen3ForCausalLM",
            ModelType::Qwen2 => "Qwen2ForCausalLM",
            ModelType::Llama => "LlamaForCausalLM",
        }
    }
}

/// How RoPE frequencies are rescaled (`rope_scaling` / `rope_parameters.rope_type`).
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE (`null`, `"default"`).
    Default,
    /// `"linear"`: every inverse frequency divided by `factor`.
    Linear { factor: f64 },
    /// `"llama3"`: Llama 3.1's frequency-dependent rescaling.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
}

/// Floating-point type of the weights.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    #[default]
    F32,
    Bf16,
}

impl Dtype {
    pub fn kind(self) -> Kind {
        match self {
            Dtype::F32 => Kind::Float,
            Dtype::Bf16 => Kind::BFloat16,
        }
    }

    /// The name transformers uses in `torch_dtype` / `dtype`.
    pub fn hf_name(self) -> &'static str {
        match self {
            Dtype::F32 => "float32",
            Dtype::Bf16 => "bfloat16",
        }
    }
}

/// A decoder-only transformer's shape and numerics, as in a HF `config.json`.
///
/// Construct with [`ModelConfig::from_file`] or [`ModelConfig::from_json`] (which validate),
/// or write the struct literally and call [`ModelConfig::validate`].
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub model_type: ModelType,
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// Width of the SwiGLU MLP.
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// Key/value heads (GQA); divides `num_attention_heads`.
    pub num_key_value_heads: usize,
    /// Per-head width `D`. `config.json` default as in transformers: 128 for qwen3 (its
    /// `Qwen3Config` default), `hidden_size / num_attention_heads` otherwise.
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    /// `lm_head` shares `model.embed_tokens.weight` (no `lm_head.weight` tensor).
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: usize,
    /// Biases on the attention projections (q/k/v/o for qwen3 and llama; ignored by qwen2,
    /// which always has q/k/v biases and no o bias).
    pub attention_bias: bool,
    /// Biases on the MLP projections (llama only).
    pub mlp_bias: bool,
    /// Std of the normal init of linear and embedding weights in [`crate::model::init`].
    pub initializer_range: f64,
    /// Dtype of the stored weights (`torch_dtype`), if the config names one.
    pub torch_dtype: Option<String>,
    /// Every other key of `config.json`, written back unchanged on save.
    pub extra: Map<String, Value>,
}

/// Keys [`ModelConfig`] reads itself; everything else goes to `extra`.
const KNOWN_KEYS: &[&str] = &[
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "tie_word_embeddings",
    "max_position_embeddings",
    "attention_bias",
    "mlp_bias",
    "initializer_range",
    "torch_dtype",
    "dtype",
    "architectures",
    "hidden_act",
];

impl ModelConfig {
    /// A small Qwen3-layout config for tests and from-scratch training. Fields not given are
    /// the transformers defaults; `extra` is empty.
    pub fn qwen3(
        vocab_size: usize,
        hidden_size: usize,
        intermediate_size: usize,
        num_hidden_layers: usize,
        num_attention_heads: usize,
        num_key_value_heads: usize,
    ) -> ModelConfig {
        ModelConfig {
            model_type: ModelType::Qwen3,
            vocab_size,
            hidden_size,
            intermediate_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim: hidden_size / num_attention_heads.max(1),
            rms_norm_eps: 1e-6,
            rope_theta: 10_000.0,
            rope_scaling: RopeScaling::Default,
            tie_word_embeddings: false,
            max_position_embeddings: 4096,
            attention_bias: false,
            mlp_bias: false,
            initializer_range: 0.02,
            torch_dtype: None,
            extra: Map::new(),
        }
    }

    /// Reads and validates `config.json`.
    pub fn from_file(path: &Path) -> Result<ModelConfig> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let value: Value = serde_json::from_str(&text).map_err(|source| Error::Json {
            path: path.to_path_buf(),
            source,
        })?;
        ModelConfig::from_json(&value, path)
    }

    /// Parses a `config.json` value; `path` only labels errors.
    pub fn from_json(value: &Value, path: &Path) -> Result<ModelConfig> {
        let p = Parser {
            path,
            obj: value
                .as_object()
                .ok_or_else(|| config_err(path, "<root>", "not an object"))?,
        };
        let model_type = match p.str("model_type")?.as_deref() {
            Some("qwen3") => ModelType::Qwen3,
            Some("qwen2") => ModelType::Qwen2,
            Some("llama") => ModelType::Llama,
            Some(other) => {
                return Err(Error::UnsupportedModelType {
                    path: path.to_path_buf(),
                    model_type: other.to_string(),
                })
            }
            None => return Err(config_err(path, "model_type", "missing")),
        };
        if let Some(act) = p.str("hidden_act")? {
            if act != "silu" {
                return Err(config_err(
                    path,
                    "hidden_act",
                    format!("`{act}` is not supported (only silu)"),
                ));
            }
        }
        if p.bool("use_sliding_window", false)? {
            return Err(config_err(
                path,
                "use_sliding_window",
                "sliding-window attention is not supported",
            ));
        }
        let hidden_size = p.required_usize("hidden_size")?;
        let num_attention_heads = p.required_usize("num_attention_heads")?;
        let default_head_dim = match model_type {
            ModelType::Qwen3 => 128,
            ModelType::Qwen2 | ModelType::Llama => hidden_size / num_attention_heads.max(1),
        };
        let (rope_theta, rope_scaling) = p.rope()?;
        let torch_dtype = match p.str("torch_dtype")? {
            Some(d) => Some(d),
            None => p.str("dtype")?,
        };
        let max_position_embeddings = p.usize("max_position_embeddings", 32_768)?;
        let mut rope_scaling = rope_scaling;
        if let RopeScaling::Llama3 {
            original_max_position_embeddings,
            ..
        } = &mut rope_scaling
        {
            if original_max_position_embeddings.is_nan() {
                *original_max_position_embeddings = max_position_embeddings as f64;
            }
        }
        let config = ModelConfig {
            model_type,
            vocab_size: p.required_usize("vocab_size")?,
            hidden_size,
            intermediate_size: p.required_usize("intermediate_size")?,
            num_hidden_layers: p.required_usize("num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads: p.usize("num_key_value_heads", num_attention_heads)?,
            head_dim: p.usize("head_dim", default_head_dim)?,
            rms_norm_eps: p.f64("rms_norm_eps", 1e-6)?,
            rope_theta,
            rope_scaling,
            tie_word_embeddings: p.bool("tie_word_embeddings", false)?,
            max_position_embeddings,
            attention_bias: p.bool("attention_bias", false)?,
            mlp_bias: p.bool("mlp_bias", false)?,
            initializer_range: p.f64("initializer_range", 0.02)?,
            torch_dtype,
            extra: p
                .obj
                .iter()
                .filter(|(k, _)| !KNOWN_KEYS.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        };
        config.validate(path)?;
        Ok(config)
    }

    /// Checks the invariants the model relies on; `path` labels errors.
    pub fn validate(&self, path: &Path) -> Result<()> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
        ];
        for (key, v) in positive {
            if v == 0 {
                return Err(config_err(path, key, "must be positive"));
            }
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return Err(config_err(
                path,
                "num_key_value_heads",
                format!(
                    "{} does not divide num_attention_heads = {}",
                    self.num_key_value_heads, self.num_attention_heads
                ),
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(config_err(
                path,
                "head_dim",
                format!("{} is odd; RoPE needs an even head_dim", self.head_dim),
            ));
        }
        if self.rms_norm_eps.is_nan() || self.rms_norm_eps <= 0.0 {
            return Err(config_err(path, "rms_norm_eps", "must be positive"));
        }
        if self.rope_theta.is_nan() || self.rope_theta <= 0.0 {
            return Err(config_err(path, "rope_theta", "must be positive"));
        }
        Ok(())
    }

    /// Whether q/k/v projections carry a bias.
    pub fn qkv_bias(&self) -> bool {
        match self.model_type {
            ModelType::Qwen2 => true,
            ModelType::Qwen3 | ModelType::Llama => self.attention_bias,
        }
    }

    /// Whether the output projection carries a bias.
    pub fn o_bias(&self) -> bool {
        match self.model_type {
            ModelType::Qwen2 => false,
            ModelType::Qwen3 | ModelType::Llama => self.attention_bias,
        }
    }

    /// Whether the MLP projections carry a bias.
    pub fn mlp_bias(&self) -> bool {
        self.model_type == ModelType::Llama && self.mlp_bias
    }

    /// Whether attention has per-head `q_norm` / `k_norm`.
    pub fn qk_norm(&self) -> bool {
        self.model_type == ModelType::Qwen3
    }

    /// The `config.json` transformers loads this model from, with `torch_dtype` set to
    /// `dtype`. RoPE settings are written both the transformers 4 way (`rope_theta`,
    /// `rope_scaling`) and the transformers 5 way (`rope_parameters`), with the same values.
    pub fn to_hf_json(&self, dtype: Dtype) -> Value {
        let mut obj = self.extra.clone();
        let (rope_scaling, mut rope_parameters) = match &self.rope_scaling {
            RopeScaling::Default => (Value::Null, json!({ "rope_type": "default" })),
            RopeScaling::Linear { factor } => {
                let v = json!({ "rope_type": "linear", "factor": factor });
                (v.clone(), v)
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                let v = json!({
                    "rope_type": "llama3",
                    "factor": factor,
                    "low_freq_factor": low_freq_factor,
                    "high_freq_factor": high_freq_factor,
                    "original_max_position_embeddings": *original_max_position_embeddings as u64,
                });
                (v.clone(), v)
            }
        };
        rope_parameters["rope_theta"] = json!(self.rope_theta);
        let known = json!({
            "architectures": [self.model_type.architecture()],
            "model_type": self.model_type.as_str(),
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": rope_scaling,
            "rope_parameters": rope_parameters,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "attention_bias": self.attention_bias,
            "mlp_bias": self.mlp_bias,
            "initializer_range": self.initializer_range,
            "torch_dtype": dtype.hf_name(),
            "dtype": dtype.hf_name(),
        });
        if let Value::Object(known) = known {
            obj.extend(known);
        }
        Value::Object(obj)
    }
}

/// `ModelConfig` appears inline in backend configs (TOML or JSON) in `config.json` form.
impl<'de> serde::Deserialize<'de> for ModelConfig {
    fn deserialize<D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> std::result::Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        ModelConfig::from_json(&value, Path::new("<inline model config>"))
            .map_err(serde::de::Error::custom)
    }
}

impl serde::Serialize for ModelConfig {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        let dtype = match self.torch_dtype.as_deref() {
            Some("bfloat16") => Dtype::Bf16,
            _ => Dtype::F32,
        };
        self.to_hf_json(dtype).serialize(serializer)
    }
}

fn config_err(path: &Path, key: &str, reason: impl Into<String>) -> Error {
    Error::Config {
        path: path.to_path_buf(),
        key: key.to_string(),
        reason: reason.into(),
    }
}

/// Typed access to `config.json` keys with errors that name the key.
struct Parser<'a> {
    path: &'a Path,
    obj: &'a Map<String, Value>,
}

impl Parser<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    fn err(&self, key: &str, reason: impl Into<String>) -> Error {
        config_err(self.path, key, reason)
    }

    fn required_usize(&self, key: &str) -> Result<usize> {
        match self.get(key) {
            None => Err(self.err(key, "missing")),
            Some(_) => self.usize(key, 0),
        }
    }

    fn usize(&self, key: &str, default: usize) -> Result<usize> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| {
                    self.err(key, format!("expected a non-negative integer, found {v}"))
                }),
        }
    }

    fn f64(&self, key: &str, default: f64) -> Result<f64> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_f64()
                .ok_or_else(|| self.err(key, format!("expected a number, found {v}"))),
        }
    }

    fn bool(&self, key: &str, default: bool) -> Result<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| self.err(key, format!("expected true or false, found {v}"))),
        }
    }

    fn str(&self, key: &str) -> Result<Option<String>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(|s| Some(s.to_string()))
                .ok_or_else(|| self.err(key, format!("expected a string, found {v}"))),
        }
    }

    /// `(rope_theta, scaling)` from `rope_parameters` (transformers 5) or `rope_theta` +
    /// `rope_scaling` (transformers 4). Llama 3's `original_max_position_embeddings` is NaN
    /// when absent; the caller fills in `max_position_embeddings`, as transformers does.
    fn rope(&self) -> Result<(f64, RopeScaling)> {
        let (key, params) = match (self.get("rope_parameters"), self.get("rope_scaling")) {
            (Some(p), _) => ("rope_parameters", Some(p)),
            (None, Some(s)) => ("rope_scaling", Some(s)),
            (None, None) => ("rope_scaling", None),
        };
        let mut theta = self.f64("rope_theta", 10_000.0)?;
        let Some(params) = params else {
            return Ok((theta, RopeScaling::Default));
        };
        let params = params
            .as_object()
            .ok_or_else(|| self.err(key, format!("expected an object, found {params}")))?;
        let sub = Parser {
            path: self.path,
            obj: params,
        };
        if sub.get("rope_theta").is_some() {
            theta = sub
                .f64("rope_theta", theta)
                .map_err(|_| self.err(&format!("{key}.rope_theta"), "expected a number"))?;
        }
        let rope_type = match (sub.str("rope_type")?, sub.str("type")?) {
            (Some(t), _) | (None, Some(t)) => t,
            (None, None) => "default".to_string(),
        };
        let num = |name: &str| -> Result<f64> {
            sub.get(name).and_then(Value::as_f64).ok_or_else(|| {
                self.err(
                    &format!("{key}.{name}"),
                    format!("missing or not a number (needed by rope_type {rope_type})"),
                )
            })
        };
        let scaling = match rope_type.as_str() {
            "default" => RopeScaling::Default,
            "linear" => RopeScaling::Linear {
                factor: num("factor")?,
            },
            "llama3" => RopeScaling::Llama3 {
                factor: num("factor")?,
                low_freq_factor: num("low_freq_factor")?,
                high_freq_factor: num("high_freq_factor")?,
                original_max_position_embeddings: sub
                    .get("original_max_position_embeddings")
                    .and_then(Value::as_f64)
                    .unwrap_or(f64::NAN),
            },
            other => {
                return Err(self.err(
                    &format!("{key}.rope_type"),
                    format!("`{other}` is not supported (supported: default, linear, llama3)"),
                ))
            }
        };
        Ok((theta, scaling))
    }
}

/// A path label for configs that did not come from a file.
pub(crate) fn inline_path() -> PathBuf {
    PathBuf::from("<model config>")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> Result<ModelConfig> {
        ModelConfig::from_json(&v, Path::new("config.json"))
    }

    fn base() -> Value {
        json!({
            "model_type": "qwen3", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
            "rope_theta": 1000000.0, "eos_token_id": 3
        })
    }

    #[test]
    fn parses_qwen3_and_keeps_extra_keys() {
        let c = parse(base()).unwrap();
        assert_eq!(c.model_type, ModelType::Qwen3);
        assert_eq!(
            (c.head_dim, c.num_key_value_heads, c.rope_theta),
            (8, 2, 1e6)
        );
        assert!(c.qk_norm() && !c.qkv_bias());
        let out = c.to_hf_json(Dtype::Bf16);
        assert_eq!(out["eos_token_id"], json!(3));
        assert_eq!(out["torch_dtype"], json!("bfloat16"));
        assert_eq!(
            parse(out).unwrap(),
            ModelConfig {
                torch_dtype: Some("bfloat16".into()),
                ..c
            }
        );
    }

    #[test]
    fn unknown_model_type_is_named() {
        let mut v = base();
        v["model_type"] = json!("mistral");
        let err = parse(v).unwrap_err().to_string();
        assert!(
            err.contains("`mistral`") && err.contains("config.json"),
            "{err}"
        );
    }

    #[test]
    fn missing_and_invalid_keys_are_named() {
        let mut v = base();
        v.as_object_mut().unwrap().remove("vocab_size");
        assert!(parse(v)
            .unwrap_err()
            .to_string()
            .contains("`vocab_size`: missing"));
        let mut v = base();
        v["num_key_value_heads"] = json!(3);
        assert!(parse(v)
            .unwrap_err()
            .to_string()
            .contains("`num_key_value_heads`"));
    }

    #[test]
    fn qwen2_has_qkv_bias_and_llama3_rope_parses() {
        let mut v = base();
        v["model_type"] = json!("qwen2");
        let c = parse(v).unwrap();
        assert!(c.qkv_bias() && !c.o_bias() && !c.qk_norm());

        let mut v = base();
        v["model_type"] = json!("llama");
        v["max_position_embeddings"] = json!(131072);
        v["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
        let c = parse(v).unwrap();
        assert_eq!(
            c.rope_scaling,
            RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192.0
            }
        );
        // transformers 5 form
        let mut v = base();
        v.as_object_mut().unwrap().remove("rope_theta");
        v["rope_parameters"] = json!({"rope_type": "default", "rope_theta": 5000.0});
        assert_eq!(parse(v).unwrap().rope_theta, 5000.0);
        let mut v = base();
        v["rope_scaling"] = json!({"type": "yarn", "factor": 4.0});
        assert!(parse(v).unwrap_err().to_string().contains("`yarn`"));
    }

    #[test]
    fn head_dim_defaults_follow_transformers() {
        let mut v = base();
        v.as_object_mut().unwrap().remove("head_dim");
        assert_eq!(parse(v.clone()).unwrap().head_dim, 128);
        v["model_type"] = json!("llama");
        assert_eq!(parse(v).unwrap().head_dim, 8);
    }
}
