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
--   * face_dealer_verify(session, request_p0, request_p1) becomes face_dealer_verify(session);
--   * face_masked_keyed_round(session, chunks, inbound) is new: a verification's keys step and
--     round 2 in one call (EXECUTE for the coordinator).
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
-- extension/src/face/masked.rs
-- privmatch::face::masked::face_masked_keyed_round
CREATE  FUNCTION "face_masked_keyed_round"(
	"session" bytea, /* &[u8] */
	"chunks" bytea[], /* pgrx::datum::array::Array<&[u8]> */
	"inbound" bytea /* &[u8] */
) RETURNS bytea /* alloc::vec::Vec<u8> */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'face_masked_keyed_round_wrapper';
-- [face] end

-- ---------------------------------------------------------------------------------------------
-- Who may call what (sql/roles.sql of 0.14.0, frozen): the list gains face_masked_keyed_round;
-- the lists are applied again, so the three functions created above get their grants
-- (EXECUTE for the coordinator only).
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION privmatch.function_roles()
RETURNS TABLE (function_name name, granted_to name[])
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $list$
    VALUES
        -- the party's operator
        ('init_party'::name,          ARRAY['privmatch_operator']::name[]),
        ('pin_peer',                  ARRAY['privmatch_operator']),
        ('set_operator_key',          ARRAY['privmatch_operator']),
        ('apply_login_limits',        ARRAY['privmatch_operator']),
        ('create_application_login',  ARRAY['privmatch_operator']),
        ('set_query_budget',          ARRAY['privmatch_operator']),
        ('query_budgets',             ARRAY['privmatch_operator', 'privmatch_coordinator']),
        -- registered clients (extension/src/clients.rs): the operator's signed commands (the
        -- coordinator may relay them, not forge them), the policy read by all, a client's setup
        -- check, the per-client budgets (the operator's view)
        ('client_register',           ARRAY['privmatch_operator', 'privmatch_coordinator']),
        ('client_revoke',             ARRAY['privmatch_operator', 'privmatch_coordinator']),
        ('client_auth_set_policy',    ARRAY['privmatch_operator', 'privmatch_coordinator']),
        ('client_auth_policy',        ARRAY['privmatch_operator', 'privmatch_coordinator', 'privmatch_application']),
        ('client_auth_check',         ARRAY['privmatch_operator', 'privmatch_coordinator']),
        ('client_budgets',            ARRAY['privmatch_operator']),
        -- the one-coordinator lock at P0 (coordinator/src/guard.rs)
        ('coordinator_lock',          ARRAY['privmatch_coordinator']),
        -- sealing a secret under the party's at-rest key: used by upgrade scripts only
        ('at_rest_seal',              ARRAY[]::name[]),
        -- a peer pin signed by the operator, relayed by the coordinator
        ('pin_peer_signed',           ARRAY['privmatch_operator', 'privmatch_coordinator']),
        -- identity and status, for everyone who may use the schema
        ('party_info',                ARRAY['privmatch_operator', 'privmatch_coordinator', 'privmatch_application']),
        ('engine_status',             ARRAY['privmatch_operator', 'privmatch_coordinator']),
        ('iris_records',              ARRAY['privmatch_operator', 'privmatch_coordinator']),
        ('face_dealer_status',        ARRAY['privmatch_operator', 'privmatch_coordinator']),
        ('paillier_service_info',     ARRAY['privmatch_operator', 'privmatch_coordinator', 'privmatch_application']),
        ('paillier_parameters',       ARRAY['privmatch_operator', 'privmatch_coordinator', 'privmatch_application']),
        ('paillier_devices',          ARRAY['privmatch_operator', 'privmatch_coordinator']),
        -- the Paillier service provider's keys and parameters (its operator)
        ('paillier_init_service',     ARRAY['privmatch_operator']),
        ('paillier_set_params',       ARRAY['privmatch_operator']),
        ('paillier_set_policy',       ARRAY['privmatch_operator']),
        ('paillier_policies',         ARRAY['privmatch_operator', 'privmatch_coordinator']),
        -- distributed transactions (the coordinator)
        ('txn_begin',                 ARRAY['privmatch_coordinator']),
        ('txn_committed',             ARRAY['privmatch_coordinator']),
        ('txn_fence',                 ARRAY['privmatch_coordinator']),
        ('txn_lock_templates',        ARRAY['privmatch_coordinator']),
        -- iris protocol (the coordinator)
        ('iris_enroll_sealed',        ARRAY['privmatch_coordinator']),
        ('iris_delete',               ARRAY['privmatch_coordinator']),
        ('iris_enrolled',             ARRAY['privmatch_coordinator']),
        ('iris_search_start',         ARRAY['privmatch_coordinator']),
        ('iris_search_round',         ARRAY['privmatch_coordinator']),
        ('iris_search_abort',         ARRAY['privmatch_coordinator']),
        -- the iris threshold policy: read by all, set by an operator-signed command
        ('iris_policy',               ARRAY['privmatch_operator', 'privmatch_coordinator', 'privmatch_application']),
        ('iris_set_policy',           ARRAY['privmatch_operator', 'privmatch_coordinator']),
        ('iris_audit',                ARRAY['privmatch_operator', 'privmatch_coordinator']),
        -- face protocol (the coordinator); the dealer configuration is signed by P2's
        -- operator and verified inside P2, so the coordinator can relay it but not forge it
        ('face_dealer_configure',     ARRAY['privmatch_coordinator']),
        ('face_dealer_template_seeds', ARRAY['privmatch_coordinator']),
        ('face_dealer_identify',      ARRAY['privmatch_coordinator']),
        ('face_dealer_verify',        ARRAY['privmatch_coordinator']),
        ('face_dealer_stock',         ARRAY['privmatch_coordinator']),
        ('face_enroll_sealed',        ARRAY['privmatch_coordinator']),
        ('face_delete',               ARRAY['privmatch_coordinator']),
        ('face_session_abort',        ARRAY['privmatch_coordinator']),
        ('face_masked_pending',       ARRAY['privmatch_coordinator']),
        ('face_masked_prepare',       ARRAY['privmatch_coordinator']),
        ('face_masked_accept',        ARRAY['privmatch_coordinator']),
        ('face_masked_open',          ARRAY['privmatch_coordinator']),
        ('face_masked_open_stocked',  ARRAY['privmatch_coordinator']),
        ('face_masked_stock',         ARRAY['privmatch_coordinator']),
        ('face_masked_keys',          ARRAY['privmatch_coordinator']),
        ('face_masked_round',         ARRAY['privmatch_coordinator']),
        ('face_masked_keyed_round',   ARRAY['privmatch_coordinator']),
        -- the face set version's trigger (docs/protocols/face.md §13.8): fired, never called
        ('face_set_changed',          ARRAY[]::name[]),
        -- Paillier service provider (the coordinator relays device and terminal messages)
        ('paillier_enroll_begin',     ARRAY['privmatch_coordinator']),
        ('paillier_enroll_finish',    ARRAY['privmatch_coordinator']),
        ('paillier_delete',           ARRAY['privmatch_coordinator']),
        ('paillier_delete_signed',    ARRAY['privmatch_operator', 'privmatch_coordinator']),
        ('paillier_session_open',     ARRAY['privmatch_coordinator']),
        ('paillier_device',           ARRAY['privmatch_coordinator']),
        ('paillier_pi1_round2',       ARRAY['privmatch_coordinator']),
        ('paillier_pi2_round2',       ARRAY['privmatch_coordinator']),
        ('paillier_pi2_round4',       ARRAY['privmatch_coordinator']),
        ('paillier_pi3_round2',       ARRAY['privmatch_coordinator']),
        ('paillier_pi3_round4',       ARRAY['privmatch_coordinator']),
        ('paillier_pi3_finish',       ARRAY['privmatch_coordinator']),
        -- the SQL front door (the application); the function asks the coordinator
        ('iris_enroll',               ARRAY['privmatch_application']),
        ('iris_identify',             ARRAY['privmatch_application']),
        ('iris_is_unique',            ARRAY['privmatch_application']),
        ('face_enroll',               ARRAY['privmatch_application']),
        ('face_verify',               ARRAY['privmatch_application']),
        ('face_identify',             ARRAY['privmatch_application'])
$list$;
REVOKE ALL ON FUNCTION privmatch.function_roles() FROM PUBLIC;
SELECT privmatch.apply_function_roles();
