//! What only some provider kinds have: Anthropic thinking replayed with its signature (and dropped for Chat),
//! Responses reasoning replayed with its encrypted content, a chain across all three kinds, fallbacks from one
//! kind to another, and a deployment's settings. What every kind shares is the table in `providers`.

use super::sent::sent;
use super::{add_provider, Kind};
use crate::common::sse::{check_stream, post_stream};
use crate::common::*;
use gateway_e2e::{items_of, Tenant, TestGateway};
use gateway_testkit::{Call, Reply, StreamMode};
use reqwest::Method;
use serde_json::json;

/// A gateway whose tenant sees the `add` tool and a `claude` (anthropic) deployment.
async fn claude() -> (TestGateway, Tenant) {
    let (gw, tenant) = gateway_with_tools(&["add", "fail"]).await;
    add_provider(&gw, &tenant, "claude", "anthropic", json!({})).await;
    (gw, tenant)
}

/// A gateway whose tenant sees the `add` tool and an `oai` (openai_responses) deployment.
async fn oai() -> (TestGateway, Tenant) {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;
    add_provider(&gw, &tenant, "oai", "openai_responses", json!({})).await;
    (gw, tenant)
}

#[tokio::test]
async fn anthropic_thinking_is_replayed_unchanged_on_turn_two_and_dropped_for_chat() {
    let (gw, tenant) = claude().await;
    gw.model
        .push(Reply::text("42").with_thinking("Deep thought.", "SIG_deep"));
    gw.model.push(Reply::text("Still 42."));
    gw.model.push(Reply::text("Chat says 42."));

    let first = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "claude", "input": "answer?"}),
    )
    .await;
    let reasoning = items_of(&first, "reasoning");
    assert_eq!(reasoning.len(), 1, "{first:#}");
    assert_eq!(reasoning[0]["summary"][0]["text"], "Deep thought.");
    assert!(
        reasoning[0].get("encrypted_content").is_none(),
        "shown only when included: {first:#}"
    );
    let second = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "claude", "previous_response_id": id_of(&first), "input": "sure?",
               "include": ["reasoning.encrypted_content"]}),
    )
    .await;
    let third = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "previous_response_id": id_of(&second), "input": "chat?"}),
    )
    .await;
    assert_eq!(third["output_text"], "Chat says 42.");

    let requests = gw.model.requests();
    let replayed = sent(Kind::Anthropic, &requests[1]);
    assert_eq!(replayed.roles, ["user", "assistant", "user"]);
    assert_eq!(
        replayed.lines,
        [
            "user:answer?",
            "thinking:Deep thought.:SIG_deep",
            "assistant:42",
            "user:sure?"
        ],
        "the thinking block first in its turn, with its signature"
    );
    let chat = requests[2].to_string();
    assert!(
        !chat.contains("SIG_deep") && !chat.contains("Deep thought"),
        "{chat}"
    );
    assert_eq!(second["output_text"], "Still 42.");
}

#[tokio::test]
async fn responses_reasoning_is_replayed_with_its_encrypted_content_and_errors_map() {
    let (gw, tenant) = oai().await;
    gw.model
        .push(Reply::text("42").with_thinking("pondering", "gAAAA-enc"));
    gw.model.push(Reply::error(503, "busy"));
    gw.model.push(Reply::text("Yes, 42."));

    let first = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "oai", "input": "answer?", "include": ["reasoning.encrypted_content"]}),
    )
    .await;
    let reasoning = items_of(&first, "reasoning");
    assert_eq!(reasoning[0]["summary"][0]["text"], "pondering", "{first:#}");
    assert!(
        reasoning[0]["encrypted_content"]
            .as_str()
            .is_some_and(|c| c.ends_with("gAAAA-enc")),
        "included when asked: {first:#}"
    );
    let second = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "oai", "previous_response_id": id_of(&first), "input": "sure?"}),
    )
    .await;
    assert_eq!(second["output_text"], "Yes, 42.");
    let requests = gw.model.requests();
    assert_eq!(requests.len(), 3, "the 503 was retried");
    assert_eq!(
        sent(Kind::OpenaiResponses, &requests[2]).lines,
        [
            "user:answer?",
            "reasoning:rs_mock_1:gAAAA-enc",
            "assistant:42",
            "user:sure?"
        ]
    );

    gw.model
        .push(Reply::error(400, "Invalid schema for function 'add'"));
    let answer = gw
        .create(&tenant.key, json!({"model": "oai", "input": "x"}))
        .await;
    assert_error(&answer, 400, None, Some("upstream_rejected"));
    assert!(answer.error()["message"]
        .as_str()
        .unwrap()
        .contains("Invalid schema for function 'add'"));
}

