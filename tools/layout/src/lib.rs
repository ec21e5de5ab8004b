//! privmatch-layout: the layout rules of the repository, checked on the source text (no cluster needed):
//!
//! 1. **A modality imports shared layers only.** A file under `src/<modality>/` of any crate
//!    (modalities: `iris`, `face`, `paillier`) names no other modality, neither of its own
//!    crate (`crate::face`) nor of core or the API (`privmatch_core::face`,
//!    `privmatch_api::face`).
//! 2. **Shared layers import no modality**, except the few files whose job is to compose the
//!    modalities (listed in [`COMPOSERS`] with the reason).
//! 3. **No import circle between files**: the graph of `use crate::…` / `super::…` edges
//!    between the files of a crate has no cycle.
//!
//! 4. **Docs as built**: every repository path the Markdown cites exists ([`docs`]).
//!
//! Rules 1 and 2 hold for test modules too; rule 3 looks at production code only (the
//! `#[cfg(test)]` modules at the end of a file are cut off: a test may import its parent's
//! siblings). A rule broken fails with the file, the offending path and the rule.

#![cfg(test)]

mod docs;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The crates whose `src/` follows the layout.
const CRATES: &[&str] = &["core", "api", "gpu", "extension", "coordinator"];

/// The modalities: directories `src/<name>/` and modules `crate::<name>`.
const MODALITIES: &[&str] = &["iris", "face", "paillier"];

/// Shared-layer files allowed to name modalities, with why. A path ending in `/` allows a
/// whole directory.
const COMPOSERS: &[(&str, &str, &str)] = &[
    (
        "coordinator",
        "src/main.rs",
        "the command tree names every modality's subcommands",
    ),
    (
        "coordinator",
        "src/server/routes.rs",
        "the one place that composes the modalities' HTTP routes",
    ),
    (
        "coordinator",
        "src/dev/",
        "developer tooling (local cluster, benchmarks) exercises every modality",
    ),
    (
        "extension",
        "src/engine/worker.rs",
        "the engine worker's dispatch hands each request to its modality's service",
    ),
];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every `.rs` file below `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = std::fs::read_dir(&d).unwrap_or_else(|e| panic!("read {d:?}: {e}"));
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The source with comments and string/char literals blanked out; unless `with_tests`, the
/// `#[cfg(test)]` modules at the end of the file are cut off.
fn code_only(source: &str, with_tests: bool) -> String {
    let test_modules = [
        "#[cfg(test)]\nmod tests",
        "#[cfg(test)]\nmod test_support",
        "#[cfg(test)]\npub(crate) mod test_support",
    ];
    let cut = test_modules
        .iter()
        .filter(|_| !with_tests)
        .filter_map(|m| source.find(m))
        .min()
        .unwrap_or(source.len());
    let bytes = &source.as_bytes()[..cut];
    let mut out = String::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let rest = &bytes[i..];
        if rest.starts_with(b"//") {
            while i < bytes.len() && bytes[i] != b'\n' {
                i += 1;
            }
        } else if rest.starts_with(b"/*") {
            i += 2;
            while i + 1 < bytes.len() && !(bytes[i] == b'*' && bytes[i + 1] == b'/') {
                i += 1;
            }
            i += 2;
        } else if bytes[i] == b'"' {
            i += 1;
            while i < bytes.len() && bytes[i] != b'"' {
                i += if bytes[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else {
            out.push(bytes[i] as char);
            i += 1;
        }
    }
    out
}

/// The module path of a file below `src/`: `src/iris/enroll.rs` → `[iris, enroll]`,
/// `src/iris/mod.rs` → `[iris]`, `src/lib.rs` → `[]`.
fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .skip(1)
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs");
    if !matches!(stem, "mod" | "lib" | "main") {
        parts.push(stem.to_owned());
    }
    parts
}

/// Expands a `use` tree (`a::{b, c::{d, e}}`) into its paths.
fn expand_use(tree: &str) -> Vec<String> {
    let tree: String = tree.chars().filter(|c| !c.is_whitespace()).collect();
    let Some(open) = tree.find('{') else {
        return vec![tree];
    };
    let prefix = &tree[..open];
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|p| !p.is_empty())
        .flat_map(|p| expand_use(&format!("{prefix}{p}")))
        .collect()
}

