//! The command line itself: import errors, status, exit codes, help.

use std::fs;

use crate::util::{Cluster, assert_fails_with, bitfold, free_port_block, stderr, stdout};

/// Bad import input: `error:` with the file and line (or file name), a
/// non-zero exit, and nothing of the import applied, even the good lines
/// of the same run.
#[test]
fn bad_import_input_is_refused_whole() {
    let cluster = Cluster::start(2, 1);
    let dir = cluster.dir();
    let good = dir.join("good.csv");
    fs::write(&good, "1,1\n1,2\n2,5\n").unwrap();
    let cases: &[(&str, &str, &str)] = &[
        ("letters.csv", "3,4\nx,5\n", "letters.csv:2"),
        ("negative.csv", "3,4\n3,-5\n", "negative.csv:2"),
        ("huge-vid.csv", "18446744073709551616,1\n", "huge-vid.csv:1"),
        (
            "huge-bit.csv",
            "# header\n\n3,4294967296\n",
            "huge-bit.csv:3",
        ),
        ("columns.csv", "3,4\n3,4,5\n", "columns.csv:2"),
        ("one-column.csv", "3\n", "one-column.csv:1"),
    ];
    for (name, text, location) in cases {
        let bad = dir.join(name);
        fs::write(&bad, text).unwrap();
        let run = cluster.cli(&["import", good.to_str().unwrap(), bad.to_str().unwrap()]);
        assert!(!run.status.success(), "{name} was accepted");
        let err = stderr(&run);
        assert!(err.starts_with("error: "), "{err}");
        assert!(
            err.contains(location),
            "{name}: expected {location} in {err}"
        );
    }
    let roaring_dir = dir.join("roaring");
    fs::create_dir(&roaring_dir).unwrap();
    fs::write(roaring_dir.join("7.roaring"), b"not a roaring bitmap").unwrap();
    let run = cluster.cli(&["import", roaring_dir.to_str().unwrap()]);
    assert!(!run.status.success());
    assert!(stderr(&run).contains("7.roaring"), "{}", stderr(&run));

    let run = cluster.cli(&["query", "--output", "count", "R:0-18446744073709551615"]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert_eq!(
        stdout(&run).trim(),
        "0",
        "a refused import applied something"
    );
}

/// Pairs accept spaces, tabs, CRLF, blank lines and comments.
#[test]
fn pairs_are_read_as_people_write_them() {
    let cluster = Cluster::start(2, 2);
    let file = cluster.dir().join("loose.csv");
    fs::write(
        &file,
        "# vid,bit\r\n\r\n  3 ,\t7\r\n\t# more\n3,9\n4 , 4294967295 \n",
    )
    .unwrap();
    let run = cluster.cli(&["import", file.to_str().unwrap()]);
    assert!(run.status.success(), "{}", stderr(&run));
    let run = cluster.cli(&["query", "--output", "bits", "R:3-4"]);
    assert_eq!(stdout(&run), "7\n9\n4294967295\n");
}

/// `status` shows every slave, and still exits 0 when one is down.
#[test]
fn status_shows_up_and_down_slaves() {
    let mut cluster = Cluster::start(3, 1);
    let run = cluster.cli(&["status"]);
    assert!(run.status.success(), "{}", stderr(&run));
    let text = stdout(&run);
    for (i, addr) in cluster.slave_addrs.iter().enumerate() {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("s{i} ")))
            .unwrap_or_else(|| panic!("no s{i} in {text}"));
        assert!(
            line.contains(addr.as_str()) && line.contains("up"),
            "{line}"
        );
    }
    cluster.kill_slave(1);
    // The master notices when its health probe next runs.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let run = cluster.cli(&["status"]);
        assert!(
            run.status.success(),
            "status must exit 0 with a slave down: {}",
            stderr(&run)
        );
        let text = stdout(&run);
        let s1 = text
            .lines()
            .find(|l| l.starts_with("s1 "))
            .unwrap()
            .to_string();
        if s1.contains("down") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "s1 never shown down: {text}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// Without a master to talk to: a clear error naming the address, exit 5.
#[test]
fn an_absent_master_is_a_clear_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    drop(listener);
    let unreachable = format!(
        "cannot reach the master at {addr}: connection refused (start it with `bitfold up`)"
    );
    assert_fails_with(
        &bitfold(&["query", "--master", &addr, "P:1"]),
        5,
        &unreachable,
    );
    assert_fails_with(&bitfold(&["status", "--master", &addr]), 5, &unreachable);
    assert_fails_with(
        &bitfold(&["query", "--master", "nonsense", "P:1"]),
        5,
        "cannot reach the master at nonsense: invalid socket address (give it as HOST:PORT)",
    );
    assert_fails_with(
        &bitfold(&["query", "--master", "127.0.0.1:99999", "P:1"]),
        5,
        "cannot reach the master at 127.0.0.1:99999: invalid port value (give it as HOST:PORT)",
    );
}

