-- privmatch 0.11.0 -> 0.12.0 (ALTER EXTENSION privmatch UPDATE TO '0.12.0').
--
-- What 0.12.0 adds: the rest of issue 34 (the coordinator untrusted in fact). See each section
-- below.
--
-- Tested by tests/tests/upgrade.rs: an upgraded 0.11.0 party has the catalog of a fresh 0.12.0
-- party.

\echo Use "ALTER EXTENSION privmatch UPDATE TO '0.12.0'" to load this file. \quit

-- [clients] begin
-- Registered clients (issue 34 item 4; extension/src/clients.rs, sql/clients.sql): sealed
-- inputs signed by a registered client (signature, nonce, expiry), checked by the party;
-- per-client query budgets; the client-auth policy ('optional' after this upgrade, as on a
-- fresh install: unsigned inputs of older clients are still accepted until the operator sets
-- 'required'). New tables registered_clients and client_auth_policy (dumped), client_nonces
-- and client_budget_use (not dumped); new functions client_register, client_revoke,
-- client_auth_set_policy (operator-signed commands), client_auth_policy, client_auth_check,
-- client_budgets. Their grants are in the function_roles list at the end of this script.
CREATE TABLE privmatch.registered_clients (
    client_id     text        PRIMARY KEY
                  CHECK (client_id ~ '^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$'),
    public_key    bytea       NOT NULL CHECK (length(public_key) = 32),
    per_hour      integer     NOT NULL CHECK (per_hour >= 0),
    registered_at timestamptz NOT NULL DEFAULT now(),
    revoked_at    timestamptz
);
REVOKE ALL ON privmatch.registered_clients FROM PUBLIC;

CREATE TABLE privmatch.client_nonces (
    client_id  text        NOT NULL,
    nonce      bytea       NOT NULL CHECK (length(nonce) = 16),
    keep_until timestamptz NOT NULL,
    PRIMARY KEY (client_id, nonce)
);
CREATE INDEX client_nonces_keep_until ON privmatch.client_nonces (keep_until);
REVOKE ALL ON privmatch.client_nonces FROM PUBLIC;

CREATE TABLE privmatch.client_budget_use (
    client_id text        NOT NULL,
    kind      text        NOT NULL,
    hour      timestamptz NOT NULL,
    used      integer     NOT NULL CHECK (used > 0),
    PRIMARY KEY (client_id, kind, hour)
);
REVOKE ALL ON privmatch.client_budget_use FROM PUBLIC;

