-- privmatch 0.1.0 -> 0.2.0 (ALTER EXTENSION privmatch UPDATE TO '0.2.0').
--
-- What 0.2.0 changes (docs/trust-model.md, section 2a): roles and SECURITY DEFINER functions,
-- the party key moved from a table column to the key file, the operator key for signed
-- commands, sealed iris search parameters with durable single-use session ids, and the tables
-- pg_dump saves. Install the 0.2.0 library first and set privmatch.key_file in
-- postgresql.conf (default: privmatch_party.key in the data directory); this script writes
-- the party's existing key there. After the upgrade the old key is still in the WAL written
-- before it and in older backups: rotate the party key (docs/trust-model.md).
--
-- Tested by scripts/upgrade-test.sh: an upgraded 0.1.0 party has the catalog of a fresh
-- 0.2.0 party and keeps its identity and templates.

\echo Use "ALTER EXTENSION privmatch UPDATE TO '0.2.0'" to load this file. \quit

-- ---------------------------------------------------------------------------------------------
-- Tables (sql/common.sql, sql/iris.sql of 0.2.0)
-- ---------------------------------------------------------------------------------------------
CREATE TABLE privmatch.operator_key (
    singleton    boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    public_key   bytea   NOT NULL CHECK (length(public_key) = 32),
    last_counter bigint  NOT NULL DEFAULT 0 CHECK (last_counter >= 0),
    set_at       timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE privmatch.iris_used_sessions (
    session bytea PRIMARY KEY CHECK (length(session) = 16),
    used_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX iris_used_sessions_used_at ON privmatch.iris_used_sessions (used_at);

-- Recovery's abort fences at P0 (privmatch.txn_fence).
ALTER TABLE privmatch.distributed_transactions ADD COLUMN aborted boolean NOT NULL DEFAULT false;

-- ---------------------------------------------------------------------------------------------
-- The party key: from the column to the key file, then the column goes.
-- ---------------------------------------------------------------------------------------------
CREATE FUNCTION privmatch.migrate_party_key_to_file() RETURNS text
    VOLATILE LANGUAGE c AS 'MODULE_PATHNAME', 'migrate_party_key_to_file_wrapper';
SELECT privmatch.migrate_party_key_to_file();
DROP FUNCTION privmatch.migrate_party_key_to_file();
ALTER TABLE privmatch.party_identity DROP COLUMN secret_key;
-- 0.1.0 revoked PUBLIC's privileges here by hand; 0.2.0 revokes them on every table below.

-- ---------------------------------------------------------------------------------------------
-- Functions: face_dealer_configure takes a signed operator command (its argument is renamed,
-- which CREATE OR REPLACE cannot do); the others are new.
-- ---------------------------------------------------------------------------------------------
DROP FUNCTION privmatch.face_dealer_configure(bytea);

-- privmatch::face::dealer::face_dealer_configure
CREATE  FUNCTION "face_dealer_configure"(
	"command" bytea /* & [u8] */
) RETURNS TABLE (
	"metric" TEXT,  /* String */
	"dim" INT,  /* i32 */
	"generation" bigint  /* i64 */
)
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'face_dealer_configure_wrapper';

-- privmatch::iris::enroll::iris_enrolled
CREATE  FUNCTION "iris_enrolled"(
	"subject" TEXT, /* & str */
	"eye" TEXT /* & str */
) RETURNS bool /* bool */
STRICT STABLE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'iris_enrolled_wrapper';

-- privmatch::iris::enroll::iris_records
CREATE  FUNCTION "iris_records"() RETURNS bigint /* i64 */
STRICT STABLE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'iris_records_wrapper';

-- privmatch::operator::pin_peer_signed
CREATE  FUNCTION "pin_peer_signed"(
	"command" bytea /* &[u8] */
) RETURNS TEXT /* alloc::string::String */
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'pin_peer_signed_wrapper';

-- privmatch::operator::set_operator_key
CREATE  FUNCTION "set_operator_key"(
	"public_key" TEXT, /* & str */
	"replace" bool DEFAULT false /* bool */
) RETURNS TEXT /* String */
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'set_operator_key_wrapper';

-- privmatch::txn::txn_begin
CREATE  FUNCTION "txn_begin"(
	"gid" TEXT /* & str */
) RETURNS void
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'txn_begin_wrapper';

-- privmatch::txn::txn_committed
CREATE  FUNCTION "txn_committed"(
	"gid" TEXT /* & str */
) RETURNS bool /* bool */
STRICT STABLE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'txn_committed_wrapper';

-- privmatch::txn::txn_fence
CREATE  FUNCTION "txn_fence"(
	"gid" TEXT /* & str */
) RETURNS bool /* bool */
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'txn_fence_wrapper';

-- privmatch::txn::txn_lock_templates
CREATE  FUNCTION "txn_lock_templates"(
	"table" TEXT, /* & str */
	"exclusive" bool /* bool */
) RETURNS void
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'txn_lock_templates_wrapper';

-- ---------------------------------------------------------------------------------------------
-- Roles, SECURITY DEFINER, grants and dumped tables: as sql/roles.sql of 0.2.0.
-- ---------------------------------------------------------------------------------------------
DO $roles$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'privmatch_operator') THEN
        CREATE ROLE privmatch_operator NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'privmatch_coordinator') THEN
        CREATE ROLE privmatch_coordinator NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'privmatch_application') THEN
        CREATE ROLE privmatch_application NOLOGIN;
    END IF;
