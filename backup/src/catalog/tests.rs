use super::*;

fn full(rev: i64) -> (String, u64) {
    (
        object_name(Kind::Full, rev, rev, 1_700_000_000_000 + rev, true, false),
        10,
    )
}

fn delta(a: i64, b: i64) -> (String, u64) {
    (
        object_name(Kind::Delta, a, b, 1_700_000_000_000 + b, true, true),
        10,
    )
}

#[test]
fn names_round_trip_and_sort_by_revision() {
    let n = object_name(Kind::Delta, 12, 345, 1_718_360_100_123, true, true);
    assert_eq!(
        n,
        "delta-00000000000000000012-00000000000000000345-20240614T101500123Z.zst.aesgcm"
    );
    let e = parse_name(&n, 5).unwrap();
    assert_eq!(
        (e.kind, e.first, e.last, e.time_ms, e.encrypted),
        (Kind::Delta, 12, 345, 1_718_360_100_123, true)
    );
    let f = parse_name(&object_name(Kind::Full, 7, 7, 0, false, false), 1).unwrap();
    assert_eq!(
        (f.kind, f.first, f.compression.as_str(), f.encrypted),
        (Kind::Full, 7, "raw", false)
    );
    for bad in [
        "full-1-x.zst",
        "delta-00000000000000000012.zst",
        "notes.txt",
        "full-00000000000000000001-20240614T101500123Z.gz",
    ] {
        assert!(parse_name(bad, 0).is_none(), "{bad}");
    }
    assert!(
        object_name(Kind::Full, 9, 9, 0, true, false)
            < object_name(Kind::Full, 10, 10, 0, true, false)
    );
}

#[test]
fn catalog_from_listing_ignores_strangers() {
    let c = Catalog::from_listing(vec![
        delta(11, 20),
        full(10),
        ("README".into(), 1),
        delta(21, 30),
    ]);
    assert_eq!(c.fulls.len(), 1);
    assert_eq!(c.deltas.len(), 2);
    assert_eq!(c.unknown, vec!["README".to_string()]);
    assert_eq!(c.latest_revision(), Some(30));
    assert!(c.gaps().is_empty());
}

#[test]
fn plan_picks_newest_full_at_or_before_target_and_the_deltas_after_it() {
    let c = Catalog::from_listing(vec![
        full(10),
        delta(11, 20),
        delta(21, 30),
        full(25),
        delta(31, 40),
    ]);
    let p = c.plan(Target::Latest, false, &[]).unwrap();
    assert_eq!(p.target_revision, 40);
    assert_eq!(p.full.first, 25);
    let names: Vec<i64> = p.deltas.iter().map(|d| d.first).collect();
    assert_eq!(names, vec![21, 31], "delta 21..30 still holds 26..30");
    let p = c.plan(Target::Revision(22), false, &[]).unwrap();
    assert_eq!((p.full.first, p.deltas.len()), (10, 2));
    let p = c.plan(Target::Revision(10), false, &[]).unwrap();
    assert!(p.deltas.is_empty());
    assert!(c.plan(Target::Revision(41), false, &[]).is_err());
    assert!(c.plan(Target::Revision(9), false, &[]).is_err());
    // a full snapshot that turned out too new is excluded on the next plan
    let p = c
        .plan(Target::Revision(27), false, &[p_name(&c, 25)])
        .unwrap();
    assert_eq!(p.full.first, 10);
}

/// A bucket with a key plans only with encrypted objects: a planted
/// plain full snapshot, newer than every other, is left out.
#[test]
fn only_encrypted_objects_are_planned_under_a_key() {
    let object = |kind, a, b, encrypted| {
        let name = object_name(kind, a, b, 1_700_000_000_000 + b, true, encrypted);
        (name, 10)
    };
    let mut c = Catalog::from_listing(vec![
        object(Kind::Full, 10, 10, true),
        object(Kind::Delta, 11, 20, true),
        object(Kind::Full, 20, 20, false),
        object(Kind::Delta, 21, 30, false),
    ]);
    assert_eq!(c.plan(Target::Latest, false, &[]).unwrap().full.first, 20);
    let dropped = c.retain_encrypted();
    assert_eq!(dropped.len(), 2, "{dropped:?}");
    assert!(
        dropped.iter().all(|n| !n.ends_with(".aesgcm")),
        "{dropped:?}"
    );
    let p = c.plan(Target::Latest, false, &[]).unwrap();
    assert_eq!((p.full.first, p.target_revision), (10, 20));
    assert!(p.full.encrypted && p.deltas.iter().all(|d| d.encrypted));
}

fn p_name(c: &Catalog, rev: i64) -> String {
    c.fulls
        .iter()
        .find(|f| f.first == rev)
        .unwrap()
        .name
        .clone()
}

