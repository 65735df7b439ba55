//! The docs cannot drift from the code: `cargo test --test docs` (no network, no cluster; the
//! binary is only asked for its `--help`).
//!
//! In README.md, CHANGELOG.md and every `docs/*.md`:
//! - an invocation in code (an inline span or a fenced block) is `mpi-webhook SUB ...`,
//!   `.../mpi-webhook SUB ...` or `cargo run ... -- SUB ...`: SUB must be a subcommand of
//!   `mpi-webhook --help`, and every `--flag` after it (to the end of the command: `|`, `;`,
//!   `&&`, `)` or a `#` comment) must be in `mpi-webhook SUB --help`;
//! - an inline span that starts with `--` names a flag on its own: it must be a flag of the
//!   subcommand named in backticks on the same line, else of the one the section's heading
//!   names, else of some subcommand;
//! - every `MPI_WEBHOOK_*` variable must be one that some `--help` lists;
//! - a word of code whose first segment is a top-level file or folder of the repository is a
//!   path: it must exist (a `*` matches within one segment; what a command generates, such as
//!   `certs/ca.crt`, is not checked);
//! - a relative link must point to a file that exists, and its `#anchor` to a heading there;
//! - every `mpi-webhook.io/KEY` must be a key the code declares (a `const` in `src/`);
//! - no issue of ours is named (`issue 47`, `issues 46 and 47`, a bare `#47`): a user cannot look
//!   it up, and what changed when is CHANGELOG.md's to describe; an upstream issue is named with
//!   its project, `owner/repo#N` (`kubeflow/trainer#4028`).
//!
//! In the code (every `.rs` file under `src/`, `tests/`, `benches/` and `fuzz/`), every citation
//! in a comment ("spec section C", "D.1", "spec C step 2", "Decision 16", "Decisions 4, 6 and
//! 8") must resolve to a heading of `docs/behaviour.md`; and anywhere in the repository's code and
//! configuration, a reference such as `README "JobSet mode"` or `docs/operations.md "Bounded
//! work"` must name a heading of that file.
//!
//! Each check is a pure function over text, so the tests at the end feed it bad samples.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: cannot be read: {e}", path.display()))
}

/// README.md, CHANGELOG.md and the pages under docs/, by repository path, with their text.
fn docs() -> Vec<(String, String)> {
    let is_page = |p: &Path| p.extension().is_some_and(|e| e == "md");
    ["README.md", "CHANGELOG.md"]
        .map(|top| (top.to_owned(), read(&repo().join(top))))
        .into_iter()
        .chain(sources(&["docs"], &is_page))
        .collect()
}

/// Every file under `dir` (recursively, generated folders skipped) whose name passes `keep`.
fn files_under(dir: &Path, keep: &dyn Fn(&Path) -> bool, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if !["target", "corpus", "artifacts", "upstream", ".git"].contains(&name.as_str()) {
                files_under(&path, keep, out);
            }
        } else if keep(&path) {
            out.push(path);
        }
    }
}

fn relative(path: &Path) -> String {
    path.strip_prefix(repo())
        .unwrap_or(path)
        .display()
        .to_string()
}

// ---------------------------------------------------------------------------------------------
// Markdown

/// One line of a doc: its number, whether it is inside a fenced block, and its code (the inline
/// spans, or the whole line in a fenced block, with `\`-continued lines joined onto it).
struct Line {
    number: usize,
    fenced: bool,
    heading: bool,
    code: Vec<String>,
}

fn lines(text: &str) -> Vec<Line> {
    let mut out = Vec::new();
    let mut fenced = false;
    let mut continued: Option<Line> = None;
    for (index, raw) in text.lines().enumerate() {
        let number = index + 1;
        if raw.trim_start().starts_with("```") {
            fenced = !fenced;
            out.extend(continued.take());
            continue;
        }
        if fenced {
            let (body, more) = match raw.trim_end().strip_suffix('\\') {
                Some(body) => (body, true),
                None => (raw, false),
            };
            match &mut continued {
                Some(line) => line.code[0].push_str(body),
                None => {
                    continued = Some(Line {
                        number,
                        fenced: true,
                        heading: false,
                        code: vec![body.to_owned()],
                    })
                }
            }
            if !more {
                out.extend(continued.take());
            }
            continue;
        }
        let code = raw
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 1)
            .map(|(_, span)| span.to_owned())
            .collect();
        out.push(Line {
            number,
            fenced: false,
            heading: raw.starts_with('#'),
            code,
        });
    }
    out.extend(continued);
    out
}

