//! Per-Service node selection: the [`NODE_SELECTOR_ANNOTATION`] annotation holds a
//! Kubernetes label selector in its string form (what `kubectl get -l` and a
//! `LabelSelector`'s `String()` accept), and only nodes whose Node labels match campaign for
//! that Service (MetalLB's L2Advertisement `nodeSelectors` is the model).
//!
//! The grammar is apimachinery's `labels.Parse`: comma-separated requirements, each one of
//! `key`, `!key`, `key=value`, `key==value`, `key!=value`, `key in (v1,v2)`,
//! `key notin (v1,v2)`, with optional whitespace between tokens. Keys are qualified names
//! (`[prefix/]name`: a DNS-1123 subdomain prefix, a name of 1 to 63 characters), values
//! label values (0 to 63 characters); both as `validation.IsQualifiedName` /
//! `IsValidLabelValue` check them. The numeric `gt` / `lt` operators (`key>1`) are refused:
//! they are rarely used on nodes and `kube::core::Expression` cannot hold them. Matching is
//! kube's [`kube::core::SelectorExt`].

use std::collections::{BTreeMap, BTreeSet};

use kube::core::{Expression, Selector, SelectorExt};

/// `vipd.io/node-selector`: a label selector on a Service; only nodes whose labels match
/// campaign for it. An invalid value: the Service is announced by no node (Warning Event
/// `InvalidConfiguration` naming the value).
pub const NODE_SELECTOR_ANNOTATION: &str = "vipd.io/node-selector";

/// `vipd.io/preferred-nodes`: an ordered, comma-separated list of node names on a Service;
/// listed nodes campaign for it before the others, the first before the second
/// ([`crate::election::spread::preference_delay`]); with `svc_failback` a more preferred
/// node that returns gets it back by a graceful hand-over. An invalid value: a Warning
/// `InvalidConfiguration` naming it, and no preference.
pub const PREFERRED_NODES_ANNOTATION: &str = "vipd.io/preferred-nodes";

/// Parses a [`PREFERRED_NODES_ANNOTATION`] value: node names (DNS-1123 subdomains, as the
/// API server validates Node names) separated by commas, spaces around each allowed.
///
/// # Errors
/// A message naming the first entry that is not a node name.
pub fn parse_preferred_nodes(text: &str) -> Result<Vec<String>, String> {
    text.split(',')
        .map(str::trim)
        .map(|n| {
            if crate::syntax::is_dns1123_subdomain(n) {
                Ok(n.to_string())
            } else {
                Err(format!(
                    "entry {n:?} is not a node name (a DNS-1123 subdomain: lower-case letters, digits, '-' and '.')"
                ))
            }
        })
        .collect()
}

/// A parsed node selector and its text as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSelector {
    /// The annotation's value, for messages.
    pub text: String,
    selector: Selector,
}

impl NodeSelector {
    /// Parses `text` (see the module docs).
    ///
    /// # Errors
    /// A message naming the offending requirement or token (the caller names the
    /// annotation and the whole value).
    pub fn parse(text: &str) -> Result<Self, String> {
        Ok(NodeSelector {
            text: text.to_string(),
            selector: parse_label_selector(text)?,
        })
    }

    /// Whether a node with `labels` matches.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.selector.matches(labels)
    }
}

/// Parses a label selector in its string form into kube's [`Selector`]. The empty string
/// (or only whitespace) selects everything, as in Kubernetes.
///
/// # Errors
/// A message naming the offending requirement or token.
pub fn parse_label_selector(text: &str) -> Result<Selector, String> {
    let tokens = lex(text);
    let mut p = Parser { tokens, pos: 0 };
    let mut exprs = Vec::new();
    if p.tokens.is_empty() {
        return Ok(Selector::from_iter(exprs));
    }
    loop {
        exprs.push(p.requirement()?);
        match p.next() {
            None => break,
            Some(Tok::Comma) => continue,
            Some(t) => return Err(format!("expected ',' after a requirement, found {t}")),
        }
    }
    Ok(Selector::from_iter(exprs))
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Ident(String),
    Not,
    Eq,
    DoubleEq,
    NotEq,
    Open,
    Close,
    Comma,
    Gt,
    Lt,
}

