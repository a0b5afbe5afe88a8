//! The Conversations API and `conversation` on create (SPEC 15): CRUD and item pages, turns that see the turns
//! before them, server tool calls kept, tenancy, concurrent appends, and bad input that stores nothing.

use crate::common::*;
use gateway_e2e::{Answer, TestGateway};
use gateway_testkit::{Call, Reply};
use reqwest::Method;
use serde_json::{json, Value};

async fn call(
    gw: &TestGateway,
    key: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> Answer {
    let request = gw.public(method, path, key);
    let request = match body {
        Some(body) => request.json(&body),
        None => request,
    };
    gw.call(request).await
}

async fn call_ok(
    gw: &TestGateway,
    key: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> Value {
    let answer = call(gw, key, method.clone(), path, body).await;
    assert_eq!(
        answer.status.as_u16(),
        200,
        "{method} {path}: {:#}",
        answer.body
    );
    answer.body
}

/// Every item of a conversation, oldest first, read a page of `page` at a time.
async fn all_items(gw: &TestGateway, key: &str, id: &str, page: usize) -> Vec<Value> {
    let mut items = Vec::new();
    let mut after = String::new();
    loop {
        let path = format!("/conversations/{id}/items?order=asc&limit={page}{after}");
        let body = call_ok(gw, key, Method::GET, &path, None).await;
        let data = body["data"].as_array().expect("data").clone();
        assert!(data.len() <= page, "{body:#}");
        items.extend(data);
        if body["has_more"] != json!(true) {
            return items;
        }
        after = format!("&after={}", body["last_id"].as_str().expect("last_id"));
    }
}

fn texts(items: &[Value]) -> Vec<String> {
    items
        .iter()
        .map(|item| {
            let content = &item["content"][0];
            format!(
                "{}:{}",
                item["role"]
                    .as_str()
                    .unwrap_or(item["type"].as_str().unwrap_or("?")),
                content["text"].as_str().unwrap_or("")
            )
        })
        .collect()
}

#[tokio::test]
async fn a_conversation_is_created_read_updated_paged_and_deleted() {
    let (gw, tenant) = gateway().await;
    let key = &tenant.key;
    let created = call_ok(
        &gw,
        key,
        Method::POST,
        "/conversations",
        Some(json!({
            "metadata": {"topic": "demo"},
            "items": [
                {"role": "user", "content": "one"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "two"}]},
                {"role": "user", "content": "three"},
            ],
        })),
    )
    .await;
    let id = id_of(&created);
    assert!(id.starts_with("conv_"), "{created:#}");
    assert_eq!(created["object"], "conversation");
    assert_eq!(created["metadata"], json!({"topic": "demo"}));
    assert!(created["created_at"].is_i64(), "{created:#}");
    assert_eq!(
        call_ok(&gw, key, Method::GET, &format!("/conversations/{id}"), None).await,
        created
    );

    let updated = call_ok(
        &gw,
        key,
        Method::POST,
        &format!("/conversations/{id}"),
        Some(json!({"metadata": {"topic": "other", "lang": "en"}})),
    )
    .await;
    assert_eq!(updated["metadata"], json!({"topic": "other", "lang": "en"}));
    assert_eq!(updated["created_at"], created["created_at"]);

    let added = call_ok(
        &gw,
        key,
        Method::POST,
        &format!("/conversations/{id}/items"),
        Some(json!({"items": [{"role": "user", "content": "four"}, {"role": "user", "content": "five"}]})),
    )
    .await;
    assert_eq!(added["object"], "list");
    assert_eq!(
        texts(added["data"].as_array().expect("data")),
        ["user:four", "user:five"]
    );

    // Paged oldest first, two at a time, and newest first by default.
    let items = all_items(&gw, key, &id, 2).await;
    assert_eq!(
        texts(&items),
        [
            "user:one",
            "assistant:two",
            "user:three",
            "user:four",
            "user:five"
        ]
    );
    for item in &items {
        assert_eq!(item["type"], "message", "{item:#}");
        assert_eq!(item["status"], "completed", "{item:#}");
        assert!(
            item["id"].as_str().is_some_and(|id| id.starts_with("msg_")),
            "{item:#}"
        );
    }
    let newest = call_ok(
        &gw,
        key,
        Method::GET,
        &format!("/conversations/{id}/items?limit=2"),
        None,
    )
    .await;
    assert_eq!(
        texts(newest["data"].as_array().expect("data")),
        ["user:five", "user:four"]
    );
    assert_eq!(newest["has_more"], true);
    assert_eq!(newest["first_id"], items[4]["id"]);
    assert_eq!(newest["last_id"], items[3]["id"]);

    // One item read and deleted; the delete answers the conversation.
    let second = items[1]["id"].as_str().expect("id");
    let item = call_ok(
        &gw,
        key,
        Method::GET,
        &format!("/conversations/{id}/items/{second}"),
        None,
    )
    .await;
    assert_eq!(item, items[1]);
    let after_delete = call_ok(
        &gw,
        key,
        Method::DELETE,
        &format!("/conversations/{id}/items/{second}"),
        None,
    )
    .await;
    assert_eq!(after_delete["object"], "conversation");
    assert_eq!(after_delete["id"], json!(id));
    let gone = call(
        &gw,
        key,
        Method::GET,
        &format!("/conversations/{id}/items/{second}"),
        None,
    )
    .await;
    assert_error(&gone, 404, Some("item_id"), None);
    assert_eq!(all_items(&gw, key, &id, 20).await.len(), 4);

    let deleted = call_ok(
        &gw,
        key,
        Method::DELETE,
        &format!("/conversations/{id}"),
        None,
    )
    .await;
    assert_eq!(
        deleted,
        json!({"id": id, "object": "conversation.deleted", "deleted": true})
    );
    let answer = call(&gw, key, Method::GET, &format!("/conversations/{id}"), None).await;
    assert_error(
        &answer,
        404,
        Some("conversation_id"),
        Some("conversation_not_found"),
    );
    assert_eq!(
        gw.fetch_i64("SELECT count(*) FROM conversation_items")
            .await,
        0
    );
}