/// The headings of a Markdown text (outside fenced blocks), without the `#`s.
fn headings(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut out = Vec::new();
    for raw in text.lines() {
        if raw.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && raw.starts_with('#') {
            out.push(raw.trim_start_matches('#').trim().to_owned());
        }
    }
    out
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces as `-`.
fn slug(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Subcommands and flags

/// What the binary's `--help` says: each subcommand with its flags, and every environment variable.
struct Cli {
    subcommands: BTreeMap<String, BTreeSet<String>>,
    env: BTreeSet<String>,
}

impl Cli {
    /// From the text of `mpi-webhook --help` and a way to get `mpi-webhook SUB --help`.
    fn from_help(top: &str, sub_help: &dyn Fn(&str) -> String) -> Cli {
        let mut subcommands = BTreeMap::new();
        let mut env = BTreeSet::new();
        let mut in_commands = false;
        for line in top.lines() {
            if line.starts_with("Commands:") {
                in_commands = true;
            } else if in_commands && line.starts_with("  ") {
                if let Some(name) = line.split_whitespace().next()
                    && name != "help"
                {
                    let help = sub_help(name);
                    env.extend(env_vars(&help));
                    subcommands.insert(name.to_owned(), flags(&help));
                }
            } else if in_commands {
                in_commands = false;
            }
        }
        Cli { subcommands, env }
    }

    fn named(&self, name: &str) -> Option<&BTreeSet<String>> {
        self.subcommands.get(name)
    }
}

fn help(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_mpi-webhook"))
        .args(args)
        .arg("--help")
        .output()
        .expect("the binary runs");
    assert!(output.status.success(), "mpi-webhook {args:?} --help fails");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn real_cli() -> &'static Cli {
    static CLI: OnceLock<Cli> = OnceLock::new();
    CLI.get_or_init(|| {
        let cli = Cli::from_help(&help(&[]), &|sub| help(&[sub]));
        assert!(
            !cli.subcommands.is_empty(),
            "mpi-webhook --help lists no subcommand"
        );
        cli
    })
}

/// Every `--flag` in a text.
fn flags(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|word| word.starts_with("--") && word.len() > 2 && !word[2..].starts_with('-'))
        .map(str::to_owned)
        .collect()
}

/// Every `MPI_WEBHOOK_*` name in a text (not the `MPI_WEBHOOK_<FLAG>` pattern).
fn env_vars(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '<'))
        .filter(|word| word.starts_with("MPI_WEBHOOK_") && word.len() > 12 && !word.contains('<'))
        .map(str::to_owned)
        .collect()
}

const ALWAYS: [&str; 2] = ["--help", "--version"];
const COMMAND_ENDS: [&str; 6] = ["|", "||", "&&", ";", ")", "\\"];
const COMMAND_STARTS: [&str; 8] = ["|", "||", "&&", ";", "(", "sudo", "exec", "then"];

/// A token of a command, without the quoting and list syntax around it.
fn bare(token: &str) -> &str {
    let token = token.rsplit("$(").next().unwrap_or(token);
    token.trim_matches(|c| matches!(c, '[' | ']' | ',' | '"' | '\'' | '(' | ')'))
}

/// The invocations in a piece of code: (subcommand, flags used after it).
fn invocations(code: &str) -> Vec<(String, Vec<String>)> {
    let tokens: Vec<&str> = code.split_whitespace().collect();
    let mut out = Vec::new();
    for (i, token) in tokens.iter().enumerate() {
        let word = bare(token);
        let previous = i.checked_sub(1).map(|p| tokens[p]);
        let at_start = previous.is_none_or(|p| {
            COMMAND_STARTS.contains(&p) || (p.contains('=') && !p.starts_with('-'))
        }) || token.starts_with('[')
            || token.contains("$(");
        let sub_at = if (word == "mpi-webhook" || word.ends_with("/mpi-webhook")) && at_start {
            Some(i + 1)
        } else if word == "cargo" && at_start && tokens.get(i + 1).is_some_and(|t| *t == "run") {
            tokens[i + 1..]
                .iter()
                .take_while(|t| !COMMAND_ENDS.contains(t))
                .position(|t| *t == "--")
                .map(|at| i + 1 + at + 1)
        } else {
            None
        };
        let Some(sub_at) = sub_at else { continue };
        let Some(sub) = tokens.get(sub_at).map(|t| bare(t)) else {
            continue;
        };
        if sub.is_empty()
            || !sub.chars().all(|c| c.is_ascii_lowercase() || c == '-')
            || sub.starts_with('-')
        {
            continue;
        }
        let used = tokens[sub_at + 1..]
            .iter()
            .take_while(|t| !COMMAND_ENDS.contains(t) && !t.starts_with('#'))
            .map(|t| bare(t))
            .filter(|t| t.starts_with("--") && t.len() > 2)
            .map(|t| t.split('=').next().unwrap_or(t).to_owned())
            .collect();
        out.push((sub.to_owned(), used));
    }
    out
}

