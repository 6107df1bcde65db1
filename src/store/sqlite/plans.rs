//! The hot statements' query plans, checked against the schema the migrations
//! build: a plan that walks a process's rows instead of probing an index costs
//! time in proportion to the backlog, which no functional test notices.

use super::SqliteStore;
use crate::store::StoreOptions;

/// The `EXPLAIN QUERY PLAN` details of each statement of `sql` (each `?`
/// bound to NULL), joined; the `BEGIN` and `COMMIT` that a transaction's
/// first and last queries carry have no plan.
async fn plan(store: &SqliteStore, sql: &str) -> String {
    let mut details = Vec::new();
    for statement in sql.split(';').map(str::trim) {
        if statement.is_empty() || statement.starts_with("BEGIN") || statement == "COMMIT" {
            continue;
        }
        let rows: Vec<(i64, i64, i64, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "EXPLAIN QUERY PLAN {statement}"
        )))
        .fetch_all(store.pool())
        .await
        .expect("the statement prepares against the migrated schema");
        details.extend(rows.into_iter().map(|(.., detail)| detail));
    }
    details.join("; ")
}

#[test]
fn the_queries_that_open_a_locked_transaction_begin_it() {
    // `SqliteStore::lock` sends no `BEGIN`: the transaction's first query
    // must, or its statements would each commit on their own.
    for sql in [
        super::leases::OPENING,
        super::leases::QUICK,
        super::complete::OPENING,
        super::complete::OPENING_QUICK,
        super::complete::ONE_TRIP,
    ] {
        assert!(sql.starts_with(super::engine::begin_immediate!()), "{sql}");
    }
    for sql in [super::leases::QUICK, super::complete::ONE_TRIP] {
        assert!(sql.ends_with("COMMIT"), "{sql}");
    }
}

#[test]
fn no_statement_hides_a_semicolon_in_its_text() {
    // `plan` splits queries of several statements at each `;`.
    for sql in [
        super::leases::OPENING,
        super::leases::START,
        super::leases::QUICK,
        super::complete::OPENING_QUICK,
        super::complete::CLEAN,
        super::complete::ONE_TRIP,
        super::leases::QUICK_IN_GROUP,
        super::complete::ONE_TRIP_IN_GROUP,
    ] {
        for statement in sql.split(';') {
            assert_eq!(statement.matches('\'').count() % 2, 0, "{statement}");
        }
    }
}

/// Whether sqlx binds every parameter of every statement of `sql`, a query
/// of several, given `args` arguments: a number a statement skips takes the
/// next argument in turn across the query, and once they run out the rest
/// of that statement is left unbound (see
/// [`SPARE_ARGUMENTS`](super::writer::SPARE_ARGUMENTS)).
fn binds_every_parameter(sql: &str, args: usize) -> Result<(), String> {
    let mut turns = 0;
    for statement in sql.split(';') {
        let mut used = std::collections::BTreeSet::new();
        let mut rest = statement;
        while let Some(at) = rest.find('?') {
            rest = &rest[at + 1..];
            let digits = rest.chars().take_while(char::is_ascii_digit).count();
            if let Ok(n) = rest[..digits].parse::<usize>() {
                used.insert(n);
            }
        }
        let Some(&highest) = used.last() else {
            continue;
        };
        for number in 1..=highest {
            let bound_to = if used.contains(&number) {
                number
            } else {
                turns += 1;
                turns
            };
            if bound_to > args {
                return Err(format!("?{number} is left unbound in: {statement}"));
            }
        }
    }
    Ok(())
}

#[test]
fn every_statement_of_a_query_of_several_gets_all_its_parameters() {
    use super::writer::SPARE_ARGUMENTS;
    // Each query with its own arguments, which suffice without the spares
    // every query of several statements is bound with (`writer::padded`).
    let queries = [
        (super::leases::OPENING, 4),
        (super::leases::START, 6),
        (super::leases::QUICK, 5),
        (super::complete::OPENING, 2),
        (super::complete::OPENING_QUICK, 5),
        (super::complete::CLEAN, 3),
        (super::complete::ONE_TRIP, 4),
        (super::leases::QUICK_IN_GROUP, 5),
        (super::complete::ONE_TRIP_IN_GROUP, 4),
    ];
    for (sql, args) in queries {
        if let Err(e) = binds_every_parameter(sql, args) {
            panic!("{e}");
        }
    }
    // The check fails where sqlx would leave a parameter unbound: here the
    // third statement's `?2` (the first two took both arguments' turns).
    let skips = "SELECT ?2; SELECT ?2; SELECT ?2";
    assert!(binds_every_parameter(skips, 2).is_err());
    assert!(binds_every_parameter(skips, 2 + SPARE_ARGUMENTS).is_ok());
}

