//! Each field type refuses what it must and names its param.

use super::*;
use serde_json::json;

#[test]
fn names_are_refused_when_empty_padded_or_too_long() {
    assert!(EntityName::parse("acme", "name").is_ok());
    for bad in ["", " acme", "ac\nme", &"x".repeat(MAX_NAME_CHARS + 1)] {
        let error = EntityName::parse(bad, "name").unwrap_err();
        assert_eq!(error.param.as_deref(), Some("name"), "{bad:?}");
        assert_eq!(error.code.as_deref(), Some("invalid_value"));
    }
}

#[test]
fn tool_names_follow_the_openai_pattern() {
    assert!(ToolName::parse("get_weather-2", "name").is_ok());
    for bad in ["", "a b", "ü", &"x".repeat(65)] {
        assert!(ToolName::parse(bad, "name").is_err(), "{bad:?}");
    }
}

#[test]
fn urls_must_be_http_with_a_host_and_no_credentials() {
    let table = [
        ("http://127.0.0.1:8080/v1", true),
        ("https://api.example.com", true),
        ("ftp://example.com", false),
        ("not a url", false),
        ("/relative/path", false),
        ("http://user:pass@example.com", false),
        (" http://example.com", false),
        ("http://", false),
        ("", false),
    ];
    for (url, ok) in table {
        assert_eq!(HttpUrl::parse(url, "url").is_ok(), ok, "{url}");
    }
}

#[test]
fn provider_kinds_round_trip_and_unknown_ones_list_the_choices() {
    for kind in ProviderKind::ALL {
        assert_eq!(ProviderKind::parse(kind.as_str(), "kind"), Ok(kind));
        assert_eq!(ProviderKind::try_from(kind.to_string()), Ok(kind));
        assert_eq!(json!(kind), json!(kind.as_str()));
    }
    let error = ProviderKind::parse("bedrock", "provider.kind").unwrap_err();
    assert!(error
        .message
        .contains("openai_chat, anthropic, openai_responses"));
}

#[test]
fn timeouts_are_between_one_ms_and_ten_minutes() {
    assert_eq!(TimeoutMs::parse(1, "t").map(TimeoutMs::get), Ok(1));
    assert_eq!(
        TimeoutMs::parse(600_000, "t").map(TimeoutMs::get),
        Ok(600_000)
    );
    for bad in [0, -1, 600_001] {
        assert!(TimeoutMs::parse(bad, "t").is_err(), "{bad}");
    }
}

#[test]
fn parameters_must_be_an_object_schema_that_compiles() {
    let table = [
        (
            json!({"type": "object", "properties": {"a": {"type": "number"}}}),
            true,
        ),
        (json!({}), true),
        (json!({"type": "string"}), false),
        (
            json!({"type": "object", "properties": {"a": {"type": "no-such-type"}}}),
            false,
        ),
        (
            json!({"type": "object", "properties": {"a": {"pattern": "("}}}),
            false,
        ),
        (json!([1, 2]), false),
        (json!("object"), false),
    ];
    for (schema, ok) in table {
        assert_eq!(
            ToolParameters::parse(schema.clone(), "parameters").is_ok(),
            ok,
            "{schema}"
        );
    }
}

#[test]
fn secrets_must_be_non_empty_without_control_characters_and_are_not_repeated() {
    assert!(check_secret("sk-abc", "secret").is_ok());
    for bad in ["", "   ", "sk-\nabc"] {
        let error = check_secret(bad, "secret").unwrap_err();
        assert!(bad.trim().is_empty() || !error.message.contains(bad));
    }
}

#[test]
fn a_hosted_type_must_be_one_of_the_listed_ones() {
    assert!(parse_hosted_type("web_search".into(), "hosted_type").is_ok());
    assert_eq!(
        parse_hosted_type("nope".into(), "hosted_type")
            .unwrap_err()
            .param
            .as_deref(),
        Some("hosted_type")
    );
}
