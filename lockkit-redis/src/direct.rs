//! A direct connection beside a single server's multiplexed one, for the
//! common case of one request at a time.
//!
//! redis-rs's multiplexed connection hands every request to a driver task
//! through a channel and the reply back through another: two task hand-offs
//! and their wake-ups on each round trip, whatever the load. A [`Direct`]
//! keeps one plain TCP connection that the requesting task writes to and
//! reads from itself. It serves one request at a time: a request that finds
//! it busy (or not open yet) goes over the multiplexed connection instead,
//! so concurrency and pipelining are unchanged.
//!
//! A request cut off (its timeout, or its caller gone) after it was sent
//! leaves its reply owed: the connection stays, the next request on it
//! reads the owed reply first, and until then every new request waits for
//! the connection instead of taking the multiplexed one. What a caller
//! sends after giving up on a request (the release of an acquire that timed
//! out, say) thus reaches the server after it, as on one connection. A
//! request cut off while being written, a failed one, or one too many owed
//! replies close the connection.
//!
//! The same holds the other way round: a request cut off on the multiplexed
//! connection may still be sent and answered there, so until a request sent
//! there after it has been answered, new requests take the multiplexed
//! connection too (see [`Ticket`]). A request that has to follow cut-off
//! requests on both connections first reads the direct one's owed replies,
//! then takes the multiplexed one.
//!
//! The connection opens in the background the first time a request finds
//! none (or finds it closed by the server), no sooner than [`RETRY_AFTER`]
//! after a failed opening.
//!
//! Requests are not bounded here: every caller of the lock operations runs
//! them within the command timeout (`RedisInstance::run`). Plain TCP only,
//! speaking RESP2: TLS, Unix sockets and RESP3 keep to the multiplexed
//! connection alone.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use redis::{Cmd, ConnectionAddr, ConnectionInfo, ProtocolVersion, RedisResult, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::OwnedMutexGuard;

/// How long after a failed opening the next one may start.
pub(crate) const RETRY_AFTER: Duration = Duration::from_secs(1);

/// Replies owed to cut-off requests beyond which the connection is closed.
const MAX_OWED: usize = 8;

/// Nesting deeper than this is not looked into by [`reply_end`]: the parser
/// gets what has arrived and says what is wrong with it.
const MAX_DEPTH: usize = 16;

/// The direct connection to one server, shared by the clones of its
/// multiplexed one.
pub(crate) struct Direct {
    /// The server, as the multiplexed connection dials it (an IPv6 host
    /// without brackets).
    host: String,
    port: u16,
    /// `host:port`, for the logs.
    addr: String,
    /// `AUTH` and `SELECT` as needed: the connection's first requests.
    hello: Vec<Cmd>,
    connect_timeout: Duration,
    /// The connection; `None` while closed.
    stream: Arc<tokio::sync::Mutex<Option<Stream>>>,
    /// Set while the connection owes replies to cut-off requests.
    owes: AtomicBool,
    /// The number of the last request cut off on the multiplexed connection
    /// while no request sent there after it has been answered; 0 when none.
    multiplexed_owes: AtomicU64,
    /// Requests cut off on the multiplexed connection so far.
    multiplexed_cuts: AtomicU64,
    opening: Mutex<Opening>,
}

/// Whether an opening is under way, and when the next may start.
struct Opening {
    running: bool,
    next: Instant,
}

/// An open connection and its buffers.
struct Stream {
    tcp: TcpStream,
    out: Vec<u8>,
    /// Bytes read and not parsed yet.
    replies: Vec<u8>,
    /// Replies to skip, owed to cut-off requests.
    owed: usize,
}

/// Where a request goes.
pub(crate) enum Route {
    /// Over the direct connection, free now.
    Direct(Lease),
    /// Over the direct connection once the requests ahead of it are done:
    /// it owes replies.
    Queue,
    /// Over the multiplexed connection.
    Multiplexed(Ticket),
}

