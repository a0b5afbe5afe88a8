//! Durability with the real `gateway` binary (SPEC 9): replicas run as child processes on one Postgres database
//! (and one process on the embedded store), are killed for real (SIGKILL) or stopped (SIGTERM), and another
//! replica, or a restarted one, finishes what they left. The mock model and the tool server run in this test
//! process; the `gate` tool holds a call until the test opens it, so that a kill lands while it is in flight.
//!
//! Nothing here sleeps to synchronise: tests wait for a tool call or a model request to arrive, and follow a
//! response's event stream to its end.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use gateway_testkit::scratch::ScratchDatabase;
use gateway_testkit::tool_server::tool_definitions;
use gateway_testkit::{MockModel, Reply, ToolServer};
use serde_json::{json, Value};

/// How long a test waits for something that must happen, before it fails.
const PATIENCE: Duration = Duration::from_secs(60);

/// The replicas' lease: short, so that a takeover after a kill comes quickly, yet long enough that ten gateways
/// sharing two loaded cores keep beating in time (at 1 s, a late beat let a live replica lose its response).
const LEASE_MS: &str = "3000";

/// One database, the mocks, and the tenant every replica serves.
struct Cluster {
    db: ScratchDatabase,
    model: MockModel,
    tools: ToolServer,
    admin_token: String,
    http: reqwest::Client,
    key: String,
}

