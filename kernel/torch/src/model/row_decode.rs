//! One decode step of one sequence, for a bf16 model on the CPU, written out in Rust.
//!
//! At one row a decode step is a chain of matrix-vector products over every weight of the
//! model (270 MB for SmolLM2-135M in bf16): the step is bound by how fast the weights stream
//! from memory. Through libtorch it also pays for about 45 dispatched ops a layer (dispatcher,
//! `TensorIterator` set-up, an allocation each) and for oneDNN copying weight blocks into a
//! buffer at one row: 15.6 ms a token for SmolLM2 here, against llama.cpp's 8.8 ms on the same
//! bf16 weights (BENCHMARKS.md, "Batch 1"). This module runs the whole step, LM head included,
//! as a few loops over the weights in place:
//!
//! - the products: each weight row `[in]` (bf16) against the input `[in]` (f32), eight lanes at
//!   a time with AVX2 and FMA. A bf16 pair read as one 32-bit lane gives its even element by a
//!   shift and its odd one by a mask, so the input is split once into even and odd halves and
//!   no widening instruction runs per weight, and the loads run a kilobyte behind a software
//!   prefetch;
//! - the threads: every thread of libtorch's own OpenMP team runs the whole step (one
//!   parallel region a step), the cheap parts redundantly on its own copy and its share of
//!   each product's rows (of `q, k, v` together, of `gate, up` together) and of the attention
//!   heads, meeting the others at a spinning barrier after each (five a layer). A product here
//!   takes tens of microseconds, shorter than waking a sleeping worker, so handing each one to
//!   a pool left the second core mostly idle, and a pool of its own fought libtorch's spinning
//!   OpenMP workers for the cores;
//! - RMSNorm, RoPE, attention over the row's KV cache, SwiGLU and the residual sums: plain
//!   loops over a few hundred floats.
//!
//! **Numerics: the bf16 model, rounded where libtorch rounds.** Every value that the op-by-op
//! bf16 forward ([`crate::model::CausalLm::hidden_states`] under no grad) stores as a bf16
//! tensor is rounded to bf16 (nearest even) at the same point here: each projection's output
//! (accumulated in f32, bias added, rounded once, as oneDNN and `F.linear` do), the norm before
//! and after its weight, each RoPE product and their sum, the attention output, SiLU and its
//! product, each residual sum, the logits. What differs is only the order of each f32 sum, so
//! the logits agree with the libtorch path to about a bf16 rounding step
//! (`tests/it/forward.rs` bounds the log-probs on every layout; greedy SmolLM2 follows the
//! plain forward in `tests/it/generation.rs`).
//!
//! **Scope.** [`CausalLm::decode_row`](crate::model::CausalLm::decode_row) takes this path for
//! a cache of one row, on x86-64 with AVX2 and FMA, when every weight is a contiguous bf16 CPU
//! tensor; it returns `None` otherwise and the caller runs the libtorch step. Generation passes
//! call it when one row is left (a single request, the last row of a batch); prefill, batches
//! of several rows, scoring and training stay on libtorch.

use std::ffi::{c_int, c_uint, c_void};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

use tch::{Device, Kind, Tensor};

use super::kv_cache::KvCache;

/// bf16 bits → f32 (exact).
#[inline]
pub(crate) fn widen(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// f32 → bf16 bits, rounded to nearest even, as libtorch's `c10::BFloat16` rounds (a NaN stays
/// a quiet NaN).
#[inline]
pub(crate) fn narrow(x: f32) -> u16 {
    if x.is_nan() {
        return 0x7fc0;
    }
    let bits = x.to_bits();
    let bias = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(bias) >> 16) as u16
}

/// `x` rounded to the nearest bf16 value.
#[inline]
pub(crate) fn round(x: f32) -> f32 {
    widen(narrow(x))
}

/// Whether this CPU runs the product kernel (x86-64 with AVX2 and FMA), checked once.
pub(crate) fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// The OpenMP runtime libtorch runs its parallel regions on (GNU libgomp in PyPI's builds;
/// LLVM's and Intel's runtimes export the same entry points), looked up once in the loaded
/// libraries.
struct Omp {
    /// `GOMP_parallel(fn, data, num_threads, flags)`: runs `fn(data)` on every thread of the
    /// calling thread's team and returns when all are done.
    parallel: unsafe extern "C" fn(extern "C" fn(*mut c_void), *mut c_void, c_uint, c_uint),
    thread_num: unsafe extern "C" fn() -> c_int,
    num_threads: unsafe extern "C" fn() -> c_int,
}

