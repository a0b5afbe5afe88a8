//! What an operator sees when tools fail, tried with the real binary: one `WARN` line per failed call naming the
//! response, the tool, its source and the cause, and `gateway_tool_calls_total` split by why the call failed; and
//! a database reached over TLS, or refused at once when its TLS settings cannot be met; and admin deletes that
//! race another operator's write to what they delete.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{Cluster, Replica};
use serde_json::{json, Value};

/// Adds an HTTP tool source named `name` at `url` to the cluster's group.
async fn add_source(cluster: &Cluster, replica: &Replica, name: &str, url: &str) {
    cluster
        .attach_tool_source(
            replica,
            json!({"name": name, "description": "a tool", "url": url,
                   "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}}}),
        )
        .await;
}

/// The `tool call failed` line of response `id`.
fn failure_line(replica: &Replica, id: &str) -> Value {
    replica
        .logs
        .lines()
        .into_iter()
        .find(|l| l["fields"]["message"] == "tool call failed" && l["fields"]["response.id"] == id)
        .unwrap_or_else(|| panic!("no 'tool call failed' line for {id}"))
}

/// The value of the sample of `name` whose labels include all of `labels` (0 when absent).
fn sample(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn each_failed_tool_call_is_one_warn_line_with_its_cause_and_is_counted_by_kind() {
    let mut cluster = Cluster::postgres().await;
    let replica = cluster.replica(&[]);
    cluster.configure(&replica).await;
    // A 500, a 404, a port nothing listens on.
    add_source(&cluster, &replica, "explodes", &cluster.tools.url("fail")).await;
    add_source(
        &cluster,
        &replica,
        "missing",
        &cluster.tools.url("no_such_tool"),
    )
    .await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let dead = format!(
        "http://{}/tools/secret-path?token=abc",
        closed.local_addr().expect("addr")
    );
    drop(closed);
    add_source(&cluster, &replica, "dead", &dead).await;

    let mut ids = Vec::new();
    for input in [
        "!call explodes {}",
        "!call missing {}",
        "!call dead {}",
        "!call explodes {\"n\": \"not a number\"}",
    ] {
        let response = cluster
            .create(&replica, json!({"model": "mock", "input": input}))
            .await;
        assert_eq!(response["status"], "completed", "{response:#}");
        ids.push(response["id"].as_str().expect("id").to_owned());
    }
    replica
        .logs
        .wait_until("a failure line per response", |lines| {
            ids.iter().all(|id| {
                lines.iter().any(|l| {
                    l["fields"]["message"] == "tool call failed"
                        && l["fields"]["response.id"] == id.as_str()
                })
            })
        })
        .await;

    let explodes = failure_line(&replica, &ids[0]);
    assert_eq!(explodes["level"], "WARN");
    assert_eq!(explodes["fields"]["tool.name"], "explodes");
    assert_eq!(explodes["fields"]["tool_source.name"], "explodes");
    assert_eq!(explodes["fields"]["outcome"], "http_5xx");
    assert_eq!(explodes["fields"]["cause"], "HTTP 500");
    assert_eq!(
        explodes["span"]["response.id"],
        ids[0].as_str(),
        "the request's span names its response: {explodes}"
    );
    assert!(
        explodes["span"]["request.id"]
            .as_str()
            .is_some_and(|id| id.len() == 36),
        "and its request, by a fresh id: {explodes}"
    );
    let missing = failure_line(&replica, &ids[1]);
    assert_eq!(missing["fields"]["outcome"], "http_4xx");
    assert_eq!(missing["fields"]["cause"], "HTTP 404");
    let unreachable = failure_line(&replica, &ids[2]);
    assert_eq!(unreachable["fields"]["outcome"], "unreachable");
    let cause = unreachable["fields"]["cause"].as_str().unwrap_or_default();
    assert!(
        cause.to_lowercase().contains("refused"),
        "the root cause is named: {unreachable}"
    );
    let origin = unreachable["fields"]["tool.origin"]
        .as_str()
        .unwrap_or_default();
    assert!(origin.starts_with("http://127.0.0.1:"), "{unreachable}");
    assert!(
        !unreachable.to_string().contains("secret-path")
            && !unreachable.to_string().contains("token=abc"),
        "no path or query of the tool's URL is logged: {unreachable}"
    );
    let invalid = failure_line(&replica, &ids[3]);
    assert_eq!(invalid["fields"]["outcome"], "invalid_arguments");
    assert!(
        !invalid.to_string().contains("not a number"),
        "the model's arguments are never logged: {invalid}"
    );

    let metrics = cluster
        .http
        .get(format!("{}/metrics", replica.base_url))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    let counted = |tool: &str, outcome: &str| {
        sample(
            &metrics,
            "gateway_tool_calls_total",
            &[
                &format!("tool=\"{tool}\""),
                &format!("outcome=\"{outcome}\""),
            ],
        )
    };
    assert_eq!(counted("explodes", "http_5xx"), 1.0, "{metrics}");
    assert_eq!(counted("explodes", "invalid_arguments"), 1.0, "{metrics}");
    assert_eq!(counted("missing", "http_4xx"), 1.0, "{metrics}");
    assert!(
        metrics.contains("source=\"explodes\""),
        "labelled by source: {metrics}"
    );
    assert!(counted("dead", "unreachable") >= 1.0, "{metrics}");
    assert_eq!(
        counted("explodes", "error"),
        0.0,
        "no catch-all outcome: {metrics}"
    );
}

#[tokio::test]
async fn start_up_says_what_runs_and_names_a_variable_that_is_not_read() {
    let cluster = Cluster::postgres().await;
    let _first = cluster.replica(&[]);
    // The second start finds the migrations applied: Postgres answers `CREATE TABLE IF NOT EXISTS` with a notice.
    let replica = cluster.replica(&[("GATEWAY_ADMIN_TOKEN", "misnamed")]);

    let lines = replica.logs.lines();
    let listening = lines
        .iter()
        .find(|l| l["fields"]["message"] == "gateway listening")
        .expect("the start-up line");
    assert_eq!(listening["fields"]["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(listening["fields"]["store"], "postgres");
    assert_eq!(listening["fields"]["admin_api"], "on");
    assert_eq!(listening["fields"]["metrics_auth"], "open");
    assert!(listening["fields"]["address"].is_string());
    let misnamed = lines
        .iter()
        .find(|l| l["fields"]["variable"] == "GATEWAY_ADMIN_TOKEN")
        .expect("a warning naming the variable");
    assert_eq!(misnamed["level"], "WARN");
    assert_eq!(misnamed["fields"]["meant"], "GATEWAY__ADMIN__TOKEN");
    assert!(
        !lines
            .iter()
            .any(|l| l.to_string().contains("_sqlx_migrations")),
        "no notice of Postgres at info: {lines:#?}"
    );
}

#[tokio::test]
async fn a_keys_last_use_is_shown_and_a_revoked_keys_refusal_names_its_id() {
    let mut cluster = Cluster::postgres().await;
    let replica = cluster.replica(&[]);
    cluster.configure(&replica).await;
    let admin = |path: &str| format!("{}/admin/v1{path}", replica.base_url);
    let get = |path: String| {
        cluster
            .http
            .get(admin(&path))
            .bearer_auth(&cluster.admin_token)
            .send()
    };
    let projects = common::json(get("/projects".into()).await).await;
    let project = projects["data"][0]["id"]
        .as_str()
        .expect("project")
        .to_owned();
    let keys = common::json(get(format!("/projects/{project}/api_keys")).await).await;
    let key_id = keys["data"][0]["id"].as_str().expect("key id").to_owned();
    assert_eq!(
        keys["data"][0]["last_used_at"],
        Value::Null,
        "never used yet"
    );

    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64;
    let answer = cluster
        .create(&replica, json!({"model": "mock", "input": "hi"}))
        .await;
    assert_eq!(answer["status"], "completed", "{answer:#}");
    // The use is written off the request's path: poll the admin read until it shows.
    let mut last_used = Value::Null;
    for _ in 0..500 {
        last_used =
            common::json(get(format!("/api_keys/{key_id}")).await).await["last_used_at"].clone();
        if !last_used.is_null() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(
        last_used.as_i64().is_some_and(|at| at >= before - 1),
        "last_used_at: {last_used}"
    );

    common::ok(
        cluster
            .http
            .delete(admin(&format!("/api_keys/{key_id}")))
            .bearer_auth(&cluster.admin_token)
            .send()
            .await,
    );
    let refused = cluster
        .http
        .post(format!("{}/v1/responses", replica.base_url))
        .bearer_auth(&cluster.key)
        .json(&json!({"model": "mock", "input": "hi"}))
        .send()
        .await
        .expect("answer");
    assert_eq!(refused.status(), 401);
    replica
        .logs
        .wait_until("the refusal of the revoked key", |lines| {
            lines.iter().any(|l| {
                l["fields"]["message"] == "api key refused"
                    && l["fields"]["api_key.id"] == key_id.as_str()
                    && l["fields"]["reason"] == "revoked"
            })
        })
        .await;
    assert!(
        !replica
            .logs
            .lines()
            .iter()
            .any(|l| l.to_string().contains(&cluster.key)),
        "the key itself is never logged"
    );
}

/// The cluster's database URL with `query` (`sslmode=…`) added.
fn with_tls(cluster: &Cluster, query: &str) -> String {
    let url = cluster.db.url();
    let joiner = if url.contains('?') { '&' } else { '?' };
    format!("{url}{joiner}{query}")
}

#[tokio::test]
async fn a_replica_reaches_postgres_over_tls_when_its_url_asks_for_it() {
    let mut cluster = Cluster::postgres().await;
    let url = with_tls(&cluster, "sslmode=require");
    let replica = cluster.replica(&[("DATABASE_URL", url.as_str())]);
    cluster.configure(&replica).await;
    let created = cluster
        .create(&replica, json!({"model": "mock", "input": "over TLS"}))
        .await;
    assert_eq!(created["status"], "completed", "{created:#}");
    let (status, read) = cluster
        .get(&replica, created["id"].as_str().expect("id"))
        .await;
    assert_eq!(status, 200, "{read:#}");

    // Every session the replica holds on its database is encrypted (this one, which asks, is not one of them).
    let mut asking = <sqlx::PgConnection as sqlx::Connection>::connect(cluster.db.url())
        .await
        .expect("connect");
    let (encrypted, plain): (i64, i64) = sqlx::query_as(
        "SELECT COUNT(*) FILTER (WHERE s.ssl), COUNT(*) FILTER (WHERE NOT s.ssl)
         FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
         WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()",
    )
    .fetch_one(&mut asking)
    .await
    .expect("sessions");
    assert!(encrypted > 0, "no encrypted session");
    assert_eq!(plain, 0, "a session in the clear");
}

#[tokio::test]
async fn a_replica_whose_database_fails_its_tls_check_exits_at_once_instead_of_waiting() {
    let cluster = Cluster::postgres().await;
    // The local server's certificate is self-signed: no root of the webpki set vouches for it.
    let url = with_tls(&cluster, "sslmode=verify-full");
    let mut command = cluster.serve_command(&[("DATABASE_URL", url.as_str())]);
    command.stderr(std::process::Stdio::piped());
    let exited = tokio::time::timeout(
        common::PATIENCE,
        tokio::task::spawn_blocking(move || command.output()),
    )
    .await
    .expect("the gateway exited")
    .expect("join")
    .expect("run the gateway");

    assert!(!exited.status.success(), "it started without its database");
    let said = String::from_utf8_lossy(&exited.stdout);
    assert!(
        !said.contains("waiting for it"),
        "a failed certificate check is not waited on: {said}"
    );
    let error = String::from_utf8_lossy(&exited.stderr);
    assert!(
        error.to_lowercase().contains("certificate"),
        "the error names the certificate: {error}"
    );
}

/// What an operator's delete races with in `a_delete_*` tests: a write of another operator's, begun on the
/// database and not yet committed.
#[derive(Debug, Clone, Copy)]
enum RacingWrite {
    /// A project attached to the group being deleted.
    MemberAttached,
    /// The deployment being deleted named as another's fallback.
    FallbackNamed,
}

#[tokio::test]
async fn a_group_delete_racing_an_attach_is_refused_instead_of_dropping_the_new_member() {
    a_delete_racing(RacingWrite::MemberAttached).await;
}

#[tokio::test]
async fn a_deployment_delete_racing_a_fallback_naming_it_is_refused_instead_of_leaving_it_dangling()
{
    a_delete_racing(RacingWrite::FallbackNamed).await;
}

/// An unforced delete whose entity gains a referrer in a transaction still open when the delete starts: the
/// delete waits for it (or, without the lock, would answer at once) and, once it commits, is refused `409`
/// `in_use`, the referrer kept, rather than deleting what the other write now refers to.
async fn a_delete_racing(write: RacingWrite) {
    let mut cluster = Cluster::postgres().await;
    let replica = cluster.replica(&[]);
    cluster.configure(&replica).await;
    let (path, racing_sql, bind) = match write {
        RacingWrite::MemberAttached => {
            let group = cluster
                .admin(
                    &replica,
                    reqwest::Method::POST,
                    "/deployment_groups",
                    Some(json!({"name": "doomed"})),
                )
                .await["id"]
                .as_str()
                .expect("group")
                .to_owned();
            let project = cluster
                .admin(&replica, reqwest::Method::GET, "/projects", None)
                .await["data"][0]["id"]
                .as_str()
                .expect("project")
                .to_owned();
            (
                format!("/deployment_groups/{group}"),
                "INSERT INTO group_projects (group_id, project_id) VALUES ($1, $2)",
                (group, project),
            )
        }
        RacingWrite::FallbackNamed => {
            let backup = cluster
                .admin(
                    &replica,
                    reqwest::Method::POST,
                    "/deployments",
                    Some(json!({"name": "backup", "provider": {"kind": "openai_chat",
                    "base_url": cluster.model.base_url(), "model": "mock-model"}})),
                )
                .await["id"]
                .as_str()
                .expect("deployment")
                .to_owned();
            (
                format!("/deployments/{backup}"),
                "UPDATE deployments SET fallbacks = '[\"backup\"]' WHERE name = 'mock' AND $1 <> $2",
                (backup, String::new()),
            )
        }
    };

    let db = sqlx::PgPool::connect(cluster.db.url())
        .await
        .expect("connect");
    let mut racing = db.begin().await.expect("begin");
    sqlx::query(racing_sql)
        .bind(&bind.0)
        .bind(&bind.1)
        .execute(&mut *racing)
        .await
        .expect("the racing write");
    let delete = tokio::spawn(
        cluster
            .http
            .delete(format!("{}/admin/v1{path}", replica.base_url))
            .bearer_auth(&cluster.admin_token)
            .send(),
    );
    // The delete either answers at once (it did not wait for the racing write) or waits for a lock it holds.
    answered_or_waiting(&db, &delete).await;
    racing.commit().await.expect("commit");

    let answer = delete.await.expect("task").expect("delete");
    let status = answer.status().as_u16();
    let body: Value = answer.json().await.expect("json");
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "in_use", "{body}");
    match write {
        RacingWrite::MemberAttached => {
            let members: i64 =
                sqlx::query_scalar("SELECT count(*) FROM group_projects WHERE group_id = $1")
                    .bind(&bind.0)
                    .fetch_one(&db)
                    .await
                    .expect("members");
            assert_eq!(members, 1, "the member attached meanwhile was dropped");
            assert!(
                body["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("project 'acme'"),
                "{body}"
            );
        }
        RacingWrite::FallbackNamed => {
            let left: i64 = sqlx::query_scalar("SELECT count(*) FROM deployments WHERE id = $1")
                .bind(&bind.0)
                .fetch_one(&db)
                .await
                .expect("deployments");
            assert_eq!(left, 1, "the fallback named meanwhile points at nothing");
            assert!(
                body["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("deployment 'mock' (fallbacks)"),
                "{body}"
            );
        }
    }
}

/// A fallback named while its deployment's delete is in a transaction not yet committed: the write waits for the
/// delete and is refused `409`, instead of naming a deployment that no longer exists.
#[tokio::test]
async fn a_fallback_named_while_its_deployment_is_being_deleted_is_refused() {
    let mut cluster = Cluster::postgres().await;
    let replica = cluster.replica(&[]);
    cluster.configure(&replica).await;
    let create = |name: &'static str| {
        cluster.admin(
            &replica,
            reqwest::Method::POST,
            "/deployments",
            Some(json!({"name": name, "provider": {"kind": "openai_chat",
                "base_url": cluster.model.base_url(), "model": "mock-model"}})),
        )
    };
    let backup = create("backup").await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let primary = create("primary").await["id"]
        .as_str()
        .expect("id")
        .to_owned();

    let db = sqlx::PgPool::connect(cluster.db.url())
        .await
        .expect("connect");
    let mut deleting = db.begin().await.expect("begin");
    sqlx::query("DELETE FROM deployments WHERE id = $1")
        .bind(&backup)
        .execute(&mut *deleting)
        .await
        .expect("the racing delete");
    let patch = tokio::spawn(
        cluster
            .http
            .patch(format!(
                "{}/admin/v1/deployments/{primary}",
                replica.base_url
            ))
            .bearer_auth(&cluster.admin_token)
            .json(&json!({"fallbacks": ["backup"]}))
            .send(),
    );
    answered_or_waiting(&db, &patch).await;
    deleting.commit().await.expect("commit");

    let answer = patch.await.expect("task").expect("patch");
    let status = answer.status().as_u16();
    let body: Value = answer.json().await.expect("json");
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("'backup'"),
        "{body}"
    );
    let fallbacks: String = sqlx::query_scalar("SELECT fallbacks FROM deployments WHERE id = $1")
        .bind(&primary)
        .fetch_one(&db)
        .await
        .expect("fallbacks");
    assert_eq!(
        fallbacks, "[]",
        "a fallback names a deployment that is gone"
    );
}

/// Returns once `request` has answered or a statement on `db` waits for a lock (another's, held by the test).
async fn answered_or_waiting<T>(db: &sqlx::PgPool, request: &tokio::task::JoinHandle<T>) {
    let give_up = tokio::time::Instant::now() + common::PATIENCE;
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()",
        )
        .fetch_one(db)
        .await
        .expect("pg_stat_activity");
        if waiting > 0 || request.is_finished() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "the request neither answered nor waited"
        );
        // Polling the database: the request reaches its lock on the gateway's own time.
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
