//! Field types of the admin entities (projects, keys, deployments, groups, tool sources), each parsed once.
//!
//! The admin API, start-up seeding and the store all take these types, so the rules about what a name, a URL
//! or a timeout may be live here and nowhere else. A parse failure is an [`InvalidRequest`] naming the field as
//! its `param`, with code `invalid_value`.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::request::{is_valid_tool_name, InvalidRequest};

/// Longest name of a project, key, deployment or group, in characters.
pub const MAX_NAME_CHARS: usize = 256;

fn invalid(message: impl Into<String>, param: &str) -> InvalidRequest {
    InvalidRequest::new(message, param).with_code("invalid_value")
}

/// The name of a project, API key, deployment or deployment group: non-empty, at most 256 characters, no
/// surrounding whitespace and no control characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct EntityName(String);

impl EntityName {
    pub fn parse(name: impl Into<String>, param: &str) -> Result<EntityName, InvalidRequest> {
        let name = name.into();
        if name.is_empty() {
            return Err(invalid(format!("'{param}' must not be empty."), param));
        }
        if name.chars().count() > MAX_NAME_CHARS {
            return Err(invalid(
                format!("'{param}' must be at most {MAX_NAME_CHARS} characters long."),
                param,
            ));
        }
        if name.trim() != name || name.chars().any(char::is_control) {
            return Err(invalid(
                format!(
                    "'{param}' must not start or end with whitespace or contain control characters."
                ),
                param,
            ));
        }
        Ok(EntityName(name))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A function name as the OpenAI API accepts it (`^[a-zA-Z0-9_-]{1,64}$`): the name of an HTTP tool source.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct ToolName(String);

impl ToolName {
    pub fn parse(name: impl Into<String>, param: &str) -> Result<ToolName, InvalidRequest> {
        let name = name.into();
        if is_valid_tool_name(&name) {
            Ok(ToolName(name))
        } else {
            Err(invalid(
                format!("Invalid '{param}': '{name}' must match ^[a-zA-Z0-9_-]{{1,64}}$."),
                param,
            ))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// An absolute `http` or `https` URL with a host and no embedded credentials (those belong in the secret
/// fields, which are never shown; a URL is), kept exactly as given.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct HttpUrl(String);

impl HttpUrl {
    pub fn parse(url: impl Into<String>, param: &str) -> Result<HttpUrl, InvalidRequest> {
        let url = url.into();
        // The URL parser forgives surrounding spaces; the stored value must be exactly what is used.
        let problem = match url::Url::parse(&url) {
            _ if url.trim() != url => Some("it must not start or end with whitespace".into()),
            Err(e) => Some(format!("it is not a valid URL ({e})")),
            Ok(parsed) if !matches!(parsed.scheme(), "http" | "https") => {
                Some("the scheme must be http or https".into())
            }
            Ok(parsed) if parsed.host_str().is_none_or(str::is_empty) => {
                Some("it has no host".into())
            }
            Ok(parsed) if !parsed.username().is_empty() || parsed.password().is_some() => {
                Some("it must not contain credentials; use the secret field instead".into())
            }
            Ok(_) => None,
        };
        match problem {
            None => Ok(HttpUrl(url)),
            Some(problem) => Err(invalid(format!("Invalid '{param}': {problem}."), param)),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The API a deployment's upstream speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    /// OpenAI-compatible Chat Completions (`{base_url}/chat/completions`).
    OpenaiChat,
    /// Anthropic Messages (`{base_url}/v1/messages`).
    Anthropic,
    /// OpenAI Responses, called statelessly (`{base_url}/responses`).
    OpenaiResponses,
}

impl ProviderKind {
    pub const ALL: [ProviderKind; 3] = [
        ProviderKind::OpenaiChat,
        ProviderKind::Anthropic,
        ProviderKind::OpenaiResponses,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::OpenaiChat => "openai_chat",
            ProviderKind::Anthropic => "anthropic",
            ProviderKind::OpenaiResponses => "openai_responses",
        }
    }

    /// Whether the API takes `custom` tools (free-form input, grammars) as they are; the others see each as a
    /// function of one string.
    pub fn has_custom_tools(self) -> bool {
        self == ProviderKind::OpenaiResponses
    }

    pub fn parse(kind: &str, param: &str) -> Result<ProviderKind, InvalidRequest> {
        ProviderKind::ALL
            .into_iter()
            .find(|k| k.as_str() == kind)
            .ok_or_else(|| {
                let all: Vec<&str> = ProviderKind::ALL.iter().map(|k| k.as_str()).collect();
                invalid(
                    format!(
                        "Invalid '{param}': '{kind}'; expected one of {}.",
                        all.join(", ")
                    ),
                    param,
                )
            })
    }
}

/// Reads a kind back from where it was stored as its name (the store's `provider_kind` column).
impl TryFrom<String> for ProviderKind {
    type Error = InvalidRequest;

    fn try_from(kind: String) -> Result<ProviderKind, InvalidRequest> {
        ProviderKind::parse(&kind, "provider_kind")
    }
}

impl fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A tool's timeout in milliseconds: 1 ms to ten minutes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct TimeoutMs(u64);

impl TimeoutMs {
    /// Used when a tool source names none.
    pub const DEFAULT: TimeoutMs = TimeoutMs(30_000);
    /// The longest a tool source may ask for.
    pub const MAX: u64 = 600_000;

    pub fn parse(timeout_ms: i64, param: &str) -> Result<TimeoutMs, InvalidRequest> {
        match u64::try_from(timeout_ms) {
            Ok(ms) if (1..=TimeoutMs::MAX).contains(&ms) => Ok(TimeoutMs(ms)),
            _ => Err(invalid(
                format!(
                    "Invalid '{param}': {timeout_ms}; expected an integer between 1 and {}.",
                    TimeoutMs::MAX
                ),
                param,
            )),
        }
    }

    pub fn get(self) -> u64 {
        self.0
    }
}

/// A tool's `parameters`: a JSON object that compiles as a JSON Schema and describes an object.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(transparent)]
pub struct ToolParameters(Value);

impl ToolParameters {
    pub fn parse(parameters: Value, param: &str) -> Result<ToolParameters, InvalidRequest> {
        if !parameters.is_object() {
            return Err(invalid(
                format!("'{param}' must be a JSON Schema object."),
                param,
            ));
        }
        if let Some(kind) = parameters.get("type") {
            if kind != "object" {
                return Err(invalid(
                    format!(
                        "'{param}' must describe an object (\"type\": \"object\"), not {kind}."
                    ),
                    param,
                ));
            }
        }
        match jsonschema::validator_for(&parameters) {
            Ok(_) => Ok(ToolParameters(parameters)),
            Err(e) => Err(invalid(
                format!("'{param}' is not a valid JSON Schema: {e}."),
                param,
            )),
        }
    }

    pub fn as_value(&self) -> &Value {
        &self.0
    }

    pub fn into_value(self) -> Value {
        self.0
    }
}

/// Checks a credential that is sent as an HTTP header (an upstream API key, a tool source's secret): it must
/// be non-empty and free of control characters. The message never repeats the value.
pub fn check_secret(secret: &str, param: &str) -> Result<(), InvalidRequest> {
    if secret.trim().is_empty() || secret.chars().any(char::is_control) {
        Err(invalid(
            format!("'{param}' must be non-empty and free of control characters; send null to remove it."),
            param,
        ))
    } else {
        Ok(())
    }
}

/// Checks a free-text field that must say something (an upstream model name).
pub fn check_non_empty(value: &str, param: &str) -> Result<(), InvalidRequest> {
    if value.trim().is_empty() {
        Err(invalid(format!("'{param}' must not be empty."), param))
    } else {
        Ok(())
    }
}

/// A tool source's policy (SPEC 7): how many of its calls may run at once across the gateway, how much of an
/// output is kept, and when its circuit breaker opens. `None` is the gateway's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ToolPolicy {
    #[serde(default)]
    pub max_in_flight: Option<u32>,
    #[serde(default)]
    pub max_output_bytes: Option<u64>,
    #[serde(default)]
    pub breaker_failures: Option<u32>,
    #[serde(default)]
    pub breaker_cooldown_ms: Option<u64>,
}

impl ToolPolicy {
    /// The output cap when a source names none: 1 MiB.
    pub const DEFAULT_MAX_OUTPUT_BYTES: u64 = 1024 * 1024;
    /// The smallest output cap: room for the truncation marker and some output.
    pub const MIN_MAX_OUTPUT_BYTES: i64 = 256;
    /// The largest output cap: 64 MiB.
    pub const MAX_MAX_OUTPUT_BYTES: i64 = 64 * 1024 * 1024;
    /// Consecutive failures that open the breaker when a source names no number.
    pub const DEFAULT_BREAKER_FAILURES: u32 = 5;
    /// How long an open breaker fails calls fast when a source names no cool-down.
    pub const DEFAULT_BREAKER_COOLDOWN_MS: u64 = 30_000;

    pub fn max_output_bytes(&self) -> u64 {
        self.max_output_bytes
            .unwrap_or(ToolPolicy::DEFAULT_MAX_OUTPUT_BYTES)
    }

    pub fn breaker_failures(&self) -> u32 {
        self.breaker_failures
            .unwrap_or(ToolPolicy::DEFAULT_BREAKER_FAILURES)
    }

    pub fn breaker_cooldown_ms(&self) -> u64 {
        self.breaker_cooldown_ms
            .unwrap_or(ToolPolicy::DEFAULT_BREAKER_COOLDOWN_MS)
    }

    /// `max_in_flight`: 1 to 10 000.
    pub fn parse_max_in_flight(value: i64, param: &str) -> Result<u32, InvalidRequest> {
        bounded(value, param, 1, 10_000).map(|v| u32::try_from(v).unwrap_or(u32::MAX))
    }

    /// `max_output_bytes`: 256 bytes to 64 MiB.
    pub fn parse_max_output_bytes(value: i64, param: &str) -> Result<u64, InvalidRequest> {
        bounded(
            value,
            param,
            ToolPolicy::MIN_MAX_OUTPUT_BYTES,
            ToolPolicy::MAX_MAX_OUTPUT_BYTES,
        )
        .map(|v| u64::try_from(v).unwrap_or(0))
    }

    /// `breaker_failures`: 1 to 1000.
    pub fn parse_breaker_failures(value: i64, param: &str) -> Result<u32, InvalidRequest> {
        bounded(value, param, 1, 1000).map(|v| u32::try_from(v).unwrap_or(u32::MAX))
    }

    /// `breaker_cooldown_ms`: 1 ms to one hour.
    pub fn parse_breaker_cooldown_ms(value: i64, param: &str) -> Result<u64, InvalidRequest> {
        bounded(value, param, 1, 3_600_000).map(|v| u64::try_from(v).unwrap_or(0))
    }
}

fn bounded(value: i64, param: &str, min: i64, max: i64) -> Result<i64, InvalidRequest> {
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(invalid(
            format!("Invalid '{param}': {value}; expected an integer between {min} and {max}."),
            param,
        ))
    }
}

/// A progress-note template (SPEC 7): text with `{field}` (or `{a.b}`) placeholders over the call's arguments;
/// at most 500 characters, no control characters, braces balanced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NoteTemplate(String);

impl NoteTemplate {
    pub const MAX_CHARS: usize = 500;

    pub fn parse(text: impl Into<String>, param: &str) -> Result<NoteTemplate, InvalidRequest> {
        let text = text.into();
        if text.is_empty() || text.chars().count() > NoteTemplate::MAX_CHARS {
            return Err(invalid(
                format!(
                    "'{param}' must be between 1 and {} characters.",
                    NoteTemplate::MAX_CHARS
                ),
                param,
            ));
        }
        if text.chars().any(char::is_control) {
            return Err(invalid(
                format!("'{param}' must not contain control characters."),
                param,
            ));
        }
        let mut open = false;
        for c in text.chars() {
            match (c, open) {
                ('{', false) => open = true,
                ('}', true) => open = false,
                ('{', true) | ('}', false) => {
                    return Err(invalid(
                        format!(
                            "'{param}' has unbalanced braces; write placeholders as {{field}}."
                        ),
                        param,
                    ))
                }
                _ => {}
            }
        }
        if open {
            return Err(invalid(
                format!("'{param}' has an unclosed placeholder."),
                param,
            ));
        }
        Ok(NoteTemplate(text))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The template with each `{path}` replaced by that field of `values` (a dotted path into objects): a
    /// string as is, another value as its JSON text, a missing field as nothing. Never fails.
    pub fn render(&self, values: &Value) -> String {
        let mut out = String::with_capacity(self.0.len());
        let mut rest = self.0.as_str();
        while let Some(start) = rest.find('{') {
            out.push_str(&rest[..start]);
            let after = &rest[start + 1..];
            let Some(end) = after.find('}') else {
                out.push_str(&rest[start..]);
                return out;
            };
            let path = after[..end].trim();
            let found = path
                .split('.')
                .try_fold(values, |value, key| value.get(key));
            match found {
                Some(Value::String(s)) => out.push_str(s),
                Some(Value::Null) | None => {}
                Some(other) => out.push_str(&other.to_string()),
            }
            rest = &after[end + 1..];
        }
        out.push_str(rest);
        out
    }
}

/// The hosted tool types a tool source may serve (SPEC 12).
pub const HOSTED_TYPES: &[&str] = &[
    "web_search",
    "web_search_preview",
    "file_search",
    "code_interpreter",
    "image_generation",
    "tool_search",
    "local_shell",
    "computer_use_preview",
];

/// A tool source's `hosted_type`: one of [`HOSTED_TYPES`].
pub fn parse_hosted_type(kind: String, param: &str) -> Result<String, InvalidRequest> {
    if HOSTED_TYPES.contains(&kind.as_str()) {
        Ok(kind)
    } else {
        Err(invalid(
            format!(
                "Invalid '{param}': '{kind}'; expected one of {}.",
                HOSTED_TYPES.join(", ")
            ),
            param,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_are_refused_when_empty_padded_or_too_long() {
        assert!(EntityName::parse("acme", "name").is_ok());
        for bad in ["", " acme", "ac\nme", &"x".repeat(MAX_NAME_CHARS + 1)] {
            let error = EntityName::parse(bad, "name").unwrap_err();
            assert_eq!(error.param.as_deref(), Some("name"), "{bad:?}");
            assert_eq!(error.code.as_deref(), Some("invalid_value"));
        }
    }

    #[test]
    fn tool_names_follow_the_openai_pattern() {
        assert!(ToolName::parse("get_weather-2", "name").is_ok());
        for bad in ["", "a b", "ü", &"x".repeat(65)] {
            assert!(ToolName::parse(bad, "name").is_err(), "{bad:?}");
        }
    }

    #[test]
    fn urls_must_be_http_with_a_host_and_no_credentials() {
        let table = [
            ("http://127.0.0.1:8080/v1", true),
            ("https://api.example.com", true),
            ("ftp://example.com", false),
            ("not a url", false),
            ("/relative/path", false),
            ("http://user:pass@example.com", false),
            (" http://example.com", false),
            ("http://", false),
            ("", false),
        ];
        for (url, ok) in table {
            assert_eq!(HttpUrl::parse(url, "url").is_ok(), ok, "{url}");
        }
    }

    #[test]
    fn provider_kinds_round_trip_and_unknown_ones_list_the_choices() {
        for kind in ProviderKind::ALL {
            assert_eq!(ProviderKind::parse(kind.as_str(), "kind"), Ok(kind));
            assert_eq!(ProviderKind::try_from(kind.to_string()), Ok(kind));
            assert_eq!(json!(kind), json!(kind.as_str()));
        }
        let error = ProviderKind::parse("bedrock", "provider.kind").unwrap_err();
        assert!(error
            .message
            .contains("openai_chat, anthropic, openai_responses"));
    }

    #[test]
    fn timeouts_are_between_one_ms_and_ten_minutes() {
        assert_eq!(TimeoutMs::parse(1, "t").map(TimeoutMs::get), Ok(1));
        assert_eq!(
            TimeoutMs::parse(600_000, "t").map(TimeoutMs::get),
            Ok(600_000)
        );
        for bad in [0, -1, 600_001] {
            assert!(TimeoutMs::parse(bad, "t").is_err(), "{bad}");
        }
    }

    #[test]
    fn parameters_must_be_an_object_schema_that_compiles() {
        let table = [
            (
                json!({"type": "object", "properties": {"a": {"type": "number"}}}),
                true,
            ),
            (json!({}), true),
            (json!({"type": "string"}), false),
            (
                json!({"type": "object", "properties": {"a": {"type": "no-such-type"}}}),
                false,
            ),
            (
                json!({"type": "object", "properties": {"a": {"pattern": "("}}}),
                false,
            ),
            (json!([1, 2]), false),
            (json!("object"), false),
        ];
        for (schema, ok) in table {
            assert_eq!(
                ToolParameters::parse(schema.clone(), "parameters").is_ok(),
                ok,
                "{schema}"
            );
        }
    }

    #[test]
    fn secrets_must_be_non_empty_without_control_characters_and_are_not_repeated() {
        assert!(check_secret("sk-abc", "secret").is_ok());
        for bad in ["", "   ", "sk-\nabc"] {
            let error = check_secret(bad, "secret").unwrap_err();
            assert!(bad.trim().is_empty() || !error.message.contains(bad));
        }
    }

    #[test]
    fn a_note_renders_its_fields_and_missing_ones_as_nothing() {
        let values = serde_json::json!({"city": "Paris", "days": 3, "where": {"country": "FR"}, "none": null});
        let table = [
            (
                "Looking up the weather in {city}",
                "Looking up the weather in Paris",
            ),
            ("{days} days in {where.country}", "3 days in FR"),
            (
                "missing: [{nope}] [{where.nope}] [{none}]",
                "missing: [] [] []",
            ),
            ("no placeholder", "no placeholder"),
            ("{ city }!", "Paris!"),
        ];
        for (template, expected) in table {
            let template = NoteTemplate::parse(template, "note_on_request").unwrap();
            assert_eq!(template.render(&values), expected, "{template:?}");
        }
        // Not an object at all: every placeholder is missing.
        let template = NoteTemplate::parse("a{b}c", "note_on_result").unwrap();
        assert_eq!(template.render(&serde_json::json!("text")), "ac");
    }

    #[test]
    fn a_bad_note_template_is_refused_with_its_param() {
        for bad in ["", "{open", "close}", "{{nested}}", "tab\there"] {
            let error = NoteTemplate::parse(bad, "note_on_request").unwrap_err();
            assert_eq!(error.param.as_deref(), Some("note_on_request"), "{bad:?}");
        }
        let long = "x".repeat(NoteTemplate::MAX_CHARS + 1);
        assert!(NoteTemplate::parse(long, "note_on_result").is_err());
    }

    #[test]
    fn policy_values_out_of_range_are_refused_and_defaults_apply() {
        assert!(ToolPolicy::parse_max_in_flight(0, "max_in_flight").is_err());
        assert_eq!(
            ToolPolicy::parse_max_in_flight(4, "max_in_flight").unwrap(),
            4
        );
        assert!(ToolPolicy::parse_max_output_bytes(10, "max_output_bytes").is_err());
        assert!(ToolPolicy::parse_max_output_bytes(-1, "max_output_bytes").is_err());
        assert!(ToolPolicy::parse_breaker_failures(0, "breaker_failures").is_err());
        assert!(ToolPolicy::parse_breaker_cooldown_ms(3_600_001, "breaker_cooldown_ms").is_err());
        let policy = ToolPolicy::default();
        assert_eq!(policy.max_output_bytes(), 1024 * 1024);
        assert_eq!(policy.breaker_failures(), 5);
        assert_eq!(policy.breaker_cooldown_ms(), 30_000);
        assert!(parse_hosted_type("web_search".into(), "hosted_type").is_ok());
        assert_eq!(
            parse_hosted_type("nope".into(), "hosted_type")
                .unwrap_err()
                .param
                .as_deref(),
            Some("hosted_type")
        );
    }
}
