//! The rules that keep the code the shape docs/architecture.md draws (issue 46), checked on
//! every `cargo test` so that they stay true without anyone remembering them:
//!
//! - **Layers.** Every top-level module of `src/` has a place in [`LAYERS`] and refers only
//!   to modules of lower layers (`crate::x` in `use` lines and inline paths, `super::` that
//!   climbs to the crate root, the crate root's re-exports); a new module must be given a
//!   place. Inside `src/compare/`, no file imports the reports or the verdict (they read the
//!   comparison, never the other way), and the files form no import cycle (types live apart
//!   from the stages that use them: `row`, `carry`, `collectives`, `run`).
//! - **Sizes.** No file in `src/` over [`MAX_FILE_LINES`] lines, no function over
//!   [`MAX_FN_LINES`] outside `#[cfg(test)]` code, but for [`FN_EXCEPTIONS`], each with its
//!   size and a reason.
//!
//! Each check lists every violation it finds, not just the first. The parsing is a small
//! lexer (comments and the insides of string and char literals blanked, lines kept, then
//! `#[cfg(test)]` items blanked too), a tokenizer and a `use`-tree reader: enough for this
//! crate's code, and tested on tricky input at the bottom of this file.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

/// The layers of `src/`, lowest first: a module may refer only to modules of a lower layer
/// (not its own). The first field says what the layer is.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "words: the vocabulary, grammars and process settings everything shares; they depend on nothing",
        &["vocab", "op_key", "dtype", "json", "memory", "progress", "agent_stats"],
    ),
    ("the gate: exit codes and --fail-on over the verdict words", &["gate"]),
    (
        "errors and records: ProbeError, the on-disk record types",
        &["error", "schema", "recapture"],
    ),
    (
        "files and bytes: all-or-nothing writes, config files, tensor bytes",
        &["atomic", "config_file", "tensor"],
    ),
    ("dumps: op logs read (both formats) and written (synthetic)", &["dump", "synth"]),
    (
        "one side's numbers: the per-tensor kernels, the one-run scan; a stored baseline",
        &["metrics", "scan", "baseline"],
    ),
    (
        "the comparison: plan, align, measure, judge, analyze; two monitors' curves",
        &["compare", "monitor"],
    ),
    ("the run's verdict: the run-wide summary and headline", &["verdict"]),
    ("output: the report writers", &["report"]),
    (
        "commands: compare/scan/merge, config-check, ckpt-compare, the agent kernel, cost",
        &["app", "config_check", "ckpt", "agent_kernel", "cost"],
    ),
    ("commands built on commands: replay (a compare, then the agent's Python)", &["replay"]),
];

/// The most lines a file in `src/` may have, tests included.
const MAX_FILE_LINES: usize = 900;

/// The most lines a function may have (from its `fn` line to its closing brace), outside
/// `#[cfg(test)]` code.
const MAX_FN_LINES: usize = 150;

/// Functions allowed over [`MAX_FN_LINES`]: file, name, the size accepted, and why. The test
/// fails when one grows past its size (look again) or is back under the limit (remove it).
const FN_EXCEPTIONS: &[(&str, &str, usize, &str)] = &[];

/// What no file of `src/compare/` (the compare pipeline) may import: the reports and the
/// verdict read the comparison, never the other way.
const COMPARE_MUST_NOT_IMPORT: &[&str] = &["report", "verdict"];

#[test]
fn every_module_refers_only_to_lower_layers() {
    let src = Source::load();
    let mut problems = Vec::new();
    let layer_of = layer_table(&mut problems);
    for m in &src.top_modules {
        if !layer_of.contains_key(m.as_str()) {
            problems.push(format!(
                "module `{m}` has no layer in LAYERS (tests/architecture.rs): give it one"
            ));
        }
    }
    for m in layer_of.keys() {
        if !src.top_modules.contains(*m) {
            problems.push(format!(
                "LAYERS names `{m}`, which src/lib.rs does not declare"
            ));
        }
    }
    for r in src.references() {
        let (Some(&from), Some(&to)) = (layer_of.get(r.from.as_str()), layer_of.get(r.to.as_str()))
        else {
            continue;
        };
        if r.from != r.to && to >= from {
            let rel = if to == from {
                "its own layer"
            } else {
                "a higher layer"
            };
            problems.push(format!(
                "{}:{}: `{}`: {} (layer {from}) refers to {} ({rel}, {to})",
                r.file, r.line, r.text, r.from, r.to
            ));
        }
    }
    problems.extend(src.unresolved.iter().cloned());
    report(
        "layers",
        &problems,
        &format!("the module graph today:\n{}", src.graph_text()),
    );
}

