//! The host side of the boundary: opening a plugin `.so`, checking its ABI, and wrapping the
//! objects it creates into the plain [`Algorithm`], [`Environment`] and [`Episode`] traits.
//!
//! Each file is opened on its own with `lib_header_from_path` and `init_root_module`, never
//! with abi_stable's directory loader, which caches one module per root-module type and would
//! hand back the first plugin for every later file.

use std::path::{Path, PathBuf};

use abi_stable::{
    library::{lib_header_from_path, LibraryError, RootModuleError},
    sabi_trait::TD_Opaque,
    std_types::{RResult, RStr, RString, RVec},
};

/// The kind a [`PluginInfo`] reports, re-exported so the loader's users need not open
/// [`super::ffi`].
pub use super::ffi::PluginKind;
use super::ffi::*;
use crate::algorithm::{
    Algorithm, GroupRequest, Requirements, StepReport, TurnContext, TurnContextRequest,
};
use crate::batch::{Batch, ContextVariant, Signals};
use crate::env::{
    Environment, EnvironmentInfo, Episode, Observation, StepOutcome, TaskInfo, TaskRef,
};
use crate::error::{ErrorKind, PluginError, Result};
use crate::services::{GenerateRequest, Host, ScoreRequest};

/// Why a file could not be loaded as a plugin.
#[derive(Debug)]
pub enum LoadError {
    /// The file could not be opened as a shared library.
    Open { path: PathBuf, reason: String },
    /// The library has no Cairn root module: it is not a plugin.
    NotAPlugin { path: PathBuf },
    /// The plugin was built against another Cairn plugin ABI.
    AbiVersion {
        path: PathBuf,
        found: u32,
        expected: u32,
    },
    /// abi_stable rejected the library: another abi_stable or SDK version, or types whose
    /// layout differs from the host's.
    Incompatible { path: PathBuf, reason: String },
    /// The library's header gave no root module: it links the SDK but registers no plugin,
    /// or more than one (`reason` says which).
    NoRootModule { path: PathBuf, reason: String },
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::Open { path, reason } => {
                write!(f, "{}: cannot open as a shared library: {reason}", path.display())
            }
            LoadError::NotAPlugin { path } => write!(
                f,
                "{}: not a Cairn plugin (no cairn_plugin root module); remove it from the plugin \
                 directory or rebuild it with cairn-plugin-sdk's export macros",
                path.display()
            ),
            LoadError::AbiVersion { path, found, expected } => write!(
                f,
                "{}: built for Cairn plugin ABI {found}, this host speaks ABI {expected}; rebuild \
                 the plugin against this cairn-plugin-sdk",
                path.display()
            ),
            LoadError::Incompatible { path, reason } => write!(
                f,
                "{}: incompatible plugin layout, rebuild it against this cairn-plugin-sdk: {reason}",
                path.display()
            ),
            LoadError::NoRootModule { path, reason } => {
                write!(f, "{}: not a loadable plugin: {reason}", path.display())
            }
        }
    }
}

impl std::error::Error for LoadError {}

/// Facts a plugin reports about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginInfo {
    pub name: String,
    pub version: String,
    pub kind: PluginKind,
    pub description: String,
    /// The plugin ABI it was built for.
    pub abi: u32,
}

/// An opened, ABI-checked plugin library.
#[derive(Clone)]
pub struct LoadedPlugin {
    pub path: PathBuf,
    pub info: PluginInfo,
    module: CairnPluginRef,
}

impl std::fmt::Debug for LoadedPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedPlugin")
            .field("path", &self.path)
            .field("info", &self.info)
            .finish()
    }
}

