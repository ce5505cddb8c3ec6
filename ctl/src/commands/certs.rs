//! `ringctl pki check`: when each certificate of the ring expires, as every
//! member reports its own and those of the control planes it hosts, plus the
//! files on this machine (ringctl's certificate, the shoots' kubeconfigs).

use std::time::Duration;

use ringd::certs::{CertificateStatus, RingCheck};

use crate::cli::RingArgs;
use crate::output::Format;

use super::{init_tracing, print};

/// How long one member may take to answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

pub async fn pki_check(args: RingArgs, format: Format) -> anyhow::Result<()> {
    init_tracing("warn");
    let (addresses, pki) = args.targets()?;
    let mut check = RingCheck::default();
    for address in &addresses {
        match ask(address, &pki).await {
            Ok(status) => check.add(&status.member, status.certificates),
            Err(why) => check
                .unreachable
                .push(format!("the member at {address} {why}")),
        }
    }
    check.add("ringctl", local_files(&args, &pki)?);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    print(&check, format, || check.render(now))?;
    let attention = check.warnings(now).len();
    if attention > 0 {
        anyhow::bail!("{attention} certificate warning(s): see above");
    }
    Ok(())
}

async fn ask(address: &str, pki: &std::path::Path) -> Result<ringd::status::RingStatus, String> {
    let mut client =
        ringd::client::AdminClient::connect(address, pki).map_err(|e| format!("failed: {e}"))?;
    match tokio::time::timeout(ASK_TIMEOUT, client.status()).await {
        Ok(Ok(status)) => Ok(status),
        Ok(Err(e)) => Err(format!("failed: {e}")),
        Err(_) => Err(format!("did not answer within {ASK_TIMEOUT:?}")),
    }
}

/// ringctl's own certificate and, for a local ring, every shoot's kubeconfig.
fn local_files(args: &RingArgs, pki: &std::path::Path) -> anyhow::Result<Vec<CertificateStatus>> {
    let files = ringd::identity::RingPki::new(pki).files(ringd::identity::ADMIN_NAME);
    let mut out = vec![status(
        "ringctl",
        "admin",
        &files.cert,
        seed::expiry::not_after_file(&files.cert),
    )];
    if let Some((layout, config)) = args.local_ring()? {
        for m in &config.members {
            let path = layout.kubeconfig(&m.name);
            if path.exists() {
                let read = seed::expiry::kubeconfig_client_not_after(&path);
                out.push(status(
                    &format!("shoot {}", m.name),
                    "kubeconfig",
                    &path,
                    read,
                ));
            }
        }
    }
    Ok(out)
}

fn status(
    owner: &str,
    name: &str,
    path: &std::path::Path,
    read: Result<i64, String>,
) -> CertificateStatus {
    let (not_after_unix, error) = match read {
        Ok(t) => (Some(t), None),
        Err(e) => (None, Some(e)),
    };
    CertificateStatus {
        owner: owner.into(),
        name: name.into(),
        source: path.display().to_string(),
        not_after_unix,
        error,
    }
}