/// Every path the code names that starts at `crate`, `super`, `self` or `privmatch_core`.
fn named_paths(code: &str) -> Vec<String> {
    let mut paths = Vec::new();
    // `use` statements, braces expanded.
    for stmt in code.split(';') {
        let stmt = stmt.trim_start();
        let body = stmt
            .strip_prefix("pub(crate) use ")
            .or_else(|| stmt.strip_prefix("pub(super) use "))
            .or_else(|| stmt.strip_prefix("pub use "))
            .or_else(|| stmt.strip_prefix("use "));
        if let Some(body) = body {
            paths.extend(expand_use(body));
        }
    }
    // Paths written inline (`crate::iris::enroll::Eye` in an expression or a type).
    let bytes = code.as_bytes();
    for root in ["crate::", "super::", "privmatch_core::"] {
        let mut from = 0;
        while let Some(pos) = code[from..].find(root) {
            let start = from + pos;
            from = start + root.len();
            if start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_') {
                continue;
            }
            let end = code[start..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .map_or(code.len(), |e| start + e);
            paths.push(code[start..end].trim_end_matches(':').to_owned());
        }
    }
    paths
}

/// The module path a `crate`/`super`/`self` path points into, seen from `module`
/// (`None` for paths into other crates).
fn absolute(module: &[String], path: &str) -> Option<Vec<String>> {
    let mut parts = path.split("::").map(str::to_owned).collect::<Vec<_>>();
    let mut base: Vec<String> = match parts.first().map(String::as_str) {
        Some("crate") => Vec::new(),
        Some("self") => module.to_vec(),
        Some("super") => {
            let mut b = module.to_vec();
            let mut supers = 0;
            while parts.get(supers).is_some_and(|p| p == "super") {
                supers += 1;
            }
            for _ in 0..supers {
                b.pop();
            }
            parts.drain(..supers - 1);
            b
        }
        _ => return None,
    };
    parts.remove(0);
    base.extend(parts);
    Some(base)
}

/// The file a module path resolves to: the longest prefix that is a file of the crate.
fn file_of(src: &Path, module: &[String]) -> Option<PathBuf> {
    (1..=module.len()).rev().find_map(|n| {
        let joined: PathBuf = module[..n].iter().collect();
        let as_file = src.join(&joined).with_extension("rs");
        let as_dir = src.join(&joined).join("mod.rs");
        [as_file, as_dir].into_iter().find(|p| p.is_file())
    })
}

/// The modality a module path belongs to, if any: the first segment that names one, so
/// `crate::iris::enroll` and a modality's file in a shared directory (`engine/face/`,
/// `dev/bench/iris.rs`) alike.
fn modality(module: &[String]) -> Option<&'static str> {
    module
        .iter()
        .find_map(|part| MODALITIES.iter().copied().find(|m| m == part))
}

/// The modality that a path into a shared crate (`privmatch_core::…`, `privmatch_api::…`)
/// names, if any.
fn core_modality(path: &str) -> Option<&'static str> {
    let rest = path
        .strip_prefix("privmatch_core::")
        .or_else(|| path.strip_prefix("privmatch_api::"))?;
    let first = rest.split("::").next()?;
    MODALITIES.iter().copied().find(|m| *m == first)
}

fn composer(krate: &str, rel: &str) -> bool {
    COMPOSERS.iter().any(|(c, path, _)| {
        *c == krate && (rel == *path || (path.ends_with('/') && rel.starts_with(path)))
    })
}

struct CrateScan {
    violations: Vec<String>,
    edges: BTreeMap<PathBuf, BTreeSet<PathBuf>>,
}

fn scan_crate(krate: &str) -> CrateScan {
    let root = repo_root().join(krate);
    let src = root.join("src");
    let mut violations = Vec::new();
    let mut edges: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
    for file in rust_files(&src) {
        let rel = file
            .strip_prefix(&root)
            .expect("below the crate")
            .to_path_buf();
        let rel_text = rel.to_string_lossy().replace('\\', "/");
        let module = module_of(&rel);
        let own = modality(&module);
        let source = std::fs::read_to_string(&file).expect("read source");
        let targets = edges.entry(file.clone()).or_default();
        for path in named_paths(&code_only(&source, false)) {
            let target = absolute(&module, &path).and_then(|abs| file_of(&src, &abs));
            if let Some(target) = target.filter(|t| *t != file) {
                targets.insert(target);
            }
        }
        for path in named_paths(&code_only(&source, true)) {
            let named = match absolute(&module, &path) {
                Some(abs) => modality(&abs),
                None => core_modality(&path),
            };
            let Some(named) = named else { continue };
            match own {
                Some(own) if own != named => violations.push(format!(
                    "{krate}/{rel_text}: the {own} modality names the {named} modality ({path}); \
                     a modality imports shared layers only"
                )),
                None if !composer(krate, &rel_text) => violations.push(format!(
                    "{krate}/{rel_text}: a shared layer names the {named} modality ({path}); \
                     move the code into the modality or make the shared code generic"
                )),
                _ => {}
            }
        }
    }
    CrateScan { violations, edges }
}