/// Opens one plugin file and checks its ABI version and type layouts.
///
/// The library is never unloaded (abi_stable leaks it on purpose: code from it may still be
/// referenced by objects it created).
pub fn load_plugin(path: &Path) -> std::result::Result<LoadedPlugin, LoadError> {
    let path_buf = path.to_path_buf();
    // A truncated library would be mapped past its end by dlopen and crash the process.
    super::elf::check_segments(path).map_err(|reason| LoadError::Open {
        path: path_buf.clone(),
        reason,
    })?;
    let header = lib_header_from_path(path).map_err(|e| match e {
        LibraryError::OpenError { err, .. } => LoadError::Open {
            path: path_buf.clone(),
            reason: err.to_string(),
        },
        LibraryError::GetSymbolError { .. } => LoadError::NotAPlugin {
            path: path_buf.clone(),
        },
        other => LoadError::Incompatible {
            path: path_buf.clone(),
            reason: short(&other),
        },
    })?;
    // Read the ABI number before the full layout check, so a plain version mismatch is
    // reported as one. `cairn_abi` is the first field of every version of the module.
    // SAFETY: only `cairn_abi`, whose offset and type never change, is read before
    // `check_layout` below validates the rest.
    let unchecked = unsafe { header.init_root_module_with_unchecked_layout::<CairnPluginRef>() }
        .map_err(|e| match e {
            // The header's own refusal (`export::LIB_HEADER`): no plugin, or several.
            LibraryError::RootModule {
                err: RootModuleError::Returned(reason),
                ..
            } => LoadError::NoRootModule {
                path: path_buf.clone(),
                reason: reason.to_string(),
            },
            other => LoadError::Incompatible {
                path: path_buf.clone(),
                reason: short(&other),
            },
        })?;
    let abi = unchecked.cairn_abi();
    if abi != crate::ABI_VERSION {
        return Err(LoadError::AbiVersion {
            path: path_buf,
            found: abi,
            expected: crate::ABI_VERSION,
        });
    }
    let module = header
        .check_layout::<CairnPluginRef>()
        .map_err(|e| LoadError::Incompatible {
            path: path_buf.clone(),
            reason: short(&e),
        })?;
    let raw = (module.describe())();
    let info = PluginInfo {
        name: raw.name.into(),
        version: raw.version.into(),
        kind: raw.kind,
        description: raw.description.into(),
        abi,
    };
    Ok(LoadedPlugin {
        path: path_buf,
        info,
        module,
    })
}

/// abi_stable's layout reports can run to pages; keep the first lines.
fn short(e: &LibraryError) -> String {
    let text = e.to_string();
    let mut lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .take(6)
        .collect();
    if text.lines().count() > 6 {
        lines.push("...");
    }
    lines.join(" | ")
}

impl LoadedPlugin {
    /// Creates an algorithm instance from its JSON config.
    pub fn create_algorithm(&self, config_json: &str) -> Result<ForeignAlgorithm> {
        let inner = (self.module.create_algorithm())(RStr::from(config_json))
            .into_result()
            .map_err(|e| self.error(e.into()))?;
        Ok(ForeignAlgorithm {
            name: self.info.name.clone(),
            inner,
        })
    }

    /// Creates an environment instance from its JSON config.
    pub fn create_environment(&self, config_json: &str) -> Result<ForeignEnvironment> {
        let inner = (self.module.create_environment())(RStr::from(config_json))
            .into_result()
            .map_err(|e| self.error(e.into()))?;
        Ok(ForeignEnvironment {
            name: self.info.name.clone(),
            inner,
        })
    }

    fn error(&self, e: PluginError) -> PluginError {
        named(&self.info.name, e)
    }
}

/// Puts the plugin's name on an error coming out of it.
fn named(name: &str, e: PluginError) -> PluginError {
    PluginError {
        kind: e.kind,
        message: format!("plugin `{name}`: {}", e.message),
    }
}

fn lift<T>(name: &str, r: RResult<T, FfiError>) -> Result<T> {
    r.into_result().map_err(|e| named(name, e.into()))
}

fn parse_json<T: serde::de::DeserializeOwned>(name: &str, what: &str, text: RString) -> Result<T> {
    serde_json::from_str(text.as_str()).map_err(|e| {
        PluginError::new(
            ErrorKind::Internal,
            format!("plugin `{name}` returned malformed {what}: {e}"),
        )
    })
}

/// An algorithm living in a plugin, usable as a plain [`Algorithm`].
pub struct ForeignAlgorithm {
    name: String,
    inner: FfiAlgorithmBox,
}

impl ForeignAlgorithm {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The plugin's declared needs.
    pub fn try_requirements(&self) -> Result<Requirements> {
        let text = lift(&self.name, self.inner.requirements_json())?;
        parse_json(&self.name, "requirements", text)
    }
}

impl Algorithm for ForeignAlgorithm {
    fn requirements(&self) -> Requirements {
        self.try_requirements().unwrap_or_default()
    }

