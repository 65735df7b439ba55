//! The house has one-way layers: no module of `src/` depends, directly or through others, on a
//! module that depends on it. `cargo test --test layers` (no network; reads `src/` only).
//!
//! A module is a file of the library (`src/mpi/plan.rs` is `mpi::plan`, `src/serve/mod.rs` is
//! `serve`). It depends on another when its code (comments and `#[cfg(test)]` code left out)
//! names a path into it: `crate::a::b::Item`, `super::…`, `self::…`, or, in a `mod.rs`/`lib.rs`, a child
//! module by name (`router::router`). A parent's `pub mod`/`pub use` of its children is not a
//! dependency: re-exporting is how a layer shows its face. A path resolves to the deepest
//! module it names, so `crate::mpi::plan::MpiPlan` is `mpi::plan` and `crate::mpi::Owner` is
//! `mpi`.
//!
//! Folders are layers too: seen from their parent, a folder (`mpi/jobset_mode/`) and a file
//! beside it (`mpi/plan.rs`), or two folders (`mpi/`, `objects/`), never depend on each other
//! both ways, through any of the modules inside them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a file relative to `src/` (`mpi/plan.rs` → `["mpi", "plan"]`), and
/// whether the file is a directory module (`mod.rs`, `lib.rs`, `main.rs`).
fn module_of(relative: &Path) -> (Vec<String>, bool) {
    let mut parts: Vec<String> = relative
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let is_dir = matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    );
    if is_dir {
        parts.pop();
    }
    (parts, is_dir)
}

