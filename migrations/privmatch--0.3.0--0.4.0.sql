-- privmatch 0.3.0 -> 0.4.0 (ALTER EXTENSION privmatch UPDATE TO '0.4.0').
--
-- What 0.4.0 adds (docs/protocols/paillier.md §10): the service provider of device-held
-- Paillier templates (Game-Set-MATCH, Agrawal et al., CCS 2020): the type paillier_template,
-- the tables paillier_service, paillier_params, paillier_devices and paillier_pending, and the
-- paillier_* functions with their grants. Install the 0.4.0 library first; at the service
-- provider (privmatch.paillier_sp_party, default P0) the operator then runs
-- SELECT privmatch.paillier_init_service() once, which adds the SP's Ed25519 signing key to the
-- party key file, and privmatch.paillier_set_params(...) per protocol.
--
-- Tested by tests/tests/upgrade.rs: an upgraded 0.3.0 party has the catalog of a fresh 0.4.0
-- party.

\echo Use "ALTER EXTENSION privmatch UPDATE TO '0.4.0'" to load this file. \quit

-- ---------------------------------------------------------------------------------------------
-- sql/paillier.sql of 0.4.0, frozen.
-- ---------------------------------------------------------------------------------------------
-- ---------------------------------------------------------------------------------------------
-- The signed template record (σ of [ABMR20] §6.1): device id, parameters, Paillier public key,
-- packed ciphertexts, expiry and the SP's Ed25519 signature. Layout: core/src/paillier/record.rs;
-- text form: hex. The C functions are in extension/src/paillier/types.rs.
-- ---------------------------------------------------------------------------------------------
CREATE TYPE privmatch.paillier_template;
CREATE FUNCTION privmatch.paillier_template_in(cstring, oid, integer) RETURNS privmatch.paillier_template
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'paillier_template_in';
CREATE FUNCTION privmatch.paillier_template_out(privmatch.paillier_template) RETURNS cstring
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'paillier_template_out';
CREATE FUNCTION privmatch.paillier_template_recv(internal, oid, integer) RETURNS privmatch.paillier_template
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'paillier_template_recv';
CREATE FUNCTION privmatch.paillier_template_send(privmatch.paillier_template) RETURNS bytea
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'paillier_template_send';
CREATE TYPE privmatch.paillier_template (
    INPUT = privmatch.paillier_template_in,
    OUTPUT = privmatch.paillier_template_out,
    RECEIVE = privmatch.paillier_template_recv,
    SEND = privmatch.paillier_template_send,
    INTERNALLENGTH = VARIABLE,
    ALIGNMENT = int4,
    STORAGE = external
);
COMMENT ON TYPE privmatch.paillier_template IS
    'A device''s packed Paillier-encrypted face template, signed by the service provider';

-- The service provider's public material: the public half of its Ed25519 signing key (the
-- seed is in the party's key file) and the ring-Pedersen parameters devices prove their key in.
CREATE TABLE privmatch.paillier_service (
    singleton      boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    signing_public bytea   NOT NULL CHECK (length(signing_public) = 32),
    ring_pedersen  bytea   NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now()
);

