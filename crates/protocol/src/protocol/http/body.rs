//! Request bodies and response compression.
//!
//! Bodies are read frame by frame (plain `Content-Length` or chunked) and refused with 413 as
//! soon as they pass the limit, so a client cannot make the server buffer more than
//! `--http-max-input-size`; a declared `Content-Length` above the limit is refused before any
//! byte is read. A body that goes `--http-body-timeout-secs` without a byte arriving is answered
//! 408 (nginx's `client_body_timeout`), so a stalled client holds its connection no longer. `Content-Encoding: gzip | deflate` bodies are inflated under the same cap (a
//! compression bomb stops at the limit; past it: 400 in Triton's words). Responses are compressed when `Accept-Encoding` asks,
//! choosing as Triton does among `gzip`, `deflate` and `identity` by `q` weight.

use super::{HttpConfig, HttpError};
use crate::core::Error;
use crate::invalid_arg;
use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use bytes::{Bytes, BytesMut};
use std::io::{Read, Write};
use std::sync::Arc;
use tokio_stream::StreamExt;

/// A supported content coding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Identity,
    Gzip,
    /// HTTP's `deflate`: a zlib stream (what tritonclient sends and expects).
    Deflate,
}

impl Encoding {
    /// The `Content-Encoding` value, `None` for identity.
    pub fn header_value(self) -> Option<HeaderValue> {
        match self {
            Encoding::Identity => None,
            Encoding::Gzip => Some(HeaderValue::from_static("gzip")),
            Encoding::Deflate => Some(HeaderValue::from_static("deflate")),
        }
    }
}

fn too_large(limit: usize) -> HttpError {
    HttpError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!(
            "request body exceeds the maximum input size of {limit} bytes (--http-max-input-size)"
        ),
    )
}

/// A compressed body that inflates past the limit: Triton's status and words (server
/// src/data_compressor.h, `DataCompressor::DecompressData`: INVALID_ARG, 400).
fn inflates_too_large(limit: usize) -> HttpError {
    HttpError::from(invalid_arg!(
        "Decompressed data size exceeds the maximum allowed value of {limit} bytes. Use \
         --http-max-input-size to increase the limit."
    ))
}

/// The request's `Content-Encoding`.
///
/// # Errors
/// 501 "Unsupported compression type" with `Accept-Encoding: gzip, deflate`, as Triton answers.
pub fn request_encoding(headers: &HeaderMap) -> Result<Encoding, HttpError> {
    let Some(value) = headers.get(header::CONTENT_ENCODING) else {
        return Ok(Encoding::Identity);
    };
    match value.to_str().map(str::trim) {
        Ok("" | "identity") => Ok(Encoding::Identity),
        Ok("gzip") => Ok(Encoding::Gzip),
        Ok("deflate") => Ok(Encoding::Deflate),
        _ => Err(
            HttpError::from(Error::Unsupported("Unsupported compression type".into()))
                .with_header(header::ACCEPT_ENCODING, "gzip, deflate"),
        ),
    }
}

fn too_slow(timeout: std::time::Duration) -> HttpError {
    HttpError::new(
        StatusCode::REQUEST_TIMEOUT,
        format!(
            "no byte of the request body arrived for {} s (--http-body-timeout-secs)",
            timeout.as_secs_f64()
        ),
    )
}

