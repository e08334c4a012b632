//! The decoder-only causal LM in the Qwen3 layout (also Qwen2/2.5 and Llama 3, by config).
//!
//! ```text
//! model.embed_tokens → N × [ input_layernorm → self_attn → +residual
//!                            → post_attention_layernorm → mlp → +residual ]
//!                    → model.norm → lm_head (optionally tied to model.embed_tokens)
//! ```
//!
//! [`CausalLm`] owns its `VarStore`; parameter names are the HF tensor names
//! (`model.layers.0.self_attn.q_proj.weight`, `model.norm.weight`, `lm_head.weight`), so
//! safetensors checkpoints load by name. The two constructors fill every parameter:
//! [`CausalLm::random`] (seeded init, [`crate::model::init`]) and [`CausalLm::from_pretrained`]
//! (strict loading, defined in [`crate::weights`] so that the model does not depend on the
//! file format).

use tch::{nn, Device, Kind, Tensor};

use super::attention::Attention;
use super::config::{Dtype, ModelConfig};
use super::init::init_weights;
use super::kv_cache::KvCache;
use super::linear::Linear;
use super::mask::attention_mask;
use super::mlp::Mlp;
use super::packed::{LayerLinears, LayerProjs, PackCache, Packed, PackedWeights};
use super::rms_norm::RmsNorm;
use super::rotary::{RopeTables, RotaryEmbedding};
use crate::error::{Error, Result};

/// One transformer block, `model.layers.{i}`.
#[derive(Debug)]
pub struct DecoderLayer {
    pub input_layernorm: RmsNorm,
    pub self_attn: Attention,
    pub post_attention_layernorm: RmsNorm,
    pub mlp: Mlp,
    index: usize,
}

impl DecoderLayer {
    fn new(vs: nn::Path<'_>, config: &ModelConfig, index: usize) -> Result<DecoderLayer> {
        let (h, eps) = (config.hidden_size as i64, config.rms_norm_eps);
        Ok(DecoderLayer {
            input_layernorm: RmsNorm::new(&vs / "input_layernorm", h, eps)?,
            self_attn: Attention::new(&vs / "self_attn", config)?,
            post_attention_layernorm: RmsNorm::new(&vs / "post_attention_layernorm", h, eps)?,
            mlp: Mlp::new(&vs / "mlp", config)?,
            index,
        })
    }

    /// `[B, T, hidden]` → `[B, T, hidden]`; see [`Attention::forward`] for the other arguments.
    fn forward(
        &self,
        xs: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mask: &Tensor,
        cache: Option<&mut KvCache>,
    ) -> Tensor {
        let _span = tracing::trace_span!("decoder_layer", layer = self.index).entered();
        let attn = self.self_attn.forward(
            &self.input_layernorm.forward(xs),
            cos,
            sin,
            mask,
            cache.map(|c| (c, self.index)),
        );
        let xs = xs + attn;
        let mlp = self
            .mlp
            .forward(&self.post_attention_layernorm.forward(&xs));
        xs + mlp
    }

    /// Its seven projections and index, as [`crate::model::packed`] takes them.
    fn linears(&self) -> LayerLinears<'_> {
        let (a, m) = (&self.self_attn, &self.mlp);
        LayerLinears {
            index: self.index,
            q: &a.q_proj,
            k: &a.k_proj,
            v: &a.v_proj,
            o: &a.o_proj,
            gate: &m.gate_proj,
            up: &m.up_proj,
            down: &m.down_proj,
        }
    }

    /// [`DecoderLayer::forward`] for inference, bit for bit: each block's `forward_no_grad`,
    /// and the residual sums formed in place (`a + b` rounds as `b + a`). With `packed`, the
    /// projections go through oneDNN's packed path (see [`crate::model::packed`]).
    fn forward_no_grad(
        &self,
        xs: &Tensor,
        rope: &RopeTables,
        mask: &Tensor,
        cache: Option<&mut KvCache>,
        packed: Option<&PackedWeights>,
    ) -> Tensor {
        let _span = tracing::trace_span!("decoder_layer", layer = self.index).entered();
        let projs = LayerProjs::of(self.linears(), packed);
        let mut h = self.self_attn.forward_no_grad(
            &self.input_layernorm.forward_no_grad(xs),
            rope,
            mask,
            cache.map(|c| (c, self.index)),
            &projs,
        );
        let _ = h.g_add_(xs);
        let mut out = self
            .mlp
            .forward_no_grad(&self.post_attention_layernorm.forward_no_grad(&h), &projs);
        let _ = out.g_add_(&h);
        out
    }
}

