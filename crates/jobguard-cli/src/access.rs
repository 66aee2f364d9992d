//! Who may read and who may change what over HTTP, for `jobguard serve` and the metrics
//! endpoints of `jobguard worker` and `jobguard consume`.
//!
//! - On a loopback address (the default) reads are open to local clients, and the `Host`
//!   header must name a loopback host, so a web page cannot reach them through DNS rebinding.
//! - Any other address needs a token, and then every request but the public pages and
//!   `/health` must carry `Authorization: Bearer TOKEN`.
//! - Every write (any method but GET and HEAD) needs the token, in the `Authorization` header
//!   only (never a cookie, which a browser would attach to a forged request), and is refused
//!   when the browser says it comes from another site: a `Sec-Fetch-Site` other than
//!   `same-origin` or `none`, or an `Origin` that is not this server.
//!
//! The token is compared in constant time and never printed or logged.
//!
//! - No page, of another site or of this one, may show `jobguard serve`'s responses in a frame
//!   ([`unframed`]), so a page cannot lay its own buttons over the console's replay, retry or
//!   delete and have an operator click them (clickjacking).

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde_json::json;
use subtle::ConstantTimeEq as _;
use tower_http::set_header::SetResponseHeaderLayer;

use crate::args::Token;

/// Who may do what, for [`check_access`].
pub struct Access {
    pub token: Option<Token>,
    /// Listening on a non-loopback address: every request but the public ones needs the token.
    pub open: bool,
    /// Paths anyone who can reach the server may read: the pages themselves and `/health`.
    pub public: &'static [&'static str],
}

/// `router` with every response, refusals and not-found included, forbidding browsers to show
/// it in a frame: `X-Frame-Options: DENY` for older browsers, the CSP's
/// `frame-ancestors 'none'` for the rest. Added outermost, so that it covers what
/// [`check_access`] turns away too.
pub fn unframed(router: Router) -> Router {
    router
        .layer(SetResponseHeaderLayer::overriding(
            header::X_FRAME_OPTIONS,
            HeaderValue::from_static("DENY"),
        ))
        .layer(SetResponseHeaderLayer::overriding(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static("frame-ancestors 'none'"),
        ))
}

/// Whether `headers` carry `Authorization: Bearer <token>`, compared in constant time.
pub fn admits(token: &Token, headers: &HeaderMap) -> bool {
    let Some(given) = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
    else {
        return false;
    };
    given.as_bytes().ct_eq(token.secret().as_bytes()).into()
}

/// The access middleware: the `Host` header on a loopback address, where the request comes
/// from for writes, and the token where it is needed.
pub async fn check_access(
    State(access): State<Arc<Access>>,
    request: Request,
    next: Next,
) -> Response {
    if !access.open && !names_loopback(request.headers()) {
        // A browser sends the name it resolved: another name pointing at 127.0.0.1 is a web
        // page trying to read local figures through DNS rebinding.
        return failure(
            StatusCode::MISDIRECTED_REQUEST,
            "this server answers only to a loopback host name such as 127.0.0.1 or localhost"
                .into(),
        );
    }
    let path = request.uri().path();
    let writing = !matches!(*request.method(), Method::GET | Method::HEAD);
    if writing && let Some(refusal) = cross_site(request.headers()) {
        tracing::info!(method = %request.method(), path, "refused a cross-site write");
        return failure(StatusCode::FORBIDDEN, refusal);
    }
    let public = access.public.contains(&path);
    if writing || (access.open && !public) {
        match &access.token {
            Some(token) if admits(token, request.headers()) => {}
            Some(_) => {
                tracing::info!(
                    method = %request.method(),
                    path,
                    "refused a request without the token"
                );
                let mut response = failure(
                    StatusCode::UNAUTHORIZED,
                    "this needs the server's token, as `Authorization: Bearer TOKEN`".into(),
                );
                response
                    .headers_mut()
                    .insert(header::WWW_AUTHENTICATE, "Bearer".parse().expect("valid"));
                return response;
            }
            None => {
                return failure(
                    StatusCode::FORBIDDEN,
                    "changes are off: start jobguard serve with --token (or JOBGUARD_TOKEN)".into(),
                );
            }
        }
    }
    next.run(request).await
}