#[tokio::test]
async fn a_second_turn_through_a_conversation_sees_the_first_and_both_are_kept() {
    let (gw, tenant) = gateway().await;
    let key = &tenant.key;
    let conversation = call_ok(&gw, key, Method::POST, "/conversations", Some(json!({}))).await;
    let id = id_of(&conversation);

    gw.model.push(Reply::text("Hello, Ada."));
    let first = create_ok(
        &gw,
        key,
        json!({"model": "mock", "input": "I am Ada.", "conversation": id}),
    )
    .await;
    assert_eq!(first["conversation"], json!({"id": id}), "{first:#}");
    gw.model.push(Reply::text("You are Ada."));
    let second = create_ok(
        &gw,
        key,
        json!({"model": "mock", "input": "Who am I?", "conversation": {"id": id}}),
    )
    .await;
    assert_eq!(second["output_text"], "You are Ada.");

    // The model saw the first turn, then the new input.
    let requests = gw.model.requests();
    let seen: Vec<(String, String)> = messages(&requests[1])
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap_or_default().to_owned(),
                m["content"]
                    .as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| m["content"].to_string()),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("user".to_owned(), "I am Ada.".to_owned()),
            ("assistant".to_owned(), "Hello, Ada.".to_owned()),
            ("user".to_owned(), "Who am I?".to_owned()),
        ]
    );
    let items = all_items(&gw, key, &id, 3).await;
    assert_eq!(
        texts(&items),
        [
            "user:I am Ada.",
            "assistant:Hello, Ada.",
            "user:Who am I?",
            "assistant:You are Ada."
        ]
    );
    assert_eq!(items[3]["id"], second["output"][0]["id"]);
}

