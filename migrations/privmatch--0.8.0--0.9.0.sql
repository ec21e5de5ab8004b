-- privmatch 0.8.0 -> 0.9.0 (ALTER EXTENSION privmatch UPDATE TO '0.9.0').
--
-- What 0.9.0 adds (docs/protocols/face.md §13.7): face 1:N identifications with the dealer's
-- keys made ahead of time. At P2 the function face_dealer_stock (a dealing under a stock id,
-- derived and sealed under its own label, so it never equals a session's); at P0 and P1 the
-- table face_stock_used (the claims: one session per stock id, ever; readable by no role, not
-- dumped) and the functions face_masked_stock (keeps a stocked dealing in the engine) and
-- face_masked_open_stocked (an identification's open that claims it), EXECUTE for the
-- coordinator only. face_masked_keys accepts an empty array of chunks (the claimed stock).
-- No row changes; running sessions survive the upgrade.
--
-- Tested by tests/tests/upgrade.rs: an upgraded 0.8.0 party has the catalog of a fresh 0.9.0
-- party.

\echo Use "ALTER EXTENSION privmatch UPDATE TO '0.9.0'" to load this file. \quit

-- ---------------------------------------------------------------------------------------------
-- The parts of sql/face.sql that 0.9.0 adds, frozen.
-- ---------------------------------------------------------------------------------------------

-- Dealings stocked ahead of time that a session claimed (P0 and P1; docs/protocols/face.md
-- §13.7). The dealing's keys live in the engine's memory until an identification over its
-- list claims them; the claim is this row, committed with the session before anything derived
-- from the keys leaves, so a stock id serves one session, ever (the primary key), whatever the
-- coordinator replays. Not dumped, like the sessions and pool claims.
CREATE TABLE privmatch.face_stock_used (
    stock      bytea PRIMARY KEY CHECK (length(stock) = 16),
    session    bytea NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON privmatch.face_stock_used FROM PUBLIC;

-- extension/src/face/dealer.rs
-- privmatch::face::dealer::face_dealer_stock
CREATE  FUNCTION "face_dealer_stock"(
	"stock" bytea, /* & [u8] */
	"bundle_ids" bytea[] /* Array < '_, & [u8] > */
) RETURNS TABLE (
	"chunk" INT,  /* i32 */
	"envelope_p0" bytea,  /* Vec < u8 > */
	"envelope_p1" bytea  /* Vec < u8 > */
)
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'face_dealer_stock_wrapper';

-- extension/src/face/masked.rs
-- privmatch::face::masked::face_masked_open_stocked
CREATE  FUNCTION "face_masked_open_stocked"(
	"session" bytea, /* & [u8] */
	"probe" bytea, /* & [u8] */
	"stock" bytea /* & [u8] */
) RETURNS TABLE (
	"comparisons" INT,  /* i32 */
	"bundle_ids" bytea,  /* Vec < u8 > */
	"subjects" TEXT[],  /* Vec < String > */
	"digest" bytea,  /* Vec < u8 > */
	"claimed" bool  /* bool */
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'face_masked_open_stocked_wrapper';

-- extension/src/face/masked.rs
-- privmatch::face::masked::face_masked_stock
CREATE  FUNCTION "face_masked_stock"(
	"stock" bytea, /* & [u8] */
	"chunks" bytea[] /* Array < '_, & [u8] > */
) RETURNS INT /* i32 */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'face_masked_stock_wrapper';

-- ---------------------------------------------------------------------------------------------
-- Who may call what (sql/roles.sql of 0.9.0, frozen): the list gains face_dealer_stock,
-- face_masked_open_stocked and face_masked_stock; the lists are applied again; the new table
-- is readable by no role and not dumped.
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
        ('face_dealer_stock',         ARRAY['privmatch_coordinator']),
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
        ('face_masked_open_stocked',  ARRAY['privmatch_coordinator']),
        ('face_masked_stock',         ARRAY['privmatch_coordinator']),
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
