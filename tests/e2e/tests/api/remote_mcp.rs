//! MCP servers that a request names itself (SPEC 12): the operator's allow-list and the address check, the listing
//! kept in the chain, calls with `require_approval: never`, approval requests approved and denied, and the stream,
//! against the testkit's MCP server over real HTTP.

use crate::common::sse::{assert_replay_equals_stream, check_stream, post_stream};
use crate::common::*;
use gateway_e2e::{items_of, Tenant, TestGateway};
use gateway_testkit::{Call, McpServer, Reply};
use serde_json::{json, Value};

/// A gateway whose private allow-list names the MCP server's own host and port (loopback, so only that list
/// admits it), with one tenant.
async fn gateway_allowing(mcp: &McpServer) -> (TestGateway, Tenant) {
    let prefix = format!("http://{}/", mcp.addr());
    let gw = TestGateway::start_with(|config| config.tools.mcp_allowed_private_urls = vec![prefix])
        .await;
    let tenant = gw.tenant("acme").await;
    (gw, tenant)
}

/// The request's `mcp` tool for the server, with `extra` settings.
fn mcp_tool(mcp: &McpServer, extra: Value) -> Value {
    let mut tool = json!({"type": "mcp", "server_label": "calc", "server_url": mcp.url(),
                          "authorization": "client-token"});
    if let (Some(tool), Some(extra)) = (tool.as_object_mut(), extra.as_object()) {
        tool.extend(extra.clone());
    }
    tool
}

fn item_types(body: &Value) -> Vec<&str> {
    body["output"]
        .as_array()
        .map(|items| items.iter().filter_map(|i| i["type"].as_str()).collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_declared_server_is_listed_once_per_chain_and_its_calls_run_without_approval() {
    let mcp = McpServer::start().await.expect("mcp server");
    let (gw, tenant) = gateway_allowing(&mcp).await;
    let tool = mcp_tool(
        &mcp,
        json!({"require_approval": "never", "allowed_tools": ["add", "fail"]}),
    );
    gw.model.push(Reply::tool_calls(vec![Call::new(
        "add",
        json!({"a": 2, "b": 3}),
    )
    .with_id("call_1")]));
    gw.model.push(Reply::text("five"));

    let first = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "add 2 and 3", "tools": [tool.clone()]}),
    )
    .await;

    assert_eq!(first["status"], "completed", "{first:#}");
    assert_eq!(
        item_types(&first),
        ["mcp_list_tools", "mcp_call", "message"]
    );
    let listing = &items_of(&first, "mcp_list_tools")[0];
    assert_eq!(listing["server_label"], "calc");
    let mut listed: Vec<&str> = listing["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    listed.sort();
    assert_eq!(
        listed,
        ["add", "fail", "hang"],
        "the listing shows every tool"
    );
    assert!(
        listing["tools"][0]["input_schema"].is_object(),
        "{listing:#}"
    );
    let mut offered = offered_tools(&gw.model.requests()[0]);
    offered.sort();
    assert_eq!(offered, ["add", "fail"], "the model sees the allowed ones");
    let call = &items_of(&first, "mcp_call")[0];
    assert_eq!(call["server_label"], "calc");
    assert_eq!(call["name"], "add");
    assert_eq!(parse(call["output"].as_str().unwrap()), json!({"sum": 5}));
    assert_eq!(
        parse(&tool_result(&gw.model.requests()[1], "call_1")),
        json!({"sum": 5})
    );
    assert_eq!(mcp.calls(), [("add".to_owned(), json!({"a": 2, "b": 3}))]);
    let keys = crate::mcp_sources::step_keys(&gw, &id_of(&first)).await;
    assert_eq!(
        mcp.call_metas()[0]["idempotencyKey"],
        keys[0].1,
        "the call carries its step's idempotency key: {keys:?}"
    );
    assert!(
        mcp.authorizations()
            .iter()
            .all(|a| a == "Bearer client-token"),
        "{:?}",
        mcp.authorizations()
    );
    let echoed = first["tools"][0].to_string();
    assert!(
        !echoed.contains("client-token"),
        "the echo keeps no credential: {echoed}"
    );
    assert_eq!(mcp.lists(), 1);

    // The chain holds the listing: the next response uses it and lists nothing.
    gw.model.push(Reply::text("still five"));
    let second = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "again", "tools": [tool],
               "previous_response_id": id_of(&first)}),
    )
    .await;
    assert_eq!(item_types(&second), ["message"], "{second:#}");
    assert_eq!(mcp.lists(), 1, "not listed again");
    let mut offered = offered_tools(&gw.model.requests()[2]);
    offered.sort();
    assert_eq!(offered, ["add", "fail"]);
}

