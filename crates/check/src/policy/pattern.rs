//! Parameter-path patterns of shard rules: `model.layers.*.self_attn.{q,k,v}_proj.weight`.
//! Paths are segments joined by `.`; in a pattern `*` matches any run of characters inside one
//! segment (a whole segment when written alone), a `**` segment matches any number of segments
//! (none included), and `{a,b}` matches either alternative (alternatives may nest and may span
//! dots).

use std::fmt;
use std::ops::Range;

/// Most brace alternatives a pattern may expand to, so a short pattern cannot explode.
const MAX_ALTERNATIVES: usize = 1024;

/// Deepest brace nesting accepted, so expansion cannot exhaust the stack.
const MAX_DEPTH: usize = 16;

/// Most cells (pattern tokens × path characters) the did-you-mean search of
/// [`ShardPattern::nearest`] fills, so a long pattern with many brace alternatives against a
/// large model stays quick (tens of milliseconds): past it, fewer alternatives are compared.
const MAX_SUGGEST_CELLS: usize = 20_000_000;

/// Pattern tokens compared per alternative: a parameter path is far shorter, so the tokens past
/// it only add the same cost to every candidate.
const MAX_SUGGEST_TOKENS: usize = 256;

/// A checked pattern, ready to match parameter paths.
#[derive(Clone, Debug, PartialEq)]
pub struct ShardPattern {
    text: String,
    /// The pattern with its braces expanded, each split into segments.
    alternatives: Vec<Vec<Segment>>,
}

#[derive(Clone, Debug, PartialEq)]
enum Segment {
    /// `**`
    AnySegments,
    /// One segment; `*` in it matches any run of characters.
    Glob(String),
}

/// Why a pattern is malformed, with the bytes of the pattern text at fault.
#[derive(Clone, Debug, PartialEq)]
pub struct PatternError {
    /// What is wrong.
    pub message: String,
    /// Where in the pattern text.
    pub at: Range<usize>,
}

impl ShardPattern {
    /// Checks and compiles a pattern.
    pub fn parse(text: &str) -> Result<ShardPattern, PatternError> {
        let fail = |message: &str, at: Range<usize>| PatternError {
            message: message.to_string(),
            at,
        };
        if text.is_empty() {
            return Err(fail("the pattern is empty", 0..0));
        }
        if let Some(i) = text.find(|c: char| c.is_whitespace()) {
            return Err(fail("parameter paths contain no spaces", i..i + 1));
        }
        let (expanded, end) = expand(text, 0, 0)?;
        debug_assert_eq!(end, text.len());
        let alternatives = expanded
            .iter()
            .map(|alt| segments(alt).map_err(|message| fail(message, 0..text.len())))
            .collect::<Result<_, _>>()?;
        Ok(ShardPattern {
            text: text.to_string(),
            alternatives,
        })
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether the pattern matches the whole path.
    pub fn matches(&self, path: &str) -> bool {
        let path: Vec<&str> = path.split('.').collect();
        self.alternatives
            .iter()
            .any(|alt| matches_segments(alt, &path))
    }

    /// The path closest to matching, by edit distance with wildcards matching for free. The
    /// work is bounded ([`MAX_SUGGEST_CELLS`]): with many long alternatives and many paths,
    /// only the first alternatives (at least one), cut to [`MAX_SUGGEST_TOKENS`], are compared.
    pub fn nearest<'p>(&self, paths: impl IntoIterator<Item = &'p str>) -> Option<&'p str> {
        let paths: Vec<(&str, Vec<char>)> = paths
            .into_iter()
            .map(|p| (p, p.chars().collect()))
            .collect();
        let path_cells: usize = paths.iter().map(|(_, chars)| chars.len() + 1).sum();
        let mut tokens: Vec<Vec<Token>> = Vec::new();
        let mut cells = 0usize;
        for alt in &self.alternatives {
            let mut alt_tokens = tokenize(alt);
            alt_tokens.truncate(MAX_SUGGEST_TOKENS);
            let cost = (alt_tokens.len() + 1).saturating_mul(path_cells);
            if !tokens.is_empty() && cells.saturating_add(cost) > MAX_SUGGEST_CELLS {
                break;
            }
            cells = cells.saturating_add(cost);
            tokens.push(alt_tokens);
        }
        paths
            .iter()
            .map(|(path, path_chars)| {
                let distance = tokens
                    .iter()
                    .map(|t| distance(t, path_chars))
                    .min()
                    .unwrap_or(usize::MAX);
                (distance, *path)
            })
            .min_by_key(|&(distance, _)| distance)
            .map(|(_, path)| path)
    }
}

impl fmt::Display for ShardPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Whether `pattern` is valid and matches `path`.
pub fn pattern_matches(pattern: &str, path: &str) -> bool {
    ShardPattern::parse(pattern).is_ok_and(|p| p.matches(path))
}

