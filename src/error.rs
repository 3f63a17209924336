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
    /// The request contradicts the current state; the kind says how (docs/design/contract.md, Tasks by key). API: 409,
    /// with the kind as its code.
    #[error("{1}")]
    Conflict(Conflict, String),
    /// A pull consumer's receipt no longer holds the task: its reservation ended (time to
    /// run passed, or settled already) or the receipt is another task's. API: 409.
    #[error("{0}")]
    StaleReceipt(String),
    /// A stored signing secret this process cannot open (no key, or not its key). API: 500.
    #[error(transparent)]
    Secret(#[from] SecretError),
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
}

impl Error {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Invalid { field: field.into(), message: message.into() }
    }

    /// A key or name already held by another request or object.
    pub fn key_conflict(message: impl Into<String>) -> Self {
        Error::Conflict(Conflict::KeyConflict, message.into())
    }

    /// The operation needs the task (or biz type, or user) in another state.
    pub fn invalid_state(message: impl Into<String>) -> Self {
        Error::Conflict(Conflict::InvalidState, message.into())
    }
}

/// Which conflict a 409 is: clients branch on it (the API's `error.code`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conflict {
    /// The key (or name) is held by a different request: a task key created with another
    /// body, a timer key, a biz type or user name already taken.
    KeyConflict,
    /// A create with `on_conflict: "replace"` met the key's task while it is running.
    TaskRunning,
    /// The operation needs another state: cancelling or rescheduling a task that is not
    /// pending, replaying one that is not finished, changing an archived biz type.
    InvalidState,
}

impl Conflict {
    pub const fn code(self) -> &'static str {
        match self {
            Conflict::KeyConflict => "key_conflict",
            Conflict::TaskRunning => "task_running",
            Conflict::InvalidState => "invalid_state",
        }
    }
}

/// Why a stored signing secret cannot be used (`biz_types::secrets` opens them). Each
/// message names the biz type and says what to do.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SecretError {
    #[error(
        "the signing secret of biz type `{biz_type}` is encrypted (key {key_id}) and CHIME_SECRET_KEY is not set: \
         set CHIME_SECRET_KEY (or CHIME_SECRET_KEY_FILE) to the key it was encrypted with"
    )]
    NoKey { biz_type: String, key_id: String },
    #[error(
        "the signing secret of biz type `{biz_type}` is encrypted with key {key_id}, but CHIME_SECRET_KEY is key {current} \
         and CHIME_SECRET_KEY_OLD does not hold it: give this node the key it was encrypted with"
    )]
    UnknownKey { biz_type: String, key_id: String, current: String },
    #[error(
        "the signing secret of biz type `{biz_type}` does not decrypt with key {key_id}: it was altered in the database \
         or copied from another biz type; rotate the biz type's secret"
    )]
    Corrupt { biz_type: String, key_id: String },
    #[error("biz type `{biz_type}` has no signing secret stored; rotate its secret")]
    Missing { biz_type: String },
    #[error(
        "the signing secret of biz type `{biz_type}` is not in the form `whsec_<base64>` that its signing scheme, \
         standard-webhooks, signs with; rotate the biz type's secret"
    )]
    NotWhsec { biz_type: String },
}
