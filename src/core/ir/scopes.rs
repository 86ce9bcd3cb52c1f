//! Named scopes: spans of a trace's top-level bound symbols (a layer, an attention block) with a
//! dotted path (`h.3.attn`), nested, kept as a side table of the trace like its guards.
//!
//! A scope is metadata: it changes neither the bound symbols, nor their order, nor what they
//! compute. Guards attach to scopes ([`Selection::Scope`](crate::guards::Selection::Scope));
//! a plan enters a scope's guards before its first step and exits them after its last, one
//! range per scope instance and NVTX domain. Passes carry scopes as they carry guards: a
//! composite's prims take its scope, an empty scope disappears, and a fused region sits in the
//! innermost scope holding all of its ops (the scopes it straddles are cut around it, and
//! [`Trace::scope_notes`](crate::Trace::scope_notes) says so).

use std::ops::Range;

use smallvec::SmallVec;

use super::ids::GuardId;
use crate::error::{Error, Result};

/// The separator of a scope path's components.
pub const SCOPE_SEPARATOR: char = '.';

/// One scope instance of a trace: its path, the top-level bound symbols it spans, and how
/// deeply it is nested (0 for a scope at the top).
///
/// ```
/// use boundscope::{Arena, Registry, TraceBuilder};
/// let (registry, arena) = (Registry::with_builtins(), Arena::new());
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let x = b.input(&[4]).unwrap();
/// let y = b.scope("h", |b| b.scope("0", |b| b.exp(x))).unwrap();
/// b.output(y).unwrap();
/// let trace = b.finish().unwrap();
/// let inner = &trace.scopes()[1];
/// assert_eq!((inner.path(), inner.name(), inner.depth()), ("h.0", "0", 1));
/// assert_eq!(inner.positions(), 0..1);
/// assert_eq!(trace.scope_path(0), Some("h.0"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamedScope {
    path: Box<str>,
    first: u32,
    end: u32,
    depth: u16,
    /// The guards attached to this scope, in attach order.
    pub(crate) guards: SmallVec<[GuardId; 2]>,
}

impl NamedScope {
    /// Its full path (`h.3.attn`).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Its own name: the last component of its path (`attn`).
    pub fn name(&self) -> &str {
        self.path.rsplit(SCOPE_SEPARATOR).next().unwrap_or(&self.path)
    }

    /// The top-level bound symbols it spans.
    pub fn positions(&self) -> Range<usize> {
        self.first as usize..self.end as usize
    }

    /// How many scopes it is nested in.
    pub fn depth(&self) -> usize {
        usize::from(self.depth)
    }

    /// How many guards are attached to it.
    pub fn guard_count(&self) -> usize {
        self.guards.len()
    }

    /// The guards attached to it, by id in the trace's guard table, in attach order.
    pub(crate) fn guard_ids(&self) -> &[GuardId] {
        &self.guards
    }

    /// Its guards as attachments over its span, at the scope level, for the plan's merge of
    /// the guards on one scope.
    pub(crate) fn attachments(&self) -> impl Iterator<Item = crate::core::guards::Attachment> + '_ {
        let span = self.end - self.first;
        self.guards.iter().map(move |&guard| crate::core::guards::Attachment {
            guard,
            span,
            depth: 0,
            level: crate::core::guards::Level::Scope,
            origin: super::prims::REGION,
        })
    }
}

/// A scope that a rewrite left empty: its path and the guards it had.
pub(crate) type GoneScope = (String, SmallVec<[GuardId; 2]>);

/// A trace's scopes, outer before inner and in program order (by first position, then
/// depth), and what passes did to them.
#[derive(Clone, Debug, Default)]
pub(crate) struct ScopeTable {
    pub scopes: Vec<NamedScope>,
    /// Sentences about scopes that passes cut, split or removed.
    pub notes: Vec<String>,
}

impl ScopeTable {
    /// Adds a scope over `positions` (kept in order: outer before inner, program order).
    pub fn push(&mut self, path: String, positions: Range<usize>, depth: usize) {
        let scope = NamedScope {
            path: path.into_boxed_str(),
            first: positions.start as u32,
            end: positions.end as u32,
            depth: depth as u16,
            guards: SmallVec::new(),
        };
        self.insert(scope);
    }