/// Subcommands and flags a doc names that the binary lacks.
fn check_commands(doc: &str, text: &str, cli: &Cli) -> Vec<String> {
    let mut problems = Vec::new();
    let mut section: Option<String> = None;
    let named_sub = |spans: &[String]| -> Option<String> {
        spans.iter().find_map(|span| {
            let span = span.strip_prefix("mpi-webhook ").unwrap_or(span);
            let first = span.split_whitespace().next()?;
            cli.named(first).map(|_| first.to_owned())
        })
    };
    for line in lines(text) {
        let at = format!("{doc}:{}", line.number);
        for code in &line.code {
            for (sub, used) in invocations(code) {
                let Some(known) = cli.named(&sub) else {
                    let all: Vec<&String> = cli.subcommands.keys().collect();
                    problems.push(format!(
                        "{at}: `mpi-webhook {sub}` is no subcommand (mpi-webhook --help lists {all:?})"
                    ));
                    continue;
                };
                for flag in used {
                    if !known.contains(&flag) && !ALWAYS.contains(&flag.as_str()) {
                        problems.push(format!(
                            "{at}: `{flag}` is no flag of `mpi-webhook {sub}` (see `mpi-webhook {sub} --help`)"
                        ));
                    }
                }
            }
        }
        if line.heading {
            section = named_sub(&line.code);
        }
        if line.fenced {
            continue;
        }
        for span in line.code.iter().filter(|span| span.starts_with("--")) {
            let Some(flag) = flags(span.split([' ', '=']).next().unwrap_or(""))
                .into_iter()
                .next()
            else {
                continue;
            };
            if ALWAYS.contains(&flag.as_str()) {
                continue;
            }
            let candidates: Vec<&String> = match named_sub(&line.code).or_else(|| section.clone()) {
                Some(sub) => cli.subcommands.keys().filter(|s| **s == sub).collect(),
                None => cli.subcommands.keys().collect(),
            };
            if !candidates
                .iter()
                .any(|sub| cli.subcommands[*sub].contains(&flag))
            {
                problems.push(format!(
                    "{at}: `{flag}` is a flag of none of {candidates:?} (see their --help)"
                ));
            }
        }
    }
    problems
}

/// `MPI_WEBHOOK_*` variables a doc names that no `--help` lists.
fn check_env(doc: &str, text: &str, cli: &Cli) -> Vec<String> {
    let mut problems = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        for name in env_vars(raw) {
            if !cli.env.contains(&name) {
                problems.push(format!(
                    "{doc}:{}: `{name}` is read by no flag (no --help lists it)",
                    index + 1
                ));
            }
        }
    }
    problems
}

// ---------------------------------------------------------------------------------------------
// Paths and links

/// Places that a command the docs show creates, and that are therefore not in a clone.
const GENERATED: [&str; 6] = [
    "target/",
    "certs/",
    "manifests/overlays/cli-certs/tls/",
    "fuzz/corpus",
    "fuzz/artifacts",
    "fuzz/target",
];
const TRACKED_IN_GENERATED: [&str; 1] = ["certs/README.md"];

/// Repository paths a doc names in code that do not exist.
fn check_paths(
    doc: &str,
    text: &str,
    top_level: &BTreeSet<String>,
    exists: &dyn Fn(&str) -> bool,
) -> Vec<String> {
    let mut problems = Vec::new();
    for line in lines(text) {
        for word in line.code.iter().flat_map(|code| code.split_whitespace()) {
            let word = word.trim_start_matches(['@', '"', '\'', '(', '[']);
            let word = word.strip_prefix("./").unwrap_or(word);
            let word = word.split(':').next().unwrap_or(word);
            let word = word.trim_end_matches(['"', '\'', ',', ')', ']', '.', ';']);
            let first = word.split('/').next().unwrap_or("");
            if !top_level.contains(first)
                || !word.contains('/')
                || word.contains(['<', '$', '{', '['])
                || (GENERATED
                    .iter()
                    .any(|g| word.starts_with(g) || format!("{word}/") == *g)
                    && !TRACKED_IN_GENERATED.contains(&word))
            {
                continue;
            }
            if !exists(word.trim_end_matches('/')) {
                problems.push(format!(
                    "{doc}:{}: `{word}` is no path in the repository",
                    line.number
                ));
            }
        }
    }
    problems
}

/// Whether `path` exists under the repository; `*` matches within one segment, a trailing `/**`
/// names a folder.
fn path_exists(path: &str) -> bool {
    let path = path.strip_suffix("/**").unwrap_or(path);
    let mut candidates = vec![repo().to_path_buf()];
    for segment in path.split('/').filter(|s| !s.is_empty()) {
        let mut next = Vec::new();
        for dir in &candidates {
            match segment.split_once('*') {
                None => next.push(dir.join(segment)),
                Some((prefix, suffix)) => {
                    if let Ok(entries) = std::fs::read_dir(dir) {
                        next.extend(entries.flatten().map(|e| e.path()).filter(|p| {
                            p.file_name().is_some_and(|n| {
                                let n = n.to_string_lossy();
                                n.starts_with(prefix) && n.ends_with(suffix.trim_start_matches('*'))
                            })
                        }));
                    }
                }
            }
        }
        candidates = next;
    }
    candidates.iter().any(|p| p.exists())
}

/// Relative links of a doc that point to no file, or to no heading of it.
fn check_links(doc: &str, text: &str, read_doc: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
    let dir = Path::new(doc).parent().unwrap_or(Path::new(""));
    let mut problems = Vec::new();
    let mut fenced = false;
    for (index, raw) in text.lines().enumerate() {
        if raw.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if fenced {
            continue;
        }
        let mut rest = raw;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let end = after.find(')').unwrap_or(after.len());
            let target = &after[..end];
            rest = &after[end..];
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = target.split_once('#').unwrap_or((target, ""));
            let file = if file.is_empty() {
                doc.to_owned()
            } else {
                normalize(&dir.join(file))
            };
            let at = format!("{doc}:{}", index + 1);
            let Some(content) = read_doc(&file) else {
                problems.push(format!(
                    "{at}: the link `{target}` points to `{file}`, which does not exist"
                ));
                continue;
            };
            if !anchor.is_empty()
                && file.ends_with(".md")
                && !headings(&content).iter().any(|h| slug(h) == anchor)
            {
                problems.push(format!(
                    "{at}: the link `{target}`: `{file}` has no heading `#{anchor}`"
                ));
            }
        }
    }
    problems
}

