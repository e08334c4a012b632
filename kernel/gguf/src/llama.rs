//! The `llama` architecture: its hyper-parameters from the GGUF metadata, its tensors'
//! Hugging Face names and shapes, and the undoing of llama.cpp's q/k row permutation.
//!
//! llama.cpp's `convert_hf_to_gguf.py` (`LlamaModel.permute`) stores the rows of
//! `self_attn.q_proj.weight` and `self_attn.k_proj.weight` reordered per head, so that ggml's
//! RoPE can rotate adjacent pairs instead of transformers' two halves:
//! `w.reshape(n_head, 2, head_dim / 2, in).swapaxes(1, 2).reshape(out, in)`, with `n_head` the
//! query head count for q and the key/value head count for k. Within a head, Hugging Face row
//! `i * head_dim / 2 + j` (`i` in 0..2, `j` in 0..head_dim / 2) is GGUF row `2 * j + i`;
//! [`gguf_row`] maps one to the other and the importer reads the rows back in Hugging Face order.

use crate::error::{GgufError, Result};
use crate::gguf::GgufFile;

/// RoPE frequency scaling from `llama.rope.scaling.*` / `llama.rope.scale_linear`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor` (transformers' `linear`).
    Linear {
        factor: f64,
    },
}

/// The hyper-parameters of a llama GGUF, named as in transformers' `LlamaConfig`.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    /// `llama.block_count`.
    pub num_hidden_layers: usize,
    /// `llama.embedding_length`.
    pub hidden_size: usize,
    /// `llama.feed_forward_length`.
    pub intermediate_size: usize,
    /// `llama.attention.head_count`.
    pub num_attention_heads: usize,
    /// `llama.attention.head_count_kv`, else the query head count.
    pub num_key_value_heads: usize,
    /// `llama.attention.key_length`, else `hidden_size / num_attention_heads`; RoPE rotates all
    /// of it (`llama.rope.dimension_count`, when present, must equal it).
    pub head_dim: usize,
    /// `llama.rope.freq_base`, else 10000.
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    /// `llama.attention.layer_norm_rms_epsilon`.
    pub rms_norm_eps: f64,
    /// `llama.context_length`.
    pub max_position_embeddings: usize,
    /// `llama.vocab_size`, else the length of `tokenizer.ggml.tokens`.
    pub vocab_size: usize,
}

/// `llama.rope.*` keys the importer reads; any other one is refused, naming it.
const ROPE_KEYS: &[&str] = &[
    "llama.rope.freq_base",
    "llama.rope.dimension_count",
    "llama.rope.scaling.type",
    "llama.rope.scaling.factor",
    "llama.rope.scale_linear",
];

fn positive(file: &GgufFile, key: &str, value: u64) -> Result<usize> {
    match usize::try_from(value) {
        Ok(v) if v > 0 => Ok(v),
        _ => Err(GgufError::UnsupportedValue {
            file: file.path.clone(),
            key: key.to_string(),
            value: value.to_string(),
            supported: "a positive integer".into(),
        }),
    }
}

fn req(file: &GgufFile, key: &str) -> Result<usize> {
    positive(file, key, file.req_u64(key)?)
}

fn opt(file: &GgufFile, key: &str) -> Result<Option<usize>> {
    file.opt_u64(key)?
        .map(|v| positive(file, key, v))
        .transpose()
}

