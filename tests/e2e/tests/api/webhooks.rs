//! Webhooks (SPEC 15): a background response's ending delivered to the project's endpoints, signed as Standard
//! Webhooks in OpenAI's event shape, retried with the same `webhook-id`, never through a redirect; the admin API
//! that registers endpoints (secret shown once) and lists deliveries.

use std::time::Duration;

use crate::common::*;
use gateway_e2e::{Tenant, TestGateway};
use gateway_testkit::{ReceivedWebhook, WebhookAnswer, WebhookReceiver};
use reqwest::Method;
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(20);

/// A gateway whose deliveries are tried again after 20 ms (then 80, 320, ...), up to `max_attempts`.
async fn fast_retrying(max_attempts: u32) -> (TestGateway, Tenant) {
    let gw = TestGateway::start_with(|config| {
        config.webhooks.backoff_ms = 20;
        config.webhooks.max_attempts = max_attempts;
        config.webhooks.poll_ms = 20;
    })
    .await;
    let tenant = gw.tenant("acme").await;
    (gw, tenant)
}

async fn register(gw: &TestGateway, tenant: &Tenant, url: &str, events: Option<Value>) -> Value {
    let mut body = json!({"url": url});
    if let Some(events) = events {
        body["events"] = events;
    }
    gw.admin_ok(
        Method::POST,
        &format!("/projects/{}/webhooks", tenant.project_id),
        Some(body),
    )
    .await
}

async fn background(gw: &TestGateway, tenant: &Tenant) -> String {
    let body = create_ok(
        gw,
        &tenant.key,
        json!({"model": "mock", "input": "Hi", "background": true}),
    )
    .await;
    id_of(&body)
}

async fn deliveries(gw: &TestGateway, tenant: &Tenant, webhook: &Value) -> Vec<Value> {
    let path = format!(
        "/projects/{}/webhooks/{}/deliveries",
        tenant.project_id,
        id_of(webhook)
    );
    gw.admin_ok(Method::GET, &path, None).await["data"]
        .as_array()
        .expect("data")
        .clone()
}

/// Waits until the delivery list satisfies `done`.
async fn deliveries_until(
    gw: &TestGateway,
    tenant: &Tenant,
    webhook: &Value,
    done: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let started = tokio::time::Instant::now();
    loop {
        let listed = deliveries(gw, tenant, webhook).await;
        if done(&listed) || started.elapsed() > WAIT {
            return listed;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn assert_signed(received: &ReceivedWebhook, secret: &str) {
    let id = received.header("webhook-id").expect("webhook-id");
    let timestamp: i64 = received
        .header("webhook-timestamp")
        .expect("timestamp")
        .parse()
        .expect("integer seconds");
    let expected = gateway::webhooks::signature(secret, id, timestamp, &received.body);
    assert_eq!(
        received.header("webhook-signature"),
        Some(expected.as_str())
    );
    assert_eq!(received.header("content-type"), Some("application/json"));
}

#[tokio::test]
async fn a_background_responses_ending_is_delivered_signed_in_openais_event_shape() {
    let (gw, tenant) = fast_retrying(3).await;
    let receiver = WebhookReceiver::start().await.expect("receiver");
    let webhook = register(&gw, &tenant, &receiver.url(), None).await;
    let secret = webhook["secret"]
        .as_str()
        .expect("secret shown once")
        .to_owned();
    assert!(secret.starts_with("whsec_"), "{webhook:#}");
    assert_eq!(webhook["events"].as_array().map(Vec::len), Some(4));
    let listed = gw
        .admin_ok(
            Method::GET,
            &format!("/projects/{}/webhooks", tenant.project_id),
            None,
        )
        .await;
    assert_eq!(listed["data"][0]["id"], webhook["id"]);
    assert!(
        listed["data"][0].get("secret").is_none(),
        "the secret is never shown again: {listed:#}"
    );

    // A foreground response makes no event; a background one does, once it ended.
    create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "Hi"})).await;
    let id = background(&gw, &tenant).await;
    assert!(receiver.wait_for(1, WAIT, |_| true).await, "delivered");
    let [received] = receiver.received().try_into().expect("one delivery");
    assert_signed(&received, &secret);
    let event: Value = serde_json::from_str(&received.body).expect("json");
    assert_eq!(event["type"], "response.completed");
    assert_eq!(event["object"], "event");
    assert_eq!(event["data"], json!({"id": id}));
    assert_eq!(received.header("webhook-id"), event["id"].as_str());
    assert!(event["created_at"].is_i64());
    // The receiver, told, reads the response: it has ended.
    assert_eq!(
        get_response(&gw, &tenant.key, &id).await.body["status"],
        "completed"
    );

    let listed = deliveries_until(&gw, &tenant, &webhook, |d| {
        d.first().is_some_and(|d| d["status"] == "delivered")
    })
    .await;
    assert_eq!(listed.len(), 1, "{listed:#?}");
    assert_eq!(listed[0]["status"], "delivered");
    assert_eq!(listed[0]["attempts"], 1);
    assert_eq!(listed[0]["event_id"], event["id"]);
    assert_eq!(listed[0]["response_id"], json!(id));
}