    fn plan_group(
        &mut self,
        request: &GroupRequest,
        host: &dyn Host,
    ) -> Result<Vec<ContextVariant>> {
        let json = super::ffi::to_json(request)?;
        let adapter = HostAdapter(host);
        let host_ref: FfiHostRef<'_> = FfiHost_TO::from_ptr(&adapter, TD_Opaque);
        let plan = lift(
            &self.name,
            self.inner.plan_group(RStr::from(json.as_str()), host_ref),
        )?;
        plan.iter()
            .map(|v| ContextVariant::try_from(v).map_err(|e| named(&self.name, e)))
            .collect()
    }

    fn next_context(
        &mut self,
        request: &TurnContextRequest,
        host: &dyn Host,
    ) -> Result<TurnContext> {
        let json = super::ffi::to_json(request)?;
        let adapter = HostAdapter(host);
        let host_ref: FfiHostRef<'_> = FfiHost_TO::from_ptr(&adapter, TD_Opaque);
        let text = lift(
            &self.name,
            self.inner.next_context(RStr::from(json.as_str()), host_ref),
        )?;
        parse_json(&self.name, "turn context", text)
    }

    fn signals(&self, batch: &Batch, host: &dyn Host) -> Result<Signals> {
        let ffi_batch = FfiBatch::from(batch);
        let adapter = HostAdapter(host);
        let host_ref: FfiHostRef<'_> = FfiHost_TO::from_ptr(&adapter, TD_Opaque);
        let signals =
            Signals::try_from(lift(&self.name, self.inner.signals(&ffi_batch, host_ref))?)
                .map_err(|e| named(&self.name, e))?;
        signals
            .validate_against(batch)
            .map_err(|e| named(&self.name, e))?;
        Ok(signals)
    }

    fn observe(&mut self, report: &StepReport, host: &dyn Host) -> Result<()> {
        let ffi_batch = FfiBatch::from(&report.batch);
        let rest = StepReport {
            batch: Batch::default(),
            ..report.clone()
        };
        let json = super::ffi::to_json(&rest)?;
        let adapter = HostAdapter(host);
        let host_ref: FfiHostRef<'_> = FfiHost_TO::from_ptr(&adapter, TD_Opaque);
        lift(
            &self.name,
            self.inner
                .observe(&ffi_batch, RStr::from(json.as_str()), host_ref),
        )
    }

    fn save_state(&self) -> Result<String> {
        lift(&self.name, self.inner.save_state()).map(String::from)
    }

    fn load_state(&mut self, state: &str) -> Result<()> {
        lift(&self.name, self.inner.load_state(RStr::from(state)))
    }
}

/// An environment living in a plugin, usable as a plain [`Environment`].
pub struct ForeignEnvironment {
    name: String,
    inner: FfiEnvironmentBox,
}

impl ForeignEnvironment {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The environment's facts, or the error it raised.
    pub fn try_info(&self) -> Result<EnvironmentInfo> {
        let text = lift(&self.name, self.inner.info_json())?;
        parse_json(&self.name, "environment info", text)
    }
}

impl Environment for ForeignEnvironment {
    fn info(&self) -> EnvironmentInfo {
        self.try_info().unwrap_or_default()
    }

    fn task(&self, task: TaskRef) -> Result<TaskInfo> {
        let text = lift(&self.name, self.inner.task_json(task.split, task.index))?;
        parse_json(&self.name, "task info", text)
    }

    fn start(
        &self,
        task: TaskRef,
        seed: u64,
        variant: &ContextVariant,
    ) -> Result<Box<dyn Episode>> {
        let variant = FfiContextVariant::from(variant);
        let inner = lift(
            &self.name,
            self.inner.start(task.split, task.index, seed, &variant),
        )?;
        Ok(Box::new(ForeignEpisode {
            name: self.name.clone(),
            inner,
        }))
    }
}

/// How [`ForeignEpisode::observation`] (which has no error return) reports a plugin error or
/// panic: an observation whose text starts with this, then the error, then `]`. The kernel's
/// episode loop fails such an episode instead of showing the text to the policy.
pub const OBSERVATION_ERROR_PREFIX: &str = "[environment error: ";

/// An episode living in a plugin.
pub struct ForeignEpisode {
    name: String,
    inner: FfiEpisodeBox,
}

impl Episode for ForeignEpisode {
    fn observation(&self) -> Observation {
        lift(&self.name, self.inner.observation_json())
            .and_then(|t| parse_json(&self.name, "observation", t))
            .unwrap_or_else(|e| Observation {
                text: format!("{OBSERVATION_ERROR_PREFIX}{e}]"),
                ..Default::default()
            })
    }

