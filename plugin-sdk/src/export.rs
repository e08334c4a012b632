//! The plugin side of the boundary: adapters that expose an [`Algorithm`] or [`Environment`]
//! through the FFI traits, with every entry point inside `catch_unwind`; the library header
//! the host looks up ([`LIB_HEADER`], defined once, here); and the macros that register a
//! plugin's root module with it.
//!
//! A panic unwinding across an `extern "C"` boundary aborts the whole host process, so each
//! adapter method runs the plugin's code under [`guard`], which turns a panic into a
//! [`PluginError`] of kind [`ErrorKind::Panic`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use abi_stable::{
    library::{__call_root_module_loader, CheckTypeLayout, LibHeader, RootModuleResult},
    prefix_type::PrefixTypeTrait,
    sabi_trait::TD_Opaque,
    std_types::{RBoxError, RErr, ROption, RString, RVec},
};

#[doc(hidden)]
pub use abi_stable::std_types::{RResult, RStr};

use crate::algorithm::{Algorithm, GroupRequest, StepReport, TurnContextRequest};
use crate::batch::{Batch, ContextVariant};
use crate::env::{Environment, Episode, Split, TaskRef};
use crate::error::{ErrorKind, PluginError, Result};
pub use crate::host::ffi::guard;
use crate::host::ffi::*;
use crate::host::ffi::{from_json, to_json};
use crate::services::{
    json_services, GenerateRequest, Generation, Host, ScoreRequest, ScoreWeights, Scored,
};

/// Exposes an [`Algorithm`] as an [`FfiAlgorithm`].
pub struct AlgorithmAdapter<A>(pub A);

impl<A: Algorithm> FfiAlgorithm for AlgorithmAdapter<A> {
    fn requirements_json(&self) -> RResult<RString, FfiError> {
        guard(|| to_json(&self.0.requirements()))
    }

    fn plan_group(
        &mut self,
        request_json: RStr<'_>,
        host: FfiHostRef<'_>,
    ) -> RResult<RVec<FfiContextVariant>, FfiError> {
        guard(|| {
            let request: GroupRequest = from_json("group request", request_json.as_str())?;
            let plan = self.0.plan_group(&request, &ForeignHost(host))?;
            if plan.len() != request.group_size as usize {
                return Err(PluginError::internal(format!(
                    "plan_group returned {} variants for a group of {}",
                    plan.len(),
                    request.group_size
                )));
            }
            Ok(plan.iter().map(FfiContextVariant::from).collect())
        })
    }

    fn next_context(
        &mut self,
        request_json: RStr<'_>,
        host: FfiHostRef<'_>,
    ) -> RResult<RString, FfiError> {
        guard(|| {
            let request: TurnContextRequest =
                from_json("turn context request", request_json.as_str())?;
            to_json(&self.0.next_context(&request, &ForeignHost(host))?)
        })
    }

    fn signals(&self, batch: &FfiBatch, host: FfiHostRef<'_>) -> RResult<FfiSignals, FfiError> {
        guard(|| {
            let batch = Batch::try_from(batch)?;
            let host = ForeignHost(host);
            let signals = self.0.signals(&batch, &host)?;
            Ok(signals.into())
        })
    }

    fn observe(
        &mut self,
        batch: &FfiBatch,
        report_json: RStr<'_>,
        host: FfiHostRef<'_>,
    ) -> RResult<(), FfiError> {
        guard(|| {
            let mut report: StepReport = from_json("step report", report_json.as_str())?;
            report.batch = Batch::try_from(batch)?;
            self.0.observe(&report, &ForeignHost(host))
        })
    }

    fn save_state(&self) -> RResult<RString, FfiError> {
        guard(|| self.0.save_state().map(RString::from))
    }

    fn load_state(&mut self, state: RStr<'_>) -> RResult<(), FfiError> {
        guard(|| self.0.load_state(state.as_str()))
    }
}

/// Exposes an [`Episode`] as an [`FfiEpisode`].
pub struct EpisodeAdapter(pub Box<dyn Episode>);

impl FfiEpisode for EpisodeAdapter {
    fn observation_json(&self) -> RResult<RString, FfiError> {
        guard(|| to_json(&self.0.observation()))
    }

