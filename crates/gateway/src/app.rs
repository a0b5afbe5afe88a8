//! `Application`: builds the gateway from its config, binds its listener first, and serves until stopped.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::api::{router, AppState};
use crate::config::Config;
use crate::engine::Engine;
use crate::store::Store;

/// A built gateway, bound to its port, not yet serving.
pub struct Application {
    listener: TcpListener,
    router: axum::Router,
    store: Store,
    shutdown_grace: Duration,
}

impl Application {
    /// Connects to the store (the embedded one at `store::DEFAULT_URL` when no URL is configured), applies
    /// migrations and binds the listener (port 0 picks a free port).
    pub async fn build(config: Config) -> anyhow::Result<Application> {
        let store = Store::connect_configured(&config.database).await?;
        crate::metrics::install();
        store.migrate().await?;
        crate::seed::apply(&store, &config.seed).await?;
        let engine = Engine::new(store.clone(), &config)?;
        let state = AppState {
            store: store.clone(),
            engine,
            admin_token: config.admin.token.clone().map(Arc::new),
        };
        let router =
            crate::telemetry::with_request_ids(router(state, config.server.body_limit_bytes));
        let listener = TcpListener::bind(config.server.bind).await?;
        Ok(Application {
            listener,
            router,
            store,
            shutdown_grace: Duration::from_millis(config.server.shutdown_grace_ms),
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn port(&self) -> u16 {
        self.local_addr().map(|a| a.port()).unwrap_or(0)
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Serves until `shutdown` resolves, stops accepting, then lets in-flight requests finish for at most
    /// `server.shutdown_grace_ms`.
    pub async fn run_until(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let (stopping_tx, stopping_rx) = tokio::sync::oneshot::channel::<()>();
        let signal = async move {
            shutdown.await;
            tracing::info!("shutting down: no new connections; finishing requests in flight");
            let _ = stopping_tx.send(());
        };
        // Streams write small frames: without TCP_NODELAY the first event after the head waits for a
        // delayed ACK (~40 ms).
        let listener = axum::serve::ListenerExt::tap_io(self.listener, |tcp| {
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(error = %e, "could not set TCP_NODELAY");
            }
        });
        let server = axum::serve(listener, self.router).with_graceful_shutdown(signal);
        let grace = self.shutdown_grace;
        let deadline = async move {
            if stopping_rx.await.is_ok() {
                tokio::time::sleep(grace).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            result = server => result,
            () = deadline => {
                tracing::warn!(grace_ms = grace.as_millis() as u64, "shutdown grace period over; stopping with requests in flight");
                Ok(())
            }
        }
    }
}
