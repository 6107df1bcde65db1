//! The engines a differential run compares with the model: SQLite on a fresh
//! file always; PostgreSQL in a fresh schema when `DROVER_TEST_POSTGRES_URL`
//! is set (skipped with a printed reason when it is not, and a loud failure
//! when it is set but unreachable). Every case of the run shares them, each
//! with a process of its own.

use drover::store::Store;

/// The variable naming the PostgreSQL server for tests.
pub(crate) const POSTGRES_ENV: &str = "DROVER_TEST_POSTGRES_URL";

/// The connected engines, and what to clean up after.
pub(crate) struct Engines {
    pub stores: Vec<(&'static str, Store)>,
    _dir: tempfile::TempDir,
    /// The PostgreSQL server and the schema made for this run.
    postgres: Option<(String, String)>,
}

/// Runs one administrative statement; panics, naming the variable, if the
/// server is unreachable.
pub(crate) async fn admin_execute(url: &str, sql: &str) {
    let admin = sqlx::PgPool::connect(url)
        .await
        .unwrap_or_else(|e| panic!("{POSTGRES_ENV}={url} is set but unreachable: {e}"));
    sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(&admin)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    admin.close().await;
}

/// The PostgreSQL server's URL, or `None` (with a printed reason).
pub(crate) fn postgres_url() -> Option<String> {
    match std::env::var(POSTGRES_ENV) {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            eprintln!("skipping PostgreSQL: {POSTGRES_ENV} is not set");
            None
        }
    }
}

/// A fresh schema on the server at `base` (a name no other run uses) and a
/// URL whose connections work in it.
pub(crate) async fn schema(base: &str) -> (String, String) {
    let schema = format!(
        "drover_diff_{}_{:08x}",
        std::process::id(),
        rand::random::<u32>()
    );
    admin_execute(base, &format!("CREATE SCHEMA {schema}")).await;
    let sep = if base.contains('?') { '&' } else { '?' };
    (
        format!("{base}{sep}options=-c%20search_path%3D{schema}"),
        schema,
    )
}

impl Engines {
    pub(crate) async fn connect() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}", dir.path().join("drover.db").display());
        let sqlite = Store::connect(&url).await.expect("connect to SQLite");
        let mut stores = vec![("sqlite", sqlite)];
        let mut postgres = None;
        if let Some(base) = postgres_url() {
            let (url, schema) = schema(&base).await;
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
            admin_execute(base, &format!("DROP SCHEMA {schema} CASCADE")).await;
        }
    }
}