-- The parameters (canonical encoding of core's Params) the SP enrols under, one set per
-- protocol (1 = Π1, 2 = Π2, 3 = Π3), and how long a new record is valid.
CREATE TABLE privmatch.paillier_params (
    protocol   smallint PRIMARY KEY CHECK (protocol BETWEEN 1 AND 3),
    params     bytea    NOT NULL,
    valid_days integer  NOT NULL CHECK (valid_days BETWEEN 1 AND 3650),
    set_at     timestamptz NOT NULL DEFAULT now()
);

-- Enrolled devices: one signed record each (protocol and expiry repeated from it for listing).
CREATE TABLE privmatch.paillier_devices (
    device_id   text     PRIMARY KEY CHECK (length(device_id) BETWEEN 1 AND 64),
    protocol    smallint NOT NULL CHECK (protocol BETWEEN 1 AND 3),
    record      privmatch.paillier_template NOT NULL,
    expires_at  timestamptz NOT NULL,
    enrolled_at timestamptz NOT NULL DEFAULT now()
);

-- Enrolments between their two calls: the SP's state (core's ServiceEnrolment::to_bytes; its
-- seed gives the norm challenge's secret α, so no role but the owner reads it). Rows older than
-- 10 minutes are refused and swept.
CREATE TABLE privmatch.paillier_pending (
    device_id  text  PRIMARY KEY CHECK (length(device_id) BETWEEN 1 AND 64),
    state      bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX paillier_pending_created ON privmatch.paillier_pending (created_at);

-- extension/src/paillier/enroll.rs
CREATE  FUNCTION "paillier_delete"(
	"device_id" TEXT /* & str */
) RETURNS bool /* bool */
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'paillier_delete_wrapper';

-- extension/src/paillier/enroll.rs
CREATE  FUNCTION "paillier_device"(
	"device_id" TEXT /* & str */
) RETURNS bytea /* Vec < u8 > */
STRICT STABLE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'paillier_device_wrapper';

-- extension/src/paillier/enroll.rs
CREATE  FUNCTION "paillier_devices"() RETURNS TABLE (
	"device_id" TEXT,  /* String */
	"protocol" TEXT,  /* String */
	"expires_at" timestamp with time zone,  /* Option < TimestampWithTimeZone > */
	"enrolled_at" timestamp with time zone  /* Option < TimestampWithTimeZone > */
)
STRICT STABLE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'paillier_devices_wrapper';

-- extension/src/paillier/enroll.rs
CREATE  FUNCTION "paillier_enroll_begin"(
	"device_id" TEXT, /* & str */
	"request" bytea, /* & [u8] */
	"session" bytea /* & [u8] */
) RETURNS bytea /* :: std :: option :: Option < Vec < u8 > > */
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'paillier_enroll_begin_wrapper';

-- extension/src/paillier/enroll.rs
CREATE  FUNCTION "paillier_enroll_finish"(
	"device_id" TEXT, /* & str */
	"response" bytea /* Option < & [u8] > */
) RETURNS bytea /* Vec < u8 > */
VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'paillier_enroll_finish_wrapper';

-- extension/src/paillier/service.rs
CREATE  FUNCTION "paillier_init_service"(
	"ring_pedersen_bits" INT DEFAULT 2048 /* i32 */
) RETURNS TEXT /* String */
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'paillier_init_service_wrapper';

-- extension/src/paillier/service.rs
CREATE  FUNCTION "paillier_parameters"() RETURNS TABLE (
	"protocol" TEXT,  /* String */
	"params" bytea,  /* Vec < u8 > */
	"valid_days" INT  /* i32 */
)
STRICT STABLE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'paillier_parameters_wrapper';

-- extension/src/paillier/matching.rs
CREATE  FUNCTION "paillier_pi1_round2"(
	"device_id" TEXT, /* & str */
	"terminal_input" bytea /* & [u8] */
) RETURNS bytea /* Vec < u8 > */
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'paillier_pi1_round2_wrapper';

-- extension/src/paillier/service.rs
CREATE  FUNCTION "paillier_service_info"() RETURNS TABLE (
	"party_index" INT,  /* i32 */
	"signing_key" bytea,  /* Vec < u8 > */
	"ring_pedersen" bytea  /* Vec < u8 > */
)
STRICT STABLE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'paillier_service_info_wrapper';

-- extension/src/paillier/service.rs
CREATE  FUNCTION "paillier_set_params"(
	"params" bytea, /* & [u8] */
	"valid_days" INT DEFAULT 365 /* i32 */
) RETURNS TEXT /* String */
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'paillier_set_params_wrapper';

-- ---------------------------------------------------------------------------------------------
-- Who may call what (sql/roles.sql of 0.4.0, frozen): the type's usage, the list gains the
-- Paillier functions, the lists are applied again, the SP's tables are dumped.
-- ---------------------------------------------------------------------------------------------
GRANT USAGE ON TYPE privmatch.paillier_template
    TO privmatch_operator, privmatch_coordinator, privmatch_application;
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
SELECT pg_catalog.pg_extension_config_dump('privmatch.paillier_service', '');
SELECT pg_catalog.pg_extension_config_dump('privmatch.paillier_params', '');
SELECT pg_catalog.pg_extension_config_dump('privmatch.paillier_devices', '');
