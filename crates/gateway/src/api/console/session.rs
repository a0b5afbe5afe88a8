//! The console's session cookie: a random id and an expiry, signed with an HMAC keyed by a hash of the admin
//! token. It never holds the token; any replica with the same token accepts it, and it stops working when the
//! token changes, the expiry passes, or it is signed out (the store records its id).

use axum::http::HeaderMap;
use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};

/// The cookie's name.
pub const COOKIE: &str = "gateway_console";

/// How long a session lasts (seconds).
pub const LIFETIME_SECS: i64 = 12 * 3600;

/// What keys the HMAC: the admin token hashed with a label of its own, so the key is no other hash of the token.
fn signing_key(admin_token: &SecretString) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(b"gateway console session v1\0");
    hasher.update(admin_token.expose_secret().as_bytes());
    hasher.finalize().into()
}

fn mac(admin_token: &SecretString, payload: &str) -> Option<Hmac<Sha256>> {
    let mut mac = Hmac::<Sha256>::new_from_slice(&signing_key(admin_token)).ok()?;
    mac.update(payload.as_bytes());
    Some(mac)
}

/// A new session's cookie value, `<id>.<expires>.<signature>` (hex), expiring `LIFETIME_SECS` after `now`.
pub fn issue(admin_token: &SecretString, now: i64) -> Option<String> {
    let id = hex::encode(rand::random::<[u8; 16]>());
    let payload = format!("{id}.{}", now + LIFETIME_SECS);
    let signature = hex::encode(mac(admin_token, &payload)?.finalize().into_bytes());
    Some(format!("{payload}.{signature}"))
}

/// A session whose cookie verified: its id and when it expires (Unix seconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Session<'a> {
    pub id: &'a str,
    pub expires_at: i64,
}

/// The session of `value`, when it is a cookie `issue` made with this admin token that has not expired at `now`.
pub fn verified<'a>(admin_token: &SecretString, value: &'a str, now: i64) -> Option<Session<'a>> {
    let (payload, signature) = value.rsplit_once('.')?;
    let (id, expires) = payload.split_once('.')?;
    let expires_at = expires.parse::<i64>().ok()?;
    let signature = hex::decode(signature).ok()?;
    // `verify_slice` compares in constant time.
    let genuine = expires_at > now
        && mac(admin_token, payload).is_some_and(|mac| mac.verify_slice(&signature).is_ok());
    genuine.then_some(Session { id, expires_at })
}

/// The session cookie's value among a request's cookies, if it sent one.
pub fn cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .find_map(|pair| pair.trim().strip_prefix(COOKIE)?.strip_prefix('='))
}

/// The session the request's cookie carries, when it verifies with this admin token at `now` (whether it was
/// signed out is the store's to say).
pub fn of_request<'a>(
    headers: &'a HeaderMap,
    admin_token: Option<&SecretString>,
    now: i64,
) -> Option<Session<'a>> {
    verified(admin_token?, cookie(headers)?, now)
}

/// The `Set-Cookie` value that starts a session; `Secure` when the sign-in came over HTTPS (`over_https`), so
/// that the browser never sends it in the clear afterwards.
pub fn set_cookie(value: &str, secure: bool) -> String {
    format!(
        "{COOKIE}={value}; HttpOnly; SameSite=Strict; Path=/; Max-Age={LIFETIME_SECS}{}",
        secure_attribute(secure)
    )
}

/// The `Set-Cookie` value that ends one.
pub fn clear_cookie(secure: bool) -> String {
    format!(
        "{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0{}",
        secure_attribute(secure)
    )
}

fn secure_attribute(secure: bool) -> &'static str {
    if secure {
        "; Secure"
    } else {
        ""
    }
}

/// Whether the browser reached the gateway over HTTPS, as the proxy that ended TLS says (`X-Forwarded-Proto`, or
/// `Forwarded`'s `proto`; the gateway itself serves plain HTTP). A cookie marked `Secure` on a plain-HTTP console
/// would not be kept by the browser (but on `localhost`), so the mark follows the scheme; a client that claims
/// HTTPS falsely only makes its own cookie stricter.
pub fn over_https(headers: &HeaderMap) -> bool {
    let first = |name| {
        headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.split(',').next())
            .map(str::trim)
    };
    if let Some(proto) = first("x-forwarded-proto") {
        return proto.eq_ignore_ascii_case("https");
    }
    first("forwarded").is_some_and(|element| {
        element.split(';').any(|pair| {
            pair.split_once('=').is_some_and(|(key, value)| {
                key.trim().eq_ignore_ascii_case("proto")
                    && value.trim().trim_matches('"').eq_ignore_ascii_case("https")
            })
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(text: &str) -> SecretString {
        SecretString::from(text.to_owned())
    }

    #[test]
    fn an_issued_session_verifies_until_it_expires_and_only_with_its_token() {
        let value = issue(&token("admin"), 1000).unwrap();
        assert!(!value.contains("admin"));
        let session = verified(&token("admin"), &value, 1000).expect("verified");
        assert_eq!(session.expires_at, 1000 + LIFETIME_SECS);
        assert_eq!(session.id.len(), 32);
        assert!(value.starts_with(session.id));
        assert!(verified(&token("admin"), &value, 1000 + LIFETIME_SECS).is_none());
        assert!(verified(&token("other"), &value, 1000).is_none());
    }

    #[test]
    fn the_cookie_is_secure_when_a_proxy_says_the_browser_came_over_https() {
        let with = |pairs: &[(&'static str, &'static str)]| {
            let mut headers = HeaderMap::new();
            for (name, value) in pairs {
                headers.append(*name, axum::http::HeaderValue::from_static(value));
            }
            over_https(&headers)
        };
        assert!(!with(&[]));
        assert!(with(&[("x-forwarded-proto", "https")]));
        assert!(with(&[("x-forwarded-proto", "HTTPS, http")]));
        assert!(!with(&[("x-forwarded-proto", "http")]));
        assert!(with(&[("forwarded", "for=192.0.2.1;proto=https;by=proxy")]));
        assert!(with(&[("forwarded", "proto=\"https\", proto=http")]));
        assert!(!with(&[("forwarded", "for=192.0.2.1;proto=http")]));
        assert!(set_cookie("v", true).ends_with("; Secure"));
        assert!(!set_cookie("v", false).contains("Secure"));
        assert!(clear_cookie(true).contains("Max-Age=0; Secure"));
    }

    #[test]
    fn a_tampered_or_malformed_cookie_is_refused() {
        let value = issue(&token("admin"), 1000).unwrap();
        let (payload, signature) = value.rsplit_once('.').unwrap();
        let (id, _) = payload.split_once('.').unwrap();
        let longer = format!("{id}.{}.{signature}", 1000 + 10 * LIFETIME_SECS);
        for bad in [longer.as_str(), "", "x", "a.b", "a.1.zz", "..", "a.1."] {
            assert!(verified(&token("admin"), bad, 1000).is_none(), "{bad}");
        }
    }

    #[test]
    fn the_cookie_is_found_among_others() {
        let mut headers = HeaderMap::new();
        headers.insert(
            axum::http::header::COOKIE,
            "a=1; gateway_console=abc; b=2".parse().unwrap(),
        );
        assert_eq!(cookie(&headers), Some("abc"));
        headers.insert(
            axum::http::header::COOKIE,
            "gateway_consolex=1".parse().unwrap(),
        );
        assert_eq!(cookie(&headers), None);
    }
}
