//! Start-up seeding from the config: idempotent across restarts, and changes are applied.

use gateway::config::{
    Config, SeedApiKey, SeedDeployment, SeedGovernedKey, SeedGroup, SeedProject, SeedToolSource,
};
use gateway::store::Store;
use gateway::Application;
use gateway_core::governance::{Budget, BudgetPeriod, Governance, Pricing, RateLimits};
use gateway_e2e::{scratch_database, ScratchDatabase};
use serde_json::{json, Value};

const KEY: &str = "sk-seeded-key-0000000000000000";

fn seeded_config(base_url: &str) -> Config {
    let mut config = Config::default();
    config.server.bind = "127.0.0.1:0".parse().unwrap();
    let mut project = SeedProject::default();
    project.api_keys.insert("ci".into(), KEY.to_owned().into());
    config.seed.projects.insert("acme".into(), project);
    config.seed.deployments.insert(
        "mock".into(),
        SeedDeployment {
            kind: "openai_chat".into(),
            base_url: base_url.into(),
            model: "m".into(),
            api_key: None,
            fallbacks: Vec::new(),
            max_tokens: None,
            pricing: None,
            unsupported_tools: None,
            unsupported_params: None,
        },
    );
    config.seed.tool_sources.insert(
        "add".into(),
        SeedToolSource {
            kind: None,
            allowed_tools: None,
            name_prefix: None,
            description: "Add.".into(),
            parameters: json!({"type": "object", "properties": {"a": {"type": "number"}}}),
            url: "http://127.0.0.1:9/tools/add".into(),
            timeout_ms: Some(1000),
            secret: None,
            strict: false,
        },
    );
    config.seed.deployment_groups.insert(
        "default".into(),
        SeedGroup {
            deployments: vec!["mock".into()],
            projects: vec!["acme".into()],
            tool_sources: vec!["add".into()],
        },
    );
    config
}

/// Starts a gateway on `db` with `config` (its seed applied at start-up) and returns its store.
async fn start(db: &ScratchDatabase, mut config: Config) -> Store {
    config.server.bind = "127.0.0.1:0".parse().unwrap();
    config.database.url = Some(db.url().to_owned().into());
    config.database.max_connections = 2;
    let app = Application::build(config)
        .await
        .expect("start-up with the seed");
    app.store().clone()
}

#[tokio::test]
async fn seeding_twice_duplicates_nothing_and_applies_changes() {
    let db = scratch_database().await;
    start(&db, seeded_config("http://127.0.0.1:1/v1")).await;
    let store = start(&db, seeded_config("http://127.0.0.1:2/v1")).await;

    assert_eq!(store.list_projects().await.unwrap().len(), 1);
    assert_eq!(store.list_tool_sources().await.unwrap().len(), 1);
    let groups = store.list_groups().await.unwrap();
    assert_eq!(groups.len(), 1);
    assert_eq!(
        (
            groups[0].deployment_ids.len(),
            groups[0].project_ids.len(),
            groups[0].tool_source_ids.len()
        ),
        (1, 1, 1)
    );
    let deployments = store.list_deployments().await.unwrap();
    assert_eq!(deployments.len(), 1);
    assert_eq!(
        deployments[0].base_url, "http://127.0.0.1:2/v1",
        "the second start-up's change is applied"
    );
    let project = store
        .project_for_key(KEY)
        .await
        .unwrap()
        .expect("the seeded key works");
    let keys = store.list_api_keys(&project).await.unwrap().unwrap();
    assert_eq!(keys.len(), 1);
    let resolution = store
        .resolve(&project, "mock")
        .await
        .unwrap()
        .expect("the seeded deployment resolves");
    assert_eq!(
        resolution
            .tools
            .iter()
            .map(|t| t.name.as_str())
            .collect::<Vec<_>>(),
        vec!["add"]
    );
}