#[tokio::test]
async fn a_chain_across_chat_anthropic_and_responses_pairs_every_call_in_each_providers_shape() {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;
    add_provider(&gw, &tenant, "claude", "anthropic", json!({})).await;
    add_provider(&gw, &tenant, "oai", "openai_responses", json!({})).await;
    // Turn 1, Chat: a server tool, and a call without an id (synthesised).
    gw.model.push(Reply::tool_calls(vec![Call::new(
        "add",
        json!({"a": 1, "b": 1}),
    )
    .without_id()]));
    gw.model.push(Reply::text("2."));
    // Turn 2, Anthropic: thinking, a server tool.
    gw.model.push(
        Reply::tool_calls(vec![
            Call::new("add", json!({"a": 2, "b": 2})).with_id("toolu_2")
        ])
        .with_thinking("Again.", "SIG_2"),
    );
    gw.model.push(Reply::text("4."));
    // Turn 3, Responses.
    gw.model.push(Reply::text("All done."));

    let first = create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "1+1"})).await;
    let synthesised = items_of(&first, "mcp_call")[0]["call_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let second = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "claude", "previous_response_id": id_of(&first), "input": "2+2"}),
    )
    .await;
    let third = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "oai", "previous_response_id": id_of(&second), "input": "done?"}),
    )
    .await;
    assert_eq!(third["output_text"], "All done.");

    let requests = gw.model.requests();
    assert_eq!(requests.len(), 5);
    // Anthropic saw turn 1's call and result as tool_use / tool_result under the synthesised id.
    let anthropic_first = sent(Kind::Anthropic, &requests[2]);
    assert_eq!(
        anthropic_first.roles,
        ["user", "assistant", "user", "assistant", "user"]
    );
    assert_eq!(
        anthropic_first.lines,
        [
            "user:1+1".to_owned(),
            format!("call:{synthesised}:add:{{\"a\":1,\"b\":1}}"),
            format!("result:{synthesised}:{{\"sum\":2}}"),
            "assistant:2.".to_owned(),
            "user:2+2".to_owned(),
        ]
    );
    // The Responses upstream saw both turns' calls and results as items, and no Anthropic thinking.
    assert_eq!(
        sent(Kind::OpenaiResponses, &requests[4]).lines,
        [
            "user:1+1".to_owned(),
            format!("call:{synthesised}:add:{{\"a\":1,\"b\":1}}"),
            format!("result:{synthesised}:{{\"sum\":2}}"),
            "assistant:2.".to_owned(),
            "user:2+2".to_owned(),
            "call:toolu_2:add:{\"a\":2,\"b\":2}".to_owned(),
            "result:toolu_2:{\"sum\":4}".to_owned(),
            "assistant:4.".to_owned(),
            "user:done?".to_owned(),
        ]
    );
    assert!(!requests[4].to_string().contains("SIG_2"));
}

// ---- fallbacks and deployment settings ------------------------------------------------------------------

/// The deployment each model step recorded as having answered, when a fallback did.
async fn answered_by(gw: &TestGateway, tenant: &Tenant, response_id: &str) -> Vec<Option<String>> {
    gw.store
        .load_steps(&tenant.project_id, response_id)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|s| s.model().map(|m| m.deployment.clone()))
        .collect()
}

