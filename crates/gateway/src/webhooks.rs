//! Webhook deliveries (SPEC 15): each replica takes due deliveries from the outbox in the database (one replica
//! at a time per delivery, under a lock that lapses by the database's clock), signs them as Standard Webhooks,
//! posts them without following redirects and within a time bound, and records the outcome: delivered, tried
//! again after a growing wait, or given up.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use gateway_core::response::ResponseStatus;
use gateway_core::webhook::{backoff_ms, WebhookEvent};
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;
use tokio::sync::Notify;

use crate::config::WebhooksConfig;
use crate::store::webhooks::{DueDelivery, TryOutcome};
use crate::store::Store;
use crate::tools::failure::{of_send_error, origin};

/// Deliveries a replica takes at once.
const BATCH: i64 = 16;
/// How soon a delivery whose response is still writing its ending is looked at again.
const NOT_YET_MS: i64 = 1_000;
/// How much of a refusing endpoint's answer is kept as the delivery's last error.
const ERROR_EXCERPT: usize = 200;

/// A new signing secret: `whsec_` and 32 random bytes in base64, as Standard Webhooks has them.
pub fn new_secret() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

/// The `webhook-signature` of a message: `v1,` and the base64 HMAC-SHA256 of `{id}.{timestamp}.{body}` under
/// the secret's bytes (the base64 after `whsec_`; a secret not in that form is used as it is).
pub fn signature(secret: &str, id: &str, timestamp: i64, body: &str) -> String {
    let key = secret
        .strip_prefix("whsec_")
        .and_then(|encoded| {
            base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .ok()
        })
        .unwrap_or_else(|| secret.as_bytes().to_vec());
    // HMAC takes a key of any length.
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&key) else {
        return String::new();
    };
    mac.update(format!("{id}.{timestamp}.{body}").as_bytes());
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
    )
}

/// The replica's deliverer; `wake` makes it look at once (a delivery was just queued here).
#[derive(Debug, Clone)]
pub struct Deliverer {
    store: Store,
    http: reqwest::Client,
    config: WebhooksConfig,
    wake: Arc<Notify>,
}