/// Reads the whole body, decompressed, refusing more than `config.max_input_bytes` either way
/// and a body that stalls for `config.body_timeout`.
///
/// # Errors
/// 413 past the limit, 400 past it once inflated, 408 for a stalled body, 501 for an unknown
/// encoding, 400 for a body that does not inflate or a connection that fails mid-body.
pub async fn read(
    body: Body,
    headers: &HeaderMap,
    config: &HttpConfig,
) -> Result<Bytes, HttpError> {
    let (limit, timeout) = (config.max_input_bytes, config.body_timeout);
    let encoding = request_encoding(headers)?;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(too_large(limit));
    }
    let mut frames = body.into_data_stream();
    let raw = match next_frame(&mut frames, timeout).await? {
        None => Bytes::new(),
        // The whole declared body in one frame (the usual case: it came with the head). It is
        // kept as it is, and the end of the stream is not awaited: the connection already knows
        // the body is complete.
        Some(Ok(frame)) if declared == Some(frame.len() as u64) => frame,
        Some(first) => {
            // Trust the declared length only as a capacity hint, only up to the limit, and past
            // the first MiB only once that much has come (a client that declares 64 MiB and
            // stalls costs no more than what it sent).
            let declared_len = declared.map_or(0, |len| len as usize);
            let mut buffer = BytesMut::with_capacity(declared_len.min(TRUSTED_CAPACITY));
            let mut next = Some(first);
            while let Some(frame) = next {
                let frame =
                    frame.map_err(|e| invalid_arg!("failed to read the request body: {e}"))?;
                if buffer.len() + frame.len() > limit {
                    return Err(too_large(limit));
                }
                if buffer.len() + frame.len() > buffer.capacity() && declared_len > buffer.len() {
                    buffer.reserve(declared_len - buffer.len());
                }
                buffer.extend_from_slice(&frame);
                if declared == Some(buffer.len() as u64) {
                    break;
                }
                next = next_frame(&mut frames, timeout).await?;
            }
            buffer.freeze()
        }
    };
    match encoding {
        Encoding::Identity => Ok(raw),
        compressed => {
            let budget = Arc::clone(&config.inflate_budget);
            tokio::task::spawn_blocking(move || inflate(compressed, &raw, limit, &budget))
                .await
                .map_err(|e| Error::Internal(e.to_string()))?
        }
    }
}

/// The bytes all REST bodies being inflated, or inflated and still held, may take at once
/// (`--http-max-inflated-bytes`). One gzip body of 60 KB inflates to 64 MiB: without a bound
/// shared by every request, forty such bodies sent at once held 1.7 GB (bench/RESULTS.md). A
/// body that would take more than what is left is refused (429, Retry-After) rather than
/// waited for: bodies waiting on each other's share could wait for ever.
#[derive(Debug)]
pub struct InflateBudget {
    max: usize,
    used: std::sync::Mutex<usize>,
}

impl InflateBudget {
    pub fn new(max: usize) -> Arc<InflateBudget> {
        Arc::new(InflateBudget {
            max,
            used: std::sync::Mutex::new(0),
        })
    }

    /// Takes `bytes` more for `taken`, or says no when the budget has not that much left.
    fn take(self: &Arc<Self>, taken: &mut Taken, bytes: usize) -> Result<(), HttpError> {
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        if *used + bytes > self.max {
            return Err(HttpError::from(Error::ResourceExhausted(format!(
                "compressed request bodies being inflated would take more than the {} bytes \
                 of --http-max-inflated-bytes; try again",
                self.max
            ))));
        }
        *used += bytes;
        taken.bytes += bytes;
        Ok(())
    }
}

/// A share of the [`InflateBudget`], given back when dropped (with the inflated body it covers).
#[derive(Debug)]
struct Taken {
    budget: Arc<InflateBudget>,
    bytes: usize,
}

impl Drop for Taken {
    fn drop(&mut self) {
        let mut used = self.budget.used.lock().unwrap_or_else(|e| e.into_inner());
        *used -= self.bytes;
    }
}

/// An inflated body holding its share of the budget for as long as any of its bytes live.
struct Inflated {
    data: Vec<u8>,
    _taken: Taken,
}

