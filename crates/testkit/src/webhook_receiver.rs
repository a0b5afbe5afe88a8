//! A webhook receiver that keeps what it is sent and answers as scripted: for testing deliveries (retries after
//! failures, redirects that must not be followed, a receiver that never answers).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;

use crate::server::{header_pairs, lock, spawn, ServerGuard};

/// One request the receiver got.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedWebhook {
    /// `(lower-case name, value)` pairs.
    pub headers: Vec<(String, String)>,
    pub body: String,
    /// What it was answered: `None` when it was held without an answer.
    pub answered: Option<u16>,
}

impl ReceivedWebhook {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// How the receiver answers the next request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebhookAnswer {
    Status(u16),
    /// `302` to another path of the receiver (which would answer 200).
    Redirect,
    /// No answer at all, until the sender gives up.
    Hang,
}

#[derive(Debug, Default)]
struct Shared {
    script: std::sync::Mutex<VecDeque<WebhookAnswer>>,
    received: std::sync::Mutex<Vec<ReceivedWebhook>>,
    arrived: tokio::sync::Notify,
}

/// Handle to a running receiver; it stops when the last handle is dropped.
#[derive(Debug, Clone)]
pub struct WebhookReceiver {
    shared: Arc<Shared>,
    guard: ServerGuard,
}

impl WebhookReceiver {
    /// Starts on `127.0.0.1` with a free port; it answers `200` unless scripted otherwise.
    pub async fn start() -> anyhow::Result<WebhookReceiver> {
        let shared = Arc::new(Shared::default());
        let router = Router::new()
            .route("/hook", post(receive))
            .route("/elsewhere", post(|| async { StatusCode::OK }))
            .with_state(Arc::clone(&shared));
        let guard = spawn(
            "webhook-receiver",
            SocketAddr::from(([127, 0, 0, 1], 0)),
            router,
        )
        .await?;
        Ok(WebhookReceiver { shared, guard })
    }

    /// The URL to register: `http://HOST:PORT/hook`.
    pub fn url(&self) -> String {
        format!("http://{}/hook", self.guard.addr())
    }

    /// Answers the next requests, one each, as given; then `200` again.
    pub fn script(&self, answers: &[WebhookAnswer]) {
        lock(&self.shared.script).extend(answers.iter().copied());
    }

    /// Every request received, in order.
    pub fn received(&self) -> Vec<ReceivedWebhook> {
        lock(&self.shared.received).clone()
    }

    /// Waits until `n` requests arrived that `count` counts; `false` after `timeout`.
    pub async fn wait_for(
        &self,
        n: usize,
        timeout: Duration,
        count: impl Fn(&ReceivedWebhook) -> bool,
    ) -> bool {
        let waiting = async {
            loop {
                let arrived = self.shared.arrived.notified();
                if lock(&self.shared.received)
                    .iter()
                    .filter(|r| count(r))
                    .count()
                    >= n
                {
                    return;
                }
                arrived.await;
            }
        };
        tokio::time::timeout(timeout, waiting).await.is_ok()
    }
}

async fn receive(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let answer = lock(&shared.script)
        .pop_front()
        .unwrap_or(WebhookAnswer::Status(200));
    let answered = match answer {
        WebhookAnswer::Status(status) => Some(status),
        WebhookAnswer::Redirect => Some(302),
        WebhookAnswer::Hang => None,
    };
    lock(&shared.received).push(ReceivedWebhook {
        headers: header_pairs(&headers),
        body: String::from_utf8_lossy(&body).into_owned(),
        answered,
    });
    shared.arrived.notify_waiters();
    match answer {
        WebhookAnswer::Status(status) => StatusCode::from_u16(status)
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
            .into_response(),
        WebhookAnswer::Redirect => {
            (StatusCode::FOUND, [("location", "/elsewhere")]).into_response()
        }
        WebhookAnswer::Hang => {
            std::future::pending::<()>().await;
            StatusCode::OK.into_response()
        }
    }
}
