-- privmatch 0.4.0 -> 0.5.0 (ALTER EXTENSION privmatch UPDATE TO '0.5.0').
--
-- What 0.5.0 adds (docs/protocols/paillier.md §10): Π2 and Π3 of Game-Set-MATCH (Agrawal et
-- al., CCS 2020) at the Paillier service provider: the terminal's Round 2 and its later rounds
-- run by the SP, the terminal's secrets kept between them in the new UNLOGGED table
-- paillier_sessions (secret, not dumped), and the functions paillier_pi2_round2,
-- paillier_pi2_round4, paillier_pi3_round2, paillier_pi3_round4 and paillier_pi3_finish
-- (EXECUTE for the coordinator only). paillier_delete also removes a device's running sessions
-- (same SQL definition, new library). Install the 0.5.0 library first; nothing else to do.
--
-- Tested by tests/tests/upgrade.rs: an upgraded 0.4.0 party has the catalog of a fresh 0.5.0
-- party.

\echo Use "ALTER EXTENSION privmatch UPDATE TO '0.5.0'" to load this file. \quit

-- ---------------------------------------------------------------------------------------------
-- The part of sql/paillier.sql that 0.5.0 adds, frozen.
-- ---------------------------------------------------------------------------------------------
-- Π2 and Π3 sessions between the terminal's rounds, which the SP runs for the terminal: the
-- terminal's state after its Round 2 (Π2: threshold, a, b; Π3: threshold, a, b, pad, the OT
-- session id) or, in Π3, after its Round 4 (the two labels of each output wire), core's
-- Pi2Terminal/Pi3Terminal::suspend bytes, under the 16-byte session id of the terminal's sealed
-- input. Secret (a and b are what stop a cheating device from shifting its answer): no role
-- but the owner reads it, it is not dumped, and it is UNLOGGED, so the secrets are in no WAL
-- record or replica (a crash drops running sessions; their terminals start again). The
-- terminal's last round deletes the row; rows older than 10 minutes are refused and swept.
CREATE UNLOGGED TABLE privmatch.paillier_sessions (
    session    bytea    PRIMARY KEY CHECK (length(session) = 16),
    device_id  text     NOT NULL CHECK (length(device_id) BETWEEN 1 AND 64),
    protocol   smallint NOT NULL CHECK (protocol IN (2, 3)),
    stage      smallint NOT NULL CHECK (stage = 2 OR (protocol = 3 AND stage = 4)),
    state      bytea    NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX paillier_sessions_created ON privmatch.paillier_sessions (created_at);
CREATE INDEX paillier_sessions_device ON privmatch.paillier_sessions (device_id);

-- extension/src/paillier/sessions.rs
CREATE  FUNCTION "paillier_pi2_round2"(
	"device_id" TEXT, /* & str */
	"terminal_input" bytea /* & [u8] */
) RETURNS bytea /* Vec < u8 > */
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'paillier_pi2_round2_wrapper';

-- extension/src/paillier/sessions.rs
CREATE  FUNCTION "paillier_pi2_round4"(
	"session" bytea, /* & [u8] */
	"round3" bytea /* & [u8] */
) RETURNS TABLE (
	"message" bytea,  /* :: std :: option :: Option < Vec < u8 > > */
	"matched" bool,  /* bool */
	"valid" bool  /* bool */
)
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'paillier_pi2_round4_wrapper';

-- extension/src/paillier/sessions.rs
CREATE  FUNCTION "paillier_pi3_finish"(
	"session" bytea, /* & [u8] */
	"round5" bytea /* & [u8] */
) RETURNS TABLE (
	"matched" bool,  /* bool */
	"valid" bool  /* bool */
)
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'paillier_pi3_finish_wrapper';

-- extension/src/paillier/sessions.rs
CREATE  FUNCTION "paillier_pi3_round2"(
	"device_id" TEXT, /* & str */
	"terminal_input" bytea /* & [u8] */
) RETURNS bytea /* Vec < u8 > */
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'paillier_pi3_round2_wrapper';

-- extension/src/paillier/sessions.rs
CREATE  FUNCTION "paillier_pi3_round4"(
	"session" bytea, /* & [u8] */
	"round3" bytea /* & [u8] */
) RETURNS bytea /* Vec < u8 > */
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'paillier_pi3_round4_wrapper';

-- ---------------------------------------------------------------------------------------------
-- Who may call what (sql/roles.sql of 0.5.0, frozen): the list gains the Π2/Π3 functions, the
-- lists are applied again; the new table is readable by no role and not dumped.
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
