//! MCP tool sources (SPEC 2, 7): discovery with `tools/list`, calls with `tools/call`, errors, list changes and a
//! server that goes down, against the testkit's MCP server (rmcp's server side) over real HTTP.

use crate::common::*;
use gateway_e2e::{items_of, TestGateway};
use gateway_testkit::{Call, McpServer, Reply};
use reqwest::Method;
use serde_json::{json, Value};

/// Registers `mcp` as an MCP source named `calc` (with `extra` fields) and attaches it to the tenant's group.
async fn attach_mcp(gw: &TestGateway, group_id: &str, mcp: &McpServer, extra: Value) -> String {
    let mut body = json!({"kind": "mcp", "name": "calc", "url": mcp.url(), "secret": "mcp-secret"});
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    let source = gw.admin_ok(Method::POST, "/tool_sources", Some(body)).await;
    let id = id_of(&source);
    gw.admin_ok(
        Method::PUT,
        &format!("/deployment_groups/{group_id}/tool_sources/{id}"),
        None,
    )
    .await;
    id
}

/// One round: the model calls `tool` with `arguments`, then answers; the response and what the model saw.
async fn round(gw: &TestGateway, key: &str, tool: &str, arguments: Value) -> (Value, String) {
    gw.model.reset();
    gw.model.push(Reply::tool_calls(vec![
        Call::new(tool, arguments).with_id("call_m")
    ]));
    gw.model.push(Reply::text("done"));
    let body = create_ok(gw, key, json!({"model": "mock", "input": "go"})).await;
    let seen = tool_result(&gw.model.requests()[1], "call_m");
    (body, seen)
}

#[tokio::test]
async fn an_mcp_source_s_tools_are_discovered_prefixed_and_called_over_one_reused_session() {
    let (gw, tenant) = gateway().await;
    let mcp = McpServer::start().await.expect("mcp server");
    let source = attach_mcp(&gw, &tenant.group_id, &mcp, json!({"name_prefix": "calc_"})).await;
    let shown = gw
        .admin_ok(Method::GET, &format!("/tool_sources/{source}"), None)
        .await;
    assert_eq!(shown["kind"], "mcp");
    assert_eq!(shown["name_prefix"], "calc_");
    assert_eq!(shown["has_secret"], true);

    let (body, seen) = round(&gw, &tenant.key, "calc_add", json!({"a": 2, "b": 3})).await;

    assert_eq!(body["status"], "completed", "{body:#}");
    let mut offered = offered_tools(&gw.model.requests()[0]);
    offered.sort();
    assert_eq!(offered, ["calc_add", "calc_fail", "calc_hang"]);
    let call = &items_of(&body, "mcp_call")[0];
    assert_eq!(call["name"], "calc_add");
    assert_eq!(call["server_label"], "calc", "the source's name");
    assert_eq!(call["status"], "completed");
    assert_eq!(parse(call["output"].as_str().unwrap()), json!({"sum": 5}));
    assert_eq!(parse(&seen), json!({"sum": 5}));
    assert_eq!(mcp.calls(), [("add".to_owned(), json!({"a": 2, "b": 3}))]);
    assert!(
        mcp.authorizations()
            .iter()
            .all(|a| a == "Bearer mcp-secret")
            && !mcp.authorizations().is_empty(),
        "{:?}",
        mcp.authorizations()
    );

    // A second response reuses the session and the cached list.
    round(&gw, &tenant.key, "calc_add", json!({"a": 1, "b": 1})).await;
    assert_eq!(mcp.calls().len(), 2);
    assert_eq!(mcp.sessions(), 1, "one initialize for both responses");
    assert_eq!(mcp.lists(), 1, "the tool list was cached");
    // The stored response reads back the same.
    assert_eq!(
        get_response(&gw, &tenant.key, &id_of(&body)).await.body,
        body
    );
}

#[tokio::test]
async fn allowed_tools_limit_what_the_model_is_offered() {
    let (gw, tenant) = gateway().await;
    let mcp = McpServer::start().await.expect("mcp server");
    attach_mcp(
        &gw,
        &tenant.group_id,
        &mcp,
        json!({"allowed_tools": ["add"]}),
    )
    .await;
    gw.model.push(Reply::text("hi"));

    create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "hi"})).await;

    assert_eq!(offered_tools(&gw.model.requests()[0]), ["add"]);
}