    fn step_json(&mut self, action: RStr<'_>) -> RResult<RString, FfiError> {
        guard(|| to_json(&self.0.step(action.as_str())?))
    }

    fn expert_action(&self) -> RResult<ROption<RString>, FfiError> {
        guard(|| Ok(self.0.expert_action().map(RString::from).into()))
    }
}

/// Exposes an [`Environment`] as an [`FfiEnvironment`].
pub struct EnvironmentAdapter<E>(pub E);

impl<E: Environment> FfiEnvironment for EnvironmentAdapter<E> {
    fn info_json(&self) -> RResult<RString, FfiError> {
        guard(|| to_json(&self.0.info()))
    }

    fn task_json(&self, split: Split, index: u64) -> RResult<RString, FfiError> {
        guard(|| to_json(&self.0.task(TaskRef { split, index })?))
    }

    fn start(
        &self,
        split: Split,
        index: u64,
        seed: u64,
        variant: &FfiContextVariant,
    ) -> RResult<FfiEpisodeBox, FfiError> {
        guard(|| {
            let variant = ContextVariant::try_from(variant)?;
            let episode = self.0.start(TaskRef { split, index }, seed, &variant)?;
            Ok(FfiEpisode_TO::from_value(
                EpisodeAdapter(episode),
                TD_Opaque,
            ))
        })
    }
}

/// The host's callbacks, as a plugin sees them.
pub struct ForeignHost<'a>(pub FfiHostRef<'a>);

/// [`Host`] methods that send their argument to the host as JSON through
/// [`FfiHost::call_json`], one per row of [`crate::services::json_services!`].
macro_rules! calls_through_the_boundary {
    ($($(#[$doc:meta])* fn $name:ident($arg:ident: &$payload:ty) -> $result:ty,
        lacking $what:literal;)*) => {
        $(
            fn $name(&self, $arg: &$payload) -> Result<$result> {
                self.call(stringify!($name), &$arg)
            }
        )*
    };
}

impl ForeignHost<'_> {
    fn call<P: serde::Serialize, R: serde::de::DeserializeOwned>(
        &self,
        method: &str,
        payload: &P,
    ) -> Result<R> {
        let payload = to_json(payload)?;
        let text = self
            .0
            .call_json(method.into(), payload.as_str().into())
            .into_result()
            .map_err(PluginError::from)?;
        from_json(&format!("host reply to `{method}`"), text.as_str())
    }
}

impl Host for ForeignHost<'_> {
    fn score(&self, requests: &[ScoreRequest]) -> Result<Vec<Scored>> {
        let requests = requests.iter().map(FfiScoreRequest::from).collect();
        self.0
            .score(requests)
            .into_result()
            .map(|v| v.into_iter().map(Scored::from).collect())
            .map_err(PluginError::from)
    }

    fn generate(&self, requests: &[GenerateRequest]) -> Result<Vec<Generation>> {
        let requests = requests
            .iter()
            .map(|r| FfiGenerateRequest {
                prompt_ids: r.prompt_ids.as_slice().into(),
                max_new_tokens: r.max_new_tokens,
                temperature: r.temperature,
                top_p: r.top_p,
                seed: r.seed,
            })
            .collect();
        self.0
            .generate(requests)
            .into_result()
            .map(|v| {
                v.into_iter()
                    .map(|g| Generation {
                        ids: g.ids.into_vec(),
                        logprobs: g.logprobs.into_vec(),
                        finish_reason: g.finish_reason,
                    })
                    .collect()
            })
            .map_err(PluginError::from)
    }

    fn tokenize(&self, text: &str) -> Result<Vec<u32>> {
        self.0
            .tokenize(text.into())
            .into_result()
            .map(RVec::into_vec)
            .map_err(PluginError::from)
    }

    json_services!(calls_through_the_boundary);

    fn log_metric(&self, name: &str, value: f64) {
        self.0.log_metric(name.into(), value)
    }
}

