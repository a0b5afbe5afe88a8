//! `Application`: builds the gateway from its config, binds its listener first, and serves until stopped.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::api::{bounded, router, AppState, BoundedHead, DefaultBodyLimitService};
use crate::config::Config;
use crate::engine::{Engine, Worker};
use crate::store::{EmbeddedLock, Store};

/// How long open connections (streams following a response that runs on) may take to close once the runs of
/// a stopping gateway are handed over.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// A built gateway, bound to its port, its replica registered; not yet serving.
pub struct Application {
    listener: TcpListener,
    /// The routes behind the limits of a request's head and body.
    routes: BoundedHead<DefaultBodyLimitService<axum::Router>>,
    store: Store,
    worker: Worker,
    shutdown_grace: Duration,
    /// The lock of the embedded store, held until the gateway has stopped (none on Postgres or in memory).
    _embedded_lock: Option<EmbeddedLock>,
}

impl Application {
    /// Connects to the store (the embedded one at `store::DEFAULT_URL` when no URL is configured), applies
    /// migrations and binds the listener (port 0 picks a free port).
    pub async fn build(config: Config) -> anyhow::Result<Application> {
        // Before anything touches the file: a second process must neither migrate it nor take over the runs of
        // the first (SPEC 9, one process per embedded store).
        let embedded_lock = Store::lock_configured(&config.database)?;
        let store = Store::connect_configured(&config.database)
            .await?
            .observed_by(Arc::new(crate::metrics::StoreMetrics))
            .with_group_commit(config.database.group_commit_batches);
        crate::metrics::install_with_upkeep();
        crate::memory::start();
        store.migrate().await?;
        crate::seed::apply(&store, &config.seed).await?;
        let engine = Engine::new(store.clone(), &config)?;
        // Before serving: the replica takes over at once whatever needs a replica (on the embedded store,
        // whatever the last process left unfinished).
        let worker = Worker::start(engine.clone()).await?;
        let state = AppState::new(crate::api::Shared {
            store: store.clone(),
            reads: crate::api::shared_reads::SharedReads::new(store.clone()),
            engine,
            admin_token: config.admin.token.clone().map(Arc::new),
            metrics_token: config.admin.metrics_token.clone().map(Arc::new),
            streams: crate::api::stream::StreamTimings {
                keep_alive: Duration::from_millis(config.server.keep_alive_ms.max(1)),
                stall: Duration::from_millis(config.server.stream_stall_timeout_ms.max(1)),
            },
            websocket_max_age: Duration::from_millis(config.websocket.max_connection_ms),
            websocket_message_limit: config.server.body_limit_bytes,
            websockets: crate::api::ws::OpenSockets::new(config.websocket.max_connections_per_key),
        });
        let routes = bounded(router(state), config.server.body_limit_bytes);
        let listener = TcpListener::bind(config.server.bind).await?;
        Ok(Application {
            listener,
            routes,
            store,
            worker,
            shutdown_grace: Duration::from_millis(config.server.shutdown_grace_ms),
            _embedded_lock: embedded_lock,
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

    /// This replica's id: the `owner` of the responses it runs.
    pub fn replica_id(&self) -> &str {
        self.worker.replica_id()
    }

    /// Serves until `shutdown` resolves. Then it stops accepting connections and work, lets the responses
    /// running here finish for at most `server.shutdown_grace_ms`, tells the rest to stop where they are, and hands
    /// every unfinished response over so that another replica resumes it at once.
    pub async fn run_until(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let (stopping_tx, stopping_rx) = tokio::sync::watch::channel(false);
        let signal = async move {
            shutdown.await;
            tracing::info!("shutting down: no new connections; finishing responses in flight");
            let _ = stopping_tx.send(true);
        };
        tokio::spawn(signal);
        let stopping = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            if rx.wait_for(|stopping| *stopping).await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        let listener = crate::listener::GatewayListener::new(self.listener);
        // `into_make_service` clones the one service for each connection; serving a `Router` itself would turn
        // its routes into services again for every connection (about 40 KiB each, measured with heaptrack at
        // 1,000 open streams).
        let service = crate::telemetry::with_request_ids(self.routes);
        let serving = axum::serve(listener, axum::ServiceExt::into_make_service(service))
            .with_graceful_shutdown(stopping(stopping_rx.clone()));
        let mut server = tokio::spawn(async move { serving.await });
        let stopped_early = tokio::select! {
            // The server ends on its own only when it fails; once the shutdown began it may end at once (no
            // connection open) and the hand-over below must still happen.
            result = &mut server => Some(result.unwrap_or(Ok(()))),
            () = stopping(stopping_rx.clone()) => None,
        };
        if let Some(result) = stopped_early {
            if !*stopping_rx.borrow() {
                return result;
            }
            self.worker.shutdown(self.shutdown_grace).await;
            return result;
        }
        self.worker.shutdown(self.shutdown_grace).await;
        match tokio::time::timeout(CLOSE_WAIT, server).await {
            Ok(result) => result.unwrap_or(Ok(())),
            Err(_) => {
                tracing::info!("closing the connections still open");
                Ok(())
            }
        }
    }
}