impl std::fmt::Display for Tok {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Tok::Ident(s) => write!(f, "{s:?}"),
            Tok::Not => f.write_str("'!'"),
            Tok::Eq => f.write_str("'='"),
            Tok::DoubleEq => f.write_str("'=='"),
            Tok::NotEq => f.write_str("'!='"),
            Tok::Open => f.write_str("'('"),
            Tok::Close => f.write_str("')'"),
            Tok::Comma => f.write_str("','"),
            Tok::Gt => f.write_str("'>'"),
            Tok::Lt => f.write_str("'<'"),
        }
    }
}

/// apimachinery's lexer: identifiers run until whitespace or one of `!=(),<>`.
fn lex(text: &str) -> Vec<Tok> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {}
            '!' if chars.peek() == Some(&'=') => {
                chars.next();
                out.push(Tok::NotEq);
            }
            '!' => out.push(Tok::Not),
            '=' if chars.peek() == Some(&'=') => {
                chars.next();
                out.push(Tok::DoubleEq);
            }
            '=' => out.push(Tok::Eq),
            '(' => out.push(Tok::Open),
            ')' => out.push(Tok::Close),
            ',' => out.push(Tok::Comma),
            '>' => out.push(Tok::Gt),
            '<' => out.push(Tok::Lt),
            c => {
                let mut s = String::from(c);
                while let Some(&n) = chars.peek() {
                    if n.is_whitespace() || "!=(),<>".contains(n) {
                        break;
                    }
                    s.push(n);
                    chars.next();
                }
                out.push(Tok::Ident(s));
            }
        }
    }
    out
}

struct Parser {
    tokens: Vec<Tok>,
    pos: usize,
}

impl Parser {
    fn next(&mut self) -> Option<Tok> {
        let t = self.tokens.get(self.pos).cloned();
        self.pos += 1;
        t
    }

    fn peek(&self) -> Option<&Tok> {
        self.tokens.get(self.pos)
    }

    fn key(&mut self) -> Result<String, String> {
        match self.next() {
            Some(Tok::Ident(k)) => {
                check_key(&k)?;
                Ok(k)
            }
            Some(t) => Err(format!("expected a label key, found {t}")),
            None => Err("expected a label key, found the end".into()),
        }
    }

    fn value(&mut self) -> Result<String, String> {
        match self.peek() {
            // `key=` selects the empty value, as in Kubernetes.
            None | Some(Tok::Comma) | Some(Tok::Close) => Ok(String::new()),
            Some(Tok::Ident(_)) => {
                let Some(Tok::Ident(v)) = self.next() else {
                    return Err("expected a label value".into());
                };
                check_value(&v)?;
                Ok(v)
            }
            Some(t) => Err(format!("expected a label value, found {t}")),
        }
    }

    fn set(&mut self) -> Result<BTreeSet<String>, String> {
        match self.next() {
            Some(Tok::Open) => {}
            Some(t) => return Err(format!("expected '(' after in/notin, found {t}")),
            None => return Err("expected '(' after in/notin, found the end".into()),
        }
        let mut values = BTreeSet::new();
        loop {
            values.insert(self.value()?);
            match self.next() {
                Some(Tok::Comma) => continue,
                Some(Tok::Close) => break,
                Some(t) => return Err(format!("expected ',' or ')' in a value set, found {t}")),
                None => return Err("a value set is not closed with ')'".into()),
            }
        }
        Ok(values)
    }

    fn requirement(&mut self) -> Result<Expression, String> {
        if self.peek() == Some(&Tok::Not) {
            self.next();
            return Ok(Expression::DoesNotExist(self.key()?));
        }
        let key = self.key()?;
        match self.peek().cloned() {
            None | Some(Tok::Comma) => Ok(Expression::Exists(key)),
            Some(Tok::Eq) | Some(Tok::DoubleEq) => {
                self.next();
                Ok(Expression::Equal(key, self.value()?))
            }
            Some(Tok::NotEq) => {
                self.next();
                Ok(Expression::NotEqual(key, self.value()?))
            }
            Some(Tok::Ident(op)) if op == "in" || op == "notin" => {
                self.next();
                let set = self.set()?;
                Ok(if op == "in" {
                    Expression::In(key, set)
                } else {
                    Expression::NotIn(key, set)
                })
            }
            Some(Tok::Gt) | Some(Tok::Lt) => Err(format!(
                "the numeric operators > and < are not supported (key {key:?})"
            )),
            Some(t) => Err(format!(
                "expected =, ==, !=, in or notin after key {key:?}, found {t}"
            )),
        }
    }
}

