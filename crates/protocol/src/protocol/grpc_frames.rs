//! Compressed gRPC requests, inflated under a cap of their own before tonic sees them.
//!
//! tonic caps a message's wire size and its decompressed size with one number,
//! `--grpc-max-message-bytes` (2 GiB, as Triton), so 2 MB of gzip could become 2 GiB. This layer
//! reads the messages of an inference call whose `grpc-encoding` is gzip or deflate, refuses one
//! announcing more than the wire cap before buffering it, inflates each compressed one on a
//! blocking thread (never on the async workers) stopping one byte past
//! `--grpc-max-decompressed-bytes`, and hands tonic the message uncompressed (flag 0). Messages
//! of calls without compression pass untouched, as does everything but the inference service.

use bytes::{Buf, Bytes, BytesMut};
use http_body::{Body as HttpBody, Frame};
use std::collections::VecDeque;
use std::future::Future;
use std::io::Read;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tonic::body::Body;
use tonic::Status;
use tower_service::Service;

/// The gRPC message header: a compression flag and a big-endian length.
const HEADER: usize = 5;

/// The calls whose compressed messages are inflated here.
const INFERENCE_SERVICE: &str = "/inference.GRPCInferenceService/";

/// The caps applied; cloned into each call's body.
#[derive(Debug, Clone, Copy)]
pub struct InflateLayer {
    /// `--grpc-max-message-bytes`: a message's size on the wire.
    pub max_wire: usize,
    /// `--grpc-max-decompressed-bytes`: a compressed message's size once inflated.
    pub max_decompressed: usize,
}

impl<S> tower_layer::Layer<S> for InflateLayer {
    type Service = Inflating<S>;

    fn layer(&self, inner: S) -> Inflating<S> {
        Inflating {
            inner,
            limits: *self,
        }
    }
}

/// A service whose compressed inference requests arrive inflated.
#[derive(Debug, Clone)]
pub struct Inflating<S> {
    inner: S,
    limits: InflateLayer,
}

impl<S> Service<axum::http::Request<Body>> for Inflating<S>
where
    S: Service<axum::http::Request<Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: axum::http::Request<Body>) -> Self::Future {
        let encoding = request
            .headers()
            .get("grpc-encoding")
            .and_then(|value| Encoding::parse(value.as_bytes()));
        match encoding {
            Some(encoding) if request.uri().path().starts_with(INFERENCE_SERVICE) => {
                let limits = self.limits;
                self.inner.call(request.map(|body| {
                    Body::new(Inflated {
                        inner: body,
                        encoding,
                        limits,
                        buffer: BytesMut::new(),
                        ready: VecDeque::new(),
                        job: None,
                        ended: false,
                        trailers: None,
                    })
                }))
            }
            _ => self.inner.call(request),
        }
    }
}

/// The compressions tonic accepts here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Gzip,
    /// gRPC's `deflate`: a zlib stream, as tonic reads it.
    Deflate,
}

impl Encoding {
    fn parse(value: &[u8]) -> Option<Encoding> {
        match value {
            b"gzip" => Some(Encoding::Gzip),
            b"deflate" => Some(Encoding::Deflate),
            _ => None,
        }
    }
}

type Inflation = tokio::task::JoinHandle<Result<Bytes, Status>>;

/// A request body whose compressed messages come out inflated.
struct Inflated {
    inner: Body,
    encoding: Encoding,
    limits: InflateLayer,
    /// Received bytes not yet handed on: at most one message and what follows it.
    buffer: BytesMut,
    /// Pieces ready to hand on, in order.
    ready: VecDeque<Bytes>,
    /// The message being inflated.
    job: Option<Inflation>,
    /// The inner body has ended.
    ended: bool,
    trailers: Option<axum::http::HeaderMap>,
}

impl Inflated {
    /// Takes the next whole message off the buffer: handed on as it is, or given to a blocking
    /// thread to inflate. False when the buffer holds no whole message.
    fn next_message(&mut self) -> Result<bool, Status> {
        if self.buffer.len() < HEADER {
            return Ok(false);
        }
        let flag = self.buffer[0];
        let mut length = &self.buffer[1..HEADER];
        let length = length.get_u32() as usize;
        if length > self.limits.max_wire {
            return Err(Status::out_of_range(format!(
                "Error, decoded message length too large: found {length} bytes, the limit is: {} \
                 bytes (--grpc-max-message-bytes)",
                self.limits.max_wire
            )));
        }
        if self.buffer.len() < HEADER + length {
            return Ok(false);
        }
        let message = self.buffer.split_to(HEADER + length).freeze();
        if flag != 1 {
            // Uncompressed (or an invalid flag, which tonic refuses).
            self.ready.push_back(message);
            return Ok(true);
        }
        let (encoding, cap) = (self.encoding, self.limits.max_decompressed);
        self.job = Some(tokio::task::spawn_blocking(move || {
            inflate(encoding, &message[HEADER..], cap)
        }));
        Ok(true)
    }

    /// Hands on an inflated message, uncompressed.
    fn inflated(&mut self, message: Bytes) -> Result<(), Status> {
        let length = u32::try_from(message.len())
            .map_err(|_| Status::resource_exhausted("the inflated message exceeds 4 GiB"))?;
        let mut header = BytesMut::with_capacity(HEADER);
        header.extend_from_slice(&[0]);
        header.extend_from_slice(&length.to_be_bytes());
        self.ready.push_back(header.freeze());
        self.ready.push_back(message);
        Ok(())
    }
}