/// `docs/../README.md` as `README.md`.
fn normalize(path: &Path) -> String {
    let mut parts: Vec<String> = Vec::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                parts.pop();
            }
            std::path::Component::Normal(p) => parts.push(p.to_string_lossy().into_owned()),
            _ => {}
        }
    }
    parts.join("/")
}

// ---------------------------------------------------------------------------------------------
// mpi-webhook.io keys

const KEY_PREFIX: &str = "mpi-webhook.io/";

/// The label and annotation keys the code declares: every `const` string `mpi-webhook.io/...`.
fn declared_keys(sources: &[(String, String)]) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    for (_, text) in sources {
        for line in text.lines().filter(|l| l.contains("const ")) {
            if let Some(at) = line.find(&format!("\"{KEY_PREFIX}")) {
                let literal = &line[at + 1..];
                if let Some(end) = literal.find('"') {
                    keys.insert(literal[..end].to_owned());
                }
            }
        }
    }
    keys
}

/// `mpi-webhook.io/...` keys a doc names that the code does not declare.
fn check_keys(doc: &str, text: &str, known: &BTreeSet<String>) -> Vec<String> {
    let mut problems = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let mut rest = raw;
        while let Some(at) = rest.find(KEY_PREFIX) {
            let tail = &rest[at + KEY_PREFIX.len()..];
            let name: String = tail
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_' || *c == '.')
                .collect();
            let name = name.trim_end_matches('.');
            let key = format!("{KEY_PREFIX}{name}");
            if !name.is_empty() && !known.contains(&key) {
                problems.push(format!(
                    "{doc}:{}: `{key}` is no key the code declares (src/ declares {known:?})",
                    index + 1
                ));
            }
            rest = tail;
        }
    }
    problems
}

// ---------------------------------------------------------------------------------------------
// Issue numbers

/// Whether `word` is `owner/repo`, the project an upstream issue number belongs to.
fn is_owner_repo(word: &str) -> bool {
    let part = |p: &str| {
        !p.is_empty()
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    word.split_once('/')
        .is_some_and(|(owner, repo)| part(owner) && part(repo))
}

/// The issues of ours a doc names: `issue N` or `issues N` (any case, `#` allowed before N) and
/// a `#N` not preceded by `owner/repo`. A `#1-...` anchor is no issue.
fn check_issue_numbers(doc: &str, text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let lower = raw.to_ascii_lowercase();
        let bytes = lower.as_bytes();
        let digits_at = |at: usize| {
            let len = bytes[at..]
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .count();
            let next = bytes.get(at + len).copied().unwrap_or(b' ');
            (len > 0 && !next.is_ascii_alphanumeric() && next != b'-' && next != b'_')
                .then_some(at + len)
        };
        let mut found = Vec::new();
        for (at, _) in lower.match_indices("issue") {
            if at > 0 && bytes[at - 1].is_ascii_alphanumeric() {
                continue;
            }
            let mut k = at + "issue".len();
            k += usize::from(bytes.get(k) == Some(&b's'));
            let spaces = bytes[k..]
                .iter()
                .take_while(|b| matches!(b, b' ' | b'\t'))
                .count();
            if spaces == 0 {
                continue;
            }
            k += spaces;
            k += usize::from(bytes.get(k) == Some(&b'#'));
            if let Some(end) = digits_at(k) {
                found.push((at, end));
            }
        }
        for (at, _) in lower.match_indices('#') {
            let Some(end) = digits_at(at + 1) else {
                continue;
            };
            let word = lower[..at]
                .rsplit(|c: char| {
                    !(c.is_ascii_alphanumeric() || matches!(c, '/' | '-' | '_' | '.'))
                })
                .next()
                .unwrap_or("");
            if !is_owner_repo(word) && !found.iter().any(|(from, to)| (*from..*to).contains(&at)) {
                found.push((at, end));
            }
        }
        found.sort_unstable();
        for (from, to) in found {
            problems.push(format!(
                "{doc}:{}: `{}` names an issue of ours: say what changed (CHANGELOG.md), or name an \
                 upstream issue as `owner/repo#N`",
                index + 1,
                &raw[from..to]
            ));
        }
    }
    problems
}

// ---------------------------------------------------------------------------------------------
// Citations in the code

/// A word of a comment, with the line it is on.
struct Word {
    line: usize,
    text: String,
}

/// The comment text of each block of consecutive `//` comments, as words.
fn comment_blocks(text: &str) -> Vec<Vec<Word>> {
    let mut blocks = Vec::new();
    let mut block: Vec<Word> = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        // A comment starts at `//` that is not part of a URL (`https://`).
        let start = raw
            .match_indices("//")
            .map(|(at, _)| at)
            .find(|at| *at == 0 || raw.as_bytes()[at - 1] != b':');
        let Some(start) = start else {
            blocks.extend((!block.is_empty()).then(|| std::mem::take(&mut block)));
            continue;
        };
        let whole_line = raw[..start].trim().is_empty();
        if !whole_line {
            blocks.extend((!block.is_empty()).then(|| std::mem::take(&mut block)));
        }
        let comment = raw[start..].trim_start_matches(['/', '!']);
        block.extend(
            comment
                .split(|c: char| {
                    c.is_whitespace() || matches!(c, '(' | ')' | ';' | '"' | '/' | '`')
                })
                .filter(|w| !w.is_empty())
                .map(|w| Word {
                    line: index + 1,
                    text: w.trim_end_matches([',', ':', '.']).to_owned(),
                }),
        );
        if !whole_line {
            blocks.push(std::mem::take(&mut block));
        }
    }
    blocks.extend((!block.is_empty()).then_some(block));
    blocks
}