#[test]
fn a_missing_delta_is_a_gap_unless_allowed() {
    let c = Catalog::from_listing(vec![full(10), delta(11, 20), delta(31, 40)]);
    let err = c.plan(Target::Latest, false, &[]).unwrap_err();
    match &err {
        BackupError::Gap { from, to, .. } => assert_eq!((*from, *to), (21, 30)),
        other => panic!("{other}"),
    }
    assert!(err.to_string().contains("--allow-gap"), "{err}");
    assert!(err.to_string().contains("revision 20 or earlier"), "{err}");
    assert_eq!(
        c.plan(Target::Revision(20), false, &[])
            .unwrap()
            .deltas
            .len(),
        1
    );
    let p = c.plan(Target::Latest, true, &[]).unwrap();
    assert_eq!(p.gaps, vec![(21, 30)]);
    assert_eq!(p.deltas.len(), 2);
    let gaps = c.gaps();
    assert_eq!(gaps.len(), 1);
    assert_eq!(
        (gaps[0].from, gaps[0].to, gaps[0].bridged_by.clone()),
        (21, 30, None)
    );
}

#[test]
fn a_gap_bridged_by_a_newer_full_snapshot_does_not_block_later_restores() {
    // compaction during the delta stream: deltas stop at 20, a new full at 35
    let c = Catalog::from_listing(vec![full(10), delta(11, 20), full(35), delta(36, 50)]);
    let p = c.plan(Target::Latest, false, &[]).unwrap();
    assert_eq!((p.full.first, p.deltas.len()), (35, 1));
    assert!(c.plan(Target::Revision(30), false, &[]).is_err());
    let gaps = c.gaps();
    assert_eq!(gaps.len(), 1);
    assert_eq!((gaps[0].from, gaps[0].to), (21, 34));
    assert!(gaps[0]
        .bridged_by
        .as_deref()
        .unwrap()
        .starts_with("full-00000000000000000035"));
}

#[test]
fn times_format_and_parse() {
    let ms = 1_718_360_100_123;
    assert_eq!(parse_time(&format_time(ms)), Some(ms));
    assert_eq!(parse_rfc3339("2024-06-14T10:15:00.123Z").unwrap(), ms);
    assert!(parse_rfc3339("yesterday").is_err());
}

#[test]
fn epochs_round_trip_in_names_and_malformed_ones_are_not_backup_objects() {
    let n = object_name_in_epoch(7, Kind::Delta, 12, 345, 1_718_360_100_123, true, true);
    assert_eq!(
        n,
        "delta-00000000000000000012-00000000000000000345-20240614T101500123Z-e7.zst.aesgcm"
    );
    assert_eq!(parse_name(&n, 1).unwrap().epoch, 7);
    let f = object_name_in_epoch(12, Kind::Full, 9, 9, 0, false, false);
    assert_eq!(
        (parse_name(&f, 1).unwrap().epoch, f.contains("-e12.raw")),
        (12, true)
    );
    // epoch 0 is "not recorded": the name is the one of a backup outside a ring
    assert_eq!(
        object_name_in_epoch(0, Kind::Full, 9, 9, 0, true, false),
        object_name(Kind::Full, 9, 9, 0, true, false)
    );
    for bad in ["e0", "e", "x7", "e07", "e1x"] {
        let name = format!("full-00000000000000000009-19700101T000000000Z-{bad}.zst");
        assert!(parse_name(&name, 0).is_none(), "{name}");
    }
}

/// A host's record of where its epoch began is read from the listing: it
/// names the epoch (a stale writer sees it), cuts the older epoch's late
/// deltas there, and a point-in-time restore between it and the new epoch's
/// first full snapshot is a gap, not the fenced host's fork. Under a key, a
/// plain record counts for nothing.
#[test]
fn a_recorded_beginning_is_an_epoch_s_start_and_a_restore_never_reads_past_it() {
    let object = |epoch, kind, a, b, encrypted| {
        let name = object_name_in_epoch(epoch, kind, a, b, 1_700_000_000_000 + b, true, encrypted);
        (name, 10)
    };
    let listing = |begin_sealed| {
        vec![
            object(1, Kind::Full, 10, 10, true),
            object(1, Kind::Delta, 11, 20, true),
            object(1, Kind::Delta, 21, 24, true),
            (begin_name(2, 20, begin_sealed), 64),
            object(2, Kind::Full, 25, 25, true),
        ]
    };
    let c = Catalog::from_listing(listing(true));
    assert!(c.unknown.is_empty(), "{:?}", c.unknown);
    assert_eq!((c.newest_epoch(), c.epoch_start(2)), (2, Some(20)));
    assert_eq!(c.superseded.len(), 1, "{:?}", c.superseded);
    match c.plan(Target::Revision(23), false, &[]) {
        Err(BackupError::Gap {
            from: 21, to: 23, ..
        }) => {}
        other => panic!("want a gap 21..=23, got {other:?}"),
    }
    assert_eq!(
        c.plan(Target::Revision(20), false, &[])
            .unwrap()
            .target_revision,
        20
    );
    assert_eq!(c.plan(Target::Latest, false, &[]).unwrap().full.first, 25);

    let mut plain = Catalog::from_listing(listing(false));
    let dropped = plain.retain_encrypted();
    assert_eq!(dropped, vec![begin_name(2, 20, false)]);
    assert_eq!(
        plain.epoch_start(2),
        Some(25),
        "only the sealed objects count"
    );
    assert!(plain.begins.is_empty());
}
