//! Configuration loading: defaults, the file, strictness about unknown keys, seeds.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::{Path, PathBuf};

use gateway::config::SeedApiKey;
use gateway::Config;
use secrecy::ExposeSecret;

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

/// Loads `toml` from a file of its own in the temp dir.
fn load(name: &str, toml: &str) -> Result<Config, String> {
    let path =
        std::env::temp_dir().join(format!("gateway-config-{}-{name}.toml", std::process::id()));
    std::fs::File::create(&path)
        .unwrap()
        .write_all(toml.as_bytes())
        .unwrap();
    let result = Config::load(&path).map_err(|e| e.to_string());
    let _ = std::fs::remove_file(&path);
    result
}

#[test]
fn the_default_file_loads() {
    let config =
        Config::load(&repo_file("config/default.toml")).expect("config/default.toml loads");
    assert_eq!(config.limits.max_model_calls, 16);
    assert!(config.seed.projects.is_empty());
}

#[test]
fn the_compose_file_loads_with_its_seed() {
    let config =
        Config::load(&repo_file("config/compose.toml")).expect("config/compose.toml loads");
    assert_eq!(config.seed.deployments["default"].kind, "openai_chat");
    let SeedApiKey::Governed(limited) = &config.seed.projects["demo"].api_keys["limited"] else {
        panic!("the limited key is a table");
    };
    assert_eq!(
        limited.limits,
        Some(serde_json::json!({"rpm": 60, "tpm": 100000, "max_concurrent": 4}))
    );
    assert_eq!(
        config.seed.deployment_groups["default"].tool_sources,
        vec!["get_weather", "add"]
    );
}

#[test]
fn an_unknown_key_is_rejected_with_a_message_naming_it() {
    let error = load(
        "typo",
        "[server]\nbind = \"127.0.0.1:0\"\nbody_limit_byts = 10\n",
    )
    .unwrap_err();
    assert!(error.contains("body_limit_byts"), "{error}");
    let error = load("section", "[telemetry]\nfoo = 1\n").unwrap_err();
    assert!(error.contains("telemetry"), "{error}");
}

#[test]
fn seeds_are_read_by_name_and_secrets_stay_typed() {
    let config = load(
        "seed",
        r#"
[seed.projects.acme.api_keys]
ci = "sk-acme-ci-000000000000000000"

[seed.deployments.gpt]
kind = "openai_chat"
base_url = "https://upstream.invalid/v1"
model = "gpt-x"
api_key = "upstream-secret"
"#,
    )
    .unwrap();
    let key = &config.seed.projects["acme"].api_keys["ci"];
    assert_eq!(key.key().expose_secret(), "sk-acme-ci-000000000000000000");
    let printed = format!("{config:?}");
    assert!(
        !printed.contains("upstream-secret"),
        "a secret was printed: {printed}"
    );
    assert!(
        !printed.contains("sk-acme-ci"),
        "a key was printed: {printed}"
    );
}

