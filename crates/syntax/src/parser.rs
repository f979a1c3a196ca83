//! pest → typed AST. The only place that sees pest: everything after it works on [`ast`].

use std::cell::RefCell;
use std::num::NonZeroUsize;
use std::sync::OnceLock;

use pest::error::{ErrorVariant, InputLocation};
use pest::iterators::{Pair, Pairs};
use pest::pratt_parser::{Assoc, Op, PrattParser};
use pest::Parser as _;

use super::ast::*;
use super::lexical::{self, LexProblem, MAX_NESTING};
use super::recovery::{self, DelimProblem};
use mslc_core::diag::{Code, Diagnostic, FileId};

#[derive(pest_derive::Parser)]
#[grammar = "../../../grammar/msl.pest"]
struct MslParser;

/// Most operands and operators one expression may chain; the tree of a longer chain would be
/// deep enough to exhaust the stack of later stages.
const MAX_EXPR_PARTS: usize = 4096;

/// Syntax errors reported per file before the rest of it is left unparsed (E0012): enough to
/// fix in one pass, few enough that reporting them stays fast on any file.
const MAX_SYNTAX_ERRORS: usize = 100;

/// Upper bound on pest's rule calls, so pathological input fails instead of running for long.
const CALL_LIMIT: usize = 50_000_000;

/// Parses one file. On a syntax error the returned file is empty and the diagnostics say where:
/// the file is then parsed again item by item, so each broken item is reported (once: an
/// unbalanced delimiter rather than what the parser expected after it).
pub fn parse(file: FileId, text: &str) -> (File, Vec<Diagnostic>) {
    pest::set_call_limit(NonZeroUsize::new(CALL_LIMIT));
    let first = match lexical::scan(text) {
        // Too deep over the whole file may be brackets that broken items left open: each piece
        // is scanned again alone below, and only a shallow one is parsed.
        Some(problem @ LexProblem::TooDeep(_)) => lex_diagnostic(file, 0, problem),
        Some(problem) => return (File::default(), vec![lex_diagnostic(file, 0, problem)]),
        None => match MslParser::parse(Rule::file, text) {
            Ok(pairs) => {
                let builder = Builder::new(file, 0);
                let items = builder.items(pairs);
                return builder.file(items);
            }
            // A resource limit (calls, stack): parsing the pieces would only hit it again.
            Err(error) if matches!(error.variant, ErrorVariant::CustomError { .. }) => {
                return (
                    File::default(),
                    vec![syntax_diagnostic(file, text, 0, error)],
                );
            }
            Err(error) => syntax_diagnostic(file, text, 0, error),
        },
    };
    let mut diagnostics = Vec::new();
    for (start, end) in recovery::pieces(text) {
        if diagnostics.len() >= MAX_SYNTAX_ERRORS {
            let at = start + (text[start..end].len() - text[start..end].trim_start().len());
            let first_char = text[at..].chars().next().map_or(0, char::len_utf8);
            diagnostics.push(
                Diagnostic::error(
                    Code::E0012,
                    file,
                    Span::new(at, at + first_char),
                    format!("too many syntax errors: stopped after {MAX_SYNTAX_ERRORS}"),
                )
                .with_label("the rest of the file, from here, was not parsed")
                .with_help("fix the errors above and check again"),
            );
            break;
        }
        let piece = &text[start..end];
        if let Some(problem) = lexical::scan(piece) {
            diagnostics.push(lex_diagnostic(file, start, problem));
            continue;
        }
        match MslParser::parse(Rule::file, piece) {
            Ok(pairs) => {
                let builder = Builder::new(file, start);
                builder.items(pairs);
                diagnostics.extend(builder.errors.into_inner());
            }
            Err(error) => diagnostics.push(piece_diagnostic(file, text, (start, end), error)),
        }
    }
    if diagnostics.is_empty() {
        // The pieces parse alone but not together (an item keyword at the start of a line
        // inside another item, say): the whole file's error is the one to show.
        diagnostics.push(first);
    }
    (File::default(), diagnostics)
}

/// The diagnostic for a piece `text[start..end]` that does not parse: its first delimiter
/// problem when the parser stopped at or after it, the parser's own error otherwise.
fn piece_diagnostic(
    file: FileId,
    text: &str,
    (start, end): (usize, usize),
    error: pest::error::Error<Rule>,
) -> Diagnostic {
    let pos = start + error_pos(&error);
    match recovery::first_problem(text, start, end) {
        Some(problem) if pos >= problem.start() => delimiter_diagnostic(file, text, problem, pos),
        _ => syntax_diagnostic(file, text, start, error),
    }
}

