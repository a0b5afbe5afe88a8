//! Sealing compaction items (SPEC 11): a summary is encrypted with XChaCha20-Poly1305 under the gateway's key,
//! bound to its project, so that clients can carry it but neither read nor forge it, and another project's item
//! does not open.
//!
//! A sealed item is `base64url(version | key id | nonce | ciphertext)`. The key id (the first 8 bytes of the key's
//! SHA-256) picks the key that opens it, so keys rotate: new items are sealed with `compaction.key` (or, without
//! one, a key generated once and kept in the database for every replica), and `compaction.old_keys` (and the
//! generated key, once a configured key replaces it) still open the items sealed before.

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use rand::RngCore;
use secrecy::ExposeSecret;
use sha2::{Digest, Sha256};
use tokio::sync::OnceCell;

use crate::config::CompactionConfig;
use crate::store::{Store, StoreError};

/// The layout version of a sealed item.
const VERSION: u8 = 1;
const KEY_ID_LEN: usize = 8;
const NONCE_LEN: usize = 24;
/// Bound into every seal with the project id: a sealed item means nothing anywhere else.
const CONTEXT: &[u8] = b"gateway.compaction.v1:";

/// Why a compaction item does not open.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Altered, sealed for another project, or with a key this gateway does not have.
    #[error("the compaction item could not be opened")]
    Refused,
    /// The generated key could not be read.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// One key and its id.
#[derive(Clone)]
struct Key {
    id: [u8; KEY_ID_LEN],
    cipher: XChaCha20Poly1305,
}

impl Key {
    fn new(bytes: &[u8; 32]) -> Key {
        let digest = Sha256::digest(bytes);
        let mut id = [0; KEY_ID_LEN];
        id.copy_from_slice(&digest[..KEY_ID_LEN]);
        Key {
            id,
            cipher: XChaCha20Poly1305::new(bytes.into()),
        }
    }
}

/// The keys in use: one seals, all open.
struct Keys {
    sealing: Key,
    opening: Vec<Key>,
}

/// Seals and opens compaction items. Cheap to share; the generated key is read once, when first needed.
pub struct Sealer {
    store: Store,
    configured: Option<Key>,
    old: Vec<Key>,
    keys: OnceCell<Keys>,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer").finish_non_exhaustive()
    }
}

/// A key as the config gives it: 32 bytes, base64.
pub fn parse_key(text: &str) -> Result<[u8; 32], String> {
    let bytes = STANDARD
        .decode(text.trim())
        .map_err(|e| format!("not base64 ({e})"))?;
    <[u8; 32]>::try_from(bytes.as_slice())
        .map_err(|_| format!("{} bytes where 32 are needed", bytes.len()))
}

impl Sealer {
    /// A sealer with the keys of `config` (checked when the config was loaded; a bad one is left out here).
    pub fn new(store: Store, config: &CompactionConfig) -> Sealer {
        let parse = |secret: &secrecy::SecretString| match parse_key(secret.expose_secret()) {
            Ok(bytes) => Some(Key::new(&bytes)),
            Err(problem) => {
                tracing::error!(%problem, "a compaction key of the config is unusable; it is left out");
                None
            }
        };
        Sealer {
            store,
            configured: config.key.as_ref().and_then(parse),
            old: config.old_keys.iter().filter_map(parse).collect(),
            keys: OnceCell::new(),
        }
    }

    async fn keys(&self) -> Result<&Keys, StoreError> {
        self.keys
            .get_or_try_init(|| async {
                let generated = match &self.configured {
                    // A key set after items were sealed with the generated one still opens those.
                    Some(_) => self.store.generated_compaction_key().await?,
                    None => {
                        let mut candidate = [0u8; 32];
                        rand::rng().fill_bytes(&mut candidate);
                        let created_at = crate::clock::now();
                        Some(
                            self.store
                                .compaction_key(&STANDARD.encode(candidate), created_at)
                                .await?,
                        )
                    }
                };
                let generated = match generated.as_deref().map(parse_key) {
                    Some(Ok(bytes)) => Some(Key::new(&bytes)),
                    Some(Err(problem)) => {
                        return Err(StoreError::Corrupt(format!(
                            "the stored compaction key is unusable: {problem}"
                        )))
                    }
                    None => None,
                };
                let sealing = match (&self.configured, &generated) {
                    (Some(key), _) | (None, Some(key)) => key.clone(),
                    (None, None) => {
                        return Err(StoreError::Corrupt("no compaction key was stored".into()))
                    }
                };
                let mut opening = vec![sealing.clone()];
                opening.extend(generated.into_iter().filter(|k| k.id != sealing.id));
                opening.extend(self.old.iter().cloned());
                Ok(Keys { sealing, opening })
            })
            .await
    }

