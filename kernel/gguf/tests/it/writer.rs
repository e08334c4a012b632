//! A GGUF writer for tests, and a tiny 2-layer llama built with it whose every tensor value is
//! known exactly in Hugging Face order.
//!
//! Values are made exactly representable in their tensor type (powers of two for the block
//! scales, small multiples of 1/32 elsewhere), so the importer's output must equal them bit for
//! bit, in f32 and in bf16. The q and k rows are stored permuted as llama.cpp's converter does.

use std::collections::BTreeMap;

use half::{bf16, f16};

/// A metadata value to write.
#[derive(Debug, Clone)]
pub enum Meta {
    U32(u32),
    F32(f32),
    Bool(bool),
    Str(String),
    StrArray(Vec<String>),
    I32Array(Vec<i32>),
    /// A value with an arbitrary type id and raw payload (malformed files).
    Raw(u32, Vec<u8>),
}

/// A tensor to write: ggml dims (`ne[0]` first), ggml type id, raw data.
#[derive(Debug, Clone)]
pub struct TensorSpec {
    pub name: String,
    pub dims: Vec<u64>,
    pub type_id: u32,
    pub data: Vec<u8>,
}

#[derive(Debug, Clone)]
pub struct GgufWriter {
    pub metadata: Vec<(String, Meta)>,
    pub tensors: Vec<TensorSpec>,
    pub alignment: u64,
}

/// Where [`GgufWriter::to_bytes`] put things.
#[derive(Debug, Clone)]
pub struct Layout {
    pub data_offset: u64,
    /// Each tensor's absolute byte range in the file.
    pub ranges: BTreeMap<String, (u64, u64)>,
}

fn string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn meta(out: &mut Vec<u8>, value: &Meta) {
    match value {
        Meta::U32(v) => {
            out.extend(4u32.to_le_bytes());
            out.extend(v.to_le_bytes());
        }
        Meta::F32(v) => {
            out.extend(6u32.to_le_bytes());
            out.extend(v.to_le_bytes());
        }
        Meta::Bool(v) => {
            out.extend(7u32.to_le_bytes());
            out.push(u8::from(*v));
        }
        Meta::Str(s) => {
            out.extend(8u32.to_le_bytes());
            string(out, s);
        }
        Meta::StrArray(items) => {
            out.extend(9u32.to_le_bytes());
            out.extend(8u32.to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            for s in items {
                string(out, s);
            }
        }
        Meta::I32Array(items) => {
            out.extend(9u32.to_le_bytes());
            out.extend(5u32.to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            for v in items {
                out.extend(v.to_le_bytes());
            }
        }
        Meta::Raw(type_id, payload) => {
            out.extend(type_id.to_le_bytes());
            out.extend(payload);
        }
    }
}

impl GgufWriter {
    /// The file: GGUF v3, metadata in order, tensors in order, each aligned.
    pub fn to_bytes(&self) -> (Vec<u8>, Layout) {
        let align = |n: u64| n.div_ceil(self.alignment) * self.alignment;
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            string(&mut out, key);
            meta(&mut out, value);
        }
        let mut offset = 0u64;
        let mut offsets = Vec::new();
        for t in &self.tensors {
            string(&mut out, &t.name);
            out.extend((t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(t.type_id.to_le_bytes());
            out.extend(offset.to_le_bytes());
            offsets.push(offset);
            offset = align(offset + t.data.len() as u64);
        }
        let data_offset = align(out.len() as u64);
        let mut ranges = BTreeMap::new();
        for (t, off) in self.tensors.iter().zip(offsets) {
            out.resize((data_offset + off) as usize, 0);
            out.extend(&t.data);
            ranges.insert(
                t.name.clone(),
                (data_offset + off, data_offset + off + t.data.len() as u64),
            );
        }
        (
            out,
            Layout {
                data_offset,
                ranges,
            },
        )
    }

    pub fn set(&mut self, key: &str, value: Meta) {
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some(entry) => entry.1 = value,
            None => self.metadata.push((key.to_string(), value)),
        }
    }

    pub fn remove(&mut self, key: &str) {
        self.metadata.retain(|(k, _)| k != key);
    }

    pub fn tensor_mut(&mut self, name: &str) -> &mut TensorSpec {
        self.tensors
            .iter_mut()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("no tensor {name}"))
    }
}

/// The ggml type ids the tiny model uses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Ty {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q8_0 = 8,
    Bf16 = 30,
}

/// One row: its exact values and their encoding in `ty`.
struct Row {
    values: Vec<f32>,
    bytes: Vec<u8>,
}

