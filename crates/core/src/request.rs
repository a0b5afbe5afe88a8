//! The `POST /v1/responses` body: wire shape, validation, and the normalised parameters the loop runs with.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::items::{json_kind, parse_input_item, InputItem};
pub use crate::toolset::{is_valid_tool_name, FunctionTool};
use crate::toolset::{parse_tools, validate_tool_choice, DeclaredTool};

/// A client's mistake, rendered by the API as a 400 in OpenAI's error shape.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct InvalidRequest {
    pub message: String,
    pub param: Option<String>,
    pub code: Option<String>,
}

impl InvalidRequest {
    pub fn new(message: impl Into<String>, param: impl Into<String>) -> InvalidRequest {
        InvalidRequest {
            message: message.into(),
            param: Some(param.into()),
            code: None,
        }
    }

    pub fn with_code(mut self, code: &str) -> InvalidRequest {
        self.code = Some(code.into());
        self
    }
}

/// The body as clients send it. Fields the gateway does not use are accepted and ignored.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CreateResponseBody {
    pub model: Option<String>,
    pub input: Option<Value>,
    pub instructions: Option<String>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    pub max_tool_calls: Option<i64>,
    pub previous_response_id: Option<String>,
    pub store: Option<bool>,
    pub stream: Option<bool>,
    pub background: Option<bool>,
    pub metadata: Option<BTreeMap<String, String>>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub max_output_tokens: Option<i64>,
    pub truncation: Option<String>,
    pub text: Option<Value>,
    pub reasoning: Option<Value>,
    pub include: Option<Vec<String>>,
    pub user: Option<String>,
    pub safety_identifier: Option<String>,
    pub prompt_cache_key: Option<String>,
    pub service_tier: Option<String>,
    pub conversation: Option<Value>,
    pub prompt: Option<Value>,
    pub top_logprobs: Option<i64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
}

/// The parameters a response runs with, normalised; stored with the response and echoed in it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResponseParams {
    pub instructions: Option<String>,
    /// The client's tools, as declared (echoed in the response).
    pub tools: Vec<DeclaredTool>,
    pub tool_choice: Value,
    pub parallel_tool_calls: bool,
    pub max_tool_calls: Option<u32>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub max_output_tokens: Option<u32>,
    pub truncation: String,
    pub text: Value,
    pub reasoning: Option<Value>,
    pub metadata: BTreeMap<String, String>,
    pub user: Option<String>,
    pub safety_identifier: Option<String>,
    pub prompt_cache_key: Option<String>,
    pub service_tier: Option<String>,
    /// What the client asked to be included (`reasoning.encrypted_content`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include: Option<Vec<String>>,
    /// Log probabilities per output token (0..=20); forwarded where the provider has them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<u32>,
    /// Open Responses' penalties (-2..=2) on tokens already present, and on their frequency; forwarded where
    /// the provider has them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f64>,
    /// The conversation the response starts from and adds its input and output to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation: Option<String>,
    /// With `conversation`: how many items of the response's context came from the conversation as it started.
    /// The response's turn, which it appends to the conversation as it ends, is the context after them (its
    /// input) and its output; an item deleted from the conversation meanwhile stays deleted. Never shown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation_turn_from: Option<usize>,
}

impl Default for ResponseParams {
    /// What a request that sets nothing runs with: as `validate` fills in the fields it leaves out.
    fn default() -> ResponseParams {
        ResponseParams {
            instructions: None,
            tools: Vec::new(),
            tool_choice: Value::String("auto".into()),
            parallel_tool_calls: true,
            max_tool_calls: None,
            temperature: None,
            top_p: None,
            max_output_tokens: None,
            truncation: "disabled".into(),
            text: serde_json::json!({"format": {"type": "text"}}),
            reasoning: None,
            metadata: BTreeMap::new(),
            user: None,
            safety_identifier: None,
            prompt_cache_key: None,
            service_tier: None,
            include: None,
            top_logprobs: None,
            presence_penalty: None,
            frequency_penalty: None,
            conversation: None,
            conversation_turn_from: None,
        }
    }
}

