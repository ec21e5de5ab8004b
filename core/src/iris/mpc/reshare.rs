//! Resharing 3-of-3 additive shares into replicated (ABY3) shares: [BGK+24] §4.3.2 last step
//! ("re-randomise the additive shares with a zero sharing and reshare") and [TACEO24] §3.2 (ABY3
//! resharing: an additive share z_i becomes the replicated share (z_i, z_{i−1}) when party i
//! sends z_i to party i + 1).
//!
//! **Share layout.** Input at party i: a vector of additive shares x_i\[e\] over Z_2^16 or
//! Z_2^32 (x = x_0 + x_1 + x_2, e.g. the dot products of [`crate::iris::dot`]). Output: a
//! vector of [`ReplicatedShare`] with `a = z_i[e]`, `b = z_{i−1}[e]`, the convention of
//! [`crate::iris::sharing::replicated`], where z_i = x_i + r_i and (r_0, r_1, r_2) is a fresh sharing of zero
//! from the pairwise PRFs ([`crate::crypto::seal::zero_share_u16`] / [`crate::crypto::seal::zero_share_u32`]),
//! so z_0 + z_1 + z_2 = x.
//!
//! **Rounds: one.** Each party sends one message to the next party (P0 → P1 → P2 → P0) and
//! receives one from the previous party. Without the re-randomisation, P_{i+1} would learn
//! x_i, which (for dot products) depends on P_i's query share; with it, z_i is x_i plus a
//! pseudo-random value derived from the key P_i shares with P_{i−1}, which P_{i+1} does not
//! know, so the message is uniformly masked.
//!
//! **Wire format** of the payload: the n values z_i\[0..n\], each little-endian in 2 bytes
//! (Z_2^16) or 4 bytes (Z_2^32), concatenated; no header (the channel of
//! [`crate::crypto::seal::Channel`] authenticates session, round and sender; the expected length is
//! known to the receiver).
//!
//! **Context.** The zero sharing's PRF context must be unique per use, e.g.
//! [`reshare_context`]`(session, round, purpose)`; reusing a context with different inputs
//! would reuse the mask and leak the difference of the inputs.

use std::fmt;

use crate::algebra::ring::{RingElement, Z16, Z32};
use crate::crypto::seal::{zero_share_u16, zero_share_u32, PairwisePrf};
use crate::iris::sharing::replicated::ReplicatedShare;
use crate::party::PartyIndex;

/// Why a resharing message was refused. Messages carry shapes only, never values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReshareError {
    /// The message came from another party than the previous one in the ring.
    #[error("reshare at {me}: expected the message from {expected}, got one from {got}")]
    WrongSender {
        /// The receiving party.
        me: PartyIndex,
        /// The party whose message is expected (the previous one).
        expected: PartyIndex,
        /// The party the message claims to come from.
        got: PartyIndex,
    },
    /// The payload does not hold exactly the expected number of values.
    #[error("reshare at {me}: expected a payload of {expected} bytes, got {got}")]
    WrongLength {
        /// The receiving party.
        me: PartyIndex,
        /// Expected payload length in bytes.
        expected: usize,
        /// Received payload length in bytes.
        got: usize,
    },
}

/// A ring Z_2^16 or Z_2^32 that can be reshared ([TACEO24] §3.2): it has a PRF zero sharing and a fixed-width
/// little-endian wire encoding.
pub trait ReshareRing: RingElement {
    /// Bytes per value on the wire (BITS / 8).
    const WIRE_BYTES: usize;

    /// This party's share of a fresh 3-party zero sharing of `n` values ([TACEO24] §3.2):
    /// r_i = F(k_{i,i+1}) − F(k_{i−1,i}) for the given PRF `context`.
    fn zero_share(
        with_next: &PairwisePrf,
        with_prev: &PairwisePrf,
        context: &[u8],
        n: usize,
    ) -> Vec<Self>;
}

impl ReshareRing for Z16 {
    const WIRE_BYTES: usize = 2;

    fn zero_share(
        with_next: &PairwisePrf,
        with_prev: &PairwisePrf,
        context: &[u8],
        n: usize,
    ) -> Vec<Self> {
        let mut out = vec![0u16; n];
        zero_share_u16(with_next, with_prev, context, &mut out);
        out.into_iter().map(std::num::Wrapping).collect()
    }
}

impl ReshareRing for Z32 {
    const WIRE_BYTES: usize = 4;

    fn zero_share(
        with_next: &PairwisePrf,
        with_prev: &PairwisePrf,
        context: &[u8],
        n: usize,
    ) -> Vec<Self> {
        let mut out = vec![0u32; n];
        zero_share_u32(with_next, with_prev, context, &mut out);
        out.into_iter().map(std::num::Wrapping).collect()
    }
}