/// Expands the braces of `text[start..]` up to the end, or, inside `depth` braces, up to the `}`
/// or `,` closing the alternative; returns the expansions and where it stopped.
fn expand(text: &str, start: usize, depth: usize) -> Result<(Vec<String>, usize), PatternError> {
    let nested = depth > 0;
    let too_many = |at: Range<usize>| PatternError {
        message: format!("the braces expand to more than {MAX_ALTERNATIVES} alternatives"),
        at,
    };
    let mut results = vec![String::new()];
    let mut i = start;
    while let Some(c) = text[i..].chars().next() {
        match c {
            '{' if depth == MAX_DEPTH => {
                return Err(PatternError {
                    message: format!("braces nest more than {MAX_DEPTH} deep"),
                    at: i..i + 1,
                })
            }
            '{' => {
                let open = i;
                let mut options = Vec::new();
                i += 1;
                loop {
                    let (mut alt, end) = expand(text, i, depth + 1)?;
                    options.append(&mut alt);
                    match text[end..].chars().next() {
                        Some(',') => i = end + 1,
                        Some('}') => {
                            i = end + 1;
                            break;
                        }
                        _ => {
                            return Err(PatternError {
                                message: "this `{` is never closed".to_string(),
                                at: open..open + 1,
                            })
                        }
                    }
                }
                if results.len().saturating_mul(options.len()) > MAX_ALTERNATIVES {
                    return Err(too_many(open..i));
                }
                results = results
                    .iter()
                    .flat_map(|prefix| options.iter().map(move |o| format!("{prefix}{o}")))
                    .collect();
            }
            '}' | ',' if nested => return Ok((results, i)),
            '}' => {
                return Err(PatternError {
                    message: "this `}` has no matching `{`".to_string(),
                    at: i..i + 1,
                })
            }
            ',' => {
                return Err(PatternError {
                    message: "`,` separates alternatives only inside `{…}`".to_string(),
                    at: i..i + 1,
                })
            }
            _ => {
                results.iter_mut().for_each(|r| r.push(c));
                i += c.len_utf8();
            }
        }
    }
    Ok((results, i))
}

/// Splits one brace-free alternative into segments.
fn segments(alt: &str) -> Result<Vec<Segment>, &'static str> {
    let mut out: Vec<Segment> = Vec::new();
    for seg in alt.split('.') {
        match seg {
            "" => return Err("a path segment is empty (two dots in a row, or a dot at an end)"),
            "**" if out.last() == Some(&Segment::AnySegments) => {}
            "**" => out.push(Segment::AnySegments),
            _ if seg.contains("**") => {
                return Err("`**` must be a whole segment, e.g. `model.**.weight`")
            }
            _ => out.push(Segment::Glob(seg.to_string())),
        }
    }
    Ok(out)
}

fn matches_segments(pattern: &[Segment], path: &[&str]) -> bool {
    // reach[j]: the pattern so far can match the first j segments of the path.
    let mut reach = vec![false; path.len() + 1];
    reach[0] = true;
    for seg in pattern {
        let mut next = vec![false; path.len() + 1];
        match seg {
            Segment::AnySegments => {
                let mut any = false;
                for (n, r) in next.iter_mut().zip(&reach) {
                    any |= *r;
                    *n = any;
                }
            }
            Segment::Glob(glob) => {
                for (j, part) in path.iter().enumerate() {
                    next[j + 1] = reach[j] && glob_matches(glob, part);
                }
            }
        }
        reach = next;
    }
    reach[path.len()]
}

/// Whether `glob` (with `*` for any run) matches the whole of `text`. Works on bytes, without
/// allocating (it runs for every alternative × parameter path × segment): UTF-8 is
/// self-synchronizing, so this matches exactly what a comparison of characters would.
fn glob_matches(glob: &str, text: &str) -> bool {
    let (g, t) = (glob.as_bytes(), text.as_bytes());
    let (mut gi, mut ti) = (0, 0);
    let mut backtrack: Option<(usize, usize)> = None;
    while ti < t.len() {
        if gi < g.len() && g[gi] == b'*' {
            backtrack = Some((gi, ti));
            gi += 1;
        } else if gi < g.len() && g[gi] == t[ti] {
            gi += 1;
            ti += 1;
        } else if let Some((star, matched)) = backtrack {
            gi = star + 1;
            ti = matched + 1;
            backtrack = Some((star, matched + 1));
        } else {
            return false;
        }
    }
    g[gi..].iter().all(|&c| c == b'*')
}

/// A pattern alternative as characters and wildcards, for [`distance`].
#[derive(Clone, Copy, PartialEq)]
enum Token {
    Char(char),
    /// `*`: any run without a dot.
    Star,
    /// `**.`: any run.
    Any,
}

fn tokenize(alt: &[Segment]) -> Vec<Token> {
    let mut tokens = Vec::new();
    for (i, seg) in alt.iter().enumerate() {
        let last = i + 1 == alt.len();
        match seg {
            Segment::AnySegments => tokens.push(Token::Any),
            Segment::Glob(glob) => {
                tokens.extend(glob.chars().map(|c| {
                    if c == '*' {
                        Token::Star
                    } else {
                        Token::Char(c)
                    }
                }));
                if !last {
                    tokens.push(Token::Char('.'));
                }
            }
        }
    }
    tokens
}

