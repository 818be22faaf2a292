//! etcd: a fenced write is a transaction whose compare is the fence.
//!
//! The fence of a resource is the key `lockkit/fence/RESOURCE` (see
//! [`fence_key`]), holding the greatest admitted token as 20 decimal digits,
//! so that etcd's byte-wise compare orders tokens as numbers. A write is one
//! `Txn`: if the fence holds a greater token, read it (refused); else record
//! the token and apply the caller's operations.
//!
//! ```no_run
//! # async fn f(mut kv: etcd_client::KvClient, token: lockkit_core::FencingToken) -> Result<(), Box<dyn std::error::Error>> {
//! use etcd_client::TxnOp;
//!
//! let replies = lockkit_fence::etcd::write(
//!     &mut kv,
//!     "report",
//!     token,
//!     vec![TxnOp::put("reports/daily", "...", None)],
//! )
//! .await?;
//! # Ok(()) }
//! ```
//!
//! The same from `etcdctl txn` (token 42, a fence of 20 digits):
//!
//! ```text
//! value("lockkit/fence/report") > "00000000000000000042"
//!
//! get lockkit/fence/report
//!
//! put lockkit/fence/report 00000000000000000042
//! put reports/daily ...
//! ```
//!
//! Timeouts are the client's: set them with `ConnectOptions::with_timeout`.

use etcd_client::{Compare, CompareOp, KvClient, Txn, TxnOp, TxnOpResponse};
use lockkit_core::FencingToken;

use crate::error::{FenceError, Result};
use crate::resource::check_resource;

const STORE: &str = "etcd";

/// The key that holds `resource`'s greatest admitted token.
pub fn fence_key(resource: &str) -> String {
    format!("lockkit/fence/{resource}")
}

/// A token as the fence stores it: 20 decimal digits.
pub fn fence_value(token: FencingToken) -> String {
    format!("{:020}", token.get())
}

/// Applies `operations` in one transaction with the fence of `resource`:
/// their responses, in order, or [`FenceError::Stale`] with nothing
/// written. The operations must not touch the fence key.
pub async fn write(
    kv: &mut KvClient,
    resource: &str,
    token: FencingToken,
    operations: Vec<TxnOp>,
) -> Result<Vec<TxnOpResponse>> {
    check_resource(resource)?;
    let key = fence_key(resource);
    let value = fence_value(token);
    let mut then = Vec::with_capacity(operations.len() + 1);
    then.push(TxnOp::put(key.as_str(), value.as_str(), None));
    then.extend(operations);
    let txn = Txn::new()
        .when([Compare::value(
            key.as_str(),
            CompareOp::Greater,
            value.as_str(),
        )])
        .and_then([TxnOp::get(key.as_str(), None)])
        .or_else(then);
    let response = kv
        .txn(txn)
        .await
        .map_err(|error| FenceError::store(STORE, error.to_string(), Some(Box::new(error) as _)))?;
    let replies = response.op_responses();
    if response.succeeded() {
        let greatest = match replies.first() {
            Some(TxnOpResponse::Get(get)) => get
                .kvs()
                .first()
                .and_then(|kv| std::str::from_utf8(kv.value()).ok())
                .and_then(|text| text.parse().ok()),
            _ => None,
        };
        return Err(FenceError::stale(
            resource,
            token,
            greatest.unwrap_or(u64::MAX),
        ));
    }
    // The first reply is the fence's own put.
    Ok(replies.into_iter().skip(1).collect())
}

/// Admits `token` for `resource` without a write (what `lockkit fence
/// check` does): records it, or refuses it as stale.
pub async fn check(kv: &mut KvClient, resource: &str, token: FencingToken) -> Result<()> {
    write(kv, resource, token, Vec::new()).await.map(drop)
}
