//! Grouped-query self-attention (`self_attn.{q,k,v,o}_proj`, optional `q_norm`/`k_norm`).
//!
//! Op order follows transformers' `Qwen3Attention` / `LlamaAttention`: project, view as heads
//! `[B, T, H, D]`, per-head RMSNorm (qwen3), transpose to `[B, H, T, D]`, RoPE, (cache), repeat
//! key/value heads, scaled dot-product attention with scale `1/sqrt(D)`, merge heads, `o_proj`.

use tch::{nn, Device, Kind, Tensor};

use super::config::ModelConfig;
use super::kv_cache::KvCache;
use super::linear::Linear;
use super::packed::LayerProjs;
use super::rms_norm::RmsNorm;
use super::rotary::{apply_rotary, RopeTables};

/// One layer's attention block.
#[derive(Debug)]
pub struct Attention {
    pub q_proj: Linear,
    pub k_proj: Linear,
    pub v_proj: Linear,
    pub o_proj: Linear,
    /// Per-head RMSNorm over `D` of the queries (qwen3 only).
    pub q_norm: Option<RmsNorm>,
    /// Per-head RMSNorm over `D` of the keys (qwen3 only).
    pub k_norm: Option<RmsNorm>,
    num_heads: i64,
    num_kv_heads: i64,
    head_dim: i64,
    scale: f64,
}

impl Attention {
    /// Errors: libtorch cannot allocate a projection.
    pub fn new(vs: nn::Path<'_>, config: &ModelConfig) -> crate::error::Result<Attention> {
        let hidden = config.hidden_size as i64;
        let (h, kv, d) = (
            config.num_attention_heads as i64,
            config.num_key_value_heads as i64,
            config.head_dim as i64,
        );
        let qkv_bias = config.qkv_bias();
        let qk_norm = config.qk_norm();
        let norm = |name: &str| -> crate::error::Result<Option<RmsNorm>> {
            if qk_norm {
                Ok(Some(RmsNorm::new(&vs / name, d, config.rms_norm_eps)?))
            } else {
                Ok(None)
            }
        };
        Ok(Attention {
            q_proj: Linear::new(&vs / "q_proj", hidden, h * d, qkv_bias)?,
            k_proj: Linear::new(&vs / "k_proj", hidden, kv * d, qkv_bias)?,
            v_proj: Linear::new(&vs / "v_proj", hidden, kv * d, qkv_bias)?,
            o_proj: Linear::new(&vs / "o_proj", h * d, hidden, config.o_bias())?,
            q_norm: norm("q_norm")?,
            k_norm: norm("k_norm")?,
            num_heads: h,
            num_kv_heads: kv,
            head_dim: d,
            scale: 1.0 / (d as f64).sqrt(),
        })
    }

    /// `xs` `[B, T, hidden]`, `cos`/`sin` `[B, T, D]`, `mask` `[B, 1, T, S]` bool where
    /// `S = cache.len() + T` (or `T` without a cache) → `[B, T, hidden]`. With a cache, this
    /// layer's keys and values are written into it at `[cache.len(), cache.len() + T)`.
    pub fn forward(
        &self,
        xs: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mask: &Tensor,
        cache: Option<(&mut KvCache, usize)>,
    ) -> Tensor {
        let (b, t) = (xs.size()[0], xs.size()[1]);
        let fwd = RmsNorm::forward;
        let q = self.heads(
            self.q_proj.forward(xs),
            self.num_heads,
            self.q_norm.as_ref(),
            fwd,
        );
        let k = self.heads(
            self.k_proj.forward(xs),
            self.num_kv_heads,
            self.k_norm.as_ref(),
            fwd,
        );
        let v = self.heads(self.v_proj.forward(xs), self.num_kv_heads, None, fwd);
        let q = apply_rotary(&q, cos, sin);
        let k = apply_rotary(&k, cos, sin);
        let (k, v) = match cache {
            Some((cache, layer)) => cache.append(layer, &k, &v),
            None => (k, v),
        };
        let k = self.repeat_kv(k);
        let v = self.repeat_kv(v);
        let out = Tensor::scaled_dot_product_attention(
            &q,
            &k,
            &v,
            Some(mask),
            0.0,
            false,
            self.scale,
            false,
        );
        let out = out
            .transpose(1, 2)
            .reshape([b, t, self.num_heads * self.head_dim]);
        self.o_proj.forward(&out)
    }