/// A row of `cols` values in `ty`, different for each `seed`.
fn make_row(ty: Ty, cols: usize, seed: usize) -> Row {
    let mut values = Vec::with_capacity(cols);
    let mut bytes = Vec::new();
    match ty {
        Ty::F32 | Ty::F16 | Ty::Bf16 => {
            for c in 0..cols {
                // Multiples of 1/32 in [-1.5, 1.5]: exact in f16 and bf16.
                let v = ((seed * 7 + c * 13) % 97) as f32 / 32.0 - 1.5;
                values.push(v);
                match ty {
                    Ty::F32 => bytes.extend(v.to_le_bytes()),
                    Ty::F16 => bytes.extend(f16::from_f32(v).to_bits().to_le_bytes()),
                    _ => bytes.extend(bf16::from_f32(v).to_bits().to_le_bytes()),
                }
            }
        }
        Ty::Q8_0 | Ty::Q4_0 | Ty::Q4_1 => {
            assert_eq!(cols % 32, 0);
            for b in 0..cols / 32 {
                let d = 2f32.powi(-(3 + ((seed + b) % 3) as i32));
                let m = -(((seed + b) % 5) as f32) * 0.25;
                bytes.extend(f16::from_f32(d).to_bits().to_le_bytes());
                if ty == Ty::Q4_1 {
                    bytes.extend(f16::from_f32(m).to_bits().to_le_bytes());
                }
                match ty {
                    Ty::Q8_0 => {
                        for k in 0..32 {
                            let q = ((seed * 3 + b * 7 + k * 5) % 255) as i32 - 127;
                            values.push(d * q as f32);
                            bytes.push(q as i8 as u8);
                        }
                    }
                    _ => {
                        let nibbles: Vec<u8> = (0..32)
                            .map(|k| ((seed + b * 3 + k * 7) % 16) as u8)
                            .collect();
                        for &n in &nibbles {
                            values.push(if ty == Ty::Q4_0 {
                                d * (f32::from(n) - 8.0)
                            } else {
                                d * f32::from(n) + m
                            });
                        }
                        for i in 0..16 {
                            bytes.push(nibbles[i] | (nibbles[i + 16] << 4));
                        }
                    }
                }
            }
        }
    }
    Row { values, bytes }
}

/// llama.cpp's q/k row order: `reshape(heads, 2, head_dim / 2, in).swapaxes(1, 2)`, that is
/// stored row `(h, j, i)` is Hugging Face row `(h, i, j)`.
fn permute<T>(rows: Vec<T>, heads: usize) -> Vec<T> {
    let half = rows.len() / heads / 2;
    let mut slots: Vec<Option<T>> = rows.into_iter().map(Some).collect();
    let mut out = Vec::with_capacity(slots.len());
    for h in 0..heads {
        for j in 0..half {
            for i in 0..2 {
                out.push(
                    slots[h * 2 * half + i * half + j]
                        .take()
                        .expect("each row once"),
                );
            }
        }
    }
    out
}

/// An expected Hugging Face tensor: shape and values in row-major order.
#[derive(Debug, Clone, PartialEq)]
pub struct Expected {
    pub shape: Vec<usize>,
    pub values: Vec<f32>,
}

/// The tiny model's sizes.
pub const HIDDEN: usize = 32;
pub const HEADS: usize = 4;
pub const KV_HEADS: usize = 2;
pub const HEAD_DIM: usize = 8;
pub const FFN: usize = 64;
pub const LAYERS: usize = 2;

/// The tiny model's vocabulary: 0 `<|endoftext|>`, 1 `<|im_start|>`, 2 `<|im_end|>` (control),
/// then a b c ab abc Ġ 1 2 3 12.
pub const TOKENS: [&str; 13] = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "a",
    "b",
    "c",
    "ab",
    "abc",
    "Ġ",
    "1",
    "2",
    "3",
    "12",
];

