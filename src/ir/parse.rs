//! Reads the text form written by [`super::text::to_text`] back into a [`Graph`], re-typing
//! every op through the registry and checking the types the text states.

use super::graph::{Annotations, Graph, Init, ValueRef};
use crate::ops::{AttrValue, Attrs, DType, Op, TensorType};
use std::collections::HashMap;
use std::fmt;

/// Why a text dump could not be read, with the 1-based line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    pub line: usize,
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for ParseError {}

/// Parses a text dump. Blank lines are skipped; every other line is a node or an output.
pub fn parse_text(text: &str) -> Result<Graph, ParseError> {
    let mut p = Parser {
        graph: Graph::new(),
        values: HashMap::new(),
    };
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        p.line(line).map_err(|message| ParseError {
            line: i + 1,
            message,
        })?;
    }
    Ok(p.graph)
}

struct Parser {
    graph: Graph,
    /// `%N` → the value it names.
    values: HashMap<u64, ValueRef>,
}

impl Parser {
    fn line(&mut self, line: &str) -> Result<(), String> {
        let mut c = Cursor::new(line);
        if c.eat_word("output") {
            let name = c.string()?;
            c.expect("=")?;
            let v = self.use_value(&mut c)?;
            c.end()?;
            return self.graph.set_output(&name, v).map_err(|e| e.0);
        }
        let mut results = vec![c.value_number()?];
        while c.eat(",") {
            results.push(c.value_number()?);
        }
        c.expect("=")?;
        let word = c
            .ident()
            .ok_or("expected `input`, `param`, `buffer` or an op name")?;
        let (node, stated_annotations) = match word.as_str() {
            "input" => {
                let name = c.string()?;
                let ann = annotations(&mut c)?;
                let ty = single_type(&mut c)?;
                (self.graph.add_input(&name, ty).node, ann)
            }
            "param" | "buffer" => {
                let path = c.string()?;
                let init = init(&mut c)?;
                let ann = annotations(&mut c)?;
                let ty = single_type(&mut c)?;
                (
                    self.graph.add_param(&path, ty, init, word == "param").node,
                    ann,
                )
            }
            name => {
                let op = Op::from_name(name).ok_or_else(|| format!("unknown op `{name}`"))?;
                c.expect("(")?;
                let mut args = Vec::new();
                if !c.eat(")") {
                    loop {
                        args.push(self.use_value(&mut c)?);
                        if c.eat(")") {
                            break;
                        }
                        c.expect(",")?;
                    }
                }
                let attrs = attributes(&mut c)?;
                let ann = annotations(&mut c)?;
                c.expect(":")?;
                let stated = types(&mut c)?;
                let outs = self.graph.add_op(op, attrs, &args).map_err(|e| e.message)?;
                let node = outs.first().map(|v| v.node);
                let inferred: Vec<TensorType> = outs
                    .iter()
                    .filter_map(|v| self.graph.value_type(*v).cloned())
                    .collect();
                if inferred != stated {
                    return Err(format!(
                        "the text says {} but {op} gives {}",
                        join(&stated),
                        join(&inferred)
                    ));
                }
                (node.ok_or("an op without outputs cannot be named")?, ann)
            }
        };
        let origin = if c.eat("#") {
            Some(origin(&mut c)?)
        } else {
            None
        };
        c.end()?;
        let n = self.graph.node(node).map_or(0, |n| n.outputs.len());
        if results.len() != n {
            return Err(format!("{} result names for {n} outputs", results.len()));
        }
        for (index, number) in results.into_iter().enumerate() {
            if self
                .values
                .insert(number, ValueRef { node, index })
                .is_some()
            {
                return Err(format!("%{number} is defined twice"));
            }
        }
        if let Some(n) = self.graph.node_mut(node) {
            n.origin = origin;
            n.annotations = stated_annotations;
        }
        Ok(())
    }

    fn use_value(&self, c: &mut Cursor) -> Result<ValueRef, String> {
        let n = c.value_number()?;
        self.values
            .get(&n)
            .copied()
            .ok_or_else(|| format!("%{n} is used before it is defined"))
    }
}

