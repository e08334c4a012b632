//! [`import_gguf`]: a llama GGUF file to a Hugging Face model directory.
//!
//! The whole file is checked before anything is written: the header and metadata, the
//! hyper-parameters, every tensor's name, type, dims and byte range, the tokenizer. Then the
//! directory is written as `OUT_DIR.partial` and renamed to `OUT_DIR` at the end, so an
//! interrupted or failed import never leaves a directory that looks complete.
//!
//! Memory: the GGUF is read into memory once (it is hashed too); tensors are dequantized one
//! at a time while `model.safetensors` is written (each [`LazyTensor`] converts its data when
//! the writer asks for it), so the peak is the GGUF plus the largest converted tensor.

use std::borrow::Cow;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use safetensors::{Dtype, View};
use serde_json::{json, Value as Json};
use sha2::{Digest, Sha256};

use crate::dequant::{dequantize_row, ggml_type_name, TensorType};
use crate::error::{GgufError, Part, Result};
use crate::gguf::{GgufFile, TensorInfo};
use crate::llama::{self, gguf_row, HfTensor, LlamaConfig, RopeScaling};
use crate::tokenizer::{self, SpecialIds};

/// The dtype of the written weights.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OutDtype {
    #[default]
    F32,
    /// bfloat16, rounded to nearest even from the dequantized `f32` values.
    Bf16,
}

impl OutDtype {
    /// `f32` or `bf16`, as the command line spells it.
    pub fn name(self) -> &'static str {
        match self {
            OutDtype::F32 => "f32",
            OutDtype::Bf16 => "bf16",
        }
    }

    /// transformers' name (`torch_dtype` in `config.json`).
    pub fn torch_name(self) -> &'static str {
        match self {
            OutDtype::F32 => "float32",
            OutDtype::Bf16 => "bfloat16",
        }
    }

    fn bytes(self) -> usize {
        match self {
            OutDtype::F32 => 4,
            OutDtype::Bf16 => 2,
        }
    }

    fn safetensors(self) -> Dtype {
        match self {
            OutDtype::F32 => Dtype::F32,
            OutDtype::Bf16 => Dtype::BF16,
        }
    }

    /// Appends `values` in this dtype, little-endian.
    fn encode(self, values: &[f32], out: &mut Vec<u8>) {
        match self {
            OutDtype::F32 => {
                for x in values {
                    out.extend_from_slice(&x.to_le_bytes());
                }
            }
            OutDtype::Bf16 => {
                for &x in values {
                    out.extend_from_slice(&half::bf16::from_f32(x).to_bits().to_le_bytes());
                }
            }
        }
    }
}

impl FromStr for OutDtype {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<OutDtype, String> {
        match s {
            "f32" => Ok(OutDtype::F32),
            "bf16" => Ok(OutDtype::Bf16),
            other => Err(format!("unknown dtype `{other}`; expected f32 or bf16")),
        }
    }
}

/// How to import.
#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    pub dtype: OutDtype,
}

/// What an import wrote.
#[derive(Debug, Clone)]
pub struct ImportReport {
    pub out_dir: PathBuf,
    /// Tensors in `model.safetensors`.
    pub tensors: usize,
    /// Elements of all written tensors.
    pub parameters: u64,
    /// The GGUF's tensor types (`Q4_1`) and how many tensors have each.
    pub source_types: BTreeMap<String, usize>,
    pub dtype: OutDtype,
    /// No `output.weight` in the GGUF: the head is the embedding.
    pub tied_embeddings: bool,
    /// Hex sha256 of the GGUF file.
    pub sha256: String,
    pub config: LlamaConfig,
}

/// One tensor converted and written, for a progress display.
#[derive(Debug, Clone, Copy)]
pub struct TensorProgress<'a> {
    /// Tensors written so far, this one included.
    pub done: usize,
    pub total: usize,
    /// Its Hugging Face name.
    pub name: &'a str,
}

/// Imports `gguf` into the new or empty directory `out_dir` (see [`import_gguf_with_progress`]).
pub fn import_gguf(gguf: &Path, out_dir: &Path, opts: &ImportOptions) -> Result<ImportReport> {
    import_gguf_with_progress(gguf, out_dir, opts, &|_| {})
}

