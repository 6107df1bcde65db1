//! PostgreSQL-only behaviour, beyond the shared contract: `NOTIFY` on enqueue.
//! Skipped (with a message) unless `DROVER_TEST_POSTGRES_URL` is set.

mod support;

use std::time::Duration;

use drover::store::{ItemEnqueue, PostgresStore, StoreEngine as _};

#[tokio::test]
async fn an_enqueue_notifies_the_process_channel_on_commit() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema) = support::postgres(&base).await;
    let mut listener = sqlx::postgres::PgListener::connect(&db.url)
        .await
        .expect("listener connects");
    let channel = PostgresStore::notify_channel("provision");
    listener.listen(&channel).await.expect("listen");
    db.store
        .item_enqueue(ItemEnqueue::new("provision", ["m1"]))
        .await
        .expect("enqueue");
    let note = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("a notification arrives")
        .expect("listener works");
    assert_eq!(note.channel(), channel);
    db.store.close().await;
    drop(listener);
    support::drop_schema(&base, &schema).await;
}

#[test]
fn channel_names_are_short_valid_identifiers() {
    assert_eq!(
        PostgresStore::notify_channel("provision"),
        "drover_provision"
    );
    let odd = PostgresStore::notify_channel("Name With Spaces/and/a/very/long/path/that/goes/on");
    assert!(odd.len() <= 63 && odd.starts_with("drover_"), "{odd}");
    assert!(odd.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
    assert_ne!(odd, PostgresStore::notify_channel("Name With Spaces"));
}
