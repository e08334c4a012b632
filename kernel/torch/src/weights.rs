//! Hugging Face safetensors weights: locating tensors, checking them, copying them in, and
//! writing them out.
//!
//! [`CausalLm::from_pretrained`] is defined here: the model knows nothing of files.
//!
//! Loading is two-phase so that a bad file changes nothing: [`Catalog`] reads only the
//! headers (single `model.safetensors`, or `model.safetensors.index.json` plus shards) and
//! [`Catalog::plan`] checks every wanted tensor's presence, shape and dtype, reporting *all*
//! problems at once ([`Error::MissingTensors`], [`Error::ShapeMismatch`],
//! [`Error::MissingShards`]); only then does [`LoadPlan::execute`] read the data, one file at
//! a time. A parameter is never left at its placeholder value. Tensors in the files that the
//! model does not use are logged with a warning and skipped.
//!
//! Writing ([`write_safetensors`], [`save_model_dir`]) produces files transformers loads:
//! HF names, `{"format": "pt"}` metadata, written to a temporary name and renamed into place.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype as StDtype, SafeTensors, TensorView};
use serde_json::Value;
use tch::{Device, Kind, Tensor};

use crate::error::{Error, Result, ShapeMismatch};
use crate::model::{CausalLm, Dtype, ModelConfig};

/// Name of the single-file weights of a HF model directory.
pub const MODEL_FILE: &str = "model.safetensors";
/// Name of the shard index of a sharded HF model directory.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// Name of the model config of a HF model directory.
pub const CONFIG_FILE: &str = "config.json";

/// One tensor as a safetensors header describes it.
#[derive(Clone, Debug)]
struct Entry {
    file: PathBuf,
    dtype: String,
    shape: Vec<i64>,
}

/// The tensors available from one set of files, by name (headers only, no data).
#[derive(Debug)]
pub struct Catalog {
    entries: BTreeMap<String, Entry>,
    /// What the files are, for error messages (`<dir>/model.safetensors`, ...).
    description: String,
}

impl Catalog {
    /// The tensors of one safetensors file.
    pub fn file(path: &Path) -> Result<Catalog> {
        let entries = read_header(path)?
            .into_iter()
            .map(|(name, (dtype, shape))| {
                (
                    name,
                    Entry {
                        file: path.to_path_buf(),
                        dtype,
                        shape,
                    },
                )
            })
            .collect();
        Ok(Catalog {
            entries,
            description: path.display().to_string(),
        })
    }

    /// The tensors of a HF model directory: `model.safetensors`, or the shards listed by
    /// `model.safetensors.index.json`.
    pub fn model_dir(dir: &Path) -> Result<Catalog> {
        let single = dir.join(MODEL_FILE);
        if single.is_file() {
            return Catalog::file(&single);
        }
        let index_path = dir.join(INDEX_FILE);
        if !index_path.is_file() {
            return Err(Error::NoWeights {
                dir: dir.to_path_buf(),
            });
        }
        let text = std::fs::read_to_string(&index_path).map_err(|e| Error::io(&index_path, e))?;
        let index: Value = serde_json::from_str(&text).map_err(|source| Error::Json {
            path: index_path.clone(),
            source,
        })?;
        let weight_map = index
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| Error::Config {
                path: index_path.clone(),
                key: "weight_map".into(),
                reason: "missing or not an object".into(),
            })?;
        let mut by_shard: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (name, shard) in weight_map {
            let shard = shard.as_str().ok_or_else(|| Error::Config {
                path: index_path.clone(),
                key: format!("weight_map.{name}"),
                reason: format!("expected a file name, found {shard}"),
            })?;
            by_shard
                .entry(shard.to_string())
                .or_default()
                .push(name.clone());
        }
        let missing: Vec<String> = by_shard
            .keys()
            .filter(|s| !dir.join(s).is_file())
            .cloned()
            .collect();
        if !missing.is_empty() {
            let tensors = missing.iter().map(|s| by_shard[s].len()).sum();
            return Err(Error::MissingShards {
                index: index_path,
                shards: missing,
                tensors,
            });
        }
        let mut entries = BTreeMap::new();
        let mut absent = Vec::new();
        for (shard, names) in &by_shard {
            let path = dir.join(shard);
            let mut header = read_header(&path)?;
            for name in names {
                match header.remove(name) {
                    Some((dtype, shape)) => {
                        entries.insert(
                            name.clone(),
                            Entry {
                                file: path.clone(),
                                dtype,
                                shape,
                            },
                        );
                    }
                    None => absent.push(format!("{name} (listed in {shard})")),
                }
            }
        }
        if !absent.is_empty() {
            return Err(Error::MissingTensors {
                source_desc: index_path.display().to_string(),
                names: absent,
            });
        }
        Ok(Catalog {
            entries,
            description: format!("{} (sharded)", dir.display()),
        })
    }

    /// Tensor names available.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    /// Checks that every `(name, target)` has a tensor of the target's shape and a float
    /// dtype, and returns the copy plan. Errors list every missing or misshapen tensor.
    pub fn plan(&self, targets: Vec<(String, Tensor)>) -> Result<LoadPlan> {
        let mut missing = Vec::new();
        let mut mismatches = Vec::new();
        let mut copies: BTreeMap<PathBuf, Vec<(String, Tensor)>> = BTreeMap::new();
        for (name, target) in &targets {
            let Some(entry) = self.entries.get(name) else {
                missing.push(name.clone());
                continue;
            };
            if entry.shape != target.size() {
                mismatches.push(ShapeMismatch {
                    name: name.clone(),
                    expected: target.size(),
                    found: entry.shape.clone(),
                    file: entry.file.clone(),
                });
                continue;
            }
            if !matches!(entry.dtype.as_str(), "F32" | "F16" | "BF16") {
                return Err(Error::UnsupportedDtype {
                    path: entry.file.clone(),
                    name: name.clone(),
                    dtype: entry.dtype.clone(),
                });
            }
            copies
                .entry(entry.file.clone())
                .or_default()
                .push((name.clone(), target.shallow_clone()));
        }
        if !missing.is_empty() {
            return Err(Error::MissingTensors {
                source_desc: self.description.clone(),
                names: missing,
            });
        }
        if !mismatches.is_empty() {
            return Err(Error::ShapeMismatch { mismatches });
        }
        let wanted: HashMap<&str, ()> = targets.iter().map(|(n, _)| (n.as_str(), ())).collect();
        let unused: Vec<String> = self
            .entries
            .keys()
            .filter(|n| !wanted.contains_key(n.as_str()))
            .cloned()
            .collect();
        Ok(LoadPlan {
            copies,
            unused,
            description: self.description.clone(),
        })
    }
}

