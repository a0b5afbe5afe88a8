//! End-to-end tests of governance in the admin API (SPEC 13): expiry, limits and budgets on keys and projects,
//! prices on deployments; set, shown, merged, removed with `null`, and bad input refused whole.

use gateway_e2e::TestGateway;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use super::admin::{admin, assert_error, id_of, mock_deployment};

/// The `limits` of a key or project without any.
fn no_limits() -> Value {
    json!({"rpm": null, "tpm": null, "max_concurrent": null})
}

/// An admin call that must answer 200; its body.
async fn ok(gw: &TestGateway, method: Method, path: &str, body: Option<Value>) -> Value {
    let answer = admin(gw, method.clone(), path, body).await;
    assert_eq!(
        answer.status,
        StatusCode::OK,
        "{method} {path}: {}",
        answer.text
    );
    answer.body
}

/// PATCHes `path` with `body` and asserts the answer's `field`, and that a `GET` shows the same.
async fn patched(gw: &TestGateway, path: &str, body: Value, field: &str, expected: Value) {
    let answer = ok(gw, Method::PATCH, path, Some(body.clone())).await;
    assert_eq!(answer[field], expected, "PATCH {path} {body}");
    let read = ok(gw, Method::GET, path, None).await;
    assert_eq!(read, answer, "GET {path} shows what PATCH answered");
}

#[tokio::test]
async fn a_keys_expiry_limits_and_budget_are_set_shown_merged_and_removed() {
    let gw = TestGateway::start().await;
    let tenant = gw.tenant("acme").await;
    let keys = format!("/projects/{}/api_keys", tenant.project_id);

    let plain = ok(&gw, Method::POST, &keys, Some(json!({"name": "plain"}))).await;
    assert_eq!(plain["expires_at"], Value::Null);
    assert_eq!(plain["limits"], no_limits());
    assert_eq!(plain["budget"], Value::Null);

    let created = ok(
        &gw,
        Method::POST,
        &keys,
        Some(json!({
            "name": "batch",
            "expires_at": 4_102_444_800_i64,
            "limits": {"rpm": 60, "max_concurrent": 2},
            "budget": {"usd": 5.5, "period": "day"},
        })),
    )
    .await;
    assert!(created["key"].is_string(), "the create shows the key once");
    assert_eq!(created["expires_at"], 4_102_444_800_i64);
    assert_eq!(
        created["limits"],
        json!({"rpm": 60, "tpm": null, "max_concurrent": 2})
    );
    assert_eq!(created["budget"], json!({"usd": 5.5, "period": "day"}));
    let path = format!("/api_keys/{}", id_of(&created));
    let mut shown = created.clone();
    shown.as_object_mut().unwrap().remove("key");
    assert_eq!(ok(&gw, Method::GET, &path, None).await, shown);
    let listed = ok(&gw, Method::GET, &keys, None).await;
    assert!(
        listed["data"].as_array().unwrap().contains(&shown),
        "{listed}"
    );

    // Limits merge: a limit given sets it, `null` removes it, one left out is kept.
    let limits = |rpm: Value, tpm: Value, max_concurrent: Value| json!({"rpm": rpm, "tpm": tpm, "max_concurrent": max_concurrent});
    patched(
        &gw,
        &path,
        json!({"limits": {"tpm": 10_000}}),
        "limits",
        limits(json!(60), json!(10_000), json!(2)),
    )
    .await;
    patched(
        &gw,
        &path,
        json!({"limits": {"rpm": null, "max_concurrent": 0}}),
        "limits",
        limits(Value::Null, json!(10_000), json!(0)),
    )
    .await;
    // A budget object replaces the budget whole.
    patched(
        &gw,
        &path,
        json!({"budget": {"usd": 20, "period": "month"}}),
        "budget",
        json!({"usd": 20.0, "period": "month"}),
    )
    .await;
    patched(
        &gw,
        &path,
        json!({"expires_at": 4_000_000_000_i64}),
        "expires_at",
        json!(4_000_000_000_i64),
    )
    .await;
    // A rename leaves them all as they are.
    let renamed = ok(&gw, Method::PATCH, &path, Some(json!({"name": "nightly"}))).await;
    assert_eq!(renamed["name"], "nightly");
    assert_eq!(
        renamed["limits"],
        limits(Value::Null, json!(10_000), json!(0))
    );
    assert_eq!(renamed["budget"], json!({"usd": 20.0, "period": "month"}));
    assert_eq!(renamed["expires_at"], 4_000_000_000_i64);

    // `null` removes each.
    patched(&gw, &path, json!({"limits": null}), "limits", no_limits()).await;
    patched(&gw, &path, json!({"budget": null}), "budget", Value::Null).await;
    patched(
        &gw,
        &path,
        json!({"expires_at": null}),
        "expires_at",
        Value::Null,
    )
    .await;
}