impl Direct {
    /// The direct connection for `info`, or `None` where only the
    /// multiplexed connection may be used (TLS, a Unix socket, RESP3).
    pub(crate) fn new(
        info: &ConnectionInfo,
        tls: bool,
        connect_timeout: Duration,
    ) -> Option<Arc<Direct>> {
        let ConnectionAddr::Tcp(host, port) = info.addr() else {
            return None;
        };
        let settings = info.redis_settings();
        if tls || settings.protocol() != ProtocolVersion::RESP2 {
            return None;
        }
        let mut hello = Vec::new();
        if let Some(password) = settings.password() {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = settings.username() {
                auth.arg(user);
            }
            auth.arg(password);
            hello.push(auth);
        }
        if settings.db() != 0 {
            let mut select = redis::cmd("SELECT");
            select.arg(settings.db());
            hello.push(select);
        }
        Some(Arc::new(Direct {
            host: host.clone(),
            port: *port,
            addr: info.addr().to_string(),
            hello,
            connect_timeout,
            stream: Arc::new(tokio::sync::Mutex::new(None)),
            owes: AtomicBool::new(false),
            multiplexed_owes: AtomicU64::new(0),
            multiplexed_cuts: AtomicU64::new(0),
            opening: Mutex::new(Opening {
                running: false,
                next: Instant::now(),
            }),
        }))
    }

    /// Where the next request goes (see [`Route`]); starts opening the
    /// connection if it is closed.
    pub(crate) fn route(self: &Arc<Self>) -> Route {
        if self.owes.load(Ordering::Acquire) {
            return Route::Queue;
        }
        if self.multiplexed_owes() {
            return Route::Multiplexed(self.ticket());
        }
        let Ok(mut guard) = self.stream.clone().try_lock_owned() else {
            return Route::Multiplexed(self.ticket());
        };
        if let Some(stream) = guard.as_ref()
            && (stream.owed > 0 || stream.is_quiet())
        {
            return Route::Direct(Lease {
                direct: self.clone(),
                guard,
                phase: Phase::Writing,
            });
        }
        if guard.take().is_some() {
            // Closed by the server (a restart, an idle timeout).
            tracing::debug!(redis.address = %self.addr, "direct connection closed by the server");
        }
        drop(guard);
        self.reopen();
        Route::Multiplexed(self.ticket())
    }

    /// Whether a request cut off on the multiplexed connection may still be
    /// answered there.
    pub(crate) fn multiplexed_owes(&self) -> bool {
        self.multiplexed_owes.load(Ordering::Acquire) != 0
    }

    /// The ticket of a request about to go over the multiplexed connection.
    pub(crate) fn ticket(self: &Arc<Self>) -> Ticket {
        Ticket {
            direct: self.clone(),
            after: self.multiplexed_owes.load(Ordering::Acquire),
            done: false,
        }
    }

    /// Waits for the requests owed replies on the direct connection, if
    /// it owes any, to be answered: what is sent next over the multiplexed
    /// connection then reaches the server after them.
    pub(crate) async fn settle(self: &Arc<Self>) {
        if self.owes.load(Ordering::Acquire)
            && let Some(lease) = self.clone().queue().await
        {
            lease.settle().await;
        }
    }

    /// The connection once the requests ahead are done, if it is open.
    pub(crate) async fn queue(self: Arc<Self>) -> Option<Lease> {
        let guard = self.stream.clone().lock_owned().await;
        guard.as_ref()?;
        Some(Lease {
            direct: self,
            guard,
            phase: Phase::Writing,
        })
    }

    /// Starts opening the connection, unless an opening runs or the last
    /// failed less than [`RETRY_AFTER`] ago.
    fn reopen(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        {
            let mut opening = self.opening.lock().unwrap_or_else(PoisonError::into_inner);
            if opening.running || Instant::now() < opening.next {
                return;
            }
            opening.running = true;
        }
        runtime.spawn(Opener(Some(self.clone())).open());
    }

    async fn open(&self) -> bool {
        let opened = tokio::time::timeout(self.connect_timeout, self.dial()).await;
        let stream = match opened {
            Ok(Ok(stream)) => stream,
            Ok(Err(error)) => {
                tracing::debug!(redis.address = %self.addr, %error, "direct connection failed to open");
                return false;
            }
            Err(_) => {
                tracing::debug!(redis.address = %self.addr, "direct connection timed out opening");
                return false;
            }
        };
        tracing::debug!(redis.address = %self.addr, "direct connection open");
        *self.stream.lock().await = Some(stream);
        true
    }

