//! reference/status-json.md: what `ringctl status -o json` prints
//! (the answering ringd's `RingStatus`, with the local ring's nodes and
//! control planes), as field tables and as its JSON Schema.

use super::schema::{render, schema_of};
use super::GENERATED;

/// The page.
pub(super) fn page() -> anyhow::Result<String> {
    let schema = schema_of::<crate::cli::StatusView>();
    let mut out = format!(
        "# Status JSON\n\n{GENERATED}\n\n\
         `ringctl status -o json` prints one object: the view of the ringd \
         that answered (the leader when it answers), with the nodes and \
         control planes of the local ring in `--ring-dir`. Fields marked \
         \"leader's view only\" are empty when a follower answered.\n\n## `Status`\n\n"
    );
    render(&mut out, "Status", &schema);
    let json = serde_json::to_string_pretty(&schema)?;
    out.push_str(&format!("\n## JSON Schema\n\n```json\n{json}\n```\n"));
    Ok(out)
}
