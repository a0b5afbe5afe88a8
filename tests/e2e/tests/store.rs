//! The store on both backends: every test in `on_both_backends!` runs once on a fresh Postgres database
//! (dropped after) and once on a fresh SQLite file (deleted after), through the same public methods.
//!
//! Test-support code: a setup step that fails must fail the test at once, so `expect` is the right tool here.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use gateway::store::admin::{
    ApiKeyChanges, DeploymentChanges, Member, Membership, NewApiKey, NewDeployment, NewToolSource,
    ProjectChanges, Removal, ToolSourceChanges,
};
use gateway::store::responses::{Durability, IdempotencyKey, NewResponse, Order, StepWrite};
use gateway::store::stored_tools::StoredTool;
use gateway::store::tenancy::hash_key;
use gateway::store::{Backend, Store, StoreError};
use gateway_core::entity::{
    EntityName, HttpUrl, ProviderKind, TimeoutMs, ToolName, ToolParameters,
};
use gateway_core::governance::Governance;
use gateway_core::request::ResponseParams;
use gateway_core::response::{Ending, ResponseRecord, ResponseState, ResponseStatus};
use gateway_core::steps::{Step, StepState, Usage};
use gateway_core::IncompleteReason;
use gateway_core::Item;
use gateway_e2e::ScratchDatabase;
use serde_json::{json, Value};

/// Generates `postgres::<test>` and `sqlite::<test>` for each named `async fn <test>(store: Store)`.
macro_rules! on_both_backends {
    ($($test:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test]
                async fn $test() {
                    let scratch = super::Scratch::postgres().await;
                    super::$test(scratch.store.clone()).await;
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test]
                async fn $test() {
                    let scratch = super::Scratch::sqlite().await;
                    super::$test(scratch.store.clone()).await;
                }
            )*
        }
    };
}

on_both_backends!(
    a_changed_step_whose_earlier_write_was_lost_is_written_again_whole,
    a_create_made_again_after_its_row_was_taken_over_writes_nothing_and_says_so,
    the_store_answers_and_its_migrations_are_applied,
    projects_are_created_read_listed_renamed_and_deleted,
    api_keys_are_listed_renamed_and_revoked_once,
    deployments_never_read_back_their_api_key,
    tool_sources_keep_their_parameters_and_never_read_back_their_secret,
    groups_list_their_members_sorted_and_memberships_say_what_is_missing,
    duplicate_names_are_a_conflict_for_every_kind,
    deleting_a_project_cascades_to_its_keys_grants_and_responses,
    deleting_a_member_removes_it_from_its_groups_and_deleting_a_group_keeps_its_members,
    a_key_finds_its_project_until_it_is_revoked,
    resolve_unites_the_tools_of_every_group_the_project_shares_with_the_deployment,
    resolve_sees_nothing_outside_the_projects_groups,
    a_created_response_loads_back_with_its_context_and_carried_steps,
    a_response_written_when_it_ended_loads_back_ended_with_its_steps,
    another_projects_response_loads_as_none_and_cannot_be_deleted,
    input_items_pages_walk_both_orders_with_after_and_has_more,
    step_writes_add_change_and_end_all_or_nothing,
    a_start_made_again_is_one_attempt_and_a_takeovers_start_another,
    every_ending_round_trips_through_the_response_row,
    deleting_a_response_removes_its_items_and_steps,
    an_idempotency_key_finds_its_response_and_cannot_be_used_twice_in_a_project,
    concurrent_writes_of_steps_and_responses_all_succeed,
    transactions_that_read_before_they_write_succeed_beside_many_writes,
    a_context_longer_than_one_statement_binds_is_stored_whole_and_in_order,
    a_create_made_again_after_its_reply_was_lost_is_the_same_write,
    a_run_fenced_on_an_older_claim_writes_nothing_even_when_its_replica_claims_the_response_again,
    a_heartbeat_says_whether_the_lease_held_since_the_previous_one,
    the_deadline_is_set_and_read_by_the_database_clock,
    writes_that_share_a_batch_are_answered_each_its_own_way,
    a_run_that_lost_its_response_writes_nothing_even_queued_beside_the_run_that_took_it_back,
    additions_to_counted_windows_in_one_statement_answer_each_its_windows_total,
    an_amount_beyond_what_a_window_holds_fills_it_and_fails_no_other_window_of_its_batch,
    counted_windows_that_ended_long_ago_are_pruned_and_the_others_kept,
    usage_sums_beyond_what_a_bigint_holds_read_as_the_largest_one,
    a_webhook_try_that_outlived_its_lock_records_nothing_over_the_try_after_it,
    a_deleted_responses_queued_event_is_sent_only_when_its_ending_was_written,
);

// ---- scratch databases ----

/// A migrated store on a database made for one test, removed when dropped.
struct Scratch {
    store: Store,
    db: ScratchDatabase,
}

impl Scratch {
    async fn postgres() -> Scratch {
        Scratch::on(ScratchDatabase::postgres().await.expect("test database")).await
    }

    async fn sqlite() -> Scratch {
        Scratch::on(ScratchDatabase::sqlite()).await
    }

    async fn on(db: ScratchDatabase) -> Scratch {
        // As the gateway runs it: responses' writes through group commit.
        let store = Store::connect(db.url(), 5)
            .await
            .expect("connect store")
            .with_group_commit(2);
        store.migrate().await.expect("migrate");
        Scratch { store, db }
    }
}

// ---- fixtures ----

/// The replica the tests write as.
const OWNER: &str = "replica_test";

fn name(name: &str) -> EntityName {
    EntityName::parse(name, "name").expect("a valid name")
}

/// Changes that rename a project and nothing else.
fn rename_to(name: &EntityName) -> ProjectChanges<'_> {
    ProjectChanges {
        name: Some(name),
        ..ProjectChanges::default()
    }
}

fn tool_name(name: &str) -> ToolName {
    ToolName::parse(name, "name").expect("a valid tool name")
}

fn url(url: &str) -> HttpUrl {
    HttpUrl::parse(url, "url").expect("a valid URL")
}

fn timeout(ms: i64) -> TimeoutMs {
    TimeoutMs::parse(ms, "timeout_ms").expect("a valid timeout")
}

fn schema(parameters: Value) -> ToolParameters {
    ToolParameters::parse(parameters, "parameters").expect("a valid schema")
}

async fn project(store: &Store, project: &str) -> String {
    store
        .create_project(&name(project), &Governance::default())
        .await
        .expect("project")
        .id
}

async fn key(store: &Store, project_id: &str, key: &str) -> String {
    store
        .create_api_key(&NewApiKey {
            project_id,
            name: &name("test"),
            key_hash: &hash_key(key),
            key_prefix: &key[..6],
            expires_at: None,
            governance: Governance::default(),
        })
        .await
        .expect("key")
        .expect("project exists")
        .id
}

async fn deployment(store: &Store, deployment: &str) -> String {
    store
        .create_deployment(&NewDeployment {
            name: &name(deployment),
            provider_kind: ProviderKind::OpenaiChat,
            base_url: &url("http://127.0.0.1:9/v1"),
            upstream_model: "mock-model",
            api_key: Some("sk-upstream"),
            fallbacks: &[],
            unsupported_tools: Default::default(),
            unsupported_params: Default::default(),
            max_tokens: None,
            pricing: None,
        })
        .await
        .expect("deployment")
        .id
}

async fn tool(store: &Store, name: &str) -> String {
    store
        .create_tool_source(&NewToolSource {
            name: &tool_name(name),
            description: "a tool",
            parameters: &schema(json!({"type": "object", "properties": {"a": {"type": "number"}}})),
            url: &url("http://127.0.0.1:9/tools"),
            timeout_ms: timeout(1000),
            secret: Some("tool-secret"),
            strict: true,
            policy: Default::default(),
            note_on_request: None,
            note_on_result: None,
            hosted_type: None,
            kind: "http",
            allowed_tools: None,
            name_prefix: None,
        })
        .await
        .expect("tool source")
        .id
}

async fn group(store: &Store, group: &str) -> String {
    store.create_group(&name(group)).await.expect("group").id
}

async fn attach(store: &Store, group_id: &str, kind: Member, member_id: &str) {
    assert_eq!(
        store
            .attach_member(group_id, kind, member_id)
            .await
            .expect("attach"),
        Membership::Done
    );
}

/// A project that may use deployment `mock`: `(project_id, deployment_id)`.
async fn tenant(store: &Store, name: &str) -> (String, String) {
    let project_id = project(store, name).await;
    let deployments = store.list_deployments().await.expect("deployments");
    let deployment_id = match deployments.into_iter().find(|d| d.name == "mock") {
        Some(d) => d.id,
        None => deployment(store, "mock").await,
    };
    let group_id = group(store, &format!("{name}-group")).await;
    attach(store, &group_id, Member::Deployment, &deployment_id).await;
    attach(store, &group_id, Member::Project, &project_id).await;
    (project_id, deployment_id)
}

fn params() -> ResponseParams {
    serde_json::from_value(json!({
        "instructions": "Be brief.",
        "tools": [],
        "tool_choice": "auto",
        "parallel_tool_calls": true,
        "temperature": 0.5,
        "truncation": "disabled",
        "text": {"format": {"type": "text"}},
        "metadata": {"k": "v"},
    }))
    .expect("params")
}

fn record(id: &str) -> ResponseRecord {
    ResponseRecord {
        id: id.to_owned(),
        created_at: 1_700_000_000,
        state: ResponseState::InProgress,
        model: "mock".into(),
        params: params(),
        previous_response_id: None,
        store: true,
        background: false,
        usage: None,
    }
}

fn message(id: &str, text: &str) -> Item {
    serde_json::from_value(json!({"type": "message", "id": id, "role": "user", "content": text}))
        .expect("item")
}

fn context(count: usize) -> Vec<Item> {
    (0..count)
        .map(|i| message(&format!("msg_{i}"), &format!("item {i}")))
        .collect()
}

fn model_step(seq: u32) -> Step {
    serde_json::from_value(json!({"seq": seq, "state": "succeeded", "body": {"kind": "model", "output": {
        "tool_calls": [{"item_id": format!("mcp_{seq}"), "call_id": format!("call_{seq}"), "name": "add", "arguments": "{\"a\":1}"}],
        "usage": {"input_tokens": 3, "output_tokens": 2},
        "finish": "tool_calls"
    }}}))
    .expect("model step")
}

fn tool_step(seq: u32, batch: u32) -> Step {
    serde_json::from_value(json!({"seq": seq, "state": "pending", "body": {"kind": "tool",
        "item_id": format!("mcp_{seq}"),
        "call": {"item_id": format!("mcp_{seq}"), "call_id": format!("call_{seq}"), "name": "add", "arguments": "{\"a\":1}"},
        "batch": batch
    }}))
    .expect("tool step")
}

fn finished(step: &Step, text: &str) -> Step {
    let mut step = step.clone();
    step.state = StepState::Succeeded;
    if let gateway_core::steps::StepBody::Tool(tool) = &mut step.body {
        tool.outcome = Some(gateway_core::steps::ToolOutcome::Output { text: text.into() });
    }
    step
}

fn server_tool() -> StoredTool {
    StoredTool {
        id: "tool_1".into(),
        name: "add".into(),
        description: "Adds.".into(),
        parameters: json!({"type": "object"}),
        url: "http://127.0.0.1:9/add".into(),
        timeout_ms: 1000,
        strict: false,
        policy: Default::default(),
        note_on_request: None,
        note_on_result: None,
        hosted_type: None,
        kind: Default::default(),
        allowed_tools: None,
        name_prefix: None,
        mcp_tool: None,
        server_label: None,
        approval_required: false,
    }
}

/// Creates a response of `project_id` with `items` as its context and `steps` carried.
async fn create(
    store: &Store,
    project_id: &str,
    deployment_id: &str,
    record: &ResponseRecord,
    items: &[Item],
    steps: &[Step],
    idempotency_key: Option<&str>,
) -> Result<(), StoreError> {
    store
        .create_response(
            &NewResponse {
                record,
                project_id,
                deployment_id,
                server_tools: &[server_tool()],
                context: items,
                steps,
                // The key stands for its request's digest too: each reads back as it was written.
                idempotency_key: idempotency_key.map(|key| IdempotencyKey {
                    key,
                    request_digest: key,
                }),
                owner: Some(OWNER),
                deadline_in_ms: Some(60_000),
                api_key_id: None,
                usage: &[],
                trace_context: None,
            },
            Durability::Flush,
        )
        .await
}

/// Writes one step boundary without an ending.
async fn write_steps(
    store: &Store,
    response_id: &str,
    added: &[Step],
    changed: &[&Step],
    durability: Durability,
) -> Result<(), StoreError> {
    store
        .write_steps(&StepWrite {
            response_id,
            added,
            changed,
            ended: None,
            at: 1_700_000_050,
            durability,
            owner: OWNER,
            epoch: 0,
            notify: false,
            usage: &[],
        })
        .await
        .map(drop)
}

/// `step` in another state.
fn with_state(step: &Step, state: StepState) -> Step {
    Step {
        state,
        ..step.clone()
    }
}

fn item_ids(items: &[Value]) -> Vec<&str> {
    items
        .iter()
        .map(|i| i["id"].as_str().unwrap_or(""))
        .collect()
}

