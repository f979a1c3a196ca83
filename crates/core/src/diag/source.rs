//! The source files a compilation read, so diagnostics can name and quote them.

use std::sync::Arc;

/// Index of a file in [`Sources`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId(pub u32);

/// One file's name and text.
#[derive(Clone, Debug)]
pub struct SourceFile {
    /// Path as shown to the user (`std/nn.msl` for the embedded stdlib).
    pub name: String,
    /// Full text.
    pub text: Arc<str>,
    /// Byte offset of each line's start, so finding a line is a binary search, not a scan
    /// from the top (a file with thousands of diagnostics would make that quadratic).
    line_starts: Vec<usize>,
}

/// All files of one compilation, in the order they were read.
#[derive(Clone, Debug, Default)]
pub struct Sources {
    files: Vec<SourceFile>,
}

impl Sources {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a file and returns its id.
    pub fn add(&mut self, name: impl Into<String>, text: impl Into<Arc<str>>) -> FileId {
        let id = FileId(self.files.len() as u32);
        let text: Arc<str> = text.into();
        let line_starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        self.files.push(SourceFile {
            name: name.into(),
            text,
            line_starts,
        });
        id
    }

    /// The file with this id.
    pub fn get(&self, id: FileId) -> &SourceFile {
        &self.files[id.0 as usize]
    }

    /// Number of files.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// Whether no file was read.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// Finds a file by its shown name.
    pub fn find(&self, name: &str) -> Option<FileId> {
        self.files
            .iter()
            .position(|f| f.name == name)
            .map(|i| FileId(i as u32))
    }

    /// 1-based line and column (in characters) of a byte offset.
    pub fn line_col(&self, id: FileId, offset: usize) -> (usize, usize) {
        let file = self.get(id);
        let text = &file.text;
        let offset = floor_char_boundary(text, offset.min(text.len()));
        // Lines starting at or before the offset; the first always does.
        let line = file.line_starts.partition_point(|&start| start <= offset);
        let line_start = file.line_starts[line - 1];
        (line, text[line_start..offset].chars().count() + 1)
    }
}

/// The largest char boundary at or below `offset`.
pub fn floor_char_boundary(text: &str, mut offset: usize) -> usize {
    while offset > 0 && !text.is_char_boundary(offset) {
        offset -= 1;
    }
    offset
}
