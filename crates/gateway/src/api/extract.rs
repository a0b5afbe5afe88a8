//! Extractors that turn every malformed request into an OpenAI-shaped error.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, RawPathParams, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use serde::de::DeserializeOwned;

use super::error::ApiError;
use super::AppState;
use crate::store::governance::KeyGrant;
use std::sync::Arc;

/// A JSON body: empty, malformed, too large or mistyped bodies become 400/413 with the offending `param`.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let bytes = read_body(req, state).await?;
        parse_json(&bytes).map(ApiJson)
    }
}

/// A JSON body read as [`ApiJson`] reads it, with the request's `Idempotency-Key` header and, when it carries one,
/// the digest of the body's bytes (SHA-256, hex): a repeat under the key must send the same body. (The header is
/// taken here so that a create does not copy every header to read one.)
pub struct KeyedJson<T> {
    pub body: T,
    pub idempotency_key: Option<HeaderValue>,
    pub digest: Option<String>,
}

impl<T: DeserializeOwned> FromRequest<AppState> for KeyedJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        use sha2::Digest;
        let idempotency_key = req.headers().get("idempotency-key").cloned();
        let bytes = read_body(req, state).await?;
        let digest = idempotency_key
            .is_some()
            .then(|| hex::encode(sha2::Sha256::digest(&bytes)));
        let body = parse_json(&bytes)?;
        Ok(KeyedJson {
            body,
            idempotency_key,
            digest,
        })
    }
}

/// The whole body of `req`, within the body limit; a body over it is a `413` that says the limit.
async fn read_body(req: Request, state: &AppState) -> Result<Bytes, ApiError> {
    Bytes::from_request(req, state).await.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            // The body limit is the one a WebSocket message meets (`server.body_limit_bytes`).
            ApiError::payload_too_large(state.websocket_message_limit)
        } else {
            ApiError::invalid(
                format!("Could not read the request body: {}", rejection.body_text()),
                None,
                None,
            )
        }
    })
}

/// Parses a JSON text (a request body, or a WebSocket message) into `T`; every failure is an OpenAI-shaped 400
/// naming the offending `param`.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::invalid(
            "The request body is empty; expected a JSON object.",
            None,
            Some("empty_body"),
        ));
    }
    if has_escaped_nul(bytes) {
        return Err(ApiError::invalid(
            "The request contains a NUL character (\\u0000), which the gateway cannot store.",
            None,
            Some("invalid_nul_character"),
        ));
    }
    // As `gateway_core::json::from_bytes` reads (UTF-8 checked once for the whole body), but with the reader kept:
    // what follows the value is refused with an error of its own.
    match std::str::from_utf8(bytes) {
        Ok(text) => read_whole(serde_json::Deserializer::from_str(text), bytes),
        Err(_) => read_whole(serde_json::Deserializer::from_slice(bytes), bytes),
    }
}

/// Reads `T` from `deserializer` (reading `bytes`), and nothing after it.
fn read_whole<'de, R, T>(
    mut deserializer: serde_json::Deserializer<R>,
    bytes: &[u8],
) -> Result<T, ApiError>
where
    R: serde_json::de::Read<'de>,
    T: DeserializeOwned,
{
    // Read once without following where it is: tracking the path costs every body a share of its parse, and only
    // a failure needs it, named by reading the body again.
    let value = T::deserialize(&mut deserializer).map_err(|e| failure_explained::<T>(bytes, e))?;
    // One JSON value and nothing after it but whitespace: `{...} xyz` is not a body OpenAI accepts.
    deserializer.end().map_err(|inner| {
        ApiError::invalid(
            format!("We could not parse the JSON body of your request: {inner}."),
            None,
            Some("invalid_json"),
        )
    })?;
    Ok(value)
}

/// Reads `T` out of a JSON value already parsed, with the same errors as [`parse_json`].
pub fn from_value<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(deserialize_error)
}