/// The code of a file without comments and without its trailing `#[cfg(test)]` module.
fn code(text: &str) -> String {
    let text = text
        .find("#[cfg(test)]\nmod tests {")
        .map_or(text, |i| &text[..i]);
    text.lines()
        .map(|line| line.find("//").map_or(line, |i| &line[..i]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The `::`-separated paths in `code` (each as its segments), with the text of their line.
fn paths(code: &str) -> Vec<(Vec<&str>, &str)> {
    let mut found = Vec::new();
    for line in code.lines() {
        let bytes = line.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            let is_ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
            let starts =
                is_ident(bytes[i]) && (i == 0 || !(is_ident(bytes[i - 1]) || bytes[i - 1] == b':'));
            if !starts {
                i += 1;
                continue;
            }
            let mut end = i;
            let mut segments = Vec::new();
            let mut start = i;
            loop {
                while end < bytes.len() && is_ident(bytes[end]) {
                    end += 1;
                }
                segments.push(&line[start..end]);
                if line[end..].starts_with("::")
                    && line[end + 2..].starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                {
                    end += 2;
                    start = end;
                } else {
                    break;
                }
            }
            if segments.len() > 1 {
                found.push((segments, line));
            }
            i = end.max(i + 1);
        }
    }
    found
}

/// module → the modules it depends on, each with one line that shows why.
fn dependencies(src: &Path) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeMap<Vec<String>, (bool, String)> = files
        .iter()
        // `tests.rs` files are test code; `main.rs` is the binary, a crate of its own.
        .filter(|f| f.file_name().is_some_and(|n| n != "tests.rs") && *f != &src.join("main.rs"))
        .map(|f| {
            let relative = f.strip_prefix(src).expect("under src");
            let (module, is_dir) = module_of(relative);
            let text = std::fs::read_to_string(f).expect("readable");
            (module, (is_dir, code(&text)))
        })
        .collect();
    let known: BTreeSet<&Vec<String>> = modules.keys().collect();
    let mut graph = BTreeMap::new();
    for (module, (is_dir, code)) in &modules {
        let children: BTreeSet<String> = code
            .lines()
            .filter_map(|l| {
                l.trim()
                    .strip_prefix("pub mod ")
                    .or_else(|| l.trim().strip_prefix("mod "))
            })
            .filter_map(|rest| rest.strip_suffix(';'))
            .map(str::to_string)
            .collect();
        let mut edges = BTreeMap::new();
        for (segments, line) in paths(code) {
            let reexport = line.trim_start().starts_with("pub use ")
                || line.trim_start().starts_with("pub(crate) use ");
            let target: Vec<String> = match segments[0] {
                "crate" => segments[1..].iter().map(|s| s.to_string()).collect(),
                "self" | "super" => {
                    // `self` is this module, and each `super` one level up, whether the module
                    // is a file or a directory.
                    let mut base = module.clone();
                    let rest = segments.strip_prefix(&["self"][..]).unwrap_or(&segments);
                    let ups = rest.iter().take_while(|s| **s == "super").count();
                    base.truncate(base.len().saturating_sub(ups));
                    base.into_iter()
                        .chain(rest[ups..].iter().map(|s| s.to_string()))
                        .collect()
                }
                child if *is_dir && children.contains(child) && !reexport => module
                    .iter()
                    .cloned()
                    .chain(segments.iter().map(|s| s.to_string()))
                    .collect(),
                _ => continue,
            };
            let Some(resolved) = (1..=target.len())
                .rev()
                .map(|k| target[..k].to_vec())
                .find(|m| known.contains(m))
            else {
                continue;
            };
            let is_own_child = resolved.len() > module.len() && resolved.starts_with(module);
            if resolved != *module && !(reexport && is_own_child) {
                edges
                    .entry(resolved.join("::"))
                    .or_insert_with(|| line.trim().to_string());
            }
        }
        graph.insert(module.join("::"), edges);
    }
    graph
}

/// Every cycle's modules (strongly connected components of more than one module).
fn cycles(graph: &BTreeMap<String, BTreeMap<String, String>>) -> Vec<Vec<String>> {
    // Reachability is enough at this size (tens of modules).
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.to_string()];
        while let Some(m) = stack.pop() {
            for next in graph.get(&m).into_iter().flat_map(|e| e.keys()) {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let reachable: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|m| (m, reach(m))).collect();
    let mut components: BTreeSet<Vec<String>> = BTreeSet::new();
    for (m, reach) in &reachable {
        let component: Vec<String> = reach
            .iter()
            .filter(|other| reachable.get(other).is_some_and(|r| r.contains(*m)))
            .cloned()
            .collect();
        if component.len() > 1 {
            components.insert(component);
        }
    }
    components.into_iter().collect()
}

/// The graph of `graph`'s modules seen from their folders: for every folder, its entries (the
/// files and folders in it) with an edge from one to another when a module in or under the
/// first depends on a module in or under the second. A folder's own `mod.rs` is no entry of it.
fn folder_graph(
    graph: &BTreeMap<String, BTreeMap<String, String>>,
) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut folders: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for (from, edges) in graph {
        let from_path: Vec<&str> = from.split("::").collect();
        for (to, line) in edges {
            let to_path: Vec<&str> = to.split("::").collect();
            let common = from_path
                .iter()
                .zip(&to_path)
                .take_while(|(a, b)| a == b)
                .count();
            // The entries of the deepest folder holding both, when neither is that folder.
            let (Some(a), Some(b)) = (from_path.get(common), to_path.get(common)) else {
                continue;
            };
            let entry = |name: &str| {
                from_path[..common]
                    .iter()
                    .chain([&name])
                    .copied()
                    .collect::<Vec<_>>()
                    .join("::")
            };
            folders
                .entry(entry(a))
                .or_default()
                .entry(entry(b))
                .or_insert_with(|| format!("{from} -> {to}: {line}"));
            folders.entry(entry(b)).or_default();
        }
    }
    folders
}

