//! bf16 projections on the CPU through oneDNN, with the weights packed once and kept while they
//! stay the same.
//!
//! `F.linear` in bf16 on the CPU hands each product to oneDNN (or, for one row, to MKL's bf16
//! matrix-vector product), and oneDNN first reorders the weight `[out, in]` into its blocked
//! layout, on every call. At decode, where a step multiplies a few rows by every weight of the
//! model, that reorder costs as much as the product. PyTorch's own inference paths (Inductor's
//! CPU backend, vLLM-CPU's `onednn_mm`) reorder each weight once and keep it. This module does
//! the same through two operators that libtorch registers when it is built with oneDNN:
//!
//! - `mkldnn::_reorder_linear_weight(W)`: `W` `[out, in]` → an opaque oneDNN tensor (the same
//!   values, blocked for the ISA);
//! - `mkldnn::_linear_pointwise(X, W_packed, B, "none", [], None)`: `X` `[.., in]` →
//!   `[.., out]`, `X Wᵀ + B`.
//!
//! Both are reached through libtorch's C ABI (`aoti_torch_call_dispatcher` and
//! `aoti_torch_cpu__linear_pointwise`, exported by `libtorch_cpu`), so no C++ is compiled.
//!
//! **Scope.** [`PackCache::get`] packs only for bf16 models on the CPU, when libtorch says
//! oneDNN has bf16 kernels for this CPU and the copy takes at most half of the memory
//! available; otherwise (f32, CUDA, an old CPU, too little memory) it holds no pack and every
//! projection stays `F.linear`. f32 is left alone on purpose: there MKL runs the products, and
//! the main job's bit-exact goldens are f32. Generation passes use the pack; scoring and
//! training do not.
//!
//! **Fusion.** A layer's `q, k, v` are packed as one `[(H + 2·H_kv)·D, hidden]` product and
//! its `gate, up` as one `[2·I, hidden]` product, split back into views: four oneDNN calls a
//! layer instead of seven, with the same values (each output is still one row's dot product).
//!
//! **Staleness.** A pack is a copy of the weights at the time it was made. The model keeps it
//! between generation passes ([`PackCache`]) under a [`Stamp`]: every packed weight's storage
//! address, dtype and libtorch version counter, which every in-place write bumps (an optimizer
//! step, a checkpoint or weight-file load). Each pass compares the stamp first (two hundred
//! counter reads for SmolLM2) and repacks on any difference, so a pass never multiplies by
//! weights of another policy version. Packing SmolLM2-135M takes 110–240 ms here, a few
//! decode steps, so keeping the pack matters for short passes (a rollout turn, one request).
//!
//! **Numerics.** oneDNN accumulates each output in f32 and rounds once to bf16, as the plain
//! path does; the order of the sums may differ, so a packed product can differ from
//! `F.linear` by one bf16 rounding step. `tests/it/forward.rs` bounds the difference on whole
//! models.

use std::ffi::c_char;
use std::sync::OnceLock;
use std::sync::{Mutex, MutexGuard, PoisonError};

use tch::{Device, Kind, Tensor};
use torch_sys::C_tensor;

use super::linear::Linear;
use crate::error::{Error, Result};

/// `StableIValue`: one 64-bit word of libtorch's stable boxed calling convention (a tensor is
/// its owning handle's address, `None` is 0, a bool or an int is its value).
type StableIValue = u64;

extern "C" {
    /// Calls the operator `op.overload` on a boxed stack; the inputs' tensor handles are
    /// taken over, the outputs are written at the front of the stack as new owned handles.
    /// Returns 0 on success (libtorch prints the exception otherwise).
    fn aoti_torch_call_dispatcher(
        op: *const c_char,
        overload: *const c_char,
        stack: *mut StableIValue,
    ) -> i32;
    /// A new owned handle to the same tensor (shares storage).
    fn aoti_torch_new_tensor_handle(orig: *mut C_tensor, new: *mut *mut C_tensor) -> i32;
    /// `mkldnn::_linear_pointwise`; borrows its inputs, returns a new owned handle in `ret0`.
    fn aoti_torch_cpu__linear_pointwise(
        x: *mut C_tensor,
        w: *mut C_tensor,
        b: *mut *mut C_tensor,
        attr: *const c_char,
        scalars: *const *const f64,
        scalars_len: i64,
        algorithm: *const *const c_char,
        ret0: *mut *mut C_tensor,
    ) -> i32;
}