fn omp() -> Option<&'static Omp> {
    static OMP: OnceLock<Option<Omp>> = OnceLock::new();
    OMP.get_or_init(|| {
        #[cfg(unix)]
        {
            let find = |name: &std::ffi::CStr| {
                // SAFETY: dlsym with RTLD_DEFAULT only looks the name up in the loaded objects.
                let symbol = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
                (!symbol.is_null()).then_some(symbol)
            };
            let (parallel, thread_num, num_threads) = (
                find(c"GOMP_parallel")?,
                find(c"omp_get_thread_num")?,
                find(c"omp_get_num_threads")?,
            );
            // SAFETY: these are the OpenMP runtime's entry points with the C signatures above
            // (libgomp's ABI, which every OpenMP runtime on Linux also exports).
            type Parallel =
                unsafe extern "C" fn(extern "C" fn(*mut c_void), *mut c_void, c_uint, c_uint);
            type Query = unsafe extern "C" fn() -> c_int;
            unsafe {
                Some(Omp {
                    parallel: std::mem::transmute::<*mut c_void, Parallel>(parallel),
                    thread_num: std::mem::transmute::<*mut c_void, Query>(thread_num),
                    num_threads: std::mem::transmute::<*mut c_void, Query>(num_threads),
                })
            }
        }
        #[cfg(not(unix))]
        {
            None
        }
    })
    .as_ref()
}

/// Whether `t`'s elements lie as `numel` consecutive bf16 values in CPU memory.
fn bf16_in_place(t: &Tensor) -> bool {
    t.kind() == Kind::BFloat16 && t.device() == Device::Cpu && t.is_contiguous()
}

/// A contiguous bf16 CPU tensor's elements, borrowed for as long as the tensor.
pub(crate) fn bf16_slice(t: &Tensor) -> Option<&[u16]> {
    if !bf16_in_place(t) {
        return None;
    }
    let n = t.numel();
    if n == 0 {
        return Some(&[]);
    }
    // SAFETY: a contiguous bf16 CPU tensor holds `numel` consecutive 2-byte elements at
    // `data_ptr`, alive as long as the tensor; nothing writes the weights during a step (the
    // model is borrowed for it, and Cairn's policy actor owns the model).
    Some(unsafe { std::slice::from_raw_parts(t.data_ptr() as *const u16, n) })
}

/// [`bf16_slice`], mutable: for storage the caller owns outright (the KV cache).
pub(crate) fn bf16_slice_mut(t: &mut Tensor) -> Option<&mut [u16]> {
    if !bf16_in_place(t) {
        return None;
    }
    let n = t.numel();
    if n == 0 {
        return Some(&mut []);
    }
    // SAFETY: as in `bf16_slice`; the `&mut` borrow keeps every other access out while the
    // slice lives.
    Some(unsafe { std::slice::from_raw_parts_mut(t.data_ptr() as *mut u16, n) })
}

/// Every layer's keys and values of `cache` as bf16 elements in place, each `[capacity, H_kv,
/// T_max, D]` row-major; `None` unless the storage is contiguous bf16 on the CPU.
fn bf16_layers_mut(cache: &mut KvCache) -> Option<Vec<(&mut [u16], &mut [u16])>> {
    cache
        .layers_mut()
        .iter_mut()
        .map(|(k, v)| Some((bf16_slice_mut(k)?, bf16_slice_mut(v)?)))
        .collect()
}

/// A projection `[out, in]` (bf16, row-major) with its optional bias `[out]`.
#[derive(Clone, Copy)]
pub(crate) struct Proj<'a> {
    pub weight: &'a [u16],
    pub bias: Option<&'a [u16]>,
    pub rows: usize,
}

impl<'a> Proj<'a> {
    /// `None` unless the weight is contiguous bf16 on the CPU with `in` columns.
    pub(crate) fn of(linear: &'a super::linear::Linear, cols: usize) -> Option<Proj<'a>> {
        let weight = bf16_slice(&linear.weight)?;
        let rows = weight.len().checked_div(cols)?;
        if rows * cols != weight.len() {
            return None;
        }
        let bias = match &linear.bias {
            Some(b) => Some(bf16_slice(b).filter(|b| b.len() == rows)?),
            None => None,
        };
        Some(Proj { weight, bias, rows })
    }
}

/// The input of a product split for the kernel: `x` itself, its even elements and its odd
/// ones.
pub(crate) struct Split {
    x: Vec<f32>,
    even: Vec<f32>,
    odd: Vec<f32>,
}

impl Split {
    pub(crate) fn new(cap: usize) -> Split {
        Split {
            x: Vec::with_capacity(cap),
            even: Vec::with_capacity(cap / 2 + 1),
            odd: Vec::with_capacity(cap / 2 + 1),
        }
    }

