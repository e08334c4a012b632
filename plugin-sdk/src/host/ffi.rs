//! The `repr(C)` side of the boundary: FFI-safe mirrors of the batch types, the `sabi_trait`
//! objects a plugin exports, and the root module every plugin `.so` exposes.
//!
//! Only this module, [`crate::export`] and [`super::foreign`] name `abi_stable` types. Plugin
//! authors and the kernel use the plain types of [`crate::batch`] and the traits of
//! [`crate::algorithm`], [`crate::env`] and [`crate::host`].
//!
//! Hot data (token ids, log-probs, masks, advantages) crosses as flat `RVec`s; small, rarely
//! exchanged structures (observations, requirements, task facts) cross as JSON text, so they
//! can grow fields without an ABI break.
//!
//! Compatibility rule: fields of [`CairnPluginModule`] and trait methods are only ever appended
//! after the `last_prefix_field`; any change to a `repr(C)` struct bumps [`crate::ABI_VERSION`].

#![allow(non_local_definitions, non_camel_case_types)]

use std::panic::{catch_unwind, AssertUnwindSafe};

use abi_stable::{
    declare_root_module_statics,
    library::RootModule,
    package_version_strings, sabi_trait,
    sabi_types::{RRef, VersionStrings},
    std_types::{RBox, RErr, ROk, ROption, RResult, RStr, RString, RVec},
    StableAbi,
};

use crate::batch::{
    AuxTerm, Batch, ContextVariant, FinishReason, Signals, TeacherForm, TeacherSource,
    TeacherTarget, TeacherTerm, TurnRow,
};
use crate::env::Split;
use crate::error::{ErrorKind, PluginError, Result};

/// FFI form of [`PluginError`].
#[repr(C)]
#[derive(Clone, Debug, StableAbi)]
pub struct FfiError {
    pub kind: ErrorKind,
    pub message: RString,
}

impl From<PluginError> for FfiError {
    fn from(e: PluginError) -> Self {
        FfiError {
            kind: e.kind,
            message: e.message.into(),
        }
    }
}

impl From<FfiError> for PluginError {
    fn from(e: FfiError) -> Self {
        PluginError {
            kind: e.kind,
            message: e.message.into(),
        }
    }
}

/// What kind of plugin a `.so` holds.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, StableAbi)]
pub enum PluginKind {
    Algorithm = 0,
    Environment = 1,
}

impl PluginKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PluginKind::Algorithm => "algorithm",
            PluginKind::Environment => "environment",
        }
    }
}

/// FFI form of [`crate::host::foreign::PluginInfo`].
#[repr(C)]
#[derive(Clone, Debug, StableAbi)]
pub struct FfiPluginInfo {
    pub name: RString,
    pub version: RString,
    pub kind: PluginKind,
    pub description: RString,
}

/// FFI form of [`ContextVariant`].
#[repr(C)]
#[derive(Clone, Debug, StableAbi)]
pub struct FfiContextVariant {
    pub label: RString,
    pub inject: RString,
    pub tools_enabled: bool,
    /// JSON object text of [`ContextVariant::extra`] (empty: `{}`).
    pub extra_json: RString,
}

impl From<&ContextVariant> for FfiContextVariant {
    fn from(v: &ContextVariant) -> Self {
        FfiContextVariant {
            label: v.label.as_str().into(),
            inject: v.inject.as_str().into(),
            tools_enabled: v.tools_enabled,
            extra_json: map_to_json(&v.extra),
        }
    }
}

impl TryFrom<&FfiContextVariant> for ContextVariant {
    type Error = PluginError;
    fn try_from(v: &FfiContextVariant) -> Result<Self, PluginError> {
        Ok(ContextVariant {
            label: v.label.to_string(),
            inject: v.inject.to_string(),
            tools_enabled: v.tools_enabled,
            extra: map_from_json("context variant extra", &v.extra_json)?,
        })
    }
}

type JsonMap = serde_json::Map<String, serde_json::Value>;

/// A JSON object's text; the empty map is the empty string (the common case costs nothing).
pub(crate) fn map_to_json(m: &JsonMap) -> RString {
    if m.is_empty() {
        RString::new()
    } else {
        serde_json::to_string(m)
            .expect("a JSON map always serialises")
            .into()
    }
}

