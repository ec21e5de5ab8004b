//! The party engine (design brief §3): a background worker owning the in-memory iris share
//! matrix and the running searches ([`worker`]), the local socket protocol to it ([`ipc`]),
//! the backend side of that socket ([`client`]) and the SQL functions the coordinator calls
//! for the rounds of a search ([`sql`]).

pub mod client;
pub mod ipc;
pub mod sql;
pub mod worker;