    pub(crate) fn set(&mut self, x: &[f32]) {
        self.x.clear();
        self.x.extend_from_slice(x);
        self.even.clear();
        self.odd.clear();
        for pair in x.chunks_exact(2) {
            self.even.push(pair[0]);
            self.odd.push(pair[1]);
        }
    }
}

/// `out = round_bf16(W x + b)` for rows `rows` of the projections `parts` stacked (their
/// outputs concatenated), `x` of length `cols` as `split` holds it; `out.len() = rows.len()`.
pub(crate) fn project_rows(
    parts: &[Proj<'_>],
    cols: usize,
    split: &Split,
    rows: Range<usize>,
    out: &mut [f32],
) {
    debug_assert_eq!(out.len(), rows.len());
    let mut start = 0;
    for p in parts {
        let (lo, hi) = (rows.start.max(start), rows.end.min(start + p.rows));
        if lo < hi {
            let local = lo - start;
            let n = hi - lo;
            let out = &mut out[lo - rows.start..hi - rows.start];
            dot_rows(
                &p.weight[local * cols..(local + n) * cols],
                cols,
                split,
                out,
            );
            for (r, y) in out.iter_mut().enumerate() {
                let b = p.bias.map_or(0.0, |b| widen(b[local + r]));
                *y = round(*y + b);
            }
        }
        start += p.rows;
    }
}

/// Thread `thread`'s share of `0..total` when `threads` split it.
fn share(total: usize, thread: usize, threads: usize) -> Range<usize> {
    total * thread / threads..total * (thread + 1) / threads
}

/// `out[r] = Σ_i w[r·cols + i] · x[i]` in f32, for `out.len()` rows of `w`.
fn dot_rows(w: &[u16], cols: usize, split: &Split, out: &mut [f32]) {
    debug_assert_eq!(w.len(), out.len() * cols);
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: AVX2 and FMA are present (checked above); the slices have the lengths the
        // kernel reads (asserted in debug builds, guaranteed by `project`).
        unsafe { avx2::dot_rows(w, cols, split, out) };
        return;
    }
    for (r, y) in out.iter_mut().enumerate() {
        let row = &w[r * cols..(r + 1) * cols];
        *y = row.iter().zip(&split.x).map(|(&w, &x)| widen(w) * x).sum();
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{widen, Split};

    #[target_feature(enable = "avx2,fma")]
    fn hsum(a: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    /// Sixteen bf16 weights at `p` (eight 32-bit lanes of pairs) times sixteen inputs (eight
    /// at `even`, eight at `odd`), added to `acc`.
    ///
    /// # Safety
    /// AVX2 and FMA are present; `p` has 16 readable elements, `even` and `odd` 8 each.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn fma16(
        p: *const u16,
        even: *const f32,
        odd: *const f32,
        acc: (__m256, __m256),
    ) -> (__m256, __m256) {
        let high = _mm256_set1_epi32(0xffff_0000_u32 as i32);
        // SAFETY: the caller guarantees the lengths (unaligned loads).
        let (v, xe, xo) = unsafe {
            (
                _mm256_loadu_si256(p as *const __m256i),
                _mm256_loadu_ps(even),
                _mm256_loadu_ps(odd),
            )
        };
        // Little-endian: a lane's low half is the even element, its high half the odd one.
        let we = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
        let wo = _mm256_castsi256_ps(_mm256_and_si256(v, high));
        (
            _mm256_fmadd_ps(we, xe, acc.0),
            _mm256_fmadd_ps(wo, xo, acc.1),
        )
    }

    /// See [`super::dot_rows`].
    ///
    /// # Safety
    /// AVX2 and FMA are present; `w.len() == out.len() * cols`, `split` holds `cols` inputs.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot_rows(w: &[u16], cols: usize, split: &Split, out: &mut [f32]) {
        let simd = cols - cols % 16;
        assert!(w.len() >= out.len() * cols && split.x.len() >= cols);
        assert!(split.even.len() >= simd / 2 && split.odd.len() >= simd / 2);
        let (even, odd) = (split.even.as_ptr(), split.odd.as_ptr());
        for (r, y) in out.iter_mut().enumerate() {
            let row = &w[r * cols..(r + 1) * cols];
            let p = row.as_ptr();
            let zero = _mm256_setzero_ps();
            let (mut a, mut b) = ((zero, zero), (zero, zero));
            let mut i = 0;
            // SAFETY: every offset read is below `simd` in the row and `simd / 2` in the
            // halves (asserted above), and the features are present.
            unsafe {
                while i + 32 <= simd {
                    // A kilobyte ahead, across row ends: one core's loads alone do not keep
                    // enough cache-line misses in flight (1.3x on the products here).
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(i + 512) as *const i8);
                    a = fma16(p.add(i), even.add(i / 2), odd.add(i / 2), a);
                    b = fma16(p.add(i + 16), even.add(i / 2 + 8), odd.add(i / 2 + 8), b);
                    i += 32;
                }
                if i < simd {
                    a = fma16(p.add(i), even.add(i / 2), odd.add(i / 2), a);
                }
            }
            let mut sum = hsum(_mm256_add_ps(
                _mm256_add_ps(a.0, a.1),
                _mm256_add_ps(b.0, b.1),
            ));
            for (&w, &x) in row[simd..].iter().zip(&split.x[simd..cols]) {
                sum += widen(w) * x;
            }
            *y = sum;
        }
    }
}

