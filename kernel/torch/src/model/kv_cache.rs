//! The preallocated key/value cache for incremental decoding.
//!
//! One [`KvCache`] serves one batched generation: every layer owns a key and a value tensor
//! `[B, H_kv, T_max, D]`, allocated once. Each forward writes its new keys and values at
//! positions `[len, len + T)` with `narrow(..).copy_()` and attends over `[0, len + T)`; the
//! cache is never grown with `cat`, so decoding allocates nothing per step besides activations.
//! It is passed explicitly (`Option<&mut KvCache>`) to [`crate::model::CausalLm::forward`].
//! Inference only: callers hold a `no_grad` guard while it is in use.
//!
//! **Continuous batching.** The storage has room for `capacity` rows, of which the first
//! [`KvCache::rows`] take part in a forward. Every row writes at the same column (rows of
//! different lengths are left-aligned by masking, as in a left-padded batch), so a sequence
//! joins a running batch by having its prompt's keys and values copied into a free row, ending
//! at the current column ([`KvCache::write_rows`]); a finished row is retired by moving the last
//! row into its place ([`KvCache::move_row`]) and shrinking `rows`, both in place. Only
//! [`KvCache::relayout`], when the columns run out or a longer prompt joins, allocates.

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
    /// Rows `[0, rows)` of the storage take part in forwards.
    rows: i64,
    capacity: i64,
    shape: [i64; 4],
    kind: Kind,
    device: Device,
}

impl KvCache {
    /// Allocates (zeroed) storage for `batch` sequences of up to `max_len` positions.
    /// Errors: libtorch cannot allocate it (more rows or positions than the device holds).
    pub fn new(
        config: &ModelConfig,
        batch: usize,
        max_len: usize,
        kind: Kind,
        device: Device,
    ) -> Result<KvCache> {
        let shape = [
            batch as i64,
            config.num_key_value_heads as i64,
            max_len as i64,
            config.head_dim as i64,
        ];
        Ok(KvCache {
            layers: Self::storage(config.num_hidden_layers, shape, kind, device)?,
            len: 0,
            max_len: max_len as i64,
            rows: batch as i64,
            capacity: batch as i64,
            shape,
            kind,
            device,
        })
    }

    /// Zeroed key and value tensors of `shape` for each of `layers` layers.
    fn storage(
        layers: usize,
        shape: [i64; 4],
        kind: Kind,
        device: Device,
    ) -> Result<Vec<(Tensor, Tensor)>> {
        (0..layers)
            .map(|_| {
                Ok((
                    Tensor::f_zeros(shape, (kind, device))?,
                    Tensor::f_zeros(shape, (kind, device))?,
                ))
            })
            .collect()
    }

    /// Rows taking part in a forward.
    pub fn rows(&self) -> usize {
        self.rows as usize
    }

    /// Rows the storage holds.
    pub fn capacity(&self) -> usize {
        self.capacity as usize
    }

    /// Makes rows `[0, rows)` take part in forwards.
    ///
    /// # Errors
    /// When `rows` exceeds the capacity (grow it with [`KvCache::relayout`] first).
    pub(crate) fn set_rows(&mut self, rows: usize) -> Result<()> {
        if rows as i64 > self.capacity {
            return Err(Error::input(
                "kv cache",
                format!("{rows} rows requested, capacity {}", self.capacity),
            ));
        }
        self.rows = rows as i64;
        Ok(())
    }

    /// Copies row `from`'s filled positions over row `to`, in every layer (in place).
    pub(crate) fn move_row(&mut self, from: usize, to: usize) {
        if from == to || self.len == 0 {
            return;
        }
        for (k, v) in &mut self.layers {
            for t in [k, v] {
                let src = t.narrow(0, from as i64, 1).narrow(2, 0, self.len);
                t.narrow(0, to as i64, 1).narrow(2, 0, self.len).copy_(&src);
            }
        }
    }

    /// Copies rows `0..dst.len()` of `src` (all its `src.len()` positions) into rows `dst` of
    /// this cache, ending at this cache's current column: `[len - src.len(), len)`.
    ///
    /// # Errors
    /// When `src` has more positions than this cache has filled, or another layer count.
    pub(crate) fn write_rows(&mut self, dst: &[usize], src: &KvCache) -> Result<()> {
        let w = src.len;
        if w > self.len || src.layers.len() != self.layers.len() || dst.len() > src.capacity() {
            return Err(Error::input(
                "kv cache",
                format!(
                    "cannot place {} rows of {w} positions ending at column {}",
                    dst.len(),
                    self.len
                ),
            ));
        }
        if w == 0 {
            return Ok(());
        }
        for ((k, v), (sk, sv)) in self.layers.iter_mut().zip(&src.layers) {
            for (t, s) in [(k, sk), (v, sv)] {
                for (i, &row) in dst.iter().enumerate() {
                    let from = s.narrow(0, i as i64, 1).narrow(2, 0, w);
                    t.narrow(0, row as i64, 1)
                        .narrow(2, self.len - w, w)
                        .copy_(&from);
                }
            }
        }
        Ok(())
    }

    /// New storage of `capacity` rows and `max_len` columns: the filled columns
    /// `[drop, len)` of rows `[0, rows)` move to `[front, front + len - drop)`, and `len`
    /// becomes `front + len - drop`. The one method here that allocates.
    ///
    /// # Errors
    /// When the moved columns or rows do not fit.
    pub(crate) fn relayout(
        &mut self,
        capacity: usize,
        max_len: usize,
        drop: usize,
        front: usize,
    ) -> Result<()> {
        let (capacity, max_len, drop, front) =
            (capacity as i64, max_len as i64, drop as i64, front as i64);
        let kept = self.len - drop;
        if drop > self.len || front + kept > max_len || capacity < self.rows {
            return Err(Error::input(
                "kv cache",
                format!(
                    "cannot move columns [{drop}, {}) of {} rows into {capacity} rows of \
                     {max_len} columns at {front}",
                    self.len, self.rows
                ),
            ));
        }
        let shape = [capacity, self.shape[1], max_len, self.shape[3]];
        let mut layers = Self::storage(self.layers.len(), shape, self.kind, self.device)?;
        for ((k, v), (nk, nv)) in self.layers.iter().zip(&mut layers) {
            for (old, new) in [(k, nk), (v, nv)] {
                let from = old.narrow(0, 0, self.rows).narrow(2, drop, kept);
                new.narrow(0, 0, self.rows)
                    .narrow(2, front, kept)
                    .copy_(&from);
            }
        }
        self.layers = layers;
        self.shape = shape;
        self.capacity = capacity;
        self.max_len = max_len;
        self.len = front + kept;
        Ok(())
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
        let (ck, cv) = if self.rows == self.capacity {
            (ck.shallow_clone(), cv.shallow_clone())
        } else {
            (ck.narrow(0, 0, self.rows), cv.narrow(0, 0, self.rows))
        };
        ck.narrow(2, self.len, t).copy_(k);
        cv.narrow(2, self.len, t).copy_(v);
        (ck.narrow(2, 0, self.len + t), cv.narrow(2, 0, self.len + t))
    }

    /// Every layer's `(keys, values)` storage, each `[capacity, H_kv, T_max, D]`, for the
    /// one-row step of [`crate::model::row_decode`], which writes the elements in place.
    pub(crate) fn layers_mut(&mut self) -> &mut [(Tensor, Tensor)] {
        &mut self.layers
    }

    /// Marks `t` more positions as filled.
    pub(crate) fn advance(&mut self, t: i64) {
        self.len += t;
    }
}
