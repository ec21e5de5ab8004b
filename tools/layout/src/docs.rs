//! Docs as built: every repository path the documentation cites exists.
//!
//! The Markdown files of the repository (the root's, `docs/`, `deploy/`, `tests/`) name files
//! and directories in two ways: in code spans (`` `core/src/iris/probe.rs` ``) and as link
//! targets (`[log](docs/benchmarks/log.md#…)`). A code span counts when it starts with a
//! top-level directory of the repository ([`TOP_LEVEL`]); a link counts when it is relative
//! (resolved from the Markdown file's directory). A line number (`:123`, `:12-34`) or an
//! anchor (`#…`) after the path is dropped; spans with a wildcard, a brace list, a
//! placeholder (`<…>`, `$…`, `…`) or a space are patterns, not paths, and are skipped.

use std::path::{Path, PathBuf};

use super::repo_root;

/// The top-level directories a cited path may start with.
const TOP_LEVEL: &[&str] = &[
    "core/",
    "extension/",
    "coordinator/",
    "gpu/",
    "tools/",
    "tests/",
    "scripts/",
    "deploy/",
    "docs/",
    ".ci/",
];

/// Directories whose Markdown is not the project's own text.
const SKIPPED_DIRS: &[&str] = &["target", ".git", "node_modules"];

/// Every `.md` file of the repository, sorted (build output and VCS data skipped).
fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("read {dir:?}: {e}"));
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                if !SKIPPED_DIRS.contains(&name.as_str()) {
                    stack.push(path);
                }
            } else if name.ends_with(".md") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// A citation found in a Markdown file: the path as written (trimmed) and whether it is a
/// link target (resolved from the file's directory) or a code span (from the root).
#[derive(Debug, PartialEq, Eq)]
struct Cited {
    path: String,
    link: bool,
}

/// Drops a trailing line reference or anchor and trailing punctuation.
fn trimmed(raw: &str) -> &str {
    let mut path = raw.split('#').next().unwrap_or("");
    // `file.rs:123` or `file.rs:12-34`.
    if let Some((head, tail)) = path.rsplit_once(':') {
        if !tail.is_empty() && tail.chars().all(|c| c.is_ascii_digit() || c == '-') {
            path = head;
        }
    }
    path.trim_end_matches(['.', ',', ';', ')'])
}

/// Whether `text` is a pattern or placeholder rather than one path.
fn is_pattern(text: &str) -> bool {
    text.is_empty()
        || text
            .chars()
            .any(|c| matches!(c, '*' | '{' | '}' | '<' | '>' | '$' | ' ' | '…' | '|' | '?'))
        || text.contains("...")
}

/// The paths cited by one Markdown text.
fn citations(markdown: &str) -> Vec<Cited> {
    let mut out = Vec::new();
    let mut in_fence = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        // Code spans: the text between pairs of backticks.
        for (i, span) in line.split('`').enumerate() {
            if i % 2 == 1 && TOP_LEVEL.iter().any(|t| span.starts_with(t)) {
                let path = trimmed(span);
                if !is_pattern(path) {
                    out.push(Cited {
                        path: path.to_owned(),
                        link: false,
                    });
                }
            }
        }
        // Link targets: `](target)` outside code spans.
        let outside: String = line
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 0)
            .map(|(_, s)| s)
            .collect::<Vec<_>>()
            .join(" ");
        for piece in outside.split("](").skip(1) {
            let target = piece.split(')').next().unwrap_or("");
            let target = target.split_whitespace().next().unwrap_or("");
            if target.contains("://") || target.starts_with('#') || target.starts_with("mailto:") {
                continue;
            }
            let path = trimmed(target);
            if !is_pattern(path) {
                out.push(Cited {
                    path: path.to_owned(),
                    link: true,
                });
            }
        }
    }
    out
}

#[test]
fn every_path_cited_in_the_docs_exists() {
    let root = repo_root();
    let mut missing = Vec::new();
    let files = markdown_files(&root);
    assert!(files.len() >= 10, "too few Markdown files found: {files:?}");
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("read {file:?}: {e}"));
        let dir = file.parent().unwrap_or(&root);
        for cited in citations(&text) {
            let base = if cited.link { dir } else { root.as_path() };
            if !base.join(&cited.path).exists() {
                let rel = file.strip_prefix(&root).unwrap_or(file);
                missing.push(format!("{}: {}", rel.display(), cited.path));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "the docs cite {} path(s) that do not exist:\n  {}",
        missing.len(),
        missing.join("\n  ")
    );
}

#[test]
fn the_docs_checker_sees_what_it_must() {
    let text = "See `core/src/iris/probe.rs:12` and `extension/src/lib.rs#L3`, not `src/x.rs`.\n\
         A [log](docs/benchmarks/log.md#faces) and [web](https://example.org/a.md), [here](#x).\n\
         Patterns: `core/src/*.rs`, `core/src/{a,b}.rs`, `deploy/<party>/x`, `core/ and more`.\n\
         ```\n`core/in/a/fence.rs`\n```\n\
         A span `coordinator/src/main.rs`, then a link [b](../../README.md).\n";
    let found = citations(text);
    let paths: Vec<(&str, bool)> = found.iter().map(|c| (c.path.as_str(), c.link)).collect();
    assert_eq!(
        paths,
        vec![
            ("core/src/iris/probe.rs", false),
            ("extension/src/lib.rs", false),
            ("docs/benchmarks/log.md", true),
            ("coordinator/src/main.rs", false),
            ("../../README.md", true),
        ]
    );
    // A missing file is caught: the check is not vacuous.
    let root = repo_root();
    assert!(root.join("core/src/lib.rs").exists());
    assert!(!root.join("core/src/no_such_file.rs").exists());
}