/// The first turn of an approval round: the model calls `add`; the response hands back an approval request.
async fn approval_requested(gw: &TestGateway, key: &str, tool: &Value) -> (Value, Value) {
    gw.model.push(Reply::tool_calls(vec![Call::new(
        "add",
        json!({"a": 1, "b": 2}),
    )
    .with_id("call_a")]));
    let first = create_ok(
        gw,
        key,
        json!({"model": "mock", "input": "add 1 and 2", "tools": [tool]}),
    )
    .await;
    assert_eq!(first["status"], "completed", "{first:#}");
    assert_eq!(
        item_types(&first),
        ["mcp_list_tools", "mcp_approval_request"]
    );
    let request = items_of(&first, "mcp_approval_request")[0].clone();
    assert!(
        request["id"].as_str().unwrap().starts_with("mcpr_"),
        "{request:#}"
    );
    assert_eq!(request["server_label"], "calc");
    assert_eq!(request["name"], "add");
    assert_eq!(
        parse(request["arguments"].as_str().unwrap()),
        json!({"a": 1, "b": 2})
    );
    (first, request)
}

#[tokio::test]
async fn an_approved_call_runs_on_the_next_turn_and_names_its_request() {
    let mcp = McpServer::start().await.expect("mcp server");
    let (gw, tenant) = gateway_allowing(&mcp).await;
    let tool = mcp_tool(&mcp, json!({"require_approval": "always"}));
    let (first, request) = approval_requested(&gw, &tenant.key, &tool).await;
    assert!(mcp.calls().is_empty(), "nothing runs before the approval");

    gw.model.push(Reply::text("three"));
    let second = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "tools": [tool], "previous_response_id": id_of(&first),
               "input": [{"type": "mcp_approval_response", "approval_request_id": request["id"],
                          "approve": true}]}),
    )
    .await;

    assert_eq!(second["status"], "completed", "{second:#}");
    assert_eq!(item_types(&second), ["mcp_call", "message"], "{second:#}");
    let call = &items_of(&second, "mcp_call")[0];
    assert_eq!(call["approval_request_id"], request["id"]);
    assert_eq!(parse(call["output"].as_str().unwrap()), json!({"sum": 3}));
    assert_eq!(mcp.calls(), [("add".to_owned(), json!({"a": 1, "b": 2}))]);
    assert_eq!(mcp.lists(), 1, "the chain's listing is used");
    let model_saw = tool_result(&gw.model.requests()[1], "call_a");
    assert_eq!(parse(&model_saw), json!({"sum": 3}));

    // Answered once: a second approval of the same request is refused, and nothing runs again.
    let again = gw
        .create(
            &tenant.key,
            json!({"model": "mock", "tools": [tool], "previous_response_id": id_of(&second),
                   "input": [{"type": "mcp_approval_response", "approval_request_id": request["id"],
                              "approve": true}]}),
        )
        .await;
    assert_error(
        &again,
        400,
        Some("input[0]"),
        Some("duplicate_mcp_approval_response"),
    );
    assert_eq!(mcp.calls().len(), 1);
}

#[tokio::test]
async fn a_denied_call_never_runs_and_the_model_is_told_why() {
    let mcp = McpServer::start().await.expect("mcp server");
    let (gw, tenant) = gateway_allowing(&mcp).await;
    let tool = mcp_tool(&mcp, json!({}));
    let (first, request) = approval_requested(&gw, &tenant.key, &tool).await;

    gw.model.push(Reply::text("as you wish"));
    let second = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "tools": [tool], "previous_response_id": id_of(&first),
               "input": [{"type": "mcp_approval_response", "approval_request_id": request["id"],
                          "approve": false, "reason": "too costly"}]}),
    )
    .await;

    assert_eq!(item_types(&second), ["message"], "{second:#}");
    assert!(mcp.calls().is_empty(), "a denied call never runs");
    let model_saw = tool_result(&gw.model.requests()[1], "call_a");
    assert!(
        model_saw.contains("denied") && model_saw.contains("too costly"),
        "{model_saw}"
    );
}