#[test]
fn the_compare_pipeline_imports_neither_reports_nor_verdict() {
    let src = Source::load();
    let problems: Vec<String> = src
        .references()
        .into_iter()
        .filter(|r| r.from == "compare" && COMPARE_MUST_NOT_IMPORT.contains(&r.to.as_str()))
        .map(|r| format!("{}:{}: `{}`", r.file, r.line, r.text))
        .collect();
    report("compare imports report/verdict", &problems, "");
}

#[test]
fn the_files_of_compare_form_no_import_cycle() {
    let src = Source::load();
    let edges = src.file_edges("compare");
    let mut problems = Vec::new();
    for cycle in cycles(&edges) {
        let mut msg = format!("an import cycle among {}:", cycle.join(", "));
        for from in &cycle {
            for (to, at) in &edges[from] {
                if cycle.contains(to) {
                    let _ = write!(msg, "\n    {from} -> {to} ({})", at.join(", "));
                }
            }
        }
        problems.push(msg);
    }
    report("cycles in src/compare", &problems, "");
}

#[test]
fn no_file_is_over_the_size_limit() {
    let src = Source::load();
    let problems: Vec<String> = src
        .files
        .iter()
        .map(|f| (f, f.text.lines().count()))
        .filter(|(_, n)| *n > MAX_FILE_LINES)
        .map(|(f, n)| format!("{}: {n} lines (at most {MAX_FILE_LINES})", f.path))
        .collect();
    report("file sizes", &problems, "");
}

#[test]
fn no_function_is_over_the_size_limit() {
    let src = Source::load();
    let mut problems = Vec::new();
    for f in src.files.iter().filter(|f| !f.test_only) {
        for func in functions(&f.code) {
            let allowed = FN_EXCEPTIONS
                .iter()
                .find(|(path, name, _, _)| *path == f.path && *name == func.name);
            match allowed {
                Some((_, _, size, _)) if func.lines > *size => problems.push(format!(
                    "{}:{}: fn {}: {} lines, grown past the {size} FN_EXCEPTIONS accepted",
                    f.path, func.line, func.name, func.lines
                )),
                Some(_) => {}
                None if func.lines > MAX_FN_LINES => problems.push(format!(
                    "{}:{}: fn {}: {} lines (at most {MAX_FN_LINES})",
                    f.path, func.line, func.name, func.lines
                )),
                None => {}
            }
        }
    }
    for (path, name, _, _) in FN_EXCEPTIONS {
        let over = src.files.iter().filter(|f| f.path == *path).any(|f| {
            functions(&f.code)
                .iter()
                .any(|g| g.name == *name && g.lines > MAX_FN_LINES)
        });
        if !over {
            problems.push(format!(
                "FN_EXCEPTIONS lists {path} fn {name}, which is gone or within {MAX_FN_LINES} lines: remove it"
            ));
        }
    }
    report("function sizes", &problems, "");
}

/// Fails listing every problem, with a note after them.
fn report(check: &str, problems: &[String], note: &str) {
    assert!(
        problems.is_empty(),
        "{check}: {} problem(s):\n  {}\n{note}",
        problems.len(),
        problems.join("\n  ")
    );
}

/// Module → layer number, with duplicates reported.
fn layer_table(problems: &mut Vec<String>) -> BTreeMap<&'static str, usize> {
    let mut layer_of = BTreeMap::new();
    for (n, (_, modules)) in LAYERS.iter().enumerate() {
        for m in *modules {
            if layer_of.insert(*m, n).is_some() {
                problems.push(format!("LAYERS places `{m}` twice"));
            }
        }
    }
    layer_of
}

// ---------------------------------------------------------------------------------------
// The source, as modules and references.

/// One `.rs` file of `src/`.
struct File {
    /// Relative to the crate root, with `/`: `src/compare/judge.rs`.
    path: String,
    /// Its module path from the crate root: `["compare", "judge"]`; empty for `lib.rs`.
    module: Vec<String>,
    text: String,
    /// The text with comments, literals' insides and `#[cfg(test)]` items blanked.
    code: String,
    /// A `#[cfg(test)] mod x;` file (or one below it).
    test_only: bool,
    /// `main.rs`: the binary, no module of the library.
    binary: bool,
}

/// A path from one top-level module into another.
struct Reference {
    file: String,
    line: usize,
    /// The path as written, `super::` and groups resolved: `crate::report::shards`.
    text: String,
    from: String,
    to: String,
}

struct Source {
    files: Vec<File>,
    /// `pub mod` / `mod` items of `src/lib.rs`.
    top_modules: BTreeSet<String>,
    /// Names the crate root re-exports (`pub use`), and the module each comes from.
    root_exports: BTreeMap<String, String>,
    /// Paths that could not be told to a module.
    unresolved: Vec<String>,
}

