//! NRI's connection multiplexer (containerd/nri `pkg/net/multiplex`).
//!
//! A plugin's one Unix socket to the runtime carries two ttRPC
//! connections: the plugin's service (the runtime calls the plugin) and
//! the runtime's service (the plugin registers). Each frame on the socket
//! is an 8-byte header, the logical connection's id and the payload's
//! length (both big-endian `u32`), and the payload. Here each logical
//! connection is one end of an in-memory duplex pipe that ttRPC reads and
//! writes as if it were the socket; two tasks per connection move the
//! bytes.

use std::collections::HashMap;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::sync::Mutex;
use tokio::task::JoinSet;

/// A logical connection's id.
pub type ConnId = u32;

/// The plugin's service: the runtime is the ttRPC client.
pub const PLUGIN_SERVICE: ConnId = 1;
/// The runtime's service: the plugin is the ttRPC client.
pub const RUNTIME_SERVICE: ConnId = 2;

/// Header: connection id and payload length.
const HEADER_LEN: usize = 8;
/// The largest payload a frame may carry: a ttRPC message header and
/// ttRPC's largest message, as NRI's own multiplexer allows.
pub const MAX_PAYLOAD: usize = 10 + (4 << 20);
/// The duplex pipes' buffer: one frame's worth of what ttRPC writes at once.
const PIPE_BUFFER: usize = 256 << 10;

/// Splits `trunk` into the logical connections `ids`, returned in that
/// order, and a set of tasks that end when the trunk closes or fails (then
/// every logical connection reads end-of-file).
pub fn split<T>(trunk: T, ids: &[ConnId]) -> (Vec<DuplexStream>, JoinSet<std::io::Result<()>>)
where
    T: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut trunk_read, trunk_write) = tokio::io::split(trunk);
    let trunk_write = Arc::new(Mutex::new(trunk_write));
    let mut tasks = JoinSet::new();
    let mut ends = Vec::with_capacity(ids.len());
    let mut inbound = HashMap::new();
    for &id in ids {
        let (ours, theirs) = tokio::io::duplex(PIPE_BUFFER);
        ends.push(theirs);
        let (mut from_conn, to_conn) = tokio::io::split(ours);
        inbound.insert(id, to_conn);
        let trunk_write = trunk_write.clone();
        tasks.spawn(async move {
            let mut buf = vec![0u8; MAX_PAYLOAD.min(PIPE_BUFFER)];
            loop {
                let n = from_conn.read(&mut buf).await?;
                if n == 0 {
                    return Ok(());
                }
                let mut frame = Vec::with_capacity(HEADER_LEN + n);
                frame.extend_from_slice(&id.to_be_bytes());
                frame.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_be_bytes());
                frame.extend_from_slice(&buf[..n]);
                let mut w = trunk_write.lock().await;
                w.write_all(&frame).await?;
                w.flush().await?;
            }
        });
    }
    tasks.spawn(async move {
        let mut header = [0u8; HEADER_LEN];
        loop {
            if let Err(e) = trunk_read.read_exact(&mut header).await {
                return match e.kind() {
                    std::io::ErrorKind::UnexpectedEof => Ok(()),
                    _ => Err(e),
                };
            }
            let (id_bytes, len_bytes) = header.split_at(4);
            let id = u32::from_be_bytes(id_bytes.try_into().unwrap_or_default());
            let len = u32::from_be_bytes(len_bytes.try_into().unwrap_or_default()) as usize;
            if len > MAX_PAYLOAD {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("a frame of {len} bytes for connection {id}: more than the {MAX_PAYLOAD} NRI allows"),
                ));
            }
            let mut payload = vec![0u8; len];
            trunk_read.read_exact(&mut payload).await?;
            // A frame for a connection nobody opened is dropped, as NRI's
            // own multiplexer does.
            if let Some(conn) = inbound.get_mut(&id) {
                conn.write_all(&payload).await?;
            }
        }
    });
    (ends, tasks)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Frames written by a peer reach the connection they name, in order,
    /// and what a connection writes reaches the peer framed with its id.
    #[tokio::test]
    async fn frames_reach_their_connection_and_back() -> std::io::Result<()> {
        let (trunk, mut peer) = tokio::io::duplex(1 << 20);
        let (mut conns, _tasks) = split(trunk, &[PLUGIN_SERVICE, RUNTIME_SERVICE]);
        let mut runtime = conns
            .pop()
            .ok_or_else(|| std::io::Error::other("no conn"))?;
        let mut plugin = conns
            .pop()
            .ok_or_else(|| std::io::Error::other("no conn"))?;
        for (id, payload) in [
            (2u32, &b"to runtime"[..]),
            (1, b"to plugin"),
            (7, b"to nobody"),
            (1, b", again"),
        ] {
            peer.write_all(&id.to_be_bytes()).await?;
            peer.write_all(&(payload.len() as u32).to_be_bytes())
                .await?;
            peer.write_all(payload).await?;
        }
        let mut got = [0u8; 10];
        runtime.read_exact(&mut got).await?;
        assert_eq!(&got, b"to runtime");
        let mut got = [0u8; 16];
        plugin.read_exact(&mut got).await?;
        assert_eq!(&got, b"to plugin, again");

        plugin.write_all(b"answer").await?;
        let mut header = [0u8; 8];
        peer.read_exact(&mut header).await?;
        assert_eq!(header, [0, 0, 0, 1, 0, 0, 0, 6]);
        let mut body = [0u8; 6];
        peer.read_exact(&mut body).await?;
        assert_eq!(&body, b"answer");
        Ok(())
    }

    /// A frame longer than NRI allows ends the multiplexer with an error
    /// (the runtime is not what it claims); the connections read EOF.
    #[tokio::test]
    async fn an_oversized_frame_closes_every_connection() -> std::io::Result<()> {
        let (trunk, mut peer) = tokio::io::duplex(1 << 10);
        let (mut conns, mut tasks) = split(trunk, &[PLUGIN_SERVICE]);
        peer.write_all(&1u32.to_be_bytes()).await?;
        peer.write_all(&u32::MAX.to_be_bytes()).await?;
        let mut failed = false;
        while let Some(done) = tasks.join_next().await {
            if let Ok(Err(e)) = done {
                assert!(e.to_string().contains("more than"), "{e}");
                failed = true;
                tasks.abort_all();
            }
        }
        assert!(failed);
        let mut plugin = conns
            .pop()
            .ok_or_else(|| std::io::Error::other("no conn"))?;
        let mut rest = Vec::new();
        assert_eq!(plugin.read_to_end(&mut rest).await?, 0);
        Ok(())
    }
}
