//! The `Response` object written straight to its bytes: its keys as fixed text, its strings copied unless they
//! need escaping. serde's derive spends most of the object's time writing and escaping the keys one by one; the
//! derived `Serialize` stays the reference (and the way to a `Value`), and the tests hold the two to one text.

use serde::Serialize;

use super::{ClientItem, ResponseObject, UsageObject};
use crate::items::{ContentPart, Item, MessageContent, MessageItem, Role};

/// A JSON text being written.
struct Out<'o>(&'o mut Vec<u8>);

impl Out<'_> {
    /// Text that is already JSON: a key with its punctuation, a literal.
    fn raw(&mut self, text: &str) {
        self.0.extend_from_slice(text.as_bytes());
    }

    /// A JSON string: copied between quotes when nothing in it needs escaping (nearly always), else escaped as
    /// serde_json escapes.
    fn str(&mut self, text: &str) {
        if needs_no_escape(text) {
            self.0.reserve(text.len() + 2);
            self.0.push(b'"');
            self.0.extend_from_slice(text.as_bytes());
            self.0.push(b'"');
        } else {
            // Writing a string into a vector cannot fail.
            let _ = serde_json::to_writer(&mut *self.0, text);
        }
    }

    fn opt_str(&mut self, text: Option<&str>) {
        self.opt(text, Self::str);
    }

    /// `value` written by `write`, or `null`.
    fn opt<T>(&mut self, value: Option<T>, write: impl FnOnce(&mut Self, T)) {
        match value {
            Some(value) => write(self, value),
            None => self.raw("null"),
        }
    }

    fn int(&mut self, number: impl itoa::Integer) {
        self.raw(itoa::Buffer::new().format(number));
    }

    fn opt_int(&mut self, number: Option<impl itoa::Integer>) {
        self.opt(number, Self::int);
    }

    fn bool(&mut self, value: bool) {
        self.raw(if value { "true" } else { "false" });
    }

    /// Anything else, through serde_json.
    fn value(&mut self, value: &impl Serialize) -> serde_json::Result<()> {
        serde_json::to_writer(&mut *self.0, value)
    }

    /// `[…]` of `values`, each through serde_json.
    fn array<T: Serialize>(&mut self, values: &[T]) -> serde_json::Result<()> {
        self.raw("[");
        for (index, value) in values.iter().enumerate() {
            if index > 0 {
                self.raw(",");
            }
            self.value(value)?;
        }
        self.raw("]");
        Ok(())
    }
}

/// Appends `text` as a JSON string, quotes and all: the text serde_json writes for it, copied as it is when it
/// needs no escaping.
pub fn push_json_string(out: &mut Vec<u8>, text: &str) {
    Out(out).str(text);
}

/// Appends `text` as the inside of a JSON string, without its quotes: for a string written in pieces (a value
/// being formatted).
pub fn push_json_string_contents(out: &mut Vec<u8>, text: &str) {
    if needs_no_escape(text) {
        out.extend_from_slice(text.as_bytes());
    } else {
        let start = out.len();
        // Writing a string into a vector cannot fail; its quotes are taken off again.
        let _ = serde_json::to_writer(&mut *out, text);
        out.pop();
        out.remove(start);
    }
}

/// Whether `text` holds nothing JSON escapes (a control character, `"` or `\`). Every byte is looked at without
/// an early exit, which the compiler turns into a scan of many bytes at once.
fn needs_no_escape(text: &str) -> bool {
    !text.bytes().fold(false, |escape, b| {
        escape | (b < 0x20) | (b == b'"') | (b == b'\\')
    })
}

