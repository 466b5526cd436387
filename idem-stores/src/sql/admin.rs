//! [`Admin`] for every SQL store: the dialect's own statements (`get`, `delete_seen`,
//! `delete_ended`, `count_ended`, `stats`, `purge`), with its key encoding and clock.

use async_trait::async_trait;
use bytes::Bytes;
use idem_core::{Key, StoreError, Token};

use super::dialect::{Arg, Col, Dialect};
use super::{remaining, token_from_db, token_to_db, SqlStore};
use crate::admin::{
    self, Admin, AdminError, DeleteOptions, DeleteSeen, Deletion, RecordInfo, RecordState, Stats,
};

/// The batch size of a purge: short statements, so claims get their turn between them.
const PURGE_BATCH: u32 = 1000;

#[async_trait]
impl<D: Dialect> Admin for SqlStore<D> {
    async fn describe(&self, key: &Key) -> Result<Option<RecordInfo>, AdminError> {
        let Some(live) = self.live(key).await? else {
            return Ok(None);
        };
        let fingerprint = live.fingerprint(D::BACKEND)?;
        let stored_key = match D::key(key) {
            Arg::Text(s) => s,
            Arg::Bytes(b) => String::from_utf8_lossy(&b).into_owned(),
            Arg::Int(i) => i.to_string(),
        };
        let payload = live.payload.map(Bytes::from);
        Ok(Some(RecordInfo {
            state: if live.completed {
                RecordState::Completed
            } else {
                RecordState::InProgress
            },
            fingerprint,
            token: token_from_db(live.token),
            time_left: remaining(live.remaining_ms),
            stored_bytes: live.fingerprint.len() + payload.as_ref().map_or(0, Bytes::len),
            payload,
            stored_key,
        }))
    }

    async fn stats(&self) -> Result<Stats, AdminError> {
        self.ready().await?;
        let row = D::fetch_optional(self.pool(), &self.statements().stats, vec![])
            .await
            .map_err(|e| self.error(e))?;
        let Some(row) = row else {
            return Ok(Stats::default());
        };
        let count = |name| -> Result<u64, StoreError> {
            let n = D::int(&row, Col::Name(name)).map_err(|e| self.error(e))?;
            Ok(u64::try_from(n).unwrap_or(0))
        };
        Ok(Stats {
            in_progress: count("in_progress")?,
            completed: count("completed")?,
            ended: count("ended")?,
        })
    }

    async fn delete_record(
        &self,
        key: &Key,
        options: DeleteOptions,
    ) -> Result<Deletion, AdminError> {
        admin::delete_record(self, key, options).await
    }

    async fn purge(&self, dry_run: bool) -> Result<u64, AdminError> {
        if !dry_run {
            return Ok(self.purge_expired(PURGE_BATCH).await?);
        }
        self.ready().await?;
        let row = D::fetch_optional(self.pool(), &self.statements().count_ended, vec![])
            .await
            .map_err(|e| self.error(e))?;
        let n = match row {
            Some(row) => D::int(&row, Col::Name("n")).map_err(|e| self.error(e))?,
            None => 0,
        };
        Ok(u64::try_from(n).unwrap_or(0))
    }

    async fn ensure_schema(&self) -> Result<Option<String>, AdminError> {
        self.migrate().await?;
        Ok(Some(format!("table `{}`", self.table())))
    }
}

#[async_trait]
impl<D: Dialect> DeleteSeen for SqlStore<D> {
    async fn delete_seen(&self, key: &Key, token: Token) -> Result<bool, StoreError> {
        let args = vec![D::key(key), Arg::Int(token_to_db(token))];
        let done = D::execute(self.pool(), &self.statements().delete_seen, args)
            .await
            .map_err(|e| self.error(e))?;
        Ok(D::rows_affected(&done) == 1)
    }

    async fn delete_ended(&self, key: &Key) -> Result<(), StoreError> {
        D::execute(
            self.pool(),
            &self.statements().delete_ended,
            vec![D::key(key)],
        )
        .await
        .map_err(|e| self.error(e))?;
        Ok(())
    }
}
