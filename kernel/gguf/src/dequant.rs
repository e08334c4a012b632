//! Tensor types the importer reads and their dequantization to `f32`, one row at a time.
//!
//! The block formats, as ggml's `ggml-quants.c` (`dequantize_row_*`) defines them; all values
//! little-endian, `d` and `m` are IEEE half floats:
//!
//! | type | block | bytes | layout | value of element `j` |
//! |---|---|---|---|---|
//! | `F32` | 1 | 4 | `f32` | itself |
//! | `F16` | 1 | 2 | IEEE half | widened |
//! | `BF16` | 1 | 2 | bfloat16 (the top 16 bits of an `f32`) | widened |
//! | `Q8_0` | 32 | 34 | `d`, 32 × `i8` `q` | `d * q[j]` |
//! | `Q4_0` | 32 | 18 | `d`, 16 bytes `qs` | `d * (nibble - 8)` |
//! | `Q4_1` | 32 | 20 | `d`, `m`, 16 bytes `qs` | `d * nibble + m` |
//!
//! In the 4-bit types byte `qs[i]` holds element `i` in its low nibble and element `i + 16` in
//! its high nibble. Products are computed in `f32`, as ggml and the `gguf` Python package do,
//! so the results are bit-identical to theirs.

use half::{bf16, f16};

/// A ggml tensor type the importer can dequantize.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TensorType {
    F32,
    F16,
    Bf16,
    Q8_0,
    Q4_0,
    Q4_1,
}

/// Elements per block of the quantized types.
pub const QK: usize = 32;

impl TensorType {
    /// The type for a ggml type id, `None` for the types the importer does not read.
    pub fn from_id(id: u32) -> Option<TensorType> {
        Some(match id {
            0 => TensorType::F32,
            1 => TensorType::F16,
            2 => TensorType::Q4_0,
            3 => TensorType::Q4_1,
            8 => TensorType::Q8_0,
            30 => TensorType::Bf16,
            _ => return None,
        })
    }

    /// ggml's name for the type (`Q4_1`).
    pub fn name(self) -> &'static str {
        match self {
            TensorType::F32 => "F32",
            TensorType::F16 => "F16",
            TensorType::Bf16 => "BF16",
            TensorType::Q8_0 => "Q8_0",
            TensorType::Q4_0 => "Q4_0",
            TensorType::Q4_1 => "Q4_1",
        }
    }

    /// Elements per block (1 for the float types).
    pub fn block_elements(self) -> usize {
        match self {
            TensorType::F32 | TensorType::F16 | TensorType::Bf16 => 1,
            TensorType::Q8_0 | TensorType::Q4_0 | TensorType::Q4_1 => QK,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            TensorType::F32 => 4,
            TensorType::F16 | TensorType::Bf16 => 2,
            TensorType::Q8_0 => 2 + QK,
            TensorType::Q4_0 => 2 + QK / 2,
            TensorType::Q4_1 => 4 + QK / 2,
        }
    }

    /// Bytes of `elements` values, `None` unless `elements` is a whole number of blocks.
    pub fn bytes_for(self, elements: u64) -> Option<u64> {
        let block = self.block_elements() as u64;
        elements
            .is_multiple_of(block)
            .then(|| elements / block * self.block_bytes() as u64)
    }
}

/// ggml's name for type id `id`, including the types the importer refuses (`Q5_K`), for
/// error messages; ids ggml never assigned or has removed read `type id N`.
pub fn ggml_type_name(id: u32) -> String {
    let name = match id {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        6 => "Q5_0",
        7 => "Q5_1",
        8 => "Q8_0",
        9 => "Q8_1",
        10 => "Q2_K",
        11 => "Q3_K",
        12 => "Q4_K",
        13 => "Q5_K",
        14 => "Q6_K",
        15 => "Q8_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        30 => "BF16",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        _ => return format!("type id {id}"),
    };
    name.to_string()
}

fn half_at(src: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([src[at], src[at + 1]])).to_f32()
}

