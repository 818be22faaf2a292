//! Real etcd servers on free loopback ports, for tests: one node
//! ([`EtcdServer`]) or a cluster of them forming a quorum ([`EtcdCluster`]).
//!
//! The server is Debian's `etcd` (package `etcd-server`, 3.4), run as a child
//! process with its own data directory; `etcdctl` (package `etcd-client`)
//! talks to it for the interop tests. The heartbeat (50 ms) and election
//! timeout (500 ms) are shorter than etcd's defaults, so the smallest lease
//! the server grants is one second (etcd's minimum lease TTL is 1.5
//! election timeouts).

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::netns::Fabric;
use crate::process::{
    ProcessSlot, Readiness, ServerError, free_port, memory_temp_dir, resolve_binary,
    retry_on_taken_port,
};
use crate::server::{FaultControl, one_process_server};

/// Environment variable that overrides the `etcd` binary.
const BINARY_ENV: &str = "LOCKKIT_ETCD";
/// Environment variable that overrides the `etcdctl` binary.
const CTL_ENV: &str = "LOCKKIT_ETCDCTL";
const INSTALL_HINT: &str =
    "run scripts/install-services.sh (or: apt-get install -y etcd-server etcd-client)";
const READINESS: Readiness = Readiness::ms(20000, 500, 25);
const LOG_FILE: &str = "etcd.log";
const OUTPUT_FILE: &str = "etcd.stdout.log";
const DATA_DIR: &str = "data";
/// How long one `etcdctl` run may take.
const CTL_TIMEOUT: Duration = Duration::from_secs(10);

/// One etcd server bound to `127.0.0.1` (a client port and a peer port),
/// with its own temporary directory (`data/`, `etcd.log`), in `/dev/shm`
/// where there is one: etcd syncs every write, and the tests measure the
/// lock, not the disk.
///
/// The process is killed when the `EtcdServer` is dropped, and also when the
/// test process dies (even if the server lives in a static). Fault
/// injection: [`pause`](FaultControl::pause) (SIGSTOP),
/// [`resume`](FaultControl::resume), [`kill`](FaultControl::kill) and
/// [`restart`](FaultControl::restart) on the same ports with the same data
/// directory (etcd persists its write-ahead log there, so data survives).
pub struct EtcdServer {
    port: u16,
    /// 127.0.0.1, or the address of its network namespace.
    host: Ipv4Addr,
    peer_port: u16,
    /// Where `/health` answers in plain HTTP, whether or not the client
    /// port speaks TLS.
    metrics_port: u16,
    tls: Option<EtcdServerTls>,
    /// The member's name, and the initial cluster (`name=peer URL,…`).
    name: String,
    cluster: String,
    binary: PathBuf,
    process: ProcessSlot,
    dir: TempDir,
}

impl EtcdServer {
    /// The last `lines` lines of the server's log.
    pub fn log_tail(&self, lines: usize) -> String {
        crate::process::log_tail(
            &self.dir.path().join(LOG_FILE),
            &self.dir.path().join(OUTPUT_FILE),
            lines,
        )
    }

    /// `127.0.0.1:PORT`, the client endpoint, as `etcdctl --endpoints`
    /// takes it.
    pub fn endpoint(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// Runs `etcdctl --endpoints <this server> ARGS…` (API v3) and returns
    /// its standard output; an error with its standard error when it fails
    /// or takes longer than 10 s.
    pub async fn etcdctl(&self, args: &[&str]) -> io::Result<String> {
        let ctl = resolve_binary(None, CTL_ENV, "etcdctl", INSTALL_HINT)
            .map_err(|e| io::Error::new(io::ErrorKind::NotFound, e.to_string()))?;
        let mut command = tokio::process::Command::new(ctl);
        command
            .env("ETCDCTL_API", "3")
            .arg("--endpoints")
            .arg(self.endpoint())
            .args(args)
            .kill_on_drop(true);
        let output = tokio::time::timeout(CTL_TIMEOUT, command.output())
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "etcdctl took over 10 s"))??;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(io::Error::other(format!(
                "etcdctl {args:?}: {}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )))
        }
    }

    /// The path of `etcdctl`, for tests that run it as a long-lived peer
    /// (e.g. `etcdctl lock NAME CMD`).
    pub fn etcdctl_binary() -> Result<PathBuf, ServerError> {
        resolve_binary(None, CTL_ENV, "etcdctl", INSTALL_HINT)
    }

    fn what(&self) -> String {
        format!("etcd {} on {}", self.name, self.endpoint())
    }

    /// `n` members of one cluster, on fresh ports, not started yet; member
    /// `i` in namespace `i` of `fabric` if there is one.
    fn members(
        binary: &Path,
        n: usize,
        fabric: Option<&Arc<Fabric>>,
    ) -> Result<Vec<EtcdServer>, ServerError> {
        let host = |i: usize| fabric.map_or(Ipv4Addr::LOCALHOST, |fabric| fabric.ip(i));
        let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
        let cluster = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("n{}=http://{}:{peer}", i + 1, host(i)))
            .collect::<Vec<_>>()
            .join(",");
        let mut servers = Vec::with_capacity(n);
        for (i, (port, peer_port)) in ports.into_iter().enumerate() {
            servers.push(EtcdServer {
                port,
                host: host(i),
                peer_port,
                metrics_port: free_port(),
                tls: None,
                name: format!("n{}", i + 1),
                cluster: cluster.clone(),
                binary: binary.to_path_buf(),
                process: ProcessSlot::default()
                    .with_netns(fabric.map(|fabric| (fabric.clone(), i))),
                dir: memory_temp_dir("lockkit-etcd-", "etcd")?,
            });
        }
        Ok(servers)
    }