#[tokio::test]
async fn sqlx_leaves_a_parameter_unbound_once_skipped_numbers_use_up_the_arguments() {
    // What `binds_every_parameter` models, and `SPARE_ARGUMENTS` mends: with
    // two arguments, the third statement's `?2` comes back NULL.
    let store = SqliteStore::connect("sqlite::memory:", &StoreOptions::default())
        .await
        .expect("an in-memory store opens");
    let skips = "SELECT ?2; SELECT ?2; SELECT ?2";
    let read = |spares: usize| {
        let mut query = sqlx::query_scalar::<_, Option<i64>>(skips)
            .bind(1_i64)
            .bind(2_i64);
        for _ in 0..spares {
            query = query.bind(None::<i64>);
        }
        query.fetch_all(store.pool())
    };
    assert_eq!(read(0).await.expect("runs"), [Some(2), Some(2), None]);
    let spares = super::writer::SPARE_ARGUMENTS;
    assert_eq!(read(spares).await.expect("runs"), [Some(2); 3]);
}

/// The plan of `sql` on a freshly migrated store.
async fn plan_of(sql: &str) -> String {
    let store = SqliteStore::connect("sqlite::memory:", &StoreOptions::default())
        .await
        .expect("an in-memory store opens");
    plan(&store, sql).await
}

/// Fails unless `plan` contains every one of `steps`.
fn assert_steps(plan: &str, steps: &[&str]) {
    for step in steps {
        assert!(plan.contains(step), "expected `{step}` in: {plan}");
    }
}

/// Fails unless the plan of `sql` on a freshly migrated store contains `step`.
async fn assert_plan(sql: &str, step: &str) {
    let plan = plan_of(sql).await;
    assert!(plan.contains(step), "expected `{step}` in: {plan}");
    assert!(
        !plan.contains("TEMP B-TREE FOR ORDER BY"),
        "a sort of every row in: {plan}"
    );
}

#[tokio::test]
async fn the_enqueue_probes_each_key_of_the_batch_not_the_backlog() {
    let plan = plan_of(super::enqueue::RUNNING).await;
    let steps = [
        "SCAN j VIRTUAL TABLE",
        "SEARCH i USING INDEX sqlite_autoindex_drover_items_1 (process=? AND key=?)",
    ];
    assert!(plan.starts_with(steps[0]), "{plan}");
    assert!(plan.contains(steps[1]), "{plan}");
}

#[tokio::test]
async fn the_concurrency_gate_reads_the_running_count_not_the_running_rows() {
    let plan = plan_of(super::gate::RUNNING_COUNT).await;
    assert!(plan.contains("drover_item_counts"), "{plan}");
    assert!(!plan.contains("drover_items "), "{plan}");
}

#[tokio::test]
async fn the_bulk_upsert_reads_the_batch_once_and_no_item_but_each_keys_own() {
    // Each key's row is found through the unique index by the conflict check,
    // which the plan does not show; a step on drover_items here would be a
    // walk of the backlog.
    let store = SqliteStore::connect("sqlite::memory:", &StoreOptions::default())
        .await
        .expect("an in-memory store opens");
    let plan = plan(&store, super::enqueue::UPSERT).await;
    assert!(plan.contains("SCAN j VIRTUAL TABLE"), "{plan}");
    assert!(!plan.contains("drover_items"), "{plan}");
}

#[tokio::test]
async fn the_completion_probes_the_lease_index_per_token() {
    let step = "USING INDEX drover_items_leases (lease_session=? AND lease_token=?)";
    assert_plan(super::complete::HELD, step).await;
}

#[tokio::test]
async fn a_clean_done_probes_the_lease_index_per_lease() {
    let step = "SEARCH i USING INDEX drover_items_leases (lease_session=? AND lease_token=?)";
    assert_plan(super::complete::QUICK, step).await;
}

#[tokio::test]
async fn a_claim_starts_each_item_by_its_id_not_through_the_claim_index() {
    let step = "SEARCH drover_items USING INTEGER PRIMARY KEY (rowid=?)";
    assert_plan(super::leases::START, step).await;
    assert!(
        !plan_of(super::leases::START)
            .await
            .contains("drover_items_claim")
    );
}

