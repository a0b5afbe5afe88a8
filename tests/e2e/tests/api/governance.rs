//! Governance (SPEC 13): rate limits and budgets on keys and projects refuse a create with OpenAI's 429 and
//! nothing stored or called; a loop that spends its budget stops; expired keys are refused; usage is recorded
//! once, with cost from the deployment's prices.

use crate::common::*;
use gateway_e2e::{Answer, Tenant, TestGateway};
use gateway_testkit::{Call, Reply};
use reqwest::Method;
use serde_json::{json, Value};

async fn patch_key(gw: &TestGateway, tenant: &Tenant, body: Value) -> Value {
    gw.admin_ok(
        Method::PATCH,
        &format!("/api_keys/{}", tenant.key_id),
        Some(body),
    )
    .await
}

async fn patch_project(gw: &TestGateway, tenant: &Tenant, body: Value) -> Value {
    gw.admin_ok(
        Method::PATCH,
        &format!("/projects/{}", tenant.project_id),
        Some(body),
    )
    .await
}

/// Prices the `mock` deployment at $1 per million input tokens and $2 per million output tokens.
async fn price_mock(gw: &TestGateway, tenant: &Tenant) {
    gw.admin_ok(
        Method::PATCH,
        &format!("/deployments/{}", tenant.deployment_id),
        Some(json!({"pricing": {"input_per_mtok": 1.0, "output_per_mtok": 2.0}})),
    )
    .await;
}

async fn hello(gw: &TestGateway, key: &str) -> Answer {
    gw.create(key, json!({"model": "mock", "input": "Hi"}))
        .await
}

fn header<'a>(answer: &'a Answer, name: &str) -> &'a str {
    answer
        .headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_else(|| panic!("no {name} header in {:?}", answer.headers))
}

/// A 429 refusal in OpenAI's shape that stored and called nothing more.
async fn assert_refused(
    gw: &TestGateway,
    answer: &Answer,
    kind: &str,
    code: &str,
    before: (i64, i64, i64),
    calls: usize,
) {
    assert_eq!(answer.status, 429, "{:#}", answer.body);
    let error = answer.error();
    assert_eq!(error["code"], code, "{:#}", answer.body);
    assert_eq!(error["type"], kind, "{:#}", answer.body);
    assert!(error["param"].is_null(), "{:#}", answer.body);
    assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()));
    assert_eq!(stored_rows(gw).await, before, "nothing stored");
    assert_eq!(gw.model.requests().len(), calls, "no model call");
}

#[tokio::test]
async fn a_key_over_its_requests_per_minute_gets_openais_429_and_nothing_runs() {
    let (gw, tenant) = gateway().await;
    patch_key(&gw, &tenant, json!({"limits": {"rpm": 2}})).await;
    gw.model.push(Reply::text("one"));
    gw.model.push(Reply::text("two"));

    let first = hello(&gw, &tenant.key).await;
    let second = hello(&gw, &tenant.key).await;
    let before = stored_rows(&gw).await;
    let third = hello(&gw, &tenant.key).await;

    assert_eq!(first.status, 200, "{:#}", first.body);
    assert_eq!(header(&first, "x-ratelimit-limit-requests"), "2");
    assert_eq!(header(&first, "x-ratelimit-remaining-requests"), "1");
    assert_eq!(header(&second, "x-ratelimit-remaining-requests"), "0");
    assert!(header(&first, "x-ratelimit-reset-requests").ends_with('s'));
    assert_refused(&gw, &third, "requests", "rate_limit_exceeded", before, 2).await;
    assert_eq!(header(&third, "x-ratelimit-limit-requests"), "2");
    assert_eq!(header(&third, "x-ratelimit-remaining-requests"), "0");
    assert_eq!(header(&third, "x-should-retry"), "true");
    let retry_after: u64 = header(&third, "retry-after").parse().unwrap();
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    let message = third.error()["message"].as_str().unwrap();
    assert!(message.contains(&tenant.key_id), "{message}");
}