#[tokio::test]
async fn an_mcp_result_with_is_error_is_an_error_output_the_model_sees() {
    let (gw, tenant) = gateway().await;
    let mcp = McpServer::start().await.expect("mcp server");
    attach_mcp(&gw, &tenant.group_id, &mcp, json!({})).await;

    let (body, seen) = round(&gw, &tenant.key, "fail", json!({})).await;

    assert_eq!(body["status"], "completed", "{body:#}");
    let call = &items_of(&body, "mcp_call")[0];
    assert_eq!(call["status"], "failed", "{call:#}");
    assert!(seen.contains("failed on purpose"), "{seen}");
}

#[tokio::test]
async fn a_tool_list_change_is_picked_up_without_a_restart() {
    let (gw, tenant) = gateway().await;
    let mcp = McpServer::start().await.expect("mcp server");
    attach_mcp(&gw, &tenant.group_id, &mcp, json!({})).await;
    gw.model.push(Reply::text("before"));
    create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "hi"})).await;
    assert!(!offered_tools(&gw.model.requests()[0]).contains(&"late".to_owned()));

    mcp.add_late_tool().await;

    // The notification reaches the gateway asynchronously: ask until the next listing shows the new tool.
    let picked_up = async {
        loop {
            gw.model.reset();
            gw.model.push(Reply::text("after"));
            create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "hi"})).await;
            if offered_tools(&gw.model.requests()[0]).contains(&"late".to_owned()) {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), picked_up)
        .await
        .expect("the late tool is offered after list_changed, well before the 60 s TTL");
    let (body, seen) = round(&gw, &tenant.key, "late", json!({})).await;
    assert_eq!(items_of(&body, "mcp_call")[0]["status"], "completed");
    assert_eq!(seen, "late");
}

#[tokio::test]
async fn a_server_that_goes_down_gives_error_outputs_and_never_a_5xx() {
    let (gw, tenant) = gateway().await;
    let mcp = McpServer::start().await.expect("mcp server");
    attach_mcp(&gw, &tenant.group_id, &mcp, json!({})).await;
    let (body, _) = round(&gw, &tenant.key, "add", json!({"a": 1, "b": 2})).await;
    assert_eq!(items_of(&body, "mcp_call")[0]["status"], "completed");

    mcp.stop();

    // The cached list still offers the tool; its call fails as an output the model reads.
    let (body, seen) = round(&gw, &tenant.key, "add", json!({"a": 1, "b": 2})).await;
    assert_eq!(body["status"], "completed", "{body:#}");
    assert_eq!(
        items_of(&body, "mcp_call")[0]["status"],
        "failed",
        "{body:#}"
    );
    assert!(seen.contains("error"), "{seen}");
    // With the session gone, the list cannot be read: the model is offered the tools last listed, and the
    // request still succeeds.
    gw.model.reset();
    gw.model.push(Reply::text("no tools"));
    let answer = gw
        .create(&tenant.key, json!({"model": "mock", "input": "hi"}))
        .await;
    assert_eq!(answer.status.as_u16(), 200, "{:#}", answer.body);
    let mut offered = offered_tools(&gw.model.requests()[0]);
    offered.sort();
    assert_eq!(offered, ["add", "fail", "hang"]);
}

#[tokio::test]
async fn a_stopped_source_s_tool_stays_a_server_tool_whose_calls_fail_and_is_never_handed_to_the_client(
) {
    let (gw, tenant) = gateway().await;
    let mcp = McpServer::start().await.expect("mcp server");
    attach_mcp(&gw, &tenant.group_id, &mcp, json!({"name_prefix": "calc_"})).await;
    let (body, _) = round(&gw, &tenant.key, "calc_add", json!({"a": 1, "b": 2})).await;
    assert_eq!(items_of(&body, "mcp_call")[0]["status"], "completed");

    mcp.stop();

    // The first request after the stop fails its call on the dead session; the later ones cannot even list.
    for attempt in 2..=3 {
        let (body, seen) = round(&gw, &tenant.key, "calc_add", json!({"a": 1, "b": 2})).await;
        assert_eq!(body["status"], "completed", "request {attempt}: {body:#}");
        assert!(
            items_of(&body, "function_call").is_empty(),
            "request {attempt}: a server tool is never handed to the client: {body:#}"
        );
        let call = &items_of(&body, "mcp_call")[0];
        assert_eq!(call["name"], "calc_add");
        assert_eq!(call["status"], "failed", "request {attempt}: {call:#}");
        assert!(
            seen.contains("error"),
            "request {attempt}: the model sees an error output: {seen}"
        );
    }
}

