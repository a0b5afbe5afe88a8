//! Faults the durable loop must survive (SPEC 9), injected for real into `gateway serve` child processes: a
//! replica paused with SIGSTOP while another takes its response over, database connections cut at random moments
//! under a load of tool rounds, a replica whose request pool is full while hundreds of followers read, and a
//! client that leaves while its create's first write waits.
//!
//! Nothing here sleeps to synchronise: tests wait for tool calls, log lines, or rows in the database.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::*;
use gateway_testkit::FaultProxy;
use serde_json::json;

/// Counts the responses of the database at `url` by status.
async fn statuses(url: &str) -> BTreeMap<String, i64> {
    let pool = sqlx::PgPool::connect(url).await.expect("connect");
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT status, COUNT(*) FROM responses GROUP BY status")
            .fetch_all(&pool)
            .await
            .expect("count");
    pool.close().await;
    rows.into_iter().collect()
}

/// Waits, at most `within`, until no response of the database at `url` is queued or in progress.
async fn all_ended(url: &str, within: Duration) -> BTreeMap<String, i64> {
    let give_up = tokio::time::Instant::now() + within;
    loop {
        let counts = statuses(url).await;
        let running = counts.get("queued").copied().unwrap_or(0)
            + counts.get("in_progress").copied().unwrap_or(0);
        if running == 0 {
            return counts;
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "responses still running after {within:?}: {counts:?}"
        );
        // Polling the database: the condition is outside this process.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn a_paused_replica_whose_response_was_taken_over_calls_and_writes_nothing_when_it_comes_back(
) {
    let (cluster, paused, other, id) = Cluster::two_replicas_with_a_gate_call_in_flight().await;

    // Frozen with its tool call in flight; the other replica takes the response over once the lease ran out, and
    // finishes it.
    paused.pause();
    let calls = cluster.gate_calls(2).await;
    cluster.tools.open_gate();
    let finished = cluster.ended(&other, &id).await;
    assert_gate_round(&finished);
    let model_calls = cluster.model.requests().len();
    assert_eq!(
        model_calls, 2,
        "the call that asked for the tool, then the one that read its result"
    );

    // Back to life: its tool call's answer is waiting for it. It learns that its lease lapsed and that the
    // response is another's, and gives it up without a model call or a write.
    paused.resume();
    paused
        .logs
        .wait_for(
            "another replica took this response over while this one's lease lapsed; giving it up",
        )
        .await;
    paused
        .logs
        .wait_for("response handed over before it ended")
        .await;
    assert_eq!(
        cluster.model.requests().len(),
        model_calls,
        "no second model call"
    );
    assert_eq!(
        cluster.tools.calls().len(),
        calls.len(),
        "no tool call either"
    );
    let (status, now) = cluster.get(&other, &id).await;
    assert_eq!(status, 200);
    assert_eq!(now, finished, "nothing written over the finished response");
}

/// Waits until the lease of every replica of the cluster ran out by its heartbeat: its last beat is older than a
/// lease, as a replica looking for work would judge it.
async fn leases_lapsed(cluster: &Cluster) {
    let store = gateway::store::Store::connect(cluster.db.url(), 1)
        .await
        .expect("store");
    let sql = "SELECT MAX(heartbeat_at) FROM replicas";
    let lease: i64 = LEASE_MS.parse().expect("lease");
    tokio::time::timeout(PATIENCE, async {
        loop {
            let last: Option<i64> = match store.backend() {
                gateway::store::Backend::Postgres(pool) => {
                    sqlx::query_scalar(sql).fetch_one(pool).await
                }
                gateway::store::Backend::Sqlite(pool) => {
                    sqlx::query_scalar(sql).fetch_one(pool).await
                }
            }
            .expect("heartbeats");
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock")
                .as_millis() as i64;
            if last.is_some_and(|at| now - at > lease) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the lease ran out");
}

/// A replica alone on its store, paused past its lease with a tool call in flight, goes on with its run when it
/// comes back: it does not take its own response again and send the call a second time.
async fn a_lone_replica_paused_past_its_lease_goes_on_with_its_own_run(mut cluster: Cluster) {
    let replica = cluster.replica(&[]);
    let id = cluster.gate_call_in_flight(&replica).await;
    replica.pause();
    leases_lapsed(&cluster).await;
    replica.resume();
    replica
        .logs
        .wait_for("this replica's lease lapsed; checking which responses are still its own")
        .await;
    cluster.tools.open_gate();
    let finished = cluster.ended(&replica, &id).await;
    assert_gate_round(&finished);
    assert_eq!(
        cluster
            .tools
            .calls()
            .iter()
            .filter(|call| call.tool == "gate")
            .count(),
        1,
        "the call went out once"
    );
    assert!(
        !replica.logs.has("response handed over before it ended"),
        "its run was not taken from it"
    );
}

#[tokio::test]
async fn a_lone_replica_on_postgres_paused_past_its_lease_goes_on_with_its_own_run() {
    a_lone_replica_paused_past_its_lease_goes_on_with_its_own_run(Cluster::postgres().await).await;
}

#[tokio::test]
async fn a_process_on_the_embedded_store_paused_past_its_lease_goes_on_with_its_own_run() {
    a_lone_replica_paused_past_its_lease_goes_on_with_its_own_run(Cluster::sqlite().await).await;
}

// The proxy must forward while the test starts the replicas (which blocks its thread reading their output).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_connections_cut_at_random_moments_leave_no_response_unfinished_and_no_step_under_two_keys(
) {
    let mut cluster = Cluster::postgres().await;
    let (proxy, through_proxy) = through_fault_proxy(&cluster, 0x5eed).await;
    let settings = [
        ("DATABASE_URL", through_proxy.as_str()),
        ("GATEWAY__LIMITS__RESPONSE_DEADLINE_MS", "20000"),
        ("GATEWAY__DATABASE__ACQUIRE_TIMEOUT_MS", "1000"),
    ];
    let first = cluster.replica(&settings);
    let second = cluster.replica(&settings);
    cluster.configure(&first).await;

    // A load of tool rounds while connections are cut, mid-statement and after commits alike.
    proxy.cut();
    let mut accepted = Vec::new();
    for n in 0..40 {
        let replica = if n % 2 == 0 { &first } else { &second };
        let created = cluster
            .http
            .post(format!("{}/v1/responses", replica.base_url))
            .bearer_auth(&cluster.key)
            .json(&json!({"model": "mock", "input": format!("!call add {{\"a\": {n}, \"b\": 1}}"), "background": true}))
            .send()
            .await;
        // A create that met a cut connection may fail; it must then leave nothing running behind.
        if let Ok(created) = created {
            if created.status().is_success() {
                let body: serde_json::Value = created.json().await.expect("JSON");
                accepted.push(body["id"].as_str().expect("id").to_owned());
            }
        }
    }
    cluster
        .tools
        .wait_for_calls("add", accepted.len() / 2, PATIENCE)
        .await
        .expect("tool rounds under way");
    proxy.heal();
    let cuts = proxy.cuts();
    assert!(cuts > 0, "the proxy cut nothing");
    assert!(!accepted.is_empty(), "no create got through");

    // Every response ends within its deadline plus a lease, whatever was cut.
    let counts = all_ended(cluster.db.url(), Duration::from_secs(20 + 3 + 20)).await;
    assert!(
        counts.get("completed").copied().unwrap_or(0) > 0,
        "{counts:?}"
    );

    // A tool step may be sent again after a cut, but always under its one Idempotency-Key.
    let mut keys: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for call in cluster.tools.calls().iter().filter(|c| c.tool == "add") {
        let response = call
            .header("x-gateway-response-id")
            .expect("response id")
            .to_owned();
        let key = call.header("idempotency-key").expect("key").to_owned();
        keys.entry(response).or_default().insert(key);
    }
    for (response, keys) in &keys {
        assert_eq!(
            keys.len(),
            1,
            "{response} sent its one tool step under {keys:?}"
        );
    }
    eprintln!(
        "cuts: {cuts}; accepted: {}; ended: {counts:?}; tool calls: {}",
        accepted.len(),
        cluster.tools.calls().len()
    );
}

#[tokio::test]
async fn a_replica_with_a_full_pool_and_hundreds_of_followers_keeps_its_leases() {
    let mut cluster = Cluster::postgres().await;
    let busy = cluster.replica(&[
        ("GATEWAY__DATABASE__MAX_CONNECTIONS", "1"),
        ("GATEWAY__DATABASE__ACQUIRE_TIMEOUT_MS", "2000"),
    ]);
    // Ready to take over anything the busy replica stops beating for.
    let _watching = cluster.replica(&[]);
    cluster.configure(&busy).await;
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(cluster.background_gate_call(&busy).await);
    }
    cluster.gate_calls(ids.len()).await;

    // Hundreds of re-attached followers, each reading the store as its response progresses.
    let (attached, mut attaching) = tokio::sync::mpsc::channel(300);
    let mut followers = Vec::new();
    for n in 0..300 {
        let url = format!(
            "{}/v1/responses/{}?stream=true",
            busy.base_url,
            ids[n % ids.len()]
        );
        let (http, key, attached) = (cluster.http.clone(), cluster.key.clone(), attached.clone());
        followers.push(tokio::spawn(async move {
            let response = http.get(url).bearer_auth(key).send().await.expect("follow");
            assert_eq!(response.status(), 200);
            attached.send(()).await.expect("told");
            response.text().await.expect("to the end")
        }));
    }
    for _ in 0..300 {
        attaching.recv().await.expect("a follower attached");
    }

    // The pool's one connection is taken by writes that wait on a lock: creates whose first write touches the
    // steps table, held behind the test's lock on it. Followers meanwhile find no connection.
    let (pool, lock) = lock_steps_table(&cluster).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let (http, key, url) = (
            cluster.http.clone(),
            cluster.key.clone(),
            format!("{}/v1/responses", busy.base_url),
        );
        held.push(tokio::spawn(async move {
            http.post(url)
                .bearer_auth(key)
                .json(&json!({"model": "mock", "input": "Hi", "stream": true}))
                .send()
                .await
                .expect("create")
                .text()
                .await
                .expect("to the end")
        }));
    }

    // Several leases pass with the pool full: both replicas keep beating all along.
    let beats = || async {
        sqlx::query_scalar::<_, i64>("SELECT MIN(heartbeat_at) - MAX(started_at) FROM replicas")
            .fetch_one(&pool)
            .await
            .expect("beats")
    };
    let lease: i64 = LEASE_MS.parse().expect("lease");
    let give_up = tokio::time::Instant::now() + PATIENCE;
    while beats().await < 4 * lease {
        assert!(
            tokio::time::Instant::now() < give_up,
            "a replica stopped beating"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    lock.commit().await.expect("unlock");
    // The create that held the connection completes; one that found none waiting answered a retryable 503.
    let mut completed = 0;
    for create in held {
        let answer = create.await.expect("create");
        if answer.contains("response.completed") {
            completed += 1;
        } else {
            assert!(answer.contains("server_overloaded"), "{answer}");
        }
    }
    assert!(completed >= 1, "no create held the pool's connection");
    cluster.tools.open_gate();
    for follower in followers {
        let stream = follower.await.expect("follower");
        assert!(stream.contains("response.completed"), "{stream}");
    }

    // No response was taken over: each tool call went out once.
    let calls = cluster.tools.calls();
    assert_eq!(calls.len(), ids.len(), "a takeover sent a tool call again");
    let keys: BTreeSet<_> = calls
        .iter()
        .map(|c| c.header("idempotency-key").expect("key").to_owned())
        .collect();
    assert_eq!(keys.len(), ids.len());
    for id in &ids {
        assert_gate_round(&cluster.ended(&busy, id).await);
    }
}

/// A response whose read-back fails for a passing reason every time (its steps locked by another session, so
/// that each read outlasts the reply timeout), while the database answers everything else: each failed try counts
/// as a start, and past `durability.max_resumes` it ends `unreadable_state` instead of being claimed and given back
/// for as long as the lock is held.
#[tokio::test]
async fn a_response_whose_read_back_fails_every_time_for_a_passing_reason_ends_failed() {
    ends_unreadable_while_locked("steps").await;
}

/// The same when what fails is the read of who pays for it (its key's row locked): the response was read back,
/// its payer was not, and that counts as a failed start too rather than a claim given back for ever.
#[tokio::test]
async fn a_response_whose_payer_cannot_be_read_back_ends_failed_instead_of_being_claimed_for_ever()
{
    ends_unreadable_while_locked("api_keys").await;
}

/// A background response whose replica died is taken over by one that cannot read `table` (another session
/// holds it locked, and reads time out after 1 s): it ends `unreadable_state` after two tries.
async fn ends_unreadable_while_locked(table: &str) {
    let mut cluster = Cluster::postgres().await;
    let mut first = cluster.replica(&[]);
    cluster.configure(&first).await;
    let id = cluster.background_gate_call(&first).await;
    cluster.gate_calls(1).await;
    first.kill();

    let pool = sqlx::PgPool::connect(cluster.db.url())
        .await
        .expect("connect");
    let mut locked = pool.begin().await.expect("begin");
    sqlx::query(&format!("LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"))
        .execute(&mut *locked)
        .await
        .expect("lock");
    let _second = cluster.replica(&[
        ("GATEWAY__DATABASE__REPLY_TIMEOUT_MS", "1000"),
        ("GATEWAY__DATABASE__SERVER_KEEPALIVE_SECS", "0"),
        ("GATEWAY__DURABILITY__MAX_RESUMES", "2"),
    ]);
    all_ended(cluster.db.url(), PATIENCE).await;
    let (status, code, resumes): (String, Option<String>, i64) = sqlx::query_as(
        "SELECT status, error_code, CAST(resumes AS BIGINT) FROM responses WHERE id = $1",
    )
    .bind(&id)
    .fetch_one(&pool)
    .await
    .expect("read");
    locked.rollback().await.expect("unlock");
    assert_eq!(
        (status.as_str(), code.as_deref()),
        ("failed", Some("unreadable_state"))
    );
    assert_eq!(resumes, 3, "two tries allowed, the third ends it");
    cluster.tools.open_gate();
}

#[tokio::test]
async fn running_responses_that_cannot_be_resumed_end_failed_with_a_code_instead_of_being_claimed_for_ever(
) {
    let mut cluster = Cluster::postgres().await;
    let mut first = cluster.replica(&[]);
    cluster.configure(&first).await;
    // The project's webhook endpoint hears of both endings.
    let receiver = gateway_testkit::WebhookReceiver::start()
        .await
        .expect("receiver");
    let projects = cluster
        .admin(&first, reqwest::Method::GET, "/projects", None)
        .await;
    let project = projects["data"][0]["id"].as_str().expect("project");
    cluster
        .admin(
            &first,
            reqwest::Method::POST,
            &format!("/projects/{project}/webhooks"),
            Some(json!({"url": receiver.url()})),
        )
        .await;
    let unreadable = cluster.background_gate_call(&first).await;
    let orphaned = cluster.background_gate_call(&first).await;
    cluster.gate_calls(2).await;
    first.kill();

    // While nobody runs them: one's stored request no longer reads back, the other's deployment is gone (as a
    // delete leaves it: `ON DELETE SET NULL`).
    let pool = sqlx::PgPool::connect(cluster.db.url())
        .await
        .expect("connect");
    sqlx::query("UPDATE responses SET params = '\"not a request\"'::jsonb WHERE id = $1")
        .bind(&unreadable)
        .execute(&pool)
        .await
        .expect("spoil");
    sqlx::query("UPDATE responses SET deployment_id = NULL WHERE id = $1")
        .bind(&orphaned)
        .execute(&pool)
        .await
        .expect("orphan");

    // Another replica takes both over once, and ends each with a code that says why.
    let second = cluster.replica(&[]);
    all_ended(cluster.db.url(), PATIENCE).await;
    let ended: Vec<(String, String, Option<String>, i64)> = sqlx::query_as(
        "SELECT id, status, error_code, claim_epoch FROM responses ORDER BY created_at, id",
    )
    .fetch_all(&pool)
    .await
    .expect("read");
    let of = |id: &str| {
        ended
            .iter()
            .find(|row| row.0 == id)
            .map(|row| (row.1.as_str(), row.2.as_deref(), row.3))
            .expect("the response")
    };
    assert_eq!(of(&unreadable), ("failed", Some("unreadable_state"), 1));
    assert_eq!(of(&orphaned), ("failed", Some("deployment_gone"), 1));
    let (status, body) = cluster.get(&second, &orphaned).await;
    assert_eq!(status, 200);
    assert_eq!(body["error"]["code"], "deployment_gone", "{body:#}");
    assert!(
        receiver.wait_for(2, PATIENCE, |_| true).await,
        "both failures were told: {:?}",
        receiver.received()
    );
    let told: BTreeSet<(String, String)> = receiver
        .received()
        .iter()
        .map(|received| {
            let event: serde_json::Value = serde_json::from_str(&received.body).expect("json");
            (
                event["type"].as_str().expect("type").to_owned(),
                event["data"]["id"].as_str().expect("id").to_owned(),
            )
        })
        .collect();
    let failed = |id: &str| ("response.failed".to_owned(), id.to_owned());
    assert_eq!(
        told,
        BTreeSet::from([failed(&unreadable), failed(&orphaned)])
    );
}

#[tokio::test]
async fn a_response_started_from_the_store_more_often_than_allowed_ends_failed_instead_of_running_again(
) {
    let mut cluster = Cluster::postgres().await;
    let mut first = cluster.replica(&[]);
    cluster.configure(&first).await;
    let worn = cluster.background_gate_call(&first).await;
    let within = cluster.background_gate_call(&first).await;
    cluster.gate_calls(2).await;
    first.kill();

    // As if their runs had died on the replicas that took them, again and again: one has used up its starts
    // from the store (`durability.max_resumes` is 3 here), the other has one left.
    let pool = sqlx::PgPool::connect(cluster.db.url())
        .await
        .expect("connect");
    for (id, resumes) in [(&worn, 3_i32), (&within, 2)] {
        sqlx::query("UPDATE responses SET resumes = $2 WHERE id = $1")
            .bind(id)
            .bind(resumes)
            .execute(&pool)
            .await
            .expect("wear");
    }

    cluster.tools.open_gate();
    let second = cluster.replica(&[("GATEWAY__DURABILITY__MAX_RESUMES", "3")]);
    all_ended(cluster.db.url(), PATIENCE).await;
    let (status, body) = cluster.get(&second, &worn).await;
    assert_eq!(status, 200);
    assert_eq!(body["status"], "failed", "{body:#}");
    assert_eq!(body["error"]["code"], "resumed_too_often", "{body:#}");
    let (status, body) = cluster.get(&second, &within).await;
    assert_eq!(status, 200);
    assert_gate_round(&body);
    // The worn one was not run again: only the other's tool call went out a second time.
    assert_eq!(cluster.tools.calls().len(), 3);
    let counted: Vec<i32> =
        sqlx::query_scalar("SELECT resumes FROM responses WHERE id = ANY($1) ORDER BY id = $2")
            .bind([worn.clone(), within.clone()])
            .bind(&within)
            .fetch_all(&pool)
            .await
            .expect("read");
    assert_eq!(counted, [4, 3]);
}

/// A fault proxy in front of the cluster's database, cutting connections (once told to) at random from `seed`,
/// and the database URL that goes through it.
/// A replica configured on a database behind a fault proxy, whose statements wait at most a second for an answer.
/// The proxy keeps a silenced connection open, so the database's keepalive could not end its session: only the
/// statement's own bound is tried.
async fn replica_with_a_short_reply_timeout(
    cluster: &mut Cluster,
    seed: u64,
    settings: &[(&str, &str)],
) -> (FaultProxy, Replica) {
    let (proxy, through_proxy) = through_fault_proxy(cluster, seed).await;
    let mut all = vec![
        ("DATABASE_URL", through_proxy.as_str()),
        ("GATEWAY__DATABASE__REPLY_TIMEOUT_MS", "1000"),
        ("GATEWAY__DATABASE__SERVER_KEEPALIVE_SECS", "0"),
    ];
    all.extend_from_slice(settings);
    let replica = cluster.replica(&all);
    cluster.configure(&replica).await;
    (proxy, replica)
}

/// An answer's status, its `x-should-retry`, and its JSON body.
async fn status_retry_and_body(
    answer: reqwest::Response,
) -> (u16, Option<String>, serde_json::Value) {
    let status = answer.status().as_u16();
    let retry = answer
        .headers()
        .get("x-should-retry")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    (status, retry, answer.json().await.expect("JSON"))
}

async fn through_fault_proxy(cluster: &Cluster, seed: u64) -> (FaultProxy, String) {
    let database: url::Url = cluster.db.url().parse().expect("database URL");
    let target = format!(
        "{}:{}",
        database.host_str().expect("host"),
        database.port().unwrap_or(5432)
    );
    let target = tokio::net::lookup_host(target)
        .await
        .expect("resolve")
        .find(std::net::SocketAddr::is_ipv4)
        .expect("an IPv4 address");
    let proxy = FaultProxy::start(target, 40, seed).await.expect("proxy");
    let mut through_proxy = database.clone();
    through_proxy.set_host(Some("127.0.0.1")).expect("host");
    through_proxy
        .set_port(Some(proxy.addr().port()))
        .expect("port");
    // The proxy finds the replies it swallows by what they carry: the protocol goes through it in the clear.
    through_proxy
        .query_pairs_mut()
        .append_pair("sslmode", "disable");
    (proxy, through_proxy.to_string())
}

/// Holds the cluster's only key to `governance` (`limits`, `budget`), through `replica`'s admin API.
async fn govern_key(cluster: &Cluster, replica: &Replica, governance: serde_json::Value) {
    let projects = cluster
        .admin(replica, reqwest::Method::GET, "/projects", None)
        .await;
    let project = projects["data"][0]["id"].as_str().expect("project");
    let keys = cluster
        .admin(
            replica,
            reqwest::Method::GET,
            &format!("/projects/{project}/api_keys"),
            None,
        )
        .await;
    let key_id = keys["data"][0]["id"].as_str().expect("key");
    let patched = cluster
        .admin(
            replica,
            reqwest::Method::PATCH,
            &format!("/api_keys/{key_id}"),
            Some(governance),
        )
        .await;
    assert_eq!(patched["id"], key_id, "{patched:#}");
}

/// Every `max_concurrent` place the store counts, all replicas together.
async fn places_held(url: &str) -> i64 {
    let store = gateway::store::Store::connect(url, 1).await.expect("store");
    let gateway::store::Backend::Postgres(pool) = store.backend() else {
        panic!("a Postgres cluster");
    };
    sqlx::query_scalar("SELECT COALESCE(SUM(running), 0)::bigint FROM running_counts")
        .fetch_one(pool)
        .await
        .expect("places")
}

// The proxy must forward while the test starts the replicas (which blocks its thread reading their output).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_connections_cut_during_admission_leave_no_place_taken_and_answer_in_openais_shape(
) {
    let mut cluster = Cluster::postgres().await;
    let (proxy, through_proxy) = through_fault_proxy(&cluster, 0x90ed).await;
    let settings = [
        ("DATABASE_URL", through_proxy.as_str()),
        ("GATEWAY__DATABASE__ACQUIRE_TIMEOUT_MS", "1000"),
        ("GATEWAY__GOVERNANCE__SYNC_MS", "50"),
    ];
    let first = cluster.replica(&settings);
    let second = cluster.replica(&settings);
    cluster.configure(&first).await;
    // Every check of admission runs: limits far off, a budget far off, two places at once.
    let governance = json!({"limits": {"rpm": 100000, "tpm": 100000000, "max_concurrent": 2},
                            "budget": {"usd": 1000, "period": "day"}});
    govern_key(&cluster, &first, governance).await;

    proxy.cut();
    let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
    for n in 0..60 {
        let replica = if n % 2 == 0 { &first } else { &second };
        let answer = cluster
            .http
            .post(format!("{}/v1/responses", replica.base_url))
            .bearer_auth(&cluster.key)
            .json(&json!({"model": "mock", "input": format!("hello {n}")}))
            .send()
            .await
            .expect("an answer, whatever was cut");
        let status = answer.status().as_u16();
        let body: serde_json::Value = answer.json().await.expect("a JSON body");
        if status == 200 {
            assert_eq!(body["status"], "completed", "{body:#}");
        } else {
            // A cut is the gateway's trouble, never the client's mistake, and keeps OpenAI's shape.
            assert!(status == 429 || status >= 500, "status {status}: {body:#}");
            let error = &body["error"];
            assert!(
                error["code"].is_string() && error["message"].is_string(),
                "{body:#}"
            );
        }
        *statuses.entry(status).or_default() += 1;
    }
    proxy.heal();
    assert!(proxy.cuts() > 0, "the proxy cut nothing");
    assert!(statuses.get(&200).copied().unwrap_or(0) > 0, "{statuses:?}");

    // No place is left taken: each given back (again, once the store answers) when its response ended.
    let mut held = -1;
    for _ in 0..1000 {
        held = places_held(cluster.db.url()).await;
        if held == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(held, 0, "places leaked by cut connections ({statuses:?})");
    // And the key is not held back by them.
    for replica in [&first, &second] {
        let answer = cluster
            .create(replica, json!({"model": "mock", "input": "after the cuts"}))
            .await;
        assert_eq!(answer["status"], "completed", "{answer:#}");
    }
    eprintln!("statuses: {statuses:?}; cuts: {}", proxy.cuts());
}

#[tokio::test]
async fn a_full_pool_during_admission_answers_503_and_leaves_no_place_taken() {
    let mut cluster = Cluster::postgres().await;
    // Two connections for everything, a short wait for one: a burst of creates finds the pool full.
    let replica = cluster.replica(&[
        ("GATEWAY__DATABASE__MAX_CONNECTIONS", "2"),
        ("GATEWAY__DATABASE__ACQUIRE_TIMEOUT_MS", "50"),
    ]);
    cluster.configure(&replica).await;
    govern_key(
        &cluster,
        &replica,
        json!({"limits": {"max_concurrent": 1000}}),
    )
    .await;

    // How many of a burst find the pool full depends on the machine's speed (all but a few on a loaded one, a
    // few on a quiet one): bursts are sent until both kinds of answer were seen.
    let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
    for round in 0..20 {
        let both_seen = statuses.contains_key(&200) && statuses.keys().any(|status| *status >= 500);
        if both_seen {
            break;
        }
        let burst = (0..64).map(|n| {
            cluster
                .http
                .post(format!("{}/v1/responses", replica.base_url))
                .bearer_auth(&cluster.key)
                .json(&json!({"model": "mock", "input": format!("burst {round}.{n}")}))
                .send()
        });
        for answer in futures::future::join_all(burst).await {
            let (status, retry, body) = status_retry_and_body(answer.expect("an answer")).await;
            match status {
                200 => assert_eq!(body["status"], "completed", "{body:#}"),
                // A full pool before anything was stored: the client may send it again.
                _ => {
                    assert!(status >= 500, "status {status}: {body:#}");
                    assert_eq!(retry.as_deref(), Some("true"), "{body:#}");
                    assert!(body["error"]["code"].is_string(), "{body:#}");
                }
            }
            *statuses.entry(status).or_default() += 1;
        }
    }
    assert!(statuses.contains_key(&200), "none admitted: {statuses:?}");
    assert!(
        statuses.keys().any(|status| *status >= 500),
        "the pool was never full: {statuses:?}"
    );

    // Every place is given back, including those whose take or give-back met the full pool.
    let mut held = -1;
    for _ in 0..1000 {
        held = places_held(cluster.db.url()).await;
        if held == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(held, 0, "places left taken ({statuses:?})");
    eprintln!("statuses: {statuses:?}");
}

/// The status of the response created under Idempotency-Key `key` in the database at `url`, if it is there.
async fn status_of_keyed(url: &str, key: &str) -> Option<(String, String)> {
    let pool = sqlx::PgPool::connect(url).await.expect("connect");
    let row = sqlx::query_as("SELECT id, status FROM responses WHERE idempotency_key = $1")
        .bind(key)
        .fetch_optional(&pool)
        .await
        .expect("read");
    pool.close().await;
    row
}

/// Waits (polling the database, for a few leases) until the response created under Idempotency-Key `key` has
/// completed; its id.
async fn completed_keyed(url: &str, key: &str) -> String {
    let give_up = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match status_of_keyed(url, key).await {
            Some((id, status)) if status == "completed" => return id,
            row => assert!(
                tokio::time::Instant::now() < give_up,
                "the response was left unfinished: {row:?}"
            ),
        }
        // Polling the database: the condition is outside this process.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The create with `input` repeated on `replica` under Idempotency-Key `key` (the same body, as an SDK's retry
/// sends it), answered with the response `id`, completed.
async fn assert_repeat_answers(
    cluster: &Cluster,
    replica: &Replica,
    (key, input): (&str, &str),
    id: &str,
) {
    let repeated = cluster
        .http
        .post(format!("{}/v1/responses", replica.base_url))
        .bearer_auth(&cluster.key)
        .header("Idempotency-Key", key)
        .json(&json!({"model": "mock", "input": input}))
        .send()
        .await
        .expect("repeat");
    assert_eq!(repeated.status(), 200);
    let repeated: serde_json::Value = repeated.json().await.expect("JSON");
    assert_eq!(repeated["id"], id, "{repeated:#}");
    assert_eq!(repeated["status"], "completed", "{repeated:#}");
}

/// Waits (polling the database, at most `within`) until the statement that writes new responses waits on a lock.
async fn a_create_waits_on_a_lock(pool: &sqlx::PgPool, within: Duration) {
    a_statement_waits_on_a_lock(pool, "%INSERT INTO responses%", within).await;
}

/// Waits (polling the database, at most `within`) until a statement whose text is `like` waits on a lock.
async fn a_statement_waits_on_a_lock(pool: &sqlx::PgPool, like: &str, within: Duration) {
    let give_up = tokio::time::Instant::now() + within;
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE $1",
        )
        .bind(like)
        .fetch_one(pool)
        .await
        .expect("activity");
        if waiting > 0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "no statement like {like} waited on the lock"
        );
        // Polling the database: the condition is outside this process.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A connection to the cluster's database, and a transaction on it that holds the `steps` table locked against
/// writes (committing it unlocks the table): the first write of a create waits behind it.
async fn lock_steps_table(
    cluster: &Cluster,
) -> (sqlx::PgPool, sqlx::Transaction<'static, sqlx::Postgres>) {
    let pool = sqlx::PgPool::connect(cluster.db.url())
        .await
        .expect("connect");
    let mut lock = pool.begin().await.expect("begin");
    sqlx::query("LOCK TABLE steps IN EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .expect("lock");
    (pool, lock)
}

#[tokio::test]
async fn a_keyed_create_whose_client_leaves_while_its_row_waits_to_be_written_still_ends() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut cluster = Cluster::postgres().await;
    let replica = cluster.replica(&[]);
    cluster.configure(&replica).await;

    // The first write of a keyed create (its row, context and first step) waits behind the test's lock on the
    // steps table, queued in the replica's group commit.
    let (pool, lock) = lock_steps_table(&cluster).await;
    let body = json!({"model": "mock", "input": "Hi"}).to_string();
    let head = format!(
        "POST /v1/responses HTTP/1.1\r\nhost: gateway\r\nauthorization: Bearer {}\r\nidempotency-key: left-early\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        cluster.key,
        body.len()
    );
    let address = replica.base_url.trim_start_matches("http://").to_owned();
    let mut client = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    client.write_all(head.as_bytes()).await.expect("send");
    a_create_waits_on_a_lock(&pool, PATIENCE).await;

    // The client leaves: the gateway drops the connection and the request with it, before any answer.
    client.shutdown().await.expect("half-close");
    let mut answer = Vec::new();
    tokio::time::timeout(PATIENCE, client.read_to_end(&mut answer))
        .await
        .expect("the gateway closes the connection")
        .expect("read");
    assert!(
        answer.is_empty(),
        "answered: {}",
        String::from_utf8_lossy(&answer)
    );

    // The write it queued lands all the same, as a response owned by the replica that nobody runs yet. It must
    // not stay in progress: the replica hands it over, and a replica (this one) resumes it to its end.
    lock.commit().await.expect("unlock");
    let id = completed_keyed(cluster.db.url(), "left-early").await;
    replica
        .logs
        .wait_for("a response this replica owns runs nowhere here; handing it over")
        .await;

    // A retry under the same key answers it.
    assert_repeat_answers(&cluster, &replica, ("left-early", "Hi"), &id).await;
    assert_eq!(cluster.model.requests().len(), 1, "one model call");
}

// The proxy must forward while the test starts the replica (which blocks its thread reading its output).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_create_whose_first_write_is_in_doubt_is_handed_over_whatever_its_retry_met() {
    let mut cluster = Cluster::postgres().await;
    let (proxy, through_proxy) = through_fault_proxy(&cluster, 0xd0b7).await;
    // One pooled connection: once it is cut, a retry needs a new one.
    let replica = cluster.replica(&[
        ("DATABASE_URL", through_proxy.as_str()),
        ("GATEWAY__DATABASE__MAX_CONNECTIONS", "1"),
        ("GATEWAY__DATABASE__ACQUIRE_TIMEOUT_MS", "1000"),
    ]);
    cluster.configure(&replica).await;

    // The create's first write commits and its reply is lost; its retry then gets no connection in time (the
    // database stopped answering): a failure that surely wrote nothing, after one that may have written it all.
    proxy.lose_reply_then_stall(b"a create in doubt");
    let answer = cluster
        .http
        .post(format!("{}/v1/responses", replica.base_url))
        .bearer_auth(&cluster.key)
        .header("Idempotency-Key", "in-doubt")
        .json(&json!({"model": "mock", "input": "a create in doubt"}))
        .send()
        .await
        .expect("an answer");
    assert!(proxy.is_stalled(), "the reply was never lost");
    proxy.heal();
    let (status, retry, body) = status_retry_and_body(answer).await;

    // The response is stored: the client is not told that nothing was, but which response it is, and (its create
    // carried a key) that the repeat is safe.
    let (id, _) = status_of_keyed(cluster.db.url(), "in-doubt")
        .await
        .expect("the first write committed");
    assert_eq!(status, 500, "{body:#}");
    assert_eq!(retry.as_deref(), Some("true"), "{body:#}");
    let message = body["error"]["message"].as_str().expect("a message");
    assert!(message.contains(&id), "{body:#}");

    // Handed over, it is resumed to its end, and the repeat answers it.
    assert_eq!(completed_keyed(cluster.db.url(), "in-doubt").await, id);
    assert_repeat_answers(&cluster, &replica, ("in-doubt", "a create in doubt"), &id).await;
    assert_eq!(cluster.model.requests().len(), 1, "one model call");
}

// The proxy must forward while the test starts the replica (which blocks its thread reading its output).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_connection_fell_silent_is_in_doubt_after_the_reply_timeout_and_the_response_ends(
) {
    let mut cluster = Cluster::postgres().await;
    let (proxy, replica) = replica_with_a_short_reply_timeout(&mut cluster, 0x51e7, &[]).await;

    // The create's first write commits; its reply, and everything after it on that connection, never comes back,
    // and the connection stays open: as when the network to the database drops everything without a reset.
    proxy.silence_reply(b"a reply that never comes");
    let create = cluster
        .http
        .post(format!("{}/v1/responses", replica.base_url))
        .bearer_auth(&cluster.key)
        .header("Idempotency-Key", "silent")
        .json(&json!({"model": "mock", "input": "a reply that never comes"}))
        .send();
    // Without a bound on the write, the answer never comes: the guard fails the test instead of hanging it.
    let answer = tokio::time::timeout(PATIENCE, create)
        .await
        .expect("the create was answered")
        .expect("an answer");
    assert_eq!(proxy.silenced(), 1, "the reply was never swallowed");
    let status = answer.status().as_u16();
    let body: serde_json::Value = answer.json().await.expect("JSON");

    // Written once, whatever the client was told: it ends, and the repeat answers that end.
    let (id, _) = status_of_keyed(cluster.db.url(), "silent")
        .await
        .expect("the first write committed");
    assert!(
        status == 200
            || body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(&id)),
        "{status}: {body:#}"
    );
    assert_eq!(completed_keyed(cluster.db.url(), "silent").await, id);
    assert_repeat_answers(
        &cluster,
        &replica,
        ("silent", "a reply that never comes"),
        &id,
    )
    .await;
    assert_eq!(cluster.model.requests().len(), 1, "one model call");
}

// The proxy must forward while the test starts the replica (which blocks its thread reading its output).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_whose_connection_fell_silent_is_answered_after_the_reply_timeout() {
    let mut cluster = Cluster::postgres().await;
    let (proxy, replica) = replica_with_a_short_reply_timeout(&mut cluster, 0x5ead, &[]).await;
    reads_over_connections_fallen_silent(&cluster, &proxy, &replica, 1).await;
}