pub(crate) fn map_from_json(what: &str, text: &RString) -> Result<JsonMap, PluginError> {
    if text.is_empty() {
        return Ok(JsonMap::new());
    }
    serde_json::from_str(text.as_str())
        .map_err(|e| PluginError::input(format!("{what} is not a JSON object: {e}")))
}

/// FFI form of [`TurnRow`].
#[repr(C)]
#[derive(Clone, Debug, StableAbi)]
pub struct FfiTurnRow {
    pub group_id: u64,
    pub trajectory_id: u64,
    pub turn: u32,
    pub task_id: RString,
    pub policy_version: u64,
    pub variant: FfiContextVariant,
    pub prompt_ids: RVec<u32>,
    pub response_ids: RVec<u32>,
    pub response_logprobs: RVec<f32>,
    pub response_mask: RVec<u8>,
    pub finish_reason: FinishReason,
    pub turn_reward: f32,
    pub episode_reward: f32,
    pub success: bool,
    pub last_turn: bool,
    pub anchor: ROption<RString>,
    pub observation: RString,
    pub feedback: i8,
    pub tool_calls: u32,
    /// JSON object text.
    pub info_json: RString,
    /// JSON object text of [`TurnRow::extra`].
    pub extra_json: RString,
    pub old_logprobs: RVec<f32>,
    pub ref_logprobs: RVec<f32>,
    pub train_prompt_ids: ROption<RVec<u32>>,
}

impl From<&TurnRow> for FfiTurnRow {
    fn from(r: &TurnRow) -> Self {
        FfiTurnRow {
            group_id: r.group_id,
            trajectory_id: r.trajectory_id,
            turn: r.turn,
            task_id: r.task_id.as_str().into(),
            policy_version: r.policy_version,
            variant: (&r.variant).into(),
            prompt_ids: r.prompt_ids.as_slice().into(),
            response_ids: r.response_ids.as_slice().into(),
            response_logprobs: r.response_logprobs.as_slice().into(),
            response_mask: r.response_mask.as_slice().into(),
            finish_reason: r.finish_reason,
            turn_reward: r.turn_reward,
            episode_reward: r.episode_reward,
            success: r.success,
            last_turn: r.last_turn,
            anchor: r.anchor.as_deref().map(RString::from).into(),
            observation: r.observation.as_str().into(),
            feedback: r.feedback,
            tool_calls: r.tool_calls,
            info_json: map_to_json(&r.info),
            extra_json: map_to_json(&r.extra),
            old_logprobs: r.old_logprobs.as_slice().into(),
            ref_logprobs: r.ref_logprobs.as_slice().into(),
            train_prompt_ids: r.train_prompt_ids.as_deref().map(RVec::from).into(),
        }
    }
}

impl TryFrom<&FfiTurnRow> for TurnRow {
    type Error = PluginError;
    fn try_from(r: &FfiTurnRow) -> Result<Self, PluginError> {
        Ok(TurnRow {
            group_id: r.group_id,
            trajectory_id: r.trajectory_id,
            turn: r.turn,
            task_id: r.task_id.to_string(),
            policy_version: r.policy_version,
            variant: ContextVariant::try_from(&r.variant)?,
            prompt_ids: r.prompt_ids.to_vec(),
            response_ids: r.response_ids.to_vec(),
            response_logprobs: r.response_logprobs.to_vec(),
            response_mask: r.response_mask.to_vec(),
            finish_reason: r.finish_reason,
            turn_reward: r.turn_reward,
            episode_reward: r.episode_reward,
            success: r.success,
            last_turn: r.last_turn,
            anchor: r.anchor.as_ref().map(|a| a.to_string()).into_option(),
            observation: r.observation.to_string(),
            feedback: r.feedback,
            tool_calls: r.tool_calls,
            info: map_from_json("row info", &r.info_json)?,
            extra: map_from_json("row extra", &r.extra_json)?,
            old_logprobs: r.old_logprobs.to_vec(),
            ref_logprobs: r.ref_logprobs.to_vec(),
            train_prompt_ids: r
                .train_prompt_ids
                .as_ref()
                .map(|p| p.to_vec())
                .into_option(),
        })
    }
}

/// FFI form of [`Batch`].
#[repr(C)]
#[derive(Clone, Debug, StableAbi)]
pub struct FfiBatch {
    pub step: u64,
    pub rows: RVec<FfiTurnRow>,
}

