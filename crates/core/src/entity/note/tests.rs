//! Notes render their fields; bad templates are refused with their param.

use super::*;

#[test]
fn a_note_renders_its_fields_and_missing_ones_as_nothing() {
    let values =
        serde_json::json!({"city": "Paris", "days": 3, "where": {"country": "FR"}, "none": null});
    let table = [
        (
            "Looking up the weather in {city}",
            "Looking up the weather in Paris",
        ),
        ("{days} days in {where.country}", "3 days in FR"),
        (
            "missing: [{nope}] [{where.nope}] [{none}]",
            "missing: [] [] []",
        ),
        ("no placeholder", "no placeholder"),
        ("{ city }!", "Paris!"),
    ];
    for (template, expected) in table {
        let template = NoteTemplate::parse(template, "note_on_request").unwrap();
        assert_eq!(template.render(&values), expected, "{template:?}");
    }
    // Not an object at all: every placeholder is missing.
    let template = NoteTemplate::parse("a{b}c", "note_on_result").unwrap();
    assert_eq!(template.render(&serde_json::json!("text")), "ac");
}

#[test]
fn a_bad_note_template_is_refused_with_its_param() {
    for bad in ["", "{open", "close}", "{{nested}}", "tab\there"] {
        let error = NoteTemplate::parse(bad, "note_on_request").unwrap_err();
        assert_eq!(error.param.as_deref(), Some("note_on_request"), "{bad:?}");
    }
    let long = "x".repeat(NoteTemplate::MAX_CHARS + 1);
    assert!(NoteTemplate::parse(long, "note_on_result").is_err());
}