/// Edit distance between a tokenized pattern and a path, wildcards matching for free.
fn distance(tokens: &[Token], path: &[char]) -> usize {
    // row[j]: cost of matching the tokens so far against path[..j].
    let mut row: Vec<usize> = (0..=path.len()).collect();
    for &token in tokens {
        let mut next = vec![0; path.len() + 1];
        next[0] = row[0] + usize::from(matches!(token, Token::Char(_)));
        for j in 1..=path.len() {
            next[j] = match token {
                Token::Char(c) => (row[j - 1] + usize::from(c != path[j - 1]))
                    .min(row[j] + 1)
                    .min(next[j - 1] + 1),
                Token::Star if path[j - 1] != '.' => row[j].min(next[j - 1]),
                Token::Star => row[j].min(next[j - 1] + 1),
                Token::Any => row[j].min(next[j - 1]),
            };
        }
        row = next;
    }
    row[path.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stars_braces_and_globstars() {
        let qkv = "model.layers.*.self_attn.{q,k,v}_proj.weight";
        assert!(pattern_matches(
            qkv,
            "model.layers.0.self_attn.q_proj.weight"
        ));
        assert!(pattern_matches(
            qkv,
            "model.layers.31.self_attn.v_proj.weight"
        ));
        assert!(!pattern_matches(
            qkv,
            "model.layers.0.self_attn.o_proj.weight"
        ));
        assert!(!pattern_matches(
            qkv,
            "model.layers.0.1.self_attn.q_proj.weight"
        ));
        assert!(pattern_matches("model.**.weight", "model.weight"));
        assert!(pattern_matches(
            "model.**.weight",
            "model.layers.0.mlp.up_proj.weight"
        ));
        assert!(pattern_matches("**", "lm_head.weight"));
        assert!(pattern_matches(
            "**.*_proj.weight",
            "model.layers.2.mlp.gate_proj.weight"
        ));
        assert!(!pattern_matches("**.*_proj.weight", "model.norm.weight"));
        assert!(pattern_matches(
            "{model.embed_tokens,lm_head}.weight",
            "lm_head.weight"
        ));
        assert!(pattern_matches(
            "model.layers.*.{self_attn.{q,o},mlp.up}_proj.weight",
            "model.layers.1.self_attn.o_proj.weight"
        ));
        assert!(pattern_matches("a.{,b.}c", "a.c") && pattern_matches("a.{,b.}c", "a.b.c"));
        assert!(!pattern_matches("a.*", "a"));
        assert!(!pattern_matches("a.b", "a.b.c"));
    }

    #[test]
    fn malformed_patterns_say_where() {
        let err = |p: &str| ShardPattern::parse(p).expect_err(p);
        assert_eq!(err("a.{b,c.d").at, 2..3);
        assert_eq!(err("a.b}.c").at, 3..4);
        assert_eq!(err("a,b").at, 1..2);
        assert_eq!(err("a b").at, 1..2);
        assert!(err("a..b").message.contains("empty"));
        assert!(err("a.b**").message.contains("whole segment"));
        assert!(err("").message.contains("empty"));
        assert!(err(&"{a,b}".repeat(11)).message.contains("1024"));
        assert!(err(&"{".repeat(10_000)).message.contains("deep"));
    }

    #[test]
    fn nearest_path_ignores_wildcards() {
        let paths = [
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.0.mlp.up_proj.weight",
            "lm_head.weight",
        ];
        let p = ShardPattern::parse("model.layers.*.self_atn.{q,k}_proj.weight").unwrap();
        assert_eq!(p.nearest(paths), Some(paths[0]));
        let p = ShardPattern::parse("**.up_prj.weight").unwrap();
        assert_eq!(p.nearest(paths), Some(paths[1]));
        assert_eq!(p.nearest([]), None);
    }

    proptest::proptest! {
        #[test]
        fn a_path_matches_itself_and_star_matches_any_segment(segs in proptest::collection::vec("[a-z0-9_]{1,6}", 1..6), k in 0usize..6) {
            let path = segs.join(".");
            proptest::prop_assert!(pattern_matches(&path, &path));
            let mut starred = segs.clone();
            let k = k % segs.len();
            starred[k] = "*".to_string();
            proptest::prop_assert!(pattern_matches(&starred.join("."), &path));
            proptest::prop_assert!(pattern_matches("**", &path));
            proptest::prop_assert_eq!(ShardPattern::parse(&path).unwrap().nearest([path.as_str()]), Some(path.as_str()));
        }

        #[test]
        fn parse_never_panics(text in "[a-c.*{},]{0,12}", path in "[a-c.]{0,8}") {
            let _ = pattern_matches(&text, &path);
        }
    }
}
