-- privmatch 0.10.0 -> 0.11.0 (ALTER EXTENSION privmatch UPDATE TO '0.11.0').
--
-- What 0.11.0 adds: the coordinator untrusted in fact (issue 34). See each section below.
--
-- Tested by tests/tests/upgrade.rs: an upgraded 0.10.0 party has the catalog of a fresh 0.11.0
-- party.

\echo Use "ALTER EXTENSION privmatch UPDATE TO '0.11.0'" to load this file. \quit

-- ---------------------------------------------------------------------------------------------
-- [section: roles, limits, coordinator lock, signed-command expiry, secrets at rest, budgets]
-- ---------------------------------------------------------------------------------------------
-- Least privilege for the logins (issue 34 item 5): no TEMP and no advisory locks for any role
-- but the operator in this database, the coordinator's lock through
-- privmatch.coordinator_lock() only, per-login connection and temp-file limits. Frozen copies
-- of sql/roles.sql.
-- Resources a login could take from the others (docs/trust-model.md §2a). In this database no
-- role but the operator may create temporary objects (a front-door or coordinator session
-- could otherwise fill the disk or keep state beside the protocol), nor take advisory locks:
-- the coordinator's lock at P0 (privmatch.coordinator_lock() below) would otherwise be
-- takeable by any login, which stops the coordinator. The extension's own functions run as
-- its owner and keep both. DROP EXTENSION does not give these back (GRANT them again by hand).
DO $limits$
DECLARE
    f regprocedure;
BEGIN
    EXECUTE format('REVOKE TEMPORARY ON DATABASE %I FROM PUBLIC', pg_catalog.current_database());
    EXECUTE format('GRANT TEMPORARY ON DATABASE %I TO privmatch_operator', pg_catalog.current_database());
    FOR f IN
        SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
         WHERE p.pronamespace = 'pg_catalog'::regnamespace
           AND p.proname LIKE 'pg\_%advisory%lock%' AND p.proname NOT LIKE '%unlock%'
    LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO privmatch_operator', f);
    END LOOP;
END
$limits$;

-- The coordinator's lock at P0 (coordinator/src/guard.rs): one coordinator per deployment. A
-- session-level advisory lock taken by this function (as the owner), so only a login that may
-- execute it — the coordinator's — can hold it; it lasts as long as the calling session.
CREATE FUNCTION privmatch.coordinator_lock() RETURNS boolean
LANGUAGE sql VOLATILE
AS $lock$ SELECT pg_catalog.pg_try_advisory_lock(8102654636955104355) $lock$;