/// E0009–E0011 for `problem`; `stuck` is where the parser stopped.
fn delimiter_diagnostic(
    file: FileId,
    text: &str,
    problem: DelimProblem,
    stuck: usize,
) -> Diagnostic {
    match problem {
        DelimProblem::Unclosed { open, delim, at } => {
            let close = recovery::closer(delim);
            let pos = if stuck > open.start && stuck <= at {
                stuck
            } else {
                at
            };
            // At the end of the file, point at its last character: an empty span there would
            // show no line.
            let last = text.trim_end();
            let (span, label) = if pos >= last.len() {
                let ch = last.chars().next_back().map_or(0, char::len_utf8);
                let span = Span::new(last.len() - ch, last.len());
                (
                    span,
                    format!("expected `{close}` after this, at the end of the file"),
                )
            } else {
                let end = (pos + found_len(text, pos)).min(text.len());
                let label = format!("expected `{close}` before {}", found_at(text, pos));
                (Span::new(pos, end), label)
            };
            Diagnostic::error(Code::E0009, file, span, format!("unclosed `{delim}`"))
                .with_label(label)
                .with_related(file, open, "opened here")
                .with_help(format!("close it with `{close}`"))
        }
        DelimProblem::Mismatched {
            close,
            found,
            open,
            delim,
        } => {
            let expected = recovery::closer(delim);
            Diagnostic::error(
                Code::E0010,
                file,
                close,
                format!("mismatched closing delimiter: expected `{expected}`, found `{found}`"),
            )
            .with_label(format!("expected `{expected}`"))
            .with_related(file, open, format!("unclosed `{delim}` opened here"))
            .with_help(format!("close the `{delim}` with `{expected}` first"))
        }
        DelimProblem::Unexpected { close, found } => Diagnostic::error(
            Code::E0011,
            file,
            close,
            format!("unexpected closing delimiter `{found}`"),
        )
        .with_label("nothing is open here")
        .with_help(format!(
            "remove it, or add the `{}` it should close",
            match found {
                ')' => '(',
                ']' => '[',
                _ => '{',
            }
        )),
    }
}

/// The diagnostic for a problem the lexical pre-pass found in the text starting at `base`.
fn lex_diagnostic(file: FileId, base: usize, problem: LexProblem) -> Diagnostic {
    let at = |s: Span| Span::new(base + s.start, base + s.end);
    let problem = match problem {
        LexProblem::UnterminatedString(s) => LexProblem::UnterminatedString(at(s)),
        LexProblem::UnterminatedComment(s) => LexProblem::UnterminatedComment(at(s)),
        LexProblem::TooDeep(s) => LexProblem::TooDeep(at(s)),
        LexProblem::LineBreak(s, c) => LexProblem::LineBreak(at(s), c),
    };
    match problem {
        LexProblem::UnterminatedString(span) => {
            Diagnostic::error(Code::E0004, file, span, "unterminated string literal")
                .with_label("this string is never closed")
                .with_help("close it with `\"` before the end of the line")
        }
        LexProblem::UnterminatedComment(span) => {
            Diagnostic::error(Code::E0005, file, span, "unterminated block comment")
                .with_label("this comment is never closed")
                .with_help("close it with `*/`")
        }
        LexProblem::TooDeep(span) => Diagnostic::error(
            Code::E0002,
            file,
            span,
            format!("brackets nested more than {MAX_NESTING} deep"),
        )
        .with_label("one level too many")
        .with_help("split the expression with `let` bindings"),
        LexProblem::LineBreak(span, c) => {
            let what = match c {
                '\r' => "a carriage return (`\\r`) without a line feed",
                '\u{85}' => "NEXT LINE (U+0085)",
                '\u{2028}' => "LINE SEPARATOR (U+2028)",
                _ => "PARAGRAPH SEPARATOR (U+2029)",
            };
            Diagnostic::error(
                Code::E0008,
                file,
                span,
                format!("unsupported line break: {what}"),
            )
            .with_label("editors start a new line here, the grammar does not")
            .with_help("end lines with `\\n` (LF) or `\\r\\n` (CRLF)")
        }
    }
}

/// Offset of a pest error in the text it parsed.
fn error_pos(error: &pest::error::Error<Rule>) -> usize {
    match error.location {
        InputLocation::Pos(p) => p,
        InputLocation::Span((s, _)) => s,
    }
}

