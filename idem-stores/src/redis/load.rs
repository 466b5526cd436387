//! Loading idem's Lua scripts into the server (every node of a cluster) when a store
//! connects; a script the server lost is loaded again on `NOSCRIPT` by the steps themselves.

use super::{scripts, Connection, RedisStore};

impl RedisStore {
    /// Loads the scripts (on every node of a cluster), then checks the eviction policy.
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
        Ok(())
    }
}
