//! Tests of the `RedisServer` harness against the real `redis-server`.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::{assert_drop_frees, assert_exited_over, assert_times_out, process_exists};
use lockkit_testkit::RedisServer;
use lockkit_testkit::{FaultControl, TestServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[tokio::test]
async fn start_answers_ping_and_stores_data() {
    let server = RedisServer::start().await;
    assert_eq!(server.command(&["PING"]).await.unwrap(), "PONG");
    assert_eq!(
        server.command(&["SET", "k", "hello world"]).await.unwrap(),
        "OK"
    );
    assert_eq!(server.command(&["GET", "k"]).await.unwrap(), "hello world");
    assert_eq!(server.command(&["GET", "missing"]).await.unwrap(), "(nil)");
    assert_eq!(server.command(&["INCRBY", "n", "41"]).await.unwrap(), "41");
    assert_eq!(
        server.command(&["RPUSH", "l", "a", "b"]).await.unwrap(),
        "2"
    );
    assert_eq!(
        server.command(&["LRANGE", "l", "0", "-1"]).await.unwrap(),
        "a b"
    );
    let error = server.command(&["NOSUCHCOMMAND"]).await.unwrap();
    assert!(error.starts_with("ERR"), "{error}");
    let pid = server.pid().expect("running server has a pid");
    assert!(process_exists(pid));
    // The PID we hold is redis-server's own (setpriv execs it).
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
    assert!(comm.starts_with("redis-server"), "{comm}");
    assert!(server.dir().join("redis.log").exists());
}

#[tokio::test]
async fn url_and_addr_name_the_port() {
    let server = RedisServer::start().await;
    let port = server.port();
    assert_ne!(port, 0);
    assert_eq!(server.url(), format!("redis://127.0.0.1:{port}"));
    assert_eq!(server.addr().to_string(), format!("127.0.0.1:{port}"));
    assert!(server.dir().is_dir());
    let config = server.command(&["CONFIG", "GET", "port"]).await.unwrap();
    assert_eq!(config, format!("port {port}"));
}

#[tokio::test]
async fn kill_then_restart_without_aof_loses_data() {
    let server = RedisServer::start().await;
    let port = server.port();
    let first_pid = server.pid().unwrap();
    assert_eq!(server.command(&["SET", "k", "v"]).await.unwrap(), "OK");

    server.kill();
    server.kill(); // idempotent
    assert_eq!(server.pid(), None);
    assert!(!process_exists(first_pid), "killed process was not reaped");
    assert!(server.command(&["PING"]).await.is_err());

    server.restart().await;
    assert_eq!(server.port(), port);
    let second_pid = server.pid().unwrap();
    assert_ne!(second_pid, first_pid);
    assert_eq!(server.command(&["GET", "k"]).await.unwrap(), "(nil)");

    // restart also works on a running server.
    server.restart().await;
    assert_eq!(server.command(&["PING"]).await.unwrap(), "PONG");
    assert!(!process_exists(second_pid));
}

#[tokio::test]
async fn appendonly_data_survives_kill_and_restart() {
    let server = RedisServer::builder().appendonly(true).start().await;
    assert_eq!(
        server
            .command(&["CONFIG", "GET", "appendonly"])
            .await
            .unwrap(),
        "appendonly yes"
    );
    assert_eq!(
        server.command(&["SET", "k", "durable"]).await.unwrap(),
        "OK"
    );
    server.kill();
    server.restart().await;
    assert_eq!(server.command(&["GET", "k"]).await.unwrap(), "durable");
}

#[tokio::test]
async fn pause_makes_commands_time_out_and_resume_recovers() {
    let server = RedisServer::start().await;
    server.pause();
    assert_times_out(server.command(&["PING"])).await;
    // Still the same, running (stopped) process.
    assert!(server.pid().is_some());

    server.resume();
    assert_eq!(server.command(&["PING"]).await.unwrap(), "PONG");
}

#[tokio::test]
async fn password_is_required_used_and_not_printed() {
    let password = "s3cret-pa55";
    let server = RedisServer::builder().password(password).start().await;
    assert_eq!(server.command(&["PING"]).await.unwrap(), "PONG");
    assert_eq!(
        server.url(),
        format!("redis://:{password}@127.0.0.1:{}", server.port())
    );
    let debug = format!("{server:?}");
    assert!(!debug.contains(password), "{debug}");
    assert!(debug.contains(&server.port().to_string()), "{debug}");

    // Without AUTH the server refuses.
    let mut raw = TcpStream::connect(server.addr()).await.unwrap();
    raw.write_all(b"PING\r\n").await.unwrap();
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(2), raw.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    let reply = String::from_utf8_lossy(&buf[..n]);
    assert!(reply.starts_with("-NOAUTH"), "{reply}");

    // Survives a restart with the same password.
    server.restart().await;
    assert_eq!(server.command(&["PING"]).await.unwrap(), "PONG");
}

#[tokio::test]
async fn five_servers_run_at_once() {
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..5 {
        set.spawn(RedisServer::start());
    }
    let servers: Vec<RedisServer> = set.join_all().await;
    let ports: HashSet<u16> = servers.iter().map(RedisServer::port).collect();
    assert_eq!(ports.len(), 5, "{ports:?}");
    for (i, server) in servers.iter().enumerate() {
        let value = format!("server-{i}");
        assert_eq!(server.command(&["SET", "who", &value]).await.unwrap(), "OK");
    }
    for (i, server) in servers.iter().enumerate() {
        assert_eq!(
            server.command(&["GET", "who"]).await.unwrap(),
            format!("server-{i}")
        );
    }
    let pids: HashSet<u32> = servers.iter().map(|s| s.pid().unwrap()).collect();
    assert_eq!(pids.len(), 5);
}

#[tokio::test]
async fn drop_kills_the_process_and_frees_the_port() {
    assert_drop_frees::<RedisServer>().await;
}

#[tokio::test]
#[should_panic(expected = "scripts/install-services.sh")]
async fn start_panics_loudly_when_binary_is_missing() {
    RedisServer::builder()
        .binary("no-such-redis-server-binary")
        .start()
        .await;
}

#[tokio::test]
async fn bad_argument_reports_exit_with_log_tail() {
    let error = RedisServer::builder()
        .arg("--no-such-option")
        .arg("x")
        .try_start()
        .await
        .unwrap_err();
    assert_exited_over(error, "no-such-option");
}
