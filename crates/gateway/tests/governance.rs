//! Governance across replicas (SPEC 13), with the real `gateway` binary: several processes on one Postgres hold
//! one key's requests-per-minute limit together, and a response taken over after a kill -9 has its usage recorded
//! once per model call, neither lost nor doubled.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;

use common::*;
use serde_json::{json, Value};

/// The id of the cluster's only key, read through `replica`'s admin API.
async fn key_id(cluster: &Cluster, replica: &Replica) -> String {
    let admin = |path: &str| format!("{}/admin/v1{path}", replica.base_url);
    let get = |url: String| {
        cluster
            .http
            .get(url)
            .bearer_auth(&cluster.admin_token)
            .send()
    };
    let projects = json(get(admin("/projects")).await).await;
    let project = projects["data"][0]["id"]
        .as_str()
        .expect("project")
        .to_owned();
    let keys = json(get(admin(&format!("/projects/{project}/api_keys"))).await).await;
    keys["data"][0]["id"].as_str().expect("key").to_owned()
}

/// `PATCH /admin/v1/api_keys/{id}` through `replica`.
async fn patch_key(cluster: &Cluster, replica: &Replica, id: &str, body: Value) {
    let answer = json(
        cluster
            .http
            .patch(format!("{}/admin/v1/api_keys/{id}", replica.base_url))
            .bearer_auth(&cluster.admin_token)
            .json(&body)
            .send()
            .await,
    )
    .await;
    assert_eq!(answer["id"], id, "{answer:#}");
}

/// Three replicas on one Postgres database, configured, the cluster's key held to `limits`.
async fn three_replicas_with(limits: Value) -> (Cluster, [Replica; 3]) {
    let mut cluster = Cluster::postgres().await;
    let replicas = [
        cluster.replica(&[]),
        cluster.replica(&[]),
        cluster.replica(&[]),
    ];
    cluster.configure(&replicas[0]).await;
    let key = key_id(&cluster, &replicas[0]).await;
    patch_key(&cluster, &replicas[0], &key, json!({ "limits": limits })).await;
    (cluster, replicas)
}

#[tokio::test]
async fn three_replicas_admit_no_more_than_a_keys_requests_per_minute_together() {
    const LIMIT: usize = 30;
    const SENT: usize = 90;
    let (cluster, replicas) = three_replicas_with(json!({"rpm": LIMIT})).await;

    // Every replica at once, each its share of the creates, concurrently.
    let creates = (0..SENT).map(|n| {
        let replica = &replicas[n % replicas.len()];
        cluster
            .http
            .post(format!("{}/v1/responses", replica.base_url))
            .bearer_auth(&cluster.key)
            .json(&json!({"model": "mock", "input": "Hi", "store": false}))
            .send()
    });
    let answers = futures::future::join_all(creates).await;

    // Accepted creates per minute window, by the time each response was created (the windows the limit counts).
    let mut accepted: BTreeMap<i64, usize> = BTreeMap::new();
    let mut refused = 0;
    for answer in answers {
        let answer = answer.expect("answer");
        match answer.status().as_u16() {
            200 => {
                let body: Value = answer.json().await.expect("json");
                let created = body["created_at"].as_i64().expect("created_at");
                *accepted
                    .entry(created - created.rem_euclid(60))
                    .or_default() += 1;
            }
            429 => {
                let body: Value = answer.json().await.expect("json");
                assert_eq!(body["error"]["code"], "rate_limit_exceeded", "{body:#}");
                refused += 1;
            }
            other => panic!("unexpected status {other}"),
        }
    }
    let total: usize = accepted.values().sum();
    eprintln!("rpm {LIMIT} over 3 replicas: accepted {accepted:?}, refused {refused}");
    assert_eq!(total + refused, SENT);
    for (window, count) in &accepted {
        assert!(
            *count <= LIMIT,
            "window {window} admitted {count} > {LIMIT}"
        );
    }
    assert!(
        total >= LIMIT,
        "a limit of {LIMIT} with slices of 1 admits at least {LIMIT}: {accepted:?}"
    );
}

#[tokio::test]
async fn three_replicas_hold_a_keys_tokens_per_minute_within_the_calls_in_flight() {
    // The mock model's answers use 15 tokens each (10 in, 5 out).
    const LIMIT: u64 = 300;
    const PER_CALL: u64 = 15;
    const PER_REPLICA: usize = 30;
    let (cluster, replicas) = three_replicas_with(json!({"tpm": LIMIT})).await;

    // Each replica a client sending one create after another: three calls in flight at most.
    let client = |replica: &Replica| {
        let url = format!("{}/v1/responses", replica.base_url);
        let (http, key) = (cluster.http.clone(), cluster.key.clone());
        async move {
            let mut accepted = BTreeMap::<i64, u64>::new();
            for _ in 0..PER_REPLICA {
                let answer = http
                    .post(&url)
                    .bearer_auth(&key)
                    .json(&json!({"model": "mock", "input": "Hi", "store": false}))
                    .send()
                    .await
                    .expect("answer");
                if answer.status() == 200 {
                    let body: Value = answer.json().await.expect("json");
                    let created = body["created_at"].as_i64().expect("created_at");
                    let tokens = body["usage"]["total_tokens"].as_u64().expect("usage");
                    *accepted
                        .entry(created - created.rem_euclid(60))
                        .or_default() += tokens;
                } else {
                    assert_eq!(answer.status(), 429);
                }
            }
            accepted
        }
    };
    let per_replica = futures::future::join_all(replicas.iter().map(client)).await;

    let mut tokens = BTreeMap::<i64, u64>::new();
    for accepted in per_replica {
        for (window, used) in accepted {
            *tokens.entry(window).or_default() += used;
        }
    }
    eprintln!(
        "tpm {LIMIT} over 3 replicas, 3 calls in flight: tokens admitted per window {tokens:?}"
    );
    // Admitted while under the limit: each replica may have a call in flight, and see the others' last ones late.
    let tolerance = 3 * 2 * PER_CALL;
    for (window, used) in &tokens {
        assert!(
            *used <= LIMIT + tolerance,
            "window {window} used {used} tokens of {LIMIT} (+{tolerance})"
        );
    }
    assert!(tokens.values().any(|used| *used >= LIMIT), "{tokens:?}");
}