/// E0001 for a pest `error` in the piece of `text` starting at `base`.
fn syntax_diagnostic(
    file: FileId,
    text: &str,
    base: usize,
    error: pest::error::Error<Rule>,
) -> Diagnostic {
    let pos = base + error_pos(&error);
    let found = found_at(text, pos);
    let message = match &error.variant {
        ErrorVariant::ParsingError { positives, .. }
            if positives.iter().any(|r| rule_name(*r).is_some()) =>
        {
            let mut names: Vec<&str> = positives.iter().filter_map(|r| rule_name(*r)).collect();
            names.sort_unstable();
            names.dedup();
            let continuation = ["`(`", "`.`", "`[`", "an operator", "an annotation"];
            if names.iter().any(|n| !continuation.contains(n)) {
                names.retain(|n| !continuation.contains(n));
            }
            format!("expected {}, found {found}", one_of(&names))
        }
        ErrorVariant::CustomError { message } => message.clone(),
        _ => format!("unexpected {found}"),
    };
    let end = (pos + found_len(text, pos)).min(text.len());
    Diagnostic::error(Code::E0001, file, Span::new(pos, end), message).with_label("here")
}

fn found_at(text: &str, pos: usize) -> String {
    match text.get(pos..).and_then(|rest| rest.chars().next()) {
        None => "end of file".to_string(),
        Some(_) => format!("`{}`", &text[pos..pos + found_len(text, pos)]),
    }
}

/// Length of the token-ish thing at `pos`: a word, or one character.
fn found_len(text: &str, pos: usize) -> usize {
    let Some(rest) = text.get(pos..) else {
        return 0;
    };
    let word: usize = rest
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .take(40)
        .map(char::len_utf8)
        .sum();
    if word > 0 {
        word
    } else {
        rest.chars().next().map_or(0, char::len_utf8)
    }
}

fn one_of(names: &[&str]) -> String {
    match names {
        [] => "something else".to_string(),
        [one] => one.to_string(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

/// Names for the rules a user may be told were expected; `None` hides internal ones.
fn rule_name(rule: Rule) -> Option<&'static str> {
    Some(match rule {
        Rule::EOI => "end of file",
        Rule::ident | Rule::param_path | Rule::label_name => "a name",
        Rule::block_name => "a block name",
        Rule::expr | Rule::list_elem => "an expression",
        Rule::int_lit | Rule::float_lit | Rule::number => "a number",
        Rule::string => "a string",
        Rule::tensor_type | Rule::dtype_name => "a tensor type",
        Rule::scalar_type => "a type",
        Rule::body | Rule::fields => "`{`",
        Rule::pipe
        | Rule::or
        | Rule::and
        | Rule::eq
        | Rule::ne
        | Rule::le
        | Rule::ge
        | Rule::lt
        | Rule::gt
        | Rule::add
        | Rule::sub
        | Rule::mul
        | Rule::div
        | Rule::rem
        | Rule::matmul_op => "an operator",
        Rule::call_args => "`(`",
        Rule::field_access => "`.`",
        Rule::index => "`[`",
        Rule::annotation | Rule::annotation_at => "an annotation",
        Rule::kw_import
        | Rule::kw_const
        | Rule::kw_block
        | Rule::kw_model
        | Rule::kw_train
        | Rule::kw_target
        | Rule::pub_kw
        | Rule::kw_pub
        | Rule::policy_kind => "an item (`import`, `const`, `block`, `model`, `precision`, …)",
        Rule::kw_let
        | Rule::kw_for
        | Rule::kw_if
        | Rule::kw_return
        | Rule::kw_output
        | Rule::kw_input
        | Rule::kw_dims
        | Rule::param_kind
        | Rule::assign_stmt => "a statement",
        Rule::kw_shard | Rule::typed_field | Rule::assign_field => "a field",
        Rule::kw_in => "`in`",
        Rule::kw_else => "`else`",
        Rule::kw_as => "`as`",
        Rule::ellipsis | Rule::wildcard => "a dimension",
        Rule::instance | Rule::label_path => "an instance",
        Rule::named_arg | Rule::arg => "an argument",
        Rule::record_field => "a record field",
        Rule::lint_name => "a lint name (`unused`)",
        _ => return None,
    })
}

fn pratt() -> &'static PrattParser<Rule> {
    static PRATT: OnceLock<PrattParser<Rule>> = OnceLock::new();
    PRATT.get_or_init(|| {
        PrattParser::new()
            .op(Op::postfix(Rule::annotation))
            .op(Op::infix(Rule::pipe, Assoc::Left))
            .op(Op::infix(Rule::or, Assoc::Left))
            .op(Op::infix(Rule::and, Assoc::Left))
            .op(Op::infix(Rule::eq, Assoc::Left)
                | Op::infix(Rule::ne, Assoc::Left)
                | Op::infix(Rule::lt, Assoc::Left)
                | Op::infix(Rule::le, Assoc::Left)
                | Op::infix(Rule::gt, Assoc::Left)
                | Op::infix(Rule::ge, Assoc::Left))
            .op(Op::infix(Rule::add, Assoc::Left) | Op::infix(Rule::sub, Assoc::Left))
            .op(Op::infix(Rule::mul, Assoc::Left)
                | Op::infix(Rule::div, Assoc::Left)
                | Op::infix(Rule::rem, Assoc::Left)
                | Op::infix(Rule::matmul_op, Assoc::Left))
            .op(Op::prefix(Rule::neg) | Op::prefix(Rule::not))
            .op(Op::postfix(Rule::call_args)
                | Op::postfix(Rule::field_access)
                | Op::postfix(Rule::index))
    })
}

/// Keyword tokens carry no information once the rule matched; skip them.
fn is_keyword(rule: Rule) -> bool {
    matches!(
        rule,
        Rule::kw_import
            | Rule::kw_const
            | Rule::kw_block
            | Rule::kw_model
            | Rule::kw_train
            | Rule::kw_target
            | Rule::kw_shard
            | Rule::kw_let
            | Rule::kw_for
            | Rule::kw_in
            | Rule::kw_if
            | Rule::kw_else
            | Rule::kw_return
            | Rule::kw_output
            | Rule::kw_input
            | Rule::kw_dims
            | Rule::kw_as
            | Rule::kw_pub
    )
}

fn inner<'a>(pair: Pair<'a, Rule>) -> impl Iterator<Item = Pair<'a, Rule>> {
    pair.into_inner().filter(|p| !is_keyword(p.as_rule()))
}