#[tokio::test]
async fn bad_mcp_source_fields_are_refused_with_their_param() {
    let (gw, _tenant) = gateway().await;
    let cases = [
        (
            json!({"kind": "ftp", "name": "x", "url": "http://127.0.0.1:9/mcp"}),
            "kind",
        ),
        (
            json!({"kind": "mcp", "name": "x", "url": "http://127.0.0.1:9/mcp", "name_prefix": "bad prefix"}),
            "name_prefix",
        ),
        (
            json!({"kind": "mcp", "name": "x", "url": "http://127.0.0.1:9/mcp", "allowed_tools": [""]}),
            "allowed_tools",
        ),
        (
            json!({"name": "x", "url": "http://127.0.0.1:9/t", "parameters": {"type": "object"}, "name_prefix": "p_"}),
            "name_prefix",
        ),
        (json!({"kind": "mcp", "name": "x"}), "url"),
    ];
    for (body, param) in cases {
        let answer = gw
            .call(gw.admin(Method::POST, "/tool_sources").json(&body))
            .await;
        assert_eq!(answer.status.as_u16(), 400, "{body}: {:#}", answer.body);
        assert_eq!(answer.body["error"]["param"], param, "{body}");
    }
    let sources = gw.admin_ok(Method::GET, "/tool_sources", None).await;
    assert!(sources["data"].as_array().unwrap().is_empty());
}

#[tokio::test]
async fn a_source_whose_tool_names_clash_with_another_visible_source_is_refused_with_409() {
    let (gw, tenant) = gateway().await;
    let mcp = McpServer::start().await.expect("mcp server");
    gw.attach_tool(&tenant.group_id, "add").await;
    let source = gw
        .admin_ok(
            Method::POST,
            "/tool_sources",
            Some(json!({"kind": "mcp", "name": "calc", "url": mcp.url()})),
        )
        .await;
    let attach = |id: String| {
        gw.admin(
            Method::PUT,
            &format!("/deployment_groups/{}/tool_sources/{id}", tenant.group_id),
        )
    };

    let refused = gw.call(attach(id_of(&source))).await;

    assert_eq!(refused.status.as_u16(), 409, "{:#}", refused.body);
    let message = refused.body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("'add'") && message.contains("'calc'"),
        "{message}"
    );
    let group = gw
        .admin_ok(
            Method::GET,
            &format!("/deployment_groups/{}", tenant.group_id),
            None,
        )
        .await;
    assert_eq!(
        group["tool_source_ids"].as_array().unwrap().len(),
        1,
        "not attached"
    );

    // With a prefix, its names no longer clash.
    gw.admin_ok(
        Method::PATCH,
        &format!("/tool_sources/{}", id_of(&source)),
        Some(json!({"name_prefix": "calc_"})),
    )
    .await;
    let attached = gw.call(attach(id_of(&source))).await;
    assert_eq!(attached.status.as_u16(), 200, "{:#}", attached.body);
}

/// The idempotency key of each tool step of `response_id`, by call id, as the audit shows it (the key an HTTP
/// source receives as `Idempotency-Key`).
pub(crate) async fn step_keys(gw: &TestGateway, response_id: &str) -> Vec<(String, String)> {
    let audit = gw
        .admin_ok(
            Method::GET,
            &format!("/responses/{response_id}/tool_calls"),
            None,
        )
        .await;
    audit["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|row| {
            Some((
                row["call_id"].as_str()?.to_owned(),
                row["idempotency_key"].as_str()?.to_owned(),
            ))
        })
        .collect()
}

#[tokio::test]
async fn an_mcp_call_carries_its_step_s_idempotency_key_as_an_http_tool_gets_it() {
    let (gw, tenant) = gateway().await;
    let mcp = McpServer::start().await.expect("mcp server");
    attach_mcp(&gw, &tenant.group_id, &mcp, json!({"name_prefix": "calc_"})).await;
    gw.attach_tool(&tenant.group_id, "add").await;
    gw.model.push(Reply::tool_calls(vec![
        Call::new("calc_add", json!({"a": 1, "b": 2})).with_id("call_mcp"),
        Call::new("add", json!({"a": 1, "b": 2})).with_id("call_http"),
    ]));
    gw.model.push(Reply::text("done"));

    let body = create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "go"})).await;

    assert_eq!(body["status"], "completed", "{body:#}");
    let keys = step_keys(&gw, &id_of(&body)).await;
    let key_of = |call_id: &str| {
        keys.iter()
            .find(|(id, _)| id == call_id)
            .map(|(_, key)| key.clone())
            .unwrap_or_default()
    };
    let http_received: Vec<String> = gw
        .tools
        .calls()
        .into_iter()
        .filter_map(|c| c.header("idempotency-key").map(str::to_owned))
        .collect();
    assert_eq!(http_received, [key_of("call_http")], "{keys:?}");
    let metas = mcp.call_metas();
    assert_eq!(metas.len(), 1, "{metas:?}");
    assert_eq!(
        metas[0]["idempotencyKey"],
        key_of("call_mcp"),
        "the MCP call carries its step's key: {metas:?}"
    );
    assert_ne!(key_of("call_mcp"), key_of("call_http"), "one key per step");
}