    /// Inserts `scope` where the order (outer before inner, program order) puts it.
    fn insert(&mut self, scope: NamedScope) {
        let at = self.scopes.partition_point(|s| (s.first, s.depth) <= (scope.first, scope.depth));
        self.scopes.insert(at, scope);
    }

    /// The innermost scope holding `position`.
    pub fn innermost(&self, position: usize) -> Option<usize> {
        self.scopes
            .iter()
            .enumerate()
            .filter(|(_, s)| s.positions().contains(&position))
            .max_by_key(|(_, s)| s.depth)
            .map(|(i, _)| i)
    }

    /// The indices of the scopes whose path matches `pattern` (see [`path_matches`]).
    pub fn matching(&self, pattern: &str) -> Result<Vec<usize>> {
        let found: Vec<usize> =
            (0..self.scopes.len()).filter(|&i| path_matches(pattern, self.scopes[i].path())).collect();
        if found.is_empty() {
            let mut known: Vec<String> = self.scopes.iter().map(|s| s.path().to_string()).collect();
            known.dedup();
            known.truncate(8);
            return Err(Error::NoSuchScope { pattern: pattern.to_string(), known });
        }
        Ok(found)
    }

    /// The scopes after a rewrite that puts old top-level bound symbol `i` at the new positions
    /// `new_range(i)` (`None` or empty: removed) in a trace of `new_len` bound symbols. A new
    /// bound symbol belongs to a scope when every old one it comes from did: a fused region
    /// that straddles scopes leaves each of them (which is cut around it, or split in two where
    /// it sat in the middle) and sits in the innermost scope holding all its ops. A scope left
    /// with nothing disappears; its path and guards are returned beside the table.
    /// `describe(q)` names new bound symbol `q` in the notes.
    pub fn carried(
        &self,
        old_len: usize,
        new_len: usize,
        new_range: impl Fn(usize) -> Option<Range<usize>>,
        pass: &str,
        describe: impl Fn(usize) -> String,
    ) -> (ScopeTable, Vec<GoneScope>) {
        // The old positions each new bound symbol comes from.
        let mut owners: Vec<SmallVec<[usize; 1]>> = vec![SmallVec::new(); new_len];
        for i in 0..old_len {
            for q in new_range(i).into_iter().flatten().filter(|&q| q < new_len) {
                owners[q].push(i);
            }
        }
        let mut out = ScopeTable { scopes: Vec::new(), notes: self.notes.clone() };
        let mut gone = Vec::new();
        for scope in &self.scopes {
            let (first, end) = (scope.first as usize, scope.end as usize);
            let held = |i: &usize| (first..end).contains(i);
            let inside = |q: usize| !owners[q].is_empty() && owners[q].iter().all(held);
            let straddles = |q: usize| owners[q].iter().any(held) && !owners[q].iter().all(held);
            // Only where the scope's own bound symbols went: a new bound symbol inside it or
            // straddling it comes from one of them (so a pass costs the scopes' sizes, not
            // scopes x bound symbols).
            let window = (first..end.min(old_len))
                .flat_map(&new_range)
                .filter(|r| !r.is_empty())
                .fold(None, |w: Option<Range<usize>>, r| {
                    Some(w.map_or(r.clone(), |w| w.start.min(r.start)..w.end.max(r.end)))
                })
                .map_or(0..0, |w| w.start.min(new_len)..w.end.min(new_len));
            let mut pieces: Vec<Range<usize>> = Vec::new();
            for q in window.clone().filter(|&q| inside(q)) {
                match pieces.last_mut() {
                    Some(last) if last.end == q => last.end = q + 1,
                    _ => pieces.push(q..q + 1),
                }
            }
            let cut: Vec<String> = window.filter(|&q| straddles(q)).map(&describe).collect();
            let path = scope.path();
            if pieces.is_empty() {
                let why = if cut.is_empty() {
                    "its bound symbols were removed".to_string()
                } else {
                    format!("its bound symbols were fused with others into {}", cut.join(", "))
                };
                out.notes.push(format!("`{pass}`: scope `{path}` disappeared: {why}"));
                if !scope.guards.is_empty() {
                    gone.push((path.to_string(), scope.guards.clone()));
                }
                continue;
            }
            if !cut.is_empty() {
                out.notes.push(format!(
                    "`{pass}`: scope `{path}` was cut around {}, which straddle{} it: {} in the innermost scope \
                     holding all of {} ops",
                    cut.join(", "),
                    if cut.len() == 1 { "s" } else { "" },
                    if cut.len() == 1 { "it sits" } else { "each sits" },
                    if cut.len() == 1 { "its" } else { "their" },
                ));
            }
            if pieces.len() > 1 {
                out.notes.push(format!(
                    "`{pass}`: scope `{path}` is in {} pieces, each with the scope's guards",
                    pieces.len()
                ));
            }
            for piece in pieces {
                let mut carried = scope.clone();
                carried.first = piece.start as u32;
                carried.end = piece.end as u32;
                out.insert(carried);
            }
        }
        (out, gone)
    }
}

