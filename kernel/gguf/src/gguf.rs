//! A reader for GGUF, the file format of llama.cpp (ggml), versions 2 and 3.
//!
//! # The format
//!
//! Everything is little-endian. A file is a header, the metadata, the tensor infos, padding,
//! then the tensor data:
//!
//! | field | encoding |
//! |---|---|
//! | magic | the 4 bytes `GGUF` (0x47 0x47 0x55 0x46) |
//! | version | `u32`: 3 (current), 2 (same layout); version 1 used `u32` counts and is refused |
//! | tensor count | `u64` |
//! | metadata count | `u64` |
//! | metadata | that many key/value pairs: key (a string), value type (`u32`), value |
//! | tensor infos | that many: name (a string), `n_dims` (`u32`, at most 4), `n_dims` × `u64` dims, type (`u32`, a ggml type), offset (`u64`) |
//! | padding | zeros up to the next multiple of the alignment |
//! | tensor data | each tensor at `data start + offset`; offsets are multiples of the alignment |
//!
//! A string is a `u64` byte length then that many bytes of UTF-8, not NUL-terminated.
//! Value types: 0 `u8`, 1 `i8`, 2 `u16`, 3 `i16`, 4 `u32`, 5 `i32`, 6 `f32`, 7 bool (one byte,
//! 0 or 1), 8 string, 9 array, 10 `u64`, 11 `i64`, 12 `f64`. An array is its element type
//! (`u32`), its length (`u64`), then the elements, with no per-element type tag; arrays may
//! nest.
//!
//! The alignment is the metadata key `general.alignment` (an unsigned integer, a power of two),
//! 32 when absent. The data starts at the first multiple of it after the tensor infos.
//!
//! Dims are in ggml order: `ne[0]` is the fastest-varying (contiguous) dimension, so a matrix
//! with `ne = [in, out]` is stored row-major as `out` rows of `in` values, which is PyTorch's
//! shape `[out, in]`: the reverse of the ggml dims. A tensor's byte size follows from its type
//! (block size and bytes per block, see [`crate::dequant::TensorType`]) and its element count;
//! quantized types need `ne[0]` to be a multiple of the block size.
//!
//! Sources: the GGUF specification in the ggml repository (`docs/gguf.md`) and its
//! `gguf.cpp` reader, which this one follows in what it checks (magic, version, power-of-two
//! alignment, aligned offsets, at most 4 dims).

use std::path::{Path, PathBuf};

use crate::error::{GgufError, Part, Result};

/// The alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// Nested arrays deeper than this are refused (no real file nests at all).
const MAX_ARRAY_DEPTH: usize = 8;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
}

impl Value {
    /// The GGUF type name, for error messages (`u32`, `string`, `array of string`, ...).
    pub fn type_name(&self) -> String {
        match self {
            Value::U8(_) => "u8".into(),
            Value::I8(_) => "i8".into(),
            Value::U16(_) => "u16".into(),
            Value::I16(_) => "i16".into(),
            Value::U32(_) => "u32".into(),
            Value::I32(_) => "i32".into(),
            Value::U64(_) => "u64".into(),
            Value::I64(_) => "i64".into(),
            Value::F32(_) => "f32".into(),
            Value::F64(_) => "f64".into(),
            Value::Bool(_) => "bool".into(),
            Value::String(_) => "string".into(),
            Value::Array(items) => match items.first() {
                Some(first) => format!("array of {}", first.type_name()),
                None => "an empty array".into(),
            },
        }
    }

    /// A non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// An integer of any width that fits `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => i64::try_from(v).ok(),
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v),
            _ => None,
        }
    }

    /// A float. An `f32` is widened through its shortest decimal form, so the 1e-5 that a
    /// converter stored as `f32` reads back as 1e-5, not 9.999999747378752e-6.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.to_string().parse().expect("an f32's Display parses")),
            Value::F64(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(items) => Some(items),
            _ => None,
        }
    }
}