#[tokio::test]
async fn an_is_error_result_is_cut_to_the_source_s_cap_with_the_same_marker() {
    let (gw, tenant) = gateway().await;
    let mcp = McpServer::start().await.expect("mcp server");
    attach_mcp(
        &gw,
        &tenant.group_id,
        &mcp,
        json!({"max_output_bytes": 1000}),
    )
    .await;

    let (body, seen) = round(&gw, &tenant.key, "fail", json!({"bytes": 5000})).await;

    let call = &items_of(&body, "mcp_call")[0];
    assert_eq!(call["status"], "failed", "{call:#}");
    let message = call["error"]["content"][0]["text"]
        .as_str()
        .expect("error text");
    assert!(message.len() <= 1000, "{}", message.len());
    assert!(message.starts_with("xxx"), "{message}");
    assert!(
        message.contains("truncated") && message.contains("5000 bytes"),
        "{message}"
    );
    assert!(
        seen.contains("truncated"),
        "the model reads the marker: {seen}"
    );
}

/// rmcp reads at most 16 MiB of one answer by default, and refuses a longer one whole: a source whose cap is past
/// half of that gets a bound that fits it, so its output is cut to the cap like any other, not refused.
#[tokio::test]
async fn an_answer_past_16_mib_from_a_source_with_a_larger_cap_is_cut_to_the_cap() {
    let (gw, tenant) = gateway().await;
    let mcp = McpServer::start().await.expect("mcp server");
    let cap = 9 * 1024 * 1024;
    let sent = 17 * 1024 * 1024;
    attach_mcp(
        &gw,
        &tenant.group_id,
        &mcp,
        json!({"max_output_bytes": cap}),
    )
    .await;

    let (body, seen) = round(&gw, &tenant.key, "fail", json!({"bytes": sent})).await;

    let call = &items_of(&body, "mcp_call")[0];
    let message = call["error"]["content"][0]["text"]
        .as_str()
        .expect("error text");
    assert!(message.len() <= cap, "{}", message.len());
    assert!(message.len() > cap - 1024, "{}", message.len());
    assert!(message.starts_with("xxx"), "{}", &message[..100]);
    assert!(
        message.contains(&format!("the tool's output was {sent} bytes")),
        "{}",
        &message[message.len() - 200..]
    );
    assert!(seen.contains("truncated"), "the model reads the marker");
}

