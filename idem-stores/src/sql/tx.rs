//! Transactional dedup: a completed record written inside the caller's own sqlx
//! transaction, so that it commits or rolls back together with the business write.
//!
//! No lease and no second connection: one `INSERT ... ON CONFLICT` on the caller's
//! connection, whose row count tells the first delivery from a duplicate (on MySQL, an
//! `INSERT ... ON DUPLICATE KEY UPDATE` and a read of the row's token on the same
//! connection). The row is the
//! store's own (same table, same key encoding, the same JSON envelope the engine writes),
//! so the lease-based path (`Idem::consume`, `Idem::mark_processed`, `#[idempotent]` with
//! `fingerprint = none`) and this one see each other's records.
//!
//! **When to use which.** Use this path when every effect of the handler is a write to the
//! same database as the store: the effect and the dedup record are then one atomic unit,
//! exactly once with no lease and nothing to recover (a crash before the commit leaves
//! neither; the redelivery does the work). Use the lease-based path when an effect leaves the
//! database (an email, a payment provider, an HTTP call): no transaction can roll those back,
//! so what keeps a second consumer from repeating them is the lease and the stored result.

use std::time::Duration;

use idem_core::envelope::{open_value, seal_value};
use idem_core::{Claim, Codec, Error, Fingerprint, Json, Key, Origin, Outcome, StoreError, Token};
use serde::{de::DeserializeOwned, Serialize};

use super::dialect::{Arg, Col, Dialect, Sql};
use super::{millis, token_to_db, SqlStore, TableName, CLAIM_ATTEMPTS};

/// A SQL dialect whose records can be written inside the caller's transaction: Postgres,
/// SQLite and MySQL/MariaDB.
pub trait Transactional: Dialect {
    /// `INSERT` of a completed record (key `$1`, fingerprint `$2`, token `$3`, payload `$4`,
    /// ttl `$5` ms) that also takes over an ended record, and affects no row when a live
    /// record is under the key.
    fn insert_completed(table: &TableName) -> Sql;

    /// Whether the insert's row count cannot tell a write from a statement that left a
    /// live record alone, so that the record is read back and its token compared instead.
    const READS_BACK_TOKEN: bool = false;
}

#[cfg(feature = "postgres")]
impl Transactional for sqlx::Postgres {
    fn insert_completed(table: &TableName) -> Sql {
        let t = table.quoted();
        Sql::numbered(format!(
            "INSERT INTO {t} AS r (key, fingerprint, token, completed, payload, ends_at)
             VALUES ($1, $2, $3, true, $4, clock_timestamp() + $5 * interval '1 millisecond')
             ON CONFLICT (key) DO UPDATE
                SET fingerprint = excluded.fingerprint, token = excluded.token, completed = true,
                    payload = excluded.payload, ends_at = excluded.ends_at
                WHERE r.ends_at <= now()"
        ))
    }
}

/// MySQL's upsert has no `WHERE`: each column is assigned the new value only when the row
/// there has ended (`ends_at`, which the conditions read, assigned last, as MySQL assigns
/// left to right). Its row count cannot tell the two apart (with `CLIENT_FOUND_ROWS`, which
/// sqlx sets, a row set to its own values counts 1, as an insert does), so the record is
/// read back on the same connection and this statement's token tells whether it wrote it.
/// InnoDB locks the row for the rest of the transaction; a deadlock between two
/// transactions on one key is `Error::Store`, temporary: roll back and redeliver.
#[cfg(feature = "mysql")]
impl Transactional for sqlx::MySql {
    const READS_BACK_TOKEN: bool = true;

    fn insert_completed(table: &TableName) -> Sql {
        let t = table.backticked_with("");
        let now = super::mysql::NOW_MS;
        let ended = format!("ends_at <= {now}");
        Sql::positional(&format!(
            "INSERT INTO {t} (`key`, fingerprint, token, completed, payload, ends_at)
             VALUES ($1, $2, $3, TRUE, $4, {now} + $5)
             ON DUPLICATE KEY UPDATE
                fingerprint = IF({ended}, VALUES(fingerprint), fingerprint),
                token = IF({ended}, VALUES(token), token),
                completed = IF({ended}, VALUES(completed), completed),
                payload = IF({ended}, VALUES(payload), payload),
                ends_at = IF({ended}, VALUES(ends_at), ends_at)"
        ))
    }
}

