//! The house: which module may import which, and the unit tests that keep it so
//! (docs/design.md, "The house").
//!
//! [`UNITS`] is the one table. Each source file belongs to the unit whose module path is the
//! longest prefix of its own (`src/services/plan/desired.rs` is `services::plan::desired`,
//! in unit `services::plan`); every `crate::` path in its code (use lines, grouped use
//! trees, paths written inline) and every `super::` path that leaves its unit names the unit
//! it imports. An import is allowed when it stays in the unit, goes to a lower layer, or
//! goes to a unit of the same layer that the table lists. The tests also check that the
//! Services wing's plan files are pure (no tokio, no kube crate, no `async`; their tests may
//! build inputs that carry a tokio instant), that nothing hides an import from the table
//! (an alias of the crate root, a `#[path]` module, a macro-built path, a `use` in
//! `lib.rs`), and that
//! no two files of `src/` or `xtask/src/` import each other in a cycle (a file importing
//! from its own ancestor module, the facade that declares it, does not count; so a cycle
//! through a parent's `pub use` of a sibling is not seen: import from the sibling itself).
//!
//! The way `cmd/manifest/rbac.rs` ties `API_CALLS` to the code: the table is data, and a
//! test reads the source tree to hold the code to it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A floor of the house; a unit may import any unit of a lower floor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Layer {
    /// `lease`, `kube`, `net`, `obs`, `syntax`: no domain module.
    Foundation,
    /// `election`, `holder`, `peer`, `nodes`, `dhcp`.
    Core,
    /// `controlplane`, `services`, `ipam`, `egress`, `routed`.
    Wing,
    /// `config`.
    Config,
    /// `cmd::*` (and `main.rs`, outside the library).
    Command,
}

/// Every unit: its module path, its floor, and the units of the same floor it may import.
#[rustfmt::skip]
const UNITS: &[(&str, Layer, &[&str])] = &[
    // Commands: none imports another.
    ("cmd",                 Layer::Command,    &[]),
    ("cmd::drain",          Layer::Command,    &[]),
    ("cmd::manager",        Layer::Command,    &[]),
    ("cmd::manifest",       Layer::Command,    &[]),
    ("cmd::preflight",      Layer::Command,    &[]),
    ("cmd::probe",          Layer::Command,    &[]),
    ("cmd::status",         Layer::Command,    &[]),
    ("config",              Layer::Config,     &[]),
    // Wings: never each other. The Services plan is pure and below its runtime; so is the
    // IPAM core (ipam::pool, ipam::inuse, ipam::decide).
    ("controlplane",        Layer::Wing,       &[]),
    ("services",            Layer::Wing,       &["services::plan"]),
    ("services::plan",      Layer::Wing,       &[]),
    ("ipam",                Layer::Wing,       &[]),
    ("egress",              Layer::Wing,       &[]),
    ("routed",              Layer::Wing,       &[]),
    // Cores: election is the lowest; holder, peer and nodes may import it.
    ("election",            Layer::Core,       &[]),
    ("holder",              Layer::Core,       &["election"]),
    ("peer",                Layer::Core,       &["election"]),
    ("nodes",               Layer::Core,       &["election"]),
    ("dhcp",                Layer::Core,       &[]),
    // Foundation: syntax at the bottom.
    ("lease",               Layer::Foundation, &[]),
    ("kube",                Layer::Foundation, &["obs", "syntax"]),
    ("net",                 Layer::Foundation, &["syntax"]),
    ("obs",                 Layer::Foundation, &["syntax"]),
    ("syntax",              Layer::Foundation, &[]),
    // This table's own tests.
    ("layers",              Layer::Foundation, &[]),
];

/// The unit of module path `module` (segments without `crate`): the longest prefix listed
/// in [`UNITS`]; `None` for the crate root and for paths outside the table.
fn unit_of(module: &[String]) -> Option<&'static str> {
    (1..=module.len()).rev().find_map(|n| {
        let prefix = module[..n].join("::");
        UNITS.iter().find(|u| u.0 == prefix).map(|u| u.0)
    })
}

fn layer(unit: &str) -> Option<(Layer, &'static [&'static str])> {
    UNITS.iter().find(|u| u.0 == unit).map(|u| (u.1, u.2))
}

