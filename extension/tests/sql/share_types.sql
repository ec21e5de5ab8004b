-- The share types iris_code_share and iris_mask_share: text form, typmods, send, and the
-- rejection of malformed text (SQLSTATE, a message naming the type, nothing stored).
-- Layout and text form: core/src/wire/storage.rs.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS privmatch;
RESET client_min_messages;

-- try(sql): runs sql and returns 'ok', or 'SQLSTATE: message' (the statement is rolled back).
CREATE FUNCTION pg_temp.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE sql;
  RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- Text round trip: the output is the input, for both types and every party.
-- AAABAAIAAwA= holds the coefficients 0, 1, 2, 3; the 8-coefficient one ends in 0xffff, 0, 1, 2.
SELECT t,
       t::privmatch.iris_code_share::text = t AS code_same,
       t::privmatch.iris_mask_share::text = t AS mask_same
FROM (VALUES ('v1:p0:AAABAAIAAwA='),
             ('v1:p1:AAAAAAAAAAA='),
             ('v1:p2://8AAP//AAD//wAAAQACAA==')) v(t);
SELECT 'v1:p1:AAABAAIAAwA='::privmatch.iris_code_share AS code,
       'v1:p2:AAABAAIAAwA='::privmatch.iris_mask_share AS mask;

-- send: the documented bytes (little-endian): version 1 (0100), kind tag (01 code, 02 mask),
-- party, n = 4 (04000000), then the coefficients 0, 1, 2, 3.
SELECT privmatch.iris_code_share_send('v1:p0:AAABAAIAAwA=') AS code_send,
       privmatch.iris_mask_share_send('v1:p2:AAABAAIAAwA=') AS mask_send;
SELECT privmatch.iris_code_share_send('v1:p1://8AAP//AAD//wAAAQACAA==') AS code_send_8;

-- Typmods: the length (number of coefficients) must be a positive multiple of 4.
SELECT 'v1:p0:AAABAAIAAwA='::privmatch.iris_code_share(4) AS code4,
       'v1:p0:AAABAAIAAwA='::privmatch.iris_mask_share(4) AS mask4;
CREATE TABLE code4 (c privmatch.iris_code_share(4));
CREATE TABLE mask4 (m privmatch.iris_mask_share(4));
SELECT attrelid::regclass, format_type(atttypid, atttypmod)
FROM pg_attribute WHERE attrelid IN ('code4'::regclass, 'mask4'::regclass) AND attnum = 1
ORDER BY 1;
SELECT typ, modifier, pg_temp.try(format('CREATE TABLE bad (x privmatch.%s(%s))', typ, modifier))
FROM (VALUES ('iris_code_share'), ('iris_mask_share')) t(typ),
     (VALUES ('0'), ('6'), ('-4'), ('4, 4'), ('1048580'), ('abc')) m(modifier)
ORDER BY 2, 1;

-- A value of the wrong length for the column: 22000, nothing stored. The party index (p2) is
-- valid; only the length is wrong.
INSERT INTO code4 VALUES ('v1:p2://8AAP//AAD//wAAAQACAA==');
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate, count(*) FROM code4;
INSERT INTO mask4 VALUES ('v1:p2://8AAP//AAD//wAAAQACAA==');
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate, count(*) FROM mask4;
-- Already-typed values go through the length coercion instead of the input function.
INSERT INTO code4 SELECT 'v1:p2://8AAP//AAD//wAAAQACAA=='::privmatch.iris_code_share;
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate, count(*) FROM code4;
SELECT 'v1:p0:AAABAAIAAwA='::privmatch.iris_mask_share::privmatch.iris_mask_share(8);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
-- The right length is accepted, by both paths.
INSERT INTO code4 VALUES ('v1:p2:AAABAAIAAwA=');
INSERT INTO code4 SELECT 'v1:p1:AAABAAIAAwA='::privmatch.iris_code_share;
INSERT INTO mask4 VALUES ('v1:p2:AAABAAIAAwA=');
SELECT * FROM code4, mask4;

-- Malformed text: 22P02, and the message names the type.
CREATE TABLE codes (c privmatch.iris_code_share);
CREATE TABLE masks (m privmatch.iris_mask_share);
SELECT tbl, label, pg_temp.try(format('INSERT INTO %I VALUES (%L)', tbl, input)) AS result
FROM (VALUES ('codes'), ('masks')) t(tbl),
     (VALUES (1, 'control (valid)', 'v1:p0:AAABAAIAAwA='),
             (2, 'version v2',      'v2:p0:AAABAAIAAwA='),
             (3, 'upper-case V1',   'V1:p0:AAABAAIAAwA='),
             (4, 'party p3',        'v1:p3:AAABAAIAAwA='),
             (5, 'party p01',       'v1:p01:AAABAAIAAwA='),
             (6, 'missing colon',   'v1:p0AAABAAIAAwA='),
             (7, 'leading space',   ' v1:p0:AAABAAIAAwA='),
             (8, 'trailing space',  'v1:p0:AAABAAIAAwA= '),
             (9, 'inner space',     'v1:p0:AAAB AAIAAwA='),
             (10, 'bad base64',     'v1:p0:AAAB*AIAAwA='),
             (11, 'unpadded',       'v1:p0:AAABAAIAAwA'),
             (12, 'non-canonical',  'v1:p0:AAABAAIAAwB='),
             (13, 'odd byte count', 'v1:p0:AAAAAAA='),
             (14, '3 coefficients', 'v1:p0:AAABAAIA'),
             (15, '0 coefficients', 'v1:p0:'),
             (16, 'empty',          '')) c(n, label, input)
ORDER BY tbl, n;
-- Only the two control rows were stored (the failed inserts were rolled back).
SELECT (SELECT count(*) FROM codes) AS codes, (SELECT count(*) FROM masks) AS masks;

-- The same, as plain statements: the whole statement fails and stores nothing.
INSERT INTO codes VALUES ('v1:p1:AAABAAIAAwA='), ('v2:p0:AAABAAIAAwA=');
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate, count(*) FROM codes;
INSERT INTO masks VALUES ('v1:p1:AAABAAIAAwA='), ('v1:p0:AAABAAIAAwA');
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate, count(*) FROM masks;
-- Text-format COPY uses the same input function.
COPY codes FROM STDIN;
v1:p1:AAABAAIAAwA=
v1:p1:AAABAAIAAw==
\.
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate, count(*) FROM codes;

-- A mask share is not a code share: there is no cast between the two types.
INSERT INTO codes SELECT m FROM masks;
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate, count(*) FROM codes;
SELECT 'v1:p0:AAABAAIAAwA='::privmatch.iris_mask_share::privmatch.iris_code_share;
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