    fn etcd_args(&self) -> Vec<String> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let client = format!("{scheme}://{}:{}", self.host, self.port);
        let peer = format!("http://{}:{}", self.host, self.peer_port);
        let data = self.dir.path().join(DATA_DIR);
        let path = |p: &Path| p.to_string_lossy().into_owned();
        let mut tls = Vec::new();
        if let Some(files) = &self.tls {
            tls.extend([
                "--cert-file".into(),
                path(&files.cert_file),
                "--key-file".into(),
                path(&files.key_file),
            ]);
            if let Some(ca) = &files.client_ca_file {
                tls.extend([
                    "--client-cert-auth".into(),
                    "--trusted-ca-file".into(),
                    path(ca),
                ]);
            }
        }
        let args = vec![
            "--name".into(),
            self.name.clone(),
            "--data-dir".into(),
            data.to_string_lossy().into_owned(),
            "--listen-client-urls".into(),
            client.clone(),
            "--advertise-client-urls".into(),
            client,
            "--listen-peer-urls".into(),
            peer.clone(),
            "--initial-advertise-peer-urls".into(),
            peer,
            "--initial-cluster".into(),
            self.cluster.clone(),
            "--initial-cluster-state".into(),
            "new".into(),
            "--heartbeat-interval".into(),
            "50".into(),
            "--election-timeout".into(),
            "500".into(),
            "--logger".into(),
            "zap".into(),
            "--log-outputs".into(),
            self.dir
                .path()
                .join(LOG_FILE)
                .to_string_lossy()
                .into_owned(),
            "--listen-metrics-urls".into(),
            format!("http://{}:{}", self.host, self.metrics_port),
        ];
        args.into_iter().chain(tls).collect()
    }

    /// Spawns the process (killing a running one first) and waits until
    /// `/health` answers healthy; on failure kills it again.
    async fn launch(&self) -> Result<(), ServerError> {
        let mut command = Command::new(&self.binary);
        command.args(self.etcd_args()).current_dir(self.dir.path());
        let addr = SocketAddr::from((self.host, self.metrics_port));
        let (log, output) = (
            self.dir.path().join(LOG_FILE),
            self.dir.path().join(OUTPUT_FILE),
        );
        self.process
            .launch(&self.what(), &command, &log, &output, READINESS, |_pid| {
                healthy(addr)
            })
            .await
    }
}

/// Whether the server's metrics listener on `addr` answers `GET /health` with
/// `"health":"true"` (it does once it has a leader and applied its log).
async fn healthy(addr: SocketAddr) -> bool {
    let answer = async {
        let mut stream = TcpStream::connect(addr).await?;
        stream
            .write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .await?;
        let mut body = Vec::new();
        stream.read_to_end(&mut body).await?;
        io::Result::Ok(String::from_utf8_lossy(&body).into_owned())
    };
    matches!(answer.await, Ok(body) if body.contains("\"health\":\"true\""))
}

/// Server-side TLS of an [`EtcdServer`]: its certificate and key (PEM
/// files), and the authority whose client certificates it requires
/// (`--client-cert-auth`), if any. [`TestCerts`](crate::TestCerts) makes a
/// set.
#[derive(Clone, Debug)]
pub struct EtcdServerTls {
    /// The server's certificate.
    pub cert_file: PathBuf,
    /// Its private key.
    pub key_file: PathBuf,
    /// The authority of the client certificates it requires; `None`: no
    /// client certificate is asked for.
    pub client_ca_file: Option<PathBuf>,
}

impl EtcdServer {
    /// Starts a server whose client port speaks TLS only, as `tls` says;
    /// retries on new ports when another process takes the chosen ones
    /// first. Its [`url`](crate::TestServer::url) is `etcd://127.0.0.1:PORT`: add
    /// lockkit's TLS parameters to it.
    pub async fn try_start_tls(tls: EtcdServerTls) -> Result<EtcdServer, ServerError> {
        EtcdServer::start_single(Some(tls)).await
    }

