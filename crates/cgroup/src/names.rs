//! Names from outside (a process's `comm`, a cgroup path, a unit name) are untrusted
//! bytes: any process names itself what it likes, non-UTF-8, newlines and terminal
//! escapes included. They are shown escaped, and a path or unit read back from appease's
//! own journal is acted on only when it is well formed.

use std::fmt::Write;

/// `bytes` as printable text: UTF-8 characters that print are kept; control characters,
/// bytes that are not UTF-8 and the backslash are written `\xNN` (`\\`), so a name never
/// moves a terminal's cursor or splits a log line, and two different names never show
/// the same.
pub fn escaped(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                c if c.is_control() => {
                    let mut buf = [0u8; 4];
                    for b in c.encode_utf8(&mut buf).bytes() {
                        let _infallible = write!(out, "\\x{b:02x}");
                    }
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            let _infallible = write!(out, "\\x{b:02x}");
        }
    }
    out
}

/// `text` escaped as [`escaped`] does (for names already held as strings: a cgroup path,
/// a unit).
pub fn escaped_str(text: &str) -> String {
    escaped(text.as_bytes())
}

/// A cgroup path as appease writes it (relative to the hierarchy's root, as in
/// /proc/PID/cgroup): starts with `/`, no empty, `.` or `..` component, no NUL. Any other
/// byte may be in a name a delegated user gave their group. Anything else read back (a
/// forged or damaged journal) is not acted on.
pub fn valid_cgroup_path(path: &str) -> bool {
    let Some(rest) = path.strip_prefix('/') else {
        return false;
    };
    if path.len() > 4096 || path.contains('\0') {
        return false;
    }
    rest.is_empty()
        || rest
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != ".." && c.len() <= 255)
}

/// The unit types a cgroup path can name (systemd.unit(5)).
const UNIT_SUFFIXES: &[&str] = &[
    ".service",
    ".scope",
    ".slice",
    ".socket",
    ".mount",
    ".swap",
    ".timer",
    ".path",
    ".target",
    ".device",
    ".automount",
];

/// A systemd unit name (systemd.unit(5)): letters, digits and `:_.\@-`, at most 255
/// bytes, one of the unit types' suffixes, something before it.
pub fn valid_unit_name(unit: &str) -> bool {
    let allowed = |c: char| c.is_ascii_alphanumeric() || ":_.\\@-".contains(c);
    unit.len() <= 255
        && unit.chars().all(allowed)
        && UNIT_SUFFIXES
            .iter()
            .any(|s| unit.len() > s.len() && unit.ends_with(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_names_print_escaped_and_stay_distinct() {
        assert_eq!(escaped(b"nginx"), "nginx");
        assert_eq!(escaped("café ✓".as_bytes()), "café ✓");
        assert_eq!(escaped(b"a\xffb"), "a\\xffb");
        assert_eq!(escaped(b"x\x1b[2Jy\n"), "x\\x1b[2Jy\\x0a");
        assert_eq!(
            escaped(b"\\xff"),
            "\\\\xff",
            "a literal backslash is not an escape"
        );
        assert_ne!(escaped(b"\\xff"), escaped(b"\xff"));
        assert_eq!(
            escaped("\u{9b}".as_bytes()),
            "\\xc2\\x9b",
            "C1 controls too"
        );
    }

    #[test]
    fn only_well_formed_cgroup_paths_pass() {
        for ok in [
            "/",
            "/appease.batch",
            "/a\nb",
            "/system.slice/nginx.service",
            "/a b/c",
        ] {
            assert!(valid_cgroup_path(ok), "{ok}");
        }
        for bad in [
            "",
            "appease.batch",
            "/../etc",
            "/a/../../b",
            "/a//b",
            "/a/./b",
            "/a/",
            "/a\0b",
        ] {
            assert!(!valid_cgroup_path(bad), "{bad:?}");
        }
    }

    #[test]
    fn only_unit_names_pass() {
        for ok in [
            "postgresql.service",
            "session-3.scope",
            "user-1000.slice",
            "getty@tty1.service",
            "system-systemd\\x2dfsck.slice",
        ] {
            assert!(valid_unit_name(ok), "{ok}");
        }
        for bad in [
            "",
            ".service",
            "nginx",
            "a/b.service",
            "../x.service",
            "a b.service",
            "x.exe",
        ] {
            assert!(!valid_unit_name(bad), "{bad:?}");
        }
        assert!(!valid_unit_name(&format!("{}.service", "a".repeat(250))));
    }
}