/// Whether libtorch's oneDNN has bf16 kernels for this CPU
/// (`torch.ops.mkldnn._is_mkldnn_bf16_supported()`), asked once per process.
pub fn onednn_bf16_supported() -> bool {
    static SUPPORTED: OnceLock<bool> = OnceLock::new();
    *SUPPORTED.get_or_init(|| {
        let mut stack: [StableIValue; 1] = [0];
        // SAFETY: the operator takes no argument and returns one bool in stack[0].
        let rc = unsafe {
            aoti_torch_call_dispatcher(
                c"mkldnn::_is_mkldnn_bf16_supported".as_ptr(),
                c"".as_ptr(),
                stack.as_mut_ptr(),
            )
        };
        rc == 0 && stack[0] & 0xff != 0
    })
}

/// `w` `[out, in]` (bf16, CPU) packed for oneDNN.
fn pack(w: &Tensor) -> Result<Tensor> {
    let w = w.contiguous();
    let mut handle: *mut C_tensor = std::ptr::null_mut();
    // SAFETY: `w` is a live tensor; the new handle is owned by the stack below, which the
    // dispatcher takes over.
    let rc = unsafe { aoti_torch_new_tensor_handle(w.as_ptr() as *mut C_tensor, &mut handle) };
    if rc != 0 || handle.is_null() {
        return Err(ffi_error("aoti_torch_new_tensor_handle"));
    }
    // (Tensor self, int? batch_size = None)
    let mut stack: [StableIValue; 2] = [handle as StableIValue, 0];
    // SAFETY: the stack matches the schema; on success stack[0] is a new owned tensor handle,
    // which `Tensor::from_ptr` takes over (both sides allocate `at::Tensor` with libtorch's
    // `new`, and tch frees it with libtorch's `delete`).
    unsafe {
        let rc = aoti_torch_call_dispatcher(
            c"mkldnn::_reorder_linear_weight".as_ptr(),
            c"".as_ptr(),
            stack.as_mut_ptr(),
        );
        if rc != 0 || stack[0] == 0 {
            return Err(ffi_error("mkldnn::_reorder_linear_weight"));
        }
        Ok(Tensor::from_ptr(stack[0] as *mut C_tensor))
    }
}

/// `xs` `[.., in]` × packed `[out, in]`ᵀ (+ `bias` `[out]`) → `[.., out]`.
fn linear_packed(xs: &Tensor, packed: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let xs = xs.contiguous();
    let mut bias_handle: *mut C_tensor = bias.map_or(std::ptr::null_mut(), |b| b.as_ptr() as _);
    let bias_ptr: *mut *mut C_tensor = if bias.is_some() {
        &mut bias_handle
    } else {
        std::ptr::null_mut()
    };
    let mut out: *mut C_tensor = std::ptr::null_mut();
    // SAFETY: the inputs are borrowed for the call; `out` is a new owned handle on success.
    unsafe {
        let rc = aoti_torch_cpu__linear_pointwise(
            xs.as_ptr() as *mut C_tensor,
            packed.as_ptr() as *mut C_tensor,
            bias_ptr,
            c"none".as_ptr(),
            std::ptr::null(),
            0,
            std::ptr::null(),
            &mut out,
        );
        if rc != 0 || out.is_null() {
            return Err(ffi_error("mkldnn::_linear_pointwise"));
        }
        Ok(Tensor::from_ptr(out))
    }
}

fn ffi_error(op: &'static str) -> Error {
    Error::Torch(tch::TchError::Torch(format!(
        "{op} failed (libtorch printed the reason on stderr)"
    )))
}

/// Projections that read the same input, packed as one product: a layer's `q, k, v`, its
/// `gate, up`, or a single projection. The weights `[Σ out, in]` (and biases, zeros where a
/// projection has none) are concatenated before packing, and the product is split back.
#[derive(Debug)]
struct FusedPack {
    weight: Tensor,
    bias: Option<Tensor>,
    /// Each projection's `out`, in order.
    sizes: Vec<i64>,
}