-- Per-login limits for the coordinator's and the application's logins (docs/trust-model.md
-- §2a): a connection limit (so neither can fill max_connections and lock the other, or the
-- operator, out) and a temp_file_limit (so no query spills the disk full). PostgreSQL keeps
-- both per login role, not per group, so the operator applies them to every login of the two
-- groups after creating one (privmatch.create_application_login does; `privmatch operator init`
-- does for the coordinator's). Returns the logins changed and their limits.
CREATE FUNCTION privmatch.apply_login_limits(
    coordinator_connections integer DEFAULT 32,
    application_connections integer DEFAULT 8,
    coordinator_temp_file_limit text DEFAULT '1GB',
    application_temp_file_limit text DEFAULT '256MB')
RETURNS TABLE (login name, connection_limit integer, temp_file_limit text)
LANGUAGE plpgsql VOLATILE
AS $apply_limits$
DECLARE
    r record;
    conns integer;
    temp_limit text;
BEGIN
    IF coordinator_connections NOT BETWEEN 1 AND 10000 OR application_connections NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION 'apply_login_limits: connection limits must be between 1 and 10000'
            USING ERRCODE = '22023';
    END IF;
    FOR r IN
        SELECT u.rolname,
               pg_catalog.pg_has_role(u.oid, 'privmatch_coordinator', 'MEMBER') AS coordinator
          FROM pg_catalog.pg_roles u
         WHERE u.rolcanlogin AND NOT u.rolsuper
           AND (pg_catalog.pg_has_role(u.oid, 'privmatch_coordinator', 'MEMBER')
                OR pg_catalog.pg_has_role(u.oid, 'privmatch_application', 'MEMBER'))
           AND NOT pg_catalog.pg_has_role(u.oid, 'privmatch_operator', 'MEMBER')
         ORDER BY u.rolname
    LOOP
        IF r.coordinator THEN
            conns := coordinator_connections; temp_limit := coordinator_temp_file_limit;
        ELSE
            conns := application_connections; temp_limit := application_temp_file_limit;
        END IF;
        EXECUTE format('ALTER ROLE %I CONNECTION LIMIT %s', r.rolname, conns);
        EXECUTE format('ALTER ROLE %I SET temp_file_limit = %L', r.rolname, temp_limit);
        login := r.rolname; connection_limit := conns; temp_file_limit := temp_limit;
        RETURN NEXT;
    END LOOP;
END
$apply_limits$;

-- Creates an application login (a member of privmatch_application only, with the limits of
-- apply_login_limits) without a password: the operator sets one with psql's \password (so it
-- is in no statement log) or uses certificate authentication. Returns the login's name.
CREATE FUNCTION privmatch.create_application_login(login name)
RETURNS name
LANGUAGE plpgsql VOLATILE
AS $create_login$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = login) THEN
        RAISE EXCEPTION 'create_application_login: role % already exists', login
            USING ERRCODE = '42710';
    END IF;
    EXECUTE format('CREATE ROLE %I LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE INHERIT '
                   'NOREPLICATION NOBYPASSRLS IN ROLE privmatch_application', login);
    PERFORM privmatch.apply_login_limits();
    RETURN login;
END
$create_login$;

-- Query budgets (sql/common.sql, frozen).
CREATE TABLE privmatch.query_budget_policy (
    kind     text    PRIMARY KEY CHECK (kind IN ('iris-search', 'face-identify', 'face-verify')),
    per_hour integer NOT NULL CHECK (per_hour >= 0),
    set_at   timestamptz NOT NULL DEFAULT now()
);
INSERT INTO privmatch.query_budget_policy (kind, per_hour) VALUES
    ('iris-search', 100000), ('face-identify', 100000), ('face-verify', 60);
REVOKE ALL ON privmatch.query_budget_policy FROM PUBLIC;
CREATE TABLE privmatch.query_budget_use (
    kind text        NOT NULL,
    key  text        NOT NULL,
    hour timestamptz NOT NULL,
    used integer     NOT NULL CHECK (used > 0),
    PRIMARY KEY (kind, key, hour)
);
REVOKE ALL ON privmatch.query_budget_use FROM PUBLIC;

-- The functions of 0.11.0's shared layer, as pgrx generates them.
CREATE FUNCTION privmatch."at_rest_seal"(
	"purpose" TEXT, /* & str */
	"plaintext" bytea /* & [u8] */
) RETURNS bytea /* Vec < u8 > */
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'at_rest_seal_wrapper';
CREATE FUNCTION privmatch."query_budgets"() RETURNS TABLE (
	"kind" TEXT,  /* String */
	"per_hour" INT,  /* i32 */
	"most_used_this_hour" INT  /* i32 */
)
STRICT STABLE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'query_budgets_wrapper';
CREATE FUNCTION privmatch."set_query_budget"(
	"kind" TEXT, /* & str */
	"per_hour" INT /* i32 */
) RETURNS INT /* i32 */
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'set_query_budget_wrapper';
-- at_rest_seal runs as the owner below, before the lists are applied at the end; nobody else
-- may execute it meanwhile.
REVOKE ALL ON FUNCTION privmatch.at_rest_seal(text, bytea) FROM PUBLIC;

