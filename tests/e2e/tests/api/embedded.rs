//! What only the embedded store must show: the real gateway on a fresh SQLite file, found through the database
//! URL of its config, taking concurrent step writes. The whole end-to-end suite also runs on it
//! (`GATEWAY_TEST_STORE=sqlite`, part of `scripts/test.sh`).

use crate::common::*;
use gateway::store::Backend;
use gateway_e2e::items_of;
use gateway_testkit::{Call, Reply};
use serde_json::json;

#[tokio::test]
async fn the_embedded_gateway_runs_on_sqlite() {
    let (gw, _) = embedded_gateway().await;

    assert!(matches!(gw.store.backend(), Backend::Sqlite(_)));
    let ready = gw
        .http
        .get(format!("{}/readyz", gw.base_url))
        .send()
        .await
        .expect("readyz");
    assert!(ready.status().is_success(), "{}", ready.status());
}

#[tokio::test]
async fn parallel_batches_run_concurrently_and_their_steps_are_written_without_locking() {
    let (gw, tenant) = embedded_gateway_with_tools(&["barrier"]).await;
    // Several rounds: each batch's three steps are marked running and finished at the same moment, so a
    // store that cannot take concurrent writes fails one of them sooner or later.
    for round in 0..5 {
        let ids: Vec<String> = (1..=3).map(|n| format!("call_{round}_{n}")).collect();
        gw.model.push(Reply::tool_calls(
            ids.iter()
                .map(|id| Call::new("barrier", json!({"n": 3})).with_id(id))
                .collect(),
        ));
        gw.model.push(Reply::text("all released"));

        let body = create_ok(
            &gw,
            &tenant.key,
            json!({"model": "mock", "input": format!("round {round}")}),
        )
        .await;

        assert_eq!(body["status"], "completed", "round {round}: {body:#}");
        let mcp = items_of(&body, "mcp_call");
        assert_eq!(mcp.len(), 3, "round {round}: {body:#}");
        for item in &mcp {
            assert_eq!(
                item["status"], "completed",
                "round {round}: a barrier call failed, so the batch did not run concurrently: {item:#}"
            );
            assert_eq!(
                parse(item["output"].as_str().unwrap_or("null")),
                json!({"released": true, "n": 3})
            );
        }
        let requests = gw.model.requests();
        let last = requests.last().expect("second model call");
        for id in &ids {
            assert_eq!(
                parse(&tool_result(last, id)),
                json!({"released": true, "n": 3})
            );
        }
        assert_calls_paired(last);
        assert_eq!(
            get_response(&gw, &tenant.key, &id_of(&body)).await.body,
            body,
            "round {round}: the stored steps read back the same"
        );
    }
    assert!(
        gw.tools.max_in_flight() >= 3,
        "max in flight: {}",
        gw.tools.max_in_flight()
    );
    assert_eq!(gw.tools.calls().len(), 15);
    // Every tool step of every round ended succeeded.
    let failed_steps = gw
        .fetch_i64("SELECT count(*) FROM steps WHERE state <> 'succeeded'")
        .await;
    assert_eq!(failed_steps, 0);
}