/// A section letter of behaviour.md: `A` to `H`.
fn is_section(word: &str) -> bool {
    word.len() == 1 && ("A"..="H").contains(&word)
}

/// A subsection: `C.3`.
fn is_subsection(word: &str) -> bool {
    let b = word.as_bytes();
    b.len() >= 3
        && word.get(..1).is_some_and(is_section)
        && b[1] == b'.'
        && b[2..].iter().all(u8::is_ascii_digit)
}

/// The numbers of a list that starts at word `k`: "4, 6 and 8", "3 to 5"; each with the line of
/// its word (a range's filled-in numbers take the line of its end). Also the index after it.
fn numbers(words: &[Word], mut k: usize) -> (Vec<(u32, usize)>, usize) {
    let text = |i: usize| words.get(i).map(|w| w.text.as_str()).unwrap_or("");
    let mut out: Vec<(u32, usize)> = Vec::new();
    let mut range = false;
    while let Ok(n) = text(k).parse::<u32>() {
        let line = words[k].line;
        let from = match (range, out.last()) {
            (true, Some((last, _))) => last + 1,
            _ => n,
        };
        out.extend((from..=n).map(|m| (m, line)));
        range = false;
        k += 1;
        match text(k) {
            "to" => {
                range = true;
                k += 1;
            }
            "and" | "or" => k += 1,
            _ => {}
        }
    }
    (out, k)
}

/// What a block of comment words cites: (line, the start of the heading that must exist).
fn citations(words: &[Word]) -> Vec<(usize, String)> {
    let text = |i: usize| words.get(i).map(|w| w.text.as_str()).unwrap_or("");
    let mut out = Vec::new();
    for (i, word) in words.iter().enumerate() {
        let (line, word) = (word.line, word.text.as_str());
        if is_subsection(word) {
            // "C.3", "D.2/D.3", "C.3 to C.5" (each end)
            out.push((line, format!("{word} ")));
        } else if matches!(word, "Decision" | "Decisions") {
            // "Decision 16", "Decisions 4, 6 and 8", "Decisions 4 to 10"
            let (mut cited, _) = numbers(words, i + 1);
            if word == "Decision" {
                cited.truncate(1);
            }
            out.extend(
                cited
                    .into_iter()
                    .map(|(n, l)| (l, format!("Decision {n}:"))),
            );
        } else if matches!(
            word,
            "section" | "sections" | "Section" | "Sections" | "spec"
        ) {
            // "spec section C", "spec D", "sections C, D", "spec C step 2", "C steps 3 to 5"
            let mut j = i + 1;
            loop {
                let cited = text(j);
                if is_section(cited) {
                    if matches!(text(j + 1), "step" | "steps") {
                        let (steps, next) = numbers(words, j + 2);
                        out.extend(steps.into_iter().map(|(n, l)| (l, format!("{cited}.{n} "))));
                        j = next;
                    } else {
                        out.push((words[j].line, format!("{cited}. ")));
                        j += 1;
                    }
                } else if is_subsection(cited) {
                    j += 1; // cited on its own above
                } else {
                    break;
                }
                if matches!(text(j), "and" | "or" | "to") {
                    j += 1;
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Citations in a file's comments that no heading of behaviour.md resolves.
fn check_citations(file: &str, text: &str, headings: &[String]) -> Vec<String> {
    let mut problems = Vec::new();
    for block in comment_blocks(text) {
        for (line, wanted) in citations(&block) {
            if !headings.iter().any(|h| h.starts_with(&wanted)) {
                problems.push(format!(
                    "{file}:{line}: cites `{}`, which is no heading of docs/behaviour.md",
                    wanted.trim_end_matches([' ', ':', '.'])
                ));
            }
        }
    }
    problems
}

/// References like `README "JobSet mode"` or `docs/operations.md "Bounded work"` in a file that
/// name no heading of that doc. `headings_of` gives a doc's headings, `None` if it does not exist.
fn check_doc_references(
    file: &str,
    text: &str,
    headings_of: &dyn Fn(&str) -> Option<Vec<String>>,
) -> Vec<String> {
    let mut problems = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        for (at, _) in raw
            .match_indices("README")
            .chain(raw.match_indices("docs/"))
        {
            let tail = &raw[at..];
            let doc_len = if let Some(rest) = tail.strip_prefix("README") {
                "README".len() + usize::from(rest.starts_with(".md")) * 3
            } else {
                match tail.find(".md") {
                    Some(end)
                        if tail[..end]
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '-' | '_')) =>
                    {
                        end + 3
                    }
                    _ => continue,
                }
            };
            let doc = match &tail[..doc_len] {
                "README" => "README.md",
                other => other,
            };
            let after = tail[doc_len..]
                .trim_start_matches("'s")
                .trim_start_matches(',');
            let Some(quoted) = after
                .strip_prefix(" \"")
                .or_else(|| after.strip_prefix(" \\\""))
            else {
                continue;
            };
            let Some(end) = quoted.find(['"', '\\']) else {
                continue;
            };
            let title = &quoted[..end];
            let line = index + 1;
            match headings_of(doc) {
                None => problems.push(format!(
                    "{file}:{line}: refers to {doc}, which does not exist"
                )),
                Some(headings) => {
                    if !headings.iter().any(|h| h.contains(title)) {
                        problems.push(format!(
                            "{file}:{line}: refers to {doc} \"{title}\", which is no heading there"
                        ));
                    }
                }
            }
        }
    }
    problems
}

// ---------------------------------------------------------------------------------------------
// The checks on the repository

fn fail_on(what: &str, problems: Vec<String>) {
    assert!(problems.is_empty(), "{what}:\n{}", problems.join("\n"));
}

fn sources(dirs: &[&str], keep: &dyn Fn(&Path) -> bool) -> Vec<(String, String)> {
    let mut paths = Vec::new();
    for dir in dirs {
        files_under(&repo().join(dir), keep, &mut paths);
    }
    paths.sort();
    paths
        .into_iter()
        .map(|p| (relative(&p), read(&p)))
        .filter(|(name, _)| name != "tests/docs.rs")
        .collect()
}

fn is_rust(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "rs")
}

#[test]
fn every_subcommand_and_flag_the_docs_name_is_in_the_binarys_help() {
    let cli = real_cli();
    let problems = docs()
        .iter()
        .flat_map(|(doc, text)| {
            check_commands(doc, text, cli)
                .into_iter()
                .chain(check_env(doc, text, cli))
        })
        .collect();
    fail_on("the docs name what the binary lacks", problems);
}

#[test]
fn every_repository_path_and_link_the_docs_name_exists() {
    let top_level: BTreeSet<String> = std::fs::read_dir(repo())
        .expect("the repository can be listed")
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name != "target" && name != ".git")
        .collect();
    let read_doc = |path: &str| {
        std::fs::read_to_string(repo().join(path))
            .ok()
            .or_else(|| repo().join(path).is_dir().then(String::new))
    };
    let problems = docs()
        .iter()
        .flat_map(|(doc, text)| {
            check_paths(doc, text, &top_level, &path_exists)
                .into_iter()
                .chain(check_links(doc, text, &read_doc))
        })
        .collect();
    fail_on("the docs name paths that do not exist", problems);
}

