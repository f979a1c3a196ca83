//! Running the compiler on a thread with a deep stack: user sources with deep (but bounded)
//! nesting are checked recursively, so every front end gives the checker room instead of
//! trusting the platform's default stack.

/// Stack for the compiler thread.
pub const STACK_BYTES: usize = 256 * 1024 * 1024;

/// Why [`on_compiler_stack`] returned no value.
#[derive(Debug)]
pub enum StackError {
    /// The thread could not be started.
    Spawn(std::io::Error),
    /// The work panicked (with this message): a bug in mslc, not in the input.
    Panicked(String),
}

impl std::fmt::Display for StackError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StackError::Spawn(e) => write!(f, "cannot start the compiler thread: {e}"),
            StackError::Panicked(what) => write!(
                f,
                "internal compiler error (a bug in mslc, not in your input): {what}; please report it"
            ),
        }
    }
}

/// Runs `work` on a thread with a [`STACK_BYTES`] stack and returns its value.
pub fn on_compiler_stack<T: Send>(work: impl FnOnce() -> T + Send) -> Result<T, StackError> {
    std::thread::scope(|scope| {
        let handle = std::thread::Builder::new()
            .stack_size(STACK_BYTES)
            .spawn_scoped(scope, work)
            .map_err(StackError::Spawn)?;
        handle.join().map_err(|payload| {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            StackError::Panicked(what)
        })
    })
}