struct Builder {
    file: FileId,
    /// Offset in the file of the text pest parsed (a piece of it, after a syntax error).
    base: usize,
    errors: RefCell<Vec<Diagnostic>>,
    /// `@allow` attributes met so far, each with what it precedes.
    allows: RefCell<Vec<Allow>>,
}

impl Builder {
    fn new(file: FileId, base: usize) -> Self {
        Builder {
            file,
            base,
            errors: RefCell::new(Vec::new()),
            allows: RefCell::new(Vec::new()),
        }
    }

    /// The items of a parsed `file` rule; the `@allow` attributes before them are recorded.
    fn items(&self, pairs: Pairs<'_, Rule>) -> Vec<Item> {
        let mut items = Vec::new();
        let mut pending = Vec::new();
        for pair in pairs.flatten().take(1).flat_map(|p| p.into_inner()) {
            match pair.as_rule() {
                Rule::EOI => {}
                Rule::allow => pending.push(pair),
                _ => {
                    let span = self.span_of(&pair);
                    self.attach(&mut pending, span);
                    items.push(self.item(pair));
                }
            }
        }
        items
    }

    /// The file of `items` with the `@allow` attributes recorded, in source order.
    fn file(self, items: Vec<Item>) -> (File, Vec<Diagnostic>) {
        let mut allows = self.allows.into_inner();
        allows.sort_by_key(|a| a.span.start);
        (File { items, allows }, self.errors.into_inner())
    }

    /// The pair's span in the file, without the trailing whitespace pest's implicit skipping
    /// leaves in it.
    fn span_of(&self, pair: &Pair<'_, Rule>) -> Span {
        let s = pair.as_span();
        let trimmed = s.as_str().trim_end().len();
        let start = self.base + s.start();
        Span::new(start, start + trimmed)
    }

    /// Records the `@allow` attributes just read as applying to the node at `target`.
    fn attach(&self, pending: &mut Vec<Pair<'_, Rule>>, target: Span) {
        for pair in pending.drain(..) {
            let span = self.span_of(&pair);
            let lint = inner(pair)
                .find(|p| p.as_rule() == Rule::lint_name)
                .map(|p| self.ident(p))
                .expect("grammar: lint name");
            self.allows.borrow_mut().push(Allow { lint, span, target });
        }
    }

    fn ident(&self, pair: Pair<'_, Rule>) -> Ident {
        Ident {
            name: pair.as_str().to_string(),
            span: self.span_of(&pair),
        }
    }

    /// A label segment: a plain name, or a template when it has `{…}` holes.
    fn label_name(&self, pair: Pair<'_, Rule>) -> LabelSeg {
        let pieces: Vec<LabelPiece> = inner(pair)
            .map(|p| match p.as_rule() {
                Rule::label_hole => {
                    LabelPiece::Hole(self.expr(inner(p).next().expect("grammar: hole")))
                }
                _ => LabelPiece::Text(self.ident(p)),
            })
            .collect();
        match pieces.as_slice() {
            [LabelPiece::Text(name)] => LabelSeg::Name(name.clone()),
            _ => LabelSeg::Template(pieces),
        }
    }