/// A causal language model: token ids in, hidden states or logits out.
#[derive(Debug)]
pub struct CausalLm {
    vs: nn::VarStore,
    config: ModelConfig,
    dtype: Dtype,
    /// `[V, hidden]`, `model.embed_tokens.weight`.
    embed_tokens: Tensor,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    /// `lm_head.weight` `[V, hidden]`, or `embed_tokens` itself when tied.
    lm_head: Linear,
    rotary: RotaryEmbedding,
    /// The projections packed for bf16 generation on the CPU, kept while the weights stay.
    packed: PackCache,
}

impl CausalLm {
    /// Builds the module tree with placeholder values (zeros; norms at one). Crate-private so
    /// that no caller can end up with a model whose parameters were never filled: the public
    /// constructors are [`CausalLm::random`] and [`CausalLm::from_pretrained`].
    ///
    /// Errors: libtorch cannot allocate a parameter (sizes the device cannot hold), instead
    /// of the panic of tch's non-`f_` constructors.
    pub(crate) fn uninitialized(
        config: &ModelConfig,
        device: Device,
        dtype: Dtype,
    ) -> Result<CausalLm> {
        let mut vs = nn::VarStore::new(device);
        // Sets the kind of the variables created below (the store is empty).
        vs.set_kind(dtype.kind());
        let root = vs.root();
        let model = &root / "model";
        let (v, h) = (config.vocab_size as i64, config.hidden_size as i64);
        let embed_tokens =
            (&model / "embed_tokens").f_var("weight", &[v, h], nn::Init::Const(0.0))?;
        let layers = (0..config.num_hidden_layers)
            .map(|i| DecoderLayer::new(&model / "layers" / i, config, i))
            .collect::<Result<Vec<_>>>()?;
        let norm = RmsNorm::new(&model / "norm", h, config.rms_norm_eps)?;
        let lm_head = if config.tie_word_embeddings {
            Linear::from_weight(embed_tokens.shallow_clone())
        } else {
            Linear::new(&root / "lm_head", h, v, false)?
        };
        let rotary = RotaryEmbedding::new(config, device);
        Ok(CausalLm {
            vs,
            config: config.clone(),
            dtype,
            embed_tokens,
            layers,
            norm,
            lm_head,
            rotary,
            packed: PackCache::default(),
        })
    }

    /// A freshly initialised model, as transformers' `_init_weights` does it: linear and
    /// embedding weights `N(0, initializer_range²)`, biases 0, norms 1. Deterministic in
    /// `seed`, independent of libtorch's global RNG and of the device.
    pub fn random(
        config: &ModelConfig,
        device: Device,
        dtype: Dtype,
        seed: u64,
    ) -> Result<CausalLm> {
        config.validate(&super::config::inline_path())?;
        let model = CausalLm::uninitialized(config, device, dtype)?;
        init_weights(&model.vs, config.initializer_range, seed)?;
        Ok(model)
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    pub fn device(&self) -> Device {
        self.vs.device()
    }

    pub fn var_store(&self) -> &nn::VarStore {
        &self.vs
    }

    pub(crate) fn var_store_mut(&mut self) -> &mut nn::VarStore {
        &mut self.vs
    }

    /// Parameters by HF name, sorted by name (shallow clones sharing storage with the model).
    pub fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut params: Vec<(String, Tensor)> = self.vs.variables().into_iter().collect();
        params.sort_by(|a, b| a.0.cmp(&b.0));
        params
    }

    /// Final hidden states `[B, T, hidden]` (after `model.norm`) for `input_ids` `[B, T]`.
    ///
    /// - `position_ids` `[B, T]` int64: RoPE positions (left padding: real tokens start at 0).
    /// - `key_valid` `[B, S]` bool, `S = cache.len() + T`: which key positions hold real
    ///   tokens (false at padding).
    /// - `cache`: when given, keys and values are appended at `[cache.len(), cache.len() + T)`
    ///   and the queries attend over the whole cache.
    pub fn hidden_states(
        &self,
        input_ids: &Tensor,
        position_ids: &Tensor,
        key_valid: &Tensor,
        cache: Option<&mut KvCache>,
    ) -> Result<Tensor> {
        self.hidden_states_with(input_ids, position_ids, key_valid, cache, None)
    }

