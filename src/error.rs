//! The domain's error: what the task, biz type and user operations can refuse. Each outer
//! boundary (API, command line) maps it to its own form.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A field failed validation; the message names the field. API: 422.
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    /// API: 404.
    #[error("{0}")]
    NotFound(String),
    /// The thing exists but belongs to another biz type than the caller's. API: 403.
    #[error("{0}")]
    Forbidden(String),
    /// Larger than the configured limit. API: 413.
    #[error("{0}")]
    TooLarge(String),
    /// The request contradicts the current state (wrong task status, key taken). API: 409.
    #[error("{0}")]
    Conflict(String),
    /// A pull consumer's receipt no longer holds the task: its reservation ended (time to
    /// run passed, or settled already) or the receipt is another task's. API: 409.
    #[error("{0}")]
    StaleReceipt(String),
    /// A stored signing secret this process cannot open (no key, or not its key). API: 500.
    #[error(transparent)]
    Secret(#[from] crate::biz_types::SecretError),
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
}

impl Error {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Invalid { field: field.into(), message: message.into() }
    }
}