#[tokio::test]
async fn a_fallback_takes_over_when_the_deployment_fails_after_its_retries() {
    let (gw, tenant) = gateway().await;
    // `claude` falls back to `mock` (chat), which need not be in the project's groups.
    let _ = add_provider(
        &gw,
        &tenant,
        "claude",
        "anthropic",
        json!({"fallbacks": ["mock"]}),
    )
    .await;
    for _ in 0..3 {
        gw.model.push(Reply::error(529, "Overloaded"));
    }
    gw.model.push(Reply::text("from the fallback"));
    let before = metrics_text(&gw).await;

    let body = create_ok(&gw, &tenant.key, json!({"model": "claude", "input": "hi"})).await;

    // Each deployment is counted as itself: the primary's failure, the fallback's success, the fallback taken.
    let after = metrics_text(&gw).await;
    let moved =
        |name: &str, labels: &[&str]| sample(&after, name, labels) - sample(&before, name, labels);
    let calls = "gateway_upstream_calls_total";
    assert_eq!(
        moved(calls, &["deployment=\"claude\"", "outcome=\"error\""]),
        1.0,
        "{after}"
    );
    assert_eq!(
        moved(calls, &["deployment=\"claude\"", "outcome=\"ok\""]),
        0.0,
        "{after}"
    );
    assert_eq!(
        moved(calls, &["deployment=\"mock\"", "outcome=\"ok\""]),
        1.0,
        "{after}"
    );
    assert_eq!(
        moved(
            "gateway_upstream_fallbacks_total",
            &["deployment=\"claude\"", "fallback=\"mock\""]
        ),
        1.0,
        "{after}"
    );

    assert_eq!(body["status"], "completed", "{body:#}");
    assert_eq!(body["output_text"], "from the fallback");
    assert_eq!(
        body["model"], "claude",
        "the response keeps the model asked for"
    );
    let requests = gw.model.requests();
    assert_eq!(requests.len(), 4, "three attempts, then the fallback");
    assert!(
        requests[2].get("max_tokens").is_some(),
        "an Anthropic request"
    );
    assert_eq!(
        requests[3]["messages"][0]["content"], "hi",
        "a Chat request"
    );
    assert_eq!(
        answered_by(&gw, &tenant, &id_of(&body)).await,
        [Some("mock".to_owned())]
    );

    // A rejection is not passed on: the fallback would refuse it too.
    gw.model.reset();
    gw.model.push(Reply::error(400, "bad input"));
    gw.model.push(Reply::text("never used"));
    let answer = gw
        .create(&tenant.key, json!({"model": "claude", "input": "x"}))
        .await;
    assert_error(&answer, 400, None, Some("upstream_rejected"));
    assert_eq!(gw.model.requests().len(), 1);
}

#[tokio::test]
async fn no_fallback_once_streamed_text_reached_the_client() {
    let (gw, tenant) = gateway().await;
    let _ = add_provider(
        &gw,
        &tenant,
        "claude",
        "anthropic",
        json!({"fallbacks": ["mock"]}),
    )
    .await;
    gw.model
        .push(Reply::text("Half an answer").stream_mode(StreamMode::CutMidStream));
    gw.model.push(Reply::text("never used"));

    let checked = check_stream(
        post_stream(&gw, &tenant.key, json!({"model": "claude", "input": "hi"})).await,
    );

    assert_eq!(checked.terminal_kind(), "response.failed");
    assert_eq!(gw.model.requests().len(), 1);
}

#[tokio::test]
async fn deployment_settings_are_validated_shown_and_used() {
    let (gw, tenant) = gateway().await;
    let created = add_provider(
        &gw,
        &tenant,
        "claude",
        "anthropic",
        json!({"fallbacks": ["mock"], "unsupported_tools": "reject", "provider": {"kind": "anthropic",
               "base_url": gw.model.root_url(), "model": "c", "max_tokens": 1234}}),
    )
    .await;
    assert_eq!(created["fallbacks"], json!(["mock"]));
    assert_eq!(created["unsupported_tools"], "reject");
    assert_eq!(created["provider"]["max_tokens"], 1234);
    let id = created["id"].as_str().unwrap();
    let read = gw
        .admin_ok(Method::GET, &format!("/deployments/{id}"), None)
        .await;
    assert_eq!(read, created);

    gw.model.push(Reply::text("ok"));
    create_ok(&gw, &tenant.key, json!({"model": "claude", "input": "hi"})).await;
    assert_eq!(gw.model.requests()[0]["max_tokens"], 1234);

    let patched = gw
        .admin_ok(
            Method::PATCH,
            &format!("/deployments/{id}"),
            Some(json!({"fallbacks": [], "unsupported_tools": "ignore", "provider": {"max_tokens": null}})),
        )
        .await;
    assert_eq!(patched["fallbacks"], json!([]));
    assert_eq!(patched["unsupported_tools"], "ignore");
    assert_eq!(patched["provider"]["max_tokens"], 4096);

    let bad = [
        (json!({"fallbacks": ["nope"]}), "fallbacks[0]"),
        (json!({"fallbacks": ["claude"]}), "fallbacks[0]"),
        (json!({"fallbacks": ["mock", "mock"]}), "fallbacks[1]"),
        (json!({"unsupported_tools": "explode"}), "unsupported_tools"),
        (
            json!({"provider": {"max_tokens": 0}}),
            "provider.max_tokens",
        ),
    ];
    for (body, param) in bad {
        let answer = gw
            .call(
                gw.admin(Method::PATCH, &format!("/deployments/{id}"))
                    .json(&body),
            )
            .await;
        assert_error(&answer, 400, Some(param), Some("invalid_value"));
    }
    let read = gw
        .admin_ok(Method::GET, &format!("/deployments/{id}"), None)
        .await;
    assert_eq!(read, patched, "a refused change changes nothing");
}

