//! `Application`: builds the gateway from its config, binds its listener first, and serves until stopped.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use secrecy::ExposeSecret;
use tokio::net::TcpListener;

use crate::api::{router, AppState};
use crate::config::Config;
use crate::engine::Engine;
use crate::store::Store;
use crate::tools::ToolExecutor;
use crate::upstream::Upstream;

/// A built gateway, bound to its port, not yet serving.
pub struct Application {
    listener: TcpListener,
    router: axum::Router,
    store: Store,
}

impl Application {
    /// Connects to the store, applies migrations and binds the listener (port 0 picks a free port).
    pub async fn build(config: Config) -> anyhow::Result<Application> {
        let url = config
            .database
            .url
            .as_ref()
            .map(|u| u.expose_secret().to_owned())
            .ok_or_else(|| {
                anyhow::anyhow!("no database URL: set DATABASE_URL or GATEWAY__DATABASE__URL")
            })?;
        let store = Store::connect(&url, config.database.max_connections).await?;
        Application::build_with_store(config, store).await
    }

    /// Like `build`, on an existing store.
    pub async fn build_with_store(config: Config, store: Store) -> anyhow::Result<Application> {
        store.migrate().await?;
        let engine = Engine {
            store: store.clone(),
            upstream: Upstream::new(config.upstream.clone())?,
            tools: ToolExecutor::new(config.tools.clone())?,
            limits: config.limits.clone(),
        };
        let state = AppState {
            store: store.clone(),
            engine,
            admin_token: config.admin.token.clone().map(Arc::new),
        };
        let router = router(state, config.server.body_limit_bytes)
            .layer(crate::telemetry::request_span_layer());
        let listener = TcpListener::bind(config.server.bind).await?;
        Ok(Application {
            listener,
            router,
            store,
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

    /// Serves until `shutdown` resolves, then lets in-flight requests finish.
    pub async fn run_until(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        axum::serve(self.listener, self.router)
            .with_graceful_shutdown(shutdown)
            .await
    }
}