impl LlamaConfig {
    /// Reads and checks the hyper-parameters. Errors name the key: the architecture
    /// ([`GgufError::UnsupportedArchitecture`]), a missing or mistyped key, a head count that
    /// does not divide, an unhandled RoPE key.
    pub fn from_gguf(file: &GgufFile) -> Result<LlamaConfig> {
        let arch = file.req_str("general.architecture")?;
        if arch != "llama" {
            return Err(GgufError::UnsupportedArchitecture {
                file: file.path.clone(),
                found: arch.to_string(),
            });
        }
        let hidden_size = req(file, "llama.embedding_length")?;
        let num_attention_heads = req(file, "llama.attention.head_count")?;
        let num_key_value_heads =
            opt(file, "llama.attention.head_count_kv")?.unwrap_or(num_attention_heads);
        if !num_attention_heads.is_multiple_of(num_key_value_heads) {
            return Err(GgufError::UnsupportedValue {
                file: file.path.clone(),
                key: "llama.attention.head_count_kv".into(),
                value: num_key_value_heads.to_string(),
                supported: format!(
                    "a divisor of llama.attention.head_count ({num_attention_heads})"
                ),
            });
        }
        let head_dim = match opt(file, "llama.attention.key_length")? {
            Some(d) => d,
            None if hidden_size.is_multiple_of(num_attention_heads) => {
                hidden_size / num_attention_heads
            }
            None => {
                return Err(GgufError::MissingKey {
                    file: file.path.clone(),
                    key: "llama.attention.key_length".into(),
                })
            }
        };
        if let Some(v) = opt(file, "llama.attention.value_length")? {
            if v != head_dim {
                return Err(GgufError::UnsupportedValue {
                    file: file.path.clone(),
                    key: "llama.attention.value_length".into(),
                    value: v.to_string(),
                    supported: format!("the key length ({head_dim})"),
                });
            }
        }
        if let Some(d) = opt(file, "llama.rope.dimension_count")? {
            if d != head_dim {
                return Err(GgufError::UnsupportedValue {
                    file: file.path.clone(),
                    key: "llama.rope.dimension_count".into(),
                    value: d.to_string(),
                    supported: format!("the head dim ({head_dim}): llama rotates whole heads"),
                });
            }
        }
        if !head_dim.is_multiple_of(2) {
            return Err(GgufError::UnsupportedValue {
                file: file.path.clone(),
                key: "llama.attention.key_length".into(),
                value: head_dim.to_string(),
                supported: "an even head dim (RoPE rotates pairs)".into(),
            });
        }
        let vocab_size = match opt(file, "llama.vocab_size")? {
            Some(v) => v,
            None => file.req_str_array("tokenizer.ggml.tokens")?.len(),
        };
        Ok(LlamaConfig {
            num_hidden_layers: req(file, "llama.block_count")?,
            hidden_size,
            intermediate_size: req(file, "llama.feed_forward_length")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rope_theta: file.opt_f64("llama.rope.freq_base")?.unwrap_or(10_000.0),
            rope_scaling: rope_scaling(file)?,
            rms_norm_eps: file
                .opt_f64("llama.attention.layer_norm_rms_epsilon")?
                .ok_or_else(|| GgufError::MissingKey {
                    file: file.path.clone(),
                    key: "llama.attention.layer_norm_rms_epsilon".into(),
                })?,
            max_position_embeddings: req(file, "llama.context_length")?,
            vocab_size,
        })
    }
}

fn rope_scaling(file: &GgufFile) -> Result<RopeScaling> {
    if let Some((key, _)) = file
        .metadata
        .iter()
        .find(|(k, _)| k.starts_with("llama.rope.") && !ROPE_KEYS.contains(&k.as_str()))
    {
        return Err(GgufError::UnsupportedKey {
            file: file.path.clone(),
            key: key.clone(),
            reason: "the importer handles RoPE scaling types none and linear only".into(),
        });
    }
    let factor_key = if file.get("llama.rope.scaling.factor").is_some() {
        "llama.rope.scaling.factor"
    } else {
        "llama.rope.scale_linear"
    };
    let factor = file.opt_f64(factor_key)?;
    let kind = match file.opt_str("llama.rope.scaling.type")? {
        Some(kind) => kind,
        // Older files have only `scale_linear`.
        None if factor.is_some() => "linear",
        None => "none",
    };
    match (kind, factor) {
        ("none", None) => Ok(RopeScaling::None),
        ("none" | "linear", Some(1.0)) => Ok(RopeScaling::None),
        ("linear", Some(f)) if f > 0.0 && f.is_finite() => Ok(RopeScaling::Linear { factor: f }),
        ("linear", None) => Err(GgufError::MissingKey {
            file: file.path.clone(),
            key: "llama.rope.scaling.factor".into(),
        }),
        ("none" | "linear", Some(f)) => Err(GgufError::UnsupportedValue {
            file: file.path.clone(),
            key: factor_key.into(),
            value: f.to_string(),
            supported: if kind == "none" {
                "1 with llama.rope.scaling.type none".into()
            } else {
                "a positive factor".into()
            },
        }),
        (other, _) => Err(GgufError::UnsupportedValue {
            file: file.path.clone(),
            key: "llama.rope.scaling.type".into(),
            value: format!("'{other}'"),
            supported: "none, linear".into(),
        }),
    }
}

