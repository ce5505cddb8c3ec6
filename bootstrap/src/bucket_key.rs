//! The bucket key a new ring gets by default: the bucket holds every shoot's
//! CA keys, Secrets and data, so `ringctl bootstrap` seals it unless the
//! config names a key of its own or the user opts out (`--no-bucket-key`).
//! The key lives in the ring's state dir; a restore after losing that dir
//! needs a copy kept elsewhere (`ringctl restore --bucket-key FILE`).

use std::path::{Path, PathBuf};

use backup::codec::EncryptionKey;
use backup::config::EncryptionConfig;

use crate::error::io;
use crate::{BootstrapError, BootstrapOptions, RingConfig, RingLayout};

impl RingLayout {
    /// Where the key bootstrap generates for the ring's bucket lives.
    pub fn bucket_key(&self) -> PathBuf {
        let dir = std::path::absolute(&self.dir).unwrap_or_else(|_| self.dir.clone());
        dir.join("bucket.key")
    }
}

/// The bucket encryption that names `layout`'s key file.
pub(crate) fn generated_key(layout: &RingLayout) -> EncryptionConfig {
    EncryptionConfig {
        key_file: Some(layout.bucket_key()),
        ..Default::default()
    }
}

/// `config` with the generated key file of `layout` as its bucket key, when it
/// names none and `generate` is set.
pub(crate) fn with_default_key(
    mut config: RingConfig,
    layout: &RingLayout,
    generate: bool,
) -> RingConfig {
    if generate && config.bucket_encryption.is_none() {
        config.bucket_encryption = Some(generated_key(layout));
    }
    config
}

/// Whether `config` seals its bucket with the key generated in `layout`.
pub fn uses_generated_key(config: &RingConfig, layout: &RingLayout) -> bool {
    config
        .bucket_encryption
        .as_ref()
        .and_then(|e| e.key_file.as_deref())
        == Some(layout.bucket_key().as_path())
}

/// Writes a new random key to `layout`'s key file unless it exists (0600):
/// only for a new ring, so that a key file lost from an existing ring is
/// reported as missing, never silently replaced by one that cannot read
/// the bucket.
pub(crate) fn generate(layout: &RingLayout) -> Result<(), BootstrapError> {
    let path = layout.bucket_key();
    if path.exists() {
        return Ok(());
    }
    seed::pki::create_private_dir(&layout.dir).map_err(ringd::RingError::from)?;
    let key = EncryptionKey::generate();
    seed::pki::write_private(&path, format!("{}\n", key.to_hex()).as_bytes())
        .map_err(ringd::RingError::from)?;
    tracing::info!(path = %path.display(), "generated the bucket key");
    Ok(())
}

/// Copies the key file `from` (the user's copy, given to a restore) into
/// `layout`'s key file, checking that it is a key.
pub(crate) fn install(layout: &RingLayout, from: &Path) -> Result<(), BootstrapError> {
    let text =
        std::fs::read(from).map_err(io(format!("reading the bucket key {}", from.display())))?;
    EncryptionKey::parse(&text, &format!("--bucket-key {}", from.display()), None).map_err(
        |e| BootstrapError::Config {
            field: "--bucket-key".into(),
            reason: e.to_string(),
        },
    )?;
    seed::pki::create_private_dir(&layout.dir).map_err(ringd::RingError::from)?;
    seed::pki::write_private(&layout.bucket_key(), &text).map_err(ringd::RingError::from)?;
    Ok(())
}

