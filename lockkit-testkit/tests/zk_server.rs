//! Tests of the `ZkServer` and `ZkEnsemble` harness against real ZooKeeper
//! servers (JVMs).

mod common;

use std::collections::HashSet;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use common::{
    Footprint, assert_exited_over, assert_not_installed, assert_times_out, process_exists,
};
use lockkit_testkit::{FaultControl, TestServer};
use lockkit_testkit::{ZkEnsemble, ZkServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The `Mode:` value of a `srvr` answer.
fn mode(srvr: &str) -> Option<&str> {
    srvr.lines()
        .find_map(|line| line.strip_prefix("Mode: "))
        .map(str::trim)
}

/// The `Node count:` value of a `srvr` answer.
fn node_count(srvr: &str) -> u64 {
    srvr.lines()
        .find_map(|line| line.strip_prefix("Node count: "))
        .and_then(|count| count.trim().parse().ok())
        .unwrap_or_else(|| panic!("no node count in {srvr}"))
}

/// A minimal ZooKeeper client over the raw protocol: opens a session and
/// creates one persistent node with the open ACL. Returns the error code of
/// the reply (0: created).
async fn create_node(port: u16, path: &str) -> io::Result<i32> {
    async fn send(stream: &mut TcpStream, body: &[u8]) -> io::Result<()> {
        let mut frame = u32::try_from(body.len()).unwrap().to_be_bytes().to_vec();
        frame.extend_from_slice(body);
        stream.write_all(&frame).await
    }
    async fn receive(stream: &mut TcpStream) -> io::Result<Vec<u8>> {
        let len = stream.read_u32().await?;
        let mut body = vec![0; len as usize];
        stream.read_exact(&mut body).await?;
        Ok(body)
    }
    fn string(out: &mut Vec<u8>, text: &str) {
        out.extend_from_slice(&u32::try_from(text.len()).unwrap().to_be_bytes());
        out.extend_from_slice(text.as_bytes());
    }

    let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
    // ConnectRequest: protocol version, last zxid seen, timeout, session id,
    // password (16 zero bytes), read-only flag.
    let mut connect = Vec::new();
    connect.extend_from_slice(&0i32.to_be_bytes());
    connect.extend_from_slice(&0i64.to_be_bytes());
    connect.extend_from_slice(&10_000i32.to_be_bytes());
    connect.extend_from_slice(&0i64.to_be_bytes());
    connect.extend_from_slice(&16i32.to_be_bytes());
    connect.extend_from_slice(&[0; 16]);
    connect.push(0);
    send(&mut stream, &connect).await?;
    receive(&mut stream).await?;
    // RequestHeader (xid 1, type 1 = create), path, data, ACL world:anyone
    // with all permissions, flags 0 (persistent).
    let mut create = Vec::new();
    create.extend_from_slice(&1i32.to_be_bytes());
    create.extend_from_slice(&1i32.to_be_bytes());
    string(&mut create, path);
    string(&mut create, "data");
    create.extend_from_slice(&1i32.to_be_bytes());
    create.extend_from_slice(&31i32.to_be_bytes());
    string(&mut create, "world");
    string(&mut create, "anyone");
    create.extend_from_slice(&0i32.to_be_bytes());
    send(&mut stream, &create).await?;
    // ReplyHeader: xid, zxid, err.
    let reply = receive(&mut stream).await?;
    Ok(i32::from_be_bytes(reply[12..16].try_into().unwrap()))
}

/// The addresses process `pid` listens on (TCP), from `/proc`: the sockets
/// among its file descriptors that are in state LISTEN.
fn listening_addrs(pid: u32) -> Vec<SocketAddr> {
    let inodes: HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy().into_owned();
            Some(
                target
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .to_owned(),
            )
        })
        .collect();
    let mut addrs = Vec::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // local_address st … inode; 0A is LISTEN.
            if fields[3] != "0A" || !inodes.contains(fields[9]) {
                continue;
            }
            let (ip, port) = fields[1].split_once(':').unwrap();
            // Each 32-bit word is printed as a native-endian integer.
            let bytes: Vec<u8> = (0..ip.len() / 8)
                .flat_map(|i| {
                    u32::from_str_radix(&ip[i * 8..i * 8 + 8], 16)
                        .unwrap()
                        .to_le_bytes()
                })
                .collect();
            let ip = match <[u8; 4]>::try_from(bytes.as_slice()) {
                Ok(v4) => IpAddr::from(v4),
                Err(_) => IpAddr::from(<[u8; 16]>::try_from(bytes.as_slice()).unwrap()),
            };
            addrs.push(SocketAddr::new(ip, u16::from_str_radix(port, 16).unwrap()));
        }
    }
    addrs
}

fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => {
            v6 == Ipv6Addr::LOCALHOST || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// Asserts that the JVM of `server` listens on loopback only, and on `port`
/// among others; returns the ports it listens on.
fn assert_listens_on_loopback_only(server: &ZkServer) -> HashSet<u16> {
    let addrs = listening_addrs(server.pid().unwrap());
    assert!(
        addrs.iter().all(|addr| is_loopback(addr.ip())),
        "{server:?} listens on {addrs:?}"
    );
    let ports: HashSet<u16> = addrs.iter().map(SocketAddr::port).collect();
    assert!(ports.contains(&server.port()), "{addrs:?}");
    ports
}

/// The address of this machine on its default route, unless that is loopback
/// (no packet is sent: connecting a UDP socket only picks a route).
fn non_loopback_ipv4() -> Option<Ipv4Addr> {
    let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).ok()?;
    socket.connect(("192.0.2.1", 9)).ok()?;
    match socket.local_addr().ok()?.ip() {
        IpAddr::V4(ip) if !ip.is_loopback() && !ip.is_unspecified() => Some(ip),
        _ => None,
    }
}

/// Asserts that `port` cannot be reached through the machine's non-loopback
/// address. Skipped (returns `false`) on a machine without such an address.
async fn assert_unreachable_from_outside(port: u16) -> bool {
    let Some(ip) = non_loopback_ipv4() else {
        return false;
    };
    let connect = tokio::time::timeout(Duration::from_secs(2), TcpStream::connect((ip, port)));
    match connect.await {
        Ok(Ok(_)) => panic!("port {port} accepts connections on {ip}"),
        Ok(Err(e)) => assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}"),
        Err(_) => {} // filtered: unreachable too
    }
    true
}

#[tokio::test]
async fn standalone_answers_srvr_ruok_and_wchs() {
    let started = Instant::now();
    let server = ZkServer::start().await;
    let startup = started.elapsed();
    let srvr = server.four_letter("srvr").await.unwrap();
    assert!(srvr.contains("Mode: standalone"), "{srvr}");
    assert_eq!(server.four_letter("ruok").await.unwrap(), "imok");
    let wchs = server.four_letter("wchs").await.unwrap();
    assert!(wchs.contains("Total watches:0"), "{wchs}");
    let error = server.four_letter("bad").await.unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::InvalidInput, "{error}");

    // The PID we hold is the JVM's own (setpriv execs it).
    let pid = server.pid().unwrap();
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
    assert_eq!(comm.trim(), "java");
    assert!(server.dir().join("zoo.cfg").is_file());
    let log = std::fs::read_to_string(server.dir().join("zookeeper.log")).unwrap();
    assert!(log.contains("binding to port"), "{log}");
    assert!(startup < Duration::from_secs(20), "{startup:?}");
}

#[tokio::test]
async fn connect_string_and_url_name_the_port() {
    let server = ZkServer::start().await;
    let port = server.port();
    assert_ne!(port, 0);
    assert_eq!(server.connect_string(), format!("127.0.0.1:{port}"));
    assert_eq!(
        server.url_at("/locks"),
        format!("zk://127.0.0.1:{port}/locks")
    );
    assert_eq!(
        server.url_at("locks/a"),
        format!("zk://127.0.0.1:{port}/locks/a")
    );
    let conf = server.four_letter("conf").await.unwrap();
    assert!(conf.contains(&format!("clientPort={port}")), "{conf}");
}

#[tokio::test]
async fn standalone_listens_on_loopback_only() {
    let server = ZkServer::start().await;
    let ports = assert_listens_on_loopback_only(&server);
    assert_eq!(ports, HashSet::from([server.port()]));
    // Skipped on a machine whose only address is loopback.
    assert_unreachable_from_outside(server.port()).await;
}