/// Checked copies from files into tensors; see [`Catalog::plan`].
#[derive(Debug)]
pub struct LoadPlan {
    /// Per file, `(tensor name, destination)`.
    copies: BTreeMap<PathBuf, Vec<(String, Tensor)>>,
    /// Tensors in the files that no destination wants.
    unused: Vec<String>,
    description: String,
}

impl LoadPlan {
    /// Reads each file once and copies its tensors into their destinations (converting dtype
    /// and device). Warns about unused tensors.
    pub fn execute(self) -> Result<()> {
        let _guard = tch::no_grad_guard();
        if !self.unused.is_empty() {
            let first: Vec<&str> = self.unused.iter().take(5).map(String::as_str).collect();
            tracing::warn!(
                source = %self.description,
                count = self.unused.len(),
                first = %first.join(", "),
                "ignoring tensors the model does not use"
            );
        }
        for (path, copies) in self.copies {
            let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
            let st = SafeTensors::deserialize(&bytes).map_err(|source| Error::Safetensors {
                path: path.clone(),
                source,
            })?;
            for (name, mut target) in copies {
                let view = st.tensor(&name).map_err(|source| Error::Safetensors {
                    path: path.clone(),
                    source,
                })?;
                let kind = match view.dtype() {
                    StDtype::F32 => Kind::Float,
                    StDtype::F16 => Kind::Half,
                    StDtype::BF16 => Kind::BFloat16,
                    other => {
                        return Err(Error::UnsupportedDtype {
                            path: path.clone(),
                            name,
                            dtype: format!("{other:?}"),
                        })
                    }
                };
                let shape: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
                let src = Tensor::f_from_data_size(view.data(), &shape, kind)?;
                target.f_copy_(&src)?;
            }
        }
        Ok(())
    }
}

impl CausalLm {
    /// Loads `config.json` and the safetensors weights (single file or sharded) from `dir`.
    /// Every parameter must be present with its exact shape; see the module docs. A `tokenizer.json` in
    /// `dir` must fit the embedding ([`check_tokenizer_fits`]), checked before anything is allocated.
    pub fn from_pretrained(dir: &Path, device: Device, dtype: Dtype) -> Result<CausalLm> {
        let config = ModelConfig::from_file(&dir.join(CONFIG_FILE))?;
        check_tokenizer_fits(dir, &config)?;
        let model = CausalLm::uninitialized(&config, device, dtype)?;
        load_model_dir(&model, dir)?;
        Ok(model)
    }
}

/// Errors ([`Error::TokenizerExceedsEmbedding`]) when `dir` holds a `tokenizer.json` with an
/// id (added tokens included, also those of `tokenizer_config.json`) that has no row in the embedding of `config` (`vocab_size`):
/// such a model would index past its embedding on the first prompt. A directory without a
/// `tokenizer.json` (a checkpoint's `policy/`) passes; an unreadable one is an error naming
/// the file. A tokenizer with fewer ids than rows is normal (Qwen3: 151,669 ids, 151,936 rows).
pub fn check_tokenizer_fits(dir: &Path, config: &ModelConfig) -> Result<()> {
    let path = dir.join("tokenizer.json");
    if !path.is_file() {
        return Ok(());
    }
    // As the hosts load it: with the added tokens of tokenizer_config.json.
    let tokenizer = cairn_kernel::text::Tokenizer::from_dir(dir)?;
    let vocab = tokenizer.inner().get_vocab(true);
    let Some(max_id) = vocab.values().copied().max() else {
        return Ok(());
    };
    if max_id as usize >= config.vocab_size {
        return Err(Error::TokenizerExceedsEmbedding {
            tokenizer: path,
            config: dir.join(CONFIG_FILE),
            max_id,
            tokenizer_ids: vocab.len(),
            model_vocab: config.vocab_size,
        });
    }
    Ok(())
}