/// One tensor info: where a tensor's data is and how to read it.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// Dims in ggml order (`ne[0]` fastest); reverse them for the PyTorch shape.
    pub dims: Vec<u64>,
    /// The ggml type id (see [`crate::dequant::ggml_type_name`]).
    pub type_id: u32,
    /// Offset of the data from [`GgufFile::data_offset`], in bytes.
    pub offset: u64,
}

impl TensorInfo {
    /// The element count (the product of the dims), `None` on overflow.
    pub fn elements(&self) -> Option<u64> {
        self.dims.iter().try_fold(1u64, |n, &d| n.checked_mul(d))
    }
}

/// A parsed GGUF file: the metadata and tensor infos, not the tensor data.
#[derive(Debug, Clone)]
pub struct GgufFile {
    /// The file the bytes came from, for error messages.
    pub path: PathBuf,
    pub version: u32,
    /// Metadata in file order; keys are unique.
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<TensorInfo>,
    /// `general.alignment`, or [`DEFAULT_ALIGNMENT`].
    pub alignment: u64,
    /// Where the tensor data starts, from the start of the file, in bytes.
    pub data_offset: u64,
    /// The file's length in bytes.
    pub file_len: u64,
}

impl GgufFile {
    /// Parses the header, metadata and tensor infos of `bytes`, the contents of `path`.
    ///
    /// Errors: [`GgufError::BadMagic`], [`GgufError::UnsupportedVersion`],
    /// [`GgufError::BigEndian`], [`GgufError::Truncated`] naming the part that runs past the end,
    /// [`GgufError::Malformed`] (invalid UTF-8, unknown value type, duplicate key, bad alignment
    /// or offset). Tensor data is not checked here; see [`GgufFile::tensor_data`].
    pub fn parse(bytes: &[u8], path: &Path) -> Result<GgufFile> {
        let mut r = Reader {
            bytes,
            pos: 0,
            path,
        };
        let magic = r.take(4, &|| Part::Header)?;
        if magic != b"GGUF" {
            return Err(GgufError::BadMagic {
                file: path.to_path_buf(),
                found: magic.to_vec(),
            });
        }
        let version = r.u32(&|| Part::Header)?;
        if version != 2 && version != 3 {
            let swapped = version.swap_bytes();
            if swapped == 2 || swapped == 3 {
                return Err(GgufError::BigEndian {
                    file: path.to_path_buf(),
                    version: swapped,
                });
            }
            return Err(GgufError::UnsupportedVersion {
                file: path.to_path_buf(),
                version,
            });
        }
        let tensor_count = r.u64(&|| Part::Header)?;
        let kv_count = r.u64(&|| Part::Header)?;

        let mut metadata: Vec<(String, Value)> = Vec::new();
        for index in 0..kv_count {
            let key = r.string(&|| Part::KeyName { index })?;
            if metadata.iter().any(|(k, _)| *k == key) {
                return Err(r.malformed(Part::Value { key }, "the key appears twice".into()));
            }
            let part = || Part::Value { key: key.clone() };
            let type_id = r.u32(&part)?;
            let value = r.value(type_id, 0, &part)?;
            metadata.push((key, value));
        }

        let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some((key, value)) => match value.as_u64() {
                Some(a) if a.is_power_of_two() => a,
                _ => {
                    return Err(r.malformed(
                        Part::Value { key: key.clone() },
                        format!("{} {value:?} is not a power of two", value.type_name()),
                    ))
                }
            },
        };

