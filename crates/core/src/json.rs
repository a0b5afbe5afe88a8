//! JSON read from bytes: UTF-8 checked once for the whole text, not string by string.

use serde::Deserialize;

/// Reads `T` from the JSON in `bytes`. Text that is UTF-8 as a whole is read as text, which skips the check
/// serde_json's byte reader makes of every string; anything else is read as bytes, so that its error says where
/// it fails, exactly as before.
pub fn from_bytes<'de, T: Deserialize<'de>>(bytes: &'de [u8]) -> serde_json::Result<T> {
    match std::str::from_utf8(bytes) {
        Ok(text) => serde_json::from_str(text),
        Err(_) => serde_json::from_slice(bytes),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    #[test]
    fn text_and_bytes_read_the_same_and_fail_the_same() {
        let cases: [&[u8]; 5] = [
            br#"{"a": ["\u00e9t\u00e9", "x\"y"], "b": 1.5}"#,
            "{\"a\": \"été\"}".as_bytes(),
            b"{\"a\": \"\xff\xfe\"}",
            b"{\"a\": ",
            b"[1, 2] 3",
        ];
        for bytes in cases {
            let once = from_bytes::<Value>(bytes).map_err(|e| e.to_string());
            let per_string = serde_json::from_slice::<Value>(bytes).map_err(|e| e.to_string());
            assert_eq!(once, per_string, "{}", String::from_utf8_lossy(bytes));
        }
    }
}
