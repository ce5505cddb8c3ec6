//! The ring's life: `ringctl bootstrap`, `status`, `join`, `leave`, `migrate`,
//! `down`, `restore --from-bucket` and `pki init`.

use std::time::Duration;

use crate::cli::{
    BootstrapArgs, DescribeOperationArgs, DownArgs, JoinArgs, LeaveArgs, MigrateArgs, PkiInitArgs,
    RestoreArgs, RingArgs, StatusView,
};
use crate::output::Format;
use crate::progress::TerminalProgress;

use super::{init_tracing, print, read_ring_config, ringd_exe};

pub async fn bootstrap(args: BootstrapArgs, format: Format) -> anyhow::Result<()> {
    init_tracing("warn");
    let config = read_ring_config(args.config.as_deref())?;
    let opts = bootstrap::BootstrapOptions {
        config,
        dir: args.dir.dir(),
        ringd: ringd_exe()?,
        timeout: Duration::from_secs(args.timeout),
        generate_bucket_key: !args.no_bucket_key,
    };
    let report = {
        let progress = TerminalProgress::default();
        bootstrap::bootstrap(&opts, &progress).await?
    };
    print(&report, format, || render_bootstrap(&report))
}

/// What `ringctl bootstrap` did, the ring's status and how to use it.
fn render_bootstrap(report: &bootstrap::BootstrapReport) -> String {
    let mut out = if report.changed {
        format!("ring {} is up ({:.1}s)\n\n", report.ring, report.total_secs)
    } else {
        format!("ring {} was already up; nothing to do\n\n", report.ring)
    };
    out.push_str(&ringd::status::render(&report.status));
    out.push_str(&bootstrap::nodes::render(&report.nodes));
    out.push_str("\nkubeconfigs:\n");
    for (shoot, path) in &report.kubeconfigs {
        out.push_str(&format!(
            "  {shoot}: kubectl --kubeconfig {} get namespaces\n",
            path.display()
        ));
    }
    if let Some(key) = &report.bucket_key {
        out.push('\n');
        out.push_str(&ringd::status::wrap(
            &format!(
                "bucket key: {} seals every backup; keep a copy off this machine: restoring the ring from its bucket needs it (ringctl restore --from-bucket URL --bucket-key COPY)",
                key.display()
            ),
            2,
        ));
    }
    out.push_str(&format!(
        "\nstatus: ringctl status --ring-dir {dir}\nstop:   ringctl down --ring-dir {dir}\n",
        dir = report.state_dir.display()
    ));
    out
}

/// `ringctl down`: stops the nodes and members, says how each ended, and
/// fails if any is still running after SIGKILL.
pub async fn down(args: DownArgs, format: Format) -> anyhow::Result<()> {
    init_tracing("warn");
    let dir = args.dir.dir();
    let report = bootstrap::down(&dir, Duration::from_secs(args.grace)).await?;
    print(&report, format, || render_down(&report, &dir, args.grace))?;
    let left: Vec<String> = report
        .left_running()
        .iter()
        .map(|s| format!("{} (pid {})", s.name, s.pid))
        .collect();
    if !left.is_empty() {
        anyhow::bail!(
            "still running after SIGKILL: {}; see `ps -o pid,stat,wchan -p PID` (a process stuck in the kernel, e.g. on a hung mount)",
            left.join(", ")
        );
    }
    Ok(())
}

fn render_down(report: &bootstrap::DownReport, dir: &std::path::Path, grace: u64) -> String {
    use bootstrap::StopOutcome;
    if report.members.is_empty() {
        return "no member was running\n".into();
    }
    let gone: Vec<&str> = report
        .members
        .iter()
        .filter(|s| s.outcome != StopOutcome::StillRunning)
        .map(|s| s.name.as_str())
        .collect();
    let mut out = format!(
        "stopped {}; data kept in {}\n",
        gone.join(", "),
        dir.display()
    );
    for s in report.nodes.iter().chain(&report.members) {
        match s.outcome {
            StopOutcome::Exited => {}
            StopOutcome::Killed => {
                out += &format!(
                    "{} (pid {}) did not exit within {grace} s of SIGTERM: killed\n",
                    s.name, s.pid
                )
            }
            StopOutcome::StillRunning => {
                out += &format!(
                    "{} (pid {}) is still running after SIGKILL\n",
                    s.name, s.pid
                )
            }
        }
    }
    out
}

