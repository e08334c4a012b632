//! [`WordLevelEncoder`]: the encoding of [`crate::text::train_word_level`]'s tokenizers without
//! the `tokenizers` pipeline.
//!
//! `tokenizers` encodes through a `NormalizedString` that keeps an alignment per byte and a
//! `String` per piece, and splits with an Oniguruma regex: about 70% of a rollout turn's kernel
//! time with the small models' word-level tokenizer (BENCHMARKS.md, "The cost per turn row").
//! Their pre-tokenizer, [`crate::text::WORD_PATTERN`], is simple enough to scan by hand
//! on ASCII text, so a tokenizer of exactly that shape (no normalizer, that `Split`, a
//! `WordLevel` model, no post-processor, truncation or padding) encodes ASCII text holding no
//! added token here, and anything else through `tokenizers`. The ids are the same either way
//! (`tests::the_scan_gives_the_ids_tokenizers_gives`).

use std::collections::HashMap;

use serde_json::json;

use crate::text::WORD_PATTERN;

/// The vocabulary and added tokens of a word-level tokenizer that has the trained shape.
#[derive(Clone, Debug)]
pub(super) struct WordLevelEncoder {
    vocab: HashMap<String, u32>,
    /// The unknown token's id (`None`: an unknown word is `tokenizers`' error to report).
    unk: Option<u32>,
    /// The contents of every added token: a text holding one goes through `tokenizers`, which
    /// matches it as a single id.
    added: Vec<String>,
}

impl WordLevelEncoder {
    /// The encoder of `inner` when it has the trained shape, else `None`.
    pub(super) fn of(inner: &tokenizers::Tokenizer) -> Option<WordLevelEncoder> {
        let tokenizers::models::ModelWrapper::WordLevel(model) = inner.get_model() else {
            return None;
        };
        let pattern = json!({
            "type": "Split", "pattern": {"Regex": WORD_PATTERN}, "behavior": "Isolated",
            "invert": false,
        });
        let plain = inner.get_normalizer().is_none()
            && inner.get_post_processor().is_none()
            && inner.get_truncation().is_none()
            && inner.get_padding().is_none()
            && serde_json::to_value(inner.get_pre_tokenizer()?).ok()? == pattern;
        if !plain {
            return None;
        }
        let vocab = tokenizers::Model::get_vocab(model);
        let unk = vocab.get(&model.unk_token).copied();
        let added = inner
            .get_added_tokens_decoder()
            .into_values()
            .map(|t| t.content)
            .collect();
        Some(WordLevelEncoder { vocab, unk, added })
    }

    /// The ids of `text`, or `None` when `tokenizers` must encode it: non-ASCII text, text
    /// holding an added token, or an unknown word without an unknown token.
    pub(super) fn encode(&self, text: &str) -> Option<Vec<u32>> {
        if !text.is_ascii() || self.added.iter().any(|t| text.contains(t.as_str())) {
            return None;
        }
        let mut ids = Vec::with_capacity(text.len() / 4 + 2);
        for piece in Pieces::new(text.as_bytes()) {
            // ASCII pieces of ASCII text: the slice boundaries are char boundaries.
            let word = &text[piece];
            ids.push(match self.vocab.get(word) {
                Some(&id) => id,
                None => self.unk?,
            });
        }
        Some(ids)
    }
}

/// `\s` on ASCII (Oniguruma's, which has the vertical tab; `u8::is_ascii_whitespace` has not).
fn space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

/// The matches of [`WORD_PATTERN`] (`" ?\p{L}+| ?\p{N}| ?[^\s\p{L}\p{N}]|\s"`) in ASCII text,
/// as byte ranges: the pattern matches every byte, so the matches tile the text.
struct Pieces<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Pieces<'a> {
    fn new(bytes: &'a [u8]) -> Pieces<'a> {
        Pieces { bytes, at: 0 }
    }
}