    /// [`CausalLm::hidden_states`], with the no-grad path's projections taken from `packed`
    /// when given (a generation pass's [`CausalLm::pack_for_inference`]).
    pub fn hidden_states_with(
        &self,
        input_ids: &Tensor,
        position_ids: &Tensor,
        key_valid: &Tensor,
        mut cache: Option<&mut KvCache>,
        packed: Option<&PackedWeights>,
    ) -> Result<Tensor> {
        let t = input_ids.size()[1];
        let offset = cache.as_ref().map_or(0, |c| c.len() as i64);
        if key_valid.size()[1] != offset + t {
            return Err(Error::input(
                "forward",
                format!(
                    "key_valid covers {} positions, expected cache {offset} + input {t}",
                    key_valid.size()[1]
                ),
            ));
        }
        if let Some(cache) = cache.as_ref() {
            cache.check_room(t)?;
        }
        let kind = self.dtype.kind();
        let mut xs = Tensor::embedding(&self.embed_tokens, input_ids, -1, false, false);
        let (cos, sin) = self.rotary.cos_sin(position_ids, kind);
        let mask = attention_mask(key_valid, t, offset);
        let hidden = if grad_enabled() {
            for layer in &self.layers {
                xs = layer.forward(&xs, &cos, &sin, &mask, cache.as_deref_mut());
            }
            self.norm.forward(&xs)
        } else {
            // Inference (sampling, scoring, the gateway): the same values, bit for bit, from
            // fewer kernels; see `Attention::forward_no_grad`.
            let rope = RopeTables::new(&cos, &sin);
            let additive = Tensor::zeros(mask.size(), (kind, mask.device()))
                .masked_fill(&mask.logical_not(), f64::NEG_INFINITY);
            for layer in &self.layers {
                xs = layer.forward_no_grad(&xs, &rope, &additive, cache.as_deref_mut(), packed);
            }
            self.norm.forward_no_grad(&xs)
        };
        if let Some(cache) = cache {
            cache.advance(t);
        }
        Ok(hidden)
    }

    /// Logits `[.., V]` in the model's dtype for hidden states `[.., hidden]`.
    pub fn logits(&self, hidden: &Tensor) -> Tensor {
        self.lm_head.forward(hidden)
    }

    /// [`CausalLm::logits`], through `packed`'s LM head when given.
    pub fn logits_with(&self, hidden: &Tensor, packed: Option<&PackedWeights>) -> Tensor {
        match packed {
            Some(p) => p.logits(&self.lm_head, hidden),
            None => self.lm_head.forward(hidden),
        }
    }