    async fn dial(&self) -> RedisResult<Stream> {
        let tcp = TcpStream::connect((self.host.as_str(), self.port)).await?;
        tcp.set_nodelay(true)?;
        let mut stream = Stream {
            tcp,
            out: Vec::with_capacity(256),
            replies: Vec::with_capacity(256),
            owed: 0,
        };
        for cmd in &self.hello {
            stream.send(cmd).await?.extract_error()?;
        }
        Ok(stream)
    }

    fn opened(&self, ok: bool) {
        let mut opening = self.opening.lock().unwrap_or_else(PoisonError::into_inner);
        opening.running = false;
        opening.next = if ok {
            Instant::now()
        } else {
            Instant::now() + RETRY_AFTER
        };
    }
}

/// An opening under way. Dropped before it ends (its runtime shut down),
/// it lets the next request start another.
struct Opener(Option<Arc<Direct>>);

impl Opener {
    async fn open(mut self) {
        if let Some(direct) = self.0.clone() {
            let ok = direct.open().await;
            self.0 = None;
            direct.opened(ok);
        }
    }
}

impl Drop for Opener {
    fn drop(&mut self) {
        if let Some(direct) = self.0.take() {
            direct.opened(true);
        }
    }
}

/// How far a request got.
#[derive(Clone, Copy)]
enum Phase {
    Writing,
    Sent,
    Answered,
    Failed,
}

/// The connection, lent to one request. Dropped, it gives the connection
/// back: owing the request's reply if it was sent and not read, closed if
/// the request failed or was cut off while being written.
pub(crate) struct Lease {
    direct: Arc<Direct>,
    guard: OwnedMutexGuard<Option<Stream>>,
    phase: Phase,
}

impl Lease {
    /// Sends `cmd` and reads its reply (after the replies owed).
    pub(crate) async fn request(mut self, cmd: &Cmd) -> RedisResult<Value> {
        let result = self.exchange(cmd).await;
        self.finish(&result);
        result
    }

    /// Reads the replies owed and gives the connection back.
    pub(crate) async fn settle(mut self) {
        let result = match self.guard.as_mut() {
            Some(stream) => stream.read_owed().await,
            None => Ok(()),
        };
        self.finish(&result);
    }

    async fn exchange(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        let Some(stream) = self.guard.as_mut() else {
            return Err(io::Error::from(io::ErrorKind::NotConnected).into());
        };
        stream.write(cmd).await?;
        self.phase = Phase::Sent;
        stream.read_owed().await?;
        stream.read_reply().await
    }

    fn finish<T>(&mut self, result: &RedisResult<T>) {
        self.phase = if result.is_ok() {
            Phase::Answered
        } else {
            Phase::Failed
        };
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let owed = match (self.phase, self.guard.as_mut()) {
            (Phase::Answered, Some(stream)) => stream.owed,
            (Phase::Sent, Some(stream)) if stream.owed < MAX_OWED => {
                stream.owed += 1;
                stream.owed
            }
            _ => {
                if self.guard.take().is_some() {
                    tracing::debug!(redis.address = %self.direct.addr, "direct connection closed after a failed request");
                }
                0
            }
        };
        self.direct.owes.store(owed > 0, Ordering::Release);
    }
}

/// A request over the multiplexed connection, numbered by the cut-off
/// request it follows (0 for none). [`done`](Ticket::done) when its reply
/// (or error) is in, it tells that the cut-off requests sent before it have
/// been answered or dropped; dropped before that, it was cut off itself.
pub(crate) struct Ticket {
    direct: Arc<Direct>,
    after: u64,
    done: bool,
}

impl Ticket {
    /// Runs `request`, the one this ticket is for.
    pub(crate) async fn run<T>(self, request: impl Future<Output = T>) -> T {
        let answer = request.await;
        self.done();
        answer
    }