#[test]
fn every_mpi_webhook_io_key_the_docs_name_is_declared_in_the_code() {
    let known = declared_keys(&sources(&["src"], &is_rust));
    assert!(
        known.contains("mpi-webhook.io/implementation"),
        "the scan of src/ for key constants is broken: it found {known:?}"
    );
    let problems = docs()
        .iter()
        .flat_map(|(doc, text)| check_keys(doc, text, &known))
        .collect();
    fail_on("the docs name keys the code does not know", problems);
}

#[test]
fn no_user_doc_names_an_issue_of_ours() {
    let problems = docs()
        .iter()
        .flat_map(|(doc, text)| check_issue_numbers(doc, text))
        .collect();
    fail_on("the docs name issues of ours", problems);
}

#[test]
fn every_citation_in_a_code_comment_resolves_to_a_heading_of_behaviour_md() {
    let headings = headings(&read(&repo().join("docs/behaviour.md")));
    let files = sources(&["src", "tests", "benches", "fuzz"], &is_rust);
    let cited: usize = files
        .iter()
        .map(|(_, text)| {
            comment_blocks(text)
                .iter()
                .map(|b| citations(b).len())
                .sum::<usize>()
        })
        .sum();
    assert!(
        cited > 50,
        "only {cited} citations found in the code: the scan is broken"
    );
    let problems = files
        .iter()
        .flat_map(|(file, text)| check_citations(file, text, &headings))
        .collect();
    fail_on(
        "citations in the code that docs/behaviour.md does not resolve",
        problems,
    );
}

#[test]
fn every_reference_to_a_doc_section_in_the_code_names_a_heading_of_it() {
    let keep = |p: &Path| {
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        !name.ends_with(".md")
            && (is_rust(p)
                || [".toml", ".yaml", ".yml", ".sh", ".py"]
                    .iter()
                    .any(|e| name.ends_with(e))
                || name == "run"
                || name == "Dockerfile")
    };
    let mut files = sources(
        &[
            "src",
            "tests",
            "benches",
            "fuzz",
            "scripts",
            ".ci",
            "manifests",
        ],
        &keep,
    );
    for top in ["Cargo.toml", "deny.toml", "Dockerfile"] {
        files.push((top.to_owned(), read(&repo().join(top))));
    }
    let headings_of = |doc: &str| {
        std::fs::read_to_string(repo().join(doc))
            .ok()
            .map(|t| headings(&t))
    };
    let problems = files
        .iter()
        .flat_map(|(file, text)| check_doc_references(file, text, &headings_of))
        .collect();
    fail_on("references to doc sections that do not exist", problems);
}

