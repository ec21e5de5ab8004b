-- privmatch 0.13.0 -> 0.14.0 (ALTER EXTENSION privmatch UPDATE TO '0.14.0').
--
-- What 0.14.0 changes (issue 34, face verification latency): a 1:1 face verification is dealt
-- by P2 from its session id alone, at the same time as the evaluators' opens
-- (docs/protocols/face.md §13.10). Each evaluator masks its probe share and re-masks its
-- share of the template with seeds it derives from what it shares with P2 and the session id,
-- and sends both to the other evaluator from its open; P2 no longer needs the evaluators'
-- compared lists (and no longer learns which template is verified). So:
--   * face_masked_open loses its column dealer_request (its masked_probe column now carries
--     X_b ‖ Y'_b and the sender's list digest);
--   * face_dealer_verify(session, request_p0, request_p1) becomes face_dealer_verify(session).
-- No table changes. Verification sessions running while the library is replaced fail and are
-- retried by the client with a new session (engine sessions do not survive the restart).
--
-- Tested by tests/tests/upgrade.rs: an upgraded 0.13.0 party has the catalog of a fresh 0.14.0
-- party.

\echo Use "ALTER EXTENSION privmatch UPDATE TO '0.14.0'" to load this file. \quit

-- [face] begin
-- Both functions are dropped and created again; their grants come back from
-- apply_function_roles() below.
DROP FUNCTION privmatch.face_masked_open(bytea, bytea, bytea);
-- extension/src/face/masked.rs
-- privmatch::face::masked::face_masked_open
CREATE  FUNCTION "face_masked_open"(
	"session" bytea, /* &[u8] */
	"probe" bytea, /* &[u8] */
	"expect_ids" bytea DEFAULT NULL /* Option<&[u8]> */
) RETURNS TABLE (
	"comparisons" INT,  /* i32 */
	"bundle_ids" bytea,  /* alloc::vec::Vec<u8> */
	"digest" bytea,  /* alloc::vec::Vec<u8> */
	"masked_probe" bytea  /* core::option::Option<alloc::vec::Vec<u8>> */
)
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'face_masked_open_wrapper';

DROP FUNCTION privmatch.face_dealer_verify(bytea, bytea, bytea);
-- extension/src/face/dealer.rs
-- privmatch::face::dealer::face_dealer_verify
CREATE  FUNCTION "face_dealer_verify"(
	"session" bytea /* &[u8] */
) RETURNS TABLE (
	"chunk" INT,  /* i32 */
	"envelope_p0" bytea,  /* alloc::vec::Vec<u8> */
	"envelope_p1" bytea  /* alloc::vec::Vec<u8> */
)
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'face_dealer_verify_wrapper';
-- [face] end

-- Who may call what: the lists of sql/roles.sql are unchanged; applied again so that the two
-- functions created above get their grants (EXECUTE for the coordinator only).
SELECT privmatch.apply_function_roles();
