//! A tool source's policy (SPEC 7): redirects are not followed, outputs are capped with a marker, and the admin
//! API keeps and checks the policy fields.

use crate::common::*;
use gateway_e2e::{items_of, TestGateway};
use gateway_testkit::{Call, Reply};
use reqwest::Method;
use serde_json::{json, Value};

/// Runs one round in which the model calls `tool` with `arguments`; answers the response and what the model
/// saw as the call's result.
async fn one_round(gw: &TestGateway, key: &str, tool: &str, arguments: Value) -> (Value, String) {
    gw.model.push(Reply::tool_calls(vec![
        Call::new(tool, arguments).with_id("call_p")
    ]));
    gw.model.push(Reply::text("done"));
    let body = create_ok(gw, key, json!({"model": "mock", "input": "go"})).await;
    let seen = tool_result(&gw.model.requests()[1], "call_p");
    (body, seen)
}

#[tokio::test]
async fn a_redirect_loop_is_not_followed_the_tool_is_hit_once_and_the_model_sees_an_error() {
    let (gw, tenant) = gateway_with_tools(&["redirect_loop"]).await;

    let (body, seen) = one_round(&gw, &tenant.key, "redirect_loop", json!({})).await;

    assert_eq!(body["status"], "completed", "{body:#}");
    let call = &items_of(&body, "mcp_call")[0];
    assert_eq!(call["status"], "failed", "{call:#}");
    assert!(seen.contains("302") && seen.contains("redirect"), "{seen}");
    assert_eq!(
        gw.tools
            .calls()
            .iter()
            .filter(|c| c.tool == "redirect_loop")
            .count(),
        1
    );
}

#[tokio::test]
async fn a_307_never_reposts_the_arguments_elsewhere() {
    let (gw, tenant) = gateway_with_tools(&["redirect_away"]).await;

    let (body, seen) = one_round(&gw, &tenant.key, "redirect_away", json!({})).await;

    assert_eq!(
        items_of(&body, "mcp_call")[0]["status"],
        "failed",
        "{body:#}"
    );
    assert!(seen.contains("307"), "{seen}");
    let tools: Vec<String> = gw.tools.calls().into_iter().map(|c| c.tool).collect();
    assert_eq!(
        tools,
        ["redirect_away"],
        "the redirect target was never called"
    );
}

