//! Start-up seeding from the config: idempotent across restarts, and changes are applied.

use gateway::config::{Config, SeedDeployment, SeedGroup, SeedProject, SeedToolSource};
use gateway::store::Store;
use gateway::Application;
use gateway_e2e::ScratchDatabase;
use serde_json::json;

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
    let db = ScratchDatabase::postgres().await.unwrap();
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
    let db = ScratchDatabase::postgres().await.unwrap();
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
    let db = ScratchDatabase::postgres().await.unwrap();
    let mut config = seeded_config("http://127.0.0.1:1/v1");
    config
        .seed
        .deployment_groups
        .get_mut("default")
        .unwrap()
        .tool_sources
        .push("nope".into());
    config.server.bind = "127.0.0.1:0".parse().unwrap();
    config.database.url = Some(db.url().to_owned().into());

    let error = Application::build(config)
        .await
        .err()
        .expect("start-up fails")
        .to_string();

    assert!(error.contains("nope"), "{error}");
}
