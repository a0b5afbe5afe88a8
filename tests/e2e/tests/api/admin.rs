//! End-to-end tests of the admin API (`/admin/v1`): auth, CRUD of every entity, uniqueness, secrets never
//! shown, and group memberships changing what the next public request may use.

use gateway_e2e::{items_of, TestGateway};
use gateway_testkit::mock_model::{Call, Reply};
use gateway_testkit::tool_server::tool_definitions;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

/// An admin answer with its raw text, so tests can search it for secrets.
#[derive(Debug)]
pub(super) struct Raw {
    pub(super) status: StatusCode,
    pub(super) text: String,
    pub(super) body: Value,
}

async fn raw(request: reqwest::RequestBuilder) -> Raw {
    let response = request.send().await.expect("request");
    let status = response.status();
    let text = response.text().await.expect("body");
    let body = serde_json::from_str(&text).unwrap_or(Value::Null);
    Raw { status, text, body }
}

/// An authenticated admin call with an optional JSON body.
pub(super) async fn admin(
    gw: &TestGateway,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> Raw {
    let mut request = gw.admin(method, path);
    if let Some(body) = body {
        request = request.json(&body);
    }
    raw(request).await
}

/// An authenticated admin call with a raw body, sent as JSON.
async fn admin_text(gw: &TestGateway, method: Method, path: &str, body: &str) -> Raw {
    raw(gw
        .admin(method, path)
        .header("content-type", "application/json")
        .body(body.to_owned()))
    .await
}

/// Asserts an OpenAI-shaped error answer with `status` and `param`.
pub(super) fn assert_error(answer: &Raw, status: u16, param: Option<&str>) {
    assert_eq!(answer.status.as_u16(), status, "answer: {}", answer.text);
    let error = answer.body["error"]
        .as_object()
        .unwrap_or_else(|| panic!("no error object in {}", answer.text));
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{}",
        answer.text
    );
    assert!(error["type"].is_string(), "{}", answer.text);
    assert!(error.contains_key("code"), "{}", answer.text);
    assert_eq!(
        error["param"],
        param.map_or(Value::Null, |p| json!(p)),
        "{}",
        answer.text
    );
}

pub(super) fn id_of(value: &Value) -> String {
    value["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no id in {value}"))
        .to_owned()
}

pub(super) fn mock_deployment(gw: &TestGateway, name: &str) -> Value {
    json!({"name": name, "provider": {"kind": "openai_chat", "base_url": gw.model.base_url(), "model": "mock-model"}})
}

fn add_tool_source(gw: &TestGateway, name: &str) -> Value {
    let add = tool_definitions()
        .into_iter()
        .find(|d| d.name == "add")
        .expect("add tool");
    json!({"name": name, "description": add.description, "parameters": add.parameters, "url": gw.tools.url("add")})
}

/// Every admin route with a method, ids filled with ones that do not exist.
fn every_route() -> Vec<(Method, &'static str)> {
    vec![
        (Method::GET, "/projects"),
        (Method::POST, "/projects"),
        (Method::GET, "/projects/proj_x"),
        (Method::PATCH, "/projects/proj_x"),
        (Method::DELETE, "/projects/proj_x"),
        (Method::GET, "/projects/proj_x/api_keys"),
        (Method::POST, "/projects/proj_x/api_keys"),
        (Method::GET, "/api_keys/key_x"),
        (Method::PATCH, "/api_keys/key_x"),
        (Method::DELETE, "/api_keys/key_x"),
        (Method::GET, "/deployments"),
        (Method::POST, "/deployments"),
        (Method::GET, "/deployments/dep_x"),
        (Method::PATCH, "/deployments/dep_x"),
        (Method::DELETE, "/deployments/dep_x"),
        (Method::GET, "/deployment_groups"),
        (Method::POST, "/deployment_groups"),
        (Method::GET, "/deployment_groups/grp_x"),
        (Method::PATCH, "/deployment_groups/grp_x"),
        (Method::DELETE, "/deployment_groups/grp_x"),
        (Method::PUT, "/deployment_groups/grp_x/deployments/dep_x"),
        (Method::DELETE, "/deployment_groups/grp_x/deployments/dep_x"),
        (Method::PUT, "/deployment_groups/grp_x/projects/proj_x"),
        (Method::DELETE, "/deployment_groups/grp_x/projects/proj_x"),
        (Method::PUT, "/deployment_groups/grp_x/tool_sources/tool_x"),
        (
            Method::DELETE,
            "/deployment_groups/grp_x/tool_sources/tool_x",
        ),
        (Method::GET, "/tool_sources"),
        (Method::POST, "/tool_sources"),
        (Method::GET, "/tool_sources/tool_x"),
        (Method::PATCH, "/tool_sources/tool_x"),
        (Method::DELETE, "/tool_sources/tool_x"),
    ]
}

#[tokio::test]
async fn every_admin_route_refuses_a_missing_or_wrong_token() {
    let gw = TestGateway::start().await;
    let url = |path: &str| format!("{}/admin/v1{path}", gw.base_url);
    for (method, path) in every_route() {
        let none = raw(gw
            .http
            .request(method.clone(), url(path))
            .json(&json!({"name": "x"})))
        .await;
        assert_error(&none, 401, None);
        let wrong = raw(gw
            .http
            .request(method.clone(), url(path))
            .bearer_auth("admin-wrong")
            .json(&json!({"name": "x"})))
        .await;
        assert_error(&wrong, 401, None);
        assert_eq!(
            wrong.body["error"]["code"], "invalid_admin_token",
            "{method} {path}"
        );
        let prefix = raw(gw
            .http
            .request(method.clone(), url(path))
            .bearer_auth(&gw.admin_token[..gw.admin_token.len() - 1]))
        .await;
        assert_error(&prefix, 401, None);
    }
    // A gateway API key is not an admin token.
    let tenant = gw.tenant("acme").await;
    let with_key = raw(gw.http.get(url("/projects")).bearer_auth(&tenant.key)).await;
    assert_error(&with_key, 401, None);
}

#[tokio::test]
async fn the_admin_api_refuses_everything_when_no_token_is_configured() {
    let gw = TestGateway::start_with(|config| config.admin.token = None).await;
    let answer = raw(gw.admin(Method::GET, "/projects")).await;
    assert_error(&answer, 401, None);
    assert_eq!(answer.body["error"]["code"], "admin_api_disabled");
}