/// Past the bound, rmcp refuses the answer and closes its session: the call fails with an error output (the
/// response still completes), and the next call is answered over a new session.
#[tokio::test]
async fn an_answer_past_what_the_gateway_reads_fails_the_call_and_the_next_call_opens_a_new_session(
) {
    let (gw, tenant) = gateway().await;
    let mcp = McpServer::start().await.expect("mcp server");
    attach_mcp(&gw, &tenant.group_id, &mcp, json!({})).await;

    let (body, seen) = round(&gw, &tenant.key, "fail", json!({"bytes": 17 * 1024 * 1024})).await;

    assert_eq!(body["status"], "completed", "{}", body["status"]);
    let call = &items_of(&body, "mcp_call")[0];
    assert_eq!(call["status"], "failed", "{}", call["status"]);
    assert_eq!(
        seen,
        r#"{"error":{"message":"Tool 'fail' (MCP server 'calc') could not be called."}}"#
    );
    assert_eq!(mcp.sessions(), 1);

    let (body, seen) = round(&gw, &tenant.key, "add", json!({"a": 2, "b": 3})).await;
    assert_eq!(body["status"], "completed", "{body:#}");
    assert_eq!(seen, r#"{"sum":5}"#);
    assert_eq!(mcp.sessions(), 2, "a new session for the next call");
}

/// The session is opened for its answer bound: a cap that moves the bound opens a new one at the next call, a
/// cap whose bound is the same (anything up to 7.5 MiB is bounded at 16 MiB) keeps the session.
#[tokio::test]
async fn a_new_cap_opens_a_new_session_only_when_it_moves_the_answer_bound() {
    let (gw, tenant) = gateway().await;
    let mcp = McpServer::start().await.expect("mcp server");
    let source = attach_mcp(&gw, &tenant.group_id, &mcp, json!({})).await;
    async fn add(gw: &TestGateway, key: &str) {
        let (body, seen) = round(gw, key, "add", json!({"a": 2, "b": 3})).await;
        assert_eq!(body["status"], "completed", "{body:#}");
        assert_eq!(seen, r#"{"sum":5}"#);
    }
    add(&gw, &tenant.key).await;
    assert_eq!(mcp.sessions(), 1);

    // 4 MiB is bounded at 16 MiB, as the default 1 MiB was; 9 MiB at 19 MiB.
    for (mib, sessions) in [(4, 1), (9, 2)] {
        gw.admin_ok(
            Method::PATCH,
            &format!("/tool_sources/{source}"),
            Some(json!({"max_output_bytes": mib * 1024 * 1024})),
        )
        .await;
        add(&gw, &tenant.key).await;
        assert_eq!(mcp.sessions(), sessions, "after a cap of {mib} MiB");
    }
}

#[tokio::test]
async fn a_listing_past_the_tool_limit_offers_nothing_and_the_request_still_succeeds() {
    let (gw, tenant) = gateway().await;
    let mcp = McpServer::start().await.expect("mcp server");
    mcp.list_extra_tools(1_000, 10);
    attach_mcp(&gw, &tenant.group_id, &mcp, json!({})).await;
    gw.model.push(Reply::text("no tools"));

    let answer = gw
        .create(&tenant.key, json!({"model": "mock", "input": "hi"}))
        .await;

    assert_eq!(answer.status.as_u16(), 200, "{:#}", answer.body);
    assert!(
        offered_tools(&gw.model.requests()[0]).is_empty(),
        "1003 tools are over the limit of 1000"
    );
}

#[tokio::test]
async fn a_server_that_never_answers_holds_up_only_its_own_source() {
    // Opening a session may take a minute: the hung server's open lasts the whole test.
    let gw = TestGateway::start_with(|c| c.tools.mcp_connect_timeout_ms = 60_000).await;
    let (hung_tenant, healthy_tenant) = (gw.tenant("hung").await, gw.tenant("healthy").await);
    // A server that takes connections and, once it holds them, never answers a byte; until then it closes them
    // at once (so that attaching the source, which lists its tools, finds it down rather than waiting).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("listener");
    let address = listener.local_addr().expect("address");
    let holding = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (accepted, mut connected) = tokio::sync::mpsc::unbounded_channel();
    let holder = tokio::spawn({
        let holding = std::sync::Arc::clone(&holding);
        async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                if holding.load(std::sync::atomic::Ordering::SeqCst) {
                    held.push(socket);
                    let _ = accepted.send(());
                }
            }
        }
    });
    // The hung source in a group of its own, which only the first project is granted.
    let group = gw
        .admin_ok(
            Method::POST,
            "/deployment_groups",
            Some(json!({"name": "hung"})),
        )
        .await;
    let group_id = id_of(&group);
    let hung = json!({"kind": "mcp", "name": "hung", "url": format!("http://{address}/mcp")});
    let source = gw.admin_ok(Method::POST, "/tool_sources", Some(hung)).await;
    for member in [
        format!("deployments/{}", hung_tenant.deployment_id),
        format!("projects/{}", hung_tenant.project_id),
        format!("tool_sources/{}", id_of(&source)),
    ] {
        gw.admin_ok(
            Method::PUT,
            &format!("/deployment_groups/{group_id}/{member}"),
            None,
        )
        .await;
    }
    let mcp = McpServer::start().await.expect("mcp server");
    attach_mcp(&gw, &healthy_tenant.group_id, &mcp, json!({})).await;
    let (body, _) = round(&gw, &healthy_tenant.key, "add", json!({"a": 1, "b": 2})).await;
    assert_eq!(items_of(&body, "mcp_call")[0]["status"], "completed");

    holding.store(true, std::sync::atomic::Ordering::SeqCst);
    // A create of the hung source's project waits for its session to open...
    let waiting = {
        let request = gw
            .public(Method::POST, "/responses", &hung_tenant.key)
            .json(&json!({"model": "mock", "input": "hi"}));
        tokio::spawn(request.send())
    };
    connected
        .recv()
        .await
        .expect("the session's open reached the server");

    // ...while the healthy source's calls and listings go on.
    let (body, seen) = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        round(&gw, &healthy_tenant.key, "add", json!({"a": 2, "b": 3})),
    )
    .await
    .expect("the healthy source is not held up by the hung one");
    assert_eq!(items_of(&body, "mcp_call")[0]["status"], "completed");
    assert!(seen.contains('5'), "{seen}");
    assert!(!waiting.is_finished(), "the hung source's open still waits");
    waiting.abort();
    holder.abort();
}