// ---- admin ----

async fn the_store_answers_and_its_migrations_are_applied(store: Store) {
    assert!(store.migrations_applied().await.expect("answers"));
}

async fn projects_are_created_read_listed_renamed_and_deleted(store: Store) {
    let beta = store
        .create_project(&name("beta"), &Governance::default())
        .await
        .expect("create");
    let alpha = store
        .create_project(&name("alpha"), &Governance::default())
        .await
        .expect("create");
    assert!(beta.id.starts_with("proj_"), "{beta:?}");
    assert_eq!(beta.name, "beta");
    assert!(beta.created_at > 1_600_000_000);

    assert_eq!(
        store.get_project(&beta.id).await.expect("get"),
        Some(beta.clone())
    );
    assert_eq!(
        store.list_projects().await.expect("list"),
        [alpha.clone(), beta.clone()],
        "listed by name"
    );
    let renamed = store
        .update_project(&beta.id, &rename_to(&name("gamma")))
        .await
        .expect("rename")
        .expect("exists");
    assert_eq!(renamed.name, "gamma");
    assert_eq!(renamed.created_at, beta.created_at);
    let unchanged = store
        .update_project(&beta.id, &ProjectChanges::default())
        .await
        .expect("no change")
        .expect("exists");
    assert_eq!(unchanged, renamed);
    assert_eq!(
        store
            .update_project("proj_missing", &rename_to(&name("x")))
            .await
            .expect("update"),
        None
    );

    assert!(store.delete_project(&beta.id).await.expect("delete"));
    assert!(!store.delete_project(&beta.id).await.expect("delete again"));
    assert_eq!(store.get_project(&beta.id).await.expect("get"), None);
    assert_eq!(store.list_projects().await.expect("list"), [alpha]);
}

async fn api_keys_are_listed_renamed_and_revoked_once(store: Store) {
    let project_id = project(&store, "acme").await;
    let missing = store
        .create_api_key(&NewApiKey {
            project_id: "proj_missing",
            name: &name("k"),
            key_hash: &hash_key("sk-nowhere"),
            key_prefix: "sk-now",
            expires_at: None,
            governance: Governance::default(),
        })
        .await
        .expect("create for a missing project");
    assert_eq!(missing, None);
    assert_eq!(
        store.list_api_keys("proj_missing").await.expect("list"),
        None
    );

    let first_id = key(&store, &project_id, "sk-first-key").await;
    let second_id = key(&store, &project_id, "sk-second-key").await;
    let keys = store
        .list_api_keys(&project_id)
        .await
        .expect("list")
        .expect("project exists");
    let mut ids: Vec<&str> = keys.iter().map(|k| k.id.as_str()).collect();
    ids.sort_unstable();
    let mut expected = [first_id.as_str(), second_id.as_str()];
    expected.sort_unstable();
    assert_eq!(ids, expected);
    let first = store
        .get_api_key(&first_id)
        .await
        .expect("get")
        .expect("exists");
    assert_eq!(first.project_id, project_id);
    assert_eq!(first.key_prefix, "sk-fir");
    assert_eq!(first.revoked_at, None);

    let renamed = store
        .update_api_key(
            &first_id,
            &ApiKeyChanges {
                name: Some(&name("ci")),
                ..ApiKeyChanges::default()
            },
        )
        .await
        .expect("rename")
        .expect("exists");
    assert_eq!(renamed.name, "ci");

    let revoked = store
        .revoke_api_key(&first_id)
        .await
        .expect("revoke")
        .expect("exists");
    let at = revoked.revoked_at.expect("revoked_at");
    let again = store
        .revoke_api_key(&first_id)
        .await
        .expect("revoke again")
        .expect("exists");
    assert_eq!(
        again.revoked_at,
        Some(at),
        "the first revocation time stays"
    );
    assert_eq!(
        store.revoke_api_key("key_missing").await.expect("revoke"),
        None
    );

    let duplicate = store
        .create_api_key(&NewApiKey {
            project_id: &project_id,
            name: &name("again"),
            key_hash: &hash_key("sk-first-key"),
            key_prefix: "sk-fir",
            expires_at: None,
            governance: Governance::default(),
        })
        .await;
    assert!(
        matches!(duplicate, Err(StoreError::Conflict(_))),
        "{duplicate:?}"
    );
}

async fn deployments_never_read_back_their_api_key(store: Store) {
    let id = deployment(&store, "mock").await;
    let created = store
        .get_deployment(&id)
        .await
        .expect("get")
        .expect("exists");
    assert_eq!(created.name, "mock");
    assert_eq!(created.provider_kind, ProviderKind::OpenaiChat);
    assert_eq!(created.upstream_model, "mock-model");
    assert!(created.has_api_key);

    let patched = store
        .update_deployment(
            &id,
            &DeploymentChanges {
                base_url: Some(&url("http://127.0.0.1:10/v1")),
                api_key: Some(None),
                ..DeploymentChanges::default()
            },
        )
        .await
        .expect("update")
        .expect("exists");
    assert_eq!(patched.base_url, "http://127.0.0.1:10/v1");
    assert_eq!(patched.name, "mock", "unchanged fields stay");
    assert!(!patched.has_api_key, "the key was cleared");
    let kept = store
        .update_deployment(&id, &DeploymentChanges::default())
        .await
        .expect("update")
        .expect("exists");
    assert_eq!(kept, patched);
    let rekeyed = store
        .update_deployment(
            &id,
            &DeploymentChanges {
                api_key: Some(Some("sk-new")),
                ..DeploymentChanges::default()
            },
        )
        .await
        .expect("update")
        .expect("exists");
    assert!(rekeyed.has_api_key);
    assert_eq!(store.list_deployments().await.expect("list"), [rekeyed]);
    assert_eq!(
        store
            .update_deployment("dep_missing", &DeploymentChanges::default())
            .await
            .expect("update"),
        None
    );

    // `ProviderKind` cannot name another kind, so the column's own check is tried with a raw insert.
    let bad_kind = insert_deployment_of_kind(&store, "carrier_pigeon").await;
    assert!(
        matches!(bad_kind, Err(sqlx::Error::Database(_))),
        "the provider kind is checked: {bad_kind:?}"
    );

    assert!(matches!(
        store.remove_deployment(&id, false).await.expect("delete"),
        Removal::Deleted(_)
    ));
    assert_eq!(
        store
            .remove_deployment(&id, false)
            .await
            .expect("delete again"),
        Removal::Missing
    );
}

async fn tool_sources_keep_their_parameters_and_never_read_back_their_secret(store: Store) {
    let id = tool(&store, "add").await;
    let created = store
        .get_tool_source(&id)
        .await
        .expect("get")
        .expect("exists");
    assert_eq!(
        created.parameters,
        json!({"type": "object", "properties": {"a": {"type": "number"}}})
    );
    assert_eq!(created.timeout_ms, 1000);
    assert!(created.strict);
    assert!(created.has_secret);

    let parameters = schema(
        json!({"type": "object", "required": ["b"], "properties": {"b": {"type": "string"}}}),
    );
    let patched = store
        .update_tool_source(
            &id,
            &ToolSourceChanges {
                parameters: Some(&parameters),
                timeout_ms: Some(timeout(2500)),
                secret: Some(None),
                strict: Some(false),
                ..ToolSourceChanges::default()
            },
        )
        .await
        .expect("update")
        .expect("exists");
    assert_eq!(&patched.parameters, parameters.as_value());
    assert_eq!(patched.timeout_ms, 2500);
    assert!(!patched.strict);
    assert!(!patched.has_secret);
    assert_eq!(patched.description, "a tool", "unchanged fields stay");
    assert_eq!(store.list_tool_sources().await.expect("list"), [patched]);
    assert_eq!(
        store
            .update_tool_source("tool_missing", &ToolSourceChanges::default())
            .await
            .expect("update"),
        None
    );
    assert!(matches!(
        store.remove_tool_source(&id, false).await.expect("delete"),
        Removal::Deleted(_)
    ));
    assert_eq!(store.get_tool_source(&id).await.expect("get"), None);
}

async fn groups_list_their_members_sorted_and_memberships_say_what_is_missing(store: Store) {
    let group_id = group(&store, "default").await;
    let fresh = store
        .get_group(&group_id)
        .await
        .expect("get")
        .expect("exists");
    assert!(fresh.deployment_ids.is_empty() && fresh.project_ids.is_empty());
    assert!(fresh.tool_source_ids.is_empty());

    let mut projects = vec![project(&store, "p1").await, project(&store, "p2").await];
    let deployment_id = deployment(&store, "mock").await;
    let tool_id = tool(&store, "add").await;
    for project_id in &projects {
        attach(&store, &group_id, Member::Project, project_id).await;
    }
    attach(&store, &group_id, Member::Deployment, &deployment_id).await;
    attach(&store, &group_id, Member::ToolSource, &tool_id).await;
    attach(&store, &group_id, Member::ToolSource, &tool_id).await;

    let full = store
        .get_group(&group_id)
        .await
        .expect("get")
        .expect("exists");
    projects.sort();
    assert_eq!(full.project_ids, projects);
    assert_eq!(full.deployment_ids, [deployment_id.as_str()]);
    assert_eq!(
        full.tool_source_ids,
        [tool_id.as_str()],
        "attaching twice is one membership"
    );
    let other = group(&store, "another").await;
    let listed = store.list_groups().await.expect("list");
    let names: Vec<&str> = listed.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(names, ["another", "default"]);
    assert_eq!(listed[1], full);

    assert_eq!(
        store
            .attach_member("grp_missing", Member::Project, "proj_missing")
            .await
            .expect("attach"),
        Membership::GroupMissing
    );
    assert_eq!(
        store
            .attach_member(&group_id, Member::Deployment, "dep_missing")
            .await
            .expect("attach"),
        Membership::MemberMissing
    );
    assert_eq!(
        store
            .detach_member(&other, Member::ToolSource, &tool_id)
            .await
            .expect("detach"),
        Membership::NotAttached
    );
    assert_eq!(
        store
            .detach_member(&group_id, Member::ToolSource, &tool_id)
            .await
            .expect("detach"),
        Membership::Done
    );
    assert_eq!(
        store
            .detach_member("grp_missing", Member::ToolSource, &tool_id)
            .await
            .expect("detach"),
        Membership::GroupMissing
    );
    let renamed = store
        .update_group(&group_id, Some(&name("renamed")))
        .await
        .expect("rename")
        .expect("exists");
    assert_eq!(renamed.name, "renamed");
    assert!(renamed.tool_source_ids.is_empty());
    assert_eq!(renamed.project_ids, projects);
    assert_eq!(
        store
            .update_group("grp_missing", Some(&name("x")))
            .await
            .expect("rename"),
        None
    );
}

async fn duplicate_names_are_a_conflict_for_every_kind(store: Store) {
    fn conflict<T: std::fmt::Debug>(result: Result<T, StoreError>) {
        assert!(matches!(result, Err(StoreError::Conflict(_))), "{result:?}");
    }
    project(&store, "acme").await;
    let other_project = project(&store, "other").await;
    conflict(
        store
            .create_project(&name("acme"), &Governance::default())
            .await,
    );
    conflict(
        store
            .update_project(&other_project, &rename_to(&name("acme")))
            .await,
    );

    deployment(&store, "mock").await;
    let other_deployment = deployment(&store, "other").await;
    conflict(
        store
            .create_deployment(&NewDeployment {
                name: &name("mock"),
                provider_kind: ProviderKind::Anthropic,
                base_url: &url("http://127.0.0.1:9"),
                upstream_model: "m",
                api_key: None,
                fallbacks: &[],
                unsupported_tools: Default::default(),
                unsupported_params: Default::default(),
                max_tokens: None,
                pricing: None,
            })
            .await,
    );
    conflict(
        store
            .update_deployment(
                &other_deployment,
                &DeploymentChanges {
                    name: Some(&name("mock")),
                    ..DeploymentChanges::default()
                },
            )
            .await,
    );

    group(&store, "default").await;
    let other_group = group(&store, "other").await;
    conflict(store.create_group(&name("default")).await);
    conflict(
        store
            .update_group(&other_group, Some(&name("default")))
            .await,
    );

    tool(&store, "add").await;
    let other_tool = tool(&store, "other").await;
    conflict(
        store
            .create_tool_source(&NewToolSource {
                name: &tool_name("add"),
                description: "",
                parameters: &schema(json!({})),
                url: &url("http://127.0.0.1:9"),
                timeout_ms: timeout(1),
                secret: None,
                strict: false,
                policy: Default::default(),
                note_on_request: None,
                note_on_result: None,
                hosted_type: None,
                kind: "http",
                allowed_tools: None,
                name_prefix: None,
            })
            .await,
    );
    conflict(
        store
            .update_tool_source(
                &other_tool,
                &ToolSourceChanges {
                    name: Some(&tool_name("add")),
                    ..ToolSourceChanges::default()
                },
            )
            .await,
    );
}

