//! A TCP relay: every connection accepted on a listener is copied both ways
//! to a target address. Nodes reach their shoot's API through it, a
//! Kubernetes seed's shoot keeps its stable endpoint through it, and a local
//! seed's promoted standby serves the shoot's address from its warm
//! kube-apiserver through it.

use std::path::Path;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::local::ShootLayout;
use crate::process::{Component, ComponentSpec};
use crate::ControlPlaneSpec;

/// The relay's command: `ring-agent forward` from the shoot's API address
/// to `target`, under the guard of the lease file of `layout`.
pub fn relay_spec(
    agent: &Path,
    layout: &ShootLayout,
    spec: &ControlPlaneSpec,
    target: &str,
) -> ComponentSpec {
    let listen = std::net::SocketAddr::new(spec.endpoint.address.into(), spec.endpoint.api_port);
    let pairs = [(listen, target.to_string())];
    relays_spec(agent, layout, Component::ApiForwarder, &pairs)
}

/// The command of `component`, one `ring-agent forward` relaying each
/// address of `pairs` to its target, under the guard of the lease file of
/// `layout`.
pub fn relays_spec(
    agent: &Path,
    layout: &ShootLayout,
    component: Component,
    pairs: &[(std::net::SocketAddr, String)],
) -> ComponentSpec {
    let mut args = vec!["forward".to_string()];
    for (listen, to) in pairs {
        args.extend([
            "--listen".into(),
            listen.to_string(),
            "--to".into(),
            to.clone(),
        ]);
    }
    let forward = ComponentSpec {
        component,
        program: agent.to_path_buf(),
        args,
        log: layout.log(component),
        netns: None,
    };
    crate::lease_file::guarded(agent, &crate::lease_file::path(layout), forward, None)
}

/// How long one connect to the target may take (a Service whose endpoints
/// just changed may drop the connect instead of refusing it).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a connection accepted while its target refuses is held, trying
/// again, before it is closed. A shoot's API is away for 10-20 s while its
/// control plane moves; a client refused at once backs off (client-go's
/// reflector doubles 0.8 s up to 30 s) and comes back up to half a minute
/// after the API did. Held, the client's request goes through as soon as the
/// API is back. Below client-go's TLS handshake timeout (10 s), so a client
/// sees an end of stream rather than timing out itself.
const HOLD: Duration = Duration::from_secs(8);

/// Pause between two connects to a target that refused.
const RETRY: Duration = Duration::from_millis(100);

/// Relays connections accepted on `listener` to `target` (`host:port`, looked
/// up per connection) until `stop`; a connection whose target refuses is held
/// for up to [`HOLD`] while the relay tries again, then closed. Open
/// connections end with `stop` too.
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
            let connect = connect_within(&target, HOLD);
            let mut outbound = tokio::select! {
                biased;
                _ = stop.cancelled() => return,
                c = connect => match c {
                    Some(c) => c,
                    None => return,
                },
            };
            tokio::select! {
                biased;
                _ = stop.cancelled() => {}
                _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
            }
        });
    }
}

/// Connects to `target`, trying again while it refuses or does not answer,
/// until `hold` has passed; `None` then.
async fn connect_within(target: &str, hold: Duration) -> Option<TcpStream> {
    let deadline = tokio::time::Instant::now() + hold;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        // a target that does not answer (a Service whose endpoints just
        // changed) must not hold the client until the kernel gives up
        let connect = TcpStream::connect(target);
        if let Ok(Ok(c)) = tokio::time::timeout(CONNECT_TIMEOUT.min(left), connect).await {
            return Some(c);
        }
        if tokio::time::Instant::now() + RETRY >= deadline {
            return None;
        }
        tokio::time::sleep(RETRY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Answers one connection on `upstream`: reads four bytes and sends them
    /// back in upper case.
    async fn shout_once(upstream: TcpListener) {
        let (mut s, _) = upstream.accept().await.unwrap();
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).await.unwrap();
        s.write_all(&buf.map(|b| b.to_ascii_uppercase()))
            .await
            .unwrap();
    }

    /// A client that connects while the shoot's API is away (its control plane
    /// moving) is held and relayed once the API listens again, instead of
    /// being refused and backing off.
    #[tokio::test]
    async fn a_connection_made_while_the_target_is_away_goes_through_when_it_is_back() {
        let away = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let target = away.local_addr().unwrap();
        drop(away);
        let front = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = front.local_addr().unwrap();
        let stop = CancellationToken::new();
        let task = tokio::spawn(relay(front, target.to_string(), stop.clone()));
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"ring").await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let upstream = TcpListener::bind(target).await.unwrap();
        tokio::spawn(shout_once(upstream));
        let mut back = [0u8; 4];
        tokio::time::timeout(HOLD, c.read_exact(&mut back))
            .await
            .expect("the held connection is relayed within the hold")
            .expect("the relay keeps the connection open while its target is away");
        assert_eq!(&back, b"RING");
        stop.cancel();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn a_target_that_stays_away_is_given_up_after_the_hold() {
        let away = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let target = away.local_addr().unwrap().to_string();
        drop(away);
        let started = std::time::Instant::now();
        let hold = Duration::from_millis(500);
        let c = tokio::time::timeout(Duration::from_secs(5), connect_within(&target, hold))
            .await
            .expect("connect_within ends by itself");
        assert!(c.is_none(), "nothing listens on {target}");
        assert!(
            started.elapsed() >= Duration::from_millis(400),
            "it tried again for the hold"
        );
    }

    #[tokio::test]
    async fn bytes_go_both_ways_and_stop_ends_the_listener() {
        let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = upstream.local_addr().unwrap().to_string();
        tokio::spawn(shout_once(upstream));
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
