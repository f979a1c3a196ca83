//! Source text → typed AST (with spans). Nothing outside this module sees pest.

pub mod ast;
pub mod format;
mod lexical;
mod parser;
pub mod print;
mod recovery;
pub mod trivia;

pub use parser::parse;
