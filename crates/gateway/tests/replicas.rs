//! Durability with the real `gateway` binary (SPEC 9): replicas run as child processes on one Postgres database
//! (and one process on the embedded store), are killed for real (SIGKILL) or stopped (SIGTERM), and another
//! replica, or a restarted one, finishes what they left. The mock model and the tool server run in this test
//! process; the `gate` tool holds a call until the test opens it, so that a kill lands while it is in flight.
//!
//! Nothing here sleeps to synchronise: tests wait for a tool call or a model request to arrive, and follow a
//! response's event stream to its end.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use common::*;
use gateway_testkit::Reply;
use serde_json::{json, Value};

#[tokio::test]
async fn a_replica_killed_mid_tool_call_is_restarted_and_the_response_completes_with_the_call_sent_again_under_its_key(
) {
    killed_mid_tool_call_then_restarted(Cluster::postgres().await).await;
}

/// Kills the only replica of `cluster` with a `gate` tool call in flight and starts another: the response completes,
/// the call sent again under the same Idempotency-Key.
async fn killed_mid_tool_call_then_restarted(mut cluster: Cluster) {
    let mut first = cluster.replica(&[]);
    let id = cluster.gate_call_in_flight(&first).await;

    first.kill();
    let restarted = cluster.replica(&[]);
    let calls = gate_round_sent_again_under_its_key(&cluster, &restarted, &id).await;
    assert_eq!(calls.len(), 2, "sent once, then once more after the crash");
}

/// Waits for the second send of response `id`'s gate call (its first replica gone), opens the gate, and checks
/// that `finisher` ends the round with both sends under one Idempotency-Key; answers the calls.
async fn gate_round_sent_again_under_its_key(
    cluster: &Cluster,
    finisher: &Replica,
    id: &str,
) -> Vec<gateway_testkit::RecordedCall> {
    let calls = cluster.gate_calls(2).await;
    cluster.tools.open_gate();
    let response = cluster.ended(finisher, id).await;

    assert_gate_round(&response);
    let keys = keys(&calls);
    assert_eq!(keys[0], keys[1], "one Idempotency-Key: {keys:?}");
    calls
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
    let (cluster, mut doomed, survivor, id) =
        Cluster::two_replicas_with_a_gate_call_in_flight().await;

    doomed.kill();
    gate_round_sent_again_under_its_key(&cluster, &survivor, &id).await;
}

#[tokio::test]
async fn a_background_response_answers_queued_at_once_and_completes_while_polled() {
    let mut cluster = Cluster::postgres().await;
    let replica = cluster.replica(&[]);

    let id = cluster.gate_call_in_flight(&replica).await;
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
    let (cluster, owner, other, id) = Cluster::two_replicas_with_a_gate_call_in_flight().await;

    let cancelled = cluster.cancel(&other, &id).await;

    assert_eq!(cancelled["status"], "cancelled", "{cancelled:#}");
    let call = &cancelled["output"][0];
    assert_eq!(call["type"], "mcp_call");
    assert_eq!(call["status"], "failed", "the call in flight was aborted");
    assert_eq!(cluster.get(&owner, &id).await.1, cancelled);
    // Cancelling again answers the same response.
    let again = cluster.cancel(&owner, &id).await;
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
    let (cluster, owner, other, id) = Cluster::two_replicas_with_a_gate_call_in_flight().await;

    let deleted = cluster.delete(&other, &id).await;

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
    // The event says the call is under way once it is recorded, before its request reaches the tool: wait for
    // the tool to have it, or a kill in between would leave one call in all, not a call sent again.
    cluster.gate_calls(1).await;
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
    let id = cluster.gate_call_in_flight(&stopping).await;

    stopping.terminate();
    gate_round_sent_again_under_its_key(&cluster, &successor, &id).await;
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
    killed_mid_tool_call_then_restarted(Cluster::sqlite().await).await;
}

#[tokio::test]
async fn a_second_gateway_on_the_same_embedded_store_refuses_to_start_and_the_first_keeps_its_run()
{
    let mut cluster = Cluster::sqlite().await;
    let first = cluster.replica(&[]);
    let id = cluster.gate_call_in_flight(&first).await;

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
