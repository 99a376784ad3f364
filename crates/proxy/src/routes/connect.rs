//! The Connect protocol (connectrpc.com/docs/protocol), server side, JSON codec only (the
//! codec both official E2B SDKs use): unary calls are `POST` with an `application/json`
//! body and answer one JSON message or an error; server-streaming calls carry enveloped
//! messages (`application/connect+json`: one flags byte, a u32 big-endian length, the
//! JSON) and end with an end-of-stream envelope (flags `0x02`) that holds the error, if any.
//!
//! Must never: read a request body past its cap, or let a message length from the peer
//! size an allocation beyond that cap.

use crate::routes::{header_str, read_capped};
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header::CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use std::time::Duration;

/// Content type of unary messages.
const UNARY_JSON: &str = "application/json";
/// Content type of streamed (enveloped) messages.
const STREAM_JSON: &str = "application/connect+json";
/// Envelope flag of the end-of-stream message.
const END_STREAM: u8 = 0x02;
/// Envelope flag of a compressed message (refused: no compression is negotiated).
const COMPRESSED: u8 = 0x01;
/// The longest deadline honoured (`Connect-Timeout-Ms`): longer ones mean "none".
const MAX_DEADLINE: Duration = Duration::from_secs(24 * 60 * 60);

/// A Connect error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Code {
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    Unimplemented,
    Internal,
    Unavailable,
}

