-- privmatch 0.2.0 -> 0.3.0 (ALTER EXTENSION privmatch UPDATE TO '0.3.0').
--
-- What 0.3.0 adds (docs/front-door.md): the SQL front door, functions with which an
-- application connected to a party enrols and matches with sealed inputs while the
-- coordinator runs the protocol; EXECUTE on them goes to privmatch_application only. No table
-- changes. Install the 0.3.0 library first; to use the front door, set
-- privmatch.coordinator_url, privmatch.coordinator_ca_file and
-- privmatch.coordinator_credential_file in postgresql.conf.
--
-- Tested by tests/tests/upgrade.rs: an upgraded 0.2.0 party has the catalog of a fresh 0.3.0
-- party and keeps its identity and templates.

\echo Use "ALTER EXTENSION privmatch UPDATE TO '0.3.0'" to load this file. \quit

-- extension/src/iris/front_door.rs
CREATE  FUNCTION "iris_enroll"(
	"sealed" TEXT /* & str */
) RETURNS bool /* bool */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'iris_enroll_wrapper';

-- extension/src/iris/front_door.rs
CREATE  FUNCTION "iris_identify"(
	"sealed" TEXT /* & str */
) RETURNS TABLE (
	"subject" TEXT,  /* String */
	"eye" TEXT  /* String */
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'iris_identify_wrapper';

-- extension/src/iris/front_door.rs
CREATE  FUNCTION "iris_is_unique"(
	"sealed" TEXT /* & str */
) RETURNS bool /* bool */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'iris_is_unique_wrapper';

-- extension/src/face/front_door.rs
CREATE  FUNCTION "face_enroll"(
	"sealed" TEXT /* & str */
) RETURNS bool /* bool */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'face_enroll_wrapper';

-- extension/src/face/front_door.rs
CREATE  FUNCTION "face_verify"(
	"subject" TEXT /* & str */,
	"sealed" TEXT /* & str */
) RETURNS bool /* bool */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'face_verify_wrapper';

-- extension/src/face/front_door.rs
CREATE  FUNCTION "face_identify"(
	"sealed" TEXT /* & str */
) RETURNS TABLE (
	"subject" TEXT  /* String */
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'face_identify_wrapper';

-- ---------------------------------------------------------------------------------------------
-- Who may call what (sql/roles.sql of 0.3.0, frozen): the list gains the front door, and the
-- lists are applied again (SECURITY DEFINER, pinned search_path, EXECUTE per role).
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
        -- a peer pin signed by the operator, relayed by the coordinator
        ('pin_peer_signed',           ARRAY['privmatch_operator', 'privmatch_coordinator']),
        -- identity and status, for everyone who may use the schema
        ('party_info',                ARRAY['privmatch_operator', 'privmatch_coordinator', 'privmatch_application']),
        ('engine_status',             ARRAY['privmatch_operator', 'privmatch_coordinator']),
        ('iris_records',              ARRAY['privmatch_operator', 'privmatch_coordinator']),
        ('face_dealer_status',        ARRAY['privmatch_operator', 'privmatch_coordinator']),
        ('face_pool_status',          ARRAY['privmatch_operator', 'privmatch_coordinator']),
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
        -- face protocol (the coordinator); the dealer configuration is signed by P2's
        -- operator and verified inside P2, so the coordinator can relay it but not forge it
        ('face_dealer_configure',     ARRAY['privmatch_coordinator']),
        ('face_dealer_generate',      ARRAY['privmatch_coordinator']),
        ('face_keys_store',           ARRAY['privmatch_coordinator']),
        ('face_keys_retire_before',   ARRAY['privmatch_coordinator']),
        ('face_enroll_sealed',        ARRAY['privmatch_coordinator']),
        ('face_delete',               ARRAY['privmatch_coordinator']),
        ('face_template_set',         ARRAY['privmatch_coordinator']),
        ('face_session_open',         ARRAY['privmatch_coordinator']),
        ('face_session_round',        ARRAY['privmatch_coordinator']),
        ('face_session_abort',        ARRAY['privmatch_coordinator']),
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