impl From<&ScoreRequest> for FfiScoreRequest {
    fn from(r: &ScoreRequest) -> Self {
        let (weights, version) = match r.weights {
            ScoreWeights::Current => (0, 0),
            ScoreWeights::Version(v) => (1, v),
            ScoreWeights::Reference => (2, 0),
        };
        FfiScoreRequest {
            context_ids: r.context_ids.as_slice().into(),
            response_ids: r.response_ids.as_slice().into(),
            weights,
            version,
            temperature: r.temperature.unwrap_or(f32::NAN),
            top_k: r.top_k,
        }
    }
}

impl TryFrom<FfiScoreRequest> for ScoreRequest {
    type Error = PluginError;
    fn try_from(r: FfiScoreRequest) -> Result<Self> {
        let weights = match r.weights {
            0 => ScoreWeights::Current,
            1 => ScoreWeights::Version(r.version),
            2 => ScoreWeights::Reference,
            other => {
                return Err(PluginError::input(format!(
                    "score request names weights {other}; 0 (current), 1 (version) or 2 \
                     (reference)"
                )))
            }
        };
        Ok(ScoreRequest {
            context_ids: r.context_ids.into_vec(),
            response_ids: r.response_ids.into_vec(),
            weights,
            temperature: (!r.temperature.is_nan()).then_some(r.temperature),
            top_k: r.top_k,
        })
    }
}

impl From<FfiScored> for Scored {
    fn from(s: FfiScored) -> Self {
        Scored {
            logprobs: s.logprobs.into_vec(),
            top_ids: s.top_ids.into_vec(),
            top_logprobs: s.top_logprobs.into_vec(),
        }
    }
}

impl From<Scored> for FfiScored {
    fn from(s: Scored) -> Self {
        FfiScored {
            logprobs: s.logprobs.into(),
            top_ids: s.top_ids.into(),
            top_logprobs: s.top_logprobs.into(),
        }
    }
}

/// Builds the [`FfiPluginInfo`] an export macro returns.
pub fn plugin_info(
    name: &str,
    version: &str,
    kind: PluginKind,
    description: &str,
) -> FfiPluginInfo {
    FfiPluginInfo {
        name: name.into(),
        version: version.into(),
        kind,
        description: description.into(),
    }
}

/// Runs an algorithm constructor under [`guard`] and boxes the result.
pub fn create_algorithm<A: Algorithm>(
    config: RStr<'_>,
    create: fn(&str) -> Result<A>,
) -> RResult<FfiAlgorithmBox, FfiError> {
    guard(|| {
        Ok(FfiAlgorithm_TO::from_value(
            AlgorithmAdapter(create(config.as_str())?),
            TD_Opaque,
        ))
    })
}

/// Runs an environment constructor under [`guard`] and boxes the result.
pub fn create_environment<E: Environment>(
    config: RStr<'_>,
    create: fn(&str) -> Result<E>,
) -> RResult<FfiEnvironmentBox, FfiError> {
    guard(|| {
        Ok(FfiEnvironment_TO::from_value(
            EnvironmentAdapter(create(config.as_str())?),
            TD_Opaque,
        ))
    })
}

/// The error a plugin returns when asked for the other kind.
pub fn wrong_kind<T>(name: &str, is: PluginKind) -> RResult<T, FfiError> {
    RErr(
        PluginError::new(
            ErrorKind::Config,
            format!("plugin `{name}` is an {} plugin", is.as_str()),
        )
        .into(),
    )
}

