//! The privmatch coordinator service and command-line client, as a library: the `privmatch`
//! binary (`main.rs`) is a thin argument parser over these modules, and the end-to-end tests
//! reuse the configuration and synthesis code from here.

pub mod api;
pub mod bench;
pub mod bench_face;
pub mod bench_iris;
pub mod client;
pub mod cluster;
pub mod config;
pub mod face_admin;
pub mod face_api;
pub mod face_client;
pub mod face_input;
pub mod face_server;
pub mod face_session;
pub mod face_synth;
pub mod guard;
pub mod input;
pub mod parties;
pub mod search;
pub mod search_client;
pub mod server;
pub mod synth;
pub mod twophase;