#[tokio::test]
async fn a_turn_with_a_server_tool_keeps_its_calls_as_the_client_sees_them() {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;
    let key = &tenant.key;
    let id = id_of(&call_ok(&gw, key, Method::POST, "/conversations", Some(json!({}))).await);
    gw.model.push(Reply::tool_calls(vec![Call::new(
        "add",
        json!({"a": 2, "b": 3}),
    )
    .with_id("call_add")]));
    gw.model.push(Reply::text("It is 5."));
    let response = create_ok(
        &gw,
        key,
        json!({"model": "mock", "input": "2+3?", "conversation": id}),
    )
    .await;

    let items = all_items(&gw, key, &id, 20).await;
    let kinds: Vec<&str> = items
        .iter()
        .map(|i| i["type"].as_str().unwrap_or_default())
        .collect();
    let output_kinds: Vec<&str> = response["output"]
        .as_array()
        .expect("output")
        .iter()
        .map(|i| i["type"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(kinds[0], "message");
    assert_eq!(&kinds[1..], output_kinds.as_slice(), "{items:#?}");
    assert!(output_kinds.len() >= 2, "{response:#}");
    for (kept, shown) in items[1..]
        .iter()
        .zip(response["output"].as_array().expect("output"))
    {
        assert_eq!(kept["id"], shown["id"]);
        assert_eq!(kept["type"], shown["type"]);
    }
}

#[tokio::test]
async fn an_item_deleted_while_a_turn_runs_stays_deleted_when_the_turn_is_appended() {
    let (gw, tenant) = gateway_with_tools(&["gate"]).await;
    let key = &tenant.key;
    let conversation = call_ok(
        &gw,
        key,
        Method::POST,
        "/conversations",
        Some(json!({"items": [
            {"type": "message", "role": "user", "content": "Remember 42."},
            {"type": "message", "role": "user", "content": "Forget this one."}
        ]})),
    )
    .await;
    let id = id_of(&conversation);
    let held = all_items(&gw, key, &id, 20).await;
    let doomed = held[1]["id"].as_str().expect("id").to_owned();
    let turn = create_ok(
        &gw,
        key,
        json!({"model": "mock", "input": "!call gate {}", "conversation": id}),
    );
    let ((), ended) = tokio::join!(
        async {
            assert!(
                gw.tools
                    .wait_for_calls("gate", 1, std::time::Duration::from_secs(30))
                    .await
                    .is_some(),
                "the gate call never arrived"
            );
            // While the turn runs on a context that holds it, the item is deleted; the turn then ends.
            call_ok(
                &gw,
                key,
                Method::DELETE,
                &format!("/conversations/{id}/items/{doomed}"),
                None,
            )
            .await;
            gw.tools.open_gate();
        },
        turn
    );
    assert_eq!(ended["status"], "completed", "{ended:#}");

    let items = all_items(&gw, key, &id, 20).await;
    assert!(
        items.iter().all(|item| item["id"] != doomed.as_str()),
        "the deleted item came back: {items:#?}"
    );
    assert_eq!(items[0]["id"], held[0]["id"], "{items:#?}");
    assert_eq!(
        texts(&items[..2]),
        ["user:Remember 42.", "user:!call gate {}"],
        "the turn's input follows what was kept: {items:#?}"
    );
    assert_eq!(
        items.len(),
        2 + ended["output"].as_array().expect("output").len(),
        "{items:#?}"
    );
}

#[tokio::test]
async fn a_conversation_belongs_to_its_project() {
    let (gw, tenant) = gateway().await;
    let other = gw.tenant("globex").await;
    let id = id_of(
        &call_ok(
            &gw,
            &tenant.key,
            Method::POST,
            "/conversations",
            Some(json!({"items": [{"role": "user", "content": "secret"}]})),
        )
        .await,
    );
    let item_id = all_items(&gw, &tenant.key, &id, 20).await[0]["id"]
        .as_str()
        .expect("id")
        .to_owned();

    for (method, path, body) in [
        (Method::GET, format!("/conversations/{id}"), None),
        (
            Method::POST,
            format!("/conversations/{id}"),
            Some(json!({"metadata": {}})),
        ),
        (Method::GET, format!("/conversations/{id}/items"), None),
        (
            Method::POST,
            format!("/conversations/{id}/items"),
            Some(json!({"items": [{"role": "user", "content": "x"}]})),
        ),
        (
            Method::GET,
            format!("/conversations/{id}/items/{item_id}"),
            None,
        ),
        (
            Method::DELETE,
            format!("/conversations/{id}/items/{item_id}"),
            None,
        ),
        (Method::DELETE, format!("/conversations/{id}"), None),
    ] {
        let answer = call(&gw, &other.key, method.clone(), &path, body).await;
        assert_error(
            &answer,
            404,
            Some("conversation_id"),
            Some("conversation_not_found"),
        );
    }
    let answer = gw
        .create(
            &other.key,
            json!({"model": "mock", "input": "hi", "conversation": id}),
        )
        .await;
    assert_error(
        &answer,
        404,
        Some("conversation"),
        Some("conversation_not_found"),
    );
    // Nothing of the other project's attempts reached the conversation or a model.
    assert_eq!(
        texts(&all_items(&gw, &tenant.key, &id, 20).await),
        ["user:secret"]
    );
    assert!(gw.model.requests().is_empty());
}

#[tokio::test]
async fn concurrent_turns_on_one_conversation_append_whole_one_after_the_other() {
    let (gw, tenant) = gateway().await;
    let key = tenant.key.clone();
    let id = id_of(&call_ok(&gw, &key, Method::POST, "/conversations", Some(json!({}))).await);
    const TURNS: usize = 6;
    let turns = (0..TURNS).map(|n| {
        let (gw, key, id) = (&gw, key.clone(), id.clone());
        async move {
            let response = create_ok(
                gw,
                &key,
                json!({"model": "mock", "input": format!("turn {n}"), "conversation": id}),
            )
            .await;
            let input = input_items(gw, &key, &id_of(&response), "?order=asc&limit=100")
                .await
                .body;
            let input_id = input["data"]
                .as_array()
                .expect("data")
                .iter()
                .find(|item| item["content"][0]["text"] == format!("turn {n}"))
                .map(|item| item["id"].clone())
                .expect("its input");
            (input_id, response["output"][0]["id"].clone())
        }
    });
    let pairs = futures::future::join_all(turns).await;

    let items = all_items(&gw, &key, &id, 100).await;
    assert!(items.len() >= TURNS * 2, "nothing lost: {items:#?}");
    // Each turn's output follows its own input directly: appends never interleave.
    for (input_id, output_id) in &pairs {
        let at = items
            .iter()
            .position(|i| &i["id"] == input_id)
            .expect("input kept");
        assert_eq!(&items[at + 1]["id"], output_id, "{items:#?}");
    }
    let ids: std::collections::HashSet<&Value> = items.iter().map(|i| &i["id"]).collect();
    assert_eq!(ids.len(), items.len(), "no item twice");
}

#[tokio::test]
async fn bad_conversation_input_is_refused_and_stores_nothing() {
    let (gw, tenant) = gateway().await;
    let key = &tenant.key;
    let answer = call(
        &gw,
        key,
        Method::POST,
        "/conversations",
        Some(json!({"items": [{"role": "user", "content": "ok"}, {"type": "bogus"}]})),
    )
    .await;
    assert_error(&answer, 400, Some("items[1]"), None);
    let answer = call(
        &gw,
        key,
        Method::POST,
        "/conversations",
        Some(json!({"metadata": {"n": 1}})),
    )
    .await;
    assert_error(&answer, 400, Some("metadata"), None);
    let too_many: serde_json::Map<String, Value> =
        (0..17).map(|i| (format!("k{i}"), json!("v"))).collect();
    let answer = call(
        &gw,
        key,
        Method::POST,
        "/conversations",
        Some(json!({"metadata": too_many})),
    )
    .await;
    assert_error(&answer, 400, Some("metadata"), None);
    assert_eq!(gw.fetch_i64("SELECT count(*) FROM conversations").await, 0);

    let id = id_of(&call_ok(&gw, key, Method::POST, "/conversations", Some(json!({}))).await);
    let answer = call(
        &gw,
        key,
        Method::POST,
        &format!("/conversations/{id}/items"),
        Some(json!({"items": [{"role": "user", "content": "ok"}, 7]})),
    )
    .await;
    assert_error(&answer, 400, Some("items[1]"), None);
    let answer = call(
        &gw,
        key,
        Method::POST,
        &format!("/conversations/{id}/items"),
        Some(json!({})),
    )
    .await;
    assert_error(
        &answer,
        400,
        Some("items"),
        Some("missing_required_parameter"),
    );
    let answer = call(
        &gw,
        key,
        Method::GET,
        &format!("/conversations/{id}/items?after=msg_nope"),
        None,
    )
    .await;
    assert_error(&answer, 400, Some("after"), None);
    let answer = call(
        &gw,
        key,
        Method::GET,
        &format!("/conversations/{id}/items?limit=0"),
        None,
    )
    .await;
    assert_error(&answer, 400, Some("limit"), None);
    let answer = call(
        &gw,
        key,
        Method::GET,
        &format!("/conversations/{id}/items/msg_nope"),
        None,
    )
    .await;
    assert_error(&answer, 404, Some("item_id"), None);
    assert_eq!(
        gw.fetch_i64("SELECT count(*) FROM conversation_items")
            .await,
        0
    );

    let answer = gw
        .create(key, json!({"model": "mock", "input": "hi", "conversation": id, "previous_response_id": "resp_1"}))
        .await;
    assert_error(&answer, 400, Some("conversation"), None);
    let answer = gw
        .create(
            key,
            json!({"model": "mock", "input": "hi", "conversation": "conv_nope"}),
        )
        .await;
    assert_error(
        &answer,
        404,
        Some("conversation"),
        Some("conversation_not_found"),
    );
    assert!(gw.model.requests().is_empty());
    assert_eq!(stored_rows(&gw).await.0, 0);
}

#[tokio::test]
async fn items_a_turn_cannot_use_are_named_as_the_conversations() {
    let (gw, tenant) = gateway().await;
    let key = &tenant.key;
    // A tool's output with no call before it: accepted as OpenAI accepts it, but no turn can pair it.
    let id = id_of(
        &call_ok(
            &gw,
            key,
            Method::POST,
            "/conversations",
            Some(json!({"items": [{"type": "function_call_output", "call_id": "call_none", "output": "4"}]})),
        )
        .await,
    );
    gw.model.push(Reply::text("never asked"));

    let answer = gw
        .create(
            key,
            json!({"model": "mock", "input": "hi", "conversation": id}),
        )
        .await;

    // The conversation is what holds the fault, not this request's input.
    assert_error(&answer, 400, Some("conversation"), None);
    assert!(gw.model.requests().is_empty());
    // A compaction that does not open is refused when added, naming it, and nothing is added.
    let answer = call(
        &gw,
        key,
        Method::POST,
        &format!("/conversations/{id}/items"),
        Some(json!({"items": [{"role": "user", "content": "ok"}, {"type": "compaction", "encrypted_content": "gwc1.altered"}]})),
    )
    .await;
    assert_error(
        &answer,
        400,
        Some("items[1]"),
        Some("invalid_encrypted_content"),
    );
    let held = call_ok(
        &gw,
        key,
        Method::GET,
        &format!("/conversations/{id}/items"),
        None,
    )
    .await;
    assert_eq!(held["data"].as_array().map(Vec::len), Some(1), "{held:#}");
}

#[tokio::test]
async fn a_list_parameter_may_be_repeated_as_sdks_send_it() {
    let (gw, tenant) = gateway().await;
    let key = &tenant.key;
    let created = call_ok(
        &gw,
        key,
        Method::POST,
        "/conversations",
        Some(json!({"items": [{"role": "user", "content": "one"}]})),
    )
    .await;
    let id = id_of(&created);

    for query in [
        "include[]=reasoning.encrypted_content&include[]=message.output_text.logprobs",
        "include=reasoning.encrypted_content&include=message.output_text.logprobs",
    ] {
        let page = call_ok(
            &gw,
            key,
            Method::GET,
            &format!("/conversations/{id}/items?{query}"),
            None,
        )
        .await;
        assert_eq!(
            texts(page["data"].as_array().expect("data")),
            ["user:one"],
            "{query}"
        );
    }
    // Any other parameter still once.
    let twice = call(
        &gw,
        key,
        Method::GET,
        &format!("/conversations/{id}/items?limit=1&limit=2"),
        None,
    )
    .await;
    assert_error(&twice, 400, Some("limit"), Some("duplicate_parameter"));
}
