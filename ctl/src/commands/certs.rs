//! `ringctl pki check`: when each certificate of the ring expires, as every
//! member reports its own and those of the control planes it hosts, plus the
//! files on this machine (ringctl's certificate, the shoots' kubeconfigs and
//! nodes' client certificates); `pki renew` and `pki rotate-ca` change the
//! ring's own certificates online.

use std::time::Duration;

use ringd::certs::{now_unix, CertificateStatus, RingCheck};

use crate::cli::RingArgs;
use crate::output::Format;

use super::{init_tracing, print};

mod shoot_certs;

/// How long one member may take to answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

pub async fn pki_check(args: RingArgs, format: Format) -> anyhow::Result<()> {
    init_tracing("warn");
    let (addresses, pki) = args.targets()?;
    let mut check = RingCheck::default();
    for address in &addresses {
        match ask(address, &pki).await {
            Ok(status) => check.add(&status.member, status.certificates),
            Err(e) => check
                .unreachable
                .push(format!("the member at {address}: {e}")),
        }
    }
    check.add("ringctl", local_files(&args, &pki)?);
    let now = now_unix();
    print(&check, format, || check.render(now))?;
    let attention = check.warnings(now).len();
    if attention > 0 {
        anyhow::bail!("{attention} certificate warning(s): see above");
    }
    Ok(())
}

/// The status of the member at `address`, if it answers within [`ASK_TIMEOUT`].
async fn ask(
    address: &str,
    pki: &std::path::Path,
) -> Result<ringd::status::RingStatus, ringd::RingError> {
    ringd::client::AdminClient::status_within(address, pki, ASK_TIMEOUT).await
}

/// ringctl's own certificate and, for a local ring, every shoot's kubeconfig
/// and its nodes' client certificates.
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
        out.extend(node_files(&layout, &config));
    }
    Ok(out)
}

/// Each node's client certificates (kubelet, kube-proxy), from its shoot's
/// CA: the kubelet's is the one it renewed itself once it did (see
/// `seed::node::renewal`), else the one it was configured with.
fn node_files(
    layout: &bootstrap::RingLayout,
    config: &bootstrap::config::RingConfig,
) -> Vec<CertificateStatus> {
    let mut out = Vec::new();
    for node in bootstrap::nodes::node_names(config) {
        let Some(shoot) = bootstrap::nodes::shoot_of(config, &node) else {
            continue;
        };
        let dir = bootstrap::nodes::node_dir(layout, &node).join("pki");
        let renewed = bootstrap::nodes::node_config(layout, &node)
            .map(|c| c.layout().kubelet_client_current())
            .filter(|p| p.exists());
        let kubelet = renewed.unwrap_or_else(|| dir.join("node.crt"));
        for (path, name) in [
            (kubelet, "kubelet"),
            (dir.join("kube-proxy.crt"), "kube-proxy"),
        ] {
            if path.exists() {
                let read = seed::expiry::not_after_file(&path);
                let name = format!("node {node} {name}");
                out.push(status(&format!("shoot {shoot}"), &name, &path, read));
            }
        }
    }
    out
}

fn status(
    owner: &str,
    name: &str,
    path: &std::path::Path,
    read: Result<i64, String>,
) -> CertificateStatus {
    CertificateStatus::from(owner, name, path.display().to_string(), read)
}

/// How long a member may take to serve with its new certificate.
const TAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// One member's (or ringctl's) renewal.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct Renewed {
    name: String,
    /// `notAfter` before and after (unix seconds).
    old_not_after_unix: Option<i64>,
    new_not_after_unix: i64,
    /// The new certificate's serial (what its ringd reports once it uses it).
    #[serde(skip)]
    serial: String,
    /// The running ringd reports the new certificate as the one it uses.
    in_use: bool,
}

