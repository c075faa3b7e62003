//! The number that names a server, below every other module: the errors and the configuration
//! both speak of servers, so the name lives under both (re-exported as
//! [`crate::configuration::ServerId`], its public path).

/// A server's number: its position in the cluster file.
pub type ServerId = u16;
