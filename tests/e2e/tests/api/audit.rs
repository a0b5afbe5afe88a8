//! The tool-call audit (admin): a response's tool calls as canonical records, and a project's, paginated.

use crate::common::*;
use gateway_testkit::{Call, Reply};
use reqwest::Method;
use serde_json::{json, Value};

fn lookup_tool() -> Value {
    json!({"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {"word": {"type": "string"}}}})
}

#[tokio::test]
async fn a_responses_tool_calls_show_status_attempts_timings_and_idempotency_keys() {
    let (gw, tenant) = gateway_with_tools(&["add", "fail"]).await;
    gw.model.push(Reply::tool_calls(vec![
        Call::new("add", json!({"a": 1, "b": 2})).with_id("call_add"),
        Call::new("fail", json!({})).with_id("call_fail"),
    ]));
    gw.model.push(Reply::tool_calls(vec![Call::new(
        "lookup",
        json!({"word": "x"}),
    )
    .with_id("call_lookup")]));
    let body = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "go", "tools": [lookup_tool()]}),
    )
    .await;
    let id = id_of(&body);

    let audit = gw
        .admin_ok(Method::GET, &format!("/responses/{id}/tool_calls"), None)
        .await;

    let data = audit["data"].as_array().unwrap();
    let summary: Vec<(&str, &str, &str, &str)> = data
        .iter()
        .map(|r| {
            (
                r["call_id"].as_str().unwrap(),
                r["name"].as_str().unwrap(),
                r["status"].as_str().unwrap(),
                r["runner"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("call_add", "add", "completed", "server"),
            ("call_fail", "fail", "failed", "server"),
            ("call_lookup", "lookup", "handed_back", "client"),
        ],
        "{audit:#}"
    );
    let add = &data[0];
    assert_eq!(add["result"], "{\"sum\":3}");
    assert_eq!(add["arguments"], "{\"a\":1,\"b\":2}");
    assert_eq!(add["attempts"], 1);
    assert_eq!(add["response_id"], id.as_str());
    assert_eq!(add["model"], "mock");
    assert!(
        add["duration_ms"].as_i64().is_some_and(|d| d >= 0),
        "{add:#}"
    );
    // The key the tool source received.
    let received: Vec<String> = gw
        .tools
        .calls()
        .into_iter()
        .filter(|c| c.tool == "add")
        .filter_map(|c| c.header("idempotency-key").map(str::to_owned))
        .collect();
    assert_eq!(
        received,
        [add["idempotency_key"].as_str().unwrap().to_owned()]
    );
    assert_eq!(data[2]["idempotency_key"], Value::Null);
    assert_eq!(data[2]["completed"], false);

    let missing = gw
        .call(gw.admin(Method::GET, "/responses/resp_nope/tool_calls"))
        .await;
    assert_error(&missing, 404, None, None);
}

#[tokio::test]
async fn a_projects_tool_calls_are_paged_by_response() {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;
    for n in 0..3 {
        gw.model.push(Reply::tool_calls(vec![Call::new(
            "add",
            json!({"a": n, "b": 0}),
        )
        .with_id(&format!("call_{n}"))]));
        gw.model.push(Reply::text("ok"));
        create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "go"})).await;
    }
    let base = format!("/projects/{}/tool_calls", tenant.project_id);

    let first = gw
        .admin_ok(Method::GET, &format!("{base}?limit=2"), None)
        .await;
    assert_eq!(first["has_more"], true, "{first:#}");
    let after = first["next_after"].as_str().unwrap();
    let second = gw
        .admin_ok(Method::GET, &format!("{base}?limit=2&after={after}"), None)
        .await;
    assert_eq!(second["has_more"], false, "{second:#}");

    let mut call_ids: Vec<String> = [&first, &second]
        .iter()
        .flat_map(|page| page["data"].as_array().unwrap().clone())
        .map(|r| r["call_id"].as_str().unwrap().to_owned())
        .collect();
    call_ids.sort();
    assert_eq!(call_ids, ["call_0", "call_1", "call_2"]);

    let empty = gw
        .admin_ok(Method::GET, &format!("{base}?since=0&until=1"), None)
        .await;
    assert_eq!(empty["data"], json!([]));
    let bad = gw
        .call(gw.admin(Method::GET, &format!("{base}?limit=0")))
        .await;
    assert_error(&bad, 400, Some("limit"), Some("invalid_value"));
    let unknown = gw
        .call(gw.admin(Method::GET, "/projects/proj_nope/tool_calls"))
        .await;
    assert_error(&unknown, 404, None, None);
}
