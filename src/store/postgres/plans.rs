//! The hot statements' query plans on PostgreSQL, checked against a backlog
//! whose statistics were taken at the worst moment: every row idle, none
//! running. A plan that hashes or walks the whole table instead of probing
//! an index per key costs time in proportion to the backlog (1.2–1.6 s per
//! completion batch of 2,048 once, see [`DONE_AT_ONCE`](super::complete)),
//! which no functional test notices. Each statement is planned both ways
//! PostgreSQL may run a prepared statement: with its parameters' values
//! (a custom plan) and without them (the generic plan it may switch to after
//! five executions). The claim is the exception: its update finds the
//! picked keys by `process = … AND key = ANY(…)`, which only statistics
//! that know the process plan as a probe per key (the store analyses after
//! a process's first thousand keys, see `statistics.rs`), so its test takes
//! them as they are after that.
//!
//! Needs `DROVER_TEST_POSTGRES_URL`: without it the tests skip with a
//! printed reason; set, an unreachable database fails them.

use std::time::Duration;

use sqlx::{Connection as _, Executor as _, PgConnection};

use super::PostgresStore;
use crate::store::params::{ItemEnqueue, LeaseClaim, LeaseComplete, SessionStart};
use crate::store::types::{Lease, Outcome};
use crate::store::{StoreEngine as _, StoreOptions};

/// The variable naming the test server (the same as the integration tests').
const POSTGRES_ENV: &str = "DROVER_TEST_POSTGRES_URL";

/// Idle rows behind the leases: enough that a walk of the table shows in a
/// plan's estimates as the most expensive step.
const BACKLOG: usize = 20_000;

/// The leases whose completion is planned.
const LEASES: usize = 2_000;

/// The process the backlog belongs to.
const PROCESS: &str = "plans";

/// A migrated schema of its own on the test server, holding [`BACKLOG`] idle
/// rows (statistics taken then) and [`LEASES`] of them claimed again.
struct Backlog {
    schema: Schema,
    leases: Vec<Lease>,
}

/// A migrated schema of its own on the test server, and a store on it, so
/// that a test's statements and locks meet no other test's.
pub(super) struct Schema {
    base: String,
    name: String,
    /// The test server's URL with the schema as its search path.
    pub(super) url: String,
    pub(super) store: PostgresStore,
}

impl Schema {
    /// `None` (with a printed reason) when no test server is named; the
    /// schema's name starts with `prefix`.
    pub(super) async fn create(prefix: &str) -> Option<Self> {
        let Ok(base) = std::env::var(POSTGRES_ENV) else {
            eprintln!("skipping: {POSTGRES_ENV} is not set");
            return None;
        };
        let name = format!("{prefix}_{}_{}", std::process::id(), rand_suffix());
        admin(&base, &format!("CREATE SCHEMA {name}")).await;
        let sep = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{sep}options=-c%20search_path%3D{name}");
        let store = PostgresStore::connect(&url, &StoreOptions::default())
            .await
            .expect("the test server answers and migrates");
        Some(Self {
            base,
            name,
            url,
            store,
        })
    }

    /// Closes the store and drops the schema.
    pub(super) async fn remove(self) {
        self.store.pool().close().await;
        admin(&self.base, &format!("DROP SCHEMA {} CASCADE", self.name)).await;
    }
}

impl Backlog {
    /// `None` (with a printed reason) when no test server is named.
    async fn build() -> Option<Self> {
        let schema = Schema::create("drover_plans").await?;
        let store = &schema.store;
        let session = store
            .session_start(SessionStart::new("plans", Duration::from_secs(600)))
            .await
            .expect("a session starts")
            .id;
        let keys: Vec<String> = (0..BACKLOG).map(|n| format!("key-{n:06}")).collect();
        store
            .item_enqueue(ItemEnqueue::new(PROCESS, keys.clone()))
            .await
            .expect("the backlog enqueues");
        let claim = |max| LeaseClaim {
            session,
            process: PROCESS.into(),
            max,
            trace_links: false,
        };
        let all = store
            .lease_claim(claim(u32::try_from(BACKLOG).expect("small")))
            .await
            .expect("the backlog is claimed")
            .leases;
        assert_eq!(all.len(), BACKLOG);
        let done: Vec<_> = all
            .iter()
            .map(|lease| LeaseComplete {
                lease,
                outcome: &Outcome::Done,
                trace_id: None,
            })
            .collect();
        store
            .lease_complete_batch(&done)
            .await
            .expect("the backlog completes");
        store
            .pool()
            .execute("ANALYZE drover_items")
            .await
            .expect("the statistics are taken");
        let again: Vec<String> = keys.iter().step_by(BACKLOG / LEASES).cloned().collect();
        store
            .item_enqueue(ItemEnqueue::new(PROCESS, again))
            .await
            .expect("some keys enqueue again");
        let leases = store
            .lease_claim(claim(u32::try_from(LEASES).expect("small")))
            .await
            .expect("they are claimed")
            .leases;
        assert_eq!(leases.len(), LEASES);
        Some(Self { schema, leases })
    }

