//! Thinking and reasoning kept across turns (SPEC 8): which provider kind made a `reasoning` item, what it needs
//! to have it replayed, and what a client is shown of it.
//!
//! A `reasoning` item's `encrypted_content` carries the provider's own replay token. Anthropic's are marked with a
//! prefix (`anthropic.thinking:` + the block's signature, `anthropic.redacted:` + a redacted block's data), so that
//! a stateless client that sends the item back still reaches the right provider. A Responses upstream's is kept
//! with the upstream's own item id, which its API requires back (`openai.reasoning:<id>:` + the content); anything
//! else is a Responses `encrypted_content` a client got elsewhere, passed on verbatim with the item's own id. An
//! item without `encrypted_content` cannot be replayed.

use serde_json::{json, Value};

use crate::entity::ProviderKind;
use crate::items::{Item, ReasoningItem};

const THINKING: &str = "anthropic.thinking:";
const REDACTED: &str = "anthropic.redacted:";
const RESPONSES: &str = "openai.reasoning:";

/// What `include` must hold for a client to be shown `encrypted_content`.
pub const INCLUDE_ENCRYPTED: &str = "reasoning.encrypted_content";

/// A reasoning item as the provider that made it needs it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replay<'a> {
    /// An Anthropic `thinking` block: its text and signature.
    Thinking {
        thinking: String,
        signature: &'a str,
    },
    /// An Anthropic `redacted_thinking` block.
    RedactedThinking { data: &'a str },
    /// A Responses `reasoning` item: the upstream's id for it, and its `encrypted_content`.
    Encrypted {
        id: Option<&'a str>,
        encrypted_content: &'a str,
    },
}

/// An Anthropic `thinking` block as a reasoning item: the thinking is its summary text.
pub fn from_thinking(id: String, thinking: &str, signature: &str) -> ReasoningItem {
    ReasoningItem {
        id: Some(id),
        summary: if thinking.is_empty() {
            Vec::new()
        } else {
            vec![json!({"type": "summary_text", "text": thinking})]
        },
        encrypted_content: Some(format!("{THINKING}{signature}")),
        status: Some("completed".into()),
    }
}

/// An Anthropic `redacted_thinking` block as a reasoning item with no readable text.
pub fn from_redacted_thinking(id: String, data: &str) -> ReasoningItem {
    ReasoningItem {
        id: Some(id),
        summary: Vec::new(),
        encrypted_content: Some(format!("{REDACTED}{data}")),
        status: Some("completed".into()),
    }
}

/// A Responses upstream's `reasoning` item, with the upstream's id kept for its replay.
pub fn from_responses(
    id: String,
    upstream_id: &str,
    summary: Vec<Value>,
    encrypted_content: Option<&str>,
) -> ReasoningItem {
    let encrypted_content = encrypted_content.map(|content| {
        if upstream_id.is_empty() || upstream_id.contains(':') {
            content.to_owned()
        } else {
            format!("{RESPONSES}{upstream_id}:{content}")
        }
    });
    ReasoningItem {
        id: Some(id),
        summary,
        encrypted_content,
        status: Some("completed".into()),
    }
}

/// The summary texts of a reasoning item, joined.
pub fn summary_text(item: &ReasoningItem) -> String {
    item.summary
        .iter()
        .filter_map(|s| s.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("")
}

/// The provider kind that made `item`, and what it needs to have it replayed; `None` when it cannot be replayed.
pub fn replay(item: &ReasoningItem) -> Option<(ProviderKind, Replay<'_>)> {
    let content = item.encrypted_content.as_deref()?;
    if let Some(signature) = content.strip_prefix(THINKING) {
        let thinking = summary_text(item);
        return Some((
            ProviderKind::Anthropic,
            Replay::Thinking {
                thinking,
                signature,
            },
        ));
    }
    if let Some(data) = content.strip_prefix(REDACTED) {
        return Some((ProviderKind::Anthropic, Replay::RedactedThinking { data }));
    }
    if let Some((id, content)) = content
        .strip_prefix(RESPONSES)
        .and_then(|rest| rest.split_once(':'))
    {
        return Some((
            ProviderKind::OpenaiResponses,
            Replay::Encrypted {
                id: Some(id),
                encrypted_content: content,
            },
        ));
    }
    Some((
        ProviderKind::OpenaiResponses,
        Replay::Encrypted {
            id: item.id.as_deref(),
            encrypted_content: content,
        },
    ))
}

/// Whether `item` is one that a deployment of `kind` is sent: reasoning goes only to the provider kind that made
/// it (SPEC 8); other items go everywhere.
pub fn replayed_to(item: &Item, kind: ProviderKind) -> bool {
    match item {
        Item::Reasoning(reasoning) => replay(reasoning).is_some_and(|(made_by, _)| made_by == kind),
        _ => true,
    }
}

/// Hides `encrypted_content` from a client that did not ask for it with `include`.
pub fn shown(item: &Item, include: Option<&[String]>) -> Item {
    match item {
        Item::Reasoning(reasoning)
            if !include.is_some_and(|i| i.iter().any(|s| s == INCLUDE_ENCRYPTED)) =>
        {
            Item::Reasoning(ReasoningItem {
                encrypted_content: None,
                ..reasoning.clone()
            })
        }
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_of_reasoning_is_replayed_to_the_provider_that_made_it_only() {
        let thinking = Item::Reasoning(from_thinking("rs_1".into(), "Let me think.", "sig=="));
        let redacted = Item::Reasoning(from_redacted_thinking("rs_2".into(), "opaque"));
        let responses = Item::Reasoning(ReasoningItem {
            id: Some("rs_3".into()),
            summary: Vec::new(),
            encrypted_content: Some("gAAAA-secret".into()),
            status: None,
        });
        let stripped = Item::Reasoning(ReasoningItem {
            id: Some("rs_4".into()),
            summary: vec![json!({"type": "summary_text", "text": "t"})],
            encrypted_content: None,
            status: None,
        });
        let to = |kind| {
            [&thinking, &redacted, &responses, &stripped]
                .iter()
                .map(|i| replayed_to(i, kind))
                .collect::<Vec<_>>()
        };
        assert_eq!(to(ProviderKind::Anthropic), [true, true, false, false]);
        assert_eq!(
            to(ProviderKind::OpenaiResponses),
            [false, false, true, false]
        );
        assert_eq!(to(ProviderKind::OpenaiChat), [false, false, false, false]);
        let Item::Reasoning(r) = &thinking else {
            unreachable!()
        };
        assert_eq!(
            replay(r).map(|(_, r)| r),
            Some(Replay::Thinking {
                thinking: "Let me think.".into(),
                signature: "sig=="
            })
        );
    }

    #[test]
    fn encrypted_content_is_shown_only_when_included() {
        let item = Item::Reasoning(from_thinking("rs_1".into(), "x", "sig"));
        let hidden = shown(&item, None);
        let Item::Reasoning(hidden) = hidden else {
            unreachable!()
        };
        assert_eq!(hidden.encrypted_content, None);
        let include = vec![INCLUDE_ENCRYPTED.to_owned()];
        assert_eq!(shown(&item, Some(&include)), item);
    }
}
