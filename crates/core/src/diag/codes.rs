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
    E0012 => "too many syntax errors",
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
    E0310 => "split does not fit the axis",
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
    E0511 => "unknown recompute strategy",
    E0520 => "train has no trainable parameter",
    E0521 => "train cannot be compiled",
    E0600 => "cannot write output files",
    E0601 => "weights do not match the model",
    E0602 => "cannot read a weights or artifact file",
    E0603 => "the module cannot run",
    E0604 => "not enough memory to run the model",
    E0605 => "too many threads",
    E0606 => "tensor too large",
    E0607 => "output directory is in use by another build",
    E0608 => "internal compiler error",
    E0609 => "invalid command-line arguments",
    E0610 => "no such target",
    E0611 => "no entry model",
    E0612 => "language server connection failed",
    E0613 => "no such precision policy",
    E0614 => "a value is not finite",
    E0620 => "malformed kernel table",
    E0621 => "invalid kernel table entry",
    E0622 => "unusable tuning knowledge base",
    E0623 => "tuning budget out of range",
    E0630 => "training data does not fit the train",
    E0631 => "invalid checkpoint",
    E0650 => "a train cannot run in training mode",
    E0651 => "the train's batch does not split into its micro-batches",
    E0710 => "input dtype that generated bindings cannot take",
    E0700 => "cannot format a file in place",
    E0720 => "training step does not fit the memory budget",
    E0800 => "op has no gradient rule",
    E0801 => "parameter does not reach the loss",
    E0802 => "parameter reaches the loss only through non-differentiable ops",
    E0803 => "loss is not a float scalar",
    E0900 => "training step does not fit device memory",
    E0901 => "mesh does not match the parallel degrees",
    E0902 => "batch does not split into the model's micro-batches",
    E0903 => "no parallel strategy for this device count",
    E0904 => "interleaved pipeline chunks do not divide the layers",
    E0905 => "interleaved pipeline micro-batches are not whole rounds of the stages",
    E0960 => "op the JAX export does not cover",
    E0970 => "rank count differs from the plan's device count",
    E0971 => "loss does not combine over data-parallel replicas",
    E0972 => "parallel layout the executor cannot run yet",
    E0973 => "a rank stopped: a collective could not complete",
    E0974 => "inputs do not split among the data-parallel replicas",
    E0975 => "output cannot be gathered from the data-parallel replicas",
    E0961 => "train setting the JAX export cannot mirror",
    W0002 => "precision setting has no effect",
    W0003 => "outputs hold NaN or infinite values",
    W0004 => "module built for another target runs on this CPU",
    W0005 => "parameter or buffer never used",
    W0006 => "input never used",
    W0007 => "local name never used",
    W0008 => "constant never used",
    W0009 => "dim never used",
    W0010 => "import never used",
    W0011 => "result of an instance dropped",
    W0012 => "block argument never used",
    W0013 => "nothing to tune",
    W0014 => "no_decay pattern matches no parameter",
    W0015 => "the batch dim set with --dim makes an update take another batch than the train's",
    W0040 => "implicit redistribution of more than the threshold (1 GiB by default) per step",
    W0041 => "a shard rule's dim does not divide, so the tensor stays whole",
    W0042 => "redistribution threshold in a mode that never redistributes",
    W0050 => "pipeline stages not mirrored by the JAX export",
}

/// What an error with a code says about the run, and so the exit status of `mslc` (README,
/// "Exit status"): tools tell a mistake in the command line from one in the files it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ExitClass {
    /// A warning: the command still succeeds (exit 0).
    Warning,
    /// An error in the user's program or in the files and inputs it reads (exit 1).
    Input,
    /// A misuse of the command line: a bad flag or flag value, or a target, entry model or
    /// `--set`/`--dim` name that does not exist (exit 2).
    Usage,
    /// A bug in mslc (exit 3).
    Internal,
}

impl ExitClass {
    /// The process exit status for this class.
    pub fn status(self) -> u8 {
        match self {
            ExitClass::Warning => 0,
            ExitClass::Input => 1,
            ExitClass::Usage => 2,
            ExitClass::Internal => 3,
        }
    }
}

impl Code {
    /// The class of this code: every code has exactly one, whatever reports it.
    pub fn exit_class(self) -> ExitClass {
        match self {
            Code::E0401
            | Code::E0402
            | Code::E0605
            | Code::E0609
            | Code::E0610
            | Code::E0611
            | Code::E0613
            | Code::E0623
            | Code::E0970 => ExitClass::Usage,
            Code::E0608 => ExitClass::Internal,
            c if c.as_str().starts_with('W') => ExitClass::Warning,
            _ => ExitClass::Input,
        }
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Code {
    /// Whether the code reports unused code (W0005–W0012), which an editor may grey out and
    /// `@allow(unused)` silences.
    pub fn is_unused_lint(self) -> bool {
        matches!(
            self,
            Code::W0005
                | Code::W0006
                | Code::W0007
                | Code::W0008
                | Code::W0009
                | Code::W0010
                | Code::W0011
                | Code::W0012
        )
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

    #[test]
    fn the_codes_readme_lists_every_code_with_its_title() {
        let readme = include_str!("../../../../docs/codes/README.md");
        for code in Code::ALL {
            let row = format!("| [{code}]({code}.md) | {} |", code.title());
            assert!(readme.contains(&row), "docs/codes/README.md lacks `{row}`");
        }
        let rows = readme.lines().filter(|l| l.starts_with("| [")).count();
        assert_eq!(
            rows,
            Code::ALL.len(),
            "docs/codes/README.md lists unregistered codes"
        );
    }
}
