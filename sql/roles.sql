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
-- The Paillier service provider's records, parameters and public material (its signing seed is
-- in the key file); pending enrolments and Π2/Π3 sessions are not dumped (secret, short-lived).
SELECT pg_catalog.pg_extension_config_dump('privmatch.paillier_service', '');
SELECT pg_catalog.pg_extension_config_dump('privmatch.paillier_params', '');
SELECT pg_catalog.pg_extension_config_dump('privmatch.paillier_devices', '');
