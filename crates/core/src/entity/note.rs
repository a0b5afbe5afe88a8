//! A tool source's progress-note template (SPEC 7): parsed once, rendered over a call's arguments.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::invalid;
use crate::request::InvalidRequest;

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

#[cfg(test)]
mod tests;
