//! Durability beyond one node ([`RedisStoreBuilder::wait_for_replicas`]): a claim,
//! complete or replace script with `WAIT` behind it, sent as one pipeline on one connection, and a
//! shortfall of replicas answered as [`StoreError::NotReplicated`].
//!
//! `WAIT` counts the replicas that acknowledged the last write *of the connection it is
//! sent on*, so the script and its `WAIT` must travel together: a pipeline is written to
//! one connection in one go (a reconnect between two separate commands would put the
//! `WAIT` on a fresh connection with no write to wait for, and it would answer at once).
//! On a cluster, redis-rs sends a lone `WAIT` to every primary and answers the smallest
//! count; the pipeline is routed explicitly to the primary of the record's slot instead.
//!
//! [`RedisStoreBuilder::wait_for_replicas`]: super::RedisStoreBuilder::wait_for_replicas

use std::time::Duration;

use idem_core::StoreError;
use redis::{Cmd, ErrorKind, RedisError, Script, ServerErrorKind, Value};

use super::{record, store_error, Connection, RedisStore};

/// How many replicas must acknowledge a claim and a complete, and how long to wait for
/// them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplicaWait {
    pub(crate) replicas: u32,
    pub(crate) timeout: Duration,
}

impl ReplicaWait {
    /// The level, or `None` (off) for zero replicas. The timeout is at least 1 ms: `WAIT`
    /// with a timeout of 0 blocks forever.
    pub(crate) fn new(replicas: u32, timeout: Duration) -> Option<ReplicaWait> {
        (replicas > 0).then(|| ReplicaWait {
            replicas,
            timeout: timeout.max(Duration::from_millis(1)),
        })
    }

    /// The error of a step that `acknowledged` replicas took, when that is too few.
    pub(crate) fn shortfall(
        &self,
        backend: &'static str,
        step: &'static str,
        acknowledged: u32,
    ) -> Option<StoreError> {
        (acknowledged < self.replicas).then_some(StoreError::NotReplicated {
            backend,
            step,
            acknowledged,
            required: self.replicas,
            after: self.timeout,
        })
    }
}

/// `EVALSHA <sha> <n> <keys...>`, the start of a script's command; the caller adds the
/// arguments.
pub(crate) fn evalsha(script: &Script, keys: &[&str]) -> Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash()).arg(keys.len()).arg(keys);
    cmd
}

impl RedisStore {
    /// Runs `eval` (the [`evalsha`] of `script` on `key`) and `WAIT` in one round trip,
    /// under the command timeout; answers the script's reply and how many replicas
    /// acknowledged. A server that lost the script gets it loaded, and the pair is sent
    /// once more.
    pub(super) async fn run_replicated(
        &self,
        step: &'static str,
        wait: ReplicaWait,
        script: &'static Script,
        key: &str,
        eval: Cmd,
    ) -> Result<(Value, u32), StoreError> {
        let backend = self.conn.backend();
        let mut pipe = redis::pipe();
        pipe.add_command(eval)
            .cmd("WAIT")
            .arg(wait.replicas)
            .arg(record::millis(wait.timeout))
            // Each reply is looked at on its own: a script's error is the step's error.
            .ignore_errors();
        let attempt = async {
            self.check_epoch().await;
            let mut reloaded = false;
            loop {
                let replies = self.conn.pipeline(&pipe, key).await?;
                match split(replies)? {
                    (Err(e), _)
                        if !reloaded
                            && e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) =>
                    {
                        self.conn.load(script).await?;
                        reloaded = true;
                    }
                    (reply, acknowledged) => return Ok((reply?, acknowledged?)),
                }
            }
        };
        match tokio::time::timeout(self.command_timeout, attempt).await {
            Ok(Ok(done)) => Ok(done),
            Ok(Err(e)) => Err(self.failed(store_error(backend, step, e, self.command_timeout))),
            Err(_) => Err(self.failed(StoreError::Timeout {
                backend,
                step,
                after: self.command_timeout,
            })),
        }
    }
}

/// The two replies of a script-and-`WAIT` pipeline: the script's, and the number of
/// replicas that acknowledged.
type Replies = (Result<Value, RedisError>, Result<u32, RedisError>);

