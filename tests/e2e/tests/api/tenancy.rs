//! Responses belong to the project that created them: other projects get 404, never 403.

use crate::common::*;
use gateway_testkit::{Call, Reply};
use serde_json::json;

#[tokio::test]
async fn another_projects_key_gets_404_on_get_delete_and_input_items() {
    let (gw, owner) = gateway().await;
    let stranger = gw.tenant("stranger").await;
    gw.model.push(Reply::text("private answer"));
    let created = create_ok(&gw, &owner.key, json!({"model": "mock", "input": "secret"})).await;
    let id = id_of(&created);

    let get = get_response(&gw, &stranger.key, &id).await;
    let delete = delete_response(&gw, &stranger.key, &id).await;
    let items = input_items(&gw, &stranger.key, &id, "").await;

    assert_error(&get, 404, None, None);
    assert_error(&delete, 404, None, None);
    assert_error(&items, 404, None, None);
    let unknown = get_response(&gw, &stranger.key, "resp_unknown").await;
    assert_eq!(
        get.error()["message"]
            .as_str()
            .map(|m| m.replace(&id, "ID")),
        unknown.error()["message"]
            .as_str()
            .map(|m| m.replace("resp_unknown", "ID")),
        "a foreign id reads exactly like a missing one"
    );
    // The owner still has it, untouched by the stranger's delete.
    let read = get_response(&gw, &owner.key, &id).await;
    assert_eq!(read.status.as_u16(), 200);
    assert_eq!(read.body, created);
    assert_eq!(stored_rows(&gw).await.0, 1);
}

#[tokio::test]
async fn another_projects_response_cannot_be_chained() {
    let (gw, owner) = gateway().await;
    let stranger = gw.tenant("stranger").await;
    gw.model.push(Reply::text("private answer"));
    let created = create_ok(&gw, &owner.key, json!({"model": "mock", "input": "secret"})).await;
    let before = stored_rows(&gw).await;

    let answer = gw
        .create(&stranger.key, json!({"model": "mock", "input": "what was said?", "previous_response_id": id_of(&created)}))
        .await;

    assert_error(
        &answer,
        400,
        Some("previous_response_id"),
        Some("previous_response_not_found"),
    );
    assert_eq!(stored_rows(&gw).await, before);
    assert_eq!(
        gw.model.requests().len(),
        1,
        "nothing of the owner's context reached the model"
    );
}

#[tokio::test]
async fn server_tools_of_a_group_are_invisible_to_projects_outside_it() {
    let (gw, owner) = gateway().await;
    // A second group with the same `mock` deployment and the `add` tool, granted only to `owner`.
    let group = gw
        .admin_ok(
            reqwest::Method::POST,
            "/deployment_groups",
            Some(json!({"name": "with-tools"})),
        )
        .await;
    let group_id = id_of(&group);
    gw.admin_ok(
        reqwest::Method::PUT,
        &format!(
            "/deployment_groups/{group_id}/deployments/{}",
            owner.deployment_id
        ),
        None,
    )
    .await;
    gw.admin_ok(
        reqwest::Method::PUT,
        &format!(
            "/deployment_groups/{group_id}/projects/{}",
            owner.project_id
        ),
        None,
    )
    .await;
    gw.attach_tool(&group_id, "add").await;
    let outsider = gw.tenant("outsider").await;
    gw.model.push(Reply::tool_calls(vec![Call::new(
        "add",
        json!({"a": 1, "b": 1}),
    )
    .with_id("call_x")]));
    gw.model.push(Reply::text("owner ran add"));
    gw.model.push(Reply::tool_calls(vec![Call::new(
        "add",
        json!({"a": 1, "b": 1}),
    )
    .with_id("call_y")]));

    let owned = create_ok(&gw, &owner.key, json!({"model": "mock", "input": "add"})).await;
    let outside = create_ok(&gw, &outsider.key, json!({"model": "mock", "input": "add"})).await;

    let requests = gw.model.requests();
    assert_eq!(offered_tools(&requests[0]), ["add"]);
    assert_eq!(owned["output_text"], "owner ran add");
    assert!(
        offered_tools(&requests[2]).is_empty(),
        "the outsider is not offered the tool: {:#}",
        requests[2]
    );
    // For the outsider `add` is not a server tool: the call is handed back, not run.
    assert_eq!(gw.tools.calls().len(), 1);
    assert_eq!(outside["output"][0]["type"], "function_call", "{outside:#}");
}
