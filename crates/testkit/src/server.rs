//! Shared plumbing for the in-process HTTP servers: binding, spawning and shutdown-on-drop.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use axum::http::HeaderMap;
use axum::Router;
use tokio::sync::oneshot;

/// Keeps a spawned server alive; when the last clone is dropped the server shuts down gracefully.
#[derive(Debug, Clone)]
pub(crate) struct ServerGuard {
    addr: SocketAddr,
    _shutdown: Arc<oneshot::Sender<()>>,
}

impl ServerGuard {
    /// The address the server is actually listening on (the real port when bound to port 0).
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// Binds `addr`, serves `router` on a new tokio task and returns the guard that keeps it running.
pub(crate) async fn spawn(
    name: &'static str,
    addr: SocketAddr,
    router: Router,
) -> anyhow::Result<ServerGuard> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("{name}: cannot bind {addr}: {e}"))?;
    let addr = listener.local_addr()?;
    let (tx, rx) = oneshot::channel::<()>();
    tokio::spawn(async move {
        let shutdown = async move {
            // Resolves when the sender is dropped together with the last handle.
            let _ = rx.await;
        };
        if let Err(e) = axum::serve(listener, router)
            .with_graceful_shutdown(shutdown)
            .await
        {
            tracing::error!(server = name, error = %e, "server stopped with an error");
        }
    });
    Ok(ServerGuard {
        addr,
        _shutdown: Arc::new(tx),
    })
}

/// Headers as `(lower-case name, value)` pairs, in the order received.
pub(crate) fn header_pairs(headers: &HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().to_ascii_lowercase(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            )
        })
        .collect()
}

/// Locks a mutex, recovering the data if another thread panicked while holding it.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