#[tokio::test]
async fn an_unanswered_or_unknown_approval_is_a_precise_400() {
    let mcp = McpServer::start().await.expect("mcp server");
    let (gw, tenant) = gateway_allowing(&mcp).await;
    let tool = mcp_tool(&mcp, json!({"require_approval": "always"}));
    let (first, _) = approval_requested(&gw, &tenant.key, &tool).await;
    let before = stored_rows(&gw).await;

    let unanswered = gw
        .create(
            &tenant.key,
            json!({"model": "mock", "tools": [tool], "previous_response_id": id_of(&first),
                   "input": "and now?"}),
        )
        .await;
    assert_error(
        &unanswered,
        400,
        Some("input"),
        Some("mcp_approval_response_missing"),
    );
    let unknown = gw
        .create(
            &tenant.key,
            json!({"model": "mock", "tools": [tool], "previous_response_id": id_of(&first),
                   "input": [{"type": "mcp_approval_response", "approval_request_id": "mcpr_nope",
                              "approve": true}]}),
        )
        .await;
    assert_error(
        &unknown,
        400,
        Some("input[0]"),
        Some("mcp_approval_request_not_found"),
    );
    assert_eq!(stored_rows(&gw).await, before, "nothing stored");
    assert!(mcp.calls().is_empty());
}

#[tokio::test]
async fn a_streamed_response_shows_the_listing_and_the_call_as_openai_streams_them() {
    let mcp = McpServer::start().await.expect("mcp server");
    let (gw, tenant) = gateway_allowing(&mcp).await;
    gw.model.push(Reply::tool_calls(vec![Call::new(
        "add",
        json!({"a": 4, "b": 4}),
    )
    .with_id("call_s")]));
    gw.model.push(Reply::text("eight"));

    let events = post_stream(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "add",
               "tools": [mcp_tool(&mcp, json!({"require_approval": "never"}))]}),
    )
    .await;
    let checked = check_stream(events);

    let kinds: Vec<&str> = checked.items.iter().map(|t| t.kind.as_str()).collect();
    assert_eq!(kinds, ["mcp_list_tools", "mcp_call", "message"]);
    assert_replay_equals_stream(&gw, &tenant.key, &checked).await;
}

#[tokio::test]
async fn servers_outside_the_allow_list_or_on_private_addresses_are_refused() {
    let mcp = McpServer::start().await.expect("mcp server");
    // Any http URL, and even the server's exact URL: a prefix of `mcp_allowed_urls` admits public addresses only,
    // however much of the URL it names.
    let exact = format!("http://{}/mcp", mcp.addr());
    let gw = TestGateway::start_with(|config| {
        config.tools.mcp_allowed_urls = vec![
            "http://".into(),
            "https://mcp.example.com/".into(),
            exact.clone(),
        ]
    })
    .await;
    let tenant = gw.tenant("acme").await;
    let before = stored_rows(&gw).await;
    let refused = |url: String| {
        json!({"model": "mock", "input": "x", "tools": [
            {"type": "function", "name": "f"},
            {"type": "mcp", "server_label": "calc", "server_url": url, "require_approval": "never"}]})
    };

    let cases = [
        (
            format!("http://{}/mcp", mcp.addr()),
            "loopback address, its exact URL allowed",
        ),
        (
            format!("http://localhost:{}/mcp", mcp.addr().port()),
            "a name that resolves to loopback",
        ),
        (
            "http://169.254.169.254/latest".to_owned(),
            "link-local metadata address",
        ),
        ("http://10.1.2.3/mcp".to_owned(), "private address"),
        ("ftp://mcp.example.com/".to_owned(), "not http(s)"),
        (
            "https://other.example.com/mcp".to_owned(),
            "outside the prefixes",
        ),
    ];
    for (url, why) in cases {
        let answer = gw.create(&tenant.key, refused(url.clone())).await;
        assert_error(
            &answer,
            400,
            Some("tools[1].server_url"),
            Some("mcp_server_not_allowed"),
        );
        assert!(
            answer.body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("MCP server"),
            "{why}: {:#}",
            answer.body
        );
    }
    assert_eq!(stored_rows(&gw).await, before, "nothing stored");
    assert_eq!(mcp.sessions(), 0, "the server was never contacted");
    assert!(gw.model.requests().is_empty());
}