    /// The plans of `sql` prepared with `types` and executed with `args`
    /// (SQL literals), custom and generic, one text plan each.
    async fn plans(&self, sql: &str, types: &str, args: &str) -> Vec<String> {
        let mut conn = self
            .schema
            .store
            .pool()
            .acquire()
            .await
            .expect("a connection");
        let mut plans = Vec::new();
        for mode in ["force_custom_plan", "force_generic_plan"] {
            conn.execute(sqlx::AssertSqlSafe(format!(
                "SET plan_cache_mode = {mode}; PREPARE planned ({types}) AS {sql}"
            )))
            .await
            .expect("the statement prepares against the migrated schema");
            let lines: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "EXPLAIN EXECUTE planned ({args})"
            )))
            .fetch_all(&mut *conn)
            .await
            .expect("the statement is planned");
            conn.execute("DEALLOCATE planned; RESET plan_cache_mode")
                .await
                .expect("the statement is dropped");
            plans.push(format!("{mode}:\n{}", lines.join("\n")));
        }
        plans
    }

    /// The statement the PL/pgSQL function `name` returns (`RETURN QUERY …`),
    /// as the function in the migrated schema holds it, each of its
    /// parameters replaced by `$1`, `$2`, … in the order `params` names them:
    /// the statement PostgreSQL plans when the function runs, to be
    /// prepared and explained like any other. Also fails unless the function
    /// forces generic plans, as the claim's must (see migration 0025).
    async fn function_statement(&self, name: &str, params: &[&str]) -> String {
        let (source, config): (String, Option<Vec<String>>) =
            sqlx::query_as("SELECT prosrc, proconfig FROM pg_proc WHERE oid = to_regproc($1)")
                .bind(name)
                .fetch_one(self.schema.store.pool())
                .await
                .unwrap_or_else(|e| panic!("the function {name}: {e}"));
        assert!(
            config
                .unwrap_or_default()
                .iter()
                .any(|c| c == "plan_cache_mode=force_generic_plan"),
            "{name} does not force generic plans"
        );
        let start = source
            .find("RETURN QUERY")
            .unwrap_or_else(|| panic!("no RETURN QUERY in {name}"))
            + "RETURN QUERY".len();
        let end = source[start..]
            .find(';')
            .unwrap_or_else(|| panic!("no end of the RETURN QUERY in {name}"));
        let mut statement = source[start..start + end].to_owned();
        for (n, param) in params.iter().enumerate() {
            let word = regex::Regex::new(&format!(r"\b{param}\b")).expect("a parameter name");
            let placeholder = format!("${}", n + 1);
            let bound = word.replace_all(&statement, regex::NoExpand(&placeholder));
            statement = bound.into_owned();
        }
        statement
    }

    /// The leases' session, keys and tokens, as SQL literals.
    fn arrays(&self) -> Arrays {
        let keys: Vec<String> = self.leases.iter().map(|l| format!("'{}'", l.key)).collect();
        let tokens: Vec<String> = self.leases.iter().map(|l| l.token.0.to_string()).collect();
        Arrays {
            session: self.leases[0].session.0,
            keys: format!("ARRAY[{}]::text[]", keys.join(",")),
            tokens: format!("ARRAY[{}]::bigint[]", tokens.join(",")),
        }
    }

    async fn remove(self) {
        self.schema.remove().await;
    }
}

/// The leases of a [`Backlog`] as SQL literals.
struct Arrays {
    session: i64,
    keys: String,
    tokens: String,
}

/// The custom and the generic plan of `sql` (parameters of `types`, given
/// the SQL literals `args` makes of the leases) on a fresh [`Backlog`],
/// which is removed before they are returned; `None` when no test server is
/// named.
async fn planned(
    sql: &str,
    types: &str,
    args: impl FnOnce(&Arrays) -> String,
) -> Option<Vec<String>> {
    let backlog = Backlog::build().await?;
    let plans = backlog.plans(sql, types, &args(&backlog.arrays())).await;
    backlog.remove().await;
    Some(plans)
}

