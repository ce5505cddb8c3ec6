//! Talking to the running ring through its admin API: its status (as is, or
//! once settled) and planned migrations of a control plane.

use std::time::{Duration, Instant};

use ringd::client::AdminClient;
use ringd::status::RingStatus;

use crate::config::RingConfig;
use crate::error::BootstrapError;
use crate::layout::RingLayout;

/// The ring's status once the leader has heard every control plane ready
/// (each member saw its own ready; the leader hears it with the member's
/// next health report), or after [`SETTLE`] as it is.
pub(crate) async fn settled_status(
    layout: &RingLayout,
    config: &RingConfig,
) -> Result<RingStatus, BootstrapError> {
    let deadline = Instant::now() + SETTLE;
    loop {
        let status = ring_status(layout, config).await?;
        let heard = status.placements.iter().all(|p| p.ready == Some(true));
        if heard || Instant::now() >= deadline {
            return Ok(status);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// How long the final report waits for the leader to hear every control plane ready.
const SETTLE: Duration = Duration::from_secs(10);

/// The status as seen by the first member that answers (preferring the leader's view).
pub async fn ring_status(
    layout: &RingLayout,
    config: &RingConfig,
) -> Result<RingStatus, BootstrapError> {
    if config.members.is_empty() {
        return Err(BootstrapError::Unsupported(
            "the ring has no members".into(),
        ));
    }
    Ok(AdminClient::ring_status(&config.member_addresses(), &layout.pki()).await?)
}

/// Moves `shoot`'s control plane to member `to` (planned migration) and waits for it.
pub async fn migrate_and_wait(
    layout: &RingLayout,
    config: &RingConfig,
    shoot: &str,
    to: &str,
    timeout: Duration,
) -> Result<(), BootstrapError> {
    let status = ring_status(layout, config).await?;
    if status
        .placements
        .iter()
        .any(|p| p.shoot == shoot && p.host == to)
    {
        return Ok(());
    }
    let address = status
        .leader_address()
        .map_or_else(|| config.member_address(0), str::to_string);
    let mut admin = AdminClient::connect(&address, &layout.pki())?;
    // the ring may already move it there by itself (a returned member's
    // successor comes home): follow that move instead of asking for another
    let moving = |s: &RingStatus| {
        s.operations
            .iter()
            .find(|o| o.shoot() == shoot && o.target() == to && !o.step.is_finished())
            .map(|o| o.id)
    };
    let id = match moving(&status) {
        Some(id) => id,
        None => match admin.migrate(shoot, to).await {
            Ok(id) => id,
            // refused because the ring opened that move meanwhile: follow it
            Err(e) => {
                let now = ring_status(layout, config).await.ok();
                now.as_ref().and_then(moving).ok_or(e)?
            }
        },
    };
    let op = admin.wait_operation(id, timeout, |_, _| {}).await?;
    if op.step != ringd::state::OperationStep::Done {
        return Err(BootstrapError::Timeout {
            step: format!("migrate {shoot} to {to}"),
            waited_secs: timeout.as_secs(),
            detail: op.detail,
        });
    }
    Ok(())
}