/// `x` normalised by its root mean square and scaled by `weight`, with libtorch's bf16
/// roundings: `round(round(x / rms(x)) · w)`.
pub(crate) fn rms_norm(x: &[f32], weight: &[u16], eps: f64, out: &mut [f32]) {
    let ms = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / x.len() as f64;
    let inv = (1.0 / (ms + eps).sqrt()) as f32;
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = round(round(v * inv) * widen(w));
    }
}

/// RoPE of one head `x` `[D]` in place, libtorch's bf16 way: `round(round(x·cos) +
/// round(roll(x, D/2)·sin±))` with `sin± = [-sin₁, sin₂]` and bf16 tables `cos`, `sin` `[D]`.
pub(crate) fn rope(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = x.len() / 2;
    let mut rotated = [0f32; 512];
    debug_assert!(x.len() <= rotated.len());
    let rotated = &mut rotated[..x.len()];
    for i in 0..x.len() {
        let (partner, sign) = if i < half {
            (x[i + half], -1.0)
        } else {
            (x[i - half], 1.0)
        };
        rotated[i] = round(partner * (sign * sin[i]));
    }
    for (v, (&c, &r)) in x.iter_mut().zip(cos.iter().zip(rotated.iter())) {
        *v = round(round(*v * c) + r);
    }
}

/// One query head `q` `[D]` against a key/value head: its cached rows `keys`, `values`
/// (`len` rows of `D`, bf16) and this step's `new_k`, `new_v` (bf16 values), each where
/// `valid` (`[len + 1]`, the new column last): `out = round(Σ_t softmax_t(q·k_t · scale) v_t)`
/// in f32.
pub(crate) fn attend(
    q: &[f32],
    (keys, values): (&[u16], &[u16]),
    (new_k, new_v): (&[f32], &[f32]),
    valid: &[bool],
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let d = q.len();
    let len = valid.len() - 1;
    scores.clear();
    let mut max = f32::NEG_INFINITY;
    for (t, &ok) in valid.iter().enumerate() {
        let s = if !ok {
            f32::NEG_INFINITY
        } else if t < len {
            let k = &keys[t * d..(t + 1) * d];
            k.iter().zip(q).map(|(&k, &q)| widen(k) * q).sum::<f32>() * scale
        } else {
            new_k.iter().zip(q).map(|(&k, &q)| k * q).sum::<f32>() * scale
        };
        max = max.max(s);
        scores.push(s);
    }
    let mut total = 0f32;
    for s in scores.iter_mut() {
        *s = if *s == f32::NEG_INFINITY {
            0.0
        } else {
            (*s - max).exp()
        };
        total += *s;
    }
    out.fill(0.0);
    for (t, &p) in scores.iter().enumerate() {
        if p == 0.0 {
            continue;
        }
        if t < len {
            for (o, &v) in out.iter_mut().zip(&values[t * d..(t + 1) * d]) {
                *o += p * widen(v);
            }
        } else {
            for (o, &v) in out.iter_mut().zip(new_v) {
                *o += p * v;
            }
        }
    }
    for o in out.iter_mut() {
        *o = round(*o / total);
    }
}

/// One layer's weights, borrowed from the model.
pub(crate) struct RowLayer<'a> {
    pub input_norm: &'a [u16],
    pub qkv: [Proj<'a>; 3],
    pub q_norm: Option<&'a [u16]>,
    pub k_norm: Option<&'a [u16]>,
    pub o: Proj<'a>,
    pub post_norm: &'a [u16],
    pub gate_up: [Proj<'a>; 2],
    pub down: Proj<'a>,
}

/// A model's weights as slices, and the sizes of a step.
pub(crate) struct RowModel<'a> {
    /// `[V, hidden]`.
    pub embed: &'a [u16],
    pub layers: Vec<RowLayer<'a>>,
    pub norm: &'a [u16],
    pub lm_head: Proj<'a>,
    /// RoPE's inverse frequencies `[D/2]` (scaling applied).
    pub inv_freq: Vec<f32>,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    pub eps: f64,
}