fn join(ts: &[TensorType]) -> String {
    ts.iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// `: TYPE` for a node with one output.
fn single_type(c: &mut Cursor) -> Result<TensorType, String> {
    c.expect(":")?;
    let mut ts = types(c)?;
    match ts.len() {
        1 => Ok(ts.remove(0)),
        n => Err(format!("expected one type, got {n}")),
    }
}

fn types(c: &mut Cursor) -> Result<Vec<TensorType>, String> {
    let mut out = vec![tensor_type(c)?];
    while c.eat(",") {
        out.push(tensor_type(c)?);
    }
    Ok(out)
}

fn tensor_type(c: &mut Cursor) -> Result<TensorType, String> {
    let dtype = c.dtype()?;
    c.expect("[")?;
    let mut shape = Vec::new();
    if !c.eat("]") {
        loop {
            shape.push(c.int()?);
            if c.eat("]") {
                break;
            }
            c.expect(",")?;
        }
    }
    Ok(TensorType::new(dtype, shape))
}

fn init(c: &mut Cursor) -> Result<Init, String> {
    let word = c.ident().ok_or("expected an initializer")?;
    let mut args = Vec::new();
    if c.eat("(") {
        loop {
            args.push(c.float()?);
            if c.eat(")") {
                break;
            }
            c.expect(",")?;
        }
    }
    Ok(match (word.as_str(), &args[..]) {
        ("zeros", []) => Init::Zeros,
        ("ones", []) => Init::Ones,
        ("normal", &[mean, std]) => Init::Normal { mean, std },
        ("uniform", &[low, high]) => Init::Uniform { low, high },
        ("constant", &[v]) => Init::Constant { v },
        _ => {
            return Err(format!(
                "bad initializer `{word}` with {} arguments",
                args.len()
            ))
        }
    })
}

/// `{k=v, ...}`, or nothing.
fn attributes(c: &mut Cursor) -> Result<Attrs, String> {
    let mut attrs = Attrs::new();
    if !c.eat("{") {
        return Ok(attrs);
    }
    loop {
        let name = c.ident().ok_or("expected an attribute name")?;
        c.expect("=")?;
        let v = attr_value(c)?;
        attrs.insert(&name, v);
        if c.eat("}") {
            return Ok(attrs);
        }
        c.expect(",")?;
    }
}

fn attr_value(c: &mut Cursor) -> Result<AttrValue, String> {
    if c.peek_is("\"") {
        return Ok(AttrValue::Str(c.string()?));
    }
    if c.eat("[") {
        let mut v = Vec::new();
        if !c.eat("]") {
            loop {
                v.push(c.int()?);
                if c.eat("]") {
                    break;
                }
                c.expect(",")?;
            }
        }
        return Ok(AttrValue::Ints(v));
    }
    if c.eat_word("true") {
        return Ok(AttrValue::Bool(true));
    }
    if c.eat_word("false") {
        return Ok(AttrValue::Bool(false));
    }
    let save = c.pos;
    if let Some(word) = c.ident() {
        if let Some(d) = DType::parse(&word) {
            return Ok(AttrValue::DType(d));
        }
        c.pos = save;
    }
    let tok = c.number_token()?;
    let float_like = tok.contains(['.', 'e', 'E']) || tok.ends_with("inf") || tok == "NaN";
    if float_like {
        tok.parse::<f64>()
            .map(AttrValue::Float)
            .map_err(|_| format!("bad number `{tok}`"))
    } else {
        tok.parse::<i64>()
            .map(AttrValue::Int)
            .map_err(|_| format!("bad integer `{tok}`"))
    }
}

fn annotations(c: &mut Cursor) -> Result<Annotations, String> {
    let mut a = Annotations::default();
    while c.eat("@") {
        match c.ident().as_deref() {
            Some("shard") => {
                c.expect("(")?;
                let mut layouts = Vec::new();
                loop {
                    layouts.push(layout(c)?);
                    if c.eat(")") {
                        break;
                    }
                    c.expect(",")?;
                }
                a.shard = Some(layouts);
            }
            Some("recompute") => a.recompute = true,
            Some("keep") => {
                c.expect("(")?;
                a.keep_dtype = Some(c.dtype()?);
                c.expect(")")?;
            }
            other => return Err(format!("unknown annotation `@{}`", other.unwrap_or(""))),
        }
    }
    Ok(a)
}

fn layout(c: &mut Cursor) -> Result<Vec<Option<String>>, String> {
    c.expect("[")?;
    let mut dims = Vec::new();
    if c.eat("]") {
        return Ok(dims);
    }
    loop {
        dims.push(if c.peek_is("\"") {
            Some(c.string()?)
        } else {
            match c.ident().ok_or("expected a mesh axis or `_`")? {
                u if u == "_" => None,
                name => Some(name),
            }
        });
        if c.eat("]") {
            return Ok(dims);
        }
        c.expect(",")?;
    }
}

/// The origin after `#`: a quoted string, or the rest of the line.
fn origin(c: &mut Cursor) -> Result<String, String> {
    c.skip_ws();
    if c.peek_is("\"") {
        c.string()
    } else {
        let rest = c.rest().trim_end().to_string();
        c.pos = c.s.len();
        Ok(rest)
    }
}

/// A position in one line.
struct Cursor<'a> {
    s: &'a str,
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn new(s: &'a str) -> Cursor<'a> {
        Cursor { s, pos: 0 }
    }

    fn rest(&self) -> &'a str {
        &self.s[self.pos..]
    }

    fn skip_ws(&mut self) {
        let trimmed = self.rest().trim_start();
        self.pos = self.s.len() - trimmed.len();
    }

    fn peek_is(&mut self, tok: &str) -> bool {
        self.skip_ws();
        self.rest().starts_with(tok)
    }

    fn eat(&mut self, tok: &str) -> bool {
        if self.peek_is(tok) {
            self.pos += tok.len();
            true
        } else {
            false
        }
    }

    fn expect(&mut self, tok: &str) -> Result<(), String> {
        if self.eat(tok) {
            Ok(())
        } else {
            Err(format!("expected `{tok}` at `{}`", self.rest()))
        }
    }

    fn end(&mut self) -> Result<(), String> {
        self.skip_ws();
        if self.rest().is_empty() {
            Ok(())
        } else {
            Err(format!("unexpected `{}`", self.rest()))
        }
    }

    /// Takes the longest prefix of characters matching `f`.
    fn take_while(&mut self, f: impl Fn(char) -> bool) -> &'a str {
        self.skip_ws();
        let rest = self.rest();
        let len = rest.find(|ch: char| !f(ch)).unwrap_or(rest.len());
        self.pos += len;
        &rest[..len]
    }

    fn ident(&mut self) -> Option<String> {
        let save = self.pos;
        let word = self.take_while(|ch| ch.is_ascii_alphanumeric() || ch == '_');
        if super::text::is_ident(word) {
            Some(word.to_string())
        } else {
            self.pos = save;
            None
        }
    }

    /// Consumes `word` only as a whole identifier.
    fn eat_word(&mut self, word: &str) -> bool {
        let save = self.pos;
        if self.ident().as_deref() == Some(word) {
            true
        } else {
            self.pos = save;
            false
        }
    }

    fn dtype(&mut self) -> Result<DType, String> {
        let word = self
            .ident()
            .ok_or_else(|| format!("expected a dtype at `{}`", self.rest()))?;
        DType::parse(&word).ok_or_else(|| format!("unknown dtype `{word}`"))
    }

    fn value_number(&mut self) -> Result<u64, String> {
        self.expect("%")?;
        let digits = self.take_while(|ch| ch.is_ascii_digit());
        digits
            .parse()
            .map_err(|_| format!("expected a value number after `%` at `{}`", self.rest()))
    }

    /// A number as text: digits, sign, point, exponent, or `inf` / `NaN`.
    fn number_token(&mut self) -> Result<&'a str, String> {
        let tok = self.take_while(|ch| ch.is_ascii_alphanumeric() || "+-.".contains(ch));
        if tok.is_empty() {
            Err(format!("expected a value at `{}`", self.rest()))
        } else {
            Ok(tok)
        }
    }

    fn int(&mut self) -> Result<i64, String> {
        let tok = self.number_token()?;
        tok.parse().map_err(|_| format!("bad integer `{tok}`"))
    }

    fn float(&mut self) -> Result<f64, String> {
        let tok = self.number_token()?;
        tok.parse().map_err(|_| format!("bad number `{tok}`"))
    }

    /// A double-quoted string with the escapes `crate::ops::quote` writes.
    fn string(&mut self) -> Result<String, String> {
        self.expect("\"")?;
        let mut out = String::new();
        let mut chars = self.rest().char_indices();
        while let Some((i, ch)) = chars.next() {
            match ch {
                '"' => {
                    self.pos += i + 1;
                    return Ok(out);
                }
                '\\' => match chars.next().map(|(_, e)| e) {
                    Some('"') => out.push('"'),
                    Some('\\') => out.push('\\'),
                    Some('n') => out.push('\n'),
                    Some('t') => out.push('\t'),
                    Some('u') => {
                        let hex: String = chars
                            .by_ref()
                            .map(|(_, h)| h)
                            .skip_while(|&h| h == '{')
                            .take_while(|&h| h != '}')
                            .collect();
                        let ch = u32::from_str_radix(&hex, 16)
                            .ok()
                            .and_then(char::from_u32)
                            .ok_or_else(|| format!("bad escape `\\u{{{hex}}}`"))?;
                        out.push(ch);
                    }
                    other => {
                        return Err(format!("bad escape `\\{}`", other.unwrap_or(' ')));
                    }
                },
                ch => out.push(ch),
            }
        }
        Err("unterminated string".into())
    }
}
