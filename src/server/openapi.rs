//! The OpenAPI 3 document, generated from the router itself (each handler's
//! `#[utoipa::path]` gives its route and its entry here, see
//! [`routes::api`](super::routes::api)) and the wire types in [`crate::api`],
//! so it cannot drift from the code. What every operation shares is declared
//! once ([`shared_responses`]); what annotations cannot say is added on the
//! JSON ([`truthful`]).

use serde_json::{Value, json};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::role::Role;
use crate::api::ErrorBody;

/// The document's frame: its title, description, tags, security scheme and
/// the schemas no path names. The router adds the paths.
#[derive(Debug, OpenApi)]
#[openapi(
    info(
        title = "drover",
        description = "Keyed work with coalescing, durable per-key backoff and fenced leases. \
            Send `Authorization: Bearer TOKEN` when the server has tokens (roles: viewer reads, \
            worker also enqueues and works, admin also retries, parks and deletes). \
            Keys in paths are percent-encoded. \
            Every request but GET, HEAD and OPTIONS that a browser marks as another \
            site's (`Sec-Fetch-Site` other than `same-origin` or `none`; without it, an \
            `Origin` whose host is not the request's `Host`) is refused with 403 \
            `cross_origin` before authentication; programs that send neither header \
            are not affected."
    ),
    // The schemas the paths name are collected from them; these two are named
    // by no path's annotation: the error body (added to operations by
    // `shared_responses`) and the roles.
    components(schemas(ErrorBody, Role)),
    modifiers(&BearerAuth),
    tags(
        (name = "work", description = "Producers and workers: enqueue, sessions, leases"),
        (name = "read", description = "Processes and items"),
        (name = "admin", description = "Operators' actions on items, one key or every key a filter matches, and on processes (settings, pause, resume)"),
        (name = "ops", description = "Health, readiness, metrics, this document"),
    )
)]
pub(crate) struct ApiDoc;

/// Declares the `bearer` security scheme the paths refer to.
#[derive(Debug)]
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The document as JSON: the router's description with what its annotations cannot say
/// added (`truthful`): names constrained as the server checks them, request
/// bodies closed, and the links from an enqueue to its keys. JSON rather than
/// utoipa's type, because those additions are made on the JSON.
#[must_use]
pub fn document() -> Value {
    let (_, described) = super::routes::api().split_for_parts();
    let mut document = serde_json::to_value(described).expect("the document serializes");
    shared_responses(&mut document);
    truthful(&mut document);
    document
}

/// The answers most operations share, declared here once rather than on
/// each handler (an operation that says more about one keeps its own): 401 on
/// every operation that asks for a token; 403 on every operation a role
/// guards, by its tag (`work`: a worker's, `admin`: an admin's), and for a
/// work operation on a session (its path names one, or its body names a
/// lease) the other 403 it answers, `not_your_session`; 408 and 413
/// on every operation with a body; 422 on every operation whose path names a process
/// (or a key); 503 on every `/v1` operation. Each has the error body.
fn shared_responses(document: &mut Value) {
    let paths = document["paths"]
        .as_object_mut()
        .expect("the document has paths");
    for (path, item) in paths.iter_mut() {
        let operations = item
            .as_object_mut()
            .into_iter()
            .flat_map(|o| o.values_mut());
        for operation in operations.filter_map(Value::as_object_mut) {
            let on_session = path.contains("{session}") || path.starts_with("/v1/leases/");
            let role = match operation["tags"][0].as_str() {
                Some("work") if on_session => Some(
                    "The token is not a worker's; or, `not_your_session`, another token \
                     started the session",
                ),
                Some("work") => Some("The token is not a worker's"),
                Some("admin") => Some("The token is not an admin's"),
                _ => None,
            };
            let secured = operation.contains_key("security");
            let body = operation.contains_key("requestBody");
            let names = if path.contains("{key}") {
                Some("Invalid key or process name")
            } else {
                path.contains("{process}").then_some("Invalid process name")
            };
            let responses = operation["responses"]
                .as_object_mut()
                .expect("an operation has responses");
            let shared = [
                ("401", secured.then_some("No or unknown token")),
                ("403", role),
                ("408", body.then_some("The body did not arrive in time")),
                ("413", body.then_some("Body over the limit")),
                ("422", names),
                (
                    "503",
                    path.starts_with("/v1/")
                        .then_some("The database is unavailable"),
                ),
            ];
            for (status, description) in shared {
                if let Some(description) = description {
                    responses
                        .entry(status)
                        .or_insert_with(|| error_response(description));
                }
            }
        }
    }
}

