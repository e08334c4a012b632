//! The preallocated key/value cache for incremental decoding.
//!
//! One [`KvCache`] serves one batched generation: every layer owns a key and a value tensor
//! `[B, H_kv, T_max, D]`, allocated once. Each forward writes its new keys and values at
//! positions `[len, len + T)` with `narrow(..).copy_()` and attends over `[0, len + T)`; the
//! cache is never grown with `cat`, so decoding allocates nothing per step besides activations.
//! It is passed explicitly (`Option<&mut KvCache>`) to [`crate::model::CausalLm::forward`].
//! Inference only: callers hold a `no_grad` guard while it is in use.

use tch::{Device, Kind, Tensor};

use super::config::ModelConfig;
use crate::error::{Error, Result};

/// Keys and values of every layer for a batch of `B` sequences, up to `T_max` positions.
#[derive(Debug)]
pub struct KvCache {
    /// Per layer `(keys, values)`, each `[B, H_kv, T_max, D]`, in the model's dtype.
    layers: Vec<(Tensor, Tensor)>,
    /// Positions `[0, len)` hold valid entries (for every layer).
    len: i64,
    max_len: i64,
}

impl KvCache {
    /// Allocates (zeroed) storage for `batch` sequences of up to `max_len` positions.
    pub fn new(
        config: &ModelConfig,
        batch: usize,
        max_len: usize,
        kind: Kind,
        device: Device,
    ) -> KvCache {
        let shape = [
            batch as i64,
            config.num_key_value_heads as i64,
            max_len as i64,
            config.head_dim as i64,
        ];
        let layers = (0..config.num_hidden_layers)
            .map(|_| {
                (
                    Tensor::zeros(shape, (kind, device)),
                    Tensor::zeros(shape, (kind, device)),
                )
            })
            .collect();
        KvCache {
            layers,
            len: 0,
            max_len: max_len as i64,
        }
    }

    /// Filled positions.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Capacity `T_max`.
    pub fn max_len(&self) -> usize {
        self.max_len as usize
    }

    /// Errors unless `t` more positions fit.
    pub(crate) fn check_room(&self, t: i64) -> Result<()> {
        if self.len + t > self.max_len {
            return Err(Error::input(
                "kv cache",
                format!(
                    "{} positions filled, {t} more requested, capacity {}",
                    self.len, self.max_len
                ),
            ));
        }
        Ok(())
    }

    /// Writes `k`, `v` `[B, H_kv, T, D]` of `layer` at `[len, len + T)` and returns the keys
    /// and values `[B, H_kv, len + T, D]` to attend over. [`KvCache::advance`] moves `len`
    /// once every layer has written.
    pub(crate) fn append(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> (Tensor, Tensor) {
        let t = k.size()[2];
        let (ck, cv) = &mut self.layers[layer];
        ck.narrow(2, self.len, t).copy_(k);
        cv.narrow(2, self.len, t).copy_(v);
        (ck.narrow(2, 0, self.len + t), cv.narrow(2, 0, self.len + t))
    }

    /// Marks `t` more positions as filled.
    pub(crate) fn advance(&mut self, t: i64) {
        self.len += t;
    }
}
