//! Left-padded batches of token sequences, and the inverse mapping back to per-row vectors.
//!
//! Batches are left-padded so that every row's last real token sits in the last column:
//! generation then reads next-token logits from one column, and scoring finds every response
//! right-aligned. Padding positions hold id 0, get position id 0 and are invalid keys; see
//! [`crate::model::mask::attention_mask`] for why they cannot affect real positions.

use cairn_kernel::backend::Sequence;
use tch::{Device, Kind, Tensor};

use crate::error::{Error, Result};

/// Errors unless every id is below `vocab_size`.
pub(crate) fn check_ids(ids: &[u32], vocab_size: usize, what: &'static str) -> Result<()> {
    match ids.iter().find(|&&id| id as usize >= vocab_size) {
        Some(id) => Err(Error::input(
            what,
            format!("token id {id} is outside the vocabulary (size {vocab_size})"),
        )),
        None => Ok(()),
    }
}

/// Rows of ids left-padded to a common width `W`.
#[derive(Debug)]
pub(crate) struct LeftPadded {
    /// `[B, W]` int64, 0 at padding.
    pub input_ids: Tensor,
    /// `[B, W]` int64: `0..len` over the real tokens, 0 at padding.
    pub position_ids: Tensor,
    /// `[B, W]` bool, true on real tokens.
    pub valid: Tensor,
    pub width: usize,
}

impl LeftPadded {
    pub fn new(rows: &[Vec<u32>], device: Device) -> LeftPadded {
        let b = rows.len();
        let width = rows.iter().map(Vec::len).max().unwrap_or(0);
        let mut ids = vec![0i64; b * width];
        let mut pos = vec![0i64; b * width];
        let mut valid = vec![false; b * width];
        for (r, row) in rows.iter().enumerate() {
            let pad = width - row.len();
            for (j, &id) in row.iter().enumerate() {
                let k = r * width + pad + j;
                ids[k] = i64::from(id);
                pos[k] = j as i64;
                valid[k] = true;
            }
        }
        let shape = [b as i64, width as i64];
        LeftPadded {
            input_ids: Tensor::from_slice(&ids).view(shape).to_device(device),
            position_ids: Tensor::from_slice(&pos).view(shape).to_device(device),
            valid: Tensor::from_slice(&valid).view(shape).to_device(device),
            width,
        }
    }
}

/// (prompt, response) pairs as one left-padded batch, with the response tokens right-aligned
/// in `[B, R]` tensors (`R` = longest response).
#[derive(Debug)]
pub(crate) struct ResponseBatch {
    pub padded: LeftPadded,
    /// `[B, R]` int64: response ids right-aligned, 0 in the `R - L_r` leading slots.
    pub targets: Tensor,
    /// Response length of each row.
    pub response_lens: Vec<usize>,
    /// `R`.
    pub r_max: usize,
}

impl ResponseBatch {
    /// Validates and pads `sequences`: prompts must be non-empty (the first response token
    /// needs a context) and every id must be in the vocabulary. Errors name the sequence's
    /// index and field, so a user can find the entry in their input file.
    pub fn new(sequences: &[Sequence], vocab_size: usize, device: Device) -> Result<ResponseBatch> {
        for (i, s) in sequences.iter().enumerate() {
            if s.prompt_ids.is_empty() {
                return Err(Error::input(
                    "input",
                    format!("sequence {i}: empty prompt_ids; the first response token needs at least one context token"),
                ));
            }
            for (field, ids) in [
                ("prompt_ids", &s.prompt_ids),
                ("response_ids", &s.response_ids),
            ] {
                if let Some(id) = ids.iter().find(|&&id| id as usize >= vocab_size) {
                    return Err(Error::input(
                        "input",
                        format!("sequence {i}: {field} holds token id {id}, outside the vocabulary (size {vocab_size})"),
                    ));
                }
            }
        }
        let rows: Vec<Vec<u32>> = sequences
            .iter()
            .map(|s| [s.prompt_ids.as_slice(), s.response_ids.as_slice()].concat())
            .collect();
        let response_lens: Vec<usize> = sequences.iter().map(|s| s.response_ids.len()).collect();
        let r_max = response_lens.iter().copied().max().unwrap_or(0);
        let mut targets = vec![0i64; sequences.len() * r_max];
        for (r, s) in sequences.iter().enumerate() {
            let start = r * r_max + r_max - s.response_ids.len();
            for (j, &id) in s.response_ids.iter().enumerate() {
                targets[start + j] = i64::from(id);
            }
        }
        Ok(ResponseBatch {
            padded: LeftPadded::new(&rows, device),
            targets: Tensor::from_slice(&targets)
                .view([sequences.len() as i64, r_max as i64])
                .to_device(device),
            response_lens,
            r_max,
        })
    }