/// A request that passed validation.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidRequest {
    pub model: String,
    /// The new input; item references are resolved by the shell, which can read stored items.
    pub input: Vec<InputItem>,
    pub params: ResponseParams,
    pub previous_response_id: Option<String>,
    pub store: bool,
    pub stream: bool,
    pub background: bool,
}

/// Validates a parsed body; every error names the offending `param`.
pub fn validate(body: CreateResponseBody) -> Result<ValidRequest, InvalidRequest> {
    validate_with(body, true)
}

/// Validates the body of `POST /v1/responses/input_tokens`: a create's, whose `input` may be left out (the
/// instructions, tools or context alone are counted) and whose `stream`, `store` and `background` mean nothing.
pub fn validate_count(mut body: CreateResponseBody) -> Result<ValidRequest, InvalidRequest> {
    body.stream = None;
    body.store = None;
    body.background = None;
    validate_with(body, false)
}

fn validate_with(
    body: CreateResponseBody,
    input_required: bool,
) -> Result<ValidRequest, InvalidRequest> {
    let model = match body.model {
        Some(model) if !model.trim().is_empty() => model,
        Some(_) => return Err(InvalidRequest::new("'model' must not be empty.", "model")),
        None => {
            return Err(
                InvalidRequest::new("Missing required parameter: 'model'.", "model")
                    .with_code("missing_required_parameter"),
            )
        }
    };
    let conversation = match &body.conversation {
        None | Some(Value::Null) => None,
        Some(_) if body.previous_response_id.is_some() => {
            return Err(InvalidRequest::new(
                "'previous_response_id' cannot be used together with 'conversation'.",
                "conversation",
            ))
        }
        Some(value) => Some(crate::conversation::conversation_id(value)?),
    };
    if body.prompt.as_ref().is_some_and(|p| !p.is_null()) {
        return Err(InvalidRequest::new(
            "'prompt' (a prompt template stored at OpenAI) is not supported by this gateway; send the prompt's text as 'instructions' or 'input'.",
            "prompt",
        ));
    }
    let input = parse_input(body.input)?;
    if input_required
        && input.is_empty()
        && body.previous_response_id.is_none()
        && conversation.is_none()
    {
        return Err(InvalidRequest::new("'input' must not be empty.", "input"));
    }
    for (param, value, min, max) in [
        ("temperature", body.temperature, 0.0, 2.0),
        ("top_p", body.top_p, 0.0, 1.0),
        ("presence_penalty", body.presence_penalty, -2.0, 2.0),
        ("frequency_penalty", body.frequency_penalty, -2.0, 2.0),
    ] {
        if let Some(value) = value {
            check_range(param, value, min, max)?;
        }
    }
    let max_output_tokens = match body.max_output_tokens {
        Some(n) if n < 16 => {
            return Err(InvalidRequest::new(
                format!("Invalid 'max_output_tokens': integer below minimum value. Expected a value >= 16, but got {n} instead."),
                "max_output_tokens",
            )
            .with_code("integer_below_min_value"))
        }
        Some(n) if n > i64::from(u32::MAX) => {
            return Err(InvalidRequest::new(
                format!("Invalid 'max_output_tokens': integer above maximum value. Expected a value <= {}, but got {n} instead.", u32::MAX),
                "max_output_tokens",
            )
            .with_code("integer_above_max_value"))
        }
        other => other.map(|n| n as u32),
    };
    let max_tool_calls = match body.max_tool_calls {
        Some(n) if !(1..=u32::MAX as i64).contains(&n) => {
            return Err(InvalidRequest::new(
                format!("Invalid 'max_tool_calls': expected a value >= 1, but got {n} instead."),
                "max_tool_calls",
            )
            .with_code("integer_below_min_value"))
        }
        other => other.map(|n| n as u32),
    };
    if let Some(n) = body.top_logprobs {
        if !(0..=20).contains(&n) {
            return Err(InvalidRequest::new(
                "'top_logprobs' must be between 0 and 20.",
                "top_logprobs",
            ));
        }
    }
    let truncation = body.truncation.unwrap_or_else(|| "disabled".into());
    if truncation != "auto" && truncation != "disabled" {
        return Err(InvalidRequest::new(
            format!("Invalid value for 'truncation': '{truncation}'. Supported values are: 'auto' and 'disabled'."),
            "truncation",
        ));
    }
    let metadata = body.metadata.unwrap_or_default();
    validate_metadata(&metadata)?;
    // The gateway's own keys say what it did with the request; a client's would be taken for its word.
    for reserved in [
        crate::preparation::IGNORED_PARAMS_KEY,
        crate::toolset::IGNORED_TOOLS_KEY,
    ] {
        if metadata.contains_key(reserved) {
            return Err(InvalidRequest::new(
                format!("Invalid 'metadata': the key '{reserved}' is the gateway's own; choose another name."),
                "metadata",
            ));
        }
    }
    let tools = parse_tools(body.tools.unwrap_or_default())?;
    let tool_choice = body
        .tool_choice
        .unwrap_or_else(|| Value::String("auto".into()));
    validate_tool_choice(&tool_choice)?;
    let text = body
        .text
        .unwrap_or_else(|| serde_json::json!({"format": {"type": "text"}}));
    validate_text(&text)?;
    if let Some(reasoning) = &body.reasoning {
        validate_reasoning(reasoning)?;
    }
    if let Some(id) = &body.previous_response_id {
        if id.is_empty() {
            return Err(InvalidRequest::new(
                "'previous_response_id' must not be empty.",
                "previous_response_id",
            ));
        }
    }
    let background = body.background.unwrap_or(false);
    let store = body.store.unwrap_or(true);
    if background && !store {
        return Err(InvalidRequest::new(
            "Background responses must be stored: 'store' cannot be false.",
            "store",
        ));
    }
    Ok(ValidRequest {
        model,
        input,
        params: ResponseParams {
            instructions: body.instructions,
            tools,
            tool_choice,
            parallel_tool_calls: body.parallel_tool_calls.unwrap_or(true),
            max_tool_calls,
            temperature: body.temperature,
            top_p: body.top_p,
            max_output_tokens,
            truncation,
            text,
            reasoning: body.reasoning,
            metadata,
            user: body.user,
            safety_identifier: body.safety_identifier,
            prompt_cache_key: body.prompt_cache_key,
            service_tier: body.service_tier,
            include: body.include,
            top_logprobs: body.top_logprobs.map(|n| n as u32),
            presence_penalty: body.presence_penalty,
            frequency_penalty: body.frequency_penalty,
            conversation,
            // Known once the conversation is read.
            conversation_turn_from: None,
        },
        previous_response_id: body.previous_response_id,
        store,
        stream: body.stream.unwrap_or(false),
        background,
    })
}