    fn item(&self, pair: Pair<'_, Rule>) -> Item {
        let span = self.span_of(&pair);
        match pair.as_rule() {
            Rule::import => Item::Import(self.import(pair, span)),
            Rule::const_item => {
                let mut parts = inner(pair).peekable();
                let public = parts.next_if(|p| p.as_rule() == Rule::pub_kw).is_some();
                let bindings = self.bindings(parts.next().expect("grammar: binding list"));
                Item::Const(ConstItem {
                    public,
                    bindings,
                    span,
                })
            }
            Rule::block_item => Item::Block(self.block(pair, span)),
            Rule::model_item => {
                let mut parts = inner(pair);
                let name = self.ident(parts.next().expect("grammar: model name"));
                let body = self.body(parts.next().expect("grammar: model body"));
                Item::Model(ModelItem { name, body, span })
            }
            Rule::policy_item => {
                let mut parts = inner(pair);
                let kind = match parts.next().expect("grammar: policy kind").as_str() {
                    "precision" => DeclKind::Precision,
                    "parallel" => DeclKind::Parallel,
                    _ => DeclKind::Memory,
                };
                let name = self.ident(parts.next().expect("grammar: policy name"));
                let fields = self.fields(parts.next().expect("grammar: fields"));
                Item::Decl(DeclItem {
                    kind,
                    public: false,
                    name,
                    for_model: None,
                    fields,
                    span,
                })
            }
            Rule::train_item => {
                let mut parts = inner(pair);
                let name = self.ident(parts.next().expect("grammar: train name"));
                let model = self.ident(parts.next().expect("grammar: train model"));
                let fields = self.fields(parts.next().expect("grammar: fields"));
                Item::Decl(DeclItem {
                    kind: DeclKind::Train,
                    public: false,
                    name,
                    for_model: Some(model),
                    fields,
                    span,
                })
            }
            Rule::target_item => {
                let mut parts = inner(pair).peekable();
                let public = parts.next_if(|p| p.as_rule() == Rule::pub_kw).is_some();
                let name = self.ident(parts.next().expect("grammar: target name"));
                let fields = self.fields(parts.next().expect("grammar: fields"));
                Item::Decl(DeclItem {
                    kind: DeclKind::Target,
                    public,
                    name,
                    for_model: None,
                    fields,
                    span,
                })
            }
            rule => unreachable!("grammar: unexpected item {rule:?}"),
        }
    }

    fn import(&self, pair: Pair<'_, Rule>, span: Span) -> Import {
        let mut dots = 0;
        let mut path = Vec::new();
        let mut group = None;
        for part in inner(pair) {
            match part.as_rule() {
                Rule::relative_dots => dots = part.as_str().len(),
                Rule::ident => path.push(self.ident(part)),
                Rule::import_group => group = Some(part),
                rule => unreachable!("grammar: unexpected {rule:?} in import"),
            }
        }
        match group {
            Some(group) => {
                let names = inner(group).map(|n| self.import_name(n)).collect();
                Import {
                    dots,
                    module: path,
                    names,
                    braced: true,
                    span,
                }
            }
            None => {
                let name = path.pop().expect("grammar: import names something");
                Import {
                    dots,
                    module: path,
                    names: vec![ImportName { name, alias: None }],
                    braced: false,
                    span,
                }
            }
        }
    }

    fn import_name(&self, pair: Pair<'_, Rule>) -> ImportName {
        let mut parts = inner(pair);
        let name = self.ident(parts.next().expect("grammar: import name"));
        let alias = parts.next().map(|p| self.ident(p));
        ImportName { name, alias }
    }

    fn bindings(&self, pair: Pair<'_, Rule>) -> Vec<Binding> {
        inner(pair)
            .map(|b| {
                let mut parts = inner(b);
                let name = self.ident(parts.next().expect("grammar: binding name"));
                let value = self.expr(parts.next().expect("grammar: binding value"));
                Binding { name, value }
            })
            .collect()
    }

