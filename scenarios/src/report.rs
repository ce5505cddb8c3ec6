//! Rendering a run's result: a one-screen text summary for the terminal and a
//! self-contained HTML report with an SVG timeline. Pure functions.

use crate::result::{EventKind, RunResult};

fn secs(v: Option<f64>) -> String {
    v.map_or("never".into(), |s| format!("{s:.1}s"))
}

/// `s` cut to at most `n` bytes (at a character boundary), with an ellipsis.
fn short(s: &str, n: usize) -> String {
    if s.len() <= n {
        return s.to_string();
    }
    let mut cut = n;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…", &s[..cut])
}

/// What the ring's failovers said clients lost at least ("-": none said).
fn may_lose(s: &crate::result::ShootFigures) -> String {
    s.ring_may_lose_revisions
        .map_or("-".into(), |n| format!(">={n} rev"))
}

/// One line per event worth reading on a terminal (faults, leaders, operation steps).
fn event_line(kind: &EventKind) -> Option<String> {
    Some(match kind {
        EventKind::Fault { action, detail, .. } => format!("fault {action}: {detail}"),
        EventKind::Leader { leader } => {
            format!("leader {}", leader.as_deref().unwrap_or("(none)"))
        }
        EventKind::Operation {
            id,
            kind,
            shoot,
            from,
            to,
            step,
            detail,
            ..
        } => {
            format!(
                "{kind} {id} of {shoot} {from}->{to}: {step} {}",
                short(detail, 90)
            )
        }
        EventKind::Loss {
            shoot,
            durable_revision,
            durable_age_secs,
        } => format!(
            "lost {shoot}'s control plane; bucket durable up to revision {} ({} old)",
            durable_revision.map_or("-".into(), |r| r.to_string()),
            secs(*durable_age_secs)
        ),
        EventKind::Log { member, line } => format!("{member} logged: {}", short(line, 110)),
        EventKind::Serving { .. } => return None,
    })
}

/// The terminal summary of one run.
pub fn summary(r: &RunResult) -> String {
    let build = r
        .build
        .as_deref()
        .map_or(String::new(), |b| format!(", build {b}"));
    let mut out = format!(
        "drill {} run {} (seed {}{build}): {} in {:.1}s (ring bootstrap {:.1}s)\n",
        r.drill,
        r.run,
        r.seed,
        if r.passed { "PASS" } else { "FAIL" },
        r.duration_secs,
        r.setup_secs
    );
    out.push_str(&format!(
        "  ring {} | bucket {} | isolation: {}\n",
        r.members.join(" "),
        r.bucket,
        r.isolation
    ));
    let lines: Vec<String> = r
        .events
        .iter()
        .filter_map(|e| event_line(&e.kind).map(|l| format!("  {:>7.1}s  {l}", e.t)))
        .collect();
    const MAX: usize = 14;
    if lines.len() > MAX {
        out.push_str(&lines[..MAX / 2].join("\n"));
        out.push_str(&format!(
            "\n           … {} more events …\n",
            lines.len() - MAX
        ));
        out.push_str(&lines[lines.len() - MAX / 2..].join("\n"));
    } else {
        out.push_str(&lines.join("\n"));
    }
    out.push('\n');
    out.push_str(&format!(
        "  {:<8} {:>7} {:>8} {:>7} {:>7} {:>5} {:>13} {:>14} {:>10}\n",
        "SHOOT", "RTO", "OUTAGES", "ACKED", "FAILED", "LOST", "LOST>DURABLE", "RPO", "RING SAID"
    ));
    for s in &r.shoots {
        let rpo = match (s.rpo_revisions, s.rpo_secs) {
            (Some(rev), Some(t)) => format!("{rev} rev/{t:.1}s"),
            (Some(rev), None) => format!("{rev} rev"),
            _ => "-".into(),
        };
        out.push_str(&format!(
            "  {:<8} {:>7} {:>8} {:>7} {:>7} {:>5} {:>13} {:>14} {:>10}\n",
            s.shoot,
            secs(s.rto_secs),
            s.outages.len(),
            s.acked_writes,
            s.failed_writes,
            s.lost_writes,
            s.lost_beyond_durable,
            rpo,
            may_lose(s)
        ));
    }
    out.push_str(&format!(
        "  double serving: {} | converged: {}\n",
        if r.double_serving.is_empty() {
            "never".to_string()
        } else {
            format!("{} times", r.double_serving.len())
        },
        r.converged_secs
            .map_or("no".into(), |t| format!("{t:.1}s after the last fault"))
    ));
    for f in &r.failures {
        out.push_str(&format!("  FAILED: {f}\n"));
    }
    out
}

