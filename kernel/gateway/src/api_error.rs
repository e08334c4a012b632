//! [`ApiError`]: what a gateway request can fail with, in the OpenAI error form.
//!
//! This is the gateway's wire error, separate from the kernel's [`cairn_kernel::Error`]: every variant
//! knows its HTTP status and OpenAI `type`, so the host's HTTP layer only serialises it
//! (`{"error": {"message", "type", "param", "code"}}`). A kernel error reaching a request
//! (tokenizer, template, policy actor) becomes [`ApiErrorKind::Internal`] or, for a template
//! that rejects the messages, [`ApiErrorKind::InvalidRequest`].

use serde_json::{json, Value as Json};

/// The class of a failed request; decides the status and the OpenAI `type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiErrorKind {
    /// 400: the request is malformed or asks for something unsupported.
    InvalidRequest,
    /// 401: no API key, or not one the gateway knows.
    Unauthorized,
    /// 403: a key without the right (the inference key on a control route), a Host or
    /// Origin the gateway does not serve, a weight directory outside the configured roots.
    Forbidden,
    /// 408: the request body did not arrive within `source.body_timeout_s`.
    Timeout,
    /// 415: a body that is not declared `Content-Type: application/json`.
    UnsupportedMediaType,
    /// 429: more connections from one client than `source.max_connections_per_client`, or
    /// more open episodes than `source.max_open_episodes`.
    TooManyRequests,
    /// 404: unknown model, episode or route.
    NotFound,
    /// 409: the episode is closed, or its reward was already posted.
    Conflict,
    /// 413: the body is larger than the gateway accepts.
    TooLarge,
    /// 503: the policy is not reachable (shutting down).
    Unavailable,
    /// 500: a bug or a backend failure; other requests are unaffected.
    Internal,
}

/// A failed request: kind, message, and the parameter and code OpenAI clients read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub kind: ApiErrorKind,
    pub message: String,
    /// The request parameter at fault (`max_tokens`, `messages`...).
    pub param: Option<String>,
    /// A machine-readable code (`model_not_found`, `context_length_exceeded`...).
    pub code: Option<String>,
}

impl ApiError {
    pub fn new(kind: ApiErrorKind, message: impl Into<String>) -> ApiError {
        ApiError {
            kind,
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// A 400 about one parameter.
    pub fn invalid(param: &str, message: impl Into<String>) -> ApiError {
        ApiError::new(ApiErrorKind::InvalidRequest, message).with_param(param)
    }

    /// A 400 about a string parameter longer than `max` bytes (OpenAI's code
    /// `string_above_max_length`); the message gives both lengths, not the string.
    pub fn string_too_long(param: &str, len: usize, max: usize) -> ApiError {
        ApiError::invalid(
            param,
            format!("`{param}` is {len} bytes long; the gateway takes at most {max} bytes"),
        )
        .with_code("string_above_max_length")
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(ApiErrorKind::NotFound, message)
    }

    pub fn conflict(message: impl Into<String>) -> ApiError {
        ApiError::new(ApiErrorKind::Conflict, message)
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(ApiErrorKind::Internal, message)
    }

    pub fn with_param(mut self, param: &str) -> ApiError {
        self.param = Some(param.to_owned());
        self
    }

    pub fn with_code(mut self, code: &str) -> ApiError {
        self.code = Some(code.to_owned());
        self
    }

    /// The HTTP status code.
    pub fn status(&self) -> u16 {
        match self.kind {
            ApiErrorKind::InvalidRequest => 400,
            ApiErrorKind::Unauthorized => 401,
            ApiErrorKind::Forbidden => 403,
            ApiErrorKind::Timeout => 408,
            ApiErrorKind::UnsupportedMediaType => 415,
            ApiErrorKind::TooManyRequests => 429,
            ApiErrorKind::NotFound => 404,
            ApiErrorKind::Conflict => 409,
            ApiErrorKind::TooLarge => 413,
            ApiErrorKind::Unavailable => 503,
            ApiErrorKind::Internal => 500,
        }
    }

    /// The OpenAI error `type`.
    pub fn type_name(&self) -> &'static str {
        match self.kind {
            ApiErrorKind::InvalidRequest
            | ApiErrorKind::TooLarge
            | ApiErrorKind::Timeout
            | ApiErrorKind::UnsupportedMediaType => "invalid_request_error",
            ApiErrorKind::Unauthorized => "authentication_error",
            ApiErrorKind::Forbidden => "permission_error",
            ApiErrorKind::TooManyRequests => "rate_limit_error",
            ApiErrorKind::NotFound => "not_found_error",
            ApiErrorKind::Conflict => "conflict_error",
            ApiErrorKind::Unavailable => "service_unavailable_error",
            ApiErrorKind::Internal => "server_error",
        }
    }

    /// The response body: `{"error": {"message", "type", "param", "code"}}`.
    pub fn to_json(&self) -> Json {
        json!({"error": {
            "message": self.message,
            "type": self.type_name(),
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl From<cairn_kernel::Error> for ApiError {
    fn from(e: cairn_kernel::Error) -> ApiError {
        match e {
            // The messages did not render: the template refused them (roles, tool calls).
            cairn_kernel::Error::Template { .. } => ApiError::invalid("messages", e.to_string()),
            cairn_kernel::Error::Mailbox(_) => ApiError::new(
                ApiErrorKind::Unavailable,
                format!("the policy is not available: {e}"),
            ),
            other => ApiError::internal(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serialises_in_the_openai_form() {
        let e = ApiError::invalid("max_tokens", "too small").with_code("integer_below_min_value");
        assert_eq!(e.status(), 400);
        assert_eq!(
            e.to_json(),
            json!({"error": {"message": "too small", "type": "invalid_request_error",
                             "param": "max_tokens", "code": "integer_below_min_value"}})
        );
        assert_eq!(ApiError::conflict("x").status(), 409);
        let busy = ApiError::new(ApiErrorKind::TooManyRequests, "x");
        assert_eq!((busy.status(), busy.type_name()), (429, "rate_limit_error"));
    }
}