async fn deleting_a_project_cascades_to_its_keys_grants_and_responses(store: Store) {
    let (project_id, deployment_id) = tenant(&store, "acme").await;
    let key_id = key(&store, &project_id, "sk-acme-key").await;
    create(
        &store,
        &project_id,
        &deployment_id,
        &record("resp_cascade"),
        &context(2),
        &[tool_step(0, 0)],
        None,
    )
    .await
    .expect("create");

    assert!(store.delete_project(&project_id).await.expect("delete"));

    assert_eq!(store.get_api_key(&key_id).await.expect("get"), None);
    assert_eq!(
        store.project_for_key("sk-acme-key").await.expect("key"),
        None
    );
    let group = &store.list_groups().await.expect("groups")[0];
    assert!(group.project_ids.is_empty(), "{group:?}");
    assert_eq!(group.deployment_ids, [deployment_id]);
    assert!(store
        .load_context(&project_id, "resp_cascade")
        .await
        .expect("context")
        .is_empty());
    assert!(store
        .load_steps(&project_id, "resp_cascade")
        .await
        .expect("steps")
        .is_empty());
    assert_eq!(rows_left_of(&store, "resp_cascade").await, (0, 0));
}

async fn deleting_a_member_removes_it_from_its_groups_and_deleting_a_group_keeps_its_members(
    store: Store,
) {
    let (project_id, deployment_id) = tenant(&store, "acme").await;
    let group_id = store.list_groups().await.expect("groups")[0].id.clone();
    let tool_id = tool(&store, "add").await;
    attach(&store, &group_id, Member::ToolSource, &tool_id).await;

    assert_eq!(
        store
            .remove_tool_source(&tool_id, false)
            .await
            .expect("refuse"),
        Removal::InUse(vec!["group 'acme-group'".to_owned()]),
        "a held tool source is refused unless forced"
    );
    assert!(matches!(
        store
            .remove_tool_source(&tool_id, true)
            .await
            .expect("delete"),
        Removal::Deleted(_)
    ));
    assert!(matches!(
        store
            .remove_deployment(&deployment_id, true)
            .await
            .expect("delete"),
        Removal::Deleted(_)
    ));
    let group = store
        .get_group(&group_id)
        .await
        .expect("get")
        .expect("exists");
    assert!(group.tool_source_ids.is_empty() && group.deployment_ids.is_empty());
    assert_eq!(group.project_ids, [project_id.as_str()]);

    assert!(matches!(
        store.remove_group(&group_id, false).await.expect("refuse"),
        Removal::InUse(_)
    ));
    assert_eq!(
        store.remove_group(&group_id, true).await.expect("delete"),
        Removal::Deleted(vec!["project 'acme'".to_owned()])
    );
    assert_eq!(
        store
            .remove_group(&group_id, true)
            .await
            .expect("delete again"),
        Removal::Missing
    );
    assert!(store.get_project(&project_id).await.expect("get").is_some());
}

// ---- tenancy ----

async fn a_key_finds_its_project_until_it_is_revoked(store: Store) {
    let project_id = project(&store, "acme").await;
    let key_id = key(&store, &project_id, "sk-live-key").await;

    assert_eq!(
        store.project_for_key("sk-live-key").await.expect("lookup"),
        Some(project_id)
    );
    assert_eq!(
        store.project_for_key("sk-unknown").await.expect("lookup"),
        None
    );
    store.revoke_api_key(&key_id).await.expect("revoke");
    assert_eq!(
        store.project_for_key("sk-live-key").await.expect("lookup"),
        None
    );
}

async fn resolve_unites_the_tools_of_every_group_the_project_shares_with_the_deployment(
    store: Store,
) {
    let project_id = project(&store, "acme").await;
    let deployment_id = deployment(&store, "mock").await;
    let (first, second) = (group(&store, "first").await, group(&store, "second").await);
    let (add, lookup, shared) = (
        tool(&store, "add").await,
        tool(&store, "lookup").await,
        tool(&store, "shared").await,
    );
    for group_id in [&first, &second] {
        attach(&store, group_id, Member::Project, &project_id).await;
        attach(&store, group_id, Member::Deployment, &deployment_id).await;
        attach(&store, group_id, Member::ToolSource, &shared).await;
    }
    attach(&store, &first, Member::ToolSource, &lookup).await;
    attach(&store, &second, Member::ToolSource, &add).await;

    let resolution = store
        .resolve(&project_id, "mock")
        .await
        .expect("resolve")
        .expect("visible");

    assert_eq!(resolution.deployment.id, deployment_id);
    assert_eq!(resolution.deployment.upstream_model, "mock-model");
    assert!(resolution.deployment.api_key.is_some());
    let names: Vec<&str> = resolution.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["add", "lookup", "shared"], "one of each, by name");
    let add_tool = &resolution.tools[0];
    assert_eq!(add_tool.timeout_ms, 1000);
    assert!(add_tool.strict);
    assert!(add_tool.secret.is_some());
    assert_eq!(add_tool.parameters["type"], "object");
}

async fn resolve_sees_nothing_outside_the_projects_groups(store: Store) {
    let (project_id, deployment_id) = tenant(&store, "acme").await;
    let stranger = project(&store, "stranger").await;
    // A group with a tool and the project, but not the deployment: its tool is not offered with `mock`.
    let side = group(&store, "side").await;
    let side_tool = tool(&store, "side-tool").await;
    attach(&store, &side, Member::Project, &project_id).await;
    attach(&store, &side, Member::ToolSource, &side_tool).await;
    // A group with the deployment and a tool, but not the project.
    let foreign = group(&store, "foreign").await;
    let foreign_tool = tool(&store, "foreign-tool").await;
    attach(&store, &foreign, Member::Deployment, &deployment_id).await;
    attach(&store, &foreign, Member::ToolSource, &foreign_tool).await;
    attach(&store, &foreign, Member::Project, &stranger).await;

    let mine = store
        .resolve(&project_id, "mock")
        .await
        .expect("resolve")
        .expect("visible");
    assert!(mine.tools.is_empty(), "{:?}", mine.tools);
    let theirs = store
        .resolve(&stranger, "mock")
        .await
        .expect("resolve")
        .expect("visible");
    let names: Vec<&str> = theirs.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["foreign-tool"]);
    assert!(store
        .resolve(&project_id, "unknown")
        .await
        .expect("resolve")
        .is_none());
    let loner = project(&store, "loner").await;
    assert!(store
        .resolve(&loner, "mock")
        .await
        .expect("resolve")
        .is_none());
}

// ---- responses ----

async fn a_created_response_loads_back_with_its_context_and_carried_steps(store: Store) {
    let (project_id, deployment_id) = tenant(&store, "acme").await;
    let record = record("resp_one");
    let items = context(3);
    let steps = [tool_step(0, 0), tool_step(1, 0)];

    create(
        &store,
        &project_id,
        &deployment_id,
        &record,
        &items,
        &steps,
        None,
    )
    .await
    .expect("create");

    let stored = store
        .load_response(&project_id, "resp_one")
        .await
        .expect("load")
        .expect("exists");
    assert_eq!(stored.record, record);
    assert_eq!(stored.record.ending(), None);
    assert_eq!(stored.deployment_id, Some(deployment_id));
    assert_eq!(
        store
            .load_context(&project_id, "resp_one")
            .await
            .expect("context"),
        items
    );
    assert_eq!(
        store
            .load_steps(&project_id, "resp_one")
            .await
            .expect("steps"),
        steps
    );
    assert!(store
        .load_response(&project_id, "resp_missing")
        .await
        .expect("load")
        .is_none());
}

async fn a_response_written_when_it_ended_loads_back_ended_with_its_steps(store: Store) {
    let (project_id, deployment_id) = tenant(&store, "acme").await;
    let record = ResponseRecord {
        state: ResponseState::Ended {
            ending: Ending::Completed { handed_back: true },
            completed_at: 1_700_000_009,
        },
        usage: Some(Usage {
            input_tokens: 5,
            output_tokens: 1,
            cached_tokens: 0,
            reasoning_tokens: 0,
        }),
        ..record("resp_ended")
    };
    let steps = [model_step(0), finished(&tool_step(1, 0), "{}")];
    store
        .create_response(
            &NewResponse {
                record: &record,
                project_id: &project_id,
                deployment_id: &deployment_id,
                server_tools: &[server_tool()],
                context: &context(2),
                steps: &steps,
                idempotency_key: None,
                owner: Some(OWNER),
                deadline_in_ms: None,
                api_key_id: None,
                usage: &[],
                trace_context: None,
            },
            Durability::Flush,
        )
        .await
        .expect("create");

    let stored = store
        .load_response(&project_id, "resp_ended")
        .await
        .expect("load")
        .expect("exists");
    assert_eq!(stored.record, record);
    assert!(stored.record.ending().is_some_and(Ending::handed_back));
    assert_eq!(
        store
            .load_steps(&project_id, "resp_ended")
            .await
            .expect("steps"),
        steps
    );
    assert_eq!(
        attempts(&store, "resp_ended").await,
        [(0, 1), (1, 1)],
        "steps written ended were attempted once"
    );
}

async fn another_projects_response_loads_as_none_and_cannot_be_deleted(store: Store) {
    let (owner, deployment_id) = tenant(&store, "owner").await;
    let (stranger, _) = tenant(&store, "stranger").await;
    create(
        &store,
        &owner,
        &deployment_id,
        &record("resp_private"),
        &context(1),
        &[],
        None,
    )
    .await
    .expect("create");

    assert!(store
        .load_response(&stranger, "resp_private")
        .await
        .expect("load")
        .is_none());
    assert!(!store
        .delete_response(&stranger, "resp_private")
        .await
        .expect("delete"));
    assert!(store
        .load_response(&owner, "resp_private")
        .await
        .expect("load")
        .is_some());
}

async fn input_items_pages_walk_both_orders_with_after_and_has_more(store: Store) {
    let (project_id, deployment_id) = tenant(&store, "acme").await;
    create(
        &store,
        &project_id,
        &deployment_id,
        &record("resp_paged"),
        &context(5),
        &[],
        None,
    )
    .await
    .expect("create");
    let page = |after: Option<&'static str>, limit: i64, order: Order| {
        let (store, project_id) = (store.clone(), project_id.clone());
        async move {
            store
                .input_items_page(&project_id, "resp_paged", after, limit, order)
                .await
                .expect("page")
        }
    };

    let (items, more) = page(None, 2, Order::Asc).await.expect("page");
    assert_eq!((item_ids(&items), more), (vec!["msg_0", "msg_1"], true));
    assert_eq!(
        items[0],
        json!({"type": "message", "id": "msg_0", "role": "user", "content": "item 0"})
    );
    let (items, more) = page(Some("msg_1"), 2, Order::Asc).await.expect("page");
    assert_eq!((item_ids(&items), more), (vec!["msg_2", "msg_3"], true));
    let (items, more) = page(Some("msg_3"), 2, Order::Asc).await.expect("page");
    assert_eq!((item_ids(&items), more), (vec!["msg_4"], false));
    let (items, more) = page(None, 5, Order::Asc).await.expect("page");
    assert_eq!(
        (items.len(), more),
        (5, false),
        "exactly a page is not more"
    );

    let (items, more) = page(None, 3, Order::Desc).await.expect("page");
    assert_eq!(
        (item_ids(&items), more),
        (vec!["msg_4", "msg_3", "msg_2"], true)
    );
    let (items, more) = page(Some("msg_2"), 3, Order::Desc).await.expect("page");
    assert_eq!((item_ids(&items), more), (vec!["msg_1", "msg_0"], false));
    let (items, more) = page(Some("msg_0"), 3, Order::Desc).await.expect("page");
    assert_eq!((items.len(), more), (0, false));

    assert!(
        page(Some("msg_unknown"), 2, Order::Asc).await.is_none(),
        "an unknown `after` is no page at all"
    );
    let (items, more) = store
        .input_items_page(&project_id, "resp_missing", None, 2, Order::Asc)
        .await
        .expect("page")
        .expect("page");
    assert_eq!((items.len(), more), (0, false));
}

async fn a_start_made_again_is_one_attempt_and_a_takeovers_start_another(store: Store) {
    let (project_id, deployment_id) = tenant(&store, "acme").await;
    let call = tool_step(1, 0);
    create(
        &store,
        &project_id,
        &deployment_id,
        &record("resp_resent"),
        &context(1),
        &[model_step(0), call.clone()],
        None,
    )
    .await
    .expect("create");
    let started = with_state(&call, StepState::Running);
    let changed = [&started];
    let start = |epoch| StepWrite {
        response_id: "resp_resent",
        added: &[],
        changed: &changed,
        ended: None,
        at: 1_700_000_050,
        durability: Durability::Flush,
        owner: OWNER,
        epoch,
        notify: false,
        usage: &[],
    };
    store.write_steps(&start(0)).await.expect("started");
    // Made again after its reply was lost: the same start, no new attempt.
    store.write_steps(&start(0)).await.expect("started again");
    assert_eq!(attempts(&store, "resp_resent").await, [(0, 1), (1, 1)]);

    // The response is claimed again (epoch 1) and its run sends the call again: a second attempt.
    let sql = "UPDATE responses SET claim_epoch = 1 WHERE id = 'resp_resent'";
    match store.backend() {
        Backend::Postgres(pool) => drop(sqlx::query(sql).execute(pool).await.expect("claimed")),
        Backend::Sqlite(pool) => drop(sqlx::query(sql).execute(pool).await.expect("claimed")),
    }
    store.write_steps(&start(1)).await.expect("sent again");
    store
        .write_steps(&start(1))
        .await
        .expect("sent again, made again");
    assert_eq!(attempts(&store, "resp_resent").await, [(0, 1), (1, 2)]);
}