/// The PRF context for one resharing's zero sharing ([TACEO24] §3.2): `len(session) as u32 LE ‖ session ‖ round as u32 LE ‖
/// purpose` (the length prefix keeps the encoding unambiguous).
pub fn reshare_context(session: &[u8], round: u32, purpose: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + session.len() + purpose.len());
    out.extend_from_slice(&(session.len() as u32).to_le_bytes());
    out.extend_from_slice(session);
    out.extend_from_slice(&round.to_le_bytes());
    out.extend_from_slice(purpose.as_bytes());
    out
}

/// Encodes reshare values ([TACEO24] §3.2 message) little-endian, `T::WIRE_BYTES` each (module docs).
pub fn encode_values<T: ReshareRing>(values: &[T]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * T::WIRE_BYTES);
    for v in values {
        out.extend_from_slice(&v.to_u64().to_le_bytes()[..T::WIRE_BYTES]);
    }
    out
}

/// Decodes reshare values ([TACEO24] §3.2 message): little-endian values of `T::WIRE_BYTES` each; `None` when the length is not a
/// multiple of the width.
pub fn decode_values<T: ReshareRing>(bytes: &[u8]) -> Option<Vec<T>> {
    if !bytes.len().is_multiple_of(T::WIRE_BYTES) {
        return None;
    }
    Some(
        bytes
            .chunks_exact(T::WIRE_BYTES)
            .map(|c| {
                let v = c
                    .iter()
                    .rev()
                    .fold(0u64, |acc, &b| (acc << 8) | u64::from(b));
                T::from_u64(v)
            })
            .collect(),
    )
}

/// A message to hand to another party through the sealed party-to-party channel (the one
/// message of the [TACEO24] §3.2 resharing round).
#[derive(Clone, PartialEq, Eq)]
pub struct OutgoingMessage {
    /// The recipient.
    pub to: PartyIndex,
    /// The payload bytes (module docs for the format).
    pub payload: Vec<u8>,
}

impl fmt::Debug for OutgoingMessage {
    /// Prints the recipient and payload length, not the payload.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutgoingMessage")
            .field("to", &self.to)
            .field("payload_len", &self.payload.len())
            .finish()
    }
}

/// Party i's state between sending z_i and receiving z_{i−1} ([TACEO24] §3.2 resharing).
#[derive(Clone)]
pub struct ReshareState<T> {
    party: PartyIndex,
    mine: Vec<T>,
}

impl<T> fmt::Debug for ReshareState<T> {
    /// Prints the party and the number of values, not the values.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReshareState")
            .field("party", &self.party)
            .field("len", &self.mine.len())
            .finish()
    }
}

impl<T: ReshareRing> ReshareState<T> {
    /// Starts the resharing at `party`: re-randomises `my_additive` (x_i) with this party's
    /// zero share r_i for `context` (z_i = x_i + r_i) and returns the state plus the message
    /// carrying z_i to the next party. `with_next` is the PRF shared with party i+1,
    /// `with_prev` the one shared with party i−1.
    pub fn start(
        party: PartyIndex,
        my_additive: Vec<T>,
        with_next: &PairwisePrf,
        with_prev: &PairwisePrf,
        context: &[u8],
    ) -> (Self, OutgoingMessage) {
        let zero = T::zero_share(with_next, with_prev, context, my_additive.len());
        let mine: Vec<T> = my_additive
            .into_iter()
            .zip(zero)
            .map(|(x, r)| x + r)
            .collect();
        let payload = encode_values(&mine);
        (
            Self { party, mine },
            OutgoingMessage {
                to: party.next(),
                payload,
            },
        )
    }

    /// The party this state belongs to.
    pub fn party(&self) -> PartyIndex {
        self.party
    }

    /// The payload length this party expects from the previous party.
    pub fn expected_payload_len(&self) -> usize {
        self.mine.len() * T::WIRE_BYTES
    }

    /// Finishes the resharing with the previous party's message (z_{i−1}): returns the
    /// replicated shares (a = z_i, b = z_{i−1}) per value. Refuses a message from any party
    /// other than i−1 or of the wrong length.
    pub fn receive(
        self,
        from: PartyIndex,
        payload: &[u8],
    ) -> Result<Vec<ReplicatedShare<T>>, ReshareError> {
        let expected_from = self.party.prev();
        if from != expected_from {
            return Err(ReshareError::WrongSender {
                me: self.party,
                expected: expected_from,
                got: from,
            });
        }
        let expected = self.expected_payload_len();
        let wrong_length = ReshareError::WrongLength {
            me: self.party,
            expected,
            got: payload.len(),
        };
        if payload.len() != expected {
            return Err(wrong_length);
        }
        let theirs: Vec<T> = decode_values(payload).ok_or(wrong_length)?;
        Ok(self
            .mine
            .into_iter()
            .zip(theirs)
            .map(|(a, b)| ReplicatedShare { a, b })
            .collect())
    }
}