    fn block(&self, pair: Pair<'_, Rule>, span: Span) -> BlockItem {
        let mut parts = inner(pair).peekable();
        let public = parts.next_if(|p| p.as_rule() == Rule::pub_kw).is_some();
        let name = self.ident(parts.next().expect("grammar: block name"));
        let mut params = Vec::new();
        let mut ret = None;
        let mut body = Vec::new();
        for part in parts {
            match part.as_rule() {
                Rule::block_param => params.push(self.block_param(part)),
                Rule::tensor_type => ret = Some(RetType::Tensor(self.tensor_type(part))),
                Rule::tuple_type => {
                    let s = self.span_of(&part);
                    ret = Some(RetType::Tuple(
                        inner(part).map(|t| self.tensor_type(t)).collect(),
                        s,
                    ))
                }
                Rule::body => body = self.body(part),
                rule => unreachable!("grammar: unexpected {rule:?} in block"),
            }
        }
        BlockItem {
            public,
            name,
            params,
            ret,
            body,
            span,
        }
    }

    fn block_param(&self, pair: Pair<'_, Rule>) -> BlockParam {
        let mut parts = inner(pair);
        let name = self.ident(parts.next().expect("grammar: param name"));
        let ty_pair = parts.next().expect("grammar: param type");
        let ty = match ty_pair.as_rule() {
            Rule::tensor_type => ParamType::Tensor(self.tensor_type(ty_pair)),
            _ => ParamType::Scalar(self.ident(ty_pair)),
        };
        let default = parts.next().map(|p| self.expr(p));
        BlockParam { name, ty, default }
    }

    fn tensor_type(&self, pair: Pair<'_, Rule>) -> TensorType {
        let span = self.span_of(&pair);
        let mut dtype = None;
        let mut dims = Vec::new();
        for part in inner(pair) {
            match part.as_rule() {
                Rule::dtype_name => dtype = Some(self.ident(part)),
                Rule::ellipsis => dims.push(Dim::Ellipsis(self.span_of(&part))),
                Rule::wildcard => dims.push(Dim::Wildcard(self.span_of(&part))),
                _ => dims.push(Dim::Expr(self.expr(part))),
            }
        }
        TensorType { dtype, dims, span }
    }

    fn body(&self, pair: Pair<'_, Rule>) -> Vec<Stmt> {
        let mut stmts = Vec::new();
        let mut pending = Vec::new();
        for part in inner(pair) {
            if part.as_rule() == Rule::allow {
                pending.push(part);
                continue;
            }
            self.attach(&mut pending, self.span_of(&part));
            stmts.push(self.stmt(part));
        }
        stmts
    }

    fn stmt(&self, pair: Pair<'_, Rule>) -> Stmt {
        let span = self.span_of(&pair);
        let rule = pair.as_rule();
        let mut parts = inner(pair);
        let mut next = || parts.next().expect("grammar: statement part");
        match rule {
            Rule::let_stmt => {
                let pattern = next();
                let (names, tuple) = match pattern.as_rule() {
                    Rule::tuple_pattern => (inner(pattern).map(|p| self.ident(p)).collect(), true),
                    _ => (vec![self.ident(pattern)], false),
                };
                Stmt::Let {
                    names,
                    tuple,
                    value: self.expr(next()),
                    span,
                }
            }
            Rule::assign_stmt => Stmt::Assign {
                name: self.ident(next()),
                value: self.expr(next()),
                span,
            },
            Rule::for_stmt => {
                let var = self.ident(next());
                let start = self.expr(next());
                let end = self.expr(next());
                Stmt::For {
                    var,
                    start,
                    end,
                    body: self.body(next()),
                    span,
                }
            }
            Rule::if_stmt => {
                let cond = self.expr(next());
                let then = self.body(next());
                let otherwise = parts.next().map(|p| match p.as_rule() {
                    Rule::if_stmt => vec![self.stmt(p)],
                    _ => self.body(p),
                });
                Stmt::If {
                    cond,
                    then,
                    otherwise,
                    span,
                }
            }
            Rule::return_stmt => Stmt::Return {
                value: self.expr(next()),
                span,
            },
            Rule::const_stmt => Stmt::Const {
                bindings: self.bindings(next()),
                span,
            },
            Rule::dims_stmt => Stmt::Dims {
                bindings: self.bindings(next()),
                span,
            },
            Rule::input_stmt => Stmt::Input {
                name: self.ident(next()),
                ty: self.tensor_type(next()),
                span,
            },
            Rule::output_stmt => Stmt::Output {
                name: self.ident(next()),
                value: self.expr(next()),
                span,
            },
            Rule::param_stmt => {
                let kind = match next().as_str() {
                    "param" => ParamKind::Param,
                    _ => ParamKind::Buffer,
                };
                let name = self.ident(next());
                let ty = self.tensor_type(next());
                let init = parts.next().map(|p| self.expr(p));
                Stmt::Param {
                    kind,
                    name,
                    ty,
                    init,
                    span,
                }
            }
            rule => unreachable!("grammar: unexpected statement {rule:?}"),
        }
    }

