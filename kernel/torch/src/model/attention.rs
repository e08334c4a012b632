//! Grouped-query self-attention (`self_attn.{q,k,v,o}_proj`, optional `q_norm`/`k_norm`).
//!
//! Op order follows transformers' `Qwen3Attention` / `LlamaAttention`: project, view as heads
//! `[B, T, H, D]`, per-head RMSNorm (qwen3), RoPE, transpose to `[B, H, T, D]`, (cache),
//! scaled dot-product attention with scale `1/sqrt(D)`, merge heads, `o_proj`.
//!
//! Two departures in form, not in value:
//! - RoPE is applied before the transpose ([`RopeTables::apply`] on `[B, T, H, D]`): it is
//!   elementwise, so the layout does not change a value, and the projections' layout is the
//!   contiguous one.
//! - The key/value heads are not repeated. transformers' `repeat_kv` copies each of the `H_kv`
//!   heads `H / H_kv` times (its `use_gqa_in_sdpa` is false whenever a mask is passed, as it
//!   always is here); here `scaled_dot_product_attention` gets `enable_gqa`, and libtorch
//!   2.11's CPU flash kernel maps query head `h` to key/value head `h / (H / H_kv)` itself:
//!   no `[B, H, S, D]` copy of the keys and values per layer and step. The values are those
//!   of the repeated heads (bit for bit at SmolLM2's shapes, f32 and bf16, checked against
//!   torch 2.11; the test below holds it to 1e-6 with padding and a cache).

use tch::{nn, Tensor};

use super::config::ModelConfig;
use super::kv_cache::KvCache;
use super::linear::Linear;
use super::rms_norm::RmsNorm;
use super::rotary::RopeTables;

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
    pub fn new(vs: nn::Path<'_>, config: &ModelConfig) -> Attention {
        let hidden = config.hidden_size as i64;
        let (h, kv, d) = (
            config.num_attention_heads as i64,
            config.num_key_value_heads as i64,
            config.head_dim as i64,
        );
        let qkv_bias = config.qkv_bias();
        let qk_norm = config.qk_norm();
        Attention {
            q_proj: Linear::new(&vs / "q_proj", hidden, h * d, qkv_bias),
            k_proj: Linear::new(&vs / "k_proj", hidden, kv * d, qkv_bias),
            v_proj: Linear::new(&vs / "v_proj", hidden, kv * d, qkv_bias),
            o_proj: Linear::new(&vs / "o_proj", h * d, hidden, config.o_bias()),
            q_norm: qk_norm.then(|| RmsNorm::new(&vs / "q_norm", d, config.rms_norm_eps)),
            k_norm: qk_norm.then(|| RmsNorm::new(&vs / "k_norm", d, config.rms_norm_eps)),
            num_heads: h,
            num_kv_heads: kv,
            head_dim: d,
            scale: 1.0 / (d as f64).sqrt(),
        }
    }

    /// `xs` `[B, T, hidden]`, `rope` the tables at the `T` positions ([`RopeTables`],
    /// `[B, T, 1, D]`), `mask` `[B, 1, T, S]` where `S = cache.len() + T` (or `T` without a
    /// cache): bool (true = attend) or additive in the model's dtype
    /// ([`super::mask::additive_mask`]) → `[B, T, hidden]`. With a cache, this layer's keys
    /// and values are written into it at `[cache.len(), cache.len() + T)`.
    pub fn forward(
        &self,
        xs: &Tensor,
        rope: &RopeTables,
        mask: &Tensor,
        cache: Option<(&mut KvCache, usize)>,
    ) -> Tensor {
        let (b, t) = (xs.size()[0], xs.size()[1]);
        // `[B, T, n, D]`, contiguous.
        let heads = |proj: &Linear, n: i64| proj.forward(xs).view([b, t, n, self.head_dim]);
        let rotated = |x: Tensor, norm: Option<&RmsNorm>| match norm {
            Some(norm) => rope.apply(&norm.forward(&x)),
            None => rope.apply(&x),
        };
        let q = rotated(heads(&self.q_proj, self.num_heads), self.q_norm.as_ref());
        let k = rotated(heads(&self.k_proj, self.num_kv_heads), self.k_norm.as_ref());
        let v = heads(&self.v_proj, self.num_kv_heads);
        // `[B, n, T, D]` views.
        let (q, k, v) = (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2));
        let (k, v) = match cache {
            Some((cache, layer)) => cache.append(layer, &k, &v),
            None => (k, v),
        };
        let out = Tensor::scaled_dot_product_attention(
            &q,
            &k,
            &v,
            Some(mask),
            0.0,
            false,
            self.scale,
            self.num_heads != self.num_kv_heads,
        );
        // The kernel's output is `[B, T, H, D]` in memory: the transpose back makes it
        // contiguous and the reshape a view.
        let out = out
            .transpose(1, 2)
            .reshape([b, t, self.num_heads * self.head_dim]);
        self.o_proj.forward(&out)
    }
}