#[tokio::test]
async fn the_tighter_of_project_and_key_limits_wins_and_null_removes_a_limit() {
    let (gw, tenant) = gateway().await;
    patch_key(&gw, &tenant, json!({"limits": {"rpm": 5}})).await;
    patch_project(&gw, &tenant, json!({"limits": {"rpm": 1}})).await;
    gw.model.push(Reply::text("one"));
    let first = hello(&gw, &tenant.key).await;
    assert_eq!(first.status, 200, "{:#}", first.body);
    assert_eq!(
        header(&first, "x-ratelimit-limit-requests"),
        "1",
        "the project's is tighter"
    );

    let before = stored_rows(&gw).await;
    let refused = hello(&gw, &tenant.key).await;
    assert_refused(&gw, &refused, "requests", "rate_limit_exceeded", before, 1).await;
    assert!(refused.error()["message"]
        .as_str()
        .unwrap()
        .contains(&tenant.project_id));

    // A second key of the project shares the project's limit.
    let other = gw
        .admin_ok(
            Method::POST,
            &format!("/projects/{}/api_keys", tenant.project_id),
            Some(json!({"name": "second"})),
        )
        .await;
    let other_key = other["key"].as_str().unwrap().to_owned();
    let second_key = hello(&gw, &other_key).await;
    assert_eq!(second_key.status, 429, "{:#}", second_key.body);
    assert_eq!(second_key.error()["code"], "rate_limit_exceeded");

    patch_project(&gw, &tenant, json!({"limits": {"rpm": null}})).await;
    gw.model.push(Reply::text("again"));
    let after = hello(&gw, &tenant.key).await;
    assert_eq!(after.status, 200, "{:#}", after.body);
    assert_eq!(
        header(&after, "x-ratelimit-limit-requests"),
        "5",
        "only the key's is left"
    );
}

#[tokio::test]
async fn tokens_per_minute_count_the_usage_models_report() {
    let (gw, tenant) = gateway().await;
    patch_key(&gw, &tenant, json!({"limits": {"tpm": 20}})).await;
    gw.model.push(Reply::text("one").with_usage(10, 5));
    gw.model.push(Reply::text("two").with_usage(3, 2));

    let first = hello(&gw, &tenant.key).await;
    assert_eq!(first.status, 200, "{:#}", first.body);
    assert_eq!(header(&first, "x-ratelimit-limit-tokens"), "20");
    assert_eq!(header(&first, "x-ratelimit-remaining-tokens"), "20");
    let second = hello(&gw, &tenant.key).await;
    assert_eq!(second.status, 200, "{:#}", second.body);
    assert_eq!(
        header(&second, "x-ratelimit-remaining-tokens"),
        "5",
        "15 tokens used"
    );

    let before = stored_rows(&gw).await;
    let third = hello(&gw, &tenant.key).await;
    assert_refused(&gw, &third, "tokens", "rate_limit_exceeded", before, 2).await;
    assert_eq!(header(&third, "x-ratelimit-remaining-tokens"), "0");
}

#[tokio::test]
async fn max_concurrent_refuses_while_a_slow_tool_holds_the_place_and_admits_after() {
    let (gw, tenant) = gateway_with_tools(&["barrier"]).await;
    patch_key(&gw, &tenant, json!({"limits": {"max_concurrent": 1}})).await;
    let first = create_waiting_in_barrier(&gw, &tenant.key).await;

    let before = stored_rows(&gw).await;
    let refused = hello(&gw, &tenant.key).await;
    assert_refused(&gw, &refused, "requests", "rate_limit_exceeded", before, 1).await;

    release_barrier(&gw, 2).await;
    let first = first.await.expect("task").expect("first create");
    assert_eq!(first.status(), 200);
    // Its place was given back before it was answered: the next create is admitted at once, and so is each of
    // a client's creates made one after another.
    for n in 0..20 {
        gw.model.push(Reply::text("Room again."));
        let next = hello(&gw, &tenant.key).await;
        assert_eq!(next.status, 200, "create {n}: {:#}", next.body);
    }
}

