//! Attention masks for left-padded batches.

use tch::{Device, Kind, Tensor};

/// The boolean attention mask `[B, 1, T, S]` (true = attend) for `T` queries that sit at key
/// positions `[offset, offset + T)` of `S` keys.
///
/// Query `t` may attend key `s` when `s <= offset + t` (causal) and key `s` is real
/// (`key_valid[b, s]`). A query always attends itself, even at a padding position: a padding
/// query with no key at all would give a NaN softmax row, and NaN values at padding positions
/// would leak into real rows as `0 · NaN`. Real queries never see padding keys, so padding
/// never changes a real position's output.
///
/// `key_valid`: `[B, S]` bool.
pub fn attention_mask(key_valid: &Tensor, q_len: i64, offset: i64) -> Tensor {
    let device: Device = key_valid.device();
    let s = key_valid.size()[1];
    let q_pos = Tensor::arange_start(offset, offset + q_len, (Kind::Int64, device)).unsqueeze(1);
    let k_pos = Tensor::arange(s, (Kind::Int64, device)).unsqueeze(0);
    let causal = k_pos.le_tensor(&q_pos);
    let diagonal = k_pos.eq_tensor(&q_pos);
    let visible = key_valid
        .unsqueeze(1)
        .unsqueeze(1)
        .logical_or(&diagonal.unsqueeze(0).unsqueeze(0));
    causal.unsqueeze(0).unsqueeze(0).logical_and(&visible)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_keys_are_hidden_and_padding_queries_see_themselves() {
        let valid = Tensor::from_slice(&[false, true, true]).view([1, 3]);
        let mask = attention_mask(&valid, 3, 0).view([3, 3]);
        let got: Vec<Vec<bool>> = (0..3)
            .map(|i| Vec::try_from(mask.get(i)).unwrap())
            .collect();
        assert_eq!(
            got,
            vec![
                vec![true, false, false],
                vec![false, true, false],
                vec![false, true, true]
            ]
        );
        // one decode query at position 3 of 4 keys
        let valid = Tensor::from_slice(&[false, true, true, true]).view([1, 4]);
        let got: Vec<bool> = Vec::try_from(attention_mask(&valid, 1, 3).view([4])).unwrap();
        assert_eq!(got, vec![false, true, true, true]);
    }
}