#[cfg(feature = "sqlite")]
impl Transactional for sqlx::Sqlite {
    fn insert_completed(table: &TableName) -> Sql {
        let t = table.quoted();
        let now = super::sqlite::NOW_MS;
        Sql::numbered(format!(
            "INSERT INTO {t} (key, fingerprint, token, completed, payload, ends_at)
             VALUES (?1, ?2, ?3, 1, ?4, {now} + ?5)
             ON CONFLICT (key) DO UPDATE
                SET fingerprint = excluded.fingerprint, token = excluded.token, completed = 1,
                    payload = excluded.payload, ends_at = excluded.ends_at
                WHERE {t}.ends_at <= {now}"
        ))
    }
}

impl<D: Transactional> SqlStore<D> {
    /// Marks `key` processed inside the caller's transaction (`&mut *tx` for a
    /// `sqlx::Transaction`, or a plain connection) for `ttl`: [`Origin::Ran`] when this
    /// statement wrote the record, [`Origin::Store`] when a completed one was there.
    /// The record commits or rolls back with the transaction; until it commits, a
    /// concurrent transaction marking the same key waits for it (Postgres: on the key's
    /// index entry; SQLite: on the write lock), then sees it.
    ///
    /// Do the business write in the same transaction, and only when this answers
    /// [`Origin::Ran`]; commit, then ack the message. A key a lease-based call still
    /// holds is [`Error::InProgress`]: roll back and requeue the message.
    ///
    /// ```no_run
    /// # async fn demo(store: idem::stores::PostgresStore, order_id: i64) -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use idem::{Fingerprint, Key, Origin};
    /// let key = Key::new("shipping.consumer", format!("order-shipped:{order_id}"))?;
    /// let mut tx = store.pool().begin().await?;
    /// let fp = Fingerprint::of(&order_id); // the message's payload
    /// if store.mark_processed_in(&mut *tx, &key, fp, Duration::from_secs(7 * 24 * 3600)).await? == Origin::Ran {
    ///     sqlx::query("INSERT INTO shipments (order_id) VALUES ($1)")
    ///         .bind(order_id)
    ///         .execute(&mut *tx)
    ///         .await?;
    /// }
    /// tx.commit().await?; // then ack
    /// # Ok(()) }
    /// ```
    pub async fn mark_processed_in(
        &self,
        conn: &mut D::Connection,
        key: &Key,
        fingerprint: Fingerprint,
        ttl: Duration,
    ) -> Result<Origin, Error> {
        let outcome = self
            .save_result_in(conn, key, fingerprint, &(), ttl)
            .await?;
        Ok(outcome.origin())
    }

