//! The docs name only what exists: every relative link points at a file, every
//! `cargo test` names a package, a test binary and tests that exist, every `appease`
//! command is one the binary has.

use std::path::{Path, PathBuf};

use super::*;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// README.md and every page under docs/, with their text.
fn pages() -> Vec<(PathBuf, String)> {
    let root = repo();
    let mut paths = vec![root.join("README.md")];
    for e in std::fs::read_dir(root.join("docs")).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "md") {
            paths.push(e.path());
        }
    }
    paths.sort();
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p, text)
        })
        .collect()
}

/// The targets of the markdown links `[text](target)` in `text`.
fn links(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        if let Some(end) = rest.find(')') {
            out.push(&rest[..end]);
            rest = &rest[end..];
        }
    }
    out
}

#[test]
fn every_relative_link_in_the_docs_points_at_a_file_that_exists() {
    let mut dangling = Vec::new();
    for (page, text) in pages() {
        for target in links(&text) {
            let path = target.split('#').next().unwrap().trim();
            let external = ["http://", "https://", "mailto:"]
                .iter()
                .any(|p| path.starts_with(p));
            if path.is_empty() || external || path.contains(' ') {
                continue;
            }
            if !page.parent().unwrap().join(path).exists() {
                dangling.push(format!("{}: {target}", page.display()));
            }
        }
    }
    assert!(
        dangling.is_empty(),
        "links to nothing:\n{}",
        dangling.join("\n")
    );
}

/// Every `fn` in the workspace's Rust files as `module::name`, with the module named by
/// the file's path (`crates/appease/tests/nested/mod.rs` → `nested`,
/// `crates/actuator/src/in_place/tests.rs` → `in_place::tests`): what a `cargo test`
/// filter is matched against.
fn test_paths(dir: &Path, module: &str, out: &mut Vec<String>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if p.is_dir() {
            if name != "target" && !name.starts_with('.') {
                test_paths(&p, &format!("{module}::{name}"), out);
            }
            continue;
        }
        let Some(stem) = name.strip_suffix(".rs") else {
            continue;
        };
        let module = match stem {
            "mod" | "lib" | "main" => module.to_string(),
            _ => format!("{module}::{stem}"),
        };
        let text = std::fs::read_to_string(&p).unwrap_or_default();
        for line in text.lines() {
            let Some(at) = line.find("fn ") else {
                continue;
            };
            let name: String = line[at + 3..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.push(format!("{module}::{name}"));
            }
        }
    }
}

/// The `## heading` section of a markdown page, up to the next `## ` heading.
fn section<'a>(text: &'a str, heading: &str) -> &'a str {
    let start = text
        .find(&format!("\n## {heading}"))
        .unwrap_or_else(|| panic!("no section {heading:?}"));
    let rest = &text[start + 1..];
    &rest[..rest[3..].find("\n## ").map_or(rest.len(), |e| e + 3)]
}

/// The code spans (`…`) and the lines of fenced code blocks of `text`.
fn code(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            out.push(line.to_string());
            continue;
        }
        out.extend(line.split('`').skip(1).step_by(2).map(str::to_string));
    }
    out
}

