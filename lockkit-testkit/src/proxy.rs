//! A loopback TCP proxy that injects network faults between a client and a
//! server: added latency, a blackhole (a partition: nothing passes, in either
//! direction, until it heals), connections reset, new connections refused.
//! No root and no firewall rules: the client is pointed at the proxy's port
//! instead of the server's.

use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How long the proxy waits for the upstream server to accept a connection.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Chunks read but not yet written, per direction of one connection.
const IN_FLIGHT_CHUNKS: usize = 64;

/// A TCP proxy on `127.0.0.1` in front of one upstream address, with faults
/// switched on and off at run time. It runs on the current tokio runtime and
/// stops (closing every connection) when dropped.
///
/// * [`set_delay`](Self::set_delay): every chunk is delivered that much later
///   (latency, not a bandwidth cap: chunks keep their order and flow).
/// * [`blackhole`](Self::blackhole): nothing is forwarded in either direction
///   while it is on, and new connections hang instead of reaching the
///   server. Bytes are held, not lost, like TCP across a partition that heals
///   before its connections time out: when it is turned off, what was held is
///   delivered. Call [`reset_connections`](Self::reset_connections) during
///   the blackhole to lose it instead.
/// * [`reset_connections`](Self::reset_connections): every current
///   connection is closed with a TCP reset on both sides.
/// * [`refuse`](Self::refuse): new connections are closed at once.
///
/// ```no_run
/// # async fn demo(server: std::net::SocketAddr) -> std::io::Result<()> {
/// use lockkit_testkit::TcpProxy;
///
/// let proxy = TcpProxy::start(server).await?;
/// let url = format!("redis://{}", proxy.addr()); // the client talks to the proxy
/// proxy.blackhole(true); // partition the client from the server…
/// proxy.blackhole(false); // …and heal it
/// # Ok(()) }
/// ```
pub struct TcpProxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    acceptor: JoinHandle<()>,
}

struct Shared {
    delay_micros: AtomicU64,
    refuse: AtomicBool,
    /// `true` while traffic may pass.
    open: watch::Sender<bool>,
    /// Bumped by every reset; connections watch it.
    resets: watch::Sender<u64>,
    connections: AtomicU64,
}

impl fmt::Debug for TcpProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpProxy")
            .field("addr", &self.addr)
            .field("upstream", &self.upstream)
            .field("delay", &self.delay())
            .field("blackholed", &!*self.shared.open.borrow())
            .field("refusing", &self.shared.refuse.load(Ordering::Relaxed))
            .finish()
    }
}

impl TcpProxy {
    /// Listens on a free port of `127.0.0.1` and forwards every connection to
    /// `upstream`, with no fault switched on.
    pub async fn start(upstream: SocketAddr) -> io::Result<TcpProxy> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            delay_micros: AtomicU64::new(0),
            refuse: AtomicBool::new(false),
            open: watch::Sender::new(true),
            resets: watch::Sender::new(0),
            connections: AtomicU64::new(0),
        });
        let acceptor = tokio::spawn(accept_loop(listener, upstream, Arc::clone(&shared)));
        tracing::debug!(%addr, %upstream, "proxy started");
        Ok(TcpProxy {
            addr,
            upstream,
            shared,
            acceptor,
        })
    }

    /// The proxy's own address: give this to the client.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The proxy's port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The server the proxy forwards to.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// Connections accepted so far (refused ones included).
    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::Relaxed)
    }

    /// Delivers every chunk `delay` after it was read (zero: no delay).
    pub fn set_delay(&self, delay: Duration) {
        let micros = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        self.shared.delay_micros.store(micros, Ordering::Relaxed);
    }

    /// The current added delay.
    pub fn delay(&self) -> Duration {
        Duration::from_micros(self.shared.delay_micros.load(Ordering::Relaxed))
    }

    /// Partitions (`true`) or heals (`false`) the link; see the type's docs.
    pub fn blackhole(&self, on: bool) {
        tracing::debug!(addr = %self.addr, on, "proxy blackhole");
        self.shared.open.send_replace(!on);
    }

    /// Closes every current connection with a TCP reset on both sides; data
    /// held by a blackhole is lost. New connections are not affected.
    pub fn reset_connections(&self) {
        tracing::debug!(addr = %self.addr, "proxy resets its connections");
        self.shared
            .resets
            .send_modify(|generation| *generation += 1);
    }

    /// Closes new connections at once (`true`) or accepts them again.
    pub fn refuse(&self, on: bool) {
        self.shared.refuse.store(on, Ordering::Relaxed);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.acceptor.abort();
        // Connections end with the reset generation's sender: see `relay`.
        self.shared
            .resets
            .send_modify(|generation| *generation += 1);
    }
}