/// The common failures each print one exact line, every cause once, and
/// exit with the code `bitfold --help` documents.
#[test]
fn common_failures_print_one_exact_line_and_their_exit_code() {
    let mut cluster = Cluster::start(1, 1);
    let dir = cluster.dir().to_path_buf();

    let missing = dir.join("missing.csv");
    assert_fails_with(
        &cluster.cli(&["import", missing.to_str().unwrap()]),
        1,
        &format!(
            "{}: cannot read: No such file or directory (os error 2)",
            missing.display()
        ),
    );
    let bad = dir.join("bad.csv");
    fs::write(&bad, "1,2\nx,3\n").unwrap();
    assert_fails_with(
        &cluster.cli(&["import", bad.to_str().unwrap()]),
        1,
        &format!("{}:2: vid \"x\" is not a decimal number", bad.display()),
    );
    let roaring = dir.join("roaring");
    fs::create_dir(&roaring).unwrap();
    fs::write(roaring.join("abc.roaring"), b"").unwrap();
    assert_fails_with(
        &cluster.cli(&["import", roaring.to_str().unwrap()]),
        1,
        &format!(
            "{}: the file name must be <vid>.roaring, but vid \"abc\" is not a decimal number",
            roaring.join("abc.roaring").display()
        ),
    );

    assert_fails_with(
        &cluster.cli(&["query", "R:1-x"]),
        3,
        "bad query at byte 4: expected a digit after '-'",
    );
    assert_fails_with(&cluster.cli(&["query", "P:99"]), 4, "vector 99 not found");
    assert_eq!(bitfold(&["query"]).status.code(), Some(2), "no query given");
    let no_cluster = dir.join("nowhere.toml");
    assert_fails_with(
        &bitfold(&["master", "--cluster", no_cluster.to_str().unwrap()]),
        1,
        &format!(
            "cannot read the cluster file {}: No such file or directory (os error 2)",
            no_cluster.display()
        ),
    );

    let addr = cluster.master_addr();
    cluster.master.take().expect("the master runs").kill();
    assert_fails_with(
        &bitfold(&["status", "--master", &addr]),
        5,
        &format!(
            "cannot reach the master at {addr}: connection refused (start it with `bitfold up`)"
        ),
    );
}

/// A bulk load straight into a store directory: all of a good file, none
/// of a bad one, and a repeat changes nothing.
#[test]
fn import_into_a_data_dir_is_all_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bulk.csv");
    fs::write(&file, "10,1\n10,100000\n11,5\n").unwrap();
    let store_dir = dir.path().join("store");
    let import = |path: &std::path::Path| {
        bitfold(&[
            "import",
            "--data-dir",
            store_dir.to_str().unwrap(),
            path.to_str().unwrap(),
        ])
    };
    let run = import(&file);
    assert!(run.status.success(), "{}", stderr(&run));
    let bad = dir.path().join("bad.csv");
    fs::write(&bad, "12,1\n12,x\n").unwrap();
    let run = import(&bad);
    assert!(
        !run.status.success() && stderr(&run).contains("bad.csv:2"),
        "{}",
        stderr(&run)
    );
    let run = import(&file);
    assert!(
        run.status.success(),
        "importing twice is harmless: {}",
        stderr(&run)
    );

    let store = bitfold_engine::store::Store::open(&store_dir).unwrap();
    let snapshot = store.snapshot();
    assert_eq!(snapshot.vids().collect::<Vec<_>>(), vec![10, 11]);
    let bits: Vec<u32> = snapshot.parts(10).flat_map(|p| p.bits()).collect();
    let bits: std::collections::BTreeSet<u32> = bits.into_iter().collect();
    assert_eq!(bits, [1, 100_000].into());
}

/// Every command documents itself.
#[test]
fn help_lists_every_command() {
    let run = bitfold(&["--help"]);
    assert!(run.status.success());
    let text = stdout(&run);
    for command in ["slave", "master", "up", "demo", "import", "query", "status"] {
        assert!(text.contains(command), "--help does not mention {command}");
        let run = bitfold(&[command, "--help"]);
        assert!(run.status.success(), "{command} --help failed");
    }
    assert!(
        text.contains("Exit codes"),
        "--help documents the exit codes"
    );
}

/// `bitfold demo` runs a cluster, loads the sample and checks every answer.
#[test]
fn the_demo_answers_and_checks_itself() {
    let run = bitfold(&["demo"]);
    assert!(run.status.success(), "{}", stderr(&run));
    let text = stdout(&run);
    let checked = text.matches("(same as computed locally)").count();
    assert!(checked >= 5, "the demo should check each example: {text}");
    assert!(text.contains("error: bad query at byte 6"), "{text}");
}

/// `bitfold up` serves until SIGTERM, exits 0, and a second `up` on the
/// same directory brings back the same cluster with its data.
#[test]
fn up_serves_until_sigterm_and_comes_back_with_its_data() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("cluster");
    let port = free_port_block();
    let args = |extra: &[&str]| {
        let mut args: Vec<String> = vec![
            "up".into(),
            "--dir".into(),
            data.display().to_string(),
            "--port".into(),
            port.to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };
    let master = format!("127.0.0.1:{port}");
    let up = crate::util::Server::start("master", &args(&["--replicas", "2"])).expect("up starts");
    assert_eq!(up.addr, master);
    let file = dir.path().join("v.csv");
    fs::write(&file, "1,10\n2,10\n2,11\n").unwrap();
    let run = bitfold(&["import", "--master", &master, file.to_str().unwrap()]);
    assert!(run.status.success(), "{}", stderr(&run));
    up.signal(libc::SIGTERM);
    let mut up = up;
    let status = up.wait();
    assert!(status.success(), "up should exit 0 on SIGTERM: {status:?}");

    let contradiction = bitfold(&[
        "up",
        "--dir",
        data.to_str().unwrap(),
        "--port",
        &port.to_string(),
        "--slaves",
        "5",
    ]);
    assert!(!contradiction.status.success());
    assert!(
        stderr(&contradiction).contains("cluster.toml"),
        "{}",
        stderr(&contradiction)
    );

    let _up = crate::util::Server::start("master", &args(&[])).expect("up starts again");
    let run = bitfold(&["query", "--master", &master, "--output", "bits", "R:1-2"]);
    assert_eq!(stdout(&run), "10\n11\n", "{}", stderr(&run));
    let run = bitfold(&["status", "--master", &master]);
    assert!(
        stdout(&run).contains("3 of 3 slaves up"),
        "{}",
        stdout(&run)
    );
}
