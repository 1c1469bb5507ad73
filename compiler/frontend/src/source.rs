//! Source files and spans: the `SourceMap` owns every text the compiler reads
//! (Linnet modules, `nest.toml`, `bindings.json`), and a `Span` names a byte
//! range in one of them. Line and column numbers are computed here, once.

use std::ops::Range;
use std::path::{Path, PathBuf};

/// A file registered in a [`SourceMap`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId(pub u32);

/// A byte range in one file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Span {
    pub file: FileId,
    pub start: u32,
    pub end: u32,
}

impl Span {
    pub fn new(file: FileId, range: Range<usize>) -> Span {
        Span { file, start: range.start as u32, end: range.end as u32 }
    }

    pub fn range(self) -> Range<usize> {
        self.start as usize..self.end as usize
    }

    /// The smallest span covering both (which must be in the same file).
    pub fn to(self, other: Span) -> Span {
        Span { file: self.file, start: self.start.min(other.start), end: self.end.max(other.end) }
    }
}

/// One source text and where it came from.
pub struct SourceFile {
    pub path: PathBuf,
    pub text: String,
    line_starts: Vec<usize>,
}

impl SourceFile {
    /// The byte offset where each line of `text` starts.
    pub fn lines_of(text: &str) -> Vec<usize> {
        std::iter::once(0).chain(text.match_indices('\n').map(|(at, _)| at + 1)).collect()
    }

    /// 1-based line and column (in characters) of a byte offset.
    pub fn line_column(&self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.text.len());
        let line = match self.line_starts.binary_search(&offset) {
            Ok(exact) => exact,
            Err(next) => next - 1,
        };
        let line_start = self.line_starts[line];
        let column = self.text[line_start..offset].chars().count();
        (line + 1, column + 1)
    }
}

/// Every text read during one compilation, addressed by [`FileId`].
#[derive(Default)]
pub struct SourceMap {
    files: Vec<SourceFile>,
}

impl SourceMap {
    pub fn add(&mut self, path: impl Into<PathBuf>, text: String) -> FileId {
        let line_starts = SourceFile::lines_of(&text);
        self.files.push(SourceFile { path: path.into(), text, line_starts });
        FileId(self.files.len() as u32 - 1)
    }

    pub fn get(&self, id: FileId) -> &SourceFile {
        &self.files[id.0 as usize]
    }

    pub fn path(&self, id: FileId) -> &Path {
        &self.get(id).path
    }

    pub fn find(&self, path: &Path) -> Option<FileId> {
        self.files.iter().position(|file| file.path == path).map(|at| FileId(at as u32))
    }

    pub fn iter(&self) -> impl Iterator<Item = (FileId, &SourceFile)> {
        self.files.iter().enumerate().map(|(at, file)| (FileId(at as u32), file))
    }

    /// The text a span covers.
    pub fn snippet(&self, span: Span) -> &str {
        &self.get(span.file).text[span.range()]
    }
}