/// Runs `sql` on the test server outside any store.
async fn admin(base: &str, sql: &str) {
    let mut conn = PgConnection::connect(base)
        .await
        .unwrap_or_else(|e| panic!("{POSTGRES_ENV} is set but unreachable: {e}"));
    conn.execute(sqlx::AssertSqlSafe(sql.to_owned()))
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// A few random digits, so that runs of these tests never share a schema.
fn rand_suffix() -> u32 {
    use std::hash::{BuildHasher as _, RandomState};
    u32::try_from(RandomState::new().hash_one(0_u8) % 1_000_000).expect("small")
}

/// Fails unless every step of `plan` that reads `drover_items` probes it
/// by one key (the primary key's process and key), by the session's leases
/// (the lease index: a session's running rows, at most its runs) or by TID:
/// no sequential or bitmap walk of the backlog, no probe by process alone.
fn assert_probes_only(plan: &str) {
    let lines: Vec<&str> = plan.lines().collect();
    for (n, line) in lines.iter().enumerate() {
        if !line.contains(" on drover_items") || line.contains("Update on") {
            continue;
        }
        let cond = lines.get(n + 1).copied().unwrap_or_default();
        let probe = line.contains("Tid Scan")
            || (line.contains("using drover_items_pkey") && cond.contains("key ="))
            || (line.contains("using drover_items_leases") && cond.contains("lease_session ="));
        assert!(
            probe && line.contains("Scan"),
            "a walk of the backlog: `{}` / `{}` in\n{plan}",
            line.trim(),
            cond.trim()
        );
    }
}

/// Fails unless no step of `plan` filters its rows by an array (`= ANY`):
/// each row is then compared with every element, O(rows × batch), where an
/// index or a TID scan takes the array once, sorted.
fn assert_no_array_filter(plan: &str) {
    for line in plan.lines() {
        let line = line.trim();
        assert!(
            !(line.starts_with("Filter:") && line.contains("= ANY")),
            "`{line}`: each row against the whole batch in\n{plan}"
        );
    }
}

/// One step of a text plan: its first line and its inputs, in the order
/// the plan prints them (a join's outer input first).
struct Step<'a> {
    line: &'a str,
    details: Vec<&'a str>,
    inputs: Vec<Step<'a>>,
}

impl<'a> Step<'a> {
    /// The tree of a text `EXPLAIN`: a step starts its line with `->`, its
    /// depth is the arrow's column; other lines (conditions, sort keys,
    /// `InitPlan`/`CTE` headings) are details of the step above them.
    fn parse(plan: &'a str) -> Self {
        let mut lines = plan.lines().skip_while(|l| l.ends_with(':'));
        let root = lines.next().unwrap_or_default();
        let mut stack = vec![(0, Step::new(root))];
        for line in lines {
            let Some(depth) = line.find("->") else {
                if let Some((_, step)) = stack.last_mut() {
                    step.details.push(line.trim());
                }
                continue;
            };
            while stack.len() > 1 && stack.last().is_some_and(|(d, _)| *d >= depth) {
                let (_, done) = stack.pop().expect("not the root");
                stack.last_mut().expect("a parent").1.inputs.push(done);
            }
            stack.push((depth, Step::new(&line[depth + 2..])));
        }
        while stack.len() > 1 {
            let (_, done) = stack.pop().expect("not the root");
            stack.last_mut().expect("a parent").1.inputs.push(done);
        }
        stack.pop().expect("the root").1
    }

    fn new(line: &'a str) -> Self {
        Self {
            line: line.trim(),
            details: Vec::new(),
            inputs: Vec::new(),
        }
    }