fn split(replies: Vec<Value>) -> Result<Replies, RedisError> {
    let Ok([reply, acked]) = <[Value; 2]>::try_from(replies) else {
        return Err(unexpected(
            "the script-and-WAIT pipeline did not answer two replies",
        ));
    };
    let reply = match reply {
        Value::ServerError(e) => Err(e.into()),
        reply => Ok(reply),
    };
    let acked = match acked {
        Value::Int(n) => Ok(u32::try_from(n).unwrap_or(0)),
        Value::ServerError(e) => Err(e.into()),
        other => Err(unexpected(&format!("WAIT answered {other:?}"))),
    };
    Ok((reply, acked))
}

fn unexpected(what: &str) -> RedisError {
    RedisError::from((
        ErrorKind::Client,
        "unexpected reply from Redis",
        what.to_string(),
    ))
}

impl Connection {
    /// Sends `pipe` whole on one connection: the server's, or on a cluster the one to the
    /// primary of `key`'s slot.
    async fn pipeline(&self, pipe: &redis::Pipeline, key: &str) -> Result<Vec<Value>, RedisError> {
        match self {
            Connection::Standalone(c) => {
                let _ = key;
                pipe.query_async(&mut c.clone()).await
            }
            #[cfg(feature = "redis-cluster")]
            Connection::Cluster(c) => {
                use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
                let route =
                    SingleNodeRoutingInfo::SpecificNode(Route::with_key(key, SlotAddr::Master));
                c.clone()
                    .route_pipeline(pipe.clone(), 0, pipe.len(), route)
                    .await
            }
        }
    }

    /// Loads `script` (on every node of a cluster).
    async fn load(&self, script: &Script) -> Result<String, RedisError> {
        match self {
            Connection::Standalone(c) => script.load_async(&mut c.clone()).await,
            #[cfg(feature = "redis-cluster")]
            Connection::Cluster(c) => script.load_async(&mut c.clone()).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_replicas_is_off_and_a_zero_timeout_is_never_forever() {
        assert_eq!(ReplicaWait::new(0, Duration::from_secs(1)), None);
        let wait = ReplicaWait::new(2, Duration::ZERO).unwrap();
        assert_eq!(
            wait.timeout,
            Duration::from_millis(1),
            "WAIT n 0 would block forever"
        );
    }

    #[test]
    fn a_shortfall_names_the_step_and_the_counts() {
        let wait = ReplicaWait::new(2, Duration::from_millis(250)).unwrap();
        assert!(wait.shortfall("redis", "claim", 2).is_none());
        assert!(wait.shortfall("redis", "claim", 3).is_none());
        let err = wait.shortfall("redis", "complete", 1).unwrap();
        assert!(err.is_temporary());
        assert!(matches!(
            err,
            StoreError::NotReplicated {
                backend: "redis",
                step: "complete",
                acknowledged: 1,
                required: 2,
                ..
            }
        ));
        assert_eq!(
            err.to_string(),
            "the redis store applied the complete step, but only 1 of the 2 replicas it requires acknowledged it within 250ms"
        );
    }

    #[test]
    fn the_pipeline_replies_are_read_each_on_its_own() {
        let (reply, acked) = split(vec![Value::Int(0), Value::Int(1)]).unwrap();
        assert_eq!((reply.unwrap(), acked.unwrap()), (Value::Int(0), 1));

        // A script's error stays the script's, beside WAIT's count: NOSCRIPT (load and send
        // again) is told apart from any other error.
        let noscript = redis::parse_redis_value(b"-NOSCRIPT No matching script.\r\n").unwrap();
        let (reply, acked) = split(vec![noscript, Value::Int(1)]).unwrap();
        assert_eq!(
            reply.unwrap_err().kind(),
            ErrorKind::Server(ServerErrorKind::NoScript)
        );
        assert_eq!(acked.unwrap(), 1);
        let wrongtype =
            redis::parse_redis_value(b"-WRONGTYPE Operation against a key\r\n").unwrap();
        let (reply, _) = split(vec![wrongtype, Value::Int(0)]).unwrap();
        assert_eq!(reply.unwrap_err().code(), Some("WRONGTYPE"));
    }

    #[test]
    fn a_pipeline_of_another_shape_is_an_error() {
        assert!(split(vec![Value::Int(0)]).is_err());
        let (_, acked) = split(vec![Value::Int(0), Value::Okay]).unwrap();
        assert!(acked.is_err());
    }
}
