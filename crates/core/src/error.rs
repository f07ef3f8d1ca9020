//! The one error type of the runtime.
//!
//! Owns: the error kinds the stock Python frontend maps to exception classes, and the
//! rendering of an error as the text `MXGetLastError` returns. Every fallible function in the
//! crate returns [`Result`]; the C layer (`crates/c-api`) turns an `Err` into `-1` plus that text.
//!
//! The first line of the rendered text is always `ErrorType: message`. The 1.9.1 frontend
//! (`base.py`, `c2pyerror`) reads the part before the first `:` and raises the Python builtin of
//! that name for `ValueError`, `TypeError`, `AttributeError`, `IndexError` and
//! `NotImplementedError`; `InternalError` gets an extra hint; anything else becomes
//! `MXNetError`.

use std::fmt;

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The kind of an error; its name is the first word of the message the frontend sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A bad value: a bad parameter string, a bad environment value, a bad shape.
    Value,
    /// A value of the wrong type (e.g. an unknown dtype code).
    Type,
    /// An index out of range.
    Index,
    /// A feature this build does not support yet.
    NotImplemented,
    /// A failure of the runtime that is not the caller's fault (e.g. a caught panic).
    Internal,
    /// Everything else; the frontend raises `mxnet.base.MXNetError`.
    MXNet,
}

impl ErrorKind {
    /// The name the frontend keys its exception classes on.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::Value => "ValueError",
            ErrorKind::Type => "TypeError",
            ErrorKind::Index => "IndexError",
            ErrorKind::NotImplemented => "NotImplementedError",
            ErrorKind::Internal => "InternalError",
            ErrorKind::MXNet => "MXNetError",
        }
    }
}

/// An error with its kind and a message a user can act on.
///
/// Boxed: one pointer, so that `Result<(), Error>` is one register and `Result<&T, Error>`
/// two, returned without a trip through memory on the hot paths that almost never fail.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Error(Box<Inner>);

#[derive(Debug, Clone, PartialEq, Eq)]
struct Inner {
    kind: ErrorKind,
    message: String,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.0.kind.name(), self.0.message)
    }
}

impl Error {
    #[cold]
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error(Box::new(Inner { kind, message: message.into() }))
    }
    pub fn value(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Value, message)
    }
    pub fn type_error(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Type, message)
    }
    pub fn index(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Index, message)
    }
    /// `NotImplementedError: <what> is not supported yet`.
    pub fn not_supported(what: impl fmt::Display) -> Self {
        Self::new(ErrorKind::NotImplemented, format!("{what} is not supported yet"))
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }
    pub fn mxnet(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::MXNet, message)
    }
    pub fn kind(&self) -> ErrorKind {
        self.0.kind
    }
    pub fn message(&self) -> &str {
        &self.0.message
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_line_names_the_kind() {
        assert_eq!(Error::value("bad").to_string(), "ValueError: bad");
        assert_eq!(
            Error::not_supported("sparse storage").to_string(),
            "NotImplementedError: sparse storage is not supported yet"
        );
        assert_eq!(Error::mxnet("x").to_string(), "MXNetError: x");
        assert_eq!(Error::internal("p").kind(), ErrorKind::Internal);
    }

    #[test]
    fn results_stay_small() {
        assert_eq!(std::mem::size_of::<Result<()>>(), std::mem::size_of::<usize>());
        assert_eq!(std::mem::size_of::<Result<&u8>>(), 2 * std::mem::size_of::<usize>());
    }
}