/// Dequantizes `out.len()` values of type `ty` from `src` into `out`.
///
/// Panics unless `out.len()` is a whole number of blocks and `src` holds exactly their bytes:
/// the importer checks every tensor's shape and byte range before converting any.
pub fn dequantize_row(ty: TensorType, src: &[u8], out: &mut [f32]) {
    let block = ty.block_elements();
    assert!(
        out.len().is_multiple_of(block) && src.len() == out.len() / block * ty.block_bytes(),
        "dequantize_row: {} bytes of {} for {} values",
        src.len(),
        ty.name(),
        out.len()
    );
    match ty {
        TensorType::F32 => {
            for (x, b) in out.iter_mut().zip(src.chunks_exact(4)) {
                *x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        TensorType::F16 => {
            for (x, b) in out.iter_mut().zip(src.chunks_exact(2)) {
                *x = f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
            }
        }
        TensorType::Bf16 => {
            for (x, b) in out.iter_mut().zip(src.chunks_exact(2)) {
                *x = bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
            }
        }
        TensorType::Q8_0 => {
            for (y, b) in out
                .chunks_exact_mut(QK)
                .zip(src.chunks_exact(ty.block_bytes()))
            {
                let d = half_at(b, 0);
                for (x, &q) in y.iter_mut().zip(&b[2..]) {
                    *x = d * f32::from(q as i8);
                }
            }
        }
        TensorType::Q4_0 => {
            for (y, b) in out
                .chunks_exact_mut(QK)
                .zip(src.chunks_exact(ty.block_bytes()))
            {
                let d = half_at(b, 0);
                let (lo, hi) = y.split_at_mut(QK / 2);
                for (i, &q) in b[2..].iter().enumerate() {
                    lo[i] = d * f32::from(i16::from(q & 0x0F) - 8);
                    hi[i] = d * f32::from(i16::from(q >> 4) - 8);
                }
            }
        }
        TensorType::Q4_1 => {
            for (y, b) in out
                .chunks_exact_mut(QK)
                .zip(src.chunks_exact(ty.block_bytes()))
            {
                let d = half_at(b, 0);
                let m = half_at(b, 2);
                let (lo, hi) = y.split_at_mut(QK / 2);
                for (i, &q) in b[4..].iter().enumerate() {
                    lo[i] = d * f32::from(q & 0x0F) + m;
                    hi[i] = d * f32::from(q >> 4) + m;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_bits().to_le_bytes()
    }

    fn check(ty: TensorType, block: &[u8], expected: &[f32]) {
        let mut out = vec![f32::NAN; expected.len()];
        dequantize_row(ty, block, &mut out);
        assert_eq!(out, expected, "{}", ty.name());
    }

    #[test]
    fn float_types_widen_exactly() {
        let f32s: Vec<u8> = [1.5f32, -0.25, 3.0e-8]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        check(TensorType::F32, &f32s, &[1.5, -0.25, 3.0e-8]);
        // 0x3C00 = 1.0, 0xC000 = -2.0, 0x0001 = the smallest subnormal 2^-24 in IEEE half.
        check(
            TensorType::F16,
            &[0x00, 0x3C, 0x00, 0xC0, 0x01, 0x00],
            &[1.0, -2.0, 2f32.powi(-24)],
        );
        // bf16 0x3FC0 = 1.5, 0xC120 = -10.0.
        check(TensorType::Bf16, &[0xC0, 0x3F, 0x20, 0xC1], &[1.5, -10.0]);
    }

    #[test]
    fn q8_0_is_scale_times_signed_byte() {
        let mut block = h(0.5).to_vec();
        let qs: Vec<i8> = (0..32).map(|i| (i as i8 - 16) * 8).collect(); // -128, -120, ..., 120
        block.extend(qs.iter().map(|&q| q as u8));
        let expected: Vec<f32> = qs.iter().map(|&q| 0.5 * f32::from(q)).collect();
        assert_eq!(expected[0], -64.0);
        assert_eq!(expected[31], 60.0);
        check(TensorType::Q8_0, &block, &expected);
    }

    #[test]
    fn q4_0_low_nibbles_first_then_high_offset_by_8() {
        let mut block = h(0.25).to_vec();
        // Byte i: low nibble i (element i), high nibble 15 - i (element i + 16).
        block.extend((0..16u8).map(|i| i | ((15 - i) << 4)));
        let mut expected = vec![0.0; 32];
        for i in 0..16 {
            expected[i] = 0.25 * (i as f32 - 8.0);
            expected[i + 16] = 0.25 * ((15 - i) as f32 - 8.0);
        }
        assert_eq!(
            (expected[0], expected[15], expected[16]),
            (-2.0, 1.75, 1.75)
        );
        check(TensorType::Q4_0, &block, &expected);
    }

    #[test]
    fn q4_1_is_scale_times_nibble_plus_min() {
        let mut block = h(0.5).to_vec();
        block.extend(h(-3.0));
        block.extend((0..16u8).map(|i| i | ((15 - i) << 4)));
        let mut expected = vec![0.0; 32];
        for i in 0..16 {
            expected[i] = 0.5 * i as f32 - 3.0;
            expected[i + 16] = 0.5 * (15 - i) as f32 - 3.0;
        }
        assert_eq!((expected[0], expected[15], expected[16]), (-3.0, 4.5, 4.5));
        // Two blocks: the second with other scales, to see blocks do not bleed into each other.
        let mut second = h(2.0).to_vec();
        second.extend(h(1.0));
        second.extend([0xF0u8; 16]); // low nibble 0, high nibble 15
        block.extend(&second);
        expected.extend([1.0; 16]);
        expected.extend([31.0; 16]);
        check(TensorType::Q4_1, &block, &expected);
    }

    #[test]
    fn ids_names_and_sizes() {
        assert_eq!(TensorType::from_id(3), Some(TensorType::Q4_1));
        assert_eq!(TensorType::from_id(13), None);
        assert_eq!(ggml_type_name(13), "Q5_K");
        assert_eq!(ggml_type_name(4), "type id 4");
        assert_eq!(TensorType::Q4_1.bytes_for(64), Some(40));
        assert_eq!(TensorType::Q8_0.bytes_for(576), Some(18 * 34));
        assert_eq!(TensorType::Q4_0.bytes_for(33), None);
        assert_eq!(TensorType::Bf16.bytes_for(3), Some(6));
    }
}