        let mut tensors = Vec::new();
        for index in 0..tensor_count {
            let part = || Part::TensorInfo { index };
            let name = r.string(&part)?;
            let n_dims = r.u32(&part)?;
            if n_dims > 4 {
                return Err(r.malformed(
                    Part::TensorInfo { index },
                    format!("tensor `{name}` has {n_dims} dims; ggml allows at most 4"),
                ));
            }
            let dims = (0..n_dims)
                .map(|_| r.u64(&part))
                .collect::<Result<Vec<_>>>()?;
            let type_id = r.u32(&part)?;
            let offset = r.u64(&part)?;
            if !offset.is_multiple_of(alignment) {
                return Err(r.malformed(
                    Part::TensorInfo { index },
                    format!(
                        "tensor `{name}` has offset {offset}, not a multiple of the alignment \
                         {alignment}"
                    ),
                ));
            }
            if tensors.iter().any(|t: &TensorInfo| t.name == name) {
                return Err(r.malformed(
                    Part::TensorInfo { index },
                    format!("tensor `{name}` appears twice"),
                ));
            }
            tensors.push(TensorInfo {
                name,
                dims,
                type_id,
                offset,
            });
        }
        let data_offset = (r.pos as u64).div_ceil(alignment) * alignment;
        Ok(GgufFile {
            path: path.to_path_buf(),
            version,
            metadata,
            tensors,
            alignment,
            data_offset,
            file_len: bytes.len() as u64,
        })
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The tensor info named `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The `n_bytes` of `tensor`'s data in `bytes` (the whole file), or
    /// [`GgufError::Truncated`] naming the tensor when the file ends before them.
    pub fn tensor_data<'a>(
        &self,
        bytes: &'a [u8],
        tensor: &TensorInfo,
        n_bytes: u64,
    ) -> Result<&'a [u8]> {
        let start = self.data_offset.saturating_add(tensor.offset);
        let end = start.saturating_add(n_bytes);
        if end > bytes.len() as u64 {
            return Err(GgufError::Truncated {
                file: self.path.clone(),
                part: Part::TensorData {
                    name: tensor.name.clone(),
                },
                start,
                end,
                len: bytes.len() as u64,
            });
        }
        // Both fit in usize: `end` is at most `bytes.len()`.
        Ok(&bytes[start as usize..end as usize])
    }

    /// A required key, or [`GgufError::MissingKey`].
    pub fn require(&self, key: &str) -> Result<&Value> {
        self.get(key).ok_or_else(|| GgufError::MissingKey {
            file: self.path.clone(),
            key: key.to_string(),
        })
    }

    /// The error for `key` holding a value of the wrong type.
    pub fn key_type_error(&self, key: &str, expected: &'static str) -> GgufError {
        GgufError::KeyType {
            file: self.path.clone(),
            key: key.to_string(),
            expected,
            found: self
                .get(key)
                .map_or_else(|| "nothing".into(), Value::type_name),
        }
    }

    /// An unsigned integer key, if present.
    pub fn opt_u64(&self, key: &str) -> Result<Option<u64>> {
        self.get(key)
            .map(|v| {
                v.as_u64()
                    .ok_or_else(|| self.key_type_error(key, "a non-negative integer"))
            })
            .transpose()
    }

    /// A required unsigned integer key.
    pub fn req_u64(&self, key: &str) -> Result<u64> {
        self.require(key)?;
        Ok(self.opt_u64(key)?.expect("the key is present"))
    }

    /// A float key (`f32` or `f64`), if present.
    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        self.get(key)
            .map(|v| {
                v.as_f64()
                    .ok_or_else(|| self.key_type_error(key, "a float"))
            })
            .transpose()
    }

    /// A string key, if present.
    pub fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        self.get(key)
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| self.key_type_error(key, "a string"))
            })
            .transpose()
    }

    /// A required string key.
    pub fn req_str(&self, key: &str) -> Result<&str> {
        self.require(key)?;
        Ok(self.opt_str(key)?.expect("the key is present"))
    }

    /// A bool key, if present.
    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        self.get(key)
            .map(|v| {
                v.as_bool()
                    .ok_or_else(|| self.key_type_error(key, "a bool"))
            })
            .transpose()
    }

    /// A required array of strings.
    pub fn req_str_array(&self, key: &str) -> Result<Vec<&str>> {
        let items = self
            .require(key)?
            .as_array()
            .ok_or_else(|| self.key_type_error(key, "an array of string"))?;
        items
            .iter()
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| self.key_type_error(key, "an array of string"))
            })
            .collect()
    }

    /// An array of integers, if present.
    pub fn opt_int_array(&self, key: &str) -> Result<Option<Vec<i64>>> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        let items = value
            .as_array()
            .ok_or_else(|| self.key_type_error(key, "an array of integers"))?;
        items
            .iter()
            .map(|v| {
                v.as_i64()
                    .ok_or_else(|| self.key_type_error(key, "an array of integers"))
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }
}

/// A cursor over the file's bytes. `part` closures name what is being read, for errors; they
/// run only when an error is built.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: u64, part: &dyn Fn() -> Part) -> Result<&'a [u8]> {
        let start = self.pos as u64;
        let end = start.saturating_add(n);
        if end > self.bytes.len() as u64 {
            return Err(GgufError::Truncated {
                file: self.path.to_path_buf(),
                part: part(),
                start,
                end,
                len: self.bytes.len() as u64,
            });
        }
        let slice = &self.bytes[self.pos..end as usize];
        self.pos = end as usize;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self, part: &dyn Fn() -> Part) -> Result<[u8; N]> {
        Ok(self
            .take(N as u64, part)?
            .try_into()
            .expect("take returns N bytes"))
    }

    fn u32(&mut self, part: &dyn Fn() -> Part) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(part)?))
    }

    fn u64(&mut self, part: &dyn Fn() -> Part) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(part)?))
    }

    fn string(&mut self, part: &dyn Fn() -> Part) -> Result<String> {
        let len = self.u64(part)?;
        let bytes = self.take(len, part)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|e| self.malformed(part(), format!("a string is not UTF-8: {e}")))
    }

    fn malformed(&self, part: Part, reason: String) -> GgufError {
        GgufError::Malformed {
            file: self.path.to_path_buf(),
            part,
            reason,
        }
    }

    fn value(&mut self, type_id: u32, depth: usize, part: &dyn Fn() -> Part) -> Result<Value> {
        Ok(match type_id {
            0 => Value::U8(u8::from_le_bytes(self.array(part)?)),
            1 => Value::I8(i8::from_le_bytes(self.array(part)?)),
            2 => Value::U16(u16::from_le_bytes(self.array(part)?)),
            3 => Value::I16(i16::from_le_bytes(self.array(part)?)),
            4 => Value::U32(self.u32(part)?),
            5 => Value::I32(i32::from_le_bytes(self.array(part)?)),
            6 => Value::F32(f32::from_le_bytes(self.array(part)?)),
            7 => match self.array::<1>(part)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.malformed(part(), format!("bool byte {b}, not 0 or 1"))),
            },
            8 => Value::String(self.string(part)?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.malformed(
                        part(),
                        format!("arrays nested deeper than {MAX_ARRAY_DEPTH}"),
                    ));
                }
                let element_type = self.u32(part)?;
                let len = self.u64(part)?;
                // Every element takes at least one byte: a length past the end of the file is
                // truncation, found before allocating for it.
                let left = (self.bytes.len() - self.pos) as u64;
                if len > left {
                    let start = self.pos as u64;
                    return Err(GgufError::Truncated {
                        file: self.path.to_path_buf(),
                        part: part(),
                        start,
                        end: start.saturating_add(len),
                        len: self.bytes.len() as u64,
                    });
                }
                let mut items = Vec::with_capacity(len as usize);
                for _ in 0..len {
                    items.push(self.value(element_type, depth + 1, part)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64(part)?),
            11 => Value::I64(i64::from_le_bytes(self.array(part)?)),
            12 => Value::F64(f64::from_le_bytes(self.array(part)?)),
            other => {
                return Err(self.malformed(
                    part(),
                    format!("unknown value type {other}; GGUF defines 0..=12"),
                ))
            }
        })
    }
}
