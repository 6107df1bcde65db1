//! The store's contract for migrations: idempotent, and a newer schema is
//! refused; on every engine via `support::each_engine`.

mod support;

use drover::store::{Store, StoreError};
use support::each_engine;
use support::store::{enqueue, item};

#[tokio::test]
async fn migrating_again_is_a_no_op_and_a_newer_schema_is_refused() {
    each_engine(|db| async move {
        enqueue(&db.store, &["a"]).await;
        db.store.migrate().await.expect("migrate again");
        db.reconnect()
            .await
            .migrate()
            .await
            .expect("migrate from another node");
        assert!(item(&db.store, "a").await.is_some(), "data kept");
        sqlx_insert_future_migration(&db).await;
        let err = Store::connect(&db.url).await.expect_err("newer schema");
        assert!(
            matches!(err, StoreError::SchemaTooNew { found: 99_999, .. }),
            "{err}"
        );
    })
    .await;
}

/// Pretends a newer drover migrated the database.
async fn sqlx_insert_future_migration(db: &support::TestDb) {
    let sql =
        "INSERT INTO drover_migrations (version, description, success, checksum, execution_time)
               VALUES (99999, 'from the future', true, x'00', 0)";
    let sql = if db.engine == "postgres" {
        sql.replace("x'00'", "'\\x00'::bytea")
    } else {
        sql.to_owned()
    };
    match db.engine {
        "postgres" => {
            let pool = sqlx::PgPool::connect(&db.url).await.expect("connect");
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(&pool)
                .await
                .expect("insert");
        }
        _ => {
            let pool = sqlx::SqlitePool::connect(&db.url).await.expect("connect");
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(&pool)
                .await
                .expect("insert");
        }
    }
}