impl Source {
    fn load() -> Source {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut paths = Vec::new();
        walk(&root.join("src"), &mut paths);
        paths.sort();
        Source::from_files(
            paths
                .iter()
                .map(|p| {
                    let rel = p
                        .strip_prefix(root)
                        .unwrap()
                        .to_string_lossy()
                        .replace('\\', "/");
                    (rel, std::fs::read_to_string(p).unwrap())
                })
                .collect(),
        )
    }

    /// The source from `(path, text)` pairs, paths as `src/a/b.rs`; one is `src/lib.rs`.
    fn from_files(texts: Vec<(String, String)>) -> Source {
        let mut files: Vec<File> = texts
            .into_iter()
            .map(|(path, text)| {
                let module = module_path(&path);
                let binary = path == "src/main.rs";
                let code = code_of(&text);
                File {
                    path,
                    module,
                    text,
                    code,
                    test_only: false,
                    binary,
                }
            })
            .collect();
        // Files declared as `#[cfg(test)] mod x;` (and everything below them) are tests.
        let test_mods: Vec<Vec<String>> = files
            .iter()
            .flat_map(|f| {
                test_modules(&f.text).into_iter().map(|name| {
                    let mut m = f.module.clone();
                    m.push(name);
                    m
                })
            })
            .collect();
        for f in &mut files {
            if test_mods.iter().any(|t| f.module.starts_with(t)) {
                f.test_only = true;
            }
        }
        let lib = files.iter().find(|f| f.path == "src/lib.rs").unwrap();
        let toks = tokens(&lib.code);
        let mut top_modules = BTreeSet::new();
        let mut root_exports = BTreeMap::new();
        for (i, t) in toks.iter().enumerate() {
            if t.text == "mod" {
                top_modules.insert(toks[i + 1].text.clone());
            }
            if t.text == "use" && i > 0 && toks[i - 1].text == "pub" {
                for (path, alias) in use_tree(&toks, i + 1).0 {
                    let name = alias.unwrap_or_else(|| path.last().unwrap().clone());
                    root_exports.insert(name, path[0].clone());
                }
            }
        }
        let mut src = Source {
            files,
            top_modules,
            root_exports,
            unresolved: Vec::new(),
        };
        for f in &src.files {
            if !f.test_only && !f.binary && f.path != "src/lib.rs" {
                for (line, _) in inline_modules(&f.code) {
                    src.unresolved.push(format!(
                        "{}:{line}: an inline module outside tests: this test reads one module per file; teach it these",
                        f.path
                    ));
                }
            }
        }
        src
    }

    /// Every path of library code that names something in another top-level module.
    fn references(&self) -> Vec<Reference> {
        let mut out = Vec::new();
        for f in self.library_files() {
            let own = &f.module[0];
            for PathRef { line, path, .. } in absolute_paths(f) {
                let Some(to) = self.top_of(&path) else {
                    continue;
                };
                if to != *own {
                    out.push(Reference {
                        file: f.path.clone(),
                        line,
                        text: format!("crate::{}", path.join("::")),
                        from: own.clone(),
                        to,
                    });
                }
            }
        }
        out
    }

    fn library_files(&self) -> impl Iterator<Item = &File> {
        self.files
            .iter()
            .filter(|f| !f.test_only && !f.module.is_empty())
    }

    /// The top-level module a path from the crate root lands in.
    fn top_of(&self, path: &[String]) -> Option<String> {
        let first = path.first()?;
        if self.top_modules.contains(first) {
            Some(first.clone())
        } else {
            self.root_exports.get(first).cloned()
        }
    }

    /// `from -> to to ...`, one line a module, as the failure's help.
    fn graph_text(&self) -> String {
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for r in self.references() {
            graph.entry(r.from).or_default().insert(r.to);
        }
        graph
            .iter()
            .map(|(from, to)| {
                format!(
                    "  {from} -> {}\n",
                    to.iter().cloned().collect::<Vec<_>>().join(" ")
                )
            })
            .collect()
    }