#[test]
fn a_seeded_key_may_be_a_table_with_its_expiry_limits_and_budget() {
    let config = load(
        "governed",
        r#"
[seed.projects.acme]
limits = { rpm = 600 }
budget = { usd = 100, period = "month" }

[seed.projects.acme.api_keys]
ci = "sk-acme-ci-000000000000000000"
batch = { key = "sk-acme-batch-00000000000000", limits = { rpm = 60, max_concurrent = 2 }, budget = { usd = 5.5, period = "day" }, expires_at = 1893456000 }

[seed.deployments.gpt]
kind = "openai_chat"
base_url = "https://upstream.invalid/v1"
model = "gpt-x"
pricing = { input_per_mtok = 2.5, cached_input_per_mtok = 1.25, output_per_mtok = 10 }
"#,
    )
    .unwrap();
    let acme = &config.seed.projects["acme"];
    assert_eq!(acme.limits, Some(serde_json::json!({"rpm": 600})));
    assert_eq!(
        acme.budget,
        Some(serde_json::json!({"usd": 100, "period": "month"}))
    );
    let SeedApiKey::Governed(batch) = &acme.api_keys["batch"] else {
        panic!("a table is a governed key");
    };
    assert_eq!(batch.key.expose_secret(), "sk-acme-batch-00000000000000");
    assert_eq!(
        batch.limits,
        Some(serde_json::json!({"rpm": 60, "max_concurrent": 2}))
    );
    assert_eq!(batch.expires_at, Some(1_893_456_000));
    assert!(matches!(acme.api_keys["ci"], SeedApiKey::Key(_)));
    assert_eq!(
        config.seed.deployments["gpt"].pricing,
        Some(
            serde_json::json!({"input_per_mtok": 2.5, "cached_input_per_mtok": 1.25, "output_per_mtok": 10})
        )
    );
    assert!(
        !format!("{config:?}").contains("sk-acme-batch"),
        "a key was printed"
    );

    let error = load(
        "governed_typo",
        r#"
[seed.projects.acme.api_keys]
ci = { key = "sk-acme-ci-000000000000000000", limts = { rpm = 1 } }
"#,
    )
    .unwrap_err();
    assert!(error.contains("seed.projects.acme.api_keys.ci"), "{error}");
}

#[test]
fn a_zero_ceiling_is_rejected_with_a_message_naming_it() {
    let error = load("zero", "[limits]\nmax_failing_batches = 0\n").unwrap_err();
    assert!(error.contains("limits.max_failing_batches"), "{error}");
}

#[test]
fn admission_limits_must_be_usable() {
    let error = load("no_room", "[server]\nmax_active_responses = 0\n").unwrap_err();
    assert!(error.contains("server.max_active_responses"), "{error}");
    let error = load(
        "too_much_room",
        "[server]\nmax_active_responses = 9223372036854775807\n",
    )
    .unwrap_err();
    assert!(
        error.contains("server.max_active_responses must be at most"),
        "{error}"
    );
    let error = load("no_wait", "[database]\nacquire_timeout_ms = 0\n").unwrap_err();
    assert!(error.contains("database.acquire_timeout_ms"), "{error}");
}

#[test]
fn a_write_is_not_retried_before_the_database_gives_its_session_up() {
    let error = load(
        "hasty_write",
        "[database]\nreply_timeout_ms = 20000\nserver_keepalive_secs = 10\n",
    )
    .unwrap_err();
    assert!(error.contains("database.reply_timeout_ms"), "{error}");
    assert!(load(
        "patient_write",
        "[database]\nreply_timeout_ms = 20001\nserver_keepalive_secs = 10\n"
    )
    .is_ok());
    // Without the database's keepalive, the operator chose: any bound goes.
    assert!(load(
        "no_keepalive",
        "[database]\nreply_timeout_ms = 1000\nserver_keepalive_secs = 0\n"
    )
    .is_ok());
}

#[test]
fn the_former_name_of_the_reply_timeout_is_still_read() {
    let config = load("former_name", "[database]\nwrite_timeout_ms = 45000\n").expect("loads");
    assert_eq!(config.database.reply_timeout_ms, 45_000);
}

#[test]
fn mcp_allowed_urls_are_read_and_checked() {
    let config = load(
        "mcp-allowed",
        "[tools]\nmcp_allowed_urls = [\"https://\", \"http://calc:9000/\"]\n",
    )
    .unwrap();
    assert_eq!(
        config.tools.mcp_allowed_urls,
        ["https://", "http://calc:9000/"]
    );
    let problem = load(
        "mcp-allowed-bad",
        "[tools]\nmcp_allowed_urls = [\"calc:9000/\"]\n",
    )
    .unwrap_err();
    assert!(problem.contains("tools.mcp_allowed_urls"), "{problem}");
    let config = load(
        "mcp-allowed-private",
        "[tools]\nmcp_allowed_private_urls = [\"http://calc:9000/\"]\n",
    )
    .unwrap();
    assert_eq!(config.tools.mcp_allowed_private_urls, ["http://calc:9000/"]);
}