/// A response with drover's error body.
fn error_response(description: &str) -> Value {
    json!({
        "description": description,
        "content": { "application/json": { "schema": { "$ref": "#/components/schemas/ErrorBody" } } },
    })
}

/// The document as a server with no tokens serves it: no operation asks for
/// authentication, since none is checked (a client generated from it sends
/// none, and a fuzzer does not expect 401s).
#[must_use]
pub fn document_without_tokens() -> Value {
    let mut document = document();
    for operation in operations(&mut document) {
        operation.remove("security");
    }
    document
}

/// A key or process name as the server checks it ([`validate_key`]): not
/// empty, no NUL, at most 1024 bytes (JSON Schema counts characters, so a
/// name of 1024 characters beyond ASCII is still refused).
///
/// [`validate_key`]: crate::store::validate_key
fn name_schema() -> Value {
    json!({
        "type": "string",
        "minLength": 1,
        "maxLength": crate::store::MAX_NAME_BYTES,
        "pattern": "^[^\\u0000]*$",
    })
}

/// Request bodies that are `oneOf` variants of a type refusing unknown fields
/// (`#[serde(deny_unknown_fields)]`): utoipa closes structs but not enum
/// variants.
const CLOSED_VARIANTS: [&str; 1] = ["OutcomeBody"];

/// Bulk actions refuse a body with no condition, so nobody acts on a whole
/// process by accident: at least one of these (that none is null or empty is
/// in their fields' annotations; "one of them" has no annotation).
const BULK_BODIES: [&str; 2] = ["BulkRequest", "BulkParkRequest"];
/// The conditions of a bulk body, one of which it needs.
const BULK_CONDITIONS: [&str; 3] = ["state", "error", "key_prefix"];

/// Request bodies whose `process` and `key` properties (and `keys` items)
/// are names ([`name_schema`]). Responses are left as they are: a run row of
/// an action on a whole process has an empty key.
const NAMED_REQUESTS: [&str; 3] = ["ClaimRequest", "LeaseRef", "EnqueueRequest"];

/// Adds to `document` what utoipa's annotations cannot express:
/// - `process` and `key` parameters, and the names in [`NAMED_REQUESTS`],
///   are names ([`name_schema`]);
/// - enum variants in [`CLOSED_VARIANTS`] refuse unknown fields;
/// - bulk bodies need a condition ([`BULK_BODIES`]);
/// - an enqueue links to its first key's item, runs and admin actions, so a
///   fuzzer's stateful phase reaches keys that exist.
fn truthful(document: &mut Value) {
    for operation in operations(document) {
        let parameters = operation
            .get_mut("parameters")
            .and_then(Value::as_array_mut);
        for parameter in parameters.into_iter().flatten() {
            if matches!(parameter["name"].as_str(), Some("process" | "key")) {
                parameter["schema"] = name_schema();
            }
        }
    }
    let schemas = document["components"]["schemas"]
        .as_object_mut()
        .expect("the document has schemas");
    for (name, schema) in schemas.iter_mut() {
        if NAMED_REQUESTS.contains(&name.as_str()) {
            constrain_names(schema);
        }
        if CLOSED_VARIANTS.contains(&name.as_str()) {
            for variant in schema["oneOf"].as_array_mut().into_iter().flatten() {
                variant["additionalProperties"] = Value::Bool(false);
            }
        }
        if BULK_BODIES.contains(&name.as_str()) {
            schema["anyOf"] = BULK_CONDITIONS
                .iter()
                .map(|c| json!({ "required": [c] }))
                .collect();
        }
    }
    let enqueue = &mut document["paths"]["/v1/processes/{process}/items"]["post"];
    enqueue["responses"]["200"]["links"] = enqueue_links();
}