-- Secrets at rest (issue 34 item 9). θ and K are sealed under the party's at-rest key (the
-- key file must be in place, as for any start of 0.10.0); the clear values stay in WAL written
-- before the upgrade and in older backups: rotate θ (privmatch face configure) after upgrading.
ALTER TABLE privmatch.face_dealer ADD COLUMN threshold_sealed bytea;
UPDATE privmatch.face_dealer
   SET threshold_sealed = privmatch.at_rest_seal('face-dealer-threshold', pg_catalog.float8send(threshold));
ALTER TABLE privmatch.face_dealer ALTER COLUMN threshold_sealed SET NOT NULL;
ALTER TABLE privmatch.face_dealer DROP COLUMN threshold;
ALTER TABLE privmatch.face_template_master
    ADD COLUMN master_key_sealed bytea CHECK (length(master_key_sealed) = 77);
UPDATE privmatch.face_template_master
   SET master_key_sealed = privmatch.at_rest_seal('face-template-master', master_key);
ALTER TABLE privmatch.face_template_master ALTER COLUMN master_key_sealed SET NOT NULL;
ALTER TABLE privmatch.face_template_master DROP COLUMN master_key;
-- The single-use face keys: in no WAL record from now on (a crash empties the table; the
-- claims stay).
ALTER TABLE privmatch.face_key_batches SET UNLOGGED;
-- The Paillier SP's pending enrolments (the norm challenge's seed): likewise.
ALTER TABLE privmatch.paillier_pending SET UNLOGGED;

-- The operator key and its counter are dumped (a restored party keeps refusing old commands).
SELECT pg_catalog.pg_extension_config_dump('privmatch.operator_key', '');
-- [end section: roles]

-- ---------------------------------------------------------------------------------------------
-- [section: iris set binding, signed iris outputs, iris threshold policy]
-- ---------------------------------------------------------------------------------------------
-- Iris (docs/protocols/iris.md §13.1, §14.1, §14.2; issue 34 items 2 and 4):
--  * set binding: iris_templates gains enrolment_id, what the three parties agreed when they
--    stored a record (SHA-256 over the hashes of its three sealed envelopes); the set digest
--    of every search commits to it. iris_enroll_sealed takes the envelope hashes as its second
--    argument (dropped and created again). Rows enrolled before 0.11.0 get the legacy id every
--    party computes alike, SHA-256('privmatch iris legacy enrolment v1' || eye || 0x00 ||
--    subject) (core/src/iris/binding.rs, legacy_enrolment_id): they keep matching but are NOT
--    bound (a share replaced at one party keeps its digest) until the subject re-enrols.
--    iris_audit() lists (subject, eye, enrolment_id) for `privmatch iris audit`.
--  * threshold policy: the table iris_policy (no row = the install default 0.345), set only by
--    the operator-signed iris_set_policy(command); iris_policy() reads it; iris_search_start
--    refuses any other threshold (no signature change).
--  * signed outputs: iris_search_round returns the column signature (dropped and created
--    again); party_info() returns the column signing_key, the public half of the party's
--    Ed25519 key derived from its key file (dropped and created again).
-- Install the 0.11.0 library at all three parties and restart them (the engine loads the
-- enrolment ids) before the 0.11.0 coordinator enrols or searches.

ALTER TABLE privmatch.iris_templates ADD COLUMN enrolment_id bytea;
UPDATE privmatch.iris_templates
   SET enrolment_id = pg_catalog.sha256(
           pg_catalog.convert_to('privmatch iris legacy enrolment v1' || eye::text, 'UTF8')
           || '\x00'::bytea || pg_catalog.convert_to(subject, 'UTF8'));
ALTER TABLE privmatch.iris_templates
    ALTER COLUMN enrolment_id SET NOT NULL,
    ADD CONSTRAINT iris_templates_enrolment_id_check CHECK (length(enrolment_id) = 32);

