//! Rendering for humans (tables) and machines (JSON, YAML).

use comfy_table::{presets::NOTHING, Table};
use seed::ControlPlaneStatus;
use serde::Serialize;

use ringd::{Result, RingError};

/// Output format selected with `-o`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Format {
    /// Aligned columns for people.
    #[default]
    Table,
    /// JSON.
    Json,
    /// YAML.
    Yaml,
}

/// Encodes `value` as JSON or YAML; `None` for the table format.
pub fn encode<T: Serialize>(value: &T, format: Format) -> Result<Option<String>> {
    match format {
        Format::Table => Ok(None),
        Format::Json => serde_json::to_string_pretty(value)
            .map(|s| Some(s + "\n"))
            .map_err(|e| RingError::Encode(e.to_string())),
        Format::Yaml => serde_yaml::to_string(value)
            .map(Some)
            .map_err(|e| RingError::Encode(e.to_string())),
    }
}

/// A table with a header row and no borders.
pub fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(NOTHING).set_header(header.iter().copied());
    t
}

/// Control planes and their components as tables, with a `kubectl` line to try.
pub fn status_table(statuses: &[ControlPlaneStatus]) -> String {
    let mut out = String::new();
    let mut t = table(&["SHOOT", "PHASE", "API", "SUPERVISOR", "READYZ"]);
    for s in statuses {
        t.add_row(vec![
            s.shoot.clone(),
            s.phase.to_string(),
            s.api_url.clone(),
            s.supervisor_pid.map_or("-".into(), |p| p.to_string()),
            first_line(&s.readyz, 60),
        ]);
    }
    out.push_str(&t.to_string());
    out.push('\n');
    for s in statuses {
        let mut t = table(&["COMPONENT", "PID", "RUNNING", "RESTARTS", "LAST EXIT"]);
        for c in &s.components {
            t.add_row(vec![
                c.component.to_string(),
                c.state
                    .pid
                    .filter(|_| c.running)
                    .map_or("-".into(), |p| p.to_string()),
                if c.running { "yes" } else { "no" }.into(),
                c.state.restarts.to_string(),
                c.state.last_exit.clone().unwrap_or_else(|| "-".into()),
            ]);
        }
        out.push_str(&format!("\n{} components:\n{t}\n", s.shoot));
        let kc = s.kubeconfig.display();
        out.push_str(&format!(
            "kubeconfig: {kc}\ntry:        kubectl --kubeconfig {kc} get namespaces\n"
        ));
    }
    out
}

fn first_line(s: &str, max: usize) -> String {
    let line = s.lines().next().unwrap_or("");
    if line.chars().count() > max {
        line.chars().take(max).collect::<String>() + "…"
    } else {
        line.to_string()
    }
}