    /// The value of step `name` of the idempotent call whose body is running, when an
    /// earlier attempt recorded it: read on the caller's connection, so inside its
    /// transaction. `None` when the step has no record: do its write, then
    /// [`record_step_in`](SqlStore::record_step_in) in the same transaction. Together they
    /// make a *transactional step*: a write to this database and its step record commit or
    /// roll back as one, so a crash between them can never run the write twice, and a
    /// rollback leaves no record.
    ///
    /// ```no_run
    /// # async fn demo(store: idem::stores::PostgresStore, order_id: i64) -> Result<i64, Box<dyn std::error::Error>> {
    /// // Inside an idempotent call's body.
    /// let mut tx = store.pool().begin().await?;
    /// let reservation: i64 = match store.completed_step_in(&mut *tx, "reserve").await? {
    ///     Some(id) => id, // an earlier attempt's reservation committed
    ///     None => {
    ///         let id: i64 = sqlx::query_scalar("INSERT INTO reservations (order_id) VALUES ($1) RETURNING id")
    ///             .bind(order_id)
    ///             .fetch_one(&mut *tx)
    ///             .await?;
    ///         store.record_step_in(&mut *tx, "reserve", &id).await?
    ///     }
    /// };
    /// tx.commit().await?;
    /// # Ok(reservation) }
    /// ```
    ///
    /// Errors: [`Error::Step`] outside an idempotent call's body; [`Error::KeyReuse`] when
    /// the record was written for another payload of the call; [`Error::InProgress`] when
    /// an ordinary step of that name holds the record; [`Error::Decode`] when its value is
    /// not a `T`; [`Error::Store`] when the database fails.
    pub async fn completed_step_in<T: DeserializeOwned>(
        &self,
        conn: &mut D::Connection,
        name: &str,
    ) -> Result<Option<T>, Error> {
        let step = idem_core::step_record(name)?;
        let key = step.key();
        let store = |source| Error::Store {
            key: key.clone(),
            source,
        };
        self.ready().await.map_err(store)?;
        let row = D::fetch_optional_on(conn, &self.statements().get, vec![D::key(key)])
            .await
            .map_err(|e| store(self.error(e)))?;
        let Some(row) = row else { return Ok(None) };
        let completed = D::flag(&row, Col::Name("completed")).map_err(|e| store(self.error(e)))?;
        let live = self.live_row(&row, completed).map_err(store)?;
        if live.remaining_ms <= 0 {
            return Ok(None);
        }
        match live.into_claim(D::BACKEND).map_err(store)? {
            Claim::InProgress { retry_after, .. } => Err(Error::InProgress {
                key: step.call_key().clone(),
                retry_after: retry_after.max(Duration::from_millis(1)),
            }),
            Claim::Completed {
                fingerprint,
                payload,
            } => {
                let theirs = fingerprint;
                let mine = step.fingerprint();
                if theirs != mine && theirs != Fingerprint::NONE && mine != Fingerprint::NONE {
                    return Err(Error::KeyReuse {
                        key: step.call_key().clone(),
                    });
                }
                let value = open_value(&Json, 0, &payload).map_err(|source| Error::Decode {
                    key: key.clone(),
                    source,
                })?;
                Ok(Some(value))
            }
            _ => Err(store(StoreError::Corrupt {
                backend: D::BACKEND,
                reason: "reading a record answered a claim".into(),
            })),
        }
    }

    /// Records `value` as the value of step `name` of the idempotent call whose body is
    /// running, inside the caller's transaction, and answers it as decoded from its stored
    /// bytes: see [`completed_step_in`](SqlStore::completed_step_in). The record carries the
    /// call's fingerprint and lives for the call's ttl; it commits or rolls back with the
    /// transaction. When another attempt's record of the step committed first (its
    /// transaction held the key's row until then), the answer is [`Error::InProgress`]:
    /// roll back, and the retry replays that attempt's value. (On MySQL at its default
    /// REPEATABLE READ, that loser may answer [`Error::Store`] instead, its read of the
    /// winner's row being from its own snapshot: roll back all the same.)
    pub async fn record_step_in<T>(
        &self,
        conn: &mut D::Connection,
        name: &str,
        value: &T,
    ) -> Result<T, Error>
    where
        T: Serialize + DeserializeOwned,
    {
        let step = idem_core::step_record(name)?;
        let out = self
            .save_result_in(conn, step.key(), step.fingerprint(), value, step.ttl())
            .await
            .map_err(|e| match e {
                Error::KeyReuse { .. } => Error::KeyReuse {
                    key: step.call_key().clone(),
                },
                e => e,
            })?;
        match out.origin() {
            Origin::Ran => Ok(out.into_value()),
            // Another attempt's write and record committed first: this transaction's own
            // write must not commit beside it.
            _ => Err(Error::InProgress {
                key: step.call_key().clone(),
                retry_after: Duration::from_millis(1),
            }),
        }
    }