/// `reasoning.effort` is Anthropic's extended thinking (budget and room for it in `max_tokens`); what Anthropic
/// cannot take with it, or at all, is left out of the request and listed under `metadata.gateway_ignored_params`,
/// streamed and whole alike. A Responses deployment takes every one of them: nothing is listed.
#[tokio::test]
async fn anthropic_thinks_with_reasoning_effort_and_lists_what_it_cannot_honour() {
    let (gw, tenant) = claude().await;
    let body = json!({"model": "claude", "input": "Think.", "reasoning": {"effort": "medium"},
        "temperature": 0.3, "max_output_tokens": 300, "text": {"format": {"type": "json_object"}},
        "metadata": {"team": "search"}});
    let whole = create_ok(&gw, &tenant.key, body.clone()).await;
    let sent = gw.model.requests().last().cloned().expect("the call");
    assert_eq!(
        sent["thinking"],
        json!({"type": "enabled", "budget_tokens": 4096})
    );
    assert_eq!(sent["max_tokens"], 300 + 4096);
    assert!(sent.get("temperature").is_none(), "{sent:#}");
    assert_eq!(
        whole["metadata"],
        json!({"team": "search", "gateway_ignored_params": "text.format,temperature"})
    );
    let events = post_stream(&gw, &tenant.key, body.clone()).await;
    let completed = events
        .iter()
        .find(|e| e["type"] == "response.completed")
        .expect("response.completed");
    assert_eq!(
        completed["response"]["metadata"]["gateway_ignored_params"],
        "text.format,temperature"
    );

    let (gw, tenant) = oai().await;
    let mut to_responses = body;
    to_responses["model"] = json!("oai");
    let whole = create_ok(&gw, &tenant.key, to_responses).await;
    assert_eq!(whole["metadata"], json!({"team": "search"}));
    let sent = gw.model.requests().last().cloned().expect("the call");
    assert_eq!(sent["reasoning"], json!({"effort": "medium"}));
    assert_eq!(sent["temperature"], 0.3);
    assert_eq!(sent["text"], json!({"format": {"type": "json_object"}}));
}

/// Prompt caching through Anthropic: over a 5-call tool loop each call reads what the one before wrote, the
/// cache reads reach `usage.input_tokens_details.cached_tokens` and the usage records, and the tokens billed
/// (Anthropic's prices: a cache write 1.25×, a read 0.1× of an input token) are measured against the same calls
/// without caching.
#[tokio::test]
async fn anthropic_prompt_caching_rereads_each_calls_prefix_in_a_tool_loop() {
    let (gw, tenant) = claude().await;
    gw.model.count_anthropic_prompt_cache();
    for n in 0..4 {
        gw.model.push(Reply::tool_calls(vec![Call::new(
            "add",
            json!({"a": n, "b": 1}),
        )]));
    }
    gw.model.push(Reply::text("Done adding."));
    let instructions =
        "You add numbers with the add tool, one call at a time, and say when you are done. "
            .repeat(20);
    let body = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "claude", "instructions": instructions, "input": "Add, four times."}),
    )
    .await;
    let requests = gw.model.requests();
    assert_eq!(requests.len(), 5);
    let calls = gateway_testkit::anthropic_prompt_cache_usage(&requests);
    let total: u64 = calls.iter().map(|(i, w, r)| i + w + r).sum();
    let read: u64 = calls.iter().map(|(_, _, r)| r).sum();
    assert_eq!(body["usage"]["input_tokens"], total, "{:#}", body["usage"]);
    assert_eq!(body["usage"]["input_tokens_details"]["cached_tokens"], read);
    // From the second call on, each reads at least everything the previous call sent.
    for (n, window) in calls.windows(2).enumerate() {
        let (previous, next) = (window[0], window[1]);
        assert!(
            next.2 >= previous.0 + previous.1 + previous.2,
            "call {}: {calls:?}",
            n + 2
        );
    }
    let billed_with: f64 = calls
        .iter()
        .map(|&(i, w, r)| i as f64 + 1.25 * w as f64 + 0.1 * r as f64)
        .sum();
    let billed_without = total as f64;
    eprintln!(
        "5-call tool loop on the Anthropic kind: {total} input tokens; billed as input tokens with caching {billed_with:.0}, without {billed_without:.0} ({:.0} %); per call (input, written, read): {calls:?}",
        100.0 * billed_with / billed_without
    );
    assert!(
        billed_with < 0.5 * billed_without,
        "{billed_with} vs {billed_without}"
    );

    // The usage records hold the cached tokens too.
    let usage = gw
        .admin_ok(
            Method::GET,
            &format!("/usage?project_id={}", tenant.project_id),
            None,
        )
        .await;
    assert_eq!(usage["data"][0]["cached_input_tokens"], read, "{usage:#}");
}

