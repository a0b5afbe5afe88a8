//! Harness of the end-to-end tests: a fresh Postgres database (or embedded SQLite file) per test, the
//! testkit's mock model and tool server, and the real gateway on port 0, all talking real HTTP.
//!
//! `TestGateway::start` runs on Postgres unless `GATEWAY_TEST_STORE=sqlite`, which runs the whole suite on the
//! embedded store; `TestGateway::start_embedded` always uses the embedded store.
//!
//! Test-support code: a setup step that fails must fail the test at once, so `expect` is the right tool here.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::time::Duration;

use gateway::config::Config;
use gateway::store::{Backend, Store};
use gateway::Application;
use gateway_testkit::mock_model::MockModel;
pub use gateway_testkit::scratch::ScratchDatabase;
use gateway_testkit::tool_server::{misbehaving_tool_definitions, tool_definitions, ToolServer};
use reqwest::{Method, RequestBuilder, StatusCode};
use serde_json::{json, Value};

/// A fresh database of the suite's store: Postgres, or SQLite when `GATEWAY_TEST_STORE=sqlite`.
pub async fn scratch_database() -> ScratchDatabase {
    if std::env::var("GATEWAY_TEST_STORE").is_ok_and(|store| store == "sqlite") {
        return ScratchDatabase::sqlite();
    }
    ScratchDatabase::postgres().await.expect("test database")
}

/// A running gateway with its mock upstream, tool server and database.
pub struct TestGateway {
    pub base_url: String,
    pub admin_token: String,
    pub http: reqwest::Client,
    pub model: MockModel,
    pub tools: ToolServer,
    pub store: Store,
    _server: tokio::task::JoinHandle<()>,
    _db: ScratchDatabase,
}

/// A project with a key that may use the `mock` deployment.
#[derive(Debug, Clone)]
pub struct Tenant {
    pub project_id: String,
    pub key_id: String,
    pub key: String,
    pub group_id: String,
    pub deployment_id: String,
}

/// What a response call returned.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
}

impl Answer {
    /// The `error` object of an error answer.
    pub fn error(&self) -> &Value {
        &self.body["error"]
    }
}

impl TestGateway {
    pub async fn start() -> TestGateway {
        TestGateway::start_with(|_| {}).await
    }

    /// Starts everything, letting the test adjust the gateway's config first.
    pub async fn start_with(adjust: impl FnOnce(&mut Config)) -> TestGateway {
        TestGateway::launch(scratch_database().await, adjust).await
    }

    /// Starts everything on the embedded store: a fresh SQLite file in a temp dir, which the gateway finds
    /// through the database URL of its config, as a deployment would.
    pub async fn start_embedded() -> TestGateway {
        TestGateway::start_embedded_with(|_| {}).await
    }

    /// Like `start_embedded`, letting the test adjust the gateway's config first.
    pub async fn start_embedded_with(adjust: impl FnOnce(&mut Config)) -> TestGateway {
        TestGateway::launch(ScratchDatabase::sqlite(), adjust).await
    }

    async fn launch(db: ScratchDatabase, adjust: impl FnOnce(&mut Config)) -> TestGateway {
        let model = MockModel::start().await.expect("mock model");
        let tools = ToolServer::start().await.expect("tool server");
        let admin_token = format!("admin-{}", uuid::Uuid::new_v4().simple());
        let mut config = Config::default();
        config.server.bind = "127.0.0.1:0".parse().expect("address");
        config.admin.token = Some(admin_token.clone().into());
        config.database.max_connections = 5;
        config.upstream.backoff_ms = 1;
        config.durability.sweep_interval_ms = 100;
        config.database.url = Some(db.url().to_owned().into());
        adjust(&mut config);
        let app = Application::build(config).await.expect("build gateway");
        let store = app.store().clone();
        let base_url = format!("http://127.0.0.1:{}", app.port());
        let server = tokio::spawn(async move {
            let _ = app.run_until(std::future::pending()).await;
        });
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .expect("http client");
        TestGateway {
            base_url,
            admin_token,
            http,
            model,
            tools,
            store,
            _server: server,
            _db: db,
        }
    }

    /// Runs a fixture statement with one text parameter (`$1`) on whichever database the gateway uses;
    /// returns the rows it changed. For tests that stage a state the API cannot reach.
    pub async fn execute(&self, sql: &str, param: &str) -> u64 {
        let done = match self.store.backend() {
            Backend::Postgres(pool) => sqlx::query(sql)
                .bind(param)
                .execute(pool)
                .await
                .map(|d| d.rows_affected()),
            Backend::Sqlite(pool) => sqlx::query(sql)
                .bind(param)
                .execute(pool)
                .await
                .map(|d| d.rows_affected()),
        };
        done.expect("fixture statement")
    }

    /// Runs a fixture script of one or more statements without parameters, the one written for whichever
    /// database the gateway uses (DDL, say: a table renamed, a trigger that refuses writes).
    pub async fn run_script(&self, postgres: &str, sqlite: &str) {
        let done = match self.store.backend() {
            Backend::Postgres(pool) => sqlx::raw_sql(postgres).execute(pool).await.map(drop),
            Backend::Sqlite(pool) => sqlx::raw_sql(sqlite).execute(pool).await.map(drop),
        };
        done.expect("fixture script");
    }