async fn step_writes_add_change_and_end_all_or_nothing(store: Store) {
    let (project_id, deployment_id) = tenant(&store, "acme").await;
    let running_model = with_state(&model_step(0), StepState::Running);
    create(
        &store,
        &project_id,
        &deployment_id,
        &record("resp_steps"),
        &context(1),
        std::slice::from_ref(&running_model),
        None,
    )
    .await
    .expect("create");
    assert_eq!(
        attempts(&store, "resp_steps").await,
        [(0, 1)],
        "created running: one attempt"
    );

    // The model step ends and its batch is added in one write (relaxed: visible at once all the same);
    // rows inserted out of order on purpose: loading orders by seq.
    let model_done = model_step(0);
    let batch = [tool_step(3, 0), tool_step(1, 0), tool_step(2, 0)];
    write_steps(
        &store,
        "resp_steps",
        &batch,
        &[&model_done],
        Durability::Relaxed,
    )
    .await
    .expect("end the model step and add the batch");
    let loaded = store
        .load_steps(&project_id, "resp_steps")
        .await
        .expect("load");
    assert_eq!(
        loaded,
        [
            model_done.clone(),
            batch[1].clone(),
            batch[2].clone(),
            batch[0].clone()
        ]
    );

    // Two calls start: an attempt each.
    let (one, three) = (
        with_state(&batch[1], StepState::Running),
        with_state(&batch[0], StepState::Running),
    );
    write_steps(
        &store,
        "resp_steps",
        &[],
        &[&one, &three],
        Durability::Flush,
    )
    .await
    .expect("start two");
    let states: Vec<(u32, StepState)> = store
        .load_steps(&project_id, "resp_steps")
        .await
        .expect("load")
        .iter()
        .map(|s| (s.seq, s.state))
        .collect();
    assert_eq!(
        states,
        [
            (0, StepState::Succeeded),
            (1, StepState::Running),
            (2, StepState::Pending),
            (3, StepState::Running)
        ]
    );
    assert_eq!(
        attempts(&store, "resp_steps").await,
        [(0, 1), (1, 1), (2, 0), (3, 1)]
    );
    // The same start made again (its reply was lost after it committed): no new attempt.
    write_steps(
        &store,
        "resp_steps",
        &[],
        &[&one, &three],
        Durability::Flush,
    )
    .await
    .expect("start two again");
    assert_eq!(
        attempts(&store, "resp_steps").await,
        [(0, 1), (1, 1), (2, 0), (3, 1)],
        "a start made again under the same claim is the same attempt"
    );

    // A result, and the next model step, in one write.
    let done = finished(&batch[1], "{\"sum\":2}");
    let next = with_state(&model_step(4), StepState::Running);
    write_steps(
        &store,
        "resp_steps",
        std::slice::from_ref(&next),
        &[&done],
        Durability::Relaxed,
    )
    .await
    .expect("record a result");
    let loaded = store
        .load_steps(&project_id, "resp_steps")
        .await
        .expect("load");
    assert_eq!(loaded[1], done);
    assert_eq!(loaded[2], batch[2]);
    assert_eq!(loaded[4], next);
    assert_eq!(
        attempts(&store, "resp_steps").await[1],
        (1, 1),
        "ending is no new attempt"
    );

    // A write made again because its reply was lost (its commit went through) is the same write: the steps it
    // adds are there already, and it succeeds without changing them or counting another attempt.
    let again = write_steps(
        &store,
        "resp_steps",
        std::slice::from_ref(&next),
        &[&done],
        Durability::Flush,
    )
    .await;
    assert!(again.is_ok(), "a repeated write is no conflict: {again:?}");
    let loaded = store
        .load_steps(&project_id, "resp_steps")
        .await
        .expect("load");
    assert_eq!(loaded[1], done);
    assert_eq!(loaded[3], three);
    assert_eq!(loaded[4], next);
    assert_eq!(attempts(&store, "resp_steps").await[4], (4, 1));

    let orphan = write_steps(
        &store,
        "resp_missing",
        &[tool_step(0, 0)],
        &[],
        Durability::Flush,
    )
    .await;
    assert!(orphan.is_err(), "steps belong to a response: {orphan:?}");

    // The last boundary: a step and the response's ending together.
    let last = finished(&batch[0], "{\"sum\":4}");
    let mut ended = record("resp_steps");
    ended.end(
        Ending::Completed { handed_back: false },
        Usage::default(),
        1_700_000_300,
    );
    store
        .write_steps(&StepWrite {
            response_id: "resp_steps",
            added: &[],
            changed: &[&last],
            ended: Some(&ended),
            at: 1_700_000_300,
            durability: Durability::Flush,
            owner: OWNER,
            epoch: 0,
            notify: false,
            usage: &[],
        })
        .await
        .expect("finish");
    let response = store
        .load_response(&project_id, "resp_steps")
        .await
        .expect("load")
        .expect("exists");
    assert_eq!(response.record.status(), ResponseStatus::Completed);
    assert_eq!(response.record, ended);
    assert_eq!(
        store
            .load_steps(&project_id, "resp_steps")
            .await
            .expect("load")[3],
        last
    );
}

/// Inserts a deployment of `kind` past the store's typed input, as only a faulty writer could.
async fn insert_deployment_of_kind(store: &Store, kind: &str) -> Result<(), sqlx::Error> {
    let query =
        "INSERT INTO deployments (id, name, provider_kind, base_url, upstream_model, created_at)
                 VALUES ('dep_bad', 'bad', $1, 'http://127.0.0.1:9', 'm', 0)";
    match store.backend() {
        Backend::Postgres(pool) => sqlx::query(query).bind(kind).execute(pool).await.map(drop),
        Backend::Sqlite(pool) => sqlx::query(query).bind(kind).execute(pool).await.map(drop),
    }
}

/// How many step rows and context item rows the tables hold for `response_id`, whatever its response row: what
/// a deletion that left children behind would show (reads join the response row, so they would not).
async fn a_changed_step_whose_earlier_write_was_lost_is_written_again_whole(store: Store) {
    let (project_id, deployment_id) = tenant(&store, "acme").await;
    let running_model = with_state(&model_step(0), StepState::Running);
    create(
        &store,
        &project_id,
        &deployment_id,
        &record("resp_lost"),
        &context(1),
        &[],
        None,
    )
    .await
    .expect("create");
    write_steps(
        &store,
        "resp_lost",
        std::slice::from_ref(&running_model),
        &[],
        Durability::Relaxed,
    )
    .await
    .expect("the model step, relaxed");
    // A crash of the database server takes that relaxed commit back; the run, answered, counts it as stored.
    let lost = "DELETE FROM steps WHERE response_id = $1";
    match store.backend() {
        Backend::Postgres(pool) => sqlx::query(lost)
            .bind("resp_lost")
            .execute(pool)
            .await
            .map(drop),
        Backend::Sqlite(pool) => sqlx::query(lost)
            .bind("resp_lost")
            .execute(pool)
            .await
            .map(drop),
    }
    .expect("lose the write");

    // The model answers: its step changes, and the batch it asked for is added.
    let model_done = model_step(0);
    let batch = [tool_step(1, 0)];
    write_steps(
        &store,
        "resp_lost",
        &batch,
        &[&model_done],
        Durability::Flush,
    )
    .await
    .expect("end the model step and add the batch");
    let loaded = store
        .load_steps(&project_id, "resp_lost")
        .await
        .expect("load");
    assert_eq!(
        loaded,
        [model_done, batch[0].clone()],
        "no gap where the lost write was"
    );
}

async fn rows_left_of(store: &Store, response_id: &str) -> (i64, i64) {
    let query = "SELECT (SELECT COUNT(*) FROM steps WHERE response_id = $1),
                        (SELECT COUNT(*) FROM response_input_items WHERE response_id = $1)";
    match store.backend() {
        Backend::Postgres(pool) => {
            sqlx::query_as(query)
                .bind(response_id)
                .fetch_one(pool)
                .await
        }
        Backend::Sqlite(pool) => {
            sqlx::query_as(query)
                .bind(response_id)
                .fetch_one(pool)
                .await
        }
    }
    .expect("rows left")
}

/// `(seq, attempts)` of every step of a response.
async fn attempts(store: &Store, response_id: &str) -> Vec<(i32, i32)> {
    let query = "SELECT seq, attempts FROM steps WHERE response_id = $1 ORDER BY seq";
    match store.backend() {
        Backend::Postgres(pool) => {
            sqlx::query_as(query)
                .bind(response_id)
                .fetch_all(pool)
                .await
        }
        Backend::Sqlite(pool) => {
            sqlx::query_as(query)
                .bind(response_id)
                .fetch_all(pool)
                .await
        }
    }
    .expect("attempts")
}

async fn every_ending_round_trips_through_the_response_row(store: Store) {
    let (project_id, deployment_id) = tenant(&store, "acme").await;
    let usage = Usage {
        input_tokens: 7,
        output_tokens: 3,
        cached_tokens: 1,
        reasoning_tokens: 0,
    };
    let endings = [
        Ending::Completed { handed_back: true },
        Ending::Completed { handed_back: false },
        Ending::Incomplete {
            reason: IncompleteReason::MaxToolCalls,
        },
        Ending::Incomplete {
            reason: IncompleteReason::ClientDisconnected,
        },
        Ending::server_error("The upstream failed."),
        Ending::Cancelled,
    ];
    for (n, ending) in endings.into_iter().enumerate() {
        let id = format!("resp_{n}");
        create(
            &store,
            &project_id,
            &deployment_id,
            &record(&id),
            &context(1),
            &[],
            None,
        )
        .await
        .expect("create");
        let mut ended = record(&id);
        ended.end(ending.clone(), usage, 1_700_000_100 + n as i64);
        store
            .write_steps(&StepWrite {
                response_id: &id,
                added: &[],
                changed: &[],
                ended: Some(&ended),
                at: 1_700_000_100,
                durability: Durability::Flush,
                owner: OWNER,
                epoch: 0,
                notify: false,
                usage: &[],
            })
            .await
            .expect("finish");

        let done = store
            .load_response(&project_id, &id)
            .await
            .expect("load")
            .expect("exists");
        assert_eq!(done.record.ending(), Some(&ending));
        assert_eq!(done.record, ended, "{ending:?}");
        assert_eq!(done.record.params, params(), "params are untouched");
    }
}

async fn deleting_a_response_removes_its_items_and_steps(store: Store) {
    let (project_id, deployment_id) = tenant(&store, "acme").await;
    for id in ["resp_gone", "resp_kept"] {
        create(
            &store,
            &project_id,
            &deployment_id,
            &record(id),
            &context(2),
            &[tool_step(0, 0)],
            None,
        )
        .await
        .expect("create");
    }

    assert!(store
        .delete_response(&project_id, "resp_gone")
        .await
        .expect("delete"));
    assert!(!store
        .delete_response(&project_id, "resp_gone")
        .await
        .expect("delete again"));

    assert!(store
        .load_response(&project_id, "resp_gone")
        .await
        .expect("load")
        .is_none());
    assert!(store
        .load_context(&project_id, "resp_gone")
        .await
        .expect("context")
        .is_empty());
    assert!(store
        .load_steps(&project_id, "resp_gone")
        .await
        .expect("steps")
        .is_empty());
    assert_eq!(rows_left_of(&store, "resp_gone").await, (0, 0));
    assert_eq!(rows_left_of(&store, "resp_kept").await, (1, 2));
    assert_eq!(
        store
            .load_context(&project_id, "resp_kept")
            .await
            .expect("context")
            .len(),
        2
    );
    assert_eq!(
        store
            .load_steps(&project_id, "resp_kept")
            .await
            .expect("steps")
            .len(),
        1
    );
}

async fn an_idempotency_key_finds_its_response_and_cannot_be_used_twice_in_a_project(store: Store) {
    let (project_id, deployment_id) = tenant(&store, "acme").await;
    let (other_project, _) = tenant(&store, "other").await;
    create(
        &store,
        &project_id,
        &deployment_id,
        &record("resp_first"),
        &context(1),
        &[],
        Some("key-1"),
    )
    .await
    .expect("create");
    for id in ["resp_plain_1", "resp_plain_2"] {
        create(
            &store,
            &project_id,
            &deployment_id,
            &record(id),
            &context(1),
            &[],
            None,
        )
        .await
        .expect("responses without a key never clash");
    }

    assert_eq!(
        store
            .response_for_idempotency_key(&project_id, "key-1")
            .await
            .expect("lookup"),
        Some(("resp_first".to_owned(), Some("key-1".to_owned())))
    );
    assert_eq!(
        store
            .response_for_idempotency_key(&project_id, "key-2")
            .await
            .expect("lookup"),
        None
    );
    assert_eq!(
        store
            .response_for_idempotency_key(&other_project, "key-1")
            .await
            .expect("lookup"),
        None
    );

    let again = create(
        &store,
        &project_id,
        &deployment_id,
        &record("resp_second"),
        &context(1),
        &[tool_step(0, 0)],
        Some("key-1"),
    )
    .await;
    assert!(matches!(again, Err(StoreError::Conflict(_))), "{again:?}");
    assert!(
        store
            .load_response(&project_id, "resp_second")
            .await
            .expect("load")
            .is_none(),
        "the failed create left nothing behind"
    );
    assert!(store
        .load_context(&project_id, "resp_second")
        .await
        .expect("context")
        .is_empty());
    create(
        &store,
        &other_project,
        &deployment_id,
        &record("resp_elsewhere"),
        &context(1),
        &[],
        Some("key-1"),
    )
    .await
    .expect("the same key in another project is another request");
}

