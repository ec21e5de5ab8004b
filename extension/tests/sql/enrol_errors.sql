-- Enrolment and deletion arguments that are refused before anything is stored. (Enrolling real
-- sealed bundles needs the client's sealing code: see the end-to-end tests.)
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS privmatch;
RESET client_min_messages;
-- This database is party P1 (identity.sql ran first; init_party is idempotent).
SELECT privmatch.init_party(1) ~ '^[0-9a-f]{64}$' AS is_p1;

-- Errors show their SQLSTATE only (the messages' wording is checked by keyword below).
\set VERBOSITY sqlstate

-- Not a sealed box: 22P03, nothing enrolled, no bundle consumed.
SELECT * FROM privmatch.iris_enroll_sealed(ARRAY['\x00'::bytea], ARRAY[decode(repeat('00', 96), 'hex')]);
SELECT :'LAST_ERROR_MESSAGE' LIKE '%not a privmatch sealed box%' AS says_malformed,
       (SELECT count(*) FROM privmatch.iris_templates) AS templates,
       (SELECT count(*) FROM privmatch.consumed_bundles) AS consumed;
-- A sealed box header addressed to P0 (magic PMSB, version 1, recipient 0, then zeros): 22023.
SELECT * FROM privmatch.iris_enroll_sealed(
  ARRAY['\x504d53420100'::bytea || decode(repeat('00', 64), 'hex')], ARRAY[decode(repeat('00', 96), 'hex')]);
SELECT :'LAST_ERROR_MESSAGE' LIKE '%addressed to P0, but this party is P1%' AS says_wrong_party;
-- Addressed to this party and its key, but not authentic: 22P03.
SELECT * FROM privmatch.iris_enroll_sealed(
  ARRAY['\x504d53420101'::bytea || decode((SELECT fingerprint FROM privmatch.party_info()), 'hex')
        || '\x09'::bytea || decode(repeat('00', 47), 'hex')], ARRAY[decode(repeat('00', 96), 'hex')]);
SELECT :'LAST_ERROR_MESSAGE' LIKE '%authentication failed%' AS says_tampered;
-- A NULL element: 22004.
SELECT * FROM privmatch.iris_enroll_sealed(ARRAY[NULL::bytea], ARRAY[decode(repeat('00', 96), 'hex')]);
SELECT :'LAST_ERROR_MESSAGE' LIKE '%is NULL' AS says_null;
-- on_duplicate must be 'skip' or 'error': 22023.
SELECT * FROM privmatch.iris_enroll_sealed(ARRAY['\x00'::bytea], ARRAY[decode(repeat('00', 96), 'hex')], on_duplicate => 'bogus');
SELECT :'LAST_ERROR_MESSAGE' LIKE '%on_duplicate must be%' AS says_on_duplicate,
       (SELECT count(*) FROM privmatch.iris_templates) AS templates,
       (SELECT count(*) FROM privmatch.consumed_bundles) AS consumed;
-- One h0 ‖ h1 ‖ h2 per envelope (the hashes that bind the record's enrolment at the three
-- parties): any other count is 22023, before anything is opened.
SELECT * FROM privmatch.iris_enroll_sealed(ARRAY['\x00'::bytea], ARRAY[]::bytea[]);
SELECT :'LAST_ERROR_MESSAGE' LIKE '%envelope_hashes for 1 envelopes%' AS says_hash_count;
\set VERBOSITY default
-- No bundles: no rows.
SELECT * FROM privmatch.iris_enroll_sealed(ARRAY[]::bytea[], ARRAY[]::bytea[]);

-- share_text(party, coefficient bytes in hex): the text form of such a share.
CREATE FUNCTION pg_temp.share_text(party integer, coef_hex text) RETURNS text LANGUAGE sql AS $$
  SELECT 'v1:p' || party || ':' || translate(encode(decode(coef_hex, 'hex'), 'base64'), E'\n', '')
$$;
-- The templates table holds full-size shares only (12800 and 6400 coefficients). A record
-- stored directly (as iris_enroll_sealed would) for iris_delete below; a short one is refused.
INSERT INTO privmatch.iris_templates (subject, eye, code_share, mask_share, enrolment_id) VALUES ('alice', 'left',
  pg_temp.share_text(1, repeat('0100ffff', 6400))::privmatch.iris_code_share,
  pg_temp.share_text(1, repeat('0200', 6400))::privmatch.iris_mask_share, decode(repeat('01', 32), 'hex'));
INSERT INTO privmatch.iris_templates (subject, eye, code_share, mask_share, enrolment_id) VALUES ('alice', 'right',
  'v1:p1:AAABAAIAAwA=', 'v1:p1:AAABAAIAAwA=', decode(repeat('02', 32), 'hex'));
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate, count(*) FROM privmatch.iris_templates;

-- iris_delete: eye must be 'left', 'right' or NULL (22023); it returns how many it deleted.
SELECT privmatch.iris_delete('x', 'middle');
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT privmatch.iris_delete('nobody');
SELECT privmatch.iris_delete('nobody', 'left');
SELECT privmatch.iris_delete('alice', 'right');
SELECT privmatch.iris_delete('alice');
SELECT count(*) FROM privmatch.iris_templates;
