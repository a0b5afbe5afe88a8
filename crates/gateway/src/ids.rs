//! Opaque ids with a kind prefix (`resp_…`, `msg_…`, `call_…`), drawn from a userspace RNG.
//!
//! The items a response produces carry its id inside theirs (`msg_<response's 32 hex><8 hex>`), so that an
//! `item_reference` finds its response without an index of every item.

/// A new opaque id with a kind prefix, e.g. `resp_3f2a...`.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

/// A new id for an item of `response_id`: it carries the response's hex, then 8 hex of its own. A response id of
/// another shape gives a plain random id.
pub fn item_id(prefix: &str, response_id: &str) -> String {
    match response_hex(response_id) {
        Some(hex) => format!("{prefix}_{hex}{:08x}", rand::random::<u32>()),
        None => new_id(prefix),
    }
}

/// The response an item id issued by [`item_id`] belongs to.
pub fn response_of_item(item_id: &str) -> Option<String> {
    let (_, rest) = item_id.split_once('_')?;
    if rest.len() != 40 || !rest.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    Some(format!("resp_{}", &rest[..32]))
}

fn response_hex(response_id: &str) -> Option<&str> {
    let hex = response_id.strip_prefix("resp_")?;
    (hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then_some(hex)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_item_id_leads_back_to_its_response() {
        let response = new_id("resp");
        let item = item_id("msg", &response);
        assert!(item.starts_with("msg_"), "{item}");
        assert_eq!(response_of_item(&item), Some(response.clone()));
        assert_ne!(
            item,
            item_id("msg", &response),
            "two items of one response differ"
        );
        assert_eq!(
            response_of_item(&new_id("msg")),
            None,
            "a plain id names no response"
        );
        assert_eq!(response_of_item("msg_\u{0}x"), None);
        assert!(item_id("fc", "resp_custom").starts_with("fc_"));
    }
}