impl Code {
    fn name(self) -> &'static str {
        match self {
            Self::InvalidArgument => "invalid_argument",
            Self::DeadlineExceeded => "deadline_exceeded",
            Self::NotFound => "not_found",
            Self::AlreadyExists => "already_exists",
            Self::PermissionDenied => "permission_denied",
            Self::ResourceExhausted => "resource_exhausted",
            Self::Unimplemented => "unimplemented",
            Self::Internal => "internal",
            Self::Unavailable => "unavailable",
        }
    }

    /// The HTTP status of a unary error (the protocol's table).
    fn status(self) -> StatusCode {
        match self {
            Self::InvalidArgument => StatusCode::BAD_REQUEST,
            Self::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Self::NotFound => StatusCode::NOT_FOUND,
            Self::AlreadyExists => StatusCode::CONFLICT,
            Self::PermissionDenied => StatusCode::FORBIDDEN,
            Self::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Self::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Self::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

/// A Connect error: its code and message.
#[derive(Debug, Clone)]
pub(crate) struct ConnectError {
    pub(crate) code: Code,
    pub(crate) message: String,
}

impl ConnectError {
    pub(crate) fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    fn json(&self) -> Value {
        json!({ "code": self.code.name(), "message": self.message })
    }
}

impl IntoResponse for ConnectError {
    /// The unary form: the code's status and the JSON error.
    fn into_response(self) -> Response {
        if self.code == Code::Internal {
            tracing::error!(message = %self.message, "envd call failed");
        }
        let body = serde_json::to_vec(&self.json()).unwrap_or_default();
        (
            self.code.status(),
            [(CONTENT_TYPE, HeaderValue::from_static(UNARY_JSON))],
            body,
        )
            .into_response()
    }
}

/// Refuses a request whose content type is given and is not `expected` (only the JSON
/// codec is served).
fn require_media(headers: &HeaderMap, expected: &str) -> Result<(), ConnectError> {
    let given = header_str(headers, "content-type")
        .map(|kind| kind.split(';').next().unwrap_or_default().trim());
    match given {
        Some(media) if !media.eq_ignore_ascii_case(expected) => Err(ConnectError::new(
            Code::InvalidArgument,
            format!("content-type must be {expected} (only the JSON codec is served)"),
        )),
        _ => Ok(()),
    }
}

/// The content type of a client-streaming call's body is the streamed one.
pub(crate) fn require_stream_media(headers: &HeaderMap) -> Result<(), ConnectError> {
    require_media(headers, STREAM_JSON)
}

/// The message of a unary call (`Ok(None)`: an empty body, which proto3 JSON reads as the
/// empty message).
pub(crate) async fn unary_request<T: DeserializeOwned + Default>(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<T, ConnectError> {
    require_media(headers, UNARY_JSON)?;
    let bytes = read_capped(headers, body, limit).await.map_err(|_| {
        ConnectError::new(
            Code::ResourceExhausted,
            format!("request message too large (at most {limit} bytes)"),
        )
    })?;
    parse(&bytes)
}

/// The one message of a server-streaming call's request body.
pub(crate) async fn stream_request<T: DeserializeOwned + Default>(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<T, ConnectError> {
    require_media(headers, STREAM_JSON)?;
    let bytes = read_capped(headers, body, limit.saturating_add(5))
        .await
        .map_err(|_| {
            ConnectError::new(
                Code::ResourceExhausted,
                format!("request message too large (at most {limit} bytes)"),
            )
        })?;
    let Some((&[flags, a, b, c, d], rest)) = bytes.split_first_chunk::<5>() else {
        return Err(ConnectError::new(
            Code::InvalidArgument,
            "the request is not an enveloped message",
        ));
    };
    let length = u32::from_be_bytes([a, b, c, d]) as usize;
    if flags & COMPRESSED != 0 {
        return Err(ConnectError::new(
            Code::InvalidArgument,
            "compressed messages are not accepted",
        ));
    }
    if length != rest.len() {
        return Err(ConnectError::new(
            Code::InvalidArgument,
            "the request must hold exactly one message",
        ));
    }
    parse(rest)
}

fn parse<T: DeserializeOwned + Default>(bytes: &[u8]) -> Result<T, ConnectError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(bytes).map_err(|e| {
        let mut text = e.to_string();
        if text.len() > 200 {
            let cut = (0..=200)
                .rev()
                .find(|&i| text.is_char_boundary(i))
                .unwrap_or(0);
            text.truncate(cut);
            text.push('…');
        }
        ConnectError::new(
            Code::InvalidArgument,
            format!("the request message is not valid: {text}"),
        )
    })
}

/// A unary answer.
pub(crate) fn unary_response<T: Serialize>(message: &T) -> Response {
    match serde_json::to_vec(message) {
        Ok(body) => (
            StatusCode::OK,
            [(CONTENT_TYPE, HeaderValue::from_static(UNARY_JSON))],
            body,
        )
            .into_response(),
        Err(e) => ConnectError::new(Code::Internal, format!("cannot encode the answer: {e}"))
            .into_response(),
    }
}

/// One streamed item: a message, or the error that ends the stream.
pub(crate) type StreamItem = Result<Value, ConnectError>;

/// A server-streaming answer: every message of `messages` enveloped, then the end of the
/// stream (with the first error, which ends it).
pub(crate) fn stream_response<S>(messages: S) -> Response
where
    S: Stream<Item = StreamItem> + Send + 'static,
{
    use futures::StreamExt as _;
    let frames = futures::stream::unfold(
        (Box::pin(messages), false),
        |(mut messages, ended)| async move {
            if ended {
                return None;
            }
            let (frame, ended) = match messages.next().await {
                Some(Ok(message)) => (envelope(0, &message), false),
                Some(Err(error)) => (
                    envelope(END_STREAM, &json!({ "error": error.json() })),
                    true,
                ),
                None => (envelope(END_STREAM, &json!({})), true),
            };
            Some((Ok::<_, std::convert::Infallible>(frame), (messages, ended)))
        },
    );
    (
        StatusCode::OK,
        [(CONTENT_TYPE, HeaderValue::from_static(STREAM_JSON))],
        Body::from_stream(frames),
    )
        .into_response()
}

/// A stream that fails at once (a server-streaming call refused before it began).
pub(crate) fn stream_error(error: ConnectError) -> Response {
    stream_response(futures::stream::once(async move { Err(error) }))
}

fn envelope(flags: u8, message: &Value) -> Bytes {
    let json = serde_json::to_vec(message).unwrap_or_else(|_| b"{}".to_vec());
    let mut frame = Vec::with_capacity(json.len() + 5);
    frame.push(flags);
    frame.extend_from_slice(&u32::try_from(json.len()).unwrap_or(u32::MAX).to_be_bytes());
    frame.extend_from_slice(&json);
    Bytes::from(frame)
}

/// The call's deadline (`Connect-Timeout-Ms`), when it has a usable one.
pub(crate) fn deadline(headers: &HeaderMap) -> Option<Duration> {
    let ms: u64 = header_str(headers, "connect-timeout-ms")?
        .trim()
        .parse()
        .ok()?;
    let timeout = Duration::from_millis(ms);
    (timeout > Duration::ZERO && timeout <= MAX_DEADLINE).then_some(timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default, serde::Deserialize, PartialEq)]
    struct Message {
        #[serde(default)]
        path: String,
    }

    fn stream_headers() -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(STREAM_JSON));
        headers
    }

    #[tokio::test]
    async fn an_enveloped_request_parses_and_a_bad_envelope_is_refused() {
        let good = envelope(0, &json!({ "path": "/x" }));
        let parsed: Message = stream_request(&stream_headers(), Body::from(good), 1024)
            .await
            .unwrap();
        assert_eq!(parsed.path, "/x");
        for bad in [
            vec![0u8, 0, 0],
            vec![0, 0, 0, 0, 9, b'{', b'}'],
            vec![1, 0, 0, 0, 2, b'{', b'}'],
        ] {
            let error = stream_request::<Message>(&stream_headers(), Body::from(bad), 1024)
                .await
                .unwrap_err();
            assert_eq!(error.code, Code::InvalidArgument, "{}", error.message);
        }
        let huge = envelope(0, &json!({ "path": "x".repeat(2000) }));
        let error = stream_request::<Message>(&stream_headers(), Body::from(huge), 1024)
            .await
            .unwrap_err();
        assert_eq!(error.code, Code::ResourceExhausted);
    }

    #[tokio::test]
    async fn a_stream_ends_with_an_end_envelope_holding_its_error() {
        let messages = futures::stream::iter(vec![
            Ok(json!({ "a": 1 })),
            Err(ConnectError::new(Code::NotFound, "gone")),
            Ok(json!({ "never": true })),
        ]);
        let response = stream_response(messages);
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        let first_len = u32::from_be_bytes(body[1..5].try_into().unwrap()) as usize;
        assert_eq!(body[0], 0);
        assert_eq!(&body[5..5 + first_len], br#"{"a":1}"#);
        let rest = &body[5 + first_len..];
        assert_eq!(rest[0], END_STREAM);
        let end: Value = serde_json::from_slice(&rest[5..]).unwrap();
        assert_eq!(end["error"]["code"], "not_found");
        assert_eq!(end["error"]["message"], "gone");
    }

    #[test]
    fn deadlines_are_read_within_bounds() {
        let mut headers = HeaderMap::new();
        assert_eq!(deadline(&headers), None);
        headers.insert("connect-timeout-ms", HeaderValue::from_static("1500"));
        assert_eq!(deadline(&headers), Some(Duration::from_millis(1500)));
        headers.insert("connect-timeout-ms", HeaderValue::from_static("0"));
        assert_eq!(deadline(&headers), None);
        headers.insert("connect-timeout-ms", HeaderValue::from_static("nope"));
        assert_eq!(deadline(&headers), None);
    }
}
