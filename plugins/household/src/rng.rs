//! A tiny deterministic PRNG (SplitMix64) and a stable string hash (FNV-1a).
//!
//! The household must generate the same task for the same `(split, index)` forever, so it does
//! not use `rand`: a generator whose stream could change with a crate version would silently
//! reshuffle every task and mix the held-out split into training. SplitMix64 is a dozen lines,
//! passes BigCrush, and its output is fixed by its published constants.

/// The SplitMix64 generator (Steele, Lea and Flood, 2014).
#[derive(Clone, Debug)]
pub(crate) struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub(crate) fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.state)
    }

    /// A number in `0..n`; `n` must be positive. Uses the multiply-shift reduction, whose bias
    /// (below 2^-40 for the small `n` used here) does not matter for task generation.
    pub(crate) fn below(&mut self, n: usize) -> usize {
        assert!(n > 0, "below(0) has no valid result");
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }

    /// A number in `lo..=hi`.
    pub(crate) fn range(&mut self, lo: u32, hi: u32) -> u32 {
        lo + self.below((hi - lo) as usize + 1) as u32
    }

    /// An index into `weights`, drawn with probability proportional to its weight. The total
    /// weight must be positive.
    pub(crate) fn weighted(&mut self, weights: &[u32]) -> usize {
        let total: u32 = weights.iter().sum();
        let mut pick = self.below(total as usize) as u32;
        for (i, &w) in weights.iter().enumerate() {
            if pick < w {
                return i;
            }
            pick -= w;
        }
        unreachable!("pick < total weight")
    }

    /// Shuffles `items` in place (Fisher-Yates).
    pub(crate) fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i + 1));
        }
    }
}

/// The SplitMix64 output function: a bijective 64-bit mixer.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// 64-bit FNV-1a of `text`: a hash whose value is fixed by its definition (unlike `std`'s
/// `DefaultHasher`, which may change between Rust releases).
pub(crate) fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xCBF2_9CE4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_matches_reference_stream() {
        // Reference values for seed 1234567 (from the published C implementation).
        let mut rng = SplitMix64::new(1_234_567);
        let got: Vec<u64> = (0..3).map(|_| rng.next_u64()).collect();
        assert_eq!(
            got,
            [
                6_457_827_717_110_365_317,
                3_203_168_211_198_807_973,
                9_817_491_932_198_370_423
            ]
        );
    }

    #[test]
    fn fnv1a_matches_reference() {
        assert_eq!(fnv1a(""), 0xCBF2_9CE4_8422_2325);
        assert_eq!(fnv1a("a"), 0xAF63_DC4C_8601_EC8C);
    }

    #[test]
    fn weighted_and_below_stay_in_range() {
        let mut rng = SplitMix64::new(7);
        for _ in 0..1000 {
            assert!(rng.below(3) < 3);
            assert_eq!(rng.weighted(&[0, 5, 0]), 1);
            let r = rng.range(2, 4);
            assert!((2..=4).contains(&r));
        }
    }
}
