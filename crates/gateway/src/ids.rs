//! Opaque ids with a kind prefix (`resp_…`, `msg_…`, `call_…`): a UUID v7, whose first 48 bits are the time in
//! milliseconds and whose other 74 are random (a userspace RNG).
//!
//! Time first, so that ids made one after the other sort one after the other: the rows a batch writes (a
//! response, its items, steps and usage, all keyed by the response's id) land at the end of each index instead of
//! on a random page of it, which made every response dirty a page of its own in every index, on both stores.
//! The items a response produces carry its id inside theirs (`msg_<response's 32 hex><8 hex>`), so that an
//! `item_reference` finds its response without an index of every item.

/// A new opaque id with a kind prefix, e.g. `resp_019ac4…`.
pub fn new_id(prefix: &str) -> String {
    let mut id = String::with_capacity(prefix.len() + 1 + uuid::fmt::Simple::LENGTH);
    id.push_str(prefix);
    id.push('_');
    id.push_str(
        uuid::Uuid::now_v7()
            .simple()
            .encode_lower(&mut uuid::Uuid::encode_buffer()),
    );
    id
}

/// A new id for an item of `response_id`: it carries the response's hex, then 8 hex of its own. A response id of
/// another shape gives a plain random id.
pub fn item_id(prefix: &str, response_id: &str) -> String {
    let Some(hex) = response_hex(response_id) else {
        return new_id(prefix);
    };
    // Written byte by byte: `format!` took a hundredth of an unstored create's CPU over a response's few ids.
    let mut id = String::with_capacity(prefix.len() + 1 + hex.len() + 8);
    id.push_str(prefix);
    id.push('_');
    id.push_str(hex);
    let own = rand::random::<u32>();
    for shift in (0..8).rev() {
        let digit = (own >> (shift * 4)) & 0xf;
        id.push(char::from_digit(digit, 16).unwrap_or('0'));
    }
    id
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
        let hex = "0123456789abcdef0123456789abcdef";
        let item = item_id("fc", &format!("resp_{hex}"));
        assert_eq!(item.len(), "fc_".len() + 40, "{item}");
        assert!(item[3..].starts_with(hex), "{item}");
        assert!(
            item[3..]
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "lower-case hex: {item}"
        );
    }

    #[test]
    fn ids_made_one_after_the_other_sort_one_after_the_other_and_still_differ() {
        let ids: Vec<String> = (0..1000).map(|_| new_id("resp")).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        // Within one millisecond the order is random; across milliseconds it is the order they were made in.
        let first_ms = |id: &str| id[5..17].to_owned();
        assert!(
            ids.windows(2).all(|w| first_ms(&w[0]) <= first_ms(&w[1])),
            "{ids:?}"
        );
        sorted.dedup();
        assert_eq!(sorted.len(), ids.len(), "two ids were the same");
        assert!(ids
            .iter()
            .all(|id| id.len() == 37 && response_hex(id).is_some()));
    }
}