/// `value` of `param` within `min..=max`, or the error that says on which side it fell.
fn check_range(param: &str, value: f64, min: f64, max: f64) -> Result<(), InvalidRequest> {
    if (min..=max).contains(&value) {
        return Ok(());
    }
    let code = if value < min {
        "decimal_below_min_value"
    } else {
        "decimal_above_max_value"
    };
    Err(InvalidRequest::new(
        format!(
            "Invalid '{param}': expected a value between {min} and {max}, but got {value} instead."
        ),
        param,
    )
    .with_code(code))
}

fn parse_input(input: Option<Value>) -> Result<Vec<InputItem>, InvalidRequest> {
    match input {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(text)) => Ok(vec![InputItem::Item(crate::items::Item::user_text(text))]),
        Some(Value::Array(values)) => values
            .into_iter()
            .enumerate()
            .map(|(i, value)| {
                parse_input_item(value).map_err(|e| {
                    InvalidRequest::new(format!("Invalid 'input[{i}]': {}", e.message), format!("input[{i}]"))
                })
            })
            .collect(),
        Some(other) => Err(InvalidRequest::new(
            format!("Invalid type for 'input': expected a string or an array of items, but got {} instead.", json_kind(&other)),
            "input",
        )
        .with_code("invalid_type")),
    }
}