impl From<&Batch> for FfiBatch {
    fn from(b: &Batch) -> Self {
        FfiBatch {
            step: b.step,
            rows: b.rows.iter().map(FfiTurnRow::from).collect(),
        }
    }
}

impl TryFrom<&FfiBatch> for Batch {
    type Error = PluginError;
    fn try_from(b: &FfiBatch) -> Result<Self, PluginError> {
        Ok(Batch {
            step: b.step,
            rows: b
                .rows
                .iter()
                .map(TurnRow::try_from)
                .collect::<Result<_, _>>()?,
        })
    }
}

/// FFI form of [`AuxTerm`].
#[repr(C)]
#[derive(Clone, Debug, StableAbi)]
pub struct FfiAuxTerm {
    pub name: RString,
    pub coef: f32,
    pub coefficients: RVec<RVec<f32>>,
}

/// A named scalar metric.
#[repr(C)]
#[derive(Clone, Debug, StableAbi)]
pub struct FfiMetric {
    pub name: RString,
    pub value: f64,
}

/// FFI form of [`Signals`].
#[repr(C)]
#[derive(Clone, Debug, StableAbi)]
pub struct FfiSignals {
    pub advantages: RVec<RVec<f32>>,
    pub advantage_scale: RVec<RVec<f32>>,
    pub advantage_add: RVec<RVec<f32>>,
    pub aux: RVec<FfiAuxTerm>,
    pub teacher: RVec<FfiTeacherTerm>,
    pub extra_rows: RVec<FfiTurnRow>,
    pub dropped_groups: RVec<u64>,
    pub metrics: RVec<FfiMetric>,
}

/// FFI form of [`TeacherTerm`]: the form as JSON, the targets as flat arrays.
#[repr(C)]
#[derive(Clone, Debug, StableAbi)]
pub struct FfiTeacherTerm {
    pub name: RString,
    pub coef: f32,
    /// [`TeacherForm`] as JSON.
    pub form_json: RString,
    pub targets: RVec<FfiTeacherTarget>,
}

/// FFI form of [`TeacherTarget`]: `live` selects [`TeacherSource::Context`] (`context_ids`)
/// or [`TeacherSource::Fixed`] (`logprobs`, `top_ids`, `top_logprobs`).
#[repr(C)]
#[derive(Clone, Debug, StableAbi)]
pub struct FfiTeacherTarget {
    pub row: u64,
    pub weights: RVec<f32>,
    pub live: bool,
    pub context_ids: RVec<u32>,
    pub logprobs: RVec<f32>,
    pub top_ids: RVec<u32>,
    pub top_logprobs: RVec<f32>,
}

impl From<TeacherTerm> for FfiTeacherTerm {
    fn from(t: TeacherTerm) -> Self {
        FfiTeacherTerm {
            name: t.name.into(),
            coef: t.coef,
            form_json: serde_json::to_string(&t.form)
                .expect("a teacher form always serialises")
                .into(),
            targets: t
                .targets
                .into_iter()
                .map(|t| {
                    let mut out = FfiTeacherTarget {
                        row: t.row as u64,
                        weights: t.weights.into(),
                        live: false,
                        context_ids: RVec::new(),
                        logprobs: RVec::new(),
                        top_ids: RVec::new(),
                        top_logprobs: RVec::new(),
                    };
                    match t.source {
                        TeacherSource::Context { context_ids } => {
                            out.live = true;
                            out.context_ids = context_ids.into();
                        }
                        TeacherSource::Fixed {
                            logprobs,
                            top_ids,
                            top_logprobs,
                        } => {
                            out.logprobs = logprobs.into();
                            out.top_ids = top_ids.into();
                            out.top_logprobs = top_logprobs.into();
                        }
                    }
                    out
                })
                .collect(),
        }
    }
}

impl TryFrom<FfiTeacherTerm> for TeacherTerm {
    type Error = PluginError;
    fn try_from(t: FfiTeacherTerm) -> Result<Self, PluginError> {
        let form: TeacherForm = serde_json::from_str(t.form_json.as_str())
            .map_err(|e| PluginError::input(format!("teacher term `{}`: bad form: {e}", t.name)))?;
        Ok(TeacherTerm {
            name: t.name.into(),
            coef: t.coef,
            form,
            targets: t
                .targets
                .into_iter()
                .map(|t| TeacherTarget {
                    row: t.row as usize,
                    weights: t.weights.into_vec(),
                    source: if t.live {
                        TeacherSource::Context {
                            context_ids: t.context_ids.into_vec(),
                        }
                    } else {
                        TeacherSource::Fixed {
                            logprobs: t.logprobs.into_vec(),
                            top_ids: t.top_ids.into_vec(),
                            top_logprobs: t.top_logprobs.into_vec(),
                        }
                    },
                })
                .collect(),
        })
    }
}