#[tokio::test]
async fn a_10_mb_tool_answer_is_cut_to_the_default_cap_with_a_marker_and_the_response_completes() {
    let (gw, tenant) = gateway_with_tools(&["huge"]).await;
    let bytes = 10_000_000;
    // `{"blob":"xxx..."}`
    let original = bytes + r#"{"blob":""}"#.len();

    let (body, seen) = one_round(&gw, &tenant.key, "huge", json!({"bytes": bytes})).await;

    assert_eq!(body["status"], "completed", "{:#}", body["error"]);
    assert_eq!(body["output_text"], "done");
    let call = &items_of(&body, "mcp_call")[0];
    assert_eq!(call["status"], "completed");
    let output = call["output"].as_str().expect("output");
    assert!(output.len() <= 1024 * 1024, "{}", output.len());
    assert!(output.len() > 1024 * 1024 - 200, "{}", output.len());
    assert!(output.starts_with(r#"{"blob":"xxx"#));
    assert!(
        output.contains("truncated"),
        "{}",
        &output[output.len() - 200..]
    );
    assert!(output.contains(&format!("{original} bytes")));
    assert_eq!(
        seen, output,
        "the model and the client read the same cut output"
    );
    // The stored response reads back the same.
    assert_eq!(
        get_response(&gw, &tenant.key, &id_of(&body)).await.body,
        body
    );
}

#[tokio::test]
async fn a_source_s_own_output_cap_applies() {
    let (gw, tenant) = gateway().await;
    gw.attach_tool_with(&tenant.group_id, "huge", json!({"max_output_bytes": 1000}))
        .await;

    let (body, seen) = one_round(&gw, &tenant.key, "huge", json!({"bytes": 5000})).await;

    let output = items_of(&body, "mcp_call")[0]["output"]
        .as_str()
        .expect("output")
        .to_owned();
    assert!(output.len() <= 1000, "{}", output.len());
    assert!(
        output.contains("truncated") && output.contains("5011 bytes"),
        "{output}"
    );
    assert_eq!(seen, output);

    // Under the cap, the output is the tool's JSON, whole.
    let (body, _) = one_round(&gw, &tenant.key, "huge", json!({"bytes": 10})).await;
    let output = items_of(&body, "mcp_call")[0]["output"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(parse(&output), json!({"blob": "xxxxxxxxxx"}));
}

#[tokio::test]
async fn an_http_error_body_is_cut_to_the_source_s_cap_with_the_same_marker() {
    let (gw, tenant) = gateway().await;
    gw.attach_tool_with(&tenant.group_id, "huge", json!({"max_output_bytes": 1000}))
        .await;

    let (body, seen) = one_round(
        &gw,
        &tenant.key,
        "huge",
        json!({"bytes": 5000, "status": 500}),
    )
    .await;

    let call = &items_of(&body, "mcp_call")[0];
    assert_eq!(call["status"], "failed", "{call:#}");
    let message = call["error"]["message"].as_str().expect("error message");
    assert!(message.len() <= 1000, "{}", message.len());
    assert!(
        message.starts_with("Tool 'huge' answered HTTP 500: {\"blob\":\"xxx"),
        "{message}"
    );
    assert!(
        message.contains("truncated") && message.contains("5011 bytes"),
        "{message}"
    );
    assert!(
        seen.contains("truncated"),
        "the model reads the marker: {seen}"
    );
    assert!(seen.len() < 1200, "{}", seen.len());
}

#[tokio::test]
async fn the_admin_api_keeps_the_policy_fields_and_answers_defaults() {
    let (gw, tenant) = gateway().await;
    let id = gw
        .attach_tool_with(
            &tenant.group_id,
            "get_weather",
            json!({"max_in_flight": 4, "breaker_failures": 2, "note_on_request": "Weather in {city}",
                   "hosted_type": "web_search"}),
        )
        .await;
    let source = gw
        .admin_ok(Method::GET, &format!("/tool_sources/{id}"), None)
        .await;
    assert_eq!(source["max_in_flight"], 4);
    assert_eq!(source["max_output_bytes"], 1_048_576);
    assert_eq!(source["breaker_failures"], 2);
    assert_eq!(source["breaker_cooldown_ms"], 30_000);
    assert_eq!(source["note_on_request"], "Weather in {city}");
    assert_eq!(source["note_on_result"], Value::Null);
    assert_eq!(source["hosted_type"], "web_search");

    let changed = gw
        .admin_ok(
            Method::PATCH,
            &format!("/tool_sources/{id}"),
            Some(
                json!({"max_in_flight": null, "max_output_bytes": 4096, "note_on_request": null,
                        "note_on_result": "Got {temperature_c} degrees"}),
            ),
        )
        .await;
    assert_eq!(changed["max_in_flight"], Value::Null);
    assert_eq!(changed["max_output_bytes"], 4096);
    assert_eq!(changed["breaker_failures"], 2, "untouched fields stay");
    assert_eq!(changed["note_on_request"], Value::Null);
    assert_eq!(changed["note_on_result"], "Got {temperature_c} degrees");
}

#[tokio::test]
async fn bad_policy_values_are_refused_with_their_param_and_nothing_changes() {
    let (gw, tenant) = gateway().await;
    let id = gw.attach_tool(&tenant.group_id, "add").await;
    let definition = gateway_testkit::tool_definitions()
        .into_iter()
        .find(|d| d.name == "add")
        .unwrap();
    let cases = [
        ("max_in_flight", json!(0)),
        ("max_in_flight", json!(-3)),
        ("max_in_flight", json!("four")),
        ("max_output_bytes", json!(10)),
        ("max_output_bytes", json!(1_000_000_000_000_i64)),
        ("breaker_failures", json!(0)),
        ("breaker_cooldown_ms", json!(0)),
        ("breaker_cooldown_ms", json!(3_600_001)),
        ("note_on_request", json!("{unclosed")),
        ("note_on_result", json!("")),
        ("hosted_type", json!("teleport")),
    ];
    for (param, value) in cases {
        let mut body = json!({"name": "other", "description": "d", "parameters": definition.parameters,
                              "url": gw.tools.url("add")});
        body[param] = value.clone();
        let created = gw
            .call(gw.admin(Method::POST, "/tool_sources").json(&body))
            .await;
        assert_eq!(
            created.status.as_u16(),
            400,
            "{param}={value}: {:#}",
            created.body
        );
        // A wrong JSON type is refused by the body parser, which may not name the field.
        if !value.is_string() || param.starts_with("note") || param == "hosted_type" {
            assert_eq!(created.body["error"]["param"], param, "{param}={value}");
        }
        let patched = gw
            .call(
                gw.admin(Method::PATCH, &format!("/tool_sources/{id}"))
                    .json(&json!({param: value})),
            )
            .await;
        assert_eq!(
            patched.status.as_u16(),
            400,
            "{param}={value}: {:#}",
            patched.body
        );
    }
    let sources = gw.admin_ok(Method::GET, "/tool_sources", None).await;
    assert_eq!(
        sources["data"].as_array().unwrap().len(),
        1,
        "nothing half-stored"
    );
    assert_eq!(sources["data"][0]["max_in_flight"], Value::Null);
}

#[tokio::test]
async fn a_source_s_in_flight_bound_makes_further_calls_wait_for_a_slot() {
    let (gw, tenant) = gateway().await;
    gw.attach_tool_with(&tenant.group_id, "gate", json!({"max_in_flight": 2}))
        .await;
    gw.model.push(Reply::tool_calls(vec![
        Call::new("gate", json!({})),
        Call::new("gate", json!({})),
        Call::new("gate", json!({})),
    ]));
    gw.model.push(Reply::text("all three passed"));
    let request = gw
        .public(Method::POST, "/responses", &tenant.key)
        .json(&json!({"model": "mock", "input": "go"}));
    let created = tokio::spawn(request.send());

    // Two calls reach the tool and block there; the third waits in the gateway for a slot.
    gw.tools
        .wait_for_calls("gate", 2, std::time::Duration::from_secs(10))
        .await
        .expect("two gate calls");
    let waiting = async {
        loop {
            let text = metrics_text(&gw).await;
            if sample(&text, "gateway_tool_calls_waiting", &["tool=\"gate\""]) == 1.0 {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), waiting)
        .await
        .expect("the third call waits for a slot");
    assert_eq!(
        gw.tools.calls().len(),
        2,
        "the third call has not been sent"
    );

    gw.tools.open_gate();
    let body: Value = created
        .await
        .expect("task")
        .expect("create")
        .json()
        .await
        .expect("body");
    assert_eq!(body["status"], "completed", "{body:#}");
    let calls = items_of(&body, "mcp_call");
    assert_eq!(calls.len(), 3);
    assert!(calls.iter().all(|c| c["status"] == "completed"), "{body:#}");
    assert_eq!(gw.tools.calls().len(), 3);
    assert_eq!(gw.tools.max_in_flight(), 2, "never more than two at once");
}

#[tokio::test]
async fn after_consecutive_failures_the_breaker_fails_calls_fast_without_calling_the_tool() {
    let (gw, tenant) = gateway().await;
    gw.attach_tool_with(
        &tenant.group_id,
        "fail",
        json!({"breaker_failures": 2, "breaker_cooldown_ms": 3_600_000}),
    )
    .await;

    for round in 0..2 {
        let (body, seen) = one_round(&gw, &tenant.key, "fail", json!({})).await;
        assert_eq!(
            items_of(&body, "mcp_call")[0]["status"],
            "failed",
            "{body:#}"
        );
        assert!(seen.contains("500"), "round {round}: {seen}");
        gw.model.reset();
    }
    assert_eq!(gw.tools.calls().len(), 2);
    let text = metrics_text(&gw).await;
    assert_eq!(
        sample(&text, "gateway_tool_breaker_open", &["tool=\"fail\""]),
        1.0
    );

    let (body, seen) = one_round(&gw, &tenant.key, "fail", json!({})).await;

    assert_eq!(body["status"], "completed", "{body:#}");
    assert_eq!(items_of(&body, "mcp_call")[0]["status"], "failed");
    assert!(seen.contains("circuit breaker"), "{seen}");
    assert_eq!(
        gw.tools.calls().len(),
        2,
        "the open breaker did not call the tool"
    );
    let text = metrics_text(&gw).await;
    assert_eq!(
        sample(
            &text,
            "gateway_tool_calls_total",
            &["tool=\"fail\"", "outcome=\"breaker_open\""]
        ),
        1.0
    );
}

#[tokio::test]
async fn a_breaker_trial_whose_response_was_cancelled_leaves_the_next_call_the_trial() {
    let (gw, tenant) = gateway().await;
    // One failure opens the breaker for a millisecond; a call held at the gate for 300 ms fails (a timeout).
    gw.attach_tool_with(
        &tenant.group_id,
        "gate",
        json!({"timeout_ms": 300, "breaker_failures": 1, "breaker_cooldown_ms": 1}),
    )
    .await;
    let call_gate = json!({"model": "mock", "input": "!call gate {}"});
    let timed_out = create_ok(&gw, &tenant.key, call_gate.clone()).await;
    assert_eq!(
        items_of(&timed_out, "mcp_call")[0]["status"],
        "failed",
        "{timed_out:#}"
    );
    assert_eq!(
        sample(
            &metrics_text(&gw).await,
            "gateway_tool_breaker_open",
            &["tool=\"gate\""]
        ),
        1.0
    );

    // The cool-down is over: a background response's call is the trial; it is held at the gate, and the response
    // cancelled, so the trial never ends with a result.
    let mut background = call_gate.clone();
    background["background"] = json!(true);
    let trial = create_ok(&gw, &tenant.key, background).await;
    let patience = std::time::Duration::from_secs(10);
    gw.tools
        .wait_for_calls("gate", 2, patience)
        .await
        .expect("the trial call reached the tool");
    let cancelled = cancel(&gw, &tenant.key, &id_of(&trial)).await;
    assert_eq!(
        cancelled.body["status"], "cancelled",
        "{:#}",
        cancelled.body
    );

    // Once the trial's call is dropped, the next call is the trial, reaches the tool and closes the breaker.
    gw.tools.open_gate();
    let reached = async {
        loop {
            let body = create_ok(&gw, &tenant.key, call_gate.clone()).await;
            if items_of(&body, "mcp_call")[0]["status"] == "completed" {
                return;
            }
        }
    };
    tokio::time::timeout(patience, reached)
        .await
        .expect("a call reached the tool after the abandoned trial");
    assert_eq!(gw.tools.calls().len(), 3);
    assert_eq!(
        sample(
            &metrics_text(&gw).await,
            "gateway_tool_breaker_open",
            &["tool=\"gate\""]
        ),
        0.0
    );
}

#[tokio::test]
async fn a_call_waiting_for_a_slot_whose_response_is_cancelled_stops_counting_as_waiting() {
    let (gw, tenant) = gateway().await;
    gw.attach_tool_with(&tenant.group_id, "gate", json!({"max_in_flight": 1}))
        .await;
    let background = json!({"model": "mock", "input": "!call gate {}", "background": true});
    // The first holds the one slot at the gate; the second's call waits for it.
    create_ok(&gw, &tenant.key, background.clone()).await;
    let patience = std::time::Duration::from_secs(10);
    gw.tools
        .wait_for_calls("gate", 1, patience)
        .await
        .expect("the first call holds the slot");
    let second = create_ok(&gw, &tenant.key, background).await;
    let gw = &gw;
    let waiting = |expected: f64| async move {
        loop {
            let text = metrics_text(gw).await;
            if sample(&text, "gateway_tool_calls_waiting", &["tool=\"gate\""]) == expected {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(patience, waiting(1.0))
        .await
        .expect("the second call waits for the slot");

    let cancelled = cancel(gw, &tenant.key, &id_of(&second)).await;
    assert_eq!(
        cancelled.body["status"], "cancelled",
        "{:#}",
        cancelled.body
    );
    tokio::time::timeout(patience, waiting(0.0))
        .await
        .expect("the cancelled call no longer counts as waiting");
    gw.tools.open_gate();
}