#[tokio::test]
async fn kill_refuses_connections_and_restart_keeps_port_and_data() {
    let server = ZkServer::start().await;
    let port = server.port();
    let first_pid = server.pid().unwrap();
    let before = node_count(&server.four_letter("srvr").await.unwrap());
    assert_eq!(create_node(port, "/kept").await.unwrap(), 0);
    let srvr = server.four_letter("srvr").await.unwrap();
    assert_eq!(node_count(&srvr), before + 1, "{srvr}");

    server.kill();
    server.kill(); // idempotent
    assert_eq!(server.pid(), None);
    assert!(!process_exists(first_pid), "killed JVM was not reaped");
    let refused = TcpStream::connect(("127.0.0.1", port)).await.unwrap_err();
    assert_eq!(
        refused.kind(),
        io::ErrorKind::ConnectionRefused,
        "{refused}"
    );
    assert!(server.four_letter("srvr").await.is_err());

    server.restart().await;
    assert_eq!(server.port(), port);
    let second_pid = server.pid().unwrap();
    assert_ne!(second_pid, first_pid);
    let srvr = server.four_letter("srvr").await.unwrap();
    assert!(srvr.contains("Mode: standalone"), "{srvr}");
    // The node is still there: ZooKeeper reloaded its data directory.
    assert_eq!(node_count(&srvr), before + 1, "{srvr}");
    // NodeExists (-110).
    assert_eq!(create_node(port, "/kept").await.unwrap(), -110);

    // restart also works on a running server.
    server.restart().await;
    assert_eq!(server.four_letter("ruok").await.unwrap(), "imok");
    assert!(!process_exists(second_pid));
}

#[tokio::test]
async fn pause_makes_srvr_time_out_and_resume_recovers() {
    let server = ZkServer::start().await;
    server.pause();
    assert_times_out(server.four_letter("srvr")).await;
    assert!(server.pid().is_some());

    server.resume();
    let srvr = server.four_letter("srvr").await.unwrap();
    assert!(srvr.contains("Mode: standalone"), "{srvr}");
}

/// `srvr` over a raw connection, `None` without an answer within `timeout`.
async fn quick_srvr(port: u16, timeout: Duration) -> Option<String> {
    let exchange = async {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
        stream.write_all(b"srvr").await?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await?;
        io::Result::Ok(answer)
    };
    tokio::time::timeout(timeout, exchange).await.ok()?.ok()
}

#[tokio::test]
async fn pause_takes_effect_before_it_returns() {
    // SIGSTOP stops a JVM's threads one by one; pause waits for all of them,
    // so a request sent right after pause() is never answered.
    let server = ZkServer::start().await;
    for round in 0..15 {
        server.pause();
        let paused = quick_srvr(server.port(), Duration::from_millis(300)).await;
        assert_eq!(paused, None, "round {round}");
        server.resume();
        let resumed = quick_srvr(server.port(), Duration::from_secs(2)).await;
        assert!(resumed.is_some(), "round {round}");
    }
}

#[tokio::test]
async fn two_servers_run_at_once() {
    let (a, b) = tokio::join!(ZkServer::start(), ZkServer::start());
    assert_ne!(a.port(), b.port());
    assert_ne!(a.pid(), b.pid());
    assert_eq!(create_node(a.port(), "/only-on-a").await.unwrap(), 0);
    let count_a = node_count(&a.four_letter("srvr").await.unwrap());
    let count_b = node_count(&b.four_letter("srvr").await.unwrap());
    assert_eq!(count_a, count_b + 1, "the servers share no data");
}

#[tokio::test]
async fn drop_kills_the_jvm_and_removes_the_directory() {
    let server = ZkServer::start().await;
    let footprint = Footprint::of(&server);
    drop(server);
    // Drop kills and reaps the JVM before it returns.
    let pid = footprint.pid;
    assert!(!process_exists(pid), "JVM {pid} still exists after drop");
    footprint.assert_gone().await;
}

#[tokio::test]
async fn missing_java_error_says_how_to_install() {
    let result = ZkServer::builder()
        .java("/nonexistent/java")
        .try_start_ensemble(3)
        .await;
    assert_not_installed(result, "/nonexistent/java");
}

#[tokio::test]
#[should_panic(expected = "scripts/install-services.sh")]
async fn start_panics_loudly_when_java_is_missing() {
    ZkServer::builder()
        .java("no-such-java-binary")
        .start()
        .await;
}