impl FusedPack {
    fn new(linears: &[&Linear]) -> Result<FusedPack> {
        let weights: Vec<&Tensor> = linears.iter().map(|l| &l.weight).collect();
        let sizes: Vec<i64> = weights.iter().map(|w| w.size()[0]).collect();
        let bias = linears.iter().any(|l| l.bias.is_some()).then(|| {
            let biases: Vec<Tensor> = linears
                .iter()
                .map(|l| match &l.bias {
                    Some(b) => b.shallow_clone(),
                    None => l
                        .weight
                        .new_zeros([l.weight.size()[0]], (l.weight.kind(), l.weight.device())),
                })
                .collect();
            Tensor::cat(&biases, 0)
        });
        let weight = if weights.len() == 1 {
            pack(weights[0])?
        } else {
            pack(&Tensor::cat(&weights, 0))?
        };
        Ok(FusedPack {
            weight,
            bias,
            sizes,
        })
    }
}

/// `xs` `[.., in]` through each of `linears` (`[.., out_i]` each): one packed product split
/// into views when `pack` is given, else one `F.linear` each.
fn project(linears: &[&Linear], pack: Option<&FusedPack>, xs: &Tensor) -> Vec<Tensor> {
    if let Some(pack) = pack {
        // A pack that libtorch accepted once does not fail later on well-formed inputs; if it
        // ever does, the plain products give the same values.
        if let Ok(out) = linear_packed(xs, &pack.weight, pack.bias.as_ref()) {
            return if pack.sizes.len() == 1 {
                vec![out]
            } else {
                out.split_with_sizes(&pack.sizes, -1)
            };
        }
    }
    linears.iter().map(|l| l.forward(xs)).collect()
}

/// One decoder layer's projections, packed: `q, k, v` as one product, `o`, `gate, up` as one,
/// `down`.
#[derive(Debug)]
struct PackedLayer {
    qkv: FusedPack,
    o: FusedPack,
    gate_up: FusedPack,
    down: FusedPack,
}

impl PackedLayer {
    fn new(layer: &LayerLinears<'_>) -> Result<PackedLayer> {
        Ok(PackedLayer {
            qkv: FusedPack::new(&[layer.q, layer.k, layer.v])?,
            o: FusedPack::new(&[layer.o])?,
            gate_up: FusedPack::new(&[layer.gate, layer.up])?,
            down: FusedPack::new(&[layer.down])?,
        })
    }
}

/// Every projection of a model packed for oneDNN, with the [`Stamp`] of the weights it was
/// packed from.
#[derive(Debug)]
pub struct PackedWeights {
    layers: Vec<PackedLayer>,
    lm_head: FusedPack,
    stamp: Stamp,
}

/// What a pack was made from: for every weight and bias it copies, the storage address, the
/// dtype and libtorch's version counter (which every in-place write bumps: an optimizer step,
/// a `copy_` from a checkpoint or a weight file). Equal stamps: the same values.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp(Vec<(usize, i64, Kind)>);

impl Stamp {
    fn of(layers: &[LayerLinears<'_>], lm_head: &Linear) -> Stamp {
        let mut entries = Vec::new();
        let mut add = |l: &Linear| {
            for t in std::iter::once(&l.weight).chain(&l.bias) {
                entries.push((t.data_ptr() as usize, t.internal_version(), t.kind()));
            }
        };
        for layer in layers {
            for l in layer.all() {
                add(l);
            }
        }
        add(lm_head);
        Stamp(entries)
    }
}

/// A model's pack, kept between generation passes while its weights stay the same.
#[derive(Debug, Default)]
pub(crate) struct PackCache(Mutex<Option<PackedWeights>>);

/// The pack of a generation pass, held for the pass: the cache stays locked meanwhile, so a
/// second pass on the same model (none runs concurrently in Cairn: the policy actor owns it)
/// waits for the first.
#[derive(Debug)]
pub struct Packed<'a>(MutexGuard<'a, Option<PackedWeights>>);

impl Packed<'_> {
    /// The packed weights, or `None` where nothing is packed (f32, CUDA, no oneDNN bf16
    /// kernels, not enough memory): the plain path runs.
    pub fn weights(&self) -> Option<&PackedWeights> {
        self.0.as_ref()
    }
}