impl ResponseObject<'_> {
    /// Appends the object's JSON text to `out`: the same text as serialising it with serde_json. On an error
    /// (a part that cannot be JSON), `out` may hold part of it.
    pub fn write_json(&self, out: &mut Vec<u8>) -> serde_json::Result<()> {
        let mut out = Out(out);
        out.raw(r#"{"id":"#);
        out.str(self.id);
        out.raw(r#","object":"#);
        out.str(self.object);
        out.raw(r#","created_at":"#);
        out.int(self.created_at);
        out.raw(r#","completed_at":"#);
        out.opt_int(self.completed_at);
        out.raw(r#","conversation":"#);
        out.opt(self.conversation.as_ref(), |out, conversation| {
            out.raw(r#"{"id":"#);
            out.str(conversation.id);
            out.raw("}");
        });
        out.raw(r#","status":"#);
        out.str(self.status);
        out.raw(r#","background":"#);
        out.bool(self.background);
        out.raw(r#","error":"#);
        out.opt(self.error.as_ref(), |out, error| {
            out.raw(r#"{"code":"#);
            out.str(error.code);
            out.raw(r#","message":"#);
            out.str(error.message);
            out.raw("}");
        });
        out.raw(r#","incomplete_details":"#);
        out.opt(self.incomplete_details.as_ref(), |out, details| {
            out.raw(r#"{"reason":"#);
            out.str(details.reason);
            out.raw("}");
        });
        out.raw(r#","instructions":"#);
        out.opt_str(self.instructions);
        out.raw(r#","max_output_tokens":"#);
        out.opt_int(self.max_output_tokens);
        out.raw(r#","max_tool_calls":"#);
        out.opt_int(self.max_tool_calls);
        out.raw(r#","model":"#);
        out.str(self.model);
        out.raw(r#","output":"#);
        out.raw("[");
        for (index, item) in self.output.iter().enumerate() {
            if index > 0 {
                out.raw(",");
            }
            match item {
                ClientItem::Item(Item::Message(message)) => write_message(&mut out, message)?,
                item => out.value(item)?,
            }
        }
        out.raw("]");
        out.raw(r#","output_text":"#);
        out.str(&self.output_text);
        out.raw(r#","parallel_tool_calls":"#);
        out.bool(self.parallel_tool_calls);
        out.raw(r#","previous_response_id":"#);
        out.opt_str(self.previous_response_id);
        out.raw(r#","prompt_cache_key":"#);
        out.opt_str(self.prompt_cache_key);
        out.raw(r#","reasoning":"#);
        out.value(&self.reasoning)?;
        out.raw(r#","safety_identifier":"#);
        out.opt_str(self.safety_identifier);
        out.raw(r#","service_tier":"#);
        out.str(self.service_tier);
        out.raw(r#","store":"#);
        out.bool(self.store);
        out.raw(r#","temperature":"#);
        out.value(&self.temperature)?;
        out.raw(r#","text":"#);
        out.value(&self.text)?;
        out.raw(r#","tool_choice":"#);
        out.value(self.tool_choice)?;
        out.raw(r#","tools":"#);
        out.array(&self.tools)?;
        out.raw(r#","top_logprobs":"#);
        out.int(self.top_logprobs);
        out.raw(r#","top_p":"#);
        out.value(&self.top_p)?;
        out.raw(r#","truncation":"#);
        out.str(self.truncation);
        out.raw(r#","presence_penalty":"#);
        out.value(&self.presence_penalty)?;
        out.raw(r#","frequency_penalty":"#);
        out.value(&self.frequency_penalty)?;
        out.raw(r#","usage":"#);
        out.opt(self.usage.as_ref(), write_usage);
        out.raw(r#","user":"#);
        out.opt_str(self.user);
        out.raw(r#","metadata":{"#);
        for (index, (key, value)) in self.metadata.iter().enumerate() {
            if index > 0 {
                out.raw(",");
            }
            out.str(key);
            out.raw(":");
            out.str(value);
        }
        out.raw("}}");
        Ok(())
    }
}

fn write_usage(out: &mut Out<'_>, usage: &UsageObject) {
    out.raw(r#"{"input_tokens":"#);
    out.int(usage.input_tokens);
    out.raw(r#","input_tokens_details":{"cache_write_tokens":"#);
    out.int(usage.input_tokens_details.cache_write_tokens);
    out.raw(r#","cached_tokens":"#);
    out.int(usage.input_tokens_details.cached_tokens);
    out.raw(r#"},"output_tokens":"#);
    out.int(usage.output_tokens);
    out.raw(r#","output_tokens_details":{"reasoning_tokens":"#);
    out.int(usage.output_tokens_details.reasoning_tokens);
    out.raw(r#"},"total_tokens":"#);
    out.int(usage.total_tokens);
    out.raw("}");
}

/// A message item, the output's most common: by hand, its parts of text too; any other part through serde_json.
fn write_message(out: &mut Out<'_>, message: &MessageItem) -> serde_json::Result<()> {
    out.raw(r#"{"type":"message""#);
    if let Some(id) = &message.id {
        out.raw(r#","id":"#);
        out.str(id);
    }
    out.raw(match message.role {
        Role::User => r#","role":"user","content":"#,
        Role::Assistant => r#","role":"assistant","content":"#,
        Role::System => r#","role":"system","content":"#,
        Role::Developer => r#","role":"developer","content":"#,
    });
    match &message.content {
        MessageContent::Text(text) => out.str(text),
        MessageContent::Parts(parts) => {
            out.raw("[");
            for (index, part) in parts.iter().enumerate() {
                if index > 0 {
                    out.raw(",");
                }
                match part {
                    ContentPart::OutputText {
                        text,
                        annotations,
                        logprobs,
                    } if annotations.is_empty() && logprobs.is_empty() => {
                        out.raw(r#"{"type":"output_text","text":"#);
                        out.str(text);
                        out.raw(r#","annotations":[],"logprobs":[]}"#);
                    }
                    ContentPart::InputText { text } => {
                        out.raw(r#"{"type":"input_text","text":"#);
                        out.str(text);
                        out.raw("}");
                    }
                    part => out.value(part)?,
                }
            }
            out.raw("]");
        }
    }
    if let Some(status) = &message.status {
        out.raw(r#","status":"#);
        out.str(status);
    }
    out.raw("}");
    Ok(())
}