/// Checks one component of a scope path: not empty, no NUL (NVTX takes C strings) or other
/// control character (listings print a path on a line), no [`SCOPE_SEPARATOR`] (it joins
/// components).
///
/// # Errors
/// [`Error::InvalidScopeName`] naming the problem.
pub(crate) fn check_scope_name(name: &str) -> Result<()> {
    let detail = if name.is_empty() {
        "a scope name must not be empty"
    } else if name.contains('\0') {
        "a scope name must not contain a NUL character (NVTX takes C strings)"
    } else if name.chars().any(char::is_control) {
        "a scope name must not contain control characters (a newline, a tab, ...): trace listings, \
         profiles and counts print scope paths one to a line"
    } else if name.contains(SCOPE_SEPARATOR) {
        "a scope name must not contain `.`, which joins the components of a path: nest scopes instead \
         (`b.scope(\"h\", |b| b.scope(\"3\", ...))` is `h.3`)"
    } else if name.contains('*') {
        "a scope name must not contain `*`, which patterns use"
    } else {
        return Ok(());
    };
    Err(Error::InvalidScopeName { name: name.escape_default().to_string(), detail: detail.to_string() })
}

/// Whether scope path `path` matches `pattern`: the same components, where a `*` in a pattern
/// component matches any run of characters within one component (`h.*.attn` matches `h.3.attn`,
/// `h.*` matches `h.3` but not `h.3.attn`, `*` matches every top-level scope); a pattern
/// component `**` matches any number of components (`**` matches every scope, `**.attn` every
/// scope named `attn`).
///
/// ```
/// use boundscope::path_matches;
/// assert!(path_matches("h.*.attn", "h.3.attn"));
/// assert!(!path_matches("h.*", "h.3.attn"));
/// assert!(path_matches("**.attn", "h.3.attn") && path_matches("**", "h.3.attn"));
/// assert!(path_matches("layer.1*", "layer.12") && !path_matches("layer.1*", "layer.21"));
/// ```
pub fn path_matches(pattern: &str, path: &str) -> bool {
    let pattern: Vec<&str> = pattern.split(SCOPE_SEPARATOR).collect();
    let path: Vec<&str> = path.split(SCOPE_SEPARATOR).collect();
    components_match(&pattern, &path)
}

fn components_match(pattern: &[&str], path: &[&str]) -> bool {
    wildcard(pattern, path, |p| *p == "**", |p, c| glob(p.as_bytes(), c.as_bytes()))
}

/// `*` matches any run of bytes; everything else matches itself.
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    wildcard(pattern, text, |&p| p == b'*', |p, c| p == c)
}