#[cfg(test)]
mod tests {
    use tch::{Device, Kind};

    use super::*;
    use crate::model::mask::{additive_mask, attention_mask};
    use crate::model::rotary::{apply_rotary, RotaryEmbedding};

    /// transformers' `repeat_kv`: `[B, H_kv, S, D]` → `[B, H_kv · n_rep, S, D]`.
    fn repeat_kv(xs: &Tensor, n_rep: i64) -> Tensor {
        let s = xs.size();
        xs.unsqueeze(2)
            .expand([s[0], s[1], n_rep, s[2], s[3]], false)
            .reshape([s[0], s[1] * n_rep, s[2], s[3]])
    }

    /// transformers' `LlamaAttention.forward` (SDPA) op for op: the old code path, with the
    /// key/value heads repeated and a bool mask. `past` holds the keys and values
    /// `[B, H_kv, P, D]` of earlier positions (a cache, as transformers' `DynamicCache` keeps
    /// it: concatenated); returns the output and the keys and values including these `T`.
    fn reference(
        attn: &Attention,
        xs: &Tensor,
        (cos, sin): (&Tensor, &Tensor),
        mask: &Tensor,
        past: Option<(&Tensor, &Tensor)>,
    ) -> (Tensor, Tensor, Tensor) {
        let (b, t) = (xs.size()[0], xs.size()[1]);
        let d = attn.head_dim;
        let heads = |proj: &Linear, n: i64, norm: Option<&RmsNorm>| {
            let x = proj.forward(xs).view([b, t, n, d]);
            let x = norm.map_or(x.shallow_clone(), |norm| norm.forward_reference(&x));
            x.transpose(1, 2)
        };
        let q = heads(&attn.q_proj, attn.num_heads, attn.q_norm.as_ref());
        let k = heads(&attn.k_proj, attn.num_kv_heads, attn.k_norm.as_ref());
        let v = heads(&attn.v_proj, attn.num_kv_heads, None);
        let (q, k) = (apply_rotary(&q, cos, sin), apply_rotary(&k, cos, sin));
        let (k, v) = match past {
            Some((pk, pv)) => (Tensor::cat(&[pk, &k], 2), Tensor::cat(&[pv, &v], 2)),
            None => (k, v),
        };
        let n_rep = attn.num_heads / attn.num_kv_heads;
        let out = Tensor::scaled_dot_product_attention(
            &q,
            &repeat_kv(&k, n_rep),
            &repeat_kv(&v, n_rep),
            Some(mask),
            0.0,
            false,
            attn.scale,
            false,
        );
        let out = attn
            .o_proj
            .forward(&out.transpose(1, 2).reshape([b, t, attn.num_heads * d]));
        (out, k, v)
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        (a - b).abs().max().double_value(&[])
    }