    /// Inside one top-level module: which files use which other files of it, and where.
    /// A path lands in the deepest file whose module it enters; when it goes on to a name
    /// that file imports (`use`), it follows the import to where the name comes from, so
    /// `super::Sides` re-exported by `compare/mod.rs` from `vocab` is no edge to
    /// `compare/mod.rs`. A `pub use` whose name the file's own code does not use is its
    /// public face, not a use: no edge.
    fn file_edges(&self, top: &str) -> BTreeMap<String, BTreeMap<String, Vec<String>>> {
        let files: Vec<&File> = self
            .library_files()
            .filter(|f| f.module[0] == top)
            .collect();
        let by_module: BTreeMap<&[String], &File> =
            files.iter().map(|f| (f.module.as_slice(), *f)).collect();
        let refs: BTreeMap<&str, Vec<PathRef>> = files
            .iter()
            .map(|f| (f.path.as_str(), absolute_paths(f)))
            .collect();
        let imports: BTreeMap<&str, BTreeMap<&str, &[String]>> = refs
            .iter()
            .map(|(path, refs)| {
                let names = refs.iter().filter_map(|r| match &r.import {
                    Some((Some(name), _)) => Some((name.as_str(), r.path.as_slice())),
                    _ => None,
                });
                (*path, names.collect())
            })
            .collect();
        // The file a path lands in, imports followed (a few steps at most).
        let land = |path: &[String]| -> Option<&File> {
            let mut path = path.to_vec();
            for _ in 0..8 {
                let n = (1..=path.len())
                    .rev()
                    .find(|n| by_module.contains_key(&path[..*n]))?;
                let file = by_module[&path[..n]];
                match path
                    .get(n)
                    .and_then(|name| imports[file.path.as_str()].get(name.as_str()))
                {
                    Some(from) => path = from.iter().chain(&path[n + 1..]).cloned().collect(),
                    None => return Some(file),
                }
            }
            None
        };
        let mut edges: BTreeMap<String, BTreeMap<String, Vec<String>>> = BTreeMap::new();
        for f in &files {
            let used = used_names(&f.code);
            let node = edges.entry(f.path.clone()).or_default();
            for r in &refs[f.path.as_str()] {
                if let Some((name, true)) = &r.import {
                    if !name.as_ref().is_some_and(|n| used.contains(n)) {
                        continue;
                    }
                }
                let target = land(&r.path);
                if let Some(t) = target.filter(|t| t.path != f.path) {
                    let at = format!("line {}", r.line);
                    let lines = node.entry(t.path.clone()).or_default();
                    if !lines.contains(&at) {
                        lines.push(at);
                    }
                }
            }
        }
        edges
    }
}

fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            walk(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `src/a/b.rs` and `src/a/b/mod.rs` are `a::b`; `src/lib.rs` and `src/main.rs` the root.
fn module_path(rel: &str) -> Vec<String> {
    let inner = rel
        .strip_prefix("src/")
        .unwrap()
        .strip_suffix(".rs")
        .unwrap();
    let mut parts: Vec<String> = inner.split('/').map(String::from).collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The names of `#[cfg(test)] mod x;` declarations (their files are tests).
fn test_modules(text: &str) -> Vec<String> {
    let raw = code_without_literals(text);
    let mut out = Vec::new();
    for (start, end) in cfg_test_items(&raw) {
        let item: String = raw[start..end].iter().collect();
        let toks = tokens(&item);
        if let Some(i) = toks.iter().position(|t| t.text == "mod") {
            if toks.get(i + 2).is_some_and(|t| t.text == ";") {
                out.push(toks[i + 1].text.clone());
            }
        }
    }
    out
}

/// A path in a file's code, made absolute (from the crate root).
struct PathRef {
    /// The line it starts on.
    line: usize,
    path: Vec<String>,
    /// For a `use` item: the name it brings in (its alias, else its last segment; none for
    /// `*`), and whether the item is `pub` (`pub(crate)` too).
    import: Option<(Option<String>, bool)>,
}

/// Every path in a file's code that starts at the crate root (`crate::`), climbs to it or
/// stays in the file's module (`super::`, `self::`), or enters a child module the file
/// declares (`mod x;` then `x::...`), in `use` items and inline: absolute, with the line it
/// starts on. Paths into other crates are left out.
fn absolute_paths(f: &File) -> Vec<PathRef> {
    let toks = tokens(&f.code);
    let children: BTreeSet<&str> = toks
        .windows(3)
        .filter(|w| w[0].text == "mod" && w[2].text == ";")
        .map(|w| w[1].text.as_str())
        .collect();
    let resolve = |raw: Vec<String>| -> Option<Vec<String>> {
        let mut base = f.module.clone();
        let mut rest = raw.as_slice();
        match rest.first()?.as_str() {
            "crate" => {
                base.clear();
                rest = &rest[1..];
            }
            "self" => rest = &rest[1..],
            "super" => {
                while rest.first().is_some_and(|s| s == "super") {
                    base.pop();
                    rest = &rest[1..];
                }
            }
            name if children.contains(name) => {}
            _ => return None,
        }
        base.extend(rest.iter().filter(|s| *s != "self").cloned());
        Some(base)
    };
    let text = |i: usize| toks.get(i).map_or("", |t| t.text.as_str());
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let t = &toks[i];
        if t.text == "use" {
            // `pub use`, `pub(crate) use`, `pub(in path) use`.
            let public = text(i.wrapping_sub(1)) == "pub"
                || (text(i.wrapping_sub(1)) == ")"
                    && toks[..i].iter().rev().take(8).any(|t| t.text == "pub"));
            let (paths, next) = use_tree(&toks, i + 1);
            for (raw, alias) in paths {
                let name = alias
                    .or_else(|| raw.last().cloned())
                    .filter(|n| n != "self");
                // `use a::b::{self}` brings in `b`.
                let name = name.or_else(|| {
                    (raw.last().is_some_and(|l| l == "self") && raw.len() > 1)
                        .then(|| raw[raw.len() - 2].clone())
                });
                if let Some(path) = resolve(raw) {
                    out.push(PathRef {
                        line: t.line,
                        path,
                        import: Some((name, public)),
                    });
                }
            }
            i = next.max(i + 1);
            continue;
        }
        let after_sep = matches!(text(i.wrapping_sub(1)), "::" | ".");
        let starts_path = matches!(t.text.as_str(), "crate" | "self" | "super")
            || children.contains(t.text.as_str());
        if after_sep || !starts_path || text(i + 1) != "::" {
            i += 1;
            continue;
        }
        let (paths, next) = use_tree(&toks, i);
        for (raw, _) in paths {
            if let Some(path) = resolve(raw) {
                out.push(PathRef {
                    line: t.line,
                    path,
                    import: None,
                });
            }
        }
        i = next.max(i + 1);
    }
    out
}

/// The identifiers of a file's code outside its `use` items and module declarations: what
/// its code uses.
fn used_names(code: &str) -> BTreeSet<String> {
    let toks = tokens(code);
    let mut out = BTreeSet::new();
    let mut i = 0;
    while i < toks.len() {
        if toks[i].text == "use" {
            i = use_tree(&toks, i + 1).1.max(i + 1);
            continue;
        }
        // A module's declaration names it, it does not use it.
        if toks[i].text == "mod" {
            i += 2;
            continue;
        }
        if toks[i].text.starts_with(is_ident) {
            out.insert(toks[i].text.clone());
        }
        i += 1;
    }
    out
}

// ---------------------------------------------------------------------------------------
// Graphs.

/// The strongly connected components of more than one node (Tarjan), each sorted.
fn cycles(edges: &BTreeMap<String, BTreeMap<String, Vec<String>>>) -> Vec<Vec<String>> {
    struct State<'a> {
        edges: &'a BTreeMap<String, BTreeMap<String, Vec<String>>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        let edges = s.edges;
        for w in edges.get(v).into_iter().flat_map(|m| m.keys()) {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = s.stack.pop().unwrap();
                s.on_stack.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.push(comp);
            }
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out.sort();
    s.out
}

// ---------------------------------------------------------------------------------------
// The lexer: comments and literals blanked, `#[cfg(test)]` items blanked, tokens.

fn is_ident(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

/// The code of a file: [`code_without_literals`], then every `#[cfg(test)]` item blanked.
fn code_of(text: &str) -> String {
    let mut code = code_without_literals(text);
    for (start, end) in cfg_test_items(&code) {
        for c in &mut code[start..end] {
            if *c != '\n' {
                *c = ' ';
            }
        }
    }
    code.into_iter().collect()
}

/// The text with comments (doc comments too) and the insides of string, raw string and char
/// literals replaced by spaces; newlines and the quotes themselves kept, so lines and
/// columns stay where they were. Lifetimes and labels (`'a`) are code.
fn code_without_literals(text: &str) -> Vec<char> {
    let c: Vec<char> = text.chars().collect();
    let mut out = Vec::with_capacity(c.len());
    let blank = |ch: char| if ch == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        let next = c.get(i + 1).copied();
        if ch == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if ch == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.extend([' ', ' ']);
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.extend([' ', ' ']);
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(c[i]));
                    i += 1;
                }
            }
        } else if ch == '"' {
            out.push('"');
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' && i + 1 < c.len() {
                    out.push(' ');
                    i += 1;
                }
                out.push(blank(c[i]));
                i += 1;
            }
            if i < c.len() {
                out.push('"');
                i += 1;
            }
        } else if ch == '\'' {
            let len = char_literal_len(&c, i);
            out.push('\'');
            if len > 1 {
                out.extend(c[i + 1..i + len - 1].iter().map(|&x| blank(x)));
                out.push('\'');
            }
            i += len;
        } else if is_ident(ch) {
            let start = i;
            while i < c.len() && is_ident(c[i]) {
                i += 1;
            }
            out.extend(&c[start..i]);
            let word: String = c[start..i].iter().collect();
            if word == "r" || word == "br" {
                i = raw_string(&c, i, &mut out);
            }
        } else {
            out.push(ch);
            i += 1;
        }
    }
    out
}

/// The length of the char literal starting at `c[i] == '\''` (`'x'`, `'\n'`, `'\u{1F600}'`,
/// `'{'`), or 1 when it is a lifetime or a label.
fn char_literal_len(c: &[char], i: usize) -> usize {
    if c.get(i + 1) == Some(&'\\') {
        let mut j = i + 3;
        while j < c.len() && c[j] != '\'' {
            j += 1;
        }
        return j + 1 - i;
    }
    if c.get(i + 2) == Some(&'\'') && c.get(i + 1).is_some_and(|&x| x != '\'') {
        return 3;
    }
    1
}