/// Assembles the root module, reporting plugin ABI `cairn_abi` (always [`crate::ABI_VERSION`]
/// outside of tests of the host's refusal path).
pub fn root_module(
    cairn_abi: u32,
    describe: extern "C" fn() -> FfiPluginInfo,
    create_algorithm: extern "C" fn(RStr<'_>) -> RResult<FfiAlgorithmBox, FfiError>,
    create_environment: extern "C" fn(RStr<'_>) -> RResult<FfiEnvironmentBox, FfiError>,
) -> CairnPluginRef {
    CairnPluginModule {
        cairn_abi,
        describe,
        create_algorithm,
        create_environment,
    }
    .leak_into_prefix()
}

/// How many plugin crates linked into this binary registered a root module (see
/// [`register`]), and the first one's constructor.
static REGISTERED: AtomicUsize = AtomicUsize::new(0);
static ROOT_MODULE: OnceLock<fn() -> CairnPluginRef> = OnceLock::new();

/// Registers a plugin crate's root-module constructor. The export macros call it from a
/// constructor function the loader runs when it maps the library (`dlopen`), before the host
/// reads [`LIB_HEADER`]; not meant to be called directly.
#[doc(hidden)]
pub fn register(root_module: fn() -> CairnPluginRef) {
    REGISTERED.fetch_add(1, Ordering::SeqCst);
    let _ = ROOT_MODULE.set(root_module);
}

/// The root module of the one plugin crate this binary registered, or why there is none.
fn registered_root_module() -> std::result::Result<CairnPluginRef, RBoxError> {
    pick_root_module(
        REGISTERED.load(Ordering::SeqCst),
        ROOT_MODULE.get().copied(),
    )
    .map(|root_module| root_module())
    .map_err(|reason| RBoxError::from_fmt(&reason))
}

fn pick_root_module(
    registered: usize,
    first: Option<fn() -> CairnPluginRef>,
) -> std::result::Result<fn() -> CairnPluginRef, String> {
    match (registered, first) {
        (1, Some(root_module)) => Ok(root_module),
        (0, _) | (_, None) => Err("this library links the Cairn plugin SDK but registers no \
                                   plugin: call `export_algorithm!` or `export_environment!` in \
                                   the plugin crate"
            .into()),
        (n, Some(_)) => Err(format!(
            "this library links {n} plugin crates, each with an `export_algorithm!` or \
             `export_environment!`; a plugin library must link exactly one (share code through \
             a library crate, as `sdar` and `icsd` share `cairn-opsd`)"
        )),
    }
}

/// The abi_stable library header: the one symbol the host looks up in a plugin's `.so`.
///
/// It is defined here, once, and not by each plugin's export macro: a binary then holds one
/// definition however many plugin crates it links (a plugin's tests link other plugins as
/// rlibs), with no linker flag and whatever set of packages cargo builds together. The macro
/// instead registers the plugin's constructor ([`register`]); the header's loader returns the
/// registered plugin's root module, and refuses when the library registered none or several.
// The literal must equal `abi_stable::library::ROOT_MODULE_LOADER_NAME`; a test pins that
// (`export_name` does not accept a constant).
#[export_name = "_1as_0lib_1header_0root_bmodule_bloader"]
pub static LIB_HEADER: LibHeader = {
    extern "C" fn erased() -> RootModuleResult {
        __call_root_module_loader(registered_root_module)
    }
    // SAFETY: `erased` returns the module built by `registered_root_module`, whose type is
    // `CairnPluginRef`, the type named here.
    unsafe { LibHeader::from_constructor::<CairnPluginRef>(erased, CheckTypeLayout::Yes) }
};

/// Registers the library's root module. Used by [`crate::export_algorithm!`] and
/// [`crate::export_environment!`]; not meant to be called directly.
#[doc(hidden)]
#[macro_export]
macro_rules! __export_root_module {
    ($describe:ident, $create_algorithm:ident, $create_environment:ident) => {
        $crate::__export_root_module_with_abi!(
            $crate::ABI_VERSION,
            $describe,
            $create_algorithm,
            $create_environment
        );
    };
}

/// Like `__export_root_module!` with an explicit ABI number; only the `old-abi` test plugin
/// uses another number than [`crate::ABI_VERSION`].
///
/// It places a pointer to a registering function in the section the loader runs when it maps
/// the library, before anything in it is looked up (`.init_array` on ELF, the Mach-O and PE
/// equivalents elsewhere). The function only stores a function pointer ([`register`]).
#[doc(hidden)]
#[macro_export]
macro_rules! __export_root_module_with_abi {
    ($abi:expr, $describe:ident, $create_algorithm:ident, $create_environment:ident) => {
        const _: () = {
            fn __cairn_root_module() -> $crate::host::ffi::CairnPluginRef {
                $crate::export::root_module($abi, $describe, $create_algorithm, $create_environment)
            }
            #[used]
            #[cfg_attr(
                not(any(target_vendor = "apple", windows)),
                link_section = ".init_array"
            )]
            #[cfg_attr(target_vendor = "apple", link_section = "__DATA,__mod_init_func")]
            #[cfg_attr(windows, link_section = ".CRT$XCU")]
            static __CAIRN_REGISTER: extern "C" fn() = {
                extern "C" fn register() {
                    $crate::export::register(__cairn_root_module)
                }
                register
            };
        };
    };
}