impl AsRef<[u8]> for Inflated {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

/// How much of the budget an inflating body takes at a time.
const INFLATE_STEP: usize = 1 << 20;

/// The part of a declared `Content-Length` reserved before the body has arrived.
const TRUSTED_CAPACITY: usize = 1 << 20;

/// The next frame of a body, or 408 when none comes within `timeout`.
async fn next_frame<S: tokio_stream::Stream + Unpin>(
    frames: &mut S,
    timeout: std::time::Duration,
) -> Result<Option<S::Item>, HttpError> {
    tokio::time::timeout(timeout, frames.next())
        .await
        .map_err(|_| too_slow(timeout))
}

/// Decompresses `data`, stopping one byte past `limit` so a bomb never inflates further, and
/// taking its output's size from `budget` a MiB at a time as it grows.
fn inflate(
    encoding: Encoding,
    data: &[u8],
    limit: usize,
    budget: &Arc<InflateBudget>,
) -> Result<Bytes, HttpError> {
    let reader: Box<dyn Read + '_> = match encoding {
        Encoding::Gzip => Box::new(flate2::read::MultiGzDecoder::new(data)),
        Encoding::Deflate => Box::new(flate2::read::ZlibDecoder::new(data)),
        Encoding::Identity => return Ok(Bytes::copy_from_slice(data)),
    };
    let mut reader = reader.take(limit as u64 + 1);
    let mut taken = Taken {
        budget: Arc::clone(budget),
        bytes: 0,
    };
    let mut out = Vec::new();
    loop {
        budget.take(&mut taken, INFLATE_STEP)?;
        let before = out.len();
        (&mut reader)
            .take(INFLATE_STEP as u64)
            .read_to_end(&mut out)
            .map_err(|e| invalid_arg!("failed to decompress the request body: {e}"))?;
        if out.len() > limit {
            return Err(inflates_too_large(limit));
        }
        if out.len() - before < INFLATE_STEP {
            break;
        }
    }
    Ok(Bytes::from_owner(Inflated {
        data: out,
        _taken: taken,
    }))
}

/// The response encoding for an `Accept-Encoding` header: the highest-weighted of `gzip`,
/// `deflate` and `identity` (ties keep the earlier one), identity when none is acceptable.
pub fn response_encoding(accept: Option<&HeaderValue>) -> Encoding {
    let Some(accept) = accept.and_then(|v| v.to_str().ok()) else {
        return Encoding::Identity;
    };
    let mut best = (Encoding::Identity, 0.0f64);
    for item in accept.split(',') {
        let mut parts = item.split(';').map(str::trim);
        let coding = match parts.next() {
            Some("gzip") => Encoding::Gzip,
            Some("deflate") => Encoding::Deflate,
            Some("identity") => Encoding::Identity,
            _ => continue,
        };
        let mut weight = 1.0;
        for param in parts {
            if let Some(q) = param.strip_prefix("q=") {
                weight = q.trim().parse().unwrap_or(-1.0);
            }
        }
        if weight > best.1 {
            best = (coding, weight);
        }
    }
    best.0
}

