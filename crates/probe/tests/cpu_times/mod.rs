//! Threads' CPU times read in the kernel (`Probe::threads_cpu`).

use std::time::{Duration, Instant};

use appease_probe::{Probe, ProbeConfig, ProbeStorage, ThreadCpuTime, CPU_READ_MAX};

use super::{assert_root, gettid};

fn schedstat_ns(tid: u32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).unwrap();
    text.split_whitespace().next().unwrap().parse().unwrap()
}

fn read(probe: &mut Probe, tids: &[u32]) -> Vec<(usize, Option<ThreadCpuTime>)> {
    let mut out = Vec::new();
    probe
        .threads_cpu(tids, |i, a| out.push((i, a)))
        .expect("the kernel runs the reader");
    out
}

#[test]
#[ignore = "needs root (BPF): make test runs it, or as root cargo test -- --include-ignored"]
fn a_threads_cpu_time_is_the_kernels_and_a_gone_thread_answers_none() {
    let _serial = assert_root();
    let mut storage = ProbeStorage::uninit();
    let mut probe = Probe::load(&ProbeConfig::default(), &mut storage).unwrap();
    let me = gettid();
    let spin_until = Instant::now() + Duration::from_millis(30);
    while Instant::now() < spin_until {
        std::hint::spin_loop();
    }
    let before = schedstat_ns(me);
    let answer = read(&mut probe, &[me]);
    let after = schedstat_ns(me);
    let [(0, Some(t))] = answer[..] else {
        panic!("{answer:?}")
    };
    assert_eq!(t.pid, std::process::id());
    assert!(!t.kernel_thread);
    // kthreadd, pid 2 of the initial namespace: a kernel thread.
    let [(0, Some(k))] = read(&mut probe, &[2])[..] else {
        panic!("no thread 2")
    };
    assert!(k.kernel_thread, "{k:?}");
    assert!(
        before <= t.cpu_ns && t.cpu_ns <= after,
        "{before} {t:?} {after}"
    );
    assert!(t.cpu_ns >= 30_000_000, "{t:?}");

    // A thread that ended, and an ID beyond any pid_max: no thread.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(gettid()).unwrap())
        .join()
        .unwrap();
    let ended = rx.recv().unwrap();
    let deadline = Instant::now() + Duration::from_secs(2);
    while std::path::Path::new(&format!("/proc/self/task/{ended}")).exists() {
        assert!(Instant::now() < deadline, "thread {ended} not released");
        std::thread::sleep(Duration::from_millis(5));
    }
    let answers = read(&mut probe, &[ended, 4_999_999, me]);
    assert_eq!(answers.len(), 3);
    assert_eq!(answers[0], (0, None));
    assert_eq!(answers[1], (1, None));
    assert!(matches!(answers[2], (2, Some(t)) if t.pid == std::process::id()));
}

#[test]
#[ignore = "needs root (BPF): make test runs it, or as root cargo test -- --include-ignored"]
fn more_threads_than_one_call_reads_are_all_answered_in_order() {
    let _serial = assert_root();
    let mut storage = ProbeStorage::uninit();
    let mut probe = Probe::load(&ProbeConfig::default(), &mut storage).unwrap();
    let me = gettid();
    // The own thread at every third index, no thread elsewhere, over two calls' worth.
    let tids: Vec<u32> = (0..CPU_READ_MAX + 300)
        .map(|i| if i % 3 == 0 { me } else { 4_999_999 })
        .collect();
    let answers = read(&mut probe, &tids);
    assert_eq!(answers.len(), tids.len());
    for (n, (i, a)) in answers.into_iter().enumerate() {
        assert_eq!(i, n);
        assert_eq!(a.is_some(), n % 3 == 0, "index {n}: {a:?}");
    }
}

#[test]
#[ignore = "needs root (BPF): make test runs it, or as root cargo test -- --include-ignored"]
fn a_held_threads_requests_are_reported_at_most_every_held_gap_and_the_latest_is_read() {
    use std::io::{Read, Write};
    use std::sync::mpsc;

    use appease_probe::Event;

    let _serial = assert_root();
    let mut storage = ProbeStorage::uninit();
    let cfg = ProbeConfig {
        min_gap: Duration::from_millis(10),
        held_gap: Duration::from_millis(100),
        ignore_pid: None,
        ..ProbeConfig::default()
    };
    let mut probe = Probe::load(&cfg, &mut storage).unwrap();
    let (mut client, mut server) = std::os::unix::net::UnixStream::pair().unwrap();
    let (tx, rx) = mpsc::channel();
    // Each request costs its thread 2 ms of CPU.
    let reader = std::thread::spawn(move || {
        tx.send(gettid()).unwrap();
        let mut buf = [0u8; 1];
        while server.read(&mut buf).is_ok_and(|n| n > 0) {
            let until = Instant::now() + Duration::from_millis(2);
            while Instant::now() < until {
                std::hint::spin_loop();
            }
        }
    });
    let tid = rx.recv().unwrap();
    // Three requests, the first after a quiet spell, the others 15 ms apart: the CPU
    // times at the reported ones.
    // The times at which the last was sent, and the reported ones' CPU times.
    let mut three_requests = |probe: &mut Probe| -> (u64, Vec<u64>) {
        std::thread::sleep(Duration::from_millis(150));
        let mut sent = 0;
        for _ in 0..3 {
            sent = appease_probe::monotonic_ns();
            client.write_all(b"x").unwrap();
            std::thread::sleep(Duration::from_millis(15));
        }
        std::thread::sleep(Duration::from_millis(10));
        let mut cpu = Vec::new();
        probe
            .drain(|e| match e {
                Event::Request { tid: t, cpu_ns, .. } if t == tid => cpu.push(cpu_ns),
                _ => {}
            })
            .unwrap();
        (sent, cpu)
    };
    assert_eq!(
        three_requests(&mut probe).1.len(),
        3,
        "not held: each reported"
    );
    probe.set_held(tid, true).unwrap();
    let (sent, reported) = three_requests(&mut probe);
    assert_eq!(
        reported.len(),
        1,
        "held: only the first within the held gap"
    );
    let [(0, Some(t))] = read(&mut probe, &[tid])[..] else {
        panic!("thread {tid} not read")
    };
    // The third request came after two requests' work past the reported one.
    assert!(
        t.request_cpu_ns >= reported[0] + 3_000_000,
        "latest request at {} ns of CPU, the reported one at {}",
        t.request_cpu_ns,
        reported[0]
    );
    assert!(t.request_cpu_ns <= t.cpu_ns);
    // And it is read when it came: after the last was sent, before it was served.
    assert!(
        (sent..sent + 15_000_000).contains(&t.request_ns),
        "latest request read at {} ns, the last sent at {sent}",
        t.request_ns
    );
    // A gap of 10 s set while loaded: the next three, the first 150 ms after the last
    // reported one (past the 100 ms loaded), are none of them reported.
    probe.set_held_gap(Duration::from_secs(10));
    assert!(
        three_requests(&mut probe).1.is_empty(),
        "held, with a gap of 10 s set after load: none reported within it"
    );
    drop(client);
    reader.join().unwrap();
}
