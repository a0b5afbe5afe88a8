//! The cluster the process-level durability tests share: one database, the mock model and tool server in the
//! test process, and `gateway serve` child processes that a test starts, kills, stops or pauses for real.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use gateway_testkit::scratch::ScratchDatabase;
use gateway_testkit::tool_server::tool_definitions;
use gateway_testkit::{MockModel, ToolServer};
use serde_json::{json, Value};

/// How long a test waits for something that must happen, before it fails.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// The replicas' lease: short, so that a takeover after a kill comes quickly, yet long enough that ten gateways
/// sharing two loaded cores keep beating in time (at 1 s, a late beat let a live replica lose its response).
pub const LEASE_MS: &str = "3000";

/// One database, the mocks, and the tenant every replica serves.
pub struct Cluster {
    pub db: ScratchDatabase,
    pub model: MockModel,
    pub tools: ToolServer,
    pub admin_token: String,
    pub http: reqwest::Client,
    pub key: String,
}

/// A `gateway serve` child process.
pub struct Replica {
    pub child: Child,
    pub base_url: String,
    /// Every JSON log line the process wrote, as it wrote it.
    pub logs: std::sync::Arc<Logs>,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The log lines of a replica, and a way to wait for one.
#[derive(Default)]
pub struct Logs {
    lines: std::sync::Mutex<Vec<Value>>,
    added: tokio::sync::Notify,
}

impl Logs {
    fn push(&self, entry: Value) {
        self.lines.lock().unwrap().push(entry);
        self.added.notify_waiters();
    }

    /// Every line written so far.
    pub fn lines(&self) -> Vec<Value> {
        self.lines.lock().unwrap().clone()
    }

    /// Whether a line with this message was written.
    pub fn has(&self, message: &str) -> bool {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .any(|entry| entry["fields"]["message"] == message)
    }

    /// Waits (at most `PATIENCE`) until the lines written satisfy `done`.
    pub async fn wait_until(&self, what: &str, done: impl Fn(&[Value]) -> bool) {
        let waiting = async {
            loop {
                let added = self.added.notified();
                if done(&self.lines.lock().unwrap()) {
                    return;
                }
                added.await;
            }
        };
        tokio::time::timeout(PATIENCE, waiting)
            .await
            .unwrap_or_else(|_| panic!("never logged: {what}"));
    }

    /// Waits (at most `PATIENCE`) for a line with this message.
    pub async fn wait_for(&self, message: &str) {
        let waiting = async {
            loop {
                let added = self.added.notified();
                if self.has(message) {
                    return;
                }
                added.await;
            }
        };
        tokio::time::timeout(PATIENCE, waiting)
            .await
            .unwrap_or_else(|_| panic!("no log line '{message}'"));
    }
}

impl Replica {
    /// Pauses the process (SIGSTOP), as a stalled machine or a debugger would: it keeps its connections and
    /// does nothing, beats included.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a paused process go on (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// Kills the process (SIGKILL): nothing of it runs on, nothing is handed over.
    pub fn kill(&mut self) {
        self.child.kill().expect("kill");
        self.child.wait().expect("reap");
    }

    /// Asks the process to stop (SIGTERM), as an orchestrator does, without waiting for it to exit.
    pub fn ask_to_stop(&self) {
        self.signal("-TERM");
    }

    /// Asks the process to stop (SIGTERM), as an orchestrator does, and waits for it to exit.
    pub fn terminate(&mut self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill -TERM");
        assert!(status.success());
        let exited = self.child.wait().expect("wait");
        assert!(
            exited.success(),
            "a stopped gateway exits cleanly: {exited:?}"
        );
    }
}

impl Cluster {
    pub async fn postgres() -> Cluster {
        Cluster::on(ScratchDatabase::postgres().await.expect("database")).await
    }

    pub async fn sqlite() -> Cluster {
        Cluster::on(ScratchDatabase::sqlite()).await
    }