/// Imports the llama GGUF `gguf` into `out_dir`: `config.json`, `model.safetensors` (in
/// `opts.dtype`), `tokenizer.json`, `tokenizer_config.json`, `generation_config.json` and
/// `cairn-import.json` (where it came from). `progress` is called after each tensor.
///
/// Errors, all before anything is written: `out_dir` exists and is not empty
/// ([`GgufError::OutDirNotEmpty`]) or `OUT_DIR.partial` exists; the file is not GGUF, is
/// truncated, or is malformed; the architecture is not llama; a key is missing or unsupported;
/// a tensor is unknown, missing, of an unsupported type or of the wrong shape; the tokenizer
/// cannot be built. I/O errors while writing remove `OUT_DIR.partial`.
pub fn import_gguf_with_progress(
    gguf: &Path,
    out_dir: &Path,
    opts: &ImportOptions,
    progress: &dyn Fn(TensorProgress<'_>),
) -> Result<ImportReport> {
    let partial = partial_dir(out_dir)?;
    let bytes = fs::read(gguf).map_err(|source| GgufError::Io {
        path: gguf.to_path_buf(),
        error: source,
    })?;
    let file = GgufFile::parse(&bytes, gguf)?;
    let config = LlamaConfig::from_gguf(&file)?;
    let planned = plan(&file, &bytes, &config)?;
    let tokenizer = tokenizer::build(&file, config.max_position_embeddings)?;
    if tokenizer.vocab_len > config.vocab_size {
        return Err(GgufError::Tokenizer {
            file: file.path.clone(),
            reason: format!(
                "tokenizer.ggml.tokens has {} tokens but the model's vocabulary \
                 (llama.vocab_size) is {}",
                tokenizer.vocab_len, config.vocab_size
            ),
        });
    }
    let tied_embeddings = file.tensor("output.weight").is_none();
    let sha256: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let mut source_types = BTreeMap::new();
    for t in &planned {
        *source_types.entry(t.ty.name().to_string()).or_insert(0) += 1;
    }
    let report = ImportReport {
        out_dir: out_dir.to_path_buf(),
        tensors: planned.len(),
        parameters: planned.iter().map(|t| t.elements as u64).sum(),
        source_types,
        dtype: opts.dtype,
        tied_embeddings,
        sha256,
        config,
    };

    if let Some(parent) = partial.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent).map_err(|source| GgufError::Io {
            path: parent.to_path_buf(),
            error: source,
        })?;
    }
    match fs::create_dir(&partial) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(GgufError::PartialExists { dir: partial })
        }
        Err(source) => {
            return Err(GgufError::Io {
                path: partial,
                error: source,
            })
        }
    }
    let written =
        write_dir(&partial, &file, &planned, &tokenizer, &report, progress).and_then(|()| {
            // `out_dir` is absent or an empty directory (checked first); an empty one is
            // replaced.
            if out_dir.is_dir() {
                fs::remove_dir(out_dir).map_err(|source| GgufError::Io {
                    path: out_dir.to_path_buf(),
                    error: source,
                })?;
            }
            fs::rename(&partial, out_dir).map_err(|source| GgufError::Io {
                path: out_dir.to_path_buf(),
                error: source,
            })
        });
    if let Err(e) = written {
        // Best effort: the error that stopped the import matters more than this one.
        let _ = fs::remove_dir_all(&partial);
        return Err(e);
    }
    Ok(report)
}

/// `OUT_DIR.partial`, after checking that `out_dir` is new or an empty directory.
fn partial_dir(out_dir: &Path) -> Result<PathBuf> {
    match fs::read_dir(out_dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(GgufError::OutDirNotEmpty {
                    dir: out_dir.to_path_buf(),
                });
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(_) if out_dir.exists() && !out_dir.is_dir() => {
            return Err(GgufError::OutDirNotADirectory {
                path: out_dir.to_path_buf(),
            })
        }
        Err(source) => {
            return Err(GgufError::Io {
                path: out_dir.to_path_buf(),
                error: source,
            })
        }
    }
    let Some(name) = out_dir.file_name() else {
        // `.`, `..` or `/`: exists and is not empty in practice; refused the same way.
        return Err(GgufError::OutDirNotEmpty {
            dir: out_dir.to_path_buf(),
        });
    };
    let mut partial = name.to_os_string();
    partial.push(".partial");
    Ok(out_dir.with_file_name(partial))
}

/// A GGUF tensor checked and ready to convert.
struct Planned<'a> {
    hf: HfTensor,
    info: &'a TensorInfo,
    ty: TensorType,
    /// Its bytes in the GGUF.
    data: &'a [u8],
    /// The Hugging Face shape: the ggml dims reversed (`[out, in]` for a matrix).
    shape: Vec<usize>,
    elements: usize,
}