/// `reasoning`: an object whose `effort`, `summary` and `generate_summary`, when set, are among the values
/// OpenAI's schema lists (and `none` for a summary, which Codex sends); its other fields are passed on as they
/// are.
fn validate_reasoning(reasoning: &Value) -> Result<(), InvalidRequest> {
    const EFFORTS: &[&str] = &["none", "minimal", "low", "medium", "high", "xhigh", "max"];
    const SUMMARIES: &[&str] = &["auto", "concise", "detailed", "none"];
    let Some(fields) = reasoning.as_object() else {
        return Err(InvalidRequest::new(
            format!(
                "Invalid type for 'reasoning': expected an object, but got {} instead.",
                json_kind(reasoning)
            ),
            "reasoning",
        )
        .with_code("invalid_type"));
    };
    for (field, allowed) in [
        ("effort", EFFORTS),
        ("summary", SUMMARIES),
        ("generate_summary", SUMMARIES),
    ] {
        let param = format!("reasoning.{field}");
        match fields.get(field) {
            None | Some(Value::Null) => {}
            Some(Value::String(value)) if allowed.contains(&value.as_str()) => {}
            Some(Value::String(value)) => {
                let supported = allowed
                    .iter()
                    .map(|v| format!("'{v}'"))
                    .collect::<Vec<_>>()
                    .join(", ");
                return Err(InvalidRequest::new(
                    format!("Invalid value for '{param}': '{value}'. Supported values are: {supported}."),
                    param,
                )
                .with_code("invalid_value"));
            }
            Some(other) => {
                return Err(InvalidRequest::new(
                    format!(
                        "Invalid type for '{param}': expected a string, but got {} instead.",
                        json_kind(other)
                    ),
                    param,
                )
                .with_code("invalid_type"))
            }
        }
    }
    Ok(())
}

fn validate_text(text: &Value) -> Result<(), InvalidRequest> {
    match text.get("verbosity") {
        None | Some(Value::Null) => {}
        Some(Value::String(v)) if matches!(v.as_str(), "low" | "medium" | "high") => {}
        Some(other) => {
            return Err(InvalidRequest::new(
                format!(
                    "Invalid 'text.verbosity': expected 'low', 'medium' or 'high', got {other}."
                ),
                "text.verbosity",
            ))
        }
    }
    let Some(format) = text.get("format") else {
        return if text.is_object() {
            Ok(())
        } else {
            Err(InvalidRequest::new(
                "Invalid 'text': expected an object.",
                "text",
            ))
        };
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") | Some("json_object") => Ok(()),
        Some("json_schema")
            if format.get("schema").is_some_and(Value::is_object)
                && format.get("name").is_some() =>
        {
            Ok(())
        }
        Some("json_schema") => Err(InvalidRequest::new(
            "Invalid 'text.format': a json_schema format needs 'name' and an object 'schema'.",
            "text.format",
        )),
        _ => Err(InvalidRequest::new(
            "Invalid 'text.format.type': expected 'text', 'json_object' or 'json_schema'.",
            "text.format.type",
        )),
    }
}

