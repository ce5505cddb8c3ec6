//! `ring-agent forward`: relays from a shoot's stable addresses to where its
//! control plane answers, run under the lease guard: a Kubernetes seed's
//! stable API address to its kube-apiserver Service (see
//! `seed::kubernetes::forwarder`), a local seed's promoted standby's shoot
//! address to its warm kube-apiserver and etcd (see `seed::local::warm`).

use std::net::SocketAddr;

use tokio_util::sync::CancellationToken;

use crate::RingError;

/// Listens on every address of `listen` and relays each connection to the
/// target of the same place in `to` (`host:port`) until `stop`. Every
/// address is bound before any connection is relayed: one that another
/// process holds fails the whole relay (the guard's supervisor starts it
/// again), and so does one relay ending before `stop` (the others stop
/// with it rather than leave an address unserved).
pub async fn run(
    listen: Vec<SocketAddr>,
    to: Vec<String>,
    stop: CancellationToken,
) -> Result<(), RingError> {
    if listen.len() != to.len() {
        return Err(RingError::Config {
            field: "ring-agent forward --to".into(),
            reason: format!(
                "{} --listen but {} --to; give one --to for each --listen, in the same order",
                listen.len(),
                to.len()
            ),
        });
    }
    let mut relays = tokio::task::JoinSet::new();
    let mut listeners = Vec::with_capacity(listen.len());
    for addr in &listen {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| RingError::Io {
                what: format!(
                    "listening on the shoot's stable endpoint {addr} (another process holds it: a control plane of this shoot elsewhere on this machine, or a relay that was not stopped)"
                ),
                source,
            })?;
        listeners.push(listener);
    }
    // one relay ending (before `stop`: it failed) ends them all
    let all = stop.child_token();
    for (listener, target) in listeners.into_iter().zip(to) {
        tracing::info!(listen = ?listener.local_addr().ok(), %target, "relaying the shoot's stable endpoint");
        relays.spawn(seed::forward::relay(listener, target, all.clone()));
    }
    let ended = relays.join_next().await;
    all.cancel();
    while relays.join_next().await.is_some() {}
    match ended {
        Some(Err(e)) if !e.is_cancelled() => Err(RingError::Io {
            what: "relaying the shoot's stable endpoint (a relay task failed; the guard starts the relay again)".into(),
            source: std::io::Error::other(e.to_string()),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn echo_port() -> SocketAddr {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut b = [0u8; 2];
                    if s.read_exact(&mut b).await.is_ok() {
                        let _ = s.write_all(&b).await;
                    }
                });
            }
        });
        addr
    }

    fn free_port() -> SocketAddr {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    }

    /// Each listening address leads to its own target.
    #[tokio::test]
    async fn every_pair_relays_to_its_own_target() {
        let targets = [echo_port().await, echo_port().await];
        let listen = vec![free_port(), free_port()];
        let stop = CancellationToken::new();
        let to = targets.iter().map(|t| t.to_string()).collect();
        let relay = tokio::spawn(run(listen.clone(), to, stop.clone()));
        for (i, addr) in listen.iter().enumerate() {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            let mut s = loop {
                match tokio::net::TcpStream::connect(addr).await {
                    Ok(s) => break s,
                    Err(e) if std::time::Instant::now() > deadline => {
                        panic!("relay never listened on {addr}: {e}")
                    }
                    Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
                }
            };
            let msg = [b'a' + i as u8, b'!'];
            s.write_all(&msg).await.unwrap();
            let mut got = [0u8; 2];
            s.read_exact(&mut got).await.unwrap();
            assert_eq!(got, msg, "through {addr}");
        }
        stop.cancel();
        relay.await.unwrap().unwrap();
    }

    /// Unpaired addresses and a taken address are refused with the reason.
    #[tokio::test]
    async fn unpaired_or_taken_addresses_are_refused() {
        let stop = CancellationToken::new();
        let e = run(vec![free_port()], vec![], stop.clone())
            .await
            .unwrap_err();
        assert!(e.to_string().contains("1 --listen but 0 --to"), "{e}");
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let taken = held.local_addr().unwrap();
        let e = run(
            vec![free_port(), taken],
            vec!["a:1".into(), "b:2".into()],
            stop,
        )
        .await
        .unwrap_err();
        assert!(e.to_string().contains(&taken.to_string()), "{e}");
    }
}