#[tokio::test]
async fn without_an_allow_list_no_declared_server_is_used_and_a_server_that_cannot_list_is_a_424() {
    let mcp = McpServer::start().await.expect("mcp server");
    let (gw, tenant) = gateway().await;
    let answer = gw
        .create(
            &tenant.key,
            json!({"model": "mock", "input": "x", "tools": [mcp_tool(&mcp, json!({}))]}),
        )
        .await;
    assert_error(
        &answer,
        400,
        Some("tools[0].server_url"),
        Some("mcp_server_not_allowed"),
    );

    let (gw, tenant) = gateway_allowing(&mcp).await;
    let tool = mcp_tool(&mcp, json!({}));
    mcp.stop();
    let before = stored_rows(&gw).await;
    let answer = gw
        .create(
            &tenant.key,
            json!({"model": "mock", "input": "x", "tools": [tool]}),
        )
        .await;
    assert_eq!(answer.status.as_u16(), 424, "{:#}", answer.body);
    let error = &answer.body["error"];
    assert_eq!(
        error["type"], "external_connector_error",
        "as OpenAI answers it"
    );
    assert_eq!(error["code"], "mcp_list_tools_failed");
    assert_eq!(error["param"], "tools[0]");
    assert!(
        error["message"].as_str().unwrap().contains("'calc'"),
        "{error:#}"
    );
    assert_eq!(stored_rows(&gw).await, before, "nothing stored");
    assert!(gw.model.requests().is_empty());
}

#[tokio::test]
async fn a_declared_server_listing_too_many_or_too_large_tools_is_a_424() {
    let mcp = McpServer::start().await.expect("mcp server");
    let (gw, tenant) = gateway_allowing(&mcp).await;
    let request = json!({"model": "mock", "input": "x", "tools": [mcp_tool(&mcp, json!({}))]});
    for (count, description_bytes, says) in [
        (1_000, 10, "more than 1000 tools"),
        (5, 1024 * 1024, "more than 4 MiB"),
    ] {
        mcp.list_extra_tools(count, description_bytes);

        let answer = gw.create(&tenant.key, request.clone()).await;

        assert_eq!(answer.status.as_u16(), 424, "{says}: {:#}", answer.body);
        assert_eq!(answer.body["error"]["code"], "mcp_list_tools_failed");
        let message = answer.body["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{message}");
    }
    assert!(gw.model.requests().is_empty());
}

#[tokio::test]
async fn a_server_url_s_path_and_query_reach_neither_the_client_nor_the_logs() {
    let logs = capture_logs();
    let mcp = McpServer::start().await.expect("mcp server");
    let (gw, tenant) = gateway_allowing(&mcp).await;
    let url = format!(
        "http://{}/mcp/sk-SECRETPATH/x?token=SECRETQUERY",
        mcp.addr()
    );
    let tool = json!({"type": "mcp", "server_label": "calc", "server_url": url,
                      "require_approval": "never"});
    // Down, so the listing fails with the transport's own error (which names the URL it tried).
    mcp.stop();

    let answer = gw
        .create(
            &tenant.key,
            json!({"model": "mock", "input": "x", "tools": [tool]}),
        )
        .await;

    assert_eq!(answer.status.as_u16(), 424, "{:#}", answer.body);
    let sent = answer.body.to_string();
    assert!(
        !sent.contains("SECRET"),
        "the client's error keeps no path or query: {sent}"
    );
    let logged = logs.text();
    assert!(
        logged.contains("remote MCP"),
        "the failure is logged: {logged}"
    );
    assert!(
        !logged.contains("SECRET"),
        "the logs keep no path or query: {logged}"
    );
}