impl RowModel<'_> {
    /// Logits `[V]` (bf16 values, as f32) of token `id` (in the vocabulary) at RoPE
    /// `position`, attending over the cache's row 0 at columns where `valid` (`[len + 1]`, the
    /// new column last; [`CausalLm::decode_row`](crate::model::CausalLm::decode_row) checks
    /// both); writes this token's keys and values at column `len` of every layer. The caller
    /// advances the cache. `None` when the cache does not fit a one-row bf16 step.
    ///
    /// Every thread of the pool runs the whole step (see [`Team`]): the cheap parts (norms,
    /// RoPE, residual sums) redundantly, each on its own copy, and its share of each product's
    /// rows and of the attention heads into buffers they all read after a barrier.
    pub(crate) fn step(
        &self,
        id: usize,
        position: i64,
        valid: &[bool],
        cache: &mut KvCache,
    ) -> Option<Vec<f32>> {
        let (d, hkv) = (self.head_dim, self.kv_heads);
        let len = cache.len();
        let t_max = cache.max_len();
        if cache.rows() != 1 || len + 1 > t_max {
            return None;
        }
        let layers = bf16_layers_mut(cache)?;
        let room = hkv * t_max * d;
        if layers.len() != self.layers.len()
            || layers.iter().any(|(k, v)| k.len() < room || v.len() < room)
        {
            return None;
        }
        let half = d / 2;
        let angle = |i: usize| position as f32 * self.inv_freq[i % half];
        let mut out = Outputs::new(self);
        let threads = usize::try_from(tch::get_num_threads()).unwrap_or(1).max(1);
        let threads = if omp().is_some() { threads } else { 1 };
        let team = Team {
            model: self,
            id,
            len,
            t_max,
            valid,
            cos: (0..d).map(|i| round(angle(i).cos())).collect(),
            sin: (0..d).map(|i| round(angle(i).sin())).collect(),
            cache: layers
                .into_iter()
                .map(|(k, v)| (Shared::of(k), Shared::of(v)))
                .collect(),
            out: out.shared(),
            barrier: SpinBarrier::new(threads),
            failed: AtomicBool::new(false),
        };
        team.run_on_threads();
        (!team.failed.load(Ordering::Acquire)).then_some(out.logits)
    }
}

/// The buffers every thread writes its share of: the stacked `q, k, v`, the attention
/// output, `o`, the stacked `gate, up`, `down`, the logits.
struct Outputs {
    qkv: Vec<f32>,
    attn: Vec<f32>,
    o: Vec<f32>,
    gate_up: Vec<f32>,
    down: Vec<f32>,
    logits: Vec<f32>,
}

impl Outputs {
    fn new(m: &RowModel<'_>) -> Outputs {
        let d = m.head_dim;
        Outputs {
            qkv: vec![0.0; (m.heads + 2 * m.kv_heads) * d],
            attn: vec![0.0; m.heads * d],
            o: vec![0.0; m.hidden],
            gate_up: vec![0.0; 2 * m.intermediate],
            down: vec![0.0; m.hidden],
            logits: vec![0.0; m.lm_head.rows],
        }
    }

    fn shared(&mut self) -> [Shared<f32>; 6] {
        [
            Shared::of(&mut self.qkv),
            Shared::of(&mut self.attn),
            Shared::of(&mut self.o),
            Shared::of(&mut self.gate_up),
            Shared::of(&mut self.down),
            Shared::of(&mut self.logits),
        ]
    }
}

/// A buffer the team's threads share: between two barriers each thread writes only its own
/// range, and reads only what was written before the last barrier.
struct Shared<T> {
    ptr: *mut T,
    len: usize,
}

// SAFETY: a `Shared` is only accessed under the team's discipline above: writes to disjoint
// ranges between barriers, reads after the barrier that follows the writes.
unsafe impl<T: Send> Send for Shared<T> {}
unsafe impl<T: Send> Sync for Shared<T> {}

impl<T> Shared<T> {
    fn of(buf: &mut [T]) -> Shared<T> {
        Shared {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
        }
    }

    /// # Safety
    /// No other thread touches `range` until the next barrier.
    #[allow(clippy::mut_from_ref)]
    unsafe fn write(&self, range: Range<usize>) -> &mut [T] {
        assert!(range.start <= range.end && range.end <= self.len);
        // SAFETY: in bounds (asserted); exclusive by the caller's guarantee.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(range.start), range.len()) }
    }

    /// # Safety
    /// No thread writes `range` until the next barrier.
    unsafe fn read(&self, range: Range<usize>) -> &[T] {
        assert!(range.start <= range.end && range.end <= self.len);
        // SAFETY: in bounds (asserted); no writer by the caller's guarantee.
        unsafe { std::slice::from_raw_parts(self.ptr.add(range.start), range.len()) }
    }
}

/// A barrier for the team's threads that spins (the waits last microseconds, between two
/// products of one step), yielding the core after a while in case it is oversubscribed.
struct SpinBarrier {
    arrived: AtomicUsize,
    generation: AtomicUsize,
    threads: usize,
}

impl SpinBarrier {
    fn new(threads: usize) -> SpinBarrier {
        SpinBarrier {
            arrived: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
            threads,
        }
    }

