//! Every list is paged (DESIGN.md rule 13), on every engine: `GET
//! /v1/processes` and `GET /v1/sessions` answer a page at a time (`after`,
//! `limit`, `next`), as the dashboard's overview and workers page show them;
//! walking the pages yields every process or session exactly once, in order.
//! No test sleeps: TTLs pass by advancing the store's clock.

mod server_support;
mod support;

use std::time::Duration;

use axum::http::StatusCode;
use serde_json::{Value, json};
use server_support::{Api, GET, Reply, segment};
use support::each_engine;

/// Process names that a link must percent-encode: a space, `&`, `#`, `+`,
/// `%`, a slash, markup and letters beyond ASCII; six of them, in no order.
const NAMES: [&str; 6] = ["z/ns", "a&b=c", "é-ü", "a b", "a#b+%", "<x>"];

/// `NAMES` in the order the server lists them: by bytes.
fn by_name() -> Vec<String> {
    let mut names: Vec<String> = NAMES.iter().map(|n| (*n).to_owned()).collect();
    names.sort();
    names
}

/// Enqueues one key to each of `NAMES`, creating the processes.
async fn create_processes(api: &Api) {
    for name in NAMES {
        let uri = format!("/v1/processes/{}/items", segment(name));
        api.post(&uri, json!({ "keys": ["k"] }), StatusCode::OK)
            .await;
    }
}

/// The pages of `path` (which has a query already), each page's `field`
/// entries and `next`, following `next` as `after` until it is null.
async fn walk(api: &Api, path: &str, field: &str) -> Vec<(Vec<Value>, Value)> {
    let mut pages = Vec::new();
    let mut uri = path.to_owned();
    loop {
        let page = api.get_ok(&uri).await;
        let entries = page[field].as_array().expect("a list").clone();
        let next = page["next"].clone();
        pages.push((entries, next.clone()));
        assert!(pages.len() <= 10, "the pages never end: {pages:?}");
        let after = match next {
            Value::Null => return pages,
            Value::String(s) => segment(&s),
            other => other.to_string(),
        };
        uri = format!("{path}&after={after}");
    }
}

#[tokio::test]
async fn processes_are_listed_a_page_at_a_time_by_name_with_their_activity() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        create_processes(&api).await;
        // One run of the last process ends: its activity is read with its page.
        let last = by_name().pop().expect("a name");
        let session = api.session(60_000).await;
        let leases = api.claim(session, &last, 1).await;
        let body = json!({ "lease": leases[0], "outcome": { "type": "done" } });
        api.post("/v1/leases/complete", body, StatusCode::NO_CONTENT)
            .await;

        let pages = walk(&api, "/v1/processes?limit=2", "processes").await;
        let sizes: Vec<usize> = pages.iter().map(|(p, _)| p.len()).collect();
        assert_eq!(sizes, [2, 2, 2], "three pages of two: {pages:?}");
        let listed: Vec<String> = pages
            .iter()
            .flat_map(|(p, _)| p.iter())
            .map(|p| p["process"].as_str().expect("a name").to_owned())
            .collect();
        assert_eq!(listed, by_name(), "each process once, by name");
        for (entries, next) in &pages[..2] {
            assert_eq!(next, &entries[1]["process"], "a page ends at its last name");
        }
        assert_eq!(pages[2].1, Value::Null, "the last page has no next");
        let finished: Vec<(String, u64)> = pages
            .iter()
            .flat_map(|(p, _)| p.iter())
            .map(|p| {
                let name = p["process"].as_str().expect("a name").to_owned();
                (name, p["recent_finished"].as_u64().expect("a count"))
            })
            .filter(|(_, n)| *n > 0)
            .collect();
        assert_eq!(finished, [(last, 1)], "activity joined on the right page");

        // Without a limit, one page holds them all (and says so).
        let all = api.get_ok("/v1/processes").await;
        assert_eq!(all["processes"].as_array().expect("a list").len(), 6);
        assert_eq!(all["next"], Value::Null, "{all}");
        // A page from an `after` that needs encoding (`a&b=c`): the rest.
        let after = format!("/v1/processes?limit=10&after={}", segment("a&b=c"));
        let rest = api.get_ok(&after).await;
        let rest: Vec<&str> = rest["processes"]
            .as_array()
            .expect("a list")
            .iter()
            .map(|p| p["process"].as_str().expect("a name"))
            .collect();
        let expected: Vec<String> = by_name()
            .into_iter()
            .filter(|n| n.as_str() > "a&b=c")
            .collect();
        assert_eq!(rest, expected);
    })
    .await;
}