    fn step(&mut self, action: &str) -> Result<StepOutcome> {
        let text = lift(&self.name, self.inner.step_json(RStr::from(action)))?;
        parse_json(&self.name, "step outcome", text)
    }

    fn expert_action(&self) -> Option<String> {
        lift(&self.name, self.inner.expert_action())
            .ok()
            .and_then(|a| a.into_option())
            .map(String::from)
    }
}

/// Answers a [`FfiHost::call_json`] call on the host side: decodes the payload, calls the
/// [`Host`] method of that name, encodes the result. One arm per row of
/// [`crate::services::json_services!`].
macro_rules! dispatch {
    ($($(#[$doc:meta])* fn $name:ident($arg:ident: &$payload:ty) -> $result:ty,
        lacking $what:literal;)*) => {
        fn dispatch_json_call(host: &dyn Host, method: &str, payload: &str) -> Result<RString> {
            $(
                if method == stringify!($name) {
                    // The owned form of the borrowed argument: `Vec<T>` for `[T]`.
                    let $arg: <$payload as ToOwned>::Owned =
                        super::ffi::from_json(method, payload)?;
                    return super::ffi::to_json(&host.$name(&$arg)?);
                }
            )*
            Err(PluginError::host(format!(
                "the host has no service `{method}` (it offers {}); the plugin was built for a \
                 newer Cairn",
                crate::services::JSON_SERVICES.join(", ")
            )))
        }
    };
}
crate::services::json_services!(dispatch);

/// Exposes the host's [`Host`] to a plugin for the duration of one call. A panic in a host
/// callback is caught here, so it never unwinds through plugin frames.
struct HostAdapter<'a>(&'a dyn Host);