    /// Returns once every thread has called it (what each wrote before is then visible to
    /// all), or once `failed` is set.
    fn wait(&self, failed: &AtomicBool) {
        let generation = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.threads {
            self.arrived.store(0, Ordering::Relaxed);
            self.generation.fetch_add(1, Ordering::Release);
            return;
        }
        let mut spins = 0u32;
        while self.generation.load(Ordering::Acquire) == generation {
            if failed.load(Ordering::Acquire) {
                return;
            }
            if spins < 1 << 14 {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

/// One step, as every thread of the pool runs it.
struct Team<'a, 'm> {
    model: &'a RowModel<'m>,
    id: usize,
    len: usize,
    t_max: usize,
    valid: &'a [bool],
    cos: Vec<f32>,
    sin: Vec<f32>,
    /// Per layer, the cache's keys and values `[capacity, H_kv, T_max, D]` (row 0 is used).
    cache: Vec<(Shared<u16>, Shared<u16>)>,
    /// [`Outputs`]' buffers, in its order.
    out: [Shared<f32>; 6],
    barrier: SpinBarrier,
    /// Set when a thread panicked or the team came out another size: the step's result is
    /// dropped (the caller runs the libtorch step, which rewrites the cache's column).
    failed: AtomicBool,
}

impl Team<'_, '_> {
    /// Runs the step on libtorch's own OpenMP team (its threads are the ones that spin
    /// between libtorch's parallel regions: a second pool would fight them for the cores;
    /// measured 20.6 against 12.6 ms a step for SmolLM2 here), or on the calling thread alone
    /// where there is no OpenMP runtime.
    fn run_on_threads(&self) {
        extern "C" fn body(data: *mut c_void) {
            // SAFETY: `data` is the `&Team` passed below, alive until `GOMP_parallel` returns.
            let team = unsafe { &*(data as *const Team<'_, '_>) };
            let Some(omp) = omp() else { return };
            // SAFETY: called inside a parallel region, as the OpenMP API allows.
            let (me, threads) = unsafe { ((omp.thread_num)(), (omp.num_threads)()) };
            let (me, threads) = (me.max(0) as usize, threads.max(1) as usize);
            team.run_guarded(me, threads);
        }
        match omp() {
            Some(omp) if self.barrier.threads > 1 => {
                let data = self as *const Team<'_, '_> as *mut c_void;
                let threads = self.barrier.threads as c_uint;
                // SAFETY: `body` matches the callback ABI and catches every panic; `data`
                // outlives the call, which returns once every thread has finished.
                unsafe { (omp.parallel)(body, data, threads, 0) };
            }
            _ => self.run_guarded(0, 1),
        }
    }

    /// [`Team::run`] as thread `me` of `threads`, marking the team failed on a panic or on a
    /// team size other than the barrier's.
    fn run_guarded(&self, me: usize, threads: usize) {
        if threads != self.barrier.threads {
            self.failed.store(true, Ordering::Release);
            return;
        }
        let run = std::panic::AssertUnwindSafe(|| self.run(me, threads));
        if std::panic::catch_unwind(run).is_err() {
            self.failed.store(true, Ordering::Release);
        }
    }

    /// Thread `me` of `threads`: its share of every product and of the heads. Thread 0 alone
    /// writes this step's keys and values into the cache (every thread attends to them from
    /// its own copy).
    fn run(&self, me: usize, threads: usize) {
        let m = self.model;
        let (h, d, inter) = (m.hidden, m.head_dim, m.intermediate);
        let (hq, hkv) = (m.heads, m.kv_heads);
        let (len, t_max) = (self.len, self.t_max);
        let [qkv_out, attn_out, o_out, gu_out, down_out, logits_out] = &self.out;
        let scale = 1.0 / (d as f32).sqrt();
        let group = hq / hkv;
        let mut x: Vec<f32> = m.embed[self.id * h..(self.id + 1) * h]
            .iter()
            .map(|&b| widen(b))
            .collect();
        let mut n = vec![0f32; h];
        let mut qkv = vec![0f32; (hq + 2 * hkv) * d];
        let mut head = vec![0f32; d];
        let mut act = vec![0f32; inter];
        let mut scores = Vec::with_capacity(len + 1);
        let mut split = Split::new(h.max(inter).max(hq * d));
        // Runs this thread's rows of a product into `out`, then waits for the others.
        let product = |parts: &[Proj<'_>], cols: usize, split: &Split, out: &Shared<f32>| {
            let rows = share(out.len, me, threads);
            // SAFETY: the shares of the threads are disjoint, and every read of `out` is
            // after the barrier below, every next write after a later one.
            project_rows(parts, cols, split, rows.clone(), unsafe { out.write(rows) });
            self.barrier.wait(&self.failed);
        };
        for (l, (kc, vc)) in m.layers.iter().zip(&self.cache) {
            rms_norm(&x, l.input_norm, m.eps, &mut n);
            split.set(&n);
            product(&l.qkv, h, &split, qkv_out);
            // SAFETY: written before the barrier in `product`; the next write is two barriers on.
            qkv.copy_from_slice(unsafe { qkv_out.read(0..qkv_out.len) });
            let (q, kv) = qkv.split_at_mut(hq * d);
            let (k, v) = kv.split_at_mut(hkv * d);
            for (heads, norm) in [(&mut *q, l.q_norm), (&mut *k, l.k_norm)] {
                for x in heads.chunks_exact_mut(d) {
                    if let Some(w) = norm {
                        head.copy_from_slice(x);
                        rms_norm(&head, w, m.eps, x);
                    }
                    rope(x, &self.cos, &self.sin);
                }
            }
            if me == 0 {
                for g in 0..hkv {
                    let at = (g * t_max + len) * d;
                    // SAFETY: column `len` is read by no thread in this step (they attend to
                    // it from their own `k`, `v`), and written by thread 0 only.
                    let (kw, vw) = unsafe { (kc.write(at..at + d), vc.write(at..at + d)) };
                    for (dst, &src) in kw.iter_mut().zip(&k[g * d..(g + 1) * d]) {
                        *dst = narrow(src);
                    }
                    for (dst, &src) in vw.iter_mut().zip(&v[g * d..(g + 1) * d]) {
                        *dst = narrow(src);
                    }
                }
            }
            let heads = share(hq, me, threads);
            // SAFETY: this thread's heads only; read by all after the barrier below.
            let out = unsafe { attn_out.write(heads.start * d..heads.end * d) };
            for (i, out) in heads.zip(out.chunks_exact_mut(d)) {
                let g = i / group;
                let cached = g * t_max * d..(g * t_max + len) * d;
                // SAFETY: columns before `len` are not written during the step.
                let cached = unsafe { (kc.read(cached.clone()), vc.read(cached)) };
                let new = (&k[g * d..(g + 1) * d], &v[g * d..(g + 1) * d]);
                let q = &q[i * d..(i + 1) * d];
                attend(q, cached, new, self.valid, scale, &mut scores, out);
            }
            self.barrier.wait(&self.failed);
            // SAFETY: complete after the barrier above; next written a layer on.
            split.set(unsafe { attn_out.read(0..attn_out.len) });
            product(std::slice::from_ref(&l.o), hq * d, &split, o_out);
            // SAFETY: complete after the barrier in `product`.
            for (x, &o) in x.iter_mut().zip(unsafe { o_out.read(0..h) }) {
                *x = round(o + *x);
            }
            rms_norm(&x, l.post_norm, m.eps, &mut n);
            split.set(&n);
            product(&l.gate_up, h, &split, gu_out);
            // SAFETY: complete after the barrier in `product`.
            let gu = unsafe { gu_out.read(0..2 * inter) };
            let (gate, up) = gu.split_at(inter);
            for ((a, &g), &u) in act.iter_mut().zip(gate).zip(up) {
                let silu = round(g / (1.0 + (-g).exp()));
                *a = round(silu * u);
            }
            split.set(&act);
            product(std::slice::from_ref(&l.down), inter, &split, down_out);
            // SAFETY: complete after the barrier in `product`.
            for (x, &o) in x.iter_mut().zip(unsafe { down_out.read(0..h) }) {
                *x = round(o + *x);
            }
        }
        rms_norm(&x, m.norm, m.eps, &mut n);
        split.set(&n);
        product(std::slice::from_ref(&m.lm_head), h, &split, logits_out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn rounding_to_bf16_is_to_nearest_even() {
        // 1 + 2⁻⁸ is halfway between 1 and 1 + 2⁻⁷: the even neighbour (1) wins; 1 + 3·2⁻⁸
        // is halfway between 1 + 2⁻⁷ and 1 + 2⁻⁶: the even one (1 + 2⁻⁶) wins.
        assert_eq!(narrow(1.0 + 2f32.powi(-8)), 0x3f80);
        assert_eq!(narrow(1.0 + 3.0 * 2f32.powi(-8)), 0x3f82);
        assert_eq!(narrow(1.0 + 2f32.powi(-8) + 2f32.powi(-20)), 0x3f81);
        assert_eq!(narrow(-2.5), 0xc020);
        assert_eq!(narrow(f32::INFINITY), 0x7f80);
        assert_eq!(
            narrow(f32::MAX),
            0x7f80,
            "rounds up to infinity, as c10 does"
        );
        assert!(widen(narrow(f32::NAN)).is_nan());
        // Every bf16 value round-trips.
        for bits in (0u16..=0xffff).step_by(7) {
            let x = widen(bits);
            if !x.is_nan() {
                assert_eq!(narrow(x), bits);
            }
        }
        // And agrees with libtorch's own cast.
        let xs: Vec<f32> = (0..1000)
            .map(|i| (i as f32 * 0.7311).sin() * 300.0)
            .collect();
        let torch: Vec<f32> = Vec::try_from(
            Tensor::from_slice(&xs)
                .to_kind(Kind::BFloat16)
                .to_kind(Kind::Float),
        )
        .unwrap();
        let ours: Vec<f32> = xs.iter().map(|&x| round(x)).collect();
        assert_eq!(ours, torch);
    }

    /// The kernel against an f64 sum, on widths with and without a tail past the last 16 and
    /// 32 columns, with biases, across part boundaries.
    #[test]
    fn stacked_products_equal_an_f64_reference() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for cols in [16usize, 40, 64, 576, 583] {
            let rows = [37usize, 5, 64];
            let weights: Vec<Vec<u16>> = rows
                .iter()
                .map(|&r| {
                    (0..r * cols)
                        .map(|_| narrow(rng.gen_range(-1.0..1.0)))
                        .collect()
                })
                .collect();
            let biases: Vec<u16> = (0..5).map(|_| narrow(rng.gen_range(-1.0..1.0))).collect();
            let x: Vec<f32> = (0..cols).map(|_| round(rng.gen_range(-2.0..2.0))).collect();
            let parts = [
                Proj {
                    weight: &weights[0],
                    bias: None,
                    rows: rows[0],
                },
                Proj {
                    weight: &weights[1],
                    bias: Some(&biases),
                    rows: rows[1],
                },
                Proj {
                    weight: &weights[2],
                    bias: None,
                    rows: rows[2],
                },
            ];
            let mut split = Split::new(cols);
            split.set(&x);
            let total: usize = rows.iter().sum();
            let mut out = vec![0f32; total];
            // In shares that start and end inside parts, as the team's threads take them.
            for t in 0..3 {
                let range = share(total, t, 3);
                project_rows(&parts, cols, &split, range.clone(), &mut out[range]);
            }
            let mut want = Vec::new();
            for (p, part) in parts.iter().enumerate() {
                for r in 0..part.rows {
                    let dot: f64 = (0..cols)
                        .map(|i| f64::from(widen(weights[p][r * cols + i])) * f64::from(x[i]))
                        .sum();
                    let b = part.bias.map_or(0.0, |b| f64::from(widen(b[r])));
                    want.push(dot + b);
                }
            }
            for (i, (&got, &want)) in out.iter().zip(&want).enumerate() {
                // One bf16 rounding of the f32 sum: within 2⁻⁸ relative (plus f32 sum error).
                let bound = want.abs() * 2f64.powi(-8) + 1e-5 * cols as f64;
                assert!(
                    (f64::from(got) - want).abs() <= bound,
                    "cols {cols} row {i}: {got} against {want}"
                );
                assert_eq!(got, round(got), "outputs are bf16 values");
            }
        }
    }

    #[test]
    fn attention_skips_masked_keys_and_weights_the_rest_by_softmax() {
        let d = 4;
        let q = [1.0f32, 0.0, 0.0, 0.0];
        let keys: Vec<u16> = [[2.0f32, 0.0, 0.0, 0.0], [0.0; 4], [9.0, 0.0, 0.0, 0.0]]
            .iter()
            .flatten()
            .map(|&x| narrow(x))
            .collect();
        let values: Vec<u16> = [
            [1.0f32, 0.0, 0.0, 0.0],
            [0.0, 1.0, 0.0, 0.0],
            [0.0, 0.0, 8.0, 0.0],
        ]
        .iter()
        .flatten()
        .map(|&x| narrow(x))
        .collect();
        let mut out = vec![0f32; d];
        let mut scores = Vec::new();
        // Two cached columns and this step's, the second cached one masked: softmax over
        // scores 2·0.5 = 1 (cached) and 4·0.5 = 2 (new).
        let (new_k, new_v) = ([4.0f32, 0.0, 0.0, 0.0], [0.0f32, 0.0, 0.0, 2.0]);
        let cached = (&keys[..2 * d], &values[..2 * d]);
        let valid = [true, false, true];
        attend(
            &q,
            cached,
            (&new_k, &new_v),
            &valid,
            0.5,
            &mut scores,
            &mut out,
        );
        let e = std::f32::consts::E;
        let (p0, p2) = (1.0 / (1.0 + e), e / (1.0 + e));
        assert_eq!(out, vec![round(p0), 0.0, 0.0, round(2.0 * p2)]);
        // Every column masked but the new one: its value, exactly.
        attend(
            &q,
            cached,
            (&new_k, &new_v),
            &[false, false, true],
            0.5,
            &mut scores,
            &mut out,
        );
        assert_eq!(out, vec![0.0, 0.0, 0.0, 2.0]);
    }

    #[test]
    fn rope_rotates_pairs_half_a_head_apart() {
        // Angle π/2 on the first pair, 0 on the second: (x₀, x₂) → (-x₂, x₀), (x₁, x₃) kept.
        let mut x = [1.0f32, 2.0, 3.0, 4.0];
        let cos = [0.0, 1.0, 0.0, 1.0];
        let sin = [1.0, 0.0, 1.0, 0.0];
        rope(&mut x, &cos, &sin);
        assert_eq!(x, [-3.0, 2.0, 1.0, 4.0]);
    }

    #[test]
    fn rms_norm_scales_to_unit_rms_then_by_the_weight() {
        let x = [3.0f32, -4.0];
        let w = [narrow(1.0), narrow(2.0)];
        let mut out = [0f32; 2];
        rms_norm(&x, &w, 0.0, &mut out);
        // rms = sqrt(12.5); 3 / rms = 0.8485 → bf16 0.84765625, ·1; −4 / rms → −1.1328125, ·2.
        assert_eq!(out, [0.847_656_25, -2.265_625]);
    }
}
