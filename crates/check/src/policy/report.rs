//! Where policy checks send their diagnostics, and the conversions from evaluated values to the
//! typed settings (integer, number, flag, size, enum word) that report a precise E0502 when the
//! value has the wrong kind or range.

use mslc_core::diag::{Code, Diagnostic, FileId};
use mslc_core::span::Span;

use super::value::{Unit, Val, Value};
use crate::suggest;

/// The words that spell an enum setting: the first spelling of each entry is the canonical one,
/// the others are accepted aliases (MindSpore's names).
pub(crate) type Choices<T> = [(&'static [&'static str], T)];

/// `with_related` for a place that may be absent (a field left out).
pub(crate) trait WithRelatedIf {
    /// Adds the related span when there is one.
    fn with_related_if(self, file: FileId, span: Option<Span>, message: impl Into<String>) -> Self;
}

impl WithRelatedIf for Diagnostic {
    fn with_related_if(self, file: FileId, span: Option<Span>, message: impl Into<String>) -> Self {
        match span {
            Some(span) => self.with_related(file, span, message),
            None => self,
        }
    }
}

/// Collects the diagnostics of one declaration's file.
pub(crate) struct Reporter<'d> {
    file: FileId,
    diags: &'d mut Vec<Diagnostic>,
}

impl<'d> Reporter<'d> {
    /// Reports into `diags`, pointing into `file`.
    pub(crate) fn new(file: FileId, diags: &'d mut Vec<Diagnostic>) -> Self {
        Reporter { file, diags }
    }

    /// The file spans point into.
    pub(crate) fn file(&self) -> FileId {
        self.file
    }

    /// An error in this file, not yet reported.
    pub(crate) fn error(&self, code: Code, span: Span, message: impl Into<String>) -> Diagnostic {
        Diagnostic::error(code, self.file, span, message)
    }

    /// Reports a diagnostic.
    pub(crate) fn push(&mut self, diagnostic: Diagnostic) {
        self.diags.push(diagnostic);
    }

    /// E0502 at `span` with a label and a help line.
    pub(crate) fn invalid(&mut self, span: Span, message: String, label: &str, help: String) {
        let diagnostic = self
            .error(Code::E0502, span, message)
            .with_label(label)
            .with_help(help);
        self.push(diagnostic);
    }

    /// E0502 "expected `what`, found …" at the value.
    pub(crate) fn expected(&mut self, value: &Value, what: &str, help: String) {
        let message = format!("expected {what}, found {}", value.describe());
        self.invalid(value.span, message, &format!("expected {what}"), help);
    }

    /// Reports `problem` at the value unless `ok`; returns `ok`.
    pub(crate) fn ensure(&mut self, ok: bool, value: &Value, problem: String, help: &str) -> bool {
        if !ok {
            self.invalid(value.span, problem, "out of range", help.to_string());
        }
        ok
    }

    /// An integer.
    pub(crate) fn int(&mut self, value: &Value, what: &str) -> Option<i64> {
        match value.val {
            Val::Int(i) => Some(i),
            _ => {
                self.expected(value, "an integer", format!("{what} is a whole number"));
                None
            }
        }
    }

    /// An integer ≥ 1 (a count or a size of something).
    pub(crate) fn positive_int(&mut self, value: &Value, what: &str) -> Option<i64> {
        let i = self.int(value, what)?;
        let ok = self.ensure(
            i >= 1,
            value,
            format!("{what} must be at least 1, found {i}"),
            "use a positive whole number",
        );
        ok.then_some(i)
    }

    /// An integer or a float, as a float.
    pub(crate) fn number(&mut self, value: &Value, what: &str) -> Option<f64> {
        let number = value.number();
        if number.is_none() {
            self.expected(
                value,
                "a number",
                format!("{what} is a number such as `0.1`"),
            );
        }
        number
    }

    /// `true` or `false`.
    pub(crate) fn flag(&mut self, value: &Value, what: &str) -> Option<bool> {
        match value.val {
            Val::Bool(b) => Some(b),
            _ => {
                self.expected(value, "`true` or `false`", format!("{what} is a flag"));
                None
            }
        }
    }

    /// A positive quantity of `unit`, in its base unit; `example` shows how to write one.
    pub(crate) fn quantity(&mut self, value: &Value, unit: Unit, example: &str) -> Option<f64> {
        let amount = match value.val {
            Val::Quantity(u, amount) if u == unit => amount,
            _ => {
                let help = format!("write {} with its unit, e.g. `{example}`", unit.noun());
                self.expected(value, unit.noun(), help);
                return None;
            }
        };
        let ok = self.ensure(
            amount > 0.0,
            value,
            format!("{} must be positive", unit.noun()),
            "use an amount greater than zero",
        );
        ok.then_some(amount)
    }

