-- privmatch 0.6.0 -> 0.7.0 (ALTER EXTENSION privmatch UPDATE TO '0.7.0').
--
-- What 0.7.0 adds (docs/protocols/face.md §13): the evaluators' part of face 1:N with
-- dealer-masked templates at P0 and P1. The table face_masked_templates (each enrolled
-- template's opened Δy = y + δy and this party's mask seed; readable by no role but the owner,
-- not dumped: a restored party opens its templates again), the column face_sessions.masked
-- (face_sessions.metric may now be NULL: a masked session's metric is in the dealer's keys),
-- and the functions face_masked_pending, face_masked_prepare, face_masked_accept (the one
-- opening of templates) and face_masked_open, face_masked_keys, face_masked_round (sessions,
-- run in the party engine), EXECUTE for the coordinator only. No row changes: the coordinator
-- opens the enrolled templates before the first face session after the upgrade.
--
-- Tested by tests/tests/upgrade.rs: an upgraded 0.6.0 party has the catalog of a fresh 0.7.0
-- party.

\echo Use "ALTER EXTENSION privmatch UPDATE TO '0.7.0'" to load this file. \quit

-- ---------------------------------------------------------------------------------------------
-- The parts of sql/face.sql that 0.7.0 changes and adds, frozen.
-- ---------------------------------------------------------------------------------------------
ALTER TABLE privmatch.face_sessions ALTER COLUMN metric DROP NOT NULL;
-- A session over dealer-masked templates (docs/protocols/face.md §13): its secrets live in
-- the engine; round counts its completed steps (1 keys, 2 distance, 3 output).
ALTER TABLE privmatch.face_sessions ADD COLUMN masked boolean NOT NULL DEFAULT false;

-- Looked up by bundle id: the opening, the engine's loads and the replay guard's neighbours.
CREATE INDEX face_templates_bundle_id ON privmatch.face_templates (bundle_id);

-- The evaluator's opened templates (P0 and P1; docs/protocols/face.md §13.2 step 1).
CREATE TABLE privmatch.face_masked_templates (
    bundle_id  bytea PRIMARY KEY CHECK (length(bundle_id) = 16),
    masked     bytea NOT NULL,
    seed       bytea NOT NULL CHECK (length(seed) = 16),
    opened_at  timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE privmatch.face_masked_templates ALTER COLUMN masked SET STORAGE EXTERNAL;
REVOKE ALL ON privmatch.face_masked_templates FROM PUBLIC;

-- extension/src/face/opening.rs
-- privmatch::face::opening::face_masked_accept
CREATE  FUNCTION "face_masked_accept"(
	"bundle_ids" bytea[], /* Array < '_, & [u8] > */
	"seeds" bytea, /* & [u8] */
	"peer" bytea /* & [u8] */
) RETURNS bigint /* i64 */
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'face_masked_accept_wrapper';

-- extension/src/face/masked.rs
-- privmatch::face::masked::face_masked_keys
CREATE  FUNCTION "face_masked_keys"(
	"session" bytea, /* & [u8] */
	"chunks" bytea[] /* Array < '_, & [u8] > */
) RETURNS bytea /* Vec < u8 > */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'face_masked_keys_wrapper';

-- extension/src/face/masked.rs
-- privmatch::face::masked::face_masked_open
CREATE  FUNCTION "face_masked_open"(
	"session" bytea, /* & [u8] */
	"probe" bytea, /* & [u8] */
	"subject" TEXT DEFAULT NULL, /* Option < & str > */
	"expect_ids" bytea DEFAULT NULL /* Option < & [u8] > */
) RETURNS TABLE (
	"comparisons" INT,  /* i32 */
	"bundle_ids" bytea,  /* Vec < u8 > */
	"subjects" TEXT[],  /* Vec < String > */
	"digest" bytea  /* Vec < u8 > */
)
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'face_masked_open_wrapper';

-- extension/src/face/opening.rs
-- privmatch::face::opening::face_masked_pending
CREATE  FUNCTION "face_masked_pending"(
	"max_count" INT DEFAULT 10000 /* i32 */
) RETURNS bytea[] /* Vec < Vec < u8 > > */
STRICT STABLE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'face_masked_pending_wrapper';

-- extension/src/face/opening.rs
-- privmatch::face::opening::face_masked_prepare
CREATE  FUNCTION "face_masked_prepare"(
	"bundle_ids" bytea[], /* Array < '_, & [u8] > */
	"seeds" bytea /* & [u8] */
) RETURNS bytea /* Vec < u8 > */
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'face_masked_prepare_wrapper';

-- extension/src/face/masked.rs
-- privmatch::face::masked::face_masked_round
CREATE  FUNCTION "face_masked_round"(
	"session" bytea, /* & [u8] */
	"round" INT, /* i32 */
	"inbound" bytea /* & [u8] */
) RETURNS bytea /* Vec < u8 > */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'face_masked_round_wrapper';

-- ---------------------------------------------------------------------------------------------
-- Who may call what (sql/roles.sql of 0.7.0, frozen): the list gains the six face_masked_*
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
        ('face_masked_pending',       ARRAY['privmatch_coordinator']),
        ('face_masked_prepare',       ARRAY['privmatch_coordinator']),
        ('face_masked_accept',        ARRAY['privmatch_coordinator']),
        ('face_masked_open',          ARRAY['privmatch_coordinator']),
        ('face_masked_keys',          ARRAY['privmatch_coordinator']),
        ('face_masked_round',         ARRAY['privmatch_coordinator']),
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
