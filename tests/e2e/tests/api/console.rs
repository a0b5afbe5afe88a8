//! The console and the admin reads it makes: responses across projects (filters, pages), a response's steps,
//! tool-source health; sign-in into a session cookie, which the admin API accepts for reads only.

use crate::common::*;
use gateway_e2e::{Answer, TestGateway};
use gateway_testkit::{Call, Reply};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

/// A client that shows redirects rather than following them, and keeps no cookies of its own.
fn browserless() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

async fn sign_in(gw: &TestGateway, token: &str) -> reqwest::Response {
    browserless()
        .post(format!("{}/console", gw.base_url))
        .form(&[("token", token)])
        .send()
        .await
        .unwrap()
}

/// The session cookie (`name=value`) a right sign-in sets.
async fn session_cookie(gw: &TestGateway) -> String {
    let answer = sign_in(gw, &gw.admin_token).await;
    assert_eq!(answer.status(), StatusCode::SEE_OTHER);
    let set = answer.headers()["set-cookie"].to_str().unwrap();
    set.split(';').next().unwrap().to_owned()
}

async fn with_cookie(gw: &TestGateway, method: Method, path: &str, cookie: &str) -> Answer {
    let response = browserless()
        .request(method, format!("{}{path}", gw.base_url))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap();
    Answer {
        status,
        headers,
        body: serde_json::from_str(&text).unwrap_or(Value::String(text)),
    }
}

async fn admin_get(gw: &TestGateway, path: &str) -> Answer {
    gw.call(gw.admin(Method::GET, path)).await
}