    /// A positive whole number of bytes.
    pub(crate) fn bytes(&mut self, value: &Value, example: &str) -> Option<u64> {
        let amount = self.quantity(value, Unit::Bytes, example)?;
        // u64::MAX as f64 rounds up to 2^64, so `<` keeps the cast below exact.
        let ok = self.ensure(
            amount.fract() == 0.0 && amount < u64::MAX as f64,
            value,
            "a size must be a whole number of bytes that fits in 64 bits".to_string(),
            "use a whole number of bytes, e.g. `1536MiB` instead of `1.5GiB` or `1.5GB`",
        );
        ok.then_some(amount as u64)
    }

    /// One of the enum's words; unknown words get a did-you-mean and the list of choices.
    pub(crate) fn word<T: Copy>(
        &mut self,
        value: &Value,
        what: &str,
        choices: &Choices<T>,
    ) -> Option<T> {
        self.word_coded(value, what, choices, Code::E0502)
    }

    /// [`Reporter::word`], reporting a word outside the choices with its own `code` (a field
    /// whose unknown value has a code of its own, E0511 for a recompute strategy).
    pub(crate) fn word_coded<T: Copy>(
        &mut self,
        value: &Value,
        what: &str,
        choices: &Choices<T>,
        code: Code,
    ) -> Option<T> {
        let canonical: Vec<&str> = choices.iter().map(|(spellings, _)| spellings[0]).collect();
        let Some(word) = value.word() else {
            let help = format!("{what} is one of {}", suggest::one_of(canonical));
            self.expected(value, &format!("{what} name"), help);
            return None;
        };
        let found = choices
            .iter()
            .find(|(spellings, _)| spellings.contains(&word.name.as_str()));
        if found.is_none() {
            let all = choices
                .iter()
                .flat_map(|(spellings, _)| spellings.iter().copied());
            let best = suggest::closest(&word.name, canonical.iter().copied())
                .or_else(|| suggest::closest(&word.name, all));
            let help = match best {
                Some(best) => format!(
                    "did you mean `{best}`? {what} is one of {}",
                    suggest::one_of(canonical)
                ),
                None => format!("{what} is one of {}", suggest::one_of(canonical)),
            };
            let message = format!("unknown {what} `{}`", word.name);
            let diagnostic = self
                .error(code, word.span, message)
                .with_label(format!("not a known {what}"))
                .with_help(help);
            self.push(diagnostic);
        }
        found.map(|(_, v)| *v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::field_expr;
    use crate::policy::value::eval;

    fn with_value<R>(
        src: &str,
        f: impl FnOnce(&mut Reporter, &Value) -> R,
    ) -> (R, Vec<Diagnostic>) {
        let mut diags = Vec::new();
        let mut rep = Reporter::new(FileId(0), &mut diags);
        let value = eval(&field_expr(src), &mut rep).expect("evaluates");
        let result = f(&mut rep, &value);
        (result, diags)
    }

    #[test]
    fn sizes_must_be_whole_positive_bytes() {
        assert_eq!(with_value("1.5KB", |r, v| r.bytes(v, "1KB")).0, Some(1500));
        let (none, diags) = with_value("1.5B", |r, v| r.bytes(v, "1KB"));
        assert_eq!((none, diags[0].code), (None, Code::E0502));
        assert_eq!(with_value("0GB", |r, v| r.bytes(v, "1KB")).0, None);
        let (none, diags) = with_value("3", |r, v| r.bytes(v, "31GB"));
        assert_eq!(none, None);
        assert!(diags[0].help.as_deref().unwrap_or("").contains("`31GB`"));
        assert_eq!(with_value("1e30B", |r, v| r.bytes(v, "1KB")).0, None);
    }

    #[test]
    fn words_accept_aliases_and_suggest() {
        const MODES: &Choices<u8> = &[
            (&["data", "data_parallel"], 1),
            (&["auto", "auto_parallel"], 2),
        ];
        assert_eq!(
            with_value("data_parallel", |r, v| r.word(v, "mode", MODES)).0,
            Some(1)
        );
        let (none, diags) = with_value("dta", |r, v| r.word(v, "mode", MODES));
        assert_eq!(none, None);
        assert_eq!(diags[0].primary.span.len(), 3);
        assert_eq!(
            diags[0].help.as_deref(),
            Some("did you mean `data`? mode is one of `data` or `auto`")
        );
        let (_, diags) = with_value("3", |r, v| r.word(v, "mode", MODES));
        assert_eq!(
            diags[0].message,
            "expected mode name, found the integer `3`"
        );
    }

    #[test]
    fn numbers_and_counts() {
        assert_eq!(
            with_value("4", |r, v| r.positive_int(v, "stages")).0,
            Some(4)
        );
        assert_eq!(with_value("0", |r, v| r.positive_int(v, "stages")).0, None);
        assert_eq!(with_value("2.5", |r, v| r.int(v, "stages")).0, None);
        assert_eq!(with_value("2", |r, v| r.number(v, "lr")).0, Some(2.0));
        assert_eq!(with_value("true", |r, v| r.flag(v, "x")).0, Some(true));
        assert_eq!(with_value("1", |r, v| r.flag(v, "x")).0, None);
    }
}
