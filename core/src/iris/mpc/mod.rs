//! Multi-party computation sub-protocols of the iris matcher ([BGK+24], deployed variant; seed
//! 002 for the ABY3 building blocks), each a message-driven state machine: a party feeds it
//! the messages it received and gets back the messages to send, until it yields its output.
//! Nothing here does I/O; the extension and the coordinator move the bytes.

pub mod binary;
pub mod compare;
pub mod lift;
pub mod or_tree;
pub mod reshare;
