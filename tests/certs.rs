//! `bitfold certs`: a kept CA that issues certificates of a role, revokes
//! them and lists them, each subcommand's output and errors.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::util::{assert_fails_with, bitfold, stderr, stdout};

/// `bitfold ARGS...`, which must succeed; its standard output.
fn certs(args: &[&str]) -> String {
    let run = bitfold(args);
    assert!(run.status.success(), "{args:?}: {}", stderr(&run));
    stdout(&run)
}

fn text(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// The permission bits of `path`.
fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// The dates `bitfold certs` writes: `2027-05-01T12:00:00Z`.
fn is_utc(date: &str) -> bool {
    let shape: String = date
        .chars()
        .map(|c| if c.is_ascii_digit() { '0' } else { c })
        .collect();
    shape == "0000-00-00T00:00:00Z"
}

#[test]
fn a_ca_issues_revokes_and_lists_certificates_of_a_role() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    let out = certs(&["certs", "init", "--ca", text(&ca), "--days", "400"]);
    let lines: Vec<&str> = out.lines().collect();
    let made = format!("made a CA in {}, valid until ", ca.display());
    assert!(
        lines[0].starts_with(&made) && is_utc(&lines[0][made.len()..]),
        "{out}"
    );
    assert_eq!(
        lines[1..],
        [
            format!(
                "its key is {}: keep it secret and backed up",
                ca.join("ca-key.pem").display()
            ),
            format!(
                "next: bitfold certs issue --ca {} --role ROLE --name NAME --out DIR",
                ca.display()
            ),
        ]
    );
    assert_eq!((mode(&ca), mode(&ca.join("ca-key.pem"))), (0o700, 0o600));
    assert_fails_with(
        &bitfold(&["certs", "init", "--ca", text(&ca)]),
        1,
        &format!(
            "{0} already holds a CA: issue with it (`bitfold certs issue --ca {0} ...`), or give \
             `init` another folder",
            ca.display()
        ),
    );
    assert_eq!(
        certs(&["certs", "list", "--ca", text(&ca)]),
        format!("the CA in {} has issued no certificate\n", ca.display())
    );

    let s0 = dir.path().join("s0");
    let out = certs(&[
        "certs",
        "issue",
        "--ca",
        text(&ca),
        "--role",
        "slave",
        "--name",
        "s0",
        "--out",
        text(&s0),
    ]);
    let s0 = fs::canonicalize(&s0).unwrap();
    let words: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(
        words[..7],
        [
            "issued",
            "a",
            "slave",
            "certificate",
            "for",
            "s0,",
            "serial"
        ],
        "{out}"
    );
    assert_eq!(words[7].len(), 33, "16 bytes in hex and a comma: {out}");
    assert_eq!(words[8..10], ["valid", "until"], "{out}");
    assert!(is_utc(words[10].trim_end_matches(',')), "{out}");
    assert_eq!(words[11..], ["in", text(&s0)], "{out}");
    assert_eq!((mode(&s0), mode(&s0.join("key.pem"))), (0o700, 0o600));
    for file in ["ca.pem", "cert.pem", "crl.pem"] {
        assert!(s0.join(file).is_file(), "{file}");
    }
    let dashboards = dir.path().join("dashboards");
    certs(&[
        "certs",
        "issue",
        "--ca",
        text(&ca),
        "--role",
        "reader",
        "--name",
        "dashboards",
        "--days",
        "7",
        "--out",
        text(&dashboards),
    ]);
    let dashboards = fs::canonicalize(&dashboards).unwrap();

    let list = certs(&["certs", "list", "--ca", text(&ca)]);
    let rows: Vec<Vec<&str>> = list
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 2, "{list}");
    assert_eq!(
        (rows[0][..2].to_vec(), rows[0][3]),
        (vec!["s0", "slave"], "valid"),
        "{list}"
    );
    assert_eq!(
        (rows[1][..2].to_vec(), rows[1][3]),
        (vec!["dashboards", "reader"], "valid"),
        "{list}"
    );
    assert!(is_utc(rows[0][2]) && is_utc(rows[1][2]), "{list}");
    assert!(rows[1][2] < rows[0][2], "7 days end before 365: {list}");

    let out = certs(&["certs", "revoke", "--ca", text(&ca), "--name", "dashboards"]);
    let lines: Vec<&str> = out.lines().collect();
    let crl = ca.join("crl.pem");
    assert!(
        lines[0].starts_with("revoked 1 certificate of dashboards (serial ")
            && lines[0].ends_with(&format!("); {} lists it", crl.display())),
        "{out}"
    );
    let mut refreshed = vec![
        format!("refreshed {}", dashboards.join("crl.pem").display()),
        format!("refreshed {}", s0.join("crl.pem").display()),
    ];
    refreshed.sort();
    assert_eq!(lines[1..3], refreshed, "{out}");
    assert_eq!(
        lines[3],
        format!(
            "copy {} into the TLS folder of every process of this CA elsewhere (other machines): \
             until it has the new list, it accepts dashboards",
            crl.display()
        )
    );
    assert_eq!(lines.len(), 4, "{out}");
    assert_eq!(
        fs::read(s0.join("crl.pem")).unwrap(),
        fs::read(&crl).unwrap()
    );
    let list = certs(&["certs", "list", "--ca", text(&ca)]);
    let states: Vec<&str> = list
        .lines()
        .filter_map(|l| l.split_whitespace().nth(3))
        .collect();
    assert_eq!(states, ["valid", "revoked"], "{list}");
    let again = certs(&["certs", "revoke", "--ca", text(&ca), "--name", "dashboards"]);
    assert!(
        again.starts_with("already revoked: 1 certificate of dashboards"),
        "{again}"
    );
}

