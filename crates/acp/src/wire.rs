//! The ACP transport over a sandbox process's stdio: newline-delimited JSON-RPC messages, as
//! the `agent-client-protocol` crate's `Lines` transport, with a bounded line reader (the
//! crate's own `ByteStreams` buffers a line of any length; the agent is untrusted).

use agent_client_protocol::Lines;
use futures::{Sink, Stream};
use omabox_sandbox::{SandboxByteReader, SandboxByteWriter};
use std::io;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// The longest message the agent may send (one line of JSON). A longer one ends the
/// connection with an error instead of being buffered.
pub const MAX_MESSAGE_BYTES: usize = 8 * 1024 * 1024;

/// The `Lines` transport over `stdin` (to the agent) and `stdout` (from it).
pub(crate) fn transport(
    stdin: SandboxByteWriter,
    stdout: SandboxByteReader,
) -> Lines<
    impl Sink<String, Error = io::Error> + Send + 'static,
    impl Stream<Item = io::Result<String>> + Send + 'static,
> {
    Lines::new(outgoing(stdin), incoming(stdout, MAX_MESSAGE_BYTES))
}

fn outgoing(writer: SandboxByteWriter) -> impl Sink<String, Error = io::Error> + Send + 'static {
    Box::pin(futures::sink::unfold(
        writer,
        |mut writer, line: String| async move {
            writer.write_all(line.as_bytes()).await?;
            writer.write_all(b"\n").await?;
            writer.flush().await?;
            Ok::<_, io::Error>(writer)
        },
    ))
}

/// Lines of `reader` (without the newline; a final unterminated line counts), each at most
/// `max` bytes: a longer line or one that is not UTF-8 is an error that ends the stream.
pub(crate) fn incoming(
    reader: SandboxByteReader,
    max: usize,
) -> impl Stream<Item = io::Result<String>> + Send + 'static {
    let state = Some(BufReader::new(reader));
    Box::pin(futures::stream::unfold(state, move |state| async move {
        let mut reader = state?;
        match read_line(&mut reader, max).await {
            Ok(Some(line)) => Some((Ok(line), Some(reader))),
            Ok(None) => None,
            Err(error) => Some((Err(error), None)),
        }
    }))
}

async fn read_line(
    reader: &mut BufReader<SandboxByteReader>,
    max: usize,
) -> io::Result<Option<String>> {
    let mut line = Vec::new();
    loop {
        let buffer = reader.fill_buf().await?;
        if buffer.is_empty() {
            if line.is_empty() {
                return Ok(None);
            }
            break;
        }
        let (take, done) = match buffer.iter().position(|&b| b == b'\n') {
            Some(at) => (at, true),
            None => (buffer.len(), false),
        };
        if line.len() + take > max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the ACP agent sent a message over {max} bytes"),
            ));
        }
        line.extend_from_slice(&buffer[..take]);
        reader.consume(if done { take + 1 } else { take });
        if done {
            break;
        }
    }
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    String::from_utf8(line).map(Some).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "the ACP agent sent a message that is not UTF-8",
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    fn reader(bytes: &'static [u8]) -> SandboxByteReader {
        Box::new(bytes)
    }

    #[tokio::test]
    async fn lines_are_split_and_a_final_partial_line_counts() {
        let lines: Vec<_> = incoming(reader(b"{\"a\":1}\r\n\n{\"b\":2}"), 64)
            .collect()
            .await;
        let lines: Vec<String> = lines.into_iter().map(Result::unwrap).collect();
        assert_eq!(lines, ["{\"a\":1}", "", "{\"b\":2}"]);
    }

    #[tokio::test]
    async fn a_line_over_the_cap_ends_the_stream_with_an_error() {
        let mut lines = incoming(reader(b"0123456789abcdef\nnext\n"), 8);
        let error = lines.next().await.unwrap().unwrap_err();
        assert_eq!(
            error.to_string(),
            "the ACP agent sent a message over 8 bytes"
        );
        assert!(lines.next().await.is_none());
    }

    #[tokio::test]
    async fn non_utf8_is_an_error() {
        let mut lines = incoming(reader(b"\xff\xfe\n"), 8);
        assert!(lines.next().await.unwrap().is_err());
    }
}