#[tokio::test]
async fn a_revoked_seeded_key_stays_revoked_after_a_restart() {
    let db = scratch_database().await;
    let store = start(&db, seeded_config("http://127.0.0.1:1/v1")).await;
    let project = store.project_for_key(KEY).await.unwrap().unwrap();
    let key_id = store.list_api_keys(&project).await.unwrap().unwrap()[0]
        .id
        .clone();
    store.revoke_api_key(&key_id).await.unwrap();

    let store = start(&db, seeded_config("http://127.0.0.1:1/v1")).await;

    assert_eq!(store.project_for_key(KEY).await.unwrap(), None);
}

#[tokio::test]
async fn a_seed_naming_a_missing_member_stops_start_up_with_a_message_naming_it() {
    let db = scratch_database().await;
    let mut config = seeded_config("http://127.0.0.1:1/v1");
    config
        .seed
        .deployment_groups
        .get_mut("default")
        .unwrap()
        .tool_sources
        .push("nope".into());

    let error = start_up_error(&db, config).await;

    assert!(error.contains("nope"), "{error}");
}

/// Why a gateway on `db` with `config` does not start.
async fn start_up_error(db: &ScratchDatabase, mut config: Config) -> String {
    config.server.bind = "127.0.0.1:0".parse().unwrap();
    config.database.url = Some(db.url().to_owned().into());
    Application::build(config)
        .await
        .err()
        .expect("start-up fails")
        .to_string()
}

/// `seeded_config` with the project's `limits` and `budget`, its key `ci` given as a table with `key_limits` and
/// `expires_at`, and the deployment's `pricing`; `None` leaves each out.
fn governed_config(
    project_limits: Option<Value>,
    key_limits: Option<Value>,
    expires_at: Option<i64>,
    pricing: Option<Value>,
) -> Config {
    let mut config = seeded_config("http://127.0.0.1:1/v1");
    let project = config.seed.projects.get_mut("acme").unwrap();
    project.limits = project_limits;
    project.budget = Some(json!({"usd": 100, "period": "month"}));
    project.api_keys.insert(
        "ci".into(),
        SeedApiKey::Governed(SeedGovernedKey {
            key: KEY.to_owned().into(),
            limits: key_limits,
            budget: Some(json!({"usd": 1.5, "period": "day"})),
            expires_at,
        }),
    );
    config.seed.deployments.get_mut("mock").unwrap().pricing = pricing;
    config
}

/// What the seeded key and its project are held to, as the gateway admits the key, and the deployment's prices.
async fn seeded_governance(
    store: &Store,
) -> (Option<i64>, Governance, Governance, Option<Pricing>) {
    let grant = store
        .grant_for_key(KEY)
        .await
        .unwrap()
        .expect("the seeded key is live");
    let deployments = store.list_deployments().await.unwrap();
    (
        grant.expires_at,
        grant.key,
        grant.project,
        deployments[0].pricing(),
    )
}

fn limits(rpm: Option<u64>, tpm: Option<u64>, max_concurrent: Option<u64>) -> RateLimits {
    RateLimits {
        rpm,
        tpm,
        max_concurrent,
    }
}

