//! Input tokens of a model call before it is made (SPEC 15): asked of the provider where it has a counting
//! endpoint (Anthropic's `count_tokens`, a Responses upstream's `input_tokens`), counted here otherwise, with the
//! model family's tokenizer over the Chat Completions request the deployment would be sent.

use std::sync::OnceLock;

use gateway_core::entity::ProviderKind;
use serde_json::{Map, Value};
use tiktoken_rs::CoreBPE;

/// Where a deployment's input tokens are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CountedBy {
    /// The provider's own counting endpoint.
    Provider,
    /// Here, with this encoding.
    Local(Encoding),
}

/// A tokenizer encoding shipped in the binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// GPT-4o, GPT-4.1, GPT-5 and the o-series; the default for a model not known.
    O200kBase,
    /// GPT-4 and GPT-3.5.
    Cl100kBase,
}

impl Encoding {
    /// The encoding of a model, by its name's family.
    pub fn for_model(model: &str) -> Encoding {
        let model = model.rsplit('/').next().unwrap_or(model);
        let older = [
            "gpt-4-",
            "gpt-3.5",
            "gpt-35",
            "text-embedding-3",
            "text-embedding-ada",
        ];
        if model == "gpt-4" || older.iter().any(|prefix| model.starts_with(prefix)) {
            Encoding::Cl100kBase
        } else {
            Encoding::O200kBase
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::O200kBase => "o200k_base",
            Encoding::Cl100kBase => "cl100k_base",
        }
    }

    fn bpe(self) -> &'static CoreBPE {
        static O200K: OnceLock<CoreBPE> = OnceLock::new();
        static CL100K: OnceLock<CoreBPE> = OnceLock::new();
        // The ranks are compiled into the crate: building them reads no file and cannot fail on valid data.
        #[allow(clippy::expect_used)]
        match self {
            Encoding::O200kBase => {
                O200K.get_or_init(|| tiktoken_rs::o200k_base().expect("o200k_base ranks"))
            }
            Encoding::Cl100kBase => {
                CL100K.get_or_init(|| tiktoken_rs::cl100k_base().expect("cl100k_base ranks"))
            }
        }
    }

    fn tokens(self, text: &str) -> u64 {
        self.bpe().encode_ordinary(text).len() as u64
    }
}

