//! Rule-based answers of the mock model, used when the script queue is empty.
//!
//! * last message has role `tool` → text `"Tool results: "` + the trailing tool messages'
//!   contents joined by `"; "`;
//! * last user message contains `!call NAME {json}` directives and the request has `tools` →
//!   those tool calls;
//! * otherwise → text `"Echo: "` + the last user message's text.

use serde_json::{json, Value};

use super::reply::{Call, Reply};

/// The text of a message `content`: a string, or the `text` of an array of parts joined by `"\n"`.
fn content_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| match p {
                Value::String(s) => Some(s.as_str()),
                other => other.get("text").and_then(Value::as_str),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}

fn role(message: &Value) -> Option<&str> {
    message.get("role").and_then(Value::as_str)
}

/// The answer for `request` when nothing is scripted.
pub(crate) fn rule_reply(request: &Value) -> Reply {
    let messages: &[Value] = request
        .get("messages")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();

    if messages.last().and_then(role) == Some("tool") {
        let mut contents: Vec<String> = messages
            .iter()
            .rev()
            .take_while(|m| role(m) == Some("tool"))
            .map(|m| content_text(m.get("content")))
            .collect();
        contents.reverse();
        return Reply::text(format!("Tool results: {}", contents.join("; ")));
    }

    let user_text = messages
        .iter()
        .rev()
        .find(|m| role(m) == Some("user"))
        .map(|m| content_text(m.get("content")))
        .unwrap_or_default();

    let has_tools = request
        .get("tools")
        .and_then(Value::as_array)
        .is_some_and(|t| !t.is_empty());
    if has_tools {
        let calls = parse_directives(&user_text);
        if !calls.is_empty() {
            return Reply::tool_calls(calls);
        }
    }
    Reply::text(format!("Echo: {user_text}"))
}

/// Byte length of the balanced JSON object at the start of `s` (which starts with `{`), if it
/// closes.
fn balanced_object_len(s: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '{' => depth += 1,
            '}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return Some(i + c.len_utf8());
                }
            }
            _ => {}
        }
    }
    None
}

/// Every `!call NAME {json args}` directive in `text`, in order.
///
/// The arguments are optional (default `{}`); a directive ends after its balanced JSON object, or
/// at the end of the line when the object does not close. Arguments that are not a valid JSON
/// object are sent verbatim as raw (invalid) arguments.
pub(crate) fn parse_directives(text: &str) -> Vec<Call> {
    const MARKER: &str = "!call";
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(pos) = rest.find(MARKER) {
        let after = &rest[pos + MARKER.len()..];
        if !after.starts_with([' ', '\t']) {
            rest = after;
            continue;
        }
        let after = after.trim_start_matches([' ', '\t']);
        let name_len = after
            .find(|c: char| c.is_whitespace() || c == '{')
            .unwrap_or(after.len());
        let (name, after_name) = after.split_at(name_len);
        if name.is_empty() {
            rest = after;
            continue;
        }
        let args = after_name.trim_start_matches([' ', '\t']);
        if !args.starts_with('{') {
            calls.push(Call::new(name, json!({})));
            rest = after_name;
            continue;
        }
        let len =
            balanced_object_len(args).unwrap_or_else(|| args.find('\n').unwrap_or(args.len()));
        let (raw, remainder) = args.split_at(len);
        let raw = raw.trim_end();
        match serde_json::from_str::<Value>(raw) {
            Ok(v @ Value::Object(_)) => calls.push(Call::new(name, v)),
            _ => calls.push(Call::new(name, json!({})).raw_arguments(raw)),
        }
        rest = remainder;
    }
    calls
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directives_are_parsed_with_and_without_arguments() {
        let calls = parse_directives(
            "please !call get_weather {\"city\": \"Paris {x}\"} and !call fail\n!call add{\"a\":1,\"b\":{\"c\":2}} trailing",
        );
        assert_eq!(
            calls,
            vec![
                Call::new("get_weather", json!({"city": "Paris {x}"})),
                Call::new("fail", json!({})),
                Call::new("add", json!({"a": 1, "b": {"c": 2}})),
            ]
        );
    }

    #[test]
    fn an_unclosed_object_is_sent_as_raw_arguments_up_to_the_end_of_the_line() {
        let calls = parse_directives("!call echo {\"a\": 1\n!call add {\"a\":1,\"b\":2}");
        assert_eq!(
            calls,
            vec![
                Call::new("echo", json!({})).raw_arguments("{\"a\": 1"),
                Call::new("add", json!({"a": 1, "b": 2})),
            ]
        );
    }

    #[test]
    fn text_without_directives_yields_no_calls() {
        assert!(parse_directives("hello !callme maybe, !call").is_empty());
    }

    #[test]
    fn array_content_parts_are_joined() {
        let text = content_text(Some(
            &json!([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]),
        ));
        assert_eq!(text, "a\nb");
    }
}