#[tokio::test]
async fn projects_can_be_created_read_listed_renamed_and_deleted() {
    let gw = TestGateway::start().await;
    let created = admin(
        &gw,
        Method::POST,
        "/projects",
        Some(json!({"name": "acme"})),
    )
    .await;
    assert_eq!(created.status, StatusCode::OK, "{}", created.text);
    let project = created.body;
    let id = id_of(&project);
    assert!(id.starts_with("proj_"));
    assert_eq!(project["object"], "project");
    assert_eq!(project["name"], "acme");
    assert!(project["created_at"].as_i64().is_some_and(|t| t > 0));

    let read = admin(&gw, Method::GET, &format!("/projects/{id}"), None).await;
    assert_eq!(read.body, project);

    admin(
        &gw,
        Method::POST,
        "/projects",
        Some(json!({"name": "globex"})),
    )
    .await;
    let listed = admin(&gw, Method::GET, "/projects", None).await;
    assert_eq!(listed.body["object"], "list");
    let names: Vec<&str> = listed.body["data"]
        .as_array()
        .expect("data")
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert_eq!(names, ["acme", "globex"]);

    let renamed = admin(
        &gw,
        Method::PATCH,
        &format!("/projects/{id}"),
        Some(json!({"name": "acme-corp"})),
    )
    .await;
    assert_eq!(renamed.status, StatusCode::OK, "{}", renamed.text);
    assert_eq!(renamed.body["name"], "acme-corp");
    assert_eq!(renamed.body["created_at"], project["created_at"]);
    let unchanged = admin(
        &gw,
        Method::PATCH,
        &format!("/projects/{id}"),
        Some(json!({})),
    )
    .await;
    assert_eq!(unchanged.body["name"], "acme-corp");

    let deleted = admin(&gw, Method::DELETE, &format!("/projects/{id}"), None).await;
    assert_eq!(
        deleted.body,
        json!({"id": id, "object": "project", "deleted": true})
    );
    let gone = admin(&gw, Method::GET, &format!("/projects/{id}"), None).await;
    assert_error(&gone, 404, None);
    assert!(gone.body["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains(&id)));
    assert_error(
        &admin(&gw, Method::DELETE, &format!("/projects/{id}"), None).await,
        404,
        None,
    );
    assert_error(
        &admin(
            &gw,
            Method::PATCH,
            &format!("/projects/{id}"),
            Some(json!({"name": "x"})),
        )
        .await,
        404,
        None,
    );
}

#[tokio::test]
async fn api_keys_are_shown_once_then_listed_by_prefix_renamed_and_revoked() {
    let gw = TestGateway::start().await;
    let project = admin(
        &gw,
        Method::POST,
        "/projects",
        Some(json!({"name": "acme"})),
    )
    .await
    .body;
    let project_id = id_of(&project);
    let created = admin(
        &gw,
        Method::POST,
        &format!("/projects/{project_id}/api_keys"),
        Some(json!({"name": "ci"})),
    )
    .await;
    assert_eq!(created.status, StatusCode::OK, "{}", created.text);
    let key = created.body["key"].as_str().expect("key").to_owned();
    let key_id = id_of(&created.body);
    assert!(key_id.starts_with("key_"));
    assert!(key.starts_with("sk-") && key.len() == 51, "{key}");
    assert!(key[3..]
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
    assert_eq!(created.body["object"], "api_key");
    assert_eq!(created.body["name"], "ci");
    assert_eq!(created.body["project_id"], project_id.as_str());
    assert_eq!(created.body["revoked_at"], Value::Null);
    let prefix = created.body["key_prefix"]
        .as_str()
        .expect("prefix")
        .to_owned();
    assert!(key.starts_with(&prefix) && prefix.len() < 12, "{prefix}");

    let second = admin(
        &gw,
        Method::POST,
        &format!("/projects/{project_id}/api_keys"),
        Some(json!({"name": "ci"})),
    )
    .await;
    assert_eq!(
        second.status,
        StatusCode::OK,
        "key names are labels, not unique: {}",
        second.text
    );
    assert_ne!(second.body["key"], created.body["key"]);

    let listed = admin(
        &gw,
        Method::GET,
        &format!("/projects/{project_id}/api_keys"),
        None,
    )
    .await;
    assert_eq!(listed.body["object"], "list");
    assert_eq!(listed.body["data"].as_array().map(Vec::len), Some(2));
    assert!(!listed.text.contains(&key), "the key is shown only once");
    let data = listed.body["data"].as_array().expect("data");
    assert!(data.iter().all(|k| k.get("key").is_none()));
    let first = data
        .iter()
        .find(|k| k["id"] == key_id.as_str())
        .expect("first key listed");
    assert_eq!(first["key_prefix"], prefix.as_str());

    let read = admin(&gw, Method::GET, &format!("/api_keys/{key_id}"), None).await;
    assert!(!read.text.contains(&key));
    assert_eq!(read.body["id"], key_id.as_str());

    let renamed = admin(
        &gw,
        Method::PATCH,
        &format!("/api_keys/{key_id}"),
        Some(json!({"name": "deploy"})),
    )
    .await;
    assert_eq!(renamed.body["name"], "deploy");
    assert!(!renamed.text.contains(&key));

    let revoked = admin(&gw, Method::DELETE, &format!("/api_keys/{key_id}"), None).await;
    assert_eq!(revoked.status, StatusCode::OK, "{}", revoked.text);
    let revoked_at = revoked.body["revoked_at"].as_i64().expect("revoked_at");
    assert!(!revoked.text.contains(&key));
    let again = admin(&gw, Method::DELETE, &format!("/api_keys/{key_id}"), None).await;
    assert_eq!(
        again.status,
        StatusCode::OK,
        "revoking is idempotent: {}",
        again.text
    );
    assert_eq!(again.body["revoked_at"], revoked_at);
    let listed = admin(
        &gw,
        Method::GET,
        &format!("/projects/{project_id}/api_keys"),
        None,
    )
    .await;
    assert!(listed.body["data"]
        .as_array()
        .expect("data")
        .iter()
        .any(|k| k["id"] == key_id.as_str() && k["revoked_at"] == revoked_at));

    assert_error(
        &admin(&gw, Method::GET, "/api_keys/key_missing", None).await,
        404,
        None,
    );
    assert_error(
        &admin(&gw, Method::DELETE, "/api_keys/key_missing", None).await,
        404,
        None,
    );
    assert_error(
        &admin(
            &gw,
            Method::POST,
            "/projects/proj_missing/api_keys",
            Some(json!({"name": "x"})),
        )
        .await,
        404,
        None,
    );
    assert_error(
        &admin(&gw, Method::GET, "/projects/proj_missing/api_keys", None).await,
        404,
        None,
    );
}

#[tokio::test]
async fn a_revoked_key_stops_working_at_once() {
    let gw = TestGateway::start().await;
    let tenant = gw.tenant("acme").await;
    let before = gw
        .call(gw.public(Method::GET, "/responses/resp_x", &tenant.key))
        .await;
    assert_eq!(before.status, StatusCode::NOT_FOUND, "{:?}", before.body);
    admin(
        &gw,
        Method::DELETE,
        &format!("/api_keys/{}", tenant.key_id),
        None,
    )
    .await;
    let after = gw
        .call(gw.public(Method::GET, "/responses/resp_x", &tenant.key))
        .await;
    assert_eq!(after.status, StatusCode::UNAUTHORIZED, "{:?}", after.body);
    assert_eq!(after.body["error"]["code"], "invalid_api_key");
}

#[tokio::test]
async fn deleting_a_project_deletes_its_keys() {
    let gw = TestGateway::start().await;
    let tenant = gw.tenant("acme").await;
    admin(
        &gw,
        Method::DELETE,
        &format!("/projects/{}", tenant.project_id),
        None,
    )
    .await;
    let after = gw
        .call(gw.public(Method::GET, "/responses/resp_x", &tenant.key))
        .await;
    assert_eq!(after.status, StatusCode::UNAUTHORIZED, "{:?}", after.body);
    assert_error(
        &admin(
            &gw,
            Method::GET,
            &format!("/api_keys/{}", tenant.key_id),
            None,
        )
        .await,
        404,
        None,
    );
    let group = admin(
        &gw,
        Method::GET,
        &format!("/deployment_groups/{}", tenant.group_id),
        None,
    )
    .await;
    assert_eq!(group.body["project_ids"], json!([]));
}

#[tokio::test]
async fn deployments_can_be_created_read_listed_patched_and_deleted() {
    let gw = TestGateway::start().await;
    let created = admin(
        &gw,
        Method::POST,
        "/deployments",
        Some(json!({"name": "gpt", "provider": {"kind": "openai_chat", "base_url": "https://api.example.com/v1", "model": "gpt-4o", "api_key": "sk-upstream-1"}})),
    )
    .await;
    assert_eq!(created.status, StatusCode::OK, "{}", created.text);
    let id = id_of(&created.body);
    assert!(id.starts_with("dep_"));
    assert_eq!(created.body["object"], "deployment");
    assert_eq!(
        created.body["provider"],
        json!({"kind": "openai_chat", "base_url": "https://api.example.com/v1", "model": "gpt-4o", "has_api_key": true}),
        "max_tokens is shown for Anthropic deployments only"
    );
    assert!(created.body["created_at"].is_i64());

    let read = admin(&gw, Method::GET, &format!("/deployments/{id}"), None).await;
    assert_eq!(read.body, created.body);
    let listed = admin(&gw, Method::GET, "/deployments", None).await;
    assert_eq!(listed.body["object"], "list");
    assert_eq!(listed.body["data"], json!([created.body]));

    let patched = admin(
        &gw,
        Method::PATCH,
        &format!("/deployments/{id}"),
        Some(
            json!({"name": "claude", "provider": {"kind": "anthropic", "model": "claude-sonnet"}}),
        ),
    )
    .await;
    assert_eq!(patched.status, StatusCode::OK, "{}", patched.text);
    assert_eq!(patched.body["name"], "claude");
    assert_eq!(
        patched.body["provider"],
        json!({"kind": "anthropic", "base_url": "https://api.example.com/v1", "model": "claude-sonnet", "has_api_key": true, "max_tokens": 4096})
    );
    let cleared = admin(
        &gw,
        Method::PATCH,
        &format!("/deployments/{id}"),
        Some(json!({"provider": {"api_key": null}})),
    )
    .await;
    assert_eq!(cleared.body["provider"]["has_api_key"], false);
    assert_eq!(cleared.body["provider"]["model"], "claude-sonnet");
    let set = admin(
        &gw,
        Method::PATCH,
        &format!("/deployments/{id}"),
        Some(json!({"provider": {"api_key": "sk-upstream-2"}})),
    )
    .await;
    assert_eq!(set.body["provider"]["has_api_key"], true);

    let deleted = admin(&gw, Method::DELETE, &format!("/deployments/{id}"), None).await;
    assert_eq!(
        deleted.body,
        json!({"id": id, "object": "deployment", "deleted": true})
    );
    assert_error(
        &admin(&gw, Method::GET, &format!("/deployments/{id}"), None).await,
        404,
        None,
    );
    assert_error(
        &admin(&gw, Method::DELETE, &format!("/deployments/{id}"), None).await,
        404,
        None,
    );
    assert_error(
        &admin(
            &gw,
            Method::PATCH,
            &format!("/deployments/{id}"),
            Some(json!({"name": "x"})),
        )
        .await,
        404,
        None,
    );
}

#[tokio::test]
async fn deployment_groups_can_be_created_read_listed_renamed_and_deleted() {
    let gw = TestGateway::start().await;
    let created = admin(
        &gw,
        Method::POST,
        "/deployment_groups",
        Some(json!({"name": "default"})),
    )
    .await;
    assert_eq!(created.status, StatusCode::OK, "{}", created.text);
    let id = id_of(&created.body);
    assert!(id.starts_with("grp_"));
    assert_eq!(created.body["object"], "deployment_group");
    assert_eq!(created.body["name"], "default");

    let deployment = id_of(
        &admin(
            &gw,
            Method::POST,
            "/deployments",
            Some(mock_deployment(&gw, "mock")),
        )
        .await
        .body,
    );
    let project = id_of(
        &admin(
            &gw,
            Method::POST,
            "/projects",
            Some(json!({"name": "acme"})),
        )
        .await
        .body,
    );
    let tool = id_of(
        &admin(
            &gw,
            Method::POST,
            "/tool_sources",
            Some(add_tool_source(&gw, "add")),
        )
        .await
        .body,
    );
    for path in [
        format!("deployments/{deployment}"),
        format!("projects/{project}"),
        format!("tool_sources/{tool}"),
    ] {
        let attached = admin(
            &gw,
            Method::PUT,
            &format!("/deployment_groups/{id}/{path}"),
            None,
        )
        .await;
        assert_eq!(attached.status, StatusCode::OK, "{}", attached.text);
    }
    let read = admin(&gw, Method::GET, &format!("/deployment_groups/{id}"), None).await;
    assert_eq!(read.body["deployment_ids"], json!([deployment]));
    assert_eq!(read.body["project_ids"], json!([project]));
    assert_eq!(read.body["tool_source_ids"], json!([tool]));
    let listed = admin(&gw, Method::GET, "/deployment_groups", None).await;
    assert_eq!(listed.body["object"], "list");
    assert_eq!(listed.body["data"], json!([read.body]));

    let renamed = admin(
        &gw,
        Method::PATCH,
        &format!("/deployment_groups/{id}"),
        Some(json!({"name": "gold"})),
    )
    .await;
    assert_eq!(renamed.body["name"], "gold");
    assert_eq!(renamed.body["deployment_ids"], json!([deployment]));

    // A group that still holds members is deleted only when forced.
    let refused = admin(
        &gw,
        Method::DELETE,
        &format!("/deployment_groups/{id}"),
        None,
    )
    .await;
    assert_error(&refused, 409, None);
    assert_eq!(refused.body["error"]["code"], "in_use");
    let message = refused.body["error"]["message"]
        .as_str()
        .unwrap_or_default();
    for member in [
        "project 'acme'",
        "deployment 'mock'",
        "tool source 'add'",
        "force=true",
    ] {
        assert!(message.contains(member), "{message}");
    }
    let deleted = admin(
        &gw,
        Method::DELETE,
        &format!("/deployment_groups/{id}?force=true"),
        None,
    )
    .await;
    assert_eq!(
        deleted.body,
        json!({"id": id, "object": "deployment_group", "deleted": true})
    );
    assert_error(
        &admin(&gw, Method::GET, &format!("/deployment_groups/{id}"), None).await,
        404,
        None,
    );
    assert_error(
        &admin(
            &gw,
            Method::DELETE,
            &format!("/deployment_groups/{id}"),
            None,
        )
        .await,
        404,
        None,
    );
    // Deleting a group leaves its members.
    assert_eq!(
        admin(
            &gw,
            Method::GET,
            &format!("/deployments/{deployment}"),
            None
        )
        .await
        .status,
        StatusCode::OK
    );
    assert_eq!(
        admin(&gw, Method::GET, &format!("/projects/{project}"), None)
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        admin(&gw, Method::GET, &format!("/tool_sources/{tool}"), None)
            .await
            .status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn tool_sources_can_be_created_read_listed_patched_and_deleted() {
    let gw = TestGateway::start().await;
    let created = admin(
        &gw,
        Method::POST,
        "/tool_sources",
        Some(add_tool_source(&gw, "add")),
    )
    .await;
    assert_eq!(created.status, StatusCode::OK, "{}", created.text);
    let id = id_of(&created.body);
    assert!(id.starts_with("tool_"));
    let add = tool_definitions()
        .into_iter()
        .find(|d| d.name == "add")
        .expect("add");
    assert_eq!(created.body["object"], "tool_source");
    assert_eq!(created.body["name"], "add");
    assert_eq!(created.body["description"], add.description);
    assert_eq!(created.body["parameters"], add.parameters);
    assert_eq!(created.body["url"], gw.tools.url("add"));
    assert_eq!(created.body["timeout_ms"], 30000);
    assert_eq!(created.body["strict"], false);
    assert_eq!(created.body["has_secret"], false);
    assert!(created.body["created_at"].is_i64());

    let read = admin(&gw, Method::GET, &format!("/tool_sources/{id}"), None).await;
    assert_eq!(read.body, created.body);
    let listed = admin(&gw, Method::GET, "/tool_sources", None).await;
    assert_eq!(
        listed.body,
        json!({"object": "list", "data": [created.body]})
    );

    let patched = admin(
        &gw,
        Method::PATCH,
        &format!("/tool_sources/{id}"),
        Some(json!({"name": "sum", "description": "Sum.", "timeout_ms": 1500, "strict": true, "secret": "tool-secret-1",
                    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}})),
    )
    .await;
    assert_eq!(patched.status, StatusCode::OK, "{}", patched.text);
    assert_eq!(patched.body["name"], "sum");
    assert_eq!(patched.body["description"], "Sum.");
    assert_eq!(patched.body["timeout_ms"], 1500);
    assert_eq!(patched.body["strict"], true);
    assert_eq!(patched.body["has_secret"], true);
    assert_eq!(
        patched.body["parameters"]["properties"]["a"]["type"],
        "integer"
    );
    assert_eq!(patched.body["url"], gw.tools.url("add"));
    let cleared = admin(
        &gw,
        Method::PATCH,
        &format!("/tool_sources/{id}"),
        Some(json!({"secret": null})),
    )
    .await;
    assert_eq!(cleared.body["has_secret"], false);
    assert_eq!(cleared.body["timeout_ms"], 1500);

    let deleted = admin(&gw, Method::DELETE, &format!("/tool_sources/{id}"), None).await;
    assert_eq!(
        deleted.body,
        json!({"id": id, "object": "tool_source", "deleted": true})
    );
    assert_error(
        &admin(&gw, Method::GET, &format!("/tool_sources/{id}"), None).await,
        404,
        None,
    );
    assert_error(
        &admin(&gw, Method::DELETE, &format!("/tool_sources/{id}"), None).await,
        404,
        None,
    );
    assert_error(
        &admin(
            &gw,
            Method::PATCH,
            &format!("/tool_sources/{id}"),
            Some(json!({"name": "x"})),
        )
        .await,
        404,
        None,
    );
}

#[tokio::test]
async fn duplicate_names_are_a_conflict_for_every_kind() {
    let gw = TestGateway::start().await;
    let cases = [
        (
            "/projects",
            json!({"name": "acme"}),
            json!({"name": "other"}),
        ),
        (
            "/deployments",
            mock_deployment(&gw, "mock"),
            mock_deployment(&gw, "other"),
        ),
        (
            "/deployment_groups",
            json!({"name": "default"}),
            json!({"name": "other"}),
        ),
        (
            "/tool_sources",
            add_tool_source(&gw, "add"),
            add_tool_source(&gw, "other"),
        ),
    ];
    for (path, body, other) in cases {
        let first = admin(&gw, Method::POST, path, Some(body.clone())).await;
        assert_eq!(first.status, StatusCode::OK, "{path}: {}", first.text);
        let duplicate = admin(&gw, Method::POST, path, Some(body.clone())).await;
        assert_error(&duplicate, 409, None);
        assert!(
            duplicate.body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("already exists")),
            "{}",
            duplicate.text
        );
        // Renaming onto a taken name is a conflict too.
        let second = id_of(&admin(&gw, Method::POST, path, Some(other)).await.body);
        let rename = admin(
            &gw,
            Method::PATCH,
            &format!("{path}/{second}"),
            Some(json!({"name": body["name"]})),
        )
        .await;
        assert_error(&rename, 409, None);
    }
}

#[tokio::test]
async fn secrets_never_appear_in_any_admin_answer() {
    let gw = TestGateway::start().await;
    let upstream_secret = format!("upstream-secret-{}", uuid::Uuid::new_v4().simple());
    let tool_secret = format!("tool-secret-{}", uuid::Uuid::new_v4().simple());
    let mut answers = Vec::new();

    let mut deployment = mock_deployment(&gw, "mock");
    deployment["provider"]["api_key"] = json!(upstream_secret);
    let created = admin(&gw, Method::POST, "/deployments", Some(deployment.clone())).await;
    assert_eq!(created.body["provider"]["has_api_key"], true);
    let dep = id_of(&created.body);
    answers.push(created);
    answers.push(admin(&gw, Method::POST, "/deployments", Some(deployment)).await); // 409
    answers.push(admin(&gw, Method::GET, "/deployments", None).await);
    answers.push(admin(&gw, Method::GET, &format!("/deployments/{dep}"), None).await);
    answers.push(
        admin(
            &gw,
            Method::PATCH,
            &format!("/deployments/{dep}"),
            Some(json!({"provider": {"api_key": upstream_secret}})),
        )
        .await,
    );
    answers.push(
        admin(
            &gw,
            Method::PATCH,
            &format!("/deployments/{dep}"),
            Some(json!({"provider": {"api_key": upstream_secret, "kind": "bogus"}})),
        )
        .await,
    );

    let mut tool = add_tool_source(&gw, "add");
    tool["secret"] = json!(tool_secret);
    let created = admin(&gw, Method::POST, "/tool_sources", Some(tool.clone())).await;
    assert_eq!(created.body["has_secret"], true);
    let source = id_of(&created.body);
    answers.push(created);
    answers.push(admin(&gw, Method::POST, "/tool_sources", Some(tool.clone())).await); // 409
    tool["timeout_ms"] = json!(0);
    answers.push(admin(&gw, Method::POST, "/tool_sources", Some(tool)).await); // 400
    answers.push(admin(&gw, Method::GET, "/tool_sources", None).await);
    answers.push(admin(&gw, Method::GET, &format!("/tool_sources/{source}"), None).await);
    answers.push(
        admin(
            &gw,
            Method::PATCH,
            &format!("/tool_sources/{source}"),
            Some(json!({"secret": tool_secret})),
        )
        .await,
    );
    answers.push(
        admin(
            &gw,
            Method::PATCH,
            &format!("/tool_sources/{source}"),
            Some(json!({"secret": format!("{tool_secret}\n")})),
        )
        .await,
    );

    let group = id_of(
        &admin(
            &gw,
            Method::POST,
            "/deployment_groups",
            Some(json!({"name": "default"})),
        )
        .await
        .body,
    );
    answers.push(
        admin(
            &gw,
            Method::PUT,
            &format!("/deployment_groups/{group}/deployments/{dep}"),
            None,
        )
        .await,
    );
    answers.push(
        admin(
            &gw,
            Method::PUT,
            &format!("/deployment_groups/{group}/tool_sources/{source}"),
            None,
        )
        .await,
    );
    answers.push(
        admin(
            &gw,
            Method::GET,
            &format!("/deployment_groups/{group}"),
            None,
        )
        .await,
    );
    answers.push(admin(&gw, Method::GET, "/deployment_groups", None).await);

    for answer in &answers {
        assert!(
            !answer.text.contains(&upstream_secret),
            "upstream key leaked: {}",
            answer.text
        );
        assert!(
            !answer.text.contains(&tool_secret),
            "tool secret leaked: {}",
            answer.text
        );
    }
    assert!(answers.iter().any(|a| a.status == StatusCode::CONFLICT));
    assert!(answers.iter().any(|a| a.status == StatusCode::BAD_REQUEST));
}

#[tokio::test]
async fn attachments_are_idempotent_and_name_what_is_missing() {
    let gw = TestGateway::start().await;
    let group = id_of(
        &admin(
            &gw,
            Method::POST,
            "/deployment_groups",
            Some(json!({"name": "default"})),
        )
        .await
        .body,
    );
    let deployment = id_of(
        &admin(
            &gw,
            Method::POST,
            "/deployments",
            Some(mock_deployment(&gw, "mock")),
        )
        .await
        .body,
    );
    let project = id_of(
        &admin(
            &gw,
            Method::POST,
            "/projects",
            Some(json!({"name": "acme"})),
        )
        .await
        .body,
    );
    let tool = id_of(
        &admin(
            &gw,
            Method::POST,
            "/tool_sources",
            Some(add_tool_source(&gw, "add")),
        )
        .await
        .body,
    );
    let members = [
        ("deployments", "deployment_id", deployment),
        ("projects", "project_id", project),
        ("tool_sources", "tool_source_id", tool),
    ];
    for (kind, field, member) in members {
        let path = format!("/deployment_groups/{group}/{kind}/{member}");
        let first = admin(&gw, Method::PUT, &path, None).await;
        assert_eq!(
            first.body,
            json!({"group_id": group, field: member, "attached": true}),
            "{}",
            first.text
        );
        let again = admin(&gw, Method::PUT, &path, None).await;
        assert_eq!(
            again.status,
            StatusCode::OK,
            "attaching is idempotent: {}",
            again.text
        );

        let missing_group = admin(
            &gw,
            Method::PUT,
            &format!("/deployment_groups/grp_missing/{kind}/{member}"),
            None,
        )
        .await;
        assert_error(&missing_group, 404, None);
        assert!(missing_group.body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("grp_missing")));
        let missing_member = admin(
            &gw,
            Method::PUT,
            &format!("/deployment_groups/{group}/{kind}/missing_id"),
            None,
        )
        .await;
        assert_error(&missing_member, 404, None);
        assert!(missing_member.body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("missing_id")));

        let detached = admin(&gw, Method::DELETE, &path, None).await;
        assert_eq!(
            detached.body,
            json!({"group_id": group, field: member, "attached": false}),
            "{}",
            detached.text
        );
        assert_error(&admin(&gw, Method::DELETE, &path, None).await, 404, None);
        assert_error(
            &admin(
                &gw,
                Method::DELETE,
                &format!("/deployment_groups/{group}/{kind}/missing_id"),
                None,
            )
            .await,
            404,
            None,
        );
        assert_error(
            &admin(
                &gw,
                Method::DELETE,
                &format!("/deployment_groups/grp_missing/{kind}/{member}"),
                None,
            )
            .await,
            404,
            None,
        );
    }
    let read = admin(
        &gw,
        Method::GET,
        &format!("/deployment_groups/{group}"),
        None,
    )
    .await;
    assert_eq!(read.body["deployment_ids"], json!([]));
    assert_eq!(read.body["project_ids"], json!([]));
    assert_eq!(read.body["tool_source_ids"], json!([]));
}

#[tokio::test]
async fn attaching_a_tool_source_to_a_group_changes_what_the_next_request_can_use() {
    let gw = TestGateway::start().await;
    let tenant = gw.tenant("acme").await;
    let request = json!({"model": "mock", "input": "x"});

    gw.model.push(Reply::tool_calls(vec![Call::new(
        "add",
        json!({"a": 1, "b": 2}),
    )]));
    let before = gw.create(&tenant.key, request.clone()).await;
    assert_eq!(before.status, StatusCode::OK, "{:?}", before.body);
    let calls = items_of(&before.body, "function_call");
    assert_eq!(calls.len(), 1, "{}", before.body);
    assert_eq!(calls[0]["name"], "add");
    assert!(items_of(&before.body, "mcp_call").is_empty());
    assert!(gw.tools.calls().is_empty());

    let source = gw.attach_tool(&tenant.group_id, "add").await;
    gw.model.push(Reply::tool_calls(vec![Call::new(
        "add",
        json!({"a": 1, "b": 2}),
    )]));
    gw.model.push(Reply::text("done"));
    let after = gw.create(&tenant.key, request.clone()).await;
    assert_eq!(after.status, StatusCode::OK, "{:?}", after.body);
    assert!(
        items_of(&after.body, "function_call").is_empty(),
        "{}",
        after.body
    );
    let ran = items_of(&after.body, "mcp_call");
    assert_eq!(ran.len(), 1, "{}", after.body);
    assert_eq!(ran[0]["name"], "add");
    assert!(
        ran[0]["output"].as_str().is_some_and(|o| o.contains('3')),
        "{}",
        ran[0]
    );
    assert_eq!(items_of(&after.body, "message").len(), 1, "{}", after.body);
    let recorded = gw.tools.calls();
    assert_eq!(recorded.len(), 1);
    assert_eq!(recorded[0].tool, "add");
    assert_eq!(recorded[0].body, json!({"a": 1, "b": 2}));

    admin(
        &gw,
        Method::DELETE,
        &format!(
            "/deployment_groups/{}/tool_sources/{source}",
            tenant.group_id
        ),
        None,
    )
    .await;
    gw.model.push(Reply::tool_calls(vec![Call::new(
        "add",
        json!({"a": 1, "b": 2}),
    )]));
    let detached = gw.create(&tenant.key, request).await;
    assert_eq!(detached.status, StatusCode::OK, "{:?}", detached.body);
    assert_eq!(
        items_of(&detached.body, "function_call").len(),
        1,
        "{}",
        detached.body
    );
    assert!(items_of(&detached.body, "mcp_call").is_empty());
    assert_eq!(
        gw.tools.calls().len(),
        1,
        "the detached tool was not called again"
    );
}

#[tokio::test]
async fn withdrawing_the_project_from_its_group_makes_the_model_not_found() {
    let gw = TestGateway::start().await;
    let tenant = gw.tenant("acme").await;
    gw.model.push(Reply::text("hello"));
    let before = gw
        .create(&tenant.key, json!({"model": "mock", "input": "x"}))
        .await;
    assert_eq!(before.status, StatusCode::OK, "{:?}", before.body);

    admin(
        &gw,
        Method::DELETE,
        &format!(
            "/deployment_groups/{}/projects/{}",
            tenant.group_id, tenant.project_id
        ),
        None,
    )
    .await;
    let after = gw
        .create(&tenant.key, json!({"model": "mock", "input": "x"}))
        .await;
    assert_eq!(after.status, StatusCode::NOT_FOUND, "{:?}", after.body);
    assert_eq!(after.error()["code"], "model_not_found");

    // Detaching the deployment instead has the same effect once the grant is back.
    admin(
        &gw,
        Method::PUT,
        &format!(
            "/deployment_groups/{}/projects/{}",
            tenant.group_id, tenant.project_id
        ),
        None,
    )
    .await;
    admin(
        &gw,
        Method::DELETE,
        &format!(
            "/deployment_groups/{}/deployments/{}",
            tenant.group_id, tenant.deployment_id
        ),
        None,
    )
    .await;
    let detached = gw
        .create(&tenant.key, json!({"model": "mock", "input": "x"}))
        .await;
    assert_eq!(
        detached.status,
        StatusCode::NOT_FOUND,
        "{:?}",
        detached.body
    );
    assert_eq!(detached.error()["code"], "model_not_found");
}

#[tokio::test]
async fn invalid_bodies_are_400_naming_the_param() {
    let gw = TestGateway::start().await;
    let url = gw.model.base_url();
    let tool_url = gw.tools.url("add");
    let schema = json!({"type": "object", "properties": {"a": {"type": "number"}}});
    let cases: Vec<(Method, &str, Value, Option<&str>)> = vec![
        (Method::POST, "/projects", json!({}), Some("name")),
        (Method::POST, "/projects", json!({"name": ""}), Some("name")),
        (
            Method::POST,
            "/projects",
            json!({"name": null}),
            Some("name"),
        ),
        (Method::POST, "/projects", json!({"name": 5}), Some("name")),
        (
            Method::POST,
            "/deployment_groups",
            json!({"name": " padded "}),
            Some("name"),
        ),
        (
            Method::POST,
            "/deployments",
            json!({"provider": {"kind": "openai_chat", "base_url": url, "model": "m"}}),
            Some("name"),
        ),
        (
            Method::POST,
            "/deployments",
            json!({"name": "d"}),
            Some("provider"),
        ),
        (
            Method::POST,
            "/deployments",
            json!({"name": "d", "provider": {"kind": "cohere", "base_url": url, "model": "m"}}),
            Some("provider.kind"),
        ),
        (
            Method::POST,
            "/deployments",
            json!({"name": "d", "provider": {"base_url": url, "model": "m"}}),
            Some("provider.kind"),
        ),
        (
            Method::POST,
            "/deployments",
            json!({"name": "d", "provider": {"kind": "anthropic", "base_url": "ftp://x", "model": "m"}}),
            Some("provider.base_url"),
        ),
        (
            Method::POST,
            "/deployments",
            json!({"name": "d", "provider": {"kind": "anthropic", "base_url": "not a url", "model": "m"}}),
            Some("provider.base_url"),
        ),
        (
            Method::POST,
            "/deployments",
            json!({"name": "d", "provider": {"kind": "anthropic", "base_url": url, "model": ""}}),
            Some("provider.model"),
        ),
        (
            Method::POST,
            "/deployments",
            json!({"name": "d", "provider": {"kind": "anthropic", "base_url": url, "model": "m", "api_key": ""}}),
            Some("provider.api_key"),
        ),
        (
            Method::POST,
            "/tool_sources",
            json!({"name": "bad name!", "parameters": schema, "url": tool_url}),
            Some("name"),
        ),
        (
            Method::POST,
            "/tool_sources",
            json!({"parameters": schema, "url": tool_url}),
            Some("name"),
        ),
        (
            Method::POST,
            "/tool_sources",
            json!({"name": "t", "url": tool_url}),
            Some("parameters"),
        ),
        (
            Method::POST,
            "/tool_sources",
            json!({"name": "t", "parameters": "object", "url": tool_url}),
            Some("parameters"),
        ),
        (
            Method::POST,
            "/tool_sources",
            json!({"name": "t", "parameters": {"type": "object", "properties": {"a": {"type": "nope"}}}, "url": tool_url}),
            Some("parameters"),
        ),
        (
            Method::POST,
            "/tool_sources",
            json!({"name": "t", "parameters": {"type": "string"}, "url": tool_url}),
            Some("parameters"),
        ),
        (
            Method::POST,
            "/tool_sources",
            json!({"name": "t", "parameters": schema, "url": "localhost:9"}),
            Some("url"),
        ),
        (
            Method::POST,
            "/tool_sources",
            json!({"name": "t", "parameters": schema}),
            Some("url"),
        ),
        (
            Method::POST,
            "/tool_sources",
            json!({"name": "t", "parameters": schema, "url": tool_url, "timeout_ms": 0}),
            Some("timeout_ms"),
        ),
        (
            Method::POST,
            "/tool_sources",
            json!({"name": "t", "parameters": schema, "url": tool_url, "timeout_ms": 600_001}),
            Some("timeout_ms"),
        ),
        (
            Method::POST,
            "/tool_sources",
            json!({"name": "t", "parameters": schema, "url": tool_url, "timeout_ms": -1}),
            Some("timeout_ms"),
        ),
        (
            Method::POST,
            "/tool_sources",
            json!({"name": "t", "parameters": schema, "url": tool_url, "timeout_ms": 1.5}),
            Some("timeout_ms"),
        ),
        (
            Method::POST,
            "/tool_sources",
            json!({"name": "t", "parameters": schema, "url": tool_url, "strict": "yes"}),
            Some("strict"),
        ),
    ];
    for (method, path, body, param) in cases {
        let answer = admin(&gw, method.clone(), path, Some(body.clone())).await;
        assert_error(&answer, 400, param);
        assert_eq!(
            answer.body["error"]["type"], "invalid_request_error",
            "{method} {path} {body}"
        );
    }

    // PATCH validates the fields it is given.
    let project = id_of(
        &admin(
            &gw,
            Method::POST,
            "/projects",
            Some(json!({"name": "acme"})),
        )
        .await
        .body,
    );
    let dep = id_of(
        &admin(
            &gw,
            Method::POST,
            "/deployments",
            Some(mock_deployment(&gw, "mock")),
        )
        .await
        .body,
    );
    let tool = id_of(
        &admin(
            &gw,
            Method::POST,
            "/tool_sources",
            Some(add_tool_source(&gw, "add")),
        )
        .await
        .body,
    );
    let patches: Vec<(String, Value, &str)> = vec![
        (
            format!("/projects/{project}"),
            json!({"name": null}),
            "name",
        ),
        (format!("/projects/{project}"), json!({"name": ""}), "name"),
        (
            format!("/deployments/{dep}"),
            json!({"provider": {"kind": "bogus"}}),
            "provider.kind",
        ),
        (
            format!("/deployments/{dep}"),
            json!({"provider": {"base_url": "file:///etc/passwd"}}),
            "provider.base_url",
        ),
        (
            format!("/deployments/{dep}"),
            json!({"provider": {"model": null}}),
            "provider.model",
        ),
        (
            format!("/tool_sources/{tool}"),
            json!({"name": "has space"}),
            "name",
        ),
        (
            format!("/tool_sources/{tool}"),
            json!({"parameters": [1]}),
            "parameters",
        ),
        (
            format!("/tool_sources/{tool}"),
            json!({"url": "mailto:a@b.c"}),
            "url",
        ),
        (
            format!("/tool_sources/{tool}"),
            json!({"timeout_ms": 0}),
            "timeout_ms",
        ),
        (
            format!("/tool_sources/{tool}"),
            json!({"timeout_ms": null}),
            "timeout_ms",
        ),
    ];
    for (path, body, param) in patches {
        assert_error(
            &admin(&gw, Method::PATCH, &path, Some(body)).await,
            400,
            Some(param),
        );
    }
    // Nothing above changed anything.
    let source = admin(&gw, Method::GET, &format!("/tool_sources/{tool}"), None).await;
    assert_eq!(source.body["name"], "add");
    assert_eq!(source.body["timeout_ms"], 30000);

    // Malformed, empty and unknown-field bodies.
    for (path, text) in [
        ("/projects", "{\"name\": "),
        ("/deployments", "not json"),
        ("/tool_sources", ""),
    ] {
        let answer = admin_text(&gw, Method::POST, path, text).await;
        assert_error(&answer, 400, None);
    }
    let typo = admin(
        &gw,
        Method::POST,
        "/tool_sources",
        Some(json!({"name": "t", "parameters": schema, "url": tool_url, "secrets": "s"})),
    )
    .await;
    assert_error(&typo, 400, Some("secrets"));
    assert_eq!(typo.body["error"]["code"], "unknown_parameter");
    let nested = admin(
        &gw,
        Method::PATCH,
        &format!("/deployments/{dep}"),
        Some(json!({"provider": {"apikey": "s"}})),
    )
    .await;
    assert_error(&nested, 400, Some("provider.apikey"));
    let array = admin(&gw, Method::POST, "/projects", Some(json!(["acme"]))).await;
    assert_error(&array, 400, None);
}

#[tokio::test]
async fn unsupported_methods_and_routes_answer_in_openai_shape() {
    let gw = TestGateway::start().await;
    let answer = admin(&gw, Method::PUT, "/projects", None).await;
    assert_error(&answer, 405, None);
    let answer = admin(
        &gw,
        Method::POST,
        "/deployment_groups/grp_x/projects/proj_x",
        None,
    )
    .await;
    assert_error(&answer, 405, None);
    let answer = admin(&gw, Method::GET, "/no_such_thing", None).await;
    assert_error(&answer, 404, None);
}

#[tokio::test]
async fn a_deployment_named_as_a_fallback_or_held_by_a_group_is_deleted_only_when_forced_and_leaves_nothing_dangling(
) {
    let gw = TestGateway::start().await;
    let tenant = gw.tenant("acme").await;
    let backup = id_of(
        &admin(
            &gw,
            Method::POST,
            "/deployments",
            Some(mock_deployment(&gw, "backup")),
        )
        .await
        .body,
    );
    let patched = admin(
        &gw,
        Method::PATCH,
        &format!("/deployments/{}", tenant.deployment_id),
        Some(json!({"fallbacks": ["backup"]})),
    )
    .await;
    assert_eq!(patched.status, StatusCode::OK, "{}", patched.text);
    gw.admin_ok(
        Method::PUT,
        &format!(
            "/deployment_groups/{}/deployments/{backup}",
            tenant.group_id
        ),
        None,
    )
    .await;

    let refused = admin(&gw, Method::DELETE, &format!("/deployments/{backup}"), None).await;
    assert_error(&refused, 409, None);
    assert_eq!(refused.body["error"]["code"], "in_use");
    let message = refused.body["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        message.contains("deployment 'mock' (fallbacks)"),
        "{message}"
    );
    assert!(message.contains("group '"), "{message}");
    // Nothing changed.
    assert_eq!(
        admin(&gw, Method::GET, &format!("/deployments/{backup}"), None)
            .await
            .status,
        StatusCode::OK
    );
    let bad = admin(
        &gw,
        Method::DELETE,
        &format!("/deployments/{backup}?force=maybe"),
        None,
    )
    .await;
    assert_error(&bad, 400, Some("force"));

    let deleted = admin(
        &gw,
        Method::DELETE,
        &format!("/deployments/{backup}?force=true"),
        None,
    )
    .await;
    assert_eq!(deleted.status, StatusCode::OK, "{}", deleted.text);
    let primary = admin(
        &gw,
        Method::GET,
        &format!("/deployments/{}", tenant.deployment_id),
        None,
    )
    .await;
    assert_eq!(primary.body["fallbacks"], json!([]), "{}", primary.text);
    let group = admin(
        &gw,
        Method::GET,
        &format!("/deployment_groups/{}", tenant.group_id),
        None,
    )
    .await;
    assert_eq!(
        group.body["deployment_ids"],
        json!([tenant.deployment_id]),
        "{}",
        group.text
    );
    // A tool source a group holds is refused the same way.
    let source = id_of(
        &admin(
            &gw,
            Method::POST,
            "/tool_sources",
            Some(add_tool_source(&gw, "adder")),
        )
        .await
        .body,
    );
    gw.admin_ok(
        Method::PUT,
        &format!(
            "/deployment_groups/{}/tool_sources/{source}",
            tenant.group_id
        ),
        None,
    )
    .await;
    let refused = admin(
        &gw,
        Method::DELETE,
        &format!("/tool_sources/{source}"),
        None,
    )
    .await;
    assert_error(&refused, 409, None);
}

#[tokio::test]
async fn checking_a_deployment_calls_its_upstream_and_catches_a_base_url_without_v1() {
    let gw = TestGateway::start().await;
    let good = id_of(
        &admin(
            &gw,
            Method::POST,
            "/deployments",
            Some(mock_deployment(&gw, "good")),
        )
        .await
        .body,
    );
    let root = gw.model.base_url().trim_end_matches("/v1").to_owned();
    let unversioned = id_of(
        &admin(
            &gw,
            Method::POST,
            "/deployments",
            Some(json!({"name": "no-v1", "provider": {"kind": "openai_chat", "base_url": root, "model": "mock-model"}})),
        )
        .await
        .body,
    );
    gw.model.push(Reply::text("ok"));

    let checked = admin(
        &gw,
        Method::POST,
        &format!("/deployments/{good}/check"),
        None,
    )
    .await;
    assert_eq!(checked.status, StatusCode::OK, "{}", checked.text);
    assert_eq!(checked.body["object"], "deployment.check");
    assert_eq!(checked.body["ok"], true, "{}", checked.text);
    assert_eq!(checked.body["output_text"], "ok");
    assert!(checked.body["latency_ms"].is_u64());
    let sent = gw.model.requests();
    assert_eq!(sent.len(), 1, "one call");
    assert_eq!(sent[0]["model"], "mock-model");

    let caught = admin(
        &gw,
        Method::POST,
        &format!("/deployments/{unversioned}/check"),
        None,
    )
    .await;
    assert_eq!(caught.status, StatusCode::OK, "{}", caught.text);
    assert_eq!(caught.body["ok"], false, "{}", caught.text);
    assert_eq!(caught.body["failure"], "rejected", "{}", caught.text);
    assert_eq!(caught.body["status"], 404, "{}", caught.text);
    assert!(
        caught.body["hint"]
            .as_str()
            .is_some_and(|h| h.contains("/v1")),
        "{}",
        caught.text
    );
    assert!(
        caught.body["message"].is_string(),
        "the provider's words: {}",
        caught.text
    );

    let missing = admin(&gw, Method::POST, "/deployments/dep_missing/check", None).await;
    assert_error(&missing, 404, None);
}

#[tokio::test]
async fn a_projects_resolution_names_the_deployment_and_every_tool_a_create_is_then_offered() {
    let gw = TestGateway::start().await;
    let tenant = gw.tenant("acme").await;
    let mcp = gateway_testkit::McpServer::start()
        .await
        .expect("mcp server");
    let add = id_of(
        &admin(
            &gw,
            Method::POST,
            "/tool_sources",
            Some(add_tool_source(&gw, "add")),
        )
        .await
        .body,
    );
    let calc = id_of(
        &admin(
            &gw,
            Method::POST,
            "/tool_sources",
            Some(json!({"kind": "mcp", "name": "calc", "url": mcp.url(), "name_prefix": "calc_"})),
        )
        .await
        .body,
    );
    for source in [&add, &calc] {
        gw.admin_ok(
            Method::PUT,
            &format!(
                "/deployment_groups/{}/tool_sources/{source}",
                tenant.group_id
            ),
            None,
        )
        .await;
    }

    let resolution = admin(
        &gw,
        Method::GET,
        &format!("/projects/{}/resolution?model=mock", tenant.project_id),
        None,
    )
    .await;
    assert_eq!(resolution.status, StatusCode::OK, "{}", resolution.text);
    assert_eq!(resolution.body["object"], "project.resolution");
    assert_eq!(
        resolution.body["deployment"]["id"],
        tenant.deployment_id.as_str()
    );
    assert_eq!(resolution.body["deployment"]["kind"], "openai_chat");
    let tools = resolution.body["tools"].as_array().expect("tools");
    let calc_add = tools
        .iter()
        .find(|t| t["name"] == "calc_add")
        .expect("the MCP source's tool, listed from its server");
    assert_eq!(calc_add["tool_source"], "calc");
    assert_eq!(calc_add["kind"], "mcp");
    assert!(
        calc_add["groups"].as_array().is_some_and(|g| g.len() == 1),
        "{calc_add}"
    );
    let mut resolved: Vec<String> = tools
        .iter()
        .map(|t| t["name"].as_str().unwrap_or_default().to_owned())
        .collect();
    resolved.sort();

    gw.model.push(Reply::text("hi"));
    let body =
        crate::common::create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "hi"})).await;
    assert_eq!(body["status"], "completed");
    let mut offered: Vec<String> = gw.model.requests()[0]["tools"]
        .as_array()
        .expect("tools offered")
        .iter()
        .map(|t| {
            t["function"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    offered.sort();
    assert_eq!(
        resolved, offered,
        "what the resolution says is what a create offers"
    );

    // Each source names the groups that hold it, and shows only the fields its kind uses.
    let calc_source = admin(&gw, Method::GET, &format!("/tool_sources/{calc}"), None).await;
    assert_eq!(
        calc_source.body["groups"][0]["id"],
        tenant.group_id.as_str(),
        "{}",
        calc_source.text
    );
    assert!(calc_source.body["groups"][0]["name"].is_string());
    assert!(
        calc_source.body.get("parameters").is_none(),
        "{}",
        calc_source.text
    );
    assert!(
        calc_source.body.get("strict").is_none(),
        "{}",
        calc_source.text
    );
    assert_eq!(calc_source.body["name_prefix"], "calc_");
    let add_source = admin(&gw, Method::GET, &format!("/tool_sources/{add}"), None).await;
    assert!(
        add_source.body["parameters"].is_object(),
        "{}",
        add_source.text
    );
    assert!(
        add_source.body.get("name_prefix").is_none(),
        "{}",
        add_source.text
    );
    let listed_sources = admin(&gw, Method::GET, "/tool_sources", None).await;
    assert!(
        listed_sources.body["data"].as_array().is_some_and(|d| d
            .iter()
            .all(|s| s["groups"].as_array().is_some_and(|g| g.len() == 1))),
        "{}",
        listed_sources.text
    );
    // A group names its members.
    let group = admin(
        &gw,
        Method::GET,
        &format!("/deployment_groups/{}", tenant.group_id),
        None,
    )
    .await;
    assert_eq!(
        group.body["deployments"],
        json!([{"id": tenant.deployment_id, "name": "mock"}]),
        "{}",
        group.text
    );
    assert_eq!(
        group.body["projects"],
        json!([{"id": tenant.project_id, "name": "acme"}]),
        "{}",
        group.text
    );

    // The MCP source's own tools, and the errors.
    let listed = admin(
        &gw,
        Method::GET,
        &format!("/tool_sources/{calc}/tools"),
        None,
    )
    .await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.text);
    assert!(
        listed.body["data"].as_array().is_some_and(|d| d
            .iter()
            .any(|t| t["name"] == "calc_add" && t["parameters"].is_object())),
        "{}",
        listed.text
    );
    let unknown_model = admin(
        &gw,
        Method::GET,
        &format!("/projects/{}/resolution?model=nope", tenant.project_id),
        None,
    )
    .await;
    assert_error(&unknown_model, 404, Some("model"));
    let no_model = admin(
        &gw,
        Method::GET,
        &format!("/projects/{}/resolution", tenant.project_id),
        None,
    )
    .await;
    assert_error(&no_model, 400, None);
    assert_error(
        &admin(
            &gw,
            Method::GET,
            "/projects/proj_missing/resolution?model=mock",
            None,
        )
        .await,
        404,
        None,
    );
}

#[tokio::test]
async fn a_deployment_renamed_stays_the_fallback_of_those_that_named_it() {
    let gw = TestGateway::start().await;
    let tenant = gw.tenant("acme").await;
    let backup = id_of(
        &admin(
            &gw,
            Method::POST,
            "/deployments",
            Some(mock_deployment(&gw, "backup")),
        )
        .await
        .body,
    );
    gw.admin_ok(
        Method::PATCH,
        &format!("/deployments/{}", tenant.deployment_id),
        Some(json!({"fallbacks": ["backup"]})),
    )
    .await;

    let renamed = admin(
        &gw,
        Method::PATCH,
        &format!("/deployments/{backup}"),
        Some(json!({"name": "standby"})),
    )
    .await;
    assert_eq!(renamed.status, StatusCode::OK, "{}", renamed.text);

    let primary = gw
        .admin_ok(
            Method::GET,
            &format!("/deployments/{}", tenant.deployment_id),
            None,
        )
        .await;
    assert_eq!(primary["fallbacks"], json!(["standby"]), "{primary:#}");
    // Still referred to under its new name: its delete is refused as before.
    let refused = admin(&gw, Method::DELETE, &format!("/deployments/{backup}"), None).await;
    assert_error(&refused, 409, None);
    assert_eq!(refused.body["error"]["code"], "in_use");
    // A deployment made later under the old name is nobody's fallback.
    admin(
        &gw,
        Method::POST,
        "/deployments",
        Some(mock_deployment(&gw, "backup")),
    )
    .await;
    let primary = gw
        .admin_ok(
            Method::GET,
            &format!("/deployments/{}", tenant.deployment_id),
            None,
        )
        .await;
    assert_eq!(primary["fallbacks"], json!(["standby"]), "{primary:#}");
}
