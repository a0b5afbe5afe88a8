//! Field types of the admin entities (projects, keys, deployments, groups, tool sources), each parsed once.
//!
//! The admin API, start-up seeding and the store all take these types, so the rules about what a name, a URL
//! or a timeout may be live here and nowhere else. A parse failure is an [`InvalidRequest`] naming the field as
//! its `param`, with code `invalid_value`.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::request::{is_valid_tool_name, InvalidRequest};

mod note;
mod tool_policy;

pub use note::NoteTemplate;
pub use tool_policy::ToolPolicy;

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
mod tests;