/// Inflates one message, refusing it once it passes `cap` bytes.
///
/// # Errors
/// RESOURCE_EXHAUSTED past the cap, INTERNAL for bytes that do not inflate (as tonic).
pub fn inflate(encoding: Encoding, compressed: &[u8], cap: usize) -> Result<Bytes, Status> {
    let limit = u64::try_from(cap).unwrap_or(u64::MAX).saturating_add(1);
    let mut out = Vec::new();
    let read = match encoding {
        Encoding::Gzip => flate2::read::GzDecoder::new(compressed)
            .take(limit)
            .read_to_end(&mut out),
        Encoding::Deflate => flate2::read::ZlibDecoder::new(compressed)
            .take(limit)
            .read_to_end(&mut out),
    };
    read.map_err(|e| Status::internal(format!("Error decompressing: {e}")))?;
    if out.len() > cap {
        return Err(Status::resource_exhausted(format!(
            "the message is larger than {cap} bytes once decompressed \
             (--grpc-max-decompressed-bytes)"
        )));
    }
    Ok(Bytes::from(out))
}

impl HttpBody for Inflated {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        loop {
            if let Some(piece) = this.ready.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(piece))));
            }
            if let Some(job) = &mut this.job {
                let inflated = ready!(Pin::new(job).poll(cx));
                this.job = None;
                let step = inflated
                    .map_err(|e| Status::internal(format!("decompression stopped: {e}")))
                    .and_then(|message| message.and_then(|m| this.inflated(m)));
                if let Err(status) = step {
                    return Poll::Ready(Some(Err(status)));
                }
                continue;
            }
            match this.next_message() {
                Ok(true) => continue,
                Ok(false) => {}
                Err(status) => return Poll::Ready(Some(Err(status))),
            }
            if this.ended {
                if !this.buffer.is_empty() {
                    // A truncated message: tonic says so.
                    return Poll::Ready(Some(Ok(Frame::data(this.buffer.split().freeze()))));
                }
                return Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))));
            }
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => this.buffer.extend_from_slice(&data),
                    Err(frame) => this.trailers = frame.into_trailers().ok(),
                },
                Some(Err(status)) => return Poll::Ready(Some(Err(status))),
                None => this.ended = true,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended
            && self.ready.is_empty()
            && self.job.is_none()
            && self.buffer.is_empty()
            && self.trailers.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Every data frame of `body`, concatenated, or its first error.
    async fn collect(mut body: Inflated) -> Result<Vec<u8>, Status> {
        let mut out = Vec::new();
        while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
        {
            if let Ok(data) = frame?.into_data() {
                out.extend_from_slice(&data);
            }
        }
        Ok(out)
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(data).unwrap();
        encoder.finish().unwrap()
    }

    fn framed(flag: u8, message: &[u8]) -> Vec<u8> {
        let mut out = vec![flag];
        out.extend_from_slice(&(message.len() as u32).to_be_bytes());
        out.extend_from_slice(message);
        out
    }

    fn body(pieces: Vec<Vec<u8>>, limits: InflateLayer) -> Inflated {
        let chunks = pieces
            .into_iter()
            .map(|p| Ok::<_, Status>(Frame::data(Bytes::from(p))));
        Inflated {
            inner: Body::new(Chunks(chunks.collect())),
            encoding: Encoding::Gzip,
            limits,
            buffer: BytesMut::new(),
            ready: VecDeque::new(),
            job: None,
            ended: false,
            trailers: None,
        }
    }

    /// A body of the given frames.
    struct Chunks(VecDeque<Result<Frame<Bytes>, Status>>);

    impl HttpBody for Chunks {
        type Data = Bytes;
        type Error = Status;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
            Poll::Ready(self.0.pop_front())
        }
    }

    const LIMITS: InflateLayer = InflateLayer {
        max_wire: 1 << 20,
        max_decompressed: 1000,
    };

    #[tokio::test]
    async fn compressed_messages_come_out_inflated_in_order() {
        let first = framed(1, &gzip(b"hello"));
        let mut wire = first.clone();
        wire.extend(framed(0, b"plain"));
        // Split mid-header and mid-message.
        let pieces = vec![wire[..3].to_vec(), wire[3..9].to_vec(), wire[9..].to_vec()];
        let out = collect(body(pieces, LIMITS)).await.unwrap();
        let mut expected = framed(0, b"hello");
        expected.extend(framed(0, b"plain"));
        assert_eq!(&out[..], &expected[..]);
    }

    #[tokio::test]
    async fn a_bomb_stops_at_the_decompressed_cap() {
        let bomb = framed(1, &gzip(&vec![0; 1_000_000]));
        let err = collect(body(vec![bomb], LIMITS)).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        assert!(err.message().contains("--grpc-max-decompressed-bytes"));
        let fits = framed(1, &gzip(&[7; 1000]));
        let out = collect(body(vec![fits], LIMITS)).await.unwrap();
        assert_eq!(out.len(), HEADER + 1000);
    }

    #[tokio::test]
    async fn a_length_past_the_wire_cap_is_refused_before_it_is_buffered() {
        let header = vec![1, 0x7f, 0xff, 0xff, 0xff];
        let err = collect(body(vec![header], LIMITS)).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::OutOfRange);
    }
}
