//! A TCP proxy that cuts the connections through it, for fault-injection tests: put between the gateway and its
//! database, it makes statements fail mid-flight and replies go missing after a commit, as a flaky network or a
//! restarting server would.
//!
//! Cuts are decided by a seeded generator (the same seed cuts the same way, given the same traffic), and stop
//! when the proxy is told to heal or is dropped.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

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
}

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

    /// Stops cutting: connections made from now on, and those still open, are left alone.
    pub fn heal(&self) {
        self.shared.cutting.store(false, Ordering::Relaxed);
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
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let up = {
        let shared = Arc::clone(&shared);
        async move { forward(&mut client_read, &mut server_write, &shared).await }
    };
    let down = async move { forward(&mut server_read, &mut client_write, &shared).await };
    tokio::select! {
        () = up => {}
        () = down => {}
        _ = stopped.changed() => {}
    }
}

async fn forward(
    from: &mut (impl AsyncReadExt + Unpin),
    to: &mut (impl AsyncWriteExt + Unpin),
    shared: &Shared,
) {
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        let Ok(read) = from.read(&mut buffer).await else {
            return;
        };
        if read == 0 || shared.cut_now() {
            return;
        }
        if to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}
