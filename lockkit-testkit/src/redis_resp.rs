//! A minimal RESP client for the Redis Cluster and Sentinel harnesses: one
//! command over a new loopback connection, the reply as text.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::process::within;

/// How long one command may take, connect included.
pub(crate) const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// Sends `args` to `addr` and returns the reply as text: simple strings,
/// errors and integers as their text, bulk strings as their content, nil as
/// `(nil)`, arrays as their items joined by spaces. Fails with
/// [`io::ErrorKind::TimedOut`] after [`COMMAND_TIMEOUT`].
pub(crate) async fn command(addr: SocketAddr, args: &[&str]) -> io::Result<String> {
    if args.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "empty redis command",
        ));
    }
    let exchange = async {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let mut connection = BufReader::new(stream);
        let mut encoded = format!("*{}\r\n", args.len()).into_bytes();
        for arg in args {
            encoded.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            encoded.extend_from_slice(arg.as_bytes());
            encoded.extend_from_slice(b"\r\n");
        }
        connection.get_mut().write_all(&encoded).await?;
        read_reply(&mut connection).await
    };
    within(COMMAND_TIMEOUT, exchange, || {
        format!("redis on {addr} did not answer {}", args[0])
    })
    .await
}

/// One readiness probe: `PING` answers `PONG` and `INFO server` names `pid`.
pub(crate) async fn probe(addr: SocketAddr, pid: u32) -> bool {
    if !command(addr, &["PING"]).await.is_ok_and(|r| r == "PONG") {
        return false;
    }
    command(addr, &["INFO", "server"]).await.is_ok_and(|info| {
        info.lines()
            .any(|line| line.trim() == format!("process_id:{pid}"))
    })
}

/// The value of `field` in an `INFO`-style `field:value` text.
pub(crate) fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        line.trim()
            .strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
    })
}

fn protocol_error(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

async fn read_line(connection: &mut BufReader<TcpStream>) -> io::Result<String> {
    let mut line = Vec::new();
    connection.read_until(b'\n', &mut line).await?;
    if !line.ends_with(b"\r\n") {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed in the middle of a reply",
        ));
    }
    line.truncate(line.len() - 2);
    Ok(String::from_utf8_lossy(&line).into_owned())
}

fn parse_length(text: &str) -> io::Result<Option<usize>> {
    let n: i64 = text
        .parse()
        .map_err(|_| protocol_error(format!("bad length {text:?}")))?;
    Ok(usize::try_from(n).ok())
}

async fn read_reply(connection: &mut BufReader<TcpStream>) -> io::Result<String> {
    let line = read_line(connection).await?;
    let Some(kind) = line.chars().next() else {
        return Err(protocol_error("empty reply line".to_owned()));
    };
    let rest = &line[kind.len_utf8()..];
    match kind {
        '+' | '-' | ':' | ',' | '#' | '(' => Ok(rest.to_owned()),
        '_' => Ok("(nil)".to_owned()),
        '$' => match parse_length(rest)? {
            None => Ok("(nil)".to_owned()),
            Some(len) => {
                let mut bytes = vec![0; len + 2];
                connection.read_exact(&mut bytes).await?;
                bytes.truncate(len);
                Ok(String::from_utf8_lossy(&bytes).into_owned())
            }
        },
        '*' => match parse_length(rest)? {
            None => Ok("(nil)".to_owned()),
            Some(len) => {
                let mut items = Vec::with_capacity(len.min(1024));
                for _ in 0..len {
                    items.push(Box::pin(read_reply(connection)).await?);
                }
                Ok(items.join(" "))
            }
        },
        other => Err(protocol_error(format!(
            "unsupported reply type {other:?} in {line:?}"
        ))),
    }
}
