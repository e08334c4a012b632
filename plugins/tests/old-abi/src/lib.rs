//! `old-abi`: exports a root module that reports Cairn plugin ABI 0, as a plugin built
//! against an old SDK would. The host must refuse it with an error naming the file.

use cairn_plugin_sdk::export::{plugin_info, wrong_kind, RResult, RStr};
use cairn_plugin_sdk::host::ffi::{
    FfiAlgorithmBox, FfiEnvironmentBox, FfiError, FfiPluginInfo, PluginKind,
};

extern "C" fn describe() -> FfiPluginInfo {
    plugin_info(
        "old-abi",
        env!("CARGO_PKG_VERSION"),
        PluginKind::Algorithm,
        "claims ABI 0",
    )
}

extern "C" fn create_algorithm(_config: RStr<'_>) -> RResult<FfiAlgorithmBox, FfiError> {
    wrong_kind("old-abi", PluginKind::Environment)
}

extern "C" fn create_environment(_config: RStr<'_>) -> RResult<FfiEnvironmentBox, FfiError> {
    wrong_kind("old-abi", PluginKind::Algorithm)
}

cairn_plugin_sdk::__export_root_module_with_abi!(0, describe, create_algorithm, create_environment);