/// A 2-layer llama (hidden 32, 4 query heads and 2 kv heads of dim 8, ffn 64, vocabulary 13)
/// using every supported tensor type, tied unless `untied`, with the Hugging Face tensors it
/// must import to.
pub fn tiny_llama(untied: bool) -> (GgufWriter, BTreeMap<String, Expected>) {
    let vocab = TOKENS.len();
    let strs = |items: &[&str]| Meta::StrArray(items.iter().map(|s| s.to_string()).collect());
    let metadata = vec![
        ("general.architecture".into(), Meta::Str("llama".into())),
        ("general.name".into(), Meta::Str("tiny".into())),
        ("llama.block_count".into(), Meta::U32(LAYERS as u32)),
        ("llama.context_length".into(), Meta::U32(256)),
        ("llama.embedding_length".into(), Meta::U32(HIDDEN as u32)),
        ("llama.feed_forward_length".into(), Meta::U32(FFN as u32)),
        ("llama.attention.head_count".into(), Meta::U32(HEADS as u32)),
        (
            "llama.attention.head_count_kv".into(),
            Meta::U32(KV_HEADS as u32),
        ),
        ("llama.rope.freq_base".into(), Meta::F32(100_000.0)),
        (
            "llama.attention.layer_norm_rms_epsilon".into(),
            Meta::F32(1e-5),
        ),
        ("llama.vocab_size".into(), Meta::U32(vocab as u32)),
        (
            "llama.rope.dimension_count".into(),
            Meta::U32(HEAD_DIM as u32),
        ),
        ("tokenizer.ggml.model".into(), Meta::Str("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Meta::Str("smollm".into())),
        ("tokenizer.ggml.tokens".into(), strs(&TOKENS)),
        (
            "tokenizer.ggml.token_type".into(),
            Meta::I32Array((0..vocab).map(|i| if i < 3 { 3 } else { 1 }).collect()),
        ),
        (
            "tokenizer.ggml.merges".into(),
            strs(&["a b", "ab c", "1 2"]),
        ),
        ("tokenizer.ggml.bos_token_id".into(), Meta::U32(1)),
        ("tokenizer.ggml.eos_token_id".into(), Meta::U32(2)),
        ("tokenizer.ggml.padding_token_id".into(), Meta::U32(2)),
        ("tokenizer.ggml.add_bos_token".into(), Meta::Bool(false)),
        (
            "tokenizer.chat_template".into(),
            Meta::Str(
                "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
                    .into(),
            ),
        ),
    ];
    let mut tensors = Vec::new();
    let mut expected = BTreeMap::new();
    let mut seed = 0;
    // (gguf name, hf name, ty, rows (out), cols (in), heads to permute)
    let mut add = |gguf: &str, hf: &str, ty: Ty, rows: usize, cols: usize, heads: Option<usize>| {
        let hf_rows: Vec<Row> = (0..rows)
            .map(|_| {
                seed += 1;
                make_row(ty, cols, seed)
            })
            .collect();
        let values: Vec<f32> = hf_rows.iter().flat_map(|r| r.values.clone()).collect();
        let stored = match heads {
            Some(h) => permute(hf_rows, h),
            None => hf_rows,
        };
        tensors.push(TensorSpec {
            name: gguf.into(),
            dims: if rows == 1 {
                vec![cols as u64]
            } else {
                vec![cols as u64, rows as u64]
            },
            type_id: ty as u32,
            data: stored.iter().flat_map(|r| r.bytes.clone()).collect(),
        });
        let shape = if rows == 1 {
            vec![cols]
        } else {
            vec![rows, cols]
        };
        expected.insert(hf.to_string(), Expected { shape, values });
    };
    add(
        "token_embd.weight",
        "model.embed_tokens.weight",
        Ty::Q8_0,
        vocab,
        HIDDEN,
        None,
    );
    for l in 0..LAYERS {
        let g = |t: &str| format!("blk.{l}.{t}.weight");
        let h = |t: &str| format!("model.layers.{l}.{t}.weight");
        let (q, kv) = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM);
        add(
            &g("attn_norm"),
            &h("input_layernorm"),
            Ty::F16,
            1,
            HIDDEN,
            None,
        );
        add(
            &g("attn_q"),
            &h("self_attn.q_proj"),
            Ty::Q4_1,
            q,
            HIDDEN,
            Some(HEADS),
        );
        add(
            &g("attn_k"),
            &h("self_attn.k_proj"),
            Ty::Q4_0,
            kv,
            HIDDEN,
            Some(KV_HEADS),
        );
        add(
            &g("attn_v"),
            &h("self_attn.v_proj"),
            Ty::Q8_0,
            kv,
            HIDDEN,
            None,
        );
        add(
            &g("attn_output"),
            &h("self_attn.o_proj"),
            Ty::F16,
            HIDDEN,
            q,
            None,
        );
        add(
            &g("ffn_norm"),
            &h("post_attention_layernorm"),
            Ty::Bf16,
            1,
            HIDDEN,
            None,
        );
        add(
            &g("ffn_gate"),
            &h("mlp.gate_proj"),
            Ty::Q4_1,
            FFN,
            HIDDEN,
            None,
        );
        add(&g("ffn_up"), &h("mlp.up_proj"), Ty::Bf16, FFN, HIDDEN, None);
        add(
            &g("ffn_down"),
            &h("mlp.down_proj"),
            Ty::F32,
            HIDDEN,
            FFN,
            None,
        );
    }
    add(
        "output_norm.weight",
        "model.norm.weight",
        Ty::F32,
        1,
        HIDDEN,
        None,
    );
    if untied {
        add(
            "output.weight",
            "lm_head.weight",
            Ty::Q4_0,
            vocab,
            HIDDEN,
            None,
        );
    }
    (
        GgufWriter {
            metadata,
            tensors,
            alignment: 32,
        },
        expected,
    )
}