#[test]
fn no_folder_depends_on_a_file_or_folder_that_depends_on_it() {
    let graph = dependencies(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let folders = folder_graph(&graph);
    let report: Vec<String> = cycles(&folders)
        .into_iter()
        .map(|cycle| {
            let why: Vec<String> = cycle
                .iter()
                .flat_map(|a| {
                    folders[a]
                        .iter()
                        .filter(|(b, _)| cycle.contains(b))
                        .map(|(_, line)| format!("  {line}"))
                })
                .collect();
            format!("{}\n{}", cycle.join(", "), why.join("\n"))
        })
        .collect();
    assert!(report.is_empty(), "folder cycles:\n{}", report.join("\n"));
}

#[test]
fn no_module_depends_on_a_module_that_depends_on_it() {
    let graph = dependencies(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(graph.contains_key("mpi::plan") && graph["mpi::hostfile"].contains_key("mpi::plan"));
    let report: Vec<String> = cycles(&graph)
        .into_iter()
        .map(|cycle| {
            let why: Vec<String> = cycle
                .iter()
                .flat_map(|a| {
                    graph[a]
                        .iter()
                        .filter(|(b, _)| cycle.contains(b))
                        .map(move |(b, line)| format!("  {a} -> {b}: {line}"))
                })
                .collect();
            format!("{}\n{}", cycle.join(", "), why.join("\n"))
        })
        .collect();
    assert!(report.is_empty(), "import cycles:\n{}", report.join("\n"));
}

/// Writes `files` (path under `src/`, text) into a fresh directory and returns its cycles.
fn cycles_of(files: &[(&str, &str)]) -> Vec<Vec<String>> {
    let dir = tempfile::tempdir().expect("tempdir");
    for (path, text) in files {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }
    cycles(&dependencies(dir.path()))
}

#[test]
fn a_cycle_through_crate_super_or_a_child_name_is_found() {
    let lib = "pub mod a;\npub mod b;\n";
    assert_eq!(
        cycles_of(&[
            ("lib.rs", lib),
            ("a.rs", "use crate::b::B;\npub struct A;\n"),
            (
                "b.rs",
                "// crate::a::A in a comment does not count\nuse super::a::A;\n"
            ),
        ]),
        [vec!["a".to_string(), "b".to_string()]]
    );
    // A parent that calls into its child, whose child uses the parent's item.
    assert_eq!(
        cycles_of(&[
            ("lib.rs", "pub mod p;\n"),
            (
                "p/mod.rs",
                "mod c;\npub const K: u8 = 1;\nfn f() { c::g() }\n"
            ),
            ("p/c.rs", "pub fn g() { let _ = super::K; }\n"),
        ]),
        [vec!["p".to_string(), "p::c".to_string()]]
    );
}

#[test]
fn a_cycle_between_folders_is_found_though_no_module_cycle_is() {
    let files = [
        ("lib.rs", "pub mod a;\npub mod b;\n"),
        ("a/mod.rs", "pub mod low;\npub mod high;\n"),
        ("a/low.rs", "pub struct Low;\n"),
        ("a/high.rs", "use crate::b::B;\n"),
        ("b/mod.rs", "use crate::a::low::Low;\npub struct B;\n"),
    ];
    assert!(cycles_of(&files).is_empty());
    let dir = tempfile::tempdir().expect("tempdir");
    for (path, text) in files {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }
    assert_eq!(
        cycles(&folder_graph(&dependencies(dir.path()))),
        [vec!["a".to_string(), "b".to_string()]]
    );
}

#[test]
fn re_exports_tests_and_one_way_uses_are_no_cycle() {
    assert!(
        cycles_of(&[
            ("lib.rs", "pub mod p;\n"),
            (
                "p/mod.rs",
                "mod c;\nmod d;\npub use c::C;\npub const K: u8 = 1;\n"
            ),
            ("p/c.rs", "use super::K;\nuse super::d::D;\npub struct C;\n"),
            (
                "p/d.rs",
                "pub struct D;\n#[cfg(test)]\nmod tests {\n    use super::super::c::C;\n}\n"
            ),
        ])
        .is_empty()
    );
}