impl PackCache {
    /// The pack of `layers` and `lm_head` as they are now: the kept one if its [`Stamp`] still
    /// matches, else a new one kept in its place (see [`PackedWeights::for_inference`]).
    pub(crate) fn get(&self, layers: &[LayerLinears<'_>], lm_head: &Linear) -> Packed<'_> {
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if !packable(&lm_head.weight) {
            // f32, CUDA or no oneDNN bf16 kernels: no stamp to read, and a pack kept from
            // before a dtype or device change is dropped.
            *kept = None;
            return Packed(kept);
        }
        let stamp = Stamp::of(layers, lm_head);
        if kept.as_ref().is_none_or(|p| p.stamp != stamp) {
            // Drop the stale pack before making the new one: never two copies at once.
            *kept = None;
            *kept = PackedWeights::for_inference(layers, lm_head, stamp);
        }
        Packed(kept)
    }
}

/// One decoder layer's seven projections, the attention's `q, k, v, o` and the MLP's
/// `gate, up, down`, and the layer's index `i` in `model.layers.{i}`: what a pack copies.
/// The decoder layer hands them in, so that this module knows only [`Linear`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct LayerLinears<'a> {
    pub(crate) index: usize,
    pub(crate) q: &'a Linear,
    pub(crate) k: &'a Linear,
    pub(crate) v: &'a Linear,
    pub(crate) o: &'a Linear,
    pub(crate) gate: &'a Linear,
    pub(crate) up: &'a Linear,
    pub(crate) down: &'a Linear,
}

impl<'a> LayerLinears<'a> {
    /// The seven projections: `q, k, v, o, gate, up, down`.
    fn all(&self) -> [&'a Linear; 7] {
        [
            self.q, self.k, self.v, self.o, self.gate, self.up, self.down,
        ]
    }
}

/// A layer's projections for one no-grad forward: its plain layers, or their pack.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LayerProjs<'a> {
    layer: LayerLinears<'a>,
    packed: Option<&'a PackedLayer>,
}

impl<'a> LayerProjs<'a> {
    pub(crate) fn of(layer: LayerLinears<'a>, packed: Option<&'a PackedWeights>) -> Self {
        LayerProjs {
            layer,
            packed: packed.map(|p| &p.layers[layer.index]),
        }
    }

    /// `[B, T, hidden]` → `(q [B, T, H·D], k [B, T, H_kv·D], v [B, T, H_kv·D])`.
    pub(crate) fn qkv(&self, xs: &Tensor) -> (Tensor, Tensor, Tensor) {
        let l = &self.layer;
        let linears = [l.q, l.k, l.v];
        let mut out = project(&linears, self.packed.map(|p| &p.qkv), xs).into_iter();
        match (out.next(), out.next(), out.next()) {
            (Some(q), Some(k), Some(v)) => (q, k, v),
            _ => unreachable!("three projections give three outputs"),
        }
    }

    /// `o_proj`: `[B, T, H·D]` → `[B, T, hidden]`.
    pub(crate) fn o(&self, xs: &Tensor) -> Tensor {
        one(project(&[self.layer.o], self.packed.map(|p| &p.o), xs))
    }

    /// `[B, T, hidden]` → `(gate [B, T, I], up [B, T, I])`.
    pub(crate) fn gate_up(&self, xs: &Tensor) -> (Tensor, Tensor) {
        let linears = [self.layer.gate, self.layer.up];
        let mut out = project(&linears, self.packed.map(|p| &p.gate_up), xs).into_iter();
        match (out.next(), out.next()) {
            (Some(gate), Some(up)) => (gate, up),
            _ => unreachable!("two projections give two outputs"),
        }
    }

    /// `down_proj`: `[B, T, I]` → `[B, T, hidden]`.
    pub(crate) fn down(&self, xs: &Tensor) -> Tensor {
        one(project(
            &[self.layer.down],
            self.packed.map(|p| &p.down),
            xs,
        ))
    }
}

/// The one output of a single projection.
fn one(outputs: Vec<Tensor>) -> Tensor {
    match outputs.into_iter().next() {
        Some(out) => out,
        None => unreachable!("a projection gives one output"),
    }
}

