//! Lambda runtime names and the engine runtimes that serve them: the vocabulary the
//! node's core (building a revision's snapshot) and its HTTP layer (validating
//! CreateFunction) share, below both.

/// Runtimes accepted by CreateFunction, as Lambda names them.
pub const RUNTIMES: &[&str] = &["python3.11", "python3.12", "nodejs20.x", "java17", "provided.al2023", "provided.al2"];

/// The engine runtime serving a Lambda runtime name (the Python versions share the
/// host's python3).
pub fn engine_runtime(name: &str) -> Option<thaw_runtime::Runtime> {
    match name {
        "python3.11" | "python3.12" => Some(thaw_runtime::Runtime::Python3),
        "nodejs20.x" => Some(thaw_runtime::Runtime::Nodejs20),
        "java17" => Some(thaw_runtime::Runtime::Java17),
        "provided.al2023" | "provided.al2" => Some(thaw_runtime::Runtime::Provided),
        _ => None,
    }
}