    fn fields(&self, pair: Pair<'_, Rule>) -> Vec<Field> {
        inner(pair)
            .map(|f| {
                let span = self.span_of(&f);
                let rule = f.as_rule();
                let mut parts = inner(f);
                let mut next = || parts.next().expect("grammar: field part");
                match rule {
                    Rule::shard_field => {
                        let s = next();
                        let pattern = Ident {
                            name: unescape(
                                s.clone().into_inner().next().map_or("", |p| p.as_str()),
                            ),
                            span: self.span_of(&s),
                        };
                        Field::Shard {
                            pattern,
                            value: self.expr(next()),
                            span,
                        }
                    }
                    Rule::typed_field => Field::Typed {
                        name: self.ident(next()),
                        ty: self.tensor_type(next()),
                        span,
                    },
                    _ => Field::Assign {
                        key: self.ident(next()),
                        value: self.expr(next()),
                        span,
                    },
                }
            })
            .collect()
    }

    fn expr(&self, pair: Pair<'_, Rule>) -> Expr {
        debug_assert_eq!(pair.as_rule(), Rule::expr);
        self.pratt_expr(pair.into_inner())
    }

    fn pratt_expr(&self, pairs: Pairs<'_, Rule>) -> Expr {
        let count = pairs.clone().count();
        if count > MAX_EXPR_PARTS {
            let span = pairs
                .clone()
                .next()
                .map_or(Span::default(), |p| self.span_of(&p));
            self.errors.borrow_mut().push(
                Diagnostic::error(
                    Code::E0002,
                    self.file,
                    span,
                    format!("expression has {count} parts, more than {MAX_EXPR_PARTS}"),
                )
                .with_label("this expression is too long")
                .with_help("split it with `let` bindings"),
            );
            return Expr {
                kind: ExprKind::Int(0),
                span,
            };
        }
        pratt()
            .map_primary(|p| self.primary(p))
            .map_prefix(|op, rhs| {
                let span = self.span_of(&op).to(rhs.span);
                let op = if op.as_rule() == Rule::neg {
                    UnOp::Neg
                } else {
                    UnOp::Not
                };
                Expr {
                    kind: ExprKind::Unary {
                        op,
                        expr: Box::new(rhs),
                    },
                    span,
                }
            })
            .map_infix(|lhs, op, rhs| {
                let span = lhs.span.to(rhs.span);
                let op = match op.as_rule() {
                    Rule::pipe => BinOp::Pipe,
                    Rule::or => BinOp::Or,
                    Rule::and => BinOp::And,
                    Rule::eq => BinOp::Eq,
                    Rule::ne => BinOp::Ne,
                    Rule::lt => BinOp::Lt,
                    Rule::le => BinOp::Le,
                    Rule::gt => BinOp::Gt,
                    Rule::ge => BinOp::Ge,
                    Rule::add => BinOp::Add,
                    Rule::sub => BinOp::Sub,
                    Rule::mul => BinOp::Mul,
                    Rule::div => BinOp::Div,
                    Rule::rem => BinOp::Rem,
                    _ => BinOp::MatMul,
                };
                Expr {
                    kind: ExprKind::Binary {
                        op,
                        lhs: Box::new(lhs),
                        rhs: Box::new(rhs),
                    },
                    span,
                }
            })
            .map_postfix(|lhs, op| {
                let span = lhs.span.to(self.span_of(&op));
                let base = Box::new(lhs);
                let kind = match op.as_rule() {
                    Rule::call_args => ExprKind::Call {
                        callee: base,
                        args: self.args(op),
                    },
                    Rule::field_access => ExprKind::Field {
                        base,
                        name: self.ident(inner(op).next().expect("grammar: field name")),
                    },
                    Rule::index => ExprKind::Index {
                        base,
                        index: Box::new(self.expr(inner(op).next().expect("grammar: index"))),
                    },
                    _ => ExprKind::Annotated {
                        expr: base,
                        annotation: self.annotation(op),
                    },
                };
                Expr { kind, span }
            })
            .parse(pairs)
    }

    fn annotation(&self, pair: Pair<'_, Rule>) -> Annotation {
        let span = self.span_of(&pair);
        let mut parts = inner(pair);
        let at = parts.next().expect("grammar: annotation name");
        let at_span = self.span_of(&at);
        let name = Ident {
            name: at.as_str()[1..].to_string(),
            span: Span::new(at_span.start + 1, at_span.end),
        };
        let args = parts.next().map(|a| self.args(a));
        Annotation { name, args, span }
    }

