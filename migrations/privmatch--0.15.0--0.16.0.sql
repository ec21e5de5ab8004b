-- privmatch 0.15.0 -> 0.16.0 (ALTER EXTENSION privmatch UPDATE TO '0.16.0').
--
-- What 0.16.0 changes (issue 36 item 2, in-batch uniqueness): enroll-if-unique requests of one
-- eye run as one batch in one distributed transaction (docs/protocols/iris.md §13.4): one lock
-- of the template table per batch, each request's uniqueness probe compared inside the MPC with
-- the enrolled templates and with the records of the batch's earlier requests (the earlier
-- wins), then every unique record enrolled. So:
--   * iris_batch_enroll_start(batch_id, max_rotation, eye, session_ids, probes, envelopes,
--     envelope_hashes) is new: admits each request's probe and envelope (a refused request is
--     refused alone, in a subtransaction of its own) and starts the enrolment batch at the
--     engine; its rounds are iris_batch_round's;
--   * it gets EXECUTE for the coordinator only.
-- No table changes; every 0.15.0 function is unchanged.
--
-- Tested by tests/tests/upgrade.rs: an upgraded 0.15.0 party has the catalog of a fresh 0.16.0
-- party.

\echo Use "ALTER EXTENSION privmatch UPDATE TO '0.16.0'" to load this file. \quit

-- [iris] begin
-- privmatch::iris::search::iris_batch_enroll_start
CREATE  FUNCTION "iris_batch_enroll_start"(
	"batch_id" bytea, /* & [u8] */
	"max_rotation" INT, /* i32 */
	"eye" TEXT, /* & str */
	"session_ids" bytea[], /* Array < '_, & [u8] > */
	"probes" bytea[], /* Array < '_, & [u8] > */
	"envelopes" bytea[], /* Array < '_, & [u8] > */
	"envelope_hashes" bytea[] /* Array < '_, & [u8] > */
) RETURNS TABLE (
	"entries" bigint,  /* i64 */
	"set_digest" bytea,  /* Vec < u8 > */
	"message" bytea,  /* Vec < u8 > */
	"refused_sqlstate" TEXT[],  /* Vec < Option < String > > */
	"refused" TEXT[]  /* Vec < Option < String > > */
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'iris_batch_enroll_start_wrapper';
-- [iris] end

-- ---------------------------------------------------------------------------------------------
-- Who may call what (sql/roles.sql of 0.16.0, frozen): the list gains iris_batch_enroll_start;
-- the lists are applied again, so it gets its grant (EXECUTE for the coordinator only).
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
        ('iris_batch_start',          ARRAY['privmatch_coordinator']),
        ('iris_batch_round',          ARRAY['privmatch_coordinator']),
        ('iris_batch_enroll_start',   ARRAY['privmatch_coordinator']),
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
