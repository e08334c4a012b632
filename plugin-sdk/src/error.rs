//! The error a plugin returns, and the one the host gets back across the boundary.

use std::fmt;

/// What went wrong, coarsely, so the host can decide what to tell the user.
#[repr(u8)]
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, abi_stable::StableAbi,
)]
pub enum ErrorKind {
    /// The plugin's configuration is invalid (unknown key, bad value, unmet need).
    Config = 0,
    /// The input handed to the plugin is malformed (a batch with mismatched lengths, ...).
    Input = 1,
    /// The plugin panicked; the panic was caught at the boundary.
    Panic = 2,
    /// A host callback failed.
    Host = 3,
    /// Anything else inside the plugin.
    Internal = 4,
}

impl ErrorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Config => "config",
            ErrorKind::Input => "input",
            ErrorKind::Panic => "panic",
            ErrorKind::Host => "host",
            ErrorKind::Internal => "internal",
        }
    }
}

/// An error raised by a plugin (or by a host callback a plugin made).
///
/// The message is written for the user: it names the key, row or file and says what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginError {
    pub kind: ErrorKind,
    pub message: String,
}

impl PluginError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        PluginError {
            kind,
            message: message.into(),
        }
    }
    pub fn config(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Config, message)
    }
    /// `Ok(())` when `ok`, otherwise a config error with `message` (which should name the key,
    /// its value and the accepted range): the building block of a config's `validate`.
    pub fn check_config(ok: bool, message: impl Into<String>) -> Result<(), PluginError> {
        if ok {
            Ok(())
        } else {
            Err(Self::config(message))
        }
    }
    pub fn input(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Input, message)
    }
    pub fn host(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Host, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }

    /// Builds the error for a caught panic payload.
    pub fn from_panic(payload: Box<dyn std::any::Any + Send>) -> Self {
        let message = if let Some(s) = payload.downcast_ref::<&str>() {
            (*s).to_string()
        } else if let Some(s) = payload.downcast_ref::<String>() {
            s.clone()
        } else {
            "non-string panic payload".to_string()
        };
        Self::new(ErrorKind::Panic, format!("panicked: {message}"))
    }
}

impl fmt::Display for PluginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} error: {}", self.kind.as_str(), self.message)
    }
}

impl std::error::Error for PluginError {}

impl From<serde_json::Error> for PluginError {
    fn from(e: serde_json::Error) -> Self {
        PluginError::config(e.to_string())
    }
}

/// `Result` with [`PluginError`].
pub type Result<T, E = PluginError> = std::result::Result<T, E>;