/// Escapes text for HTML.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

const COLORS: [&str; 7] = [
    "#4e79a7", "#f28e2b", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
];

fn color(members: &[String], m: &str) -> &'static str {
    members
        .iter()
        .position(|x| x == m)
        .map_or("#999", |i| COLORS[i % COLORS.len()])
}

/// The SVG timeline: a lane per shoot (API available / down, which member runs
/// its control plane, operation steps), a lane of Raft leaders, and every fault.
pub fn timeline_svg(r: &RunResult) -> String {
    let (left, width, lane) = (110.0, 1000.0, 34.0);
    let end = r
        .duration_secs
        .max(r.events.iter().map(|e| e.t).fold(0.0, f64::max))
        .max(1.0);
    let x = |t: f64| left + (t.max(0.0) / end) * (width - left - 10.0);
    let lanes = r.shoots.len() + 1;
    let top = 40.0;
    let height = top + lanes as f64 * lane + 40.0;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"11\">\n"
    );
    // time axis
    let step = [1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0]
        .into_iter()
        .find(|st| end / st <= 12.0)
        .unwrap_or(600.0);
    let mut t = 0.0;
    while t <= end {
        let xt = x(t);
        s.push_str(&format!(
            "<line x1=\"{xt:.1}\" y1=\"{top}\" x2=\"{xt:.1}\" y2=\"{:.1}\" stroke=\"#eee\"/><text x=\"{xt:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#666\">{t:.0}s</text>\n",
            height - 25.0,
            height - 12.0
        ));
        t += step;
    }
    for (i, sh) in r.shoots.iter().enumerate() {
        let y = top + i as f64 * lane;
        s.push_str(&format!(
            "<text x=\"4\" y=\"{:.1}\">shoot {}</text>\n",
            y + 14.0,
            esc(&sh.shoot)
        ));
        for (a, b) in &sh.available {
            s.push_str(&format!(
                "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"10\" fill=\"#59a14f\"><title>{} API available {a:.1}s–{b:.1}s</title></rect>\n",
                x(*a), y + 4.0, (x(*b) - x(*a)).max(1.0), esc(&sh.shoot)
            ));
        }
        for (a, b) in &sh.outages {
            s.push_str(&format!(
                "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"10\" fill=\"#e15759\"><title>{} API down {a:.1}s–{b:.1}s ({:.1}s)</title></rect>\n",
                x(*a), y + 4.0, (x(*b) - x(*a)).max(1.0), esc(&sh.shoot), b - a
            ));
        }
        // which member runs its control plane
        let serving: Vec<(f64, Vec<String>)> = r
            .events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::Serving { shoot, members } if *shoot == sh.shoot => {
                    Some((e.t, members.clone()))
                }
                _ => None,
            })
            .collect();
        for (k, (t0, members)) in serving.iter().enumerate() {
            let t1 = serving.get(k + 1).map_or(end, |(t, _)| *t);
            for (j, m) in members.iter().enumerate() {
                s.push_str(&format!(
                    "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"6\" fill=\"{}\"><title>{} runs on {} {t0:.1}s–{t1:.1}s</title></rect>\n",
                    x(*t0), y + 16.0 + j as f64 * 7.0, (x(t1) - x(*t0)).max(1.0), color(&r.members, m), esc(&sh.shoot), esc(m)
                ));
            }
            if let Some(m) = members.first() {
                s.push_str(&format!(
                    "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"9\" fill=\"#333\">{}</text>\n",
                    x(*t0) + 2.0,
                    y + 31.0,
                    esc(m)
                ));
            }
        }
        for e in &r.events {
            if let EventKind::Operation {
                id,
                kind,
                shoot,
                from,
                to,
                step,
                detail,
                ..
            } = &e.kind
            {
                if *shoot != sh.shoot {
                    continue;
                }
                let (xe, ye) = (x(e.t), y + 9.0);
                s.push_str(&format!(
                    "<path d=\"M{xe:.1} {:.1} L{:.1} {ye:.1} L{xe:.1} {:.1} L{:.1} {ye:.1} Z\" fill=\"#222\"><title>{:.1}s {kind} {id} {from}→{to}: {step} {}</title></path>\n",
                    ye - 5.0, xe + 4.0, ye + 5.0, xe - 4.0, e.t, esc(detail)
                ));
            }
        }
    }
    // leaders
    let y = top + r.shoots.len() as f64 * lane;
    s.push_str(&format!(
        "<text x=\"4\" y=\"{:.1}\">Raft leader</text>\n",
        y + 14.0
    ));
    let leaders: Vec<(f64, Option<String>)> = r
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Leader { leader } => Some((e.t, leader.clone())),
            _ => None,
        })
        .collect();
    for (k, (t0, l)) in leaders.iter().enumerate() {
        let t1 = leaders.get(k + 1).map_or(end, |(t, _)| *t);
        let name = l.as_deref().unwrap_or("none");
        s.push_str(&format!(
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"12\" fill=\"{}\"><title>leader {} {t0:.1}s–{t1:.1}s</title></rect><text x=\"{:.1}\" y=\"{:.1}\" fill=\"#fff\" font-size=\"9\">{}</text>\n",
            x(*t0), y + 4.0, (x(t1) - x(*t0)).max(1.0), color(&r.members, name), esc(name), x(*t0) + 2.0, y + 13.0, esc(name)
        ));
    }
    // faults across every lane (labels on two rows, so close faults stay legible)
    let faults = r.events.iter().filter_map(|e| match &e.kind {
        EventKind::Fault { action, detail, .. } => Some((e, action, detail)),
        _ => None,
    });
    for (k, (e, action, detail)) in faults.enumerate() {
        let xe = x(e.t);
        s.push_str(&format!(
                "<line x1=\"{xe:.1}\" y1=\"{:.1}\" x2=\"{xe:.1}\" y2=\"{:.1}\" stroke=\"#d62728\" stroke-width=\"2\" stroke-dasharray=\"4 2\"><title>{:.1}s {} {}</title></line><text x=\"{:.1}\" y=\"{:.1}\" fill=\"#d62728\">⚡ {}</text>\n",
                top - 14.0 - (k % 2) as f64 * 12.0, height - 25.0, e.t, esc(action), esc(detail), xe + 2.0, top - 18.0 - (k % 2) as f64 * 12.0, esc(action)
            ));
    }
    s.push_str("</svg>\n");
    s
}