END
$roles$;

REVOKE ALL ON SCHEMA privmatch FROM PUBLIC;
GRANT USAGE ON SCHEMA privmatch TO privmatch_operator, privmatch_coordinator, privmatch_application;
REVOKE ALL ON ALL TABLES IN SCHEMA privmatch FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA privmatch FROM PUBLIC;
-- The share types and the eye enum are usable by any role that may use the schema.
GRANT USAGE ON TYPE privmatch.iris_code_share, privmatch.iris_mask_share, privmatch.face_share,
    privmatch.eye TO privmatch_operator, privmatch_coordinator, privmatch_application;

-- The function lists. Adding a function means adding its name here (and to the upgrade
-- script of the version that adds it).
CREATE FUNCTION privmatch.function_roles()
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
        ('face_session_abort',        ARRAY['privmatch_coordinator'])
$list$;

-- Applies the lists: SECURITY DEFINER, a pinned search_path, EXECUTE for the listed roles
-- only. Type I/O functions (those a type or cast depends on) are left plain. Idempotent, so
-- upgrade scripts call it again after they add functions.
CREATE FUNCTION privmatch.apply_function_roles()
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $apply$
DECLARE
    f record;
    listed name[];
    role_name name;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure AS signature, p.proname
          FROM pg_proc p
         WHERE p.pronamespace = 'privmatch'::regnamespace
           AND p.proname NOT IN ('function_roles', 'apply_function_roles')
           AND NOT EXISTS (SELECT 1 FROM pg_type t WHERE p.oid IN (t.typinput, t.typoutput,
                              t.typreceive, t.typsend, t.typmodin, t.typmodout))
           AND NOT EXISTS (SELECT 1 FROM pg_cast c WHERE c.castfunc = p.oid)
           -- a pure function of a share value, like the I/O functions
           AND p.proname <> 'face_share_dim'
         ORDER BY p.proname
    LOOP
        SELECT r.granted_to INTO listed FROM privmatch.function_roles() r
         WHERE r.function_name = f.proname;
        IF listed IS NULL THEN
            RAISE EXCEPTION 'privmatch: function % is in no role list of sql/roles.sql', f.signature;
        END IF;
        EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = pg_catalog, privmatch, pg_temp',
                       f.signature);
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f.signature);
        FOREACH role_name IN ARRAY listed LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', f.signature, role_name);
        END LOOP;
    END LOOP;
END
$apply$;
REVOKE ALL ON FUNCTION privmatch.function_roles() FROM PUBLIC;
REVOKE ALL ON FUNCTION privmatch.apply_function_roles() FROM PUBLIC;
SELECT privmatch.apply_function_roles();

-- Templates are data: pg_dump saves their rows (and the identity sequences' positions), so a
-- dump restored at a party (its key file copied by its operator) keeps it matching. The
-- single-use face keys and their claims are deliberately not dumped: a restored copy must not
-- hand out keys that were already used; the pool is refilled instead. Neither is the dealer's
-- threshold (reconfigure P2 after a restore) nor running sessions.
SELECT pg_catalog.pg_extension_config_dump('privmatch.party_identity', '');
SELECT pg_catalog.pg_extension_config_dump('privmatch.peers', '');
SELECT pg_catalog.pg_extension_config_dump('privmatch.consumed_bundles', '');
SELECT pg_catalog.pg_extension_config_dump('privmatch.iris_templates', '');
SELECT pg_catalog.pg_extension_config_dump('privmatch.iris_templates_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('privmatch.face_templates', '');
SELECT pg_catalog.pg_extension_config_dump('privmatch.face_templates_id_seq', '');