impl FfiHost for HostAdapter<'_> {
    fn score(&self, requests: RVec<FfiScoreRequest>) -> RResult<RVec<FfiScored>, FfiError> {
        super::ffi::guard(|| {
            let requests = requests
                .into_iter()
                .map(ScoreRequest::try_from)
                .collect::<Result<Vec<_>>>()?;
            Ok(self
                .0
                .score(&requests)?
                .into_iter()
                .map(FfiScored::from)
                .collect())
        })
    }

    fn call_json(&self, method: RStr<'_>, payload: RStr<'_>) -> RResult<RString, FfiError> {
        super::ffi::guard(|| dispatch_json_call(self.0, method.as_str(), payload.as_str()))
    }

    fn generate(
        &self,
        requests: RVec<FfiGenerateRequest>,
    ) -> RResult<RVec<FfiGeneration>, FfiError> {
        super::ffi::guard(|| {
            let requests: Vec<GenerateRequest> = requests
                .into_iter()
                .map(|r| GenerateRequest {
                    prompt_ids: r.prompt_ids.into_vec(),
                    max_new_tokens: r.max_new_tokens,
                    temperature: r.temperature,
                    top_p: r.top_p,
                    seed: r.seed,
                })
                .collect();
            Ok(self
                .0
                .generate(&requests)?
                .into_iter()
                .map(|g| FfiGeneration {
                    ids: g.ids.into(),
                    logprobs: g.logprobs.into(),
                    finish_reason: g.finish_reason,
                })
                .collect())
        })
    }

    fn tokenize(&self, text: RStr<'_>) -> RResult<RVec<u32>, FfiError> {
        super::ffi::guard(|| self.0.tokenize(text.as_str()).map(RVec::from))
    }

    fn log_metric(&self, name: RStr<'_>, value: f64) {
        let _ = super::ffi::guard(|| {
            self.0.log_metric(name.as_str(), value);
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bank::{BankQuery, EntryKind, NewEntry, ReflectionRequest, Retrieved, StatsUpdate};
    use crate::export::ForeignHost;
    use crate::services::{RenderRequest, ScoreWeights, Scored};
    use std::sync::Mutex;

    /// A host that answers every service with values derived from its input, and records the
    /// calls, so a round trip through the FFI can be checked field by field.
    #[derive(Default)]
    struct Echo {
        calls: Mutex<Vec<String>>,
    }

    impl Host for Echo {
        fn score(&self, requests: &[ScoreRequest]) -> Result<Vec<Scored>> {
            Ok(requests
                .iter()
                .map(|r| Scored {
                    logprobs: r.response_ids.iter().map(|&i| -(i as f32)).collect(),
                    top_ids: vec![r.top_k; r.top_k as usize],
                    top_logprobs: vec![r.temperature.unwrap_or(-1.0); r.top_k as usize],
                })
                .collect())
        }
        fn render_prompt(&self, request: &RenderRequest) -> Result<Vec<u32>> {
            Ok(vec![
                request.variant.inject.len() as u32,
                request.observation.text.len() as u32,
                request.history.len() as u32,
            ])
        }
        fn bank_query(&self, query: &BankQuery) -> Result<Vec<Retrieved>> {
            self.calls
                .lock()
                .unwrap()
                .push(format!("query {}", query.text));
            Ok(vec![])
        }
        fn bank_put(&self, entries: &[NewEntry]) -> Result<Vec<u64>> {
            Ok((0..entries.len() as u64).map(|i| 100 + i).collect())
        }
        fn bank_update(&self, updates: &[StatsUpdate]) -> Result<()> {
            let ids: Vec<String> = updates
                .iter()
                .map(|u| format!("{}:{:?}", u.id, u.status))
                .collect();
            self.calls
                .lock()
                .unwrap()
                .push(format!("update {}", ids.join(",")));
            Ok(())
        }
        fn reflect(&self, requests: &[ReflectionRequest]) -> Result<Vec<u64>> {
            Err(PluginError::host(format!(
                "{} reflections refused",
                requests.len()
            )))
        }
    }

    #[test]
    fn every_host_service_crosses_the_ffi_and_back() {
        let echo = Echo::default();
        let adapter = HostAdapter(&echo);
        let host = ForeignHost(FfiHost_TO::from_ptr(&adapter, TD_Opaque));

        let scored = host
            .score(&[ScoreRequest {
                context_ids: vec![1],
                response_ids: vec![3, 4],
                weights: ScoreWeights::Version(7),
                temperature: Some(0.5),
                top_k: 2,
            }])
            .unwrap();
        assert_eq!(
            scored,
            vec![Scored {
                logprobs: vec![-3.0, -4.0],
                top_ids: vec![2, 2],
                top_logprobs: vec![0.5, 0.5],
            }]
        );
        let r = RenderRequest {
            variant: ContextVariant {
                inject: "abc".into(),
                ..Default::default()
            },
            observation: Observation {
                text: "hello".into(),
                ..Default::default()
            },
            history: vec![Default::default(); 2],
        };
        assert_eq!(host.render_prompt(&r).unwrap(), vec![3, 5, 2]);
        let new = NewEntry {
            kind: EntryKind::Skill,
            text: "open the drawer".into(),
            ..Default::default()
        };
        assert_eq!(host.bank_put(&[new.clone(), new]).unwrap(), vec![100, 101]);
        assert!(host
            .bank_query(&BankQuery {
                text: "drawer".into(),
                ..Default::default()
            })
            .unwrap()
            .is_empty());
        host.bank_retire(&[5]).unwrap();
        assert_eq!(
            *echo.calls.lock().unwrap(),
            vec![
                "query drawer".to_string(),
                "update 5:Some(Retired)".to_string()
            ]
        );
        let e = host.reflect(&[ReflectionRequest::default()]).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Host);
        assert_eq!(e.message, "1 reflections refused");
    }

    #[test]
    fn every_declared_json_service_is_dispatched() {
        let echo = Echo::default();
        let adapter = HostAdapter(&echo);
        let ffi: FfiHostRef<'_> = FfiHost_TO::from_ptr(&adapter, TD_Opaque);
        assert_eq!(
            crate::services::JSON_SERVICES,
            [
                "render_prompt",
                "bank_query",
                "bank_put",
                "bank_update",
                "reflect"
            ]
        );
        for &method in crate::services::JSON_SERVICES {
            // `null` is no service's payload: a dispatched call fails decoding it, by name.
            let e: PluginError = ffi
                .call_json(method.into(), "null".into())
                .into_result()
                .unwrap_err()
                .into();
            assert!(
                e.message.starts_with(&format!("malformed {method}:")),
                "{e}"
            );
        }
    }

    #[test]
    fn an_unknown_service_is_refused_by_name() {
        let echo = Echo::default();
        let adapter = HostAdapter(&echo);
        let ffi: FfiHostRef<'_> = FfiHost_TO::from_ptr(&adapter, TD_Opaque);
        let e: PluginError = ffi
            .call_json("bank_vacuum".into(), "{}".into())
            .into_result()
            .unwrap_err()
            .into();
        assert!(
            e.message.starts_with(
                "the host has no service `bank_vacuum` (it offers render_prompt, bank_query"
            ),
            "{e}"
        );
    }
}