fn ids(page: &Value) -> Vec<String> {
    page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn responses_are_listed_across_projects_newest_first_filtered_and_paged() {
    let (gw, acme) = gateway().await;
    let globex = gw.tenant("globex").await;
    let mut made = Vec::new();
    for (tenant, text) in [(&acme, "one"), (&globex, "two"), (&acme, "three")] {
        gw.model.push(Reply::text(text).with_usage(10, 5));
        made.push(id_of(
            &create_ok(&gw, &tenant.key, json!({"model": "mock", "input": text})).await,
        ));
    }
    // Newest first: by creation time, then id; the seconds may tie, so compare with the store's order.
    let all = gw.admin_ok(Method::GET, "/responses", None).await;
    assert_eq!(all["object"], "list");
    assert_eq!(all["has_more"], false);
    let listed = ids(&all);
    assert_eq!(listed.len(), 3, "{all:#}");
    let mut expected = made.clone();
    expected.sort_by_key(|id| {
        let r = all["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == id.as_str())
            .unwrap();
        (
            std::cmp::Reverse(r["created_at"].as_i64().unwrap()),
            std::cmp::Reverse(id.clone()),
        )
    });
    assert_eq!(listed, expected);
    let first = &all["data"][0];
    assert_eq!(first["object"], "admin.response");
    assert_eq!(first["status"], "completed");
    assert_eq!(first["model"], "mock");
    assert_eq!(first["claim_epoch"], 0);
    assert_eq!(first["input_tokens"], 10);
    assert_eq!(first["output_tokens"], 5);

    let of_acme = gw
        .admin_ok(
            Method::GET,
            &format!("/responses?project_id={}", acme.project_id),
            None,
        )
        .await;
    let mut acme_ids = ids(&of_acme);
    acme_ids.sort();
    let mut want = vec![made[0].clone(), made[2].clone()];
    want.sort();
    assert_eq!(acme_ids, want);
    let of_key = gw
        .admin_ok(
            Method::GET,
            &format!("/responses?api_key_id={}", globex.key_id),
            None,
        )
        .await;
    assert_eq!(ids(&of_key), [made[1].clone()]);
    for query in [
        "status=failed",
        "model=other",
        "created_after=4102444800",
        "created_before=0",
    ] {
        let none = gw
            .admin_ok(Method::GET, &format!("/responses?{query}"), None)
            .await;
        assert_eq!(ids(&none), Vec::<String>::new(), "{query}");
    }
    let completed = gw
        .admin_ok(
            Method::GET,
            "/responses?status=completed&model=mock&created_after=0",
            None,
        )
        .await;
    assert_eq!(ids(&completed).len(), 3);

    // A page at a time: every response once, in the same order.
    let mut paged = Vec::new();
    let mut query = "/responses?limit=1".to_owned();
    loop {
        let page = gw.admin_ok(Method::GET, &query, None).await;
        paged.extend(ids(&page));
        if page["has_more"] == false {
            break;
        }
        query = format!(
            "/responses?limit=1&after={}",
            page["last_id"].as_str().unwrap()
        );
    }
    assert_eq!(paged, listed);
}

#[tokio::test]
async fn a_responses_steps_show_timing_tokens_deployment_tool_source_batch_and_handbacks() {
    let (gw, tenant) = gateway_with_tools(&["add", "fail"]).await;
    gw.model.push(
        Reply::tool_calls(vec![
            Call::new("add", json!({"a": 1, "b": 2})).with_id("call_add"),
            Call::new("fail", json!({})).with_id("call_fail"),
        ])
        .with_usage(20, 7),
    );
    gw.model.push(Reply::text("Done: 3.").with_usage(30, 4));
    let id = id_of(
        &create_ok(
            &gw,
            &tenant.key,
            json!({"model": "mock", "input": "add 1 and 2"}),
        )
        .await,
    );

    let steps = gw
        .admin_ok(Method::GET, &format!("/responses/{id}/steps"), None)
        .await;
    assert_eq!(steps["object"], "list");
    assert_eq!(steps["response"]["id"], id.as_str());
    assert_eq!(steps["response"]["claim_epoch"], 0);
    assert_eq!(steps["response"]["input_tokens"], 50);
    let data = steps["data"].as_array().unwrap();
    let kinds: Vec<&str> = data.iter().map(|s| s["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["model", "tool", "tool", "model"], "{steps:#}");
    let first = &data[0];
    assert_eq!(first["seq"], 0);
    assert_eq!(first["state"], "succeeded");
    assert_eq!(first["outcome"], "tool_calls");
    assert_eq!(first["deployment"], "mock");
    assert_eq!(first["input_tokens"], 20);
    assert_eq!(first["output_tokens"], 7);
    assert_eq!(first["handed_back"], json!([]));
    let add = &data[1];
    assert_eq!(add["tool_name"], "add");
    assert_eq!(add["tool_call_id"], "call_add");
    assert_eq!(add["tool_source"], "add");
    assert_eq!(add["batch"], 0);
    assert_eq!(add["outcome"], "output");
    assert_eq!(add["attempts"], 1);
    assert!(
        add["duration_ms"].as_i64().is_some_and(|d| d >= 0),
        "{add:#}"
    );
    assert!(add["started_at_ms"].as_i64().is_some());
    assert_eq!(add["body"]["call"]["arguments"], "{\"a\":1,\"b\":2}");
    let fail = &data[2];
    assert_eq!(fail["batch"], 0);
    assert_eq!(fail["outcome"], "error");
    assert!(
        fail["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{fail:#}"
    );
    assert_eq!(data[3]["outcome"], "message");
    assert_eq!(data[3]["body"]["output"]["message"]["text"], "Done: 3.");

    // A call the gateway does not run is handed back to the client.
    gw.model.push(Reply::tool_calls(vec![
        Call::new("lookup", json!({})).with_id("call_lookup")
    ]));
    let lookup = json!({"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}});
    let id = id_of(
        &create_ok(
            &gw,
            &tenant.key,
            json!({"model": "mock", "input": "look", "tools": [lookup]}),
        )
        .await,
    );
    let steps = gw
        .admin_ok(Method::GET, &format!("/responses/{id}/steps"), None)
        .await;
    assert_eq!(
        steps["data"][0]["handed_back"],
        json!(["call_lookup"]),
        "{steps:#}"
    );
    assert_eq!(steps["response"]["handed_back"], true);
}

#[tokio::test]
async fn tool_source_health_counts_calls_errors_and_latency_with_the_breaker() {
    let (gw, tenant) = gateway_with_tools(&["add", "fail"]).await;
    gw.model.push(Reply::tool_calls(vec![
        Call::new("add", json!({"a": 1, "b": 2})),
        Call::new("fail", json!({})),
    ]));
    create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "go"})).await;
    let health = gw.admin_ok(Method::GET, "/tool_sources/health", None).await;
    assert_eq!(health["window_seconds"], 86_400);
    let of = |name: &str| {
        health["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["tool_source"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} in {health:#}"))
    };
    let add = of("add");
    assert_eq!(
        (add["calls"].clone(), add["errors"].clone()),
        (json!(1), json!(0)),
        "{add:#}"
    );
    assert!(
        add["p95_ms"].as_i64().is_some() && add["mean_ms"].as_f64().is_some(),
        "{add:#}"
    );
    assert_eq!(add["breaker"], "closed");
    let fail = of("fail");
    assert_eq!(
        (fail["calls"].clone(), fail["errors"].clone()),
        (json!(1), json!(1)),
        "{fail:#}"
    );
}

#[tokio::test]
async fn admin_reads_answer_404_for_unknown_responses_and_400_naming_bad_params() {
    let (gw, _tenant) = gateway().await;
    let missing = admin_get(&gw, "/responses/resp_missing/steps").await;
    assert_error(&missing, 404, None, None);
    for (query, param) in [
        ("/responses?status=bogus", "status"),
        ("/responses?limit=0", "limit"),
        ("/responses?limit=many", "limit"),
        ("/responses?created_after=yesterday", "created_after"),
        ("/responses?created_before=1.5", "created_before"),
        ("/responses?after=resp_missing", "after"),
        ("/responses?project=acme", "project"),
        ("/tool_sources/health?window=0", "window"),
        ("/tool_sources/health?since=1", "since"),
    ] {
        let answer = admin_get(&gw, query).await;
        assert_error(&answer, 400, Some(param), None);
    }
}

#[tokio::test]
async fn sign_in_sets_an_http_only_strict_cookie_that_never_holds_the_token() {
    let (gw, _tenant) = gateway().await;
    let page = with_cookie(&gw, Method::GET, "/console", "").await;
    assert_eq!(page.status, StatusCode::OK);
    let html = page.body.as_str().unwrap();
    assert!(html.contains(r#"<form method="post""#), "{html}");
    assert!(html.contains(r#"type="password""#), "{html}");

    let wrong = sign_in(&gw, "not-the-token").await;
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    assert!(wrong.headers().get("set-cookie").is_none());
    assert!(wrong
        .text()
        .await
        .unwrap()
        .contains("Incorrect admin token"));

    let right = sign_in(&gw, &gw.admin_token).await;
    assert_eq!(right.status(), StatusCode::SEE_OTHER);
    assert_eq!(right.headers()["location"], "/console");
    let set = right.headers()["set-cookie"].to_str().unwrap().to_owned();
    for flag in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(set.split("; ").any(|f| f == flag), "{flag} in {set}");
    }
    assert!(set.starts_with("gateway_console="), "{set}");
    assert!(!set.contains(&gw.admin_token), "{set}");
    let cookie = set.split(';').next().unwrap();

    let home = with_cookie(&gw, Method::GET, "/console", cookie).await;
    assert_eq!(home.status, StatusCode::OK);
    assert!(home
        .body
        .as_str()
        .unwrap()
        .contains(r#"data-page="responses""#));
    // The admin API reads with the session; it does not write with it.
    let read = with_cookie(&gw, Method::GET, "/admin/v1/responses", cookie).await;
    assert_eq!(read.status, StatusCode::OK, "{:#}", read.body);
    let write = with_cookie(&gw, Method::POST, "/admin/v1/projects", cookie).await;
    assert_error(&write, 401, None, None);

    let out = with_cookie(&gw, Method::POST, "/console/sign-out", cookie).await;
    assert_eq!(out.status, StatusCode::SEE_OTHER);
    assert!(out.headers["set-cookie"]
        .to_str()
        .unwrap()
        .contains("Max-Age=0"));
}

#[tokio::test]
async fn a_signed_out_session_is_refused_though_a_copy_of_its_cookie_still_verifies() {
    let (gw, _tenant) = gateway().await;
    let (left, stays) = (session_cookie(&gw).await, session_cookie(&gw).await);
    assert_ne!(left, stays);
    let out = with_cookie(&gw, Method::POST, "/console/sign-out", &left).await;
    assert_eq!(out.status, StatusCode::SEE_OTHER);
    // Sent again, as a copy kept before the sign-out would be: every page and read refuses it.
    for path in [
        "/console/responses/resp_1",
        "/console/tools",
        "/console/usage",
    ] {
        let answer = with_cookie(&gw, Method::GET, path, &left).await;
        assert_eq!(answer.status, StatusCode::SEE_OTHER, "{path}");
        assert_eq!(answer.headers["location"], "/console");
    }
    let home = with_cookie(&gw, Method::GET, "/console", &left).await;
    assert!(home.body.as_str().unwrap().contains(r#"type="password""#));
    let read = with_cookie(&gw, Method::GET, "/admin/v1/responses", &left).await;
    assert_error(&read, 401, None, None);
    // Signing it out again is no error; another session goes on.
    let again = with_cookie(&gw, Method::POST, "/console/sign-out", &left).await;
    assert_eq!(again.status, StatusCode::SEE_OTHER);
    let other = with_cookie(&gw, Method::GET, "/admin/v1/responses", &stays).await;
    assert_eq!(other.status, StatusCode::OK, "{:#}", other.body);
    let page = with_cookie(&gw, Method::GET, "/console/tools", &stays).await;
    assert_eq!(page.status, StatusCode::OK);
}

#[tokio::test]
async fn a_sign_out_the_store_cannot_record_keeps_the_session_to_sign_out_again() {
    let (gw, _tenant) = gateway().await;
    let cookie = session_cookie(&gw).await;
    gw.run_script(
        "CREATE FUNCTION refuse_sign_outs() RETURNS trigger LANGUAGE plpgsql AS
             $$ BEGIN RAISE EXCEPTION 'sign-outs refused by the test'; END $$;
         CREATE TRIGGER refuse_sign_outs BEFORE INSERT ON console_sign_outs
             FOR EACH ROW EXECUTE FUNCTION refuse_sign_outs();",
        "CREATE TRIGGER refuse_sign_outs BEFORE INSERT ON console_sign_outs
             BEGIN SELECT RAISE(ABORT, 'sign-outs refused by the test'); END;",
    )
    .await;
    let refused = with_cookie(&gw, Method::POST, "/console/sign-out", &cookie).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    // The cookie is kept, and the page offers to sign out again.
    assert!(refused.headers.get("set-cookie").is_none());
    let html = refused.body.as_str().unwrap();
    assert!(html.contains("could not record the sign-out"), "{html}");
    assert!(html.contains(r#"action="/console/sign-out""#), "{html}");
    let still = with_cookie(&gw, Method::GET, "/console/tools", &cookie).await;
    assert_eq!(still.status, StatusCode::OK);

    gw.run_script(
        "DROP TRIGGER refuse_sign_outs ON console_sign_outs; DROP FUNCTION refuse_sign_outs();",
        "DROP TRIGGER refuse_sign_outs;",
    )
    .await;
    let out = with_cookie(&gw, Method::POST, "/console/sign-out", &cookie).await;
    assert_eq!(out.status, StatusCode::SEE_OTHER);
    assert!(out.headers["set-cookie"]
        .to_str()
        .unwrap()
        .contains("Max-Age=0"));
    let refused = with_cookie(&gw, Method::GET, "/console/tools", &cookie).await;
    assert_eq!(refused.status, StatusCode::SEE_OTHER);
}

#[tokio::test]
async fn a_session_the_store_cannot_check_is_answered_unavailable_and_kept() {
    let (gw, _tenant) = gateway().await;
    let cookie = session_cookie(&gw).await;
    gw.run_script(
        "ALTER TABLE console_sign_outs RENAME TO console_sign_outs_away",
        "ALTER TABLE console_sign_outs RENAME TO console_sign_outs_away",
    )
    .await;
    for path in ["/console", "/console/tools", "/console/usage"] {
        let page = with_cookie(&gw, Method::GET, path, &cookie).await;
        assert_eq!(page.status, StatusCode::SERVICE_UNAVAILABLE, "{path}");
        assert_eq!(page.headers["retry-after"], "1", "{path}");
        assert!(page.headers.get("set-cookie").is_none(), "{path}");
    }
    let read = with_cookie(&gw, Method::GET, "/admin/v1/responses", &cookie).await;
    assert!(read.status.is_server_error(), "{:#}", read.body);
    assert_ne!(read.status, StatusCode::UNAUTHORIZED);

    gw.run_script(
        "ALTER TABLE console_sign_outs_away RENAME TO console_sign_outs",
        "ALTER TABLE console_sign_outs_away RENAME TO console_sign_outs",
    )
    .await;
    let page = with_cookie(&gw, Method::GET, "/console/tools", &cookie).await;
    assert_eq!(page.status, StatusCode::OK);
}

#[tokio::test]
async fn console_pages_without_a_valid_session_redirect_to_sign_in() {
    let (gw, _tenant) = gateway().await;
    let forged = "gateway_console=00.4102444800.00";
    for cookie in ["", forged] {
        for path in [
            "/console/responses/resp_1",
            "/console/tools",
            "/console/usage",
        ] {
            let answer = with_cookie(&gw, Method::GET, path, cookie).await;
            assert_eq!(
                answer.status,
                StatusCode::SEE_OTHER,
                "{path} with '{cookie}'"
            );
            assert_eq!(answer.headers["location"], "/console");
        }
        let home = with_cookie(&gw, Method::GET, "/console", cookie).await;
        assert!(home.body.as_str().unwrap().contains(r#"type="password""#));
    }
    let read = with_cookie(&gw, Method::GET, "/admin/v1/responses", forged).await;
    assert_error(&read, 401, None, None);
}

#[tokio::test]
async fn a_session_is_refused_once_the_admin_token_changes() {
    let (gw, _tenant) = gateway().await;
    let cookie = session_cookie(&gw).await;
    // Another gateway (or this one restarted) with another admin token.
    let changed = TestGateway::start_with(|config| {
        config.admin.token = Some("a-new-admin-token".to_owned().into());
    })
    .await;
    let page = with_cookie(&changed, Method::GET, "/console/usage", &cookie).await;
    assert_eq!(page.status, StatusCode::SEE_OTHER);
    let read = with_cookie(&changed, Method::GET, "/admin/v1/responses", &cookie).await;
    assert_error(&read, 401, None, None);
    // The gateway that issued it still takes it.
    let read = with_cookie(&gw, Method::GET, "/admin/v1/responses", &cookie).await;
    assert_eq!(read.status, StatusCode::OK);
}