    fn done(mut self) {
        self.done = true;
        if self.after != 0 {
            // Unless another request was cut off since.
            let _ = self.direct.multiplexed_owes.compare_exchange(
                self.after,
                0,
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.done {
            let cut = self.direct.multiplexed_cuts.fetch_add(1, Ordering::Relaxed) + 1;
            self.direct.multiplexed_owes.store(cut, Ordering::Release);
        }
    }
}

impl Stream {
    /// Whether nothing has arrived since the last reply: not the end of
    /// the stream, an error or stray bytes. Costs no system call unless
    /// the stream was marked readable.
    fn is_quiet(&self) -> bool {
        matches!(self.tcp.try_read(&mut [0u8; 1]), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    async fn write(&mut self, cmd: &Cmd) -> RedisResult<()> {
        self.out.clear();
        cmd.write_packed_command(&mut self.out);
        self.tcp.write_all(&self.out).await?;
        Ok(())
    }

    /// Sends `cmd` and reads its reply.
    async fn send(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        self.write(cmd).await?;
        self.read_reply().await
    }

    /// Reads (and drops) the replies owed to cut-off requests.
    async fn read_owed(&mut self) -> RedisResult<()> {
        while self.owed > 0 {
            self.read_reply().await?;
            self.owed -= 1;
        }
        Ok(())
    }

    /// Reads the next whole reply.
    async fn read_reply(&mut self) -> RedisResult<Value> {
        loop {
            if let Some(end) = reply_end(&self.replies, 0, 0) {
                let reply = parse(&self.replies[..end]);
                self.replies.drain(..end);
                return reply;
            }
            self.replies.reserve(256);
            if self.tcp.read_buf(&mut self.replies).await? == 0 {
                return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
            }
        }
    }
}

/// Where the line that starts at `at` ends: the index of its `\r\n`.
fn line_end(buf: &[u8], at: usize) -> Option<usize> {
    let newline = at + buf.get(at..)?.iter().position(|&b| b == b'\n')?;
    (newline > at && buf[newline - 1] == b'\r').then(|| newline - 1)
}

/// A whole reply read: the common kinds (`+OK`, integers, bulk strings
/// and nil) here, the others by redis-rs's parser.
fn parse(reply: &[u8]) -> RedisResult<Value> {
    match common(reply) {
        Some(value) => Ok(value),
        None => redis::parse_redis_value(reply),
    }
}

/// A reply of a common kind, as redis-rs's parser reads it; `None` for
/// any other, or anything unexpected.
fn common(reply: &[u8]) -> Option<Value> {
    let line = line_end(reply, 0)?;
    let head = std::str::from_utf8(reply.get(1..line)?).ok()?;
    let whole_line = line + 2 == reply.len();
    match reply[0] {
        b':' if whole_line => head.parse().ok().map(Value::Int),
        b'+' if whole_line && head == "OK" => Some(Value::Okay),
        b'$' if whole_line && head == "-1" => Some(Value::Nil),
        b'$' => {
            let len: usize = head.parse().ok()?;
            let data = reply.get(line + 2..)?.strip_suffix(b"\r\n")?;
            (data.len() == len).then(|| Value::BulkString(data.to_vec()))
        }
        _ => None,
    }
}

/// Where the reply that starts at `at` ends, if all of it is in `buf`.
/// A reply of an unknown type (or nested deeper than [`MAX_DEPTH`]) ends,
/// as far as this goes, at its first line's end: the parser then says what
/// is wrong with it.
fn reply_end(buf: &[u8], at: usize, depth: usize) -> Option<usize> {
    let kind = *buf.get(at)?;
    let line = line_end(buf, at)?;
    let next = line + 2;
    let count = || -> Option<i64> { std::str::from_utf8(&buf[at + 1..line]).ok()?.parse().ok() };
    match kind {
        // Bulk strings, verbatim strings, bulk errors: a length, then data.
        b'$' | b'=' | b'!' => match count() {
            Some(len) if len >= 0 => {
                let end = next
                    .checked_add(usize::try_from(len).ok()?)?
                    .checked_add(2)?;
                (buf.len() >= end).then_some(end)
            }
            _ => Some(next),
        },
        // Arrays, sets, pushes; maps and attributes hold pairs.
        b'*' | b'~' | b'>' | b'%' | b'|' if depth < MAX_DEPTH => match count() {
            Some(len) if len > 0 => {
                let items = if matches!(kind, b'%' | b'|') {
                    len.checked_mul(2)?
                } else {
                    len
                };
                let mut end = next;
                for _ in 0..items {
                    end = reply_end(buf, end, depth + 1)?;
                }
                Some(end)
            }
            _ => Some(next),
        },
        _ => Some(next),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn direct() -> Arc<Direct> {
        let info: ConnectionInfo = "redis://127.0.0.1:1/".parse().unwrap();
        Direct::new(&info, false, Duration::from_secs(1)).unwrap()
    }

    /// Whether the next request goes over the multiplexed connection; it
    /// is answered.
    fn goes_multiplexed(direct: &Arc<Direct>) -> bool {
        match direct.route() {
            Route::Multiplexed(ticket) => {
                ticket.done();
                true
            }
            _ => false,
        }
    }

    /// A request cut off on the multiplexed connection keeps the next ones
    /// there until one sent after it is answered; one sent before it, or
    /// one that follows an earlier cut, does not end that.
    #[test]
    fn a_cut_off_multiplexed_request_keeps_the_next_ones_behind_it() {
        let direct = direct();
        let before = direct.ticket();
        drop(direct.ticket());
        assert!(direct.multiplexed_owes());
        let after = direct.ticket();
        before.done();
        assert!(direct.multiplexed_owes(), "answered before the cut");
        let cut_again = direct.ticket();
        drop(direct.ticket());
        after.done();
        assert!(
            direct.multiplexed_owes(),
            "another request was cut off since"
        );
        cut_again.done();
        assert!(direct.multiplexed_owes());
        assert!(goes_multiplexed(&direct));
        assert!(!direct.multiplexed_owes());
    }

    #[test]
    fn a_reply_ends_where_its_last_part_does() {
        let whole: &[&[u8]] = &[
            b"+OK\r\n",
            b"-ERR no\r\n",
            b":-42\r\n",
            b"$-1\r\n",
            b"$0\r\n\r\n",
            b"$5\r\nab\r\nc\r\n",
            b"*-1\r\n",
            b"*0\r\n",
            b"*2\r\n:1\r\n$3\r\nabc\r\n",
            b"*2\r\n*1\r\n+a\r\n$-1\r\n",
            b"%1\r\n+k\r\n:1\r\n",
        ];
        for reply in whole {
            assert_eq!(reply_end(reply, 0, 0), Some(reply.len()), "{reply:?}");
            for cut in 0..reply.len() {
                assert_eq!(
                    reply_end(&reply[..cut], 0, 0),
                    None,
                    "{reply:?} cut at {cut}"
                );
            }
        }
    }

    #[test]
    fn common_replies_read_as_redis_rs_reads_them() {
        let replies: &[&[u8]] = &[
            b"+OK\r\n",
            b"+QUEUED\r\n",
            b":0\r\n",
            b":-9223372036854775808\r\n",
            b":99999999999999999999\r\n",
            b"$-1\r\n",
            b"$0\r\n\r\n",
            b"$4\r\na\r\nb\r\n",
            b"$3\r\nab\r\n",
            b"$+3\r\nabc\r\n",
            b"-NOSCRIPT No matching script.\r\n",
            b"*2\r\n:1\r\n$-1\r\n",
        ];
        for reply in replies {
            let ours = parse(reply);
            let theirs = redis::parse_redis_value(reply);
            assert_eq!(
                format!("{ours:?}"),
                format!("{theirs:?}"),
                "{}",
                String::from_utf8_lossy(reply)
            );
        }
    }

    #[test]
    fn malformed_replies_reach_the_parser() {
        for reply in [&b"?what\r\n"[..], b"$x\r\n", b"*x\r\n"] {
            let end = reply_end(reply, 0, 0).expect("a first line");
            assert_eq!(end, reply.len());
            assert!(
                redis::parse_redis_value(&reply[..end]).is_err(),
                "{reply:?}"
            );
        }
        let huge = b"$99999999999999999999\r\n";
        assert_eq!(reply_end(huge, 0, 0), Some(huge.len()));
        let deep = "*1\r\n".repeat(MAX_DEPTH + 4);
        assert!(reply_end(deep.as_bytes(), 0, 0).is_some());
    }
}