/// What a GGUF tensor is in the Hugging Face model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HfTensor {
    /// The Hugging Face name (`model.layers.3.self_attn.q_proj.weight`).
    pub name: String,
    /// The dims the GGUF tensor must have, in ggml order; the Hugging Face shape is their
    /// reverse.
    pub ggml_dims: Vec<u64>,
    /// For q and k projections, the head count whose per-head row permutation to undo.
    pub unpermute_heads: Option<usize>,
}

/// The Hugging Face tensor for GGUF tensor `gguf_name`, `None` when the llama layout has no
/// such tensor (an unknown name or a block index past `num_hidden_layers`).
pub fn hf_tensor(config: &LlamaConfig, gguf_name: &str) -> Option<HfTensor> {
    let h = config.hidden_size as u64;
    let q = (config.num_attention_heads * config.head_dim) as u64;
    let kv = (config.num_key_value_heads * config.head_dim) as u64;
    let f = config.intermediate_size as u64;
    let v = config.vocab_size as u64;
    let plain = |name: &str, ggml_dims: Vec<u64>| HfTensor {
        name: name.to_string(),
        ggml_dims,
        unpermute_heads: None,
    };
    match gguf_name {
        "token_embd.weight" => return Some(plain("model.embed_tokens.weight", vec![h, v])),
        "output_norm.weight" => return Some(plain("model.norm.weight", vec![h])),
        "output.weight" => return Some(plain("lm_head.weight", vec![h, v])),
        _ => {}
    }
    let rest = gguf_name.strip_prefix("blk.")?;
    let (digits, tensor) = rest.split_once('.')?;
    let block: usize = digits.parse().ok()?;
    // `blk.01` or `blk.+1` would parse, but llama.cpp never writes them.
    if block >= config.num_hidden_layers || digits != block.to_string() {
        return None;
    }
    let (suffix, dims, heads) = match tensor {
        "attn_norm.weight" => ("input_layernorm.weight", vec![h], None),
        "ffn_norm.weight" => ("post_attention_layernorm.weight", vec![h], None),
        "attn_q.weight" => (
            "self_attn.q_proj.weight",
            vec![h, q],
            Some(config.num_attention_heads),
        ),
        "attn_k.weight" => (
            "self_attn.k_proj.weight",
            vec![h, kv],
            Some(config.num_key_value_heads),
        ),
        "attn_v.weight" => ("self_attn.v_proj.weight", vec![h, kv], None),
        "attn_output.weight" => ("self_attn.o_proj.weight", vec![q, h], None),
        "ffn_gate.weight" => ("mlp.gate_proj.weight", vec![h, f], None),
        "ffn_up.weight" => ("mlp.up_proj.weight", vec![h, f], None),
        "ffn_down.weight" => ("mlp.down_proj.weight", vec![f, h], None),
        _ => return None,
    };
    Some(HfTensor {
        name: format!("model.layers.{block}.{suffix}"),
        ggml_dims: dims,
        unpermute_heads: heads,
    })
}

/// The GGUF tensors a llama file must hold (`output.weight` is optional: without it the head
/// is tied to the embedding).
pub fn required_tensors(config: &LlamaConfig) -> Vec<String> {
    let mut names = vec!["token_embd.weight".to_string(), "output_norm.weight".into()];
    for block in 0..config.num_hidden_layers {
        for t in [
            "attn_norm",
            "ffn_norm",
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "ffn_gate",
            "ffn_up",
            "ffn_down",
        ] {
            names.push(format!("blk.{block}.{t}.weight"));
        }
    }
    names
}

