//! Loading idem's Lua scripts into the server (every node of a cluster) when a store
//! connects; a script the server lost is loaded again on `NOSCRIPT` by the steps themselves.

use super::{scripts, Connection, RedisStore};

impl RedisStore {
    /// Loads the scripts (on every node of a cluster), checks the eviction policy, then reads
    /// (or writes) the epoch.
    pub(super) async fn prepare(&self) -> Result<(), redis::RedisError> {
        for script in scripts::all() {
            let load = script.prepare_invoke();
            let loaded = match &self.conn {
                Connection::Standalone(c) => {
                    tokio::time::timeout(self.command_timeout, load.load_async(&mut c.clone()))
                        .await
                }
                #[cfg(feature = "redis-cluster")]
                Connection::Cluster(c) => {
                    tokio::time::timeout(self.command_timeout, load.load_async(&mut c.clone()))
                        .await
                }
            };
            match loaded {
                Ok(res) => {
                    res?;
                }
                Err(_) => {
                    return Err(redis::RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!(
                            "SCRIPT LOAD did not answer within {:?}",
                            self.command_timeout
                        ),
                    )))
                }
            }
        }
        self.warn_if_evicting().await;
        // The epoch the store compares with from now on (written when there is none). Not
        // a reason to refuse the connection: the steps read it again until it answers.
        match tokio::time::timeout(self.command_timeout, self.read_epoch()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(target: "idem", server = %self.epoch.server, epoch_key = %self.epoch.key, error = %e,
                    "could not read or write the Redis epoch at connect; a loss of the records is not noticed until it can be")
            }
            Err(_) => {
                tracing::debug!(target: "idem", "the Redis epoch did not answer at connect; it is read before the first step")
            }
        }
        Ok(())
    }
}