/// OpenAI's bounds on `metadata`: at most 16 keys of at most 64 characters, values of at most 512.
pub fn validate_metadata(metadata: &BTreeMap<String, String>) -> Result<(), InvalidRequest> {
    if metadata.len() > 16 {
        return Err(InvalidRequest::new(
            "Invalid 'metadata': at most 16 keys are allowed.",
            "metadata",
        ));
    }
    for (key, value) in metadata {
        if key.chars().count() > 64 {
            return Err(InvalidRequest::new(
                format!("Invalid 'metadata': key '{key}' is longer than 64 characters."),
                "metadata",
            ));
        }
        if value.chars().count() > 512 {
            return Err(InvalidRequest::new(
                format!("Invalid 'metadata': the value of '{key}' is longer than 512 characters."),
                "metadata",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(value: Value) -> CreateResponseBody {
        serde_json::from_value(value).unwrap()
    }

    fn param_of(value: Value) -> Option<String> {
        validate(body(value)).unwrap_err().param
    }

    #[test]
    fn string_input_becomes_one_user_message() {
        let valid = validate(body(json!({"model": "m", "input": "hi"}))).unwrap();
        assert_eq!(valid.params, ResponseParams::default(), "the defaults");
        assert_eq!(
            valid.input,
            vec![InputItem::Item(crate::items::Item::user_text("hi"))]
        );
        assert!(valid.store);
        assert!(!valid.stream);
    }

    #[test]
    fn reasoning_as_the_clients_send_it_is_kept_whole() {
        for reasoning in [
            json!({"effort": "high", "summary": "auto"}),
            json!({"effort": "minimal", "summary": "none"}),
            json!({"effort": null, "summary": null, "context": "all_turns"}),
            json!({"generate_summary": "concise"}),
        ] {
            let valid = validate(body(
                json!({"model": "m", "input": "x", "reasoning": reasoning.clone()}),
            ))
            .unwrap_or_else(|e| panic!("{reasoning}: {}", e.message));
            assert_eq!(valid.params.reasoning, Some(reasoning));
        }
    }

    #[test]
    fn each_invalid_field_is_named_as_param() {
        let cases = [
            (json!({}), "model"),
            (
                json!({"model": "m", "input": "x", "temperature": 2.5}),
                "temperature",
            ),
            (json!({"model": "m", "input": "x", "top_p": -0.1}), "top_p"),
            (
                json!({"model": "m", "input": "x", "max_output_tokens": 3}),
                "max_output_tokens",
            ),
            (
                json!({"model": "m", "input": "x", "max_tool_calls": 0}),
                "max_tool_calls",
            ),
            (json!({"model": "m", "input": 5}), "input"),
            (
                json!({"model": "m", "input": [{"type": "bogus"}]}),
                "input[0]",
            ),
            (
                json!({"model": "m", "input": "x", "tools": [{"type": "Web Search"}]}),
                "tools[0].type",
            ),
            (
                json!({"model": "m", "input": "x", "tools": [{"name": "f"}]}),
                "tools[0].type",
            ),
            (
                json!({"model": "m", "input": "x", "tools": [{"type": "function", "name": "f",
                    "parameters": {"type": "nonsense", "properties": 5}}]}),
                "tools[0].parameters",
            ),
            (
                json!({"model": "m", "input": "x", "tools": [{"type": "custom", "name": "c",
                    "format": {"type": "grammar", "syntax": "ebnf", "definition": "x"}}]}),
                "tools[0].format",
            ),
            (
                json!({"model": "m", "input": "x", "tools": [{"type": "namespace", "name": "ns", "tools": []}]}),
                "tools[0].tools",
            ),
            (
                json!({"model": "m", "input": "x", "tools": [{"type": "namespace", "name": "ns",
                    "tools": [{"type": "web_search"}]}]}),
                "tools[0].tools[0].type",
            ),
            (
                json!({"model": "m", "input": "x", "tools": [{"type": "mcp"}]}),
                "tools[0].server_label",
            ),
            (
                json!({"model": "m", "input": "x", "tools": [{"type": "function", "name": "a b"}]}),
                "tools[0].name",
            ),
            (
                json!({"model": "m", "input": "x", "tool_choice": "sometimes"}),
                "tool_choice",
            ),
            (
                json!({"model": "m", "input": "x", "prompt": {"id": "pmpt_1"}}),
                "prompt",
            ),
            (
                json!({"model": "m", "input": "x", "text": {"verbosity": "loud"}}),
                "text.verbosity",
            ),
            (
                json!({"model": "m", "input": "x", "truncation": "maybe"}),
                "truncation",
            ),
            (
                json!({"model": "m", "input": "x", "previous_response_id": ""}),
                "previous_response_id",
            ),
            (
                json!({"model": "m", "input": "x", "conversation": "conv_1", "previous_response_id": "resp_1"}),
                "conversation",
            ),
            (
                json!({"model": "m", "input": "x", "conversation": {"id": 3}}),
                "conversation",
            ),
            (
                json!({"model": "m", "input": "x", "background": true, "store": false}),
                "store",
            ),
        ];
        for (value, param) in cases {
            assert_eq!(param_of(value.clone()).as_deref(), Some(param), "{value}");
        }
    }

    #[test]
    fn duplicate_client_tool_names_are_rejected() {
        let tool = json!({"type": "function", "name": "f", "parameters": {"type": "object"}});
        let err = validate(body(
            json!({"model": "m", "input": "x", "tools": [tool.clone(), tool]}),
        ))
        .unwrap_err();
        assert_eq!(err.param.as_deref(), Some("tools[1].name"));
    }
}
