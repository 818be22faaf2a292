//! Redis: a script that checks the fence and applies the write in one
//! step, so a stale holder's write is refused atomically with the write.
//!
//! The fence of a resource is the key `lockkit:fence:{RESOURCE}` (see
//! [`fence_key`]), holding the greatest admitted token. On Redis Cluster the
//! keys a fenced write touches must share its hash tag, `{RESOURCE}`:
//! name them with [`data_key`], or put the same `{…}` in your own names.
//!
//! ```no_run
//! # async fn f(mut conn: redis::aio::MultiplexedConnection, token: lockkit_core::FencingToken) -> Result<(), Box<dyn std::error::Error>> {
//! use lockkit_fence::redis::{data_key, FencedWrite};
//!
//! let replies = FencedWrite::new("report", token)?
//!     .command(redis::cmd("SET").arg(data_key("report", "body")).arg("..."))
//!     .command(redis::cmd("INCR").arg(data_key("report", "version")))
//!     .run(&mut conn)
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! Other clients run the same script ([`SCRIPT`]) with `EVAL`/`EVALSHA`:
//! one key, the fence key; then the token, the resource, and each command
//! as its word count followed by its words. From redis-cli:
//!
//! ```text
//! redis-cli --eval fence.lua 'lockkit:fence:{report}' , 42 report 3 SET '{report}:body' '...'
//! ```
//!
//! A stale token gets the error reply `STALE lockkit fence: stale token …:
//! greatest admitted N` and runs nothing. The script checks every command's
//! shape before it writes; a command that fails while running (a wrong type,
//! say) leaves the fence and the commands before it applied, as any Redis
//! script does.

use std::sync::LazyLock;

use lockkit_core::FencingToken;
use redis::aio::ConnectionLike;
use redis::{Cmd, Script, Value};

use crate::error::{FenceError, Result};
use crate::resource::{check_resource, greatest_in, invalid};

const STORE: &str = "redis";

/// The script, in Lua: see the module docs for its keys and arguments.
pub const SCRIPT: &str = include_str!("fence.lua");

static FENCE: LazyLock<Script> = LazyLock::new(|| Script::new(SCRIPT));

/// The key that holds `resource`'s greatest admitted token.
pub fn fence_key(resource: &str) -> String {
    format!("lockkit:fence:{{{resource}}}")
}

/// A key for the data of `resource` in its fence's hash slot:
/// `{RESOURCE}:suffix`.
pub fn data_key(resource: &str, suffix: &str) -> String {
    format!("{{{resource}}}:{suffix}")
}

/// A fenced write: the commands run only when the token is not stale.
#[derive(Clone, Debug)]
pub struct FencedWrite {
    resource: String,
    token: FencingToken,
    words: Vec<Vec<u8>>,
}

impl FencedWrite {
    /// A write to `resource` by the holder of `token`, with no commands yet
    /// (run as it is, it only admits the token).
    ///
    /// Fails with [`FenceError::InvalidResource`] for a name that is empty,
    /// longer than 255 bytes, or holds `{`, `}` or a control character.
    pub fn new(resource: &str, token: FencingToken) -> Result<FencedWrite> {
        check_resource(resource)?;
        if resource.contains(['{', '}']) {
            return Err(invalid(
                resource,
                "it holds a brace, which would break its hash tag",
            ));
        }
        Ok(FencedWrite {
            resource: resource.to_owned(),
            token,
            words: Vec::new(),
        })
    }

    /// Adds a command to run after the fence admits the token.
    pub fn command(mut self, command: &Cmd) -> FencedWrite {
        let words: Vec<&[u8]> = command
            .args_iter()
            .filter_map(|arg| match arg {
                redis::Arg::Simple(word) => Some(word),
                _ => None,
            })
            .collect();
        if !words.is_empty() {
            self.words.push(words.len().to_string().into_bytes());
            self.words.extend(words.into_iter().map(<[u8]>::to_vec));
        }
        self
    }

    /// Runs the script: the commands' replies, in order, or
    /// [`FenceError::Stale`] with nothing written.
    pub async fn run<C: ConnectionLike + Send>(&self, conn: &mut C) -> Result<Vec<Value>> {
        let mut invocation = FENCE.key(fence_key(&self.resource));
        invocation.arg(self.token.get()).arg(&self.resource);
        for word in &self.words {
            invocation.arg(word.as_slice());
        }
        match invocation.invoke_async::<Vec<Value>>(conn).await {
            Ok(replies) => Ok(replies),
            Err(error) if error.code() == Some("STALE") => {
                let greatest = error.detail().and_then(greatest_in).unwrap_or(u64::MAX);
                Err(FenceError::stale(&self.resource, self.token, greatest))
            }
            Err(error) => Err(FenceError::store(
                STORE,
                error.to_string(),
                Some(Box::new(error) as _),
            )),
        }
    }
}

/// Admits `token` for `resource` without a write (what `lockkit fence
/// check` does): records it, or refuses it as stale.
pub async fn check<C: ConnectionLike + Send>(
    conn: &mut C,
    resource: &str,
    token: FencingToken,
) -> Result<()> {
    FencedWrite::new(resource, token)?.run(conn).await.map(drop)
}