#[tokio::test]
async fn a_failing_receiver_is_tried_again_with_the_same_webhook_id() {
    let (gw, tenant) = fast_retrying(5).await;
    let receiver = WebhookReceiver::start().await.expect("receiver");
    receiver.script(&[WebhookAnswer::Status(500), WebhookAnswer::Status(503)]);
    let webhook = register(&gw, &tenant, &receiver.url(), None).await;
    let secret = webhook["secret"].as_str().expect("secret").to_owned();
    background(&gw, &tenant).await;

    assert!(
        receiver
            .wait_for(1, WAIT, |r| r.answered == Some(200))
            .await,
        "delivered in the end"
    );
    let received = receiver.received();
    assert_eq!(received.len(), 3, "two failures, then the delivery");
    let ids: Vec<_> = received.iter().map(|r| r.header("webhook-id")).collect();
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    for try_ in &received {
        assert_signed(try_, &secret);
    }
    let listed = deliveries_until(&gw, &tenant, &webhook, |d| {
        d.first().is_some_and(|d| d["status"] == "delivered")
    })
    .await;
    assert_eq!(listed[0]["status"], "delivered");
    assert_eq!(listed[0]["attempts"], 3);
}

#[tokio::test]
async fn a_redirect_is_not_followed_and_a_delivery_whose_tries_ran_out_is_failed() {
    let (gw, tenant) = fast_retrying(2).await;
    let receiver = WebhookReceiver::start().await.expect("receiver");
    receiver.script(&[WebhookAnswer::Redirect, WebhookAnswer::Redirect]);
    let webhook = register(&gw, &tenant, &receiver.url(), None).await;
    background(&gw, &tenant).await;

    let listed = deliveries_until(&gw, &tenant, &webhook, |d| {
        d.first().is_some_and(|d| d["status"] == "failed")
    })
    .await;
    assert_eq!(listed[0]["status"], "failed", "{listed:#?}");
    assert_eq!(listed[0]["attempts"], 2);
    assert_eq!(listed[0]["last_status"], 302);
    assert!(
        listed[0]["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("redirect")),
        "{listed:#?}"
    );
    assert_eq!(
        receiver.received().len(),
        2,
        "no third try, and the redirect's target was never posted to"
    );
}

#[tokio::test]
async fn an_endpoint_gets_only_the_events_it_asked_for() {
    let (gw, tenant) = fast_retrying(3).await;
    let receiver = WebhookReceiver::start().await.expect("receiver");
    let failed_only = register(
        &gw,
        &tenant,
        &receiver.url(),
        Some(json!(["response.failed"])),
    )
    .await;
    let everything = register(&gw, &tenant, &receiver.url(), None).await;
    background(&gw, &tenant).await;
    deliveries_until(&gw, &tenant, &everything, |d| {
        d.first().is_some_and(|d| d["status"] == "delivered")
    })
    .await;
    assert!(deliveries(&gw, &tenant, &failed_only).await.is_empty());
    assert_eq!(receiver.received().len(), 1);
}

#[tokio::test]
async fn bad_webhook_input_is_refused_and_stores_nothing() {
    let (gw, tenant) = gateway().await;
    let path = format!("/projects/{}/webhooks", tenant.project_id);
    for (body, param) in [
        (json!({"url": "ftp://hooks.example.com/x"}), "url"),
        (json!({"url": "hooks.example.com"}), "url"),
        (json!({}), "url"),
        (
            json!({"url": "https://hooks.example.com", "events": ["response.done"]}),
            "events[0]",
        ),
        (
            json!({"url": "https://hooks.example.com", "events": []}),
            "events",
        ),
    ] {
        let answer = gw.call(gw.admin(Method::POST, &path).json(&body)).await;
        assert_error(&answer, 400, Some(param), None);
    }
    let answer = gw
        .call(
            gw.admin(Method::POST, "/projects/proj_nope/webhooks")
                .json(&json!({"url": "https://hooks.example.com"})),
        )
        .await;
    assert_eq!(answer.status.as_u16(), 404);
    let answer = gw
        .call(gw.admin(Method::GET, &format!("{path}/wh_nope/deliveries")))
        .await;
    assert_eq!(answer.status.as_u16(), 404);
    assert_eq!(
        gw.fetch_i64("SELECT count(*) FROM webhook_endpoints").await,
        0
    );
}

#[tokio::test]
async fn a_background_response_cancelled_while_queued_is_told_to_its_endpoints() {
    let gw = TestGateway::start_with(|config| {
        config.server.max_active_responses = 1;
        config.webhooks.backoff_ms = 20;
        config.webhooks.poll_ms = 20;
    })
    .await;
    let tenant = gw.tenant("acme").await;
    gw.attach_tool(&tenant.group_id, "gate").await;
    let receiver = WebhookReceiver::start().await.expect("receiver");
    let webhook = register(
        &gw,
        &tenant,
        &receiver.url(),
        Some(json!(["response.cancelled"])),
    )
    .await;
    // The one place to run is held by a response waiting at its tool's gate: the next one stays queued.
    create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "!call gate {}", "background": true}),
    )
    .await;
    assert!(
        gw.tools.wait_for_calls("gate", 1, WAIT).await.is_some(),
        "the gate call never arrived"
    );
    let queued = background(&gw, &tenant).await;
    assert_eq!(
        get_response(&gw, &tenant.key, &queued).await.body["status"],
        "queued"
    );

    // Cancelled where it waits, by no run: its ending is told all the same.
    let cancelled = gw
        .call(gw.public(
            Method::POST,
            &format!("/responses/{queued}/cancel"),
            &tenant.key,
        ))
        .await;
    assert_eq!(
        cancelled.body["status"], "cancelled",
        "{:#}",
        cancelled.body
    );
    assert!(receiver.wait_for(1, WAIT, |_| true).await, "delivered");
    let [received] = receiver.received().try_into().expect("one delivery");
    let event: Value = serde_json::from_str(&received.body).expect("json");
    assert_eq!(event["type"], "response.cancelled");
    assert_eq!(event["data"], json!({"id": queued}));
    let listed = deliveries_until(&gw, &tenant, &webhook, |d| {
        d.first().is_some_and(|d| d["status"] == "delivered")
    })
    .await;
    assert_eq!(listed.len(), 1, "{listed:#?}");
    gw.tools.open_gate();
}