// The proxy must forward while the test starts the replica (which blocks its thread reading its output).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_abandoned_by_silent_reads_give_their_places_in_the_pool_back() {
    // The pool's two places are the abandoned connections' until they are shut down: the next read needs one.
    let mut cluster = Cluster::postgres().await;
    let (proxy, replica) = replica_with_a_short_reply_timeout(
        &mut cluster,
        0xab4d,
        &[("GATEWAY__DATABASE__MAX_CONNECTIONS", "2")],
    )
    .await;
    reads_over_connections_fallen_silent(&cluster, &proxy, &replica, 2).await;
}

/// `silenced` reads, one after the other, whose replies are swallowed, each connection left open, on a replica whose
/// statements wait a second at most: each is answered 500 (retryable). Then the same read, asked again until it is
/// answered otherwise than as without a connection in time, finds that there is no such response.
async fn reads_over_connections_fallen_silent(
    cluster: &Cluster,
    proxy: &FaultProxy,
    replica: &Replica,
    silenced: u64,
) {
    // A read of a response nobody stored: its id is in that read alone. Its reply, and everything after it on
    // its connection, never comes back, and the connection stays open.
    let id = "resp_019000000000700080000000000051e7";
    let read = |id: &str| {
        cluster
            .http
            .get(format!("{}/v1/responses/{id}", replica.base_url))
            .bearer_auth(&cluster.key)
            .send()
    };
    for n in 1..=silenced {
        proxy.silence_reply(id.as_bytes());
        // Without a bound on the read, the answer never comes: the guard fails the test instead of hanging it.
        let answer = tokio::time::timeout(PATIENCE, read(id))
            .await
            .expect("the read was answered")
            .expect("an answer");
        assert_eq!(proxy.silenced(), n, "the reply was never swallowed");
        let (status, retry, body) = status_retry_and_body(answer).await;
        assert_eq!(status, 500, "{body:#}");
        assert_eq!(retry.as_deref(), Some("true"), "{body:#}");
        assert_eq!(body["error"]["type"], "server_error", "{body:#}");
    }

    // Asked again, the store answers on another connection: there is no such response. With every place in the
    // pool abandoned, the read waits for one to be shut down, answered as without a connection until then.
    let give_up = tokio::time::Instant::now() + PATIENCE;
    loop {
        let again = tokio::time::timeout(PATIENCE, read(id))
            .await
            .expect("the second read was answered")
            .expect("an answer");
        let status = again.status().as_u16();
        if status == 404 {
            break;
        }
        // No connection in time: 503, or 500 when the wait for one outlasted the reply timeout, which bounds it.
        assert!(
            [500, 503].contains(&status),
            "{status}: {:#}",
            again.text().await.unwrap_or_default()
        );
        assert!(
            tokio::time::Instant::now() < give_up,
            "the abandoned connection kept its place in the pool"
        );
    }
}

