//! Turning diagnostics into text: human reports through miette (fixed width, colour optional)
//! and one JSON object per line for editors and build scripts.

use std::borrow::Cow;
use std::fmt;

use miette::{GraphicalReportHandler, GraphicalTheme, LabeledSpan, NamedSource, SourceSpan};
use serde::Serialize;

use crate::snippet::{escape, Snippet};
use mslc_core::diag::{Code, Diagnostic, FileId, Label, Severity, Sources};

/// How to print diagnostics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RenderOptions {
    /// Use ANSI colours.
    pub color: bool,
    /// Wrap width in columns.
    pub width: usize,
}

impl Default for RenderOptions {
    fn default() -> Self {
        RenderOptions {
            color: false,
            width: 100,
        }
    }
}

/// A problem with no place in a source file: a flag, a weights or artifact file, an input, the
/// executor. It is rendered by the same renderer, in the same layout and JSON schema, as a
/// [`Diagnostic`], with no source quoted and no spans.
#[derive(Clone, Copy, Debug)]
pub struct Plain<'a> {
    /// Registry code.
    pub code: Code,
    /// Error or warning.
    pub severity: Severity,
    /// What went wrong.
    pub message: &'a str,
    /// How to fix it, where that can be said.
    pub help: Option<&'a str>,
}

/// Renders one diagnostic as a human-readable report.
pub fn render_human(diag: &Diagnostic, sources: &Sources, options: RenderOptions) -> String {
    render_report(&Report::new(diag, sources), options)
}

/// Renders a problem with no source position as a human-readable report.
pub fn render_plain_human(plain: &Plain, options: RenderOptions) -> String {
    render_report(&Report::plain(plain), options)
}

fn render_report(report: &Report, options: RenderOptions) -> String {
    let theme = if options.color {
        GraphicalTheme::unicode()
    } else {
        GraphicalTheme::unicode_nocolor()
    };
    let handler = GraphicalReportHandler::new_themed(theme)
        .with_width(options.width)
        .with_links(false)
        .with_context_lines(1);
    let mut out = String::new();
    if handler.render_report(&mut out, report).is_err() {
        out = format!(
            "{}[{}]: {}\n",
            severity_word(report.severity),
            report.code,
            report.message
        );
    }
    out
}

fn severity_word(severity: Severity) -> &'static str {
    match severity {
        Severity::Error => "error",
        Severity::Warning => "warning",
    }
}

/// A diagnostic adapted to miette: labels in the primary file are drawn on its source; labels in
/// other files become related reports with their own source.
struct Report {
    code: String,
    message: String,
    severity: Severity,
    help: Option<String>,
    /// The quoted file; none for a [`Plain`] problem.
    source: Option<Quoted>,
    labels: Vec<LabeledSpan>,
    related: Vec<Report>,
}

impl Report {
    fn new(diag: &Diagnostic, sources: &Sources) -> Report {
        let file = diag.primary.file;
        let mut here = vec![(&diag.primary, true)];
        let mut related = Vec::new();
        for label in &diag.related {
            if label.file == file {
                here.push((label, false));
            } else {
                related.push(Report::note(label, sources));
            }
        }
        let (source, labels) = quote(sources, file, &here);
        Report {
            code: diag.code.to_string(),
            message: escape(&diag.message).into_owned(),
            severity: diag.severity,
            help: diag.help.as_deref().map(|h| escape(h).into_owned()),
            source: Some(source),
            labels,
            related,
        }
    }

    fn plain(plain: &Plain) -> Report {
        Report {
            code: plain.code.to_string(),
            message: escape(plain.message).into_owned(),
            severity: plain.severity,
            help: plain.help.map(|h| escape(h).into_owned()),
            source: None,
            labels: Vec::new(),
            related: Vec::new(),
        }
    }

    fn note(label: &Label, sources: &Sources) -> Report {
        let (source, labels) = quote(sources, label.file, &[(label, false)]);
        Report {
            code: String::new(),
            message: escape(&label.message).into_owned(),
            severity: Severity::Warning,
            help: None,
            source: Some(source),
            labels,
            related: Vec::new(),
        }
    }
}

/// A file's text as quoted in a report. The position miette shows in the header of each quoted
/// stretch (`[file:line:column]`, of the primary label or, in a stretch without it, of its first
/// label) is the label's start in the original file, its column counted in characters as the
/// JSON form counts it (miette counts bytes, and a clipped line has moved).
struct Quoted {
    source: NamedSource<String>,
    /// Each label's drawn offset in the quoted text, and its start's 0-based line and character
    /// column in the original; the primary label first.
    headers: Vec<(usize, usize, usize)>,
}