/// Whether unit `from` may import unit `to`.
fn allowed(from: &str, to: &str) -> bool {
    if from == to {
        return true;
    }
    match (layer(from), layer(to)) {
        (Some((lf, same)), Some((lt, _))) => lt < lf || (lt == lf && same.contains(&to)),
        _ => false,
    }
}

/// The module path of a source file relative to its crate's `src/` (`a/b.rs` and
/// `a/b/mod.rs` are `a::b`; `lib.rs` and `main.rs` are the root).
fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The code of a file without comments and string literals (so `// crate::x` in a doc and
/// `"http://..."` in a string name nothing), raw identifiers written plainly (`r#services`
/// is `services`), white space around `::` removed (`crate :: x` is `crate::x`) and
/// `self::` dropped (`self::super::x` is `super::x`).
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let boundary = |i: usize| i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                    i += 1;
                }
                i += 2;
            }
            // A raw string (`r"..."`, `r#"..."#`, `br"..."`): to the quote and as many `#`.
            b'r' if boundary(i) || (i > 0 && b[i - 1] == b'b' && boundary(i - 1)) => {
                let mut j = i + 1;
                while b.get(j) == Some(&b'#') {
                    j += 1;
                }
                let hashes = j - i - 1;
                if b.get(j) == Some(&b'"') {
                    let close: Vec<u8> = std::iter::once(b'"')
                        .chain(std::iter::repeat_n(b'#', hashes))
                        .collect();
                    j += 1;
                    while j < b.len() && !b[j..].starts_with(&close) {
                        j += 1;
                    }
                    i = j + close.len();
                    out.push_str("\"\"");
                } else if hashes == 1
                    && b.get(j)
                        .is_some_and(|c| c.is_ascii_alphabetic() || *c == b'_')
                {
                    i = j; // a raw identifier: its name
                } else {
                    out.push('r');
                    i += 1;
                }
            }
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
                out.push_str("\"\"");
            }
            // A char literal ('"', '\'') or a lifetime ('a): skip a literal only.
            b'\'' if b.get(i + 2) == Some(&b'\'') => i += 3,
            b'\'' if b.get(i + 1) == Some(&b'\\') => {
                i += 2;
                while i < b.len() && b[i] != b'\'' {
                    i += 1;
                }
                i += 1;
            }
            c => {
                out.push(c as char);
                i += 1;
            }
        }
    }
    normalize_paths(&out)
}

/// `out` with white space around `::` removed and every `self::` dropped.
fn normalize_paths(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find("::") {
        out.push_str(rest[..at].trim_end());
        out.push_str("::");
        rest = rest[at + 2..].trim_start();
    }
    out.push_str(rest);
    let mut plain = String::with_capacity(out.len());
    let mut rest = out.as_str();
    while let Some(at) = rest.find("self::") {
        let before = &rest[..at];
        let word = before
            .chars()
            .next_back()
            .is_some_and(|c| is_ident(c) || c == ':');
        plain.push_str(before);
        if word {
            plain.push_str("self::");
        }
        rest = &rest[at + "self::".len()..];
    }
    plain.push_str(rest);
    plain
}