CREATE TABLE privmatch.client_auth_policy (
    singleton boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    mode      text        NOT NULL CHECK (mode IN ('optional', 'required')),
    set_at    timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON privmatch.client_auth_policy FROM PUBLIC;

SELECT pg_catalog.pg_extension_config_dump('privmatch.registered_clients', '');
SELECT pg_catalog.pg_extension_config_dump('privmatch.client_auth_policy', '');

-- privmatch::clients::client_auth_check
CREATE  FUNCTION privmatch."client_auth_check"(
	"purpose" TEXT, /* & str */
	"blob" bytea, /* & [u8] */
	"budget" TEXT DEFAULT NULL /* Option < & str > */
) RETURNS TEXT /* Option < String > */
VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'client_auth_check_wrapper';

-- privmatch::clients::client_auth_policy
CREATE  FUNCTION privmatch."client_auth_policy"() RETURNS TEXT /* String */
STRICT STABLE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'client_auth_policy_wrapper';

-- privmatch::clients::client_auth_set_policy
CREATE  FUNCTION privmatch."client_auth_set_policy"(
	"command" bytea /* & [u8] */
) RETURNS TEXT /* String */
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'client_auth_set_policy_wrapper';

-- privmatch::clients::client_budgets
CREATE  FUNCTION privmatch."client_budgets"() RETURNS TABLE (
	"client_id" TEXT,  /* String */
	"public_key" TEXT,  /* String */
	"per_hour" INT,  /* i32 */
	"revoked" bool,  /* bool */
	"kind" TEXT,  /* String */
	"used_this_hour" INT  /* i32 */
)
STRICT STABLE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'client_budgets_wrapper';

-- privmatch::clients::client_register
CREATE  FUNCTION privmatch."client_register"(
	"command" bytea /* & [u8] */
) RETURNS TEXT /* String */
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'client_register_wrapper';

-- privmatch::clients::client_revoke
CREATE  FUNCTION privmatch."client_revoke"(
	"command" bytea /* & [u8] */
) RETURNS TEXT /* String */
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'client_revoke_wrapper';
-- [clients] end

-- [iris] begin
-- Iris outputs sealed to the client (issue 34, "the coordinator learns no result";
-- docs/protocols/iris.md §13.2): iris_search_round returns sealed_output (this party's signed
-- output sealed to the reply key inside the client's probe, probe layout version 3) and
-- disclosed_unique (the uniqueness bit in the clear, only for probes sealed for
-- enroll-if-unique) instead of is_unique, subjects and signature (dropped and created again;
-- SECURITY DEFINER and search_path come from apply_function_roles() at the end). Probes of
-- layout version 2 are refused (22P03). The iris-search budget is now charged by the engine
-- worker in a transaction of its own, committed before the start is answered (no signature
-- change). Install the 0.12.0 library at all three parties and restart them before 0.12.0
-- clients search; 0.11.0 clients cannot search a 0.12.0 party.
DROP FUNCTION privmatch.iris_search_round(bytea, integer, bytea);
-- privmatch::iris::search::iris_search_round
CREATE  FUNCTION "iris_search_round"(
	"session_id" bytea, /* & [u8] */
	"round" INT, /* i32 */
	"message" bytea /* & [u8] */
) RETURNS TABLE (
	"message" bytea,  /* :: std :: option :: Option < Vec < u8 > > */
	"finished" bool,  /* bool */
	"sealed_output" bytea,  /* :: std :: option :: Option < Vec < u8 > > */
	"disclosed_unique" bool  /* Option < bool > */
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'iris_search_round_wrapper';
REVOKE ALL ON FUNCTION privmatch.iris_search_round(bytea, integer, bytea) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION privmatch.iris_search_round(bytea, integer, bytea) TO privmatch_coordinator;
-- [iris] end

-- [face] begin
-- Faces: no subject in the clear at the coordinator (docs/protocols/face.md §13.10). A
-- verification's subject travels sealed inside the probe (format 3; formats 1 and 2 are
-- refused), the evaluators read it after opening, and the sealed outputs (format 2) list an
-- identification's compared subjects inside. So:
--  * face_masked_open loses its subject argument and its subjects column, and gains
--    dealer_request (a verification's compared list, sealed by the evaluator to P2) and
--    masked_probe (a verification's masked probe vector, sealed for the other evaluator);
--  * both face_masked_open_stocked forms lose their subjects column;
--  * face_dealer_verify (new, P2): deals a verification's keys from P0's and P1's sealed
--    requests, only when both name the same list (EXECUTE: privmatch_coordinator, in
--    function_roles());
--  * face_session_open (the retired key-pool path) keeps its signature; its subject argument
--    must match the one sealed in the probe and its subjects column is always empty.
-- No row changes. Running face sessions of 0.11.0 cannot finish (their probes are format 2).
DROP FUNCTION privmatch.face_masked_open(bytea, bytea, text, bytea);
DROP FUNCTION privmatch.face_masked_open_stocked(bytea, bytea, bytea);
DROP FUNCTION privmatch.face_masked_open_stocked(bytea, bytea, bytea, bytea);

-- extension/src/face/masked.rs
-- privmatch::face::masked::face_masked_open
CREATE  FUNCTION "face_masked_open"(
	"session" bytea, /* &[u8] */
	"probe" bytea, /* &[u8] */
	"expect_ids" bytea DEFAULT NULL /* core::option::Option<&[u8]> */
) RETURNS TABLE (
	"comparisons" INT,  /* i32 */
	"bundle_ids" bytea,  /* alloc::vec::Vec<u8> */
	"digest" bytea,  /* alloc::vec::Vec<u8> */
	"dealer_request" bytea,  /* core::option::Option<alloc::vec::Vec<u8>> */
	"masked_probe" bytea  /* core::option::Option<alloc::vec::Vec<u8>> */
)
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'face_masked_open_wrapper';

-- extension/src/face/masked.rs
-- privmatch::face::masked::face_masked_open_stocked
CREATE  FUNCTION "face_masked_open_stocked"(
	"session" bytea, /* &[u8] */
	"probe" bytea, /* &[u8] */
	"stock" bytea /* &[u8] */
) RETURNS TABLE (
	"comparisons" INT,  /* i32 */
	"bundle_ids" bytea,  /* alloc::vec::Vec<u8> */
	"digest" bytea,  /* alloc::vec::Vec<u8> */
	"claimed" bool  /* bool */
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'face_masked_open_stocked_wrapper';

-- extension/src/face/masked.rs
-- privmatch::face::masked::face_masked_open_stocked_known
CREATE  FUNCTION "face_masked_open_stocked"(
	"session" bytea, /* &[u8] */
	"probe" bytea, /* &[u8] */
	"stock" bytea, /* &[u8] */
	"known_list" bytea /* &[u8] */
) RETURNS TABLE (
	"comparisons" INT,  /* i32 */
	"bundle_ids" bytea,  /* alloc::vec::Vec<u8> */
	"digest" bytea,  /* alloc::vec::Vec<u8> */
	"claimed" bool  /* bool */
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'face_masked_open_stocked_known_wrapper';

-- extension/src/face/dealer.rs
-- privmatch::face::dealer::face_dealer_verify
CREATE  FUNCTION "face_dealer_verify"(
	"session" bytea, /* &[u8] */
	"request_p0" bytea, /* &[u8] */
	"request_p1" bytea /* &[u8] */
) RETURNS TABLE (
	"chunk" INT,  /* i32 */
	"envelope_p0" bytea,  /* alloc::vec::Vec<u8> */
	"envelope_p1" bytea  /* alloc::vec::Vec<u8> */
)
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'face_dealer_verify_wrapper';

-- Until the lead's final apply_function_roles() below: no role but the owner may call them.
REVOKE ALL ON FUNCTION privmatch.face_masked_open(bytea, bytea, bytea) FROM PUBLIC;
REVOKE ALL ON FUNCTION privmatch.face_masked_open_stocked(bytea, bytea, bytea) FROM PUBLIC;
REVOKE ALL ON FUNCTION privmatch.face_masked_open_stocked(bytea, bytea, bytea, bytea) FROM PUBLIC;
REVOKE ALL ON FUNCTION privmatch.face_dealer_verify(bytea, bytea, bytea) FROM PUBLIC;
-- [face] end

-- [paillier] begin
-- Issue 34 item 10, the rest (docs/protocols/paillier.md §13): the coordinator relays no
-- outcome in the clear (Round 4 sealed to the device, the verdict sealed to the terminal),
-- Round 4 is signed and bound to the session, device and the device's Round 3, and the SP
-- checks the device's signature of every Round 3 and 5. Three functions change arguments and
-- results. The sessions in flight were stored without the terminal's reply key (a new
-- prefix of the stored state) and cannot finish: they are dropped (their terminals start
-- again, as after a crash: the table is UNLOGGED).
DROP FUNCTION privmatch.paillier_pi2_round4(bytea, bytea);
DROP FUNCTION privmatch.paillier_pi3_round4(bytea, bytea);
DROP FUNCTION privmatch.paillier_pi3_finish(bytea, bytea);
DELETE FROM privmatch.paillier_sessions;

-- extension/src/paillier/sessions.rs
-- privmatch::paillier::sessions::paillier_pi2_round4
CREATE  FUNCTION "paillier_pi2_round4"(
	"session" bytea, /* & [u8] */
	"round3" bytea, /* & [u8] */
	"signature" bytea /* & [u8] */
) RETURNS TABLE (
	"message" bytea,  /* Vec < u8 > */
	"verdict" bytea  /* Vec < u8 > */
)
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'paillier_pi2_round4_wrapper';

-- extension/src/paillier/sessions.rs
-- privmatch::paillier::sessions::paillier_pi3_round4
CREATE  FUNCTION "paillier_pi3_round4"(
	"session" bytea, /* & [u8] */
	"round3" bytea, /* & [u8] */
	"signature" bytea /* & [u8] */
) RETURNS bytea /* Vec < u8 > */
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'paillier_pi3_round4_wrapper';

-- extension/src/paillier/sessions.rs
-- privmatch::paillier::sessions::paillier_pi3_finish
CREATE  FUNCTION "paillier_pi3_finish"(
	"session" bytea, /* & [u8] */
	"round5" bytea, /* & [u8] */
	"signature" bytea /* & [u8] */
) RETURNS bytea /* Vec < u8 > */
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'paillier_pi3_finish_wrapper';
-- [paillier] end

-- [final: function_roles list and apply_function_roles() are re-created last, by the lead]

-- ---------------------------------------------------------------------------------------------
-- Who may call what (sql/roles.sql of 0.12.0, frozen): the list gains the functions above; the
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
        ('face_dealer_verify',        ARRAY['privmatch_coordinator']),
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