/// The self-contained HTML report of one run.
pub fn html(r: &RunResult) -> String {
    let mut h = format!(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>drill {name} run {run}: {verdict}</title>\n<style>body{{font-family:sans-serif;margin:20px;}} table{{border-collapse:collapse;}} td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right;}} td:first-child,th:first-child{{text-align:left;}} .pass{{color:#2a7d2a}} .fail{{color:#c00}} pre{{background:#f6f6f6;padding:8px;}}</style></head><body>\n<h1>drill {name} — run {run} — <span class=\"{cls}\">{verdict}</span></h1>\n<p>seed {seed} (replay: <code>ringctl drill run scenarios/drills/{name}.yaml --seed {seed}</code>); ring {members}; bucket {bucket}; isolation: {iso}; ring bootstrap {setup:.1}s; drill {dur:.1}s.</p>\n",
        name = esc(&r.drill),
        run = r.run,
        verdict = if r.passed { "PASS" } else { "FAIL" },
        cls = if r.passed { "pass" } else { "fail" },
        seed = r.seed,
        members = esc(&r.members.join(", ")),
        bucket = esc(&r.bucket),
        iso = esc(&r.isolation),
        setup = r.setup_secs,
        dur = r.duration_secs,
    );
    if !r.failures.is_empty() {
        h.push_str("<h2 class=\"fail\">Failures</h2><ul>\n");
        for f in &r.failures {
            h.push_str(&format!("<li>{}</li>\n", esc(f)));
        }
        h.push_str("</ul>\n");
    }
    h.push_str("<h2>Timeline</h2>\n<p>Per shoot: green = API answered, red = it did not; the thin bars show which member ran its control plane (two bars at once = double serving); ◆ = a failover or migration step (hover for details). Dashed red lines are faults.</p>\n");
    h.push_str(&timeline_svg(r));
    h.push_str("<h2>Figures</h2>\n<table><tr><th>shoot</th><th>RTO</th><th>outages</th><th>acknowledged writes</th><th>failed writes</th><th>lost (had to survive)</th><th>lost (newer than durable)</th><th>RPO (revisions)</th><th>RPO (age of newest durable delta)</th><th>lost as the ring heard it (at least)</th></tr>\n");
    for s in &r.shoots {
        h.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
            esc(&s.shoot),
            secs(s.rto_secs),
            s.outages.len(),
            s.acked_writes,
            s.failed_writes,
            s.lost_writes,
            s.lost_beyond_durable,
            s.rpo_revisions.map_or("-".into(), |v| v.to_string()),
            s.rpo_secs.map_or("-".into(), |v| format!("{v:.1}s")),
            esc(&may_lose(s)),
        ));
    }
    h.push_str("</table>\n");
    h.push_str(&format!(
        "<p>Double serving: {}. Converged: {}.</p>\n",
        if r.double_serving.is_empty() {
            "never (checked every 200 ms on every seed)".to_string()
        } else {
            r.double_serving
                .iter()
                .map(|d| format!("{} on {} at {:.1}s", d.shoot, d.members.join("+"), d.t))
                .collect::<Vec<_>>()
                .join("; ")
        },
        r.converged_secs
            .map_or("no".into(), |t| format!("{t:.1}s after the last fault"))
    ));
    h.push_str("<h2>Events</h2>\n<table><tr><th>t</th><th>event</th></tr>\n");
    for e in &r.events {
        let text = match &e.kind {
            EventKind::Serving { shoot, members } => format!(
                "{shoot} control plane processes on: {}",
                if members.is_empty() {
                    "(none)".to_string()
                } else {
                    members.join(", ")
                }
            ),
            other => event_line(other).unwrap_or_default(),
        };
        h.push_str(&format!(
            "<tr><td>{:.1}s</td><td style=\"text-align:left\">{}</td></tr>\n",
            e.t,
            esc(&text)
        ));
    }
    h.push_str("</table>\n<h2>Summary</h2>\n<pre>");
    h.push_str(&esc(&summary(r)));
    h.push_str("</pre>\n</body></html>\n");
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::result::{DoubleServing, Event, ShootFigures};

    fn sample() -> RunResult {
        RunResult {
            drill: "kill-seed".into(),
            run: 2,
            seed: 9,
            passed: false,
            failures: vec!["shoot ks2: RTO 99.0s exceeds the bound of 90s".into()],
            started_at_ms: 0,
            duration_secs: 60.0,
            setup_secs: 30.0,
            members: vec!["ks1".into(), "ks2".into(), "ks3".into()],
            bucket: "file:///tmp/b".into(),
            isolation: "loopback".into(),
            events: vec![
                Event {
                    t: 0.0,
                    kind: EventKind::Leader {
                        leader: Some("ks1".into()),
                    },
                },
                Event {
                    t: 0.0,
                    kind: EventKind::Serving {
                        shoot: "ks2".into(),
                        members: vec!["ks1".into()],
                    },
                },
                Event {
                    t: 10.0,
                    kind: EventKind::Fault {
                        action: "killSeed".into(),
                        detail: "ks1 <hosting ks2>".into(),
                        member: Some("ks1".into()),
                    },
                },
                Event {
                    t: 14.0,
                    kind: EventKind::Operation {
                        id: 0,
                        kind: "failover".into(),
                        shoot: "ks2".into(),
                        from: "ks1".into(),
                        to: "ks3".into(),
                        step: "Done".into(),
                        detail: "restored revision 300".into(),
                        may_lose_revisions: Some(5),
                        reported: None,
                    },
                },
            ],
            shoots: vec![ShootFigures {
                shoot: "ks2".into(),
                available: vec![(0.0, 10.0), (24.0, 60.0)],
                outages: vec![(10.0, 24.0)],
                rto_secs: Some(14.0),
                acked_writes: 100,
                failed_writes: 20,
                lost_writes: 0,
                lost_beyond_durable: 1,
                lost_unreported: 0,
                lost_examples: vec![],
                rpo_revisions: Some(3),
                rpo_secs: Some(0.4),
                ring_may_lose_revisions: Some(5),
            }],
            double_serving: vec![DoubleServing {
                t: 12.0,
                shoot: "ks2".into(),
                members: vec!["ks1".into(), "ks3".into()],
            }],
            converged_secs: Some(20.0),
            build: None,
        }
    }

    #[test]
    fn summary_shows_verdict_events_and_figures() {
        let s = summary(&sample());
        assert!(
            s.starts_with("drill kill-seed run 2 (seed 9): FAIL in 60.0s"),
            "{s}"
        );
        assert!(
            s.contains("10.0s  fault killSeed: ks1 <hosting ks2>"),
            "{s}"
        );
        assert!(s.contains("failover 0 of ks2 ks1->ks3: Done restored revision 300"));
        let row: Vec<&str> = s
            .lines()
            .find(|l| l.trim_start().starts_with("ks2 "))
            .unwrap()
            .split_whitespace()
            .collect();
        assert_eq!(
            row,
            ["ks2", "14.0s", "1", "100", "20", "0", "1", "3", "rev/0.4s", ">=5", "rev"]
        );
        assert!(s.contains("3 rev/0.4s"));
        assert!(s.contains("RING SAID"), "{s}");
        assert!(s.contains("double serving: 1 times"));
        assert!(s.contains("FAILED: shoot ks2: RTO 99.0s"));
        assert!(s.lines().count() <= 30, "fits one screen");
    }

    #[test]
    fn html_is_self_contained_escaped_and_draws_the_timeline() {
        let h = html(&sample());
        assert!(h.starts_with("<!doctype html>"));
        assert!(
            !h.contains("<script") && !h.contains("src=\"http"),
            "no external resources"
        );
        assert!(h.contains("<svg"));
        assert!(
            h.contains("ks2 API down 10.0s–24.0s (14.0s)"),
            "outage drawn"
        );
        assert!(h.contains("ks1 &lt;hosting ks2&gt;"), "escaped");
        assert!(!h.contains("ks1 <hosting"), "not raw");
        assert!(h.contains("leader ks1 0.0s–60.0s"));
        assert!(h.contains("failover 0 ks1→ks3: Done"));
        assert!(h.contains("ks2 on ks1+ks3 at 12.0s"));
        assert!(h.contains("class=\"fail\">FAIL"));
    }
}