/// The packages of the workspace and their test binaries.
fn packages() -> Vec<(String, Vec<String>)> {
    let crates = repo().join("crates");
    let mut out = Vec::new();
    for e in std::fs::read_dir(&crates).unwrap().flatten() {
        let toml = std::fs::read_to_string(e.path().join("Cargo.toml")).unwrap_or_default();
        let Some(name) = toml
            .lines()
            .find_map(|l| l.strip_prefix("name = \""))
            .map(|n| n.trim_end_matches('"').to_string())
        else {
            continue;
        };
        let tests = std::fs::read_dir(e.path().join("tests"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|t| {
                t.file_name()
                    .to_str()?
                    .strip_suffix(".rs")
                    .map(String::from)
            })
            .collect();
        out.push((name, tests));
    }
    out
}

/// What is wrong with one `cargo test …` command, if anything.
fn check_cargo_test(
    cmd: &str,
    packages: &[(String, Vec<String>)],
    paths: &[String],
) -> Vec<String> {
    let words: Vec<&str> = cmd.split_whitespace().collect();
    let mut wrong = Vec::new();
    let package = words
        .windows(2)
        .find(|w| w[0] == "-p")
        .map(|w| w[1].to_string());
    if let Some(p) = &package {
        if !packages.iter().any(|(n, _)| n == p) {
            wrong.push(format!("no package {p}"));
        }
    }
    if let Some(t) = words.windows(2).find(|w| w[0] == "--test").map(|w| w[1]) {
        let has = packages
            .iter()
            .filter(|(n, _)| package.as_ref().is_none_or(|p| p == n))
            .any(|(_, tests)| tests.iter().any(|x| x == t));
        if !has {
            wrong.push(format!("no test binary {t}"));
        }
    }
    let filters = words
        .iter()
        .skip_while(|w| **w != "--")
        .skip(1)
        .take_while(|w| !w.starts_with('#') && !w.contains('|') && !w.contains('>'))
        .filter(|w| !w.starts_with('-') && !w.contains('='));
    for f in filters {
        if !paths.iter().any(|p| p.contains(f)) {
            wrong.push(format!("no test matches {f:?}"));
        }
    }
    wrong
}

/// The `appease` subcommand a command line starts with (`appease status`, `sudo appease
/// daemon`, `./target/release/appease bench …`), if it starts so.
fn subcommand(line: &str) -> Option<&str> {
    let mut words = line
        .split_whitespace()
        .skip_while(|w| *w == "sudo" || *w == "$");
    let first = words.next()?;
    if first != "appease" && !first.ends_with("/appease") {
        return None;
    }
    words
        .next()
        .filter(|w| w.chars().all(|c| c.is_ascii_lowercase() || c == '-'))
}

/// Whether `appease SUB` is a command (hidden ones included).
fn is_command(sub: &str) -> bool {
    Command::new(BIN)
        .args([sub, "--help"])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn every_cargo_test_and_appease_command_named_in_the_docs_exists() {
    let packages = packages();
    let mut known = std::collections::HashMap::new();
    let mut paths = Vec::new();
    test_paths(&repo().join("crates"), "", &mut paths);
    let mut wrong = Vec::new();
    for (page, text) in pages() {
        for span in code(&text) {
            for (i, _) in span.match_indices("cargo test") {
                for w in check_cargo_test(&span[i..], &packages, &paths) {
                    wrong.push(format!("{}: `{}`: {w}", page.display(), span.trim()));
                }
            }
            if let Some(sub) = subcommand(&span) {
                if !*known
                    .entry(sub.to_string())
                    .or_insert_with(|| is_command(sub))
                {
                    wrong.push(format!(
                        "{}: `{}`: no command {sub}",
                        page.display(),
                        span.trim()
                    ));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "the docs name what does not exist:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn a_test_binary_package_or_test_that_does_not_exist_is_caught() {
    let packages = packages();
    let mut paths = Vec::new();
    test_paths(&repo().join("crates"), "", &mut paths);
    let check = |cmd: &str| check_cargo_test(cmd, &packages, &paths);
    assert_eq!(
        check("cargo test --release -p appease --test cli -- docs:: --nocapture"),
        Vec::<String>::new()
    );
    assert_eq!(
        check("cargo test -p appease --test e2e -- no_such_test").len(),
        1
    );
    assert_eq!(check("cargo test -p appease --test nothing").len(), 1);
    assert_eq!(check("cargo test -p appease-nothing").len(), 1);
    assert!(is_command("daemon") && is_command("bench-worker"));
    assert!(!is_command("no-such-command"));
    assert_eq!(subcommand("sudo appease status --json"), Some("status"));
    assert_eq!(subcommand("the appease daemon"), None);
}

/// The words of `text`: runs of letters, digits, `.` and `,` inside a number.
fn tokens(text: &str) -> Vec<&str> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == ','))
        .map(|t| t.trim_matches(|c| c == '.' || c == ','))
        .filter(|t| !t.is_empty())
        .collect()
}

#[test]
fn the_user_pages_carry_no_commit_hash() {
    let root = repo();
    let mut found = Vec::new();
    for page in ["README.md", "docs/RESULTS.md", "docs/hosts.md"] {
        let text = std::fs::read_to_string(root.join(page)).unwrap();
        for (n, line) in text.lines().enumerate() {
            for t in tokens(line) {
                let hex = (7..=40).contains(&t.len()) && t.chars().all(|c| c.is_ascii_hexdigit());
                let mixed = t.chars().any(|c| c.is_ascii_digit())
                    && t.chars().any(|c| c.is_ascii_lowercase());
                if hex && mixed && t.chars().all(|c| !c.is_ascii_uppercase()) {
                    found.push(format!("{page}:{}: {t}", n + 1));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "commit hashes (history belongs to git):\n{}",
        found.join("\n")
    );
}

/// The results page stays one a user reads: superseded runs go to git history or
/// docs/findings.md, not below the current ones, and no line but a table's row runs wider
/// than 120 characters (commands in code blocks are wrapped with a trailing backslash).
#[test]
fn the_results_page_stays_under_600_lines_with_the_summary_on_its_first_screen() {
    let text = std::fs::read_to_string(repo().join("docs/RESULTS.md")).unwrap();
    let lines = text.lines().count();
    assert!(lines < 600, "docs/RESULTS.md has {lines} lines");
    let wide: Vec<String> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.starts_with('|') && l.chars().count() > 120)
        .map(|(n, l)| format!("line {}: {} characters", n + 1, l.chars().count()))
        .collect();
    assert!(
        wide.is_empty(),
        "docs/RESULTS.md has lines over 120 characters outside its tables:\n{}",
        wide.join("\n")
    );
    let summary_table = text
        .lines()
        .position(|l| l.starts_with("| scenario: headline |"))
        .expect("the summary table's header");
    assert!(
        summary_table < 30,
        "the summary table starts at line {}",
        summary_table + 1
    );
}

#[test]
fn every_figure_in_the_readmes_results_is_the_one_in_results_md() {
    let root = repo();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let results = std::fs::read_to_string(root.join("docs/RESULTS.md")).unwrap();
    let section = section(&readme, "Results");
    let known: std::collections::HashSet<&str> = tokens(&results).into_iter().collect();
    let figures: Vec<&str> = tokens(section)
        .into_iter()
        .filter(|t| t.chars().next().is_some_and(|c| c.is_ascii_digit()))
        .filter(|t| {
            t.chars()
                .all(|c| c.is_ascii_digit() || c == '.' || c == ',')
        })
        .collect();
    assert!(figures.len() > 30, "the section's figures: {figures:?}");
    let missing: Vec<&&str> = figures.iter().filter(|f| !known.contains(*f)).collect();
    assert!(
        missing.is_empty(),
        "README figures not in RESULTS.md: {missing:?}"
    );
}

#[test]
fn every_command_of_the_results_summary_is_a_row_of_the_results_script() {
    let root = repo();
    let results = std::fs::read_to_string(root.join("docs/RESULTS.md")).unwrap();
    // The rows' commands with the peers (PEER_BIN given) and without them.
    let list = |peers: bool| {
        let mut cmd = std::process::Command::new(root.join("scripts/results.sh"));
        cmd.arg("--list").env_remove("PEER_BIN");
        if peers {
            cmd.env("PEER_BIN", "PEERS");
        }
        let listed = cmd.output().unwrap();
        assert!(listed.status.success(), "{listed:?}");
        String::from_utf8(listed.stdout)
            .unwrap()
            .lines()
            .filter_map(|l| l.split_once(": ").map(|(_, cmd)| cmd.trim().to_string()))
            .collect::<Vec<String>>()
    };
    let script: Vec<String> = [list(true), list(false)].concat();
    let commands: Vec<String> = section(&results, "Summary")
        .lines()
        .filter(|l| l.starts_with("| ["))
        .filter_map(|l| l.trim_end_matches('|').rsplit(" | ").next())
        .filter_map(|cell| code(cell).into_iter().next())
        .map(|cmd| cmd.replace("--peer-bin …", "--peer-bin PEERS"))
        .collect();
    assert!(commands.len() > 15, "the summary's commands: {commands:?}");
    let missing: Vec<&String> = commands.iter().filter(|c| !script.contains(c)).collect();
    assert!(
        missing.is_empty(),
        "summary commands scripts/results.sh does not run: {missing:?}\nit runs: {script:#?}"
    );
}
mod generated;