/// Sets every string property named `process` or `key` (and the items of
/// `keys`) in `schema` to [`name_schema`], keeping its description.
fn constrain_names(schema: &mut Value) {
    let Some(properties) = schema.get_mut("properties").and_then(Value::as_object_mut) else {
        return;
    };
    for (name, property) in properties.iter_mut() {
        let target = match name.as_str() {
            "process" | "key" => property,
            "keys" => &mut property["items"],
            _ => continue,
        };
        assert_eq!(target["type"], "string", "{name} is a name");
        let description = target.get("description").cloned();
        *target = name_schema();
        if let Some(description) = description {
            target["description"] = description;
        }
    }
}

/// From an enqueue to what can be done with the first key it sent.
fn enqueue_links() -> Value {
    let key = json!({ "process": "$request.path.process", "key": "$request.body#/keys/0" });
    let process = json!({ "process": "$request.path.process" });
    let mut links = serde_json::Map::new();
    for (name, operation, parameters) in [
        ("GetItem", "get_item", &key),
        ("RetryItem", "retry_item", &key),
        ("ParkItem", "park_item", &key),
        ("DeleteItem", "delete_item", &key),
        ("ListItems", "list_items", &process),
        ("ListRuns", "list_runs", &key),
    ] {
        links.insert(
            name.to_owned(),
            json!({ "operationId": operation, "parameters": parameters }),
        );
    }
    Value::Object(links)
}