    /// Stores `value` as the completed result of `key` (with `fingerprint`, for `ttl`)
    /// inside the caller's transaction, as the engine would have stored it (JSON codec,
    /// result version 0). The first time the answer is `value` as decoded from its stored
    /// bytes, with [`Origin::Ran`]; when a completed record is there already, its stored
    /// value with [`Origin::Store`], and nothing is written. A lease-based call with the
    /// same key, fingerprint and result type replays it, and the other way round.
    ///
    /// Errors: [`Error::KeyReuse`] when the record there has another fingerprint (neither
    /// being [`Fingerprint::NONE`]); [`Error::InProgress`] when a lease-based call holds
    /// the key; [`Error::Encode`] when `value` does not come back unchanged through JSON
    /// (compared by its JSON encoding), [`Error::Decode`] when the stored record is not
    /// such a value; [`Error::Store`] when the database fails (the transaction is then
    /// aborted on Postgres: roll it back).
    pub async fn save_result_in<T>(
        &self,
        conn: &mut D::Connection,
        key: &Key,
        fingerprint: Fingerprint,
        value: &T,
        ttl: Duration,
    ) -> Result<Outcome<T>, Error>
    where
        T: Serialize + DeserializeOwned,
    {
        let encode = |source| Error::Encode {
            key: key.clone(),
            source,
        };
        let decode = |source| Error::Decode {
            key: key.clone(),
            source,
        };
        let store = |source| Error::Store {
            key: key.clone(),
            source,
        };
        let sealed = seal_value(&Json, 0, value).map_err(encode)?;
        let decoded: T = open_value(&Json, 0, &sealed).map_err(decode)?;
        // Checked before anything is written, as the engine refuses such a value.
        let same = Json.encode(value).ok() == Json.encode(&decoded).ok();
        if !same {
            return Err(encode(
                "the value does not come back unchanged through the JSON codec".into(),
            ));
        }
        self.ready().await.map_err(store)?;
        let insert = D::insert_completed(self.table_name());
        for _ in 0..CLAIM_ATTEMPTS {
            let token = token_to_db(Token::random());
            let args = vec![
                D::key(key),
                Arg::Bytes(fingerprint.as_bytes().to_vec()),
                Arg::Int(token),
                Arg::Bytes(sealed.clone()),
                Arg::Int(millis(ttl)),
            ];
            let done = D::execute_on(conn, &insert, args)
                .await
                .map_err(|e| store(self.error(e)))?;
            if !D::READS_BACK_TOKEN && D::rows_affected(&done) == 1 {
                return Ok(Outcome::new(decoded, Origin::Ran));
            }
            // A live record is there: read it on the same connection, so a record this
            // transaction wrote earlier counts too.
            let row = D::fetch_optional_on(conn, &self.statements().get, vec![D::key(key)])
                .await
                .map_err(|e| store(self.error(e)))?;
            // Gone since the insert (deleted, or ended at this instant): insert again.
            let Some(row) = row else { continue };
            let completed =
                D::flag(&row, Col::Name("completed")).map_err(|e| store(self.error(e)))?;
            let live = self.live_row(&row, completed).map_err(store)?;
            if live.remaining_ms <= 0 {
                continue;
            }
            if D::READS_BACK_TOKEN && live.token == token {
                return Ok(Outcome::new(decoded, Origin::Ran));
            }
            return match live.into_claim(D::BACKEND).map_err(store)? {
                // The holder's remaining lease, bounded as the engine bounds its hint: a
                // holder usually finishes long before its lease ends.
                Claim::InProgress { retry_after, .. } => Err(Error::InProgress {
                    key: key.clone(),
                    retry_after: retry_after
                        .min(idem_core::DEFAULT_RETRY_AFTER)
                        .max(Duration::from_millis(1)),
                }),
                Claim::Completed {
                    fingerprint: stored,
                    payload,
                } => {
                    if stored != fingerprint
                        && stored != Fingerprint::NONE
                        && fingerprint != Fingerprint::NONE
                    {
                        return Err(Error::KeyReuse { key: key.clone() });
                    }
                    let value: T = open_value(&Json, 0, &payload).map_err(decode)?;
                    Ok(Outcome::new(value, Origin::Store))
                }
                _ => Err(store(StoreError::Corrupt {
                    backend: D::BACKEND,
                    reason: "reading a record answered a claim".into(),
                })),
            };
        }
        Err(store(super::NoAnswer::error(D::BACKEND)))
    }
}
