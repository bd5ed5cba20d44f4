//! The tables the pages mark as generated are what their result files give: each sits
//! between `<!-- generated: appease ARGS -->` and `<!-- end generated -->`, and is the
//! output of `appease ARGS` run at the repository's root (`scripts/results.sh --tables`
//! writes them).

use super::*;

const OPEN: &str = "<!-- generated: appease ";
const CLOSE: &str = "<!-- end generated -->";

/// A generated block: the command's arguments, its first line's number (1-based) and the
/// text between the markers.
struct Block {
    args: Vec<String>,
    first_line: usize,
    body: String,
}

fn blocks(text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((i, line)) = lines.next() {
        let Some(rest) = line.strip_prefix(OPEN) else {
            continue;
        };
        let args = rest
            .trim_end_matches("-->")
            .split_whitespace()
            .map(str::to_string)
            .collect();
        let body: Vec<&str> = lines
            .by_ref()
            .map(|(_, l)| l)
            .take_while(|l| *l != CLOSE)
            .collect();
        out.push(Block {
            args,
            first_line: i + 2,
            body: body.join("\n") + "\n",
        });
    }
    out
}

fn render(args: &[String]) -> String {
    let out = std::process::Command::new(BIN)
        .args(args)
        .current_dir(repo())
        .output()
        .unwrap();
    assert!(out.status.success(), "appease {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// The first line and cell where `page`'s block differs from `fresh`, said as a reader
/// would look for it; None when they agree.
fn difference(page: &str, block: &Block, fresh: &str) -> Option<String> {
    let (old, new): (Vec<&str>, Vec<&str>) =
        (block.body.lines().collect(), fresh.lines().collect());
    for i in 0..old.len().max(new.len()) {
        let (o, n) = (
            old.get(i).copied().unwrap_or(""),
            new.get(i).copied().unwrap_or(""),
        );
        if o == n {
            continue;
        }
        let line = block.first_line + i;
        let (oc, nc): (Vec<&str>, Vec<&str>) = (o.split('|').collect(), n.split('|').collect());
        let cell = (0..oc.len().max(nc.len())).find(|&c| oc.get(c) != nc.get(c));
        let (row, header) = (
            oc.get(1).unwrap_or(&"").trim(),
            column_header(&old[..i], cell),
        );
        return Some(match cell {
            Some(c) if oc.len() > 2 && oc.len() == nc.len() => format!(
                "{page} line {line}, row {row}, column {header:?}: the page says {:?}, the result files {:?} (appease {})",
                oc[c].trim(),
                nc[c].trim(),
                block.args.join(" ")
            ),
            _ => format!(
                "{page} line {line}: the page says {o:?}, the result files {n:?} (appease {})",
                block.args.join(" ")
            ),
        });
    }
    None
}

/// The header cell above column `cell` of the table whose lines end at `above`.
fn column_header(above: &[&str], cell: Option<usize>) -> String {
    let header = above
        .iter()
        .rev()
        .take_while(|l| l.starts_with('|'))
        .last()
        .copied()
        .unwrap_or("");
    cell.and_then(|c| header.split('|').nth(c))
        .unwrap_or("")
        .trim()
        .to_string()
}

#[test]
fn every_generated_table_in_the_docs_is_what_its_result_files_give() {
    let mut seen = 0;
    for (path, text) in pages() {
        let page = path.strip_prefix(repo()).unwrap().display().to_string();
        for block in blocks(&text) {
            seen += 1;
            if let Some(d) = difference(&page, &block, &render(&block.args)) {
                panic!("{d}; `scripts/results.sh --tables` writes the tables again");
            }
        }
    }
    assert!(seen > 0, "no generated table in the docs");
}

#[test]
fn a_figure_changed_in_a_result_file_is_named_by_page_and_cell() {
    let results = std::fs::read_to_string(repo().join("docs/RESULTS.md")).unwrap();
    let block = blocks(&results)
        .into_iter()
        .find(|b| b.args.iter().any(|a| a.ends_with("db-clients.json")))
        .expect("the db sweep's generated table");
    let file = repo().join("docs/results/db-clients.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let point = &mut json["series"][0]["points"][0];
    let was = point["completion_s"].as_f64().unwrap();
    point["completion_s"] = (was + 10.0).into();
    let dir = std::env::temp_dir().join(format!("appease-docs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let changed = dir.join("db-clients.json");
    std::fs::write(&changed, json.to_string()).unwrap();
    let args: Vec<String> = block
        .args
        .iter()
        .map(|a| match a.ends_with("db-clients.json") {
            true => changed.display().to_string(),
            false => a.clone(),
        })
        .collect();
    let said = difference("docs/RESULTS.md", &block, &render(&args));
    std::fs::remove_dir_all(&dir).unwrap();
    let said = said.expect("the changed figure is caught");
    let (variant, clients) = (
        json["series"][0]["variant"].as_str().unwrap().to_string(),
        json["series"][0]["points"][0]["clients"].to_string(),
    );
    assert!(said.starts_with("docs/RESULTS.md line "), "{said}");
    assert!(
        said.contains(&format!("row {clients}, column {variant:?}")),
        "{said}"
    );
    assert!(said.contains(&format!("{:.2}", was + 10.0)), "{said}");
}

#[test]
fn a_runs_file_shows_its_command_date_and_table_and_one_that_lacks_them_is_named() {
    let kept = repo().join("docs/results/synthetic.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&kept).unwrap()).unwrap();
    let shown = render(&["bench-table".to_string(), kept.display().to_string()]);
    let (command, date) = (
        json["measured"]["command"].as_str().unwrap(),
        json["measured"]["date"].as_str().unwrap(),
    );
    assert!(command.starts_with("appease bench synthetic"), "{command}");
    assert!(
        shown.starts_with(&format!("`{command}` ({date}):\n\n")),
        "{shown}"
    );
    assert!(shown.contains("\n| mode | mean | p50 |"), "{shown}");
    for mode in json["modes"].as_array().unwrap() {
        let name = mode["mode"].as_str().unwrap();
        let p99 = format!("{:.2}", mode["latency_ms"]["p99"].as_f64().unwrap());
        let row = shown
            .lines()
            .find(|l| l.starts_with(&format!("| {name} |")))
            .unwrap_or_else(|| panic!("no row of {name} in {shown}"));
        assert_eq!(row.split(" | ").nth(4), Some(p99.as_str()), "{row}");
    }
    let dir = TempDir::new("bench-table");
    json.as_object_mut().unwrap().remove("measured");
    let old = dir.file("old.json", &json.to_string());
    fails_saying(
        Command::new(BIN).arg("bench-table").arg(&old),
        &format!(
            "{} does not say when and how it was measured",
            old.display()
        ),
    );
    fails_saying(
        Command::new(BIN)
            .arg("bench-table")
            .arg(&kept)
            .arg(repo().join("docs/results/db-clients.json")),
        "a client sweep's result file is shown only with other client sweeps' files",
    );
}
