//! The fenced resource: a loopback TCP service that the workers' critical
//! sections write to. It rejects a write whose fencing token is lower than the
//! last one it accepted (the check the crate docs teach), and it stamps every
//! step a worker reports, on one clock, for the checker and the timeline.
//!
//! Protocol, one line per message, worker to resource:
//! `hello CLIENT`, then `attempt S`, `acquired S TOKEN`, `write S TOKEN I`
//! (answered `ok` or `stale LAST`), `failed S KIND`, `lost S`,
//! `released S ok|err`; `TOKEN` is `-` without fencing.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::record::StoreRecord;
use crate::record::{Fault, Kind, Micros, Record, Trace};
use crate::stores::FenceStores;

/// The resource and the run's record; see the module docs. Stops when dropped.
#[derive(Debug)]
pub struct Resource {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: JoinHandle<()>,
}

#[derive(Debug)]
struct Shared {
    started: Instant,
    state: Mutex<State>,
    /// The client and section of the latest accepted first write.
    section_starts: watch::Sender<Option<(u32, u32)>>,
    /// Sections released after all their writes were accepted.
    completed: watch::Sender<u64>,
    /// The real stores every fenced write also goes to, and this run's
    /// resource name there.
    stores: Option<(Arc<FenceStores>, String)>,
}

#[derive(Debug, Default)]
struct State {
    records: Vec<Record>,
    faults: Vec<Fault>,
    /// The highest token accepted so far.
    last_token: Option<u64>,
    /// Per client: the current section had a rejected write.
    spoiled: Vec<(u32, u32)>,
    /// What the real stores made of the fenced writes.
    stores: Vec<StoreRecord>,
}

impl Shared {
    fn now(&self) -> Micros {
        u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies one write: the fencing check, then the record.
    fn write(&self, client: u32, section: u32, token: Option<u64>, index: u32) -> Option<u64> {
        let mut state = self.state();
        let at = self.now();
        let stale_against = match (token, state.last_token) {
            (Some(token), Some(last)) if token < last => Some(last),
            _ => None,
        };
        let accepted = stale_against.is_none();
        if let (true, Some(token)) = (accepted, token) {
            state.last_token = Some(token);
        }
        if !accepted && !state.spoiled.contains(&(client, section)) {
            state.spoiled.push((client, section));
        }
        state.records.push(Record {
            at,
            client,
            section,
            kind: Kind::Write {
                token,
                index,
                accepted,
            },
        });
        drop(state);
        if accepted && index == 0 {
            self.section_starts.send_replace(Some((client, section)));
        }
        stale_against
    }

    fn record(&self, client: u32, section: u32, kind: Kind) {
        let mut state = self.state();
        let complete = kind == Kind::Released(true) && !state.spoiled.contains(&(client, section));
        let at = self.now();
        state.records.push(Record {
            at,
            client,
            section,
            kind,
        });
        drop(state);
        if complete {
            self.completed.send_modify(|n| *n += 1);
        }
    }
}

impl Resource {
    /// Listens on a free port of `127.0.0.1`; the run's clock starts now.
    /// With `stores`, every fenced write also goes, fenced, to those real
    /// stores, under the resource name given.
    pub async fn start(stores: Option<(Arc<FenceStores>, String)>) -> io::Result<Resource> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            started: Instant::now(),
            state: Mutex::default(),
            section_starts: watch::Sender::new(None),
            completed: watch::Sender::new(0),
            stores,
        });
        let acceptor = tokio::spawn(accept_loop(listener, Arc::clone(&shared)));
        Ok(Resource {
            addr,
            shared,
            acceptor,
        })
    }

    /// Where the workers connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The run's clock.
    pub fn now(&self) -> Micros {
        self.shared.now()
    }

    /// Waits for the next critical section to start (its first write
    /// accepted) and returns its worker: the current holder. `None` when no
    /// section started within `timeout`.
    pub async fn next_section_start(&self, timeout: Duration) -> Option<u32> {
        self.next_section_granted_after(0, timeout).await
    }

    /// Like [`next_section_start`](Self::next_section_start), but only a
    /// section whose lock was granted (reported acquired) after `after`.
    pub async fn next_section_granted_after(
        &self,
        after: Micros,
        timeout: Duration,
    ) -> Option<u32> {
        let mut starts = self.shared.section_starts.subscribe();
        starts.mark_unchanged();
        let wait = async {
            loop {
                starts.changed().await.ok()?;
                let Some((client, section)) = *starts.borrow_and_update() else {
                    continue;
                };
                let granted = self.shared.state().records.iter().any(|r| {
                    r.client == client
                        && r.section == section
                        && matches!(r.kind, Kind::Acquired(_))
                        && r.at > after
                });
                if granted {
                    return Some(client);
                }
            }
        };
        tokio::time::timeout(timeout, wait).await.ok().flatten()
    }

    /// Sections released after all their writes were accepted, so far.
    pub fn completed(&self) -> u64 {
        *self.shared.completed.borrow()
    }

    /// Waits until `n` sections have completed in all; `false` on timeout.
    pub async fn wait_completed(&self, n: u64, timeout: Duration) -> bool {
        let mut completed = self.shared.completed.subscribe();
        tokio::time::timeout(timeout, completed.wait_for(|done| *done >= n))
            .await
            .is_ok_and(|result| result.is_ok())
    }

    /// Notes a fault that began at `start` and was healed now.
    pub fn fault(&self, label: impl Into<String>, start: Micros) {
        let end = self.now();
        let label = label.into();
        tracing::info!(fault = %label, "injected");
        self.shared.state().faults.push(Fault { label, start, end });
    }

    /// A copy of everything recorded so far.
    pub fn trace(&self, clients: u32) -> Trace {
        let state = self.shared.state();
        Trace {
            records: state.records.clone(),
            faults: state.faults.clone(),
            clients,
            duration: self.now(),
            stores: state.stores.clone(),
        }
    }
}