impl miette::SourceCode for Quoted {
    fn read_span<'a>(
        &'a self,
        span: &SourceSpan,
        before: usize,
        after: usize,
    ) -> Result<Box<dyn miette::SpanContents<'a> + 'a>, miette::MietteError> {
        let contents = self.source.read_span(span, before, after)?;
        // miette reads a label's span without context lines only for a header.
        let header = (before, after) == (0, 0);
        let found = self
            .headers
            .iter()
            .find(|&&(offset, _, _)| header && offset == span.offset());
        match found {
            Some(&(_, line, column)) => Ok(Box::new(miette::MietteSpanContents::new_named(
                self.source.name().to_string(),
                contents.data(),
                *contents.span(),
                line,
                column,
                contents.line_count(),
            ))),
            _ => Ok(contents),
        }
    }
}

/// The file's text made safe to quote (hazards pictured, long lines clipped around the labels)
/// and the labels moved onto it.
fn quote(sources: &Sources, file: FileId, labels: &[(&Label, bool)]) -> (Quoted, Vec<LabeledSpan>) {
    let f = sources.get(file);
    let text = &f.text;
    let bounds: Vec<(usize, usize)> = labels
        .iter()
        .map(|(label, _)| {
            let floor = |at: usize| mslc_core::diag::source::floor_char_boundary(text, at);
            let start = floor(label.span.start.min(text.len()));
            let end = floor(label.span.end.min(text.len()));
            (start, end.max(start))
        })
        .collect();
    let drawn: Vec<(usize, usize)> = bounds
        .iter()
        .map(|&outer| uncovered(text, outer, &bounds))
        .collect();
    let points: Vec<usize> = drawn
        .iter()
        .flat_map(|&(start, end)| [start, end])
        .collect();
    let snippet = Snippet::new(text, &points);
    let spans = labels
        .iter()
        .zip(&drawn)
        .map(|(&(label, primary), &(start, end))| {
            let (start, end) = (snippet.map(start), snippet.map(end).max(snippet.map(start)));
            let span = SourceSpan::new(start.into(), end - start);
            let message = (!label.message.is_empty()).then(|| escape(&label.message).into_owned());
            if primary {
                LabeledSpan::new_primary_with_span(message, span)
            } else {
                LabeledSpan::new_with_span(message, span)
            }
        })
        .collect();
    // A header names where its label starts in the file, as the JSON form does, even where the
    // label is drawn on a part of its span.
    let headers = bounds
        .iter()
        .zip(&drawn)
        .map(|(&(start, _), &(at, _))| {
            let (line, column) = sources.line_col(file, start);
            (snippet.map(at), line - 1, column - 1)
        })
        .collect();
    let source = NamedSource::new(escape(&f.name), snippet.text);
    (Quoted { source, headers }, spans)
}

/// Where to draw a label whose one-line span encloses other labels (`x @ w`, with a label on
/// each operand): on the first stretch of it the others leave uncovered, trimmed of blanks (the
/// `@`). miette draws labels that overlap on one line with their arrows past the operands; a
/// label that encloses none, spans lines, or is wholly covered is drawn as it is.
fn uncovered(text: &str, outer: (usize, usize), all: &[(usize, usize)]) -> (usize, usize) {
    let (start, end) = outer;
    if text[start..end].contains('\n') {
        return outer;
    }
    let mut inner: Vec<(usize, usize)> = all
        .iter()
        .copied()
        .filter(|&(s, e)| s < e && start <= s && e <= end && (s, e) != outer)
        .collect();
    if inner.is_empty() {
        return outer;
    }
    inner.sort_unstable();
    let mut gaps = Vec::new();
    let mut at = start;
    for (s, e) in inner {
        if s > at {
            gaps.push((at, s));
        }
        at = at.max(e);
    }
    gaps.push((at, end));
    gaps.into_iter()
        .find_map(|(s, e)| {
            let gap = &text[s..e];
            let trimmed = gap.trim();
            let lead = gap.len() - gap.trim_start().len();
            (!trimmed.is_empty()).then(|| (s + lead, s + lead + trimmed.len()))
        })
        .unwrap_or(outer)
}