/// A WebSocket client's connection to a replica.
type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The next JSON message on `socket`; the guard fails the test rather than waiting for ever.
async fn next_message(socket: &mut Socket) -> serde_json::Value {
    use futures::StreamExt;
    use tokio_tungstenite::tungstenite::Message;
    loop {
        let read = tokio::time::timeout(PATIENCE, socket.next()).await;
        match read.expect("a message in time") {
            Some(Ok(Message::Text(text))) => {
                return serde_json::from_str(text.as_str()).expect("JSON")
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
            other => panic!("the socket ended: {other:?}"),
        }
    }
}

/// The terminal events of a response's stream.
const TERMINAL: [&str; 4] = [
    "response.completed",
    "response.failed",
    "response.incomplete",
    "response.cancelled",
];

/// With response `id`'s tool call in flight on `paused`, the replica is frozen and loses the response to `other`,
/// which finishes it; then `paused` is resumed.
async fn lose_while_paused(cluster: &Cluster, paused: &Replica, other: &Replica, id: &str) {
    cluster.gate_calls(1).await;
    paused.pause();
    cluster.gate_calls(2).await;
    cluster.tools.open_gate();
    let finished = cluster.ended(other, id).await;
    assert_eq!(finished["status"], "completed", "{finished:#}");
    paused.resume();
}

#[tokio::test]
async fn a_websocket_turn_whose_replica_lost_the_response_while_paused_is_told_it_was_handed_over()
{
    use futures::SinkExt;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::Message;

    let mut cluster = Cluster::postgres().await;
    let paused = cluster.replica(&[]);
    let other = cluster.replica(&[]);
    cluster.configure(&paused).await;
    let mut request = format!("{}/v1/responses", paused.base_url.replacen("http", "ws", 1))
        .into_client_request()
        .expect("request");
    request.headers_mut().insert(
        "authorization",
        format!("Bearer {}", cluster.key).parse().expect("header"),
    );
    let (mut socket, _) = tokio_tungstenite::connect_async(request)
        .await
        .expect("connect");
    socket
        .send(Message::text(
            json!({"type": "response.create", "model": "mock", "input": "!call gate {}"})
                .to_string(),
        ))
        .await
        .expect("send");
    let created = next_message(&mut socket).await;
    let id = created["response"]["id"].as_str().expect("id").to_owned();
    lose_while_paused(&cluster, &paused, &other, &id).await;

    // Back, the first replica gives the response up. Its client is told where the response went, rather than
    // left waiting on the open socket for an end that never comes.
    let told = loop {
        let message = next_message(&mut socket).await;
        assert!(
            !TERMINAL.iter().any(|t| message["type"] == *t),
            "the replica that lost the response does not end it: {message:#}"
        );
        if message["type"] == "error" && message.get("status").is_some() {
            break message;
        }
    };
    assert_eq!(told["status"], 500, "{told:#}");
    let message = told["error"]["message"].as_str().expect("a message");
    assert!(
        message.contains(&id) && message.contains("handed over"),
        "{told:#}"
    );
}

#[tokio::test]
async fn a_conversation_keeps_one_answer_of_a_response_whose_replica_died_as_it_ended() {
    use gateway_testkit::Reply;
    let mut cluster = Cluster::postgres().await;
    let mut first = cluster.replica(&[]);
    cluster.configure(&first).await;
    let conversation = json(
        cluster
            .http
            .post(format!("{}/v1/conversations", first.base_url))
            .bearer_auth(&cluster.key)
            .json(&json!({}))
            .send()
            .await,
    )
    .await;
    let conversation = conversation["id"].as_str().expect("id").to_owned();
    cluster
        .model
        .push(Reply::text("First answer.").with_delay(Duration::from_millis(1500)));
    cluster.model.push(Reply::text("Second answer."));
    let created = cluster
        .create(
            &first,
            json!({"model": "mock", "input": "Hi", "background": true, "conversation": conversation}),
        )
        .await;
    let id = created["id"].as_str().expect("id").to_owned();

    // The model thinks; its step is written as running meanwhile. Then every write of steps waits behind the
    // test's lock, and the replica dies as the response ends, its answer in hand.
    assert!(cluster.model.wait_for_requests(1, PATIENCE).await);
    let pool = sqlx::PgPool::connect(cluster.db.url())
        .await
        .expect("connect");
    let give_up = tokio::time::Instant::now() + PATIENCE;
    loop {
        let running: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM steps WHERE response_id = $1 AND kind = 'model' AND state = 'running'",
        )
        .bind(&id)
        .fetch_one(&pool)
        .await
        .expect("steps");
        if running > 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "the model step was never written as running"
        );
        // Polling the database: the condition is outside this process.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, lock) = lock_steps_table(&cluster).await;
    a_statement_waits_on_a_lock(&pool, "%INSERT INTO steps%", PATIENCE).await;
    first.kill();
    // The dead replica's statement waiting on the lock dies with it (a database notices a lost client only when it
    // next talks to it, and would otherwise run the statement once the lock is gone).
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )
    .execute(&pool)
    .await
    .expect("terminate");
    lock.commit().await.expect("unlock");

    // Resumed elsewhere, the response calls the model again, and its turn is in the conversation once.
    let second = cluster.replica(&[]);
    let ended = cluster.ended(&second, &id).await;
    assert_eq!(ended["status"], "completed", "{ended:#}");
    assert_eq!(ended["output_text"], "Second answer.");
    let items = json(
        cluster
            .http
            .get(format!(
                "{}/v1/conversations/{conversation}/items?order=asc",
                second.base_url
            ))
            .bearer_auth(&cluster.key)
            .send()
            .await,
    )
    .await;
    let roles: Vec<&str> = items["data"]
        .as_array()
        .expect("items")
        .iter()
        .map(|item| item["role"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(roles, ["user", "assistant"], "{items:#}");
    assert_eq!(
        items["data"][1]["content"][0]["text"], "Second answer.",
        "{items:#}"
    );
}

/// The SSE events of `response` as they come, until the stream ends; the guard fails the test rather than waiting
/// for ever. `first` is called with each event as it arrives, before the next is read.
async fn read_events(
    mut response: reqwest::Response,
    mut first: impl FnMut(&serde_json::Value),
) -> Vec<serde_json::Value> {
    let mut body = String::new();
    let mut seen = 0;
    loop {
        let chunk = tokio::time::timeout(PATIENCE, response.chunk())
            .await
            .expect("the stream goes on or ends in time")
            .expect("a chunk");
        let Some(chunk) = chunk else { break };
        body.push_str(std::str::from_utf8(&chunk).expect("UTF-8"));
        // Only whole frames are read.
        let whole = body.rfind("\n\n").map_or(0, |end| end + 2);
        let arrived = events(&body[..whole]);
        for event in &arrived[seen..] {
            first(event);
        }
        seen = arrived.len();
    }
    events(&body)
}

#[tokio::test]
async fn an_sse_stream_whose_replica_lost_the_response_while_paused_ends_with_an_error_event() {
    let mut cluster = Cluster::postgres().await;
    let paused = cluster.replica(&[]);
    let other = cluster.replica(&[]);
    cluster.configure(&paused).await;
    let response = cluster
        .http
        .post(format!("{}/v1/responses", paused.base_url))
        .bearer_auth(&cluster.key)
        .json(&json!({"model": "mock", "input": "!call gate {}", "stream": true}))
        .send()
        .await
        .expect("create");
    assert_eq!(response.status(), 200);
    let (created_tx, mut created) = tokio::sync::mpsc::unbounded_channel();
    let reading = tokio::spawn(read_events(response, move |event| {
        if event["type"] == "response.created" {
            let _ = created_tx.send(event["response"]["id"].as_str().expect("id").to_owned());
        }
    }));
    let id = created.recv().await.expect("response.created");
    lose_while_paused(&cluster, &paused, &other, &id).await;

    // Back, the first replica gives the response up. Its stream ends saying where the response went, rather than
    // closing as if the response had nothing more to say.
    let events = reading.await.expect("read");
    let last = events.last().expect("events");
    assert!(
        !events
            .iter()
            .any(|e| TERMINAL.iter().any(|t| e["type"] == *t)),
        "the replica that lost the response does not end it: {events:#?}"
    );
    assert_eq!(last["type"], "error", "{events:#?}");
    let message = last["message"].as_str().expect("a message");
    assert!(
        message.contains(&id) && message.contains("handed over"),
        "{last:#}"
    );
    assert_eq!(last["error"]["type"], "server_error", "{last:#}");
    let before = &events[events.len() - 2];
    assert_eq!(
        last["sequence_number"].as_u64(),
        before["sequence_number"].as_u64().map(|n| n + 1),
        "numbered after the last event sent: {events:#?}"
    );
    // Where to re-attach: after the last of the response's own events, not after this one.
    assert!(
        message.contains(&format!("starting_after={}", before["sequence_number"])),
        "{last:#}"
    );
}

/// A background response created on `runner` that calls the gate tool, followed on `follower` once its call is
/// held: its id, and the task reading the follower's events to the stream's end (its tool call seen already).
async fn follow_a_gate_call(
    cluster: &Cluster,
    runner: &Replica,
    follower: &Replica,
) -> (String, tokio::task::JoinHandle<Vec<serde_json::Value>>) {
    let created = cluster
        .create(
            runner,
            json!({"model": "mock", "input": "!call gate {}", "background": true}),
        )
        .await;
    let id = created["id"].as_str().expect("id").to_owned();
    cluster.gate_calls(1).await;
    let response = cluster
        .http
        .get(format!(
            "{}/v1/responses/{id}?stream=true",
            follower.base_url
        ))
        .bearer_auth(&cluster.key)
        .send()
        .await
        .expect("re-attach");
    assert_eq!(response.status(), 200);
    let (calling_tx, mut calling) = tokio::sync::mpsc::unbounded_channel();
    let reading = tokio::spawn(read_events(response, move |event| {
        if event["type"] == "response.mcp_call.in_progress" {
            let _ = calling_tx.send(());
        }
    }));
    calling.recv().await.expect("the tool call, replayed");
    (id, reading)
}

#[tokio::test]
async fn a_follower_of_a_response_deleted_while_its_replica_is_paused_ends_with_an_error_event() {
    let mut cluster = Cluster::postgres().await;
    let paused = cluster.replica(&[]);
    let other = cluster.replica(&[]);
    cluster.configure(&paused).await;
    // Another replica's client follows the response; its run is frozen, so nothing it writes can race the delete.
    let (id, reading) = follow_a_gate_call(&cluster, &paused, &other).await;
    paused.pause();
    let deleted = cluster
        .http
        .delete(format!("{}/v1/responses/{id}", other.base_url))
        .bearer_auth(&cluster.key)
        .send()
        .await
        .expect("delete");
    assert_eq!(deleted.status(), 200);

    // The follower finds the response gone, and says so rather than just closing.
    let events = reading.await.expect("read");
    let last = events.last().expect("events");
    assert_eq!(last["type"], "error", "{events:#?}");
    let message = last["message"].as_str().expect("a message");
    assert!(
        message.contains(&id) && message.contains("deleted"),
        "{last:#}"
    );
    assert_eq!(
        last["sequence_number"].as_u64(),
        events[events.len() - 2]["sequence_number"]
            .as_u64()
            .map(|n| n + 1),
        "{events:#?}"
    );
    paused.resume();
    cluster.tools.open_gate();
}

/// What befalls the listener of a replica in `a_listener_*` tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ListenerFault {
    /// Its connection falls silent, left open.
    Silence,
    /// The database is unreachable, and every connection is cut; then it is reachable again.
    CutWhileUnreachable,
}

