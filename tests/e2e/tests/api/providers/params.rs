//! The parameter table of `docs/behaviour.md` ("Request fields") as a test: every row, over every provider kind,
//! whole and streamed, checks what the upstream was sent and whether the response lists the parameter under
//! `metadata.gateway_ignored_params`. A row added to the docs belongs here too.

use serde_json::{json, Value};

use super::{add_provider, Kind};
use crate::common::sse::post_stream;
use crate::common::*;

/// What a kind's upstream request must show for a row.
#[derive(Debug, Clone)]
enum Sent {
    /// This JSON pointer holds this value.
    At(&'static str, Value),
    /// Nothing of the parameter is sent, and the response lists it as ignored.
    Ignored,
}

use Sent::{At, Ignored};

/// One row: the parameter as the response lists it, what the create adds, and per kind (Chat, Anthropic,
/// Responses) what is sent.
struct Row {
    param: &'static str,
    body: Value,
    sent: [Sent; 3],
}

fn lookup_tool() -> Value {
    json!({"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}})
}

fn table() -> Vec<Row> {
    let row = |param, body, sent| Row { param, body, sent };
    vec![
        row(
            "instructions",
            json!({"instructions": "Be brief."}),
            [
                At("/messages/0/content", json!("Be brief.")),
                At("/system/0/text", json!("Be brief.")),
                At("/instructions", json!("Be brief.")),
            ],
        ),
        row(
            "temperature",
            json!({"temperature": 0.3}),
            [
                At("/temperature", json!(0.3)),
                At("/temperature", json!(0.3)),
                At("/temperature", json!(0.3)),
            ],
        ),
        row(
            "top_p",
            json!({"top_p": 0.9}),
            [
                At("/top_p", json!(0.9)),
                At("/top_p", json!(0.9)),
                At("/top_p", json!(0.9)),
            ],
        ),
        row(
            "max_output_tokens",
            json!({"max_output_tokens": 77}),
            [
                At("/max_tokens", json!(77)),
                At("/max_tokens", json!(77)),
                At("/max_output_tokens", json!(77)),
            ],
        ),
        row(
            "reasoning.effort",
            json!({"reasoning": {"effort": "high"}}),
            [
                At("/reasoning_effort", json!("high")),
                At(
                    "/thinking",
                    json!({"type": "enabled", "budget_tokens": 16384}),
                ),
                At("/reasoning/effort", json!("high")),
            ],
        ),
        row(
            "reasoning.summary",
            json!({"reasoning": {"summary": "auto"}}),
            [Ignored, Ignored, At("/reasoning/summary", json!("auto"))],
        ),
        row(
            "text.format",
            json!({"text": {"format": {"type": "json_object"}}}),
            [
                At("/response_format", json!({"type": "json_object"})),
                At(
                    "/tool_choice",
                    json!({"type": "tool", "name": gateway_core::anthropic::STRUCTURED_OUTPUT_TOOL}),
                ),
                At("/text/format", json!({"type": "json_object"})),
            ],
        ),
        row(
            "text.verbosity",
            json!({"text": {"format": {"type": "text"}, "verbosity": "low"}}),
            [
                At("/verbosity", json!("low")),
                Ignored,
                At("/text/verbosity", json!("low")),
            ],
        ),
        row(
            "top_logprobs",
            json!({"top_logprobs": 2}),
            [
                At("/top_logprobs", json!(2)),
                Ignored,
                At("/top_logprobs", json!(2)),
            ],
        ),
        row(
            "presence_penalty",
            json!({"presence_penalty": 1.5}),
            [At("/presence_penalty", json!(1.5)), Ignored, Ignored],
        ),
        row(
            "frequency_penalty",
            json!({"frequency_penalty": -0.5}),
            [At("/frequency_penalty", json!(-0.5)), Ignored, Ignored],
        ),
        row(
            "prompt_cache_key",
            json!({"prompt_cache_key": "k1"}),
            [
                At("/prompt_cache_key", json!("k1")),
                Ignored,
                At("/prompt_cache_key", json!("k1")),
            ],
        ),
        row(
            "service_tier",
            json!({"service_tier": "flex"}),
            [
                At("/service_tier", json!("flex")),
                Ignored,
                At("/service_tier", json!("flex")),
            ],
        ),
        row(
            "safety_identifier",
            json!({"safety_identifier": "s1"}),
            [
                At("/safety_identifier", json!("s1")),
                At("/metadata/user_id", json!("s1")),
                At("/safety_identifier", json!("s1")),
            ],
        ),
        row(
            "user",
            json!({"user": "u1"}),
            [
                At("/user", json!("u1")),
                At("/metadata/user_id", json!("u1")),
                At("/user", json!("u1")),
            ],
        ),
        row(
            "tool_choice",
            json!({"tools": [lookup_tool()], "tool_choice": "required"}),
            [
                At("/tool_choice", json!("required")),
                At("/tool_choice/type", json!("any")),
                At("/tool_choice", json!("required")),
            ],
        ),
        row(
            "parallel_tool_calls",
            json!({"tools": [lookup_tool()], "parallel_tool_calls": false}),
            [
                At("/parallel_tool_calls", json!(false)),
                At("/tool_choice/disable_parallel_tool_use", json!(true)),
                At("/parallel_tool_calls", json!(false)),
            ],
        ),
    ]
}

fn index(kind: Kind) -> usize {
    match kind {
        Kind::OpenaiChat => 0,
        Kind::Anthropic => 1,
        Kind::OpenaiResponses => 2,
    }
}

/// What is wrong with one answer to a row, if anything.
fn check(kind: Kind, row: &Row, how: &str, sent: &Value, metadata: &Value) -> Option<String> {
    let listed: Vec<&str> = metadata["gateway_ignored_params"]
        .as_str()
        .map(|l| l.split(',').collect())
        .unwrap_or_default();
    let expected = &row.sent[index(kind)];
    let problem = match expected {
        At(pointer, value) if sent.pointer(pointer) != Some(value) => Some(format!(
            "sent {pointer} = {:?}, expected {value}",
            sent.pointer(pointer)
        )),
        At(..) if listed.contains(&row.param) => Some("honoured, yet listed as ignored".to_owned()),
        Ignored if !listed.contains(&row.param) => {
            Some(format!("ignored, yet not listed ({metadata})"))
        }
        _ => None,
    };
    problem.map(|p| format!("{} / {} ({how}): {p}", kind.name(), row.param))
}

pub(super) async fn every_parameter_row_is_sent_or_listed_whole_and_streamed(kind: Kind) {
    let (gw, tenant) = gateway().await;
    add_provider(&gw, &tenant, kind.name(), kind.name(), json!({})).await;
    let mut failures = Vec::new();
    for row in table() {
        let mut body = json!({"model": kind.name(), "input": "Hi"});
        if let (Some(body), Some(extra)) = (body.as_object_mut(), row.body.as_object()) {
            body.extend(extra.clone());
        }
        let whole = create_ok(&gw, &tenant.key, body.clone()).await;
        let sent = gw.model.requests().last().cloned().expect("a call");
        failures.extend(check(kind, &row, "whole", &sent, &whole["metadata"]));

        let events = post_stream(&gw, &tenant.key, body).await;
        let sent = gw.model.requests().last().cloned().expect("a call");
        let completed = events
            .iter()
            .find(|e| e["type"] == "response.completed")
            .map(|e| e["response"]["metadata"].clone())
            .unwrap_or(Value::Null);
        failures.extend(check(kind, &row, "streamed", &sent, &completed));
    }
    assert!(
        failures.is_empty(),
        "{} row(s) failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
