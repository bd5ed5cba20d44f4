use super::*;
use std::fs::OpenOptions;
use std::os::unix::fs::MetadataExt;

#[test]
fn forged_paths_units_and_drop_ins_are_refused_and_counted() {
    let dir = tmpdir("forged");
    fs::create_dir_all(&dir).unwrap();
    let lines = [
        r#"{"op":"group","path":"/../../etc"}"#,
        r#"{"op":"move","key":{"pid":1,"tid":1,"start":1},"from":"/a/../b","to":"/appease.batch"}"#,
        r#"{"op":"group-idle","path":"/docker/abc","idle":false,"weight":"1024\nx"}"#,
        r#"{"op":"unit-idle","unit":"../../x.service","orig":100,"transient":false,"dropin":null}"#,
        r#"{"op":"unit-idle","unit":"a.service","orig":100,"transient":false,"dropin":"[Service]\nExecStartPre=/bin/sh"}"#,
        r#"{"op":"group","path":"/appease.batch"}"#,
        r##"{"op":"unit-idle","unit":"b.service","orig":100,"transient":true,"dropin":"# set-property\n[Service]\nCPUWeight=100\n"}"##,
    ];
    fs::write(dir.join(FILE), lines.join("\n") + "\n").unwrap();
    let st = read_pending(&dir).unwrap();
    assert_eq!(st.corrupt, vec![1, 2, 3, 4, 5]);
    assert_eq!(st.groups.iter().collect::<Vec<_>>(), ["/appease.batch"]);
    assert_eq!(st.units.keys().collect::<Vec<_>>(), ["b.service"]);
    assert!(st.moves.is_empty() && st.idle_groups.is_empty());
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn appends_stay_one_write_when_the_live_entries_pass_the_compaction_size() {
    let dir = tmpdir("big-live");
    let mut j = Journal::open(&dir).unwrap();
    let manage = |tid| Record::Manage {
        key: key(tid),
        comm: "flood".into(),
        orig: sched(0),
    };
    let mut tid = 0;
    while j.bytes <= COMPACT_AT_BYTES + 4096 {
        tid += 1;
        j.append(&manage(tid)).unwrap();
    }
    // Everything is live: a rewrite per append would rewrite over a MiB each time.
    let inode = fs::metadata(j.path()).unwrap().ino();
    for _ in 0..2000 {
        tid += 1;
        j.append(&manage(tid)).unwrap();
    }
    assert_eq!(
        fs::metadata(j.path()).unwrap().ino(),
        inode,
        "no compaction (a rename) in 2,000 appends after one"
    );
    assert_eq!(read_pending(&dir).unwrap().threads.len(), tid as usize);
    assert_eq!(
        fs::metadata(j.path()).unwrap().mode() & 0o777,
        0o600,
        "the journal is root's alone"
    );
    let _ = fs::remove_dir_all(&dir);
}

fn key(tid: u32) -> TaskKey {
    TaskKey {
        pid: 1,
        tid,
        start: 42,
    }
}

fn sched(nice: i32) -> Sched {
    Sched {
        policy: 0,
        nice,
        slice_ns: 0,
        reset_on_fork: false,
    }
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("appease-journal-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    d
}

#[test]
fn replays_live_entries_across_reopen() {
    let dir = tmpdir("replay");
    let mut j = Journal::open(&dir).unwrap();
    j.append(&Record::Manage {
        key: key(1),
        comm: "a".into(),
        orig: sched(0),
    })
    .unwrap();
    j.append(&Record::Apply {
        key: key(1),
        prev: 0,
        next: -5,
        slice_ns: 500_000,
        orig: None,
    })
    .unwrap();
    j.append(&Record::Manage {
        key: key(2),
        comm: "b".into(),
        orig: sched(3),
    })
    .unwrap();
    j.append(&Record::Apply {
        key: key(2),
        prev: 3,
        next: -2,
        slice_ns: 0,
        orig: None,
    })
    .unwrap();
    j.append(&Record::Apply {
        key: key(2),
        prev: -2,
        next: 0,
        slice_ns: 0,
        orig: None,
    })
    .unwrap();
    j.append(&Record::Release { key: key(1) }).unwrap();
    drop(j);
    // A torn line at the end is skipped.
    let mut f = OpenOptions::new()
        .append(true)
        .open(dir.join(FILE))
        .unwrap();
    f.write_all(b"{\"op\":\"apply\",\"key\":{\"pi").unwrap();
    let live = read_pending(&dir).unwrap().threads;
    assert_eq!(live.len(), 1);
    let p = &live[&key(2)];
    assert_eq!((p.orig.nice, p.ours.clone()), (3, vec![-2, 0]));
    let j = Journal::open(&dir).unwrap();
    assert_eq!(j.state().threads.len(), 1);
    j.remove_if_empty().unwrap();
    assert!(dir.join(FILE).exists(), "kept while something is pending");
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn compaction_keeps_live_entries_only() {
    let dir = tmpdir("compact");
    let mut j = Journal::open(&dir).unwrap();
    for tid in 0..8000 {
        j.append(&Record::Manage {
            key: key(tid),
            comm: "x".into(),
            orig: sched(0),
        })
        .unwrap();
        j.append(&Record::Apply {
            key: key(tid),
            prev: 0,
            next: -3,
            slice_ns: 0,
            orig: None,
        })
        .unwrap();
        if tid != 7 {
            j.append(&Record::Release { key: key(tid) }).unwrap();
        }
    }
    assert!(fs::metadata(dir.join(FILE)).unwrap().len() < COMPACT_AT_BYTES);
    let live = read_pending(&dir).unwrap().threads;
    assert_eq!(live.keys().copied().collect::<Vec<_>>(), vec![key(7)]);
    assert_eq!(live[&key(7)].ours, vec![0, -3]);
    drop(j);
    let mut j = Journal::open(&dir).unwrap();
    j.append(&Record::Release { key: key(7) }).unwrap();
    j.remove_if_empty().unwrap();
    assert!(!dir.join(FILE).exists());
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn moves_and_groups_replay_and_compact() {
    let dir = tmpdir("moves");
    let mut j = Journal::open(&dir).unwrap();
    j.append(&Record::Group {
        path: "/appease.batch".into(),
    })
    .unwrap();
    j.append(&Record::Move {
        key: key(5),
        from: "/".into(),
        to: "/appease.batch".into(),
    })
    .unwrap();
    // Moved again (say promoted then demoted): the first origin is what counts.
    j.append(&Record::Move {
        key: key(5),
        from: "/appease.batch".into(),
        to: "/appease.batch".into(),
    })
    .unwrap();
    j.append(&Record::Move {
        key: key(6),
        from: "/a".into(),
        to: "/appease.batch".into(),
    })
    .unwrap();
    j.append(&Record::Return { key: key(6) }).unwrap();
    drop(j);
    let st = read_pending(&dir).unwrap();
    assert_eq!(
        st.groups.iter().cloned().collect::<Vec<_>>(),
        vec!["/appease.batch".to_string()]
    );
    assert_eq!(st.moves.len(), 1);
    assert_eq!(st.moves[&key(5)].from, "/");
    let mut j = Journal::open(&dir).unwrap();
    j.compact().unwrap();
    assert_eq!(
        read_pending(&dir).unwrap(),
        st,
        "compaction keeps moves and groups"
    );
    j.append(&Record::Return { key: key(5) }).unwrap();
    j.append(&Record::GroupRemoved {
        path: "/appease.batch".into(),
    })
    .unwrap();
    assert!(j.state().is_empty());
    j.remove_if_empty().unwrap();
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn raised_autogroups_replay_and_compact_keeping_the_first_original() {
    let dir = tmpdir("autogroups");
    let mut j = Journal::open(&dir).unwrap();
    let raise = |id, prev, next| Record::AutogroupNice {
        id,
        key: key(5),
        orig: prev,
        prev,
        next,
    };
    j.append(&raise(7, 0, -10)).unwrap();
    // Raised again to a new nice (a reload): 0 is still what goes back.
    j.append(&raise(7, -10, -5)).unwrap();
    j.append(&raise(8, 2, -10)).unwrap();
    j.append(&Record::AutogroupRestored { id: 8 }).unwrap();
    drop(j);
    let st = read_pending(&dir).unwrap();
    assert_eq!(st.autogroups.keys().copied().collect::<Vec<_>>(), vec![7]);
    let a = &st.autogroups[&7];
    assert_eq!((a.orig, a.prev, a.nice, a.key), (0, -10, -5, key(5)));
    let mut j = Journal::open(&dir).unwrap();
    j.compact().unwrap();
    assert_eq!(read_pending(&dir).unwrap(), st, "compaction keeps them");
    j.append(&Record::AutogroupRestored { id: 7 }).unwrap();
    assert!(j.state().is_empty());
    j.remove_if_empty().unwrap();
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn threads_idled_in_place_and_idle_units_replay_and_compact() {
    let dir = tmpdir("in-place");
    let mut j = Journal::open(&dir).unwrap();
    let idle = |nice| Sched {
        policy: crate::sys::SCHED_IDLE,
        ..sched(nice)
    };
    j.append(&Record::Idle {
        key: key(7),
        orig: sched(3),
    })
    .unwrap();
    // Recorded again (a daemon that died between the record and the change, then a
    // new one): the first original is what counts.
    j.append(&Record::Idle {
        key: key(7),
        orig: idle(3),
    })
    .unwrap();
    j.append(&Record::Idle {
        key: key(8),
        orig: sched(0),
    })
    .unwrap();
    j.append(&Record::Unidle { key: key(8) }).unwrap();
    j.append(&Record::UnitIdle {
        unit: "backup.service".into(),
        orig: crate::systemd::WEIGHT_UNSET,
        transient: false,
        dropin: None,
        set: None,
    })
    .unwrap();
    j.append(&Record::UnitIdle {
        unit: "run-r1.scope".into(),
        orig: 50,
        transient: true,
        dropin: Some("[Scope]\nCPUWeight=50\n".into()),
        set: Some(0),
    })
    .unwrap();
    j.append(&Record::UnitRestored {
        unit: "backup.service".into(),
    })
    .unwrap();
    drop(j);
    let st = read_pending(&dir).unwrap();
    assert_eq!(st.idled.len(), 1);
    assert_eq!(st.idled[&key(7)], sched(3));
    assert_eq!(
        st.units.get("run-r1.scope"),
        Some(&PendingUnit {
            orig: 50,
            transient: true,
            dropin: Some("[Scope]\nCPUWeight=50\n".to_string()),
            set: Some(0),
        })
    );
    assert_eq!(st.len(), 2);
    let mut j = Journal::open(&dir).unwrap();
    j.compact().unwrap();
    assert_eq!(read_pending(&dir).unwrap(), st, "compaction keeps both");
    j.append(&Record::Unidle { key: key(7) }).unwrap();
    j.append(&Record::UnitRestored {
        unit: "run-r1.scope".into(),
    })
    .unwrap();
    assert!(j.state().is_empty());
    j.remove_if_empty().unwrap();
    fs::remove_dir_all(&dir).unwrap();
}

fn manage(tid: u32, nice: i32) -> Record {
    Record::Manage {
        key: key(tid),
        comm: "t".into(),
        orig: sched(nice),
    }
}

fn apply_rec(tid: u32, orig: i32, next: i32) -> Record {
    Record::Apply {
        key: key(tid),
        prev: orig,
        next,
        slice_ns: 0,
        orig: Some(sched(orig)),
    }
}

fn lines_of(recs: &[Record]) -> Vec<Vec<u8>> {
    recs.iter()
        .map(|r| serde_json::to_vec(r).unwrap())
        .collect()
}

fn write_lines(dir: &Path, lines: &[Vec<u8>]) {
    fs::create_dir_all(dir).unwrap();
    let mut text = Vec::new();
    for l in lines {
        text.extend_from_slice(l);
        text.push(b'\n');
    }
    fs::write(dir.join(FILE), text).unwrap();
}

#[test]
fn a_line_that_is_not_utf8_costs_that_line_only() {
    let dir = tmpdir("utf8");
    let mut lines = lines_of(&[manage(1, 0), apply_rec(1, 0, -5), manage(2, 3)]);
    lines.insert(1, b"{\"op\":\"release\",\xff}".to_vec());
    write_lines(&dir, &lines);
    let st = read_pending(&dir).expect("read, not aborted");
    assert_eq!(st.threads.len(), 2, "every other line replayed");
    assert_eq!(st.corrupt, vec![2]);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_lost_manage_line_is_made_good_by_the_apply_record() {
    let dir = tmpdir("lost-manage");
    let mut lines = lines_of(&[manage(1, 4), apply_rec(1, 4, -5)]);
    lines[0] = b"garbage".to_vec();
    write_lines(&dir, &lines);
    let st = read_pending(&dir).unwrap();
    let p = &st.threads[&key(1)];
    assert_eq!((p.orig, p.ours.clone()), (sched(4), vec![4, -5]));
    assert_eq!(st.corrupt, vec![1]);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_torn_last_line_is_ended_before_the_next_record() {
    let dir = tmpdir("torn");
    let mut lines = lines_of(&[manage(1, 0)]);
    lines.push(br#"{"op":"manage","key":{"pi"#.to_vec());
    write_lines(&dir, &lines);
    // Remove the newline after the torn line: a crash mid-write leaves none.
    let mut text = fs::read(dir.join(FILE)).unwrap();
    text.pop();
    fs::write(dir.join(FILE), text).unwrap();
    let mut j = Journal::open(&dir).unwrap();
    assert!(
        j.state().corrupt.is_empty(),
        "a torn tail is not corruption"
    );
    j.append(&manage(2, 0)).unwrap();
    drop(j);
    let st = read_pending(&dir).unwrap();
    assert_eq!(
        st.threads.len(),
        2,
        "the record after the torn line is read"
    );
    assert_eq!(
        st.corrupt,
        vec![2],
        "the torn line, now ended, is one bad line"
    );
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn restore_keeps_a_journal_with_unreadable_lines_and_counts_them_failed() {
    let dir = tmpdir("restore-corrupt");
    // A group that does not exist (gone) and one unreadable line.
    let mut lines = lines_of(&[Record::GroupIdle {
        path: "/appease-no-such-group".into(),
        idle: false,
        weight: "1024".into(),
    }]);
    lines.push(b"\x00\x01 not a record".to_vec());
    write_lines(&dir, &lines);
    let report = crate::restore_journal(&dir).unwrap();
    assert_eq!(report.failed, 1, "{report:?}");
    let kept: Vec<_> = fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(".corrupt-"))
        .collect();
    assert_eq!(kept.len(), 1, "a copy kept for a look");
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn each_line_opens_with_its_kind_which_the_crash_points_by_kind_read() {
    let key = TaskKey {
        pid: 1,
        tid: 2,
        start: 3,
    };
    for (rec, op) in [
        (Record::Unpin { key }, "unpin"),
        (
            Record::GroupIdle {
                path: "/g".into(),
                idle: false,
                weight: "1024".into(),
            },
            "group-idle",
        ),
    ] {
        let line = serde_json::to_string(&rec).unwrap();
        assert!(line.starts_with(&format!("{{\"op\":\"{op}\",")), "{line}");
    }
}