impl Drop for Resource {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    while let Ok((stream, _)) = listener.accept().await {
        tokio::spawn(serve(stream, Arc::clone(&shared)));
    }
}

fn token_field(field: Option<&str>) -> Option<Option<u64>> {
    match field? {
        "-" => Some(None),
        value => value.parse().ok().map(Some),
    }
}

fn number(field: Option<&str>) -> Option<u32> {
    field?.parse().ok()
}

/// One worker's connection; a malformed line ends it (the worker is ours).
async fn serve(stream: TcpStream, shared: Arc<Shared>) {
    let _ = stream.set_nodelay(true);
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    let mut client = None;
    while let Ok(Some(line)) = lines.next_line().await {
        let mut fields = line.split_ascii_whitespace();
        let verb = fields.next().unwrap_or_default();
        if verb == "hello" {
            client = number(fields.next());
            continue;
        }
        let (Some(client), Some(section)) = (client, number(fields.next())) else {
            tracing::warn!("resource: bad line {line:?}");
            return;
        };
        let kind = match verb {
            "attempt" => Kind::Attempt,
            "acquired" => match token_field(fields.next()) {
                Some(token) => Kind::Acquired(token),
                None => return,
            },
            "write" => {
                let (Some(token), Some(index)) =
                    (token_field(fields.next()), number(fields.next()))
                else {
                    return;
                };
                let reply = match shared.write(client, section, token, index) {
                    None => "ok\n".to_owned(),
                    Some(last) => format!("stale {last}\n"),
                };
                if let (Some((stores, resource)), Some(token)) = (&shared.stores, token) {
                    let writes = stores
                        .write(resource, client, section, token, || shared.now())
                        .await;
                    shared.state().stores.push(StoreRecord {
                        client,
                        section,
                        writes,
                    });
                }
                if write.write_all(reply.as_bytes()).await.is_err() {
                    return;
                }
                continue;
            }
            "failed" => Kind::Failed(fields.next().unwrap_or("error").to_owned()),
            "lost" => Kind::Lost,
            "risk" => Kind::AtRisk,
            "signal" => Kind::LostSignal,
            "released" => Kind::Released(fields.next() == Some("ok")),
            _ => {
                tracing::warn!("resource: bad line {line:?}");
                return;
            }
        };
        shared.record(client, section, kind);
    }
}
