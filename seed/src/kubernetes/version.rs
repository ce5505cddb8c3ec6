//! Which seed clusters Ring runs control planes on: the Kubernetes releases
//! still supported upstream. Older ones may lack the API versions the
//! rendered objects use or behave differently in ways never tested here.

use crate::error::{Result, SeedError};

/// The oldest seed cluster release Ring supports (`major`, `minor`).
pub const MIN_SEED_VERSION: (u32, u32) = (1, 35);

/// `Ok` for a seed cluster whose `/version` says `major`.`minor` (providers
/// may add a suffix, e.g. `37+`), else why it is refused, naming both versions.
pub fn check(major: &str, minor: &str, git_version: &str) -> Result<()> {
    let number = |s: &str| -> Option<u32> {
        let digits: String = s.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    };
    let (min_major, min_minor) = MIN_SEED_VERSION;
    let found = (number(major), number(minor));
    match found {
        (Some(ma), Some(mi)) if (ma, mi) >= MIN_SEED_VERSION => Ok(()),
        _ => Err(SeedError::UnsupportedSeedCluster {
            found: if git_version.is_empty() {
                format!("{major}.{minor}")
            } else {
                git_version.to_string()
            },
            oldest: format!("v{min_major}.{min_minor}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_from_the_oldest_supported_on_are_taken() {
        for (major, minor) in [("1", "35"), ("1", "37"), ("1", "37+"), ("2", "0")] {
            assert!(check(major, minor, "").is_ok(), "{major}.{minor}");
        }
    }

    #[test]
    fn older_or_unreadable_releases_are_refused_naming_both_versions() {
        for (major, minor, git) in [
            ("1", "34", "v1.34.3"),
            ("1", "20", "v1.20.2"),
            ("1", "", ""),
        ] {
            let err = check(major, minor, git).unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains("v1.35"), "{msg}");
            let found = if git.is_empty() {
                format!("{major}.{minor}")
            } else {
                git.to_string()
            };
            assert!(msg.contains(&found), "{msg}");
            assert!(!err.is_retryable());
        }
    }
}
