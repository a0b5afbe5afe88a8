//! Webhook deliveries across real `gateway serve` processes (SPEC 15): a delivery cut by a kill -9 is made after
//! the restart with the same `webhook-id`, and two replicas on one database deliver each event once.
//!
//! Nothing here sleeps to synchronise: tests wait for requests at the receiver or for rows in the database.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use gateway_testkit::{WebhookAnswer, WebhookReceiver};
use reqwest::Method;
use serde_json::{json, Value};

/// Quick polls and a short lock, so that a delivery held by a killed replica is taken again soon.
const SETTINGS: &[(&str, &str)] = &[
    ("GATEWAY__WEBHOOKS__POLL_MS", "20"),
    ("GATEWAY__WEBHOOKS__LOCK_MS", "1500"),
    ("GATEWAY__WEBHOOKS__TIMEOUT_MS", "400"),
    ("GATEWAY__WEBHOOKS__BACKOFF_MS", "20"),
];

/// Registers `receiver` for the cluster's project through `replica`; the endpoint.
async fn register(cluster: &Cluster, replica: &Replica, receiver: &WebhookReceiver) -> Value {
    let projects = cluster.admin(replica, Method::GET, "/projects", None).await;
    let project = projects["data"][0]["id"]
        .as_str()
        .expect("project")
        .to_owned();
    let webhook = cluster
        .admin(
            replica,
            Method::POST,
            &format!("/projects/{project}/webhooks"),
            Some(json!({"url": receiver.url()})),
        )
        .await;
    assert!(webhook["secret"].is_string(), "{webhook:#}");
    json!({"project": project, "id": webhook["id"]})
}

async fn background(cluster: &Cluster, replica: &Replica) -> String {
    let created = cluster
        .create(
            replica,
            json!({"model": "mock", "input": "Hi", "background": true}),
        )
        .await;
    created["id"].as_str().expect("id").to_owned()
}

async fn a_delivery_cut_by_a_kill_is_made_after_the_restart_with_the_same_webhook_id(
    mut cluster: Cluster,
) {
    let mut first = cluster.replica(SETTINGS);
    cluster.configure(&first).await;
    let receiver = WebhookReceiver::start().await.expect("receiver");
    // The first try is held without an answer: the replica is killed while it waits.
    receiver.script(&[WebhookAnswer::Hang]);
    let webhook = register(&cluster, &first, &receiver).await;
    let id = background(&cluster, &first).await;
    assert!(
        receiver.wait_for(1, PATIENCE, |_| true).await,
        "the first try arrived"
    );
    first.kill();

    let second = cluster.replica(SETTINGS);
    assert!(
        receiver
            .wait_for(1, PATIENCE, |r| r.answered == Some(200))
            .await,
        "delivered after the restart"
    );
    let received = receiver.received();
    assert_eq!(received.len(), 2, "the cut try and the delivery");
    assert_eq!(
        received[0].header("webhook-id"),
        received[1].header("webhook-id")
    );
    let event: Value = serde_json::from_str(&received[1].body).expect("json");
    assert_eq!(event["data"]["id"], json!(id));
    assert_eq!(event["type"], "response.completed");
    let path = format!(
        "/projects/{}/webhooks/{}/deliveries",
        webhook["project"].as_str().unwrap(),
        webhook["id"].as_str().unwrap()
    );
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let listed = cluster.admin(&second, Method::GET, &path, None).await;
        if listed["data"][0]["status"] == "delivered" {
            assert_eq!(listed["data"][0]["attempts"], 2, "{listed:#}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never recorded as delivered: {listed:#}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn on_postgres_a_delivery_cut_by_a_kill_is_made_after_the_restart_with_the_same_webhook_id() {
    a_delivery_cut_by_a_kill_is_made_after_the_restart_with_the_same_webhook_id(
        Cluster::postgres().await,
    )
    .await;
}

#[tokio::test]
async fn on_the_embedded_store_a_delivery_cut_by_a_kill_is_made_after_the_restart_with_the_same_webhook_id(
) {
    a_delivery_cut_by_a_kill_is_made_after_the_restart_with_the_same_webhook_id(
        Cluster::sqlite().await,
    )
    .await;
}

#[tokio::test]
async fn two_replicas_deliver_each_event_once() {
    const RESPONSES: usize = 40;
    let mut cluster = Cluster::postgres().await;
    let first = cluster.replica(SETTINGS);
    let second = cluster.replica(SETTINGS);
    cluster.configure(&first).await;
    let receiver = WebhookReceiver::start().await.expect("receiver");
    register(&cluster, &first, &receiver).await;

    let created = futures::future::join_all((0..RESPONSES).map(|n| {
        let replica = if n % 2 == 0 { &first } else { &second };
        background(&cluster, replica)
    }))
    .await;
    assert!(
        receiver.wait_for(RESPONSES, PATIENCE, |_| true).await,
        "every event delivered: {} of {RESPONSES}",
        receiver.received().len()
    );
    // Every try recorded: a duplicate would have been sent by now (a delivery is only taken again once its
    // lock lapses, and none is held any more).
    let pool = sqlx::PgPool::connect(cluster.db.url())
        .await
        .expect("connect");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let (delivered, locked): (i64, i64) = sqlx::query_as(
            "SELECT COUNT(*) FILTER (WHERE status = 'delivered'), COUNT(locked_until) FROM webhook_deliveries",
        )
        .fetch_one(&pool)
        .await
        .expect("count");
        if delivered == RESPONSES as i64 && locked == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{delivered} recorded as delivered, {locked} held"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let mut per_event = BTreeMap::<String, usize>::new();
    let mut delivered_responses = Vec::new();
    for received in receiver.received() {
        *per_event
            .entry(received.header("webhook-id").expect("id").to_owned())
            .or_default() += 1;
        let event: Value = serde_json::from_str(&received.body).expect("json");
        delivered_responses.push(event["data"]["id"].as_str().expect("response").to_owned());
    }
    let duplicates: usize = per_event.values().map(|n| n - 1).sum();
    eprintln!("{RESPONSES} background responses over two replicas: {} events, {duplicates} duplicate deliveries", per_event.len());
    assert_eq!(per_event.len(), RESPONSES);
    assert_eq!(duplicates, 0, "{per_event:?}");
    delivered_responses.sort();
    let mut expected = created.clone();
    expected.sort();
    assert_eq!(delivered_responses, expected);
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM webhook_deliveries")
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(
        rows, RESPONSES as i64,
        "one delivery per event and endpoint"
    );
}
