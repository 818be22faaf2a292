//! The documentation as a reader meets it: every relative link in the
//! README, the guide, the reports, the design notes, the changelog and the
//! crate READMEs leads to a file (and a heading, where it names one); every
//! code block says its language; every guide page's Rust samples are
//! compiled (it is listed in `src/lib.rs`'s doc-test module); each backend
//! page's URL parameters are its builder's; the README stays short.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn markdown_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            markdown_under(&path, out);
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
}

/// Every Markdown file a reader of the repository or a crate page meets.
fn documents() -> Vec<PathBuf> {
    let root = root();
    let mut files = vec![root.join("README.md"), root.join("CHANGELOG.md")];
    markdown_under(&root.join("docs"), &mut files);
    for entry in std::fs::read_dir(root).expect("the workspace") {
        let readme = entry.expect("a directory entry").path().join("README.md");
        if readme.is_file() && readme.parent() != Some(root) {
            files.push(readme);
        }
    }
    files.sort();
    files
}

/// The text outside code blocks and inline code, line by line.
fn prose(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut in_code = false;
    for (index, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        // Drop inline code spans.
        let mut kept = String::new();
        for (i, part) in line.split('`').enumerate() {
            if i % 2 == 0 {
                kept.push_str(part);
            }
        }
        out.push((index + 1, kept));
    }
    out
}

/// `[text](target)` link targets of one line.
fn links(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        out.push(after[..end].trim().to_owned());
        rest = &after[end..];
    }
    out
}

/// GitHub's anchor for a heading: lower case, spaces to dashes, most
/// punctuation dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(file: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let mut seen = BTreeSet::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if !in_code && line.starts_with('#') {
            let heading = line.trim_start_matches('#').replace('`', "");
            let base = slug(&heading);
            let mut anchor = base.clone();
            let mut n = 1;
            while !seen.insert(anchor.clone()) {
                anchor = format!("{base}-{n}");
                n += 1;
            }
        }
    }
    seen
}

/// `a/b/../c` as `a/c`, without touching the file system.
fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

#[test]
#[allow(clippy::print_stdout, reason = "the count is for a reader of the run")]
fn every_relative_link_leads_somewhere() {
    let mut checked = 0;
    let mut broken = Vec::new();
    for file in documents() {
        let text = std::fs::read_to_string(&file).expect("a Markdown file");
        for (line, content) in prose(&text) {
            for target in links(&content) {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                // A crate's README is its docs.rs page too, where
                // `[Item](path::to::Item)` is an intra-doc link.
                let rust_path =
                    !target.contains('/') && !target.contains('.') && !target.starts_with('#');
                if rust_path
                    && file
                        .parent()
                        .is_some_and(|d| d.join("Cargo.toml").is_file())
                {
                    continue;
                }
                checked += 1;
                let (path, anchor) = match target.split_once('#') {
                    Some((path, anchor)) => (path, Some(anchor)),
                    None => (target.as_str(), None),
                };
                let dest = if path.is_empty() {
                    file.clone()
                } else {
                    normalise(&file.parent().expect("a folder").join(path))
                };
                let place = format!("{}:{line}: {target}", file.display());
                if !dest.starts_with(root()) {
                    broken.push(format!("{place}: leaves the repository"));
                } else if !dest.exists() {
                    broken.push(format!("{place}: no such file"));
                } else if let Some(anchor) = anchor
                    && dest.extension().is_some_and(|e| e == "md")
                    && !anchors(&dest).contains(anchor)
                {
                    broken.push(format!("{place}: no such heading"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    assert!(
        checked >= 50,
        "only {checked} relative links found: the parser lost them"
    );
    println!("{checked} relative links checked");
}

#[test]
fn every_code_block_names_its_language() {
    for file in documents() {
        let text = std::fs::read_to_string(&file).expect("a Markdown file");
        let mut open = false;
        for (index, line) in text.lines().enumerate() {
            if let Some(info) = line.trim_start().strip_prefix("```") {
                if !open {
                    assert!(
                        !info.trim().is_empty(),
                        "{}:{}: a code block without a language (rustdoc would compile it as Rust)",
                        file.display(),
                        index + 1
                    );
                }
                open = !open;
            }
        }
        assert!(!open, "{}: an unclosed code block", file.display());
    }
}

#[test]
fn every_guide_page_is_compiled_by_the_doc_tests() {
    let lib = std::fs::read_to_string(root().join("src/lib.rs")).expect("src/lib.rs");
    let mut pages = Vec::new();
    markdown_under(&root().join("docs/guide"), &mut pages);
    pages.push(root().join("README.md"));
    for page in pages {
        let relative = page.strip_prefix(root()).expect("in the repository");
        let listed = format!("\"../{}\"", relative.display());
        assert!(
            lib.contains(&listed),
            "{} has no entry in src/lib.rs's `guide` doc-test module: its samples would go uncompiled",
            relative.display()
        );
    }
}

/// The parameters of a Markdown table whose first column is
/// `` `parameter` ``.
fn parameters(table_text: &str, header: &str) -> BTreeSet<String> {
    let start = table_text
        .find(header)
        .unwrap_or_else(|| panic!("no table {header:?}"));
    table_text[start..]
        .lines()
        .skip(2)
        .map(|l| l.trim_start_matches("/// "))
        .take_while(|l| l.starts_with('|'))
        .flat_map(|row| {
            let first = row.split(" | ").next().unwrap_or_default().to_owned();
            first
                .split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn backend_pages_list_their_builders_parameters() {
    for (page, source) in [
        (
            "docs/guide/backends/redis.md",
            "lockkit-redis/src/config.rs",
        ),
        (
            "docs/guide/backends/redlock.md",
            "lockkit-redlock/src/config.rs",
        ),
        (
            "docs/guide/backends/zookeeper.md",
            "lockkit-zk/src/config.rs",
        ),
        ("docs/guide/backends/etcd.md", "lockkit-etcd/src/config.rs"),
        ("docs/guide/backends/sql.md", "lockkit-sql/src/config.rs"),
    ] {
        let page_text = std::fs::read_to_string(root().join(page)).expect(page);
        let source_text = std::fs::read_to_string(root().join(source)).expect(source);
        let header = "| parameter | meaning | default |";
        let documented = parameters(&page_text, header);
        let builder = parameters(&source_text, header);
        assert!(!builder.is_empty(), "{source}: no parameter table");
        assert_eq!(documented, builder, "{page} against {source}");
    }
}

#[test]
fn the_readme_stays_short() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= 250,
        "README.md has {lines} lines; the guide is the place for more"
    );
}

#[test]
fn slugs_follow_github() {
    assert_eq!(slug("URLs and features"), "urls-and-features");
    assert_eq!(
        slug("Cluster, Sentinel and WAIT"),
        "cluster-sentinel-and-wait"
    );
    assert_eq!(
        slug("`elect` and `leader`: one leader".replace('`', "").as_str()),
        "elect-and-leader-one-leader"
    );
}
