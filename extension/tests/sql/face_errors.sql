-- The face modality at one party: the face_share type (text form, typmod, send, dimension)
-- and the argument errors of the face functions (SQLSTATE, a message naming the function or
-- type, nothing stored). This database is party 1 (see identity), an evaluator.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS privmatch;
RESET client_min_messages;

CREATE FUNCTION pg_temp.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE sql;
  RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- Text round trip; AQAAAAIAAAD///// holds the Z_2^32 words 1, 2, 0xffffffff.
SELECT t, t::privmatch.face_share::text = t AS same, privmatch.face_share_dim(t::privmatch.face_share) AS dim
FROM (VALUES ('v1:p0:AQAAAAIAAAD/////'), ('v1:p1:AAAAAA==')) v(t);
-- send: version 1, kind 3 (face), party 1, n = 3, then the words.
SELECT privmatch.face_share_send('v1:p1:AQAAAAIAAAD/////') AS send;
-- A column's typmod is the dimension.
CREATE TEMP TABLE faces (f privmatch.face_share(3));
INSERT INTO faces VALUES ('v1:p0:AQAAAAIAAAD/////');
SELECT pg_temp.try($$INSERT INTO faces VALUES ('v1:p0:AQAAAA==')$$) AS wrong_length;
SELECT pg_temp.try($$CREATE TEMP TABLE bad (f privmatch.face_share(0))$$) AS typmod_zero;
SELECT pg_temp.try($$CREATE TEMP TABLE bad (f privmatch.face_share(4097))$$) AS typmod_big;
-- Malformed text.
SELECT pg_temp.try($$SELECT 'v1:p0:AQAA'::privmatch.face_share$$) AS not_whole_words;
SELECT pg_temp.try($$SELECT 'v1:p0:'::privmatch.face_share$$) AS empty;
SELECT pg_temp.try($$SELECT 'v1:p3:AQAAAA=='::privmatch.face_share$$) AS bad_party;
SELECT pg_temp.try($$SELECT 'AQAAAA=='::privmatch.face_share$$) AS no_prefix;
-- An iris share is not a face share.
SELECT pg_temp.try($$SELECT privmatch.face_share_send(privmatch.iris_code_share_send('v1:p0:AAABAAIAAwA=')::text::privmatch.face_share)$$) AS iris_as_face;
SELECT count(*) AS rows_kept FROM faces;

-- Function arguments.
SELECT pg_temp.try($$SELECT privmatch.face_masked_round('\x00', 2, '\x00')$$) AS short_session;
SELECT pg_temp.try($$SELECT privmatch.face_masked_round('\x000102030405060708090a0b0c0d0e0f', 4, '\x00')$$) AS bad_round;
SELECT pg_temp.try($$SELECT privmatch.face_masked_round('\x000102030405060708090a0b0c0d0e0f', 2, '\x00')$$) AS unknown_session;
SELECT privmatch.face_session_abort('\x000102030405060708090a0b0c0d0e0f') AS aborted;
SELECT pg_temp.try($$SELECT * FROM privmatch.face_masked_open('\x000102030405060708090a0b0c0d0e0f', '\x00')$$) AS garbage_probe;
SELECT pg_temp.try($$SELECT * FROM privmatch.face_enroll_sealed(ARRAY['\x00'::bytea], 'maybe')$$) AS bad_on_duplicate;
SELECT pg_temp.try($$SELECT * FROM privmatch.face_enroll_sealed(ARRAY['\x00'::bytea])$$) AS garbage_envelope;
SELECT pg_temp.try($$SELECT * FROM privmatch.face_enroll_sealed(ARRAY[NULL::bytea])$$) AS null_envelope;
-- Only P2 is the dealer; this party is P1.
SELECT pg_temp.try($$SELECT * FROM privmatch.face_dealer_configure('\x00')$$) AS not_the_dealer_config;
-- Nothing was stored.
SELECT (SELECT count(*) FROM privmatch.face_templates) AS templates,
       (SELECT count(*) FROM privmatch.face_sessions) AS sessions,
       privmatch.face_delete('nobody') AS deleted;