/// The error of a body that `T` could not be read from, naming where it failed: the body read again, following
/// its path. The same bytes fail the same way; `plain`, the first failure, stands if they somehow did not.
fn failure_explained<T: DeserializeOwned>(bytes: &[u8], plain: serde_json::Error) -> ApiError {
    // Every body the API reads is an object: another kind of JSON is named as such, not as the Rust type that
    // failed to read it.
    if !plain.is_syntax() && !plain.is_eof() {
        if let Some(kind) = not_an_object(bytes) {
            return ApiError::invalid(
                format!("The request body must be a JSON object, but got {kind}."),
                None,
                Some("invalid_type"),
            );
        }
    }
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    match serde_path_to_error::deserialize::<_, T>(&mut deserializer) {
        Err(error) => deserialize_error(error),
        Ok(_) => invalid_body(String::new(), plain),
    }
}

/// The kind of JSON value `bytes` hold, when it is not an object (read from its first character).
fn not_an_object(bytes: &[u8]) -> Option<&'static str> {
    match bytes.iter().find(|b| !b.is_ascii_whitespace())? {
        b'{' => None,
        b'[' => Some("an array"),
        b'"' => Some("a string"),
        b't' | b'f' => Some("a boolean"),
        b'n' => Some("null"),
        _ => Some("a number"),
    }
}

fn deserialize_error(error: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let path = error.path().to_string();
    invalid_body(path, error.into_inner())
}

/// The 400 for a body that could not be read at `path` (`.` or empty: the body as a whole).
fn invalid_body(path: String, inner: serde_json::Error) -> ApiError {
    if inner.is_syntax() || inner.is_eof() {
        ApiError::invalid(
            format!("We could not parse the JSON body of your request: {inner}."),
            None,
            Some("invalid_json"),
        )
    } else if path == "." || path.is_empty() {
        ApiError::invalid(
            format!("Invalid request body: {inner}."),
            None,
            Some("invalid_type"),
        )
    } else {
        ApiError::invalid(
            format!("Invalid type for '{path}': {inner}."),
            Some(&path),
            Some("invalid_type"),
        )
    }
}

/// Longest id or query value the gateway reads; longer ones are refused before they reach the store.
pub const MAX_ID_LEN: usize = 256;

/// Path parameters (ids), checked before they reach the store: readable (percent-encoded UTF-8), at most
/// [`MAX_ID_LEN`] characters, no control characters (a NUL would fail in Postgres). Each failure is a 400
/// naming the parameter.
pub struct ApiPath<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let raw = RawPathParams::from_request_parts(parts, state)
            .await
            .map_err(|rejection| {
                ApiError::invalid(
                    format!("Invalid URL path: {}", rejection.body_text()),
                    None,
                    Some("invalid_path"),
                )
            })?;
        for (name, value) in &raw {
            check_value(name, value)?;
        }
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(value)) => Ok(ApiPath(value)),
            Err(rejection) => Err(ApiError::invalid(
                format!("Invalid URL path: {}", rejection.body_text()),
                None,
                Some("invalid_path"),
            )),
        }
    }
}

/// A query string: each field at most once (but a list's, repeated), values checked like ids, then typed; each
/// failure a 400 naming the field.
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        let query = parts.uri.query().unwrap_or_default();
        let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query).map_err(|e| {
            ApiError::invalid(
                format!("Invalid query string: {e}."),
                None,
                Some("invalid_query"),
            )
        })?;
        let mut seen = std::collections::HashSet::new();
        for (name, value) in &pairs {
            // A list is sent as its name repeated (`include=a&include=b`, or `include[]=…` as openai-python
            // writes it); any other parameter is given at most once.
            let a_list = name == "include" || name == "include[]";
            if !a_list && !seen.insert(name.as_str()) {
                return Err(ApiError::invalid(
                    format!("Query parameter '{name}' is given more than once."),
                    Some(name),
                    Some("duplicate_parameter"),
                ));
            }
            check_value(name, value)?;
        }
        let fields =
            serde_urlencoded::Deserializer::new(url::form_urlencoded::parse(query.as_bytes()));
        serde_path_to_error::deserialize(fields)
            .map(ApiQuery)
            .map_err(|e| {
                let field = e.path().to_string();
                if field.is_empty() || field == "." {
                    return ApiError::invalid(
                        format!("Invalid query string: {}.", e.inner()),
                        None,
                        Some("invalid_query"),
                    );
                }
                ApiError::invalid(
                    format!("Invalid query parameter '{field}': {}.", e.inner()),
                    Some(&field),
                    Some("invalid_query"),
                )
            })
    }
}