    pub async fn on(db: ScratchDatabase) -> Cluster {
        Cluster {
            db,
            model: MockModel::start().await.expect("mock model"),
            tools: ToolServer::start().await.expect("tool server"),
            admin_token: format!("admin-{}", std::process::id()),
            http: reqwest::Client::builder()
                .timeout(PATIENCE)
                .build()
                .expect("client"),
            key: String::new(),
        }
    }

    /// `gateway serve` on the cluster's database, with `settings` as extra `GATEWAY__…` variables.
    pub fn serve_command(&self, settings: &[(&str, &str)]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_gateway"));
        command
            .arg("serve")
            .env_remove("RUST_LOG")
            .env("DATABASE_URL", self.db.url())
            .env("GATEWAY__SERVER__BIND", "127.0.0.1:0")
            .env("GATEWAY__ADMIN__TOKEN", &self.admin_token)
            .env("GATEWAY__LOG__FORMAT", "json")
            .env("GATEWAY__LOG__FILTER", "info")
            .env("GATEWAY__DURABILITY__LEASE_MS", LEASE_MS)
            .env("GATEWAY__DURABILITY__SWEEP_INTERVAL_MS", "200")
            .env("GATEWAY__DURABILITY__WAIT_MS", "30000")
            .env("GATEWAY__UPSTREAM__BACKOFF_MS", "1")
            .stdout(Stdio::piped())
            .stderr(if std::env::var_os("GATEWAY_TEST_STDERR").is_some() {
                Stdio::inherit()
            } else {
                Stdio::null()
            });
        for (key, value) in settings {
            command.env(key, value);
        }
        command
    }