#[tokio::test]
async fn a_spent_budget_refuses_creates_as_insufficient_quota() {
    let (gw, tenant) = gateway().await;
    price_mock(&gw, &tenant).await;
    // One call of 10 input and 5 output tokens costs $0.00002.
    patch_key(
        &gw,
        &tenant,
        json!({"budget": {"usd": 0.00001, "period": "day"}}),
    )
    .await;
    gw.model.push(Reply::text("one").with_usage(10, 5));
    let first = hello(&gw, &tenant.key).await;
    assert_eq!(first.status, 200, "{:#}", first.body);

    let before = stored_rows(&gw).await;
    let refused = hello(&gw, &tenant.key).await;
    assert_refused(
        &gw,
        &refused,
        "insufficient_quota",
        "insufficient_quota",
        before,
        1,
    )
    .await;
    assert_eq!(header(&refused, "x-should-retry"), "false");

    // Raised, it admits again.
    patch_key(
        &gw,
        &tenant,
        json!({"budget": {"usd": 1.0, "period": "month"}}),
    )
    .await;
    gw.model.push(Reply::text("two"));
    assert_eq!(hello(&gw, &tenant.key).await.status, 200);
}

#[tokio::test]
async fn a_loop_that_spends_its_budget_makes_no_further_model_call() {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;
    price_mock(&gw, &tenant).await;
    patch_project(
        &gw,
        &tenant,
        json!({"budget": {"usd": 0.001, "period": "total"}}),
    )
    .await;
    // The first call's 1000 input tokens cost $0.001: the budget is spent once it returns.
    gw.model.push(
        Reply::tool_calls(vec![Call::new("add", json!({"a": 1, "b": 2}))]).with_usage(1000, 10),
    );
    gw.model.push(Reply::text("never asked"));

    let answer = hello(&gw, &tenant.key).await;

    assert_eq!(answer.status, 200, "{:#}", answer.body);
    assert_eq!(answer.body["status"], "incomplete");
    assert_eq!(
        answer.body["incomplete_details"]["reason"],
        "budget_exceeded"
    );
    assert_eq!(
        gw.model.requests().len(),
        1,
        "no model call after the budget was spent"
    );
    assert_eq!(
        gw.tools.calls().len(),
        1,
        "the tool call the model asked for ran"
    );
}

#[tokio::test]
async fn an_expired_key_is_refused_like_a_revoked_one() {
    let (gw, tenant) = gateway().await;
    let past = gateway::clock::now() - 1;
    let shown = patch_key(&gw, &tenant, json!({"expires_at": past})).await;
    assert_eq!(shown["expires_at"], past);

    let expired = hello(&gw, &tenant.key).await;
    let unknown = hello(&gw, "sk-not-a-key").await;

    assert_error(&expired, 401, None, Some("invalid_api_key"));
    assert_eq!(
        expired.body, unknown.body,
        "an expired key reads like any refused key"
    );
    assert_eq!(gw.model.requests().len(), 0);

    patch_key(&gw, &tenant, json!({"expires_at": null})).await;
    gw.model.push(Reply::text("back"));
    assert_eq!(hello(&gw, &tenant.key).await.status, 200);
}