/// Why a write must be refused as coming from another site, if it must: what the browser says
/// in `Sec-Fetch-Site`, or an `Origin` that is not the `Host` the request was sent to. Clients
/// that are not browsers send neither.
fn cross_site(headers: &HeaderMap) -> Option<String> {
    if let Some(site) = headers.get("sec-fetch-site") {
        let site = site.to_str().unwrap_or("");
        if !matches!(site, "same-origin" | "none") {
            return Some(format!(
                "a change sent from another site (Sec-Fetch-Site: {site}) is refused; use the \
                 console's own pages or a client of your own"
            ));
        }
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        let host = headers
            .get(header::HOST)
            .and_then(|host| host.to_str().ok())
            .unwrap_or("");
        let same = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"))
            .is_some_and(|authority| !host.is_empty() && authority.eq_ignore_ascii_case(host));
        if !same {
            return Some(format!(
                "a change sent from another origin ({origin}) is refused; use the console's own \
                 pages or a client of your own"
            ));
        }
    }
    None
}

/// Whether the `Host` header, when there is one, names a loopback host.
pub fn names_loopback(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST) else {
        return true;
    };
    let Ok(host) = host.to_str() else {
        return false;
    };
    let name = match host.strip_prefix('[') {
        Some(bracketed) => bracketed.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(name, _port)| name),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<IpAddr>()
            .is_ok_and(|address| address.is_loopback())
}

/// An error answer: `{"error": message}`.
pub fn failure(status: StatusCode, message: String) -> Response {
    (status, Json(json!({"error": message}))).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(name.clone(), value.parse().unwrap());
        }
        headers
    }

    #[test]
    fn tokens_are_long_hidden_and_compared_whole() {
        assert!(Token::parse("short").is_err());
        assert!(Token::parse("sixteen chars ok").is_err(), "no spaces");
        let token = Token::parse("0123456789abcdef").unwrap();
        assert_eq!(format!("{token:?}"), "Token(***)");
        let bearer = |value: &str| headers(&[(header::AUTHORIZATION, value)]);
        assert!(admits(&token, &bearer("Bearer 0123456789abcdef")));
        assert!(!admits(&token, &bearer("Bearer 0123456789abcde")));
        assert!(!admits(&token, &bearer("Bearer 0123456789abcdef0")));
        assert!(!admits(&token, &bearer("0123456789abcdef")));
        assert!(!admits(&token, &HeaderMap::new()));
        let cookie = headers(&[(header::COOKIE, "token=0123456789abcdef")]);
        assert!(!admits(&token, &cookie), "a cookie is not the header");
    }

    #[test]
    fn only_loopback_host_names_pass() {
        for host in [
            "127.0.0.1:9464",
            "localhost:9464",
            "[::1]:9464",
            "127.0.0.1",
        ] {
            assert!(names_loopback(&headers(&[(header::HOST, host)])), "{host}");
        }
        for host in ["evil.example:9464", "10.0.0.7:9464", "[fe80::1]:80"] {
            assert!(!names_loopback(&headers(&[(header::HOST, host)])), "{host}");
        }
        assert!(names_loopback(&HeaderMap::new()));
    }

    #[test]
    fn writes_from_other_sites_are_refused() {
        let host = (header::HOST, "127.0.0.1:9464");
        let site = header::HeaderName::from_static("sec-fetch-site");
        assert!(
            cross_site(&headers(std::slice::from_ref(&host))).is_none(),
            "curl"
        );
        for fine in ["same-origin", "none"] {
            assert!(cross_site(&headers(&[host.clone(), (site.clone(), fine)])).is_none());
        }
        for refused in ["cross-site", "same-site"] {
            assert!(cross_site(&headers(&[host.clone(), (site.clone(), refused)])).is_some());
        }
        let origin = |value| headers(&[host.clone(), (header::ORIGIN, value)]);
        assert!(cross_site(&origin("http://127.0.0.1:9464")).is_none());
        assert!(cross_site(&origin("http://evil.example")).is_some());
        assert!(cross_site(&origin("http://127.0.0.1:9465")).is_some());
        assert!(cross_site(&origin("null")).is_some());
    }
}
