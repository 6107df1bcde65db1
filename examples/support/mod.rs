//! What both seed examples share: where they store by default, and (for their
//! tests) running them on every engine.

/// The database URL from the first argument, or a fresh SQLite file named `file`
/// in a temporary directory.
pub(crate) fn database_url(file: &str) -> std::io::Result<String> {
    if let Some(url) = std::env::args().nth(1) {
        return Ok(url);
    }
    let dir = std::env::temp_dir().join(format!("drover-example-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(format!("sqlite://{}", dir.join(file).display()))
}

/// Runs `example` on a fresh SQLite file, then — when `DROVER_TEST_POSTGRES_URL`
/// is set, and then required — on a fresh PostgreSQL schema; returns the
/// summaries.
#[cfg(test)]
pub(crate) async fn on_every_engine<F, Fut>(example: F) -> Vec<String>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<String, drover::runner::BoxError>>,
{
    let dir = tempfile::tempdir().expect("a temporary directory");
    let url = format!("sqlite://{}", dir.path().join("example.db").display());
    let mut summaries = vec![example(url).await.expect("the example runs on SQLite")];
    let Ok(base) = std::env::var("DROVER_TEST_POSTGRES_URL") else {
        eprintln!("skipping PostgreSQL: DROVER_TEST_POSTGRES_URL is not set");
        return summaries;
    };
    let schema = format!(
        "drover_example_{}_{:08x}",
        std::process::id(),
        rand::random::<u32>()
    );
    let admin = sqlx::PgPool::connect(&base)
        .await
        .expect("DROVER_TEST_POSTGRES_URL is set but unreachable");
    let schema_sql = |sql: String| sqlx::raw_sql(sqlx::AssertSqlSafe(sql));
    schema_sql(format!("CREATE SCHEMA {schema}"))
        .execute(&admin)
        .await
        .expect("create schema");
    let result = example(format!("{base}?options=-c%20search_path%3D{schema}")).await;
    schema_sql(format!("DROP SCHEMA {schema} CASCADE"))
        .execute(&admin)
        .await
        .expect("drop schema");
    summaries.push(result.expect("the example runs on PostgreSQL"));
    summaries
}