#[tokio::test]
async fn usage_sums_equal_the_responses_usage_and_cost_is_tokens_times_price() {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;
    price_mock(&gw, &tenant).await;
    gw.model.push(
        Reply::tool_calls(vec![Call::new("add", json!({"a": 1, "b": 2}))]).with_usage(100, 20),
    );
    gw.model.push(Reply::text("3").with_usage(130, 4));
    gw.model.push(Reply::text("plain").with_usage(7, 3));
    let looped = hello(&gw, &tenant.key).await;
    let plain = gw
        .create(
            &tenant.key,
            json!({"model": "mock", "input": "Hi", "store": false}),
        )
        .await;
    assert_eq!(looped.status, 200, "{:#}", looped.body);
    assert_eq!(plain.status, 200, "{:#}", plain.body);

    let total = |field: &str| {
        looped.body["usage"][field].as_i64().unwrap() + plain.body["usage"][field].as_i64().unwrap()
    };
    // The unstored response's usage is written by the batch writer: wait for it to land.
    let mut report = Value::Null;
    for _ in 0..500 {
        report = gw
            .admin_ok(Method::GET, "/usage?group_by=api_key,deployment", None)
            .await;
        if report["data"][0]["model_calls"] == 3 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let bucket = &report["data"][0];
    assert_eq!(report["data"].as_array().unwrap().len(), 1, "{report:#}");
    assert_eq!(bucket["api_key_id"], tenant.key_id.as_str());
    assert_eq!(bucket["deployment"], "mock");
    assert_eq!(bucket["model_calls"], 3);
    assert_eq!(bucket["tool_calls"], 1);
    assert_eq!(bucket["input_tokens"], total("input_tokens"));
    assert_eq!(bucket["output_tokens"], total("output_tokens"));
    assert_eq!(bucket["input_tokens"], 237);
    let expected = (237.0 * 1.0 + 27.0 * 2.0) / 1_000_000.0;
    let cost = bucket["cost_usd"].as_f64().unwrap();
    assert!((cost - expected).abs() < 1e-12, "{cost} != {expected}");

    // By source, and filtered to another key: nothing.
    let by_source = gw
        .admin_ok(Method::GET, "/usage?group_by=tool_source", None)
        .await;
    let sources: Vec<(Value, Value)> = by_source["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| (b["tool_source"].clone(), b["tool_calls"].clone()))
        .collect();
    assert!(sources.contains(&(json!("add"), json!(1))), "{by_source:#}");
    let none = gw
        .admin_ok(Method::GET, "/usage?api_key_id=key_other", None)
        .await;
    assert_eq!(none["data"][0]["model_calls"], 0);

    // The counters say the same.
    let metrics = metrics_text(&gw).await;
    let project = format!("project=\"{}\"", tenant.project_id);
    assert_eq!(
        sample(
            &metrics,
            "gateway_tokens_total",
            &[&project, "kind=\"input\""]
        ),
        237.0
    );
}

#[tokio::test]
async fn bad_usage_queries_name_their_parameter() {
    let (gw, _) = gateway().await;
    // Extreme numbers are read, not overflowed.
    for query in [
        "end=-9223372036854775808",
        "page=page_4294967295&limit=1000",
    ] {
        let answer = gw
            .call(gw.admin(Method::GET, &format!("/usage?{query}")))
            .await;
        assert_eq!(answer.status, 200, "{query}: {:#}", answer.body);
    }
    for (query, param) in [
        ("group_by=week", "group_by"),
        ("start=yesterday", "start"),
        ("limit=0", "limit"),
        ("page=7", "page"),
        ("start=10&end=5", "start"),
        ("colour=red", "colour"),
    ] {
        let answer = gw
            .call(gw.admin(Method::GET, &format!("/usage?{query}")))
            .await;
        assert_error(&answer, 400, Some(param), None);
    }
}

#[tokio::test]
async fn a_compaction_is_admitted_and_counted_like_a_create() {
    let (gw, tenant) = gateway().await;
    price_mock(&gw, &tenant).await;
    patch_key(&gw, &tenant, json!({"limits": {"rpm": 1}})).await;
    gw.model.push(Reply::text("a summary"));
    let compact = || {
        gw.call(
            gw.public(Method::POST, "/responses/compact", &tenant.key)
                .json(&json!({"model": "mock", "input": "Hi there"})),
        )
    };
    let first = compact().await;
    assert_eq!(first.status, 200, "{:#}", first.body);
    assert_eq!(header(&first, "x-ratelimit-limit-requests"), "1");
    assert_eq!(header(&first, "x-ratelimit-remaining-requests"), "0");
    let second = compact().await;
    assert_eq!(second.status, 429, "{:#}", second.body);
    assert_eq!(second.error()["code"], "rate_limit_exceeded");
    assert_eq!(
        gw.model.requests().len(),
        1,
        "the refused compaction called no model"
    );

    // Its summary call is in the usage, under the compaction's id, at the deployment's prices.
    let id = first.body["id"].as_str().expect("id").to_owned();
    let input = first.body["usage"]["input_tokens"]
        .as_i64()
        .expect("input tokens");
    let output = first.body["usage"]["output_tokens"]
        .as_i64()
        .expect("output tokens");
    let mut report = Value::Null;
    for _ in 0..500 {
        report = gw
            .admin_ok(Method::GET, "/usage?group_by=api_key", None)
            .await;
        if report["data"][0]["model_calls"] == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let bucket = &report["data"][0];
    assert_eq!(bucket["model_calls"], 1, "{report:#}");
    assert_eq!(bucket["api_key_id"], tenant.key_id.as_str());
    assert_eq!(bucket["input_tokens"], input);
    assert_eq!(bucket["output_tokens"], output);
    let expected = (input as f64 * 1.0 + output as f64 * 2.0) / 1_000_000.0;
    let cost = bucket["cost_usd"].as_f64().expect("cost");
    assert!((cost - expected).abs() < 1e-12, "{cost} vs {expected}");
    assert!(id.starts_with("resp_"), "{id}");
}

#[tokio::test]
async fn queued_background_responses_start_within_their_keys_max_concurrent() {
    // Two responses run at once on this gateway; the key may run one.
    let gw = TestGateway::start_with(|config| config.server.max_active_responses = 2).await;
    let tenant = gw.tenant("acme").await;
    let other = gw.tenant("other").await;
    gw.attach_tool(&tenant.group_id, "gate").await;
    gw.attach_tool(&tenant.group_id, "barrier").await;
    patch_key(&gw, &tenant, json!({"limits": {"max_concurrent": 1}})).await;

    // Another project's two responses fill the gateway, held in the barrier.
    for _ in 0..2 {
        let held = gw
            .create(
                &other.key,
                json!({"model": "mock", "input": "!call barrier {\"n\": 3}", "background": true}),
            )
            .await;
        assert_eq!(held.status, 200, "{:#}", held.body);
    }
    gw.tools
        .wait_for_calls("barrier", 2, std::time::Duration::from_secs(30))
        .await
        .expect("both held");
    // The key's three are admitted (none of its runs), and wait queued for room.
    let mut queued = Vec::new();
    for _ in 0..3 {
        let created = gw
            .create(
                &tenant.key,
                json!({"model": "mock", "input": "!call gate {}", "background": true}),
            )
            .await;
        assert_eq!(created.body["status"], "queued", "{:#}", created.body);
        queued.push(id_of(&created.body));
    }
    // The other project queues one after them.
    let later = gw
        .create(
            &other.key,
            json!({"model": "mock", "input": "!call gate {}", "background": true}),
        )
        .await;
    assert_eq!(later.body["status"], "queued", "{:#}", later.body);

    // Room for two: one of the key's starts, the other two are tried and wait for its place, and the other
    // project's, queued after them, takes the room they leave.
    release_barrier(&gw, 3).await;
    gw.tools
        .wait_for_calls("gate", 2, std::time::Duration::from_secs(30))
        .await
        .expect("the key's first and the other project's started");
    let waiting = async {
        loop {
            let deferred = gw
                .fetch_i64(
                    "SELECT count(*) FROM responses WHERE status = 'queued' AND start_after IS NOT NULL",
                )
                .await;
            if deferred == 2 {
                return;
            }
            // Polling the database: the condition is the gateway's, in the store.
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(30), waiting)
        .await
        .expect("the other two wait for the place");
    let gates = |gw: &TestGateway| {
        gw.tools
            .calls()
            .iter()
            .filter(|call| call.tool == "gate")
            .count()
    };
    assert_eq!(
        gates(&gw),
        2,
        "only one of the key's runs, beside the other project's"
    );

    // Each runs once the one before it gave its place back.
    gw.tools.open_gate();
    for id in &queued {
        let ended = async {
            loop {
                let answer = gw
                    .call(gw.public(Method::GET, &format!("/responses/{id}"), &tenant.key))
                    .await;
                if answer.body["status"] == "completed" {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(30), ended)
            .await
            .expect("it ends");
    }
    assert_eq!(gates(&gw), 4);
}