    /// Whether `found` holds for this step or one of its inputs.
    fn any(&self, found: &impl Fn(&Step<'_>) -> bool) -> bool {
        found(self) || self.inputs.iter().any(|i| i.any(found))
    }

    /// Fails unless every join on the way to the step that `found` picks
    /// has that step under its first (outer) input: the rows then come out
    /// of each join, and are locked, in that step's order.
    fn assert_drives(&self, found: &impl Fn(&Step<'_>) -> bool, plan: &str) {
        if found(self) {
            return;
        }
        let Some(at) = self.inputs.iter().position(|i| i.any(found)) else {
            return;
        };
        let join = ["Nested Loop", "Hash Join", "Merge Join"]
            .iter()
            .any(|j| self.line.contains(j));
        assert!(
            !join || at == 0,
            "`{}` reads the sorted keys as its inner input:\n{plan}",
            self.line
        );
        // A hash join keeps its outer input's order while its hash fits in
        // memory, which a session's leases do; these do not keep it.
        let reorders = ["Sort", "Merge Join", "HashAggregate", "Gather"]
            .iter()
            .any(|r| self.line.contains(r));
        assert!(
            !reorders,
            "`{}` reorders the sorted keys:\n{plan}",
            self.line
        );
        self.inputs[at].assert_drives(found, plan);
    }
}

/// Fails unless the plan locks each key's row as the sorted keys come:
/// a nested loop whose outer input is their sort and whose inner input
/// locks a row of `drover_items`.
fn assert_locks_per_key(tree: &Step<'_>, plan: &str) {
    let locks = |s: &Step<'_>| s.line.starts_with("LockRows");
    let found = |s: &Step<'_>| {
        s.line.starts_with("Nested Loop")
            && s.inputs.first().is_some_and(|o| o.any(&sorts_the_keys))
            && s.inputs.get(1).is_some_and(|i| i.any(&locks))
    };
    assert!(tree.any(&found), "no lock per sorted key in\n{plan}");
}

/// Fails unless `plan` sorts the leases' keys and every join on the way up
/// reads them as its outer input; returns the plan's tree.
fn assert_sorted_keys_drive(plan: &str) -> Step<'_> {
    let tree = Step::parse(plan);
    assert!(tree.any(&sorts_the_keys), "no sort of the keys in\n{plan}");
    tree.assert_drives(&sorts_the_keys, plan);
    tree
}

/// Whether `step` is the sort of the leases' keys (by `key`, bytewise).
fn sorts_the_keys(step: &Step<'_>) -> bool {
    step.line.starts_with("Sort ")
        && step
            .details
            .iter()
            .any(|d| d.starts_with("Sort Key:") && d.contains("key") && d.contains("COLLATE \"C\""))
}

#[tokio::test]
async fn a_batch_of_clean_dones_probes_each_key_in_key_order_whatever_the_statistics() {
    let Some(plans) = planned(
        super::complete::DONE_AT_ONCE,
        "timestamptz, bigint, text, text[], bigint[], text[]",
        |a| {
            format!(
                "now(), {}, '{PROCESS}', {}, {}, array_fill(NULL::text, ARRAY[{LEASES}])",
                a.session, a.keys, a.tokens
            )
        },
    )
    .await
    else {
        return;
    };
    for plan in plans {
        assert_probes_only(&plan);
        assert_no_array_filter(&plan);
        // The sorted keys drive every join, so the rows are locked in key
        // order, as the general path's locking read locks them.
        let tree = assert_sorted_keys_drive(&plan);
        assert_locks_per_key(&tree, &plan);
    }
}

#[tokio::test]
async fn the_completions_locking_read_probes_each_key_whatever_the_statistics() {
    let Some(plans) = planned(super::complete::HELD, "text[], text[]", |a| {
        format!("array_fill('{PROCESS}'::text, ARRAY[{LEASES}]), {}", a.keys)
    })
    .await
    else {
        return;
    };
    for plan in plans {
        assert_probes_only(&plan);
        assert_no_array_filter(&plan);
        assert_sorted_keys_drive(&plan);
    }
}

#[tokio::test]
async fn a_claim_walks_the_claim_index_and_probes_each_picked_key() {
    // With statistics that know the process (the store analyses after a
    // process's first thousand keys): the claim's update must find each
    // picked key by one probe of the primary key, never compare each row of
    // the process with every picked key. The claim is the statement of the
    // function `drover_claim`, which runs it on the generic plan.
    let Some(backlog) = Backlog::build().await else {
        return;
    };
    let params = [
        "claim_session",
        "claim_process",
        "claim_max",
        "clock_offset_ms",
        "with_traces",
    ];
    let claim = backlog.function_statement("drover_claim", &params).await;
    let args = format!("{}, '{PROCESS}', 1024, 0, false", backlog.arrays().session);
    let plans = backlog
        .plans(&claim, "bigint, text, bigint, float8, boolean", &args)
        .await;
    backlog.remove().await;
    for plan in plans {
        assert_no_array_filter(&plan);
        let lines: Vec<&str> = plan.lines().map(str::trim).collect();
        let scans = lines
            .iter()
            .filter(|l| l.contains(" on drover_items ") && !l.contains("Update on"));
        for line in scans {
            assert!(
                line.contains("Index Scan") || line.contains("Index Only Scan"),
                "`{line}` in\n{plan}"
            );
        }
        let update = lines
            .iter()
            .position(|l| l.contains("Update on drover_items"))
            .unwrap_or_else(|| panic!("no update in\n{plan}"));
        assert!(
            lines[update..]
                .iter()
                .any(|l| l.starts_with("Index Cond:") && l.contains("key = ANY")),
            "the picked keys are not probed:\n{plan}"
        );
    }
}