fn nested_to_ffi(v: Vec<Vec<f32>>) -> RVec<RVec<f32>> {
    v.into_iter().map(RVec::from).collect()
}

fn nested_from_ffi(v: RVec<RVec<f32>>) -> Vec<Vec<f32>> {
    v.into_iter().map(RVec::into_vec).collect()
}

impl From<Signals> for FfiSignals {
    fn from(s: Signals) -> Self {
        FfiSignals {
            advantages: nested_to_ffi(s.advantages),
            advantage_scale: nested_to_ffi(s.advantage_scale),
            advantage_add: nested_to_ffi(s.advantage_add),
            aux: s
                .aux
                .into_iter()
                .map(|t| FfiAuxTerm {
                    name: t.name.into(),
                    coef: t.coef,
                    coefficients: nested_to_ffi(t.coefficients),
                })
                .collect(),
            teacher: s.teacher.into_iter().map(FfiTeacherTerm::from).collect(),
            extra_rows: s.extra_rows.iter().map(FfiTurnRow::from).collect(),
            dropped_groups: s.dropped_groups.into(),
            metrics: s
                .metrics
                .into_iter()
                .map(|(name, value)| FfiMetric {
                    name: name.into(),
                    value,
                })
                .collect(),
        }
    }
}

impl TryFrom<FfiSignals> for Signals {
    type Error = PluginError;
    fn try_from(s: FfiSignals) -> Result<Self, PluginError> {
        Ok(Signals {
            advantages: nested_from_ffi(s.advantages),
            advantage_scale: nested_from_ffi(s.advantage_scale),
            advantage_add: nested_from_ffi(s.advantage_add),
            aux: s
                .aux
                .into_iter()
                .map(|t| AuxTerm {
                    name: t.name.into(),
                    coef: t.coef,
                    coefficients: nested_from_ffi(t.coefficients),
                })
                .collect(),
            teacher: s
                .teacher
                .into_iter()
                .map(TeacherTerm::try_from)
                .collect::<Result<_, _>>()?,
            extra_rows: s
                .extra_rows
                .iter()
                .map(TurnRow::try_from)
                .collect::<Result<_, _>>()?,
            dropped_groups: s.dropped_groups.into_vec(),
            metrics: s
                .metrics
                .into_iter()
                .map(|m| (m.name.into(), m.value))
                .collect(),
        })
    }
}

/// FFI form of [`crate::services::ScoreRequest`].
#[repr(C)]
#[derive(Clone, Debug, StableAbi)]
pub struct FfiScoreRequest {
    pub context_ids: RVec<u32>,
    pub response_ids: RVec<u32>,
    /// [`crate::ScoreWeights`]: 0 current, 1 a version (`version`), 2 reference.
    pub weights: u8,
    pub version: u64,
    /// Softmax temperature; NaN: the rollout temperature.
    pub temperature: f32,
    pub top_k: u32,
}

/// FFI form of [`crate::Scored`].
#[repr(C)]
#[derive(Clone, Debug, StableAbi)]
pub struct FfiScored {
    pub logprobs: RVec<f32>,
    pub top_ids: RVec<u32>,
    pub top_logprobs: RVec<f32>,
}

/// FFI form of [`crate::services::GenerateRequest`].
#[repr(C)]
#[derive(Clone, Debug, StableAbi)]
pub struct FfiGenerateRequest {
    pub prompt_ids: RVec<u32>,
    pub max_new_tokens: u32,
    pub temperature: f32,
    pub top_p: f32,
    pub seed: u64,
}

/// FFI form of [`crate::services::Generation`].
#[repr(C)]
#[derive(Clone, Debug, StableAbi)]
pub struct FfiGeneration {
    pub ids: RVec<u32>,
    pub logprobs: RVec<f32>,
    pub finish_reason: FinishReason,
}