    /// [`Attention::forward`] for inference (no grad), with the same values bit for bit (in
    /// reduced precision, decode steps to the rounding of another product order; see below):
    ///
    /// - RoPE from tables shaped once per forward ([`RopeTables`]);
    /// - grouped-query attention by SDPA's `enable_gqa`, which reads each key/value head in
    ///   place for its `H / H_kv` query heads instead of copying the cache `H / H_kv` times
    ///   per layer and step (`repeat_kv`);
    /// - in bf16 on the CPU, a decode step (`T = 1`) puts each key/value head's query heads on
    ///   the query axis instead, so attention is one `[H / H_kv, S]` product per key/value
    ///   head, not `H / H_kv` matrix-vector products;
    /// - `mask` additive, `[B, 1, T, S]` in the model's dtype (0 or −∞), made once per forward
    ///   instead of SDPA converting the boolean mask in every layer;
    /// - the projections `projs`: this layer's, plain or packed for oneDNN
    ///   ([`crate::model::packed`]; bf16 generation passes on the CPU).
    ///
    /// Training keeps [`Attention::forward`]: SDPA's backward with `enable_gqa` sums the key
    /// and value gradients of a group in another order. `tests/it/forward.rs` checks the
    /// equality on whole models, with and without a cache.
    pub(crate) fn forward_no_grad(
        &self,
        xs: &Tensor,
        rope: &RopeTables,
        mask: &Tensor,
        cache: Option<(&mut KvCache, usize)>,
        projs: &LayerProjs<'_>,
    ) -> Tensor {
        let (b, t) = (xs.size()[0], xs.size()[1]);
        let norm = RmsNorm::forward_no_grad;
        let (q, k, v) = projs.qkv(xs);
        let q = rope.apply(&self.heads(q, self.num_heads, self.q_norm.as_ref(), norm));
        let k = rope.apply(&self.heads(k, self.num_kv_heads, self.k_norm.as_ref(), norm));
        let v = self.heads(v, self.num_kv_heads, None, norm);
        let (k, v) = match cache {
            Some((cache, layer)) => cache.append(layer, &k, &v),
            None => (k, v),
        };
        let grouped = self.num_heads != self.num_kv_heads;
        // A decode step in reduced precision, on the CPU (where it was measured): the
        // `H / H_kv` query heads of each key/value head go on the query axis,
        // `[B, H_kv, H / H_kv, D]` against the cache's `[B, H_kv, S, D]`, so attention
        // multiplies `H / H_kv` query rows at once. With `enable_gqa`, libtorch's CPU flash
        // attention multiplies one row at a time, and MKL's bf16 matrix-vector product is its
        // slowest path: 3.2-4x slower a call at 64 rows (`scripts/bench/gqa_decode.py`,
        // BENCHMARKS.md "The gateway under a burst"). Query head `h` still reads key/value head
        // `h / (H / H_kv)`, as in `repeat_kv`; the mask `[B, 1, 1, S]` broadcasts over the
        // query axis. f32 keeps `enable_gqa`: there the two measured 0.9-1.1x, and the main
        // job's rollouts stay bit for bit.
        let fold = grouped && t == 1 && q.kind() != Kind::Float && q.device() == Device::Cpu;
        let q = if fold {
            let groups = self.num_heads / self.num_kv_heads;
            q.reshape([b, self.num_kv_heads, groups, self.head_dim])
        } else {
            q
        };
        let out = Tensor::scaled_dot_product_attention(
            &q,
            &k,
            &v,
            Some(mask),
            0.0,
            false,
            self.scale,
            grouped && !fold,
        );
        // Folded, `[B, H_kv, H / H_kv, D]` already holds the heads in `[B, 1, H, D]` order.
        let out = if fold { out } else { out.transpose(1, 2) };
        projs.o(&out.reshape([b, t, self.num_heads * self.head_dim]))
    }

    /// A projection's output `x` `[B, T, n·D]` split into `n` heads, each normalised by
    /// `norm` (qwen3's per-head RMSNorm, by `forward`: the training or the no-grad path), as
    /// `[B, n, T, D]`. `x` may be a view of a wider product (the packed `q, k, v`).
    fn heads(
        &self,
        x: Tensor,
        n: i64,
        norm: Option<&RmsNorm>,
        forward: fn(&RmsNorm, &Tensor) -> Tensor,
    ) -> Tensor {
        let (b, t) = (x.size()[0], x.size()[1]);
        let x = x.view([b, t, n, self.head_dim]);
        let x = match norm {
            Some(norm) => forward(norm, &x),
            None => x,
        };
        x.transpose(1, 2)
    }

    /// `[B, H_kv, S, D]` → `[B, H, S, D]`, each key/value head repeated `H / H_kv` times
    /// (transformers' `repeat_kv`).
    fn repeat_kv(&self, xs: Tensor) -> Tensor {
        let n_rep = self.num_heads / self.num_kv_heads;
        if n_rep == 1 {
            return xs;
        }
        let (b, s) = (xs.size()[0], xs.size()[2]);
        xs.unsqueeze(2)
            .expand([b, self.num_kv_heads, n_rep, s, self.head_dim], false)
            .reshape([b, self.num_heads, s, self.head_dim])
    }
}