/// After an `r` or `br` prefix at `c[i]`: a raw string (`#`s then `"`) blanked into `out`,
/// returning where it ends; otherwise nothing taken (`i`), as for `r#ident`.
fn raw_string(c: &[char], i: usize, out: &mut Vec<char>) -> usize {
    let mut j = i;
    while c.get(j) == Some(&'#') {
        j += 1;
    }
    if c.get(j) != Some(&'"') {
        return i;
    }
    let hashes = j - i;
    out.extend(&c[i..=j]);
    j += 1;
    while j < c.len() {
        if c[j] == '"' && (1..=hashes).all(|k| c.get(j + k) == Some(&'#')) {
            out.extend(&c[j..=j + hashes]);
            return j + hashes + 1;
        }
        out.push(if c[j] == '\n' { '\n' } else { ' ' });
        j += 1;
    }
    j
}

/// The char ranges of the items under a `#[cfg(test)]` attribute (the attribute included):
/// up to the `;` or the closing `}` of the item, at its own bracket depth.
fn cfg_test_items(code: &[char]) -> Vec<(usize, usize)> {
    let attr: Vec<char> = "#[cfg(test)]".chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i + attr.len() <= code.len() {
        if code[i..i + attr.len()] != attr[..] {
            i += 1;
            continue;
        }
        let start = i;
        let mut j = i + attr.len();
        let mut depth = 0usize;
        // Past the item's end: its `;` or closing `}`, or a `,` after a field or an
        // argument; a closing bracket of what encloses it is not taken.
        let mut end = code.len();
        while j < code.len() {
            match code[j] {
                '(' | '[' | '{' => depth += 1,
                ')' | ']' | '}' if depth == 0 => {
                    end = j;
                    break;
                }
                ')' | ']' => depth -= 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = j + 1;
                        break;
                    }
                }
                ';' | ',' if depth == 0 => {
                    end = j + 1;
                    break;
                }
                _ => {}
            }
            j += 1;
        }
        out.push((start, end));
        i = end;
    }
    out
}

/// A token of code: an identifier, `::`, or one other non-space character.
#[derive(Debug)]
struct Token {
    text: String,
    line: usize,
}

fn tokens(code: &str) -> Vec<Token> {
    let c: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < c.len() {
        let start = i;
        if c[i] == '\n' {
            line += 1;
            i += 1;
            continue;
        } else if c[i].is_whitespace() {
            i += 1;
            continue;
        } else if is_ident(c[i]) {
            while i < c.len() && is_ident(c[i]) {
                i += 1;
            }
        } else if c[i] == ':' && c.get(i + 1) == Some(&':') {
            i += 2;
        } else {
            i += 1;
        }
        out.push(Token {
            text: c[start..i].iter().collect(),
            line,
        });
    }
    out
}

/// A path of a `use` tree, and the name it is brought in as (`as`), if renamed.
type UsePath = (Vec<String>, Option<String>);

/// The paths of a `use` tree (or an inline path) starting at `toks[i]`: `a::b::{c, d::e as
/// f, g::*}` gives `a::b::c`, `a::b::d::e` (alias `f`), `a::b::g`. Returns where it ends.
fn use_tree(toks: &[Token], mut i: usize) -> (Vec<UsePath>, usize) {
    let text = |i: usize| toks.get(i).map_or("", |t| t.text.as_str());
    let mut prefix = Vec::new();
    loop {
        match text(i) {
            "{" => {
                let mut out = Vec::new();
                i += 1;
                while !matches!(text(i), "}" | "") {
                    let (paths, next) = use_tree(toks, i);
                    out.extend(paths.into_iter().map(|(p, alias)| {
                        let mut full = prefix.clone();
                        full.extend(p);
                        (full, alias)
                    }));
                    i = next;
                    if text(i) == "," {
                        i += 1;
                    }
                }
                return (out, i + 1);
            }
            "*" => return (vec![(prefix, None)], i + 1),
            t if t.starts_with(is_ident) => {
                prefix.push(t.to_string());
                i += 1;
                if text(i) == "::" {
                    i += 1;
                    continue;
                }
                let alias = (text(i) == "as").then(|| text(i + 1).to_string());
                if alias.is_some() {
                    i += 2;
                }
                return (vec![(prefix, alias)], i);
            }
            _ => return (vec![(prefix, None)], i),
        }
    }
}

/// `mod x {` items (inline modules), with their lines.
fn inline_modules(code: &str) -> Vec<(usize, String)> {
    let toks = tokens(code);
    toks.windows(3)
        .filter(|w| w[0].text == "mod" && w[2].text == "{")
        .map(|w| (w[0].line, w[1].text.clone()))
        .collect()
}

