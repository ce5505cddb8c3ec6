//! reference/config.md: the config kinds, every field with its YAML name,
//! type, default and the rules its `validate()` enforces (in the field's doc
//! comment), from the Rust types' JSON Schemas.

use super::schema::{render, schema_of};
use super::GENERATED;

/// A config kind: its `kind:`, who reads it, and its schema.
struct Kind {
    name: &'static str,
    about: &'static str,
    schema: serde_json::Value,
}

fn kinds() -> Vec<Kind> {
    vec![
        Kind {
            name: "Ring",
            about: "The whole ring in one file: what `ringctl bootstrap --config`, \
                    `down`, `status` and `restore` read (a default ring keeps it as \
                    `ring.yaml` in its ring dir).",
            schema: schema_of::<bootstrap::RingConfig>(),
        },
        Kind {
            name: "RingMember",
            about: "One member's ringd (`ringd --config`); `ringctl bootstrap` writes \
                    one per member from the Ring config.",
            schema: schema_of::<ringd::config::RingdConfig>(),
        },
        Kind {
            name: "RingNode",
            about: "One Kubernetes node of a shoot (`ring-node --config`); written by \
                    `ringctl bootstrap`.",
            schema: schema_of::<seed::node::NodeConfig>(),
        },
        Kind {
            name: "Drill",
            about: "A chaos drill (`ringctl drill run FILE`): a ring, a workload, a \
                    timeline of faults and what must hold. Durations are written \
                    `500ms`, `10s`, `1.5s` or `2m` (at most a day).",
            schema: schema_of::<scenarios::drill::Drill>(),
        },
        Kind {
            name: "Backup",
            about: "The continuous backup of one shoot (`ringctl backup start --config`); \
                    flags override its fields.",
            schema: schema_of::<backup::config::BackupConfig>(),
        },
    ]
}

/// The page.
pub(super) fn page() -> anyhow::Result<String> {
    let mut out = format!(
        "# Config files\n\n{GENERATED}\n\n\
         Every config file is YAML with `apiVersion: ring.gardener.cloud/v1alpha1` \
         and its `kind`; field names are camelCase, unknown fields are refused, \
         and a refused value's error names the field's path (`members[2].name`). \
         A field whose default is \"none\" may be left out.\n"
    );
    for k in kinds() {
        out.push_str(&format!("\n## `{}`\n\n{}\n\n", k.name, k.about));
        render(&mut out, k.name, &k.schema);
    }
    Ok(out)
}
