//! A TCP relay: every connection accepted on a listener is copied both ways
//! to a target address. Nodes reach their shoot's API through it, and a
//! Kubernetes seed's shoot keeps its stable endpoint through it.

use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// How long a relayed connection waits for its target to accept.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Relays connections accepted on `listener` to `target` (`host:port`, looked
/// up per connection) until `stop`; a connection whose target does not answer
/// is closed. Open connections end with `stop` too.
pub async fn relay(listener: TcpListener, target: String, stop: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            a = listener.accept() => a,
        };
        let Ok((mut inbound, _)) = accepted else {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        };
        let (stop, target) = (stop.clone(), target.clone());
        tokio::spawn(async move {
            // a target that does not answer (a Service whose endpoints just
            // changed) must not hold the client until the kernel gives up
            let connect = TcpStream::connect(target.as_str());
            let Ok(Ok(mut outbound)) = tokio::time::timeout(CONNECT_TIMEOUT, connect).await else {
                return;
            };
            tokio::select! {
                biased;
                _ = stop.cancelled() => {}
                _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn bytes_go_both_ways_and_stop_ends_the_listener() {
        let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = upstream.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut s, _) = upstream.accept().await.unwrap();
            let mut buf = [0u8; 4];
            s.read_exact(&mut buf).await.unwrap();
            s.write_all(&buf.map(|b| b.to_ascii_uppercase()))
                .await
                .unwrap();
        });
        let front = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = front.local_addr().unwrap();
        let stop = CancellationToken::new();
        let task = tokio::spawn(relay(front, target, stop.clone()));
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"ring").await.unwrap();
        let mut back = [0u8; 4];
        c.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"RING");
        stop.cancel();
        task.await.unwrap();
        // the socket is closed when the relay returns; a child process that
        // other tests fork at that moment may hold a copy of it until its
        // exec (close-on-exec), so a connect is refused within a bound
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while TcpStream::connect(addr).await.is_ok() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the listener is closed once stopped"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