/// `text.format` through Anthropic: the schema is a tool the model is made to call, its input is the message's
/// `output_text` (streamed as `output_text` deltas), nothing is handed back as a call and nothing listed.
#[tokio::test]
async fn anthropic_answers_a_json_schema_format_through_a_forced_tool() {
    let (gw, tenant) = claude().await;
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}, "temp_c": {"type": "integer"}},
        "required": ["city", "temp_c"], "additionalProperties": false});
    let body = json!({"model": "claude", "input": "Weather as JSON.",
        "text": {"format": {"type": "json_schema", "name": "weather", "schema": schema, "strict": true}}});
    let answer = json!({"city": "Paris", "temp_c": 21});
    gw.model.push(Reply::tool_calls(vec![Call::new(
        gateway_core::anthropic::STRUCTURED_OUTPUT_TOOL,
        answer.clone(),
    )]));
    let whole = create_ok(&gw, &tenant.key, body.clone()).await;
    assert_eq!(
        parse(whole["output_text"].as_str().expect("output_text")),
        answer
    );
    assert_eq!(
        whole["output"].as_array().map(Vec::len),
        Some(1),
        "{whole:#}"
    );
    assert_eq!(whole["output"][0]["type"], "message");
    assert!(
        whole["metadata"].get("gateway_ignored_params").is_none(),
        "{whole:#}"
    );
    assert_eq!(whole["text"]["format"]["strict"], true);
    let sent = gw.model.requests().last().cloned().expect("the call");
    // The tenant's server tools are offered too: the model must call a tool, the format's when it answers.
    assert_eq!(sent["tool_choice"], json!({"type": "any"}));
    let tools = sent["tools"].as_array().expect("tools");
    let format_tool = tools.last().expect("the format's tool");
    assert_eq!(
        format_tool["name"],
        gateway_core::anthropic::STRUCTURED_OUTPUT_TOOL
    );
    assert_eq!(format_tool["input_schema"], schema);

    gw.model.push(Reply::tool_calls(vec![Call::new(
        gateway_core::anthropic::STRUCTURED_OUTPUT_TOOL,
        answer.clone(),
    )]));
    let events = post_stream(&gw, &tenant.key, body).await;
    let deltas: String = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .filter_map(|e| e["delta"].as_str())
        .collect();
    assert_eq!(parse(&deltas), answer);
    let completed = events
        .iter()
        .find(|e| e["type"] == "response.completed")
        .expect("completed");
    assert_eq!(
        completed["response"]["output_text"].as_str(),
        Some(deltas.as_str())
    );
}

/// A deployment whose `unsupported_params` is `reject` refuses a create setting a parameter its kind cannot
/// honour, naming it, before anything is stored or called; the policy is set and shown through the admin API.
#[tokio::test]
async fn a_deployment_can_refuse_parameters_its_kind_cannot_honour() {
    let (gw, tenant) = claude().await;
    let deployments = gw.admin_ok(Method::GET, "/deployments", None).await;
    let claude = deployments["data"]
        .as_array()
        .and_then(|d| d.iter().find(|d| d["name"] == "claude"))
        .cloned()
        .expect("claude");
    assert_eq!(claude["unsupported_params"], "ignore");
    let path = format!("/deployments/{}", id_of(&claude));
    let bad = gw
        .call(
            gw.admin(Method::PATCH, &path)
                .json(&json!({"unsupported_params": "drop"})),
        )
        .await;
    assert_error(&bad, 400, Some("unsupported_params"), Some("invalid_value"));
    let updated = gw
        .admin_ok(
            Method::PATCH,
            &path,
            Some(json!({"unsupported_params": "reject"})),
        )
        .await;
    assert_eq!(updated["unsupported_params"], "reject");

    let rows = stored_rows(&gw).await;
    let answer = gw
        .create(
            &tenant.key,
            json!({"model": "claude", "input": "Hi", "service_tier": "flex"}),
        )
        .await;
    assert_error(
        &answer,
        400,
        Some("service_tier"),
        Some("unsupported_parameter"),
    );
    assert!(gw.model.requests().is_empty());
    assert_eq!(stored_rows(&gw).await, rows);
    // What it can honour still goes through.
    let fine = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "claude", "input": "Hi", "temperature": 0.2}),
    )
    .await;
    assert_eq!(fine["status"], "completed");
}
