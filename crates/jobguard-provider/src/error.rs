//! The error a [`ProviderClient`](crate::ProviderClient) call returns.

/// Why a call to the provider failed.
///
/// [`is_retryable`](Self::is_retryable) says whether sending the same request again, with the
/// same idempotency key, can succeed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProviderError {
    /// `409`: a request with this idempotency key is still being processed.
    ///
    /// The outcome is not known yet. Retry later with the same key: the retry gets the original
    /// charge once the first request has finished, or creates it if that request was abandoned.
    #[error(
        "a request with this idempotency key is still being processed: \
         retry later with the same key"
    )]
    InFlight,

    /// `422`: the idempotency key was already used with other parameters.
    ///
    /// Nothing was created. The caller derived the same key for different work, or the
    /// parameters changed between attempts.
    #[error(
        "idempotency key `{key}` was already used with other parameters: nothing was charged; \
         resend the original parameters, or give a new charge its own key"
    )]
    KeyReused {
        /// The reused key.
        key: String,
    },

    /// A `5xx`: the provider could not answer; whether anything happened is unknown.
    #[error("the provider is unavailable (http {status}): retry later")]
    Unavailable {
        /// The HTTP status.
        status: u16,
    },

    /// Any other non-success status: the provider refused the request as sent.
    #[error(
        "the provider rejected the request (http {status}): {message}; \
         fix the request, as sending it again will not help"
    )]
    Rejected {
        /// The HTTP status.
        status: u16,
        /// The provider's explanation.
        message: String,
    },

    /// The request or its response did not make it: connection refused, reset, or timed out.
    ///
    /// Whether the provider acted on the request is unknown.
    #[error(
        "could not talk to the provider: check that it is running at the configured url, \
         then retry"
    )]
    Transport(#[source] reqwest::Error),

    /// A success response whose body is not what the endpoint returns.
    #[error(
        "the provider's response is not the expected json: \
         check that the url points at a jobguard provider"
    )]
    Decode(#[source] serde_json::Error),
}

impl ProviderError {
    /// Whether the same request, with the same idempotency key, may succeed later:
    /// `true` for [`InFlight`](Self::InFlight), [`Unavailable`](Self::Unavailable) and
    /// [`Transport`](Self::Transport).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::InFlight | Self::Unavailable { .. } | Self::Transport(_)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_transient_failures_are_retryable() {
        assert!(ProviderError::InFlight.is_retryable());
        assert!(ProviderError::Unavailable { status: 503 }.is_retryable());
        let reused = ProviderError::KeyReused {
            key: "k".to_owned(),
        };
        assert!(!reused.is_retryable());
        let rejected = ProviderError::Rejected {
            status: 400,
            message: "bad".to_owned(),
        };
        assert!(!rejected.is_retryable());
        let decode = serde_json::from_str::<u8>("x").unwrap_err();
        assert!(!ProviderError::Decode(decode).is_retryable());
    }
}