/// Maps and checks every tensor of `file`: a llama name, a supported type, the dims the
/// metadata implies, whole blocks per row, bytes inside the file; then that none is missing.
fn plan<'a>(file: &'a GgufFile, bytes: &'a [u8], config: &LlamaConfig) -> Result<Vec<Planned<'a>>> {
    let mut planned = Vec::with_capacity(file.tensors.len());
    for info in &file.tensors {
        let hf = llama::hf_tensor(config, &info.name).ok_or_else(|| GgufError::UnknownTensor {
            file: file.path.clone(),
            tensor: info.name.clone(),
        })?;
        let ty =
            TensorType::from_id(info.type_id).ok_or_else(|| GgufError::UnsupportedTensorType {
                file: file.path.clone(),
                tensor: info.name.clone(),
                type_name: ggml_type_name(info.type_id),
            })?;
        if info.dims != hf.ggml_dims {
            return Err(GgufError::TensorShape {
                file: file.path.clone(),
                tensor: info.name.clone(),
                expected: hf.ggml_dims,
                found: info.dims.clone(),
            });
        }
        // The dims equal the metadata's, which are `usize`s: the products fit.
        let elements: u64 = info.dims.iter().product();
        let row = info.dims[0];
        let Some(n_bytes) = ty
            .bytes_for(elements)
            .filter(|_| row.is_multiple_of(ty.block_elements() as u64))
        else {
            return Err(GgufError::Malformed {
                file: file.path.clone(),
                part: Part::TensorData {
                    name: info.name.clone(),
                },
                reason: format!(
                    "type {} needs rows of whole {}-element blocks, and ne[0] is {row}",
                    ty.name(),
                    ty.block_elements()
                ),
            });
        };
        let data = file.tensor_data(bytes, info, n_bytes)?;
        planned.push(Planned {
            shape: info.dims.iter().rev().map(|&d| d as usize).collect(),
            elements: elements as usize,
            hf,
            info,
            ty,
            data,
        });
    }
    for name in llama::required_tensors(config) {
        if file.tensor(&name).is_none() {
            return Err(GgufError::MissingTensor {
                file: file.path.clone(),
                tensor: name,
            });
        }
    }
    Ok(planned)
}

/// A tensor whose data is converted when `safetensors` asks for it, so only one converted
/// tensor is in memory at a time.
struct LazyTensor<'a> {
    tensor: &'a Planned<'a>,
    dtype: OutDtype,
    done: &'a Cell<usize>,
    total: usize,
    progress: &'a dyn Fn(TensorProgress<'_>),
}

impl View for LazyTensor<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype.safetensors()
    }

    fn shape(&self) -> &[usize] {
        &self.tensor.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        let out = convert(self.tensor, self.dtype);
        self.done.set(self.done.get() + 1);
        (self.progress)(TensorProgress {
            done: self.done.get(),
            total: self.total,
            name: &self.tensor.hf.name,
        });
        Cow::Owned(out)
    }

    fn data_len(&self) -> usize {
        self.tensor.elements * self.dtype.bytes()
    }
}

/// Dequantizes `t` row by row, in Hugging Face row order (q/k rows un-permuted), into `dtype`.
fn convert(t: &Planned<'_>, dtype: OutDtype) -> Vec<u8> {
    let cols = t.info.dims[0] as usize;
    let rows = t.elements / cols;
    let row_bytes = t.data.len() / rows;
    let mut out = Vec::with_capacity(t.elements * dtype.bytes());
    let mut row = vec![0f32; cols];
    for r in 0..rows {
        let source = match t.hf.unpermute_heads {
            Some(heads) => gguf_row(r, rows, heads),
            None => r,
        };
        dequantize_row(
            t.ty,
            &t.data[source * row_bytes..(source + 1) * row_bytes],
            &mut row,
        );
        dtype.encode(&row, &mut out);
    }
    out
}

fn write_json(path: &Path, value: &Json) -> Result<()> {
    let text = serde_json::to_string_pretty(value).expect("JSON values serialize") + "\n";
    write_file(path, text.as_bytes())
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    fs::write(path, bytes).map_err(|source| GgufError::Io {
        path: path.to_path_buf(),
        error: source,
    })
}