#[tokio::test]
async fn a_background_response_whose_steps_cannot_be_written_is_told_failed_to_its_endpoints() {
    let (gw, tenant) = fast_retrying(3).await;
    let receiver = WebhookReceiver::start().await.expect("receiver");
    register(&gw, &tenant, &receiver.url(), None).await;
    // Every step write is refused for good, as a database that lost a column would refuse it: the run ends on the
    // store's error path, with its ending written alone.
    match gw.store.backend() {
        gateway::store::Backend::Postgres(pool) => {
            for statement in [
                "CREATE FUNCTION refuse_steps() RETURNS trigger AS $$ BEGIN
                     RAISE EXCEPTION 'steps refused';
                 END $$ LANGUAGE plpgsql",
                "CREATE TRIGGER refuse_steps BEFORE INSERT OR UPDATE ON steps
                     FOR EACH ROW EXECUTE FUNCTION refuse_steps()",
            ] {
                sqlx::query(statement).execute(pool).await.expect("trigger");
            }
        }
        gateway::store::Backend::Sqlite(pool) => {
            for statement in [
                "CREATE TRIGGER refuse_steps BEFORE INSERT ON steps BEGIN SELECT RAISE(ABORT, 'steps refused'); END",
                "CREATE TRIGGER refuse_step_changes BEFORE UPDATE ON steps BEGIN SELECT RAISE(ABORT, 'steps refused'); END",
            ] {
                sqlx::query(statement).execute(pool).await.expect("trigger");
            }
        }
    }

    let id = background(&gw, &tenant).await;
    assert!(receiver.wait_for(1, WAIT, |_| true).await, "delivered");
    let [received] = receiver.received().try_into().expect("one delivery");
    let event: Value = serde_json::from_str(&received.body).expect("json");
    assert_eq!(event["type"], "response.failed");
    assert_eq!(event["data"], json!({"id": id}));
    let read = get_response(&gw, &tenant.key, &id).await;
    assert_eq!(read.body["status"], "failed", "{:#}", read.body);
}
