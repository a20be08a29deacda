//! The tool's error type: what every command returns, and how `main` turns it into an exit
//! status (2 for usage errors, 1 otherwise).

/// The tool's error: a library error or a message.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// From rdmapool.
    #[error(transparent)]
    Rdma(#[from] rdmapool::Error),
    /// I/O with a child process or a reference peer.
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    /// Anything else, said plainly.
    #[error("{0}")]
    Msg(String),
    /// A command-line argument that cannot be used, found after clap's parsing (exit
    /// code 2, like clap's own usage errors).
    #[error("{0}")]
    Usage(String),
}

impl From<rdmapool::CoreError> for ToolError {
    fn from(e: rdmapool::CoreError) -> Self {
        ToolError::Rdma(e.into())
    }
}

impl From<rdmapool::fabric::SoftError> for ToolError {
    fn from(e: rdmapool::fabric::SoftError) -> Self {
        ToolError::Rdma(e.into())
    }
}

impl From<rdmapool::fabric::VerbsError> for ToolError {
    fn from(e: rdmapool::fabric::VerbsError) -> Self {
        ToolError::Rdma(e.into())
    }
}

/// Result with [`ToolError`].
pub type Result<T> = std::result::Result<T, ToolError>;
