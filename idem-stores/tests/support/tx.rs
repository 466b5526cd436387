//! What the transactional tests (`transactional.rs`, `tx_step_attack.rs`) share: a migrated
//! store with an effect table beside its records, on each SQL dialect, dropped at the end.

use std::sync::atomic::{AtomicU64, Ordering};

/// A store (migrated) and the name of an effect table beside its records, with what
/// keeps them alive and cleans up.
pub struct Fixture<D: idem_stores::Transactional> {
    pub store: idem_stores::SqlStore<D>,
    pub effects: String,
    cleanup: Option<Cleanup>,
    _dir: Option<tempfile::TempDir>,
}

/// What a fixture drops at the end: a Postgres schema, or MySQL tables.
enum Cleanup {
    PostgresSchema { url: String, schema: String },
    MySqlTables { url: String, tables: Vec<String> },
}

impl<D: idem_stores::Transactional> Drop for Fixture<D> {
    fn drop(&mut self) {
        if let Some(cleanup) = self.cleanup.take() {
            // From a thread and a connection of its own: the test's runtime is blocked
            // here, and the pool's connections belong to it.
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    use sqlx::Connection;
                    match cleanup {
                        Cleanup::PostgresSchema { url, schema } => {
                            let Ok(mut conn) = sqlx::PgConnection::connect(&url).await else {
                                return;
                            };
                            let _ =
                                sqlx::query(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
                                    .execute(&mut conn)
                                    .await;
                        }
                        Cleanup::MySqlTables { url, tables } => {
                            let Ok(mut conn) = sqlx::MySqlConnection::connect(&url).await else {
                                return;
                            };
                            for table in tables {
                                let _ = sqlx::query(&format!("DROP TABLE IF EXISTS {table}"))
                                    .execute(&mut conn)
                                    .await;
                            }
                        }
                    }
                });
            })
            .join()
            .unwrap();
        }
    }
}

/// A name no other test run uses.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "{prefix}_{nanos:x}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A Postgres store in a schema of its own, whose effect table's `message` column is
/// declared as `message` (with a primary key or without).
pub async fn postgres(prefix: &str, message: &str) -> Option<Fixture<sqlx::Postgres>> {
    let url = idem_core::testing::backend_url("IDEM_TEST_POSTGRES_URL")?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(12)
        .connect(&url)
        .await
        .unwrap();
    let schema = unique(prefix);
    sqlx::query(&format!("CREATE SCHEMA \"{schema}\""))
        .execute(&pool)
        .await
        .unwrap();
    let effects = format!("\"{schema}\".effects");
    sqlx::query(&format!(
        "CREATE TABLE {effects} ({message}, body text NOT NULL)"
    ))
    .execute(&pool)
    .await
    .unwrap();
    let store = idem_stores::PostgresStore::new(pool.clone())
        .with_table(&format!("{schema}.idem_records"))
        .unwrap();
    store.migrate().await.unwrap();
    Some(Fixture {
        store,
        effects,
        cleanup: Some(Cleanup::PostgresSchema { url, schema }),
        _dir: None,
    })
}

/// A MySQL store on tables of their own.
pub async fn mysql(prefix: &str) -> Option<Fixture<sqlx::MySql>> {
    let url = idem_core::testing::backend_url("IDEM_TEST_MYSQL_URL")?;
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(12)
        .connect(&url)
        .await
        .unwrap();
    let name = unique(prefix);
    // No primary key on the effect: a second row for a message must be countable.
    let effects = format!("`{name}_effects`");
    sqlx::query(&format!(
        "CREATE TABLE {effects} (message varchar(255) NOT NULL, body text NOT NULL) ENGINE=InnoDB"
    ))
    .execute(&pool)
    .await
    .unwrap();
    let records = format!("{name}_records");
    let store = idem_stores::MySqlStore::new(pool.clone())
        .with_table(&records)
        .unwrap();
    store.migrate().await.unwrap();
    Some(Fixture {
        store,
        effects: effects.clone(),
        cleanup: Some(Cleanup::MySqlTables {
            url,
            tables: vec![effects, format!("`{records}`")],
        }),
        _dir: None,
    })
}

/// A SQLite store in a temporary file.
pub async fn sqlite() -> Option<Fixture<sqlx::Sqlite>> {
    let dir = tempfile::tempdir().unwrap();
    let store = idem_stores::SqliteStore::open(dir.path().join("idem.db"))
        .await
        .unwrap();
    // No primary key on the effect: a second row for a message must be countable, not an
    // error that would hide a missing dedup.
    sqlx::query("CREATE TABLE effects (message text NOT NULL, body text NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    Some(Fixture {
        store,
        effects: "effects".into(),
        cleanup: None,
        _dir: Some(dir),
    })
}