#[tokio::test]
async fn bad_config_reports_exit_with_log_tail() {
    let error = ZkServer::builder()
        .config("tickTime", "not-a-number")
        .try_start()
        .await
        .unwrap_err();
    assert_exited_over(error, "not-a-number");
}

#[tokio::test]
async fn ensemble_elects_one_leader_and_survives_losing_it() {
    let started = Instant::now();
    let ensemble = ZkEnsemble::start(3).await;
    let startup = started.elapsed();
    let ports: Vec<String> = ensemble
        .servers()
        .iter()
        .map(|server| format!("127.0.0.1:{}", server.port()))
        .collect();
    assert_eq!(ensemble.connect_string(), ports.join(","));
    assert_eq!(
        ensemble.url_at("/locks"),
        format!("zk://{}/locks", ports.join(","))
    );

    // All three answer; exactly one leads.
    let mut modes = Vec::new();
    for server in ensemble.servers() {
        let srvr = server.four_letter("srvr").await.unwrap();
        modes.push(mode(&srvr).unwrap().to_owned());
    }
    assert_eq!(
        modes.iter().filter(|mode| *mode == "leader").count(),
        1,
        "{modes:?}"
    );
    assert_eq!(
        modes.iter().filter(|mode| *mode == "follower").count(),
        2,
        "{modes:?}"
    );
    let leader = ensemble.leader().await.unwrap();
    assert_eq!(modes[leader], "leader");
    assert!(startup < Duration::from_secs(30), "{startup:?}");

    // A write on one member is seen by all.
    assert_eq!(
        create_node(ensemble.servers()[leader].port(), "/replicated")
            .await
            .unwrap(),
        0
    );
    assert!(ensemble.wait_for_quorum(Duration::from_secs(5)).await);

    ensemble.servers()[leader].kill();
    let killed_at = Instant::now();
    assert!(
        ensemble.wait_for_quorum(Duration::from_secs(10)).await,
        "no new quorum: {:?}",
        ensemble.modes().await
    );
    let failover = killed_at.elapsed();
    let new_leader = ensemble.leader().await.unwrap();
    assert_ne!(new_leader, leader);
    assert!(failover < Duration::from_secs(10), "{failover:?}");
    let survivor = &ensemble.servers()[new_leader];
    let count = node_count(&survivor.four_letter("srvr").await.unwrap());

    ensemble.servers()[leader].restart().await;
    let srvr = ensemble.servers()[leader]
        .four_letter("srvr")
        .await
        .unwrap();
    assert_eq!(mode(&srvr), Some("follower"), "{srvr}");
    assert_eq!(node_count(&srvr), count, "{srvr}");
    assert_eq!(ensemble.leader().await, Some(new_leader));
    let modes = ensemble.modes().await;
    assert!(modes.iter().all(Option::is_some), "{modes:?}");
}

#[tokio::test]
async fn ensemble_members_listen_on_loopback_only() {
    let ensemble = ZkEnsemble::start(3).await;
    let leader = ensemble.leader().await.unwrap();
    for (index, server) in ensemble.servers().iter().enumerate() {
        let ports = assert_listens_on_loopback_only(server);
        // Client and election port on every member, plus the quorum port
        // on the leader.
        let expected = if index == leader { 3 } else { 2 };
        assert_eq!(ports.len(), expected, "member {index}: {ports:?}");
        for port in ports {
            // Skipped on a machine whose only address is loopback.
            assert_unreachable_from_outside(port).await;
        }
    }
}

#[tokio::test]
async fn paused_ensemble_member_drops_out_and_rejoins() {
    let ensemble = ZkEnsemble::start(3).await;
    let leader = ensemble.leader().await.unwrap();
    let follower = (leader + 1) % 3;
    ensemble.servers()[follower].pause();
    // Longer than syncLimit × tickTime (2.5 s): the leader drops it.
    tokio::time::sleep(Duration::from_secs(3)).await;
    // The other two keep a quorum, without the paused member.
    assert!(ensemble.wait_for_quorum(Duration::from_secs(5)).await);
    assert_eq!(ensemble.modes().await[follower], None);
    ensemble.servers()[follower].resume();
    let started = Instant::now();
    loop {
        let modes = ensemble.modes().await;
        if modes.iter().all(Option::is_some) {
            assert_eq!(modes[follower].as_deref(), Some("follower"), "{modes:?}");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the resumed member did not rejoin: {modes:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