/// A response whose context has more items than one statement may bind (SQLite takes at most 32,766 values;
/// an item binds four) is stored whole and in order, beside another response in the same batch.
async fn a_context_longer_than_one_statement_binds_is_stored_whole_and_in_order(store: Store) {
    let (project_id, deployment_id) = tenant(&store, "acme").await;
    let long = context(9_000);
    let short = context(2);
    let (long_record, short_record) = (record("resp_long"), record("resp_short"));
    let steps = [tool_step(0, 0)];
    let (first, second) = tokio::join!(
        create(
            &store,
            &project_id,
            &deployment_id,
            &long_record,
            &long,
            &steps,
            None
        ),
        create(
            &store,
            &project_id,
            &deployment_id,
            &short_record,
            &short,
            &steps,
            None
        )
    );
    first.expect("the long create");
    second.expect("the short create");
    let stored = store
        .load_context(&project_id, "resp_long")
        .await
        .expect("load");
    assert_eq!(stored.len(), 9_000);
    assert_eq!(stored, long);
    assert_eq!(
        store
            .load_context(&project_id, "resp_short")
            .await
            .expect("load")
            .len(),
        2
    );
}

/// A transaction that reads before it writes (a replica's heartbeat reads its previous beat) succeeds while
/// many other writes commit around it. On the embedded store, writers on several connections failed such a
/// transaction with "database is locked" whenever another connection committed between its read and its write.
async fn transactions_that_read_before_they_write_succeed_beside_many_writes(store: Store) {
    let (project_id, deployment_id) = tenant(&store, "acme").await;
    let mut beats = Vec::new();
    let mut creates = Vec::new();
    for n in 0..48 {
        let store_for_beat = store.clone();
        beats.push(tokio::spawn(async move {
            store_for_beat
                .heartbeat(&format!("replica-{}", n % 6), 60_000)
                .await
        }));
        let (store, project_id, deployment_id) =
            (store.clone(), project_id.clone(), deployment_id.clone());
        creates.push(tokio::spawn(async move {
            let record = record(&format!("resp_among_beats_{n}"));
            create(
                &store,
                &project_id,
                &deployment_id,
                &record,
                &context(2),
                &[tool_step(0, 0)],
                None,
            )
            .await
        }));
    }
    for beat in beats {
        beat.await.expect("task").expect("a heartbeat failed");
    }
    for create in creates {
        create.await.expect("task").expect("a create failed");
    }
}

async fn concurrent_writes_of_steps_and_responses_all_succeed(store: Store) {
    let (project_id, deployment_id) = tenant(&store, "acme").await;
    let batch: Vec<Step> = (1..=12).map(|seq| tool_step(seq, 0)).collect();
    create(
        &store,
        &project_id,
        &deployment_id,
        &record("resp_busy"),
        &context(4),
        &batch,
        None,
    )
    .await
    .expect("create");

    // As a parallel batch does: every call marked running, then each finished on its own, all at once,
    // while other responses are created beside them.
    let mut tasks = Vec::new();
    for step in batch.clone() {
        let (store, project_id) = (store.clone(), project_id.clone());
        tasks.push(tokio::spawn(async move {
            let running = with_state(&step, StepState::Running);
            write_steps(&store, "resp_busy", &[], &[&running], Durability::Flush).await?;
            let done = finished(&step, "{\"ok\":true}");
            write_steps(&store, "resp_busy", &[], &[&done], Durability::Relaxed).await?;
            store.load_steps(&project_id, "resp_busy").await.map(drop)
        }));
    }
    for n in 0..8 {
        let (store, project_id, deployment_id) =
            (store.clone(), project_id.clone(), deployment_id.clone());
        tasks.push(tokio::spawn(async move {
            let record = record(&format!("resp_beside_{n}"));
            create(
                &store,
                &project_id,
                &deployment_id,
                &record,
                &context(3),
                &[tool_step(0, 0)],
                None,
            )
            .await
        }));
    }
    for task in tasks {
        task.await
            .expect("task")
            .expect("a concurrent write failed");
    }

    let steps = store
        .load_steps(&project_id, "resp_busy")
        .await
        .expect("load");
    assert!(
        steps.iter().all(|s| s.state == StepState::Succeeded),
        "{steps:?}"
    );
    for n in 0..8 {
        assert_eq!(
            store
                .load_context(&project_id, &format!("resp_beside_{n}"))
                .await
                .expect("context")
                .len(),
            3
        );
    }
}

async fn a_create_made_again_after_its_reply_was_lost_is_the_same_write(store: Store) {
    let (project_id, deployment_id) = tenant(&store, "acme").await;
    let first = [with_state(&model_step(0), StepState::Running)];
    create(
        &store,
        &project_id,
        &deployment_id,
        &record("resp_again"),
        &context(2),
        &first,
        Some("k-1"),
    )
    .await
    .expect("create");
    // The same write again, as a run retries it when the reply of the first was lost; meanwhile its model call
    // ended, so the step it carries has moved on.
    let moved_on = [model_step(0)];
    create(
        &store,
        &project_id,
        &deployment_id,
        &record("resp_again"),
        &context(2),
        &moved_on,
        Some("k-1"),
    )
    .await
    .expect("a repeated create is no conflict");
    assert_eq!(
        store
            .load_steps(&project_id, "resp_again")
            .await
            .expect("steps"),
        moved_on
    );
    assert_eq!(
        store
            .load_context(&project_id, "resp_again")
            .await
            .expect("context")
            .len(),
        2
    );
    // Another response under the same Idempotency-Key is still refused.
    let other = create(
        &store,
        &project_id,
        &deployment_id,
        &record("resp_other"),
        &context(1),
        &[],
        Some("k-1"),
    )
    .await;
    assert!(matches!(other, Err(StoreError::Conflict(_))), "{other:?}");
}

/// One boundary of response `id` written by `owner` under claim `epoch`: a model step added.
async fn write_as(
    store: &Store,
    id: &str,
    owner: &str,
    epoch: i64,
    seq: u32,
) -> Result<(), StoreError> {
    store
        .write_steps(&StepWrite {
            response_id: id,
            added: &[model_step(seq)],
            changed: &[],
            ended: None,
            at: 1_700_000_060,
            durability: Durability::Flush,
            owner,
            epoch,
            notify: false,
            usage: &[],
        })
        .await
        .map(drop)
}

async fn a_run_fenced_on_an_older_claim_writes_nothing_even_when_its_replica_claims_the_response_again(
    store: Store,
) {
    let (project_id, deployment_id) = tenant(&store, "acme").await;
    // Created and driven by OWNER under the first epoch (0); OWNER never beats, so its lease is over at once.
    create(
        &store,
        &project_id,
        &deployment_id,
        &record("resp_fenced"),
        &context(1),
        &[],
        None,
    )
    .await
    .expect("create");
    write_as(&store, "resp_fenced", OWNER, 0, 0)
        .await
        .expect("the owner writes");

    // Another replica takes it over, then hands it back; the first replica claims it again.
    store.heartbeat("replica-b", 60_000).await.expect("beat");
    let taken = store.claim("replica-b", 60_000, 10).await.expect("claim");
    assert_eq!(taken.len(), 1);
    assert!(taken[0].taken_over);
    assert_eq!(taken[0].epoch, 1, "a claim raises the epoch");
    store
        .release_one("resp_fenced", "replica-b", 0)
        .await
        .expect("release");
    assert_eq!(
        store
            .claims_of(&["resp_fenced".to_owned()])
            .await
            .expect("claims")[0]
            .owner
            .as_deref(),
        Some("replica-b"),
        "a release under another epoch leaves the claim alone"
    );
    store
        .release_one("resp_fenced", "replica-b", 1)
        .await
        .expect("release");
    store.heartbeat(OWNER, 60_000).await.expect("beat");
    let back = store.claim(OWNER, 60_000, 10).await.expect("claim");
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].epoch, 2);

    // The run of the first claim is stale: same replica, older epoch. It writes nothing.
    let stale = write_as(&store, "resp_fenced", OWNER, 0, 1).await;
    assert!(matches!(stale, Err(StoreError::NotOwner)), "{stale:?}");
    let started = store.start_queued("resp_fenced", OWNER, 0, 1_000).await;
    assert!(matches!(started, Err(StoreError::NotOwner)), "{started:?}");
    assert_eq!(
        store
            .load_steps(&project_id, "resp_fenced")
            .await
            .expect("steps")
            .len(),
        1
    );
    // The run of the new claim writes.
    write_as(&store, "resp_fenced", OWNER, 2, 1)
        .await
        .expect("the current claim writes");
    assert_eq!(
        store
            .load_steps(&project_id, "resp_fenced")
            .await
            .expect("steps")
            .len(),
        2
    );
    let claims = store
        .claims_of(&["resp_fenced".to_owned(), "resp_none".to_owned()])
        .await
        .expect("claims");
    assert_eq!(claims.len(), 1);
    assert_eq!(
        (claims[0].owner.as_deref(), claims[0].epoch),
        (Some(OWNER), 2)
    );
}

async fn a_heartbeat_says_whether_the_lease_held_since_the_previous_one(store: Store) {
    let first = store.heartbeat("replica-a", 60_000).await.expect("beat");
    assert!(
        !first.lease_kept,
        "a first beat proves nothing about before"
    );
    let second = store.heartbeat("replica-a", 60_000).await.expect("beat");
    assert!(second.lease_kept, "beats well within the lease keep it");
    // Beats further apart than the lease (here: any two beats, with a lease of nothing) lose it.
    let lapsed = store.heartbeat("replica-a", 0).await.expect("beat");
    assert!(!lapsed.lease_kept);
}

async fn the_deadline_is_set_and_read_by_the_database_clock(store: Store) {
    let (project_id, deployment_id) = tenant(&store, "acme").await;
    create(
        &store,
        &project_id,
        &deployment_id,
        &record("resp_deadline"),
        &context(1),
        &[],
        None,
    )
    .await
    .expect("create");
    let run = store
        .load_run(&project_id, "resp_deadline")
        .await
        .expect("load")
        .expect("there");
    let left = run.deadline_in_ms.expect("a deadline");
    // Created with 60 s to go, read back moments later by the same clock: whatever this machine's clock says.
    assert!((50_000..=60_000).contains(&left), "{left}");
}

// ---- the embedded store only ----

/// Counts group commit's batches and their sizes.
#[derive(Debug, Default)]
struct BatchSizes(std::sync::Mutex<Vec<usize>>);

