//! The `.npy` header: a Python dict literal such as
//! `{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }`, parsed without evaluating
//! anything and written the way NumPy writes it.

/// The three fields every `.npy` header holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Header {
    /// NumPy type string, e.g. `<f4`.
    pub(super) descr: String,
    /// Whether the data is stored column-major.
    pub(super) fortran_order: bool,
    /// Dimensions; empty for a scalar.
    pub(super) shape: Vec<usize>,
}

/// Formats the header dict the way NumPy does (without the padding and newline).
pub(super) fn format(descr: &str, shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    let shape = match dims.as_slice() {
        [one] => format!("({one},)"),
        _ => format!("({})", dims.join(", ")),
    };
    format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}")
}

/// Parses a header dict; the error says what is wrong and where.
pub(super) fn parse(text: &str) -> Result<Header, String> {
    let mut p = Parser { text, pos: 0 };
    let (mut descr, mut fortran_order, mut shape) = (None, None, None);
    p.skip_space();
    p.expect('{')?;
    loop {
        p.skip_space();
        if p.eat('}') {
            break;
        }
        let key = p.string()?;
        p.skip_space();
        p.expect(':')?;
        p.skip_space();
        let fresh = match key.as_str() {
            "descr" => descr.replace(p.string()?).is_none(),
            "fortran_order" => fortran_order.replace(p.boolean()?).is_none(),
            "shape" => shape.replace(p.tuple()?).is_none(),
            other => return Err(format!("unexpected key '{other}'")),
        };
        if !fresh {
            return Err(format!("key '{key}' appears twice"));
        }
        p.skip_space();
        if !p.eat(',') {
            p.expect('}')?;
            break;
        }
    }
    p.skip_space();
    if p.pos != text.len() {
        return Err(format!("unexpected text after the dict at {}", p.pos));
    }
    let missing = |key: &str| format!("missing key '{key}'");
    Ok(Header {
        descr: descr.ok_or_else(|| missing("descr"))?,
        fortran_order: fortran_order.ok_or_else(|| missing("fortran_order"))?,
        shape: shape.ok_or_else(|| missing("shape"))?,
    })
}

/// A cursor over the header text.
struct Parser<'a> {
    text: &'a str,
    pos: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<char> {
        self.text[self.pos..].chars().next()
    }

    fn skip_space(&mut self) {
        while let Some(c) = self.peek().filter(|c| c.is_ascii_whitespace()) {
            self.pos += c.len_utf8();
        }
    }

    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(c) {
            self.pos += c.len_utf8();
            true
        } else {
            false
        }
    }

    fn expect(&mut self, c: char) -> Result<(), String> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(match self.peek() {
                Some(found) => format!("expected '{c}' at {}, found '{found}'", self.pos),
                None => format!("expected '{c}' at {}, found the end", self.pos),
            })
        }
    }

    /// A quoted string without escapes.
    fn string(&mut self) -> Result<String, String> {
        let quote = match self.peek() {
            Some(q @ ('\'' | '"')) => q,
            _ => return Err(format!("expected a quoted string at {}", self.pos)),
        };
        let start = self.pos + 1;
        let len = self.text[start..]
            .find(quote)
            .ok_or_else(|| format!("unterminated string at {}", self.pos))?;
        let body = &self.text[start..start + len];
        if body.contains('\\') {
            return Err(format!(
                "escapes in strings are not supported (at {})",
                self.pos
            ));
        }
        self.pos = start + len + 1;
        Ok(body.to_string())
    }

    fn boolean(&mut self) -> Result<bool, String> {
        for (word, value) in [("True", true), ("False", false)] {
            if self.text[self.pos..].starts_with(word) {
                self.pos += word.len();
                return Ok(value);
            }
        }
        Err(format!("expected True or False at {}", self.pos))
    }

    /// A tuple of non-negative integers: `()`, `(3,)`, `(2, 3)`, `(2, 3,)`.
    fn tuple(&mut self) -> Result<Vec<usize>, String> {
        self.expect('(')?;
        let mut dims = Vec::new();
        loop {
            self.skip_space();
            if self.eat(')') {
                break;
            }
            dims.push(self.integer()?);
            self.skip_space();
            if !self.eat(',') {
                self.expect(')')?;
                break;
            }
        }
        Ok(dims)
    }

    /// Decimal digits, with the `L` suffix Python 2 wrote after long integers.
    fn integer(&mut self) -> Result<usize, String> {
        let start = self.pos;
        let digits = self.text[start..]
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(self.text.len() - start);
        if digits == 0 {
            return Err(format!("expected a dimension at {start}"));
        }
        let text = &self.text[start..start + digits];
        self.pos += digits;
        self.eat('L');
        text.parse()
            .map_err(|_| format!("dimension {text} is too large"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(descr: &str, fortran_order: bool, shape: &[usize]) -> Header {
        Header {
            descr: descr.to_string(),
            fortran_order,
            shape: shape.to_vec(),
        }
    }

    #[test]
    fn formats_like_numpy() {
        assert_eq!(
            format("<f4", &[2, 3]),
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"
        );
        assert_eq!(
            format("|b1", &[7]),
            "{'descr': '|b1', 'fortran_order': False, 'shape': (7,), }"
        );
        assert_eq!(
            format("<i8", &[]),
            "{'descr': '<i8', 'fortran_order': False, 'shape': (), }"
        );
    }

    #[test]
    fn parses_what_it_formats() {
        for shape in [&[][..], &[0], &[5], &[2, 3, 4]] {
            assert_eq!(
                parse(&format("<f2", shape)),
                Ok(header("<f2", false, shape))
            );
        }
    }

    #[test]
    fn parses_other_spellings() {
        let text = "  {\"shape\":(3L,4L,),'fortran_order':True,\n'descr':\"<f8\"}   \n";
        assert_eq!(parse(text), Ok(header("<f8", true, &[3, 4])));
        assert_eq!(
            parse("{'descr': '<i4', 'fortran_order': False, 'shape': ( )}"),
            Ok(header("<i4", false, &[]))
        );
    }

    #[test]
    fn rejects_malformed_dicts_with_a_reason() {
        let cases = [
            ("", "expected '{' at 0, found the end"),
            (
                "{'descr': '<f4', 'fortran_order': False}",
                "missing key 'shape'",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}",
                "unexpected key 'x'",
            ),
            (
                "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': ()}",
                "key 'descr' appears twice",
            ),
            ("{'descr': <f4}", "expected a quoted string at 10"),
            ("{'descr': '<f4", "unterminated string at 10"),
            (
                "{'descr': 'a\\'b'}",
                "escapes in strings are not supported (at 10)",
            ),
            ("{'fortran_order': 0}", "expected True or False at 18"),
            ("{'shape': (1, -2)}", "expected a dimension at 14"),
            (
                "{'shape': (99999999999999999999999,)}",
                "dimension 99999999999999999999999 is too large",
            ),
            ("{'shape': (1 2)}", "expected ')' at 13, found '2'"),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': ()} x",
                "unexpected text after the dict at 54",
            ),
            (
                "{'descr': '<f4' 'shape': ()}",
                "expected '}' at 16, found '''",
            ),
        ];
        for (text, reason) in cases {
            assert_eq!(parse(text), Err(reason.to_string()), "{text}");
        }
    }
}