impl Deliverer {
    pub fn new(store: Store, config: WebhooksConfig) -> Result<Deliverer, reqwest::Error> {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_millis(config.timeout_ms))
            .connect_timeout(Duration::from_millis(config.timeout_ms.min(10_000)))
            .user_agent(concat!("gateway-webhooks/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Deliverer {
            store,
            http,
            config,
            wake: Arc::new(Notify::new()),
        })
    }

    /// Makes the running deliverer look for due deliveries now.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Takes and delivers due deliveries until the task is stopped.
    pub async fn run(self) {
        let poll = Duration::from_millis(self.config.poll_ms.max(10));
        loop {
            // A try must end before its lock lapses, or another replica would send it again meanwhile.
            let lock = self
                .config
                .lock_ms
                .max(self.config.timeout_ms.saturating_add(1_000));
            let lock_ms = i64::try_from(lock).unwrap_or(i64::MAX);
            match self.store.take_due_deliveries(BATCH, lock_ms).await {
                Ok(due) if !due.is_empty() => {
                    let full = due.len() as i64 == BATCH;
                    futures::future::join_all(due.into_iter().map(|d| self.deliver(d))).await;
                    if full {
                        continue;
                    }
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "could not take webhook deliveries"),
            }
            let _ = tokio::time::timeout(poll, self.wake.notified()).await;
        }
    }

    /// One try of one delivery, and its outcome recorded.
    async fn deliver(&self, delivery: DueDelivery) {
        let outcome = self.try_once(&delivery).await;
        crate::metrics::webhook_try(match &outcome {
            TryOutcome::Delivered { .. } => "delivered",
            TryOutcome::Failed { give_up: true, .. } => "given_up",
            TryOutcome::Failed { .. } => "failed",
            TryOutcome::NotYet { .. } => "not_yet",
            TryOutcome::Superseded => "superseded",
        });
        if let TryOutcome::Failed { error, give_up, .. } = &outcome {
            tracing::warn!(
                webhook.delivery_id = %delivery.id,
                webhook.event_id = %delivery.event_id,
                webhook.origin = %origin(&delivery.url),
                attempt = delivery.attempts,
                given_up = give_up,
                cause = %error,
                "webhook delivery failed"
            );
        }
        match self.store.record_delivery_try(&delivery, &outcome).await {
            Ok(true) => {}
            // This try outlived its lock, and another replica took the delivery since: its try counts.
            Ok(false) => {
                tracing::warn!(webhook.delivery_id = %delivery.id, "a webhook try ended after its lock lapsed; another replica's try is recorded instead")
            }
            // The lock lapses and the delivery is tried again: at least once.
            Err(e) => {
                tracing::warn!(webhook.delivery_id = %delivery.id, error = %e, "could not record a webhook try")
            }
        }
    }

    async fn try_once(&self, delivery: &DueDelivery) -> TryOutcome {
        let event = WebhookEvent::parse(&delivery.event_type);
        let status = delivery
            .response_status
            .as_deref()
            .and_then(ResponseStatus::parse);
        match status {
            // Deleted since: the event happened, and is sent.
            None => {}
            Some(status) => match WebhookEvent::of_status(status) {
                None => {
                    return TryOutcome::NotYet {
                        retry_in_ms: NOT_YET_MS,
                    }
                }
                Some(ended) if Some(ended) != event => return TryOutcome::Superseded,
                Some(_) => {}
            },
        }
        let body = delivery.payload.to_string();
        let timestamp = crate::clock::now();
        let request = self
            .http
            .post(&delivery.url)
            .header("content-type", "application/json")
            .header("webhook-id", &delivery.event_id)
            .header("webhook-timestamp", timestamp.to_string())
            .header(
                "webhook-signature",
                signature(&delivery.secret, &delivery.event_id, timestamp, &body),
            )
            .body(body);
        let attempts = u32::try_from(delivery.attempts).unwrap_or(u32::MAX);
        let give_up = attempts >= self.config.max_attempts;
        let retry_in_ms = i64::try_from(backoff_ms(
            attempts,
            self.config.backoff_ms,
            self.config.max_backoff_ms,
        ))
        .unwrap_or(i64::MAX);
        match request.send().await {
            Ok(answer) if answer.status().is_success() => TryOutcome::Delivered {
                status: answer.status().as_u16(),
            },
            Ok(answer) => {
                let status = answer.status().as_u16();
                let redirect = answer.status().is_redirection();
                let excerpt = excerpt_of(answer).await;
                let error = if redirect {
                    format!("HTTP {status}: redirects are not followed")
                } else {
                    format!("HTTP {status}: {excerpt}")
                };
                TryOutcome::Failed {
                    status: Some(status),
                    error,
                    retry_in_ms,
                    give_up,
                }
            }
            Err(e) => {
                let failure = of_send_error(&e);
                TryOutcome::Failed {
                    status: None,
                    error: format!("{}: {}", failure.kind.as_str(), failure.cause),
                    retry_in_ms,
                    give_up,
                }
            }
        }
    }
}

/// The start of a failed delivery's answer body, for its record: read only as far as the excerpt needs (a few
/// bytes per character at most), whatever the endpoint sends after it.
async fn excerpt_of(mut answer: reqwest::Response) -> String {
    let wanted = ERROR_EXCERPT * 4;
    let mut bytes = Vec::new();
    while bytes.len() < wanted {
        match answer.chunk().await {
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    bytes.truncate(wanted);
    String::from_utf8_lossy(&bytes)
        .chars()
        .take(ERROR_EXCERPT)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_is_the_hmac_of_id_timestamp_and_body_under_the_secrets_bytes() {
        // Standard Webhooks' published example.
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let body = r#"{"test": 2432232314}"#;
        assert_eq!(
            signature(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn secrets_are_whsec_and_32_random_bytes() {
        let (a, b) = (new_secret(), new_secret());
        assert_ne!(a, b);
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(a.strip_prefix("whsec_").expect("prefix"))
            .expect("base64");
        assert_eq!(bytes.len(), 32);
    }
}
