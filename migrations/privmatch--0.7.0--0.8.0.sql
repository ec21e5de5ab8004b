-- privmatch 0.7.0 -> 0.8.0 (ALTER EXTENSION privmatch UPDATE TO '0.8.0').
--
-- What 0.8.0 changes (docs/protocols/paillier.md §7 and §10): the service provider signs the
-- decision of every Π2 and Π3 session, so that the coordinator, which relays it to the
-- terminal, cannot change it. paillier_pi2_round4 and paillier_pi3_finish return one more
-- column, verdict bytea (the SP's Ed25519 signature of protocol, session, device, matched and
-- valid; core/src/paillier/verdict.rs), so they are dropped and created again, and the roles
-- are applied to them again (EXECUTE for the coordinator only). No table or row changes.
-- Running Π2/Π3 sessions survive the upgrade; their terminals need a 0.8.0 client to accept
-- the signed verdict. Π3's Rounds 3-5 changed too (the device's inputs reduced modulo 2^k and
-- a Mersenne prime, new message kinds): devices and terminals upgrade with the SP.
--
-- Tested by tests/tests/upgrade.rs: an upgraded 0.7.0 party has the catalog of a fresh 0.8.0
-- party.

\echo Use "ALTER EXTENSION privmatch UPDATE TO '0.8.0'" to load this file. \quit

DROP FUNCTION privmatch.paillier_pi2_round4(bytea, bytea);
DROP FUNCTION privmatch.paillier_pi3_finish(bytea, bytea);

-- extension/src/paillier/sessions.rs
-- privmatch::paillier::sessions::paillier_pi2_round4
CREATE  FUNCTION "paillier_pi2_round4"(
	"session" bytea, /* & [u8] */
	"round3" bytea /* & [u8] */
) RETURNS TABLE (
	"message" bytea,  /* :: std :: option :: Option < Vec < u8 > > */
	"matched" bool,  /* bool */
	"valid" bool,  /* bool */
	"verdict" bytea  /* Vec < u8 > */
)
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'paillier_pi2_round4_wrapper';

-- extension/src/paillier/sessions.rs
-- privmatch::paillier::sessions::paillier_pi3_finish
CREATE  FUNCTION "paillier_pi3_finish"(
	"session" bytea, /* & [u8] */
	"round5" bytea /* & [u8] */
) RETURNS TABLE (
	"matched" bool,  /* bool */
	"valid" bool,  /* bool */
	"verdict" bytea  /* Vec < u8 > */
)
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'paillier_pi3_finish_wrapper';

-- SECURITY DEFINER, search_path, REVOKE from PUBLIC, EXECUTE for the listed roles (the list
-- in privmatch.function_roles() is unchanged since 0.7.0).
SELECT privmatch.apply_function_roles();
