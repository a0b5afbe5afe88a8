//! The messages of a WebSocket connection: reading the client's (size-limited, queued), a `response.create`
//! read as a request, and the error envelope sent back.

use axum::extract::ws::{Message, WebSocket};
use futures::stream::SplitStream;
use futures::StreamExt;
use gateway_core::request::{validate, CreateResponseBody, ValidRequest};
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};

use crate::api::error::ApiError;
use crate::api::extract::{from_value, parse_json};

/// Fields of the HTTP create body that have no meaning on a socket and must not be sent on one.
const HTTP_ONLY_FIELDS: [&str; 3] = ["stream", "stream_options", "background"];

/// What the client sent.
pub(super) enum Incoming {
    Text(String),
    Binary,
    /// A message over the size limit, of which no more than its start was read.
    TooLarge,
}

/// Whether a read failed because the message (or one of its frames) is over the size limit.
fn is_too_large(error: axum::Error) -> bool {
    use tokio_tungstenite::tungstenite::Error;
    error
        .into_inner()
        .downcast_ref::<Error>()
        .is_some_and(|e| matches!(e, Error::Capacity(_)))
}

/// Reads the client's messages into `queue` until the socket closes, then says so on `left`.
pub(super) async fn read_messages(
    mut incoming: SplitStream<WebSocket>,
    queue: mpsc::Sender<Incoming>,
    left: watch::Sender<bool>,
) {
    while let Some(message) = incoming.next().await {
        let message = match message {
            Ok(message) => message,
            Err(error) => {
                if !is_too_large(error) {
                    break;
                }
                // The client is still there to be told; the turn under way (if any) finishes first, then the
                // refusal closes the connection, and reading ends here.
                if queue.send(Incoming::TooLarge).await.is_ok() {
                    queue.closed().await;
                }
                return;
            }
        };
        let incoming = match message {
            Message::Text(text) => Incoming::Text(text.as_str().to_owned()),
            Message::Binary(_) => Incoming::Binary,
            Message::Close(_) => break,
            // Pings are answered by the WebSocket layer.
            Message::Ping(_) | Message::Pong(_) => continue,
        };
        if queue.send(incoming).await.is_err() {
            break;
        }
    }
    let _ = left.send(true);
}

/// A `response.create` message as a request: the create body without its `type`, streamed by nature; the
/// HTTP-only fields are refused.
pub(super) fn read_create(text: &str) -> Result<ValidRequest, ApiError> {
    let mut message: Value = parse_json(text.as_bytes())?;
    let Some(fields) = message.as_object_mut() else {
        return Err(ApiError::invalid(
            "A WebSocket message must be a JSON object with a 'type'.",
            None,
            Some("invalid_type"),
        ));
    };
    match fields.remove("type") {
        Some(Value::String(kind)) if kind == "response.create" => {}
        Some(Value::String(kind)) => {
            return Err(ApiError::invalid(
                format!("Unknown message type '{kind}'; the only one is 'response.create'."),
                Some("type"),
                Some("unknown_message_type"),
            ))
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "'type' must be the string 'response.create'.",
                Some("type"),
                Some("invalid_type"),
            ))
        }
        None => {
            return Err(ApiError::invalid(
                "Missing required parameter: 'type' (expected 'response.create').",
                Some("type"),
                Some("missing_required_parameter"),
            ))
        }
    }
    if let Some(field) = HTTP_ONLY_FIELDS.iter().find(|f| fields.contains_key(**f)) {
        return Err(ApiError::invalid(
            format!("'{field}' belongs to HTTP requests and must not be sent over a WebSocket: every response there is streamed in the foreground."),
            Some(field),
            Some("unsupported_parameter"),
        ));
    }
    let body: CreateResponseBody = from_value(message)?;
    let mut request = validate(body)?;
    // The client learns the id from the first event, as with SSE.
    request.stream = true;
    Ok(request)
}

/// The error envelope of `error`; its `code` is never empty (clients branch on it), falling back to the type.
pub(super) fn error_envelope(error: &ApiError) -> Value {
    json!({
        "type": "error",
        "status": error.status.as_u16(),
        "error": {
            "type": error.kind,
            "code": error.code.as_deref().unwrap_or(error.kind),
            "message": error.message,
            "param": error.param,
        },
    })
}

#[cfg(test)]
mod tests {
    use axum::http::StatusCode;

    use super::*;

    fn refused(text: &str) -> ApiError {
        match read_create(text) {
            Ok(request) => unreachable!("accepted: {request:?}"),
            Err(error) => error,
        }
    }

    #[test]
    fn a_create_message_is_the_create_body_streamed() {
        let request =
            read_create(r#"{"type":"response.create","model":"m","input":"hi","store":false}"#);
        let request = request.unwrap_or_else(|e| unreachable!("{e:?}"));
        assert!(request.stream);
        assert!(!request.store);
        assert_eq!(request.model, "m");
    }

    #[test]
    fn malformed_messages_are_refused_naming_what_is_wrong() {
        let cases = [
            ("{not json", None, "invalid_json"),
            ("[1]", None, "invalid_type"),
            (
                r#"{"model":"m","input":"x"}"#,
                Some("type"),
                "missing_required_parameter",
            ),
            (
                r#"{"type":"response.cancel"}"#,
                Some("type"),
                "unknown_message_type",
            ),
            (r#"{"type":7}"#, Some("type"), "invalid_type"),
            (
                r#"{"type":"response.create","model":"m","input":"x","stream":true}"#,
                Some("stream"),
                "unsupported_parameter",
            ),
            (
                r#"{"type":"response.create","model":"m","input":"x","background":false}"#,
                Some("background"),
                "unsupported_parameter",
            ),
            (
                r#"{"type":"response.create","model":"m","input":"x","stream_options":{}}"#,
                Some("stream_options"),
                "unsupported_parameter",
            ),
            (
                r#"{"type":"response.create","input":"x"}"#,
                Some("model"),
                "missing_required_parameter",
            ),
            (
                r#"{"type":"response.create","model":"m","input":"x","temperature":"hot"}"#,
                Some("temperature"),
                "invalid_type",
            ),
        ];
        for (text, param, code) in cases {
            let error = refused(text);
            assert_eq!(error.status, StatusCode::BAD_REQUEST, "{text}");
            assert_eq!(error.param.as_deref(), param, "{text}");
            assert_eq!(error.code.as_deref(), Some(code), "{text}");
        }
    }

    #[test]
    fn the_envelope_always_has_a_code_and_a_status() {
        let envelope = error_envelope(&ApiError::invalid("bad", Some("input"), None));
        assert_eq!(
            envelope,
            json!({"type": "error", "status": 400, "error": {"type": "invalid_request_error",
                "code": "invalid_request_error", "message": "bad", "param": "input"}})
        );
    }
}
