//! Where a redirected connection was going: the lookup the relay's accept loop makes for
//! each connection, behind a port so tests (and the benchmark) name the destination
//! themselves.

use std::io;
use std::net::SocketAddr;

use tokio::net::TcpStream;

/// The destination the sandbox dialed before the host redirected it to the relay.
pub trait OriginalDestination: Send + Sync {
    /// The `(ip, port)` the client connected to.
    fn original_destination(&self, stream: &TcpStream) -> io::Result<SocketAddr>;
}

/// Every connection had this destination (tests, benchmarks, a relay in front of one
/// service).
#[derive(Debug, Clone, Copy)]
pub struct FixedDestination(pub SocketAddr);

impl OriginalDestination for FixedDestination {
    fn original_destination(&self, _: &TcpStream) -> io::Result<SocketAddr> {
        Ok(self.0)
    }
}

/// The address the client dialed is the listener's own: the socket's local address. Right
/// for a listener bound to a wildcard address inside the sandbox's namespace (the linux
/// backend's plumbing), where `getsockname` of an accepted connection is the address and
/// port the sandbox connected to.
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalAddress;

impl OriginalDestination for LocalAddress {
    fn original_destination(&self, stream: &TcpStream) -> io::Result<SocketAddr> {
        stream.local_addr()
    }
}

/// Netfilter's record of the destination before a `redirect`/`dnat` rule rewrote it
/// (`SO_ORIGINAL_DST`, or `IP6T_SO_ORIGINAL_DST` on an IPv6 socket).
#[derive(Debug, Clone, Copy, Default)]
pub struct SoOriginalDst;

#[cfg(target_os = "linux")]
impl OriginalDestination for SoOriginalDst {
    fn original_destination(&self, stream: &TcpStream) -> io::Result<SocketAddr> {
        use rustix::net::sockopt::{ip_original_dst, ipv6_original_dst};
        Ok(match stream.local_addr()?.is_ipv4() {
            true => SocketAddr::V4(ip_original_dst(stream)?),
            false => SocketAddr::V6(ipv6_original_dst(stream)?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a netfilter redirect there is nothing to find, or (with conntrack loaded) the
    /// destination is the socket's own address; either way the lookup does not panic.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn so_original_dst_without_a_redirect_is_the_local_address_or_an_error() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let _client = TcpStream::connect(addr).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        match SoOriginalDst.original_destination(&server) {
            Ok(found) => assert_eq!(found, addr),
            Err(e) => eprintln!("no SO_ORIGINAL_DST without a redirect: {e}"),
        }
    }
}