/// Host callbacks, as seen from a plugin. Implemented on the host side by
/// [`crate::host::foreign`]'s adapter; wrapped on the plugin side into a [`crate::Host`].
///
/// Hot data (scores, generations) crosses as flat arrays; every other service (prompt
/// rendering, the bank, the skill creator, and any added later) goes through
/// [`FfiHost::call_json`] with a method name and JSON payloads, so new services need no ABI
/// change.
#[sabi_trait]
pub trait FfiHost {
    fn score(&self, requests: RVec<FfiScoreRequest>) -> RResult<RVec<FfiScored>, FfiError>;
    fn generate(
        &self,
        requests: RVec<FfiGenerateRequest>,
    ) -> RResult<RVec<FfiGeneration>, FfiError>;
    fn tokenize(&self, text: RStr<'_>) -> RResult<RVec<u32>, FfiError>;
    /// A JSON service call (see [`crate::services::JSON_SERVICES`]); returns the result as JSON.
    fn call_json(&self, method: RStr<'_>, payload: RStr<'_>) -> RResult<RString, FfiError>;
    #[sabi(last_prefix_field)]
    fn log_metric(&self, name: RStr<'_>, value: f64);
}

/// A borrowed host callback object, valid for the duration of one plugin call.
pub type FfiHostRef<'a> = FfiHost_TO<'a, RRef<'a, ()>>;

/// An algorithm instance living in a plugin.
#[sabi_trait]
pub trait FfiAlgorithm: Send {
    /// [`crate::Requirements`] as JSON.
    fn requirements_json(&self) -> RResult<RString, FfiError>;
    /// Takes a [`crate::GroupRequest`] as JSON.
    fn plan_group(
        &mut self,
        request_json: RStr<'_>,
        host: FfiHostRef<'_>,
    ) -> RResult<RVec<FfiContextVariant>, FfiError>;
    /// Takes a [`crate::TurnContextRequest`] as JSON, returns a [`crate::TurnContext`] as JSON.
    fn next_context(
        &mut self,
        request_json: RStr<'_>,
        host: FfiHostRef<'_>,
    ) -> RResult<RString, FfiError>;
    fn signals(&self, batch: &FfiBatch, host: FfiHostRef<'_>) -> RResult<FfiSignals, FfiError>;
    /// A [`crate::StepReport`]: its batch as `batch`, the other fields as JSON (`batch` empty).
    fn observe(
        &mut self,
        batch: &FfiBatch,
        report_json: RStr<'_>,
        host: FfiHostRef<'_>,
    ) -> RResult<(), FfiError>;
    fn save_state(&self) -> RResult<RString, FfiError>;
    #[sabi(last_prefix_field)]
    fn load_state(&mut self, state: RStr<'_>) -> RResult<(), FfiError>;
}

pub type FfiAlgorithmBox = FfiAlgorithm_TO<'static, RBox<()>>;

/// A running episode living in a plugin. Observations and outcomes cross as JSON.
#[sabi_trait]
pub trait FfiEpisode: Send {
    fn observation_json(&self) -> RResult<RString, FfiError>;
    fn step_json(&mut self, action: RStr<'_>) -> RResult<RString, FfiError>;
    #[sabi(last_prefix_field)]
    fn expert_action(&self) -> RResult<ROption<RString>, FfiError>;
}

pub type FfiEpisodeBox = FfiEpisode_TO<'static, RBox<()>>;

/// An environment living in a plugin.
#[sabi_trait]
pub trait FfiEnvironment: Send + Sync {
    fn info_json(&self) -> RResult<RString, FfiError>;
    fn task_json(&self, split: Split, index: u64) -> RResult<RString, FfiError>;
    #[sabi(last_prefix_field)]
    fn start(
        &self,
        split: Split,
        index: u64,
        seed: u64,
        variant: &FfiContextVariant,
    ) -> RResult<FfiEpisodeBox, FfiError>;
}

pub type FfiEnvironmentBox = FfiEnvironment_TO<'static, RBox<()>>;

/// The root module of every Cairn plugin `.so`.
///
/// `cairn_abi` is the first field and never moves, so the host can read it before checking the
/// rest of the layout and report a version mismatch in plain words.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = CairnPluginRef)))]
#[sabi(missing_field(panic))]
pub struct CairnPluginModule {
    pub cairn_abi: u32,
    pub describe: extern "C" fn() -> FfiPluginInfo,
    /// Takes the algorithm's config as JSON. Errors for an environment plugin.
    pub create_algorithm: extern "C" fn(RStr<'_>) -> RResult<FfiAlgorithmBox, FfiError>,
    /// Takes the environment's config as JSON. Errors for an algorithm plugin.
    #[sabi(last_prefix_field)]
    pub create_environment: extern "C" fn(RStr<'_>) -> RResult<FfiEnvironmentBox, FfiError>,
}

impl RootModule for CairnPluginRef {
    declare_root_module_statics! {CairnPluginRef}
    const BASE_NAME: &'static str = "cairn_plugin";
    const NAME: &'static str = "cairn_plugin";
    const VERSION_STRINGS: VersionStrings = package_version_strings!();
}

/// The symbol name under which abi_stable looks up a library's root module.
/// [`crate::export::LIB_HEADER`] spells it as a literal (`export_name` takes no constants); a
/// test pins it to abi_stable's.
pub const ROOT_MODULE_SYMBOL: &str = "_1as_0lib_1header_0root_bmodule_bloader";

/// Runs `f`, turning an `Err` or a panic into an FFI error.
pub fn guard<T>(f: impl FnOnce() -> Result<T>) -> RResult<T, FfiError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => ROk(v),
        Ok(Err(e)) => RErr(e.into()),
        Err(payload) => RErr(PluginError::from_panic(payload).into()),
    }
}

/// Reads a JSON payload that crossed the boundary; `what` names it in the error.
pub fn from_json<T: serde::de::DeserializeOwned>(what: &str, text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|e| PluginError::input(format!("malformed {what}: {e}")))
}

/// Writes a value as the JSON that crosses the boundary.
pub fn to_json<T: serde::Serialize>(value: &T) -> Result<RString> {
    serde_json::to_string(value)
        .map(RString::from)
        .map_err(|e| PluginError::internal(format!("serialising to JSON: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abi_3_signals_cross_the_ffi_unchanged() {
        use crate::{TeacherForm, TeacherSource, TeacherTarget, TeacherTerm, TurnRow};
        let extra = TurnRow {
            response_ids: vec![4, 5],
            response_logprobs: vec![-0.5, -1.0],
            response_mask: vec![1, 1],
            train_prompt_ids: Some(vec![9]),
            ..TurnRow::default()
        };
        let signals = Signals {
            advantages: vec![vec![0.8, 0.8], vec![0.0, 0.0]],
            advantage_scale: vec![vec![1.5, 1.0], vec![1.0, 1.0]],
            advantage_add: vec![vec![0.2, -0.1], vec![0.0, 0.3]],
            teacher: vec![TeacherTerm {
                name: "opd".into(),
                coef: 0.5,
                form: TeacherForm::TopKForwardKl { k: 1 },
                targets: vec![TeacherTarget {
                    row: 1,
                    weights: vec![1.0, 0.5],
                    source: TeacherSource::Fixed {
                        logprobs: vec![],
                        top_ids: vec![7, 8],
                        top_logprobs: vec![-0.1, -0.2],
                    },
                }],
            }],
            extra_rows: vec![extra],
            ..Signals::default()
        };
        let back = Signals::try_from(FfiSignals::from(signals.clone())).unwrap();
        assert_eq!(back, signals);
    }

    #[test]
    fn a_turn_contexts_prompt_extra_crosses_as_json_and_may_be_absent() {
        use crate::TurnContext;
        let mut extra = serde_json::Map::new();
        extra.insert("echo_records".into(), serde_json::json!([2, 0]));
        let prompt = TurnContext::Prompt {
            prompt_ids: vec![1, 2],
            extra,
        };
        let json = serde_json::to_string(&prompt).unwrap();
        assert_eq!(
            json,
            r#"{"kind":"prompt","prompt_ids":[1,2],"extra":{"echo_records":[2,0]}}"#
        );
        assert_eq!(serde_json::from_str::<TurnContext>(&json).unwrap(), prompt);
        let bare: TurnContext =
            serde_json::from_str(r#"{"kind":"prompt","prompt_ids":[3]}"#).unwrap();
        assert_eq!(
            bare,
            TurnContext::Prompt {
                prompt_ids: vec![3],
                extra: Default::default()
            }
        );
    }

    #[test]
    fn root_module_symbol_matches_abi_stable() {
        assert_eq!(
            ROOT_MODULE_SYMBOL,
            abi_stable::library::ROOT_MODULE_LOADER_NAME
        );
    }
}