/// A function item with a body.
#[derive(Debug, PartialEq)]
struct Function {
    name: String,
    /// The line of `fn`.
    line: usize,
    /// From the `fn` line to the line of the closing brace, both counted.
    lines: usize,
}

/// Every `fn` item with a body in code (methods and nested functions too; not `fn(..)`
/// pointer types, not bodiless trait declarations), measured by its braces.
fn functions(code: &str) -> Vec<Function> {
    let toks = tokens(code);
    let mut out = Vec::new();
    for (i, t) in toks.iter().enumerate() {
        if t.text != "fn"
            || !toks
                .get(i + 1)
                .is_some_and(|n| n.text.starts_with(is_ident))
        {
            continue;
        }
        // The body is the first `{` outside parentheses and brackets, unless a `;` comes first.
        let mut depth = 0i32;
        let mut open = None;
        for (j, u) in toks.iter().enumerate().skip(i + 2) {
            match u.text.as_str() {
                "(" | "[" => depth += 1,
                ")" | "]" => depth -= 1,
                "{" if depth == 0 => {
                    open = Some(j);
                    break;
                }
                ";" if depth == 0 => break,
                _ => {}
            }
        }
        let Some(open) = open else { continue };
        let mut braces = 0i32;
        let close = toks[open..].iter().find(|u| {
            match u.text.as_str() {
                "{" => braces += 1,
                "}" => braces -= 1,
                _ => {}
            }
            braces == 0
        });
        let end_line = close.map_or(toks.last().unwrap().line, |u| u.line);
        out.push(Function {
            name: toks[i + 1].text.clone(),
            line: t.line,
            lines: end_line - t.line + 1,
        });
    }
    out
}

// ---------------------------------------------------------------------------------------
// The parser's own tests.

fn code(text: &str) -> String {
    code_of(text)
}

#[test]
fn comments_and_literals_are_blanked_lines_kept() {
    let text =
        "let a = \"{ // not a comment\"; // a { comment\n/* { /* nested */ } */ let b = '{';\n";
    let c = code(text);
    assert_eq!(c.lines().count(), text.lines().count());
    assert_eq!(c.chars().count(), text.chars().count());
    assert!(!c.contains('{'), "{c:?}");
    assert!(c.contains("let a = \""));
    assert!(c.contains("let b = ' '"));
}

#[test]
fn raw_strings_byte_strings_and_escapes_are_literals() {
    let c =
        code("let a = r#\"}\"# ; let b = br\"{\"; let c = \"\\\"}\"; let d = b'}'; let e = '\\'';");
    assert!(!c.contains('{') && !c.contains('}'), "{c:?}");
    assert!(c.contains("let e = '  '"), "{c:?}");
    // `r#ident` is an identifier, not a raw string.
    let c = code("let r#type = 1; fn f() {}");
    assert!(c.contains("fn f() {}"), "{c:?}");
}

#[test]
fn lifetimes_and_labels_are_code() {
    let text = "fn f<'a>(x: &'a str) -> &'a str { 'outer: loop { break 'outer; } x }";
    assert_eq!(code(text), text);
    let fs = functions(text);
    assert_eq!(
        fs,
        [Function {
            name: "f".into(),
            line: 1,
            lines: 1
        }]
    );
}

#[test]
fn functions_are_measured_by_their_braces() {
    let text = "\
impl A {
    fn a(&self) -> Vec<[u8; 2]> {
        let s = \"}}}\";
        let c = '}';
        // }
        fn inner() {
        }
        vec![]
    }
}
trait T { fn decl(&self); fn with_default() -> u8 { 0 } }
type F = fn(u8) -> u8;
fn g<T>(f: impl Fn(u8) -> u8) -> u8
where
    T: Copy,
{
    f(1)
}
";
    let got: Vec<(String, usize, usize)> = functions(&code(text))
        .into_iter()
        .map(|f| (f.name, f.line, f.lines))
        .collect();
    assert_eq!(
        got,
        [
            ("a".to_string(), 2, 8),
            ("inner".to_string(), 6, 2),
            ("with_default".to_string(), 11, 1),
            ("g".to_string(), 13, 6),
        ]
    );
}