-- The iris threshold policy of this party (at most one row; none = the install default,
-- τ = 0.345): every search must use threshold τ = threshold_num / 10,000, whoever calls
-- iris_search_start. Written only by iris_set_policy, an operator-signed command
-- (extension/src/iris/policy.rs). Dumped with the templates, so a restored party keeps it.
CREATE TABLE privmatch.iris_policy (
    singleton     boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    threshold_num integer NOT NULL CHECK (threshold_num BETWEEN 1 AND 5000),
    set_at        timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON privmatch.iris_policy FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('privmatch.iris_policy', '');

DROP FUNCTION privmatch.iris_enroll_sealed(bytea[], text);
-- privmatch::iris::enroll::iris_enroll_sealed
CREATE  FUNCTION "iris_enroll_sealed"(
	"envelopes" bytea[], /* Array < '_, & [u8] > */
	"envelope_hashes" bytea[], /* Array < '_, & [u8] > */
	"on_duplicate" TEXT DEFAULT 'skip' /* & str */
) RETURNS TABLE (
	"subject" TEXT,  /* String */
	"eye" TEXT,  /* String */
	"enrolled" bool  /* bool */
)
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'iris_enroll_sealed_wrapper';

-- privmatch::iris::enroll::iris_audit
CREATE  FUNCTION "iris_audit"() RETURNS TABLE (
	"subject" TEXT,  /* String */
	"eye" TEXT,  /* String */
	"enrolment_id" bytea  /* Vec < u8 > */
)
STRICT STABLE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'iris_audit_wrapper';

-- privmatch::iris::policy::iris_policy
CREATE  FUNCTION "iris_policy"() RETURNS double precision /* f64 */
STRICT STABLE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'iris_policy_wrapper';

-- privmatch::iris::policy::iris_set_policy
CREATE  FUNCTION "iris_set_policy"(
	"command" bytea /* & [u8] */
) RETURNS double precision /* f64 */
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'iris_set_policy_wrapper';

DROP FUNCTION privmatch.iris_search_round(bytea, integer, bytea);
-- privmatch::iris::search::iris_search_round
CREATE  FUNCTION "iris_search_round"(
	"session_id" bytea, /* & [u8] */
	"round" INT, /* i32 */
	"message" bytea /* & [u8] */
) RETURNS TABLE (
	"message" bytea,  /* :: std :: option :: Option < Vec < u8 > > */
	"finished" bool,  /* bool */
	"is_unique" bool,  /* Option < bool > */
	"subjects" TEXT[],  /* :: std :: option :: Option < Vec < String > > */
	"signature" bytea  /* :: std :: option :: Option < Vec < u8 > > */
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'iris_search_round_wrapper';

DROP FUNCTION privmatch.party_info();
-- privmatch::identity::party_info
CREATE  FUNCTION "party_info"() RETURNS TABLE (
	"party_index" INT,  /* i32 */
	"public_key" TEXT,  /* String */
	"fingerprint" TEXT,  /* String */
	"signing_key" TEXT  /* Option < String > */
)
STRICT STABLE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'party_info_wrapper';

-- [end section: iris]

-- ---------------------------------------------------------------------------------------------
-- [section: paillier]
-- ---------------------------------------------------------------------------------------------
-- Device-held templates (issue 34 item 10; docs/protocols/paillier.md section 12): the SP signs
-- every Round 2 (the Round 2 functions keep their signatures and now return the signed
-- envelope), thresholds are the SP's policy, sessions are opened and budgeted in their own
-- transaction, deletion needs the device's signature or the operator's signed command.
-- Frozen copies of sql/paillier.sql and of the functions as pgrx generates them.

CREATE TABLE privmatch.paillier_policy (
    protocol                   smallint PRIMARY KEY CHECK (protocol BETWEEN 1 AND 3),
    threshold                  bigint   NOT NULL,
    device_sessions_per_hour   integer  NOT NULL CHECK (device_sessions_per_hour >= 0),
    terminal_sessions_per_hour integer  NOT NULL CHECK (terminal_sessions_per_hour >= 0),
    set_at                     timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE privmatch.paillier_session_log (
    session     bytea    PRIMARY KEY CHECK (length(session) = 16),
    device_id   text     NOT NULL CHECK (length(device_id) BETWEEN 1 AND 64),
    protocol    smallint NOT NULL CHECK (protocol BETWEEN 1 AND 3),
    terminal    text     NOT NULL CHECK (length(terminal) BETWEEN 1 AND 128),
    opened_xact bigint   NOT NULL,
    opened_at   timestamptz NOT NULL DEFAULT now(),
    round2_at   timestamptz
);
CREATE INDEX paillier_session_log_opened ON privmatch.paillier_session_log (opened_at);

CREATE TABLE privmatch.paillier_budget_use (
    kind text        NOT NULL CHECK (kind IN ('device', 'terminal')),
    key  text        NOT NULL,
    hour timestamptz NOT NULL,
    used integer     NOT NULL,
    PRIMARY KEY (kind, key, hour)
);
REVOKE ALL ON privmatch.paillier_policy, privmatch.paillier_session_log, privmatch.paillier_budget_use
    FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('privmatch.paillier_policy', '');

-- Π2/Π3 sessions suspended under 0.10.0 hold b (and pad) from the earlier, floorless ranges,
-- which 0.11.0 resumes no more (XX001); they live 10 minutes: drop them, their terminals start
-- again.
DELETE FROM privmatch.paillier_sessions;

-- paillier_delete(text) becomes paillier_delete(text, bytea): the device's signature.
DROP FUNCTION privmatch.paillier_delete(text);

-- extension/src/paillier/enroll.rs
-- privmatch::paillier::enroll::paillier_delete
CREATE  FUNCTION "paillier_delete"(
	"device_id" TEXT, /* & str */
	"signature" bytea /* & [u8] */
) RETURNS bool /* bool */
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'paillier_delete_wrapper';

-- extension/src/paillier/enroll.rs
-- privmatch::paillier::enroll::paillier_delete_signed
CREATE  FUNCTION "paillier_delete_signed"(
	"command" bytea /* & [u8] */
) RETURNS bool /* bool */
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'paillier_delete_signed_wrapper';

-- extension/src/paillier/policy.rs
-- privmatch::paillier::policy::paillier_policies
CREATE  FUNCTION "paillier_policies"() RETURNS TABLE (
	"protocol" TEXT,  /* String */
	"threshold" bigint,  /* i64 */
	"device_sessions_per_hour" INT,  /* i32 */
	"terminal_sessions_per_hour" INT  /* i32 */
)
STRICT STABLE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'paillier_policies_wrapper';

-- extension/src/paillier/policy.rs
-- privmatch::paillier::policy::paillier_session_open
CREATE  FUNCTION "paillier_session_open"(
	"device_id" TEXT, /* & str */
	"terminal_input" bytea, /* & [u8] */
	"terminal" TEXT /* & str */
) RETURNS bytea /* Vec < u8 > */
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'paillier_session_open_wrapper';

-- extension/src/paillier/policy.rs
-- privmatch::paillier::policy::paillier_set_policy
CREATE  FUNCTION "paillier_set_policy"(
	"protocol" TEXT, /* & str */
	"threshold" bigint, /* i64 */
	"device_sessions_per_hour" INT DEFAULT 60, /* i32 */
	"terminal_sessions_per_hour" INT DEFAULT 600 /* i32 */
) RETURNS TEXT /* String */
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'paillier_set_policy_wrapper';
-- [end section: paillier]

-- [final: function_roles list and apply_function_roles() are re-created last, by the lead]

-- ---------------------------------------------------------------------------------------------
-- Who may call what (sql/roles.sql of 0.11.0, frozen): the list gains the functions above; the
-- lists are applied again.
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
        ('face_pool_status',          ARRAY['privmatch_operator', 'privmatch_coordinator']),
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
