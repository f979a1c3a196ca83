//! The registry of diagnostic codes. Each code has a one-line title and a Markdown page in
//! `docs/codes/`, embedded in the binary and shown by `mslc explain`. A code without a page does
//! not compile.

macro_rules! codes {
    ($($code:ident => $title:literal,)*) => {
        /// A diagnostic code from the registry.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Code { $(
            #[doc = $title]
            $code,
        )* }

        impl Code {
            /// Every registered code, in order.
            pub const ALL: &'static [Code] = &[$(Code::$code),*];

            /// `"E0001"`.
            pub fn as_str(self) -> &'static str {
                match self { $(Code::$code => stringify!($code),)* }
            }

            /// One-line title.
            pub fn title(self) -> &'static str {
                match self { $(Code::$code => $title,)* }
            }

            /// The Markdown page explaining the code.
            pub fn page(self) -> &'static str {
                match self { $(Code::$code => include_str!(concat!("../../../../docs/codes/", stringify!($code), ".md")),)* }
            }
        }
    };
}

codes! {
    E0001 => "syntax error",
    E0002 => "nesting too deep",
    E0003 => "source is not valid UTF-8 text",
    E0004 => "unterminated string literal",
    E0005 => "unterminated block comment",
    E0006 => "number literal out of range",
    E0007 => "source file too large",
    E0008 => "unsupported line break",
    E0009 => "unclosed delimiter",
    E0010 => "mismatched closing delimiter",
    E0011 => "unexpected closing delimiter",
    E0100 => "cannot read source file",
    E0101 => "module not found",
    E0102 => "name not exported by module",
    E0103 => "import cycle",
    E0104 => "name defined twice",
    E0200 => "unknown name",
    E0201 => "unknown block",
    E0202 => "unknown function or op",
    E0203 => "wrong number of arguments",
    E0204 => "unknown or duplicate named argument",
    E0205 => "instance with parameters needs a label",
    E0206 => "parameter path defined twice",
    E0207 => "assignment to an undefined name",
    E0208 => "misplaced statement",
    E0209 => "block does not return a value",
    E0210 => "expected a compile-time value",
    E0211 => "evaluation limit exceeded",
    E0300 => "shape does not match the pattern",
    E0301 => "dimension bound to two different sizes",
    E0302 => "division is not exact",
    E0303 => "op rejects its operands",
    E0304 => "returned value does not match the declared type",
    E0305 => "wrong kind of value",
    E0306 => "dtype mismatch",
    E0307 => "unknown dtype",
    E0308 => "arithmetic overflow or division by zero",
    E0309 => "invalid dimension size",
    E0400 => "model has no output",
    E0401 => "unknown override",
    E0402 => "invalid override value",
    E0403 => "no such model",
    E0404 => "name defined twice in a model",
    E0500 => "unknown field",
    E0501 => "missing field",
    E0502 => "invalid field value",
    E0503 => "unknown op in a precision policy",
    E0504 => "unknown mesh axis",
    E0505 => "shard spec does not match the tensor's rank",
    E0506 => "sharded dimension not divisible by the axis size",
    E0507 => "device count does not match the mesh",
    E0508 => "shard pattern matches no parameter",
    E0509 => "unknown policy or target",
    E0510 => "invalid pipeline configuration",
    E0600 => "cannot write build outputs",
    E0601 => "weights do not match the model",
    E0602 => "cannot read a weights or artifact file",
    E0603 => "the module cannot run",
    E0604 => "not enough memory to run the model",
    E0605 => "too many threads",
    E0606 => "tensor too large",
    E0607 => "output directory is in use by another build",
    E0608 => "internal compiler error",
    E0609 => "invalid command-line arguments",
    E0620 => "malformed kernel table",
    E0621 => "invalid kernel table entry",
    E0710 => "input dtype that generated bindings cannot take",
    E0700 => "cannot format a file in place",
    W0002 => "precision setting has no effect",
    W0003 => "outputs hold NaN or infinite values",
    W0004 => "module built for another target runs on this CPU",
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Code {
    type Err = ();
    fn from_str(s: &str) -> Result<Code, ()> {
        Code::ALL
            .iter()
            .copied()
            .find(|c| c.as_str().eq_ignore_ascii_case(s))
            .ok_or(())
    }
}

#[cfg(test)]
mod tests {
    use super::Code;

    #[test]
    fn every_code_has_a_page_that_names_it() {
        for code in Code::ALL {
            let page = code.page();
            assert!(
                page.starts_with(&format!("# {code}")),
                "docs/codes/{code}.md must start with `# {code}`"
            );
            assert!(
                page.lines().count() >= 5,
                "docs/codes/{code}.md is too thin"
            );
        }
    }
}
