//! The house rules, kept: no source file in crates/*/src over 900 lines, no function there
//! over 100 lines, no test file over 1,200 lines. A file or a function that grows past them
//! is split by job.

use std::path::{Path, PathBuf};

const MAX_SOURCE_LINES: usize = 900;
const MAX_FUNCTION_LINES: usize = 100;
const MAX_TEST_FILE_LINES: usize = 1_200;

fn crates() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The Rust files below `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The Rust files of every crate's `sub` folder (src or tests).
fn files_in(sub: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(crates()).unwrap().flatten() {
        rust_files(&e.path().join(sub), &mut out);
    }
    out.sort();
    out
}

/// `text` with the insides of comments, strings and character literals blanked, lines
/// kept: what is left of a brace is code.
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let blank = |out: &mut Vec<u8>, s: &[u8]| {
        out.extend(s.iter().map(|&c| if c == b'\n' { b'\n' } else { b' ' }))
    };
    let mut i = 0;
    while i < b.len() {
        let rest = &b[i..];
        let end = if rest.starts_with(b"//") {
            rest.iter().position(|&c| c == b'\n').unwrap_or(rest.len())
        } else if rest.starts_with(b"/*") {
            find(rest, b"*/", 2).map_or(rest.len(), |e| e + 2)
        } else if let Some(hashes) = raw_string_start(b, i) {
            let close: Vec<u8> = std::iter::once(b'"').chain(hashes.1).collect();
            find(rest, &close, hashes.0).map_or(rest.len(), |e| e + close.len())
        } else if rest[0] == b'"' {
            let mut j = 1;
            while j < rest.len() && rest[j] != b'"' {
                j += if rest[j] == b'\\' { 2 } else { 1 };
            }
            (j + 1).min(rest.len())
        } else if rest[0] == b'\'' {
            char_literal(rest).unwrap_or(1)
        } else {
            out.push(rest[0]);
            i += 1;
            continue;
        };
        if rest[0] == b'\'' && end == 1 {
            out.push(b'\''); // a lifetime
        } else {
            blank(&mut out, &rest[..end]);
        }
        i += end;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    (from..hay.len().saturating_sub(needle.len() - 1)).find(|&k| hay[k..].starts_with(needle))
}

/// At a raw string's start (`r"`, `r#"`, `br"`): the length of its opening and its hashes.
fn raw_string_start(b: &[u8], i: usize) -> Option<(usize, Vec<u8>)> {
    if i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_') {
        return None;
    }
    let mut j = i;
    if b.get(j) == Some(&b'b') {
        j += 1;
    }
    if b.get(j) != Some(&b'r') {
        return None;
    }
    j += 1;
    let hashes = b[j..].iter().take_while(|&&c| c == b'#').count();
    (b.get(j + hashes) == Some(&b'"')).then(|| (j + hashes + 1 - i, vec![b'#'; hashes]))
}

/// The length of a character literal at the start of `rest` (`'a'`, `'\n'`, `'\''`,
/// `'\u{1F600}'`), None for a lifetime.
fn char_literal(rest: &[u8]) -> Option<usize> {
    let close = if rest.get(1) == Some(&b'\\') {
        rest.iter().skip(3).position(|&c| c == b'\'')? + 3
    } else {
        let ch = std::str::from_utf8(&rest[1..rest.len().min(5)])
            .ok()
            .or_else(|| std::str::from_utf8(&rest[1..2]).ok())?
            .chars()
            .next()?;
        1 + ch.len_utf8()
    };
    (rest.get(close) == Some(&b'\'')).then_some(close + 1)
}

/// Each `fn` of `text` with its length in lines, from its `fn` line to its closing brace.
fn functions(text: &str) -> Vec<(String, usize, usize)> {
    let code = code_only(text);
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        let t = t.strip_prefix("pub ").unwrap_or(t);
        let t = t.strip_prefix("pub(crate) ").unwrap_or(t);
        let t = t.strip_prefix("pub(super) ").unwrap_or(t);
        let t = t.strip_prefix("const ").unwrap_or(t);
        let t = t.strip_prefix("unsafe ").unwrap_or(t);
        let Some(rest) = t.strip_prefix("fn ") else {
            continue;
        };
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let (mut depth, mut opened) = (0i64, false);
        for (j, l) in lines.iter().enumerate().skip(i) {
            if !opened && l.contains(';') && !l.contains('{') {
                break; // a declaration without a body
            }
            for c in l.chars() {
                match c {
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            if opened && depth == 0 {
                out.push((name.clone(), i + 1, j - i + 1));
                break;
            }
        }
    }
    out
}

#[test]
fn no_source_file_is_over_900_lines_and_no_function_over_100() {
    let mut over = Vec::new();
    for path in files_in("src") {
        let text = std::fs::read_to_string(&path).unwrap();
        let n = text.lines().count();
        if n > MAX_SOURCE_LINES {
            over.push(format!("{}: {n} lines", path.display()));
        }
        for (name, at, len) in functions(&text) {
            if len > MAX_FUNCTION_LINES {
                over.push(format!("{}:{at}: fn {name}, {len} lines", path.display()));
            }
        }
    }
    assert!(over.is_empty(), "split these by job:\n{}", over.join("\n"));
}

#[test]
fn no_test_file_is_over_1200_lines() {
    let over: Vec<String> = files_in("tests")
        .into_iter()
        .filter_map(|p| {
            let n = std::fs::read_to_string(&p).unwrap().lines().count();
            (n > MAX_TEST_FILE_LINES).then(|| format!("{}: {n} lines", p.display()))
        })
        .collect();
    assert!(
        over.is_empty(),
        "split these by topic:\n{}",
        over.join("\n")
    );
}

#[test]
fn function_lengths_are_measured_over_strings_comments_and_lifetimes() {
    let text = r##"
fn short<'a>(x: &'a str) -> &'a str {
    let _brace = '{';
    let _s = "}}}";
    let _r = r#"{"#;
    // }
    x
}

pub(crate) fn declared();

fn long() {
    if true {
        let _ = 1;
    }
}
"##;
    let f = functions(text);
    assert_eq!(
        f,
        vec![("short".to_string(), 2, 7), ("long".to_string(), 12, 5)]
    );
}