#[tokio::test]
async fn an_expired_key_is_refused_from_the_next_request_and_works_again_without_its_expiry() {
    let gw = TestGateway::start().await;
    let tenant = gw.tenant("acme").await;
    let path = format!("/api_keys/{}", tenant.key_id);
    let read = || gw.call(gw.public(Method::GET, "/responses/resp_x", &tenant.key));

    assert_eq!(read().await.status, StatusCode::NOT_FOUND, "the key works");
    ok(&gw, Method::PATCH, &path, Some(json!({"expires_at": 1}))).await;
    let expired = read().await;
    assert_eq!(
        expired.status,
        StatusCode::UNAUTHORIZED,
        "{:?}",
        expired.body
    );
    ok(&gw, Method::PATCH, &path, Some(json!({"expires_at": null}))).await;
    assert_eq!(
        read().await.status,
        StatusCode::NOT_FOUND,
        "the key works again"
    );
}

#[tokio::test]
async fn a_projects_limits_and_budget_are_set_shown_merged_and_removed() {
    let gw = TestGateway::start().await;
    let plain = ok(
        &gw,
        Method::POST,
        "/projects",
        Some(json!({"name": "plain"})),
    )
    .await;
    assert_eq!(plain["limits"], no_limits());
    assert_eq!(plain["budget"], Value::Null);

    let created = ok(
        &gw,
        Method::POST,
        "/projects",
        Some(json!({"name": "acme", "limits": {"tpm": 100_000}, "budget": {"usd": 100, "period": "total"}})),
    )
    .await;
    assert_eq!(
        created["limits"],
        json!({"rpm": null, "tpm": 100_000, "max_concurrent": null})
    );
    assert_eq!(created["budget"], json!({"usd": 100.0, "period": "total"}));
    let path = format!("/projects/{}", id_of(&created));
    assert_eq!(ok(&gw, Method::GET, &path, None).await, created);
    let listed = ok(&gw, Method::GET, "/projects", None).await;
    assert!(
        listed["data"].as_array().unwrap().contains(&created),
        "{listed}"
    );

    patched(
        &gw,
        &path,
        json!({"limits": {"rpm": 600, "max_concurrent": 8}}),
        "limits",
        json!({"rpm": 600, "tpm": 100_000, "max_concurrent": 8}),
    )
    .await;
    patched(
        &gw,
        &path,
        json!({"limits": {"tpm": null}}),
        "limits",
        json!({"rpm": 600, "tpm": null, "max_concurrent": 8}),
    )
    .await;
    patched(
        &gw,
        &path,
        json!({"budget": {"usd": 0.5, "period": "day"}}),
        "budget",
        json!({"usd": 0.5, "period": "day"}),
    )
    .await;
    let renamed = ok(&gw, Method::PATCH, &path, Some(json!({"name": "acme-2"}))).await;
    assert_eq!(renamed["limits"]["rpm"], 600, "a rename keeps the limits");
    patched(&gw, &path, json!({"limits": null}), "limits", no_limits()).await;
    patched(&gw, &path, json!({"budget": null}), "budget", Value::Null).await;
}

#[tokio::test]
async fn a_deployments_pricing_is_set_shown_replaced_and_removed() {
    let gw = TestGateway::start().await;
    let plain = ok(
        &gw,
        Method::POST,
        "/deployments",
        Some(mock_deployment(&gw, "plain")),
    )
    .await;
    assert_eq!(plain["pricing"], Value::Null);

    let mut body = mock_deployment(&gw, "priced");
    body["pricing"] =
        json!({"input_per_mtok": 2.5, "cached_input_per_mtok": 1.25, "output_per_mtok": 10});
    let created = ok(&gw, Method::POST, "/deployments", Some(body)).await;
    assert_eq!(
        created["pricing"],
        json!({"input_per_mtok": 2.5, "cached_input_per_mtok": 1.25, "output_per_mtok": 10.0})
    );
    let path = format!("/deployments/{}", id_of(&created));
    assert_eq!(ok(&gw, Method::GET, &path, None).await, created);

    // An object replaces the prices whole: the cached price given before is gone.
    patched(
        &gw,
        &path,
        json!({"pricing": {"input_per_mtok": 3, "output_per_mtok": 12}}),
        "pricing",
        json!({"input_per_mtok": 3.0, "output_per_mtok": 12.0}),
    )
    .await;
    let moved = ok(
        &gw,
        Method::PATCH,
        &path,
        Some(json!({"provider": {"model": "other-model"}})),
    )
    .await;
    assert_eq!(
        moved["pricing"],
        json!({"input_per_mtok": 3.0, "output_per_mtok": 12.0}),
        "a change of anything else keeps the prices"
    );
    patched(&gw, &path, json!({"pricing": null}), "pricing", Value::Null).await;
}