    /// Grouped-query attention through `enable_gqa` equals the repeated-K/V reference on
    /// random weights and inputs with left padding, in f32 to 1e-6: the whole sequence at once
    /// (bool and additive mask), and a prefill followed by one-token steps through a
    /// [`KvCache`] against the reference on the same steps with its keys and values
    /// concatenated. The cached steps also match the whole-sequence reference's rows (to 1e-5:
    /// one query against many is a different reduction blocking in the kernel). A
    /// Llama-layout config (GQA 6/2), a Qwen3 one (q/k norms, GQA 4/2) and plain multi-head
    /// attention (4/4).
    #[test]
    fn gqa_equals_repeated_kv_with_padding_and_cache() {
        tch::manual_seed(11);
        let mut llama = ModelConfig::qwen3(64, 48, 96, 1, 6, 2);
        llama.model_type = crate::model::ModelType::Llama;
        let qwen3 = ModelConfig::qwen3(64, 32, 64, 1, 4, 2);
        let mha = ModelConfig::qwen3(64, 32, 64, 1, 4, 4);
        for config in [llama, qwen3, mha] {
            let vs = nn::VarStore::new(Device::Cpu);
            let attn = Attention::new(vs.root(), &config);
            tch::no_grad(|| {
                for (_, mut p) in vs.variables() {
                    let r = Tensor::randn(p.size(), (Kind::Float, Device::Cpu)) * 0.3;
                    p.copy_(&(if p.dim() == 1 { r + 1.0 } else { r }));
                }
            });
            let _guard = tch::no_grad_guard();
            let rope = RotaryEmbedding::new(&config, Device::Cpu);
            let (b, s, p) = (3i64, 9i64, 4i64);
            let hidden = config.hidden_size as i64;
            let xs = Tensor::randn([b, s, hidden], (Kind::Float, Device::Cpu));
            // Left padding: row 0 none, row 1 two positions, row 2 five (all of the prefill
            // but one).
            let pad = [0i64, 2, 5];
            let valid: Vec<bool> = pad
                .iter()
                .flat_map(|&n| (0..s).map(move |j| j >= n))
                .collect();
            let valid = Tensor::from_slice(&valid).view([b, s]);
            let pos: Vec<i64> = pad
                .iter()
                .flat_map(|&n| (0..s).map(move |j| (j - n).max(0)))
                .collect();
            let pos = Tensor::from_slice(&pos).view([b, s]);
            let (cos, sin) = rope.cos_sin(&pos, Kind::Float);
            let mask = attention_mask(&valid, s, 0);
            let (want, _, _) = reference(&attn, &xs, (&cos, &sin), &mask, None);

            let tables = rope.tables(&pos, Kind::Float);
            for m in [mask.shallow_clone(), additive_mask(&mask, Kind::Float)] {
                let got = attn.forward(&xs, &tables, &m, None);
                let d = max_diff(&got, &want);
                assert!(d < 1e-6, "full sequence: {d}");
            }

            let mut cache = KvCache::new(&config, b as usize, s as usize, Kind::Float, Device::Cpu);
            let mut past: Option<(Tensor, Tensor)> = None;
            let mut start = 0;
            for len in std::iter::once(p).chain(std::iter::repeat_n(1, (s - p) as usize)) {
                let x = xs.narrow(1, start, len);
                let step_pos = pos.narrow(1, start, len);
                let bool_mask = attention_mask(&valid.narrow(1, 0, start + len), len, start);
                let (step_cos, step_sin) = rope.cos_sin(&step_pos, Kind::Float);
                let (step_want, k, v) = reference(
                    &attn,
                    &x,
                    (&step_cos, &step_sin),
                    &bool_mask,
                    past.as_ref().map(|(k, v)| (k, v)),
                );
                past = Some((k, v));
                let tables = rope.tables(&step_pos, Kind::Float);
                let m = additive_mask(&bool_mask, Kind::Float);
                let got = attn.forward(&x, &tables, &m, Some((&mut cache, 0)));
                cache.advance(len);
                let d = max_diff(&got, &step_want);
                assert!(d < 1e-6, "cached positions {start}..{}: {d}", start + len);
                let d = max_diff(&got, &want.narrow(1, start, len));
                assert!(
                    d < 1e-5,
                    "cached vs whole sequence {start}..{}: {d}",
                    start + len
                );
                start += len;
            }
        }
    }
}