/// Loads every parameter of `model` from the HF directory `dir`.
pub fn load_model_dir(model: &CausalLm, dir: &Path) -> Result<()> {
    Catalog::model_dir(dir)?
        .plan(model.named_parameters())?
        .execute()
}

/// Writes `model` as a HF model directory: `model.safetensors` (the model's dtype) and
/// `config.json`, loadable by `transformers.AutoModelForCausalLM.from_pretrained(dir)`.
pub fn save_model_dir(model: &CausalLm, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    write_safetensors(&dir.join(MODEL_FILE), &model.named_parameters())?;
    let config = model.config().to_hf_json(model.dtype());
    let text =
        serde_json::to_string_pretty(&config).expect("a serde_json::Value always serialises");
    write_atomic(&dir.join(CONFIG_FILE), text.as_bytes())
}

/// Writes named tensors (any device; f32, bf16, f16 or int64) to a safetensors file with
/// `{"format": "pt"}` metadata, via a temporary file renamed into place.
pub fn write_safetensors(path: &Path, tensors: &[(String, Tensor)]) -> Result<()> {
    let mut buffers = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        let t = t.to_device(Device::Cpu).contiguous();
        let dtype = match t.kind() {
            Kind::Float => StDtype::F32,
            Kind::BFloat16 => StDtype::BF16,
            Kind::Half => StDtype::F16,
            Kind::Int64 => StDtype::I64,
            other => {
                return Err(Error::UnsupportedDtype {
                    path: path.to_path_buf(),
                    name: name.clone(),
                    dtype: format!("{other:?}"),
                })
            }
        };
        let numel = t.numel();
        let mut bytes = vec![0u8; numel * t.kind().elt_size_in_bytes()];
        t.f_copy_data_u8(&mut bytes, numel)?;
        let shape: Vec<usize> = t.size().iter().map(|&d| d as usize).collect();
        buffers.push((name.as_str(), dtype, shape, bytes));
    }
    let views = buffers
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            TensorView::new(*dtype, shape.clone(), bytes)
                .map(|v| (*name, v))
                .map_err(|source| Error::Safetensors {
                    path: path.to_path_buf(),
                    source,
                })
        })
        .collect::<Result<Vec<_>>>()?;
    let metadata = Some(HashMap::from([("format".to_string(), "pt".to_string())]));
    let tmp = tmp_path(path);
    safetensors::tensor::serialize_to_file(views, &metadata, &tmp).map_err(|source| {
        Error::Safetensors {
            path: tmp.clone(),
            source,
        }
    })?;
    cairn_kernel::run::injected_write_fault(&tmp).map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
}

/// Writes `bytes` to `path` via a temporary file renamed into place, so a crash never leaves
/// a half-written file under the final name.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = tmp_path(path);
    cairn_kernel::run::write_file(&tmp, bytes).map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(".tmp");
    path.with_file_name(name)
}

/// `name → (dtype, shape)` from a safetensors header, reading only the header bytes.
fn read_header(path: &Path) -> Result<BTreeMap<String, (String, Vec<i64>)>> {
    let bad = |reason: String| Error::BadFile {
        path: path.to_path_buf(),
        reason,
    };
    let mut file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut len = [0u8; 8];
    file.read_exact(&mut len).map_err(|e| Error::io(path, e))?;
    let len = u64::from_le_bytes(len);
    // safetensors itself refuses headers over 100 MB. The length is not shown: it is the
    // file's first 8 bytes, and a file that is not a safetensors file (a symlink to
    // `/etc/passwd` handed to `POST /update_weights_from_disk`) would have its start printed.
    if len > 100_000_000 {
        return Err(bad(
            "its first 8 bytes do not give a plausible header length (over 100 MB); not a \
             safetensors file"
                .into(),
        ));
    }
    let mut header = vec![0u8; len as usize];
    file.read_exact(&mut header)
        .map_err(|e| Error::io(path, e))?;
    let header: Value = serde_json::from_slice(&header).map_err(|e| {
        bad(format!(
            "unreadable safetensors header ({e}); not a safetensors file"
        ))
    })?;
    let obj = header
        .as_object()
        .ok_or_else(|| bad("safetensors header is not a JSON object".into()))?;
    let mut out = BTreeMap::new();
    for (name, info) in obj {
        if name == "__metadata__" {
            continue;
        }
        let dtype = info.get("dtype").and_then(Value::as_str);
        let shape: Option<Vec<i64>> = info
            .get("shape")
            .and_then(Value::as_array)
            .and_then(|dims| dims.iter().map(|d| d.as_i64()).collect());
        match (dtype, shape) {
            (Some(dtype), Some(shape)) => {
                out.insert(name.clone(), (dtype.to_string(), shape));
            }
            _ => return Err(bad(format!("header entry `{name}` lacks a dtype or shape"))),
        }
    }
    Ok(out)
}