    /// Seals `summary` for `project_id`.
    pub async fn seal(&self, project_id: &str, summary: &str) -> Result<String, StoreError> {
        let key = &self.keys().await?.sealing;
        let mut nonce = [0u8; NONCE_LEN];
        rand::rng().fill_bytes(&mut nonce);
        let mut header = Vec::with_capacity(1 + KEY_ID_LEN + NONCE_LEN);
        header.push(VERSION);
        header.extend_from_slice(&key.id);
        header.extend_from_slice(&nonce);
        let plaintext = serde_json::json!({ "summary": summary }).to_string();
        let ciphertext = key
            .cipher
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: plaintext.as_bytes(),
                    aad: &associated_data(&header, project_id),
                },
            )
            .map_err(|_| StoreError::Corrupt("sealing a compaction item failed".into()))?;
        header.extend_from_slice(&ciphertext);
        Ok(URL_SAFE_NO_PAD.encode(header))
    }

    /// The summary sealed in `sealed` for `project_id`.
    pub async fn open(&self, project_id: &str, sealed: &str) -> Result<String, OpenError> {
        let bytes = URL_SAFE_NO_PAD
            .decode(sealed.trim())
            .map_err(|_| OpenError::Refused)?;
        let header_len = 1 + KEY_ID_LEN + NONCE_LEN;
        if bytes.len() <= header_len || bytes[0] != VERSION {
            return Err(OpenError::Refused);
        }
        let (header, ciphertext) = bytes.split_at(header_len);
        let key_id = &header[1..1 + KEY_ID_LEN];
        let nonce = &header[1 + KEY_ID_LEN..];
        let keys = self.keys().await?;
        let key = keys
            .opening
            .iter()
            .find(|k| k.id == key_id)
            .ok_or(OpenError::Refused)?;
        let plaintext = key
            .cipher
            .decrypt(
                XNonce::from_slice(nonce),
                Payload {
                    msg: ciphertext,
                    aad: &associated_data(header, project_id),
                },
            )
            .map_err(|_| OpenError::Refused)?;
        let opened: serde_json::Value =
            serde_json::from_slice(&plaintext).map_err(|_| OpenError::Refused)?;
        opened["summary"]
            .as_str()
            .map(str::to_owned)
            .ok_or(OpenError::Refused)
    }
}

/// What a seal is bound to besides its content: its own header (version, key id, nonce) and the project.
fn associated_data(header: &[u8], project_id: &str) -> Vec<u8> {
    let mut aad = Vec::with_capacity(CONTEXT.len() + header.len() + project_id.len());
    aad.extend_from_slice(CONTEXT);
    aad.extend_from_slice(header);
    aad.extend_from_slice(project_id.as_bytes());
    aad
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used, clippy::unwrap_used)]

    use gateway_testkit::scratch::ScratchDatabase;

    use super::*;

    async fn store() -> (Store, ScratchDatabase) {
        let db = ScratchDatabase::sqlite();
        let store = Store::connect(db.url(), 2).await.expect("store");
        store.migrate().await.expect("migrate");
        (store, db)
    }

    fn key(byte: u8) -> secrecy::SecretString {
        STANDARD.encode([byte; 32]).into()
    }

    fn sealer(store: &Store, key: Option<u8>, old: &[u8]) -> Sealer {
        let config = CompactionConfig {
            key: key.map(self::key),
            old_keys: old.iter().map(|b| self::key(*b)).collect(),
        };
        Sealer::new(store.clone(), &config)
    }

    fn refused(result: Result<String, OpenError>) -> bool {
        matches!(result, Err(OpenError::Refused))
    }

    #[tokio::test]
    async fn a_sealed_summary_opens_only_for_its_project_and_unaltered() {
        let (store, _db) = store().await;
        let sealer = sealer(&store, Some(1), &[]);
        let sealed = sealer
            .seal("proj_a", "the launch is Tuesday")
            .await
            .unwrap();

        assert!(!sealed.contains("Tuesday"));
        assert_eq!(
            sealer.open("proj_a", &sealed).await.unwrap(),
            "the launch is Tuesday"
        );
        assert!(refused(sealer.open("proj_b", &sealed).await));
        let mut bytes = URL_SAFE_NO_PAD.decode(&sealed).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        assert!(refused(
            sealer.open("proj_a", &URL_SAFE_NO_PAD.encode(&bytes)).await
        ));
        assert!(refused(sealer.open("proj_a", "not base64 at all!").await));
        assert!(refused(sealer.open("proj_a", "").await));
        // Two seals of one summary differ (random nonces).
        assert_ne!(
            sealer.seal("proj_a", "same").await.unwrap(),
            sealer.seal("proj_a", "same").await.unwrap()
        );
    }

    #[tokio::test]
    async fn a_rotated_key_still_opens_what_it_sealed_when_kept_as_an_old_key() {
        let (store, _db) = store().await;
        let sealed = sealer(&store, Some(1), &[])
            .seal("p", "before")
            .await
            .unwrap();

        let rotated = sealer(&store, Some(2), &[1]);
        assert_eq!(rotated.open("p", &sealed).await.unwrap(), "before");
        let after = rotated.seal("p", "after").await.unwrap();
        assert!(refused(
            sealer(&store, Some(1), &[]).open("p", &after).await
        ));
        assert!(refused(
            sealer(&store, Some(2), &[]).open("p", &sealed).await
        ));
    }

    #[tokio::test]
    async fn without_a_configured_key_every_replica_shares_the_generated_one() {
        let (store, _db) = store().await;
        let first = sealer(&store, None, &[]);
        let second = sealer(&store, None, &[]);
        let sealed = first.seal("p", "shared").await.unwrap();
        assert_eq!(second.open("p", &sealed).await.unwrap(), "shared");
        // A key configured later seals from then on, and the generated one still opens earlier items.
        let configured = sealer(&store, Some(3), &[]);
        assert_eq!(configured.open("p", &sealed).await.unwrap(), "shared");
    }

    #[test]
    fn keys_must_be_32_bytes_of_base64() {
        assert!(parse_key(&STANDARD.encode([7u8; 32])).is_ok());
        assert!(parse_key(&STANDARD.encode([7u8; 16])).is_err());
        assert!(parse_key("***").is_err());
    }
}