pub async fn pki_renew(args: crate::cli::PkiRenewArgs, format: Format) -> anyhow::Result<()> {
    init_tracing("warn");
    let (layout, config) = local_ring(&args.dir)?;
    let pki = ringd::identity::RingPki::new(layout.pki());
    // whether a certificate with `notAfter` `left` (if readable) is renewed
    let due_at = |left: Option<i64>| {
        args.all || left.is_none_or(|t| t - now_unix() < args.within_days * 86_400)
    };
    let due = |path: &std::path::Path| {
        let left = seed::expiry::not_after_file(path).ok();
        (left, due_at(left))
    };
    let mut renewed = Vec::new();
    let admin = pki.files(ringd::identity::ADMIN_NAME);
    if let (old, true) = due(&admin.cert) {
        let files = pki.renew_admin()?;
        renewed.push(fresh(ringd::identity::ADMIN_NAME, old, &files.cert, true)?);
    }
    for (i, m) in config.members.iter().enumerate() {
        if let (old, true) = due(&pki.files(&m.name).cert) {
            let files = pki.renew_member(&m.name, config.member_ip_addr(i)?)?;
            let mut r = fresh(&m.name, old, &files.cert, false)?;
            r.in_use = taken(&config.member_address(i), &layout.pki(), &m.name, &r.serial).await;
            renewed.push(r);
        }
    }
    let members = renewed.len();
    let mut problems = Vec::new();
    for (r, why_not) in shoot_certs::renew(&layout, &config, due_at, &mut problems).await? {
        problems.extend(why_not);
        renewed.push(r);
    }
    print(&renewed, format, || {
        render_renewed(&renewed, args.within_days)
    })?;
    let waiting: Vec<&str> = renewed[..members]
        .iter()
        .filter(|r| !r.in_use)
        .map(|r| r.name.as_str())
        .collect();
    if !waiting.is_empty() {
        problems.insert(0, format!(
            "{} did not report the new certificate within {TAKE_TIMEOUT:?}; a ringd that is down takes it when it starts (see `ringctl pki check`)",
            waiting.join(", ")
        ));
    }
    if !problems.is_empty() {
        anyhow::bail!("{}", problems.join("; "));
    }
    Ok(())
}

/// The local ring in `--ring-dir`, which must exist.
fn local_ring(
    dir: &crate::cli::RingDirArgs,
) -> anyhow::Result<(bootstrap::RingLayout, bootstrap::config::RingConfig)> {
    let layout = bootstrap::RingLayout { dir: dir.dir() };
    let config = layout.read_config()?.ok_or_else(|| {
        anyhow::anyhow!(
            "{} holds no ring; run `ringctl bootstrap` first",
            layout.dir.display()
        )
    })?;
    Ok((layout, config))
}

fn fresh(
    name: &str,
    old: Option<i64>,
    cert: &std::path::Path,
    in_use: bool,
) -> anyhow::Result<Renewed> {
    let pem = std::fs::read(cert)
        .map_err(|e| anyhow::anyhow!("reading the new certificate {}: {e}", cert.display()))?;
    let new = seed::expiry::infos_pem(&pem)
        .map_err(|e| anyhow::anyhow!("the new certificate {} {e}", cert.display()))?
        .remove(0); // infos_pem returns at least one
    Ok(Renewed {
        name: name.into(),
        old_not_after_unix: old,
        new_not_after_unix: new.not_after,
        serial: new.serial,
        in_use,
    })
}

