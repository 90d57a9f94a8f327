//! The source tree's layering, checked: the core stays pure (no Kubernetes client or API types,
//! no async runtime, no clock, no environment), the cluster edge never reaches into the shell,
//! and no two modules depend on each other, directly or round a cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// What the core's product code may not name (its tests may, e.g. `std::env` to find the
/// checkout). Reading policy files (`std::fs`) stays allowed: the loader's input is the files,
/// and its errors name them.
const NOT_IN_CORE: &[&str] = &[
    "kube",
    "k8s_openapi",
    "k8s_metrics",
    "tokio",
    "futures",
    "http",
    "crate::cluster",
    "crate::execute",
    "crate::report",
    "crate::cli",
    "Utc::now",
    "Local::now",
    "SystemTime",
    "Instant",
    "std::env",
    "std::net",
];

const SHELL: &[&str] = &["crate::execute", "crate::report", "crate::cli"];

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The file's code without comments and string contents (the tree has no block comments), so
/// that a comment or a message naming `kube` is not a dependency.
fn code(path: &Path) -> String {
    strip(&std::fs::read_to_string(path).unwrap())
}

fn strip(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    // In a string: the closing sequence (`"`, or `"#` for a raw string).
    let mut closing: Option<&str> = None;
    while let Some(c) = chars.next() {
        match closing {
            Some(end) => {
                if c == '\\' && end == "\"" {
                    chars.next();
                } else if c == '"' && (end == "\"" || chars.peek() == Some(&'#')) {
                    if end != "\"" {
                        chars.next();
                    }
                    closing = None;
                    out.push('"');
                }
            }
            None if c == '/' && chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            // A char literal of a quote is not a string.
            None if c == '\'' && chars.peek() == Some(&'"') => {
                out.push_str("'\"");
                chars.next();
            }
            None if c == '"' => {
                closing = Some("\"");
                out.push('"');
            }
            None if c == 'r' && chars.peek() == Some(&'#') => {
                chars.next();
                if chars.peek() == Some(&'"') {
                    chars.next();
                    closing = Some("\"#");
                    out.push('"');
                } else {
                    out.push_str("r#");
                }
            }
            None => out.push(c),
        }
    }
    out
}

/// `code` (already without comments and strings) without its `#[cfg(test)]` items.
fn without_tests(code: &str) -> String {
    let mut out = String::new();
    let mut rest = code;
    while let Some(i) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..i]);
        let item = &rest[i..];
        // The item ends at its first `;` (`mod tests;`) or at the brace closing its first `{`.
        let end = match (item.find(';'), item.find('{')) {
            (Some(semi), Some(open)) if semi < open => semi + 1,
            (_, Some(open)) => {
                let mut depth = 0;
                item[open..]
                    .char_indices()
                    .find_map(|(j, c)| {
                        match c {
                            '{' => depth += 1,
                            '}' => depth -= 1,
                            _ => {}
                        }
                        (depth == 0).then_some(open + j + 1)
                    })
                    .unwrap_or(item.len())
            }
            (Some(semi), None) => semi + 1,
            (None, None) => item.len(),
        };
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

/// A whole-word (or whole-path) occurrence of `name`.
fn mentions(code: &str, name: &str) -> bool {
    let word = |c: char| c.is_alphanumeric() || c == '_';
    code.match_indices(name).any(|(i, _)| {
        let before = code[..i].chars().next_back();
        let after = code[i + name.len()..].chars().next();
        !before.is_some_and(word) && !after.is_some_and(word)
    })
}

/// The module a file belongs to, one level below its layer: `core::plan` for
/// src/core/plan.rs and src/core/plan_tests.rs, `core::policy` for src/core/policy/*.rs,
/// `report` for src/report.rs.
fn module_of(src: &Path, path: &Path) -> String {
    let rel = path.strip_prefix(src).unwrap();
    let parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    let name = |s: &str| s.trim_end_matches("_tests").to_string();
    match parts.as_slice() {
        [file] => name(file),
        [layer, file] if file == "mod" => layer.clone(),
        [layer, file] => format!("{layer}::{}", name(file)),
        [layer, dir, ..] => format!("{layer}::{dir}"),
        [] => unreachable!(),
    }
}