#[tokio::test]
async fn sessions_are_listed_a_page_at_a_time_oldest_first() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        let mut started = Vec::new();
        for _ in 0..5 {
            started.push(api.session(60_000).await);
        }
        let pages = walk(&api, "/v1/sessions?limit=2", "sessions").await;
        let sizes: Vec<usize> = pages.iter().map(|(p, _)| p.len()).collect();
        assert_eq!(sizes, [2, 2, 1], "{pages:?}");
        let listed: Vec<i64> = pages
            .iter()
            .flat_map(|(p, _)| p.iter())
            .map(|s| s["id"].as_i64().expect("an id"))
            .collect();
        assert_eq!(listed, started, "each session once, oldest first");
        for (entries, next) in &pages[..2] {
            assert_eq!(next, &entries[1]["id"], "a page ends at its last id");
        }
        assert_eq!(pages[2].1, Value::Null, "the last page has no next");
        // Without a limit, all five fit the default page of 100.
        let all = api.get_ok("/v1/sessions").await;
        assert_eq!(all["sessions"].as_array().expect("a list").len(), 5);
        assert_eq!(all["next"], Value::Null);
        // A page ending exactly at the last session says there is no more.
        let exact = api
            .get_ok(&format!("/v1/sessions?limit=2&after={}", started[2]))
            .await;
        assert_eq!(exact["sessions"].as_array().expect("a list").len(), 2);
        assert_eq!(exact["next"], Value::Null, "{exact}");
    })
    .await;
}

/// Asserts `reply` is a 400 naming `field`.
fn refused(reply: &Reply, field: &str) {
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text);
    assert_eq!(reply.json()["field"], field, "{}", reply.text);
}

#[tokio::test]
async fn a_page_limit_out_of_range_or_a_bad_after_is_400_naming_it() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        create_processes(&api).await;
        api.session(60_000).await;
        for list in ["/v1/processes", "/v1/sessions"] {
            for bad in ["0", "1001", "x", "-1"] {
                let reply = api.call(GET, &format!("{list}?limit={bad}"), None).await;
                refused(&reply, "limit");
            }
            for good in ["1", "1000"] {
                let reply = api.call(GET, &format!("{list}?limit={good}"), None).await;
                assert_eq!(reply.status, StatusCode::OK, "{list}?limit={good}");
            }
        }
        let nul = api.call(GET, "/v1/processes?after=a%00b", None).await;
        refused(&nul, "after");
        let long = "a".repeat(1025);
        let reply = api
            .call(GET, &format!("/v1/processes?after={long}"), None)
            .await;
        refused(&reply, "after");
        let reply = api.call(GET, "/v1/sessions?after=x", None).await;
        refused(&reply, "after");
        // The dashboard brings a limit within range rather than refusing it.
        for page in ["/?limit=0", "/ui/workers?limit=5000"] {
            let reply = api.call(GET, page, None).await;
            assert_eq!(reply.status, StatusCode::OK, "{page}: {}", reply.text);
        }
    })
    .await;
}

/// The `href` of the page's next-page link, unescaped, if it has one.
fn next_href(page: &str) -> Option<String> {
    let at = page.find("id=\"next\"")?;
    let tag = &page[page[..at].rfind('<')?..];
    let start = tag.find("href=\"")? + "href=\"".len();
    let end = start + tag[start..].find('"')?;
    Some(tag[start..end].replace("&amp;", "&"))
}

/// The values of `attribute` in `page`, in order, unescaped.
fn attributes(page: &str, attribute: &str) -> Vec<String> {
    let marker = format!("{attribute}=\"");
    page.match_indices(&marker)
        .map(|(at, _)| {
            let rest = &page[at + marker.len()..];
            rest[..rest.find('"').expect("a closing quote")]
                .replace("&lt;", "<")
                .replace("&gt;", ">")
                .replace("&quot;", "\"")
                .replace("&amp;", "&")
        })
        .collect()
}

/// Follows a dashboard list from `first` along its next-page links: each
/// page's values of `attribute` (the rows' names or ids).
async fn follow(api: &Api, first: &str, attribute: &str) -> Vec<Vec<String>> {
    let mut pages = Vec::new();
    let mut uri = first.to_owned();
    loop {
        let page = api.call(GET, &uri, None).await;
        assert_eq!(page.status, StatusCode::OK, "{uri}: {}", page.text);
        pages.push(attributes(&page.text, attribute));
        assert!(pages.len() <= 10, "the pages never end: {pages:?}");
        match next_href(&page.text) {
            Some(next) => uri = next,
            None => return pages,
        }
    }
}

#[tokio::test]
async fn the_overview_and_the_workers_page_link_to_their_next_page() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        create_processes(&api).await;
        let pages = follow(&api, "/?limit=4", "data-process").await;
        assert_eq!(pages.len(), 2, "{pages:?}");
        assert_eq!(pages[0].len(), 4, "{pages:?}");
        assert_eq!(pages.concat(), by_name(), "each process once, by name");
        let all = api.call(GET, "/", None).await.text;
        assert!(next_href(&all).is_none(), "one page holds six: {all}");

        let mut started = Vec::new();
        for _ in 0..3 {
            started.push(api.session(1_000).await.to_string());
        }
        // Expired sessions are listed too, awaiting reclaim.
        db.store.clock().advance(Duration::from_secs(2));
        let pages = follow(&api, "/ui/workers?limit=2", "data-session").await;
        assert_eq!(pages.len(), 2, "{pages:?}");
        assert_eq!(pages.concat(), started, "each session once, oldest first");
        let all = api.call(GET, "/ui/workers", None).await.text;
        assert!(next_href(&all).is_none(), "one page holds three: {all}");
        let past = api.call(GET, "/ui/workers?after=999999", None).await.text;
        assert!(past.contains("No more sessions."), "{past}");
    })
    .await;
}
