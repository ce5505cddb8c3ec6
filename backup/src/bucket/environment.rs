//! A bucket's settings from the environment made explicit, for a process that
//! does not share it: the backup sidecar and restore init container of a
//! control plane in pods get the bucket as the ringd that renders them reaches
//! it (`s3://` with `AWS_ENDPOINT_URL` and keys in ringd's environment must not
//! become a sidecar asking a cloud metadata service).

use std::collections::BTreeMap;

use object_store::aws::AmazonS3ConfigKey;
use object_store::azure::AzureConfigKey;
use object_store::gcp::GoogleConfigKey;
use object_store::ClientConfigKey;

use crate::{BackupError, BucketConfig, Result};

impl BucketConfig {
    /// This bucket as pods on a node (in a network namespace of their own,
    /// without this process's environment) must be given it: every setting
    /// this process's environment gives it written into the config (`AWS_*`,
    /// `GOOGLE_*`, `AZURE_*` as `object_store` reads them), and refused when its
    /// endpoint is this machine's loopback. `field` names the bucket's
    /// setting in errors (`<field>.endpoint`).
    pub fn for_pods(&self, field: &str) -> Result<BucketConfig> {
        self.for_pods_with(field, std::env::vars())
    }

    /// [`for_pods`](Self::for_pods) in the environment `vars`.
    pub fn for_pods_with(
        &self,
        field: &str,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<BucketConfig> {
        let bucket = self.with_variables(vars)?;
        match bucket.loopback_endpoint() {
            Some(endpoint) => Err(BackupError::config(
                format!("{field}.endpoint"),
                format!("{endpoint} (set there or by AWS_ENDPOINT_URL) is a loopback address, and pods back up from their nodes' network namespaces, where loopback is their own: give an address of this machine the nodes reach (its network address, or the node network's gateway)"),
            )),
            None => Ok(bucket),
        }
    }

    /// This bucket with every setting `vars` (an environment) gives it
    /// (`AWS_*` for `s3://`, `GOOGLE_*` for `gs://`, `AZURE_*` for `az://`,
    /// the variables `object_store` reads) written into the config. What the
    /// config sets itself wins. A Google service account named by path is
    /// inlined as its key, since the path is this machine's.
    fn with_variables(
        &self,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<BucketConfig> {
        let scheme = self.url.split_once("://").map_or("", |(s, _)| s);
        let mut out = self.clone();
        let mut vars: Vec<(String, String)> = vars.into_iter().collect();
        vars.sort();
        for (name, value) in vars {
            let key = name.to_ascii_lowercase();
            match scheme {
                "s3" | "s3a" if name.starts_with("AWS_") => out.take_s3(key, value),
                "gs" if name.starts_with("GOOGLE_") => out.take_gcs(&name, key, value)?,
                "az" | "abfs" if name.starts_with("AZURE_") => {
                    out.take_other::<AzureConfigKey>(key, value)
                }
                _ => {}
            }
        }
        Ok(out)
    }

    /// The endpoint, if it is a loopback address (`127.x`, `::1`,
    /// `localhost`): a process in another network namespace (a pod on a node)
    /// reaches its own loopback there, not this machine's.
    fn loopback_endpoint(&self) -> Option<&str> {
        let endpoint = self.endpoint.as_deref()?;
        let rest = endpoint.split_once("://").map_or(endpoint, |(_, r)| r);
        let authority = rest.split('/').next().unwrap_or(rest);
        let host = match authority.strip_prefix('[') {
            Some(v6) => v6.split(']').next().unwrap_or(v6),
            None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
        };
        let loopback = host.eq_ignore_ascii_case("localhost")
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        loopback.then_some(endpoint)
    }

    fn take_s3(&mut self, key: String, value: String) {
        match key.parse::<AmazonS3ConfigKey>() {
            Ok(AmazonS3ConfigKey::Endpoint) => {
                self.endpoint.get_or_insert(value);
            }
            Ok(AmazonS3ConfigKey::Region) => {
                self.region.get_or_insert(value);
            }
            Ok(AmazonS3ConfigKey::Client(ClientConfigKey::AllowHttp)) => {
                let on = value.eq_ignore_ascii_case("true") || value == "1";
                self.allow_http.get_or_insert(on);
            }
            Ok(_) => self.take_other::<AmazonS3ConfigKey>(key, value),
            Err(_) => {}
        }
    }

    fn take_gcs(&mut self, name: &str, key: String, value: String) -> Result<()> {
        match key.parse::<GoogleConfigKey>() {
            Ok(GoogleConfigKey::ServiceAccount | GoogleConfigKey::ApplicationCredentials) => {
                let json = std::fs::read_to_string(&value).map_err(|e| {
                    BackupError::config(
                        name,
                        format!("names {value}, which cannot be read ({e}): the control plane's pods get the service account's key from it"),
                    )
                })?;
                self.take_other::<GoogleConfigKey>("google_service_account_key".into(), json);
            }
            Ok(_) => self.take_other::<GoogleConfigKey>(key, value),
            Err(_) => {}
        }
        Ok(())
    }

    /// Adds option `key` unless the config already sets it (by any alias).
    fn take_other<K: std::str::FromStr + PartialEq>(&mut self, key: String, value: String) {
        let Ok(parsed) = key.parse::<K>() else {
            return;
        };
        if !has_option::<K>(&self.options, &parsed) {
            self.options.insert(key, value);
        }
    }
}

fn has_option<K: std::str::FromStr + PartialEq>(
    options: &BTreeMap<String, String>,
    key: &K,
) -> bool {
    options
        .keys()
        .any(|k| k.to_ascii_lowercase().parse::<K>().is_ok_and(|p| p == *key))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn s3_settings_from_the_environment_become_explicit() {
        let env = vars(&[
            ("AWS_ENDPOINT_URL", "http://198.19.0.254:9000"),
            ("AWS_ACCESS_KEY_ID", "id"),
            ("AWS_SECRET_ACCESS_KEY", "secret"),
            ("AWS_ALLOW_HTTP", "true"),
            ("AWS_REGION", "eu-west-1"),
            ("AWS_NOT_A_SETTING", "x"),
            ("GOOGLE_SERVICE_ACCOUNT_KEY", "{}"),
            ("HOME", "/root"),
        ]);
        let got = BucketConfig::url("s3://b/backups")
            .with_variables(env)
            .unwrap();
        assert_eq!(got.endpoint.as_deref(), Some("http://198.19.0.254:9000"));
        assert_eq!(got.allow_http, Some(true));
        assert_eq!(got.region.as_deref(), Some("eu-west-1"));
        let keys: Vec<&str> = got.options.keys().map(String::as_str).collect();
        assert_eq!(keys, ["aws_access_key_id", "aws_secret_access_key"]);
        got.validate("bucket").unwrap();
    }

    #[test]
    fn loopback_endpoints_are_recognised() {
        let with = |e: &str| BucketConfig {
            endpoint: Some(e.into()),
            ..BucketConfig::url("s3://b")
        };
        for e in [
            "http://127.0.0.1:9000",
            "http://127.3.2.1",
            "https://localhost:443/x",
            "http://[::1]:9000",
        ] {
            assert_eq!(with(e).loopback_endpoint(), Some(e), "{e}");
        }
        for e in [
            "http://198.19.0.254:9000",
            "https://s3.example",
            "http://[2001:db8::1]:80",
        ] {
            assert_eq!(with(e).loopback_endpoint(), None, "{e}");
        }
        assert_eq!(BucketConfig::url("s3://b").loopback_endpoint(), None);
    }

    #[test]
    fn what_the_config_sets_wins_over_the_environment() {
        let mut cfg = BucketConfig::url("s3://b");
        cfg.endpoint = Some("https://s3.example".into());
        cfg.allow_http = Some(false);
        cfg.options.insert("access_key_id".into(), "mine".into());
        let env = vars(&[
            ("AWS_ENDPOINT_URL", "http://other"),
            ("AWS_ALLOW_HTTP", "true"),
            ("AWS_ACCESS_KEY_ID", "theirs"),
        ]);
        let got = cfg.with_variables(env).unwrap();
        assert_eq!(got.endpoint.as_deref(), Some("https://s3.example"));
        assert_eq!(got.allow_http, Some(false));
        assert_eq!(got.options.len(), 1);
        assert_eq!(got.options["access_key_id"], "mine");
    }

    #[test]
    fn file_buckets_take_nothing_and_a_google_key_path_is_inlined() {
        let env = vars(&[("AWS_ACCESS_KEY_ID", "id")]);
        let file = BucketConfig::url("file:///b").with_variables(env).unwrap();
        assert_eq!(file, BucketConfig::url("file:///b"));

        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("sa.json");
        std::fs::write(&key, "{\"type\":\"service_account\"}").unwrap();
        let env = vars(&[("GOOGLE_SERVICE_ACCOUNT", key.to_str().unwrap())]);
        let gs = BucketConfig::url("gs://b").with_variables(env).unwrap();
        assert_eq!(
            gs.options["google_service_account_key"],
            "{\"type\":\"service_account\"}"
        );
        let env = vars(&[("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent/sa.json")]);
        let err = BucketConfig::url("gs://b").with_variables(env).unwrap_err();
        assert!(
            err.to_string().contains("GOOGLE_APPLICATION_CREDENTIALS")
                && err.to_string().contains("/nonexistent/sa.json"),
            "{err}"
        );
    }
}