impl fmt::Debug for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Report {}

impl miette::Diagnostic for Report {
    fn code<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        (!self.code.is_empty()).then(|| Box::new(&self.code) as Box<dyn fmt::Display>)
    }

    fn severity(&self) -> Option<miette::Severity> {
        Some(match self.severity {
            Severity::Error => miette::Severity::Error,
            Severity::Warning if self.code.is_empty() => miette::Severity::Advice,
            Severity::Warning => miette::Severity::Warning,
        })
    }

    fn help<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        self.help
            .as_ref()
            .map(|h| Box::new(h) as Box<dyn fmt::Display>)
    }

    fn source_code(&self) -> Option<&dyn miette::SourceCode> {
        self.source.as_ref().map(|s| s as &dyn miette::SourceCode)
    }

    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        if self.labels.is_empty() {
            return None;
        }
        Some(Box::new(self.labels.iter().cloned()))
    }

    fn related<'a>(&'a self) -> Option<Box<dyn Iterator<Item = &'a dyn miette::Diagnostic> + 'a>> {
        if self.related.is_empty() {
            return None;
        }
        Some(Box::new(
            self.related.iter().map(|r| r as &dyn miette::Diagnostic),
        ))
    }
}

/// The JSON form of one label.
#[derive(Serialize)]
struct JsonLabel<'a> {
    file: Cow<'a, str>,
    byte_start: usize,
    byte_end: usize,
    line_start: usize,
    column_start: usize,
    line_end: usize,
    column_end: usize,
    message: Cow<'a, str>,
    primary: bool,
}

/// The JSON form of one diagnostic (one line of `--message-format json`): one schema for
/// every problem, so a problem with no place in a source file ([`Plain`]) has the same keys, its
/// position `null` and no labels. Lines and columns are 1-based and count characters (Unicode
/// scalar values), as the human report's header does.
#[derive(Serialize)]
struct JsonDiagnostic<'a> {
    code: &'a str,
    severity: Severity,
    message: Cow<'a, str>,
    file: Option<Cow<'a, str>>,
    byte_start: Option<usize>,
    byte_end: Option<usize>,
    line_start: Option<usize>,
    column_start: Option<usize>,
    line_end: Option<usize>,
    column_end: Option<usize>,
    labels: Vec<JsonLabel<'a>>,
    help: Option<Cow<'a, str>>,
}

fn json_label<'a>(label: &'a Label, sources: &'a Sources, primary: bool) -> JsonLabel<'a> {
    let (line_start, column_start) = sources.line_col(label.file, label.span.start);
    let (line_end, column_end) = sources.line_col(label.file, label.span.end);
    JsonLabel {
        file: escape(&sources.get(label.file).name),
        byte_start: label.span.start,
        byte_end: label.span.end,
        line_start,
        column_start,
        line_end,
        column_end,
        message: escape(&label.message),
        primary,
    }
}

/// Renders one diagnostic as a single line of JSON; text from the source is escaped as for
/// the human form, so a terminal showing the line is safe too.
pub fn render_json(diag: &Diagnostic, sources: &Sources) -> String {
    let primary = json_label(&diag.primary, sources, true);
    let mut labels = vec![json_label(&diag.primary, sources, true)];
    labels.extend(diag.related.iter().map(|l| json_label(l, sources, false)));
    to_line(&JsonDiagnostic {
        code: diag.code.as_str(),
        severity: diag.severity,
        message: escape(&diag.message),
        file: Some(primary.file),
        byte_start: Some(primary.byte_start),
        byte_end: Some(primary.byte_end),
        line_start: Some(primary.line_start),
        column_start: Some(primary.column_start),
        line_end: Some(primary.line_end),
        column_end: Some(primary.column_end),
        labels,
        help: diag.help.as_deref().map(escape),
    })
}

/// Renders a problem with no source position as a single line of JSON, in the schema of
/// [`render_json`].
pub fn render_plain_json(plain: &Plain) -> String {
    to_line(&JsonDiagnostic {
        code: plain.code.as_str(),
        severity: plain.severity,
        message: escape(plain.message),
        file: None,
        byte_start: None,
        byte_end: None,
        line_start: None,
        column_start: None,
        line_end: None,
        column_end: None,
        labels: Vec::new(),
        help: plain.help.map(escape),
    })
}

fn to_line(json: &JsonDiagnostic) -> String {
    serde_json::to_string(json).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}