impl gateway::store::StoreObserver for BatchSizes {
    fn statement(&self, _name: &'static str, _elapsed: std::time::Duration) {}

    fn batch(&self, writes: usize) {
        self.0.lock().expect("sizes").push(writes);
    }
}

/// Holds the write lock of `store`'s responses (Postgres: the table; the embedded store: the file) until the
/// returned connection commits.
async fn hold_the_write_lock(store: &Store) -> HeldLock {
    match store.backend() {
        Backend::Postgres(pool) => {
            let mut conn = pool.acquire().await.expect("connection");
            sqlx::query("BEGIN")
                .execute(&mut *conn)
                .await
                .expect("begin");
            sqlx::query("LOCK TABLE responses IN EXCLUSIVE MODE")
                .execute(&mut *conn)
                .await
                .expect("lock");
            HeldLock::Postgres(conn)
        }
        Backend::Sqlite(pool) => {
            let mut conn = pool.acquire().await.expect("connection");
            sqlx::query("BEGIN IMMEDIATE")
                .execute(&mut *conn)
                .await
                .expect("begin immediate");
            HeldLock::Sqlite(conn)
        }
    }
}

enum HeldLock {
    Postgres(sqlx::pool::PoolConnection<sqlx::Postgres>),
    Sqlite(sqlx::pool::PoolConnection<sqlx::Sqlite>),
}

impl HeldLock {
    async fn release(self) {
        match self {
            HeldLock::Postgres(mut conn) => {
                sqlx::query("COMMIT")
                    .execute(&mut *conn)
                    .await
                    .expect("commit");
            }
            HeldLock::Sqlite(mut conn) => {
                sqlx::query("COMMIT")
                    .execute(&mut *conn)
                    .await
                    .expect("commit");
            }
        }
    }
}

/// Group commit writes what waits together, and yet each write keeps its own fate: a create that clashes on its
/// Idempotency-Key fails alone, a boundary fenced on an old claim writes nothing, and the others land whole.
async fn writes_that_share_a_batch_are_answered_each_its_own_way(store: Store) {
    let sizes = std::sync::Arc::new(BatchSizes::default());
    let store = store.observed_by(sizes.clone()).with_group_commit(1);
    let (project_id, deployment_id) = tenant(&store, "acme").await;
    let deployment_id = deployment_id.as_str();
    let project_id = project_id.as_str();
    for id in ["resp_running", "resp_taken"] {
        create(
            &store,
            project_id,
            deployment_id,
            &record(id),
            &context(1),
            &[],
            None,
        )
        .await
        .expect("create");
    }
    create(
        &store,
        project_id,
        deployment_id,
        &record("resp_keyed"),
        &context(1),
        &[],
        Some("key-1"),
    )
    .await
    .expect("create");
    // Another replica claimed resp_taken (epoch 1): OWNER's writes under epoch 0 are fenced off.
    let claimed = match store.backend() {
        Backend::Postgres(pool) => sqlx::query(
            "UPDATE responses SET owner = 'replica-b', claim_epoch = 1 WHERE id = 'resp_taken'",
        )
        .execute(pool)
        .await
        .map(|r| r.rows_affected()),
        Backend::Sqlite(pool) => sqlx::query(
            "UPDATE responses SET owner = 'replica-b', claim_epoch = 1 WHERE id = 'resp_taken'",
        )
        .execute(pool)
        .await
        .map(|r| r.rows_affected()),
    };
    assert_eq!(claimed.expect("claim"), 1);
    sizes.0.lock().expect("sizes").clear();

    // The writer's first batch waits behind the lock; everything queued meanwhile is written together after it.
    let lock = hold_the_write_lock(&store).await;
    let one = record("resp_one");
    let two = record("resp_two");
    let clash = record("resp_clash");
    let (two_items, one_item, first_step) = (context(2), context(1), [model_step(0)]);
    let creates_one = create(
        &store,
        project_id,
        deployment_id,
        &one,
        &two_items,
        &first_step,
        None,
    );
    let creates_two = create(
        &store,
        project_id,
        deployment_id,
        &two,
        &one_item,
        &[],
        None,
    );
    let clashes = create(
        &store,
        project_id,
        deployment_id,
        &clash,
        &one_item,
        &[],
        Some("key-1"),
    );
    let writes_running = write_as(&store, "resp_running", OWNER, 0, 0);
    let writes_fenced = write_as(&store, "resp_taken", OWNER, 0, 0);
    tokio::pin!(
        creates_one,
        creates_two,
        clashes,
        writes_running,
        writes_fenced
    );
    // One poll each queues the write (and nothing can be written while the lock is held).
    assert!(futures::poll!(&mut creates_one).is_pending());
    assert!(futures::poll!(&mut creates_two).is_pending());
    assert!(futures::poll!(&mut clashes).is_pending());
    assert!(futures::poll!(&mut writes_running).is_pending());
    assert!(futures::poll!(&mut writes_fenced).is_pending());
    lock.release().await;
    let (one_written, two_written, clashed, running_written, fenced) = tokio::join!(
        creates_one,
        creates_two,
        clashes,
        writes_running,
        writes_fenced
    );

    let batches = sizes.0.lock().expect("sizes").clone();
    assert!(
        batches.iter().sum::<usize>() >= 5,
        "every write went through a batch: {batches:?}"
    );
    assert!(
        batches.iter().any(|&size| size >= 2),
        "writes queued behind the lock share a batch: {batches:?}"
    );
    one_written.expect("a create that shares a batch with a clash is written");
    two_written.expect("so is the other");
    assert!(
        matches!(clashed, Err(StoreError::Conflict(_))),
        "the clashing create fails alone: {clashed:?}"
    );
    running_written.expect("the owner's boundary is written");
    assert!(
        matches!(fenced, Err(StoreError::NotOwner)),
        "the boundary fenced on an old claim is refused: {fenced:?}"
    );

    let steps = |id: &'static str| {
        let store = store.clone();
        let project_id = project_id.to_owned();
        async move {
            store
                .load_steps(&project_id, id)
                .await
                .expect("steps")
                .len()
        }
    };
    assert_eq!(
        steps("resp_one").await,
        1,
        "the create's first step is there"
    );
    assert_eq!(steps("resp_running").await, 1, "the owner's step is there");
    assert_eq!(
        steps("resp_taken").await,
        0,
        "nothing of the fenced write is there"
    );
    assert!(store
        .load_response(project_id, "resp_clash")
        .await
        .expect("load")
        .is_none());
    assert_eq!(
        store
            .response_for_idempotency_key(project_id, "key-1")
            .await
            .expect("lookup"),
        Some(("resp_keyed".to_owned(), Some("key-1".to_owned())))
    );
}

/// The run that lost a response and the run that took it back on the same replica may both have a write queued at
/// once: group commit never puts them in one batch, so each meets its own fence. Without that, the stale write
/// would pass on the other's claim.
async fn a_run_that_lost_its_response_writes_nothing_even_queued_beside_the_run_that_took_it_back(
    store: Store,
) {
    let sizes = std::sync::Arc::new(BatchSizes::default());
    let store = store.observed_by(sizes.clone()).with_group_commit(1);
    let (project_id, deployment_id) = tenant(&store, "acme").await;
    let first = model_step(0);
    create(
        &store,
        &project_id,
        &deployment_id,
        &record("resp_back"),
        &context(1),
        std::slice::from_ref(&first),
        None,
    )
    .await
    .expect("create");
    create(
        &store,
        &project_id,
        &deployment_id,
        &record("resp_other"),
        &context(1),
        &[],
        None,
    )
    .await
    .expect("create");
    // OWNER lost resp_back (epoch 0) and claimed it again (epoch 1).
    let sql = "UPDATE responses SET claim_epoch = 1 WHERE id = 'resp_back'";
    let reclaimed = match store.backend() {
        Backend::Postgres(pool) => sqlx::query(sql)
            .execute(pool)
            .await
            .map(|r| r.rows_affected()),
        Backend::Sqlite(pool) => sqlx::query(sql)
            .execute(pool)
            .await
            .map(|r| r.rows_affected()),
    };
    assert_eq!(reclaimed.expect("reclaim"), 1);
    sizes.0.lock().expect("sizes").clear();

    // A first batch is taken and waits behind the lock; the two runs' writes queue behind it, together.
    let lock = hold_the_write_lock(&store).await;
    let blocker = write_as(&store, "resp_other", OWNER, 0, 0);
    tokio::pin!(blocker);
    assert!(futures::poll!(&mut blocker).is_pending());
    while sizes.0.lock().expect("sizes").is_empty() {
        tokio::task::yield_now().await;
    }
    // The stale run changes a stored step; the current one ends the response (updates both, which a shared batch
    // would let through on the other's claim).
    let failed = with_state(&first, StepState::Failed);
    let changed = [&failed];
    let stale_write = StepWrite {
        response_id: "resp_back",
        added: &[],
        changed: &changed,
        ended: None,
        at: 1_700_000_070,
        durability: Durability::Flush,
        owner: OWNER,
        epoch: 0,
        notify: false,
        usage: &[],
    };
    let stale = store.write_steps(&stale_write);
    let ended = ResponseRecord {
        state: ResponseState::Ended {
            ending: Ending::Completed { handed_back: false },
            completed_at: 1_700_000_080,
        },
        ..record("resp_back")
    };
    let current_write = StepWrite {
        response_id: "resp_back",
        added: &[],
        changed: &[],
        ended: Some(&ended),
        at: 1_700_000_080,
        durability: Durability::Flush,
        owner: OWNER,
        epoch: 1,
        notify: false,
        usage: &[],
    };
    let current = store.write_steps(&current_write);
    tokio::pin!(stale, current);
    assert!(futures::poll!(&mut stale).is_pending());
    assert!(futures::poll!(&mut current).is_pending());
    lock.release().await;
    let (blocked, stale, current) = tokio::join!(blocker, stale, current);

    blocked.expect("the first batch is written once the lock goes");
    assert!(
        matches!(stale, Err(StoreError::NotOwner)),
        "the run that lost the response is refused: {stale:?}"
    );
    current.expect("the run that took it back writes");
    let status = store
        .load_response(&project_id, "resp_back")
        .await
        .expect("load")
        .expect("there")
        .record
        .status();
    assert_eq!(
        status,
        ResponseStatus::Completed,
        "the current run ended it"
    );
    let steps: Vec<(u32, StepState)> = store
        .load_steps(&project_id, "resp_back")
        .await
        .expect("steps")
        .iter()
        .map(|step| (step.seq, step.state))
        .collect();
    assert_eq!(
        steps,
        vec![(0, StepState::Succeeded)],
        "the stale run changed nothing"
    );
}

#[tokio::test]
async fn an_in_memory_embedded_store_is_one_database_for_the_whole_pool() {
    let store = Store::connect("sqlite::memory:", 8).await.expect("connect");
    assert!(matches!(store.backend(), Backend::Sqlite(_)));
    store.migrate().await.expect("migrate");
    let (project_id, deployment_id) = tenant(&store, "acme").await;
    let mut tasks = Vec::new();
    for n in 0..6 {
        let (store, project_id, deployment_id) =
            (store.clone(), project_id.clone(), deployment_id.clone());
        tasks.push(tokio::spawn(async move {
            create(
                &store,
                &project_id,
                &deployment_id,
                &record(&format!("resp_{n}")),
                &context(2),
                &[],
                None,
            )
            .await
        }));
    }
    for task in tasks {
        task.await.expect("task").expect("create");
    }
    for n in 0..6 {
        assert!(store
            .load_response(&project_id, &format!("resp_{n}"))
            .await
            .expect("load")
            .is_some());
    }
}

/// On the embedded store, a write that finds the one writer held past the acquire timeout fails as busy (the
/// gateway answers `503 server_overloaded`), reads go on meanwhile on their own connections, and the writer
/// takes writes again once it is free.
#[tokio::test]
async fn on_the_embedded_store_a_write_kept_waiting_for_the_writer_is_busy_while_reads_answer() {
    let db = ScratchDatabase::sqlite();
    let store = Store::connect_waiting(db.url(), 4, std::time::Duration::from_millis(200))
        .await
        .expect("connect store");
    store.migrate().await.expect("migrate");
    let (project_id, _) = tenant(&store, "acme").await;
    let Backend::Sqlite(writer) = store.backend() else {
        panic!("the embedded store")
    };
    let held = writer.acquire().await.expect("the writer's connection");

    let refused = store
        .heartbeat("replica-a", 60_000)
        .await
        .expect_err("no writer within the timeout");
    assert!(matches!(refused, StoreError::Busy), "{refused:?}");
    assert!(refused.is_transient());
    assert!(store
        .load_response(&project_id, "resp_missing")
        .await
        .expect("a read while the writer is held")
        .is_none());

    drop(held);
    store
        .heartbeat("replica-a", 60_000)
        .await
        .expect("a write once the writer is free");
}

#[tokio::test]
async fn the_embedded_store_creates_its_directory_and_keeps_its_data_across_restarts() {
    let root =
        std::env::temp_dir().join(format!("gw_store_test_{}", uuid::Uuid::new_v4().simple()));
    let url = format!("sqlite:{}", root.join("nested/dir/gateway.db").display());
    let first = Store::connect(&url, 2).await.expect("connect");
    first.migrate().await.expect("migrate");
    first
        .create_project(&name("kept"), &Governance::default())
        .await
        .expect("project");
    if let Backend::Sqlite(pool) = first.backend() {
        pool.close().await;
    }

    let second = Store::connect(&url, 2).await.expect("reconnect");
    second.migrate().await.expect("migrating again is a no-op");
    let names: Vec<String> = second
        .list_projects()
        .await
        .expect("list")
        .into_iter()
        .map(|p| p.name)
        .collect();
    let _ = std::fs::remove_dir_all(&root);
    assert_eq!(names, ["kept"]);
}

#[tokio::test]
async fn a_url_of_another_database_is_refused_without_repeating_it() {
    let error = Store::connect("mysql://user:hunter2@127.0.0.1/db", 1)
        .await
        .expect_err("mysql is not supported");
    assert!(matches!(error, StoreError::UnsupportedUrl), "{error:?}");
    assert!(!error.to_string().contains("hunter2"), "{error}");
}

#[tokio::test]
async fn postgres_urls_select_postgres() {
    let scratch = Scratch::postgres().await;
    assert!(matches!(scratch.store.backend(), Backend::Postgres(_)));
}

#[tokio::test]
async fn deleting_a_project_while_a_step_write_holds_one_of_its_responses_waits_for_it_without_deadlock(
) {
    let scratch = Scratch::postgres().await;
    let store = &scratch.store;
    let (project_id, deployment_id) = tenant(store, "acme").await;
    create(
        store,
        &project_id,
        &deployment_id,
        &record("resp_busy"),
        &context(1),
        &[tool_step(0, 0)],
        None,
    )
    .await
    .expect("create");
    let Backend::Postgres(pool) = store.backend() else {
        unreachable!("Postgres")
    };
    // A step write in flight: it holds the response's row, as a boundary write does, and its step is still to
    // be written.
    let mut writer = pool.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM responses WHERE id = 'resp_busy' FOR UPDATE")
        .execute(&mut *writer)
        .await
        .expect("hold the response");
    let deletion = tokio::spawn({
        let (store, project_id) = (store.clone(), project_id.clone());
        async move { store.delete_project(&project_id).await }
    });
    // Until the deletion waits on a lock (a deletion that ended without waiting fails below).
    until_a_statement_waits_on_a_lock(pool, || deletion.is_finished()).await;
    // The write goes on to its step: had the deletion taken the step rows first, the two would wait on each
    // other, and Postgres would fail one of them.
    sqlx::query("UPDATE steps SET state = 'running' WHERE response_id = 'resp_busy' AND seq = 0")
        .execute(&mut *writer)
        .await
        .expect("the step is written");
    writer.commit().await.expect("commit");

    assert!(deletion.await.expect("task").expect("deleted"));
    assert_eq!(rows_left_of(store, "resp_busy").await, (0, 0));
}

