//! The backend's name, and etcd's errors as `LockError`s.

use std::future::Future;
use std::time::Duration;

use lockkit_core::LockError;
use tokio::time::Instant;

/// The backend's name in logs and errors.
pub(crate) const BACKEND: &str = "etcd";

/// What `etcd-client` answers, as a `LockError`: the transport failing or
/// the cluster having no leader is `Unavailable`, anything else a backend
/// error. Never includes credentials (they are not in etcd's messages).
pub(crate) fn map_error(what: &str, error: etcd_client::Error) -> LockError {
    use etcd_client::Error as E;
    use tonic::Code;
    match error {
        E::TransportError(e) => {
            LockError::unavailable(BACKEND, format!("{what}: {}", with_causes(&e)))
        }
        E::IoError(e) => LockError::unavailable(BACKEND, format!("{what}: {e}")),
        E::GRpcStatus(status) => match status.code() {
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled => {
                LockError::unavailable(BACKEND, format!("{what}: {}", status.message()))
            }
            // tonic's status for a connection that broke under a request
            // ("transport error", code Unknown, the cause as its source).
            Code::Unknown if std::error::Error::source(&status).is_some() => {
                LockError::unavailable(BACKEND, format!("{what}: {}", with_causes(&status)))
            }
            _ => LockError::backend(BACKEND, format!("{what}: {}", status.message())),
        },
        other => LockError::backend(BACKEND, format!("{what}: {other}")),
    }
}

/// The pause before a request that was never sent is sent again.
pub(crate) const RESEND_PAUSE: Duration = Duration::from_millis(50);

/// Which failed requests [`resend`] sends again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Resend {
    /// Only those that were never sent ([`never_sent`]): a request that
    /// may have reached the server is never repeated.
    Unsent,
    /// Also those whose connection broke under them ([`broke_off`]): for
    /// requests that may safely be applied twice (reads, watches, lease
    /// keep-alives).
    Repeatable,
}

/// Runs the request `request` makes, and makes it again (after
/// [`RESEND_PAUSE`]) while it fails in a way `which` allows and the pause
/// ends before `deadline` (with none, the caller bounds the whole). Any
/// other answer is returned as it is.
pub(crate) async fn resend<T, F>(
    what: &str,
    deadline: Option<Instant>,
    which: Resend,
    mut request: impl FnMut() -> F,
) -> Result<T, etcd_client::Error>
where
    F: Future<Output = Result<T, etcd_client::Error>>,
{
    loop {
        match request().await {
            Err(error)
                if (never_sent(&error) || (which == Resend::Repeatable && broke_off(&error)))
                    && deadline.is_none_or(|end| Instant::now() + RESEND_PAUSE < end) =>
            {
                tracing::debug!(what, %error, "the request failed in transit; sending it again");
                tokio::time::sleep(RESEND_PAUSE).await;
            }
            answer => return answer,
        }
    }
}

/// Whether `error` says that the request never reached a member: the
/// connection to it could not be opened (tonic's status for that is
/// `Unavailable` with the connector's message, see `tonic::ConnectError`),
/// or it closed while the request still waited to be written (hyper's
/// "operation was canceled", which tonic reports as `Cancelled`; the
/// server's own cancellations say "context canceled").
/// Such a request can be sent again whatever it does.
pub(crate) fn never_sent(error: &etcd_client::Error) -> bool {
    match error {
        etcd_client::Error::GRpcStatus(status) => match status.code() {
            tonic::Code::Unavailable => status.message().starts_with("tcp connect error"),
            tonic::Code::Cancelled => status.message().starts_with("operation was canceled"),
            _ => false,
        },
        _ => false,
    }
}

/// Whether `error` says that the connection to the member failed, before
/// or after the request reached it (a member killed under an open
/// connection: tonic's "transport error", code `Unknown`, with the cause as
/// its source).
pub(crate) fn broke_off(error: &etcd_client::Error) -> bool {
    use etcd_client::Error as E;
    match error {
        E::TransportError(_) | E::IoError(_) => true,
        E::GRpcStatus(status) => {
            status.code() == tonic::Code::Unknown && std::error::Error::source(status).is_some()
        }
        _ => false,
    }
}

/// `error` and its sources, `: `-separated (tonic's transport error says
/// only "transport error"; the cause is in its sources).
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_requests_no_member_got_count_as_never_sent() {
        use tonic::Code;
        for (code, message, unsent) in [
            (Code::Unavailable, "tcp connect error", true),
            // hyper's answer for a request its closed connection never wrote.
            (Code::Cancelled, "operation was canceled", true),
            // Reached a member, which answered: sending again is not known
            // to be safe.
            (Code::Unavailable, "etcdserver: no leader", false),
            (Code::Unknown, "tcp connect error", false),
            // etcd's own: the server gave up on the request.
            (Code::Cancelled, "context canceled", false),
        ] {
            let status = etcd_client::Error::GRpcStatus(tonic::Status::new(code, message));
            assert_eq!(never_sent(&status), unsent, "{code:?} {message:?}");
        }
        assert!(!never_sent(&etcd_client::Error::InvalidArgs(
            "tcp connect error".into()
        )));
    }

    #[test]
    fn a_broken_connection_is_not_a_server_answer() {
        let broken = tonic::Status::from_error(Box::new(std::io::Error::from(
            std::io::ErrorKind::BrokenPipe,
        )));
        assert_eq!(broken.code(), tonic::Code::Unknown);
        assert!(broke_off(&etcd_client::Error::GRpcStatus(broken)));
        assert!(broke_off(&etcd_client::Error::IoError(
            std::io::ErrorKind::ConnectionReset.into()
        )));
        // The server's own answers.
        for (code, message) in [
            (tonic::Code::Unknown, "etcdserver: request timed out"),
            (tonic::Code::Unavailable, "etcdserver: no leader"),
            (
                tonic::Code::NotFound,
                "etcdserver: requested lease not found",
            ),
        ] {
            let status = etcd_client::Error::GRpcStatus(tonic::Status::new(code, message));
            assert!(!broke_off(&status), "{message}");
        }
    }
}