async fn accept_loop(listener: TcpListener, upstream: SocketAddr, shared: Arc<Shared>) {
    loop {
        let client = match listener.accept().await {
            Ok((client, _)) => client,
            Err(e) => {
                tracing::warn!("proxy accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        // Subscribed here, before the connection is counted: a reset that
        // comes once it is counted reaches it, however late its relay
        // task first runs.
        let resets = shared.resets.subscribe();
        shared.connections.fetch_add(1, Ordering::Relaxed);
        if shared.refuse.load(Ordering::Relaxed) {
            drop(client);
            continue;
        }
        tokio::spawn(relay(client, upstream, Arc::clone(&shared), resets));
    }
}

/// One proxied connection: waits out a blackhole, connects upstream, then
/// pumps both directions until either side closes or a reset comes.
async fn relay(
    client: TcpStream,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    mut resets: watch::Receiver<u64>,
) {
    let mut open = shared.open.subscribe();
    let reset_since = resets.clone();
    let connect = async {
        // A partitioned client cannot reach the server: hold the connection.
        let _ = open.wait_for(|open| *open).await;
        // A reset that came before the heal wins over it, also when this
        // task saw no reset in the poll that saw the heal (see `came`).
        if came(&reset_since) {
            return None;
        }
        Some(tokio::time::timeout(UPSTREAM_CONNECT_TIMEOUT, TcpStream::connect(upstream)).await)
    };
    // Biased: a reset that came before the heal wins over the heal, even
    // when both are seen in the same poll (a random pick would connect).
    let server = tokio::select! {
        biased;
        _ = resets.changed() => return reset(&client),
        result = connect => match result {
            Some(Ok(Ok(server))) => server,
            None => return reset(&client),
            // Upstream down or not answering: the client sees a closed connection.
            _ => return,
        },
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::join!(
        pump(client_read, server_write, &shared, resets.clone()),
        pump(server_read, client_write, &shared, resets),
    );
}

/// Whether a reset came since `resets` last looked (or the proxy is gone).
///
/// Checked once the link is open, just before what a heal lets through: a
/// reset followed at once by a heal (`reset_connections`, then
/// `blackhole(false)`) can straddle a poll of a task on another thread,
/// which then saw no reset when it looked for one, and the heal when it
/// looked at the link. The reset was made before the heal, so whoever sees
/// the heal sees the reset here.
fn came(resets: &watch::Receiver<u64>) -> bool {
    resets.has_changed().unwrap_or(true)
}

/// Makes the socket's close send a reset, then lets the caller drop it.
fn reset(stream: &TcpStream) {
    let _ = stream.set_zero_linger();
}

enum Step {
    Written,
    Ended,
    Reset,
}

/// Copies `from` to `to`, chunk by chunk, honouring the delay and the
/// blackhole; shuts `to`'s write side down when `from` ends, and closes it
/// with a reset when a reset comes.
async fn pump(
    from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    shared: &Shared,
    mut resets: watch::Receiver<u64>,
) {
    let (chunks, mut in_flight) = mpsc::channel::<(Instant, Vec<u8>)>(IN_FLIGHT_CHUNKS);
    let reader = async move {
        let mut from = from;
        let mut open = shared.open.subscribe();
        let mut buffer = vec![0_u8; 16 * 1024];
        loop {
            if open.wait_for(|open| *open).await.is_err() {
                break;
            }
            let n = match from.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if chunks
                .send((Instant::now(), buffer[..n].to_vec()))
                .await
                .is_err()
            {
                break;
            }
        }
    };
    let writer = async {
        let mut open = shared.open.subscribe();
        let reset_since = resets.clone();
        loop {
            let step = async {
                let Some((read_at, chunk)) = in_flight.recv().await else {
                    return Step::Ended;
                };
                let delay = Duration::from_micros(shared.delay_micros.load(Ordering::Relaxed));
                tokio::time::sleep_until(read_at + delay).await;
                if open.wait_for(|open| *open).await.is_err() {
                    return Step::Ended;
                }
                if came(&reset_since) {
                    return Step::Reset;
                }
                if to.write_all(&chunk).await.is_err() {
                    return Step::Ended;
                }
                Step::Written
            };
            // Biased, as in `relay`: held data that a reset dropped must not
            // be written because the heal came in the same poll.
            let step = tokio::select! {
                biased;
                _ = resets.changed() => Step::Reset,
                step = step => step,
            };
            match step {
                Step::Written => {}
                Step::Ended => {
                    let _ = to.shutdown().await;
                    return;
                }
                Step::Reset => {
                    let _ = to.as_ref().set_zero_linger();
                    return;
                }
            }
        }
    };
    // The pump ends with its writer (an end, an error or a reset), which
    // drops the reader; a reader that ends first lets the writer deliver
    // what was read, then shut the write side down.
    tokio::pin!(reader, writer);
    tokio::select! {
        () = &mut writer => return,
        () = &mut reader => {}
    }
    writer.await;
}