#[tokio::test]
async fn a_relaxed_write_leaves_the_connections_commit_setting_as_it_was() {
    let scratch = Scratch::postgres().await;
    // One connection: the write and the check below share it.
    let single = Store::connect(scratch.db.url(), 1).await.expect("connect");
    let (project_id, deployment_id) = tenant(&single, "acme").await;
    create(
        &single,
        &project_id,
        &deployment_id,
        &record("resp_relaxed"),
        &context(1),
        &[],
        None,
    )
    .await
    .expect("create");
    write_steps(
        &single,
        "resp_relaxed",
        &[model_step(0)],
        &[],
        Durability::Relaxed,
    )
    .await
    .expect("relaxed write");
    let Backend::Postgres(pool) = single.backend() else {
        unreachable!("Postgres")
    };
    let setting: String = sqlx::query_scalar("SHOW synchronous_commit")
        .fetch_one(pool)
        .await
        .expect("show");
    assert_eq!(
        setting, "on",
        "the relaxed commit was local to its own write"
    );
    assert_eq!(
        single
            .load_steps(&project_id, "resp_relaxed")
            .await
            .expect("load")
            .len(),
        1
    );
}

async fn additions_to_counted_windows_in_one_statement_answer_each_its_windows_total(store: Store) {
    const MINUTE: i64 = 1_800_000_000;
    assert_eq!(store.add_to_window("key:tpm", MINUTE, 5).await.unwrap(), 5);
    // Out of order, one window twice, one new, one of the next minute: each answer is its window's total after
    // the whole statement, and the same window named twice got both amounts.
    let totals = store
        .add_to_windows(&untokened(&[
            ("project:tpm", MINUTE, 7),
            ("key:tpm", MINUTE, 10),
            ("key:spend", MINUTE, 0),
            ("key:tpm", MINUTE, 1),
            ("key:tpm", MINUTE + 60, 3),
        ]))
        .await
        .unwrap();
    assert_eq!(totals, vec![7, 16, 0, 16, 3]);
    // Written: read back one at a time, adding nothing.
    for (scope, start, total) in [
        ("project:tpm", MINUTE, 7),
        ("key:tpm", MINUTE, 16),
        ("key:spend", MINUTE, 0),
        ("key:tpm", MINUTE + 60, 3),
    ] {
        assert_eq!(
            store.add_to_window(scope, start, 0).await.unwrap(),
            total,
            "{scope} {start}"
        );
    }
    assert_eq!(store.add_to_windows(&[]).await.unwrap(), Vec::<u64>::new());
}

/// `(scope, window start, amount)`s as additions without tokens, each counted however often it is sent.
fn untokened<'a>(
    additions: &[(&'a str, i64, u64)],
) -> Vec<gateway::store::governance::WindowAddition<'a>> {
    additions
        .iter()
        .map(
            |&(scope, window_start, amount)| gateway::store::governance::WindowAddition {
                token: None,
                scope,
                window_start,
                amount,
            },
        )
        .collect()
}

async fn an_amount_beyond_what_a_window_holds_fills_it_and_fails_no_other_window_of_its_batch(
    store: Store,
) {
    const MINUTE: i64 = 1_800_000_000;
    const FULL: u64 = i64::MAX as u64;
    // An upstream that reported absurd usage: more than the column holds, at once and added up.
    assert_eq!(
        store
            .add_to_window("key:tpm", MINUTE, u64::MAX)
            .await
            .unwrap(),
        FULL
    );
    let totals = store
        .add_to_windows(&untokened(&[
            ("key:tpm", MINUTE, 5),
            ("project:tpm", MINUTE, u64::MAX),
            ("project:tpm", MINUTE, u64::MAX),
            ("key:spend", MINUTE, 7),
        ]))
        .await
        .expect("the batch is written whole");
    assert_eq!(totals, vec![FULL, FULL, FULL, 7]);
    assert_eq!(
        store.add_to_window("key:spend", MINUTE, 0).await.unwrap(),
        7
    );
}

/// Polls until a statement of `pool`'s database waits on a row lock (or `done` says the statement ended without
/// waiting, which the caller's checks then catch).
async fn until_a_statement_waits_on_a_lock(pool: &sqlx::PgPool, done: impl Fn() -> bool) {
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(pool)
        .await
        .expect("activity");
        if waiting > 0 || done() {
            return;
        }
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn giving_back_or_rewriting_a_place_locks_the_count_before_the_replicas_part_as_taking_one_does(
) {
    let scratch = Scratch::postgres().await;
    let store = &scratch.store;
    let Backend::Postgres(pool) = store.backend() else {
        unreachable!("Postgres")
    };
    assert!(store
        .acquire_running("key:k:running", "replica_a", 10)
        .await
        .unwrap());
    // Taking a place locks the count's row, then the replica's part. Another transaction holds the part: a
    // give-back (or a rewrite of the part) must then wait holding the count, never holding nothing yet, or a take
    // holding the count and waiting for the part would deadlock with it.
    for rewrite in [false, true] {
        let mut holder = pool.begin().await.expect("begin");
        sqlx::query(
            "SELECT 1 FROM running_counts WHERE scope = 'key:k:running' AND replica_id = 'replica_a' FOR UPDATE",
        )
        .execute(&mut *holder)
        .await
        .expect("hold the replica's part");
        let writer = tokio::spawn({
            let store = store.clone();
            async move {
                if rewrite {
                    store
                        .set_running_part("key:k:running", "replica_a", 1)
                        .await
                } else {
                    store.release_running("key:k:running", "replica_a").await
                }
            }
        });
        until_a_statement_waits_on_a_lock(pool, || writer.is_finished()).await;
        let count_free = sqlx::query(
            "SELECT 1 FROM rate_windows WHERE scope = 'key:k:running' AND window_start = 0 FOR UPDATE NOWAIT",
        )
        .execute(&mut *holder)
        .await;
        let error = count_free.expect_err("the waiting write holds the count's row");
        assert!(
            error.to_string().contains("could not obtain lock"),
            "rewrite {rewrite}: {error}"
        );
        holder.rollback().await.expect("rollback");
        writer
            .await
            .expect("task")
            .expect("written once the part is free");
    }
    // Given back (one place to none), then rewritten as one: the count and the part agree.
    let count: i64 = sqlx::query_scalar(
        "SELECT used FROM rate_windows WHERE scope = 'key:k:running' AND window_start = 0",
    )
    .fetch_one(pool)
    .await
    .expect("count");
    let part: i64 = sqlx::query_scalar(
        "SELECT running FROM running_counts WHERE scope = 'key:k:running' AND replica_id = 'replica_a'",
    )
    .fetch_one(pool)
    .await
    .expect("part");
    assert_eq!((count, part), (1, 1));
}

// ---- group commit when no connection is free ----

/// A batch that fails as a whole for a passing reason (here no connection became free in time) is answered as
/// one: every write of it gets the failure at once. Written again one at a time, each write would wait for a
/// connection in turn, a batch of many taking many times the pool's wait.
mod a_batch_that_finds_no_connection_in_time_answers_every_write_busy_at_once {
    use gateway_e2e::ScratchDatabase;

    #[tokio::test]
    async fn on_postgres() {
        let db = ScratchDatabase::postgres().await.expect("test database");
        super::batch_without_a_connection(&db).await;
    }

    #[tokio::test]
    async fn on_sqlite() {
        super::batch_without_a_connection(&ScratchDatabase::sqlite()).await;
    }
}

async fn batch_without_a_connection(db: &ScratchDatabase) {
    use futures::StreamExt;
    let wait = std::time::Duration::from_millis(250);
    let store = Store::connect_waiting(db.url(), 2, wait)
        .await
        .expect("connect store");
    store.migrate().await.expect("migrate");
    let (project_id, deployment_id) = tenant(&store, "acme").await;
    let store = store.with_group_commit(1);

    // Every connection that writes is taken (Postgres: the pool's two; the embedded store: its one writer).
    let held = match store.backend() {
        Backend::Postgres(pool) => {
            let first = pool.acquire().await.expect("a connection");
            let second = pool.acquire().await.expect("another");
            (Some((first, second)), None)
        }
        Backend::Sqlite(pool) => (None, Some(pool.acquire().await.expect("the writer"))),
    };
    let records: Vec<ResponseRecord> = (0..8).map(|n| record(&format!("resp_{n}"))).collect();
    let items = context(1);
    // Polled together once, all eight are queued before the writer takes any: they make one batch.
    let mut answers: futures::stream::FuturesUnordered<_> = records
        .iter()
        .map(|record| {
            create(
                &store,
                &project_id,
                &deployment_id,
                record,
                &items,
                &[],
                None,
            )
        })
        .collect();
    let first = answers.next().await.expect("an answer");
    // The connections are free from the first answer on: a write of the batch that waited for one in turn
    // would now be written.
    drop(held);
    let mut written = vec![first];
    while let Some(answer) = answers.next().await {
        written.push(answer);
    }
    assert_eq!(written.len(), 8);
    for answer in &written {
        assert!(
            matches!(answer, Err(StoreError::Busy)),
            "every write of the batch is answered with its failure: {answer:?}"
        );
    }
}

#[tokio::test]
async fn a_session_left_idle_in_a_transaction_is_ended_by_the_database_and_its_row_locks_given_back(
) {
    let db = ScratchDatabase::postgres().await.expect("test database");
    let session = gateway::store::SessionLimits {
        idle_in_transaction_ms: 200,
        keepalive_secs: 7,
    };
    let store = Store::connect_limited(db.url(), 2, std::time::Duration::from_secs(5), session)
        .await
        .expect("connect store");
    let Backend::Postgres(pool) = store.backend() else {
        unreachable!("Postgres")
    };

    // Every session of the store was told its limits when it started.
    let told: (String, String, String, String, String) = sqlx::query_as(
        "SELECT current_setting('idle_in_transaction_session_timeout'), current_setting('tcp_keepalives_idle'),
                current_setting('tcp_keepalives_interval'), current_setting('tcp_keepalives_count'),
                current_setting('tcp_user_timeout')",
    )
    .fetch_one(pool)
    .await
    .expect("settings");
    assert_eq!(
        told,
        (
            "200ms".to_owned(),
            "7".to_owned(),
            "2".to_owned(),
            "3".to_owned(),
            "14000".to_owned()
        )
    );

    // A replica stopped (paused, cut off) between two statements of a transaction that locked a row.
    sqlx::query("CREATE TABLE held (id int PRIMARY KEY)")
        .execute(pool)
        .await
        .expect("table");
    sqlx::query("INSERT INTO held VALUES (1)")
        .execute(pool)
        .await
        .expect("row");
    let mut stopped = pool.begin().await.expect("begin");
    sqlx::query("SELECT id FROM held WHERE id = 1 FOR UPDATE")
        .execute(&mut *stopped)
        .await
        .expect("lock");

    // Another replica's statement that needs the row waits until the database ends the idle session, not for
    // ever (the guard only keeps a broken build from hanging the suite).
    let other = sqlx::PgPool::connect(db.url()).await.expect("connect");
    let mut waiting = other.begin().await.expect("begin");
    tokio::time::timeout(
        std::time::Duration::from_secs(60),
        sqlx::query("SELECT id FROM held WHERE id = 1 FOR UPDATE").execute(&mut *waiting),
    )
    .await
    .expect("the idle transaction still holds its lock")
    .expect("locked by the other replica");
    waiting.rollback().await.expect("rollback");
    assert!(
        sqlx::query("SELECT 1")
            .execute(&mut *stopped)
            .await
            .is_err(),
        "the idle session was not ended"
    );
}

async fn counted_windows_that_ended_long_ago_are_pruned_and_the_others_kept(store: Store) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64;
    let minute = now - now % 60;
    let day = now - now % 86_400;
    let windows: [(&str, i64, bool); 10] = [
        ("key:k:rpm", minute - 2 * 3600, false),
        ("key:k:rpm", minute, true),
        ("project:p:tpm", minute - 2 * 3600, false),
        ("project:p:tpm", minute - 60, true),
        ("key:k:spend:day", day - 3 * 86_400, false),
        ("key:k:spend:day", day - 86_400, true),
        ("key:k:spend:month", day - 70 * 86_400, false),
        ("key:k:spend:month", day - 20 * 86_400, true),
        ("key:k:spend:total", 0, true),
        ("key:k:running", 0, true),
    ];
    let added: Vec<(&str, i64, u64)> = windows
        .iter()
        .map(|&(scope, start, _)| (scope, start, 5))
        .collect();
    store
        .add_to_windows(&untokened(&added))
        .await
        .expect("counted");

    assert_eq!(store.prune_windows().await.expect("pruned"), 4);
    assert_eq!(store.prune_windows().await.expect("pruned again"), 0);

    // What a window holds now: a pruned one starts again from nothing.
    let read: Vec<(&str, i64, u64)> = windows
        .iter()
        .map(|&(scope, start, _)| (scope, start, 0))
        .collect();
    let held = store.add_to_windows(&untokened(&read)).await.expect("read");
    for ((scope, start, kept), held) in windows.iter().zip(held) {
        assert_eq!(held, if *kept { 5 } else { 0 }, "{scope} at {start}");
    }
}