/// The strongly connected components with more than one file (Tarjan).
fn cycles(edges: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    struct Tarjan<'a> {
        edges: &'a BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        index: BTreeMap<&'a PathBuf, usize>,
        low: BTreeMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        on_stack: BTreeSet<&'a PathBuf>,
        found: Vec<Vec<PathBuf>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a PathBuf) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.edges.get(v).into_iter().flatten() {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if self.on_stack.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut t = Tarjan {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.found
}

#[test]
fn modalities_import_shared_layers_only_and_shared_layers_no_modality() {
    let violations: BTreeSet<String> = CRATES
        .iter()
        .flat_map(|krate| scan_crate(krate).violations)
        .collect();
    assert!(
        violations.is_empty(),
        "layout rules broken:\n{}",
        violations.into_iter().collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn no_import_circle_between_files() {
    let mut report = Vec::new();
    for krate in CRATES {
        let root = repo_root();
        for cycle in cycles(&scan_crate(krate).edges) {
            let names: Vec<String> = cycle
                .iter()
                .map(|p| p.strip_prefix(&root).unwrap_or(p).display().to_string())
                .collect();
            report.push(format!("{krate}: {}", names.join(" <-> ")));
        }
    }
    assert!(
        report.is_empty(),
        "files that import each other (directly or through others):\n{}",
        report.join("\n")
    );
}

#[test]
fn the_checker_sees_what_it_must() {
    // The rules are only as good as the path extraction: pin it on known inputs.
    let source = "use crate::{iris::enroll::{Eye, IrisEnrollBundle}, wire::envelope};\n\
         // use crate::face::hidden;\n\
         let s = \"crate::face::in_a_string\";\n\
         fn f() -> privmatch_core::face::FaceError { super::x::y() }\n\
         #[cfg(test)]\nmod tests { use crate::face::x; }\n";
    let paths = named_paths(&code_only(source, false));
    assert!(
        paths.contains(&"crate::iris::enroll::Eye".to_owned()),
        "{paths:?}"
    );
    assert!(
        paths.contains(&"crate::wire::envelope".to_owned()),
        "{paths:?}"
    );
    assert!(
        paths.contains(&"privmatch_core::face::FaceError".to_owned()),
        "{paths:?}"
    );
    assert!(paths.contains(&"super::x::y".to_owned()), "{paths:?}");
    assert!(
        !paths
            .iter()
            .any(|p| p.contains("hidden") || p.contains("in_a_string")),
        "comments and strings do not count: {paths:?}"
    );
    assert!(!paths.iter().any(|p| p == "crate::face::x"), "{paths:?}");
    let with_tests = named_paths(&code_only(source, true));
    assert!(
        with_tests.iter().any(|p| p == "crate::face::x"),
        "test modules count for the modality rules: {with_tests:?}"
    );
    let m = vec!["face".to_owned(), "enroll".to_owned()];
    assert_eq!(
        absolute(&m, "super::FaceError"),
        Some(vec!["face".to_owned(), "FaceError".to_owned()])
    );
    assert_eq!(
        absolute(&m, "crate::iris::x"),
        Some(vec!["iris".to_owned(), "x".to_owned()])
    );
    assert_eq!(
        core_modality("privmatch_core::iris::params::SearchMode"),
        Some("iris")
    );
    assert_eq!(core_modality("privmatch_core::wire::session"), None);
    assert_eq!(
        core_modality("privmatch_api::face::FaceVerifyBody"),
        Some("face")
    );
    assert_eq!(core_modality("privmatch_api::ErrorCode"), None);
    let mut edges = BTreeMap::new();
    let (a, b, c) = (PathBuf::from("a"), PathBuf::from("b"), PathBuf::from("c"));
    edges.insert(a.clone(), BTreeSet::from([b.clone()]));
    edges.insert(b.clone(), BTreeSet::from([c.clone()]));
    edges.insert(c.clone(), BTreeSet::from([a.clone()]));
    assert_eq!(cycles(&edges), vec![vec![a.clone(), b.clone(), c.clone()]]);
    edges.insert(c, BTreeSet::new());
    assert!(cycles(&edges).is_empty());
}