#[tokio::test]
async fn seeded_limits_budgets_expiry_and_prices_are_applied_changed_on_restart_and_kept_when_left_out(
) {
    let db = scratch_database().await;
    let store = start(
        &db,
        governed_config(
            Some(json!({"rpm": 600, "tpm": 100000})),
            Some(json!({"rpm": 60})),
            Some(4_102_444_800),
            Some(json!({"input_per_mtok": 2.5, "cached_input_per_mtok": 1.25, "output_per_mtok": 10})),
        ),
    )
    .await;
    let (expires_at, key, project, pricing) = seeded_governance(&store).await;
    assert_eq!(expires_at, Some(4_102_444_800));
    assert_eq!(key.limits, limits(Some(60), None, None));
    assert_eq!(
        key.budget,
        Some(Budget {
            usd: 1.5,
            period: BudgetPeriod::Day
        })
    );
    assert_eq!(project.limits, limits(Some(600), Some(100_000), None));
    assert_eq!(
        project.budget,
        Some(Budget {
            usd: 100.0,
            period: BudgetPeriod::Month
        })
    );
    assert_eq!(
        pricing,
        Some(Pricing {
            input_per_mtok: 2.5,
            cached_input_per_mtok: Some(1.25),
            output_per_mtok: 10.0
        })
    );

    // Changed values are applied; a table given replaces what is stored whole (the project's tpm is gone).
    let store = start(
        &db,
        governed_config(
            Some(json!({"rpm": 300})),
            Some(json!({"tpm": 5000, "max_concurrent": 1})),
            Some(4_000_000_000),
            Some(json!({"input_per_mtok": 3, "output_per_mtok": 12})),
        ),
    )
    .await;
    let (expires_at, key, project, pricing) = seeded_governance(&store).await;
    assert_eq!(expires_at, Some(4_000_000_000));
    assert_eq!(key.limits, limits(None, Some(5000), Some(1)));
    assert_eq!(project.limits, limits(Some(300), None, None));
    assert_eq!(
        pricing,
        Some(Pricing {
            input_per_mtok: 3.0,
            cached_input_per_mtok: None,
            output_per_mtok: 12.0
        })
    );
    assert_eq!(
        store
            .list_api_keys(&project_id(&store).await)
            .await
            .unwrap()
            .unwrap()
            .len(),
        1
    );

    // Left out, they are kept: what the admin API set survives a restart with the plain seed.
    let store = start(&db, seeded_config("http://127.0.0.1:1/v1")).await;
    assert_eq!(
        seeded_governance(&store).await,
        (Some(4_000_000_000), key, project, pricing)
    );
}

async fn project_id(store: &Store) -> String {
    store.list_projects().await.unwrap()[0].id.clone()
}

#[tokio::test]
async fn an_invalid_seeded_limit_budget_expiry_or_price_stops_start_up_naming_the_field() {
    let mut key_budget = governed_config(None, None, None, None);
    let table = SeedGovernedKey {
        key: KEY.to_owned().into(),
        limits: None,
        budget: Some(json!({"usd": 1, "period": "week"})),
        expires_at: None,
    };
    let project = key_budget.seed.projects.get_mut("acme").unwrap();
    project
        .api_keys
        .insert("ci".into(), SeedApiKey::Governed(table));
    let project_limit = governed_config(Some(json!({"rpm": -1})), None, None, None);
    let key_limit = governed_config(None, Some(json!({"rpms": 5})), None, None);
    let expiry = governed_config(None, None, Some(-1), None);
    let price = governed_config(
        None,
        None,
        None,
        Some(json!({"input_per_mtok": -2, "output_per_mtok": 1})),
    );
    for (config, field) in [
        (project_limit, "limits.rpm"),
        (key_limit, "limits.rpms"),
        (key_budget, "budget.period"),
        (expiry, "expires_at"),
        (price, "pricing.input_per_mtok"),
    ] {
        let error = start_up_error(&scratch_database().await, config).await;
        assert!(error.contains(field), "{field}: {error}");
    }
}

#[tokio::test]
async fn a_deployments_seeded_policies_are_applied_and_a_bad_one_stops_start_up_naming_it() {
    let db = scratch_database().await;
    let mut config = seeded_config("http://127.0.0.1:1/v1");
    let mock = config.seed.deployments.get_mut("mock").unwrap();
    mock.unsupported_params = Some("reject".into());
    mock.unsupported_tools = Some("reject".into());
    let store = start(&db, config).await;
    let deployments = store.list_deployments().await.expect("deployments");
    assert_eq!(deployments[0].unsupported_params, "reject");
    assert_eq!(deployments[0].unsupported_tools, "reject");

    // Left out on the next start-up, the stored policies are kept.
    let store = start(&db, seeded_config("http://127.0.0.1:1/v1")).await;
    let deployments = store.list_deployments().await.expect("deployments");
    assert_eq!(deployments[0].unsupported_params, "reject");

    let mut bad = seeded_config("http://127.0.0.1:1/v1");
    bad.seed
        .deployments
        .get_mut("mock")
        .unwrap()
        .unsupported_params = Some("drop".into());
    let error = start_up_error(&scratch_database().await, bad).await;
    assert!(error.contains("unsupported_params"), "{error}");
}
