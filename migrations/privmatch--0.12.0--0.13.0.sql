-- privmatch 0.12.0 -> 0.13.0 (ALTER EXTENSION privmatch UPDATE TO '0.13.0').
--
-- What 0.13.0 changes (issue 35): the face key pool (unused by the coordinator since 0.7.0)
-- is retired, and the iris search parameters travel only sealed in the probe. Since 0.7.0 every face session runs over dealer-masked templates with keys P2
-- deals per session (or stocks ahead for 1:N); the pool's keys, dealt in batches ahead of
-- time and claimed per comparison, were no longer used by the coordinator, the CLI or the
-- front door.
--
-- Tested by tests/tests/upgrade.rs: an upgraded 0.12.0 party has the catalog of a fresh 0.13.0
-- party.

\echo Use "ALTER EXTENSION privmatch UPDATE TO '0.13.0'" to load this file. \quit

-- [face] begin
-- The pool's functions: P2's batch dealing, the evaluators' batch storage, retirement and
-- status, and the pool sessions' open and rounds; the template-set probe only they used.
DROP FUNCTION privmatch.face_dealer_generate(integer);
DROP FUNCTION privmatch.face_keys_store(bytea);
DROP FUNCTION privmatch.face_keys_retire_before(bigint);
DROP FUNCTION privmatch.face_pool_status();
DROP FUNCTION privmatch.face_session_open(bytea, bytea, text, bytea, bytea);
DROP FUNCTION privmatch.face_session_round(bytea, integer, bytea);
DROP FUNCTION privmatch.face_template_set();

-- The pool's keys (UNLOGGED), its claims and its level.
DROP VIEW privmatch.face_key_pool;
DROP TABLE privmatch.face_key_claims;
DROP TABLE privmatch.face_key_batches;

-- Sessions keep what a session over dealer-masked templates uses; the pool sessions' rows stay
-- as history (masked = false; any still running is aborted: nothing can run it any more).
UPDATE privmatch.face_sessions SET aborted = true, finished_at = now()
 WHERE NOT masked AND finished_at IS NULL;
ALTER TABLE privmatch.face_sessions
    DROP COLUMN metric,
    DROP COLUMN template_ids,
    DROP COLUMN claims,
    DROP COLUMN probe,
    DROP COLUMN z_share,
    ALTER COLUMN masked SET DEFAULT true;

-- The dealer no longer numbers key batches; its status loses next_batch.
ALTER TABLE privmatch.face_dealer DROP COLUMN next_batch;
DROP FUNCTION privmatch.face_dealer_status();
-- extension/src/face/dealer.rs
-- privmatch::face::dealer::face_dealer_status
CREATE  FUNCTION "face_dealer_status"() RETURNS TABLE (
	"metric" TEXT,  /* String */
	"dim" INT,  /* i32 */
	"generation" bigint  /* i64 */
)
STRICT STABLE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'face_dealer_status_wrapper';
-- [face] end

-- [iris] begin
-- iris_search_start loses its arguments mode, max_rotation and threshold: the search's
-- parameters travel only sealed in the probe, and the party's engine refuses a sealed
-- threshold other than the party's policy (22023), as the function did for the argument.
-- Its grant comes back from apply_function_roles() below.
DROP FUNCTION privmatch.iris_search_start(bytea, bytea, text, integer, double precision);
-- extension/src/iris/search.rs
-- privmatch::iris::search::iris_search_start
CREATE  FUNCTION "iris_search_start"(
	"session_id" bytea, /* &[u8] */
	"probe" bytea /* &[u8] */
) RETURNS TABLE (
	"entries" bigint,  /* i64 */
	"set_digest" bytea,  /* alloc::vec::Vec<u8> */
	"message" bytea  /* alloc::vec::Vec<u8> */
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'iris_search_start_wrapper';
-- [iris] end

-- ---------------------------------------------------------------------------------------------
-- Who may call what (sql/roles.sql of 0.13.0, frozen): the list loses the pool's functions;
-- the lists are applied again (face_dealer_status gets its grants back).
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