/// A `gateway serve` child process.
struct Replica {
    child: Child,
    base_url: String,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Replica {
    /// Kills the process (SIGKILL): nothing of it runs on, nothing is handed over.
    fn kill(&mut self) {
        self.child.kill().expect("kill");
        self.child.wait().expect("reap");
    }

    /// Asks the process to stop (SIGTERM), as an orchestrator does, and waits for it to exit.
    fn terminate(&mut self) {
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
    async fn postgres() -> Cluster {
        Cluster::on(ScratchDatabase::postgres().await.expect("database")).await
    }

    async fn sqlite() -> Cluster {
        Cluster::on(ScratchDatabase::sqlite()).await
    }

    async fn on(db: ScratchDatabase) -> Cluster {
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
    fn serve_command(&self, settings: &[(&str, &str)]) -> Command {
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
            .stderr(Stdio::null());
        for (key, value) in settings {
            command.env(key, value);
        }
        command
    }

    /// Starts a replica, with `settings` as extra `GATEWAY__…` variables.
    fn replica(&self, settings: &[(&str, &str)]) -> Replica {
        let mut child = self.serve_command(settings).spawn().expect("start gateway");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let base_url = loop {
            let line = lines
                .next()
                .expect("the gateway said where it listens")
                .expect("read stdout");
            let Ok(entry) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if entry["fields"]["message"] == "gateway listening" {
                break format!(
                    "http://{}",
                    entry["fields"]["address"].as_str().expect("address")
                );
            }
        };
        // Keep reading, so that the process never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Replica { child, base_url }
    }

    /// Configures, through `replica`'s admin API, a project and key that may use the `mock` deployment with
    /// the server tools `gate` and `add`.
    async fn configure(&mut self, replica: &Replica) {
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

    /// `POST /v1/responses` on `replica`, as JSON.
    async fn create(&self, replica: &Replica, body: Value) -> Value {
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
    async fn background_gate_call(&self, replica: &Replica) -> String {
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
    async fn gate_calls(&self, n: usize) -> Vec<gateway_testkit::RecordedCall> {
        self.tools
            .wait_for_calls("gate", n, PATIENCE)
            .await
            .unwrap_or_else(|| panic!("{n} gate call(s) never arrived"))
    }

    /// The events of response `id` after `after`, from `replica`, followed to the response's end.
    async fn follow(&self, replica: &Replica, id: &str, after: Option<u64>) -> Vec<Value> {
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
    async fn get(&self, replica: &Replica, id: &str) -> (u16, Value) {
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
    async fn ended(&self, replica: &Replica, id: &str) -> Value {
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
    async fn count(&self, table: &str) -> i64 {
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

async fn json(response: Result<reqwest::Response, reqwest::Error>) -> Value {
    let response = response.expect("request");
    let status = response.status();
    let body: Value = response.json().await.expect("JSON body");
    assert!(status.is_success(), "{status}: {body:#}");
    body
}

fn ok(response: Result<reqwest::Response, reqwest::Error>) {
    let response = response.expect("request");
    assert!(response.status().is_success(), "{}", response.status());
}

/// The events of an SSE body (keep-alive comments left out).
fn events(body: &str) -> Vec<Value> {
    body.split("\n\n")
        .filter_map(|frame| frame.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(|data| serde_json::from_str(data).expect("event JSON"))
        .collect()
}

/// Every `Idempotency-Key` the calls were sent with.
fn keys(calls: &[gateway_testkit::RecordedCall]) -> Vec<String> {
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
fn assert_gate_round(response: &Value) {
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

#[tokio::test]
async fn a_replica_killed_mid_tool_call_is_restarted_and_the_response_completes_with_the_call_sent_again_under_its_key(
) {
    let mut cluster = Cluster::postgres().await;
    let mut first = cluster.replica(&[]);
    cluster.configure(&first).await;
    let id = cluster.background_gate_call(&first).await;
    cluster.gate_calls(1).await;

    first.kill();
    let restarted = cluster.replica(&[]);
    let calls = cluster.gate_calls(2).await;
    cluster.tools.open_gate();
    let response = cluster.ended(&restarted, &id).await;

    assert_gate_round(&response);
    assert_eq!(calls.len(), 2, "sent once, then once more after the crash");
    let keys = keys(&calls);
    assert_eq!(keys[0], keys[1], "one Idempotency-Key: {keys:?}");
}

#[tokio::test]
async fn a_replica_killed_mid_model_call_is_restarted_and_the_model_is_called_again() {
    let mut cluster = Cluster::postgres().await;
    let mut first = cluster.replica(&[]);
    cluster.configure(&first).await;
    cluster
        .model
        .push(Reply::text("Never delivered.").with_delay(Duration::from_secs(300)));
    cluster.model.push(Reply::text("Recovered."));
    let created = cluster
        .create(
            &first,
            json!({"model": "mock", "input": "Hi", "background": true}),
        )
        .await;
    let id = created["id"].as_str().expect("id").to_owned();
    assert!(cluster.model.wait_for_requests(1, PATIENCE).await);

    first.kill();
    let restarted = cluster.replica(&[]);
    let response = cluster.ended(&restarted, &id).await;

    assert_eq!(response["status"], "completed", "{response:#}");
    assert_eq!(response["output_text"], "Recovered.");
    assert_eq!(cluster.model.requests().len(), 2);
}

#[tokio::test]
async fn when_one_of_two_replicas_is_killed_the_other_finishes_its_response_without_a_restart() {
    let mut cluster = Cluster::postgres().await;
    let mut doomed = cluster.replica(&[]);
    let survivor = cluster.replica(&[]);
    cluster.configure(&doomed).await;
    let id = cluster.background_gate_call(&doomed).await;
    cluster.gate_calls(1).await;

    doomed.kill();
    let calls = cluster.gate_calls(2).await;
    cluster.tools.open_gate();
    let response = cluster.ended(&survivor, &id).await;

    assert_gate_round(&response);
    let keys = keys(&calls);
    assert_eq!(keys[0], keys[1], "{keys:?}");
}

#[tokio::test]
async fn a_background_response_answers_queued_at_once_and_completes_while_polled() {
    let mut cluster = Cluster::postgres().await;
    let replica = cluster.replica(&[]);
    cluster.configure(&replica).await;

    let id = cluster.background_gate_call(&replica).await;
    cluster.gate_calls(1).await;
    let (status, running) = cluster.get(&replica, &id).await;
    assert_eq!(status, 200);
    assert_eq!(running["status"], "in_progress", "{running:#}");
    assert_eq!(running["background"], true);
    cluster.tools.open_gate();

    let response = cluster.ended(&replica, &id).await;
    assert_gate_round(&response);
    assert_eq!(response["background"], true);
}

#[tokio::test]
async fn a_cancel_through_another_replica_stops_the_run_and_aborts_its_tool_call() {
    let mut cluster = Cluster::postgres().await;
    let owner = cluster.replica(&[]);
    let other = cluster.replica(&[]);
    cluster.configure(&owner).await;
    let id = cluster.background_gate_call(&owner).await;
    cluster.gate_calls(1).await;

    let cancelled = json(
        cluster
            .http
            .post(format!("{}/v1/responses/{id}/cancel", other.base_url))
            .bearer_auth(&cluster.key)
            .send()
            .await,
    )
    .await;

    assert_eq!(cancelled["status"], "cancelled", "{cancelled:#}");
    let call = &cancelled["output"][0];
    assert_eq!(call["type"], "mcp_call");
    assert_eq!(call["status"], "failed", "the call in flight was aborted");
    assert_eq!(cluster.get(&owner, &id).await.1, cancelled);
    // Cancelling again answers the same response.
    let again = json(
        cluster
            .http
            .post(format!("{}/v1/responses/{id}/cancel", owner.base_url))
            .bearer_auth(&cluster.key)
            .send()
            .await,
    )
    .await;
    assert_eq!(again, cancelled);
    cluster.tools.open_gate();
    assert_eq!(
        cluster.model.requests().len(),
        1,
        "the model is not called again"
    );
}

#[tokio::test]
async fn a_running_response_deleted_through_another_replica_is_cancelled_then_gone() {
    let mut cluster = Cluster::postgres().await;
    let owner = cluster.replica(&[]);
    let other = cluster.replica(&[]);
    cluster.configure(&owner).await;
    let id = cluster.background_gate_call(&owner).await;
    cluster.gate_calls(1).await;

    let deleted = json(
        cluster
            .http
            .delete(format!("{}/v1/responses/{id}", other.base_url))
            .bearer_auth(&cluster.key)
            .send()
            .await,
    )
    .await;

    assert_eq!(
        deleted,
        json!({"id": id, "object": "response", "deleted": true})
    );
    assert_eq!(cluster.get(&owner, &id).await.0, 404);
    assert_eq!(cluster.get(&other, &id).await.0, 404);
    assert_eq!(cluster.count("responses").await, 0);
    assert_eq!(cluster.count("steps").await, 0);
}

#[tokio::test]
async fn a_stream_re_attached_after_a_disconnect_and_after_its_replica_died_goes_on_with_the_same_numbers(
) {
    let mut cluster = Cluster::postgres().await;
    let mut owner = cluster.replica(&[]);
    let other = cluster.replica(&[]);
    cluster.configure(&owner).await;
    let stream = cluster
        .http
        .post(format!("{}/v1/responses", owner.base_url))
        .bearer_auth(&cluster.key)
        .json(
            &json!({"model": "mock", "input": "!call gate {}", "background": true, "stream": true}),
        )
        .send()
        .await
        .expect("stream");
    // Read until the tool call is under way, then hang up.
    let mut seen = Vec::new();
    let mut body = stream;
    let mut buffer = String::new();
    'reading: while let Some(chunk) = body.chunk().await.expect("chunk") {
        buffer.push_str(std::str::from_utf8(&chunk).expect("utf-8"));
        while let Some(end) = buffer.find("\n\n") {
            let frame: String = buffer.drain(..end + 2).collect();
            seen.extend(events(&frame));
            if seen
                .last()
                .is_some_and(|e| e["type"] == "response.mcp_call.in_progress")
            {
                break 'reading;
            }
        }
    }
    drop(body);
    let last = seen.last().expect("events")["sequence_number"]
        .as_u64()
        .expect("a sequence number");

    let id = seen[0]["response"]["id"].as_str().expect("id").to_owned();

    // Re-attached through the other replica after the disconnect, while the owner still runs it ...
    let follower = tokio::spawn({
        let http = cluster.http.clone();
        let url = format!(
            "{}/v1/responses/{id}?stream=true&starting_after={last}",
            other.base_url
        );
        let key = cluster.key.clone();
        async move {
            let response = http
                .get(url)
                .bearer_auth(key)
                .send()
                .await
                .expect("re-attach");
            assert_eq!(response.status(), 200);
            events(&response.text().await.expect("to the end"))
        }
    });
    // ... then the owner dies: the other replica takes the response over, and the stream follows it there.
    owner.kill();
    cluster.gate_calls(2).await;
    cluster.tools.open_gate();
    let rest = follower.await.expect("follower");

    let numbers: Vec<u64> = rest
        .iter()
        .map(|e| e["sequence_number"].as_u64().expect("number"))
        .collect();
    assert_eq!(numbers[0], last + 1, "it goes on where the client was");
    assert!(numbers.windows(2).all(|w| w[1] == w[0] + 1), "{numbers:?}");
    assert_eq!(rest.last().expect("events")["type"], "response.completed");
    // Everything, from the start, equals what the client saw and then what it read on.
    let all = cluster.follow(&other, &id, None).await;
    let joined: Vec<Value> = seen.into_iter().chain(rest).collect();
    assert_eq!(all, joined);
}

#[tokio::test]
async fn a_replica_stopped_with_sigterm_hands_its_response_over_at_once() {
    let mut cluster = Cluster::postgres().await;
    // A lease far longer than this test waits: only the hand-over can move the response in time.
    let long_lease = [
        ("GATEWAY__DURABILITY__LEASE_MS", "600000"),
        ("GATEWAY__SERVER__SHUTDOWN_GRACE_MS", "100"),
    ];
    let mut stopping = cluster.replica(&long_lease);
    let successor = cluster.replica(&long_lease);
    cluster.configure(&stopping).await;
    let id = cluster.background_gate_call(&stopping).await;
    cluster.gate_calls(1).await;

    stopping.terminate();
    let calls = cluster.gate_calls(2).await;
    cluster.tools.open_gate();
    let response = cluster.ended(&successor, &id).await;

    assert_gate_round(&response);
    let keys = keys(&calls);
    assert_eq!(keys[0], keys[1], "{keys:?}");
}

#[tokio::test]
async fn a_create_retried_with_its_idempotency_key_after_a_crash_answers_the_response_once_it_ends()
{
    let mut cluster = Cluster::postgres().await;
    let mut first = cluster.replica(&[]);
    let second = cluster.replica(&[]);
    cluster.configure(&first).await;
    let create = |replica: &Replica| {
        cluster
            .http
            .post(format!("{}/v1/responses", replica.base_url))
            .bearer_auth(&cluster.key)
            .header("Idempotency-Key", "order-42")
            .json(&json!({"model": "mock", "input": "!call gate {}"}))
            .send()
    };
    let cut_off = create(&first);
    let cut_off = tokio::spawn(cut_off);
    cluster.gate_calls(1).await;
    first.kill();
    assert!(
        cut_off.await.expect("task").is_err(),
        "the client's connection died with the replica"
    );

    let retried = tokio::spawn(create(&second));
    cluster.gate_calls(2).await;
    cluster.tools.open_gate();
    let answer = json(retried.await.expect("task")).await;

    assert_gate_round(&answer);
    assert_eq!(
        cluster.count("responses").await,
        1,
        "one response for one key"
    );
}

#[tokio::test]
async fn the_embedded_store_resumes_at_start_up_what_a_killed_process_left() {
    let mut cluster = Cluster::sqlite().await;
    let mut first = cluster.replica(&[]);
    cluster.configure(&first).await;
    let id = cluster.background_gate_call(&first).await;
    cluster.gate_calls(1).await;

    first.kill();
    let restarted = cluster.replica(&[]);
    let calls = cluster.gate_calls(2).await;
    cluster.tools.open_gate();
    let response = cluster.ended(&restarted, &id).await;

    assert_gate_round(&response);
    let keys = keys(&calls);
    assert_eq!(keys[0], keys[1], "{keys:?}");
}

#[tokio::test]
async fn a_second_gateway_on_the_same_embedded_store_refuses_to_start_and_the_first_keeps_its_run()
{
    let mut cluster = Cluster::sqlite().await;
    let first = cluster.replica(&[]);
    cluster.configure(&first).await;
    let id = cluster.background_gate_call(&first).await;
    cluster.gate_calls(1).await;

    // Run to its end: it either exits (refused) or says it listens (it took the store), never both.
    let mut second = cluster.serve_command(&[]);
    second.stderr(Stdio::piped());
    let mut second = second.spawn().expect("start the second gateway");
    let stdout = second.stdout.take().expect("stdout");
    let listening = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|line| line.contains("gateway listening"));
    if listening {
        let _ = second.kill();
    }
    let output = second.wait_with_output().expect("the second gateway ends");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!listening, "the second gateway served the same store");
    assert!(!output.status.success(), "{:?}", output.status);
    assert!(
        stderr.contains("used by another gateway process") && stderr.contains("gateway.db"),
        "the refusal names the file and why: {stderr}"
    );

    cluster.tools.open_gate();
    let response = cluster.ended(&first, &id).await;
    assert_gate_round(&response);
    assert_eq!(
        cluster.gate_calls(1).await.len(),
        1,
        "the first gateway's run was never taken over and sent again"
    );
}