fn write_dir(
    dir: &Path,
    file: &GgufFile,
    planned: &[Planned<'_>],
    tokenizer: &tokenizer::TokenizerFiles,
    report: &ImportReport,
    progress: &dyn Fn(TensorProgress<'_>),
) -> Result<()> {
    let done = Cell::new(0);
    let views = planned.iter().map(|t| {
        (
            t.hf.name.clone(),
            LazyTensor {
                tensor: t,
                dtype: report.dtype,
                done: &done,
                total: planned.len(),
                progress,
            },
        )
    });
    let metadata = Some(std::collections::HashMap::from([(
        "format".to_string(),
        "pt".to_string(),
    )]));
    let weights = dir.join("model.safetensors");
    safetensors::serialize_to_file(views, &metadata, &weights).map_err(|e| match e {
        safetensors::SafeTensorError::IoError(error) => GgufError::Io {
            path: weights.clone(),
            error,
        },
        error => GgufError::Safetensors {
            path: weights.clone(),
            error,
        },
    })?;

    write_json(
        &dir.join("config.json"),
        &hf_config(
            &report.config,
            report.tied_embeddings,
            report.dtype,
            &tokenizer.special,
        ),
    )?;
    write_file(&dir.join("tokenizer.json"), tokenizer.tokenizer.as_bytes())?;
    write_json(
        &dir.join("tokenizer_config.json"),
        &tokenizer.tokenizer_config,
    )?;
    write_json(
        &dir.join("generation_config.json"),
        &tokenizer.generation_config,
    )?;
    write_json(&dir.join("cairn-import.json"), &provenance(file, report))
}

/// `config.json` for transformers' `LlamaForCausalLM`. RoPE is written both the transformers 4
/// way (`rope_theta`, `rope_scaling`) and the transformers 5 way (`rope_parameters`), as
/// cairn-torch's export does.
fn hf_config(c: &LlamaConfig, tied: bool, dtype: OutDtype, special: &SpecialIds) -> Json {
    let (rope_scaling, mut rope_parameters) = match c.rope_scaling {
        RopeScaling::None => (Json::Null, json!({"rope_type": "default"})),
        RopeScaling::Linear { factor } => {
            let v = json!({"rope_type": "linear", "factor": factor});
            (v.clone(), v)
        }
    };
    rope_parameters["rope_theta"] = json!(c.rope_theta);
    let mut config = json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "rope_scaling": rope_scaling,
        "rope_parameters": rope_parameters,
        "max_position_embeddings": c.max_position_embeddings,
        "tie_word_embeddings": tied,
        "attention_bias": false,
        "mlp_bias": false,
        "torch_dtype": dtype.torch_name(),
    });
    for (key, id) in [
        ("bos_token_id", special.bos),
        ("eos_token_id", special.eos),
        ("pad_token_id", special.pad),
    ] {
        if let Some(id) = id {
            config[key] = json!(id);
        }
    }
    config
}

/// `cairn-import.json`: the source file and its sha256, what it held, what was written.
fn provenance(file: &GgufFile, report: &ImportReport) -> Json {
    let mut p = json!({
        "importer": concat!("cairn-gguf ", env!("CARGO_PKG_VERSION")),
        "source": file.path.file_name().map(|n| n.to_string_lossy().into_owned()),
        "source_sha256": report.sha256,
        "source_bytes": file.file_len,
        "gguf_version": file.version,
        "source_tensor_types": report.source_types,
        "dtype": report.dtype.name(),
        "tensors": report.tensors,
        "parameters": report.parameters,
        "tied_embeddings": report.tied_embeddings,
        "note": "the weights are the GGUF's (possibly quantized) values dequantized to f32, \
                 then stored in `dtype`; for a quantized GGUF they are not the original \
                 release's weights",
    });
    for key in ["general.name", "general.license"] {
        if let Some(value) = file.get(key).and_then(|v| v.as_str()) {
            p[key] = json!(value);
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even() {
        let mut out = Vec::new();
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even 1.0.
        // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties go to 1 + 2^-6.
        // 1 + 2^-8 + 2^-20 is above halfway: up to 1 + 2^-7.
        OutDtype::Bf16.encode(
            &[
                1.0 + 2f32.powi(-8),
                1.0 + 3.0 * 2f32.powi(-8),
                1.0 + 2f32.powi(-8) + 2f32.powi(-20),
            ],
            &mut out,
        );
        let bits: Vec<u16> = out
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect();
        assert_eq!(bits, [0x3F80, 0x3F82, 0x3F81]);
    }

    #[test]
    fn dtype_names_parse() {
        assert_eq!("bf16".parse::<OutDtype>(), Ok(OutDtype::Bf16));
        assert_eq!("f32".parse::<OutDtype>(), Ok(OutDtype::F32));
        assert_eq!(
            "f16".parse::<OutDtype>(),
            Err("unknown dtype `f16`; expected f32 or bf16".to_string())
        );
    }
}