/// `(model rows, tool rows, input tokens, output tokens)` of the usage recorded for `response_id`.
async fn usage_of(cluster: &Cluster, response_id: &str) -> (i64, i64, i64, i64) {
    let store = gateway::store::Store::connect(cluster.db.url(), 1)
        .await
        .expect("store");
    let gateway::store::Backend::Postgres(pool) = store.backend() else {
        panic!("a Postgres cluster");
    };
    sqlx::query_as(
        "SELECT COUNT(*) FILTER (WHERE tool_source IS NULL), COUNT(tool_source),
                COALESCE(SUM(input_tokens), 0)::bigint, COALESCE(SUM(output_tokens), 0)::bigint
         FROM usage_records WHERE response_id = $1",
    )
    .bind(response_id)
    .fetch_one(pool)
    .await
    .expect("usage")
}

#[tokio::test]
async fn a_response_taken_over_after_a_kill_records_each_model_call_once() {
    let (cluster, mut doomed, survivor, id) =
        Cluster::two_replicas_with_a_gate_call_in_flight().await;
    // The first model call is recorded with the write that the gate call waited for.
    let (model_rows, _, _, _) = usage_of(&cluster, &id).await;
    assert_eq!(
        model_rows, 1,
        "the first model call's usage is in the store before its tool call goes out"
    );

    doomed.kill();
    cluster.gate_calls(2).await;
    cluster.tools.open_gate();
    let response = cluster.ended(&survivor, &id).await;

    assert_gate_round(&response);
    let (model_rows, tool_rows, input, output) = usage_of(&cluster, &id).await;
    assert_eq!(model_rows, 2, "two model calls, each recorded once");
    assert_eq!(
        tool_rows, 1,
        "one tool call, sent twice under one key, counted once"
    );
    assert_eq!(input, response["usage"]["input_tokens"].as_i64().unwrap());
    assert_eq!(output, response["usage"]["output_tokens"].as_i64().unwrap());
}

/// The places `replica_id` holds under `max_concurrent` limits, as the store counts them.
async fn places_held(cluster: &Cluster, replica_id: &str) -> i64 {
    let store = gateway::store::Store::connect(cluster.db.url(), 1)
        .await
        .expect("store");
    let gateway::store::Backend::Postgres(pool) = store.backend() else {
        panic!("a Postgres cluster");
    };
    sqlx::query_scalar(
        "SELECT COALESCE(SUM(running), 0)::bigint FROM running_counts WHERE replica_id = $1",
    )
    .bind(replica_id)
    .fetch_one(pool)
    .await
    .expect("places")
}

/// `replica`'s id, from its start-up line.
fn replica_id(replica: &Replica) -> String {
    replica
        .logs
        .lines()
        .iter()
        .find(|l| l["fields"]["message"] == "gateway listening")
        .and_then(|l| l["fields"]["replica.id"].as_str())
        .expect("the start-up line names the replica")
        .to_owned()
}

#[tokio::test]
async fn a_response_taken_over_after_a_kill_keeps_its_place_under_max_concurrent() {
    let mut cluster = Cluster::postgres().await;
    let mut doomed = cluster.replica(&[]);
    let survivor = cluster.replica(&[]);
    cluster.configure(&doomed).await;
    let key = key_id(&cluster, &doomed).await;
    patch_key(
        &cluster,
        &doomed,
        &key,
        json!({"limits": {"max_concurrent": 1}}),
    )
    .await;
    let id = cluster.background_gate_call(&doomed).await;
    cluster.gate_calls(1).await;
    let doomed_id = replica_id(&doomed);
    assert_eq!(places_held(&cluster, &doomed_id).await, 1);

    doomed.kill();
    cluster.gate_calls(2).await;
    // The dead replica's place is taken back once its lease lapsed (as the survivor claimed its response).
    let mut held = 1;
    for _ in 0..1000 {
        held = places_held(&cluster, &doomed_id).await;
        if held == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(held, 0, "the dead replica's place was taken back");
    assert_eq!(
        places_held(&cluster, &replica_id(&survivor)).await,
        1,
        "the resumed response holds the key's one place on the survivor"
    );
    let refused = cluster
        .http
        .post(format!("{}/v1/responses", survivor.base_url))
        .bearer_auth(&cluster.key)
        .json(&json!({"model": "mock", "input": "Hi"}))
        .send()
        .await
        .expect("answer");
    assert_eq!(
        refused.status(),
        429,
        "the one place is the resumed response's"
    );

    cluster.tools.open_gate();
    let response = cluster.ended(&survivor, &id).await;
    assert_gate_round(&response);
}