/// The GGUF row that holds Hugging Face row `hf_row` of a q or k projection with `rows` rows
/// in `heads` heads (see the module doc).
pub fn gguf_row(hf_row: usize, rows: usize, heads: usize) -> usize {
    let head_dim = rows / heads;
    let half = head_dim / 2;
    let (head, within) = (hf_row / head_dim, hf_row % head_dim);
    let (i, j) = (within / half, within % half);
    head * head_dim + 2 * j + i
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's forward permutation, written as its numpy reshape/swapaxes on row indices:
    /// `permuted[h, j, i] = w[h, i, j]` over `[n_head, 2, head_dim / 2]`.
    fn llama_cpp_permute(rows: &[char], heads: usize) -> Vec<char> {
        let half = rows.len() / heads / 2;
        let mut out = Vec::new();
        for h in 0..heads {
            for j in 0..half {
                for i in 0..2 {
                    out.push(rows[h * 2 * half + i * half + j]);
                }
            }
        }
        out
    }

    fn unpermute(gguf: &[char], heads: usize) -> Vec<char> {
        (0..gguf.len())
            .map(|r| gguf[gguf_row(r, gguf.len(), heads)])
            .collect()
    }

    #[test]
    fn unpermute_gives_the_hugging_face_row_order() {
        // One head of dim 4: GGUF rows a b c d are Hugging Face rows a c b d.
        let rows: Vec<char> = "abcd".chars().collect();
        assert_eq!(unpermute(&rows, 1), "acbd".chars().collect::<Vec<_>>());
        // Two heads of dim 4, each head on its own.
        let rows: Vec<char> = "abcdefgh".chars().collect();
        assert_eq!(unpermute(&rows, 2), "acbdegfh".chars().collect::<Vec<_>>());
        // One head of dim 6: HF row i*3 + j is GGUF row 2j + i.
        let rows: Vec<char> = "abcdef".chars().collect();
        assert_eq!(unpermute(&rows, 1), "acebdf".chars().collect::<Vec<_>>());
    }

    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        let hf: Vec<char> = ('A'..='Z').chain('a'..='v').collect(); // 48 rows
        for heads in [1, 2, 3, 4, 6, 12] {
            let gguf = llama_cpp_permute(&hf, heads);
            assert_ne!(gguf, hf, "{heads} heads");
            assert_eq!(unpermute(&gguf, heads), hf, "{heads} heads");
        }
    }

    fn config() -> LlamaConfig {
        LlamaConfig {
            num_hidden_layers: 2,
            hidden_size: 64,
            intermediate_size: 96,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 16,
            rope_theta: 1e4,
            rope_scaling: RopeScaling::None,
            rms_norm_eps: 1e-5,
            max_position_embeddings: 128,
            vocab_size: 40,
        }
    }

    #[test]
    fn tensor_names_and_shapes() {
        let c = config();
        let check = |gguf: &str, hf: &str, dims: &[u64], heads: Option<usize>| {
            assert_eq!(
                hf_tensor(&c, gguf),
                Some(HfTensor {
                    name: hf.into(),
                    ggml_dims: dims.to_vec(),
                    unpermute_heads: heads
                }),
                "{gguf}"
            );
        };
        check(
            "token_embd.weight",
            "model.embed_tokens.weight",
            &[64, 40],
            None,
        );
        check("output.weight", "lm_head.weight", &[64, 40], None);
        check("output_norm.weight", "model.norm.weight", &[64], None);
        check(
            "blk.1.attn_q.weight",
            "model.layers.1.self_attn.q_proj.weight",
            &[64, 64],
            Some(4),
        );
        check(
            "blk.0.attn_k.weight",
            "model.layers.0.self_attn.k_proj.weight",
            &[64, 32],
            Some(2),
        );
        check(
            "blk.0.attn_v.weight",
            "model.layers.0.self_attn.v_proj.weight",
            &[64, 32],
            None,
        );
        check(
            "blk.0.attn_output.weight",
            "model.layers.0.self_attn.o_proj.weight",
            &[64, 64],
            None,
        );
        check(
            "blk.0.ffn_gate.weight",
            "model.layers.0.mlp.gate_proj.weight",
            &[64, 96],
            None,
        );
        check(
            "blk.0.ffn_up.weight",
            "model.layers.0.mlp.up_proj.weight",
            &[64, 96],
            None,
        );
        check(
            "blk.0.ffn_down.weight",
            "model.layers.0.mlp.down_proj.weight",
            &[96, 64],
            None,
        );
        check(
            "blk.1.attn_norm.weight",
            "model.layers.1.input_layernorm.weight",
            &[64],
            None,
        );
        check(
            "blk.1.ffn_norm.weight",
            "model.layers.1.post_attention_layernorm.weight",
            &[64],
            None,
        );
        for unknown in [
            "blk.2.attn_q.weight",
            "blk.01.attn_q.weight",
            "blk.0.attn_q.bias",
            "rope_freqs.weight",
            "blk.x.attn_q.weight",
        ] {
            assert_eq!(hf_tensor(&c, unknown), None, "{unknown}");
        }
        assert_eq!(required_tensors(&c).len(), 2 + 2 * 9);
    }
}