    /// Starts one server (with TLS as `tls` says) and waits until it is
    /// healthy; retries on new ports when another process takes the chosen
    /// ones first.
    async fn start_single(tls: Option<EtcdServerTls>) -> Result<EtcdServer, ServerError> {
        let binary = resolve_binary(None, BINARY_ENV, "etcd", INSTALL_HINT)?;
        retry_on_taken_port("etcd", || async {
            let mut servers = EtcdServer::members(&binary, 1, None)?;
            let mut server = servers.pop().expect("one member");
            server.tls = tls.clone();
            server.launch().await.map(|()| server)
        })
        .await
    }
}

/// A cluster of etcd servers (each an [`EtcdServer`], with its own ports and
/// directory) that formed a quorum: started together, ready once every
/// member is healthy, i.e. sees a leader. Killing a minority leaves it
/// working; a killed member restarts with its data and rejoins.
#[derive(Debug)]
pub struct EtcdCluster {
    servers: Vec<EtcdServer>,
}

impl EtcdCluster {
    /// Starts `n` members and waits until each is healthy.
    ///
    /// # Panics
    ///
    /// With the [`ServerError`]'s message when it cannot be started, and
    /// when `n` is 0.
    pub async fn start(n: usize) -> EtcdCluster {
        Self::try_start(n).await.unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts `n` members and waits until each is healthy; retries on new
    /// ports when another process takes one of the chosen ones first.
    ///
    /// # Panics
    ///
    /// When `n` is 0.
    pub async fn try_start(n: usize) -> Result<EtcdCluster, ServerError> {
        Self::launch(n, None).await
    }

    /// Like [`try_start`](Self::try_start), with member `i` in namespace `i`
    /// of `fabric` (one member per namespace), bound to that namespace's
    /// address: [`Fabric::cut`] then parts members while the test still
    /// reaches each.
    pub async fn try_start_in(fabric: Arc<Fabric>) -> Result<EtcdCluster, ServerError> {
        Self::launch(fabric.len(), Some(fabric)).await
    }

    async fn launch(n: usize, fabric: Option<Arc<Fabric>>) -> Result<EtcdCluster, ServerError> {
        assert!(n > 0, "an etcd cluster needs at least one member");
        let binary = resolve_binary(None, BINARY_ENV, "etcd", INSTALL_HINT)?;
        retry_on_taken_port("an etcd cluster", || async {
            let servers = EtcdServer::members(&binary, n, fabric.as_ref())?;
            // Together: a member is healthy only once a quorum is up.
            let launched =
                futures_util::future::join_all(servers.iter().map(EtcdServer::launch)).await;
            for result in launched {
                result?;
            }
            Ok(EtcdCluster { servers })
        })
        .await
    }

    /// The members.
    pub fn servers(&self) -> &[EtcdServer] {
        &self.servers
    }

    /// `127.0.0.1:P1,127.0.0.1:P2,…`, every member's client endpoint.
    pub fn endpoints(&self) -> String {
        self.servers
            .iter()
            .map(EtcdServer::endpoint)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `etcd://127.0.0.1:P1,127.0.0.1:P2,…`: a lockkit URL of every member.
    pub fn url(&self) -> String {
        format!("etcd://{}", self.endpoints())
    }

    /// The index of the member that leads the cluster, as the members
    /// answer `etcdctl endpoint status`: the first one whose own id is the
    /// leader it names. `None` when no member answers that it leads (one
    /// is down, paused or in an election).
    pub async fn leader(&self) -> Option<usize> {
        for (index, server) in self.servers.iter().enumerate() {
            let Ok(status) = server.etcdctl(&["endpoint", "status", "-w", "json"]).await else {
                continue;
            };
            let member = json_number(&status, "member_id");
            if member.is_some() && member == json_number(&status, "leader") {
                return Some(index);
            }
        }
        None
    }
}

/// The first unsigned number that follows `"field":` in `json` (etcdctl's
/// compact JSON output), without a JSON parser.
fn json_number(json: &str, field: &str) -> Option<u64> {
    let start = json.find(&format!("\"{field}\":"))? + field.len() + 3;
    let digits: String = json[start..]
        .chars()
        .skip_while(|c| c.is_whitespace())
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

impl crate::disposable::ServerGroup for EtcdCluster {
    fn members(&self) -> Vec<&dyn FaultControl> {
        self.servers
            .iter()
            .map(|s| s as &dyn FaultControl)
            .collect()
    }
}

one_process_server!(
    EtcdServer,
    start: EtcdServer::start_single(None),
    url: |server| format!("etcd://{}", server.endpoint()),
    host: |server| ::std::net::IpAddr::V4(server.host),
    debug: |server| {
        "peer_port" => &server.peer_port,
        "name" => &server.name,
        "binary" => &server.binary,
    },
    kill_on_drop,
);