    /// Every projection and the LM head packed for oneDNN, for a generation pass (held until
    /// the returned guard drops): weights for a bf16 model on a CPU whose oneDNN has bf16
    /// kernels (when the copy takes at most half of the memory available), none otherwise
    /// (the plain path is then used). The model keeps the pack and hands it out again while
    /// its weights stay the same (same storage, dtype and version counters), and repacks after
    /// any change; see [`crate::model::packed`].
    pub fn pack_for_inference(&self) -> Packed<'_> {
        let layers: Vec<_> = self.layers.iter().map(DecoderLayer::linears).collect();
        self.packed.get(&layers, &self.lm_head)
    }

    /// One decode step of a single sequence, bf16 on the CPU, without libtorch: logits
    /// `[1, V]` (f32 holding bf16 values, as `logits(..).to_kind(Float)` gives) for token `id`
    /// at RoPE position `position`, with `key_valid` `[1, len + 1]` over the cache's columns;
    /// this token's keys and values are written at column `len` and the cache advances by one,
    /// as a one-token [`CausalLm::hidden_states`] does. Same values as the libtorch step up to
    /// the order of each f32 sum (see [`crate::model::row_decode`]).
    ///
    /// `Ok(None)`, with nothing written, where the path does not apply: a cache of several
    /// rows, f32 or CUDA weights, non-contiguous weights, a CPU without AVX2 and FMA. The
    /// caller then runs the libtorch step.
    ///
    /// # Errors
    /// `id` outside the vocabulary, or `key_valid` of another width than `len + 1`.
    pub fn decode_row(
        &self,
        id: i64,
        position: i64,
        key_valid: &Tensor,
        cache: &mut KvCache,
    ) -> Result<Option<Tensor>> {
        let vocab = self.config.vocab_size;
        let Some(token) = usize::try_from(id).ok().filter(|&t| t < vocab) else {
            return Err(Error::input(
                "decode_row",
                format!("token id {id} is outside the vocabulary of {vocab}"),
            ));
        };
        let width = cache.len() + 1;
        if key_valid.numel() != width {
            return Err(Error::input(
                "decode_row",
                format!(
                    "key_valid covers {} positions, expected cache {} + 1",
                    key_valid.numel(),
                    cache.len()
                ),
            ));
        }
        if !super::row_decode::available() {
            return Ok(None);
        }
        let Some(model) = self.row_model() else {
            return Ok(None);
        };
        let valid: Vec<bool> = Vec::try_from(key_valid.reshape([-1]).to_device(Device::Cpu))?;
        let Some(logits) = model.step(token, position, &valid, cache) else {
            return Ok(None);
        };
        cache.advance(1);
        let v = logits.len() as i64;
        Ok(Some(Tensor::from_slice(&logits).view([1, v])))
    }

    /// The weights as bf16 slices for [`CausalLm::decode_row`], or `None` unless every one is
    /// a contiguous bf16 CPU tensor of its config's shape and the heads fit the step (an even
    /// `head_dim` of at most 512, query heads a multiple of key/value heads).
    fn row_model(&self) -> Option<super::row_decode::RowModel<'_>> {
        use super::row_decode::{bf16_slice, Proj, RowLayer, RowModel};
        let c = &self.config;
        let (h, d, inter) = (c.hidden_size, c.head_dim, c.intermediate_size);
        let (hq, hkv) = (c.num_attention_heads, c.num_key_value_heads);
        if d % 2 != 0 || d > 512 || hkv == 0 || hq % hkv != 0 {
            return None;
        }
        fn norm(n: &RmsNorm, len: usize) -> Option<&[u16]> {
            bf16_slice(&n.weight).filter(|w| w.len() == len)
        }
        fn proj(l: &Linear, cols: usize, rows: usize) -> Option<Proj<'_>> {
            Proj::of(l, cols).filter(|p| p.rows == rows)
        }
        let mut layers = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            let (a, m) = (&layer.self_attn, &layer.mlp);
            layers.push(RowLayer {
                input_norm: norm(&layer.input_layernorm, h)?,
                qkv: [
                    proj(&a.q_proj, h, hq * d)?,
                    proj(&a.k_proj, h, hkv * d)?,
                    proj(&a.v_proj, h, hkv * d)?,
                ],
                q_norm: match &a.q_norm {
                    Some(n) => Some(norm(n, d)?),
                    None => None,
                },
                k_norm: match &a.k_norm {
                    Some(n) => Some(norm(n, d)?),
                    None => None,
                },
                o: proj(&a.o_proj, hq * d, h)?,
                post_norm: norm(&layer.post_attention_layernorm, h)?,
                gate_up: [proj(&m.gate_proj, h, inter)?, proj(&m.up_proj, h, inter)?],
                down: proj(&m.down_proj, inter, h)?,
            });
        }
        let inv_freq = self.rotary.inv_freq();
        if inv_freq.len() != d / 2 {
            return None;
        }
        Some(RowModel {
            embed: bf16_slice(&self.embed_tokens).filter(|e| e.len() == c.vocab_size * h)?,
            layers,
            norm: norm(&self.norm, h)?,
            lm_head: proj(&self.lm_head, h, c.vocab_size)?,
            inv_freq,
            hidden: h,
            heads: hq,
            kv_heads: hkv,
            head_dim: d,
            intermediate: inter,
            eps: c.rms_norm_eps,
        })
    }

    /// Logits `[B, T, V]`, cast to f32, for every position; see [`CausalLm::hidden_states`].
    pub fn forward(
        &self,
        input_ids: &Tensor,
        position_ids: &Tensor,
        key_valid: &Tensor,
        cache: Option<&mut KvCache>,
    ) -> Result<Tensor> {
        let hidden = self.hidden_states(input_ids, position_ids, key_valid, cache)?;
        Ok(self.logits(&hidden).to_kind(Kind::Float))
    }

    /// Logits `[1, T, V]` (f32) of one unpadded sequence of ids, positions `0..T`: the plain
    /// full forward, for tests and reference computations.
    pub fn forward_ids(&self, ids: &[u32]) -> Result<Tensor> {
        crate::batch::check_ids(ids, self.config.vocab_size, "forward_ids")?;
        let device = self.device();
        let t = ids.len() as i64;
        let input = Tensor::from_slice(&ids.iter().map(|&i| i64::from(i)).collect::<Vec<_>>())
            .view([1, t])
            .to_device(device);
        let pos = Tensor::arange(t, (Kind::Int64, device)).unsqueeze(0);
        let valid = Tensor::ones([1, t], (Kind::Bool, device));
        self.forward(&input, &pos, &valid, None)
    }
}

/// Whether libtorch records operations for autograd on this thread (`torch.is_grad_enabled()`).
/// tch only exposes the setter, which returns the previous mode; it is put straight back.
fn grad_enabled() -> bool {
    // SAFETY: `at_grad_set_enabled` sets this thread's grad mode and returns the previous one;
    // the second call restores it, so no state changes. Neither call can fail.
    unsafe {
        let previous = torch_sys::at_grad_set_enabled(1);
        torch_sys::at_grad_set_enabled(previous);
        previous != 0
    }
}
