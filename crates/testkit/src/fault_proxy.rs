//! A TCP proxy that cuts the connections through it, for fault-injection tests: put between the gateway and its
//! database, it makes statements fail mid-flight and replies go missing after a commit, as a flaky network or a
//! restarting server would.
//!
//! Cuts are decided by a seeded generator (the same seed cuts the same way, given the same traffic), and stop
//! when the proxy is told to heal or is dropped. One fault can also be placed exactly: the reply of the statement
//! that carries given bytes is lost after its commit, and then nothing more goes through until the proxy heals
//! (`lose_reply_then_stall`), or only its connection falls silent, left open (`silence_reply`, or
//! `silence_delivery` for what the server sends unasked). And the whole
//! database can be made unreachable for a while (`stall`, then `heal`), or every connection cut at once
//! (`cut_all`), as a partition or a restart of the database server would.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A running proxy; stops when dropped.
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    _stop: watch::Sender<()>,
}

struct Shared {
    /// Whether connections are being cut.
    cutting: AtomicBool,
    /// One in how many forwarded chunks cuts its connection.
    one_in: u64,
    /// The generator's state (xorshift).
    state: AtomicU64,
    /// Connections cut so far.
    cuts: AtomicU64,
    /// Bytes that mark the statement whose reply is lost (`lose_reply_then_stall`), until a connection sends them.
    marker: Mutex<Option<Vec<u8>>>,
    /// Whether nothing is forwarded, either way, on any connection (after a lost reply, until `heal`).
    stalled: watch::Sender<bool>,
    /// Whether the marked statement's connection falls silent instead (`silence_reply`): the other connections
    /// go on.
    silence: AtomicBool,
    /// Bytes that mark what the server sends to the connection that falls silent (`silence_delivery`), until a
    /// connection is sent them.
    delivery_marker: Mutex<Option<Vec<u8>>>,
    /// Connections silenced so far.
    silenced: AtomicU64,
    /// Bumped by `cut_all`: every connection open then is closed.
    cut_all: watch::Sender<u64>,
}

/// Postgres's ReadyForQuery with an idle status: the server's last message for a transaction that ended (after
/// its commit, for a statement that committed).
const READY_AND_IDLE: &[u8] = b"Z\0\0\0\x05I";

impl Shared {
    fn next(&self) -> u64 {
        let mut x = self.state.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.state.store(x, Ordering::Relaxed);
        x
    }