/// Exports an algorithm plugin.
///
/// ```text
/// cairn_plugin_sdk::export_algorithm! {
///     name: "grpo",
///     description: "group-relative advantages",
///     create: Grpo::from_config_json,   // fn(&str) -> Result<Grpo>
/// }
/// ```
#[macro_export]
macro_rules! export_algorithm {
    (name: $name:expr, description: $description:expr, create: $create:path $(,)?) => {
        extern "C" fn __cairn_describe() -> $crate::host::ffi::FfiPluginInfo {
            $crate::export::plugin_info(
                $name,
                env!("CARGO_PKG_VERSION"),
                $crate::host::ffi::PluginKind::Algorithm,
                $description,
            )
        }
        extern "C" fn __cairn_create_algorithm(
            config: $crate::export::RStr<'_>,
        ) -> $crate::export::RResult<
            $crate::host::ffi::FfiAlgorithmBox,
            $crate::host::ffi::FfiError,
        > {
            $crate::export::create_algorithm(config, $create)
        }
        extern "C" fn __cairn_create_environment(
            _config: $crate::export::RStr<'_>,
        ) -> $crate::export::RResult<
            $crate::host::ffi::FfiEnvironmentBox,
            $crate::host::ffi::FfiError,
        > {
            $crate::export::wrong_kind($name, $crate::host::ffi::PluginKind::Algorithm)
        }
        $crate::__export_root_module!(
            __cairn_describe,
            __cairn_create_algorithm,
            __cairn_create_environment
        );
    };
}

/// Exports an environment plugin. Same form as [`crate::export_algorithm!`].
#[macro_export]
macro_rules! export_environment {
    (name: $name:expr, description: $description:expr, create: $create:path $(,)?) => {
        extern "C" fn __cairn_describe() -> $crate::host::ffi::FfiPluginInfo {
            $crate::export::plugin_info(
                $name,
                env!("CARGO_PKG_VERSION"),
                $crate::host::ffi::PluginKind::Environment,
                $description,
            )
        }
        extern "C" fn __cairn_create_algorithm(
            _config: $crate::export::RStr<'_>,
        ) -> $crate::export::RResult<
            $crate::host::ffi::FfiAlgorithmBox,
            $crate::host::ffi::FfiError,
        > {
            $crate::export::wrong_kind($name, $crate::host::ffi::PluginKind::Environment)
        }
        extern "C" fn __cairn_create_environment(
            config: $crate::export::RStr<'_>,
        ) -> $crate::export::RResult<
            $crate::host::ffi::FfiEnvironmentBox,
            $crate::host::ffi::FfiError,
        > {
            $crate::export::create_environment(config, $create)
        }
        $crate::__export_root_module!(
            __cairn_describe,
            __cairn_create_algorithm,
            __cairn_create_environment
        );
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module() -> CairnPluginRef {
        unreachable!("only compared, never called")
    }

    #[test]
    fn the_header_serves_exactly_one_registered_plugin() {
        assert_eq!(
            pick_root_module(1, Some(module as fn() -> CairnPluginRef)),
            Ok(module as fn() -> CairnPluginRef)
        );
        let none = pick_root_module(0, None).unwrap_err();
        assert!(none.contains("registers no plugin"), "{none}");
        let two = pick_root_module(2, Some(module)).unwrap_err();
        assert!(
            two.contains("links 2 plugin crates") && two.contains("exactly one"),
            "{two}"
        );
    }

    /// This crate's own test binary links no plugin crate, so its header has nothing to serve.
    #[test]
    fn the_header_of_a_binary_without_a_plugin_refuses() {
        let err = LIB_HEADER
            .init_root_module::<CairnPluginRef>()
            .err()
            .expect("no plugin registered");
        assert!(err.to_string().contains("registers no plugin"), "{err}");
    }
}
