-- privmatch 0.9.0 -> 0.10.0 (ALTER EXTENSION privmatch UPDATE TO '0.10.0').
--
-- What 0.10.0 adds (docs/protocols/face.md §13.8): cheaper opens of a face 1:N
-- identification. At P0 and P1 the table face_set_version (128 counters and an epoch, bumped
-- by statement triggers on face_templates and face_masked_templates; readable by no role, not
-- dumped) lets the engine skip its pass over every opened template when nothing changed;
-- face_masked_open_stocked gains an overload with a fourth argument, known_list (the digest of
-- the list the coordinator knows already), which then answers no bundle ids and subjects. The
-- trigger function face_set_changed runs as the owner and may be executed by no role.
-- engine_status() gains the column resident_shared_bytes (PostgreSQL's shared buffers within
-- the engine's resident memory).
-- No row changes; running sessions survive the upgrade (the engine re-reads the set once).
--
-- Tested by tests/tests/upgrade.rs: an upgraded 0.9.0 party has the catalog of a fresh 0.10.0
-- party.

\echo Use "ALTER EXTENSION privmatch UPDATE TO '0.10.0'" to load this file. \quit

-- ---------------------------------------------------------------------------------------------
-- The parts of sql/face.sql that 0.10.0 adds, frozen.
-- ---------------------------------------------------------------------------------------------

-- The version of this evaluator's template set (P0 and P1; docs/protocols/face.md §13.8): 128
-- counters, one of which (the changing backend's, by process id) every statement that enrols,
-- opens or deletes a face template bumps (the triggers below, whoever runs the statement, the
-- operator by hand included), in the same transaction as the change and at most once per
-- transaction. The engine reads all of them before an identification's open and re-reads the
-- set only when one moved since its last full refresh: a snapshot that sees the same counters
-- sees no committed change since. Several counters, so that concurrent enrolments (held until
-- COMMIT PREPARED) rarely wait for each other's row. The epoch is drawn when the rows are
-- made, so a re-created extension never repeats an old version. Not dumped: a restore makes a
-- new epoch.
CREATE TABLE privmatch.face_set_version (
    shard   integer PRIMARY KEY CHECK (shard BETWEEN 0 AND 127),
    epoch   uuid    NOT NULL,
    version bigint  NOT NULL DEFAULT 0
);
INSERT INTO privmatch.face_set_version (shard, epoch)
    SELECT s, e.epoch FROM generate_series(0, 127) s, (SELECT gen_random_uuid() AS epoch) e;
REVOKE ALL ON privmatch.face_set_version FROM PUBLIC;

-- Bumps the set version (a statement trigger; runs as the extension's owner, roles.sql): the
-- changing backend's counter, once per transaction (a row version this transaction wrote
-- already, its xmin being this transaction's id, commits with it). Statements in a
-- subtransaction bump again (harmless). Before the statement: the counter's row is locked
-- before the statement takes any row lock of its own (docs/protocols/face.md §13.8).
CREATE FUNCTION privmatch.face_set_changed() RETURNS trigger
LANGUAGE plpgsql AS $changed$
BEGIN
    UPDATE privmatch.face_set_version SET version = version + 1
     WHERE shard = pg_catalog.pg_backend_pid() % 128
       AND xmin::text::bigint <> pg_catalog.txid_current() % 4294967296;
    RETURN NULL;
END
$changed$;
CREATE TRIGGER face_templates_set_changed
    BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON privmatch.face_templates
    FOR EACH STATEMENT EXECUTE FUNCTION privmatch.face_set_changed();
CREATE TRIGGER face_masked_templates_set_changed
    BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON privmatch.face_masked_templates
    FOR EACH STATEMENT EXECUTE FUNCTION privmatch.face_set_changed();

-- ---------------------------------------------------------------------------------------------
-- face_masked_open_stocked with known_list: an overload of the three-argument form, which
-- stays as it was (extension/src/face/masked.rs, as pgrx generates it).
-- ---------------------------------------------------------------------------------------------

-- extension/src/face/masked.rs
-- privmatch::face::masked::face_masked_open_stocked
CREATE  FUNCTION "face_masked_open_stocked"(
	"session" bytea, /* & [u8] */
	"probe" bytea, /* & [u8] */
	"stock" bytea, /* & [u8] */
	"known_list" bytea /* & [u8] */
) RETURNS TABLE (
	"comparisons" INT,  /* i32 */
	"bundle_ids" bytea,  /* Vec < u8 > */
	"subjects" TEXT[],  /* Vec < String > */
	"digest" bytea,  /* Vec < u8 > */
	"claimed" bool  /* bool */
)
STRICT VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'face_masked_open_stocked_known_wrapper';

-- ---------------------------------------------------------------------------------------------
-- engine_status gains the column resident_shared_bytes (extension/src/engine/client.rs).
-- ---------------------------------------------------------------------------------------------
DROP FUNCTION privmatch.engine_status();

-- extension/src/engine/client.rs
-- privmatch::engine::client::engine_status
CREATE  FUNCTION "engine_status"() RETURNS TABLE (
	"state" TEXT,  /* String */
	"templates" bigint,  /* i64 */
	"share_bytes" bigint,  /* i64 */
	"resident_bytes" bigint,  /* i64 */
	"sessions" INT,  /* i32 */
	"kernel" TEXT,  /* String */
	"threads" INT,  /* i32 */
	"resident_shared_bytes" bigint  /* i64 */
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'engine_status_wrapper';

-- ---------------------------------------------------------------------------------------------
-- Who may call what (sql/roles.sql of 0.10.0, frozen): the list gains face_set_changed (no
-- role); the lists are applied again; the new table is readable by no role and not dumped.
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
        -- the face set version's trigger (docs/protocols/face.md §13.8): fired, never called
        ('face_set_changed',          ARRAY[]::name[]),
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