pub async fn status(args: RingArgs, format: Format) -> anyhow::Result<()> {
    init_tracing("warn");
    let status = args.status().await?;
    let nodes = args.local_nodes()?;
    let control_planes = args.local_hosting(&status)?;
    let view = StatusView {
        status,
        nodes,
        control_planes,
    };
    print(&view, format, || {
        let versions = match view.nodes.is_empty() {
            true => String::new(),
            false => bootstrap::nodes::render_versions(&view.nodes),
        };
        ringd::status::render(&view.status)
            + &bootstrap::selfhost::render_hosting(&view.control_planes)
            + &bootstrap::nodes::render(&view.nodes)
            + &versions
    })
}

/// `ringctl describe operation N`: the operation as the ring's leader (or
/// the first member that answers) records it.
pub async fn describe_operation(args: DescribeOperationArgs, format: Format) -> anyhow::Result<()> {
    init_tracing("warn");
    let status = args.ring.status().await?;
    let Some(op) = status.operations.iter().find(|o| o.id == args.id) else {
        let known: Vec<String> = status.operations.iter().map(|o| o.id.to_string()).collect();
        anyhow::bail!(
            "the ring has no operation {}; it knows {} (the OP column of `ringctl status`)",
            args.id,
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        );
    };
    print(op, format, || {
        ringd::describe::render_operation(op, ringd::now_ms())
    })
}

pub async fn pki_init(args: PkiInitArgs) -> anyhow::Result<()> {
    init_tracing("warn");
    let pki = ringd::identity::RingPki::new(&args.dir);
    pki.ensure_ca()?;
    let mut issued = vec![pki.ensure_admin()?];
    for (name, ip) in &args.members {
        issued.push(pki.ensure_member(name, *ip)?);
    }
    for f in issued {
        println!("{}", f.cert.display());
    }
    Ok(())
}

/// `ringctl join`: a member run elsewhere (`--member-address`), or a new member
/// of the local ring, created and started here.
pub async fn join(args: JoinArgs, format: Format) -> anyhow::Result<()> {
    init_tracing("warn");
    match (&args.member_address, &args.ring.address) {
        (Some(member_address), _) => {
            let mut client = args.ring.leader().await?;
            println!("{}", client.add_member(&args.name, member_address).await?.0);
            Ok(())
        }
        (None, None) => {
            let ringd = ringd_exe()?;
            let dir = args.ring.dir.dir();
            let timeout = Duration::from_secs(args.timeout);
            let status = bootstrap::join(&dir, &args.name, &ringd, timeout).await?;
            print(&status, format, || {
                let kc = bootstrap::RingLayout { dir: dir.clone() }.kubeconfig(&args.name);
                format!(
                    "{} joined\n\n{}\nkubeconfig: kubectl --kubeconfig {} get namespaces\n",
                    args.name,
                    ringd::status::render(&status),
                    kc.display()
                )
            })
        }
        (None, Some(_)) => anyhow::bail!(
            "--address names a remote ring: give the new member's --member-address too"
        ),
    }
}

pub async fn migrate(args: MigrateArgs, format: Format) -> anyhow::Result<()> {
    init_tracing("warn");
    let mut client = args.ring.leader().await?;
    let id = client.migrate(&args.shoot, &args.to).await?;
    eprintln!("migration {id}: {} to {}", args.shoot, args.to);
    let op = client
        .wait_operation(id, Duration::from_secs(args.timeout), |op, t| {
            eprintln!("  {:>6.1}s  {:?}: {}", t.as_secs_f64(), op.step, op.detail)
        })
        .await?;
    if op.step == ringd::state::OperationStep::Failed {
        anyhow::bail!("migration {id} failed: {}", op.detail);
    }
    print(&op, format, || {
        format!("{} now runs on {}: {}\n", args.shoot, args.to, op.detail)
    })
}

pub async fn leave(args: LeaveArgs, format: Format) -> anyhow::Result<()> {
    init_tracing("warn");
    if args.ring.address.is_none() {
        let status = bootstrap::leave(&args.ring.dir.dir(), &args.name).await?;
        return print(&status, format, || {
            format!("{} left\n\n{}", args.name, ringd::status::render(&status))
        });
    }
    let mut client = args.ring.leader().await?;
    println!("{}", client.remove_member(&args.name).await?);
    Ok(())
}

/// `ringctl restore --from-bucket`: a lost local ring rebuilt from its bucket.
pub async fn restore(args: RestoreArgs, format: Format) -> anyhow::Result<()> {
    init_tracing("warn");
    let config = read_ring_config(args.config.as_deref())?;
    let opts = bootstrap::restore::RestoreOptions {
        config,
        bucket_url: args.from_bucket,
        dir: args.dir.dir(),
        ringd: ringd_exe()?,
        timeout: Duration::from_secs(args.timeout),
        bucket_key: args.bucket_key,
    };
    let report = {
        let progress = TerminalProgress::default();
        bootstrap::restore::restore(&opts, &progress).await?
    };
    print(&report, format, || bootstrap::restore::render(&report))
}
