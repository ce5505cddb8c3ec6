//! `ringctl bench failover`'s figures as text: one table per ring, then the
//! rings side by side.

use super::{FailoverBench, ProtectionArg, SeedKind};

/// The figures as text.
pub fn render(b: &FailoverBench) -> String {
    let seeds = match b.seeds {
        SeedKind::Local => "local seeds",
        SeedKind::Kubernetes => "m1 on a Kubernetes seed (pods on a real node), m2 and m3 local",
        SeedKind::SelfHosted => "self-hosted: every control plane in pods on its predecessor's node; the whole machine killed",
    };
    let kill = match b.seeds {
        SeedKind::SelfHosted => "its host's whole machine",
        _ => "its seed's ringd",
    };
    let seeds = match b.protection {
        ProtectionArg::Backup => format!("{seeds}, restored from the bucket"),
        ProtectionArg::Standby => format!("{seeds}, hot standby promoted"),
    };
    // the goals: #16 for a killed machine, #18 per protection
    let goal = match (b.seeds, b.protection) {
        (SeedKind::SelfHosted, _) => 15,
        (_, ProtectionArg::Standby) => 5,
        (_, ProtectionArg::Backup) => 8,
    };
    let t = &b.timing;
    let mut out = format!(
        "failover ({seeds}) of a control plane with {} extra ConfigMaps, {} creates/s: kill -9 of {kill} -> first successful read\n\
         timing: heartbeat {} ms, election timeout {} ms, failure window {} ms, lease {} ms (margin {} ms)\n\
         median RTO {:.2} s, p95 {:.2} s over {} runs (goal <= {goal} s); RPO median {:.2} s, worst {:.2} s (goal <= 1 s)\n",
        b.objects,
        b.rate,
        t.heartbeat_ms,
        t.election_timeout_ms,
        t.failure_window_ms,
        t.lease_ms,
        t.lease_margin_ms,
        b.median_rto_secs,
        b.p95_rto_secs,
        b.runs.len(),
        b.median_rpo_secs,
        b.max_rpo_secs
    );
    out.push_str("  run  kill->target  seeds                    detected  lease-wait  restore  start+verify  first-read  done   lost/acked  lost-after  RPO\n");
    for (i, r) in b.runs.iter().enumerate() {
        out.push_str(&format!(
            "  {:<4} {:<13} {:<24} {:>7.1}s {:>10.1}s {:>7.1}s {:>12.1}s {:>10.1}s {:>5.1}s {:>5}/{:<6} {:>10} {:.2}s\n",
            i + 1,
            format!("{}->{}", r.killed, r.target),
            format!("{}->{}", r.killed_seed, r.target_seed),
            r.decided_secs,
            (r.restoring_secs - r.decided_secs).max(0.0),
            r.restore_secs,
            r.start_secs,
            r.first_read_secs,
            r.done_secs,
            r.writes_lost,
            r.writes_acked,
            r.writes_lost_after_kill,
            r.rpo_secs
        ));
    }
    out.push_str("  (detected: the leader committed the failover; lease-wait: until the old lease ended; restore/start: as the target measured them;\n   lost-after: writes acknowledged after the kill that the end lacks)\n");
    out
}

/// Several seed kinds' figures, then side by side.
pub fn render_all(all: &[FailoverBench]) -> String {
    let mut out: String = all.iter().map(render).collect::<Vec<_>>().join("\n");
    if all.len() > 1 {
        out.push_str("\nside by side:         median RTO    p95 RTO   median RPO   worst RPO   lost (before/after kill)\n");
        for b in all {
            let before: usize = b.runs.iter().map(|r| r.writes_lost).sum();
            let after: usize = b.runs.iter().map(|r| r.writes_lost_after_kill).sum();
            out.push_str(&format!(
                "  {:<18} {:>10.2}s {:>9.2}s {:>11.2}s {:>10.2}s   {before}/{after}\n",
                format!("{:?}/{:?}", b.seeds, b.protection).to_lowercase(),
                b.median_rto_secs,
                b.p95_rto_secs,
                b.median_rpo_secs,
                b.max_rpo_secs
            ));
        }
    }
    out
}