/// `(body, param)`: bad governance fields of a key's or project's body and the field each error names.
fn bad_governance() -> Vec<(Value, &'static str)> {
    vec![
        (json!({"limits": {"rpm": -1}}), "limits.rpm"),
        (json!({"limits": {"tpm": "many"}}), "limits.tpm"),
        (
            json!({"limits": {"max_concurrent": 1.5}}),
            "limits.max_concurrent",
        ),
        (
            json!({"limits": {"rpm": 18_446_744_073_709_551_615_u64}}),
            "limits.rpm",
        ),
        (json!({"limits": {"rps": 1}}), "limits.rps"),
        (json!({"limits": 10}), "limits"),
        (
            json!({"budget": {"usd": 5, "period": "week"}}),
            "budget.period",
        ),
        (json!({"budget": {"usd": 5}}), "budget.period"),
        (
            json!({"budget": {"usd": -1, "period": "day"}}),
            "budget.usd",
        ),
        (
            json!({"budget": {"usd": "ten", "period": "day"}}),
            "budget.usd",
        ),
        (
            json!({"budget": {"usd": 1, "period": "day", "cap": 2}}),
            "budget.cap",
        ),
        (json!({"budget": []}), "budget"),
        // Good fields beside a bad one are not written either.
        (
            json!({"name": "changed", "limits": {"rpm": -1}}),
            "limits.rpm",
        ),
        (
            json!({"limits": {"rpm": 1}, "budget": {"usd": 1, "period": "year"}}),
            "budget.period",
        ),
    ]
}

/// Sends each bad body to `path` with `method`; each is a 400 naming its field, and `read` answers the same
/// before and after.
async fn refused_whole(
    gw: &TestGateway,
    method: Method,
    path: &str,
    read: &str,
    cases: Vec<(Value, &'static str)>,
) {
    for (body, param) in cases {
        let before = ok(gw, Method::GET, read, None).await;
        let answer = admin(gw, method.clone(), path, Some(body.clone())).await;
        assert_error(&answer, 400, Some(param));
        assert_eq!(
            ok(gw, Method::GET, read, None).await,
            before,
            "{method} {path} {body} changed something"
        );
    }
}

#[tokio::test]
async fn bad_governance_input_is_a_400_naming_the_field_and_changes_nothing() {
    let gw = TestGateway::start().await;
    let tenant = gw.tenant("acme").await;
    let governed = json!({
        "expires_at": 4_102_444_800_i64,
        "limits": {"rpm": 60, "tpm": 1000},
        "budget": {"usd": 5, "period": "day"},
    });
    let key = format!("/api_keys/{}", tenant.key_id);
    let project = format!("/projects/{}", tenant.project_id);
    let keys = format!("{project}/api_keys");
    ok(&gw, Method::PATCH, &key, Some(governed.clone())).await;
    let mut project_governance = governed.clone();
    project_governance
        .as_object_mut()
        .unwrap()
        .remove("expires_at");
    ok(&gw, Method::PATCH, &project, Some(project_governance)).await;

    let mut key_cases = bad_governance();
    key_cases.extend([
        (json!({"expires_at": -5}), "expires_at"),
        (json!({"expires_at": "tomorrow"}), "expires_at"),
        (json!({"expires_at": 1.5}), "expires_at"),
        (json!({"name": "changed", "expires_at": -1}), "expires_at"),
    ]);
    refused_whole(&gw, Method::PATCH, &key, &key, key_cases.clone()).await;
    refused_whole(&gw, Method::PATCH, &project, &project, bad_governance()).await;

    // A create with a bad field creates nothing.
    let named = |mut cases: Vec<(Value, &'static str)>| {
        for (body, _) in &mut cases {
            body["name"] = json!("new");
        }
        cases
    };
    refused_whole(&gw, Method::POST, &keys, &keys, named(key_cases)).await;
    refused_whole(
        &gw,
        Method::POST,
        "/projects",
        "/projects",
        named(bad_governance()),
    )
    .await;

    let deployment = format!("/deployments/{}", tenant.deployment_id);
    ok(
        &gw,
        Method::PATCH,
        &deployment,
        Some(json!({"pricing": {"input_per_mtok": 1, "output_per_mtok": 2}})),
    )
    .await;
    let bad_pricing = vec![
        (
            json!({"pricing": {"input_per_mtok": -1, "output_per_mtok": 1}}),
            "pricing.input_per_mtok",
        ),
        (
            json!({"pricing": {"input_per_mtok": 1}}),
            "pricing.output_per_mtok",
        ),
        (
            json!({"pricing": {"input_per_mtok": 1, "output_per_mtok": "free"}}),
            "pricing.output_per_mtok",
        ),
        (
            json!({"pricing": {"input_per_mtok": 1, "cached_input_per_mtok": -0.5, "output_per_mtok": 1}}),
            "pricing.cached_input_per_mtok",
        ),
        (
            json!({"pricing": {"input_per_mtok": 1, "output_per_mtok": 1, "per_call": 1}}),
            "pricing.per_call",
        ),
        (json!({"pricing": "cheap"}), "pricing"),
        (
            json!({"name": "renamed", "pricing": {"input_per_mtok": -1, "output_per_mtok": 1}}),
            "pricing.input_per_mtok",
        ),
    ];
    refused_whole(
        &gw,
        Method::PATCH,
        &deployment,
        &deployment,
        bad_pricing.clone(),
    )
    .await;
    let creates = bad_pricing
        .into_iter()
        .map(|(body, param)| {
            let mut create = mock_deployment(&gw, "new");
            create["pricing"] = body["pricing"].clone();
            (create, param)
        })
        .collect();
    refused_whole(&gw, Method::POST, "/deployments", "/deployments", creates).await;
}