/// Where `kind` counts, and (for a provider) the endpoint after the base URL and the body fields it takes.
pub(super) fn counting(
    kind: ProviderKind,
    model: &str,
) -> (CountedBy, Option<(&'static str, &'static [&'static str])>) {
    match kind {
        ProviderKind::Anthropic => (
            CountedBy::Provider,
            Some((
                "/v1/messages/count_tokens",
                &[
                    "model",
                    "messages",
                    "system",
                    "tools",
                    "tool_choice",
                    "thinking",
                ],
            )),
        ),
        ProviderKind::OpenaiResponses => (
            CountedBy::Provider,
            Some((
                "/responses/input_tokens",
                &[
                    "model",
                    "input",
                    "instructions",
                    "tools",
                    "tool_choice",
                    "parallel_tool_calls",
                    "reasoning",
                    "text",
                ],
            )),
        ),
        ProviderKind::OpenaiChat => (CountedBy::Local(Encoding::for_model(model)), None),
    }
}

/// `body` with only the fields in `keep`.
pub(super) fn only(body: Value, keep: &[&str]) -> Value {
    match body {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter(|(key, _)| keep.contains(&key.as_str()))
                .collect::<Map<String, Value>>(),
        ),
        other => other,
    }
}

/// Tokens a message costs beyond its content, and the reply's priming, as OpenAI's chat format has them.
const PER_MESSAGE: u64 = 3;
const PER_NAME: u64 = 1;
const REPLY_PRIMING: u64 = 3;
/// What declaring functions at all costs, beyond their rendering.
const FUNCTIONS_OVERHEAD: u64 = 9;

/// The input tokens of a Chat Completions request body, counted with `encoding`: each message's role, name and
/// content (text parts joined; an assistant's tool calls as their names and arguments), the tools rendered as the
/// model reads function declarations, and the format's fixed costs.
pub fn count_chat_request(body: &Value, encoding: Encoding) -> u64 {
    let mut total = REPLY_PRIMING;
    let messages = body
        .get("messages")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    for message in messages {
        total += PER_MESSAGE;
        for (key, value) in message.as_object().into_iter().flatten() {
            match (key.as_str(), value) {
                ("role", Value::String(role)) => total += encoding.tokens(role),
                ("name", Value::String(name)) => total += PER_NAME + encoding.tokens(name),
                ("content", content) => total += encoding.tokens(&content_text(content)),
                ("tool_calls", Value::Array(calls)) => {
                    for call in calls {
                        let function = &call["function"];
                        total += encoding.tokens(function["name"].as_str().unwrap_or_default());
                        total +=
                            encoding.tokens(function["arguments"].as_str().unwrap_or_default());
                        total += PER_MESSAGE;
                    }
                }
                ("tool_call_id", Value::String(id)) => total += encoding.tokens(id),
                _ => {}
            }
        }
    }
    if let Some(tools) = body
        .get("tools")
        .and_then(Value::as_array)
        .filter(|t| !t.is_empty())
    {
        total += FUNCTIONS_OVERHEAD + encoding.tokens(&render_functions(tools));
    }
    total
}

/// A message's content as the text the model reads.
fn content_text(content: &Value) -> String {
    match content {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|part| part.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

/// Function tools written as the TypeScript-like declarations the model reads them as.
fn render_functions(tools: &[Value]) -> String {
    let mut out = String::from("namespace functions {\n\n");
    for tool in tools {
        let function = tool.get("function").unwrap_or(tool);
        if let Some(description) = function.get("description").and_then(Value::as_str) {
            out.push_str(&format!("// {description}\n"));
        }
        let name = function
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let parameters = function.get("parameters").cloned().unwrap_or(Value::Null);
        let properties = parameters.get("properties").and_then(Value::as_object);
        match properties {
            Some(properties) if !properties.is_empty() => {
                out.push_str(&format!("type {name} = (_: {{\n"));
                for (property, schema) in properties {
                    if let Some(description) = schema.get("description").and_then(Value::as_str) {
                        out.push_str(&format!("// {description}\n"));
                    }
                    let required = parameters
                        .get("required")
                        .and_then(Value::as_array)
                        .is_some_and(|r| r.iter().any(|n| n == property));
                    let optional = if required { "" } else { "?" };
                    out.push_str(&format!("{property}{optional}: {},\n", render_type(schema)));
                }
                out.push_str("}) => any;\n\n");
            }
            _ => out.push_str(&format!("type {name} = () => any;\n\n")),
        }
    }
    out.push_str("} // namespace functions");
    out
}

/// A JSON Schema as a TypeScript-like type.
fn render_type(schema: &Value) -> String {
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        return values
            .iter()
            .map(Value::to_string)
            .collect::<Vec<_>>()
            .join(" | ");
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("array") => format!(
            "{}[]",
            schema
                .get("items")
                .map_or_else(|| "any".to_owned(), render_type)
        ),
        Some("object") => match schema.get("properties").and_then(Value::as_object) {
            Some(properties) if !properties.is_empty() => {
                let fields: Vec<String> = properties
                    .iter()
                    .map(|(name, property)| format!("{name}: {}", render_type(property)))
                    .collect();
                format!("{{\n{}\n}}", fields.join(",\n"))
            }
            _ => "object".to_owned(),
        },
        Some("integer") => "number".to_owned(),
        Some(other) => other.to_owned(),
        None => "any".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Requests whose `prompt_tokens` the OpenAI API reported for `gpt-3.5-turbo` (cl100k_base), as published with
    /// the openai-chat-tokens library's tests: the fixed corpus the local count is measured against.
    fn corpus() -> Vec<(Value, u64)> {
        let function = |name: &str, description: Option<&str>, parameters: Value| {
            let mut f = json!({"name": name, "parameters": parameters});
            if let Some(d) = description {
                f["description"] = json!(d);
            }
            json!({"type": "function", "function": f})
        };
        let empty = json!({"type": "object", "properties": {}});
        let user = |text: &str| json!({"role": "user", "content": text});
        let system = |text: &str| json!({"role": "system", "content": text});
        vec![
            (json!({"messages": [user("hello")]}), 8),
            (json!({"messages": [user("hello world")]}), 9),
            (json!({"messages": [system("hello")]}), 8),
            (json!({"messages": [system("hello:")]}), 9),
            (
                json!({"messages": [system("# Important: you're the best robot"), user("hello robot"), {"role": "assistant", "content": "hello world"}]}),
                27,
            ),
            (
                json!({"messages": [user("hello")], "tools": [function("foo", None, empty.clone())]}),
                31,
            ),
            (
                json!({"messages": [user("hello")], "tools": [function("foo", Some("Do a foo"), empty.clone())]}),
                36,
            ),
            (
                json!({"messages": [user("hello")], "tools": [function("bing_bong", Some("Do a bing bong"),
                    json!({"type": "object", "properties": {"foo": {"type": "string"}}}))]}),
                49,
            ),
            (
                json!({"messages": [user("hello")], "tools": [function("bing_bong", Some("Do a bing bong"),
                    json!({"type": "object", "properties": {"foo": {"type": "string"}, "bar": {"type": "number", "description": "A number"}}}))]}),
                57,
            ),
            (
                json!({"messages": [system("Hello"), user("Hi there")], "tools": [function("do_stuff", None, empty.clone())]}),
                35,
            ),
        ]
    }

    #[test]
    fn the_local_count_is_within_its_stated_error_on_the_corpus() {
        let mut worst: f64 = 0.0;
        let mut exact_without_tools = true;
        for (request, reported) in corpus() {
            let counted = count_chat_request(&request, Encoding::Cl100kBase);
            let error = (counted as f64 - reported as f64).abs() / reported as f64;
            eprintln!(
                "reported {reported}, counted {counted}, error {:.1} %: {request}",
                error * 100.0
            );
            if request.get("tools").is_none() && counted != reported {
                exact_without_tools = false;
            }
            worst = worst.max(error);
        }
        assert!(
            exact_without_tools,
            "messages without tools are counted exactly"
        );
        // docs/behaviour.md states this bound.
        assert!(worst <= 0.10, "worst error {:.1} %", worst * 100.0);
    }

    #[test]
    fn models_get_their_familys_encoding() {
        for (model, encoding) in [
            ("gpt-4o-mini", Encoding::O200kBase),
            ("gpt-5", Encoding::O200kBase),
            ("o3-mini", Encoding::O200kBase),
            ("gpt-4", Encoding::Cl100kBase),
            ("gpt-4-turbo", Encoding::Cl100kBase),
            ("gpt-3.5-turbo", Encoding::Cl100kBase),
            ("openai/gpt-4-0613", Encoding::Cl100kBase),
            ("llama-3.1-70b", Encoding::O200kBase),
        ] {
            assert_eq!(Encoding::for_model(model), encoding, "{model}");
        }
    }
}