/// Every operation of `document`, as a JSON object.
fn operations(document: &mut Value) -> impl Iterator<Item = &mut serde_json::Map<String, Value>> {
    document["paths"]
        .as_object_mut()
        .into_iter()
        .flat_map(|paths| paths.values_mut())
        .filter_map(Value::as_object_mut)
        .flat_map(|item| item.values_mut())
        .filter_map(Value::as_object_mut)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::store::TraceContext;

    #[test]
    fn every_operation_has_an_id_of_its_own() {
        let mut document = document();
        let mut seen = HashSet::new();
        for operation in operations(&mut document) {
            let id = operation["operationId"].as_str().expect("an operation id");
            assert!(
                seen.insert(id.to_owned()),
                "operation id {id} is used twice"
            );
        }
        assert!(seen.len() > 20, "{seen:?}");
    }

    #[test]
    fn every_process_and_key_is_described_as_the_server_checks_it() {
        let mut document = document();
        let mut parameters = 0;
        for operation in operations(&mut document) {
            let listed = operation.get("parameters").and_then(Value::as_array);
            for parameter in listed.into_iter().flatten() {
                if matches!(parameter["name"].as_str(), Some("process" | "key")) {
                    assert_eq!(parameter["schema"], name_schema(), "{parameter}");
                    parameters += 1;
                }
            }
        }
        assert!(parameters > 20, "{parameters} process and key parameters");
        let schemas = &document["components"]["schemas"];
        for (schema, property) in [
            ("ClaimRequest", "process"),
            ("LeaseRef", "key"),
            ("LeaseRef", "process"),
        ] {
            let described = &schemas[schema]["properties"][property];
            assert_eq!(described["minLength"], 1, "{schema}.{property}");
            assert_eq!(described["pattern"], "^[^\\u0000]*$", "{schema}.{property}");
            assert!(
                described["description"].is_string(),
                "{schema}.{property} keeps its description"
            );
        }
        assert_eq!(
            schemas["EnqueueRequest"]["properties"]["keys"]["items"],
            name_schema()
        );
        // A run of an action on a whole process has an empty key.
        let run_key = &schemas["RunBody"]["properties"]["key"];
        assert!(run_key.get("minLength").is_none(), "{run_key}");
    }

    #[test]
    fn outcome_variants_and_bulk_bodies_say_what_the_server_refuses() {
        let document = document();
        let schemas = &document["components"]["schemas"];
        let variants = schemas["OutcomeBody"]["oneOf"]
            .as_array()
            .expect("variants");
        assert_eq!(variants.len(), 4);
        for variant in variants {
            assert_eq!(variant["additionalProperties"], false, "{variant}");
        }
        for body in BULK_BODIES {
            let schema = &schemas[body];
            assert_eq!(schema["anyOf"].as_array().map(Vec::len), Some(3), "{body}");
            for condition in BULK_CONDITIONS {
                let text = schema["properties"][condition].to_string();
                assert!(
                    !text.contains("\"null\""),
                    "{body}.{condition} is not nullable: {text}"
                );
            }
            assert_eq!(schema["properties"]["key_prefix"]["minLength"], 1, "{body}");
            assert_eq!(schema["properties"]["error"]["minLength"], 1, "{body}");
            let pattern = &schema["properties"]["key_prefix"]["pattern"];
            assert_eq!(pattern, &name_schema()["pattern"], "{body}");
        }
    }

    #[test]
    fn an_enqueue_links_to_its_first_keys_item_and_actions() {
        let document = document();
        let links = &document["paths"]["/v1/processes/{process}/items"]["post"]["responses"]["200"]
            ["links"];
        let mut ids = HashSet::new();
        let mut document = document.clone();
        for operation in operations(&mut document) {
            ids.insert(operation["operationId"].as_str().expect("id").to_owned());
        }
        let links = links.as_object().expect("links");
        assert_eq!(links.len(), 6);
        for (name, link) in links {
            let target = link["operationId"].as_str().expect("a target");
            assert!(
                ids.contains(target),
                "link {name} names no operation: {target}"
            );
            assert_eq!(link["parameters"]["process"], "$request.path.process");
        }
        assert_eq!(
            links["GetItem"]["parameters"]["key"],
            "$request.body#/keys/0"
        );
    }

    #[test]
    fn shared_answers_are_on_every_operation_they_apply_to() {
        let mut document = document();
        let mut v1 = 0;
        for (path, item) in document["paths"].as_object_mut().expect("paths").iter_mut() {
            for (method, operation) in item.as_object_mut().expect("an item").iter_mut() {
                let responses = &operation["responses"];
                let secured = operation.get("security").is_some();
                assert_eq!(secured, responses.get("401").is_some(), "{method} {path}");
                let guarded = matches!(operation["tags"][0].as_str(), Some("work" | "admin"));
                assert_eq!(guarded, responses.get("403").is_some(), "{method} {path}");
                let body = operation.get("requestBody").is_some();
                assert_eq!(body, responses.get("413").is_some(), "{method} {path}");
                assert_eq!(body, responses.get("408").is_some(), "{method} {path}");
                if path.contains("{process}") {
                    assert!(responses.get("422").is_some(), "{method} {path}");
                }
                if path.starts_with("/v1/") {
                    v1 += 1;
                    assert!(responses.get("503").is_some(), "{method} {path}");
                }
            }
        }
        assert!(v1 > 20, "{v1} operations under /v1");
        // Every act on a session says that another token's is refused.
        for (path, method) in [
            ("/v1/sessions/{session}", "delete"),
            ("/v1/sessions/{session}/heartbeat", "post"),
            ("/v1/sessions/{session}/claim", "post"),
            ("/v1/leases/complete", "post"),
            ("/v1/leases/complete-batch", "post"),
            ("/v1/leases/release", "post"),
            ("/v1/leases/trace-link", "post"),
        ] {
            let forbidden = &document["paths"][path][method]["responses"]["403"];
            assert!(
                forbidden["description"]
                    .as_str()
                    .is_some_and(|d| d.contains("not_your_session")),
                "{method} {path}: {forbidden}"
            );
        }
        let enqueue = &document["paths"]["/v1/processes/{process}/items"]["post"]["responses"];
        assert_eq!(
            enqueue["403"]["description"], "The token is not a worker's",
            "no session, no other 403"
        );
        let batch = &document["paths"]["/v1/leases/complete-batch"]["post"]["responses"]["503"];
        assert!(
            batch["description"]
                .as_str()
                .is_some_and(|d| d.contains("nothing was written")),
            "an operation's own 503 is kept: {batch}"
        );
    }

    #[test]
    fn the_process_and_session_lists_are_described_as_paged() {
        let document = document();
        for (path, body) in [
            ("/v1/processes", "ProcessList"),
            ("/v1/sessions", "SessionListBody"),
        ] {
            let operation = &document["paths"][path]["get"];
            let parameters = operation["parameters"].as_array().expect("parameters");
            let named = |name: &str| {
                parameters
                    .iter()
                    .find(|p| p["name"] == name)
                    .unwrap_or_else(|| panic!("{path} takes {name}"))
            };
            assert_eq!(named("after")["in"], "query", "{path}");
            let limit = &named("limit")["schema"];
            assert_eq!(
                (&limit["minimum"], &limit["maximum"]),
                (&json!(1), &json!(1000))
            );
            assert!(operation["responses"].get("400").is_some(), "{path}");
            let next = &document["components"]["schemas"][body]["properties"]["next"];
            assert!(next.is_object(), "{body} has a next: {next}");
        }
    }

    #[test]
    fn without_tokens_no_operation_asks_for_authentication() {
        let text = |d: Value| d.to_string();
        assert!(text(document()).contains("\"security\""));
        assert!(!text(document_without_tokens()).contains("\"security\""));
    }

    /// The documented `pattern` of `TraceContextBody.{property}`.
    fn trace_pattern_text(property: &str) -> String {
        let document = document();
        document["components"]["schemas"]["TraceContextBody"]["properties"][property]["pattern"]
            .as_str()
            .unwrap_or_else(|| panic!("TraceContextBody.{property} has a pattern"))
            .to_owned()
    }

    /// [`trace_pattern_text`], compiled.
    fn trace_pattern(property: &str) -> regex::Regex {
        regex::Regex::new(&trace_pattern_text(property)).expect("an ECMAScript-compatible pattern")
    }

    #[test]
    fn a_trace_context_is_described_as_the_server_checks_it() {
        let parent = trace_pattern("traceparent");
        let (id, span) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
        for (traceparent, accepted) in [
            (format!("00-{id}-{span}-01"), true),
            (format!("00-{id}-{span}-00"), true),
            (format!("01-{id}-{span}-01"), false),
            (format!("00-{}-{span}-01", id.to_uppercase()), false),
            (format!("00-{}-{span}-01", &id[1..]), false),
            (format!("00-{id}-{span}"), false),
            (format!("00-{id}-{span}-01-00"), false),
            ("x".to_owned(), false),
        ] {
            assert_eq!(parent.is_match(&traceparent), accepted, "{traceparent}");
            let parsed = TraceContext::new(&traceparent, None);
            assert_eq!(parsed.is_ok(), accepted, "{traceparent}: {parsed:?}");
        }
        // The one refusal the pattern leaves to the description: all-zero ids.
        let zeros = format!("00-{}-{span}-01", "0".repeat(32));
        assert!(parent.is_match(&zeros));
        assert!(TraceContext::new(&zeros, None).is_err());
        let document = document();
        let state =
            &document["components"]["schemas"]["TraceContextBody"]["properties"]["tracestate"];
        assert_eq!(state["maxLength"], 512, "{state}");
        let state_pattern = trace_pattern("tracestate");
        let valid = format!("00-{id}-{span}-01");
        for (tracestate, accepted) in [
            ("vendor=value,other=1".to_owned(), true),
            ("a".repeat(512), true),
            ("a".repeat(513), false),
            ("caf\u{e9}".to_owned(), false),
            ("tab\there".to_owned(), false),
        ] {
            let described = state_pattern.is_match(&tracestate) && tracestate.len() <= 512;
            assert_eq!(described, accepted, "{tracestate}");
            let parsed = TraceContext::new(&valid, Some(&tracestate));
            assert_eq!(parsed.is_ok(), accepted, "{tracestate}: {parsed:?}");
        }
    }

    proptest::proptest! {
        /// Whatever a client builds from the documented pattern (ids not
        /// all zeros, as the description says), the server accepts: the
        /// strings are drawn from the document's own pattern, its anchors
        /// taken off (the generator draws whole strings).
        #[test]
        fn every_documented_traceparent_is_accepted(
            traceparent in proptest::string::string_regex(
                trace_pattern_text("traceparent")
                    .trim_start_matches('^')
                    .trim_end_matches('$')
            ).expect("a strategy")
        ) {
            proptest::prop_assume!(!traceparent[3..35].bytes().all(|b| b == b'0'));
            proptest::prop_assume!(!traceparent[36..52].bytes().all(|b| b == b'0'));
            proptest::prop_assert!(trace_pattern("traceparent").is_match(&traceparent));
            proptest::prop_assert!(TraceContext::new(&traceparent, None).is_ok());
        }
    }
}