    /// Starts a replica, with `settings` as extra `GATEWAY__…` variables.
    pub fn replica(&self, settings: &[(&str, &str)]) -> Replica {
        let mut child = self.serve_command(settings).spawn().expect("start gateway");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let logs = std::sync::Arc::new(Logs::default());
        let base_url = loop {
            let line = lines
                .next()
                .expect("the gateway said where it listens")
                .expect("read stdout");
            let Ok(entry) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            let listening = (entry["fields"]["message"] == "gateway listening").then(|| {
                format!(
                    "http://{}",
                    entry["fields"]["address"].as_str().expect("address")
                )
            });
            logs.push(entry);
            if let Some(base_url) = listening {
                break base_url;
            }
        };
        // Keep reading, so that the process never blocks on a full pipe; the lines are kept for the test.
        let kept = std::sync::Arc::clone(&logs);
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                if let Ok(entry) = serde_json::from_str::<Value>(&line) {
                    kept.push(entry);
                }
            }
        });
        Replica {
            child,
            base_url,
            logs,
        }
    }

    /// Configures, through `replica`'s admin API, a project and key that may use the `mock` deployment with
    /// the server tools `gate` and `add`.
    pub async fn configure(&mut self, replica: &Replica) {
        let admin = |path: &str| format!("{}/admin/v1{path}", replica.base_url);
        let post = |path: String, body: Value| {
            self.http
                .post(path)
                .bearer_auth(&self.admin_token)
                .json(&body)
                .send()
        };
        let id = |answer: Value| answer["id"].as_str().expect("id").to_owned();
        let project = id(json(post(admin("/projects"), json!({"name": "acme"})).await).await);
        self.key = json(
            post(
                admin(&format!("/projects/{project}/api_keys")),
                json!({"name": "k"}),
            )
            .await,
        )
        .await["key"]
            .as_str()
            .expect("key")
            .to_owned();
        let deployment = id(json(
            post(
                admin("/deployments"),
                json!({"name": "mock", "provider": {"kind": "openai_chat", "base_url": self.model.base_url(), "model": "mock-model"}}),
            )
            .await,
        )
        .await);
        let group = id(json(post(admin("/deployment_groups"), json!({"name": "g"})).await).await);
        let put = |path: String| {
            self.http
                .put(admin(&path))
                .bearer_auth(&self.admin_token)
                .send()
        };
        ok(put(format!(
            "/deployment_groups/{group}/deployments/{deployment}"
        ))
        .await);
        ok(put(format!("/deployment_groups/{group}/projects/{project}")).await);
        for tool in ["gate", "add"] {
            let definition = tool_definitions()
                .into_iter()
                .find(|d| d.name == tool)
                .expect("testkit tool");
            let source = id(json(
                post(
                    admin("/tool_sources"),
                    json!({"name": tool, "description": definition.description,
                           "parameters": definition.parameters, "url": self.tools.url(tool)}),
                )
                .await,
            )
            .await);
            ok(put(format!("/deployment_groups/{group}/tool_sources/{source}")).await);
        }
    }

    /// Two replicas on Postgres, the first configured and running a background response (its id last) whose `gate`
    /// tool call is in flight.
    pub async fn two_replicas_with_a_gate_call_in_flight() -> (Cluster, Replica, Replica, String) {
        let mut cluster = Cluster::postgres().await;
        let first = cluster.replica(&[]);
        let second = cluster.replica(&[]);
        let id = cluster.gate_call_in_flight(&first).await;
        (cluster, first, second, id)
    }

    /// Configures the cluster through `replica` and starts a background response there whose `gate` tool call is
    /// in flight once this returns; its id.
    pub async fn gate_call_in_flight(&mut self, replica: &Replica) -> String {
        self.configure(replica).await;
        let id = self.background_gate_call(replica).await;
        self.gate_calls(1).await;
        id
    }

    /// `method` on `path` of `replica` with the project's key, as JSON.
    async fn ask(&self, method: reqwest::Method, replica: &Replica, path: &str) -> Value {
        json(
            self.http
                .request(method, format!("{}{path}", replica.base_url))
                .bearer_auth(&self.key)
                .send()
                .await,
        )
        .await
    }

    /// `POST /v1/responses/{id}/cancel` on `replica`, as JSON.
    pub async fn cancel(&self, replica: &Replica, id: &str) -> Value {
        let path = format!("/v1/responses/{id}/cancel");
        self.ask(reqwest::Method::POST, replica, &path).await
    }

    /// `DELETE /v1/responses/{id}` on `replica`, as JSON.
    pub async fn delete(&self, replica: &Replica, id: &str) -> Value {
        let path = format!("/v1/responses/{id}");
        self.ask(reqwest::Method::DELETE, replica, &path).await
    }

    /// An admin call through `replica`, as JSON (an error answer too).
    pub async fn admin(
        &self,
        replica: &Replica,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Value {
        let mut request = self
            .http
            .request(method, format!("{}/admin/v1{path}", replica.base_url))
            .bearer_auth(&self.admin_token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        json(request.send().await).await
    }

    /// Creates a tool source from `body` through `replica` and attaches it to the cluster's group; its id.
    pub async fn attach_tool_source(&self, replica: &Replica, body: Value) -> String {
        let source = self
            .admin(replica, reqwest::Method::POST, "/tool_sources", Some(body))
            .await;
        let source = source["id"].as_str().expect("source id").to_owned();
        let groups = self
            .admin(replica, reqwest::Method::GET, "/deployment_groups", None)
            .await;
        let group = groups["data"][0]["id"].as_str().expect("group id");
        let attached = self
            .admin(
                replica,
                reqwest::Method::PUT,
                &format!("/deployment_groups/{group}/tool_sources/{source}"),
                None,
            )
            .await;
        assert!(attached.get("error").is_none(), "{attached:#}");
        source
    }

    /// `POST /v1/responses` on `replica`, as JSON.
    pub async fn create(&self, replica: &Replica, body: Value) -> Value {
        json(
            self.http
                .post(format!("{}/v1/responses", replica.base_url))
                .bearer_auth(&self.key)
                .json(&body)
                .send()
                .await,
        )
        .await
    }

    /// A background response on `replica` that calls the `gate` tool, then answers with its result.
    pub async fn background_gate_call(&self, replica: &Replica) -> String {
        let created = self
            .create(
                replica,
                json!({"model": "mock", "input": "!call gate {}", "background": true}),
            )
            .await;
        assert_eq!(created["status"], "queued", "{created:#}");
        created["id"].as_str().expect("id").to_owned()
    }

    /// Waits until `n` calls of the `gate` tool arrived.
    pub async fn gate_calls(&self, n: usize) -> Vec<gateway_testkit::RecordedCall> {
        self.tools
            .wait_for_calls("gate", n, PATIENCE)
            .await
            .unwrap_or_else(|| panic!("{n} gate call(s) never arrived"))
    }

    /// The events of response `id` after `after`, from `replica`, followed to the response's end.
    pub async fn follow(&self, replica: &Replica, id: &str, after: Option<u64>) -> Vec<Value> {
        let mut url = format!("{}/v1/responses/{id}?stream=true", replica.base_url);
        if let Some(after) = after {
            url.push_str(&format!("&starting_after={after}"));
        }
        let response = self
            .http
            .get(url)
            .bearer_auth(&self.key)
            .send()
            .await
            .expect("re-attach");
        assert_eq!(response.status(), 200);
        events(&response.text().await.expect("the stream to its end"))
    }

    /// `GET /v1/responses/{id}` on `replica`.
    pub async fn get(&self, replica: &Replica, id: &str) -> (u16, Value) {
        let response = self
            .http
            .get(format!("{}/v1/responses/{id}", replica.base_url))
            .bearer_auth(&self.key)
            .send()
            .await
            .expect("get");
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// Response `id` once it ended, read on `replica` (following its events until the end).
    pub async fn ended(&self, replica: &Replica, id: &str) -> Value {
        let events = self.follow(replica, id, None).await;
        let terminal = events.last().expect("events");
        assert!(
            terminal["type"]
                .as_str()
                .is_some_and(|t| t != "error" && t.starts_with("response.")),
            "{terminal:#}"
        );
        let (status, body) = self.get(replica, id).await;
        assert_eq!(status, 200);
        assert_eq!(
            body, terminal["response"],
            "GET answers the terminal event's response"
        );
        body
    }

    /// How many rows of `table` the database holds.
    pub async fn count(&self, table: &str) -> i64 {
        let store = gateway::store::Store::connect(self.db.url(), 1)
            .await
            .expect("store");
        let sql = match table {
            "responses" => "SELECT COUNT(*) FROM responses",
            "steps" => "SELECT COUNT(*) FROM steps",
            other => panic!("no count for {other}"),
        };
        match store.backend() {
            gateway::store::Backend::Postgres(pool) => {
                sqlx::query_scalar(sql).fetch_one(pool).await
            }
            gateway::store::Backend::Sqlite(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
        }
        .expect("count")
    }
}

pub async fn json(response: Result<reqwest::Response, reqwest::Error>) -> Value {
    let response = response.expect("request");
    let status = response.status();
    let body: Value = response.json().await.expect("JSON body");
    assert!(status.is_success(), "{status}: {body:#}");
    body
}

pub fn ok(response: Result<reqwest::Response, reqwest::Error>) {
    let response = response.expect("request");
    assert!(response.status().is_success(), "{}", response.status());
}

/// The events of an SSE body (keep-alive comments left out).
pub fn events(body: &str) -> Vec<Value> {
    body.split("\n\n")
        .filter_map(|frame| frame.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(|data| serde_json::from_str(data).expect("event JSON"))
        .collect()
}

/// Every `Idempotency-Key` the calls were sent with.
pub fn keys(calls: &[gateway_testkit::RecordedCall]) -> Vec<String> {
    calls
        .iter()
        .map(|c| {
            c.header("idempotency-key")
                .expect("an Idempotency-Key")
                .to_owned()
        })
        .collect()
}

/// The ended response called the gate tool once (as one `mcp_call`) and answered with its result.
pub fn assert_gate_round(response: &Value) {
    assert_eq!(response["status"], "completed", "{response:#}");
    let output = response["output"].as_array().expect("output");
    assert_eq!(output[0]["type"], "mcp_call", "{response:#}");
    assert_eq!(output[0]["name"], "gate");
    assert_eq!(output[0]["status"], "completed");
    assert!(
        response["output_text"]
            .as_str()
            .is_some_and(|t| t.contains("open")),
        "{response:#}"
    );
}
