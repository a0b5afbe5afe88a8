//! Webhooks (SPEC 15): the events a background response's ending makes, their payload in OpenAI's event shape,
//! an endpoint's `url` and `events` read and checked, and the wait before each try.

use serde_json::{json, Value};

use crate::request::InvalidRequest;
use crate::response::ResponseStatus;

/// An event a webhook endpoint may be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebhookEvent {
    ResponseCompleted,
    ResponseFailed,
    ResponseCancelled,
    ResponseIncomplete,
}

impl WebhookEvent {
    pub const ALL: [WebhookEvent; 4] = [
        WebhookEvent::ResponseCompleted,
        WebhookEvent::ResponseFailed,
        WebhookEvent::ResponseCancelled,
        WebhookEvent::ResponseIncomplete,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WebhookEvent::ResponseCompleted => "response.completed",
            WebhookEvent::ResponseFailed => "response.failed",
            WebhookEvent::ResponseCancelled => "response.cancelled",
            WebhookEvent::ResponseIncomplete => "response.incomplete",
        }
    }

    pub fn parse(name: &str) -> Option<WebhookEvent> {
        WebhookEvent::ALL
            .into_iter()
            .find(|event| event.as_str() == name)
    }

    /// The event a response that ended with `status` makes; none while it runs.
    pub fn of_status(status: ResponseStatus) -> Option<WebhookEvent> {
        match status {
            ResponseStatus::Completed => Some(WebhookEvent::ResponseCompleted),
            ResponseStatus::Failed => Some(WebhookEvent::ResponseFailed),
            ResponseStatus::Cancelled => Some(WebhookEvent::ResponseCancelled),
            ResponseStatus::Incomplete => Some(WebhookEvent::ResponseIncomplete),
            ResponseStatus::Queued | ResponseStatus::InProgress => None,
        }
    }
}

/// The id of the event `event` of response `response_id`: the same each time the ending is written (a response
/// resumed on another replica makes the same event, and the outbox keeps one), `evt_` and the response's own part.
pub fn event_id(response_id: &str, event: WebhookEvent) -> String {
    let own = response_id.strip_prefix("resp_").unwrap_or(response_id);
    let kind = match event {
        WebhookEvent::ResponseCompleted => "c",
        WebhookEvent::ResponseFailed => "f",
        WebhookEvent::ResponseCancelled => "x",
        WebhookEvent::ResponseIncomplete => "i",
    };
    format!("evt_{own}{kind}")
}

/// The payload of an event, as OpenAI sends it: `{"id", "object": "event", "type", "created_at", "data": {"id"}}`.
pub fn event_payload(
    event_id: &str,
    event: WebhookEvent,
    created_at: i64,
    response_id: &str,
) -> Value {
    json!({
        "id": event_id,
        "object": "event",
        "type": event.as_str(),
        "created_at": created_at,
        "data": {"id": response_id},
    })
}

/// Reads an endpoint's `url`: an absolute `http` or `https` URL (loopback and private addresses included: the
/// operator chooses them).
pub fn read_url(url: Option<&str>) -> Result<String, InvalidRequest> {
    let Some(url) = url.map(str::trim).filter(|u| !u.is_empty()) else {
        return Err(
            InvalidRequest::new("Missing required parameter: 'url'.", "url")
                .with_code("missing_required_parameter"),
        );
    };
    let scheme_ok = url.starts_with("http://") || url.starts_with("https://");
    let host = url
        .split("://")
        .nth(1)
        .and_then(|rest| rest.split(['/', '?', '#']).next())
        .unwrap_or("");
    if !scheme_ok || host.is_empty() || url.chars().any(char::is_whitespace) {
        return Err(InvalidRequest::new(
            format!("Invalid 'url': expected an absolute http or https URL, got '{url}'."),
            "url",
        ));
    }
    Ok(url.to_owned())
}

/// Reads an endpoint's `events`: event type names, every one when left out.
pub fn read_events(events: Option<&Value>) -> Result<Vec<WebhookEvent>, InvalidRequest> {
    let Some(events) = events.filter(|e| !e.is_null()) else {
        return Ok(WebhookEvent::ALL.to_vec());
    };
    let Some(names) = events.as_array().filter(|a| !a.is_empty()) else {
        return Err(InvalidRequest::new(
            "Invalid 'events': expected a non-empty array of event types.",
            "events",
        ));
    };
    let mut read = Vec::new();
    for (index, name) in names.iter().enumerate() {
        let event = name.as_str().and_then(WebhookEvent::parse).ok_or_else(|| {
            let known: Vec<&str> = WebhookEvent::ALL.iter().map(|e| e.as_str()).collect();
            InvalidRequest::new(
                format!(
                    "Invalid 'events[{index}]': {name} is not one of {}.",
                    known.join(", ")
                ),
                format!("events[{index}]"),
            )
        })?;
        if !read.contains(&event) {
            read.push(event);
        }
    }
    Ok(read)
}

/// The wait in milliseconds after try `attempt` (1 for the first) failed: `base`, then four times the last wait,
/// up to `max`.
pub fn backoff_ms(attempt: u32, base: u64, max: u64) -> u64 {
    let exponent = attempt.saturating_sub(1).min(30);
    base.saturating_mul(4u64.saturating_pow(exponent)).min(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_three_tries_fall_within_a_minute_and_waits_are_capped() {
        let waits: Vec<u64> = (1..=8).map(|n| backoff_ms(n, 1_000, 3_600_000)).collect();
        assert_eq!(
            waits,
            [1_000, 4_000, 16_000, 64_000, 256_000, 1_024_000, 3_600_000, 3_600_000]
        );
        assert!(
            waits[0] + waits[1] < 60_000,
            "tries two and three within a minute of the first"
        );
        assert_eq!(backoff_ms(u32::MAX, 1_000, 3_600_000), 3_600_000);
    }

    #[test]
    fn an_event_keeps_its_id_and_has_openais_shape() {
        let id = event_id("resp_abc", WebhookEvent::ResponseCompleted);
        assert_eq!(id, event_id("resp_abc", WebhookEvent::ResponseCompleted));
        assert_ne!(id, event_id("resp_abc", WebhookEvent::ResponseFailed));
        assert!(id.starts_with("evt_"));
        assert_eq!(
            event_payload(&id, WebhookEvent::ResponseCompleted, 7, "resp_abc"),
            json!({"id": id, "object": "event", "type": "response.completed", "created_at": 7, "data": {"id": "resp_abc"}})
        );
    }

    #[test]
    fn urls_and_events_are_checked() {
        assert_eq!(
            read_url(Some("http://127.0.0.1:9/hook")).unwrap(),
            "http://127.0.0.1:9/hook"
        );
        assert!(read_url(Some("https://hooks.example.com")).is_ok());
        for bad in ["ftp://x/y", "hooks.example.com", "http://", "http:// x", ""] {
            assert_eq!(
                read_url(Some(bad)).unwrap_err().param.as_deref(),
                Some("url"),
                "{bad}"
            );
        }
        assert_eq!(read_events(None).unwrap().len(), 4);
        assert_eq!(
            read_events(Some(&json!(["response.failed", "response.failed"]))).unwrap(),
            [WebhookEvent::ResponseFailed]
        );
        assert_eq!(
            read_events(Some(&json!(["response.done"])))
                .unwrap_err()
                .param
                .as_deref(),
            Some("events[0]")
        );
        assert_eq!(
            read_events(Some(&json!([]))).unwrap_err().param.as_deref(),
            Some("events")
        );
    }
}