/// An id or query value the store can take: not too long, no control characters.
fn check_value(name: &str, value: &str) -> Result<(), ApiError> {
    if value.chars().count() > MAX_ID_LEN {
        return Err(ApiError::invalid(
            format!("Invalid '{name}': longer than {MAX_ID_LEN} characters."),
            Some(name),
            Some("invalid_value"),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(ApiError::invalid(
            format!("Invalid '{name}': it contains a control character (such as NUL)."),
            Some(name),
            Some("invalid_value"),
        ));
    }
    Ok(())
}

/// The project behind a valid, unexpired gateway API key (`Authorization: Bearer sk-...`), with what the key is
/// granted.
pub struct ProjectKey(pub String, pub Arc<KeyGrant>);

impl FromRequestParts<AppState> for ProjectKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Some(key) = bearer(&parts.headers) else {
            return Err(ApiError::unauthorized(
                "You didn't provide an API key. Send it as 'Authorization: Bearer sk-...'.",
                Some("missing_api_key"),
            ));
        };
        let grant = valid_grant(state, key).await?;
        Ok(ProjectKey(grant.project_id.clone(), grant))
    }
}

/// What `key` is granted while it is valid: known, not revoked and not expired (else a `401`, the refusal logged
/// with the key's id). Asked on every request, and on every turn of a WebSocket, so that a key revoked or expired
/// meanwhile stops working at once (within the 2 s its grant is cached).
pub async fn valid_grant(state: &AppState, key: &str) -> Result<Arc<KeyGrant>, ApiError> {
    match state.grant_for_key(key).await? {
        Some(grant) if !grant.revoked && !grant.expired(crate::clock::now()) => {
            state.engine.note_key_used(&grant.key_id);
            Ok(grant)
        }
        found => {
            if let Some(grant) = found {
                let why = if grant.revoked { "revoked" } else { "expired" };
                tracing::info!(api_key.id = %grant.key_id, project.id = %grant.project_id, reason = why, "api key refused");
            }
            Err(ApiError::unauthorized(
                "Incorrect API key provided.",
                Some("invalid_api_key"),
            ))
        }
    }
}

/// The bearer token of a request, if it has one.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Whether a JSON text holds the escape `\u0000` (a NUL character, which stores refuse), as opposed to an
/// escaped backslash followed by the letters `u0000`.
fn has_escaped_nul(json: &[u8]) -> bool {
    json.windows(6).enumerate().any(|(start, window)| {
        window == b"\\u0000"
            && json[..start]
                .iter()
                .rev()
                .take_while(|b| **b == b'\\')
                .count()
                % 2
                == 0
    })
}

#[cfg(test)]
mod tests {
    use super::has_escaped_nul;

    #[test]
    fn only_a_real_nul_escape_counts() {
        assert!(has_escaped_nul(br#"{"input":"a\u0000b"}"#));
        assert!(!has_escaped_nul(br#"{"input":"a\\u0000b"}"#));
        assert!(has_escaped_nul(br#"{"input":"a\\\u0000b"}"#));
        assert!(!has_escaped_nul(br#"{"input":"plain"}"#));
    }
}
