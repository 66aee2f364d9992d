//! Error responses, shared by the server that writes them and the client that reads them.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

/// `type` of a `422` for a key used with other parameters.
pub(crate) const IDEMPOTENCY_ERROR: &str = "idempotency_error";

/// The body of every error response: `{"error": {"type": ..., "message": ...}}`.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ErrorBody {
    pub(crate) error: ErrorDetail,
}

/// What went wrong, as Stripe reports it.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ErrorDetail {
    #[serde(rename = "type")]
    pub(crate) kind: String,
    pub(crate) message: String,
}

/// An error answer from a handler.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
}

impl ApiError {
    /// `400`: the request is malformed.
    pub(crate) fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// `409`: a request with the same idempotency key is still being processed.
    pub(crate) fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", message)
    }

    /// `422`: the idempotency key was used with other parameters.
    pub(crate) fn key_reused(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, IDEMPOTENCY_ERROR, message)
    }

    /// `422`: the request is well formed but refused.
    pub(crate) fn unprocessable(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request_error",
            message,
        )
    }

    /// `503`: the provider cannot answer right now.
    pub(crate) fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "api_error", message)
    }

    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            message: message.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                kind: self.kind.to_owned(),
                message: self.message,
            },
        };
        (self.status, Json(body)).into_response()
    }
}
