//! A router that keeps the list of what it routes: every `(method, path)` is recorded by the same
//! call that registers its handler, so the list cannot differ from what axum serves. The OpenAPI
//! document (`openapi`) is checked against these lists in a unit test, both ways.

use axum::handler::Handler;
use axum::http::Method;
use axum::routing::{delete, get, post};
use axum::Router;

/// An axum router and the `(method, path)` pairs it routes, in axum's path syntax (`{model}`,
/// which is OpenAPI's too).
pub struct Routes<S> {
    router: Router<S>,
    listed: Vec<(Method, String)>,
}

impl<S: Clone + Send + Sync + 'static> Routes<S> {
    pub fn new() -> Routes<S> {
        Routes {
            router: Router::new(),
            listed: Vec::new(),
        }
    }

    /// `GET path` (axum answers `HEAD` with it too, as every HTTP server may).
    pub fn get<H: Handler<T, S>, T: 'static>(mut self, path: &str, handler: H) -> Routes<S> {
        self.router = self.router.route(path, get(handler));
        self.listed.push((Method::GET, path.to_string()));
        self
    }

    pub fn post<H: Handler<T, S>, T: 'static>(mut self, path: &str, handler: H) -> Routes<S> {
        self.router = self.router.route(path, post(handler));
        self.listed.push((Method::POST, path.to_string()));
        self
    }

    pub fn delete<H: Handler<T, S>, T: 'static>(mut self, path: &str, handler: H) -> Routes<S> {
        self.router = self.router.route(path, delete(handler));
        self.listed.push((Method::DELETE, path.to_string()));
        self
    }

    /// Both tables' routes (paths must not overlap, as for axum's `merge`).
    pub fn merge(mut self, other: Routes<S>) -> Routes<S> {
        self.router = self.router.merge(other.router);
        self.listed.extend(other.listed);
        self
    }

    /// Every `(method, path)` routed, in the order registered.
    pub fn listed(&self) -> &[(Method, String)] {
        &self.listed
    }

    pub fn into_router(self) -> Router<S> {
        self.router
    }
}

impl<S: Clone + Send + Sync + 'static> Default for Routes<S> {
    fn default() -> Routes<S> {
        Routes::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use tower_service::Service;

    #[tokio::test]
    async fn two_methods_on_one_path_both_route_and_are_both_listed() {
        let routes: Routes<()> = Routes::new()
            .get("/a/{x}", || async { "got" })
            .post("/a/{x}", || async { "posted" });
        assert_eq!(
            routes.listed(),
            [
                (Method::GET, "/a/{x}".to_string()),
                (Method::POST, "/a/{x}".to_string())
            ]
        );
        let mut router = routes.into_router();
        for (method, status) in [
            (Method::GET, StatusCode::OK),
            (Method::POST, StatusCode::OK),
            (Method::PUT, StatusCode::METHOD_NOT_ALLOWED),
        ] {
            let request = Request::builder()
                .method(method)
                .uri("/a/1")
                .body(Body::empty())
                .unwrap();
            let response = router.call(request).await.unwrap();
            assert_eq!(response.status(), status);
        }
    }
}
