//! # privmatch-core
//!
//! The pure-Rust heart of privmatch. Nothing here touches Postgres, the network or the file
//! system: every protocol is a function or a message-driven state machine that callers (the
//! extension, the coordinator, the CLI) feed with bytes.
//!
//! Shared layers, bottom up (each imports only the layers above it in this list):
//!
//! | module | owns |
//! |---|---|
//! | [`party`] | the three party indices |
//! | [`algebra`] | wrapping rings Z_2^k, the Galois ring GR(2^16, 4) |
//! | [`embedding`] | float embeddings as integers: element checks, normalisation, round(x·M), the inner product (the face modalities choose M) |
//! | [`crypto`] | sealing and pairwise channels, function secret sharing and its fixed-key AES (the PRG of the channels' pads and of Paillier's garbling too) |
//! | [`wire`] | envelopes, session ids, the share storage layout |
//! | [`twophase`] | naming and recovery rule of the parties' two-phase commit |
//!
//! Modalities, each importing shared layers only, never another modality (both rules, and
//! the absence of import circles between files, are checked by `tools/layout`):
//!
//! | module | owns |
//! |---|---|
//! | [`iris`] | 3-party iris matching: templates, shares (`iris::sharing`: Shamir over the Galois ring, replicated ABY3 sharing), enrolment bundles, probes, scan, the 3-party sub-protocols (`iris::mpc`: reshare, binary circuits, lift, compare, OR tree), matcher, search service |
//! | [`face`] | Funshade face matching: quantisation, bundles, probes, key batches, evaluation steps, the evaluator's service |
//! | [`paillier`] | device-held face templates with packed Paillier (Game-Set-MATCH), with Π3's garbled circuits and OT |

//!
//! Papers are cited as `[KEY] §x` (section numbers of the version named in
//! `docs/references.md`, which lists every key with authors, title, year and identifier):
//! [BGK+24] Bloemen, Gillespie, Kales, Sippl, Walch, "Large-Scale MPC: Scaling Private Iris
//! Code Uniqueness Checks to Millions of Users", 2024, ePrint 2024/705 (arXiv:2405.04463v2);
//! [TACEO24] TACEO, "Experiments for Decentralized Iris Code Membership Protocols using MPC",
//! technical report, 2024; [MR18] Mohassel, Rindal, "ABY3", CCS 2018, ePrint 2018/403;
//! [ICO23] Ibarrondo, Chabanne, Önen, "Funshade", PETS 2023, ePrint 2022/1688; [BM25] Bódi,
//! Mayrhofer, "FunshadeRS", WPES 2025, DOI 10.1145/3733802.3764061; [BCG+21] Boyle et al.,
//! "Function Secret Sharing for Mixed-Mode and Fixed-Point Secure Computation", Eurocrypt
//! 2021, ePrint 2020/1392; [ABMR20] Agrawal, Badrinarayanan, Mukherjee, Rindal,
//! "Game-Set-MATCH", CCS 2020, ePrint 2020/1363.

pub mod algebra;
pub mod crypto;
pub mod embedding;
pub mod face;
pub mod iris;
pub mod paillier;
pub mod parallel;
pub mod party;
pub mod twophase;
pub mod wire;