    fn args(&self, pair: Pair<'_, Rule>) -> Vec<Arg> {
        inner(pair)
            .map(|arg| {
                let a = inner(arg).next().expect("grammar: argument");
                match a.as_rule() {
                    Rule::named_arg => {
                        let mut parts = inner(a);
                        let name = self.ident(parts.next().expect("grammar: arg name"));
                        let value = self.expr(parts.next().expect("grammar: arg value"));
                        Arg {
                            name: Some(name),
                            value,
                        }
                    }
                    _ => Arg {
                        name: None,
                        value: self.expr(a),
                    },
                }
            })
            .collect()
    }

    fn primary(&self, pair: Pair<'_, Rule>) -> Expr {
        let span = self.span_of(&pair);
        let kind = match pair.as_rule() {
            Rule::int_lit => match pair.as_str().parse::<i64>() {
                Ok(v) => ExprKind::Int(v),
                Err(_) => {
                    self.errors.borrow_mut().push(
                        Diagnostic::error(
                            Code::E0006,
                            self.file,
                            span,
                            "integer literal too large",
                        )
                        .with_label("does not fit in 64 bits")
                        .with_help("integers range up to 9223372036854775807"),
                    );
                    ExprKind::Int(0)
                }
            },
            Rule::float_lit => ExprKind::Float(self.float(pair.as_str(), span)),
            Rule::quantity => {
                let mut parts = pair.into_inner();
                let number = parts.next().expect("grammar: quantity number");
                let unit = parts
                    .next()
                    .expect("grammar: quantity unit")
                    .as_str()
                    .to_string();
                ExprKind::Quantity {
                    value: self.float(number.as_str(), span),
                    text: number.as_str().to_string(),
                    unit,
                }
            }
            Rule::word | Rule::ident => ExprKind::Name(pair.as_str().to_string()),
            Rule::bool_lit => ExprKind::Bool(pair.as_str() == "true"),
            Rule::string => ExprKind::Str(unescape(
                pair.into_inner().next().map_or("", |p| p.as_str()),
            )),
            Rule::wildcard => ExprKind::Wildcard,
            Rule::list => ExprKind::List(inner(pair).map(|e| self.list_elem(e)).collect()),
            Rule::record => ExprKind::Record(
                inner(pair)
                    .map(|f| {
                        let mut parts = inner(f);
                        let name = self.ident(parts.next().expect("grammar: record key"));
                        (
                            name,
                            self.expr(parts.next().expect("grammar: record value")),
                        )
                    })
                    .collect(),
            ),
            Rule::tuple_or_paren => {
                let trailing_comma = pair
                    .as_str()
                    .trim_end_matches(')')
                    .trim_end()
                    .ends_with(',');
                let mut elems: Vec<Expr> = inner(pair).map(|e| self.expr(e)).collect();
                if elems.len() == 1 && !trailing_comma {
                    ExprKind::Paren(Box::new(elems.remove(0)))
                } else {
                    ExprKind::Tuple(elems)
                }
            }
            Rule::instance => {
                let mut parts = inner(pair);
                let label_pair = parts.next().expect("grammar: label");
                let label_span = self.span_of(&label_pair);
                let label = inner(label_pair)
                    .map(|seg| match seg.as_rule() {
                        Rule::label_name => self.label_name(seg),
                        Rule::label_field => {
                            self.label_name(inner(seg).next().expect("grammar: label"))
                        }
                        _ => LabelSeg::Index(self.expr(inner(seg).next().expect("grammar: index"))),
                    })
                    .collect();
                let block = self.ident(parts.next().expect("grammar: block name"));
                let args = self.args(parts.next().expect("grammar: args"));
                ExprKind::Instance {
                    label,
                    label_span,
                    block,
                    args,
                }
            }
            rule => unreachable!("grammar: unexpected primary {rule:?}"),
        };
        Expr { kind, span }
    }

    fn list_elem(&self, pair: Pair<'_, Rule>) -> Expr {
        match pair.as_rule() {
            Rule::wildcard => Expr {
                kind: ExprKind::Wildcard,
                span: self.span_of(&pair),
            },
            _ => self.expr(pair),
        }
    }

    fn float(&self, text: &str, span: Span) -> f64 {
        match text.parse::<f64>() {
            Ok(v) if v.is_finite() => v,
            _ => {
                self.errors.borrow_mut().push(
                    Diagnostic::error(Code::E0006, self.file, span, "number literal out of range")
                        .with_label("not a finite 64-bit float"),
                );
                0.0
            }
        }
    }
}

/// Resolves the escapes the grammar allows: `\" \\ \n \t`.
fn unescape(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some(other) => out.push(other),
                None => {}
            }
        } else {
            out.push(c);
        }
    }
    out
}
