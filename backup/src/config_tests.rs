//! Tests of [`super`] (config.rs).
use super::*;

const GOOD: &str = "
apiVersion: ring.gardener.cloud/v1alpha1
kind: Backup
shoot: m1
etcd: {endpoints: [http://127.0.0.1:2379]}
bucket: {url: file:///tmp/b}
schedule: {deltaPeriodMs: 500}
retention: {policy: keepLast, count: 3}
";

#[test]
fn parses_defaults_and_policies() {
    let c = BackupConfig::parse(GOOD, "t").unwrap();
    assert_eq!(c.schedule.delta_period_ms, 500);
    assert_eq!(c.schedule.delta_max_bytes, 4 << 20);
    assert_eq!(c.compression.level, 3);
    assert_eq!(c.retention, Some(Retention::KeepLast { count: 3 }));
    let e = BackupConfig::parse(
        &GOOD.replace("{policy: keepLast, count: 3}", "{policy: exponential}"),
        "t",
    )
    .unwrap();
    assert_eq!(e.retention, Some(Retention::Exponential));
}

#[test]
fn unknown_keys_and_bad_values_name_the_field() {
    let cases = [
        (GOOD.replace("deltaPeriodMs", "deltaPeriod"), "deltaPeriod"),
        (GOOD.replace("kind: Backup", "kind: Ring"), "kind"),
        (
            GOOD.replace("http://127.0.0.1:2379", "127.0.0.1:2379"),
            "etcd.endpoints[0]",
        ),
        (GOOD.replace("file:///tmp/b", "ftp://x"), "bucket.url"),
        (GOOD.replace("file:///tmp/b", "s3://"), "bucket.url"),
        (GOOD.replace("count: 3", "count: 0"), "retention.count"),
        (
            GOOD.replace("deltaPeriodMs: 500", "deltaPeriodMs: 0"),
            "schedule.deltaPeriodMs",
        ),
        (GOOD.replace("shoot: m1", "shoot: M_1"), "shoot"),
    ];
    for (text, field) in cases {
        let err = BackupConfig::parse(&text, "t").unwrap_err().to_string();
        assert!(err.contains(field), "{field}: {err}");
    }
    let mut c = BackupConfig::parse(GOOD, "t").unwrap();
    c.encryption = Some(EncryptionConfig::default());
    assert!(c.validate().unwrap_err().to_string().contains("keyFile"));
    c.encryption = Some(EncryptionConfig {
        key_env: Some("K".into()),
        ..Default::default()
    });
    c.validate().unwrap();
    c.compression.level = 30;
    assert!(c
        .validate()
        .unwrap_err()
        .to_string()
        .contains("compression.level"));
}

#[test]
fn tls_files_must_exist_and_pair() {
    let mut e = EtcdConfig::plain("https://127.0.0.1:2379");
    e.cert_file = Some("/nonexistent.crt".into());
    assert!(e
        .validate("etcd")
        .unwrap_err()
        .to_string()
        .contains("keyFile"));
    e.key_file = Some("/nonexistent.key".into());
    assert!(e
        .validate("etcd")
        .unwrap_err()
        .to_string()
        .contains("does not exist"));
}

#[test]
fn a_backup_spools_only_where_it_is_told() {
    let mut spool = SpoolConfig::default();
    let err = spool.dir().unwrap_err().to_string();
    assert!(
        err.contains("spool.dir") && err.contains("--state-dir"),
        "{err}"
    );
    spool.dir = Some("/var/lib/ring/spool/m1".into());
    assert_eq!(spool.dir().unwrap(), Path::new("/var/lib/ring/spool/m1"));
}