    /// Whether the connection that just forwarded a chunk is cut now.
    fn cut_now(&self) -> bool {
        if !self.cutting.load(Ordering::Relaxed) || !self.next().is_multiple_of(self.one_in) {
            return false;
        }
        self.cuts.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Whether `chunk` carries the marker of the statement whose reply is to be lost (once: the first connection
    /// that sends it is the one).
    fn takes_marker(&self, chunk: &[u8]) -> bool {
        take_when_found(&self.marker, chunk)
    }

    /// Whether `chunk`, on its way to a client, carries the marker of `silence_delivery` (once).
    fn takes_delivery_marker(&self, chunk: &[u8]) -> bool {
        take_when_found(&self.delivery_marker, chunk)
    }

    /// Waits while the proxy is stalled.
    async fn unstalled(&self) {
        let mut stalled = self.stalled.subscribe();
        let _ = stalled.wait_for(|stalled| !*stalled).await;
    }
}

/// Whether `chunk` carries the bytes `marker` holds; they are then taken, so that only one chunk matches.
fn take_when_found(marker: &Mutex<Option<Vec<u8>>>, chunk: &[u8]) -> bool {
    let mut marker = marker.lock().unwrap_or_else(|e| e.into_inner());
    let found = marker
        .as_deref()
        .is_some_and(|m| chunk.windows(m.len()).any(|w| w == m));
    if found {
        *marker = None;
    }
    found
}

impl FaultProxy {
    /// Starts a proxy on a free loopback port to `target` that, once told to cut, cuts about one connection in
    /// `one_in` forwarded chunks (either way: a statement on its way, or a reply on its way back), with `seed` for
    /// the generator. It starts healed.
    pub async fn start(target: SocketAddr, one_in: u64, seed: u64) -> std::io::Result<FaultProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            cutting: AtomicBool::new(false),
            one_in: one_in.max(1),
            state: AtomicU64::new(seed | 1),
            cuts: AtomicU64::new(0),
            marker: Mutex::new(None),
            stalled: watch::Sender::new(false),
            silence: AtomicBool::new(false),
            delivery_marker: Mutex::new(None),
            silenced: AtomicU64::new(0),
            cut_all: watch::Sender::new(0),
        });
        let (stop, stopped) = watch::channel(());
        let accepting = Arc::clone(&shared);
        tokio::spawn(async move {
            let mut stopped = stopped;
            loop {
                let accepted = tokio::select! {
                    _ = stopped.changed() => return,
                    accepted = listener.accept() => accepted,
                };
                let Ok((client, _)) = accepted else {
                    continue;
                };
                let shared = Arc::clone(&accepting);
                let stopped = stopped.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(target).await {
                        pipe(client, server, shared, stopped).await;
                    }
                });
            }
        });
        Ok(FaultProxy {
            addr,
            shared,
            _stop: stop,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Starts cutting connections.
    pub fn cut(&self) {
        self.shared.cutting.store(true, Ordering::Relaxed);
    }

    /// Stops cutting, and lets a stalled proxy forward again: connections made from now on, and those still open,
    /// are left alone.
    pub fn heal(&self) {
        self.shared.cutting.store(false, Ordering::Relaxed);
        *self.shared.marker.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.shared.stalled.send_replace(false);
    }

    /// Loses the reply of the next statement that carries `marker`: the connection that sent it is cut once the
    /// server says its transaction ended (committed, for a statement that did), before the client hears it. From
    /// then on the proxy forwards nothing, on any connection, new ones included, until `heal`: a client that tries
    /// again waits (for a pooled connection, say) as it would for a database that stopped answering.
    pub fn lose_reply_then_stall(&self, marker: &[u8]) {
        *self.shared.marker.lock().unwrap_or_else(|e| e.into_inner()) = Some(marker.to_vec());
    }

    /// Swallows the reply of the next statement that carries `marker`, and everything after it on that connection,
    /// which stays open: its client waits for an answer that never comes, as over a connection whose database
    /// vanished without closing it (a network that drops everything, a machine lost). The other connections, new
    /// ones included, go on as before.
    pub fn silence_reply(&self, marker: &[u8]) {
        self.shared.silence.store(true, Ordering::Relaxed);
        *self.shared.marker.lock().unwrap_or_else(|e| e.into_inner()) = Some(marker.to_vec());
    }

    /// Swallows the next message from the server that carries `marker` (a notification's payload, say), and
    /// everything after it on the connection it was for, which stays open: a client that only waits for what the
    /// server sends, and sends nothing itself (a `LISTEN`ing one), hears nothing more. The other connections, new
    /// ones included, go on as before.
    pub fn silence_delivery(&self, marker: &[u8]) {
        *self
            .shared
            .delivery_marker
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(marker.to_vec());
    }

    /// Forwards nothing more, either way, on any connection, new ones included, until `heal`: the database is
    /// unreachable, though no connection is closed (a partition). What was sent meanwhile goes through once healed,
    /// unless its connection was closed.
    pub fn stall(&self) {
        self.shared.stalled.send_replace(true);
    }

    /// Closes every connection open now, both sides at once, as a restart of the database server (or its sessions
    /// terminated) would; new connections go through as before. Statements on their way are lost with their
    /// connection, and so are replies: a commit may have happened whose answer never came.
    pub fn cut_all(&self) {
        self.shared
            .cut_all
            .send_modify(|generation| *generation += 1);
    }

    /// How many connections fell silent (`silence_reply`, `silence_delivery`).
    pub fn silenced(&self) -> u64 {
        self.shared.silenced.load(Ordering::Relaxed)
    }

    /// Whether a reply was lost and the proxy is stalled since.
    pub fn is_stalled(&self) -> bool {
        *self.shared.stalled.borrow()
    }

    /// How many connections were cut.
    pub fn cuts(&self) -> u64 {
        self.shared.cuts.load(Ordering::Relaxed)
    }
}

/// Forwards both ways until either side closes, the proxy stops, or a cut: then both sides are closed at once
/// (a chunk forwarded just before the cut arrived; the one that drew the cut never does).
async fn pipe(
    client: TcpStream,
    server: TcpStream,
    shared: Arc<Shared>,
    mut stopped: watch::Receiver<()>,
) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let mut cut_all = shared.cut_all.subscribe();
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    // Whether this connection sent the marker of the statement whose reply is lost.
    let marked = Arc::new(AtomicBool::new(false));
    let up = {
        let (shared, marked) = (Arc::clone(&shared), Arc::clone(&marked));
        async move {
            forward(
                &mut client_read,
                &mut server_write,
                &shared,
                Way::Up,
                &marked,
            )
            .await
        }
    };
    let down = async move {
        forward(
            &mut server_read,
            &mut client_write,
            &shared,
            Way::Down,
            &marked,
        )
        .await
    };
    tokio::select! {
        () = up => {}
        () = down => {}
        _ = stopped.changed() => {}
        _ = cut_all.changed() => {}
    }
}

/// Which way a chunk goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    /// From the client to the server.
    Up,
    /// From the server back to the client.
    Down,
}

async fn forward(
    from: &mut (impl AsyncReadExt + Unpin),
    to: &mut (impl AsyncWriteExt + Unpin),
    shared: &Shared,
    way: Way,
    marked: &AtomicBool,
) {
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        let Ok(read) = from.read(&mut buffer).await else {
            return;
        };
        if read == 0 || shared.cut_now() {
            return;
        }
        let chunk = &buffer[..read];
        if way == Way::Down && shared.takes_delivery_marker(chunk) {
            // The message, and all that follows, goes nowhere; the connection stays open for ever.
            shared.silenced.fetch_add(1, Ordering::Relaxed);
            while from.read(&mut buffer).await.is_ok_and(|read| read > 0) {}
            std::future::pending::<()>().await;
            return;
        }
        match way {
            Way::Up if shared.takes_marker(chunk) => marked.store(true, Ordering::Relaxed),
            Way::Down
                if marked.load(Ordering::Relaxed)
                    && chunk
                        .windows(READY_AND_IDLE.len())
                        .any(|w| w == READY_AND_IDLE) =>
            {
                if shared.silence.load(Ordering::Relaxed) {
                    // The reply, and all that follows, goes nowhere; the connection stays open for ever.
                    shared.silenced.fetch_add(1, Ordering::Relaxed);
                    while from.read(&mut buffer).await.is_ok_and(|read| read > 0) {}
                    std::future::pending::<()>().await;
                }
                // The transaction ended: its reply is lost with the connection, and nothing else goes through.
                shared.cuts.fetch_add(1, Ordering::Relaxed);
                shared.stalled.send_replace(true);
                return;
            }
            _ => {}
        }
        shared.unstalled().await;
        if to.write_all(chunk).await.is_err() {
            return;
        }
    }
}