/// The modules `code` (of module `from`) refers to, by `crate::` and `super::` paths.
fn references(from: &str, code: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let layer = from.split("::").next().unwrap_or(from);
    for (prefix, base) in [
        ("crate::", String::new()),
        ("super::", format!("{layer}::")),
    ] {
        for (i, _) in code.match_indices(prefix) {
            let rest: String = code[i + prefix.len()..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            let mut parts = rest.split("::").filter(|p| !p.is_empty());
            let first = parts.next().unwrap_or_default();
            let two = format!("{base}{first}::{}", parts.next().unwrap_or_default());
            let one = format!("{base}{first}");
            let target = if modules.contains(&two) { two } else { one };
            if modules.contains(&target) && target != from {
                out.insert(target);
            }
        }
    }
    out
}

struct Tree {
    files: Vec<(String, PathBuf, String)>,
    graph: BTreeMap<String, BTreeSet<String>>,
}

fn tree() -> Tree {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    sources(&src, &mut paths);
    paths.sort();
    let files: Vec<(String, PathBuf, String)> = paths
        .into_iter()
        .map(|p| (module_of(&src, &p), code(&p), p))
        .map(|(m, c, p)| (m, p, c))
        .collect();
    let modules: BTreeSet<String> = files.iter().map(|(m, ..)| m.clone()).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, _, code) in &files {
        graph
            .entry(module.clone())
            .or_default()
            .extend(references(module, code, &modules));
    }
    Tree { files, graph }
}

#[test]
fn the_core_names_no_client_runtime_clock_or_environment() {
    let tree = tree();
    let mut found = Vec::new();
    for (module, path, code) in &tree.files {
        let test_file = path.to_string_lossy().ends_with("_tests.rs");
        if module.starts_with("core") && !test_file {
            let product = without_tests(code);
            for name in NOT_IN_CORE.iter().filter(|n| mentions(&product, n)) {
                found.push(format!("{} names {name}", path.display()));
            }
        }
    }
    assert!(
        tree.files.iter().any(|(m, ..)| m == "core::plan"),
        "the core is where the layout says"
    );
    assert!(
        found.is_empty(),
        "the core must stay pure:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_cluster_edge_does_not_reach_into_the_shell() {
    let tree = tree();
    let mut found = Vec::new();
    for (module, path, code) in &tree.files {
        if module.starts_with("cluster") {
            for name in SHELL.iter().filter(|n| mentions(code, n)) {
                found.push(format!("{} names {name}", path.display()));
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn no_module_depends_on_itself_round_a_cycle() {
    let graph = tree().graph;
    // Depth-first search; a module met again on the current path closes a cycle.
    fn visit(
        m: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
        cycles: &mut Vec<String>,
    ) {
        if let Some(i) = path.iter().position(|p| p == m) {
            let mut cycle = path[i..].to_vec();
            cycle.push(m.to_string());
            cycles.push(cycle.join(" -> "));
            return;
        }
        if !done.insert(m.to_string()) {
            return;
        }
        path.push(m.to_string());
        for next in graph.get(m).into_iter().flatten() {
            visit(next, graph, path, done, cycles);
        }
        path.pop();
    }
    let mut cycles = Vec::new();
    let mut done = BTreeSet::new();
    for m in graph.keys() {
        visit(m, &graph, &mut Vec::new(), &mut done, &mut cycles);
    }
    assert!(
        graph["core::plan"].contains("core::model"),
        "the graph sees dependencies: {graph:?}"
    );
    assert!(cycles.is_empty(), "module cycles:\n{}", cycles.join("\n"));
}

/// The checks above see what they look for: a client import and a clock read in product code,
/// but not a name in a comment, a string or a test module.
#[test]
fn the_fence_sees_product_code_only() {
    let product = strip("use kube::Client;\nfn now() { chrono::Utc::now(); }\n");
    assert!(mentions(&without_tests(&product), "kube"));
    assert!(mentions(&without_tests(&product), "Utc::now"));
    let quiet = strip(concat!(
        "// kube is the client\n",
        "const M: &str = \"kube-apiserver\";\n",
        "#[cfg(test)]\nmod tests {\n    fn f() { let _ = std::env::var(\"X\"); { } }\n}\n",
        "#[cfg(test)]\n#[path = \"x_tests.rs\"]\nmod x;\n",
        "fn kept() {}\n",
    ));
    let product = without_tests(&quiet);
    assert!(!mentions(&product, "kube"), "{product}");
    assert!(!mentions(&product, "std::env"), "{product}");
    assert!(product.contains("fn kept()"), "{product}");
}
