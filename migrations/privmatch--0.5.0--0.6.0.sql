-- privmatch 0.5.0 -> 0.6.0 (ALTER EXTENSION privmatch UPDATE TO '0.6.0').
--
-- What 0.6.0 adds (docs/protocols/face.md §13): the dealer's part of face 1:N with
-- dealer-masked templates at P2: the table face_template_master (the master key K from which
-- each template's mask seeds are derived; readable by no role but the owner, not dumped; drawn
-- by the next face_dealer_configure), and the functions face_dealer_template_seeds (an
-- evaluator's sealed mask seeds for a list of bundle ids) and face_dealer_identify (the sealed
-- PMFI key halves of one face session, in chunks), EXECUTE for the coordinator only. Enrolled
-- templates already carry a random 16-byte bundle id, the same at P0 and P1
-- (face_templates.bundle_id), so no row changes. Install the 0.6.0 library first; a P2 that
-- was configured before the upgrade draws K the first time one of the two functions runs.
--
-- Tested by tests/tests/upgrade.rs: an upgraded 0.5.0 party has the catalog of a fresh 0.6.0
-- party.

\echo Use "ALTER EXTENSION privmatch UPDATE TO '0.6.0'" to load this file. \quit

-- ---------------------------------------------------------------------------------------------
-- The part of sql/face.sql that 0.6.0 adds, frozen.
-- ---------------------------------------------------------------------------------------------
-- The dealer's template-mask master key K (P2 only; docs/protocols/face.md §13): each enrolled
-- template's mask seeds are HKDF-SHA256(K; bundle id), so K unmasks every opened template
-- Δy = y + δy that P0 and P1 hold. Drawn once, when the dealer is first configured, and kept
-- across reconfigurations (the evaluators' opened templates stay valid). Readable by no role
-- but the owner; no function returns it; not dumped (a restored P2 draws a new K and the
-- evaluators open their templates again under it).
CREATE TABLE privmatch.face_template_master (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    master_key bytea   NOT NULL CHECK (length(master_key) = 32),
    created_at timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON privmatch.face_template_master FROM PUBLIC;

-- extension/src/face/dealer.rs
CREATE  FUNCTION "face_dealer_template_seeds"(
	"party" INT, /* i32 */
	"bundle_ids" bytea[] /* Array < '_, & [u8] > */
) RETURNS bytea /* Vec < u8 > */
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'face_dealer_template_seeds_wrapper';

-- extension/src/face/dealer.rs
CREATE  FUNCTION "face_dealer_identify"(
	"session" bytea, /* & [u8] */
	"bundle_ids" bytea[] /* Array < '_, & [u8] > */
) RETURNS TABLE (
	"chunk" INT,  /* i32 */
	"envelope_p0" bytea,  /* Vec < u8 > */
	"envelope_p1" bytea  /* Vec < u8 > */
)
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'face_dealer_identify_wrapper';

-- ---------------------------------------------------------------------------------------------
-- Who may call what (sql/roles.sql of 0.6.0, frozen): the list gains the two dealer
-- functions, the lists are applied again; the new table is readable by no role and not dumped.
-- ---------------------------------------------------------------------------------------------
REVOKE ALL ON ALL TABLES IN SCHEMA privmatch FROM PUBLIC;
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
        ('paillier_service_info',     ARRAY['privmatch_operator', 'privmatch_coordinator', 'privmatch_application']),
        ('paillier_parameters',       ARRAY['privmatch_operator', 'privmatch_coordinator', 'privmatch_application']),
        ('paillier_devices',          ARRAY['privmatch_operator', 'privmatch_coordinator']),
        -- the Paillier service provider's keys and parameters (its operator)
        ('paillier_init_service',     ARRAY['privmatch_operator']),
        ('paillier_set_params',       ARRAY['privmatch_operator']),
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
        ('face_dealer_template_seeds', ARRAY['privmatch_coordinator']),
        ('face_dealer_identify',      ARRAY['privmatch_coordinator']),
        ('face_keys_store',           ARRAY['privmatch_coordinator']),
        ('face_keys_retire_before',   ARRAY['privmatch_coordinator']),
        ('face_enroll_sealed',        ARRAY['privmatch_coordinator']),
        ('face_delete',               ARRAY['privmatch_coordinator']),
        ('face_template_set',         ARRAY['privmatch_coordinator']),
        ('face_session_open',         ARRAY['privmatch_coordinator']),
        ('face_session_round',        ARRAY['privmatch_coordinator']),
        ('face_session_abort',        ARRAY['privmatch_coordinator']),
        -- Paillier service provider (the coordinator relays device and terminal messages)
        ('paillier_enroll_begin',     ARRAY['privmatch_coordinator']),
        ('paillier_enroll_finish',    ARRAY['privmatch_coordinator']),
        ('paillier_delete',           ARRAY['privmatch_coordinator']),
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