/// Forms that would hide an import from the table, as `file: what`: an alias of the crate
/// root or of a parent (`use crate as r`, `crate::{self as r}`, `use super::super as r`),
/// a module file picked by `#[path]`, a path built by a macro (`crate::$m`), and any `use`
/// in the crate root (a re-export there would let every module import anything).
fn hidden_imports(f: &File) -> Vec<String> {
    let mut out = Vec::new();
    let code = &f.code;
    for (form, what) in [
        ("crate as ", "an alias of the crate root"),
        ("{self as ", "an alias of a module"),
        ("super as ", "an alias of a parent module"),
        ("#[path", "a #[path] module"),
        ("crate::$", "a path built by a macro"),
        ("super::$", "a path built by a macro"),
    ] {
        if code.contains(form) {
            out.push(format!("{}: {what} ({form})", f.rel.display()));
        }
    }
    if f.module.is_empty() && f.rel == Path::new("lib.rs") && code.contains("use ") {
        out.push(format!("{}: a use in the crate root", f.rel.display()));
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Expands the use tree or path that starts at `s` (just after `crate::` or `super::`) into
/// its paths, segments only (`{a::b, c::{d, e}}` gives `a::b`, `c::d`, `c::e`).
fn expand(s: &str) -> Vec<Vec<String>> {
    fn tree(s: &[char], i: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
        let mut path = prefix.to_vec();
        loop {
            while *i < s.len() && s[*i].is_whitespace() {
                *i += 1;
            }
            if *i < s.len() && s[*i] == '{' {
                *i += 1;
                loop {
                    tree(s, i, &path, out);
                    while *i < s.len() && s[*i].is_whitespace() {
                        *i += 1;
                    }
                    match s.get(*i) {
                        Some(',') => *i += 1,
                        Some('}') => {
                            *i += 1;
                            return;
                        }
                        _ => return,
                    }
                    while *i < s.len() && s[*i].is_whitespace() {
                        *i += 1;
                    }
                    if s.get(*i) == Some(&'}') {
                        *i += 1;
                        return;
                    }
                }
            }
            let start = *i;
            while *i < s.len() && is_ident(s[*i]) {
                *i += 1;
            }
            if *i > start {
                path.push(s[start..*i].iter().collect());
            }
            if s.get(*i) == Some(&':') && s.get(*i + 1) == Some(&':') {
                *i += 2;
                continue;
            }
            if path.last().is_some_and(|p| p == "self") {
                path.pop(); // `a::{self, b}` names `a`
            }
            out.push(path);
            return;
        }
    }
    let chars: Vec<char> = s.chars().take(4096).collect();
    let mut out = Vec::new();
    tree(&chars, &mut 0, &[], &mut out);
    out
}

/// Every module path a file's code names: `crate::` paths as they are, `super::` paths
/// resolved against the module they are written in (the file's module path `module`, or an
/// inline `mod name { ... }` inside it).
fn imports(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let chars: Vec<char> = code.chars().collect();
    let at = |i: usize, word: &str| {
        word.chars()
            .enumerate()
            .all(|(k, c)| chars.get(i + k) == Some(&c))
    };
    let boundary = |i: usize| i == 0 || !(is_ident(chars[i - 1]) || chars[i - 1] == ':');
    let mut out = Vec::new();
    // Paths through a child module declared in this file (`mod manager;` then
    // `use manager::admin`), resolved against the file's module.
    let mut cur = 0;
    while let Some(off) = code[cur..].find("mod ") {
        let pos = cur + off;
        cur = pos + 4;
        if pos > 0 && code[..pos].chars().next_back().is_some_and(is_ident) {
            continue;
        }
        let name: String = code[cur..].chars().take_while(|c| is_ident(*c)).collect();
        if name.is_empty() || !code[cur + name.len()..].trim_start().starts_with(';') {
            continue;
        }
        let prefix = format!("{name}::");
        let mut from = 0;
        while let Some(o) = code[from..].find(&prefix) {
            let p = from + o;
            from = p + prefix.len();
            if p > 0
                && code[..p]
                    .chars()
                    .next_back()
                    .is_some_and(|c| is_ident(c) || c == ':')
            {
                continue;
            }
            for rest in expand(&code[from..]) {
                let mut full = module.to_vec();
                full.push(name.clone());
                full.extend(rest);
                out.push(full);
            }
        }
    }
    // (module path, brace depth inside it) of the inline modules we are in.
    let mut inline: Vec<(Vec<String>, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < chars.len() {
        let current = inline.last().map_or(module, |m| m.0.as_slice());
        if chars[i] == '{' {
            depth += 1;
        } else if chars[i] == '}' {
            if inline.last().is_some_and(|m| m.1 == depth) {
                inline.pop();
            }
            depth = depth.saturating_sub(1);
        } else if boundary(i) && at(i, "mod ") {
            let mut j = i + 4;
            let start = j;
            while j < chars.len() && is_ident(chars[j]) {
                j += 1;
            }
            let name: String = chars[start..j].iter().collect();
            while j < chars.len() && chars[j].is_whitespace() {
                j += 1;
            }
            if chars.get(j) == Some(&'{') && !name.is_empty() {
                let mut m = current.to_vec();
                m.push(name);
                depth += 1;
                inline.push((m, depth));
                i = j + 1;
                continue;
            }
        } else if boundary(i) && at(i, "crate::") {
            let rest: String = chars[i + 7..].iter().take(4096).collect();
            out.extend(expand(&rest));
            i += 7;
            continue;
        } else if boundary(i) && at(i, "super::") {
            let mut base = current.to_vec();
            base.pop();
            let mut j = i + 7;
            while at(j, "super::") {
                base.pop();
                j += 7;
            }
            let rest: String = chars[j..].iter().take(4096).collect();
            for p in expand(&rest) {
                let mut full = base.clone();
                full.extend(p);
                out.push(full);
            }
            i = j;
            continue;
        }
        i += 1;
    }
    out
}

/// One source file: its module path and its code without comments and strings.
struct File {
    rel: PathBuf,
    module: Vec<String>,
    code: String,
}

fn read_tree(src: &Path) -> Vec<File> {
    fn walk(dir: &Path, base: &Path, out: &mut Vec<File>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
            .map(|e| e.expect("dir entry").path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(&p, base, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(base).expect("under base").to_path_buf();
                let text = std::fs::read_to_string(&p).expect("readable source");
                out.push(File {
                    module: module_of(&rel),
                    code: code_only(&text),
                    rel,
                });
            }
        }
    }
    let mut out = Vec::new();
    walk(src, src, &mut out);
    out
}

/// Every import of `files` that goes against [`UNITS`], as `file: from -> to (path)`.
fn violations(files: &[File]) -> Vec<String> {
    let mut out = Vec::new();
    for f in files {
        if f.rel == Path::new("main.rs") {
            continue; // the binary, above every layer
        }
        out.extend(hidden_imports(f));
        let Some(from) = unit_of(&f.module) else {
            if !f.module.is_empty() {
                out.push(format!("{}: not in the table", f.rel.display()));
            }
            continue;
        };
        for path in imports(&f.code, &f.module) {
            let Some(to) = unit_of(&path) else { continue };
            if !allowed(from, to) {
                out.push(format!(
                    "{}: {from} -> {to} (crate::{})",
                    f.rel.display(),
                    path.join("::")
                ));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The file of the deepest module of `path` that has a file among `modules`.
fn file_of(path: &[String], modules: &BTreeMap<Vec<String>, usize>) -> Option<usize> {
    (1..=path.len())
        .rev()
        .find_map(|n| modules.get(&path[..n].to_vec()).copied())
}

/// The import cycles between files (each as the files in it), ignoring a file's imports
/// of its own ancestors (the module files that declare it).
fn cycles(files: &[File]) -> Vec<Vec<String>> {
    let modules: BTreeMap<Vec<String>, usize> = files
        .iter()
        .enumerate()
        .filter(|(_, f)| f.rel != Path::new("main.rs"))
        .map(|(i, f)| (f.module.clone(), i))
        .collect();
    let mut edges: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); files.len()];
    for (i, f) in files.iter().enumerate() {
        for path in imports(&f.code, &f.module) {
            let Some(j) = file_of(&path, &modules) else {
                continue;
            };
            let target = &files[j].module;
            if j != i && !f.module.starts_with(target) {
                edges[i].insert(j);
            }
        }
    }
    // Tarjan's strongly connected components.
    struct Scc<'a> {
        edges: &'a [BTreeSet<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(s: &mut Scc<'_>, v: usize) {
        s.index[v] = Some(s.next);
        s.low[v] = s.next;
        s.next += 1;
        s.stack.push(v);
        s.on[v] = true;
        for &w in s.edges[v].iter() {
            match s.index[w] {
                None => {
                    visit(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on[w] => s.low[v] = s.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on[w] = false;
                comp.push(w);
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                s.out.push(comp);
            }
        }
    }
    let mut s = Scc {
        edges: &edges,
        index: vec![None; files.len()],
        low: vec![0; files.len()],
        on: vec![false; files.len()],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..files.len() {
        if s.index[v].is_none() {
            visit(&mut s, v);
        }
    }
    s.out
        .into_iter()
        .map(|c| {
            let mut names: Vec<String> = c
                .iter()
                .map(|&i| files[i].rel.display().to_string())
                .collect();
            names.sort();
            names
        })
        .collect()
}

/// What makes a Services plan file (or an IPAM core file) impure, if anything: tokio,
/// `async` (functions or blocks), the kernel seam, or the kube crate itself (`crate::kube`,
/// the foundation's vocabulary, is fine).
fn impure(f: &File) -> Option<&'static str> {
    let code = &f.code;
    for word in ["tokio", "async", "crate::net::Kernel"] {
        let used = code.match_indices(word).any(|(i, _)| {
            let before = code[..i].chars().next_back();
            let after = code[i + word.len()..].chars().next();
            !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
        });
        if used {
            return Some(word);
        }
    }
    let kube_crate = code.match_indices("kube::").any(|(i, _)| {
        let before = &code[..i];
        !before.ends_with("crate::") && !before.chars().next_back().is_some_and(is_ident)
    });
    kube_crate.then_some("the kube crate")
}

fn crate_src(krate: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(krate)
        .join("src")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(rel: &str, code: &str) -> File {
        let rel = PathBuf::from(rel);
        File {
            module: module_of(&rel),
            code: code_only(code),
            rel,
        }
    }

    #[test]
    fn every_import_of_src_follows_the_table() {
        let files = read_tree(&crate_src(""));
        assert!(files.len() > 100, "read {} files", files.len());
        let bad = violations(&files);
        assert!(
            bad.is_empty(),
            "imports against the house's table:\n{}",
            bad.join("\n")
        );
    }

    #[test]
    fn no_import_cycle_in_src_or_xtask() {
        for krate in ["", "xtask"] {
            let files = read_tree(&crate_src(krate));
            let found = cycles(&files);
            assert!(found.is_empty(), "import cycles in {krate}/src: {found:#?}");
        }
    }

    #[test]
    fn the_services_plan_is_pure() {
        let files = read_tree(&crate_src(""));
        // The plan's tests may build what its inputs carry (an election's end holds a tokio
        // instant); its code may not.
        let plan: Vec<&File> = files
            .iter()
            .filter(|f| f.module.starts_with(&["services".into(), "plan".into()]))
            .filter(|f| !f.module.iter().any(|m| m == "tests"))
            .collect();
        assert!(plan.len() >= 3, "found {} plan files", plan.len());
        for f in plan {
            assert_eq!(impure(f), None, "{}", f.rel.display());
        }
    }

    #[test]
    fn the_ipam_core_is_pure() {
        let files = read_tree(&crate_src(""));
        let core: Vec<&File> = files
            .iter()
            .filter(|f| {
                ["pool", "inuse", "decide"]
                    .iter()
                    .any(|m| f.module.starts_with(&["ipam".into(), (*m).into()]))
            })
            .collect();
        assert!(core.len() >= 3, "found {} ipam core files", core.len());
        for f in core {
            assert_eq!(impure(f), None, "{}", f.rel.display());
        }
    }

    #[test]
    fn an_upward_or_sideways_import_is_found() {
        let files = [
            file("net/vip.rs", "use crate::holder::VipSpec;\n"),
            file(
                "election/mod.rs",
                "use crate::{holder::FENCE, lease::Timing};\n",
            ),
            file(
                "services/group.rs",
                "fn f() { crate::controlplane::start(); }\n",
            ),
            file(
                "cmd/drain.rs",
                "mod tests { use super::*; use super::super::manager::admin; }\n",
            ),
            file(
                "cmd/probe/report.rs",
                "mod tests { use super::*; fn f() { super::super::stats::x(); } }\n",
            ),
            file("kube/client.rs", "use crate::config::Config;\n"),
            file(
                "obs/metrics.rs",
                "use super::super::nodes::eligibility::Ineligible;\n",
            ),
            file(
                "holder/task.rs",
                "use crate::election::Gates; use crate::net::Vip; use super::probe::X;\n",
            ),
            file(
                "services/plan/decide.rs",
                "use crate::services::group::GroupSpec;\n",
            ),
        ];
        let bad = violations(&files);
        assert_eq!(
            bad,
            [
                "cmd/drain.rs: cmd::drain -> cmd::manager (crate::cmd::manager::admin)",
                "election/mod.rs: election -> holder (crate::holder::FENCE)",
                "kube/client.rs: kube -> config (crate::config::Config)",
                "net/vip.rs: net -> holder (crate::holder::VipSpec)",
                "obs/metrics.rs: obs -> nodes (crate::nodes::eligibility::Ineligible)",
                "services/group.rs: services -> controlplane (crate::controlplane::start)",
                "services/plan/decide.rs: services::plan -> services (crate::services::group::GroupSpec)",
            ]
        );
    }

    /// Forms a fresh user's attack found (issue 24's trial): spaces around `::`, `self::`,
    /// raw identifiers and strings, a child module's path, and the forms that would hide an
    /// import altogether (aliases of the crate root, `#[path]`, macro-built paths, a `use`
    /// in `lib.rs`).
    #[test]
    fn imports_written_in_other_forms_are_found() {
        let files = [
            file("net/arp.rs", "use crate :: services\n :: Settings;\n"),
            file(
                "holder/task.rs",
                "use self::super::super::services::Settings;\n",
            ),
            file("net/netlink.rs", "use crate::r#services::Settings;\n"),
            file(
                "net/addr_socket.rs",
                "const Q: &str = r#\"\"\"#; use crate::services::Settings;\n",
            ),
            file(
                "cmd/mod.rs",
                "pub mod drain;\nmod manager;\nuse manager::admin;\n",
            ),
            file("net/iface.rs", "use crate::{services::{self, Settings}};\n"),
        ];
        assert_eq!(
            violations(&files),
            [
                "cmd/mod.rs: cmd -> cmd::manager (crate::cmd::manager::admin)",
                "holder/task.rs: holder -> services (crate::services::Settings)",
                "net/addr_socket.rs: net -> services (crate::services::Settings)",
                "net/arp.rs: net -> services (crate::services::Settings)",
                "net/iface.rs: net -> services (crate::services)",
                "net/iface.rs: net -> services (crate::services::Settings)",
                "net/netlink.rs: net -> services (crate::services::Settings)",
            ]
        );
        let hidden = [
            file(
                "net/mac_in_use.rs",
                "use crate as root; use root::services::Settings;",
            ),
            file("net/conflict.rs", "use crate::{self as r};"),
            file("net/packet.rs", "use super::super as r;"),
            file(
                "net/vip.rs",
                "#[path = \"../services/hidden.rs\"] mod hidden;",
            ),
            file(
                "net/cache.rs",
                "macro_rules! up { ($m:ident) => { crate::$m::Settings } }",
            ),
            file("lib.rs", "pub mod net;\npub use services::Settings as S;"),
        ];
        let found = violations(&hidden);
        for f in &hidden {
            let name = f.rel.display().to_string();
            assert!(
                found.iter().any(|v| v.starts_with(&name)),
                "{name}: {found:?}"
            );
        }
        let plan = |code: &str| file("services/plan/desired.rs", code);
        assert_eq!(
            impure(&plan("fn f() { let x = async  { 1 }; }")),
            Some("async")
        );
        assert_eq!(impure(&plan("pub async  fn f() {}")), Some("async"));
        assert_eq!(
            impure(&plan("use kube::{Client, Api};")),
            Some("the kube crate")
        );
        assert_eq!(impure(&plan("use tokio::time::Instant;")), Some("tokio"));
        assert_eq!(
            impure(&plan("use crate::kube::ObjectKey; fn asyncish() {}")),
            None
        );
    }

    #[test]
    fn comments_and_strings_name_no_module() {
        let f = file(
            "net/vip.rs",
            "//! see [`crate::holder`]\n/* crate::config */ const U: &str = \"crate::cmd\"; \
             let c = '\"'; use crate::syntax::x;\n",
        );
        assert_eq!(violations(std::slice::from_ref(&f)), Vec::<String>::new());
        assert_eq!(imports(&f.code, &f.module), [vec!["syntax", "x"]]);
    }

    #[test]
    fn a_cycle_between_siblings_is_found_and_a_facade_is_not_one() {
        let files = [
            file(
                "net/mod.rs",
                "pub use self::netlink::Kernel; use crate::net::addr_socket::A;",
            ),
            file(
                "net/netlink.rs",
                "use super::addr_socket::send; use crate::net::Vip;",
            ),
            file("net/addr_socket.rs", "use crate::net::netlink::decode;"),
        ];
        assert_eq!(
            cycles(&files),
            [vec![
                "net/addr_socket.rs".to_string(),
                "net/netlink.rs".into()
            ]]
        );
        let files = [
            file("net/mod.rs", "use crate::net::addr_socket::A;"),
            file(
                "net/netlink.rs",
                "use super::addr_socket::send; use crate::net::Vip;",
            ),
            file("net/addr_socket.rs", "use super::Lifetime;"),
        ];
        assert_eq!(cycles(&files), Vec::<Vec<String>>::new());
    }
}