/// Kubernetes `IsQualifiedName`: `[prefix/]name`, prefix a DNS-1123 subdomain, name 1 to
/// 63 alphanumerics, `-`, `_` and `.`, starting and ending alphanumeric.
fn check_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix
        && !crate::syntax::is_dns1123_subdomain(p)
    {
        return Err(format!(
            "label key {key:?}: the prefix {p:?} is not a DNS-1123 subdomain"
        ));
    }
    if name.is_empty() || !is_label_value(name) {
        return Err(format!(
            "label key {key:?}: the name must be 1 to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
        ));
    }
    Ok(())
}

/// Kubernetes `IsValidLabelValue`.
fn check_value(v: &str) -> Result<(), String> {
    if is_label_value(v) {
        Ok(())
    } else {
        Err(format!(
            "label value {v:?}: must be at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
        ))
    }
}

/// Empty, or at most 63 alphanumerics, `-`, `_` and `.`, starting and ending alphanumeric.
fn is_label_value(v: &str) -> bool {
    let b = v.as_bytes();
    b.is_empty()
        || (b.len() <= 63
            && b.iter()
                .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn every_operator_of_the_kubernetes_grammar_parses_and_matches() {
        let s = NodeSelector::parse(
            "zone=a, role in (edge, lb),tier!=db,!node.kubernetes.io/exclude,env notin (dev),vipd.io/ok,x==y",
        )
        .unwrap();
        let good = labels(&[
            ("zone", "a"),
            ("role", "edge"),
            ("vipd.io/ok", ""),
            ("x", "y"),
        ]);
        assert!(s.matches(&good));
        for (k, v) in [
            ("zone", "b"),
            ("role", "web"),
            ("tier", "db"),
            ("node.kubernetes.io/exclude", "true"),
            ("env", "dev"),
            ("x", "z"),
        ] {
            let mut l = good.clone();
            l.insert(k.into(), v.into());
            assert!(!s.matches(&l), "{k}={v} must not match");
        }
        let mut l = good.clone();
        l.remove("vipd.io/ok");
        assert!(!s.matches(&l), "missing key of an exists requirement");
        let mut l = good;
        l.remove("role");
        assert!(!s.matches(&l), "missing key of an in requirement");
    }

    #[test]
    fn empty_selector_selects_every_node_and_empty_values_are_allowed() {
        assert!(NodeSelector::parse("  ").unwrap().matches(&labels(&[])));
        let s = NodeSelector::parse("a=,b in (,x)").unwrap();
        assert!(s.matches(&labels(&[("a", ""), ("b", "")])));
        assert!(!s.matches(&labels(&[("a", "1"), ("b", "")])));
    }

    #[test]
    fn preferred_nodes_are_node_names_in_order() {
        assert_eq!(
            parse_preferred_nodes("node-b, node-a,worker.example").unwrap(),
            ["node-b", "node-a", "worker.example"]
        );
        for (text, bad) in [("node-a,,node-b", "\"\""), ("node-a,Node_B", "\"Node_B\"")] {
            let e = parse_preferred_nodes(text).unwrap_err();
            assert!(e.contains(bad), "{text:?}: {e}");
        }
    }

    #[test]
    fn bad_selectors_name_the_offending_part() {
        for (text, needle) in [
            ("zone=a b", "expected ','"),
            ("zone in a", "expected '('"),
            ("zone in (a", "not closed"),
            ("zone>1", "not supported"),
            ("=a", "expected a label key"),
            ("Zone_/x=a", "prefix \"Zone_\""),
            ("-zone=a", "label key \"-zone\""),
            ("zone=-a", "label value \"-a\""),
            ("zone=a,", "found the end"),
            ("zone == = a", "expected a label value"),
            (
                "zone a",
                "expected =, ==, !=, in or notin after key \"zone\"",
            ),
        ] {
            let e = NodeSelector::parse(text).unwrap_err();
            assert!(e.contains(needle), "{text:?}: {e}");
        }
        let long = "v".repeat(64);
        assert!(NodeSelector::parse(&format!("k={long}")).is_err());
    }
}
