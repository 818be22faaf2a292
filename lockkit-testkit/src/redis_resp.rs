//! A minimal RESP client for the Redis harnesses: one command over a new
//! loopback connection (after `AUTH` when a password is given), the reply as
//! text.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::process::within;

/// How long one command may take, connect included.
pub(crate) const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// [`command_with`] without a password.
pub(crate) async fn command(addr: SocketAddr, args: &[&str]) -> io::Result<String> {
    command_with(addr, None, args).await
}

/// Sends `args` to `addr` (after `AUTH password`) and returns the reply as
/// text: simple strings, errors and integers as their text (an error as e.g.
/// `ERR unknown command…`), bulk strings as their content, nil as `(nil)`,
/// arrays as their items joined by spaces.
///
/// Fails with [`io::ErrorKind::TimedOut`] after [`COMMAND_TIMEOUT`] (e.g.
/// while the server is paused), with the connection's error when the server
/// is down, and with [`io::ErrorKind::PermissionDenied`] when `AUTH` fails.
pub(crate) async fn command_with(
    addr: SocketAddr,
    password: Option<&str>,
    args: &[&str],
) -> io::Result<String> {
    if args.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "empty redis command",
        ));
    }
    within(COMMAND_TIMEOUT, exchange(addr, password, args), || {
        format!("redis on {addr} did not answer {}", args[0])
    })
    .await
    .map(Reply::into_text)
}

/// One readiness probe: `PING` answers `PONG` and `INFO server` reports `pid`
/// (so that a stranger that took the port is never mistaken for our server).
pub(crate) async fn probe(addr: SocketAddr, password: Option<&str>, pid: u32) -> bool {
    let Ok(mut connection) = connect(addr, password).await else {
        return false;
    };
    match request(&mut connection, &["PING"]).await {
        Ok(Reply::Simple(pong)) if pong == "PONG" => {}
        _ => return false,
    }
    match request(&mut connection, &["INFO", "server"]).await {
        Ok(Reply::Bulk(Some(info))) => String::from_utf8_lossy(&info)
            .lines()
            .any(|line| line.trim() == format!("process_id:{pid}")),
        _ => false,
    }
}

async fn exchange(addr: SocketAddr, password: Option<&str>, args: &[&str]) -> io::Result<Reply> {
    let mut connection = connect(addr, password).await?;
    request(&mut connection, args).await
}

/// Connects, and authenticates when a password is given.
async fn connect(addr: SocketAddr, password: Option<&str>) -> io::Result<BufReader<TcpStream>> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let mut connection = BufReader::new(stream);
    if let Some(password) = password
        && let Reply::Error(e) = request(&mut connection, &["AUTH", password]).await?
    {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("AUTH failed: {e}"),
        ));
    }
    Ok(connection)
}

async fn request(connection: &mut BufReader<TcpStream>, args: &[&str]) -> io::Result<Reply> {
    let mut encoded = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        encoded.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        encoded.extend_from_slice(arg.as_bytes());
        encoded.extend_from_slice(b"\r\n");
    }
    connection.get_mut().write_all(&encoded).await?;
    read_reply(connection).await
}

/// A RESP2 reply (plus the line-based RESP3 types, as text).
#[derive(Debug)]
enum Reply {
    Simple(String),
    Error(String),
    Integer(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Reply>>),
}

impl Reply {
    fn into_text(self) -> String {
        match self {
            Reply::Simple(text) | Reply::Error(text) => text,
            Reply::Integer(n) => n.to_string(),
            Reply::Bulk(Some(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
            Reply::Bulk(None) | Reply::Array(None) => "(nil)".to_owned(),
            Reply::Array(Some(items)) => items
                .into_iter()
                .map(Reply::into_text)
                .collect::<Vec<_>>()
                .join(" "),
        }
    }
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
    if n < 0 {
        Ok(None)
    } else {
        usize::try_from(n)
            .map(Some)
            .map_err(|_| protocol_error(format!("bad length {text:?}")))
    }
}

async fn read_reply(connection: &mut BufReader<TcpStream>) -> io::Result<Reply> {
    let line = read_line(connection).await?;
    let Some(kind) = line.chars().next() else {
        return Err(protocol_error("empty reply line".to_owned()));
    };
    let rest = &line[kind.len_utf8()..];
    match kind {
        '+' => Ok(Reply::Simple(rest.to_owned())),
        '-' => Ok(Reply::Error(rest.to_owned())),
        ':' => rest
            .parse()
            .map(Reply::Integer)
            .map_err(|_| protocol_error(format!("bad integer {rest:?}"))),
        '$' => match parse_length(rest)? {
            None => Ok(Reply::Bulk(None)),
            Some(len) => {
                let mut bytes = vec![0; len + 2];
                connection.read_exact(&mut bytes).await?;
                bytes.truncate(len);
                Ok(Reply::Bulk(Some(bytes)))
            }
        },
        '*' => match parse_length(rest)? {
            None => Ok(Reply::Array(None)),
            Some(len) => {
                let mut items = Vec::with_capacity(len.min(1024));
                for _ in 0..len {
                    items.push(Box::pin(read_reply(connection)).await?);
                }
                Ok(Reply::Array(Some(items)))
            }
        },
        '_' => Ok(Reply::Bulk(None)),
        ',' | '#' | '(' => Ok(Reply::Simple(rest.to_owned())),
        other => Err(protocol_error(format!(
            "unsupported reply type {other:?} in {line:?}"
        ))),
    }
}

/// The value of `field` in an `INFO`-style `field:value` text (`INFO`,
/// `CLUSTER INFO`).
pub fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        line.trim()
            .strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
    })
}

/// Statistic `stat` (`calls`, `usec`, `failed_calls`, …) of `command` in
/// an `INFO commandstats` text, from its line
/// `cmdstat_<command>:calls=…,usec=…`; `None` where the server has not
/// run the command since its statistics were reset. A subcommand is named
/// as the server names it (`config|resetstat`).
pub fn command_stat(info: &str, command: &str, stat: &str) -> Option<u64> {
    info_field(info, &format!("cmdstat_{command}"))?
        .split(',')
        .find_map(|pair| pair.strip_prefix(stat)?.strip_prefix('='))?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_stats_are_read_from_their_own_line() {
        let info = "# Commandstats\r\n\
            cmdstat_getex:calls=9,usec=90,usec_per_call=10.00\r\n\
            cmdstat_get:calls=3,usec=12,usec_per_call=4.00,rejected_calls=0\r\n\
            cmdstat_config|resetstat:calls=1,usec=5,usec_per_call=5.00\r\n";
        assert_eq!(command_stat(info, "get", "calls"), Some(3));
        assert_eq!(command_stat(info, "get", "usec"), Some(12));
        assert_eq!(command_stat(info, "get", "rejected_calls"), Some(0));
        assert_eq!(command_stat(info, "config|resetstat", "calls"), Some(1));
        assert_eq!(command_stat(info, "set", "calls"), None);
        assert_eq!(command_stat(info, "get", "failed_calls"), None);
    }
}