/// In-process runs of the resharing for tests, here and in the modules built on it.
#[cfg(test)]
pub(crate) mod test_support {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha20Rng;

    const P: [PartyIndex; 3] = PartyIndex::ALL;

    /// PRFs (with_next, with_prev) of each party, from three pairwise seeds derived from `seed`.
    pub(crate) fn prfs(seed: u64) -> [(PairwisePrf, PairwisePrf); 3] {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let k: [PairwisePrf; 3] = std::array::from_fn(|_| {
            let mut s = [0u8; 32];
            rng.fill(&mut s);
            PairwisePrf::from_seed(s)
        });
        // k[0] = k_{0,1}, k[1] = k_{1,2}, k[2] = k_{2,0}.
        [
            (k[0].clone(), k[2].clone()),
            (k[1].clone(), k[0].clone()),
            (k[2].clone(), k[1].clone()),
        ]
    }

    /// Runs the protocol in process; returns the messages sent and each party's output.
    pub(crate) fn run<T: ReshareRing>(
        inputs: &[Vec<T>; 3],
        seed: u64,
        context: &[u8],
    ) -> (Vec<OutgoingMessage>, Vec<Vec<ReplicatedShare<T>>>) {
        let prfs = prfs(seed);
        let mut states = Vec::new();
        let mut msgs = Vec::new();
        for p in P {
            let (n, pr) = &prfs[p.as_usize()];
            let (s, m) = ReshareState::start(p, inputs[p.as_usize()].clone(), n, pr, context);
            assert_eq!(m.to, p.next());
            states.push(s);
            msgs.push(m);
        }
        let mut outputs = Vec::new();
        for (p, s) in P.into_iter().zip(states) {
            let from = p.prev();
            let out = s
                .receive(from, &msgs[from.as_usize()].payload)
                .expect("valid message");
            outputs.push(out);
        }
        (msgs, outputs)
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::{prfs, run};
    use super::*;
    use crate::iris::sharing::replicated::reconstruct;
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha20Rng;
    use std::num::Wrapping;

    const P: [PartyIndex; 3] = PartyIndex::ALL;

    fn check_reconstruction<T: ReshareRing>(
        inputs: &[Vec<T>; 3],
        outputs: &[Vec<ReplicatedShare<T>>],
    ) {
        for e in 0..inputs[0].len() {
            let shares = [outputs[0][e], outputs[1][e], outputs[2][e]];
            let sum = inputs[0][e] + inputs[1][e] + inputs[2][e];
            assert_eq!(reconstruct(&shares), Ok(sum), "value {e}");
        }
    }

    proptest! {
        #[test]
        fn reconstructs_the_sum_z16(seed: u64, n in 0usize..40) {
            let mut rng = ChaCha20Rng::seed_from_u64(seed ^ 1);
            let inputs: [Vec<Z16>; 3] = std::array::from_fn(|_| (0..n).map(|_| Wrapping(rng.gen())).collect());
            let (msgs, outputs) = run(&inputs, seed, b"ctx16");
            prop_assert!(msgs.iter().all(|m| m.payload.len() == 2 * n));
            check_reconstruction(&inputs, &outputs);
        }

        #[test]
        fn reconstructs_the_sum_z32(seed: u64, n in 0usize..40) {
            let mut rng = ChaCha20Rng::seed_from_u64(seed ^ 2);
            let inputs: [Vec<Z32>; 3] = std::array::from_fn(|_| (0..n).map(|_| Wrapping(rng.gen())).collect());
            let (msgs, outputs) = run(&inputs, seed, b"ctx32");
            prop_assert!(msgs.iter().all(|m| m.payload.len() == 4 * n));
            check_reconstruction(&inputs, &outputs);
        }

        #[test]
        fn wire_round_trip(values in proptest::collection::vec(any::<u32>(), 0..30)) {
            let v32: Vec<Z32> = values.iter().map(|&x| Wrapping(x)).collect();
            prop_assert_eq!(decode_values::<Z32>(&encode_values(&v32)), Some(v32));
            let v16: Vec<Z16> = values.iter().map(|&x| Wrapping(x as u16)).collect();
            prop_assert_eq!(decode_values::<Z16>(&encode_values(&v16)), Some(v16));
        }
    }

    #[test]
    fn wire_format_is_little_endian() {
        assert_eq!(
            encode_values(&[Wrapping(0x1234u16), Wrapping(0xABCD)]),
            vec![0x34, 0x12, 0xCD, 0xAB]
        );
        assert_eq!(encode_values(&[Wrapping(0x0102_0304u32)]), vec![4, 3, 2, 1]);
        assert_eq!(decode_values::<Z32>(&[1, 2, 3]), None);
        assert_eq!(
            reshare_context(b"sid", 7, "dot"),
            [&[3, 0, 0, 0][..], b"sid", &[7, 0, 0, 0], b"dot"].concat()
        );
    }

    #[test]
    fn payload_is_masked() {
        let mut rng = ChaCha20Rng::seed_from_u64(5);
        let inputs: [Vec<Z16>; 3] =
            std::array::from_fn(|_| (0..64).map(|_| Wrapping(rng.gen())).collect());
        let (msgs_a, _) = run(&inputs, 100, b"ctx");
        let (msgs_b, out_b) = run(&inputs, 101, b"ctx");
        let (msgs_c, _) = run(&inputs, 100, b"other ctx");
        check_reconstruction(&inputs, &out_b);
        let prfs = prfs(100);
        for p in P {
            let i = p.as_usize();
            let raw = encode_values(&inputs[i]);
            // The payload is not the raw additive share ...
            assert_ne!(msgs_a[i].payload, raw);
            // ... different seeds or contexts give different payloads for the same input ...
            assert_ne!(msgs_a[i].payload, msgs_b[i].payload);
            assert_ne!(msgs_a[i].payload, msgs_c[i].payload);
            // ... and it is exactly the raw share plus the zero share: removing the mask
            // would reveal the input, which is why the mask must be there.
            let zero = Z16::zero_share(&prfs[i].0, &prfs[i].1, b"ctx", 64);
            let sent: Vec<Z16> = decode_values(&msgs_a[i].payload).expect("whole values");
            let unmasked: Vec<Z16> = sent.iter().zip(&zero).map(|(z, r)| *z - *r).collect();
            assert_eq!(unmasked, inputs[i]);
        }
    }

    #[test]
    fn payload_of_a_constant_input_looks_uniform() {
        // Same session keys, secret input all zeros vs all 0xFFFF: both payloads have
        // uniform-looking nibbles (4,096 values → 256 expected per bucket).
        for constant in [0u16, 0xFFFF] {
            let inputs: [Vec<Z16>; 3] = std::array::from_fn(|_| vec![Wrapping(constant); 4096]);
            let (msgs, _) = run(&inputs, 7, b"uniform");
            for m in &msgs {
                let values: Vec<Z16> = decode_values(&m.payload).expect("whole values");
                let mut low = [0u32; 16];
                let mut high = [0u32; 16];
                for v in values {
                    low[usize::from(v.0 & 15)] += 1;
                    high[usize::from(v.0 >> 12)] += 1;
                }
                for c in low.iter().chain(high.iter()) {
                    assert!(
                        (170..350).contains(c),
                        "bucket {c} for constant {constant:#x}"
                    );
                }
            }
        }
    }

    #[test]
    fn rejects_wrong_sender_and_length() {
        let prfs = prfs(9);
        let input: Vec<Z32> = vec![Wrapping(1), Wrapping(2), Wrapping(3)];
        let (state, msg) = ReshareState::start(P[1], input, &prfs[1].0, &prfs[1].1, b"ctx");
        assert_eq!(msg.to, P[2]);
        assert_eq!(state.party(), P[1]);
        assert_eq!(state.expected_payload_len(), 12);
        assert_eq!(
            state.clone().receive(P[2], &[0; 12]),
            Err(ReshareError::WrongSender {
                me: P[1],
                expected: P[0],
                got: P[2]
            })
        );
        assert_eq!(
            state.clone().receive(P[1], &[0; 12]),
            Err(ReshareError::WrongSender {
                me: P[1],
                expected: P[0],
                got: P[1]
            })
        );
        let err = state.clone().receive(P[0], &[0; 11]).expect_err("short");
        assert_eq!(
            err,
            ReshareError::WrongLength {
                me: P[1],
                expected: 12,
                got: 11
            }
        );
        assert_eq!(
            err.to_string(),
            "reshare at P1: expected a payload of 12 bytes, got 11"
        );
        assert!(state.clone().receive(P[0], &[0; 16]).is_err());
        assert_eq!(state.receive(P[0], &[0; 12]).map(|v| v.len()), Ok(3));
        let text = format!("{msg:?}");
        assert_eq!(
            text,
            "OutgoingMessage { to: PartyIndex(2), payload_len: 12 }"
        );
    }
}