// The proxy must forward while the test starts the replicas (which blocks its thread reading their output).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_whose_connection_fell_silent_connects_again_and_hears_what_it_missed() {
    a_listener_hears_what_it_missed(ListenerFault::Silence).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_whose_connection_was_cut_forgets_what_it_cached_once_it_listens_again() {
    a_listener_hears_what_it_missed(ListenerFault::CutWhileUnreachable).await;
}

/// A replica whose listener meets `fault` while a key it cached is revoked through another replica: once it
/// listens again, it forgets its cache (the revocation's notification was lost to it) and refuses the key.
async fn a_listener_hears_what_it_missed(fault: ListenerFault) {
    let mut cluster = Cluster::postgres().await;
    let (proxy, through_proxy) = through_fault_proxy(&cluster, 11).await;
    // Its statements wait a second at most, and it would serve the key from its cache for ten minutes unless told.
    let deaf = cluster.replica(&[
        ("DATABASE_URL", through_proxy.as_str()),
        ("GATEWAY__DATABASE__REPLY_TIMEOUT_MS", "1000"),
        ("GATEWAY__DATABASE__SERVER_KEEPALIVE_SECS", "0"),
        ("GATEWAY__TENANCY__CACHE_TTL_MS", "600000"),
    ]);
    let other = cluster.replica(&[]);
    cluster.configure(&deaf).await;
    let read_missing = || {
        cluster
            .http
            .get(format!("{}/v1/responses/resp_missing", deaf.base_url))
            .bearer_auth(&cluster.key)
            .send()
    };
    assert_eq!(read_missing().await.expect("read").status(), 404);

    let give_up = tokio::time::Instant::now() + PATIENCE;
    match fault {
        ListenerFault::Silence => {
            // A notification on its way to the listener is swallowed, and all that follows, the connection left
            // open, as over a network that lost its database without a word.
            proxy.silence_delivery(b"silence-the-listener");
            let pool = sqlx::PgPool::connect(cluster.db.url())
                .await
                .expect("connect");
            sqlx::query("SELECT pg_notify('gateway_work', 'silence-the-listener')")
                .execute(&pool)
                .await
                .expect("notify");
            while proxy.silenced() == 0 {
                assert!(
                    tokio::time::Instant::now() < give_up,
                    "the listener never fell silent"
                );
                // Polling the proxy: the notification crosses it on its own task.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        // Until healed below, after the revocation, the replica cannot connect again.
        ListenerFault::CutWhileUnreachable => {
            proxy.stall();
            proxy.cut_all();
        }
    }

    // The key is revoked through the other replica while the first is deaf: the first finds its connection silent,
    // listens again, and forgets what it cached, since notifications were lost meanwhile.
    let keys = cluster
        .admin(&other, reqwest::Method::GET, "/projects", None)
        .await;
    let project = keys["data"][0]["id"].as_str().expect("project").to_owned();
    let keys = cluster
        .admin(
            &other,
            reqwest::Method::GET,
            &format!("/projects/{project}/api_keys"),
            None,
        )
        .await;
    let key_id = keys["data"][0]["id"].as_str().expect("key").to_owned();
    cluster
        .admin(
            &other,
            reqwest::Method::DELETE,
            &format!("/api_keys/{key_id}"),
            None,
        )
        .await;
    proxy.heal();
    loop {
        let status = read_missing().await.expect("read").status();
        if status == 401 {
            break;
        }
        // Not found while the key is still served, or, right after a cut, a connection that failed (retryable).
        assert!([404, 500].contains(&status.as_u16()), "{status}");
        assert!(
            tokio::time::Instant::now() < give_up,
            "the replica still serves a revoked key: it never listened again"
        );
        // Polling the replica: it reconnects on its own time.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// The proxy must forward while the replica starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_started_while_its_database_does_not_answer_waits_for_it() {
    use std::io::BufRead;
    let cluster = Cluster::postgres().await;
    let (proxy, through_proxy) = through_fault_proxy(&cluster, 0x57a7).await;
    proxy.stall();
    let mut child = cluster
        .serve_command(&[
            ("DATABASE_URL", through_proxy.as_str()),
            ("GATEWAY__DATABASE__ACQUIRE_TIMEOUT_MS", "300"),
        ])
        .spawn()
        .expect("start gateway");
    let stdout = child.stdout.take().expect("stdout");
    let (said, mut heard) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let message = serde_json::from_str::<serde_json::Value>(&line)
                .map(|entry| entry["fields"]["message"].as_str().unwrap_or("").to_owned())
                .unwrap_or_default();
            if said.send(message).is_err() {
                return;
            }
        }
    });

    // The database does not answer: the replica says it waits, rather than exiting.
    loop {
        let message = tokio::time::timeout(PATIENCE, heard.recv())
            .await
            .expect("a log line in time")
            .expect("the gateway exited instead of waiting for its database");
        if message == "the database did not answer; waiting for it" {
            break;
        }
    }
    proxy.heal();
    loop {
        let message = tokio::time::timeout(PATIENCE, heard.recv())
            .await
            .expect("a log line in time")
            .expect("the gateway exited instead of starting");
        if message == "gateway listening" {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::test]
async fn a_follower_on_a_replica_that_shuts_down_is_told_to_re_attach_elsewhere() {
    let mut cluster = Cluster::postgres().await;
    let runner = cluster.replica(&[]);
    let mut leaving = cluster.replica(&[]);
    cluster.configure(&runner).await;
    // A client follows the response on a replica that does not run it; that replica is told to stop.
    let (id, reading) = follow_a_gate_call(&cluster, &runner, &leaving).await;
    leaving.terminate();

    // The stream says where to follow the rest, rather than being cut off as the process exits.
    let events = reading.await.expect("read");
    let last = events.last().expect("events");
    assert_eq!(last["type"], "error", "{events:#?}");
    let message = last["message"].as_str().expect("a message");
    let before = &events[events.len() - 2];
    assert!(
        message.contains("shutting down")
            && message.contains(&format!("starting_after={}", before["sequence_number"])),
        "{last:#}"
    );
    cluster.tools.open_gate();
    let ended = cluster.ended(&runner, &id).await;
    assert_eq!(ended["status"], "completed", "{ended:#}");
}

#[tokio::test]
async fn a_follower_of_a_response_that_ends_within_the_shutdown_grace_sees_its_end() {
    let mut cluster = Cluster::postgres().await;
    let leaving = cluster.replica(&[]);
    cluster.configure(&leaving).await;
    // The response runs on the replica the client follows it on, which is then told to stop.
    let (id, reading) = follow_a_gate_call(&cluster, &leaving, &leaving).await;
    leaving.ask_to_stop();
    leaving
        .logs
        .wait_for("replica takes no new work; letting the responses running here finish")
        .await;

    // The run ends within the grace: its follower sees the end, rather than being sent elsewhere.
    cluster.tools.open_gate();
    let events = reading.await.expect("read");
    let last = events.last().expect("events");
    assert_eq!(last["type"], "response.completed", "{events:#?}");
    assert_eq!(last["response"]["id"], id.as_str());
}

#[tokio::test]
async fn a_call_that_waited_for_its_place_while_its_replica_was_paused_never_goes_out() {
    let mut cluster = Cluster::postgres().await;
    // One call of a batch at a time: the batch's second call waits for its first.
    let paused = cluster.replica(&[("GATEWAY__LIMITS__TOOL_CONCURRENCY", "1")]);
    let other = cluster.replica(&[]);
    cluster.configure(&paused).await;
    let created = cluster
        .create(
            &paused,
            json!({"model": "mock", "input": "!call gate {} !call add {\"a\": 1, \"b\": 2}", "background": true}),
        )
        .await;
    let id = created["id"].as_str().expect("id").to_owned();
    cluster.gate_calls(1).await;

    // Frozen with its first call in flight and its second waiting; the other replica takes the response over
    // once the lease ran out, sends both calls again, and finishes it.
    paused.pause();
    cluster.gate_calls(2).await;
    cluster.tools.open_gate();
    cluster.ended(&other, &id).await;
    let adds = || {
        cluster
            .tools
            .calls()
            .iter()
            .filter(|call| call.tool == "add")
            .count()
    };
    assert_eq!(adds(), 1, "the other replica's");

    // Back to life: its first call's answer is waiting for it, and its second call's place is free. It learns
    // that the response is another's before that call goes out.
    paused.resume();
    paused
        .logs
        .wait_for(
            "another replica took this response over while this one's lease lapsed; giving it up",
        )
        .await;
    paused
        .logs
        .wait_for("response handed over before it ended")
        .await;
    assert_eq!(adds(), 1, "the paused replica sent its waiting call");
}

#[tokio::test]
async fn a_lapse_whose_check_failed_is_checked_again_at_the_next_beat() {
    let mut cluster = Cluster::postgres().await;
    // A statement that gets no answer is given up after a second.
    let paused = cluster.replica(&[
        ("GATEWAY__DATABASE__REPLY_TIMEOUT_MS", "1000"),
        ("GATEWAY__DATABASE__SERVER_KEEPALIVE_SECS", "0"),
    ]);
    let other = cluster.replica(&[]);
    cluster.configure(&paused).await;
    let created = cluster
        .create(
            &paused,
            json!({"model": "mock", "input": "!call gate {}", "background": true}),
        )
        .await;
    let id = created["id"].as_str().expect("id").to_owned();
    cluster.gate_calls(1).await;

    // Frozen with its call held at the gate; the other replica takes the response over once the lease ran out,
    // and sends the call again. The gate stays shut: the paused replica's run waits on its call, writing
    // nothing, so only its beat's check can tell it the response is another's.
    paused.pause();
    cluster.gate_calls(2).await;

    // Back to life with the response's row locked: its first beat finds the lease lapsed, but the check of
    // which responses are still its own gets no answer.
    let pool = sqlx::PgPool::connect(cluster.db.url())
        .await
        .expect("connect");
    let mut lock = pool.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM responses WHERE id = $1 FOR UPDATE")
        .bind(&id)
        .execute(&mut *lock)
        .await
        .expect("lock");
    paused.resume();
    paused
        .logs
        .wait_for("could not check which responses are still this replica's")
        .await;
    lock.rollback().await.expect("unlock");

    // The next beat finds the lease kept (its heartbeat is fresh), and checks all the same.
    paused
        .logs
        .wait_for(
            "another replica took this response over while this one's lease lapsed; giving it up",
        )
        .await;
    cluster.tools.open_gate();
    let finished = cluster.ended(&other, &id).await;
    assert_gate_round(&finished);
}

/// Asks for response `id`'s cancel in the store alone, as a cancel whose notification reached no replica.
async fn cancel_in_store(cluster: &Cluster, id: &str) {
    let pool = sqlx::PgPool::connect(cluster.db.url())
        .await
        .expect("connect");
    sqlx::query("UPDATE responses SET cancel_requested = TRUE WHERE id = $1")
        .bind(id)
        .execute(&pool)
        .await
        .expect("request the cancel");
    pool.close().await;
}

#[tokio::test]
async fn a_cancel_whose_notification_was_lost_keeps_the_next_batch_from_going_out() {
    use gateway_testkit::{Call, Reply};
    let mut cluster = Cluster::postgres().await;
    // Beats ten minutes apart: the beat's own look at cancel requests comes too late to matter.
    let replica = cluster.replica(&[("GATEWAY__DURABILITY__LEASE_MS", "1800000")]);
    cluster.configure(&replica).await;
    cluster
        .model
        .push(Reply::tool_calls(vec![Call::new("gate", json!({}))]));
    cluster.model.push(Reply::tool_calls(vec![Call::new(
        "add",
        json!({"a": 1, "b": 2}),
    )]));
    cluster.model.push(Reply::text("Never asked for."));
    let created = cluster
        .create(
            &replica,
            json!({"model": "mock", "input": "Hi", "background": true}),
        )
        .await;
    let id = created["id"].as_str().expect("id").to_owned();
    cluster.gate_calls(1).await;

    // Cancelled while its first call is in flight, its notification lost: only the store knows.
    cancel_in_store(&cluster, &id).await;
    cluster.tools.open_gate();

    // The run learns of the cancel from its next write (the model call's, or the one recording the next batch
    // as started), and sends nothing more.
    let ended = cluster.ended(&replica, &id).await;
    assert_eq!(ended["status"], "cancelled", "{ended:#}");
    let adds = cluster
        .tools
        .calls()
        .iter()
        .filter(|call| call.tool == "add")
        .count();
    assert_eq!(adds, 0, "a call went out after the cancel was recorded");
}

#[tokio::test]
async fn a_cancel_asked_for_while_the_owner_was_dead_mid_first_model_call_ends_it_and_its_stream() {
    use gateway_testkit::Reply;
    let mut cluster = Cluster::postgres().await;
    let mut first = cluster.replica(&[]);
    cluster.configure(&first).await;
    cluster
        .model
        .push(Reply::text("Never delivered.").with_delay(Duration::from_secs(300)));
    cluster
        .model
        .push(Reply::text("Called again after the cancel."));
    let created = cluster
        .create(
            &first,
            json!({"model": "mock", "input": "Hi", "background": true}),
        )
        .await;
    let id = created["id"].as_str().expect("id").to_owned();
    assert!(cluster.model.wait_for_requests(1, PATIENCE).await);

    // The owner dies in its first model call, no step of it stored; a cancel is asked for while no replica runs
    // the response.
    first.kill();
    cancel_in_store(&cluster, &id).await;

    // The replica that resumes it ends it cancelled without calling the model again; a follower that saw it
    // start (the store's account, with no step, reads as a response that never ran) is told its end.
    let restarted = cluster.replica(&[]);
    let ended = cluster.ended(&restarted, &id).await;
    assert_eq!(ended["status"], "cancelled", "{ended:#}");
    assert_eq!(
        cluster.model.requests().len(),
        1,
        "the model was called again"
    );
}

#[tokio::test]
async fn a_cancel_asked_for_while_the_owner_was_dead_is_heeded_before_the_model_is_called_again() {
    use gateway_testkit::{Call, Reply};
    let mut cluster = Cluster::postgres().await;
    let mut first = cluster.replica(&[]);
    cluster.configure(&first).await;
    cluster
        .model
        .push(Reply::tool_calls(vec![Call::new("gate", json!({}))]));
    cluster
        .model
        .push(Reply::text("Never delivered.").with_delay(Duration::from_secs(300)));
    let created = cluster
        .create(
            &first,
            json!({"model": "mock", "input": "Hi", "background": true}),
        )
        .await;
    let id = created["id"].as_str().expect("id").to_owned();
    cluster.gate_calls(1).await;
    cluster.tools.open_gate();
    // The tool's answer is stored; the model call after it is in flight.
    assert!(cluster.model.wait_for_requests(2, PATIENCE).await);

    // The owner dies mid model call; a cancel is asked for while no replica runs the response (only the store
    // knows of it).
    first.kill();
    cancel_in_store(&cluster, &id).await;

    // The replica that resumes it ends it cancelled, without calling the model again.
    let restarted = cluster.replica(&[]);
    let ended = cluster.ended(&restarted, &id).await;
    assert_eq!(ended["status"], "cancelled", "{ended:#}");
    assert_eq!(
        cluster.model.requests().len(),
        2,
        "the model was called again"
    );
}

#[tokio::test]
async fn a_tool_answer_that_arrives_while_a_step_write_waits_is_read_not_taken_for_a_timeout() {
    let mut cluster = Cluster::postgres().await;
    let replica = cluster.replica(&[]);
    cluster.configure(&replica).await;
    let slow = gateway_testkit::tool_server::tool_definitions()
        .into_iter()
        .find(|d| d.name == "slow")
        .expect("testkit tool");
    cluster
        .attach_tool_source(
            &replica,
            json!({"name": "slow", "description": slow.description, "parameters": slow.parameters,
                   "url": cluster.tools.url("slow")}),
        )
        .await;
    // The testkit's gate, offered as a tool whose calls time out after three seconds.
    cluster
        .attach_tool_source(
            &replica,
            json!({"name": "held", "description": "Held until the test opens the gate.",
                   "parameters": {"type": "object"}, "url": cluster.tools.url("gate"), "timeout_ms": 3000}),
        )
        .await;
    let pool = sqlx::PgPool::connect(cluster.db.url())
        .await
        .expect("connect");
    let created = cluster
        .create(
            &replica,
            json!({"model": "mock", "input": "!call slow {\"ms\": 1000} !call held {}", "background": true}),
        )
        .await;
    let id = created["id"].as_str().expect("id").to_owned();
    cluster.gate_calls(1).await;
    cluster
        .tools
        .wait_for_calls("slow", 1, PATIENCE)
        .await
        .expect("the slow call went out");

    // The response's row locked (within the second the slow call takes): the write that records the slow call's
    // end waits behind it, with the held call still out.
    let mut lock = pool.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM responses WHERE id = $1 FOR UPDATE")
        .bind(&id)
        .execute(&mut *lock)
        .await
        .expect("lock");
    a_statement_waits_on_a_lock(&pool, "%UNNEST%", PATIENCE).await;

    // The held call is answered at once; the write goes on waiting past that call's timeout, three seconds
    // after it went out (the fault's length, not a wait for anything).
    cluster.tools.open_gate();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    lock.rollback().await.expect("unlock");

    let ended = cluster.ended(&replica, &id).await;
    assert_eq!(ended["status"], "completed", "{ended:#}");
    let held = ended["output"]
        .as_array()
        .expect("output")
        .iter()
        .find(|item| item["name"] == "held")
        .expect("the held call")
        .clone();
    assert_eq!(held["error"], serde_json::Value::Null, "{held:#}");
    assert_eq!(held["status"], "completed", "{held:#}");
}