/// The config bootstrap runs: the given one (which must match the stored
/// one), else the stored one, else the default. A new ring whose config names
/// no bucket key gets one generated in its state dir (unless opted out).
pub(crate) fn choose_config(
    opts: &BootstrapOptions,
    layout: &RingLayout,
) -> Result<RingConfig, BootstrapError> {
    let keyed = |c: RingConfig| with_default_key(c, layout, opts.generate_bucket_key);
    let config = match (&opts.config, layout.read_config()?) {
        // a ring made before keys were generated, or with --no-bucket-key, has none
        (Some(given), Some(stored)) if *given == stored => stored,
        (Some(given), Some(stored)) if keyed(given.clone()) != stored => {
            return Err(BootstrapError::Conflict {
                dir: opts.dir.clone(),
                existing: stored.name,
            })
        }
        (_, Some(stored)) => stored,
        (Some(given), None) => keyed(given.clone()),
        (None, None) => keyed(RingConfig::self_hosted_default()),
    };
    if !layout.config_file().exists() && uses_generated_key(&config, layout) {
        generate(layout)?;
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn opts(dir: &Path, config: Option<RingConfig>, generate: bool) -> BootstrapOptions {
        BootstrapOptions {
            config,
            dir: dir.to_path_buf(),
            ringd: PathBuf::from("ringd"),
            timeout: std::time::Duration::from_secs(1),
            generate_bucket_key: generate,
        }
    }

    fn store(layout: &RingLayout, config: &RingConfig) {
        std::fs::create_dir_all(&layout.dir).unwrap();
        std::fs::write(layout.config_file(), serde_yaml::to_string(config).unwrap()).unwrap();
    }

    /// A new ring names the generated key file, which holds a private, valid key.
    #[test]
    fn a_new_ring_gets_a_key_of_its_own() {
        let tmp = tempfile::tempdir().unwrap();
        let layout = RingLayout {
            dir: tmp.path().join("ring"),
        };
        let config = choose_config(&opts(&layout.dir, None, true), &layout).unwrap();
        assert!(uses_generated_key(&config, &layout), "{config:?}");
        let key = layout.bucket_key();
        let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let loaded = EncryptionKey::load(config.bucket_encryption.as_ref().unwrap()).unwrap();
        // another ring gets another key
        let other = RingLayout {
            dir: tmp.path().join("other"),
        };
        let config2 = choose_config(&opts(&other.dir, None, true), &other).unwrap();
        let loaded2 = EncryptionKey::load(config2.bucket_encryption.as_ref().unwrap()).unwrap();
        assert_ne!(loaded.to_hex(), loaded2.to_hex());
    }

    /// Opted out, or a config naming its own key: nothing is generated.
    #[test]
    fn no_key_is_made_when_opted_out_or_given() {
        let tmp = tempfile::tempdir().unwrap();
        let layout = RingLayout {
            dir: tmp.path().join("ring"),
        };
        let plain = choose_config(&opts(&layout.dir, None, false), &layout).unwrap();
        assert_eq!(plain.bucket_encryption, None);
        let own = RingConfig {
            bucket_encryption: Some(EncryptionConfig {
                key_env: Some("MY_KEY".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let chosen = choose_config(&opts(&layout.dir, Some(own.clone()), true), &layout).unwrap();
        assert_eq!(chosen, own);
        assert!(!layout.bucket_key().exists());
    }

    /// A rerun with the config the ring was made from is no conflict (the
    /// stored one names the generated key); a ring made without a key keeps
    /// having none; another config is a conflict.
    #[test]
    fn reruns_keep_the_stored_choice() {
        let tmp = tempfile::tempdir().unwrap();
        let layout = RingLayout {
            dir: tmp.path().join("ring"),
        };
        let given = RingConfig::default();
        let first = choose_config(&opts(&layout.dir, Some(given.clone()), true), &layout).unwrap();
        store(&layout, &first);
        let again = choose_config(&opts(&layout.dir, Some(given.clone()), true), &layout).unwrap();
        assert_eq!(again, first);

        let old = RingLayout {
            dir: tmp.path().join("old"),
        };
        store(&old, &given);
        let kept = choose_config(&opts(&old.dir, Some(given.clone()), true), &old).unwrap();
        assert_eq!(kept.bucket_encryption, None);
        assert!(!old.bucket_key().exists());

        let mut renamed = given;
        renamed.name = "other".into();
        let err = choose_config(&opts(&layout.dir, Some(renamed), true), &layout).unwrap_err();
        assert!(matches!(err, BootstrapError::Conflict { .. }), "{err}");
    }

    /// The key file of an existing ring is never replaced: once lost, it is
    /// reported missing (a new key could not read the bucket).
    #[test]
    fn a_lost_key_file_is_not_replaced() {
        let tmp = tempfile::tempdir().unwrap();
        let layout = RingLayout {
            dir: tmp.path().join("ring"),
        };
        let first = choose_config(&opts(&layout.dir, None, true), &layout).unwrap();
        store(&layout, &first);
        std::fs::remove_file(layout.bucket_key()).unwrap();
        let again = choose_config(&opts(&layout.dir, None, true), &layout).unwrap();
        assert!(!layout.bucket_key().exists());
        let err = again.check_bucket().unwrap_err().to_string();
        assert!(err.contains("bucket.key"), "{err}");
    }

    /// A restore installs the user's copy; a file that is no key is refused.
    #[test]
    fn a_restore_installs_the_given_key_after_checking_it() {
        let tmp = tempfile::tempdir().unwrap();
        let layout = RingLayout {
            dir: tmp.path().join("ring"),
        };
        let copy = tmp.path().join("copy");
        std::fs::write(&copy, EncryptionKey::generate().to_hex()).unwrap();
        install(&layout, &copy).unwrap();
        assert_eq!(
            std::fs::read(layout.bucket_key()).unwrap(),
            std::fs::read(&copy).unwrap()
        );
        std::fs::write(&copy, "not a key").unwrap();
        let err = install(&layout, &copy).unwrap_err().to_string();
        assert!(
            err.contains("--bucket-key") && err.contains("32 bytes"),
            "{err}"
        );
    }
}