/// Whether `pattern` matches all of `text`, where a token for which `is_star` holds matches any
/// run of items and every other token matches one item, where `one` says so. Greedy, going
/// back only to the last star: time `pattern.len() * text.len()` at most, no recursion, so
/// that no pattern a user writes (`*` thirty times, or thousands of components) can take
/// exponential time or the stack.
fn wildcard<P, T>(pattern: &[P], text: &[T], is_star: impl Fn(&P) -> bool, one: impl Fn(&P, &T) -> bool) -> bool {
    let (mut p, mut t) = (0, 0);
    // The token after the last star seen, and the first item that star has not taken yet.
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && is_star(&pattern[p]) {
            star = Some((p + 1, t));
            p += 1;
        } else if p < pattern.len() && one(&pattern[p], &text[t]) {
            p += 1;
            t += 1;
        } else if let Some((after, taken)) = star {
            // The last star takes one item more.
            star = Some((after, taken + 1));
            (p, t) = (after, taken + 1);
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(is_star)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(scopes: &[(&str, Range<usize>, usize)]) -> ScopeTable {
        let mut t = ScopeTable::default();
        for (path, positions, depth) in scopes {
            t.push(path.to_string(), positions.clone(), *depth);
        }
        t
    }

    fn spans(t: &ScopeTable) -> Vec<(String, Range<usize>)> {
        t.scopes.iter().map(|s| (s.path().to_string(), s.positions())).collect()
    }

    /// The matcher agrees with the definition (a recursive matcher, exponential in the worst
    /// case) on every pattern and path over a small alphabet, and takes no time or stack on
    /// the patterns that made the definition's matcher take both.
    #[test]
    fn patterns_match_as_defined_in_linear_time() {
        fn defined_glob(pattern: &[u8], text: &[u8]) -> bool {
            match pattern.split_first() {
                None => text.is_empty(),
                Some((b'*', rest)) => (0..=text.len()).any(|k| defined_glob(rest, &text[k..])),
                Some((&c, rest)) => text.first() == Some(&c) && defined_glob(rest, &text[1..]),
            }
        }
        fn defined(pattern: &[&str], path: &[&str]) -> bool {
            match (pattern.first(), path.first()) {
                (None, None) => true,
                (Some(&"**"), _) => (0..=path.len()).any(|k| defined(&pattern[1..], &path[k..])),
                (Some(p), Some(c)) => defined_glob(p.as_bytes(), c.as_bytes()) && defined(&pattern[1..], &path[1..]),
                _ => false,
            }
        }
        // Every string of up to `n` symbols from `alphabet`.
        let strings = |alphabet: &[&str], n: usize| {
            let mut all = vec![String::new()];
            let mut last = vec![String::new()];
            for _ in 0..n {
                last = last.iter().flat_map(|s| alphabet.iter().map(move |a| format!("{s}{a}"))).collect();
                all.extend(last.iter().cloned());
            }
            all
        };
        for pattern in strings(&["a", "*", "b"], 5) {
            for text in strings(&["a", "b"], 5) {
                let expected = defined_glob(pattern.as_bytes(), text.as_bytes());
                assert_eq!(glob(pattern.as_bytes(), text.as_bytes()), expected, "{pattern:?} {text:?}");
            }
        }
        let components = ["a.", "b.", "*.", "**.", "a*."];
        for pattern in strings(&components, 4) {
            for path in strings(&["a.", "b.", "ab."], 4) {
                let (pattern, path) = (pattern.trim_end_matches('.'), path.trim_end_matches('.'));
                let (p, q): (Vec<&str>, Vec<&str>) =
                    (pattern.split(SCOPE_SEPARATOR).collect(), path.split(SCOPE_SEPARATOR).collect());
                assert_eq!(path_matches(pattern, path), defined(&p, &q), "{pattern:?} {path:?}");
            }
        }
        // Thirty stars before a byte the path lacks; thirty `**` likewise; a pattern of 100,000
        // components. (The definition's matcher takes minutes on the first two and overflows
        // the stack on the third.)
        let path = "h.".repeat(30) + &"x".repeat(60);
        assert!(!path_matches(&format!("{}y", "*".repeat(30)), &"x".repeat(60)));
        assert!(!path_matches(&format!("{}.y", ["**"; 30].join(".")), &path));
        assert!(path_matches(&["*"; 100_000].join("."), &["h"; 100_000].join(".")));
    }

    #[test]
    fn decomposition_keeps_scopes_around_the_prims() {
        // Old 0 -> 0, old 1 -> 1..4 (a composite's three prims), old 2 -> 4.
        let t = table(&[("a", 0..2, 0), ("b", 2..3, 0)]);
        let ranges = [0..1, 1..4, 4..5];
        let (carried, _) = t.carried(3, 5, |i| Some(ranges[i].clone()), "decompose", |q| q.to_string());
        assert_eq!(spans(&carried), [("a".into(), 0..4), ("b".into(), 4..5)]);
        assert!(carried.notes.is_empty());
    }

    #[test]
    fn a_region_that_straddles_scopes_sits_in_their_innermost_common_scope() {
        // layer.0 = 0..3 (with layer.0.norm = 2..3), layer.1 = 3..6; ops 2 and 3 fuse into new 2.
        let t = table(&[("layer", 0..6, 0), ("layer.0", 0..3, 1), ("layer.0.norm", 2..3, 2), ("layer.1", 3..6, 1)]);
        let map = [0, 1, 2, 2, 3, 4];
        let (carried, _) = t.carried(6, 5, |i| Some(map[i]..map[i] + 1), "fuse_regions", |q| format!("region {q}"));
        assert_eq!(
            spans(&carried),
            [("layer".into(), 0..5), ("layer.0".into(), 0..2), ("layer.1".into(), 3..5)],
            "the region stays in `layer`, outside both layers; `layer.0.norm` is gone"
        );
        assert!(
            carried.notes.iter().any(|n| n.contains("scope `layer.0` was cut around region 2")),
            "{:?}",
            carried.notes
        );
        assert!(carried.notes.iter().any(|n| n.contains("scope `layer.0.norm` disappeared")), "{:?}", carried.notes);
    }

    #[test]
    fn a_region_in_the_middle_splits_a_scope_and_removal_empties_one() {
        // s = 1..4; ops 0 and 2 fuse (dataflow) into new 1; op 1 -> 0, op 3 -> 2; t = 4..5 removed.
        let t = table(&[("s", 1..4, 0), ("t", 4..5, 0)]);
        let map = [Some(1), Some(0), Some(1), Some(2), None];
        let (carried, _) = t.carried(5, 3, |i| map[i].map(|q| q..q + 1), "p", |q| format!("#{q}"));
        assert_eq!(spans(&carried), [("s".into(), 0..1), ("s".into(), 2..3)]);
        assert!(carried.notes.iter().any(|n| n.contains("in 2 pieces")));
        assert!(carried.notes.iter().any(|n| n.contains("scope `t` disappeared: its bound symbols were removed")));
    }

    #[test]
    fn a_region_that_only_moves_past_a_scope_does_not_cut_it() {
        // Ops 0 and 3 fuse (dataflow) into new 2, moving past ops 1 and 2 (scope z = 1..3).
        let t = table(&[("z", 1..3, 0)]);
        let map = [2, 0, 1, 2];
        let (carried, gone) = t.carried(4, 3, |i| Some(map[i]..map[i] + 1), "p", |q| format!("#{q}"));
        assert_eq!(spans(&carried), [("z".into(), 0..2)]);
        assert!(carried.notes.is_empty() && gone.is_empty(), "{:?}", carried.notes);
    }

    #[test]
    fn names_and_patterns() {
        assert!(check_scope_name("attn").is_ok());
        for bad in ["", "a.b", "a\0", "a*"] {
            assert!(matches!(check_scope_name(bad), Err(Error::InvalidScopeName { .. })), "{bad:?}");
        }
        assert!(path_matches("h.*.attn", "h.10.attn"));
        assert!(!path_matches("h.*.attn", "h.10.mlp"));
        assert!(path_matches("h", "h") && !path_matches("h", "h.0"));
        assert!(path_matches("**.mlp", "mlp") && path_matches("h.**", "h") && path_matches("h.**", "h.1.mlp"));
    }
}