#[tokio::test]
async fn a_claims_opening_probes_the_claim_index_and_each_row_by_its_key() {
    let plan = plan_of(super::leases::OPENING).await;
    let steps = [
        "SEARCH drover_sessions USING INTEGER PRIMARY KEY (rowid=?)",
        "SEARCH p USING INDEX sqlite_autoindex_drover_processes_1 (process=?)",
        "INDEX drover_items_claim (process=?)",
    ];
    assert_steps(&plan, &steps);
    assert!(!plan.contains("TEMP B-TREE"), "a sort in: {plan}");
}

#[tokio::test]
async fn a_quick_claim_probes_the_claim_index_and_reads_back_through_the_lease_index() {
    let plan = plan_of(super::leases::QUICK).await;
    let steps = [
        "SEARCH drover_items USING INDEX drover_items_claim (process=? AND priority=? AND ready_at<?)",
        // Each ready row started by its id, not found again by the claim index.
        "SEARCH drover_items USING INTEGER PRIMARY KEY (rowid=?)",
        "SEARCH drover_sessions USING INTEGER PRIMARY KEY (rowid=?)",
        "SEARCH drover_processes USING INDEX sqlite_autoindex_drover_processes_1 (process=?)",
        "SEARCH drover_items USING INDEX drover_items_leases (lease_session=? AND lease_token>?)",
        "SEARCH drover_item_counts USING",
    ];
    assert_steps(&plan, &steps);
    assert!(!plan.contains("TEMP B-TREE"), "a sort in: {plan}");
}

#[tokio::test]
async fn a_one_trip_completion_probes_the_lease_index_per_lease_and_each_run_by_its_id() {
    let plan = plan_of(super::complete::ONE_TRIP).await;
    let steps = [
        "SEARCH i USING INDEX drover_items_leases (lease_session=? AND lease_token=?)",
        "SEARCH drover_runs USING INTEGER PRIMARY KEY (rowid>?)",
        "SEARCH drover_items USING INDEX drover_items_leases (lease_session=? AND lease_token=?)",
        "SEARCH drover_item_counts USING",
    ];
    assert_steps(&plan, &steps);
    assert!(!plan.contains("drover_items_claim"), "{plan}");
}

#[tokio::test]
async fn a_completions_opening_probes_each_session_by_its_id() {
    let step = "SEARCH s USING INTEGER PRIMARY KEY (rowid=?)";
    assert_plan(super::complete::OPENING, step).await;
}

#[tokio::test]
async fn a_completions_opening_and_quick_read_probe_sessions_and_leases() {
    let plan = plan_of(super::complete::OPENING_QUICK).await;
    let steps = [
        "SEARCH s USING INTEGER PRIMARY KEY (rowid=?)",
        "SEARCH i USING INDEX drover_items_leases (lease_session=? AND lease_token=?)",
    ];
    assert_steps(&plan, &steps);
}

#[tokio::test]
async fn a_clean_batch_logs_idles_and_counts_each_item_by_its_id() {
    let plan = plan_of(super::complete::CLEAN).await;
    let by_id = "SEARCH drover_items USING INTEGER PRIMARY KEY (rowid=?)";
    assert_eq!(plan.matches(by_id).count(), 2, "{plan}");
    assert!(
        plan.contains("SEARCH drover_item_counts USING"),
        "the counts row by its key in: {plan}"
    );
    assert!(!plan.contains("drover_items_claim"), "{plan}");
}

#[tokio::test]
async fn a_batch_of_idle_items_finds_each_by_its_id() {
    let step = "SEARCH drover_items USING INTEGER PRIMARY KEY (rowid=?)";
    assert_plan(super::complete::IDLE, step).await;
}

#[tokio::test]
async fn a_batch_of_next_rows_finds_each_item_by_its_id() {
    let step = "SEARCH i USING INTEGER PRIMARY KEY (rowid=?)";
    assert_plan(super::complete::NEXT, step).await;
}

/// The first query of a triage section, unbounded or under a prefix.
fn triage_sql(section: crate::store::ItemState, prefix: Option<&str>) -> String {
    let queries = crate::store::rules::triage::section_queries(
        &super::inspect::TRIAGE,
        "p",
        section,
        prefix,
        None,
        10,
    )
    .expect("a section query");
    queries.into_iter().next().expect("one query").sql
}

