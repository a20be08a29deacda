//! rdmapool's errors as Python exceptions. The classes live in `rdmapool/errors.py` (plain
//! Python, so one class can be both an `RdmapoolError` and a `ValueError`); this file picks
//! the class for each [`rdmapool::Error`] and raises it with the error's own message.

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use rdmapool::{CoreError, Error};

/// The name, in `rdmapool.errors`, of the class that reports `e`.
pub fn class_of(e: &Error) -> &'static str {
    match e {
        Error::NodeDown { .. } | Error::LeaseLapsed { .. } | Error::MemberUnreached { .. } => {
            "NodeDown"
        }
        Error::NoServer { .. } => "NoServer",
        Error::Damaged { .. } => "Damaged",
        Error::NotEnoughReplicas { .. } => "NotEnoughReplicas",
        Error::Unauthenticated { .. } | Error::NoCredentials { .. } => "Unauthenticated",
        Error::RemoteExhausted { .. }
        | Error::IndexFull { .. }
        | Error::LeasesFull { .. }
        | Error::Draining { .. }
        | Error::PoolExhausted { .. } => "OutOfMemory",
        Error::Contended { .. } => "Contended",
        Error::StalePointer { .. } | Error::NotAllocated(_) => "StalePointer",
        Error::TimedOut(_) => "TimedOut",
        Error::ClientIdInUse { .. } => "ClientIdInUse",
        Error::OutOfBounds { .. } | Error::ReservedKey => "OutOfLimits",
        Error::Core(core) => match core {
            CoreError::OutOfLimits { .. }
            | CoreError::OutOfRange { .. }
            | CoreError::BadSetting { .. }
            | CoreError::Misaligned { .. }
            | CoreError::BadKey { .. } => "OutOfLimits",
            CoreError::ProviderUnavailable { .. } | CoreError::NoSuchDevice { .. } => {
                "ProviderUnavailable"
            }
            CoreError::Connection { .. } | CoreError::Rejected { .. } => "ConnectionFailed",
            CoreError::Unprotected { .. } => "Unauthenticated",
            CoreError::MemlockLimit { .. } => "MemlockLimit",
            _ => "RdmapoolError",
        },
        _ => "RdmapoolError",
    }
}

/// `e` as an exception of its class in `rdmapool.errors`.
pub fn to_py(py: Python<'_>, e: Error) -> PyErr {
    raise(py, class_of(&e), e.to_string())
}

/// An exception of class `name` of `rdmapool.errors` with message `msg` (a `RuntimeError`
/// if that module cannot be imported, which only a broken install causes).
pub fn raise(py: Python<'_>, name: &str, msg: String) -> PyErr {
    let made = py
        .import("rdmapool.errors")
        .and_then(|m| m.getattr(name))
        .and_then(|class| class.call1((msg.clone(),)));
    match made {
        Ok(exc) => PyErr::from_value(exc),
        Err(_) => PyRuntimeError::new_err(format!("{name}: {msg}")),
    }
}

/// A `ValueError`-derived `OutOfLimits` for the caller's bad argument.
pub fn bad_arg(py: Python<'_>, msg: impl Into<String>) -> PyErr {
    let msg = msg.into();
    match py.import("rdmapool.errors") {
        Ok(_) => raise(py, "OutOfLimits", msg),
        Err(_) => PyValueError::new_err(msg),
    }
}

/// Results of a call: `Ok`, or the error raised in Python.
pub trait IntoPyResult<T> {
    /// The error as its Python exception.
    fn py(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for rdmapool::Result<T> {
    fn py(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| to_py(py, e))
    }
}

impl<T> IntoPyResult<T> for std::result::Result<T, rdmapool::CoreError> {
    fn py(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| to_py(py, rdmapool::Error::Core(e)))
    }
}