/// Compresses a response body; on failure the body is sent as is (Triton does the same).
pub fn compress(encoding: Encoding, body: Vec<u8>) -> (Encoding, Vec<u8>) {
    let level = flate2::Compression::default();
    let result = match encoding {
        Encoding::Identity => return (encoding, body),
        Encoding::Gzip => {
            let mut encoder = flate2::write::GzEncoder::new(Vec::new(), level);
            encoder.write_all(&body).and_then(|()| encoder.finish())
        }
        Encoding::Deflate => {
            let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), level);
            encoder.write_all(&body).and_then(|()| encoder.finish())
        }
    };
    match result {
        Ok(compressed) => (encoding, compressed),
        Err(_) => (Encoding::Identity, body),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`super::read`] under `limit`, with a minute for the body.
    async fn read(body: Body, headers: &HeaderMap, limit: usize) -> Result<Bytes, HttpError> {
        super::read(
            body,
            headers,
            &config(limit, std::time::Duration::from_secs(60)),
        )
        .await
    }

    fn config(max_input_bytes: usize, body_timeout: std::time::Duration) -> HttpConfig {
        HttpConfig {
            max_input_bytes,
            body_timeout,
            access: Default::default(),
            console: false,
            inflate_budget: InflateBudget::new(usize::MAX),
        }
    }

    /// A body that sends part of itself and then stalls is answered 408 once the timeout passes
    /// without a byte.
    #[tokio::test]
    async fn a_stalled_body_times_out() {
        let stalled = Body::from_stream(
            tokio_stream::iter([Ok::<_, std::io::Error>(Bytes::from_static(b"he"))])
                .chain(tokio_stream::pending()),
        );
        let declared = headers(&[("content-length", "5")]);
        let timeout = std::time::Duration::from_millis(50);
        let err = super::read(stalled, &declared, &config(100, timeout))
            .await
            .unwrap_err();
        assert_eq!(err.status(), StatusCode::REQUEST_TIMEOUT);
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.insert(*k, HeaderValue::from_static(v));
        }
        map
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        compress(Encoding::Gzip, data.to_vec()).1
    }

    #[tokio::test]
    async fn reads_plain_and_compressed_bodies() {
        let body = read(Body::from("hello"), &HeaderMap::new(), 100)
            .await
            .unwrap();
        assert_eq!(&body[..], b"hello");
        let gz = read(
            Body::from(gzip(b"hello")),
            &headers(&[("content-encoding", "gzip")]),
            100,
        )
        .await
        .unwrap();
        assert_eq!(&gz[..], b"hello");
        let zlib = compress(Encoding::Deflate, b"hello".to_vec()).1;
        let inflated = read(
            Body::from(zlib),
            &headers(&[("content-encoding", "deflate")]),
            100,
        )
        .await
        .unwrap();
        assert_eq!(&inflated[..], b"hello");
    }

    /// A body whose declared length has arrived is complete: the reader neither waits for the end
    /// of the stream (here it never comes) nor copies a body that came in one piece.
    #[tokio::test]
    async fn the_declared_length_ends_the_body() {
        let never_ending = |chunks: Vec<Bytes>| {
            let chunks = chunks.into_iter().map(Ok::<_, std::io::Error>);
            Body::from_stream(tokio_stream::iter(chunks).chain(tokio_stream::pending()))
        };
        let declared = headers(&[("content-length", "5")]);
        let read_within = |body, headers| async move {
            tokio::time::timeout(std::time::Duration::from_secs(5), read(body, &headers, 100))
                .await
                .expect("the declared length was reached")
        };
        let pieces = vec![Bytes::from_static(b"hel"), Bytes::from_static(b"lo")];
        let pieces = read_within(never_ending(pieces), declared.clone()).await;
        assert_eq!(&pieces.unwrap()[..], b"hello");
        let whole = Bytes::from_static(b"hello");
        let read_once = read_within(never_ending(vec![whole.clone()]), declared)
            .await
            .unwrap();
        assert_eq!(read_once.as_ptr(), whole.as_ptr(), "not copied");
    }

    #[tokio::test]
    async fn limits_apply_before_and_after_inflating() {
        let err = read(Body::from(vec![0u8; 101]), &HeaderMap::new(), 100)
            .await
            .unwrap_err();
        assert_eq!(err.status(), StatusCode::PAYLOAD_TOO_LARGE);
        let declared = headers(&[("content-length", "1000000000000")]);
        let err = read(Body::empty(), &declared, 100).await.unwrap_err();
        assert_eq!(err.status(), StatusCode::PAYLOAD_TOO_LARGE);
        // 10 MB of zeros compress to ~10 KB: under the limit compressed, over it inflated.
        let bomb = gzip(&vec![0u8; 10_000_000]);
        assert!(bomb.len() < 100_000);
        let err = read(
            Body::from(bomb),
            &headers(&[("content-encoding", "gzip")]),
            100_000,
        )
        .await
        .unwrap_err();
        assert_eq!(err.status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            err.message(),
            "Decompressed data size exceeds the maximum allowed value of 100000 bytes. Use \
             --http-max-input-size to increase the limit."
        );
        // Exactly the limit inflated is within it (Triton refuses only past it).
        let exact = gzip(&vec![0u8; 100_000]);
        let body = read(
            Body::from(exact),
            &headers(&[("content-encoding", "gzip")]),
            100_000,
        )
        .await
        .unwrap();
        assert_eq!(body.len(), 100_000);
    }

    #[tokio::test]
    async fn bad_encodings() {
        let err = read(
            Body::from("x"),
            &headers(&[("content-encoding", "br")]),
            100,
        )
        .await
        .unwrap_err();
        assert_eq!(err.status(), StatusCode::NOT_IMPLEMENTED);
        let err = read(
            Body::from("not gzip"),
            &headers(&[("content-encoding", "gzip")]),
            100,
        )
        .await
        .unwrap_err();
        assert_eq!(err.status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            request_encoding(&headers(&[("content-encoding", "identity")])).unwrap(),
            Encoding::Identity
        );
    }

    #[test]
    fn accept_encoding_negotiation() {
        let pick = |v: &'static str| response_encoding(Some(&HeaderValue::from_static(v)));
        assert_eq!(response_encoding(None), Encoding::Identity);
        assert_eq!(pick("gzip"), Encoding::Gzip);
        assert_eq!(pick("deflate"), Encoding::Deflate);
        assert_eq!(pick("gzip, deflate"), Encoding::Gzip);
        assert_eq!(pick("gzip;q=0.5, deflate"), Encoding::Deflate);
        assert_eq!(pick("gzip; q=0.9, identity;q=1"), Encoding::Identity);
        assert_eq!(pick("br, *"), Encoding::Identity);
        assert_eq!(pick("gzip;q=0"), Encoding::Identity);
        assert_eq!(pick("gzip;q=abc"), Encoding::Identity);
    }

    #[test]
    fn compression_round_trips() {
        let data = b"some response body".repeat(10);
        let (encoding, gz) = compress(Encoding::Gzip, data.clone());
        assert_eq!(encoding, Encoding::Gzip);
        let budget = InflateBudget::new(usize::MAX);
        let inflated = inflate(Encoding::Gzip, &gz, 1000, &budget).unwrap();
        assert_eq!(&inflated[..], &data[..]);
        let (_, zlib) = compress(Encoding::Deflate, data.clone());
        assert_eq!(
            &inflate(Encoding::Deflate, &zlib, 1000, &budget).unwrap()[..],
            &data[..]
        );
        assert_eq!(compress(Encoding::Identity, data.clone()).1, data);
    }

    fn used(budget: &InflateBudget) -> usize {
        *budget.used.lock().unwrap()
    }

    #[test]
    fn inflated_bodies_share_one_budget_while_they_live() {
        let mib = INFLATE_STEP;
        let budget = InflateBudget::new(3 * mib);
        let small = compress(Encoding::Gzip, vec![b'x'; 100]).1;
        let large = compress(Encoding::Gzip, vec![0; 2 * mib + 1]).1;
        // A small body takes one step; a body of two MiB and a byte takes three.
        let first = inflate(Encoding::Gzip, &small, 64 * mib, &budget).unwrap();
        assert_eq!(used(&budget), mib);
        let refused = inflate(Encoding::Gzip, &large, 64 * mib, &budget).unwrap_err();
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(
            refused.message.contains("--http-max-inflated-bytes"),
            "{}",
            refused.message
        );
        // A refused body gives back what it took; a body gives its share back once dropped,
        // clones included.
        assert_eq!(used(&budget), mib);
        let clone = first.clone();
        drop(first);
        assert_eq!(used(&budget), mib);
        drop(clone);
        assert_eq!(used(&budget), 0);
        let large = inflate(Encoding::Gzip, &large, 64 * mib, &budget).unwrap();
        assert_eq!(large.len(), 2 * mib + 1);
        assert_eq!(used(&budget), 3 * mib);
        drop(large);
        assert_eq!(used(&budget), 0);
    }
}