#[test]
fn behaviour_md_numbers_its_decisions_from_1_without_a_gap() {
    let numbers: Vec<u32> = headings(&read(&repo().join("docs/behaviour.md")))
        .iter()
        .filter_map(|h| h.strip_prefix("Decision "))
        .filter_map(|rest| rest.split(':').next()?.parse().ok())
        .collect();
    let expected: Vec<u32> = (1..=u32::try_from(numbers.len()).expect("few")).collect();
    assert_eq!(
        numbers, expected,
        "docs/behaviour.md: Decisions out of order or with a gap"
    );
}

#[test]
fn every_doc_page_says_who_it_is_for_and_the_readme_stays_short() {
    for (doc, text) in docs().iter().filter(|(doc, _)| doc.starts_with("docs/")) {
        let first = text
            .lines()
            .skip(1)
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        assert!(
            first.starts_with("For "),
            "{doc}:3: the page should start by saying who it is for (\"For ...\"), not {first:?}"
        );
    }
    let size = read(&repo().join("README.md")).len();
    assert!(
        size <= 15 * 1024,
        "README.md is {size} bytes, over 15 KiB: move detail into docs/"
    );
}

// ---------------------------------------------------------------------------------------------
// Each check fails on a bad sample

fn sample_cli() -> Cli {
    let top = "Usage: mpi-webhook <COMMAND>\n\nCommands:\n  serve   Run\n  review  Offline\n  help    Print\n\nOptions:\n  -h, --help\n";
    Cli::from_help(top, &|sub| {
        match sub {
        "serve" => "Options:\n      --listen <LISTEN>  Address [env: MPI_WEBHOOK_LISTEN=] [default: 127.0.0.1:8443]\n  -h, --help\n".to_owned(),
        _ => "Options:\n      --objects-dir <DIR>  [env: MPI_WEBHOOK_OBJECTS_DIR=]\n  -h, --help\n".to_owned(),
    }
    })
}

#[test]
fn the_help_is_read_as_subcommands_flags_and_variables() {
    let cli = sample_cli();
    assert_eq!(
        cli.subcommands.keys().collect::<Vec<_>>(),
        ["review", "serve"]
    );
    assert_eq!(
        cli.subcommands["serve"],
        BTreeSet::from(["--help".to_owned(), "--listen".to_owned()])
    );
    assert_eq!(
        cli.env,
        BTreeSet::from([
            "MPI_WEBHOOK_LISTEN".to_owned(),
            "MPI_WEBHOOK_OBJECTS_DIR".to_owned()
        ])
    );
}

#[test]
fn a_doc_naming_a_missing_subcommand_or_flag_fails_with_its_line() {
    let cli = sample_cli();
    let text = "# Tour\n\n```sh\ncargo run --release -- serve --listen 0.0.0.0:1 \\\n  --lissten x | grep y --bogus\nmpi-webhook rewiew validate f\nkubectl -n mpi-webhook get pods\n```\n\n## `serve`\n\n| `--listen` | ok |\n| `--objects-dir` | wrong section |\n`review` takes `--objects-dir`; `mpi-webhook serve --help` works.\n";
    assert_eq!(
        check_commands("docs/x.md", text, &cli),
        [
            "docs/x.md:4: `--lissten` is no flag of `mpi-webhook serve` (see `mpi-webhook serve --help`)",
            "docs/x.md:6: `mpi-webhook rewiew` is no subcommand (mpi-webhook --help lists [\"review\", \"serve\"])",
            "docs/x.md:13: `--objects-dir` is a flag of none of [\"serve\"] (see their --help)",
        ]
    );
    assert_eq!(
        check_env(
            "README.md",
            "`MPI_WEBHOOK_LISTEN`, `MPI_WEBHOOK_<FLAG>`\n`MPI_WEBHOOK_LISTEN_ADDR`\n",
            &cli
        ),
        ["README.md:2: `MPI_WEBHOOK_LISTEN_ADDR` is read by no flag (no --help lists it)"]
    );
}

#[test]
fn a_doc_naming_a_missing_path_or_link_fails_with_its_line() {
    let top_level = BTreeSet::from(["src".to_owned(), "certs".to_owned(), "README.md".to_owned()]);
    let exists = |p: &str| ["src/lib.rs", "src/mpi", "certs/README.md"].contains(&p);
    let text = "See `src/lib.rs:12` and `src/mpi/`.\n```sh\ncurl --data @src/nope.json https://x/src/a\nls certs/ca.crt certs/README.md docker.io/x/y\n```\nAlso `src/gone.rs`, `src/<name>.rs`.\n";
    assert_eq!(
        check_paths("README.md", text, &top_level, &exists),
        [
            "README.md:3: `src/nope.json` is no path in the repository",
            "README.md:6: `src/gone.rs` is no path in the repository",
        ]
    );
    let read_doc = |p: &str| match p {
        "docs/a.md" => Some("# A\n\n## Two words\n```sh\n# not a heading\n```\n".to_owned()),
        "README.md" => Some(String::new()),
        _ => None,
    };
    let text = "[a](a.md#two-words), [up](../README.md), [web](https://x.io/y.md)\n[b](b.md) [c](a.md#not-a-heading) [self](#a)\n";
    assert_eq!(
        check_links("docs/a.md", text, &read_doc),
        [
            "docs/a.md:2: the link `b.md` points to `docs/b.md`, which does not exist",
            "docs/a.md:2: the link `a.md#not-a-heading`: `docs/a.md` has no heading `#not-a-heading`",
        ]
    );
}

