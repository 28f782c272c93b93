//! The OpenAPI 3.1 document of every REST route kiln serves (`openapi.json`, written by hand and
//! embedded), served at `GET /v2/openapi.json`. The tests below hold it to the routers: every
//! route the REST and OpenAI routers register is in the document and every operation in the
//! document is a route (the routers list their routes through [`Routes`]); the conformance suite
//! validates it with openapi-spec-validator and checks live answers against its schemas.

use super::route_table::Routes;
use super::routes::Shared;
use axum::http::header;
use axum::response::IntoResponse;

/// The document, as served.
pub const DOCUMENT: &str = include_str!("openapi.json");

pub fn routes() -> Routes<Shared> {
    Routes::new().get("/v2/openapi.json", document)
}

async fn document() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], DOCUMENT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use std::collections::BTreeSet;

    /// `(METHOD, path)` of every operation in the document.
    fn documented() -> BTreeSet<(String, String)> {
        let doc: Value = serde_json::from_str(DOCUMENT).expect("openapi.json is JSON");
        assert_eq!(doc["openapi"], "3.1.0");
        let mut operations = BTreeSet::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for (method, _) in item.as_object().expect("a path item") {
                if ["servers", "parameters", "summary", "description"].contains(&method.as_str()) {
                    continue;
                }
                operations.insert((method.to_uppercase(), path.clone()));
            }
        }
        operations
    }

    fn routed<S: Clone + Send + Sync + 'static>(routes: &Routes<S>) -> BTreeSet<(String, String)> {
        routes
            .listed()
            .iter()
            .map(|(method, path)| (method.to_string(), path.clone()))
            .collect()
    }

    #[test]
    fn the_document_lists_exactly_the_routes_served() {
        let mut served = routed(&crate::protocol::http::routes::routes(true));
        served.extend(routed(&crate::protocol::http::openai::routes()));
        let documented = documented();
        let undocumented: Vec<_> = served.difference(&documented).collect();
        let unrouted: Vec<_> = documented.difference(&served).collect();
        assert!(
            undocumented.is_empty() && unrouted.is_empty(),
            "routes missing from openapi.json: {undocumented:?}; documented but not routed: {unrouted:?}"
        );
    }

    #[test]
    fn every_path_parameter_is_declared() {
        let doc: Value = serde_json::from_str(DOCUMENT).unwrap();
        for (path, item) in doc["paths"].as_object().unwrap() {
            let placeholders: BTreeSet<&str> = path
                .split('/')
                .filter_map(|s| s.strip_prefix('{')?.strip_suffix('}'))
                .collect();
            for (method, operation) in item.as_object().unwrap() {
                if method == "servers" {
                    continue;
                }
                let declared: BTreeSet<&str> = operation["parameters"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|p| p["$ref"].as_str()?.rsplit('/').next())
                    .collect();
                assert_eq!(declared, placeholders, "{method} {path}");
            }
        }
    }

    #[test]
    fn without_the_console_its_routes_are_gone() {
        let served = routed(&crate::protocol::http::routes::routes(false));
        assert!(served.iter().all(|(_, path)| !path.starts_with("/console")));
        assert!(served.contains(&("GET".into(), "/v2/openapi.json".into())));
    }
}
