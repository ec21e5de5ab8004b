-- privmatch: who may call what at one party. The end of the install script (pgrx `finalize`,
-- after every generated function). docs/trust-model.md explains the roles; in short:
--
--   privmatch_operator     the party's own organisation: initialises the party, pins its
--                          peers' keys, sets the operator key that signs changes of security
--                          state. Usually the database owner.
--   privmatch_coordinator  the coordinator's login roles: the protocol functions and nothing
--                          else (no table privilege, no schema CREATE, not an owner).
--   privmatch_application  the application's SQL front door: enrol, identify, verify with
--                          sealed inputs (the coordinator runs the protocol), and the party's
--                          public identity; nothing else.
--
-- Every function that touches a table or a secret runs as its owner (SECURITY DEFINER) with a
-- pinned search_path, its EXECUTE revoked from PUBLIC and granted per role, as secret-holding
-- extensions such as pgsodium do: so the privileges of a caller are exactly the functions it
-- was granted, not the tables behind them. The share types' I/O functions stay plain (they
-- touch no table and no secret). A function that is in none of the lists below makes the
-- install fail, so a new function cannot be exposed by omission.

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
    privmatch.paillier_template, privmatch.eye TO privmatch_operator, privmatch_coordinator, privmatch_application;

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
        ('iris_batch_start',          ARRAY['privmatch_coordinator']),
        ('iris_batch_round',          ARRAY['privmatch_coordinator']),
        ('iris_batch_enroll_start',   ARRAY['privmatch_coordinator']),
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
        ('face_masked_keyed_round',   ARRAY['privmatch_coordinator']),
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
-- dump restored at a party (its key file copied by its operator) keeps it matching. Face
-- sessions and stocked-dealing claims are deliberately not dumped (a restored copy deals new
-- keys per session), nor is the dealer's threshold (reconfigure P2 after a restore).
SELECT pg_catalog.pg_extension_config_dump('privmatch.party_identity', '');
-- The operator key and its last accepted counter: a party restored from a dump keeps refusing
-- the commands it accepted before the dump (and every command expires, core's crypto::sign).
SELECT pg_catalog.pg_extension_config_dump('privmatch.operator_key', '');
SELECT pg_catalog.pg_extension_config_dump('privmatch.peers', '');
SELECT pg_catalog.pg_extension_config_dump('privmatch.consumed_bundles', '');
SELECT pg_catalog.pg_extension_config_dump('privmatch.iris_templates', '');
SELECT pg_catalog.pg_extension_config_dump('privmatch.iris_templates_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('privmatch.iris_policy', '');
SELECT pg_catalog.pg_extension_config_dump('privmatch.face_templates', '');
SELECT pg_catalog.pg_extension_config_dump('privmatch.face_templates_id_seq', '');
-- The Paillier service provider's records, parameters and public material (its signing seed is
-- in the key file); pending enrolments and Π2/Π3 sessions are not dumped (secret, short-lived).
SELECT pg_catalog.pg_extension_config_dump('privmatch.paillier_service', '');
SELECT pg_catalog.pg_extension_config_dump('privmatch.paillier_params', '');
SELECT pg_catalog.pg_extension_config_dump('privmatch.paillier_devices', '');
SELECT pg_catalog.pg_extension_config_dump('privmatch.paillier_policy', '');