#[test]
fn a_doc_naming_an_unknown_key_fails_with_its_line() {
    let sources = vec![(
        "src/x.rs".to_owned(),
        "pub const A: &str = \"mpi-webhook.io/implementation\";\nlet b = \"mpi-webhook.io/in-a-test\";\n".to_owned(),
    )];
    let known = declared_keys(&sources);
    assert_eq!(
        known,
        BTreeSet::from(["mpi-webhook.io/implementation".to_owned()])
    );
    assert_eq!(
        check_keys(
            "docs/j.md",
            "`mpi-webhook.io/implementation`.\n\n`metadata.annotations[mpi-webhook.io/slot-per-node]`\n",
            &known
        ),
        [
            "docs/j.md:3: `mpi-webhook.io/slot-per-node` is no key the code declares (src/ declares {\"mpi-webhook.io/implementation\"})"
        ]
    );
}

#[test]
fn a_comment_citing_a_missing_heading_fails_with_its_line() {
    let headings: Vec<String> = [
        "Decisions",
        "Decision 1: One",
        "Decision 2: Two",
        "C. The mutation",
        "C.1 Count",
        "C.2 Slots",
        "D. Build",
        "D.1 Secret",
    ]
    .map(str::to_owned)
    .into();
    let text = "\
//! The mutation (spec section C, Decisions 1 and 2), a PEM section of the file.
fn f() {} // C.1: the count, spec C step 2
// Decisions 1 to
// 3 and spec sections C, E; D.1/D.2
/// spec D step 1 and Section B
let s = \"Decision 9\";
";
    assert_eq!(
        check_citations("src/m.rs", text, &headings),
        [
            "src/m.rs:4: cites `D.2`, which is no heading of docs/behaviour.md",
            "src/m.rs:4: cites `Decision 3`, which is no heading of docs/behaviour.md",
            "src/m.rs:4: cites `E`, which is no heading of docs/behaviour.md",
            "src/m.rs:5: cites `B`, which is no heading of docs/behaviour.md",
        ]
    );
}

#[test]
fn a_reference_to_a_missing_doc_section_fails_with_its_line() {
    let headings_of = |doc: &str| match doc {
        "README.md" => Some(vec!["JobSet mode".to_owned()]),
        "docs/operations.md" => Some(vec!["Bounded work".to_owned()]),
        _ => None,
    };
    let text = "\
// the README's \"JobSet mode\", docs/operations.md \"Bounded work\"
# README, \"In a cluster\"
msg = \"(README \\\"JobSet mode\\\")\"
// docs/gone.md \"X\"; README.md#anchor is a URL's business
";
    assert_eq!(
        check_doc_references("src/x.rs", text, &headings_of),
        [
            "src/x.rs:2: refers to README.md \"In a cluster\", which is no heading there",
            "src/x.rs:4: refers to docs/gone.md, which does not exist",
        ]
    );
}

#[test]
fn a_doc_naming_an_issue_of_ours_fails_with_its_line() {
    let text = "\
# Changelog

Upstream: kubeflow/trainer#4028, open-mpi/ompi#13358 and kube-rs/kube#1590 are fine.
A [link](#1-install) to a heading, `#[derive]`, issue tracking and issues: fine.
The cut of issue 47 (Issue 46, ISSUES 45).
See #47; before issue #12, (#3954; Decision 15) and kube-rs#1590.
kubeflow/trainer #3783, trainer#1, issue12 and issue\t9.
";
    assert_eq!(
        check_issue_numbers("CHANGELOG.md", text),
        [
            "CHANGELOG.md:5: `issue 47` names an issue of ours: say what changed (CHANGELOG.md), or name an upstream issue as `owner/repo#N`",
            "CHANGELOG.md:5: `Issue 46` names an issue of ours: say what changed (CHANGELOG.md), or name an upstream issue as `owner/repo#N`",
            "CHANGELOG.md:5: `ISSUES 45` names an issue of ours: say what changed (CHANGELOG.md), or name an upstream issue as `owner/repo#N`",
            "CHANGELOG.md:6: `#47` names an issue of ours: say what changed (CHANGELOG.md), or name an upstream issue as `owner/repo#N`",
            "CHANGELOG.md:6: `issue #12` names an issue of ours: say what changed (CHANGELOG.md), or name an upstream issue as `owner/repo#N`",
            "CHANGELOG.md:6: `#3954` names an issue of ours: say what changed (CHANGELOG.md), or name an upstream issue as `owner/repo#N`",
            "CHANGELOG.md:6: `#1590` names an issue of ours: say what changed (CHANGELOG.md), or name an upstream issue as `owner/repo#N`",
            "CHANGELOG.md:7: `#3783` names an issue of ours: say what changed (CHANGELOG.md), or name an upstream issue as `owner/repo#N`",
            "CHANGELOG.md:7: `#1` names an issue of ours: say what changed (CHANGELOG.md), or name an upstream issue as `owner/repo#N`",
            "CHANGELOG.md:7: `issue\t9` names an issue of ours: say what changed (CHANGELOG.md), or name an upstream issue as `owner/repo#N`",
        ]
    );
}
