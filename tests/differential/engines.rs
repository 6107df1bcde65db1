//! The engines a differential run compares with the model: SQLite on a fresh
//! file always; PostgreSQL in a fresh schema when `DROVER_TEST_POSTGRES_URL`
//! is set (skipped with a printed reason when it is not, and a loud failure
//! when it is set but unreachable). Every case of the run shares them, each
//! with a process of its own.

use drover::store::Store;

use crate::support::{drop_schema, postgres_schema, postgres_url};

/// The connected engines, and what to clean up after.
pub(crate) struct Engines {
    pub stores: Vec<(&'static str, Store)>,
    _dir: tempfile::TempDir,
    /// The PostgreSQL server and the schema made for this run.
    postgres: Option<(String, String)>,
}

impl Engines {
    pub(crate) async fn connect() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}", dir.path().join("drover.db").display());
        let sqlite = Store::connect(&url).await.expect("connect to SQLite");
        let mut stores = vec![("sqlite", sqlite)];
        let mut postgres = None;
        if let Some(base) = postgres_url() {
            let (url, schema) = postgres_schema(&base).await;
            let store = Store::connect(&url).await.expect("connect to PostgreSQL");
            stores.push(("postgres", store));
            postgres = Some((base, schema));
        }
        Self {
            stores,
            _dir: dir,
            postgres,
        }
    }

    pub(crate) fn names(&self) -> Vec<&'static str> {
        self.stores.iter().map(|(name, _)| *name).collect()
    }

    /// Closes the stores and drops the PostgreSQL schema.
    pub(crate) async fn close(&self) {
        for (_, store) in &self.stores {
            store.close().await;
        }
        if let Some((base, schema)) = &self.postgres {
            drop_schema(base, schema).await;
        }
    }
}