#[test]
fn certs_errors_name_the_thing_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    let out = dir.path().join("out");
    let issue = |extra: &[&str]| {
        let mut args = vec!["certs", "issue", "--ca", text(&ca), "--out", text(&out)];
        args.extend(extra);
        bitfold(&args)
    };
    let no_ca = format!(
        "no CA in {0}: `bitfold certs init --ca {0}` makes one",
        ca.display()
    );
    assert_fails_with(&issue(&["--role", "admin", "--name", "ops"]), 1, &no_ca);
    assert_fails_with(&bitfold(&["certs", "list", "--ca", text(&ca)]), 1, &no_ca);
    assert_fails_with(
        &bitfold(&["certs", "revoke", "--ca", text(&ca), "--name", "ops"]),
        1,
        &no_ca,
    );

    certs(&["certs", "init", "--ca", text(&ca), "--days", "30"]);
    let run = issue(&["--role", "master", "--name", "m"]);
    assert_eq!(run.status.code(), Some(1));
    let err = stderr(&run);
    assert!(
        err.contains(&format!(
            "would outlive the CA in {}, valid until ",
            ca.display()
        )) && err.contains(": ask for at most 29 days (--days), or make a new CA"),
        "{err}"
    );
    assert!(!out.exists(), "nothing written");
    assert_fails_with(
        &bitfold(&["certs", "revoke", "--ca", text(&ca), "--name", "nobody"]),
        1,
        &format!(
            "the CA in {0} issued no certificate named nobody: `bitfold certs list --ca {0}` \
             lists those it did",
            ca.display()
        ),
    );
    let run = issue(&["--role", "boss", "--name", "b"]);
    assert_eq!(run.status.code(), Some(2));
    assert!(
        stderr(&run).contains("[possible values: master, slave, admin, reader]"),
        "{}",
        stderr(&run)
    );
    let run = issue(&["--role", "admin", "--name", "a", "--days", "0"]);
    assert_eq!(run.status.code(), Some(2), "{}", stderr(&run));
    let run = issue(&["--role", "admin", "--name", "ops", "--days", "5"]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert_fails_with(
        &issue(&["--role", "reader", "--name", "ops"]),
        1,
        &format!(
            "ops holds a valid admin certificate of the CA in {0}: a name has one role; revoke it \
             first (`bitfold certs revoke --ca {0} --name ops`) or pick another name",
            ca.display()
        ),
    );
}

#[test]
fn each_certs_subcommand_says_what_it_writes() {
    let help = |args: &[&str]| {
        let mut all = vec!["certs"];
        all.extend(args);
        all.push("--help");
        certs(&all).split_whitespace().collect::<Vec<_>>().join(" ")
    };
    let top = help(&[]);
    for expected in ["init", "issue", "revoke", "list", "DIR/tls/ca", "Examples:"] {
        assert!(
            top.contains(expected),
            "certs --help lacks {expected}: {top}"
        );
    }
    let cases: &[(&str, &[&str])] = &[
        (
            "init",
            &[
                "ca-key.pem",
                "mode 0600",
                "crl.pem",
                "issued.toml",
                "0700",
                "[default: 3650]",
            ],
        ),
        (
            "issue",
            &[
                "cert.pem",
                "key.pem",
                "crl.pem",
                "365 for master and slave, 90 for admin and reader",
                "reader",
            ],
        ),
        (
            "revoke",
            &["crl.pem", "Copy CA_DIR/crl.pem", "every process elsewhere"],
        ),
        ("list", &["valid", "expired", "revoked", "not-after"]),
    ];
    for (command, expected) in cases {
        let text = help(&[command]);
        for expected in *expected {
            assert!(
                text.contains(expected),
                "certs {command} --help lacks {expected}: {text}"
            );
        }
    }
}
