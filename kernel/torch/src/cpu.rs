//! Which CPU code paths libtorch's kernels take on this machine: the class of CPUs on which a
//! CPU run reproduces to the last bit.
//!
//! Two choices decide how libtorch's CPU kernels round:
//! - **MKL's branch.** The MKL linked into libtorch runs the matrix products (f32, and parts of
//!   the bf16 path). It picks its kernels by CPU *vendor*: on an Intel CPU its ISA-specific
//!   branch (AVX-512 on a Xeon), on any other CPU a generic one (SSE matrix-vector products and
//!   vendor-tuned GEMMs on AMD). The two sum in another order, so an AMD EPYC and an Intel Xeon,
//!   both with AVX-512, give different last bits for the same product.
//! - **ATen's capability.** ATen's own vectorised kernels (softmax, reductions, elementwise
//!   ops) are compiled for AVX2 and for AVX-512 and the wider one is used when the CPU has
//!   AVX-512 F/BW/VL/DQ (or as `ATEN_CPU_CAPABILITY` says).
//!
//! In bf16 a third choice counts: **bf16 products on AMX tiles** (Sapphire Rapids and later
//! Xeons) sum in another order than the AVX-512 kernels. f32 is untouched, so
//! [`CpuClass::name`] leaves AMX out and [`CpuClass::bf16_name`] adds it: on such a Xeon,
//! transformers' and Cairn's bf16 log-probs both differ from those recorded on an AVX-512 CPU
//! without AMX (under MKL's Intel branch) by up to 0.18 nats per token, and agree with each
//! other.
//!
//! A seeded run is deterministic for a given thread count and [`CpuClass`]; on another class it
//! takes another path (the same statistics, not the same bits). The host prints the class at
//! the start of a run, and the bit-exact test fixtures are kept per class.

use std::fmt;

/// The CPU class of this machine for libtorch's numerics (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuClass {
    /// MKL takes its Intel branch (on an Intel CPU: MKL's own check says so).
    pub intel_mkl: bool,
    /// ATen's vectorised kernels: `"avx512"`, `"avx2"` or `"default"`.
    pub aten: &'static str,
    /// bf16 products run on AMX tiles (the CPU has AMX-BF16). `ONEDNN_MAX_CPU_ISA` is not
    /// read: with it set to `AVX512_CORE_BF16` on such a Xeon, Cairn's bf16 log-probs still
    /// differ from the `intel-avx512` file's by 0.21.
    pub amx: bool,
}

impl CpuClass {
    /// Reads the CPU's vendor and features (CPUID) and `ATEN_CPU_CAPABILITY`.
    pub fn detect() -> CpuClass {
        let aten = match std::env::var("ATEN_CPU_CAPABILITY").as_deref() {
            Ok("avx512") => "avx512",
            Ok("avx2") => "avx2",
            Ok("default") => "default",
            _ => detected_capability(),
        };
        CpuClass {
            intel_mkl: mkl_takes_intel_branch(),
            aten,
            amx: has_amx_bf16(),
        }
    }

    /// `intel-avx512`, `generic-avx512`, `intel-avx2`, …: the class of f32 numerics, the name
    /// f32 fixtures use.
    pub fn name(&self) -> String {
        let mkl = if self.intel_mkl { "intel" } else { "generic" };
        format!("{mkl}-{}", self.aten)
    }

    /// [`Self::name`], with `-amx` where bf16 products run on AMX tiles: the class of bf16
    /// numerics, the name fixtures holding bf16 values use.
    pub fn bf16_name(&self) -> String {
        if self.amx {
            format!("{}-amx", self.name())
        } else {
            self.name()
        }
    }
}

impl fmt::Display for CpuClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mkl = if self.intel_mkl {
            "Intel branch"
        } else {
            "generic branch (not an Intel CPU)"
        };
        let amx = if self.amx { ", bf16 on AMX" } else { "" };
        write!(f, "{} (MKL {mkl}, ATen {}{amx})", self.name(), self.aten)
    }
}

