//! Source text → typed AST (with spans). Nothing outside this module sees pest.

pub mod ast;
mod lexical;
mod parser;
pub mod print;

pub use parser::parse;