impl PackedWeights {
    /// Packs every projection and the LM head of `layers` (`lm_head` `[V, hidden]`) of a
    /// [`packable`] model when the copy takes at most half of the memory available; `None`
    /// otherwise (see the module docs). A failure to pack is `None` too, with a warning: the
    /// plain path is always right.
    fn for_inference(layers: &[LayerLinears<'_>], lm_head: &Linear, stamp: Stamp) -> Option<Self> {
        let bytes = projection_bytes(layers, lm_head);
        if !fits(bytes, mem_available()) {
            warn_once(&format!(
                "a pack of {} MB would take more than half of the memory available",
                bytes >> 20
            ));
            return None;
        }
        let _guard = tch::no_grad_guard();
        let packed = (|| -> Result<PackedWeights> {
            Ok(PackedWeights {
                layers: layers.iter().map(PackedLayer::new).collect::<Result<_>>()?,
                lm_head: FusedPack::new(&[lm_head])?,
                stamp,
            })
        })();
        match packed {
            Ok(p) => Some(p),
            Err(e) => {
                warn_once(&e.to_string());
                None
            }
        }
    }

    /// `[.., hidden]` → logits `[.., V]` in the model's dtype, through the packed LM head.
    pub(crate) fn logits(&self, lm_head: &Linear, hidden: &Tensor) -> Tensor {
        one(project(&[lm_head], Some(&self.lm_head), hidden))
    }
}

/// Whether a model whose weights are like `w` can be packed at all: bf16, on the CPU, where
/// libtorch's oneDNN has bf16 kernels.
fn packable(w: &Tensor) -> bool {
    w.device() == Device::Cpu && w.kind() == Kind::BFloat16 && onednn_bf16_supported()
}

/// Bytes of every projection weight and the LM head (what a pack copies).
fn projection_bytes(layers: &[LayerLinears<'_>], lm_head: &Linear) -> u64 {
    let bytes = |l: &Linear| l.weight.numel() as u64 * l.weight.kind().elt_size_in_bytes() as u64;
    let per_layer = |layer: &LayerLinears<'_>| layer.all().into_iter().map(bytes).sum::<u64>();
    layers.iter().map(per_layer).sum::<u64>() + bytes(lm_head)
}

/// Whether a pack of `bytes` may be made with `available` bytes of memory free (Linux's
/// `MemAvailable`; unknown elsewhere): at most half of it, so that packing a model that fits
/// once never runs the machine out of memory. Unknown: yes.
fn fits(bytes: u64, available: Option<u64>) -> bool {
    available.is_none_or(|a| bytes <= a / 2)
}

/// `MemAvailable` of `/proc/meminfo`, in bytes.
fn mem_available() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn warn_once(why: &str) {
    static WARNED: OnceLock<()> = OnceLock::new();
    WARNED.get_or_init(|| {
        tracing::warn!("bf16 weights are not packed for oneDNN ({why}); projections use F.linear");
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{CausalLm, Dtype, ModelConfig};

    /// A pack is reused while its stamp holds, and an in-place write to any packed weight
    /// (what an optimizer step or a weight load does) changes the stamp, so the next pass
    /// repacks.
    #[test]
    fn an_in_place_write_changes_the_stamp_and_nothing_else_does() {
        if !onednn_bf16_supported() {
            return;
        }
        let config = ModelConfig::qwen3(64, 32, 64, 2, 4, 2);
        let model = CausalLm::random(&config, Device::Cpu, Dtype::Bf16, 1).unwrap();
        let stamp = |model: &CausalLm| {
            let guard = model.pack_for_inference();
            let packed = guard.weights().expect("bf16 on this CPU is packed");
            packed.stamp.clone()
        };
        let first = stamp(&model);
        // 2 layers × 7 weights, and the (tied) LM head.
        assert_eq!(first.0.len(), 15);
        assert_eq!(stamp(&model), first, "unchanged weights: the same pack");
        let (_, mut w) = model
            .named_parameters()
            .into_iter()
            .find(|(n, _)| n == "model.layers.1.mlp.down_proj.weight")
            .unwrap();
        tch::no_grad(|| {
            let _ = w.g_add_scalar_(0.5);
        });
        let second = stamp(&model);
        assert_ne!(second, first, "an in-place write must change the stamp");
        assert_eq!(stamp(&model), second);
    }

    #[test]
    fn a_pack_takes_at_most_half_of_the_available_memory() {
        assert!(fits(270 << 20, Some(8 << 30)));
        assert!(fits(4 << 30, Some(8 << 30)));
        assert!(!fits((4 << 30) + 1, Some(8 << 30)));
        assert!(fits(u64::MAX, None));
        // This machine has some memory available, and a SmolLM2-sized pack fits in it.
        let available = mem_available().expect("/proc/meminfo has MemAvailable");
        assert!(fits(270 << 20, Some(available)), "{available}");
    }
}