async fn usage_sums_beyond_what_a_bigint_holds_read_as_the_largest_one(store: Store) {
    use gateway::store::governance::{UsageQuery, UsageRecord};
    let record = |id: &str, input_tokens| UsageRecord {
        response_id: id.to_owned(),
        seq: 0,
        project_id: "proj_absurd".to_owned(),
        api_key_id: None,
        deployment: "mock".to_owned(),
        provider_kind: "openai".to_owned(),
        tool_source: None,
        input_tokens,
        cached_tokens: 0,
        output_tokens: 1,
        reasoning_tokens: 0,
        cost_usd: 0.0,
        created_at: 1_000,
        calls: 1,
    };
    // Two model calls whose upstream reported absurd usage: their sum is past what a `BIGINT` holds.
    store
        .record_usage(&[
            record("resp_absurd_1", i64::MAX),
            record("resp_absurd_2", i64::MAX),
        ])
        .await
        .expect("recorded");
    let buckets = store
        .usage_report(&UsageQuery {
            start: 0,
            end: 2_000,
            project_id: Some("proj_absurd".to_owned()),
            api_key_id: None,
            deployment: None,
            group_by: Vec::new(),
            offset: 0,
            limit: 10,
        })
        .await
        .expect("the sums read back");
    assert_eq!(buckets.len(), 1);
    assert_eq!(buckets[0].input_tokens, i64::MAX);
    assert_eq!(buckets[0].output_tokens, 2);
    assert_eq!(buckets[0].model_calls, 2);
}

#[tokio::test]
async fn a_create_is_answered_written_though_the_boundaries_of_its_batch_failed() {
    let db = ScratchDatabase::postgres().await.expect("test database");
    let sizes = std::sync::Arc::new(BatchSizes::default());
    let store = Store::connect(db.url(), 5)
        .await
        .expect("connect store")
        .observed_by(sizes.clone())
        .with_group_commit(1);
    store.migrate().await.expect("migrate");
    let Backend::Postgres(pool) = store.backend().clone() else {
        unreachable!("Postgres")
    };
    let (project_id, deployment_id) = tenant(&store, "acme").await;
    let (project_id, deployment_id) = (project_id.as_str(), deployment_id.as_str());
    create(
        &store,
        project_id,
        deployment_id,
        &record("resp_boundary"),
        &context(1),
        &[],
        None,
    )
    .await
    .expect("create");
    // The boundary statement fails for a passing reason, as one may under contention.
    for statement in [
        "CREATE FUNCTION refuse_boundary() RETURNS trigger AS $$ BEGIN
             IF NEW.response_id = 'resp_boundary' THEN
                 RAISE EXCEPTION 'could not serialize' USING ERRCODE = '40001';
             END IF;
             RETURN NEW;
         END $$ LANGUAGE plpgsql",
        "CREATE TRIGGER refuse_boundary BEFORE INSERT OR UPDATE ON steps
             FOR EACH ROW EXECUTE FUNCTION refuse_boundary()",
    ] {
        sqlx::query(statement)
            .execute(&pool)
            .await
            .expect("trigger");
    }
    sizes.0.lock().expect("sizes").clear();

    // A create and that boundary, queued before the writer runs: one batch, whose creates commit in their own
    // statement before the boundaries' statement fails.
    let new = record("resp_new");
    let item = context(1);
    let creates = create(&store, project_id, deployment_id, &new, &item, &[], None);
    let first_step = [model_step(0)];
    let fails = write_steps(&store, "resp_boundary", &first_step, &[], Durability::Flush);
    tokio::pin!(creates, fails);
    assert!(futures::poll!(&mut creates).is_pending());
    assert!(futures::poll!(&mut fails).is_pending());
    let (created, failed) = tokio::join!(creates, fails);

    assert_eq!(sizes.0.lock().expect("sizes").clone(), [2], "one batch");
    assert!(failed.is_err(), "the boundary was refused: {failed:?}");
    // Told it failed, its client would be told that nothing was stored, and send it again.
    created.expect("the create committed, and is answered so");
    assert!(store
        .load_response(project_id, "resp_new")
        .await
        .expect("read")
        .is_some());
}

/// Registers endpoint `id` of `project_id` for `response.completed`, at an address nothing answers.
async fn webhook_endpoint(store: &Store, project_id: &str, id: &str) {
    let endpoint = gateway::store::webhooks::WebhookEndpoint {
        id: id.into(),
        project_id: project_id.into(),
        url: "http://127.0.0.1:9/hook".into(),
        events: json!(["response.completed"]),
        secret: "whsec_test".into(),
        created_at: 1,
    };
    store
        .create_webhook_endpoint(&endpoint)
        .await
        .expect("endpoint");
}

async fn a_webhook_try_that_outlived_its_lock_records_nothing_over_the_try_after_it(store: Store) {
    use gateway::store::webhooks::TryOutcome;
    let (project_id, deployment_id) = tenant(&store, "hooks").await;
    // Events are queued only for a response that is there.
    create(
        &store,
        &project_id,
        &deployment_id,
        &record("resp_hooked"),
        &context(1),
        &[],
        None,
    )
    .await
    .expect("create");
    webhook_endpoint(&store, &project_id, "whep_fenced").await;
    let queued = store
        .enqueue_webhook_event(
            &project_id,
            "resp_hooked",
            "evt_fenced",
            "response.completed",
            &json!({"id": "resp_hooked"}),
            1,
        )
        .await
        .expect("queued");
    assert_eq!(queued, 1);

    // The first replica's lock lapses at once (a replica paused past it); the second takes the delivery again.
    let first = store.take_due_deliveries(16, -1_000).await.expect("taken");
    let second = store.take_due_deliveries(16, 60_000).await.expect("taken");
    assert_eq!((first.len(), second.len()), (1, 1));
    let (first, second) = (&first[0], &second[0]);
    assert_eq!(first.id, second.id);
    assert_ne!(first.locked_until, second.locked_until);

    // The late try of the first records nothing, before the second's try ends and after.
    let failed = TryOutcome::Failed {
        status: Some(500),
        error: "the endpoint failed".into(),
        retry_in_ms: 1_000,
        give_up: true,
    };
    assert!(!store
        .record_delivery_try(first, &failed)
        .await
        .expect("recorded"));
    assert!(store
        .record_delivery_try(second, &TryOutcome::Delivered { status: 200 })
        .await
        .expect("recorded"));
    assert!(!store
        .record_delivery_try(first, &failed)
        .await
        .expect("recorded"));
    let rows = store
        .webhook_deliveries(&project_id, "whep_fenced", 10)
        .await
        .expect("listed");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].status, "delivered", "{:?}", rows[0]);
    assert_eq!(rows[0].last_status, Some(200), "{:?}", rows[0]);
    assert_eq!(rows[0].attempts, 2);
    // Nothing is left to take: the delivered one is not sent a third time.
    assert!(store
        .take_due_deliveries(16, 60_000)
        .await
        .expect("taken")
        .is_empty());
}

async fn a_deleted_responses_queued_event_is_sent_only_when_its_ending_was_written(store: Store) {
    let (project_id, deployment_id) = tenant(&store, "hooks").await;
    webhook_endpoint(&store, &project_id, "whep_deleted").await;
    // Two responses whose endings were queued: one's ending was written, the other's replica died before it was.
    for id in ["resp_ended", "resp_cut"] {
        create(
            &store,
            &project_id,
            &deployment_id,
            &record(id),
            &context(1),
            &[],
            None,
        )
        .await
        .expect("create");
        let queued = store
            .enqueue_webhook_event(
                &project_id,
                id,
                &format!("evt_{id}"),
                "response.completed",
                &json!({"id": id}),
                1,
            )
            .await
            .expect("queued");
        assert_eq!(queued, 1);
    }
    let mut ended = record("resp_ended");
    ended.end(
        Ending::Completed { handed_back: false },
        Usage::default(),
        1_700_000_300,
    );
    store
        .write_steps(&StepWrite {
            response_id: "resp_ended",
            added: &[],
            changed: &[],
            ended: Some(&ended),
            at: 1_700_000_300,
            durability: Durability::Flush,
            owner: OWNER,
            epoch: 0,
            notify: false,
            usage: &[],
        })
        .await
        .expect("end");

    for id in ["resp_ended", "resp_cut"] {
        assert!(store
            .delete_response(&project_id, id)
            .await
            .expect("delete"));
    }

    // The ending that happened is still told; the one that never did is not.
    let due = store.take_due_deliveries(16, 60_000).await.expect("taken");
    let due: Vec<&str> = due.iter().map(|d| d.response_id.as_str()).collect();
    assert_eq!(due, ["resp_ended"]);
    let listed = store
        .webhook_deliveries(&project_id, "whep_deleted", 10)
        .await
        .expect("listed");
    let status_of = |id: &str| {
        listed
            .iter()
            .find(|d| d.response_id == id)
            .map(|d| d.status.clone())
            .expect("listed")
    };
    assert_eq!(status_of("resp_cut"), "superseded");
    assert_eq!(status_of("resp_ended"), "pending");
    // A run that learns of the delete too late, and ends its response all the same, queues nothing for it.
    store
        .enqueue_webhook_event(
            &project_id,
            "resp_cut",
            "evt_resp_cut_cancelled",
            "response.completed",
            &json!({"id": "resp_cut"}),
            2,
        )
        .await
        .expect("queue");
    let listed = store
        .webhook_deliveries(&project_id, "whep_deleted", 10)
        .await
        .expect("listed");
    assert_eq!(
        listed.len(),
        2,
        "nothing queued for a deleted response: {listed:?}"
    );
}

/// Errors of Postgres that say the moment is bad, not the data: a statement cancelled by an operator's
/// `statement_timeout`, a lock not had within `lock_timeout`. A response whose read back met one is tried again
/// later rather than ended as unreadable.
#[tokio::test]
async fn a_statement_cancelled_by_its_timeout_or_a_lock_not_had_in_time_is_a_passing_failure() {
    let db = ScratchDatabase::postgres().await.expect("database");
    let pool = sqlx::PgPool::connect(db.url()).await.expect("connect");
    sqlx::query("CREATE TABLE held (id int)")
        .execute(&pool)
        .await
        .expect("create");
    let mut held = pool.begin().await.expect("begin");
    sqlx::query("LOCK TABLE held IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *held)
        .await
        .expect("lock");
    let mut other = pool.acquire().await.expect("a second connection");

    sqlx::query("SET statement_timeout = 1")
        .execute(&mut *other)
        .await
        .expect("set");
    let cancelled = sqlx::query("SELECT pg_sleep(1)")
        .execute(&mut *other)
        .await
        .expect_err("cancelled");
    for set in ["SET statement_timeout = 0", "SET lock_timeout = 1"] {
        sqlx::query(set).execute(&mut *other).await.expect("set");
    }
    let not_locked = sqlx::query("SELECT * FROM held")
        .execute(&mut *other)
        .await
        .expect_err("not locked in time");

    for (what, error) in [("cancelled", cancelled), ("lock timeout", not_locked)] {
        let error = StoreError::from(error);
        assert!(error.is_transient(), "{what}: {error:?}");
    }
    drop(held);
}

/// A create whose reply was lost is made again; meanwhile the response was taken over (its replica's lease ran out):
/// the repeat writes nothing over the other replica's row, and says the response is no longer its own.
async fn a_create_made_again_after_its_row_was_taken_over_writes_nothing_and_says_so(store: Store) {
    let (project_id, deployment_id) = tenant(&store, "acme").await;
    let first = model_step(0);
    create(
        &store,
        &project_id,
        &deployment_id,
        &record("resp_taken"),
        &context(1),
        std::slice::from_ref(&first),
        None,
    )
    .await
    .expect("the first write");
    // The owner never beat: another replica takes the response.
    let claimed = store.claim("replica-b", 1_000, 10).await.expect("claim");
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].epoch, 1);

    let mut ended = record("resp_taken");
    ended.state = ResponseState::Ended {
        ending: Ending::Completed { handed_back: false },
        completed_at: 1_700_000_009,
    };
    let repeated = create(
        &store,
        &project_id,
        &deployment_id,
        &ended,
        &context(1),
        &[with_state(&first, StepState::Failed)],
        None,
    )
    .await;
    assert!(
        matches!(repeated, Err(StoreError::NotOwner)),
        "{repeated:?}"
    );
    let loaded = store
        .load_response(&project_id, "resp_taken")
        .await
        .expect("load")
        .expect("the response");
    assert_eq!(
        loaded.record.status(),
        ResponseStatus::InProgress,
        "not ended"
    );
    let steps = store
        .load_steps(&project_id, "resp_taken")
        .await
        .expect("steps");
    assert_eq!(steps, [first], "its step as the first write left it");
}