/// MKL's own vendor check, `mkl_serv_intel_cpu_true`, which the x86-64 libtorch exports (MKL
/// calls it through the PLT, so a preloaded library can change its answer and this sees that
/// too); without it, whether CPUID says `GenuineIntel`.
fn mkl_takes_intel_branch() -> bool {
    #[cfg(unix)]
    {
        // SAFETY: dlsym with RTLD_DEFAULT only looks the name up in the loaded objects.
        let symbol =
            unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"mkl_serv_intel_cpu_true".as_ptr()) };
        if !symbol.is_null() {
            // SAFETY: the symbol is MKL's `int mkl_serv_intel_cpu_true(void)`, which takes no
            // arguments and only reads CPUID.
            let check: unsafe extern "C" fn() -> std::os::raw::c_int =
                unsafe { std::mem::transmute(symbol) };
            return unsafe { check() } != 0;
        }
    }
    vendor() == "GenuineIntel"
}

#[cfg(target_arch = "x86_64")]
fn vendor() -> String {
    let id = std::arch::x86_64::__cpuid(0);
    let bytes: Vec<u8> = [id.ebx, id.edx, id.ecx]
        .iter()
        .flat_map(|r| r.to_le_bytes())
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(not(target_arch = "x86_64"))]
fn vendor() -> String {
    String::new()
}

#[cfg(target_arch = "x86_64")]
fn detected_capability() -> &'static str {
    if is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512dq")
    {
        "avx512"
    } else if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        "avx2"
    } else {
        "default"
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detected_capability() -> &'static str {
    "default"
}

/// CPUID leaf 7, sub-leaf 0, EDX bit 22: AMX-BF16.
#[cfg(target_arch = "x86_64")]
fn has_amx_bf16() -> bool {
    let max_leaf = std::arch::x86_64::__cpuid(0).eax;
    max_leaf >= 7 && std::arch::x86_64::__cpuid_count(7, 0).edx & (1 << 22) != 0
}

#[cfg(not(target_arch = "x86_64"))]
fn has_amx_bf16() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_joins_the_mkl_branch_and_the_aten_capability() {
        let amd = CpuClass {
            intel_mkl: false,
            aten: "avx512",
            amx: false,
        };
        assert_eq!(amd.name(), "generic-avx512");
        assert_eq!(amd.bf16_name(), "generic-avx512");
        let xeon = CpuClass {
            intel_mkl: true,
            aten: "avx2",
            amx: false,
        };
        assert_eq!(xeon.name(), "intel-avx2");
        assert!(xeon.to_string().starts_with("intel-avx2 (MKL Intel branch"));
        let sapphire = CpuClass {
            intel_mkl: true,
            aten: "avx512",
            amx: true,
        };
        assert_eq!(sapphire.name(), "intel-avx512");
        assert_eq!(sapphire.bf16_name(), "intel-avx512-amx");
        assert!(sapphire.to_string().ends_with("ATen avx512, bf16 on AMX)"));
    }

    /// The AMX bit is CPUID's, as the kernel reports it in /proc/cpuinfo (`amx_bf16`).
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    #[test]
    fn the_amx_bit_is_the_one_the_kernel_reports() {
        let info = std::fs::read_to_string("/proc/cpuinfo").unwrap();
        let flags = info
            .lines()
            .find(|l| l.starts_with("flags"))
            .expect("a flags line");
        let listed = flags.split_whitespace().any(|f| f == "amx_bf16");
        assert_eq!(has_amx_bf16(), listed, "{flags}");
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_vendor_is_the_twelve_bytes_cpuid_reports() {
        let vendor = vendor();
        assert_eq!(vendor.len(), 12, "{vendor:?}");
        // The test binary links libtorch, so MKL's own check is what is asked: on an Intel CPU
        // it says Intel, and on another one no, unless a preloaded library answers for it
        // (scripts/fidelity/mkl_intel_branch.sh).
        let class = CpuClass::detect();
        if std::env::var_os("LD_PRELOAD").is_none() {
            assert_eq!(class.intel_mkl, vendor == "GenuineIntel");
        }
    }
}