#[tokio::test]
async fn triage_sections_each_read_their_own_index_in_order() {
    use crate::store::ItemState::{Backoff, Idle, Parked, Pending, Running};
    let claim = "USING INDEX drover_items_claim (process=?)";
    assert_plan(&triage_sql(Pending, None), claim).await;
    let backoff = "USING INDEX drover_items_backoff (process=?";
    assert_plan(&triage_sql(Backoff, None), backoff).await;
    let parked = "USING INDEX drover_items_parked (process=? AND key>? AND key<?)";
    assert_plan(&triage_sql(Parked, None), parked).await;
    // Running keys, as many as the fleet's runs, come from the lease index
    // and are sorted: not a walk of every key of the process.
    let running = plan_of(&triage_sql(Running, None)).await;
    assert!(
        running.contains("SCAN drover_items USING INDEX drover_items_leases"),
        "{running}"
    );
    assert!(!running.contains("sqlite_autoindex"), "{running}");
    let by_key = "(process=? AND key>? AND key<?)";
    assert_plan(&triage_sql(Pending, Some("ns/")), by_key).await;
    assert_plan(&triage_sql(Idle, None), by_key).await;
}

#[tokio::test]
async fn counts_read_the_small_indexes_not_the_backlog() {
    let backoff = "USING COVERING INDEX drover_items_backoff (process=? AND backoff_until>?)";
    assert_plan(super::counts::COUNTS, backoff).await;
    let oldest = "USING COVERING INDEX drover_items_claim (process=? AND priority=?)";
    assert_plan(super::counts::OLDEST, oldest).await;
}

#[tokio::test]
async fn the_lists_read_one_page_as_a_range_of_their_key() {
    let processes = "USING COVERING INDEX sqlite_autoindex_drover_processes_1 (process>?)";
    assert_plan(super::counts::COUNTS, processes).await;
    assert_plan(super::admin::ACTIVITY, processes).await;
    let sessions = "SEARCH s USING INTEGER PRIMARY KEY (rowid>?)";
    assert_plan(&super::sessions::list_sql(), sessions).await;
}

#[tokio::test]
async fn the_runs_chart_reads_the_last_hour_by_end_time_not_every_run_of_the_process() {
    let step = "USING INDEX drover_runs_ended (ended_at>?)";
    assert_plan(super::series::RUNS, step).await;
}

#[tokio::test]
async fn retention_finds_old_runs_by_end_time_not_by_reading_every_run_of_the_process() {
    // Through the key index, every batch (and every tick's first) read each
    // run of the process to find the old ones, the write lock held.
    let step = "USING INDEX drover_runs_ended (ended_at<?)";
    assert_plan(super::runs::PRUNE_OLD, step).await;
}

#[tokio::test]
async fn capping_runs_probes_each_capped_key_not_every_run_of_the_process() {
    let plan = plan_of(super::runs::CAP_RUNS).await;
    let steps = [
        "SCAN json_each VIRTUAL TABLE",
        "SEARCH r USING COVERING INDEX drover_runs_key (process=? AND key=? AND id<?)",
    ];
    assert_steps(&plan, &steps);
    assert!(
        !plan.contains("drover_runs_key (process=?);"),
        "every run of the process in: {plan}"
    );
}

#[tokio::test]
async fn old_depth_samples_are_found_per_process_by_the_tables_key() {
    let step = "SEARCH drover_depth_samples USING PRIMARY KEY (process=? AND at<?)";
    assert_plan(super::series::FORGET_SAMPLES, step).await;
}

#[tokio::test]
async fn a_keys_runs_walk_the_key_index_not_every_run() {
    let step = "USING INDEX drover_runs_key (process=? AND key=? AND id<?)";
    assert_plan(super::runs::BY_KEY, step).await;
}

#[tokio::test]
async fn a_bulk_actions_window_goes_on_from_its_cursor_through_the_key_index() {
    let step = "USING INDEX sqlite_autoindex_drover_items_1 (process=? AND key>?)";
    assert_plan(super::groups::WINDOW, step).await;
}

#[tokio::test]
async fn error_groups_count_signatures_from_the_indexes_without_reading_a_row_per_key() {
    let store = SqliteStore::connect("sqlite::memory:", &StoreOptions::default())
        .await
        .expect("an in-memory store opens");
    let plan = plan(&store, super::groups::SIGNATURES).await;
    let steps = [
        "USING COVERING INDEX drover_items_parked_errors (process=?)",
        "USING COVERING INDEX drover_items_backoff (process=? AND backoff_until>?)",
        // Only the sample of each of the largest groups reads its row.
        "SEARCH i USING INTEGER PRIMARY KEY (rowid=?)",
    ];
    assert_steps(&plan, &steps);
}

#[tokio::test]
async fn a_reclaims_orphans_are_read_from_the_lease_index_not_every_item() {
    // The running rows alone, lowest session first: each batch of a reclaim
    // reads past the leases of the live sessions older than the expired one.
    let step = "SCAN i USING COVERING INDEX drover_items_leases";
    assert_plan(super::sessions::ORPHANS, step).await;
}
