//! Objects per resource type in a Kubernetes etcd: what a restore, a
//! migration's final snapshot and a failover's verification compare.

use std::collections::BTreeMap;

/// The resource type a Kubernetes etcd key belongs to: `/registry/configmaps/ns/x`
/// is `configmaps`, `/registry/apiregistration.k8s.io/apiservices/x` is
/// `apiregistration.k8s.io/apiservices`. Keys outside `/registry/` are `other`.
pub fn resource_of(key: &[u8]) -> String {
    let Some(rest) = key.strip_prefix(b"/registry/") else {
        return "other".into();
    };
    let mut parts = rest.split(|b| *b == b'/');
    let first = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    if first.contains('.') {
        if let Some(second) = parts.next() {
            return format!("{first}/{}", String::from_utf8_lossy(second));
        }
    }
    first
}

/// Counts the keys of every resource type at `revision` (keys only, in pages, so
/// memory stays bounded whatever the size).
pub async fn count_objects(
    client: &mut etcd_client::Client,
    revision: i64,
) -> std::result::Result<BTreeMap<String, u64>, etcd_client::Error> {
    const PAGE: i64 = 5_000;
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    let mut from: Vec<u8> = vec![0];
    loop {
        let options = etcd_client::GetOptions::new()
            .with_range(vec![0])
            .with_keys_only()
            .with_limit(PAGE)
            .with_revision(revision);
        let resp = client.get(from.clone(), Some(options)).await?;
        for kv in resp.kvs() {
            *counts.entry(resource_of(kv.key())).or_default() += 1;
        }
        match resp.kvs().last() {
            Some(last) if resp.more() => {
                from = last.key().to_vec();
                from.push(0);
            }
            _ => return Ok(counts),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_types_from_registry_keys() {
        assert_eq!(resource_of(b"/registry/configmaps/default/a"), "configmaps");
        assert_eq!(
            resource_of(b"/registry/apiregistration.k8s.io/apiservices/v1."),
            "apiregistration.k8s.io/apiservices"
        );
        assert_eq!(resource_of(b"/registry/ranges/serviceips"), "ranges");
        assert_eq!(resource_of(b"compact_rev_key"), "other");
    }
}