impl Iterator for Pieces<'_> {
    type Item = std::ops::Range<usize>;

    fn next(&mut self) -> Option<Self::Item> {
        let bytes = self.bytes;
        let start = self.at;
        let first = *bytes.get(start)?;
        // A space goes with a following non-space (the first three alternatives); alone, or
        // before another space, it is `\s`.
        let body = match bytes.get(start + 1) {
            Some(&next) if first == b' ' && !space(next) => start + 1,
            _ => start,
        };
        let b = bytes[body];
        let end = if b.is_ascii_alphabetic() {
            body + bytes[body..]
                .iter()
                .take_while(|c| c.is_ascii_alphabetic())
                .count()
        } else {
            // One digit, one other symbol, or one whitespace character.
            body + 1
        };
        self.at = end;
        Some(start..end)
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::text::train::{train_word_level, WordLevelConfig};

    const CORPUS: [&str; 4] = [
        "You are in the kitchen. You see a countertop 1, a fridge 2 and a mug.",
        "Your task is to: put a clean mug in the cabinet.\n> go to countertop 1",
        "Nothing happens.\tThe fridge 2 is closed; open it (or not)!",
        "<|im_start|>user\nwhat now?<|im_end|>\n",
    ];

    fn trained() -> crate::text::Tokenizer {
        train_word_level(CORPUS, &WordLevelConfig::default()).unwrap()
    }

    /// Texts over an alphabet with every class the pattern tells apart: letters (known and
    /// unknown words), digits, punctuation, each ASCII whitespace, control characters, a
    /// special token, and non-ASCII letters, digits and spaces (which go to `tokenizers`).
    fn texts() -> Vec<String> {
        let pieces = [
            "you",
            "You",
            "kitchen",
            "fridge",
            "zebra",
            "q",
            "1",
            "2",
            "42",
            ".",
            ",",
            ";",
            "!",
            "(",
            ">",
            "\"",
            " ",
            "  ",
            "\t",
            "\n",
            "\r\n",
            "\x0B",
            "\x0C",
            "\x01",
            "\x7F",
            "<|im_end|>",
            "<|im",
            "é",
            "٣",
            "\u{00A0}",
            "\u{2003}",
        ];
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(27);
        let mut out: Vec<String> = CORPUS.iter().map(|s| s.to_string()).collect();
        out.extend(["", " ", "a", " a", "a ", "  a", " 1", " .", " \n", "\n "].map(String::from));
        for _ in 0..2000 {
            let n = rng.gen_range(1..12);
            out.push(
                (0..n)
                    .map(|_| pieces[rng.gen_range(0..pieces.len())])
                    .collect(),
            );
        }
        out
    }

    #[test]
    fn the_scan_gives_the_ids_tokenizers_gives() {
        let tokenizer = trained();
        let fast = WordLevelEncoder::of(tokenizer.inner()).expect("the trained shape");
        let mut scanned = 0;
        for text in texts() {
            let slow = tokenizer.inner().encode_fast(text.as_str(), false).unwrap();
            if let Some(ids) = fast.encode(&text) {
                assert_eq!(ids, slow.get_ids(), "{text:?}");
                scanned += 1;
            }
            assert_eq!(tokenizer.encode(&text).unwrap(), slow.get_ids(), "{text:?}");
        }
        assert!(scanned > 500, "only {scanned} texts took the scan");
    }

    #[test]
    fn only_the_trained_shape_and_plain_ascii_take_the_scan() {
        let tokenizer = trained();
        let fast = WordLevelEncoder::of(tokenizer.inner()).unwrap();
        assert!(fast.encode("go to fridge 2").is_some());
        assert!(fast.encode("go to <|im_end|>").is_none(), "an added token");
        assert!(fast.encode("café").is_none(), "non-ASCII");
        // Another pre-tokenizer: not this shape.
        let mut other = tokenizer.inner().clone();
        other.with_pre_tokenizer(Some(tokenizers::pre_tokenizers::whitespace::Whitespace {}));
        assert!(WordLevelEncoder::of(&other).is_none());
    }
}