    /// The single integer a query answers (e.g. a `count(*)`), on whichever database the gateway uses.
    pub async fn fetch_i64(&self, sql: &str) -> i64 {
        let value = match self.store.backend() {
            Backend::Postgres(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
            Backend::Sqlite(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
        };
        value.expect("integer query")
    }

    /// The rows of a query that answers two text columns, on whichever database the gateway uses.
    pub async fn fetch_text_pairs(&self, sql: &str) -> Vec<(String, String)> {
        let rows = match self.store.backend() {
            Backend::Postgres(pool) => sqlx::query_as(sql).fetch_all(pool).await,
            Backend::Sqlite(pool) => sqlx::query_as(sql).fetch_all(pool).await,
        };
        rows.expect("text pairs query")
    }

    /// A request to the admin API, authenticated.
    pub fn admin(&self, method: Method, path: &str) -> RequestBuilder {
        self.http
            .request(method, format!("{}/admin/v1{path}", self.base_url))
            .bearer_auth(&self.admin_token)
    }

    /// An admin call that must succeed; returns its JSON body (or `null` for an empty one).
    pub async fn admin_ok(&self, method: Method, path: &str, body: Option<Value>) -> Value {
        let mut request = self.admin(method.clone(), path);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("admin request");
        let status = response.status();
        let text = response.text().await.expect("admin body");
        assert!(
            status.is_success(),
            "{method} {path} answered {status}: {text}"
        );
        if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).expect("admin JSON")
        }
    }

    /// Creates a project with a key, granted a group holding a `mock` deployment backed by the mock model.
    /// The group and deployment are shared by every tenant of this gateway (created once).
    pub async fn tenant(&self, name: &str) -> Tenant {
        let deployments = self.admin_ok(Method::GET, "/deployments", None).await;
        let existing = deployments["data"]
            .as_array()
            .and_then(|d| d.iter().find(|d| d["name"] == "mock"))
            .cloned();
        let deployment_id = match existing {
            Some(d) => d["id"].as_str().expect("id").to_owned(),
            None => {
                let d = self
                    .admin_ok(
                        Method::POST,
                        "/deployments",
                        Some(json!({"name": "mock", "provider": {"kind": "openai_chat", "base_url": self.model.base_url(), "model": "mock-model"}})),
                    )
                    .await;
                d["id"].as_str().expect("id").to_owned()
            }
        };
        let groups = self.admin_ok(Method::GET, "/deployment_groups", None).await;
        let existing = groups["data"]
            .as_array()
            .and_then(|g| g.iter().find(|g| g["name"] == "default"))
            .cloned();
        let group_id = match existing {
            Some(g) => g["id"].as_str().expect("id").to_owned(),
            None => {
                let g = self
                    .admin_ok(
                        Method::POST,
                        "/deployment_groups",
                        Some(json!({"name": "default"})),
                    )
                    .await;
                let id = g["id"].as_str().expect("id").to_owned();
                self.admin_ok(
                    Method::PUT,
                    &format!("/deployment_groups/{id}/deployments/{deployment_id}"),
                    None,
                )
                .await;
                id
            }
        };
        let project = self
            .admin_ok(Method::POST, "/projects", Some(json!({"name": name})))
            .await;
        let project_id = project["id"].as_str().expect("id").to_owned();
        self.admin_ok(
            Method::PUT,
            &format!("/deployment_groups/{group_id}/projects/{project_id}"),
            None,
        )
        .await;
        let key = self
            .admin_ok(
                Method::POST,
                &format!("/projects/{project_id}/api_keys"),
                Some(json!({"name": "test"})),
            )
            .await;
        Tenant {
            project_id,
            key_id: key["id"].as_str().expect("id").to_owned(),
            key: key["key"].as_str().expect("key").to_owned(),
            group_id,
            deployment_id,
        }
    }

    /// Registers the testkit tool `tool` as a tool source and attaches it to `group_id`.
    pub async fn attach_tool(&self, group_id: &str, tool: &str) -> String {
        self.attach_tool_with(group_id, tool, json!({})).await
    }

    /// Like `attach_tool`, with extra tool-source fields (e.g. `timeout_ms`, `secret`).
    pub async fn attach_tool_with(&self, group_id: &str, tool: &str, extra: Value) -> String {
        let definition = tool_definitions()
            .into_iter()
            .chain(misbehaving_tool_definitions())
            .find(|d| d.name == tool)
            .expect("testkit tool");
        let mut body = json!({
            "name": tool,
            "description": definition.description,
            "parameters": definition.parameters,
            "url": self.tools.url(tool),
        });
        if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
            body.extend(extra.clone());
        }
        let source = self
            .admin_ok(Method::POST, "/tool_sources", Some(body))
            .await;
        let id = source["id"].as_str().expect("id").to_owned();
        self.admin_ok(
            Method::PUT,
            &format!("/deployment_groups/{group_id}/tool_sources/{id}"),
            None,
        )
        .await;
        id
    }

    /// A request to the public API with `key`.
    pub fn public(&self, method: Method, path: &str, key: &str) -> RequestBuilder {
        self.http
            .request(method, format!("{}/v1{path}", self.base_url))
            .bearer_auth(key)
    }

    /// `POST /v1/responses` with a JSON body.
    pub async fn create(&self, key: &str, body: Value) -> Answer {
        answer(self.public(Method::POST, "/responses", key).json(&body)).await
    }

    /// Any public call, answered as JSON.
    pub async fn call(&self, request: RequestBuilder) -> Answer {
        answer(request).await
    }
}

async fn answer(request: RequestBuilder) -> Answer {
    let response = request.send().await.expect("request");
    let status = response.status();
    let headers = response.headers().clone();
    let text = response.text().await.expect("body");
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Answer {
        status,
        headers,
        body,
    }
}

/// Output items of a response body of the given `type`.
pub fn items_of<'a>(response: &'a Value, kind: &str) -> Vec<&'a Value> {
    response["output"]
        .as_array()
        .map(|o| o.iter().filter(|i| i["type"] == kind).collect())
        .unwrap_or_default()
}