#[test]
fn cfg_test_items_are_dropped() {
    let text = "\
use crate::a::X;
#[cfg(test)]
use crate::b::Y;
#[cfg(test)]
mod tests {
    use crate::c::Z;
    fn big() { let s = \"}\"; }
}
#[cfg(test)]
mod fixtures;
fn after() {}
";
    let c = code(text);
    assert!(c.contains("crate::a::X"));
    assert!(!c.contains("crate::b") && !c.contains("crate::c") && !c.contains("big"));
    assert!(c.contains("fn after() {}"));
    assert_eq!(test_modules(text), ["fixtures"]);
    // A field or an expression under the attribute ends at its comma or at the enclosing
    // bracket, which stays.
    let c = code("struct S { #[cfg(test)] a: u8, b: u8 }\nfn f() { g(1, #[cfg(test)] 2) }");
    let words: Vec<&str> = c.split_whitespace().collect();
    assert_eq!(words.join(" "), "struct S { b: u8 } fn f() { g(1, ) }");
}

#[test]
fn paths_are_read_from_use_groups_inline_paths_and_super() {
    let text = "\
use crate::{a, b::{c, d::E as F}, self as _};
use super::super::g::H;
use super::{sib, Local};
pub(crate) fn f() { crate::i::j(); let x = y.crate_like::k; child::call(); other::z(); }
mod child;
";
    let f = File {
        path: "src/m/n/o.rs".into(),
        module: module_path("src/m/n/o.rs"),
        code: code(text),
        text: text.into(),
        test_only: false,
        binary: false,
    };
    assert_eq!(f.module, ["m", "n", "o"]);
    let got: Vec<(usize, String)> = absolute_paths(&f)
        .into_iter()
        .map(|r| (r.line, r.path.join("::")))
        .collect();
    let want = [
        (1, "a"),
        (1, "b::c"),
        (1, "b::d::E"),
        (1, ""),
        (2, "m::g::H"),
        (3, "m::n::sib"),
        (3, "m::n::Local"),
        (4, "i::j"),
        (4, "m::n::o::child::call"),
    ];
    let want: Vec<(usize, String)> = want.iter().map(|(l, p)| (*l, p.to_string())).collect();
    assert_eq!(got, want);
}

#[test]
fn cycles_are_found_and_a_tree_has_none() {
    let edges = |pairs: &[(&str, &str)]| {
        let mut e: BTreeMap<String, BTreeMap<String, Vec<String>>> = BTreeMap::new();
        for (a, b) in pairs {
            e.entry(a.to_string())
                .or_default()
                .insert(b.to_string(), vec![]);
            e.entry(b.to_string()).or_default();
        }
        e
    };
    assert!(cycles(&edges(&[("a", "b"), ("b", "c"), ("a", "c")])).is_empty());
    assert_eq!(
        cycles(&edges(&[
            ("a", "b"),
            ("b", "c"),
            ("c", "a"),
            ("c", "d"),
            ("d", "e"),
            ("e", "d")
        ])),
        [vec!["a", "b", "c"], vec!["d", "e"]]
    );
}

#[test]
fn imports_are_followed_to_where_a_name_comes_from() {
    let src = Source::from_files(
        [
            (
                "src/lib.rs",
                "pub mod vocab;\npub mod c;\npub mod z;\npub use c::Run;\n",
            ),
            ("src/vocab.rs", "pub struct Sides;\n"),
            (
                "src/c/mod.rs",
                "mod a;\nmod b;\npub use crate::vocab::Sides;\npub use a::A;\n\
                 pub use b::{helper, B};\npub struct Run;\nfn run() { b::helper(); }\n",
            ),
            ("src/c/a.rs", "use super::Sides;\npub struct A(Sides);\n"),
            (
                "src/c/b.rs",
                "use super::{Run, A};\npub struct B(A, Run);\npub fn helper() {}\n",
            ),
            ("src/z.rs", "/// crate::vocab::Sides\nuse crate::Run;\n"),
        ]
        .iter()
        .map(|(p, t)| (p.to_string(), t.to_string()))
        .collect(),
    );
    let refs: Vec<String> = src
        .references()
        .iter()
        .map(|r| format!("{}:{} {} -> {}", r.file, r.line, r.from, r.to))
        .collect();
    assert_eq!(refs, ["src/c/mod.rs:3 c -> vocab", "src/z.rs:2 z -> c"]);
    let edges = src.file_edges("c");
    let listed: Vec<String> = edges
        .iter()
        .flat_map(|(from, to)| {
            to.iter()
                .map(move |(to, at)| format!("{from} -> {to} {at:?}"))
        })
        .collect();
    // `a.rs` uses `Sides`, which `mod.rs` only passes on from `vocab`; `b.rs` takes `A` from
    // `a.rs` through `mod.rs`, and `Run` from `mod.rs` itself; `mod.rs` re-exports `a::A`
    // and `b::B` without using them, but calls `b::helper`.
    assert_eq!(
        listed,
        [
            r#"src/c/b.rs -> src/c/a.rs ["line 1"]"#,
            r#"src/c/b.rs -> src/c/mod.rs ["line 1"]"#,
            r#"src/c/mod.rs -> src/c/b.rs ["line 5", "line 7"]"#,
        ]
    );
    assert_eq!(cycles(&edges), [vec!["src/c/b.rs", "src/c/mod.rs"]]);
}