/// Waits (bounded) until the member at `address` reports the certificate
/// with `serial` as the one it presents.
async fn taken(address: &str, pki: &std::path::Path, member: &str, serial: &str) -> bool {
    let deadline = tokio::time::Instant::now() + TAKE_TIMEOUT;
    while tokio::time::Instant::now() < deadline {
        if let Ok(status) = ask(address, pki).await {
            if in_use(&status, member).member_serial.as_deref() == Some(serial) {
                return true;
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    false
}

fn render_renewed(renewed: &[Renewed], within_days: i64) -> String {
    if renewed.is_empty() {
        return format!("no certificate expires within {within_days} days; nothing renewed (--all renews them anyway)\n");
    }
    let now = now_unix();
    let days = |t: i64| (t - now).div_euclid(86_400).to_string();
    let mut t =
        crate::output::table(&["CERTIFICATE", "DAYS LEFT BEFORE", "DAYS LEFT NOW", "IN USE"]);
    for r in renewed {
        t.add_row(vec![
            r.name.clone(),
            r.old_not_after_unix.map_or("unreadable".into(), days),
            days(r.new_not_after_unix),
            if r.in_use { "yes" } else { "NOT YET" }.into(),
        ]);
    }
    format!("{t}\n")
}

/// Carries out one file action of a CA change; says what it did.
fn perform(
    action: &ringd::ca_rotation::Action,
    pki: &ringd::identity::RingPki,
    config: &bootstrap::config::RingConfig,
    facts: &ringd::ca_rotation::PkiFacts,
) -> anyhow::Result<String> {
    use ringd::ca_rotation::Action;
    let ip_of = |name: &str| -> anyhow::Result<Option<std::net::IpAddr>> {
        match config.members.iter().position(|m| m.name == name) {
            Some(i) => Ok(Some(config.member_ip_addr(i)?)),
            None => Ok(None), // ringctl
        }
    };
    Ok(match action {
        Action::Repair(who) => {
            let next_trusted = facts
                .next
                .as_ref()
                .is_some_and(|n| facts.trusted.contains(n));
            for name in who {
                match (next_trusted, ip_of(name)?) {
                    (true, ip) => pki.reissue_from_next(name, ip)?,
                    (false, Some(ip)) => drop(pki.renew_member(name, ip)?),
                    (false, None) => drop(pki.renew_admin()?),
                }
            }
            format!(
                "issued again (key and certificate did not belong together): {}",
                who.join(", ")
            )
        }
        Action::CreateNext => {
            pki.create_next_ca()?;
            "created the next ring CA (ca-next.crt)".into()
        }
        Action::TrustBoth => {
            pki.trust_both()?;
            "ca.crt trusts the old and the next CA".into()
        }
        Action::Reissue(who) => {
            for name in who {
                pki.reissue_from_next(name, ip_of(name)?)?;
            }
            format!("issued from the next CA: {}", who.join(", "))
        }
        Action::Retire => {
            pki.retire()?;
            "the next CA is the ring CA; the old one is no longer trusted".into()
        }
        Action::Done => {
            pki.finish_rotation()?;
            "every member trusts only the new ring CA".into()
        }
        Action::WaitTrust(_) | Action::WaitInUse(_) | Action::WaitRetired(_) => String::new(),
    })
}

/// What a member reports using, for a CA change.
fn in_use(status: &ringd::status::RingStatus, member: &str) -> ringd::ca_rotation::InUse {
    let owner = format!("member {member}");
    let certs = &status.certificates;
    ringd::ca_rotation::InUse {
        trusted: certs
            .iter()
            .filter(|c| c.owner == "ring" && c.name == "ca")
            .filter_map(|c| c.serial.clone())
            .collect(),
        member_serial: certs
            .iter()
            .find(|c| c.owner == owner && c.name == "member")
            .and_then(|c| c.serial.clone()),
    }
}

pub async fn pki_rotate_ca(args: crate::cli::PkiRotateArgs, format: Format) -> anyhow::Result<()> {
    use ringd::ca_rotation::{next_action, Action};
    init_tracing("warn");
    let (layout, _) = local_ring(&args.dir)?;
    let pki = ringd::identity::RingPki::new(layout.pki());
    let started = tokio::time::Instant::now();
    let mut step_started = started;
    let timeout = Duration::from_secs(args.timeout);
    let mut steps: Vec<String> = Vec::new();
    loop {
        // read each round: a member that joined meanwhile is reissued too
        let (_, config) = local_ring(&args.dir)?;
        let names: Vec<String> = config.members.iter().map(|m| m.name.clone()).collect();
        let facts = pki.rotation_facts(&names)?;
        let mut reports = std::collections::BTreeMap::new();
        let mut errors = Vec::new();
        for (i, m) in names.iter().enumerate() {
            match ask(&config.member_address(i), &layout.pki()).await {
                Ok(s) => reports.insert(m.clone(), Some(in_use(&s, m))),
                Err(e) => {
                    errors.push(format!("{m}: {e}"));
                    reports.insert(m.clone(), None)
                }
            };
        }
        let action = next_action(&facts, &reports);
        let (members, what) = match &action {
            Action::WaitTrust(m) => (m, "trust the next CA"),
            Action::WaitInUse(m) => (m, "present its new certificate"),
            Action::WaitRetired(m) => (m, "trust only the new CA"),
            _ => {
                let done = perform(&action, &pki, &config, &facts)?;
                steps.push(format!("{:>5.1}s  {done}", started.elapsed().as_secs_f64()));
                step_started = tokio::time::Instant::now();
                if action == Action::Done {
                    break;
                }
                continue;
            }
        };
        if step_started.elapsed() > timeout {
            anyhow::bail!(
                "waited {timeout:?} for {} to {what} ({}); rerun `ringctl pki rotate-ca` to resume once they answer",
                members.join(", "),
                if errors.is_empty() { "they answer, but not yet with it".into() } else { errors.join("; ") }
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    print(&steps, format, || {
        steps.iter().map(|s| format!("{s}\n")).collect()
    })
}