    /// Per-row response values from a right-aligned `[B, R]` tensor.
    pub fn unpad(&self, values: &Tensor) -> Result<Vec<Vec<f32>>> {
        let flat: Vec<f32> = Vec::try_from(
            values
                .to_kind(Kind::Float)
                .to_device(Device::Cpu)
                .contiguous()
                .view([-1]),
        )?;
        Ok(self
            .response_lens
            .iter()
            .enumerate()
            .map(|(r, &len)| {
                let end = (r + 1) * self.r_max;
                flat[end - len..end].to_vec()
            })
            .collect())
    }

    /// Per-row `[L_r·k]` values (row-major) from a right-aligned `[B, R, k]` tensor.
    pub fn unpad_k<T: tch::kind::Element + Copy>(
        &self,
        values: &Tensor,
        k: usize,
    ) -> Result<Vec<Vec<T>>> {
        let flat: Vec<T> = Vec::try_from(values.to_device(Device::Cpu).contiguous().view([-1]))?;
        Ok(self
            .response_lens
            .iter()
            .enumerate()
            .map(|(r, &len)| {
                let end = (r + 1) * self.r_max * k;
                flat[end - len * k..end].to_vec()
            })
            .collect())
    }

    /// The right-aligned `[B, R]` f32 tensor of per-row values (zeros in padding slots).
    /// `what` labels the error when a row's length differs from its response.
    pub fn pad(&self, rows: &[Vec<f32>], what: &'static str, device: Device) -> Result<Tensor> {
        if rows.len() != self.response_lens.len() {
            return Err(Error::input(
                what,
                format!(
                    "{} rows for a micro-batch of {}",
                    rows.len(),
                    self.response_lens.len()
                ),
            ));
        }
        let mut flat = vec![0f32; rows.len() * self.r_max];
        for (r, (row, &len)) in rows.iter().zip(&self.response_lens).enumerate() {
            if row.len() != len {
                return Err(Error::input(
                    what,
                    format!("row {r} has {} values for {len} response tokens", row.len()),
                ));
            }
            flat[(r + 1) * self.r_max - len..(r + 1) * self.r_max].copy_from_slice(row);
        }
        Ok(Tensor::from_slice(&flat)
            .view([rows.len() as i64, self.r_max as i64])
            .to_device(device))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn left_pads_and_right_aligns_responses() {
        let seqs = vec![
            Sequence {
                prompt_ids: vec![1, 2],
                response_ids: vec![3],
            },
            Sequence {
                prompt_ids: vec![4],
                response_ids: vec![5, 6, 7],
            },
        ];
        let b = ResponseBatch::new(&seqs, 10, Device::Cpu).unwrap();
        assert_eq!(b.padded.width, 4);
        let ids: Vec<i64> = Vec::try_from(b.padded.input_ids.view([-1])).unwrap();
        assert_eq!(ids, vec![0, 1, 2, 3, 4, 5, 6, 7]);
        let pos: Vec<i64> = Vec::try_from(b.padded.position_ids.view([-1])).unwrap();
        assert_eq!(pos, vec![0, 0, 1, 2, 0, 1, 2, 3]);
        let targets: Vec<i64> = Vec::try_from(b.targets.view([-1])).unwrap();
        assert_eq!(targets, vec![0, 0, 3, 5, 6, 7]);
        let t = b
            .pad(&[vec![1.0], vec![2.0, 3.0, 4.0]], "test", Device::Cpu)
            .unwrap();
        assert_eq!(b.unpad(&t).unwrap(), vec![vec![1.0], vec![2.0, 3.0, 4.0]]);
        assert!(b
            .pad(&[vec![1.0, 2.0], vec![2.0, 3.0, 4.0]], "test", Device::Cpu)
            .is_err());
    }

    #[test]
    fn rejects_empty_prompts_and_out_of_vocab_ids() {
        let empty = vec![Sequence {
            prompt_ids: vec![],
            response_ids: vec![1],
        }];
        assert!(ResponseBatch::new(&empty, 10, Device::Cpu)
            .unwrap_err()
            .to_string()
            .contains("empty prompt"));
        let big = vec![Sequence {
            prompt_ids: vec![1],
            response_ids: vec![10],
        }];
        assert!(ResponseBatch::new(&big, 10, Device::Cpu)
            .unwrap_err()
            .to_string()
            .contains("token id 10"));
    }
}
