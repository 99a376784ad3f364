//! Streaming forwarding: the request body goes upstream as it arrives and the upstream body
//! comes back as it arrives (SSE event by event); nothing is buffered. Redirects are passed
//! through, never followed (the client has `redirect::Policy::none()`).

use crate::ProxyError;
use crate::state::ProxyState;
use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method};
use axum::response::{IntoResponse, Response};

/// Builds upstream headers from a plan of (lowercase name, value) pairs; `sensitive` names
/// are marked so no tracing layer ever prints them.
pub(crate) fn header_map(planned: Vec<(String, Vec<u8>)>, sensitive: &[&str]) -> HeaderMap {
    let mut headers = HeaderMap::with_capacity(planned.len());
    for (name, value) in planned {
        let (Ok(name), Ok(mut value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(&value),
        ) else {
            continue;
        };
        if sensitive.contains(&name.as_str()) {
            value.set_sensitive(true);
        }
        headers.append(name, value);
    }
    headers
}

/// Sends one request upstream and turns its response into ours.
pub(crate) async fn forward(
    state: &ProxyState,
    method: Method,
    url: url::Url,
    headers: HeaderMap,
    body: Body,
    keep_response_header: fn(&str) -> bool,
) -> Result<Response, ProxyError> {
    let mut request = state
        .inner
        .client
        .request(method.clone(), url)
        .headers(headers);
    if method != Method::GET && method != Method::HEAD {
        request = request.body(reqwest::Body::wrap_stream(body.into_data_stream()));
    }
    let upstream = request.send().await.map_err(|error| {
        state.inner.metrics.upstream_error();
        ProxyError::Upstream(error)
    })?;
    let status = upstream.status();
    let mut response_headers = HeaderMap::with_capacity(upstream.headers().len());
    for (name, value) in upstream.headers() {
        if keep_response_header(name.as_str()) {
            response_headers.append(name.clone(), value.clone());
        }
    }
    let body = Body::from_stream(upstream.bytes_stream());
    Ok((status, response_headers, body).into_response())
}
